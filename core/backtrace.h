// Caller stacks for trace lines and crash reports, through libunwind's local unwinder
// (symbolised with the nearest dynamic symbol; frames of stripped code show their library).
// libunwind.so.8 is loaded privately on first use (see backtrace.cc for why it is not linked).
#pragma once

#include <string>

namespace vf {

// Loads libunwind if needed; false when it is not installed. Call before relying on
// write_stack_to_fd from a signal handler (which must not be the one to load it).
bool backtraces_available();

// " <- frame <- frame ..." for a trace line; skips the shim's own frames.
std::string caller_stack(int max_frames = 12);

// Writes one frame per line to fd. Uses no heap, so it can run inside a SIGSEGV handler.
void write_stack_to_fd(int fd, int max_frames = 64);

}  // namespace vf

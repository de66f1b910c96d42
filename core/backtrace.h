// Caller stacks for trace lines and crash reports, through libunwind's local unwinder
// (symbolised with the nearest dynamic symbol; frames of stripped code show their library).
#pragma once

#include <string>

namespace vf {

// " <- frame <- frame ..." for a trace line; skips the shim's own frames.
std::string caller_stack(int max_frames = 12);

// Writes one frame per line to fd. Uses no heap, so it can run inside a SIGSEGV handler.
void write_stack_to_fd(int fd, int max_frames = 64);

}  // namespace vf

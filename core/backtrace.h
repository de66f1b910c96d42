// Caller stacks for trace lines and crash reports, through libunwind's local unwinder
// (symbolised with the nearest dynamic symbol; frames of stripped code show their library).
// libunwind.so.8 is loaded privately on first use (see backtrace.cc for why it is not linked).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace vf {

// The frames caller_stack describes, one step at a time: libunwind's walk of the calling thread,
// or a unit test's stand-in (an unwinder with bad data may keep returning a frame).
class FrameWalker {
 public:
  virtual ~FrameWalker() = default;
  // The next frame's instruction pointer; false when there is none.
  virtual bool next(std::uintptr_t* ip) = 0;
  // The current frame's symbol and the offset into it; false when unknown.
  virtual bool symbol(char* name, std::size_t size, std::uintptr_t* offset) = 0;
};

// " <- frame <- frame ...": at most max_frames frames outside the shim, and a bounded number of
// steps in all, so that a walker that never ends cannot hold up the traced call.
std::string describe_caller_frames(FrameWalker& walker, int max_frames);

// Loads libunwind if needed; false when it is not installed. Call before relying on
// write_stack_to_fd from a signal handler (which must not be the one to load it).
bool backtraces_available();

// " <- frame <- frame ..." for a trace line; skips the shim's own frames.
std::string caller_stack(int max_frames = 12);

// Writes one frame per line to fd. Uses no heap, so it can run inside a SIGSEGV handler.
void write_stack_to_fd(int fd, int max_frames = 64);

}  // namespace vf

// describe_caller_frames: what a trace line's " caller:" part says, and that it ends even when the
// unwinder does not (a FrameWalker stands in for libunwind here).
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/backtrace.h"

namespace {

// A frame of this test binary, which links the core library: to describe_caller_frames it is one
// of the shim's own frames, skipped.
[[gnu::noinline]] void own_code() { asm volatile(""); }

class ScriptedWalker final : public vf::FrameWalker {
 public:
  explicit ScriptedWalker(std::vector<std::uintptr_t> ips, bool repeat_last = false)
      : ips_(std::move(ips)), repeat_last_(repeat_last) {}
  bool next(std::uintptr_t* ip) override {
    ++steps;
    // Stops the walk for a test whose bound is broken, so that it fails instead of hanging.
    if (steps > 100000) return false;
    if (index_ < ips_.size()) {
      *ip = ips_[index_++];
      return true;
    }
    if (!repeat_last_ || ips_.empty()) return false;
    *ip = ips_.back();
    return true;
  }
  bool symbol(char* name, std::size_t size, std::uintptr_t* offset) override {
    std::snprintf(name, size, "frame%zu", index_);
    *offset = 0x10;
    return true;
  }
  int steps = 0;

 private:
  std::vector<std::uintptr_t> ips_;
  bool repeat_last_;
  std::size_t index_ = 0;
};

std::uintptr_t own_ip() { return reinterpret_cast<std::uintptr_t>(&own_code); }
std::uintptr_t libc_ip() { return reinterpret_cast<std::uintptr_t>(&std::strlen); }

int count_frames(const std::string& text) {
  int count = 0;
  for (std::size_t at = text.find(" <- "); at != std::string::npos; at = text.find(" <- ", at + 1)) {
    ++count;
  }
  return count;
}

}  // namespace

TEST_CASE("caller frames skip the shim's own and name the others with their library") {
  ScriptedWalker walker({own_ip(), own_ip(), libc_ip(), libc_ip()});
  const std::string text = vf::describe_caller_frames(walker, 12);
  CHECK(count_frames(text) == 2);
  CHECK(text.find("frame3+0x10 (libc.so.6)") != std::string::npos);
  CHECK(text.find("frame4+0x10 (libc.so.6)") != std::string::npos);
}

TEST_CASE("caller frames stop at the frame limit") {
  ScriptedWalker walker({libc_ip(), libc_ip(), libc_ip(), libc_ip(), libc_ip()});
  CHECK(count_frames(vf::describe_caller_frames(walker, 3)) == 3);
  CHECK(walker.steps == 3);
}

TEST_CASE("an unwinder that keeps returning one of the shim's frames does not hold up the call") {
  // Seen as a possible cause of a traced call that never returned: every step counts.
  ScriptedWalker walker({own_ip()}, /*repeat_last=*/true);
  const std::string text = vf::describe_caller_frames(walker, 12);
  CHECK(text.empty());
  CHECK(walker.steps <= 12 + 32);
}

TEST_CASE("an unwinder that keeps returning a foreign frame stops at the frame limit") {
  ScriptedWalker walker({libc_ip()}, /*repeat_last=*/true);
  CHECK(count_frames(vf::describe_caller_frames(walker, 12)) == 12);
  CHECK(walker.steps == 12);
}

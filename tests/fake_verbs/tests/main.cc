// Test runner for the FAKE libibverbs. Before running anything it proves the process is talking
// to the fake (control API present, devices named fake*, ibv_open_device resolved into
// .../fake_verbs/lib/libibverbs.so.1), so these tests can never silently pass against the real
// libibverbs or a real NIC.
#define CATCH_CONFIG_RUNNER
#include <dlfcn.h>
#include <infiniband/verbs.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <string>

namespace {

bool only_listing(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--list", 6) == 0) return true;
  return false;
}

bool talking_to_the_fake() {
  if (dlvsym(RTLD_DEFAULT, "fake_verbs_is_fake", "FAKE_VERBS_1.0") == nullptr) {
    std::fprintf(stderr, "fake_verbs_is_fake@FAKE_VERBS_1.0 not found\n");
    return false;
  }
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&ibv_open_device), &info) == 0 || info.dli_fname == nullptr ||
      std::strstr(info.dli_fname, "fake_verbs/lib/libibverbs.so.1") == nullptr) {
    std::fprintf(stderr, "ibv_open_device comes from %s, not the fake\n",
                 info.dli_fname ? info.dli_fname : "?");
    return false;
  }
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  bool ok = list != nullptr && n > 0 && std::strncmp(ibv_get_device_name(list[0]), "fake", 4) == 0;
  if (list != nullptr) ibv_free_device_list(list);
  if (!ok) std::fprintf(stderr, "device list is not the fake's fake0..fakeN\n");
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (!only_listing(argc, argv) && !talking_to_the_fake()) {
    std::fprintf(stderr,
                 "REFUSING TO RUN: these tests must run against the FAKE libibverbs "
                 "(LD_LIBRARY_PATH=<build>/fake_verbs/lib)\n");
    return 2;
  }
  return Catch::Session().run(argc, argv);
}

/* dlopen()s a library that only its own RUNPATH can find. glibc finds the caller's RUNPATH from
   dlopen's return address, so a dlopen hook that is not a sibling call breaks this. */
#include <dlfcn.h>
#include <stdio.h>

int main(void) {
  void* handle = dlopen("libvf_runpath_lib.so", RTLD_NOW);
  if (handle == NULL) {
    printf("FAIL: %s\n", dlerror());
    return 1;
  }
  int (*answer)(void) = (int (*)(void))dlsym(handle, "runpath_lib_answer");
  printf("%s: answer=%d\n", answer && answer() == 42 ? "PASS" : "FAIL", answer ? answer() : -1);
  return answer && answer() == 42 ? 0 : 1;
}

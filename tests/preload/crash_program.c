/* Calls the shim's debug crash entry point so the test can check the stack it prints. */
#include <dlfcn.h>
#include <stdio.h>

int main(void) {
  void (*crash)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "verbs_failover_debug_crash");
  if (crash == NULL) {
    printf("shim not loaded\n");
    return 2;
  }
  crash();
  return 0;
}

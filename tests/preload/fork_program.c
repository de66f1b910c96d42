/* fork() after the shim is initialised: the shim's atfork handlers take and release its locks,
   the child must be able to use verbs, and its log lines must carry its own pid and tid.
   (No second thread calls verbs across the fork: libibverbs' own device-list lock is not
   fork-safe, with or without the shim.) */
#include <infiniband/verbs.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

static void list_devices(void) {
  int num = 0;
  struct ibv_device** list = ibv_get_device_list(&num);
  if (list) ibv_free_device_list(list);
}

int main(void) {
  list_devices(); /* the shim is initialised before the first fork */
  int failures = 0;
  for (int i = 0; i < 5; ++i) {
    const pid_t child = fork();
    if (child == 0) {
      list_devices();
      printf("CHILD %d\n", (int)getpid());
      fflush(stdout);
      _exit(0);
    }
    int status = 0;
    /* A child stuck on an inherited lock never exits: the test's timeout reports it. */
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++failures;
    }
    list_devices(); /* and the parent goes on using verbs */
  }
  printf("%s: %d failed children\n", failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}

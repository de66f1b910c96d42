/* Loads libibverbs exactly the way NCCL does (src/misc/ibvsymbols.cc): dlopen of
   $NCCL_IBVERBS_LIB, else "libibverbs.so", else "libibverbs.so.1", with RTLD_NOW; then dlvsym of
   each verb with its version node. For every verb it prints which object served it (dladdr) and
   exits non-zero unless all of them came from the object named by --expect.
   Usage: nccl_loader --expect SUBSTRING [--name libibverbs.so.1] */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "verb_names.h"

typedef void** (*get_device_list_fn)(int*);

int main(int argc, char** argv) {
  const char* expect = NULL;
  const char* name = NULL;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--expect") == 0) expect = argv[i + 1];
    if (strcmp(argv[i], "--name") == 0) name = argv[i + 1];
  }
  if (expect == NULL) {
    fprintf(stderr, "usage: %s --expect SUBSTRING [--name LIB]\n", argv[0]);
    return 2;
  }
  void* handle = NULL;
  const char* env_lib = getenv("NCCL_IBVERBS_LIB");
  if (env_lib != NULL && env_lib[0] != '\0') {
    handle = dlopen(env_lib, RTLD_NOW);
  } else if (name != NULL) {
    handle = dlopen(name, RTLD_NOW);
  } else {
    handle = dlopen("libibverbs.so", RTLD_NOW);
    if (handle == NULL) handle = dlopen("libibverbs.so.1", RTLD_NOW);
  }
  if (handle == NULL) {
    fprintf(stderr, "dlopen failed: %s\n", dlerror());
    return 3;
  }
  int failures = 0;
  for (size_t i = 0; i < sizeof(kNcclVerbs) / sizeof(kNcclVerbs[0]); ++i) {
    void* fn = dlvsym(handle, kNcclVerbs[i].name, kNcclVerbs[i].version);
    Dl_info info = {0};
    const char* object = "(none)";
    if (fn != NULL && dladdr(fn, &info) != 0 && info.dli_fname != NULL) object = info.dli_fname;
    /* NCCL tolerates a missing optional verb (older libibverbs); so does the check. */
    const int absent_optional = fn == NULL && kNcclVerbs[i].optional;
    const int ok = absent_optional || (fn != NULL && strstr(object, expect) != NULL);
    printf("RESOLVED %s@%s %s %s\n", kNcclVerbs[i].name, kNcclVerbs[i].version, object,
           absent_optional ? "absent-optional" : ok ? "ok" : "MISMATCH");
    if (!ok) ++failures;
  }
  /* A call through the resolved pointer, so the trace log can show the shim served it. */
  get_device_list_fn get_list = (get_device_list_fn)dlvsym(handle, "ibv_get_device_list", "IBVERBS_1.1");
  int num = -1;
  void** list = get_list != NULL ? get_list(&num) : NULL;
  printf("DEVICES %d\n", list != NULL ? num : 0);
  if (list != NULL) {
    typedef void (*free_list_fn)(void**);
    free_list_fn free_list = (free_list_fn)dlvsym(handle, "ibv_free_device_list", "IBVERBS_1.1");
    free_list(list);
  }
  dlclose(handle);
  printf("%s: %d mismatches\n", failures == 0 ? "PASS" : "FAIL", failures);
  return failures == 0 ? 0 : 1;
}

/* A program linked against libibverbs the ordinary way (PLT/GOT references). It prints which
   object serves each verb it references and exits non-zero unless every one came from the
   object named by --expect. Then it calls ibv_get_device_list and reports errno exactly. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <string.h>

#undef ibv_reg_mr
#undef ibv_query_port

struct linked_verb {
  const char* name;
  void* address;
};

int main(int argc, char** argv) {
  if (argc != 3 || strcmp(argv[1], "--expect") != 0) {
    fprintf(stderr, "usage: %s --expect SUBSTRING\n", argv[0]);
    return 2;
  }
  const char* expect = argv[2];
  const struct linked_verb verbs[] = {
      {"ibv_get_device_list", (void*)&ibv_get_device_list},
      {"ibv_free_device_list", (void*)&ibv_free_device_list},
      {"ibv_open_device", (void*)&ibv_open_device},
      {"ibv_close_device", (void*)&ibv_close_device},
      {"ibv_query_port", (void*)&ibv_query_port},
      {"ibv_alloc_pd", (void*)&ibv_alloc_pd},
      {"ibv_reg_mr", (void*)&ibv_reg_mr},
      {"ibv_reg_mr_iova2", (void*)&ibv_reg_mr_iova2},
      {"ibv_create_cq", (void*)&ibv_create_cq},
      {"ibv_create_qp", (void*)&ibv_create_qp},
      {"ibv_modify_qp", (void*)&ibv_modify_qp},
      {"ibv_create_comp_channel", (void*)&ibv_create_comp_channel},
      {"ibv_get_cq_event", (void*)&ibv_get_cq_event},
      {"ibv_get_async_event", (void*)&ibv_get_async_event},
      {"ibv_query_ece", (void*)&ibv_query_ece},
      {"ibv_reg_dmabuf_mr", (void*)&ibv_reg_dmabuf_mr},
  };
  int failures = 0;
  for (size_t i = 0; i < sizeof(verbs) / sizeof(verbs[0]); ++i) {
    Dl_info info = {0};
    const char* object = "(none)";
    if (dladdr(verbs[i].address, &info) != 0 && info.dli_fname != NULL) object = info.dli_fname;
    const int ok = strstr(object, expect) != NULL;
    printf("RESOLVED %s %s %s\n", verbs[i].name, object, ok ? "ok" : "MISMATCH");
    if (!ok) ++failures;
  }
  int num = -1;
  errno = 0;
  struct ibv_device** list = ibv_get_device_list(&num);
  printf("GET_DEVICE_LIST %s num=%d errno=%d\n", list ? "list" : "NULL", list ? num : -1,
         list ? 0 : errno);
  if (list) ibv_free_device_list(list);
  printf("%s: %d mismatches\n", failures == 0 ? "PASS" : "FAIL", failures);
  return failures == 0 ? 0 : 1;
}

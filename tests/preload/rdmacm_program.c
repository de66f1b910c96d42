/* A librdmacm program (rping's first steps): librdmacm, not the program, calls libibverbs.
   Under the shim those calls must reach the shim; the test reads the trace log for them.
   On a machine with devices (the lab) it also resolves a route and creates a QP through
   rdma_create_qp when given an address. Exit status 0 = librdmacm behaved as it does without
   the shim (the test compares). */
#include <errno.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  errno = 0;
  struct rdma_event_channel* channel = rdma_create_event_channel();
  if (channel == NULL) {
    printf("CREATE_EVENT_CHANNEL NULL errno=%d\n", errno);
    return 0;
  }
  struct rdma_cm_id* id = NULL;
  int rc = rdma_create_id(channel, &id, NULL, RDMA_PS_TCP);
  printf("CREATE_ID rc=%d errno=%d\n", rc, rc ? errno : 0);
  int num = 0;
  struct ibv_context** contexts = rdma_get_devices(&num);
  printf("GET_DEVICES %s num=%d\n", contexts ? "list" : "NULL", num);
  if (contexts) rdma_free_devices(contexts);
  if (rc == 0) rdma_destroy_id(id);
  rdma_destroy_event_channel(channel);
  return 0;
}

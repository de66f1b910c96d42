/* A completion channel used by a provider's direct-verbs CQ creation (mlx5dv_create_cq,
   efadv_create_cq: UCX's mlx5 transports create their CQs so) under the shim. The shim replaces
   channel->fd by an epoll set (core/failover/channel_wakeup.h); the provider hands
   attr->channel->fd to the kernel, so these calls must reach it with the real event file: the CQ
   is made, points to the application's channel, counts in its refcnt, and the channel is
   destroyed cleanly after it. Prints CHANNEL_FD_REPLACED=0|1 (the check is meaningless unless 1
   under the shim) and DV_CQ PASS. */
#define _GNU_SOURCE
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct ibv_cq_ex* mlx5dv_create_cq(struct ibv_context* context, struct ibv_cq_init_attr_ex* attr,
                                   void* mlx5_cq_attr);
struct ibv_cq_ex* efadv_create_cq(struct ibv_context* context, struct ibv_cq_init_attr_ex* attr,
                                  void* efa_attr, uint32_t inlen);

static void die(const char* what) {
  printf("FAIL %s: %s\n", what, strerror(errno));
  exit(1);
}

static int is_epoll_fd(int fd) {
  char path[64], target[128] = "";
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(path, target, sizeof target - 1);
  return n > 0 && strstr(target, "eventpoll") != NULL;
}

static void check_cq(const char* how, struct ibv_cq_ex* cqx, struct ibv_comp_channel* channel,
                     struct ibv_cq_init_attr_ex* attr) {
  if (!cqx) die(how);
  struct ibv_cq* cq = ibv_cq_ex_to_cq(cqx);
  if (attr->channel != channel) die("the application's attr was changed");
  if (cq->channel != channel) {
    printf("FAIL %s: cq->channel %p, not the application's %p\n", how, (void*)cq->channel,
           (void*)channel);
    exit(1);
  }
  if (channel->refcnt != 1) {
    printf("FAIL %s: channel refcnt %d with one CQ\n", how, channel->refcnt);
    exit(1);
  }
  if (ibv_req_notify_cq(cq, 0)) die("ibv_req_notify_cq");
  if (ibv_destroy_comp_channel(channel) != EBUSY) die("destroying the channel of a live CQ");
  if (ibv_destroy_cq(cq)) die("ibv_destroy_cq");
  if (channel->refcnt != 0) die("channel refcnt after the destroy");
  printf("%s ok\n", how);
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  int n = 0;
  struct ibv_device** list = ibv_get_device_list(&n);
  if (!list || n == 0) die("no device");
  struct ibv_context* ctx = ibv_open_device(list[0]);
  if (!ctx) die("ibv_open_device");
  struct ibv_comp_channel* channel = ibv_create_comp_channel(ctx);
  if (!channel) die("ibv_create_comp_channel");
  printf("CHANNEL_FD_REPLACED=%d\n", is_epoll_fd(channel->fd));
  struct ibv_cq_init_attr_ex attr = {.cqe = 16,
                                     .cq_context = &attr,
                                     .channel = channel,
                                     .comp_vector = 0,
                                     .wc_flags = IBV_WC_EX_WITH_BYTE_LEN};
  check_cq("mlx5dv_create_cq", mlx5dv_create_cq(ctx, &attr, NULL), channel, &attr);
  check_cq("efadv_create_cq", efadv_create_cq(ctx, &attr, NULL, 0), channel, &attr);
  if (ibv_destroy_comp_channel(channel)) die("ibv_destroy_comp_channel");
  if (ibv_close_device(ctx)) die("ibv_close_device");
  ibv_free_device_list(list);
  printf("DV_CQ PASS\n");
  return 0;
}

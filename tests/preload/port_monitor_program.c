/* The shim's port monitor on the fake fabric: a port taken down and up again must be seen by
   the monitor (its own context, its own thread), while the application's own async event stream
   still receives the same events. Needs the shim preloaded and the fake libibverbs. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

typedef long (*port_changes_fn)(const char*, int);
typedef int (*port_fn)(int);

static long long now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Waits, bounded, until the monitor has counted `want` changes; returns microseconds or -1. */
static long long wait_changes(port_changes_fn changes, long want) {
  const long long start = now_us();
  while (changes("fake0", 1) < want) {
    if (now_us() - start > 5000000) return -1;
    struct timespec tick = {0, 200000}; /* poll interval of a bounded wait, not a synchronisation */
    nanosleep(&tick, NULL);
  }
  return now_us() - start;
}

static int app_event(struct ibv_context* ctx, enum ibv_event_type want) {
  struct pollfd pfd = {.fd = ctx->async_fd, .events = POLLIN};
  if (poll(&pfd, 1, 5000) != 1) return 0;
  /* Non-blocking: an event the shim hides (a protected port's) then reads as EAGAIN. */
  fcntl(ctx->async_fd, F_SETFL, fcntl(ctx->async_fd, F_GETFL) | O_NONBLOCK);
  struct ibv_async_event event;
  if (ibv_get_async_event(ctx, &event)) return 0;
  const int ok = event.event_type == want;
  ibv_ack_async_event(&event);
  return ok;
}

int main(void) {
  port_changes_fn changes = (port_changes_fn)dlsym(RTLD_DEFAULT, "verbs_failover_debug_port_changes");
  port_fn down = (port_fn)dlvsym(RTLD_DEFAULT, "fake_verbs_port_down", "FAKE_VERBS_1.0");
  port_fn up = (port_fn)dlvsym(RTLD_DEFAULT, "fake_verbs_port_up", "FAKE_VERBS_1.0");
  if (!changes || !down || !up) {
    printf("FAIL: needs the shim preloaded and the fake libibverbs\n");
    return 2;
  }
  struct ibv_device** list = ibv_get_device_list(NULL);
  if (!list || !list[0] || strcmp(ibv_get_device_name(list[0]), "fake0") != 0) {
    printf("FAIL: fake0 not found\n");
    return 2;
  }
  struct ibv_context* ctx = ibv_open_device(list[0]);
  if (!ctx) return 2;
  printf("WATCHED changes=%ld\n", changes("fake0", 1));
  down(0);
  const long long down_us = wait_changes(changes, 1);
  const int app_saw_down = app_event(ctx, IBV_EVENT_PORT_ERR);
  up(0);
  const long long up_us = wait_changes(changes, 2);
  const int app_saw_up = app_event(ctx, IBV_EVENT_PORT_ACTIVE);
  printf("MONITOR down_seen=%d up_seen=%d app_down=%d app_up=%d\n", down_us >= 0, up_us >= 0,
         app_saw_down, app_saw_up);
  printf("LATENCY_US down=%lld up=%lld\n", down_us, up_us);
  ibv_close_device(ctx);
  ibv_free_device_list(list);
  /* EXPECT_APP_EVENTS=0: the port is protected (it has a backup), so the shim hides its
     PORT_ERR/PORT_ACTIVE from the application. */
  const char* expect = getenv("EXPECT_APP_EVENTS");
  const int want_app = !(expect && strcmp(expect, "0") == 0);
  const int ok = down_us >= 0 && up_us >= 0 && app_saw_down == want_app && app_saw_up == want_app;
  printf("%s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

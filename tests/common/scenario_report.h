/* What a small fake-fabric scenario program (in tests/failover/, other than exactly_once) needs to
   report and wait the way run_exactly_once.sh reads it: "FAIL: [scenario] ..." lines counted in
   g_failures, "SETUP: ..." and exit 3 for a run that could not start, a monotonic clock for
   bounded waits, the fake's control symbols found at run time (the program is linked to
   libibverbs, not to the fake), and the set-up every such program starts with (a device opened
   by name, a zeroed buffer registered). Include once, after setting nothing: the program sets
   g_scenario in main before its first check. */
#pragma once

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/fake_verbs/fake_verbs_control.h"

static const char* g_scenario = "?";
static int g_failures = 0;

static inline void fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("FAIL: [%s] ", g_scenario);
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  ++g_failures;
}

static inline void setup_fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("SETUP: ");
  vprintf(fmt, ap);
  printf(" (errno %d)\n", errno);
  va_end(ap);
  exit(3);
}

static inline uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* A control function of the fake libibverbs (fake_verbs_control.h), or SETUP if absent. */
static inline void* fake_sym(const char* name) {
  void* p = dlvsym(RTLD_DEFAULT, name, FAKE_VERBS_CONTROL_VERSION);
  if (p == NULL) setup_fail("%s not found: not running on the fake libibverbs", name);
  return p;
}

/* The device called `name` opened, or SETUP. */
static inline struct ibv_context* open_device_named(const char* name) {
  int n = 0;
  struct ibv_device** list = ibv_get_device_list(&n);
  struct ibv_context* ctx = NULL;
  for (int i = 0; list && i < n && !ctx; ++i)
    if (strcmp(ibv_get_device_name(list[i]), name) == 0) ctx = ibv_open_device(list[i]);
  if (list) ibv_free_device_list(list);
  if (!ctx) setup_fail("opening %s", name);
  return ctx;
}

/* A page-aligned, zeroed buffer of `size` bytes in *buf, registered on pd; or SETUP. */
static inline struct ibv_mr* register_zeroed_buffer(struct ibv_pd* pd, size_t size,
                                                    unsigned access, uint8_t** buf) {
  if (!pd || posix_memalign((void**)buf, 4096, size) != 0) setup_fail("PD or memory");
  memset(*buf, 0, size);
  struct ibv_mr* mr = ibv_reg_mr(pd, *buf, size, access);
  if (!mr) setup_fail("ibv_reg_mr of %zu bytes", size);
  return mr;
}

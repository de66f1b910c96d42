/* What a small fake-fabric scenario program (in tests/failover/, other than exactly_once) needs to
   report and wait the way run_exactly_once.sh reads it: "FAIL: [scenario] ..." lines counted in
   g_failures, "SETUP: ..." and exit 3 for a run that could not start, a monotonic clock for
   bounded waits, and the fake's control symbols found at run time (the program is linked to
   libibverbs, not to the fake). Include once, after setting nothing: the program sets
   g_scenario in main before its first check. */
#pragma once

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
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

// FAKE libibverbs (verbs-failover test double) — enum-to-string and rate conversion helpers.
// Same strings/values as rdma-core so log output and tests read identically against either.
#include "internal.h"

FAKE_EXPORT const char* ibv_node_type_str(ibv_node_type t) {
  // Indexed by the enum value: IBV_NODE_CA is 1, slot 0 is unused.
  static const char* const names[] = {"unknown",           "InfiniBand channel adapter",
                                      "InfiniBand switch", "InfiniBand router",
                                      "iWARP NIC",         "usNIC",
                                      "usNIC UDP",         "unspecified"};
  int i = int(t);
  if (i < 1 || i >= int(sizeof names / sizeof names[0])) return "unknown";
  return names[i];
}

FAKE_EXPORT const char* ibv_port_state_str(ibv_port_state s) {
  static const char* const names[] = {"no state change (NOP)", "down", "init", "armed", "active",
                                      "active defer"};
  if (unsigned(s) >= sizeof names / sizeof names[0]) return "unknown";
  return names[s];
}

FAKE_EXPORT const char* ibv_event_type_str(ibv_event_type e) {
  static const char* const names[] = {"CQ error",
                                      "local work queue catastrophic error",
                                      "invalid request local work queue error",
                                      "local access violation work queue error",
                                      "communication established",
                                      "send queue drained",
                                      "path migrated",
                                      "path migration request error",
                                      "local catastrophic error",
                                      "port active",
                                      "port error",
                                      "LID change",
                                      "P_Key change",
                                      "SM change",
                                      "SRQ catastrophic error",
                                      "SRQ limit reached",
                                      "last WQE reached",
                                      "client reregistration",
                                      "GID table change",
                                      "WQ fatal"};
  if (unsigned(e) >= sizeof names / sizeof names[0]) return "unknown";
  return names[e];
}

FAKE_EXPORT const char* ibv_wc_status_str(ibv_wc_status s) {
  static const char* const names[] = {"success",
                                      "local length error",
                                      "local QP operation error",
                                      "local EE context operation error",
                                      "local protection error",
                                      "Work Request Flushed Error",
                                      "memory management operation error",
                                      "bad response error",
                                      "local access error",
                                      "remote invalid request error",
                                      "remote access error",
                                      "remote operation error",
                                      "transport retry counter exceeded",
                                      "RNR retry counter exceeded",
                                      "local RDD violation error",
                                      "remote invalid RD request",
                                      "aborted error",
                                      "invalid EE context number",
                                      "invalid EE context state",
                                      "fatal error",
                                      "response timeout error",
                                      "general error",
                                      "TM error",
                                      "TM software rendezvous"};
  if (unsigned(s) >= sizeof names / sizeof names[0]) return "unknown";
  return names[s];
}

namespace {
struct RateRow {
  ibv_rate rate;
  int mult;  // multiple of 2.5 Gb/s, -1 where rdma-core has none (non-integral rates)
  int mbps;
};
// rdma-core's tables (checked value by value against the real library).
constexpr RateRow kRates[] = {
    {IBV_RATE_2_5_GBPS, 1, 2500},       {IBV_RATE_5_GBPS, 2, 5000},
    {IBV_RATE_10_GBPS, 4, 10000},       {IBV_RATE_20_GBPS, 8, 20000},
    {IBV_RATE_30_GBPS, 12, 30000},      {IBV_RATE_40_GBPS, 16, 40000},
    {IBV_RATE_60_GBPS, 24, 60000},      {IBV_RATE_80_GBPS, 32, 80000},
    {IBV_RATE_120_GBPS, 48, 120000},    {IBV_RATE_14_GBPS, -1, 14062},
    {IBV_RATE_56_GBPS, -1, 56250},      {IBV_RATE_112_GBPS, -1, 112500},
    {IBV_RATE_168_GBPS, -1, 168750},    {IBV_RATE_25_GBPS, -1, 25781},
    {IBV_RATE_100_GBPS, -1, 103125},    {IBV_RATE_200_GBPS, -1, 206250},
    {IBV_RATE_300_GBPS, -1, 309375},    {IBV_RATE_28_GBPS, 11, 28125},
    {IBV_RATE_50_GBPS, 20, 53125},      {IBV_RATE_400_GBPS, 160, 425000},
    {IBV_RATE_600_GBPS, 240, 637500},   {IBV_RATE_800_GBPS, 320, 850000},
    {IBV_RATE_1200_GBPS, 480, 1275000},
};
}  // namespace

FAKE_EXPORT int ibv_rate_to_mult(ibv_rate rate) {
  for (const auto& r : kRates)
    if (r.rate == rate) return r.mult;
  return -1;
}

FAKE_EXPORT ibv_rate mult_to_ibv_rate(int mult) {
  for (const auto& r : kRates)
    if (mult > 0 && r.mult == mult) return r.rate;
  return IBV_RATE_MAX;
}

FAKE_EXPORT int ibv_rate_to_mbps(ibv_rate rate) {
  for (const auto& r : kRates)
    if (r.rate == rate) return r.mbps;
  return -1;
}

FAKE_EXPORT ibv_rate mbps_to_ibv_rate(int mbps) {
  for (const auto& r : kRates)
    if (r.mbps == mbps) return r.rate;
  return IBV_RATE_MAX;
}

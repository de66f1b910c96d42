// Devices, ports, GIDs, the verbs_context layout, exported symbol versions and string helpers.
#include <algorithm>
#include <dlfcn.h>

#include <cerrno>
#include <set>

#include "fake_test_util.h"

using namespace fvtest;

TEST_CASE("device list is fake0..fake3 with stable indexes and distinct GUIDs") {
  Clean clean;
  int n = -1;
  ibv_device** list = ibv_get_device_list(&n);
  REQUIRE(list != nullptr);
  REQUIRE(n == 4);
  REQUIRE(ctl().device_count() == 4);
  REQUIRE(list[4] == nullptr);
  std::set<uint64_t> guids;
  for (int i = 0; i < n; ++i) {
    CHECK(std::string(ibv_get_device_name(list[i])) == "fake" + std::to_string(i));
    CHECK(ibv_get_device_index(list[i]) == i);
    CHECK(list[i]->transport_type == IBV_TRANSPORT_IB);
    guids.insert(ibv_get_device_guid(list[i]));
  }
  CHECK(guids.size() == 4);
  ibv_free_device_list(list);
}

TEST_CASE("context is an extended verbs_context with provider ops filled") {
  Clean clean;
  ibv_context* ctx = open_device("fake1");
  verbs_context* v = verbs_get_ctx(ctx);
  REQUIRE(v != nullptr);
  CHECK(v->sz == sizeof(verbs_context));
  CHECK(ctx->ops.post_send != nullptr);
  CHECK(ctx->ops.post_recv != nullptr);
  CHECK(ctx->ops.poll_cq != nullptr);
  CHECK(ctx->ops.req_notify_cq != nullptr);
  CHECK(ctx->ops.post_srq_recv != nullptr);
  CHECK(v->query_port != nullptr);
  CHECK(v->create_qp_ex != nullptr);
  CHECK(v->query_device_ex != nullptr);
  CHECK(ctx->async_fd >= 0);
  CHECK(ctx->num_comp_vectors == 1);
  CHECK(std::string(ctx->device->name) == "fake1");
  REQUIRE(ibv_close_device(ctx) == 0);
}

TEST_CASE("device and port attributes look like an active RoCE port") {
  Clean clean;
  ibv_context* ctx = open_device("fake0");
  ibv_device_attr da{};
  REQUIRE(ibv_query_device(ctx, &da) == 0);
  CHECK(da.phys_port_cnt == 1);
  CHECK(da.max_qp_wr == 4096);
  CHECK(da.max_sge == 16);
  CHECK(da.max_mr_size == (1ull << 40));
  CHECK(da.node_guid == ibv_get_device_guid(ctx->device));

  ibv_device_attr_ex dax{};
  REQUIRE(ibv_query_device_ex(ctx, nullptr, &dax) == 0);
  CHECK(dax.orig_attr.max_qp_wr == 4096);

  ibv_port_attr pa{};
  REQUIRE(ibv_query_port(ctx, 1, &pa) == 0);  // the inline wrapper -> verbs_context::query_port
  CHECK(pa.state == IBV_PORT_ACTIVE);
  CHECK(pa.link_layer == IBV_LINK_LAYER_ETHERNET);
  CHECK(pa.gid_tbl_len == 4);
  CHECK(pa.active_mtu == IBV_MTU_1024);
  CHECK(pa.max_msg_sz == (1u << 30));
  CHECK(ibv_query_port(ctx, 2, &pa) == EINVAL);

  ibv_port_attr compat{};
  // The exported compat symbol (parenthesised to bypass the macro).
  REQUIRE((ibv_query_port)(ctx, 1, reinterpret_cast<_compat_ibv_port_attr*>(&compat)) == 0);
  CHECK(compat.state == IBV_PORT_ACTIVE);
  CHECK(compat.link_layer == IBV_LINK_LAYER_ETHERNET);

  __be16 pkey = 0;
  REQUIRE(ibv_query_pkey(ctx, 1, 0, &pkey) == 0);
  CHECK(ntohs(pkey) == 0xffff);
  CHECK(ibv_get_pkey_index(ctx, 1, pkey) == 0);
  REQUIRE(ibv_close_device(ctx) == 0);
}

TEST_CASE("GIDs: link-local at 0, ::ffff:198.18.<rail+1>.<host+1> at 1, RoCEv2") {
  Clean clean;
  const char* names[] = {"fake0", "fake1", "fake2", "fake3"};
  const uint8_t rail[] = {1, 2, 1, 2};
  const uint8_t host[] = {1, 1, 2, 2};
  for (int i = 0; i < 4; ++i) {
    ibv_context* ctx = open_device(names[i]);
    ibv_gid g0 = gid_of(ctx, 0);
    CHECK(g0.raw[0] == 0xfe);
    CHECK(g0.raw[1] == 0x80);
    ibv_gid g1 = gid_of(ctx, 1);
    const uint8_t want[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 18, rail[i], host[i]};
    CHECK(std::memcmp(g1.raw, want, 16) == 0);
    ibv_gid_entry e{};
    REQUIRE(ibv_query_gid_ex(ctx, 1, 1, &e, 0) == 0);
    CHECK(e.gid_type == IBV_GID_TYPE_ROCE_V2);
    CHECK(e.gid_index == 1);
    CHECK(std::memcmp(e.gid.raw, want, 16) == 0);
    // Slots 2 and 3 are empty: ENODATA from the _ex query, zeros from ibv_query_gid (rdma-core's
    // "preserve API behavior for empty GID"); beyond the table, an error.
    CHECK(ibv_query_gid_ex(ctx, 1, 2, &e, 0) == ENODATA);
    ibv_gid empty;
    std::memset(&empty, 0xab, sizeof empty);
    CHECK(ibv_query_gid(ctx, 1, 2, &empty) == 0);
    CHECK(std::all_of(empty.raw, empty.raw + 16, [](uint8_t b) { return b == 0; }));
    ibv_gid bad{};
    CHECK(ibv_query_gid(ctx, 1, 4, &bad) != 0);
    ibv_gid_entry table[4];
    CHECK(ibv_query_gid_table(ctx, table, 4, 0) == 2);
    REQUIRE(ibv_close_device(ctx) == 0);
  }
}

TEST_CASE("A GID moved to another slot: the old slot is empty and refuses address vectors") {
  Clean clean;
  ibv_context* ctx = open_device("fake0");
  const ibv_gid before = gid_of(ctx, 1);
  CHECK(ctl().move_gid(0, 1, 0) == -1);  // slot 0 is in use
  CHECK(ctl().move_gid(0, 2, 3) == -1);  // slot 2 is empty
  REQUIRE(ctl().move_gid(0, 1, 3) == 0);
  ibv_async_event event{};
  REQUIRE(ibv_get_async_event(ctx, &event) == 0);
  CHECK(event.event_type == IBV_EVENT_GID_CHANGE);
  ibv_ack_async_event(&event);
  const ibv_gid after = gid_of(ctx, 3);
  CHECK(std::memcmp(after.raw, before.raw, 16) == 0);
  ibv_gid_entry e{};
  CHECK(ibv_query_gid_ex(ctx, 1, 1, &e, 0) == ENODATA);
  ibv_gid_entry table[4];
  REQUIRE(ibv_query_gid_table(ctx, table, 4, 0) == 2);
  CHECK(table[1].gid_index == 3);
  ibv_pd* pd = ibv_alloc_pd(ctx);
  REQUIRE(pd != nullptr);
  ibv_ah_attr attr{};
  attr.is_global = 1;
  attr.port_num = 1;
  attr.grh.dgid = before;
  attr.grh.sgid_index = 1;
  errno = 0;
  CHECK(ibv_create_ah(pd, &attr) == nullptr);
  CHECK(errno == ENODATA);
  attr.grh.sgid_index = 3;
  ibv_ah* ah = ibv_create_ah(pd, &attr);
  REQUIRE(ah != nullptr);
  CHECK(ibv_destroy_ah(ah) == 0);
  CHECK(ibv_dealloc_pd(pd) == 0);
  REQUIRE(ibv_close_device(ctx) == 0);
}

TEST_CASE("exported symbols carry rdma-core's version nodes and come from the fake") {
  Clean clean;
  const std::pair<const char*, const char*> syms[] = {
      {"ibv_get_device_list", "IBVERBS_1.1"},
      {"ibv_open_device", "IBVERBS_1.1"},
      {"ibv_query_port", "IBVERBS_1.1"},
      {"ibv_reg_mr", "IBVERBS_1.1"},
      {"ibv_create_qp", "IBVERBS_1.1"},
      {"ibv_modify_qp", "IBVERBS_1.1"},
      {"ibv_create_comp_channel", "IBVERBS_1.0"},
      {"ibv_destroy_comp_channel", "IBVERBS_1.0"},
      {"ibv_rate_to_mult", "IBVERBS_1.0"},
      {"ibv_get_pkey_index", "IBVERBS_1.5"},
      {"ibv_qp_to_qp_ex", "IBVERBS_1.6"},
      {"ibv_reg_mr_iova", "IBVERBS_1.7"},
      {"ibv_reg_mr_iova2", "IBVERBS_1.8"},
      {"ibv_get_device_index", "IBVERBS_1.9"},
      {"ibv_query_ece", "IBVERBS_1.10"},
      {"ibv_set_ece", "IBVERBS_1.10"},
      {"_ibv_query_gid_ex", "IBVERBS_1.11"},
      {"ibv_reg_dmabuf_mr", "IBVERBS_1.12"},
      {"ibv_is_fork_initialized", "IBVERBS_1.13"},
      {"ibv_query_qp_data_in_order", "IBVERBS_1.14"},
      {"fake_verbs_port_down", "FAKE_VERBS_1.0"}};
  for (auto [name, version] : syms) {
    INFO(name << "@" << version);
    void* p = dlvsym(RTLD_DEFAULT, name, version);
    REQUIRE(p != nullptr);
    Dl_info info{};
    REQUIRE(dladdr(p, &info) != 0);
    CHECK(std::string(info.dli_fname).find("fake_verbs/lib/libibverbs.so.1") != std::string::npos);
  }
  // Wrong node must not resolve (proves the nodes are real, not a catch-all).
  CHECK(dlvsym(RTLD_DEFAULT, "ibv_create_comp_channel", "IBVERBS_1.1") == nullptr);
}

TEST_CASE("string and rate helpers match rdma-core") {
  CHECK(std::string(ibv_wc_status_str(IBV_WC_RETRY_EXC_ERR)) == "transport retry counter exceeded");
  CHECK(std::string(ibv_wc_status_str(IBV_WC_WR_FLUSH_ERR)) == "Work Request Flushed Error");
  CHECK(std::string(ibv_wc_status_str(IBV_WC_SUCCESS)) == "success");
  CHECK(std::string(ibv_event_type_str(IBV_EVENT_PORT_ERR)) == "port error");
  CHECK(std::string(ibv_event_type_str(IBV_EVENT_PORT_ACTIVE)) == "port active");
  CHECK(std::string(ibv_port_state_str(IBV_PORT_ACTIVE)) == "active");
  CHECK(std::string(ibv_port_state_str(IBV_PORT_DOWN)) == "down");
  CHECK(std::string(ibv_node_type_str(IBV_NODE_CA)) == "InfiniBand channel adapter");
  CHECK(ibv_rate_to_mbps(IBV_RATE_100_GBPS) == 103125);
  CHECK(mbps_to_ibv_rate(25781) == IBV_RATE_25_GBPS);
  CHECK(ibv_rate_to_mult(IBV_RATE_40_GBPS) == 16);
  CHECK(mult_to_ibv_rate(4) == IBV_RATE_10_GBPS);
  CHECK(ibv_rate_to_mult(IBV_RATE_100_GBPS) == -1);
  CHECK(mult_to_ibv_rate(160) == IBV_RATE_400_GBPS);
  CHECK(ibv_rate_to_mbps(IBV_RATE_1200_GBPS) == 1275000);
}

TEST_CASE("unsupported verbs fail cleanly") {
  Clean clean;
  ibv_context* ctx = open_device("fake0");
  ibv_pd* pd = ibv_alloc_pd(ctx);
  REQUIRE(pd != nullptr);
  errno = 0;
  CHECK(ibv_reg_dmabuf_mr(pd, 0, 4096, 0, 3, IBV_ACCESS_LOCAL_WRITE) == nullptr);
  CHECK(errno == EOPNOTSUPP);
  ibv_cq_init_attr_ex cqa{};
  cqa.cqe = 4;
  cqa.wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;  // timestamps are not modelled
  errno = 0;
  CHECK(ibv_create_cq_ex(ctx, &cqa) == nullptr);
  CHECK(errno == EOPNOTSUPP);
  ibv_cq* cq = ibv_create_cq(ctx, 4, nullptr, nullptr, 0);
  REQUIRE(cq != nullptr);
  CHECK(ibv_modify_cq(cq, nullptr) == EOPNOTSUPP);  // (ibv_resize_cq is modelled: datapath_test)
  CHECK(ibv_alloc_mw(pd, IBV_MW_TYPE_1) == nullptr);
  errno = 0;
  CHECK(ibv_create_ah_from_wc(pd, nullptr, nullptr, 1) == nullptr);
  CHECK(errno == EOPNOTSUPP);
  CHECK(ibv_fork_init() == 0);
  CHECK(ibv_is_fork_initialized() == IBV_FORK_ENABLED);
  REQUIRE(ibv_destroy_cq(cq) == 0);
  REQUIRE(ibv_dealloc_pd(pd) == 0);
  REQUIRE(ibv_close_device(ctx) == 0);
}

// Hidden: run by the fake_verbs_six_devices ctest entry with VF_FAKE_VERBS_DEVICES=6.
TEST_CASE("VF_FAKE_VERBS_DEVICES=6 gives fake0..fake5 as three hosts with two rails",
          "[.][six_devices]") {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  REQUIRE(n == 6);
  CHECK(std::string(ibv_get_device_name(list[5])) == "fake5");
  ibv_free_device_list(list);
  ibv_context* ctx = open_device("fake5");
  ibv_gid g = gid_of(ctx, 1);
  CHECK(g.raw[12] == 198);
  CHECK(g.raw[13] == 18);
  CHECK(g.raw[14] == 2);  // rail 1
  CHECK(g.raw[15] == 3);  // host 2 ("host C")
  ibv_close_device(ctx);
}

// As rxe's check_addr: a packet is taken only if addressed to the QP's own source GID and sent
// from the GID it is connected to. A connected QP keeps the GID its address vector took, also
// after that GID's slot is emptied (the kernel holds a reference to the entry).
TEST_CASE("Packets are taken only from the address a QP is connected to") {
  Clean clean;
  QpOptions o;
  o.retry_cnt = 2;
  SECTION("a connected QP keeps sending from its GID after the slot moves") {
    Pair p(o);
    Region rb(p.b.pd, 64);
    Region ra(p.a.pd, 64);
    ra.fill("moved");
    REQUIRE(ctl().move_gid(0, 1, 3) == 0);  // A's address, re-added elsewhere
    REQUIRE(post_recv(p.b.qp, 1, {rb.sge(0, 64)}) == 0);
    REQUIRE(post_send(p.a.qp, Send{IBV_WR_SEND, 2, {ra.sge(0, 5)}}) == 0);
    CHECK(poll_one(p.a.send_cq).status == IBV_WC_SUCCESS);
    CHECK(poll_one(p.b.recv_cq).status == IBV_WC_SUCCESS);
    CHECK(rb.str(0, 5) == "moved");
  }
  SECTION("a peer connected to another of the sender's GIDs drops what it sends") {
    Pair p(o);
    // B re-connected to A's link-local GID, while A sends from its IPv4 GID.
    ibv_qp_attr reset{};
    reset.qp_state = IBV_QPS_RESET;
    REQUIRE(ibv_modify_qp(p.b.qp, &reset, IBV_QP_STATE) == 0);
    connect(p.b.qp, o.qp_access, p.a.qp->qp_num, gid_of(p.a.ctx, 0), o.retry_cnt, o.rnr_retry);
    Region rb(p.b.pd, 64);
    Region ra(p.a.pd, 64);
    REQUIRE(post_recv(p.b.qp, 1, {rb.sge(0, 64)}) == 0);
    REQUIRE(post_send(p.a.qp, Send{IBV_WR_SEND, 2, {ra.sge(0, 5)}}) == 0);
    const auto wcs = poll(p.a.send_cq, 1, 1000);
    REQUIRE(wcs.size() == 1);
    CHECK(wcs[0].status == IBV_WC_RETRY_EXC_ERR);
    CHECK(poll(p.b.recv_cq, 1, 10).empty());
  }
}

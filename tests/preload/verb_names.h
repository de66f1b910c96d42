/* The verbs NCCL resolves with dlvsym (from ../shared/docs/verbs-facts.md), with the version it
   asks for. Shared by the preload test programs. */
#pragma once

struct verb_name {
  const char* name;
  const char* version;
  int optional; /* NCCL tolerates its absence */
};

static const struct verb_name kNcclVerbs[] = {
    {"ibv_get_device_list", "IBVERBS_1.1", 0}, {"ibv_free_device_list", "IBVERBS_1.1", 0},
    {"ibv_get_device_name", "IBVERBS_1.1", 0}, {"ibv_open_device", "IBVERBS_1.1", 0},
    {"ibv_close_device", "IBVERBS_1.1", 0},    {"ibv_get_async_event", "IBVERBS_1.1", 0},
    {"ibv_ack_async_event", "IBVERBS_1.1", 0}, {"ibv_event_type_str", "IBVERBS_1.1", 0},
    {"ibv_query_device", "IBVERBS_1.1", 0},    {"ibv_query_port", "IBVERBS_1.1", 0},
    {"ibv_query_gid", "IBVERBS_1.1", 0},       {"ibv_query_qp", "IBVERBS_1.1", 0},
    {"ibv_alloc_pd", "IBVERBS_1.1", 0},        {"ibv_dealloc_pd", "IBVERBS_1.1", 0},
    {"ibv_reg_mr", "IBVERBS_1.1", 0},          {"ibv_dereg_mr", "IBVERBS_1.1", 0},
    {"ibv_create_cq", "IBVERBS_1.1", 0},       {"ibv_destroy_cq", "IBVERBS_1.1", 0},
    {"ibv_create_qp", "IBVERBS_1.1", 0},       {"ibv_modify_qp", "IBVERBS_1.1", 0},
    {"ibv_destroy_qp", "IBVERBS_1.1", 0},      {"ibv_fork_init", "IBVERBS_1.1", 0},
    {"ibv_reg_mr_iova2", "IBVERBS_1.8", 1},    {"ibv_reg_dmabuf_mr", "IBVERBS_1.12", 1},
    {"ibv_query_ece", "IBVERBS_1.10", 1},      {"ibv_set_ece", "IBVERBS_1.10", 1},
    {"ibv_query_port_speed", "IBVERBS_1.16", 1},
};

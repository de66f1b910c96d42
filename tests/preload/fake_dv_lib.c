/* A stand-in for a provider's direct-verbs library (libmlx5's mlx5dv_create_cq, libefa's
   efadv_create_cq): exported under the provider's version node, it creates the CQ through the
   fake provider's own entry, never through libibverbs' verbs_context op, so the shim sees only
   this call. Used by dv_cq_program.c on the fake fabric. */
#include <infiniband/verbs.h>
#include <stdint.h>

struct ibv_cq_ex* fake_verbs_provider_create_cq_ex(struct ibv_context* context,
                                                   struct ibv_cq_init_attr_ex* attr);

struct ibv_cq_ex* mlx5dv_create_cq(struct ibv_context* context, struct ibv_cq_init_attr_ex* attr,
                                   void* mlx5_cq_attr) {
  (void)mlx5_cq_attr;
  struct ibv_cq_init_attr_ex copy = *attr; /* as mlx5 does */
  return fake_verbs_provider_create_cq_ex(context, &copy);
}

struct ibv_cq_ex* efadv_create_cq(struct ibv_context* context, struct ibv_cq_init_attr_ex* attr,
                                  void* efa_attr, uint32_t inlen) {
  (void)efa_attr;
  (void)inlen;
  return fake_verbs_provider_create_cq_ex(context, attr);
}

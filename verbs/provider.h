/*
 * verbs/provider.h - internal: how providers plug into ote_verbs_open().
 *
 * Each provider exposes one open function that builds an ote_verbs_t whose ops table it
 * owns (NULL entries are filled with EOPNOTSUPP stubs by ote_verbs_open()).
 */
#ifndef OTE_VERBS_PROVIDER_H
#define OTE_VERBS_PROVIDER_H

#include "verbs/verbs.h"

#ifdef __cplusplus
extern "C" {
#endif

/* rdma_core.c: thin binding over libibverbs. config is ignored. */
ote_status_t ote__verbs_rdma_core_open(const char *config, ote_verbs_t **v_out);
/* rdma_core_ex.c: the rdma-core provider's extended entries and their per-instance
 * state (v->priv: libmlx5 loaded at run time, the flags of QPs created with flags). */
typedef struct ote__rc_state ote__rc_state_t;
ote_status_t ote__rc_state_new(ote__rc_state_t **out);
void ote__rc_state_free(ote__rc_state_t *s);
/* Where sysfs is mounted for the provider's own reads (the NUMA node of a device): the
 * open's "sysfs_root=PATH", else /sys. */
ote_status_t ote__rc_state_set_sysfs_root(ote__rc_state_t *s, const char *root);
const char *ote__rc_sysfs_root(const ote_verbs_t *v);
/* destroy_qp succeeded: drop qp from the flags table. */
void ote__rc_forget_qp(ote_verbs_t *v, struct ibv_qp *qp);
int ote__rc_query_device_ex(ote_verbs_t *v, struct ibv_context *ctx,
                            struct ibv_device_attr_ex *attr);
int ote__rc_create_qp_flags(ote_verbs_t *v, struct ibv_pd *pd, struct ibv_qp_init_attr *init_attr,
                            uint32_t flags, struct ibv_qp **qp_out);
int ote__rc_qp_flags(ote_verbs_t *v, struct ibv_qp *qp, uint32_t *flags_out);
int ote__rc_device_flags(ote_verbs_t *v, struct ibv_context *ctx, uint32_t *flags_out);

/* sim/: the software RC provider. config: see verbs/sim/sim.h (NULL = OTE_SIM_CONFIG
 * environment variable, else the default two-device layout). */
ote_status_t ote__verbs_sim_open(const char *config, ote_verbs_t **v_out);

#ifdef __cplusplus
}
#endif
#endif

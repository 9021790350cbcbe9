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
/* sim/: the software RC provider. config: see verbs/sim/sim.h (NULL = OTE_SIM_CONFIG
 * environment variable, else the default two-device layout). */
ote_status_t ote__verbs_sim_open(const char *config, ote_verbs_t **v_out);

#ifdef __cplusplus
}
#endif
#endif

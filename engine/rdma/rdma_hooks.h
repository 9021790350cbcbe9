/*
 * engine/rdma/rdma_hooks.h - where a test may reach into the RDMA transport of its
 * process. Every pointer is NULL in the shipped library (which then behaves as in
 * production); tests set them, or link the test-only //engine/rdma:testing, which sets
 * `track` before main. Set while no RDMA engine is being created; read without a lock.
 */
#ifndef OTE_ENGINE_RDMA_RDMA_HOOKS_H
#define OTE_ENGINE_RDMA_RDMA_HOOKS_H

#include "base/status.h"
#include "verbs/verbs.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ote__rdma_tp;

typedef struct {
    /* Called with the provider a transport just opened; may replace *v (for example with
     * verbs/fault's decorator owning the inner provider). A failure refuses the engine's
     * creation with that status. */
    ote_status_t (*wrap_verbs)(ote_verbs_t **v);
    /* Ranks NICs by this NUMA distance (a, b: nodes; negative: unknown) instead of
     * hwloc's (the sim's devices have NUMA nodes but no topology). */
    int (*distance)(void *arg, int a, int b);
    /* A transport from its creation (on 1) until its teardown begins (on 0); idempotent. */
    void (*track)(struct ote__rdma_tp *tp, int on);
    /* Nonzero: a transport created now advertises no rdma_pair=1 and answers no grant in
     * the pair form (an older source: requesters keep their k % ndev pairing). */
    int no_pair;
} ote__rdma_hooks_t;

extern ote__rdma_hooks_t ote__rdma_hooks;

/* Transports retained now: their teardown could not join a control connection thread
 * within its bound, or a native owner would not be destroyed, so they keep (do not free)
 * everything not yet destroyed. A later teardown that finishes takes its transport off. */
uint64_t ote__rdma_retained_transports_get(void);

#ifdef __cplusplus
}
#endif
#endif

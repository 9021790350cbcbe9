/*
 * engine/rdma/test_hook.h - what tests of the RDMA transport may reach inside it.
 *
 * ote__rdma_test_verbs_hook: when set (before ote_engine_create() of a transport=rdma
 * engine), called with the provider the transport just opened; it may replace *v, for
 * example with verbs/fault's decorator owning the inner provider, and keep a pointer to
 * arm rules on it. A failure refuses the engine's creation with that status. Tests only;
 * not synchronized (set it while no RDMA engine is being created).
 *
 * ote__rdma_retained_transports: transports retained now: their teardown could not join a
 * control connection thread within its bound, or a native owner would not be destroyed,
 * so they keep (do not free) everything not yet destroyed. A later teardown that
 * finishes takes its transport off the count.
 */
#ifndef OTE_ENGINE_RDMA_TEST_HOOK_H
#define OTE_ENGINE_RDMA_TEST_HOOK_H

#include <stdint.h>

#include "base/status.h"
#include "verbs/verbs.h"

#ifdef __cplusplus
extern "C" {
#endif

extern ote_status_t (*ote__rdma_test_verbs_hook)(ote_verbs_t **v);
uint64_t ote__rdma_retained_transports_get(void);

#ifdef __cplusplus
}
#endif
#endif

/*
 * cq/cq_internal.h - internal: the lane structure, shared by lane.c and workers.c.
 */
#ifndef OTE_CQ_CQ_INTERNAL_H
#define OTE_CQ_CQ_INTERNAL_H

/* Compiled only inside the cq library (Bazel local_defines, never passed on to
 * dependents): an outside file that includes this header fails here. */
#ifndef OTE__INSIDE_CQ
#error \
    "cq/cq_internal.h is internal to OrbitTE's cq layer; include cq/lane.h or cq/workers.h instead"
#endif

#include <stdatomic.h>

#include "base/hash.h"
#include "base/lock.h"
#include "cq/lane.h"

typedef struct lane_ns {
    uint32_t ns;
    ote_cq_record_fn fn;
    void *arg;
    int shared; /* ote_cq_lane_share_ns: takes completions of unhooked QPs */
    UT_hash_handle hh;
} lane_ns_t;

typedef struct lane_hook {
    uint32_t qp_num;
    ote_cq_qp_hook_fn fn;
    void *arg;
    UT_hash_handle hh;
} lane_hook_t;

struct ote_cq_lane {
    ote_context_t *ctx;
    ote_verbs_t *v;
    uint32_t index;
    struct ibv_comp_channel *channel; /* NULL without a channel, or once destroyed */
    struct ibv_cq *cq[2];             /* NULL once destroyed */
    uint32_t capacity[2];
    int retained[3]; /* send CQ, recv CQ, channel counted as retained */
    int closing;     /* destroy started: nothing polls the CQs any more */
    int depth[2];    /* CQEs asked of each CQ at creation: a replacement asks the same */
    int use_channel; /* made with a channel: a replacement after an unbind makes a new one */

    /* Health (ote_cq_lane_state_t, written under table_mu, read lock-free by pollers): a
     * FAULTED lane attaches no new QP and is replaced (ote_cq_lane_replace) once its QPs
     * are gone. fault: the cause (table_mu). generation: replacements so far. */
    _Atomic int state;
    ote_status_t fault;
    _Atomic uint64_t generation;
    uint32_t pins;        /* QPs being created on the current CQs (ote_cq_lane_pin) */
    uint64_t listener_id; /* the context listener that sees CQ_ERR events */
    int listener_added;

    ote_mutex_t poll_mu;  /* held by the one thread polling (and dispatching) */
    ote_mutex_t table_mu; /* namespaces, hooks, budget */
    lane_ns_t *namespaces;
    lane_hook_t *hooks;
    uint32_t next_ns;
    uint32_t attached;
    int in_workers; /* added to a worker pool: destroy waits for removal */
    uint32_t outstanding[2];

    ote_mutex_t progress_mu; /* with progress_cv: wakes waiters after each poll */
    ote_cond_t progress_cv;
    uint64_t progress_epoch;

    _Atomic uint64_t completions, errors, stray, poll_failures;
};

/* Poll and dispatch with the poll lock already held by the caller. Returns the number
 * of completions or a negative errno from poll_cq. */
int ote__cq_lane_poll_locked(ote_cq_lane_t *lane);
/* Arm both CQs for one notification (channel lanes); 0 or errno. */
int ote__cq_lane_arm(ote_cq_lane_t *lane);
/* Consume and ack pending channel events (non-blocking fd). */
void ote__cq_lane_consume_events(ote_cq_lane_t *lane);
/* Take / drop the poll lock, marking this thread as the lane's poller. */
void ote__cq_lane_poll_lock(ote_cq_lane_t *lane);
void ote__cq_lane_poll_unlock(ote_cq_lane_t *lane);

#endif

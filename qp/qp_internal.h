/*
 * qp/qp_internal.h - internal: the QP structure shared by qp.c (lifecycle, connection,
 * events), send_queue.c and receive_queue.c.
 *
 * Locks: native_mu serializes state transitions (modify/destroy) of the native QP; mu
 * guards the queues' accounting and state. Order: lane poll lock -> native_mu -> mu ->
 * lane table lock. Completion hooks run under the lane poll lock and take only mu.
 */
#ifndef OTE_QP_QP_INTERNAL_H
#define OTE_QP_QP_INTERNAL_H

/* Compiled only inside the qp library (Bazel local_defines, never passed on to
 * dependents): an outside file that includes this header fails here. */
#ifndef OTE__INSIDE_QP
#error "qp/qp_internal.h is internal to OrbitTE's qp layer; include qp/qp.h instead"
#endif

#include "base/hash.h"
#include "base/lock.h"
#include "qp/qp.h"
#include "qp/srq.h"

typedef struct sq_entry {
    uint64_t wr_id;
    ote_deadline_t deadline;
    int expired;
    struct sq_entry *next_free;
    UT_hash_handle hh;
} sq_entry_t;

struct ote_qp {
    ote_cq_lane_t *lane;
    ote_context_t *ctx;
    ote_verbs_t *v;
    ote_qp_config_t cfg;
    struct ibv_qp *qp; /* NULL once natively destroyed */
    uint32_t qp_num;
    uint32_t psn;
    uint8_t port;
    int gid_index;
    ote_qp_path_t local;

    ote_mutex_t native_mu;
    ote_mutex_t mu;
    enum ibv_qp_state state;
    int fenced;
    ote_status_t fence_cause; /* ote_qp_fence's device-scope cause; OTE_OK: none given */
    uint64_t route_gen;       /* the context's route generation this QP was built on */
    int closing;
    int hook_attached;
    int listener_added;
    uint64_t listener_id;
    int retained_qp, retained_mr;

    /* Send queue: a fixed pool of max_send_wr entries; outstanding ones in a hash. */
    sq_entry_t *pool;
    sq_entry_t *free_list;
    sq_entry_t *outstanding;
    uint32_t sq_count;

    /* Receive queue. */
    uint8_t *rq_buf;
    struct ibv_mr *rq_mr;
    uint8_t *rq_posted;
    uint32_t rq_count;
    uint32_t rq_admitted; /* ote_qp_rq_admit reservations (under mu) */

    uint64_t send_completions, send_errors, recv_completions, recv_errors;
    uint64_t unknown_cqes, expired, resolved_by_destroy;
};

/* send_queue.c */
ote_status_t ote__sq_init(ote_qp_t *qp);
/* sq_pool.c: up to n credits of pool (n without a pool; 0: none free), a short take
 * counted as a wait; and their return. */
size_t ote__sq_pool_take(ote_sq_pool_t *pool, size_t n);
void ote__sq_pool_put(ote_sq_pool_t *pool, size_t n);
void ote__sq_fini(ote_qp_t *qp);
/* A send CQE: discharge its WR; 1 to forward it to the record. */
int ote__sq_complete(ote_qp_t *qp, const struct ibv_wc *wc);
/* After native destruction: end every WR still owed (synthesized completions). */
void ote__sq_resolve_destroyed(ote_qp_t *qp);

/* receive_queue.c */
ote_status_t ote__rq_init(ote_qp_t *qp);
/* Deregister the RQ MR and free the buffers: OTE_ERR_RETAINED keeps both. */
ote_status_t ote__rq_fini(ote_qp_t *qp);
/* Post every idle slot (caller holds native_mu). */
ote_status_t ote__rq_post_idle(ote_qp_t *qp);
/* A receive CQE (consumed here, never forwarded). */
void ote__rq_complete(ote_qp_t *qp, const struct ibv_wc *wc);
/* Forget posted slots the provider discarded (RESET) or destroyed: release credits. */
void ote__rq_forget_posted(ote_qp_t *qp);

/* A receive completion of an SRQ slot that qp took: its statistics (an error fences it
 * and marks it ERR, as for its own queue) and, on success, its on_recv with the buffer. */
void ote__rq_srq_recv(ote_qp_t *qp, const struct ibv_wc *wc, const void *buf);

/* srq.c: the QPs on an SRQ. attach: completions naming qp_num go to qp from now on;
 * detach: no more, and the qp's `admitted` reservations go back to the SRQ. admit: as
 * ote_srq_admit without its fault point (ote_qp_rq_admit has hit it already). */
struct ibv_pd *ote__srq_pd(const ote_srq_t *srq);
ote_status_t ote__srq_attach(ote_srq_t *srq, ote_qp_t *qp, uint32_t qp_num);
void ote__srq_detach(ote_srq_t *srq, uint32_t qp_num, uint32_t admitted);
ote_status_t ote__srq_admit(ote_srq_t *srq);

#endif

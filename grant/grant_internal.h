/*
 * grant/grant_internal.h - the records and the manager shared by grant/'s files:
 * grant.c (requester and source grants, completions, the monitor's tick) and manager.c
 * (slice geometry, sequence numbers, the window pool and retained windows, manager
 * create/destroy). Not a public header: only grant/'s own sources include it.
 *
 * Locking: one manager mutex (m->mu) guards every grant of the manager, the MW pool,
 * the retained windows and the per-lane wait lists; see grant.c for the lock order.
 */
#ifndef OTE_GRANT_GRANT_INTERNAL_H
#define OTE_GRANT_GRANT_INTERNAL_H

/* Compiled only inside the grant library (Bazel local_defines, never passed on to
 * dependents): an outside file that includes this header fails here. */
#ifndef OTE__INSIDE_GRANT
#error "grant/grant_internal.h is internal to OrbitTE's grant layer; include grant/grant.h instead"
#endif

#include "base/hash.h"
#include "base/lock.h"
#include "grant/grant.h"

#define IDX_INV 0xffffu  /* the SEND_WITH_INV of a requester grant */
#define IDX_BIND 0xfffeu /* the BIND_MW of a source grant */
#define SEQ_MASK 0xffffffu
#define CHAIN 16u /* WRs per post_send call */

typedef enum { R_WAIT_ANSWER = 0, R_POSTING, R_INVALIDATING, R_ENDED } rstate_t;
typedef enum { S_BINDING = 0, S_BOUND, S_ENDED } sstate_t;

typedef struct mw_ent {
    struct ibv_mw *mw;
    uint32_t rkey; /* current key: the library does not track type-2 rkeys */
    struct mw_ent *next;
} mw_ent_t;

typedef struct grant grant_t;
struct grant {
    ote_grant_mgr_t *m;
    uint32_t seq;
    int source;
    uint32_t lane;
    ote_endpoint_t *ep;
    uint32_t slot;
    ote_qp_t *qp;
    uint32_t qp_num;
    int qp_returned;
    int rq_admitted; /* source: holds a receive admission on qp (its receipt's slot) */
    ote_deadline_t deadline;
    ote_status_t failed;
    uint32_t outstanding; /* WRs posted and not yet discharged */
    int waiting;          /* on the lane wait list */
    grant_t *wait_next;
    grant_t *fin_next; /* deferred end */
    int finished;      /* on a deferred end list: never again */

    /* requester */
    rstate_t rstate;
    ote_grant_desc_t d;
    uint32_t rkey;
    uint32_t nslices, next, done_slices;
    int cut;             /* canceled: nslices was cut down to the slices already posted */
    uint32_t remote_qpn; /* the source's QP on the slot when the grant started */
    int answered;        /* the source answered OK: it holds a window (rkey) */
    int abandon;         /* ended failed after an OK answer: desc.abandoned is due */
    int requesting;      /* ote_grant_start is in request(): no tick ends it meanwhile */

    /* source */
    sstate_t sstate;
    void *pin;
    mw_ent_t *mw;
    int mw_unbound; /* proven unbound (invalidated, or the bind never ran) */
    int keyed;      /* in by_key */
    int bind_wait;  /* the bind waits for room on the QP's SQ (on the lane wait list) */
    struct ibv_mr *bind_mr;
    uint64_t bind_addr, bind_len;
    int bind_access;
    uint64_t answer_ctx;
    int exact; /* served by an exact-range MR (ote_grant_serve_exact): no window */

    UT_hash_handle hh;     /* by seq */
    UT_hash_handle hh_key; /* source: by rkey */
};

typedef struct {
    ote_grant_mgr_t *m;
    uint32_t idx;
    ote_cq_lane_t *lane;
    uint32_t ns;
    int registered;
    grant_t *wait_head, *wait_tail;
} mlane_t;

struct ote_grant_mgr {
    ote_context_t *ctx;
    ote_verbs_t *v;
    uint32_t nlanes;
    mlane_t *lanes;
    int has_src;
    ote_grant_source_ops_t src;
    ote_mutex_t mu;
    grant_t *by_seq;
    grant_t *by_key;
    uint32_t next_seq;
    ote_status_t fence;
    mw_ent_t *pool;
    mw_ent_t *retained; /* windows whose dealloc failed: kept, counted, retried */
    ote_grant_stats_t stats;
};

/* The completion callback of every lane namespace a manager registers (grant.c). */
void ote__grant_on_cqe(void *arg, ote_cq_lane_t *lane, ote_cq_dir_t dir, const struct ibv_wc *wc);

/* Give record g a sequence number no live record has (never 0) and index it. m->mu held.
 * On failure (no memory for the index) g is not indexed. */
ote_status_t ote__grant_seq_assign(ote_grant_mgr_t *m, grant_t *g);
/* Deallocate window ent, or retain it: a failed dealloc keeps the entry (and the native
 * window) on m->retained, counted in the manager's stats and as OTE_RETAINED_MW in its
 * context, until a later retry succeeds. Returns 0 or the dealloc's errno. m->mu held
 * (or the manager owned alone). */
int ote__grant_mw_dealloc_or_retain(ote_grant_mgr_t *m, mw_ent_t *ent);
/* Retry the dealloc of every retained window; returns how many are still retained.
 * m->mu held (or the manager owned alone). */
size_t ote__grant_mw_retry_retained(ote_grant_mgr_t *m);

#endif

/*
 * grant/grant_internal.h - the records and the manager shared by grant/'s files:
 * grant.c (what both kinds of grant share: deferred work, ends, lane locking, the
 * completion callback, the monitor's tick), requester.c (requester grants: answer,
 * slices, invalidation), source.c (source grants: registration check, MW bind, receipt,
 * release), window.c (the window pool, key history, retired and retained windows) and
 * manager.c (slice geometry, sequence numbers, manager create/destroy, stats). Not a
 * public header: only grant/'s own sources include it.
 *
 * Locking (issue 25.4: the lanes of one manager run in parallel). Two kinds of lock:
 *
 *   lane lock   mlane_t.mu, one per lane. Guards every mutable field of the grants of
 *               that lane (a grant's lane never changes), the lane's wait list, its list
 *               of live grants and its stats. A lane's posts (ote_qp_post_send on its
 *               QPs), cancels (ote_qp_cancel) and its grants' endpoint return/retire
 *               happen under it, and only under it: another lane never waits for them.
 *   manager     m->mu. Short critical sections on what the lanes share: the by-seq and
 *   lock        by-key tables, next_seq, the fence, the window pool, retired/retained
 *               windows and the manager's own stats. Never held across a native call,
 *               a post, a poll, or any call into another layer.
 *
 * Lock order: CQ lane poll lock (cq/) -> lane lock -> { qp locks -> CQ lane table lock;
 * endpoint store locks; manager lock }. The manager lock is a leaf; two lane locks are
 * never held together; no thread takes a CQ poll lock while it holds a lane lock. User
 * callbacks (done, abandoned, answer, unpin) and window allocs/deallocs run with no grant
 * lock held (defer_t); only desc.canceled() is called under the grant's lane lock.
 *
 * Finding a grant from a thread that does not yet hold its lane lock (an answer, a
 * receipt, a release): ote__grant_lock_find() looks it up under the manager lock, reads
 * its lane (fixed at creation), takes that lane lock, and looks it up again. A record
 * leaves the tables and its lane's live list only with its lane lock held (and is freed
 * after), so a record found with its lane lock held stays valid until that lock drops.
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
/* The tags of one window index: an rkey is index << 8 | tag (ibv_inc_rkey changes the
 * tag only). */
#define MW_TAGS 256u
/* Windows allocated in a row whose index has no tag left before ote__grant_mw_take gives
 * up (each is kept: see key_hist_t). */
#define MW_ALLOC_TRIES 8

typedef enum { R_WAIT_ANSWER = 0, R_POSTING, R_INVALIDATING, R_ENDED } rstate_t;
typedef enum { S_BINDING = 0, S_BOUND, S_ENDED } sstate_t;

/* The key domain of the manager's PD: the key history of every window index (rkey >> 8)
 * a window of this manager ever had, across windows. Each tag an index carried (the
 * allocation's and every bind's) is marked used, and a bind takes the next unused tag,
 * so no rkey repeats within the manager's life, even when the provider hands an index
 * back to a later window after a dealloc (window.c). An index whose 256 tags are all used
 * keeps its window allocated (m->exhausted), so that the provider cannot give it out
 * again, until the manager is destroyed or the provider has no window left for a new
 * allocation (then the oldest exhausted window goes and its index starts a new history:
 * window.c says when, with a WARN). Entries are added under the manager lock; the used
 * tags of an index are written only by the one live window at that index. */
typedef struct key_hist {
    uint32_t index;
    uint32_t nused;
    uint8_t used[MW_TAGS / 8];
    UT_hash_handle hh;
} key_hist_t;

/* A type-2 window. Its rkey's low 8 bits (the tag) change with every bind, to the next
 * tag its index's history has not used (key_hist_t). */
typedef struct mw_ent {
    struct ibv_mw *mw;
    uint32_t rkey;    /* current key: the library does not track type-2 rkeys */
    uint32_t binds;   /* binds posted by this window (each used up one tag) */
    key_hist_t *hist; /* its index's history in the manager's key domain */
    struct mw_ent *next;
} mw_ent_t;

typedef struct grant grant_t;
struct grant {
    /* Fixed once the record is indexed: read without locks. */
    ote_grant_mgr_t *m;
    uint32_t seq;
    int source;
    uint32_t lane;
    ote_endpoint_t *ep;
    uint32_t slot;
    ote_qp_t *qp;
    uint32_t qp_num;

    /* Everything below: its lane's lock. */
    grant_t *live_prev, *live_next; /* on its lane's list of live grants */
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

    UT_hash_handle hh;     /* by seq (manager lock) */
    UT_hash_handle hh_key; /* source: by rkey (manager lock) */
};

typedef struct {
    ote_grant_mgr_t *m;
    uint32_t idx;
    ote_cq_lane_t *lane;
    uint32_t ns;
    int registered;
    ote_mutex_t mu; /* the lane lock: see the header comment */
    grant_t *wait_head, *wait_tail;
    grant_t *live; /* the lane's live grants (indexed, not yet ended) */
    ote_grant_stats_t stats;
} mlane_t;

struct ote_grant_mgr {
    ote_context_t *ctx;
    ote_verbs_t *v;
    uint32_t nlanes;
    mlane_t *lanes;
    int has_src;
    ote_grant_source_ops_t src;
    ote_mutex_t mu; /* the manager lock: see the header comment */
    grant_t *by_seq;
    grant_t *by_key;
    uint32_t next_seq;
    ote_status_t fence;
    mw_ent_t *pool;
    mw_ent_t *retained;      /* windows whose dealloc failed: kept, counted, retried */
    key_hist_t *keys;        /* the key domain: history per window index */
    mw_ent_t *exhausted;     /* windows whose index has no tag left: kept, newest first */
    ote_grant_stats_t stats; /* the manager's share; each lane counts its own */
};

/* Work deferred until no grant lock is held. Answers are copied by value: the grant they
 * came from may end in another thread as soon as its lane lock is released. Windows to
 * retire (tags used up) or to deallocate (maybe still bound) wait here too. */
#define DEFER_ANSWERS 32
typedef struct {
    grant_t *fin;
    mw_ent_t *retire;  /* proven unbound, its index's tags used up: kept (m->exhausted) */
    mw_ent_t *dealloc; /* may still be bound: dealloc (which unbinds) or retain */
    size_t nans;
    struct {
        uint64_t ctx;
        ote_status_t st;
        uint32_t rkey;
    } ans[DEFER_ANSWERS];
} defer_t;

/* ---- grant.c: what both kinds of grant share ---- */

/* The completion callback of every lane namespace a manager registers. */
void ote__grant_on_cqe(void *arg, ote_cq_lane_t *lane, ote_cq_dir_t dir, const struct ibv_wc *wc);
/* Find the record of seq (by_key: of rkey k) and lock its lane: returns it with *ml_out's
 * lock held, or NULL with no lock held. */
grant_t *ote__grant_lock_find(ote_grant_mgr_t *m, int by_key, uint32_t k, mlane_t **ml_out);
/* Index record g (its lane's lock held): a fresh sequence number, the by-seq table and
 * its lane's live list, unless the manager is fenced (its status) or out of memory. */
ote_status_t ote__grant_index(ote_grant_mgr_t *m, mlane_t *ml, grant_t *g);
/* Undo ote__grant_index() of a record that never became visible to anyone else. */
void ote__grant_unindex(ote_grant_mgr_t *m, mlane_t *ml, grant_t *g);
int ote__grant_defer_answer(defer_t *df, grant_t *g, ote_status_t st);
/* Run deferred work: no grant lock held. */
void ote__grant_defer_run(ote_grant_mgr_t *m, defer_t *df);
ote_status_t ote__grant_wc_status(const struct ibv_wc *wc);
void ote__grant_give_back_qp(grant_t *g, int broken);
void ote__grant_wait_add(mlane_t *ml, grant_t *g);
void ote__grant_wait_remove(mlane_t *ml, grant_t *g);
/* End a record once nothing it posted is owed any more (its lane's lock held). */
void ote__grant_maybe_finish(grant_t *g, defer_t *df);

/* ---- requester.c (lane lock held) ---- */
void ote__grant_pump(grant_t *g, defer_t *df);
void ote__grant_post_inv(grant_t *g, defer_t *df);
void ote__grant_fail_requester(grant_t *g, ote_status_t st, defer_t *df);
/* A requester completion (data or SEND_WITH_INV), outstanding already counted down. */
void ote__grant_requester_cqe(grant_t *g, uint32_t idx, const struct ibv_wc *wc, defer_t *df);

/* ---- source.c (lane lock held) ---- */
ote_status_t ote__grant_bind_post(grant_t *g, defer_t *df);
void ote__grant_bind_refused(grant_t *g, ote_status_t st, defer_t *df);
void ote__grant_source_cqe(grant_t *g, uint32_t idx, const struct ibv_wc *wc, defer_t *df);
void ote__grant_source_end(grant_t *g, ote_status_t why, defer_t *df);

/* ---- window.c ---- */
/* A window with tags left: the pool's, or a new one (allocated with no lock held). The
 * manager lock must not be held. OTE_ERR_NATIVE (counted as a bind failure) or NOMEM. */
ote_status_t ote__grant_mw_take(ote_grant_mgr_t *m, mw_ent_t **ent_out);
/* Back to the pool, never bound by us since it was taken (manager lock not held). */
void ote__grant_mw_put(ote_grant_mgr_t *m, mw_ent_t *ent);
/* The next rkey of ent's index: the next tag after its current one that the index's key
 * history has not used; 0 when every tag is used. */
uint32_t ote__grant_mw_next_rkey(const mw_ent_t *ent);
/* Mark rkey's tag used in ent's index history (a bind posted or possibly posted). */
void ote__grant_mw_tag_used(mw_ent_t *ent, uint32_t rkey);
/* A source grant ended (manager lock held): its window goes back to the pool, or, when
 * it may still be bound or its index's tags are used up, onto df to be deallocated/kept. */
void ote__grant_mw_release(ote_grant_mgr_t *m, mw_ent_t *ent, int unbound, defer_t *df);
/* Deferred: keep exhausted windows, deallocate the others (no lock). */
void ote__grant_mw_defer_run(ote_grant_mgr_t *m, defer_t *df);
/* Manager destroy: deallocate the exhausted windows (retained when that fails: returns
 * how many) and free the key domain. No grant lock held, no grant live. */
size_t ote__grant_mw_domain_free(ote_grant_mgr_t *m, int *err_out);
/* Deallocate window ent, or retain it: a failed dealloc keeps the entry (and the native
 * window) on m->retained, counted in the manager's stats and as OTE_RETAINED_MW in its
 * context, until a later retry succeeds. Returns 0 or the dealloc's errno. No grant lock
 * held (or the manager owned alone). */
int ote__grant_mw_dealloc_or_retain(ote_grant_mgr_t *m, mw_ent_t *ent);
/* Retry the dealloc of every retained window; returns how many are still retained. No
 * grant lock held (or the manager owned alone). */
size_t ote__grant_mw_retry_retained(ote_grant_mgr_t *m);

/* ---- manager.c ---- */
/* Give record g a sequence number no live record has (never 0) and index it by seq.
 * m->mu held. On failure (no memory for the index) g is not indexed. */
ote_status_t ote__grant_seq_assign(ote_grant_mgr_t *m, grant_t *g);

#endif

/*
 * engine/rdma/rdma_credits.h - the RDMA transport's credits and aggregate limits: grant
 * credits reserved per request (rdma_max_grants), retries of grants a source refused for
 * want of a receive slot (AGAIN), and the engine-wide limit of QPs (rdma_max_qps).
 * Private to engine/rdma/ (never in a public hdrs).
 *
 * Grant credits (requester). A request (the parent of its slices) reserves its whole
 * grant budget from the engine-wide pool before its first GRANT_REQ: the grants it needs
 * (its bytes over the size of its first run), at most rdma_max_grants, all at once or
 * none (a reservation is never partial: one that does not fit takes nothing). Each
 * started run (one grant) holds one slot of its parent's reservation; a run whose parent
 * has no slot free, or whose parent cannot get its budget, waits at the head of its
 * peer's queue (the submitting thread never waits; the deadline and cancel still end it:
 * the pump, and the monitor through ote__rdma_queue_expire). The reservation lives until
 * every slice of the request ended (grants drained, RELEASE sent, moved or retried runs
 * included); its return, or a run's, kicks the pump thread when a queue waits, with no
 * completion needed. With rdma_max_grants 0 there is no pool; grants are still counted.
 *
 * Receive credits (source, grant/grant.c): a grant is served only with a receive slot of
 * its QP reserved for its receipt (ote_qp_rq_admit), else refused AGAIN before any window
 * or pin exists; the requester retries the run later (OTE__RDMA_SRC_BUSY).
 *
 * QPs: with rdma_max_qps set, the pump thread builds a requester QP only while the engine
 * holds fewer QPs (every device, peer and role, direct endpoints' included); else it
 * retires an idle requester QP, plain or direct (nobody borrows it) and reclaims it, or
 * the build waits (the run stays queued, its deadline ends it with OTE_ERR_TIMEOUT).
 * A source CONNECT that would build a QP past the limit (rdma_srcqp.c) first retires an
 * idle source QP (no borrow, no live grant, so no receipt pending; not of a requester
 * whose CONNECT built one and that had no grant since, within
 * OTE__RDMA_SRC_QP_GRACE_NS), whose requester meets a
 * cache miss at its next GRANT_REQ there and rebuilds it by CONNECT (the run retried
 * once, nothing was bound); else it refuses the CONNECT AGAIN: the requester's run waits
 * queued (OTE__RDMA_SRC_BUSY, asked again after OTE__RDMA_BUSY_PAUSE_NS) until its
 * deadline, where it ends with OTE_ERR_TIMEOUT and a WARN naming the limit.
 *
 * Locks: the credits' own mutex is a leaf (taken under p->mu by the pump; nothing is
 * locked under it). The source build mutex comes before tp->mu and the stores. No function here calls done() or sends.
 */
#ifndef OTE_ENGINE_RDMA_RDMA_CREDITS_H
#define OTE_ENGINE_RDMA_RDMA_CREDITS_H

#include <stdint.h>

#include "base/status.h"
#include "engine/rdma/rdma_internal.h"

typedef struct rdma_credits rdma_credits_t;

/* Creation / teardown (rdma.c): tp->cred. */
ote_status_t ote__rdma_credits_create(rdma_tp_t *tp);
void ote__rdma_credits_destroy(rdma_tp_t *tp);

/* Submit, before s joins its peer's queue: s's scratch (parent, credit) set, and with a
 * grant limit s joins its request's parent (made on its first slice). OTE_ERR_NOMEM: s
 * must end without starting. No lock held. */
ote_status_t ote__rdma_parent_attach(ote__tpeer_t *p, ote__slice_t *s);
/* A slice ends (just before its done()): its bytes leave its parent; the last returns the
 * parent's reservation and kicks the pump thread when a queue waits. No lock held. */
void ote__rdma_parent_slice_end(ote__slice_t *s);

/* The pump, under p->mu: the run s (rlen bytes) takes a grant credit (1), or waits (0:
 * counted, and a return of credits kicks the pump thread). */
int ote__rdma_grant_take(rdma_tp_t *tp, ote__slice_t *s, uint64_t rlen);
/* The run s started under a credit ended, went back to the queue, or never started: its
 * credit returns. Once per take; no-op without one. Returns whether a queue waits for
 * credits: the caller then kicks the pump thread (ote__rdma_pump_kick) once it holds no
 * lock (tp->mu comes before p->mu). Any lock or none. */
int ote__rdma_grant_put(rdma_tp_t *tp, ote__slice_t *s);

/* The parent trailer of the run s's GRANT_REQ (proto.h): its parent's id and budget, 1;
 * 0 when s has no parent or its parent reserved nothing (no grant limit). Any lock. */
int ote__rdma_parent_wire(const ote__slice_t *s, uint64_t *id_out, uint32_t *budget_out);

/* A source refused the run's grant AGAIN (OTE__RDMA_SRC_BUSY): whether it goes back to
 * the queue (not canceled, before its deadline); counted. */
int ote__rdma_busy_may_retry(rdma_tp_t *tp, const ote__slice_t *s, ote_status_t st);
/* How long a peer's queue pauses after such a refusal. */
#define OTE__RDMA_BUSY_PAUSE_NS (2 * OTE_NSEC_PER_MSEC)
/* ... and after a source refused a QP's CONNECT AGAIN (its rdma_max_qps). */
#define OTE__RDMA_QP_BUSY_PAUSE_NS (10 * OTE_NSEC_PER_MSEC)

/* QPs (rdma_max_qps): whether the engine holds the limit now (0 without one). */
int ote__rdma_qps_full(rdma_tp_t *tp);
/* Under p->mu: at the limit, the devices of mask on which p already has a READY QP for
 * s's capability (when there is one), so that runs use the QPs there are instead of
 * retiring one another's. */
uint32_t ote__rdma_qp_mask(rdma_tp_t *tp, ote__tpeer_t *p, const ote__slice_t *s, uint32_t mask);
/* The pump thread, before building a QP: 1 when there is room (or, with retire, an idle
 * requester QP was retired and reclaimed for it), held for the build until
 * ote__rdma_qp_room_end (after it, whatever its outcome); 0 when the build must wait
 * (counted with retire). Checked under the source build mutex, so that a requester build
 * and a source CONNECT never both take the last room. No lock held. */
int ote__rdma_qp_room(rdma_tp_t *tp, int retire);
void ote__rdma_qp_room_end(rdma_tp_t *tp);
/* rdma_max_send_wrs: the send credits every QP of the engine shares (the stores' QP
 * template names it; qp/qp.h ote_sq_pool_t): a post past it waits in the grant layer's
 * lane wait list, retried as sends complete on that lane and by the monitor's tick (a
 * few ms), its deadline and cancel applying there; NULL without the key. */
ote_sq_pool_t *ote__rdma_sq_pool(rdma_tp_t *tp);
/* After a QP was built: the peak of QPs held (qps_peak). Any thread, no lock held. */
void ote__rdma_qps_note(rdma_tp_t *tp);
/* Source CONNECT builds under rdma_max_qps, one at a time (rdma_srcqp.c); counters. */
void ote__rdma_src_build_lock(rdma_tp_t *tp);
void ote__rdma_src_build_unlock(rdma_tp_t *tp);
void ote__rdma_src_qp_count(rdma_tp_t *tp, int evicted);
/* rdma_srcqp.c, the source's CONNECT on c about to build a QP, under the build mutex: 1
 * when there is room under rdma_max_qps (or none is set; an idle source QP may have been
 * retired and reclaimed for it), 0 when the CONNECT is refused AGAIN (counted, logged).
 * No other lock held. */
int ote__rdma_src_qp_room(conn_t *c);
#define OTE__RDMA_SRC_QP_GRACE_NS (5000 * OTE_NSEC_PER_MSEC)

/* Counters for the test hooks. */
typedef struct {
    uint64_t grants_live, grants_peak;     /* requester grants started, not ended */
    uint64_t reserved, reserved_peak;      /* grant credits reserved by parents */
    uint64_t parents;                      /* parents alive */
    uint64_t grant_waits;                  /* runs that waited for grant credits */
    uint64_t busy_retries;                 /* runs asked again after a source's AGAIN */
    uint64_t qps, qp_waits, qp_evictions;  /* QPs held; builds that waited; idle QPs retired */
    uint64_t qps_peak;                     /* the most QPs held right after a build */
    uint64_t src_qp_evictions;             /* idle source QPs retired for a CONNECT */
    uint64_t src_qp_refusals;              /* source CONNECTs refused AGAIN at the limit */
    uint64_t sq_in_use, sq_peak, sq_waits; /* rdma_max_send_wrs credits (qp/sq_pool.c) */
} rdma_credit_stats_t;
void ote__rdma_credit_stats(rdma_tp_t *tp, rdma_credit_stats_t *out);

#endif

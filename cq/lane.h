/*
 * cq/lane.h - a CQ lane: the send CQ and receive CQ of one context, and the dispatch of
 * their completions to the records that own the WR ids.
 *
 * A lane owns two native CQs (send and receive) and, optionally, one completion channel
 * both are attached to. It borrows its context, which must outlive it. QPs created on
 * the lane use its send CQ for their SQ and its receive CQ for their RQ.
 *
 * WR id namespaces: a record (an upper layer's unit of work, e.g. a grant) registers a
 * namespace on the lane and receives a namespace id; it builds its WR ids with
 * OTE_CQ_WR_ID(ns, local). Every completion whose WR id names that namespace is handed
 * to the record's callback. Namespace ids are never reused within a lane, so a late
 * completion for a record that has left cannot reach a newer one; it is counted as
 * stray and dropped.
 *
 * QP hooks: every QP on a lane is attached with a hook for its QP number (the qp layer
 * does this). The hook sees every completion of that QP first (to discharge its own
 * accounting) and returns whether the completion goes on to the namespace owner. A
 * completion of a QP number without a hook (e.g. a destroyed QP's leftover CQE) is
 * stray: counted and dropped, never delivered.
 *
 * Budget: each CQ has a capacity (its actual depth). Whoever posts work charges the
 * lane first (ote_cq_lane_reserve()), so the CQ cannot overrun, and releases the charge
 * when the completion is consumed or the work is proven never to complete.
 *
 * Progress: exactly one thread polls a lane at a time (a worker, or a thread that calls
 * ote_cq_lane_poll()/ote_cq_lane_progress() while no worker holds it). Callbacks and
 * hooks run in the polling thread, with no lane lock held except the poll lock; they may
 * post work and may unregister namespaces or detach QPs (of this lane), but must not
 * call ote_cq_lane_progress()/drain()/destroy() or poll this lane.
 *
 * Faults and replacement: a lane whose CQ reports an error (an IBV_EVENT_CQ_ERR naming
 * one of its CQs, seen by the listener the lane keeps on its context set, or a failed
 * poll_cq) becomes FAULTED, with a device-scope cause (OTE_ERR_FENCED carrying the errno:
 * EIO for the event, the poll's errno otherwise). A faulted lane attaches no new QP
 * (ote_cq_lane_attach_qp answers the cause) and keeps polling what its CQs still give
 * (flush CQEs of its QPs moved to ERR), silently when the poll fails again. The owner of
 * its QPs fences and destroys them (their owed WRs end as synthesized flushes, qp/qp.h),
 * then calls ote_cq_lane_replace(): with no QP attached, the lane destroys its two CQs
 * and creates new ones of the same depths on the same completion channel, under its
 * poll lock, and is HEALTHY again. The lane object, its index, its namespaces (never
 * reused), its worker and its budget stay: the context's PD and MRs are not touched.
 * QPs created afterwards use the new CQs.
 *
 * Teardown: ote_cq_lane_destroy() refuses (OTE_ERR_BUSY) while QPs are attached or a
 * worker pool still polls the lane (remove it first). When a
 * native destroy fails (EBUSY), the lane keeps whatever it could not destroy, counts it
 * in its context (OTE_RETAINED_CQ / OTE_RETAINED_CHANNEL) and returns OTE_ERR_RETAINED;
 * the lane stays valid (it polls nothing any more) and a later destroy retries.
 */
#ifndef OTE_CQ_LANE_H
#define OTE_CQ_LANE_H

#include <stdint.h>

#include "base/status.h"
#include "base/time.h"
#include "context/context.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ote_cq_lane ote_cq_lane_t;

typedef enum { OTE_CQ_SEND = 0, OTE_CQ_RECV = 1 } ote_cq_dir_t;

/* WR id layout: high 24 bits namespace id (never 0), low 40 bits the record's own id. */
#define OTE_CQ_NS_SHIFT 40
#define OTE_CQ_LOCAL_MASK ((UINT64_C(1) << OTE_CQ_NS_SHIFT) - 1)
#define OTE_CQ_WR_ID(ns, local) \
    (((uint64_t)(ns) << OTE_CQ_NS_SHIFT) | ((uint64_t)(local)&OTE_CQ_LOCAL_MASK))
#define OTE_CQ_WR_NS(wr_id) ((uint32_t)((uint64_t)(wr_id) >> OTE_CQ_NS_SHIFT))
#define OTE_CQ_WR_LOCAL(wr_id) ((uint64_t)(wr_id)&OTE_CQ_LOCAL_MASK)

/* A record's completion callback. On an error CQE only wr_id, status, qp_num and
 * vendor_err are meaningful. */
typedef void (*ote_cq_record_fn)(void *arg, ote_cq_lane_t *lane, ote_cq_dir_t dir,
                                 const struct ibv_wc *wc);
/* A QP hook: returns 1 to forward the completion to its namespace owner, 0 when the
 * hook consumed it. */
typedef int (*ote_cq_qp_hook_fn)(void *arg, ote_cq_lane_t *lane, ote_cq_dir_t dir,
                                 const struct ibv_wc *wc);

/* Health of a lane (see "Faults and replacement" above). */
typedef enum { OTE_CQ_LANE_HEALTHY = 0, OTE_CQ_LANE_FAULTED = 1 } ote_cq_lane_state_t;

typedef struct ote_cq_lane_config {
    uint32_t index;  /* lane number in its context; worker (index % workers) polls it */
    int send_depth;  /* requested CQEs of the send CQ (> 0) */
    int recv_depth;  /* requested CQEs of the receive CQ (> 0) */
    int use_channel; /* create a completion channel, so idle workers sleep on it */
} ote_cq_lane_config_t;

typedef struct ote_cq_lane_stats {
    uint64_t completions;   /* CQEs polled */
    uint64_t errors;        /* CQEs with a status other than SUCCESS */
    uint64_t stray;         /* CQEs whose namespace had no record */
    uint64_t poll_failures; /* poll_cq calls that failed */
    uint64_t replacements;  /* times the lane's CQs were replaced after a fault */
} ote_cq_lane_stats_t;

ote_status_t ote_cq_lane_create(ote_context_t *ctx, const ote_cq_lane_config_t *cfg,
                                ote_cq_lane_t **lane_out);
/* See the header comment: OTE_OK frees the lane; OTE_ERR_BUSY / OTE_ERR_RETAINED keep it. */
ote_status_t ote_cq_lane_destroy(ote_cq_lane_t *lane);

ote_context_t *ote_cq_lane_context(const ote_cq_lane_t *lane);
uint32_t ote_cq_lane_index(const ote_cq_lane_t *lane);
/* The native CQs (a replacement changes them: a QP being created pins them instead). */
struct ibv_cq *ote_cq_lane_native_cq(const ote_cq_lane_t *lane, ote_cq_dir_t dir);
/* The current CQs pinned for a QP being created on them (its ibv_qp_init_attr): until
 * ote_cq_lane_unpin() a replacement is refused (OTE_ERR_BUSY), so they stay alive. The
 * fault's cause when the lane is FAULTED (nothing pinned then). cqs_out: send, recv. */
ote_status_t ote_cq_lane_pin(ote_cq_lane_t *lane, struct ibv_cq *cqs_out[2]);
void ote_cq_lane_unpin(ote_cq_lane_t *lane);
/* Actual capacity (CQEs) of a CQ. */
uint32_t ote_cq_lane_capacity(const ote_cq_lane_t *lane, ote_cq_dir_t dir);
/* The completion channel's fd, -1 without a channel. */
int ote_cq_lane_channel_fd(const ote_cq_lane_t *lane);

/* Namespaces. unregister: when it returns, the callback is not running (unless called
 * from that callback) and will not be called again. */
ote_status_t ote_cq_lane_register_ns(ote_cq_lane_t *lane, ote_cq_record_fn fn, void *arg,
                                     uint32_t *ns_out);
void ote_cq_lane_unregister_ns(ote_cq_lane_t *lane, uint32_t ns);
/* Namespace ns is shared by the lane's QPs (a shared receive queue, qp/srq.h): its
 * completions whose QP has no hook any more (destroyed with CQEs still queued) are
 * delivered to it too, not stray, so that its owner gets every WR back. */
void ote_cq_lane_share_ns(ote_cq_lane_t *lane, uint32_t ns);
/* QP hooks, keyed by QP number (one hook per QP number). detach: as unregister. */
ote_status_t ote_cq_lane_attach_qp(ote_cq_lane_t *lane, uint32_t qp_num, ote_cq_qp_hook_fn fn,
                                   void *arg);
void ote_cq_lane_detach_qp(ote_cq_lane_t *lane, uint32_t qp_num);
/* Hand a completion to its namespace owner (the lane does this after the hook; an owner
 * of WRs that can never complete natively uses it to deliver their synthesized end).
 * Takes the poll lock when called from outside a poll, so callbacks never overlap.
 * 1 when delivered, 0 when stray (counted). */
int ote_cq_lane_deliver(ote_cq_lane_t *lane, ote_cq_dir_t dir, const struct ibv_wc *wc);

/* Budget: OTE_ERR_AGAIN when n more CQEs could overrun the CQ. */
ote_status_t ote_cq_lane_reserve(ote_cq_lane_t *lane, ote_cq_dir_t dir, uint32_t n);
void ote_cq_lane_release(ote_cq_lane_t *lane, ote_cq_dir_t dir, uint32_t n);
uint32_t ote_cq_lane_outstanding(const ote_cq_lane_t *lane, ote_cq_dir_t dir);

/**
 * ote_cq_lane_poll() - poll both CQs once (up to a batch each) and dispatch.
 * @polled_out (optional): completions dispatched. OTE_ERR_BUSY when another thread is
 * polling the lane right now; a native poll failure is returned (and counted).
 */
ote_status_t ote_cq_lane_poll(ote_cq_lane_t *lane, int *polled_out);
/**
 * ote_cq_lane_progress() - make progress until pred(arg) is true or the deadline
 * passes (OTE_ERR_TIMEOUT): polls the lane itself when no other thread does, otherwise
 * waits for the poller's progress. pred runs without lane locks. OTE_OK also means
 * the completions that made pred true have been delivered: a poll under way in another
 * thread (a hook may settle a count before its callback runs) has finished its batch.
 */
ote_status_t ote_cq_lane_progress(ote_cq_lane_t *lane, int (*pred)(void *arg), void *arg,
                                  ote_deadline_t deadline);
/* Progress until no charge is outstanding on either CQ (OTE_ERR_TIMEOUT otherwise). */
ote_status_t ote_cq_lane_drain(ote_cq_lane_t *lane, ote_deadline_t deadline);

void ote_cq_lane_get_stats(const ote_cq_lane_t *lane, ote_cq_lane_stats_t *stats_out);

/* The lane's health; when FAULTED and cause_out is not NULL, *cause_out is the cause. */
ote_cq_lane_state_t ote_cq_lane_state(const ote_cq_lane_t *lane, ote_status_t *cause_out);
/* Mark the lane FAULTED with cause (a device-scope status; the first cause stays). */
void ote_cq_lane_fault(ote_cq_lane_t *lane, ote_status_t cause);
/**
 * ote_cq_lane_replace() - replace the CQs of a FAULTED lane (see above). OTE_OK when
 * the lane is HEALTHY afterwards (also when it was not faulted); OTE_ERR_BUSY while QPs
 * are still attached; OTE_ERR_RETAINED when an old CQ would not be destroyed (kept,
 * counted; a later call retries); a failed native create: its status (the lane stays
 * FAULTED, with no CQ; a later call retries). Never from a callback of this lane.
 */
ote_status_t ote_cq_lane_replace(ote_cq_lane_t *lane);
/**
 * ote_cq_lane_unbind() - for the reopen of the lane's context (context.h,
 * ote_context_reopen): a FAULTED lane with no QP attached and in no worker pool destroys
 * its CQs and its completion channel, so it holds nothing of the old native context; the
 * next ote_cq_lane_replace() makes a new channel (when the lane had one) and new CQs on
 * the context's current native context. OTE_ERR_STATE when the lane is healthy or
 * closing, OTE_ERR_BUSY while a QP is attached or a worker pool holds it (remove it
 * first: workers read the channel without the lane's locks), OTE_ERR_RETAINED when a
 * native destroy failed (kept, counted; a later call retries).
 */
ote_status_t ote_cq_lane_unbind(ote_cq_lane_t *lane);

#ifdef __cplusplus
}
#endif
#endif

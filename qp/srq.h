/*
 * qp/srq.h - a shared receive queue: the receive buffers of every QP of one CQ lane.
 *
 * One SRQ per (device context, CQ lane). It owns `slots` receive buffers of `size` bytes
 * in one registered MR, posts them all at create and reposts each after its completion
 * was handed up, so the number of QPs no longer multiplies receive buffers. A QP created
 * with ote_qp_config_t.srq (same lane) posts no receives of its own: its receives come
 * from the SRQ, its receive completions (on the lane's receive CQ, in the SRQ's WR id
 * namespace) are handed to that QP's on_recv by wc.qp_num, and ote_qp_rq_admit /
 * ote_qp_rq_unadmit / ote_qp_recv_credits on it act on the SRQ.
 *
 * Receive credits are exact per SRQ: ote_srq_admit reserves one posted slot for a
 * message to come (a grant receipt) before the peer may send it; OTE_ERR_AGAIN when every
 * posted slot is already reserved. So the reservations never exceed the posted slots and
 * no admitted message meets an empty SRQ (no RNR). A consumed slot counts again once
 * reposted; ote_srq_unadmit gives a reservation back once its message was consumed or
 * will never come. A QP destroyed with reservations gives them back.
 *
 * A completion of a slot is reposted while the SRQ is active, whatever its status: a
 * flushed SRQ slot only means that the QP which took it died (mlx5 may flush a WQE a QP
 * held when it entered ERR), the buffer is free. Nothing is reposted once destroy began.
 * Completions of a QP already destroyed still reach the SRQ (ote_cq_lane_share_ns): the
 * slot is reposted and counted as an orphan.
 *
 * The limit: at create the SRQ arms the native limit at low_water posted slots; when the
 * device reports IBV_EVENT_SRQ_LIMIT_REACHED (through the context set's async event
 * dispatch, ote_context_set_poll_events) a WARN names the SRQ's numbers, and the limit is
 * armed again once every slot is posted. Reposting after each completion normally keeps
 * the SRQ full: the event means receives are consumed faster than completions are
 * polled, or reposts fail.
 *
 * Destroy order: QPs first, then the SRQ (OTE_ERR_BUSY while a QP is attached). A failed
 * native destroy (SRQ or MR) keeps the SRQ object, its buffers and charges, counted as
 * retained in its context, and returns OTE_ERR_RETAINED: call destroy again later.
 *
 * Thread-safe. Completion handling runs in the lane's polling thread.
 */
#ifndef OTE_QP_SRQ_H
#define OTE_QP_SRQ_H

#include <stdint.h>

#include "base/status.h"
#include "cq/lane.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ote_srq ote_srq_t;

typedef struct ote_srq_config {
    uint32_t slots;     /* receive buffers (SRQ depth), within the device's max_srq_wr */
    uint32_t size;      /* bytes per buffer */
    uint32_t low_water; /* native limit armed at this many posted slots (0: none) */
    /* The PD of the SRQ and its MR; NULL: the context's. QPs on it use the same PD. */
    struct ibv_pd *pd;
} ote_srq_config_t;

typedef struct ote_srq_stats {
    uint32_t slots, posted;           /* buffers; posted now (the credits) */
    uint32_t admitted, peak_admitted; /* reservations now; the most at once */
    uint32_t attached;                /* QPs on it */
    uint64_t completions, errors;     /* receive CQEs: successful; any other status */
    uint64_t orphans;                 /* CQEs of QPs already gone (slot reposted) */
    uint64_t repost_failures;         /* slots a failed post left idle */
    uint64_t limit_events;            /* IBV_EVENT_SRQ_LIMIT_REACHED seen */
    int retained;                     /* a native destroy failed: object kept */
} ote_srq_stats_t;

/* Defaults: 256 slots of 4 KiB, low water a quarter of the slots, the context's PD. */
void ote_srq_config_default(ote_srq_config_t *cfg);

/* Create the SRQ on @lane (its context active or paused: an SRQ needs no port), register its buffers and post
 * them all. OTE_ERR_INVALID for 0 slots or size; the device's refusal as OTE_ERR_NATIVE. */
ote_status_t ote_srq_create(ote_cq_lane_t *lane, const ote_srq_config_t *cfg, ote_srq_t **srq_out);
/* See the header comment: OTE_OK frees it; OTE_ERR_BUSY / OTE_ERR_RETAINED keep it. */
ote_status_t ote_srq_destroy(ote_srq_t *srq);
/* For the reopen of the SRQ's context (context.h, ote_context_reopen): with no QP
 * attached, ote_srq_unbind destroys the native SRQ (its posted slots vanish, their
 * charges go back) and deregisters its buffers' MR, keeping the object, its buffers and
 * its namespace (OTE_ERR_BUSY while QPs are attached; OTE_ERR_RETAINED when a native
 * destroy failed: kept, counted, a later unbind retries); ote_srq_rebind then registers
 * the buffers on the context's current PD, creates the native SRQ, posts every slot and
 * arms the limit (OTE_ERR_STATE when not unbound or made with a PD of its own). */
ote_status_t ote_srq_unbind(ote_srq_t *srq);
ote_status_t ote_srq_rebind(ote_srq_t *srq);

/* Reserve one posted slot (fault point "qp.rq_admit", as for a QP's own queue). */
ote_status_t ote_srq_admit(ote_srq_t *srq);
void ote_srq_unadmit(ote_srq_t *srq);
/* Slots posted now. */
uint32_t ote_srq_credits(const ote_srq_t *srq);
uint32_t ote_srq_admitted(const ote_srq_t *srq);

ote_cq_lane_t *ote_srq_lane(const ote_srq_t *srq);
struct ibv_srq *ote_srq_native(const ote_srq_t *srq);
void ote_srq_get_stats(const ote_srq_t *srq, ote_srq_stats_t *stats_out);

#ifdef __cplusplus
}
#endif
#endif

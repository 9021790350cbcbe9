/*
 * engine/rdma/rdma_reopen.c - the reopen of a data device whose async event consumer was
 * lost (context/events.c: get_async_event failed; the context is OTE_CONTEXT_LOST).
 *
 * The loss fences the device: the monitor's route pass fences its QPs with the
 * context's status (OTE_ERR_FENCED, EIO), so their work ends with it, and nothing new is
 * admitted there. This pass, once per monitor round, brings the device back in three
 * steps, each retried by later rounds until it is done:
 *
 * 1. Unbind (RDMA_REOPEN_NONE -> UNBOUND), once the device's work has drained: both
 *    endpoint stores reclaimed to empty, no grant live. Then everything built on the old
 *    native context is destroyed: the grant manager's pooled windows, the pool chunks'
 *    MRs, the SRQs' natives, each lane's CQs and channel (the lane taken out of its
 *    worker first), and the registrations' MRs in it. Nothing is freed on a guess: what
 *    will not be destroyed stays retained and counted by its layer, and with it the old
 *    PD (context/reopen.c retires it: the engine's destroy answers OTE_ERR_RETAINED while
 *    it stays).
 * 2. Reopen (UNBOUND -> REBIND): ote_context_reopen opens the device again with a new PD;
 *    a failure leaves the device fenced (WARN from the context layer, counted here) and
 *    is retried after the context layer's backoff (100 ms doubled up to 5 s).
 * 3. Rebind (REBIND -> NONE): the lanes get a new channel and CQs and go back to their
 *    worker, the SRQs are made on the new PD, the registrations' MRs are registered
 *    again on it (a dma-buf registration is refused there, with a WARN naming it), and
 *    ote_context_resume admits work again; the device pass (rdma_monitor.c) puts it
 *    back in the selector, and QPs are built on the new natives on demand.
 *
 * The lane pass skips a LOST device (its lanes are unbound here, not replaced on the old
 * native context). Only the monitor thread runs this, so the steps need no lock of
 * their own: the layers they call are thread-safe.
 */
#include "base/log.h"
#include "context/buffers.h"
#include "endpoint/endpoint.h"
#include "engine/rdma/rdma_internal.h"
#include "engine/rdma/rdma_stage.h"
#include "qp/srq.h"

/* 1 when nothing of the device's work is left: its QPs reclaimed, no grant live. */
static int drained(rdma_nic_t *n) {
    ote_endpoint_store_t *stores[2] = {n->eps, n->deps};
    for (int k = 0; k < 2; k++) {
        size_t left = 0;
        if (stores[k] == NULL) continue;
        (void)ote_endpoint_store_reclaim(stores[k], ote_deadline_after(200 * OTE_NSEC_PER_MSEC),
                                         &left);
        if (left != 0) return 0;
    }
    return n->gm == NULL || ote_grant_mgr_tick(n->gm) == 0;
}

/* Step 1: what the device built on its old native context, destroyed. OTE_OK when done;
 * OTE_ERR_BUSY to try again next round. A retained owner does not stop it (it keeps the
 * old PD retained). */
static ote_status_t unbind(rdma_tp_t *tp, rdma_nic_t *n) {
    if (!drained(n)) return OTE_ERR_BUSY;
    if (n->gm != NULL && ote_grant_mgr_drop_windows(n->gm) == OTE_ERR_BUSY) return OTE_ERR_BUSY;
    (void)ote__rdma_stage_mrs_drop_nic(tp, n);
    for (uint32_t l = 0; l < n->nlanes; l++)
        if (n->srq[l] != NULL && ote_srq_unbind(n->srq[l]) == OTE_ERR_BUSY) return OTE_ERR_BUSY;
    ote_status_t cause = ote_context_check(n->ctx);
    for (uint32_t l = 0; l < n->nlanes; l++) {
        ote_cq_lane_t *lane = n->lanes[l];
        if (lane == NULL) continue;
        ote_cq_lane_fault(lane, cause); /* no QP attaches to it from now on */
        if (n->workers != NULL) (void)ote_cq_workers_remove(n->workers, lane);
        ote_status_t st = ote_cq_lane_unbind(lane);
        if (ote_status_code(st) == OTE_ERR_BUSY) {
            /* A QP still holds it: back to its worker, which polls its flushes. */
            if (n->workers != NULL) (void)ote_cq_workers_add(n->workers, lane);
            return OTE_ERR_BUSY;
        }
    }
    size_t mrs = tp->bm != NULL ? ote_buffer_manager_drop_context(tp->bm, n->ctx) : 0;
    OTE_INFO("rdma",
             "data device %s: its work drained after the lost event consumer: lanes, SRQs, "
             "windows and %zu registration MR(s) of the old native context destroyed; "
             "reopening",
             ote_context_name(n->ctx), mrs);
    return OTE_OK;
}

/* Step 3: lanes, SRQs and MRs made anew on the new natives, then the device resumed.
 * OTE_OK when done; otherwise the failure (retried next round). */
static ote_status_t rebind(rdma_tp_t *tp, rdma_nic_t *n) {
    for (uint32_t l = 0; l < n->nlanes; l++) {
        ote_cq_lane_t *lane = n->lanes[l];
        if (lane == NULL || ote_cq_lane_state(lane, NULL) == OTE_CQ_LANE_HEALTHY) continue;
        ote_status_t st = ote_cq_lane_replace(lane);
        if (st != OTE_OK) return st;
        if (n->workers != NULL) (void)ote_cq_workers_add(n->workers, lane);
    }
    for (uint32_t l = 0; l < n->nlanes; l++) {
        ote_status_t st = n->srq[l] != NULL ? ote_srq_rebind(n->srq[l]) : OTE_OK;
        if (st != OTE_OK && st != OTE_ERR_STATE) return st; /* STATE: bound already */
    }
    size_t mrs = 0;
    if (tp->bm != NULL) (void)ote_buffer_manager_republish(tp->bm, n->ctx, &mrs);
    ote_status_t st = ote_context_resume(n->ctx);
    if (st != OTE_OK) return st;
    /* A registration listed between the first republish and the resume (the context
     * still LOST then) gets its MR now (context/buffers.h). */
    if (tp->bm != NULL) (void)ote_buffer_manager_republish(tp->bm, n->ctx, NULL);
    /* Back in the selector now, not at the next round's device pass (which then counts
     * the change and logs it), so a request submitted after this is placed on it. */
    if (ote_context_check(n->ctx) == OTE_OK && tp->sel != NULL)
        (void)ote_selector_set_active(tp->sel, (int)n->index, 1);
    atomic_fetch_add(&tp->device_reopens, 1);
    OTE_INFO("rdma",
             "data device %s reopened after a lost event consumer: %u lane(s) and %zu "
             "registration MR(s) made anew; new work uses it again",
             ote_context_name(n->ctx), n->nlanes, mrs);
    return OTE_OK;
}

/* One round for a LOST device: as far through the steps as it gets. */
static void reopen_one(rdma_tp_t *tp, rdma_nic_t *n) {
    if (n->reopen == RDMA_REOPEN_NONE) {
        if (unbind(tp, n) != OTE_OK) return;
        n->reopen = RDMA_REOPEN_UNBOUND;
    }
    if (n->reopen == RDMA_REOPEN_UNBOUND) {
        ote_status_t st = ote_context_reopen(n->ctx);
        if (st == OTE_ERR_AGAIN || st == OTE_ERR_BUSY) return; /* the backoff runs */
        if (st != OTE_OK) {
            atomic_fetch_add(&tp->device_reopen_failures, 1);
            return; /* WARN by the context layer; retried after its backoff */
        }
        n->reopen = RDMA_REOPEN_REBIND;
    }
    ote_status_t st = rebind(tp, n);
    if (st == OTE_OK) {
        n->reopen = RDMA_REOPEN_NONE;
        n->rebind_failures = 0;
        return;
    }
    /* Retried every round: logged at the 1st, 2nd, 4th, 8th... failure in a row. */
    uint32_t f = ++n->rebind_failures;
    if ((f & (f - 1)) == 0)
        OTE_WARN("rdma",
                 "data device %s: rebuilding after its reopen failed (%s, %u time(s)); "
                 "retried",
                 ote_context_name(n->ctx), ote_status_str(st), f);
}

void ote__rdma_reopen_watch(rdma_tp_t *tp) {
    for (uint32_t i = 0; i < tp->nnics; i++) {
        rdma_nic_t *n = &tp->nics[i];
        if (ote_context_state(n->ctx) == OTE_CONTEXT_LOST) reopen_one(tp, n);
    }
}

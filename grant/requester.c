/*
 * grant/requester.c - requester grants: the request, the source's answer, the slices
 * (windowed through the QP's SQ) and the SEND_WITH_INV (or SEND_WITH_IMM) receipt.
 *
 * Locking: every function here except the two entry points runs with the grant's lane
 * lock held (grant_internal.h), and posts under it: the lane's own lock, never one that
 * another lane needs.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <string.h>

#include "base/alloc.h"
#include "base/hash.h"
#include "base/lock.h"
#include "base/log.h"
#include "grant/grant_internal.h"

void ote__grant_fail_requester(grant_t *g, ote_status_t st, defer_t *df) {
    if (g->failed == OTE_OK) g->failed = st;
    if (g->rstate != R_WAIT_ANSWER && !g->qp_returned) {
        /* The QP carried our WRs: fence and flush it, then let the slot be rebuilt. */
        (void)ote_qp_cancel(g->qp);
        ote__grant_give_back_qp(g, 1);
    }
    ote__grant_maybe_finish(g, df);
}

void ote__grant_post_inv(grant_t *g, defer_t *df) {
    ote_grant_mgr_t *m = g->m;
    struct ibv_send_wr wr;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = OTE_CQ_WR_ID(m->lanes[g->lane].ns, ((uint64_t)g->seq << 16) | IDX_INV);
    if (g->d.receipt_imm) {
        wr.opcode = IBV_WR_SEND_WITH_IMM; /* an MR: nothing the receipt can invalidate */
        wr.imm_data = htonl(g->rkey);
    } else {
        wr.opcode = IBV_WR_SEND_WITH_INV;
        wr.invalidate_rkey = g->rkey;
    }
    wr.num_sge = 0;
    ote_qp_post_result_t res;
    ote_status_t st = ote_qp_post_send(g->qp, &wr, g->d.deadline, &res);
    if (st == OTE_OK) {
        g->outstanding++;
        g->rstate = R_INVALIDATING;
        return;
    }
    if (ote_status_code(st) == OTE_ERR_AGAIN) {
        ote__grant_wait_add(&m->lanes[g->lane], g);
        return;
    }
    if (res.accepted > 0) g->outstanding += (uint32_t)res.accepted; /* unknown outcome */
    ote__grant_fail_requester(g, st, df);
}

/* Chain up to CHAIN slices from g->next into wrs/sges; returns how many. */
static uint32_t build_chain(grant_t *g, uint32_t ns, struct ibv_send_wr *wrs,
                            struct ibv_sge *sges) {
    uint32_t n = g->nslices - g->next < CHAIN ? g->nslices - g->next : CHAIN;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t i = g->next + k;
        uint64_t off;
        uint32_t len;
        ote_grant_slice_at(g->d.len, i, &off, &len);
        memset(&wrs[k], 0, sizeof(wrs[k]));
        sges[k].addr = (uintptr_t)(g->d.local + off);
        sges[k].length = len;
        sges[k].lkey = g->d.lkey;
        wrs[k].wr_id = OTE_CQ_WR_ID(ns, ((uint64_t)g->seq << 16) | i);
        wrs[k].sg_list = &sges[k];
        wrs[k].num_sge = 1;
        wrs[k].opcode = g->d.op == OTE_GRANT_WRITE ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
        wrs[k].wr.rdma.remote_addr = g->d.remote + off;
        wrs[k].wr.rdma.rkey = g->rkey;
        wrs[k].next = k + 1 < n ? &wrs[k + 1] : NULL;
    }
    return n;
}

void ote__grant_pump(grant_t *g, defer_t *df) {
    mlane_t *ml = &g->m->lanes[g->lane];
    if (g->rstate != R_POSTING || g->failed != OTE_OK) return;
    if (g->next < g->nslices && g->d.canceled != NULL && g->d.canceled(g->d.done_arg)) {
        /* Canceled: what is posted finishes, the rest never goes; the receipt follows. */
        g->nslices = g->next;
        g->cut = 1;
    }
    while (g->next < g->nslices) {
        struct ibv_send_wr wrs[CHAIN];
        struct ibv_sge sges[CHAIN];
        (void)build_chain(g, ml->ns, wrs, sges);
        ote_qp_post_result_t res;
        ote_status_t st = ote_qp_post_send(g->qp, wrs, g->d.deadline, &res);
        g->next += (uint32_t)res.accepted;
        g->outstanding += (uint32_t)res.accepted;
        ml->stats.slices_posted += res.accepted;
        if (st == OTE_OK) continue;
        if (ote_status_code(st) == OTE_ERR_AGAIN) {
            ote__grant_wait_add(ml, g);
            return;
        }
        if (ote_status_code(st) != OTE_ERR_FENCED && res.accepted > 0 && res.unposted != NULL) {
            /* Proven partial acceptance: the suffix was not posted; retry it once the SQ
             * drains (the accepted prefix completes on its own). */
            ml->stats.partial_posts++;
            ote__grant_wait_add(ml, g);
            return;
        }
        OTE_WARN_LIMITED("grant", "grant %u: posting slice %u of %u failed: %s", g->seq, g->next,
                         g->nslices, ote_status_str(st));
        ote__grant_fail_requester(g, st, df);
        return;
    }
    if (g->done_slices == g->nslices) ote__grant_post_inv(g, df);
}

void ote__grant_requester_cqe(grant_t *g, uint32_t idx, const struct ibv_wc *wc, defer_t *df) {
    mlane_t *ml = &g->m->lanes[g->lane];
    ote_status_t st = ote__grant_wc_status(wc);
    /* A flush of a QP this engine's device fenced (its lane failed, its route changed),
     * or of a QP on a lane that failed (its flush came through the lane's other CQ before
     * the QP was fenced): the work ends with that device-scope cause, not as a peer's
     * loss. */
    if (ote_status_code(st) == OTE_ERR_CANCELED) {
        ote_status_t cause = ote_qp_fence_cause(g->qp);
        if (cause == OTE_OK) (void)ote_cq_lane_state(ote_qp_lane(g->qp), &cause);
        if (cause != OTE_OK) st = cause;
    }
    if (idx == IDX_INV) {
        if (st == OTE_OK && g->failed == OTE_OK) g->rstate = R_ENDED;
        else ote__grant_fail_requester(g, st != OTE_OK ? st : g->failed, df);
        ote__grant_maybe_finish(g, df);
        return;
    }
    if (st == OTE_OK && idx < g->nslices) {
        g->done_slices++;
        ml->stats.slices_completed++;
        if (g->failed == OTE_OK && g->next == g->nslices && g->done_slices == g->nslices)
            ote__grant_post_inv(g, df);
    } else if (st != OTE_OK) {
        if (g->failed == OTE_OK)
            OTE_WARN_LIMITED("grant", "grant %u: slice %u ended %s: %s", g->seq, idx,
                             ote_verbs_wc_status_str(wc->status), ote_status_str(st));
        ote__grant_fail_requester(g, st, df);
    }
    ote__grant_maybe_finish(g, df);
}

ote_status_t ote_grant_start(ote_grant_mgr_t *m, const ote_grant_desc_t *d,
                             const ote_grant_ctl_t *ctl) {
    if (m == NULL || d == NULL || ctl == NULL || ctl->request == NULL || d->qp == NULL ||
        d->ep == NULL || d->len == 0 || d->len > OTE_GRANT_MAX_LEN || d->local == NULL)
        return OTE_ERR_INVALID;
    ote_cq_lane_t *lane = ote_qp_lane(d->qp);
    uint32_t li = 0;
    while (li < m->nlanes && m->lanes[li].lane != lane) li++;
    if (li == m->nlanes) return OTE_ERR_INVALID;
    ote_status_t st = ote_context_check(m->ctx);
    if (st != OTE_OK) return st;
    grant_t *g = ote_calloc(1, sizeof(*g));
    if (g == NULL) return OTE_ERR_NOMEM;
    g->m = m;
    g->d = *d;
    g->lane = li;
    g->ep = d->ep;
    g->slot = d->slot;
    g->qp = d->qp;
    g->qp_num = ote_qp_num(d->qp);
    g->deadline = d->deadline;
    g->nslices = ote_grant_slice_count(d->len);
    g->rstate = R_WAIT_ANSWER;
    /* Read before the record is findable (its answer may come before request returns). */
    uint32_t remote_qpn = ote_endpoint_remote_qpn(d->ep, d->slot);
    g->remote_qpn = remote_qpn;
    mlane_t *ml = &m->lanes[li];
    ote_mutex_lock(&ml->mu);
    st = ote__grant_index(m, ml, g);
    if (st != OTE_OK) {
        ote_mutex_unlock(&ml->mu);
        ote_free(g);
        return st;
    }
    ml->stats.started++;
    ml->stats.live_requester++;
    uint32_t seq = g->seq;
    g->requesting = 1; /* a tick leaves it alone until request() returned */
    ote_mutex_unlock(&ml->mu);

    /* The answer may arrive before request() returns: the record is already findable (and
     * may be ended and freed by then: looked up again). */
    st = ctl->request(ctl->arg, seq, d->slot, remote_qpn, d->op, d->remote, d->len);
    g = ote__grant_lock_find(m, 0, seq, &ml);
    if (g == NULL) return OTE_OK; /* already ended by its answer (done ran: it had the borrow) */
    g->requesting = 0;
    if (st != OTE_OK && g->rstate == R_WAIT_ANSWER) {
        /* Nothing was sent: withdraw the record; the borrow stays the caller's. */
        ote__grant_unindex(m, ml, g);
        ml->stats.started--;
        ml->stats.live_requester--;
        ote_mutex_unlock(&ml->mu);
        ote_free(g);
        return st;
    }
    ote_mutex_unlock(&ml->mu);
    return OTE_OK; /* sent */
}

ote_status_t ote_grant_on_answer(ote_grant_mgr_t *m, uint64_t grant_id, ote_status_t st,
                                 uint32_t rkey) {
    return ote_grant_on_answer_at(m, grant_id, st, rkey, 0, 0);
}

/* A refused answer (lane lock held): retire the QP when the source's end may be broken,
 * fail the grant. Logged at DEBUG only: whether a refusal is news (an access refused) or
 * the protocol at work (a redirect, a busy source asked again) is the caller's to say. */
static void answer_refused(grant_t *g, ote_status_t st, defer_t *df) {
    OTE_DEBUG("grant", "grant %u ([0x%llx, +%llu) %s) refused by the source: %s", g->seq,
              (unsigned long long)g->d.remote, (unsigned long long)g->d.len,
              g->d.op == OTE_GRANT_WRITE ? "WRITE" : "READ", ote_status_str(st));
    /* The source could not give access (its bind failed: its QP went to ERR), failed
     * otherwise, or the peer was lost: the source's end of the QP may be broken, so
     * retire ours and let the slot be rebuilt. A refusal of the range itself (ACCESS,
     * ...) leaves the connection as it was. STATE: the source has no such connection (a
     * cache miss): ours is stale too. */
    int code = ote_status_code(st);
    if (code == OTE_ERR_REMOTE_ACCESS || code == OTE_ERR_REMOTE || code == OTE_ERR_PEER_LOST ||
        code == OTE_ERR_STATE)
        ote__grant_give_back_qp(g, 1);
    ote__grant_fail_requester(g, st, df);
}

ote_status_t ote_grant_on_answer_at(ote_grant_mgr_t *m, uint64_t grant_id, ote_status_t st,
                                    uint32_t rkey, int rebase, uint64_t remote) {
    defer_t df = {0};
    mlane_t *ml = NULL;
    grant_t *g = grant_id <= SEQ_MASK ? ote__grant_lock_find(m, 0, (uint32_t)grant_id, &ml) : NULL;
    if (g == NULL || g->source || g->rstate != R_WAIT_ANSWER || g->failed != OTE_OK) {
        if (g != NULL) {
            ml->stats.stale_receipts++;
            ote_mutex_unlock(&ml->mu);
        } else {
            ote_mutex_lock(&m->mu);
            m->stats.stale_receipts++;
            ote_mutex_unlock(&m->mu);
        }
        OTE_DEBUG("grant", "answer for grant %llu that no longer waits: ignored",
                  (unsigned long long)grant_id);
        return OTE_ERR_NOT_FOUND;
    }
    if (st != OTE_OK) {
        answer_refused(g, st, &df);
    } else {
        if (rebase) g->d.remote = remote; /* the window covers a staged copy there */
        g->rkey = rkey;
        g->answered = 1;
        g->rstate = R_POSTING;
        ote__grant_pump(g, &df);
    }
    ote_mutex_unlock(&ml->mu);
    ote__grant_defer_run(m, &df);
    return OTE_OK;
}

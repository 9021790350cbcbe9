/*
 * qp/receive_queue.c - the receive queue: QP-owned buffers, their MR, and credits.
 *
 * Slot i's WR id is i. A slot is charged (one receive credit, one receive-CQ charge on
 * the lane) from its post until its CQE, or until the provider is proven to have dropped
 * it (modify to RESET, native destruction). Buffers and MR live as long as the QP.
 */
#include <errno.h>
#include <string.h>

#include "base/alloc.h"
#include "base/fault.h"
#include "base/log.h"
#include "context/context.h"
#include "qp/qp_internal.h"

ote_status_t ote__rq_init(ote_qp_t *qp) {
    uint32_t n = qp->cfg.recv_slots;
    if (n == 0) return OTE_OK;
    size_t bytes = (size_t)n * qp->cfg.recv_size;
    qp->rq_posted = ote_calloc(n, 1);
    qp->rq_buf = ote_aligned_alloc(64, bytes);
    if (qp->rq_posted == NULL || qp->rq_buf == NULL) {
        ote_free(qp->rq_posted);
        ote_aligned_free(qp->rq_buf);
        qp->rq_posted = NULL;
        qp->rq_buf = NULL;
        return OTE_ERR_NOMEM;
    }
    memset(qp->rq_buf, 0, bytes);
    struct ibv_pd *pd = qp->cfg.pd != NULL ? qp->cfg.pd : ote_context_pd(qp->ctx);
    int err = qp->v->ops->reg_mr(qp->v, pd, qp->rq_buf, bytes, IBV_ACCESS_LOCAL_WRITE, &qp->rq_mr);
    if (err != 0) {
        OTE_ERROR("qp", "%s: reg_mr of %u receive buffers failed: errno %d",
                  ote_context_name(qp->ctx), n, err);
        ote_free(qp->rq_posted);
        ote_aligned_free(qp->rq_buf);
        qp->rq_posted = NULL;
        qp->rq_buf = NULL;
        return ote_status_make(OTE_ERR_NATIVE, err);
    }
    return OTE_OK;
}

ote_status_t ote__rq_fini(ote_qp_t *qp) {
    if (qp->rq_mr != NULL) {
        int err = qp->v->ops->dereg_mr(qp->v, qp->rq_mr);
        if (err != 0) {
            if (!qp->retained_mr) {
                qp->retained_mr = 1;
                ote_context_retained_add(qp->ctx, OTE_RETAINED_MR, 1);
            }
            OTE_WARN("qp", "QP %u: dereg of the receive MR failed: errno %d; buffers retained",
                     qp->qp_num, err);
            return ote_status_make(OTE_ERR_RETAINED, err);
        }
        qp->rq_mr = NULL;
        if (qp->retained_mr) {
            qp->retained_mr = 0;
            ote_context_retained_add(qp->ctx, OTE_RETAINED_MR, -1);
        }
    }
    ote_free(qp->rq_posted);
    ote_aligned_free(qp->rq_buf);
    qp->rq_posted = NULL;
    qp->rq_buf = NULL;
    return OTE_OK;
}

/* Post slot `i` alone; caller holds mu. */
static int post_slot(ote_qp_t *qp, uint32_t i, struct ibv_recv_wr *wr, struct ibv_sge *sge) {
    memset(wr, 0, sizeof(*wr));
    memset(sge, 0, sizeof(*sge));
    sge->addr = (uintptr_t)(qp->rq_buf + (size_t)i * qp->cfg.recv_size);
    sge->length = qp->cfg.recv_size;
    sge->lkey = qp->rq_mr->lkey;
    wr->wr_id = i;
    wr->sg_list = sge;
    wr->num_sge = 1;
    return 0;
}

ote_status_t ote__rq_post_idle(ote_qp_t *qp) {
    uint32_t n = qp->cfg.recv_slots;
    if (n == 0) return OTE_OK;
    struct ibv_recv_wr *wrs = ote_calloc(n, sizeof(*wrs));
    struct ibv_sge *sges = ote_calloc(n, sizeof(*sges));
    if (wrs == NULL || sges == NULL) {
        ote_free(wrs);
        ote_free(sges);
        return OTE_ERR_NOMEM;
    }
    ote_mutex_lock(&qp->mu);
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (qp->rq_posted[i]) continue;
        post_slot(qp, i, &wrs[k], &sges[k]);
        if (k > 0) wrs[k - 1].next = &wrs[k];
        k++;
    }
    ote_status_t st = OTE_OK;
    if (k > 0) st = ote_cq_lane_reserve(qp->lane, OTE_CQ_RECV, k);
    if (k > 0 && st == OTE_OK) {
        struct ibv_recv_wr *bad = NULL;
        int err = qp->v->ops->post_recv(qp->v, qp->qp, wrs, &bad);
        uint32_t posted = k;
        if (err != 0) {
            /* Slots before bad_wr are posted; an unknown outcome keeps every charge. */
            uint32_t j = 0;
            while (j < k && &wrs[j] != bad) j++;
            posted = j < k ? j : k;
            st = ote_verbs_status(err);
            OTE_WARN("qp", "QP %u: post_recv posted %u of %u receive slots: errno %d", qp->qp_num,
                     posted, k, err);
        }
        for (uint32_t j = 0; j < posted; j++) qp->rq_posted[wrs[j].wr_id] = 1;
        qp->rq_count += posted;
        if (posted < k) {
            ote_mutex_unlock(&qp->mu);
            ote_cq_lane_release(qp->lane, OTE_CQ_RECV, k - posted);
            ote_free(wrs);
            ote_free(sges);
            return st;
        }
    }
    ote_mutex_unlock(&qp->mu);
    ote_free(wrs);
    ote_free(sges);
    return st;
}

void ote__rq_complete(ote_qp_t *qp, const struct ibv_wc *wc) {
    uint64_t i = wc->wr_id;
    ote_mutex_lock(&qp->mu);
    if (i >= qp->cfg.recv_slots || !qp->rq_posted[i]) {
        qp->unknown_cqes++;
        ote_mutex_unlock(&qp->mu);
        OTE_WARN("qp", "QP %u: receive CQE for slot 0x%llx that is not posted: dropped", qp->qp_num,
                 (unsigned long long)i);
        return;
    }
    qp->rq_posted[i] = 0;
    qp->rq_count--;
    int ok = wc->status == IBV_WC_SUCCESS;
    if (ok) {
        qp->recv_completions++;
    } else {
        qp->recv_errors++;
        qp->state = IBV_QPS_ERR;
        qp->fenced = 1;
    }
    ote_mutex_unlock(&qp->mu);
    ote_cq_lane_release(qp->lane, OTE_CQ_RECV, 1);
    if (!ok) return;
    /* The buffer stays QP-owned: the callback reads it, then the slot is posted again. */
    if (qp->cfg.on_recv != NULL)
        qp->cfg.on_recv(qp->cfg.recv_arg, qp, wc, qp->rq_buf + (size_t)i * qp->cfg.recv_size);
    ote_mutex_lock(&qp->mu);
    int repost =
        !qp->closing && !qp->rq_posted[i] && (qp->state == IBV_QPS_RTS || qp->state == IBV_QPS_RTR);
    if (repost && ote_cq_lane_reserve(qp->lane, OTE_CQ_RECV, 1) == OTE_OK) {
        struct ibv_recv_wr wr, *bad = NULL;
        struct ibv_sge sge;
        post_slot(qp, (uint32_t)i, &wr, &sge);
        int err = qp->v->ops->post_recv(qp->v, qp->qp, &wr, &bad);
        if (err == 0) {
            qp->rq_posted[i] = 1;
            qp->rq_count++;
        } else {
            OTE_WARN("qp", "QP %u: repost of receive slot %llu failed: errno %d", qp->qp_num,
                     (unsigned long long)i, err);
        }
        ote_mutex_unlock(&qp->mu);
        if (err != 0) ote_cq_lane_release(qp->lane, OTE_CQ_RECV, 1);
        return;
    }
    ote_mutex_unlock(&qp->mu);
}

void ote__rq_forget_posted(ote_qp_t *qp) {
    ote_mutex_lock(&qp->mu);
    uint32_t n = qp->rq_count;
    for (uint32_t i = 0; i < qp->cfg.recv_slots; i++) qp->rq_posted[i] = 0;
    qp->rq_count = 0;
    ote_mutex_unlock(&qp->mu);
    if (n > 0) ote_cq_lane_release(qp->lane, OTE_CQ_RECV, n);
}

void ote__rq_srq_recv(ote_qp_t *qp, const struct ibv_wc *wc, const void *buf) {
    int ok = wc->status == IBV_WC_SUCCESS;
    ote_mutex_lock(&qp->mu);
    if (ok) {
        qp->recv_completions++;
    } else {
        qp->recv_errors++;
        qp->state = IBV_QPS_ERR;
        qp->fenced = 1;
    }
    ote_mutex_unlock(&qp->mu);
    /* The buffer stays the SRQ's: the callback reads it, then the SRQ reposts it. */
    if (ok && qp->cfg.on_recv != NULL) qp->cfg.on_recv(qp->cfg.recv_arg, qp, wc, buf);
}

uint32_t ote_qp_recv_credits(const ote_qp_t *qp) {
    if (qp->cfg.srq != NULL) return ote_srq_credits(qp->cfg.srq);
    ote_qp_t *q = (ote_qp_t *)qp;
    ote_mutex_lock(&q->mu);
    uint32_t n = q->rq_count;
    ote_mutex_unlock(&q->mu);
    return n;
}

ote_status_t ote_qp_rq_admit(ote_qp_t *qp) {
    ote_status_t st = OTE_OK;
    if (ote_fault_hit("qp.rq_admit", &st)) return st;
    ote_mutex_lock(&qp->mu);
    if (qp->cfg.srq != NULL) { /* a slot of the SRQ, for a message to this QP */
        int live = !qp->closing && (qp->state == IBV_QPS_RTS || qp->state == IBV_QPS_RTR);
        st = live ? ote__srq_admit(qp->cfg.srq) : OTE_ERR_AGAIN;
        if (st == OTE_OK) qp->rq_admitted++;
    } else if (qp->rq_admitted < qp->rq_count) {
        qp->rq_admitted++;
    } else {
        st = OTE_ERR_AGAIN;
    }
    ote_mutex_unlock(&qp->mu);
    return st;
}

void ote_qp_rq_unadmit(ote_qp_t *qp) {
    ote_mutex_lock(&qp->mu);
    int given = qp->rq_admitted > 0;
    if (given) qp->rq_admitted--;
    if (given && qp->cfg.srq != NULL) ote_srq_unadmit(qp->cfg.srq);
    ote_mutex_unlock(&qp->mu);
}

uint32_t ote_qp_rq_admitted(const ote_qp_t *qp) {
    ote_qp_t *q = (ote_qp_t *)qp;
    ote_mutex_lock(&q->mu);
    uint32_t n = q->rq_admitted;
    ote_mutex_unlock(&q->mu);
    return n;
}

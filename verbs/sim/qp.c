/*
 * verbs/sim/qp.c - RC queue pairs of the sim: creation with caps, the state machine
 * with the attribute-mask rules of the kernel's ib_modify_qp_is_ok, posting rules per
 * state, in-order completion of the send queue and the flush on entering ERR.
 */
#include <errno.h>
#include <string.h>

#include "verbs/sim/sim_internal.h"

uint32_t ote__sim_mtu_bytes(enum ibv_mtu m) {
    switch (m) {
        case IBV_MTU_256: return 256;
        case IBV_MTU_512: return 512;
        case IBV_MTU_1024: return 1024;
        case IBV_MTU_2048: return 2048;
        case IBV_MTU_4096: return 4096;
        default: return 1024;
    }
}

uint64_t ote__sim_retry_bound_ns(sim_qp_t *qp, bool lost) {
    uint64_t cap = (uint64_t)qp->p->cfg.retry_cap_ms * OTE_NSEC_PER_MSEC;
    uint64_t b;
    if (qp->attr.timeout == 0) {
        b = cap; /* 0 = infinite ACK timeout: the sim still gives up at the cap */
    } else {
        /* 4.096 us * 2^timeout per try, retry_cnt retransmissions after the first. */
        uint64_t t = 4096ull << qp->attr.timeout;
        b = t * (uint64_t)(qp->attr.retry_cnt + 1);
    }
    if (!lost && b < OTE_NSEC_PER_SEC) b = OTE_NSEC_PER_SEC; /* a live peer gets at least 1 s */
    return b < cap ? b : cap;
}

static sim_swr_t *sq_slot(sim_qp_t *qp, uint64_t seq) { return &qp->sq[seq % qp->max_send_wr]; }
static sim_rwr_t *rq_slot(sim_qp_t *qp, uint64_t seq) { return &qp->rq[seq % qp->max_recv_wr]; }

static enum ibv_wc_opcode wc_opcode(enum ibv_wr_opcode op) {
    switch (op) {
        case IBV_WR_RDMA_WRITE:
        case IBV_WR_RDMA_WRITE_WITH_IMM: return IBV_WC_RDMA_WRITE;
        case IBV_WR_RDMA_READ: return IBV_WC_RDMA_READ;
        case IBV_WR_BIND_MW: return IBV_WC_BIND_MW;
        case IBV_WR_LOCAL_INV: return IBV_WC_LOCAL_INV;
        default: return IBV_WC_SEND;
    }
}

void ote__sim_qp_complete(sim_qp_t *qp) {
    while (qp->sq_head < qp->sq_next) {
        sim_swr_t *e = sq_slot(qp, qp->sq_head);
        if (e->state != SWR_DONE) break;
        bool err = e->status != IBV_WC_SUCCESS;
        if (e->signaled || err) {
            struct ibv_wc wc;
            memset(&wc, 0, sizeof(wc));
            wc.wr_id = e->wr_id;
            wc.status = e->status;
            wc.opcode = wc_opcode(e->op);
            wc.byte_len = e->byte_len;
            wc.qp_num = qp->ibqp.qp_num;
            wc.src_qp = qp->attr.dest_qp_num;
            if (err) wc.vendor_err = 0x5e;
            ote__sim_cq_push(qp->scq, &wc, qp, qp->sq_head, false);
        }
        qp->sq_head++;
        if (err && qp->state != IBV_QPS_ERR) {
            ote__sim_qp_to_err(qp);
            return;
        }
    }
    if (qp->state == IBV_QPS_SQD && qp->sqd_notify_pending && qp->sq_head == qp->sq_next) {
        qp->sqd_notify_pending = false;
        struct ibv_async_event ev;
        memset(&ev, 0, sizeof(ev));
        ev.event_type = IBV_EVENT_SQ_DRAINED;
        ev.element.qp = &qp->ibqp;
        ote__sim_async_push(qp->ctx, &ev);
    }
}

void ote__sim_recv_error_wc(const sim_qp_t *qp, uint64_t wr_id, enum ibv_wc_status st,
                            struct ibv_wc *wc) {
    memset(wc, 0, sizeof(*wc));
    wc->wr_id = wr_id;
    wc->status = st;
    wc->opcode = IBV_WC_RECV;
    wc->qp_num = qp->ibqp.qp_num;
    wc->src_qp = qp->attr.dest_qp_num;
    wc->vendor_err = 0x5e;
}

static void rq_flush(sim_qp_t *qp) {
    while (qp->rq_head < qp->rq_tail) {
        sim_rwr_t *r = rq_slot(qp, qp->rq_head);
        struct ibv_wc wc;
        ote__sim_recv_error_wc(qp, r->wr_id, IBV_WC_WR_FLUSH_ERR, &wc);
        qp->rq_head++;
        ote__sim_cq_push(qp->rcq, &wc, NULL, 0, false);
    }
}

void ote__sim_rq_complete(sim_qp_t *qp, const struct ibv_wc *wc, bool solicited) {
    qp->rq_head++;
    ote__sim_cq_push(qp->rcq, wc, NULL, 0, solicited);
    if (wc->status != IBV_WC_SUCCESS && qp->state != IBV_QPS_ERR) ote__sim_qp_to_err(qp);
}

void ote__sim_qp_to_err(sim_qp_t *qp) {
    qp->state = IBV_QPS_ERR;
    qp->epoch++;
    qp->halted = false;
    qp->rnr_until_ns = 0;
    ote__sim_qp_detach(qp, false);
    for (uint64_t s = qp->sq_head; s < qp->sq_tail; s++) {
        sim_swr_t *e = sq_slot(qp, s);
        if (e->state != SWR_DONE) {
            e->state = SWR_DONE;
            e->status = IBV_WC_WR_FLUSH_ERR;
        }
    }
    qp->sq_next = qp->sq_tail;
    qp->reads_out = 0;
    ote__sim_qp_complete(qp);
    rq_flush(qp);
    if (qp->srq) ote__sim_srq_qp_err(qp);
}

void ote__sim_qp_fatal(sim_qp_t *qp, enum ibv_event_type type) {
    struct ibv_async_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.event_type = type;
    ev.element.qp = &qp->ibqp;
    ote__sim_async_push(qp->ctx, &ev);
    if (qp->state != IBV_QPS_ERR && qp->state != IBV_QPS_RESET) ote__sim_qp_to_err(qp);
}

/* ---- create / destroy ---- */

int ote__sim_create_qp(ote_verbs_t *v, struct ibv_pd *ibpd, struct ibv_qp_init_attr *ia,
                       struct ibv_qp **qp_out) {
    if (!ibpd || !ia || !qp_out) return EINVAL;
    if (ia->qp_type != IBV_QPT_RC) return EOPNOTSUPP; /* the sim models RC only */
    if (ia->srq && ia->srq->context != ibpd->context) return EINVAL;
    if (!ia->send_cq || !ia->recv_cq) return EINVAL;
    if (ia->send_cq->context != ibpd->context || ia->recv_cq->context != ibpd->context)
        return EINVAL;
    struct ibv_qp_cap c = ia->cap;
    if (ia->srq) c.max_recv_wr = c.max_recv_sge = 0; /* ignored: receives come from the SRQ */
    const sim_profile_t *pr = to_sim_pd(ibpd)->ctx->dev->profile; /* the device's limits */
    if (c.max_send_wr > pr->max_qp_wr || c.max_recv_wr > pr->max_qp_wr ||
        c.max_send_sge > pr->max_sge || c.max_recv_sge > pr->max_sge ||
        c.max_inline_data > pr->max_inline)
        return EINVAL;
    sim_prov_t *p = to_sim_prov(v);
    sim_qp_t *qp = ote_calloc(1, sizeof(*qp));
    if (!qp) return ENOMEM;
    qp->max_send_wr = c.max_send_wr ? c.max_send_wr : 1;
    qp->max_recv_wr = c.max_recv_wr ? c.max_recv_wr : 1;
    qp->max_send_sge = c.max_send_sge ? c.max_send_sge : 1;
    qp->max_recv_sge = c.max_recv_sge ? c.max_recv_sge : 1;
    qp->max_inline = c.max_inline_data;
    qp->sq = ote_calloc(qp->max_send_wr, sizeof(*qp->sq));
    qp->rq = ote_calloc(qp->max_recv_wr, sizeof(*qp->rq));
    struct ibv_sge *ssge = ote_calloc((size_t)qp->max_send_wr * qp->max_send_sge, sizeof(*ssge));
    struct ibv_sge *rsge = ote_calloc((size_t)qp->max_recv_wr * qp->max_recv_sge, sizeof(*rsge));
    uint8_t *inl = qp->max_inline ? ote_malloc((size_t)qp->max_send_wr * qp->max_inline) : NULL;
    if (!qp->sq || !qp->rq || !ssge || !rsge || (qp->max_inline && !inl)) {
        ote_free(qp->sq);
        ote_free(qp->rq);
        ote_free(ssge);
        ote_free(rsge);
        ote_free(inl);
        ote_free(qp);
        return ENOMEM;
    }
    for (uint32_t i = 0; i < qp->max_send_wr; i++) {
        qp->sq[i].sge = ssge + (size_t)i * qp->max_send_sge;
        qp->sq[i].inl = inl ? inl + (size_t)i * qp->max_inline : NULL;
    }
    for (uint32_t i = 0; i < qp->max_recv_wr; i++)
        qp->rq[i].sge = rsge + (size_t)i * qp->max_recv_sge;
    /* The caps reported are what the queues hold (>= requested). */
    ia->cap.max_send_wr = c.max_send_wr;
    ia->cap.max_recv_wr = c.max_recv_wr;
    ia->cap.max_send_sge = c.max_send_sge;
    ia->cap.max_recv_sge = c.max_recv_sge;
    ia->cap.max_inline_data = c.max_inline_data;
    qp->p = p;
    qp->pd = to_sim_pd(ibpd);
    qp->ctx = qp->pd->ctx;
    qp->scq = to_sim_cq(ia->send_cq);
    qp->rcq = to_sim_cq(ia->recv_cq);
    qp->init = *ia;
    qp->sq_sig_all = ia->sq_sig_all != 0;
    qp->state = IBV_QPS_RESET;
    qp->ibqp.context = ibpd->context;
    qp->ibqp.qp_context = ia->qp_context;
    qp->ibqp.pd = ibpd;
    qp->ibqp.send_cq = ia->send_cq;
    qp->ibqp.recv_cq = ia->recv_cq;
    qp->ibqp.qp_type = IBV_QPT_RC;
    qp->ibqp.state = IBV_QPS_RESET;
    qp->attr.port_num = 1;
    qp->attr.path_mtu = IBV_MTU_1024;
    ote_mutex_lock(&p->mu);
    /* per-instance QP numbers; a zero-WR queue keeps one ring slot but refuses posts */
    qp->ibqp.qp_num = (p->next_qpn++) & 0xffffff;
    qp->ibqp.handle = qp->ibqp.qp_num;
    ote_status_t st;
    OTE_HASH_ADD(hh, p->qps, ibqp.qp_num, sizeof(uint32_t), qp, st);
    if (st != OTE_OK) {
        ote_mutex_unlock(&p->mu);
        ote_free(ssge);
        ote_free(rsge);
        ote_free(inl);
        ote_free(qp->sq);
        ote_free(qp->rq);
        ote_free(qp);
        return ENOMEM;
    }
    DL_APPEND2(p->qp_list, qp, prev, next);
    qp->pd->children++;
    qp->srq = ia->srq ? to_sim_srq(ia->srq) : NULL;
    if (qp->srq) qp->srq->nqp++;
    qp->scq->nqp++;
    qp->rcq->nqp++;
    ote_mutex_unlock(&p->mu);
    *qp_out = &qp->ibqp;
    return 0;
}

int ote__sim_destroy_qp(ote_verbs_t *v, struct ibv_qp *ibqp) {
    if (!ibqp) return EINVAL;
    sim_prov_t *p = to_sim_prov(v);
    sim_qp_t *qp = to_sim_qp(ibqp);
    ote_mutex_lock(&p->mu);
    if (!ote__sim_wait_acked(p, &qp->async_delivered, &qp->async_acked)) {
        ote_mutex_unlock(&p->mu);
        return EBUSY; /* rdma-core blocks until the events are acked */
    }
    sim_aev_t *e, *tmp;
    DL_FOREACH_SAFE(qp->ctx->aq, e, tmp) {
        if (e->ev.element.qp == ibqp && e->ev.event_type != IBV_EVENT_CQ_ERR &&
            e->ev.event_type != IBV_EVENT_PORT_ACTIVE && e->ev.event_type != IBV_EVENT_PORT_ERR &&
            e->ev.event_type != IBV_EVENT_GID_CHANGE &&
            e->ev.event_type != IBV_EVENT_DEVICE_FATAL &&
            e->ev.event_type != IBV_EVENT_LID_CHANGE && e->ev.event_type != IBV_EVENT_PKEY_CHANGE &&
            e->ev.event_type != IBV_EVENT_SM_CHANGE &&
            e->ev.event_type != IBV_EVENT_CLIENT_REREGISTER) {
            DL_DELETE(qp->ctx->aq, e);
            ote_free(e);
        }
    }
    if (!qp->ctx->aq) ote__sim_efd_set(qp->ctx->efd, &qp->ctx->efd_level, false);
    ote__sim_qp_detach(qp, true);
    HASH_DEL(p->qps, qp);
    DL_DELETE2(p->qp_list, qp, prev, next);
    for (uint32_t i = 1; i <= p->nkeys; i++) {
        if (p->keys[i].kind == SIM_KEY_MW) {
            sim_mw_t *mw = p->keys[i].obj;
            if (mw->qp == qp) mw->qp = NULL;
        }
    }
    /* unpolled CQEs stay (as rxe) but no longer free slots of this QP */
    ote_mutex_lock(&qp->scq->mu);
    for (int i = 0; i < qp->scq->count; i++) {
        sim_cqe_t *c = &qp->scq->ring[(qp->scq->head + i) % qp->scq->cap];
        if (c->credit_qp == qp) c->credit_qp = NULL;
    }
    ote_mutex_unlock(&qp->scq->mu);
    qp->pd->children--;
    if (qp->srq) qp->srq->nqp--; /* its connections (and held SRQ WQEs) are gone above */
    qp->scq->nqp--;
    qp->rcq->nqp--;
    ote_mutex_unlock(&p->mu);
    ote_free(qp->sq[0].sge);
    ote_free(qp->sq[0].inl);
    ote_free(qp->rq[0].sge);
    ote_free(qp->sq);
    ote_free(qp->rq);
    ote_free(qp);
    return 0;
}

/* ---- modify / query ---- */

#define M(x) IBV_QP_##x
static const int k_rtr_rts_opt =
    M(CUR_STATE) | M(ALT_PATH) | M(ACCESS_FLAGS) | M(MIN_RNR_TIMER) | M(PATH_MIG_STATE);

static bool transition_masks(enum ibv_qp_state cur, enum ibv_qp_state next, int *req, int *opt) {
    *req = 0;
    *opt = 0;
    if (next == IBV_QPS_RESET || next == IBV_QPS_ERR) return true;
    switch (cur) {
        case IBV_QPS_RESET:
            if (next == IBV_QPS_INIT) {
                *req = M(PKEY_INDEX) | M(PORT) | M(ACCESS_FLAGS);
                return true;
            }
            return false;
        case IBV_QPS_INIT:
            if (next == IBV_QPS_INIT) {
                *opt = M(PKEY_INDEX) | M(PORT) | M(ACCESS_FLAGS);
                return true;
            }
            if (next == IBV_QPS_RTR) {
                *req = M(AV) | M(PATH_MTU) | M(DEST_QPN) | M(RQ_PSN) | M(MAX_DEST_RD_ATOMIC) |
                       M(MIN_RNR_TIMER);
                *opt = M(ALT_PATH) | M(ACCESS_FLAGS) | M(PKEY_INDEX);
                return true;
            }
            return false;
        case IBV_QPS_RTR:
            if (next == IBV_QPS_RTS) {
                *req = M(SQ_PSN) | M(TIMEOUT) | M(RETRY_CNT) | M(RNR_RETRY) | M(MAX_QP_RD_ATOMIC);
                *opt = k_rtr_rts_opt;
                return true;
            }
            return false;
        case IBV_QPS_RTS:
            if (next == IBV_QPS_RTS) {
                *opt = M(CUR_STATE) | M(ACCESS_FLAGS) | M(ALT_PATH) | M(PATH_MIG_STATE) |
                       M(MIN_RNR_TIMER);
                return true;
            }
            if (next == IBV_QPS_SQD) {
                *opt = M(EN_SQD_ASYNC_NOTIFY);
                return true;
            }
            return false;
        case IBV_QPS_SQD:
            if (next == IBV_QPS_RTS) {
                *opt = k_rtr_rts_opt;
                return true;
            }
            if (next == IBV_QPS_SQD) {
                *opt = M(PORT) | M(AV) | M(TIMEOUT) | M(RETRY_CNT) | M(RNR_RETRY) |
                       M(MAX_QP_RD_ATOMIC) | M(MAX_DEST_RD_ATOMIC) | M(ALT_PATH) | M(ACCESS_FLAGS) |
                       M(PKEY_INDEX) | M(MIN_RNR_TIMER) | M(PATH_MIG_STATE);
                return true;
            }
            return false;
        default: return false;
    }
}

#define SIM_QP_ACCESS \
    (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | \
     IBV_ACCESS_REMOTE_ATOMIC)

static int check_values(sim_qp_t *qp, const struct ibv_qp_attr *a, int mask) {
    sim_dev_t *d = qp->ctx->dev;
    int port = (mask & M(PORT)) ? a->port_num : qp->attr.port_num;
    if ((mask & M(PORT)) && (a->port_num < 1 || a->port_num > d->nports)) return EINVAL;
    if (port < 1 || port > d->nports) return EINVAL;
    sim_port_t *pt = &d->ports[port - 1];
    if ((mask & M(PKEY_INDEX)) && a->pkey_index >= 1) return EINVAL;
    if ((mask & M(ACCESS_FLAGS)) && (a->qp_access_flags & ~SIM_QP_ACCESS)) return EINVAL;
    if ((mask & M(PATH_MTU)) && (a->path_mtu < IBV_MTU_256 || a->path_mtu > pt->max_mtu))
        return EINVAL;
    if ((mask & M(TIMEOUT)) && a->timeout > 31) return EINVAL;
    if ((mask & M(RETRY_CNT)) && a->retry_cnt > 7) return EINVAL;
    if ((mask & M(RNR_RETRY)) && a->rnr_retry > 7) return EINVAL;
    if ((mask & M(MIN_RNR_TIMER)) && a->min_rnr_timer > 31) return EINVAL;
    const sim_profile_t *pr = d->profile;
    if ((mask & M(MAX_QP_RD_ATOMIC)) && a->max_rd_atomic > pr->max_qp_init_rd_atom) return EINVAL;
    if ((mask & M(MAX_DEST_RD_ATOMIC)) && a->max_dest_rd_atomic > pr->max_qp_rd_atom) return EINVAL;
    if ((mask & M(DEST_QPN)) && a->dest_qp_num > 0xffffff) return EINVAL;
    if (mask & M(AV)) {
        /* The sim routes by GID only: a GRH is mandatory, on IB ports too. */
        if (!a->ah_attr.is_global) return EINVAL;
        if (a->ah_attr.grh.sgid_index >= pt->ngid || !pt->gids[a->ah_attr.grh.sgid_index].valid)
            return EINVAL;
        if (a->ah_attr.port_num && a->ah_attr.port_num != port) return EINVAL;
    }
    if ((mask & M(CUR_STATE)) && a->cur_qp_state != qp->state) return EINVAL;
    return 0;
}

int ote__sim_modify_qp(ote_verbs_t *v, struct ibv_qp *ibqp, struct ibv_qp_attr *a, int mask) {
    if (!ibqp || !a) return EINVAL;
    sim_prov_t *p = to_sim_prov(v);
    sim_qp_t *qp = to_sim_qp(ibqp);
    ote_mutex_lock(&p->mu);
    enum ibv_qp_state cur = qp->state;
    enum ibv_qp_state next = (mask & M(STATE)) ? a->qp_state : cur;
    int req = 0, opt = 0, rc = 0;
    if ((mask & M(STATE)) &&
        (a->qp_state < IBV_QPS_RESET || a->qp_state > IBV_QPS_ERR || a->qp_state == IBV_QPS_SQE))
        rc = EINVAL;
    else if (!transition_masks(cur, next, &req, &opt)) rc = EINVAL;
    else if ((mask & req) != req) rc = EINVAL;
    else if (mask & ~(req | opt | M(STATE))) rc = EINVAL;
    else if ((mask & M(CUR_STATE)) && cur != IBV_QPS_RTR && cur != IBV_QPS_RTS &&
             cur != IBV_QPS_SQD)
        rc = EINVAL;
    else rc = check_values(qp, a, mask);
    if (rc) {
        ote_mutex_unlock(&p->mu);
        return rc;
    }
    struct ibv_qp_attr *q = &qp->attr;
    if (mask & M(PKEY_INDEX)) q->pkey_index = a->pkey_index;
    if (mask & M(PORT)) q->port_num = a->port_num;
    if (mask & M(ACCESS_FLAGS)) q->qp_access_flags = a->qp_access_flags;
    if (mask & M(AV)) q->ah_attr = a->ah_attr;
    if (mask & M(PATH_MTU)) q->path_mtu = a->path_mtu;
    if (mask & M(DEST_QPN)) q->dest_qp_num = a->dest_qp_num;
    if (mask & M(RQ_PSN)) q->rq_psn = a->rq_psn & 0xffffff;
    if (mask & M(SQ_PSN)) q->sq_psn = a->sq_psn & 0xffffff;
    if (mask & M(MAX_DEST_RD_ATOMIC)) q->max_dest_rd_atomic = a->max_dest_rd_atomic;
    if (mask & M(MAX_QP_RD_ATOMIC)) q->max_rd_atomic = a->max_rd_atomic;
    if (mask & M(MIN_RNR_TIMER)) q->min_rnr_timer = a->min_rnr_timer;
    if (mask & M(TIMEOUT)) q->timeout = a->timeout;
    if (mask & M(RETRY_CNT)) q->retry_cnt = a->retry_cnt;
    if (mask & M(RNR_RETRY)) q->rnr_retry = a->rnr_retry;
    if (mask & M(ALT_PATH)) {
        q->alt_ah_attr = a->alt_ah_attr;
        q->alt_pkey_index = a->alt_pkey_index;
        q->alt_port_num = a->alt_port_num;
        q->alt_timeout = a->alt_timeout;
    }
    if (mask & M(PATH_MIG_STATE)) q->path_mig_state = a->path_mig_state;
    if (mask & M(EN_SQD_ASYNC_NOTIFY)) q->en_sqd_async_notify = a->en_sqd_async_notify;
    if (next != cur || next == IBV_QPS_RESET || next == IBV_QPS_ERR) {
        switch (next) {
            case IBV_QPS_RESET:
                ote__sim_qp_detach(qp, true);
                qp->epoch++;
                qp->sq_head = qp->sq_next = qp->sq_tail;
                atomic_store(&qp->sq_freed, qp->sq_tail);
                qp->rq_head = qp->rq_tail;
                qp->reads_out = 0;
                qp->halted = false;
                qp->conn_lost = false;
                qp->rnr_until_ns = 0;
                qp->rnr_tries = 0;
                qp->state = IBV_QPS_RESET;
                break;
            case IBV_QPS_ERR:
                if (cur != IBV_QPS_ERR) ote__sim_qp_to_err(qp);
                break;
            case IBV_QPS_RTR:
                qp->rq_epsn = q->rq_psn;
                qp->state = next;
                break;
            case IBV_QPS_RTS:
                if (cur == IBV_QPS_RTR) {
                    qp->sq_psn_next = q->sq_psn;
                    qp->conn_lost = false;
                }
                qp->progress_ns = ote_now_ns();
                qp->state = next;
                break;
            case IBV_QPS_SQD:
                qp->sqd_notify_pending = (mask & M(EN_SQD_ASYNC_NOTIFY)) && a->en_sqd_async_notify;
                qp->state = next;
                ote__sim_qp_complete(qp);
                break;
            default: qp->state = next; break;
        }
    }
    if (mask & M(STATE)) ibqp->state = next;
    ote__sim_handle_overflow(p);
    ote_mutex_unlock(&p->mu);
    ote__sim_wake(p);
    return 0;
}
#undef M

int ote__sim_query_qp(ote_verbs_t *v, struct ibv_qp *ibqp, struct ibv_qp_attr *a, int mask,
                      struct ibv_qp_init_attr *ia) {
    (void)mask;
    if (!ibqp || !a) return EINVAL;
    sim_prov_t *p = to_sim_prov(v);
    sim_qp_t *qp = to_sim_qp(ibqp);
    ote_mutex_lock(&p->mu);
    *a = qp->attr;
    a->qp_state = qp->state;
    a->cur_qp_state = qp->state;
    a->cap = qp->init.cap;
    a->sq_draining = qp->state == IBV_QPS_SQD && qp->sq_head != qp->sq_next;
    if (ia) *ia = qp->init;
    ote_mutex_unlock(&p->mu);
    return 0;
}

/* ---- posting ---- */

static int check_send_wr(sim_qp_t *qp, const struct ibv_send_wr *wr) {
    switch (wr->opcode) {
        case IBV_WR_SEND:
        case IBV_WR_SEND_WITH_IMM:
        case IBV_WR_SEND_WITH_INV:
        case IBV_WR_RDMA_WRITE:
        case IBV_WR_RDMA_WRITE_WITH_IMM:
        case IBV_WR_RDMA_READ:
        case IBV_WR_LOCAL_INV: break;
        case IBV_WR_BIND_MW:
            if (!wr->bind_mw.mw) return EINVAL;
            break;
        default: return EINVAL; /* atomics (atomic_cap NONE), TSO, driver opcodes */
    }
    if (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->init.cap.max_send_sge) return EINVAL;
    if (wr->num_sge > 0 && !wr->sg_list) return EINVAL;
    if (wr->send_flags & IBV_SEND_INLINE) {
        if (wr->opcode == IBV_WR_RDMA_READ || wr->opcode == IBV_WR_LOCAL_INV ||
            wr->opcode == IBV_WR_BIND_MW)
            return EINVAL;
        uint64_t total = 0;
        for (int i = 0; i < wr->num_sge; i++) total += wr->sg_list[i].length;
        if (total > qp->max_inline) return EINVAL;
    }
    if (qp->sq_tail - atomic_load(&qp->sq_freed) >= qp->init.cap.max_send_wr) return ENOMEM;
    return 0;
}

int ote__sim_post_send(ote_verbs_t *v, struct ibv_qp *ibqp, struct ibv_send_wr *wr,
                       struct ibv_send_wr **bad_wr) {
    if (!ibqp) return EINVAL;
    sim_prov_t *p = to_sim_prov(v);
    sim_qp_t *qp = to_sim_qp(ibqp);
    int rc = 0;
    ote_mutex_lock(&p->mu);
    if (qp->state == IBV_QPS_RESET || qp->state == IBV_QPS_INIT || qp->state == IBV_QPS_RTR) {
        rc = EINVAL;
        if (bad_wr) *bad_wr = wr;
        ote_mutex_unlock(&p->mu);
        return rc;
    }
    if (qp->sq_head == qp->sq_tail) qp->progress_ns = ote_now_ns();
    for (; wr; wr = wr->next) {
        rc = check_send_wr(qp, wr);
        if (rc) {
            if (bad_wr) *bad_wr = wr;
            break;
        }
        sim_swr_t *e = sq_slot(qp, qp->sq_tail);
        e->wr_id = wr->wr_id;
        e->op = wr->opcode;
        e->flags = wr->send_flags;
        e->signaled = qp->sq_sig_all || (wr->send_flags & IBV_SEND_SIGNALED);
        e->imm = 0;
        e->raddr = 0;
        e->rkey = 0;
        e->nsge = wr->num_sge;
        e->len = 0;
        e->inlined = false;
        for (int i = 0; i < wr->num_sge; i++) {
            e->sge[i] = wr->sg_list[i];
            e->len += wr->sg_list[i].length;
        }
        if (wr->send_flags & IBV_SEND_INLINE) {
            size_t off = 0;
            for (int i = 0; i < wr->num_sge; i++) {
                if (wr->sg_list[i].length)
                    memcpy(e->inl + off, (const void *)(uintptr_t)wr->sg_list[i].addr,
                           wr->sg_list[i].length);
                off += wr->sg_list[i].length;
            }
            e->inlined = true;
        }
        switch (wr->opcode) {
            case IBV_WR_SEND_WITH_IMM: e->imm = wr->imm_data; break;
            case IBV_WR_SEND_WITH_INV: e->imm = wr->invalidate_rkey; break;
            case IBV_WR_LOCAL_INV: e->imm = wr->invalidate_rkey; break;
            case IBV_WR_RDMA_WRITE_WITH_IMM:
                e->imm = wr->imm_data;
                /* fall through */
            case IBV_WR_RDMA_WRITE:
            case IBV_WR_RDMA_READ:
                e->raddr = wr->wr.rdma.remote_addr;
                e->rkey = wr->wr.rdma.rkey;
                break;
            case IBV_WR_BIND_MW:
                e->mw = wr->bind_mw.mw;
                e->new_rkey = wr->bind_mw.rkey;
                e->bmr = wr->bind_mw.bind_info.mr;
                e->baddr = wr->bind_mw.bind_info.addr;
                e->blen = wr->bind_mw.bind_info.length;
                e->bacc = wr->bind_mw.bind_info.mw_access_flags;
                break;
            default: break;
        }
        e->state = SWR_QUEUED;
        e->psn_set = false;
        e->status = IBV_WC_SUCCESS;
        e->byte_len = 0;
        if (qp->state == IBV_QPS_ERR) {
            e->state = SWR_DONE;
            e->status = IBV_WC_WR_FLUSH_ERR;
        }
        qp->sq_tail++;
        if (qp->state == IBV_QPS_ERR) qp->sq_next = qp->sq_tail;
    }
    if (qp->state == IBV_QPS_ERR) ote__sim_qp_complete(qp);
    ote__sim_handle_overflow(p);
    /* the thread that sends on its connection pumps it (wire.c); without one, any */
    int t = qp->req && !qp->req->dead ? qp->req->owner : -1;
    ote_mutex_unlock(&p->mu);
    if (t >= 0) ote__sim_wake_thr(p, t);
    else ote__sim_wake(p);
    return rc;
}

int ote__sim_post_recv(ote_verbs_t *v, struct ibv_qp *ibqp, struct ibv_recv_wr *wr,
                       struct ibv_recv_wr **bad_wr) {
    if (!ibqp) return EINVAL;
    sim_prov_t *p = to_sim_prov(v);
    sim_qp_t *qp = to_sim_qp(ibqp);
    int rc = 0;
    ote_mutex_lock(&p->mu);
    if (qp->state == IBV_QPS_RESET || qp->srq) { /* a QP on an SRQ: post_srq_recv only */
        if (bad_wr) *bad_wr = wr;
        ote_mutex_unlock(&p->mu);
        return EINVAL;
    }
    for (; wr; wr = wr->next) {
        if (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->init.cap.max_recv_sge ||
            (wr->num_sge > 0 && !wr->sg_list))
            rc = EINVAL;
        else if (qp->rq_tail - qp->rq_head >= qp->init.cap.max_recv_wr) rc = ENOMEM;
        if (rc) {
            if (bad_wr) *bad_wr = wr;
            break;
        }
        sim_rwr_t *r = rq_slot(qp, qp->rq_tail);
        r->wr_id = wr->wr_id;
        r->nsge = wr->num_sge;
        for (int i = 0; i < wr->num_sge; i++) r->sge[i] = wr->sg_list[i];
        qp->rq_tail++;
    }
    if (qp->state == IBV_QPS_ERR) rq_flush(qp);
    ote__sim_handle_overflow(p);
    ote_mutex_unlock(&p->mu);
    return rc;
}

/*
 * verbs/sim/srq.c - shared receive queues of the sim: create within the device profile's
 * max_srq_wr / max_srq_sge, the limit (modify_srq IBV_SRQ_LIMIT arms it, the WQE taken
 * that leaves fewer posted raises IBV_EVENT_SRQ_LIMIT_REACHED once and disarms it),
 * posting, and the responder's receive path over an RQ or an SRQ alike (wire_resp.c
 * takes a WQE at a message's header and completes it at its end).
 *
 * Where a NIC differs (VERBS_FACTS 2, 7, 11): a WQE taken by a message that does not
 * complete (its QP left RTR/RTS/SQD, its connection closed) goes back to the SRQ's front
 * without a completion, so nothing is lost; rxe drops such a WQE silently and mlx5 may
 * complete it on that QP with IBV_WC_WR_FLUSH_ERR: a consumer must survive both.
 * max_srq is not enforced. A QP in ERR never flushes SRQ WQEs.
 */
#include <errno.h>
#include <string.h>

#include "verbs/sim/sim_internal.h"

static void srq_free(sim_srq_t *s) {
    if (s->slots != NULL) ote_free(s->slots[0].sge);
    ote_free(s->slots);
    ote_free(s->ring);
    ote_free(s->free_slots);
    ote_free(s);
}

static sim_srq_t *srq_alloc(uint32_t max_wr, uint32_t max_sge) {
    sim_srq_t *s = ote_calloc(1, sizeof(*s));
    if (s == NULL) return NULL;
    s->max_wr = max_wr;
    s->max_sge = max_sge;
    s->slots = ote_calloc(max_wr, sizeof(*s->slots));
    s->ring = ote_calloc(max_wr, sizeof(*s->ring));
    s->free_slots = ote_calloc(max_wr, sizeof(*s->free_slots));
    struct ibv_sge *sge = ote_calloc((size_t)max_wr * max_sge, sizeof(*sge));
    if (s->slots == NULL || s->ring == NULL || s->free_slots == NULL || sge == NULL) {
        ote_free(sge);
        if (s->slots != NULL) s->slots[0].sge = NULL;
        srq_free(s);
        return NULL;
    }
    for (uint32_t i = 0; i < max_wr; i++) {
        s->slots[i].sge = sge + (size_t)i * max_sge;
        s->free_slots[i] = max_wr - 1 - i;
    }
    s->nfree = max_wr;
    return s;
}

int ote__sim_create_srq(ote_verbs_t *v, struct ibv_pd *ibpd, struct ibv_srq_init_attr *ia,
                        struct ibv_srq **srq_out) {
    if (ibpd == NULL || ia == NULL || srq_out == NULL) return EINVAL;
    sim_prov_t *p = to_sim_prov(v);
    sim_pd_t *pd = to_sim_pd(ibpd);
    const sim_profile_t *pr = pd->ctx->dev->profile;
    struct ibv_srq_attr a = ia->attr;
    /* As rxe: an empty or oversized queue, too many SGEs, a limit above the depth. */
    if (a.max_wr == 0 || a.max_wr > pr->max_srq_wr || a.max_sge == 0 ||
        a.max_sge > pr->max_srq_sge || a.srq_limit > a.max_wr)
        return EINVAL;
    sim_srq_t *s = srq_alloc(a.max_wr, a.max_sge);
    if (s == NULL) return ENOMEM;
    s->pd = pd;
    /* Far from 0, so that giving a WQE back to the front never wraps the sequence. */
    s->head = s->tail = (uint64_t)s->max_wr << 32;
    s->ibsrq.context = ibpd->context;
    s->ibsrq.srq_context = ia->srq_context;
    s->ibsrq.pd = ibpd;
    ote_mutex_lock(&p->mu);
    pd->children++;
    ote_mutex_unlock(&p->mu);
    ia->attr.max_wr = s->max_wr; /* the actual attributes, on success only */
    ia->attr.max_sge = s->max_sge;
    *srq_out = &s->ibsrq;
    return 0;
}

int ote__sim_modify_srq(ote_verbs_t *v, struct ibv_srq *ibsrq, struct ibv_srq_attr *attr,
                        int mask) {
    if (ibsrq == NULL || attr == NULL) return EINVAL;
    /* Resizing (IBV_SRQ_MAX_WR) is not supported, as on mlx5. */
    if (mask & ~IBV_SRQ_LIMIT || !(mask & IBV_SRQ_LIMIT)) return EINVAL;
    sim_prov_t *p = to_sim_prov(v);
    sim_srq_t *s = to_sim_srq(ibsrq);
    if (attr->srq_limit > s->max_wr) return EINVAL;
    ote_mutex_lock(&p->mu);
    s->limit = attr->srq_limit;
    ote_mutex_unlock(&p->mu);
    return 0;
}

int ote__sim_query_srq(ote_verbs_t *v, struct ibv_srq *ibsrq, struct ibv_srq_attr *attr) {
    if (ibsrq == NULL || attr == NULL) return EINVAL;
    sim_prov_t *p = to_sim_prov(v);
    sim_srq_t *s = to_sim_srq(ibsrq);
    ote_mutex_lock(&p->mu);
    attr->max_wr = s->max_wr;
    attr->max_sge = s->max_sge;
    attr->srq_limit = s->limit;
    ote_mutex_unlock(&p->mu);
    return 0;
}

/* Undelivered async events naming s are dropped with it (prov->mu held). */
static void drop_events(sim_srq_t *s) {
    sim_ctx_t *ctx = s->pd->ctx;
    sim_aev_t *e, *tmp;
    DL_FOREACH_SAFE(ctx->aq, e, tmp) {
        if (ote_verbs_event_target(e->ev.event_type) == OTE_VERBS_EVENT_ON_SRQ &&
            e->ev.element.srq == &s->ibsrq) {
            DL_DELETE(ctx->aq, e);
            ote_free(e);
        }
    }
    if (ctx->aq == NULL) ote__sim_efd_set(ctx->efd, &ctx->efd_level, false);
}

int ote__sim_destroy_srq(ote_verbs_t *v, struct ibv_srq *ibsrq) {
    if (ibsrq == NULL) return EINVAL;
    sim_prov_t *p = to_sim_prov(v);
    sim_srq_t *s = to_sim_srq(ibsrq);
    ote_mutex_lock(&p->mu);
    if (s->nqp > 0) {
        ote_mutex_unlock(&p->mu);
        return EBUSY; /* a QP still takes its receives from it */
    }
    if (!ote__sim_wait_acked(p, &s->async_delivered, &s->async_acked)) {
        ote_mutex_unlock(&p->mu);
        return EBUSY; /* rdma-core blocks until the events are acked */
    }
    drop_events(s);
    s->pd->children--;
    ote_mutex_unlock(&p->mu);
    srq_free(s); /* posted WQEs vanish without completions */
    return 0;
}

static int check_recv_wr(const sim_srq_t *s, const struct ibv_recv_wr *wr) {
    if (wr->num_sge < 0 || (uint32_t)wr->num_sge > s->max_sge || (wr->num_sge > 0 && !wr->sg_list))
        return EINVAL;
    if (s->nfree == 0) return ENOMEM;
    return 0;
}

int ote__sim_post_srq_recv(ote_verbs_t *v, struct ibv_srq *ibsrq, struct ibv_recv_wr *wr,
                           struct ibv_recv_wr **bad_wr) {
    if (ibsrq == NULL) return EINVAL;
    sim_prov_t *p = to_sim_prov(v);
    sim_srq_t *s = to_sim_srq(ibsrq);
    int rc = 0;
    ote_mutex_lock(&p->mu);
    for (; wr != NULL; wr = wr->next) {
        rc = check_recv_wr(s, wr);
        if (rc != 0) {
            if (bad_wr != NULL) *bad_wr = wr;
            break;
        }
        uint32_t i = s->free_slots[--s->nfree];
        sim_rwr_t *r = &s->slots[i];
        r->wr_id = wr->wr_id;
        r->nsge = wr->num_sge;
        for (int k = 0; k < wr->num_sge; k++) r->sge[k] = wr->sg_list[k];
        s->ring[s->tail % s->max_wr] = i;
        s->tail++;
    }
    ote_mutex_unlock(&p->mu);
    return rc;
}

/* ---- the responder's receive path ---- */

static sim_rwr_t *rq_front(sim_qp_t *qp) {
    if (qp->rq_head == qp->rq_tail) return NULL;
    return &qp->rq[qp->rq_head % qp->max_recv_wr];
}

/* The posted count fell below the armed limit: the event, once, then disarmed. */
static void check_limit(sim_srq_t *s) {
    if (s->limit == 0 || s->tail - s->head >= s->limit) return;
    s->limit = 0;
    struct ibv_async_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.event_type = IBV_EVENT_SRQ_LIMIT_REACHED;
    ev.element.srq = &s->ibsrq;
    ote__sim_async_push(s->pd->ctx, &ev);
}

sim_rwr_t *ote__sim_recv_take(sim_conn_t *c, sim_qp_t *qp) {
    sim_srq_t *s = qp->srq;
    if (s == NULL) return rq_front(qp);
    if (c->srq_from != NULL) return &c->srq_from->slots[c->srq_slot];
    if (s->head == s->tail) return NULL;
    c->srq_from = s;
    c->srq_slot = s->ring[s->head % s->max_wr];
    s->head++;
    check_limit(s);
    return &s->slots[c->srq_slot];
}

sim_rwr_t *ote__sim_recv_held(sim_conn_t *c, sim_qp_t *qp) {
    if (qp->srq == NULL) return rq_front(qp);
    return c->srq_from != NULL ? &c->srq_from->slots[c->srq_slot] : NULL;
}

void ote__sim_recv_done(sim_conn_t *c, sim_qp_t *qp, const struct ibv_wc *wc, bool solicited) {
    if (qp->srq == NULL) {
        ote__sim_rq_complete(qp, wc, solicited);
        return;
    }
    sim_srq_t *s = c->srq_from;
    if (s != NULL) {
        s->free_slots[s->nfree++] = c->srq_slot;
        c->srq_from = NULL;
    }
    ote__sim_cq_push(qp->rcq, wc, NULL, 0, solicited);
    if (wc->status != IBV_WC_SUCCESS && qp->state != IBV_QPS_ERR) ote__sim_qp_to_err(qp);
}

void ote__sim_srq_give_back(sim_conn_t *c) {
    sim_srq_t *s = c->srq_from;
    if (s == NULL) return;
    /* A slot is held, so fewer than max_wr are posted and the front slot is free. */
    s->head--;
    s->ring[s->head % s->max_wr] = c->srq_slot;
    c->srq_from = NULL;
}

sim_pd_t *ote__sim_recv_pd(sim_qp_t *qp) { return qp->srq != NULL ? qp->srq->pd : qp->pd; }

void ote__sim_srq_qp_err(sim_qp_t *qp) {
    sim_conn_t *c;
    DL_FOREACH(qp->p->conns, c) {
        if (!c->requester && c->qp == qp) ote__sim_srq_give_back(c);
    }
    struct ibv_async_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.event_type = IBV_EVENT_QP_LAST_WQE_REACHED;
    ev.element.qp = &qp->ibqp;
    ote__sim_async_push(qp->ctx, &ev);
}

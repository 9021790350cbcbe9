/*
 * verbs/sim/cq.c - device contexts, async events, completion channels and CQs of the
 * sim. Event fds (ctx->async_fd, channel fd) are eventfds used as levels: readable
 * exactly while their queue is non-empty, so poll/epoll work and an O_NONBLOCK fd
 * gives EAGAIN when empty, as the kernel's.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "verbs/sim/sim_internal.h"

void ote__sim_efd_set(int efd, bool *level, bool on) {
    if (on == *level) return;
    uint64_t one = 1;
    ssize_t r;
    if (on) r = write(efd, &one, sizeof(one));
    else r = read(efd, &one, sizeof(one));
    (void)r; /* an eventfd read/write of 8 bytes cannot fail when the level is known */
    *level = on;
}

bool ote__sim_wait_acked(sim_prov_t *p, const uint32_t *delivered, const uint32_t *acked) {
    ote_deadline_t dl = ote_deadline_after(OTE_NSEC_PER_SEC);
    while (*delivered != *acked) {
        if (ote_cond_wait(&p->cv, &p->mu, dl) == OTE_ERR_TIMEOUT) return *delivered == *acked;
    }
    return true;
}

int ote__sim_wait_fd(int fd) {
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0 && (fl & O_NONBLOCK)) return EAGAIN;
    /* The verb blocks by contract (the caller chose a blocking fd); wait in slices. */
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int r = poll(&pfd, 1, 1000);
    if (r < 0 && errno != EINTR) return errno;
    return 0;
}

/* ---- contexts ---- */

static bool *ctx_level(sim_ctx_t *c) { return &c->efd_level; }

int ote__sim_open_device(ote_verbs_t *v, struct ibv_device *dev, struct ibv_context **ctx_out) {
    if (!dev || !ctx_out) return EINVAL;
    sim_prov_t *p = to_sim_prov(v);
    sim_dev_t *d = to_sim_dev(dev);
    if (d->prov != p) return ENODEV;
    sim_ctx_t *c = ote_calloc(1, sizeof(*c));
    if (!c) return ENOMEM;
    c->efd = eventfd(0, EFD_CLOEXEC);
    if (c->efd < 0) {
        int e = errno;
        ote_free(c);
        return e;
    }
    c->prov = p;
    c->dev = d;
    c->ibctx.device = dev;
    c->ibctx.cmd_fd = -1;
    c->ibctx.async_fd = c->efd;
    c->ibctx.num_comp_vectors = 1;
    ote_mutex_lock(&p->mu);
    DL_APPEND(p->ctxs, c);
    ote_mutex_unlock(&p->mu);
    *ctx_out = &c->ibctx;
    return 0;
}

int ote__sim_close_device(ote_verbs_t *v, struct ibv_context *ctx) {
    if (!ctx) return EINVAL;
    sim_prov_t *p = to_sim_prov(v);
    sim_ctx_t *c = to_sim_ctx(ctx);
    ote_mutex_lock(&p->mu);
    if (c->children > 0) { /* rdma-core would return 0 and leak them; the sim refuses */
        ote_mutex_unlock(&p->mu);
        return EBUSY;
    }
    DL_DELETE(p->ctxs, c);
    sim_aev_t *e, *tmp;
    DL_FOREACH_SAFE(c->aq, e, tmp) {
        DL_DELETE(c->aq, e);
        ote_free(e);
    }
    ote_mutex_unlock(&p->mu);
    close(c->efd);
    ote_free(c);
    return 0;
}

void ote__sim_async_push(sim_ctx_t *ctx, const struct ibv_async_event *ev) {
    sim_aev_t *e = ote_calloc(1, sizeof(*e));
    if (!e) {
        OTE_WARN(SIM_LOG, "sim: async event %d lost (out of memory)", (int)ev->event_type);
        return;
    }
    e->ev = *ev;
    DL_APPEND(ctx->aq, e);
    ote__sim_efd_set(ctx->efd, ctx_level(ctx), true);
}

/* The counter of the QP, CQ or SRQ an async event names that delivery (or the ack) moves:
 * destroy_qp/destroy_cq wait until both agree. NULL for events on other objects. */
static uint32_t *aev_counter(const struct ibv_async_event *ev, bool acked) {
    switch (ote_verbs_event_target(ev->event_type)) {
        case OTE_VERBS_EVENT_ON_QP: {
            sim_qp_t *qp = to_sim_qp(ev->element.qp);
            return acked ? &qp->async_acked : &qp->async_delivered;
        }
        case OTE_VERBS_EVENT_ON_CQ: {
            sim_cq_t *cq = to_sim_cq(ev->element.cq);
            return acked ? &cq->async_acked : &cq->async_delivered;
        }
        case OTE_VERBS_EVENT_ON_SRQ: {
            sim_srq_t *srq = to_sim_srq(ev->element.srq);
            return acked ? &srq->async_acked : &srq->async_delivered;
        }
        default: return NULL;
    }
}

int ote__sim_get_async_event(ote_verbs_t *v, struct ibv_context *ctx, struct ibv_async_event *ev) {
    if (!ctx || !ev) return EINVAL;
    sim_prov_t *p = to_sim_prov(v);
    sim_ctx_t *c = to_sim_ctx(ctx);
    ote_mutex_lock(&p->mu);
    while (!c->aq) {
        ote_mutex_unlock(&p->mu); /* no syscall under the provider lock */
        int rc = ote__sim_wait_fd(c->efd);
        if (rc) return rc;
        ote_mutex_lock(&p->mu);
    }
    sim_aev_t *e = c->aq;
    DL_DELETE(c->aq, e);
    if (!c->aq) ote__sim_efd_set(c->efd, ctx_level(c), false);
    *ev = e->ev;
    uint32_t *n = aev_counter(ev, false);
    if (n) (*n)++;
    ote_mutex_unlock(&p->mu);
    ote_free(e);
    return 0;
}

void ote__sim_ack_async_event(ote_verbs_t *v, struct ibv_async_event *ev) {
    if (!ev) return;
    sim_prov_t *p = to_sim_prov(v);
    ote_mutex_lock(&p->mu);
    uint32_t *n = aev_counter(ev, true);
    if (n) (*n)++;
    ote_cond_broadcast(&p->cv);
    ote_mutex_unlock(&p->mu);
}

/* ---- completion channels ---- */

int ote__sim_create_comp_channel(ote_verbs_t *v, struct ibv_context *ctx,
                                 struct ibv_comp_channel **ch_out) {
    if (!ctx || !ch_out) return EINVAL;
    sim_prov_t *p = to_sim_prov(v);
    sim_channel_t *ch = ote_calloc(1, sizeof(*ch));
    if (!ch) return ENOMEM;
    ch->efd = eventfd(0, EFD_CLOEXEC);
    if (ch->efd < 0) {
        int e = errno;
        ote_free(ch);
        return e;
    }
    ch->ctx = to_sim_ctx(ctx);
    ch->ibch.context = ctx;
    ch->ibch.fd = ch->efd;
    ch->ibch.refcnt = 0;
    ote_mutex_lock(&p->mu);
    ch->ctx->children++;
    ote_mutex_unlock(&p->mu);
    *ch_out = &ch->ibch;
    return 0;
}

int ote__sim_destroy_comp_channel(ote_verbs_t *v, struct ibv_comp_channel *ibch) {
    if (!ibch) return EINVAL;
    sim_prov_t *p = to_sim_prov(v);
    sim_channel_t *ch = to_sim_ch(ibch);
    ote_mutex_lock(&p->mu);
    if (ch->ncq > 0) {
        ote_mutex_unlock(&p->mu);
        return EBUSY;
    }
    ch->ctx->children--;
    ote_mutex_unlock(&p->mu);
    close(ch->efd);
    ote_free(ch);
    return 0;
}

/* Queue a completion event of cq on its channel (prov->mu held). */
static void ch_notify(sim_cq_t *cq) {
    sim_channel_t *ch = cq->ch;
    if (!ch || cq->queued) return; /* one queued event per CQ: repeated arms coalesce */
    cq->queued = true;
    cq->q_next = NULL;
    if (ch->q_tail) ch->q_tail->q_next = cq;
    else ch->q_head = cq;
    ch->q_tail = cq;
    ote__sim_efd_set(ch->efd, &ch->efd_level, true);
}

static void ch_unqueue(sim_cq_t *cq) {
    sim_channel_t *ch = cq->ch;
    if (!ch || !cq->queued) return;
    sim_cq_t **pp = &ch->q_head, *prev = NULL;
    while (*pp && *pp != cq) {
        prev = *pp;
        pp = &(*pp)->q_next;
    }
    if (*pp) {
        *pp = cq->q_next;
        if (ch->q_tail == cq) ch->q_tail = prev;
    }
    cq->queued = false;
    if (!ch->q_head) {
        ote__sim_efd_set(ch->efd, &ch->efd_level, false);
    }
}

int ote__sim_get_cq_event(ote_verbs_t *v, struct ibv_comp_channel *ibch, struct ibv_cq **cq_out,
                          void **cq_context_out) {
    if (!ibch || !cq_out) return EINVAL;
    sim_prov_t *p = to_sim_prov(v);
    sim_channel_t *ch = to_sim_ch(ibch);
    ote_mutex_lock(&p->mu);
    while (!ch->q_head) {
        ote_mutex_unlock(&p->mu); /* no syscall under the provider lock */
        int rc = ote__sim_wait_fd(ch->efd);
        if (rc) return rc;
        ote_mutex_lock(&p->mu);
    }
    sim_cq_t *cq = ch->q_head;
    ch_unqueue(cq);
    cq->comp_delivered++;
    *cq_out = &cq->ibcq;
    if (cq_context_out) *cq_context_out = cq->ibcq.cq_context;
    ote_mutex_unlock(&p->mu);
    return 0;
}

void ote__sim_ack_cq_events(ote_verbs_t *v, struct ibv_cq *ibcq, unsigned int nevents) {
    if (!ibcq) return;
    sim_prov_t *p = to_sim_prov(v);
    ote_mutex_lock(&p->mu);
    to_sim_cq(ibcq)->comp_acked += nevents;
    ote_cond_broadcast(&p->cv);
    ote_mutex_unlock(&p->mu);
}

/* ---- CQ ---- */

int ote__sim_create_cq(ote_verbs_t *v, struct ibv_context *ctx, int cqe, void *cq_context,
                       struct ibv_comp_channel *ibch, int comp_vector, struct ibv_cq **cq_out) {
    if (!ctx || !cq_out) return EINVAL;
    if (cqe < 1 || (uint32_t)cqe > to_sim_ctx(ctx)->dev->profile->max_cqe) return EINVAL;
    if (comp_vector < 0 || comp_vector >= ctx->num_comp_vectors) return EINVAL;
    if (ibch && ibch->context != ctx) return EINVAL;
    sim_prov_t *p = to_sim_prov(v);
    sim_cq_t *cq = ote_calloc(1, sizeof(*cq));
    if (!cq) return ENOMEM;
    cq->ring = ote_calloc((size_t)cqe, sizeof(*cq->ring));
    if (!cq->ring) {
        ote_free(cq);
        return ENOMEM;
    }
    if (ote_mutex_init(&cq->mu) != OTE_OK) {
        ote_free(cq->ring);
        ote_free(cq);
        return ENOMEM;
    }
    cq->cap = cqe;
    cq->ctx = to_sim_ctx(ctx);
    cq->ibcq.context = ctx;
    cq->ibcq.channel = ibch;
    cq->ibcq.cq_context = cq_context;
    cq->ibcq.cqe = cqe;
    ote_mutex_lock(&p->mu);
    cq->ibcq.handle = ++p->next_qpn;
    if (ibch) {
        cq->ch = to_sim_ch(ibch);
        cq->ch->ncq++;
        ibch->refcnt++;
    }
    cq->ctx->children++;
    ote_mutex_unlock(&p->mu);
    *cq_out = &cq->ibcq;
    return 0;
}

int ote__sim_destroy_cq(ote_verbs_t *v, struct ibv_cq *ibcq) {
    if (!ibcq) return EINVAL;
    sim_prov_t *p = to_sim_prov(v);
    sim_cq_t *cq = to_sim_cq(ibcq);
    ote_mutex_lock(&p->mu);
    if (cq->nqp > 0) {
        ote_mutex_unlock(&p->mu);
        return EBUSY;
    }
    /* rdma-core blocks until every event is acked; the sim waits a bounded time. */
    if (!ote__sim_wait_acked(p, &cq->comp_delivered, &cq->comp_acked) ||
        !ote__sim_wait_acked(p, &cq->async_delivered, &cq->async_acked)) {
        ote_mutex_unlock(&p->mu);
        return EBUSY;
    }
    ch_unqueue(cq);
    /* drop queued CQ_ERR events naming it */
    sim_aev_t *e, *tmp;
    DL_FOREACH_SAFE(cq->ctx->aq, e, tmp) {
        if (e->ev.event_type == IBV_EVENT_CQ_ERR && e->ev.element.cq == ibcq) {
            DL_DELETE(cq->ctx->aq, e);
            ote_free(e);
        }
    }
    if (!cq->ctx->aq) ote__sim_efd_set(cq->ctx->efd, &cq->ctx->efd_level, false);
    if (cq->ch) {
        cq->ch->ncq--;
        cq->ch->ibch.refcnt--;
    }
    cq->ctx->children--;
    ote_mutex_unlock(&p->mu);
    ote_mutex_destroy(&cq->mu);
    ote_free(cq->ring);
    ote_free(cq);
    return 0;
}

int ote__sim_req_notify_cq(ote_verbs_t *v, struct ibv_cq *ibcq, int solicited_only) {
    (void)v;
    if (!ibcq) return EINVAL;
    sim_cq_t *cq = to_sim_cq(ibcq);
    if (!cq->ch) return EINVAL;
    ote_mutex_lock(&cq->mu);
    int want = solicited_only ? 1 : 2;
    if (cq->armed != 2) cq->armed = want;
    ote_mutex_unlock(&cq->mu);
    return 0;
}

void ote__sim_cq_push(sim_cq_t *cq, const struct ibv_wc *wc, sim_qp_t *credit_qp,
                      uint64_t credit_seq, bool solicited) {
    ote_mutex_lock(&cq->mu);
    if (cq->overflowed) {
        ote_mutex_unlock(&cq->mu);
        return;
    }
    if (cq->count == cq->cap) {
        /* Overrun: the CQ is unusable from now on (poll fails); the async CQ_ERR and the
         * QP_FATAL of its QPs are raised by ote__sim_handle_overflow(). */
        cq->overflowed = true;
        ote_mutex_unlock(&cq->mu);
        return;
    }
    sim_cqe_t *e = &cq->ring[(cq->head + cq->count) % cq->cap];
    e->wc = *wc;
    e->credit_qp = credit_qp;
    e->credit_seq = credit_seq;
    cq->count++;
    bool fire = cq->armed == 2 || (cq->armed == 1 && (solicited || wc->status != IBV_WC_SUCCESS));
    if (fire) cq->armed = 0;
    ote_mutex_unlock(&cq->mu);
    if (fire) ch_notify(cq);
}

int ote__sim_poll_cq(ote_verbs_t *v, struct ibv_cq *ibcq, int n, struct ibv_wc *wc) {
    if (!ibcq || n < 0 || (n > 0 && !wc)) return -EINVAL;
    sim_cq_t *cq = to_sim_cq(ibcq);
    ote_mutex_lock(&cq->mu);
    if (cq->overflowed) {
        ote_mutex_unlock(&cq->mu);
        return -EIO;
    }
    int got = 0;
    while (got < n && cq->count > 0) {
        sim_cqe_t *e = &cq->ring[cq->head];
        wc[got++] = e->wc;
        if (e->credit_qp) {
            uint64_t want = e->credit_seq + 1;
            uint64_t cur = atomic_load(&e->credit_qp->sq_freed);
            while (cur < want &&
                   !atomic_compare_exchange_weak(&e->credit_qp->sq_freed, &cur, want)) {}
        }
        cq->head = (cq->head + 1) % cq->cap;
        cq->count--;
    }
    ote_mutex_unlock(&cq->mu);
    ote__sim_inject_polled(to_sim_prov(v), cq, got);
    return got;
}

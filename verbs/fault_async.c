/*
 * verbs/fault_async.c - injected async events of the fault decorator: per context (made
 * lazily by inject/async_fd) an eventfd, an epoll set over it and the inner provider's
 * async fd, and a queue of injected events; and the matching of acks to injected events.
 */
#include <errno.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/log.h"
#include "verbs/fault_internal.h"

void ote__verbs_fault_ctx_free(ctx_state_t *cs) {
    ev_node_t *e, *tmp;
    DL_FOREACH_SAFE(cs->queue, e, tmp) {
        DL_DELETE(cs->queue, e);
        ote_free(e);
    }
    if (cs->epfd >= 0) close(cs->epfd);
    if (cs->efd >= 0) close(cs->efd);
    ote_free(cs);
}

/* Find or create the state of ctx; called with f->mu held. */
static ote_status_t ctx_state_get(fault_t *f, struct ibv_context *ctx, ctx_state_t **cs_out) {
    ctx_state_t *cs = NULL;
    HASH_FIND_PTR(f->ctxs, &ctx, cs);
    if (cs != NULL) {
        *cs_out = cs;
        return OTE_OK;
    }
    ote_status_t st;
    cs = ote_calloc(1, sizeof(*cs));
    if (cs == NULL) return OTE_ERR_NOMEM;
    cs->ctx = ctx;
    cs->epfd = -1;
    cs->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (cs->efd < 0) {
        st = ote_status_from_errno(errno);
        goto err_free;
    }
    cs->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (cs->epfd < 0) {
        st = ote_status_from_errno(errno);
        goto err_free;
    }
    struct epoll_event ee;
    memset(&ee, 0, sizeof(ee));
    ee.events = EPOLLIN;
    ee.data.fd = cs->efd;
    if (epoll_ctl(cs->epfd, EPOLL_CTL_ADD, cs->efd, &ee) != 0) {
        st = ote_status_from_errno(errno);
        goto err_free;
    }
    /* The inner provider's fd, when it has a pollable one: then the decorator's fd also
     * wakes for the inner provider's own events. */
    if (ctx != NULL && ctx->async_fd >= 0) {
        ee.data.fd = ctx->async_fd;
        if (epoll_ctl(cs->epfd, EPOLL_CTL_ADD, ctx->async_fd, &ee) != 0) {
            OTE_DEBUG(LOGC,
                      "%s: async fd %d of the inner provider is not pollable (%s); "
                      "only injected events wake the decorator's fd",
                      f->name, ctx->async_fd, strerror(errno));
        }
    }
    OTE_HASH_ADD_KEYPTR(hh, f->ctxs, &cs->ctx, sizeof(cs->ctx), cs, st);
    if (st != OTE_OK) goto err_free;
    *cs_out = cs;
    return OTE_OK;

err_free:
    ote__verbs_fault_ctx_free(cs);
    return st;
}

void ote__verbs_fault_ctx_drop(fault_t *f, struct ibv_context *ctx) {
    ctx_state_t *cs = NULL;
    ote_mutex_lock(&f->mu);
    HASH_FIND_PTR(f->ctxs, &ctx, cs);
    if (cs != NULL) HASH_DEL(f->ctxs, cs);
    ote_mutex_unlock(&f->mu);
    if (cs != NULL) ote__verbs_fault_ctx_free(cs);
}

static void efd_signal(ctx_state_t *cs) {
    uint64_t one = 1;
    ssize_t n = write(cs->efd, &one, sizeof(one));
    (void)n; /* fails only on counter overflow, when the fd is readable anyway */
}

void ote__verbs_fault_efd_drain(ctx_state_t *cs) {
    uint64_t val;
    ssize_t n = read(cs->efd, &val, sizeof(val));
    (void)n; /* EAGAIN: already drained */
}

bool ote__verbs_fault_event_matches(const struct ibv_async_event *a,
                                    const struct ibv_async_event *b) {
    if (a->event_type != b->event_type) return false;
    switch (ote_verbs_event_target(a->event_type)) {
        case OTE_VERBS_EVENT_ON_QP: return a->element.qp == b->element.qp;
        case OTE_VERBS_EVENT_ON_CQ: return a->element.cq == b->element.cq;
        case OTE_VERBS_EVENT_ON_SRQ: return a->element.srq == b->element.srq;
        case OTE_VERBS_EVENT_ON_WQ: return a->element.wq == b->element.wq;
        case OTE_VERBS_EVENT_ON_PORT: return a->element.port_num == b->element.port_num;
        case OTE_VERBS_EVENT_ON_DEVICE: return true;
    }
    return true;
}

ote_status_t ote_verbs_fault_inject_async_event(ote_verbs_t *v, struct ibv_context *ctx,
                                                const struct ibv_async_event *ev) {
    GET_FAULT_OR(v, OTE_ERR_INVALID);
    if (ctx == NULL || ev == NULL) return OTE_ERR_INVALID;
    fault_t *f = to_fault(v);
    ev_node_t *e = ote_calloc(1, sizeof(*e));
    if (e == NULL) return OTE_ERR_NOMEM;
    e->ev = *ev;
    ote_mutex_lock(&f->mu);
    ctx_state_t *cs = NULL;
    ote_status_t st = ctx_state_get(f, ctx, &cs);
    if (st == OTE_OK) {
        DL_APPEND(cs->queue, e);
        efd_signal(cs);
    }
    ote_mutex_unlock(&f->mu);
    if (st != OTE_OK) {
        ote_free(e);
        return st;
    }
    OTE_DEBUG(LOGC, "%s: queued injected async event %s", f->name,
              ote_verbs_event_name(ev->event_type));
    return OTE_OK;
}

ote_status_t ote_verbs_fault_async_fd(ote_verbs_t *v, struct ibv_context *ctx, int *fd_out) {
    GET_FAULT_OR(v, OTE_ERR_INVALID);
    if (ctx == NULL || fd_out == NULL) return OTE_ERR_INVALID;
    fault_t *f = to_fault(v);
    ote_mutex_lock(&f->mu);
    ctx_state_t *cs = NULL;
    ote_status_t st = ctx_state_get(f, ctx, &cs);
    if (st == OTE_OK) *fd_out = cs->epfd;
    ote_mutex_unlock(&f->mu);
    return st;
}

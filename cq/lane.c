/*
 * cq/lane.c - CQ lanes: native CQ/channel owners, WR id namespaces, QP hooks, budget,
 * polling and drain.
 *
 * Lock order: poll_mu -> table_mu -> progress_mu. Callbacks and hooks run with poll_mu
 * held and nothing else, so they can post work and (un)register namespaces on this lane
 * (the poll lock is recognised as held by this thread).
 */
#include <errno.h>
#include <fcntl.h>

#include "base/alloc.h"
#include "base/fault.h"
#include "base/log.h"
#include "cq/cq_internal.h"

#define POLL_BATCH 32
#define NS_MAX 0xffffffu

/* The lane whose poll lock this thread holds (callbacks run under it). */
static _Thread_local ote_cq_lane_t *tls_polling;

void ote__cq_lane_poll_lock(ote_cq_lane_t *lane) {
    ote_mutex_lock(&lane->poll_mu);
    tls_polling = lane;
}

void ote__cq_lane_poll_unlock(ote_cq_lane_t *lane) {
    tls_polling = NULL;
    ote_mutex_unlock(&lane->poll_mu);
}

static void notify_progress(ote_cq_lane_t *lane) {
    ote_mutex_lock(&lane->progress_mu);
    lane->progress_epoch++;
    ote_cond_broadcast(&lane->progress_cv);
    ote_mutex_unlock(&lane->progress_mu);
}

void ote_cq_lane_fault(ote_cq_lane_t *lane, ote_status_t cause) {
    ote_mutex_lock(&lane->table_mu);
    int first = atomic_load(&lane->state) == OTE_CQ_LANE_HEALTHY;
    if (first) {
        lane->fault = cause;
        atomic_store(&lane->state, OTE_CQ_LANE_FAULTED);
    }
    ote_mutex_unlock(&lane->table_mu);
    if (!first) return;
    OTE_ERROR("cq",
              "lane %u on %s: CQ error (%s): lane fenced; its QPs are ended and it is "
              "replaced once they are gone",
              lane->index, ote_context_name(lane->ctx), ote_status_str(cause));
    notify_progress(lane);
}

ote_cq_lane_state_t ote_cq_lane_state(const ote_cq_lane_t *lane, ote_status_t *cause_out) {
    ote_cq_lane_t *l = (ote_cq_lane_t *)lane;
    ote_mutex_lock(&l->table_mu);
    ote_cq_lane_state_t st = (ote_cq_lane_state_t)atomic_load(&l->state);
    if (st == OTE_CQ_LANE_FAULTED && cause_out != NULL) *cause_out = l->fault;
    ote_mutex_unlock(&l->table_mu);
    return st;
}

/* IBV_EVENT_CQ_ERR naming one of this lane's CQs faults the lane. */
static void lane_listener(void *arg, ote_context_t *ctx, const struct ibv_async_event *ev) {
    ote_cq_lane_t *lane = arg;
    if (ctx != lane->ctx || ev->event_type != IBV_EVENT_CQ_ERR || ev->element.cq == NULL) return;
    ote_mutex_lock(&lane->table_mu);
    int mine = ev->element.cq == lane->cq[0] || ev->element.cq == lane->cq[1];
    ote_mutex_unlock(&lane->table_mu);
    if (mine) ote_cq_lane_fault(lane, ote_status_make(OTE_ERR_FENCED, EIO));
}

/* Destroy whatever native object of the lane still exists. OTE_ERR_RETAINED keeps the
 * ones that failed, counted once each. Caller holds poll_mu or owns the lane alone. */
static ote_status_t destroy_natives(ote_cq_lane_t *lane) {
    ote_verbs_t *v = lane->v;
    ote_status_t result = OTE_OK;
    static const ote_retained_kind_t kinds[3] = {OTE_RETAINED_CQ, OTE_RETAINED_CQ,
                                                 OTE_RETAINED_CHANNEL};
    for (int i = 0; i < 3; i++) {
        int err = 0;
        if (i < 2) {
            if (lane->cq[i] == NULL) continue;
            err = v->ops->destroy_cq(v, lane->cq[i]);
            if (err == 0) lane->cq[i] = NULL;
        } else {
            if (lane->channel == NULL) continue;
            /* A channel with CQs still attached cannot be destroyed: keep it too. */
            if (lane->cq[0] != NULL || lane->cq[1] != NULL) err = EBUSY;
            else err = v->ops->destroy_comp_channel(v, lane->channel);
            if (err == 0) lane->channel = NULL;
        }
        if (err != 0) {
            if (!lane->retained[i]) {
                lane->retained[i] = 1;
                ote_context_retained_add(lane->ctx, kinds[i], 1);
            }
            OTE_WARN("cq", "lane %u on %s: destroy of %s failed: errno %d; retained", lane->index,
                     ote_context_name(lane->ctx),
                     i == 0   ? "send CQ"
                     : i == 1 ? "receive CQ"
                              : "completion channel",
                     err);
            if (result == OTE_OK) result = ote_status_make(OTE_ERR_RETAINED, err);
        } else if (lane->retained[i]) {
            lane->retained[i] = 0;
            ote_context_retained_add(lane->ctx, kinds[i], -1);
        }
    }
    return result;
}

static void free_lane(ote_cq_lane_t *lane) {
    lane_ns_t *n, *tmp;
    HASH_ITER(hh, lane->namespaces, n, tmp) {
        HASH_DEL(lane->namespaces, n);
        ote_free(n);
    }
    lane_hook_t *h, *htmp;
    HASH_ITER(hh, lane->hooks, h, htmp) {
        HASH_DEL(lane->hooks, h);
        ote_free(h);
    }
    ote_cond_destroy(&lane->progress_cv);
    ote_mutex_destroy(&lane->progress_mu);
    ote_mutex_destroy(&lane->table_mu);
    ote_mutex_destroy(&lane->poll_mu);
    ote_free(lane);
}

/* Both CQs of the lane (at creation, and for a replacement), on its channel. */
/* The lane's completion channel on its context's current native context (nonblocking). */
static ote_status_t create_channel(ote_cq_lane_t *lane) {
    ote_verbs_t *v = lane->v;
    int err = v->ops->create_comp_channel(v, ote_context_native(lane->ctx), &lane->channel);
    if (err != 0) {
        OTE_ERROR("cq", "lane %u on %s: create_comp_channel failed: errno %d", lane->index,
                  ote_context_name(lane->ctx), err);
        lane->channel = NULL;
        return ote_status_make(OTE_ERR_NATIVE, err);
    }
    if (lane->channel->fd >= 0) {
        int fl = fcntl(lane->channel->fd, F_GETFL);
        if (fl >= 0) (void)fcntl(lane->channel->fd, F_SETFL, fl | O_NONBLOCK);
    }
    return OTE_OK;
}

static ote_status_t create_cqs(ote_cq_lane_t *lane) {
    ote_verbs_t *v = lane->v;
    struct ibv_context *nctx = ote_context_native(lane->ctx);
    for (int d = 0; d < 2; d++) {
        if (lane->cq[d] != NULL) continue;
        int err = v->ops->create_cq(v, nctx, lane->depth[d], lane, lane->channel, 0, &lane->cq[d]);
        if (err != 0) {
            OTE_ERROR("cq", "lane %u on %s: create_cq(%s, %d CQEs) failed: errno %d", lane->index,
                      ote_context_name(lane->ctx), d == 0 ? "send" : "recv", lane->depth[d], err);
            lane->cq[d] = NULL;
            return ote_status_make(OTE_ERR_NATIVE, err);
        }
        int actual = lane->cq[d]->cqe;
        lane->capacity[d] = (uint32_t)(actual >= lane->depth[d] ? lane->depth[d] : actual);
    }
    return OTE_OK;
}

ote_status_t ote_cq_lane_create(ote_context_t *ctx, const ote_cq_lane_config_t *cfg,
                                ote_cq_lane_t **lane_out) {
    if (ctx == NULL || cfg == NULL || lane_out == NULL || cfg->send_depth <= 0 ||
        cfg->recv_depth <= 0)
        return OTE_ERR_INVALID;
    ote_status_t st;
    if (ote_fault_hit("cq.lane_create", &st)) return st;
    ote_cq_lane_t *lane = ote_calloc(1, sizeof(*lane));
    if (lane == NULL) return OTE_ERR_NOMEM;
    lane->ctx = ctx;
    lane->v = ote_context_verbs(ctx);
    lane->index = cfg->index;
    lane->next_ns = 1;
    if ((st = ote_mutex_init(&lane->poll_mu)) != OTE_OK) goto err_free;
    if ((st = ote_mutex_init(&lane->table_mu)) != OTE_OK) goto err_poll_mu;
    if ((st = ote_mutex_init(&lane->progress_mu)) != OTE_OK) goto err_table_mu;
    if ((st = ote_cond_init(&lane->progress_cv)) != OTE_OK) goto err_progress_mu;

    lane->use_channel = cfg->use_channel != 0;
    if (cfg->use_channel && (st = create_channel(lane)) != OTE_OK) goto err_cond;
    lane->depth[0] = cfg->send_depth;
    lane->depth[1] = cfg->recv_depth;
    if ((st = create_cqs(lane)) != OTE_OK) goto err_natives;
    st = ote_context_set_add_listener(ote_context_owner(ctx), lane_listener, lane,
                                      &lane->listener_id);
    if (st != OTE_OK) goto err_natives;
    lane->listener_added = 1;
    OTE_DEBUG("cq", "lane %u on %s: send CQ %u, recv CQ %u CQEs%s", lane->index,
              ote_context_name(ctx), lane->capacity[0], lane->capacity[1],
              lane->channel != NULL ? ", channel" : "");
    *lane_out = lane;
    return OTE_OK;

err_natives:
    if (destroy_natives(lane) != OTE_OK) {
        /* Objects made moments ago that the provider will not destroy: they stay
         * counted in the context; the lane memory is kept with them. */
        OTE_ERROR("cq", "lane %u on %s: unwinding a failed create retained native objects",
                  cfg->index, ote_context_name(ctx));
        return st;
    }
err_cond:
    ote_cond_destroy(&lane->progress_cv);
err_progress_mu:
    ote_mutex_destroy(&lane->progress_mu);
err_table_mu:
    ote_mutex_destroy(&lane->table_mu);
err_poll_mu:
    ote_mutex_destroy(&lane->poll_mu);
err_free:
    ote_free(lane);
    return st;
}

ote_status_t ote_cq_lane_destroy(ote_cq_lane_t *lane) {
    if (lane == NULL) return OTE_OK;
    ote_mutex_lock(&lane->table_mu);
    if (lane->attached > 0) {
        uint32_t n = lane->attached;
        ote_mutex_unlock(&lane->table_mu);
        OTE_WARN("cq", "lane %u on %s: destroy refused, %u QP(s) still attached", lane->index,
                 ote_context_name(lane->ctx), n);
        return OTE_ERR_BUSY;
    }
    if (lane->in_workers) {
        ote_mutex_unlock(&lane->table_mu);
        OTE_WARN("cq", "lane %u on %s: destroy refused, still polled by workers", lane->index,
                 ote_context_name(lane->ctx));
        return OTE_ERR_BUSY;
    }
    lane->closing = 1;
    ote_mutex_unlock(&lane->table_mu);
    if (lane->listener_added) {
        ote_context_set_remove_listener(ote_context_owner(lane->ctx), lane->listener_id);
        lane->listener_added = 0;
    }
    ote__cq_lane_poll_lock(lane);
    ote_status_t st = destroy_natives(lane);
    ote__cq_lane_poll_unlock(lane);
    if (st != OTE_OK) return st;
    free_lane(lane);
    return OTE_OK;
}

ote_context_t *ote_cq_lane_context(const ote_cq_lane_t *lane) { return lane->ctx; }
uint32_t ote_cq_lane_index(const ote_cq_lane_t *lane) { return lane->index; }
struct ibv_cq *ote_cq_lane_native_cq(const ote_cq_lane_t *lane, ote_cq_dir_t dir) {
    ote_cq_lane_t *l = (ote_cq_lane_t *)lane;
    ote_mutex_lock(&l->table_mu);
    struct ibv_cq *cq = l->cq[dir == OTE_CQ_RECV];
    ote_mutex_unlock(&l->table_mu);
    return cq;
}
uint32_t ote_cq_lane_capacity(const ote_cq_lane_t *lane, ote_cq_dir_t dir) {
    ote_cq_lane_t *l = (ote_cq_lane_t *)lane;
    ote_mutex_lock(&l->table_mu);
    uint32_t c = l->capacity[dir == OTE_CQ_RECV];
    ote_mutex_unlock(&l->table_mu);
    return c;
}

ote_status_t ote_cq_lane_pin(ote_cq_lane_t *lane, struct ibv_cq *cqs_out[2]) {
    ote_status_t st = OTE_OK;
    ote_mutex_lock(&lane->table_mu);
    if (lane->closing) st = OTE_ERR_STATE;
    else if (atomic_load(&lane->state) != OTE_CQ_LANE_HEALTHY) st = lane->fault;
    if (st == OTE_OK) {
        lane->pins++;
        cqs_out[0] = lane->cq[0];
        cqs_out[1] = lane->cq[1];
    }
    ote_mutex_unlock(&lane->table_mu);
    return st;
}

void ote_cq_lane_unpin(ote_cq_lane_t *lane) {
    ote_mutex_lock(&lane->table_mu);
    if (lane->pins > 0) lane->pins--;
    ote_mutex_unlock(&lane->table_mu);
}
int ote_cq_lane_channel_fd(const ote_cq_lane_t *lane) {
    return lane->channel != NULL ? lane->channel->fd : -1;
}

ote_status_t ote_cq_lane_register_ns(ote_cq_lane_t *lane, ote_cq_record_fn fn, void *arg,
                                     uint32_t *ns_out) {
    if (lane == NULL || fn == NULL || ns_out == NULL) return OTE_ERR_INVALID;
    lane_ns_t *n = ote_calloc(1, sizeof(*n));
    if (n == NULL) return OTE_ERR_NOMEM;
    n->fn = fn;
    n->arg = arg;
    ote_status_t st;
    ote_mutex_lock(&lane->table_mu);
    if (lane->next_ns > NS_MAX) {
        st = OTE_ERR_AGAIN; /* namespace ids exhausted: replace the lane */
    } else {
        n->ns = lane->next_ns;
        OTE_HASH_ADD(hh, lane->namespaces, ns, sizeof(uint32_t), n, st);
        if (st == OTE_OK) lane->next_ns++;
    }
    ote_mutex_unlock(&lane->table_mu);
    if (st != OTE_OK) {
        ote_free(n);
        return st;
    }
    *ns_out = n->ns;
    return OTE_OK;
}

void ote_cq_lane_unregister_ns(ote_cq_lane_t *lane, uint32_t ns) {
    int self = tls_polling == lane;
    if (!self) ote__cq_lane_poll_lock(lane);
    ote_mutex_lock(&lane->table_mu);
    lane_ns_t *n = NULL;
    HASH_FIND(hh, lane->namespaces, &ns, sizeof(uint32_t), n);
    if (n != NULL) HASH_DEL(lane->namespaces, n);
    ote_mutex_unlock(&lane->table_mu);
    if (!self) ote__cq_lane_poll_unlock(lane);
    ote_free(n);
}

void ote_cq_lane_share_ns(ote_cq_lane_t *lane, uint32_t ns) {
    ote_mutex_lock(&lane->table_mu);
    lane_ns_t *n = NULL;
    HASH_FIND(hh, lane->namespaces, &ns, sizeof(uint32_t), n);
    if (n != NULL) n->shared = 1;
    ote_mutex_unlock(&lane->table_mu);
}

ote_status_t ote_cq_lane_attach_qp(ote_cq_lane_t *lane, uint32_t qp_num, ote_cq_qp_hook_fn fn,
                                   void *arg) {
    if (lane == NULL || fn == NULL) return OTE_ERR_INVALID;
    lane_hook_t *h = ote_calloc(1, sizeof(*h));
    if (h == NULL) return OTE_ERR_NOMEM;
    h->qp_num = qp_num;
    h->fn = fn;
    h->arg = arg;
    ote_status_t st = OTE_OK;
    ote_mutex_lock(&lane->table_mu);
    lane_hook_t *old = NULL;
    HASH_FIND(hh, lane->hooks, &qp_num, sizeof(uint32_t), old);
    if (old != NULL) st = OTE_ERR_EXISTS;
    else if (lane->closing) st = OTE_ERR_STATE;
    else if (atomic_load(&lane->state) != OTE_CQ_LANE_HEALTHY) st = lane->fault;
    else OTE_HASH_ADD(hh, lane->hooks, qp_num, sizeof(uint32_t), h, st);
    if (st == OTE_OK) lane->attached++;
    ote_mutex_unlock(&lane->table_mu);
    if (st != OTE_OK) ote_free(h);
    return st;
}

void ote_cq_lane_detach_qp(ote_cq_lane_t *lane, uint32_t qp_num) {
    int self = tls_polling == lane;
    if (!self) ote__cq_lane_poll_lock(lane);
    ote_mutex_lock(&lane->table_mu);
    lane_hook_t *h = NULL;
    HASH_FIND(hh, lane->hooks, &qp_num, sizeof(uint32_t), h);
    if (h != NULL) {
        HASH_DEL(lane->hooks, h);
        lane->attached--;
    }
    ote_mutex_unlock(&lane->table_mu);
    if (!self) ote__cq_lane_poll_unlock(lane);
    ote_free(h);
}

int ote_cq_lane_deliver(ote_cq_lane_t *lane, ote_cq_dir_t dir, const struct ibv_wc *wc) {
    uint32_t ns = OTE_CQ_WR_NS(wc->wr_id);
    ote_cq_record_fn fn = NULL;
    void *arg = NULL;
    ote_mutex_lock(&lane->table_mu);
    lane_ns_t *n = NULL;
    HASH_FIND(hh, lane->namespaces, &ns, sizeof(uint32_t), n);
    if (n != NULL) {
        fn = n->fn;
        arg = n->arg;
    }
    ote_mutex_unlock(&lane->table_mu);
    if (fn == NULL) {
        atomic_fetch_add(&lane->stray, 1);
        OTE_DEBUG("cq", "lane %u: stray %s CQE wr_id 0x%llx qp %u status %d", lane->index,
                  dir == OTE_CQ_SEND ? "send" : "recv", (unsigned long long)wc->wr_id, wc->qp_num,
                  (int)wc->status);
        return 0;
    }
    /* Callbacks run under the poll lock: take it when called from outside a poll. */
    int self = tls_polling == lane;
    if (!self) ote__cq_lane_poll_lock(lane);
    fn(arg, lane, dir, wc);
    if (!self) ote__cq_lane_poll_unlock(lane);
    return 1;
}

static void dispatch(ote_cq_lane_t *lane, ote_cq_dir_t dir, const struct ibv_wc *wc) {
    atomic_fetch_add(&lane->completions, 1);
    if (wc->status != IBV_WC_SUCCESS) atomic_fetch_add(&lane->errors, 1);
    ote_cq_qp_hook_fn fn = NULL;
    void *arg = NULL;
    ote_mutex_lock(&lane->table_mu);
    lane_hook_t *h = NULL;
    uint32_t qpn = wc->qp_num;
    HASH_FIND(hh, lane->hooks, &qpn, sizeof(uint32_t), h);
    int shared = 0;
    if (h != NULL) {
        fn = h->fn;
        arg = h->arg;
    } else { /* a shared namespace (ote_cq_lane_share_ns) takes it all the same */
        uint32_t ns = OTE_CQ_WR_NS(wc->wr_id);
        lane_ns_t *n = NULL;
        HASH_FIND(hh, lane->namespaces, &ns, sizeof(uint32_t), n);
        shared = n != NULL && n->shared;
    }
    ote_mutex_unlock(&lane->table_mu);
    if (fn == NULL && shared) {
        ote_cq_lane_deliver(lane, dir, wc);
        return;
    }
    if (fn == NULL) {
        /* No owner for this QP number (a QP destroyed with CQEs still queued): stray. */
        atomic_fetch_add(&lane->stray, 1);
        OTE_DEBUG("cq", "lane %u: CQE of unattached QP %u dropped (wr_id 0x%llx)", lane->index,
                  wc->qp_num, (unsigned long long)wc->wr_id);
        return;
    }
    if (!fn(arg, lane, dir, wc)) return;
    ote_cq_lane_deliver(lane, dir, wc);
}

/* Both CQs are polled before anything is dispatched: when one fails (a lane error) the
 * lane is FAULTED before the other's CQEs (the flushes of QPs its error moved to ERR)
 * reach their records, which then see the lane's cause. */
int ote__cq_lane_poll_locked(ote_cq_lane_t *lane) {
    if (lane->closing) return 0;
    ote_verbs_t *v = lane->v;
    struct ibv_wc wc[2][POLL_BATCH];
    int got[2] = {0, 0}, failed = 0;
    for (int d = 0; d < 2; d++) {
        if (lane->cq[d] == NULL) continue; /* a replacement that failed: none to poll */
        int n = v->ops->poll_cq(v, lane->cq[d], POLL_BATCH, wc[d]);
        if (n >= 0) {
            got[d] = n;
            continue;
        }
        atomic_fetch_add(&lane->poll_failures, 1);
        /* A lane error: the lane is fenced and replaced (logged once, at the fault). */
        if (atomic_load(&lane->state) == OTE_CQ_LANE_HEALTHY)
            OTE_WARN("cq", "lane %u on %s: poll_cq(%s) failed: errno %d", lane->index,
                     ote_context_name(lane->ctx), d == 0 ? "send" : "recv", -n);
        ote_cq_lane_fault(lane, ote_status_make(OTE_ERR_FENCED, -n));
        if (failed == 0) failed = n;
    }
    for (int d = 0; d < 2; d++)
        for (int i = 0; i < got[d]; i++) dispatch(lane, (ote_cq_dir_t)d, &wc[d][i]);
    int total = got[0] + got[1];
    return total > 0 || failed == 0 ? total : failed;
}

/* Arm and consume take the poll lock: a replacement swaps the CQs under it. */
int ote__cq_lane_arm(ote_cq_lane_t *lane) {
    if (lane->channel == NULL || lane->closing) return 0;
    int err = 0;
    ote__cq_lane_poll_lock(lane);
    for (int d = 0; d < 2 && err == 0; d++)
        if (lane->cq[d] != NULL) err = lane->v->ops->req_notify_cq(lane->v, lane->cq[d], 0);
    ote__cq_lane_poll_unlock(lane);
    return err;
}

static void consume_events_locked(ote_cq_lane_t *lane) {
    if (lane->channel == NULL || lane->closing) return;
    /* Every event is acked before this returns, one ack per CQ (an ack takes the
     * provider's lock: rdma-core batches them the same way). */
    struct ibv_cq *cqs[4] = {NULL};
    unsigned int counts[4] = {0};
    int ncq = 0;
    for (int i = 0; i < 64; i++) {
        struct ibv_cq *cq = NULL;
        void *cq_ctx = NULL;
        if (lane->v->ops->get_cq_event(lane->v, lane->channel, &cq, &cq_ctx) != 0) break;
        int k = 0;
        while (k < ncq && cqs[k] != cq) k++;
        if (k == 4) { /* a fifth CQ on one channel: never so far; ack the rest now */
            for (k = 0; k < ncq; k++) lane->v->ops->ack_cq_events(lane->v, cqs[k], counts[k]);
            ncq = 0;
            k = 0;
        }
        if (k == ncq) {
            cqs[ncq] = cq;
            counts[ncq++] = 0;
        }
        counts[k]++;
    }
    for (int k = 0; k < ncq; k++) lane->v->ops->ack_cq_events(lane->v, cqs[k], counts[k]);
}

void ote__cq_lane_consume_events(ote_cq_lane_t *lane) {
    if (lane->channel == NULL || lane->closing) return;
    ote__cq_lane_poll_lock(lane);
    consume_events_locked(lane);
    ote__cq_lane_poll_unlock(lane);
}

ote_status_t ote_cq_lane_reserve(ote_cq_lane_t *lane, ote_cq_dir_t dir, uint32_t n) {
    int d = dir == OTE_CQ_RECV;
    ote_status_t st = OTE_OK;
    ote_mutex_lock(&lane->table_mu);
    if (lane->closing) st = OTE_ERR_STATE;
    else if ((uint64_t)lane->outstanding[d] + n > lane->capacity[d]) st = OTE_ERR_AGAIN;
    else lane->outstanding[d] += n;
    ote_mutex_unlock(&lane->table_mu);
    return st;
}

void ote_cq_lane_release(ote_cq_lane_t *lane, ote_cq_dir_t dir, uint32_t n) {
    int d = dir == OTE_CQ_RECV;
    ote_mutex_lock(&lane->table_mu);
    if (n > lane->outstanding[d]) {
        OTE_ERROR("cq", "lane %u: releasing %u %s charges, only %u outstanding", lane->index, n,
                  d ? "recv" : "send", lane->outstanding[d]);
        n = lane->outstanding[d];
    }
    lane->outstanding[d] -= n;
    ote_mutex_unlock(&lane->table_mu);
    notify_progress(lane);
}

uint32_t ote_cq_lane_outstanding(const ote_cq_lane_t *lane, ote_cq_dir_t dir) {
    ote_cq_lane_t *l = (ote_cq_lane_t *)lane;
    ote_mutex_lock(&l->table_mu);
    uint32_t n = l->outstanding[dir == OTE_CQ_RECV];
    ote_mutex_unlock(&l->table_mu);
    return n;
}

ote_status_t ote_cq_lane_poll(ote_cq_lane_t *lane, int *polled_out) {
    if (tls_polling == lane) return OTE_ERR_BUSY; /* from a callback of this lane */
    if (ote_mutex_trylock(&lane->poll_mu) != OTE_OK) return OTE_ERR_BUSY;
    tls_polling = lane;
    int n = ote__cq_lane_poll_locked(lane);
    ote__cq_lane_poll_unlock(lane);
    if (n > 0) notify_progress(lane);
    if (n < 0) return ote_status_make(OTE_ERR_NATIVE, -n);
    if (polled_out != NULL) *polled_out = n;
    return OTE_OK;
}

/* A hook can settle what pred reads (a QP's outstanding count) before the same CQE is
 * delivered to its namespace: wait until the poll under way, if any, has finished
 * dispatching its batch, so that every completion that made pred true has been
 * delivered. From a callback of this lane the caller is that poll: nothing to wait for. */
static ote_status_t delivery_barrier(ote_cq_lane_t *lane, ote_deadline_t deadline) {
    if (tls_polling == lane) return OTE_OK;
    for (;;) {
        ote_mutex_lock(&lane->progress_mu);
        uint64_t epoch = lane->progress_epoch;
        ote_mutex_unlock(&lane->progress_mu);
        if (ote_mutex_trylock(&lane->poll_mu) == OTE_OK) {
            ote_mutex_unlock(&lane->poll_mu);
            return OTE_OK;
        }
        if (ote_deadline_expired(deadline)) return OTE_ERR_TIMEOUT;
        ote_deadline_t until =
            ote_deadline_min(deadline, ote_deadline_after(100 * OTE_NSEC_PER_USEC));
        ote_mutex_lock(&lane->progress_mu);
        while (lane->progress_epoch == epoch && !ote_deadline_expired(until))
            (void)ote_cond_wait(&lane->progress_cv, &lane->progress_mu, until);
        ote_mutex_unlock(&lane->progress_mu);
    }
}

ote_status_t ote_cq_lane_progress(ote_cq_lane_t *lane, int (*pred)(void *arg), void *arg,
                                  ote_deadline_t deadline) {
    for (;;) {
        if (pred(arg)) return delivery_barrier(lane, deadline);
        if (ote_deadline_expired(deadline))
            return pred(arg) ? delivery_barrier(lane, deadline) : OTE_ERR_TIMEOUT;
        ote_mutex_lock(&lane->progress_mu);
        uint64_t epoch = lane->progress_epoch;
        ote_mutex_unlock(&lane->progress_mu);
        int polled = 0;
        ote_status_t st = ote_cq_lane_poll(lane, &polled);
        if (st != OTE_OK && ote_status_code(st) != OTE_ERR_BUSY) return st;
        if (polled > 0) continue;
        /* Nothing here now: wait for another poller's progress or a short backoff. */
        ote_deadline_t until = ote_deadline_min(
            deadline,
            ote_deadline_after(st == OTE_OK ? 100 * OTE_NSEC_PER_USEC : OTE_NSEC_PER_MSEC));
        ote_mutex_lock(&lane->progress_mu);
        while (lane->progress_epoch == epoch && !ote_deadline_expired(until))
            (void)ote_cond_wait(&lane->progress_cv, &lane->progress_mu, until);
        ote_mutex_unlock(&lane->progress_mu);
    }
}

static int lane_drained(void *arg) {
    ote_cq_lane_t *lane = arg;
    return ote_cq_lane_outstanding(lane, OTE_CQ_SEND) == 0 &&
           ote_cq_lane_outstanding(lane, OTE_CQ_RECV) == 0;
}

ote_status_t ote_cq_lane_drain(ote_cq_lane_t *lane, ote_deadline_t deadline) {
    ote_status_t st = ote_cq_lane_progress(lane, lane_drained, lane, deadline);
    if (ote_status_code(st) == OTE_ERR_TIMEOUT)
        OTE_WARN("cq", "lane %u on %s: drain deadline passed with %u send / %u recv CQEs owed",
                 lane->index, ote_context_name(lane->ctx),
                 ote_cq_lane_outstanding(lane, OTE_CQ_SEND),
                 ote_cq_lane_outstanding(lane, OTE_CQ_RECV));
    return st;
}

void ote_cq_lane_get_stats(const ote_cq_lane_t *lane, ote_cq_lane_stats_t *s) {
    ote_cq_lane_t *l = (ote_cq_lane_t *)lane;
    s->completions = atomic_load(&l->completions);
    s->errors = atomic_load(&l->errors);
    s->stray = atomic_load(&l->stray);
    s->poll_failures = atomic_load(&l->poll_failures);
    s->replacements = atomic_load(&l->generation);
}

/* Destroy the old CQs (the channel stays), create new ones, under the poll lock. */
static ote_status_t replace_cqs(ote_cq_lane_t *lane) {
    ote__cq_lane_poll_lock(lane);
    consume_events_locked(lane); /* a CQ's destroy waits until its events are acked */
    ote_status_t st = OTE_OK;
    ote_verbs_t *v = lane->v;
    for (int d = 0; d < 2 && st == OTE_OK; d++) {
        if (lane->cq[d] == NULL) continue;
        int err = v->ops->destroy_cq(v, lane->cq[d]);
        if (err != 0) {
            if (!lane->retained[d]) {
                lane->retained[d] = 1;
                ote_context_retained_add(lane->ctx, OTE_RETAINED_CQ, 1);
            }
            OTE_WARN("cq", "lane %u on %s: destroy of the faulted %s CQ failed: errno %d; retained",
                     lane->index, ote_context_name(lane->ctx), d == 0 ? "send" : "receive", err);
            st = ote_status_make(OTE_ERR_RETAINED, err);
            break;
        }
        ote_mutex_lock(&lane->table_mu);
        lane->cq[d] = NULL;
        ote_mutex_unlock(&lane->table_mu);
        if (lane->retained[d]) {
            lane->retained[d] = 0;
            ote_context_retained_add(lane->ctx, OTE_RETAINED_CQ, -1);
        }
    }
    if (st == OTE_OK) {
        ote_mutex_lock(&lane->table_mu); /* the listener compares event CQs with these */
        /* After an unbind (a reopened context) the channel is made anew too. */
        if (lane->use_channel && lane->channel == NULL) st = create_channel(lane);
        if (st == OTE_OK) st = create_cqs(lane);
        if (st == OTE_OK) {
            lane->fault = OTE_OK;
            atomic_store(&lane->state, OTE_CQ_LANE_HEALTHY);
            atomic_fetch_add(&lane->generation, 1);
        }
        ote_mutex_unlock(&lane->table_mu);
        /* A worker asleep on the channel armed the old CQs: arm the new ones now, so
         * their first CQE wakes it. */
        for (int d = 0; d < 2 && st == OTE_OK && lane->channel != NULL; d++)
            (void)v->ops->req_notify_cq(v, lane->cq[d], 0);
    }
    ote__cq_lane_poll_unlock(lane);
    return st;
}

ote_status_t ote_cq_lane_replace(ote_cq_lane_t *lane) {
    if (lane == NULL) return OTE_ERR_INVALID;
    ote_mutex_lock(&lane->table_mu);
    ote_status_t st = OTE_OK;
    if (atomic_load(&lane->state) == OTE_CQ_LANE_HEALTHY) st = OTE_OK;
    else if (lane->closing) st = OTE_ERR_STATE;
    else if (lane->attached > 0 || lane->pins > 0) st = OTE_ERR_BUSY;
    int go = st == OTE_OK && atomic_load(&lane->state) != OTE_CQ_LANE_HEALTHY;
    ote_mutex_unlock(&lane->table_mu);
    if (!go) return st;
    st = replace_cqs(lane);
    if (st == OTE_OK)
        OTE_INFO("cq", "lane %u on %s: CQs replaced after a lane error (replacement %llu)",
                 lane->index, ote_context_name(lane->ctx),
                 (unsigned long long)atomic_load(&lane->generation));
    notify_progress(lane);
    return st;
}

ote_status_t ote_cq_lane_unbind(ote_cq_lane_t *lane) {
    if (lane == NULL) return OTE_ERR_INVALID;
    ote_mutex_lock(&lane->table_mu);
    ote_status_t st = OTE_OK;
    if (atomic_load(&lane->state) == OTE_CQ_LANE_HEALTHY || lane->closing) st = OTE_ERR_STATE;
    else if (lane->attached > 0 || lane->pins > 0) st = OTE_ERR_BUSY;
    else if (lane->in_workers) st = OTE_ERR_BUSY;
    ote_mutex_unlock(&lane->table_mu);
    if (st != OTE_OK) return st;
    ote__cq_lane_poll_lock(lane);
    consume_events_locked(lane); /* a CQ's destroy waits until its events are acked */
    ote_mutex_lock(&lane->table_mu);
    st = destroy_natives(lane);
    ote_mutex_unlock(&lane->table_mu);
    ote__cq_lane_poll_unlock(lane);
    if (st == OTE_OK)
        OTE_INFO("cq", "lane %u on %s: CQs and channel destroyed for a reopen of the device",
                 lane->index, ote_context_name(lane->ctx));
    return st;
}

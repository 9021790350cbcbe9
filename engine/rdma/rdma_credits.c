/*
 * engine/rdma/rdma_credits.c - grant credits reserved per request, retries of grants a
 * source refused AGAIN, and the engine-wide QP limit (rdma_credits.h).
 */
#include "engine/rdma/rdma_credits.h"

#include "engine/rdma/rdma_src_parents.h"

#include <stdint.h>
#include <string.h>

#include "base/alloc.h"
#include "base/lock.h"
#include "base/log.h"

/* A request's reservation: its slices attached here at submit, its budget once its first
 * run took a credit. Under the credits' mutex. */
typedef struct parent {
    struct parent *next;
    rdma_tp_t *tp;
    const ote__tpeer_t *peer;
    uint64_t uid;     /* the engine's request id at submit */
    uint64_t req_len; /* the request's bytes */
    uint64_t left;    /* bytes of its attached slices not yet ended */
    uint32_t budget;  /* credits reserved (0: none yet) */
    uint32_t live;    /* runs holding one of them */
    uint64_t id;      /* nonzero, unique in this engine: named to sources (proto.h) */
} parent_t;

struct rdma_credits {
    ote_mutex_t mu;
    parent_t *parents;
    uint32_t reserved;
    uint64_t reserved_peak, nparents;
    uint64_t next_id;    /* the last parent id given */
    _Atomic int waiting; /* a queue waits for credits: a return kicks the pump thread */
    _Atomic uint64_t live, live_peak, waits, busy_retries, qp_waits, qp_evictions;
    /* rdma_srcqp.c: source CONNECT builds under rdma_max_qps, one at a time (build_mu,
     * taken by no other code and nothing under it but the endpoint stores and the grant
     * managers); the most QPs held right after a build; source QPs retired for a CONNECT
     * and CONNECTs refused AGAIN at the limit. */
    ote_mutex_t build_mu;
    ote_sq_pool_t *sq; /* rdma_max_send_wrs: send credits of every QP (NULL: none) */
    _Atomic uint64_t qps_peak, src_qp_evictions, src_qp_refusals;
    /* Requester builds that passed the limit under build_mu and are under way: counted
     * with the QPs held, so that a source CONNECT meanwhile cannot take their room. */
    _Atomic uint64_t pending;
};

ote_status_t ote__rdma_credits_create(rdma_tp_t *tp) {
    rdma_credits_t *c = ote_calloc(1, sizeof(*c));
    if (c == NULL) return OTE_ERR_NOMEM;
    if (tp->cfg.rdma_max_send_wrs != 0) {
        ote_status_t st = ote_sq_pool_create(tp->cfg.rdma_max_send_wrs, &c->sq);
        if (st != OTE_OK) {
            ote_free(c);
            return st;
        }
    }
    ote_mutex_init(&c->mu);
    ote_mutex_init(&c->build_mu);
    /* The source's reservations of whole parents live as long (rdma_src_parents.c). */
    ote_status_t st = ote__rdma_sp_create(tp);
    if (st != OTE_OK) {
        ote_mutex_destroy(&c->mu);
        ote_mutex_destroy(&c->build_mu);
        if (c->sq != NULL) ote_sq_pool_destroy(c->sq);
        ote_free(c);
        return st;
    }
    tp->cred = c;
    return OTE_OK;
}

void ote__rdma_credits_destroy(rdma_tp_t *tp) {
    rdma_credits_t *c = tp->cred;
    if (c == NULL) return;
    ote__rdma_sp_destroy(tp);
    /* Every slice ended before the transport is destroyed: no parent is left. */
    while (c->parents != NULL) {
        parent_t *x = c->parents;
        c->parents = x->next;
        ote_free(x);
    }
    ote_mutex_destroy(&c->mu);
    ote_mutex_destroy(&c->build_mu);
    if (c->sq != NULL) ote_sq_pool_destroy(c->sq); /* every QP was destroyed */
    ote_free(c);
    tp->cred = NULL;
}

ote_status_t ote__rdma_parent_attach(ote__tpeer_t *p, ote__slice_t *s) {
    rdma_tp_t *tp = p->tp;
    rdma_credits_t *c = tp->cred;
    ote__rdma_xp(s)->parent = NULL;
    ote__rdma_xp(s)->credit = 0;
    if (tp->cfg.rdma_max_grants == 0) return OTE_OK;
    ote_mutex_lock(&c->mu);
    parent_t *x = c->parents;
    /* A slice joins its request's parent while that has reserved nothing yet; one that
     * comes after the reservation (a later submit of the same request) starts a parent of
     * its own, so that no reservation waits on slices queued behind another request. */
    while (x != NULL &&
           !(x->uid == s->req_uid && x->peer == p && s->req_uid != 0 && x->budget == 0))
        x = x->next;
    if (x == NULL) {
        x = ote_calloc(1, sizeof(*x));
        if (x == NULL) {
            ote_mutex_unlock(&c->mu);
            return OTE_ERR_NOMEM;
        }
        x->tp = tp;
        x->peer = p;
        x->uid = s->req_uid;
        x->req_len = s->req_len != 0 ? s->req_len : s->len;
        x->id = ++c->next_id;
        x->next = c->parents;
        c->parents = x;
        c->nparents++;
    }
    x->left += s->len;
    ote_mutex_unlock(&c->mu);
    ote__rdma_xp(s)->parent = x;
    return OTE_OK;
}

/* Wake the pump thread when a queue waits for what was just returned. */
static void returned(rdma_tp_t *tp) {
    if (atomic_exchange(&tp->cred->waiting, 0)) ote__rdma_pump_kick(tp);
}

void ote__rdma_parent_slice_end(ote__slice_t *s) {
    parent_t *x = ote__rdma_xp(s)->parent;
    if (x == NULL) return;
    ote__rdma_xp(s)->parent = NULL;
    rdma_tp_t *tp = x->tp;
    rdma_credits_t *c = tp->cred;
    int freed = 0;
    ote_mutex_lock(&c->mu);
    x->left -= x->left < s->len ? x->left : s->len;
    if (x->left == 0) {
        /* Every slice of it ended: no grant of it can be live. */
        parent_t **pp = &c->parents;
        while (*pp != NULL && *pp != x) pp = &(*pp)->next;
        if (*pp == x) *pp = x->next;
        c->reserved -= x->budget;
        c->nparents--;
        freed = x->budget != 0;
        ote_free(x);
    }
    ote_mutex_unlock(&c->mu);
    if (freed) returned(tp);
}

static void live_add(rdma_credits_t *c) {
    uint64_t now = atomic_fetch_add(&c->live, 1) + 1;
    uint64_t peak = atomic_load(&c->live_peak);
    while (now > peak && !atomic_compare_exchange_weak(&c->live_peak, &peak, now)) {}
}

int ote__rdma_grant_take(rdma_tp_t *tp, ote__slice_t *s, uint64_t rlen) {
    rdma_credits_t *c = tp->cred;
    parent_t *x = ote__rdma_xp(s)->parent;
    if (x == NULL) { /* no grant limit: counted only */
        ote__rdma_xp(s)->credit = 1;
        live_add(c);
        return 1;
    }
    int ok = 0;
    ote_mutex_lock(&c->mu);
    if (x->budget == 0) {
        /* The whole budget at once, or nothing: the grants the request needs at the size
         * of its first run, at most the pool. */
        uint64_t unit = rlen != 0 ? rlen : 1;
        uint64_t need = (x->req_len + unit - 1) / unit;
        uint32_t max = tp->cfg.rdma_max_grants;
        uint32_t want = need == 0 ? 1 : need > max ? max : (uint32_t)need;
        if (c->reserved + want <= max) {
            x->budget = want;
            c->reserved += want;
            if (c->reserved > c->reserved_peak) c->reserved_peak = c->reserved;
        }
    }
    if (x->budget != 0 && x->live < x->budget) {
        x->live++;
        ok = 1;
    }
    if (!ok) atomic_store(&c->waiting, 1);
    ote_mutex_unlock(&c->mu);
    if (!ok) {
        atomic_fetch_add(&c->waits, 1);
        return 0;
    }
    ote__rdma_xp(s)->credit = 1;
    live_add(c);
    return 1;
}

int ote__rdma_grant_put(rdma_tp_t *tp, ote__slice_t *s) {
    rdma_credits_t *c = tp->cred;
    if (!ote__rdma_xp(s)->credit) return 0;
    ote__rdma_xp(s)->credit = 0;
    atomic_fetch_sub(&c->live, 1);
    parent_t *x = ote__rdma_xp(s)->parent;
    if (x == NULL) return 0;
    ote_mutex_lock(&c->mu);
    if (x->live > 0) x->live--;
    ote_mutex_unlock(&c->mu);
    return atomic_exchange(&c->waiting, 0);
}

int ote__rdma_parent_wire(const ote__slice_t *s, uint64_t *id_out, uint32_t *budget_out) {
    const parent_t *x = ote__rdma_cxp(s)->parent;
    if (x == NULL) return 0;
    rdma_credits_t *c = x->tp->cred;
    ote_mutex_lock(&c->mu);
    uint32_t budget = x->budget;
    uint64_t id = x->id;
    ote_mutex_unlock(&c->mu);
    if (budget == 0) return 0;
    *id_out = id;
    *budget_out = budget;
    return 1;
}

int ote__rdma_busy_may_retry(rdma_tp_t *tp, const ote__slice_t *s, ote_status_t st) {
    if (st != OTE__RDMA_SRC_BUSY || ote_deadline_expired(s->deadline)) return 0;
    if (s->canceled != NULL && atomic_load(s->canceled)) return 0;
    atomic_fetch_add(&tp->cred->busy_retries, 1);
    return 1;
}

static uint64_t qps_held(rdma_tp_t *tp) {
    uint64_t n = 0;
    for (uint32_t i = 0; i < tp->nnics; i++) {
        ote_endpoint_stats_t es;
        ote_endpoint_store_stats(tp->nics[i].eps, &es);
        n += es.qps;
        if (tp->nics[i].deps == NULL) continue; /* source direct QPs (rdma_direct.c) */
        ote_endpoint_store_stats(tp->nics[i].deps, &es);
        n += es.qps;
    }
    return n;
}

void ote__rdma_qps_note(rdma_tp_t *tp) {
    uint64_t now = qps_held(tp);
    uint64_t peak = atomic_load(&tp->cred->qps_peak);
    while (now > peak && !atomic_compare_exchange_weak(&tp->cred->qps_peak, &peak, now)) {}
}

ote_sq_pool_t *ote__rdma_sq_pool(rdma_tp_t *tp) { return tp->cred->sq; }

void ote__rdma_src_build_lock(rdma_tp_t *tp) { ote_mutex_lock(&tp->cred->build_mu); }
void ote__rdma_src_build_unlock(rdma_tp_t *tp) { ote_mutex_unlock(&tp->cred->build_mu); }
void ote__rdma_src_qp_count(rdma_tp_t *tp, int evicted) {
    atomic_fetch_add(evicted ? &tp->cred->src_qp_evictions : &tp->cred->src_qp_refusals, 1);
}

int ote__rdma_qps_full(rdma_tp_t *tp) {
    return tp->cfg.rdma_max_qps != 0 &&
           qps_held(tp) + atomic_load(&tp->cred->pending) >= tp->cfg.rdma_max_qps;
}

/* Retire one idle READY requester QP (a slot nobody borrows) of any peer, plain or direct
 * endpoint (caps 2, 3: rdma_direct.c); its device index, or -1 when every QP is in use.
 * Under tp->mu and each p->mu in turn. */
static int retire_idle(rdma_tp_t *tp) {
    int found = -1;
    ote_mutex_lock(&tp->mu);
    for (ote__tpeer_t *p = tp->peers; p != NULL && found < 0; p = p->tp_next) {
        ote_mutex_lock(&p->mu);
        for (uint32_t k = 0; k < tp->nnics && found < 0; k++) {
            for (int e = 0; e < OTE__RDMA_EPS && found < 0; e++) {
                ote_endpoint_t *ep = p->conn.ep[k][e];
                if (ep == NULL) continue;
                for (uint32_t i = 0; i < ote_endpoint_width(ep) && found < 0; i++) {
                    if (ote_endpoint_users(ep, i) != 0) continue;
                    ote_qp_t *qp = NULL;
                    if (ote_endpoint_borrow_ready(ep, i, 0, &qp) != OTE_OK) continue;
                    if (ote_endpoint_users(ep, i) == 1) {
                        ote_endpoint_retire(ep, i, qp);
                        found = (int)k;
                    }
                    ote_endpoint_return(ep, i, qp);
                }
            }
        }
        ote_mutex_unlock(&p->mu);
    }
    ote_mutex_unlock(&tp->mu);
    return found;
}

uint32_t ote__rdma_qp_mask(rdma_tp_t *tp, ote__tpeer_t *p, const ote__slice_t *s, uint32_t mask) {
    if (!ote__rdma_qps_full(tp)) return mask;
    uint32_t cap = ote__rdma_run_cap(s), ready = 0;
    for (uint32_t i = 0; i < tp->nnics; i++) {
        /* The endpoint the run would use on device i (rdma_pairing.c; p->mu held). */
        ote_endpoint_t *ep = p->conn.ep[i][OTE__RDMA_EPI(ote__rdma_pair_dev_locked(p, s, i), cap)];
        if ((mask & (1u << i)) && ep != NULL && ote_endpoint_ready_count(ep) > 0) ready |= 1u << i;
    }
    return ready != 0 ? ready : mask;
}

int ote__rdma_qp_room(rdma_tp_t *tp, int retire) {
    rdma_credits_t *c = tp->cred;
    if (tp->cfg.rdma_max_qps == 0) return 1;
    /* Under the build mutex: a source CONNECT checks and builds under it too. */
    ote_mutex_lock(&c->build_mu);
    int ok = !ote__rdma_qps_full(tp);
    int k = ok || !retire ? -1 : retire_idle(tp);
    if (k >= 0) {
        atomic_fetch_add(&c->qp_evictions, 1);
        (void)ote_endpoint_store_reclaim(tp->nics[k].eps,
                                         ote_deadline_after(200 * OTE_NSEC_PER_MSEC), NULL);
        ok = !ote__rdma_qps_full(tp);
    }
    if (ok) atomic_fetch_add(&c->pending, 1);
    ote_mutex_unlock(&c->build_mu);
    if (!ok && retire) atomic_fetch_add(&c->qp_waits, 1);
    return ok;
}

void ote__rdma_qp_room_end(rdma_tp_t *tp) {
    if (tp->cfg.rdma_max_qps != 0) atomic_fetch_sub(&tp->cred->pending, 1);
}

void ote__rdma_credit_stats(rdma_tp_t *tp, rdma_credit_stats_t *out) {
    rdma_credits_t *c = tp->cred;
    memset(out, 0, sizeof(*out));
    ote_mutex_lock(&c->mu);
    out->reserved = c->reserved;
    out->reserved_peak = c->reserved_peak;
    out->parents = c->nparents;
    ote_mutex_unlock(&c->mu);
    out->grants_live = atomic_load(&c->live);
    out->grants_peak = atomic_load(&c->live_peak);
    out->grant_waits = atomic_load(&c->waits);
    out->busy_retries = atomic_load(&c->busy_retries);
    out->qp_waits = atomic_load(&c->qp_waits);
    out->qp_evictions = atomic_load(&c->qp_evictions);
    out->qps = qps_held(tp);
    out->qps_peak = atomic_load(&c->qps_peak);
    out->src_qp_evictions = atomic_load(&c->src_qp_evictions);
    out->src_qp_refusals = atomic_load(&c->src_qp_refusals);
    if (c->sq != NULL) {
        ote_sq_pool_stats_t ss;
        ote_sq_pool_get_stats(c->sq, &ss);
        out->sq_in_use = ss.in_use;
        out->sq_peak = ss.peak;
        out->sq_waits = ss.waits;
    }
}

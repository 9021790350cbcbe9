/*
 * endpoint/endpoint.c - endpoint store, fixed-width slot arrays, construction claims.
 *
 * One mutex per store guards the endpoint table and every slot; one condition variable
 * wakes waiters on any slot change. No lock is held across a native call, a peer
 * exchange or a QP destroy (which drives the lane and so runs completion callbacks
 * that may call ote_endpoint_return()/retire()).
 */
#include "endpoint/endpoint.h"

#include <string.h>

#include "base/alloc.h"
#include "base/hash.h"
#include "base/lock.h"
#include "base/log.h"
#include "context/context.h"
#include "verbs/verbs.h"

typedef enum { SLOT_EMPTY = 0, SLOT_BUILDING, SLOT_READY, SLOT_RETIRING } slot_state_t;

typedef struct {
    slot_state_t state;
    uint64_t token; /* owner of BUILDING (also a reclaimer's hold on RETIRING) */
    ote_qp_t *qp;   /* attached from creation until native destroy succeeds */
    uint32_t users; /* borrows outstanding */
    uint32_t remote_qpn;
    int destroy_failed; /* RETIRING after a failed native destroy */
    struct ibv_pd *pd;  /* private PD of the slot's QP (ote_endpoint_store_private_pd) */
    int pd_retained;    /* its dealloc failed: counted as OTE_RETAINED_PD */
} ep_slot_t;

struct ote_endpoint {
    ote_endpoint_store_t *store;
    ote_ep_key_t key;
    uint32_t width;
    uint32_t rr;
    ep_slot_t *slots;
    UT_hash_handle hh;
    /* Evicted (ote_endpoint_evict): out of the table, on the store's dying list until
     * every slot is EMPTY, nobody borrows or builds, and nobody waits in reserve. */
    int evicted;
    uint32_t waiters; /* threads inside ote_endpoint_reserve on this endpoint */
    struct ote_endpoint *dnext;
};

struct ote_endpoint_store {
    ote_context_t *ctx;
    ote_cq_lane_t **lanes;
    uint32_t nlanes;
    ote_qp_config_t qp_cfg;
    ote_mutex_t mu;
    ote_cond_t cv;
    ote_endpoint_t *eps;
    ote_endpoint_t *dying; /* evicted, not yet freed (linked by dnext) */
    uint64_t next_token;
    ote_endpoint_stats_t stats;
    int private_pd;                            /* every QP in a PD of its own */
    uint32_t create_flags[2][OTE_EP_MAX_CAPS]; /* [role][cap]: OTE_VERBS_QP_* added to qp_cfg's */
    struct ote_srq **srqs; /* slot i's QPs take their receives from srqs[i] (NULL: own) */
};

void ote_ep_key_make(ote_ep_key_t *key, uint64_t remote_process, uint64_t remote_pd,
                     uint32_t local_nic, uint32_t remote_nic, ote_ep_role_t role,
                     ote_ep_cap_t cap) {
    memset(key, 0, sizeof(*key));
    key->remote_process = remote_process;
    key->remote_pd = remote_pd;
    key->local_nic = local_nic;
    key->remote_nic = remote_nic;
    key->role = (uint32_t)role;
    key->cap = (uint32_t)cap;
}

ote_status_t ote_endpoint_store_create(ote_context_t *ctx, ote_cq_lane_t *const *lanes,
                                       uint32_t nlanes, const ote_qp_config_t *qp_cfg,
                                       ote_endpoint_store_t **store_out) {
    if (ctx == NULL || lanes == NULL || nlanes == 0 || qp_cfg == NULL || store_out == NULL)
        return OTE_ERR_INVALID;
    ote_endpoint_store_t *s = ote_calloc(1, sizeof(*s));
    if (s == NULL) return OTE_ERR_NOMEM;
    s->lanes = ote_calloc(nlanes, sizeof(*s->lanes));
    if (s->lanes == NULL) {
        ote_free(s);
        return OTE_ERR_NOMEM;
    }
    ote_status_t st = ote_mutex_init(&s->mu);
    if (st != OTE_OK) goto err_lanes;
    st = ote_cond_init(&s->cv);
    if (st != OTE_OK) goto err_mu;
    memcpy(s->lanes, lanes, nlanes * sizeof(*lanes));
    s->ctx = ctx;
    s->nlanes = nlanes;
    s->qp_cfg = *qp_cfg;
    *store_out = s;
    return OTE_OK;
err_mu:
    ote_mutex_destroy(&s->mu);
err_lanes:
    ote_free(s->lanes);
    ote_free(s);
    return st;
}

void ote_endpoint_store_private_pd(ote_endpoint_store_t *s) { s->private_pd = 1; }

ote_status_t ote_endpoint_store_srqs(ote_endpoint_store_t *s, struct ote_srq *const *srqs) {
    if (s == NULL || srqs == NULL || s->qp_cfg.recv_slots != 0) return OTE_ERR_INVALID;
    struct ote_srq **copy = ote_calloc(s->nlanes, sizeof(*copy));
    if (copy == NULL) return OTE_ERR_NOMEM;
    for (uint32_t i = 0; i < s->nlanes; i++) copy[i] = srqs[i];
    ote_free(s->srqs);
    s->srqs = copy;
    return OTE_OK;
}

void ote_endpoint_store_qp_flags(ote_endpoint_store_t *s, ote_ep_role_t role, uint32_t cap,
                                 uint32_t flags) {
    if (s == NULL || (unsigned)role > 1 || (unsigned)cap >= OTE_EP_MAX_CAPS) return;
    s->create_flags[role][cap] = flags;
}

/* Deallocate the private PD of a slot whose QP is gone (the caller holds the slot by its
 * token); a failure keeps it on the slot, counted as retained once. */
static ote_status_t pd_release(ote_endpoint_store_t *s, ep_slot_t *sl) {
    if (sl->pd == NULL) return OTE_OK;
    ote_verbs_t *v = ote_context_verbs(s->ctx);
    int err = v->ops->dealloc_pd(v, sl->pd);
    if (err != 0) {
        if (!sl->pd_retained) {
            sl->pd_retained = 1;
            ote_context_retained_add(s->ctx, OTE_RETAINED_PD, 1);
        }
        OTE_WARN("endpoint", "%s: dealloc of a QP's private PD failed: errno %d; retained",
                 ote_context_name(s->ctx), err);
        return ote_status_make(OTE_ERR_RETAINED, err);
    }
    if (sl->pd_retained) ote_context_retained_add(s->ctx, OTE_RETAINED_PD, -1);
    sl->pd_retained = 0;
    sl->pd = NULL;
    ote_mutex_lock(&s->mu);
    s->stats.pds_live--;
    ote_mutex_unlock(&s->mu);
    return OTE_OK;
}

ote_context_t *ote_endpoint_store_context(const ote_endpoint_store_t *s) { return s->ctx; }
uint32_t ote_endpoint_store_lanes(const ote_endpoint_store_t *s) { return s->nlanes; }

void ote_endpoint_store_stats(ote_endpoint_store_t *s, ote_endpoint_stats_t *out) {
    ote_mutex_lock(&s->mu);
    *out = s->stats;
    uint64_t retained = 0;
    ote_endpoint_t *ep, *tmp;
    HASH_ITER(hh, s->eps, ep, tmp) {
        for (uint32_t i = 0; i < ep->width; i++) retained += ep->slots[i].destroy_failed != 0;
    }
    for (ep = s->dying; ep != NULL; ep = ep->dnext)
        for (uint32_t i = 0; i < ep->width; i++) retained += ep->slots[i].destroy_failed != 0;
    out->retained_now = retained;
    uint64_t n = HASH_COUNT(s->eps);
    for (ep = s->dying; ep != NULL; ep = ep->dnext) n++;
    out->endpoints = n;
    ote_mutex_unlock(&s->mu);
}

ote_status_t ote_endpoint_get(ote_endpoint_store_t *s, const ote_ep_key_t *key,
                              uint32_t remote_lanes, ote_endpoint_t **ep_out) {
    if (s == NULL || key == NULL || ep_out == NULL) return OTE_ERR_INVALID;
    if (remote_lanes == 0) return OTE_ERR_PROTOCOL;
    uint32_t width = remote_lanes < s->nlanes ? remote_lanes : s->nlanes;
    ote_mutex_lock(&s->mu);
    ote_endpoint_t *ep = NULL;
    HASH_FIND(hh, s->eps, key, sizeof(*key), ep);
    if (ep != NULL) {
        ote_status_t st = OTE_OK;
        if (ep->width != width) {
            OTE_WARN("endpoint",
                     "peer %llx announces %u lanes, but width %u was negotiated: "
                     "refused, the established array is kept",
                     (unsigned long long)key->remote_process, remote_lanes, ep->width);
            st = OTE_ERR_PROTOCOL;
        } else {
            *ep_out = ep;
        }
        ote_mutex_unlock(&s->mu);
        return st;
    }
    ote_status_t st = OTE_ERR_NOMEM;
    ep = ote_calloc(1, sizeof(*ep));
    if (ep != NULL) ep->slots = ote_calloc(width, sizeof(*ep->slots));
    if (ep != NULL && ep->slots != NULL) {
        ep->store = s;
        ep->key = *key;
        ep->width = width;
        OTE_HASH_ADD(hh, s->eps, key, sizeof(ep->key), ep, st);
    }
    if (st != OTE_OK) {
        if (ep != NULL) ote_free(ep->slots);
        ote_free(ep);
        ote_mutex_unlock(&s->mu);
        return st;
    }
    ote_mutex_unlock(&s->mu);
    OTE_DEBUG("endpoint", "%s: endpoint for peer %llx nic %u->%u %s/%s, width %u",
              ote_context_name(s->ctx), (unsigned long long)key->remote_process, key->local_nic,
              key->remote_nic, key->role == OTE_EP_REQUESTER ? "requester" : "source",
              key->cap == OTE_EP_WRITE ? "WRITE" : "READ", width);
    *ep_out = ep;
    return OTE_OK;
}

uint32_t ote_endpoint_width(const ote_endpoint_t *ep) { return ep->width; }
const ote_ep_key_t *ote_endpoint_key(const ote_endpoint_t *ep) { return &ep->key; }

/* Destroy a slot's QP that the caller holds via a token (state BUILDING or RETIRING
 * with token set). Called without the store lock; returns with the slot updated. */
static ote_status_t destroy_held(ote_endpoint_store_t *s, ep_slot_t *sl, ote_qp_t *qp,
                                 ote_deadline_t deadline) {
    /* qp NULL: only the slot's private PD is left (its dealloc failed before). */
    ote_status_t st = qp != NULL ? ote_qp_destroy(qp, deadline) : OTE_OK;
    if (st == OTE_OK && qp != NULL && sl->pd != NULL) {
        ote_mutex_lock(&s->mu);
        sl->qp = NULL; /* destroyed: the PD is what the slot still holds */
        ote_mutex_unlock(&s->mu);
    }
    if (st == OTE_OK) st = pd_release(s, sl);
    ote_mutex_lock(&s->mu);
    if (st == OTE_OK) {
        sl->qp = NULL;
        sl->state = SLOT_EMPTY;
        sl->token = 0;
        sl->remote_qpn = 0;
        sl->destroy_failed = 0;
        s->stats.destroyed++;
        s->stats.qps--;
    } else {
        /* The QP keeps its slot until a native destroy succeeds. */
        sl->state = SLOT_RETIRING;
        sl->token = 0;
        sl->destroy_failed = 1;
    }
    ote_cond_broadcast(&s->cv);
    ote_mutex_unlock(&s->mu);
    return st;
}

ote_status_t ote_endpoint_reserve(ote_endpoint_t *ep, uint32_t slot, ote_deadline_t deadline,
                                  ote_qp_t **qp_out, ote_ep_claim_t *claim) {
    if (ep == NULL || qp_out == NULL || claim == NULL || slot >= ep->width) return OTE_ERR_INVALID;
    ote_endpoint_store_t *s = ep->store;
    ep_slot_t *sl = &ep->slots[slot];
    int timed_out = 0;
    ote_mutex_lock(&s->mu);
    ep->waiters++; /* an evicted endpoint is not freed under this call */
    for (;;) {
        if (sl->state == SLOT_READY) {
            sl->users++;
            ep->waiters--;
            ote_mutex_unlock(&s->mu);
            *qp_out = sl->qp;
            memset(claim, 0, sizeof(*claim));
            return OTE_OK;
        }
        if (sl->state == SLOT_EMPTY && ep->evicted) {
            /* Its peer is gone: nothing is built for it any more. */
            ep->waiters--;
            ote_cond_broadcast(&s->cv);
            ote_mutex_unlock(&s->mu);
            return OTE_ERR_PEER_LOST;
        }
        if (sl->state == SLOT_EMPTY) {
            sl->state = SLOT_BUILDING;
            ep->waiters--;
            sl->token = ++s->next_token;
            claim->ep = ep;
            claim->slot = slot;
            claim->token = sl->token;
            ote_mutex_unlock(&s->mu);
            *qp_out = NULL;
            return OTE_OK;
        }
        if (sl->state == SLOT_RETIRING && sl->users == 0 && sl->token == 0) {
            /* Nobody uses the old pair any more: destroy it here, then build. */
            ote_qp_t *old = sl->qp;
            sl->token = ++s->next_token;
            ote_mutex_unlock(&s->mu);
            ote_status_t st = destroy_held(s, sl, old, deadline);
            ote_mutex_lock(&s->mu);
            if (st != OTE_OK) {
                ep->waiters--;
                ote_cond_broadcast(&s->cv);
                ote_mutex_unlock(&s->mu);
                return st;
            }
            continue;
        }
        if (timed_out) {
            ep->waiters--;
            ote_cond_broadcast(&s->cv);
            ote_mutex_unlock(&s->mu);
            return OTE_ERR_TIMEOUT;
        }
        s->stats.waits++;
        /* Re-examine the slot once more after a timeout, then give up. */
        timed_out = ote_cond_wait(&s->cv, &s->mu, deadline) == OTE_ERR_TIMEOUT;
    }
}

ote_status_t ote_endpoint_cancel(ote_ep_claim_t *claim) {
    if (claim == NULL || claim->ep == NULL || claim->token == 0) return OTE_ERR_INVALID;
    ote_endpoint_store_t *s = claim->ep->store;
    ep_slot_t *sl = &claim->ep->slots[claim->slot];
    ote_status_t st = OTE_ERR_STATE;
    ote_mutex_lock(&s->mu);
    if (sl->state == SLOT_BUILDING && sl->token == claim->token && sl->qp == NULL) {
        sl->state = SLOT_EMPTY;
        sl->token = 0;
        ote_cond_broadcast(&s->cv);
        st = OTE_OK;
    }
    ote_mutex_unlock(&s->mu);
    claim->token = 0;
    return st;
}

ote_status_t ote_endpoint_build(ote_ep_claim_t *claim, ote_ep_exchange_fn exchange, void *arg,
                                ote_deadline_t deadline, ote_qp_t **qp_out) {
    if (claim == NULL || claim->ep == NULL || claim->token == 0 || exchange == NULL ||
        qp_out == NULL)
        return OTE_ERR_INVALID;
    ote_endpoint_t *ep = claim->ep;
    ote_endpoint_store_t *s = ep->store;
    ep_slot_t *sl = &ep->slots[claim->slot];
    ote_mutex_lock(&s->mu);
    int mine = sl->state == SLOT_BUILDING && sl->token == claim->token && sl->qp == NULL;
    ote_mutex_unlock(&s->mu);
    if (!mine) {
        claim->token = 0;
        return OTE_ERR_STATE;
    }
    ote_qp_t *qp = NULL;
    ote_qp_config_t cfg = s->qp_cfg;
    if (ep->key.role <= 1 && ep->key.cap < OTE_EP_MAX_CAPS)
        cfg.create_flags |= s->create_flags[ep->key.role][ep->key.cap];
    if (s->srqs != NULL) cfg.srq = s->srqs[claim->slot];
    ote_status_t st = OTE_OK;
    if (s->private_pd) {
        ote_verbs_t *v = ote_context_verbs(s->ctx);
        int err = v->ops->alloc_pd(v, ote_context_native(s->ctx), &sl->pd);
        if (err != 0) {
            sl->pd = NULL;
            st = ote_status_make(OTE_ERR_NATIVE, err);
            OTE_ERROR("endpoint", "%s: slot %u: alloc_pd for a private QP failed: errno %d",
                      ote_context_name(s->ctx), claim->slot, err);
        } else {
            cfg.pd = sl->pd;
            ote_mutex_lock(&s->mu);
            s->stats.pds_live++;
            ote_mutex_unlock(&s->mu);
        }
    }
    if (st == OTE_OK) st = ote_qp_create(s->lanes[claim->slot], &cfg, &qp);
    if (st != OTE_OK && sl->pd != NULL && pd_release(s, sl) != OTE_OK) {
        /* The PD will not go: the slot keeps it, RETIRING, until a reclaim frees it. */
        ote_mutex_lock(&s->mu);
        sl->state = SLOT_RETIRING;
        sl->token = 0;
        sl->destroy_failed = 1;
        s->stats.build_failures++;
        ote_cond_broadcast(&s->cv);
        ote_mutex_unlock(&s->mu);
        claim->token = 0;
        return st;
    }
    if (st != OTE_OK) {
        ote_mutex_lock(&s->mu);
        sl->state = SLOT_EMPTY;
        sl->token = 0;
        s->stats.build_failures++;
        ote_cond_broadcast(&s->cv);
        ote_mutex_unlock(&s->mu);
        claim->token = 0;
        OTE_WARN("endpoint", "%s: slot %u: QP creation failed: %s; slot free for a retry",
                 ote_context_name(s->ctx), claim->slot, ote_status_str(st));
        return st;
    }
    /* Ownership: from here the QP belongs to the slot until its native destroy succeeds. */
    ote_mutex_lock(&s->mu);
    sl->qp = qp;
    s->stats.qps++;
    ote_mutex_unlock(&s->mu);

    ote_qp_path_t local, peer;
    ote_qp_local_path(qp, &local);
    memset(&peer, 0, sizeof(peer));
    st = exchange(arg, claim->slot, &local, &peer, deadline);
    if (st == OTE_OK) st = ote_qp_connect(qp, &peer);
    if (st != OTE_OK) {
        /* AGAIN: the peer refused for now (its QP limit); the caller asks again later. */
        if (ote_status_code(st) == OTE_ERR_AGAIN)
            OTE_DEBUG("endpoint", "%s: slot %u: QP %u refused for now by the peer: destroying it",
                      ote_context_name(s->ctx), claim->slot, ote_qp_num(qp));
        else
            OTE_WARN("endpoint", "%s: slot %u: construction of QP %u failed: %s; destroying it",
                     ote_context_name(s->ctx), claim->slot, ote_qp_num(qp), ote_status_str(st));
        ote_mutex_lock(&s->mu);
        s->stats.build_failures++;
        ote_mutex_unlock(&s->mu);
        /* A short, bounded flush: the QP never carried work. */
        (void)destroy_held(s, sl, qp, ote_deadline_after(100 * OTE_NSEC_PER_MSEC));
        claim->token = 0;
        return st;
    }
    ote_mutex_lock(&s->mu);
    /* Built for an endpoint evicted meanwhile: lent once, then destroyed by reclaim. */
    sl->state = ep->evicted ? SLOT_RETIRING : SLOT_READY;
    sl->token = 0;
    sl->users = 1;
    sl->remote_qpn = peer.qp_num;
    s->stats.built++;
    ote_cond_broadcast(&s->cv);
    ote_mutex_unlock(&s->mu);
    claim->token = 0;
    *qp_out = qp;
    return OTE_OK;
}

ote_status_t ote_endpoint_borrow(ote_endpoint_t *ep, uint32_t slot, ote_ep_exchange_fn exchange,
                                 void *arg, ote_deadline_t deadline, ote_qp_t **qp_out) {
    ote_ep_claim_t claim;
    ote_qp_t *qp = NULL;
    ote_status_t st = ote_endpoint_reserve(ep, slot, deadline, &qp, &claim);
    if (st != OTE_OK) return st;
    if (qp != NULL) {
        *qp_out = qp;
        return OTE_OK;
    }
    return ote_endpoint_build(&claim, exchange, arg, deadline, qp_out);
}

ote_status_t ote_endpoint_borrow_ready(ote_endpoint_t *ep, uint32_t slot, uint32_t remote_qpn,
                                       ote_qp_t **qp_out) {
    if (ep == NULL || qp_out == NULL || slot >= ep->width) return OTE_ERR_INVALID;
    ote_endpoint_store_t *s = ep->store;
    ep_slot_t *sl = &ep->slots[slot];
    ote_status_t st = OTE_ERR_NOT_FOUND;
    ote_mutex_lock(&s->mu);
    if (sl->state == SLOT_READY && (remote_qpn == 0 || sl->remote_qpn == remote_qpn)) {
        sl->users++;
        *qp_out = sl->qp;
        st = OTE_OK;
    }
    ote_mutex_unlock(&s->mu);
    return st;
}

void ote_endpoint_return(ote_endpoint_t *ep, uint32_t slot, ote_qp_t *qp) {
    ote_endpoint_store_t *s = ep->store;
    ep_slot_t *sl = &ep->slots[slot];
    ote_mutex_lock(&s->mu);
    if (sl->qp == qp && sl->users > 0) {
        sl->users--;
        if (sl->users == 0) ote_cond_broadcast(&s->cv);
    } else {
        OTE_WARN("endpoint", "return of QP %u to slot %u that does not lend it: ignored",
                 qp ? ote_qp_num(qp) : 0, slot);
    }
    ote_mutex_unlock(&s->mu);
}

void ote_endpoint_retire(ote_endpoint_t *ep, uint32_t slot, const ote_qp_t *qp) {
    ote_endpoint_store_t *s = ep->store;
    ep_slot_t *sl = &ep->slots[slot];
    ote_mutex_lock(&s->mu);
    if (sl->qp == qp && sl->state == SLOT_READY) {
        sl->state = SLOT_RETIRING;
        s->stats.retired++;
        ote_cond_broadcast(&s->cv);
    }
    ote_mutex_unlock(&s->mu);
}

uint32_t ote_endpoint_remote_qpn(ote_endpoint_t *ep, uint32_t slot) {
    ote_endpoint_store_t *s = ep->store;
    ote_mutex_lock(&s->mu);
    uint32_t n =
        slot < ep->width && ep->slots[slot].state == SLOT_READY ? ep->slots[slot].remote_qpn : 0;
    ote_mutex_unlock(&s->mu);
    return n;
}

uint32_t ote_endpoint_pick_slot(ote_endpoint_t *ep) {
    ote_endpoint_store_t *s = ep->store;
    ote_mutex_lock(&s->mu);
    uint32_t start = ep->rr++ % ep->width, best = start, best_users = UINT32_MAX;
    for (uint32_t k = 0; k < ep->width; k++) {
        uint32_t i = (start + k) % ep->width;
        const ep_slot_t *sl = &ep->slots[i];
        uint32_t load;
        if (sl->state == SLOT_EMPTY) load = 0;
        else if (sl->state == SLOT_READY) load = sl->users;
        else load = UINT32_MAX - 1; /* building or retiring: last resort */
        if (load < best_users) {
            best_users = load;
            best = i;
        }
    }
    ote_mutex_unlock(&s->mu);
    return best;
}

uint32_t ote_endpoint_ready_count(ote_endpoint_t *ep) {
    ote_endpoint_store_t *s = ep->store;
    ote_mutex_lock(&s->mu);
    uint32_t n = 0;
    for (uint32_t i = 0; i < ep->width; i++) n += ep->slots[i].state == SLOT_READY;
    ote_mutex_unlock(&s->mu);
    return n;
}

uint32_t ote_endpoint_users(ote_endpoint_t *ep, uint32_t slot) {
    ote_endpoint_store_t *s = ep->store;
    ote_mutex_lock(&s->mu);
    uint32_t n = slot < ep->width ? ep->slots[slot].users : 0;
    ote_mutex_unlock(&s->mu);
    return n;
}

/* Under s->mu: hold (borrow) and retire every slot of ep whose QP matches the fence,
 * appending them to *held (grown as needed). Returns OTE_ERR_NOMEM when the array
 * cannot grow (what was held so far is kept). */
typedef struct {
    ote_endpoint_t *ep;
    uint32_t slot;
    ote_qp_t *qp;
} fence_hold_t;

static ote_status_t fence_collect(ote_endpoint_store_t *s, ote_endpoint_t *ep,
                                  const ote_cq_lane_t *lane, uint64_t below_gen,
                                  fence_hold_t **held, size_t *n, size_t *cap) {
    for (uint32_t i = 0; i < ep->width; i++) {
        ep_slot_t *sl = &ep->slots[i];
        if ((sl->state != SLOT_READY && sl->state != SLOT_RETIRING) || sl->qp == NULL ||
            sl->token != 0)
            continue;
        if (lane != NULL && s->lanes[i] != lane) continue;
        if (below_gen != 0 && ote_qp_route_generation(sl->qp) >= below_gen) continue;
        if (*n == *cap) {
            size_t nc = *cap == 0 ? 16 : *cap * 2;
            fence_hold_t *g = ote_realloc(*held, nc * sizeof(*g));
            if (g == NULL) return OTE_ERR_NOMEM;
            *held = g;
            *cap = nc;
        }
        if (sl->state == SLOT_READY) {
            sl->state = SLOT_RETIRING;
            s->stats.retired++;
        }
        sl->users++;
        (*held)[(*n)++] = (fence_hold_t){ep, i, sl->qp};
    }
    return OTE_OK;
}

ote_status_t ote_endpoint_store_fence(ote_endpoint_store_t *s, const ote_cq_lane_t *lane,
                                      uint64_t below_gen, ote_status_t cause, int abandon,
                                      ote_deadline_t deadline, size_t *fenced_out) {
    if (s == NULL || cause == OTE_OK) return OTE_ERR_INVALID;
    fence_hold_t *held = NULL;
    size_t n = 0, cap = 0;
    ote_status_t st = OTE_OK;
    ote_mutex_lock(&s->mu);
    ote_endpoint_t *ep, *tmp;
    HASH_ITER(hh, s->eps, ep, tmp) {
        if (st == OTE_OK) st = fence_collect(s, ep, lane, below_gen, &held, &n, &cap);
    }
    for (ep = s->dying; ep != NULL && st == OTE_OK; ep = ep->dnext)
        st = fence_collect(s, ep, lane, below_gen, &held, &n, &cap);
    ote_cond_broadcast(&s->cv);
    ote_mutex_unlock(&s->mu);
    /* Without the lock: fencing moves the QP to ERR (a native call), abandoning also
     * destroys it natively and delivers its owed WRs' ends to their records. */
    size_t fenced = 0;
    for (size_t i = 0; i < n; i++) {
        ote_status_t r =
            abandon ? ote_qp_abandon(held[i].qp, cause, deadline) : ote_qp_fence(held[i].qp, cause);
        if (r == OTE_OK) fenced++;
        else if (st == OTE_OK) st = r;
        ote_endpoint_return(held[i].ep, held[i].slot, held[i].qp);
    }
    ote_free(held);
    if (fenced_out != NULL) *fenced_out = fenced;
    return st;
}

/* Under s->mu: one idle RETIRING slot of ep to destroy (held by a token), or NULL. */
static ep_slot_t *reclaim_pick(ote_endpoint_store_t *s, ote_endpoint_t *ep, ote_qp_t **qp_out) {
    for (uint32_t i = 0; i < ep->width; i++) {
        ep_slot_t *sl = &ep->slots[i];
        if (sl->state == SLOT_RETIRING && sl->users == 0 && sl->token == 0 &&
            sl->destroy_failed < 2) {
            *qp_out = sl->qp;
            sl->token = ++s->next_token;
            return sl;
        }
    }
    return NULL;
}

/* Under s->mu: ep's slots after a pass (a failed destroy may be retried by the next pass);
 * returns how many are still RETIRING. */
static size_t reclaim_settle(ote_endpoint_t *ep, int *idle_out) {
    size_t remaining = 0;
    int idle = ep->waiters == 0;
    for (uint32_t i = 0; i < ep->width; i++) {
        ep_slot_t *sl = &ep->slots[i];
        if (sl->destroy_failed == 2) sl->destroy_failed = 1;
        remaining += sl->state == SLOT_RETIRING;
        if (sl->state != SLOT_EMPTY || sl->users != 0 || sl->token != 0) idle = 0;
    }
    *idle_out = idle;
    return remaining;
}

static void ep_free(ote_endpoint_t *ep) {
    ote_free(ep->slots);
    ote_free(ep);
}

ote_status_t ote_endpoint_store_reclaim(ote_endpoint_store_t *s, ote_deadline_t deadline,
                                        size_t *remaining_out) {
    ote_status_t first = OTE_OK;
    /* Each pass takes one idle retiring slot (a token marks it held), destroys its QP
     * without the lock, and starts over; a failed destroy is not retried in this call.
     * Evicted endpoints (the dying list) are reclaimed the same way, and freed once every
     * slot is EMPTY with nobody borrowing, building or waiting. */
    ote_endpoint_t *ep, *tmp;
    for (;;) {
        ep_slot_t *victim = NULL;
        ote_qp_t *qp = NULL;
        ote_mutex_lock(&s->mu);
        HASH_ITER(hh, s->eps, ep, tmp) {
            victim = reclaim_pick(s, ep, &qp);
            if (victim != NULL) break;
        }
        for (ep = s->dying; victim == NULL && ep != NULL; ep = ep->dnext)
            victim = reclaim_pick(s, ep, &qp);
        ote_mutex_unlock(&s->mu);
        if (victim == NULL) break;
        ote_status_t st = destroy_held(s, victim, qp, deadline);
        if (st != OTE_OK) {
            if (first == OTE_OK) first = st;
            ote_mutex_lock(&s->mu);
            victim->destroy_failed = 2; /* not again in this pass */
            ote_mutex_unlock(&s->mu);
        }
    }
    size_t remaining = 0;
    ote_endpoint_t *freed = NULL;
    ote_mutex_lock(&s->mu);
    int idle;
    HASH_ITER(hh, s->eps, ep, tmp) { remaining += reclaim_settle(ep, &idle); }
    for (ote_endpoint_t **pp = &s->dying; *pp != NULL;) {
        ep = *pp;
        remaining += reclaim_settle(ep, &idle);
        if (!idle) {
            pp = &ep->dnext;
            continue;
        }
        *pp = ep->dnext; /* nobody can reach it any more */
        ep->dnext = freed;
        freed = ep;
        s->stats.evicted++;
    }
    ote_mutex_unlock(&s->mu);
    while (freed != NULL) {
        ep = freed;
        freed = ep->dnext;
        ep_free(ep);
    }
    if (remaining_out != NULL) *remaining_out = remaining;
    return first;
}

ote_status_t ote_endpoint_evict(ote_endpoint_t *ep) {
    if (ep == NULL) return OTE_ERR_INVALID;
    ote_endpoint_store_t *s = ep->store;
    ote_mutex_lock(&s->mu);
    if (!ep->evicted) {
        ep->evicted = 1;
        HASH_DEL(s->eps, ep);
        ep->dnext = s->dying;
        s->dying = ep;
        for (uint32_t i = 0; i < ep->width; i++) {
            if (ep->slots[i].state == SLOT_READY) {
                ep->slots[i].state = SLOT_RETIRING;
                s->stats.retired++;
            }
        }
        ote_cond_broadcast(&s->cv);
    }
    ote_mutex_unlock(&s->mu);
    OTE_DEBUG("endpoint", "%s: endpoint for peer %llx evicted: its QPs go once drained",
              ote_context_name(s->ctx), (unsigned long long)ep->key.remote_process);
    return OTE_OK;
}

ote_status_t ote_endpoint_store_destroy(ote_endpoint_store_t *s, ote_deadline_t deadline) {
    if (s == NULL) return OTE_OK;
    ote_endpoint_t *ep, *tmp;
    ote_mutex_lock(&s->mu);
    for (int list = 0; list < 2; list++) {
        ote_endpoint_t *first = list == 0 ? s->eps : s->dying;
        for (ep = first; ep != NULL; ep = list == 0 ? (ote_endpoint_t *)ep->hh.next : ep->dnext) {
            if (ep->waiters != 0) {
                ote_mutex_unlock(&s->mu);
                return OTE_ERR_BUSY;
            }
            for (uint32_t i = 0; i < ep->width; i++) {
                const ep_slot_t *sl = &ep->slots[i];
                if (sl->state == SLOT_BUILDING || sl->users > 0 ||
                    (sl->state == SLOT_RETIRING && sl->token != 0)) {
                    ote_mutex_unlock(&s->mu);
                    return OTE_ERR_BUSY;
                }
            }
        }
    }
    HASH_ITER(hh, s->eps, ep, tmp) {
        for (uint32_t i = 0; i < ep->width; i++)
            if (ep->slots[i].state == SLOT_READY) ep->slots[i].state = SLOT_RETIRING;
    }
    ote_mutex_unlock(&s->mu);
    size_t remaining = 0;
    ote_status_t st = ote_endpoint_store_reclaim(s, deadline, &remaining);
    if (remaining > 0) {
        OTE_WARN("endpoint", "%s: %zu QP(s) could not be destroyed (%s); store retained",
                 ote_context_name(s->ctx), remaining, ote_status_str(st));
        return st != OTE_OK ? st : OTE_ERR_RETAINED;
    }
    HASH_ITER(hh, s->eps, ep, tmp) {
        HASH_DEL(s->eps, ep);
        ep_free(ep);
    }
    while (s->dying != NULL) {
        ep = s->dying;
        s->dying = ep->dnext;
        ep_free(ep);
    }
    ote_cond_destroy(&s->cv);
    ote_mutex_destroy(&s->mu);
    ote_free(s->srqs);
    ote_free(s->lanes);
    ote_free(s);
    return OTE_OK;
}

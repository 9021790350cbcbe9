/*
 * engine/rdma/rdma_srcqp.c - rdma_max_qps at the source: a CONNECT that would build a
 * source QP past the engine's limit retires an idle source QP of some requester first, or
 * is refused AGAIN (rdma_credits.h).
 */
#include <stdatomic.h>
#include <stdint.h>

#include "base/log.h"
#include "base/time.h"
#include "engine/rdma/rdma_credits.h"
#include "grant/grant.h"

/* Retire one idle READY source QP: nobody borrows it, no grant is live on its endpoint
 * (so no receipt is pending), and its requester has had a grant here since its last
 * CONNECT, or that CONNECT is older than the grace (its GRANT_REQ follows the CONNECT_ACK). Its store, or NULL when none is
 * idle. Under tp->mu (a connection's endpoints are evicted under it, so the endpoints
 * looked up here live through the walk). */
static ote_endpoint_store_t *retire_src_idle(rdma_tp_t *tp, uint64_t now) {
    ote_endpoint_store_t *found = NULL;
    ote_mutex_lock(&tp->mu);
    for (size_t i = 0; i < tp->nsconns && found == NULL; i++) {
        conn_t *o = tp->sconns[i]->c;
        if (tp->sconns[i]->exited || o->process == 0 || atomic_load(&o->dead)) continue;
        /* A requester that built a QP here and has not had a grant since is between its
         * CONNECT_ACK and its GRANT_REQ (a run is rebuilt after one cache miss only). */
        uint64_t t = atomic_load(&o->src_connect_ns);
        if (t != 0 && !atomic_load(&o->src_granted) && now - t < OTE__RDMA_SRC_QP_GRACE_NS)
            continue;
        uint32_t nr = o->ndev < OTE__RDMA_MAX_NICS ? o->ndev : OTE__RDMA_MAX_NICS;
        for (uint32_t r = 0; r < nr && found == NULL; r++) {
            /* Written by o's own thread (only ever more bits): read once. */
            uint8_t used = __atomic_load_n(&o->src_used[r], __ATOMIC_RELAXED);
            for (uint32_t d = 0; d < tp->nnics && found == NULL; d++) {
                if (!(used >> d & 1u)) continue;
                rdma_nic_t *n = &tp->nics[d];
                for (int cap = 0; cap < 4 && found == NULL; cap++) {
                    ote_endpoint_store_t *store = cap >= 2 ? n->deps : n->eps;
                    if (store == NULL) continue;
                    ote_ep_key_t key;
                    ote_ep_key_make(&key, o->process, o->pd, ote_context_nic_id(n->ctx), o->nics[r],
                                    OTE_EP_SOURCE, (ote_ep_cap_t)cap);
                    ote_endpoint_t *ep = NULL;
                    if (ote_endpoint_get(store, &key, o->lanes, &ep) != OTE_OK) continue;
                    if (ote_grant_source_live_endpoint(n->gm, ep) != 0) continue;
                    for (uint32_t j = 0; j < ote_endpoint_width(ep) && found == NULL; j++) {
                        if (ote_endpoint_users(ep, j) != 0) continue;
                        ote_qp_t *qp = NULL;
                        if (ote_endpoint_borrow_ready(ep, j, 0, &qp) != OTE_OK) continue;
                        if (ote_endpoint_users(ep, j) == 1) {
                            ote_endpoint_retire(ep, j, qp);
                            found = store;
                        }
                        ote_endpoint_return(ep, j, qp);
                    }
                }
            }
        }
    }
    ote_mutex_unlock(&tp->mu);
    return found;
}

/* Destroy what is retired and idle in every store (a slot's QP replaced by a CONNECT,
 * one retired above): bounded, best effort (a QP still borrowed stays counted). */
static void reclaim_all(rdma_tp_t *tp) {
    for (uint32_t k = 0; k < tp->nnics; k++) {
        ote_deadline_t dl = ote_deadline_after(200 * OTE_NSEC_PER_MSEC);
        (void)ote_endpoint_store_reclaim(tp->nics[k].eps, dl, NULL);
        if (tp->nics[k].deps != NULL) (void)ote_endpoint_store_reclaim(tp->nics[k].deps, dl, NULL);
    }
}

int ote__rdma_src_qp_room(conn_t *c) {
    rdma_tp_t *tp = c->tp;
    if (!ote__rdma_qps_full(tp)) return 1;
    reclaim_all(tp);
    if (!ote__rdma_qps_full(tp)) return 1;
    ote_endpoint_store_t *store = retire_src_idle(tp, ote_now_ns());
    if (store != NULL) {
        ote__rdma_src_qp_count(tp, 1);
        (void)ote_endpoint_store_reclaim(store, ote_deadline_after(200 * OTE_NSEC_PER_MSEC), NULL);
        if (!ote__rdma_qps_full(tp)) return 1;
    }
    ote__rdma_src_qp_count(tp, 0);
    OTE_WARN_LIMITED("rdma",
                     "CONNECT from %s refused for now: this engine holds rdma_max_qps=%u QPs "
                     "and none is idle; the requester asks again until its deadline",
                     c->peer_addr, tp->cfg.rdma_max_qps);
    return 0;
}

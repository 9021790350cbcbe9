/*
 * engine/rdma/rdma_pairing.c - which device of the peer a requester run goes to, by the
 * remote buffer's locality (rdma_pairing.h): the source's hint in GRANT_RESP's pair form,
 * the requester's memo of it, the pick of the peer's device for a run, and the requester
 * endpoints per (our device, the peer's device, capability).
 */
#include <string.h>

#include "base/log.h"
#include "engine/rdma/rdma_internal.h"

/* The devices of ours that are active, as a selector mask. */
static uint32_t active_mask(const rdma_tp_t *tp) {
    uint32_t m = 0;
    for (uint32_t i = 0; i < tp->nnics && i < OTE_RP_MAX_DEVS; i++)
        if (ote_selector_is_active(tp->sel, (int)i)) m |= 1u << i;
    return m;
}

void ote__rdma_pair_hint(rdma_tp_t *tp, const acct_t *a, uint32_t *near_out, uint64_t *addr_out,
                         uint64_t *len_out) {
    ote__pin_t pin;
    int have = 0;
    ote_mutex_lock(&tp->mu); /* the account's fields (its pin is read-only once opened) */
    if (a->opened && a->st == OTE_OK && a->pin != NULL) {
        pin = *(const ote__pin_t *)a->pin;
        have = 1;
    }
    ote_mutex_unlock(&tp->mu);
    *near_out = 0;
    if (!have || pin.loc < 0 || pin.len == 0) return;
    uint32_t all = active_mask(tp);
    uint32_t best = ote_selector_best_mask(tp->sel, pin.loc, all);
    /* Every active device ranks the same: no preference (the requester keeps its rail). */
    if (best == 0 || best == all) return;
    *near_out = best;
    *addr_out = pin.base;
    *len_out = pin.len;
}

void ote__rdma_pair_learn(ote__tpeer_t *p, const ote_rp_msg_t *rp) {
    uint64_t lo = rp->u.resp.reg_addr, hi = lo + rp->u.resp.reg_len; /* decoder: no wrap */
    ote__rdma_pairs_t *m = &p->pairs;
    ote_mutex_lock(&p->mu);
    uint32_t at = OTE__RDMA_PAIR_MEMO;
    for (uint32_t i = 0; i < OTE__RDMA_PAIR_MEMO; i++) {
        if (m->e[i].hi == 0) continue;
        if (m->e[i].lo == lo && m->e[i].hi == hi) at = i;
        else if (m->e[i].lo < hi && lo < m->e[i].hi) m->e[i].hi = 0; /* a registration gone */
    }
    if (at == OTE__RDMA_PAIR_MEMO) {
        at = m->next;
        m->next = (m->next + 1) % OTE__RDMA_PAIR_MEMO;
    }
    m->e[at].lo = lo;
    m->e[at].hi = hi;
    m->e[at].near = rp->u.resp.near;
    ote_mutex_unlock(&p->mu);
}

uint32_t ote__rdma_run_cap(const ote__slice_t *s) {
    return (s->op == OTE__SLICE_WRITE ? 1u : 0u) + (ote__rdma_cxp(s)->direct ? 2u : 0u);
}

uint32_t ote__rdma_run_epi(const ote__slice_t *s) {
    return OTE__RDMA_EPI(ote__rdma_cxp(s)->rdev, ote__rdma_run_cap(s));
}

/* The n-th (from 0) device whose bit is set in mask (n < its bits). */
static uint32_t nth_bit(uint32_t mask, uint32_t n) {
    for (uint32_t j = 0; j < 32; j++) {
        if (!(mask >> j & 1u)) continue;
        if (n == 0) return j;
        n--;
    }
    return 0;
}

uint32_t ote__rdma_pair_dev_locked(ote__tpeer_t *p, const ote__slice_t *s, uint32_t k) {
    const conn_t *c = p->conn.c; /* set while connected: runs start only then */
    uint32_t ndev = c->ndev == 0 ? 1 : c->ndev;
    uint32_t rail = k % ndev, near = 0;
    for (uint32_t i = 0; i < OTE__RDMA_PAIR_MEMO && c->pair_ok; i++) {
        if (s->remote >= p->pairs.e[i].lo && s->remote < p->pairs.e[i].hi) {
            near = p->pairs.e[i].near;
            break;
        }
    }
    near &= ndev >= 32 ? ~0u : (1u << ndev) - 1u;
    if (near == 0 || (near >> rail & 1u)) return rail;
    uint32_t j = nth_bit(near, k % (uint32_t)__builtin_popcount(near));
    if (p->conn.ep[k][OTE__RDMA_EPI(j, ote__rdma_run_cap(s))] == NULL) return rail;
    return j;
}

uint32_t ote__rdma_pair_dev(ote__tpeer_t *p, const ote__slice_t *s, uint32_t k) {
    ote_mutex_lock(&p->mu);
    uint32_t j = ote__rdma_pair_dev_locked(p, s, k);
    ote_mutex_unlock(&p->mu);
    return j;
}

ote_status_t ote__rdma_pair_endpoints(rdma_tp_t *tp, const conn_t *c,
                                      ote_endpoint_t *eps[OTE__RDMA_MAX_NICS][OTE__RDMA_EPS]) {
    int ncap = c->direct_ok ? 4 : 2; /* 2, 3: direct endpoints (rdma_direct.c) */
    ote_status_t st = OTE_OK;
    for (uint32_t k = 0; st == OTE_OK && k < tp->nnics; k++) {
        for (uint32_t j = 0; st == OTE_OK && j < c->ndev; j++) {
            /* Toward a source without rdma_pair=1 only the rail (k % ndev), as before. */
            if (!c->pair_ok && j != k % c->ndev) continue;
            for (int cap = 0; st == OTE_OK && cap < ncap; cap++) {
                ote_ep_key_t key;
                ote_ep_key_make(&key, c->process, c->pd, ote_context_nic_id(tp->nics[k].ctx),
                                c->nics[j], OTE_EP_REQUESTER, (ote_ep_cap_t)cap);
                st = ote_endpoint_get(tp->nics[k].eps, &key, c->lanes,
                                      &eps[k][OTE__RDMA_EPI(j, cap)]);
            }
        }
    }
    return st;
}

void ote__rdma_pair_reset(conn_t *c, uint32_t k) {
    for (uint32_t j = 0; j < c->ndev; j++) {
        if (!c->pair_ok && j != k % c->ndev) continue;
        ote_rp_msg_t rq;
        memset(&rq, 0, sizeof(rq));
        rq.type = OTE_RP_EP_RESET;
        rq.u.reset.pair = (j << 8) | k;
        (void)ote__rdma_conn_send_rp(c, 0, OTE_OK, &rq);
    }
}

/*
 * engine/rdma/rdma_src_parents.c - the source's reservations of whole parents: grant
 * credits from the rdma_max_served_grants pool and receive slots of the parent's QPs,
 * taken by a parent's first GRANT_REQ and given back when it ends (rdma_src_parents.h).
 */
#include "engine/rdma/rdma_src_parents.h"

#include <stdint.h>
#include <string.h>

#include "base/alloc.h"
#include "base/fault.h"
#include "base/lock.h"
#include "base/log.h"
#include "base/time.h"

/* QPs one parent holds receive slots on at once; a grant on one more is admitted per grant. */
#define SP_MAX_QPS 8

typedef struct {
    ote_endpoint_t *ep;
    uint32_t slot;
    ote_qp_t *qp;  /* borrowed by the parent; NULL: an unused entry */
    uint32_t held; /* receive slots admitted for the parent (handed to grants included) */
    uint32_t used; /* of them, handed to live grants */
} sp_qp_t;

struct sparent {
    sparent_t *next;
    const conn_t *c;
    uint64_t id;
    uint64_t uid;     /* the request of its latest grant: the parent ends with its account */
    uint32_t budget;  /* as its trailer named it */
    uint32_t credits; /* grant credits reserved (the budget) */
    uint32_t live;    /* grants holding a slot of it */
    int ended;        /* returned: only its live grants keep it */
    uint64_t last_ns; /* its last GRANT_REQ or grant end */
    sp_qp_t q[SP_MAX_QPS];
};

struct rdma_sparents {
    ote_mutex_t mu;
    sparent_t *list;
    rdma_sp_stats_t st;
};

typedef struct {
    ote_endpoint_t *ep;
    uint32_t slot;
    ote_qp_t *qp;
} sp_borrow_t;

ote_status_t ote__rdma_sp_create(rdma_tp_t *tp) {
    struct rdma_sparents *S = ote_calloc(1, sizeof(*S));
    if (S == NULL) return OTE_ERR_NOMEM;
    ote_mutex_init(&S->mu);
    tp->sparents = S;
    return OTE_OK;
}

void ote__rdma_sp_destroy(rdma_tp_t *tp) {
    struct rdma_sparents *S = tp->sparents;
    if (S == NULL) return;
    /* Ended at teardown before the endpoints went (ote__rdma_sp_end_conn(tp, NULL)); what
     * is left is records of grants that never ended (a retained grant manager). */
    while (S->list != NULL) {
        sparent_t *p = S->list;
        S->list = p->next;
        ote_free(p);
    }
    ote_mutex_destroy(&S->mu);
    ote_free(S);
    tp->sparents = NULL;
}

static void unlink_locked(struct rdma_sparents *S, sparent_t *p) {
    sparent_t **pp = &S->list;
    while (*pp != NULL && *pp != p) pp = &(*pp)->next;
    if (*pp == p) *pp = p->next;
}

/* Return p's reservation: its free receive slots to their QPs, its credits to the pool;
 * the borrows of its QPs into ret (returned by the caller with no lock held). The slots
 * its live grants hold stay theirs; p is freed with its last one. Under S->mu. */
static size_t end_locked(struct rdma_sparents *S, sparent_t *p, sp_borrow_t *ret) {
    size_t n = 0;
    for (int i = 0; i < SP_MAX_QPS; i++) {
        sp_qp_t *e = &p->q[i];
        if (e->qp == NULL) continue;
        for (uint32_t k = e->used; k < e->held; k++) ote_qp_rq_unadmit(e->qp);
        S->st.rq -= e->held;
        ret[n].ep = e->ep;
        ret[n].slot = e->slot;
        ret[n].qp = e->qp;
        n++;
        memset(e, 0, sizeof(*e));
    }
    S->st.credits -= p->credits;
    S->st.parents--;
    S->st.ended++;
    p->credits = 0;
    p->ended = 1;
    if (p->live == 0) {
        unlink_locked(S, p);
        ote_free(p);
    }
    return n;
}

static void return_borrows(const sp_borrow_t *ret, size_t n) {
    for (size_t i = 0; i < n; i++) ote_endpoint_return(ret[i].ep, ret[i].slot, ret[i].qp);
}

static int on_ep(const sparent_t *p, const ote_endpoint_t *ep) {
    for (int i = 0; i < SP_MAX_QPS; i++)
        if (p->q[i].qp != NULL && p->q[i].ep == ep) return 1;
    return 0;
}

typedef int (*sp_match_fn)(const sparent_t *p, const void *a, uint64_t b, uint64_t now);

/* End every parent that match() names, one at a time (borrows returned unlocked). */
static void end_matching(rdma_tp_t *tp, sp_match_fn match, const void *a, uint64_t b) {
    struct rdma_sparents *S = tp->sparents;
    if (S == NULL) return;
    uint64_t now = ote_now_ns();
    for (;;) {
        sp_borrow_t ret[SP_MAX_QPS];
        size_t n = 0;
        int found = 0;
        ote_mutex_lock(&S->mu);
        for (sparent_t *p = S->list; p != NULL; p = p->next) {
            if (p->ended || !match(p, a, b, now)) continue;
            n = end_locked(S, p, ret);
            found = 1;
            break;
        }
        ote_mutex_unlock(&S->mu);
        return_borrows(ret, n);
        if (!found) return;
    }
}

static int match_req(const sparent_t *p, const void *a, uint64_t uid, uint64_t now) {
    (void)now;
    return p->c == a && p->uid == uid;
}
static int match_conn(const sparent_t *p, const void *a, uint64_t b, uint64_t now) {
    (void)b;
    (void)now;
    return a == NULL || p->c == a;
}
static int match_ep(const sparent_t *p, const void *a, uint64_t b, uint64_t now) {
    (void)b;
    (void)now;
    return on_ep(p, a);
}
/* The source's deadline for a parent: no live grant and no GRANT_REQ for idle_ns. */
static int match_idle(const sparent_t *p, const void *a, uint64_t idle_ns, uint64_t now) {
    (void)a;
    return p->live == 0 && p->last_ns < now && now - p->last_ns > idle_ns;
}

void ote__rdma_sp_end_req(rdma_tp_t *tp, const conn_t *c, uint64_t uid) {
    end_matching(tp, match_req, c, uid);
}
void ote__rdma_sp_end_conn(rdma_tp_t *tp, const conn_t *c) { end_matching(tp, match_conn, c, 0); }
void ote__rdma_sp_end_ep(rdma_tp_t *tp, const ote_endpoint_t *ep) {
    end_matching(tp, match_ep, ep, 0);
}

/* The first GRANT_REQ of a parent: its whole budget of grant credits from the pool, then
 * of receive slots on qp, all or nothing; the credits are given back when the slots fail.
 * mine: a borrow of qp, which the new parent keeps. Under S->mu. */
static ote_status_t reserve_locked(rdma_tp_t *tp, struct rdma_sparents *S, conn_t *c,
                                   const ote_rp_msg_t *rq, ote_endpoint_t *ep, ote_qp_t *qp,
                                   ote_qp_t *mine, sparent_t **out) {
    uint32_t budget = rq->u.grant.budget;
    uint32_t max = tp->cfg.rdma_max_served_grants;
    uint32_t slots = ote__rdma_recv_slots(tp);
    if (max != 0 && budget > max) {
        /* Never reservable here: refused at once rather than asked again to its deadline. */
        S->st.refused++;
        OTE_WARN_LIMITED("rdma",
                         "requester %s: a parent of %u grants is more than this source ever "
                         "reserves (rdma_max_served_grants %u): refused",
                         c->peer_addr, budget, max);
        return OTE_ERR_TOO_BIG;
    }
    /* Receive slots: one per receipt the parent may have outstanding, at most one QP's
     * worth (a larger parent spreads over several QPs; its grants past them are admitted
     * per grant). */
    uint32_t want = budget < slots ? budget : slots;
    if (max != 0 && S->st.credits + budget > max) {
        S->st.refused++;
        return OTE_ERR_AGAIN;
    }
    S->st.credits += budget; /* taken first, given back below when the slots fail */
    uint32_t got = 0;
    ote_status_t st = mine != NULL ? OTE_OK : OTE_ERR_AGAIN;
    while (st == OTE_OK && got < want) {
        st = ote_qp_rq_admit(qp);
        if (st == OTE_OK) got++;
    }
    sparent_t *p = NULL;
    if (st == OTE_OK && (p = ote_calloc(1, sizeof(*p))) == NULL) st = OTE_ERR_AGAIN;
    if (st != OTE_OK) {
        while (got-- > 0) ote_qp_rq_unadmit(qp);
        S->st.credits -= budget;
        S->st.refused++;
        S->st.rq_refused++;
        OTE_WARN_LIMITED("rdma",
                         "requester %s: no %u receive slots free on QP %u for a parent's "
                         "receipts: refused (%s)",
                         c->peer_addr, want, ote_qp_num(qp), ote_status_str(st));
        return st;
    }
    p->c = c;
    p->id = rq->u.grant.parent;
    p->uid = rq->u.grant.req_uid;
    p->budget = budget;
    p->credits = budget;
    p->q[0].ep = ep;
    p->q[0].slot = rq->u.grant.slot;
    p->q[0].qp = mine;
    p->q[0].held = want;
    p->next = S->list;
    S->list = p;
    S->st.parents++;
    S->st.rq += want;
    if (S->st.credits > S->st.credits_peak) S->st.credits_peak = S->st.credits;
    if (S->st.rq > S->st.rq_peak) S->st.rq_peak = S->st.rq;
    *out = p;
    return OTE_OK;
}

static int entry_of(const sparent_t *p, const ote_qp_t *qp) {
    for (int i = 0; i < SP_MAX_QPS; i++)
        if (p->q[i].qp == qp) return i;
    return -1;
}

/* One slot of p's reservation for a grant on qp: handed to the grant layer, which admits
 * it again at once; moved from another QP of p when it has none free on qp. -1: none
 * free, the grant is admitted per grant. mine: a borrow of qp (a new entry keeps it; set
 * to NULL then). Under S->mu. */
static int slot_take_locked(sparent_t *p, ote_endpoint_t *ep, uint32_t slot, ote_qp_t *qp,
                            ote_qp_t **mine, sp_borrow_t *drop) {
    int qi = entry_of(p, qp);
    if (qi >= 0 && p->q[qi].held > p->q[qi].used) {
        ote_qp_rq_unadmit(qp); /* the grant layer's admission takes it */
        p->q[qi].used++;
        return qi;
    }
    int from = -1;
    for (int i = 0; i < SP_MAX_QPS && from < 0; i++)
        if (p->q[i].qp != NULL && i != qi && p->q[i].held > p->q[i].used) from = i;
    if (from < 0) return -1;
    if (qi < 0) {
        if (*mine == NULL) return -1;
        qi = entry_of(p, NULL); /* an unused entry */
        if (qi < 0) return -1;
        p->q[qi].ep = ep;
        p->q[qi].slot = slot;
        p->q[qi].qp = *mine;
        *mine = NULL;
    }
    /* Moved: its admission on the other QP is given back; the grant layer's on qp is this
     * slot now (when qp has none free the grant is refused AGAIN, and the slot is lost to
     * the reservation at its return). */
    sp_qp_t *f = &p->q[from];
    ote_qp_rq_unadmit(f->qp);
    f->held--;
    if (f->held == 0 && f->used == 0) { /* nothing of p left there: its borrow goes */
        drop->ep = f->ep;
        drop->slot = f->slot;
        drop->qp = f->qp;
        memset(f, 0, sizeof(*f));
    }
    p->q[qi].held++;
    p->q[qi].used++;
    return qi;
}

ote_status_t ote__rdma_sp_take(conn_t *c, const ote_rp_msg_t *rq, ote_endpoint_t *ep, ote_qp_t *qp,
                               sp_slot_t *out) {
    out->sp = NULL;
    out->qi = -1;
    if (rq->u.grant.parent == 0) return OTE_OK; /* an older requester: per grant */
    rdma_tp_t *tp = c->tp;
    struct rdma_sparents *S = tp->sparents;
    uint32_t slot = rq->u.grant.slot;
    /* A borrow of qp for the parent, in case it takes slots there (the endpoint's lock is
     * never taken under S->mu). The grant's own borrow keeps qp READY meanwhile. */
    ote_qp_t *mine = NULL;
    if (ote_endpoint_borrow_ready(ep, slot, rq->u.grant.req_qpn, &mine) == OTE_OK && mine != qp) {
        ote_endpoint_return(ep, slot, mine);
        mine = NULL;
    }
    uint64_t now = ote_now_ns();
    ote_status_t st = OTE_OK;
    sp_borrow_t drop = {NULL, 0, NULL};
    ote_mutex_lock(&S->mu);
    sparent_t *p = S->list;
    while (p != NULL && (p->ended || p->c != c || p->id != rq->u.grant.parent)) p = p->next;
    if (p == NULL) {
        ote_mutex_unlock(&S->mu);
        /* Parents idle past the source's deadline give their reservation back first. */
        uint64_t idle_ns = (tp->cfg.transfer_timeout_ms + 1000) * OTE_NSEC_PER_MSEC;
        end_matching(tp, match_idle, NULL, idle_ns);
        ote_status_t fst;
        /* rdma.sp_reserve: a parent's reservation refused (tests). */
        int fault = ote_fault_hit("rdma.sp_reserve", &fst);
        ote_mutex_lock(&S->mu);
        if (fault) {
            S->st.refused++;
            st = fst;
        } else {
            st = reserve_locked(tp, S, c, rq, ep, qp, mine, &p);
            if (st == OTE_OK) mine = NULL; /* the parent's now */
        }
    } else if (p->budget != rq->u.grant.budget) {
        S->st.bad++;
        st = OTE_ERR_INVALID;
        OTE_WARN_LIMITED("rdma",
                         "requester %s: GRANT_REQ of parent %llu names budget %u, its first "
                         "named %u: refused",
                         c->peer_addr, (unsigned long long)p->id, rq->u.grant.budget, p->budget);
    } else if (tp->cfg.rdma_max_served_grants != 0 && p->live >= p->credits) {
        S->st.busy++; /* its requester's previous grant has not ended here yet */
        st = OTE_ERR_AGAIN;
    }
    if (st == OTE_OK) {
        p->last_ns = now;
        /* A run the requester asked again after an AGAIN is a request of its own there
         * (a new id, the same parent): the parent ends with its latest request. */
        p->uid = rq->u.grant.req_uid;
        int qi = slot_take_locked(p, ep, slot, qp, &mine, &drop);
        if (qi >= 0) S->st.served++;
        else S->st.per_grant++;
        p->live++;
        out->sp = p;
        out->qi = qi;
    }
    ote_mutex_unlock(&S->mu);
    if (drop.qp != NULL) ote_endpoint_return(drop.ep, drop.slot, drop.qp);
    if (mine != NULL) ote_endpoint_return(ep, slot, mine);
    return st;
}

void ote__rdma_sp_put(rdma_tp_t *tp, sp_slot_t *s) {
    sparent_t *p = s->sp;
    if (p == NULL) return;
    s->sp = NULL;
    struct rdma_sparents *S = tp->sparents;
    ote_mutex_lock(&S->mu);
    if (p->live > 0) p->live--;
    p->last_ns = ote_now_ns();
    if (!p->ended && s->qi >= 0) {
        sp_qp_t *e = &p->q[s->qi];
        if (e->used > 0) e->used--;
        /* The grant layer gave its admission back: the slot is the parent's again. The
         * parent's borrow keeps the QP. */
        if (ote_qp_rq_admit(e->qp) != OTE_OK) {
            e->held--;
            S->st.rq--;
        }
    }
    if (p->ended && p->live == 0) {
        unlink_locked(S, p);
        ote_free(p);
    }
    ote_mutex_unlock(&S->mu);
}

void ote__rdma_sp_stats(rdma_tp_t *tp, rdma_sp_stats_t *out) {
    struct rdma_sparents *S = tp->sparents;
    memset(out, 0, sizeof(*out));
    if (S == NULL) return;
    ote_mutex_lock(&S->mu);
    *out = S->st;
    ote_mutex_unlock(&S->mu);
}

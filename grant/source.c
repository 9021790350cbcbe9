/*
 * grant/source.c - source grants: the registration check, the window's bind (or the
 * exact-range MR), the answer, and the ends: receipt, release, deadline, lost requester.
 *
 * Locking: the static helpers and the ote__grant_* functions here run with the grant's
 * lane lock held (grant_internal.h); the bind is posted under it. Pins run with no grant
 * lock held; answers and unpins are deferred until every grant lock is dropped.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <string.h>

#include "base/alloc.h"
#include "base/hash.h"
#include "base/lock.h"
#include "base/log.h"
#include "grant/grant_internal.h"

/* Count one event in the manager's share of the stats (no lane lock needed). */
#define MGR_COUNT(m, field) \
    do { \
        ote_mutex_lock(&(m)->mu); \
        (m)->stats.field++; \
        ote_mutex_unlock(&(m)->mu); \
    } while (0)

/* A bind posted or possibly posted (lane lock held): the window belongs to the grant until
 * its bind WR is discharged (never back to the pool unless proven unbound); its new key is
 * indexed for the receipt. An unknown outcome (or no room to index the key) keeps the
 * debt and fails the grant: the QP is moved to ERR and the grant ends when its bind WR is
 * discharged; the requester is answered through ops->answer. */
static void bind_posted(grant_t *g, uint32_t new_rkey, ote_status_t st, defer_t *df) {
    ote_grant_mgr_t *m = g->m;
    mw_ent_t *ent = g->mw;
    g->bind_wait = 0;
    g->mw_unbound = 0;
    ent->rkey = new_rkey;
    ent->binds++;
    ote__grant_mw_tag_used(ent, new_rkey); /* used, whatever the bind's outcome */
    g->rkey = new_rkey;
    g->outstanding = 1;
    if (st == OTE_OK) {
        ote_mutex_lock(&m->mu);
        OTE_HASH_ADD_KEYPTR(hh_key, m->by_key, &g->rkey, sizeof(g->rkey), g, st);
        ote_mutex_unlock(&m->mu);
        if (st == OTE_OK) g->keyed = 1;
    }
    if (st != OTE_OK) {
        g->failed = st;
        g->sstate = S_ENDED;
        (void)ote_qp_cancel(g->qp);
        (void)ote__grant_defer_answer(df, g, st);
    }
}

/*
 * Post the bind of source grant g (lane lock held). A full send queue is not a refusal:
 * the grant waits on its lane's wait list (S_BINDING, nothing posted) and the lane's next
 * completion (or tick) posts it. Returns the status of a post proven not to have happened
 * (the caller refuses the grant); OTE_OK when posted, possibly posted (an unknown outcome
 * fails the grant here and answers it), or waiting.
 */
ote_status_t ote__grant_bind_post(grant_t *g, defer_t *df) {
    ote_grant_mgr_t *m = g->m;
    mlane_t *ml = &m->lanes[g->lane];
    mw_ent_t *ent = g->mw;
    /* The next unused tag of the window's index (the key domain): a stale rkey of an
     * earlier grant never matches (a pooled window always has one left: window.c). */
    uint32_t new_rkey = ote__grant_mw_next_rkey(ent);
    if (new_rkey == 0) return OTE_ERR_STATE;
    struct ibv_send_wr wr;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = OTE_CQ_WR_ID(ml->ns, ((uint64_t)g->seq << 16) | IDX_BIND);
    wr.opcode = IBV_WR_BIND_MW;
    wr.bind_mw.mw = ent->mw;
    wr.bind_mw.rkey = new_rkey;
    wr.bind_mw.bind_info.mr = g->bind_mr;
    wr.bind_mw.bind_info.addr = g->bind_addr;
    wr.bind_mw.bind_info.length = g->bind_len;
    wr.bind_mw.bind_info.mw_access_flags = (unsigned)g->bind_access;
    ote_qp_post_result_t res;
    ote_status_t st = ote_qp_post_send(g->qp, &wr, g->deadline, &res);
    if (st != OTE_OK && res.accepted == 0) {
        if (ote_status_code(st) == OTE_ERR_AGAIN) {
            g->bind_wait = 1;
            ote__grant_wait_add(ml, g);
            return OTE_OK;
        }
        ml->stats.bind_failures++;
        OTE_WARN("grant", "%s: posting BIND_MW on QP %u failed: %s: grant refused",
                 ote_context_name(m->ctx), g->qp_num, ote_status_str(st));
        return st;
    }
    bind_posted(g, new_rkey, st, df);
    return OTE_OK;
}

/* A waiting bind whose retry was refused (proven not posted): answer and end it. */
void ote__grant_bind_refused(grant_t *g, ote_status_t st, defer_t *df) {
    if (g->failed == OTE_OK) {
        if (!ote__grant_defer_answer(df, g, st)) { /* no room to answer now: on the next kick */
            ote__grant_wait_add(&g->m->lanes[g->lane], g);
            return;
        }
        g->failed = st;
    }
    g->bind_wait = 0;
    g->sstate = S_ENDED;
    ote__grant_maybe_finish(g, df);
}

void ote__grant_source_cqe(grant_t *g, uint32_t idx, const struct ibv_wc *wc, defer_t *df) {
    ote_grant_mgr_t *m = g->m;
    mlane_t *ml = &m->lanes[g->lane];
    ote_status_t st = ote__grant_wc_status(wc);
    if (idx != IDX_BIND) {
        ml->stats.stale_cqes++;
        return;
    }
    if (st == OTE_OK && g->sstate == S_BINDING && g->failed == OTE_OK) {
        g->sstate = S_BOUND;
        g->rkey = g->mw->rkey;
        (void)ote__grant_defer_answer(df, g, OTE_OK);
        return;
    }
    /* Bind failed (or flushed): the QP is in ERR; refuse, release on the spot. */
    if (st != OTE_OK) {
        ml->stats.bind_failures++;
        OTE_WARN("grant", "%s: BIND_MW for grant %u failed: %s (%s): refused",
                 ote_context_name(m->ctx), g->seq, ote_verbs_wc_status_str(wc->status),
                 ote_status_str(st));
    }
    if (g->failed == OTE_OK) {
        g->failed = st != OTE_OK ? st : OTE_ERR_STATE;
        (void)ote__grant_defer_answer(df, g, g->failed);
    }
    g->sstate = S_ENDED;
    ote__grant_maybe_finish(g, df);
}

/* What both kinds of source grant check first: the arguments, the lane of qp among the
 * manager's (out: its index), and the context. */
static ote_status_t serve_check(ote_grant_mgr_t *m, ote_endpoint_t *ep, ote_qp_t *qp,
                                ote_grant_op_t op, uint64_t addr, uint64_t len, uint32_t *li_out) {
    if (m == NULL || !m->has_src || ep == NULL || qp == NULL || len == 0 ||
        addr > UINT64_MAX - len || (op != OTE_GRANT_READ && op != OTE_GRANT_WRITE))
        return OTE_ERR_INVALID;
    ote_cq_lane_t *lane = ote_qp_lane(qp);
    uint32_t li = 0;
    while (li < m->nlanes && m->lanes[li].lane != lane) li++;
    if (li == m->nlanes) return OTE_ERR_INVALID;
    ote_status_t st = ote_context_check(m->ctx);
    if (st == OTE_OK) *li_out = li;
    return st;
}

/* The source's pin refused the range (ACCESS, BUSY, ...): counted, logged, returned. */
static ote_status_t pin_refused(ote_grant_mgr_t *m, const char *kind, ote_grant_op_t op,
                                uint64_t addr, uint64_t len, ote_status_t st) {
    MGR_COUNT(m, refused);
    OTE_WARN_LIMITED("grant", "%s: %s%s grant over [0x%llx, +%llu) refused: %s",
                     ote_context_name(m->ctx), kind, op == OTE_GRANT_WRITE ? "WRITE" : "READ",
                     (unsigned long long)addr, (unsigned long long)len, ote_status_str(st));
    return st;
}

/* A pinned source grant's receipt slot on qp, reserved before any window or key is
 * exposed, so that the requester's receipt never meets an empty receive queue (RNR);
 * without one the request is refused (OTE_ERR_AGAIN: retry later) and its pin given back.
 * Then the grant's record (NULL: out of memory, the admission and the pin given back). */
static grant_t *serve_admit(ote_grant_mgr_t *m, ote_endpoint_t *ep, uint32_t slot, ote_qp_t *qp,
                            uint32_t li, ote_deadline_t deadline, void *pin, uint64_t answer_ctx,
                            ote_status_t *st_out) {
    ote_status_t st = ote_qp_rq_admit(qp);
    if (st != OTE_OK) {
        m->src.unpin(m->src.arg, pin);
        ote_mutex_lock(&m->mu);
        m->stats.refused++;
        m->stats.rq_busy++;
        ote_mutex_unlock(&m->mu);
        OTE_WARN_LIMITED("grant", "%s: QP %u: no receive slot for a grant's receipt: refused (%s)",
                         ote_context_name(m->ctx), ote_qp_num(qp), ote_status_str(st));
        *st_out = st;
        return NULL;
    }
    grant_t *g = ote_calloc(1, sizeof(*g));
    if (g == NULL) {
        ote_qp_rq_unadmit(qp);
        m->src.unpin(m->src.arg, pin);
        *st_out = OTE_ERR_NOMEM;
        return NULL;
    }
    g->m = m;
    g->source = 1;
    g->rq_admitted = 1;
    g->lane = li;
    g->ep = ep;
    g->slot = slot;
    g->qp = qp;
    g->qp_num = ote_qp_num(qp);
    g->deadline = deadline;
    g->pin = pin;
    g->answer_ctx = answer_ctx;
    return g;
}

/* Refuse a record that never became visible: give back what serve_admit took. */
static ote_status_t serve_unwind(ote_grant_mgr_t *m, grant_t *g, void *pin, ote_status_t st) {
    MGR_COUNT(m, refused);
    ote_qp_rq_unadmit(g->qp);
    m->src.unpin(m->src.arg, pin);
    ote_free(g);
    return st;
}

ote_status_t ote_grant_serve(ote_grant_mgr_t *m, ote_endpoint_t *ep, uint32_t slot, ote_qp_t *qp,
                             ote_grant_op_t op, uint64_t addr, uint64_t len,
                             ote_deadline_t deadline, uint64_t answer_ctx, void *call) {
    uint32_t li = 0;
    ote_status_t st = serve_check(m, ep, qp, op, addr, len, &li);
    if (st != OTE_OK) return st;
    int access = op == OTE_GRANT_WRITE ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ;
    struct ibv_mr *mr = NULL;
    void *pin = NULL;
    /* The exact range is checked before any window exists. */
    st = m->src.pin(m->src.arg, call, m->ctx, addr, len, access, &mr, &pin);
    if (st != OTE_OK) return pin_refused(m, "", op, addr, len, st);
    /* The receipt's slot (the requester's SEND_WITH_INV), before any window exists. */
    grant_t *g = serve_admit(m, ep, slot, qp, li, deadline, pin, answer_ctx, &st);
    if (g == NULL) return st;
    g->sstate = S_BINDING;
    ote_mutex_lock(&m->mu);
    st = m->fence; /* a fenced manager takes (and allocates) no window */
    ote_mutex_unlock(&m->mu);
    if (st != OTE_OK) return serve_unwind(m, g, pin, st);
    mw_ent_t *ent = NULL;
    st = ote__grant_mw_take(m, &ent); /* no grant lock held: it may allocate */
    if (st != OTE_OK) {
        OTE_WARN_LIMITED("grant", "%s: no window for a grant: refused (%s)",
                         ote_context_name(m->ctx), ote_status_str(st));
        return serve_unwind(m, g, pin, st);
    }
    g->mw = ent;
    g->mw_unbound = 1; /* until its bind is posted */
    g->bind_mr = mr;
    g->bind_addr = addr;
    g->bind_len = len;
    g->bind_access = access;

    defer_t df = {0};
    mlane_t *ml = &m->lanes[li];
    ote_mutex_lock(&ml->mu);
    st = ote__grant_index(m, ml, g);
    if (st == OTE_OK) {
        ml->stats.served++;
        ml->stats.live_source++;
        st = ote__grant_bind_post(g, &df);
        if (st != OTE_OK) { /* proven not posted: the window was never touched */
            ote__grant_unindex(m, ml, g);
            ml->stats.served--;
            ml->stats.live_source--;
        }
    }
    ote_mutex_unlock(&ml->mu);
    if (st != OTE_OK) {
        ote__grant_mw_put(m, ent);
        return serve_unwind(m, g, pin, st);
    }
    ote__grant_defer_run(m, &df);
    return OTE_OK;
}

/* Index an exact-MR grant under its rkey (lane lock held): never two grants under one
 * key. */
static ote_status_t exact_index(ote_grant_mgr_t *m, mlane_t *ml, grant_t *g) {
    ote_status_t st = ote__grant_index(m, ml, g);
    if (st != OTE_OK) return st;
    ote_mutex_lock(&m->mu);
    grant_t *dup = NULL;
    HASH_FIND(hh_key, m->by_key, &g->rkey, sizeof(g->rkey), dup);
    if (dup != NULL) st = OTE_ERR_STATE; /* an rkey still live here */
    else OTE_HASH_ADD_KEYPTR(hh_key, m->by_key, &g->rkey, sizeof(g->rkey), g, st);
    ote_mutex_unlock(&m->mu);
    if (st == OTE_OK) g->keyed = 1;
    else ote__grant_unindex(m, ml, g);
    return st;
}

ote_status_t ote_grant_serve_exact(ote_grant_mgr_t *m, ote_endpoint_t *ep, uint32_t slot,
                                   ote_qp_t *qp, ote_grant_op_t op, uint64_t addr, uint64_t len,
                                   ote_deadline_t deadline, uint64_t answer_ctx, void *call) {
    uint32_t li = 0;
    ote_status_t st = serve_check(m, ep, qp, op, addr, len, &li);
    if (st != OTE_OK) return st;
    if (m->src.pin_exact == NULL) return OTE_ERR_UNSUPPORTED;
    int access = op == OTE_GRANT_WRITE ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ;
    uint32_t rkey = 0;
    void *pin = NULL;
    st = m->src.pin_exact(m->src.arg, call, qp, addr, len, access, &rkey, &pin);
    if (st != OTE_OK) return pin_refused(m, "exact-MR ", op, addr, len, st);
    /* The receipt's slot (the requester's SEND_WITH_IMM), before the key is answered. */
    grant_t *g = serve_admit(m, ep, slot, qp, li, deadline, pin, answer_ctx, &st);
    if (g == NULL) return st;
    g->exact = 1;
    g->rkey = rkey;
    defer_t df = {0};
    mlane_t *ml = &m->lanes[li];
    ote_mutex_lock(&ml->mu);
    st = exact_index(m, ml, g);
    if (st == OTE_OK) {
        g->sstate = S_BOUND; /* nothing to bind: the MR is the grant */
        ml->stats.served++;
        ml->stats.live_source++;
        (void)ote__grant_defer_answer(&df, g, OTE_OK);
    }
    ote_mutex_unlock(&ml->mu);
    if (st != OTE_OK) return serve_unwind(m, g, pin, st);
    ote__grant_defer_run(m, &df);
    return OTE_OK;
}

void ote_grant_source_receipt(ote_grant_mgr_t *m, uint32_t qp_num, const struct ibv_wc *wc) {
    int imm = (wc->wc_flags & IBV_WC_WITH_IMM) != 0;
    if (!(wc->wc_flags & IBV_WC_WITH_INV) && !imm) {
        OTE_WARN("grant", "QP %u: receive without invalidation: not a grant receipt", qp_num);
        return;
    }
    uint32_t rkey = imm ? ntohl(wc->imm_data) : wc->invalidated_rkey;
    defer_t df = {0};
    mlane_t *ml = NULL;
    grant_t *g = ote__grant_lock_find(m, 1, rkey, &ml);
    /* A window's receipt invalidated it; an exact MR's names its rkey (and only such a
     * grant's: an immediate never ends a window grant, whose window would stay bound). */
    if (g == NULL || g->qp_num != qp_num || g->sstate != S_BOUND || g->exact != imm) {
        if (g != NULL) ote_mutex_unlock(&ml->mu);
        MGR_COUNT(m, stale_receipts);
        OTE_WARN_LIMITED("grant", "QP %u: receipt for rkey 0x%x that names no bound grant: ignored",
                         qp_num, rkey);
        return;
    }
    /* The provider invalidated the window before delivering this CQE. */
    g->mw_unbound = 1;
    g->sstate = S_ENDED;
    ml->stats.receipts++;
    ote__grant_maybe_finish(g, &df);
    ote_mutex_unlock(&ml->mu);
    ote__grant_defer_run(m, &df);
}

ote_status_t ote_grant_source_release(ote_grant_mgr_t *m, const ote_endpoint_t *ep, uint32_t slot,
                                      uint32_t qp_num, uint32_t rkey) {
    if (m == NULL || !m->has_src || ep == NULL) return OTE_ERR_INVALID;
    defer_t df = {0};
    mlane_t *ml = NULL;
    grant_t *g = ote__grant_lock_find(m, 1, rkey, &ml);
    if (g == NULL || !g->source || g->ep != ep || g->slot != slot || g->qp_num != qp_num ||
        g->sstate != S_BOUND || g->failed != OTE_OK) {
        if (g != NULL) ote_mutex_unlock(&ml->mu);
        MGR_COUNT(m, stale_releases);
        return OTE_ERR_NOT_FOUND;
    }
    /* The requester's WRs under the window have all ended. The QP stays as it is (other
     * grants may share it; a broken one is replaced by the requester's next CONNECT on
     * the slot); the window is not proven unbound, so it is deallocated, which
     * invalidates its rkey at once. */
    g->sstate = S_ENDED;
    ml->stats.released++;
    ote__grant_maybe_finish(g, &df);
    ote_mutex_unlock(&ml->mu);
    ote__grant_defer_run(m, &df);
    return OTE_OK;
}

/* End a live source grant now: the requester never sent its receipt, is gone, or our
 * port is down. The QP the window is bound to is killed first (so nothing can use the
 * window), then the window, the pin and the QP borrow are released. Lane lock held. */
void ote__grant_source_end(grant_t *g, ote_status_t why, defer_t *df) {
    if (g->bind_wait) {
        /* Its bind never reached the QP: nothing to kill, just refuse it. */
        ote__grant_wait_remove(&g->m->lanes[g->lane], g);
        ote__grant_bind_refused(g, why, df);
        return;
    }
    if (g->sstate == S_BINDING && g->failed == OTE_OK) {
        if (!ote__grant_defer_answer(df, g, why)) return; /* the monitor's next tick ends it */
        g->failed = why;
    }
    (void)ote_qp_cancel(g->qp);
    if (g->failed == OTE_OK) g->failed = why;
    g->sstate = S_ENDED;
    ote__grant_maybe_finish(g, df);
}

size_t ote_grant_source_live_endpoint(ote_grant_mgr_t *m, const ote_endpoint_t *ep) {
    size_t n = 0;
    for (uint32_t i = 0; i < m->nlanes; i++) {
        mlane_t *ml = &m->lanes[i];
        ote_mutex_lock(&ml->mu);
        for (grant_t *g = ml->live; g != NULL; g = g->live_next)
            n += g->source && g->ep == ep && g->sstate != S_ENDED;
        ote_mutex_unlock(&ml->mu);
    }
    return n;
}

/* End every live source grant of @ep (on @slot only when @slot is not UINT32_MAX). */
/* qp_num 0: any QP. */
static size_t end_matching(ote_grant_mgr_t *m, const ote_endpoint_t *ep, uint32_t slot,
                           uint32_t qp_num) {
    size_t n = 0;
    for (uint32_t i = 0; i < m->nlanes; i++) {
        mlane_t *ml = &m->lanes[i];
        defer_t df = {0};
        ote_mutex_lock(&ml->mu);
        grant_t *next;
        for (grant_t *g = ml->live; g != NULL; g = next) {
            next = g->live_next; /* ending g removes g only */
            if (!g->source || g->ep != ep || g->sstate == S_ENDED) continue;
            if (slot != UINT32_MAX && g->slot != slot) continue;
            if (qp_num != 0 && ote_qp_num(g->qp) != qp_num) continue;
            /* A grant whose deferred answer did not fit this round stays for the tick. */
            g->deadline = 0;
            ote__grant_source_end(g, OTE_ERR_PEER_LOST, &df);
            n++;
        }
        ote_mutex_unlock(&ml->mu);
        ote__grant_defer_run(m, &df);
    }
    return n;
}

size_t ote_grant_source_end_endpoint(ote_grant_mgr_t *m, const ote_endpoint_t *ep) {
    return end_matching(m, ep, UINT32_MAX, 0);
}

size_t ote_grant_source_end_slot(ote_grant_mgr_t *m, const ote_endpoint_t *ep, uint32_t slot) {
    if (m == NULL || ep == NULL || slot == UINT32_MAX) return 0;
    return end_matching(m, ep, slot, 0);
}

size_t ote_grant_source_end_slot_qp(ote_grant_mgr_t *m, const ote_endpoint_t *ep, uint32_t slot,
                                    uint32_t qp_num) {
    if (m == NULL || ep == NULL || slot == UINT32_MAX || qp_num == 0) return 0;
    return end_matching(m, ep, slot, qp_num);
}

/*
 * grant/grant.c - what requester and source grants share: deferred work, the end of a
 * record, lane locking and indexing, the wait lists, the completion callback of every
 * lane namespace, and the monitor's tick. Requester grants are in requester.c, source
 * grants in source.c, windows in window.c.
 *
 * Locking: see grant_internal.h. Each lane's grants post and complete under that lane's
 * lock; the manager lock only guards the shared tables, the pool and the fence, for a
 * few instructions at a time. User callbacks run after every grant lock is dropped.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <string.h>

#include "base/alloc.h"
#include "base/hash.h"
#include "base/lock.h"
#include "base/log.h"
#include "grant/grant_internal.h"

/* ---- deferred work ------------------------------------------------------------------- */

int ote__grant_defer_answer(defer_t *df, grant_t *g, ote_status_t st) {
    if (df->nans == DEFER_ANSWERS) return 0;
    df->ans[df->nans].ctx = g->answer_ctx;
    df->ans[df->nans].st = st;
    df->ans[df->nans].rkey = st == OTE_OK ? g->rkey : 0;
    df->nans++;
    return 1;
}

void ote__grant_defer_run(ote_grant_mgr_t *m, defer_t *df) {
    for (size_t i = 0; i < df->nans; i++)
        m->src.answer(m->src.arg, df->ans[i].ctx, df->ans[i].st, df->ans[i].rkey);
    df->nans = 0;
    ote__grant_mw_defer_run(m, df);
    while (df->fin != NULL) {
        grant_t *g = df->fin;
        df->fin = g->fin_next;
        if (g->source) {
            if (g->pin != NULL) m->src.unpin(m->src.arg, g->pin);
        } else if (g->d.done != NULL) {
            /* Every WR it posted was discharged: the source may drop its window now. */
            if (g->abandon && g->d.abandoned != NULL)
                g->d.abandoned(g->d.done_arg, g->slot, g->remote_qpn, g->rkey);
            ote_status_t st = g->failed;
            if (st == OTE_OK && g->cut) st = OTE_ERR_CANCELED;
            g->d.done(g->d.done_arg, st);
        }
        ote_free(g);
    }
}

ote_status_t ote__grant_wc_status(const struct ibv_wc *wc) {
    switch (wc->status) {
        case IBV_WC_SUCCESS: return OTE_OK;
        case IBV_WC_REM_ACCESS_ERR: return OTE_ERR_REMOTE_ACCESS;
        case IBV_WC_RETRY_EXC_ERR:
        case IBV_WC_RNR_RETRY_EXC_ERR: return OTE_ERR_PEER_LOST;
        case IBV_WC_REM_INV_REQ_ERR:
        case IBV_WC_REM_OP_ERR: return OTE_ERR_REMOTE;
        case IBV_WC_WR_FLUSH_ERR: return ote_status_make(OTE_ERR_CANCELED, 0);
        default: return ote_status_make(OTE_ERR_NATIVE, (int)wc->status);
    }
}

/* Give the QP borrow back once; retire the slot first when the QP is broken. */
void ote__grant_give_back_qp(grant_t *g, int broken) {
    if (g->qp_returned) return;
    if (broken) ote_endpoint_retire(g->ep, g->slot, g->qp);
    ote_endpoint_return(g->ep, g->slot, g->qp);
    g->qp_returned = 1;
}

/* ---- lanes: finding, indexing, waiting ------------------------------------------------ */

static grant_t *find_locked(ote_grant_mgr_t *m, int by_key, uint32_t k) {
    grant_t *g = NULL;
    if (by_key) HASH_FIND(hh_key, m->by_key, &k, sizeof(k), g);
    else HASH_FIND(hh, m->by_seq, &k, sizeof(k), g);
    return g;
}

grant_t *ote__grant_lock_find(ote_grant_mgr_t *m, int by_key, uint32_t k, mlane_t **ml_out) {
    for (;;) {
        ote_mutex_lock(&m->mu);
        grant_t *g = find_locked(m, by_key, k);
        uint32_t li = g != NULL ? g->lane : 0; /* fixed at creation */
        ote_mutex_unlock(&m->mu);
        if (g == NULL) return NULL;
        mlane_t *ml = &m->lanes[li];
        ote_mutex_lock(&ml->mu);
        ote_mutex_lock(&m->mu);
        g = find_locked(m, by_key, k);
        ote_mutex_unlock(&m->mu);
        if (g != NULL && g->lane == li) {
            *ml_out = ml; /* it leaves the tables only under this lock: valid until dropped */
            return g;
        }
        ote_mutex_unlock(&ml->mu);
        if (g == NULL) return NULL;
        /* The key now names a record of another lane (the first one ended meanwhile). */
    }
}

static void live_add(mlane_t *ml, grant_t *g) {
    g->live_prev = NULL;
    g->live_next = ml->live;
    if (ml->live != NULL) ml->live->live_prev = g;
    ml->live = g;
}

static void live_remove(mlane_t *ml, grant_t *g) {
    if (g->live_prev != NULL) g->live_prev->live_next = g->live_next;
    else ml->live = g->live_next;
    if (g->live_next != NULL) g->live_next->live_prev = g->live_prev;
    g->live_prev = g->live_next = NULL;
}

ote_status_t ote__grant_index(ote_grant_mgr_t *m, mlane_t *ml, grant_t *g) {
    ote_mutex_lock(&m->mu);
    ote_status_t st = m->fence;
    if (st == OTE_OK) st = ote__grant_seq_assign(m, g);
    ote_mutex_unlock(&m->mu);
    if (st == OTE_OK) live_add(ml, g);
    return st;
}

void ote__grant_unindex(ote_grant_mgr_t *m, mlane_t *ml, grant_t *g) {
    ote__grant_wait_remove(ml, g);
    ote_mutex_lock(&m->mu);
    HASH_DEL(m->by_seq, g);
    if (g->keyed) HASH_DELETE(hh_key, m->by_key, g);
    g->keyed = 0;
    ote_mutex_unlock(&m->mu);
    live_remove(ml, g);
}

void ote__grant_wait_remove(mlane_t *ml, grant_t *g) {
    if (!g->waiting) return;
    grant_t **pp = &ml->wait_head, *prev = NULL;
    while (*pp != NULL && *pp != g) {
        prev = *pp;
        pp = &(*pp)->wait_next;
    }
    if (*pp == g) {
        *pp = g->wait_next;
        if (ml->wait_tail == g) ml->wait_tail = prev;
    }
    g->wait_next = NULL;
    g->waiting = 0;
}

void ote__grant_wait_add(mlane_t *ml, grant_t *g) {
    if (g->waiting) return;
    g->waiting = 1;
    g->wait_next = NULL;
    if (ml->wait_tail) ml->wait_tail->wait_next = g;
    else ml->wait_head = g;
    ml->wait_tail = g;
    ml->stats.sq_waits++;
}

/* ---- ends ------------------------------------------------------------------------------ */

static void finish_requester(mlane_t *ml, grant_t *g, defer_t *df) {
    ote__grant_unindex(g->m, ml, g);
    ote__grant_give_back_qp(g, g->failed != OTE_OK && g->rstate != R_WAIT_ANSWER);
    if (g->failed == OTE_OK) ml->stats.completed++;
    else ml->stats.failed++;
    /* Failed after the source bound its window: no receipt will invalidate it. */
    g->abandon = g->failed != OTE_OK && g->answered;
    if (g->abandon) ml->stats.abandoned++;
    ml->stats.live_requester--;
    g->rstate = R_ENDED;
    g->finished = 1;
    g->fin_next = df->fin;
    df->fin = g;
}

static void finish_source(mlane_t *ml, grant_t *g, defer_t *df) {
    ote_grant_mgr_t *m = g->m;
    ote__grant_wait_remove(ml, g);
    ote_mutex_lock(&m->mu);
    HASH_DEL(m->by_seq, g);
    if (g->keyed) {
        HASH_DELETE(hh_key, m->by_key, g);
        g->keyed = 0;
    }
    if (g->mw != NULL) {
        ote__grant_mw_release(m, g->mw, g->mw_unbound, df);
        g->mw = NULL;
    }
    ote_mutex_unlock(&m->mu);
    live_remove(ml, g);
    if (g->rq_admitted) { /* its receipt came, or never will */
        ote_qp_rq_unadmit(g->qp);
        g->rq_admitted = 0;
    }
    ote__grant_give_back_qp(g, g->failed != OTE_OK);
    ml->stats.live_source--;
    g->finished = 1;
    g->fin_next = df->fin;
    df->fin = g;
}

void ote__grant_maybe_finish(grant_t *g, defer_t *df) {
    mlane_t *ml = &g->m->lanes[g->lane];
    if (g->outstanding != 0 || g->finished) return;
    if (!g->source) {
        int ended = g->rstate == R_ENDED || g->failed != OTE_OK;
        if (ended) finish_requester(ml, g, df);
        return;
    }
    if (g->sstate == S_ENDED) finish_source(ml, g, df);
}

/* ---- completions ----------------------------------------------------------------------- */

/* Let the lane's blocked grants go on, in order (its lock held). */
static void kick_lane(mlane_t *ml, defer_t *df) {
    grant_t *list = ml->wait_head;
    ml->wait_head = ml->wait_tail = NULL;
    while (list != NULL) {
        grant_t *g = list;
        list = g->wait_next;
        g->wait_next = NULL;
        g->waiting = 0;
        if (g->source) {
            if (g->bind_wait && g->sstate == S_BINDING && g->failed == OTE_OK) {
                ote_status_t st = ote__grant_bind_post(g, df);
                if (st != OTE_OK) ote__grant_bind_refused(g, st, df);
            }
        } else if (g->rstate == R_POSTING) {
            if (g->next < g->nslices) ote__grant_pump(g, df);
            else if (g->done_slices == g->nslices) ote__grant_post_inv(g, df);
        }
        if (g->waiting && ml->wait_head == g) {
            /* Still blocked: keep the rest queued behind it, in order. */
            g->wait_next = list;
            if (list != NULL) {
                grant_t *t = list;
                while (t->wait_next) t = t->wait_next;
                ml->wait_tail = t;
            }
            return;
        }
    }
}

void ote__grant_on_cqe(void *arg, ote_cq_lane_t *lane, ote_cq_dir_t dir, const struct ibv_wc *wc) {
    (void)lane;
    mlane_t *ml = arg;
    ote_grant_mgr_t *m = ml->m;
    defer_t df = {0};
    uint64_t local = OTE_CQ_WR_LOCAL(wc->wr_id);
    uint32_t seq = (uint32_t)(local >> 16), idx = (uint32_t)(local & 0xffff);
    /* Only this lane's grants post in this lane's namespace: its lock is enough. */
    ote_mutex_lock(&ml->mu);
    ote_mutex_lock(&m->mu);
    grant_t *g = find_locked(m, 0, seq);
    ote_mutex_unlock(&m->mu);
    if (dir != OTE_CQ_SEND || g == NULL || g->lane != ml->idx || g->outstanding == 0 ||
        g->qp_num != wc->qp_num) {
        ml->stats.stale_cqes++;
        ote_mutex_unlock(&ml->mu);
        OTE_WARN("grant", "completion 0x%llx on QP %u names no live grant: dropped",
                 (unsigned long long)wc->wr_id, wc->qp_num);
        return;
    }
    g->outstanding--;
    if (g->source) ote__grant_source_cqe(g, idx, wc, &df);
    else ote__grant_requester_cqe(g, idx, wc, &df);
    /* Room on this lane's SQs/CQ: let blocked grants go on. */
    kick_lane(ml, &df);
    ote_mutex_unlock(&ml->mu);
    ote__grant_defer_run(m, &df);
}

/* ---- the monitor's tick ---------------------------------------------------------------- */

/* One lane's share of a tick (its lock held): retry waiting grants, end expired ones, or
 * every one when `down` is not OTE_OK. */
static void tick_lane(mlane_t *ml, ote_status_t down, uint64_t now, defer_t *df) {
    ote_grant_mgr_t *m = ml->m;
    kick_lane(ml, df);
    grant_t *next;
    for (grant_t *g = ml->live; g != NULL; g = next) {
        next = g->live_next; /* ending g removes g only */
        int expired = g->deadline <= now;
        if (!expired && down == OTE_OK) continue;
        ote_status_t why = expired ? OTE_ERR_TIMEOUT : down;
        if (!g->source) {
            if (g->failed != OTE_OK || g->rstate == R_ENDED || g->requesting) continue;
            if (expired) ml->stats.expired++;
            OTE_WARN_LIMITED("grant",
                             "grant %u: %s with %u of %u slices done, %u WRs owed: failing "
                             "it; QP %u fenced and flushed",
                             g->seq, expired ? "deadline passed" : ote_status_str(why),
                             g->done_slices, g->nslices, g->outstanding, g->qp_num);
            ote__grant_fail_requester(g, why, df);
        } else if (g->sstate != S_ENDED) {
            if (expired) ml->stats.source_expired++;
            OTE_WARN_LIMITED("grant",
                             "%s: source grant %u %s%s: QP %u moved to ERR, window released",
                             ote_context_name(m->ctx), g->seq,
                             expired ? "not invalidated by its deadline" : "ended: ",
                             expired ? "" : ote_status_str(why), g->qp_num);
            ote__grant_source_end(g, why, df);
        }
    }
}

size_t ote_grant_mgr_tick(ote_grant_mgr_t *m) {
    uint64_t now = ote_now_ns();
    /* A context whose port went down (or whose device failed), or a fenced manager (its
     * transport's teardown), ends its in-flight grants now, with that status, instead of
     * leaving them to their deadlines. */
    ote_status_t down = ote_context_check(m->ctx);
    ote_mutex_lock(&m->mu);
    if (down == OTE_OK) down = m->fence;
    int retained = m->retained != NULL;
    ote_mutex_unlock(&m->mu);
    if (retained) (void)ote__grant_mw_retry_retained(m); /* the monitor's retry */
    for (uint32_t i = 0; i < m->nlanes; i++) {
        defer_t df = {0};
        ote_mutex_lock(&m->lanes[i].mu);
        tick_lane(&m->lanes[i], down, now, &df);
        ote_mutex_unlock(&m->lanes[i].mu);
        ote__grant_defer_run(m, &df);
    }
    ote_mutex_lock(&m->mu);
    size_t live = HASH_COUNT(m->by_seq);
    ote_mutex_unlock(&m->mu);
    return live;
}

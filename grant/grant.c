/*
 * grant/grant.c - requester grants (answer, slices, invalidation) and source grants
 * (registration check, MW bind, receipt), with their deadlines, and the monitor's tick.
 * Geometry, sequence numbers, windows and the manager's lifecycle are in manager.c.
 *
 * Locking: one manager mutex guards every grant of the manager, the MW pool and the
 * per-lane wait lists. It may be held across ote_qp_post_send()/ote_qp_cancel() and
 * endpoint return/retire (lock order: manager -> qp -> lane tables; manager -> endpoint
 * store). It is never held across the user callbacks (done, answer, unpin), which are
 * deferred until the mutex is dropped, nor across anything that drives a lane.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <string.h>

#include "base/alloc.h"
#include "base/hash.h"
#include "base/lock.h"
#include "base/log.h"
#include "grant/grant_internal.h"

/* ---- records ------------------------------------------------------------------------- */

/* Work deferred until the manager mutex is dropped. Answers are copied by value: the
 * grant they came from may end in another thread as soon as the mutex is released. */
#define DEFER_ANSWERS 32
typedef struct {
    grant_t *fin;
    size_t nans;
    struct {
        uint64_t ctx;
        ote_status_t st;
        uint32_t rkey;
    } ans[DEFER_ANSWERS];
} defer_t;

static int defer_answer(defer_t *df, grant_t *g, ote_status_t st) {
    if (df->nans == DEFER_ANSWERS) return 0;
    df->ans[df->nans].ctx = g->answer_ctx;
    df->ans[df->nans].st = st;
    df->ans[df->nans].rkey = st == OTE_OK ? g->rkey : 0;
    df->nans++;
    return 1;
}

static void defer_run(ote_grant_mgr_t *m, defer_t *df) {
    for (size_t i = 0; i < df->nans; i++)
        m->src.answer(m->src.arg, df->ans[i].ctx, df->ans[i].st, df->ans[i].rkey);
    df->nans = 0;
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

static ote_status_t wc_status(const struct ibv_wc *wc) {
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
static void give_back_qp(grant_t *g, int broken) {
    if (g->qp_returned) return;
    if (broken) ote_endpoint_retire(g->ep, g->slot, g->qp);
    ote_endpoint_return(g->ep, g->slot, g->qp);
    g->qp_returned = 1;
}

static void wait_remove(mlane_t *ml, grant_t *g) {
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

static void wait_add(mlane_t *ml, grant_t *g) {
    if (g->waiting) return;
    g->waiting = 1;
    g->wait_next = NULL;
    if (ml->wait_tail) ml->wait_tail->wait_next = g;
    else ml->wait_head = g;
    ml->wait_tail = g;
    g->m->stats.sq_waits++;
}

/* End a record once nothing it posted is owed any more. m->mu held. */
static void maybe_finish(grant_t *g, defer_t *df) {
    ote_grant_mgr_t *m = g->m;
    if (g->outstanding != 0 || g->finished) return;
    if (!g->source) {
        int ended = g->rstate == R_ENDED || (g->failed != OTE_OK && g->rstate != R_ENDED);
        if (!ended) return;
        wait_remove(&m->lanes[g->lane], g);
        HASH_DEL(m->by_seq, g);
        give_back_qp(g, g->failed != OTE_OK && g->rstate != R_WAIT_ANSWER);
        if (g->failed == OTE_OK) m->stats.completed++;
        else m->stats.failed++;
        /* Failed after the source bound its window: no receipt will invalidate it. */
        g->abandon = g->failed != OTE_OK && g->answered;
        if (g->abandon) m->stats.abandoned++;
        m->stats.live_requester--;
        g->rstate = R_ENDED;
        g->finished = 1;
        g->fin_next = df->fin;
        df->fin = g;
        return;
    }
    if (g->sstate != S_ENDED) return;
    HASH_DEL(m->by_seq, g);
    if (g->keyed) {
        HASH_DELETE(hh_key, m->by_key, g);
        g->keyed = 0;
    }
    if (g->mw != NULL) {
        if (g->mw_unbound) {
            g->mw->next = m->pool;
            m->pool = g->mw;
            m->stats.mw_pool++;
        } else {
            /* The window may still be bound: only dealloc (which unbinds) is safe. */
            (void)ote__grant_mw_dealloc_or_retain(m, g->mw);
        }
        g->mw = NULL;
    }
    if (g->rq_admitted) { /* its receipt came, or never will */
        ote_qp_rq_unadmit(g->qp);
        g->rq_admitted = 0;
    }
    give_back_qp(g, g->failed != OTE_OK);
    m->stats.live_source--;
    g->finished = 1;
    g->fin_next = df->fin;
    df->fin = g;
}

static void fail_requester(grant_t *g, ote_status_t st, defer_t *df) {
    if (g->failed == OTE_OK) g->failed = st;
    if (g->rstate != R_WAIT_ANSWER && !g->qp_returned) {
        /* The QP carried our WRs: fence and flush it, then let the slot be rebuilt. */
        (void)ote_qp_cancel(g->qp);
        give_back_qp(g, 1);
    }
    maybe_finish(g, df);
}

/* ---- requester ----------------------------------------------------------------------- */

static void pump(grant_t *g, defer_t *df);
static ote_status_t bind_post(grant_t *g, defer_t *df);
static void bind_refused(grant_t *g, ote_status_t st, defer_t *df);

static void post_inv(grant_t *g, defer_t *df) {
    ote_grant_mgr_t *m = g->m;
    struct ibv_send_wr wr;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = OTE_CQ_WR_ID(m->lanes[g->lane].ns, ((uint64_t)g->seq << 16) | IDX_INV);
    if (g->d.receipt_imm) {
        wr.opcode = IBV_WR_SEND_WITH_IMM; /* an MR: nothing the receipt can invalidate */
        wr.imm_data = htonl(g->rkey);
    } else {
        wr.opcode = IBV_WR_SEND_WITH_INV;
        wr.invalidate_rkey = g->rkey;
    }
    wr.num_sge = 0;
    ote_qp_post_result_t res;
    ote_status_t st = ote_qp_post_send(g->qp, &wr, g->d.deadline, &res);
    if (st == OTE_OK) {
        g->outstanding++;
        g->rstate = R_INVALIDATING;
        return;
    }
    if (ote_status_code(st) == OTE_ERR_AGAIN) {
        wait_add(&m->lanes[g->lane], g);
        return;
    }
    if (res.accepted > 0) g->outstanding += (uint32_t)res.accepted; /* unknown outcome */
    fail_requester(g, st, df);
}

static void pump(grant_t *g, defer_t *df) {
    ote_grant_mgr_t *m = g->m;
    mlane_t *ml = &m->lanes[g->lane];
    if (g->rstate != R_POSTING || g->failed != OTE_OK) return;
    if (g->next < g->nslices && g->d.canceled != NULL && g->d.canceled(g->d.done_arg)) {
        /* Canceled: what is posted finishes, the rest never goes; the receipt follows. */
        g->nslices = g->next;
        g->cut = 1;
    }
    while (g->next < g->nslices) {
        struct ibv_send_wr wrs[CHAIN];
        struct ibv_sge sges[CHAIN];
        uint32_t n = g->nslices - g->next < CHAIN ? g->nslices - g->next : CHAIN;
        for (uint32_t k = 0; k < n; k++) {
            uint32_t i = g->next + k;
            uint64_t off;
            uint32_t len;
            ote_grant_slice_at(g->d.len, i, &off, &len);
            memset(&wrs[k], 0, sizeof(wrs[k]));
            sges[k].addr = (uintptr_t)(g->d.local + off);
            sges[k].length = len;
            sges[k].lkey = g->d.lkey;
            wrs[k].wr_id = OTE_CQ_WR_ID(ml->ns, ((uint64_t)g->seq << 16) | i);
            wrs[k].sg_list = &sges[k];
            wrs[k].num_sge = 1;
            wrs[k].opcode = g->d.op == OTE_GRANT_WRITE ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
            wrs[k].wr.rdma.remote_addr = g->d.remote + off;
            wrs[k].wr.rdma.rkey = g->rkey;
            wrs[k].next = k + 1 < n ? &wrs[k + 1] : NULL;
        }
        ote_qp_post_result_t res;
        ote_status_t st = ote_qp_post_send(g->qp, wrs, g->d.deadline, &res);
        g->next += (uint32_t)res.accepted;
        g->outstanding += (uint32_t)res.accepted;
        m->stats.slices_posted += res.accepted;
        if (st == OTE_OK) continue;
        if (ote_status_code(st) == OTE_ERR_AGAIN) {
            wait_add(ml, g);
            return;
        }
        if (ote_status_code(st) != OTE_ERR_FENCED && res.accepted > 0 && res.unposted != NULL) {
            /* Proven partial acceptance: the suffix was not posted; retry it once the SQ
             * drains (the accepted prefix completes on its own). */
            m->stats.partial_posts++;
            wait_add(ml, g);
            return;
        }
        OTE_WARN_LIMITED("grant", "grant %u: posting slice %u of %u failed: %s", g->seq, g->next,
                         g->nslices, ote_status_str(st));
        fail_requester(g, st, df);
        return;
    }
    if (g->done_slices == g->nslices) post_inv(g, df);
}

ote_status_t ote_grant_start(ote_grant_mgr_t *m, const ote_grant_desc_t *d,
                             const ote_grant_ctl_t *ctl) {
    if (m == NULL || d == NULL || ctl == NULL || ctl->request == NULL || d->qp == NULL ||
        d->ep == NULL || d->len == 0 || d->len > OTE_GRANT_MAX_LEN || d->local == NULL)
        return OTE_ERR_INVALID;
    ote_cq_lane_t *lane = ote_qp_lane(d->qp);
    uint32_t li = 0;
    while (li < m->nlanes && m->lanes[li].lane != lane) li++;
    if (li == m->nlanes) return OTE_ERR_INVALID;
    ote_status_t st = ote_context_check(m->ctx);
    if (st != OTE_OK) return st;
    grant_t *g = ote_calloc(1, sizeof(*g));
    if (g == NULL) return OTE_ERR_NOMEM;
    g->m = m;
    g->d = *d;
    g->lane = li;
    g->ep = d->ep;
    g->slot = d->slot;
    g->qp = d->qp;
    g->qp_num = ote_qp_num(d->qp);
    g->deadline = d->deadline;
    g->nslices = ote_grant_slice_count(d->len);
    g->rstate = R_WAIT_ANSWER;
    /* Read before the record is findable (its answer may come before request returns). */
    uint32_t remote_qpn = ote_endpoint_remote_qpn(d->ep, d->slot);
    g->remote_qpn = remote_qpn;
    ote_mutex_lock(&m->mu);
    if (m->fence != OTE_OK) {
        st = m->fence;
        ote_mutex_unlock(&m->mu);
        ote_free(g);
        return st;
    }
    st = ote__grant_seq_assign(m, g);
    if (st != OTE_OK) {
        ote_mutex_unlock(&m->mu);
        ote_free(g);
        return st;
    }
    m->stats.started++;
    m->stats.live_requester++;
    uint32_t seq = g->seq;
    g->requesting = 1; /* a tick leaves it alone until request() returned */
    ote_mutex_unlock(&m->mu);

    /* The answer may arrive before request() returns: the record is already findable (and
     * may be ended and freed by then: looked up again). */
    st = ctl->request(ctl->arg, seq, d->slot, remote_qpn, d->op, d->remote, d->len);
    ote_mutex_lock(&m->mu);
    HASH_FIND(hh, m->by_seq, &seq, sizeof(seq), g);
    if (g != NULL) g->requesting = 0;
    if (st != OTE_OK && g != NULL && g->rstate == R_WAIT_ANSWER) {
        /* Nothing was sent: withdraw the record; the borrow stays the caller's. */
        HASH_DEL(m->by_seq, g);
        m->stats.started--;
        m->stats.live_requester--;
        ote_mutex_unlock(&m->mu);
        ote_free(g);
        return st;
    }
    ote_mutex_unlock(&m->mu);
    return OTE_OK; /* sent, or already ended by its answer (done ran: it had the borrow) */
}

ote_status_t ote_grant_on_answer(ote_grant_mgr_t *m, uint64_t grant_id, ote_status_t st,
                                 uint32_t rkey) {
    return ote_grant_on_answer_at(m, grant_id, st, rkey, 0, 0);
}

ote_status_t ote_grant_on_answer_at(ote_grant_mgr_t *m, uint64_t grant_id, ote_status_t st,
                                    uint32_t rkey, int rebase, uint64_t remote) {
    defer_t df = {.fin = NULL, .nans = 0};
    uint32_t seq = (uint32_t)grant_id;
    ote_mutex_lock(&m->mu);
    grant_t *g = NULL;
    if (grant_id <= SEQ_MASK) HASH_FIND(hh, m->by_seq, &seq, sizeof(seq), g);
    if (g == NULL || g->source || g->rstate != R_WAIT_ANSWER || g->failed != OTE_OK) {
        m->stats.stale_receipts++;
        ote_mutex_unlock(&m->mu);
        OTE_DEBUG("grant", "answer for grant %llu that no longer waits: ignored",
                  (unsigned long long)grant_id);
        return OTE_ERR_NOT_FOUND;
    }
    if (st != OTE_OK) {
        OTE_WARN_LIMITED("grant", "grant %u ([0x%llx, +%llu) %s) refused by the source: %s", g->seq,
                         (unsigned long long)g->d.remote, (unsigned long long)g->d.len,
                         g->d.op == OTE_GRANT_WRITE ? "WRITE" : "READ", ote_status_str(st));
        /* The source could not give access (its bind failed: its QP went to ERR), failed
         * otherwise, or the peer was lost: the source's end of the QP may be broken, so
         * retire ours and let the slot be rebuilt. A refusal of the range itself (ACCESS,
         * ...) leaves the connection as it was. */
        int code = ote_status_code(st);
        /* STATE: the source has no such connection (a cache miss): ours is stale too. */
        if (code == OTE_ERR_REMOTE_ACCESS || code == OTE_ERR_REMOTE || code == OTE_ERR_PEER_LOST ||
            code == OTE_ERR_STATE)
            give_back_qp(g, 1);
        fail_requester(g, st, &df);
    } else {
        if (rebase) g->d.remote = remote; /* the window covers a staged copy there */
        g->rkey = rkey;
        g->answered = 1;
        g->rstate = R_POSTING;
        pump(g, &df);
    }
    ote_mutex_unlock(&m->mu);
    defer_run(m, &df);
    return OTE_OK;
}

/* ---- completions ----------------------------------------------------------------------- */

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
                ote_status_t st = bind_post(g, df);
                if (st != OTE_OK) bind_refused(g, st, df);
            }
        } else if (g->rstate == R_POSTING) {
            if (g->next < g->nslices) pump(g, df);
            else if (g->done_slices == g->nslices) post_inv(g, df);
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
    defer_t df = {.fin = NULL, .nans = 0};
    uint64_t local = OTE_CQ_WR_LOCAL(wc->wr_id);
    uint32_t seq = (uint32_t)(local >> 16), idx = (uint32_t)(local & 0xffff);
    ote_mutex_lock(&m->mu);
    grant_t *g = NULL;
    HASH_FIND(hh, m->by_seq, &seq, sizeof(seq), g);
    if (dir != OTE_CQ_SEND || g == NULL || g->outstanding == 0 || g->qp_num != wc->qp_num) {
        m->stats.stale_cqes++;
        ote_mutex_unlock(&m->mu);
        OTE_WARN("grant", "completion 0x%llx on QP %u names no live grant: dropped",
                 (unsigned long long)wc->wr_id, wc->qp_num);
        return;
    }
    g->outstanding--;
    ote_status_t st = wc_status(wc);
    if (g->source) {
        if (idx != IDX_BIND) {
            m->stats.stale_cqes++;
        } else if (st == OTE_OK && g->sstate == S_BINDING && g->failed == OTE_OK) {
            g->sstate = S_BOUND;
            g->rkey = g->mw->rkey;
            (void)defer_answer(&df, g, OTE_OK);
        } else {
            /* Bind failed (or flushed): the QP is in ERR; refuse, release on the spot. */
            if (st != OTE_OK) {
                m->stats.bind_failures++;
                OTE_WARN("grant", "%s: BIND_MW for grant %u failed: %s (%s): refused",
                         ote_context_name(m->ctx), g->seq, ote_verbs_wc_status_str(wc->status),
                         ote_status_str(st));
            }
            if (g->failed == OTE_OK) {
                g->failed = st != OTE_OK ? st : OTE_ERR_STATE;
                (void)defer_answer(&df, g, g->failed);
            }
            g->sstate = S_ENDED;
            maybe_finish(g, &df);
        }
    } else if (idx == IDX_INV) {
        if (st == OTE_OK && g->failed == OTE_OK) g->rstate = R_ENDED;
        else fail_requester(g, st != OTE_OK ? st : g->failed, &df);
        maybe_finish(g, &df);
    } else {
        if (st == OTE_OK && idx < g->nslices) {
            g->done_slices++;
            m->stats.slices_completed++;
            if (g->failed == OTE_OK && g->next == g->nslices && g->done_slices == g->nslices)
                post_inv(g, &df);
        } else if (st != OTE_OK) {
            if (g->failed == OTE_OK)
                OTE_WARN_LIMITED("grant", "grant %u: slice %u ended %s: %s", g->seq, idx,
                                 ote_verbs_wc_status_str(wc->status), ote_status_str(st));
            fail_requester(g, st, &df);
        }
        maybe_finish(g, &df);
    }
    /* Room on this lane's SQs/CQ: let blocked grants go on. */
    kick_lane(ml, &df);
    ote_mutex_unlock(&m->mu);
    defer_run(m, &df);
}

/* ---- source ------------------------------------------------------------------------- */

/*
 * Post the bind of source grant g (m->mu held). A full send queue is not a refusal: the
 * grant waits on its lane's wait list (S_BINDING, nothing posted) and kick_lane() posts
 * it once a completion makes room. Returns the status of a post proven not to have
 * happened (the caller refuses the grant); OTE_OK when posted, possibly posted (an
 * unknown outcome fails the grant here and answers it), or waiting.
 */
static ote_status_t bind_post(grant_t *g, defer_t *df) {
    ote_grant_mgr_t *m = g->m;
    mw_ent_t *ent = g->mw;
    /* A new tag on every bind: a stale rkey of an earlier grant never matches. */
    uint32_t new_rkey = (ent->rkey & 0xffffff00u) | ((ent->rkey + 1) & 0xffu);
    struct ibv_send_wr wr;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = OTE_CQ_WR_ID(m->lanes[g->lane].ns, ((uint64_t)g->seq << 16) | IDX_BIND);
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
            wait_add(&m->lanes[g->lane], g);
            return OTE_OK;
        }
        m->stats.bind_failures++;
        OTE_WARN("grant", "%s: posting BIND_MW on QP %u failed: %s: grant refused",
                 ote_context_name(m->ctx), g->qp_num, ote_status_str(st));
        return st;
    }
    /* Posted (or possibly posted): the window belongs to this grant until its bind WR
     * is discharged; never back to the pool unless proven unbound. */
    g->bind_wait = 0;
    g->mw_unbound = 0;
    ent->rkey = new_rkey;
    g->rkey = new_rkey;
    g->outstanding = 1;
    if (st == OTE_OK) {
        OTE_HASH_ADD_KEYPTR(hh_key, m->by_key, &g->rkey, sizeof(g->rkey), g, st);
        if (st == OTE_OK) g->keyed = 1;
    }
    if (st != OTE_OK) {
        /* Unknown outcome (or no room to index the key): keep the debt, fail the grant;
         * the QP is moved to ERR and the grant ends when its bind WR is discharged. The
         * requester is answered through ops->answer, as for any accepted request. */
        g->failed = st;
        g->sstate = S_ENDED;
        (void)ote_qp_cancel(g->qp);
        (void)defer_answer(df, g, st);
    }
    return OTE_OK;
}

/* A waiting bind whose retry was refused (proven not posted): answer and end it. */
static void bind_refused(grant_t *g, ote_status_t st, defer_t *df) {
    if (g->failed == OTE_OK) {
        if (!defer_answer(df, g, st)) { /* no room to answer now: on the next kick */
            wait_add(&g->m->lanes[g->lane], g);
            return;
        }
        g->failed = st;
    }
    g->bind_wait = 0;
    g->sstate = S_ENDED;
    maybe_finish(g, df);
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
    ote_mutex_lock(&m->mu);
    m->stats.refused++;
    ote_mutex_unlock(&m->mu);
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

    defer_t df = {.fin = NULL, .nans = 0};
    ote_mutex_lock(&m->mu);
    if (m->fence != OTE_OK) {
        st = m->fence;
        goto err_unlock;
    }
    mw_ent_t *ent = m->pool;
    if (ent != NULL) {
        m->pool = ent->next;
        m->stats.mw_pool--;
    } else {
        ent = ote_calloc(1, sizeof(*ent));
        if (ent == NULL) {
            st = OTE_ERR_NOMEM;
            goto err_unlock;
        }
        int err = m->v->ops->alloc_mw(m->v, ote_context_pd(m->ctx), IBV_MW_TYPE_2, &ent->mw);
        if (err != 0) {
            ote_free(ent);
            st = ote_status_make(OTE_ERR_NATIVE, err);
            OTE_WARN("grant", "%s: alloc_mw(type 2) failed: errno %d: grant refused",
                     ote_context_name(m->ctx), err);
            m->stats.bind_failures++;
            goto err_unlock;
        }
        ent->rkey = ent->mw->rkey;
    }
    ent->next = NULL;
    st = ote__grant_seq_assign(m, g);
    if (st != OTE_OK) {
        ent->next = m->pool; /* never bound by us: back to the pool */
        m->pool = ent;
        m->stats.mw_pool++;
        goto err_unlock;
    }
    g->mw = ent;
    g->mw_unbound = 1; /* until its bind is posted */
    g->bind_mr = mr;
    g->bind_addr = addr;
    g->bind_len = len;
    g->bind_access = access;
    m->stats.served++;
    m->stats.live_source++;
    st = bind_post(g, &df);
    if (st != OTE_OK) {
        /* Proven not posted: the window was never touched. */
        wait_remove(&m->lanes[li], g);
        HASH_DEL(m->by_seq, g);
        g->mw = NULL;
        ent->next = m->pool;
        m->pool = ent;
        m->stats.mw_pool++;
        m->stats.served--;
        m->stats.live_source--;
        goto err_unlock;
    }
    ote_mutex_unlock(&m->mu);
    defer_run(m, &df);
    return OTE_OK;

err_unlock:
    m->stats.refused++;
    ote_mutex_unlock(&m->mu);
    ote_qp_rq_unadmit(qp);
    m->src.unpin(m->src.arg, pin);
    ote_free(g);
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
    defer_t df = {.fin = NULL, .nans = 0};
    ote_mutex_lock(&m->mu);
    if (m->fence != OTE_OK) {
        st = m->fence;
        goto err_unlock;
    }
    grant_t *dup = NULL;
    HASH_FIND(hh_key, m->by_key, &g->rkey, sizeof(g->rkey), dup);
    if (dup != NULL) { /* an rkey still live here: never two grants under one key */
        st = OTE_ERR_STATE;
        goto err_unlock;
    }
    if ((st = ote__grant_seq_assign(m, g)) != OTE_OK) goto err_unlock;
    OTE_HASH_ADD_KEYPTR(hh_key, m->by_key, &g->rkey, sizeof(g->rkey), g, st);
    if (st != OTE_OK) {
        HASH_DEL(m->by_seq, g);
        goto err_unlock;
    }
    g->keyed = 1;
    g->sstate = S_BOUND; /* nothing to bind: the MR is the grant */
    m->stats.served++;
    m->stats.live_source++;
    (void)defer_answer(&df, g, OTE_OK);
    ote_mutex_unlock(&m->mu);
    defer_run(m, &df);
    return OTE_OK;

err_unlock:
    m->stats.refused++;
    ote_mutex_unlock(&m->mu);
    ote_qp_rq_unadmit(qp);
    m->src.unpin(m->src.arg, pin);
    ote_free(g);
    return st;
}

void ote_grant_source_receipt(ote_grant_mgr_t *m, uint32_t qp_num, const struct ibv_wc *wc) {
    int imm = (wc->wc_flags & IBV_WC_WITH_IMM) != 0;
    if (!(wc->wc_flags & IBV_WC_WITH_INV) && !imm) {
        OTE_WARN("grant", "QP %u: receive without invalidation: not a grant receipt", qp_num);
        return;
    }
    uint32_t rkey = imm ? ntohl(wc->imm_data) : wc->invalidated_rkey;
    defer_t df = {.fin = NULL, .nans = 0};
    ote_mutex_lock(&m->mu);
    grant_t *g = NULL;
    HASH_FIND(hh_key, m->by_key, &rkey, sizeof(rkey), g);
    /* A window's receipt invalidated it; an exact MR's names its rkey (and only such a
     * grant's: an immediate never ends a window grant, whose window would stay bound). */
    if (g == NULL || g->qp_num != qp_num || g->sstate != S_BOUND || g->exact != imm) {
        m->stats.stale_receipts++;
        ote_mutex_unlock(&m->mu);
        OTE_WARN_LIMITED("grant", "QP %u: receipt for rkey 0x%x that names no bound grant: ignored",
                         qp_num, rkey);
        return;
    }
    /* The provider invalidated the window before delivering this CQE. */
    g->mw_unbound = 1;
    g->sstate = S_ENDED;
    m->stats.receipts++;
    maybe_finish(g, &df);
    ote_mutex_unlock(&m->mu);
    defer_run(m, &df);
}

ote_status_t ote_grant_source_release(ote_grant_mgr_t *m, const ote_endpoint_t *ep, uint32_t slot,
                                      uint32_t qp_num, uint32_t rkey) {
    if (m == NULL || !m->has_src || ep == NULL) return OTE_ERR_INVALID;
    defer_t df = {.fin = NULL, .nans = 0};
    ote_mutex_lock(&m->mu);
    grant_t *g = NULL;
    HASH_FIND(hh_key, m->by_key, &rkey, sizeof(rkey), g);
    if (g == NULL || !g->source || g->ep != ep || g->slot != slot || g->qp_num != qp_num ||
        g->sstate != S_BOUND || g->failed != OTE_OK) {
        m->stats.stale_releases++;
        ote_mutex_unlock(&m->mu);
        return OTE_ERR_NOT_FOUND;
    }
    /* The requester's WRs under the window have all ended. The QP stays as it is (other
     * grants may share it; a broken one is replaced by the requester's next CONNECT on
     * the slot); the window is not proven unbound, so maybe_finish deallocates it, which
     * invalidates its rkey at once. */
    g->sstate = S_ENDED;
    m->stats.released++;
    maybe_finish(g, &df);
    ote_mutex_unlock(&m->mu);
    defer_run(m, &df);
    return OTE_OK;
}

/* End a live source grant now: the requester never sent its receipt, is gone, or our
 * port is down. The QP the window is bound to is killed first (so nothing can use the
 * window), then the window, the pin and the QP borrow are released. m->mu held. */
static void source_end(grant_t *g, ote_status_t why, defer_t *df) {
    if (g->bind_wait) {
        /* Its bind never reached the QP: nothing to kill, just refuse it. */
        wait_remove(&g->m->lanes[g->lane], g);
        bind_refused(g, why, df);
        return;
    }
    if (g->sstate == S_BINDING && g->failed == OTE_OK) {
        if (!defer_answer(df, g, why)) return; /* the monitor's next tick ends it */
        g->failed = why;
    }
    (void)ote_qp_cancel(g->qp);
    if (g->failed == OTE_OK) g->failed = why;
    g->sstate = S_ENDED;
    maybe_finish(g, df);
}

size_t ote_grant_source_live_endpoint(ote_grant_mgr_t *m, const ote_endpoint_t *ep) {
    size_t n = 0;
    ote_mutex_lock(&m->mu);
    grant_t *g, *tmp;
    HASH_ITER(hh, m->by_seq, g, tmp) n += g->source && g->ep == ep && g->sstate != S_ENDED;
    ote_mutex_unlock(&m->mu);
    return n;
}

size_t ote_grant_source_end_endpoint(ote_grant_mgr_t *m, const ote_endpoint_t *ep) {
    defer_t df = {.fin = NULL, .nans = 0};
    size_t n = 0;
    ote_mutex_lock(&m->mu);
    grant_t *g, *tmp;
    HASH_ITER(hh, m->by_seq, g, tmp) {
        if (!g->source || g->ep != ep || g->sstate == S_ENDED) continue;
        /* A grant whose deferred answer did not fit this round stays for the tick. */
        g->deadline = 0;
        source_end(g, OTE_ERR_PEER_LOST, &df);
        n++;
    }
    ote_mutex_unlock(&m->mu);
    defer_run(m, &df);
    return n;
}

size_t ote_grant_mgr_tick(ote_grant_mgr_t *m) {
    defer_t df = {.fin = NULL, .nans = 0};
    uint64_t now = ote_now_ns();
    /* A context whose port went down (or whose device failed), or a fenced manager (its
     * transport's teardown), ends its in-flight grants now, with that status, instead of
     * leaving them to their deadlines. */
    ote_status_t down = ote_context_check(m->ctx);
    ote_mutex_lock(&m->mu);
    if (down == OTE_OK) down = m->fence;
    if (m->retained != NULL) (void)ote__grant_mw_retry_retained(m); /* the monitor's retry */
    for (uint32_t i = 0; i < m->nlanes; i++) kick_lane(&m->lanes[i], &df);
    grant_t *g, *tmp;
    HASH_ITER(hh, m->by_seq, g, tmp) {
        int expired = g->deadline <= now;
        if (!expired && down == OTE_OK) continue;
        ote_status_t why = expired ? OTE_ERR_TIMEOUT : down;
        if (!g->source) {
            if (g->failed != OTE_OK || g->rstate == R_ENDED || g->requesting) continue;
            if (expired) m->stats.expired++;
            OTE_WARN_LIMITED("grant",
                             "grant %u: %s with %u of %u slices done, %u WRs owed: failing "
                             "it; QP %u fenced and flushed",
                             g->seq, expired ? "deadline passed" : ote_status_str(why),
                             g->done_slices, g->nslices, g->outstanding, g->qp_num);
            fail_requester(g, why, &df);
        } else if (g->sstate != S_ENDED) {
            if (expired) m->stats.source_expired++;
            OTE_WARN_LIMITED("grant",
                             "%s: source grant %u %s%s: QP %u moved to ERR, window released",
                             ote_context_name(m->ctx), g->seq,
                             expired ? "not invalidated by its deadline" : "ended: ",
                             expired ? "" : ote_status_str(why), g->qp_num);
            source_end(g, why, &df);
        }
    }
    size_t live = HASH_COUNT(m->by_seq);
    ote_mutex_unlock(&m->mu);
    defer_run(m, &df);
    return live;
}

/*
 * qp/send_queue.c - the send queue: bounded admission, exact WR ownership, fencing.
 *
 * Every WR id is entered in the outstanding table before the native post (a CQE can be
 * polled by a worker before post_send returns), and leaves it exactly once: by its CQE,
 * by being returned unposted (the proven suffix after bad_wr), or by the QP's native
 * destruction. Entries come from a fixed pool of max_send_wr, so admission never
 * allocates except for hash growth. With a shared credit pool (cfg.sq_pool) each entry
 * also holds one of its credits, given back (with no lock held) as the entry leaves.
 */
#include <errno.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "context/context.h"
#include "qp/qp_internal.h"

ote_status_t ote__sq_init(ote_qp_t *qp) {
    qp->pool = ote_calloc(qp->cfg.max_send_wr, sizeof(*qp->pool));
    if (qp->pool == NULL) return OTE_ERR_NOMEM;
    for (uint32_t i = 0; i < qp->cfg.max_send_wr; i++) {
        qp->pool[i].next_free = qp->free_list;
        qp->free_list = &qp->pool[i];
    }
    return OTE_OK;
}

void ote__sq_fini(ote_qp_t *qp) {
    HASH_CLEAR(hh, qp->outstanding);
    ote_free(qp->pool);
    qp->pool = NULL;
    qp->free_list = NULL;
}

static void entry_put(ote_qp_t *qp, sq_entry_t *e) {
    HASH_DEL(qp->outstanding, e);
    e->next_free = qp->free_list;
    qp->free_list = e;
    qp->sq_count--;
}

/* One post's state: the chain, its credited prefix (cut off the chain while posting) and
 * the result to report. */
typedef struct {
    struct ibv_send_wr *wrs;
    size_t n;                   /* WRs in the chain, then in the credited prefix */
    size_t take;                /* shared credits taken */
    struct ibv_send_wr *cut_at; /* last WR of the prefix when the chain is cut */
    struct ibv_send_wr *cut;    /* first WR past the prefix, returned unposted */
    ote_qp_post_result_t res;
} sq_post_t;

/* Admission (caller holds qp->mu, kept on return): the QP must be open, unfenced, in RTS
 * with its port usable, with room for p->n WRs and at least one shared credit (p->take). */
static ote_status_t post_admit(ote_qp_t *qp, sq_post_t *p) {
    ote_status_t st = OTE_OK;
    if (qp->closing) st = OTE_ERR_STATE;
    else if (qp->fenced) st = qp->fence_cause != OTE_OK ? qp->fence_cause : OTE_ERR_FENCED;
    else if (qp->qp == NULL) st = OTE_ERR_STATE;
    else if (qp->state != IBV_QPS_RTS) st = OTE_ERR_STATE;
    else st = ote_context_check(qp->ctx); /* a paused port admits nothing new */
    if (st == OTE_OK && (uint64_t)qp->sq_count + p->n > qp->cfg.max_send_wr) st = OTE_ERR_AGAIN;
    if (st == OTE_OK) {
        p->take = ote__sq_pool_take(qp->cfg.sq_pool, p->n);
        if (p->take == 0) st = OTE_ERR_AGAIN; /* no shared credit free */
    }
    return st;
}

/* Credits for a prefix only: that prefix goes now, the rest is returned unposted. Cuts
 * the chain after p->take WRs (p->cut_at, p->cut; relinked after the post). */
static void post_cut_prefix(sq_post_t *p) {
    if (p->take < p->n) {
        p->cut_at = p->wrs;
        for (size_t i = 1; i < p->take; i++) p->cut_at = p->cut_at->next;
        p->cut = p->cut_at->next;
        p->cut_at->next = NULL;
        p->n = p->take;
    }
}

/* Enter every WR id (refusing duplicates) before the post (caller holds qp->mu): each
 * takes a pool entry and is marked signaled; *entered_out counts the ids visited. */
static ote_status_t post_enter_ids(ote_qp_t *qp, sq_post_t *p, ote_deadline_t deadline,
                                   size_t *entered_out) {
    ote_status_t st = OTE_OK;
    size_t entered = 0;
    for (struct ibv_send_wr *w = p->wrs; w != NULL; w = w->next, entered++) {
        sq_entry_t *dup = NULL;
        HASH_FIND(hh, qp->outstanding, &w->wr_id, sizeof(uint64_t), dup);
        if (dup != NULL) {
            OTE_WARN("qp", "QP %u: wr_id 0x%llx is already outstanding", qp->qp_num,
                     (unsigned long long)w->wr_id);
            st = OTE_ERR_INVALID;
            break;
        }
        sq_entry_t *e = qp->free_list;
        qp->free_list = e->next_free;
        e->wr_id = w->wr_id;
        e->deadline = deadline;
        e->expired = 0;
        OTE_HASH_ADD(hh, qp->outstanding, wr_id, sizeof(uint64_t), e, st);
        if (st != OTE_OK) {
            e->next_free = qp->free_list;
            qp->free_list = e;
            break;
        }
        qp->sq_count++;
        w->send_flags |= IBV_SEND_SIGNALED;
    }
    *entered_out = entered;
    return st;
}

/* Nothing was posted: remove the first `entered` ids, drop qp->mu (held on entry),
 * relink the chain and give the credits back. */
static void post_undo_entries(ote_qp_t *qp, sq_post_t *p, size_t entered) {
    struct ibv_send_wr *w = p->wrs;
    for (size_t i = 0; i < entered; i++, w = w->next) {
        sq_entry_t *e = NULL;
        HASH_FIND(hh, qp->outstanding, &w->wr_id, sizeof(uint64_t), e);
        if (e != NULL) entry_put(qp, e);
    }
    ote_mutex_unlock(&qp->mu);
    if (p->cut_at != NULL) p->cut_at->next = p->cut;
    ote__sq_pool_put(qp->cfg.sq_pool, p->take);
}

/* The post failed with bad_wr in the chain (caller holds qp->mu, dropped here): WRs
 * [0, k) are posted and owned; [k, n) were not posted and leave the table, the lane
 * reservation and the pool. */
static ote_status_t post_proven_prefix(ote_qp_t *qp, sq_post_t *p, struct ibv_send_wr *bad,
                                       size_t k, int err, ote_qp_post_result_t *result) {
    size_t n = p->n;
    struct ibv_send_wr *u = bad;
    for (size_t i = k; i < n && u != NULL; i++, u = u->next) {
        sq_entry_t *e = NULL;
        HASH_FIND(hh, qp->outstanding, &u->wr_id, sizeof(uint64_t), e);
        if (e != NULL) entry_put(qp, e);
    }
    ote_mutex_unlock(&qp->mu);
    ote_cq_lane_release(qp->lane, OTE_CQ_SEND, (uint32_t)(n - k));
    ote__sq_pool_put(qp->cfg.sq_pool, n - k);
    p->res.accepted = k;
    p->res.unposted = bad;
    OTE_WARN("qp", "QP %u: post_send accepted %zu of %zu WRs: errno %d", qp->qp_num, k, n, err);
    *result = p->res;
    return ote_verbs_status(err);
}

/* The post failed (caller holds qp->mu, dropped here): resolve acceptance from bad_wr;
 * outside the chain the outcome is unknown, so the whole debt is kept and the queue
 * fenced. */
static ote_status_t post_resolve_failure(ote_qp_t *qp, sq_post_t *p, struct ibv_send_wr *bad,
                                         int err, ote_qp_post_result_t *result) {
    size_t n = p->n;
    size_t k = 0;
    struct ibv_send_wr *w = p->wrs;
    while (w != NULL && w != bad && k < n) { /* the chain was relinked past n */
        w = w->next;
        k++;
    }
    if (bad != NULL && w == bad && k < n) return post_proven_prefix(qp, p, bad, k, err, result);
    /* Unknown outcome: any of the WRs may be posted. Keep the whole debt, fence. */
    qp->fenced = 1;
    ote_mutex_unlock(&qp->mu);
    OTE_ERROR("qp",
              "QP %u: post_send of %zu WRs failed (errno %d) with bad_wr outside the chain: "
              "outcome unknown, send queue fenced, all %zu WRs kept as owed",
              qp->qp_num, n, err, n);
    p->res.accepted = n;
    p->res.unposted = p->cut; /* never handed to the provider */
    *result = p->res;
    return ote_status_make(OTE_ERR_FENCED, err);
}

ote_status_t ote_qp_post_send(ote_qp_t *qp, struct ibv_send_wr *wrs, ote_deadline_t deadline,
                              ote_qp_post_result_t *result) {
    ote_qp_post_result_t res = {0, wrs};
    if (result != NULL) *result = res;
    if (qp == NULL || wrs == NULL || result == NULL) return OTE_ERR_INVALID;
    sq_post_t p = {.wrs = wrs, .res = res};
    for (struct ibv_send_wr *w = wrs; w != NULL; w = w->next) p.n++;

    ote_mutex_lock(&qp->mu);
    ote_status_t st = post_admit(qp, &p);
    if (st != OTE_OK) {
        ote_mutex_unlock(&qp->mu);
        return st;
    }
    post_cut_prefix(&p);
    size_t entered = 0;
    st = post_enter_ids(qp, &p, deadline, &entered);
    if (st == OTE_OK) st = ote_cq_lane_reserve(qp->lane, OTE_CQ_SEND, (uint32_t)p.n);
    if (st != OTE_OK) {
        post_undo_entries(qp, &p, entered);
        return st;
    }

    struct ibv_send_wr *bad = NULL;
    int err = qp->v->ops->post_send(qp->v, qp->qp, wrs, &bad);
    if (p.cut_at != NULL) p.cut_at->next = p.cut;
    if (err != 0) return post_resolve_failure(qp, &p, bad, err, result);
    p.res.accepted = p.n;
    p.res.unposted = p.cut;
    ote_mutex_unlock(&qp->mu);
    *result = p.res;
    return p.cut == NULL ? OTE_OK : OTE_ERR_AGAIN;
}

int ote__sq_complete(ote_qp_t *qp, const struct ibv_wc *wc) {
    ote_mutex_lock(&qp->mu);
    sq_entry_t *e = NULL;
    uint64_t id = wc->wr_id;
    HASH_FIND(hh, qp->outstanding, &id, sizeof(uint64_t), e);
    if (e == NULL) {
        qp->unknown_cqes++;
        ote_mutex_unlock(&qp->mu);
        OTE_WARN("qp", "QP %u: send CQE for wr_id 0x%llx that is not outstanding: dropped",
                 qp->qp_num, (unsigned long long)id);
        return 0;
    }
    entry_put(qp, e);
    if (wc->status == IBV_WC_SUCCESS) {
        qp->send_completions++;
    } else {
        qp->send_errors++;
        if (qp->state != IBV_QPS_ERR && wc->status != IBV_WC_WR_FLUSH_ERR)
            OTE_WARN("qp", "QP %u: send error CQE %s: QP in ERR, send queue fenced", qp->qp_num,
                     ote_verbs_wc_status_str(wc->status));
        qp->state = IBV_QPS_ERR; /* a non-flush error moved it there; a flush means it is */
        qp->fenced = 1;
    }
    ote_mutex_unlock(&qp->mu);
    ote_cq_lane_release(qp->lane, OTE_CQ_SEND, 1);
    ote__sq_pool_put(qp->cfg.sq_pool, 1);
    return 1;
}

size_t ote_qp_expire(ote_qp_t *qp, uint64_t *ids, size_t cap) {
    size_t n = 0;
    uint64_t now = ote_now_ns();
    ote_mutex_lock(&qp->mu);
    sq_entry_t *e, *tmp;
    HASH_ITER(hh, qp->outstanding, e, tmp) {
        if (n >= cap) break;
        if (e->expired || e->deadline > now) continue;
        e->expired = 1;
        ids[n++] = e->wr_id;
    }
    if (n > 0) {
        qp->expired += n;
        if (!qp->fenced)
            OTE_WARN("qp",
                     "QP %u: %zu WR(s) past their deadline: send queue fenced; their "
                     "buffers stay owned until a CQE, a flush or destruction",
                     qp->qp_num, n);
        qp->fenced = 1;
    }
    ote_mutex_unlock(&qp->mu);
    return n;
}

void ote__sq_resolve_destroyed(ote_qp_t *qp) {
    for (;;) {
        ote_mutex_lock(&qp->mu);
        sq_entry_t *e = qp->outstanding;
        if (e == NULL) {
            ote_mutex_unlock(&qp->mu);
            return;
        }
        uint64_t id = e->wr_id;
        entry_put(qp, e);
        qp->resolved_by_destroy++;
        ote_mutex_unlock(&qp->mu);
        ote_cq_lane_release(qp->lane, OTE_CQ_SEND, 1);
        ote__sq_pool_put(qp->cfg.sq_pool, 1);
        struct ibv_wc wc;
        memset(&wc, 0, sizeof(wc));
        wc.wr_id = id;
        wc.status = IBV_WC_WR_FLUSH_ERR;
        wc.qp_num = qp->qp_num;
        wc.vendor_err = OTE_QP_VENDOR_ERR_DESTROYED;
        (void)ote_cq_lane_deliver(qp->lane, OTE_CQ_SEND, &wc);
    }
}

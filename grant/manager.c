/*
 * grant/manager.c - slice geometry, record sequence numbers, the window pool and
 * retained windows, and the grant manager's lifecycle (create, destroy, fence, stats).
 */
#include <errno.h>

#include "base/alloc.h"
#include "base/hash.h"
#include "base/lock.h"
#include "base/log.h"
#include "grant/grant_internal.h"

/* ---- geometry ------------------------------------------------------------------------ */

uint32_t ote_grant_slice_count(uint64_t len) {
    if (len == 0) return 0;
    uint64_t n = len / OTE_GRANT_BLOCK, tail = len % OTE_GRANT_BLOCK;
    if (n == 0) return 1;
    if (tail != 0 && tail >= OTE_GRANT_BLOCK / 4) n++; /* a short tail folds into the last */
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

void ote_grant_slice_at(uint64_t len, uint32_t i, uint64_t *off_out, uint32_t *len_out) {
    uint32_t n = ote_grant_slice_count(len);
    uint64_t off = (uint64_t)i * OTE_GRANT_BLOCK;
    *off_out = off;
    *len_out = (uint32_t)(i + 1 == n ? len - off : OTE_GRANT_BLOCK);
}

/* ---- sequence numbers and windows ------------------------------------------------------ */

/* Give record g a sequence number no live record has (never 0) and index it. m->mu held.
 * On failure (no memory for the index) g is not indexed. */
ote_status_t ote__grant_seq_assign(ote_grant_mgr_t *m, grant_t *g) {
    grant_t *dup;
    do {
        g->seq = (++m->next_seq) & SEQ_MASK;
        HASH_FIND(hh, m->by_seq, &g->seq, sizeof(g->seq), dup);
    } while (g->seq == 0 || dup != NULL);
    ote_status_t st;
    OTE_HASH_ADD(hh, m->by_seq, seq, sizeof(g->seq), g, st);
    return st;
}

/* Deallocate window ent, or retain it: a failed dealloc keeps the entry (and the native
 * window) on m->retained, counted in the manager's stats and as OTE_RETAINED_MW in its
 * context, until a later retry succeeds. m->mu held (or the manager owned alone). */
int ote__grant_mw_dealloc_or_retain(ote_grant_mgr_t *m, mw_ent_t *ent) {
    int err = m->v->ops->dealloc_mw(m->v, ent->mw);
    if (err == 0) {
        ote_free(ent);
        return 0;
    }
    ent->next = m->retained;
    m->retained = ent;
    m->stats.mw_retained++;
    ote_context_retained_add(m->ctx, OTE_RETAINED_MW, 1);
    OTE_WARN("grant", "%s: dealloc_mw failed: errno %d; window retained", ote_context_name(m->ctx),
             err);
    return err;
}

/* Retry the dealloc of every retained window; returns how many are still retained.
 * m->mu held (or the manager owned alone). */
size_t ote__grant_mw_retry_retained(ote_grant_mgr_t *m) {
    size_t left = 0;
    mw_ent_t **pp = &m->retained;
    while (*pp != NULL) {
        mw_ent_t *e = *pp;
        if (m->v->ops->dealloc_mw(m->v, e->mw) != 0) {
            left++;
            pp = &e->next;
            continue;
        }
        *pp = e->next;
        m->stats.mw_retained--;
        ote_context_retained_add(m->ctx, OTE_RETAINED_MW, -1);
        ote_free(e);
    }
    return left;
}

ote_status_t ote_grant_mgr_create(ote_context_t *ctx, ote_cq_lane_t *const *lanes, uint32_t nlanes,
                                  const ote_grant_source_ops_t *src, ote_grant_mgr_t **mgr_out) {
    if (ctx == NULL || lanes == NULL || nlanes == 0 || mgr_out == NULL) return OTE_ERR_INVALID;
    if (src != NULL && (src->pin == NULL || src->unpin == NULL || src->answer == NULL))
        return OTE_ERR_INVALID;
    ote_grant_mgr_t *m = ote_calloc(1, sizeof(*m));
    if (m == NULL) return OTE_ERR_NOMEM;
    m->lanes = ote_calloc(nlanes, sizeof(*m->lanes));
    if (m->lanes == NULL) {
        ote_free(m);
        return OTE_ERR_NOMEM;
    }
    ote_status_t st = ote_mutex_init(&m->mu);
    if (st != OTE_OK) {
        ote_free(m->lanes);
        ote_free(m);
        return st;
    }
    m->ctx = ctx;
    m->v = ote_context_verbs(ctx);
    m->nlanes = nlanes;
    if (src != NULL) {
        m->has_src = 1;
        m->src = *src;
    }
    for (uint32_t i = 0; i < nlanes; i++) {
        m->lanes[i].m = m;
        m->lanes[i].idx = i;
        m->lanes[i].lane = lanes[i];
        st = ote_cq_lane_register_ns(lanes[i], ote__grant_on_cqe, &m->lanes[i], &m->lanes[i].ns);
        if (st != OTE_OK) break;
        m->lanes[i].registered = 1;
    }
    if (st != OTE_OK) {
        for (uint32_t i = 0; i < nlanes; i++)
            if (m->lanes[i].registered) ote_cq_lane_unregister_ns(lanes[i], m->lanes[i].ns);
        ote_mutex_destroy(&m->mu);
        ote_free(m->lanes);
        ote_free(m);
        return st;
    }
    *mgr_out = m;
    return OTE_OK;
}

ote_status_t ote_grant_mgr_destroy(ote_grant_mgr_t *m) {
    if (m == NULL) return OTE_OK;
    ote_mutex_lock(&m->mu);
    if (m->by_seq != NULL) {
        ote_mutex_unlock(&m->mu);
        return OTE_ERR_BUSY;
    }
    /* Windows retained earlier first, then the pool: a pooled window whose dealloc
     * fails joins the retained ones (counted); the manager stays valid while any is left
     * and a later destroy retries them. */
    size_t left = ote__grant_mw_retry_retained(m);
    int err = 0;
    while (m->pool != NULL) {
        mw_ent_t *e = m->pool;
        m->pool = e->next;
        m->stats.mw_pool--;
        int e_err = ote__grant_mw_dealloc_or_retain(m, e);
        if (e_err != 0) {
            err = e_err;
            left++;
        }
    }
    ote_mutex_unlock(&m->mu);
    if (left != 0) {
        OTE_WARN("grant", "%s: %zu window(s) could not be deallocated; manager retained",
                 ote_context_name(m->ctx), left);
        return ote_status_make(OTE_ERR_RETAINED, err != 0 ? err : EBUSY);
    }
    for (uint32_t i = 0; i < m->nlanes; i++)
        if (m->lanes[i].registered) ote_cq_lane_unregister_ns(m->lanes[i].lane, m->lanes[i].ns);
    ote_mutex_destroy(&m->mu);
    ote_free(m->lanes);
    ote_free(m);
    return OTE_OK;
}

void ote_grant_mgr_fence(ote_grant_mgr_t *m, ote_status_t why) {
    ote_mutex_lock(&m->mu);
    m->fence = why;
    ote_mutex_unlock(&m->mu);
}

void ote_grant_mgr_get_stats(ote_grant_mgr_t *m, ote_grant_stats_t *out) {
    ote_mutex_lock(&m->mu);
    *out = m->stats;
    ote_mutex_unlock(&m->mu);
}

/*
 * grant/manager.c - slice geometry, record sequence numbers, and the grant manager's
 * lifecycle (create with one lock per lane, destroy, fence, stats summed over the lanes).
 */
#include <errno.h>
#include <string.h>

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
    uint32_t inited = 0;
    for (uint32_t i = 0; i < nlanes && st == OTE_OK; i++) {
        m->lanes[i].m = m;
        m->lanes[i].idx = i;
        m->lanes[i].lane = lanes[i];
        st = ote_mutex_init(&m->lanes[i].mu);
        if (st != OTE_OK) break;
        inited++;
        st = ote_cq_lane_register_ns(lanes[i], ote__grant_on_cqe, &m->lanes[i], &m->lanes[i].ns);
        if (st != OTE_OK) break;
        m->lanes[i].registered = 1;
    }
    if (st != OTE_OK) {
        for (uint32_t i = 0; i < nlanes; i++)
            if (m->lanes[i].registered) ote_cq_lane_unregister_ns(lanes[i], m->lanes[i].ns);
        for (uint32_t i = 0; i < inited; i++) ote_mutex_destroy(&m->lanes[i].mu);
        ote_mutex_destroy(&m->mu);
        ote_free(m->lanes);
        ote_free(m);
        return st;
    }
    *mgr_out = m;
    return OTE_OK;
}

/* Windows retained earlier first, then the pool: a pooled window whose dealloc fails
 * joins the retained ones (counted). No grant lives, so nothing else takes from the pool
 * meanwhile; the deallocs run with no lock held (window.c). Returns how many are left;
 * *err_out: the errno of the last failure. */
static size_t drop_windows(ote_grant_mgr_t *m, int *err_out) {
    size_t left = ote__grant_mw_retry_retained(m);
    int err = 0;
    for (;;) {
        ote_mutex_lock(&m->mu);
        mw_ent_t *e = m->pool;
        if (e != NULL) {
            m->pool = e->next;
            m->stats.mw_pool--;
        }
        ote_mutex_unlock(&m->mu);
        if (e == NULL) break;
        int e_err = ote__grant_mw_dealloc_or_retain(m, e);
        if (e_err != 0) {
            err = e_err;
            left++;
        }
    }
    left += ote__grant_mw_domain_free(m, &err); /* the exhausted windows, the key domain */
    *err_out = err;
    return left;
}

/* A grant lives. */
static int has_grants(ote_grant_mgr_t *m) {
    ote_mutex_lock(&m->mu);
    int busy = m->by_seq != NULL;
    ote_mutex_unlock(&m->mu);
    return busy;
}

ote_status_t ote_grant_mgr_drop_windows(ote_grant_mgr_t *m) {
    if (m == NULL) return OTE_ERR_INVALID;
    if (has_grants(m)) return OTE_ERR_BUSY;
    int err = 0;
    size_t left = drop_windows(m, &err);
    if (left == 0) return OTE_OK;
    OTE_WARN("grant", "%s: %zu window(s) could not be deallocated; retained",
             ote_context_name(m->ctx), left);
    return ote_status_make(OTE_ERR_RETAINED, err != 0 ? err : EBUSY);
}

ote_status_t ote_grant_mgr_destroy(ote_grant_mgr_t *m) {
    if (m == NULL) return OTE_OK;
    if (has_grants(m)) return OTE_ERR_BUSY;
    /* The manager stays valid while a window is left; a later destroy retries them. */
    int err = 0;
    size_t left = drop_windows(m, &err);
    if (left != 0) {
        OTE_WARN("grant", "%s: %zu window(s) could not be deallocated; manager retained",
                 ote_context_name(m->ctx), left);
        return ote_status_make(OTE_ERR_RETAINED, err != 0 ? err : EBUSY);
    }
    for (uint32_t i = 0; i < m->nlanes; i++)
        if (m->lanes[i].registered) ote_cq_lane_unregister_ns(m->lanes[i].lane, m->lanes[i].ns);
    for (uint32_t i = 0; i < m->nlanes; i++) ote_mutex_destroy(&m->lanes[i].mu);
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

/* The stats are all uint64_t counters; each is counted by the manager (under its lock)
 * and by every lane (under the lane's), and the sum is the figure. A count that goes up in
 * one share and down in another still sums right (modulo 2^64). */
_Static_assert(sizeof(ote_grant_stats_t) % sizeof(uint64_t) == 0, "stats are uint64_t only");
#define STATS_N (sizeof(ote_grant_stats_t) / sizeof(uint64_t))

static void stats_add(uint64_t *acc, const ote_grant_stats_t *s) {
    uint64_t v[STATS_N];
    memcpy(v, s, sizeof(v));
    for (size_t i = 0; i < STATS_N; i++) acc[i] += v[i];
}

void ote_grant_mgr_get_stats(ote_grant_mgr_t *m, ote_grant_stats_t *out) {
    uint64_t acc[STATS_N] = {0};
    ote_mutex_lock(&m->mu);
    stats_add(acc, &m->stats);
    ote_mutex_unlock(&m->mu);
    for (uint32_t i = 0; i < m->nlanes; i++) {
        ote_mutex_lock(&m->lanes[i].mu);
        stats_add(acc, &m->lanes[i].stats);
        ote_mutex_unlock(&m->lanes[i].mu);
    }
    memcpy(out, acc, sizeof(*out));
}

/*
 * grant/window.c - the source's type-2 memory windows: the pool, each window's key
 * history, retirement of windows whose tags are used up, and windows whose dealloc
 * failed (retained, counted, retried).
 *
 * Key history. A bind re-keys its window with the next 8-bit tag (ibv_inc_rkey); the
 * index bits stay. A window remembers the tag it was allocated with and how many binds it
 * carried, so binds 1..MW_TAGS_PER_WINDOW take tags that never repeat within the window's
 * lifetime (and never its allocation tag): a stale rkey of an earlier grant never names a
 * later grant of the same window. A window whose tags are used up is retired once its last
 * grant proved it unbound: a replacement is allocated first (so the provider cannot hand
 * the retired index straight back with a restarted tag), then it is deallocated, retained
 * if that fails (DESIGN.md contract 1).
 *
 * Locking: the pool and the retained list are under the manager lock (m->mu); the native
 * alloc_mw / dealloc_mw run with no grant lock held.
 */
#include <errno.h>

#include "base/alloc.h"
#include "base/log.h"
#include "grant/grant_internal.h"

/* A new window (no lock held). */
static ote_status_t mw_alloc(ote_grant_mgr_t *m, mw_ent_t **ent_out) {
    mw_ent_t *ent = ote_calloc(1, sizeof(*ent));
    if (ent == NULL) return OTE_ERR_NOMEM;
    int err = m->v->ops->alloc_mw(m->v, ote_context_pd(m->ctx), IBV_MW_TYPE_2, &ent->mw);
    if (err != 0) {
        ote_free(ent);
        ote_mutex_lock(&m->mu);
        m->stats.bind_failures++;
        ote_mutex_unlock(&m->mu);
        OTE_WARN("grant", "%s: alloc_mw(type 2) failed: errno %d", ote_context_name(m->ctx), err);
        return ote_status_make(OTE_ERR_NATIVE, err);
    }
    ent->rkey = ent->mw->rkey;
    ent->tag0 = (uint8_t)ent->rkey;
    ent->binds = 0;
    ote_mutex_lock(&m->mu);
    m->stats.mw_allocated++;
    ote_mutex_unlock(&m->mu);
    *ent_out = ent;
    return OTE_OK;
}

ote_status_t ote__grant_mw_take(ote_grant_mgr_t *m, mw_ent_t **ent_out) {
    ote_mutex_lock(&m->mu);
    mw_ent_t *ent = m->pool;
    if (ent != NULL) {
        m->pool = ent->next;
        m->stats.mw_pool--;
    }
    ote_mutex_unlock(&m->mu);
    if (ent == NULL) {
        ote_status_t st = mw_alloc(m, &ent);
        if (st != OTE_OK) return st;
    }
    ent->next = NULL;
    *ent_out = ent;
    return OTE_OK;
}

void ote__grant_mw_put(ote_grant_mgr_t *m, mw_ent_t *ent) {
    ote_mutex_lock(&m->mu);
    ent->next = m->pool;
    m->pool = ent;
    m->stats.mw_pool++;
    ote_mutex_unlock(&m->mu);
}

uint32_t ote__grant_mw_next_rkey(const mw_ent_t *ent) {
    if (ent->binds >= MW_TAGS_PER_WINDOW) return 0;
    uint32_t tag = (ent->tag0 + ent->binds + 1u) & 0xffu;
    return (ent->rkey & 0xffffff00u) | tag;
}

void ote__grant_mw_release(ote_grant_mgr_t *m, mw_ent_t *ent, int unbound, defer_t *df) {
    if (!unbound) {
        /* The window may still be bound: only dealloc (which unbinds) is safe. */
        ent->next = df->dealloc;
        df->dealloc = ent;
    } else if (ent->binds >= MW_TAGS_PER_WINDOW) {
        ent->next = df->retire; /* every tag used: never bound again */
        df->retire = ent;
    } else {
        ent->next = m->pool;
        m->pool = ent;
        m->stats.mw_pool++;
    }
}

void ote__grant_mw_defer_run(ote_grant_mgr_t *m, defer_t *df) {
    while (df->retire != NULL) {
        mw_ent_t *ent = df->retire;
        df->retire = ent->next;
        /* The replacement first: while the retired window is still allocated, the provider
         * cannot give its index to the replacement. Without one, the next serve allocates. */
        mw_ent_t *fresh = NULL;
        if (mw_alloc(m, &fresh) == OTE_OK) ote__grant_mw_put(m, fresh);
        ote_mutex_lock(&m->mu);
        m->stats.mw_retired++;
        ote_mutex_unlock(&m->mu);
        OTE_DEBUG("grant", "%s: window 0x%x retired after %u binds (its rkey tags are used up)",
                  ote_context_name(m->ctx), ent->rkey, ent->binds);
        (void)ote__grant_mw_dealloc_or_retain(m, ent);
    }
    while (df->dealloc != NULL) {
        mw_ent_t *ent = df->dealloc;
        df->dealloc = ent->next;
        (void)ote__grant_mw_dealloc_or_retain(m, ent);
    }
}

int ote__grant_mw_dealloc_or_retain(ote_grant_mgr_t *m, mw_ent_t *ent) {
    int err = m->v->ops->dealloc_mw(m->v, ent->mw);
    if (err == 0) {
        ote_free(ent);
        return 0;
    }
    ote_mutex_lock(&m->mu);
    ent->next = m->retained;
    m->retained = ent;
    m->stats.mw_retained++;
    ote_mutex_unlock(&m->mu);
    ote_context_retained_add(m->ctx, OTE_RETAINED_MW, 1);
    OTE_WARN("grant", "%s: dealloc_mw failed: errno %d; window retained", ote_context_name(m->ctx),
             err);
    return err;
}

size_t ote__grant_mw_retry_retained(ote_grant_mgr_t *m) {
    ote_mutex_lock(&m->mu);
    mw_ent_t *list = m->retained;
    m->retained = NULL;
    ote_mutex_unlock(&m->mu);
    size_t left = 0, freed = 0;
    mw_ent_t *keep = NULL, *keep_tail = NULL;
    while (list != NULL) {
        mw_ent_t *e = list;
        list = e->next;
        if (m->v->ops->dealloc_mw(m->v, e->mw) != 0) {
            left++;
            e->next = NULL;
            if (keep_tail != NULL) keep_tail->next = e;
            else keep = e;
            keep_tail = e;
            continue;
        }
        freed++;
        ote_context_retained_add(m->ctx, OTE_RETAINED_MW, -1);
        ote_free(e);
    }
    ote_mutex_lock(&m->mu);
    if (keep_tail != NULL) {
        keep_tail->next = m->retained;
        m->retained = keep;
    }
    m->stats.mw_retained -= freed;
    ote_mutex_unlock(&m->mu);
    return left;
}

/*
 * grant/window.c - the source's type-2 memory windows: the pool, the key domain (the key
 * history of every window index), exhausted windows, and windows whose dealloc failed
 * (retained, counted, retried).
 *
 * Key domain. A bind re-keys its window with a new 8-bit tag (ibv_inc_rkey); the index
 * bits stay, and a provider may give an index back to a later window once its window was
 * deallocated, with any tag. The manager remembers, per index, every tag a window at that
 * index carried (key_hist_t: the allocation's and each bind's), and a bind takes the next
 * tag its index has not used: a stale rkey of an earlier grant, of this window or of an
 * earlier one at the same index, never names a later grant. A window whose index has used
 * all 256 tags is kept allocated (m->exhausted), so that the index cannot come back, until
 * the manager is destroyed; a new window at an index without a tag left (the history of a
 * window deallocated as maybe bound) is kept the same way and another is allocated.
 * Exhausted windows cost one provider window per 256 grants at most: when alloc_mw fails
 * while some are kept, the oldest is deallocated and its index starts a new history (a
 * WARN says so: rkeys of that index may then repeat ones of grants that ended at least
 * 256 binds of it earlier), so the domain never makes the device refuse windows.
 *
 * Locking: the pool, the key domain's table, the exhausted and retained lists are under
 * the manager lock (m->mu); an index's used tags are written by its one live window (lane
 * lock); the native alloc_mw / dealloc_mw run with no grant lock held.
 */
#include <errno.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "grant/grant_internal.h"

static int tag_is_used(const key_hist_t *h, uint32_t tag) {
    return (h->used[tag >> 3] >> (tag & 7u)) & 1u;
}

static void tag_mark(key_hist_t *h, uint32_t tag) {
    if (tag_is_used(h, tag)) return;
    h->used[tag >> 3] |= (uint8_t)(1u << (tag & 7u));
    h->nused++;
}

/* The history of rkey's index, added when new, with rkey's tag marked (m->mu held). NULL
 * when the table has no memory for it. */
static key_hist_t *hist_of(ote_grant_mgr_t *m, uint32_t rkey) {
    uint32_t index = rkey >> 8;
    key_hist_t *h = NULL;
    HASH_FIND(hh, m->keys, &index, sizeof(index), h);
    if (h == NULL) {
        h = ote_calloc(1, sizeof(*h));
        if (h == NULL) return NULL;
        h->index = index;
        ote_status_t st;
        OTE_HASH_ADD(hh, m->keys, index, sizeof(h->index), h, st);
        if (st != OTE_OK) {
            ote_free(h);
            return NULL;
        }
    }
    tag_mark(h, rkey & 0xffu);
    return h;
}

/* Keep window ent, whose index has no tag left, allocated (no grant lock held). */
static void exhausted_keep(ote_grant_mgr_t *m, mw_ent_t *ent) {
    ote_mutex_lock(&m->mu);
    ent->next = m->exhausted;
    m->exhausted = ent;
    m->stats.mw_retired++;
    ote_mutex_unlock(&m->mu);
    OTE_DEBUG("grant", "%s: window index 0x%x has used all %u rkey tags: window kept",
              ote_context_name(m->ctx), ent->rkey >> 8, MW_TAGS);
}

/* alloc_mw failed: give the provider back the oldest exhausted window, its index starting
 * a new key history. Returns 1 when one went (alloc may be tried again). */
static int exhausted_give_back(ote_grant_mgr_t *m) {
    ote_mutex_lock(&m->mu);
    mw_ent_t **pp = &m->exhausted;
    while (*pp != NULL && (*pp)->next != NULL) pp = &(*pp)->next;
    mw_ent_t *old = *pp;
    if (old != NULL) {
        *pp = NULL;
        m->stats.mw_retired--;
        memset(old->hist->used, 0, sizeof(old->hist->used));
        old->hist->nused = 0;
    }
    ote_mutex_unlock(&m->mu);
    if (old == NULL) return 0;
    OTE_WARN("grant",
             "%s: no memory window left for a new grant: window index 0x%x, whose %u rkey "
             "tags were all used, is deallocated and starts a new key history (its rkeys may "
             "repeat those of grants that ended %u binds of it earlier)",
             ote_context_name(m->ctx), old->rkey >> 8, MW_TAGS, MW_TAGS);
    (void)ote__grant_mw_dealloc_or_retain(m, old);
    return 1;
}

/* A new window (no lock held): *ent_out, or NULL with OTE_OK when its index has no tag
 * left (the window is kept: the caller allocates another). */
static ote_status_t mw_alloc(ote_grant_mgr_t *m, mw_ent_t **ent_out) {
    mw_ent_t *ent = ote_calloc(1, sizeof(*ent));
    if (ent == NULL) return OTE_ERR_NOMEM;
    int err = m->v->ops->alloc_mw(m->v, ote_context_pd(m->ctx), IBV_MW_TYPE_2, &ent->mw);
    if (err != 0 && exhausted_give_back(m))
        err = m->v->ops->alloc_mw(m->v, ote_context_pd(m->ctx), IBV_MW_TYPE_2, &ent->mw);
    if (err != 0) {
        ote_free(ent);
        ote_mutex_lock(&m->mu);
        m->stats.bind_failures++;
        ote_mutex_unlock(&m->mu);
        OTE_WARN("grant", "%s: alloc_mw(type 2) failed: errno %d", ote_context_name(m->ctx), err);
        return ote_status_make(OTE_ERR_NATIVE, err);
    }
    ent->rkey = ent->mw->rkey;
    ote_mutex_lock(&m->mu);
    m->stats.mw_allocated++;
    ent->hist = hist_of(m, ent->rkey);
    int full = ent->hist != NULL && ent->hist->nused >= MW_TAGS;
    ote_mutex_unlock(&m->mu);
    if (ent->hist == NULL) {
        (void)ote__grant_mw_dealloc_or_retain(m, ent);
        return OTE_ERR_NOMEM;
    }
    if (full) {
        exhausted_keep(m, ent);
        ent = NULL;
    }
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
    for (int tries = 0; ent == NULL; tries++) {
        if (tries == MW_ALLOC_TRIES) {
            OTE_WARN("grant", "%s: %d new windows in a row had no rkey tag left",
                     ote_context_name(m->ctx), MW_ALLOC_TRIES);
            return ote_status_make(OTE_ERR_NATIVE, ENOSPC);
        }
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
    uint32_t cur = ent->rkey & 0xffu;
    for (uint32_t i = 1; i < MW_TAGS; i++) {
        uint32_t tag = (cur + i) & 0xffu;
        if (!tag_is_used(ent->hist, tag)) return (ent->rkey & 0xffffff00u) | tag;
    }
    return 0;
}

void ote__grant_mw_tag_used(mw_ent_t *ent, uint32_t rkey) { tag_mark(ent->hist, rkey & 0xffu); }

void ote__grant_mw_release(ote_grant_mgr_t *m, mw_ent_t *ent, int unbound, defer_t *df) {
    if (!unbound) {
        /* The window may still be bound: only dealloc (which unbinds) is safe. */
        ent->next = df->dealloc;
        df->dealloc = ent;
    } else if (ent->hist->nused >= MW_TAGS) {
        ent->next = df->retire; /* every tag of its index used: never bound again */
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
        exhausted_keep(m, ent); /* allocated: its index cannot come back with old tags */
    }
    while (df->dealloc != NULL) {
        mw_ent_t *ent = df->dealloc;
        df->dealloc = ent->next;
        (void)ote__grant_mw_dealloc_or_retain(m, ent);
    }
}

size_t ote__grant_mw_domain_free(ote_grant_mgr_t *m, int *err_out) {
    size_t left = 0;
    for (;;) {
        ote_mutex_lock(&m->mu);
        mw_ent_t *e = m->exhausted;
        if (e != NULL) {
            m->exhausted = e->next;
            m->stats.mw_retired--;
        }
        ote_mutex_unlock(&m->mu);
        if (e == NULL) break;
        int err = ote__grant_mw_dealloc_or_retain(m, e);
        if (err != 0) {
            *err_out = err;
            left++;
        }
    }
    if (left != 0) return left; /* the retained windows point at their histories */
    key_hist_t *h, *tmp;
    HASH_ITER(hh, m->keys, h, tmp) {
        HASH_DELETE(hh, m->keys, h);
        ote_free(h);
    }
    return 0;
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

/*
 * naming/naming.c - the naming handle (<ote/naming.h>): the store it talks to, the
 * names it publishes and refreshes, its cache of resolved names and its watches.
 *
 * Locks: work_mu (held by the handle's thread for a whole pass, and by publish,
 * unpublish, watch, unwatch and close) guards the published and watched lists; mu
 * guards the cache and the thread's state. Order: work_mu, then mu; a store call is
 * never made with mu held.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/lock.h"
#include "base/log.h"
#include "base/time.h"
#include "naming/naming_internal.h"

#define NAMING_PREFIX_MAX 64
#define NAMING_MD_CAP_START 4096

typedef enum { THREAD_RUNNING = 0, THREAD_STOPPING = 1 } thread_state_t;
typedef enum { WATCH_UNKNOWN = 0, WATCH_UP = 1, WATCH_GONE = 2 } watch_state_t;

typedef struct pub {
    struct pub *next;
    char name[OTE_NAMING_NAME_MAX + 1];
    uint8_t *val;
    size_t len;
    uint64_t lease;
    uint64_t due_ns;
} pub_t;

typedef struct cached {
    struct cached *next;
    char name[OTE_NAMING_NAME_MAX + 1];
    uint8_t *val;
    size_t len;
    uint64_t at_ns;
} cached_t;

struct ote_naming_watch {
    struct ote_naming_watch *next;
    ote_naming_t *n;
    char name[OTE_NAMING_NAME_MAX + 1];
    ote_naming_watch_fn fn;
    void *arg;
    watch_state_t state;
    ote_naming_entry_t last;
};

/* A segment opened by name (ote_naming_segment_open): its name is watched, and when the
 * name ends or names another incarnation than the one opened, the segment is
 * invalidated (its requests end OTE_ERR_PEER_LOST). The guard lives until the segment is
 * closed (its close hook, whichever call closes it) or the handle is. ARMED: watched;
 * FIRED: invalidated, its watch dropped; CLOSING: a close of the segment is under way,
 * the segment not to be touched. Under work_mu. */
typedef enum { GUARD_ARMED = 0, GUARD_FIRED = 1, GUARD_CLOSING = 2 } guard_state_t;
typedef struct guard {
    struct guard *next;
    struct ote_naming *n;
    ote_segment_t *seg;
    uint64_t epoch;        /* the incarnation the segment was opened to */
    ote_naming_watch_t *w; /* NULL once FIRED (swept) */
    guard_state_t state, before_close;
} guard_t;

struct ote_naming {
    const ote__nstore_ops_t *ops;
    void *st;
    uint32_t timeout_ms, ttl_ms, cache_ms, period_ms;
    char prefix[NAMING_PREFIX_MAX + 1];
    ote_mutex_t work_mu;
    ote_mutex_t mu;
    ote_cond_t cv;
    thread_state_t tstate;
    pthread_t thread;
    pub_t *pubs;
    cached_t *cache;
    ote_naming_watch_t *watches;
    guard_t *guards;
};

static ote_status_t key_of(const ote_naming_t *n, const char *name, char *key, size_t cap) {
    if (!ote__name_ok(name, OTE_NAMING_NAME_MAX)) return OTE_ERR_INVALID;
    return snprintf(key, cap, "%s%s", n->prefix, name) < (int)cap ? OTE_OK : OTE_ERR_INVALID;
}

/* ---- cache ------------------------------------------------------------------------ */

static cached_t *cache_find(ote_naming_t *n, const char *name) {
    for (cached_t *c = n->cache; c != NULL; c = c->next)
        if (strcmp(c->name, name) == 0) return c;
    return NULL;
}

static void cache_drop(ote_naming_t *n, const char *name) {
    ote_mutex_lock(&n->mu);
    for (cached_t **pp = &n->cache; *pp != NULL; pp = &(*pp)->next) {
        if (strcmp((*pp)->name, name) == 0) {
            cached_t *c = *pp;
            *pp = c->next;
            ote_free(c->val);
            ote_free(c);
            break;
        }
    }
    ote_mutex_unlock(&n->mu);
}

/* Keep a checked value (taken over) as the cached one of name. */
static void cache_put(ote_naming_t *n, const char *name, uint8_t *val, size_t len) {
    ote_mutex_lock(&n->mu);
    cached_t *c = cache_find(n, name);
    if (c == NULL && (c = ote_calloc(1, sizeof(*c))) != NULL) {
        snprintf(c->name, sizeof(c->name), "%s", name);
        c->next = n->cache;
        n->cache = c;
    }
    if (c != NULL) {
        ote_free(c->val);
        c->val = val;
        c->len = len;
        c->at_ns = ote_now_ns();
    } else {
        ote_free(val);
    }
    ote_mutex_unlock(&n->mu);
}

/* A copy of name's cached value when fresher than cache_ms: OTE_OK, else NOT_FOUND. */
static ote_status_t cache_get(ote_naming_t *n, const char *name, uint8_t **val, size_t *len) {
    if (n->cache_ms == 0) return OTE_ERR_NOT_FOUND;
    ote_status_t st = OTE_ERR_NOT_FOUND;
    ote_mutex_lock(&n->mu);
    cached_t *c = cache_find(n, name);
    if (c != NULL && ote_now_ns() - c->at_ns < (uint64_t)n->cache_ms * OTE_NSEC_PER_MSEC) {
        *val = ote_malloc(c->len);
        st = *val != NULL ? OTE_OK : OTE_ERR_NOMEM;
        if (st == OTE_OK) {
            memcpy(*val, c->val, c->len);
            *len = c->len;
        }
    }
    ote_mutex_unlock(&n->mu);
    return st;
}

/* ---- resolve ---------------------------------------------------------------------- */

/* name's value from the store, checked (and cached when caching). */
static ote_status_t fetch(ote_naming_t *n, const char *name, uint8_t **val, size_t *len) {
    char key[NAMING_PREFIX_MAX + OTE_NAMING_NAME_MAX + 2];
    ote_status_t st = key_of(n, name, key, sizeof(key));
    if (st == OTE_OK) st = n->ops->get(n->st, key, val, len);
    if (st != OTE_OK) return st;
    if (ote__nval_decode(*val, *len, name, NULL, NULL, NULL) != OTE_OK) {
        OTE_WARN("naming", "%s: a value that does not decode (%zu bytes): not used", key, *len);
        ote_free(*val);
        return OTE_ERR_PROTOCOL;
    }
    if (n->cache_ms > 0) {
        uint8_t *copy = ote_malloc(*len);
        if (copy != NULL) {
            memcpy(copy, *val, *len);
            cache_put(n, name, copy, *len);
        }
    }
    return OTE_OK;
}

static ote_status_t lookup(ote_naming_t *n, const char *name, int fresh, uint8_t **val,
                           size_t *len) {
    if (!fresh && cache_get(n, name, val, len) == OTE_OK) return OTE_OK;
    return fetch(n, name, val, len);
}

ote_status_t ote_naming_resolve(ote_naming_t *n, const char *name, ote_naming_entry_t *entry_out,
                                void *md, size_t cap, size_t *md_len_out) {
    if (n == NULL || !ote__name_ok(name, OTE_NAMING_NAME_MAX) ||
        (md != NULL && md_len_out == NULL) || (md == NULL && cap > 0))
        return OTE_ERR_INVALID;
    uint8_t *val = NULL;
    size_t len = 0;
    ote_status_t st = lookup(n, name, 0, &val, &len);
    if (st != OTE_OK) return st;
    const uint8_t *m = NULL;
    size_t ml = 0;
    ote_naming_entry_t e;
    st = ote__nval_decode(val, len, name, &m, &ml, &e); /* checked already: OTE_OK */
    if (st == OTE_OK && md_len_out != NULL) {
        *md_len_out = ml;
        if (ml > cap) st = OTE_ERR_TOO_BIG;
        else if (md != NULL) memcpy(md, m, ml);
    }
    if (st == OTE_OK && entry_out != NULL) *entry_out = e;
    ote_free(val);
    return st;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

ote_status_t ote_naming_list(ote_naming_t *n, const char *prefix,
                             char (*names)[OTE_NAMING_NAME_MAX + 1], size_t cap,
                             size_t *count_out) {
    if (n == NULL || prefix == NULL || count_out == NULL || (names == NULL && cap > 0) ||
        strlen(prefix) > OTE_NAMING_NAME_MAX)
        return OTE_ERR_INVALID;
    char full[NAMING_PREFIX_MAX + OTE_NAMING_NAME_MAX + 2];
    snprintf(full, sizeof(full), "%s%s", n->prefix, prefix);
    char **keys = NULL;
    size_t nk = 0;
    ote_status_t st = n->ops->list(n->st, full, &keys, &nk);
    if (st != OTE_OK) return st;
    qsort(keys, nk, sizeof(char *), cmp_str);
    size_t pl = strlen(n->prefix), count = 0;
    for (int pass = 0; pass < 2; pass++) { /* count, then copy when all fit */
        count = 0;
        for (size_t i = 0; i < nk; i++) {
            const char *name = keys[i] + pl; /* every key starts with the full prefix */
            if (!ote__name_ok(name, OTE_NAMING_NAME_MAX) ||
                (i > 0 && strcmp(keys[i], keys[i - 1]) == 0))
                continue;
            if (pass == 1) snprintf(names[count], OTE_NAMING_NAME_MAX + 1, "%s", name);
            count++;
        }
        if (count > cap) break;
    }
    for (size_t i = 0; i < nk; i++) ote_free(keys[i]);
    ote_free(keys);
    *count_out = count;
    return count > cap ? OTE_ERR_TOO_BIG : OTE_OK;
}

/* ---- publishing ------------------------------------------------------------------- */

static uint64_t refresh_every_ns(const ote_naming_t *n) {
    return (uint64_t)n->ttl_ms * OTE_NSEC_PER_MSEC / 3;
}

static pub_t *pub_find(ote_naming_t *n, const char *name) {
    for (pub_t *p = n->pubs; p != NULL; p = p->next)
        if (strcmp(p->name, name) == 0) return p;
    return NULL;
}

/* engine's metadata blob in an ote_malloc'ed buffer, wrapped for name. */
static ote_status_t value_of(const char *name, ote_engine_t *engine, uint8_t **val, size_t *len) {
    size_t cap = NAMING_MD_CAP_START, ml = 0;
    for (int tries = 0; tries < 4; tries++) {
        uint8_t *md = ote_malloc(cap);
        if (md == NULL) return OTE_ERR_NOMEM;
        ote_status_t st = ote_engine_metadata(engine, md, cap, &ml);
        if (st == OTE_OK) st = ote__nval_encode(name, md, ml, val, len);
        ote_free(md);
        if (st != OTE_ERR_TOO_BIG) return st;
        cap = ml + 4096; /* registrations made meanwhile: a little more room */
    }
    return OTE_ERR_AGAIN;
}

ote_status_t ote_naming_publish(ote_naming_t *n, const char *name, ote_engine_t *engine) {
    char key[NAMING_PREFIX_MAX + OTE_NAMING_NAME_MAX + 2];
    if (n == NULL || engine == NULL || key_of(n, name, key, sizeof(key)) != OTE_OK)
        return OTE_ERR_INVALID;
    uint8_t *val = NULL;
    size_t len = 0;
    ote_status_t st = value_of(name, engine, &val, &len);
    if (st != OTE_OK) return st;
    ote_mutex_lock(&n->work_mu);
    pub_t *p = pub_find(n, name);
    uint64_t lease = p != NULL ? p->lease : 0;
    st = n->ops->put(n->st, key, val, len, n->ttl_ms, &lease);
    if (st == OTE_OK && p == NULL && (p = ote_calloc(1, sizeof(*p))) == NULL) {
        (void)n->ops->del(n->st, key, lease);
        st = OTE_ERR_NOMEM;
    } else if (st == OTE_OK && p->name[0] == '\0') {
        snprintf(p->name, sizeof(p->name), "%s", name);
        ote_mutex_lock(&n->mu);
        p->next = n->pubs;
        n->pubs = p;
        ote_mutex_unlock(&n->mu);
    }
    if (st == OTE_OK) {
        ote_free(p->val);
        p->val = val;
        p->len = len;
        p->lease = lease;
        p->due_ns = ote_now_ns() + refresh_every_ns(n);
        val = NULL;
    } else {
        OTE_WARN("naming", "publish %s: %s", key, ote_status_str(st));
    }
    ote_mutex_unlock(&n->work_mu);
    ote_free(val);
    cache_drop(n, name);
    return st;
}

static void pub_free(pub_t *p) {
    ote_free(p->val);
    ote_free(p);
}

ote_status_t ote_naming_unpublish(ote_naming_t *n, const char *name) {
    char key[NAMING_PREFIX_MAX + OTE_NAMING_NAME_MAX + 2];
    if (n == NULL || key_of(n, name, key, sizeof(key)) != OTE_OK) return OTE_ERR_INVALID;
    ote_mutex_lock(&n->work_mu);
    pub_t *p = NULL;
    ote_mutex_lock(&n->mu);
    for (pub_t **pp = &n->pubs; *pp != NULL; pp = &(*pp)->next) {
        if (strcmp((*pp)->name, name) == 0) {
            p = *pp;
            *pp = p->next;
            break;
        }
    }
    ote_mutex_unlock(&n->mu);
    ote_status_t st = p != NULL ? n->ops->del(n->st, key, p->lease) : OTE_ERR_NOT_FOUND;
    ote_mutex_unlock(&n->work_mu);
    if (p != NULL) pub_free(p);
    cache_drop(n, name);
    return st;
}

/* ---- the handle's thread: refreshes and watches ------------------------------------ */

static void refresh_due(ote_naming_t *n, uint64_t now) {
    for (pub_t *p = n->pubs; p != NULL; p = p->next) {
        if (p->due_ns > now) continue;
        char key[NAMING_PREFIX_MAX + OTE_NAMING_NAME_MAX + 2];
        (void)key_of(n, p->name, key, sizeof(key));
        ote_status_t st = n->ops->refresh(n->st, key, p->val, p->len, n->ttl_ms, &p->lease);
        if (st != OTE_OK)
            OTE_WARN("naming",
                     "refresh %s: %s (the name ends with its ttl of %u ms unless a "
                     "later refresh reaches the store)",
                     key, ote_status_str(st), n->ttl_ms);
        /* A failed refresh is tried again soon, well inside the ttl. */
        p->due_ns = ote_now_ns() + (st == OTE_OK ? refresh_every_ns(n) : refresh_every_ns(n) / 4);
    }
}

static void watch_poll(ote_naming_t *n, ote_naming_watch_t *w) {
    uint8_t *val = NULL;
    size_t len = 0;
    ote_status_t st = fetch(n, w->name, &val, &len);
    ote_naming_entry_t e;
    if (st == OTE_OK) st = ote__nval_decode(val, len, w->name, NULL, NULL, &e);
    ote_free(val);
    if (st == OTE_OK) {
        int changed =
            w->state == WATCH_UP && (e.epoch != w->last.epoch || strcmp(e.addr, w->last.addr) != 0);
        int up = w->state != WATCH_UP;
        w->state = WATCH_UP;
        w->last = e;
        if (up || changed) w->fn(w->arg, w->name, up ? OTE_NAMING_UP : OTE_NAMING_CHANGED, &e);
    } else if (st == OTE_ERR_NOT_FOUND) {
        cache_drop(n, w->name);
        if (w->state != WATCH_GONE) {
            w->state = WATCH_GONE;
            w->fn(w->arg, w->name, OTE_NAMING_GONE, NULL);
        }
    } else {
        OTE_LOG_LIMITED(OTE_LOG_WARN, "naming", "watch %s: %s: its state is unchanged", w->name,
                        ote_status_str(st));
    }
}

static void guards_sweep(ote_naming_t *n);

static void *naming_thread(void *arg) {
    ote_naming_t *n = arg;
    uint64_t next_watch = 0;
    for (;;) {
        ote_mutex_lock(&n->work_mu);
        uint64_t now = ote_now_ns();
        refresh_due(n, now);
        if (now >= next_watch) {
            for (ote_naming_watch_t *w = n->watches; w != NULL; w = w->next) watch_poll(n, w);
            guards_sweep(n);
            next_watch = ote_now_ns() + (uint64_t)n->period_ms * OTE_NSEC_PER_MSEC;
        }
        uint64_t wake = next_watch;
        for (pub_t *p = n->pubs; p != NULL; p = p->next)
            if (p->due_ns < wake) wake = p->due_ns;
        ote_mutex_unlock(&n->work_mu);
        ote_mutex_lock(&n->mu);
        while (n->tstate == THREAD_RUNNING && ote_now_ns() < wake)
            (void)ote_cond_wait(&n->cv, &n->mu, wake);
        thread_state_t ts = n->tstate;
        ote_mutex_unlock(&n->mu);
        if (ts == THREAD_STOPPING) return NULL;
    }
}

static ote_naming_watch_t *watch_new(ote_naming_t *n, const char *name, ote_naming_watch_fn fn,
                                     void *arg) {
    ote_naming_watch_t *w = ote_calloc(1, sizeof(*w));
    if (w == NULL) return NULL;
    w->n = n;
    snprintf(w->name, sizeof(w->name), "%s", name);
    w->fn = fn;
    w->arg = arg;
    return w;
}

/* Take w out of n's watches (work_mu held): 1 when it was there. */
static int watch_unlink(ote_naming_t *n, ote_naming_watch_t *w) {
    for (ote_naming_watch_t **pp = &n->watches; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == w) {
            *pp = w->next;
            return 1;
        }
    }
    return 0;
}

ote_status_t ote_naming_watch(ote_naming_t *n, const char *name, ote_naming_watch_fn fn, void *arg,
                              ote_naming_watch_t **watch_out) {
    if (n == NULL || fn == NULL || watch_out == NULL || !ote__name_ok(name, OTE_NAMING_NAME_MAX))
        return OTE_ERR_INVALID;
    ote_naming_watch_t *w = watch_new(n, name, fn, arg);
    if (w == NULL) return OTE_ERR_NOMEM;
    ote_mutex_lock(&n->work_mu);
    w->next = n->watches;
    n->watches = w;
    ote_mutex_unlock(&n->work_mu);
    *watch_out = w;
    return OTE_OK;
}

ote_status_t ote_naming_unwatch(ote_naming_watch_t *w) {
    if (w == NULL) return OTE_ERR_INVALID;
    ote_naming_t *n = w->n;
    ote_mutex_lock(&n->work_mu); /* the thread is not inside a callback now */
    int found = watch_unlink(n, w);
    ote_mutex_unlock(&n->work_mu);
    if (!found) return OTE_ERR_NOT_FOUND;
    ote_free(w);
    return OTE_OK;
}

/* ---- segments by name, invalidated when their name ends or moves on ----------------- */

/* A guard's watch (the handle's thread, work_mu held): the name gone, or resolving to
 * another incarnation than the segment's, invalidates the segment, once. */
static void guard_event(void *arg, const char *name, ote_naming_event_t ev,
                        const ote_naming_entry_t *e) {
    guard_t *g = arg;
    if (g->state != GUARD_ARMED) return;
    if (ev != OTE_NAMING_GONE && e != NULL && e->epoch == g->epoch) return;
    OTE_WARN("naming",
             "%s %s (the segment opened to epoch %016llx): its requests end "
             "OTE_ERR_PEER_LOST",
             name, ev == OTE_NAMING_GONE ? "is gone" : "names another incarnation",
             (unsigned long long)g->epoch);
    (void)ote_segment_invalidate(g->seg);
    g->state = GUARD_FIRED;
}

/* Drop the watches of the guards that fired: their segments need no more watching; the
 * guards stay until their segments close (work_mu held). */
static void guards_sweep(ote_naming_t *n) {
    for (guard_t *g = n->guards; g != NULL; g = g->next) {
        if (g->state != GUARD_FIRED || g->w == NULL) continue;
        (void)watch_unlink(n, g->w);
        ote_free(g->w);
        g->w = NULL;
    }
}

/* The segment's close hook (ote_segment_set_close_hook), on the closing thread: from
 * CLOSING on the guard leaves the segment alone (the handle's thread may be about to
 * invalidate it: work_mu orders the two); a refused close re-arms it; a closed segment
 * takes its guard and watch away. */
static void guard_close_hook(void *arg, ote_segment_t *seg, ote_segment_close_event_t ev) {
    guard_t *g = arg;
    ote_naming_t *n = g->n;
    (void)seg;
    ote_mutex_lock(&n->work_mu);
    if (ev == OTE_SEGMENT_CLOSING) {
        g->before_close = g->state;
        g->state = GUARD_CLOSING;
    } else if (ev == OTE_SEGMENT_CLOSE_REFUSED) {
        g->state = g->before_close;
    } else {
        for (guard_t **pp = &n->guards; *pp != NULL; pp = &(*pp)->next) {
            if (*pp == g) {
                *pp = g->next;
                break;
            }
        }
        if (g->w != NULL) {
            (void)watch_unlink(n, g->w);
            ote_free(g->w);
        }
        ote_free(g);
    }
    ote_mutex_unlock(&n->work_mu);
}

/* Link g (and its watch) into n's lists (work_mu held). */
static void guard_link(ote_naming_t *n, guard_t *g) {
    g->w->next = n->watches;
    n->watches = g->w;
    g->next = n->guards;
    n->guards = g;
}

/* Guard seg, opened to incarnation epoch of name. */
static ote_status_t guard_add(ote_naming_t *n, const char *name, ote_segment_t *seg,
                              uint64_t epoch) {
    guard_t *g = ote_calloc(1, sizeof(*g));
    ote_naming_watch_t *w = g != NULL ? watch_new(n, name, guard_event, g) : NULL;
    if (w == NULL) {
        ote_free(g);
        return OTE_ERR_NOMEM;
    }
    g->n = n;
    g->seg = seg;
    g->epoch = epoch;
    g->w = w;
    ote_mutex_lock(&n->work_mu);
    guard_link(n, g);
    ote_mutex_unlock(&n->work_mu);
    /* Before the caller has seg, so no close can race with it. */
    (void)ote_segment_set_close_hook(seg, guard_close_hook, g);
    return OTE_OK;
}

/* One open of name's engine from its value (cached or fetched): the segment, and the
 * incarnation it was opened to. */
static ote_status_t open_one(ote_naming_t *n, ote_engine_t *engine, const char *name, int fresh,
                             int *cached_out, ote_segment_t **seg_out, uint64_t *epoch_out) {
    uint8_t *val = NULL;
    size_t len = 0;
    *cached_out = !fresh && cache_get(n, name, &val, &len) == OTE_OK;
    ote_status_t st = *cached_out ? OTE_OK : fetch(n, name, &val, &len);
    if (st != OTE_OK) return st;
    const uint8_t *m = NULL;
    size_t ml = 0;
    ote_naming_entry_t e;
    st = ote__nval_decode(val, len, name, &m, &ml, &e);
    if (st == OTE_OK) st = ote_segment_open_md(engine, m, ml, seg_out);
    if (st == OTE_OK) *epoch_out = e.epoch;
    ote_free(val);
    return st;
}

ote_status_t ote_naming_segment_open(ote_naming_t *n, ote_engine_t *engine, const char *name,
                                     ote_segment_t **seg_out) {
    if (n == NULL || engine == NULL || seg_out == NULL || !ote__name_ok(name, OTE_NAMING_NAME_MAX))
        return OTE_ERR_INVALID;
    ote_status_t st = OTE_OK;
    ote_segment_t *seg = NULL;
    uint64_t epoch = 0;
    for (int fresh = 0; fresh <= 1; fresh++) {
        int cached = 0;
        st = open_one(n, engine, name, fresh, &cached, &seg, &epoch);
        if (st == OTE_OK || !cached || (st != OTE_ERR_STATE && st != OTE_ERR_CONNECT)) break;
        OTE_INFO("naming", "%s: the cached engine is gone (%s); resolving again", name,
                 ote_status_str(st));
        cache_drop(n, name);
    }
    if (st != OTE_OK) return st;
    st = guard_add(n, name, seg, epoch);
    if (st != OTE_OK) {
        (void)ote_segment_close(seg);
        return st;
    }
    *seg_out = seg;
    return OTE_OK;
}

ote_status_t ote_naming_segment_close(ote_naming_t *n, ote_segment_t *seg) {
    if (n == NULL || seg == NULL) return OTE_ERR_INVALID;
    /* The guard follows the close through its hook (guard_close_hook), as it does for a
     * plain ote_segment_close. */
    return ote_segment_close(seg);
}

/* ---- open and close --------------------------------------------------------------- */

static ote_status_t opts_apply(ote_naming_t *n, const ote_naming_opts_t *o) {
    ote_naming_opts_t d = {0};
    if (o == NULL) o = &d;
    n->timeout_ms = o->timeout_ms != 0 ? o->timeout_ms : 2000;
    n->ttl_ms = o->ttl_ms != 0 ? o->ttl_ms : 10000;
    n->cache_ms = o->cache_ms;
    n->period_ms = o->watch_period_ms != 0 ? o->watch_period_ms : 200;
    const char *prefix = o->prefix != NULL ? o->prefix : "orbitte/";
    size_t pl = strlen(prefix);
    if (n->ttl_ms < 1000 || n->timeout_ms > 600000 || pl == 0 || pl > NAMING_PREFIX_MAX ||
        !ote__name_ok(prefix, NAMING_PREFIX_MAX))
        return OTE_ERR_INVALID;
    memcpy(n->prefix, prefix, pl + 1);
    return OTE_OK;
}

static ote_status_t store_open(ote_naming_t *n, const char *url) {
    if (strncmp(url, "etcd://", 7) == 0) {
        n->ops = &ote__etcd_ops;
        return ote__etcd_open(url + 7, n->timeout_ms, &n->st);
    }
    if (strncmp(url, "redis://", 8) == 0) {
        n->ops = &ote__redis_ops;
        return ote__redis_open(url + 8, n->timeout_ms, &n->st);
    }
    return strstr(url, "://") != NULL ? OTE_ERR_UNSUPPORTED : OTE_ERR_INVALID;
}

static void naming_free(ote_naming_t *n) {
    if (n->st != NULL) n->ops->close(n->st);
    while (n->cache != NULL) {
        cached_t *c = n->cache;
        n->cache = c->next;
        ote_free(c->val);
        ote_free(c);
    }
    ote_cond_destroy(&n->cv);
    ote_mutex_destroy(&n->mu);
    ote_mutex_destroy(&n->work_mu);
    ote_free(n);
}

ote_status_t ote_naming_open(const char *url, const ote_naming_opts_t *opts, ote_naming_t **out) {
    if (url == NULL || out == NULL) return OTE_ERR_INVALID;
    ote_naming_t *n = ote_calloc(1, sizeof(*n));
    if (n == NULL) return OTE_ERR_NOMEM;
    ote_status_t st = ote_mutex_init(&n->work_mu);
    if (st == OTE_OK && (st = ote_mutex_init(&n->mu)) != OTE_OK) ote_mutex_destroy(&n->work_mu);
    if (st == OTE_OK && (st = ote_cond_init(&n->cv)) != OTE_OK) {
        ote_mutex_destroy(&n->mu);
        ote_mutex_destroy(&n->work_mu);
    }
    if (st != OTE_OK) {
        ote_free(n);
        return st;
    }
    st = opts_apply(n, opts);
    if (st == OTE_OK) st = store_open(n, url);
    if (st == OTE_OK && pthread_create(&n->thread, NULL, naming_thread, n) != 0) st = OTE_ERR_AGAIN;
    if (st != OTE_OK) {
        OTE_WARN("naming", "open %s: %s", url, ote_status_str(st));
        naming_free(n);
        return st;
    }
    *out = n;
    return OTE_OK;
}

ote_status_t ote_naming_close(ote_naming_t *n) {
    if (n == NULL) return OTE_ERR_INVALID;
    ote_mutex_lock(&n->mu);
    n->tstate = THREAD_STOPPING;
    ote_cond_broadcast(&n->cv);
    ote_mutex_unlock(&n->mu);
    /* The thread ends its pass (each store call bounded by timeout_ms) and returns. */
    (void)pthread_join(n->thread, NULL);
    while (n->pubs != NULL) {
        pub_t *p = n->pubs;
        n->pubs = p->next;
        char key[NAMING_PREFIX_MAX + OTE_NAMING_NAME_MAX + 2];
        (void)key_of(n, p->name, key, sizeof(key));
        (void)n->ops->del(n->st, key, p->lease);
        pub_free(p);
    }
    while (n->guards != NULL) { /* their segments stay open, no longer watched */
        guard_t *g = n->guards;
        n->guards = g->next;
        (void)ote_segment_set_close_hook(g->seg, NULL, NULL);
        ote_free(g); /* its watch, if any, is freed with the others below */
    }
    while (n->watches != NULL) {
        ote_naming_watch_t *w = n->watches;
        n->watches = w->next;
        ote_free(w);
    }
    naming_free(n);
    return OTE_OK;
}

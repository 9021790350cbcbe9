/* engine/control/auth_limit.c - the back-off of peers that fail authentication (see
 * auth_limit.h). A fixed array of entries, chained from a fixed array of buckets by
 * index; nothing is allocated after create. */
#include "engine/control/auth_limit.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/lock.h"
#include "base/log.h"
#include "base/time.h"

/*
 * The defaults. 5 failures in 10 s: a peer with a stale key retries a few times within a
 * connect timeout or two before anyone notices, and must not be slowed down by one typo,
 * while a guessing peer gets at most 5 tries per window. Back-off from 1 s doubling to
 * 60 s: short enough that a peer whose key was just fixed is back within a minute, long
 * enough that a guesser that keeps failing is held to about one try a minute. Quiet
 * period 5 minutes: longer than the longest back-off, so a peer that comes back and
 * fails again right after it resumes its penalty instead of starting over. 1024
 * addresses of 64 bytes: 64 KiB per engine with a key.
 */
#define LIMIT_FAILS 5u
#define LIMIT_WINDOW_NS (10 * OTE_NSEC_PER_SEC)
#define LIMIT_BACKOFF_MIN_NS (1 * OTE_NSEC_PER_SEC)
#define LIMIT_BACKOFF_MAX_NS (60 * OTE_NSEC_PER_SEC)
#define LIMIT_QUIET_NS (300 * OTE_NSEC_PER_SEC)
#define LIMIT_ENTRIES 1024u

#define NIL UINT32_MAX

typedef struct {
    ote_auth_addr_t a;
    uint32_t next;         /* the next entry of its bucket, or of the free list; NIL */
    uint32_t fails;        /* failures since window_start */
    uint64_t window_start; /* the first failure of the current window */
    uint64_t last_fail;
    uint64_t until;   /* back-off until (0: none) */
    uint64_t penalty; /* the next back-off (0: not in penalty yet) */
} entry_t;

struct ote_auth_limit {
    ote_mutex_t mu;
    ote_auth_limit_cfg_t cfg;
    entry_t *e;
    uint32_t *bucket; /* nbuckets heads, NIL: empty */
    uint32_t nbuckets;
    uint32_t free_head;
    uint64_t seed;
    _Atomic uint32_t used;
    _Atomic uint64_t refused;
    _Atomic uint64_t failures; /* every ote_auth_limit_fail (ote_engine_stats) */
};

static _Atomic uint64_t g_refused;
static ote_mutex_t g_cfg_mu = {PTHREAD_MUTEX_INITIALIZER};
static int g_cfg_set;
static ote_auth_limit_cfg_t g_cfg;

void ote_auth_limit_cfg_default(ote_auth_limit_cfg_t *cfg) {
    cfg->fails = LIMIT_FAILS;
    cfg->entries = LIMIT_ENTRIES;
    cfg->window_ns = LIMIT_WINDOW_NS;
    cfg->backoff_min_ns = LIMIT_BACKOFF_MIN_NS;
    cfg->backoff_max_ns = LIMIT_BACKOFF_MAX_NS;
    cfg->quiet_ns = LIMIT_QUIET_NS;
}

void ote__auth_limit_test_cfg(const ote_auth_limit_cfg_t *cfg) {
    ote_mutex_lock(&g_cfg_mu);
    g_cfg_set = cfg != NULL;
    if (cfg != NULL) g_cfg = *cfg;
    ote_mutex_unlock(&g_cfg_mu);
}

void ote__auth_limit_engine_cfg(ote_auth_limit_cfg_t *cfg) {
    ote_auth_limit_cfg_default(cfg);
    ote_mutex_lock(&g_cfg_mu);
    if (g_cfg_set) *cfg = g_cfg;
    ote_mutex_unlock(&g_cfg_mu);
}

void ote_auth_addr_of_sockaddr(const struct sockaddr *sa, socklen_t len, ote_auth_addr_t *out) {
    memset(out, 0, sizeof(*out));
    if (sa == NULL) return;
    if (sa->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        out->kind = 4;
        memcpy(out->b, &((const struct sockaddr_in *)sa)->sin_addr, 4);
    } else if (sa->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        const struct in6_addr *a6 = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(a6)) { /* the same peer as over IPv4 */
            out->kind = 4;
            memcpy(out->b, &a6->s6_addr[12], 4);
        } else {
            out->kind = 6;
            memcpy(out->b, a6->s6_addr, 16);
        }
    }
}

void ote_auth_addr_of_uid(uid_t uid, ote_auth_addr_t *out) {
    memset(out, 0, sizeof(*out));
    out->kind = 'u';
    uint32_t u = (uint32_t)uid;
    memcpy(out->b, &u, sizeof(u));
}

void ote_auth_addr_str(const ote_auth_addr_t *a, char *buf, size_t len) {
    char h[INET6_ADDRSTRLEN];
    uint32_t u;
    switch (a->kind) {
        case 4: snprintf(buf, len, "%s", inet_ntop(AF_INET, a->b, h, sizeof(h)) ? h : "?"); break;
        case 6: snprintf(buf, len, "%s", inet_ntop(AF_INET6, a->b, h, sizeof(h)) ? h : "?"); break;
        case 'u':
            memcpy(&u, a->b, sizeof(u));
            snprintf(buf, len, "uid %u", (unsigned)u);
            break;
        default: snprintf(buf, len, "?");
    }
}

ote_status_t ote_auth_limit_create(const ote_auth_limit_cfg_t *cfg, ote_auth_limit_t **out) {
    ote_auth_limit_cfg_t c;
    if (cfg == NULL) ote_auth_limit_cfg_default(&c);
    else c = *cfg;
    if (out == NULL || c.fails == 0 || c.entries == 0 || c.entries >= NIL || c.window_ns == 0 ||
        c.backoff_min_ns == 0 || c.backoff_min_ns > c.backoff_max_ns || c.quiet_ns == 0)
        return OTE_ERR_INVALID;
    ote_auth_limit_t *l = ote_calloc(1, sizeof(*l));
    if (l == NULL) return OTE_ERR_NOMEM;
    l->cfg = c;
    l->nbuckets = 1;
    while (l->nbuckets < c.entries && l->nbuckets < (1u << 30)) l->nbuckets <<= 1;
    l->e = ote_calloc(c.entries, sizeof(*l->e));
    l->bucket = ote_calloc(l->nbuckets, sizeof(*l->bucket));
    ote_status_t st = l->e && l->bucket ? ote_mutex_init(&l->mu) : OTE_ERR_NOMEM;
    if (st != OTE_OK) {
        ote_free(l->bucket);
        ote_free(l->e);
        ote_free(l);
        return st;
    }
    for (uint32_t i = 0; i < l->nbuckets; i++) l->bucket[i] = NIL;
    for (uint32_t i = 0; i < c.entries; i++) l->e[i].next = i + 1 < c.entries ? i + 1 : NIL;
    l->free_head = 0;
    /* A secret seed: peers cannot choose addresses that all fall in one bucket. */
    randombytes_buf(&l->seed, sizeof(l->seed));
    *out = l;
    return OTE_OK;
}

void ote_auth_limit_destroy(ote_auth_limit_t *lim) {
    if (lim == NULL) return;
    ote_mutex_destroy(&lim->mu);
    ote_free(lim->bucket);
    ote_free(lim->e);
    ote_free(lim);
}

static uint32_t bucket_of(const ote_auth_limit_t *l, const ote_auth_addr_t *a) {
    uint64_t h = 1469598103934665603ull ^ l->seed; /* FNV-1a, seeded */
    const uint8_t *p = (const uint8_t *)a;
    for (size_t i = 0; i < sizeof(*a); i++) h = (h ^ p[i]) * 1099511628211ull;
    h ^= h >> 29;
    return (uint32_t)h & (l->nbuckets - 1);
}

/* Under mu: the entry of a, or NIL. */
static uint32_t find(const ote_auth_limit_t *l, const ote_auth_addr_t *a) {
    for (uint32_t i = l->bucket[bucket_of(l, a)]; i != NIL; i = l->e[i].next)
        if (memcmp(&l->e[i].a, a, sizeof(*a)) == 0) return i;
    return NIL;
}

/* Under mu: unlink entry i from its bucket and put it on the free list. */
static void drop(ote_auth_limit_t *l, uint32_t i) {
    uint32_t *pp = &l->bucket[bucket_of(l, &l->e[i].a)];
    while (*pp != i) pp = &l->e[*pp].next;
    *pp = l->e[i].next;
    memset(&l->e[i], 0, sizeof(l->e[i]));
    l->e[i].next = l->free_head;
    l->free_head = i;
    atomic_fetch_sub(&l->used, 1);
}

/* Under mu, the table full: the least recently failed entry not in back-off at now, or
 * the least recently failed one. */
static uint32_t victim(const ote_auth_limit_t *l, uint64_t now) {
    uint32_t best = NIL, any = 0;
    for (uint32_t i = 0; i < l->cfg.entries; i++) {
        const entry_t *x = &l->e[i];
        if (x->last_fail < l->e[any].last_fail) any = i;
        if (now >= x->until && (best == NIL || x->last_fail < l->e[best].last_fail)) best = i;
    }
    return best != NIL ? best : any;
}

/* Under mu: a new entry for a (evicting one when full). */
static uint32_t insert(ote_auth_limit_t *l, const ote_auth_addr_t *a, uint64_t now) {
    if (l->free_head == NIL) drop(l, victim(l, now));
    uint32_t i = l->free_head;
    l->free_head = l->e[i].next;
    memset(&l->e[i], 0, sizeof(l->e[i]));
    l->e[i].a = *a;
    uint32_t *b = &l->bucket[bucket_of(l, a)];
    l->e[i].next = *b;
    *b = i;
    atomic_fetch_add(&l->used, 1);
    return i;
}

int ote_auth_limit_refuse(ote_auth_limit_t *lim, const ote_auth_addr_t *a, uint64_t now) {
    if (lim == NULL || a->kind == 0 || atomic_load(&lim->used) == 0) return 0;
    ote_mutex_lock(&lim->mu);
    uint32_t i = find(lim, a);
    int refuse = i != NIL && now < lim->e[i].until;
    ote_mutex_unlock(&lim->mu);
    if (refuse) {
        atomic_fetch_add(&lim->refused, 1);
        atomic_fetch_add(&g_refused, 1);
    }
    return refuse;
}

void ote_auth_limit_fail(ote_auth_limit_t *lim, const char *transport, const ote_auth_addr_t *a,
                         uint64_t now) {
    if (lim == NULL) return;
    atomic_fetch_add_explicit(&lim->failures, 1, memory_order_relaxed);
    if (a->kind == 0) return;
    uint64_t backoff = 0;
    uint32_t nfails = 0;
    ote_mutex_lock(&lim->mu);
    uint32_t i = find(lim, a);
    if (i != NIL && now - lim->e[i].last_fail >= lim->cfg.quiet_ns && now >= lim->e[i].until) {
        drop(lim, i); /* quiet long enough: start over */
        i = NIL;
    }
    if (i == NIL) i = insert(lim, a, now);
    entry_t *x = &lim->e[i];
    if (x->fails == 0 || now - x->window_start >= lim->cfg.window_ns) {
        x->fails = 0;
        x->window_start = now;
    }
    x->fails++;
    x->last_fail = now;
    /* In penalty (it was in back-off before): one more failure once it is over is enough. */
    if (now >= x->until && (x->fails >= lim->cfg.fails || x->penalty != 0)) {
        backoff = x->penalty != 0 ? x->penalty : lim->cfg.backoff_min_ns;
        x->until = now + backoff;
        x->penalty = backoff >= lim->cfg.backoff_max_ns / 2 ? lim->cfg.backoff_max_ns : 2 * backoff;
        nfails = x->fails;
        x->fails = 0;
    }
    ote_mutex_unlock(&lim->mu);
    if (backoff != 0) {
        char who[64];
        ote_auth_addr_str(a, who, sizeof(who));
        OTE_WARN_LIMITED(transport,
                         "%s: %u more failed authentication(s): its new connections are closed "
                         "at accept for %llu ms",
                         who, nfails, (unsigned long long)(backoff / OTE_NSEC_PER_MSEC));
    }
}

void ote_auth_limit_ok(ote_auth_limit_t *lim, const ote_auth_addr_t *a) {
    if (lim == NULL || a->kind == 0 || atomic_load(&lim->used) == 0) return;
    ote_mutex_lock(&lim->mu);
    uint32_t i = find(lim, a);
    if (i != NIL) drop(lim, i);
    ote_mutex_unlock(&lim->mu);
}

size_t ote_auth_limit_size(ote_auth_limit_t *lim) { return atomic_load(&lim->used); }

uint64_t ote_auth_limit_refused(ote_auth_limit_t *lim) { return atomic_load(&lim->refused); }

uint64_t ote_auth_limit_failures(ote_auth_limit_t *lim) { return atomic_load(&lim->failures); }

uint64_t ote_auth_refused(void) { return atomic_load(&g_refused); }

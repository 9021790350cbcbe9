/*
 * naming/redis.c - the Redis store through hiredis: SET key value PX ttl, PEXPIRE to
 * refresh (SET again when the key expired meanwhile), GET, SCAN MATCH prefix*, DEL.
 *
 * One connection under the store's mutex, with connect and command timeouts of
 * timeout_ms; a connection that failed is dropped and made again on the next call.
 */
#include <errno.h>
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "base/alloc.h"
#include "base/lock.h"
#include "base/log.h"
#include "base/time.h"
#include "naming/naming_internal.h"

#define REDIS_SCAN_ROUNDS 4096

typedef struct {
    ote_mutex_t mu;
    redisContext *c;
    char host[256];
    int port;
    uint32_t timeout_ms;
} rstore_t;

static struct timeval tv_of(uint32_t ms) {
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (suseconds_t)(ms % 1000) * 1000};
    return tv;
}

/* A connection, made with what is left of dl to connect (at most timeout_ms). */
static ote_status_t ensure(rstore_t *s, ote_deadline_t dl) {
    if (s->c != NULL) return OTE_OK;
    int left = ote_deadline_remaining_ms(dl, (int)s->timeout_ms);
    if (left <= 0) return OTE_ERR_TIMEOUT;
    redisContext *c = redisConnectWithTimeout(s->host, s->port, tv_of((uint32_t)left));
    if (c == NULL) return OTE_ERR_NOMEM;
    if (c->err != 0 || redisSetTimeout(c, tv_of(s->timeout_ms)) != REDIS_OK) {
        OTE_WARN("naming", "redis %s:%d: %s", s->host, s->port, c->errstr);
        redisFree(c);
        return OTE_ERR_CONNECT;
    }
    s->c = c;
    return OTE_OK;
}

/* One command (argv form, binary-safe) by dl, the connection made first where there is
 * none; the reply in *r_out. A failed connection is dropped: OTE_ERR_TIMEOUT when it did
 * not answer in time, else OTE_ERR_CONNECT. */
static ote_status_t cmd(rstore_t *s, int argc, const char **argv, const size_t *lens,
                        ote_deadline_t dl, redisReply **r_out) {
    ote_status_t st = ensure(s, dl);
    if (st != OTE_OK) return st;
    int left = ote_deadline_remaining_ms(dl, (int)s->timeout_ms);
    if (left <= 0) return OTE_ERR_TIMEOUT;
    if (redisSetTimeout(s->c, tv_of((uint32_t)left)) != REDIS_OK) {
        OTE_WARN("naming", "redis %s:%d: setting a %d ms timeout failed: %s", s->host, s->port,
                 left, s->c->errstr);
        redisFree(s->c);
        s->c = NULL;
        return OTE_ERR_CONNECT;
    }
    redisReply *r = redisCommandArgv(s->c, argc, argv, lens);
    if (r == NULL) {
        int timed_out = s->c->err == REDIS_ERR_IO && (errno == EAGAIN || errno == ETIMEDOUT);
        OTE_WARN("naming", "redis %s:%d %s: %s", s->host, s->port, argv[0], s->c->errstr);
        redisFree(s->c);
        s->c = NULL;
        return timed_out ? OTE_ERR_TIMEOUT : OTE_ERR_CONNECT;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        OTE_WARN("naming", "redis %s: %.200s", argv[0], r->str);
        freeReplyObject(r);
        return OTE_ERR_REMOTE;
    }
    *r_out = r;
    return OTE_OK;
}

/* cmd under the store's mutex, timeout_ms in all, the wait for the mutex included (a
 * watch's command of another thread may hold it while the store does not answer). */
static ote_status_t locked_cmd(rstore_t *s, int argc, const char **argv, const size_t *lens,
                               redisReply **r_out) {
    ote_deadline_t dl = ote_deadline_after((uint64_t)s->timeout_ms * OTE_NSEC_PER_MSEC);
    if (ote_mutex_lock_until(&s->mu, dl) != OTE_OK) {
        OTE_WARN("naming", "redis %s: no answer in %u ms (the store's other commands)", argv[0],
                 s->timeout_ms);
        return OTE_ERR_TIMEOUT;
    }
    ote_status_t st = cmd(s, argc, argv, lens, dl, r_out);
    ote_mutex_unlock(&s->mu);
    return st;
}

static ote_status_t redis_put(void *st_, const char *key, const uint8_t *val, size_t len,
                              uint32_t ttl_ms, uint64_t *lease) {
    char ttl[16];
    snprintf(ttl, sizeof(ttl), "%u", ttl_ms);
    const char *argv[] = {"SET", key, (const char *)val, "PX", ttl};
    size_t lens[] = {3, strlen(key), len, 2, strlen(ttl)};
    redisReply *r = NULL;
    ote_status_t st = locked_cmd(st_, 5, argv, lens, &r);
    if (st != OTE_OK) return st;
    st = r->type == REDIS_REPLY_STATUS ? OTE_OK : OTE_ERR_PROTOCOL;
    freeReplyObject(r);
    if (st == OTE_OK) *lease = 0;
    return st;
}

static ote_status_t redis_refresh(void *st_, const char *key, const uint8_t *val, size_t len,
                                  uint32_t ttl_ms, uint64_t *lease) {
    char ttl[16];
    snprintf(ttl, sizeof(ttl), "%u", ttl_ms);
    const char *argv[] = {"PEXPIRE", key, ttl};
    size_t lens[] = {7, strlen(key), strlen(ttl)};
    redisReply *r = NULL;
    ote_status_t st = locked_cmd(st_, 3, argv, lens, &r);
    if (st != OTE_OK) return st;
    int alive = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    freeReplyObject(r);
    if (alive) return OTE_OK;
    OTE_WARN("naming", "redis: %s expired; publishing it again", key);
    return redis_put(st_, key, val, len, ttl_ms, lease);
}

static ote_status_t redis_get(void *st_, const char *key, uint8_t **val_out, size_t *len_out) {
    const char *argv[] = {"GET", key};
    size_t lens[] = {3, strlen(key)};
    redisReply *r = NULL;
    ote_status_t st = locked_cmd(st_, 2, argv, lens, &r);
    if (st != OTE_OK) return st;
    if (r->type == REDIS_REPLY_NIL) {
        st = OTE_ERR_NOT_FOUND;
    } else if (r->type != REDIS_REPLY_STRING) {
        st = OTE_ERR_PROTOCOL;
    } else {
        uint8_t *v = ote_malloc(r->len + 1);
        if (v == NULL) {
            st = OTE_ERR_NOMEM;
        } else {
            memcpy(v, r->str, r->len);
            *val_out = v;
            *len_out = r->len;
        }
    }
    freeReplyObject(r);
    return st;
}

/* prefix with the glob characters of MATCH escaped, then '*'. */
static char *glob_of(const char *prefix) {
    char *g = ote_malloc(strlen(prefix) * 2 + 2);
    if (g == NULL) return NULL;
    size_t j = 0;
    for (const char *p = prefix; *p != '\0'; p++) {
        if (strchr("*?[]\\^", *p) != NULL) g[j++] = '\\';
        g[j++] = *p;
    }
    g[j++] = '*';
    g[j] = '\0';
    return g;
}

/* Append the keys of one SCAN reply's key array to keys (n, cap grow). */
static ote_status_t take_keys(const redisReply *arr, char ***keys, size_t *n, size_t *cap) {
    for (size_t i = 0; i < arr->elements; i++) {
        const redisReply *k = arr->element[i];
        if (k->type != REDIS_REPLY_STRING) return OTE_ERR_PROTOCOL;
        if (*n + 1 >= *cap) {
            size_t nc = *cap * 2 + 16;
            char **nk = ote_realloc(*keys, nc * sizeof(char *));
            if (nk == NULL) return OTE_ERR_NOMEM;
            *keys = nk;
            *cap = nc;
        }
        char *dup = ote_malloc(k->len + 1);
        if (dup == NULL) return OTE_ERR_NOMEM;
        memcpy(dup, k->str, k->len);
        dup[k->len] = '\0';
        (*keys)[(*n)++] = dup;
    }
    return OTE_OK;
}

static ote_status_t scan_all(rstore_t *s, const char *glob, char ***keys, size_t *n) {
    size_t cap = 0;
    char cursor[32] = "0";
    ote_status_t st = OTE_OK;
    for (int round = 0; round < REDIS_SCAN_ROUNDS; round++) {
        const char *argv[] = {"SCAN", cursor, "MATCH", glob, "COUNT", "1000"};
        size_t lens[] = {4, strlen(cursor), 5, strlen(glob), 5, 4};
        redisReply *r = NULL;
        st = locked_cmd(s, 6, argv, lens, &r);
        if (st != OTE_OK) return st;
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[0]->type != REDIS_REPLY_STRING || r->element[0]->len >= sizeof(cursor) ||
            r->element[1]->type != REDIS_REPLY_ARRAY)
            st = OTE_ERR_PROTOCOL;
        else st = take_keys(r->element[1], keys, n, &cap);
        if (st == OTE_OK) snprintf(cursor, sizeof(cursor), "%s", r->element[0]->str);
        freeReplyObject(r);
        if (st != OTE_OK || strcmp(cursor, "0") == 0) return st;
    }
    return OTE_ERR_TOO_BIG;
}

static ote_status_t redis_list(void *st_, const char *prefix, char ***keys_out, size_t *n_out) {
    char *glob = glob_of(prefix);
    if (glob == NULL) return OTE_ERR_NOMEM;
    char **keys = NULL;
    size_t n = 0;
    ote_status_t st = scan_all(st_, glob, &keys, &n);
    ote_free(glob);
    if (st != OTE_OK) {
        for (size_t i = 0; i < n; i++) ote_free(keys[i]);
        ote_free(keys);
        return st;
    }
    /* SCAN may return a key twice: the caller sorts and drops duplicates. */
    *keys_out = keys;
    *n_out = n;
    return OTE_OK;
}

static ote_status_t redis_del(void *st_, const char *key, uint64_t lease) {
    (void)lease;
    const char *argv[] = {"DEL", key};
    size_t lens[] = {3, strlen(key)};
    redisReply *r = NULL;
    ote_status_t st = locked_cmd(st_, 2, argv, lens, &r);
    if (st == OTE_OK) freeReplyObject(r);
    return st;
}

static void redis_close(void *st_) {
    rstore_t *s = st_;
    if (s == NULL) return;
    if (s->c != NULL) redisFree(s->c);
    ote_mutex_destroy(&s->mu);
    ote_free(s);
}

ote_status_t ote__redis_open(const char *hosts, uint32_t timeout_ms, void **st_out) {
    const char *colon = strrchr(hosts, ':');
    char *end = NULL;
    long port = colon != NULL ? strtol(colon + 1, &end, 10) : 0;
    size_t hl = colon != NULL ? (size_t)(colon - hosts) : 0;
    if (colon == NULL || hl == 0 || hl >= 256 || end == colon + 1 || *end != '\0' || port <= 0 ||
        port > 65535 || strchr(hosts, ',') != NULL)
        return OTE_ERR_INVALID;
    rstore_t *s = ote_calloc(1, sizeof(*s));
    if (s == NULL) return OTE_ERR_NOMEM;
    ote_status_t st = ote_mutex_init(&s->mu);
    if (st != OTE_OK) {
        ote_free(s);
        return st;
    }
    memcpy(s->host, hosts, hl);
    s->port = (int)port;
    s->timeout_ms = timeout_ms;
    const char *argv[] = {"PING"};
    size_t lens[] = {4};
    redisReply *r = NULL;
    st = locked_cmd(s, 1, argv, lens, &r);
    if (st == OTE_OK) freeReplyObject(r);
    if (st != OTE_OK) {
        OTE_WARN("naming", "redis://%s: %s", hosts, ote_status_str(st));
        redis_close(s);
        return st;
    }
    *st_out = s;
    return OTE_OK;
}

const ote__nstore_ops_t ote__redis_ops = {
    .put = redis_put,
    .refresh = redis_refresh,
    .get = redis_get,
    .list = redis_list,
    .del = redis_del,
    .close = redis_close,
};

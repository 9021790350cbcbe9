/*
 * engine/tcp/tcp_pins.c - one pin per request at the source of the TCP transport.
 *
 * A version-2 requester names, in every slice frame, its request's extent and id. The
 * source keeps one account per (session, request id): the first slice of the request to
 * arrive checks the whole extent against the engine's registrations (host->pin) and pins
 * it once; every slice then holds its bytes of that account until it is served (WRITE
 * payload received, READ data sent), discarded or withdrawn; the pin is released when
 * the last byte of the request is accounted for. A refusal is kept in the account and
 * given to every slice of the request, so a request is never half served. Bytes that will
 * never come (slices the requester dropped on cancel) are written off by CANCEL; what a
 * requester leaves open when its last connection of the session closes (it died, or
 * reconnected) is ended then. An unregister of the range is therefore BUSY from the
 * first slice of a request to its last, not only while a slice is in flight.
 *
 * Version-1 connections keep the per-slice pin (host->pin of the slice's range).
 * Worker threads only (any worker: the connections of a session are spread over them),
 * under tp->pmu; the engine's pin is taken under pmu, its unpin after pmu is released.
 */
#include <stdint.h>
#include <string.h>

#include "base/alloc.h"
#include "base/hash.h"
#include "base/log.h"
#include "engine/tcp/tcp_internal.h"
#include "ote/ote.h"

/* Accounts one session may hold open at once (a requester with more is refused AGAIN). */
#define TCP_SRC_MAX_REQS 65536u

typedef struct src_sess src_sess_t;

typedef struct src_req {
    struct {
        uint64_t session, uid;
    } key;
    UT_hash_handle hh;
    struct src_req *snext, *sprev; /* the session's accounts */
    src_sess_t *sess;
    void *pin;       /* the engine's pin of the extent (NULL until a slice came, or refused) */
    ote_status_t st; /* OTE_OK, or the refusal every slice of the request gets */
    uint64_t req_addr, req_len;
    uint16_t op;
    uint64_t left; /* bytes of the request not yet seen (arrived as a slice, or written off) */
    uint64_t held; /* bytes of slices being served (each holds the account until done) */
} src_req_t;

struct src_sess {
    uint64_t session;
    UT_hash_handle hh;
    uint32_t nconns;
    size_t nreqs;
    src_req_t *reqs;
};

ote_status_t ote__tcp_src_sess_join(tcp_conn_t *c, uint64_t session) {
    tcp_t *tp = c->w->tp;
    ote_status_t st = OTE_OK;
    ote_mutex_lock(&tp->pmu);
    src_sess_t *s = NULL;
    HASH_FIND(hh, tp->psess, &session, sizeof(session), s);
    if (s == NULL && (s = ote_calloc(1, sizeof(*s))) != NULL) {
        s->session = session;
        OTE_HASH_ADD(hh, tp->psess, session, sizeof(s->session), s, st);
        if (st != OTE_OK) {
            ote_free(s);
            s = NULL;
        }
    }
    if (s != NULL) {
        s->nconns++;
        c->sess = s;
    } else {
        st = OTE_ERR_NOMEM;
    }
    ote_mutex_unlock(&tp->pmu);
    return st;
}

/* Unlink and free account r, returning its pin (to release with no lock held). */
static void *req_end_locked(tcp_t *tp, src_req_t *r) {
    void *pin = r->pin;
    HASH_DEL(tp->preqs, r);
    if (r->sprev) r->sprev->snext = r->snext;
    else r->sess->reqs = r->snext;
    if (r->snext) r->snext->sprev = r->sprev;
    r->sess->nreqs--;
    ote_free(r);
    return pin;
}

/* End every account of s (no connection of it is left), then s. pmu held; the pins go
 * to *pins (a list through the first word of a small array) for release after. */
static size_t sess_end_locked(tcp_t *tp, src_sess_t *s, void ***pins, size_t *npins) {
    size_t n = 0;
    *pins = s->nreqs ? ote_malloc(s->nreqs * sizeof(void *)) : NULL;
    *npins = 0;
    while (s->reqs != NULL) {
        void *pin = req_end_locked(tp, s->reqs);
        if (pin != NULL && *pins != NULL) (*pins)[(*npins)++] = pin;
        else if (pin != NULL) tp->host.unpin(tp->host.arg, pin); /* no memory for the list */
        n++;
    }
    HASH_DEL(tp->psess, s);
    ote_free(s);
    return n;
}

void ote__tcp_src_sess_leave(tcp_conn_t *c) {
    tcp_t *tp = c->w->tp;
    src_sess_t *s = c->sess;
    if (s == NULL) return;
    c->sess = NULL;
    void **pins = NULL;
    size_t npins = 0, open = 0;
    ote_mutex_lock(&tp->pmu);
    if (--s->nconns == 0) open = sess_end_locked(tp, s, &pins, &npins);
    ote_mutex_unlock(&tp->pmu);
    for (size_t i = 0; i < npins; i++) tp->host.unpin(tp->host.arg, pins[i]);
    ote_free(pins);
    if (open > 0)
        OTE_DEBUG("tcp", "requester %s gone: %zu request(s) it left open released", c->from, open);
}

void ote__tcp_src_reqs_drop_all(tcp_t *tp) {
    src_sess_t *s, *tmp;
    HASH_ITER(hh, tp->psess, s, tmp) {
        void **pins = NULL;
        size_t npins = 0;
        (void)sess_end_locked(tp, s, &pins, &npins);
        for (size_t i = 0; i < npins; i++) tp->host.unpin(tp->host.arg, pins[i]);
        ote_free(pins);
    }
}

/* The account of (c's session, uid), created (unpinned, nothing accounted) when absent.
 * NULL when out of memory or at the session's cap. pmu held. */
static src_req_t *req_get_locked(tcp_conn_t *c, uint64_t uid, uint64_t req_len) {
    tcp_t *tp = c->w->tp;
    src_sess_t *s = c->sess;
    struct {
        uint64_t session, uid;
    } key = {s->session, uid};
    src_req_t *r = NULL;
    HASH_FIND(hh, tp->preqs, &key, sizeof(key), r);
    if (r != NULL || s->nreqs >= TCP_SRC_MAX_REQS) return r;
    if ((r = ote_calloc(1, sizeof(*r))) == NULL) return NULL;
    r->key.session = key.session;
    r->key.uid = uid;
    r->req_len = req_len;
    r->left = req_len;
    ote_status_t st;
    OTE_HASH_ADD(hh, tp->preqs, key, sizeof(r->key), r, st);
    if (st != OTE_OK) {
        ote_free(r);
        return NULL;
    }
    r->sess = s;
    r->snext = s->reqs;
    if (s->reqs) s->reqs->sprev = r;
    s->reqs = r;
    s->nreqs++;
    return r;
}

/* Bytes of r that will not be served: seen (refused, written off, never to come) or, for
 * served ones, done (held). The account ends (its pin returned, to release with no lock
 * held) once nothing is left to come and nothing is held. pmu held. */
static void *req_account_locked(tcp_t *tp, src_req_t *r, uint64_t seen, uint64_t done) {
    r->left -= seen < r->left ? seen : r->left;
    r->held -= done < r->held ? done : r->held;
    return r->left == 0 && r->held == 0 ? req_end_locked(tp, r) : NULL;
}

/* A pin of the request's extent held by one slice alone (version 1, or no account could
 * be had): the engine's pin with its low bit set (registrations are heap objects, so the
 * bit is free), released by that slice. */
#define ALONE_BIT ((uintptr_t)1)

static ote_status_t pin_alone(tcp_t *tp, uint64_t addr, uint64_t len, unsigned perm,
                              void **pin_out) {
    void *pin = NULL;
    ote_status_t st = tp->host.pin(tp->host.arg, addr, len, perm, &pin);
    if (st == OTE_OK) *pin_out = (void *)((uintptr_t)pin | ALONE_BIT);
    return st;
}

ote_status_t ote__tcp_src_pin(tcp_conn_t *c, const ote_ctl_msg_t *m, unsigned perm,
                              void **pin_out) {
    tcp_t *tp = c->w->tp;
    if (c->sess == NULL || m->u.rw.req_uid == 0) /* version 1: the slice's own range */
        return pin_alone(tp, m->u.rw.req_addr, m->u.rw.req_len, perm, pin_out);
    ote_status_t st = OTE_OK;
    void *release = NULL;
    int alone = 0;
    ote_mutex_lock(&tp->pmu);
    src_req_t *r = req_get_locked(c, m->u.rw.req_uid, m->u.rw.req_len);
    if (r == NULL) {
        alone = 1; /* out of memory, or too many requests open: this slice pins alone */
    } else if (r->req_len != m->u.rw.req_len ||
               (r->op != 0 && (r->req_addr != m->u.rw.req_addr || r->op != m->opcode)) ||
               m->u.rw.len > r->left) {
        st = OTE_ERR_INVALID; /* not the request its first slice named: refused alone */
    } else {
        if (r->op == 0) {
            r->op = m->opcode;
            r->req_addr = m->u.rw.req_addr;
            r->st = tp->host.pin(tp->host.arg, r->req_addr, r->req_len, perm, &r->pin);
            if (r->st != OTE_OK) r->pin = NULL;
        }
        st = r->st;
        if (st != OTE_OK) {
            release = req_account_locked(tp, r, m->u.rw.len, 0);
        } else {
            r->left -= m->u.rw.len;
            r->held += m->u.rw.len;
            *pin_out = r;
        }
    }
    ote_mutex_unlock(&tp->pmu);
    if (release != NULL) tp->host.unpin(tp->host.arg, release);
    if (alone) {
        OTE_WARN_LIMITED("tcp",
                         "no account for a request of %s (out of memory or %u open): "
                         "its slices pin alone",
                         c->from, TCP_SRC_MAX_REQS);
        st = pin_alone(tp, m->u.rw.req_addr, m->u.rw.req_len, perm, pin_out);
    }
    return st;
}

void *ote__tcp_src_engine_pin(tcp_conn_t *c, void *pin) {
    (void)c;
    if ((uintptr_t)pin & ALONE_BIT) return (void *)((uintptr_t)pin & ~ALONE_BIT);
    /* The account holds its engine pin while a slice holds the account. */
    return ((src_req_t *)pin)->pin;
}

void ote__tcp_src_stage_put(tcp_conn_t *c, void **stage) {
    tcp_t *tp = c->w->tp;
    if (*stage != NULL) tp->host.stage_put(tp->host.arg, *stage);
    *stage = NULL;
}

void ote__tcp_src_unpin(tcp_conn_t *c, void *pin, uint32_t len) {
    tcp_t *tp = c->w->tp;
    if ((uintptr_t)pin & ALONE_BIT) {
        tp->host.unpin(tp->host.arg, (void *)((uintptr_t)pin & ~ALONE_BIT));
        return;
    }
    ote_mutex_lock(&tp->pmu);
    void *release = req_account_locked(tp, pin, 0, len);
    ote_mutex_unlock(&tp->pmu);
    if (release != NULL) tp->host.unpin(tp->host.arg, release);
}

void ote__tcp_src_write_off(tcp_conn_t *c, uint64_t uid, uint64_t req_len, uint64_t bytes) {
    tcp_t *tp = c->w->tp;
    if (c->sess == NULL || uid == 0 || req_len == 0) return;
    void *release = NULL;
    ote_mutex_lock(&tp->pmu);
    src_req_t *r = req_get_locked(c, uid, req_len);
    if (r != NULL && r->req_len == req_len) release = req_account_locked(tp, r, bytes, 0);
    ote_mutex_unlock(&tp->pmu);
    if (release != NULL) tp->host.unpin(tp->host.arg, release);
}

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
 * The account itself (check and pin once, hold, settle, the end) is engine/src_account.h's,
 * shared with shm and rdma; this file keeps TCP's scopes (sessions) and its locking.
 * Version-1 connections keep the per-slice pin (host->pin of the slice's range).
 * Worker threads only (any worker: the connections of a session are spread over them),
 * under tp->pmu; the engine's pin is taken under pmu, its unpin after pmu is released.
 */
#include <stdint.h>
#include <string.h>

#include "base/alloc.h"
#include "base/hash.h"
#include "base/log.h"
#include "engine/src_account.h"
#include "engine/tcp/tcp_internal.h"
#include "ote/ote.h"

/* Accounts one session may hold open at once (a requester with more pins alone). */
#define TCP_SRC_MAX_REQS 65536u

typedef struct src_sess src_sess_t;

struct src_sess {
    uint64_t session;
    UT_hash_handle hh;
    uint32_t nconns;
    size_t nreqs;
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

/* An account that ended (unlinked): its session counts one less; its pin is returned, to
 * release with no lock held. pmu held. */
static void *acct_ended_locked(tcp_t *tp, ote__acct_t *a) {
    if (a == NULL) return NULL;
    src_sess_t *s = NULL;
    HASH_FIND(hh, tp->psess, &a->key.scope, sizeof(a->key.scope), s);
    if (s != NULL && s->nreqs > 0) s->nreqs--;
    void *pin = a->pin;
    ote__acct_free(a);
    return pin;
}

/* The accounts a session's end unlinks, chained by link for release once pmu is dropped. */
static void collect(void *arg, ote__acct_t *a) {
    ote__acct_t **head = arg;
    a->link = *head;
    *head = a;
}

/* Ends every account of session s (no connection of it is left; nothing of it is held),
 * then s. pmu held; the accounts go to *ended for release after. */
static size_t sess_end_locked(tcp_t *tp, src_sess_t *s, ote__acct_t **ended) {
    size_t n = ote__acct_end_scope(&tp->paccts, s->session, 0, 1, collect, ended);
    HASH_DEL(tp->psess, s);
    ote_free(s);
    return n;
}

/* Releases the pins of the ended accounts and frees them. No lock held. */
static void release_ended(tcp_t *tp, ote__acct_t *a) {
    while (a != NULL) {
        ote__acct_t *next = a->link;
        if (a->pin != NULL) tp->host.unpin(tp->host.arg, a->pin);
        ote__acct_free(a);
        a = next;
    }
}

void ote__tcp_src_sess_leave(tcp_conn_t *c) {
    tcp_t *tp = c->w->tp;
    src_sess_t *s = c->sess;
    if (s == NULL) return;
    c->sess = NULL;
    ote__acct_t *ended = NULL;
    size_t open = 0;
    ote_mutex_lock(&tp->pmu);
    if (--s->nconns == 0) open = sess_end_locked(tp, s, &ended);
    ote_mutex_unlock(&tp->pmu);
    release_ended(tp, ended);
    if (open > 0)
        OTE_DEBUG("tcp", "requester %s gone: %zu request(s) it left open released", c->from, open);
}

void ote__tcp_src_reqs_drop_all(tcp_t *tp) {
    src_sess_t *s, *tmp;
    HASH_ITER(hh, tp->psess, s, tmp) {
        ote__acct_t *ended = NULL;
        (void)sess_end_locked(tp, s, &ended);
        release_ended(tp, ended);
    }
}

/* The account of (c's session, uid), created (unopened) when absent; NULL when out of
 * memory or at the session's cap. pmu held. */
static ote__acct_t *acct_get_locked(tcp_conn_t *c, uint64_t uid, uint64_t req_len) {
    tcp_t *tp = c->w->tp;
    src_sess_t *s = c->sess;
    int created = 0;
    ote__acct_t *a =
        ote__acct_get(&tp->paccts, s->session, uid, req_len, s->nreqs < TCP_SRC_MAX_REQS, &created);
    s->nreqs += (size_t)created;
    return a;
}

ote_status_t ote__tcp_src_pin(tcp_conn_t *c, const ote_ctl_msg_t *m, unsigned perm,
                              void **pin_out) {
    tcp_t *tp = c->w->tp;
    perm |= OTE__PIN_FILE; /* this source serves file registrations (through host->file) */
    if (c->sess == NULL || m->u.rw.req_uid == 0) /* version 1: the slice's own range */
        return ote__acct_pin_alone(tp->host.pin, tp->host.arg, m->u.rw.req_addr, m->u.rw.req_len,
                                   perm, pin_out);
    ote_status_t st = OTE_OK;
    void *release = NULL;
    int alone = 0, first = 0;
    ote_mutex_lock(&tp->pmu);
    ote__acct_t *a = acct_get_locked(c, m->u.rw.req_uid, m->u.rw.req_len);
    if (a == NULL) {
        alone = 1; /* out of memory, or too many requests open: this slice pins alone */
    } else if ((st = ote__acct_admit(a, m->u.rw.req_addr, m->u.rw.req_len, m->opcode, m->u.rw.len,
                                     &first)) == OTE_OK) {
        if (first) { /* the first slice checks and pins the whole extent, under pmu */
            void *pin = NULL;
            ote_status_t pst = tp->host.pin(tp->host.arg, a->req_addr, a->req_len, perm, &pin);
            ote__acct_open(a, pst, pin);
        }
        st = ote__acct_hold(a, m->u.rw.len);
        if (st == OTE_OK) *pin_out = a;
        else release = acct_ended_locked(tp, ote__acct_settle(&tp->paccts, a, m->u.rw.len, 0));
    } /* else: not the request its first slice named: refused alone */
    ote_mutex_unlock(&tp->pmu);
    if (release != NULL) tp->host.unpin(tp->host.arg, release);
    if (alone) {
        OTE_WARN_LIMITED("tcp",
                         "no account for a request of %s (out of memory or %u open): "
                         "its slices pin alone",
                         c->from, TCP_SRC_MAX_REQS);
        st = ote__acct_pin_alone(tp->host.pin, tp->host.arg, m->u.rw.req_addr, m->u.rw.req_len,
                                 perm, pin_out);
    }
    return st;
}

void *ote__tcp_src_engine_pin(tcp_conn_t *c, void *pin) {
    (void)c;
    return ote__acct_engine_pin(pin);
}

void ote__tcp_src_stage_put(tcp_conn_t *c, void **stage, uint8_t *file) {
    tcp_t *tp = c->w->tp;
    if (*stage != NULL && *file) tp->host.file.bounce_put(tp->host.file.arg, *stage);
    else if (*stage != NULL) tp->host.gpu.stage_put(tp->host.gpu.arg, *stage);
    *stage = NULL;
    *file = 0;
}

void ote__tcp_src_unpin(tcp_conn_t *c, void *pin, uint32_t len) {
    tcp_t *tp = c->w->tp;
    if (ote__acct_is_alone(pin)) {
        tp->host.unpin(tp->host.arg, ote__acct_alone_pin(pin));
        return;
    }
    ote_mutex_lock(&tp->pmu);
    void *release = acct_ended_locked(tp, ote__acct_settle(&tp->paccts, pin, 0, len));
    ote_mutex_unlock(&tp->pmu);
    if (release != NULL) tp->host.unpin(tp->host.arg, release);
}

void ote__tcp_src_write_off(tcp_conn_t *c, uint64_t uid, uint64_t req_len, uint64_t bytes) {
    tcp_t *tp = c->w->tp;
    if (c->sess == NULL || uid == 0 || req_len == 0) return;
    void *release = NULL;
    ote_mutex_lock(&tp->pmu);
    ote__acct_t *a = acct_get_locked(c, uid, req_len);
    if (a != NULL && a->req_len == req_len)
        release = acct_ended_locked(tp, ote__acct_settle(&tp->paccts, a, bytes, 0));
    ote_mutex_unlock(&tp->pmu);
    if (release != NULL) tp->host.unpin(tp->host.arg, release);
}

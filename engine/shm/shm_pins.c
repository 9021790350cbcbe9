/*
 * engine/shm/shm_pins.c - one pin per request at the source of the same-host transport.
 *
 * Each accepted connection keeps one account per open request of several pieces (keyed
 * by the request id its pieces carry; a request of one piece is checked and pinned alone,
 * for as long as it is copied): the first piece checks the request's whole extent against
 * the engine's registrations and pins it once, or records the refusal that every later
 * piece gets; each piece takes its bytes from the account while it is copied; the account ends,
 * and its pin is released, when every byte of the request has been served, refused or
 * written off (WRITE_OFF entries: pieces the requester dropped unsent). What a connection
 * leaves open ends when it closes. The connection's thread alone touches its accounts, so
 * there is no lock (the copy helpers only read an account's cancel mark, atomic, while a
 * piece of it is held). A CANCEL entry marks the account: pieces still to come are
 * refused OTE_ERR_CANCELED, pieces being copied stop at their next chunk. Design:
 * shm_internal.h.
 */
#include <stdint.h>

#include "base/alloc.h"
#include "base/hash.h"
#include "base/log.h"
#include "engine/shm/shm_internal.h"
#include "ote/ote.h"

struct shm_acct {
    uint64_t uid;
    UT_hash_handle hh;
    void *pin;       /* the engine's pin of the extent (NULL until a piece came, or refused) */
    ote_status_t st; /* OTE_OK, or the refusal every piece of the request gets */
    uint64_t req_remote, req_len;
    uint16_t op;          /* 0 until the first piece came (a write-off may come first) */
    uint64_t left;        /* bytes not yet seen (arrived as a piece, or written off) */
    uint64_t held;        /* bytes of pieces being copied now */
    _Atomic int canceled; /* a CANCEL entry named it: read by the copy helpers too */
};

/* A pin held by one piece alone (no request id, or no account could be had): the
 * engine's pin with its low bit set (registrations are heap objects, the bit is free). */
#define ALONE_BIT ((uintptr_t)1)

static void acct_end(shm_src_t *s, shm_acct_t *a) {
    const ote__host_t *host = &s->tp->host;
    HASH_DEL(s->accts, a);
    s->naccts--;
    if (a->pin != NULL) host->unpin(host->arg, a->pin);
    ote_free(a);
}

/* Bytes seen (not to be served) and bytes done (served); ends the account once nothing
 * is left to come and nothing is held. */
static void acct_take(shm_src_t *s, shm_acct_t *a, uint64_t seen, uint64_t done) {
    a->left -= seen < a->left ? seen : a->left;
    a->held -= done < a->held ? done : a->held;
    if (a->left == 0 && a->held == 0) acct_end(s, a);
}

/* The account of uid, created (unpinned, nothing seen) when absent; NULL when out of
 * memory or at the cap. */
static shm_acct_t *acct_get(shm_src_t *s, uint64_t uid, uint64_t req_remote, uint64_t req_len) {
    shm_acct_t *a = NULL;
    HASH_FIND(hh, s->accts, &uid, sizeof(uid), a);
    if (a != NULL || s->naccts >= SHM_SRC_MAX_REQS) return a;
    if ((a = ote_calloc(1, sizeof(*a))) == NULL) return NULL;
    a->uid = uid;
    a->req_remote = req_remote;
    a->req_len = req_len;
    a->left = req_len;
    ote_status_t st;
    OTE_HASH_ADD(hh, s->accts, uid, sizeof(a->uid), a, st);
    if (st != OTE_OK) {
        ote_free(a);
        return NULL;
    }
    s->naccts++;
    return a;
}

static ote_status_t pin_alone(shm_src_t *s, uint64_t addr, uint64_t len, unsigned perm,
                              void **pin_out) {
    const ote__host_t *host = &s->tp->host;
    void *pin = NULL;
    ote_status_t st = host->pin(host->arg, addr, len, perm, &pin);
    if (st == OTE_OK) *pin_out = (void *)((uintptr_t)pin | ALONE_BIT);
    return st;
}

ote_status_t ote__shm_src_pin(shm_src_t *s, const shm_req_t *q, uint64_t start, uint64_t len,
                              unsigned perm, void **pin_out) {
    /* A request of one piece needs no account: its pin is held while it is copied, and a
     * write-off of it (the whole request) opens none. */
    if (q->req_uid == 0 || q->req_len == 0 || (q->remote == q->req_remote && q->len == q->req_len))
        return pin_alone(s, start, len, perm, pin_out);
    shm_acct_t *a = acct_get(s, q->req_uid, q->req_remote, q->req_len);
    if (a == NULL) {
        OTE_WARN_LIMITED("shm",
                         "no account for a request of %s (out of memory or %u open): its "
                         "pieces pin alone",
                         s->from, SHM_SRC_MAX_REQS);
        return pin_alone(s, start, len, perm, pin_out);
    }
    if (a->req_remote != q->req_remote || a->req_len != q->req_len ||
        (a->op != 0 && a->op != q->op) || q->len > a->left)
        return OTE_ERR_INVALID; /* not the request its first piece named: refused alone */
    if (a->op == 0) {
        a->op = q->op;
        a->st = s->tp->host.pin(s->tp->host.arg, start, len, perm, &a->pin);
        if (a->st != OTE_OK) a->pin = NULL;
    }
    ote_status_t st = atomic_load(&a->canceled) ? OTE_ERR_CANCELED : a->st;
    if (st != OTE_OK) {
        acct_take(s, a, q->len, 0);
        return st;
    }
    a->left -= q->len;
    a->held += q->len;
    *pin_out = a;
    return OTE_OK;
}

void *ote__shm_src_engine_pin(shm_src_t *s, void *pin) {
    (void)s;
    if ((uintptr_t)pin & ALONE_BIT) return (void *)((uintptr_t)pin & ~ALONE_BIT);
    return ((shm_acct_t *)pin)->pin; /* held while a piece holds the account */
}

void ote__shm_src_unpin(shm_src_t *s, void *pin, uint32_t len) {
    if ((uintptr_t)pin & ALONE_BIT) {
        s->tp->host.unpin(s->tp->host.arg, (void *)((uintptr_t)pin & ~ALONE_BIT));
        return;
    }
    acct_take(s, pin, 0, len);
}

void ote__shm_src_write_off(shm_src_t *s, const shm_req_t *q) {
    if (q->req_uid == 0 || q->req_len == 0) return;
    shm_acct_t *a = NULL;
    HASH_FIND(hh, s->accts, &q->req_uid, sizeof(q->req_uid), a);
    if (a == NULL && q->local >= q->req_len) return; /* the whole request: nothing to open */
    if (a == NULL) a = acct_get(s, q->req_uid, q->req_remote, q->req_len);
    if (a != NULL && a->req_len == q->req_len && a->req_remote == q->req_remote)
        acct_take(s, a, q->local, 0);
}

void ote__shm_src_cancel(shm_src_t *s, const shm_req_t *q) {
    if (q->req_uid == 0 || q->req_len == 0) return;
    shm_acct_t *a = NULL;
    HASH_FIND(hh, s->accts, &q->req_uid, sizeof(q->req_uid), a);
    /* Only the open request its pieces named; a request not open here has nothing left
     * to stop (all of it served, or none of it arrived: its pieces are written off). */
    if (a != NULL && a->req_len == q->req_len && a->req_remote == q->req_remote)
        atomic_store(&a->canceled, 1);
}

int ote__shm_src_canceled(const void *pin) {
    if (pin == NULL || ((uintptr_t)pin & ALONE_BIT)) return 0;
    return atomic_load(&((shm_acct_t *)pin)->canceled);
}

void ote__shm_src_accts_end(shm_src_t *s) {
    size_t open = s->naccts;
    shm_acct_t *a, *tmp;
    HASH_ITER(hh, s->accts, a, tmp) acct_end(s, a);
    if (open > 0)
        OTE_DEBUG("shm", "requester %s gone: %zu request(s) it left open released", s->from, open);
}

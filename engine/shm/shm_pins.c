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
 * refused OTE_ERR_CANCELED, pieces being copied stop at their next chunk. The account
 * itself is engine/src_account.h's, shared with tcp and rdma. Design: shm_internal.h.
 */
#include <stdint.h>

#include "base/log.h"
#include "engine/shm/shm_internal.h"
#include "engine/src_account.h"
#include "ote/ote.h"

/* An account that ended (unlinked): its pin released (no lock is held here). */
static void acct_end(void *arg, ote__acct_t *a) {
    shm_src_t *s = arg;
    if (a->pin != NULL) s->tp->host.unpin(s->tp->host.arg, a->pin);
    ote__acct_free(a);
}

/* Bytes seen (not to be served) and bytes done (served); ends the account once nothing
 * is left to come and nothing is held. */
static void acct_take(shm_src_t *s, ote__acct_t *a, uint64_t seen, uint64_t done) {
    ote__acct_t *end = ote__acct_settle(&s->accts, a, seen, done);
    if (end != NULL) acct_end(s, end);
}

/* The account of uid, created (unopened, nothing seen) when absent; NULL when out of
 * memory or at the cap. Every entry names its request's extent, so the account knows it
 * from its creation (a write-off may come first) and every later entry must name it. */
static ote__acct_t *acct_get(shm_src_t *s, uint64_t uid, uint64_t req_remote, uint64_t req_len) {
    int created = 0;
    ote__acct_t *a =
        ote__acct_get(&s->accts, 0, uid, req_len, s->accts.n < SHM_SRC_MAX_REQS, &created);
    if (created) a->req_addr = req_remote;
    return a;
}

ote_status_t ote__shm_src_pin(shm_src_t *s, const shm_req_t *q, uint64_t start, uint64_t len,
                              unsigned perm, void **pin_out) {
    const ote__host_t *host = &s->tp->host;
    perm |= OTE__PIN_FILE; /* this source serves file registrations (through host->file) */
    /* A request of one piece needs no account: its pin is held while it is copied, and a
     * write-off of it (the whole request) opens none. */
    if (q->req_uid == 0 || q->req_len == 0 || (q->remote == q->req_remote && q->len == q->req_len))
        return ote__acct_pin_alone(host->pin, host->arg, start, len, perm, pin_out);
    ote__acct_t *a = acct_get(s, q->req_uid, q->req_remote, q->req_len);
    if (a == NULL) {
        OTE_WARN_LIMITED("shm",
                         "no account for a request of %s (out of memory or %u open): its "
                         "pieces pin alone",
                         s->from, SHM_SRC_MAX_REQS);
        return ote__acct_pin_alone(host->pin, host->arg, start, len, perm, pin_out);
    }
    int first = 0;
    if (ote__acct_admit(a, q->req_remote, q->req_len, q->op, q->len, &first) != OTE_OK)
        return OTE_ERR_INVALID; /* not the request its first piece named: refused alone */
    if (first) {
        void *pin = NULL;
        ote_status_t pst = host->pin(host->arg, start, len, perm, &pin);
        ote__acct_open(a, pst, pin);
    }
    ote_status_t st = ote__acct_hold(a, q->len);
    if (st != OTE_OK) {
        acct_take(s, a, q->len, 0);
        return st;
    }
    *pin_out = a;
    return OTE_OK;
}

void *ote__shm_src_engine_pin(shm_src_t *s, void *pin) {
    (void)s;
    return ote__acct_engine_pin(pin);
}

void ote__shm_src_unpin(shm_src_t *s, void *pin, uint32_t len) {
    if (ote__acct_is_alone(pin)) {
        s->tp->host.unpin(s->tp->host.arg, ote__acct_alone_pin(pin));
        return;
    }
    acct_take(s, pin, 0, len);
}

/* The open account a write-off or cancel entry names (the same request: id, extent). */
static ote__acct_t *acct_named(shm_src_t *s, const shm_req_t *q) {
    ote__acct_t *a = ote__acct_find(&s->accts, 0, q->req_uid);
    return a != NULL && a->req_len == q->req_len && a->req_addr == q->req_remote ? a : NULL;
}

void ote__shm_src_write_off(shm_src_t *s, const shm_req_t *q) {
    if (q->req_uid == 0 || q->req_len == 0) return;
    ote__acct_t *a = ote__acct_find(&s->accts, 0, q->req_uid);
    if (a == NULL && q->local >= q->req_len) return; /* the whole request: nothing to open */
    if (a == NULL) a = acct_get(s, q->req_uid, q->req_remote, q->req_len);
    else a = acct_named(s, q);
    if (a != NULL) acct_take(s, a, q->local, 0);
}

void ote__shm_src_cancel(shm_src_t *s, const shm_req_t *q) {
    if (q->req_uid == 0 || q->req_len == 0) return;
    /* Only the open request its pieces named; a request not open here has nothing left
     * to stop (all of it served, or none of it arrived: its pieces are written off). */
    ote__acct_t *a = acct_named(s, q);
    if (a != NULL) ote__acct_cancel(a);
}

int ote__shm_src_canceled(const void *pin) {
    if (pin == NULL || ote__acct_is_alone(pin)) return 0;
    return ote__acct_canceled(pin);
}

void ote__shm_src_accts_end(shm_src_t *s) {
    size_t open = ote__acct_end_scope(&s->accts, 0, 1, 1, acct_end, s);
    if (open > 0)
        OTE_DEBUG("shm", "requester %s gone: %zu request(s) it left open released", s->from, open);
}

/*
 * engine/rdma/rdma_accounts.c - the source's account of each request of a requester:
 * one check and one pin per request.
 *
 * Every GRANT_REQ names its request (id, extent). The first grant of a request to arrive
 * on a control connection checks the whole extent against the engine's registrations
 * (host->pin) and pins it once; a refusal is kept and given to every grant of the
 * request. Each served grant holds its bytes of the account from its pin to its release
 * (receipt, deadline, or the requester's loss); the bytes of grants never asked for come
 * back by WRITE_OFF. The pin is released when every byte of the request is accounted
 * for, or when the control connection ends (the requester is gone). So an unregister of
 * the range is BUSY from a request's first grant to its last, not only while a grant is
 * bound.
 *
 * Accounts live in tp->accts under tp->mu (nothing else is locked under it); the
 * engine's pin and unpin are called with no lock held (the engine calls this transport's
 * registration hook under its registry lock, which takes tp->mu). An account holds a
 * reference on its connection. Server threads create and pin accounts (a request's
 * grants all come on one connection, handled by its one thread); any thread settles.
 */
#include <stdint.h>
#include <string.h>

#include "base/alloc.h"
#include "base/hash.h"
#include "base/log.h"
#include "engine/rdma/rdma_internal.h"
#include "engine/rdma/rdma_src_parents.h"
#include "ote/ote.h"

/* Accounts one connection may hold open at once; past it, grants are refused AGAIN. */
#define RDMA_MAX_ACCOUNTS 65536u

struct acct {
    struct {
        uintptr_t conn;
        uint64_t uid;
    } key;
    UT_hash_handle hh;
    conn_t *c;
    int pinned_once; /* the first grant checked the extent (st says how it went) */
    ote_status_t st; /* OTE_OK, or the refusal every grant of the request gets */
    void *pin;       /* the engine's pin of the extent */
    int staged;      /* device memory, served through bounce buffers (rdma_stage.c) */
    uint32_t op;
    uint64_t req_addr, req_len;
    uint64_t left; /* bytes not yet asked for (by a grant) nor written off */
    uint64_t held; /* bytes of grants being served */
    int direct;    /* device memory served by exact MRs on direct slots (rdma_direct.c) */
};

int ote__rdma_acct_direct(rdma_tp_t *tp, const acct_t *a) {
    ote_mutex_lock(&tp->mu);
    int d = a->direct;
    ote_mutex_unlock(&tp->mu);
    return d;
}

static size_t conn_accounts(rdma_tp_t *tp, const conn_t *c) {
    size_t n = 0;
    acct_t *a, *tmp;
    HASH_ITER(hh, tp->accts, a, tmp) n += a->c == c;
    return n;
}

/* The account of (c, uid), created when absent. NULL: out of memory or at the cap.
 * tp->mu held. */
static acct_t *acct_get_locked(conn_t *c, uint64_t uid, uint64_t req_len) {
    rdma_tp_t *tp = c->tp;
    struct {
        uintptr_t conn;
        uint64_t uid;
    } key;
    memset(&key, 0, sizeof(key));
    key.conn = (uintptr_t)c;
    key.uid = uid;
    acct_t *a = NULL;
    HASH_FIND(hh, tp->accts, &key, sizeof(key), a);
    if (a != NULL) return a;
    if (HASH_COUNT(tp->accts) >= RDMA_MAX_ACCOUNTS && conn_accounts(tp, c) >= RDMA_MAX_ACCOUNTS)
        return NULL;
    if ((a = ote_calloc(1, sizeof(*a))) == NULL) return NULL;
    a->key.conn = key.conn;
    a->key.uid = uid;
    a->req_len = req_len;
    a->left = req_len;
    ote_status_t st;
    OTE_HASH_ADD(hh, tp->accts, key, sizeof(a->key), a, st);
    if (st != OTE_OK) {
        ote_free(a);
        return NULL;
    }
    a->c = c;
    ote__rdma_conn_get(c);
    return a;
}

/* Nothing left to come and nothing held: unlink a; the caller releases it with
 * acct_free once no lock is held. tp->mu held. */
static acct_t *acct_done_locked(rdma_tp_t *tp, acct_t *a) {
    if (a->left != 0 || a->held != 0) return NULL;
    HASH_DEL(tp->accts, a);
    return a;
}

static void acct_free(rdma_tp_t *tp, acct_t *a) {
    if (a == NULL) return;
    if (a->pin != NULL) tp->host.unpin(tp->host.arg, a->pin);
    /* Its every byte is accounted for: its parents' reservations end too. */
    ote__rdma_sp_end_req(tp, a->c, a->key.uid);
    ote__rdma_conn_put(a->c);
    ote_free(a);
}

ote_status_t ote__rdma_acct_take(conn_t *c, const ote_rp_msg_t *rq, acct_t **a_out) {
    rdma_tp_t *tp = c->tp;
    uint64_t uid = rq->u.grant.req_uid, len = rq->u.grant.len;
    ote_mutex_lock(&tp->mu);
    acct_t *a = uid != 0 ? acct_get_locked(c, uid, rq->u.grant.req_len) : NULL;
    ote_status_t st = OTE_OK;
    if (a == NULL) {
        st = OTE_ERR_AGAIN; /* no id, no memory, or too many requests open */
    } else if (a->req_len != rq->u.grant.req_len ||
               (a->pinned_once &&
                (a->req_addr != rq->u.grant.req_addr || a->op != rq->u.grant.op)) ||
               len > a->left) {
        a = NULL;
        st = OTE_ERR_INVALID; /* not the request its first grant named: refused alone */
    }
    int first = a != NULL && !a->pinned_once;
    if (first) {
        a->pinned_once = 1; /* this (server) thread alone pins it, just below */
        a->op = rq->u.grant.op;
        a->req_addr = rq->u.grant.req_addr;
    }
    ote_mutex_unlock(&tp->mu);
    if (first) {
        unsigned perm = a->op == OTE_GRANT_WRITE ? OTE_PERM_WRITE : OTE_PERM_READ;
        void *pin = NULL;
        int direct = 0;
        ote_status_t pst = tp->host.pin(tp->host.arg, a->req_addr, a->req_len, perm, &pin);
        int staged = 0;
        if (pst == OTE_OK && tp->host.pin_kind != NULL &&
            OTE_MEM_IS_CUDA(tp->host.pin_kind(tp->host.arg, pin)) &&
            (rq->u.grant.dflags & OTE_RP_GOP_DIRECT_OK) &&
            ote__rdma_direct_servable(tp, a->req_addr, a->req_len)) {
            /* GPUDirect source grants: exact MRs on direct slots (rdma_direct.c). */
            direct = 1;
        } else if (pst == OTE_OK && tp->host.pin_kind != NULL &&
                   OTE_MEM_IS_CUDA(tp->host.pin_kind(tp->host.arg, pin))) {
            /* Device memory that no GPUDirect source grant serves (no dma-buf of the range
             * here: gpu_paths without direct, or the driver could not export it; or a
             * requester that does not follow the redirect) is served through bounce
             * buffers when the requester takes staged answers (whether gpu_paths allows
             * staging is asked by each grant's stage_get, which names what is missing);
             * else refused, naming why. */
            if ((rq->u.grant.flags & OTE_RP_GF_STAGE) != 0) {
                staged = 1;
            } else {
                tp->host.unpin(tp->host.arg, pin);
                pin = NULL;
                pst = OTE_ERR_UNSUPPORTED;
                OTE_WARN_LIMITED("rdma",
                                 "refused %s request of %llu bytes at 0x%llx from %s: device "
                                 "memory over rdma needs GPUDirect RDMA source grants (a "
                                 "dma-buf of the range here, gpu_paths direct, and a requester "
                                 "that takes them) or source-side staging (a requester that "
                                 "takes staged answers); an older engine can reach it over tcp "
                                 "or shm",
                                 a->op == OTE_GRANT_WRITE ? "WRITE" : "READ",
                                 (unsigned long long)a->req_len, (unsigned long long)a->req_addr,
                                 c->peer_addr);
            }
        } else if (pst != OTE_OK)
            OTE_WARN_LIMITED("rdma", "refused %s request of %llu bytes at 0x%llx from %s: %s",
                             a->op == OTE_GRANT_WRITE ? "WRITE" : "READ",
                             (unsigned long long)a->req_len, (unsigned long long)a->req_addr,
                             c->peer_addr, ote_status_str(pst));
        ote_mutex_lock(&tp->mu);
        a->st = pst;
        a->pin = pst == OTE_OK ? pin : NULL;
        a->staged = pst == OTE_OK && staged;
        a->direct = direct;
        ote_mutex_unlock(&tp->mu);
    }
    if (a == NULL) return st;
    ote_mutex_lock(&tp->mu);
    st = a->st;
    int on_direct = (rq->u.grant.dflags & OTE_RP_GOP_DIRECT) != 0;
    /* Device memory only on a direct slot (else redirected there), and a direct slot
     * only for it: each grant alone, the request's account stays as it is. */
    if (st == OTE_OK && a->direct && !on_direct) st = OTE__RDMA_DIRECT_REDIRECT;
    if (st == OTE_OK && !a->direct && on_direct) st = OTE_ERR_INVALID;
    acct_t *done = NULL;
    if (st != OTE_OK) { /* refused: this grant's bytes are accounted for now */
        a->left -= len;
        done = acct_done_locked(tp, a);
    }
    ote_mutex_unlock(&tp->mu);
    acct_free(tp, done);
    if (st == OTE_OK) *a_out = a;
    return st;
}

void ote__rdma_acct_hold(rdma_tp_t *tp, acct_t *a, uint64_t len) {
    ote_mutex_lock(&tp->mu);
    a->left -= len < a->left ? len : a->left;
    a->held += len;
    ote_mutex_unlock(&tp->mu);
}

void ote__rdma_acct_settle(rdma_tp_t *tp, acct_t *a, uint64_t seen, uint64_t done) {
    ote_mutex_lock(&tp->mu);
    a->left -= seen < a->left ? seen : a->left;
    a->held -= done < a->held ? done : a->held;
    acct_t *end = acct_done_locked(tp, a);
    ote_mutex_unlock(&tp->mu);
    acct_free(tp, end);
}

void ote__rdma_acct_write_off(conn_t *c, const ote_rp_msg_t *rq) {
    rdma_tp_t *tp = c->tp;
    if (rq->u.wo.req_uid == 0 || rq->u.wo.req_len == 0) return;
    ote_mutex_lock(&tp->mu);
    acct_t *a = acct_get_locked(c, rq->u.wo.req_uid, rq->u.wo.req_len);
    acct_t *end = NULL;
    if (a != NULL && a->req_len == rq->u.wo.req_len) {
        a->left -= rq->u.wo.bytes < a->left ? rq->u.wo.bytes : a->left;
        end = acct_done_locked(tp, a);
    }
    ote_mutex_unlock(&tp->mu);
    acct_free(tp, end);
}

void ote__rdma_acct_end_conn(rdma_tp_t *tp, const conn_t *c) {
    for (;;) {
        acct_t *end = NULL, *a, *tmp;
        ote_mutex_lock(&tp->mu);
        HASH_ITER(hh, tp->accts, a, tmp) {
            if (c != NULL && a->c != c) continue;
            a->left = 0;                /* nothing more will come on this connection */
            if (c == NULL) a->held = 0; /* teardown: no grant is left */
            if ((end = acct_done_locked(tp, a)) != NULL) break;
        }
        ote_mutex_unlock(&tp->mu);
        if (end == NULL) return; /* the rest end with their last grant */
        acct_free(tp, end);
    }
}

void *ote__rdma_acct_staged(const acct_t *a) {
    /* Set by the request's first grant before any grant of it is served (the same server
     * thread), read-only after. */
    return a->staged ? a->pin : NULL;
}

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
 * The account itself is engine/src_account.h's, shared with tcp and shm; its scope is the
 * control connection. Accounts live in tp->accts under tp->mu (nothing else is locked under it); the
 * engine's pin and unpin are called with no lock held (the engine calls this transport's
 * registration hook under its registry lock, which takes tp->mu). An account holds a
 * reference on its connection. Server threads create and pin accounts (a request's
 * grants all come on one connection, handled by its one thread); any thread settles.
 */
#include <stdint.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "engine/rdma/rdma_internal.h"
#include "engine/rdma/rdma_src_parents.h"
#include "ote/ote.h"

/* Accounts one connection may hold open at once; past it, grants are refused AGAIN. */
#define RDMA_MAX_ACCOUNTS 65536u

/* How a request is served (its account's mode). */
enum { SERVE_WINDOW = 0, SERVE_STAGED = 1, SERVE_DIRECT = 2 };

static uint64_t scope_of(const conn_t *c) { return (uint64_t)(uintptr_t)c; }
static conn_t *conn_of(const acct_t *a) { return (conn_t *)(uintptr_t)a->key.scope; }

int ote__rdma_acct_direct(rdma_tp_t *tp, const acct_t *a) {
    ote_mutex_lock(&tp->mu);
    int d = a->mode == SERVE_DIRECT;
    ote_mutex_unlock(&tp->mu);
    return d;
}

static size_t conn_accounts(rdma_tp_t *tp, const conn_t *c) {
    size_t n = 0;
    acct_t *a, *tmp;
    HASH_ITER(hh, tp->accts.by_key, a, tmp) n += a->key.scope == scope_of(c);
    return n;
}

/* The account of (c, uid), created when absent (holding a reference on c). NULL: out of
 * memory or at the cap. tp->mu held. */
static acct_t *acct_get_locked(conn_t *c, uint64_t uid, uint64_t req_len) {
    rdma_tp_t *tp = c->tp;
    int may = !(tp->accts.n >= RDMA_MAX_ACCOUNTS && conn_accounts(tp, c) >= RDMA_MAX_ACCOUNTS);
    int created = 0;
    acct_t *a = ote__acct_get(&tp->accts, scope_of(c), uid, req_len, may, &created);
    if (created) ote__rdma_conn_get(c);
    return a;
}

/* Releases an account that ended (unlinked), with no lock held. */
static void acct_free(rdma_tp_t *tp, acct_t *a) {
    if (a == NULL) return;
    conn_t *c = conn_of(a);
    if (a->pin != NULL) tp->host.unpin(tp->host.arg, a->pin);
    /* Its every byte is accounted for: its parents' reservations end too. */
    ote__rdma_sp_end_req(tp, c, a->key.uid);
    ote__rdma_conn_put(c);
    ote__acct_free(a);
}

/* Host memory: by a window (rdma_grant_mode mw), or by exact MRs on direct slots (mr,
 * rdma_direct.c) for a requester that follows the redirect there; one that does not is
 * refused, naming why. */
static ote_status_t host_mode(conn_t *c, const ote_rp_msg_t *rq, const acct_t *a, int *mode_out) {
    if (c->tp->grant_mode != OTE__RDMA_GRANT_MR) return OTE_OK; /* SERVE_WINDOW */
    if (rq->u.grant.dflags & OTE_RP_GOP_DIRECT_OK) {
        *mode_out = SERVE_DIRECT;
        return OTE_OK;
    }
    OTE_WARN_LIMITED("rdma",
                     "refused %s request of %llu bytes at 0x%llx from %s: this source grants "
                     "host memory by exact MRs (rdma_grant_mode mr: %s), served only to a "
                     "requester that follows the redirect to a direct slot, and this one "
                     "does not (an older engine: reach it over tcp or shm)",
                     a->op == OTE_GRANT_WRITE ? "WRITE" : "READ", (unsigned long long)a->req_len,
                     (unsigned long long)a->req_addr, c->peer_addr,
                     c->tp->have_mw ? "rdma_grant_mode=mr" : "a device without type-2 windows");
    return OTE_ERR_UNSUPPORTED;
}

/* A file registration (docs/files.md, "Peers"): always through bounce buffers that the
 * file owner fills and writes (rdma_stage.c), so only for a requester that takes staged
 * answers, over a device with type-2 windows; otherwise refused, naming why. */
static ote_status_t file_mode(conn_t *c, const ote_rp_msg_t *rq, const acct_t *a, int *mode_out) {
    const char *why = NULL;
    if ((rq->u.grant.flags & OTE_RP_GF_STAGE) == 0)
        why = "a requester that takes staged answers (an older engine: reach it over tcp or shm)";
    else if (!c->tp->have_mw)
        why = "type-2 memory windows over the bounce buffers, which a data device here lacks";
    if (why == NULL) {
        *mode_out = SERVE_STAGED;
        return OTE_OK;
    }
    OTE_WARN_LIMITED("rdma",
                     "refused %s request of %llu bytes at 0x%llx from %s: a file registration "
                     "is served through bounce buffers, which needs %s",
                     a->op == OTE_GRANT_WRITE ? "WRITE" : "READ", (unsigned long long)a->req_len,
                     (unsigned long long)a->req_addr, c->peer_addr, why);
    return OTE_ERR_UNSUPPORTED;
}

/* The first grant's check of the request's extent (no lock held; the connection's one
 * server thread): the engine's pin (file registrations too: OTE__PIN_FILE, served staged
 * by file_mode), then how the request is served. Device memory goes
 * on direct slots (GPUDirect source grants) when the requester takes them and a dma-buf
 * of the range is here (and so does host memory granted by exact MRs: host_mode), else
 * through bounce buffers when the requester takes staged answers (whether gpu_paths
 * allows staging is asked by each grant's stage_get, which names what is missing); else
 * it is refused, naming why. */
static ote_status_t acct_check(conn_t *c, const ote_rp_msg_t *rq, acct_t *a, void **pin_out,
                               int *mode_out) {
    rdma_tp_t *tp = c->tp;
    unsigned perm = a->op == OTE_GRANT_WRITE ? OTE_PERM_WRITE : OTE_PERM_READ;
    void *pin = NULL;
    ote_status_t pst =
        tp->host.pin(tp->host.arg, a->req_addr, a->req_len, perm | OTE__PIN_FILE, &pin);
    const char *what = a->op == OTE_GRANT_WRITE ? "WRITE" : "READ";
    *mode_out = SERVE_WINDOW;
    if (pst != OTE_OK) {
        OTE_WARN_LIMITED("rdma", "refused %s request of %llu bytes at 0x%llx from %s: %s", what,
                         (unsigned long long)a->req_len, (unsigned long long)a->req_addr,
                         c->peer_addr, ote_status_str(pst));
        return pst;
    }
    if (!OTE_MEM_IS_CUDA(ote__pin_kind(pin))) {
        ote_status_t hst = ote__pin_kind(pin) == OTE_MEM_FILE ? file_mode(c, rq, a, mode_out)
                                                              : host_mode(c, rq, a, mode_out);
        if (hst != OTE_OK) {
            tp->host.unpin(tp->host.arg, pin);
            return hst;
        }
        *pin_out = pin;
        return OTE_OK;
    }
    if ((rq->u.grant.dflags & OTE_RP_GOP_DIRECT_OK) &&
        ote__rdma_direct_servable(tp, a->req_addr, a->req_len)) {
        *mode_out = SERVE_DIRECT; /* exact MRs on direct slots (rdma_direct.c) */
    } else if ((rq->u.grant.flags & OTE_RP_GF_STAGE) != 0 && !tp->have_mw) {
        tp->host.unpin(tp->host.arg, pin);
        OTE_WARN_LIMITED("rdma",
                         "refused %s request of %llu bytes at 0x%llx from %s: device memory "
                         "without a dma-buf is served staged, through a window over a bounce "
                         "buffer, and a data device here has no type-2 memory windows "
                         "(gpu_paths direct serves it by exact MRs)",
                         what, (unsigned long long)a->req_len, (unsigned long long)a->req_addr,
                         c->peer_addr);
        return OTE_ERR_UNSUPPORTED;
    } else if ((rq->u.grant.flags & OTE_RP_GF_STAGE) != 0) {
        *mode_out = SERVE_STAGED;
    } else {
        tp->host.unpin(tp->host.arg, pin);
        OTE_WARN_LIMITED("rdma",
                         "refused %s request of %llu bytes at 0x%llx from %s: device "
                         "memory over rdma needs GPUDirect RDMA source grants (a "
                         "dma-buf of the range here, gpu_paths direct, and a requester "
                         "that takes them) or source-side staging (a requester that "
                         "takes staged answers); an older engine can reach it over tcp "
                         "or shm",
                         what, (unsigned long long)a->req_len, (unsigned long long)a->req_addr,
                         c->peer_addr);
        return OTE_ERR_UNSUPPORTED;
    }
    *pin_out = pin;
    return OTE_OK;
}

ote_status_t ote__rdma_acct_take(conn_t *c, const ote_rp_msg_t *rq, acct_t **a_out) {
    rdma_tp_t *tp = c->tp;
    uint64_t uid = rq->u.grant.req_uid, len = rq->u.grant.len;
    int first = 0;
    ote_mutex_lock(&tp->mu);
    acct_t *a = uid != 0 ? acct_get_locked(c, uid, rq->u.grant.req_len) : NULL;
    ote_status_t st = OTE_OK;
    if (a == NULL) {
        st = OTE_ERR_AGAIN; /* no id, no memory, or too many requests open */
    } else if (ote__acct_admit(a, rq->u.grant.req_addr, rq->u.grant.req_len, rq->u.grant.op, len,
                               &first) != OTE_OK) {
        a = NULL;
        st = OTE_ERR_INVALID; /* not the request its first grant named: refused alone */
    }
    ote_mutex_unlock(&tp->mu);
    if (first) { /* this (server) thread alone checks and pins it */
        void *pin = NULL;
        int mode = SERVE_WINDOW;
        ote_status_t pst = acct_check(c, rq, a, &pin, &mode);
        ote_mutex_lock(&tp->mu);
        ote__acct_open(a, pst, pin);
        a->mode = pst == OTE_OK ? mode : SERVE_WINDOW;
        ote_mutex_unlock(&tp->mu);
    }
    if (a == NULL) return st;
    ote_mutex_lock(&tp->mu);
    st = a->st;
    int on_direct = (rq->u.grant.dflags & OTE_RP_GOP_DIRECT) != 0;
    /* Exact-MR memory (device memory with a dma-buf, host memory under rdma_grant_mode mr)
     * only on a direct slot (else redirected there), and a direct slot only for it: each
     * grant alone, the request's account stays as it is. */
    if (st == OTE_OK && a->mode == SERVE_DIRECT && !on_direct) st = OTE__RDMA_DIRECT_REDIRECT;
    /* Memory served on plain slots (staged device memory, or host memory by a window)
     * asked on a direct slot first by a requester that follows redirects (it saw
     * rdma_grant_mr=1, or its request starts where device memory was redirected before:
     * rdma_direct.c): the same redirect sends it back to a plain slot. A requester that
     * does not follow them is refused there. */
    if (st == OTE_OK && a->mode != SERVE_DIRECT && on_direct &&
        (rq->u.grant.dflags & OTE_RP_GOP_DIRECT_OK))
        st = OTE__RDMA_DIRECT_REDIRECT;
    if (st == OTE_OK && a->mode != SERVE_DIRECT && on_direct) st = OTE_ERR_INVALID;
    /* Refused: this grant's bytes are accounted for now. */
    acct_t *done = st != OTE_OK ? ote__acct_settle(&tp->accts, a, len, 0) : NULL;
    ote_mutex_unlock(&tp->mu);
    acct_free(tp, done);
    if (st == OTE_OK) *a_out = a;
    return st;
}

void ote__rdma_acct_hold(rdma_tp_t *tp, acct_t *a, uint64_t len) {
    ote_mutex_lock(&tp->mu);
    (void)ote__acct_hold(a, len); /* served: its answer is OK */
    ote_mutex_unlock(&tp->mu);
}

void ote__rdma_acct_settle(rdma_tp_t *tp, acct_t *a, uint64_t seen, uint64_t done) {
    ote_mutex_lock(&tp->mu);
    acct_t *end = ote__acct_settle(&tp->accts, a, seen, done);
    ote_mutex_unlock(&tp->mu);
    acct_free(tp, end);
}

void ote__rdma_acct_stage(rdma_tp_t *tp, acct_t *a, uint64_t len) {
    ote_mutex_lock(&tp->mu);
    ote__acct_stage(a, len);
    ote_mutex_unlock(&tp->mu);
}

void ote__rdma_acct_unstage(rdma_tp_t *tp, acct_t *a, uint64_t len) {
    ote_mutex_lock(&tp->mu);
    acct_t *end = ote__acct_unstage(&tp->accts, a, len);
    ote_mutex_unlock(&tp->mu);
    acct_free(tp, end);
}

void ote__rdma_acct_write_off(conn_t *c, const ote_rp_msg_t *rq) {
    rdma_tp_t *tp = c->tp;
    if (rq->u.wo.req_uid == 0 || rq->u.wo.req_len == 0) return;
    ote_mutex_lock(&tp->mu);
    acct_t *a = acct_get_locked(c, rq->u.wo.req_uid, rq->u.wo.req_len);
    acct_t *end = NULL;
    if (a != NULL && a->req_len == rq->u.wo.req_len)
        end = ote__acct_settle(&tp->accts, a, rq->u.wo.bytes, 0);
    ote_mutex_unlock(&tp->mu);
    acct_free(tp, end);
}

static void collect(void *arg, acct_t *a) {
    acct_t **head = arg;
    a->link = *head;
    *head = a;
}

void ote__rdma_acct_end_conn(rdma_tp_t *tp, const conn_t *c) {
    acct_t *ended = NULL;
    ote_mutex_lock(&tp->mu);
    /* Nothing more will come on c (NULL, teardown: on any connection, and no grant is
     * left); the rest end with their last grant. */
    (void)ote__acct_end_scope(&tp->accts, scope_of(c), c == NULL, c == NULL, collect, &ended);
    ote_mutex_unlock(&tp->mu);
    while (ended != NULL) {
        acct_t *next = ended->link;
        acct_free(tp, ended);
        ended = next;
    }
}

void *ote__rdma_acct_staged(const acct_t *a) {
    /* Set by the request's first grant before any grant of it is served (the same server
     * thread), read-only after. */
    return a->mode == SERVE_STAGED ? a->pin : NULL;
}

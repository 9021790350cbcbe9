/*
 * engine/engine.c - the public engine: creation, registered memory, segments, batches
 * and notifications. Transports (engine/transport.h) move the bytes.
 *
 * Ownership: the engine owns its transport, registrations and the queue of received
 * notifications. A segment owns its transport peer; a batch owns its request slots.
 * Segments and batches hold the engine (destroy is BUSY while they exist); a request in
 * flight holds its segment (close is BUSY) and, when its local buffer lies in a
 * registration, that registration (unregister is BUSY).
 *
 * Hot path: ote_batch_submit() takes the batch mutex once to reserve slots, builds the
 * slices in the request slots (one embedded slice for requests up to slice_size, one
 * allocation per larger request) and hands one list per segment to the transport.
 * Completion is lock-free per slice and per request; only the request that ends the
 * batch takes the batch mutex to wake waiters and send attached notifications.
 * ote_batch_wait() first polls the pending count, yielding the CPU, for about as long as
 * the batch's previous wait took when that was short (at most BATCH_SPIN_MAX_NS), and
 * only then sleeps on the condition variable: small batches end without a waiter wakeup.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/lock.h"
#include "base/log.h"
#include "base/time.h"
#include "engine/control/ctl.h"
#include "engine/engine_internal.h"
#include "engine/transport.h"
#include "ote/ote.h"

typedef struct ote__reg {
    uint64_t start;
    uint64_t len;
    unsigned perms;
    _Atomic long inuse;
} ote__reg_t;

typedef struct ote__nin {
    struct ote__nin *next;
    size_t len;
    char from[OTE__ADDR_MAX];
    uint8_t data[];
} ote__nin_t;

/* An outgoing notification: either synchronous (ote_notify_send waits for its ack) or
 * attached to a batch (fire and forget). */
typedef struct ote__nout {
    ote__slice_t slice;
    struct ote__nout *next;
    ote_engine_t *e;
    ote_segment_t *seg;
    _Atomic int refs;
    int done;
    ote_status_t st;
    size_t len;
    uint8_t msg[];
} ote__nout_t;

struct ote_engine {
    ote__cfg_t cfg;
    ote__transport_t *tp;

    pthread_rwlock_t reg_lk;
    ote__reg_t **regs; /* sorted by start, non-overlapping */
    size_t nregs, capregs;
    _Atomic size_t nregs_hint;

    ote_mutex_t nmu; /* received notifications */
    ote_cond_t ncv;
    ote__nin_t *nhead, *ntail;
    size_t nqcount, nqbytes; /* queued: at most OTE_NOTIFY_QUEUE_MAX / _BYTES */
    int nqfull_logged;       /* one WARN per episode of a full queue */

    ote_mutex_t omu; /* completion of synchronous outgoing notifications */
    ote_cond_t ocv;

    _Atomic long nsegments;
    _Atomic long nbatches;
};

struct ote_segment {
    ote_engine_t *e;
    ote__tpeer_t *peer;
    _Atomic long pending; /* requests in flight */
    _Atomic long notes;   /* notifications attached to batches or in flight */
    char name[OTE__ADDR_MAX];
};

typedef struct ote__req {
    ote_batch_t *b;
    ote_segment_t *seg;
    ote_opcode_t op;
    uint8_t *local;
    uint64_t remote;
    size_t length;
    _Atomic int state;
    _Atomic ote_status_t error;
    _Atomic uint64_t bytes_done;
    _Atomic uint32_t left;
    _Atomic int canceled;
    ote__reg_t *local_pin;
    ote__slice_t one;
    ote__slice_t *many;
} ote__req_t;

struct ote_batch {
    ote_engine_t *e;
    size_t cap;
    ote__req_t *reqs;
    ote_mutex_t mu;
    ote_cond_t cv;
    _Atomic size_t nsub;
    _Atomic size_t pending;
    ote__nout_t *notes; /* attached, not yet decided */
    _Atomic uint64_t last_wait_ns; /* how long the last completed wait took (0: none yet) */
};

#define BATCH_SPIN_MAX_NS (500u * 1000u)

/* ---- registry --------------------------------------------------------------------- */

/* Index of the registration with the greatest start <= addr, or -1. reg_lk held. */
static long reg_find(const ote_engine_t *e, uint64_t addr) {
    long lo = 0, hi = (long)e->nregs - 1, best = -1;
    while (lo <= hi) {
        long mid = lo + (hi - lo) / 2;
        if (e->regs[mid]->start <= addr) {
            best = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return best;
}

static ote__reg_t *reg_covering(const ote_engine_t *e, uint64_t addr, uint64_t len) {
    long i = reg_find(e, addr);
    if (i < 0) return NULL;
    ote__reg_t *r = e->regs[i];
    uint64_t off = addr - r->start;
    if (off >= r->len || len > r->len - off) return NULL;
    return r;
}

static ote_status_t host_pin(void *arg, uint64_t addr, uint64_t len, unsigned perm, void **pin_out) {
    ote_engine_t *e = arg;
    ote_status_t st = OTE_ERR_ACCESS;
    pthread_rwlock_rdlock(&e->reg_lk);
    ote__reg_t *r = reg_covering(e, addr, len);
    if (r != NULL && (r->perms & perm) == perm) {
        atomic_fetch_add(&r->inuse, 1);
        *pin_out = r;
        st = OTE_OK;
    }
    pthread_rwlock_unlock(&e->reg_lk);
    return st;
}

static void host_unpin(void *arg, void *pin) {
    (void)arg;
    atomic_fetch_sub(&((ote__reg_t *)pin)->inuse, 1);
}

/* Queue a received notification. OTE_ERR_AGAIN when the queue is at its cap
 * (OTE_NOTIFY_QUEUE_MAX messages or OTE_NOTIFY_QUEUE_BYTES bytes) or out of memory: the
 * transport answers the sender with it, so the sender's ote_notify_send fails with AGAIN
 * instead of this engine growing without bound behind a receiver that does not keep up. */
static ote_status_t host_deliver(void *arg, const char *from, const void *msg, size_t len) {
    ote_engine_t *e = arg;
    if (len > OTE_NOTIFY_MAX) return OTE_ERR_TOO_BIG;
    ote_mutex_lock(&e->nmu);
    int full = e->nqcount >= OTE_NOTIFY_QUEUE_MAX || len > OTE_NOTIFY_QUEUE_BYTES - e->nqbytes;
    int log_full = full && !e->nqfull_logged;
    if (log_full) e->nqfull_logged = 1;
    size_t qc = e->nqcount, qb = e->nqbytes;
    ote_mutex_unlock(&e->nmu);
    if (full) {
        if (log_full)
            OTE_WARN("engine",
                     "notification queue full (%zu message(s), %zu bytes; caps %u, %u): refusing "
                     "notifications from %s and others with OTE_ERR_AGAIN until ote_notify_recv "
                     "drains it",
                     qc, qb, (unsigned)OTE_NOTIFY_QUEUE_MAX, (unsigned)OTE_NOTIFY_QUEUE_BYTES, from);
        return OTE_ERR_AGAIN;
    }
    ote__nin_t *n = ote_malloc(sizeof(*n) + len);
    if (n == NULL) {
        OTE_WARN("engine", "out of memory: refusing a %zu-byte notification from %s", len, from);
        return OTE_ERR_AGAIN;
    }
    n->next = NULL;
    n->len = len;
    snprintf(n->from, sizeof(n->from), "%s", from);
    if (len) memcpy(n->data, msg, len);
    ote_mutex_lock(&e->nmu);
    /* Re-checked: another worker may have queued one since. */
    if (e->nqcount >= OTE_NOTIFY_QUEUE_MAX || len > OTE_NOTIFY_QUEUE_BYTES - e->nqbytes) {
        ote_mutex_unlock(&e->nmu);
        ote_free(n);
        return OTE_ERR_AGAIN;
    }
    if (e->ntail) e->ntail->next = n;
    else e->nhead = n;
    e->ntail = n;
    e->nqcount++;
    e->nqbytes += len;
    ote_cond_broadcast(&e->ncv);
    ote_mutex_unlock(&e->nmu);
    return OTE_OK;
}

/* Unlink the head of the queue. e->nmu held, queue not empty. */
static ote__nin_t *nq_pop(ote_engine_t *e) {
    ote__nin_t *n = e->nhead;
    e->nhead = n->next;
    if (e->nhead == NULL) e->ntail = NULL;
    e->nqcount--;
    e->nqbytes -= n->len;
    e->nqfull_logged = 0;
    return n;
}

ote_status_t ote_memory_register(ote_engine_t *e, void *addr, size_t len, unsigned perms) {
    if (e == NULL || addr == NULL || len == 0 || perms == 0 ||
        (perms & ~(OTE_PERM_READ | OTE_PERM_WRITE)) != 0 || (uintptr_t)addr > UINT64_MAX - len)
        return OTE_ERR_INVALID;
    uint64_t start = (uintptr_t)addr;
    ote__reg_t *r = ote_calloc(1, sizeof(*r));
    if (r == NULL) return OTE_ERR_NOMEM;
    r->start = start;
    r->len = len;
    r->perms = perms;
    ote_status_t st = OTE_OK;
    pthread_rwlock_wrlock(&e->reg_lk);
    long i = reg_find(e, start);
    if (i >= 0 && start - e->regs[i]->start < e->regs[i]->len) st = OTE_ERR_EXISTS;
    if ((size_t)(i + 1) < e->nregs && e->regs[i + 1]->start < start + len) st = OTE_ERR_EXISTS;
    if (st == OTE_OK && e->nregs == e->capregs) {
        size_t ncap = e->capregs ? e->capregs * 2 : 16;
        ote__reg_t **nr = ote_realloc(e->regs, ncap * sizeof(*nr));
        if (nr == NULL) st = OTE_ERR_NOMEM;
        else {
            e->regs = nr;
            e->capregs = ncap;
        }
    }
    /* RDMA hook: the transport publishes its MRs before the range becomes visible; a
     * failure leaves nothing registered. NULL for transports that need none (tcp). */
    if (st == OTE_OK && e->tp->ops->mem_register != NULL)
        st = e->tp->ops->mem_register(e->tp, addr, len, perms);
    if (st == OTE_OK) {
        size_t at = (size_t)(i + 1);
        memmove(&e->regs[at + 1], &e->regs[at], (e->nregs - at) * sizeof(*e->regs));
        e->regs[at] = r;
        e->nregs++;
        atomic_store(&e->nregs_hint, e->nregs);
    }
    pthread_rwlock_unlock(&e->reg_lk);
    if (st != OTE_OK) {
        if (st == OTE_ERR_EXISTS)
            OTE_WARN("engine", "register [%p, +%zu) refused: overlaps an existing registration", addr, len);
        ote_free(r);
    }
    return st;
}

ote_status_t ote_memory_unregister(ote_engine_t *e, void *addr) {
    if (e == NULL || addr == NULL) return OTE_ERR_INVALID;
    uint64_t start = (uintptr_t)addr;
    ote_status_t st = OTE_OK;
    ote__reg_t *victim = NULL;
    pthread_rwlock_wrlock(&e->reg_lk);
    long i = reg_find(e, start);
    if (i < 0 || e->regs[i]->start != start) {
        st = OTE_ERR_NOT_FOUND;
    } else if (atomic_load(&e->regs[i]->inuse) > 0) {
        st = OTE_ERR_BUSY;
    } else if (e->tp->ops->mem_unregister != NULL &&
               (st = e->tp->ops->mem_unregister(e->tp, addr)) != OTE_OK) {
        /* RDMA hook: an MR that would not deregister keeps the registration (retained). */
    } else {
        victim = e->regs[i];
        memmove(&e->regs[i], &e->regs[i + 1], (e->nregs - (size_t)i - 1) * sizeof(*e->regs));
        e->nregs--;
        atomic_store(&e->nregs_hint, e->nregs);
    }
    pthread_rwlock_unlock(&e->reg_lk);
    ote_free(victim);
    return st;
}

/* ---- engine ------------------------------------------------------------------------ */

ote_status_t ote_engine_create(const ote_config_t *cfg, ote_engine_t **engine_out) {
    if (engine_out == NULL) return OTE_ERR_INVALID;
    ote__cfg_t rc;
    ote_status_t st = ote__config_resolve(cfg, &rc);
    if (st != OTE_OK) return st;
    if (rc.log_level[0]) ote_log_set_level((ote_log_level_t)ote_log_parse_level(rc.log_level));
    if (strcmp(rc.transport, "tcp") != 0 && strcmp(rc.transport, "rdma") != 0) {
        OTE_ERROR("engine",
                  "transport=%s requested, but this build has no %s transport yet; refusing to "
                  "create the engine (no fallback to tcp)",
                  rc.transport, rc.transport);
        return OTE_ERR_UNSUPPORTED;
    }
    ote_engine_t *e = ote_calloc(1, sizeof(*e));
    if (e == NULL) return OTE_ERR_NOMEM;
    e->cfg = rc;
    if (pthread_rwlock_init(&e->reg_lk, NULL) != 0) {
        st = OTE_ERR_NOMEM;
        goto err_free;
    }
    st = ote_mutex_init(&e->nmu);
    if (st != OTE_OK) goto err_rw;
    st = ote_cond_init(&e->ncv);
    if (st != OTE_OK) goto err_nmu;
    st = ote_mutex_init(&e->omu);
    if (st != OTE_OK) goto err_ncv;
    st = ote_cond_init(&e->ocv);
    if (st != OTE_OK) goto err_omu;
    ote__host_t host = {.arg = e, .pin = host_pin, .unpin = host_unpin, .deliver_notify = host_deliver};
    /* transport=rdma selects engine/rdma/ (no fallback: its creation fails, naming what is
     * missing, when no device is usable). */
    if (strcmp(rc.transport, "rdma") == 0) st = ote__rdma_create(&e->cfg, &host, &e->tp);
    else st = ote__tcp_create(&e->cfg, &host, &e->tp);
    if (st != OTE_OK) goto err_ocv;
    *engine_out = e;
    return OTE_OK;

err_ocv:
    ote_cond_destroy(&e->ocv);
err_omu:
    ote_mutex_destroy(&e->omu);
err_ncv:
    ote_cond_destroy(&e->ncv);
err_nmu:
    ote_mutex_destroy(&e->nmu);
err_rw:
    pthread_rwlock_destroy(&e->reg_lk);
err_free:
    ote_free(e);
    return st;
}

ote_status_t ote_engine_destroy(ote_engine_t *e) {
    if (e == NULL) return OTE_ERR_INVALID;
    long segs = atomic_load(&e->nsegments), batches = atomic_load(&e->nbatches);
    if (segs > 0 || batches > 0) {
        OTE_WARN("engine", "destroy refused: %ld segment(s) and %ld batch(es) still open", segs, batches);
        return OTE_ERR_BUSY;
    }
    e->tp->ops->destroy(e->tp);
    for (size_t i = 0; i < e->nregs; i++) ote_free(e->regs[i]);
    ote_free(e->regs);
    while (e->nhead) {
        ote__nin_t *n = e->nhead;
        e->nhead = n->next;
        ote_free(n);
    }
    ote_cond_destroy(&e->ocv);
    ote_mutex_destroy(&e->omu);
    ote_cond_destroy(&e->ncv);
    ote_mutex_destroy(&e->nmu);
    pthread_rwlock_destroy(&e->reg_lk);
    ote_free(e);
    return OTE_OK;
}

ote_status_t ote_engine_address(ote_engine_t *e, char *buf, size_t len) {
    if (e == NULL || buf == NULL || len == 0) return OTE_ERR_INVALID;
    return e->tp->ops->address(e->tp, buf, len);
}

/* ---- segments ----------------------------------------------------------------------- */

ote_status_t ote_segment_open(ote_engine_t *e, const char *peer, ote_segment_t **seg_out) {
    if (e == NULL || peer == NULL || seg_out == NULL) return OTE_ERR_INVALID;
    char host[256];
    uint16_t port;
    if (strlen(peer) >= OTE__ADDR_MAX || ote__addr_split(peer, host, sizeof(host), &port, NULL) != OTE_OK ||
        port == 0) {
        OTE_WARN("engine", "segment_open: \"%s\" is not \"host:port\" or \"[v6]:port\"", peer);
        return OTE_ERR_INVALID;
    }
    ote_segment_t *s = ote_calloc(1, sizeof(*s));
    if (s == NULL) return OTE_ERR_NOMEM;
    ote_status_t st = e->tp->ops->peer_open(e->tp, peer, &s->peer);
    if (st != OTE_OK) {
        ote_free(s);
        return st;
    }
    s->e = e;
    snprintf(s->name, sizeof(s->name), "%s", peer);
    atomic_fetch_add(&e->nsegments, 1);
    *seg_out = s;
    return OTE_OK;
}

ote_status_t ote_segment_close(ote_segment_t *s) {
    if (s == NULL) return OTE_ERR_INVALID;
    if (atomic_load(&s->pending) > 0) return OTE_ERR_BUSY;
    ote_engine_t *e = s->e;
    /* Notifications on their way (sent after their batch's data) are waited for: each
     * ends by its deadline. */
    if (atomic_load(&s->notes) > 0) {
        ote_deadline_t dl =
            ote_deadline_after((e->cfg.transfer_timeout_ms + 1000) * OTE_NSEC_PER_MSEC);
        ote_mutex_lock(&e->omu);
        while (atomic_load(&s->notes) > 0)
            if (ote_cond_wait(&e->ocv, &e->omu, dl) == OTE_ERR_TIMEOUT) break;
        ote_mutex_unlock(&e->omu);
        if (atomic_load(&s->notes) > 0) return OTE_ERR_BUSY;
    }
    ote_status_t st = e->tp->ops->peer_close(s->peer);
    if (st != OTE_OK) return st;
    atomic_fetch_sub(&e->nsegments, 1);
    ote_free(s);
    return OTE_OK;
}

/* ---- outgoing notifications ------------------------------------------------------- */

static void nout_put(ote__nout_t *n) {
    if (atomic_fetch_sub(&n->refs, 1) == 1) ote_free(n);
}

static void nout_done(ote__slice_t *sl, ote_status_t st) {
    ote__nout_t *n = sl->owner;
    ote_engine_t *e = n->e;
    if (st != OTE_OK)
        OTE_WARN("engine", "notification to %s not delivered: %s", n->seg->name, ote_status_str(st));
    atomic_fetch_sub(&n->seg->notes, 1); /* last use of seg */
    ote_mutex_lock(&e->omu);
    n->done = 1;
    n->st = st;
    ote_cond_broadcast(&e->ocv);
    ote_mutex_unlock(&e->omu);
    nout_put(n);
}

static ote_status_t nout_new(ote_engine_t *e, ote_segment_t *seg, const void *msg, size_t len,
                             int refs, ote__nout_t **out) {
    if (len > OTE_NOTIFY_MAX) return OTE_ERR_TOO_BIG;
    ote__nout_t *n = ote_calloc(1, sizeof(*n) + len);
    if (n == NULL) return OTE_ERR_NOMEM;
    n->e = e;
    n->seg = seg;
    atomic_store(&n->refs, refs);
    n->len = len;
    if (len) memcpy(n->msg, msg, len);
    n->slice.done = nout_done;
    n->slice.owner = n;
    n->slice.local = n->msg;
    n->slice.len = (uint32_t)len;
    n->slice.op = OTE__SLICE_NOTIFY;
    n->slice.deadline = ote_deadline_after(e->cfg.transfer_timeout_ms * OTE_NSEC_PER_MSEC);
    *out = n;
    return OTE_OK;
}

static void nout_send(ote__nout_t *n) {
    atomic_fetch_add(&n->seg->notes, 1);
    n->slice.deadline = ote_deadline_after(n->e->cfg.transfer_timeout_ms * OTE_NSEC_PER_MSEC);
    n->slice.next = NULL;
    n->seg->e->tp->ops->submit(n->seg->peer, &n->slice);
}

ote_status_t ote_notify_send(ote_engine_t *e, ote_segment_t *seg, const void *msg, size_t len) {
    if (e == NULL || seg == NULL || seg->e != e || (msg == NULL && len > 0)) return OTE_ERR_INVALID;
    if (len > OTE_NOTIFY_MAX) return OTE_ERR_TOO_BIG;
    ote_status_t st = e->tp->ops->peer_ensure(seg->peer);
    if (st != OTE_OK) return st;
    ote__nout_t *n;
    st = nout_new(e, seg, msg, len, 2, &n);
    if (st != OTE_OK) return st;
    nout_send(n);
    /* The transport fails the slice by its deadline; the grace covers the worker tick. */
    ote_deadline_t dl = n->slice.deadline + OTE_NSEC_PER_SEC;
    ote_mutex_lock(&e->omu);
    while (!n->done) {
        if (ote_cond_wait(&e->ocv, &e->omu, dl) == OTE_ERR_TIMEOUT && !n->done) break;
    }
    st = n->done ? n->st : OTE_ERR_TIMEOUT;
    ote_mutex_unlock(&e->omu);
    nout_put(n);
    return st;
}

ote_status_t ote_notify_recv(ote_engine_t *e, void *buf, size_t cap, size_t *len_out, char *from,
                             size_t from_len, uint64_t timeout_ns) {
    if (e == NULL || len_out == NULL || (buf == NULL && cap > 0)) return OTE_ERR_INVALID;
    ote_deadline_t dl = ote_deadline_after(timeout_ns);
    ote_mutex_lock(&e->nmu);
    while (e->nhead == NULL) {
        if (ote_cond_wait(&e->ncv, &e->nmu, dl) == OTE_ERR_TIMEOUT && e->nhead == NULL) {
            ote_mutex_unlock(&e->nmu);
            return OTE_ERR_TIMEOUT;
        }
    }
    ote__nin_t *n = e->nhead;
    if (n->len > cap || (from != NULL && strlen(n->from) >= from_len)) {
        ote_mutex_unlock(&e->nmu);
        return OTE_ERR_TOO_BIG;
    }
    (void)nq_pop(e);
    ote_mutex_unlock(&e->nmu);
    if (n->len) memcpy(buf, n->data, n->len);
    if (from != NULL) memcpy(from, n->from, strlen(n->from) + 1);
    *len_out = n->len;
    ote_free(n);
    return OTE_OK;
}

ote_status_t ote_notify_discard(ote_engine_t *e, size_t *len_out) {
    if (e == NULL) return OTE_ERR_INVALID;
    ote_mutex_lock(&e->nmu);
    if (e->nhead == NULL) {
        ote_mutex_unlock(&e->nmu);
        return OTE_ERR_NOT_FOUND;
    }
    ote__nin_t *n = nq_pop(e);
    ote_mutex_unlock(&e->nmu);
    OTE_DEBUG("engine", "discarded a %zu-byte notification from %s", n->len, n->from);
    if (len_out != NULL) *len_out = n->len;
    ote_free(n);
    return OTE_OK;
}

/* ---- batches -------------------------------------------------------------------------- */

ote_status_t ote_batch_create(ote_engine_t *e, size_t capacity, ote_batch_t **batch_out) {
    if (e == NULL || batch_out == NULL || capacity == 0 || capacity > (1u << 24)) return OTE_ERR_INVALID;
    ote_batch_t *b = ote_calloc(1, sizeof(*b));
    if (b == NULL) return OTE_ERR_NOMEM;
    b->reqs = ote_calloc(capacity, sizeof(*b->reqs));
    if (b->reqs == NULL) {
        ote_free(b);
        return OTE_ERR_NOMEM;
    }
    ote_status_t st = ote_mutex_init(&b->mu);
    if (st == OTE_OK) {
        st = ote_cond_init(&b->cv);
        if (st != OTE_OK) ote_mutex_destroy(&b->mu);
    }
    if (st != OTE_OK) {
        ote_free(b->reqs);
        ote_free(b);
        return st;
    }
    b->e = e;
    b->cap = capacity;
    atomic_fetch_add(&e->nbatches, 1);
    *batch_out = b;
    return OTE_OK;
}

/* Decide the batch's attached notifications once no request is pending. b->mu held.
 * Returns the list to send; frees the ones that will not be sent. */
static ote__nout_t *batch_decide_notes(ote_batch_t *b) {
    ote__nout_t *send = NULL;
    size_t nsub = atomic_load(&b->nsub);
    while (b->notes) {
        ote__nout_t *n = b->notes;
        b->notes = n->next;
        int ok = 1;
        for (size_t i = 0; i < nsub && ok; i++)
            if (b->reqs[i].seg == n->seg && atomic_load(&b->reqs[i].state) != OTE_TRANSFER_COMPLETED) ok = 0;
        if (ok) {
            n->next = send;
            send = n;
        } else {
            OTE_INFO("engine", "batch notification to %s dropped: a request to it did not complete",
                     n->seg->name);
            atomic_fetch_sub(&n->seg->notes, 1);
            nout_put(n);
        }
    }
    return send;
}

static void send_notes(ote__nout_t *list) {
    while (list) {
        ote__nout_t *n = list;
        list = n->next;
        n->next = NULL;
        /* The batch's hold on seg->notes is handed to the in-flight notification. */
        n->slice.deadline = ote_deadline_after(n->e->cfg.transfer_timeout_ms * OTE_NSEC_PER_MSEC);
        n->seg->e->tp->ops->submit(n->seg->peer, &n->slice);
    }
}

/* One request of b ended. The last one takes the mutex so that a thread that sees
 * pending == 0 under it knows every completer is done with the batch. */
static void batch_end_one(ote_batch_t *b) {
    size_t old = atomic_load(&b->pending);
    while (old > 1)
        if (atomic_compare_exchange_weak(&b->pending, &old, old - 1)) return;
    ote_mutex_lock(&b->mu);
    ote__nout_t *send = NULL;
    if (atomic_fetch_sub(&b->pending, 1) == 1) {
        send = batch_decide_notes(b);
        ote_cond_broadcast(&b->cv);
    }
    ote_mutex_unlock(&b->mu);
    send_notes(send);
}

static void req_finalize(ote__req_t *r) {
    ote_status_t err = atomic_load(&r->error);
    int state;
    switch (ote_status_code(err)) {
        case OTE_OK: state = OTE_TRANSFER_COMPLETED; break;
        case OTE_ERR_CANCELED: state = OTE_TRANSFER_CANCELED; break;
        case OTE_ERR_TIMEOUT: state = OTE_TRANSFER_TIMEOUT; break;
        default: state = OTE_TRANSFER_FAILED; break;
    }
    if (r->local_pin) host_unpin(NULL, r->local_pin);
    r->local_pin = NULL;
    ote_free(r->many);
    r->many = NULL;
    ote_segment_t *seg = r->seg;
    ote_batch_t *b = r->b;
    atomic_store(&r->state, state);
    if (seg) atomic_fetch_sub(&seg->pending, 1);
    batch_end_one(b);
}

static void req_slice_done(ote__slice_t *s, ote_status_t st) {
    ote__req_t *r = s->owner;
    if (st == OTE_OK) {
        atomic_fetch_add_explicit(&r->bytes_done, s->len, memory_order_relaxed);
    } else {
        ote_status_t zero = OTE_OK;
        atomic_compare_exchange_strong(&r->error, &zero, st);
    }
    if (atomic_fetch_sub(&r->left, 1) == 1) req_finalize(r);
}

/* How one request is cut: ns slices of ssz bytes, the last one taking the rest. Computed
 * once per request and used for both the allocation and the slices themselves: the
 * peer's limit may change under us (a reconnect), and the two must agree. */
typedef struct {
    ote__slice_t *arr; /* ns > 1: the request's slice array */
    uint64_t ssz;
    uint32_t ns;
} req_plan_t;

/* The slice geometry of a `length`-byte request to seg. A slice is at most half the
 * peer's max_data, so the last one (ssz plus a folded tail shorter than ssz / 2) stays
 * under it. OTE_ERR_TOO_BIG when the request would need more than UINT32_MAX slices;
 * OTE_ERR_PROTOCOL when the transport reports a peer limit too small to slice by (the
 * handshake refuses such peers; this keeps the slice size from ever being 0). */
static ote_status_t req_plan(ote_segment_t *seg, uint64_t length, req_plan_t *out) {
    uint64_t ssz = seg->e->cfg.slice_size;
    uint64_t mx = (uint64_t)seg->e->tp->ops->peer_max_slice(seg->peer) / 2;
    if (mx < ssz) ssz = mx;
    if (ssz == 0) {
        OTE_ERROR("engine", "segment %s: the transport reports a slice limit of %llu bytes",
                  seg->name, (unsigned long long)mx * 2);
        return OTE_ERR_PROTOCOL;
    }
    uint64_t n = 1;
    if (length > ssz) {
        n = length / ssz;
        uint64_t tail = length % ssz;
        if (tail != 0 && tail >= ssz / 2) n++; /* a short tail is folded into the last slice */
    }
    if (n > UINT32_MAX) return OTE_ERR_TOO_BIG;
    out->arr = NULL;
    out->ssz = ssz;
    out->ns = (uint32_t)n;
    return OTE_OK;
}

ote_status_t ote_batch_submit(ote_batch_t *b, const ote_request_t *reqs, size_t n) {
    if (b == NULL || (reqs == NULL && n > 0)) return OTE_ERR_INVALID;
    if (n == 0) return OTE_OK;
    ote_engine_t *e = b->e;
    for (size_t i = 0; i < n; i++) {
        const ote_request_t *q = &reqs[i];
        if ((q->opcode != OTE_READ && q->opcode != OTE_WRITE) || q->segment == NULL ||
            q->segment->e != e || (q->local_addr == NULL && q->length > 0) ||
            (q->length > 0 && (q->remote_addr > UINT64_MAX - q->length ||
                               (uintptr_t)q->local_addr > UINTPTR_MAX - q->length)))
            return OTE_ERR_INVALID;
    }
    if (n > b->cap - atomic_load(&b->nsub)) return OTE_ERR_TOO_BIG;
    /* Reconnect lost peers before anything is reserved. */
    ote_segment_t *last = NULL;
    for (size_t i = 0; i < n; i++) {
        if (reqs[i].segment == last) continue;
        last = reqs[i].segment;
        ote_status_t st = e->tp->ops->peer_ensure(last->peer);
        if (st != OTE_OK) return st;
    }
    /* Each request's geometry (once) and the slice arrays of multi-slice requests, all
     * before anything starts. */
    req_plan_t stack_plans[64];
    req_plan_t *plans = n <= 64 ? stack_plans : ote_calloc(n, sizeof(*plans));
    if (plans == NULL) return OTE_ERR_NOMEM;
    ote_status_t st = OTE_OK;
    for (size_t i = 0; i < n; i++) {
        plans[i] = (req_plan_t){NULL, 0, 1};
        if (reqs[i].length == 0 || st != OTE_OK) continue;
        st = req_plan(reqs[i].segment, reqs[i].length, &plans[i]);
        if (st == OTE_OK && plans[i].ns > 1) {
            /* ns <= UINT32_MAX: the product fits a 64-bit size_t. */
            plans[i].arr = ote_malloc((size_t)plans[i].ns * sizeof(ote__slice_t));
            if (plans[i].arr == NULL) st = OTE_ERR_NOMEM;
        }
    }
    size_t k = 0;
    if (st == OTE_OK) {
        ote_mutex_lock(&b->mu);
        k = atomic_load(&b->nsub);
        if (n > b->cap - k) {
            st = OTE_ERR_TOO_BIG;
        } else {
            for (size_t i = 0; i < n; i++) atomic_store(&b->reqs[k + i].state, OTE_TRANSFER_PENDING);
            atomic_fetch_add(&b->pending, n);
            atomic_store(&b->nsub, k + n);
        }
        ote_mutex_unlock(&b->mu);
    }
    if (st != OTE_OK) {
        for (size_t i = 0; i < n; i++) ote_free(plans[i].arr);
        if (plans != stack_plans) ote_free(plans);
        return st;
    }

    ote_deadline_t dl = ote_deadline_after(e->cfg.transfer_timeout_ms * OTE_NSEC_PER_MSEC);
    int use_pins = atomic_load_explicit(&e->nregs_hint, memory_order_relaxed) > 0;
    if (use_pins) pthread_rwlock_rdlock(&e->reg_lk);
    ote__slice_t *list = NULL, *tail = NULL;
    ote_segment_t *list_seg = NULL;
    for (size_t i = 0; i < n; i++) {
        const ote_request_t *q = &reqs[i];
        ote__req_t *r = &b->reqs[k + i];
        r->b = b;
        r->seg = q->segment;
        r->op = q->opcode;
        r->local = q->local_addr;
        r->remote = q->remote_addr;
        r->length = q->length;
        atomic_store(&r->error, OTE_OK);
        atomic_store(&r->bytes_done, 0);
        atomic_store(&r->canceled, 0);
        r->local_pin = NULL;
        r->many = plans[i].arr;
        atomic_fetch_add(&q->segment->pending, 1);
        if (use_pins && q->length > 0) {
            ote__reg_t *lr = reg_covering(e, (uintptr_t)q->local_addr, q->length);
            if (lr) {
                atomic_fetch_add(&lr->inuse, 1);
                r->local_pin = lr;
            }
        }
        if (q->length == 0) {
            atomic_store(&r->left, 1);
            continue; /* completed below, after the lock */
        }
        uint64_t ssz = plans[i].ssz;
        uint32_t ns = plans[i].ns;
        atomic_store(&r->left, ns);
        ote__slice_t *sl = ns > 1 ? r->many : &r->one;
        if (list_seg != q->segment && list != NULL) {
            e->tp->ops->submit(list_seg->peer, list);
            list = tail = NULL;
        }
        list_seg = q->segment;
        uint64_t off = 0;
        for (uint32_t j = 0; j < ns; j++) {
            ote__slice_t *s = &sl[j];
            uint64_t len = j + 1 == ns ? q->length - off : ssz;
            s->next = NULL;
            s->done = req_slice_done;
            s->owner = r;
            s->canceled = &r->canceled;
            s->local = (uint8_t *)q->local_addr + off;
            s->remote = q->remote_addr + off;
            s->len = (uint32_t)len;
            s->op = q->opcode == OTE_WRITE ? OTE__SLICE_WRITE : OTE__SLICE_READ;
            s->deadline = dl;
            off += len;
            if (tail) tail->next = s;
            else list = s;
            tail = s;
        }
    }
    if (use_pins) pthread_rwlock_unlock(&e->reg_lk);
    if (list != NULL) e->tp->ops->submit(list_seg->peer, list);
    for (size_t i = 0; i < n; i++)
        if (reqs[i].length == 0) req_finalize(&b->reqs[k + i]);
    if (plans != stack_plans) ote_free(plans);
    return OTE_OK;
}

ote_status_t ote_batch_status(ote_batch_t *b, size_t index, ote_transfer_status_t *status_out) {
    if (b == NULL || status_out == NULL || index >= b->cap) return OTE_ERR_INVALID;
    ote_transfer_status_t s = {OTE_TRANSFER_WAITING, 0, OTE_OK};
    if (index < atomic_load(&b->nsub)) {
        ote__req_t *r = &b->reqs[index];
        s.state = (ote_transfer_state_t)atomic_load(&r->state);
        s.bytes_done = atomic_load_explicit(&r->bytes_done, memory_order_relaxed);
        if (s.state != OTE_TRANSFER_PENDING && s.state != OTE_TRANSFER_WAITING) s.error = atomic_load(&r->error);
    }
    *status_out = s;
    return OTE_OK;
}

static ote_status_t state_error(const ote__req_t *r) {
    ote_status_t err = atomic_load(&r->error);
    return err != OTE_OK ? err : OTE_ERR_STATE;
}

/* Before sleeping, a wait whose batch is likely to end soon (its previous wait took at
 * most BATCH_SPIN_MAX_NS) polls the pending count for about that long (1.5x, at most
 * BATCH_SPIN_MAX_NS, never past the deadline), yielding the CPU between looks: a small
 * batch's completion then costs no sleep and wakeup of the waiter. */
static void batch_spin(ote_batch_t *b, uint64_t now, ote_deadline_t dl) {
    uint64_t hint = atomic_load_explicit(&b->last_wait_ns, memory_order_relaxed);
    if (hint == 0 || hint > BATCH_SPIN_MAX_NS) return;
    uint64_t span = hint + hint / 2;
    if (span > BATCH_SPIN_MAX_NS) span = BATCH_SPIN_MAX_NS;
    ote_deadline_t until = ote_deadline_min(now + span, dl);
    while (atomic_load(&b->pending) > 0 && ote_now_ns() < until) sched_yield();
}

ote_status_t ote_batch_wait(ote_batch_t *b, uint64_t timeout_ns) {
    if (b == NULL) return OTE_ERR_INVALID;
    ote_deadline_t dl = ote_deadline_after(timeout_ns);
    uint64_t t0 = 0;
    if (atomic_load(&b->pending) > 0) {
        t0 = ote_now_ns();
        batch_spin(b, t0, dl);
    }
    ote_mutex_lock(&b->mu);
    while (atomic_load(&b->pending) > 0) {
        if (ote_cond_wait(&b->cv, &b->mu, dl) == OTE_ERR_TIMEOUT && atomic_load(&b->pending) > 0) {
            ote_mutex_unlock(&b->mu);
            return OTE_ERR_TIMEOUT;
        }
    }
    if (t0 != 0) atomic_store_explicit(&b->last_wait_ns, ote_now_ns() - t0, memory_order_relaxed);
    ote_status_t st = OTE_OK;
    size_t nsub = atomic_load(&b->nsub);
    for (size_t i = 0; i < nsub; i++) {
        if (atomic_load(&b->reqs[i].state) != OTE_TRANSFER_COMPLETED) {
            st = state_error(&b->reqs[i]);
            break;
        }
    }
    ote_mutex_unlock(&b->mu);
    return st;
}

ote_status_t ote_batch_cancel(ote_batch_t *b) {
    if (b == NULL) return OTE_ERR_INVALID;
    ote_segment_t *segs[16];
    size_t nsegs = 0;
    int overflow = 0;
    ote_mutex_lock(&b->mu);
    size_t nsub = atomic_load(&b->nsub);
    for (size_t i = 0; i < nsub; i++) {
        ote__req_t *r = &b->reqs[i];
        if (atomic_load(&r->state) != OTE_TRANSFER_PENDING) continue;
        atomic_store(&r->canceled, 1);
        size_t j;
        for (j = 0; j < nsegs && segs[j] != r->seg; j++) {
        }
        if (j == nsegs) {
            if (nsegs < 16) segs[nsegs++] = r->seg;
            else overflow = 1;
        }
    }
    /* The transports drop queued slices now; slices on the wire finish first. With many
     * segments, the others see the flag when they next touch the queue. */
    for (size_t j = 0; j < nsegs; j++) b->e->tp->ops->cancel(segs[j]->peer);
    ote_mutex_unlock(&b->mu);
    if (overflow) OTE_DEBUG("engine", "cancel: more than 16 segments; others drop lazily");
    return OTE_OK;
}

ote_status_t ote_batch_reset(ote_batch_t *b) {
    if (b == NULL) return OTE_ERR_INVALID;
    ote_mutex_lock(&b->mu);
    if (atomic_load(&b->pending) > 0) {
        ote_mutex_unlock(&b->mu);
        return OTE_ERR_BUSY;
    }
    size_t nsub = atomic_load(&b->nsub);
    for (size_t i = 0; i < nsub; i++) {
        ote__req_t *r = &b->reqs[i];
        atomic_store(&r->state, OTE_TRANSFER_WAITING);
        atomic_store(&r->bytes_done, 0);
        atomic_store(&r->error, OTE_OK);
        r->seg = NULL;
    }
    atomic_store(&b->nsub, 0);
    ote_mutex_unlock(&b->mu);
    return OTE_OK;
}

ote_status_t ote_batch_destroy(ote_batch_t *b) {
    if (b == NULL) return OTE_ERR_INVALID;
    ote_mutex_lock(&b->mu);
    if (atomic_load(&b->pending) > 0) {
        ote_mutex_unlock(&b->mu);
        return OTE_ERR_BUSY;
    }
    ote__nout_t *notes = b->notes; /* attached to requests never submitted */
    b->notes = NULL;
    ote_mutex_unlock(&b->mu);
    while (notes) {
        ote__nout_t *n = notes;
        notes = n->next;
        atomic_fetch_sub(&n->seg->notes, 1);
        nout_put(n);
    }
    ote_engine_t *e = b->e;
    ote_cond_destroy(&b->cv);
    ote_mutex_destroy(&b->mu);
    ote_free(b->reqs);
    ote_free(b);
    atomic_fetch_sub(&e->nbatches, 1);
    return OTE_OK;
}

ote_status_t ote_batch_notify(ote_batch_t *b, ote_segment_t *seg, const void *msg, size_t len) {
    if (b == NULL || seg == NULL || seg->e != b->e || (msg == NULL && len > 0)) return OTE_ERR_INVALID;
    if (len > OTE_NOTIFY_MAX) return OTE_ERR_TOO_BIG;
    ote__nout_t *n;
    ote_status_t st = nout_new(b->e, seg, msg, len, 1, &n);
    if (st != OTE_OK) return st;
    atomic_fetch_add(&seg->notes, 1); /* held until sent and acknowledged, or dropped */
    ote__nout_t *send = NULL;
    ote_mutex_lock(&b->mu);
    n->next = b->notes;
    b->notes = n;
    /* Nothing submitted yet: decided when the coming submissions end. */
    if (atomic_load(&b->pending) == 0 && atomic_load(&b->nsub) > 0) send = batch_decide_notes(b);
    ote_mutex_unlock(&b->mu);
    if (send) {
        st = b->e->tp->ops->peer_ensure(seg->peer);
        if (st != OTE_OK) {
            /* Unsendable: the slice fails through the transport with PEER_LOST. */
            OTE_WARN("engine", "batch notification to %s: reconnect failed: %s", seg->name,
                     ote_status_str(st));
        }
        send_notes(send);
    }
    return OTE_OK;
}

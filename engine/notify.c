/*
 * engine/notify.c - notifications. Received ones wait in a bounded queue (nmu) until
 * ote_notify_recv takes them; a full queue refuses new ones with OTE_ERR_AGAIN, which the
 * transport returns to the sender. Outgoing ones are slices of their own: ote_notify_send
 * waits for the acknowledgement (omu), and those attached to a batch are sent once every
 * request of the batch to their segment has COMPLETED.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "base/thread.h"
#include "base/time.h"
#include "engine/core_internal.h"
#include "engine/notify_internal.h"

/* Queue a received notification. OTE_ERR_AGAIN when the queue is at its cap
 * (OTE_NOTIFY_QUEUE_MAX messages or OTE_NOTIFY_QUEUE_BYTES bytes) or out of memory: the
 * transport answers the sender with it, so the sender's ote_notify_send fails with AGAIN
 * instead of this engine growing without bound behind a receiver that does not keep up. */
ote_status_t ote__notify_deliver(void *arg, const char *from, const char *name, const void *msg,
                                 size_t len) {
    ote_engine_t *e = arg;
    if (len > OTE_NOTIFY_MAX) return OTE_ERR_TOO_BIG;
    ote_mutex_lock(&e->nmu);
    int full = e->nqcount >= OTE_NOTIFY_QUEUE_MAX || len > OTE_NOTIFY_QUEUE_BYTES - e->nqbytes;
    int log_full = full && !e->nqfull_logged;
    if (log_full) e->nqfull_logged = 1;
    size_t qc = e->nqcount, qb = e->nqbytes;
    ote_mutex_unlock(&e->nmu);
    if (full) {
        atomic_fetch_add_explicit(&e->notify_refused, 1, memory_order_relaxed);
        if (log_full)
            OTE_WARN("engine",
                     "notification queue full (%zu message(s), %zu bytes; caps %u, %u): refusing "
                     "notifications from %s and others with OTE_ERR_AGAIN until ote_notify_recv "
                     "drains it",
                     qc, qb, (unsigned)OTE_NOTIFY_QUEUE_MAX, (unsigned)OTE_NOTIFY_QUEUE_BYTES,
                     from);
        return OTE_ERR_AGAIN;
    }
    ote__nin_t *n = ote_malloc(sizeof(*n) + len);
    if (n == NULL) {
        atomic_fetch_add_explicit(&e->notify_refused, 1, memory_order_relaxed);
        OTE_WARN("engine", "out of memory: refusing a %zu-byte notification from %s", len, from);
        return OTE_ERR_AGAIN;
    }
    n->next = NULL;
    n->len = len;
    snprintf(n->from, sizeof(n->from), "%s", from);
    snprintf(n->name, sizeof(n->name), "%s", name != NULL ? name : "");
    if (len) memcpy(n->data, msg, len);
    ote_mutex_lock(&e->nmu);
    /* Re-checked: another worker may have queued one since. */
    if (e->nqcount >= OTE_NOTIFY_QUEUE_MAX || len > OTE_NOTIFY_QUEUE_BYTES - e->nqbytes) {
        ote_mutex_unlock(&e->nmu);
        ote_free(n);
        atomic_fetch_add_explicit(&e->notify_refused, 1, memory_order_relaxed);
        return OTE_ERR_AGAIN;
    }
    if (e->ntail) e->ntail->next = n;
    else e->nhead = n;
    e->ntail = n;
    e->nqcount++;
    e->nqbytes += len;
    atomic_fetch_add_explicit(&e->notify_received, 1, memory_order_relaxed);
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

void ote__nout_put(ote__nout_t *n) {
    if (atomic_fetch_sub(&n->refs, 1) == 1) ote_free(n);
}

#define NOTIFY_RETRY_FIRST_MS 1
#define NOTIFY_RETRY_MAX_MS 50
#define NOTIFY_RETRY_IDLE_MS 100

static void *retry_main(void *arg);

/* A batch's notification refused by a full receiver (AGAIN) before its deadline: queued
 * for the retry thread (started at the first), which sends it again after a backoff of
 * 1 ms doubling to 50 ms. Its hold on the segment and its references stay. Nonzero when
 * queued. */
static int nout_retry(ote__nout_t *n, ote_status_t st) {
    ote_engine_t *e = n->e;
    if (!n->batch || ote_status_code(st) != OTE_ERR_AGAIN || ote_deadline_expired(n->until))
        return 0;
    ote_mutex_lock(&e->omu);
    int ok = !e->nretry_stop;
    if (ok && !e->nretry_started) {
        ok = ote_thread_create(&e->nretry_th, NULL, retry_main, e) == 0;
        e->nretry_started = ok;
        if (!ok) OTE_WARN("engine", "notification retry thread: pthread_create failed");
    }
    if (ok) {
        n->backoff_ms = n->backoff_ms == 0                         ? NOTIFY_RETRY_FIRST_MS
                        : n->backoff_ms >= NOTIFY_RETRY_MAX_MS / 2 ? NOTIFY_RETRY_MAX_MS
                                                                   : n->backoff_ms * 2;
        n->retry_at = ote_now_ns() + (uint64_t)n->backoff_ms * OTE_NSEC_PER_MSEC;
        /* A send that could not be answered before the deadline would end TIMEOUT (it may
         * or may not have been queued there): the refusal (AGAIN, never queued) stands. */
        ok = n->retry_at + 2 * (uint64_t)n->backoff_ms * OTE_NSEC_PER_MSEC < n->until;
    }
    /* Said once per notification, before the retry thread may take it (and another
     * thread end it). */
    if (ok && n->backoff_ms == NOTIFY_RETRY_FIRST_MS)
        OTE_INFO("engine", "notification to %s: its queue is full; sent again until its deadline",
                 n->seg->name);
    if (ok) {
        n->rnext = e->nretry;
        e->nretry = n;
        ote_cond_broadcast(&e->ocv);
    }
    ote_mutex_unlock(&e->omu);
    return ok;
}

/* Send n's slice again (no lock held): its transport record cleared, its deadline the
 * first send's. */
static void nout_resend(ote__nout_t *n) {
    memset(n->slice.xp, 0, sizeof(n->slice.xp));
    n->slice.next = NULL;
    n->slice.deadline = n->until;
    n->seg->tp->ops->submit(n->seg->peer, &n->slice);
}

/* The retry thread: sends each queued notification when its backoff is over; at the
 * engine's destroy (nretry_stop) nothing is queued (every segment is closed, and a
 * segment's close waits for its notifications). */
static void *retry_main(void *arg) {
    ote_engine_t *e = arg;
    ote_log_set_thread_engine(e->log_tag); /* started by whichever thread's batch needed it */
    ote_mutex_lock(&e->omu);
    while (!e->nretry_stop) {
        uint64_t now = ote_now_ns(), next = now + NOTIFY_RETRY_IDLE_MS * OTE_NSEC_PER_MSEC;
        ote__nout_t *due = NULL;
        for (ote__nout_t **pp = &e->nretry; *pp != NULL;) {
            ote__nout_t *n = *pp;
            if (n->retry_at <= now) {
                *pp = n->rnext;
                n->rnext = due;
                due = n;
            } else {
                if (n->retry_at < next) next = n->retry_at;
                pp = &n->rnext;
            }
        }
        if (due == NULL) {
            (void)ote_cond_wait(&e->ocv, &e->omu, next);
            continue;
        }
        ote_mutex_unlock(&e->omu);
        while (due != NULL) {
            ote__nout_t *n = due;
            due = n->rnext;
            n->rnext = NULL;
            nout_resend(n);
        }
        ote_mutex_lock(&e->omu);
    }
    ote_mutex_unlock(&e->omu);
    return NULL;
}

void ote__notify_retry_stop(ote_engine_t *e) {
    ote_mutex_lock(&e->omu);
    e->nretry_stop = 1;
    ote_cond_broadcast(&e->ocv);
    int started = e->nretry_started;
    e->nretry_started = 0;
    ote_mutex_unlock(&e->omu);
    if (started) pthread_join(e->nretry_th, NULL);
}

static void nout_done(ote__slice_t *sl, ote_status_t st) {
    ote__nout_t *n = sl->owner;
    ote_engine_t *e = n->e;
    if (nout_retry(n, st)) return;
    if (st != OTE_OK)
        OTE_WARN("engine", "notification to %s not delivered: %s", n->seg->name,
                 ote_status_str(st));
    atomic_fetch_add_explicit(st == OTE_OK ? &n->seg->c.notify_sent : &n->seg->c.notify_failed, 1,
                              memory_order_relaxed);
    atomic_fetch_sub(&n->seg->notes, 1); /* last use of seg */
    ote_mutex_lock(&e->omu);
    n->done = 1;
    n->st = st;
    ote_cond_broadcast(&e->ocv);
    ote_mutex_unlock(&e->omu);
    ote__nout_put(n);
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
    n->slice.mem_loc = -1;
    n->slice.deadline = ote_deadline_after(e->cfg.transfer_timeout_ms * OTE_NSEC_PER_MSEC);
    n->until = n->slice.deadline;
    *out = n;
    return OTE_OK;
}

static void nout_send(ote__nout_t *n) {
    atomic_fetch_add(&n->seg->notes, 1);
    n->slice.deadline = ote_deadline_after(n->e->cfg.transfer_timeout_ms * OTE_NSEC_PER_MSEC);
    n->slice.next = NULL;
    n->seg->tp->ops->submit(n->seg->peer, &n->slice);
}

ote_status_t ote_notify_send(ote_engine_t *e, ote_segment_t *seg, const void *msg, size_t len) {
    if (e == NULL || seg == NULL || seg->e != e || (msg == NULL && len > 0)) return OTE_ERR_INVALID;
    if (OTE__ENGINE_GONE(e)) return OTE_ERR_STATE;
    if (len > OTE_NOTIFY_MAX) return OTE_ERR_TOO_BIG;
    ote_status_t st = ote__segment_ensure(seg);
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
    ote__nout_put(n);
    return st;
}

ote_status_t ote_notify_recv(ote_engine_t *e, void *buf, size_t cap, size_t *len_out, char *from,
                             size_t from_len, uint64_t timeout_ns) {
    return ote_notify_recv_ex(e, buf, cap, len_out, from, from_len, NULL, 0, timeout_ns);
}

ote_status_t ote_notify_recv_ex(ote_engine_t *e, void *buf, size_t cap, size_t *len_out, char *from,
                                size_t from_len, char *name, size_t name_len, uint64_t timeout_ns) {
    if (e == NULL || len_out == NULL || (buf == NULL && cap > 0)) return OTE_ERR_INVALID;
    if (OTE__ENGINE_GONE(e)) return OTE_ERR_STATE;
    ote_deadline_t dl = ote_deadline_after(timeout_ns);
    ote_mutex_lock(&e->nmu);
    while (e->nhead == NULL) {
        if (ote_cond_wait(&e->ncv, &e->nmu, dl) == OTE_ERR_TIMEOUT && e->nhead == NULL) {
            ote_mutex_unlock(&e->nmu);
            return OTE_ERR_TIMEOUT;
        }
    }
    ote__nin_t *n = e->nhead;
    if (n->len > cap || (from != NULL && strlen(n->from) >= from_len) ||
        (name != NULL && strlen(n->name) >= name_len)) {
        ote_mutex_unlock(&e->nmu);
        return OTE_ERR_TOO_BIG;
    }
    (void)nq_pop(e);
    ote_mutex_unlock(&e->nmu);
    if (n->len) memcpy(buf, n->data, n->len);
    if (from != NULL) memcpy(from, n->from, strlen(n->from) + 1);
    if (name != NULL) memcpy(name, n->name, strlen(n->name) + 1);
    *len_out = n->len;
    ote_free(n);
    return OTE_OK;
}

ote_status_t ote_notify_drain(ote_engine_t *e, ote_notification_t *out, size_t cap, void *data,
                              size_t data_cap, size_t *count_out) {
    if (e == NULL || count_out == NULL || (out == NULL && cap > 0) ||
        (data == NULL && data_cap > 0))
        return OTE_ERR_INVALID;
    if (OTE__ENGINE_GONE(e)) return OTE_ERR_STATE;
    _Static_assert(sizeof(out->from) >= OTE__ADDR_MAX, "a sender's address fits");
    _Static_assert(sizeof(out->name) >= OTE__ENGINE_NAME_LEN, "a sender's name fits");
    size_t n = 0, used = 0;
    ote__nin_t *taken = NULL, **tail = &taken;
    ote_mutex_lock(&e->nmu);
    if (e->nhead != NULL && e->nhead->len > data_cap && cap > 0) {
        ote_mutex_unlock(&e->nmu);
        return OTE_ERR_TOO_BIG;
    }
    while (n < cap && e->nhead != NULL && e->nhead->len <= data_cap - used) {
        ote__nin_t *m = nq_pop(e);
        out[n].offset = used;
        out[n].len = m->len;
        used += m->len;
        n++;
        m->next = NULL;
        *tail = m;
        tail = &m->next;
    }
    ote_mutex_unlock(&e->nmu);
    for (size_t i = 0; taken != NULL; i++) { /* copied out with no lock held */
        ote__nin_t *m = taken;
        taken = m->next;
        if (m->len) memcpy((uint8_t *)data + out[i].offset, m->data, m->len);
        snprintf(out[i].from, sizeof(out[i].from), "%s", m->from);
        snprintf(out[i].name, sizeof(out[i].name), "%s", m->name);
        ote_free(m);
    }
    *count_out = n;
    return OTE_OK;
}

ote_status_t ote_notify_discard(ote_engine_t *e, size_t *len_out) {
    if (e == NULL) return OTE_ERR_INVALID;
    if (OTE__ENGINE_GONE(e)) return OTE_ERR_STATE;
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

/* Decide the batch's attached notifications once no request is pending. b->mu held.
 * Returns the list to send; frees the ones that will not be sent. */
ote__nout_t *ote__batch_decide_notes(ote_batch_t *b) {
    ote__nout_t *send = NULL;
    size_t nsub = atomic_load(&b->nsub);
    while (b->notes) {
        ote__nout_t *n = b->notes;
        b->notes = n->next;
        int ok = 1;
        for (size_t i = 0; i < nsub && ok; i++)
            if (b->reqs[i].seg == n->seg &&
                atomic_load(&b->reqs[i].state) != OTE_TRANSFER_COMPLETED)
                ok = 0;
        if (ok) {
            /* The batch keeps a reference for ote_batch_notify_result (b->sent). */
            atomic_fetch_add(&n->refs, 1);
            n->bnext = b->sent;
            b->sent = n;
            n->next = send;
            send = n;
        } else {
            OTE_INFO("engine", "batch notification to %s dropped: a request to it did not complete",
                     n->seg->name);
            if (b->notes_dropped == OTE_OK) b->notes_dropped = OTE_ERR_CANCELED;
            atomic_fetch_sub(&n->seg->notes, 1);
            ote__nout_put(n);
        }
    }
    return send;
}

void ote__notes_send(ote__nout_t *list) {
    while (list) {
        ote__nout_t *n = list;
        list = n->next;
        n->next = NULL;
        /* The batch's hold on seg->notes is handed to the in-flight notification. */
        n->slice.deadline = ote_deadline_after(n->e->cfg.transfer_timeout_ms * OTE_NSEC_PER_MSEC);
        n->until = n->slice.deadline;
        n->seg->tp->ops->submit(n->seg->peer, &n->slice);
    }
}

ote_status_t ote_batch_notify(ote_batch_t *b, ote_segment_t *seg, const void *msg, size_t len) {
    if (b == NULL || seg == NULL || seg->e != b->e || (msg == NULL && len > 0))
        return OTE_ERR_INVALID;
    if (len > OTE_NOTIFY_MAX) return OTE_ERR_TOO_BIG;
    ote__nout_t *n;
    ote_status_t st = nout_new(b->e, seg, msg, len, 1, &n);
    if (st != OTE_OK) return st;
    n->batch = 1;
    atomic_fetch_add(&seg->notes, 1); /* held until sent and acknowledged, or dropped */
    ote__nout_t *send = NULL;
    ote_mutex_lock(&b->mu);
    n->next = b->notes;
    b->notes = n;
    /* Nothing submitted yet: decided when the coming submissions end. */
    if (atomic_load(&b->pending) == 0 && atomic_load(&b->nsub) > 0)
        send = ote__batch_decide_notes(b);
    ote_mutex_unlock(&b->mu);
    if (send) {
        st = ote__segment_ensure(seg);
        if (st != OTE_OK) {
            /* Unsendable: the slice fails through the transport with PEER_LOST. */
            OTE_WARN("engine", "batch notification to %s: reconnect failed: %s", seg->name,
                     ote_status_str(st));
        }
        ote__notes_send(send);
    }
    return OTE_OK;
}

/* The outcome of b's sent notifications (b->mu held): OTE_ERR_AGAIN while one is in
 * flight (or waits to be sent again), else the first failure, else OTE_OK. */
static ote_status_t sent_result(ote_batch_t *b) {
    ote_status_t st = OTE_OK;
    ote_mutex_lock(&b->e->omu);
    for (ote__nout_t *n = b->sent; n != NULL; n = n->bnext) {
        if (!n->done) {
            st = OTE_ERR_AGAIN;
            break;
        }
        if (st == OTE_OK && n->st != OTE_OK) st = n->st;
    }
    ote_mutex_unlock(&b->e->omu);
    return st;
}

ote_status_t ote_batch_notify_result(ote_batch_t *b, ote_status_t *result_out) {
    if (b == NULL || result_out == NULL) return OTE_ERR_INVALID;
    ote_mutex_lock(&b->mu);
    ote_status_t st = b->notes != NULL ? OTE_ERR_AGAIN : sent_result(b);
    if (st == OTE_OK && b->notes_dropped != OTE_OK) st = b->notes_dropped;
    ote_mutex_unlock(&b->mu);
    *result_out = st;
    return OTE_OK;
}

ote_status_t ote__batch_wait_notes(ote_batch_t *b, ote_deadline_t dl) {
    ote_engine_t *e = b->e;
    ote_mutex_lock(&e->omu);
    for (;;) {
        int pending = 0;
        for (ote__nout_t *n = b->sent; n != NULL && !pending; n = n->bnext) pending = !n->done;
        if (!pending) break;
        if (ote_cond_wait(&e->ocv, &e->omu, dl) == OTE_ERR_TIMEOUT) {
            ote_mutex_unlock(&e->omu);
            return OTE_ERR_TIMEOUT;
        }
    }
    ote_mutex_unlock(&e->omu);
    return OTE_OK;
}

void ote__batch_drop_sent(ote_batch_t *b) {
    ote__nout_t *n = b->sent;
    b->sent = NULL;
    b->notes_dropped = OTE_OK;
    while (n != NULL) {
        ote__nout_t *nx = n->bnext;
        ote__nout_put(n);
        n = nx;
    }
}

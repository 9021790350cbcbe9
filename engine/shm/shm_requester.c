/*
 * engine/shm/shm_requester.c - the requester side of the same-host transport:
 * reachability from the peer's advertisement (the connection and its handshake are
 * shm_connect.c's), submit (a queue and a window of slices in flight, REQS of up
 * to SHM_BATCH_MAX requests), the receive thread (responses in order, deadlines, peer
 * death), cancel, reconnect and close. Its CUDA IPC part (offers and their copies, close
 * receipts) is in shm_requester_ipc.c. Design: shm_internal.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/log.h"
#include "base/thread.h"
#include "engine/control/auth.h"
#include "engine/control/ctl.h"
#include "engine/shm/shm_internal.h"
#include "engine/shm/shm_proto.h"

/* Queue s on l with its status; its done() runs in slist_finish. */
void ote__shm_slist_add(shm_slist_t *l, ote__slice_t *s, ote_status_t st) {
    s->next = NULL;
    ote__shm_xp(s)->id = (uint64_t)(int64_t)st; /* the status travels in the scratch until done() */
    if (l->t) l->t->next = s;
    else l->h = s;
    l->t = s;
}

/* Call done() of every slice of l, each stamped with one reading of the clock (their
 * requests' end, transport.h); no lock held. */
void ote__shm_slist_finish(shm_slist_t *l) {
    ote__slice_t *s = l->h;
    uint64_t now = s != NULL ? ote_now_ns() : 0;
    while (s) {
        ote__slice_t *next = s->next;
        s->end_ns = now;
        s->done(s, (ote_status_t)(int64_t)ote__shm_xp(s)->id);
        s = next;
    }
    l->h = l->t = NULL;
}

static void peer_entry(shm_peer_t *p, const ote__slice_t *s, uint16_t op);

/* Slice s of a request was dropped unsent: its bytes will never reach the source, which
 * is told (a WRITE_OFF entry in the next REQS message) so that the request's pin there
 * ends. Consecutive pieces of one request share an entry. p->mu held. */
static void peer_write_off(shm_peer_t *p, const ote__slice_t *s) {
    if (s->req_uid == 0 || s->op == OTE__SLICE_NOTIFY || p->broken) return;
    if (p->nwoff > 0 && p->woff[p->nwoff - 1].uid == s->req_uid &&
        p->woff[p->nwoff - 1].op == SHM_OP_WRITE_OFF) {
        p->woff[p->nwoff - 1].bytes += s->len;
        return;
    }
    peer_entry(p, s, SHM_OP_WRITE_OFF);
}

/* Slice s of a request is in flight and its request was canceled: the source is told (a
 * CANCEL entry in the next REQS message) to serve no more of it. Consecutive pieces of
 * one request share an entry. p->mu held. */
static void peer_cancel_sent(shm_peer_t *p, const ote__slice_t *s) {
    if (s->req_uid == 0 || s->op == OTE__SLICE_NOTIFY || p->broken) return;
    if (p->nwoff > 0 && p->woff[p->nwoff - 1].uid == s->req_uid &&
        p->woff[p->nwoff - 1].op == SHM_OP_CANCEL)
        return;
    peer_entry(p, s, SHM_OP_CANCEL);
}

/* Append an entry (op SHM_OP_WRITE_OFF of s's bytes, or SHM_OP_CANCEL) for s's request to
 * the next REQS message. p->mu held. */
static void peer_entry(shm_peer_t *p, const ote__slice_t *s, uint16_t op) {
    if (ote__shm_peer_woff_push(p, (shm_woff_t){s->req_uid, s->req_remote, s->req_len,
                                                op == SHM_OP_CANCEL ? 0 : s->len, op, 0}) != 0)
        OTE_WARN_LIMITED("shm",
                         "peer %s: out of memory for a write-off or cancel entry: the "
                         "source keeps a dropped request pinned until the connection "
                         "closes, or serves a canceled one to its end",
                         p->addr);
}

int ote__shm_peer_woff_push(shm_peer_t *p, shm_woff_t w) {
    if (p->nwoff == p->woff_cap) {
        size_t cap = p->woff_cap ? 2 * p->woff_cap : 64;
        shm_woff_t *a = ote_realloc(p->woff, cap * sizeof(*a));
        if (a == NULL) return -1;
        p->woff = a;
        p->woff_cap = cap;
    }
    p->woff[p->nwoff++] = w;
    return 0;
}

/* Fail everything (in flight and queued) with st, expired slices with TIMEOUT. p->mu held. */
static void peer_kill(shm_peer_t *p, ote_status_t st, shm_slist_t *done) {
    if (!p->broken) {
        p->broken = 1;
        shutdown(p->fd, SHUT_RDWR);
        if (st != OTE_OK && !p->stop)
            OTE_WARN("shm", "peer %s (pid %d): connection lost: %s", p->addr, (int)p->src_pid,
                     ote_status_str(st));
        /* Its CUDA IPC imports go (closed once no copy uses them). */
        if (p->ipc && p->tp->host.gpu.ipc_exporter_dead != NULL)
            p->tp->host.gpu.ipc_exporter_dead(p->tp->host.gpu.arg, (uint64_t)p->src_pid);
    }
    ote_deadline_t now = ote_now_ns();
    ote__slice_t *lists[2] = {p->fh, p->qh};
    for (int i = 0; i < 2; i++) {
        ote__slice_t *s = lists[i];
        while (s) {
            ote__slice_t *next = s->next;
            ote__shm_slist_add(done, s, s->deadline <= now ? OTE_ERR_TIMEOUT : st);
            s = next;
        }
    }
    p->fh = p->qh = NULL;
    p->ft = p->qt = NULL;
    p->nflight = 0;
    p->flight_bytes = 0;
    p->ring_head = p->ring_tail = 0;
    p->nwoff = 0; /* the source ends the connection's accounts when it closes */
}

/* Ring mode: a piece of the ring for slice s (in order; freed in order by responses),
 * staged with its bytes for WRITE and NOTIFY unless the source waits for staging marks
 * (then peer_stage does it once the message is sent). 0, or -1 when the ring is full. */
static int ring_alloc(shm_peer_t *p, ote__slice_t *s, uint64_t *off_out) {
    if (s->len > SHM_RING_SLICE * 2u) return -1; /* cannot happen: peer_max_slice */
    /* An empty ring starts again at 0 for a READ piece only. The source writes a READ's
     * bytes where this process last read others (A/B, 4 KiB x64 batch after batch: better
     * than moving on). A WRITE is staged here instead, into lines the source just read:
     * taking them back from its cache made the staging copy the batch's slowest step, so
     * WRITE pieces go on around the ring (1.45-1.86M against 1.22-1.29M msg/s, interleaved
     * runs). */
    if (p->ring_head == p->ring_tail && s->op == OTE__SLICE_READ) p->ring_head = p->ring_tail = 0;
    uint64_t pos = p->ring_head % SHM_RING_BYTES;
    uint64_t pad = pos + s->len > SHM_RING_BYTES ? SHM_RING_BYTES - pos : 0;
    if (p->ring_head + pad + s->len - p->ring_tail > SHM_RING_BYTES) return -1;
    uint64_t off = (p->ring_head + pad) % SHM_RING_BYTES;
    p->ring_head += pad + s->len;
    ote__shm_xp(s)->ring_end = p->ring_head;
    if (s->op != OTE__SLICE_READ && p->marks == NULL) memcpy(p->ring + off, s->local, s->len);
    *off_out = off;
    return 0;
}

/* Staging marks: the WRITE and NOTIFY bytes of the sent slices [first, last] into their
 * pieces of the ring, in order, the mark published after each (the source copies a piece
 * as soon as its mark passed it). p->mu held. */
static void peer_stage(shm_peer_t *p, const ote__slice_t *first, const ote__slice_t *last) {
    for (const ote__slice_t *s = first;; s = s->next) {
        if (ote__shm_cxp(s)->ring_end != 0 && s->op != OTE__SLICE_READ) {
            memcpy(p->ring + (ote__shm_cxp(s)->ring_end - s->len) % SHM_RING_BYTES, s->local,
                   s->len);
            atomic_store_explicit(p->marks, ote__shm_cxp(s)->id + 1, memory_order_release);
        }
        if (s == last) break;
    }
}

/* Slice s travels through the ring: every piece with bytes in ring mode; in
 * cross-memory-attach mode the small data pieces, when the source mapped the ring. */
static int peer_uses_ring(const shm_peer_t *p, const ote__slice_t *s) {
    if (p->ring == NULL || s->len == 0 || s->ipc_try) return 0;
    return p->mode == SHM_MODE_RING || (s->op != OTE__SLICE_NOTIFY && s->len <= SHM_RING_SMALL);
}

/* One pump's state: the REQS message being built (write-off entries first, then n
 * slices) and what is asked once per pump. */
typedef struct {
    union {
        shm_hdr_t h;
        uint8_t b[sizeof(shm_hdr_t) + SHM_BATCH_MAX * sizeof(shm_req_t)];
    } m;
    shm_req_t *r;       /* the message's entries */
    uint32_t nw, n;     /* write-off entries, then slices, in this message */
    ote__slice_t *last; /* the message's last slice */
    uint64_t bytes;     /* the message's slice bytes */
    uint64_t head0;     /* the ring as it was before this message */
    uint64_t tail0;
    int ipc_ok;    /* host->gpu.ipc_usable, asked once when needed (-1: not yet) */
    int may_share; /* shared allocations are looked for */
} shm_pump_t;

/* Shared allocations are looked for only when the engine has one (read once: one made
 * meanwhile is found by the next call). */
static int pump_may_share(const shm_peer_t *p) {
    const _Atomic size_t *shc = p->tp->host.shared_count;
    return p->shared_ok &&
           (p->nshared > 0 || (shc != NULL && atomic_load_explicit(shc, memory_order_relaxed) > 0));
}

/* The message's first entries: pending write-offs (and cancels), up to SHM_BATCH_MAX;
 * sets pm->nw. p->mu held. */
static void pump_add_write_offs(const shm_peer_t *p, shm_pump_t *pm) {
    shm_req_t *r = pm->r;
    for (pm->nw = 0; pm->nw < p->nwoff && pm->nw < SHM_BATCH_MAX; pm->nw++) {
        const shm_woff_t *w = &p->woff[pm->nw];
        r[pm->nw] = (shm_req_t){.id = w->id,
                                .local = w->bytes,
                                .op = w->op,
                                .req_remote = w->req_remote,
                                .req_len = w->req_len,
                                .req_uid = w->uid};
    }
}

/* Queued slice s (after `last`, NULL: the head) that must never be sent leaves the queue
 * and is done: canceled, or local device memory without IPC (the engine stages it as a
 * request of its own); its bytes are written off with a later message. 1 when dropped.
 * p->mu held. */
static int pump_drop_unsendable(shm_peer_t *p, ote__slice_t *s, ote__slice_t *last,
                                shm_slist_t *done) {
    ote_status_t st;
    if (s->canceled && atomic_load(s->canceled)) st = OTE_ERR_CANCELED; /* never sent */
    else if (s->ipc_try && !p->ipc) st = OTE_ERR_UNSUPPORTED; /* device memory needs IPC */
    else return 0;
    if (last) last->next = s->next;
    else p->qh = s->next;
    if (p->qt == s) p->qt = last;
    peer_write_off(p, s);
    ote__shm_slist_add(done, s, st);
    return 1;
}

/* How slice s travels: its request flags (IPC, shared mapping or a ring piece taken now,
 * its offset in *local_io). -1 when it needs a piece of a full ring. p->mu held. */
static int pump_slice_flags(shm_peer_t *p, shm_pump_t *pm, ote__slice_t *s, uint64_t *local_io,
                            uint16_t *flags_out) {
    uint16_t flags = 0;
    if (p->ipc && s->op != OTE__SLICE_NOTIFY) {
        if (pm->ipc_ok < 0) pm->ipc_ok = p->tp->host.gpu.ipc_usable(p->tp->host.gpu.arg);
        if (pm->ipc_ok || s->ipc_try) flags = SHM_REQ_IPC;
        if (s->ipc_try) flags |= SHM_REQ_LOCAL_DEV;
    }
    ote__shm_xp(s)->ring_end = 0; /* nonzero: the slice holds a piece of the ring */
    if (pm->may_share && s->len > 0 && !s->ipc_try && s->op != OTE__SLICE_NOTIFY &&
        ote__shm_peer_shared(p, s)) {
        flags |= SHM_REQ_SHARED; /* the source copies it through its mapping */
    } else if (peer_uses_ring(p, s)) {
        if (ring_alloc(p, s, local_io) != 0) return -1;
        flags |= SHM_REQ_RING;
    }
    *flags_out = flags;
    return 0;
}

/* After the write-offs, the queued slices that the window, the batch and the message
 * size allow, from the queue's head (not yet unlinked; ids from p->next_id): sets pm->n,
 * pm->bytes, pm->last and the ring's ends before the message. p->mu held. */
static void pump_add_slices(shm_peer_t *p, shm_pump_t *pm, shm_slist_t *done) {
    ote__slice_t *s = p->qh;
    pm->n = 0;
    pm->last = NULL;
    /* The ring as it was before this message: ring_alloc may reset an empty ring to
     * 0, so an unsent message restores both ends (the head alone left the ring
     * holding bytes no response would free: full for good, nothing in flight). */
    pm->bytes = 0;
    pm->head0 = p->ring_head;
    pm->tail0 = p->ring_tail;
    while (s && pm->nw + pm->n < SHM_BATCH_MAX && p->nflight + pm->n < SHM_WINDOW &&
           p->flight_bytes < SHM_WINDOW_BYTES &&
           (pm->n == 0 || (p->flight_bytes + pm->bytes + s->len <= SHM_WINDOW_BYTES &&
                           pm->bytes + s->len <= SHM_MSG_BYTES))) {
        ote__slice_t *next = s->next;
        if (pump_drop_unsendable(p, s, pm->last, done)) {
            s = next;
            continue;
        }
        uint64_t local = (uint64_t)(uintptr_t)s->local;
        uint16_t flags = 0;
        if (pump_slice_flags(p, pm, s, &local, &flags) != 0)
            break; /* the ring is full: more after responses */
        ote__shm_xp(s)->id = p->next_id + pm->n;
        pm->r[pm->nw + pm->n] = (shm_req_t){.id = ote__shm_xp(s)->id,
                                            .remote = s->remote,
                                            .local = local,
                                            .len = s->len,
                                            .op = s->op,
                                            .flags = flags,
                                            .req_remote = s->req_remote,
                                            .req_len = s->req_len,
                                            .req_uid = s->req_uid};
        pm->n++;
        pm->bytes += s->len;
        pm->last = s;
        s = next;
    }
}

/* Send the message without blocking: 1 sent; 0 the socket is full (the ring's ends
 * restored; the receive thread retries); -1 the connection is lost (p killed, its
 * slices into done). p->mu held. */
static int pump_send(shm_peer_t *p, shm_pump_t *pm, shm_slist_t *done) {
    pm->m.h = (shm_hdr_t){SHM_MAGIC, SHM_VERSION, SHM_REQS, pm->nw + pm->n, 0};
    /* (ring pieces of an unsent message are taken again, in the same order, when it
     * is retried: head and tail go back to where they were when it began) */
    size_t len = sizeof(shm_hdr_t) + (pm->nw + pm->n) * sizeof(shm_req_t);
    ssize_t wr = send(p->fd, pm->m.b, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (wr < 0 && (errno == EAGAIN || errno == EINTR)) {
        p->ring_head = pm->head0;
        p->ring_tail = pm->tail0;
        return 0;
    }
    if (wr != (ssize_t)len) {
        peer_kill(p, OTE_ERR_PEER_LOST, done);
        return -1;
    }
    return 1;
}

/* The message is sent: its write-offs leave p->woff and its slices [qh, last] move to
 * the flight list (staged now when the source waits for marks). p->mu held. */
static void pump_sent(shm_peer_t *p, const shm_pump_t *pm) {
    /* The first nw write-offs are sent (later ones may have been added meanwhile). */
    memmove(p->woff, p->woff + pm->nw, (p->nwoff - pm->nw) * sizeof(*p->woff));
    p->nwoff -= pm->nw;
    if (pm->n == 0) return;
    /* [qh, last] is in flight now. */
    ote__slice_t *first = p->qh, *last = pm->last;
    p->qh = last->next;
    if (p->qh == NULL) p->qt = NULL;
    last->next = NULL;
    if (p->ft) p->ft->next = first;
    else p->fh = first;
    p->ft = last;
    p->nflight += pm->n;
    p->flight_bytes += pm->bytes;
    p->next_id += pm->n;
    if (p->marks != NULL) peer_stage(p, first, last);
}

/* Send pending write-offs, and queued slices while the window allows. p->mu held. */
void ote__shm_peer_pump(shm_peer_t *p, shm_slist_t *done) {
    shm_pump_t pm;
    pm.ipc_ok = -1;
    pm.may_share = pump_may_share(p);
    pm.r = (shm_req_t *)(pm.m.b + sizeof(shm_hdr_t));
    while (!p->broken && (p->nwoff > 0 || (p->qh && p->nflight < SHM_WINDOW &&
                                           p->flight_bytes < SHM_WINDOW_BYTES))) {
        pump_add_write_offs(p, &pm);
        pump_add_slices(p, &pm, done);
        if (pm.nw + pm.n == 0) break;
        if (pump_send(p, &pm, done) != 1) break; /* retried later, or the peer is lost */
        pump_sent(p, &pm);
    }
}

/* Responses of one RESPS message. p->mu held; -1 on a protocol error. */
static int peer_responses(shm_peer_t *p, const uint8_t *b, size_t n, shm_slist_t *done) {
    int cnt = ote__shm_resps_count(b, n);
    if (cnt < 0) return -1;
    for (int i = 0; i < cnt; i++) {
        shm_resp_t r;
        memcpy(&r, b + sizeof(shm_hdr_t) + (size_t)i * sizeof(r), sizeof(r));
        ote__slice_t *s = p->fh;
        if (s == NULL || ote__shm_xp(s)->id != r.id) return -1;
        p->fh = s->next;
        if (p->fh == NULL) p->ft = NULL;
        p->nflight--;
        p->flight_bytes -= s->len;
        uint16_t op = s->op == OTE__SLICE_NOTIFY ? OTE_CTL_NOTIFY_ACK
                      : s->op == OTE__SLICE_READ ? OTE_CTL_READ_RESP
                                                 : OTE_CTL_WRITE_ACK;
        /* CANCELED only for a piece of a request canceled here (a CANCEL entry stopped
         * it at the source); from any other piece it is the source's error. */
        ote_status_t st = r.status == OTE_ERR_CANCELED && s->canceled && atomic_load(s->canceled)
                              ? OTE_ERR_CANCELED
                              : ote_ctl_peer_status(op, (ote_status_t)r.status);
        /* A piece of local device memory the source declined to offer by IPC (it moved
         * nothing): the engine stages it. */
        if (s->ipc_try && r.status == OTE_ERR_UNSUPPORTED) st = OTE_ERR_UNSUPPORTED;
        if (ote__shm_xp(s)->ring_end != 0) {
            if (st == OTE_OK && s->op == OTE__SLICE_READ)
                memcpy(s->local, p->ring + (ote__shm_xp(s)->ring_end - s->len) % SHM_RING_BYTES,
                       s->len);
            p->ring_tail = ote__shm_xp(s)->ring_end;
        }
        ote__shm_slist_add(done, s, st);
    }
    return 0;
}

/* One message of the source, with fd (-1: none) received with it (the caller closes it).
 * p->mu held; -1 on a protocol error. */
static int peer_message(shm_peer_t *p, const uint8_t *b, size_t n, int fd, shm_slist_t *done) {
    shm_hdr_t h;
    if (n < sizeof(h)) return -1;
    memcpy(&h, b, sizeof(h));
    if (fd >= 0 && h.kind != SHM_IPC_OFFER) return -1; /* only a VMM offer carries an fd */
    switch (h.kind) {
        case SHM_IPC_OFFER: return ote__shm_peer_offer(p, b, n, fd, done);
        case SHM_IPC_CLOSE: return ote__shm_peer_close_receipt(p, b, n);
        default: return peer_responses(p, b, n, done);
    }
}

/* Deadlines: queued slices fail alone; an expired slice in flight kills the connection
 * (the source may still be copying it). p->mu held. */
static void peer_expire(shm_peer_t *p, shm_slist_t *done) {
    ote_deadline_t now = ote_now_ns();
    for (ote__slice_t *s = p->fh; s; s = s->next)
        if (s->deadline <= now) {
            peer_kill(p, OTE_ERR_PEER_LOST, done);
            return;
        }
    ote__slice_t **pp = &p->qh, *last = NULL;
    while (*pp) {
        ote__slice_t *s = *pp;
        if (s->deadline <= now) {
            *pp = s->next;
            peer_write_off(p, s);
            ote__shm_slist_add(done, s, OTE_ERR_TIMEOUT);
        } else {
            last = s;
            pp = &s->next;
        }
    }
    p->qt = last;
}

static void *rx_main(void *arg) {
    shm_peer_t *p = arg;
    /* Started again by a reconnect on whatever thread asked: its lines name the engine. */
    ote_log_set_thread_engine(p->tp->host.log_tag);
    uint8_t buf[sizeof(shm_hdr_t) + SHM_BATCH_MAX * sizeof(shm_resp_t)];
    for (;;) {
        struct pollfd pf = {.fd = p->fd, .events = POLLIN};
        int r = 0;
        /* IPC copies under way (read without mu: only this thread changes ih to NULL):
         * their events are polled every millisecond; after the connection ended, until
         * each one ended. */
        int ipc = p->ih != NULL;
        if (ipc && (p->broken || p->stop)) {
            (void)poll(NULL, 0, 1);
        } else {
            if (atomic_load(&p->nflight) > 0) { /* a response is due: spin a little first */
                ote_deadline_t spin = ote_deadline_after(SHM_SPIN_NS);
                while ((r = poll(&pf, 1, 0)) == 0 && !ote_deadline_expired(spin)) {}
            }
            if (r == 0) r = poll(&pf, 1, ipc ? 1 : SHM_TICK_MS);
        }
        shm_slist_t done = {NULL, NULL};
        ote_mutex_lock(&p->mu);
        /* The copies are polled after the socket was read: a source that died during a
         * copy is seen first (its pieces then end PEER_LOST). */
        if (p->ih != NULL && (p->stop || p->broken)) ote__shm_peer_ipc_poll(p, &done);
        if (p->uh != NULL && (p->stop || p->broken)) ote__shm_peer_ipc_settle(p); /* abandoned */
        if ((p->stop || p->broken) && p->ih == NULL) {
            ote_mutex_unlock(&p->mu);
            ote__shm_slist_finish(&done);
            break;
        }
        if (p->stop || p->broken) {
            ote_mutex_unlock(&p->mu);
            ote__shm_slist_finish(&done);
            continue;
        }
        while (r > 0) {
            int fd = -1, fds_bad = 0;
            ssize_t n = ote__shm_recv_fds(p->fd, buf, sizeof(buf), &fd, &fds_bad); /* real length */
            if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
            if (n <= 0) {
                if (fd >= 0) close(fd);
                peer_kill(p, OTE_ERR_PEER_LOST, &done);
                break;
            }
            int bad = fds_bad || peer_message(p, buf, (size_t)n, fd, &done) != 0;
            if (fd >= 0) close(fd); /* an import holds its own reference */
            if (bad) {
                OTE_LOG_LIMITED(OTE_LOG_ERROR, "shm",
                                "peer %s: malformed or out-of-order response: closing", p->addr);
                peer_kill(p, OTE_ERR_PROTOCOL, &done);
                break;
            }
        }
        if (!p->broken) peer_expire(p, &done);
        if (p->ih != NULL) ote__shm_peer_ipc_poll(p, &done);
        if (p->uh != NULL) ote__shm_peer_ipc_settle(p);
        ote__shm_peer_pump(p, &done);
        ote_mutex_unlock(&p->mu);
        ote__shm_slist_finish(&done);
    }
    return NULL;
}

static ote_status_t peer_start(shm_peer_t *p) {
    int shared_ok = 0;
    ote_status_t st = ote__shm_peer_connect(p, &shared_ok);
    if (st != OTE_OK) return st;
    /* Under mu: ote_memory_free_shared looks at these from another thread. */
    ote_mutex_lock(&p->mu);
    p->shared_ok = shared_ok;
    p->nshared = 0; /* a new connection: its source has mapped none */
    ote_mutex_unlock(&p->mu);
    p->broken = 0;
    if (ote_thread_create(&p->rx, NULL, rx_main, p) != 0) {
        close(p->fd);
        p->fd = -1;
        if (p->ring != NULL) munmap(p->ring, SHM_RING_MAP);
        p->ring = NULL;
        p->marks = NULL;
        return OTE_ERR_NOMEM;
    }
    p->rx_started = 1;
    return OTE_OK;
}

/* The peer is reachable by this transport: same boot, same network and user namespace. */
static int same_host(const char *mine, const char *theirs) {
    static const char *const keys[] = {"boot", "netns", "userns"};
    for (int i = 0; i < 3; i++) {
        char a[64], b[64];
        if (ote_ctl_info_get(mine, keys[i], a, sizeof(a)) != OTE_OK ||
            ote_ctl_info_get(theirs, keys[i], b, sizeof(b)) != OTE_OK || strcmp(a, b) != 0)
            return 0;
    }
    return 1;
}

ote_status_t ote__shm_peer_open_info(ote__transport_t *t, const char *peer, const char *peer_info,
                                     ote__tpeer_t **peer_out) {
    shm_tp_t *tp = (shm_tp_t *)t;
    char sock[SHM_SOCK_MAX + 1];
    if (ote_ctl_info_get(peer_info, "shm", sock, sizeof(sock)) != OTE_OK || sock[0] == '\0') {
        OTE_INFO("shm", "peer %s advertises no shm socket", peer);
        return OTE_ERR_UNSUPPORTED;
    }
    if (!same_host(tp->host.info ? tp->host.info : "", peer_info)) {
        OTE_INFO("shm", "peer %s is on another host or namespace: not reachable by shm", peer);
        return OTE_ERR_UNSUPPORTED;
    }
    shm_peer_t *p = ote_calloc(1, sizeof(*p));
    if (p == NULL) return OTE_ERR_NOMEM;
    p->tp = tp;
    p->fd = -1;
    snprintf(p->addr, sizeof(p->addr), "%s", peer);
    snprintf(p->sock, sizeof(p->sock), "%s", sock);
    p->met = ote_ctl_info_incarnation(peer_info);
    ote_status_t st = ote_mutex_init(&p->mu);
    if (st != OTE_OK) goto err_free;
    st = ote_mutex_init(&p->ensure_mu);
    if (st != OTE_OK) goto err_mu;
    st = peer_start(p);
    if (st != OTE_OK) goto err_emu;
    /* From here the engine owns the peer: peer_close frees it (and its ring). */
    ote__shm_peers_add(p);
    OTE_INFO("shm", "peer %s: source pid %d, %s, %s%s", peer, (int)p->src_pid,
             p->mode == SHM_MODE_RING ? "shared ring" : "cross-memory attach",
             p->ring == NULL    ? "no ring"
             : p->marks != NULL ? "staging marks"
                                : "ring staged before sending (no staging marks)",
             p->shared_ok ? ", shared allocations" : "");
    *peer_out = (ote__tpeer_t *)p;
    return OTE_OK;

err_emu:
    ote_mutex_destroy(&p->ensure_mu);
err_mu:
    ote_mutex_destroy(&p->mu);
err_free:
    ote_free(p);
    return st;
}

ote_status_t ote__shm_peer_open(ote__transport_t *t, const char *peer, ote__tpeer_t **peer_out) {
    (void)t;
    (void)peer_out;
    OTE_INFO("shm", "peer %s: no advertisement, so no shm socket to reach", peer);
    return OTE_ERR_UNSUPPORTED;
}

/* Ask the peer for its advertisement again: a restarted peer has another socket. */
static ote_status_t peer_relearn(shm_peer_t *p) {
    shm_tp_t *tp = p->tp;
    if (tp->host.query_info == NULL) return OTE_OK;
    char *info = ote_malloc(OTE_CTL_MAX_INFO + 1);
    if (info == NULL) return OTE_ERR_NOMEM;
    ote_status_t st = tp->host.query_info(tp->host.arg, p->addr, info, OTE_CTL_MAX_INFO + 1);
    char sock[SHM_SOCK_MAX + 1];
    if (st == OTE_OK && (ote_ctl_info_get(info, "shm", sock, sizeof(sock)) != OTE_OK ||
                         !same_host(tp->host.info ? tp->host.info : "", info)))
        st = OTE_ERR_UNSUPPORTED;
    uint64_t inc = st == OTE_OK ? ote_ctl_info_incarnation(info) : 0;
    if (st == OTE_OK && inc != p->met) {
        /* Another engine at this address: its memory is not what the segment named. */
        OTE_WARN("shm",
                 "peer %s restarted (epoch %016llx, was %016llx): this segment fails with "
                 "OTE_ERR_PEER_LOST; close it and open a new segment",
                 p->addr, (unsigned long long)inc, (unsigned long long)p->met);
        p->restarted = 1;
        st = OTE_ERR_PEER_LOST;
    }
    if (st == OTE_OK) snprintf(p->sock, sizeof(p->sock), "%s", sock);
    ote_free(info);
    return st;
}

/* Join a finished receive thread and close its socket. p->ensure_mu held. */
static void peer_stop_rx(shm_peer_t *p) {
    if (!p->rx_started) return;
    ote_mutex_lock(&p->mu);
    p->stop = 1;
    shutdown(p->fd, SHUT_RDWR);
    ote_mutex_unlock(&p->mu);
    pthread_join(p->rx, NULL);
    p->rx_started = 0;
    close(p->fd);
    p->fd = -1;
    if (p->ring != NULL) munmap(p->ring, SHM_RING_MAP);
    p->ring = NULL;
    p->marks = NULL;
    ote_mutex_lock(&p->mu);
    p->stop = 0;
    ote_mutex_unlock(&p->mu);
}

ote_status_t ote__shm_peer_ensure(ote__tpeer_t *tpeer) {
    shm_peer_t *p = (shm_peer_t *)tpeer;
    ote_mutex_lock(&p->mu);
    int broken = p->broken;
    ote_mutex_unlock(&p->mu);
    if (!broken) return OTE_OK;
    ote_mutex_lock(&p->ensure_mu);
    ote_status_t st = OTE_OK;
    ote_mutex_lock(&p->mu);
    broken = p->broken;
    ote_mutex_unlock(&p->mu);
    if (broken && p->restarted) {
        st = OTE_ERR_PEER_LOST; /* it met another incarnation: reopen the segment */
    } else if (broken) {
        peer_stop_rx(p);
        st = peer_relearn(p);
        if (st == OTE_OK) st = peer_start(p);
        if (st == OTE_ERR_UNSUPPORTED) st = OTE_ERR_CONNECT; /* no shm source there now */
        if (st == OTE_OK)
            OTE_INFO("shm", "peer %s: reconnected (pid %d)", p->addr, (int)p->src_pid);
    }
    ote_mutex_unlock(&p->ensure_mu);
    return st;
}

int ote__shm_ipc_ready(ote__tpeer_t *tpeer) {
    shm_peer_t *p = (shm_peer_t *)tpeer;
    ote_mutex_lock(&p->mu);
    int ready = p->ipc && !p->broken && p->fd >= 0;
    ote_mutex_unlock(&p->mu);
    return ready;
}

uint32_t ote__shm_peer_max_slice(ote__tpeer_t *tpeer) { return ((shm_peer_t *)tpeer)->max_slice; }

void ote__shm_submit(ote__tpeer_t *tpeer, ote__slice_t *list) {
    shm_peer_t *p = (shm_peer_t *)tpeer;
    shm_slist_t done = {NULL, NULL};
    ote_mutex_lock(&p->mu);
    if (p->broken || p->fd < 0) {
        while (list) {
            ote__slice_t *next = list->next;
            ote__shm_slist_add(&done, list, OTE_ERR_PEER_LOST);
            list = next;
        }
    } else {
        ote__slice_t *tail = list;
        while (tail->next) tail = tail->next;
        if (p->qt) p->qt->next = list;
        else p->qh = list;
        p->qt = tail;
        ote__shm_peer_pump(p, &done);
    }
    ote_mutex_unlock(&p->mu);
    ote__shm_slist_finish(&done);
}

void ote__shm_cancel(ote__tpeer_t *tpeer) {
    shm_peer_t *p = (shm_peer_t *)tpeer;
    shm_slist_t done = {NULL, NULL};
    ote_mutex_lock(&p->mu);
    ote__slice_t **pp = &p->qh, *last = NULL;
    while (*pp) {
        ote__slice_t *s = *pp;
        if (s->canceled && atomic_load(s->canceled)) {
            *pp = s->next;
            peer_write_off(p, s);
            ote__shm_slist_add(&done, s, OTE_ERR_CANCELED);
        } else {
            last = s;
            pp = &s->next;
        }
    }
    p->qt = last;
    /* Pieces already sent: the source stops serving their requests (CANCEL entries);
     * each ends with the source's response, once no byte of it can move any more. */
    for (ote__slice_t *s = p->fh; s; s = s->next)
        if (s->canceled && atomic_load(s->canceled)) peer_cancel_sent(p, s);
    ote__shm_peer_pump(p, &done); /* write-offs and cancels, so the source acts on them now */
    ote_mutex_unlock(&p->mu);
    ote__shm_slist_finish(&done);
}

void ote__shm_peer_lost(ote__tpeer_t *tpeer) {
    shm_peer_t *p = (shm_peer_t *)tpeer;
    shm_slist_t done = {NULL, NULL};
    ote_mutex_lock(&p->mu);
    peer_kill(p, OTE_ERR_PEER_LOST, &done); /* the receive thread sees its socket shut */
    ote_mutex_unlock(&p->mu);
    ote__shm_slist_finish(&done);
}

ote_status_t ote__shm_peer_close(ote__tpeer_t *tpeer) {
    shm_peer_t *p = (shm_peer_t *)tpeer;
    ote__shm_peers_del(p); /* ote_memory_free_shared no longer looks at it */
    ote_mutex_lock(&p->ensure_mu);
    peer_stop_rx(p);
    ote_mutex_unlock(&p->ensure_mu);
    shm_slist_t done = {NULL, NULL};
    ote_mutex_lock(&p->mu);
    p->stop = 1;
    peer_kill(p, OTE_ERR_PEER_LOST, &done); /* none: the engine closes idle segments only */
    ote_mutex_unlock(&p->mu);
    ote__shm_slist_finish(&done);
    ote_mutex_destroy(&p->ensure_mu);
    ote_mutex_destroy(&p->mu);
    ote_free(p->woff);
    ote_free(p);
    return OTE_OK;
}

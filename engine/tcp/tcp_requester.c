/*
 * engine/tcp/tcp_requester.c - the requester data path of the TCP transport: submit
 * spreads slices over a peer's connections (sent inline by the submitting thread when
 * the connection is idle, else queued for the worker), slices are numbered and encoded,
 * many frames go out per sendmsg(), responses complete the oldest sent slice, and
 * cancel drops what is not on the wire yet. It touches a requester connection's queue
 * (qmu), transmit lists (smu) and, on the worker, its awaiting-response list.
 */
#include <errno.h>
#include <string.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "base/alloc.h"
#include "base/le.h"
#include "base/log.h"
#include "base/time.h"
#include "engine/tcp/tcp_internal.h"

/* Slices taken off a connection before reaching the wire, completed by whoever dropped
 * them once it holds no lock. */
typedef struct {
    ote__slice_t *canceled, *too_big;
} req_drop_t;

static void drop_push(ote__slice_t **list, ote__slice_t *s) {
    s->next = *list;
    *list = s;
}

/* Number, encode and append `list` to the unsent slices. smu held. Slices that cannot
 * start (canceled when `check_cancel`, or unencodable) go to *dropped. */
static void req_append(tcp_conn_t *c, ote__slice_t *list, int check_cancel, req_drop_t *dropped) {
    while (list) {
        ote__slice_t *s = list;
        list = s->next;
        s->next = NULL;
        if (check_cancel && s->canceled &&
            atomic_load_explicit(s->canceled, memory_order_relaxed)) {
            drop_push(&dropped->canceled, s);
            continue;
        }
        ote__tcp_xp(s)->seq = ++c->seq;
        ote__tcp_xp(s)->withdrawn = 0;
        if (s->op == OTE__SLICE_NOTIFY) {
            ote_ctl_put_hdr(ote__tcp_xp(s)->wire, c->version, OTE_CTL_NOTIFY, ote__tcp_xp(s)->seq,
                            OTE_OK, s->len);
            ote__tcp_xp(s)->wire_len = OTE_CTL_HDR_LEN;
        } else if (ote_ctl_put_rw2(ote__tcp_xp(s)->wire, c->version, s->op, ote__tcp_xp(s)->seq,
                                   s->remote, s->len, s->req_remote, s->req_len, s->req_uid,
                                   &ote__tcp_xp(s)->wire_len) == OTE_OK) {
        } else { /* ote__tcp_submit refuses these; never put a wrapped length on the wire */
            drop_push(&dropped->too_big, s);
            continue;
        }
        if (c->tx_tail) c->tx_tail->next = s;
        else c->tx = s;
        c->tx_tail = s;
    }
}

/* Complete the slices req_append or req_purge dropped (no lock held). */
static void req_complete_dropped(req_drop_t *d) {
    ote__tcp_complete_list(d->canceled, OTE_ERR_CANCELED);
    ote__tcp_complete_list(d->too_big, OTE_ERR_TOO_BIG);
}

/* Move the submission queue to the unsent slices. smu held. */
static void req_pull(tcp_conn_t *c, req_drop_t *dropped) {
    ote_mutex_lock(&c->qmu);
    ote__slice_t *list = c->qhead;
    c->qhead = c->qtail = NULL;
    atomic_store(&c->qflag, 0);
    ote_mutex_unlock(&c->qmu);
    req_append(c, list, 1, dropped);
}

/* Drop canceled slices that are not on the wire yet. smu held. */
static void req_purge(tcp_conn_t *c, req_drop_t *dropped) {
    atomic_store(&c->purge, 0);
    ote__slice_t *prev = NULL, *s = c->tx;
    if (s && c->tx_off > 0) { /* partly sent: it must finish */
        prev = s;
        s = s->next;
    }
    while (s) {
        ote__slice_t *next = s->next;
        if (s->canceled && atomic_load_explicit(s->canceled, memory_order_relaxed)) {
            if (prev) prev->next = next;
            else c->tx = next;
            if (c->tx_tail == s) c->tx_tail = prev;
            drop_push(&dropped->canceled, s);
        } else {
            prev = s;
        }
        s = next;
    }
}

/* A CANCEL frame on its way: a transport-owned slice (op OTE_CTL_CANCEL, the body as its
 * payload) that goes out in order with the others but awaits no answer. */
typedef struct {
    ote__slice_t s;
    uint32_t nids, nwd;
    uint64_t ids[OTE_CTL_CANCEL_MAX];
    uint64_t wd[OTE_CTL_CANCEL_MAX][3]; /* uid, req_len, bytes */
    uint8_t body[8 + 32 * OTE_CTL_CANCEL_MAX];
} cancel_frame_t;

static void cancel_frame_free(ote__slice_t *s, ote_status_t st) {
    (void)st;
    ote_free(s);
}

/* Encode f and queue it behind the unsent slices. smu held. */
static void cancel_queue(tcp_conn_t *c, cancel_frame_t *f) {
    uint8_t *b = f->body;
    ote_le_put32(b, f->nids);
    ote_le_put32(b + 4, f->nwd);
    b += 8;
    for (uint32_t i = 0; i < f->nids; i++, b += 8) ote_le_put64(b, f->ids[i]);
    for (uint32_t i = 0; i < f->nwd; i++, b += 24)
        for (int k = 0; k < 3; k++) ote_le_put64(b + 8 * k, f->wd[i][k]);
    memset(&f->s, 0, sizeof(f->s));
    f->s.done = cancel_frame_free;
    f->s.owner = f;
    f->s.local = f->body;
    f->s.len = (uint32_t)(b - f->body);
    f->s.op = OTE_CTL_CANCEL;
    f->s.deadline = ote_deadline_after(c->w->tp->cfg.transfer_timeout_ms * OTE_NSEC_PER_MSEC);
    ote_ctl_put_hdr(ote__tcp_xp(&f->s)->wire, c->version, OTE_CTL_CANCEL, 0, OTE_OK, f->s.len);
    ote__tcp_xp(&f->s)->wire_len = OTE_CTL_HDR_LEN;
    if (c->tx_tail) c->tx_tail->next = &f->s;
    else c->tx = &f->s;
    c->tx_tail = &f->s;
}

/* The frame being filled, with room for one more id (wd 0) or withdrawal (wd 1): a full
 * one is queued and a new one started. NULL when out of memory. smu held. */
static cancel_frame_t *cancel_room(tcp_conn_t *c, cancel_frame_t **fp, int wd) {
    cancel_frame_t *f = *fp;
    if (f != NULL && (wd ? f->nwd : f->nids) == OTE_CTL_CANCEL_MAX) {
        cancel_queue(c, f);
        f = NULL;
    }
    if (f == NULL && (f = ote_malloc(sizeof(*f))) != NULL) f->nids = f->nwd = 0;
    *fp = f;
    return f;
}

/* READs of list that were canceled and whose answers have not come: withdraw them. */
static void withdraw_reads(tcp_conn_t *c, ote__slice_t *s, cancel_frame_t **fp) {
    for (; s != NULL; s = s->next) {
        if (s->op != OTE__SLICE_READ || ote__tcp_xp(s)->withdrawn || s->canceled == NULL ||
            !atomic_load_explicit(s->canceled, memory_order_relaxed))
            continue;
        cancel_frame_t *f = cancel_room(c, fp, 0);
        if (f == NULL) return; /* out of memory: they are served as if not canceled */
        ote__tcp_xp(s)->withdrawn = 1;
        f->ids[f->nids++] = ote__tcp_xp(s)->seq;
    }
}

/* Slices of list dropped before the wire: tell the source their bytes will never come,
 * so that it closes its account of their requests (one withdrawal per run of a request). */
static void withdraw_bytes(tcp_conn_t *c, ote__slice_t *s, cancel_frame_t **fp) {
    for (; s != NULL; s = s->next) {
        if (s->req_uid == 0) continue;
        cancel_frame_t *f = *fp;
        if (f != NULL && f->nwd > 0 && f->wd[f->nwd - 1][0] == s->req_uid) {
            f->wd[f->nwd - 1][2] += s->len;
            continue;
        }
        if ((f = cancel_room(c, fp, 1)) == NULL) return; /* its account ends with the session */
        f->wd[f->nwd][0] = s->req_uid;
        f->wd[f->nwd][1] = s->req_len;
        f->wd[f->nwd][2] = s->len;
        f->nwd++;
    }
}

/* Cancel reaches the source (version-2 connections): READs already requested whose
 * answers have not come (the awaiting list, worker-owned, and the sent list) are
 * withdrawn, and the bytes of slices dropped before the wire are written off, in CANCEL
 * frames queued behind the unsent slices. Worker, smu held. */
static void req_withdraw(tcp_conn_t *c, const req_drop_t *dropped) {
    if (c->version < 2) return;
    cancel_frame_t *f = NULL;
    withdraw_reads(c, c->head, &f);
    withdraw_reads(c, c->sent, &f);
    withdraw_bytes(c, dropped->canceled, &f);
    withdraw_bytes(c, dropped->too_big, &f);
    if (f == NULL) return;
    if (f->nids + f->nwd > 0) cancel_queue(c, f);
    else ote_free(f);
}

/* Send the unsent slices, many frames per sendmsg(), from iov[TCP_IOV]; fully sent ones
 * move to the sent list. smu held. OTE_OK when everything went, OTE_ERR_AGAIN when the
 * socket is full, else the connection failed: the caller kills it once it holds no lock
 * (the worker itself; a submitting thread by waking the worker, whose own send fails). */
static ote_status_t req_send(tcp_conn_t *c, struct iovec *iov) {
    while (c->tx) {
        if (c->fd < 0) return OTE_ERR_PEER_LOST;
        /* A cancel came while this loop sends (a receiver draining as fast as we send
         * keeps it going): stop here so its purge, which the cancel woke the worker for,
         * drops the slices not on the wire yet before they go. */
        if (atomic_load_explicit(&c->purge, memory_order_relaxed)) return OTE_ERR_AGAIN;
        int n = 0;
        size_t off = c->tx_off;
        for (ote__slice_t *s = c->tx; s && n < TCP_IOV - 1; s = s->next) {
            size_t wl = ote__tcp_xp(s)->wire_len, pl = slice_payload(s);
            if (off < wl) {
                iov[n].iov_base = ote__tcp_xp(s)->wire + off;
                iov[n++].iov_len = wl - off;
                if (pl) {
                    iov[n].iov_base = s->local;
                    iov[n++].iov_len = pl;
                }
            } else {
                iov[n].iov_base = s->local + (off - wl);
                iov[n++].iov_len = pl - (off - wl);
            }
            off = 0;
        }
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t r = sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return OTE_ERR_AGAIN;
            return ote_status_make(OTE_ERR_PEER_LOST, errno);
        }
        size_t left = (size_t)r;
        while (left > 0 && c->tx) {
            ote__slice_t *s = c->tx;
            size_t rem = ote__tcp_xp(s)->wire_len + slice_payload(s) - c->tx_off;
            if (left < rem) {
                c->tx_off += left;
                break;
            }
            left -= rem;
            c->tx = s->next;
            if (c->tx == NULL) c->tx_tail = NULL;
            c->tx_off = 0;
            s->next = NULL;
            if (s->op == OTE_CTL_CANCEL) { /* awaits no answer */
                s->done(s, OTE_OK);
                continue;
            }
            if (c->sent_tail) c->sent_tail->next = s;
            else c->sent = s;
            c->sent_tail = s;
        }
    }
    return OTE_OK;
}

/* Worker: take the queue (when flagged), drop canceled unsent slices (when asked), send
 * what waits, and keep EPOLLOUT in line with what is left. */
void ote__tcp_req_write(tcp_conn_t *c) {
    req_drop_t dropped = {NULL, NULL};
    ote_mutex_lock(&c->smu);
    if (atomic_load_explicit(&c->qflag, memory_order_acquire)) req_pull(c, &dropped);
    int purge = atomic_load_explicit(&c->purge, memory_order_relaxed);
    if (purge) req_purge(c, &dropped);
    if (purge || dropped.canceled != NULL || dropped.too_big != NULL) req_withdraw(c, &dropped);
    ote_status_t st = c->tx ? req_send(c, c->w->iov) : OTE_OK;
    ote_mutex_unlock(&c->smu);
    req_complete_dropped(&dropped);
    if (st == OTE_OK || st == OTE_ERR_AGAIN) ote__tcp_want_out(c, st == OTE_ERR_AGAIN);
    else ote__tcp_conn_kill(c, st);
}

/* Receive side: the oldest slice awaiting a response, taking the sent list (under smu)
 * when the worker's own list is empty. NULL: nothing was fully sent. */
static ote__slice_t *req_oldest_sent(tcp_conn_t *c) {
    if (c->head == NULL) {
        ote_mutex_lock(&c->smu);
        c->head = c->sent;
        c->tail = c->sent_tail;
        c->sent = c->sent_tail = NULL;
        ote_mutex_unlock(&c->smu);
    }
    return c->head;
}

void ote__tcp_req_pop_complete(tcp_conn_t *c, ote_status_t st) {
    ote__slice_t *s = c->head;
    c->head = s->next;
    if (c->head == NULL) c->tail = NULL;
    s->next = NULL;
    s->done(s, st);
}

/* A response frame; returns 0 or -1 when the connection was killed. */
int ote__tcp_req_frame(tcp_conn_t *c, const ote_ctl_msg_t *m) {
    ote__slice_t *s = req_oldest_sent(c);
    if (m->version != c->version || s == NULL || m->req_id != ote__tcp_xp(s)->seq ||
        m->opcode != s->op + 1) {
        OTE_LOG_LIMITED(OTE_LOG_ERROR, "tcp",
                        "unexpected %s (id %llu, version %u) from %s: closing connection",
                        ote_ctl_opcode_str(m->opcode), (unsigned long long)m->req_id, m->version,
                        c->peer ? c->peer->addr : "?");
        ote__tcp_conn_kill(c, OTE_ERR_PROTOCOL);
        return -1;
    }
    if (m->opcode == OTE_CTL_READ_RESP && m->status == OTE_OK) {
        if (m->data_len != s->len) {
            OTE_LOG_LIMITED(OTE_LOG_ERROR, "tcp",
                            "READ_RESP of %u bytes for a %u-byte slice from %s", m->data_len,
                            s->len, c->peer ? c->peer->addr : "?");
            ote__tcp_conn_kill(c, OTE_ERR_PROTOCOL);
            return -1;
        }
        if (s->len > 0) {
            c->rx_state = RX_DATA;
            c->rx_dst = s->local;
            c->rx_left = s->len;
            c->last_large = s->len >= TCP_DIRECT_MIN;
            return 0;
        }
    }
    c->last_large = 0;
    ote_status_t st = ote_ctl_peer_status(m->opcode, m->status);
    /* CANCELED answers only a READ this side withdrew; from anyone else it is a lie. */
    if (ote_status_code(st) == OTE_ERR_CANCELED && !ote__tcp_xp(s)->withdrawn) st = OTE_ERR_REMOTE;
    ote__tcp_req_pop_complete(c, st);
    return 0;
}

/* Deadline of the oldest slice of a requester connection (UINT64_MAX: none). */
uint64_t ote__tcp_req_oldest_deadline(tcp_conn_t *c) {
    if (c->head) return c->head->deadline;
    ote_mutex_lock(&c->smu);
    ote__slice_t *s = c->sent ? c->sent : c->tx;
    uint64_t dl = s ? s->deadline : UINT64_MAX;
    ote_mutex_unlock(&c->smu);
    return dl;
}

/* Submitting thread: when nobody else is sending on c (smu free) and its queue is empty,
 * put `list` on the wire from here rather than waking the worker. Whatever the socket
 * does not take now (or a send error) is left to the worker: it is woken to send the
 * rest under EPOLLOUT, or to fail the connection. Returns 0 when the list was not taken
 * (the caller queues it). */
static int req_send_inline(tcp_conn_t *c, ote__slice_t *list) {
    if (ote_mutex_trylock(&c->smu) != OTE_OK) return 0;
    ote_mutex_lock(&c->qmu);
    int ok = !c->qdead && c->qhead == NULL && c->tx == NULL;
    ote_mutex_unlock(&c->qmu);
    if (!ok) {
        ote_mutex_unlock(&c->smu);
        return 0;
    }
    req_drop_t dropped = {NULL, NULL};
    struct iovec iov[TCP_IOV];
    req_append(c, list, 0, &dropped);
    ote_status_t st = c->tx ? req_send(c, iov) : OTE_OK;
    ote_mutex_unlock(&c->smu);
    if (st != OTE_OK && !atomic_exchange(&c->qflag, 1)) ote__tcp_worker_wake(c->w);
    req_complete_dropped(&dropped);
    return 1;
}

void ote__tcp_submit(ote__tpeer_t *tpeer, ote__slice_t *list) {
    tcp_peer_t *p = (tcp_peer_t *)tpeer;
    ote__slice_t *heads[TCP_MAX_CONNS] = {0}, *tails[TCP_MAX_CONNS] = {0};
    uint64_t bytes[TCP_MAX_CONNS] = {0};
    ote__slice_t *failed = NULL;
    if (pthread_rwlock_tryrdlock(&p->lk) != 0) {
        if (ote__tcp_on_worker) { /* the peer is being reconnected or closed: it was lost */
            ote__tcp_complete_list(list, OTE_ERR_PEER_LOST);
            return;
        }
        pthread_rwlock_rdlock(&p->lk);
    }
    uint32_t n = p->n;
    uint32_t i = atomic_fetch_add_explicit(&p->rr, 1, memory_order_relaxed) % n;
    /* The engine cut these slices by the limit it saw; a reconnect since may have
     * brought a peer with a smaller one. Such slices fail rather than go on the wire. */
    uint32_t max_data = atomic_load(&p->max_data);
    ote__slice_t *too_big = NULL;
    while (list) {
        ote__slice_t *s = list;
        list = s->next;
        s->next = NULL;
        if (s->len > max_data) {
            s->next = too_big;
            too_big = s;
            continue;
        }
        if (tails[i]) tails[i]->next = s;
        else heads[i] = s;
        tails[i] = s;
        bytes[i] += (uint64_t)OTE_CTL_RW2_FRAME_LEN + slice_payload(s);
        i = i + 1 == n ? 0 : i + 1;
    }
    for (i = 0; i < n; i++) {
        if (heads[i] == NULL) continue;
        tcp_conn_t *c = p->conns[i];
        if (c != NULL && !ote__tcp_on_worker && bytes[i] <= TCP_INLINE_MAX &&
            req_send_inline(c, heads[i]))
            continue;
        int ok = 0;
        if (c != NULL) {
            ote_mutex_lock(&c->qmu);
            if (!c->qdead) {
                if (c->qtail) c->qtail->next = heads[i];
                else c->qhead = heads[i];
                c->qtail = tails[i];
                ok = 1;
            }
            ote_mutex_unlock(&c->qmu);
        }
        if (ok) {
            if (!atomic_exchange(&c->qflag, 1)) ote__tcp_worker_wake(c->w);
        } else {
            tails[i]->next = failed;
            failed = heads[i];
        }
    }
    pthread_rwlock_unlock(&p->lk);
    if (failed) ote__tcp_complete_list(failed, OTE_ERR_PEER_LOST);
    if (too_big) ote__tcp_complete_list(too_big, OTE_ERR_TOO_BIG);
}

void ote__tcp_cancel(ote__tpeer_t *tpeer) {
    tcp_peer_t *p = (tcp_peer_t *)tpeer;
    pthread_rwlock_rdlock(&p->lk);
    for (uint32_t i = 0; i < p->n; i++) {
        tcp_conn_t *c = p->conns[i];
        if (c == NULL) continue;
        atomic_store(&c->purge, 1);
        atomic_store(&c->qflag, 1);
        ote__tcp_worker_wake(c->w);
    }
    pthread_rwlock_unlock(&p->lk);
}

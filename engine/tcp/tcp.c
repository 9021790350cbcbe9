/*
 * engine/tcp/tcp.c - the TCP transport.
 *
 * Roles. Every engine listens. An engine that opens a segment is the requester on the
 * connections it makes; the engine that accepted them is the source: it owns the
 * remote addresses, checks every request against its registrations (host->pin) before
 * touching memory, and answers. One connection serves one role only.
 *
 * Threads and ownership. tcp_workers worker threads each own an epoll set and the
 * connections attached to it; only the owning worker receives on a connection, owns its
 * receive buffer, its response ring (source), its epoll interest and its close. Other
 * threads talk to a worker through (a) a connection's submission queue (qmu) plus an
 * eventfd wake, and (b) attach/detach commands. A requester connection is freed by its
 * peer (segment) after the worker reports it detached; a source connection is freed by
 * its worker.
 *
 * Inline send (requester). Sending on a requester connection is done under its send
 * lock smu, by the worker or by a submitting thread: tcp_submit tries smu (never waits
 * for it) and, when it gets it and the connection has nothing queued or unsent and its
 * share of the list is at most TCP_INLINE_MAX bytes, numbers the slices and sendmsg()s
 * them itself (non-blocking), saving the worker's wakeup on the small-request path.
 * What the socket does not take, or a send error, is left to the worker (qflag + wake):
 * it sends the rest under EPOLLOUT or fails the connection. Otherwise the list is queued
 * for the worker as before. Lock order smu before qmu; the worker closes the socket only
 * under smu, so an inline sender never sees a reused fd; no done() runs under either lock.
 *
 * Data path. A requester connection keeps its slices in seq order in three lists: under
 * smu, [tx, tx_tail] wait to be sent (tx partly sent when tx_off > 0) and [sent,
 * sent_tail] are fully sent; worker-owned, [head, tail] are sent slices awaiting their
 * response (the receive side takes the whole sent list, one lock per take, when its own
 * list runs out). The source answers frames of one connection in order, so a response
 * always belongs to the head; anything else (including a response to a slice not fully
 * sent) is a protocol error that closes the connection. Sends gather many frames into one
 * sendmsg(): WRITE payloads go straight from the caller's memory, READ payloads straight
 * from registered memory. Receives read up to 256 KiB into a connection buffer; once a
 * frame header is validated, a large payload remainder is received straight into its
 * destination (small payloads are copied out of the buffer: cheaper than a syscall
 * each). Slices are never allocated here and no lock is taken per slice.
 *
 * Failure. EOF/reset fails every slice of the connection with OTE_ERR_PEER_LOST and
 * marks the peer broken (a later submit reconnects). A slice whose deadline passes
 * closes its connection (its data can no longer arrive) and fails with
 * OTE_ERR_TIMEOUT. Peers are independent: one peer's death never blocks another's.
 *
 * Hostile or stuck requesters (source side). At most tcp_max_accepted accepted
 * connections exist at once (more are closed at accept); each must complete its
 * handshake within connect_timeout_ms and, until then, owns only a small receive buffer.
 * A connection queues at most TCP_SRC_MAX_RESP responses: at the cap it stops reading
 * (EPOLLIN off) until the requester drains them. A connection that owes responses or is
 * receiving a payload must make progress (bytes in or out) every transfer_timeout_ms,
 * else it is closed and its registrations unpinned. Accept failures for lack of fds or
 * memory take the listen socket out of epoll for TCP_ACCEPT_BACKOFF_NS (no spinning) and
 * are logged at most once per TCP_LOG_EVERY_NS.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/fault.h"
#include "base/lock.h"
#include "base/log.h"
#include "base/time.h"
#include "engine/control/ctl.h"
#include "engine/engine_internal.h"
#include "engine/transport.h"

_Static_assert(sizeof(((ote__slice_t *)0)->xp.tcp.wire) >= OTE_CTL_RW_FRAME_LEN,
               "a slice's tcp scratch holds the largest frame header it sends");

#define TCP_RXBUF (256u << 10)
#define TCP_DIRECT_MIN (16u << 10) /* payload remainders this large are received in place */
#define TCP_IOV 128
#define TCP_SOCKBUF (4 << 20)
#define TCP_TICK_NS (20 * OTE_NSEC_PER_MSEC)
#define TCP_RX_BUDGET (16u << 20) /* bytes per readable event per connection (fairness) */
#define TCP_MAX_CONNS 64
#define TCP_INLINE_MAX (256u << 10) /* submit: a connection's share this small may go inline */
#define TCP_SRC_MAX_RESP 256u /* queued responses per source connection */
#define TCP_HS_RXBUF 512u     /* receive buffer before the handshake: one HELLO fits */
#define TCP_ACCEPT_BACKOFF_NS (100 * OTE_NSEC_PER_MSEC)
#define TCP_LOG_EVERY_NS (1000 * OTE_NSEC_PER_MSEC)
#define TCP_HSBUF (OTE_CTL_HDR_LEN + 8 + OTE_CTL_MAX_TEXT + OTE_CTL_MAX_ADDR + 16)

enum { ROLE_REQUESTER = 1, ROLE_SOURCE = 2 };
enum { RX_HDR = 0, RX_DATA = 1, RX_DISCARD = 2 };
enum { CMD_ATTACH = 1, CMD_DETACH = 2 };

typedef struct tcp tcp_t;
typedef struct tcp_worker tcp_worker_t;
typedef struct tcp_conn tcp_conn_t;
typedef struct tcp_peer tcp_peer_t;

typedef struct tcp_cmd {
    struct tcp_cmd *next;
    int kind;
    tcp_conn_t *c;
} tcp_cmd_t;

/* A response of the source side, waiting to be sent. */
typedef struct {
    uint8_t hdr[OTE_CTL_HDR_LEN];
    uint8_t hdr_len;
    uint8_t close_after; /* close the connection once sent (handshake refusal) */
    const uint8_t *data;
    uint32_t len;
    void *pin; /* registration pinned until the data is sent */
} tcp_resp_t;

struct tcp_conn {
    tcp_worker_t *w;
    tcp_conn_t *wnext, *wprev; /* worker list, or graveyard (wnext) */
    int fd;
    int role;
    uint16_t version;
    uint16_t index;
    tcp_peer_t *peer; /* requester role */
    char from[OTE__ADDR_MAX];
    uint32_t ev;
    int out_wanted;  /* EPOLLOUT requested */
    int rx_paused;   /* source: EPOLLIN off (response cap reached, or closing) */
    int closing;     /* source: a close_after response is queued; parse nothing more */
    uint64_t born_ns; /* source: accept time (handshake deadline) */
    uint64_t progress, progress_seen, progress_ns; /* bytes moved: a counter, its tick view */

    /* Submission queue (requester): any thread under qmu. */
    ote_mutex_t qmu;
    ote__slice_t *qhead, *qtail;
    int qdead;
    _Atomic int qflag;
    _Atomic int purge;

    /* Lifecycle, under tp->mu. */
    int detached;
    int cmd_pending;
    tcp_cmd_t attach_cmd, detach_cmd;

    /* Requester transmit state, under smu (held by whoever sends: the worker, or a
     * submitting thread sending inline). Lock order: smu before qmu. sent..sent_tail are
     * fully on the wire and not yet taken by the receive side; tx..tx_tail wait to be
     * sent (tx partly sent when tx_off > 0). The fd is closed only under smu. */
    ote_mutex_t smu;
    ote__slice_t *sent, *sent_tail, *tx, *tx_tail;
    size_t tx_off;
    uint64_t seq;

    /* Requester, worker-owned: sent slices awaiting their responses, in seq order. */
    ote__slice_t *head, *tail;

    /* Source, worker-owned. */
    tcp_resp_t *ring;
    size_t rcap, rhead, rcount, rtx_off;
    int handshaken;
    uint8_t hsbuf[TCP_HSBUF];

    /* Receive, worker-owned. */
    uint8_t *rxbuf;
    size_t rxcap;
    size_t rx_start, rx_end;
    int rx_state;
    uint8_t *rx_dst;
    size_t rx_left;
    void *rx_pin;
    uint64_t rx_id;
    ote_status_t rx_status;
    int last_large;
};

struct tcp_worker {
    tcp_t *tp;
    uint32_t idx;
    pthread_t th;
    int started;
    int epfd;
    int evfd;
    _Atomic int woken;
    ote_mutex_t cmu;
    tcp_cmd_t *chead, *ctail;
    tcp_conn_t *conns;
    tcp_conn_t *grave;
    uint64_t next_tick;
    struct iovec iov[TCP_IOV];
};

struct tcp {
    ote__transport_t base;
    ote__cfg_t cfg;
    ote__host_t host;
    int lfd;
    char addr[OTE__ADDR_MAX];
    uint32_t nworkers;
    tcp_worker_t *workers;
    _Atomic uint32_t rr;
    _Atomic int stop;
    ote_mutex_t mu; /* conn lifecycle */
    ote_cond_t cv;
    int sockbuf;
    _Atomic uint64_t session;
    _Atomic uint32_t naccepted; /* source connections alive (<= cfg.tcp_max_accepted) */
    /* Accept path, worker 0 only. */
    uint64_t accept_resume_ns; /* nonzero: listen fd out of epoll until then */
    uint64_t accept_log_ns;    /* last accept WARN */
    uint64_t accept_quiet;     /* failures not logged since */
};

struct tcp_peer {
    tcp_t *tp;
    char addr[OTE__ADDR_MAX];        /* as the user gave it */
    char remote_addr[OTE__ADDR_MAX]; /* as the peer advertises itself */
    pthread_rwlock_t lk;             /* read: submit; write: reconnect/close */
    uint32_t n;
    tcp_conn_t **conns;
    _Atomic int broken;
    _Atomic uint32_t rr;
    /* The source's max_data from the handshake, in [OTE_CTL_MIN_DATA, OTE_CTL_MAX_DATA].
     * Written by a (re)connect under lk for writing, read by submitters without it. */
    _Atomic uint32_t max_data;
};

static inline tcp_t *to_tcp(ote__transport_t *t) { return (tcp_t *)t; }

/* Set on worker threads: they must never block on a peer lock (a reconnecting thread
 * holds it while it waits for the workers). */
static _Thread_local int tl_worker;

/* ---- helpers --------------------------------------------------------------------- */

static void set_sockopts(tcp_t *tp, int fd) {
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (tp->sockbuf > 0) {
        (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &tp->sockbuf, sizeof(tp->sockbuf));
        (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &tp->sockbuf, sizeof(tp->sockbuf));
    }
}

/* Large socket buffers help only when the kernel lets us have them: setting a small
 * SO_RCVBUF would switch off receive autotuning and make things slower. */
static int pick_sockbuf(void) {
    long rmax = 0, wmax = 0;
    FILE *f = fopen("/proc/sys/net/core/rmem_max", "r");
    if (f) {
        if (fscanf(f, "%ld", &rmax) != 1) rmax = 0;
        fclose(f);
    }
    f = fopen("/proc/sys/net/core/wmem_max", "r");
    if (f) {
        if (fscanf(f, "%ld", &wmax) != 1) wmax = 0;
        fclose(f);
    }
    return (rmax >= TCP_SOCKBUF && wmax >= TCP_SOCKBUF) ? TCP_SOCKBUF : 0;
}

static void worker_wake(tcp_worker_t *w) {
    if (!atomic_exchange(&w->woken, 1)) {
        uint64_t one = 1;
        ssize_t r = write(w->evfd, &one, sizeof(one));
        (void)r;
    }
}

static void worker_post(tcp_worker_t *w, tcp_cmd_t *cmd) {
    ote_mutex_lock(&w->cmu);
    cmd->next = NULL;
    if (w->ctail) w->ctail->next = cmd;
    else w->chead = cmd;
    w->ctail = cmd;
    ote_mutex_unlock(&w->cmu);
    worker_wake(w);
}

/* A source connection starts with a TCP_HS_RXBUF receive buffer (a connection that never
 * handshakes costs little) and gets TCP_RXBUF once its HELLO is accepted. */
static tcp_conn_t *conn_new(tcp_t *tp, int fd, int role) {
    tcp_conn_t *c = ote_calloc(1, sizeof(*c));
    if (c == NULL) return NULL;
    c->rxcap = role == ROLE_SOURCE ? TCP_HS_RXBUF : TCP_RXBUF;
    c->rxbuf = ote_malloc(c->rxcap);
    if (c->rxbuf == NULL || ote_mutex_init(&c->qmu) != OTE_OK) {
        ote_free(c->rxbuf);
        ote_free(c);
        return NULL;
    }
    if (ote_mutex_init(&c->smu) != OTE_OK) {
        ote_mutex_destroy(&c->qmu);
        ote_free(c->rxbuf);
        ote_free(c);
        return NULL;
    }
    c->fd = fd;
    c->role = role;
    c->w = &tp->workers[atomic_fetch_add(&tp->rr, 1) % tp->nworkers];
    c->attach_cmd.kind = CMD_ATTACH;
    c->attach_cmd.c = c;
    c->detach_cmd.kind = CMD_DETACH;
    c->detach_cmd.c = c;
    return c;
}

static void conn_free(tcp_conn_t *c) {
    if (c == NULL) return;
    if (c->role == ROLE_SOURCE) atomic_fetch_sub(&c->w->tp->naccepted, 1);
    if (c->fd >= 0) close(c->fd);
    ote_mutex_destroy(&c->qmu);
    ote_mutex_destroy(&c->smu);
    ote_free(c->rxbuf);
    ote_free(c->ring);
    ote_free(c);
}

static uint32_t slice_payload(const ote__slice_t *s) {
    return s->op == OTE__SLICE_READ ? 0 : s->len;
}

/* Keep the epoll interest of c in line with out_wanted and rx_paused. */
static void conn_events(tcp_conn_t *c) {
    uint32_t ev = (c->rx_paused ? 0u : (uint32_t)EPOLLIN) | (c->out_wanted ? (uint32_t)EPOLLOUT : 0u);
    if (ev == c->ev || c->fd < 0) return;
    struct epoll_event e = {.events = ev, .data.ptr = c};
    if (epoll_ctl(c->w->epfd, EPOLL_CTL_MOD, c->fd, &e) == 0) c->ev = ev;
}

static void want_out(tcp_conn_t *c, int on) {
    c->out_wanted = on;
    conn_events(c);
}

/* ---- connection death ------------------------------------------------------------- */

static ote_status_t fail_status(const ote__slice_t *s, ote_status_t why, uint64_t now) {
    if (s->canceled && atomic_load_explicit(s->canceled, memory_order_relaxed)) return OTE_ERR_CANCELED;
    if (ote_status_code(why) == OTE_ERR_TIMEOUT && now < s->deadline) return OTE_ERR_PEER_LOST;
    return why;
}

static void complete_list(ote__slice_t *list, ote_status_t why) {
    uint64_t now = ote_now_ns();
    while (list) {
        ote__slice_t *s = list;
        list = s->next;
        s->next = NULL;
        s->done(s, fail_status(s, why, now));
    }
}

/* Close the socket, fail or release everything the connection holds, and move it to the
 * worker's graveyard (freed or reported detached at the end of the loop iteration, so
 * no event of this iteration can touch freed memory). Worker thread only. */
static void conn_kill(tcp_conn_t *c, ote_status_t why) {
    if (c->fd < 0) return;
    if (c->role == ROLE_REQUESTER) ote_mutex_lock(&c->smu); /* no inline send while closing */
    tcp_worker_t *w = c->w;
    tcp_t *tp = w->tp;
    if (c->role == ROLE_SOURCE) {
        /* Unpinned before the close: once the requester sees EOF, unregister works. */
        for (size_t i = 0; i < c->rcount; i++) {
            tcp_resp_t *r = &c->ring[(c->rhead + i) % c->rcap];
            if (r->pin) tp->host.unpin(tp->host.arg, r->pin);
            r->pin = NULL;
        }
        c->rcount = 0;
        if (c->rx_pin) tp->host.unpin(tp->host.arg, c->rx_pin);
        c->rx_pin = NULL;
    }
    (void)epoll_ctl(w->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->fd = -1;
    if (c->wprev) c->wprev->wnext = c->wnext;
    else if (w->conns == c) w->conns = c->wnext;
    if (c->wnext) c->wnext->wprev = c->wprev;
    c->wprev = NULL;
    c->wnext = w->grave;
    w->grave = c;

    if (c->role == ROLE_SOURCE) return;
    ote_mutex_lock(&c->qmu);
    c->qdead = 1;
    ote__slice_t *q = c->qhead;
    c->qhead = c->qtail = NULL;
    ote_mutex_unlock(&c->qmu);
    /* Everything in flight, oldest first: awaiting responses, sent, unsent. */
    ote__slice_t *inflight = c->head, **link = c->head ? &c->tail->next : &inflight;
    *link = c->sent;
    if (c->sent) link = &c->sent_tail->next;
    *link = c->tx;
    c->head = c->tail = c->sent = c->sent_tail = c->tx = c->tx_tail = NULL;
    c->tx_off = 0;
    ote_mutex_unlock(&c->smu);
    if (c->peer) atomic_store(&c->peer->broken, 1);
    size_t n = 0;
    for (ote__slice_t *s = inflight; s; s = s->next) n++;
    for (ote__slice_t *s = q; s; s = s->next) n++;
    if (n > 0)
        OTE_WARN("tcp", "connection %u to %s closed (%s): failing %zu slice(s)", c->index,
                 c->peer ? c->peer->addr : "?", ote_status_str(why), n);
    else
        OTE_DEBUG("tcp", "connection %u to %s closed (%s)", c->index, c->peer ? c->peer->addr : "?",
                  ote_status_str(why));
    complete_list(inflight, why);
    complete_list(q, why);
}

static void worker_bury(tcp_worker_t *w) {
    tcp_t *tp = w->tp;
    while (w->grave) {
        tcp_conn_t *c = w->grave;
        w->grave = c->wnext;
        c->wnext = NULL;
        if (c->role == ROLE_SOURCE) {
            conn_free(c);
        } else {
            ote_mutex_lock(&tp->mu);
            c->detached = 1;
            ote_cond_broadcast(&tp->cv);
            ote_mutex_unlock(&tp->mu);
        }
    }
}

/* ---- requester side -------------------------------------------------------------- */

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
        if (check_cancel && s->canceled && atomic_load_explicit(s->canceled, memory_order_relaxed)) {
            drop_push(&dropped->canceled, s);
            continue;
        }
        s->xp.tcp.seq = ++c->seq;
        if (s->op == OTE__SLICE_NOTIFY) {
            ote_ctl_put_hdr(s->xp.tcp.wire, c->version, OTE_CTL_NOTIFY, s->xp.tcp.seq, OTE_OK, s->len);
            s->xp.tcp.wire_len = OTE_CTL_HDR_LEN;
        } else if (ote_ctl_put_rw(s->xp.tcp.wire, c->version, s->op, s->xp.tcp.seq, s->remote, s->len) == OTE_OK) {
            s->xp.tcp.wire_len = OTE_CTL_RW_FRAME_LEN;
        } else { /* tcp_submit refuses these; never put a wrapped length on the wire */
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
    complete_list(d->canceled, OTE_ERR_CANCELED);
    complete_list(d->too_big, OTE_ERR_TOO_BIG);
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

/* Send the unsent slices, many frames per sendmsg(), from iov[TCP_IOV]; fully sent ones
 * move to the sent list. smu held. OTE_OK when everything went, OTE_ERR_AGAIN when the
 * socket is full, else the connection failed: the caller kills it once it holds no lock
 * (the worker itself; a submitting thread by waking the worker, whose own send fails). */
static ote_status_t req_send(tcp_conn_t *c, struct iovec *iov) {
    while (c->tx) {
        if (c->fd < 0) return OTE_ERR_PEER_LOST;
        int n = 0;
        size_t off = c->tx_off;
        for (ote__slice_t *s = c->tx; s && n < TCP_IOV - 1; s = s->next) {
            size_t wl = s->xp.tcp.wire_len, pl = slice_payload(s);
            if (off < wl) {
                iov[n].iov_base = s->xp.tcp.wire + off;
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
            size_t rem = s->xp.tcp.wire_len + slice_payload(s) - c->tx_off;
            if (left < rem) {
                c->tx_off += left;
                break;
            }
            left -= rem;
            c->tx = s->next;
            if (c->tx == NULL) c->tx_tail = NULL;
            c->tx_off = 0;
            s->next = NULL;
            if (c->sent_tail) c->sent_tail->next = s;
            else c->sent = s;
            c->sent_tail = s;
        }
    }
    return OTE_OK;
}

/* Worker: take the queue (when flagged), drop canceled unsent slices (when asked), send
 * what waits, and keep EPOLLOUT in line with what is left. */
static void req_write(tcp_conn_t *c) {
    req_drop_t dropped = {NULL, NULL};
    ote_mutex_lock(&c->smu);
    if (atomic_load_explicit(&c->qflag, memory_order_acquire)) req_pull(c, &dropped);
    if (atomic_load_explicit(&c->purge, memory_order_relaxed)) req_purge(c, &dropped);
    ote_status_t st = c->tx ? req_send(c, c->w->iov) : OTE_OK;
    ote_mutex_unlock(&c->smu);
    req_complete_dropped(&dropped);
    if (st == OTE_OK || st == OTE_ERR_AGAIN) want_out(c, st == OTE_ERR_AGAIN);
    else conn_kill(c, st);
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

static void req_pop_complete(tcp_conn_t *c, ote_status_t st) {
    ote__slice_t *s = c->head;
    c->head = s->next;
    if (c->head == NULL) c->tail = NULL;
    s->next = NULL;
    s->done(s, st);
}

/* A response frame; returns 0 or -1 when the connection was killed. */
static int req_frame(tcp_conn_t *c, const ote_ctl_msg_t *m) {
    ote__slice_t *s = req_oldest_sent(c);
    if (m->version != c->version || s == NULL || m->req_id != s->xp.tcp.seq ||
        m->opcode != s->op + 1) {
        OTE_ERROR("tcp", "unexpected %s (id %llu, version %u) from %s: closing connection",
                  ote_ctl_opcode_str(m->opcode), (unsigned long long)m->req_id, m->version,
                  c->peer ? c->peer->addr : "?");
        conn_kill(c, OTE_ERR_PROTOCOL);
        return -1;
    }
    if (m->opcode == OTE_CTL_READ_RESP && m->status == OTE_OK) {
        if (m->data_len != s->len) {
            OTE_ERROR("tcp", "READ_RESP of %u bytes for a %u-byte slice from %s", m->data_len,
                      s->len, c->peer ? c->peer->addr : "?");
            conn_kill(c, OTE_ERR_PROTOCOL);
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
    req_pop_complete(c, ote_ctl_peer_status(m->opcode, m->status));
    return 0;
}

/* ---- source side ----------------------------------------------------------------- */

static tcp_resp_t *resp_push(tcp_conn_t *c) {
    if (c->rcount == c->rcap) {
        size_t ncap = c->rcap ? c->rcap * 2 : 256;
        tcp_resp_t *nr = ote_malloc(ncap * sizeof(*nr));
        if (nr == NULL) return NULL;
        for (size_t i = 0; i < c->rcount; i++) nr[i] = c->ring[(c->rhead + i) % c->rcap];
        ote_free(c->ring);
        c->ring = nr;
        c->rcap = ncap;
        c->rhead = 0;
    }
    tcp_resp_t *r = &c->ring[(c->rhead + c->rcount) % c->rcap];
    c->rcount++;
    memset(r, 0, sizeof(*r));
    return r;
}

static int src_respond(tcp_conn_t *c, uint16_t opcode, uint64_t id, ote_status_t st,
                       const uint8_t *data, uint32_t len, void *pin) {
    tcp_resp_t *r = resp_push(c);
    if (r == NULL) {
        if (pin) c->w->tp->host.unpin(c->w->tp->host.arg, pin);
        OTE_ERROR("tcp", "out of memory queueing a response to %s: closing connection", c->from);
        conn_kill(c, OTE_ERR_NOMEM);
        return -1;
    }
    ote_ctl_put_hdr(r->hdr, c->version, opcode, id, st, len);
    r->hdr_len = OTE_CTL_HDR_LEN;
    r->data = data;
    r->len = len;
    r->pin = pin;
    return 0;
}

/* Whether the source may take another request from c: not after a refusal that closes
 * the connection, and not while TCP_SRC_MAX_RESP responses wait to be sent. */
static int src_may_parse(const tcp_conn_t *c) {
    return !c->closing && c->rcount < TCP_SRC_MAX_RESP;
}

static void src_write(tcp_conn_t *c) {
    tcp_t *tp = c->w->tp;
    struct iovec *iov = c->w->iov;
    while (c->rcount > 0 && c->fd >= 0) {
        int n = 0;
        size_t off = c->rtx_off;
        for (size_t i = 0; i < c->rcount && n < TCP_IOV - 1; i++) {
            tcp_resp_t *r = &c->ring[(c->rhead + i) % c->rcap];
            if (off < r->hdr_len) {
                iov[n].iov_base = r->hdr + off;
                iov[n++].iov_len = r->hdr_len - off;
                if (r->len) {
                    iov[n].iov_base = (void *)r->data;
                    iov[n++].iov_len = r->len;
                }
            } else {
                iov[n].iov_base = (void *)(r->data + (off - r->hdr_len));
                iov[n++].iov_len = r->len - (off - r->hdr_len);
            }
            off = 0;
        }
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t rc = sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (rc < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                want_out(c, 1);
                return;
            }
            OTE_DEBUG("tcp", "send to %s failed: %s", c->from, strerror(errno));
            conn_kill(c, ote_status_make(OTE_ERR_PEER_LOST, errno));
            return;
        }
        c->progress++;
        size_t left = (size_t)rc;
        while (left > 0 && c->rcount > 0) {
            tcp_resp_t *r = &c->ring[c->rhead];
            size_t rem = r->hdr_len + r->len - c->rtx_off;
            if (left >= rem) {
                left -= rem;
                c->rtx_off = 0;
                if (r->pin) tp->host.unpin(tp->host.arg, r->pin);
                r->pin = NULL;
                int close_after = r->close_after;
                c->rhead = (c->rhead + 1) % c->rcap;
                c->rcount--;
                if (close_after) {
                    conn_kill(c, OTE_ERR_VERSION);
                    return;
                }
            } else {
                c->rtx_off += left;
                left = 0;
            }
        }
    }
    want_out(c, 0);
}

static int src_handshake(tcp_conn_t *c, const ote_ctl_msg_t *m) {
    if (m->opcode != OTE_CTL_HELLO) {
        OTE_WARN("control", "connection began with %s instead of HELLO: closing",
                 ote_ctl_opcode_str(m->opcode));
        conn_kill(c, OTE_ERR_PROTOCOL);
        return -1;
    }
    size_t al = m->u.hello.addr_len;
    memcpy(c->from, m->u.hello.addr, al);
    c->from[al] = '\0';
    uint16_t ver = 0;
    ote_status_t st = ote_ctl_negotiate(m, OTE_CTL_VERSION_MIN, OTE_CTL_VERSION_MAX, &ver);
    ote_ctl_msg_t out;
    memset(&out, 0, sizeof(out));
    char text[160];
    if (st != OTE_OK) {
        OTE_WARN("control",
                 "protocol version mismatch: peer %s speaks versions %u..%u, this engine %u..%u: "
                 "refusing the connection",
                 c->from[0] ? c->from : "?", m->u.hello.min_version, m->u.hello.max_version,
                 OTE_CTL_VERSION_MIN, OTE_CTL_VERSION_MAX);
        int tl = snprintf(text, sizeof(text), "protocol version mismatch: source speaks %u..%u",
                          OTE_CTL_VERSION_MIN, OTE_CTL_VERSION_MAX);
        out.version = m->version;
        out.opcode = OTE_CTL_ERROR;
        out.req_id = m->req_id;
        out.status = OTE_ERR_VERSION;
        out.u.error.min_version = OTE_CTL_VERSION_MIN;
        out.u.error.max_version = OTE_CTL_VERSION_MAX;
        out.u.error.text = text;
        out.u.error.text_len = (uint32_t)tl;
    } else {
        tcp_t *tp = c->w->tp;
        c->version = ver;
        c->handshaken = 1;
        out.version = ver;
        out.opcode = OTE_CTL_HELLO_ACK;
        out.req_id = m->req_id;
        out.u.hello_ack.version = ver;
        out.u.hello_ack.max_data = OTE_CTL_MAX_DATA;
        out.u.hello_ack.addr = tp->addr;
        out.u.hello_ack.addr_len = (uint32_t)strlen(tp->addr);
    }
    size_t len = 0;
    if (ote_ctl_encode(&out, c->hsbuf, sizeof(c->hsbuf), &len) != OTE_OK) {
        conn_kill(c, OTE_ERR_PROTOCOL);
        return -1;
    }
    tcp_resp_t *r = resp_push(c);
    if (r == NULL) {
        conn_kill(c, OTE_ERR_NOMEM);
        return -1;
    }
    r->hdr_len = 0;
    r->data = c->hsbuf;
    r->len = (uint32_t)len;
    r->close_after = st != OTE_OK;
    /* The queued answer points into hsbuf: after a refusal nothing more is parsed (a
     * second HELLO would overwrite it), and the connection closes once it is sent. */
    if (st != OTE_OK) {
        c->closing = 1;
        return 0;
    }
    uint8_t *nb = ote_malloc(TCP_RXBUF);
    if (nb == NULL) {
        OTE_ERROR("tcp", "out of memory for the receive buffer of %s: closing connection", c->from);
        conn_kill(c, OTE_ERR_NOMEM);
        return -1;
    }
    size_t rem = c->rx_end - c->rx_start;
    if (rem) memcpy(nb, c->rxbuf + c->rx_start, rem);
    ote_free(c->rxbuf);
    c->rxbuf = nb;
    c->rxcap = TCP_RXBUF;
    c->rx_start = 0;
    c->rx_end = rem;
    return 0;
}

static int src_frame(tcp_conn_t *c, const ote_ctl_msg_t *m) {
    tcp_t *tp = c->w->tp;
    if (!c->handshaken) return src_handshake(c, m);
    if (m->version != c->version) {
        OTE_WARN("control", "frame with version %u on a version-%u connection from %s: closing",
                 m->version, c->version, c->from);
        conn_kill(c, OTE_ERR_PROTOCOL);
        return -1;
    }
    void *pin = NULL;
    ote_status_t st;
    switch (m->opcode) {
        case OTE_CTL_WRITE_REQ:
            st = tp->host.pin(tp->host.arg, m->u.rw.addr, m->u.rw.len, OTE_PERM_WRITE, &pin);
            c->rx_id = m->req_id;
            c->rx_left = m->u.rw.len;
            c->last_large = m->u.rw.len >= TCP_DIRECT_MIN;
            if (st == OTE_OK) {
                c->rx_state = RX_DATA;
                c->rx_dst = (uint8_t *)(uintptr_t)m->u.rw.addr;
                c->rx_pin = pin;
                c->rx_status = OTE_OK;
            } else {
                OTE_WARN("tcp", "refused WRITE of %u bytes at 0x%llx from %s: %s", m->u.rw.len,
                         (unsigned long long)m->u.rw.addr, c->from, ote_status_str(st));
                c->rx_state = RX_DISCARD;
                c->rx_status = st;
            }
            return 0;
        case OTE_CTL_READ_REQ:
            c->last_large = 0;
            st = tp->host.pin(tp->host.arg, m->u.rw.addr, m->u.rw.len, OTE_PERM_READ, &pin);
            if (st != OTE_OK) {
                OTE_WARN("tcp", "refused READ of %u bytes at 0x%llx from %s: %s", m->u.rw.len,
                         (unsigned long long)m->u.rw.addr, c->from, ote_status_str(st));
                return src_respond(c, OTE_CTL_READ_RESP, m->req_id, st, NULL, 0, NULL);
            }
            return src_respond(c, OTE_CTL_READ_RESP, m->req_id, OTE_OK,
                               (const uint8_t *)(uintptr_t)m->u.rw.addr, m->u.rw.len, pin);
        case OTE_CTL_NOTIFY:
            c->last_large = 0;
            st = tp->host.deliver_notify(tp->host.arg, c->from, m->u.notify.msg, m->u.notify.len);
            return src_respond(c, OTE_CTL_NOTIFY_ACK, m->req_id, st, NULL, 0, NULL);
        default:
            OTE_WARN("control", "unexpected %s from requester %s: closing",
                     ote_ctl_opcode_str(m->opcode), c->from);
            conn_kill(c, OTE_ERR_PROTOCOL);
            return -1;
    }
}

/* A payload (WRITE data on the source, READ data on the requester) has fully arrived. */
static int payload_done(tcp_conn_t *c) {
    c->rx_state = RX_HDR;
    if (c->role == ROLE_REQUESTER) {
        req_pop_complete(c, OTE_OK);
        return 0;
    }
    tcp_t *tp = c->w->tp;
    if (c->rx_pin) tp->host.unpin(tp->host.arg, c->rx_pin);
    c->rx_pin = NULL;
    return src_respond(c, OTE_CTL_WRITE_ACK, c->rx_id, c->rx_status, NULL, 0, NULL);
}

/* ---- receive ---------------------------------------------------------------------- */

/* Source: stop reading c (its buffered frames stay for src_resume). */
static void src_pause(tcp_conn_t *c) {
    if (c->rx_paused) return;
    c->rx_paused = 1;
    conn_events(c);
}

static void conn_read(tcp_conn_t *c) {
    size_t budget = TCP_RX_BUDGET;
    if (c->rx_paused) return;
    while (c->fd >= 0) {
        ssize_t r;
        if (c->rx_state != RX_HDR) {
            size_t avail = c->rx_end - c->rx_start;
            if (avail > 0) {
                size_t k = avail < c->rx_left ? avail : c->rx_left;
                if (c->rx_state == RX_DATA) memcpy(c->rx_dst, c->rxbuf + c->rx_start, k);
                c->rx_dst += k;
                c->rx_start += k;
                c->rx_left -= k;
            }
            if (c->rx_left == 0) {
                if (payload_done(c) != 0) return;
                continue;
            }
            c->rx_start = c->rx_end = 0;
            if (budget == 0) break;
            if (c->rx_state == RX_DATA && c->rx_left >= TCP_DIRECT_MIN)
                r = recv(c->fd, c->rx_dst, c->rx_left, MSG_DONTWAIT);
            else
                r = recv(c->fd, c->rxbuf, c->rxcap, MSG_DONTWAIT);
            if (r > 0) {
                c->progress++;
                budget = (size_t)r >= budget ? 0 : budget - (size_t)r;
                if (c->rx_state == RX_DATA && c->rx_left >= TCP_DIRECT_MIN) {
                    c->rx_dst += r;
                    c->rx_left -= (size_t)r;
                } else {
                    c->rx_end = (size_t)r;
                }
                continue;
            }
            goto recv_failed_or_again;
        }
        /* Parse every complete frame in the buffer. */
        int stop_parsing = 0;
        while (c->rx_state == RX_HDR && c->rx_end > c->rx_start) {
            if (c->role == ROLE_SOURCE && !src_may_parse(c)) {
                src_pause(c); /* resumed by src_resume once responses drain */
                return;
            }
            ote_ctl_msg_t m;
            size_t used = 0;
            ote_status_t st = ote_ctl_decode(c->rxbuf + c->rx_start, c->rx_end - c->rx_start, &m, &used);
            if (st == OTE_ERR_AGAIN) break;
            if (st != OTE_OK) {
                OTE_ERROR("control", "malformed frame from %s: %s; closing connection",
                          c->role == ROLE_SOURCE ? c->from : (c->peer ? c->peer->addr : "?"),
                          ote_status_str(st));
                conn_kill(c, OTE_ERR_PROTOCOL);
                return;
            }
            c->rx_start += used;
            int rc = c->role == ROLE_SOURCE ? src_frame(c, &m) : req_frame(c, &m);
            if (rc != 0) return;
            if (c->rx_state != RX_HDR) {
                stop_parsing = 1;
                break;
            }
        }
        if (stop_parsing) continue;
        if (budget == 0) break;
        /* Read more: keep the partial frame, bounded by a header after a large payload
         * so that the next large payload lands in place rather than in the buffer. */
        if (c->rx_start > 0) {
            size_t rem = c->rx_end - c->rx_start;
            if (rem) memmove(c->rxbuf, c->rxbuf + c->rx_start, rem);
            c->rx_start = 0;
            c->rx_end = rem;
        }
        size_t want = c->rxcap - c->rx_end;
        if (c->last_large && c->rx_end < OTE_CTL_RW_FRAME_LEN) want = OTE_CTL_RW_FRAME_LEN - c->rx_end;
        if (want == 0) { /* an incomplete frame fills the buffer: larger than allowed here */
            OTE_WARN("control", "frame from %s larger than %zu bytes%s: closing connection",
                     c->role == ROLE_SOURCE ? c->from : (c->peer ? c->peer->addr : "?"), c->rxcap,
                     c->handshaken ? "" : " before the handshake");
            conn_kill(c, OTE_ERR_PROTOCOL);
            return;
        }
        r = recv(c->fd, c->rxbuf + c->rx_end, want, MSG_DONTWAIT);
        if (r > 0) {
            c->progress++;
            c->rx_end += (size_t)r;
            budget = (size_t)r >= budget ? 0 : budget - (size_t)r;
            continue;
        }
    recv_failed_or_again:
        if (r == 0) {
            if (c->role == ROLE_SOURCE) OTE_DEBUG("tcp", "requester %s closed its connection", c->from);
            conn_kill(c, OTE_ERR_PEER_LOST);
            return;
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        conn_kill(c, ote_status_make(OTE_ERR_PEER_LOST, errno));
        return;
    }
}

/* Source: send queued responses; once below the cap again, take the frames that waited
 * in the buffer and read on, then send what they produced, until nothing moves. */
static void src_pump(tcp_conn_t *c) {
    for (;;) {
        src_write(c);
        if (c->fd < 0 || !c->rx_paused || !src_may_parse(c)) return;
        c->rx_paused = 0;
        conn_events(c);
        size_t before = c->rcount;
        conn_read(c);
        if (c->fd < 0 || c->rcount == 0 || (c->rcount == before && !c->rx_paused)) return;
    }
}

static void conn_flush(tcp_conn_t *c) {
    if (c->fd < 0) return;
    if (c->role == ROLE_SOURCE) src_pump(c);
    else req_write(c);
}

/* ---- worker ------------------------------------------------------------------------ */

static void worker_attach(tcp_worker_t *w, tcp_conn_t *c) {
    c->w = w;
    c->ev = EPOLLIN;
    c->out_wanted = 0;
    c->rx_paused = 0;
    struct epoll_event e = {.events = EPOLLIN, .data.ptr = c};
    c->wprev = NULL;
    c->wnext = w->conns;
    if (w->conns) w->conns->wprev = c;
    w->conns = c;
    if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, c->fd, &e) != 0) {
        OTE_ERROR("tcp", "epoll_ctl(ADD) failed: %s", strerror(errno));
        conn_kill(c, ote_status_from_errno(errno));
    }
}

static void worker_commands(tcp_worker_t *w) {
    tcp_t *tp = w->tp;
    ote_mutex_lock(&w->cmu);
    tcp_cmd_t *list = w->chead;
    w->chead = w->ctail = NULL;
    ote_mutex_unlock(&w->cmu);
    while (list) {
        tcp_cmd_t *cmd = list;
        list = cmd->next;
        tcp_conn_t *c = cmd->c;
        if (cmd->kind == CMD_ATTACH) {
            worker_attach(w, c);
        } else {
            if (c->fd >= 0) conn_kill(c, OTE_ERR_PEER_LOST);
            ote_mutex_lock(&tp->mu);
            c->cmd_pending = 0;
            ote_cond_broadcast(&tp->cv);
            ote_mutex_unlock(&tp->mu);
        }
    }
}

static void worker_service(tcp_worker_t *w) {
    worker_commands(w);
    for (tcp_conn_t *c = w->conns, *next; c; c = next) {
        next = c->wnext;
        if (c->role != ROLE_REQUESTER) continue;
        if (atomic_load_explicit(&c->qflag, memory_order_acquire) ||
            atomic_load_explicit(&c->purge, memory_order_relaxed))
            req_write(c);
    }
}

/* Deadlines of a source connection: the handshake within connect_timeout_ms; while it
 * owes responses, is receiving a payload or holds part of a frame, progress (bytes in or
 * out) at least every transfer_timeout_ms. Closing it unpins what it held. */
static void src_tick(tcp_conn_t *c, uint64_t now) {
    tcp_t *tp = c->w->tp;
    if (!c->handshaken) {
        uint64_t limit = tp->cfg.connect_timeout_ms * OTE_NSEC_PER_MSEC;
        if (now - c->born_ns >= limit) {
            OTE_WARN("tcp", "connection from %s did not complete its handshake within %llu ms: closing",
                     c->from, (unsigned long long)tp->cfg.connect_timeout_ms);
            conn_kill(c, OTE_ERR_TIMEOUT);
        }
        return;
    }
    int owes = c->rcount > 0 || c->rx_state != RX_HDR || c->rx_end > c->rx_start;
    if (!owes || c->progress != c->progress_seen) {
        c->progress_seen = c->progress;
        c->progress_ns = now;
        return;
    }
    if (now - c->progress_ns >= tp->cfg.transfer_timeout_ms * OTE_NSEC_PER_MSEC) {
        OTE_WARN("tcp",
                 "requester %s made no progress for %llu ms (%zu response(s) queued%s): closing "
                 "its connection and releasing its registrations",
                 c->from, (unsigned long long)tp->cfg.transfer_timeout_ms, c->rcount,
                 c->rx_state != RX_HDR ? ", a payload pending" : "");
        conn_kill(c, OTE_ERR_TIMEOUT);
    }
}

/* Rate-limited accept WARN (worker 0): at most one line per TCP_LOG_EVERY_NS. */
static void accept_warn(tcp_t *tp, uint64_t now, const char *what, int err) {
    if (tp->accept_log_ns != 0 && now - tp->accept_log_ns < TCP_LOG_EVERY_NS) {
        tp->accept_quiet++;
        return;
    }
    OTE_WARN("tcp", "%s%s%s (%llu similar event(s) not logged in the last second)", what,
             err ? ": " : "", err ? strerror(err) : "", (unsigned long long)tp->accept_quiet);
    tp->accept_log_ns = now;
    tp->accept_quiet = 0;
}

/* Deadline of the oldest slice of a requester connection (UINT64_MAX: none). */
static uint64_t req_oldest_deadline(tcp_conn_t *c) {
    if (c->head) return c->head->deadline;
    ote_mutex_lock(&c->smu);
    ote__slice_t *s = c->sent ? c->sent : c->tx;
    uint64_t dl = s ? s->deadline : UINT64_MAX;
    ote_mutex_unlock(&c->smu);
    return dl;
}

static void worker_tick(tcp_worker_t *w, uint64_t now) {
    tcp_t *tp = w->tp;
    for (tcp_conn_t *c = w->conns, *next; c; c = next) {
        next = c->wnext;
        if (c->role == ROLE_SOURCE) {
            src_tick(c, now);
            continue;
        }
        if (now >= req_oldest_deadline(c)) {
            OTE_WARN("tcp", "a transfer to %s passed its deadline: closing connection %u",
                     c->peer ? c->peer->addr : "?", c->index);
            conn_kill(c, OTE_ERR_TIMEOUT);
        }
    }
    if (w->idx == 0 && tp->accept_resume_ns != 0 && now >= tp->accept_resume_ns) {
        struct epoll_event le = {.events = EPOLLIN, .data.ptr = &tp->lfd};
        if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, tp->lfd, &le) == 0 || errno == EEXIST)
            tp->accept_resume_ns = 0;
        else
            tp->accept_resume_ns = now + TCP_ACCEPT_BACKOFF_NS;
    }
}

/* Worker 0. The listen fd is level-triggered: an accept that keeps failing (no fds, no
 * memory) would make this loop spin, so such failures take the listen fd out of epoll
 * for TCP_ACCEPT_BACKOFF_NS (worker_tick puts it back). Connections over the
 * tcp_max_accepted cap are accepted and closed at once, so their peers learn it now. */
static void tcp_accept(tcp_worker_t *w) {
    tcp_t *tp = w->tp;
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        int fd = accept4(tp->lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            int err = errno;
            if (err == EINTR || err == ECONNABORTED || err == EPROTO) continue;
            if (err == EAGAIN || err == EWOULDBLOCK) return;
            uint64_t now = ote_now_ns();
            (void)epoll_ctl(w->epfd, EPOLL_CTL_DEL, tp->lfd, NULL);
            tp->accept_resume_ns = now + TCP_ACCEPT_BACKOFF_NS;
            accept_warn(tp, now, "accept failed, pausing accepts for 100 ms", err);
            return;
        }
        if (atomic_load(&tp->naccepted) >= tp->cfg.tcp_max_accepted) {
            accept_warn(tp, ote_now_ns(), "tcp_max_accepted connections reached: closing a new connection", 0);
            close(fd);
            continue;
        }
        set_sockopts(tp, fd);
        tcp_conn_t *c = conn_new(tp, fd, ROLE_SOURCE);
        if (c == NULL) {
            close(fd);
            accept_warn(tp, ote_now_ns(), "out of memory accepting a connection: refusing it", 0);
            continue;
        }
        atomic_fetch_add(&tp->naccepted, 1); /* conn_free gives it back */
        c->born_ns = ote_now_ns();
        if (ote__addr_format((struct sockaddr *)&ss, c->from, sizeof(c->from)) != OTE_OK)
            snprintf(c->from, sizeof(c->from), "?");
        if (c->w == w) worker_attach(w, c);
        else worker_post(c->w, &c->attach_cmd);
    }
}

static void *worker_main(void *arg) {
    tcp_worker_t *w = arg;
    tcp_t *tp = w->tp;
    struct epoll_event evs[64];
    tl_worker = 1;
    w->next_tick = ote_now_ns() + TCP_TICK_NS;
    while (!atomic_load(&tp->stop)) {
        int n = epoll_wait(w->epfd, evs, 64, (int)(TCP_TICK_NS / OTE_NSEC_PER_MSEC));
        if (n < 0) {
            if (errno != EINTR) OTE_ERROR("tcp", "epoll_wait failed: %s", strerror(errno));
            n = 0;
        }
        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (p == &w->evfd) {
                uint64_t v;
                ssize_t r = read(w->evfd, &v, sizeof(v));
                (void)r;
                atomic_store(&w->woken, 0);
                worker_service(w);
            } else if (p == &tp->lfd) {
                tcp_accept(w);
            } else {
                tcp_conn_t *c = p;
                if (c->fd < 0) continue;
                uint32_t ev = evs[i].events;
                if (c->rx_paused && (ev & (EPOLLERR | EPOLLHUP))) { /* reported even when paused */
                    conn_kill(c, OTE_ERR_PEER_LOST);
                    continue;
                }
                if (ev & (EPOLLIN | EPOLLERR | EPOLLHUP)) conn_read(c);
                if (c->fd >= 0 && (ev & EPOLLOUT)) conn_flush(c);
                else if (c->fd >= 0 && c->role == ROLE_SOURCE && c->rcount) conn_flush(c);
            }
        }
        uint64_t now = ote_now_ns();
        if (now >= w->next_tick) {
            worker_tick(w, now);
            w->next_tick = now + TCP_TICK_NS;
        }
        worker_bury(w);
    }
    while (w->conns) conn_kill(w->conns, OTE_ERR_PEER_LOST);
    worker_bury(w);
    return NULL;
}

/* ---- requester connection setup ---------------------------------------------------- */

static ote_status_t wait_fd(int fd, short events, ote_deadline_t dl) {
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        int ms = ote_deadline_remaining_ms(dl, 1000);
        if (ms == 0 && ote_deadline_expired(dl)) return OTE_ERR_TIMEOUT;
        int r = poll(&p, 1, ms);
        if (r > 0) return OTE_OK;
        if (r < 0 && errno != EINTR) return ote_status_from_errno(errno);
    }
}

static ote_status_t send_all(int fd, const uint8_t *b, size_t len, ote_deadline_t dl) {
    while (len > 0) {
        ssize_t r = send(fd, b, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r > 0) {
            b += r;
            len -= (size_t)r;
            continue;
        }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            ote_status_t st = wait_fd(fd, POLLOUT, dl);
            if (st != OTE_OK) return st;
            continue;
        }
        return ote_status_make(OTE_ERR_PEER_LOST, errno);
    }
    return OTE_OK;
}

static ote_status_t recv_all(int fd, uint8_t *b, size_t len, ote_deadline_t dl) {
    while (len > 0) {
        ssize_t r = recv(fd, b, len, MSG_DONTWAIT);
        if (r > 0) {
            b += r;
            len -= (size_t)r;
            continue;
        }
        if (r == 0) return OTE_ERR_PEER_LOST;
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            ote_status_t st = wait_fd(fd, POLLIN, dl);
            if (st != OTE_OK) return st;
            continue;
        }
        return ote_status_make(OTE_ERR_PEER_LOST, errno);
    }
    return OTE_OK;
}

/* Connect one data connection of `p` and run the handshake. */
static ote_status_t conn_connect(tcp_peer_t *p, uint16_t index, uint64_t session,
                                 ote_deadline_t dl, tcp_conn_t **c_out) {
    tcp_t *tp = p->tp;
    ote_status_t st;
    if (ote_fault_hit("tcp.connect", &st)) return st;
    struct sockaddr_storage ss;
    socklen_t sl;
    st = ote__addr_resolve(p->addr, &ss, &sl);
    if (st != OTE_OK) return st;
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        st = ote_status_from_errno(errno);
        OTE_WARN("tcp", "socket() for %s failed: %s", p->addr, strerror(errno));
        return st;
    }
    set_sockopts(tp, fd);
    if (connect(fd, (struct sockaddr *)&ss, sl) != 0) {
        if (errno != EINPROGRESS) {
            int e = errno;
            OTE_WARN("tcp", "connect to %s failed: %s", p->addr, strerror(e));
            close(fd);
            return ote_status_make(OTE_ERR_CONNECT, e);
        }
        st = wait_fd(fd, POLLOUT, dl);
        int err = 0;
        socklen_t el = sizeof(err);
        if (st == OTE_OK && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0) err = errno;
        if (st != OTE_OK || err != 0) {
            OTE_WARN("tcp", "connect to %s failed: %s", p->addr,
                     st != OTE_OK ? "timed out" : strerror(err));
            close(fd);
            return st != OTE_OK ? OTE_ERR_TIMEOUT : ote_status_make(OTE_ERR_CONNECT, err);
        }
    }
    /* HELLO: our versions and the address the peer should name us by. */
    uint8_t buf[OTE_CTL_HDR_LEN + OTE_CTL_MAX_BODY];
    ote_ctl_msg_t hello;
    memset(&hello, 0, sizeof(hello));
    hello.version = OTE_CTL_VERSION_MAX;
    hello.opcode = OTE_CTL_HELLO;
    hello.req_id = 0;
    hello.u.hello.min_version = OTE_CTL_VERSION_MIN;
    hello.u.hello.max_version = OTE_CTL_VERSION_MAX;
    hello.u.hello.role = ROLE_REQUESTER;
    hello.u.hello.conn_index = index;
    hello.u.hello.session = session;
    hello.u.hello.addr = tp->addr;
    hello.u.hello.addr_len = (uint32_t)strlen(tp->addr);
    size_t len = 0;
    st = ote_ctl_encode(&hello, buf, sizeof(buf), &len);
    if (st == OTE_OK) st = send_all(fd, buf, len, dl);
    if (st == OTE_OK) st = recv_all(fd, buf, OTE_CTL_HDR_LEN, dl);
    ote_ctl_msg_t ack;
    size_t used = 0;
    if (st == OTE_OK) {
        st = ote_ctl_decode(buf, OTE_CTL_HDR_LEN, &ack, &used);
        if (st == OTE_ERR_AGAIN) {
            uint32_t body = (uint32_t)buf[20] | ((uint32_t)buf[21] << 8) | ((uint32_t)buf[22] << 16) |
                            ((uint32_t)buf[23] << 24);
            st = body > OTE_CTL_MAX_BODY ? OTE_ERR_PROTOCOL
                                         : recv_all(fd, buf + OTE_CTL_HDR_LEN, body, dl);
            if (st == OTE_OK) st = ote_ctl_decode(buf, OTE_CTL_HDR_LEN + body, &ack, &used);
        }
        if (st != OTE_OK && ote_status_scope(st) == OTE_SCOPE_REQUEST &&
            ote_status_code(st) != OTE_ERR_TIMEOUT)
            st = OTE_ERR_PROTOCOL;
    }
    uint16_t ver = 0;
    if (st == OTE_OK) {
        st = ote_ctl_check_hello_ack(&ack, OTE_CTL_VERSION_MIN, OTE_CTL_VERSION_MAX, &ver);
        if (st == OTE_ERR_PROTOCOL && ack.opcode == OTE_CTL_HELLO_ACK &&
            (ack.u.hello_ack.max_data < OTE_CTL_MIN_DATA || ack.u.hello_ack.max_data > OTE_CTL_MAX_DATA)) {
            OTE_ERROR("control",
                      "%s advertises max_data %u, outside [%u, %u]: refusing the peer",
                      p->addr, ack.u.hello_ack.max_data, OTE_CTL_MIN_DATA, OTE_CTL_MAX_DATA);
            close(fd);
            return st;
        }
        if (st == OTE_ERR_VERSION) {
            unsigned plo = ack.opcode == OTE_CTL_ERROR ? ack.u.error.min_version : ack.u.hello_ack.version;
            unsigned phi = ack.opcode == OTE_CTL_ERROR ? ack.u.error.max_version : ack.u.hello_ack.version;
            OTE_ERROR("control",
                      "protocol version mismatch with %s: this engine speaks versions %u..%u, the "
                      "peer %u..%u",
                      p->addr, OTE_CTL_VERSION_MIN, OTE_CTL_VERSION_MAX, plo, phi);
        }
    }
    if (st != OTE_OK) {
        if (st != OTE_ERR_VERSION)
            OTE_WARN("control", "handshake with %s failed: %s", p->addr, ote_status_str(st));
        close(fd);
        return st;
    }
    tcp_conn_t *c = conn_new(tp, fd, ROLE_REQUESTER);
    if (c == NULL) {
        close(fd);
        return OTE_ERR_NOMEM;
    }
    c->version = ver;
    c->index = index;
    c->peer = p;
    c->handshaken = 1;
    if (index == 0) {
        memcpy(p->remote_addr, ack.u.hello_ack.addr, ack.u.hello_ack.addr_len);
        p->remote_addr[ack.u.hello_ack.addr_len] = '\0';
        atomic_store(&p->max_data, ack.u.hello_ack.max_data); /* checked by check_hello_ack */
    }
    snprintf(c->from, sizeof(c->from), "%s", p->addr);
    *c_out = c;
    return OTE_OK;
}

/* Detach (through its worker) and free one requester connection. */
static ote_status_t conn_close(tcp_t *tp, tcp_conn_t *c) {
    ote_deadline_t dl = ote_deadline_after(10 * OTE_NSEC_PER_SEC);
    ote_mutex_lock(&tp->mu);
    if (!c->detached) {
        c->cmd_pending = 1;
        ote_mutex_unlock(&tp->mu);
        worker_post(c->w, &c->detach_cmd);
        ote_mutex_lock(&tp->mu);
    }
    while (!c->detached || c->cmd_pending) {
        if (ote_cond_wait(&tp->cv, &tp->mu, dl) == OTE_ERR_TIMEOUT &&
            (!c->detached || c->cmd_pending)) {
            ote_mutex_unlock(&tp->mu);
            OTE_ERROR("tcp", "worker did not release a connection within 10 s; keeping it");
            return OTE_ERR_TIMEOUT;
        }
    }
    ote_mutex_unlock(&tp->mu);
    conn_free(c);
    return OTE_OK;
}

/* Connect all p->n connections (p->lk held for writing or p private). */
static ote_status_t peer_connect_all(tcp_peer_t *p) {
    tcp_t *tp = p->tp;
    ote_deadline_t dl = ote_deadline_after(tp->cfg.connect_timeout_ms * OTE_NSEC_PER_MSEC);
    uint64_t session = atomic_fetch_add(&tp->session, 1);
    ote_status_t st = OTE_OK;
    uint32_t i;
    for (i = 0; i < p->n; i++) {
        st = conn_connect(p, (uint16_t)i, session, dl, &p->conns[i]);
        if (st != OTE_OK) break;
    }
    if (st != OTE_OK) {
        for (uint32_t j = 0; j < i; j++) {
            conn_free(p->conns[j]);
            p->conns[j] = NULL;
        }
        return st;
    }
    for (i = 0; i < p->n; i++) {
        tcp_conn_t *c = p->conns[i];
        c->w = &tp->workers[(atomic_fetch_add(&tp->rr, 1)) % tp->nworkers];
        worker_post(c->w, &c->attach_cmd);
    }
    return OTE_OK;
}

static ote_status_t peer_disconnect_all(tcp_peer_t *p) {
    ote_status_t first = OTE_OK;
    for (uint32_t i = 0; i < p->n; i++) {
        if (p->conns[i] == NULL) continue;
        ote_status_t st = conn_close(p->tp, p->conns[i]);
        if (st == OTE_OK) p->conns[i] = NULL;
        else if (first == OTE_OK) first = st;
    }
    return first;
}

/* ---- transport ops ----------------------------------------------------------------- */

static ote_status_t tcp_address(ote__transport_t *t, char *buf, size_t len) {
    tcp_t *tp = to_tcp(t);
    size_t n = strlen(tp->addr);
    if (n >= len) return OTE_ERR_TOO_BIG;
    memcpy(buf, tp->addr, n + 1);
    return OTE_OK;
}

static ote_status_t tcp_peer_open(ote__transport_t *t, const char *peer, ote__tpeer_t **peer_out) {
    tcp_t *tp = to_tcp(t);
    if (strlen(peer) >= OTE__ADDR_MAX) return OTE_ERR_INVALID;
    tcp_peer_t *p = ote_calloc(1, sizeof(*p));
    if (p == NULL) return OTE_ERR_NOMEM;
    p->conns = ote_calloc(tp->cfg.tcp_connections, sizeof(*p->conns));
    if (p->conns == NULL || pthread_rwlock_init(&p->lk, NULL) != 0) {
        ote_free(p->conns);
        ote_free(p);
        return OTE_ERR_NOMEM;
    }
    p->tp = tp;
    p->n = tp->cfg.tcp_connections;
    snprintf(p->addr, sizeof(p->addr), "%s", peer);
    ote_status_t st = peer_connect_all(p);
    if (st != OTE_OK) {
        pthread_rwlock_destroy(&p->lk);
        ote_free(p->conns);
        ote_free(p);
        return st;
    }
    OTE_INFO("tcp", "connected to %s (advertises %s) over %u connection(s)", p->addr, p->remote_addr,
             p->n);
    *peer_out = (ote__tpeer_t *)p;
    return OTE_OK;
}

static ote_status_t tcp_peer_ensure(ote__tpeer_t *tpeer) {
    tcp_peer_t *p = (tcp_peer_t *)tpeer;
    if (!atomic_load_explicit(&p->broken, memory_order_acquire)) return OTE_OK;
    pthread_rwlock_wrlock(&p->lk);
    ote_status_t st = OTE_OK;
    if (atomic_load(&p->broken)) {
        st = peer_disconnect_all(p);
        if (st == OTE_OK) {
            OTE_INFO("tcp", "reconnecting to %s", p->addr);
            atomic_store(&p->broken, 0);
            st = peer_connect_all(p);
            if (st != OTE_OK) atomic_store(&p->broken, 1);
        }
    }
    pthread_rwlock_unlock(&p->lk);
    return st;
}

static uint32_t tcp_peer_max_slice(ote__tpeer_t *tpeer) {
    tcp_peer_t *p = (tcp_peer_t *)tpeer;
    return atomic_load(&p->max_data); /* set by the handshake before the peer is visible */
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
    if (st != OTE_OK && !atomic_exchange(&c->qflag, 1)) worker_wake(c->w);
    req_complete_dropped(&dropped);
    return 1;
}

static void tcp_submit(ote__tpeer_t *tpeer, ote__slice_t *list) {
    tcp_peer_t *p = (tcp_peer_t *)tpeer;
    ote__slice_t *heads[TCP_MAX_CONNS] = {0}, *tails[TCP_MAX_CONNS] = {0};
    uint64_t bytes[TCP_MAX_CONNS] = {0};
    ote__slice_t *failed = NULL;
    if (pthread_rwlock_tryrdlock(&p->lk) != 0) {
        if (tl_worker) { /* the peer is being reconnected or closed: it was lost */
            complete_list(list, OTE_ERR_PEER_LOST);
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
        bytes[i] += (uint64_t)OTE_CTL_RW_FRAME_LEN + slice_payload(s);
        i = i + 1 == n ? 0 : i + 1;
    }
    for (i = 0; i < n; i++) {
        if (heads[i] == NULL) continue;
        tcp_conn_t *c = p->conns[i];
        if (c != NULL && !tl_worker && bytes[i] <= TCP_INLINE_MAX && req_send_inline(c, heads[i]))
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
            if (!atomic_exchange(&c->qflag, 1)) worker_wake(c->w);
        } else {
            tails[i]->next = failed;
            failed = heads[i];
        }
    }
    pthread_rwlock_unlock(&p->lk);
    if (failed) complete_list(failed, OTE_ERR_PEER_LOST);
    if (too_big) complete_list(too_big, OTE_ERR_TOO_BIG);
}

static void tcp_cancel(ote__tpeer_t *tpeer) {
    tcp_peer_t *p = (tcp_peer_t *)tpeer;
    pthread_rwlock_rdlock(&p->lk);
    for (uint32_t i = 0; i < p->n; i++) {
        tcp_conn_t *c = p->conns[i];
        if (c == NULL) continue;
        atomic_store(&c->purge, 1);
        atomic_store(&c->qflag, 1);
        worker_wake(c->w);
    }
    pthread_rwlock_unlock(&p->lk);
}

static ote_status_t tcp_peer_close(ote__tpeer_t *tpeer) {
    tcp_peer_t *p = (tcp_peer_t *)tpeer;
    pthread_rwlock_wrlock(&p->lk);
    ote_status_t st = peer_disconnect_all(p);
    pthread_rwlock_unlock(&p->lk);
    if (st != OTE_OK) return st;
    pthread_rwlock_destroy(&p->lk);
    ote_free(p->conns);
    ote_free(p);
    return OTE_OK;
}

static void tcp_destroy(ote__transport_t *t) {
    tcp_t *tp = to_tcp(t);
    atomic_store(&tp->stop, 1);
    for (uint32_t i = 0; i < tp->nworkers; i++)
        if (tp->workers[i].started) worker_wake(&tp->workers[i]);
    for (uint32_t i = 0; i < tp->nworkers; i++)
        if (tp->workers[i].started) pthread_join(tp->workers[i].th, NULL);
    for (uint32_t i = 0; i < tp->nworkers; i++) {
        tcp_worker_t *w = &tp->workers[i];
        /* Connections accepted but never attached: this thread owns them now. */
        for (tcp_cmd_t *cmd = w->chead; cmd; cmd = cmd->next)
            if (cmd->kind == CMD_ATTACH && cmd->c->role == ROLE_SOURCE) conn_free(cmd->c);
        w->chead = w->ctail = NULL;
        if (w->epfd >= 0) close(w->epfd);
        if (w->evfd >= 0) close(w->evfd);
        ote_mutex_destroy(&w->cmu);
    }
    if (tp->lfd >= 0) close(tp->lfd);
    ote_cond_destroy(&tp->cv);
    ote_mutex_destroy(&tp->mu);
    ote_free(tp->workers);
    ote_free(tp);
}

static const ote__transport_ops_t g_tcp_ops = {
    .name = "tcp",
    .address = tcp_address,
    .peer_open = tcp_peer_open,
    .peer_ensure = tcp_peer_ensure,
    .peer_max_slice = tcp_peer_max_slice,
    .submit = tcp_submit,
    .cancel = tcp_cancel,
    .peer_close = tcp_peer_close,
    .destroy = tcp_destroy,
};

/* The address peers should use: advertise_address if set (port 0 there means "the
 * port we listen on"), else the bound address, with a wildcard host replaced by the
 * loopback address of its family (set advertise_address on multi-host setups). */
static ote_status_t compute_address(tcp_t *tp, const struct sockaddr_storage *bound) {
    struct sockaddr_storage a = *bound;
    uint16_t port = a.ss_family == AF_INET ? ntohs(((struct sockaddr_in *)&a)->sin_port)
                                           : ntohs(((struct sockaddr_in6 *)&a)->sin6_port);
    if (tp->cfg.advertise_address[0]) {
        char host[256];
        uint16_t aport;
        int v6;
        ote_status_t st = ote__addr_split(tp->cfg.advertise_address, host, sizeof(host), &aport, &v6);
        if (st != OTE_OK) return st;
        int n = snprintf(tp->addr, sizeof(tp->addr), v6 ? "[%s]:%u" : "%s:%u", host,
                         aport ? aport : port);
        return (n > 0 && (size_t)n < sizeof(tp->addr)) ? OTE_OK : OTE_ERR_TOO_BIG;
    }
    if (a.ss_family == AF_INET) {
        struct sockaddr_in *a4 = (struct sockaddr_in *)&a;
        if (a4->sin_addr.s_addr == htonl(INADDR_ANY)) a4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    } else {
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&a;
        if (memcmp(&a6->sin6_addr, &in6addr_any, sizeof(in6addr_any)) == 0) a6->sin6_addr = in6addr_loopback;
    }
    return ote__addr_format((struct sockaddr *)&a, tp->addr, sizeof(tp->addr));
}

ote_status_t ote__tcp_create(const ote__cfg_t *cfg, const ote__host_t *host,
                             ote__transport_t **tp_out) {
    if (cfg == NULL || host == NULL || tp_out == NULL) return OTE_ERR_INVALID;
    ote_status_t st;
    tcp_t *tp = ote_calloc(1, sizeof(*tp));
    if (tp == NULL) return OTE_ERR_NOMEM;
    tp->base.ops = &g_tcp_ops;
    tp->cfg = *cfg;
    tp->host = *host;
    tp->lfd = -1;
    tp->sockbuf = pick_sockbuf();
    atomic_store(&tp->session, ((uint64_t)getpid() << 32) | (ote_now_ns() & 0xffffffffu));
    st = ote_mutex_init(&tp->mu);
    if (st != OTE_OK) goto err_free;
    st = ote_cond_init(&tp->cv);
    if (st != OTE_OK) goto err_mutex;

    struct sockaddr_storage ss;
    socklen_t sl;
    st = ote__addr_resolve(cfg->listen_address, &ss, &sl);
    if (st != OTE_OK) {
        OTE_ERROR("tcp", "cannot use listen_address \"%s\": %s", cfg->listen_address, ote_status_str(st));
        goto err_cond;
    }
    tp->lfd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (tp->lfd < 0) {
        st = ote_status_from_errno(errno);
        OTE_ERROR("tcp", "socket() for listen_address %s failed: %s", cfg->listen_address, strerror(errno));
        goto err_cond;
    }
    int one = 1;
    (void)setsockopt(tp->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(tp->lfd, (struct sockaddr *)&ss, sl) != 0 || listen(tp->lfd, 1024) != 0) {
        int e = errno;
        st = ote_status_make(e == EADDRINUSE ? OTE_ERR_BUSY : OTE_ERR_NATIVE, e);
        OTE_ERROR("tcp", "cannot listen on %s: %s", cfg->listen_address, strerror(e));
        goto err_sock;
    }
    struct sockaddr_storage bound;
    socklen_t bl = sizeof(bound);
    if (getsockname(tp->lfd, (struct sockaddr *)&bound, &bl) != 0) {
        st = ote_status_from_errno(errno);
        goto err_sock;
    }
    st = compute_address(tp, &bound);
    if (st != OTE_OK) goto err_sock;

    tp->nworkers = cfg->tcp_workers;
    tp->workers = ote_calloc(tp->nworkers, sizeof(*tp->workers));
    if (tp->workers == NULL) {
        st = OTE_ERR_NOMEM;
        goto err_sock;
    }
    for (uint32_t i = 0; i < tp->nworkers; i++) {
        tcp_worker_t *w = &tp->workers[i];
        w->tp = tp;
        w->idx = i;
        w->epfd = epoll_create1(EPOLL_CLOEXEC);
        w->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        ote_status_t mst = ote_mutex_init(&w->cmu);
        if (w->epfd < 0 || w->evfd < 0 || mst != OTE_OK) {
            st = mst != OTE_OK ? mst : ote_status_from_errno(errno);
            OTE_ERROR("tcp", "cannot create worker %u: %s", i, ote_status_str(st));
            if (mst == OTE_OK) ote_mutex_destroy(&w->cmu);
            if (w->epfd >= 0) close(w->epfd);
            if (w->evfd >= 0) close(w->evfd);
            tp->nworkers = i;
            goto err_workers;
        }
        struct epoll_event e = {.events = EPOLLIN, .data.ptr = &w->evfd};
        if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->evfd, &e) != 0) {
            st = ote_status_from_errno(errno);
            tp->nworkers = i + 1;
            goto err_workers;
        }
        if (i == 0) {
            struct epoll_event le = {.events = EPOLLIN, .data.ptr = &tp->lfd};
            if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, tp->lfd, &le) != 0) {
                st = ote_status_from_errno(errno);
                tp->nworkers = i + 1;
                goto err_workers;
            }
        }
    }
    for (uint32_t i = 0; i < tp->nworkers; i++) {
        tcp_worker_t *w = &tp->workers[i];
        int rc = pthread_create(&w->th, NULL, worker_main, w);
        if (rc != 0) {
            st = ote_status_from_errno(rc);
            OTE_ERROR("tcp", "cannot start worker thread %u: %s", i, strerror(rc));
            goto err_workers;
        }
        w->started = 1;
    }
    OTE_INFO("tcp", "listening on %s (advertised %s), %u worker(s), %u connection(s) per peer",
             cfg->listen_address, tp->addr, tp->nworkers, cfg->tcp_connections);
    *tp_out = &tp->base;
    return OTE_OK;

err_workers:
    tcp_destroy(&tp->base); /* stops started workers, closes everything */
    return st;
err_sock:
    close(tp->lfd);
err_cond:
    ote_cond_destroy(&tp->cv);
err_mutex:
    ote_mutex_destroy(&tp->mu);
err_free:
    ote_free(tp);
    return st;
}

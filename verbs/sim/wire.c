/*
 * verbs/sim/wire.c - the sim's transport core: connections over abstract UNIX stream
 * sockets (create, close, detach from a QP), the transmit queue of frames, revocation of
 * zero-copy references, and the progress threads that drive everything under prov->mu (the
 * copies run outside it: the I/O sections below, sim_internal.h).
 * The requester (wire_req.c), the responder (wire_resp.c) and the receive engine
 * (wire_rx.c) are the other jobs of the transport; sim_internal.h has what they share.
 *
 * Each RC QP that sends opens its own connection to the listener of the destination
 * GID and names the destination QP and itself in a HELLO (accepted only from that QP's
 * RTR destination, see wire_resp.c); requests flow on it and the responder answers (ACK,
 * NAK, READ response) on the same connection. Messages carry PSNs; the responder
 * executes only the expected PSN and silently drops anything else, so the requester's
 * go-back (after an RNR NAK) and a PSN mismatch behave as on a NIC. Payloads travel from
 * registered memory to registered memory with sendmsg/readv, no per-byte work between.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "verbs/sim/sim_internal.h"

#define SIM_SOCKBUF (8 * 1024 * 1024)
#define SIM_TX_IOV 64

static void rresp_cancel(sim_prov_t *p, sim_conn_t *c, bool nak);

static _Thread_local int t_self = -1; /* index of this progress thread; -1: not one */
static _Thread_local bool t_bw_pass;  /* in this thread's round-robin pass: limited ports
                                       * send only then */
static _Atomic(ote_sim_copy_hook_t) g_copy_hook;
static void *_Atomic g_copy_hook_arg;

int ote__sim_self(void) { return t_self; }

void ote_sim_set_copy_hook(ote_sim_copy_hook_t fn, void *arg) {
    atomic_store(&g_copy_hook_arg, arg);
    atomic_store(&g_copy_hook, fn);
}

void ote__sim_wake_thr(sim_prov_t *p, int t) {
    sim_thr_t *th = &p->thr[t];
    atomic_store(&th->pending, true);
    if (!atomic_load(&th->parked)) return; /* it reads pending before it parks */
    uint64_t one = 1;
    ssize_t r = write(t == 0 ? p->wake_efd : th->wake_efd, &one, sizeof(one));
    (void)r; /* a full counter already means "wake" */
}

void ote__sim_wake(sim_prov_t *p) {
    ote__sim_wake_thr(p, 0);
    for (int t = 1; t < p->nthr; t++) ote__sim_wake_thr(p, t);
}

static int thr_epfd(const sim_prov_t *p, int t) { return t == 0 ? p->epfd : p->thr[t].epfd; }

/* ---- I/O sections (sim_internal.h) ---- */

void ote__sim_io_enter(sim_prov_t *p, sim_conn_t *c, int dir, size_t len) {
    uint32_t qpn = c->qp ? c->qp->ibqp.qp_num : 0;
    ote_mutex_lock(&c->io_mu);
    c->io_busy = true;
    c->io_tx = dir == OTE_SIM_COPY_TX;
    ote_mutex_unlock(&p->mu);
    ote_sim_copy_hook_t hook = atomic_load(&g_copy_hook);
    if (hook) hook(atomic_load(&g_copy_hook_arg), qpn, dir, len);
}

void ote__sim_io_leave(sim_prov_t *p, sim_conn_t *c) {
    ote_mutex_unlock(&c->io_mu);
    ote_mutex_lock(&p->mu);
    c->io_busy = false;
}

void ote__sim_io_wait(sim_conn_t *c) {
    if (!c->io_busy) return;
    ote_mutex_lock(&c->io_mu); /* the owner holds it until its copy is done */
    ote_mutex_unlock(&c->io_mu);
}

bool ote__sim_port_up(sim_qp_t *qp) {
    sim_dev_t *d = qp->ctx->dev;
    int port = qp->attr.port_num;
    if (port < 1 || port > d->nports) return false;
    return d->ports[port - 1].state == IBV_PORT_ACTIVE;
}

/* ---- listeners and connections ---- */

ote_status_t ote__sim_listener_add(sim_prov_t *p, sim_listener_t *l) {
    l->kind = SIM_FD_LISTENER;
    /* tagged (low bit): the progress thread checks the listener is still there before it
     * reads it (a port change may remove it while the event waits) */
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = (uint64_t)(uintptr_t)l | 1u};
    if (epoll_ctl(p->epfd, EPOLL_CTL_ADD, l->fd, &ev) != 0)
        return ote_status_make(OTE_ERR_NATIVE, errno);
    p->nlisteners++;
    return OTE_OK;
}

void ote__sim_listener_del(sim_prov_t *p, sim_listener_t *l) {
    epoll_ctl(p->epfd, EPOLL_CTL_DEL, l->fd, NULL);
    close(l->fd);
    p->nlisteners--;
    /* Connections accepted through it keep a pointer; clear it. */
    sim_conn_t *c;
    DL_FOREACH(p->conns, c) if (c->via == l) c->via = NULL;
    ote_free(l);
}

void ote__sim_set_bufs(int fd) {
    int sz = SIM_SOCKBUF;
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &sz, sizeof(sz)) != 0)
        (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &sz, sizeof(sz)) != 0)
        (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
}

static void conn_mem_free(sim_conn_t *c, bool mu) {
    if (mu) ote_mutex_destroy(&c->io_mu);
    ote_free(c->rbuf);
    ote_free(c->div);
    ote_free(c->div_own);
    ote_free(c);
}

sim_conn_t *ote__sim_conn_new(sim_prov_t *p, int fd, int owner) {
    sim_conn_t *c = ote_calloc(1, sizeof(*c));
    if (!c) return NULL;
    c->rbuf = ote_malloc(SIM_RXBUF);
    c->div_cap = SIM_MAX_SGE + 1;
    c->div = ote_calloc((size_t)c->div_cap, sizeof(*c->div));
    c->div_own = ote_calloc((size_t)c->div_cap, sizeof(*c->div_own));
    if (!c->rbuf || !c->div || !c->div_own) {
        conn_mem_free(c, false);
        return NULL;
    }
    if (ote_mutex_init(&c->io_mu) != OTE_OK) {
        conn_mem_free(c, false);
        return NULL;
    }
    c->kind = SIM_FD_CONN;
    c->fd = fd;
    c->p = p;
    c->owner = owner >= 0 && owner < p->nthr ? owner : 0;
    c->ev_mask = EPOLLIN;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    if (epoll_ctl(thr_epfd(p, c->owner), EPOLL_CTL_ADD, fd, &ev) != 0) {
        conn_mem_free(c, true);
        return NULL;
    }
    DL_APPEND(p->conns, c);
    return c;
}

void ote__sim_conn_move(sim_prov_t *p, sim_conn_t *c, int t) {
    if (t < 0 || t >= p->nthr || t == c->owner || c->dead) return;
    struct epoll_event ev = {.events = c->ev_mask, .data.ptr = c};
    if (epoll_ctl(thr_epfd(p, t), EPOLL_CTL_ADD, c->fd, &ev) != 0) return; /* stays */
    epoll_ctl(thr_epfd(p, c->owner), EPOLL_CTL_DEL, c->fd, NULL);
    c->owner = t;
    c->kick = true; /* bytes may wait in its staging buffer with none in the socket */
    ote__sim_wake_thr(p, t);
}

/* Mark dead; the progress thread frees it between epoll batches. */
void ote__sim_conn_close(sim_prov_t *p, sim_conn_t *c) {
    (void)p;
    if (c->dead) return;
    ote__sim_io_wait(c); /* its copy in flight ends before its receive WQE goes back */
    c->dead = true;
    ote__sim_srq_give_back(c); /* a message in progress never completes now */
    if (c->qp && c->requester && c->qp->req == c) {
        c->qp->req = NULL;
        c->qp->conn_lost = true;
        c->qp->lost_at_ns = ote_now_ns();
    }
    c->qp = NULL;
    shutdown(c->fd, SHUT_RDWR);
}

static void conn_free(sim_prov_t *p, sim_conn_t *c) {
    epoll_ctl(thr_epfd(p, c->owner), EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    while (c->tx_head) {
        sim_frame_t *f = c->tx_head;
        c->tx_head = f->next;
        ote_free(f);
    }
    DL_DELETE(p->conns, c);
    conn_mem_free(c, true);
}

/* Free the dead connections of thread t (only their owner may: it holds no copy then, and
 * no other thread keeps a pointer to them across a release of prov->mu). */
static void reap(sim_prov_t *p, int t) {
    sim_conn_t *c, *tmp;
    DL_FOREACH_SAFE(p->conns, c, tmp) if (c->dead && c->owner == t) conn_free(p, c);
}

void ote__sim_qp_detach(sim_qp_t *qp, bool responder_too) {
    sim_prov_t *p = qp->p;
    if (qp->req) {
        sim_conn_t *c = qp->req;
        qp->req = NULL;
        c->qp = NULL;
        ote__sim_conn_close(p, c);
    }
    qp->conn_lost = false;
    qp->peer_dropped = false; /* words of the old connection's responder */
    sim_conn_t *c;
    DL_FOREACH(p->conns, c) {
        if (c->requester || c->qp != qp || c->dead) continue;
        if (responder_too) {
            c->qp = NULL;
            ote__sim_conn_close(p, c);
            continue;
        }
        /* ERR: the connection stays (a NAK may be queued on it) but the QP touches no
         * more memory: its READ response is withdrawn and an inbound payload dropped. */
        ote__sim_io_wait(c);
        if (c->rresp) rresp_cancel(p, c, false);
        if (c->rx == RX_PAYLOAD) c->idiv = c->ndiv;
    }
    ote__sim_wake(p);
}

/* ---- transmit ---- */

sim_frame_t *ote__sim_frame_new(int npay) {
    size_t n = (size_t)npay + 1;
    sim_frame_t *f = ote_calloc(1, sizeof(*f) + n * sizeof(struct iovec) + n * sizeof(void *));
    if (!f) return NULL;
    f->own = (const void **)(void *)((char *)f->iov + n * sizeof(struct iovec));
    f->iov[0].iov_base = &f->hdr;
    f->iov[0].iov_len = sizeof(f->hdr);
    f->niov = 1;
    f->total = sizeof(f->hdr);
    return f;
}

/* own: the MR or MW under whose access the bytes are read (NULL for the sim's memory). */
void ote__sim_frame_add(sim_frame_t *f, void *base, size_t len, const void *own) {
    if (len == 0) return;
    f->iov[f->niov].iov_base = base;
    f->iov[f->niov].iov_len = len;
    f->own[f->niov] = own;
    f->niov++;
    f->total += len;
}

void ote__sim_conn_queue(sim_conn_t *c, sim_frame_t *f) {
    f->next = NULL;
    if (c->tx_tail) c->tx_tail->next = f;
    else c->tx_head = f;
    c->tx_tail = f;
}

/* Register what the connection waits for: input unless the next request must wait for a
 * READ response (level-triggered epoll would spin on unread input), output while frames
 * are pending. */
void ote__sim_conn_events(sim_prov_t *p, sim_conn_t *c) {
    uint32_t m = (c->rx_blocked ? 0 : EPOLLIN) | (c->want_out ? EPOLLOUT : 0);
    if (m == c->ev_mask || c->dead) return;
    c->ev_mask = m;
    struct epoll_event ev = {.events = m, .data.ptr = c};
    epoll_ctl(thr_epfd(p, c->owner), EPOLL_CTL_MOD, c->fd, &ev);
}

static void conn_want_out(sim_prov_t *p, sim_conn_t *c, bool on) {
    c->want_out = on;
    ote__sim_conn_events(p, c);
}

void ote__sim_conn_touch(sim_conn_t *c) {
    if (c->requester && c->qp) c->qp->progress_ns = ote_now_ns();
}

/* ---- egress limit of a port ----
 *
 * A port with a limit (config bw=, ote_sim_set_port_bw) hands its connections' bytes to
 * their sockets only against tokens that refill at the port's rate, up to a burst of
 * max(4 quanta, 10 ms of traffic) (a quantum is 1 ms of traffic, 4 KiB to 256 KiB).
 * A connection that finds too few tokens for its next quantum (or its whole next frame,
 * if smaller) registers no EPOLLOUT and sets the port's wake time; the progress thread
 * sleeps in epoll_wait until then (no spinning). A limited port's connections send only
 * in the progress thread's pass over its connection list (a send from anywhere else,
 * e.g. right after a post or an ACK, asks for that pass at once), at most two quanta per
 * call, and the list rotates every pass, so the connections of a port share it
 * round-robin and none starves into a retry timeout. */

static sim_port_t *conn_port(const sim_conn_t *c) {
    sim_dev_t *d = NULL;
    int port = 0;
    if (!c->requester && c->via) {
        d = c->via->dev;
        port = c->via->port;
    } else if (c->qp) {
        d = c->qp->ctx->dev;
        port = c->qp->attr.port_num;
    }
    if (!d || port < 1 || port > d->nports) return NULL;
    return &d->ports[port - 1];
}

static double bw_quantum(const sim_port_t *pt) {
    double q = (double)pt->bw / 1000.0;
    if (q < 4096.0) q = 4096.0;
    if (q > 262144.0) q = 262144.0;
    return q;
}

static void bw_refill(sim_port_t *pt, uint64_t now) {
    double q = bw_quantum(pt);
    double burst = (double)pt->bw / 100.0;
    if (burst < 4 * q) burst = 4 * q;
    if (pt->bw_last_ns == 0 || now < pt->bw_last_ns) {
        pt->bw_tokens = q;
    } else {
        pt->bw_tokens += (double)(now - pt->bw_last_ns) * (double)pt->bw / 1e9;
        if (pt->bw_tokens > burst) pt->bw_tokens = burst;
    }
    pt->bw_last_ns = now;
}

static void bw_wake_at(sim_port_t *pt, uint64_t at) {
    uint64_t *w = &pt->bw_wake_ns[t_self >= 0 ? t_self : 0];
    if (*w == 0 || at < *w) *w = at;
}

/* How many bytes c may hand to its socket now (SIZE_MAX: no limit); 0 = throttled (the
 * port's wake time is set). sent: bytes this call already sent. */
static size_t bw_allow(sim_port_t *pt, const sim_conn_t *c, size_t sent) {
    if (!pt || pt->bw == 0) return SIZE_MAX;
    uint64_t now = ote_now_ns();
    bw_refill(pt, now);
    double q = bw_quantum(pt);
    double head = (double)(c->tx_head->total - c->tx_head->done);
    double need = head < q ? head : q;
    /* Not its turn (outside the pass, or its share of this pass taken) or too few tokens:
     * the pass runs again as soon as there are enough. */
    if (!t_bw_pass || (double)sent >= 2 * q || pt->bw_tokens < need) {
        uint64_t wait = pt->bw_tokens >= need
                            ? 0
                            : (uint64_t)((need - pt->bw_tokens) * 1e9 / (double)pt->bw) + 1;
        bw_wake_at(pt, now + wait);
        return 0;
    }
    double allow = pt->bw_tokens < q ? pt->bw_tokens : q;
    return allow < 1.0 ? 1 : (size_t)allow;
}

static size_t tx_bytes(const struct iovec *iov, int n) {
    size_t t = 0;
    for (int i = 0; i < n; i++) t += iov[i].iov_len;
    return t;
}

/* Payload bytes (past the header and its small extra, iov[0]) among bytes [from, to) of f. */
static uint64_t frame_payload(const sim_frame_t *f, size_t from, size_t to) {
    size_t h = f->iov[0].iov_len;
    if (to <= h) return 0;
    return (uint64_t)(to - (from > h ? from : h));
}

/* A cancel of the READ response asked while this thread's send was not counted yet:
 * applied now that it is (the frame is gone if it was fully sent). */
static void tx_cancel_asked(sim_prov_t *p, sim_conn_t *c) {
    uint8_t ask = c->rresp_cancel_ask;
    c->rresp_cancel_ask = 0;
    if (ask != 0 && !c->dead) rresp_cancel(p, c, ask == 2);
}

void ote__sim_conn_tx(sim_prov_t *p, sim_conn_t *c) {
    if (c->owner != t_self) return; /* only its owner touches its socket (it was kicked) */
    sim_port_t *pt = conn_port(c);
    size_t sent = 0;
    while (c->tx_head && !c->dead) {
        tx_cancel_asked(p, c);
        if (!c->tx_head || c->dead) break;
        size_t cap = bw_allow(pt, c, sent);
        if (cap == 0) {
            conn_want_out(p, c, false); /* woken by the port's timer, not by EPOLLOUT */
            return;
        }
        struct iovec iov[SIM_TX_IOV];
        int n = 0;
        size_t room = cap;
        for (sim_frame_t *f = c->tx_head; f && n < SIM_TX_IOV && room > 0; f = f->next) {
            size_t skip = f->done;
            for (int i = 0; i < f->niov && n < SIM_TX_IOV && room > 0; i++) {
                size_t l = f->iov[i].iov_len;
                if (skip >= l) {
                    skip -= l;
                    continue;
                }
                size_t take = l - skip < room ? l - skip : room;
                iov[n].iov_base = (char *)f->iov[i].iov_base + skip;
                iov[n].iov_len = take;
                room -= take;
                skip = 0;
                n++;
            }
        }
        struct msghdr mh;
        memset(&mh, 0, sizeof(mh));
        mh.msg_iov = iov;
        mh.msg_iovlen = (size_t)n;
        ote__sim_io_enter(p, c, OTE_SIM_COPY_TX, tx_bytes(iov, n));
        ssize_t w = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        int err = errno;
        ote__sim_io_leave(p, c);
        if (w < 0) {
            if (err == EINTR) continue;
            if (err == EAGAIN || err == EWOULDBLOCK) {
                tx_cancel_asked(p, c);
                conn_want_out(p, c, true);
                return;
            }
            ote__sim_conn_close(p, c);
            return;
        }
        ote__sim_conn_touch(c);
        sent += (size_t)w;
        if (pt) {
            pt->tx_bytes += (uint64_t)w;
            if (pt->bw) pt->bw_tokens -= (double)w;
        }
        size_t left = (size_t)w;
        while (left > 0 && c->tx_head) {
            sim_frame_t *f = c->tx_head;
            size_t rem = f->total - f->done;
            size_t take = left < rem ? left : rem;
            if (pt) pt->tx_payload += frame_payload(f, f->done, f->done + take);
            if (left < rem) {
                f->done += left;
                left = 0;
                break;
            }
            left -= rem;
            c->tx_head = f->next;
            if (!c->tx_head) c->tx_tail = NULL;
            if (f == c->rresp) c->rresp = NULL; /* fully handed to the kernel */
            ote_free(f);
        }
    }
    tx_cancel_asked(p, c);
    conn_want_out(p, c, false);
}

/* ---- revocation ----
 *
 * Payloads move zero-copy: a READ response or a request is read from registered memory
 * when the socket takes it, an inbound payload is read straight into its destination. Every
 * such reference records the MR or MW that granted it; the references change only under
 * prov->mu and a copy through them runs in its connection's I/O section, so revoking that
 * MR/MW (dereg, dealloc, invalidation) or moving the QP to ERR waits for the copy in flight
 * on it (ote__sim_io_wait) and drops the references: once the verb returns, no byte of that
 * memory is read or written. A responder also starts no request on a connection before the READ response
 * ahead of it is fully sent (requests execute in order, as on a NIC), so a pipelined
 * SEND_WITH_INV cannot revoke a window under its own READ. */

static void rresp_cancel(sim_prov_t *p, sim_conn_t *c, bool nak) {
    sim_frame_t *f = c->rresp;
    if (!f) return;
    if (c->io_busy && c->io_tx) {
        /* The owner's send ended (the caller waited for it) but what it took is not
         * counted yet: the frame may be fully sent (ci27: a READ the requester had
         * completed, its connection closed by the MR's dereg). The owner applies this
         * once it has counted (conn_tx); it sends nothing more before. */
        if (c->rresp_cancel_ask != 2) c->rresp_cancel_ask = nak ? 2 : 1;
        return;
    }
    c->rresp = NULL;
    /* The header is out: the rest cannot be sent, end the stream. */
    if (f->done > 0) {
        ote__sim_conn_close(p, c);
        return;
    }
    if (nak) { /* not started: answer as if the access had been checked now */
        f->hdr.type = SIM_MSG_NAK;
        f->hdr.syndrome = SIM_NAK_ACCESS;
        f->hdr.len = 0;
        f->niov = 1;
        f->total = f->iov[0].iov_len;
        return;
    }
    /* The QP left RTS: no answer, only the word that it was dropped (SIM_MSG_DROP). */
    f->hdr.type = SIM_MSG_DROP;
    f->hdr.len = 0;
    f->niov = 1;
    f->total = f->iov[0].iov_len;
}

static bool frames_use(const sim_conn_t *c, const void *obj) {
    for (const sim_frame_t *f = c->tx_head; f; f = f->next)
        for (int i = 1; i < f->niov; i++)
            if (f->own[i] == obj) return true;
    return false;
}

static bool div_uses(const sim_conn_t *c, const void *obj) {
    if (c->rx != RX_PAYLOAD) return false;
    for (int i = c->idiv; i < c->ndiv; i++)
        if (c->div_own[i] == obj) return true;
    return false;
}

void ote__sim_revoke(sim_prov_t *p, const void *obj, bool is_mw) {
    sim_conn_t *c;
    DL_FOREACH(p->conns, c) {
        bool rx = div_uses(c, obj), tx = frames_use(c, obj);
        if (!rx && !tx) continue;
        ote__sim_io_wait(c); /* a copy into or out of obj in flight ends first */
        if (c->dead) continue;
        if (rx) {
            c->idiv = c->ndiv; /* the rest is read and dropped */
            c->act_revoked = true;
        }
        if (c->requester) {
            /* requests read local SGEs (MRs only); a partly queued stream cannot be
             * patched: close it and let the WRs fail */
            if (!is_mw && tx) ote__sim_conn_close(p, c);
        } else if (c->rresp && c->rresp->niov > 1 && c->rresp->own[1] == obj) {
            rresp_cancel(p, c, true);
        }
    }
}

void ote__sim_send_ctl(sim_prov_t *p, sim_conn_t *c, uint8_t type, uint32_t psn, uint8_t syndrome,
                       uint32_t imm) {
    sim_frame_t *f = ote__sim_frame_new(0);
    if (!f) {
        /* Out of memory: the link fails (the requester's QPs on it see their connection
         * lost and end in RETRY_EXC_ERR), rather than a silence taken for a slow NIC. */
        OTE_WARN(SIM_LOG, "sim: response lost (out of memory): connection closed");
        ote__sim_conn_close(p, c);
        return;
    }
    f->hdr.type = type;
    f->hdr.psn = psn;
    f->hdr.syndrome = syndrome;
    f->hdr.imm = imm;
    f->hdr.gen = c->h.gen; /* the answer to the request in c->h */
    ote__sim_conn_queue(c, f);
    (void)p;
}

/* ---- the progress thread ---- */

/* Whether l is still one of the instance's listeners (an event may name one that a port
 * change removed while this thread was away from prov->mu). */
static bool listener_live(sim_prov_t *p, const sim_listener_t *l) {
    for (int i = 0; i < p->cfg.ndev; i++)
        for (int j = 0; j < p->cfg.devs[i].nports; j++)
            for (int k = 0; k < SIM_GID_TBL_LEN; k++)
                if (p->cfg.devs[i].ports[j].listeners[k] == l) return true;
    return false;
}

static void accept_all(sim_prov_t *p, sim_listener_t *l) {
    for (;;) {
        int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        ote__sim_set_bufs(fd);
        sim_conn_t *c = ote__sim_conn_new(p, fd, t_self);
        if (!c) {
            close(fd);
            continue;
        }
        c->via = l;
    }
}

/* Receive (when readable), send, and resume a receive that waited for a READ response. */
static void conn_service(sim_prov_t *p, sim_conn_t *c, bool readable) {
    for (int round = 0; round < 16 && !c->dead && c->owner == t_self; round++) {
        if (c->rx_blocked && !c->rresp) {
            c->rx_blocked = false;
            ote__sim_conn_events(p, c);
            readable = true; /* requests may wait in rbuf with nothing left in the socket */
        }
        if (readable && !c->rx_blocked) ote__sim_conn_rx(p, c);
        if (!c->dead && c->tx_head) ote__sim_conn_tx(p, c);
        if (c->dead || !c->rx_blocked || c->rresp) return;
        readable = false;
    }
}

static int next_timeout_ms(sim_prov_t *p, int t, uint64_t now) {
    int ms = 1000;
    sim_qp_t *qp;
    DL_FOREACH2(p->qp_list, qp, next) {
        if (qp->rnr_until_ns) {
            uint64_t d = qp->rnr_until_ns > now ? qp->rnr_until_ns - now : 0;
            int m = (int)((d + OTE_NSEC_PER_MSEC - 1) / OTE_NSEC_PER_MSEC);
            if (m < ms) ms = m;
        }
        if (qp->sq_head != qp->sq_tail && ms > 5) ms = 5;
    }
    for (int i = 0; i < p->cfg.ndev; i++) {
        sim_dev_t *d = &p->cfg.devs[i];
        for (int j = 0; j < d->nports; j++) {
            uint64_t at = d->ports[j].bw_wake_ns[t];
            if (!at) continue;
            uint64_t dl = at > now ? at - now : 0;
            int m = (int)((dl + OTE_NSEC_PER_MSEC - 1) / OTE_NSEC_PER_MSEC);
            if (m < ms) ms = m;
        }
    }
    return ms;
}

/* Whether thread t pumps qp's send queue: its connection's owner does (the only thread
 * that sends on it); while it has none, any thread does (the first opens one, given to the
 * threads in turn), so a thread held in a long copy delays no other QP's start. */
static bool pumps(const sim_qp_t *qp, int t) {
    return !qp->req || qp->req->dead || qp->req->owner == t;
}

/* The events of one epoll batch of thread t. Only t services (or frees) its connections,
 * so a connection named in the batch outlives the releases of prov->mu during it. */
static void progress_events(sim_prov_t *p, sim_thr_t *t, struct epoll_event *evs, int n) {
    for (int i = 0; i < n; i++) {
        if (evs[i].data.u64 & 1u) {
            sim_listener_t *l = (sim_listener_t *)(uintptr_t)(evs[i].data.u64 & ~(uint64_t)1);
            if (listener_live(p, l)) accept_all(p, l);
            continue;
        }
        int kind = *(int *)evs[i].data.ptr;
        if (kind == SIM_FD_WAKE) {
            uint64_t x;
            ssize_t r = read(t->wake_efd, &x, sizeof(x));
            (void)r;
        } else {
            sim_conn_t *c = evs[i].data.ptr;
            if (c->dead || c->owner != t->idx) continue;
            conn_service(p, c, (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) != 0);
        }
    }
}

static bool others_in_pass(const sim_prov_t *p, int self) {
    for (int i = 0; i < p->nthr; i++)
        if (i != self && p->thr[i].in_pass) return true;
    return false;
}

static void progress_round(sim_prov_t *p, sim_thr_t *t) {
    uint64_t now = ote_now_ns();
    sim_qp_t *qp;
    /* No release of prov->mu in here: the QP list may change only between rounds. */
    DL_FOREACH2(p->qp_list, qp, next) if (pumps(qp, t->idx)) ote__sim_req_pump(p, qp, now);
    sim_conn_t *c;
    t_bw_pass = true;
    t->in_pass = true;
    DL_FOREACH(p->conns, c) {
        if (c->dead || c->owner != t->idx || !(c->tx_head || c->rx_blocked || c->kick)) continue;
        bool readable = c->kick;
        c->kick = false;
        conn_service(p, c, readable); /* c stays in the list: only t frees it */
    }
    t->in_pass = false;
    t_bw_pass = false;
    /* Round-robin: another goes first. Not while another thread walks the list: moving
     * the connection it stands on to the tail would end its pass there (the rest of its
     * connections would wait for an event or the next timeout). */
    if (t->idx == 0 && p->conns && p->conns->next && !others_in_pass(p, t->idx)) {
        sim_conn_t *h = p->conns;
        DL_DELETE(p->conns, h);
        DL_APPEND(p->conns, h);
    }
    ote__sim_handle_overflow(p);
    reap(p, t->idx);
}

static void *progress_main(void *arg) {
    sim_thr_t *t = arg;
    sim_prov_t *p = t->p;
    t_self = t->idx;
    struct epoll_event evs[64];
    ote_mutex_lock(&p->mu);
    while (!atomic_load(&p->stop)) {
        int tmo = next_timeout_ms(p, t->idx, ote_now_ns());
        ote_mutex_unlock(&p->mu);
        atomic_store(&t->parked, true);
        if (atomic_exchange(&t->pending, false)) tmo = 0; /* woken while it ran */
        int n = epoll_wait(t->epfd, evs, 64, tmo);
        atomic_store(&t->parked, false);
        /* The round below sees what came before: every waker publishes its work under
         * prov->mu (or sets p->stop) before it wakes. */
        atomic_store(&t->pending, false);
        ote_mutex_lock(&p->mu);
        for (int i = 0; i < p->cfg.ndev; i++) /* throttled connections set it again */
            for (int j = 0; j < p->cfg.devs[i].nports; j++)
                p->cfg.devs[i].ports[j].bw_wake_ns[t->idx] = 0;
        progress_events(p, t, evs, n);
        progress_round(p, t);
    }
    ote_mutex_unlock(&p->mu);
    return NULL;
}

static ote_status_t thr_open(sim_prov_t *p, int i) {
    sim_thr_t *t = &p->thr[i];
    t->kind = SIM_FD_WAKE;
    t->idx = i;
    t->p = p;
    if (i == 0) { /* the instance's own epoll set and wake fd (sim.c) */
        t->epfd = p->epfd;
        t->wake_efd = p->wake_efd;
        return OTE_OK;
    }
    t->epfd = epoll_create1(EPOLL_CLOEXEC);
    t->wake_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &t->kind};
    if (t->epfd < 0 || t->wake_efd < 0 ||
        epoll_ctl(t->epfd, EPOLL_CTL_ADD, t->wake_efd, &ev) != 0) {
        ote_status_t st = ote_status_make(OTE_ERR_NATIVE, errno);
        if (t->epfd >= 0) close(t->epfd);
        if (t->wake_efd >= 0) close(t->wake_efd);
        return st;
    }
    return OTE_OK;
}

ote_status_t ote__sim_wire_start(sim_prov_t *p) {
    for (int i = p->nthr; i < SIM_THREADS; i++) {
        ote_status_t st = thr_open(p, i);
        if (st != OTE_OK) return st;
        p->nthr = i + 1;
    }
    for (int i = 0; i < p->nthr; i++) {
        int rc = pthread_create(&p->thr[i].thread, NULL, progress_main, &p->thr[i]);
        if (rc != 0) return ote_status_make(OTE_ERR_NATIVE, rc); /* wire_stop joins */
        p->thr[i].started = true;
        char name[16];
        snprintf(name, sizeof(name), "ote-sim-%u.%u", p->instance % 100u, (unsigned)i % 10u);
        pthread_setname_np(p->thr[i].thread, name); /* for top/perf; failure is harmless */
    }
    return OTE_OK;
}

void ote__sim_wire_stop(sim_prov_t *p) {
    atomic_store(&p->stop, true);
    ote__sim_wake(p);
    for (int i = 0; i < p->nthr; i++) {
        if (!p->thr[i].started) continue;
        pthread_join(p->thr[i].thread, NULL);
        p->thr[i].started = false;
    }
    while (p->conns) conn_free(p, p->conns);
    for (int i = 1; i < p->nthr; i++) {
        close(p->thr[i].epfd);
        close(p->thr[i].wake_efd);
    }
    p->nthr = p->nthr > 0 ? 1 : 0; /* thread 0's fds are the instance's (sim.c closes them) */
}

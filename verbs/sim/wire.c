/*
 * verbs/sim/wire.c - the sim's transport core: connections over abstract UNIX stream
 * sockets (create, close, detach from a QP), the transmit queue of frames, revocation of
 * zero-copy references, and the progress thread that drives everything under prov->mu.
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

void ote__sim_wake(sim_prov_t *p) {
    uint64_t one = 1;
    ssize_t r = write(p->wake_efd, &one, sizeof(one));
    (void)r; /* a full counter already means "wake" */
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
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = l};
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

sim_conn_t *ote__sim_conn_new(sim_prov_t *p, int fd) {
    sim_conn_t *c = ote_calloc(1, sizeof(*c));
    if (!c) return NULL;
    c->rbuf = ote_malloc(SIM_RXBUF);
    c->div_cap = SIM_MAX_SGE + 1;
    c->div = ote_calloc((size_t)c->div_cap, sizeof(*c->div));
    c->div_own = ote_calloc((size_t)c->div_cap, sizeof(*c->div_own));
    if (!c->rbuf || !c->div || !c->div_own) {
        ote_free(c->rbuf);
        ote_free(c->div);
        ote_free(c->div_own);
        ote_free(c);
        return NULL;
    }
    c->kind = SIM_FD_CONN;
    c->fd = fd;
    c->p = p;
    c->ev_mask = EPOLLIN;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    if (epoll_ctl(p->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        ote_free(c->rbuf);
        ote_free(c->div);
        ote_free(c->div_own);
        ote_free(c);
        return NULL;
    }
    DL_APPEND(p->conns, c);
    return c;
}

/* Mark dead; the progress thread frees it between epoll batches. */
void ote__sim_conn_close(sim_prov_t *p, sim_conn_t *c) {
    (void)p;
    if (c->dead) return;
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
    epoll_ctl(p->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    while (c->tx_head) {
        sim_frame_t *f = c->tx_head;
        c->tx_head = f->next;
        ote_free(f);
    }
    DL_DELETE(p->conns, c);
    ote_free(c->rbuf);
    ote_free(c->div);
    ote_free(c->div_own);
    ote_free(c);
}

static void reap(sim_prov_t *p) {
    sim_conn_t *c, *tmp;
    DL_FOREACH_SAFE(p->conns, c, tmp) if (c->dead) conn_free(p, c);
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
    epoll_ctl(p->epfd, EPOLL_CTL_MOD, c->fd, &ev);
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
    if (pt->bw_wake_ns == 0 || at < pt->bw_wake_ns) pt->bw_wake_ns = at;
}

/* How many bytes c may hand to its socket now (SIZE_MAX: no limit); 0 = throttled (the
 * port's wake time is set). sent: bytes this call already sent. */
static size_t bw_allow(const sim_prov_t *p, sim_port_t *pt, const sim_conn_t *c, size_t sent) {
    if (!pt || pt->bw == 0) return SIZE_MAX;
    uint64_t now = ote_now_ns();
    bw_refill(pt, now);
    double q = bw_quantum(pt);
    double head = (double)(c->tx_head->total - c->tx_head->done);
    double need = head < q ? head : q;
    /* Not its turn (outside the pass, or its share of this pass taken) or too few tokens:
     * the pass runs again as soon as there are enough. */
    if (!p->bw_pass || (double)sent >= 2 * q || pt->bw_tokens < need) {
        uint64_t wait = pt->bw_tokens >= need
                            ? 0
                            : (uint64_t)((need - pt->bw_tokens) * 1e9 / (double)pt->bw) + 1;
        bw_wake_at(pt, now + wait);
        return 0;
    }
    double allow = pt->bw_tokens < q ? pt->bw_tokens : q;
    return allow < 1.0 ? 1 : (size_t)allow;
}

void ote__sim_conn_tx(sim_prov_t *p, sim_conn_t *c) {
    sim_port_t *pt = conn_port(c);
    size_t sent = 0;
    while (c->tx_head && !c->dead) {
        size_t cap = bw_allow(p, pt, c, sent);
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
        ssize_t w = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
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
    conn_want_out(p, c, false);
}

/* ---- revocation ----
 *
 * Payloads move zero-copy: a READ response or a request is read from registered memory
 * when the socket takes it, an inbound payload is read straight into its destination. Every
 * such reference records the MR or MW that granted it, and everything runs under prov->mu,
 * so revoking that MR/MW (dereg, dealloc, invalidation) or moving the QP to ERR drops the
 * references synchronously: once the verb returns, no byte of that memory is read or
 * written. A responder also starts no request on a connection before the READ response
 * ahead of it is fully sent (requests execute in order, as on a NIC), so a pipelined
 * SEND_WITH_INV cannot revoke a window under its own READ. */

static void rresp_cancel(sim_prov_t *p, sim_conn_t *c, bool nak) {
    sim_frame_t *f = c->rresp;
    c->rresp = NULL;
    if (!f) return;
    if (f->done > 0) { /* the header is out: the rest cannot be sent, end the stream */
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
    sim_frame_t **pp = &c->tx_head, *prev = NULL; /* the QP left RTS: say nothing */
    while (*pp && *pp != f) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (!*pp) return;
    *pp = f->next;
    if (c->tx_tail == f) c->tx_tail = prev;
    ote_free(f);
}

static bool frames_use(const sim_conn_t *c, const void *obj) {
    for (const sim_frame_t *f = c->tx_head; f; f = f->next)
        for (int i = 1; i < f->niov; i++)
            if (f->own[i] == obj) return true;
    return false;
}

void ote__sim_revoke(sim_prov_t *p, const void *obj, bool is_mw) {
    sim_conn_t *c;
    DL_FOREACH(p->conns, c) {
        if (c->dead) continue;
        if (c->rx == RX_PAYLOAD) {
            for (int i = c->idiv; i < c->ndiv; i++) {
                if (c->div_own[i] == obj) {
                    c->idiv = c->ndiv; /* the rest is read and dropped */
                    c->act_revoked = true;
                    break;
                }
            }
        }
        if (c->requester) {
            /* requests read local SGEs (MRs only); a partly queued stream cannot be
             * patched: close it and let the WRs fail */
            if (!is_mw && frames_use(c, obj)) ote__sim_conn_close(p, c);
        } else if (c->rresp && c->rresp->niov > 1 && c->rresp->own[1] == obj) {
            rresp_cancel(p, c, true);
        }
    }
}

void ote__sim_send_ctl(sim_prov_t *p, sim_conn_t *c, uint8_t type, uint32_t psn, uint8_t syndrome,
                       uint32_t imm) {
    sim_frame_t *f = ote__sim_frame_new(0);
    if (!f) {
        /* Out of memory: the requester sees no answer and ends in RETRY_EXC_ERR. */
        OTE_WARN(SIM_LOG, "sim: response lost (out of memory)");
        return;
    }
    f->hdr.type = type;
    f->hdr.psn = psn;
    f->hdr.syndrome = syndrome;
    f->hdr.imm = imm;
    ote__sim_conn_queue(c, f);
    (void)p;
}

/* ---- the progress thread ---- */

static void accept_all(sim_prov_t *p, sim_listener_t *l) {
    for (;;) {
        int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        ote__sim_set_bufs(fd);
        sim_conn_t *c = ote__sim_conn_new(p, fd);
        if (!c) {
            close(fd);
            continue;
        }
        c->via = l;
    }
}

/* Receive (when readable), send, and resume a receive that waited for a READ response. */
static void conn_service(sim_prov_t *p, sim_conn_t *c, bool readable) {
    for (int round = 0; round < 16 && !c->dead; round++) {
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

static int next_timeout_ms(sim_prov_t *p, uint64_t now) {
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
            uint64_t at = d->ports[j].bw_wake_ns;
            if (!at) continue;
            uint64_t dl = at > now ? at - now : 0;
            int m = (int)((dl + OTE_NSEC_PER_MSEC - 1) / OTE_NSEC_PER_MSEC);
            if (m < ms) ms = m;
        }
    }
    return ms;
}

static void *progress_main(void *arg) {
    sim_prov_t *p = arg;
    struct epoll_event evs[64];
    ote_mutex_lock(&p->mu);
    while (!atomic_load(&p->stop)) {
        int tmo = next_timeout_ms(p, ote_now_ns());
        ote_mutex_unlock(&p->mu);
        int n = epoll_wait(p->epfd, evs, 64, tmo);
        ote_mutex_lock(&p->mu);
        for (int i = 0; i < p->cfg.ndev; i++) /* throttled connections set it again */
            for (int j = 0; j < p->cfg.devs[i].nports; j++) p->cfg.devs[i].ports[j].bw_wake_ns = 0;
        for (int i = 0; i < n; i++) {
            int kind = *(int *)evs[i].data.ptr;
            if (kind == SIM_FD_WAKE) {
                uint64_t x;
                ssize_t r = read(p->wake_efd, &x, sizeof(x));
                (void)r;
            } else if (kind == SIM_FD_LISTENER) {
                accept_all(p, evs[i].data.ptr);
            } else {
                sim_conn_t *c = evs[i].data.ptr;
                if (c->dead) continue;
                conn_service(p, c, (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) != 0);
            }
        }
        uint64_t now = ote_now_ns();
        sim_qp_t *qp;
        DL_FOREACH2(p->qp_list, qp, next) ote__sim_req_pump(p, qp, now);
        sim_conn_t *c;
        p->bw_pass = true;
        DL_FOREACH(p->conns, c)
        if (!c->dead && (c->tx_head || c->rx_blocked)) conn_service(p, c, false);
        p->bw_pass = false;
        if (p->conns && p->conns->next) { /* round-robin: another connection goes first */
            sim_conn_t *h = p->conns;
            DL_DELETE(p->conns, h);
            DL_APPEND(p->conns, h);
        }
        ote__sim_handle_overflow(p);
        reap(p);
    }
    ote_mutex_unlock(&p->mu);
    return NULL;
}

ote_status_t ote__sim_wire_start(sim_prov_t *p) {
    int rc = pthread_create(&p->thread, NULL, progress_main, p);
    if (rc != 0) return ote_status_make(OTE_ERR_NATIVE, rc);
    p->thread_started = true;
    return OTE_OK;
}

void ote__sim_wire_stop(sim_prov_t *p) {
    if (p->thread_started) {
        atomic_store(&p->stop, true);
        ote__sim_wake(p);
        pthread_join(p->thread, NULL);
        p->thread_started = false;
    }
    while (p->conns) conn_free(p, p->conns);
}

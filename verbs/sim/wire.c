/*
 * verbs/sim/wire.c - the sim's transport: the progress thread, connections over
 * abstract UNIX stream sockets, the requester (send queue processing, ACK/NAK, RNR
 * retry, retry-exceeded timer) and the responder (rkey checks, receive WQEs, READ
 * responses), executed by the side that owns the memory.
 *
 * Each RC QP that sends opens its own connection to the listener of the destination
 * GID and names the destination QP and itself in a HELLO (accepted only from that QP's
 * RTR destination, see hello_target); requests flow on it and the responder
 * answers (ACK, NAK, READ response) on the same connection. Messages carry PSNs; the
 * responder executes only the expected PSN and silently drops anything else, so the
 * requester's go-back (after an RNR NAK) and a PSN mismatch behave as on a NIC.
 * Payloads travel from registered memory to registered memory with sendmsg/readv, no
 * per-byte work in between.
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

enum { ACT_NONE = 0, ACT_HELLO, ACT_RECV, ACT_WRITE, ACT_WRITE_IMM, ACT_RRESP };

#define SIM_SOCKBUF (8 * 1024 * 1024)
#define SIM_TX_IOV 64

static void rresp_cancel(sim_prov_t *p, sim_conn_t *c, bool nak);

static const uint32_t k_rnr_us[32] = {
    655360, 10,    20,    30,    40,    60,    80,    120,   160,    240,    320,
    480,    640,   960,   1280,  1920,  2560,  3840,  5120,  7680,   10240,  15360,
    20480,  30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520};

void ote__sim_wake(sim_prov_t *p) {
    uint64_t one = 1;
    ssize_t r = write(p->wake_efd, &one, sizeof(one));
    (void)r; /* a full counter already means "wake" */
}

static bool port_up(sim_qp_t *qp) {
    sim_dev_t *d = qp->ctx->dev;
    int port = qp->attr.port_num;
    if (port < 1 || port > d->nports) return false;
    return d->ports[port - 1].state == IBV_PORT_ACTIVE;
}

/* ---- listeners and connections ---- */

ote_status_t ote__sim_listener_add(sim_prov_t *p, sim_listener_t *l) {
    l->kind = SIM_FD_LISTENER;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = l};
    if (epoll_ctl(p->epfd, EPOLL_CTL_ADD, l->fd, &ev) != 0) return ote_status_make(OTE_ERR_NATIVE, errno);
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

static void set_bufs(int fd) {
    int sz = SIM_SOCKBUF;
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &sz, sizeof(sz)) != 0)
        (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &sz, sizeof(sz)) != 0)
        (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
}

static sim_conn_t *conn_new(sim_prov_t *p, int fd) {
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

static sim_frame_t *frame_new(int npay) {
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
static void frame_add(sim_frame_t *f, void *base, size_t len, const void *own) {
    if (len == 0) return;
    f->iov[f->niov].iov_base = base;
    f->iov[f->niov].iov_len = len;
    f->own[f->niov] = own;
    f->niov++;
    f->total += len;
}

static void conn_queue(sim_conn_t *c, sim_frame_t *f) {
    f->next = NULL;
    if (c->tx_tail) c->tx_tail->next = f;
    else c->tx_head = f;
    c->tx_tail = f;
}

/* Register what the connection waits for: input unless the next request must wait for a
 * READ response (level-triggered epoll would spin on unread input), output while frames
 * are pending. */
static void conn_events(sim_prov_t *p, sim_conn_t *c) {
    uint32_t m = (c->rx_blocked ? 0 : EPOLLIN) | (c->want_out ? EPOLLOUT : 0);
    if (m == c->ev_mask || c->dead) return;
    c->ev_mask = m;
    struct epoll_event ev = {.events = m, .data.ptr = c};
    epoll_ctl(p->epfd, EPOLL_CTL_MOD, c->fd, &ev);
}

static void conn_want_out(sim_prov_t *p, sim_conn_t *c, bool on) {
    c->want_out = on;
    conn_events(p, c);
}

static void touch(sim_conn_t *c) {
    if (c->requester && c->qp) c->qp->progress_ns = ote_now_ns();
}

static void conn_tx(sim_prov_t *p, sim_conn_t *c) {
    while (c->tx_head && !c->dead) {
        struct iovec iov[SIM_TX_IOV];
        int n = 0;
        for (sim_frame_t *f = c->tx_head; f && n < SIM_TX_IOV; f = f->next) {
            size_t skip = f->done;
            for (int i = 0; i < f->niov && n < SIM_TX_IOV; i++) {
                size_t l = f->iov[i].iov_len;
                if (skip >= l) {
                    skip -= l;
                    continue;
                }
                iov[n].iov_base = (char *)f->iov[i].iov_base + skip;
                iov[n].iov_len = l - skip;
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
        touch(c);
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

static void send_ctl(sim_prov_t *p, sim_conn_t *c, uint8_t type, uint32_t psn, uint8_t syndrome,
                     uint32_t imm) {
    sim_frame_t *f = frame_new(0);
    if (!f) {
        /* Out of memory: the requester sees no answer and ends in RETRY_EXC_ERR. */
        OTE_WARN(SIM_LOG, "sim: response lost (out of memory)");
        return;
    }
    f->hdr.type = type;
    f->hdr.psn = psn;
    f->hdr.syndrome = syndrome;
    f->hdr.imm = imm;
    conn_queue(c, f);
    (void)p;
}

/* ---- requester ---- */

static sim_swr_t *slot(sim_qp_t *qp, uint64_t seq) { return &qp->sq[seq % qp->max_send_wr]; }

static bool is_remote(enum ibv_wr_opcode op) { return op != IBV_WR_BIND_MW && op != IBV_WR_LOCAL_INV; }

static bool swr_find(sim_qp_t *qp, uint32_t psn, uint64_t *seq_out) {
    for (uint64_t s = qp->sq_head; s < qp->sq_next; s++) {
        sim_swr_t *e = slot(qp, s);
        if (e->psn_set && e->psn == psn && is_remote(e->op) && e->state == SWR_SENT) {
            *seq_out = s;
            return true;
        }
    }
    return false;
}

static void swr_fail(sim_qp_t *qp, sim_swr_t *e, enum ibv_wc_status st) {
    if (e->state == SWR_SENT && e->op == IBV_WR_RDMA_READ) qp->reads_out--;
    e->state = SWR_DONE;
    e->status = st;
    qp->halted = true;
}

static void exec_bind(sim_prov_t *p, sim_qp_t *qp, sim_swr_t *e) {
    sim_mw_t *mw = to_sim_mw(e->mw);
    sim_mr_t *mr = e->bmr ? to_sim_mr(e->bmr) : NULL;
    bool ok = mw->ibmw.type == IBV_MW_TYPE_2 && !mw->bound && mw->pd == qp->pd && mr &&
              ote__sim_mr_lookup(p, mr->ibmr.lkey) == mr && e->blen > 0 &&
              (mr->access & IBV_ACCESS_MW_BIND) && (e->new_rkey >> 8) == mw->index &&
              !(e->bacc & ~(IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                            IBV_ACCESS_ZERO_BASED)) &&
              !(e->bacc & IBV_ACCESS_ZERO_BASED);
    if (ok && (e->bacc & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
        !(mr->access & IBV_ACCESS_LOCAL_WRITE))
        ok = false;
    if (ok) {
        uint64_t base = mr->va;
        if (e->baddr < base || e->blen > mr->ibmr.length || e->baddr - base > mr->ibmr.length - e->blen) ok = false;
    }
    if (!ok) {
        swr_fail(qp, e, IBV_WC_MW_BIND_ERR);
        return;
    }
    mw->bound = true;
    mw->mr = mr;
    mr->nbound++;
    mw->addr = e->baddr;
    mw->len = e->blen;
    mw->access = (int)e->bacc;
    mw->qp = qp;
    mw->key = e->new_rkey;
    mw->ibmw.rkey = e->new_rkey;
    p->keys[mw->index].tag = (uint8_t)e->new_rkey;
    e->state = SWR_DONE;
    e->status = IBV_WC_SUCCESS;
}

/* A type-2 window may be invalidated by the peer (SEND_WITH_INV, remote) only through
 * the QP it is bound to (IBA); LOCAL_INV needs the same PD. */
static bool inv_allowed(sim_prov_t *p, sim_qp_t *qp, uint32_t rkey, bool remote) {
    sim_mw_t *mw = ote__sim_mw_lookup(p, rkey);
    if (!mw || !mw->bound || mw->key != rkey || mw->pd != qp->pd || mw->ibmw.type != IBV_MW_TYPE_2)
        return false;
    if (remote && mw->qp != qp) return false;
    return true;
}

static bool invalidate(sim_prov_t *p, sim_qp_t *qp, uint32_t rkey, bool remote) {
    if (!inv_allowed(p, qp, rkey, remote)) return false;
    sim_mw_t *mw = ote__sim_mw_lookup(p, rkey);
    ote__sim_revoke(p, mw, true);
    mw->bound = false;
    if (mw->mr) mw->mr->nbound--;
    mw->mr = NULL;
    mw->qp = NULL;
    mw->len = 0;
    return true;
}

static bool conn_open(sim_prov_t *p, sim_qp_t *qp) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    set_bufs(fd);
    struct sockaddr_un sun;
    socklen_t len = ote__sim_gid_sockaddr(&qp->attr.ah_attr.grh.dgid, &sun);
    if (connect(fd, (struct sockaddr *)&sun, len) != 0) {
        int e = errno;
        close(fd);
        if (e != EAGAIN && e != EINTR && e != EINPROGRESS) { /* no such GID: no answer ever */
            qp->conn_lost = true;
            qp->lost_at_ns = ote_now_ns();
        }
        return false;
    }
    sim_conn_t *c = conn_new(p, fd);
    if (!c) {
        close(fd);
        return false;
    }
    sim_frame_t *f = frame_new(0);
    if (!f) {
        ote__sim_conn_close(p, c);
        return false;
    }
    c->requester = true;
    c->qp = qp;
    qp->req = c;
    f->hdr.type = SIM_MSG_HELLO;
    f->hdr.raddr = qp->attr.dest_qp_num;
    f->hdr.imm = qp->ibqp.qp_num;
    sim_dev_t *d = qp->ctx->dev;
    sim_port_t *pt = &d->ports[qp->attr.port_num - 1];
    memcpy(f->extra, pt->gids[qp->attr.ah_attr.grh.sgid_index].gid.raw, 16);
    f->hdr.len = 16;
    f->iov[0].iov_len = sizeof(f->hdr) + 16;
    f->total = f->iov[0].iov_len;
    conn_queue(c, f);
    return true;
}

/* Build frames for queued WRs; run local WRs. */
static void req_build(sim_prov_t *p, sim_qp_t *qp) {
    uint32_t mtu = ote__sim_mtu_bytes(qp->attr.path_mtu);
    uint32_t max_reads = qp->attr.max_rd_atomic ? qp->attr.max_rd_atomic : 1;
    while (qp->sq_next < qp->sq_tail && !qp->halted && qp->state == IBV_QPS_RTS) {
        sim_swr_t *e = slot(qp, qp->sq_next);
        if (e->state == SWR_DONE) { /* a local WR already run before a go-back */
            qp->sq_next++;
            continue;
        }
        if (e->op == IBV_WR_BIND_MW) {
            exec_bind(p, qp, e);
            qp->sq_next++;
            continue;
        }
        if (e->op == IBV_WR_LOCAL_INV) {
            if (invalidate(p, qp, e->imm, false)) {
                e->state = SWR_DONE;
                e->status = IBV_WC_SUCCESS;
            } else {
                swr_fail(qp, e, IBV_WC_LOC_QP_OP_ERR);
            }
            qp->sq_next++;
            continue;
        }
        if (e->len > SIM_MAX_MSG_SZ) {
            swr_fail(qp, e, IBV_WC_LOC_LEN_ERR);
            qp->sq_next++;
            continue;
        }
        bool need_write = e->op == IBV_WR_RDMA_READ;
        if (!e->inlined && !ote__sim_check_local(p, qp->pd, e->sge, e->nsge, need_write, e->len)) {
            swr_fail(qp, e, IBV_WC_LOC_PROT_ERR);
            qp->sq_next++;
            continue;
        }
        if ((e->flags & IBV_SEND_FENCE) && qp->reads_out > 0) break;
        if (e->op == IBV_WR_RDMA_READ && (uint32_t)qp->reads_out >= max_reads) break;
        if (!qp->req || qp->req->dead || !port_up(qp)) break;
        sim_frame_t *f = frame_new(e->op == IBV_WR_RDMA_READ ? 0 : (e->inlined ? 1 : e->nsge));
        if (!f) break; /* retried on the next round */
        if (!e->psn_set) {
            e->psn = qp->sq_psn_next;
            uint64_t np = e->len ? (e->len + mtu - 1) / mtu : 1;
            e->npsn = (uint32_t)np;
            qp->sq_psn_next = (qp->sq_psn_next + e->npsn) & 0xffffff;
            e->psn_set = true;
        }
        sim_hdr_t *h = &f->hdr;
        h->type = SIM_MSG_REQ;
        h->op = (uint8_t)e->op;
        h->flags = (e->flags & IBV_SEND_SOLICITED) ? SIM_HF_SE : 0;
        h->psn = e->psn;
        h->npsn = e->npsn;
        h->imm = e->imm;
        h->rkey = e->rkey;
        h->raddr = e->raddr;
        if (e->op == IBV_WR_RDMA_READ) {
            h->imm = (uint32_t)e->len;
            h->len = 0;
            qp->reads_out++;
        } else {
            h->len = e->len;
            if (e->inlined) frame_add(f, e->inl, e->len, NULL);
            else
                for (int i = 0; i < e->nsge; i++)
                    frame_add(f, ote__sim_sge_host(p, &e->sge[i]), e->sge[i].length,
                              ote__sim_mr_lookup(p, e->sge[i].lkey));
        }
        conn_queue(qp->req, f);
        e->state = SWR_SENT;
        qp->sq_next++;
    }
}

/* Go back to seq s (after an RNR NAK): later requests were dropped by the responder. */
static void req_rewind(sim_qp_t *qp, uint64_t s) {
    for (uint64_t q = s; q < qp->sq_next; q++) {
        sim_swr_t *e = slot(qp, q);
        if (is_remote(e->op) && e->state == SWR_SENT) {
            if (e->op == IBV_WR_RDMA_READ) qp->reads_out--;
            e->state = SWR_QUEUED;
        }
    }
    qp->sq_next = s;
    sim_conn_t *c = qp->req;
    if (c) { /* drop frames not started yet; they will be rebuilt */
        sim_frame_t *keep = c->tx_head;
        if (keep && keep->done == 0) keep = NULL;
        sim_frame_t *f = keep ? keep->next : c->tx_head;
        while (f) {
            sim_frame_t *n = f->next;
            ote_free(f);
            f = n;
        }
        if (keep) keep->next = NULL;
        c->tx_head = c->tx_tail = keep;
    }
}

static void req_timers(sim_qp_t *qp, uint64_t now) {
    bool pending = false;
    for (uint64_t s = qp->sq_head; s < qp->sq_tail; s++) {
        sim_swr_t *e = slot(qp, s);
        if (e->state != SWR_DONE && is_remote(e->op)) {
            pending = true;
            break;
        }
    }
    if (!pending || qp->halted) return;
    bool lost = qp->conn_lost;
    uint64_t since = lost ? qp->lost_at_ns : qp->progress_ns;
    if (now - since < ote__sim_retry_bound_ns(qp, lost)) return;
    for (uint64_t s = qp->sq_head; s < qp->sq_tail; s++) {
        sim_swr_t *e = slot(qp, s);
        if (e->state != SWR_DONE && is_remote(e->op)) {
            swr_fail(qp, e, IBV_WC_RETRY_EXC_ERR);
            if (s >= qp->sq_next) qp->sq_next = s + 1;
            break;
        }
    }
}

static void req_pump(sim_prov_t *p, sim_qp_t *qp, uint64_t now) {
    if (qp->state != IBV_QPS_RTS && qp->state != IBV_QPS_SQD) return;
    if (qp->rnr_until_ns) {
        if (now < qp->rnr_until_ns) return;
        qp->rnr_until_ns = 0;
        qp->progress_ns = now;
    }
    if (qp->sq_head == qp->sq_tail) return;
    if (qp->state == IBV_QPS_RTS && !qp->req && !qp->conn_lost && !qp->halted && port_up(qp)) {
        bool need = false;
        for (uint64_t s = qp->sq_next; s < qp->sq_tail; s++)
            if (is_remote(slot(qp, s)->op)) need = true;
        if (need) conn_open(p, qp);
    }
    req_build(p, qp);
    req_timers(qp, now);
    ote__sim_qp_complete(qp);
    if (qp->req && qp->req->tx_head) conn_tx(p, qp->req);
}

static void on_ack(sim_qp_t *qp, const sim_hdr_t *h) {
    uint64_t s;
    if (!swr_find(qp, h->psn, &s)) return;
    sim_swr_t *e = slot(qp, s);
    if (e->op == IBV_WR_RDMA_READ) {
        /* Only a READ response completes a READ: an ACK in its place is an unexpected
         * opcode from the responder (IBA: BAD_RESP_ERR, the requester goes to ERR). */
        swr_fail(qp, e, IBV_WC_BAD_RESP_ERR);
        ote__sim_qp_complete(qp);
        return;
    }
    e->state = SWR_DONE;
    e->status = IBV_WC_SUCCESS;
    e->byte_len = (uint32_t)e->len;
    qp->rnr_tries = 0;
    ote__sim_qp_complete(qp);
}

static void on_nak(sim_qp_t *qp, const sim_hdr_t *h) {
    uint64_t s;
    if (!swr_find(qp, h->psn, &s)) return;
    sim_swr_t *e = slot(qp, s);
    switch (h->syndrome) {
    case SIM_NAK_RNR:
        if (qp->attr.rnr_retry != 7 && qp->rnr_tries >= qp->attr.rnr_retry) {
            swr_fail(qp, e, IBV_WC_RNR_RETRY_EXC_ERR);
            break;
        }
        qp->rnr_tries++;
        req_rewind(qp, s);
        qp->rnr_until_ns = ote_now_ns() + (uint64_t)k_rnr_us[h->imm & 31] * OTE_NSEC_PER_USEC;
        return;
    case SIM_NAK_ACCESS: swr_fail(qp, e, IBV_WC_REM_ACCESS_ERR); break;
    case SIM_NAK_INV_REQ: swr_fail(qp, e, IBV_WC_REM_INV_REQ_ERR); break;
    default: swr_fail(qp, e, IBV_WC_REM_OP_ERR); break;
    }
    ote__sim_qp_complete(qp);
}

/* ---- responder ---- */

static sim_rwr_t *rq_front(sim_qp_t *qp) {
    if (qp->rq_head == qp->rq_tail) return NULL;
    return &qp->rq[qp->rq_head % qp->max_recv_wr];
}

static void set_div_sges(sim_prov_t *p, sim_conn_t *c, const struct ibv_sge *sge, int n, uint64_t len) {
    c->ndiv = 0;
    c->idiv = 0;
    for (int i = 0; i < n && len > 0 && c->ndiv < c->div_cap; i++) {
        uint64_t l = sge[i].length < len ? sge[i].length : len;
        if (!l) continue;
        c->div[c->ndiv].iov_base = ote__sim_sge_host(p, &sge[i]);
        c->div[c->ndiv].iov_len = l;
        c->div_own[c->ndiv] = ote__sim_mr_lookup(p, sge[i].lkey);
        c->ndiv++;
        len -= l;
    }
}

static void set_div_one(sim_conn_t *c, void *base, uint64_t len, const void *own) {
    c->ndiv = 0;
    c->idiv = 0;
    if (len) {
        c->div[0].iov_base = base;
        c->div[0].iov_len = len;
        c->div_own[0] = own;
        c->ndiv = 1;
    }
}

static void resp_error_event(sim_qp_t *qp, enum ibv_event_type t) {
    struct ibv_async_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.event_type = t;
    ev.element.qp = &qp->ibqp;
    ote__sim_async_push(qp->ctx, &ev);
}

/* A class A/C responder error: NAK, an error CQE on the WQE in use (if any) or an
 * affiliated async event, then the responder QP goes to ERR. */
static void resp_fail(sim_prov_t *p, sim_conn_t *c, sim_qp_t *qp, uint8_t syndrome, sim_rwr_t *w,
                      enum ibv_wc_status st, enum ibv_event_type ev) {
    send_ctl(p, c, SIM_MSG_NAK, c->h.psn, syndrome, 0);
    if (w) {
        struct ibv_wc wc;
        memset(&wc, 0, sizeof(wc));
        wc.wr_id = w->wr_id;
        wc.status = st;
        wc.opcode = IBV_WC_RECV;
        wc.qp_num = qp->ibqp.qp_num;
        wc.src_qp = qp->attr.dest_qp_num;
        wc.vendor_err = 0x5e;
        ote__sim_rq_complete(qp, &wc, true);
    } else {
        resp_error_event(qp, ev);
        if (qp->state != IBV_QPS_ERR) ote__sim_qp_to_err(qp);
    }
}

static uint64_t sge_total(const sim_rwr_t *w) {
    uint64_t t = 0;
    for (int i = 0; i < w->nsge; i++) t += w->sge[i].length;
    return t;
}

static void resp_request(sim_prov_t *p, sim_conn_t *c) {
    sim_hdr_t *h = &c->h;
    sim_qp_t *qp = c->qp;
    c->act = ACT_NONE;
    c->ndiv = 0;
    c->idiv = 0;
    if (!qp || (qp->state != IBV_QPS_RTR && qp->state != IBV_QPS_RTS && qp->state != IBV_QPS_SQD) ||
        !port_up(qp))
        return; /* dropped: the requester times out */
    if (h->psn != qp->rq_epsn) return; /* out of sequence (after a go-back) or PSN mismatch */
    c->act_epoch = qp->epoch;
    switch (h->op) {
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_IMM:
    case IBV_WR_SEND_WITH_INV: {
        sim_rwr_t *w = rq_front(qp);
        if (!w) {
            send_ctl(p, c, SIM_MSG_NAK, h->psn, SIM_NAK_RNR, qp->attr.min_rnr_timer);
            return;
        }
        if (h->len > sge_total(w)) {
            resp_fail(p, c, qp, SIM_NAK_INV_REQ, w, IBV_WC_LOC_LEN_ERR, IBV_EVENT_QP_REQ_ERR);
            return;
        }
        if (!ote__sim_check_local(p, qp->pd, w->sge, w->nsge, true, h->len)) {
            resp_fail(p, c, qp, SIM_NAK_OP, w, IBV_WC_LOC_PROT_ERR, IBV_EVENT_QP_ACCESS_ERR);
            return;
        }
        if (h->op == IBV_WR_SEND_WITH_INV && !inv_allowed(p, qp, h->imm, true)) {
            resp_fail(p, c, qp, SIM_NAK_INV_REQ, w, IBV_WC_LOC_QP_OP_ERR, IBV_EVENT_QP_REQ_ERR);
            return;
        }
        set_div_sges(p, c, w->sge, w->nsge, h->len);
        c->act = ACT_RECV;
        return;
    }
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM: {
        sim_rwr_t *w = NULL;
        if (h->op == IBV_WR_RDMA_WRITE_WITH_IMM) {
            w = rq_front(qp);
            if (!w) {
                send_ctl(p, c, SIM_MSG_NAK, h->psn, SIM_NAK_RNR, qp->attr.min_rnr_timer);
                return;
            }
        }
        const void *auth = NULL;
        void *host = NULL;
        if (h->len > 0) {
            if (!(qp->attr.qp_access_flags & IBV_ACCESS_REMOTE_WRITE)) {
                resp_fail(p, c, qp, SIM_NAK_INV_REQ, w, IBV_WC_LOC_ACCESS_ERR, IBV_EVENT_QP_REQ_ERR);
                return;
            }
            if (!ote__sim_check_remote(p, qp, h->rkey, h->raddr, h->len, IBV_ACCESS_REMOTE_WRITE, &auth,
                                       &host)) {
                resp_fail(p, c, qp, SIM_NAK_ACCESS, w, IBV_WC_LOC_ACCESS_ERR, IBV_EVENT_QP_ACCESS_ERR);
                return;
            }
        }
        set_div_one(c, host, h->len, auth);
        c->act = w ? ACT_WRITE_IMM : ACT_WRITE;
        return;
    }
    case IBV_WR_RDMA_READ: {
        uint64_t len = h->imm;
        const void *auth = NULL;
        void *host = NULL;
        if (len > 0) {
            if (!(qp->attr.qp_access_flags & IBV_ACCESS_REMOTE_READ)) {
                resp_fail(p, c, qp, SIM_NAK_INV_REQ, NULL, IBV_WC_SUCCESS, IBV_EVENT_QP_REQ_ERR);
                return;
            }
            if (!ote__sim_check_remote(p, qp, h->rkey, h->raddr, len, IBV_ACCESS_REMOTE_READ, &auth, &host)) {
                resp_fail(p, c, qp, SIM_NAK_ACCESS, NULL, IBV_WC_SUCCESS, IBV_EVENT_QP_ACCESS_ERR);
                return;
            }
        }
        sim_frame_t *f = frame_new(1);
        if (!f) return; /* no answer: the requester retries out */
        f->hdr.type = SIM_MSG_RRESP;
        f->hdr.psn = h->psn;
        f->hdr.len = len;
        /* Zero-copy: the bytes are read when the socket takes them. Until then the next
         * request on this connection waits (conn_rx) and revoking auth withdraws it. */
        frame_add(f, host, len, auth);
        conn_queue(c, f);
        c->rresp = f;
        qp->rq_epsn = (qp->rq_epsn + h->npsn) & 0xffffff;
        return;
    }
    default:
        resp_fail(p, c, qp, SIM_NAK_INV_REQ, NULL, IBV_WC_SUCCESS, IBV_EVENT_QP_REQ_ERR);
        return;
    }
}

static void resp_done(sim_prov_t *p, sim_conn_t *c) {
    sim_hdr_t *h = &c->h;
    sim_qp_t *qp = c->qp;
    if (!qp || qp->epoch != c->act_epoch || qp->state == IBV_QPS_ERR || qp->state == IBV_QPS_RESET) return;
    if (c->act_revoked) {
        /* The destination was deregistered or invalidated mid-payload and the rest was
         * dropped: a protection error found late (class C: NAK, QP to ERR). */
        if (c->act == ACT_RECV)
            resp_fail(p, c, qp, SIM_NAK_OP, rq_front(qp), IBV_WC_LOC_PROT_ERR, IBV_EVENT_QP_ACCESS_ERR);
        else
            resp_fail(p, c, qp, SIM_NAK_ACCESS, c->act == ACT_WRITE_IMM ? rq_front(qp) : NULL,
                      IBV_WC_LOC_ACCESS_ERR, IBV_EVENT_QP_ACCESS_ERR);
        return;
    }
    struct ibv_wc wc;
    memset(&wc, 0, sizeof(wc));
    wc.status = IBV_WC_SUCCESS;
    wc.qp_num = qp->ibqp.qp_num;
    wc.src_qp = qp->attr.dest_qp_num;
    wc.byte_len = (uint32_t)h->len;
    bool se = (h->flags & SIM_HF_SE) != 0;
    if (c->act == ACT_RECV) {
        sim_rwr_t *w = rq_front(qp);
        if (!w) return;
        wc.wr_id = w->wr_id;
        wc.opcode = IBV_WC_RECV;
        if (h->op == IBV_WR_SEND_WITH_IMM) {
            wc.wc_flags = IBV_WC_WITH_IMM;
            wc.imm_data = h->imm;
        } else if (h->op == IBV_WR_SEND_WITH_INV) {
            if (!invalidate(p, qp, h->imm, true)) {
                resp_fail(p, c, qp, SIM_NAK_INV_REQ, w, IBV_WC_LOC_QP_OP_ERR, IBV_EVENT_QP_REQ_ERR);
                return;
            }
            wc.wc_flags = IBV_WC_WITH_INV;
            wc.invalidated_rkey = h->imm;
        }
        qp->rq_epsn = (qp->rq_epsn + h->npsn) & 0xffffff;
        send_ctl(p, c, SIM_MSG_ACK, h->psn, 0, 0);
        ote__sim_rq_complete(qp, &wc, se);
    } else if (c->act == ACT_WRITE || c->act == ACT_WRITE_IMM) {
        qp->rq_epsn = (qp->rq_epsn + h->npsn) & 0xffffff;
        send_ctl(p, c, SIM_MSG_ACK, h->psn, 0, 0);
        if (c->act == ACT_WRITE_IMM) {
            sim_rwr_t *w = rq_front(qp);
            if (!w) return;
            wc.wr_id = w->wr_id;
            wc.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
            wc.wc_flags = IBV_WC_WITH_IMM;
            wc.imm_data = h->imm;
            ote__sim_rq_complete(qp, &wc, se);
        }
    }
}

/* ---- receive engine ---- */

static void on_header(sim_prov_t *p, sim_conn_t *c) {
    sim_hdr_t *h = &c->h;
    c->act = ACT_NONE;
    c->act_revoked = false;
    c->ndiv = 0;
    c->idiv = 0;
    c->remaining = h->len;
    if (c->requester) {
        sim_qp_t *qp = c->qp;
        bool live = qp && (qp->state == IBV_QPS_RTS || qp->state == IBV_QPS_SQD);
        switch (h->type) {
        case SIM_MSG_ACK:
            if (live) on_ack(qp, h);
            break;
        case SIM_MSG_NAK:
            if (live) on_nak(qp, h);
            break;
        case SIM_MSG_RRESP: {
            uint64_t s;
            if (!live || !swr_find(qp, h->psn, &s)) break; /* stale: payload dropped */
            sim_swr_t *e = slot(qp, s);
            if (e->op != IBV_WR_RDMA_READ) { /* a READ response for a non-READ request */
                swr_fail(qp, e, IBV_WC_BAD_RESP_ERR);
                ote__sim_qp_complete(qp);
                break;
            }
            uint64_t len = h->len < e->len ? h->len : e->len;
            c->act = ACT_RRESP;
            c->act_seq = s;
            c->act_epoch = qp->epoch;
            /* the local SGEs were checked at post; they may have been deregistered since */
            if (ote__sim_check_local(p, qp->pd, e->sge, e->nsge, true, len)) set_div_sges(p, c, e->sge, e->nsge, len);
            else c->act_revoked = true;
            break;
        }
        default:
            ote__sim_conn_close(p, c);
            break;
        }
        return;
    }
    switch (h->type) {
    case SIM_MSG_HELLO:
        if (c->helloed || h->len != 16) { /* one HELLO binds a connection, once */
            ote__sim_conn_close(p, c);
            return;
        }
        c->helloed = true;
        set_div_one(c, c->hello_gid.raw, 16, NULL);
        c->act = ACT_HELLO;
        break;
    case SIM_MSG_REQ:
        resp_request(p, c);
        break;
    default:
        ote__sim_conn_close(p, c);
        break;
    }
}

/* True when the process at the other end of c also holds the listener of gid: the HELLO's
 * source GID is that process's own (a process cannot claim another one's GID). */
static bool peer_holds_gid(int fd, const union ibv_gid *gid) {
    struct ucred peer, owner;
    socklen_t l = sizeof(peer);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &l) != 0 || peer.pid <= 0) return false;
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0) return false;
    struct sockaddr_un sun;
    socklen_t len = ote__sim_gid_sockaddr(gid, &sun);
    bool ok = false;
    if (connect(s, (struct sockaddr *)&sun, len) == 0) {
        l = sizeof(owner);
        ok = getsockopt(s, SOL_SOCKET, SO_PEERCRED, &owner, &l) == 0 && owner.pid == peer.pid;
    }
    close(s);
    return ok;
}

/* The QP a HELLO may bind: it exists on the port the connection came in through, is
 * connected (RTR/RTS/SQD) and its RTR destination is the sender: the HELLO's source QPN
 * is its dest_qp_num, the source GID its dgid, and that GID is the sender's own. So a
 * connection reaches a QP only from the QP it was connected to, and a type-2 window's
 * "bound to this QP" check names the requester. NULL otherwise. */
static sim_qp_t *hello_target(sim_prov_t *p, sim_conn_t *c) {
    if (c->h.raddr > 0xffffff || !c->via) return NULL;
    uint32_t qpn = (uint32_t)c->h.raddr;
    sim_qp_t *qp = NULL;
    HASH_FIND(hh, p->qps, &qpn, sizeof(qpn), qp);
    if (!qp || qp->ctx->dev != c->via->dev || qp->attr.port_num != c->via->port) return NULL;
    if (qp->state != IBV_QPS_RTR && qp->state != IBV_QPS_RTS && qp->state != IBV_QPS_SQD) return NULL;
    if (c->h.imm != qp->attr.dest_qp_num) return NULL;
    if (memcmp(c->hello_gid.raw, qp->attr.ah_attr.grh.dgid.raw, 16) != 0) return NULL;
    if (!peer_holds_gid(c->fd, &c->hello_gid)) return NULL;
    return qp;
}

static void on_payload_done(sim_prov_t *p, sim_conn_t *c) {
    switch (c->act) {
    case ACT_HELLO: {
        sim_qp_t *qp = hello_target(p, c);
        if (!qp) {
            OTE_WARN(SIM_LOG, "sim: connection for QP %llu from QP %u refused (no such QP, not connected, "
                              "or not its RTR destination)",
                     (unsigned long long)c->h.raddr, c->h.imm);
            ote__sim_conn_close(p, c); /* the requester sees the peer gone */
            return;
        }
        c->qp = qp;
        break;
    }
    case ACT_RECV:
    case ACT_WRITE:
    case ACT_WRITE_IMM:
        resp_done(p, c);
        break;
    case ACT_RRESP: {
        sim_qp_t *qp = c->qp;
        if (!qp || qp->epoch != c->act_epoch) break;
        sim_swr_t *e = slot(qp, c->act_seq);
        if (e->state != SWR_SENT) break;
        if (c->act_revoked) { /* a local SGE's MR went away: nothing was written */
            swr_fail(qp, e, IBV_WC_LOC_PROT_ERR);
            ote__sim_qp_complete(qp);
            break;
        }
        e->state = SWR_DONE;
        e->status = IBV_WC_SUCCESS;
        e->byte_len = (uint32_t)(c->h.len < e->len ? c->h.len : e->len);
        qp->reads_out--;
        qp->rnr_tries = 0;
        ote__sim_qp_complete(qp);
        break;
    }
    default:
        break;
    }
    c->act = ACT_NONE;
}

/* Copy k bytes into the destination iovs (or drop them). Bytes beyond the destination
 * (a READ response longer than the local SGEs) are dropped. */
static void div_copy(sim_conn_t *c, const uint8_t *src, size_t k) {
    while (k > 0 && c->idiv < c->ndiv) {
        struct iovec *v = &c->div[c->idiv];
        size_t l = v->iov_len < k ? v->iov_len : k;
        memcpy(v->iov_base, src, l);
        v->iov_base = (char *)v->iov_base + l;
        v->iov_len -= l;
        src += l;
        k -= l;
        if (v->iov_len == 0) c->idiv++;
    }
}

static void div_advance(sim_conn_t *c, size_t k) {
    while (k > 0 && c->idiv < c->ndiv) {
        struct iovec *v = &c->div[c->idiv];
        size_t l = v->iov_len < k ? v->iov_len : k;
        v->iov_base = (char *)v->iov_base + l;
        v->iov_len -= l;
        k -= l;
        if (v->iov_len == 0) c->idiv++;
    }
}

/* Whether the destination of the payload in progress may still be written: a responder
 * QP that left RTR/RTS/SQD or changed epoch (ERR, RESET) takes no more bytes, nor does a
 * requester whose READ's QP changed epoch. Checked before every copy. */
static bool div_live(const sim_conn_t *c) {
    const sim_qp_t *qp = c->qp;
    switch (c->act) {
    case ACT_RECV:
    case ACT_WRITE:
    case ACT_WRITE_IMM:
        return qp && qp->epoch == c->act_epoch &&
               (qp->state == IBV_QPS_RTR || qp->state == IBV_QPS_RTS || qp->state == IBV_QPS_SQD);
    case ACT_RRESP:
        return qp && qp->epoch == c->act_epoch;
    case ACT_HELLO:
        return true;
    default:
        return false;
    }
}

static void conn_rx(sim_prov_t *p, sim_conn_t *c) {
    size_t budget = 256u << 20;
    while (!c->dead && budget > 0) {
        if (c->rx == RX_HDR && c->rresp) {
            /* The next request executes only after the READ response ahead of it is
             * fully sent (in order, and no later request can revoke what it reads). */
            conn_tx(p, c);
            if (c->dead) return;
            if (c->rresp) {
                c->rx_blocked = true;
                conn_events(p, c);
                return;
            }
        }
        if (c->rx == RX_HDR) {
            if (c->rlen - c->rpos >= sizeof(sim_hdr_t)) {
                memcpy(&c->h, c->rbuf + c->rpos, sizeof(sim_hdr_t));
                c->rpos += sizeof(sim_hdr_t);
                on_header(p, c);
                if (c->dead) return;
                c->rx = RX_PAYLOAD;
                continue;
            }
            if (c->rpos > 0) {
                memmove(c->rbuf, c->rbuf + c->rpos, c->rlen - c->rpos);
                c->rlen -= c->rpos;
                c->rpos = 0;
            }
            ssize_t n = read(c->fd, c->rbuf + c->rlen, SIM_RXBUF - c->rlen);
            if (n == 0) {
                ote__sim_conn_close(p, c);
                return;
            }
            if (n < 0) {
                if (errno == EINTR) continue;
                if (errno != EAGAIN && errno != EWOULDBLOCK) ote__sim_conn_close(p, c);
                return;
            }
            c->rlen += (size_t)n;
            budget -= (size_t)n < budget ? (size_t)n : budget;
            touch(c);
            continue;
        }
        /* RX_PAYLOAD */
        if (c->idiv < c->ndiv && !div_live(c)) c->idiv = c->ndiv; /* drop the rest */
        size_t avail = c->rlen - c->rpos;
        if (avail > 0 && c->remaining > 0) {
            size_t k = avail < c->remaining ? avail : (size_t)c->remaining;
            div_copy(c, c->rbuf + c->rpos, k);
            c->rpos += k;
            c->remaining -= k;
        }
        if (c->remaining == 0) {
            c->rx = RX_HDR;
            on_payload_done(p, c);
            continue;
        }
        /* staging empty: read straight into the destination, the rest into staging */
        c->rpos = c->rlen = 0;
        struct iovec iov[SIM_MAX_SGE + 2];
        int n = 0;
        size_t direct = 0;
        for (int i = c->idiv; i < c->ndiv && direct < c->remaining; i++) {
            size_t l = c->div[i].iov_len;
            if (l > c->remaining - direct) l = (size_t)(c->remaining - direct);
            iov[n].iov_base = c->div[i].iov_base;
            iov[n].iov_len = l;
            direct += l;
            n++;
        }
        iov[n].iov_base = c->rbuf;
        iov[n].iov_len = SIM_RXBUF;
        n++;
        ssize_t r = readv(c->fd, iov, n);
        if (r == 0) {
            ote__sim_conn_close(p, c);
            return;
        }
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) ote__sim_conn_close(p, c);
            return;
        }
        touch(c);
        budget -= (size_t)r < budget ? (size_t)r : budget;
        size_t got = (size_t)r;
        size_t into_div = got < direct ? got : direct;
        div_advance(c, into_div);
        c->remaining -= into_div;
        c->rlen = got - into_div; /* the rest landed in staging */
    }
}

/* ---- the progress thread ---- */

static void accept_all(sim_prov_t *p, sim_listener_t *l) {
    for (;;) {
        int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        set_bufs(fd);
        sim_conn_t *c = conn_new(p, fd);
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
            conn_events(p, c);
            readable = true; /* requests may wait in rbuf with nothing left in the socket */
        }
        if (readable && !c->rx_blocked) conn_rx(p, c);
        if (!c->dead && c->tx_head) conn_tx(p, c);
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
        DL_FOREACH2(p->qp_list, qp, next) req_pump(p, qp, now);
        sim_conn_t *c;
        DL_FOREACH(p->conns, c) if (!c->dead && (c->tx_head || c->rx_blocked)) conn_service(p, c, false);
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

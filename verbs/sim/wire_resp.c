/*
 * verbs/sim/wire_resp.c - the responder side of the sim's transport: a connection's HELLO
 * binds it to the QP whose RTR destination sent it (checked against the sender's process),
 * requests are checked (PSN, rkey, range, access, receive WQE) and executed by the side
 * that owns the memory, and errors end as NAKs, error CQEs or async events.
 */
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "verbs/sim/sim_internal.h"

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
    ote__sim_send_ctl(p, c, SIM_MSG_NAK, c->h.psn, syndrome, 0);
    if (c->dead) w = NULL; /* closed (out of memory): the WQE went back with the connection */
    if (w) {
        struct ibv_wc wc;
        ote__sim_recv_error_wc(qp, w->wr_id, st, &wc);
        ote__sim_recv_done(c, qp, &wc, true);
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

/* No receive WQE for a request that needs one: an RNR NAK (counted), nothing consumed. */
static void resp_rnr_nak(sim_prov_t *p, sim_conn_t *c, sim_qp_t *qp) {
    atomic_fetch_add(&ote__sim_rnr_naks, 1);
    ote__sim_send_ctl(p, c, SIM_MSG_NAK, c->h.psn, SIM_NAK_RNR, qp->attr.min_rnr_timer);
}

/* A SEND (with IMM or INV): into the front receive WQE's SGEs once its length, local
 * access and the invalidation are checked (c->act = SIM_ACT_RECV). */
static void resp_send(sim_prov_t *p, sim_conn_t *c, sim_qp_t *qp) {
    sim_hdr_t *h = &c->h;
    sim_rwr_t *w = ote__sim_recv_take(c, qp); /* its RQ's front, or held from its SRQ */
    if (!w) {
        resp_rnr_nak(p, c, qp);
        return;
    }
    if (h->len > sge_total(w)) {
        resp_fail(p, c, qp, SIM_NAK_INV_REQ, w, IBV_WC_LOC_LEN_ERR, IBV_EVENT_QP_REQ_ERR);
        return;
    }
    if (!ote__sim_check_local(p, ote__sim_recv_pd(qp), w->sge, w->nsge, true, h->len)) {
        resp_fail(p, c, qp, SIM_NAK_OP, w, IBV_WC_LOC_PROT_ERR, IBV_EVENT_QP_ACCESS_ERR);
        return;
    }
    if (h->op == IBV_WR_SEND_WITH_INV && !ote__sim_mw_inv_allowed(p, qp, h->imm, true)) {
        resp_fail(p, c, qp, SIM_NAK_INV_REQ, w, IBV_WC_LOC_QP_OP_ERR, IBV_EVENT_QP_REQ_ERR);
        return;
    }
    ote__sim_div_sges(p, c, w->sge, w->nsge, h->len);
    c->act = SIM_ACT_RECV;
}

/* An RDMA WRITE (with IMM: it also takes the front receive WQE): into the remote range
 * once the QP's access and the rkey are checked (c->act = SIM_ACT_WRITE[_IMM]). */
static void resp_write(sim_prov_t *p, sim_conn_t *c, sim_qp_t *qp) {
    sim_hdr_t *h = &c->h;
    sim_rwr_t *w = NULL;
    if (h->op == IBV_WR_RDMA_WRITE_WITH_IMM) {
        w = ote__sim_recv_take(c, qp);
        if (!w) {
            resp_rnr_nak(p, c, qp);
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
    ote__sim_div_one(c, host, h->len, auth);
    c->act = w ? SIM_ACT_WRITE_IMM : SIM_ACT_WRITE;
}

/* An RDMA READ of h->imm bytes: once the QP's access and the rkey are checked, its
 * response frame is queued on c (c->rresp) and the expected PSN moves past it. */
static void resp_read(sim_prov_t *p, sim_conn_t *c, sim_qp_t *qp) {
    sim_hdr_t *h = &c->h;
    uint64_t len = h->imm;
    const void *auth = NULL;
    void *host = NULL;
    if (len > 0) {
        if (!(qp->attr.qp_access_flags & IBV_ACCESS_REMOTE_READ)) {
            resp_fail(p, c, qp, SIM_NAK_INV_REQ, NULL, IBV_WC_SUCCESS, IBV_EVENT_QP_REQ_ERR);
            return;
        }
        if (!ote__sim_check_remote(p, qp, h->rkey, h->raddr, len, IBV_ACCESS_REMOTE_READ, &auth,
                                   &host)) {
            resp_fail(p, c, qp, SIM_NAK_ACCESS, NULL, IBV_WC_SUCCESS, IBV_EVENT_QP_ACCESS_ERR);
            return;
        }
    }
    sim_frame_t *f = ote__sim_frame_new(1);
    if (!f) { /* no answer: the requester retries out */
        ote__sim_send_ctl(p, c, SIM_MSG_DROP, h->psn, 0, 0);
        return;
    }
    f->hdr.type = SIM_MSG_RRESP;
    f->hdr.psn = h->psn;
    f->hdr.gen = h->gen;
    f->hdr.len = len;
    /* Zero-copy: the bytes are read when the socket takes them. Until then the next
     * request on this connection waits (conn_rx) and revoking auth withdraws it. */
    ote__sim_frame_add(f, host, len, auth);
    ote__sim_conn_queue(c, f);
    c->rresp = f;
    qp->rq_epsn = (qp->rq_epsn + h->npsn) & 0xffffff;
}

static void resp_request(sim_prov_t *p, sim_conn_t *c) {
    sim_hdr_t *h = &c->h;
    sim_qp_t *qp = c->qp;
    c->act = SIM_ACT_NONE;
    c->ndiv = 0;
    c->idiv = 0;
    /* Dropped (the requester times out): the QP not there or not ready, its port down, or
     * out of sequence (after a go-back) or a PSN mismatch. */
    if (!qp || (qp->state != IBV_QPS_RTR && qp->state != IBV_QPS_RTS && qp->state != IBV_QPS_SQD) ||
        !ote__sim_port_up(qp) || h->psn != qp->rq_epsn) {
        ote__sim_send_ctl(p, c, SIM_MSG_DROP, h->psn, 0, 0);
        return;
    }
    c->act_epoch = qp->epoch;
    switch (h->op) {
        case IBV_WR_SEND:
        case IBV_WR_SEND_WITH_IMM:
        case IBV_WR_SEND_WITH_INV: resp_send(p, c, qp); return;
        case IBV_WR_RDMA_WRITE:
        case IBV_WR_RDMA_WRITE_WITH_IMM: resp_write(p, c, qp); return;
        case IBV_WR_RDMA_READ: resp_read(p, c, qp); return;
        default:
            resp_fail(p, c, qp, SIM_NAK_INV_REQ, NULL, IBV_WC_SUCCESS, IBV_EVENT_QP_REQ_ERR);
            return;
    }
}

void ote__sim_resp_done(sim_prov_t *p, sim_conn_t *c) {
    sim_hdr_t *h = &c->h;
    sim_qp_t *qp = c->qp;
    if (!qp || qp->epoch != c->act_epoch || qp->state == IBV_QPS_ERR ||
        qp->state == IBV_QPS_RESET) {
        ote__sim_srq_give_back(c); /* the message never completes: its SRQ WQE is free */
        ote__sim_send_ctl(p, c, SIM_MSG_DROP, h->psn, 0, 0);
        return;
    }
    if (c->act_revoked) {
        /* The destination was deregistered or invalidated mid-payload and the rest was
         * dropped: a protection error found late (class C: NAK, QP to ERR). */
        if (c->act == SIM_ACT_RECV)
            resp_fail(p, c, qp, SIM_NAK_OP, ote__sim_recv_held(c, qp), IBV_WC_LOC_PROT_ERR,
                      IBV_EVENT_QP_ACCESS_ERR);
        else
            resp_fail(p, c, qp, SIM_NAK_ACCESS,
                      c->act == SIM_ACT_WRITE_IMM ? ote__sim_recv_held(c, qp) : NULL,
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
    if (c->act == SIM_ACT_RECV) {
        sim_rwr_t *w = ote__sim_recv_held(c, qp);
        if (!w) return;
        wc.wr_id = w->wr_id;
        wc.opcode = IBV_WC_RECV;
        if (h->op == IBV_WR_SEND_WITH_IMM) {
            wc.wc_flags = IBV_WC_WITH_IMM;
            wc.imm_data = h->imm;
        } else if (h->op == IBV_WR_SEND_WITH_INV) {
            if (!ote__sim_mw_invalidate(p, qp, h->imm, true)) {
                resp_fail(p, c, qp, SIM_NAK_INV_REQ, w, IBV_WC_LOC_QP_OP_ERR, IBV_EVENT_QP_REQ_ERR);
                return;
            }
            wc.wc_flags = IBV_WC_WITH_INV;
            wc.invalidated_rkey = h->imm;
        }
        qp->rq_epsn = (qp->rq_epsn + h->npsn) & 0xffffff;
        ote__sim_send_ctl(p, c, SIM_MSG_ACK, h->psn, 0, 0);
        if (c->dead) return; /* closed (out of memory): its WQE went back with it */
        ote__sim_recv_done(c, qp, &wc, se);
    } else if (c->act == SIM_ACT_WRITE || c->act == SIM_ACT_WRITE_IMM) {
        qp->rq_epsn = (qp->rq_epsn + h->npsn) & 0xffffff;
        ote__sim_send_ctl(p, c, SIM_MSG_ACK, h->psn, 0, 0);
        if (c->dead) return; /* closed (out of memory): its WQE went back with it */
        if (c->act == SIM_ACT_WRITE_IMM) {
            sim_rwr_t *w = ote__sim_recv_held(c, qp);
            if (!w) return;
            wc.wr_id = w->wr_id;
            wc.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
            wc.wc_flags = IBV_WC_WITH_IMM;
            wc.imm_data = h->imm;
            ote__sim_recv_done(c, qp, &wc, se);
        }
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
    if (qp->state != IBV_QPS_RTR && qp->state != IBV_QPS_RTS && qp->state != IBV_QPS_SQD)
        return NULL;
    if (c->h.imm != qp->attr.dest_qp_num) return NULL;
    if (memcmp(c->hello_gid.raw, qp->attr.ah_attr.grh.dgid.raw, 16) != 0) return NULL;
    if (!peer_holds_gid(c->fd, &c->hello_gid)) return NULL;
    return qp;
}

/* A header on a connection our listener accepted: its HELLO (once) or a request. */
void ote__sim_resp_on_header(sim_prov_t *p, sim_conn_t *c) {
    switch (c->h.type) {
        case SIM_MSG_HELLO:
            if (c->helloed || c->h.len != 16) { /* one HELLO binds a connection, once */
                ote__sim_conn_close(p, c);
                return;
            }
            c->helloed = true;
            ote__sim_div_one(c, c->hello_gid.raw, 16, NULL);
            c->act = SIM_ACT_HELLO;
            break;
        case SIM_MSG_REQ: resp_request(p, c); break;
        default: ote__sim_conn_close(p, c); break;
    }
}

/* The HELLO's source GID has arrived: bind the connection to its QP, or refuse it. */
void ote__sim_resp_hello_done(sim_prov_t *p, sim_conn_t *c) {
    sim_qp_t *qp = hello_target(p, c);
    if (!qp) {
        OTE_WARN(SIM_LOG,
                 "sim: connection for QP %llu from QP %u refused (no such QP, not connected, "
                 "or not its RTR destination)",
                 (unsigned long long)c->h.raddr, c->h.imm);
        ote__sim_conn_close(p, c); /* the requester sees the peer gone */
        return;
    }
    c->qp = qp;
    /* A connection from a QP of this instance joins its requester's progress thread: one
     * QP pair's traffic on one thread, different pairs in parallel. */
    uint32_t src = c->h.imm;
    sim_qp_t *rq = NULL;
    HASH_FIND(hh, p->qps, &src, sizeof(src), rq);
    if (rq && rq->req && !rq->req->dead) ote__sim_conn_move(p, c, rq->req->owner);
    else ote__sim_conn_move(p, c, (int)(p->conn_rr++ % (uint32_t)p->nthr));
}

/*
 * verbs/sim/wire_req.c - the requester side of the sim's transport: the send queue turned
 * into frames (local WRs such as BIND_MW and LOCAL_INV run here), the connection a QP
 * opens with its HELLO, ACK/NAK handling with RNR go-back, the retry-exceeded timer, and
 * READ responses landing in the local SGEs.
 */
#include <errno.h>
#include <linux/sockios.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "verbs/sim/sim_internal.h"

static const uint32_t k_rnr_us[32] = {655360, 10,    20,    30,     40,     60,     80,     120,
                                      160,    240,   320,   480,    640,    960,    1280,   1920,
                                      2560,   3840,  5120,  7680,   10240,  15360,  20480,  30720,
                                      40960,  61440, 81920, 122880, 163840, 245760, 327680, 491520};

static sim_swr_t *slot(sim_qp_t *qp, uint64_t seq) { return &qp->sq[seq % qp->max_send_wr]; }

static bool is_remote(enum ibv_wr_opcode op) {
    return op != IBV_WR_BIND_MW && op != IBV_WR_LOCAL_INV;
}

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
              !(e->bacc & ~(IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                            IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_ZERO_BASED)) &&
              !(e->bacc & IBV_ACCESS_ZERO_BASED);
    if (ok && (e->bacc & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
        !(mr->access & IBV_ACCESS_LOCAL_WRITE))
        ok = false;
    if (ok) {
        uint64_t base = mr->va;
        if (e->baddr < base || e->blen > mr->ibmr.length ||
            e->baddr - base > mr->ibmr.length - e->blen)
            ok = false;
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

static bool conn_open(sim_prov_t *p, sim_qp_t *qp) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    ote__sim_set_bufs(fd);
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
    sim_conn_t *c = ote__sim_conn_new(p, fd, (int)(p->conn_rr++ % (uint32_t)p->nthr));
    if (!c) {
        close(fd);
        return false;
    }
    sim_frame_t *f = ote__sim_frame_new(0);
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
    ote__sim_conn_queue(c, f);
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
            if (ote__sim_mw_invalidate(p, qp, e->imm, false)) {
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
        if (ote__sim_scatter_hazard(p, qp, e)) { /* mlx5 profile: logged and counted */
            swr_fail(qp, e, IBV_WC_LOC_PROT_ERR);
            qp->sq_next++;
            continue;
        }
        if ((e->flags & IBV_SEND_FENCE) && qp->reads_out > 0) break;
        if (e->op == IBV_WR_RDMA_READ && (uint32_t)qp->reads_out >= max_reads) break;
        if (!qp->req || qp->req->dead || !ote__sim_port_up(qp)) break;
        sim_frame_t *f =
            ote__sim_frame_new(e->op == IBV_WR_RDMA_READ ? 0 : (e->inlined ? 1 : e->nsge));
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
        h->gen = qp->tx_gen;
        h->imm = e->imm;
        h->rkey = e->rkey;
        h->raddr = e->raddr;
        if (e->op == IBV_WR_RDMA_READ) {
            h->imm = (uint32_t)e->len;
            h->len = 0;
            qp->reads_out++;
        } else {
            h->len = e->len;
            if (e->inlined) ote__sim_frame_add(f, e->inl, e->len, NULL);
            else
                for (int i = 0; i < e->nsge; i++)
                    ote__sim_frame_add(f, ote__sim_sge_host(p, &e->sge[i]), e->sge[i].length,
                                       ote__sim_mr_lookup(p, e->sge[i].lkey));
        }
        ote__sim_conn_queue(qp->req, f);
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
    /* The responder's answers to what was sent before, DROPs of the requests after s
     * among them, may still be on their way: they no longer say anything of the peer. */
    qp->tx_gen++;
    qp->peer_dropped = false;
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

/* Why a live connection is not a silent peer (NULL: it is): bytes still queued here (our
 * own port's egress wait, or a full socket), bytes the peer has not read yet (its process
 * is slow or stopped: a NIC would have taken and ACKed them without that CPU), or bytes
 * from it that this side has not read yet (this process was slow). Asked only when the
 * retry bound is reached. */
static const char *req_not_silent(const sim_conn_t *c) {
    int n = 0;
    if (c->tx_head) return "requests still queued for this port's egress";
    if (ioctl(c->fd, SIOCOUTQ, &n) == 0 && n > 0) return "the peer has not read them yet";
    if (ioctl(c->fd, SIOCINQ, &n) == 0 && n > 0) return "its answers are not read here yet";
    return NULL;
}

/* The retry-exceeded clock (VERBS_FACTS 4; sim.h "Retry exceeded"): it runs from the last
 * progress (bytes sent or received on the QP's connection), and only while the peer could
 * have answered. A lost connection fails at the bound; a live one fails only when the
 * peer has read everything sent and answered nothing (its QP in ERR or gone, its port
 * down, a PSN mismatch); otherwise the clock restarts. */
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
    uint64_t bound = ote__sim_retry_bound_ns(qp, lost);
    if (now - since < bound) return;
    const char *busy = !lost && qp->req && !qp->req->dead ? req_not_silent(qp->req) : NULL;
    /* A live peer that dropped nothing is slow, not silent: a NIC would have answered.
     * With our own port down nothing reaches it: silence. */
    if (!busy && !lost && !qp->peer_dropped && ote__sim_port_up(qp))
        busy = "the peer dropped nothing";
    if (busy) {
        OTE_DEBUG(SIM_LOG, "sim: QP %u: no answer for %llu ms, but %s: retry clock restarted",
                  qp->ibqp.qp_num, (unsigned long long)((now - since) / OTE_NSEC_PER_MSEC), busy);
        qp->progress_ns = now;
        return;
    }
    OTE_INFO(SIM_LOG, "sim: QP %u: no answer for %llu ms (bound %llu ms, %s): RETRY_EXC_ERR",
             qp->ibqp.qp_num, (unsigned long long)((now - since) / OTE_NSEC_PER_MSEC),
             (unsigned long long)(bound / OTE_NSEC_PER_MSEC),
             lost ? "connection lost" : "the peer read the requests and said nothing");
    for (uint64_t s = qp->sq_head; s < qp->sq_tail; s++) {
        sim_swr_t *e = slot(qp, s);
        if (e->state != SWR_DONE && is_remote(e->op)) {
            swr_fail(qp, e, IBV_WC_RETRY_EXC_ERR);
            if (s >= qp->sq_next) qp->sq_next = s + 1;
            break;
        }
    }
}

void ote__sim_req_pump(sim_prov_t *p, sim_qp_t *qp, uint64_t now) {
    if (qp->state != IBV_QPS_RTS && qp->state != IBV_QPS_SQD) return;
    if (qp->rnr_until_ns) {
        if (now < qp->rnr_until_ns) return;
        qp->rnr_until_ns = 0;
        qp->progress_ns = now;
    }
    if (qp->sq_head == qp->sq_tail) return;
    if (qp->state == IBV_QPS_RTS && !qp->req && !qp->conn_lost && !qp->halted &&
        ote__sim_port_up(qp)) {
        bool need = false;
        for (uint64_t s = qp->sq_next; s < qp->sq_tail; s++)
            if (is_remote(slot(qp, s)->op)) need = true;
        if (need) conn_open(p, qp);
    }
    req_build(p, qp);
    req_timers(qp, now);
    ote__sim_qp_complete(qp);
    /* Sent by its owner's pass (a connection just opened may belong to another thread);
     * the pump itself never releases prov->mu. */
    if (qp->req && qp->req->tx_head && qp->req->owner != ote__sim_self())
        ote__sim_wake_thr(p, qp->req->owner);
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
                OTE_INFO(SIM_LOG, "sim: QP %u: RNR NAK after %d retries: RNR_RETRY_EXC_ERR",
                         qp->ibqp.qp_num, qp->rnr_tries);
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

/* A header on our own (requester) connection: ACK, NAK or READ response. */
void ote__sim_req_on_header(sim_prov_t *p, sim_conn_t *c) {
    sim_hdr_t *h = &c->h;
    sim_qp_t *qp = c->qp;
    bool live = qp && (qp->state == IBV_QPS_RTS || qp->state == IBV_QPS_SQD);
    if (qp != NULL && h->gen == qp->tx_gen) qp->peer_dropped = h->type == SIM_MSG_DROP;
    switch (h->type) {
        case SIM_MSG_ACK:
            if (live) on_ack(qp, h);
            break;
        case SIM_MSG_NAK:
            if (live) on_nak(qp, h);
            break;
        case SIM_MSG_DROP: break; /* the retry clock may run out (req_timers) */
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
            c->act = SIM_ACT_RRESP;
            c->act_seq = s;
            c->act_epoch = qp->epoch;
            /* the local SGEs were checked at post; they may have been deregistered since */
            if (ote__sim_check_local(p, qp->pd, e->sge, e->nsge, true, len))
                ote__sim_div_sges(p, c, e->sge, e->nsge, len);
            else c->act_revoked = true;
            break;
        }
        default: ote__sim_conn_close(p, c); break;
    }
}

/* The payload of a READ response has landed (or was dropped): complete the READ. */
void ote__sim_req_read_done(sim_prov_t *p, sim_conn_t *c) {
    (void)p;
    sim_qp_t *qp = c->qp;
    if (!qp || qp->epoch != c->act_epoch) return;
    sim_swr_t *e = slot(qp, c->act_seq);
    if (e->state != SWR_SENT) return;
    if (c->act_revoked) { /* a local SGE's MR went away: nothing was written */
        swr_fail(qp, e, IBV_WC_LOC_PROT_ERR);
        ote__sim_qp_complete(qp);
        return;
    }
    e->state = SWR_DONE;
    e->status = IBV_WC_SUCCESS;
    e->byte_len = (uint32_t)(c->h.len < e->len ? c->h.len : e->len);
    qp->reads_out--;
    qp->rnr_tries = 0;
    ote__sim_qp_complete(qp);
}

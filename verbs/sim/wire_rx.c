/*
 * verbs/sim/wire_rx.c - the sim's receive engine: headers parsed from a staging buffer,
 * payloads read straight into their destination iovs (readv) or dropped once the
 * destination is revoked or its QP has left the states that accept bytes, and the
 * dispatch of each header and finished payload to the requester or responder side.
 */
#include <errno.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "verbs/sim/sim_internal.h"

void ote__sim_div_sges(sim_prov_t *p, sim_conn_t *c, const struct ibv_sge *sge, int n,
                       uint64_t len) {
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

void ote__sim_div_one(sim_conn_t *c, void *base, uint64_t len, const void *own) {
    c->ndiv = 0;
    c->idiv = 0;
    if (len) {
        c->div[0].iov_base = base;
        c->div[0].iov_len = len;
        c->div_own[0] = own;
        c->ndiv = 1;
    }
}

/* A header arrived: reset the payload state and let the side that owns the connection
 * decide where the payload goes (SIM_ACT_* and the destination iovs). */
static void on_header(sim_prov_t *p, sim_conn_t *c) {
    c->act = SIM_ACT_NONE;
    c->act_revoked = false;
    c->ndiv = 0;
    c->idiv = 0;
    c->remaining = c->h.len;
    if (c->requester) ote__sim_req_on_header(p, c);
    else ote__sim_resp_on_header(p, c);
}

static void on_payload_done(sim_prov_t *p, sim_conn_t *c) {
    switch (c->act) {
        case SIM_ACT_HELLO: ote__sim_resp_hello_done(p, c); break;
        case SIM_ACT_RECV:
        case SIM_ACT_WRITE:
        case SIM_ACT_WRITE_IMM: ote__sim_resp_done(p, c); break;
        case SIM_ACT_RRESP: ote__sim_req_read_done(p, c); break;
        default: break;
    }
    c->act = SIM_ACT_NONE;
}

/* The destination of the next k payload bytes (at most cap iovs): the iovs from c->idiv,
 * cut at k bytes; *total_out: the bytes they hold (less than k when the rest is dropped). */
static int div_take(const sim_conn_t *c, size_t k, struct iovec *iov, int cap, size_t *total_out) {
    int n = 0;
    size_t t = 0;
    for (int i = c->idiv; i < c->ndiv && t < k && n < cap; i++) {
        size_t l = c->div[i].iov_len;
        if (l > k - t) l = k - t;
        iov[n].iov_base = c->div[i].iov_base;
        iov[n].iov_len = l;
        t += l;
        n++;
    }
    *total_out = t;
    return n;
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
        case SIM_ACT_RECV:
        case SIM_ACT_WRITE:
        case SIM_ACT_WRITE_IMM:
            return qp && qp->epoch == c->act_epoch &&
                   (qp->state == IBV_QPS_RTR || qp->state == IBV_QPS_RTS ||
                    qp->state == IBV_QPS_SQD);
        case SIM_ACT_RRESP: return qp && qp->epoch == c->act_epoch;
        case SIM_ACT_HELLO: return true;
        default: return false;
    }
}

/* A read(2) of c's socket ended with n (err its errno): 1 to go on reading, 0 when c
 * was closed (EOF, an error) or the socket has nothing now. */
static int rx_read_ended(sim_prov_t *p, sim_conn_t *c, ssize_t n, int err) {
    if (n == 0) {
        ote__sim_conn_close(p, c);
        return 0;
    }
    if (n < 0) {
        if (err == EINTR) return 1;
        if (err != EAGAIN && err != EWOULDBLOCK) ote__sim_conn_close(p, c);
        return 0;
    }
    return 1;
}

/* RX_HDR without a whole header staged: the staging buffer (the owner's alone: moved and
 * filled outside prov->mu) compacted and filled from the socket. 0: stop reading now. */
static int rx_fill_staging(sim_prov_t *p, sim_conn_t *c, size_t *budget) {
    ote__sim_io_enter(p, c, OTE_SIM_COPY_RX, 0);
    if (c->rpos > 0) {
        memmove(c->rbuf, c->rbuf + c->rpos, c->rlen - c->rpos);
        c->rlen -= c->rpos;
        c->rpos = 0;
    }
    ssize_t n = read(c->fd, c->rbuf + c->rlen, SIM_RXBUF - c->rlen);
    int err = errno;
    ote__sim_io_leave(p, c);
    if (n <= 0) return rx_read_ended(p, c, n, err);
    c->rlen += (size_t)n;
    *budget -= (size_t)n < *budget ? (size_t)n : *budget;
    ote__sim_conn_touch(c);
    return 1;
}

/* RX_PAYLOAD with the staging buffer empty: read straight into the destination (outside
 * prov->mu), what follows the payload into staging. 0: stop reading now. */
static int rx_read_direct(sim_prov_t *p, sim_conn_t *c, size_t *budget) {
    c->rpos = c->rlen = 0;
    struct iovec iov[SIM_MAX_SGE + 2];
    size_t direct = 0;
    size_t want = c->remaining < SIZE_MAX ? (size_t)c->remaining : SIZE_MAX;
    int n = div_take(c, want, iov, SIM_MAX_SGE + 1, &direct);
    iov[n].iov_base = c->rbuf;
    iov[n].iov_len = SIM_RXBUF;
    n++;
    ote__sim_io_enter(p, c, OTE_SIM_COPY_RX, direct);
    ssize_t r = readv(c->fd, iov, n);
    int err = errno;
    ote__sim_io_leave(p, c);
    if (r <= 0) return rx_read_ended(p, c, r, err);
    ote__sim_conn_touch(c);
    *budget -= (size_t)r < *budget ? (size_t)r : *budget;
    size_t got = (size_t)r;
    size_t into_div = got < direct ? got : direct;
    div_advance(c, into_div);
    c->remaining -= into_div;
    c->rlen = got - into_div; /* the rest landed in staging */
    return 1;
}

void ote__sim_conn_rx(sim_prov_t *p, sim_conn_t *c) {
    size_t budget = 256u << 20;
    /* (a HELLO may hand c to another thread: it goes on there) */
    while (!c->dead && budget > 0 && c->owner == ote__sim_self()) {
        if (c->rx == RX_HDR && c->rresp) {
            /* The next request executes only after the READ response ahead of it is
             * fully sent (in order, and no later request can revoke what it reads). */
            ote__sim_conn_tx(p, c);
            if (c->dead) return;
            if (c->rresp) {
                c->rx_blocked = true;
                ote__sim_conn_events(p, c);
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
            if (!rx_fill_staging(p, c, &budget)) return;
            continue;
        }
        /* RX_PAYLOAD */
        if (c->idiv < c->ndiv && !div_live(c)) c->idiv = c->ndiv; /* drop the rest */
        size_t avail = c->rlen - c->rpos;
        if (avail > 0 && c->remaining > 0) {
            size_t k = avail < c->remaining ? avail : (size_t)c->remaining;
            struct iovec iov[SIM_MAX_SGE + 1];
            size_t into = 0;
            int n = div_take(c, k, iov, SIM_MAX_SGE + 1, &into);
            if (n > 0) { /* copied outside prov->mu; bytes beyond the destination drop */
                const uint8_t *src = c->rbuf + c->rpos;
                ote__sim_io_enter(p, c, OTE_SIM_COPY_RX, into);
                for (int i = 0; i < n; i++) {
                    memcpy(iov[i].iov_base, src, iov[i].iov_len);
                    src += iov[i].iov_len;
                }
                ote__sim_io_leave(p, c);
                div_advance(c, into); /* nothing when revoked meanwhile (idiv = ndiv) */
            }
            c->rpos += k;
            c->remaining -= k;
        }
        if (c->remaining == 0) {
            c->rx = RX_HDR;
            on_payload_done(p, c);
            continue;
        }
        if (!rx_read_direct(p, c, &budget)) return;
    }
    if (budget == 0 && !c->dead && c->owner == ote__sim_self()) {
        /* Out of budget, not of bytes: whole frames may wait in staging with the socket
         * empty, so no EPOLLIN would come for them. Go on in the next round. */
        c->kick = true;
        ote__sim_wake_thr(p, c->owner);
    }
}

/*
 * engine/rdma/rdma_server.c - the source side's control plane: the control connections
 * the engine's listener hands over (ote__rdma_adopt: accepted, in back-off or not, and
 * authenticated by the listener when the engine has a key), one joinable thread each
 * (joined by the monitor once it ends, which closes the socket). Such a thread alone
 * waits on its connection; it answers the HELLO the listener read (it sits in the
 * connection's input), takes only the negotiated version after it, answers INFO, NOTIFY
 * and BUFS_REQ (buffer discovery: the engine's list, host->buffers), and hands CONNECT
 * and GRANT_REQ to the source side (rdma_source.c). Touches tp->sconns (under tp->mu)
 * and the handshake fields of its own connections.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/log.h"
#include "base/thread.h"
#include "engine/rdma/rdma_internal.h"
#include "engine/rdma/rdma_src_parents.h"

/* Answer a HELLO; 0 when the handshake is done (c->version set). */
static int server_hello(conn_t *c, const ote_ctl_msg_t *m) {
    rdma_tp_t *tp = c->tp;
    uint16_t ver = 0;
    ote_ctl_msg_t a;
    memset(&a, 0, sizeof(a));
    a.version = OTE_CTL_VERSION_MIN;
    a.req_id = m->req_id;
    /* The listener hands over only a HELLO whose versions meet ours (it answers a
     * mismatch itself): a defensive check, closing without an answer. */
    if (ote_ctl_negotiate(m, OTE_CTL_VERSION_MIN, OTE_CTL_VERSION_MAX, &ver) != OTE_OK) {
        OTE_ERROR("rdma",
                  "adopted control connection from %s: HELLO without a common version: "
                  "closing",
                  c->peer_addr);
        return -1;
    }
    size_t alen = m->u.hello.addr_len < sizeof(c->peer_addr) - 1 ? m->u.hello.addr_len
                                                                 : sizeof(c->peer_addr) - 1;
    memcpy(c->peer_addr, m->u.hello.addr, alen);
    c->peer_addr[alen] = '\0';
    memcpy(c->peer_name, m->u.hello.name != NULL ? m->u.hello.name : "", m->u.hello.name_len);
    c->peer_name[m->u.hello.name_len] = '\0'; /* <= OTE_CTL_MAX_NAME (decoded) */
    a.version = ver;
    a.opcode = OTE_CTL_HELLO_ACK;
    a.u.hello_ack.version = ver;
    a.u.hello_ack.max_data = OTE_CTL_MAX_DATA;
    a.u.hello_ack.addr = tp->addr;
    a.u.hello_ack.addr_len = (uint32_t)strlen(tp->addr);
    size_t il = tp->host.info ? strlen(tp->host.info) : 0; /* for the engine's router */
    a.u.hello_ack.info = tp->host.info;
    a.u.hello_ack.info_len = (uint16_t)(il > OTE_CTL_MAX_INFO ? 0 : il);
    if (ote__rdma_conn_send(c, &a) != OTE_OK) return -1;
    c->version = ver;
    return 0;
}

/* BUFS_REQ (buffer discovery): the engine's list, or BUFS with OTE_ERR_AGAIN. */
static int server_buffers(conn_t *c, uint64_t req_id) {
    rdma_tp_t *tp = c->tp;
    uint8_t *frame = NULL;
    size_t len = 0;
    ote_status_t st = tp->host.buffers != NULL
                          ? tp->host.buffers(tp->host.arg, c->version, req_id, &frame, &len)
                          : OTE_ERR_REMOTE;
    if (st == OTE_OK) {
        st = ote__rdma_conn_send_raw(c, frame, len);
        ote_free(frame);
        return st == OTE_OK ? 0 : -1;
    }
    ote_free(frame);
    ote_ctl_msg_t a;
    memset(&a, 0, sizeof(a));
    a.version = c->version;
    a.opcode = OTE_CTL_BUFS;
    a.req_id = req_id;
    a.status = OTE_ERR_AGAIN;
    return ote__rdma_conn_send(c, &a) == OTE_OK ? 0 : -1;
}

#define SERVER_SETTLE_MS 2000

static int settle_now(void *arg) {
    (void)arg;
    return 1; /* ote_cq_lane_progress: only its wait for the poll under way */
}

/*
 * Before a notification is delivered, this thread takes what every CQ lane of the
 * transport has queued. The requester sends a batch's notification once its requests
 * ended, and each of its grants ended on the completion of its receipt (SEND_WITH_INV),
 * which the source's provider queued on one of these lanes first. Taking them here
 * releases those grants' pins before the user hears of the notification, instead of
 * whenever a lane worker is scheduled: ote_memory_unregister on the notification
 * (ote.h "Free again") would otherwise depend on that worker running within
 * OTE_UNREGISTER_WAIT_MS, which a loaded machine does not promise. A lane a worker is
 * polling: its batch is waited for (ote_cq_lane_progress), then looked at again. Bounded
 * by SERVER_SETTLE_MS; a lane that keeps completing is left to its worker then.
 */
static void settle_lanes(rdma_tp_t *tp) {
    ote_deadline_t dl = ote_deadline_after(SERVER_SETTLE_MS * OTE_NSEC_PER_MSEC);
    for (uint32_t k = 0; k < tp->nnics; k++) {
        rdma_nic_t *n = &tp->nics[k];
        for (uint32_t i = 0; i < n->nlanes; i++) {
            if (n->lanes[i] == NULL) continue;
            while (!ote_deadline_expired(dl)) {
                int polled = 0;
                ote_status_t st = ote_cq_lane_poll(n->lanes[i], &polled);
                if (st == OTE_OK && polled == 0) break;
                if (st == OTE_OK) continue;
                if (ote_status_code(st) != OTE_ERR_BUSY) break; /* the worker logs it */
                if (ote_cq_lane_progress(n->lanes[i], settle_now, NULL, dl) != OTE_OK) break;
            }
        }
    }
}

/* One frame after the handshake; 0 to go on, -1 to close the connection. */
static int server_frame(conn_t *c, const ote_ctl_msg_t *m, int *have_info) {
    rdma_tp_t *tp = c->tp;
    if (m->opcode == OTE_CTL_NOTIFY) {
        settle_lanes(tp);
        ote_status_t st = tp->host.deliver_notify(tp->host.arg, c->peer_addr, c->peer_name,
                                                  m->u.notify.msg, m->u.notify.len);
        ote_ctl_msg_t a;
        memset(&a, 0, sizeof(a));
        a.version = c->version;
        a.opcode = OTE_CTL_NOTIFY_ACK;
        a.req_id = m->req_id;
        a.status = st;
        return ote__rdma_conn_send(c, &a) == OTE_OK ? 0 : -1;
    }
    if (m->opcode == OTE_CTL_BUFS_REQ) return server_buffers(c, m->req_id);
    if (m->opcode != OTE_CTL_RDMA) {
        OTE_WARN("rdma", "control from %s: unexpected %s frame: closing", c->peer_addr,
                 ote_ctl_opcode_str(m->opcode));
        return -1;
    }
    ote_rp_msg_t rq;
    if (ote__rp_decode(m->u.rdma.body, m->u.rdma.len, &rq) != OTE_OK) {
        OTE_WARN("rdma", "control from %s: malformed RDMA message: closing", c->peer_addr);
        return -1;
    }
    if (rq.type == OTE_RP_INFO) {
        /* Under tp->mu: a connection of the same requester that ends meanwhile reads
         * process/pd to decide whether its endpoints are still in use (server_peer_gone). */
        ote_mutex_lock(&tp->mu);
        c->process = rq.u.info.process;
        c->pd = rq.u.info.pd;
        c->nic = rq.u.info.nic;
        c->lanes = rq.u.info.lanes;
        c->ndev = rq.u.info.ndev;
        memcpy(c->nics, rq.u.info.nics, sizeof(c->nics));
        c->epoch = rq.u.info.epoch;
        ote_mutex_unlock(&tp->mu);
        *have_info = 1;
        ote_rp_msg_t rp;
        ote__rdma_local_info(tp, &rp, OTE_RP_INFO_ACK);
        return ote__rdma_conn_send_rp(c, m->req_id, OTE_OK, &rp) == OTE_OK ? 0 : -1;
    }
    if (!*have_info) {
        OTE_WARN("rdma", "control from %s: request before INFO: closing", c->peer_addr);
        return -1;
    }
    if (rq.type == OTE_RP_CONNECT) {
        ote__rdma_src_connect(c, m->req_id, &rq);
    } else if (rq.type == OTE_RP_GRANT_REQ) {
        ote__rdma_src_grant(c, m->req_id, &rq);
        ote__rdma_monitor_wake(tp); /* a grant served has a deadline (rdma_monitor.c) */
    } else if (rq.type == OTE_RP_WRITE_OFF) {
        ote__rdma_acct_write_off(c, &rq);
    } else if (rq.type == OTE_RP_EP_RESET) {
        ote__rdma_src_reset(c, &rq);
    } else if (rq.type == OTE_RP_RELEASE) {
        ote__rdma_src_release(c, &rq);
    } else {
        OTE_WARN("rdma", "control from %s: unexpected message %u: closing", c->peer_addr, rq.type);
        return -1;
    }
    return 0;
}

#define SERVER_RECEIPT_GRACE_MS 20

/* The requester on c is gone (its control connection closed or died): release at once
 * what it held here, every live source grant of its endpoints (window, registration pin,
 * QP borrow), rather than at each grant's deadline. */
static void server_peer_gone(conn_t *c) {
    rdma_tp_t *tp = c->tp;
    if (c->process == 0 || atomic_load(&tp->stop)) return; /* no INFO: it holds nothing */
    /* Its endpoints here (caps 2, 3: direct, rdma_direct.c): every (our device, its device) pair it used (src_used: a paused
     * device's pairs were served on another one, and moved back when it came up). */
    enum { MAXE = OTE__RDMA_MAX_NICS * OTE__RDMA_MAX_NICS * 4 };
    ote_endpoint_t *eps[MAXE];
    rdma_nic_t *nics[MAXE];
    size_t ne = 0;
    uint32_t nr = c->ndev < OTE__RDMA_MAX_NICS ? c->ndev : OTE__RDMA_MAX_NICS;
    for (uint32_t r = 0; r < nr; r++)
        for (uint32_t d = 0; d < tp->nnics; d++)
            for (int cap = 0; (c->src_used[r] >> d & 1u) && cap < 4; cap++)
                if (ote__rdma_src_ep_on(c, d, r, (ote_ep_cap_t)cap, &eps[ne]) == OTE_OK)
                    nics[ne++] = &tp->nics[d];
    /* A requester that closed cleanly sent its last receipts before it closed: give the
     * lane workers SERVER_RECEIPT_GRACE_MS to take them, so that only what a dead
     * requester really left behind is ended by force. */
    ote_deadline_t dl = ote_deadline_after(SERVER_RECEIPT_GRACE_MS * OTE_NSEC_PER_MSEC);
    for (;;) {
        size_t live = 0;
        for (size_t i = 0; i < ne; i++) live += ote_grant_source_live_endpoint(nics[i]->gm, eps[i]);
        if (live == 0 || ote_deadline_expired(dl)) break;
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    size_t n = 0;
    for (size_t i = 0; i < ne; i++) n += ote_grant_source_end_endpoint(nics[i]->gm, eps[i]);
    if (n > 0)
        OTE_WARN("rdma", "requester %s lost: %zu grant(s) it held released", c->peer_addr, n);
    /* Its endpoints go too (their QPs once drained), unless another connection of the same
     * requester process uses them already (it reconnected): decided and done under tp->mu,
     * which such a connection takes to publish its INFO before it looks them up. */
    size_t ev = 0;
    ote_mutex_lock(&tp->mu);
    int shared = 0;
    for (size_t i = 0; i < tp->nsconns && !shared; i++) {
        const conn_t *o = tp->sconns[i]->c;
        shared = o != c && !tp->sconns[i]->exited && o->process == c->process && o->pd == c->pd;
    }
    for (size_t i = 0; i < ne && !shared; i++) {
        int dup = 0; /* evicted once: a reclaim may free it right after */
        for (size_t q = 0; q < i && !dup; q++) dup = eps[q] == eps[i];
        if (dup) continue;
        (void)ote_endpoint_evict(eps[i]);
        ev++;
    }
    ote_mutex_unlock(&tp->mu);
    if (ev > 0)
        OTE_INFO("rdma", "requester %s lost: its %zu source endpoint(s) evicted", c->peer_addr, ev);
}

static void *server_main(void *arg) {
    srv_t *sv = arg;
    conn_t *c = sv->c;
    rdma_tp_t *tp = c->tp;
    int have_info = 0;
    for (;;) {
        ote_ctl_msg_t m;
        if (ote__rdma_conn_next(c, &m, UINT64_MAX, &tp->stop) != OTE_OK) break;
        if (c->version == 0) {
            /* The first frame is the HELLO the listener read and checked (ote__rdma_adopt
             * puts it first): a defensive check, never true while the listener keeps to
             * its contract. */
            if (m.opcode != OTE_CTL_HELLO) {
                OTE_ERROR("rdma", "adopted control connection from %s began with %s: closing",
                          c->peer_addr, ote_ctl_opcode_str(m.opcode));
                break;
            }
            if (server_hello(c, &m) != 0) break;
            continue;
        }
        if (m.version != c->version) {
            OTE_WARN("rdma",
                     "control from %s: %s frame of version %u on a connection that "
                     "negotiated %u: closing",
                     c->peer_addr, ote_ctl_opcode_str(m.opcode), m.version, c->version);
            break;
        }
        if (m.opcode == OTE_CTL_HELLO) {
            OTE_WARN("rdma", "control from %s: second HELLO: closing", c->peer_addr);
            break;
        }
        if (server_frame(c, &m, &have_info) != 0) break;
    }
    ote__rdma_conn_kill(c, NULL);
    /* Its staged grants whose copy runs hold its account, parent slot and QP borrows: they
     * end (refused, c is dead) by their deadline, which the GPU worker (a file's read: the
     * file owner) keeps. */
    for (;;) {
        uint64_t ms = tp->cfg.transfer_timeout_ms + 2000;
        ote__rdma_src_wait_copies(tp, c, ote_deadline_after(ms * OTE_NSEC_PER_MSEC));
        if (atomic_load(&c->src_copies) == 0) break;
        OTE_ERROR("rdma", "requester %s: %d staging copies still running past their deadline",
                  c->peer_addr, atomic_load(&c->src_copies));
    }
    ote__rdma_sp_end_conn(tp, c); /* its parents' reservations (rdma_src_parents.c) */
    server_peer_gone(c);
    ote__rdma_acct_end_conn(tp, c); /* nothing more comes: accounts end with their grants */
    ote_mutex_lock(&tp->mu);
    sv->exited = 1;
    ote_cond_broadcast(&tp->cv);
    ote_mutex_unlock(&tp->mu);
    return NULL;
}

/* Under tp->mu: join and drop server threads that have exited. */
static void reap_servers_locked(rdma_tp_t *tp) {
    for (size_t i = 0; i < tp->nsconns;) {
        srv_t *sv = tp->sconns[i];
        if (!sv->exited) {
            i++;
            continue;
        }
        (void)pthread_join(sv->th, NULL); /* it has returned or is returning */
        ote__rdma_conn_put(sv->c);
        ote_free(sv);
        tp->sconns[i] = tp->sconns[--tp->nsconns];
    }
}

void ote__rdma_servers_reap(rdma_tp_t *tp) {
    /* From stop on, only teardown reaps (while the engine its puts report to exists): a
     * transport retained with a stuck thread never reports to a freed engine. */
    if (atomic_load(&tp->stop)) return;
    ote_mutex_lock(&tp->mu);
    reap_servers_locked(tp);
    ote_mutex_unlock(&tp->mu);
}

/* Room for one more entry in tp->sconns (tp->mu held): grows it by doubling. */
static int sconns_room(rdma_tp_t *tp) {
    if (tp->nsconns < tp->capsconns) return 1;
    size_t cap = tp->capsconns != 0 ? tp->capsconns * 2 : 64;
    srv_t **n = ote_realloc(tp->sconns, cap * sizeof(*n));
    if (n == NULL) return 0;
    tp->sconns = n;
    tp->capsconns = cap;
    return 1;
}

ote_status_t ote__rdma_adopt(ote__transport_t *t, int fd, const char *from, const uint8_t *hello,
                             size_t len) {
    rdma_tp_t *tp = (rdma_tp_t *)t;
    if (len > OTE__RDMA_FRAME_MAX) {
        close(fd);
        return OTE_ERR_TOO_BIG;
    }
    conn_t *c = ote__rdma_conn_new(tp, fd); /* closes fd on failure */
    if (c == NULL) return OTE_ERR_NOMEM;
    memcpy(c->in, hello, len); /* the server thread's first frame */
    c->ilen = len;
    snprintf(c->peer_addr, sizeof(c->peer_addr), "%s", from); /* until its HELLO names it */
    ote_mutex_lock(&tp->mu);
    reap_servers_locked(tp);
    if (tp->nsconns >= tp->cfg.rdma_max_peers || !sconns_room(tp)) {
        int full = tp->nsconns >= tp->cfg.rdma_max_peers;
        ote_mutex_unlock(&tp->mu);
        if (full)
            OTE_WARN_LIMITED("rdma",
                             "control connection from %s refused: this engine serves "
                             "rdma_max_peers=%u requesters already",
                             from, tp->cfg.rdma_max_peers);
        else OTE_WARN_LIMITED("rdma", "control connection from %s refused: out of memory", from);
        ote__rdma_conn_put(c);
        return full ? OTE_ERR_BUSY : OTE_ERR_NOMEM;
    }
    srv_t *sv = ote_calloc(1, sizeof(*sv));
    if (sv != NULL) sv->c = c;
    c->adopted = 1; /* its last put reports it closed */
    if (sv == NULL || ote_thread_create(&sv->th, NULL, server_main, sv) != 0) {
        ote_mutex_unlock(&tp->mu);
        ote_free(sv);
        c->adopted = 0; /* not taken: the listener counts it closed */
        ote__rdma_conn_put(c);
        return OTE_ERR_NOMEM;
    }
    tp->sconns[tp->nsconns++] = sv;
    ote_mutex_unlock(&tp->mu);
    return OTE_OK;
}

size_t ote__rdma_servers_stop(rdma_tp_t *tp, uint64_t wait_ms) {
    /* Wake the server connection threads (each polls tp->stop every
     * OTE__RDMA_CONN_POLL_MS and its own waits are bounded) and join them. */
    ote_mutex_lock(&tp->mu);
    for (size_t i = 0; i < tp->nsconns; i++) ote__rdma_conn_kill(tp->sconns[i]->c, NULL);
    ote_deadline_t dl = ote_deadline_after(wait_ms * OTE_NSEC_PER_MSEC);
    for (;;) {
        reap_servers_locked(tp);
        if (tp->nsconns == 0) break;
        if (ote_cond_wait(&tp->cv, &tp->mu, dl) == OTE_ERR_TIMEOUT) {
            reap_servers_locked(tp);
            break;
        }
    }
    size_t stuck = tp->nsconns;
    ote_mutex_unlock(&tp->mu);
    return stuck;
}

/*
 * engine/rdma/rdma.c - the RDMA transport: composes context, cq, qp, endpoint and grant
 * behind the engine's transport table (engine/transport.h).
 *
 * Owns: the verbs provider (verbs_provider=sim|rdma-core), the context set, the buffer
 * manager (a persistent MR per registration in every usable context, MW-bindable and
 * local-only: peers reach memory only through windows), `nlanes` CQ lanes on the data
 * context with one worker per lane, the endpoint store, the grant manager, a control
 * listener (its own TCP socket: HELLO/HELLO_ACK, then OTE_CTL_RDMA messages; nothing
 * before HELLO, nothing of another version after it), one joinable thread per control
 * connection (which alone waits on its non-blocking socket and flushes its bounded
 * output queue: no other thread ever blocks on a peer) and a monitor thread (async
 * events, grant and notification deadlines, endpoint reclaim). Every status a peer
 * reports passes through ote_ctl_peer_status().
 *
 * Requester path of one engine slice: pick the least-loaded slot of the (peer, cap)
 * endpoint, borrow its QP (building it with a CONNECT round trip when cold), find the
 * local MR (or register a temporary one), start a grant (GRANT_REQ), and the grant layer
 * posts the 64 KiB slices and the SEND_WITH_INV receipt; its done() ends the engine slice.
 * Source path: CONNECT builds/returns the source QP of that slot; GRANT_REQ is checked
 * against the engine's registrations (host->pin) and served with a bound window.
 *
 * Data path uses the first usable context (NIC striping across contexts is later work).
 * No fallback: with no usable device, creation fails with OTE_ERR_NO_DEVICE.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/lock.h"
#include "base/log.h"
#include "context/buffers.h"
#include "context/context.h"
#include "cq/lane.h"
#include "cq/workers.h"
#include "endpoint/endpoint.h"
#include "engine/control/ctl.h"
#include "engine/engine_internal.h"
#include "engine/transport.h"
#include "engine/rdma/proto.h"
#include "engine/rdma/test_hook.h"
#include "grant/grant.h"
#include "ote/ote.h"
#include "qp/qp.h"
#include "verbs/verbs.h"

#define MAX_LANES 8
#define FRAME_MAX (OTE_CTL_HDR_LEN + OTE_CTL_MAX_NOTIFY + 64)
/* Bytes a control connection may queue beyond what its socket accepted. A peer that lets
 * more pile up (it does not read) is dropped, never waited on. */
#define OUT_CAP (256u << 10)
/* Poll period of a connection's own thread: it flushes its queue and checks the queue's
 * deadline at least this often. */
#define CONN_POLL_MS 10
/* Notification ids carry this tag; call (INFO/CONNECT) ids never do, grant ids are
 * 24-bit: an answer of the wrong kind is recognised as such. */
#define NOTE_TAG (1ull << 62)

typedef struct rdma_tp rdma_tp_t;

typedef struct reg_ent {
    struct reg_ent *next;
    void *addr;
    ote_buffer_t *buf;
} reg_ent_t;

/*
 * A control connection (either side). The socket is non-blocking and nobody ever waits on
 * it while holding a lock or on a thread that is not the connection's own: conn_send()
 * (any thread: lane workers answering grants, the monitor, user threads) sends what the
 * socket takes at once and queues the rest (at most OUT_CAP bytes); the connection's own
 * thread (reader or server) flushes the queue. A queue that overflows or makes no
 * progress for send_timeout_ns kills the connection (dead, socket shut down): its owner
 * thread then fails whatever waited on it with OTE_ERR_PEER_LOST.
 */
typedef struct conn {
    rdma_tp_t *tp;
    int fd;
    ote_mutex_t wmu; /* out queue */
    uint8_t *out;    /* OUT_CAP bytes once needed */
    size_t ooff, olen;
    uint64_t out_progress_ns; /* last time the queue drained some bytes (or was empty) */
    uint64_t send_timeout_ns;
    _Atomic int refs;
    _Atomic int dead;
    uint8_t *in; /* FRAME_MAX: bytes received, not yet consumed (owner thread only) */
    size_t ilen, iconsumed;
    uint16_t version; /* negotiated in the handshake; 0 before it */
    uint64_t process, pd;
    uint32_t nic, lanes;
    char peer_addr[OTE__ADDR_MAX];
} conn_t;

/* Requester: an INFO or CONNECT call waiting for its answer (on the caller's stack). */
typedef struct call {
    struct call *next;
    uint64_t req_id;
    uint16_t want; /* OTE_RP_INFO_ACK or OTE_RP_CONNECT_ACK */
    int done;
    ote_status_t st;
    ote_qp_path_t path;
} call_t;

/* Requester: a notification waiting for its NOTIFY_ACK (heap; expired by the monitor). */
typedef struct note {
    struct note *next;
    uint64_t req_id; /* NOTE_TAG | n */
    ote_deadline_t deadline;
    ote__slice_t *s;
} note_t;

typedef struct grant_id_ent {
    struct grant_id_ent *next;
    uint64_t id;
} gid_ent_t;

struct ote__tpeer {
    rdma_tp_t *tp;
    struct ote__tpeer *tp_next; /* tp->peers, under tp->mu */
    conn_t *c;
    pthread_t reader;
    int reader_started;
    char name[OTE__ADDR_MAX];
    ote_mutex_t mu;
    ote_cond_t cv;
    call_t *calls;
    note_t *notes;
    gid_ent_t *grants; /* grant ids waiting for an answer */
    uint64_t next_call, next_note;
    ote_endpoint_t *ep[2]; /* requester endpoints per capability (READ, WRITE) */
};

/* A server connection and its (joinable) thread. */
typedef struct srv {
    conn_t *c;
    pthread_t th;
    int exited; /* under tp->mu: the thread is past its last use of tp but for this */
} srv_t;

struct rdma_tp {
    ote__transport_t base;
    ote__cfg_t cfg;
    ote__host_t host;
    ote_verbs_t *v;
    ote_context_set_t *set;
    ote_buffer_manager_t *bm;
    ote_context_t *ctx;
    uint32_t nlanes;
    ote_cq_lane_t *lanes[MAX_LANES];
    ote_cq_workers_t *workers;
    ote_endpoint_store_t *eps;
    ote_grant_mgr_t *gm;
    uint64_t process_id, pd_id;
    int lfd;
    char addr[OTE__ADDR_MAX];
    pthread_t acceptor, monitor;
    int acceptor_started, monitor_started;
    _Atomic int stop;
    ote_mutex_t mu; /* registrations, server connections, peers */
    ote_cond_t cv;
    reg_ent_t *regs;
    srv_t *sconns[256]; /* heap entries: a thread keeps its own */
    size_t nsconns;
    ote__tpeer_t *peers; /* open requester peers (notification deadlines) */
};

static _Atomic uint64_t ote__rdma_retained_transports;
ote_status_t (*ote__rdma_test_verbs_hook)(ote_verbs_t **v);
uint64_t ote__rdma_retained_transports_get(void) { return atomic_load(&ote__rdma_retained_transports); }

/* ---- peer statuses ------------------------------------------------------------------- */

/* Every status a peer reports passes through the shared sanitizer (engine/control)
 * before anything uses it. */
static ote_status_t peer_status(uint16_t opcode, ote_status_t st) {
    return ote_ctl_peer_status(opcode, st);
}

/* ---- socket I/O ---------------------------------------------------------------------- */

static void conn_kill(conn_t *c, const char *why) {
    if (atomic_exchange(&c->dead, 1) == 0 && why != NULL)
        OTE_WARN("rdma", "control connection %s%s dropped: %s", c->peer_addr[0] ? "with " : "",
                 c->peer_addr, why);
    (void)shutdown(c->fd, SHUT_RDWR); /* wakes the connection's own thread */
}

/* Under wmu: send what the socket takes now. -1 on a socket error. */
static int out_flush_locked(conn_t *c) {
    while (c->olen > 0) {
        ssize_t n = send(c->fd, c->out + c->ooff, c->olen, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            c->ooff += (size_t)n;
            c->olen -= (size_t)n;
            c->out_progress_ns = ote_now_ns();
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        return -1;
    }
    if (c->olen == 0) c->ooff = 0;
    return 0;
}

/* Owner thread: flush, and enforce the queue's deadline. -1: the connection died. */
static int conn_flush(conn_t *c, int *pending_out) {
    const char *why = NULL;
    ote_mutex_lock(&c->wmu);
    if (out_flush_locked(c) != 0) why = "send failed";
    else if (c->olen > 0 && ote_now_ns() - c->out_progress_ns > c->send_timeout_ns)
        why = "peer stopped reading its answers (send deadline passed)";
    *pending_out = c->olen > 0;
    ote_mutex_unlock(&c->wmu);
    if (why != NULL) conn_kill(c, why);
    return atomic_load(&c->dead) ? -1 : 0;
}

/* Queue one encoded frame; never blocks on the socket. */
static ote_status_t conn_send_raw(conn_t *c, const uint8_t *buf, size_t len) {
    const char *why = NULL;
    ote_mutex_lock(&c->wmu);
    if (atomic_load(&c->dead)) {
        ote_mutex_unlock(&c->wmu);
        return OTE_ERR_PEER_LOST;
    }
    if (c->olen == 0) {
        c->out_progress_ns = ote_now_ns();
        while (len > 0) {
            ssize_t n = send(c->fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n > 0) {
                buf += n;
                len -= (size_t)n;
                continue;
            }
            if (n < 0 && errno == EINTR) continue;
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
            why = "send failed";
            break;
        }
    }
    if (why == NULL && len > 0) {
        if (c->out == NULL) c->out = ote_malloc(OUT_CAP);
        if (c->out == NULL) {
            why = "no memory for its output queue";
        } else if (len > OUT_CAP - c->olen) {
            why = "output queue overflow (the peer does not read)";
        } else {
            if (c->ooff + c->olen + len > OUT_CAP) {
                memmove(c->out, c->out + c->ooff, c->olen);
                c->ooff = 0;
            }
            memcpy(c->out + c->ooff + c->olen, buf, len);
            c->olen += len;
        }
    }
    ote_mutex_unlock(&c->wmu);
    if (why != NULL) {
        conn_kill(c, why);
        return OTE_ERR_PEER_LOST;
    }
    return OTE_OK;
}

/*
 * Owner thread: the next frame (valid until the next call), flushing queued output while
 * waiting. OTE_ERR_PEER_LOST when the connection closed or died (or *stop was set),
 * OTE_ERR_PROTOCOL for bad framing, OTE_ERR_TIMEOUT at dl.
 */
static ote_status_t conn_next(conn_t *c, ote_ctl_msg_t *m, ote_deadline_t dl, const _Atomic int *stop) {
    if (c->iconsumed > 0) {
        memmove(c->in, c->in + c->iconsumed, c->ilen - c->iconsumed);
        c->ilen -= c->iconsumed;
        c->iconsumed = 0;
    }
    for (;;) {
        if (c->ilen >= OTE_CTL_HDR_LEN) {
            const uint8_t *b = c->in;
            uint32_t length = (uint32_t)b[20] | ((uint32_t)b[21] << 8) | ((uint32_t)b[22] << 16) |
                              ((uint32_t)b[23] << 24);
            if (length > FRAME_MAX - OTE_CTL_HDR_LEN) return OTE_ERR_PROTOCOL;
            if (c->ilen >= OTE_CTL_HDR_LEN + length) {
                size_t used = 0;
                ote_status_t st = ote_ctl_decode(c->in, OTE_CTL_HDR_LEN + length, m, &used);
                if (st != OTE_OK) return st == OTE_ERR_AGAIN ? OTE_ERR_PROTOCOL : st;
                if (m->data_len != 0 || used != OTE_CTL_HDR_LEN + length) return OTE_ERR_PROTOCOL;
                c->iconsumed = used;
                return OTE_OK;
            }
        }
        if (stop != NULL && atomic_load(stop)) return OTE_ERR_PEER_LOST;
        int pending = 0;
        if (conn_flush(c, &pending) != 0) return OTE_ERR_PEER_LOST;
        if (ote_deadline_expired(dl)) return OTE_ERR_TIMEOUT;
        struct pollfd p = {.fd = c->fd, .events = (short)(POLLIN | (pending ? POLLOUT : 0))};
        int n = poll(&p, 1, ote_deadline_remaining_ms(dl, CONN_POLL_MS));
        if (n < 0 && errno != EINTR) return OTE_ERR_PEER_LOST;
        if (n <= 0 || (p.revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
        ssize_t r = recv(c->fd, c->in + c->ilen, FRAME_MAX - c->ilen, MSG_DONTWAIT);
        if (r == 0) return OTE_ERR_PEER_LOST;
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
            return OTE_ERR_PEER_LOST;
        }
        c->ilen += (size_t)r;
    }
}

static ote_status_t conn_send(conn_t *c, const ote_ctl_msg_t *m) {
    uint8_t buf[FRAME_MAX];
    size_t len = 0;
    ote_status_t st = ote_ctl_encode(m, buf, sizeof(buf), &len);
    if (st != OTE_OK) return st;
    return conn_send_raw(c, buf, len);
}

static ote_status_t conn_send_rp(conn_t *c, uint64_t req_id, ote_status_t status,
                                 const ote_rp_msg_t *rp) {
    uint8_t body[OTE_RP_MAX_BODY];
    ote_ctl_msg_t m;
    memset(&m, 0, sizeof(m));
    m.version = c->version;
    m.opcode = OTE_CTL_RDMA;
    m.req_id = req_id;
    m.status = status;
    m.u.rdma.body = body;
    m.u.rdma.len = (uint32_t)ote__rp_encode(rp, body);
    return conn_send(c, &m);
}

static void conn_put(conn_t *c) {
    if (atomic_fetch_sub(&c->refs, 1) != 1) return;
    close(c->fd);
    ote_mutex_destroy(&c->wmu);
    ote_free(c->out);
    ote_free(c->in);
    ote_free(c);
}

/* Takes over fd (closed on failure). */
static conn_t *conn_new(rdma_tp_t *tp, int fd) {
    conn_t *c = ote_calloc(1, sizeof(*c));
    if (c != NULL) c->in = ote_malloc(FRAME_MAX);
    if (c == NULL || c->in == NULL || ote_mutex_init(&c->wmu) != OTE_OK) {
        if (c != NULL) ote_free(c->in);
        ote_free(c);
        close(fd);
        return NULL;
    }
    c->tp = tp;
    c->fd = fd;
    uint64_t ms = tp->cfg.connect_timeout_ms < 1000 ? 1000 : tp->cfg.connect_timeout_ms;
    c->send_timeout_ns = ms * OTE_NSEC_PER_MSEC;
    atomic_store(&c->refs, 1);
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    int fl = fcntl(fd, F_GETFL, 0);
    if (fl >= 0) (void)fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    return c;
}

/* ---- registrations (engine hooks) ------------------------------------------------ */

static ote_status_t rdma_mem_register(ote__transport_t *t, void *addr, size_t len, unsigned perms) {
    rdma_tp_t *tp = (rdma_tp_t *)t;
    (void)perms; /* permissions are enforced per grant against the engine's registry */
    reg_ent_t *r = ote_calloc(1, sizeof(*r));
    if (r == NULL) return OTE_ERR_NOMEM;
    /* Local-only and MW-bindable: a peer reaches it only through a grant's window. */
    ote_status_t st = ote_buffer_register(tp->bm, addr, len,
                                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND, &r->buf);
    if (st != OTE_OK) {
        ote_free(r);
        OTE_WARN("rdma", "registration of [%p, +%zu) failed: %s", addr, len, ote_status_str(st));
        return st;
    }
    r->addr = addr;
    ote_mutex_lock(&tp->mu);
    r->next = tp->regs;
    tp->regs = r;
    ote_mutex_unlock(&tp->mu);
    return OTE_OK;
}

static ote_status_t rdma_mem_unregister(ote__transport_t *t, void *addr) {
    rdma_tp_t *tp = (rdma_tp_t *)t;
    ote_mutex_lock(&tp->mu);
    reg_ent_t **pp = &tp->regs;
    while (*pp != NULL && (*pp)->addr != addr) pp = &(*pp)->next;
    if (*pp == NULL) {
        ote_mutex_unlock(&tp->mu);
        return OTE_ERR_NOT_FOUND;
    }
    reg_ent_t *r = *pp;
    ote_status_t st = ote_buffer_deregister(tp->bm, r->buf);
    if (st == OTE_OK) *pp = r->next;
    ote_mutex_unlock(&tp->mu);
    if (st == OTE_OK) ote_free(r);
    return st;
}

/* ---- source side ------------------------------------------------------------------ */

typedef struct {
    conn_t *c;
    uint64_t req_id;
} answer_t;

static ote_status_t src_pin(void *arg, ote_context_t *ctx, uint64_t addr, uint64_t len, int access,
                            struct ibv_mr **mr_out, void **pin_out) {
    rdma_tp_t *tp = arg;
    unsigned perm = access == IBV_ACCESS_REMOTE_WRITE ? OTE_PERM_WRITE : OTE_PERM_READ;
    void *pin = NULL;
    ote_status_t st = tp->host.pin(tp->host.arg, addr, len, perm, &pin);
    if (st != OTE_OK) return st;
    struct ibv_mr *mr = NULL;
    st = ote_buffer_manager_find(tp->bm, (const void *)(uintptr_t)addr, len, ctx, &mr);
    if (st != OTE_OK) {
        tp->host.unpin(tp->host.arg, pin);
        return st;
    }
    *mr_out = mr;
    *pin_out = pin;
    return OTE_OK;
}

static void src_unpin(void *arg, void *pin) {
    rdma_tp_t *tp = arg;
    tp->host.unpin(tp->host.arg, pin);
}

/* What the requester learns of a grant we accepted to serve: a refusal of the range
 * (ACCESS, ...) as it is; any other failure (alloc/bind of the window failed, the window
 * expired) as OTE_ERR_REMOTE_ACCESS: our native reasons stay in our log. */
static ote_status_t grant_refusal(ote_status_t st) {
    if (st == OTE_OK || st == OTE_ERR_ACCESS || st == OTE_ERR_TOO_BIG || st == OTE_ERR_AGAIN)
        return st;
    return OTE_ERR_REMOTE_ACCESS;
}

static void src_answer(void *arg, uint64_t actx, ote_status_t st, uint32_t rkey) {
    (void)arg;
    answer_t *a = (answer_t *)(uintptr_t)actx;
    st = grant_refusal(st);
    ote_rp_msg_t rp;
    memset(&rp, 0, sizeof(rp));
    rp.type = OTE_RP_GRANT_RESP;
    rp.u.resp.rkey = rkey;
    (void)conn_send_rp(a->c, a->req_id, st, &rp);
    conn_put(a->c);
    ote_free(a);
}

static void on_recv(void *arg, ote_qp_t *qp, const struct ibv_wc *wc, const void *buf) {
    (void)buf;
    rdma_tp_t *tp = arg;
    ote_grant_source_receipt(tp->gm, ote_qp_num(qp), wc);
}

static ote_status_t copy_exchange(void *arg, uint32_t slot, const ote_qp_path_t *local,
                                  ote_qp_path_t *peer_out, ote_deadline_t deadline) {
    (void)slot;
    (void)local;
    (void)deadline;
    *peer_out = *(const ote_qp_path_t *)arg;
    return OTE_OK;
}

static void src_connect(conn_t *c, uint64_t req_id, const ote_rp_msg_t *rq) {
    rdma_tp_t *tp = c->tp;
    ote_rp_msg_t rp;
    memset(&rp, 0, sizeof(rp));
    rp.type = OTE_RP_CONNECT_ACK;
    ote_ep_key_t key;
    ote_ep_key_make(&key, c->process, c->pd, ote_context_nic_id(tp->ctx), c->nic, OTE_EP_SOURCE,
                    (ote_ep_cap_t)rq->u.connect.cap);
    ote_endpoint_t *ep = NULL;
    ote_status_t st = ote_endpoint_get(tp->eps, &key, c->lanes, &ep);
    uint32_t slot = rq->u.connect.slot;
    if (st == OTE_OK && slot >= ote_endpoint_width(ep)) st = OTE_ERR_PROTOCOL;
    ote_qp_t *qp = NULL;
    if (st == OTE_OK) {
        uint32_t cur = ote_endpoint_remote_qpn(ep, slot);
        if (cur != 0 && ote_endpoint_borrow_ready(ep, slot, 0, &qp) == OTE_OK) {
            if (cur != rq->u.connect.path.qp_num) {
                /* The requester discarded its old QP: retire ours (destroyed once idle). */
                ote_endpoint_retire(ep, slot, qp);
                ote_endpoint_return(ep, slot, qp);
                qp = NULL;
            }
        }
        if (qp == NULL) {
            ote_deadline_t dl = ote_deadline_after(tp->cfg.connect_timeout_ms * OTE_NSEC_PER_MSEC);
            ote_qp_path_t peer = rq->u.connect.path;
            st = ote_endpoint_borrow(ep, slot, copy_exchange, &peer, dl, &qp);
        }
    }
    if (st == OTE_OK) {
        /* Published (READY) before the answer leaves: a grant request can follow at once. */
        ote_qp_local_path(qp, &rp.u.connect.path);
        ote_endpoint_return(ep, slot, qp);
    } else {
        OTE_WARN("rdma", "CONNECT slot %u from %s refused: %s", slot, c->peer_addr,
                 ote_status_str(st));
    }
    (void)conn_send_rp(c, req_id, st, &rp);
}

static void src_grant(conn_t *c, uint64_t req_id, const ote_rp_msg_t *rq) {
    rdma_tp_t *tp = c->tp;
    ote_ep_key_t key;
    ote_ep_key_make(&key, c->process, c->pd, ote_context_nic_id(tp->ctx), c->nic, OTE_EP_SOURCE,
                    rq->u.grant.op == OTE_GRANT_WRITE ? OTE_EP_WRITE : OTE_EP_READ);
    ote_endpoint_t *ep = NULL;
    ote_qp_t *qp = NULL;
    ote_status_t st = ote_endpoint_get(tp->eps, &key, c->lanes, &ep);
    if (st == OTE_OK && rq->u.grant.slot >= ote_endpoint_width(ep)) st = OTE_ERR_PROTOCOL;
    if (st == OTE_OK) st = ote_endpoint_borrow_ready(ep, rq->u.grant.slot, rq->u.grant.req_qpn, &qp);
    if (st == OTE_OK && ote_qp_num(qp) != rq->u.grant.src_qpn) {
        ote_endpoint_return(ep, rq->u.grant.slot, qp);
        st = OTE_ERR_NOT_FOUND;
    }
    if (st != OTE_OK) {
        if (ote_status_code(st) == OTE_ERR_NOT_FOUND) st = OTE_ERR_STATE;
        OTE_WARN("rdma", "GRANT from %s on slot %u: no such connection (QP %u <- %u): %s",
                 c->peer_addr, rq->u.grant.slot, rq->u.grant.src_qpn, rq->u.grant.req_qpn,
                 ote_status_str(st));
    } else {
        answer_t *a = ote_calloc(1, sizeof(*a));
        if (a == NULL) {
            st = OTE_ERR_NOMEM;
            ote_endpoint_return(ep, rq->u.grant.slot, qp);
        } else {
            a->c = c;
            a->req_id = req_id;
            atomic_fetch_add(&c->refs, 1);
            ote_deadline_t dl = ote_deadline_after((tp->cfg.transfer_timeout_ms + 1000) * OTE_NSEC_PER_MSEC);
            st = ote_grant_serve(tp->gm, ep, rq->u.grant.slot, qp, (ote_grant_op_t)rq->u.grant.op,
                                 rq->u.grant.addr, rq->u.grant.len, dl, (uint64_t)(uintptr_t)a);
            if (st != OTE_OK) {
                /* Refused before any window exists; the borrow stays ours. */
                ote_endpoint_return(ep, rq->u.grant.slot, qp);
                conn_put(c);
                ote_free(a);
                st = grant_refusal(st);
            } else {
                return; /* answered by src_answer */
            }
        }
    }
    ote_rp_msg_t rp;
    memset(&rp, 0, sizeof(rp));
    rp.type = OTE_RP_GRANT_RESP;
    (void)conn_send_rp(c, req_id, st, &rp);
}

static void local_info(rdma_tp_t *tp, ote_rp_msg_t *rp, uint16_t type) {
    memset(rp, 0, sizeof(*rp));
    rp->type = type;
    rp->u.info.process = tp->process_id;
    rp->u.info.pd = tp->pd_id;
    rp->u.info.nic = ote_context_nic_id(tp->ctx);
    rp->u.info.lanes = tp->nlanes;
}

/* Answer a HELLO; 0 when the handshake is done (c->version set). */
static int server_hello(conn_t *c, const ote_ctl_msg_t *m) {
    rdma_tp_t *tp = c->tp;
    uint16_t ver = 0;
    ote_ctl_msg_t a;
    memset(&a, 0, sizeof(a));
    a.version = OTE_CTL_VERSION_MIN;
    a.req_id = m->req_id;
    if (ote_ctl_negotiate(m, OTE_CTL_VERSION_MIN, OTE_CTL_VERSION_MAX, &ver) != OTE_OK) {
        OTE_WARN("rdma", "control: HELLO with versions %u..%u refused (we speak %u..%u): closing",
                 m->u.hello.min_version, m->u.hello.max_version, OTE_CTL_VERSION_MIN,
                 OTE_CTL_VERSION_MAX);
        a.opcode = OTE_CTL_ERROR;
        a.status = OTE_ERR_VERSION;
        a.u.error.min_version = OTE_CTL_VERSION_MIN;
        a.u.error.max_version = OTE_CTL_VERSION_MAX;
        (void)conn_send(c, &a);
        return -1;
    }
    size_t alen = m->u.hello.addr_len < sizeof(c->peer_addr) - 1 ? m->u.hello.addr_len
                                                                   : sizeof(c->peer_addr) - 1;
    memcpy(c->peer_addr, m->u.hello.addr, alen);
    c->peer_addr[alen] = '\0';
    a.version = ver;
    a.opcode = OTE_CTL_HELLO_ACK;
    a.u.hello_ack.version = ver;
    a.u.hello_ack.max_data = OTE_CTL_MAX_DATA;
    a.u.hello_ack.addr = tp->addr;
    a.u.hello_ack.addr_len = (uint32_t)strlen(tp->addr);
    if (conn_send(c, &a) != OTE_OK) return -1;
    c->version = ver;
    return 0;
}

/* One frame after the handshake; 0 to go on, -1 to close the connection. */
static int server_frame(conn_t *c, const ote_ctl_msg_t *m, int *have_info) {
    rdma_tp_t *tp = c->tp;
    if (m->opcode == OTE_CTL_NOTIFY) {
        ote_status_t st = tp->host.deliver_notify(tp->host.arg, c->peer_addr, m->u.notify.msg,
                                                  m->u.notify.len);
        ote_ctl_msg_t a;
        memset(&a, 0, sizeof(a));
        a.version = c->version;
        a.opcode = OTE_CTL_NOTIFY_ACK;
        a.req_id = m->req_id;
        a.status = st;
        return conn_send(c, &a) == OTE_OK ? 0 : -1;
    }
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
        c->process = rq.u.info.process;
        c->pd = rq.u.info.pd;
        c->nic = rq.u.info.nic;
        c->lanes = rq.u.info.lanes;
        *have_info = 1;
        ote_rp_msg_t rp;
        local_info(tp, &rp, OTE_RP_INFO_ACK);
        return conn_send_rp(c, m->req_id, OTE_OK, &rp) == OTE_OK ? 0 : -1;
    }
    if (!*have_info) {
        OTE_WARN("rdma", "control from %s: request before INFO: closing", c->peer_addr);
        return -1;
    }
    if (rq.type == OTE_RP_CONNECT) {
        src_connect(c, m->req_id, &rq);
    } else if (rq.type == OTE_RP_GRANT_REQ) {
        src_grant(c, m->req_id, &rq);
    } else {
        OTE_WARN("rdma", "control from %s: unexpected message %u: closing", c->peer_addr, rq.type);
        return -1;
    }
    return 0;
}

static void *server_main(void *arg) {
    srv_t *sv = arg;
    conn_t *c = sv->c;
    rdma_tp_t *tp = c->tp;
    int have_info = 0;
    for (;;) {
        ote_ctl_msg_t m;
        if (conn_next(c, &m, UINT64_MAX, &tp->stop) != OTE_OK) break;
        if (c->version == 0) {
            /* Nothing but HELLO before the handshake. */
            if (m.opcode != OTE_CTL_HELLO) {
                OTE_WARN("rdma", "control: %s frame before HELLO: closing",
                         ote_ctl_opcode_str(m.opcode));
                break;
            }
            if (server_hello(c, &m) != 0) break;
            continue;
        }
        if (m.version != c->version) {
            OTE_WARN("rdma", "control from %s: %s frame of version %u on a connection that "
                     "negotiated %u: closing", c->peer_addr, ote_ctl_opcode_str(m.opcode),
                     m.version, c->version);
            break;
        }
        if (m.opcode == OTE_CTL_HELLO) {
            OTE_WARN("rdma", "control from %s: second HELLO: closing", c->peer_addr);
            break;
        }
        if (server_frame(c, &m, &have_info) != 0) break;
    }
    conn_kill(c, NULL);
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
        conn_put(sv->c);
        ote_free(sv);
        tp->sconns[i] = tp->sconns[--tp->nsconns];
    }
}

static void *acceptor_main(void *arg) {
    rdma_tp_t *tp = arg;
    while (!atomic_load(&tp->stop)) {
        ote_mutex_lock(&tp->mu);
        reap_servers_locked(tp);
        ote_mutex_unlock(&tp->mu);
        struct pollfd p = {.fd = tp->lfd, .events = POLLIN};
        int n = poll(&p, 1, 50);
        if (n <= 0) continue;
        int fd = accept4(tp->lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) continue;
        conn_t *c = conn_new(tp, fd);
        if (c == NULL) continue;
        ote_mutex_lock(&tp->mu);
        if (tp->nsconns == sizeof(tp->sconns) / sizeof(tp->sconns[0])) {
            ote_mutex_unlock(&tp->mu);
            OTE_WARN("rdma", "too many control connections: refusing one");
            conn_put(c);
            continue;
        }
        srv_t *sv = ote_calloc(1, sizeof(*sv));
        if (sv != NULL) sv->c = c;
        if (sv == NULL || pthread_create(&sv->th, NULL, server_main, sv) != 0) {
            ote_mutex_unlock(&tp->mu);
            ote_free(sv);
            conn_put(c);
            continue;
        }
        tp->sconns[tp->nsconns++] = sv;
        ote_mutex_unlock(&tp->mu);
    }
    return NULL;
}

/* ---- monitor -------------------------------------------------------------------- */

/* Fail notifications whose NOTIFY_ACK did not come by their deadline. */
static void expire_notes(rdma_tp_t *tp) {
    uint64_t now = ote_now_ns();
    note_t *expired = NULL;
    ote_mutex_lock(&tp->mu);
    for (ote__tpeer_t *p = tp->peers; p != NULL; p = p->tp_next) {
        ote_mutex_lock(&p->mu);
        for (note_t **pp = &p->notes; *pp != NULL;) {
            note_t *x = *pp;
            if (x->deadline > now) {
                pp = &x->next;
                continue;
            }
            *pp = x->next;
            x->next = expired;
            expired = x;
            OTE_WARN("rdma", "notification to %s not acknowledged by its deadline: failed",
                     p->name);
        }
        ote_mutex_unlock(&p->mu);
    }
    ote_mutex_unlock(&tp->mu);
    while (expired != NULL) {
        note_t *x = expired;
        expired = x->next;
        x->s->done(x->s, OTE_ERR_TIMEOUT);
        ote_free(x);
    }
}

static void *monitor_main(void *arg) {
    rdma_tp_t *tp = arg;
    uint64_t last_reclaim = 0;
    while (!atomic_load(&tp->stop)) {
        (void)ote_context_set_poll_events(tp->set, NULL);
        (void)ote_grant_mgr_tick(tp->gm);
        expire_notes(tp);
        uint64_t now = ote_now_ns();
        if (now - last_reclaim > 50 * OTE_NSEC_PER_MSEC) {
            last_reclaim = now;
            (void)ote_endpoint_store_reclaim(tp->eps, ote_deadline_after(200 * OTE_NSEC_PER_MSEC), NULL);
        }
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

/* ---- requester side ------------------------------------------------------------- */

static note_t *note_take(ote__tpeer_t *p, uint64_t req_id) {
    note_t **pp = &p->notes;
    while (*pp != NULL && (*pp)->req_id != req_id) pp = &(*pp)->next;
    note_t *x = *pp;
    if (x != NULL) *pp = x->next;
    return x;
}

static void call_unlink(ote__tpeer_t *p, call_t *x) {
    call_t **pp = &p->calls;
    while (*pp != NULL && *pp != x) pp = &(*pp)->next;
    if (*pp != NULL) *pp = x->next;
}

static int grant_id_take(ote__tpeer_t *p, uint64_t id) {
    gid_ent_t **pp = &p->grants;
    while (*pp != NULL && (*pp)->id != id) pp = &(*pp)->next;
    gid_ent_t *x = *pp;
    if (x == NULL) return 0;
    *pp = x->next;
    ote_free(x);
    return 1;
}

/* One answer from the source; 0 to go on, -1: a protocol error (the peer is dropped). */
static int reader_frame(ote__tpeer_t *p, const ote_ctl_msg_t *m) {
    rdma_tp_t *tp = p->tp;
    conn_t *c = p->c;
    if (m->version != c->version) {
        OTE_WARN("rdma", "control to %s: %s frame of version %u on a connection that negotiated "
                 "%u: closing", p->name, ote_ctl_opcode_str(m->opcode), m->version, c->version);
        return -1;
    }
    if (m->opcode == OTE_CTL_NOTIFY_ACK) {
        if ((m->req_id & NOTE_TAG) == 0) {
            OTE_WARN("rdma", "control to %s: NOTIFY_ACK for request %llu, which is no "
                     "notification: closing", p->name, (unsigned long long)m->req_id);
            return -1;
        }
        ote_mutex_lock(&p->mu);
        note_t *x = note_take(p, m->req_id);
        ote_mutex_unlock(&p->mu);
        if (x == NULL) {
            OTE_DEBUG("rdma", "NOTIFY_ACK from %s for a notification that no longer waits",
                      p->name);
            return 0;
        }
        x->s->done(x->s, peer_status(OTE_CTL_NOTIFY_ACK, m->status));
        ote_free(x);
        return 0;
    }
    ote_rp_msg_t rp;
    if (m->opcode != OTE_CTL_RDMA || ote__rp_decode(m->u.rdma.body, m->u.rdma.len, &rp) != OTE_OK) {
        OTE_WARN("rdma", "control to %s: malformed or unexpected %s answer: closing", p->name,
                 ote_ctl_opcode_str(m->opcode));
        return -1;
    }
    ote_status_t st = peer_status(OTE_CTL_RDMA, m->status);
    if (rp.type == OTE_RP_GRANT_RESP) {
        ote_mutex_lock(&p->mu);
        int mine = grant_id_take(p, m->req_id);
        ote_mutex_unlock(&p->mu);
        if (mine) ote_grant_on_answer(tp->gm, m->req_id, st, rp.u.resp.rkey);
        return 0;
    }
    if (rp.type != OTE_RP_CONNECT_ACK && rp.type != OTE_RP_INFO_ACK) {
        OTE_WARN("rdma", "control to %s: unexpected message %u: closing", p->name, rp.type);
        return -1;
    }
    int bad = (m->req_id & NOTE_TAG) != 0;
    ote_mutex_lock(&p->mu);
    call_t *x = p->calls;
    while (!bad && x != NULL && x->req_id != m->req_id) x = x->next;
    if (!bad && x != NULL) {
        if (x->want != rp.type) {
            bad = 1;
        } else {
            call_unlink(p, x);
            x->done = 1;
            x->st = st;
            x->path = rp.u.connect.path;
            if (rp.type == OTE_RP_INFO_ACK && st == OTE_OK) {
                c->process = rp.u.info.process;
                c->pd = rp.u.info.pd;
                c->nic = rp.u.info.nic;
                c->lanes = rp.u.info.lanes;
            }
            ote_cond_broadcast(&p->cv);
        }
    }
    ote_mutex_unlock(&p->mu);
    if (bad) {
        OTE_WARN("rdma", "control to %s: answer of the wrong kind (%u) for request %llu: closing",
                 p->name, rp.type, (unsigned long long)m->req_id);
        return -1;
    }
    return 0;
}

static void *reader_main(void *arg) {
    ote__tpeer_t *p = arg;
    rdma_tp_t *tp = p->tp;
    conn_t *c = p->c;
    for (;;) {
        ote_ctl_msg_t m;
        if (conn_next(c, &m, UINT64_MAX, NULL) != OTE_OK) break;
        if (reader_frame(p, &m) != 0) break;
    }
    /* Peer lost: fail everything waiting on this connection. */
    conn_kill(c, NULL);
    ote_mutex_lock(&p->mu);
    for (call_t *x = p->calls; x != NULL; x = x->next) {
        x->done = 1;
        x->st = OTE_ERR_PEER_LOST;
    }
    p->calls = NULL;
    note_t *notes = p->notes;
    p->notes = NULL;
    gid_ent_t *grants = p->grants;
    p->grants = NULL;
    ote_cond_broadcast(&p->cv);
    ote_mutex_unlock(&p->mu);
    while (notes != NULL) {
        note_t *x = notes;
        notes = x->next;
        x->s->done(x->s, OTE_ERR_PEER_LOST);
        ote_free(x);
    }
    while (grants != NULL) {
        gid_ent_t *g = grants;
        grants = g->next;
        ote_grant_on_answer(tp->gm, g->id, OTE_ERR_PEER_LOST, 0);
        ote_free(g);
    }
    return NULL;
}

/* Send a request and wait for its CONNECT_ACK / INFO_ACK. */
static ote_status_t peer_call(ote__tpeer_t *p, const ote_rp_msg_t *rq, uint16_t want,
                              ote_deadline_t dl, ote_qp_path_t *path_out) {
    call_t x;
    memset(&x, 0, sizeof(x));
    x.want = want;
    ote_mutex_lock(&p->mu);
    if (atomic_load(&p->c->dead)) {
        ote_mutex_unlock(&p->mu);
        return OTE_ERR_PEER_LOST;
    }
    x.req_id = ++p->next_call;
    x.next = p->calls;
    p->calls = &x;
    ote_mutex_unlock(&p->mu);
    ote_status_t st = conn_send_rp(p->c, x.req_id, OTE_OK, rq);
    ote_mutex_lock(&p->mu);
    while (st == OTE_OK && !x.done) {
        if (atomic_load(&p->c->dead)) st = OTE_ERR_PEER_LOST;
        else if (ote_cond_wait(&p->cv, &p->mu, dl) == OTE_ERR_TIMEOUT && !x.done) st = OTE_ERR_TIMEOUT;
    }
    call_unlink(p, &x); /* no-op once answered or failed by the reader */
    ote_mutex_unlock(&p->mu);
    if (st == OTE_OK) st = x.st;
    if (st == OTE_OK && path_out != NULL) *path_out = x.path;
    return st;
}

typedef struct {
    ote__tpeer_t *p;
    uint32_t cap;
} xarg_t;

static ote_status_t req_exchange(void *arg, uint32_t slot, const ote_qp_path_t *local,
                                 ote_qp_path_t *peer_out, ote_deadline_t deadline) {
    xarg_t *x = arg;
    ote_rp_msg_t rq;
    memset(&rq, 0, sizeof(rq));
    rq.type = OTE_RP_CONNECT;
    rq.u.connect.slot = slot;
    rq.u.connect.cap = x->cap;
    rq.u.connect.path = *local;
    return peer_call(x->p, &rq, OTE_RP_CONNECT_ACK, deadline, peer_out);
}

static ote_status_t grant_request(void *arg, uint64_t grant_id, uint32_t slot, uint32_t remote_qpn,
                                  ote_grant_op_t op, uint64_t addr, uint64_t len) {
    ote__tpeer_t *p = arg;
    gid_ent_t *g = ote_calloc(1, sizeof(*g));
    if (g == NULL) return OTE_ERR_NOMEM;
    g->id = grant_id;
    ote_mutex_lock(&p->mu);
    g->next = p->grants;
    p->grants = g;
    ote_mutex_unlock(&p->mu);
    ote_rp_msg_t rq;
    memset(&rq, 0, sizeof(rq));
    rq.type = OTE_RP_GRANT_REQ;
    rq.u.grant.slot = slot;
    rq.u.grant.op = (uint32_t)op;
    rq.u.grant.src_qpn = remote_qpn;
    rq.u.grant.addr = addr;
    rq.u.grant.len = len;
    /* req_qpn: the requester's own QP on that slot, for the source's identity check. */
    ote_endpoint_t *ep = p->ep[op == OTE_GRANT_WRITE ? 1 : 0];
    ote_qp_t *qp = NULL;
    if (ote_endpoint_borrow_ready(ep, slot, remote_qpn, &qp) == OTE_OK) {
        rq.u.grant.req_qpn = ote_qp_num(qp);
        ote_endpoint_return(ep, slot, qp);
    }
    ote_status_t st = conn_send_rp(p->c, grant_id, OTE_OK, &rq);
    if (st != OTE_OK) {
        ote_mutex_lock(&p->mu);
        (void)grant_id_take(p, grant_id);
        ote_mutex_unlock(&p->mu);
    }
    return st;
}

/* Scratch in the slice: the temporary MR of an unregistered local buffer. */
static void slice_set_mr(ote__slice_t *s, struct ibv_mr *mr) { memcpy(s->wire, &mr, sizeof(mr)); }
static struct ibv_mr *slice_mr(const ote__slice_t *s) {
    struct ibv_mr *mr;
    memcpy(&mr, s->wire, sizeof(mr));
    return mr;
}

static void slice_grant_done(void *arg, ote_status_t st) {
    ote__slice_t *s = arg;
    rdma_tp_t *tp = (rdma_tp_t *)(uintptr_t)s->seq;
    struct ibv_mr *mr = slice_mr(s);
    if (mr != NULL) {
        int err = tp->v->ops->dereg_mr(tp->v, mr);
        if (err != 0) {
            ote_context_retained_add(tp->ctx, OTE_RETAINED_MR, 1);
            OTE_WARN("rdma", "dereg of a temporary MR failed: errno %d; retained", err);
        }
    }
    s->done(s, st);
}

static void submit_one(ote__tpeer_t *p, ote__slice_t *s) {
    rdma_tp_t *tp = p->tp;
    if (s->canceled != NULL && atomic_load(s->canceled)) {
        s->done(s, OTE_ERR_CANCELED);
        return;
    }
    if (s->op == OTE__SLICE_NOTIFY) {
        note_t *x = ote_calloc(1, sizeof(*x));
        if (x == NULL) {
            s->done(s, OTE_ERR_NOMEM);
            return;
        }
        x->s = s;
        x->deadline = s->deadline;
        uint8_t frame[FRAME_MAX];
        size_t flen = 0;
        ote_mutex_lock(&p->mu);
        if (atomic_load(&p->c->dead)) {
            ote_mutex_unlock(&p->mu);
            ote_free(x);
            s->done(s, OTE_ERR_PEER_LOST);
            return;
        }
        x->req_id = NOTE_TAG | ++p->next_note;
        uint64_t id = x->req_id;
        ote_ctl_msg_t m;
        memset(&m, 0, sizeof(m));
        m.version = p->c->version;
        m.opcode = OTE_CTL_NOTIFY;
        m.req_id = id;
        m.u.notify.msg = s->local;
        m.u.notify.len = s->len;
        /* Encoded before the note is findable: once it is, the monitor may end s. */
        ote_status_t est = ote_ctl_encode(&m, frame, sizeof(frame), &flen);
        if (est != OTE_OK) {
            ote_mutex_unlock(&p->mu);
            ote_free(x);
            s->done(s, est);
            return;
        }
        x->next = p->notes;
        p->notes = x;
        ote_mutex_unlock(&p->mu);
        if (conn_send_raw(p->c, frame, flen) != OTE_OK) {
            ote_mutex_lock(&p->mu);
            note_t *y = note_take(p, id);
            ote_mutex_unlock(&p->mu);
            if (y != NULL) { /* else the reader or the monitor already ended it */
                ote_free(y);
                s->done(s, OTE_ERR_PEER_LOST);
            }
        }
        return;
    }
    if (atomic_load(&p->c->dead)) {
        s->done(s, OTE_ERR_PEER_LOST);
        return;
    }
    int write = s->op == OTE__SLICE_WRITE;
    ote_endpoint_t *ep = p->ep[write ? 1 : 0];
    uint32_t slot = ote_endpoint_pick_slot(ep);
    ote_qp_t *qp = NULL;
    xarg_t xa = {p, write ? OTE_EP_WRITE : OTE_EP_READ};
    ote_deadline_t cdl = ote_deadline_min(
        s->deadline, ote_deadline_after(tp->cfg.connect_timeout_ms * OTE_NSEC_PER_MSEC));
    ote_status_t st = ote_endpoint_borrow(ep, slot, req_exchange, &xa, cdl, &qp);
    if (st != OTE_OK) {
        s->done(s, st);
        return;
    }
    struct ibv_mr *mr = NULL, *tmp = NULL;
    if (ote_buffer_manager_find(tp->bm, s->local, s->len, tp->ctx, &mr) != OTE_OK) {
        int err = tp->v->ops->reg_mr(tp->v, ote_context_pd(tp->ctx), s->local, s->len,
                                     IBV_ACCESS_LOCAL_WRITE, &tmp);
        if (err != 0) {
            ote_endpoint_return(ep, slot, qp);
            OTE_WARN("rdma", "temporary MR for an unregistered local buffer failed: errno %d", err);
            s->done(s, ote_status_make(OTE_ERR_NATIVE, err));
            return;
        }
        mr = tmp;
    }
    slice_set_mr(s, tmp);
    s->seq = (uint64_t)(uintptr_t)tp;
    ote_grant_desc_t d;
    memset(&d, 0, sizeof(d));
    d.op = write ? OTE_GRANT_WRITE : OTE_GRANT_READ;
    d.local = s->local;
    d.lkey = mr->lkey;
    d.remote = s->remote;
    d.len = s->len;
    d.ep = ep;
    d.slot = slot;
    d.qp = qp;
    d.deadline = s->deadline;
    d.done = slice_grant_done;
    d.done_arg = s;
    ote_grant_ctl_t ctl = {.arg = p, .request = grant_request};
    /* Ownership: on OTE_OK the grant owns the QP borrow and ends the slice. */
    st = ote_grant_start(tp->gm, &d, &ctl);
    if (st != OTE_OK) {
        ote_endpoint_return(ep, slot, qp);
        slice_set_mr(s, NULL);
        if (tmp != NULL && tp->v->ops->dereg_mr(tp->v, tmp) != 0)
            ote_context_retained_add(tp->ctx, OTE_RETAINED_MR, 1);
        s->done(s, st);
    }
}

static void rdma_submit(ote__tpeer_t *p, ote__slice_t *list) {
    while (list != NULL) {
        ote__slice_t *s = list;
        list = s->next;
        s->next = NULL;
        submit_one(p, s);
    }
}

static void rdma_cancel(ote__tpeer_t *p) {
    (void)p; /* nothing is queued in this transport: slices go straight to grants */
}

static uint32_t rdma_peer_max_slice(ote__tpeer_t *p) {
    (void)p;
    return 64u << 20;
}

static ote_status_t connect_ctl(ote__tpeer_t *p) {
    rdma_tp_t *tp = p->tp;
    ote_deadline_t dl = ote_deadline_after(tp->cfg.connect_timeout_ms * OTE_NSEC_PER_MSEC);
    struct sockaddr_storage ss;
    socklen_t sl;
    ote_status_t st = ote__addr_resolve(p->name, &ss, &sl);
    if (st != OTE_OK) return st;
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return ote_status_make(OTE_ERR_CONNECT, errno);
    /* Non-blocking connect bounded by connect_timeout_ms. */
    if (connect(fd, (struct sockaddr *)&ss, sl) != 0) {
        int err = errno;
        if (err == EINPROGRESS) {
            err = 0;
            for (;;) {
                struct pollfd pf = {.fd = fd, .events = POLLOUT};
                if (ote_deadline_expired(dl)) {
                    err = ETIMEDOUT;
                    break;
                }
                int n = poll(&pf, 1, ote_deadline_remaining_ms(dl, 1000));
                if (n < 0 && errno != EINTR) {
                    err = errno;
                    break;
                }
                if (n > 0) {
                    socklen_t el = sizeof(err);
                    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0) err = errno;
                    break;
                }
            }
        }
        if (err != 0) {
            close(fd);
            OTE_WARN("rdma", "control connection to %s failed: %s", p->name,
                     err == ETIMEDOUT ? "timed out (connect_timeout_ms)" : strerror(err));
            return err == ETIMEDOUT ? OTE_ERR_TIMEOUT : ote_status_make(OTE_ERR_CONNECT, err);
        }
    }
    conn_t *c = conn_new(tp, fd);
    if (c == NULL) return OTE_ERR_NOMEM;
    snprintf(c->peer_addr, sizeof(c->peer_addr), "%s", p->name);
    /* HELLO and its answer, on this thread (no reader yet), bounded by dl. */
    ote_ctl_msg_t h;
    memset(&h, 0, sizeof(h));
    h.version = OTE_CTL_VERSION_MIN;
    h.opcode = OTE_CTL_HELLO;
    h.u.hello.min_version = OTE_CTL_VERSION_MIN;
    h.u.hello.max_version = OTE_CTL_VERSION_MAX;
    h.u.hello.role = 2; /* RDMA control */
    h.u.hello.addr = tp->addr;
    h.u.hello.addr_len = (uint32_t)strlen(tp->addr);
    st = conn_send(c, &h);
    ote_ctl_msg_t a;
    if (st == OTE_OK) st = conn_next(c, &a, dl, NULL);
    uint16_t ver = 0;
    if (st == OTE_OK) st = ote_ctl_check_hello_ack(&a, OTE_CTL_VERSION_MIN, OTE_CTL_VERSION_MAX, &ver);
    if (st == OTE_OK && a.version != ver) st = OTE_ERR_PROTOCOL;
    if (st != OTE_OK) {
        OTE_WARN("rdma", "handshake with %s failed: %s", p->name, ote_status_str(st));
        conn_put(c);
        return st;
    }
    c->version = ver;
    p->c = c;
    if (pthread_create(&p->reader, NULL, reader_main, p) != 0) {
        p->c = NULL;
        conn_put(c);
        return OTE_ERR_NOMEM;
    }
    p->reader_started = 1;
    ote_rp_msg_t info;
    local_info(tp, &info, OTE_RP_INFO);
    st = peer_call(p, &info, OTE_RP_INFO_ACK, dl, NULL);
    for (int cap = 0; st == OTE_OK && cap < 2; cap++) {
        ote_ep_key_t key;
        ote_ep_key_make(&key, c->process, c->pd, ote_context_nic_id(tp->ctx), c->nic,
                        OTE_EP_REQUESTER, (ote_ep_cap_t)cap);
        st = ote_endpoint_get(tp->eps, &key, c->lanes, &p->ep[cap]);
    }
    if (st != OTE_OK) {
        OTE_WARN("rdma", "control handshake (INFO) with %s failed: %s", p->name, ote_status_str(st));
        conn_kill(c, NULL);
        pthread_join(p->reader, NULL);
        p->reader_started = 0;
        p->c = NULL;
        conn_put(c);
        return st;
    }
    return OTE_OK;
}

static void disconnect_ctl(ote__tpeer_t *p) {
    if (p->c == NULL) return;
    conn_kill(p->c, NULL);
    if (p->reader_started) pthread_join(p->reader, NULL);
    p->reader_started = 0;
    conn_put(p->c);
    p->c = NULL;
}

static ote_status_t rdma_peer_open(ote__transport_t *t, const char *peer, ote__tpeer_t **peer_out) {
    rdma_tp_t *tp = (rdma_tp_t *)t;
    ote__tpeer_t *p = ote_calloc(1, sizeof(*p));
    if (p == NULL) return OTE_ERR_NOMEM;
    p->tp = tp;
    snprintf(p->name, sizeof(p->name), "%s", peer);
    ote_status_t st = ote_mutex_init(&p->mu);
    if (st == OTE_OK) {
        st = ote_cond_init(&p->cv);
        if (st != OTE_OK) ote_mutex_destroy(&p->mu);
    }
    if (st != OTE_OK) {
        ote_free(p);
        return st;
    }
    st = connect_ctl(p);
    if (st != OTE_OK) {
        ote_cond_destroy(&p->cv);
        ote_mutex_destroy(&p->mu);
        ote_free(p);
        return st;
    }
    ote_mutex_lock(&tp->mu);
    p->tp_next = tp->peers;
    tp->peers = p;
    ote_mutex_unlock(&tp->mu);
    *peer_out = p;
    return OTE_OK;
}

static ote_status_t rdma_peer_ensure(ote__tpeer_t *p) {
    if (p->c != NULL && !atomic_load(&p->c->dead)) return OTE_OK;
    /* Reconnect: grants that still need the old connection end on their own (their
     * answers were failed by the reader, their QPs by their CQEs or deadlines). */
    ote_mutex_lock(&p->mu);
    int busy = p->grants != NULL || p->calls != NULL || p->notes != NULL;
    ote_mutex_unlock(&p->mu);
    if (busy) return OTE_ERR_PEER_LOST;
    disconnect_ctl(p);
    return connect_ctl(p);
}

static ote_status_t rdma_peer_close(ote__tpeer_t *p) {
    rdma_tp_t *tp = p->tp;
    ote_mutex_lock(&tp->mu);
    for (ote__tpeer_t **pp = &tp->peers; *pp != NULL; pp = &(*pp)->tp_next) {
        if (*pp == p) {
            *pp = p->tp_next;
            break;
        }
    }
    ote_mutex_unlock(&tp->mu);
    disconnect_ctl(p);
    ote_cond_destroy(&p->cv);
    ote_mutex_destroy(&p->mu);
    ote_free(p);
    return OTE_OK;
}

static ote_status_t rdma_address(ote__transport_t *t, char *buf, size_t len) {
    rdma_tp_t *tp = (rdma_tp_t *)t;
    if (strlen(tp->addr) >= len) return OTE_ERR_TOO_BIG;
    memcpy(buf, tp->addr, strlen(tp->addr) + 1);
    return OTE_OK;
}

/* ---- lifecycle ------------------------------------------------------------------- */

static void teardown(rdma_tp_t *tp) {
    atomic_store(&tp->stop, 1);
    if (tp->acceptor_started) pthread_join(tp->acceptor, NULL);
    /* Wake the server connection threads (each polls tp->stop every CONN_POLL_MS and
     * its own waits are bounded) and join them. One that does not end within the bound
     * is still using tp: then nothing is freed (the transport is retained, counted in
     * ote__rdma_retained_transports, and logged), never freed under a running thread. */
    ote_mutex_lock(&tp->mu);
    for (size_t i = 0; i < tp->nsconns; i++) conn_kill(tp->sconns[i]->c, NULL);
    uint64_t wait_ms = tp->cfg.connect_timeout_ms + 10000;
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
    if (stuck != 0) {
        atomic_fetch_add(&ote__rdma_retained_transports, 1);
        OTE_ERROR("rdma", "%zu control connection thread(s) did not end within %llu ms: the "
                  "transport and everything it owns are retained (not freed)", stuck,
                  (unsigned long long)wait_ms);
        return;
    }
    if (tp->gm != NULL) {
        /* Let in-flight grants end (their own deadlines bound this). */
        ote_deadline_t gdl = ote_deadline_after((tp->cfg.transfer_timeout_ms + 2000) * OTE_NSEC_PER_MSEC);
        while (ote_grant_mgr_tick(tp->gm) > 0 && !ote_deadline_expired(gdl)) {
            struct timespec ts = {0, 2 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    if (tp->monitor_started) pthread_join(tp->monitor, NULL);
    if (tp->eps != NULL &&
        ote_endpoint_store_destroy(tp->eps, ote_deadline_after(2 * OTE_NSEC_PER_SEC)) != OTE_OK)
        OTE_ERROR("rdma", "endpoint store retained at shutdown (QPs that would not die)");
    if (tp->gm != NULL && ote_grant_mgr_destroy(tp->gm) != OTE_OK)
        OTE_ERROR("rdma", "grant manager retained at shutdown");
    for (uint32_t i = 0; i < tp->nlanes; i++) {
        if (tp->lanes[i] == NULL) continue;
        if (tp->workers != NULL) (void)ote_cq_workers_remove(tp->workers, tp->lanes[i]);
        if (ote_cq_lane_destroy(tp->lanes[i]) != OTE_OK)
            OTE_ERROR("rdma", "CQ lane %u retained at shutdown", i);
    }
    if (tp->workers != NULL) (void)ote_cq_workers_stop(tp->workers);
    while (tp->regs != NULL) {
        reg_ent_t *r = tp->regs;
        tp->regs = r->next;
        if (ote_buffer_deregister(tp->bm, r->buf) != OTE_OK)
            OTE_ERROR("rdma", "MRs of [%p] retained at shutdown", r->addr);
        ote_free(r);
    }
    if (tp->bm != NULL && ote_buffer_manager_destroy(tp->bm) != OTE_OK)
        OTE_ERROR("rdma", "buffer manager retained at shutdown");
    if (tp->set != NULL && ote_context_set_close(tp->set) != OTE_OK)
        OTE_ERROR("rdma", "context set retained at shutdown");
    if (tp->v != NULL) ote_verbs_close(tp->v);
    if (tp->lfd >= 0) close(tp->lfd);
    ote_cond_destroy(&tp->cv);
    ote_mutex_destroy(&tp->mu);
    ote_free(tp);
}

static void rdma_destroy(ote__transport_t *t) { teardown((rdma_tp_t *)t); }

static const ote__transport_ops_t g_rdma_ops = {
    .name = "rdma",
    .address = rdma_address,
    .peer_open = rdma_peer_open,
    .peer_ensure = rdma_peer_ensure,
    .peer_max_slice = rdma_peer_max_slice,
    .submit = rdma_submit,
    .cancel = rdma_cancel,
    .peer_close = rdma_peer_close,
    .destroy = rdma_destroy,
    .mem_register = rdma_mem_register,
    .mem_unregister = rdma_mem_unregister,
};

static ote_status_t listen_on(rdma_tp_t *tp) {
    struct sockaddr_storage ss;
    socklen_t sl;
    ote_status_t st = ote__addr_resolve(tp->cfg.listen_address, &ss, &sl);
    if (st != OTE_OK) return st;
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return ote_status_make(OTE_ERR_IO, errno);
    int one = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, (struct sockaddr *)&ss, sl) != 0 || listen(fd, 128) != 0) {
        int err = errno;
        close(fd);
        OTE_ERROR("rdma", "cannot listen on %s: errno %d", tp->cfg.listen_address, err);
        return ote_status_make(OTE_ERR_IO, err);
    }
    struct sockaddr_storage bound;
    socklen_t bl = sizeof(bound);
    getsockname(fd, (struct sockaddr *)&bound, &bl);
    tp->lfd = fd;
    if (tp->cfg.advertise_address[0]) {
        snprintf(tp->addr, sizeof(tp->addr), "%s", tp->cfg.advertise_address);
        return OTE_OK;
    }
    return ote__addr_format((struct sockaddr *)&bound, tp->addr, sizeof(tp->addr));
}

ote_status_t ote__rdma_create(const ote__cfg_t *cfg, const ote__host_t *host,
                              ote__transport_t **tp_out) {
    rdma_tp_t *tp = ote_calloc(1, sizeof(*tp));
    if (tp == NULL) return OTE_ERR_NOMEM;
    tp->base.ops = &g_rdma_ops;
    tp->cfg = *cfg;
    tp->host = *host;
    tp->lfd = -1;
    ote_status_t st = ote_mutex_init(&tp->mu);
    if (st != OTE_OK) {
        ote_free(tp);
        return st;
    }
    st = ote_cond_init(&tp->cv);
    if (st != OTE_OK) {
        ote_mutex_destroy(&tp->mu);
        ote_free(tp);
        return st;
    }
    const char *prov = cfg->verbs_provider[0] ? cfg->verbs_provider : "rdma-core";
    st = ote_verbs_open(prov, NULL, &tp->v);
    if (st != OTE_OK) {
        OTE_ERROR("rdma", "transport=rdma: verbs provider \"%s\" could not be opened: %s", prov,
                  ote_status_str(st));
        goto err;
    }
    if (ote__rdma_test_verbs_hook != NULL) {
        st = ote__rdma_test_verbs_hook(&tp->v);
        if (st != OTE_OK) goto err;
    }
    ote_context_config_t cc;
    memset(&cc, 0, sizeof(cc));
    const char *devs[1] = {cfg->rdma_device};
    if (cfg->rdma_device[0]) {
        cc.devices = devs;
        cc.num_devices = 1;
    }
    st = ote_context_set_open(tp->v, &cc, &tp->set);
    if (st != OTE_OK || ote_context_set_count(tp->set) == 0) {
        if (st == OTE_OK) st = OTE_ERR_NO_DEVICE;
        OTE_ERROR("rdma", "transport=rdma: no usable RDMA device through provider \"%s\"%s%s: %s "
                  "(no fallback to tcp)", prov, cfg->rdma_device[0] ? " named " : "",
                  cfg->rdma_device, ote_status_str(st));
        if (ote_status_code(st) != OTE_ERR_NO_DEVICE && ote_status_code(st) != OTE_ERR_NATIVE)
            st = OTE_ERR_NO_DEVICE;
        goto err;
    }
    /* Data path: the first active context. */
    for (size_t i = 0; i < ote_context_set_count(tp->set) && tp->ctx == NULL; i++) {
        ote_context_t *c = ote_context_set_get(tp->set, i);
        if (ote_context_check(c) == OTE_OK) tp->ctx = c;
    }
    if (tp->ctx == NULL) {
        OTE_ERROR("rdma", "transport=rdma: every device of provider \"%s\" has its port down", prov);
        st = OTE_ERR_NO_DEVICE;
        goto err;
    }
    st = ote_buffer_manager_create(tp->set, &tp->bm);
    if (st != OTE_OK) goto err;
    tp->nlanes = cfg->tcp_workers < 2 ? 2 : (cfg->tcp_workers > MAX_LANES ? MAX_LANES : cfg->tcp_workers);
    /* Lane workers run on the CPUs of the data NIC's NUMA node (unbound when unknown). */
    ote_context_info_t info;
    ote_context_get_info(tp->ctx, &info);
    st = ote_cq_workers_start_numa(tp->nlanes, info.numa_node >= 0 ? info.numa_node : -1,
                                   &tp->workers);
    if (st != OTE_OK) goto err;
    for (uint32_t i = 0; i < tp->nlanes; i++) {
        ote_cq_lane_config_t lc = {.index = i, .send_depth = 4096, .recv_depth = 4096, .use_channel = 1};
        st = ote_cq_lane_create(tp->ctx, &lc, &tp->lanes[i]);
        if (st == OTE_OK) st = ote_cq_workers_add(tp->workers, tp->lanes[i]);
        if (st != OTE_OK) goto err;
    }
    ote_grant_source_ops_t src = {.arg = tp, .pin = src_pin, .unpin = src_unpin, .answer = src_answer};
    st = ote_grant_mgr_create(tp->ctx, tp->lanes, tp->nlanes, &src, &tp->gm);
    if (st != OTE_OK) goto err;
    ote_qp_config_t qc;
    ote_qp_config_default(&qc);
    qc.max_send_wr = 256;
    qc.recv_slots = 64; /* grant receipts (SEND_WITH_INV) land here */
    qc.recv_size = 64;
    qc.on_recv = on_recv;
    qc.recv_arg = tp;
    st = ote_endpoint_store_create(tp->ctx, tp->lanes, tp->nlanes, &qc, &tp->eps);
    if (st != OTE_OK) goto err;
    tp->process_id = ((uint64_t)getpid() << 32) ^ ote_now_ns() ^ (uint64_t)(uintptr_t)tp;
    tp->pd_id = (uint64_t)(uintptr_t)ote_context_pd(tp->ctx) ^ tp->process_id;
    st = listen_on(tp);
    if (st != OTE_OK) goto err;
    if (pthread_create(&tp->monitor, NULL, monitor_main, tp) != 0) {
        st = OTE_ERR_NOMEM;
        goto err;
    }
    tp->monitor_started = 1;
    if (pthread_create(&tp->acceptor, NULL, acceptor_main, tp) != 0) {
        st = OTE_ERR_NOMEM;
        goto err;
    }
    tp->acceptor_started = 1;
    OTE_INFO("rdma", "transport=rdma over \"%s\": data context %s port %u GID index %d, %u lanes, "
             "listening on %s", tp->v->provider, info.name, info.port, info.gid_index, tp->nlanes,
             tp->addr);
    *tp_out = &tp->base;
    return OTE_OK;
err:
    teardown(tp);
    return st;
}

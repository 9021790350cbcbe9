/*
 * engine/rdma/rdma_conn.c - one control connection of the RDMA transport, on either side
 * (see conn_t in rdma_internal.h): framing on its non-blocking socket, the bounded output
 * queue that any thread may add to and only the connection's own thread waits to flush,
 * and its reference count. Touches only conn_t's socket, queue and buffer fields.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/le.h"
#include "base/log.h"
#include "engine/rdma/rdma_internal.h"

void ote__rdma_conn_kill(conn_t *c, const char *why) {
    if (atomic_exchange(&c->dead, 1) == 0 && why != NULL)
        OTE_WARN("rdma", "control connection %s%s dropped: %s", c->peer_addr[0] ? "with " : "",
                 c->peer_addr, why);
    (void)shutdown(c->fd, SHUT_RDWR); /* wakes the connection's own thread */
}

/* Wake the owner thread (it may sleep up to OTE__RDMA_CONN_IDLE_MS in poll). */
static void conn_wake(conn_t *c) {
    uint64_t one = 1;
    ssize_t r = write(c->wake_fd, &one, sizeof(one)); /* full counter: a wake is due anyway */
    (void)r;
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
    if (why != NULL) ote__rdma_conn_kill(c, why);
    return atomic_load(&c->dead) ? -1 : 0;
}

/* Queue one encoded frame; never blocks on the socket. */
ote_status_t ote__rdma_conn_send_raw(conn_t *c, const uint8_t *buf, size_t len) {
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
        if (c->out == NULL) c->out = ote_malloc(OTE__RDMA_OUT_CAP);
        if (c->out == NULL) {
            why = "no memory for its output queue";
        } else if (len > OTE__RDMA_OUT_CAP - c->olen) {
            why = "output queue overflow (the peer does not read)";
        } else {
            if (c->ooff + c->olen + len > OTE__RDMA_OUT_CAP) {
                memmove(c->out, c->out + c->ooff, c->olen);
                c->ooff = 0;
            }
            memcpy(c->out + c->ooff + c->olen, buf, len);
            int was_empty = c->olen == 0;
            c->olen += len;
            if (was_empty) conn_wake(c); /* the owner polls for POLLOUT from now on */
        }
    }
    ote_mutex_unlock(&c->wmu);
    if (why != NULL) {
        ote__rdma_conn_kill(c, why);
        return OTE_ERR_PEER_LOST;
    }
    return OTE_OK;
}

/*
 * Owner thread: the next frame (valid until the next call), flushing queued output while
 * waiting. OTE_ERR_PEER_LOST when the connection closed or died (or *stop was set),
 * OTE_ERR_PROTOCOL for bad framing, OTE_ERR_TIMEOUT at dl.
 */
ote_status_t ote__rdma_conn_next(conn_t *c, ote_ctl_msg_t *m, ote_deadline_t dl,
                                 const _Atomic int *stop) {
    if (c->iconsumed > 0) {
        memmove(c->in, c->in + c->iconsumed, c->ilen - c->iconsumed);
        c->ilen -= c->iconsumed;
        c->iconsumed = 0;
    }
    for (;;) {
        if (c->ilen >= OTE_CTL_HDR_LEN) {
            uint32_t length = ote_le_get32(c->in + 20); /* the header's body length */
            if (length > OTE__RDMA_FRAME_MAX - OTE_CTL_HDR_LEN) return OTE_ERR_PROTOCOL;
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
        struct pollfd p[2] = {{.fd = c->fd, .events = (short)(POLLIN | (pending ? POLLOUT : 0))},
                              {.fd = c->wake_fd, .events = POLLIN}};
        int n = poll(p, 2,
                     ote_deadline_remaining_ms(
                         dl, pending ? OTE__RDMA_CONN_POLL_MS : OTE__RDMA_CONN_IDLE_MS));
        if (n < 0 && errno != EINTR) return OTE_ERR_PEER_LOST;
        if (n > 0 && (p[1].revents & POLLIN)) {
            uint64_t cnt;
            ssize_t r = read(c->wake_fd, &cnt, sizeof(cnt));
            (void)r;
        }
        if (n <= 0 || (p[0].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
        ssize_t r = recv(c->fd, c->in + c->ilen, OTE__RDMA_FRAME_MAX - c->ilen, MSG_DONTWAIT);
        if (r == 0) return OTE_ERR_PEER_LOST;
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
            return OTE_ERR_PEER_LOST;
        }
        c->ilen += (size_t)r;
    }
}

ote_status_t ote__rdma_conn_send(conn_t *c, const ote_ctl_msg_t *m) {
    uint8_t buf[OTE__RDMA_FRAME_MAX];
    size_t len = 0;
    ote_status_t st = ote_ctl_encode(m, buf, sizeof(buf), &len);
    if (st != OTE_OK) return st;
    return ote__rdma_conn_send_raw(c, buf, len);
}

ote_status_t ote__rdma_conn_send_rp(conn_t *c, uint64_t req_id, ote_status_t status,
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
    return ote__rdma_conn_send(c, &m);
}

void ote__rdma_conn_get(conn_t *c) { atomic_fetch_add(&c->refs, 1); }

void ote__rdma_conn_put(conn_t *c) {
    if (atomic_fetch_sub(&c->refs, 1) != 1) return;
    close(c->fd);
    close(c->wake_fd);
    if (c->adopted && c->tp->host.conn_closed != NULL) c->tp->host.conn_closed(c->tp->host.arg);
    ote_mutex_destroy(&c->wmu);
    ote_free(c->out);
    ote_free(c->in);
    ote_free(c);
}

/* Takes over fd (closed on failure). */
conn_t *ote__rdma_conn_new(rdma_tp_t *tp, int fd) {
    conn_t *c = ote_calloc(1, sizeof(*c));
    if (c != NULL) c->in = ote_malloc(OTE__RDMA_FRAME_MAX);
    if (c == NULL || c->in == NULL || ote_mutex_init(&c->wmu) != OTE_OK) {
        if (c != NULL) ote_free(c->in);
        ote_free(c);
        close(fd);
        return NULL;
    }
    c->tp = tp;
    c->fd = fd;
    c->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (c->wake_fd < 0) {
        OTE_WARN("rdma", "control connection: eventfd failed: errno %d", errno);
        ote_mutex_destroy(&c->wmu);
        ote_free(c->in);
        ote_free(c);
        close(fd);
        return NULL;
    }
    uint64_t ms = tp->cfg.connect_timeout_ms < 1000 ? 1000 : tp->cfg.connect_timeout_ms;
    c->send_timeout_ns = ms * OTE_NSEC_PER_MSEC;
    atomic_store(&c->refs, 1);
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    int fl = fcntl(fd, F_GETFL, 0);
    if (fl >= 0) (void)fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    return c;
}

static ote_status_t auth_send(void *arg, const ote_ctl_msg_t *m) {
    return ote__rdma_conn_send(((rdma_auth_chan_t *)arg)->c, m);
}

static ote_status_t auth_recv(void *arg, ote_ctl_msg_t *m) {
    rdma_auth_chan_t *ch = arg;
    return ote__rdma_conn_next(ch->c, m, ch->dl, ch->stop);
}

ote_auth_io_t ote__rdma_auth_io(rdma_auth_chan_t *ch) {
    ote_auth_io_t io = {auth_send, auth_recv, ch};
    return io;
}

/*
 * engine/tcp/tcp_worker.c - the worker threads of the TCP transport. A worker owns an
 * epoll set and the connections attached to it: it runs their commands (attach,
 * detach), receives on them and dispatches each frame to the requester or source side,
 * sends when they are writable and enforces deadlines every tick. Source connections
 * arrive from the engine's listener (attach commands), their HELLO already received.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/log.h"
#include "engine/tcp/tcp_internal.h"

/* Set on worker threads (see tcp_internal.h). */
_Thread_local int ote__tcp_on_worker;

void ote__tcp_worker_wake(tcp_worker_t *w) {
    if (!atomic_exchange(&w->woken, 1)) {
        uint64_t one = 1;
        ssize_t r = write(w->evfd, &one, sizeof(one));
        (void)r;
    }
}

void ote__tcp_worker_post(tcp_worker_t *w, tcp_cmd_t *cmd) {
    ote_mutex_lock(&w->cmu);
    cmd->next = NULL;
    if (w->ctail) w->ctail->next = cmd;
    else w->chead = cmd;
    w->ctail = cmd;
    ote_mutex_unlock(&w->cmu);
    ote__tcp_worker_wake(w);
}

static void worker_bury(tcp_worker_t *w) {
    tcp_t *tp = w->tp;
    while (w->grave) {
        tcp_conn_t *c = w->grave;
        w->grave = c->wnext;
        c->wnext = NULL;
        if (c->role == ROLE_SOURCE) {
            ote__tcp_conn_free(c);
        } else {
            ote_mutex_lock(&tp->mu);
            c->detached = 1;
            ote_cond_broadcast(&tp->cv);
            ote_mutex_unlock(&tp->mu);
        }
    }
}

/* A payload (WRITE data on the source, READ data on the requester) has fully arrived. */
static int payload_done(tcp_conn_t *c) {
    c->rx_state = RX_HDR;
    if (c->role == ROLE_REQUESTER) {
        ote__tcp_req_pop_complete(c, OTE_OK);
        return 0;
    }
    return ote__tcp_src_payload_done(c);
}

/* What ote__tcp_conn_read does after one of its steps. */
typedef enum {
    READ_LOOP, /* go round the read loop again */
    READ_STOP, /* leave it: nothing to read now, budget spent, paused, or the connection gone */
    READ_ON,   /* go on to the next step of this round */
} read_next_t;

/* A recv that returned r <= 0 (errno from it): the peer closed (killed, PEER_LOST), an
 * interruption (again), nothing there now (stop), or an error (killed). */
static read_next_t read_failed(tcp_conn_t *c, ssize_t r) {
    if (r == 0) {
        if (c->role == ROLE_SOURCE) OTE_DEBUG("tcp", "requester %s closed its connection", c->from);
        ote__tcp_conn_kill(c, OTE_ERR_PEER_LOST);
        return READ_STOP;
    }
    if (errno == EINTR) return READ_LOOP;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return READ_STOP;
    ote__tcp_conn_kill(c, ote_status_make(OTE_ERR_PEER_LOST, errno));
    return READ_STOP;
}

/* Inside a payload: the buffered bytes go to their place first; a complete payload is
 * done; otherwise one recv within *budget, straight into place for a large data rest. */
static read_next_t read_payload(tcp_conn_t *c, size_t *budget) {
    ssize_t r;
    size_t avail = c->rx_end - c->rx_start;
    if (avail > 0) {
        size_t k = avail < c->rx_left ? avail : c->rx_left;
        if (c->rx_state == RX_DATA) memcpy(c->rx_dst, c->rxbuf + c->rx_start, k);
        c->rx_dst += k;
        c->rx_start += k;
        c->rx_left -= k;
    }
    if (c->rx_left == 0) return payload_done(c) != 0 ? READ_STOP : READ_LOOP;
    c->rx_start = c->rx_end = 0;
    if (*budget == 0) return READ_STOP;
    if (c->rx_state == RX_DATA && c->rx_left >= TCP_DIRECT_MIN)
        r = recv(c->fd, c->rx_dst, c->rx_left, MSG_DONTWAIT);
    else r = recv(c->fd, c->rxbuf, c->rxcap, MSG_DONTWAIT);
    if (r > 0) {
        c->progress++;
        *budget = (size_t)r >= *budget ? 0 : *budget - (size_t)r;
        if (c->rx_state == RX_DATA && c->rx_left >= TCP_DIRECT_MIN) {
            c->rx_dst += r;
            c->rx_left -= (size_t)r;
        } else {
            c->rx_end = (size_t)r;
        }
        return READ_LOOP;
    }
    return read_failed(c, r);
}

/* Parse every complete frame in the buffer and dispatch it to the source or requester
 * side: READ_ON once only a partial frame is left, READ_LOOP when a frame starts a
 * payload; a source without room for responses pauses (resumed by src_resume), a
 * malformed frame kills the connection (ERROR, rate-limited). */
static read_next_t read_parse_frames(tcp_conn_t *c) {
    while (c->rx_state == RX_HDR && c->rx_end > c->rx_start) {
        if (c->role == ROLE_SOURCE && !ote__tcp_src_may_parse(c)) {
            ote__tcp_src_pause(c); /* resumed by src_resume once responses drain */
            return READ_STOP;
        }
        ote_ctl_msg_t m;
        size_t used = 0;
        ote_status_t st =
            ote_ctl_decode(c->rxbuf + c->rx_start, c->rx_end - c->rx_start, &m, &used);
        if (st == OTE_ERR_AGAIN) break;
        if (st != OTE_OK) {
            OTE_LOG_LIMITED(OTE_LOG_ERROR, "control",
                            "malformed frame from %s: %s; closing connection",
                            c->role == ROLE_SOURCE ? c->from : (c->peer ? c->peer->addr : "?"),
                            ote_status_str(st));
            ote__tcp_conn_kill(c, OTE_ERR_PROTOCOL);
            return READ_STOP;
        }
        c->rx_start += used;
        int rc = c->role == ROLE_SOURCE ? ote__tcp_src_frame(c, &m) : ote__tcp_req_frame(c, &m);
        if (rc != 0) return READ_STOP;
        if (c->rx_state != RX_HDR) return READ_LOOP;
    }
    return READ_ON;
}

/* Read more: keep the partial frame, bounded by a header after a large payload
 * so that the next large payload lands in place rather than in the buffer. One recv
 * within *budget; a frame that cannot fit the buffer kills the connection (WARN). */
static read_next_t read_frame_bytes(tcp_conn_t *c, size_t *budget) {
    if (c->rx_start > 0) {
        size_t rem = c->rx_end - c->rx_start;
        if (rem) memmove(c->rxbuf, c->rxbuf + c->rx_start, rem);
        c->rx_start = 0;
        c->rx_end = rem;
    }
    size_t want = c->rxcap - c->rx_end;
    if (c->last_large && c->rx_end < OTE_CTL_RW2_FRAME_LEN)
        want = OTE_CTL_RW2_FRAME_LEN - c->rx_end;
    if (want == 0) { /* an incomplete frame fills the buffer: larger than allowed here */
        OTE_WARN_LIMITED("control", "frame from %s larger than %zu bytes%s: closing connection",
                         c->role == ROLE_SOURCE ? c->from : (c->peer ? c->peer->addr : "?"),
                         c->rxcap, c->handshaken ? "" : " before the handshake");
        ote__tcp_conn_kill(c, OTE_ERR_PROTOCOL);
        return READ_STOP;
    }
    ssize_t r = recv(c->fd, c->rxbuf + c->rx_end, want, MSG_DONTWAIT);
    if (r > 0) {
        c->progress++;
        c->rx_end += (size_t)r;
        *budget = (size_t)r >= *budget ? 0 : *budget - (size_t)r;
        return READ_LOOP;
    }
    return read_failed(c, r);
}

void ote__tcp_conn_read(tcp_conn_t *c) {
    size_t budget = TCP_RX_BUDGET;
    if (c->rx_paused) return;
    while (c->fd >= 0) {
        read_next_t next;
        if (c->rx_state != RX_HDR) {
            next = read_payload(c, &budget);
        } else {
            next = read_parse_frames(c);
            if (next == READ_ON) next = budget == 0 ? READ_STOP : read_frame_bytes(c, &budget);
        }
        if (next == READ_STOP) return;
    }
}

static void conn_flush(tcp_conn_t *c) {
    if (c->fd < 0) return;
    if (c->role == ROLE_SOURCE) ote__tcp_src_pump(c);
    else ote__tcp_req_write(c);
}

static void worker_attach(tcp_worker_t *w, tcp_conn_t *c) {
    /* c->w is w already: the poster set it before posting the attach to that worker, and
     * submitting threads read it (to wake the worker) while it is attached, so it is not
     * written here. */
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
        ote__tcp_conn_kill(c, ote_status_from_errno(errno));
        return;
    }
    /* An adopted source connection holds its HELLO already: answer it now (no EPOLLIN
     * comes for bytes the listener read). */
    if (c->role == ROLE_SOURCE && c->rx_end > c->rx_start) {
        ote__tcp_conn_read(c);
        if (c->fd >= 0 && c->rcount) conn_flush(c);
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
            if (c->fd >= 0) ote__tcp_conn_kill(c, OTE_ERR_PEER_LOST);
            ote_mutex_lock(&tp->mu);
            c->cmd_pending = 0;
            ote_cond_broadcast(&tp->cv);
            ote_mutex_unlock(&tp->mu);
        }
    }
}

static void worker_service(tcp_worker_t *w) {
    worker_commands(w);
    ote__tcp_fread_drain(w); /* file reads that ended (tcp_fread.c) */
    for (tcp_conn_t *c = w->conns, *next; c; c = next) {
        next = c->wnext;
        if (c->role != ROLE_REQUESTER) continue;
        if (atomic_load_explicit(&c->qflag, memory_order_acquire) ||
            atomic_load_explicit(&c->purge, memory_order_relaxed))
            ote__tcp_req_write(c);
    }
}

static void worker_tick(tcp_worker_t *w, uint64_t now) {
    for (tcp_conn_t *c = w->conns, *next; c; c = next) {
        next = c->wnext;
        if (c->role == ROLE_SOURCE) {
            ote__tcp_src_tick(c, now);
            continue;
        }
        if (now >= ote__tcp_req_oldest_deadline(c)) {
            OTE_WARN_LIMITED("tcp", "a transfer to %s passed its deadline: closing connection %u",
                             c->peer ? c->peer->addr : "?", c->index);
            ote__tcp_conn_kill(c, OTE_ERR_TIMEOUT);
        }
    }
}

void *ote__tcp_worker_main(void *arg) {
    tcp_worker_t *w = arg;
    tcp_t *tp = w->tp;
    struct epoll_event evs[64];
    ote__tcp_on_worker = 1;
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
            } else {
                tcp_conn_t *c = p;
                if (c->fd < 0) continue;
                uint32_t ev = evs[i].events;
                if (c->rx_paused && (ev & (EPOLLERR | EPOLLHUP))) { /* reported even when paused */
                    ote__tcp_conn_kill(c, OTE_ERR_PEER_LOST);
                    continue;
                }
                if (ev & (EPOLLIN | EPOLLERR | EPOLLHUP)) ote__tcp_conn_read(c);
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
    while (w->conns) ote__tcp_conn_kill(w->conns, OTE_ERR_PEER_LOST);
    worker_bury(w);
    if (ote__tcp_fread_settle(w) != 0) {
        ote_mutex_lock(&tp->mu);
        tp->leak_workers = 1;
        ote_mutex_unlock(&tp->mu);
    }
    return NULL;
}

/*
 * engine/tcp/tcp_conn.c - one connection of the TCP transport: creation and socket
 * options, its epoll interest, and its death (conn_kill), which fails or releases
 * everything it holds. See tcp_internal.h for the structs and the lock order.
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/fault.h"
#include "base/log.h"
#include "engine/tcp/tcp_internal.h"

void ote__tcp_set_sockopts(tcp_t *tp, int fd) {
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (tp->sockbuf > 0) {
        (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &tp->sockbuf, sizeof(tp->sockbuf));
        (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &tp->sockbuf, sizeof(tp->sockbuf));
    }
}

/* A source connection starts with a TCP_HS_RXBUF receive buffer (a connection that never
 * handshakes costs little) and gets TCP_RXBUF once its HELLO is accepted. */
tcp_conn_t *ote__tcp_conn_new(tcp_t *tp, int fd, int role) {
    tcp_conn_t *c = ote_calloc(1, sizeof(*c));
    if (c == NULL) return NULL;
    c->rxcap = role == ROLE_SOURCE ? TCP_HS_RXBUF : TCP_RXBUF;
    c->rxbuf = ote_malloc(c->rxcap);
    if (c->rxbuf == NULL || ote_mutex_init(&c->qmu) != OTE_OK) {
        ote_free(c->rxbuf);
        ote_free(c);
        return NULL;
    }
    if (ote_mutex_init(&c->smu) != OTE_OK) {
        ote_mutex_destroy(&c->qmu);
        ote_free(c->rxbuf);
        ote_free(c);
        return NULL;
    }
    c->fd = fd;
    c->role = role;
    c->w = &tp->workers[atomic_fetch_add(&tp->rr, 1) % tp->nworkers];
    c->attach_cmd.kind = CMD_ATTACH;
    c->attach_cmd.c = c;
    c->detach_cmd.kind = CMD_DETACH;
    c->detach_cmd.c = c;
    return c;
}

ote_status_t ote__tcp_adopt(ote__transport_t *t, int fd, const char *from, const uint8_t *hello,
                            size_t len) {
    tcp_t *tp = to_tcp(t);
    ote_status_t st = OTE_ERR_TOO_BIG;
    if (len > TCP_HS_RXBUF || ote_fault_hit("tcp.adopt", &st)) {
        close(fd); /* taken in every case; the listener gives its place back */
        return st;
    }
    ote__tcp_set_sockopts(tp, fd);
    tcp_conn_t *c = ote__tcp_conn_new(tp, fd, ROLE_SOURCE);
    if (c == NULL) {
        close(fd);
        return OTE_ERR_NOMEM;
    }
    memcpy(c->rxbuf, hello, len); /* parsed once a worker attaches it */
    c->rx_end = len;
    c->born_ns = ote_now_ns();
    snprintf(c->from, sizeof(c->from), "%s", from);
    ote__tcp_worker_post(c->w, &c->attach_cmd);
    return OTE_OK;
}

void ote__tcp_conn_free(tcp_conn_t *c) {
    if (c == NULL) return;
    if (c->fd >= 0) close(c->fd);
    if (c->role == ROLE_SOURCE) { /* adopted from the listener: its place frees */
        const ote__host_t *h = &c->w->tp->host;
        if (h->conn_closed != NULL) h->conn_closed(h->arg);
    }
    ote_mutex_destroy(&c->qmu);
    ote_mutex_destroy(&c->smu);
    ote_free(c->rxbuf);
    ote_free(c->ring);
    ote_free(c);
}

/* Keep the epoll interest of c in line with out_wanted and rx_paused. */
void ote__tcp_conn_events(tcp_conn_t *c) {
    uint32_t ev =
        (c->rx_paused ? 0u : (uint32_t)EPOLLIN) | (c->out_wanted ? (uint32_t)EPOLLOUT : 0u);
    if (ev == c->ev || c->fd < 0) return;
    struct epoll_event e = {.events = ev, .data.ptr = c};
    if (epoll_ctl(c->w->epfd, EPOLL_CTL_MOD, c->fd, &e) == 0) c->ev = ev;
}

void ote__tcp_want_out(tcp_conn_t *c, int on) {
    c->out_wanted = on;
    ote__tcp_conn_events(c);
}

static ote_status_t fail_status(const ote__slice_t *s, ote_status_t why, uint64_t now) {
    if (s->canceled && atomic_load_explicit(s->canceled, memory_order_relaxed))
        return OTE_ERR_CANCELED;
    if (ote_status_code(why) == OTE_ERR_TIMEOUT && now < s->deadline) return OTE_ERR_PEER_LOST;
    return why;
}

void ote__tcp_complete_list(ote__slice_t *list, ote_status_t why) {
    uint64_t now = ote_now_ns();
    while (list) {
        ote__slice_t *s = list;
        list = s->next;
        s->next = NULL;
        s->done(s, fail_status(s, why, now));
    }
}

/* Close the socket, fail or release everything the connection holds, and move it to the
 * worker's graveyard (freed or reported detached at the end of the loop iteration, so
 * no event of this iteration can touch freed memory). Worker thread only. */
void ote__tcp_conn_kill(tcp_conn_t *c, ote_status_t why) {
    if (c->fd < 0) return;
    if (c->role == ROLE_REQUESTER) ote_mutex_lock(&c->smu); /* no inline send while closing */
    tcp_worker_t *w = c->w;
    if (c->role == ROLE_SOURCE) {
        /* Unpinned before the close: once the requester sees EOF, unregister works. */
        for (size_t i = 0; i < c->rcount; i++) {
            tcp_resp_t *r = &c->ring[(c->rhead + i) % c->rcap];
            if (r->fread) ote__tcp_fread_drop(c, r); /* a running read keeps its bounce */
            if (r->pin) ote__tcp_src_unpin(c, r->pin, r->len);
            r->pin = NULL;
            ote__tcp_src_stage_put(c, &r->stage, &r->stage_file);
            if (r->owned) ote_free((void *)r->data);
            r->owned = 0;
        }
        c->rcount = 0;
        c->bufs_queued = 0;
        if (c->rx_pin) ote__tcp_src_unpin(c, c->rx_pin, c->rx_len);
        c->rx_pin = NULL;
        ote__tcp_src_stage_put(c, &c->rx_stage, &c->rx_stage_file);
        /* The last connection of its session ends what the requester left open. */
        ote__tcp_src_sess_leave(c);
    }
    (void)epoll_ctl(w->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->fd = -1;
    if (c->wprev) c->wprev->wnext = c->wnext;
    else if (w->conns == c) w->conns = c->wnext;
    if (c->wnext) c->wnext->wprev = c->wprev;
    c->wprev = NULL;
    c->wnext = w->grave;
    w->grave = c;

    if (c->role == ROLE_SOURCE) return;
    ote_mutex_lock(&c->qmu);
    c->qdead = 1;
    ote__slice_t *q = c->qhead;
    c->qhead = c->qtail = NULL;
    ote_mutex_unlock(&c->qmu);
    /* Everything in flight, oldest first: awaiting responses, sent, unsent. */
    ote__slice_t *inflight = c->head, **link = c->head ? &c->tail->next : &inflight;
    *link = c->sent;
    if (c->sent) link = &c->sent_tail->next;
    *link = c->tx;
    c->head = c->tail = c->sent = c->sent_tail = c->tx = c->tx_tail = NULL;
    c->tx_off = 0;
    ote_mutex_unlock(&c->smu);
    if (c->peer) atomic_store(&c->peer->broken, 1);
    size_t n = 0;
    for (ote__slice_t *s = inflight; s; s = s->next) n++;
    for (ote__slice_t *s = q; s; s = s->next) n++;
    if (n > 0)
        OTE_WARN_LIMITED("tcp", "connection %u to %s closed (%s): failing %zu slice(s)", c->index,
                         c->peer ? c->peer->addr : "?", ote_status_str(why), n);
    else
        OTE_DEBUG("tcp", "connection %u to %s closed (%s)", c->index, c->peer ? c->peer->addr : "?",
                  ote_status_str(why));
    ote__tcp_complete_list(inflight, why);
    ote__tcp_complete_list(q, why);
}

/*
 * engine/tcp/tcp_connect.c - the requester's connections: connect with a deadline, the
 * HELLO / HELLO_ACK handshake (versions, max_data, the peer's advertised address), and
 * the peer object: open, reconnect after a loss, close (each connection detached by its
 * worker before it is freed).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/fault.h"
#include "base/le.h"
#include "base/log.h"
#include "engine/control/hello.h"
#include "engine/control/sock.h"
#include "engine/tcp/tcp_internal.h"

/* One connection's handshake: its socket, the buffer the HELLO goes out of and the
 * answer comes into (ack's strings point into it), the answer and its version. */
typedef struct {
    int fd;
    uint8_t buf[OTE_CTL_HDR_LEN + OTE_CTL_MAX_BODY];
    ote_ctl_msg_t ack;
    uint16_t ver;
} conn_hs_t;

/* A non-blocking socket to p->addr, connected by dl: *fd_out on success (nothing left
 * open on failure; socket and connect failures logged WARN). */
static ote_status_t conn_socket(tcp_peer_t *p, ote_deadline_t dl, int *fd_out) {
    struct sockaddr_storage ss;
    socklen_t sl;
    ote_status_t st = ote__addr_resolve(p->addr, &ss, &sl);
    if (st != OTE_OK) return st;
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        st = ote_status_from_errno(errno);
        OTE_WARN("tcp", "socket() for %s failed: %s", p->addr, strerror(errno));
        return st;
    }
    ote__tcp_set_sockopts(p->tp, fd);
    st = ote_ctl_connect(fd, (struct sockaddr *)&ss, sl, dl);
    if (st != OTE_OK) {
        OTE_WARN("tcp", "connect to %s failed: %s", p->addr,
                 st == OTE_ERR_TIMEOUT ? "timed out" : strerror(ote_status_errno(st)));
        close(fd);
        return st;
    }
    *fd_out = fd;
    return OTE_OK;
}

/* HELLO out, HELLO_ACK in, checked (engine/control/hello.h: the key's challenge-response
 * when the source asks for it; failures logged there): hs->ack (its strings in hs->buf)
 * and hs->ver on success. hs->fd stays open either way. */
static ote_status_t conn_handshake(tcp_peer_t *p, conn_hs_t *hs, uint16_t index, uint64_t session,
                                   ote_deadline_t dl) {
    tcp_t *tp = p->tp;
    ote_ctl_hello_t h = {.role = ROLE_REQUESTER,
                         .conn_index = index,
                         .session = session,
                         .addr = tp->addr,
                         .name = tp->host.self_name};
    ote_auth_sock_t as = {hs->fd, hs->buf, sizeof(hs->buf), dl};
    ote_auth_io_t io = ote_auth_sock_io(&as);
    return ote_ctl_hello_exchange(tp->host.auth_key, &h, &io, p->addr, &hs->ack, &hs->ver);
}

/* The incarnation the segment met first: a restarted peer at this address fails it
 * (its addresses named the old process's memory). The first connection of peer_open
 * records it in p->met; OTE_ERR_PEER_LOST (WARN once per peer) for another one. */
static ote_status_t conn_check_incarnation(tcp_peer_t *p, const ote_ctl_msg_t *ack) {
    char info[OTE_CTL_MAX_INFO + 1];
    size_t il = ack->u.hello_ack.info_len <= OTE_CTL_MAX_INFO ? ack->u.hello_ack.info_len : 0;
    memcpy(info, ack->u.hello_ack.info, il);
    info[il] = '\0';
    uint64_t inc = ote_ctl_info_incarnation(info);
    if (!p->met_set) { /* the first connection of peer_open */
        p->met = inc;
        p->met_set = 1;
    } else if (inc != p->met) {
        if (!atomic_exchange(&p->restarted, 1))
            OTE_WARN("tcp",
                     "peer %s restarted (epoch %016llx, was %016llx): this segment fails with "
                     "OTE_ERR_PEER_LOST; close it and open a new segment",
                     p->addr, (unsigned long long)inc, (unsigned long long)p->met);
        return OTE_ERR_PEER_LOST;
    }
    return OTE_OK;
}

/* The handshaken connection c of p (index, version); connection 0 also learns the
 * peer's advertised address and max_data from the answer. */
static void conn_adopt(tcp_peer_t *p, tcp_conn_t *c, uint16_t index, const conn_hs_t *hs) {
    const ote_ctl_msg_t *ack = &hs->ack;
    c->version = hs->ver;
    c->index = index;
    c->peer = p;
    c->handshaken = 1;
    if (index == 0) {
        memcpy(p->remote_addr, ack->u.hello_ack.addr, ack->u.hello_ack.addr_len);
        p->remote_addr[ack->u.hello_ack.addr_len] = '\0';
        atomic_store(&p->max_data, ack->u.hello_ack.max_data); /* checked by check_hello_ack */
    }
    snprintf(c->from, sizeof(c->from), "%s", p->addr);
}

/* Connect one data connection of `p` and run the handshake. */
static ote_status_t conn_connect(tcp_peer_t *p, uint16_t index, uint64_t session, ote_deadline_t dl,
                                 tcp_conn_t **c_out) {
    ote_status_t st;
    if (ote_fault_hit("tcp.connect", &st)) return st;
    conn_hs_t hs;
    if ((st = conn_socket(p, dl, &hs.fd)) != OTE_OK) return st;
    if ((st = conn_handshake(p, &hs, index, session, dl)) != OTE_OK) goto err_close_fd;
    if ((st = conn_check_incarnation(p, &hs.ack)) != OTE_OK) goto err_close_fd;
    tcp_conn_t *c = ote__tcp_conn_new(p->tp, hs.fd, ROLE_REQUESTER);
    if (c == NULL) {
        st = OTE_ERR_NOMEM;
        goto err_close_fd;
    }
    conn_adopt(p, c, index, &hs);
    *c_out = c;
    return OTE_OK;

err_close_fd:
    close(hs.fd);
    return st;
}

/* Detach (through its worker) and free one requester connection. */
static ote_status_t conn_close(tcp_t *tp, tcp_conn_t *c) {
    ote_deadline_t dl = ote_deadline_after(10 * OTE_NSEC_PER_SEC);
    ote_mutex_lock(&tp->mu);
    if (!c->detached) {
        c->cmd_pending = 1;
        ote_mutex_unlock(&tp->mu);
        ote__tcp_worker_post(c->w, &c->detach_cmd);
        ote_mutex_lock(&tp->mu);
    }
    while (!c->detached || c->cmd_pending) {
        if (ote_cond_wait(&tp->cv, &tp->mu, dl) == OTE_ERR_TIMEOUT &&
            (!c->detached || c->cmd_pending)) {
            ote_mutex_unlock(&tp->mu);
            OTE_ERROR("tcp", "worker did not release a connection within 10 s; keeping it");
            return OTE_ERR_TIMEOUT;
        }
    }
    ote_mutex_unlock(&tp->mu);
    ote__tcp_conn_free(c);
    return OTE_OK;
}

/* Connect all p->n connections (p->lk held for writing or p private). */
static ote_status_t peer_connect_all(tcp_peer_t *p) {
    tcp_t *tp = p->tp;
    ote_deadline_t dl = ote_deadline_after(tp->cfg.connect_timeout_ms * OTE_NSEC_PER_MSEC);
    uint64_t session = atomic_fetch_add(&tp->session, 1);
    ote_status_t st = OTE_OK;
    uint32_t i;
    for (i = 0; i < p->n; i++) {
        st = conn_connect(p, (uint16_t)i, session, dl, &p->conns[i]);
        if (st != OTE_OK) break;
    }
    if (st != OTE_OK) {
        for (uint32_t j = 0; j < i; j++) {
            ote__tcp_conn_free(p->conns[j]);
            p->conns[j] = NULL;
        }
        return st;
    }
    for (i = 0; i < p->n; i++) {
        tcp_conn_t *c = p->conns[i];
        c->w = &tp->workers[(atomic_fetch_add(&tp->rr, 1)) % tp->nworkers];
        ote__tcp_worker_post(c->w, &c->attach_cmd);
    }
    return OTE_OK;
}

static ote_status_t peer_disconnect_all(tcp_peer_t *p) {
    ote_status_t first = OTE_OK;
    for (uint32_t i = 0; i < p->n; i++) {
        if (p->conns[i] == NULL) continue;
        ote_status_t st = conn_close(p->tp, p->conns[i]);
        if (st == OTE_OK) p->conns[i] = NULL;
        else if (first == OTE_OK) first = st;
    }
    return first;
}

ote_status_t ote__tcp_peer_open(ote__transport_t *t, const char *peer, ote__tpeer_t **peer_out) {
    tcp_t *tp = to_tcp(t);
    if (strlen(peer) >= OTE__ADDR_MAX) return OTE_ERR_INVALID;
    tcp_peer_t *p = ote_calloc(1, sizeof(*p));
    if (p == NULL) return OTE_ERR_NOMEM;
    p->conns = ote_calloc(tp->cfg.tcp_connections, sizeof(*p->conns));
    if (p->conns == NULL || pthread_rwlock_init(&p->lk, NULL) != 0) {
        ote_free(p->conns);
        ote_free(p);
        return OTE_ERR_NOMEM;
    }
    p->tp = tp;
    p->n = tp->cfg.tcp_connections;
    snprintf(p->addr, sizeof(p->addr), "%s", peer);
    ote_status_t st = peer_connect_all(p);
    if (st != OTE_OK) {
        pthread_rwlock_destroy(&p->lk);
        ote_free(p->conns);
        ote_free(p);
        return st;
    }
    OTE_INFO("tcp", "connected to %s (advertises %s) over %u connection(s)", p->addr,
             p->remote_addr, p->n);
    *peer_out = (ote__tpeer_t *)p;
    return OTE_OK;
}

ote_status_t ote__tcp_peer_ensure(ote__tpeer_t *tpeer) {
    tcp_peer_t *p = (tcp_peer_t *)tpeer;
    if (atomic_load(&p->restarted)) return OTE_ERR_PEER_LOST; /* reopen the segment */
    if (!atomic_load_explicit(&p->broken, memory_order_acquire)) return OTE_OK;
    pthread_rwlock_wrlock(&p->lk);
    ote_status_t st = OTE_OK;
    if (atomic_load(&p->broken)) {
        st = peer_disconnect_all(p);
        if (st == OTE_OK) {
            OTE_INFO("tcp", "reconnecting to %s", p->addr);
            atomic_store(&p->broken, 0);
            st = peer_connect_all(p);
            if (st != OTE_OK) atomic_store(&p->broken, 1);
        }
    }
    pthread_rwlock_unlock(&p->lk);
    return st;
}

void ote__tcp_peer_lost(ote__tpeer_t *tpeer) {
    tcp_peer_t *p = (tcp_peer_t *)tpeer;
    /* For good, as a restarted peer: no later ensure reconnects. Each connection is
     * killed by its worker (its slices end PEER_LOST, none touched again). */
    atomic_store(&p->restarted, 1);
    pthread_rwlock_wrlock(&p->lk);
    atomic_store(&p->broken, 1);
    ote_status_t st = peer_disconnect_all(p);
    pthread_rwlock_unlock(&p->lk);
    if (st != OTE_OK)
        OTE_WARN("tcp", "peer %s: a connection was not released: %s", p->addr, ote_status_str(st));
}

uint32_t ote__tcp_peer_max_slice(ote__tpeer_t *tpeer) {
    tcp_peer_t *p = (tcp_peer_t *)tpeer;
    return atomic_load(&p->max_data); /* set by the handshake before the peer is visible */
}

ote_status_t ote__tcp_peer_close(ote__tpeer_t *tpeer) {
    tcp_peer_t *p = (tcp_peer_t *)tpeer;
    pthread_rwlock_wrlock(&p->lk);
    ote_status_t st = peer_disconnect_all(p);
    pthread_rwlock_unlock(&p->lk);
    if (st != OTE_OK) return st;
    pthread_rwlock_destroy(&p->lk);
    ote_free(p->conns);
    ote_free(p);
    return OTE_OK;
}

/*
 * engine/shm/shm.c - the same-host transport: its ops table, creation (the abstract UNIX
 * control socket and the accept thread), its part of the advertisement, destruction.
 * The design (reachability, authority, threads): shm_internal.h.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/log.h"
#include "base/thread.h"
#include "engine/control/auth.h"
#include "engine/shm/shm_internal.h"

socklen_t ote__shm_sockaddr(const char *name, void *sun_out) {
    struct sockaddr_un *sun = sun_out;
    memset(sun, 0, sizeof(*sun));
    sun->sun_family = AF_UNIX;
    size_t l = strlen(name);
    if (l > SHM_SOCK_MAX) l = SHM_SOCK_MAX;
    memcpy(sun->sun_path + 1, name, l); /* sun_path[0] = 0: the abstract namespace */
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + l);
}

ssize_t ote__shm_send_fd(int sock, const void *buf, size_t len, int fd, int flags) {
    union {
        char b[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } cb;
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (fd >= 0) {
        memset(&cb, 0, sizeof(cb));
        mh.msg_control = cb.b;
        mh.msg_controllen = sizeof(cb.b);
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof(int));
    }
    return sendmsg(sock, &mh, MSG_NOSIGNAL | flags);
}

static ote_status_t shm_address(ote__transport_t *t, char *buf, size_t len) {
    shm_tp_t *tp = (shm_tp_t *)t;
    const char *a = tp->host.self_addr ? tp->host.self_addr : "";
    if (strlen(a) >= len) return OTE_ERR_TOO_BIG;
    snprintf(buf, len, "%s", a);
    return OTE_OK;
}

static ote_status_t shm_advert(ote__transport_t *t, char *buf, size_t len) {
    shm_tp_t *tp = (shm_tp_t *)t;
    int n = snprintf(buf, len, "shm=%s", tp->sock);
    return n > 0 && (size_t)n < len ? OTE_OK : OTE_ERR_TOO_BIG;
}

/* Reap the connections whose thread has returned. */
static void reap_srcs(shm_tp_t *tp, int all) {
    ote_mutex_lock(&tp->mu);
    shm_src_t **pp = &tp->srcs;
    shm_src_t *dead = NULL;
    while (*pp) {
        shm_src_t *s = *pp;
        if (all || atomic_load(&s->done)) {
            tp->nsrcs--;
            *pp = s->next;
            s->next = dead;
            dead = s;
        } else {
            pp = &s->next;
        }
    }
    ote_mutex_unlock(&tp->mu);
    while (dead) {
        shm_src_t *s = dead;
        dead = s->next;
        shutdown(s->fd, SHUT_RDWR); /* wakes a thread still running (destroy) */
        pthread_join(s->thr, NULL);
        close(s->fd);
        ote_free(s);
    }
}

static void accept_one(shm_tp_t *tp) {
    int fd = accept4(tp->lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) {
        if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
            OTE_WARN("shm", "accept on %s failed: %s; retrying in 100 ms", tp->sock,
                     strerror(errno));
            struct timespec ts = {0, 100000000};
            nanosleep(&ts, NULL);
        }
        return;
    }
    ote_mutex_lock(&tp->mu);
    int full = tp->nsrcs >= tp->cfg.tcp_max_accepted;
    ote_mutex_unlock(&tp->mu);
    if (full) {
        OTE_WARN_LIMITED("shm", "tcp_max_accepted (%u) connections reached: closing a new one",
                         tp->cfg.tcp_max_accepted);
        close(fd);
        return;
    }
    struct ucred cr;
    socklen_t cl = sizeof(cr);
    shm_src_t *s = NULL;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) != 0 ||
        (s = ote_calloc(1, sizeof(*s))) == NULL) {
        OTE_WARN("shm", "cannot take a connection: %s", s ? strerror(errno) : "out of memory");
        close(fd);
        return;
    }
    ote_auth_addr_t from;
    ote_auth_addr_of_uid(cr.uid, &from);
    if (ote_auth_backoff(tp->host.auth_key, &from)) { /* its uid failed too often */
        ote_free(s);
        close(fd);
        return;
    }
    s->tp = tp;
    s->fd = fd;
    s->pid = cr.pid;
    s->uid = cr.uid;
    if (ote_thread_create(&s->thr, NULL, ote__shm_src_main, s) != 0) {
        OTE_WARN("shm", "cannot start the thread of pid %d's connection", (int)cr.pid);
        close(fd);
        ote_free(s);
        return;
    }
    ote_mutex_lock(&tp->mu);
    s->next = tp->srcs;
    tp->srcs = s;
    tp->nsrcs++;
    ote_mutex_unlock(&tp->mu);
}

static void *accept_main(void *arg) {
    shm_tp_t *tp = arg;
    while (!atomic_load(&tp->stop)) {
        struct pollfd p = {.fd = tp->lfd, .events = POLLIN};
        int r = poll(&p, 1, 100);
        if (r > 0) accept_one(tp);
        reap_srcs(tp, 0);
    }
    return NULL;
}

/* Always OTE_OK: the acceptor polls stop every 100 ms; each source thread is woken by the
 * shutdown of its socket (reap_srcs). */
static ote_status_t shm_destroy(ote__transport_t *t) {
    shm_tp_t *tp = (shm_tp_t *)t;
    atomic_store(&tp->stop, 1);
    pthread_join(tp->accept_thr, NULL);
    close(tp->lfd);
    reap_srcs(tp, 1);
    ote_mutex_destroy(&tp->pmu);
    ote_mutex_destroy(&tp->mu);
    ote_free(tp);
    return OTE_OK;
}

static const ote__transport_ops_t g_shm_ops = {
    .name = "shm",
    .address = shm_address,
    .peer_open = ote__shm_peer_open,
    .peer_ensure = ote__shm_peer_ensure,
    .peer_max_slice = ote__shm_peer_max_slice,
    .submit = ote__shm_submit,
    .cancel = ote__shm_cancel,
    .peer_lost = ote__shm_peer_lost,
    .peer_close = ote__shm_peer_close,
    .destroy = shm_destroy,
    .advert = shm_advert,
    .peer_open_info = ote__shm_peer_open_info,
    .ipc_ready = ote__shm_ipc_ready,
    .ipc_revoke = ote__shm_ipc_revoke,
    .shared_free = ote__shm_shared_free,
};

ote_status_t ote__shm_create(const ote__cfg_t *cfg, const ote__host_t *host,
                             ote__transport_t **tp_out) {
    static _Atomic unsigned counter;
    shm_tp_t *tp = ote_calloc(1, sizeof(*tp));
    if (tp == NULL) return OTE_ERR_NOMEM;
    tp->base.ops = &g_shm_ops;
    tp->cfg = *cfg;
    tp->host = *host;
    ote_status_t st = ote_mutex_init(&tp->mu);
    if (st != OTE_OK) goto err_free;
    st = ote_mutex_init(&tp->pmu);
    if (st != OTE_OK) goto err_mu0;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    snprintf(tp->sock, sizeof(tp->sock), "orbitte-shm-%d-%u-%lx", (int)getpid(),
             atomic_fetch_add(&counter, 1), (unsigned long)now.tv_nsec);
    tp->lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (tp->lfd < 0) {
        st = ote_status_from_errno(errno);
        OTE_ERROR("shm", "socket(AF_UNIX, SOCK_SEQPACKET) failed: %s", strerror(errno));
        goto err_mu;
    }
    struct sockaddr_un sun;
    socklen_t sl = ote__shm_sockaddr(tp->sock, &sun);
    if (bind(tp->lfd, (struct sockaddr *)&sun, sl) != 0 || listen(tp->lfd, 256) != 0) {
        st = ote_status_from_errno(errno);
        OTE_ERROR("shm", "cannot listen on the abstract socket @%s: %s", tp->sock, strerror(errno));
        goto err_fd;
    }
    if (ote_thread_create(&tp->accept_thr, NULL, accept_main, tp) != 0) {
        st = OTE_ERR_NOMEM;
        OTE_ERROR("shm", "cannot start the accept thread");
        goto err_fd;
    }
    OTE_INFO("shm", "listening on the abstract socket @%s", tp->sock);
    *tp_out = &tp->base;
    return OTE_OK;

err_fd:
    close(tp->lfd);
err_mu:
    ote_mutex_destroy(&tp->pmu);
err_mu0:
    ote_mutex_destroy(&tp->mu);
err_free:
    ote_free(tp);
    return st;
}

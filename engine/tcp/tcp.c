/*
 * engine/tcp/tcp.c - the TCP transport: its ops table, creation (worker threads) and
 * destruction. It has no listening socket: the engine's listener (engine/listen.c)
 * hands it the connections whose HELLO names it (ote__tcp_adopt, tcp_conn.c). The
 * design (roles, threads and ownership, lock order, data path, failure handling) is
 * described in tcp_internal.h; each job lives in its own file next to this one.
 */
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/log.h"
#include "base/thread.h"
#include "engine/tcp/tcp_internal.h"

/* Large socket buffers help only when the kernel lets us have them: setting a small
 * SO_RCVBUF would switch off receive autotuning and make things slower. */
static int pick_sockbuf(void) {
    long rmax = 0, wmax = 0;
    FILE *f = fopen("/proc/sys/net/core/rmem_max", "r");
    if (f) {
        if (fscanf(f, "%ld", &rmax) != 1) rmax = 0;
        fclose(f);
    }
    f = fopen("/proc/sys/net/core/wmem_max", "r");
    if (f) {
        if (fscanf(f, "%ld", &wmax) != 1) wmax = 0;
        fclose(f);
    }
    return (rmax >= TCP_SOCKBUF && wmax >= TCP_SOCKBUF) ? TCP_SOCKBUF : 0;
}

static ote_status_t tcp_address(ote__transport_t *t, char *buf, size_t len) {
    tcp_t *tp = to_tcp(t);
    size_t n = strlen(tp->addr);
    if (n >= len) return OTE_ERR_TOO_BIG;
    memcpy(buf, tp->addr, n + 1);
    return OTE_OK;
}

/* Always OTE_OK: each worker wakes on its eventfd and ends (its epoll wait is bounded). */
static ote_status_t tcp_destroy(ote__transport_t *t) {
    tcp_t *tp = to_tcp(t);
    atomic_store(&tp->stop, 1);
    for (uint32_t i = 0; i < tp->nworkers; i++)
        if (tp->workers[i].started) ote__tcp_worker_wake(&tp->workers[i]);
    for (uint32_t i = 0; i < tp->nworkers; i++)
        if (tp->workers[i].started) pthread_join(tp->workers[i].th, NULL);
    for (uint32_t i = 0; i < tp->nworkers; i++) {
        tcp_worker_t *w = &tp->workers[i];
        /* Connections accepted but never attached: this thread owns them now. */
        for (tcp_cmd_t *cmd = w->chead; cmd; cmd = cmd->next)
            if (cmd->kind == CMD_ATTACH && cmd->c->role == ROLE_SOURCE) ote__tcp_conn_free(cmd->c);
        w->chead = w->ctail = NULL;
        if (w->epfd >= 0) close(w->epfd);
        if (tp->leak_workers) continue; /* file reads may still wake them (tcp_fread.c) */
        if (w->evfd >= 0) close(w->evfd);
        ote_mutex_destroy(&w->cmu);
        ote_mutex_destroy(&w->fmu);
    }
    ote__tcp_src_reqs_drop_all(tp);      /* workers joined: every connection is gone */
    if (tp->leak_workers) return OTE_OK; /* logged by the worker: its memory must stay */
    ote_mutex_destroy(&tp->pmu);
    ote_cond_destroy(&tp->cv);
    ote_mutex_destroy(&tp->mu);
    ote_free(tp->workers);
    ote_free(tp);
    return OTE_OK;
}

static const ote__transport_ops_t g_tcp_ops = {
    .name = "tcp",
    .address = tcp_address,
    .peer_open = ote__tcp_peer_open,
    .peer_ensure = ote__tcp_peer_ensure,
    .peer_max_slice = ote__tcp_peer_max_slice,
    .submit = ote__tcp_submit,
    .cancel = ote__tcp_cancel,
    .peer_lost = ote__tcp_peer_lost,
    .peer_close = ote__tcp_peer_close,
    .destroy = tcp_destroy,
    .adopt = ote__tcp_adopt,
};

ote_status_t ote__tcp_create(const ote__cfg_t *cfg, const ote__host_t *host,
                             ote__transport_t **tp_out) {
    if (cfg == NULL || host == NULL || tp_out == NULL) return OTE_ERR_INVALID;
    ote_status_t st;
    tcp_t *tp = ote_calloc(1, sizeof(*tp));
    if (tp == NULL) return OTE_ERR_NOMEM;
    tp->base.ops = &g_tcp_ops;
    tp->cfg = *cfg;
    tp->host = *host;
    tp->sockbuf = pick_sockbuf();
    atomic_store(&tp->session, ((uint64_t)getpid() << 32) | (ote_now_ns() & 0xffffffffu));
    st = ote_mutex_init(&tp->mu);
    if (st != OTE_OK) goto err_free;
    st = ote_cond_init(&tp->cv);
    if (st != OTE_OK) goto err_mutex;
    st = ote_mutex_init(&tp->pmu);
    if (st != OTE_OK) goto err_cond;

    if (host->self_addr == NULL || strlen(host->self_addr) >= sizeof(tp->addr)) {
        st = OTE_ERR_INVALID;
        goto err_pmu;
    }
    snprintf(tp->addr, sizeof(tp->addr), "%s", host->self_addr);

    tp->nworkers = cfg->tcp_workers;
    tp->workers = ote_calloc(tp->nworkers, sizeof(*tp->workers));
    if (tp->workers == NULL) {
        st = OTE_ERR_NOMEM;
        goto err_pmu;
    }
    for (uint32_t i = 0; i < tp->nworkers; i++) {
        tcp_worker_t *w = &tp->workers[i];
        w->tp = tp;
        w->idx = i;
        w->epfd = epoll_create1(EPOLL_CLOEXEC);
        w->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        ote_status_t mst = ote_mutex_init(&w->cmu);
        ote_status_t fst = mst == OTE_OK ? ote_mutex_init(&w->fmu) : mst;
        if (w->epfd < 0 || w->evfd < 0 || fst != OTE_OK) {
            st = fst != OTE_OK ? fst : ote_status_from_errno(errno);
            OTE_ERROR("tcp", "cannot create worker %u: %s", i, ote_status_str(st));
            if (mst == OTE_OK) ote_mutex_destroy(&w->cmu);
            if (fst == OTE_OK) ote_mutex_destroy(&w->fmu);
            if (w->epfd >= 0) close(w->epfd);
            if (w->evfd >= 0) close(w->evfd);
            tp->nworkers = i;
            goto err_workers;
        }
        struct epoll_event e = {.events = EPOLLIN, .data.ptr = &w->evfd};
        if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->evfd, &e) != 0) {
            st = ote_status_from_errno(errno);
            tp->nworkers = i + 1;
            goto err_workers;
        }
    }
    for (uint32_t i = 0; i < tp->nworkers; i++) {
        tcp_worker_t *w = &tp->workers[i];
        int rc = ote_thread_create(&w->th, NULL, ote__tcp_worker_main, w);
        if (rc != 0) {
            st = ote_status_from_errno(rc);
            OTE_ERROR("tcp", "cannot start worker thread %u: %s", i, strerror(rc));
            goto err_workers;
        }
        w->started = 1;
    }
    OTE_INFO("tcp", "serving %s, %u worker(s), %u connection(s) per peer", tp->addr, tp->nworkers,
             cfg->tcp_connections);
    *tp_out = &tp->base;
    return OTE_OK;

err_workers:
    (void)tcp_destroy(&tp->base); /* stops started workers, closes everything */
    return st;
err_pmu:
    ote_mutex_destroy(&tp->pmu);
err_cond:
    ote_cond_destroy(&tp->cv);
err_mutex:
    ote_mutex_destroy(&tp->mu);
err_free:
    ote_free(tp);
    return st;
}

/*
 * engine/shm/shm_connect.c - the requester's connection to a same-host source: connect to
 * the peer's abstract control socket, let the source attach to this process (Yama), the
 * HELLO with the cross-memory-attach probe and the shared ring (its fd attached), the
 * key's challenge-response when the source asks, and the answer adopted (mode, ring,
 * marks, CUDA IPC, shared allocations, the slice limit). The rest of the requester side
 * is shm_requester.c. Design: shm_internal.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/log.h"
#include "engine/control/auth.h"
#include "engine/control/ctl.h"
#include "engine/shm/shm_internal.h"
#include "engine/shm/shm_proto.h"

/* The cookie the source must read from this process (cross-memory-attach probe). */
static _Atomic uint64_t g_probe_cookie;

static int read_ptrace_scope(void) {
    FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "re");
    int v = 0;
    if (f == NULL) return 0;
    if (fscanf(f, "%d", &v) != 1) v = 0;
    fclose(f);
    return v;
}

/* One message of the source into buf by dl: its length (MSG_TRUNC: a longer message
 * shows its real length), or a status. */
static ote_status_t recv_by(int fd, void *buf, size_t cap, ote_deadline_t dl, size_t *n_out) {
    for (;;) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int ms = ote_deadline_remaining_ms(dl, 1000);
        if (ms == 0 && ote_deadline_expired(dl)) return OTE_ERR_TIMEOUT;
        if (poll(&pf, 1, ms) > 0) break;
    }
    ssize_t n = recv(fd, buf, cap, MSG_DONTWAIT | MSG_TRUNC);
    if (n <= 0) return OTE_ERR_PEER_LOST;
    *n_out = (size_t)n;
    return OTE_OK;
}

/* The source's HELLO_ACK into *a, after the key's challenge-response when the source asks
 * for it (engine/control/auth.h; the exchange is bound to the HELLO's bytes). */
static ote_status_t hello_answer(shm_peer_t *p, int fd, const shm_hello_t *h, size_t hlen,
                                 shm_hello_ack_t *a, ote_deadline_t dl) {
    const ote_auth_key_t *key = p->tp->host.auth_key;
    union {
        shm_hdr_t h;
        shm_hello_ack_t ack;
        shm_auth_t auth;
    } r;
    size_t n = 0;
    shm_auth_t au_msg;
    ote_status_t st = recv_by(fd, &r, sizeof(r), dl, &n);
    if (st == OTE_OK && ote__shm_auth_decode(&r, n, OTE_CTL_AUTH_CHALLENGE, &au_msg) == 0) {
        if (key == NULL) {
            OTE_WARN("shm",
                     "peer %s requires authentication and this engine has no key: set "
                     "auth_key_file (OTE_AUTH_KEY_FILE) to the cluster's key file",
                     p->addr);
            return OTE_ERR_AUTH;
        }
        ote_auth_t au;
        ote_auth_bind(&au, "shm", h, hlen); /* the bytes sent */
        ote_auth_prove(&au, key, au_msg.nonce);
        memcpy(au_msg.nonce, au.nc, sizeof(au.nc));
        memcpy(au_msg.mac, au.mac, sizeof(au.mac));
        au_msg.step = OTE_CTL_AUTH_PROOF;
        if (send(fd, &au_msg, sizeof(au_msg), MSG_NOSIGNAL) != (ssize_t)sizeof(au_msg))
            return OTE_ERR_PEER_LOST;
        st = recv_by(fd, &r, sizeof(r), dl, &n);
        if (st == OTE_OK && ote__shm_auth_decode(&r, n, OTE_CTL_AUTH_OK, &au_msg) == 0) {
            if (ote_auth_check_ok(&au, key, au_msg.mac) != OTE_OK) {
                OTE_WARN("shm", "peer %s failed to prove the cluster key: closing", p->addr);
                return OTE_ERR_AUTH;
            }
            st = recv_by(fd, &r, sizeof(r), dl, &n);
        }
    } else if (st == OTE_OK && key != NULL) {
        OTE_WARN("shm",
                 "peer %s does not authenticate (it has no auth_key_file) while this engine has "
                 "a key: refusing it",
                 p->addr);
        return OTE_ERR_AUTH;
    }
    if (st != OTE_OK) return st;
    return ote__shm_ack_decode(&r, n, a) == 0 ? OTE_OK : OTE_ERR_PROTOCOL;
}

/* One connect's state: the socket and its peer's credentials, the HELLO, the ring that
 * goes with it and the source's answer. */
typedef struct {
    int fd;
    struct ucred cr; /* the source's pid */
    shm_hello_t h;
    size_t hlen;    /* bytes of h sent: SHM_HELLO_BASE_LEN without a name */
    int want_ipc;   /* CUDA IPC asked for */
    int force_ring; /* shm_mode "ring" */
    uint8_t *ring;  /* mapped here; NULL: none */
    int rfd;        /* the ring's fd until sent; -1: none */
    shm_hello_ack_t a;
} shm_connect_t;

/* The control socket connected to the peer's abstract name, and its peer's credentials:
 * c->fd and c->cr on success (nothing left open on failure). */
static ote_status_t connect_socket(shm_peer_t *p, shm_connect_t *c) {
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0) return ote_status_from_errno(errno);
    struct sockaddr_un sun;
    socklen_t sl = ote__shm_sockaddr(p->sock, &sun);
    if (connect(fd, (struct sockaddr *)&sun, sl) != 0) {
        int e = errno;
        close(fd);
        OTE_INFO("shm", "peer %s: control socket @%s unreachable: %s", p->addr, p->sock,
                 strerror(e));
        return OTE_ERR_UNSUPPORTED;
    }
    socklen_t cl = sizeof(c->cr);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c->cr, &cl) != 0) {
        close(fd);
        return OTE_ERR_UNSUPPORTED;
    }
    c->fd = fd;
    return OTE_OK;
}

/* Let the source attach to this process (Yama), and pick this process's probe cookie
 * once (g_probe_cookie). */
static void connect_allow_probe(pid_t src_pid) {
    /* Yama ptrace_scope 1: only a named process may attach; name the source. */
    if (read_ptrace_scope() == 1) (void)prctl(PR_SET_PTRACER, (unsigned long)src_pid, 0, 0, 0);
    uint64_t expect = 0;
    if (atomic_load(&g_probe_cookie) == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        atomic_compare_exchange_strong(&g_probe_cookie, &expect,
                                       ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)getpid() ^ 1u);
    }
}

/* The HELLO (c->h) without its ring: capabilities, the probe and this engine's address;
 * sets c->want_ipc and c->force_ring (needs c->cr). */
static void connect_hello(shm_peer_t *p, shm_connect_t *c) {
    shm_tp_t *tp = p->tp;
    shm_hello_t *h = &c->h;
    memset(h, 0, sizeof(*h));
    h->h = (shm_hdr_t){SHM_MAGIC, SHM_VERSION, SHM_HELLO, 0, 0};
    /* CUDA IPC: asked for when gpu_paths allows it (whether the driver is loaded is
     * looked at per piece). */
    c->want_ipc = (tp->cfg.gpu_paths & OTE__GPU_PATH_IPC) && tp->host.gpu.ipc_copy_start != NULL;
    /* Not with an engine of this very process: the driver opens no IPC handle of its own
     * process (cuIpcOpenMemHandle: CUDA_ERROR_INVALID_CONTEXT), so device memory goes by
     * the other paths gpu_paths allows (staging), said once per connection. */
    if (c->want_ipc && c->cr.pid == getpid()) {
        c->want_ipc = 0;
        OTE_INFO("shm",
                 "peer %s is this process: no CUDA IPC with it (a process cannot open its own "
                 "IPC handles); device memory takes the other gpu_paths",
                 p->addr);
    }
    if (c->want_ipc) h->h.pad = SHM_CAP_IPC;
    c->force_ring = strcmp(tp->cfg.shm_mode, "ring") == 0;
    h->probe_addr = c->force_ring ? 0 : (uint64_t)(uintptr_t)&g_probe_cookie;
    h->probe_val = atomic_load(&g_probe_cookie);
    snprintf(h->addr, sizeof(h->addr), "%s", tp->host.self_addr ? tp->host.self_addr : "");
    const char *name = tp->host.self_name ? tp->host.self_name : "";
    snprintf(h->name, sizeof(h->name), "%s", name);
    c->hlen = name[0] != '\0' ? sizeof(*h) : SHM_HELLO_BASE_LEN; /* shm_hello_t.name */
}

/* The ring that goes along in every HELLO: the source falls back to it when it cannot
 * attach to this process (its pages are allocated only when used). Sets c->ring, c->rfd
 * and the HELLO's ring fields; OTE_ERR_UNSUPPORTED when ring mode is forced and there is
 * no ring (then c->ring stays NULL). */
static ote_status_t connect_ring(shm_peer_t *p, shm_connect_t *c) {
    c->rfd = ote__shm_ring_create(&c->ring);
    if (c->rfd < 0) {
        OTE_WARN("shm", "peer %s: cannot create the shared ring: %s", p->addr, strerror(errno));
        if (c->force_ring) return OTE_ERR_UNSUPPORTED;
    }
    c->h.ring_len = c->rfd >= 0 ? SHM_RING_BYTES : 0;
    if (c->rfd >= 0) c->h.h.pad |= SHM_CAP_MARKS; /* its control page follows the ring */
    if (!c->force_ring) c->h.h.pad |= SHM_CAP_SHARED;
    return OTE_OK;
}

/* The source's HELLO_ACK (c->a) accepts this engine in a mode it can serve: its refusal
 * of the key is OTE_ERR_AUTH (WARN), of shm OTE_ERR_UNSUPPORTED (INFO), a mode this side
 * cannot serve OTE_ERR_PROTOCOL. */
static ote_status_t connect_check_ack(shm_peer_t *p, shm_connect_t *c) {
    shm_hello_ack_t *a = &c->a;
    if (a->status == OTE_ERR_AUTH) {
        a->text[sizeof(a->text) - 1] = '\0';
        OTE_WARN("shm", "peer %s (pid %d) refused this engine's key: %s", p->addr, (int)c->cr.pid,
                 a->text);
        return OTE_ERR_AUTH;
    }
    if (a->status != OTE_OK) {
        a->text[sizeof(a->text) - 1] = '\0';
        OTE_INFO("shm", "peer %s (pid %d) refuses shm: %s", p->addr, (int)c->cr.pid, a->text);
        return OTE_ERR_UNSUPPORTED;
    }
    if (a->mode != SHM_MODE_CMA && (a->mode != SHM_MODE_RING || c->ring == NULL))
        return OTE_ERR_PROTOCOL;
    return OTE_OK;
}

/* Send the HELLO with the ring's fd (closed here once sent) and take the answer by dl
 * into c->a; a failure other than OTE_ERR_UNSUPPORTED is logged WARN. */
static ote_status_t connect_handshake(shm_peer_t *p, shm_connect_t *c, ote_deadline_t dl) {
    ote_status_t st = OTE_OK;
    if (ote__shm_send_fd(c->fd, &c->h, c->hlen, c->rfd, 0) != (ssize_t)c->hlen)
        st = OTE_ERR_PEER_LOST;
    if (c->rfd >= 0) close(c->rfd); /* the mapping (and the source's copy of the fd) keep it */
    if (st == OTE_OK) st = hello_answer(p, c->fd, &c->h, c->hlen, &c->a, dl);
    if (st == OTE_OK) st = connect_check_ack(p, c);
    if (st != OTE_OK && st != OTE_ERR_UNSUPPORTED)
        OTE_WARN("shm", "handshake with %s failed: %s", p->addr, ote_status_str(st));
    return st;
}

/* The accepted connection becomes p's: fd, source pid, mode, IPC, ring and marks (a CMA
 * connection without the source's ring drops it), slice size; *shared_ok set. */
static void connect_adopt(shm_peer_t *p, shm_connect_t *c, int *shared_ok) {
    const shm_hello_ack_t *a = &c->a;
    uint8_t *ring = c->ring;
    if (a->mode == SHM_MODE_CMA && ring != NULL && !(a->flags & SHM_ACK_RING)) {
        munmap(ring, SHM_RING_MAP); /* no ring for small pieces either */
        ring = NULL;
    }
    p->fd = c->fd;
    p->src_pid = c->cr.pid;
    p->mode = (int)a->mode;
    p->ipc = c->want_ipc && (a->flags & SHM_ACK_IPC) != 0;
    p->ring = ring;
    p->marks = ring != NULL && (a->flags & SHM_ACK_MARKS)
                   ? (_Atomic uint64_t *)(void *)(ring + SHM_RING_BYTES)
                   : NULL;
    p->ring_head = p->ring_tail = 0;
    *shared_ok = a->mode == SHM_MODE_CMA && (a->flags & SHM_ACK_SHARED) != 0;
    uint32_t cap = a->mode == SHM_MODE_RING ? 2 * SHM_RING_SLICE : SHM_MAX_SLICE;
    p->max_slice = a->max_slice < cap ? a->max_slice : cap;
    if (p->max_slice < OTE_CTL_MIN_DATA) p->max_slice = OTE_CTL_MIN_DATA;
}

/* Connect and handshake (fd and src_pid set on success; *shared_ok: the source maps
 * shared allocations). */
ote_status_t ote__shm_peer_connect(shm_peer_t *p, int *shared_ok) {
    ote_deadline_t dl = ote_deadline_after(p->tp->cfg.connect_timeout_ms * OTE_NSEC_PER_MSEC);
    shm_connect_t c = {.fd = -1, .rfd = -1};
    ote_status_t st = connect_socket(p, &c);
    if (st != OTE_OK) return st;
    connect_allow_probe(c.cr.pid);
    connect_hello(p, &c);
    if ((st = connect_ring(p, &c)) != OTE_OK) goto err_close_fd;
    if ((st = connect_handshake(p, &c, dl)) != OTE_OK) goto err_unmap_ring;
    connect_adopt(p, &c, shared_ok);
    return OTE_OK;

err_unmap_ring:
    if (c.ring) munmap(c.ring, SHM_RING_MAP);
err_close_fd:
    close(c.fd);
    return st;
}

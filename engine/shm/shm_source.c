/*
 * engine/shm/shm_source.c - the source side of the same-host transport: one thread per
 * accepted requester answers its HELLO (credentials from SO_PEERCRED, the
 * cross-memory-attach probe) and then serves its REQS: every request is checked against
 * the engine's registrations and permissions (host->pin) before any byte moves, then
 * copied by this thread with process_vm_readv / process_vm_writev. Design:
 * shm_internal.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/log.h"
#include "base/thread.h"
#include "engine/control/auth.h"
#include "engine/control/ctl.h"
#include "engine/shm/shm_internal.h"
#include "engine/shm/shm_proto.h"
#include "ote/ote.h"

/* Wait until fd is readable; 1 ready, 0 stop requested, -1 deadline passed. */
static int wait_in(shm_src_t *s, ote_deadline_t dl) {
    /* The next message often comes soon after our answer: look for it a while, yielding
     * between looks; a long yield (another thread wanted the core) ends the spin, since
     * poll's wakeup gets the core back sooner than waiting out others' time slices. */
    ote_deadline_t spin = ote_deadline_after(SHM_SRC_SPIN_NS);
    for (;;) {
        struct pollfd p = {.fd = s->fd, .events = POLLIN};
        if (poll(&p, 1, 0) > 0) return 1;
        uint64_t t = ote_now_ns();
        if (t >= spin || (sched_yield(), ote_now_ns() - t > SHM_SRC_SPIN_BUSY_NS)) break;
    }
    for (;;) {
        if (atomic_load(&s->tp->stop)) return 0;
        if (dl != 0 && ote_deadline_expired(dl)) return -1;
        struct pollfd p = {.fd = s->fd, .events = POLLIN};
        int r = poll(&p, 1, 100);
        if (r > 0) return 1;
    }
}

/* fd >= 0: passed with the message (SCM_RIGHTS); it stays the caller's. */
static ote_status_t send_msg_fd(shm_src_t *s, const void *buf, size_t len, int fd) {
    ote_deadline_t dl = ote_deadline_after(s->tp->cfg.transfer_timeout_ms * OTE_NSEC_PER_MSEC);
    for (;;) {
        ssize_t r = ote__shm_send_fd(s->fd, buf, len, fd, MSG_DONTWAIT);
        if (r == (ssize_t)len) return OTE_OK;
        if (r >= 0 || (errno != EAGAIN && errno != EINTR)) return OTE_ERR_PEER_LOST;
        struct pollfd p = {.fd = s->fd, .events = POLLOUT};
        if (ote_deadline_expired(dl) || atomic_load(&s->tp->stop)) return OTE_ERR_TIMEOUT;
        (void)poll(&p, 1, 100);
    }
}

static ote_status_t send_msg(shm_src_t *s, const void *buf, size_t len) {
    return send_msg_fd(s, buf, len, -1);
}

/* The VMM offers' fds of m not sent (or sent: the requester has its own) are closed. */
static void offer_fds_close(shm_msg_t *m) {
    for (uint32_t i = 0; i < m->in.h.n && i < SHM_BATCH_MAX; i++)
        if (m->offer_fd[i] >= 0) {
            close(m->offer_fd[i]);
            m->offer_fd[i] = -1;
        }
}

static ssize_t recv_hello(int sock, shm_hello_t *h, int *fd_out);
static int src_hello_answer(shm_src_t *s, shm_hello_t *hp, int rfd);

/* Engine with a key: the challenge-response on the HELLO h (its bytes as received),
 * before anything of it is acted on. 0 when the requester proved the key; -1 when not
 * (counted and logged): the caller closes without reading more. */
static int src_auth(shm_src_t *s, const shm_hello_t *h, size_t hlen, ote_deadline_t dl) {
    ote_auth_peer_t peer;
    ote_auth_peer_of_uid(s->tp->host.auth_key, s->uid, s->pid, &peer);
    ote_auth_t a;
    ote_auth_bind(&a, "shm", h, hlen);
    ote_auth_challenge(&a);
    shm_auth_t m;
    memset(&m, 0, sizeof(m));
    m.h = (shm_hdr_t){SHM_MAGIC, SHM_VERSION, SHM_AUTH, 0, 0};
    m.step = OTE_CTL_AUTH_CHALLENGE;
    memcpy(m.nonce, a.ns, sizeof(m.nonce));
    if (send_msg(s, &m, sizeof(m)) != OTE_OK || wait_in(s, dl) != 1) {
        ote_auth_failed("shm", &peer, "no proof before the deadline");
        return -1;
    }
    /* MSG_TRUNC: the real length of a longer message, which is refused. */
    shm_auth_t in;
    ssize_t n = recv(s->fd, &in, sizeof(in), MSG_DONTWAIT | MSG_TRUNC);
    if (n < 0 || ote__shm_auth_decode(&in, (size_t)n, OTE_CTL_AUTH_PROOF, &m) != 0) {
        ote_auth_failed(
            "shm", &peer,
            n == 0 ? "closed without a proof (no key?)" : "a message other than its proof");
        return -1;
    }
    if (ote_auth_check_proof(&a, s->tp->host.auth_key, m.nonce, m.mac) != OTE_OK) {
        shm_hello_ack_t r;
        memset(&r, 0, sizeof(r));
        r.h = (shm_hdr_t){SHM_MAGIC, SHM_VERSION, SHM_HELLO_ACK, 0, 0};
        r.status = OTE_ERR_AUTH;
        snprintf(r.text, sizeof(r.text), "authentication failed: wrong key");
        ote_auth_failed("shm", &peer, "wrong key"); /* counted before the peer hears */
        (void)send_msg(s, &r, sizeof(r));
        return -1;
    }
    ote_auth_succeeded(&peer); /* proved the key: its uid leaves the back-off table */
    memset(m.nonce, 0, sizeof(m.nonce));
    m.step = OTE_CTL_AUTH_OK;
    memcpy(m.mac, a.mac, sizeof(m.mac));
    return send_msg(s, &m, sizeof(m)) == OTE_OK ? 0 : -1;
}

/* The handshake: 0 when the requester is served, -1 when refused or gone. */
static int src_hello(shm_src_t *s) {
    shm_tp_t *tp = s->tp;
    shm_hello_t raw, h;
    uint64_t limit_ms = ote__cfg_handshake_ms(&tp->cfg);
    ote_deadline_t dl = ote_deadline_after(limit_ms * OTE_NSEC_PER_MSEC);
    int w = wait_in(s, dl);
    if (w != 1) {
        if (w < 0)
            OTE_WARN_LIMITED("shm", "connection from pid %d sent no HELLO within %llu ms: closing",
                             (int)s->pid, (unsigned long long)limit_ms);
        return -1;
    }
    int rfd = -1;
    ssize_t n = recv_hello(s->fd, &raw, &rfd);
    if (n < 0 || ote__shm_hello_decode(&raw, (size_t)n, &h) != 0) {
        OTE_WARN_LIMITED("shm", "connection from pid %d did not begin with a HELLO: closing",
                         (int)s->pid);
        if (rfd >= 0) close(rfd);
        return -1;
    }
    /* The exchange is bound to the HELLO's bytes as they came. */
    if (tp->host.auth_key != NULL && src_auth(s, &raw, (size_t)n, dl) != 0) {
        if (rfd >= 0) close(rfd);
        return -1;
    }
    int rc = src_hello_answer(s, &h, rfd);
    if (rfd >= 0) close(rfd); /* mapped (ring mode) or not needed */
    return rc;
}

/* recvmsg of the HELLO and of the ring's fd that may come with it. */
static ssize_t recv_hello(int sock, shm_hello_t *h, int *fd_out) {
    struct iovec iov = {h, sizeof(*h)};
    union {
        struct cmsghdr c;
        char b[CMSG_SPACE(sizeof(int))];
    } cb;
    struct msghdr m = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb.b, .msg_controllen = sizeof(cb.b)};
    ssize_t n = recvmsg(sock, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    /* Every fd the kernel installed is ours to close: keep one, only when it came alone
     * (the control buffer holds two ints, so a second fd arrives too and was leaked). */
    int nfds = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); n >= 0 && c; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        for (size_t k = 0; k < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); k++, nfds++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + k * sizeof(int), sizeof(int));
            if (*fd_out < 0) *fd_out = fd;
            else close(fd);
        }
    }
    if (n >= 0 && ((m.msg_flags & MSG_CTRUNC) || nfds > 1)) n = -1;
    return n;
}

static int tp_ipc_allowed(const shm_tp_t *tp) {
    return (tp->cfg.gpu_paths & OTE__GPU_PATH_IPC) && tp->host.gpu.ipc_export != NULL;
}

/* Choose the mode and answer the HELLO: cross-memory attach when the requester asks for
 * it and the probe proves it, else the ring it passed. */
static int src_hello_answer(shm_src_t *s, shm_hello_t *hp, int rfd) {
    shm_hello_t h = *hp;
    h.addr[sizeof(h.addr) - 1] = '\0';
    snprintf(s->from, sizeof(s->from), "%s", h.addr);
    snprintf(s->from_name, sizeof(s->from_name), "%s", h.name); /* checked by the decoder */
    shm_hello_ack_t a;
    memset(&a, 0, sizeof(a));
    a.h.magic = SHM_MAGIC;
    a.h.version = SHM_VERSION;
    a.h.kind = SHM_HELLO_ACK;
    a.max_slice = SHM_MAX_SLICE;
    char why[96] = "ring mode requested";
    a.mode = SHM_MODE_CMA;
    if (h.h.version != SHM_VERSION) {
        a.status = OTE_ERR_VERSION;
        snprintf(a.text, sizeof(a.text), "shm protocol version %u, the source speaks %u",
                 h.h.version, SHM_VERSION);
    } else if (h.probe_addr != 0 && s->uid != getuid()) {
        snprintf(why, sizeof(why), "requester uid %u is not the source's uid %u", (unsigned)s->uid,
                 (unsigned)getuid());
        a.mode = SHM_MODE_RING;
    } else if (h.probe_addr != 0) {
        /* The probe: read the requester's cookie where it says it is. */
        uint64_t v = 0;
        struct iovec l = {&v, sizeof(v)}, r = {(void *)(uintptr_t)h.probe_addr, sizeof(v)};
        ssize_t got = process_vm_readv(s->pid, &l, 1, &r, 1, 0);
        if (got != (ssize_t)sizeof(v) || v != h.probe_val) {
            snprintf(why, sizeof(why), "cross-memory attach to pid %d refused: %s", (int)s->pid,
                     got < 0 ? strerror(errno) : "wrong cookie");
            a.mode = SHM_MODE_RING;
        }
    } else {
        a.mode = SHM_MODE_RING;
    }
    if (a.status == OTE_OK && a.mode == SHM_MODE_RING) {
        if (ote__shm_ring_map(s, &h, rfd, a.text, sizeof(a.text)) != 0)
            a.status = OTE_ERR_UNSUPPORTED;
        else OTE_INFO("shm", "requester pid %d (%s): shared ring (%s)", (int)s->pid, s->from, why);
    } else if (a.status == OTE_OK && rfd >= 0) {
        /* Cross-memory attach, and the ring for small pieces when it is usable. */
        char ignored[sizeof(a.text)];
        if (ote__shm_ring_map(s, &h, rfd, ignored, sizeof(ignored)) == 0) a.flags |= SHM_ACK_RING;
    }
    /* CUDA IPC when the requester asks for it and this engine allows it. */
    /* (A requester of this very process never asks: its driver cannot open its own
     * process's handles, shm_requester.c.) */
    if (a.status == OTE_OK && (h.h.pad & SHM_CAP_IPC) && (tp_ipc_allowed(s->tp))) {
        a.flags |= SHM_ACK_IPC;
        s->ipc = 1;
    }
    if (a.status == OTE_OK && s->marks != NULL) a.flags |= SHM_ACK_MARKS;
    /* Shared allocations: cross-memory attach only (a map the source refuses falls back
     * to it). */
    if (a.status == OTE_OK && a.mode == SHM_MODE_CMA && (h.h.pad & SHM_CAP_SHARED)) {
        a.flags |= SHM_ACK_SHARED;
        s->shared = 1;
    }
    s->mode = (int)a.mode;
    if (send_msg(s, &a, sizeof(a)) != OTE_OK) return -1;
    if (a.status != OTE_OK) {
        OTE_INFO("shm", "refused requester pid %d (%s): %s", (int)s->pid, s->from, a.text);
        return -1;
    }
    OTE_DEBUG("shm", "serving requester pid %d uid %u (%s)", (int)s->pid, (unsigned)s->uid,
              s->from);
    return 0;
}

/* Record st as entry i's status unless it already has one that is not OTE_OK. */
void ote__shm_set_st(shm_msg_t *m, uint32_t i, ote_status_t st) {
    int32_t ok = OTE_OK;
    if (st != OTE_OK) atomic_compare_exchange_strong(&m->st[i], &ok, (int32_t)st);
}

/* Copy len bytes of piece q between this process's `mine` and the requester's `theirs`
 * (CMA) or the ring at offset theirs (ring; bounded by the ring when the message was read;
 * a WRITE's bytes once the requester's staging mark says they are there). */
ote_status_t ote__shm_copy_bytes(shm_src_t *s, const shm_req_t *q, uint8_t *mine, uint64_t theirs,
                                 uint8_t *mapped, size_t len) {
    uint16_t op = q->op;
    if (mapped != NULL) { /* a shared allocation of the requester's, mapped here */
        if (op == OTE__SLICE_WRITE) memcpy(mine, mapped, len);
        else memcpy(mapped, mine, len);
        return OTE_OK;
    }
    if (ote__shm_in_ring(s, q)) {
        uint8_t *piece = s->ring + theirs;
        if (op == OTE__SLICE_WRITE) {
            ote_status_t st = ote__shm_ring_ready(s, q->id);
            if (st != OTE_OK) return st;
            memcpy(mine, piece, len);
        } else {
            memcpy(piece, mine, len);
        }
        return OTE_OK;
    }
    while (len > 0) {
        struct iovec l = {mine, len}, r = {(void *)(uintptr_t)theirs, len};
        ssize_t got = op == OTE__SLICE_WRITE ? process_vm_readv(s->pid, &l, 1, &r, 1, 0)
                                             : process_vm_writev(s->pid, &l, 1, &r, 1, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0 && errno == ESRCH) return OTE_ERR_PEER_LOST;
        if (got <= 0) return OTE_ERR_INVALID; /* the requester's own buffer is not mapped */
        mine += got;
        theirs += (uint64_t)got;
        len -= (size_t)got;
    }
    return OTE_OK;
}

static ote_status_t src_notify(shm_src_t *s, const shm_req_t *q) {
    uint8_t msg[OTE_CTL_MAX_NOTIFY];
    if (q->len > sizeof(msg)) return OTE_ERR_TOO_BIG;
    if (q->len == 0) /* never in the ring, in either mode: nothing to read */
        return s->tp->host.deliver_notify(s->tp->host.arg, s->from, s->from_name, msg, 0);
    if (ote__shm_in_ring(s, q)) {
        if (s->ring == NULL || q->local > s->ring_len || q->len > s->ring_len - q->local)
            return OTE_ERR_INVALID;
        ote_status_t st = ote__shm_ring_ready(s, q->id);
        if (st != OTE_OK) return st;
        memcpy(msg, s->ring + q->local, q->len);
        return s->tp->host.deliver_notify(s->tp->host.arg, s->from, s->from_name, msg, q->len);
    }
    struct iovec l = {msg, q->len}, r = {(void *)(uintptr_t)q->local, q->len};
    if (process_vm_readv(s->pid, &l, 1, &r, 1, 0) != (ssize_t)q->len) return OTE_ERR_INVALID;
    return s->tp->host.deliver_notify(s->tp->host.arg, s->from, s->from_name, msg, q->len);
}

/* Check one data request against the registrations and pin its range. */
static ote_status_t src_check(shm_src_t *s, const shm_req_t *q, void **pin_out) {
    if (q->op != OTE__SLICE_WRITE && q->op != OTE__SLICE_READ) return OTE_ERR_INVALID;
    if (q->len > SHM_MAX_SLICE) return OTE_ERR_TOO_BIG;
    unsigned perm = q->op == OTE__SLICE_WRITE ? OTE_PERM_WRITE : OTE_PERM_READ;
    /* The piece must lie in its request's extent, and the whole extent is checked: a
     * request partly outside a registration moves no byte, whichever piece comes first. */
    uint64_t start = q->req_remote, len = q->req_len;
    if (len == 0) { /* a request of one piece sent without its extent */
        start = q->remote;
        len = q->len;
    }
    if (q->remote < start || q->remote - start > len || q->len > len - (q->remote - start))
        return OTE_ERR_INVALID;
    ote_status_t st = ote__shm_src_pin(s, q, start, len, perm, pin_out);
    if (st != OTE_OK) {
        OTE_DEBUG("shm", "%s of %u bytes at 0x%llx from %s refused: %s",
                  q->op == OTE__SLICE_WRITE ? "WRITE" : "READ", q->len,
                  (unsigned long long)q->remote, s->from, ote_status_str(st));
        int code = ote_status_code(st);
        return code == OTE_ERR_ACCESS || code == OTE_ERR_CANCELED ? (ote_status_t)code : st;
    }
    return OTE_OK;
}

/* Whether the registration behind pin is device memory (engine/gpu: host->gpu). */
static int src_is_device(shm_src_t *s, void *pin) {
    return pin != NULL && OTE_MEM_IS_CUDA(ote__pin_kind(ote__shm_src_engine_pin(s, pin)));
}

/* Whether entry i's bytes go through a bounce buffer here: device memory, or a file
 * piece not sent from the page cache (m->fmap[i]). */
static int src_is_staged(shm_src_t *s, const shm_msg_t *m, uint32_t i) {
    return m->fmap[i] == NULL &&
           (src_is_device(s, m->pin[i]) || ote__shm_src_is_file(s, m->pin[i]));
}

/* This side's bytes of entry k: its registered memory, or a file READ's page cache pages
 * (m->fmap[k], which only the kernel's copy reads). */
static uint8_t *src_mine(const shm_msg_t *m, const shm_req_t *q, uint32_t k) {
    return m->fmap[k] != NULL ? (uint8_t *)(uintptr_t)m->fmap[k]
                              : (uint8_t *)(uintptr_t)q[k].remote;
}

/* Entry k's status after its copy: one out of a file's page cache that failed asks the
 * file owner why (the file truncated meanwhile: OTE_ERR_IO). */
static ote_status_t src_copied(shm_src_t *s, const shm_msg_t *m, const shm_req_t *q, uint32_t k,
                               ote_status_t st) {
    if (st == OTE_OK || m->fmap[k] == NULL) return st;
    const ote__host_t *h = &s->tp->host;
    return h->file.map_failed(h->file.arg, ote__shm_src_engine_pin(s, m->pin[k]), q[k].remote,
                              q[k].len, st);
}

/* One checked piece on device memory: its bytes go through a host bounce buffer
 * (host->gpu.stage_*), copied from/to the requester as host memory by copy_bytes. Served on
 * the connection thread, one piece at a time, never by the copy helpers. */
static ote_status_t src_copy_device(shm_src_t *s, const shm_req_t *q, void *pin) {
    const ote__host_t *h = &s->tp->host;
    /* A WRITE's bytes staged first: no bounce buffer is held while the requester stages. */
    if (q->op == OTE__SLICE_WRITE && ote__shm_in_ring(s, q)) {
        ote_status_t ready = ote__shm_ring_ready(s, q->id);
        if (ready != OTE_OK) return ready;
    }
    ote_deadline_t dl = ote_deadline_after(s->tp->cfg.transfer_timeout_ms * OTE_NSEC_PER_MSEC);
    uint8_t *buf = NULL;
    void *tok = NULL;
    ote_status_t st =
        h->gpu.stage_get(h->gpu.arg, ote__shm_src_engine_pin(s, pin), q->len, dl, &buf, &tok);
    if (st != OTE_OK) return st;
    if (q->op == OTE__SLICE_READ) st = h->gpu.stage_copy(h->gpu.arg, tok, 0, q->remote, q->len, dl);
    if (st == OTE_OK) st = ote__shm_copy_bytes(s, q, buf, q->local, NULL, q->len);
    if (st == OTE_OK && q->op == OTE__SLICE_WRITE)
        st = h->gpu.stage_copy(h->gpu.arg, tok, 1, q->remote, q->len, dl);
    h->gpu.stage_put(h->gpu.arg, tok);
    return st;
}

/* Small requests share one copy call (a run of them up to about this many bytes);
 * larger ones are copied in chunks. */
#define SHM_RUN_MAX_LEN (128u << 10)

/* One unit of copy work (any copying thread). */
static void do_unit(shm_src_t *s, shm_msg_t *m, const shm_unit_t *u) {
    const shm_req_t *q = ote__shm_msg_reqs(m);
    if (atomic_load(&s->abort)) {
        for (uint32_t k = u->i; k < u->j; k++) ote__shm_set_st(m, k, OTE_ERR_PEER_LOST);
        return;
    }
    if (u->len > 0) { /* a chunk of one large piece */
        const shm_req_t *p = &q[u->i];
        if (ote__shm_src_canceled(m->pin[u->i])) ote__shm_set_st(m, u->i, OTE_ERR_CANCELED);
        if (atomic_load(&m->st[u->i]) != OTE_OK) return; /* stopped or failed: no more of it */
        uint8_t *mapped = m->sptr[u->i] ? m->sptr[u->i] + u->off : NULL;
        ote_status_t st = ote__shm_copy_bytes(s, p, src_mine(m, q, u->i) + u->off,
                                              p->local + u->off, mapped, u->len);
        ote__shm_set_st(m, u->i, src_copied(s, m, q, u->i, st));
        return;
    }
    uint32_t n = u->j - u->i;
    int plain = 1; /* nothing of the run canceled or failed */
    for (uint32_t k = u->i; k < u->j; k++) {
        if (ote__shm_src_canceled(m->pin[k])) ote__shm_set_st(m, k, OTE_ERR_CANCELED);
        if (atomic_load(&m->st[k]) != OTE_OK) plain = 0;
    }
    if (n > 1 && plain && !ote__shm_in_ring(s, &q[u->i]) && m->sptr[u->i] == NULL) {
        /* One system call for the whole run; when the kernel copies less, each is copied
         * alone below so that each gets its own status. */
        struct iovec l[SHM_BATCH_MAX], r[SHM_BATCH_MAX];
        size_t total = 0;
        for (uint32_t k = 0; k < n; k++) {
            l[k] = (struct iovec){src_mine(m, q, u->i + k), q[u->i + k].len};
            r[k] = (struct iovec){(void *)(uintptr_t)q[u->i + k].local, q[u->i + k].len};
            total += q[u->i + k].len;
        }
        ssize_t got = q[u->i].op == OTE__SLICE_WRITE ? process_vm_readv(s->pid, l, n, r, n, 0)
                                                     : process_vm_writev(s->pid, l, n, r, n, 0);
        if (got == (ssize_t)total) return;
    }
    for (uint32_t k = u->i; k < u->j; k++) {
        if (ote__shm_src_canceled(m->pin[k])) ote__shm_set_st(m, k, OTE_ERR_CANCELED);
        if (atomic_load(&m->st[k]) == OTE_OK) {
            ote_status_t st =
                ote__shm_copy_bytes(s, &q[k], src_mine(m, q, k), q[k].local, m->sptr[k], q[k].len);
            ote__shm_set_st(m, k, src_copied(s, m, q, k, st));
        }
    }
}

/* The copy units of the checked data entries [a, b) of m into s->jun: runs of small
 * pieces of one op, and chunks of the large ones (at most SHM_UNITS_MAX in all). Their
 * number; *large_out: the bytes of the large pieces. */
static uint32_t build_units(shm_src_t *s, shm_msg_t *m, uint32_t a, uint32_t b,
                            uint64_t *large_out) {
    const shm_req_t *q = ote__shm_msg_reqs(m);
    uint64_t large = 0;
    for (uint32_t i = a; i < b; i++)
        if (atomic_load(&m->st[i]) == OTE_OK && q[i].len > SHM_RUN_MAX_LEN &&
            (q[i].op == OTE__SLICE_WRITE || q[i].op == OTE__SLICE_READ) && !src_is_staged(s, m, i))
            large += q[i].len;
    /* Each entry adds at most one unit beyond large / chunk (b - a <= SHM_BATCH_MAX). */
    uint64_t room = SHM_UNITS_MAX - SHM_BATCH_MAX, chunk = SHM_PAR_CHUNK;
    if (large / chunk > room) chunk = (large + room - 1) / room;
    uint32_t nu = 0;
    *large_out = 0;
    for (uint32_t i = a; i < b;) {
        uint16_t op = q[i].op;
        if (atomic_load(&m->st[i]) != OTE_OK || (op != OTE__SLICE_WRITE && op != OTE__SLICE_READ) ||
            src_is_staged(s, m, i)) {
            i++;
            continue;
        }
        if (q[i].len <= SHM_RUN_MAX_LEN) {
            uint32_t j = i + 1;
            uint64_t run = q[i].len;
            while (j < b && atomic_load(&m->st[j]) == OTE_OK && q[j].op == op &&
                   q[j].len <= SHM_RUN_MAX_LEN &&
                   ote__shm_in_ring(s, &q[j]) == ote__shm_in_ring(s, &q[i]) &&
                   (m->sptr[j] == NULL) == (m->sptr[i] == NULL) && run < SHM_RUN_MAX_LEN &&
                   !src_is_staged(s, m, j)) {
                run += q[j].len;
                j++;
            }
            *large_out += run;
            s->jun[nu++] = (shm_unit_t){(uint16_t)i, (uint16_t)j, 0, 0};
            i = j;
            continue;
        }
        for (uint64_t off = 0; off < q[i].len; off += chunk) {
            uint64_t l = q[i].len - off < chunk ? q[i].len - off : chunk;
            s->jun[nu++] = (shm_unit_t){(uint16_t)i, (uint16_t)(i + 1), (uint32_t)l, off};
        }
        i++;
    }
    *large_out += large;
    return nu;
}

/* Take the next unit of job generation gen (n units): 1 with *k, 0 when none is left. */
static int grab_unit(shm_src_t *s, uint64_t gen, uint32_t n, uint32_t *k) {
    uint64_t v = atomic_load(&s->jnext);
    for (;;) {
        if ((v >> 32) != (gen & 0xffffffffu) || (uint32_t)v >= n) return 0;
        if (atomic_compare_exchange_weak(&s->jnext, &v, v + 1)) {
            *k = (uint32_t)v;
            return 1;
        }
    }
}

static void unit_finished(shm_src_t *s, uint32_t n) {
    if (atomic_fetch_add(&s->jdone, 1) + 1 == n) {
        ote_mutex_lock(&s->jmu);
        ote_cond_signal(&s->jdone_cv);
        ote_mutex_unlock(&s->jmu);
    }
}

static void *helper_main(void *arg) {
    shm_src_t *s = arg;
    uint64_t seen = 0;
    ote_mutex_lock(&s->jmu);
    for (;;) {
        while (!s->jstop && s->jgen == seen)
            (void)ote_cond_wait(&s->jcv, &s->jmu, ote_deadline_after(OTE_NSEC_PER_SEC));
        if (s->jstop) break;
        seen = s->jgen;
        shm_msg_t *m = s->jmsg;
        uint32_t n = s->jn, k;
        ote_mutex_unlock(&s->jmu);
        while (grab_unit(s, seen, n, &k)) {
            do_unit(s, m, &s->jun[k]);
            unit_finished(s, n);
        }
        ote_mutex_lock(&s->jmu);
    }
    ote_mutex_unlock(&s->jmu);
    return NULL;
}

/* The copy helpers run: 1, or 0 when none could be started (the thread copies alone). */
static int helpers_start(shm_src_t *s) {
    if (s->nhelpers > 0) return 1;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int want = cpus > 1 ? (int)(cpus - 1) : 0;
    if (want > SHM_COPY_HELPERS) want = SHM_COPY_HELPERS;
    while (s->nhelpers < want) {
        if (ote_thread_create(&s->helper[s->nhelpers], NULL, helper_main, s) != 0) {
            OTE_WARN_LIMITED("shm", "cannot start a copy helper for %s: copying alone", s->from);
            break;
        }
        s->nhelpers++;
    }
    return s->nhelpers > 0;
}

static void helpers_stop(shm_src_t *s) {
    ote_mutex_lock(&s->jmu);
    s->jstop = 1;
    ote_cond_broadcast(&s->jcv);
    ote_mutex_unlock(&s->jmu);
    for (int i = 0; i < s->nhelpers; i++) pthread_join(s->helper[i], NULL);
    s->nhelpers = 0;
}

static int src_pull(shm_src_t *s);

/* Between two units of the connection thread: what the requester sent meanwhile. */
void ote__shm_src_pull_between(shm_src_t *s) {
    if (!atomic_load(&s->abort) && src_pull(s) != 0) atomic_store(&s->abort, 1);
}

/* Copy the nu units of s->jun for m: with the helpers when par, else alone. */
static void run_units(shm_src_t *s, shm_msg_t *m, uint32_t nu, int par) {
    uint32_t k;
    if (!par || !helpers_start(s)) {
        for (k = 0; k < nu; k++) {
            do_unit(s, m, &s->jun[k]);
            if (k + 1 < nu) ote__shm_src_pull_between(s);
        }
        return;
    }
    ote_mutex_lock(&s->jmu);
    s->jgen++;
    s->jmsg = m;
    s->jn = nu;
    atomic_store(&s->jdone, 0);
    atomic_store(&s->jnext, (s->jgen & 0xffffffffu) << 32);
    uint64_t gen = s->jgen;
    ote_cond_broadcast(&s->jcv);
    ote_mutex_unlock(&s->jmu);
    while (grab_unit(s, gen, nu, &k)) {
        do_unit(s, m, &s->jun[k]);
        unit_finished(s, nu);
        ote__shm_src_pull_between(s);
    }
    /* The helpers' last units; what the requester sends meanwhile is read every ms. */
    ote_mutex_lock(&s->jmu);
    while (atomic_load(&s->jdone) < nu) {
        (void)ote_cond_wait(&s->jdone_cv, &s->jmu, ote_deadline_after(OTE_NSEC_PER_MSEC));
        if (atomic_load(&s->jdone) >= nu) break;
        ote_mutex_unlock(&s->jmu);
        ote__shm_src_pull_between(s);
        ote_mutex_lock(&s->jmu);
    }
    ote_mutex_unlock(&s->jmu);
}

/* Serve message m in order: the copies of its data entries (checked and pinned when it
 * was read), each notification in its place after the data before it; then its pins go. */
static void src_serve(shm_src_t *s, shm_msg_t *m) {
    const shm_req_t *q = ote__shm_msg_reqs(m);
    uint32_t cnt = m->in.h.n;
    for (uint32_t a = 0; a < cnt;) {
        uint32_t b = a;
        while (b < cnt && q[b].op != OTE__SLICE_NOTIFY) b++;
        /* Pieces on device memory or files first, one at a time (they are staged); the
         * others of [a, b) as copy units. */
        for (uint32_t i = a; i < b; i++) {
            if ((q[i].op != OTE__SLICE_WRITE && q[i].op != OTE__SLICE_READ) ||
                !src_is_staged(s, m, i))
                continue;
            if (atomic_load(&s->abort)) ote__shm_set_st(m, i, OTE_ERR_PEER_LOST);
            if (ote__shm_src_canceled(m->pin[i])) ote__shm_set_st(m, i, OTE_ERR_CANCELED);
            if (atomic_load(&m->st[i]) != OTE_OK) continue;
            if (ote__shm_src_is_file(s, m->pin[i])) {
                if (ote__shm_fread_mapped(s, m, i)) continue; /* copied by the units below */
                ote__shm_set_st(m, i, ote__shm_fread_piece(s, m, i, b)); /* shm_fread.c */
                continue;
            }
            if (q[i].flags & SHM_REQ_IPC) {
                /* CUDA IPC where the registration opted in: the requester copies. */
                const ote__host_t *h = &s->tp->host;
                ote_status_t xs =
                    h->gpu.ipc_export(h->gpu.arg, ote__shm_src_engine_pin(s, m->pin[i]),
                                      q[i].remote, q[i].len, &m->offer[i], &m->offer_fd[i]);
                if (xs == OTE_OK) {
                    m->ipc[i] = 1;
                    continue;
                }
                if (q[i].flags & SHM_REQ_LOCAL_DEV) { /* no byte of it can move here */
                    ote__shm_set_st(m, i, OTE_ERR_UNSUPPORTED);
                    continue;
                }
            }
            ote__shm_set_st(m, i, src_copy_device(s, &q[i], m->pin[i]));
        }
        ote__shm_fread_settle(s, m, a, b); /* file reads of pieces skipped meanwhile */
        uint64_t large = 0;
        uint32_t nu = build_units(s, m, a, b, &large);
        if (nu > 0) run_units(s, m, nu, large >= SHM_PAR_MIN && nu > 1);
        if (b < cnt) {
            ote__shm_set_st(m, b,
                            atomic_load(&s->abort) ? OTE_ERR_PEER_LOST : src_notify(s, &q[b]));
            b++;
        }
        a = b;
    }
    for (uint32_t i = 0; i < cnt; i++) {
        if (m->pin[i] == NULL) continue;
        /* An IPC piece keeps its pin until the requester's IPC_DONE. */
        if (m->ipc[i] && atomic_load(&m->st[i]) == OTE_OK &&
            ote__shm_src_held_add(s, q[i].id, m->pin[i], q[i].len))
            continue;
        if (m->ipc[i]) ote__shm_set_st(m, i, OTE_ERR_NOMEM);
        ote__shm_src_unpin(s, m->pin[i], q[i].len);
        m->pin[i] = NULL;
    }
}

/* CANCEL entry c: its request's account is marked (pieces to come, and those of it being
 * copied, stop before their next chunk), and the pieces of it that were read but not
 * copied yet (pinned alone: a request of one piece has no account) are answered
 * OTE_ERR_CANCELED without being copied. */
static void src_cancel(shm_src_t *s, const shm_req_t *c) {
    if (c->req_uid == 0 || c->req_len == 0) return;
    ote__shm_src_cancel(s, c);
    for (uint32_t k = 0; k <= s->mcount && k < SHM_LOOKAHEAD; k++) {
        shm_msg_t *m = &s->msgs[(s->mhead + k) % SHM_LOOKAHEAD]; /* k == mcount: being read */
        const shm_req_t *q = ote__shm_msg_reqs(m);
        for (uint32_t i = 0; i < m->in.h.n; i++)
            if ((q[i].op == OTE__SLICE_WRITE || q[i].op == OTE__SLICE_READ) &&
                q[i].req_uid == c->req_uid && q[i].req_remote == c->req_remote &&
                q[i].req_len == c->req_len)
                ote__shm_set_st(m, i, OTE_ERR_CANCELED);
    }
}

/* A message just read into m: validated, its write-offs and cancels applied, every data
 * request checked and pinned. The number of its entries that get a response, or -1
 * when it is malformed (the connection closes). */
static int src_take(shm_src_t *s, shm_msg_t *m, ssize_t n) {
    if (n < 0 || ote__shm_reqs_count(m->in.b, (size_t)n) < 0) {
        OTE_WARN_LIMITED("shm", "malformed message from %s (pid %d): closing", s->from,
                         (int)s->pid);
        return -1;
    }
    const shm_req_t *q = ote__shm_msg_reqs(m);
    int resp = 0;
    for (uint32_t i = 0; i < m->in.h.n; i++) {
        m->pin[i] = NULL;
        m->ipc[i] = 0;
        m->offer_fd[i] = -1;
        m->smap[i] = NULL;
        m->sptr[i] = NULL;
        m->fmap[i] = NULL;
        atomic_store(&m->st[i], OTE_OK);
        if (q[i].op == SHM_OP_UNMAP) {
            ote__shm_src_unmap(s, q[i].id);
            continue;
        }
        if (q[i].op == SHM_OP_WRITE_OFF) {
            ote__shm_src_write_off(s, &q[i]);
            continue;
        }
        if (q[i].op == SHM_OP_IPC_DONE) {
            ote__shm_src_held_done(s, q[i].id);
            continue;
        }
        if (q[i].op == SHM_OP_CANCEL) continue; /* below, once every entry is checked */
        resp++;
        if (q[i].op == OTE__SLICE_NOTIFY) continue; /* delivered in its place */
        ote_status_t st = src_check(s, &q[i], &m->pin[i]);
        /* Flags: IPC ones only where negotiated; a local device buffer never in the ring. */
        uint16_t fl = q[i].flags;
        if (st == OTE_OK && !ote__shm_req_flags_ok(fl, s->ipc, s->shared)) st = OTE_ERR_INVALID;
        /* A local device buffer against host memory here: nothing can move (the
         * requester stages it). */
        if (st == OTE_OK && (fl & SHM_REQ_LOCAL_DEV) && !src_is_device(s, m->pin[i]))
            st = OTE_ERR_UNSUPPORTED;
        if (st == OTE_OK && ote__shm_in_ring(s, &q[i]) &&
            !ote__shm_ring_range_ok(s->ring, s->ring_len, q[i].local, q[i].len))
            st = OTE_ERR_INVALID;
        if (st == OTE_OK && (fl & SHM_REQ_SHARED) && !src_is_device(s, m->pin[i]))
            ote__shm_src_shared_take(s, m, i);
        atomic_store(&m->st[i], (int32_t)st);
    }
    for (uint32_t i = 0; i < m->in.h.n; i++)
        if (q[i].op == SHM_OP_CANCEL) src_cancel(s, &q[i]);
    return resp;
}

/* Read, without waiting, the messages the requester sent while there is room for them:
 * 0, or -1 when it closed, died or sent a malformed message. */
static int src_pull(shm_src_t *s) {
    while (s->mcount < SHM_LOOKAHEAD) {
        shm_msg_t *m = &s->msgs[(s->mhead + s->mcount) % SHM_LOOKAHEAD];
        /* MSG_TRUNC: n is the message's real length, so one longer than any valid REQS
         * is refused instead of being cut to the buffer. */
        int fd = -1, fds_bad = 0;
        ssize_t n = ote__shm_recv_fds(s->fd, m->in.b, sizeof(m->in.b), &fd, &fds_bad);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
        if (n <= 0) { /* the requester closed or died */
            if (fd >= 0) close(fd);
            return -1;
        }
        /* An fd travels only with a MAP (exactly one); anything else is malformed. */
        if ((size_t)n >= sizeof(shm_hdr_t) && m->in.h.kind == SHM_MAP) {
            if (ote__shm_src_map(s, m->in.b, (size_t)n, fd, fds_bad) != 0) return -1;
            continue;
        }
        if (fd >= 0 || fds_bad) {
            if (fd >= 0) close(fd);
            OTE_WARN_LIMITED("shm", "message with a file descriptor from %s (pid %d): closing",
                             s->from, (int)s->pid);
            return -1;
        }
        int resp = src_take(s, m, n);
        if (resp < 0) return -1;
        if (resp > 0) s->mcount++; /* only write-offs and cancels: done with it */
    }
    return 0;
}

static void src_loop(shm_src_t *s) {
    union {
        shm_hdr_t h;
        uint8_t b[sizeof(shm_hdr_t) + SHM_BATCH_MAX * sizeof(shm_resp_t)];
    } out;
    for (;;) {
        if (s->mcount == 0 && wait_in(s, 0) != 1) break;
        if (src_pull(s) != 0) break;
        if (s->mcount == 0) continue;
        shm_msg_t *m = &s->msgs[s->mhead];
        src_serve(s, m);
        s->mhead = (s->mhead + 1) % SHM_LOOKAHEAD;
        s->mcount--;
        if (atomic_load(&s->abort)) {
            offer_fds_close(m);
            break;
        }
        const shm_req_t *reqs = ote__shm_msg_reqs(m);
        shm_resp_t *resps = (shm_resp_t *)(out.b + sizeof(shm_hdr_t));
        int lost = 0, failed = 0;
        uint32_t k = 0; /* write-offs, cancels and IPC_DONEs get no response */
        for (uint32_t i = 0; i < m->in.h.n && !failed; i++) {
            ote_status_t st = (ote_status_t)atomic_load(&m->st[i]);
            if (st == OTE_ERR_PEER_LOST) lost = 1;
            if (reqs[i].op == SHM_OP_WRITE_OFF || reqs[i].op == SHM_OP_CANCEL ||
                reqs[i].op == SHM_OP_IPC_DONE || reqs[i].op == SHM_OP_UNMAP)
                continue;
            if (!m->ipc[i] || st != OTE_OK) {
                resps[k++] = (shm_resp_t){reqs[i].id, (int32_t)st, 0};
                continue;
            }
            /* An offer in the piece's place: the responses before it go first. */
            if (k > 0) {
                out.h = (shm_hdr_t){SHM_MAGIC, SHM_VERSION, SHM_RESPS, k, 0};
                if (send_msg(s, out.b, sizeof(shm_hdr_t) + k * sizeof(shm_resp_t)) != OTE_OK)
                    failed = 1;
                k = 0;
            }
            shm_ipc_offer_t o;
            memset(&o, 0, sizeof(o));
            o.h = (shm_hdr_t){SHM_MAGIC, SHM_VERSION, SHM_IPC_OFFER, 1, 0};
            o.id = reqs[i].id;
            o.d = m->offer[i];
            ote__shm_src_offered_note(s, &o.d);
            if (!failed && send_msg_fd(s, &o, sizeof(o), m->offer_fd[i]) != OTE_OK) failed = 1;
        }
        offer_fds_close(m);
        ote__shm_src_shared_release(s, m); /* every copy of it ended */
        if (failed || lost) break;
        out.h = (shm_hdr_t){SHM_MAGIC, SHM_VERSION, SHM_RESPS, k, 0};
        if (k > 0 && send_msg(s, out.b, sizeof(shm_hdr_t) + k * sizeof(shm_resp_t)) != OTE_OK)
            break;
    }
    /* Pins of messages read but never served, once the file I/O started ahead for them
     * (reads and writes of their pieces, on their registrations) has ended. */
    ote__shm_fread_settle(s, NULL, 0, 0);
    for (; s->mcount > 0; s->mcount--, s->mhead = (s->mhead + 1) % SHM_LOOKAHEAD) {
        shm_msg_t *m = &s->msgs[s->mhead];
        for (uint32_t i = 0; i < m->in.h.n; i++)
            if (m->pin[i] != NULL) ote__shm_src_unpin(s, m->pin[i], ote__shm_msg_reqs(m)[i].len);
    }
}

void *ote__shm_src_main(void *arg) {
    shm_src_t *s = arg;
    int sync = 0;
    if (ote_mutex_init(&s->jmu) == OTE_OK) sync++;
    if (sync == 1 && ote_cond_init(&s->jcv) == OTE_OK) sync++;
    if (sync == 2 && ote_cond_init(&s->jdone_cv) == OTE_OK) sync++;
    s->msgs = sync == 3 ? ote_calloc(SHM_LOOKAHEAD, sizeof(shm_msg_t)) : NULL;
    if (s->msgs == NULL) {
        OTE_WARN("shm", "out of memory for the connection of pid %d: closing", (int)s->pid);
        goto out_done;
    }
    if (src_hello(s) == 0) src_loop(s);
    ote__shm_fread_end(s);
    helpers_stop(s);
    ote__shm_src_shared_end(s); /* no copy runs any more */
out_done:
    ote__shm_src_held_end(s);
    ote__shm_src_accts_end(s);
    if (s->ring != NULL) munmap(s->ring, s->ring_map);
    s->ring = NULL;
    ote_free(s->msgs);
    s->msgs = NULL;
    if (sync > 2) ote_cond_destroy(&s->jdone_cv);
    if (sync > 1) ote_cond_destroy(&s->jcv);
    if (sync > 0) ote_mutex_destroy(&s->jmu);
    atomic_store(&s->done, 1);
    return NULL;
}

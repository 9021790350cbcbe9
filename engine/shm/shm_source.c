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
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/log.h"
#include "engine/control/auth.h"
#include "engine/control/ctl.h"
#include "engine/shm/shm_internal.h"
#include "ote/ote.h"

/* Wait until fd is readable; 1 ready, 0 stop requested, -1 deadline passed. */
static int wait_in(shm_src_t *s, ote_deadline_t dl) {
    /* The requester often sends its next message right after our answer. */
    ote_deadline_t spin = ote_deadline_after(SHM_SPIN_NS);
    for (;;) {
        struct pollfd p = {.fd = s->fd, .events = POLLIN};
        if (poll(&p, 1, 0) > 0) return 1;
        if (ote_deadline_expired(spin)) break;
    }
    for (;;) {
        if (atomic_load(&s->tp->stop)) return 0;
        if (dl != 0 && ote_deadline_expired(dl)) return -1;
        struct pollfd p = {.fd = s->fd, .events = POLLIN};
        int r = poll(&p, 1, 100);
        if (r > 0) return 1;
    }
}

/* Still connected: no hangup and no EOF pending from the requester. */
static int requester_alive(shm_src_t *s) {
    struct pollfd p = {.fd = s->fd, .events = POLLRDHUP};
    return !(poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)));
}

static ote_status_t send_msg(shm_src_t *s, const void *buf, size_t len) {
    ote_deadline_t dl = ote_deadline_after(s->tp->cfg.transfer_timeout_ms * OTE_NSEC_PER_MSEC);
    for (;;) {
        ssize_t r = send(s->fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r == (ssize_t)len) return OTE_OK;
        if (r >= 0 || (errno != EAGAIN && errno != EINTR)) return OTE_ERR_PEER_LOST;
        struct pollfd p = {.fd = s->fd, .events = POLLOUT};
        if (ote_deadline_expired(dl) || atomic_load(&s->tp->stop)) return OTE_ERR_TIMEOUT;
        (void)poll(&p, 1, 100);
    }
}

static ssize_t recv_hello(int sock, shm_hello_t *h, int *fd_out);
static int src_hello_answer(shm_src_t *s, shm_hello_t *hp, int rfd);

/* Engine with a key: the challenge-response on the HELLO h (its bytes as received),
 * before anything of it is acted on. 0 when the requester proved the key; -1 when not
 * (counted and logged): the caller closes without reading more. */
static int src_auth(shm_src_t *s, const shm_hello_t *h, ote_deadline_t dl) {
    ote_auth_peer_t peer;
    ote_auth_peer_of_uid(s->tp->host.auth_key, s->uid, s->pid, &peer);
    ote_auth_t a;
    ote_auth_bind(&a, "shm", h, sizeof(*h));
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
    ssize_t n = recv(s->fd, &m, sizeof(m), MSG_DONTWAIT | MSG_TRUNC);
    if (n != (ssize_t)sizeof(m) || m.h.magic != SHM_MAGIC || m.h.kind != SHM_AUTH ||
        m.step != OTE_CTL_AUTH_PROOF) {
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
    shm_hello_t h;
    ote_deadline_t dl = ote_deadline_after(tp->cfg.connect_timeout_ms * OTE_NSEC_PER_MSEC);
    if (wait_in(s, dl) != 1) return -1;
    int rfd = -1;
    ssize_t n = recv_hello(s->fd, &h, &rfd);
    if (n != (ssize_t)sizeof(h) || h.h.magic != SHM_MAGIC || h.h.kind != SHM_HELLO) {
        OTE_WARN("shm", "connection from pid %d did not begin with a HELLO: closing", (int)s->pid);
        if (rfd >= 0) close(rfd);
        return -1;
    }
    if (tp->host.auth_key != NULL && src_auth(s, &h, dl) != 0) {
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

/* Map the requester's ring: 0, or -1 (text says why). */
static int src_map_ring(shm_src_t *s, const shm_hello_t *h, int rfd, char *text, size_t tl) {
    struct stat sb;
    if (rfd < 0 || h->ring_len == 0 || h->ring_len > (1ull << 30) || fstat(rfd, &sb) != 0 ||
        (uint64_t)sb.st_size < h->ring_len) {
        snprintf(text, tl, "no usable shared ring in the HELLO");
        return -1;
    }
    /* A ring the requester could shrink would make our next copy a SIGBUS of the whole
     * engine: only a memfd sealed against shrinking is mapped. */
    int seals = fcntl(rfd, F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
        snprintf(text, tl, "the shared ring is not a memfd sealed against shrinking");
        return -1;
    }
    void *m = mmap(NULL, (size_t)h->ring_len, PROT_READ | PROT_WRITE, MAP_SHARED, rfd, 0);
    if (m == MAP_FAILED) {
        snprintf(text, tl, "cannot map the shared ring: %s", strerror(errno));
        return -1;
    }
    s->ring = m;
    s->ring_len = (size_t)h->ring_len;
    return 0;
}

/* Choose the mode and answer the HELLO: cross-memory attach when the requester asks for
 * it and the probe proves it, else the ring it passed. */
static int src_hello_answer(shm_src_t *s, shm_hello_t *hp, int rfd) {
    shm_hello_t h = *hp;
    h.addr[sizeof(h.addr) - 1] = '\0';
    snprintf(s->from, sizeof(s->from), "%s", h.addr);
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
        if (src_map_ring(s, &h, rfd, a.text, sizeof(a.text)) != 0) a.status = OTE_ERR_UNSUPPORTED;
        else OTE_INFO("shm", "requester pid %d (%s): shared ring (%s)", (int)s->pid, s->from, why);
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

/* Copy one checked request; OTE_ERR_PEER_LOST when the requester went away meanwhile. */
static ote_status_t src_copy(shm_src_t *s, const shm_req_t *q) {
    if (s->mode == SHM_MODE_RING) {
        /* The ring piece the requester named, bounded by the ring. */
        if (q->local > s->ring_len || q->len > s->ring_len - q->local) return OTE_ERR_INVALID;
        uint8_t *mine = (uint8_t *)(uintptr_t)q->remote, *piece = s->ring + q->local;
        if (q->op == OTE__SLICE_WRITE) memcpy(mine, piece, q->len);
        else memcpy(piece, mine, q->len);
        return OTE_OK;
    }
    uint8_t *mine = (uint8_t *)(uintptr_t)q->remote;
    uint64_t theirs = q->local;
    uint32_t left = q->len;
    while (left > 0) {
        size_t n = left < SHM_CHUNK ? left : SHM_CHUNK;
        struct iovec l = {mine, n}, r = {(void *)(uintptr_t)theirs, n};
        ssize_t got = q->op == OTE__SLICE_WRITE ? process_vm_readv(s->pid, &l, 1, &r, 1, 0)
                                                : process_vm_writev(s->pid, &l, 1, &r, 1, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0 && errno == ESRCH) return OTE_ERR_PEER_LOST;
        if (got <= 0) return OTE_ERR_INVALID; /* the requester's own buffer is not mapped */
        mine += got;
        theirs += (uint64_t)got;
        left -= (uint32_t)got;
        if (left > 0 && !requester_alive(s)) return OTE_ERR_PEER_LOST;
    }
    return OTE_OK;
}

static ote_status_t src_notify(shm_src_t *s, const shm_req_t *q) {
    uint8_t msg[OTE_CTL_MAX_NOTIFY];
    if (q->len > sizeof(msg)) return OTE_ERR_TOO_BIG;
    if (s->mode == SHM_MODE_RING) {
        if (q->local > s->ring_len || q->len > s->ring_len - q->local) return OTE_ERR_INVALID;
        memcpy(msg, s->ring + q->local, q->len);
        return s->tp->host.deliver_notify(s->tp->host.arg, s->from, msg, q->len);
    }
    struct iovec l = {msg, q->len}, r = {(void *)(uintptr_t)q->local, q->len};
    if (q->len > 0 && process_vm_readv(s->pid, &l, 1, &r, 1, 0) != (ssize_t)q->len)
        return OTE_ERR_INVALID;
    return s->tp->host.deliver_notify(s->tp->host.arg, s->from, msg, q->len);
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
        return ote_status_code(st) == OTE_ERR_ACCESS ? OTE_ERR_ACCESS : st;
    }
    return OTE_OK;
}

/* Copy the checked small requests [i, j) of one op with one system call (their
 * statuses stay OTE_OK); when the kernel copies less, each is copied alone instead so
 * that each gets its own status. */
static void src_copy_run(shm_src_t *s, const shm_req_t *q, uint32_t n, ote_status_t *st) {
    struct iovec l[SHM_BATCH_MAX], r[SHM_BATCH_MAX];
    size_t total = 0;
    for (uint32_t k = 0; k < n; k++) {
        l[k] = (struct iovec){(void *)(uintptr_t)q[k].remote, q[k].len};
        r[k] = (struct iovec){(void *)(uintptr_t)q[k].local, q[k].len};
        total += q[k].len;
    }
    ssize_t got = q[0].op == OTE__SLICE_WRITE ? process_vm_readv(s->pid, l, n, r, n, 0)
                                              : process_vm_writev(s->pid, l, n, r, n, 0);
    if (got == (ssize_t)total) return;
    for (uint32_t k = 0; k < n; k++) st[k] = src_copy(s, &q[k]);
}

/* Whether the registration behind pin is device memory (engine/gpu: host->stage_*). */
static int src_is_device(shm_src_t *s, void *pin) {
    const ote__host_t *h = &s->tp->host;
    return pin != NULL && h->pin_kind != NULL &&
           OTE_MEM_IS_CUDA(h->pin_kind(h->arg, ote__shm_src_engine_pin(s, pin)));
}

/* One checked request on device memory: its bytes go through a host bounce buffer
 * (host->stage_*), copied from/to the requester as host memory by src_copy. */
static ote_status_t src_copy_device(shm_src_t *s, const shm_req_t *q, void *pin) {
    const ote__host_t *h = &s->tp->host;
    ote_deadline_t dl = ote_deadline_after(s->tp->cfg.transfer_timeout_ms * OTE_NSEC_PER_MSEC);
    uint8_t *buf = NULL;
    void *tok = NULL;
    ote_status_t st = h->stage_get(h->arg, ote__shm_src_engine_pin(s, pin), q->len, dl, &buf, &tok);
    if (st != OTE_OK) return st;
    shm_req_t b = *q;
    b.remote = (uintptr_t)buf;
    if (q->op == OTE__SLICE_READ) st = h->stage_copy(h->arg, tok, 0, q->remote, q->len, dl);
    if (st == OTE_OK) st = src_copy(s, &b);
    if (st == OTE_OK && q->op == OTE__SLICE_WRITE)
        st = h->stage_copy(h->arg, tok, 1, q->remote, q->len, dl);
    h->stage_put(h->arg, tok);
    return st;
}

/* Small requests share one copy call; larger ones are copied alone, in pieces. */
#define SHM_RUN_MAX_LEN (256u << 10)

/* Serve the requests of one REQS message in order: every data request is checked (and
 * pinned) before any byte of the message moves; notifications are delivered in their
 * place, after the data before them. */
static void src_serve(shm_src_t *s, const shm_req_t *reqs, uint32_t cnt, ote_status_t *st) {
    void *pins[SHM_BATCH_MAX];
    for (uint32_t i = 0; i < cnt; i++) {
        pins[i] = NULL;
        st[i] = OTE_OK;
        if (reqs[i].op == SHM_OP_WRITE_OFF) ote__shm_src_write_off(s, &reqs[i]);
        else if (reqs[i].op != OTE__SLICE_NOTIFY) st[i] = src_check(s, &reqs[i], &pins[i]);
    }
    for (uint32_t i = 0; i < cnt;) {
        const shm_req_t *q = &reqs[i];
        if (st[i] != OTE_OK || q->op == SHM_OP_WRITE_OFF) {
            i++;
            continue;
        }
        if (q->op == OTE__SLICE_NOTIFY) {
            st[i] = src_notify(s, q);
            i++;
            continue;
        }
        if (src_is_device(s, pins[i])) {
            st[i] = src_copy_device(s, q, pins[i]);
            i++;
            continue;
        }
        uint32_t j = i + 1;
        if (q->len <= SHM_RUN_MAX_LEN)
            while (j < cnt && st[j] == OTE_OK && reqs[j].op == q->op &&
                   reqs[j].len <= SHM_RUN_MAX_LEN && !src_is_device(s, pins[j]))
                j++;
        if (j - i == 1 || s->mode == SHM_MODE_RING)
            for (uint32_t k = i; k < j; k++) st[k] = src_copy(s, &reqs[k]);
        else src_copy_run(s, q, j - i, st + i);
        i = j;
    }
    for (uint32_t i = 0; i < cnt; i++)
        if (pins[i] != NULL) ote__shm_src_unpin(s, pins[i], reqs[i].len);
}

void *ote__shm_src_main(void *arg) {
    shm_src_t *s = arg;
    union {
        shm_hdr_t h;
        uint8_t b[sizeof(shm_hdr_t) + SHM_BATCH_MAX * sizeof(shm_req_t)];
    } in;
    union {
        shm_hdr_t h;
        uint8_t b[sizeof(shm_hdr_t) + SHM_BATCH_MAX * sizeof(shm_resp_t)];
    } out;
    if (src_hello(s) != 0) goto out_done;
    for (;;) {
        int w = wait_in(s, 0);
        if (w != 1) break;
        /* MSG_TRUNC: n is the message's real length, so one longer than any valid REQS
         * is refused instead of being cut to the buffer. */
        ssize_t n = recv(s->fd, in.b, sizeof(in.b), MSG_DONTWAIT | MSG_TRUNC);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (n <= 0) break; /* the requester closed or died */
        if ((size_t)n < sizeof(shm_hdr_t) || (size_t)n > sizeof(in.b) || in.h.magic != SHM_MAGIC ||
            in.h.version != SHM_VERSION || in.h.kind != SHM_REQS || in.h.n > SHM_BATCH_MAX ||
            (size_t)n != sizeof(shm_hdr_t) + in.h.n * sizeof(shm_req_t)) {
            OTE_WARN("shm", "malformed message from %s (pid %d): closing", s->from, (int)s->pid);
            break;
        }
        const shm_req_t *reqs = (const shm_req_t *)(in.b + sizeof(shm_hdr_t));
        shm_resp_t *resps = (shm_resp_t *)(out.b + sizeof(shm_hdr_t));
        ote_status_t st[SHM_BATCH_MAX];
        src_serve(s, reqs, in.h.n, st);
        int lost = 0;
        uint32_t m = 0; /* write-offs get no response */
        for (uint32_t i = 0; i < in.h.n; i++) {
            if (st[i] == OTE_ERR_PEER_LOST) lost = 1;
            if (reqs[i].op != SHM_OP_WRITE_OFF)
                resps[m++] = (shm_resp_t){reqs[i].id, (int32_t)st[i], 0};
        }
        out.h = (shm_hdr_t){SHM_MAGIC, SHM_VERSION, SHM_RESPS, m, 0};
        if (!lost && m > 0 &&
            send_msg(s, out.b, sizeof(shm_hdr_t) + m * sizeof(shm_resp_t)) != OTE_OK)
            lost = 1;
        if (lost) break;
    }
out_done:
    ote__shm_src_accts_end(s);
    if (s->ring != NULL) munmap(s->ring, s->ring_len);
    s->ring = NULL;
    atomic_store(&s->done, 1);
    return NULL;
}

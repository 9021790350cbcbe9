/*
 * engine/listen.c - the engine's one listening socket, shared by its transports.
 *
 * One TCP socket on listen_address serves every connection a peer makes to this engine:
 * TCP data connections, the RDMA transport's control connections and the short
 * handshakes of the router and of buffer discovery. An acceptor thread accepts; a
 * connection from an address in authentication back-off (engine/control/auth_limit.h) is
 * closed at once, before any byte, and so is one over tcp_max_accepted (connections the
 * listener has accepted and not yet seen closed, handshaking or handed over) or over
 * OTE__LISTEN_MAX_HS handshakes at once, or, once half of those are taken, over
 * OTE__LISTEN_MAX_HS_PER_ADDR of them from its address. What a connection's first frame makes the handshake thread log is
 * rate-limited (OTE_LOG_LIMITED): every connection can cause a line. Each other connection gets a short-lived
 * handshake thread that, by handshake_timeout_ms (at most connect_timeout_ms) from its
 * accept:
 *
 *   1. reads exactly one frame, which must be a HELLO no larger than a HELLO can be;
 *   2. with a cluster key, runs the challenge-response of engine/control/auth.h on it
 *      (ote_auth_source: counted, logged and fed to the back-off table): the only place
 *      an engine authenticates a connection made to its listening address;
 *   3. asks the router which transport the HELLO's role names (1: a TCP data connection,
 *      2: RDMA control, 3: the router's INFO / discovery), and either hands the socket
 *      and the HELLO's bytes to it (ops->adopt: it answers HELLO_ACK and owns the socket
 *      from then on) or, when the engine does not serve that transport, sends an ERROR
 *      frame with OTE_ERR_UNSUPPORTED whose text names the role and the engine's list,
 *      logs it and closes.
 *
 * Since the listener reads exactly the frames of the handshake (header, then the body it
 * announces), nothing the peer sent after them is lost: a transport reads the rest from
 * the socket. The transport that adopted a connection calls host->conn_closed once when
 * it is gone, which frees its place under tcp_max_accepted.
 *
 * Lifecycle (router.c): create (bind, listen, the advertised address) before the
 * transports, so that they know the engine's address; start once they all exist; stop
 * (the acceptor and every handshake thread joined, the socket closed) before they are
 * destroyed, and free after, since their closing connections still call conn_closed.
 */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/le.h"
#include "base/list.h"
#include "base/log.h"
#include "base/thread.h"
#include "engine/control/auth.h"
#include "engine/control/sock.h"
#include "engine/core_internal.h"
#include "engine/listen_internal.h"

#define OTE__LISTEN_MAX_HS 128 /* handshakes at once */
/* Once half the handshake slots are taken, an address (IPv6: a /64) with this many
 * handshakes in flight gets no more, so that silent connections from a few addresses
 * cannot hold every slot for handshake_timeout_ms each. Below half, a burst from one host
 * (many processes opening segments at once) is not limited. */
#define OTE__LISTEN_MAX_HS_PER_ADDR 16
#define LISTEN_ACCEPT_BATCH 64 /* accepts between two looks at stop */
#define LISTEN_POLL_MS 1000    /* a safety net: stop writes wake_fd, a peer makes lfd readable */
#define LISTEN_PAUSE_NS (100 * OTE_NSEC_PER_MSEC) /* after accept fails for lack of fds */
#define LISTEN_LOG_EVERY_NS OTE_NSEC_PER_SEC
#define LISTEN_HS_STACK (512u << 10)
/* The largest HELLO: its fixed body and the longest address. */
#define LISTEN_HELLO_MAX (OTE_CTL_HDR_LEN + OTE_CTL_MAX_HELLO_BODY)

typedef struct {
    ote__listen_t *l;
    pthread_t th;
    int used;             /* a thread was started in this slot (joined when done) */
    int done;             /* under l->mu: the thread is returning */
    int fd;               /* under l->mu: the socket while the thread owns it, else -1 */
    uint64_t born;        /* accept time: the handshake's deadline runs from it */
    ote_auth_addr_t addr; /* the peer's address (IPv6: its /64), for the per-address cap */
    char from[OTE__ADDR_MAX];
} hs_t;

struct ote__listen {
    ote_engine_t *e;
    int lfd;
    int wake_fd; /* eventfd: ote__listen_stop wakes the acceptor through it */
    pthread_t th;
    int started;
    _Atomic int stop;
    _Atomic uint32_t held; /* accepted and not yet closed (tcp_max_accepted) */
    ote_mutex_t mu;
    hs_t hs[OTE__LISTEN_MAX_HS];
    uint64_t log_ns, quiet; /* acceptor thread: rate-limited WARN lines */
};

/* The address peers should use: advertise_address if set (port 0 there means "the port
 * we listen on"), else the bound address, with a wildcard host replaced by the loopback
 * address of its family (set advertise_address on multi-host setups). */
static ote_status_t compute_address(const ote__cfg_t *cfg, const struct sockaddr_storage *bound,
                                    char *out, size_t cap) {
    struct sockaddr_storage a = *bound;
    uint16_t port = a.ss_family == AF_INET ? ntohs(((struct sockaddr_in *)&a)->sin_port)
                                           : ntohs(((struct sockaddr_in6 *)&a)->sin6_port);
    if (cfg->advertise_address[0]) {
        char host[256];
        uint16_t aport;
        int v6;
        ote_status_t st = ote__addr_split(cfg->advertise_address, host, sizeof(host), &aport, &v6);
        if (st != OTE_OK) return st;
        int n = snprintf(out, cap, v6 ? "[%s]:%u" : "%s:%u", host, aport ? aport : port);
        return (n > 0 && (size_t)n < cap) ? OTE_OK : OTE_ERR_TOO_BIG;
    }
    if (a.ss_family == AF_INET) {
        struct sockaddr_in *a4 = (struct sockaddr_in *)&a;
        if (a4->sin_addr.s_addr == htonl(INADDR_ANY)) a4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    } else {
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&a;
        if (memcmp(&a6->sin6_addr, &in6addr_any, sizeof(in6addr_any)) == 0)
            a6->sin6_addr = in6addr_loopback;
    }
    return ote__addr_format((struct sockaddr *)&a, out, cap);
}

ote_status_t ote__listen_create(ote_engine_t *e, ote__listen_t **out) {
    const ote__cfg_t *cfg = &e->cfg;
    ote__listen_t *l = ote_calloc(1, sizeof(*l));
    if (l == NULL) return OTE_ERR_NOMEM;
    l->e = e;
    l->lfd = -1;
    /* The acceptor sleeps in poll until a connection or ote__listen_stop's wake: an idle
     * engine does not wake every few milliseconds (1,024 idle engines on one host woke
     * 20,000 times a second through a 50 ms poll, a CPU's worth on a small VM). */
    l->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (l->wake_fd < 0) {
        ote_status_t st = ote_status_from_errno(errno);
        OTE_ERROR("engine", "eventfd() for the listener failed: %s", strerror(errno));
        ote_free(l);
        return st;
    }
    ote_status_t st = ote_mutex_init(&l->mu);
    if (st != OTE_OK) {
        close(l->wake_fd);
        ote_free(l);
        return st;
    }
    struct sockaddr_storage ss;
    socklen_t sl;
    st = ote__addr_resolve(cfg->listen_address, &ss, &sl);
    if (st != OTE_OK) {
        OTE_ERROR("engine", "cannot use listen_address \"%s\": %s", cfg->listen_address,
                  ote_status_str(st));
        goto err;
    }
    l->lfd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (l->lfd < 0) {
        st = ote_status_from_errno(errno);
        OTE_ERROR("engine", "socket() for listen_address %s failed: %s", cfg->listen_address,
                  strerror(errno));
        goto err;
    }
    int one = 1;
    (void)setsockopt(l->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(l->lfd, (struct sockaddr *)&ss, sl) != 0 || listen(l->lfd, 1024) != 0) {
        int err = errno;
        st = ote_status_make(err == EADDRINUSE ? OTE_ERR_BUSY : OTE_ERR_NATIVE, err);
        OTE_ERROR("engine", "cannot listen on %s: %s", cfg->listen_address, strerror(err));
        goto err;
    }
    struct sockaddr_storage bound;
    socklen_t bl = sizeof(bound);
    if (getsockname(l->lfd, (struct sockaddr *)&bound, &bl) != 0) {
        st = ote_status_from_errno(errno);
        goto err;
    }
    st = compute_address(cfg, &bound, e->self_addr, sizeof(e->self_addr));
    if (st != OTE_OK) {
        OTE_ERROR("engine", "advertise_address \"%s\" is not usable: %s", cfg->advertise_address,
                  ote_status_str(st));
        goto err;
    }
    for (size_t i = 0; i < OTE__LISTEN_MAX_HS; i++) l->hs[i].fd = -1;
    *out = l;
    return OTE_OK;
err:
    if (l->lfd >= 0) close(l->lfd);
    close(l->wake_fd);
    ote_mutex_destroy(&l->mu);
    ote_free(l);
    e->self_addr[0] = '\0';
    return st;
}

void ote__listen_release(ote__listen_t *l) { atomic_fetch_sub(&l->held, 1); }

/* Rate-limited WARN of the acceptor: at most one line per LISTEN_LOG_EVERY_NS. */
static void accept_warn(ote__listen_t *l, const char *what, int err) {
    uint64_t now = ote_now_ns();
    if (l->log_ns != 0 && now - l->log_ns < LISTEN_LOG_EVERY_NS) {
        l->quiet++;
        return;
    }
    OTE_WARN("engine", "%s%s%s (%llu similar event(s) not logged in the last second)", what,
             err ? ": " : "", err ? strerror(err) : "", (unsigned long long)l->quiet);
    l->log_ns = now;
    l->quiet = 0;
}

/* The ERROR that refuses a HELLO for a transport this engine does not serve. */
static void refuse(int fd, const ote_ctl_msg_t *hello, const char *from, const char *why,
                   ote_deadline_t dl) {
    uint16_t ver = hello->version; /* a version the peer reads */
    (void)ote_ctl_negotiate(hello, OTE_CTL_VERSION_MIN, OTE_CTL_VERSION_MAX, &ver);
    OTE_LOG_LIMITED(OTE_LOG_WARN, "engine", "connection from %s (%.*s): %s: refused", from,
                    (int)hello->u.hello.addr_len, hello->u.hello.addr, why);
    ote_ctl_msg_t m;
    memset(&m, 0, sizeof(m));
    m.version = ver;
    m.opcode = OTE_CTL_ERROR;
    m.req_id = hello->req_id;
    m.status = OTE_ERR_UNSUPPORTED;
    m.u.error.min_version = OTE_CTL_VERSION_MIN;
    m.u.error.max_version = OTE_CTL_VERSION_MAX;
    m.u.error.text = why;
    m.u.error.text_len = (uint32_t)strlen(why);
    uint8_t buf[OTE_CTL_HDR_LEN + 4 + OTE_CTL_MAX_TEXT];
    size_t len = 0;
    if (ote_ctl_encode(&m, buf, sizeof(buf), &len) == OTE_OK)
        (void)ote_ctl_send_all(fd, buf, len, dl);
}

/* The transport a HELLO role names, or NULL with why filled. Only a transport of the
 * engine's list is handed a connection (the tcp an shm-only engine creates answers INFO
 * and BUFS_REQ only). */
static ote__transport_t *route(ote_engine_t *e, uint16_t role, const char **name_out, char *why,
                               size_t cap) {
    const char *want = role == OTE_CTL_ROLE_TCP ? "tcp" : role == OTE_CTL_ROLE_RDMA ? "rdma" : NULL;
    if (role == OTE_CTL_ROLE_INFO) {
        *name_out = e->tpnames[0]; /* the listener transport answers INFO and BUFS_REQ */
        return e->tps[0];
    }
    if (want == NULL) {
        snprintf(why, cap, "HELLO role %u names no transport (this engine serves transports=%s)",
                 role, e->cfg.transports);
        return NULL;
    }
    for (size_t i = 0; i < e->ntps; i++)
        if (strcmp(e->tpnames[i], want) == 0 && e->tps[i]->ops->adopt != NULL &&
            ote_list_has(e->cfg.transports, want)) {
            *name_out = e->tpnames[i];
            return e->tps[i];
        }
    snprintf(why, cap, "this engine does not serve transport %s (transports=%s)", want,
             e->cfg.transports);
    return NULL;
}

/* The first frame, read exactly (its header, then the body it announces, bounded by
 * LISTEN_HELLO_MAX): OTE_OK with *m decoded from hb and *len_out its bytes; otherwise
 * logged (ERROR for bytes that are no frame, WARN for an oversized one or the deadline)
 * and the caller closes. */
static ote_status_t read_hello(int fd, const hs_t *h, uint64_t timeout_ms, uint8_t *hb,
                               ote_ctl_msg_t *m, size_t *len_out, ote_deadline_t dl) {
    size_t used = 0;
    ote_status_t st = ote_ctl_recv_all(fd, hb, OTE_CTL_HDR_LEN, dl);
    if (st == OTE_OK) {
        st = ote_ctl_decode(hb, OTE_CTL_HDR_LEN, m, &used); /* a bad header fails here */
        if (st == OTE_ERR_AGAIN) {
            uint32_t body = ote_le_get32(hb + 20); /* the header's length field */
            if (body > LISTEN_HELLO_MAX - OTE_CTL_HDR_LEN) {
                OTE_LOG_LIMITED(OTE_LOG_WARN, "control",
                                "frame from %s larger than %u bytes before the handshake: "
                                "closing connection",
                                h->from, (unsigned)LISTEN_HELLO_MAX);
                return OTE_ERR_PROTOCOL;
            }
            st = ote_ctl_recv_all(fd, hb + OTE_CTL_HDR_LEN, body, dl);
            if (st == OTE_OK) {
                st = ote_ctl_decode(hb, OTE_CTL_HDR_LEN + body, m, &used);
                if (st == OTE_ERR_AGAIN) st = OTE_ERR_PROTOCOL;
            }
        } else if (st == OTE_OK) {
            used = OTE_CTL_HDR_LEN;
        }
        if (st == OTE_OK) {
            *len_out = used;
            return OTE_OK;
        }
    }
    int code = ote_status_code(st);
    /* One line per second at most of each kind: every connection can cause one. */
    if (code == OTE_ERR_TIMEOUT)
        OTE_LOG_LIMITED(OTE_LOG_WARN, "engine",
                        "connection from %s did not complete its handshake within %llu ms: "
                        "closing",
                        h->from, (unsigned long long)timeout_ms);
    else if (code == OTE_ERR_PEER_LOST)
        OTE_LOG_LIMITED(OTE_LOG_DEBUG, "engine", "connection from %s closed before its HELLO",
                        h->from);
    else
        OTE_LOG_LIMITED(OTE_LOG_ERROR, "control", "malformed frame from %s: %s; closing connection",
                        h->from, ote_status_str(st));
    return st;
}

/* No version in common: the ERROR (OTE_ERR_VERSION, this engine's range) in the HELLO's
 * own version, logged. */
static void refuse_version(int fd, const ote_ctl_msg_t *hello, const char *from,
                           ote_deadline_t dl) {
    OTE_LOG_LIMITED(OTE_LOG_WARN, "control",
                    "protocol version mismatch: peer %.*s speaks versions %u..%u, this engine "
                    "%u..%u: refusing the connection from %s",
                    (int)hello->u.hello.addr_len, hello->u.hello.addr, hello->u.hello.min_version,
                    hello->u.hello.max_version, OTE_CTL_VERSION_MIN, OTE_CTL_VERSION_MAX, from);
    char text[96];
    int tl = snprintf(text, sizeof(text), "protocol version mismatch: source speaks %u..%u",
                      OTE_CTL_VERSION_MIN, OTE_CTL_VERSION_MAX);
    ote_ctl_msg_t m;
    memset(&m, 0, sizeof(m));
    m.version = hello->version;
    m.opcode = OTE_CTL_ERROR;
    m.req_id = hello->req_id;
    m.status = OTE_ERR_VERSION;
    m.u.error.min_version = OTE_CTL_VERSION_MIN;
    m.u.error.max_version = OTE_CTL_VERSION_MAX;
    m.u.error.text = text;
    m.u.error.text_len = (uint32_t)tl;
    uint8_t buf[OTE_CTL_HDR_LEN + 4 + 128];
    size_t len = 0;
    if (ote_ctl_encode(&m, buf, sizeof(buf), &len) == OTE_OK)
        (void)ote_ctl_send_all(fd, buf, len, dl);
}

static int addr_printable(const char *a, uint32_t len) {
    for (uint32_t i = 0; i < len; i++)
        if ((unsigned char)a[i] < 0x21 || (unsigned char)a[i] > 0x7e) return 0;
    return 1;
}

static void hs_finish(hs_t *h, int fd) {
    ote__listen_t *l = h->l;
    ote_mutex_lock(&l->mu);
    h->fd = -1;
    ote_mutex_unlock(&l->mu);
    if (fd >= 0) {
        close(fd);
        ote__listen_release(l);
    }
    ote_mutex_lock(&l->mu);
    h->done = 1;
    ote_mutex_unlock(&l->mu);
}

static void *hs_main(void *arg) {
    hs_t *h = arg;
    ote__listen_t *l = h->l;
    ote_engine_t *e = l->e;
    int fd = h->fd; /* stays valid: only this thread closes it or hands it over */
    uint64_t limit = ote__cfg_handshake_ms(&e->cfg) * OTE_NSEC_PER_MSEC;
    ote_deadline_t dl = h->born + limit;
    uint8_t hb[LISTEN_HELLO_MAX];
    ote_ctl_msg_t m;
    size_t hlen = 0; /* exactly the frame */
    ote_status_t st = read_hello(fd, h, ote__cfg_handshake_ms(&e->cfg), hb, &m, &hlen, dl);
    if (st != OTE_OK) {
        hs_finish(h, fd);
        return NULL;
    }
    if (m.opcode != OTE_CTL_HELLO) {
        OTE_LOG_LIMITED(OTE_LOG_WARN, "control",
                        "connection from %s began with %s instead of HELLO: closing", h->from,
                        ote_ctl_opcode_str(m.opcode));
        hs_finish(h, fd);
        return NULL;
    }
    /* The HELLO's address ("host:port") is logged here and by the transports: printable
     * ASCII only, so that a peer cannot forge log lines with it. */
    if (!addr_printable(m.u.hello.addr, m.u.hello.addr_len)) {
        OTE_LOG_LIMITED(OTE_LOG_WARN, "control",
                        "connection from %s: HELLO address with unprintable bytes: closing",
                        h->from);
        hs_finish(h, fd);
        return NULL;
    }
    char why[OTE_CTL_MAX_TEXT / 4];
    const char *tname = NULL;
    ote__transport_t *tp = route(e, m.u.hello.role, &tname, why, sizeof(why));
    if (e->auth_key != NULL) {
        uint8_t buf[OTE_CTL_HDR_LEN + 4 + OTE_CTL_MAX_TEXT];
        ote_auth_sock_t as = {fd, buf, sizeof(buf), dl};
        ote_auth_io_t io = ote_auth_sock_io(&as);
        ote_auth_peer_t peer;
        ote_auth_peer_of_fd(e->auth_key, fd, &peer);
        if (ote_auth_source(e->auth_key, &m, &io, tname ? tname : "engine", &peer) != OTE_OK) {
            hs_finish(h, fd);
            return NULL;
        }
    }
    uint16_t ver = 0;
    if (ote_ctl_negotiate(&m, OTE_CTL_VERSION_MIN, OTE_CTL_VERSION_MAX, &ver) != OTE_OK) {
        refuse_version(fd, &m, h->from, dl);
        hs_finish(h, fd);
        return NULL;
    }
    if (tp == NULL || atomic_load(&l->stop)) {
        if (tp == NULL) refuse(fd, &m, h->from, why, dl);
        hs_finish(h, fd);
        return NULL;
    }
    ote_mutex_lock(&l->mu);
    h->fd = -1; /* the transport's from here (stop no longer shuts it down) */
    ote_mutex_unlock(&l->mu);
    /* adopt takes fd whatever it answers; on failure it has closed it. */
    st = tp->ops->adopt(tp, fd, h->from, hb, hlen);
    if (st != OTE_OK) {
        OTE_LOG_LIMITED(OTE_LOG_WARN, "engine",
                        "transport %s could not take the connection from %s: %s", tname, h->from,
                        ote_status_str(st));
        ote__listen_release(l);
    }
    hs_finish(h, -1);
    return NULL;
}

/* Under l->mu: join the handshake threads that have returned. */
static void reap_locked(ote__listen_t *l) {
    for (size_t i = 0; i < OTE__LISTEN_MAX_HS; i++) {
        hs_t *h = &l->hs[i];
        if (!h->used || !h->done) continue;
        (void)pthread_join(h->th, NULL);
        h->used = 0;
        h->done = 0;
    }
}

static void accept_one(ote__listen_t *l, int fd, const struct sockaddr_storage *ss, socklen_t sl) {
    ote_engine_t *e = l->e;
    ote_auth_addr_t from;
    ote_auth_addr_of_sockaddr((const struct sockaddr *)ss, sl, &from);
    if (ote_auth_backoff(e->auth_key, &from)) { /* failed too often: not a byte */
        close(fd);
        return;
    }
    if (atomic_load(&l->held) >= e->cfg.tcp_max_accepted) {
        accept_warn(l, "tcp_max_accepted connections reached: closing a new connection", 0);
        close(fd);
        return;
    }
    if (from.kind == 6) memset(from.b + 8, 0, 8); /* one /64 is one peer here */
    ote_mutex_lock(&l->mu);
    reap_locked(l);
    hs_t *h = NULL;
    size_t same = 0, busy = 0; /* handshakes in flight: from this address, in all */
    for (size_t i = 0; i < OTE__LISTEN_MAX_HS; i++) {
        if (!l->hs[i].used) {
            if (h == NULL) h = &l->hs[i];
            continue;
        }
        busy++;
        if (memcmp(&l->hs[i].addr, &from, sizeof(from)) == 0) same++;
    }
    if (same >= OTE__LISTEN_MAX_HS_PER_ADDR && busy >= OTE__LISTEN_MAX_HS / 2) {
        ote_mutex_unlock(&l->mu);
        char what[192], who[64];
        ote_auth_addr_str(&from, who, sizeof(who));
        snprintf(what, sizeof(what),
                 "too many connections from one address in their handshake (%s%s has %zu): "
                 "closing a new one",
                 who, from.kind == 6 ? "/64" : "", same);
        accept_warn(l, what, 0);
        close(fd);
        return;
    }
    if (h == NULL) {
        ote_mutex_unlock(&l->mu);
        accept_warn(l, "too many connections in their handshake: closing a new connection", 0);
        close(fd);
        return;
    }
    h->l = l;
    h->fd = fd;
    h->done = 0;
    h->born = ote_now_ns();
    h->addr = from;
    if (ote__addr_format((const struct sockaddr *)ss, h->from, sizeof(h->from)) != OTE_OK)
        snprintf(h->from, sizeof(h->from), "?");
    atomic_fetch_add(&l->held, 1);
    pthread_attr_t attr;
    int rc = pthread_attr_init(&attr);
    if (rc == 0) {
        (void)pthread_attr_setstacksize(&attr, LISTEN_HS_STACK);
        rc = ote_thread_create(&h->th, &attr, hs_main, h);
        pthread_attr_destroy(&attr);
    }
    if (rc != 0) {
        h->fd = -1;
        ote_mutex_unlock(&l->mu);
        atomic_fetch_sub(&l->held, 1);
        close(fd);
        accept_warn(l, "cannot start a handshake thread: closing a new connection", rc);
        return;
    }
    h->used = 1;
    ote_mutex_unlock(&l->mu);
}

static void *acceptor_main(void *arg) {
    ote__listen_t *l = arg;
    while (!atomic_load(&l->stop)) {
        struct pollfd p[2] = {{.fd = l->lfd, .events = POLLIN},
                              {.fd = l->wake_fd, .events = POLLIN}};
        int n = poll(p, 2, LISTEN_POLL_MS);
        if (n <= 0 || (p[0].revents & POLLIN) == 0) continue; /* stop is looked at above */
        for (int k = 0; k < LISTEN_ACCEPT_BATCH && !atomic_load(&l->stop); k++) {
            struct sockaddr_storage ss;
            socklen_t sl = sizeof(ss);
            int fd = accept4(l->lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd >= 0) {
                accept_one(l, fd, &ss, sl);
                continue;
            }
            int err = errno;
            if (err == EINTR || err == ECONNABORTED || err == EPROTO) continue;
            if (err != EAGAIN && err != EWOULDBLOCK) {
                /* No fds or memory: the socket stays readable, so pause instead of
                 * spinning on it. */
                accept_warn(l, "accept failed, pausing accepts for 100 ms", err);
                struct timespec ts = {0, (long)LISTEN_PAUSE_NS};
                nanosleep(&ts, NULL);
            }
            break;
        }
    }
    return NULL;
}

ote_status_t ote__listen_start(ote__listen_t *l) {
    if (ote_thread_create(&l->th, NULL, acceptor_main, l) != 0) {
        OTE_ERROR("engine", "cannot start the listener thread of %s", l->e->self_addr);
        return OTE_ERR_NOMEM;
    }
    l->started = 1;
    OTE_INFO("engine", "listening on %s (advertised %s) for transports %s",
             l->e->cfg.listen_address, l->e->self_addr, l->e->cfg.transports);
    return OTE_OK;
}

void ote__listen_stop(ote__listen_t *l) {
    if (l == NULL) return;
    atomic_store(&l->stop, 1);
    if (l->wake_fd >= 0) {
        uint64_t one = 1;
        (void)!write(l->wake_fd, &one, sizeof(one)); /* an eventfd: never full here */
    }
    if (l->started) pthread_join(l->th, NULL);
    l->started = 0;
    /* Wake the handshakes (each waits on its socket, bounded by its deadline) and join
     * them; a socket already handed over is the transport's. */
    ote_mutex_lock(&l->mu);
    for (size_t i = 0; i < OTE__LISTEN_MAX_HS; i++)
        if (l->hs[i].used && l->hs[i].fd >= 0) (void)shutdown(l->hs[i].fd, SHUT_RDWR);
    ote_mutex_unlock(&l->mu);
    for (size_t i = 0; i < OTE__LISTEN_MAX_HS; i++) {
        hs_t *h = &l->hs[i];
        if (!h->used) continue;
        (void)pthread_join(h->th, NULL);
        h->used = 0;
    }
    if (l->lfd >= 0) close(l->lfd);
    l->lfd = -1;
    if (l->wake_fd >= 0) close(l->wake_fd);
    l->wake_fd = -1;
}

void ote__listen_free(ote__listen_t *l) {
    if (l == NULL) return;
    ote__listen_stop(l);
    ote_mutex_destroy(&l->mu);
    ote_free(l);
}

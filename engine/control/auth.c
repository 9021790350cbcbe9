/* engine/control/auth.c - the cluster key and the challenge-response (see auth.h). All
 * cryptography is libsodium's: HMAC-SHA-256, SHA-256, randombytes, constant-time compare,
 * guarded key memory. */
#include "engine/control/auth.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/log.h"
#include "base/time.h"
#include "engine/control/sock.h"

/* The key bytes live in sodium_malloc memory (locked, guard pages, zeroed by
 * sodium_free), not in base/alloc.h's heap: the key must not be swapped or left behind. */
struct ote_auth_key {
    unsigned char *bytes;
    size_t len;
    ote_auth_limit_t *limit; /* the engine's back-off table (auth_limit.h) */
};

static _Atomic uint64_t g_failures;

static ote_status_t key_read(int fd, const char *path, ote_auth_key_t *k) {
    struct stat sb;
    if (fstat(fd, &sb) != 0) return ote_status_from_errno(errno);
    if (!S_ISREG(sb.st_mode)) {
        OTE_ERROR("engine", "auth_key_file %s: not a regular file (%s): refused", path,
                  S_ISDIR(sb.st_mode)    ? "a directory"
                  : S_ISFIFO(sb.st_mode) ? "a FIFO"
                  : S_ISSOCK(sb.st_mode) ? "a socket"
                                         : "a device");
        return OTE_ERR_ACCESS;
    }
    if ((sb.st_mode & 077) != 0) {
        OTE_ERROR("engine",
                  "auth_key_file %s: mode %04o: the key file must be a regular file that "
                  "group and others can neither read nor write (chmod 600)",
                  path, (unsigned)(sb.st_mode & 07777));
        return OTE_ERR_ACCESS;
    }
    if (sb.st_size < (off_t)OTE_AUTH_KEY_MIN || sb.st_size > (off_t)OTE_AUTH_KEY_MAX) {
        OTE_ERROR("engine", "auth_key_file %s: %lld bytes: a key has %u to %u bytes", path,
                  (long long)sb.st_size, OTE_AUTH_KEY_MIN, OTE_AUTH_KEY_MAX);
        return OTE_ERR_INVALID;
    }
    k->len = (size_t)sb.st_size;
    k->bytes = sodium_malloc(k->len);
    if (k->bytes == NULL) return OTE_ERR_NOMEM;
    size_t got = 0;
    while (got < k->len) {
        ssize_t r = read(fd, k->bytes + got, k->len - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int err = r < 0 ? errno : EIO;
            OTE_ERROR("engine", "auth_key_file %s: read failed: %s", path, strerror(err));
            sodium_free(k->bytes);
            k->bytes = NULL;
            return ote_status_make(OTE_ERR_IO, err);
        }
        got += (size_t)r;
    }
    return OTE_OK;
}

ote_status_t ote_auth_key_load(const char *path, ote_auth_key_t **key_out) {
    if (path == NULL || path[0] == '\0' || key_out == NULL) return OTE_ERR_INVALID;
    if (sodium_init() < 0) {
        OTE_ERROR("engine", "libsodium failed to initialize: no authentication possible");
        return OTE_ERR_NATIVE;
    }
    /* O_NONBLOCK: opening a FIFO (or a device) must not wait for a writer. Every check
     * below is made on this fd, so a path swapped after the open changes nothing. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        int err = errno;
        OTE_ERROR("engine", "auth_key_file %s: %s", path, strerror(err));
        return err == ENOENT ? OTE_ERR_NOT_FOUND : ote_status_from_errno(err);
    }
    ote_auth_key_t *k = ote_calloc(1, sizeof(*k));
    ote_status_t st = k ? key_read(fd, path, k) : OTE_ERR_NOMEM;
    close(fd);
    if (st == OTE_OK) {
        ote_auth_limit_cfg_t lc;
        ote__auth_limit_engine_cfg(&lc);
        st = ote_auth_limit_create(&lc, &k->limit);
        if (st != OTE_OK) sodium_free(k->bytes);
    }
    if (st != OTE_OK) {
        ote_free(k);
        return st;
    }
    *key_out = k;
    return OTE_OK;
}

void ote_auth_key_free(ote_auth_key_t *key) {
    if (key == NULL) return;
    sodium_free(key->bytes); /* zeroes before it unmaps */
    ote_auth_limit_destroy(key->limit);
    ote_free(key);
}

ote_auth_limit_t *ote_auth_key_limit(const ote_auth_key_t *key) {
    return key != NULL ? key->limit : NULL;
}

int ote_auth_backoff(const ote_auth_key_t *key, const ote_auth_addr_t *a) {
    return key != NULL && ote_auth_limit_refuse(key->limit, a, ote_now_ns());
}

void ote_auth_bind(ote_auth_t *a, const char *context, const void *hello, size_t len) {
    crypto_hash_sha256_state h;
    crypto_hash_sha256_init(&h);
    crypto_hash_sha256_update(&h, (const unsigned char *)context, strlen(context) + 1);
    crypto_hash_sha256_update(&h, hello, len);
    crypto_hash_sha256_final(&h, a->th);
    sodium_memzero(a->nc, sizeof(a->nc));
    sodium_memzero(a->ns, sizeof(a->ns));
    sodium_memzero(a->mac, sizeof(a->mac));
}

ote_status_t ote_auth_bind_hello(ote_auth_t *a, const ote_ctl_msg_t *hello) {
    uint8_t buf[OTE_CTL_HDR_LEN + OTE_CTL_MAX_HELLO_BODY];
    size_t len = 0;
    if (hello->opcode != OTE_CTL_HELLO || ote_ctl_encode(hello, buf, sizeof(buf), &len) != OTE_OK)
        return OTE_ERR_INVALID;
    ote_auth_bind(a, "ctl", buf, len);
    return OTE_OK;
}

/* MAC(label, th, nc, ns) with the cluster key. */
static void mac_of(const ote_auth_key_t *key, const ote_auth_t *a, const char *label,
                   uint8_t *out) {
    static const char prefix[] = "OrbitTE auth v1";
    crypto_auth_hmacsha256_state s;
    crypto_auth_hmacsha256_init(&s, key->bytes, key->len);
    crypto_auth_hmacsha256_update(&s, (const unsigned char *)prefix, sizeof(prefix));
    crypto_auth_hmacsha256_update(&s, (const unsigned char *)label, strlen(label) + 1);
    crypto_auth_hmacsha256_update(&s, a->th, sizeof(a->th));
    crypto_auth_hmacsha256_update(&s, a->nc, sizeof(a->nc));
    crypto_auth_hmacsha256_update(&s, a->ns, sizeof(a->ns));
    crypto_auth_hmacsha256_final(&s, out);
    sodium_memzero(&s, sizeof(s));
}

void ote_auth_challenge(ote_auth_t *a) { randombytes_buf(a->ns, sizeof(a->ns)); }

void ote_auth_prove(ote_auth_t *a, const ote_auth_key_t *key, const uint8_t *ns) {
    memcpy(a->ns, ns, sizeof(a->ns));
    randombytes_buf(a->nc, sizeof(a->nc));
    mac_of(key, a, "requester", a->mac);
}

ote_status_t ote_auth_check_proof(ote_auth_t *a, const ote_auth_key_t *key, const uint8_t *nc,
                                  const uint8_t *mac) {
    uint8_t want[OTE_AUTH_LEN];
    memcpy(a->nc, nc, sizeof(a->nc));
    mac_of(key, a, "requester", want);
    int ok = sodium_memcmp(want, mac, sizeof(want)) == 0;
    sodium_memzero(want, sizeof(want));
    if (!ok) return OTE_ERR_AUTH;
    mac_of(key, a, "source", a->mac);
    return OTE_OK;
}

ote_status_t ote_auth_check_ok(const ote_auth_t *a, const ote_auth_key_t *key, const uint8_t *mac) {
    uint8_t want[OTE_AUTH_LEN];
    mac_of(key, a, "source", want);
    int ok = sodium_memcmp(want, mac, sizeof(want)) == 0;
    sodium_memzero(want, sizeof(want));
    return ok ? OTE_OK : OTE_ERR_AUTH;
}

void ote_auth_frame(ote_ctl_msg_t *m, uint16_t step, const uint8_t *nonce, const uint8_t *mac) {
    memset(m, 0, sizeof(*m));
    m->version = OTE_CTL_AUTH_VERSION;
    m->opcode = OTE_CTL_AUTH;
    m->u.auth.step = step;
    m->u.auth.nonce = nonce;
    m->u.auth.mac = mac;
}

void ote_auth_failed(const char *transport, const ote_auth_peer_t *peer, const char *why) {
    atomic_fetch_add(&g_failures, 1);
    OTE_WARN_LIMITED(transport, "authentication of %s failed: %s; connection closed", peer->name,
                     why);
    ote_auth_limit_fail(peer->limit, transport, &peer->addr, ote_now_ns());
}

void ote_auth_succeeded(const ote_auth_peer_t *peer) {
    ote_auth_limit_ok(peer->limit, &peer->addr);
}

uint64_t ote_auth_failures(void) { return atomic_load(&g_failures); }

void ote_auth_peer_of_fd(const ote_auth_key_t *key, int fd, ote_auth_peer_t *out) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char h[INET6_ADDRSTRLEN];
    memset(out, 0, sizeof(*out));
    out->limit = ote_auth_key_limit(key);
    snprintf(out->name, sizeof(out->name), "?");
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) != 0) return;
    ote_auth_addr_of_sockaddr((const struct sockaddr *)&ss, sl, &out->addr);
    if (ss.ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
        if (inet_ntop(AF_INET, &a->sin_addr, h, sizeof(h)))
            snprintf(out->name, sizeof(out->name), "%s:%u", h, ntohs(a->sin_port));
    } else if (ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&ss;
        if (inet_ntop(AF_INET6, &a->sin6_addr, h, sizeof(h)))
            snprintf(out->name, sizeof(out->name), "[%s]:%u", h, ntohs(a->sin6_port));
    }
}

void ote_auth_peer_of_uid(const ote_auth_key_t *key, uid_t uid, pid_t pid, ote_auth_peer_t *out) {
    memset(out, 0, sizeof(*out));
    out->limit = ote_auth_key_limit(key);
    ote_auth_addr_of_uid(uid, &out->addr);
    snprintf(out->name, sizeof(out->name), "pid %d (uid %u)", (int)pid, (unsigned)uid);
}

void ote_auth_refusal(ote_ctl_msg_t *m, const char *text) {
    memset(m, 0, sizeof(*m));
    m->version = OTE_CTL_AUTH_VERSION;
    m->opcode = OTE_CTL_ERROR;
    m->status = OTE_ERR_AUTH;
    m->u.error.min_version = OTE_CTL_VERSION_MIN;
    m->u.error.max_version = OTE_CTL_VERSION_MAX;
    m->u.error.text = text;
    m->u.error.text_len = (uint32_t)strlen(text);
}

/* Tell the peer why before closing (best effort). */
static void send_refusal(const ote_auth_io_t *io, const char *text) {
    ote_ctl_msg_t e;
    ote_auth_refusal(&e, text);
    (void)io->send(io->arg, &e);
}

ote_status_t ote_auth_requester(const ote_auth_key_t *key, const ote_ctl_msg_t *hello,
                                const ote_auth_io_t *io, const char *peer, ote_ctl_msg_t *ack_out) {
    ote_ctl_msg_t m;
    ote_status_t st = io->recv(io->arg, &m);
    if (st != OTE_OK) return st;
    int challenged = m.opcode == OTE_CTL_AUTH;
    if (!challenged) {
        if (key != NULL && m.opcode == OTE_CTL_HELLO_ACK) {
            OTE_WARN("engine",
                     "peer %s does not authenticate (it has no auth_key_file) while this engine "
                     "has a key: refusing it",
                     peer);
            send_refusal(io, "the requester requires authentication: configure auth_key_file");
            return OTE_ERR_AUTH;
        }
        if (m.opcode == OTE_CTL_ERROR && ote_status_code(m.status) == OTE_ERR_AUTH)
            OTE_WARN("engine", "peer %s refused authentication: %.*s", peer,
                     (int)m.u.error.text_len, m.u.error.text);
        *ack_out = m;
        return OTE_OK;
    }
    if (m.u.auth.step != OTE_CTL_AUTH_CHALLENGE) return OTE_ERR_PROTOCOL;
    if (key == NULL) {
        OTE_WARN("engine",
                 "peer %s requires authentication and this engine has no key: set "
                 "auth_key_file (OTE_AUTH_KEY_FILE) to the cluster's key file",
                 peer);
        send_refusal(io, "the requester has no key (auth_key_file)");
        return OTE_ERR_AUTH;
    }
    ote_auth_t a;
    st = ote_auth_bind_hello(&a, hello);
    if (st != OTE_OK) return st;
    ote_auth_prove(&a, key, m.u.auth.nonce);
    ote_ctl_msg_t p;
    ote_auth_frame(&p, OTE_CTL_AUTH_PROOF, a.nc, a.mac);
    st = io->send(io->arg, &p);
    if (st == OTE_OK) st = io->recv(io->arg, &m);
    if (st != OTE_OK) return st;
    if (m.opcode == OTE_CTL_ERROR && ote_status_code(m.status) == OTE_ERR_AUTH) {
        OTE_WARN("engine", "peer %s refused this engine's key: %.*s", peer, (int)m.u.error.text_len,
                 m.u.error.text);
        return OTE_ERR_AUTH;
    }
    if (m.opcode != OTE_CTL_AUTH || m.u.auth.step != OTE_CTL_AUTH_OK) return OTE_ERR_PROTOCOL;
    if (ote_auth_check_ok(&a, key, m.u.auth.mac) != OTE_OK) {
        OTE_WARN("engine", "peer %s failed to prove the cluster key: closing", peer);
        return OTE_ERR_AUTH;
    }
    st = io->recv(io->arg, &m);
    if (st == OTE_OK) *ack_out = m;
    return st;
}

int ote_auth_hello_ok(const ote_ctl_msg_t *hello, ote_ctl_msg_t *refusal) {
    if (hello->u.hello.max_version >= OTE_CTL_AUTH_VERSION) return 1;
    ote_auth_refusal(refusal, "this engine requires authentication (protocol version 3)");
    refusal->version = hello->version; /* in a version the peer reads */
    refusal->req_id = hello->req_id;
    return 0;
}

ote_status_t ote_auth_source(const ote_auth_key_t *key, const ote_ctl_msg_t *hello,
                             const ote_auth_io_t *io, const char *transport,
                             const ote_auth_peer_t *peer) {
    ote_ctl_msg_t m;
    if (!ote_auth_hello_ok(hello, &m)) {
        ote_auth_failed(transport, peer, "its versions do not reach authentication");
        (void)io->send(io->arg, &m);
        return OTE_ERR_AUTH;
    }
    ote_auth_t a;
    ote_status_t st = ote_auth_bind_hello(&a, hello);
    if (st != OTE_OK) return st;
    ote_auth_challenge(&a);
    ote_auth_frame(&m, OTE_CTL_AUTH_CHALLENGE, a.ns, NULL);
    st = io->send(io->arg, &m);
    if (st == OTE_OK) st = io->recv(io->arg, &m);
    if (st != OTE_OK) {
        ote_auth_failed(transport, peer, "no proof before the deadline or the peer left");
        return OTE_ERR_AUTH;
    }
    if (m.opcode != OTE_CTL_AUTH || m.u.auth.step != OTE_CTL_AUTH_PROOF) {
        int nokey = m.opcode == OTE_CTL_ERROR && ote_status_code(m.status) == OTE_ERR_AUTH;
        ote_auth_failed(transport, peer, nokey ? "it has no key" : "a frame other than its proof");
        return OTE_ERR_AUTH;
    }
    if (ote_auth_check_proof(&a, key, m.u.auth.nonce, m.u.auth.mac) != OTE_OK) {
        ote_auth_failed(transport, peer, "wrong key"); /* counted before the peer hears */
        send_refusal(io, "authentication failed: wrong key");
        return OTE_ERR_AUTH;
    }
    ote_auth_succeeded(peer); /* proved the key: its address leaves the back-off table */
    ote_auth_frame(&m, OTE_CTL_AUTH_OK, NULL, a.mac);
    return io->send(io->arg, &m);
}

static ote_status_t sock_send(void *arg, const ote_ctl_msg_t *m) {
    ote_auth_sock_t *s = arg;
    uint8_t buf[OTE_CTL_HDR_LEN + 4 + OTE_CTL_MAX_TEXT];
    size_t len = 0;
    ote_status_t st = ote_ctl_encode(m, buf, sizeof(buf), &len);
    return st == OTE_OK ? ote_ctl_send_all(s->fd, buf, len, s->dl) : st;
}

static ote_status_t sock_recv(void *arg, ote_ctl_msg_t *m) {
    ote_auth_sock_t *s = arg;
    return ote_ctl_recv_frame(s->fd, s->buf, s->cap, m, s->dl);
}

ote_auth_io_t ote_auth_sock_io(ote_auth_sock_t *s) {
    ote_auth_io_t io = {sock_send, sock_recv, s};
    return io;
}

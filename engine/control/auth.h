/*
 * engine/control/auth.h - the cluster key and the mutual challenge-response that every
 * connection to an engine's listener (TCP data connections, the RDMA transport's control
 * connection, the router's INFO handshake, buffer discovery) and to its shm socket runs
 * before anything else, when the engine has a key (config auth_key_file).
 *
 * The key: every byte of a regular file that only its owner may read or write (mode
 * & 077 == 0, checked with fstat on the opened descriptor), at least OTE_AUTH_KEY_MIN and
 * at most OTE_AUTH_KEY_MAX bytes, used as it is (raw bytes; e.g. `head -c 32
 * /dev/urandom`). It lives in memory from libsodium's sodium_malloc (locked, guarded,
 * zeroed when freed).
 *
 * The exchange, over a HELLO the requester sent (its canonical bytes are bound in `th`,
 * the SHA-256 of a context label and the HELLO):
 *
 *   source    -> requester  CHALLENGE  ns (32 random bytes)
 *   requester -> source     PROOF      nc (32 random bytes), MAC("requester", th, nc, ns)
 *   source    -> requester  OK         MAC("source", th, nc, ns)
 *
 * MAC(label, ...) is HMAC-SHA-256 keyed by the cluster key over a fixed prefix, the label
 * and the rest; both MACs are checked in constant time. A recorded PROOF does not check
 * on another connection (another ns), an OK does not pass as a PROOF (another label), and
 * a PROOF is bound to the HELLO's fields (role, connection index, session, address).
 *
 * The key protects who may connect and issue requests; it does not encrypt anything.
 */
#ifndef OTE_ENGINE_CONTROL_AUTH_H
#define OTE_ENGINE_CONTROL_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "base/time.h"
#include "engine/control/auth_limit.h"
#include "engine/control/ctl.h"

#ifdef __cplusplus
extern "C" {
#endif

#define OTE_AUTH_KEY_MIN 32u
#define OTE_AUTH_KEY_MAX 4096u
#define OTE_AUTH_LEN 32u /* nonces and MACs */

typedef struct ote_auth_key ote_auth_key_t;

/* Read the key file at path. The key carries the engine's back-off table of peers that
 * fail authentication (auth_limit.h; configuration ote__auth_limit_engine_cfg): an
 * engine without a key authenticates nobody and has nothing to limit. OTE_ERR_ACCESS (ERROR line naming the file and its mode)
 * when it is not a regular file or group/others may read or write it; OTE_ERR_INVALID
 * when its size is outside [OTE_AUTH_KEY_MIN, OTE_AUTH_KEY_MAX]; OTE_ERR_NOT_FOUND or the
 * errno of open/read; OTE_ERR_NOMEM. */
ote_status_t ote_auth_key_load(const char *path, ote_auth_key_t **key_out);
/* Zero and free, with its back-off table (NULL: nothing). */
void ote_auth_key_free(ote_auth_key_t *key);
/* The key's back-off table (key NULL: NULL). */
ote_auth_limit_t *ote_auth_key_limit(const ote_auth_key_t *key);
/* At accept, before anything is read or sent: 1 when the peer at `a` is in back-off and
 * the connection is to be closed at once (counted, ote_auth_refused), 0 otherwise (key
 * NULL: 0). */
int ote_auth_backoff(const ote_auth_key_t *key, const ote_auth_addr_t *a);

/* The state of one connection's exchange. */
typedef struct {
    uint8_t th[OTE_AUTH_LEN];  /* SHA-256 of the context label and the HELLO */
    uint8_t nc[OTE_AUTH_LEN];  /* the requester's nonce */
    uint8_t ns[OTE_AUTH_LEN];  /* the source's nonce */
    uint8_t mac[OTE_AUTH_LEN]; /* the MAC this side sends (PROOF or OK) */
} ote_auth_t;

/* Both sides: bind the exchange to the HELLO's bytes under a context label ("ctl" for a
 * control frame, "shm" for the shm transport's HELLO). */
void ote_auth_bind(ote_auth_t *a, const char *context, const void *hello, size_t len);
/* The same for a control-frame HELLO: its canonical encoding (ote_ctl_encode).
 * OTE_ERR_INVALID when it does not encode. */
ote_status_t ote_auth_bind_hello(ote_auth_t *a, const ote_ctl_msg_t *hello);
/* Source: draw ns (sent in CHALLENGE). */
void ote_auth_challenge(ote_auth_t *a);
/* Requester: take ns from the CHALLENGE, draw nc and compute its MAC into a->mac. */
void ote_auth_prove(ote_auth_t *a, const ote_auth_key_t *key, const uint8_t *ns);
/* Source: check the PROOF's nc and mac; on OTE_OK a->mac holds the source's MAC (sent in
 * OK). OTE_ERR_AUTH when it does not check. */
ote_status_t ote_auth_check_proof(ote_auth_t *a, const ote_auth_key_t *key, const uint8_t *nc,
                                  const uint8_t *mac);
/* Requester: check the OK's mac. OTE_ERR_AUTH when it does not check. */
ote_status_t ote_auth_check_ok(const ote_auth_t *a, const ote_auth_key_t *key, const uint8_t *mac);

/* An AUTH frame of `step` (nonce / mac may be NULL: zeros), in OTE_CTL_AUTH_VERSION. */
void ote_auth_frame(ote_ctl_msg_t *m, uint16_t step, const uint8_t *nonce, const uint8_t *mac);
/* The ERROR frame (OTE_ERR_AUTH, the text) that tells a peer why it is refused; text is
 * referenced, not copied. */
void ote_auth_refusal(ote_ctl_msg_t *m, const char *text);

/* The peer of a connection a source accepted: the back-off table its failures go to
 * (NULL: none), its source address and its name for logs. */
#define OTE_AUTH_PEER_NAME 64u
typedef struct {
    ote_auth_limit_t *limit;
    ote_auth_addr_t addr;
    char name[OTE_AUTH_PEER_NAME];
} ote_auth_peer_t;
/* From fd's peer (getpeername): name "ip:port" ("?" when unknown); limit: key's table. */
void ote_auth_peer_of_fd(const ote_auth_key_t *key, int fd, ote_auth_peer_t *out);
/* From an shm requester's credentials: name "pid P (uid U)", address its uid. */
void ote_auth_peer_of_uid(const ote_auth_key_t *key, uid_t uid, pid_t pid, ote_auth_peer_t *out);

/* A refused or failed authentication on a source: counted (ote_auth_failures), logged
 * at WARN, rate-limited, with the peer's name and why, and fed to the peer's back-off
 * table (ote_auth_limit_fail). */
void ote_auth_failed(const char *transport, const ote_auth_peer_t *peer, const char *why);
/* A successful authentication on a source: its address leaves the back-off table. */
void ote_auth_succeeded(const ote_auth_peer_t *peer);
/* The count of failed authentications of this process (tests read it). */
uint64_t ote_auth_failures(void);

/*
 * Blocking exchanges over a frame channel (a socket with sock.h's steps, or a transport's
 * own connection). recv returns the next frame; the message may point into a buffer the
 * channel reuses on the next recv.
 */
typedef struct {
    ote_status_t (*send)(void *arg, const ote_ctl_msg_t *m);
    ote_status_t (*recv)(void *arg, ote_ctl_msg_t *m);
    void *arg;
} ote_auth_io_t;

/*
 * Requester: the HELLO was sent; receive the answer and, when the source authenticates,
 * prove the key and check the source's proof. OTE_OK with *ack_out = the frame that
 * answers the HELLO (HELLO_ACK or ERROR, for ote_ctl_check_hello_ack); OTE_ERR_AUTH
 * (logged, naming peer) when the source asks for a key this engine lacks, when this
 * engine has a key and the source answered without authenticating (it is sent an ERROR
 * with OTE_ERR_AUTH), or when a proof does not check; a channel status otherwise.
 */
ote_status_t ote_auth_requester(const ote_auth_key_t *key, const ote_ctl_msg_t *hello,
                                const ote_auth_io_t *io, const char *peer, ote_ctl_msg_t *ack_out);

/*
 * Source with a key, after a well-formed HELLO: the whole exchange. OTE_OK when the
 * requester proved the key (OK sent, ote_auth_succeeded; the caller answers HELLO_ACK
 * next). Otherwise the
 * requester was sent an ERROR with OTE_ERR_AUTH where that applies, the failure is
 * counted and logged (ote_auth_failed) and the caller closes without reading more.
 */
ote_status_t ote_auth_source(const ote_auth_key_t *key, const ote_ctl_msg_t *hello,
                             const ote_auth_io_t *io, const char *transport,
                             const ote_auth_peer_t *peer);
/* Source with a key: whether a HELLO may authenticate (its versions reach
 * OTE_CTL_AUTH_VERSION); when not, *refusal is the ERROR to send before closing (text:
 * a static string). */
int ote_auth_hello_ok(const ote_ctl_msg_t *hello, ote_ctl_msg_t *refusal);

/* A channel over a socket: frames by ote_ctl_recv_frame into buf, bounded by dl. */
typedef struct {
    int fd;
    uint8_t *buf;
    size_t cap;
    ote_deadline_t dl;
} ote_auth_sock_t;
ote_auth_io_t ote_auth_sock_io(ote_auth_sock_t *s);

#ifdef __cplusplus
}
#endif
#endif

/*
 * engine/control/hello.h - the requester's side of the handshake, once for every
 * connection an engine opens to another engine's listener (a TCP data connection, the
 * RDMA transport's control connection, the router's and buffer discovery's INFO
 * connections): HELLO out, the cluster key's challenge-response when the source asks for
 * it (auth.h), the answer checked (ote_ctl_check_hello_ack), over whatever framing the
 * caller's channel has (ote_auth_io_t, bounded by the channel's own deadline).
 */
#ifndef OTE_ENGINE_CONTROL_HELLO_H
#define OTE_ENGINE_CONTROL_HELLO_H

#include <stdint.h>

#include "base/status.h"
#include "engine/control/auth.h"
#include "engine/control/ctl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What this engine says in its HELLO. */
typedef struct {
    uint16_t role;          /* OTE_CTL_ROLE_* */
    uint16_t conn_index;    /* a TCP data connection's index (0 otherwise) */
    uint64_t session;       /* a TCP requester's session (0 otherwise) */
    const char *addr;       /* the address the peer should name this engine by */
    const char *name;       /* this engine's name (engine_name), NULL or "": none */
    uint16_t frame_version; /* the HELLO frame's own version (0: OTE_CTL_VERSION_MAX) */
} ote_ctl_hello_t;

/* OTE_OK with *ack_out (its strings point into the channel's receive buffer) and
 * *version_out, the version the source chose. Every failure is logged once naming peer
 * (component "control"): an ERROR for a version mismatch (both sides' ranges) and for a
 * max_data outside [OTE_CTL_MIN_DATA, OTE_CTL_MAX_DATA], a WARN otherwise. Statuses:
 * OTE_ERR_AUTH (the keys do not match, or one side has none), OTE_ERR_VERSION,
 * OTE_ERR_TIMEOUT / OTE_ERR_PEER_LOST / OTE_ERR_CONNECT from the channel, OTE_ERR_NOMEM,
 * and OTE_ERR_PROTOCOL for an answer that is not an OrbitTE handshake's (garbage, another
 * frame, a HELLO_ACK in another version than the one it chose). */
ote_status_t ote_ctl_hello_exchange(const ote_auth_key_t *key, const ote_ctl_hello_t *h,
                                    const ote_auth_io_t *io, const char *peer,
                                    ote_ctl_msg_t *ack_out, uint16_t *version_out);

#ifdef __cplusplus
}
#endif
#endif

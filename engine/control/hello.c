/* engine/control/hello.c - the requester's side of the handshake (see hello.h). */
#include "engine/control/hello.h"

#include <string.h>

#include "base/log.h"

/* A failure of the exchange, logged once naming peer. */
static void log_failure(const char *peer, ote_status_t st, const ote_ctl_msg_t *ack, int answered) {
    if (answered && st == OTE_ERR_VERSION) {
        unsigned plo =
            ack->opcode == OTE_CTL_ERROR ? ack->u.error.min_version : ack->u.hello_ack.version;
        unsigned phi =
            ack->opcode == OTE_CTL_ERROR ? ack->u.error.max_version : ack->u.hello_ack.version;
        OTE_ERROR("control",
                  "protocol version mismatch with %s: this engine speaks versions %u..%u, the "
                  "peer %u..%u",
                  peer, OTE_CTL_VERSION_MIN, OTE_CTL_VERSION_MAX, plo, phi);
    } else if (answered && st == OTE_ERR_PROTOCOL && ack->opcode == OTE_CTL_HELLO_ACK &&
               (ack->u.hello_ack.max_data < OTE_CTL_MIN_DATA ||
                ack->u.hello_ack.max_data > OTE_CTL_MAX_DATA)) {
        OTE_ERROR("control", "%s advertises max_data %u, outside [%u, %u]: refusing the peer", peer,
                  ack->u.hello_ack.max_data, OTE_CTL_MIN_DATA, OTE_CTL_MAX_DATA);
    } else {
        OTE_WARN("control", "handshake with %s failed: %s", peer, ote_status_str(st));
    }
}

ote_status_t ote_ctl_hello_exchange(const ote_auth_key_t *key, const ote_ctl_hello_t *h,
                                    const ote_auth_io_t *io, const char *peer,
                                    ote_ctl_msg_t *ack_out, uint16_t *version_out) {
    ote_ctl_msg_t hello;
    memset(&hello, 0, sizeof(hello));
    hello.version = h->frame_version != 0 ? h->frame_version : OTE_CTL_VERSION_MAX;
    hello.opcode = OTE_CTL_HELLO;
    hello.u.hello.min_version = OTE_CTL_VERSION_MIN;
    hello.u.hello.max_version = OTE_CTL_VERSION_MAX;
    hello.u.hello.role = h->role;
    hello.u.hello.conn_index = h->conn_index;
    hello.u.hello.session = h->session;
    hello.u.hello.addr = h->addr;
    hello.u.hello.addr_len = (uint32_t)strlen(h->addr);
    if (h->name != NULL && h->name[0] != '\0') {
        hello.u.hello.name = h->name;
        hello.u.hello.name_len = (uint32_t)strlen(h->name);
    }
    ote_ctl_msg_t ack;
    memset(&ack, 0, sizeof(ack));
    ote_status_t st = io->send(io->arg, &hello);
    if (st == OTE_OK) st = ote_auth_requester(key, &hello, io, peer, &ack);
    int code = ote_status_code(st);
    /* The channel's own failures (and the key's) are what they are; anything else the
     * answer made go wrong is the peer not speaking the handshake. */
    if (st != OTE_OK && code != OTE_ERR_TIMEOUT && code != OTE_ERR_PEER_LOST &&
        code != OTE_ERR_CONNECT && code != OTE_ERR_AUTH && code != OTE_ERR_NOMEM)
        st = OTE_ERR_PROTOCOL;
    int answered = st == OTE_OK;
    uint16_t ver = 0;
    if (st == OTE_OK)
        st = ote_ctl_check_hello_ack(&ack, OTE_CTL_VERSION_MIN, OTE_CTL_VERSION_MAX, &ver);
    if (st == OTE_OK && ack.version != ver) st = OTE_ERR_PROTOCOL;
    if (st != OTE_OK) {
        if (ote_status_code(st) != OTE_ERR_AUTH) log_failure(peer, st, &ack, answered);
        return st;
    }
    *ack_out = ack;
    *version_out = ver;
    return OTE_OK;
}

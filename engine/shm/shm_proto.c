/*
 * engine/shm/shm_proto.c - the checks of the same-host transport's wire messages,
 * without I/O or connection state (shm_proto.h); fuzzed by engine/shm/fuzz_shm.c.
 */
#include "engine/shm/shm_proto.h"

#include <string.h>

#include "engine/control/ctl.h"

/* The header of a message of kind, n bytes long, copied out: 0, or -1. */
static int hdr_of(const void *b, size_t n, uint16_t kind, shm_hdr_t *h) {
    if (b == NULL || n < sizeof(*h)) return -1;
    memcpy(h, b, sizeof(*h));
    return h->magic == SHM_MAGIC && h->kind == kind ? 0 : -1;
}

int ote__shm_hello_decode(const void *b, size_t n, shm_hello_t *out) {
    shm_hdr_t h;
    if ((n != sizeof(*out) && n != SHM_HELLO_BASE_LEN) || hdr_of(b, n, SHM_HELLO, &h) != 0)
        return -1;
    shm_hello_t m;
    memset(&m, 0, sizeof(m));
    memcpy(&m, b, n);
    m.addr[sizeof(m.addr) - 1] = '\0';
    if (n == sizeof(m)) {
        size_t nl = strnlen(m.name, sizeof(m.name));
        if (nl > OTE_CTL_MAX_NAME) return -1; /* unterminated (an empty name: none) */
        for (size_t i = 0; i < nl; i++)
            if ((unsigned char)m.name[i] < 0x20 || (unsigned char)m.name[i] > 0x7e) return -1;
    }
    *out = m;
    return 0;
}

int ote__shm_auth_decode(const void *b, size_t n, uint16_t step, shm_auth_t *out) {
    shm_hdr_t h;
    shm_auth_t m;
    if (n != sizeof(m) || hdr_of(b, n, SHM_AUTH, &h) != 0) return -1;
    memcpy(&m, b, sizeof(m));
    if (m.step != step) return -1;
    *out = m;
    return 0;
}

int ote__shm_ack_decode(const void *b, size_t n, shm_hello_ack_t *out) {
    shm_hdr_t h;
    shm_hello_ack_t a;
    if (n != sizeof(a) || hdr_of(b, n, SHM_HELLO_ACK, &h) != 0) return -1;
    memcpy(&a, b, sizeof(a));
    a.text[sizeof(a.text) - 1] = '\0';
    if (a.status == OTE_OK && a.mode != SHM_MODE_CMA && a.mode != SHM_MODE_RING) return -1;
    *out = a;
    return 0;
}

static int count_of(const void *b, size_t n, uint16_t kind, size_t entry) {
    shm_hdr_t h;
    if (hdr_of(b, n, kind, &h) != 0 || h.version != SHM_VERSION || h.n > SHM_BATCH_MAX ||
        n != sizeof(h) + (size_t)h.n * entry)
        return -1;
    return (int)h.n;
}

int ote__shm_reqs_count(const void *b, size_t n) {
    return count_of(b, n, SHM_REQS, sizeof(shm_req_t));
}

int ote__shm_resps_count(const void *b, size_t n) {
    return count_of(b, n, SHM_RESPS, sizeof(shm_resp_t));
}

int ote__shm_offer_decode(const void *b, size_t n, shm_ipc_offer_t *out) {
    shm_hdr_t h;
    shm_ipc_offer_t o;
    if (n != sizeof(o) || hdr_of(b, n, SHM_IPC_OFFER, &h) != 0 || h.version != SHM_VERSION)
        return -1;
    memcpy(&o, b, sizeof(o));
    if (o.d.offset > o.d.size || (o.d.flags & ~OTE__IPC_VMM) != 0) return -1;
    *out = o;
    return 0;
}

int ote__shm_close_decode(const void *b, size_t n, shm_ipc_close_t *out) {
    shm_hdr_t h;
    if (n != sizeof(*out) || hdr_of(b, n, SHM_IPC_CLOSE, &h) != 0 || h.version != SHM_VERSION)
        return -1;
    memcpy(out, b, sizeof(*out));
    return 0;
}

int ote__shm_map_decode(const void *b, size_t n, shm_map_t *out) {
    shm_hdr_t h;
    shm_map_t m;
    if (n != sizeof(m) || hdr_of(b, n, SHM_MAP, &h) != 0 || h.version != SHM_VERSION || h.n != 0 ||
        h.pad != 0)
        return -1;
    memcpy(&m, b, sizeof(m));
    if (m.id == 0 || m.size == 0 || m.size > SHM_SHARED_BYTES || (m.base & 4095u) != 0 ||
        (m.size & 4095u) != 0 || m.base > UINT64_MAX - m.size)
        return -1;
    *out = m;
    return 0;
}

int ote__shm_req_flags_ok(uint16_t flags, int ipc, int shared) {
    uint16_t ok =
        SHM_REQ_RING | (ipc ? SHM_REQ_IPC | SHM_REQ_LOCAL_DEV : 0) | (shared ? SHM_REQ_SHARED : 0);
    if ((flags & ~ok) != 0) return 0;
    if ((flags & SHM_REQ_LOCAL_DEV) && (!(flags & SHM_REQ_IPC) || (flags & SHM_REQ_RING))) return 0;
    if ((flags & SHM_REQ_SHARED) && (flags & (SHM_REQ_RING | SHM_REQ_LOCAL_DEV))) return 0;
    return 1;
}

int ote__shm_ring_range_ok(const void *ring, size_t ring_len, uint64_t off, uint32_t len) {
    return ring != NULL && off <= ring_len && len <= ring_len - off;
}

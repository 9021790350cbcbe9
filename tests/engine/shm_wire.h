/*
 * tests/engine/shm_wire.h - a copy of the same-host transport's wire messages
 * (engine/shm/shm_internal.h) that C++ tests can include: shm_internal.h itself cannot be
 * compiled as C++ (it reaches C11 _Atomic through engine/transport.h). shm_wire_check.c,
 * compiled into every test that includes this header, includes both and fails the build
 * when a size, an offset or a constant here differs from the engine's.
 */
#ifndef OTE_TESTS_ENGINE_SHM_WIRE_H
#define OTE_TESTS_ENGINE_SHM_WIRE_H

#include <stdint.h>

#define TW_MAGIC 0x4d48534fu
#define TW_VERSION 3
#define TW_BATCH_MAX 64
#define TW_MAX_SLICE (64u << 20)
#define TW_RING_BYTES (16u << 20)
#define TW_SRC_MAX_REQS 65536u
#define TW_ADDR_MAX 272
#define TW_OP_WRITE 3
#define TW_OP_READ 5
#define TW_OP_NOTIFY 7
#define TW_OP_WRITE_OFF 9
#define TW_OP_CANCEL 11
#define TW_REQ_RING 1u
#define TW_ACK_RING 1u
#define TW_RING_SMALL (64u << 10)
enum { TW_HELLO = 1, TW_HELLO_ACK = 2, TW_REQS = 3, TW_RESPS = 4, TW_AUTH = 5 };
/* CUDA IPC (negotiated: TW_CAP_IPC in the HELLO's h.pad, TW_ACK_IPC in the ack's flags) */
enum { TW_IPC_OFFER = 6, TW_IPC_CLOSE = 7 };
#define TW_CAP_IPC 1u
#define TW_ACK_IPC 2u
#define TW_REQ_IPC 2u
#define TW_REQ_LOCAL_DEV 4u
#define TW_OP_IPC_DONE 13
/* Staging marks (TW_CAP_MARKS in the HELLO's h.pad, TW_ACK_MARKS in the ack's flags): the
 * control page of TW_RING_CTL bytes after the ring holds the mark (a uint64_t). */
#define TW_CAP_MARKS 2u
#define TW_ACK_MARKS 4u
#define TW_RING_CTL 4096u
/* Shared allocations (TW_CAP_SHARED in the HELLO's h.pad, TW_ACK_SHARED in the ack's flags;
 * cross-memory-attach mode only): a TW_MAP message carries one memfd; pieces flagged
 * TW_REQ_SHARED are copied through the source's mapping of it; TW_OP_UNMAP entries. */
#define TW_CAP_SHARED 4u
#define TW_ACK_SHARED 8u
#define TW_MAP 8
#define TW_OP_UNMAP 15
#define TW_REQ_SHARED 8u
#define TW_SHARED_MAX 64
enum { TW_MODE_CMA = 1, TW_MODE_RING = 2 };

typedef struct {
    uint32_t magic;
    uint16_t version;
    uint16_t kind;
    uint32_t n;
    uint32_t pad;
} tw_hdr_t;

typedef struct {
    tw_hdr_t h;
    uint64_t probe_addr;
    uint64_t probe_val;
    uint64_t ring_len;
    char addr[TW_ADDR_MAX];
    char name[64]; /* sent by a named requester only (the HELLO is shorter without it) */
} tw_hello_t;

typedef struct {
    tw_hdr_t h;
    int32_t status;
    uint32_t max_slice;
    uint32_t mode;
    uint32_t flags;
    char text[160];
} tw_hello_ack_t;

typedef struct {
    tw_hdr_t h;
    uint16_t step;
    uint16_t pad[3];
    uint8_t nonce[32];
    uint8_t mac[32];
} tw_auth_t;

typedef struct {
    uint64_t id;
    uint64_t remote;
    uint64_t local;
    uint32_t len;
    uint16_t op;
    uint16_t flags;
    uint64_t req_remote, req_len;
    uint64_t req_uid;
} tw_req_t;

typedef struct {
    uint64_t id;
    int32_t status;
    uint32_t pad;
} tw_resp_t;

typedef struct {
    uint8_t handle[64];
    uint64_t buffer_id;
    uint64_t base, size;
    uint64_t offset;
    int32_t device;
    uint32_t pad;
} tw_ipc_desc_t;

typedef struct {
    tw_hdr_t h;
    uint64_t id;
    tw_ipc_desc_t d;
} tw_ipc_offer_t;

typedef struct {
    tw_hdr_t h;
    uint64_t buffer_id;
} tw_ipc_close_t;

typedef struct {
    tw_hdr_t h;
    uint64_t id, base, size;
} tw_map_t;

#endif

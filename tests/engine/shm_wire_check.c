/*
 * tests/engine/shm_wire_check.c - no code: the build fails when tests/engine/shm_wire.h
 * (the wire messages as C++ tests see them) and engine/shm/shm_internal.h disagree.
 */
#include <stddef.h>

#include "engine/shm/shm_internal.h"
#include "tests/engine/shm_wire.h"

#define SAME(a, b) _Static_assert((long long)(a) == (long long)(b), #a " != " #b)
#define SAME_FIELD(tw, shm, f) \
    SAME(offsetof(tw, f), offsetof(shm, f)); \
    SAME(sizeof(((tw *)0)->f), sizeof(((shm *)0)->f))

SAME(TW_MAGIC, SHM_MAGIC);
SAME(TW_VERSION, SHM_VERSION);
SAME(TW_BATCH_MAX, SHM_BATCH_MAX);
SAME(TW_MAX_SLICE, SHM_MAX_SLICE);
SAME(TW_RING_BYTES, SHM_RING_BYTES);
SAME(TW_SRC_MAX_REQS, SHM_SRC_MAX_REQS);
SAME(TW_ADDR_MAX, OTE__ADDR_MAX);
SAME(TW_OP_WRITE, OTE__SLICE_WRITE);
SAME(TW_OP_READ, OTE__SLICE_READ);
SAME(TW_OP_NOTIFY, OTE__SLICE_NOTIFY);
SAME(TW_OP_WRITE_OFF, SHM_OP_WRITE_OFF);
SAME(TW_OP_CANCEL, SHM_OP_CANCEL);
SAME(TW_REQ_RING, SHM_REQ_RING);
SAME(TW_ACK_RING, SHM_ACK_RING);
SAME(TW_RING_SMALL, SHM_RING_SMALL);
SAME(TW_HELLO, SHM_HELLO);
SAME(TW_HELLO_ACK, SHM_HELLO_ACK);
SAME(TW_REQS, SHM_REQS);
SAME(TW_RESPS, SHM_RESPS);
SAME(TW_AUTH, SHM_AUTH);
SAME(TW_IPC_OFFER, SHM_IPC_OFFER);
SAME(TW_IPC_CLOSE, SHM_IPC_CLOSE);
SAME(TW_CAP_IPC, SHM_CAP_IPC);
SAME(TW_ACK_IPC, SHM_ACK_IPC);
SAME(TW_REQ_IPC, SHM_REQ_IPC);
SAME(TW_REQ_LOCAL_DEV, SHM_REQ_LOCAL_DEV);
SAME(TW_OP_IPC_DONE, SHM_OP_IPC_DONE);
SAME(TW_CAP_MARKS, SHM_CAP_MARKS);
SAME(TW_ACK_MARKS, SHM_ACK_MARKS);
SAME(TW_RING_CTL, SHM_RING_CTL);
SAME(TW_CAP_SHARED, SHM_CAP_SHARED);
SAME(TW_ACK_SHARED, SHM_ACK_SHARED);
SAME(TW_MAP, SHM_MAP);
SAME(TW_OP_UNMAP, SHM_OP_UNMAP);
SAME(TW_REQ_SHARED, SHM_REQ_SHARED);
SAME(TW_SHARED_MAX, SHM_SHARED_MAX);
SAME(sizeof(tw_map_t), sizeof(shm_map_t));
SAME_FIELD(tw_map_t, shm_map_t, id);
SAME_FIELD(tw_map_t, shm_map_t, base);
SAME_FIELD(tw_map_t, shm_map_t, size);
SAME(sizeof(tw_ipc_desc_t), sizeof(ote__ipc_desc_t));
SAME_FIELD(tw_ipc_desc_t, ote__ipc_desc_t, handle);
SAME_FIELD(tw_ipc_desc_t, ote__ipc_desc_t, buffer_id);
SAME_FIELD(tw_ipc_desc_t, ote__ipc_desc_t, base);
SAME_FIELD(tw_ipc_desc_t, ote__ipc_desc_t, size);
SAME_FIELD(tw_ipc_desc_t, ote__ipc_desc_t, offset);
SAME_FIELD(tw_ipc_desc_t, ote__ipc_desc_t, device);
SAME(sizeof(tw_ipc_offer_t), sizeof(shm_ipc_offer_t));
SAME_FIELD(tw_ipc_offer_t, shm_ipc_offer_t, id);
SAME_FIELD(tw_ipc_offer_t, shm_ipc_offer_t, d);
SAME(sizeof(tw_ipc_close_t), sizeof(shm_ipc_close_t));
SAME_FIELD(tw_ipc_close_t, shm_ipc_close_t, buffer_id);
SAME(sizeof(tw_auth_t), sizeof(shm_auth_t));
SAME_FIELD(tw_auth_t, shm_auth_t, step);
SAME_FIELD(tw_auth_t, shm_auth_t, nonce);
SAME_FIELD(tw_auth_t, shm_auth_t, mac);
SAME(TW_MODE_CMA, SHM_MODE_CMA);
SAME(TW_MODE_RING, SHM_MODE_RING);

SAME(sizeof(tw_hdr_t), sizeof(shm_hdr_t));
SAME_FIELD(tw_hdr_t, shm_hdr_t, magic);
SAME_FIELD(tw_hdr_t, shm_hdr_t, version);
SAME_FIELD(tw_hdr_t, shm_hdr_t, kind);
SAME_FIELD(tw_hdr_t, shm_hdr_t, n);
SAME(sizeof(tw_hello_t), sizeof(shm_hello_t));
SAME_FIELD(tw_hello_t, shm_hello_t, probe_addr);
SAME_FIELD(tw_hello_t, shm_hello_t, probe_val);
SAME_FIELD(tw_hello_t, shm_hello_t, ring_len);
SAME_FIELD(tw_hello_t, shm_hello_t, addr);
SAME_FIELD(tw_hello_t, shm_hello_t, name);
SAME(sizeof(tw_hello_ack_t), sizeof(shm_hello_ack_t));
SAME_FIELD(tw_hello_ack_t, shm_hello_ack_t, status);
SAME_FIELD(tw_hello_ack_t, shm_hello_ack_t, max_slice);
SAME_FIELD(tw_hello_ack_t, shm_hello_ack_t, mode);
SAME_FIELD(tw_hello_ack_t, shm_hello_ack_t, flags);
SAME_FIELD(tw_hello_ack_t, shm_hello_ack_t, text);
SAME(sizeof(tw_req_t), sizeof(shm_req_t));
SAME_FIELD(tw_req_t, shm_req_t, id);
SAME_FIELD(tw_req_t, shm_req_t, remote);
SAME_FIELD(tw_req_t, shm_req_t, local);
SAME_FIELD(tw_req_t, shm_req_t, len);
SAME_FIELD(tw_req_t, shm_req_t, op);
SAME_FIELD(tw_req_t, shm_req_t, flags);
SAME_FIELD(tw_req_t, shm_req_t, req_remote);
SAME_FIELD(tw_req_t, shm_req_t, req_len);
SAME_FIELD(tw_req_t, shm_req_t, req_uid);
SAME(sizeof(tw_resp_t), sizeof(shm_resp_t));
SAME_FIELD(tw_resp_t, shm_resp_t, id);
SAME_FIELD(tw_resp_t, shm_resp_t, status);

/*
 * engine/shm/shm_proto.h - the checks of the same-host transport's wire messages
 * (shm_internal.h), kept free of I/O and of connection state so that the libFuzzer
 * target engine/shm/fuzz_shm.c runs exactly the checks the transport runs. Each takes
 * the bytes of one received SOCK_SEQPACKET message and its real length (MSG_TRUNC: a
 * longer message shows its real length and is refused), and copies the message out
 * (aligned, NUL-terminated strings) only when it is well formed.
 */
#ifndef OTE_ENGINE_SHM_SHM_PROTO_H
#define OTE_ENGINE_SHM_SHM_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "engine/shm/shm_internal.h"

/* A HELLO (any version: the answer says when it is not SHM_VERSION); out->addr ends in
 * NUL. SHM_HELLO_BASE_LEN bytes: no name (out->name ""); sizeof(shm_hello_t): a name of
 * 0..OTE_CTL_MAX_NAME printable ASCII bytes and its NUL (anything else there refuses it).
 * 0, or -1 when malformed. */
int ote__shm_hello_decode(const void *b, size_t n, shm_hello_t *out);
/* An SHM_AUTH message of the given step (OTE_CTL_AUTH_*). 0, or -1. */
int ote__shm_auth_decode(const void *b, size_t n, uint16_t step, shm_auth_t *out);
/* A HELLO_ACK (any version, as a refusal may come from another one); out->text ends in
 * NUL; an accepting one (status OTE_OK) names a known mode. 0, or -1. */
int ote__shm_ack_decode(const void *b, size_t n, shm_hello_ack_t *out);
/* The header of a REQS message (SHM_VERSION, at most SHM_BATCH_MAX entries, exactly as
 * long as its entries): the entry count, or -1. */
int ote__shm_reqs_count(const void *b, size_t n);
/* The same for a RESPS message. */
int ote__shm_resps_count(const void *b, size_t n);
/* An SHM_IPC_OFFER (SHM_VERSION, the piece inside the allocation it names); 0, or -1. */
int ote__shm_offer_decode(const void *b, size_t n, shm_ipc_offer_t *out);
/* An SHM_IPC_CLOSE (SHM_VERSION); 0, or -1. */
int ote__shm_close_decode(const void *b, size_t n, shm_ipc_close_t *out);
/* An SHM_MAP (SHM_VERSION; id nonzero; base and size page aligned, size in
 * (0, SHM_SHARED_BYTES], base + size without overflow); 0, or -1. */
int ote__shm_map_decode(const void *b, size_t n, shm_map_t *out);
/* A REQS entry's flags: only the known ones, the IPC ones only where negotiated, a local
 * device buffer only with IPC and never in the ring; SHM_REQ_SHARED only where negotiated,
 * never with the ring or a local device buffer. */
int ote__shm_req_flags_ok(uint16_t flags, int ipc, int shared);
/* A piece staged in a ring of ring_len bytes (NULL ring: none) lies inside it. */
int ote__shm_ring_range_ok(const void *ring, size_t ring_len, uint64_t off, uint32_t len);

#endif

/*
 * compat/mooncake/compat_internal.h - the objects behind Mooncake's C API handles.
 *
 * A transfer_engine_t is an mc_engine_t. It owns one OrbitTE engine (created at
 * createTransferEngine with auto_discover, else at the first installTransport), and three
 * tables that turn Mooncake's integer handles into OrbitTE objects:
 *   segs     segment id -> ote_segment_t (slot 0: LOCAL_SEGMENT, this engine itself);
 *            ids are never reused, so a stale id never reaches another peer;
 *   batches  batch id -> ote_batch_t with its capacity (ids count up from 1);
 *   regs     the ranges given to registerLocalMemory (the submit check, code 3).
 * One mutex (mu) guards the tables and the engine pointer. It is never held across a
 * call that talks to a peer (segment open/close, notify send, submit) or that waits:
 * such a call takes a use count on its entry (users) under mu, calls OrbitTE without
 * it, and drops the count; closing an entry is refused while it has users.
 *
 * Only <ote/ote.h> is used of OrbitTE's engine; base/ gives the logger, the allocation
 * hook, the mutex and uthash.
 */
#ifndef OTE_COMPAT_MOONCAKE_COMPAT_INTERNAL_H
#define OTE_COMPAT_MOONCAKE_COMPAT_INTERNAL_H

#include <ote/ote.h>

#include "base/hash.h"
#include "base/lock.h"
#include "compat/mooncake/transfer_engine_c.h"

#define MC_LOG "mooncake"
#define MC_ENGINE_MAGIC 0x4d434f54u /* "TOCM" */

typedef struct {
    char *name;         /* "host:port" as opened; NULL: a free (closed) slot */
    ote_segment_t *seg; /* owned */
    unsigned users;     /* calls using seg without mu */
    int closing;        /* closeSegment is closing it */
} mc_seg_t;

typedef struct mc_batch {
    uint64_t id;
    ote_batch_t *b;   /* owned */
    size_t cap, used; /* batch_size; requests submitted or being submitted */
    unsigned users;   /* calls using b without mu */
    int freeing;      /* freeBatchID is destroying it */
    unsigned notes;   /* notifications attached */
    int notes_final;  /* notes_result is their final outcome */
    ote_status_t notes_result;
    UT_hash_handle hh;
} mc_batch_t;

typedef struct {
    uintptr_t addr;
    size_t len;
    int remote; /* registered with OrbitTE (remote_accessible) */
} mc_reg_t;

typedef struct {
    char name[64];
    uint64_t bytes; /* bytes_out + bytes_served at the last call */
    uint64_t at_ns; /* when */
    double ewma_bps;
} mc_nic_t;

typedef struct {
    uint32_t magic;
    ote_mutex_t mu;
    ote_engine_t *ote;   /* NULL until a transport is installed */
    char transports[16]; /* "shm,tcp" / "shm,rdma" once created */
    char tp_handle[2];   /* installTransport's handles: [0] tcp, [1] rdma */
    char listen[288];    /* "host:port" to listen on */
    char address[288];   /* ote_engine_address, once created */
    mc_seg_t *segs;
    size_t nsegs, segcap;
    mc_batch_t *batches;
    uint64_t next_batch;
    mc_reg_t *regs;
    size_t nregs, regcap;
    mc_nic_t *nics;
    size_t nnics;
} mc_engine_t;

/* engine.c */
mc_engine_t *ote__mc_engine(transfer_engine_t handle, const char *fn);
ote_engine_t *ote__mc_ote(mc_engine_t *e, const char *fn);
int ote__mc_err(ote_status_t st);
int ote__mc_code(ote_status_t st);

/* segment.c */
ote_status_t ote__mc_seg_get(mc_engine_t *e, int32_t id, ote_segment_t **seg_out);
void ote__mc_seg_put(mc_engine_t *e, int32_t id);
void ote__mc_segs_close_all(mc_engine_t *e);
size_t ote__mc_segs_describe(mc_engine_t *e, char *buf, size_t len, int json);

/* memory.c */
int ote__mc_regs_cover(mc_engine_t *e, const void *addr, uint64_t len);

/* batch.c */
void ote__mc_batches_free_all(mc_engine_t *e);

/* notify.c */
ote_status_t ote__mc_notify_encode(const notify_msg_t *n, char *buf, size_t cap, size_t *len_out);

#endif

/*
 * engine/gpu/gpu_internal.h - what the files of engine/gpu share: the engine's GPU state,
 * its devices, streams and parked work, and the cross-file functions. Nothing outside
 * engine/gpu/ includes it (the engine reaches it through gpu.h).
 *
 * Files, one job each:
 *   gpu.c        the driver (loaded only when device memory can exist), memory kinds and
 *                their per-request cache, gpu_paths, devices, copy streams, parked work
 *                (a stream whose outcome is unknown), create, stats, destroy
 *   gpu_stage.c  staging through pinned chunks: the source's bounce buffers and the
 *                requester's worker pipelining a request's slices
 *   gpu_ipc.c    CUDA IPC: the source's exports, the requester's imports and copies
 *   gpu_src_async.c  a source's copy into (or back out of) its bounce, started without
 *                waiting and polled by the worker
 *
 * Locks: g->mu guards the driver pointer's first setting, the devices, their free
 * streams, the parked list, the export table and the worker's queues. Driver calls
 * (copies, waits) are made without it. The worker is the only thread that runs a staged
 * request's pipeline; transports only queue completed slices for it (their done() never
 * blocks).
 */
#ifndef OTE_ENGINE_GPU_GPU_INTERNAL_H
#define OTE_ENGINE_GPU_GPU_INTERNAL_H

#ifndef OTE__INSIDE_ENGINE
#error "engine/gpu/gpu_internal.h is internal to OrbitTE's engine; include <ote/ote.h> instead"
#endif

#include <pthread.h>
#include <stdatomic.h>

#include "base/lock.h"
#include "cuda/driver.h"
#include "cuda/ipc/ipc.h"
#include "cuda/memory/device.h"
#include "cuda/memory/memory.h"
#include "cuda/pinned/pinned.h"
#include "cuda/stream/stream.h"
#include "engine/gpu/gpu.h"

#define GPU_MAX_DEVICES 8
#define GPU_FREE_STREAMS 8
#define GPU_POOL_FACTOR 4 /* chunks per device = GPU_POOL_FACTOR x gpu_staging_depth */
#define GPU_IDLE_TICK_NS (2u * OTE_NSEC_PER_MSEC)
/* How often the worker looks at the sources' running copies (gpu_src_async.c): about
 * the pause a synchronous wait reaches (cuda/stream), since each grant's answer waits. */
#define GPU_SRC_TICK_NS (200u * OTE_NSEC_PER_USEC)
#define GPU_CACHE 8        /* device allocations remembered by the per-request classification */
#define GPU_IPC_EXPORTS 32 /* source: allocations whose IPC description is cached */
#define GPU_IPC_ENTRIES 32 /* requester: open IPC mappings per device, at most */
#define GPU_IPC_BYTES (64ull << 30) /* requester: bytes of open IPC mappings per device */

/* A device allocation a request's local buffer lay in: a later request inside it is
 * classified by one cuPointerGetAttribute(BUFFER_ID) that must return the same id
 * (buffer ids are never reused, so a freed and reallocated range misses). */
typedef struct {
    uint64_t start, size;
    unsigned long long buffer_id;
    uint32_t kind;
    uint64_t used; /* for eviction: least recently used goes */
} cache_ent_t;

/* A stream (and the chunk it was copying into or out of) whose outcome is unknown. */
typedef struct parked {
    struct parked *next;
    struct gdev *d;
    ote_cuda_stream_t *s;
    ote_cuda_chunk_t chunk;
    int has_chunk;
    ote_cuda_ipc_mapping_t *map; /* an IPC copy's mapping, put back when released */
} parked_t;

typedef struct gdev {
    ote_cuda_device_t *dev;
    ote_cuda_staging_t *pool;
    ote_cuda_ipc_cache_t *ipc; /* requester: imports of peers' allocations */
    ote_cuda_stream_t *free_streams[GPU_FREE_STREAMS];
    size_t nfree;
} gdev_t;

/* Source: a bounce buffer (gpu.h). */
struct ote__gpu_bounce {
    struct gdev *d;
    uint8_t *buf;
    ote_cuda_chunk_t chunk;
    int has_chunk; /* buf is the chunk; else heap memory (copied to/from directly) */
};

/* Source: a copy between a bounce and the device, running (gpu_src_async.c). */
typedef struct src_async {
    struct src_async *next;
    struct ote__gpu_bounce *t;
    ote_cuda_stream_t *s;
    uint32_t len;
    int to_device; /* 1: the bounce back to the device (a staged WRITE's bytes) */
    ote_deadline_t dl;
    ote__gpu_src_done_fn done;
    void *arg;
} src_async_t;

/* One staged request. */
typedef struct job job_t;
typedef struct jev {
    struct jev *next;
    job_t *job;
    uint32_t idx;
    ote_status_t st;
} jev_t;

struct job {
    job_t *next;
    ote__gpu_t *g;
    gdev_t *d;
    ote_cuda_stream_t *stream;
    ote__slice_t *slices;
    uint32_t ns, next_idx, inflight, left;
    int write;
    ote_status_t fail; /* first failure: slices not yet staged end with it */
    void *owner;
    ote__slice_done_fn done;
    ote__gpu_submit_fn submit;
    void *submit_arg;
    uint64_t *dev;            /* each slice's device address */
    ote_cuda_chunk_t *chunks; /* each slice's chunk while in flight */
    jev_t *evs;               /* one completion event per slice */
};

/* Source: one allocation's IPC description, exported once. */
typedef struct {
    unsigned long long buffer_id; /* 0: free slot */
    ote_cuda_ipc_export_t *ex;    /* NULL: refused (VMM memory without the POSIX-fd type) */
    uint64_t used;
} ipc_exp_t;

struct ote__gpu_ipc_op {
    struct gdev *d;
    ote_cuda_ipc_mapping_t *map;
    ote_cuda_stream_t *s;
};

struct ote__gpu {
    ote_mutex_t mu;
    ote_cond_t cv;
    ote_cuda_driver_t *drv; /* NULL until device memory was seen */
    _Atomic int drv_ready;
    _Atomic unsigned long long seen_adds; /* dl_iterate_phdr's load count last looked at */
    char libpath[256];
    gdev_t devs[GPU_MAX_DEVICES];
    unsigned paths;
    char paths_text[32];
    uint64_t chunk;
    uint32_t depth;
    parked_t *parked;
    _Atomic size_t nparked;
    cache_ent_t cache[GPU_CACHE]; /* under mu */
    uint64_t cache_clock;
    ipc_exp_t exps[GPU_IPC_EXPORTS]; /* under mu */
    uint64_t exp_clock;
    _Atomic uint64_t n_staged, n_src, n_exports, n_ipc_ok, n_ipc_failed, n_ipc_settled;
    /* gpu_direct.c: requests moved by GPUDirect RDMA, dma-bufs exported for registrations
     * and exports that failed; whether that failure was logged. */
    _Atomic uint64_t n_direct, n_direct_regs, n_direct_failed;
    _Atomic int direct_warned;
    /* worker */
    pthread_t thread;
    int thread_started, stop;
    job_t *jobs;    /* active */
    job_t *newjobs; /* handed over, not yet started by the worker */
    jev_t *evq;     /* completed slices */
    size_t njobs;
    src_async_t *src_pending; /* the sources' running copies (gpu_src_async.c) */
};

/* ---- gpu.c ---- */
/* Device `kind`'s state, opened on first use (pool: with its staging chunk pool). */
ote_status_t ote__gpu_dev_open(ote__gpu_t *g, uint32_t kind, int pool, gdev_t **out);
ote_status_t ote__gpu_dev_get(ote__gpu_t *g, uint32_t kind, gdev_t **out);
/* A copy stream of d (a free one, else a new one) and its return. */
ote_status_t ote__gpu_stream_get(ote__gpu_t *g, gdev_t *d, ote_cuda_stream_t **out);
void ote__gpu_stream_put(ote__gpu_t *g, gdev_t *d, ote_cuda_stream_t *s);
/* Keep s (and chunk, and an IPC mapping, which its work may still touch) until the
 * driver proves the work complete; ote__gpu_reclaim_parked looks again. */
void ote__gpu_park(ote__gpu_t *g, gdev_t *d, ote_cuda_stream_t *s, const ote_cuda_chunk_t *chunk);
void ote__gpu_park_map(ote__gpu_t *g, gdev_t *d, ote_cuda_stream_t *s,
                       const ote_cuda_chunk_t *chunk, ote_cuda_ipc_mapping_t *map);
void ote__gpu_reclaim_parked(ote__gpu_t *g);

/* ---- gpu_stage.c ---- */
/* Start the worker thread if it is not running (it also looks at parked work every
 * GPU_IDLE_TICK_NS while there is some). */
void ote__gpu_worker_ensure(ote__gpu_t *g);
/* One copy on *sp, waited for until dl. On a failure after which the device may still
 * touch the memory, the stream and the chunk are parked (*sp = NULL, *chunk_lost = 1). */
ote_status_t ote__gpu_copy_wait(ote__gpu_t *g, gdev_t *d, ote_cuda_stream_t **sp,
                                ote_cuda_copy_kind_t kind, uint64_t dst, uint64_t src, size_t len,
                                const ote_cuda_chunk_t *chunk, ote_deadline_t dl, int *chunk_lost);

/* ---- gpu_src_async.c ---- */
/* Worker: look at the sources' running copies once; done() of each that ended runs here.
 * Once the engine stops, those still running are given up (parked). */
void ote__gpu_src_poll(ote__gpu_t *g);

#endif

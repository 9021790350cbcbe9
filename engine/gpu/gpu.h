/*
 * engine/gpu/gpu.h - GPU memory in the engine: memory kinds and the staging paths.
 *
 * One ote__gpu_t per engine. It never loads the CUDA driver on its own account: device
 * memory can only exist in a process that has loaded the driver, so as long as the
 * driver library ($OTE_CUDA_LIBRARY, else libcuda.so.1) is not loaded in the process
 * every range is host memory and no driver call is made (a host-only user neither pays
 * nor fails). A registration whose range is not host-readable while no driver is loaded
 * makes it try to load the driver (OTE_ERR_NO_DEVICE with an ERROR naming the library
 * when that fails). Once loaded, ranges are classified by the driver
 * (cuPointerGetAttributes): pageable host, pinned host, or device memory of device N,
 * which must lie within one allocation (OTE_ERR_INVALID otherwise). Per request, the
 * last GPU_CACHE device allocations seen are remembered: a request inside one of them is
 * classified by a single cuPointerGetAttribute(BUFFER_ID) that must return the
 * remembered id (ids are never reused, so memory freed and allocated again misses and is
 * asked in full).
 *
 * Staging (gpu_paths contains "staging"): device memory moves through pinned chunks of
 * gpu_staging_chunk bytes from one pool per device (4 x gpu_staging_depth chunks), copied
 * on copy streams (cuda/stream).
 *  - Requester side: a request whose local buffer is device memory is handed, as its
 *    slices (each at most one chunk), to the staging worker thread, which keeps up to
 *    gpu_staging_depth of them in flight: WRITE copies a slice's bytes device-to-host
 *    into a chunk and then submits the slice with the chunk as its local buffer (so the
 *    copy of slice k+1 overlaps the transfer of slice k); READ submits the slice into a
 *    chunk and copies it host-to-device when it arrived.
 *  - Source side: the transports ask for a host bounce buffer (a pinned chunk when the
 *    slice fits one; the RDMA source from the pool only, AGAIN when it is empty) and a
 *    synchronous copy between it and the registered device range.
 * A copy whose outcome is unknown (a failed event query or drain) retains its stream
 * and the chunk it touched (they are retried by the worker and reclaimed when the
 * driver proves the work complete); the request fails with the driver's status, and
 * the next request gets a fresh stream.
 */
#ifndef OTE_ENGINE_GPU_GPU_H
#define OTE_ENGINE_GPU_GPU_H

#ifndef OTE__INSIDE_ENGINE
#error "engine/gpu/gpu.h is internal to OrbitTE's engine; include <ote/ote.h> instead"
#endif

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "base/time.h"
#include "engine/engine_internal.h"
#include "engine/transport.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ote__gpu ote__gpu_t;

/* The GPU services a transport uses (engine/transport.h, ote__gpu_ops_t), over g
 * (gpu_services.c). */
ote__gpu_ops_t ote__gpu_services(ote__gpu_t *g);

/* Never loads the driver. */
ote_status_t ote__gpu_create(const ote__cfg_t *cfg, ote__gpu_t **gpu_out);
/* Ends the worker, reclaims what was retained where the driver allows it and closes
 * the devices. Every staged request must have ended. */
/* Stops the GPU paths and releases what they hold. OTE_OK: g is freed. OTE_ERR_RETAINED:
 * something the CUDA layer could not release yet (a stream still running, staging chunks
 * out, IPC mappings in use, retained owners): g is kept with what is left (logged), and a
 * later call retries exactly that. */
ote_status_t ote__gpu_destroy(ote__gpu_t *g);

/* The kind (ote_mem_kind_t) of [addr, addr + len). for_register: a range that is not
 * host-readable while the driver is not loaded loads it (OTE_ERR_NO_DEVICE, logged,
 * when it cannot be loaded). OTE_ERR_INVALID for device memory crossing the end of its
 * allocation, OTE_ERR_UNSUPPORTED for managed memory or a device ordinal past
 * OTE_MEM_CUDA_MAX_DEVICES. */
ote_status_t ote__gpu_classify(ote__gpu_t *g, uint64_t addr, uint64_t len, int for_register,
                               uint32_t *kind_out);

/* Whether the CUDA driver is loaded in this process (it is then loaded for the engine
 * too): when not, no device memory exists and every unregistered range is host memory.
 * One dl_iterate_phdr step while nothing new was loaded. */
int ote__gpu_driver_present(ote__gpu_t *g);

/* The NUMA node of CUDA device dev (its PCI function's, from sysfs), -1 when unknown. */
int ote__gpu_device_node(ote__gpu_t *g, int dev);
/* The PCI bus id of CUDA device dev ("dddd:bb:dd.f", lower case) in bus[0, cap >= 16):
 * OTE_OK; OTE_ERR_NOT_FOUND without a driver in this process or without such a device. */
ote_status_t ote__gpu_pci_bus_id(ote__gpu_t *g, int dev, char *bus, size_t cap);

/* Whether device memory of `kind` may be moved by staging (gpu_paths has staging):
 * OTE_OK, else OTE_ERR_UNSUPPORTED with a WARN naming what is missing; `what` names the
 * side ("local buffer", "registered range") for the log. ipc_optin: for a registration,
 * whether it carries OTE_PERM_IPC (1) or not (0); -1 for a request's local buffer. The
 * ipc path is chosen before this is asked (engine/batch.c for a local buffer, the shm
 * source for a registration): this names what ipc lacked in the refusal. */
ote_status_t ote__gpu_path_check(ote__gpu_t *g, uint32_t kind, int ipc_optin, const char *what);
/* Largest slice a staged request may have (the chunk size). */
uint64_t ote__gpu_max_slice(const ote__gpu_t *g);

/* Requester side: stage the ns slices (contiguous array, one request, its local buffer
 * device memory of `kind`, each slice at most ote__gpu_max_slice bytes). The slices'
 * done/owner/local are taken over and restored before each slice's own done() is called
 * (exactly once per slice, from the staging worker). submit(arg, s) hands one slice to
 * the transport. Never fails: a slice that cannot be staged ends through its done(). */
typedef void (*ote__gpu_submit_fn)(void *arg, ote__slice_t *s);
void ote__gpu_stage(ote__gpu_t *g, uint32_t kind, ote__slice_t *slices, uint32_t ns,
                    ote__gpu_submit_fn submit, void *arg);

/* Source side: a host bounce buffer of len bytes for device memory of `kind`: a pinned
 * chunk when len fits one and one is free now, else heap memory (the driver stages
 * pageable memory itself). Never waits for a chunk: a source's chunks are held by
 * answers that the same thread sends (dl is kept for the interface). *tok_out is handed
 * to the calls below and released with ote__gpu_src_put. */
typedef struct ote__gpu_bounce ote__gpu_bounce_t;
ote_status_t ote__gpu_src_get(ote__gpu_t *g, uint32_t kind, uint32_t len, ote_deadline_t dl,
                              uint8_t **buf_out, ote__gpu_bounce_t **tok_out);
/* The same from the pool only (the RDMA source, rdma_stage.c): a len that fits a chunk
 * and finds none free now is OTE_ERR_AGAIN (the requester asks again), never heap; a
 * larger one is heap, as above. */
ote_status_t ote__gpu_src_get_pooled(ote__gpu_t *g, uint32_t kind, uint32_t len, uint8_t **buf_out,
                                     ote__gpu_bounce_t **tok_out);
/* 1 when tok's buffer is a chunk of its device's pool (long-lived pinned memory, the
 * same address until engine destroy): *base_out and *size_out the whole chunk; 0 for
 * heap memory. */
int ote__gpu_src_chunk(const ote__gpu_bounce_t *tok, uint8_t **base_out, uint64_t *size_out);
/* Copy between the bounce buffer and [dev_addr, dev_addr + len) of the device:
 * to_device 1 = host-to-device. Synchronous (waits until dl). */
ote_status_t ote__gpu_src_copy(ote__gpu_t *g, ote__gpu_bounce_t *tok, int to_device,
                               uint64_t dev_addr, uint32_t len, ote_deadline_t dl);
void ote__gpu_src_put(ote__gpu_t *g, ote__gpu_bounce_t *tok);
/* The copy between the bounce and the device (to_device as above: 0 into the bounce, 1
 * back to the device) started on a copy stream, without waiting (gpu_src_async.c).
 * OTE_OK: done(arg, status) runs exactly once, later, on the GPU worker (never inside
 * this call): OTE_OK once the copy completed; a failure of the copy or of its event, or
 * dl passed, otherwise (the stream and the chunk are parked when the device may still
 * touch the bounce: the bounce then no longer holds them, and ote__gpu_src_put frees
 * nothing the device may reach). Until done ran, the caller must neither touch nor put
 * the bounce. Another status: nothing is pending, done never runs (the bounce is as
 * after a failed ote__gpu_src_copy). */
typedef void (*ote__gpu_src_done_fn)(void *arg, ote_status_t st);
ote_status_t ote__gpu_src_copy_start(ote__gpu_t *g, ote__gpu_bounce_t *tok, int to_device,
                                     uint64_t dev_addr, uint32_t len, ote_deadline_t dl,
                                     ote__gpu_src_done_fn done, void *arg);

/* ---- CUDA IPC (gpu_paths "ipc"; the shm transport carries it, engine/shm) ----
 * Source side: ote__gpu_ipc_export describes the allocation holding the device range
 * [addr, +len) of a registration of `kind` (once per allocation: the last
 * GPU_IPC_EXPORTS allocations are cached by buffer id, which is never reused) and the
 * range's offset in it: a VMM allocation (cuMemCreate + cuMemMap) as a POSIX fd
 * (cuMemRetainAllocationHandle + cuMemExportToShareableHandle, ote_cuda_ipc_export_vmm),
 * else by cuIpcGetMemHandle. A VMM allocation created without the POSIX-fd handle type
 * cannot be exported: it is remembered as refused (one WARN per allocation) and its
 * pieces keep staging.
 * Requester side: one bounded import cache per device (cuda/ipc: GPU_IPC_ENTRIES
 * mappings and GPU_IPC_BYTES at most, least recently used closed first, never while a
 * copy uses it), keyed by (exporter, buffer id). ote__gpu_ipc_copy_start imports and
 * enqueues one cuMemcpy*Async on a copy stream (DtoD when the local buffer is device
 * memory, else HtoD / DtoH) and records its event; ote__gpu_ipc_copy_poll polls the
 * event (never a blocking synchronize). A copy whose outcome is unknown (a failed
 * enqueue or event record the stream could not drain, a failed event query, a deadline)
 * ends its request with that status, but its op stays the caller's, unsettled, with its
 * stream and its mapping reference: the caller keeps the source's pin (sends no
 * IPC_DONE) until ote__gpu_ipc_copy_settle proves the copy complete (the event, or the
 * stream query of the reclaim path, succeeds), or abandons it when the peer is gone (the
 * stream and mapping then park until the driver proves the work complete; engine
 * destroy retains what is still parked). */
typedef struct ote__gpu_ipc_op ote__gpu_ipc_op_t;
int ote__gpu_ipc_allowed(const ote__gpu_t *g);     /* "ipc" in gpu_paths */
int ote__gpu_staging_allowed(const ote__gpu_t *g); /* "staging" in gpu_paths */
/* *fd_out: -1, or (out->flags OTE__IPC_VMM) a dup of the VMM export's POSIX fd, the
 * caller's to send and close. */
ote_status_t ote__gpu_ipc_export(ote__gpu_t *g, uint32_t kind, uint64_t addr, uint32_t len,
                                 ote__ipc_desc_t *out, int *fd_out);
/* A registration [start, +len) is gone: cached exports of allocations inside it are
 * dropped (a VMM export's fd would keep the memory alive). */
void ote__gpu_ipc_forget(ote__gpu_t *g, uint64_t start, uint64_t len);
/* fd: received with a VMM desc (the caller's, it closes it), else -1. */
ote_status_t ote__gpu_ipc_copy_start(ote__gpu_t *g, uint64_t exporter, const ote__ipc_desc_t *desc,
                                     int fd, uint8_t *local, uint32_t local_kind, uint32_t len,
                                     int write, ote__gpu_ipc_op_t **op_out);
/* copy_start: OTE_OK with *op_out; or a failure with *op_out NULL (nothing runs, nothing
 * held); or a failure with *op_out set: the copy's outcome is unknown, the op is to be
 * settled. */
/* OTE_ERR_AGAIN while the copy runs; OTE_OK: complete (the op is gone); else the
 * request's status (the driver's error, or OTE_ERR_TIMEOUT when give_up: the caller's
 * deadline passed) and the op stays, unsettled: ote__gpu_ipc_copy_settle. */
ote_status_t ote__gpu_ipc_copy_poll(ote__gpu_t *g, ote__gpu_ipc_op_t *op, int give_up);
/* An unsettled op: OTE_OK once the driver proved the copy complete (the op is gone, its
 * mapping reference put back), OTE_ERR_AGAIN while unknown. abandon: the op is handed to
 * the parked list (released when proven complete) and OTE_OK returned. */
ote_status_t ote__gpu_ipc_copy_settle(ote__gpu_t *g, ote__gpu_ipc_op_t *op, int abandon);
void ote__gpu_ipc_revoked(ote__gpu_t *g, uint64_t exporter, uint64_t buffer_id);
void ote__gpu_ipc_exporter_dead(ote__gpu_t *g, uint64_t exporter);

/* ---- GPUDirect RDMA (gpu_paths "direct"; engine/gpu/gpu_direct.c) ----
 * ote__gpu_direct_export: SYNC_MEMOPS on the allocation holding the device range
 * [addr, +len) of `kind`, and a dma-buf fd of the page-aligned range from its base with
 * the range's offset in it (for ote_buffer_register_dmabuf); the caller closes the fd
 * with ote__gpu_direct_close once its MRs exist. OTE_ERR_UNSUPPORTED without "direct" in
 * gpu_paths; a driver failure is logged once per engine. ote__gpu_direct_count: one
 * request moved by the path (ote_gpu_stats_t.direct_requests). */
int ote__gpu_direct_allowed(const ote__gpu_t *g);
ote_status_t ote__gpu_direct_export(ote__gpu_t *g, uint32_t kind, uint64_t addr, uint64_t len,
                                    int *fd_out, uint64_t *offset_out);
void ote__gpu_direct_close(int fd);
void ote__gpu_direct_count(ote__gpu_t *g);

/* Counters for tests: staged requests running, and streams/chunks parked after an
 * unknown outcome (retained until the driver proves the work complete). */
typedef struct {
    uint64_t jobs_active;
    uint64_t parked;
    uint64_t driver_loaded;
    uint64_t chunks_out;      /* staging chunks not in their pools (all devices) */
    uint64_t staged_jobs;     /* requests (or slices handed back by ipc) staged, cumulative */
    uint64_t src_copies;      /* source bounce copies (ote__gpu_src_copy), cumulative */
    uint64_t ipc_exports;     /* allocations described for peers (source side, cumulative) */
    uint64_t ipc_copies;      /* IPC copies that completed OK (requester side, cumulative) */
    uint64_t ipc_failed;      /* IPC copies that failed (start or completion) */
    uint64_t ipc_imports;     /* cuIpcOpenMemHandle calls that succeeded (all devices) */
    uint64_t ipc_mapped;      /* mappings open now (all devices) */
    uint64_t ipc_in_use;      /* mappings used by a copy now */
    uint64_t ipc_invalidated; /* by close receipts or exporter death */
    uint64_t direct;          /* requests moved by GPUDirect RDMA (cumulative) */
    uint64_t direct_regs;     /* dma-bufs exported for registrations (cumulative) */
    uint64_t direct_failed;   /* dma-buf exports that failed (cumulative) */
    uint64_t ipc_settled;     /* copies of unknown outcome later proven complete */
} ote__gpu_stats_t;
void ote__gpu_stats(ote__gpu_t *g, ote__gpu_stats_t *out);

#ifdef __cplusplus
}
#endif
#endif

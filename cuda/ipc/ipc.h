/*
 * cuda/ipc/ipc.h - CUDA IPC: exporting an allocation to another process on the same host,
 * and the importer's bounded cache of mappings.
 *
 * Export (the process that owns the memory): ote_cuda_ipc_export_create() describes the
 * WHOLE allocation holding a pointer (cuIpcGetMemHandle; the importer maps the whole
 * allocation and applies offsets itself). ote_cuda_ipc_export_alloc() does the same for
 * an owned allocation and holds its access lock until the export is destroyed, so the
 * memory cannot be freed while exported; a VMM allocation is exported as a POSIX fd
 * (cuMemExportToShareableHandle) that the export owns, and that the engine passes over a
 * UNIX socket (the importer maps it with ote_cuda_alloc_import_vmm()).
 *
 * Import (the peer): an ote_cuda_ipc_cache_t maps exports on one device and keeps them,
 * keyed by (exporter id, buffer id): the exporter id names the exporting process (the
 * engine's choice), the buffer id is the driver's never-reused id of the allocation.
 * Each ote_cuda_ipc_import() returns a mapping reference that its user puts back;
 * unused mappings stay cached, most recently used first, until the cache's bounds
 * (entries, bytes) need room, and the least recently used is closed
 * (cuIpcCloseMemHandle). A mapping is invalidated by a close receipt (the exporter says it
 * unregistered the buffer: ote_cuda_ipc_close_receipt()) or by the exporter's death
 * (ote_cuda_ipc_exporter_dead() drops everything of that exporter): an invalidated
 * mapping is never handed out again and is closed at once when unused, else when its
 * last user puts it back. An import that fails leaves nothing mapped. A close that fails
 * retains the mapping on the device (counted; ote_cuda_device_reclaim() retries).
 *
 * The cache is thread-safe; imports are serialized by its lock (a second importer of the
 * same key finds the first one's mapping).
 */
#ifndef OTE_CUDA_IPC_IPC_H
#define OTE_CUDA_IPC_IPC_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "cuda/driver.h"
#include "cuda/memory/device.h"
#include "cuda/memory/memory.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What an exporter sends to an importer (plain data; the engine encodes it). */
typedef struct ote_cuda_ipc_desc {
    ote_cu_ipc_mem_handle_t handle;
    unsigned long long buffer_id; /* the exporter's CU_POINTER_ATTRIBUTE_BUFFER_ID */
    ote_cu_deviceptr_t base;      /* the allocation's base in the exporter */
    uint64_t size;                /* the allocation's size */
    int32_t device_ordinal;       /* the exporter's device */
} ote_cuda_ipc_desc_t;

typedef struct ote_cuda_ipc_export ote_cuda_ipc_export_t;

ote_status_t ote_cuda_ipc_export_create(ote_cuda_device_t *dev, ote_cu_deviceptr_t ptr,
                                        ote_cuda_ipc_export_t **export_out);
ote_status_t ote_cuda_ipc_export_alloc(ote_cuda_alloc_t *a, ote_cuda_ipc_export_t **export_out);
/* A VMM allocation (cuMemCreate + cuMemMap, made by anyone in this process) mapped at the
 * range holding ptr: its handle (cuMemRetainAllocationHandle, released again at once)
 * exported as a POSIX fd that the export owns; the desc has no IPC handle (its base, size
 * and buffer id are the mapping's). OTE_ERR_NOT_FOUND when the range is not a VMM mapping
 * (cuMemAlloc memory: ote_cuda_ipc_export_create), OTE_ERR_UNSUPPORTED when its
 * allocation was created without the POSIX-fd handle type. The importer
 * maps [0, size) of the handle: the range must map its allocation whole, from offset 0. */
ote_status_t ote_cuda_ipc_export_vmm(ote_cuda_device_t *dev, ote_cu_deviceptr_t ptr,
                                     ote_cuda_ipc_export_t **export_out);
/* For a cuIpcGetMemHandle export (not VMM). */
const ote_cuda_ipc_desc_t *ote_cuda_ipc_export_desc(const ote_cuda_ipc_export_t *e);
/* The POSIX fd of a VMM export (owned by the export), -1 otherwise. */
int ote_cuda_ipc_export_fd(const ote_cuda_ipc_export_t *e);
void ote_cuda_ipc_export_destroy(ote_cuda_ipc_export_t *e);

typedef struct ote_cuda_ipc_cache ote_cuda_ipc_cache_t;
typedef struct ote_cuda_ipc_mapping ote_cuda_ipc_mapping_t;

typedef struct ote_cuda_ipc_cache_stats {
    size_t entries;         /* mappings open (in use, cached, or invalidated in use) */
    uint64_t bytes;         /* their sizes */
    size_t in_use;          /* mappings with users */
    uint64_t imports;       /* cuIpcOpenMemHandle calls (and VMM imports) that succeeded */
    uint64_t hits;          /* imports served from the cache */
    uint64_t evictions;     /* unused mappings closed to make room */
    uint64_t invalidations; /* by close receipts or exporter death */
} ote_cuda_ipc_cache_stats_t;

/* max_entries >= 1 and max_bytes >= 1 bound the open mappings. */
ote_status_t ote_cuda_ipc_cache_create(ote_cuda_device_t *dev, size_t max_entries,
                                       uint64_t max_bytes, ote_cuda_ipc_cache_t **cache_out);
/* OTE_ERR_BUSY while mappings are in use; else closes every mapping (failed closes are
 * retained on the device: OTE_ERR_RETAINED, the cache is gone either way). */
ote_status_t ote_cuda_ipc_cache_destroy(ote_cuda_ipc_cache_t *c);

/* A mapping of the export desc from exporter_id, opened or found in the cache; the caller
 * is a user until ote_cuda_ipc_mapping_put(). OTE_ERR_TOO_BIG when the allocation alone is
 * over max_bytes; OTE_ERR_AGAIN when in-use mappings fill the cache. */
ote_status_t ote_cuda_ipc_import(ote_cuda_ipc_cache_t *c, uint64_t exporter_id,
                                 const ote_cuda_ipc_desc_t *desc, ote_cuda_ipc_mapping_t **map_out);
/* As ote_cuda_ipc_import for a VMM export: fd is the exporter's POSIX fd (received over
 * a UNIX socket; it stays the caller's, who closes it); a new mapping imports it
 * (cuMemImportFromShareableHandle, cuMemAddressReserve, cuMemMap, cuMemSetAccess through
 * ote_cuda_alloc_import_vmm()), a cached one is found as any other. Closing the mapping
 * (eviction, close receipt, exporter death, cache destroy) unmaps it, frees the range and
 * releases the handle (a failure is retained on the device). */
ote_status_t ote_cuda_ipc_import_vmm(ote_cuda_ipc_cache_t *c, uint64_t exporter_id,
                                     const ote_cuda_ipc_desc_t *desc, int fd,
                                     ote_cuda_ipc_mapping_t **map_out);
void ote_cuda_ipc_mapping_put(ote_cuda_ipc_cache_t *c, ote_cuda_ipc_mapping_t *m);
/* The local address of the whole allocation. */
ote_cu_deviceptr_t ote_cuda_ipc_mapping_base(const ote_cuda_ipc_mapping_t *m);
/* The local address of [remote, remote + len) given in the exporter's addresses;
 * OTE_ERR_ACCESS when outside the allocation. */
ote_status_t ote_cuda_ipc_mapping_translate(const ote_cuda_ipc_mapping_t *m,
                                            ote_cu_deviceptr_t remote, size_t len,
                                            ote_cu_deviceptr_t *local_out);
/* Close receipt: the exporter unregistered buffer_id. OTE_ERR_NOT_FOUND when nothing of it
 * is cached. */
ote_status_t ote_cuda_ipc_close_receipt(ote_cuda_ipc_cache_t *c, uint64_t exporter_id,
                                        unsigned long long buffer_id);
/* The exporter died: every mapping of it is invalidated. Returns how many were. */
size_t ote_cuda_ipc_exporter_dead(ote_cuda_ipc_cache_t *c, uint64_t exporter_id);
void ote_cuda_ipc_cache_stats(ote_cuda_ipc_cache_t *c, ote_cuda_ipc_cache_stats_t *out);

#ifdef __cplusplus
}
#endif
#endif

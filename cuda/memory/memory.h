/*
 * cuda/memory/memory.h - GPU memory: pointer classification, device allocations with an
 * access lock, SYNC_MEMOPS for memory a NIC reads, and dmabuf export for GPUDirect RDMA.
 *
 * Classification asks the driver (cuPointerGetAttributes) and never dereferences: a
 * device address is not host-addressable. Memory the driver does not know is ordinary
 * pageable host memory.
 *
 * An ote_cuda_alloc_t owns one device allocation: cuMemAlloc, or with
 * OTE_CUDA_ALLOC_VMM a cuMemCreate handle exportable as a POSIX fd, reserved, mapped and
 * made accessible on its device. Its access lock counts users (copies in flight, NIC
 * registrations, IPC exports): each takes ote_cuda_alloc_acquire() for as long as the
 * memory may be touched. Destroy refuses new users at once, waits for the current ones
 * until its deadline (OTE_ERR_BUSY after it, the allocation intact and usable again),
 * and a failed native free retains the allocation on its device (OTE_ERR_RETAINED).
 */
#ifndef OTE_CUDA_MEMORY_MEMORY_H
#define OTE_CUDA_MEMORY_MEMORY_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "base/time.h"
#include "cuda/driver.h"
#include "cuda/memory/device.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    OTE_CUDA_MEM_PAGEABLE = 0, /* host memory the driver does not know */
    OTE_CUDA_MEM_PINNED = 1,   /* host memory from cuMemHostAlloc / cuMemHostRegister */
    OTE_CUDA_MEM_DEVICE = 2,   /* device memory */
    OTE_CUDA_MEM_MANAGED = 3,  /* unified (managed) memory */
} ote_cuda_mem_kind_t;

typedef struct ote_cuda_pointer_info {
    ote_cuda_mem_kind_t kind;
    int device_ordinal;             /* -1 for pageable memory */
    ote_cu_context_t context;       /* NULL for pageable memory */
    unsigned long long buffer_id;   /* process-wide unique, never reused; 0 for pageable */
    ote_cu_deviceptr_t range_start; /* the whole allocation holding the pointer */
    size_t range_size;
} ote_cuda_pointer_info_t;

ote_status_t ote_cuda_pointer_classify(ote_cuda_driver_t *drv, ote_cu_deviceptr_t ptr,
                                       ote_cuda_pointer_info_t *info_out);

/* cuPointerSetAttribute(SYNC_MEMOPS = 1) on the allocation holding ptr: synchronous
 * memory operations on it complete before returning, which a NIC reading the memory
 * needs. Call it before exposing device memory to a NIC. */
ote_status_t ote_cuda_pointer_set_sync_memops(ote_cuda_device_t *dev, ote_cu_deviceptr_t ptr);

/* GPUDirect RDMA registration data for [ptr, ptr + len) of device memory: a dmabuf fd
 * over the page-aligned range that starts at the allocation's base, and the offset of
 * ptr in it (for ibv_reg_dmabuf_mr(pd, offset, len, iova, fd, access)). The caller owns
 * the fd: ote_cuda_dmabuf_close() closes it. */
typedef struct ote_cuda_dmabuf {
    int fd;
    uint64_t offset;         /* ptr - base */
    size_t length;           /* exported length from base, page multiple */
    ote_cu_deviceptr_t base; /* exported range start (the allocation base) */
} ote_cuda_dmabuf_t;

ote_status_t ote_cuda_dmabuf_export(ote_cuda_device_t *dev, ote_cu_deviceptr_t ptr, size_t len,
                                    ote_cuda_dmabuf_t *out);
void ote_cuda_dmabuf_close(ote_cuda_dmabuf_t *d);

typedef struct ote_cuda_alloc ote_cuda_alloc_t;

#define OTE_CUDA_ALLOC_VMM 0x1u /* cuMemCreate, exportable as a POSIX fd */

ote_status_t ote_cuda_alloc_create(ote_cuda_device_t *dev, size_t size, unsigned flags,
                                   ote_cuda_alloc_t **alloc_out);
/* Maps a VMM allocation exported by another process as a POSIX fd (the exporter's
 * ote_cuda_ipc_export_fd(), passed over a UNIX socket) on dev, size bytes (the
 * exporter's allocation size, a multiple of the granularity). The fd stays the caller's.
 * Destroy unmaps it and releases the imported handle. */
ote_status_t ote_cuda_alloc_import_vmm(ote_cuda_device_t *dev, int fd, size_t size,
                                       ote_cuda_alloc_t **alloc_out);
/* OTE_OK (freed), OTE_ERR_BUSY (users remain at the deadline; nothing changed),
 * OTE_ERR_RETAINED (native free failed; retained on the device). */
ote_status_t ote_cuda_alloc_destroy(ote_cuda_alloc_t *a, ote_deadline_t deadline);

ote_cu_deviceptr_t ote_cuda_alloc_ptr(const ote_cuda_alloc_t *a);
size_t ote_cuda_alloc_size(const ote_cuda_alloc_t *a);
ote_cuda_device_t *ote_cuda_alloc_device(const ote_cuda_alloc_t *a);
int ote_cuda_alloc_is_vmm(const ote_cuda_alloc_t *a);
/* The VMM allocation handle (0 for a cuMemAlloc allocation). */
ote_cu_mem_handle_t ote_cuda_alloc_vmm_handle(const ote_cuda_alloc_t *a);

/* Access lock: a user of the memory. OTE_ERR_STATE once destroy has begun. */
ote_status_t ote_cuda_alloc_acquire(ote_cuda_alloc_t *a);
void ote_cuda_alloc_release(ote_cuda_alloc_t *a);
uint32_t ote_cuda_alloc_users(ote_cuda_alloc_t *a);

#ifdef __cplusplus
}
#endif
#endif

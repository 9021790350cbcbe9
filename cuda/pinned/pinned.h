/*
 * cuda/pinned/pinned.h - pinned (page-locked) host memory and the staging chunk pool.
 *
 * An ote_cuda_host_mem_t owns either a cuMemHostAlloc allocation or a cuMemHostRegister
 * registration of caller memory (the caller keeps owning those bytes; they must outlive
 * the registration). Both are portable (usable from every context). Its access lock
 * counts users (async copies in flight, NIC registrations): destroy refuses new users,
 * waits for current ones until its deadline (OTE_ERR_BUSY after it, nothing changed), and
 * a failed native free/unregister retains the owner on its device (OTE_ERR_RETAINED).
 *
 * An ote_cuda_staging_t is a bounded pool of fixed-size pinned chunks carved from one
 * cuMemHostAlloc allocation. Acquire waits for a free chunk until its deadline
 * (OTE_ERR_TIMEOUT); waiters are served as chunks come back. A chunk is owned by its
 * acquirer until released (a copy stream may hold it until its copy completes). The pool
 * refuses to die while chunks are out (OTE_ERR_BUSY).
 */
#ifndef OTE_CUDA_PINNED_PINNED_H
#define OTE_CUDA_PINNED_PINNED_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "base/time.h"
#include "cuda/memory/device.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ote_cuda_host_mem ote_cuda_host_mem_t;

ote_status_t ote_cuda_host_alloc(ote_cuda_device_t *dev, size_t size,
                                 ote_cuda_host_mem_t **mem_out);
/* Pins [ptr, ptr + size) of caller memory. */
ote_status_t ote_cuda_host_register(ote_cuda_device_t *dev, void *ptr, size_t size,
                                    ote_cuda_host_mem_t **mem_out);
ote_status_t ote_cuda_host_mem_destroy(ote_cuda_host_mem_t *m, ote_deadline_t deadline);

void *ote_cuda_host_mem_ptr(const ote_cuda_host_mem_t *m);
size_t ote_cuda_host_mem_size(const ote_cuda_host_mem_t *m);
int ote_cuda_host_mem_is_registered(const ote_cuda_host_mem_t *m);
ote_cuda_device_t *ote_cuda_host_mem_device(const ote_cuda_host_mem_t *m);

/* Access lock: OTE_ERR_STATE once destroy has begun. */
ote_status_t ote_cuda_host_mem_acquire(ote_cuda_host_mem_t *m);
void ote_cuda_host_mem_release(ote_cuda_host_mem_t *m);
uint32_t ote_cuda_host_mem_users(ote_cuda_host_mem_t *m);

typedef struct ote_cuda_staging ote_cuda_staging_t;
typedef struct ote_cuda_chunk {
    void *ptr;
    size_t size;
    uint32_t index;
} ote_cuda_chunk_t;

ote_status_t ote_cuda_staging_create(ote_cuda_device_t *dev, size_t chunk_size,
                                     uint32_t chunk_count, ote_cuda_staging_t **pool_out);
/* OTE_ERR_BUSY while chunks are out; then the pinned memory is destroyed (its
 * OTE_ERR_RETAINED is passed on: the pool object is freed, the memory retained). */
ote_status_t ote_cuda_staging_destroy(ote_cuda_staging_t *pool);
/* A free chunk, waiting until deadline: OTE_ERR_TIMEOUT when none came back in time. */
ote_status_t ote_cuda_staging_acquire(ote_cuda_staging_t *pool, ote_deadline_t deadline,
                                      ote_cuda_chunk_t *chunk_out);
/* OTE_ERR_INVALID for a chunk this pool did not hand out. */
ote_status_t ote_cuda_staging_release(ote_cuda_staging_t *pool, const ote_cuda_chunk_t *chunk);
uint32_t ote_cuda_staging_free_count(ote_cuda_staging_t *pool);
ote_cuda_host_mem_t *ote_cuda_staging_host_mem(ote_cuda_staging_t *pool);

#ifdef __cplusplus
}
#endif
#endif

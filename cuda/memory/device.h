/*
 * cuda/memory/device.h - one GPU as an owner: its primary context and the native
 * objects that cuda/ owners retained on it.
 *
 * ote_cuda_device_open() retains the device's primary context (cuDevicePrimaryCtxRetain;
 * the driver refcounts it, so several opens of one ordinal are fine) and
 * ote_cuda_device_close() releases it. Every owner built on a device (allocations,
 * pinned host memory, streams, IPC caches) holds a reference on it from create to
 * destroy, so a device with live owners refuses to close (OTE_ERR_BUSY).
 *
 * Threads that call the driver for a device make its context current first
 * (ote_cuda_device_make_current()); every owner does this itself before its calls, so
 * callers never need to.
 *
 * Retention: when an owner's native cleanup fails or its outcome is unknown, the owner
 * keeps its native objects and parks itself on its device's retained list (an embedded
 * node, so retaining never allocates). ote_cuda_device_reclaim() retries each parked
 * owner's cleanup; one that succeeds is freed and drops its device reference. A failed
 * primary-context release retains the device itself (OTE_ERR_RETAINED from close; close
 * it again later). Both are counted in ote_cuda_driver_retained().
 */
#ifndef OTE_CUDA_MEMORY_DEVICE_H
#define OTE_CUDA_MEMORY_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "cuda/driver.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ote_cuda_device ote_cuda_device_t;

ote_status_t ote_cuda_device_open(ote_cuda_driver_t *drv, int ordinal, ote_cuda_device_t **dev_out);
/* OTE_ERR_BUSY while owners (or retained owners) live; OTE_ERR_RETAINED when the primary
 * context release failed (the device stays open; call close again later). */
ote_status_t ote_cuda_device_close(ote_cuda_device_t *dev);
/* Makes the device's primary context current on the calling thread. */
ote_status_t ote_cuda_device_make_current(ote_cuda_device_t *dev);
/* Retries the cleanup of every retained owner of the device. *left_out (optional) is the
 * number still retained afterwards. OTE_OK when none is left, OTE_ERR_RETAINED else. */
ote_status_t ote_cuda_device_reclaim(ote_cuda_device_t *dev, size_t *left_out);
size_t ote_cuda_device_retained(ote_cuda_device_t *dev);
/* Live owners built on the device (retained ones included). */
size_t ote_cuda_device_owners(ote_cuda_device_t *dev);

ote_cuda_driver_t *ote_cuda_device_driver(const ote_cuda_device_t *dev);
const ote_cuda_driver_table_t *ote_cuda_device_table(const ote_cuda_device_t *dev);
int ote_cuda_device_ordinal(const ote_cuda_device_t *dev);
ote_cu_device_t ote_cuda_device_handle(const ote_cuda_device_t *dev);
ote_cu_context_t ote_cuda_device_context(const ote_cuda_device_t *dev);
/* Device name as the driver reports it (NUL-terminated, never NULL). */
const char *ote_cuda_device_name(const ote_cuda_device_t *dev);

/* ---- for the cuda/ owners only ---- */

/* An owner's cleanup retry: OTE_OK when the native objects are gone and the owner freed
 * (it must then have dropped its device reference with ote__cuda_device_unref()). */
typedef ote_status_t (*ote__cuda_retry_fn)(void *owner);
typedef struct ote__cuda_retained_node {
    struct ote__cuda_retained_node *next;
    ote__cuda_retry_fn retry;
    void *owner;
    const char *what;
} ote__cuda_retained_node_t;

void ote__cuda_device_ref(ote_cuda_device_t *dev);
void ote__cuda_device_unref(ote_cuda_device_t *dev);
/* Parks an owner on the device's retained list (counted). The node lives in the owner. */
void ote__cuda_device_retain(ote_cuda_device_t *dev, ote__cuda_retained_node_t *node, void *owner,
                             ote__cuda_retry_fn retry, const char *what);

#ifdef __cplusplus
}
#endif
#endif

/*
 * cuda/driver.h - the CUDA driver API table, loaded at run time.
 *
 * OrbitTE never links libcuda: the driver is opened with dlopen() when a GPU path is
 * first needed, so the same binaries run on machines without a GPU. Every driver call
 * goes through an ote_cuda_driver_t, which tests may build from a fake table instead.
 * A missing driver library is OTE_ERR_NO_DEVICE; a driver that lacks a required entry
 * point is OTE_ERR_UNSUPPORTED naming the symbol. Driver results (CUresult, an int) map
 * to statuses with ote_cuda_status(), keeping the CUresult as the errno field.
 *
 * Only the types the table needs are declared here (the CUDA driver ABI: handles are
 * pointers, device pointers are 64-bit), so no CUDA header is required to build.
 */
#ifndef OTE_CUDA_DRIVER_H
#define OTE_CUDA_DRIVER_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef int ote_cu_result_t;         /* CUresult; 0 = CUDA_SUCCESS */
typedef int ote_cu_device_t;         /* CUdevice */
typedef struct ote_cu_ctx *ote_cu_context_t;
typedef struct ote_cu_stream *ote_cu_stream_t;
typedef struct ote_cu_event *ote_cu_event_t;
typedef uint64_t ote_cu_deviceptr_t; /* CUdeviceptr */

#define OTE_CU_SUCCESS 0
#define OTE_CU_ERROR_INVALID_VALUE 1
#define OTE_CU_ERROR_NOT_READY 600
#define OTE_CU_ERROR_NO_DEVICE 100
#define OTE_CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define OTE_CU_MEMORYTYPE_HOST 1
#define OTE_CU_MEMORYTYPE_DEVICE 2

/* The driver entry points OrbitTE uses (CUDA driver API, _v2 ABI where it exists). */
typedef struct ote_cuda_driver_table {
    ote_cu_result_t (*cuInit)(unsigned int flags);
    ote_cu_result_t (*cuDriverGetVersion)(int *version);
    ote_cu_result_t (*cuDeviceGetCount)(int *count);
    ote_cu_result_t (*cuDeviceGet)(ote_cu_device_t *dev, int ordinal);
    ote_cu_result_t (*cuDeviceGetName)(char *name, int len, ote_cu_device_t dev);
    ote_cu_result_t (*cuDevicePrimaryCtxRetain)(ote_cu_context_t *ctx, ote_cu_device_t dev);
    ote_cu_result_t (*cuDevicePrimaryCtxRelease)(ote_cu_device_t dev);
    ote_cu_result_t (*cuCtxSetCurrent)(ote_cu_context_t ctx);
    ote_cu_result_t (*cuMemAlloc)(ote_cu_deviceptr_t *dptr, size_t bytes);
    ote_cu_result_t (*cuMemFree)(ote_cu_deviceptr_t dptr);
    ote_cu_result_t (*cuMemcpyHtoD)(ote_cu_deviceptr_t dst, const void *src, size_t bytes);
    ote_cu_result_t (*cuMemcpyDtoH)(void *dst, ote_cu_deviceptr_t src, size_t bytes);
    ote_cu_result_t (*cuPointerGetAttribute)(void *data, int attribute, ote_cu_deviceptr_t ptr);
    ote_cu_result_t (*cuStreamCreate)(ote_cu_stream_t *stream, unsigned int flags);
    ote_cu_result_t (*cuStreamDestroy)(ote_cu_stream_t stream);
    ote_cu_result_t (*cuEventCreate)(ote_cu_event_t *event, unsigned int flags);
    ote_cu_result_t (*cuEventRecord)(ote_cu_event_t event, ote_cu_stream_t stream);
    ote_cu_result_t (*cuEventQuery)(ote_cu_event_t event);
    ote_cu_result_t (*cuEventDestroy)(ote_cu_event_t event);
} ote_cuda_driver_table_t;

typedef struct ote_cuda_driver ote_cuda_driver_t;

/* Open the driver library (path NULL = "libcuda.so.1"), resolve every entry point and
 * call cuInit(0). OTE_ERR_NO_DEVICE when the library is absent or reports no device. */
ote_status_t ote_cuda_driver_load(const char *path, ote_cuda_driver_t **drv_out);
/* Build a driver over a caller-supplied table (tests' fake drivers). Every entry must be
 * set (OTE_ERR_INVALID names the first missing one in the log). cuInit(0) is called. */
ote_status_t ote_cuda_driver_from_table(const ote_cuda_driver_table_t *table,
                                        ote_cuda_driver_t **drv_out);
void ote_cuda_driver_unload(ote_cuda_driver_t *drv);
const ote_cuda_driver_table_t *ote_cuda_driver_table(const ote_cuda_driver_t *drv);

/* Status for a CUresult: OTE_OK, OTE_ERR_AGAIN (NOT_READY), OTE_ERR_NO_DEVICE, or
 * OTE_ERR_NATIVE carrying the CUresult. */
ote_status_t ote_cuda_status(ote_cu_result_t res);

/* Number of devices, and whether ptr is device memory of this driver (host memory and
 * pointers the driver does not know are reported as not device memory). */
ote_status_t ote_cuda_device_count(ote_cuda_driver_t *drv, int *count_out);
ote_status_t ote_cuda_pointer_is_device(ote_cuda_driver_t *drv, const void *ptr, int *is_device_out);

#ifdef __cplusplus
}
#endif
#endif

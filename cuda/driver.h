/*
 * cuda/driver.h - the CUDA driver API table, loaded at run time.
 *
 * OrbitTE never links libcuda: the driver is opened with dlopen() when a GPU path is
 * first needed (`libcuda.so.1`, or the file named by $OTE_CUDA_LIBRARY), so the same
 * binaries run on machines without a GPU. Entry points are resolved through
 * cuGetProcAddress_v2 (asking for the CUDA 12.0 ABI) when the library has it, else with
 * dlsym of the versioned symbol (cuMemAlloc_v2, ...). Every driver call of the cuda/
 * owners goes through an ote_cuda_driver_t, which tests may also build from a table.
 *
 * A missing driver library is OTE_ERR_NO_DEVICE; a driver that lacks a required entry
 * point is OTE_ERR_UNSUPPORTED naming the symbol. Driver results (CUresult) map to
 * statuses with ote_cuda_status(), keeping the CUresult as the status's errno field;
 * ote_cuda_check() also logs the failed call with the driver's own name for the result
 * (cuGetErrorName), so "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY (2)" reaches the log.
 *
 * The declarations below are OrbitTE's own copy of the parts of the driver ABI that the
 * owners use (no CUDA header is needed to build). tests/cuda:header_check_test compiles
 * them against the toolkit's cuda.h and static-asserts that values, sizes and layouts
 * are the real ones.
 *
 * The driver object also counts the native owners that the cuda/ owners retained
 * after a failed or ambiguous cleanup (ote_cuda_driver_retained()).
 */
#ifndef OTE_CUDA_DRIVER_H
#define OTE_CUDA_DRIVER_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef int ote_cu_result_t;                      /* CUresult; 0 = CUDA_SUCCESS */
typedef int ote_cu_device_t;                      /* CUdevice */
typedef struct ote_cu_ctx_st *ote_cu_context_t;   /* CUcontext */
typedef struct ote_cu_stream_st *ote_cu_stream_t; /* CUstream */
typedef struct ote_cu_event_st *ote_cu_event_t;   /* CUevent */
typedef unsigned long long ote_cu_deviceptr_t;    /* CUdeviceptr (64-bit) */
typedef unsigned long long ote_cu_mem_handle_t;   /* CUmemGenericAllocationHandle */
typedef void (*ote_cu_host_fn)(void *user_data);  /* CUhostFn */

#define OTE_CU_IPC_HANDLE_SIZE 64
typedef struct ote_cu_ipc_mem_handle {
    char reserved[OTE_CU_IPC_HANDLE_SIZE];
} ote_cu_ipc_mem_handle_t; /* CUipcMemHandle, passed by value */

typedef struct ote_cu_mem_location {
    int type; /* CUmemLocationType */
    int id;
} ote_cu_mem_location_t; /* CUmemLocation */

typedef struct ote_cu_mem_allocation_prop {
    int type;                   /* CUmemAllocationType */
    int requested_handle_types; /* CUmemAllocationHandleType */
    ote_cu_mem_location_t location;
    void *win32_handle_meta_data;
    struct {
        unsigned char compression_type;
        unsigned char gpu_direct_rdma_capable;
        unsigned short usage;
        unsigned char reserved[4];
    } alloc_flags;
} ote_cu_mem_allocation_prop_t; /* CUmemAllocationProp */

typedef struct ote_cu_mem_access_desc {
    ote_cu_mem_location_t location;
    int flags;              /* CUmemAccess_flags */
} ote_cu_mem_access_desc_t; /* CUmemAccessDesc */

/* CUresult values the owners act on. */
#define OTE_CU_SUCCESS 0
#define OTE_CU_ERROR_INVALID_VALUE 1
#define OTE_CU_ERROR_OUT_OF_MEMORY 2
#define OTE_CU_ERROR_NOT_INITIALIZED 3
#define OTE_CU_ERROR_DEINITIALIZED 4
#define OTE_CU_ERROR_NO_DEVICE 100
#define OTE_CU_ERROR_INVALID_DEVICE 101
#define OTE_CU_ERROR_INVALID_CONTEXT 201
#define OTE_CU_ERROR_MAP_FAILED 205
#define OTE_CU_ERROR_ALREADY_MAPPED 208
#define OTE_CU_ERROR_ECC_UNCORRECTABLE 214
#define OTE_CU_ERROR_INVALID_HANDLE 400
#define OTE_CU_ERROR_NOT_FOUND 500
#define OTE_CU_ERROR_NOT_READY 600
#define OTE_CU_ERROR_ILLEGAL_ADDRESS 700
#define OTE_CU_ERROR_LAUNCH_FAILED 719
#define OTE_CU_ERROR_HOST_MEMORY_ALREADY_REGISTERED 712
#define OTE_CU_ERROR_NOT_PERMITTED 800
#define OTE_CU_ERROR_NOT_SUPPORTED 801
#define OTE_CU_ERROR_UNKNOWN 999

/* CUpointer_attribute */
#define OTE_CU_POINTER_ATTRIBUTE_CONTEXT 1
#define OTE_CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define OTE_CU_POINTER_ATTRIBUTE_DEVICE_POINTER 3
#define OTE_CU_POINTER_ATTRIBUTE_HOST_POINTER 4
#define OTE_CU_POINTER_ATTRIBUTE_SYNC_MEMOPS 6
#define OTE_CU_POINTER_ATTRIBUTE_BUFFER_ID 7
#define OTE_CU_POINTER_ATTRIBUTE_IS_MANAGED 8
#define OTE_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define OTE_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR 11
#define OTE_CU_POINTER_ATTRIBUTE_RANGE_SIZE 12
#define OTE_CU_POINTER_ATTRIBUTE_MAPPED 13

/* CUmemorytype */
#define OTE_CU_MEMORYTYPE_HOST 1
#define OTE_CU_MEMORYTYPE_DEVICE 2
#define OTE_CU_MEMORYTYPE_ARRAY 3
#define OTE_CU_MEMORYTYPE_UNIFIED 4

/* CUdevice_attribute */
#define OTE_CU_DEVICE_ATTRIBUTE_PCI_BUS_ID 33
#define OTE_CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING 41
#define OTE_CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED 102
#define OTE_CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED 116
#define OTE_CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED 124

/* Flags */
#define OTE_CU_STREAM_NON_BLOCKING 0x1
#define OTE_CU_EVENT_DISABLE_TIMING 0x2
#define OTE_CU_MEMHOSTALLOC_PORTABLE 0x01
#define OTE_CU_MEMHOSTREGISTER_PORTABLE 0x01
#define OTE_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 0x1
#define OTE_CU_GET_PROC_ADDRESS_DEFAULT 0
#define OTE_CU_GET_PROC_ADDRESS_SUCCESS 0

/* VMM and range handles */
#define OTE_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 0x1
#define OTE_CU_MEM_ALLOCATION_TYPE_PINNED 0x1
#define OTE_CU_MEM_LOCATION_TYPE_DEVICE 0x1
#define OTE_CU_MEM_ACCESS_FLAGS_PROT_READWRITE 0x3
#define OTE_CU_MEM_ALLOC_GRANULARITY_MINIMUM 0x0
#define OTE_CU_MEM_ALLOC_GRANULARITY_RECOMMENDED 0x1
#define OTE_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD 0x1

/* The CUDA version passed to cuGetProcAddress_v2: the ABI of every entry point below. */
#define OTE_CU_PROC_ADDRESS_VERSION 12000

/* The driver entry points OrbitTE uses, by base name, with the ABI of the versioned
 * symbol named in the comment where it differs from the base name. */
typedef struct ote_cuda_driver_table {
    ote_cu_result_t (*cuInit)(unsigned int flags);
    ote_cu_result_t (*cuDriverGetVersion)(int *version);
    ote_cu_result_t (*cuGetErrorName)(ote_cu_result_t error, const char **str);
    ote_cu_result_t (*cuGetErrorString)(ote_cu_result_t error, const char **str);
    ote_cu_result_t (*cuDeviceGetCount)(int *count);
    ote_cu_result_t (*cuDeviceGet)(ote_cu_device_t *dev, int ordinal);
    ote_cu_result_t (*cuDeviceGetName)(char *name, int len, ote_cu_device_t dev);
    ote_cu_result_t (*cuDeviceGetAttribute)(int *value, int attrib, ote_cu_device_t dev);
    ote_cu_result_t (*cuDeviceGetPCIBusId)(char *bus_id, int len, ote_cu_device_t dev);
    ote_cu_result_t (*cuDevicePrimaryCtxRetain)(ote_cu_context_t *ctx, ote_cu_device_t dev);
    ote_cu_result_t (*cuDevicePrimaryCtxRelease)(ote_cu_device_t dev); /* _v2 */
    ote_cu_result_t (*cuCtxSetCurrent)(ote_cu_context_t ctx);
    ote_cu_result_t (*cuCtxGetCurrent)(ote_cu_context_t *ctx);
    ote_cu_result_t (*cuCtxGetDevice)(ote_cu_device_t *dev);
    ote_cu_result_t (*cuMemAlloc)(ote_cu_deviceptr_t *dptr, size_t bytes); /* _v2 */
    ote_cu_result_t (*cuMemFree)(ote_cu_deviceptr_t dptr);                 /* _v2 */
    ote_cu_result_t (*cuMemGetAddressRange)(ote_cu_deviceptr_t *base, size_t *size,
                                            ote_cu_deviceptr_t dptr); /* _v2 */
    ote_cu_result_t (*cuMemHostAlloc)(void **pp, size_t bytes, unsigned int flags);
    ote_cu_result_t (*cuMemFreeHost)(void *p);
    ote_cu_result_t (*cuMemHostRegister)(void *p, size_t bytes, unsigned int flags); /* _v2 */
    ote_cu_result_t (*cuMemHostUnregister)(void *p);
    ote_cu_result_t (*cuMemcpyHtoD)(ote_cu_deviceptr_t dst, const void *src, size_t bytes);
    ote_cu_result_t (*cuMemcpyDtoH)(void *dst, ote_cu_deviceptr_t src, size_t bytes);
    ote_cu_result_t (*cuMemcpyDtoD)(ote_cu_deviceptr_t dst, ote_cu_deviceptr_t src, size_t bytes);
    ote_cu_result_t (*cuMemcpyHtoDAsync)(ote_cu_deviceptr_t dst, const void *src, size_t bytes,
                                         ote_cu_stream_t stream);
    ote_cu_result_t (*cuMemcpyDtoHAsync)(void *dst, ote_cu_deviceptr_t src, size_t bytes,
                                         ote_cu_stream_t stream);
    ote_cu_result_t (*cuMemcpyDtoDAsync)(ote_cu_deviceptr_t dst, ote_cu_deviceptr_t src,
                                         size_t bytes, ote_cu_stream_t stream);
    ote_cu_result_t (*cuMemsetD8)(ote_cu_deviceptr_t dst, unsigned char value, size_t n);
    ote_cu_result_t (*cuPointerGetAttribute)(void *data, int attribute, ote_cu_deviceptr_t ptr);
    ote_cu_result_t (*cuPointerGetAttributes)(unsigned int n, int *attributes, void **data,
                                              ote_cu_deviceptr_t ptr);
    ote_cu_result_t (*cuPointerSetAttribute)(const void *value, int attribute,
                                             ote_cu_deviceptr_t ptr);
    ote_cu_result_t (*cuStreamCreate)(ote_cu_stream_t *stream, unsigned int flags);
    ote_cu_result_t (*cuStreamDestroy)(ote_cu_stream_t stream); /* _v2 */
    ote_cu_result_t (*cuStreamQuery)(ote_cu_stream_t stream);
    ote_cu_result_t (*cuStreamSynchronize)(ote_cu_stream_t stream);
    ote_cu_result_t (*cuLaunchHostFunc)(ote_cu_stream_t stream, ote_cu_host_fn fn, void *user_data);
    ote_cu_result_t (*cuEventCreate)(ote_cu_event_t *event, unsigned int flags);
    ote_cu_result_t (*cuEventRecord)(ote_cu_event_t event, ote_cu_stream_t stream);
    ote_cu_result_t (*cuEventQuery)(ote_cu_event_t event);
    ote_cu_result_t (*cuEventSynchronize)(ote_cu_event_t event);
    ote_cu_result_t (*cuEventDestroy)(ote_cu_event_t event); /* _v2 */
    ote_cu_result_t (*cuIpcGetMemHandle)(ote_cu_ipc_mem_handle_t *handle, ote_cu_deviceptr_t dptr);
    ote_cu_result_t (*cuIpcOpenMemHandle)(ote_cu_deviceptr_t *dptr, ote_cu_ipc_mem_handle_t handle,
                                          unsigned int flags); /* _v2 */
    ote_cu_result_t (*cuIpcCloseMemHandle)(ote_cu_deviceptr_t dptr);
    ote_cu_result_t (*cuMemGetHandleForAddressRange)(void *handle, ote_cu_deviceptr_t dptr,
                                                     size_t size, int handle_type,
                                                     unsigned long long flags);
    ote_cu_result_t (*cuMemGetAllocationGranularity)(size_t *granularity,
                                                     const ote_cu_mem_allocation_prop_t *prop,
                                                     int option);
    ote_cu_result_t (*cuMemCreate)(ote_cu_mem_handle_t *handle, size_t size,
                                   const ote_cu_mem_allocation_prop_t *prop,
                                   unsigned long long flags);
    ote_cu_result_t (*cuMemRelease)(ote_cu_mem_handle_t handle);
    ote_cu_result_t (*cuMemAddressReserve)(ote_cu_deviceptr_t *ptr, size_t size, size_t alignment,
                                           ote_cu_deviceptr_t addr, unsigned long long flags);
    ote_cu_result_t (*cuMemAddressFree)(ote_cu_deviceptr_t ptr, size_t size);
    ote_cu_result_t (*cuMemMap)(ote_cu_deviceptr_t ptr, size_t size, size_t offset,
                                ote_cu_mem_handle_t handle, unsigned long long flags);
    ote_cu_result_t (*cuMemUnmap)(ote_cu_deviceptr_t ptr, size_t size);
    ote_cu_result_t (*cuMemSetAccess)(ote_cu_deviceptr_t ptr, size_t size,
                                      const ote_cu_mem_access_desc_t *desc, size_t count);
    ote_cu_result_t (*cuMemExportToShareableHandle)(void *shareable_handle,
                                                    ote_cu_mem_handle_t handle, int handle_type,
                                                    unsigned long long flags);
    ote_cu_result_t (*cuMemImportFromShareableHandle)(ote_cu_mem_handle_t *handle, void *os_handle,
                                                      int handle_type);
    /* The allocation handle mapped at addr (a VMM mapping); released with cuMemRelease. */
    ote_cu_result_t (*cuMemRetainAllocationHandle)(ote_cu_mem_handle_t *handle, void *addr);
} ote_cuda_driver_table_t;

typedef struct ote_cuda_driver ote_cuda_driver_t;

/* Open the driver library and call cuInit(0). path NULL = $OTE_CUDA_LIBRARY when set,
 * else "libcuda.so.1". OTE_ERR_NO_DEVICE when the library is absent or cuInit says there
 * is no device; OTE_ERR_UNSUPPORTED when an entry point is missing. */
/* Whether a CUDA driver library can be loaded from path (NULL: $OTE_CUDA_LIBRARY, else
 * libcuda.so.1) and has cuInit, without initialising it or keeping it mapped. Silent. */
int ote_cuda_driver_present(const char *path);
ote_status_t ote_cuda_driver_load(const char *path, ote_cuda_driver_t **drv_out);
/* Build a driver over a caller-supplied table. Every entry must be set (OTE_ERR_INVALID
 * names the first missing one in the log). cuInit(0) is called. */
ote_status_t ote_cuda_driver_from_table(const ote_cuda_driver_table_t *table,
                                        ote_cuda_driver_t **drv_out);
/* Closes the library. The caller must have destroyed every owner built on it; a driver
 * whose owners retained native objects is still unloaded only when the count is 0
 * (OTE_ERR_BUSY otherwise: unloading would unmap code those objects' callbacks use). */
ote_status_t ote_cuda_driver_unload(ote_cuda_driver_t *drv);
const ote_cuda_driver_table_t *ote_cuda_driver_table(const ote_cuda_driver_t *drv);
/* The dlopen handle (NULL for a table-built driver): tests look up the fake's control
 * functions on it. */
void *ote_cuda_driver_dl_handle(const ote_cuda_driver_t *drv);
/* Whether the table was resolved through cuGetProcAddress_v2 (else dlsym). */
int ote_cuda_driver_used_proc_address(const ote_cuda_driver_t *drv);

/* Status for a CUresult, the CUresult kept as the errno field: OTE_OK; OTE_ERR_AGAIN
 * (NOT_READY); OTE_ERR_NO_DEVICE; OTE_ERR_DEVICE_FATAL (sticky errors: ECC, illegal
 * address, launch failure); OTE_ERR_NATIVE otherwise. */
ote_status_t ote_cuda_status(ote_cu_result_t res);
/* The driver's name for a CUresult ("CUDA_ERROR_OUT_OF_MEMORY"), or "CUresult N" when
 * the driver does not know it. Never NULL; a static string. */
const char *ote_cuda_result_name(const ote_cuda_driver_t *drv, ote_cu_result_t res);
/* ote_cuda_status(res); a failure is logged at WARN as "<call>: <name> (<res>)". */
ote_status_t ote_cuda_check(const ote_cuda_driver_t *drv, ote_cu_result_t res, const char *call);

/* Number of devices. */
ote_status_t ote_cuda_device_count(ote_cuda_driver_t *drv, int *count_out);

/* Retained native owners of this driver's cuda/ owners (streams, events, allocations,
 * registrations, IPC mappings, primary contexts) right now. The owners add and remove
 * themselves with ote__cuda_retained_note(), which also notes them in the process-wide
 * registry (base/retained.h) as OTE_RETAINED_OTHER. */
uint64_t ote_cuda_driver_retained(const ote_cuda_driver_t *drv);
void ote__cuda_retained_note(ote_cuda_driver_t *drv, int delta);

#ifdef __cplusplus
}
#endif
#endif

// Compiled by header_check_test.sh against the CUDA Toolkit's cuda.h: OrbitTE's own
// declarations of the driver ABI (cuda/driver.h) must be the real ones. Nothing runs;
// a mismatch is a compile error naming the declaration.
#include <cuda.h>

#include <cstddef>
#include <type_traits>

#include "cuda/driver.h"

#if CUDA_VERSION < 12000
#error "cuda.h older than 12.0: cuGetProcAddress_v2 and the contract's ABI need >= 12.0"
#endif

// Handles and scalar types.
static_assert(sizeof(ote_cu_result_t) == sizeof(CUresult), "CUresult");
static_assert(sizeof(ote_cu_device_t) == sizeof(CUdevice), "CUdevice");
static_assert(std::is_same<ote_cu_deviceptr_t, CUdeviceptr>::value, "CUdeviceptr");
static_assert(std::is_same<ote_cu_mem_handle_t, CUmemGenericAllocationHandle>::value,
              "CUmemGenericAllocationHandle");
static_assert(sizeof(ote_cu_context_t) == sizeof(CUcontext), "CUcontext");
static_assert(sizeof(ote_cu_stream_t) == sizeof(CUstream), "CUstream");
static_assert(sizeof(ote_cu_event_t) == sizeof(CUevent), "CUevent");
static_assert(std::is_same<ote_cu_host_fn, CUhostFn>::value, "CUhostFn");

// The 64-byte IPC handle, passed by value.
static_assert(OTE_CU_IPC_HANDLE_SIZE == CU_IPC_HANDLE_SIZE, "CU_IPC_HANDLE_SIZE");
static_assert(sizeof(ote_cu_ipc_mem_handle_t) == sizeof(CUipcMemHandle), "CUipcMemHandle size");
static_assert(alignof(ote_cu_ipc_mem_handle_t) == alignof(CUipcMemHandle), "CUipcMemHandle align");

// VMM structs.
static_assert(sizeof(ote_cu_mem_location_t) == sizeof(CUmemLocation), "CUmemLocation");
static_assert(offsetof(ote_cu_mem_location_t, id) == offsetof(CUmemLocation, id),
              "CUmemLocation.id");
static_assert(sizeof(ote_cu_mem_allocation_prop_t) == sizeof(CUmemAllocationProp),
              "CUmemAllocationProp");
static_assert(offsetof(ote_cu_mem_allocation_prop_t, requested_handle_types) ==
                  offsetof(CUmemAllocationProp, requestedHandleTypes),
              "prop.requestedHandleTypes");
static_assert(offsetof(ote_cu_mem_allocation_prop_t, location) ==
                  offsetof(CUmemAllocationProp, location),
              "prop.location");
static_assert(offsetof(ote_cu_mem_allocation_prop_t, win32_handle_meta_data) ==
                  offsetof(CUmemAllocationProp, win32HandleMetaData),
              "prop.win32HandleMetaData");
static_assert(offsetof(ote_cu_mem_allocation_prop_t, alloc_flags) ==
                  offsetof(CUmemAllocationProp, allocFlags),
              "prop.allocFlags");
static_assert(sizeof(((ote_cu_mem_allocation_prop_t *)0)->alloc_flags) ==
                  sizeof(((CUmemAllocationProp *)0)->allocFlags),
              "prop.allocFlags size");
static_assert(sizeof(ote_cu_mem_access_desc_t) == sizeof(CUmemAccessDesc), "CUmemAccessDesc");
static_assert(offsetof(ote_cu_mem_access_desc_t, flags) == offsetof(CUmemAccessDesc, flags),
              "CUmemAccessDesc.flags");

// Results.
#define SAME(ours, theirs) static_assert((ours) == (theirs), #theirs)
SAME(OTE_CU_SUCCESS, CUDA_SUCCESS);
SAME(OTE_CU_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_VALUE);
SAME(OTE_CU_ERROR_OUT_OF_MEMORY, CUDA_ERROR_OUT_OF_MEMORY);
SAME(OTE_CU_ERROR_NOT_INITIALIZED, CUDA_ERROR_NOT_INITIALIZED);
SAME(OTE_CU_ERROR_DEINITIALIZED, CUDA_ERROR_DEINITIALIZED);
SAME(OTE_CU_ERROR_NO_DEVICE, CUDA_ERROR_NO_DEVICE);
SAME(OTE_CU_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_DEVICE);
SAME(OTE_CU_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_CONTEXT);
SAME(OTE_CU_ERROR_MAP_FAILED, CUDA_ERROR_MAP_FAILED);
SAME(OTE_CU_ERROR_ALREADY_MAPPED, CUDA_ERROR_ALREADY_MAPPED);
SAME(OTE_CU_ERROR_ECC_UNCORRECTABLE, CUDA_ERROR_ECC_UNCORRECTABLE);
SAME(OTE_CU_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_HANDLE);
SAME(OTE_CU_ERROR_NOT_FOUND, CUDA_ERROR_NOT_FOUND);
SAME(OTE_CU_ERROR_NOT_READY, CUDA_ERROR_NOT_READY);
SAME(OTE_CU_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_ILLEGAL_ADDRESS);
SAME(OTE_CU_ERROR_LAUNCH_FAILED, CUDA_ERROR_LAUNCH_FAILED);
SAME(OTE_CU_ERROR_HOST_MEMORY_ALREADY_REGISTERED, CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
SAME(OTE_CU_ERROR_NOT_PERMITTED, CUDA_ERROR_NOT_PERMITTED);
SAME(OTE_CU_ERROR_NOT_SUPPORTED, CUDA_ERROR_NOT_SUPPORTED);
SAME(OTE_CU_ERROR_UNKNOWN, CUDA_ERROR_UNKNOWN);

// Pointer attributes and memory types.
SAME(OTE_CU_POINTER_ATTRIBUTE_CONTEXT, CU_POINTER_ATTRIBUTE_CONTEXT);
SAME(OTE_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_MEMORY_TYPE);
SAME(OTE_CU_POINTER_ATTRIBUTE_DEVICE_POINTER, CU_POINTER_ATTRIBUTE_DEVICE_POINTER);
SAME(OTE_CU_POINTER_ATTRIBUTE_HOST_POINTER, CU_POINTER_ATTRIBUTE_HOST_POINTER);
SAME(OTE_CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS);
SAME(OTE_CU_POINTER_ATTRIBUTE_BUFFER_ID, CU_POINTER_ATTRIBUTE_BUFFER_ID);
SAME(OTE_CU_POINTER_ATTRIBUTE_IS_MANAGED, CU_POINTER_ATTRIBUTE_IS_MANAGED);
SAME(OTE_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL);
SAME(OTE_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR);
SAME(OTE_CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_RANGE_SIZE);
SAME(OTE_CU_POINTER_ATTRIBUTE_MAPPED, CU_POINTER_ATTRIBUTE_MAPPED);
SAME(OTE_CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_HOST);
SAME(OTE_CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_DEVICE);
SAME(OTE_CU_MEMORYTYPE_ARRAY, CU_MEMORYTYPE_ARRAY);
SAME(OTE_CU_MEMORYTYPE_UNIFIED, CU_MEMORYTYPE_UNIFIED);

// Device attributes.
SAME(OTE_CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID);
SAME(OTE_CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING);
SAME(OTE_CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
     CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED);
SAME(OTE_CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED,
     CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED);
SAME(OTE_CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED);

// Flags.
SAME(OTE_CU_STREAM_NON_BLOCKING, CU_STREAM_NON_BLOCKING);
SAME(OTE_CU_EVENT_DISABLE_TIMING, CU_EVENT_DISABLE_TIMING);
SAME(OTE_CU_MEMHOSTALLOC_PORTABLE, CU_MEMHOSTALLOC_PORTABLE);
SAME(OTE_CU_MEMHOSTREGISTER_PORTABLE, CU_MEMHOSTREGISTER_PORTABLE);
SAME(OTE_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
SAME(OTE_CU_GET_PROC_ADDRESS_DEFAULT, CU_GET_PROC_ADDRESS_DEFAULT);
SAME(OTE_CU_GET_PROC_ADDRESS_SUCCESS, CU_GET_PROC_ADDRESS_SUCCESS);
SAME(OTE_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
SAME(OTE_CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_ALLOCATION_TYPE_PINNED);
SAME(OTE_CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_LOCATION_TYPE_DEVICE);
SAME(OTE_CU_MEM_ACCESS_FLAGS_PROT_READWRITE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
SAME(OTE_CU_MEM_ALLOC_GRANULARITY_MINIMUM, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
SAME(OTE_CU_MEM_ALLOC_GRANULARITY_RECOMMENDED, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
SAME(OTE_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD);

// Entry point signatures: each table slot must have the type of the versioned function
// (cuda.h's macros map cuMemAlloc to cuMemAlloc_v2 etc.; the table uses int for enums and
// our structs for theirs, so the check is on arity and the size of every parameter).
template <typename A, typename B>
struct SameAbi : std::false_type {};
template <typename RA, typename RB>
struct SameAbi<RA (*)(), RB (*)()> : std::integral_constant<bool, sizeof(RA) == sizeof(RB)> {};
template <typename RA, typename A0, typename... As, typename RB, typename B0, typename... Bs>
struct SameAbi<RA (*)(A0, As...), RB (*)(B0, Bs...)>
    : std::integral_constant<bool, sizeof(A0) == sizeof(B0) &&
                                       std::is_pointer<A0>::value == std::is_pointer<B0>::value &&
                                       SameAbi<RA (*)(As...), RB (*)(Bs...)>::value> {};
#define SIG(field, fn) \
    static_assert(SameAbi<decltype(ote_cuda_driver_table_t::field), decltype(&fn)>::value, \
                  #fn " signature")
SIG(cuInit, cuInit);
SIG(cuDriverGetVersion, cuDriverGetVersion);
SIG(cuGetErrorName, cuGetErrorName);
SIG(cuGetErrorString, cuGetErrorString);
SIG(cuDeviceGetCount, cuDeviceGetCount);
SIG(cuDeviceGet, cuDeviceGet);
SIG(cuDeviceGetName, cuDeviceGetName);
SIG(cuDeviceGetAttribute, cuDeviceGetAttribute);
SIG(cuDeviceGetPCIBusId, cuDeviceGetPCIBusId);
SIG(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain);
SIG(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2);
SIG(cuCtxSetCurrent, cuCtxSetCurrent);
SIG(cuCtxGetCurrent, cuCtxGetCurrent);
SIG(cuCtxGetDevice, cuCtxGetDevice);
SIG(cuMemAlloc, cuMemAlloc_v2);
SIG(cuMemFree, cuMemFree_v2);
SIG(cuMemGetAddressRange, cuMemGetAddressRange_v2);
SIG(cuMemHostAlloc, cuMemHostAlloc);
SIG(cuMemFreeHost, cuMemFreeHost);
SIG(cuMemHostRegister, cuMemHostRegister_v2);
SIG(cuMemHostUnregister, cuMemHostUnregister);
SIG(cuMemcpyHtoD, cuMemcpyHtoD_v2);
SIG(cuMemcpyDtoH, cuMemcpyDtoH_v2);
SIG(cuMemcpyDtoD, cuMemcpyDtoD_v2);
SIG(cuMemcpyHtoDAsync, cuMemcpyHtoDAsync_v2);
SIG(cuMemcpyDtoHAsync, cuMemcpyDtoHAsync_v2);
SIG(cuMemcpyDtoDAsync, cuMemcpyDtoDAsync_v2);
SIG(cuMemsetD8, cuMemsetD8_v2);
SIG(cuPointerGetAttribute, cuPointerGetAttribute);
SIG(cuPointerGetAttributes, cuPointerGetAttributes);
SIG(cuPointerSetAttribute, cuPointerSetAttribute);
SIG(cuStreamCreate, cuStreamCreate);
SIG(cuStreamDestroy, cuStreamDestroy_v2);
SIG(cuStreamQuery, cuStreamQuery);
SIG(cuStreamSynchronize, cuStreamSynchronize);
SIG(cuLaunchHostFunc, cuLaunchHostFunc);
SIG(cuEventCreate, cuEventCreate);
SIG(cuEventRecord, cuEventRecord);
SIG(cuEventQuery, cuEventQuery);
SIG(cuEventSynchronize, cuEventSynchronize);
SIG(cuEventDestroy, cuEventDestroy_v2);
SIG(cuIpcGetMemHandle, cuIpcGetMemHandle);
SIG(cuIpcOpenMemHandle, cuIpcOpenMemHandle_v2);
SIG(cuIpcCloseMemHandle, cuIpcCloseMemHandle);
SIG(cuMemGetHandleForAddressRange, cuMemGetHandleForAddressRange);
SIG(cuMemGetAllocationGranularity, cuMemGetAllocationGranularity);
SIG(cuMemCreate, cuMemCreate);
SIG(cuMemRelease, cuMemRelease);
SIG(cuMemAddressReserve, cuMemAddressReserve);
SIG(cuMemAddressFree, cuMemAddressFree);
SIG(cuMemMap, cuMemMap);
SIG(cuMemUnmap, cuMemUnmap);
SIG(cuMemSetAccess, cuMemSetAccess);
SIG(cuMemExportToShareableHandle, cuMemExportToShareableHandle);
SIG(cuMemImportFromShareableHandle, cuMemImportFromShareableHandle);

int main() { return 0; }

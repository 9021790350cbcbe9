/*
 * tests/cuda/fake/fake_internal.h - shared state of the fake libcuda.
 *
 * The fake is a test-only shared library that exports the real CUDA driver symbols
 * (compiled against the installed cuda.h, so the signatures are the real ones) and
 * behaves the way a GPU does where it matters to the owners in cuda/:
 *   - device memory is a memfd; its device address is a PROT_NONE reservation, and the
 *     fake reaches the bytes through a second ("shadow") mapping of the same memfd;
 *   - streams are worker threads that run queued operations in order after a random delay;
 *   - IPC handles reach the exporter's memfd from another process (pidfd_getfd, or
 *     /proc/PID/fd/N).
 *
 * Files: core.c (init, devices, contexts, faults, counters, cuGetProcAddress, error
 * names), memory.c (the region registry, device and host memory, pointer attributes,
 * dmabuf), stream.c (streams and each context's legacy stream, events, every copy and
 * memset with CUDA's host-synchronisation rules, host functions, the copy gate),
 * ipc.c (legacy IPC), vmm.c (virtual memory management).
 *
 * Lock order: fk_g.st_mu (the stream list) before a stream's mu before fk_g.mu (the
 * registry, contexts) before fk_g.ev_mu (events). A stream worker never takes st_mu and
 * never holds its stream's mu while it runs an operation, so a thread holding st_mu may
 * wait for a worker. (A host function that calls the driver, which CUDA forbids, could
 * deadlock the unload: the destructor holds st_mu while it joins the workers.) fk_g.gate_mu
 * (the copy gate) is a leaf; a worker held at the gate holds no other lock, and the
 * destructor opens the gate before it joins the workers.
 */
#ifndef OTE_TESTS_CUDA_FAKE_INTERNAL_H
#define OTE_TESTS_CUDA_FAKE_INTERNAL_H

#include <cuda.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "tests/cuda/fake_cuda_control.h"

#define FK_HIDDEN __attribute__((visibility("hidden")))
#define FK_EXPORT __attribute__((visibility("default")))

/* The entry points: base name (the one cuGetProcAddress and the fault API take) and the
 * exported function. */
#define FK_ENTRY_POINTS(X) \
    X(cuInit, cuInit) \
    X(cuDriverGetVersion, cuDriverGetVersion) \
    X(cuGetProcAddress, cuGetProcAddress_v2) \
    X(cuGetErrorName, cuGetErrorName) \
    X(cuGetErrorString, cuGetErrorString) \
    X(cuDeviceGetCount, cuDeviceGetCount) \
    X(cuDeviceGet, cuDeviceGet) \
    X(cuDeviceGetName, cuDeviceGetName) \
    X(cuDeviceGetAttribute, cuDeviceGetAttribute) \
    X(cuDeviceGetPCIBusId, cuDeviceGetPCIBusId) \
    X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain) \
    X(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2) \
    X(cuCtxSetCurrent, cuCtxSetCurrent) \
    X(cuCtxGetCurrent, cuCtxGetCurrent) \
    X(cuCtxGetDevice, cuCtxGetDevice) \
    X(cuCtxSynchronize, cuCtxSynchronize) \
    X(cuMemAlloc, cuMemAlloc_v2) \
    X(cuMemFree, cuMemFree_v2) \
    X(cuMemGetAddressRange, cuMemGetAddressRange_v2) \
    X(cuMemHostAlloc, cuMemHostAlloc) \
    X(cuMemFreeHost, cuMemFreeHost) \
    X(cuMemHostRegister, cuMemHostRegister_v2) \
    X(cuMemHostUnregister, cuMemHostUnregister) \
    X(cuMemcpyHtoD, cuMemcpyHtoD_v2) \
    X(cuMemcpyDtoH, cuMemcpyDtoH_v2) \
    X(cuMemcpyDtoD, cuMemcpyDtoD_v2) \
    X(cuMemcpyHtoDAsync, cuMemcpyHtoDAsync_v2) \
    X(cuMemcpyDtoHAsync, cuMemcpyDtoHAsync_v2) \
    X(cuMemcpyDtoDAsync, cuMemcpyDtoDAsync_v2) \
    X(cuMemsetD8, cuMemsetD8_v2) \
    X(cuPointerGetAttribute, cuPointerGetAttribute) \
    X(cuPointerGetAttributes, cuPointerGetAttributes) \
    X(cuPointerSetAttribute, cuPointerSetAttribute) \
    X(cuStreamCreate, cuStreamCreate) \
    X(cuStreamDestroy, cuStreamDestroy_v2) \
    X(cuStreamQuery, cuStreamQuery) \
    X(cuStreamSynchronize, cuStreamSynchronize) \
    X(cuLaunchHostFunc, cuLaunchHostFunc) \
    X(cuEventCreate, cuEventCreate) \
    X(cuEventRecord, cuEventRecord) \
    X(cuEventQuery, cuEventQuery) \
    X(cuEventSynchronize, cuEventSynchronize) \
    X(cuEventDestroy, cuEventDestroy_v2) \
    X(cuIpcGetMemHandle, cuIpcGetMemHandle) \
    X(cuIpcOpenMemHandle, cuIpcOpenMemHandle_v2) \
    X(cuIpcCloseMemHandle, cuIpcCloseMemHandle) \
    X(cuMemGetHandleForAddressRange, cuMemGetHandleForAddressRange) \
    X(cuMemGetAllocationGranularity, cuMemGetAllocationGranularity) \
    X(cuMemCreate, cuMemCreate) \
    X(cuMemRelease, cuMemRelease) \
    X(cuMemAddressReserve, cuMemAddressReserve) \
    X(cuMemAddressFree, cuMemAddressFree) \
    X(cuMemMap, cuMemMap) \
    X(cuMemUnmap, cuMemUnmap) \
    X(cuMemSetAccess, cuMemSetAccess) \
    X(cuMemExportToShareableHandle, cuMemExportToShareableHandle) \
    X(cuMemImportFromShareableHandle, cuMemImportFromShareableHandle) \
    X(cuMemRetainAllocationHandle, cuMemRetainAllocationHandle)

enum {
#define FK_ENUM(base, fn) FK_EP_##base,
    FK_ENTRY_POINTS(FK_ENUM)
#undef FK_ENUM
        FK_EP_COUNT
};

/* VMM granularity and the alignment of large cuMemAlloc allocations. */
#define FK_GRANULARITY ((size_t)2 << 20)
#define FK_PAGE ((size_t)4096)

/* A primary context: one per device, never freed; "active" while retained. */
struct CUctx_st {
    uint32_t magic;
    int dev;
};

/* Kinds of address ranges the registry knows. */
typedef enum fk_kind {
    FK_DEVICE_ALLOC = 1, /* cuMemAlloc: memfd, PROT_NONE device VA, shadow mapping */
    FK_HOST_ALLOC,       /* cuMemHostAlloc: host memory, device pointer = host address */
    FK_HOST_REG,         /* cuMemHostRegister: the caller's host memory */
    FK_IPC_IMPORT,       /* cuIpcOpenMemHandle: another process's allocation */
    FK_VMM_RESERVE,      /* cuMemAddressReserve: PROT_NONE VA and shadow, mapped piecewise */
} fk_kind_t;

struct fk_vmm_handle;

/* A mapping of a VMM handle inside a reservation. */
typedef struct fk_vmm_map {
    struct fk_vmm_map *next;
    uint64_t start; /* device address */
    size_t size;
    size_t offset; /* into the handle */
    struct fk_vmm_handle *handle;
    int access; /* CUmemAccess_flags granted by cuMemSetAccess (0 = none yet) */
    uint64_t buffer_id;
} fk_vmm_map_t;

typedef struct fk_region {
    uint64_t start; /* address as the driver's callers see it */
    size_t size;    /* the size asked for */
    size_t map_len; /* bytes reserved / mapped (page or granularity multiple) */
    fk_kind_t kind;
    char *shadow;  /* host-accessible view of start (== start for host kinds) */
    void *va_base; /* the PROT_NONE reservation actually mmap()ed (alignment slack) */
    size_t va_len;
    int dev;
    struct CUctx_st *ctx;
    uint64_t buffer_id;
    int memfd; /* FK_DEVICE_ALLOC: the backing memfd (kept for IPC and dmabuf) */
    unsigned sync_memops;
    int ipc_exported;
    unsigned busy; /* stream operations in flight that read or write it */
    /* FK_IPC_IMPORT */
    int32_t imp_pid;
    uint64_t imp_buffer_id;
    unsigned imp_refs;
    /* FK_VMM_RESERVE */
    fk_vmm_map_t *maps;
} fk_region_t;

typedef struct fk_device {
    struct CUctx_st ctx;
    struct CUstream_st *legacy; /* the legacy (NULL) stream, created on first use (st_mu) */
    uint32_t refs;              /* primary context retain count */
    uint64_t used;              /* live device bytes (cuMemAlloc + cuMemCreate) */
    unsigned pci_domain, pci_bus, pci_dev, pci_fn; /* its PCI address (FAKE_CUDA_PCI_BUS_IDS) */
} fk_device_t;

typedef struct fk_fault {
    int armed;
    int nth;
    int count;
    int result;
    uint64_t seen;
} fk_fault_t;

typedef struct fk_global {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* region busy counts dropped */
    int initialized;
    int ndev;
    uint64_t capacity;
    atomic_uint max_delay_us;
    fk_device_t devs[FAKE_CUDA_MAX_DEVICES];
    /* The registry: regions sorted by start, non-overlapping. */
    fk_region_t **regions;
    size_t nregions, cap_regions;
    uint64_t next_buffer_id;
    /* Faults and call counts. */
    pthread_mutex_t fault_mu;
    atomic_int faults_armed;
    fk_fault_t faults[FK_EP_COUNT];
    atomic_uint_least64_t calls[FK_EP_COUNT];
    /* Streams (live and destroyed-but-not-reaped), under st_mu; events under ev_mu. */
    pthread_mutex_t st_mu;
    struct CUstream_st *streams;
    pthread_mutex_t ev_mu;
    pthread_cond_t ev_cv;
    struct CUevent_st *events;
    /* The copy gate (fake_cuda_hold_copies), under gate_mu: while closed, gate_pass more
     * copies run, then each copy waits on gate_cv until it opens. gate_mu is a leaf lock:
     * a worker takes it holding nothing else. */
    pthread_mutex_t gate_mu;
    pthread_cond_t gate_cv;
    int gate_closed;
    unsigned gate_pass;
    uint64_t gate_held, gate_held_total;
    /* Counters (atomics, so that any file may bump them without a lock). */
    atomic_uint_least64_t c_device_allocs, c_device_bytes, c_host_allocs, c_host_bytes, c_host_regs,
        c_streams, c_events, c_pending_ops, c_ipc_exports, c_ipc_exported_allocs, c_ipc_imports,
        c_ipc_import_refs, c_dmabuf_fds, c_vmm_handles, c_vmm_reservations, c_vmm_mappings,
        c_vmm_exported_fds, c_faults_fired;
} fk_global_t;

FK_HIDDEN extern fk_global_t fk_g;
FK_HIDDEN extern _Thread_local struct CUctx_st *fk_current;

/* core.c */
FK_HIDDEN int fk__fault(int ep);                            /* calls++; the armed result or 0 */
FK_HIDDEN CUresult fk__need_init(void);                     /* NOT_INITIALIZED before cuInit */
FK_HIDDEN CUresult fk__need_ctx(struct CUctx_st **ctx_out); /* init + a live current ctx */
FK_HIDDEN uint64_t fk__now_ns(void);

/* Every entry point starts with this: the fault table first, then (where the call
 * needs it) initialisation. */
#define FK_ENTER(base) \
    do { \
        int fk_r_ = fk__fault(FK_EP_##base); \
        if (fk_r_ != 0) return (CUresult)fk_r_; \
    } while (0)

/* memory.c: the registry (callers hold fk_g.mu). */
FK_HIDDEN int fk__region_insert(fk_region_t *r);
FK_HIDDEN void fk__region_remove(fk_region_t *r);
FK_HIDDEN fk_region_t *fk__region_find(uint64_t addr);
FK_HIDDEN fk_region_t *fk__region_find_base(uint64_t addr, fk_kind_t kind);
/* Resolves [addr, addr+n) as device-accessible memory (device allocations, IPC imports,
 * mapped VMM ranges with access, pinned host memory through UVA) to host-accessible
 * bytes; takes a busy reference on the region when pin_out is not NULL. */
FK_HIDDEN CUresult fk__resolve_device(uint64_t addr, size_t n, int write, char **host_out,
                                      fk_region_t **pin_out);
/* Classifies a host pointer: 1 pinned (busy ref taken when pin_out), 0 pageable,
 * CUDA_ERROR_INVALID_VALUE (negated) when it lies in device memory. */
FK_HIDDEN int fk__classify_host(const void *p, size_t n, fk_region_t **pin_out);
FK_HIDDEN void fk__unpin(fk_region_t *r);
FK_HIDDEN void fk__region_free(fk_region_t *r); /* unmaps and frees (no lock needed) */
/* Reserves a PROT_NONE range of len bytes aligned to align. */
FK_HIDDEN void *fk__reserve(size_t len, size_t align, void **base_out, size_t *base_len_out);
FK_HIDDEN uint64_t fk__new_buffer_id(void); /* under fk_g.mu */

/* stream.c. A copy (dst_host or src_host non-NULL marks the host side, the other side is
 * a device address) on hStream (NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD: the
 * context's legacy stream); sync_api = 1 for cuMemcpy* (host-synchronous where CUDA says
 * so), 0 for cuMemcpy*Async. */
FK_HIDDEN CUresult fk__copy(uint64_t dst_dev, void *dst_host, uint64_t src_dev,
                            const void *src_host, size_t n, CUstream hStream, int sync_api);
FK_HIDDEN CUresult fk__memset(uint64_t dst_dev, unsigned char value, size_t n);
FK_HIDDEN void fk__streams_shutdown(void);

/* vmm.c */
FK_HIDDEN void fk__vmm_shutdown(void);
/* The handle types a VMM mapping's allocation was created exportable as (fk_g.mu held). */
FK_HIDDEN unsigned long long fk__vmm_handle_types(const fk_vmm_map_t *m);
FK_HIDDEN CUresult fk__vmm_resolve(fk_region_t *r, uint64_t addr, size_t n, int write);
FK_HIDDEN int fk__vmm_dmabuf(fk_region_t *r, uint64_t addr, size_t size, int *fd_out);

#endif

/* The fake libcuda's core: initialisation and the environment knobs, devices and primary
 * contexts (a per-thread current context), the fault table and call counts, counters,
 * cuGetProcAddress by base name, and error names. See fake_internal.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/cuda/fake/fake_internal.h"

#define FK_CTX_MAGIC 0xc7c7c7c7u

FK_HIDDEN fk_global_t fk_g = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .cv = PTHREAD_COND_INITIALIZER,
    .fault_mu = PTHREAD_MUTEX_INITIALIZER,
    .st_mu = PTHREAD_MUTEX_INITIALIZER,
    .ev_mu = PTHREAD_MUTEX_INITIALIZER,
    .ev_cv = PTHREAD_COND_INITIALIZER,
    .gate_mu = PTHREAD_MUTEX_INITIALIZER,
    .gate_cv = PTHREAD_COND_INITIALIZER,
    .ndev = 1,
    .capacity = (uint64_t)1 << 30,
    .max_delay_us = 200,
};
FK_HIDDEN _Thread_local struct CUctx_st *fk_current;

FK_HIDDEN uint64_t fk__now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- faults and call counts ---- */

static const char *const fk_names[FK_EP_COUNT] = {
#define FK_NAME(base, fn) [FK_EP_##base] = #base,
    FK_ENTRY_POINTS(FK_NAME)
#undef FK_NAME
};

static int fk_index(const char *base_name) {
    if (base_name == NULL) return -1;
    for (int i = 0; i < FK_EP_COUNT; i++)
        if (strcmp(fk_names[i], base_name) == 0) return i;
    return -1;
}

FK_HIDDEN int fk__fault(int ep) {
    atomic_fetch_add(&fk_g.calls[ep], 1);
    if (atomic_load(&fk_g.faults_armed) == 0) return 0;
    int result = 0;
    pthread_mutex_lock(&fk_g.fault_mu);
    fk_fault_t *f = &fk_g.faults[ep];
    if (f->armed) {
        uint64_t seen = ++f->seen;
        uint64_t nth = (uint64_t)f->nth;
        if (seen >= nth && (f->count < 0 || seen < nth + (uint64_t)f->count)) result = f->result;
        if (f->count >= 0 && seen + 1 >= nth + (uint64_t)f->count) {
            /* Spent: disarm so that it stops costing the lock. */
            f->armed = 0;
            atomic_fetch_sub(&fk_g.faults_armed, 1);
        }
    }
    pthread_mutex_unlock(&fk_g.fault_mu);
    if (result != 0) atomic_fetch_add(&fk_g.c_faults_fired, 1);
    return result;
}

FK_EXPORT void fake_cuda_fail(const char *base_name, int nth, int count, int result) {
    int i = fk_index(base_name);
    if (i < 0 || count == 0 || count < -1) return;
    pthread_mutex_lock(&fk_g.fault_mu);
    fk_fault_t *f = &fk_g.faults[i];
    if (!f->armed) atomic_fetch_add(&fk_g.faults_armed, 1);
    f->armed = 1;
    f->nth = nth < 1 ? 1 : nth;
    f->count = count;
    f->result = result;
    f->seen = 0;
    pthread_mutex_unlock(&fk_g.fault_mu);
}

FK_EXPORT void fake_cuda_clear_faults(void) {
    pthread_mutex_lock(&fk_g.fault_mu);
    for (int i = 0; i < FK_EP_COUNT; i++) fk_g.faults[i].armed = 0;
    atomic_store(&fk_g.faults_armed, 0);
    pthread_mutex_unlock(&fk_g.fault_mu);
}

FK_EXPORT uint64_t fake_cuda_calls(const char *base_name) {
    int i = fk_index(base_name);
    return i < 0 ? 0 : atomic_load(&fk_g.calls[i]);
}

FK_EXPORT int fake_cuda_is_fake(void) { return 1; }

FK_EXPORT void fake_cuda_set_max_delay_us(unsigned us) { atomic_store(&fk_g.max_delay_us, us); }

FK_EXPORT void fake_cuda_counters(fake_cuda_counters_t *out) {
    if (out == NULL) return;
    fake_cuda_counters_t c;
    memset(&c, 0, sizeof(c));
    c.device_allocs = atomic_load(&fk_g.c_device_allocs);
    c.device_bytes = atomic_load(&fk_g.c_device_bytes);
    c.host_allocs = atomic_load(&fk_g.c_host_allocs);
    c.host_bytes = atomic_load(&fk_g.c_host_bytes);
    c.host_registrations = atomic_load(&fk_g.c_host_regs);
    c.streams = atomic_load(&fk_g.c_streams);
    c.events = atomic_load(&fk_g.c_events);
    c.pending_ops = atomic_load(&fk_g.c_pending_ops);
    c.ipc_exports = atomic_load(&fk_g.c_ipc_exports);
    c.ipc_exported_allocs = atomic_load(&fk_g.c_ipc_exported_allocs);
    c.ipc_imports = atomic_load(&fk_g.c_ipc_imports);
    c.ipc_import_refs = atomic_load(&fk_g.c_ipc_import_refs);
    c.dmabuf_fds = atomic_load(&fk_g.c_dmabuf_fds);
    c.vmm_handles = atomic_load(&fk_g.c_vmm_handles);
    c.vmm_reservations = atomic_load(&fk_g.c_vmm_reservations);
    c.vmm_mappings = atomic_load(&fk_g.c_vmm_mappings);
    c.vmm_exported_fds = atomic_load(&fk_g.c_vmm_exported_fds);
    c.faults_fired = atomic_load(&fk_g.c_faults_fired);
    pthread_mutex_lock(&fk_g.gate_mu);
    c.copies_held = fk_g.gate_held;
    c.copies_held_total = fk_g.gate_held_total;
    pthread_mutex_unlock(&fk_g.gate_mu);
    pthread_mutex_lock(&fk_g.mu);
    for (int d = 0; d < FAKE_CUDA_MAX_DEVICES; d++) {
        c.primary_ctx_refs[d] = fk_g.devs[d].refs;
        c.primary_ctx_retains += fk_g.devs[d].refs;
        c.device_bytes_per_device[d] = fk_g.devs[d].used;
    }
    pthread_mutex_unlock(&fk_g.mu);
    *out = c;
}

/* ---- initialisation ---- */

static uint64_t fk_env_u64(const char *name, uint64_t dflt) {
    const char *s = getenv(name);
    if (s == NULL || *s == '\0') return dflt;
    errno = 0;
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno != 0 || end == s || *end != '\0') return dflt;
    return (uint64_t)v;
}

/* The devices' PCI addresses: FAKE_CUDA_PCI_BUS_IDS ("dddd:bb:dd.f,..."), device d at
 * 0000:<0x18+d>:00.0 past the list. 0 when the list is malformed. fk_g.mu held. */
static int fk_pci_ids(void) {
    for (int d = 0; d < FAKE_CUDA_MAX_DEVICES; d++) {
        fk_g.devs[d].pci_domain = 0;
        fk_g.devs[d].pci_bus = 0x18u + (unsigned)d;
        fk_g.devs[d].pci_dev = 0;
        fk_g.devs[d].pci_fn = 0;
    }
    const char *s = getenv("FAKE_CUDA_PCI_BUS_IDS");
    for (int d = 0; s != NULL && *s != '\0' && d < FAKE_CUDA_MAX_DEVICES; d++) {
        unsigned dom, bus, dev, fn;
        int used = 0;
        if (sscanf(s, "%4x:%2x:%2x.%1x%n", &dom, &bus, &dev, &fn, &used) != 4 || used != 12 ||
            dev > 0x1f || fn > 7 || (s[used] != ',' && s[used] != '\0'))
            return 0;
        fk_g.devs[d].pci_domain = dom;
        fk_g.devs[d].pci_bus = bus;
        fk_g.devs[d].pci_dev = dev;
        fk_g.devs[d].pci_fn = fn;
        s += used + (s[used] == ',');
    }
    return 1;
}

/* Set in the child of a fork() taken after cuInit: the parent's driver state (stream
 * workers, locks other threads held) did not come along, and as with a real driver the
 * child cannot use it: every call that needs initialisation fails at once, cuInit too,
 * and the unload reclaims nothing (no worker to join). A child that execs starts afresh. */
static atomic_int fk_forked;

static void fk_atfork_child(void) {
    if (fk_g.initialized) atomic_store(&fk_forked, 1);
}

__attribute__((constructor)) static void fk_load(void) {
    pthread_atfork(NULL, NULL, fk_atfork_child);
}

FK_HIDDEN CUresult fk__need_init(void) {
    if (atomic_load(&fk_forked)) return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&fk_g.mu);
    int ok = fk_g.initialized;
    pthread_mutex_unlock(&fk_g.mu);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

FK_HIDDEN CUresult fk__need_ctx(struct CUctx_st **ctx_out) {
    CUresult r = fk__need_init();
    if (r != CUDA_SUCCESS) return r;
    struct CUctx_st *c = fk_current;
    if (c == NULL) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&fk_g.mu);
    int live = fk_g.devs[c->dev].refs > 0;
    pthread_mutex_unlock(&fk_g.mu);
    if (!live) return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_out != NULL) *ctx_out = c;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuInit(unsigned int Flags) {
    FK_ENTER(cuInit);
    if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (getenv("FAKE_CUDA_INIT_FAIL") != NULL) return CUDA_ERROR_NO_DEVICE;
    if (atomic_load(&fk_forked)) return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&fk_g.mu);
    if (!fk_g.initialized && !fk_pci_ids()) {
        pthread_mutex_unlock(&fk_g.mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!fk_g.initialized) {
        uint64_t n = fk_env_u64("FAKE_CUDA_DEVICES", 1);
        if (n > FAKE_CUDA_MAX_DEVICES) n = FAKE_CUDA_MAX_DEVICES;
        fk_g.ndev = (int)n;
        fk_g.capacity = fk_env_u64("FAKE_CUDA_MEM_BYTES", (uint64_t)1 << 30);
        atomic_store(&fk_g.max_delay_us, (unsigned)fk_env_u64("FAKE_CUDA_MAX_DELAY_US", 200));
        for (int d = 0; d < FAKE_CUDA_MAX_DEVICES; d++) {
            fk_g.devs[d].ctx.magic = FK_CTX_MAGIC;
            fk_g.devs[d].ctx.dev = d;
        }
        fk_g.initialized = 1;
    }
    int ndev = fk_g.ndev;
    pthread_mutex_unlock(&fk_g.mu);
    return ndev == 0 ? CUDA_ERROR_NO_DEVICE : CUDA_SUCCESS;
}

CUresult CUDAAPI cuDriverGetVersion(int *driverVersion) {
    FK_ENTER(cuDriverGetVersion);
    if (driverVersion == NULL) return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = 13000;
    return CUDA_SUCCESS;
}

/* ---- devices ---- */

static CUresult fk_check_dev(CUdevice dev) {
    CUresult r = fk__need_init();
    if (r != CUDA_SUCCESS) return r;
    return (dev >= 0 && dev < fk_g.ndev) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

CUresult CUDAAPI cuDeviceGetCount(int *count) {
    FK_ENTER(cuDeviceGetCount);
    CUresult r = fk__need_init();
    if (r != CUDA_SUCCESS) return r;
    if (count == NULL) return CUDA_ERROR_INVALID_VALUE;
    *count = fk_g.ndev;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal) {
    FK_ENTER(cuDeviceGet);
    CUresult r = fk_check_dev(ordinal);
    if (r != CUDA_SUCCESS) return r;
    if (device == NULL) return CUDA_ERROR_INVALID_VALUE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev) {
    FK_ENTER(cuDeviceGetName);
    CUresult r = fk_check_dev(dev);
    if (r != CUDA_SUCCESS) return r;
    if (name == NULL || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "Fake GPU %d", dev);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev) {
    FK_ENTER(cuDeviceGetPCIBusId);
    CUresult r = fk_check_dev(dev);
    if (r != CUDA_SUCCESS) return r;
    if (pciBusId == NULL || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_g.mu);
    const fk_device_t *fd = &fk_g.devs[dev];
    snprintf(pciBusId, (size_t)len, "%04x:%02x:%02x.%x", fd->pci_domain, fd->pci_bus, fd->pci_dev,
             fd->pci_fn);
    pthread_mutex_unlock(&fk_g.mu);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
    FK_ENTER(cuDeviceGetAttribute);
    CUresult r = fk_check_dev(dev);
    if (r != CUDA_SUCCESS) return r;
    if (pi == NULL || (int)attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    int v = 0;
    switch (attrib) {
        case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: v = (int)fk_g.devs[dev].pci_bus; break;
        case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: v = (int)fk_g.devs[dev].pci_dev; break;
        case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: v = (int)fk_g.devs[dev].pci_domain; break;
        case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: v = 9; break;
        case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: v = 0; break;
        case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: v = 4; break;
        case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
        case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
        case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
        case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
        case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED:
        case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED:
        case CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED:
        case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT:
        case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
        case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED: v = 1; break;
        default: v = 0; break;
    }
    *pi = v;
    return CUDA_SUCCESS;
}

/* ---- primary contexts ---- */

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    FK_ENTER(cuDevicePrimaryCtxRetain);
    CUresult r = fk_check_dev(dev);
    if (r != CUDA_SUCCESS) return r;
    if (pctx == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_g.mu);
    fk_g.devs[dev].refs++;
    pthread_mutex_unlock(&fk_g.mu);
    *pctx = &fk_g.devs[dev].ctx;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    FK_ENTER(cuDevicePrimaryCtxRelease);
    CUresult r = fk_check_dev(dev);
    if (r != CUDA_SUCCESS) return r;
    pthread_mutex_lock(&fk_g.mu);
    if (fk_g.devs[dev].refs == 0) {
        r = CUDA_ERROR_INVALID_CONTEXT;
    } else {
        fk_g.devs[dev].refs--;
    }
    pthread_mutex_unlock(&fk_g.mu);
    return r;
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
    FK_ENTER(cuCtxSetCurrent);
    CUresult r = fk__need_init();
    if (r != CUDA_SUCCESS) return r;
    if (ctx != NULL) {
        int known = 0;
        for (int d = 0; d < fk_g.ndev; d++)
            if (ctx == &fk_g.devs[d].ctx) known = 1;
        if (!known) return CUDA_ERROR_INVALID_CONTEXT;
    }
    fk_current = ctx;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx) {
    FK_ENTER(cuCtxGetCurrent);
    CUresult r = fk__need_init();
    if (r != CUDA_SUCCESS) return r;
    if (pctx == NULL) return CUDA_ERROR_INVALID_VALUE;
    *pctx = fk_current;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetDevice(CUdevice *device) {
    FK_ENTER(cuCtxGetDevice);
    struct CUctx_st *c = NULL;
    CUresult r = fk__need_ctx(&c);
    if (r != CUDA_SUCCESS) return r;
    if (device == NULL) return CUDA_ERROR_INVALID_VALUE;
    *device = c->dev;
    return CUDA_SUCCESS;
}

/* ---- error names ---- */

static const struct {
    int code;
    const char *name;
    const char *text;
} fk_errors[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {205, "CUDA_ERROR_MAP_FAILED", "mapping of buffer object failed"},
    {206, "CUDA_ERROR_UNMAP_FAILED", "unmapping of buffer object failed"},
    {208, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"},
    {211, "CUDA_ERROR_NOT_MAPPED", "resource not mapped"},
    {214, "CUDA_ERROR_ECC_UNCORRECTABLE", "uncorrectable ECC error encountered"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {600, "CUDA_ERROR_NOT_READY", "device not ready"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {702, "CUDA_ERROR_LAUNCH_TIMEOUT", "the launch timed out and was terminated"},
    {712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part or all of the requested memory range is already mapped"},
    {713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
     "pointer does not correspond to a registered memory region"},
    {719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {800, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static int fk_error_index(CUresult error) {
    for (size_t i = 0; i < sizeof(fk_errors) / sizeof(fk_errors[0]); i++)
        if (fk_errors[i].code == (int)error) return (int)i;
    return -1;
}

CUresult CUDAAPI cuGetErrorName(CUresult error, const char **pStr) {
    FK_ENTER(cuGetErrorName);
    if (pStr == NULL) return CUDA_ERROR_INVALID_VALUE;
    int i = fk_error_index(error);
    if (i < 0) {
        *pStr = NULL;
        return CUDA_ERROR_INVALID_VALUE;
    }
    *pStr = fk_errors[i].name;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pStr) {
    FK_ENTER(cuGetErrorString);
    if (pStr == NULL) return CUDA_ERROR_INVALID_VALUE;
    int i = fk_error_index(error);
    if (i < 0) {
        *pStr = NULL;
        return CUDA_ERROR_INVALID_VALUE;
    }
    *pStr = fk_errors[i].text;
    return CUDA_SUCCESS;
}

/* ---- cuGetProcAddress ---- */

static void *fk_fn(int i) {
    switch (i) {
#define FK_CASE(base, fn) \
    case FK_EP_##base: return (void *)fn;
        FK_ENTRY_POINTS(FK_CASE)
#undef FK_CASE
        default: return NULL;
    }
}

CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                     cuuint64_t flags,
                                     CUdriverProcAddressQueryResult *symbolStatus) {
    FK_ENTER(cuGetProcAddress);
    (void)flags;
    if (symbol == NULL || pfn == NULL) return CUDA_ERROR_INVALID_VALUE;
    int i = fk_index(symbol);
    if (i < 0 || cudaVersion < 1000) {
        /* As an H200's driver 580 does (scripts/cuda_facts.c): an unknown symbol is not an
         * error of the call, only of the symbol status. */
        *pfn = NULL;
        if (symbolStatus != NULL) *symbolStatus = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_SUCCESS;
    }
    *pfn = fk_fn(i);
    if (symbolStatus != NULL) *symbolStatus = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

/* The legacy unversioned cuGetProcAddress (no symbol status), as libcuda exports it. */
#undef cuGetProcAddress
FK_EXPORT CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                            cuuint64_t flags);
FK_EXPORT CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                            cuuint64_t flags) {
    return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}

/* ---- teardown ---- */

/* Reclaims what the process left behind when the library is unloaded (dlclose or exit):
 * stream workers are drained and joined, then every region is unmapped. Silent. */
__attribute__((destructor)) static void fk_shutdown(void) {
    if (atomic_load(&fk_forked)) return;
    fk__streams_shutdown();
    fk__vmm_shutdown();
    pthread_mutex_lock(&fk_g.mu);
    fk_region_t **regs = fk_g.regions;
    size_t n = fk_g.nregions;
    fk_g.regions = NULL;
    fk_g.nregions = fk_g.cap_regions = 0;
    pthread_mutex_unlock(&fk_g.mu);
    for (size_t i = 0; i < n; i++) fk__region_free(regs[i]);
    free(regs);
}

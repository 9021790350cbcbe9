#include "cuda/driver.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "base/retained.h"

struct ote_cuda_driver {
    ote_cuda_driver_table_t t;
    void *dl;              /* dlopen handle, NULL for a table-built driver */
    int used_proc_address; /* resolved through cuGetProcAddress_v2 */
    _Atomic int64_t retained;
};

/* Base name, versioned symbol and offset of every entry, so loading and validation share
 * one list. cuGetProcAddress_v2 takes the base name and returns the ABI of the version
 * asked for (OTE_CU_PROC_ADDRESS_VERSION), which is the versioned symbol's. */
#define ENTRY(field, sym) \
    { #field, sym, offsetof(ote_cuda_driver_table_t, field) }
static const struct {
    const char *name;
    const char *symbol;
    size_t offset;
} k_entries[] = {
    ENTRY(cuInit, "cuInit"),
    ENTRY(cuDriverGetVersion, "cuDriverGetVersion"),
    ENTRY(cuGetErrorName, "cuGetErrorName"),
    ENTRY(cuGetErrorString, "cuGetErrorString"),
    ENTRY(cuDeviceGetCount, "cuDeviceGetCount"),
    ENTRY(cuDeviceGet, "cuDeviceGet"),
    ENTRY(cuDeviceGetName, "cuDeviceGetName"),
    ENTRY(cuDeviceGetAttribute, "cuDeviceGetAttribute"),
    ENTRY(cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId"),
    ENTRY(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
    ENTRY(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
    ENTRY(cuCtxSetCurrent, "cuCtxSetCurrent"),
    ENTRY(cuCtxGetCurrent, "cuCtxGetCurrent"),
    ENTRY(cuCtxGetDevice, "cuCtxGetDevice"),
    ENTRY(cuMemAlloc, "cuMemAlloc_v2"),
    ENTRY(cuMemFree, "cuMemFree_v2"),
    ENTRY(cuMemGetAddressRange, "cuMemGetAddressRange_v2"),
    ENTRY(cuMemHostAlloc, "cuMemHostAlloc"),
    ENTRY(cuMemFreeHost, "cuMemFreeHost"),
    ENTRY(cuMemHostRegister, "cuMemHostRegister_v2"),
    ENTRY(cuMemHostUnregister, "cuMemHostUnregister"),
    ENTRY(cuMemcpyHtoD, "cuMemcpyHtoD_v2"),
    ENTRY(cuMemcpyDtoH, "cuMemcpyDtoH_v2"),
    ENTRY(cuMemcpyDtoD, "cuMemcpyDtoD_v2"),
    ENTRY(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"),
    ENTRY(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"),
    ENTRY(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"),
    ENTRY(cuMemsetD8, "cuMemsetD8_v2"),
    ENTRY(cuPointerGetAttribute, "cuPointerGetAttribute"),
    ENTRY(cuPointerGetAttributes, "cuPointerGetAttributes"),
    ENTRY(cuPointerSetAttribute, "cuPointerSetAttribute"),
    ENTRY(cuStreamCreate, "cuStreamCreate"),
    ENTRY(cuStreamDestroy, "cuStreamDestroy_v2"),
    ENTRY(cuStreamQuery, "cuStreamQuery"),
    ENTRY(cuStreamSynchronize, "cuStreamSynchronize"),
    ENTRY(cuLaunchHostFunc, "cuLaunchHostFunc"),
    ENTRY(cuEventCreate, "cuEventCreate"),
    ENTRY(cuEventRecord, "cuEventRecord"),
    ENTRY(cuEventQuery, "cuEventQuery"),
    ENTRY(cuEventSynchronize, "cuEventSynchronize"),
    ENTRY(cuEventDestroy, "cuEventDestroy_v2"),
    ENTRY(cuIpcGetMemHandle, "cuIpcGetMemHandle"),
    ENTRY(cuIpcOpenMemHandle, "cuIpcOpenMemHandle_v2"),
    ENTRY(cuIpcCloseMemHandle, "cuIpcCloseMemHandle"),
    ENTRY(cuMemGetHandleForAddressRange, "cuMemGetHandleForAddressRange"),
    ENTRY(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity"),
    ENTRY(cuMemCreate, "cuMemCreate"),
    ENTRY(cuMemRelease, "cuMemRelease"),
    ENTRY(cuMemAddressReserve, "cuMemAddressReserve"),
    ENTRY(cuMemAddressFree, "cuMemAddressFree"),
    ENTRY(cuMemMap, "cuMemMap"),
    ENTRY(cuMemUnmap, "cuMemUnmap"),
    ENTRY(cuMemSetAccess, "cuMemSetAccess"),
    ENTRY(cuMemExportToShareableHandle, "cuMemExportToShareableHandle"),
    ENTRY(cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle"),
    ENTRY(cuMemRetainAllocationHandle, "cuMemRetainAllocationHandle"),
};
#undef ENTRY
#define N_ENTRIES (sizeof(k_entries) / sizeof(k_entries[0]))

/* cuGetProcAddress_v2 (CUDA >= 12.0). */
typedef ote_cu_result_t (*get_proc_address_fn)(const char *symbol, void **pfn, int cuda_version,
                                               unsigned long long flags, int *symbol_status);

static void **slot(ote_cuda_driver_table_t *t, size_t i) {
    return (void **)((char *)t + k_entries[i].offset);
}

ote_status_t ote_cuda_status(ote_cu_result_t res) {
    switch (res) {
        case OTE_CU_SUCCESS: return OTE_OK;
        case OTE_CU_ERROR_NOT_READY: return ote_status_make(OTE_ERR_AGAIN, res);
        case OTE_CU_ERROR_NO_DEVICE: return ote_status_make(OTE_ERR_NO_DEVICE, res);
        case OTE_CU_ERROR_ECC_UNCORRECTABLE:
        case OTE_CU_ERROR_ILLEGAL_ADDRESS:
        case OTE_CU_ERROR_LAUNCH_FAILED: return ote_status_make(OTE_ERR_DEVICE_FATAL, res);
        default: return ote_status_make(OTE_ERR_NATIVE, res);
    }
}

const char *ote_cuda_result_name(const ote_cuda_driver_t *drv, ote_cu_result_t res) {
    const char *name = NULL;
    if (drv != NULL && drv->t.cuGetErrorName != NULL &&
        drv->t.cuGetErrorName(res, &name) == OTE_CU_SUCCESS && name != NULL)
        return name;
    return "CUresult (unknown to the driver)";
}

ote_status_t ote_cuda_check(const ote_cuda_driver_t *drv, ote_cu_result_t res, const char *call) {
    if (res == OTE_CU_SUCCESS) return OTE_OK;
    OTE_WARN("cuda", "%s: %s (%d)", call, ote_cuda_result_name(drv, res), res);
    return ote_cuda_status(res);
}

static ote_status_t driver_init(ote_cuda_driver_t *drv) {
    ote_cu_result_t res = drv->t.cuInit(0);
    if (res != OTE_CU_SUCCESS) {
        OTE_WARN("cuda", "cuInit: %s (%d)", ote_cuda_result_name(drv, res), res);
        return ote_cuda_status(res);
    }
    return OTE_OK;
}

ote_status_t ote_cuda_driver_from_table(const ote_cuda_driver_table_t *table,
                                        ote_cuda_driver_t **drv_out) {
    if (table == NULL || drv_out == NULL) return OTE_ERR_INVALID;
    for (size_t i = 0; i < N_ENTRIES; i++) {
        if (*slot((ote_cuda_driver_table_t *)table, i) == NULL) {
            OTE_WARN("cuda", "driver table lacks %s", k_entries[i].name);
            return OTE_ERR_INVALID;
        }
    }
    ote_cuda_driver_t *drv = ote_calloc(1, sizeof(*drv));
    if (drv == NULL) return OTE_ERR_NOMEM;
    drv->t = *table;
    ote_status_t st = driver_init(drv);
    if (st != OTE_OK) {
        ote_free(drv);
        return st;
    }
    *drv_out = drv;
    return OTE_OK;
}

/* Resolve every entry: through cuGetProcAddress_v2 when the library exports it (the
 * driver then picks the implementation of the ABI version we ask for), else dlsym of
 * the versioned symbol. */
static ote_status_t resolve(ote_cuda_driver_t *drv, const char *path) {
    get_proc_address_fn gpa = (get_proc_address_fn)dlsym(drv->dl, "cuGetProcAddress_v2");
    drv->used_proc_address = gpa != NULL;
    for (size_t i = 0; i < N_ENTRIES; i++) {
        void *sym = NULL;
        if (gpa != NULL) {
            int found = -1;
            ote_cu_result_t res = gpa(k_entries[i].name, &sym, OTE_CU_PROC_ADDRESS_VERSION,
                                      OTE_CU_GET_PROC_ADDRESS_DEFAULT, &found);
            if (res != OTE_CU_SUCCESS || found != OTE_CU_GET_PROC_ADDRESS_SUCCESS) {
                OTE_WARN("cuda",
                         "CUDA driver %s: cuGetProcAddress_v2(%s) failed (CUresult %d, "
                         "status %d)",
                         path, k_entries[i].name, res, found);
                return res == OTE_CU_SUCCESS ? OTE_ERR_UNSUPPORTED : ote_cuda_status(res);
            }
        } else {
            sym = dlsym(drv->dl, k_entries[i].symbol);
        }
        if (sym == NULL) {
            OTE_WARN("cuda", "CUDA driver %s lacks %s", path, k_entries[i].symbol);
            return OTE_ERR_UNSUPPORTED;
        }
        *slot(&drv->t, i) = sym;
    }
    return OTE_OK;
}

int ote_cuda_driver_present(const char *path) {
    if (path == NULL) path = getenv("OTE_CUDA_LIBRARY");
    if (path == NULL || path[0] == '\0') path = "libcuda.so.1";
    void *dl = dlopen(path, RTLD_LAZY | RTLD_LOCAL);
    if (dl == NULL) return 0;
    int ok = dlsym(dl, "cuInit") != NULL;
    dlclose(dl);
    return ok;
}

ote_status_t ote_cuda_driver_load(const char *path, ote_cuda_driver_t **drv_out) {
    if (drv_out == NULL) return OTE_ERR_INVALID;
    if (path == NULL) path = getenv("OTE_CUDA_LIBRARY");
    if (path == NULL || path[0] == '\0') path = "libcuda.so.1";
    /* NODELETE: a driver is never unmapped (its threads and callbacks may outlive us). */
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (dl == NULL) {
        OTE_INFO("cuda", "no CUDA driver: dlopen(%s) failed: %s", path, dlerror());
        return OTE_ERR_NO_DEVICE;
    }
    ote_cuda_driver_t *drv = ote_calloc(1, sizeof(*drv));
    if (drv == NULL) {
        dlclose(dl);
        return OTE_ERR_NOMEM;
    }
    drv->dl = dl;
    /* cuGetProcAddress works before cuInit; the rest of the table is needed by it. */
    ote_status_t st = resolve(drv, path);
    if (st == OTE_OK) st = driver_init(drv);
    if (st != OTE_OK) {
        dlclose(dl);
        ote_free(drv);
        return st;
    }
    *drv_out = drv;
    return OTE_OK;
}

ote_status_t ote_cuda_driver_unload(ote_cuda_driver_t *drv) {
    if (drv == NULL) return OTE_OK;
    int64_t retained = atomic_load(&drv->retained);
    if (retained != 0) {
        OTE_WARN("cuda", "driver unload refused: %lld native owners retained", (long long)retained);
        return OTE_ERR_BUSY;
    }
    if (drv->dl != NULL) dlclose(drv->dl);
    ote_free(drv);
    return OTE_OK;
}

const ote_cuda_driver_table_t *ote_cuda_driver_table(const ote_cuda_driver_t *drv) {
    return drv == NULL ? NULL : &drv->t;
}

void *ote_cuda_driver_dl_handle(const ote_cuda_driver_t *drv) {
    return drv == NULL ? NULL : drv->dl;
}

int ote_cuda_driver_used_proc_address(const ote_cuda_driver_t *drv) {
    return drv != NULL && drv->used_proc_address;
}

ote_status_t ote_cuda_device_count(ote_cuda_driver_t *drv, int *count_out) {
    if (drv == NULL || count_out == NULL) return OTE_ERR_INVALID;
    int n = 0;
    ote_status_t st = ote_cuda_check(drv, drv->t.cuDeviceGetCount(&n), "cuDeviceGetCount");
    if (st != OTE_OK) return st;
    *count_out = n;
    return OTE_OK;
}

uint64_t ote_cuda_driver_retained(const ote_cuda_driver_t *drv) {
    if (drv == NULL) return 0;
    int64_t n = atomic_load(&((ote_cuda_driver_t *)drv)->retained);
    return n < 0 ? 0 : (uint64_t)n;
}

void ote__cuda_retained_note(ote_cuda_driver_t *drv, int delta) {
    if (drv == NULL || delta == 0) return;
    atomic_fetch_add(&drv->retained, delta);
    ote_retained_note(OTE_RETAINED_OTHER, delta); /* the process-wide registry */
}

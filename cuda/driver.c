#include "cuda/driver.h"

#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"

struct ote_cuda_driver {
    ote_cuda_driver_table_t t;
    void *dl; /* dlopen handle, NULL for a table-built driver */
};

/* Name and offset of every entry, so loading and validation share one list. The
 * library exports the _v2 ABI under these names where both exist. */
#define ENTRY(field, sym) {#field, sym, offsetof(ote_cuda_driver_table_t, field)}
static const struct {
    const char *field;
    const char *symbol;
    size_t offset;
} k_entries[] = {
    ENTRY(cuInit, "cuInit"),
    ENTRY(cuDriverGetVersion, "cuDriverGetVersion"),
    ENTRY(cuDeviceGetCount, "cuDeviceGetCount"),
    ENTRY(cuDeviceGet, "cuDeviceGet"),
    ENTRY(cuDeviceGetName, "cuDeviceGetName"),
    ENTRY(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
    ENTRY(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
    ENTRY(cuCtxSetCurrent, "cuCtxSetCurrent"),
    ENTRY(cuMemAlloc, "cuMemAlloc_v2"),
    ENTRY(cuMemFree, "cuMemFree_v2"),
    ENTRY(cuMemcpyHtoD, "cuMemcpyHtoD_v2"),
    ENTRY(cuMemcpyDtoH, "cuMemcpyDtoH_v2"),
    ENTRY(cuPointerGetAttribute, "cuPointerGetAttribute"),
    ENTRY(cuStreamCreate, "cuStreamCreate"),
    ENTRY(cuStreamDestroy, "cuStreamDestroy_v2"),
    ENTRY(cuEventCreate, "cuEventCreate"),
    ENTRY(cuEventRecord, "cuEventRecord"),
    ENTRY(cuEventQuery, "cuEventQuery"),
    ENTRY(cuEventDestroy, "cuEventDestroy_v2"),
};
#undef ENTRY
#define N_ENTRIES (sizeof(k_entries) / sizeof(k_entries[0]))

static void **slot(ote_cuda_driver_table_t *t, size_t i) {
    return (void **)((char *)t + k_entries[i].offset);
}

ote_status_t ote_cuda_status(ote_cu_result_t res) {
    switch (res) {
        case OTE_CU_SUCCESS: return OTE_OK;
        case OTE_CU_ERROR_NOT_READY: return OTE_ERR_AGAIN;
        case OTE_CU_ERROR_NO_DEVICE: return OTE_ERR_NO_DEVICE;
        default: return ote_status_make(OTE_ERR_NATIVE, res);
    }
}

static ote_status_t driver_init(ote_cuda_driver_t *drv) {
    ote_cu_result_t res = drv->t.cuInit(0);
    if (res != OTE_CU_SUCCESS) {
        OTE_WARN("cuda", "cuInit failed with CUresult %d", res);
        return ote_cuda_status(res);
    }
    return OTE_OK;
}

ote_status_t ote_cuda_driver_from_table(const ote_cuda_driver_table_t *table,
                                        ote_cuda_driver_t **drv_out) {
    if (table == NULL || drv_out == NULL) return OTE_ERR_INVALID;
    ote_cuda_driver_t *drv = ote_calloc(1, sizeof(*drv));
    if (drv == NULL) return OTE_ERR_NOMEM;
    drv->t = *table;
    for (size_t i = 0; i < N_ENTRIES; i++) {
        if (*slot(&drv->t, i) == NULL) {
            OTE_WARN("cuda", "driver table lacks %s", k_entries[i].field);
            ote_free(drv);
            return OTE_ERR_INVALID;
        }
    }
    ote_status_t st = driver_init(drv);
    if (st != OTE_OK) {
        ote_free(drv);
        return st;
    }
    *drv_out = drv;
    return OTE_OK;
}

ote_status_t ote_cuda_driver_load(const char *path, ote_cuda_driver_t **drv_out) {
    if (drv_out == NULL) return OTE_ERR_INVALID;
    if (path == NULL) path = "libcuda.so.1";
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
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
    for (size_t i = 0; i < N_ENTRIES; i++) {
        void *sym = dlsym(dl, k_entries[i].symbol);
        if (sym == NULL) {
            OTE_WARN("cuda", "CUDA driver %s lacks %s", path, k_entries[i].symbol);
            ote_cuda_driver_unload(drv);
            return OTE_ERR_UNSUPPORTED;
        }
        *slot(&drv->t, i) = sym;
    }
    ote_status_t st = driver_init(drv);
    if (st != OTE_OK) {
        ote_cuda_driver_unload(drv);
        return st;
    }
    *drv_out = drv;
    return OTE_OK;
}

void ote_cuda_driver_unload(ote_cuda_driver_t *drv) {
    if (drv == NULL) return;
    if (drv->dl != NULL) dlclose(drv->dl);
    ote_free(drv);
}

const ote_cuda_driver_table_t *ote_cuda_driver_table(const ote_cuda_driver_t *drv) {
    return drv == NULL ? NULL : &drv->t;
}

ote_status_t ote_cuda_device_count(ote_cuda_driver_t *drv, int *count_out) {
    if (drv == NULL || count_out == NULL) return OTE_ERR_INVALID;
    int n = 0;
    ote_cu_result_t res = drv->t.cuDeviceGetCount(&n);
    if (res != OTE_CU_SUCCESS) return ote_cuda_status(res);
    *count_out = n;
    return OTE_OK;
}

ote_status_t ote_cuda_pointer_is_device(ote_cuda_driver_t *drv, const void *ptr, int *is_device_out) {
    if (drv == NULL || is_device_out == NULL) return OTE_ERR_INVALID;
    unsigned int type = 0;
    ote_cu_result_t res = drv->t.cuPointerGetAttribute(&type, OTE_CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                                       (ote_cu_deviceptr_t)(uintptr_t)ptr);
    /* An address the driver never allocated or registered is ordinary host memory
     * (CUDA_ERROR_INVALID_VALUE); any other failure is reported. */
    if (res == OTE_CU_ERROR_INVALID_VALUE) {
        *is_device_out = 0;
        return OTE_OK;
    }
    if (res != OTE_CU_SUCCESS) return ote_cuda_status(res);
    *is_device_out = type == OTE_CU_MEMORYTYPE_DEVICE;
    return OTE_OK;
}

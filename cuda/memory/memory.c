#include "cuda/memory/memory.h"

#include <unistd.h>

#include "base/alloc.h"
#include "base/lock.h"
#include "base/log.h"

/* ---- classification ---- */

ote_status_t ote_cuda_pointer_classify(ote_cuda_driver_t *drv, ote_cu_deviceptr_t ptr,
                                       ote_cuda_pointer_info_t *info_out) {
    if (drv == NULL || info_out == NULL) return OTE_ERR_INVALID;
    const ote_cuda_driver_table_t *t = ote_cuda_driver_table(drv);
    /* Zeroed first: for a pointer it does not know, the driver answers CUDA_SUCCESS and
     * leaves (or sets) every attribute at its null value. IS_MANAGED is a bool that some
     * drivers write as one byte, so it is read from a zeroed int. */
    unsigned int mem_type = 0, is_managed = 0;
    int ordinal = -1;
    ote_cu_context_t ctx = NULL;
    unsigned long long buffer_id = 0;
    ote_cu_deviceptr_t start = 0;
    size_t size = 0;
    int attrs[] = {
        OTE_CU_POINTER_ATTRIBUTE_MEMORY_TYPE,      OTE_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        OTE_CU_POINTER_ATTRIBUTE_CONTEXT,          OTE_CU_POINTER_ATTRIBUTE_BUFFER_ID,
        OTE_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, OTE_CU_POINTER_ATTRIBUTE_RANGE_SIZE,
        OTE_CU_POINTER_ATTRIBUTE_IS_MANAGED};
    void *data[] = {&mem_type, &ordinal, &ctx, &buffer_id, &start, &size, &is_managed};
    ote_status_t st = ote_cuda_check(
        drv, t->cuPointerGetAttributes(sizeof(attrs) / sizeof(attrs[0]), attrs, data, ptr),
        "cuPointerGetAttributes");
    if (st != OTE_OK) return st;
    ote_cuda_pointer_info_t info = {0};
    info.device_ordinal = -1;
    if (is_managed) {
        info.kind = OTE_CUDA_MEM_MANAGED;
    } else if (mem_type == OTE_CU_MEMORYTYPE_DEVICE) {
        info.kind = OTE_CUDA_MEM_DEVICE;
    } else if (mem_type == OTE_CU_MEMORYTYPE_HOST) {
        info.kind = OTE_CUDA_MEM_PINNED;
    } else {
        *info_out = info; /* pageable: nothing else applies */
        return OTE_OK;
    }
    info.device_ordinal = ordinal;
    info.context = ctx;
    info.buffer_id = buffer_id;
    info.range_start = start;
    info.range_size = size;
    *info_out = info;
    return OTE_OK;
}

ote_status_t ote_cuda_pointer_set_sync_memops(ote_cuda_device_t *dev, ote_cu_deviceptr_t ptr) {
    if (dev == NULL) return OTE_ERR_INVALID;
    ote_status_t st = ote_cuda_device_make_current(dev);
    if (st != OTE_OK) return st;
    unsigned int one = 1;
    return ote_cuda_check(ote_cuda_device_driver(dev),
                          ote_cuda_device_table(dev)->cuPointerSetAttribute(
                              &one, OTE_CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, ptr),
                          "cuPointerSetAttribute(SYNC_MEMOPS)");
}

/* ---- dmabuf ---- */

static size_t page_size(void) {
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096;
}

ote_status_t ote_cuda_dmabuf_export(ote_cuda_device_t *dev, ote_cu_deviceptr_t ptr, size_t len,
                                    ote_cuda_dmabuf_t *out) {
    if (dev == NULL || out == NULL || len == 0) return OTE_ERR_INVALID;
    ote_cuda_driver_t *drv = ote_cuda_device_driver(dev);
    ote_cuda_pointer_info_t info;
    ote_status_t st = ote_cuda_pointer_classify(drv, ptr, &info);
    if (st != OTE_OK) return st;
    if (info.kind != OTE_CUDA_MEM_DEVICE || info.device_ordinal != ote_cuda_device_ordinal(dev)) {
        OTE_WARN("cuda", "dmabuf export: 0x%llx is not memory of device %d", ptr,
                 ote_cuda_device_ordinal(dev));
        return OTE_ERR_INVALID;
    }
    if (ptr + len < ptr || ptr + len > info.range_start + info.range_size) {
        OTE_WARN("cuda", "dmabuf export: [0x%llx, +%zu) runs past its allocation", ptr, len);
        return OTE_ERR_INVALID;
    }
    /* The dmabuf's offset 0 is the allocation base (page-aligned: allocations are at
     * least 256-byte aligned in 2 MiB-granular physical pages, and the driver demands
     * page alignment of both ends). */
    size_t pg = page_size();
    ote_cu_deviceptr_t base = info.range_start & ~(ote_cu_deviceptr_t)(pg - 1);
    size_t need = (size_t)(ptr + len - base);
    size_t length = (need + pg - 1) & ~(pg - 1);
    st = ote_cuda_device_make_current(dev);
    if (st != OTE_OK) return st;
    int fd = -1;
    st = ote_cuda_check(drv,
                        ote_cuda_device_table(dev)->cuMemGetHandleForAddressRange(
                            &fd, base, length, OTE_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
                        "cuMemGetHandleForAddressRange(DMA_BUF_FD)");
    if (st != OTE_OK) return st;
    out->fd = fd;
    out->offset = ptr - base;
    out->length = length;
    out->base = base;
    return OTE_OK;
}

void ote_cuda_dmabuf_close(ote_cuda_dmabuf_t *d) {
    if (d == NULL || d->fd < 0) return;
    close(d->fd);
    d->fd = -1;
}

/* ---- device allocations ---- */

/* How far a VMM allocation is built (and, on destroy, how far it is still built). */
enum { VMM_NONE = 0, VMM_HANDLE = 1, VMM_RESERVED = 2, VMM_MAPPED = 3 };

struct ote_cuda_alloc {
    ote_cuda_device_t *dev;
    ote_cu_deviceptr_t ptr;
    size_t size;
    int vmm;
    int vmm_stage;
    ote_cu_mem_handle_t vmm_handle;
    ote_mutex_t mu;
    ote_cond_t cv;
    uint32_t users;
    int closing;
    ote__cuda_retained_node_t retained;
};

/* Undo a VMM allocation from its current stage down; stops at the first failure, which
 * leaves vmm_stage where the next attempt resumes. */
static ote_status_t vmm_unwind(ote_cuda_alloc_t *a) {
    ote_cuda_driver_t *drv = ote_cuda_device_driver(a->dev);
    const ote_cuda_driver_table_t *t = ote_cuda_device_table(a->dev);
    ote_status_t st = OTE_OK;
    if (a->vmm_stage == VMM_MAPPED) {
        st = ote_cuda_check(drv, t->cuMemUnmap(a->ptr, a->size), "cuMemUnmap");
        if (st != OTE_OK) return st;
        a->vmm_stage = VMM_RESERVED;
    }
    if (a->vmm_stage == VMM_RESERVED) {
        st = ote_cuda_check(drv, t->cuMemAddressFree(a->ptr, a->size), "cuMemAddressFree");
        if (st != OTE_OK) return st;
        a->vmm_stage = VMM_HANDLE;
    }
    if (a->vmm_stage == VMM_HANDLE) {
        st = ote_cuda_check(drv, t->cuMemRelease(a->vmm_handle), "cuMemRelease");
        if (st != OTE_OK) return st;
        a->vmm_stage = VMM_NONE;
    }
    return OTE_OK;
}

static ote_status_t vmm_create(ote_cuda_alloc_t *a, size_t size) {
    ote_cuda_driver_t *drv = ote_cuda_device_driver(a->dev);
    const ote_cuda_driver_table_t *t = ote_cuda_device_table(a->dev);
    ote_cu_mem_allocation_prop_t prop = {0};
    prop.type = OTE_CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requested_handle_types = OTE_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location.type = OTE_CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ote_cuda_device_ordinal(a->dev);
    size_t gran = 0;
    ote_status_t st = ote_cuda_check(
        drv, t->cuMemGetAllocationGranularity(&gran, &prop, OTE_CU_MEM_ALLOC_GRANULARITY_MINIMUM),
        "cuMemGetAllocationGranularity");
    if (st != OTE_OK) return st;
    if (gran == 0) gran = 2u << 20;
    if (size > SIZE_MAX - gran) return OTE_ERR_TOO_BIG;
    a->size = (size + gran - 1) / gran * gran;
    ote_cu_mem_handle_t h = 0;
    st = ote_cuda_check(drv, t->cuMemCreate(&h, a->size, &prop, 0), "cuMemCreate");
    if (st != OTE_OK) return st;
    a->vmm_handle = h;
    a->vmm_stage = VMM_HANDLE;
    ote_cu_deviceptr_t p = 0;
    st = ote_cuda_check(drv, t->cuMemAddressReserve(&p, a->size, 0, 0, 0), "cuMemAddressReserve");
    if (st != OTE_OK) goto err_unwind;
    a->ptr = p;
    a->vmm_stage = VMM_RESERVED;
    st = ote_cuda_check(drv, t->cuMemMap(a->ptr, a->size, 0, a->vmm_handle, 0), "cuMemMap");
    if (st != OTE_OK) goto err_unwind;
    a->vmm_stage = VMM_MAPPED;
    ote_cu_mem_access_desc_t desc = {{OTE_CU_MEM_LOCATION_TYPE_DEVICE, prop.location.id},
                                     OTE_CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    st = ote_cuda_check(drv, t->cuMemSetAccess(a->ptr, a->size, &desc, 1), "cuMemSetAccess");
    if (st != OTE_OK) goto err_unwind;
    return OTE_OK;

err_unwind:
    return st; /* the caller unwinds (and retains what does not unwind) */
}

static void alloc_free_struct(ote_cuda_alloc_t *a) {
    ote_cuda_device_t *dev = a->dev;
    ote_cond_destroy(&a->cv);
    ote_mutex_destroy(&a->mu);
    ote_free(a);
    ote__cuda_device_unref(dev);
}

/* Native release of the allocation; OTE_OK when nothing native is left. */
static ote_status_t alloc_release_native(ote_cuda_alloc_t *a) {
    if (a->vmm) return vmm_unwind(a);
    if (a->ptr == 0) return OTE_OK;
    ote_status_t st = ote_cuda_check(ote_cuda_device_driver(a->dev),
                                     ote_cuda_device_table(a->dev)->cuMemFree(a->ptr), "cuMemFree");
    if (st == OTE_OK) a->ptr = 0;
    return st;
}

static ote_status_t alloc_retry(void *owner) {
    ote_cuda_alloc_t *a = owner;
    ote_status_t st = ote_cuda_device_make_current(a->dev);
    if (st == OTE_OK) st = alloc_release_native(a);
    if (st != OTE_OK) return st;
    alloc_free_struct(a);
    return OTE_OK;
}

ote_status_t ote_cuda_alloc_create(ote_cuda_device_t *dev, size_t size, unsigned flags,
                                   ote_cuda_alloc_t **alloc_out) {
    if (dev == NULL || alloc_out == NULL || size == 0 || (flags & ~OTE_CUDA_ALLOC_VMM) != 0)
        return OTE_ERR_INVALID;
    ote_cuda_alloc_t *a = ote_calloc(1, sizeof(*a));
    if (a == NULL) return OTE_ERR_NOMEM;
    a->dev = dev;
    a->size = size;
    a->vmm = (flags & OTE_CUDA_ALLOC_VMM) != 0;
    ote_status_t st = ote_mutex_init(&a->mu);
    if (st != OTE_OK) goto err_free;
    st = ote_cond_init(&a->cv);
    if (st != OTE_OK) goto err_mutex;
    st = ote_cuda_device_make_current(dev);
    if (st != OTE_OK) goto err_cond;
    ote__cuda_device_ref(dev); /* the allocation holds its device from here on */
    if (a->vmm) {
        st = vmm_create(a, size);
    } else {
        ote_cu_deviceptr_t p = 0;
        st = ote_cuda_check(ote_cuda_device_driver(dev),
                            ote_cuda_device_table(dev)->cuMemAlloc(&p, size), "cuMemAlloc");
        if (st == OTE_OK) a->ptr = p;
    }
    if (st != OTE_OK) {
        if (alloc_release_native(a) != OTE_OK) {
            /* The rollback itself failed: what was built stays owned, and retained. */
            ote__cuda_device_retain(dev, &a->retained, a, alloc_retry, "partial VMM allocation");
            return st;
        }
        ote__cuda_device_unref(dev);
        goto err_cond;
    }
    *alloc_out = a;
    return OTE_OK;

err_cond:
    ote_cond_destroy(&a->cv);
err_mutex:
    ote_mutex_destroy(&a->mu);
err_free:
    ote_free(a);
    return st;
}

ote_status_t ote_cuda_alloc_import_vmm(ote_cuda_device_t *dev, int fd, size_t size,
                                       ote_cuda_alloc_t **alloc_out) {
    if (dev == NULL || alloc_out == NULL || fd < 0 || size == 0) return OTE_ERR_INVALID;
    ote_cuda_driver_t *drv = ote_cuda_device_driver(dev);
    const ote_cuda_driver_table_t *t = ote_cuda_device_table(dev);
    ote_cuda_alloc_t *a = ote_calloc(1, sizeof(*a));
    if (a == NULL) return OTE_ERR_NOMEM;
    a->dev = dev;
    a->size = size;
    a->vmm = 1;
    ote_status_t st = ote_mutex_init(&a->mu);
    if (st != OTE_OK) goto err_free;
    st = ote_cond_init(&a->cv);
    if (st != OTE_OK) goto err_mutex;
    st = ote_cuda_device_make_current(dev);
    if (st != OTE_OK) goto err_cond;
    ote__cuda_device_ref(dev);
    ote_cu_mem_handle_t h = 0;
    st =
        ote_cuda_check(drv,
                       t->cuMemImportFromShareableHandle(
                           &h, (void *)(uintptr_t)fd, OTE_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                       "cuMemImportFromShareableHandle(POSIX_FD)");
    if (st != OTE_OK) goto err_unwind;
    a->vmm_handle = h;
    a->vmm_stage = VMM_HANDLE;
    ote_cu_deviceptr_t p = 0;
    st = ote_cuda_check(drv, t->cuMemAddressReserve(&p, size, 0, 0, 0), "cuMemAddressReserve");
    if (st != OTE_OK) goto err_unwind;
    a->ptr = p;
    a->vmm_stage = VMM_RESERVED;
    st = ote_cuda_check(drv, t->cuMemMap(p, size, 0, h, 0), "cuMemMap");
    if (st != OTE_OK) goto err_unwind;
    a->vmm_stage = VMM_MAPPED;
    ote_cu_mem_access_desc_t desc = {
        {OTE_CU_MEM_LOCATION_TYPE_DEVICE, ote_cuda_device_ordinal(dev)},
        OTE_CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    st = ote_cuda_check(drv, t->cuMemSetAccess(p, size, &desc, 1), "cuMemSetAccess");
    if (st != OTE_OK) goto err_unwind;
    *alloc_out = a;
    return OTE_OK;

err_unwind:
    if (vmm_unwind(a) != OTE_OK) {
        ote__cuda_device_retain(dev, &a->retained, a, alloc_retry, "partial VMM import");
        return st;
    }
    ote__cuda_device_unref(dev);
err_cond:
    ote_cond_destroy(&a->cv);
err_mutex:
    ote_mutex_destroy(&a->mu);
err_free:
    ote_free(a);
    return st;
}

ote_status_t ote_cuda_alloc_destroy(ote_cuda_alloc_t *a, ote_deadline_t deadline) {
    if (a == NULL) return OTE_OK;
    ote_mutex_lock(&a->mu);
    a->closing = 1; /* no new users from here on */
    while (a->users != 0) {
        if (ote_cond_wait(&a->cv, &a->mu, deadline) == OTE_ERR_TIMEOUT && a->users != 0) {
            a->closing = 0;
            ote_mutex_unlock(&a->mu);
            return OTE_ERR_BUSY;
        }
    }
    ote_mutex_unlock(&a->mu);
    ote_status_t st = ote_cuda_device_make_current(a->dev);
    if (st == OTE_OK) st = alloc_release_native(a);
    if (st != OTE_OK) {
        ote__cuda_device_retain(a->dev, &a->retained, a, alloc_retry, "device allocation");
        return ote_status_make(OTE_ERR_RETAINED, ote_status_errno(st));
    }
    alloc_free_struct(a);
    return OTE_OK;
}

ote_cu_deviceptr_t ote_cuda_alloc_ptr(const ote_cuda_alloc_t *a) { return a->ptr; }
size_t ote_cuda_alloc_size(const ote_cuda_alloc_t *a) { return a->size; }
ote_cuda_device_t *ote_cuda_alloc_device(const ote_cuda_alloc_t *a) { return a->dev; }
int ote_cuda_alloc_is_vmm(const ote_cuda_alloc_t *a) { return a->vmm; }
ote_cu_mem_handle_t ote_cuda_alloc_vmm_handle(const ote_cuda_alloc_t *a) {
    return a->vmm ? a->vmm_handle : 0;
}

ote_status_t ote_cuda_alloc_acquire(ote_cuda_alloc_t *a) {
    if (a == NULL) return OTE_ERR_INVALID;
    ote_mutex_lock(&a->mu);
    ote_status_t st = a->closing ? OTE_ERR_STATE : OTE_OK;
    if (st == OTE_OK) a->users++;
    ote_mutex_unlock(&a->mu);
    return st;
}

void ote_cuda_alloc_release(ote_cuda_alloc_t *a) {
    ote_mutex_lock(&a->mu);
    if (--a->users == 0) ote_cond_broadcast(&a->cv);
    ote_mutex_unlock(&a->mu);
}

uint32_t ote_cuda_alloc_users(ote_cuda_alloc_t *a) {
    ote_mutex_lock(&a->mu);
    uint32_t n = a->users;
    ote_mutex_unlock(&a->mu);
    return n;
}

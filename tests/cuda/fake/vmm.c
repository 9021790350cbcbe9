/* The fake libcuda's virtual memory management. A physical handle (cuMemCreate) is a
 * memfd; a reservation (cuMemAddressReserve) is a PROT_NONE device address range with a
 * PROT_NONE shadow range of the same size; cuMemMap maps the handle's memfd into the
 * shadow at the same offset (the device address stays PROT_NONE), so copies that span
 * adjacent mappings see contiguous bytes. Copies need cuMemSetAccess first, as on a GPU.
 * Export to a POSIX fd is a dup of the memfd; import dups the caller's fd. Lock: fk_g.mu
 * guards handles and mappings. See fake_internal.h. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/cuda/fake/fake_internal.h"

typedef struct fk_vmm_handle {
    struct fk_vmm_handle *next; /* fk_handles */
    int memfd;
    size_t size;
    int dev;
    int imported; /* from cuMemImportFromShareableHandle: not charged to a device */
    unsigned long long handle_types;
    unsigned refs;    /* the callers' (until cuMemRelease) + one per mapping */
    unsigned callers; /* cuMemCreate/import + cuMemRetainAllocationHandle, not yet released */
    int released;     /* every caller released it */
} fk_vmm_handle_t;

static fk_vmm_handle_t *fk_handles; /* fk_g.mu */

static fk_vmm_handle_t *fk_handle_find(CUmemGenericAllocationHandle h) {
    for (fk_vmm_handle_t *v = fk_handles; v != NULL; v = v->next)
        if ((CUmemGenericAllocationHandle)(uintptr_t)v == h && !v->released) return v;
    return NULL;
}

/* Drops a reference (fk_g.mu held); the last one closes the memfd. */
static void fk_handle_unref(fk_vmm_handle_t *v) {
    if (--v->refs != 0) return;
    fk_vmm_handle_t **pp = &fk_handles;
    while (*pp != v) pp = &(*pp)->next;
    *pp = v->next;
    if (!v->imported) fk_g.devs[v->dev].used -= v->size;
    close(v->memfd);
    free(v);
}

static int fk_valid_prop(const CUmemAllocationProp *prop) {
    return prop != NULL && prop->type == CU_MEM_ALLOCATION_TYPE_PINNED &&
           prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && prop->location.id >= 0 &&
           prop->location.id < fk_g.ndev;
}

CUresult CUDAAPI cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                               CUmemAllocationGranularity_flags option) {
    FK_ENTER(cuMemGetAllocationGranularity);
    CUresult res = fk__need_init();
    if (res != CUDA_SUCCESS) return res;
    if (granularity == NULL || !fk_valid_prop(prop) ||
        (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
         option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    *granularity = FK_GRANULARITY;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                             const CUmemAllocationProp *prop, unsigned long long flags) {
    FK_ENTER(cuMemCreate);
    CUresult res = fk__need_ctx(NULL);
    if (res != CUDA_SUCCESS) return res;
    if (handle == NULL || !fk_valid_prop(prop) || flags != 0 || size == 0 ||
        size % FK_GRANULARITY != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if ((prop->requestedHandleTypes & ~(unsigned)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0)
        return CUDA_ERROR_NOT_SUPPORTED;
    int dev = prop->location.id;
    pthread_mutex_lock(&fk_g.mu);
    if (fk_g.devs[dev].used + size > fk_g.capacity) {
        pthread_mutex_unlock(&fk_g.mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    fk_g.devs[dev].used += size;
    uint64_t id = fk__new_buffer_id();
    pthread_mutex_unlock(&fk_g.mu);
    fk_vmm_handle_t *v = calloc(1, sizeof(*v));
    char name[64];
    snprintf(name, sizeof(name), "fake_cuda:%d:%llu:%d", (int)getpid(), (unsigned long long)id,
             dev);
    int fd = v != NULL ? memfd_create(name, MFD_CLOEXEC) : -1;
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        if (fd >= 0) close(fd);
        free(v);
        pthread_mutex_lock(&fk_g.mu);
        fk_g.devs[dev].used -= size;
        pthread_mutex_unlock(&fk_g.mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    v->memfd = fd;
    v->size = size;
    v->dev = dev;
    v->handle_types = prop->requestedHandleTypes;
    v->refs = 1;
    v->callers = 1;
    pthread_mutex_lock(&fk_g.mu);
    v->next = fk_handles;
    fk_handles = v;
    pthread_mutex_unlock(&fk_g.mu);
    atomic_fetch_add(&fk_g.c_vmm_handles, 1);
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)v;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
    FK_ENTER(cuMemRelease);
    CUresult res = fk__need_init();
    if (res != CUDA_SUCCESS) return res;
    pthread_mutex_lock(&fk_g.mu);
    fk_vmm_handle_t *v = fk_handle_find(handle);
    if (v == NULL) {
        pthread_mutex_unlock(&fk_g.mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    int last = --v->callers == 0;
    if (last) v->released = 1; /* mappings keep the memory until they are unmapped */
    fk_handle_unref(v);
    pthread_mutex_unlock(&fk_g.mu);
    if (last) atomic_fetch_sub(&fk_g.c_vmm_handles, 1);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                     CUdeviceptr addr, unsigned long long flags) {
    FK_ENTER(cuMemAddressReserve);
    CUresult res = fk__need_init();
    if (res != CUDA_SUCCESS) return res;
    (void)addr; /* a hint only */
    if (ptr == NULL || size == 0 || size % FK_GRANULARITY != 0 || flags != 0 ||
        (alignment & (alignment - 1)) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    size_t align = alignment > FK_GRANULARITY ? alignment : FK_GRANULARITY;
    fk_region_t *r = calloc(1, sizeof(*r));
    if (r == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    r->memfd = -1;
    void *va = fk__reserve(size, align, &r->va_base, &r->va_len);
    void *sh = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (va == NULL || sh == MAP_FAILED) {
        if (sh != MAP_FAILED) munmap(sh, size);
        fk__region_free(r);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    r->shadow = sh;
    r->start = (uint64_t)(uintptr_t)va;
    r->size = size;
    r->map_len = size;
    r->kind = FK_VMM_RESERVE;
    r->dev = -1;
    pthread_mutex_lock(&fk_g.mu);
    r->buffer_id = fk__new_buffer_id();
    int ins = fk__region_insert(r);
    pthread_mutex_unlock(&fk_g.mu);
    if (ins != 0) {
        fk__region_free(r);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    atomic_fetch_add(&fk_g.c_vmm_reservations, 1);
    *ptr = r->start;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    FK_ENTER(cuMemAddressFree);
    CUresult res = fk__need_init();
    if (res != CUDA_SUCCESS) return res;
    pthread_mutex_lock(&fk_g.mu);
    fk_region_t *r = fk__region_find_base(ptr, FK_VMM_RESERVE);
    if (r == NULL || r->size != size || r->maps != NULL) {
        pthread_mutex_unlock(&fk_g.mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    fk__region_remove(r);
    while (r->busy > 0) pthread_cond_wait(&fk_g.cv, &fk_g.mu);
    pthread_mutex_unlock(&fk_g.mu);
    atomic_fetch_sub(&fk_g.c_vmm_reservations, 1);
    fk__region_free(r);
    return CUDA_SUCCESS;
}

/* The mapping of r that contains addr (fk_g.mu held). */
static fk_vmm_map_t *fk_map_at(fk_region_t *r, uint64_t addr) {
    for (fk_vmm_map_t *m = r->maps; m != NULL; m = m->next)
        if (addr - m->start < m->size) return m;
    return NULL;
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                          CUmemGenericAllocationHandle handle, unsigned long long flags) {
    FK_ENTER(cuMemMap);
    CUresult res = fk__need_init();
    if (res != CUDA_SUCCESS) return res;
    if (flags != 0 || size == 0 || ptr % FK_GRANULARITY != 0 || size % FK_GRANULARITY != 0 ||
        offset % FK_GRANULARITY != 0)
        return CUDA_ERROR_INVALID_VALUE;
    fk_vmm_map_t *m = calloc(1, sizeof(*m));
    if (m == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&fk_g.mu);
    fk_region_t *r = fk__region_find(ptr);
    fk_vmm_handle_t *v = fk_handle_find(handle);
    res = CUDA_ERROR_INVALID_VALUE;
    if (r == NULL || r->kind != FK_VMM_RESERVE || ptr + size - r->start > r->size || v == NULL ||
        offset + size > v->size || offset + size < offset)
        goto err;
    for (fk_vmm_map_t *o = r->maps; o != NULL; o = o->next) {
        if (ptr < o->start + o->size && o->start < ptr + size) {
            res = CUDA_ERROR_ALREADY_MAPPED;
            goto err;
        }
    }
    void *at = r->shadow + (ptr - r->start);
    if (mmap(at, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, v->memfd, (off_t)offset) ==
        MAP_FAILED) {
        res = CUDA_ERROR_OUT_OF_MEMORY;
        goto err;
    }
    m->start = ptr;
    m->size = size;
    m->offset = offset;
    m->handle = v;
    m->buffer_id = fk__new_buffer_id();
    v->refs++;
    m->next = r->maps;
    r->maps = m;
    if (r->dev < 0) r->dev = v->dev;
    pthread_mutex_unlock(&fk_g.mu);
    atomic_fetch_add(&fk_g.c_vmm_mappings, 1);
    return CUDA_SUCCESS;
err:
    pthread_mutex_unlock(&fk_g.mu);
    free(m);
    return res;
}

/* Removes mapping m from r and puts PROT_NONE back in the shadow (fk_g.mu held). */
static void fk_unmap_one(fk_region_t *r, fk_vmm_map_t *m) {
    fk_vmm_map_t **pp = &r->maps;
    while (*pp != m) pp = &(*pp)->next;
    *pp = m->next;
    mmap(r->shadow + (m->start - r->start), m->size, PROT_NONE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    fk_handle_unref(m->handle);
    free(m);
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
    FK_ENTER(cuMemUnmap);
    CUresult res = fk__need_init();
    if (res != CUDA_SUCCESS) return res;
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_g.mu);
    fk_region_t *r = fk__region_find(ptr);
    if (r == NULL || r->kind != FK_VMM_RESERVE || ptr + size - r->start > r->size) {
        pthread_mutex_unlock(&fk_g.mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    /* The range must be exactly a union of whole mappings. */
    size_t covered = 0;
    for (fk_vmm_map_t *m = r->maps; m != NULL; m = m->next) {
        int inside = m->start >= ptr && m->start + m->size <= ptr + size;
        int overlaps = m->start < ptr + size && ptr < m->start + m->size;
        if (overlaps && !inside) {
            pthread_mutex_unlock(&fk_g.mu);
            return CUDA_ERROR_INVALID_VALUE;
        }
        if (inside) covered += m->size;
    }
    if (covered != size) {
        pthread_mutex_unlock(&fk_g.mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    while (r->busy > 0) pthread_cond_wait(&fk_g.cv, &fk_g.mu);
    unsigned n = 0;
    fk_vmm_map_t *m = r->maps;
    while (m != NULL) {
        fk_vmm_map_t *next = m->next;
        if (m->start >= ptr && m->start + m->size <= ptr + size) {
            fk_unmap_one(r, m);
            n++;
        }
        m = next;
    }
    pthread_mutex_unlock(&fk_g.mu);
    atomic_fetch_sub(&fk_g.c_vmm_mappings, n);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                size_t count) {
    FK_ENTER(cuMemSetAccess);
    CUresult res = fk__need_init();
    if (res != CUDA_SUCCESS) return res;
    if (desc == NULL || count == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
    int flags = 0;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc[i].location.id < 0 ||
            desc[i].location.id >= fk_g.ndev ||
            (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
             desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
             desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE))
            return CUDA_ERROR_INVALID_VALUE;
        if ((int)desc[i].flags > flags) flags = (int)desc[i].flags;
    }
    pthread_mutex_lock(&fk_g.mu);
    fk_region_t *r = fk__region_find(ptr);
    res = CUDA_ERROR_INVALID_VALUE;
    if (r != NULL && r->kind == FK_VMM_RESERVE && ptr + size - r->start <= r->size) {
        /* Every byte of the range must be mapped. */
        uint64_t cur = ptr;
        while (cur < ptr + size) {
            fk_vmm_map_t *m = fk_map_at(r, cur);
            if (m == NULL) break;
            cur = m->start + m->size;
        }
        if (cur >= ptr + size) {
            for (fk_vmm_map_t *m = r->maps; m != NULL; m = m->next)
                if (m->start < ptr + size && ptr < m->start + m->size) m->access = flags;
            res = CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&fk_g.mu);
    return res;
}

FK_HIDDEN CUresult fk__vmm_resolve(fk_region_t *r, uint64_t addr, size_t n, int write) {
    if (addr + n - r->start > r->size) return CUDA_ERROR_INVALID_VALUE;
    int need = write ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_READ;
    uint64_t cur = addr;
    do {
        fk_vmm_map_t *m = fk_map_at(r, cur);
        if (m == NULL || m->access < need) return CUDA_ERROR_INVALID_VALUE;
        cur = m->start + m->size;
    } while (cur < addr + n);
    return CUDA_SUCCESS;
}

FK_HIDDEN int fk__vmm_dmabuf(fk_region_t *r, uint64_t addr, size_t size, int *fd_out) {
    fk_vmm_map_t *m = fk_map_at(r, addr);
    if (m == NULL || m->start != addr || m->offset != 0 || size > m->size)
        return CUDA_ERROR_INVALID_VALUE;
    int fd = fcntl(m->handle->memfd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    *fd_out = fd;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemExportToShareableHandle(void *shareableHandle,
                                              CUmemGenericAllocationHandle handle,
                                              CUmemAllocationHandleType handleType,
                                              unsigned long long flags) {
    FK_ENTER(cuMemExportToShareableHandle);
    CUresult res = fk__need_init();
    if (res != CUDA_SUCCESS) return res;
    if (shareableHandle == NULL || flags != 0 ||
        handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_g.mu);
    fk_vmm_handle_t *v = fk_handle_find(handle);
    int fd = -1;
    if (v == NULL || (v->handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) {
        res = CUDA_ERROR_INVALID_VALUE; /* not created exportable as a POSIX fd */
    } else {
        fd = fcntl(v->memfd, F_DUPFD_CLOEXEC, 0);
        if (fd < 0) res = CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_unlock(&fk_g.mu);
    if (res != CUDA_SUCCESS) return res;
    atomic_fetch_add(&fk_g.c_vmm_exported_fds, 1);
    *(int *)shareableHandle = fd;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
                                                void *osHandle,
                                                CUmemAllocationHandleType shHandleType) {
    FK_ENTER(cuMemImportFromShareableHandle);
    CUresult res = fk__need_ctx(NULL);
    if (res != CUDA_SUCCESS) return res;
    if (handle == NULL || shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_INVALID_VALUE;
    int in = (int)(intptr_t)osHandle;
    char link[64], got[256];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", in);
    ssize_t n = in >= 0 ? readlink(link, got, sizeof(got) - 1) : -1;
    if (n <= 0) return CUDA_ERROR_INVALID_VALUE;
    got[n] = '\0';
    int pid = 0, dev = 0;
    unsigned long long id = 0;
    struct stat st;
    if (sscanf(got, "/memfd:fake_cuda:%d:%llu:%d", &pid, &id, &dev) != 3 || dev < 0 ||
        dev >= FAKE_CUDA_MAX_DEVICES || fstat(in, &st) != 0 || st.st_size <= 0 ||
        (size_t)st.st_size % FK_GRANULARITY != 0)
        return CUDA_ERROR_INVALID_VALUE; /* not memory this driver exported */
    fk_vmm_handle_t *v = calloc(1, sizeof(*v));
    int fd = v != NULL ? fcntl(in, F_DUPFD_CLOEXEC, 0) : -1;
    if (fd < 0) {
        free(v);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    v->memfd = fd;
    v->size = (size_t)st.st_size;
    v->dev = dev;
    v->imported = 1;
    v->handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    v->refs = 1;
    v->callers = 1;
    pthread_mutex_lock(&fk_g.mu);
    v->next = fk_handles;
    fk_handles = v;
    pthread_mutex_unlock(&fk_g.mu);
    atomic_fetch_add(&fk_g.c_vmm_handles, 1);
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)v;
    return CUDA_SUCCESS;
}

FK_HIDDEN unsigned long long fk__vmm_handle_types(const fk_vmm_map_t *m) {
    return m->handle->handle_types;
}

CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
    FK_ENTER(cuMemRetainAllocationHandle);
    CUresult res = fk__need_init();
    if (res != CUDA_SUCCESS) return res;
    if (handle == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_g.mu);
    fk_region_t *r = fk__region_find((CUdeviceptr)(uintptr_t)addr);
    fk_vmm_map_t *m =
        r != NULL && r->kind == FK_VMM_RESERVE ? fk_map_at(r, (uint64_t)(uintptr_t)addr) : NULL;
    if (m == NULL || m->handle->released) {
        pthread_mutex_unlock(&fk_g.mu);
        return CUDA_ERROR_INVALID_VALUE; /* not a VMM mapping */
    }
    m->handle->refs++;
    m->handle->callers++;
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)m->handle;
    pthread_mutex_unlock(&fk_g.mu);
    return CUDA_SUCCESS;
}

FK_HIDDEN void fk__vmm_shutdown(void) {
    pthread_mutex_lock(&fk_g.mu);
    for (size_t i = 0; i < fk_g.nregions; i++) {
        fk_region_t *r = fk_g.regions[i];
        while (r->kind == FK_VMM_RESERVE && r->maps != NULL) fk_unmap_one(r, r->maps);
    }
    while (fk_handles != NULL) {
        fk_vmm_handle_t *v = fk_handles;
        fk_handles = v->next;
        close(v->memfd);
        free(v);
    }
    pthread_mutex_unlock(&fk_g.mu);
}

/* The fake libcuda's memory: the region registry (a sorted array under fk_g.mu), device
 * allocations (memfd + PROT_NONE device address + shadow mapping), pinned host memory
 * (cuMemHostAlloc, cuMemHostRegister), pointer attributes, synchronous copies and memset,
 * and dmabuf fds for a device range. See fake_internal.h. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tests/cuda/fake/fake_internal.h"

/* ---- the registry (callers hold fk_g.mu) ---- */

static size_t fk_upper(uint64_t addr) {
    /* First index whose start is > addr. */
    size_t lo = 0, hi = fk_g.nregions;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (fk_g.regions[mid]->start <= addr) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static uint64_t fk_span(const fk_region_t *r) {
    return r->kind == FK_HOST_REG || r->kind == FK_HOST_ALLOC ? r->size : r->map_len;
}

FK_HIDDEN fk_region_t *fk__region_find(uint64_t addr) {
    size_t i = fk_upper(addr);
    if (i == 0) return NULL;
    fk_region_t *r = fk_g.regions[i - 1];
    return addr - r->start < fk_span(r) ? r : NULL;
}

FK_HIDDEN fk_region_t *fk__region_find_base(uint64_t addr, fk_kind_t kind) {
    fk_region_t *r = fk__region_find(addr);
    return r != NULL && r->start == addr && r->kind == kind ? r : NULL;
}

/* 0, or CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED on overlap, or OUT_OF_MEMORY. */
FK_HIDDEN int fk__region_insert(fk_region_t *r) {
    size_t i = fk_upper(r->start);
    uint64_t end = r->start + fk_span(r);
    if (i > 0) {
        fk_region_t *p = fk_g.regions[i - 1];
        if (p->start + fk_span(p) > r->start) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    }
    if (i < fk_g.nregions && fk_g.regions[i]->start < end)
        return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    if (fk_g.nregions == fk_g.cap_regions) {
        size_t cap = fk_g.cap_regions ? fk_g.cap_regions * 2 : 64;
        fk_region_t **n = realloc(fk_g.regions, cap * sizeof(*n));
        if (n == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
        fk_g.regions = n;
        fk_g.cap_regions = cap;
    }
    memmove(&fk_g.regions[i + 1], &fk_g.regions[i], (fk_g.nregions - i) * sizeof(*fk_g.regions));
    fk_g.regions[i] = r;
    fk_g.nregions++;
    return 0;
}

FK_HIDDEN void fk__region_remove(fk_region_t *r) {
    size_t i = fk_upper(r->start);
    if (i == 0 || fk_g.regions[i - 1] != r) return;
    i--;
    memmove(&fk_g.regions[i], &fk_g.regions[i + 1],
            (fk_g.nregions - i - 1) * sizeof(*fk_g.regions));
    fk_g.nregions--;
}

FK_HIDDEN uint64_t fk__new_buffer_id(void) { return ++fk_g.next_buffer_id; }

FK_HIDDEN void *fk__reserve(size_t len, size_t align, void **base_out, size_t *base_len_out) {
    size_t total = len + align;
    void *base = mmap(NULL, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) return NULL;
    uintptr_t p = ((uintptr_t)base + align - 1) & ~(uintptr_t)(align - 1);
    *base_out = base;
    *base_len_out = total;
    return (void *)p;
}

FK_HIDDEN void fk__region_free(fk_region_t *r) {
    switch (r->kind) {
        case FK_DEVICE_ALLOC:
        case FK_IPC_IMPORT:
            if (r->shadow != NULL) munmap(r->shadow, r->map_len);
            if (r->va_base != NULL) munmap(r->va_base, r->va_len);
            if (r->memfd >= 0) close(r->memfd);
            break;
        case FK_HOST_ALLOC: munmap((void *)(uintptr_t)r->start, r->map_len); break;
        case FK_HOST_REG: break;
        case FK_VMM_RESERVE:
            /* Mappings were released by fk__vmm_shutdown or cuMemUnmap. */
            if (r->shadow != NULL) munmap(r->shadow, r->map_len);
            if (r->va_base != NULL) munmap(r->va_base, r->va_len);
            break;
    }
    free(r);
}

FK_HIDDEN void fk__unpin(fk_region_t *r) {
    if (r == NULL) return;
    pthread_mutex_lock(&fk_g.mu);
    if (--r->busy == 0) pthread_cond_broadcast(&fk_g.cv);
    pthread_mutex_unlock(&fk_g.mu);
}

/* Waits (holding fk_g.mu) until no stream operation uses r: freeing memory that queued
 * work still touches waits for that work, like cuMemFree's implicit synchronisation. */
static void fk_wait_idle(fk_region_t *r) {
    while (r->busy > 0) pthread_cond_wait(&fk_g.cv, &fk_g.mu);
}

static int fk_is_device_kind(fk_kind_t k) {
    return k == FK_DEVICE_ALLOC || k == FK_IPC_IMPORT || k == FK_VMM_RESERVE;
}

FK_HIDDEN CUresult fk__resolve_device(uint64_t addr, size_t n, int write, char **host_out,
                                      fk_region_t **pin_out) {
    pthread_mutex_lock(&fk_g.mu);
    fk_region_t *r = fk__region_find(addr);
    CUresult res = CUDA_SUCCESS;
    if (r == NULL || addr + n < addr) {
        res = CUDA_ERROR_INVALID_VALUE;
    } else if (r->kind == FK_VMM_RESERVE) {
        res = fk__vmm_resolve(r, addr, n, write);
    } else if (addr + n - r->start > r->size) { /* the bytes asked for, not the padding */
        res = CUDA_ERROR_INVALID_VALUE;
    }
    if (res == CUDA_SUCCESS) {
        *host_out = r->shadow + (addr - r->start);
        if (pin_out != NULL) {
            r->busy++;
            *pin_out = r;
        }
    }
    pthread_mutex_unlock(&fk_g.mu);
    return res;
}

FK_HIDDEN int fk__classify_host(const void *p, size_t n, fk_region_t **pin_out) {
    uint64_t a = (uint64_t)(uintptr_t)p;
    pthread_mutex_lock(&fk_g.mu);
    fk_region_t *r = fk__region_find(a);
    int res = 0;
    if (r != NULL && fk_is_device_kind(r->kind)) {
        res = -CUDA_ERROR_INVALID_VALUE;
    } else if (r != NULL) {
        /* Pinned only if the whole range is inside the registration. */
        if (a + n - r->start <= r->size) {
            res = 1;
            if (pin_out != NULL) {
                r->busy++;
                *pin_out = r;
            }
        }
    }
    pthread_mutex_unlock(&fk_g.mu);
    return res;
}

/* ---- device allocations ---- */

static size_t fk_round(size_t n, size_t to) { return (n + to - 1) / to * to; }

CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    FK_ENTER(cuMemAlloc);
    struct CUctx_st *ctx = NULL;
    CUresult res = fk__need_ctx(&ctx);
    if (res != CUDA_SUCCESS) return res;
    if (dptr == NULL || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    size_t align = bytesize >= FK_GRANULARITY ? FK_GRANULARITY : FK_PAGE;
    size_t map_len = fk_round(bytesize, bytesize >= FK_GRANULARITY ? FK_GRANULARITY : FK_PAGE);
    if (map_len < bytesize) return CUDA_ERROR_OUT_OF_MEMORY;

    pthread_mutex_lock(&fk_g.mu);
    fk_device_t *dev = &fk_g.devs[ctx->dev];
    if (dev->used + bytesize > fk_g.capacity || dev->used + bytesize < dev->used) {
        pthread_mutex_unlock(&fk_g.mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    dev->used += bytesize; /* charged now so that concurrent allocations see it */
    uint64_t id = fk__new_buffer_id();
    pthread_mutex_unlock(&fk_g.mu);

    res = CUDA_ERROR_OUT_OF_MEMORY;
    fk_region_t *r = calloc(1, sizeof(*r));
    if (r == NULL) goto err_uncharge;
    r->memfd = -1;
    char name[64];
    snprintf(name, sizeof(name), "fake_cuda:%d:%llu:%d", (int)getpid(), (unsigned long long)id,
             ctx->dev);
    r->memfd = memfd_create(name, MFD_CLOEXEC);
    if (r->memfd < 0 || ftruncate(r->memfd, (off_t)map_len) != 0) goto err_free;
    void *va = fk__reserve(map_len, align, &r->va_base, &r->va_len);
    if (va == NULL) goto err_free;
    r->shadow = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, r->memfd, 0);
    if (r->shadow == MAP_FAILED) {
        r->shadow = NULL;
        goto err_free;
    }
    r->start = (uint64_t)(uintptr_t)va;
    r->size = bytesize;
    r->map_len = map_len;
    r->kind = FK_DEVICE_ALLOC;
    r->dev = ctx->dev;
    r->ctx = ctx;
    r->buffer_id = id;
    pthread_mutex_lock(&fk_g.mu);
    int ins = fk__region_insert(r);
    pthread_mutex_unlock(&fk_g.mu);
    if (ins != 0) goto err_free;
    atomic_fetch_add(&fk_g.c_device_allocs, 1);
    atomic_fetch_add(&fk_g.c_device_bytes, bytesize);
    *dptr = r->start;
    return CUDA_SUCCESS;

err_free:
    fk__region_free(r);
err_uncharge:
    pthread_mutex_lock(&fk_g.mu);
    fk_g.devs[ctx->dev].used -= bytesize;
    pthread_mutex_unlock(&fk_g.mu);
    return res;
}

CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) {
    FK_ENTER(cuMemFree);
    CUresult res = fk__need_ctx(NULL);
    if (res != CUDA_SUCCESS) return res;
    pthread_mutex_lock(&fk_g.mu);
    fk_region_t *r = fk__region_find_base(dptr, FK_DEVICE_ALLOC);
    if (r == NULL) {
        pthread_mutex_unlock(&fk_g.mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    fk__region_remove(r); /* first, so that no other caller finds it while we wait */
    fk_wait_idle(r);
    fk_g.devs[r->dev].used -= r->size;
    pthread_mutex_unlock(&fk_g.mu);
    atomic_fetch_sub(&fk_g.c_device_allocs, 1);
    atomic_fetch_sub(&fk_g.c_device_bytes, r->size);
    if (r->ipc_exported) atomic_fetch_sub(&fk_g.c_ipc_exported_allocs, 1);
    fk__region_free(r);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr) {
    FK_ENTER(cuMemGetAddressRange);
    CUresult res = fk__need_init();
    if (res != CUDA_SUCCESS) return res;
    pthread_mutex_lock(&fk_g.mu);
    fk_region_t *r = fk__region_find(dptr);
    uint64_t base = 0;
    size_t size = 0;
    if (r == NULL ||
        (r->kind != FK_DEVICE_ALLOC && r->kind != FK_IPC_IMPORT && r->kind != FK_VMM_RESERVE)) {
        res = CUDA_ERROR_NOT_FOUND;
    } else if (r->kind == FK_VMM_RESERVE) {
        res = CUDA_ERROR_NOT_FOUND;
        for (fk_vmm_map_t *m = r->maps; m != NULL; m = m->next) {
            if (dptr - m->start < m->size) {
                base = m->start;
                size = m->size;
                res = CUDA_SUCCESS;
            }
        }
    } else if (dptr - r->start >= r->size) {
        res = CUDA_ERROR_NOT_FOUND;
    } else {
        base = r->start;
        size = r->size;
    }
    pthread_mutex_unlock(&fk_g.mu);
    if (res != CUDA_SUCCESS) return res;
    if (pbase != NULL) *pbase = base;
    if (psize != NULL) *psize = size;
    return CUDA_SUCCESS;
}

/* ---- pinned host memory ---- */

CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags) {
    FK_ENTER(cuMemHostAlloc);
    struct CUctx_st *ctx = NULL;
    CUresult res = fk__need_ctx(&ctx);
    if (res != CUDA_SUCCESS) return res;
    if (pp == NULL || bytesize == 0 ||
        (Flags & ~(unsigned)(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
                             CU_MEMHOSTALLOC_WRITECOMBINED)) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    size_t map_len = fk_round(bytesize, FK_PAGE);
    fk_region_t *r = calloc(1, sizeof(*r));
    if (r == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    void *p = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        free(r);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    r->start = (uint64_t)(uintptr_t)p;
    r->size = bytesize;
    r->map_len = map_len;
    r->kind = FK_HOST_ALLOC;
    r->shadow = p;
    r->dev = ctx->dev;
    r->ctx = ctx;
    r->memfd = -1;
    pthread_mutex_lock(&fk_g.mu);
    r->buffer_id = fk__new_buffer_id();
    int ins = fk__region_insert(r);
    pthread_mutex_unlock(&fk_g.mu);
    if (ins != 0) {
        fk__region_free(r);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    atomic_fetch_add(&fk_g.c_host_allocs, 1);
    atomic_fetch_add(&fk_g.c_host_bytes, bytesize);
    *pp = p;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemFreeHost(void *p) {
    FK_ENTER(cuMemFreeHost);
    CUresult res = fk__need_ctx(NULL);
    if (res != CUDA_SUCCESS) return res;
    pthread_mutex_lock(&fk_g.mu);
    fk_region_t *r = fk__region_find_base((uint64_t)(uintptr_t)p, FK_HOST_ALLOC);
    if (r == NULL) {
        pthread_mutex_unlock(&fk_g.mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    fk__region_remove(r);
    fk_wait_idle(r);
    pthread_mutex_unlock(&fk_g.mu);
    atomic_fetch_sub(&fk_g.c_host_allocs, 1);
    atomic_fetch_sub(&fk_g.c_host_bytes, r->size);
    fk__region_free(r);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags) {
    FK_ENTER(cuMemHostRegister);
    struct CUctx_st *ctx = NULL;
    CUresult res = fk__need_ctx(&ctx);
    if (res != CUDA_SUCCESS) return res;
    if (p == NULL || bytesize == 0 ||
        (Flags & ~(unsigned)(CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                             CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY)) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    fk_region_t *r = calloc(1, sizeof(*r));
    if (r == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    r->start = (uint64_t)(uintptr_t)p;
    r->size = bytesize;
    r->map_len = bytesize;
    r->kind = FK_HOST_REG;
    r->shadow = p;
    r->dev = ctx->dev;
    r->ctx = ctx;
    r->memfd = -1;
    pthread_mutex_lock(&fk_g.mu);
    r->buffer_id = fk__new_buffer_id();
    int ins = fk__region_insert(r);
    pthread_mutex_unlock(&fk_g.mu);
    if (ins != 0) {
        free(r);
        return (CUresult)ins;
    }
    atomic_fetch_add(&fk_g.c_host_regs, 1);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemHostUnregister(void *p) {
    FK_ENTER(cuMemHostUnregister);
    CUresult res = fk__need_ctx(NULL);
    if (res != CUDA_SUCCESS) return res;
    pthread_mutex_lock(&fk_g.mu);
    fk_region_t *r = fk__region_find_base((uint64_t)(uintptr_t)p, FK_HOST_REG);
    if (r == NULL) {
        pthread_mutex_unlock(&fk_g.mu);
        return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    }
    fk__region_remove(r);
    fk_wait_idle(r);
    pthread_mutex_unlock(&fk_g.mu);
    atomic_fetch_sub(&fk_g.c_host_regs, 1);
    free(r);
    return CUDA_SUCCESS;
}

/* ---- pointer attributes ---- */

static size_t fk_attr_size(CUpointer_attribute a) {
    switch (a) {
        case CU_POINTER_ATTRIBUTE_CONTEXT: return sizeof(CUcontext);
        case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: return sizeof(unsigned int);
        case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: return sizeof(CUdeviceptr);
        case CU_POINTER_ATTRIBUTE_HOST_POINTER: return sizeof(void *);
        case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: return sizeof(unsigned int);
        case CU_POINTER_ATTRIBUTE_BUFFER_ID: return sizeof(unsigned long long);
        case CU_POINTER_ATTRIBUTE_IS_MANAGED: return sizeof(unsigned int);
        case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: return sizeof(int);
        case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: return sizeof(int);
        case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: return sizeof(CUdeviceptr);
        case CU_POINTER_ATTRIBUTE_RANGE_SIZE: return sizeof(size_t);
        case CU_POINTER_ATTRIBUTE_MAPPED: return sizeof(int);
        case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES: return sizeof(unsigned long long);
        case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE: return sizeof(int);
        case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS: return sizeof(unsigned int);
        default: return 0;
    }
}

/* Answers one attribute for addr, found in region r (fk_g.mu held). */
static CUresult fk_attr(fk_region_t *r, uint64_t addr, CUpointer_attribute a, void *data) {
    int host = r->kind == FK_HOST_ALLOC || r->kind == FK_HOST_REG;
    uint64_t rs = r->start, rsize = r->size, id = r->buffer_id;
    unsigned long long handle_types = 0;
    if (r->kind == FK_VMM_RESERVE) {
        fk_vmm_map_t *m = r->maps;
        while (m != NULL && !(addr - m->start < m->size)) m = m->next;
        if (m == NULL) return CUDA_ERROR_INVALID_VALUE;
        rs = m->start;
        rsize = m->size;
        id = m->buffer_id;
        handle_types = fk__vmm_handle_types(m);
    } else if (!host && addr - r->start >= r->size) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    switch (a) {
        case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = r->ctx; break;
        case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
            *(unsigned int *)data = host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
            break;
        case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr *)data = addr; break;
        case CU_POINTER_ATTRIBUTE_HOST_POINTER:
            if (!host) return CUDA_ERROR_INVALID_VALUE;
            *(void **)data = (void *)(uintptr_t)addr;
            break;
        case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: *(unsigned int *)data = r->sync_memops; break;
        case CU_POINTER_ATTRIBUTE_BUFFER_ID: *(unsigned long long *)data = id; break;
        case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(unsigned int *)data = 0; break;
        case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = r->dev; break;
        case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
            *(int *)data = r->kind == FK_DEVICE_ALLOC;
            break;
        case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = rs; break;
        case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = rsize; break;
        case CU_POINTER_ATTRIBUTE_MAPPED: *(int *)data = 1; break;
        case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
            *(unsigned long long *)data = handle_types;
            break;
        case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE: *(int *)data = !host; break;
        case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
            *(unsigned int *)data = CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE;
            break;
        default: return CUDA_ERROR_NOT_SUPPORTED;
    }
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr) {
    FK_ENTER(cuPointerGetAttribute);
    CUresult res = fk__need_init();
    if (res != CUDA_SUCCESS) return res;
    if (data == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (fk_attr_size(attribute) == 0) return CUDA_ERROR_INVALID_VALUE;
    unsigned char tmp[16];
    pthread_mutex_lock(&fk_g.mu);
    fk_region_t *r = fk__region_find(ptr);
    res = r == NULL ? CUDA_ERROR_INVALID_VALUE : fk_attr(r, ptr, attribute, tmp);
    pthread_mutex_unlock(&fk_g.mu);
    if (res == CUDA_SUCCESS) memcpy(data, tmp, fk_attr_size(attribute));
    return res;
}

CUresult CUDAAPI cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes,
                                        void **data, CUdeviceptr ptr) {
    FK_ENTER(cuPointerGetAttributes);
    CUresult res = fk__need_init();
    if (res != CUDA_SUCCESS) return res;
    if (numAttributes == 0 || attributes == NULL || data == NULL) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < numAttributes; i++)
        if (fk_attr_size(attributes[i]) == 0 || data[i] == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_g.mu);
    fk_region_t *r = fk__region_find(ptr);
    for (unsigned i = 0; i < numAttributes; i++) {
        unsigned char tmp[16];
        memset(tmp, 0, sizeof(tmp));
        /* An attribute the pointer does not have reads as zero. For a pointer the driver
         * does not know, a real driver (H200, driver 580: scripts/cuda_facts.c) writes zeros
         * except DEVICE_ORDINAL, which reads -2, and leaves RANGE_START_ADDR and RANGE_SIZE
         * unwritten; the fake does the same so callers cannot rely on a zeroed range. */
        if (r == NULL) {
            if (attributes[i] == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR ||
                attributes[i] == CU_POINTER_ATTRIBUTE_RANGE_SIZE)
                continue;
            if (attributes[i] == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) *(int *)tmp = -2;
        } else if (fk_attr(r, ptr, attributes[i], tmp) != CUDA_SUCCESS) {
            memset(tmp, 0, sizeof(tmp));
        }
        memcpy(data[i], tmp, fk_attr_size(attributes[i]));
    }
    pthread_mutex_unlock(&fk_g.mu);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuPointerSetAttribute(const void *value, CUpointer_attribute attribute,
                                       CUdeviceptr ptr) {
    FK_ENTER(cuPointerSetAttribute);
    CUresult res = fk__need_init();
    if (res != CUDA_SUCCESS) return res;
    if (value == NULL || attribute != CU_POINTER_ATTRIBUTE_SYNC_MEMOPS)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_g.mu);
    fk_region_t *r = fk__region_find(ptr);
    if (r == NULL) {
        res = CUDA_ERROR_INVALID_VALUE;
    } else {
        /* Accepted on pinned and registered host memory too, as an H200 does. */
        r->sync_memops = *(const unsigned int *)value != 0;
    }
    pthread_mutex_unlock(&fk_g.mu);
    return res;
}

/* ---- synchronous copies and memset: on the legacy stream, host-synchronous as CUDA
 * documents (see fk__copy in stream.c) ---- */

CUresult CUDAAPI cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount) {
    FK_ENTER(cuMemcpyHtoD);
    if (srcHost == NULL && ByteCount != 0) return CUDA_ERROR_INVALID_VALUE;
    return fk__copy(dstDevice, NULL, 0, srcHost != NULL ? srcHost : "", ByteCount, NULL, 1);
}

CUresult CUDAAPI cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
    FK_ENTER(cuMemcpyDtoH);
    if (dstHost == NULL && ByteCount != 0) return CUDA_ERROR_INVALID_VALUE;
    char dummy;
    return fk__copy(0, dstHost != NULL ? dstHost : &dummy, srcDevice, NULL, ByteCount, NULL, 1);
}

CUresult CUDAAPI cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) {
    FK_ENTER(cuMemcpyDtoD);
    return fk__copy(dstDevice, NULL, srcDevice, NULL, ByteCount, NULL, 1);
}

CUresult CUDAAPI cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
    FK_ENTER(cuMemsetD8);
    return fk__memset(dstDevice, uc, N);
}

/* ---- dmabuf ---- */

CUresult CUDAAPI cuMemGetHandleForAddressRange(void *handle, CUdeviceptr dptr, size_t size,
                                               CUmemRangeHandleType handleType,
                                               unsigned long long flags) {
    FK_ENTER(cuMemGetHandleForAddressRange);
    CUresult res = fk__need_init();
    if (res != CUDA_SUCCESS) return res;
    if (handle == NULL || handleType != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD || flags > 1 ||
        size == 0 || dptr % FK_PAGE != 0 || size % FK_PAGE != 0)
        return CUDA_ERROR_INVALID_VALUE;
    int fd = -1;
    pthread_mutex_lock(&fk_g.mu);
    fk_region_t *r = fk__region_find(dptr);
    if (r != NULL && r->kind == FK_DEVICE_ALLOC && r->start == dptr && size <= r->map_len) {
        fd = fcntl(r->memfd, F_DUPFD_CLOEXEC, 0);
        res = fd < 0 ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
    } else if (r != NULL && r->kind == FK_VMM_RESERVE) {
        res = (CUresult)fk__vmm_dmabuf(r, dptr, size, &fd);
    } else {
        res = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&fk_g.mu);
    if (res != CUDA_SUCCESS) return res;
    atomic_fetch_add(&fk_g.c_dmabuf_fds, 1);
    *(int *)handle = fd;
    return CUDA_SUCCESS;
}

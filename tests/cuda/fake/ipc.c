/* The fake libcuda's legacy IPC. A handle names the exporter's memfd (pid and fd number)
 * and the allocation (buffer id, sizes); the importer reaches the memfd with
 * pidfd_open + pidfd_getfd, or /proc/PID/fd/N when that is refused, checks by the memfd's
 * name that it is still the same allocation, and maps it at a PROT_NONE device address of
 * its own with a shadow mapping, like cuMemAlloc. Opening a handle in the exporting
 * process fails with CUDA_ERROR_INVALID_CONTEXT; the same allocation opened twice shares
 * one mapping, refcounted. FAKE_CUDA_IPC_PROC_ONLY=1 skips pidfd_getfd (tests the
 * fallback). See fake_internal.h. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "tests/cuda/fake/fake_internal.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

#define FK_IPC_MAGIC 0x4b464346u /* "FCFK" */
#define FK_IPC_VERSION 1u

/* The 64-byte handle. */
typedef struct fk_ipc_wire {
    uint32_t magic;
    uint32_t version;
    int32_t pid;   /* exporter */
    int32_t fd;    /* the memfd's number in the exporter */
    uint64_t size; /* allocation size */
    uint64_t map_len;
    uint64_t buffer_id; /* in the exporter */
    int32_t dev;
    uint8_t pad[20];
} fk_ipc_wire_t;

_Static_assert(sizeof(fk_ipc_wire_t) == CU_IPC_HANDLE_SIZE, "IPC handle is 64 bytes");

CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr) {
    FK_ENTER(cuIpcGetMemHandle);
    CUresult res = fk__need_ctx(NULL);
    if (res != CUDA_SUCCESS) return res;
    if (pHandle == NULL) return CUDA_ERROR_INVALID_VALUE;
    fk_ipc_wire_t w;
    memset(&w, 0, sizeof(w));
    pthread_mutex_lock(&fk_g.mu);
    fk_region_t *r = fk__region_find(dptr);
    if (r == NULL || r->kind != FK_DEVICE_ALLOC || dptr - r->start >= r->size) {
        pthread_mutex_unlock(&fk_g.mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    w.magic = FK_IPC_MAGIC;
    w.version = FK_IPC_VERSION;
    w.pid = (int32_t)getpid();
    w.fd = r->memfd;
    w.size = r->size;
    w.map_len = r->map_len;
    w.buffer_id = r->buffer_id;
    w.dev = r->dev;
    int first = !r->ipc_exported;
    r->ipc_exported = 1;
    pthread_mutex_unlock(&fk_g.mu);
    if (first) atomic_fetch_add(&fk_g.c_ipc_exported_allocs, 1);
    atomic_fetch_add(&fk_g.c_ipc_exports, 1);
    memcpy(pHandle->reserved, &w, sizeof(w));
    return CUDA_SUCCESS;
}

/* A duplicate of fd number `fd` of process `pid`, or -1. */
static int fk_fetch_fd(pid_t pid, int fd) {
    const char *proc_only = getenv("FAKE_CUDA_IPC_PROC_ONLY");
    if (proc_only == NULL || strcmp(proc_only, "1") != 0) {
        int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
        if (pidfd >= 0) {
            int got = (int)syscall(SYS_pidfd_getfd, pidfd, fd, 0);
            close(pidfd);
            if (got >= 0) return got;                        /* pidfd_getfd sets O_CLOEXEC */
            if (errno == ESRCH || errno == EBADF) return -1; /* gone: no fallback */
        } else if (errno == ESRCH) {
            return -1;
        }
    }
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)pid, fd);
    return open(path, O_RDWR | O_CLOEXEC);
}

/* 1 if fd is the memfd the handle names (same exporter, same buffer, big enough). */
static int fk_fd_matches(int fd, const fk_ipc_wire_t *w) {
    char link[64], want[128], got[256];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, got, sizeof(got) - 1);
    if (n <= 0) return 0;
    got[n] = '\0';
    snprintf(want, sizeof(want), "/memfd:fake_cuda:%d:%llu:%d (deleted)", (int)w->pid,
             (unsigned long long)w->buffer_id, (int)w->dev);
    if (strcmp(got, want) != 0) return 0;
    struct stat st;
    return fstat(fd, &st) == 0 && (uint64_t)st.st_size >= w->map_len;
}

CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                       unsigned int Flags) {
    FK_ENTER(cuIpcOpenMemHandle);
    struct CUctx_st *ctx = NULL;
    CUresult res = fk__need_ctx(&ctx);
    if (res != CUDA_SUCCESS) return res;
    if (pdptr == NULL || (Flags & ~(unsigned)CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    fk_ipc_wire_t w;
    memcpy(&w, handle.reserved, sizeof(w));
    if (w.magic != FK_IPC_MAGIC || w.version != FK_IPC_VERSION || w.pid <= 0 || w.fd < 0 ||
        w.size == 0 || w.map_len < w.size)
        return CUDA_ERROR_INVALID_VALUE;
    if (w.pid == (int32_t)getpid()) return CUDA_ERROR_INVALID_CONTEXT;

    /* Already open here: one mapping, one more reference. */
    pthread_mutex_lock(&fk_g.mu);
    for (size_t i = 0; i < fk_g.nregions; i++) {
        fk_region_t *r = fk_g.regions[i];
        if (r->kind == FK_IPC_IMPORT && r->imp_pid == w.pid && r->imp_buffer_id == w.buffer_id) {
            r->imp_refs++;
            *pdptr = r->start;
            pthread_mutex_unlock(&fk_g.mu);
            atomic_fetch_add(&fk_g.c_ipc_import_refs, 1);
            return CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&fk_g.mu);

    int fd = fk_fetch_fd((pid_t)w.pid, w.fd);
    if (fd < 0) return CUDA_ERROR_INVALID_HANDLE; /* exporter gone, or not reachable */
    if (!fk_fd_matches(fd, &w)) {
        close(fd); /* the allocation was freed (its fd number may name something else now) */
        return CUDA_ERROR_INVALID_HANDLE;
    }
    res = CUDA_ERROR_MAP_FAILED;
    fk_region_t *r = calloc(1, sizeof(*r));
    if (r == NULL) goto err_close;
    r->memfd = -1;
    size_t align = w.map_len >= FK_GRANULARITY ? FK_GRANULARITY : FK_PAGE;
    void *va = fk__reserve(w.map_len, align, &r->va_base, &r->va_len);
    if (va == NULL) goto err_free;
    r->shadow = mmap(NULL, w.map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (r->shadow == MAP_FAILED) {
        r->shadow = NULL;
        goto err_free;
    }
    close(fd); /* the mapping keeps the memory */
    fd = -1;
    r->start = (uint64_t)(uintptr_t)va;
    r->size = w.size;
    r->map_len = w.map_len;
    r->kind = FK_IPC_IMPORT;
    r->dev = ctx->dev;
    r->ctx = ctx;
    r->imp_pid = w.pid;
    r->imp_buffer_id = w.buffer_id;
    r->imp_refs = 1;
    pthread_mutex_lock(&fk_g.mu);
    r->buffer_id = fk__new_buffer_id();
    int ins = fk__region_insert(r);
    pthread_mutex_unlock(&fk_g.mu);
    if (ins != 0) goto err_free;
    atomic_fetch_add(&fk_g.c_ipc_imports, 1);
    atomic_fetch_add(&fk_g.c_ipc_import_refs, 1);
    *pdptr = r->start;
    return CUDA_SUCCESS;

err_free:
    fk__region_free(r);
err_close:
    if (fd >= 0) close(fd);
    return res;
}

CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr) {
    FK_ENTER(cuIpcCloseMemHandle);
    CUresult res = fk__need_ctx(NULL);
    if (res != CUDA_SUCCESS) return res;
    pthread_mutex_lock(&fk_g.mu);
    fk_region_t *r = fk__region_find_base(dptr, FK_IPC_IMPORT);
    if (r == NULL) {
        pthread_mutex_unlock(&fk_g.mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    int last = --r->imp_refs == 0;
    if (last) {
        fk__region_remove(r);
        while (r->busy > 0) pthread_cond_wait(&fk_g.cv, &fk_g.mu);
    }
    pthread_mutex_unlock(&fk_g.mu);
    atomic_fetch_sub(&fk_g.c_ipc_import_refs, 1);
    if (last) {
        atomic_fetch_sub(&fk_g.c_ipc_imports, 1);
        fk__region_free(r);
    }
    return CUDA_SUCCESS;
}

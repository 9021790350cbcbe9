/*
 * tests/cuda/fake_cufile.c - a fake libcufile (GPUDirect Storage) for CPU-only tests,
 * built as tests/cuda:libfake_cufile.so and loaded through $OTE_CUFILE_LIBRARY.
 *
 * It exports the cuFile entry points OrbitTE uses with the ABI of NVIDIA's cufile.h
 * (CUfileError_t by value, CUfileDescr_t, ssize_t cuFileRead/Write; no cufile.h is
 * installed here, so the types are declared below) and moves bytes the way GDS does as
 * far as the caller can tell: synchronously, between a file descriptor and device
 * memory. The device memory is the fake libcuda's (tests/cuda/fake): the fake cuFile
 * finds the driver already loaded in the process ($OTE_CUDA_LIBRARY, RTLD_NOLOAD) and
 * moves bytes through its cuMemcpyHtoD/DtoH into the driver's own store (then
 * cuCtxSynchronize), in the allocation's context when the thread has none current.
 * Without a loaded driver cuFileDriverOpen fails (CU_FILE_DRIVER_NOT_INITIALIZED).
 *
 * Buffer registrations behave as the library documents them: a range that meets a
 * registered one is refused, and a transfer through a registered buffer passes its base
 * and an offset (one that runs past it fails); a buffer base that is not registered is
 * moved through the library's own bounce buffers (counted: bounce_io).
 *
 * Control API (fake_cufile_control.h): live counters of driver opens, file handles and
 * buffer registrations, registrations ever made, bounce-buffer transfers, and fault
 * hooks.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "tests/cuda/fake_cufile_control.h"

#define EXPORT __attribute__((visibility("default")))

typedef struct {
    int err;
    CUresult cu_err;
} CUfileError_t;
typedef struct {
    int type;
    union {
        int fd;
        void *handle;
    } handle;
    const void *fs_ops;
} CUfileDescr_t;
typedef void *CUfileHandle_t;

#define CU_FILE_SUCCESS 0
#define CU_FILE_DRIVER_NOT_INITIALIZED 5001
#define CU_FILE_INVALID_VALUE 5022 /* any non-zero op error serves the fake */
#define FAKE_MAX_BUFS 256
#define FAKE_BOUNCE (1u << 20)
#define FAKE_ALIGN 4096u

/* A registered file: the caller's descriptor, and a buffered one of the same file for the
 * transfers that O_DIRECT cannot take (unaligned offset or length): libcufile moves
 * those through its own bounce buffers too, whatever the descriptor's mode. */
typedef struct {
    int fd;
    int bfd; /* the same file without O_DIRECT, or -1 when fd is buffered already */
} fake_handle_t;

static struct {
    pthread_mutex_t mu;
    long opens, handles, reads, writes, registers, bounce_io;
    const void *bufs[FAKE_MAX_BUFS];
    size_t lens[FAKE_MAX_BUFS];
    int nbufs;
    char fault_call[64];
    int fault_err, fault_count;
    CUresult (*htod)(CUdeviceptr, const void *, size_t);
    CUresult (*dtoh)(void *, CUdeviceptr, size_t);
    CUresult (*get_ctx)(CUcontext *);
    CUresult (*set_ctx)(CUcontext);
    CUresult (*sync)(void);
    CUresult (*attr)(void *, CUpointer_attribute, CUdeviceptr);
} g = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* The armed error of call, consuming one hit; 0 when none. */
static int fault_take(const char *call) {
    int err = 0;
    pthread_mutex_lock(&g.mu);
    if (g.fault_count > 0 && strcmp(g.fault_call, call) == 0) {
        err = g.fault_err;
        g.fault_count--;
    }
    pthread_mutex_unlock(&g.mu);
    return err;
}

static CUfileError_t ferr(int err) { return (CUfileError_t){err, CUDA_SUCCESS}; }

EXPORT CUfileError_t cuFileDriverOpen(void) {
    int f = fault_take("cuFileDriverOpen");
    if (f != 0) return ferr(f);
    const char *lib = getenv("OTE_CUDA_LIBRARY");
    void *dl = lib != NULL ? dlopen(lib, RTLD_NOW | RTLD_NOLOAD) : NULL;
    if (dl == NULL) return ferr(CU_FILE_DRIVER_NOT_INITIALIZED);
    pthread_mutex_lock(&g.mu);
    *(void **)&g.htod = dlsym(dl, "cuMemcpyHtoD_v2");
    *(void **)&g.dtoh = dlsym(dl, "cuMemcpyDtoH_v2");
    *(void **)&g.get_ctx = dlsym(dl, "cuCtxGetCurrent");
    *(void **)&g.set_ctx = dlsym(dl, "cuCtxSetCurrent");
    *(void **)&g.sync = dlsym(dl, "cuCtxSynchronize");
    *(void **)&g.attr = dlsym(dl, "cuPointerGetAttribute");
    int ok = g.htod && g.dtoh && g.get_ctx && g.set_ctx && g.sync && g.attr;
    if (ok) g.opens++;
    pthread_mutex_unlock(&g.mu);
    dlclose(dl); /* NOLOAD took a reference; the driver stays loaded by its user */
    return ferr(ok ? CU_FILE_SUCCESS : CU_FILE_DRIVER_NOT_INITIALIZED);
}

static CUfileError_t driver_close(void) {
    pthread_mutex_lock(&g.mu);
    int ok = g.opens > 0;
    if (ok) g.opens--;
    pthread_mutex_unlock(&g.mu);
    return ferr(ok ? CU_FILE_SUCCESS : CU_FILE_DRIVER_NOT_INITIALIZED);
}
EXPORT CUfileError_t cuFileDriverClose(void) { return driver_close(); }
EXPORT CUfileError_t cuFileDriverClose_v2(void) { return driver_close(); }

EXPORT CUfileError_t cuFileHandleRegister(CUfileHandle_t *fh, CUfileDescr_t *descr) {
    int f = fault_take("cuFileHandleRegister");
    if (f != 0) return ferr(f);
    if (fh == NULL || descr == NULL || descr->type != 1 || descr->handle.fd < 0)
        return ferr(CU_FILE_INVALID_VALUE);
    fake_handle_t *h = malloc(sizeof(*h));
    if (h == NULL) return ferr(CU_FILE_INVALID_VALUE);
    h->fd = descr->handle.fd;
    h->bfd = -1;
    int fl = fcntl(h->fd, F_GETFL);
    if (fl >= 0 && (fl & O_DIRECT)) {
        char p[64];
        snprintf(p, sizeof(p), "/proc/self/fd/%d", h->fd);
        h->bfd = open(p, (fl & O_ACCMODE) | O_CLOEXEC);
        if (h->bfd < 0) {
            free(h);
            return ferr(CU_FILE_INVALID_VALUE);
        }
    }
    pthread_mutex_lock(&g.mu);
    g.handles++;
    pthread_mutex_unlock(&g.mu);
    *fh = h;
    return ferr(CU_FILE_SUCCESS);
}

EXPORT void cuFileHandleDeregister(CUfileHandle_t fh) {
    if (fh == NULL) return;
    fake_handle_t *h = fh;
    if (h->bfd >= 0) close(h->bfd);
    free(h);
    pthread_mutex_lock(&g.mu);
    g.handles--;
    pthread_mutex_unlock(&g.mu);
}

EXPORT CUfileError_t cuFileBufRegister(const void *buf, size_t length, int flags) {
    (void)flags;
    int f = fault_take("cuFileBufRegister");
    if (f != 0) return ferr(f);
    if (buf == NULL || length == 0) return ferr(CU_FILE_INVALID_VALUE);
    uintptr_t a = (uintptr_t)buf;
    pthread_mutex_lock(&g.mu);
    int ok = g.nbufs < FAKE_MAX_BUFS;
    /* A range that meets a registered one is refused (already registered). */
    for (int i = 0; ok && i < g.nbufs; i++) {
        uintptr_t b = (uintptr_t)g.bufs[i];
        ok = a + length <= b || b + g.lens[i] <= a;
    }
    if (ok) {
        g.bufs[g.nbufs] = buf;
        g.lens[g.nbufs++] = length;
        g.registers++;
    }
    pthread_mutex_unlock(&g.mu);
    return ferr(ok ? CU_FILE_SUCCESS : CU_FILE_INVALID_VALUE);
}

EXPORT CUfileError_t cuFileBufDeregister(const void *buf) {
    int found = 0;
    pthread_mutex_lock(&g.mu);
    for (int i = 0; i < g.nbufs; i++) {
        if (g.bufs[i] != buf) continue;
        g.nbufs--;
        g.bufs[i] = g.bufs[g.nbufs];
        g.lens[i] = g.lens[g.nbufs];
        found = 1;
        break;
    }
    pthread_mutex_unlock(&g.mu);
    return ferr(found ? CU_FILE_SUCCESS : CU_FILE_INVALID_VALUE);
}

/* The allocation's context made current when the thread has none; *prev_set says
 * whether to restore NULL afterwards. */
static int ctx_enter(CUdeviceptr p, int *restore) {
    CUcontext cur = NULL;
    *restore = 0;
    if (g.get_ctx(&cur) == CUDA_SUCCESS && cur != NULL) return 0;
    CUcontext own = NULL;
    if (g.attr(&own, CU_POINTER_ATTRIBUTE_CONTEXT, p) != CUDA_SUCCESS || own == NULL) return -1;
    if (g.set_ctx(own) != CUDA_SUCCESS) return -1;
    *restore = 1;
    return 0;
}

/* How libcufile takes the buffer of a transfer: 1 when base is a registered buffer's base
 * (DMA straight into it), 0 when base is no registered buffer's base (the library moves
 * the bytes through its own bounce buffers: counted in bounce_io), -1 when the transfer
 * runs past the registered buffer it starts in. */
static int buf_check(const void *base, off_t boff, size_t size) {
    int r = 0;
    pthread_mutex_lock(&g.mu);
    for (int i = 0; i < g.nbufs; i++) {
        if (g.bufs[i] != base) continue;
        r = boff >= 0 && (size_t)boff <= g.lens[i] && size <= g.lens[i] - (size_t)boff ? 1 : -1;
        break;
    }
    if (r == 0) g.bounce_io++;
    pthread_mutex_unlock(&g.mu);
    return r;
}

/* One transfer: read (file -> device) or write (device -> file), in FAKE_BOUNCE pieces. */
static ssize_t fake_io(CUfileHandle_t fh, CUdeviceptr dev, size_t size, off_t foff, int write) {
    int f = fault_take(write ? "cuFileWrite" : "cuFileRead");
    if (f > 0) {
        errno = f;
        return -1;
    }
    if (f < 0) return f;
    if (fh == NULL || g.htod == NULL) return -CU_FILE_DRIVER_NOT_INITIALIZED;
    fake_handle_t *h = fh;
    int fd = h->fd, restore = 0;
    if (h->bfd >= 0 && ((uint64_t)foff % FAKE_ALIGN != 0 || size % FAKE_ALIGN != 0)) fd = h->bfd;
    if (ctx_enter(dev, &restore) != 0) return -CU_FILE_INVALID_VALUE;
    void *mem = NULL;
    char *tmp = posix_memalign(&mem, FAKE_ALIGN, FAKE_BOUNCE) == 0 ? mem : NULL;
    ssize_t done = tmp == NULL ? -CU_FILE_INVALID_VALUE : 0;
    while (done >= 0 && (size_t)done < size) {
        size_t n = size - (size_t)done < FAKE_BOUNCE ? size - (size_t)done : FAKE_BOUNCE;
        ssize_t r;
        if (write) {
            if (g.dtoh(tmp, dev + (CUdeviceptr)done, n) != CUDA_SUCCESS) {
                done = -CU_FILE_INVALID_VALUE;
                break;
            }
            r = pwrite(fd, tmp, n, foff + done);
        } else {
            r = pread(fd, tmp, n, foff + done);
            if (r > 0 && (g.htod(dev + (CUdeviceptr)done, tmp, (size_t)r) != CUDA_SUCCESS ||
                          g.sync() != CUDA_SUCCESS))
                r = -2;
        }
        if (r == -2) done = -CU_FILE_INVALID_VALUE;
        else if (r < 0) done = -1; /* errno from pread/pwrite */
        else if (r == 0) break;    /* end of file: a short count */
        else done += r;
    }
    int saved = errno;
    free(tmp);
    if (restore) (void)g.set_ctx(NULL);
    if (done > 0) {
        pthread_mutex_lock(&g.mu);
        if (write) g.writes++;
        else g.reads++;
        pthread_mutex_unlock(&g.mu);
    }
    errno = saved;
    return done;
}

EXPORT ssize_t cuFileRead(CUfileHandle_t fh, void *buf, size_t size, off_t file_offset,
                          off_t buf_offset) {
    if (buf_check(buf, buf_offset, size) < 0) return -CU_FILE_INVALID_VALUE;
    return fake_io(fh, (CUdeviceptr)(uintptr_t)buf + (CUdeviceptr)buf_offset, size, file_offset, 0);
}

EXPORT ssize_t cuFileWrite(CUfileHandle_t fh, const void *buf, size_t size, off_t file_offset,
                           off_t buf_offset) {
    if (buf_check(buf, buf_offset, size) < 0) return -CU_FILE_INVALID_VALUE;
    return fake_io(fh, (CUdeviceptr)(uintptr_t)buf + (CUdeviceptr)buf_offset, size, file_offset, 1);
}

/* ---- control API ---- */

EXPORT int fake_cufile_fail(const char *call, int err, int count) {
    if (call == NULL || strlen(call) >= sizeof(g.fault_call)) return -1;
    pthread_mutex_lock(&g.mu);
    strcpy(g.fault_call, call);
    g.fault_err = err;
    g.fault_count = count;
    pthread_mutex_unlock(&g.mu);
    return 0;
}

EXPORT void fake_cufile_clear_faults(void) {
    pthread_mutex_lock(&g.mu);
    g.fault_count = 0;
    pthread_mutex_unlock(&g.mu);
}

EXPORT void fake_cufile_counters(fake_cufile_counters_t *out) {
    pthread_mutex_lock(&g.mu);
    *out = (fake_cufile_counters_t){g.opens,  g.handles,   g.nbufs,    g.reads,
                                    g.writes, g.registers, g.bounce_io};
    pthread_mutex_unlock(&g.mu);
}

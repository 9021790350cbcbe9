/*
 * tools/bench_mem.c - the buffers of ote_bench: host memory (an anonymous mapping; on
 * transparent huge pages with thp; with shared, the engine's ote_memory_alloc_shared
 * memory, which a same-host shm peer maps), or
 * device memory of CUDA device N (--local-mem / --remote-mem cuda:N) allocated through
 * cuda/memory on the driver $OTE_CUDA_LIBRARY names (else libcuda.so.1). Device memory is
 * not host-addressable: the --check pattern goes in and comes back through synchronous
 * host-to-device / device-to-host copies, in pieces through one host buffer; or a file
 * (file:PATH) registered with ote_file_register, whose pattern goes through pread/pwrite of
 * our own descriptor, in the same pieces.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cuda/driver.h"
#include "cuda/memory/device.h"
#include "cuda/memory/memory.h"
#include "tools/bench_internal.h"

#define MEM_PIECE (16ull << 20) /* bytes per copy of fill and check */

/* Host memory on transparent huge pages: a 2 MiB-aligned anonymous mapping (the slack
 * around it unmapped) with madvise(MADV_HUGEPAGE), then faulted in. Whether the kernel
 * backs it with huge pages depends on /sys/kernel/mm/transparent_hugepage (madvise or
 * always) and on free contiguous memory; AnonHugePages in /proc/meminfo shows it. The
 * shm transport's cross-memory attach pins the peer's pages per call: a 2 MiB page is one
 * pin where 4 KiB pages are 512. */
static uint8_t *map_thp(uint64_t len) {
    const size_t huge = 2u << 20;
    size_t n = (size_t)len, span = n + huge;
    uint8_t *p = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    uint8_t *a = (uint8_t *)(((uintptr_t)p + huge - 1) & ~(uintptr_t)(huge - 1));
    if (a > p) munmap(p, (size_t)(a - p));
    if (a + n < p + span) munmap(a + n, (size_t)(p + span - (a + n)));
    if (madvise(a, n, MADV_HUGEPAGE) != 0)
        fprintf(stderr, "ote_bench: madvise(MADV_HUGEPAGE): %s (4 KiB pages)\n", strerror(errno));
    memset(a, 0, n); /* fault in now, as MAP_POPULATE does for host buffers */
    return a;
}

/* Shared host memory of the engine (ote_memory_alloc_shared: memfd-backed, MAP_SHARED,
 * zeroed, page-rounded), faulted in now as the other host kinds are. Returns 0, or -1
 * after saying why. */
static int alloc_shared(ote_engine_t *engine, uint64_t len, bench_mem_t *m) {
    void *p = NULL;
    ote_status_t st = ote_memory_alloc_shared(engine, (size_t)len, &p);
    if (st != OTE_OK) {
        char what[96];
        snprintf(what, sizeof what, "ote_memory_alloc_shared (a %" PRIu64 "-byte buffer)", len);
        bench__print_status(what, st);
        return -1;
    }
    memset(p, 0, (size_t)len); /* fault in now, as MAP_POPULATE does for host buffers */
    m->engine = engine;
    m->host = p;
    m->addr = (uint64_t)(uintptr_t)p;
    return 0;
}

/* The file at path, created or grown to len bytes (a block device must hold them),
 * registered with engine for READ and WRITE. Returns 0, or -1 after saying why. */
static int open_file(ote_engine_t *engine, const char *path, uint64_t len, bench_mem_t *m) {
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        fprintf(stderr, "ote_bench: %s: %s\n", path, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    if (S_ISREG(sb.st_mode) && (uint64_t)sb.st_size < len && ftruncate(fd, (off_t)len) != 0) {
        fprintf(stderr, "ote_bench: growing %s to %" PRIu64 " bytes: %s\n", path, len,
                strerror(errno));
        close(fd);
        return -1;
    }
    ote_status_t st = ote_file_register(engine, NULL, fd, 0, len, OTE_PERM_READ | OTE_PERM_WRITE,
                                        BENCH_BUFFER_NAME, &m->addr);
    if (st != OTE_OK) {
        char what[BENCH_PATH_MAX + 64];
        snprintf(what, sizeof what, "ote_file_register(%s, %" PRIu64 " bytes)", path, len);
        bench__print_status(what, st);
        close(fd);
        return -1;
    }
    m->engine = engine;
    m->fd = fd;
    return 0;
}

int bench__mem_create(ote_engine_t *engine, unsigned kind, const char *path, uint64_t len,
                      bench_mem_t *m) {
    memset(m, 0, sizeof(*m));
    m->kind = kind;
    m->len = len;
    m->fd = -1;
    char name[16];
    if (kind == BENCH_MEM_SHARED) return alloc_shared(engine, len, m);
    if (kind == BENCH_MEM_FILE) return open_file(engine, path, len, m);
    if (BENCH_MEM_IS_HOST(kind)) {
        m->host = kind == BENCH_MEM_THP ? map_thp(len) : bench__map_buffer(len);
        if (m->host == NULL) {
            fprintf(stderr, "ote_bench: cannot map a %" PRIu64 "-byte buffer: %s\n", len,
                    strerror(errno));
            return -1;
        }
        m->addr = (uint64_t)(uintptr_t)m->host;
        return 0;
    }
    ote_status_t st = ote_cuda_driver_load(NULL, &m->drv);
    if (st == OTE_OK) st = ote_cuda_device_open(m->drv, (int)kind - 1, &m->dev);
    if (st == OTE_OK) st = ote_cuda_alloc_create(m->dev, (size_t)len, 0, &m->alloc);
    if (st != OTE_OK) {
        char what[128];
        snprintf(what, sizeof what,
                 "a %s buffer of %" PRIu64 " bytes (CUDA driver $OTE_CUDA_LIBRARY or libcuda.so.1)",
                 bench_mem_name(kind, name, sizeof name), len);
        bench__print_status(what, st);
        bench__mem_destroy(m);
        return -1;
    }
    m->addr = ote_cuda_alloc_ptr(m->alloc);
    return 0;
}

void bench__mem_destroy(bench_mem_t *m) {
    if (m->fd >= 0) {
        ote_status_t st = ote_file_unregister(m->engine, m->addr);
        if (st != OTE_OK) bench__print_status("ote_file_unregister", st);
        close(m->fd);
    }
    if (m->host != NULL && m->kind == BENCH_MEM_SHARED) {
        ote_status_t st = ote_memory_free_shared(m->engine, m->host);
        if (st != OTE_OK) bench__print_status("ote_memory_free_shared", st);
    } else if (m->host != NULL) {
        munmap(m->host, (size_t)m->len);
    }
    if (m->alloc != NULL) {
        ote_status_t st =
            ote_cuda_alloc_destroy(m->alloc, ote_deadline_after(10 * OTE_NSEC_PER_SEC));
        if (st != OTE_OK) bench__print_status("freeing the device buffer", st);
    }
    if (m->dev != NULL) (void)ote_cuda_device_close(m->dev);
    if (m->drv != NULL) (void)ote_cuda_driver_unload(m->drv);
    memset(m, 0, sizeof(*m));
    m->fd = -1;
}

/* Device: write or read [off, off+len) in pieces through one host buffer; fn fills the
 * piece before a write (HtoD) or looks at it after a read (DtoH). */
typedef bool (*piece_fn)(uint8_t *piece, uint64_t off, size_t n, void *arg);

/* File: the same through pwrite / pread of our descriptor (a short read: the file shrank). */
static int file_pieces(bench_mem_t *m, uint64_t off, uint64_t len, int to_file, piece_fn fn,
                       void *arg) {
    size_t cap = (size_t)(len < MEM_PIECE ? len : MEM_PIECE);
    uint8_t *piece = malloc(cap ? cap : 1);
    if (piece == NULL) return -1;
    int rc = 0;
    for (uint64_t done = 0; rc == 0 && done < len;) {
        size_t n = (size_t)(len - done < cap ? len - done : cap);
        if (to_file) {
            if (!fn(piece, off + done, n, arg) ||
                pwrite(m->fd, piece, n, (off_t)(off + done)) != (ssize_t)n)
                rc = -1;
        } else if (pread(m->fd, piece, n, (off_t)(off + done)) != (ssize_t)n) {
            rc = -1;
        } else if (!fn(piece, off + done, n, arg)) {
            rc = 1;
        }
        done += n;
    }
    if (rc < 0) fprintf(stderr, "ote_bench: file pattern I/O failed: %s\n", strerror(errno));
    free(piece);
    return rc;
}

static int dev_pieces(bench_mem_t *m, uint64_t off, uint64_t len, int to_device, piece_fn fn,
                      void *arg) {
    if (m->fd >= 0) return file_pieces(m, off, len, to_device, fn, arg);
    const ote_cuda_driver_table_t *t = ote_cuda_driver_table(m->drv);
    if (ote_cuda_device_make_current(m->dev) != OTE_OK) return -1;
    size_t cap = (size_t)(len < MEM_PIECE ? len : MEM_PIECE);
    uint8_t *piece = malloc(cap ? cap : 1);
    if (piece == NULL) return -1;
    int rc = 0;
    /* Copies issued before (the engine's, on its own streams) are complete: the engine
     * waited for them. The legacy stream orders these after earlier ones of ours. */
    if (t->cuStreamSynchronize(NULL) != 0) rc = -1;
    for (uint64_t done = 0; rc == 0 && done < len;) {
        size_t n = (size_t)(len - done < cap ? len - done : cap);
        if (to_device) {
            if (!fn(piece, off + done, n, arg) ||
                t->cuMemcpyHtoD(m->addr + off + done, piece, n) != 0)
                rc = -1;
        } else {
            if (t->cuMemcpyDtoH(piece, m->addr + off + done, n) != 0) rc = -1;
            else if (!fn(piece, off + done, n, arg)) rc = 1;
        }
        done += n;
    }
    if (rc == 0 && t->cuStreamSynchronize(NULL) != 0) rc = -1;
    free(piece);
    return rc;
}

typedef struct {
    uint64_t seed;
    uint64_t bad;
    int zero;
} pat_arg_t;

static bool fill_piece(uint8_t *piece, uint64_t off, size_t n, void *arg) {
    pat_arg_t *a = arg;
    if (a->zero) memset(piece, 0, n);
    else bench_pattern_fill(piece, off, n, a->seed);
    return true;
}

static bool check_piece(uint8_t *piece, uint64_t off, size_t n, void *arg) {
    pat_arg_t *a = arg;
    return bench_pattern_check(piece, off, n, a->seed, &a->bad);
}

int bench__mem_fill(bench_mem_t *m, uint64_t off, uint64_t len, uint64_t seed) {
    if (m->host != NULL) {
        bench_pattern_fill(m->host + off, off, (size_t)len, seed);
        return 0;
    }
    pat_arg_t a = {seed, 0, 0};
    return dev_pieces(m, off, len, 1, fill_piece, &a);
}

int bench__mem_zero(bench_mem_t *m, uint64_t off, uint64_t len) {
    if (m->host != NULL) {
        memset(m->host + off, 0, (size_t)len);
        return 0;
    }
    pat_arg_t a = {0, 0, 1};
    return dev_pieces(m, off, len, 1, fill_piece, &a);
}

int bench__mem_check(bench_mem_t *m, uint64_t off, uint64_t len, uint64_t seed, uint64_t *bad_out) {
    if (m->host != NULL)
        return bench_pattern_check(m->host + off, off, (size_t)len, seed, bad_out) ? 0 : 1;
    pat_arg_t a = {seed, 0, 0};
    int rc = dev_pieces(m, off, len, 0, check_piece, &a);
    if (rc == 1) *bad_out = a.bad;
    return rc;
}

int bench__mem_corrupt(bench_mem_t *m, uint64_t off) {
    if (m->host != NULL) {
        m->host[off] ^= 0x5a;
        return 0;
    }
    if (m->fd >= 0) {
        uint8_t b = 0;
        if (pread(m->fd, &b, 1, (off_t)off) != 1) return -1;
        b ^= 0x5a;
        return pwrite(m->fd, &b, 1, (off_t)off) == 1 ? 0 : -1;
    }
    const ote_cuda_driver_table_t *t = ote_cuda_driver_table(m->drv);
    uint8_t b = 0;
    if (ote_cuda_device_make_current(m->dev) != OTE_OK || t->cuStreamSynchronize(NULL) != 0 ||
        t->cuMemcpyDtoH(&b, m->addr + off, 1) != 0)
        return -1;
    b ^= 0x5a;
    return t->cuMemcpyHtoD(m->addr + off, &b, 1) == 0 && t->cuStreamSynchronize(NULL) == 0 ? 0 : -1;
}

/* Bounds check of [off, off+len) against a total-byte buffer, overflow-safe. */
static bool range_ok(uint64_t total, uint64_t off, uint64_t len) {
    return off <= total && len <= total - off;
}

bool bench__mem_serve(bench_mem_t *m, uint64_t len_total, const bench_ctl_msg_t *req,
                      bench_ctl_msg_t *rep) {
    uint64_t off, len;
    if (req->verb == BENCH_CTL_ZERO) off = req->a, len = req->b;
    else if (req->verb == BENCH_CTL_FILL || req->verb == BENCH_CTL_VERIFY)
        off = req->b, len = req->c;
    else return false;
    rep->verb = BENCH_CTL_OK;
    if (!range_ok(len_total, off, len)) {
        rep->verb = BENCH_CTL_ERR;
        snprintf(rep->text, sizeof rep->text, "range outside the %" PRIu64 "-byte buffer",
                 len_total);
        return true;
    }
    int rc = req->verb == BENCH_CTL_FILL   ? bench__mem_fill(m, off, len, req->a)
             : req->verb == BENCH_CTL_ZERO ? bench__mem_zero(m, off, len)
                                           : bench__mem_check(m, off, len, req->a, &rep->a);
    if (rc == 1) rep->verb = BENCH_CTL_BAD;
    if (rc < 0) {
        rep->verb = BENCH_CTL_ERR;
        snprintf(rep->text, sizeof rep->text, "a copy to or from the %s buffer failed",
                 m->fd >= 0 ? "file" : "device");
    }
    return true;
}

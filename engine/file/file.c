/*
 * engine/file/file.c - file registrations and the local segment's transport
 * (engine/file/file.h): open or adopt a file, check it (a regular file or a block
 * device, the range inside it, an open mode that allows the permissions), give it an
 * address window, and serve slices of the local segment against it through the I/O
 * engine (file_io.c): O_DIRECT where the slice's file offset, length and memory meet the
 * registration's alignment (statx STATX_DIOALIGN, else OTE__FILE_DIO_ALIGN) and the file
 * system takes O_DIRECT, buffered otherwise.
 */

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/fault.h"
#include "base/lock.h"
#include "base/log.h"
#include "base/time.h"
#include "engine/file/file_internal.h"

#define FILE_WINDOW (1ull << 30) /* address windows are 1 GiB-aligned */

struct ote__tpeer {
    ote__files_t *f;
};

struct ote__files {
    ote__transport_t tp; /* first: the local segment's transport */
    ote__cfg_t cfg;
    ote_mutex_t mu;            /* regs, next_addr, io's creation */
    ote_cond_t unpinned;       /* under mu: a registration's last in-use count went */
    _Atomic int unreg_waiters; /* unregisters sleeping on unpinned */
    ote__freg_t **regs;
    size_t nregs, capregs;
    uint64_t next_addr;
    ote__fio_t *io; /* created with the first registration */
    int stall[2];   /* the file.stall fault point's pipe (nothing writes it) */
    struct ote__tpeer peer;
    /* GPUDirect Storage (gds.c), under mu: tried with the first device-memory request;
     * its slices run on their own preadv-style pool (gio, file_engine=threads). */
    enum { GDS_UNTRIED = 0, GDS_READY, GDS_ABSENT } gds_state;
    ote__gds_t *gds;
    ote__fio_t *gio;
    ote__fbpool_t bounce; /* peers' slices (host->file) */
    /* Bytes of peers' READs sent from the page cache (map_read) and read into a bounce
     * first (bounce_copy, bounce_io_start): ote_engine_stats_t.file_read_bytes_*. */
    _Atomic uint64_t read_mapped, read_bounced;
};

/* ---- registrations ------------------------------------------------------------------ */

static ote_status_t errno_status(int err) {
    if (err == ENOMEM) return ote_status_make(OTE_ERR_NOMEM, err);
    if (err == EACCES || err == EPERM || err == EROFS) return ote_status_make(OTE_ERR_ACCESS, err);
    if (err == ENOENT || err == ENOTDIR) return ote_status_make(OTE_ERR_NOT_FOUND, err);
    return ote_status_make(OTE_ERR_NATIVE, err);
}

/* The caller's path opened, or its fd duplicated (the owner's own descriptor either way),
 * with an open mode that allows perms. */
static ote_status_t file_open(const char *path, int fd, unsigned perms, int *fd_out) {
    int want = (perms & OTE_PERM_WRITE) ? ((perms & OTE_PERM_READ) ? O_RDWR : O_WRONLY) : O_RDONLY;
    if (path != NULL) {
        int o = open(path, want | O_CLOEXEC | O_NOCTTY);
        if (o < 0) {
            int err = errno;
            OTE_WARN("file", "file_register: cannot open %s for %s: %s", path,
                     want == O_RDONLY ? "reading" : "reading and writing", strerror(err));
            return errno_status(err);
        }
        *fd_out = o;
        return OTE_OK;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0) {
        OTE_WARN("file", "file_register: fd %d is not open: %s", fd, strerror(errno));
        return OTE_ERR_INVALID;
    }
    int acc = fl & O_ACCMODE;
    if (((perms & OTE_PERM_READ) && acc == O_WRONLY) ||
        ((perms & OTE_PERM_WRITE) && acc == O_RDONLY)) {
        OTE_WARN("file", "file_register: fd %d is open %s, which does not allow OTE_PERM_%s", fd,
                 acc == O_RDONLY ? "read-only" : "write-only", acc == O_RDONLY ? "WRITE" : "READ");
        return OTE_ERR_ACCESS;
    }
    int d = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (d < 0) return errno_status(errno);
    *fd_out = d;
    return OTE_OK;
}

/* A regular file or a block device whose size holds [off, off + len). */
static ote_status_t file_check(int fd, const char *what, uint64_t off, uint64_t len) {
    struct stat st;
    if (fstat(fd, &st) != 0) return errno_status(errno);
    uint64_t size;
    if (S_ISREG(st.st_mode)) {
        size = (uint64_t)st.st_size;
    } else if (S_ISBLK(st.st_mode)) {
        if (ioctl(fd, BLKGETSIZE64, &size) != 0) return errno_status(errno);
    } else {
        OTE_WARN("file", "file_register: %s is not a regular file or block device (mode 0%o)", what,
                 (unsigned)(st.st_mode & S_IFMT));
        return OTE_ERR_INVALID;
    }
    if (off > size || len > size - off) {
        OTE_WARN("file",
                 "file_register: range [%llu, +%llu) runs past the end of %s (%llu bytes); "
                 "extend it first (ftruncate, fallocate)",
                 (unsigned long long)off, (unsigned long long)len, what, (unsigned long long)size);
        return OTE_ERR_INVALID;
    }
    return OTE_OK;
}

/* The same file opened again with O_DIRECT, or -1 (INFO) where the file system refuses. */
static int file_open_direct(int fd, const char *what) {
    char p[64];
    snprintf(p, sizeof(p), "/proc/self/fd/%d", fd);
    int acc = fcntl(fd, F_GETFL) & O_ACCMODE;
    int d = open(p, acc | O_DIRECT | O_CLOEXEC | O_NOCTTY);
    if (d < 0)
        OTE_INFO("file", "%s: no O_DIRECT here (%s): every request to it is buffered", what,
                 strerror(errno));
    return d;
}

/* r's O_DIRECT alignment from statx(STATX_DIOALIGN), else OTE__FILE_DIO_ALIGN; why in
 * why (for the registration's DEBUG line). */
static void file_dio_align(ote__freg_t *r, char *why, size_t cap) {
    r->dio_mem = r->dio_off = r->dio_woff = OTE__FILE_DIO_ALIGN;
    struct statx sx;
    memset(&sx, 0, sizeof(sx));
    if (statx(r->dfd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) != 0) {
        snprintf(why, cap, "statx failed (%s), assumed", strerror(errno));
    } else if ((sx.stx_mask & STATX_DIOALIGN) == 0) {
        snprintf(why, cap, "STATX_DIOALIGN not reported (kernel < 6.1?), assumed");
    } else if (sx.stx_dio_mem_align == 0 || sx.stx_dio_offset_align == 0) {
        snprintf(why, cap, "STATX_DIOALIGN reports none for this file, assumed");
    } else {
        r->dio_mem = sx.stx_dio_mem_align;
        r->dio_off = sx.stx_dio_offset_align;
        snprintf(why, cap, "statx");
    }
    long page = sysconf(_SC_PAGESIZE);
    r->dio_woff = page > 0 && (uint32_t)page > r->dio_off ? (uint32_t)page : r->dio_off;
}

int ote__freg_direct(const ote__freg_t *r, uint64_t foff, uint64_t len, const void *buf,
                     int write) {
    uint32_t off = write ? r->dio_woff : r->dio_off;
    return r->dfd >= 0 && foff % off == 0 && len % off == 0 && len % r->dio_mem == 0 &&
           (uintptr_t)buf % r->dio_mem == 0;
}

static int name_ok(const char *name) {
    size_t n = strlen(name);
    if (n == 0 || n > OTE_NAME_MAX) return 0;
    for (size_t i = 0; i < n; i++)
        if (name[i] < 0x20 || name[i] > 0x7e) return 0;
    return 1;
}

static ote_status_t io_start(ote__files_t *f) {
    if (f->io != NULL) return OTE_OK;
    if (f->stall[0] < 0 && pipe2(f->stall, O_CLOEXEC) != 0) return errno_status(errno);
    return ote__fio_create(f->cfg.file_engine, f->cfg.file_queue_depth,
                           strcmp(f->cfg.file_sync, "data") == 0, f->stall[0], &f->io);
}

/* Table insert under f->mu: the name unique, an address window, room. */
static ote_status_t table_add(ote__files_t *f, ote__freg_t *r) {
    for (size_t i = 0; i < f->nregs; i++)
        if (r->name[0] != '\0' && strcmp(f->regs[i]->name, r->name) == 0) {
            OTE_WARN("file", "file_register: the name \"%s\" is taken", r->name);
            return OTE_ERR_EXISTS;
        }
    if (f->nregs == f->capregs) {
        size_t cap = f->capregs ? f->capregs * 2 : 8;
        ote__freg_t **n = ote_realloc(f->regs, cap * sizeof(*n));
        if (n == NULL) return OTE_ERR_NOMEM;
        f->regs = n;
        f->capregs = cap;
    }
    uint64_t span = (r->len + FILE_WINDOW - 1) / FILE_WINDOW * FILE_WINDOW;
    if (span > UINT64_MAX - f->next_addr - FILE_WINDOW) return OTE_ERR_TOO_BIG;
    r->addr = f->next_addr;
    r->pin.base = r->addr;              /* the registration's extent: its address window */
    f->next_addr += span + FILE_WINDOW; /* one empty window between two */
    f->regs[f->nregs++] = r;
    return OTE_OK;
}

/* The I/O engine (made with the first registration, kept until the owner goes). */
static ote__fio_t *files_io(ote__files_t *f) {
    ote_mutex_lock(&f->mu);
    ote__fio_t *io = f->io;
    ote_mutex_unlock(&f->mu);
    return io;
}

/* r's descriptors out of the ring's table (io: f->io, never replaced once made), closed. */
static void freg_free(ote__files_t *f, ote__freg_t *r) {
    ote__fio_t *io = files_io(f);
    if (io != NULL) {
        ote__fio_file_remove(io, r->fix);
        ote__fio_file_remove(io, r->dfix);
    }
    ote__gds_reg_close(r); /* gds.c: its cuFile handle, before the descriptor closes */
    ote__freg_unmap(r);
    if (r->dfd >= 0) close(r->dfd);
    if (r->fd >= 0) close(r->fd);
    ote_free(r);
}

ote_status_t ote__files_register(ote__files_t *f, const char *path, int fd, uint64_t offset,
                                 uint64_t len, unsigned perms, const char *name,
                                 uint64_t *addr_out) {
    if ((path == NULL) == (fd < 0) || len == 0 || offset > UINT64_MAX - len || addr_out == NULL ||
        perms == 0 || (perms & ~(OTE_PERM_READ | OTE_PERM_WRITE)) != 0 ||
        (name != NULL && !name_ok(name)))
        return OTE_ERR_INVALID;
    ote__freg_t *r = ote_calloc(1, sizeof(*r));
    if (r == NULL) return OTE_ERR_NOMEM;
    r->fd = r->dfd = r->fix = r->dfix = -1;
    r->dio_mem = r->dio_off = r->dio_woff = OTE__FILE_DIO_ALIGN;
    r->owner = f;
    r->off = offset;
    r->len = len;
    r->perms = perms;
    r->pin = (ote__pin_t){.kind = OTE_MEM_FILE, .perms = perms, .loc = -1, .len = len};
    if (name != NULL) snprintf(r->name, sizeof(r->name), "%s", name);
    if (path != NULL) snprintf(r->path, sizeof(r->path), "%s", path);
    else snprintf(r->path, sizeof(r->path), "fd %d", fd);
    ote_status_t st = file_open(path, fd, perms, &r->fd);
    if (st == OTE_OK) st = file_check(r->fd, r->path, offset, len);
    if (st != OTE_OK) {
        freg_free(f, r);
        return st;
    }
    r->dfd = file_open_direct(r->fd, r->path);
    if (strcmp(f->cfg.file_zero_copy, "off") != 0) ote__freg_map(r);
    char why[96] = "no O_DIRECT";
    if (r->dfd >= 0) file_dio_align(r, why, sizeof(why));
    ote_mutex_lock(&f->mu);
    st = io_start(f);
    ote__fio_t *io = f->io;
    ote_mutex_unlock(&f->mu);
    if (st == OTE_OK) {
        r->fix = ote__fio_file_add(io, r->fd, r->path);
        r->dfix = ote__fio_file_add(io, r->dfd, r->path);
        ote_mutex_lock(&f->mu);
        st = table_add(f, r);
        ote_mutex_unlock(&f->mu);
    }
    if (st != OTE_OK) {
        freg_free(f, r);
        return st;
    }
    OTE_DEBUG("file",
              "registered %s [%llu, +%llu) at 0x%llx (%s, O_DIRECT alignment: memory %u, "
              "offset %u (%s), writes' offset %u; io_uring fixed files %d, %d)",
              r->path, (unsigned long long)offset, (unsigned long long)len,
              (unsigned long long)r->addr, ote__fio_kind(io), r->dio_mem, r->dio_off, why,
              r->dio_woff, r->fix, r->dfix);
    *addr_out = r->addr;
    return OTE_OK;
}

static ote_status_t unregister_locked(ote__files_t *f, uint64_t addr, ote__freg_t **out) {
    for (size_t i = 0; i < f->nregs; i++) {
        if (f->regs[i]->addr != addr) continue;
        if (atomic_load(&f->regs[i]->inuse) > 0) return OTE_ERR_BUSY;
        *out = f->regs[i];
        f->regs[i] = f->regs[--f->nregs];
        return OTE_OK;
    }
    return OTE_ERR_NOT_FOUND;
}

void ote__freg_unpin(ote__freg_t *r) {
    ote__files_t *f = r->owner; /* read first: r may be freed once its count is 0 */
    if (atomic_fetch_sub(&r->inuse, 1) == 1 && atomic_load(&f->unreg_waiters) > 0) {
        ote_mutex_lock(&f->mu);
        ote_cond_broadcast(&f->unpinned);
        ote_mutex_unlock(&f->mu);
    }
}

/* Waits up to OTE_UNREGISTER_WAIT_MS for the slices in flight on it to end, asleep until
 * the last one goes (the waiter is counted before it looks at the count, under mu, and
 * the last unpin broadcasts under mu: the wakeup cannot be lost). */
ote_status_t ote__files_unregister(ote__files_t *f, uint64_t addr) {
    ote_deadline_t dl = ote_deadline_after(OTE_UNREGISTER_WAIT_MS * OTE_NSEC_PER_MSEC);
    ote__freg_t *r = NULL;
    atomic_fetch_add(&f->unreg_waiters, 1);
    ote_mutex_lock(&f->mu);
    ote_status_t st;
    while ((st = unregister_locked(f, addr, &r)) == OTE_ERR_BUSY &&
           ote_cond_wait(&f->unpinned, &f->mu, dl) == OTE_OK) {}
    ote_mutex_unlock(&f->mu);
    atomic_fetch_sub(&f->unreg_waiters, 1);
    if (st == OTE_OK) freg_free(f, r);
    return st;
}

/* What ote_file_query and discovery say of registration r. */
static void freg_info(const ote__freg_t *r, ote_buffer_info_t *out) {
    memset(out, 0, sizeof(*out));
    snprintf(out->name, sizeof(out->name), "%s", r->name);
    out->addr = r->addr;
    out->length = r->len;
    out->perms = r->perms;
    out->kind = OTE_MEM_FILE;
    out->numa_node = -1;
}

ote_status_t ote__files_query(ote__files_t *f, uint64_t addr, ote_buffer_info_t *out) {
    ote_status_t st = OTE_ERR_NOT_FOUND;
    ote_mutex_lock(&f->mu);
    for (size_t i = 0; i < f->nregs; i++) {
        const ote__freg_t *r = f->regs[i];
        if (addr < r->addr || addr - r->addr >= r->len) continue;
        freg_info(r, out);
        st = OTE_OK;
        break;
    }
    ote_mutex_unlock(&f->mu);
    return st;
}

ote_status_t ote__files_list(ote__files_t *f, ote_buffer_info_t *out, size_t cap, size_t *n_out,
                             size_t *total_out) {
    if ((out == NULL && cap > 0) || n_out == NULL || total_out == NULL) return OTE_ERR_INVALID;
    size_t n = 0;
    ote_mutex_lock(&f->mu);
    for (size_t i = 0; i < f->nregs; i++) {
        const ote__freg_t *r = f->regs[i];
        /* Insertion into the cap lowest addresses so far, in order. */
        size_t at = n;
        while (at > 0 && out[at - 1].addr > r->addr) at--;
        if (at >= cap) continue;
        size_t last = n < cap ? n : cap - 1;
        memmove(out + at + 1, out + at, (last - at) * sizeof(*out));
        if (n < cap) n++;
        freg_info(r, &out[at]);
    }
    *total_out = f->nregs;
    ote_mutex_unlock(&f->mu);
    *n_out = n;
    return OTE_OK;
}

const char *ote__files_engine(ote__files_t *f) {
    ote_mutex_lock(&f->mu);
    const char *k = f->io != NULL ? ote__fio_kind(f->io) : "";
    ote_mutex_unlock(&f->mu);
    return k;
}

/* ---- serving peers: pins and bounce buffers (host->pin, host->file) ---------------- */

ote_status_t ote__files_pin(ote__files_t *f, uint64_t addr, uint64_t len, unsigned perm,
                            void **pin_out) {
    ote_status_t st = OTE_ERR_ACCESS;
    ote_mutex_lock(&f->mu);
    for (size_t i = 0; i < f->nregs; i++) {
        ote__freg_t *r = f->regs[i];
        if (addr < r->addr || addr - r->addr > r->len || len > r->len - (addr - r->addr)) continue;
        if ((r->perms & perm) == perm) {
            atomic_fetch_add(&r->inuse, 1);
            *pin_out = r;
            st = OTE_OK;
        }
        break;
    }
    ote_mutex_unlock(&f->mu);
    return st;
}

void ote__files_unpin(ote__files_t *f, void *pin) {
    (void)f;
    ote__freg_unpin(pin);
}

static ote_status_t bounce_get(void *arg, const ote__pin_t *pin, uint32_t len, uint8_t **buf_out,
                               void **tok_out) {
    ote__files_t *f = arg;
    ote__fbuf_t *b = ote__fbpool_get(&f->bounce, len, files_io(f));
    if (b == NULL) return OTE_ERR_NOMEM;
    b->reg = (ote__freg_t *)(uintptr_t)pin; /* the pin is the registration's head */
    b->len = len;
    *buf_out = b->data;
    *tok_out = b;
    return OTE_OK;
}

/* One read or write of [foff, +len) with buf: the O_DIRECT descriptor where offset,
 * length and buf meet r's alignment (ote__freg_direct) and, for a read, the page cache
 * holds none of the range (ote__freg_map_partly), else the buffered one. */
static ssize_t bounce_rw(const ote__freg_t *r, int to_file, uint8_t *buf, uint32_t len,
                         uint64_t foff) {
    int direct = ote__freg_direct(r, foff, len, buf, to_file) &&
                 (to_file || !ote__freg_map_partly(r, foff, len));
    int fd = direct ? r->dfd : r->fd;
    return to_file ? pwrite(fd, buf, len, (off_t)foff) : pread(fd, buf, len, (off_t)foff);
}

/* Synchronous, O_DIRECT when aligned: the whole range or a status (a truncated file:
 * ENODATA). */
static ote_status_t bounce_copy(void *arg, void *tok, int to_file, uint64_t addr, uint32_t len) {
    ote__files_t *f = arg;
    ote__fbuf_t *b = tok;
    ote__freg_t *r = b->reg;
    if (len > b->len || addr < r->addr || addr - r->addr > r->len ||
        len > r->len - (addr - r->addr))
        return OTE_ERR_ACCESS;
    uint64_t foff = r->off + (addr - r->addr);
    if (!to_file) atomic_fetch_add_explicit(&f->read_bounced, len, memory_order_relaxed);
    for (uint32_t done = 0; done < len;) {
        ssize_t n = bounce_rw(r, to_file, b->data + done, len - done, foff + done);
        if (n < 0 && errno == EINTR) continue;
        int err = n < 0 ? errno : n == 0 ? (to_file ? EIO : ENODATA) : 0;
        if (err != 0) {
            OTE_WARN("file", "serving a peer: %s of %u bytes at offset %llu of %s failed: %s",
                     to_file ? "write" : "read", len - done, (unsigned long long)(foff + done),
                     r->path, err == ENODATA ? "the file was truncated" : strerror(err));
            return ote_status_make(OTE_ERR_IO, err);
        }
        done += (uint32_t)n;
    }
    if (to_file && strcmp(f->cfg.file_sync, "data") == 0 && fdatasync(r->fd) != 0) {
        int err = errno;
        OTE_WARN("file", "serving a peer: fdatasync of %s failed: %s", r->path, strerror(err));
        return ote_status_make(OTE_ERR_IO, err);
    }
    return OTE_OK;
}

/* The I/O engine ended a bounce_io_start read or write: its caller learns it. */
static void bounce_read_end(ote__slice_t *s, ote_status_t st) {
    ote__fbuf_t *b = (ote__fbuf_t *)(void *)((char *)s - offsetof(ote__fbuf_t, slice));
    b->done(b->done_arg, st);
}

/* The read as a slice of the I/O engine (O_DIRECT when aligned, file.io / file.stall
 * apply as to the local segment's); its fop holds the registration in use until it ends
 * (ote__file_slice_end drops it). */
static ote_status_t bounce_io_start(void *arg, void *tok, int to_file, uint64_t addr, uint32_t len,
                                    ote_deadline_t dl, void (*done)(void *, ote_status_t),
                                    void *done_arg) {
    ote__files_t *f = arg;
    ote__fbuf_t *b = tok;
    ote__freg_t *r = b->reg;
    if (len > b->len || addr < r->addr || addr - r->addr > r->len ||
        len > r->len - (addr - r->addr))
        return OTE_ERR_ACCESS;
    ote__fio_t *io = files_io(f); /* created with the first registration: r exists */
    if (io == NULL) return OTE_ERR_INVALID;
    if (!to_file) atomic_fetch_add_explicit(&f->read_bounced, len, memory_order_relaxed);
    ote__slice_t *s = &b->slice;
    memset(s, 0, sizeof(*s));
    s->done = bounce_read_end;
    s->local = b->data;
    s->remote = addr;
    s->len = len;
    s->op = to_file ? OTE__SLICE_WRITE : OTE__SLICE_READ;
    s->mem_loc = -1;
    s->deadline = dl;
    ote__fop_t *op = ote__fop(s);
    op->reg = r;
    op->foff = r->off + (addr - r->addr);
    op->write = to_file != 0; /* then the I/O engine's fdatasync with file_sync=data */
    op->direct = ote__freg_direct(r, op->foff, len, b->data, to_file) &&
                 (to_file || !ote__freg_map_partly(r, op->foff, len));
    op->fixbuf = (uint16_t)(b->fixbuf + 1); /* 0: a plain buffer */
    op->fd = op->direct ? r->dfd : r->fd;
    op->state = FOP_QUEUED;
    ote_status_t fst;
    op->stall = ote_fault_hit("file.stall", &fst);
    b->done = done;
    b->done_arg = done_arg;
    atomic_fetch_add(&r->inuse, 1);
    ote__fio_submit(io, s);
    return OTE_OK;
}

static void bounce_put(void *arg, void *tok) {
    ote__files_t *f = arg;
    ote__fbpool_put(&f->bounce, tok, files_io(f));
}

static int bounce_kept(void *arg, void *tok, uint8_t **base_out, uint64_t *size_out) {
    (void)arg;
    return ote__fbpool_kept(tok, base_out, size_out);
}

static ote_status_t map_read(void *arg, const ote__pin_t *pin, uint64_t addr, uint32_t len,
                             const uint8_t **ptr_out) {
    ote__files_t *f = arg;
    ote_status_t st =
        ote__freg_map_read((const ote__freg_t *)(const void *)pin, addr, len, ptr_out);
    if (st != OTE_OK) return st;
    atomic_fetch_add_explicit(&f->read_mapped, len, memory_order_relaxed);
    if (ote__engine_hooks.file_mapped)
        ote__engine_hooks.file_mapped(ote__engine_hooks.file_mapped_arg, addr, len);
    return OTE_OK;
}

static ote_status_t map_failed(void *arg, const ote__pin_t *pin, uint64_t addr, uint32_t len,
                               ote_status_t st) {
    (void)arg;
    return ote__freg_map_failed((const ote__freg_t *)(const void *)pin, addr, len, st);
}

ote__file_ops_t ote__files_services(ote__files_t *f) {
    return (ote__file_ops_t){f,           bounce_get, bounce_copy, bounce_put, bounce_io_start,
                             bounce_kept, map_read,   map_failed};
}

void ote__files_read_bytes(ote__files_t *f, uint64_t *mapped_out, uint64_t *bounced_out) {
    *mapped_out = f != NULL ? atomic_load_explicit(&f->read_mapped, memory_order_relaxed) : 0;
    *bounced_out = f != NULL ? atomic_load_explicit(&f->read_bounced, memory_order_relaxed) : 0;
}

/* ---- the local segment's slices ----------------------------------------------------- */

ote_status_t ote__file_io_error(ote__slice_t *s, int err, const char *what) {
    ote__fop_t *op = ote__fop(s);
    OTE_WARN("file", "%s %s of %u bytes at offset %llu of %s failed: %s",
             op->direct ? "O_DIRECT" : "buffered", what, s->len, (unsigned long long)op->foff,
             op->reg->path, strerror(err));
    if (err == ENOMEM) return ote_status_make(OTE_ERR_NOMEM, err);
    return ote_status_make(OTE_ERR_IO, err);
}

void ote__file_slice_end(ote__slice_t *s, ote_status_t st) {
    ote__fop_t *op = ote__fop(s);
    if (op->reg != NULL) {
        s->file_io = op->gds      ? OTE__FILE_IO_GDS
                     : op->direct ? OTE__FILE_IO_DIRECT
                                  : OTE__FILE_IO_BUFFERED;
        ote__freg_unpin(op->reg);
    }
    s->done(s, st);
}

/* The registration holding the slice's whole request, with the permission its opcode
 * needs, pinned; NULL (and the reason in *st) otherwise. */
static ote__freg_t *slice_pin(ote__files_t *f, const ote__slice_t *s, ote_status_t *st) {
    unsigned need = s->op == OTE__SLICE_WRITE ? OTE_PERM_WRITE : OTE_PERM_READ;
    ote__freg_t *found = NULL;
    ote_mutex_lock(&f->mu);
    for (size_t i = 0; i < f->nregs; i++) {
        ote__freg_t *r = f->regs[i];
        if (s->req_remote >= r->addr && s->req_remote - r->addr <= r->len &&
            s->req_len <= r->len - (s->req_remote - r->addr)) {
            found = r;
            break;
        }
    }
    if (found != NULL && (found->perms & need) != 0) atomic_fetch_add(&found->inuse, 1);
    ote_mutex_unlock(&f->mu);
    *st = OTE_ERR_ACCESS;
    if (found == NULL || (found->perms & need) == 0) {
        if (s->remote == s->req_remote) /* once per request: its first slice */
            OTE_WARN("file", "request [0x%llx, +%llu) %s: %s", (unsigned long long)s->req_remote,
                     (unsigned long long)s->req_len, need == OTE_PERM_WRITE ? "WRITE" : "READ",
                     found == NULL ? "not inside one file registration"
                                   : "the file registration lacks the permission");
        return NULL;
    }
    *st = OTE_OK;
    return found;
}

/* ---- GPUDirect Storage hooks (gds.c) ------------------------------------------------- */

/* transport op gds_ready: libcufile loaded, tried once (INFO lines when absent). */
static int files_gds_ready(ote__tpeer_t *peer) {
    ote__files_t *f = peer->f;
    ote_mutex_lock(&f->mu);
    if (f->gds_state == GDS_UNTRIED)
        f->gds_state = ote__gds_create(&f->gds) == OTE_OK ? GDS_READY : GDS_ABSENT;
    int ready = f->gds_state == GDS_READY;
    ote_mutex_unlock(&f->mu);
    return ready;
}

void ote__files_release_device(ote__files_t *f) {
    if (f == NULL) return;
    ote_mutex_lock(&f->mu);
    ote__gds_t *g = f->gds;
    ote_mutex_unlock(&f->mu);
    ote__gds_release(g);
}

void ote__files_dev_unregister(ote__files_t *f, uint64_t start) {
    if (f == NULL) return;
    ote_mutex_lock(&f->mu);
    ote__gds_t *g = f->gds; /* set once, freed only by the owner's destroy */
    ote_mutex_unlock(&f->mu);
    ote__gds_dev_unregister(g, start);
}

/* A device-memory slice (ipc_try, its fop filled) onto the GDS pool; declined with
 * OTE_ERR_UNSUPPORTED (the engine stages it) when the handle or the pool is refused. */
static void gds_submit(ote__files_t *f, ote__slice_t *s) {
    ote__fop_t *op = ote__fop(s);
    op->gds = 1;
    op->direct = op->reg->dfd >= 0;
    op->fd = op->direct ? op->reg->dfd : op->reg->fd;
    ote_mutex_lock(&f->mu);
    ote_status_t st = f->gds != NULL ? OTE_OK : OTE_ERR_UNSUPPORTED;
    if (st == OTE_OK && f->gio == NULL)
        st = ote__fio_create("threads", f->cfg.file_queue_depth,
                             strcmp(f->cfg.file_sync, "data") == 0, f->stall[0], &f->gio);
    ote__fio_t *gio = f->gio;
    ote_mutex_unlock(&f->mu);
    if (st == OTE_OK) st = ote__gds_reg_open(f->gds, op->reg);
    if (st != OTE_OK) {
        ote__file_slice_end(s, ote_status_make(OTE_ERR_UNSUPPORTED, ote_status_errno(st)));
        return;
    }
    ote__fio_submit(gio, s);
}

static void files_submit(ote__tpeer_t *peer, ote__slice_t *list) {
    ote__files_t *f = peer->f;
    while (list != NULL) {
        ote__slice_t *s = list;
        list = s->next;
        s->next = NULL;
        ote__fop_t *op = ote__fop(s);
        memset(op, 0, sizeof(*op));
        ote_status_t st;
        ote__freg_t *r = slice_pin(f, s, &st);
        if (r == NULL) {
            ote__file_slice_end(s, st);
            continue;
        }
        op->reg = r;
        op->foff = r->off + (s->remote - r->addr);
        op->write = s->op == OTE__SLICE_WRITE;
        op->direct = ote__freg_direct(r, op->foff, s->len, s->local, op->write);
        op->fd = op->direct ? r->dfd : r->fd;
        op->state = FOP_QUEUED;
        ote_status_t fst;
        op->stall = ote_fault_hit("file.stall", &fst);
        if (s->ipc_try) { /* device memory: GPUDirect Storage (gds.c) */
            gds_submit(f, s);
            continue;
        }
        ote__fio_submit(f->io, s);
    }
}

static void files_cancel(ote__tpeer_t *peer) {
    ote__files_t *f = peer->f;
    ote_mutex_lock(&f->mu);
    ote__fio_t *io = f->io, *gio = f->gio;
    ote_mutex_unlock(&f->mu);
    if (io != NULL) ote__fio_cancel(io);
    if (gio != NULL) ote__fio_cancel(gio);
}

static ote_status_t files_address(ote__transport_t *tp, char *buf, size_t len) {
    (void)tp;
    return snprintf(buf, len, "local") < (int)len ? OTE_OK : OTE_ERR_TOO_BIG;
}

static ote_status_t files_peer_open(ote__transport_t *tp, const char *peer, ote__tpeer_t **out) {
    (void)peer;
    ote__files_t *f = (ote__files_t *)tp;
    *out = &f->peer;
    return OTE_OK;
}

static ote_status_t files_peer_ensure(ote__tpeer_t *peer) {
    ote__files_t *f = peer->f;
    ote_mutex_lock(&f->mu);
    ote_status_t st = io_start(f); /* requests before any registration: refused per slice */
    ote_mutex_unlock(&f->mu);
    return st;
}

/* Slices of at most file_chunk_size: the engine cuts at half a peer's limit. */
static uint32_t files_peer_max_slice(ote__tpeer_t *peer) {
    uint64_t c = peer->f->cfg.file_chunk_size * 2;
    return c > UINT32_MAX ? UINT32_MAX : (uint32_t)c;
}

static ote_status_t files_peer_close(ote__tpeer_t *peer) {
    (void)peer;
    return OTE_OK;
}

static ote_status_t files_tp_destroy(ote__transport_t *tp) {
    (void)tp; /* the engine destroys the owner (ote__files_destroy) */
    return OTE_OK;
}

static const ote__transport_ops_t k_files_ops = {
    .name = "file",
    .address = files_address,
    .peer_open = files_peer_open,
    .peer_ensure = files_peer_ensure,
    .peer_max_slice = files_peer_max_slice,
    .submit = files_submit,
    .cancel = files_cancel,
    .gds_ready = files_gds_ready,
    .peer_close = files_peer_close,
    .destroy = files_tp_destroy,
};

ote__transport_t *ote__files_transport(ote__files_t *f) { return &f->tp; }

ote_status_t ote__files_create(const ote__cfg_t *cfg, ote__files_t **out) {
    ote__files_t *f = ote_calloc(1, sizeof(*f));
    if (f == NULL) return OTE_ERR_NOMEM;
    f->tp.ops = &k_files_ops;
    f->cfg = *cfg;
    f->next_addr = OTE__FILE_ADDR_BASE;
    f->stall[0] = f->stall[1] = -1;
    f->peer.f = f;
    ote_status_t st = ote_mutex_init(&f->mu);
    if (st != OTE_OK) {
        ote_free(f);
        return st;
    }
    st = ote_cond_init(&f->unpinned);
    if (st != OTE_OK) {
        ote_mutex_destroy(&f->mu);
        ote_free(f);
        return st;
    }
    st = ote__fbpool_init(&f->bounce);
    if (st != OTE_OK) {
        ote_cond_destroy(&f->unpinned);
        ote_mutex_destroy(&f->mu);
        ote_free(f);
        return st;
    }
    *out = f;
    return OTE_OK;
}

ote_status_t ote__files_destroy(ote__files_t *f) {
    if (f == NULL) return OTE_OK;
    ote_mutex_lock(&f->mu);
    for (size_t i = 0; i < f->nregs; i++)
        if (atomic_load(&f->regs[i]->inuse) > 0) {
            ote_mutex_unlock(&f->mu);
            return OTE_ERR_BUSY;
        }
    ote_mutex_unlock(&f->mu);
    if (f->io != NULL) ote__fio_destroy(f->io); /* its ring's file table with it */
    if (f->gio != NULL) ote__fio_destroy(f->gio);
    f->io = f->gio = NULL;
    for (size_t i = 0; i < f->nregs; i++) freg_free(f, f->regs[i]);
    ote__gds_destroy(f->gds); /* after every handle (freg_free) */
    ote_free(f->regs);
    for (int i = 0; i < 2; i++)
        if (f->stall[i] >= 0) close(f->stall[i]);
    ote__fbpool_fini(&f->bounce);
    ote_cond_destroy(&f->unpinned);
    ote_mutex_destroy(&f->mu);
    ote_free(f);
    return OTE_OK;
}

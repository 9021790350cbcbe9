/*
 * engine/file/file_io.c - the file owner's I/O engines (file_internal.h).
 *
 * io_uring (liburing): one ring per engine, file_queue_depth slots. Any thread submits
 * (the ring's submission side under mu); one reaper thread takes the completions, goes
 * on with short transfers, adds the fdatasync of a WRITE when file_sync=data, and every
 * 20 ms (its bounded wait) sends IORING_OP_ASYNC_CANCEL to operations whose deadline
 * passed. ote_batch_cancel sends it at once to the canceled ones. A slice waits in the
 * queue while every slot is taken. Each registration's descriptors sit in the ring's
 * sparse registered-file table (FIO_FILES slots, a slot freed at unregister): its SQEs
 * name the slot with IOSQE_FIXED_FILE, sparing the kernel an fd lookup and reference per
 * operation; where the table or a slot is refused (kernel < 5.19, ENOMEM, full) the plain
 * descriptor is used, with one INFO line. The pooled bounce buffers of peers' slices
 * (file_bounce.c) sit in its sparse fixed-buffer table (FIO_BUFS slots): their reads use
 * io_uring_prep_read_fixed; a buffer refused a slot stays a plain one. The kernel counts
 * fixed buffers' pages against the user's RLIMIT_MEMLOCK, summed over every process of
 * the user (unless it holds CAP_IPC_LOCK in the initial user namespace), and so it counts
 * rings' own pages: an engine pins at most a sixteenth of a finite limit (pin_budget),
 * so that its buffers never leave the user's other engines without room for a ring.
 *
 * The thread pool (file_engine=threads, or auto where io_uring_queue_init fails: old
 * kernel, seccomp, the io_uring_disabled sysctl): min(file_queue_depth, 16) threads, each
 * taking a queued slice and moving it with preadv/pwritev (then fdatasync when asked). A
 * pool thread cannot stop a native call once it runs: cancel and deadlines reach queued
 * slices, and an operation stalled by the file.stall fault point (its 10 ms polls).
 *
 * The file.stall fault point (tests): an armed hit makes the slice's operation wait
 * first for a pipe that nothing writes (io_uring: a linked read ahead of it), so that a
 * test holds real operations in flight and watches cancel and deadlines reach them.
 */

#include <errno.h>
#include <liburing.h>
#include <poll.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/fault.h"
#include "base/lock.h"
#include "base/log.h"
#include "base/thread.h"
#include "base/time.h"
#include "engine/file/file_internal.h"

#define FIO_MAX_THREADS 16
#define FIO_FILES 512 /* registered-file slots (two per registration: buffered, O_DIRECT) */
#define FIO_BUFS 64   /* fixed-buffer slots (pooled bounce buffers) */

/* A slice the reaper ended under mu, completed once mu is released. */
typedef struct {
    ote__slice_t *s;
    ote_status_t st;
} fio_end_t;
#define FIO_TICK_NS (20 * OTE_NSEC_PER_MSEC)
/* user_data: gen << 32 | slot << 2 | tag, gen the operation's generation (its fill), so
 * that a completion or cancel of an earlier user of a slot never touches a later one. */
static uint64_t ud_of(const ote__fop_t *op, uint64_t tag) {
    return (uint64_t)op->gen << 32 | (uint64_t)op->slot << 2 | tag;
}
enum { TAG_OP = 0, TAG_STALL = 1, TAG_CANCEL = 2, TAG_WAKE = 3 };

typedef enum { FIO_URING = 0, FIO_THREADS = 1 } fio_kind_t;

struct ote__fio {
    fio_kind_t kind;
    int sync;
    int stall_fd;
    uint32_t depth;
    ote_mutex_t mu; /* the queue, stop, and (io_uring) the submission side and slots */
    ote_cond_t cv;  /* the pool's threads wait here for work */
    ote__slice_t *qhead, *qtail;
    int stop;
    /* io_uring */
    struct io_uring ring;
    ote__slice_t **slots;
    uint32_t *free_slots, nfree;
    pthread_t reaper;
    fio_end_t *ends; /* the reaper's: at most depth slices end per pass */
    uint32_t gen;    /* the last operation's generation (ud_of) */
    char stall_byte;
    int *ffree; /* free registered-file slots, NULL: no table (plain fds) */
    uint32_t nffree;
    int *bfree; /* free fixed-buffer slots, NULL: no table (plain buffers) */
    uint32_t nbfree;
    int buf_refused;            /* the INFO line of the first refused buffer is out */
    uint64_t pinned;            /* bytes the fixed buffers pin */
    uint64_t bpinned[FIO_BUFS]; /* each fixed-buffer slot's pinned bytes */
    /* thread pool */
    pthread_t th[FIO_MAX_THREADS];
    uint32_t nth;
};

static void q_push(ote__fio_t *io, ote__slice_t *s) {
    s->next = NULL;
    if (io->qtail) io->qtail->next = s;
    else io->qhead = s;
    io->qtail = s;
}

/* Take out of the queue every slice for which drop() says why it ends (a status), onto
 * *out. mu held. */
static void q_drop(ote__fio_t *io, ote_status_t (*drop)(ote__slice_t *, uint64_t), uint64_t now,
                   ote__slice_t **out) {
    ote__slice_t **pp = &io->qhead, *last = NULL;
    while (*pp != NULL) {
        ote__slice_t *s = *pp;
        ote_status_t st = drop(s, now);
        if (st == OTE_OK) {
            last = s;
            pp = &s->next;
            continue;
        }
        *pp = s->next;
        ote__fop(s)->stop = ote_status_code(st) == OTE_ERR_CANCELED ? FOP_CANCELED : FOP_TIMED_OUT;
        s->next = *out;
        *out = s;
    }
    io->qtail = last;
}

static ote_status_t drop_canceled(ote__slice_t *s, uint64_t now) {
    (void)now;
    return s->canceled != NULL && atomic_load(s->canceled) ? OTE_ERR_CANCELED : OTE_OK;
}

static ote_status_t drop_stopped(ote__slice_t *s, uint64_t now) {
    ote_status_t st = drop_canceled(s, now);
    return st == OTE_OK && now >= s->deadline ? OTE_ERR_TIMEOUT : st;
}

static ote_status_t stop_status(const ote__fop_t *op) {
    return op->stop == FOP_CANCELED ? OTE_ERR_CANCELED : OTE_ERR_TIMEOUT;
}

static void end_list(ote__slice_t *l) {
    while (l != NULL) {
        ote__slice_t *s = l;
        l = s->next;
        s->next = NULL;
        ote__file_slice_end(s, stop_status(ote__fop(s)));
    }
}

/* ---- io_uring ----------------------------------------------------------------------- */

/* The file.io and file.sync fault points (tests): the kernel's answer to a read or
 * write (file.io) or an fdatasync (file.sync) replaced by the armed errno (EIO when it
 * names none), so that EIO and ENOSPC reach the status as a failing device's would. */
static int fault_errno(ote__fop_t *op) {
    ote_status_t fst;
    bool hit =
        op->state == FOP_SYNC ? ote_fault_hit("file.sync", &fst) : ote_fault_hit("file.io", &fst);
    if (!hit) return 0;
    int err = ote_status_errno(fst);
    return err > 0 ? err : EIO;
}

static int fault_res(ote__fop_t *op, int res) {
    if (res < 0) return res;
    int err = fault_errno(op);
    return err != 0 ? -err : res;
}

static struct io_uring_sqe *sqe_get(ote__fio_t *io) {
    struct io_uring_sqe *e = io_uring_get_sqe(&io->ring);
    if (e == NULL) { /* full: hand what is there to the kernel, then there is room */
        io_uring_submit(&io->ring);
        e = io_uring_get_sqe(&io->ring);
    }
    return e;
}

/* The slice's read, write or fdatasync in its slot (state says which). mu held. */
static void uring_prep_op(ote__fio_t *io, ote__slice_t *s) {
    ote__fop_t *op = ote__fop(s);
    struct io_uring_sqe *e = sqe_get(io);
    int fix = op->direct ? op->reg->dfix : op->reg->fix;
    int fd = fix >= 0 ? fix : op->fd;
    uint8_t *p = s->local + op->done;
    uint32_t n = s->len - op->done;
    if (op->state == FOP_SYNC) {
        io_uring_prep_fsync(e, fd, IORING_FSYNC_DATASYNC);
    } else if (op->fixbuf != 0) { /* a registered bounce buffer */
        if (op->write) io_uring_prep_write_fixed(e, fd, p, n, op->foff + op->done, op->fixbuf - 1);
        else io_uring_prep_read_fixed(e, fd, p, n, op->foff + op->done, op->fixbuf - 1);
    } else if (op->write) {
        io_uring_prep_write(e, fd, p, n, op->foff + op->done);
    } else {
        io_uring_prep_read(e, fd, p, n, op->foff + op->done);
    }
    if (fix >= 0) e->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data64(e, ud_of(op, TAG_OP));
}

/* Queued slices into free slots, and the ring submitted. mu held. */
static void uring_fill(ote__fio_t *io) {
    while (io->nfree > 0 && io->qhead != NULL) {
        ote__slice_t *s = io->qhead;
        io->qhead = s->next;
        if (io->qhead == NULL) io->qtail = NULL;
        s->next = NULL;
        ote__fop_t *op = ote__fop(s);
        op->slot = io->free_slots[--io->nfree];
        op->gen = ++io->gen;
        io->slots[op->slot] = s;
        op->state = FOP_IO;
        if (op->stall) {
            struct io_uring_sqe *e = sqe_get(io);
            io_uring_prep_read(e, io->stall_fd, &io->stall_byte, 1, 0);
            io_uring_sqe_set_data64(e, ud_of(op, TAG_STALL));
            e->flags |= IOSQE_IO_LINK;
        }
        uring_prep_op(io, s);
    }
    io_uring_submit(&io->ring);
}

/* Ask the kernel to stop the slice in flight in slot (and its stall read). mu held. */
static void uring_cancel_slot(ote__fio_t *io, ote__slice_t *s, ote__fop_stop_t why) {
    ote__fop_t *op = ote__fop(s);
    if (op->stop != FOP_LIVE) return;
    op->stop = (uint8_t)why;
    for (int tag = TAG_OP; tag <= TAG_STALL; tag++) {
        if (tag == TAG_STALL && !op->stall) continue;
        struct io_uring_sqe *e = sqe_get(io);
        io_uring_prep_cancel64(e, ud_of(op, (uint64_t)tag), 0);
        io_uring_sqe_set_data64(e, ud_of(op, TAG_CANCEL));
    }
}

static void uring_free_slot(ote__fio_t *io, ote__slice_t *s) {
    io->slots[ote__fop(s)->slot] = NULL;
    io->free_slots[io->nfree++] = ote__fop(s)->slot;
}

/* One completion of slot's operation: *st_out set and 1 when the slice ends, 0 when it
 * goes on (its next operation prepared). mu held. */
static int uring_complete(ote__fio_t *io, ote__slice_t *s, int res, ote_status_t *st_out) {
    ote__fop_t *op = ote__fop(s);
    res = fault_res(op, res);
    if (res < 0) {
        if (op->stop != FOP_LIVE && (res == -ECANCELED || res == -EINTR)) *st_out = stop_status(op);
        else
            *st_out = ote__file_io_error(s, -res,
                                         op->state == FOP_SYNC ? "fdatasync"
                                         : op->write           ? "write"
                                                               : "read");
        return 1;
    }
    if (op->state == FOP_IO) {
        if (res == 0) {
            *st_out =
                ote__file_io_error(s, op->write ? EIO : ENODATA,
                                   op->write ? "write (no progress)" : "read (truncated file)");
            return 1;
        }
        op->done += (uint32_t)res;
        if (op->done < s->len || (op->write && io->sync)) {
            if (op->stop != FOP_LIVE) {
                *st_out = stop_status(op);
                return 1;
            }
            if (op->done == s->len) op->state = FOP_SYNC;
            op->stall = 0;
            uring_prep_op(io, s);
            return 0;
        }
    }
    *st_out = OTE_OK;
    return 1;
}

static void *uring_reaper(void *arg) {
    ote__fio_t *io = arg;
    fio_end_t *ends = io->ends;
    for (;;) {
        struct io_uring_cqe *cqe = NULL;
        struct __kernel_timespec ts = {0, (long long)FIO_TICK_NS};
        (void)io_uring_wait_cqe_timeout(&io->ring, &cqe, &ts);
        size_t n = 0;
        ote__slice_t *stopped = NULL;
        ote_mutex_lock(&io->mu);
        while (io_uring_peek_cqe(&io->ring, &cqe) == 0) {
            uint64_t ud = io_uring_cqe_get_data64(cqe);
            int res = cqe->res;
            io_uring_cqe_seen(&io->ring, cqe);
            uint32_t slot = (uint32_t)(ud & 0xffffffffu) >> 2;
            ote__slice_t *s = (ud & 3) == TAG_OP && slot < io->depth ? io->slots[slot] : NULL;
            if (s != NULL && ote__fop(s)->gen != (uint32_t)(ud >> 32)) s = NULL;
            ote_status_t st;
            if (s == NULL || !uring_complete(io, s, res, &st)) continue;
            uring_free_slot(io, s);
            ends[n++] = (fio_end_t){s, st};
        }
        uint64_t now = ote_now_ns();
        for (uint32_t i = 0; i < io->depth; i++) {
            ote__slice_t *s = io->slots[i];
            if (s != NULL && now >= s->deadline) uring_cancel_slot(io, s, FOP_TIMED_OUT);
        }
        q_drop(io, drop_stopped, now, &stopped);
        uring_fill(io);
        int quit = io->stop && io->nfree == io->depth && io->qhead == NULL;
        ote_mutex_unlock(&io->mu);
        for (size_t i = 0; i < n; i++) ote__file_slice_end(ends[i].s, ends[i].st);
        end_list(stopped);
        if (quit) return NULL;
    }
}

static void uring_free(ote__fio_t *io) {
    io_uring_queue_exit(&io->ring); /* drops the registered-file and buffer tables */
    ote_free(io->ffree);
    ote_free(io->bfree);
    ote_free(io->slots);
    ote_free(io->free_slots);
    ote_free(io->ends);
}

/* The ring's sparse registered-file table, or none (plain fds, one INFO line). */
static void uring_files_init(ote__fio_t *io) {
    int ret = io_uring_register_files_sparse(&io->ring, FIO_FILES);
    if (ret < 0) {
        OTE_INFO("file",
                 "io_uring registered files unavailable (io_uring_register_files_sparse: %s): "
                 "operations name plain descriptors",
                 strerror(-ret));
        return;
    }
    io->ffree = ote_calloc(FIO_FILES, sizeof(*io->ffree));
    if (io->ffree == NULL) {
        (void)io_uring_unregister_files(&io->ring);
        OTE_INFO("file", "io_uring registered files: no memory; operations name plain descriptors");
        return;
    }
    for (int i = 0; i < FIO_FILES; i++) io->ffree[i] = FIO_FILES - 1 - i;
    io->nffree = FIO_FILES;
}

/* The bytes this engine's fixed buffers may pin: a sixteenth of a finite RLIMIT_MEMLOCK
 * (the kernel refuses a ring, io_uring_queue_init ENOMEM, to a user whose pinned pages
 * reached it), all of an unlimited one. Read at each buffer: a limit lowered meanwhile
 * counts. */
static uint64_t pin_budget(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0) return 0;
    return rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_cur / 16;
}

/* The ring's sparse fixed-buffer table, or none (plain buffers, one INFO line). */
static void uring_bufs_init(ote__fio_t *io) {
    int ret = io_uring_register_buffers_sparse(&io->ring, FIO_BUFS);
    io->bfree = ret == 0 ? ote_calloc(FIO_BUFS, sizeof(*io->bfree)) : NULL;
    if (io->bfree == NULL) {
        if (ret == 0) (void)io_uring_unregister_buffers(&io->ring);
        OTE_INFO("file",
                 "io_uring fixed buffers unavailable (io_uring_register_buffers_sparse: %s): "
                 "bounce buffers are read and written as plain ones",
                 strerror(ret < 0 ? -ret : ENOMEM));
        return;
    }
    for (int i = 0; i < FIO_BUFS; i++) io->bfree[i] = FIO_BUFS - 1 - i;
    io->nbfree = FIO_BUFS;
}

static ote_status_t uring_start(ote__fio_t *io) {
    int ret;
    ote_status_t fst;
    if (ote_fault_hit("file.uring_init", &fst)) ret = -ENOSYS;
    else ret = io_uring_queue_init(io->depth * 2 < 8 ? 8 : io->depth * 2, &io->ring, 0);
    if (ret < 0) return ote_status_make(OTE_ERR_UNSUPPORTED, -ret);
    io->slots = ote_calloc(io->depth, sizeof(*io->slots));
    io->free_slots = ote_calloc(io->depth, sizeof(*io->free_slots));
    io->ends = ote_calloc(io->depth, sizeof(*io->ends));
    if (io->slots == NULL || io->free_slots == NULL || io->ends == NULL) {
        uring_free(io);
        return OTE_ERR_NOMEM;
    }
    for (uint32_t i = 0; i < io->depth; i++) io->free_slots[i] = io->depth - 1 - i;
    io->nfree = io->depth;
    uring_files_init(io);
    uring_bufs_init(io);
    if (ote_thread_create(&io->reaper, NULL, uring_reaper, io) != 0) {
        uring_free(io);
        return OTE_ERR_NOMEM;
    }
    return OTE_OK;
}

/* ---- the thread pool ---------------------------------------------------------------- */

/* The stalled operation (file.stall): its pipe never becomes readable; it ends when its
 * slice is canceled or its deadline passes. */
static ote_status_t pool_stall(ote__fio_t *io, ote__slice_t *s) {
    for (;;) {
        if (s->canceled != NULL && atomic_load(s->canceled)) return OTE_ERR_CANCELED;
        if (ote_deadline_expired(s->deadline)) return OTE_ERR_TIMEOUT;
        struct pollfd p = {io->stall_fd, POLLIN, 0};
        (void)poll(&p, 1, 10);
    }
}

static ote_status_t pool_run(ote__fio_t *io, ote__slice_t *s) {
    ote__fop_t *op = ote__fop(s);
    ote_status_t st = drop_stopped(s, ote_now_ns());
    if (st == OTE_OK && op->stall) st = pool_stall(io, s);
    if (st != OTE_OK) return st;
    op->state = FOP_IO;
    int err = fault_errno(op);
    if (err != 0) return ote__file_io_error(s, err, op->write ? "pwritev" : "preadv");
    if (op->gds) { /* GPUDirect Storage (gds.c): device memory, one cuFile call */
        st = ote__gds_move(s);
        if (st != OTE_OK) return st;
        op->done = s->len;
    }
    while (op->done < s->len) {
        struct iovec v = {s->local + op->done, s->len - op->done};
        ssize_t r = op->write ? pwritev(op->fd, &v, 1, (off_t)(op->foff + op->done))
                              : preadv(op->fd, &v, 1, (off_t)(op->foff + op->done));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return ote__file_io_error(s, errno, op->write ? "pwritev" : "preadv");
        if (r == 0)
            return ote__file_io_error(
                s, op->write ? EIO : ENODATA,
                op->write ? "pwritev (no progress)" : "preadv (truncated file)");
        op->done += (uint32_t)r;
    }
    if (op->write && io->sync) {
        op->state = FOP_SYNC;
        err = fault_errno(op);
        if (err == 0 && fdatasync(op->fd) != 0) err = errno;
        if (err != 0) return ote__file_io_error(s, err, "fdatasync");
    }
    return OTE_OK;
}

static void *pool_thread(void *arg) {
    ote__fio_t *io = arg;
    for (;;) {
        ote_mutex_lock(&io->mu);
        while (io->qhead == NULL && !io->stop)
            (void)ote_cond_wait(&io->cv, &io->mu, ote_deadline_after(100 * OTE_NSEC_PER_MSEC));
        ote__slice_t *s = io->qhead;
        if (s != NULL) {
            io->qhead = s->next;
            if (io->qhead == NULL) io->qtail = NULL;
            s->next = NULL;
        }
        ote_mutex_unlock(&io->mu);
        if (s == NULL) return NULL; /* stopping, nothing queued */
        ote__file_slice_end(s, pool_run(io, s));
    }
}

static ote_status_t pool_start(ote__fio_t *io) {
    io->nth = io->depth < FIO_MAX_THREADS ? io->depth : FIO_MAX_THREADS;
    for (uint32_t i = 0; i < io->nth; i++) {
        if (ote_thread_create(&io->th[i], NULL, pool_thread, io) == 0) continue;
        ote_mutex_lock(&io->mu);
        io->stop = 1;
        ote_cond_broadcast(&io->cv);
        ote_mutex_unlock(&io->mu);
        for (uint32_t j = 0; j < i; j++) pthread_join(io->th[j], NULL);
        return OTE_ERR_NOMEM;
    }
    return OTE_OK;
}

/* ---- the interface ------------------------------------------------------------------ */

ote_status_t ote__fio_create(const char *mode, uint32_t depth, int sync, int stall_fd,
                             ote__fio_t **out) {
    ote__fio_t *io = ote_calloc(1, sizeof(*io));
    if (io == NULL) return OTE_ERR_NOMEM;
    io->depth = depth;
    io->sync = sync;
    io->stall_fd = stall_fd;
    ote_status_t st = ote_mutex_init(&io->mu);
    if (st == OTE_OK && (st = ote_cond_init(&io->cv)) != OTE_OK) ote_mutex_destroy(&io->mu);
    if (st != OTE_OK) {
        ote_free(io);
        return st;
    }
    io->kind = strcmp(mode, "threads") == 0 ? FIO_THREADS : FIO_URING;
    if (io->kind == FIO_URING) {
        st = uring_start(io);
        if (ote_status_code(st) == OTE_ERR_UNSUPPORTED && strcmp(mode, "auto") == 0) {
            OTE_INFO("file",
                     "io_uring unavailable (io_uring_queue_init: %s): file I/O goes through a "
                     "pool of %u preadv/pwritev threads",
                     strerror(ote_status_errno(st)),
                     depth < FIO_MAX_THREADS ? depth : FIO_MAX_THREADS);
            io->kind = FIO_THREADS;
        } else if (st != OTE_OK) {
            OTE_WARN("file", "file_engine=%s: io_uring_queue_init failed: %s", mode,
                     ote_status_str(st));
        }
    }
    if (io->kind == FIO_THREADS) st = pool_start(io);
    if (st != OTE_OK) {
        ote_cond_destroy(&io->cv);
        ote_mutex_destroy(&io->mu);
        ote_free(io);
        return st;
    }
    *out = io;
    return OTE_OK;
}

const char *ote__fio_kind(const ote__fio_t *io) {
    return io->kind == FIO_URING ? "io_uring" : "threads";
}

void ote__fio_submit(ote__fio_t *io, ote__slice_t *s) {
    ote_mutex_lock(&io->mu);
    q_push(io, s);
    if (io->kind == FIO_URING) uring_fill(io);
    else ote_cond_signal(&io->cv);
    ote_mutex_unlock(&io->mu);
}

int ote__fio_file_add(ote__fio_t *io, int fd, const char *what) {
    if (io->kind != FIO_URING || fd < 0) return -1;
    ote_mutex_lock(&io->mu);
    int slot = -1, ret = -ENFILE;
    if (io->ffree != NULL && io->nffree > 0) {
        ote_status_t fst;
        slot = io->ffree[io->nffree - 1];
        if (ote_fault_hit("file.fixed_file", &fst)) ret = -ENOMEM;
        else ret = io_uring_register_files_update(&io->ring, (unsigned)slot, &fd, 1);
        if (ret == 1) io->nffree--;
        else slot = -1;
    }
    int table = io->ffree != NULL;
    ote_mutex_unlock(&io->mu);
    if (slot < 0 && table)
        OTE_INFO("file", "%s: no io_uring registered-file slot (%s): its operations name fd %d",
                 what, ret == -ENFILE ? "all taken" : strerror(-ret), fd);
    return slot;
}

void ote__fio_file_remove(ote__fio_t *io, int slot) {
    if (slot < 0) return;
    int none = -1;
    ote_mutex_lock(&io->mu);
    int ret = io_uring_register_files_update(&io->ring, (unsigned)slot, &none, 1);
    if (ret == 1) io->ffree[io->nffree++] = slot;
    ote_mutex_unlock(&io->mu);
    if (ret != 1) /* the slot stays taken: never handed to another descriptor */
        OTE_WARN("file", "io_uring: emptying registered-file slot %d failed: %s", slot,
                 strerror(-ret));
}

int ote__fio_buf_add(ote__fio_t *io, void *data, size_t len) {
    if (io == NULL || io->kind != FIO_URING) return -1;
    struct iovec v = {data, len};
    /* The pages the kernel pins for it. */
    const uint64_t pg = 4096, a = (uintptr_t)data / pg * pg,
                   cost = ((uintptr_t)data + len + pg - 1) / pg * pg - a;
    const uint64_t budget = pin_budget();
    ote_mutex_lock(&io->mu);
    int slot = -1, ret = -ENFILE, first = 0;
    if (io->bfree != NULL && io->pinned + cost > budget) ret = -EDQUOT;
    else if (io->bfree != NULL && io->nbfree > 0) {
        slot = io->bfree[io->nbfree - 1];
        ret = io_uring_register_buffers_update_tag(&io->ring, (unsigned)slot, &v, NULL, 1);
        if (ret == 1) {
            io->nbfree--;
            io->bpinned[slot] = cost;
            io->pinned += cost;
        } else {
            slot = -1;
        }
    }
    if (slot < 0 && io->bfree != NULL && !io->buf_refused) first = io->buf_refused = 1;
    ote_mutex_unlock(&io->mu);
    if (first && ret == -EDQUOT)
        OTE_INFO("file",
                 "a bounce buffer of %zu bytes got no io_uring fixed-buffer slot (it would "
                 "pass this engine's share of RLIMIT_MEMLOCK, %llu bytes): it and later "
                 "refused ones are read and written as plain buffers",
                 len, (unsigned long long)budget);
    else if (first)
        OTE_INFO("file",
                 "a bounce buffer of %zu bytes got no io_uring fixed-buffer slot (%s): it and "
                 "later refused ones are read and written as plain buffers",
                 len, ret == -ENFILE ? "all taken" : strerror(-ret));
    else if (slot >= 0)
        OTE_DEBUG("file", "a bounce buffer of %zu bytes is io_uring fixed buffer %d", len, slot);
    return slot;
}

void ote__fio_buf_remove(ote__fio_t *io, int slot) {
    if (io == NULL || slot < 0) return;
    struct iovec v = {NULL, 0};
    ote_mutex_lock(&io->mu);
    int ret = io_uring_register_buffers_update_tag(&io->ring, (unsigned)slot, &v, NULL, 1);
    if (ret == 1) {
        io->bfree[io->nbfree++] = slot;
        io->pinned -= io->bpinned[slot];
        io->bpinned[slot] = 0;
    }
    ote_mutex_unlock(&io->mu);
    if (ret != 1) /* the slot stays taken (and the memory pinned until the ring goes) */
        OTE_WARN("file", "io_uring: emptying fixed-buffer slot %d failed: %s", slot,
                 strerror(-ret));
}

void ote__fio_cancel(ote__fio_t *io) {
    ote__slice_t *dropped = NULL;
    ote_mutex_lock(&io->mu);
    q_drop(io, drop_canceled, 0, &dropped);
    if (io->kind == FIO_URING) {
        for (uint32_t i = 0; i < io->depth; i++) {
            ote__slice_t *s = io->slots[i];
            if (s != NULL && s->canceled != NULL && atomic_load(s->canceled))
                uring_cancel_slot(io, s, FOP_CANCELED);
        }
        io_uring_submit(&io->ring);
    }
    ote_mutex_unlock(&io->mu);
    end_list(dropped);
}

void ote__fio_destroy(ote__fio_t *io) {
    ote_mutex_lock(&io->mu);
    io->stop = 1;
    ote_cond_broadcast(&io->cv);
    ote_mutex_unlock(&io->mu);
    if (io->kind == FIO_URING) {
        pthread_join(io->reaper, NULL); /* it wakes every FIO_TICK_NS */
        uring_free(io);
    } else {
        for (uint32_t i = 0; i < io->nth; i++) pthread_join(io->th[i], NULL);
    }
    ote_cond_destroy(&io->cv);
    ote_mutex_destroy(&io->mu);
    ote_free(io);
}

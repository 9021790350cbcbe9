/*
 * engine/file/file_internal.h - shared by the file owner's two files: file.c (the
 * registrations and the local segment's transport ops) and file_io.c (the I/O engines:
 * io_uring, and the preadv/pwritev thread pool that takes over where io_uring is not
 * available), and gds.c (GPUDirect Storage: device memory <-> file through libcufile).
 * Nothing outside engine/file includes it.
 */
#ifndef OTE_ENGINE_FILE_FILE_INTERNAL_H
#define OTE_ENGINE_FILE_FILE_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>

#include "base/lock.h"
#include "engine/file/file.h"
#include "engine/transport.h"

/* O_DIRECT alignment of the file offset, the length and the memory address of one
 * operation. 4 KiB covers every logical block size in use (512 B and 4 KiB). */
#define OTE__FILE_DIO_ALIGN 4096u

/* One file registration. fd and dfd are the owner's own descriptors, closed at
 * unregister; inuse counts the slices in flight on it (unregister is BUSY). */
typedef struct ote__gds ote__gds_t;

typedef struct ote__freg {
    ote__pin_t pin;     /* first: host->pin's answer (kind OTE_MEM_FILE, perms) */
    uint64_t addr, len; /* the address range requests name */
    uint64_t off;       /* file offset of addr */
    int fd;             /* buffered */
    int dfd;            /* O_DIRECT, or -1 where the file system refuses it */
    unsigned perms;     /* OTE_PERM_READ / OTE_PERM_WRITE (also in pin) */
    _Atomic long inuse;
    char name[OTE_NAME_MAX + 1];
    char path[256]; /* for log lines */
    /* gds.c: the cuFile handle of the descriptor (NULL until the first GPUDirect Storage
     * slice on it) and the owner that registered it. */
    void *gds_fh;
    ote__gds_t *gds;
} ote__freg_t;

/* What one slice is while the file owner holds it: its record in the slice's transport
 * scratch (ote__slice_t.xp), from submit until done(). */
/* Bounce buffers of peers' slices (file_bounce.c): 4 KiB-aligned, in power-of-two classes
 * of 4 KiB .. 64 MiB, up to OTE__FILE_BOUNCE_KEEP free ones kept per class. */
#define OTE__FILE_BOUNCE_CLASSES 15
#define OTE__FILE_BOUNCE_KEEP 32

typedef struct ote__fbuf {
    struct ote__fbuf *next; /* the pool's free list */
    ote__freg_t *reg;       /* the registration the slice serves (bounce_get) */
    uint32_t len;           /* the slice's bytes */
    int cls;                /* its class, -1: over the largest (freed when given back) */
    uint64_t cap;           /* bytes at data */
    uint8_t *data;          /* OTE__FILE_DIO_ALIGN-aligned */
} ote__fbuf_t;

typedef struct {
    ote_mutex_t mu;
    ote__fbuf_t *free[OTE__FILE_BOUNCE_CLASSES];
    uint32_t nfree[OTE__FILE_BOUNCE_CLASSES];
} ote__fbpool_t;

ote_status_t ote__fbpool_init(ote__fbpool_t *p);
void ote__fbpool_fini(ote__fbpool_t *p); /* every buffer given back */
/* A buffer of at least len bytes (its reg and len for the caller to set); NULL: no memory. */
ote__fbuf_t *ote__fbpool_get(ote__fbpool_t *p, uint32_t len);
void ote__fbpool_put(ote__fbpool_t *p, ote__fbuf_t *b);

typedef enum {
    FOP_QUEUED = 0, /* waiting for a queue slot (or a pool thread) */
    FOP_IO,         /* its read or write is in flight */
    FOP_SYNC,       /* its fdatasync is in flight (file_sync=data) */
} ote__fop_state_t;

typedef enum {
    FOP_LIVE = 0,     /* not asked to stop */
    FOP_CANCELED,     /* ote_batch_cancel reached it */
    FOP_TIMED_OUT,    /* its deadline passed */
    FOP_STALL_CANCEL, /* a cancel was sent to its stall read (file.stall) */
} ote__fop_stop_t;

typedef struct {
    ote__freg_t *reg;
    uint64_t foff;  /* file offset of the slice's first byte */
    uint32_t done;  /* bytes moved so far (a short transfer is continued) */
    int fd;         /* reg->fd or reg->dfd */
    uint8_t write;  /* 1: memory -> file */
    uint8_t direct; /* fd is the O_DIRECT one */
    uint8_t state;  /* ote__fop_state_t */
    uint8_t stop;   /* ote__fop_stop_t */
    uint8_t stall;  /* file.stall armed: a never-ending pipe read runs first */
    uint8_t gds;    /* local is device memory moved by GPUDirect Storage (gds.c) */
    uint32_t slot;  /* io_uring: its slot */
    uint32_t gen;   /* io_uring: its generation in the slot (user_data) */
} ote__fop_t;

_Static_assert(sizeof(ote__fop_t) <= OTE__SLICE_SCRATCH, "ote__fop_t must fit a slice's scratch");

static inline ote__fop_t *ote__fop(ote__slice_t *s) { return (ote__fop_t *)(void *)s->xp; }

/* ---- file_io.c ---------------------------------------------------------------------- */
typedef struct ote__fio ote__fio_t;
/* The I/O engine of cfg's file_engine ("auto": io_uring, else the thread pool with one
 * INFO line), cfg->file_queue_depth deep; sync: fdatasync after each write. stall_fd:
 * the read end of a pipe nothing writes (the file.stall fault point's). */
ote_status_t ote__fio_create(const char *mode, uint32_t depth, int sync, int stall_fd,
                             ote__fio_t **out);
/* Stops its threads (bounded waits) after every operation ended; frees it. */
void ote__fio_destroy(ote__fio_t *io);
/* "io_uring" or "threads". */
const char *ote__fio_kind(const ote__fio_t *io);
/* Start the slice (its ote__fop_t filled, state FOP_QUEUED); it ends through
 * ote__file_slice_end exactly once. */
void ote__fio_submit(ote__fio_t *io, ote__slice_t *s);
/* Every slice whose canceled flag is set: queued ones end CANCELED now, in-flight ones
 * are asked to stop (io_uring: IORING_OP_ASYNC_CANCEL). */
void ote__fio_cancel(ote__fio_t *io);

/* ---- file.c ------------------------------------------------------------------------- */
/* The I/O of s ended with st (OTE_OK: every byte moved, synced when asked): unpin its
 * registration and complete the slice. No lock of the I/O engine held. */
void ote__file_slice_end(ote__slice_t *s, ote_status_t st);
/* The status of a failed native file call (errno err) of s, logged once per slice. */
ote_status_t ote__file_io_error(ote__slice_t *s, int err, const char *what);

/* ---- gds.c -------------------------------------------------------------------------- */
/* libcufile loaded ($OTE_CUFILE_LIBRARY, else libcufile.so.0) and its driver opened;
 * OTE_ERR_NO_DEVICE with INFO lines where it is absent (requests are then staged). */
ote_status_t ote__gds_create(ote__gds_t **out);
/* cuFileDriverClose; every registration's handle must have been closed. */
void ote__gds_destroy(ote__gds_t *g);
/* The registration's cuFile handle, registered once (a failure: the slice is staged). */
ote_status_t ote__gds_reg_open(ote__gds_t *g, ote__freg_t *r);
/* Deregisters the registration's handle, if it has one (before its descriptors close). */
void ote__gds_reg_close(ote__freg_t *r);
/* The slice's whole transfer by one cuFileRead or cuFileWrite, its device range
 * registered with cuFile for the call: OTE_ERR_UNSUPPORTED with nothing moved when the
 * range does not register (the engine stages it), OTE_ERR_IO / OTE_ERR_NATIVE for a failed
 * call. A pool thread of the file owner's GDS pool runs it (file_io.c). */
ote_status_t ote__gds_move(ote__slice_t *s);

#endif

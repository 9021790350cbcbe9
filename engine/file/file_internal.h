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

/* The O_DIRECT alignment (file offset, length and memory address) assumed where statx
 * does not report STATX_DIOALIGN (kernel < 6.1, a file system that does not fill it), and
 * the bounce buffers' alignment. 4 KiB covers every logical block size in use. */
#define OTE__FILE_DIO_ALIGN 4096u

/* One file registration. fd and dfd are the owner's own descriptors, closed at
 * unregister; inuse counts the slices in flight on it (unregister is BUSY, and waits for
 * the last one: ote__freg_unpin wakes it). */
typedef struct ote__gds ote__gds_t;

typedef struct ote__freg {
    ote__pin_t pin;     /* first: host->pin's answer (kind OTE_MEM_FILE, perms) */
    uint64_t addr, len; /* the address range requests name */
    uint64_t off;       /* file offset of addr */
    int fd;             /* buffered */
    int dfd;            /* O_DIRECT, or -1 where the file system refuses it */
    unsigned perms;     /* OTE_PERM_READ / OTE_PERM_WRITE (also in pin) */
    /* O_DIRECT alignment of the memory address, and of the file offset and length, from
     * statx(STATX_DIOALIGN) at registration (else OTE__FILE_DIO_ALIGN): ote__freg_direct.
     * dio_woff: a write's offset and length alignment, dio_off but at least a page (a
     * sub-page O_DIRECT write may race a buffered write of the same page's other bytes,
     * and the page cache's copy of that page then overwrites it at writeback). */
    uint32_t dio_mem, dio_off, dio_woff;
    /* The io_uring ring's registered-file slots of fd and dfd (IOSQE_FIXED_FILE), -1
     * where the plain descriptor is used (ote__fio_file_add). */
    int fix, dfix;
    _Atomic long inuse;
    struct ote__files *owner; /* whose unregister waits for inuse to reach 0 */
    char name[OTE_NAME_MAX + 1];
    char path[256]; /* for log lines */
    /* gds.c: the cuFile handle of the descriptor (NULL until the first GPUDirect Storage
     * slice on it) and the owner that registered it. */
    void *gds_fh;
    ote__gds_t *gds;
    /* file_map.c: [off, +len) mapped read-only and shared from off rounded down to a page
     * (map + map_skew is addr's byte), for peers' READs of ranges the page cache holds;
     * NULL where not mapped (no OTE_PERM_READ, file_zero_copy=off, mmap refused). */
    uint8_t *map;
    size_t map_len, map_skew;
    int map_blk; /* a block device: it cannot shrink under the mapping */
} ote__freg_t;

/* What one slice is while the file owner holds it: its record in the slice's transport
 * scratch (ote__slice_t.xp), from submit until done(). */
/* Bounce buffers of peers' slices (file_bounce.c): 4 KiB-aligned, in power-of-two classes
 * of 4 KiB .. 64 MiB; the first OTE__FILE_BOUNCE_KEEP made in a class are kept (given
 * back to the pool, freed only by ote__fbpool_fini), the others spares (up to
 * OTE__FILE_BOUNCE_KEEP free ones per class wait for reuse, the rest freed). */
#define OTE__FILE_BOUNCE_CLASSES 15
#define OTE__FILE_BOUNCE_KEEP 32

typedef struct ote__fbuf {
    struct ote__fbuf *next; /* the pool's free list */
    ote__freg_t *reg;       /* the registration the slice serves (bounce_get) */
    uint32_t len;           /* the slice's bytes */
    int cls;                /* its class, -1: over the largest (freed when given back) */
    uint64_t cap;           /* bytes at data */
    uint8_t *data;          /* OTE__FILE_DIO_ALIGN-aligned */
    int fixbuf;             /* its io_uring fixed-buffer slot, -1: a plain buffer */
    int kept;               /* one of its class's kept buffers (freed only by the fini) */
    /* bounce_io_start: the read as a slice of the I/O engine (its fop in slice.xp) and
     * whom to tell when it ends. */
    ote__slice_t slice;
    void (*done)(void *, ote_status_t);
    void *done_arg;
} ote__fbuf_t;

typedef struct {
    ote_mutex_t mu;
    ote__fbuf_t *free[OTE__FILE_BOUNCE_CLASSES];  /* kept buffers given back */
    ote__fbuf_t *spare[OTE__FILE_BOUNCE_CLASSES]; /* spares given back */
    uint32_t nspare[OTE__FILE_BOUNCE_CLASSES];
    uint32_t nkept[OTE__FILE_BOUNCE_CLASSES]; /* kept buffers made so far */
} ote__fbpool_t;

ote_status_t ote__fbpool_init(ote__fbpool_t *p);
void ote__fbpool_fini(ote__fbpool_t *p); /* every buffer given back */
/* A buffer of at least len bytes (its reg and len for the caller to set); NULL: no memory. */
struct ote__fio;
/* io: the I/O engine whose ring a new pooled buffer is registered with as a fixed buffer
 * (ote__fio_buf_add; NULL: none). */
ote__fbuf_t *ote__fbpool_get(ote__fbpool_t *p, uint32_t len, struct ote__fio *io);
/* io: the same engine (its slot emptied when the buffer is freed), NULL once it is gone. */
void ote__fbpool_put(ote__fbpool_t *p, ote__fbuf_t *b, struct ote__fio *io);
/* 1 when b is a kept buffer (its memory the same until ote__fbpool_fini): *base_out and
 * *size_out the whole buffer; 0 otherwise. */
int ote__fbpool_kept(const ote__fbuf_t *b, uint8_t **base_out, uint64_t *size_out);

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
    uint64_t foff;   /* file offset of the slice's first byte */
    uint32_t done;   /* bytes moved so far (a short transfer is continued) */
    int fd;          /* reg->fd or reg->dfd */
    uint8_t write;   /* 1: memory -> file */
    uint8_t direct;  /* fd is the O_DIRECT one */
    uint8_t state;   /* ote__fop_state_t */
    uint8_t stop;    /* ote__fop_stop_t */
    uint8_t stall;   /* file.stall armed: a never-ending pipe read runs first */
    uint8_t gds;     /* local is device memory moved by GPUDirect Storage (gds.c) */
    uint16_t fixbuf; /* io_uring: the fixed-buffer slot + 1 of its memory, 0: none */
    uint32_t slot;   /* io_uring: its slot */
    uint32_t gen;    /* io_uring: its generation in the slot (user_data) */
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
/* A slot of io's registered-file table holding fd (its operations then name the slot
 * with IOSQE_FIXED_FILE), or -1: the plain fd is used (the thread pool; a ring without
 * the table; the table full or the kernel refusing it: one INFO line naming what). */
int ote__fio_file_add(ote__fio_t *io, int fd, const char *what);
/* The slot emptied and free for the next ote__fio_file_add (no operation uses it). */
void ote__fio_file_remove(ote__fio_t *io, int slot);
/* A slot of io's fixed-buffer table holding [data, +len) (its reads and writes then use
 * io_uring_prep_read_fixed / write_fixed), or -1: a plain buffer (the thread pool, no
 * table, the table full, the kernel refusing it: ENOMEM past RLIMIT_MEMLOCK; one INFO
 * line for the first refusal). */
int ote__fio_buf_add(ote__fio_t *io, void *data, size_t len);
/* The slot emptied and free again (no operation uses the buffer). */
void ote__fio_buf_remove(ote__fio_t *io, int slot);
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
/* The slice's whole transfer by one cuFileRead or cuFileWrite, through its engine
 * registration's kept cuFile registration, else its own range registered with cuFile for
 * the call: OTE_ERR_UNSUPPORTED with nothing moved when the range does not register (the
 * engine stages it), OTE_ERR_IO / OTE_ERR_NATIVE for a failed call. A pool thread of the
 * file owner's GDS pool runs it (file_io.c). */
ote_status_t ote__gds_move(ote__slice_t *s);
/* The engine's device registration at base is going (no request holds it): its kept
 * cuFile registration, if any, is deregistered. g may be NULL (libcufile never loaded). */
void ote__gds_dev_unregister(ote__gds_t *g, uint64_t base);
/* Every kept cuFile registration deregistered (no slice in flight): the engine's destroy,
 * before the CUDA layer lets the device go. g may be NULL. */
void ote__gds_release(ote__gds_t *g);

/* Whether an operation of len bytes at file offset foff with memory buf goes O_DIRECT:
 * r has an O_DIRECT descriptor and all three meet r's alignment (a write's offset and
 * length: dio_woff), file.c. */
int ote__freg_direct(const ote__freg_t *r, uint64_t foff, uint64_t len, const void *buf, int write);

/* ---- file_map.c ---------------------------------------------------------------------- */
/* Map r's range for zero-copy READs (r->fd, r->off, r->len, r->perms set); an INFO line
 * and r->map NULL where mmap refuses. */
void ote__freg_map(ote__freg_t *r);
void ote__freg_unmap(ote__freg_t *r);
/* host->file.map_read for r: OTE_OK with *ptr_out when the page cache holds all of
 * [addr, +len) and the file still covers it; OTE_ERR_AGAIN otherwise; OTE_ERR_UNSUPPORTED
 * without a mapping. */
ote_status_t ote__freg_map_read(const ote__freg_t *r, uint64_t addr, uint32_t len,
                                const uint8_t **ptr_out);
/* Whether r is mapped and the page cache holds some page of the file's [foff, +len): a
 * read of such a range that is not sent from the page cache goes through it (buffered),
 * so that it serves what it holds and keeps the pages it reads; O_DIRECT, which neither
 * reads from it nor fills it, would leave the range's holes open for every later READ. */
int ote__freg_map_partly(const ote__freg_t *r, uint64_t foff, uint64_t len);
/* host->file.map_failed for r (transport.h). */
ote_status_t ote__freg_map_failed(const ote__freg_t *r, uint64_t addr, uint32_t len,
                                  ote_status_t st);

/* Drop one count of r->inuse; the last wakes the unregisters waiting for it (file.c). */
void ote__freg_unpin(ote__freg_t *r);

#endif

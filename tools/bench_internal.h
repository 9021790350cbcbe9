/*
 * tools/bench_internal.h - what the files of ote_bench share: the stop flag, the engine
 * and buffer helpers, and one prototype block per file. Not a library header: only the
 * ote_bench binary includes it.
 *
 *   ote_bench.c        main, signals, engine and buffer helpers
 *   bench_target.c     --role target: the registered buffer and its control requests
 *   bench_child.c      the initiator's spawned target child and its control client
 *   bench_run.c        one measured result: worker threads, batches, latency samples
 *   bench_initiator.c  the initiator: connect, sweep the options, check, print
 *   bench_mem.c        buffers of host or CUDA device memory, filled and checked
 *
 * Threads: the workers of bench_run.c touch only their own worker_t and the atomics and
 * mutex of their run_t; everything else runs on the main thread.
 */
#ifndef OTE_TOOLS_BENCH_INTERNAL_H
#define OTE_TOOLS_BENCH_INTERNAL_H

#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <ote/ote.h>

#include "base/lock.h"
#include "tools/bench_lib.h"

/* The name the target registers its buffer under: initiators find it by buffer
 * discovery (ote_segment_buffers). */
#define BENCH_BUFFER_NAME "ote_bench"

#define CTL_TIMEOUT_NS (60ull * OTE_NSEC_PER_SEC) /* VERIFY of a large buffer takes a while */
#define SPAWN_TIMEOUT_NS (60ull * OTE_NSEC_PER_SEC)
#define RECV_SLICE_NS (100ull * OTE_NSEC_PER_MSEC) /* how often waits look at signals */
#define LAT_SAMPLES_TOTAL (1u << 22)               /* kept latency samples per result */
#define MSG_MAX 256

/* Set by SIGINT/SIGTERM: every loop of the program looks at it. */
extern volatile sig_atomic_t bench__stop;

void bench__print_status(const char *what, ote_status_t st);
/* --stats (bench_stats.c): the engine's counters on stdout, as lines after the table or as
 * one JSON line {"stats":{...}}; 0, or 1 when they cannot be read. */
int bench__print_stats(ote_engine_t *engine, bool json);
/* An anonymous, populated mapping of len bytes; NULL on failure. */
void *bench__map_buffer(uint64_t len);
/* Engine with the transport and addresses of the options. */
ote_status_t bench__make_engine(const bench_options_t *o, const char *listen,
                                ote_engine_t **engine_out);

/* ---- bench_mem.c ---- */
struct ote_cuda_driver;
struct ote_cuda_device;
struct ote_cuda_alloc;
/* A buffer of host memory or of CUDA device memory (BENCH_MEM_*). */
typedef struct {
    unsigned kind;
    uint64_t len;
    uint64_t addr;        /* where it is (device memory: not host-addressable) */
    uint8_t *host;        /* host memory: the mapping; NULL for device memory */
    ote_engine_t *engine; /* BENCH_MEM_SHARED: the engine that allocated it; BENCH_MEM_FILE:
                           * the engine that registered the file */
    int fd;               /* BENCH_MEM_FILE: our descriptor (fill and check); else -1 */
    struct ote_cuda_driver *drv;
    struct ote_cuda_device *dev;
    struct ote_cuda_alloc *alloc;
} bench_mem_t;
/* Returns 0, or -1 after saying why. engine is the engine that will use the buffer: a
 * BENCH_MEM_SHARED buffer is its ote_memory_alloc_shared allocation, a BENCH_MEM_FILE
 * buffer the file at path (created, or grown to len, when shorter) registered with it for
 * READ and WRITE under BENCH_BUFFER_NAME, addr its address window (the other kinds
 * ignore engine and path; they may be NULL for them). */
int bench__mem_create(ote_engine_t *engine, unsigned kind, const char *path, uint64_t len,
                      bench_mem_t *m);
/* A BENCH_MEM_SHARED buffer goes back with ote_memory_free_shared and a BENCH_MEM_FILE one
 * is unregistered, so for them call this after unregistering the buffer (shared) and before
 * destroying its engine. */
void bench__mem_destroy(bench_mem_t *m);
/* The --check pattern (bench_pattern_*) into / out of [off, off+len): 0 ok, -1 failed,
 * bench__mem_check 1 with *bad_out the first differing offset. */
int bench__mem_fill(bench_mem_t *m, uint64_t off, uint64_t len, uint64_t seed);
int bench__mem_zero(bench_mem_t *m, uint64_t off, uint64_t len);
int bench__mem_check(bench_mem_t *m, uint64_t off, uint64_t len, uint64_t seed, uint64_t *bad_out);
int bench__mem_corrupt(bench_mem_t *m, uint64_t off);
/* The buffer's part of a control request (FILL, ZERO, VERIFY of [off, off+len) of a
 * len_total-byte buffer) into rep (verb OK, BAD with the offset, or ERR with a reason).
 * The target serves its peers' requests with it, and an initiator its own file
 * (--local-mem file:PATH). Returns false for any other verb (rep untouched). */
bool bench__mem_serve(bench_mem_t *m, uint64_t len_total, const bench_ctl_msg_t *req,
                      bench_ctl_msg_t *rep);

/* ---- bench_target.c ---- */
int bench__run_target(const bench_options_t *o);

/* ---- bench_child.c ---- */
typedef struct {
    pid_t pid;    /* 0 when no child */
    int lifeline; /* read end of the report pipe, kept open while the child should live */
} child_t;

/* fork+exec this binary as --role target on loopback and read its report line. */
int bench__spawn_target(const bench_options_t *o, uint64_t buffer_size, child_t *child, char *addr,
                        size_t addr_len, uint64_t *raddr, uint64_t *rlen);
/* Ends the child: it normally exits after QUIT; otherwise SIGTERM, then SIGKILL. Returns
 * the child's exit status (0 = clean), or 1 when it had to be killed. */
int bench__reap_child(child_t *c, bool asked_to_quit);

typedef struct {
    ote_engine_t *engine;
    ote_segment_t *seg;
    uint64_t next_id;
    const char *target;
    bench_mem_t *local; /* --local-mem file:PATH: requests served here (bench__mem_serve) */
} ctl_client_t;

/* Send a request to the target and wait for the reply with the same id. */
int bench__ctl_call(ctl_client_t *c, bench_ctl_msg_t *req, bench_ctl_msg_t *rep);
/* Local address that routes to the target, as "ip:0" or "[ip6]:0", for --listen. */
int bench__route_local_address(const char *target, char *out, size_t out_len);

/* ---- bench_run.c ---- */
typedef struct bench_worker worker_t;

struct run {
    const bench_options_t *o;
    ote_segment_t *seg;
    uint8_t *local;
    uint64_t remote_base;
    uint64_t sweep_span; /* --sweep: bytes of the target buffer the offsets go through; 0 none */
    uint64_t block;
    uint64_t batch;
    size_t depth;
    size_t threads;
    uint64_t total_ops; /* 0: duration mode */
    _Atomic uint64_t ops_claimed;
    _Atomic uint64_t progress_bytes;
    _Atomic int failed;
    uint64_t start_ns;
    uint64_t deadline_ns;
    /* Per (thread, depth) batch: slots written, kept after the workers are freed. */
    uint64_t covered[BENCH_THREADS_MAX * BENCH_DEPTH_MAX];
    ote_mutex_t mu;
    ote_cond_t cv;
    size_t ready; /* workers done with warmup */
    size_t done;
    bool go;
    worker_t *w;
};
typedef struct run run_t;

/* Offset of slot j of batch d of thread t, the same on both sides. */
uint64_t bench__slot_offset(const run_t *r, size_t t, size_t d, uint64_t j);
/* One result: threads workers, each keeping `depth` batches of `batch` requests of
 * `block` bytes in flight. Returns 0 and fills res (all but check), or -1 when a transfer
 * failed. */
int bench__run_one(run_t *r, ote_engine_t *engine, bench_result_t *res);

/* ---- bench_initiator.c ---- */
int bench__run_initiator(const bench_options_t *o);

#endif

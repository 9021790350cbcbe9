/*
 * tools/bench_lib.h - the parts of ote_bench that do not move data.
 *
 * Command-line parsing and validation, size/duration parsing and formatting, latency
 * percentiles, the byte pattern used by --check, the result line formats (human table
 * and JSON), and the small text protocol that an initiator and a target speak over
 * OrbitTE notifications. Everything here is pure: no engine, no threads, no I/O, so the
 * tests in //tests/tools can exercise it directly. ote_bench.c owns the engine, the
 * target process and the measurement loop.
 */
#ifndef OTE_TOOLS_BENCH_LIB_H
#define OTE_TOOLS_BENCH_LIB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Most values a comma list option (--block-size, --batch-size, --threads) may hold. */
#define BENCH_MAX_LIST 16
/* Longest "host:port" accepted. */
#define BENCH_ADDR_MAX 256
#define BENCH_PATH_MAX 512 /* --local-mem / --remote-mem file:PATH */

/* Ranges checked by bench_options_parse(). */
#define BENCH_BLOCK_MAX (4ull << 30) /* one request: 4 GiB */
#define BENCH_BATCH_MAX 4096ull
#define BENCH_THREADS_MAX 64ull
#define BENCH_DEPTH_MAX 16ull
#define BENCH_WORKING_SET_MAX (64ull << 30) /* threads * depth * batch * block */
#define BENCH_BUFFER_MIN 4096ull
#define BENCH_BUFFER_MAX (1ull << 40)

typedef enum { BENCH_ROLE_INITIATOR = 0, BENCH_ROLE_TARGET = 1 } bench_role_t;
typedef enum { BENCH_OP_READ = 0, BENCH_OP_WRITE = 1 } bench_op_t;
typedef enum { BENCH_CHECK_OFF = 0, BENCH_CHECK_OK = 1, BENCH_CHECK_FAILED = 2 } bench_check_t;

typedef struct {
    bench_role_t role;
    char transport[32]; /* the engines' transports list: "tcp", "shm", "rdma", "shm,tcp" */
    bench_op_t op;
    uint64_t block_sizes[BENCH_MAX_LIST];
    size_t n_block_sizes;
    uint64_t batch_sizes[BENCH_MAX_LIST];
    size_t n_batch_sizes;
    uint64_t threads[BENCH_MAX_LIST];
    size_t n_threads;
    uint64_t depth;          /* batches in flight per thread */
    uint64_t duration_ns;    /* per result; 0 when total_bytes is used */
    uint64_t total_bytes;    /* per result; 0 when duration_ns is used */
    uint64_t warmup_batches; /* per thread, before timing */
    uint64_t timeout_ns;     /* deadline of one batch */
    bool check;
    bool json;
    bool progress;                  /* false with --no-progress */
    bool stats;                     /* --stats: the engine's counters at the end */
    char target[BENCH_ADDR_MAX];    /* "" = start a target child on loopback */
    char listen[BENCH_ADDR_MAX];    /* "" = default */
    char advertise[BENCH_ADDR_MAX]; /* "" = default */
    bool have_remote;               /* --remote-addr and --remote-len given */
    uint64_t remote_addr;
    uint64_t remote_len;
    uint64_t buffer_size; /* target: registered buffer; 0 = default/automatic */
    int report_fd;        /* internal: target writes its report line here; -1 none */
    bool test_corrupt;    /* internal: damage one byte so --check must fail */
    unsigned local_mem;   /* --local-mem: BENCH_MEM_HOST, _THP, _SHARED, _FILE or _CUDA(N) */
    unsigned remote_mem;  /* --remote-mem: the (spawned) target's buffer; for --role
                           * target its own buffer */
    char local_file[BENCH_PATH_MAX];  /* --local-mem file:PATH: the path */
    char remote_file[BENCH_PATH_MAX]; /* --remote-mem file:PATH: the path */
    bool sweep;                       /* --sweep: each batch's target offsets move on through
                                       * the whole target buffer (not with --check) */
    bool show_topology;               /* --show-topology: print ote_engine_topology and exit */
    bool remote_ipc;                  /* --remote-ipc: the target registers device memory with
                           * OTE_PERM_IPC (CUDA IPC for same-host peers over shm) */
    char inject[64];                  /* --inject: verbs/sim fault schedule of this process's engine
                           * ($OTE_SIM_INJECT, verbs/sim/sim.h); "" = none */
} bench_options_t;

/* Memory of a buffer (--local-mem / --remote-mem): host, host on transparent huge pages
 * ("thp": 2 MiB-aligned, madvise(MADV_HUGEPAGE)), shared host memory of the engine
 * ("shared": ote_memory_alloc_shared, memfd-backed MAP_SHARED, which a same-host shm peer
 * in cross-memory-attach mode maps and copies with memcpy), or CUDA device N ("cuda:N"). */
#define BENCH_MEM_HOST 0u
#define BENCH_MEM_THP 255u
#define BENCH_MEM_SHARED 254u
/* A file or block device ("file:PATH"), registered with ote_file_register. As --local-mem
 * the run needs no target: host memory moves to and from this process's own file
 * registration through its local segment (ote_segment_open_local); as --remote-mem the
 * spawned target registers the file instead of memory. */
#define BENCH_MEM_FILE 253u
#define BENCH_MEM_IS_HOST(m) \
    ((m) == BENCH_MEM_HOST || (m) == BENCH_MEM_THP || (m) == BENCH_MEM_SHARED)
#define BENCH_MEM_CUDA(n) (1u + (unsigned)(n))
#define BENCH_MEM_CUDA_MAX 239
/* "host", "thp", "shared", "file" or "cuda:N" into buf. */
const char *bench_mem_name(unsigned mem, char *buf, size_t len);
/* Parses "host", "thp", "shared", "cuda:N" (N in 0..BENCH_MEM_CUDA_MAX) or "file:PATH"
 * (PATH non-empty, under BENCH_PATH_MAX bytes, copied into path, which has BENCH_PATH_MAX
 * bytes; path may be NULL for the other kinds, then file:PATH is refused). Returns 0, or
 * -1. */
int bench_parse_mem(const char *s, unsigned *out, char *path);

/* Defaults: initiator, tcp, write, 4K,64K,1M,16M blocks, batch 16, 1 thread, depth 1,
 * 2 s per result. */
void bench_options_defaults(bench_options_t *o);

/* Parse argv (getopt_long; argv[0] is the program name). Returns 0 on success, 1 when
 * --help was asked for (nothing else done), -1 on a bad option or value with a one-line
 * reason in err. Resets getopt's state, so it may be called repeatedly. */
int bench_options_parse(int argc, char **argv, bench_options_t *o, char *err, size_t errlen);

/* The --help text. */
const char *bench_usage(void);

/* Largest threads * depth * batch * block over all combinations of the lists: the bytes
 * of buffer a run needs on each side (every request in flight has its own slot). */
uint64_t bench_working_set(const bench_options_t *o);

/* "4096", "4K", "4k", "4KiB", "4KB", "64M", "1G", "1T" (binary multiples). Returns 0 and
 * sets *out, or -1 for junk, a negative number, or overflow. */
int bench_parse_size(const char *s, uint64_t *out);
/* "2", "2s", "1.5s", "500ms", "250us", "2m". Returns 0 and sets *ns_out, or -1. */
int bench_parse_duration(const char *s, uint64_t *ns_out);
/* Comma list of sizes, each in [lo, hi]. Returns 0, or -1 with a reason in err. */
int bench_parse_size_list(const char *name, const char *s, uint64_t lo, uint64_t hi, uint64_t *vals,
                          size_t *n_out, char *err, size_t errlen);
/* Split "host:port" or "[v6]:port" into host (without brackets) and port. Returns 0, or
 * -1 when malformed (no port, port out of 0..65535, empty host). */
int bench_split_hostport(const char *s, char *host, size_t host_len, uint16_t *port_out);

/* Shortest exact form: 4096 -> "4K", 67108864 -> "64M", 4097 -> "4097". */
const char *bench_format_size(uint64_t v, char *buf, size_t len);
const char *bench_op_name(bench_op_t op);
const char *bench_check_name(bench_check_t c);

/* ---- latency ---- */
typedef struct {
    double avg_us;
    double p50_us;
    double p99_us;
    double p999_us;
} bench_latency_t;

/* Sorts samples (nanoseconds) in place and computes nearest-rank percentiles. avg_us is
 * sum_ns / count (the mean over every sample taken, which may be more than were kept);
 * pass count = n when all samples were kept. All zero when n == 0. */
void bench_latency_summarize(uint64_t *samples_ns, size_t n, uint64_t sum_ns, uint64_t count,
                             bench_latency_t *out);

/* ---- results ---- */
#define BENCH_MAX_NICS 32

typedef struct {
    const char *transport;
    bench_op_t op;
    uint64_t block_size;
    uint64_t batch_size;
    uint64_t threads;
    uint64_t bytes;    /* bytes moved in the timed part */
    uint64_t requests; /* requests completed in the timed part */
    double seconds;
    bench_latency_t lat; /* per batch */
    bench_check_t check;
    unsigned local_mem, remote_mem; /* BENCH_MEM_* */
    const char *path; /* how device memory moved: "host" (none), "staging", "ipc"; NULL = "host" */
    /* Bytes each data device (NIC) of the initiator's engine carried in the timed part
     * (ote_engine_nic_stats; none over tcp and shm). */
    size_t nnic;
    uint64_t grants; /* grant round trips (GRANT_REQs) the initiator asked, all NICs */
    struct {
        char name[64];
        uint64_t bytes;
    } nic[BENCH_MAX_NICS];
} bench_result_t;

double bench_result_gbps(const bench_result_t *r);        /* 10^9 bytes per second */
double bench_result_ops_per_sec(const bench_result_t *r); /* requests per second */

/* One JSON object, no newline, keys in this order: transport, op, block_size, batch_size,
 * threads, bytes, seconds, gbps, ops_per_sec, lat_avg_us, lat_p50_us, lat_p99_us,
 * lat_p999_us, check, local_mem, remote_mem, path. Returns what snprintf returns. */
int bench_format_json(const bench_result_t *r, char *buf, size_t len);
/* Human table: a header line and one row per result (no newline). */
int bench_format_table_header(char *buf, size_t len);
int bench_format_table_row(const bench_result_t *r, char *buf, size_t len);

/* Strict unsigned decimal (or 0x hex when base is 0); no sign, no junk, no overflow:
 * 0, or -1 (*out untouched). */
int bench_parse_u64(const char *s, int base, uint64_t *out);

/* ---- the --check pattern ----
 * Byte i of a region (i counted from the start of the remote buffer, so local and remote
 * copies of the same offset agree) is a hash of (seed, i / 8): every 8-byte word differs,
 * so a block landing at the wrong offset or from an earlier run (another seed) is caught. */
void bench_pattern_fill(void *buf, uint64_t offset, size_t len, uint64_t seed);
/* Returns true when [buf, buf+len) holds the pattern of [offset, offset+len); otherwise
 * false and *bad_out (may be NULL) is the first differing offset. */
bool bench_pattern_check(const void *buf, uint64_t offset, size_t len, uint64_t seed,
                         uint64_t *bad_out);

/* ---- initiator <-> target control messages (text, over ote_notify) ----
 * Request: "OTEB1 <id> INFO" | "OTEB1 <id> FILL <seed> <off> <len>" |
 *          "OTEB1 <id> ZERO <off> <len>" | "OTEB1 <id> VERIFY <seed> <off> <len>" |
 *          "OTEB1 <id> QUIT"
 * Reply:   "OTEB1 <id> OK [<a> <b>]" (INFO: buffer address and length; initiators now
 *          find the buffer by buffer discovery, BENCH_BUFFER_NAME, and no longer send it) |
 *          "OTEB1 <id> BAD <offset>" (VERIFY found a wrong byte) | "OTEB1 <id> ERR <text>"
 * The target's report line (self-spawned target, over a pipe; also printed by a
 * standalone target): "OTEB1 TARGET <host:port> <buffer address> <buffer length>". */
typedef enum {
    BENCH_CTL_INFO = 0,
    BENCH_CTL_FILL,
    BENCH_CTL_ZERO,
    BENCH_CTL_VERIFY,
    BENCH_CTL_QUIT,
    BENCH_CTL_OK,
    BENCH_CTL_BAD,
    BENCH_CTL_ERR,
} bench_ctl_verb_t;

typedef struct {
    uint64_t id;
    bench_ctl_verb_t verb;
    uint64_t a, b, c; /* FILL/VERIFY: seed off len; ZERO: off len; OK: optional a b; BAD: a */
    char text[128];   /* ERR */
} bench_ctl_msg_t;

/* Encode into buf (no NUL is sent; returns the length, or -1 if it does not fit). */
int bench_ctl_format(const bench_ctl_msg_t *m, char *buf, size_t len);
/* Decode len bytes (not NUL-terminated). Returns 0, or -1 when malformed. */
int bench_ctl_parse(const char *buf, size_t len, bench_ctl_msg_t *out);

int bench_report_format(const char *address, uint64_t buf_addr, uint64_t buf_len, char *out,
                        size_t len);
int bench_report_parse(const char *line, char *address, size_t address_len, uint64_t *buf_addr_out,
                       uint64_t *buf_len_out);

#ifdef __cplusplus
}
#endif
#endif

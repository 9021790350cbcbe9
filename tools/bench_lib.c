/*
 * tools/bench_lib.c - option parsing, formats and percentiles of ote_bench (the --check
 * pattern and the control lines: bench_wire.c). See bench_lib.h; nothing here touches
 * the engine.
 */
#include "tools/bench_lib.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/list.h"

/* ---- small helpers ---- */

static int set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int set_err(char *err, size_t errlen, const char *fmt, ...) {
    if (err != NULL && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* Strict unsigned decimal (or 0x hex when base is 0); no sign, no junk, no overflow. */
int bench_parse_u64(const char *s, int base, uint64_t *out) {
    if (s == NULL || *s == '\0' || *s == '-' || *s == '+' || isspace((unsigned char)*s)) return -1;
    errno = 0;
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, base);
    if (errno != 0 || end == s || *end != '\0') return -1;
    *out = (uint64_t)v;
    return 0;
}

int bench_parse_size(const char *s, uint64_t *out) {
    if (s == NULL || !isdigit((unsigned char)s[0])) return -1;
    errno = 0;
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || end == s) return -1;
    uint64_t mult = 1;
    switch (*end) {
        case 'k':
        case 'K':
            mult = 1ull << 10;
            end++;
            break;
        case 'm':
        case 'M':
            mult = 1ull << 20;
            end++;
            break;
        case 'g':
        case 'G':
            mult = 1ull << 30;
            end++;
            break;
        case 't':
        case 'T':
            mult = 1ull << 40;
            end++;
            break;
        default: break;
    }
    if (mult != 1) {
        /* Accept "K", "KB", "KiB" (all binary). */
        if ((end[0] == 'i' || end[0] == 'I') && (end[1] == 'b' || end[1] == 'B')) end += 2;
        else if (end[0] == 'b' || end[0] == 'B') end += 1;
    } else if (end[0] == 'b' || end[0] == 'B') {
        end += 1; /* "4096B" */
    }
    if (*end != '\0') return -1;
    if (v > UINT64_MAX / mult) return -1;
    *out = (uint64_t)v * mult;
    return 0;
}

int bench_parse_duration(const char *s, uint64_t *ns_out) {
    if (s == NULL || !(isdigit((unsigned char)s[0]) || s[0] == '.')) return -1;
    errno = 0;
    char *end = NULL;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || !isfinite(v) || v < 0) return -1;
    double scale;
    if (strcmp(end, "") == 0 || strcmp(end, "s") == 0) scale = 1e9;
    else if (strcmp(end, "ms") == 0) scale = 1e6;
    else if (strcmp(end, "us") == 0) scale = 1e3;
    else if (strcmp(end, "ns") == 0) scale = 1;
    else if (strcmp(end, "m") == 0 || strcmp(end, "min") == 0) scale = 60e9;
    else if (strcmp(end, "h") == 0) scale = 3600e9;
    else return -1;
    double ns = v * scale;
    if (ns > 9e18) return -1;
    *ns_out = (uint64_t)(ns + 0.5);
    return 0;
}

int bench_parse_size_list(const char *name, const char *s, uint64_t lo, uint64_t hi, uint64_t *vals,
                          size_t *n_out, char *err, size_t errlen) {
    char lo_s[32], hi_s[32];
    bench_format_size(lo, lo_s, sizeof lo_s);
    bench_format_size(hi, hi_s, sizeof hi_s);
    if (s == NULL || *s == '\0') return set_err(err, errlen, "%s: empty value", name);
    size_t n = 0;
    ote_list_iter_t it = ote_list_iter(s, ',');
    const char *p;
    size_t tl;
    while (ote_list_next(&it, &p, &tl)) {
        char tok[64];
        if (tl == 0 || tl >= sizeof tok)
            return set_err(err, errlen, "%s: '%s' is not a comma-separated list of values", name,
                           s);
        memcpy(tok, p, tl);
        tok[tl] = '\0';
        uint64_t v;
        if (bench_parse_size(tok, &v) != 0)
            return set_err(err, errlen,
                           "%s: '%s' is not a number (use digits with an optional K/M/G/T "
                           "suffix)",
                           name, tok);
        if (v < lo || v > hi)
            return set_err(err, errlen, "%s: %s is out of range [%s, %s]", name, tok, lo_s, hi_s);
        if (n == BENCH_MAX_LIST)
            return set_err(err, errlen, "%s: more than %d values", name, BENCH_MAX_LIST);
        vals[n++] = v;
    }
    *n_out = n;
    return 0;
}

int bench_split_hostport(const char *s, char *host, size_t host_len, uint16_t *port_out) {
    if (s == NULL) return -1;
    const char *hs, *he, *colon;
    if (s[0] == '[') {
        hs = s + 1;
        he = strchr(hs, ']');
        if (he == NULL || he[1] != ':') return -1;
        colon = he + 1;
    } else {
        hs = s;
        colon = strrchr(s, ':');
        if (colon == NULL) return -1;
        he = colon;
        if (memchr(hs, ':', (size_t)(he - hs)) != NULL) return -1; /* bare IPv6 */
    }
    size_t hl = (size_t)(he - hs);
    if (hl == 0 || hl >= host_len) return -1;
    uint64_t port;
    if (bench_parse_u64(colon + 1, 10, &port) != 0 || port > 65535) return -1;
    memcpy(host, hs, hl);
    host[hl] = '\0';
    *port_out = (uint16_t)port;
    return 0;
}

const char *bench_format_size(uint64_t v, char *buf, size_t len) {
    static const char units[] = "KMGT";
    int u = -1;
    uint64_t x = v;
    while (x != 0 && (x & 1023) == 0 && u < 3) {
        x >>= 10;
        u++;
    }
    if (u < 0) snprintf(buf, len, "%" PRIu64, v);
    else snprintf(buf, len, "%" PRIu64 "%c", x, units[u]);
    return buf;
}

const char *bench_op_name(bench_op_t op) { return op == BENCH_OP_READ ? "read" : "write"; }

const char *bench_check_name(bench_check_t c) {
    switch (c) {
        case BENCH_CHECK_OK: return "ok";
        case BENCH_CHECK_FAILED: return "failed";
        default: return "off";
    }
}

/* ---- options ---- */

void bench_options_defaults(bench_options_t *o) {
    memset(o, 0, sizeof *o);
    o->role = BENCH_ROLE_INITIATOR;
    snprintf(o->transport, sizeof o->transport, "shm,tcp"); /* the library's default */
    o->op = BENCH_OP_WRITE;
    static const uint64_t blocks[] = {4ull << 10, 64ull << 10, 1ull << 20, 16ull << 20};
    memcpy(o->block_sizes, blocks, sizeof blocks);
    o->n_block_sizes = sizeof blocks / sizeof blocks[0];
    o->batch_sizes[0] = 16;
    o->n_batch_sizes = 1;
    o->threads[0] = 1;
    o->n_threads = 1;
    o->depth = 1;
    o->duration_ns = 2 * 1000000000ull;
    o->total_bytes = 0;
    o->warmup_batches = 1;
    o->timeout_ns = 60 * 1000000000ull;
    o->progress = true;
    o->report_fd = -1;
}

const char *bench_usage(void) {
    return "Usage: ote_bench [options]                      measure against a target child on "
           "loopback\n"
           "       ote_bench --role target [--listen H:P]   serve as the target of another host\n"
           "       ote_bench --target H:P [options]         measure against that target\n"
           "       ote_bench --show-topology [--transport rdma]  print which NIC the engine\n"
           "                                                picks first per GPU and NUMA node\n"
           "\n"
           "Initiator options:\n"
           "  --transport tcp|rdma|shm transport of both engines (default: the library's\n"
           "                           shm,tcp: shm on one host, else tcp); shm: the same-host\n"
           "                           transport (cross-memory attach)\n"
           "  --transports LIST        the engines' ordered list instead, e.g. shm,tcp: each\n"
           "                           segment takes the first both offer (the header says which)\n"
           "  --op read|write          READ pulls from the target, WRITE pushes to it (default "
           "write)\n"
           "  -b, --block-size LIST    bytes per request, K/M/G suffixes, comma list sweeps\n"
           "                           (default 4K,64K,1M,16M; range 1..4G)\n"
           "  -B, --batch-size LIST    requests per batch (default 16; range 1..4096)\n"
           "  -t, --threads LIST       submitting threads (default 1; 1..64)\n"
           "  --depth N                batches each thread keeps in flight, each with its own\n"
           "                           slots of the buffer (default 1; 1..16)\n"
           "  -d, --duration TIME      timed part of each result: 2, 2s, 500ms, 1m (default 2s)\n"
           "  -n, --total-bytes SIZE   instead of --duration: move this many bytes per result\n"
           "  -c, --check              fill the source with a pattern and verify every byte of\n"
           "                           the destination after the run (WRITE: the target checks\n"
           "                           its own memory; READ: this process checks)\n"
           "  -j, --json               one JSON object per result line on stdout, no table\n"
           "  --warmup N               untimed batches per thread before each result (default 1)\n"
           "  --timeout TIME           deadline of one batch (default 60s)\n"
           "  --no-progress            no progress line on stderr (shown on a terminal, after 2 "
           "s)\n"
           "  --stats                  at the end, this engine's counters (ote_engine_stats):\n"
           "                           lines after the table, or one more JSON line\n"
           "                           {\"stats\":{...}} with --json\n"
           "  --target HOST:PORT       a target started with --role target (no child is spawned)\n"
           "  --remote-addr ADDR       the target's buffer address as it printed it; with\n"
           "  --remote-len SIZE        --remote-len, skips asking the target for them\n"
           "  --listen HOST:PORT       this engine's listen address; the target sends its replies\n"
           "                           here (default: 127.0.0.1:0 with a child target, else the\n"
           "                           local address that routes to --target, port 0)\n"
           "  --advertise HOST:PORT    address reported to peers when listening on a wildcard\n"
           "  --buffer-size SIZE       registered buffer of the spawned target (default: just\n"
           "                           enough for the largest threads*depth*batch*block)\n"
           "  --local-mem host|thp|shared|cuda:N|file:PATH  local buffer: host (default), host on\n"
           "                           transparent huge pages (thp: 2 MiB-aligned,\n"
           "                           MADV_HUGEPAGE), the engine's shared host memory (shared:\n"
           "                           ote_memory_alloc_shared; a same-host shm peer in cross-\n"
           "                           memory-attach mode maps it and copies with memcpy), or\n"
           "                           device memory of CUDA device N (cuda/memory; the driver\n"
           "                           is $OTE_CUDA_LIBRARY or libcuda.so.1); --check then reads\n"
           "                           it back with device-to-host copies. file:PATH: no target;\n"
           "                           host memory to and from this process's registration of\n"
           "                           the file (created, or grown to the working set), through\n"
           "                           its local segment (ote_segment_open_local)\n"
           "  --remote-mem host|thp|shared|cuda:N|file:PATH  the spawned target's buffer (a\n"
           "                           --target is asked for its kind by buffer discovery);\n"
           "                           file:PATH: the target registers that file\n"
           "  --sweep                  after every batch, move its target offsets on by the\n"
           "                           working set, wrapping at the end of the target's buffer:\n"
           "                           the whole buffer (a whole file) is read or written rather\n"
           "                           than its first working set over and over (not with "
           "--check)\n"
           "  --remote-ipc             the spawned target registers its device buffer with\n"
           "                           OTE_PERM_IPC (CUDA IPC over shm where gpu_paths\n"
           "                           allows ipc on both sides, e.g. OTE_GPU_PATHS=ipc,staging)\n"
           "  --inject SPEC            faults of this process's verbs/sim device (its engine\n"
           "                           only, not the spawned target's): cq_error=N breaks the\n"
           "                           CQ of the Nth completion (a CQ lane error), gid_change=N\n"
           "                           renumbers the port's GIDs there (a route change);\n"
           "                           comma-separated (sets OTE_SIM_INJECT). A batch that\n"
           "                           this engine's device failed (FENCED, PORT_DOWN) is\n"
           "                           resubmitted, up to 8 times, in every run\n"
           "\n"
           "Target options (--role target):\n"
           "  --listen HOST:PORT       listen address (default 0.0.0.0:0; port 0 = any free port)\n"
           "  --advertise HOST:PORT    address to report (default: the listen address)\n"
           "  --buffer-size SIZE       buffer registered for READ and WRITE (default 1G)\n"
           "  --remote-mem host|thp|shared|cuda:N|file:PATH  memory of that buffer (default host)\n"
           "  --remote-ipc             register a device buffer with OTE_PERM_IPC\n"
           "  --transport tcp|rdma|shm, --transports LIST\n"
           "The target prints one line 'OTEB1 TARGET <host:port> <buffer address> <length>' and\n"
           "serves until interrupted. An initiator asks it for the buffer through an OrbitTE\n"
           "notification, so it must be reachable from the target (--listen/--advertise), or\n"
           "pass --remote-addr/--remote-len as printed (then --check still needs replies).\n"
           "Across hosts, give both sides the cluster key: OTE_AUTH_KEY_FILE=<file> (an engine\n"
           "without a key listens on loopback only, unless OTE_ALLOW_UNAUTHENTICATED=1).\n"
           "\n"
           "Latency is per batch: from ote_batch_submit to the return of ote_batch_wait (with\n"
           "--depth > 1 it includes waiting behind the batches submitted before it).\n"
           "GB/s is 10^9 bytes per second; ops/s counts requests. Exit status: 0 ok, 1 a\n"
           "transfer or --check failed, 2 bad usage.\n";
}

enum {
    OPT_ROLE = 256,
    OPT_TARGET,
    OPT_LISTEN,
    OPT_ADVERTISE,
    OPT_TRANSPORT,
    OPT_TRANSPORTS,
    OPT_OP,
    OPT_WARMUP,
    OPT_TIMEOUT,
    OPT_NO_PROGRESS,
    OPT_REMOTE_ADDR,
    OPT_REMOTE_LEN,
    OPT_BUFFER_SIZE,
    OPT_REPORT_FD,
    OPT_TEST_CORRUPT,
    OPT_DEPTH,
    OPT_LOCAL_MEM,
    OPT_REMOTE_MEM,
    OPT_REMOTE_IPC,
    OPT_SWEEP,
    OPT_INJECT,
    OPT_SHOW_TOPOLOGY,
    OPT_STATS,
    OPT_END,
};

static int copy_addr(const char *name, const char *v, char *dst, char *err, size_t errlen) {
    char host[BENCH_ADDR_MAX];
    uint16_t port;
    if (strlen(v) >= BENCH_ADDR_MAX || bench_split_hostport(v, host, sizeof host, &port) != 0)
        return set_err(err, errlen, "%s: '%s' is not host:port (or [v6]:port)", name, v);
    snprintf(dst, BENCH_ADDR_MAX, "%s", v);
    return 0;
}

uint64_t bench_working_set(const bench_options_t *o) {
    uint64_t best = 0;
    for (size_t i = 0; i < o->n_block_sizes; i++)
        for (size_t j = 0; j < o->n_batch_sizes; j++)
            for (size_t k = 0; k < o->n_threads; k++) {
                /* Each factor is range-checked: 4G * 4096 * 64 * 16 = 2^54 fits. */
                uint64_t ws = o->block_sizes[i] * o->batch_sizes[j] * o->threads[k] * o->depth;
                if (ws > best) best = ws;
            }
    return best;
}

/* A list of 1..3 distinct names out of tcp, rdma, shm (the engine checks it again). */
static bool transports_ok(const char *arg) {
    static const char *const names[] = {"tcp", "rdma", "shm"};
    unsigned seen = 0;
    if (strlen(arg) >= sizeof(((bench_options_t *)0)->transport)) return false;
    return ote_list_match(arg, names, 3, &seen) == OTE_OK && seen != 0;
}

/* Options of role, addresses, transport and operation.
 * Returns 0, -1 after set_err, or 1 when c is not one of them. */
static int parse_where_and_what(int c, const char *arg, bench_options_t *o, char *err,
                                size_t errlen) {
    switch (c) {
        case OPT_ROLE:
            if (strcmp(arg, "target") == 0) o->role = BENCH_ROLE_TARGET;
            else if (strcmp(arg, "initiator") == 0) o->role = BENCH_ROLE_INITIATOR;
            else return set_err(err, errlen, "--role: '%s' is not initiator or target", arg);
            break;
        case OPT_TARGET:
            if (copy_addr("--target", arg, o->target, err, errlen) != 0) return -1;
            break;
        case OPT_LISTEN:
            if (copy_addr("--listen", arg, o->listen, err, errlen) != 0) return -1;
            break;
        case OPT_ADVERTISE:
            if (copy_addr("--advertise", arg, o->advertise, err, errlen) != 0) return -1;
            break;
        case OPT_TRANSPORT:
        case OPT_TRANSPORTS:
            if (!transports_ok(arg))
                return set_err(err, errlen,
                               "--transport%s: '%s' is not a comma list of distinct tcp, rdma, shm",
                               c == OPT_TRANSPORTS ? "s" : "", arg);
            snprintf(o->transport, sizeof o->transport, "%s", arg);
            break;
        case OPT_OP:
            if (strcmp(arg, "read") == 0) o->op = BENCH_OP_READ;
            else if (strcmp(arg, "write") == 0) o->op = BENCH_OP_WRITE;
            else return set_err(err, errlen, "--op: '%s' is not read or write", arg);
            break;
        default: return 1;
    }
    return 0;
}

/* Options of the shape of a run: sizes, counts and times.
 * Returns 0, -1 after set_err, or 1 when c is not one of them. */
static int parse_shape(int c, const char *arg, bench_options_t *o, char *err, size_t errlen) {
    uint64_t v;
    switch (c) {
        case 'b':
            if (bench_parse_size_list("--block-size", arg, 1, BENCH_BLOCK_MAX, o->block_sizes,
                                      &o->n_block_sizes, err, errlen) != 0)
                return -1;
            break;
        case 'B':
            if (bench_parse_size_list("--batch-size", arg, 1, BENCH_BATCH_MAX, o->batch_sizes,
                                      &o->n_batch_sizes, err, errlen) != 0)
                return -1;
            break;
        case 't':
            if (bench_parse_size_list("--threads", arg, 1, BENCH_THREADS_MAX, o->threads,
                                      &o->n_threads, err, errlen) != 0)
                return -1;
            break;
        case 'd':
            if (bench_parse_duration(arg, &v) != 0)
                return set_err(err, errlen,
                               "--duration: '%s' is not a duration (e.g. 2, 2s, 500ms, 1m)", arg);
            if (v < 1000000ull || v > 86400ull * 1000000000ull)
                return set_err(err, errlen, "--duration: %s is out of range [1ms, 24h]", arg);
            o->duration_ns = v;
            break;
        case 'n':
            if (bench_parse_size(arg, &v) != 0)
                return set_err(err, errlen,
                               "--total-bytes: '%s' is not a size (digits with an optional "
                               "K/M/G/T suffix)",
                               arg);
            if (v == 0 || v > (1ull << 50))
                return set_err(err, errlen, "--total-bytes: %s is out of range [1, 1024T]", arg);
            o->total_bytes = v;
            break;
        case OPT_WARMUP:
            if (bench_parse_u64(arg, 10, &v) != 0 || v > 1000000)
                return set_err(err, errlen, "--warmup: '%s' is not a count in [0, 1000000]", arg);
            o->warmup_batches = v;
            break;
        case OPT_TIMEOUT:
            if (bench_parse_duration(arg, &v) != 0 || v < 1000000ull || v > 3600ull * 1000000000ull)
                return set_err(err, errlen,
                               "--timeout: '%s' is not a duration in [1ms, 1h] (e.g. 30s)", arg);
            o->timeout_ns = v;
            break;
        case OPT_DEPTH:
            if (bench_parse_u64(arg, 10, &v) != 0 || v < 1 || v > BENCH_DEPTH_MAX)
                return set_err(err, errlen, "--depth: '%s' is not a count in [1, %llu]", arg,
                               BENCH_DEPTH_MAX);
            o->depth = v;
            break;
        default: return 1;
    }
    return 0;
}

/* Options of output, checking, the remote buffer and internals.
 * Returns 0, -1 after set_err, or 1 when c is not one of them. */
static int parse_output_and_remote(int c, const char *arg, bench_options_t *o, char *err,
                                   size_t errlen) {
    uint64_t v;
    switch (c) {
        case 'c': o->check = true; break;
        case 'j': o->json = true; break;
        case OPT_NO_PROGRESS: o->progress = false; break;
        case OPT_STATS: o->stats = true; break;
        case OPT_REMOTE_ADDR:
            if (bench_parse_u64(arg, 0, &v) != 0 || v == 0)
                return set_err(err, errlen,
                               "--remote-addr: '%s' is not a nonzero address (e.g. "
                               "0x7f12a0000000)",
                               arg);
            o->remote_addr = v;
            break;
        case OPT_REMOTE_LEN:
            if (bench_parse_size(arg, &v) != 0 || v == 0)
                return set_err(err, errlen, "--remote-len: '%s' is not a nonzero size", arg);
            o->remote_len = v;
            break;
        case OPT_BUFFER_SIZE:
            if (bench_parse_size(arg, &v) != 0 || v < BENCH_BUFFER_MIN || v > BENCH_BUFFER_MAX)
                return set_err(err, errlen, "--buffer-size: '%s' is not a size in [4K, 1T]", arg);
            o->buffer_size = v;
            break;
        case OPT_REPORT_FD:
            if (bench_parse_u64(arg, 10, &v) != 0 || v > 65535)
                return set_err(err, errlen, "--report-fd: '%s' is not a descriptor", arg);
            o->report_fd = (int)v;
            break;
        case OPT_TEST_CORRUPT: o->test_corrupt = true; break;
        case OPT_REMOTE_IPC: o->remote_ipc = true; break;
        case OPT_SWEEP: o->sweep = true; break;
        case OPT_INJECT:
            if (arg[0] == '\0' || strlen(arg) >= sizeof o->inject)
                return set_err(err, errlen, "--inject: '%s' is not cq_error=N and/or gid_change=N",
                               arg);
            snprintf(o->inject, sizeof o->inject, "%s", arg);
            break;
        case OPT_SHOW_TOPOLOGY: o->show_topology = true; break;
        case OPT_LOCAL_MEM:
        case OPT_REMOTE_MEM:
            if (bench_parse_mem(arg, c == OPT_LOCAL_MEM ? &o->local_mem : &o->remote_mem,
                                c == OPT_LOCAL_MEM ? o->local_file : o->remote_file) != 0)
                return set_err(err, errlen,
                               "--%s: '%s' is not host, thp, shared, file:PATH or cuda:N (N 0..%d)",
                               c == OPT_LOCAL_MEM ? "local-mem" : "remote-mem", arg,
                               BENCH_MEM_CUDA_MAX);
            break;
        default: return 1;
    }
    return 0;
}

/* --role target: no initiator option was given; the buffer defaults to 1 GiB. */
static int check_target_options(const bool *seen, bench_options_t *o, char *err, size_t errlen) {
    static const struct {
        int opt;
        const char *name;
    } initiator_only[] = {
        {OPT_TARGET, "--target"},
        {OPT_OP, "--op"},
        {'b', "--block-size"},
        {'B', "--batch-size"},
        {'t', "--threads"},
        {'d', "--duration"},
        {'n', "--total-bytes"},
        {'c', "--check"},
        {'j', "--json"},
        {OPT_WARMUP, "--warmup"},
        {OPT_TIMEOUT, "--timeout"},
        {OPT_REMOTE_ADDR, "--remote-addr"},
        {OPT_REMOTE_LEN, "--remote-len"},
        {OPT_TEST_CORRUPT, "--test-corrupt"},
        {OPT_DEPTH, "--depth"},
        {OPT_LOCAL_MEM, "--local-mem"},
        {OPT_STATS, "--stats"},
        {OPT_SWEEP, "--sweep"},
    };
    for (size_t i = 0; i < sizeof initiator_only / sizeof initiator_only[0]; i++)
        if (seen[initiator_only[i].opt])
            return set_err(err, errlen, "%s is an initiator option; not valid with --role target",
                           initiator_only[i].name);
    if (o->buffer_size == 0) o->buffer_size = 1ull << 30;
    return 0;
}

/* The initiator: options that go together or exclude each other, and the working set
 * against every limit it must fit. */
static int check_initiator_options(const bool *seen, bench_options_t *o, char *err, size_t errlen) {
    if (seen[OPT_REPORT_FD])
        return set_err(err, errlen, "--report-fd is internal to --role target");
    if (o->sweep && o->check)
        return set_err(err, errlen,
                       "--sweep and --check exclude each other (a check compares the first "
                       "working set)");
    if (seen['d'] && seen['n'])
        return set_err(err, errlen, "--duration and --total-bytes exclude each other");
    if (seen['n']) o->duration_ns = 0;
    if (seen[OPT_REMOTE_ADDR] != seen[OPT_REMOTE_LEN])
        return set_err(err, errlen, "--remote-addr and --remote-len go together");
    if (seen[OPT_REMOTE_ADDR] && o->target[0] == '\0')
        return set_err(err, errlen,
                       "--remote-addr needs --target (a spawned target reports its buffer itself)");
    o->have_remote = seen[OPT_REMOTE_ADDR];
    if (seen[OPT_BUFFER_SIZE] && o->target[0] != '\0')
        return set_err(
            err, errlen,
            "--buffer-size sizes a spawned target; give it to the --role target process");
    uint64_t ws = bench_working_set(o);
    char a[32], b[32];
    if (ws > BENCH_WORKING_SET_MAX)
        return set_err(err, errlen,
                       "threads * depth * batch * block = %s bytes is over the %s limit "
                       "(each request in flight has its own slot of the buffer)",
                       bench_format_size(ws, a, sizeof a),
                       bench_format_size(BENCH_WORKING_SET_MAX, b, sizeof b));
    if (o->have_remote && ws > o->remote_len)
        return set_err(
            err, errlen, "threads * depth * batch * block = %s bytes does not fit --remote-len %s",
            bench_format_size(ws, a, sizeof a), bench_format_size(o->remote_len, b, sizeof b));
    if (seen[OPT_BUFFER_SIZE] && o->buffer_size < ws)
        return set_err(
            err, errlen, "--buffer-size %s is smaller than threads * depth * batch * block = %s",
            bench_format_size(o->buffer_size, a, sizeof a), bench_format_size(ws, b, sizeof b));
    return 0;
}

int bench_options_parse(int argc, char **argv, bench_options_t *o, char *err, size_t errlen) {
    static const struct option longopts[] = {
        {"role", required_argument, NULL, OPT_ROLE},
        {"target", required_argument, NULL, OPT_TARGET},
        {"listen", required_argument, NULL, OPT_LISTEN},
        {"advertise", required_argument, NULL, OPT_ADVERTISE},
        {"transport", required_argument, NULL, OPT_TRANSPORT},
        {"transports", required_argument, NULL, OPT_TRANSPORTS},
        {"op", required_argument, NULL, OPT_OP},
        {"block-size", required_argument, NULL, 'b'},
        {"batch-size", required_argument, NULL, 'B'},
        {"threads", required_argument, NULL, 't'},
        {"duration", required_argument, NULL, 'd'},
        {"total-bytes", required_argument, NULL, 'n'},
        {"check", no_argument, NULL, 'c'},
        {"json", no_argument, NULL, 'j'},
        {"warmup", required_argument, NULL, OPT_WARMUP},
        {"timeout", required_argument, NULL, OPT_TIMEOUT},
        {"no-progress", no_argument, NULL, OPT_NO_PROGRESS},
        {"remote-addr", required_argument, NULL, OPT_REMOTE_ADDR},
        {"remote-len", required_argument, NULL, OPT_REMOTE_LEN},
        {"buffer-size", required_argument, NULL, OPT_BUFFER_SIZE},
        {"report-fd", required_argument, NULL, OPT_REPORT_FD},
        {"test-corrupt", no_argument, NULL, OPT_TEST_CORRUPT},
        {"remote-ipc", no_argument, NULL, OPT_REMOTE_IPC},
        {"sweep", no_argument, NULL, OPT_SWEEP},
        {"inject", required_argument, NULL, OPT_INJECT},
        {"show-topology", no_argument, NULL, OPT_SHOW_TOPOLOGY},
        {"depth", required_argument, NULL, OPT_DEPTH},
        {"local-mem", required_argument, NULL, OPT_LOCAL_MEM},
        {"remote-mem", required_argument, NULL, OPT_REMOTE_MEM},
        {"stats", no_argument, NULL, OPT_STATS},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    /* Which options were given, to reject those that do not fit the role. */
    bool seen[OPT_END] = {false};

    bench_options_defaults(o);
    optind = 0; /* glibc: full re-initialisation, so repeated calls (tests) start afresh */
    opterr = 0; /* errors are reported through err, not printed by getopt */
    for (;;) {
        int c = getopt_long(argc, argv, ":b:B:t:d:n:cjh", longopts, NULL);
        if (c == -1) break;
        const char *arg = optarg;
        /* After an error getopt has stepped past the offending word. */
        const char *bad = (optind > 1 && optind - 1 < argc) ? argv[optind - 1] : "?";
        if (c == '?') {
            if (optopt != 0 && optopt < 256)
                return set_err(err, errlen, "unknown option '-%c'", optopt);
            return set_err(err, errlen, "unknown option '%s'", bad);
        }
        if (c == ':') {
            return set_err(err, errlen, "option '%s' needs a value", bad);
        }
        if (c >= 0 && c < OPT_END) seen[c] = true;
        if (c == 'h') return 1;
        int r = parse_where_and_what(c, arg, o, err, errlen);
        if (r == 1) r = parse_shape(c, arg, o, err, errlen);
        if (r == 1) r = parse_output_and_remote(c, arg, o, err, errlen);
        if (r == 1) return set_err(err, errlen, "unexpected option");
        if (r != 0) return -1;
    }
    if (optind < argc)
        return set_err(err, errlen, "unexpected argument '%s' (options start with --)",
                       argv[optind]);
    if (o->role == BENCH_ROLE_TARGET) return check_target_options(seen, o, err, errlen);
    return check_initiator_options(seen, o, err, errlen);
}

/* ---- latency ---- */

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Nearest rank: the smallest sample with at least num/den of the samples <= it. */
static double rank_us(const uint64_t *sorted, size_t n, uint64_t num, uint64_t den) {
    uint64_t rank = ((uint64_t)n * num + den - 1) / den;
    if (rank == 0) rank = 1;
    return (double)sorted[rank - 1] / 1000.0;
}

void bench_latency_summarize(uint64_t *samples_ns, size_t n, uint64_t sum_ns, uint64_t count,
                             bench_latency_t *out) {
    memset(out, 0, sizeof *out);
    if (n == 0 || count == 0) return;
    qsort(samples_ns, n, sizeof samples_ns[0], cmp_u64);
    out->avg_us = (double)sum_ns / (double)count / 1000.0;
    out->p50_us = rank_us(samples_ns, n, 500, 1000);
    out->p99_us = rank_us(samples_ns, n, 990, 1000);
    out->p999_us = rank_us(samples_ns, n, 999, 1000);
}

/* ---- results ---- */

double bench_result_gbps(const bench_result_t *r) {
    return r->seconds > 0 ? (double)r->bytes / r->seconds / 1e9 : 0.0;
}

double bench_result_ops_per_sec(const bench_result_t *r) {
    return r->seconds > 0 ? (double)r->requests / r->seconds : 0.0;
}

/* JSON has no NaN or infinity. */
static double finite_or_zero(double v) { return isfinite(v) ? v : 0.0; }

int bench_format_json(const bench_result_t *r, char *buf, size_t len) {
    char lm[16], rm[16];
    int n = snprintf(buf, len,
                     "{\"transport\":\"%s\",\"op\":\"%s\",\"block_size\":%" PRIu64
                     ",\"batch_size\":%" PRIu64 ",\"threads\":%" PRIu64 ",\"bytes\":%" PRIu64
                     ",\"seconds\":%.6f,\"gbps\":%.4f,\"ops_per_sec\":%.1f,\"lat_avg_us\":%.3f"
                     ",\"lat_p50_us\":%.3f,\"lat_p99_us\":%.3f,\"lat_p999_us\":%.3f"
                     ",\"check\":\"%s\",\"local_mem\":\"%s\",\"remote_mem\":\"%s\",\"path\":\"%s\""
                     ",\"per_nic\":{",
                     r->transport, bench_op_name(r->op), r->block_size, r->batch_size, r->threads,
                     r->bytes, finite_or_zero(r->seconds), finite_or_zero(bench_result_gbps(r)),
                     finite_or_zero(bench_result_ops_per_sec(r)), finite_or_zero(r->lat.avg_us),
                     finite_or_zero(r->lat.p50_us), finite_or_zero(r->lat.p99_us),
                     finite_or_zero(r->lat.p999_us), bench_check_name(r->check),
                     bench_mem_name(r->local_mem, lm, sizeof lm),
                     bench_mem_name(r->remote_mem, rm, sizeof rm), r->path ? r->path : "host");
    /* "per_nic": {"name": bytes, ...} (names are device names: no quote or backslash) */
    for (size_t i = 0; i < r->nnic && i < BENCH_MAX_NICS && n >= 0 && (size_t)n < len; i++)
        n += snprintf(buf + n, len - (size_t)n, "%s\"%s\":%" PRIu64, i ? "," : "", r->nic[i].name,
                      r->nic[i].bytes);
    if (n >= 0 && (size_t)n < len)
        n += snprintf(buf + n, len - (size_t)n, "},\"grants\":%" PRIu64 "}", r->grants);
    return n;
}

const char *bench_mem_name(unsigned mem, char *buf, size_t len) {
    if (mem == BENCH_MEM_HOST) snprintf(buf, len, "host");
    else if (mem == BENCH_MEM_THP) snprintf(buf, len, "thp");
    else if (mem == BENCH_MEM_SHARED) snprintf(buf, len, "shared");
    else if (mem == BENCH_MEM_FILE) snprintf(buf, len, "file");
    else snprintf(buf, len, "cuda:%u", mem - 1);
    return buf;
}

int bench_parse_mem(const char *s, unsigned *out, char *path) {
    if (strncmp(s, "file:", 5) == 0) {
        size_t n = strlen(s + 5);
        if (path == NULL || n == 0 || n >= BENCH_PATH_MAX) return -1;
        memcpy(path, s + 5, n + 1);
        *out = BENCH_MEM_FILE;
        return 0;
    }
    if (strcmp(s, "host") == 0) {
        *out = BENCH_MEM_HOST;
        return 0;
    }
    if (strcmp(s, "thp") == 0) {
        *out = BENCH_MEM_THP;
        return 0;
    }
    if (strcmp(s, "shared") == 0) {
        *out = BENCH_MEM_SHARED;
        return 0;
    }
    if (strncmp(s, "cuda:", 5) != 0 || s[5] < '0' || s[5] > '9') return -1;
    char *end = NULL;
    unsigned long n = strtoul(s + 5, &end, 10);
    if (*end != '\0' || n > BENCH_MEM_CUDA_MAX || (s[5] == '0' && s[6] != '\0')) return -1;
    *out = BENCH_MEM_CUDA(n);
    return 0;
}

int bench_format_table_header(char *buf, size_t len) {
    return snprintf(buf, len, "%-5s %8s %6s %7s %9s %12s %10s %10s %10s %10s  %s", "op", "block",
                    "batch", "threads", "GB/s", "ops/s", "avg_us", "p50_us", "p99_us", "p99.9_us",
                    "check");
}

int bench_format_table_row(const bench_result_t *r, char *buf, size_t len) {
    char bs[32];
    return snprintf(
        buf, len, "%-5s %8s %6" PRIu64 " %7" PRIu64 " %9.3f %12.0f %10.1f %10.1f %10.1f %10.1f  %s",
        bench_op_name(r->op), bench_format_size(r->block_size, bs, sizeof bs), r->batch_size,
        r->threads, bench_result_gbps(r), bench_result_ops_per_sec(r), r->lat.avg_us, r->lat.p50_us,
        r->lat.p99_us, r->lat.p999_us, bench_check_name(r->check));
}

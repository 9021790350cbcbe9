/*
 * tools/bench_initiator.c - the initiator: finds or spawns its target, opens a segment,
 * learns the target's buffer, then measures one result per (block size, batch size,
 * threads) of the options, checking the destination with --check, and prints a table or
 * JSON lines.
 *
 * Buffer layout: request j of batch d of thread t always uses offset
 * ((t * depth + d) * batch + j) * block on both sides, so a --check compares the
 * destination against the pattern of the same offsets, and batches in flight at once
 * never share bytes.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <ote/ote.h>

#include "tools/bench_internal.h"
#include "tools/bench_lib.h"

/* Verify what a run wrote at the destination: each batch's first `covered` slots. */
static bench_check_t check_destination(run_t *r, bench_mem_t *local, ctl_client_t *ctl,
                                       uint64_t seed) {
    for (size_t t = 0; t < r->threads; t++) {
        for (size_t d = 0; d < r->depth; d++) {
            uint64_t off = bench__slot_offset(r, t, d, 0);
            uint64_t len = r->covered[t * r->depth + d] * r->block;
            if (len == 0) continue;
            uint64_t bad = 0;
            if (r->o->op == BENCH_OP_READ) {
                int rc = bench__mem_check(local, off, len, seed, &bad);
                if (rc < 0) {
                    fprintf(stderr, "ote_bench: check: reading the local buffer back failed\n");
                    return BENCH_CHECK_FAILED;
                }
                if (rc != 0) {
                    fprintf(stderr,
                            "ote_bench: check failed: local byte at offset %" PRIu64
                            " differs from the target's\n",
                            bad);
                    return BENCH_CHECK_FAILED;
                }
                continue;
            }
            bench_ctl_msg_t req = {.verb = BENCH_CTL_VERIFY, .a = seed, .b = off, .c = len};
            bench_ctl_msg_t rep;
            if (bench__ctl_call(ctl, &req, &rep) != 0) return BENCH_CHECK_FAILED;
            if (rep.verb == BENCH_CTL_BAD) {
                fprintf(stderr,
                        "ote_bench: check failed: the target's byte at offset %" PRIu64
                        " differs from what was written\n",
                        rep.a);
                return BENCH_CHECK_FAILED;
            }
            if (rep.verb != BENCH_CTL_OK) return BENCH_CHECK_FAILED;
        }
    }
    return BENCH_CHECK_OK;
}

/* What the initiator holds from its target's discovery to its teardown. */
typedef struct {
    const bench_options_t *o;
    child_t child;
    char target[BENCH_ADDR_MAX];
    uint64_t raddr, rlen; /* the target's buffer */
    uint64_t ws;          /* bytes of the largest result's working set */
    ote_engine_t *engine;
    ote_segment_t *seg;
    ctl_client_t ctl;
    bench_mem_t local; /* host or device memory (--local-mem; host with file:PATH) */
    bool have_local;
    bench_mem_t file; /* --local-mem file:PATH: this engine's file registration */
    bool have_file;
    unsigned remote_mem; /* the target buffer's memory (discovery, or --remote-mem) */
    bool registered;
    uint64_t result_idx;
} initiator_t;

/* The target's buffer as the target publishes it (buffer discovery: the registration
 * named BENCH_BUFFER_NAME). Returns 0, or -1 after saying why. */
static int discover_buffer(initiator_t *in) {
    ote_buffer_info_t *bufs = calloc(OTE_BUFFERS_MAX, sizeof(*bufs));
    if (bufs == NULL) {
        fprintf(stderr, "ote_bench: out of memory listing the target's buffers\n");
        return -1;
    }
    size_t n = 0;
    ote_status_t st = ote_segment_buffers(in->seg, bufs, OTE_BUFFERS_MAX, &n);
    if (st != OTE_OK) {
        char what[BENCH_ADDR_MAX + 32];
        snprintf(what, sizeof what, "ote_segment_buffers(%s)", in->target);
        bench__print_status(what, st);
        free(bufs);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (strcmp(bufs[i].name, BENCH_BUFFER_NAME) != 0) continue;
        if (bufs[i].perms != (OTE_PERM_READ | OTE_PERM_WRITE)) break;
        in->raddr = bufs[i].addr;
        in->rlen = bufs[i].length;
        in->remote_mem = OTE_MEM_IS_CUDA(bufs[i].kind)
                             ? BENCH_MEM_CUDA(OTE_MEM_CUDA_DEVICE(bufs[i].kind))
                         : bufs[i].kind == OTE_MEM_FILE ? BENCH_MEM_FILE /* listed since v4 */
                         : in->remote_mem == BENCH_MEM_THP || in->remote_mem == BENCH_MEM_SHARED
                             ? in->remote_mem /* as asked */
                             : BENCH_MEM_HOST;
        free(bufs);
        return 0;
    }
    free(bufs);
    fprintf(stderr, "ote_bench: the target %s publishes no READ|WRITE buffer named \"%s\"\n",
            in->target, BENCH_BUFFER_NAME);
    return -1;
}

/* --local-mem file:PATH: no target; the engine's own registration of the file, reached
 * through its local segment, stands where the target's buffer would. Returns 0, or -1
 * after saying why. */
static int initiator_local_file(initiator_t *in) {
    const bench_options_t *o = in->o;
    snprintf(in->target, sizeof in->target, "this engine's file registration (local segment)");
    ote_status_t st = bench__make_engine(o, o->listen[0] ? o->listen : "127.0.0.1:0", &in->engine);
    if (st != OTE_OK) {
        bench__print_status("ote_engine_create", st);
        return -1;
    }
    uint64_t len = o->buffer_size != 0 ? o->buffer_size : in->ws;
    if (bench__mem_create(in->engine, BENCH_MEM_FILE, o->local_file, len, &in->file) != 0)
        return -1;
    in->have_file = true;
    st = ote_segment_open_local(in->engine, &in->seg);
    if (st != OTE_OK) {
        bench__print_status("ote_segment_open_local", st);
        return -1;
    }
    in->raddr = in->file.addr;
    in->rlen = len;
    in->ctl = (ctl_client_t){.engine = in->engine, .target = in->target, .local = &in->file};
    return 0;
}

/* Spawn or name the target, create the engine, open the segment and learn the target's
 * buffer (buffer discovery when neither the spawned child nor --remote-addr gave it). Returns 0, or -1 after saying why (what exists is undone by initiator_close). */
static int initiator_connect(initiator_t *in) {
    const bench_options_t *o = in->o;
    char listen[BENCH_ADDR_MAX] = "";
    if (o->local_mem == BENCH_MEM_FILE) return initiator_local_file(in);
    if (o->target[0] == '\0') {
        uint64_t bufsz = o->buffer_size != 0 ? o->buffer_size : in->ws;
        if (bufsz < BENCH_BUFFER_MIN) bufsz = BENCH_BUFFER_MIN;
        if (bench__spawn_target(o, bufsz, &in->child, in->target, sizeof in->target, &in->raddr,
                                &in->rlen) != 0)
            return -1;
        snprintf(listen, sizeof listen, "%s", o->listen[0] ? o->listen : "127.0.0.1:0");
    } else {
        snprintf(in->target, sizeof in->target, "%s", o->target);
        if (o->listen[0] != '\0') snprintf(listen, sizeof listen, "%s", o->listen);
        else if (bench__route_local_address(o->target, listen, sizeof listen) != 0)
            listen[0] = '\0'; /* engine default */
        if (o->have_remote) {
            in->raddr = o->remote_addr;
            in->rlen = o->remote_len;
        }
    }

    /* --inject: this engine's sim only; the target child was spawned before. */
    if (o->inject[0] != '\0' && setenv("OTE_SIM_INJECT", o->inject, 1) != 0) {
        fprintf(stderr, "ote_bench: setenv(OTE_SIM_INJECT): %s\n", strerror(errno));
        return -1;
    }
    ote_status_t st = bench__make_engine(o, listen, &in->engine);
    if (st != OTE_OK) {
        bench__print_status("ote_engine_create", st);
        return -1;
    }
    st = ote_segment_open(in->engine, in->target, &in->seg);
    if (st != OTE_OK) {
        char what[BENCH_ADDR_MAX + 32];
        snprintf(what, sizeof what, "ote_segment_open(%s)", in->target);
        bench__print_status(what, st);
        return -1;
    }
    in->ctl =
        (ctl_client_t){.engine = in->engine, .seg = in->seg, .next_id = 0, .target = in->target};
    if (in->raddr == 0 && discover_buffer(in) != 0) return -1;
    return 0;
}

/* The local buffer (registered where the transport needs it). Returns 0 or -1. */
static int initiator_buffer(initiator_t *in) {
    const bench_options_t *o = in->o;
    char a[32], b[32];
    if (in->ws > in->rlen) {
        fprintf(stderr,
                "ote_bench: threads * depth * batch * block = %s bytes does not fit the target's "
                "%s-byte buffer (start the target with a larger --buffer-size)\n",
                bench_format_size(in->ws, a, sizeof a), bench_format_size(in->rlen, b, sizeof b));
        return -1;
    }
    unsigned kind = o->local_mem == BENCH_MEM_FILE ? BENCH_MEM_HOST : o->local_mem;
    if (bench__mem_create(in->engine, kind, NULL, in->ws, &in->local) != 0) return -1;
    in->have_local = true;
    if (strcmp(o->transport, "tcp") != 0 && !in->have_file) {
        /* TCP needs no registration of local buffers (ote.h); other transports do. */
        ote_status_t st = ote_memory_register(in->engine, (void *)(uintptr_t)in->local.addr,
                                              (size_t)in->ws, OTE_PERM_READ | OTE_PERM_WRITE);
        if (st != OTE_OK) {
            bench__print_status("ote_memory_register (local buffer)", st);
            return -1;
        }
        in->registered = true;
    }
    return 0;
}

static void print_table_header(const initiator_t *in) {
    const bench_options_t *o = in->o;
    char hdr[256];
    ote_segment_info_t info;
    if (ote_segment_info(in->seg, &info) != OTE_OK)
        snprintf(info.transport, sizeof(info.transport), "?");
    printf("# ote_bench: %s (transports %s) %s against %s%s; %s per result; %" PRIu64
           " batch(es) in flight per thread\n",
           info.transport, o->transport, bench_op_name(o->op), in->target,
           in->child.pid ? " (child on loopback)" : "",
           o->total_bytes ? "fixed bytes" : "fixed time", o->depth);
    printf(
        "# GB/s = 10^9 bytes/s; ops/s = requests/s; latency per batch (submit to "
        "wait return), microseconds\n");
    bench_format_table_header(hdr, sizeof hdr);
    printf("%s\n", hdr);
    fflush(stdout);
}

/* One result: block size, batch size and threads of the options; with --check the
 * source is filled (and the destination cleared) first and the destination verified
 * after. Prints its line. Returns 0, 1 when the check failed, or -1 when the run could
 * not be made. */
static int measure_one(initiator_t *in, uint64_t block, uint64_t batch, uint64_t threads) {
    const bench_options_t *o = in->o;
    bench_mem_t *local = &in->local;
    run_t r;
    memset(&r, 0, sizeof r);
    r.o = o;
    r.seg = in->seg;
    r.local = (uint8_t *)(uintptr_t)local->addr; /* an address only: never dereferenced */
    r.remote_base = in->raddr;
    r.sweep_span = o->sweep ? in->rlen : 0;
    r.block = block;
    r.batch = batch;
    r.threads = (size_t)threads;
    r.depth = (size_t)o->depth;
    if (o->total_bytes != 0) r.total_ops = (o->total_bytes + r.block - 1) / r.block;
    uint64_t region = r.block * r.batch * r.depth * r.threads;
    uint64_t seed = ((uint64_t)getpid() << 20) ^ (++in->result_idx);

    if (o->check) {
        if (o->op == BENCH_OP_WRITE) {
            if (bench__mem_fill(local, 0, region, seed) != 0) return -1;
            bench_ctl_msg_t req = {.verb = BENCH_CTL_ZERO, .a = 0, .b = region}, rep;
            if (bench__ctl_call(&in->ctl, &req, &rep) != 0) return -1;
            if (o->test_corrupt && bench__mem_corrupt(local, region / 2) != 0) return -1;
        } else {
            bench_ctl_msg_t req = {.verb = BENCH_CTL_FILL, .a = seed, .b = 0, .c = region}, rep;
            if (bench__ctl_call(&in->ctl, &req, &rep) != 0) return -1;
            if (bench__mem_zero(local, 0, region) != 0) return -1;
        }
    }

    bench_result_t res;
    ote_nic_stats_t nic0[BENCH_MAX_NICS], nic1[BENCH_MAX_NICS];
    size_t n0 = 0, n1 = 0;
    if (ote_engine_nic_stats(in->engine, nic0, BENCH_MAX_NICS, &n0) != OTE_OK) n0 = 0;
    ote_gpu_stats_t g0, g1;
    if (ote_engine_gpu_stats(in->engine, &g0) != OTE_OK) memset(&g0, 0, sizeof(g0));
    if (bench__run_one(&r, in->engine, &res) != 0) return -1;
    if (ote_engine_gpu_stats(in->engine, &g1) != OTE_OK) g1 = g0;
    /* Bytes per NIC in the timed part (the run's warm-up included: the counters are the
     * engine's own). */
    res.nnic = 0;
    if (ote_engine_nic_stats(in->engine, nic1, BENCH_MAX_NICS, &n1) == OTE_OK) {
        for (size_t i = 0; i < n1 && i < BENCH_MAX_NICS; i++) {
            uint64_t before = i < n0 && i < BENCH_MAX_NICS ? nic0[i].bytes_out : 0;
            snprintf(res.nic[i].name, sizeof(res.nic[i].name), "%s", nic1[i].name);
            res.nic[i].bytes = nic1[i].bytes_out - before;
            res.grants += nic1[i].grants - (i < n0 ? nic0[i].grants : 0);
            res.nnic = i + 1;
        }
    }
    res.check = BENCH_CHECK_OFF;
    if (o->check) {
        if (o->op == BENCH_OP_READ && o->test_corrupt && bench__mem_corrupt(local, region / 2) != 0)
            return -1;
        res.check = check_destination(&r, local, &in->ctl, seed);
    }
    res.local_mem = o->local_mem;
    res.remote_mem = in->remote_mem;
    /* The GPU path device memory took, from this engine's counters over the run: CUDA
     * IPC copies with nothing staged here is "ipc", GPUDirect RDMA requests with nothing
     * staged here is "direct"; otherwise staging (here, or at the
     * target for its device memory). */
    int gpu = (!BENCH_MEM_IS_HOST(o->local_mem) && o->local_mem != BENCH_MEM_FILE) ||
              (!BENCH_MEM_IS_HOST(in->remote_mem) && in->remote_mem != BENCH_MEM_FILE);
    int ipc = g1.ipc_copies > g0.ipc_copies && g1.staged_requests == g0.staged_requests;
    int direct =
        g1.direct_requests > g0.direct_requests && g1.staged_requests == g0.staged_requests;
    res.path = !gpu ? "host" : ipc ? "ipc" : direct ? "direct" : "staging";
    char line[4096];
    if (o->json) bench_format_json(&res, line, sizeof line);
    else bench_format_table_row(&res, line, sizeof line);
    printf("%s\n", line);
    fflush(stdout);
    return res.check == BENCH_CHECK_FAILED ? 1 : 0;
}

/* Undo what initiator_connect and initiator_buffer made: QUIT to a spawned target, then
 * segment, registration, engine, buffer (a shared one before the engine) and child.
 * Returns rc, or 1 when the engine or the child did not end cleanly. */
static int initiator_close(initiator_t *in, int rc) {
    ote_status_t st;
    bool quit_sent = false;
    if (in->child.pid > 0 && in->seg != NULL && !bench__stop) {
        ctl_client_t q = {
            .engine = in->engine, .seg = in->seg, .next_id = 1000000, .target = in->target};
        bench_ctl_msg_t req = {.verb = BENCH_CTL_QUIT}, rep;
        quit_sent = bench__ctl_call(&q, &req, &rep) == 0;
    }
    if (in->seg != NULL) {
        st = ote_segment_close(in->seg);
        if (st != OTE_OK) bench__print_status("ote_segment_close", st);
    }
    if (in->registered) {
        st = ote_memory_unregister(in->engine, (void *)(uintptr_t)in->local.addr);
        if (st != OTE_OK) bench__print_status("ote_memory_unregister", st);
    }
    /* Shared memory goes back to its engine (ote_memory_free_shared) while it lives; the
     * other kinds after it, as before. */
    if (in->have_local && in->local.kind == BENCH_MEM_SHARED) {
        bench__mem_destroy(&in->local);
        in->have_local = false;
    }
    if (in->have_file) bench__mem_destroy(&in->file); /* ote_file_unregister */
    if (in->engine != NULL) {
        st = ote_engine_destroy(in->engine);
        if (st != OTE_OK) {
            bench__print_status("ote_engine_destroy", st);
            rc = 1;
        }
    }
    if (in->have_local) bench__mem_destroy(&in->local);
    if (bench__reap_child(&in->child, quit_sent) != 0) rc = 1;
    return rc;
}

int bench__run_initiator(const bench_options_t *o) {
    initiator_t in;
    memset(&in, 0, sizeof in);
    in.o = o;
    in.child.pid = 0;
    in.child.lifeline = -1;
    in.ws = bench_working_set(o);
    in.remote_mem = o->remote_mem; /* discovery replaces it where it runs */
    if (initiator_connect(&in) != 0 || initiator_buffer(&in) != 0) return initiator_close(&in, 1);
    if (!o->json) print_table_header(&in);
    int rc = 0;
    for (size_t i = 0; i < o->n_block_sizes && rc == 0; i++)
        for (size_t j = 0; j < o->n_batch_sizes && rc == 0; j++)
            for (size_t k = 0; k < o->n_threads && rc == 0; k++)
                rc = measure_one(&in, o->block_sizes[i], o->batch_sizes[j], o->threads[k]) != 0;
    if (o->stats && bench__print_stats(in.engine, o->json) != 0) rc = 1;
    return initiator_close(&in, rc);
}

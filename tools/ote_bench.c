/*
 * tools/ote_bench.c - OrbitTE's benchmark: throughput, message rate and per-batch
 * latency of READ or WRITE against a target process, through the public API only.
 *
 * Two roles, one binary. The target owns one registered buffer (READ and WRITE allowed)
 * and answers small text requests that arrive as OrbitTE notifications (INFO, FILL,
 * ZERO, VERIFY, QUIT; see bench_lib.h). The initiator owns an engine, a local buffer of
 * the same layout, one batch per thread, and measures. With no --target the initiator
 * fork+execs itself as a target on loopback and reads the target's address and buffer
 * back over a pipe, which also serves as a lifeline: when the initiator dies the pipe
 * breaks and the target exits.
 *
 * Buffer layout: request j of batch d of thread t always uses offset
 * ((t * depth + d) * batch + j) * block on both sides, so a --check compares the
 * destination against the pattern of the same offsets, and batches in flight at once
 * never share bytes.
 * The timed loop only submits, waits and resets preallocated batches; latency samples go
 * into preallocated arrays (reservoir-sampled past their capacity) and are sorted once
 * at the end.
 *
 * The program is split by job (tools/bench_internal.h lists the files); this file holds
 * main, the signal handling and the helpers every role uses.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <ote/ote.h>

#include "cuda/driver.h"
#include "tools/bench_internal.h"
#include "tools/bench_lib.h"

volatile sig_atomic_t bench__stop;

static void on_signal(int sig) {
    (void)sig;
    bench__stop = 1;
}

static void install_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

void bench__print_status(const char *what, ote_status_t st) {
    char buf[256];
    fprintf(stderr, "ote_bench: %s: %s\n", what, ote_status_describe(st, buf, sizeof buf));
}

void *bench__map_buffer(uint64_t len) {
    void *p = mmap(NULL, (size_t)len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* Engine with the transport and addresses of the options. */
ote_status_t bench__make_engine(const bench_options_t *o, const char *listen,
                                ote_engine_t **engine_out) {
    ote_config_t *cfg = NULL;
    ote_status_t st = ote_config_create(&cfg);
    if (st != OTE_OK) return st;
    st = ote_config_set(cfg, "transports", o->transport);
    if (st == OTE_OK && listen != NULL && listen[0] != '\0')
        st = ote_config_set(cfg, "listen_address", listen);
    if (st == OTE_OK && o->advertise[0] != '\0')
        st = ote_config_set(cfg, "advertise_address", o->advertise);
    if (st == OTE_OK) st = ote_engine_create(cfg, engine_out);
    ote_config_destroy(cfg);
    return st;
}

/* --show-topology: an engine of the options' transports (configured by OTE_* variables
 * too, e.g. OTE_VERBS_PROVIDER, OTE_RDMA_TOPOLOGY), its ote_engine_topology on stdout.
 * The CUDA driver ($OTE_CUDA_LIBRARY or libcuda.so.1) is loaded first where there is
 * one, so that the engine lists the GPUs too. */
static int show_topology(const bench_options_t *o) {
    ote_cuda_driver_t *drv = NULL;
    if (ote_cuda_driver_load(NULL, &drv) != OTE_OK) {
        drv = NULL;
        fprintf(stderr, "ote_bench: no CUDA driver: host memory (NUMA nodes) only\n");
    }
    ote_engine_t *e = NULL;
    ote_status_t st = bench__make_engine(o, o->listen[0] ? o->listen : "127.0.0.1:0", &e);
    if (st != OTE_OK) {
        bench__print_status("ote_engine_create", st);
        if (drv != NULL) (void)ote_cuda_driver_unload(drv);
        return 1;
    }
    size_t need = 0;
    char *text = NULL;
    st = ote_engine_topology(e, NULL, 0, &need);
    if (ote_status_code(st) == OTE_ERR_TOO_BIG && (text = malloc(need)) != NULL)
        st = ote_engine_topology(e, text, need, &need);
    if (st == OTE_OK && need == 0)
        printf("no device ranking: the engine has no RDMA transport (--transport rdma)\n");
    else if (st == OTE_OK) fputs(text, stdout);
    else bench__print_status("ote_engine_topology", st);
    free(text);
    ote_status_t dst = ote_engine_destroy(e);
    if (dst != OTE_OK) bench__print_status("ote_engine_destroy", dst);
    if (drv != NULL && dst == OTE_OK) (void)ote_cuda_driver_unload(drv);
    return st == OTE_OK && dst == OTE_OK ? 0 : 1;
}

int main(int argc, char **argv) {
    bench_options_t o;
    char err[512];
    int p = bench_options_parse(argc, argv, &o, err, sizeof err);
    if (p == 1) {
        fputs(bench_usage(), stdout);
        return 0;
    }
    if (p != 0) {
        fprintf(stderr, "ote_bench: %s\nTry 'ote_bench --help'.\n", err);
        return 2;
    }
    if (o.show_topology) return show_topology(&o);
    install_signals();
    return o.role == BENCH_ROLE_TARGET ? bench__run_target(&o) : bench__run_initiator(&o);
}

/*
 * tests/engine/rdma_slice_cost.c - a fixed RDMA workload for CPU-cost measurement
 * (tools/rdma_slice_cost.sh runs it under valgrind --tool=callgrind).
 *
 * Two engines in this process, both transport=rdma over verbs/sim: a source with a
 * registered 64 MiB buffer and a requester with a registered 64 MiB buffer. After one
 * warm-up transfer (QPs built, MW pool primed), it WRITEs NSLICES 64 KiB slices as
 * 1 MiB requests (16 slices each, one grant each at slice_size=1M), 8 requests per batch,
 * and checks the last batch's bytes. Usage: rdma_slice_cost NSLICES (a multiple of 16).
 * With REQ_MIB=m in the environment (1, 2, 4, 8, 16, 32 or 64) the requests are m MiB
 * each (NSLICES a multiple of 16 m): one grant per request per device it uses, up to
 * rdma_grant_max (OTE_RDMA_GRANT_MAX=1M gives one grant per 1 MiB slice).
 * Prints "slices N" and exits 0 on success.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ote/ote.h"

#define MIB (1u << 20)
#define BUF (64u * MIB)

static ote_engine_t *make(void) {
    ote_config_t *cfg = NULL;
    ote_engine_t *e = NULL;
    if (ote_config_create(&cfg) != OTE_OK) return NULL;
    if (ote_config_set(cfg, "transport", "rdma") == OTE_OK &&
        ote_config_set(cfg, "verbs_provider", "sim") == OTE_OK &&
        ote_config_set(cfg, "slice_size", "1M") == OTE_OK &&
        ote_config_set(cfg, "transfer_timeout_ms", "600000") == OTE_OK)
        (void)ote_engine_create(cfg, &e);
    ote_config_destroy(cfg);
    return e;
}

static size_t g_req = MIB; /* bytes per request */

static int run(ote_engine_t *req, ote_segment_t *seg, uint8_t *local, uint8_t *remote,
               unsigned nreq) {
    ote_batch_t *b = NULL;
    if (ote_batch_create(req, 8, &b) != OTE_OK) return -1;
    int rc = 0;
    for (unsigned done = 0; done < nreq && rc == 0;) {
        ote_request_t r[8];
        unsigned n = nreq - done < 8 ? nreq - done : 8;
        for (unsigned i = 0; i < n; i++) {
            size_t off = (size_t)((done + i) % (BUF / g_req)) * g_req;
            r[i] = (ote_request_t){OTE_WRITE, local + off, seg, (uint64_t)(uintptr_t)(remote + off),
                                   g_req};
        }
        if (ote_batch_submit(b, r, n) != OTE_OK ||
            ote_batch_wait(b, 600ull * 1000000000ull) != OTE_OK || ote_batch_reset(b) != OTE_OK)
            rc = -1;
        done += n;
    }
    if (ote_batch_destroy(b) != OTE_OK) rc = -1;
    return rc;
}

int main(int argc, char **argv) {
    unsigned nslices = argc > 1 ? (unsigned)strtoul(argv[1], NULL, 10) : 1024;
    const char *rm = getenv("REQ_MIB");
    unsigned mib = rm != NULL ? (unsigned)strtoul(rm, NULL, 10) : 1;
    if (mib == 0 || mib > 64 || (64 % mib) != 0 || nslices == 0 || nslices % (16 * mib) != 0) {
        fprintf(stderr,
                "usage: [REQ_MIB=1..64, a power of 2] %s NSLICES (a multiple of 16 x REQ_MIB)\n",
                argv[0]);
        return 2;
    }
    g_req = (size_t)mib * MIB;
    uint8_t *local = malloc(BUF), *remote = calloc(1, BUF);
    ote_engine_t *src = make(), *req = make();
    if (local == NULL || remote == NULL || src == NULL || req == NULL) return 1;
    for (size_t i = 0; i < BUF; i++) local[i] = (uint8_t)(i * 31 + 7);
    char addr[300];
    ote_segment_t *seg = NULL;
    int rc = 1;
    if (ote_memory_register(src, remote, BUF, OTE_PERM_WRITE) == OTE_OK &&
        ote_memory_register(req, local, BUF, OTE_PERM_READ) == OTE_OK &&
        ote_engine_address(src, addr, sizeof(addr)) == OTE_OK &&
        ote_segment_open(req, addr, &seg) == OTE_OK && run(req, seg, local, remote, 1) == 0 &&
        run(req, seg, local, remote, nslices / (16 * mib)) == 0 &&
        memcmp(local, remote, g_req) == 0)
        rc = 0;
    if (seg != NULL && ote_segment_close(seg) != OTE_OK) rc = 1;
    if (ote_engine_destroy(req) != OTE_OK || ote_engine_destroy(src) != OTE_OK) rc = 1;
    free(local);
    free(remote);
    if (rc == 0) printf("slices %u\n", nslices);
    return rc;
}

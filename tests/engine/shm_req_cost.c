/*
 * tests/engine/shm_req_cost.c - a fixed same-host workload for CPU-cost measurement
 * (tools/shm_req_cost.sh runs it under valgrind --tool=callgrind).
 *
 * Two engines in this process, both transports=shm (cross-memory attach to its own
 * process, granted; 4 KiB pieces travel through the ring: the requester stages them with
 * memcpy, the source copies them out with memcpy): a source with a registered 64 MiB
 * buffer and a
 * requester with a registered 64 MiB buffer. After one warm-up batch (the connection
 * made), it WRITEs NREQ 4 KiB requests in batches of 64 and checks the last batch's
 * bytes. Usage: shm_req_cost NREQ (a multiple of 64). Prints "requests N" and exits 0
 * on success.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ote/ote.h"

#define MIB (1u << 20)
#define BUF (64u * MIB)
#define REQ 4096u
#define BATCH 64u

static ote_engine_t *make(void) {
    ote_config_t *cfg = NULL;
    ote_engine_t *e = NULL;
    if (ote_config_create(&cfg) != OTE_OK) return NULL;
    if (ote_config_set(cfg, "transports", "shm") == OTE_OK &&
        ote_config_set(cfg, "listen_address", "127.0.0.1:0") == OTE_OK &&
        ote_config_set(cfg, "transfer_timeout_ms", "600000") == OTE_OK)
        (void)ote_engine_create(cfg, &e);
    ote_config_destroy(cfg);
    return e;
}

static int run(ote_engine_t *req, ote_segment_t *seg, uint8_t *local, uint8_t *remote,
               unsigned nbatches) {
    ote_batch_t *b = NULL;
    if (ote_batch_create(req, BATCH, &b) != OTE_OK) return -1;
    int rc = 0;
    static ote_request_t r[BATCH];
    for (unsigned k = 0; k < nbatches && rc == 0; k++) {
        for (unsigned i = 0; i < BATCH; i++) {
            size_t off = ((size_t)k * BATCH + i) * REQ % BUF;
            r[i] = (ote_request_t){OTE_WRITE, local + off, seg, (uint64_t)(uintptr_t)(remote + off),
                                   REQ};
        }
        if (ote_batch_submit(b, r, BATCH) != OTE_OK ||
            ote_batch_wait(b, 600ull * 1000000000ull) != OTE_OK || ote_batch_reset(b) != OTE_OK)
            rc = -1;
    }
    if (ote_batch_destroy(b) != OTE_OK) rc = -1;
    return rc;
}

int main(int argc, char **argv) {
    unsigned nreq = argc > 1 ? (unsigned)strtoul(argv[1], NULL, 10) : 6400;
    if (nreq == 0 || nreq % BATCH != 0) {
        fprintf(stderr, "usage: %s NREQ (a multiple of %u)\n", argv[0], BATCH);
        return 2;
    }
    uint8_t *local = malloc(BUF), *remote = calloc(1, BUF);
    ote_engine_t *src = make(), *req = make();
    if (local == NULL || remote == NULL || src == NULL || req == NULL) return 1;
    for (size_t i = 0; i < BUF; i++) local[i] = (uint8_t)(i * 31 + 7);
    char addr[300];
    ote_segment_t *seg = NULL;
    ote_segment_info_t info;
    int rc = 1;
    size_t last = ((size_t)(nreq - BATCH) * REQ) % BUF;
    if (ote_memory_register(src, remote, BUF, OTE_PERM_WRITE) == OTE_OK &&
        ote_memory_register(req, local, BUF, OTE_PERM_READ) == OTE_OK &&
        ote_engine_address(src, addr, sizeof(addr)) == OTE_OK &&
        ote_segment_open(req, addr, &seg) == OTE_OK && ote_segment_info(seg, &info) == OTE_OK &&
        strcmp(info.transport, "shm") == 0 && run(req, seg, local, remote, 1) == 0 &&
        run(req, seg, local, remote, nreq / BATCH) == 0 &&
        memcmp(local + last, remote + last, (size_t)BATCH * REQ) == 0)
        rc = 0;
    if (seg != NULL && ote_segment_close(seg) != OTE_OK) rc = 1;
    if (ote_engine_destroy(req) != OTE_OK || ote_engine_destroy(src) != OTE_OK) rc = 1;
    free(local);
    free(remote);
    if (rc == 0) printf("requests %u\n", nreq);
    return rc;
}

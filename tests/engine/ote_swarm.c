/*
 * tests/engine/ote_swarm.c - many peers of one target in one process, for the scale test
 * (rdma_scale_test.cc). Each peer is an engine of its own (config from OTE_* variables:
 * its own verbs/sim instance with rdma), with a 64 KiB buffer.
 *
 * Usage: ote_swarm <target address> <first peer index> <peers>
 * Protocol (one line each way, stdin/stdout):
 *   -> OPEN <ok> <failed>    every peer created its engine and opened its segment
 *   <- go <rw_addr>
 *   -> DONE <ok> <failed>    each peer i WROTE its pattern (seed i) to the target's rw
 *                            at [rw_addr + i * 64 KiB, +64 KiB) in 16 slices of 4 KiB, READ
 *                            it back into a second buffer and compared (ok: bytes equal)
 *   <- close
 *   -> CLOSED <failed>       segments closed, engines destroyed
 * The first failure of each kind is printed on stderr with its status.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ote/ote.h"
#include "tests/engine/pattern.h"

#define SPAN (64u << 10)
#define PIECES 16u

typedef struct {
    ote_engine_t *e;
    ote_segment_t *seg;
    uint8_t *src, *back;
} peer_t;

static int fails_logged;

static void fail(const char *what, uint64_t i, ote_status_t st) {
    if (fails_logged++ < 5)
        fprintf(stderr, "ote_swarm: peer %" PRIu64 ": %s: %s\n", i, what, ote_status_str(st));
}

static ote_status_t open_peer(peer_t *p, const char *target, uint64_t i) {
    ote_status_t st = ote_engine_create(NULL, &p->e);
    if (st != OTE_OK) return st;
    p->src = malloc(SPAN);
    p->back = malloc(SPAN);
    if (p->src == NULL || p->back == NULL) return OTE_ERR_NOMEM;
    ote_pattern_fill(p->src, SPAN, i + 1000, 0);
    st = ote_memory_register(p->e, p->src, SPAN, OTE_PERM_READ | OTE_PERM_WRITE);
    if (st == OTE_OK) st = ote_memory_register(p->e, p->back, SPAN, OTE_PERM_READ | OTE_PERM_WRITE);
    if (st == OTE_OK) st = ote_segment_open(p->e, target, &p->seg);
    return st;
}

/* Submit PIECES requests of op between local and the target's [remote, +SPAN); wait. */
static ote_status_t move(peer_t *p, ote_opcode_t op, uint8_t *local, uint64_t remote) {
    ote_batch_t *b = NULL;
    ote_status_t st = ote_batch_create(p->e, PIECES, &b);
    if (st != OTE_OK) return st;
    ote_request_t r[PIECES];
    uint32_t piece = SPAN / PIECES;
    for (uint32_t k = 0; k < PIECES; k++)
        r[k] = (ote_request_t){op, local + k * piece, p->seg, remote + k * piece, piece};
    st = ote_batch_submit(b, r, PIECES);
    if (st == OTE_OK) st = ote_batch_wait(b, 120ull * 1000000000ull);
    ote_batch_destroy(b);
    return st;
}

static int run(peer_t *ps, uint64_t first, uint64_t n, uint64_t rw) {
    uint64_t ok = 0, bad = 0;
    for (uint64_t j = 0; j < n; j++) {
        peer_t *p = &ps[j];
        uint64_t i = first + j, at = rw + i * SPAN;
        if (p->seg == NULL) {
            bad++;
            continue;
        }
        ote_status_t st = move(p, OTE_WRITE, p->src, at);
        if (st != OTE_OK) fail("WRITE", i, st);
        if (st == OTE_OK) {
            memset(p->back, 0, SPAN);
            st = move(p, OTE_READ, p->back, at);
            if (st != OTE_OK) fail("READ", i, st);
        }
        if (st == OTE_OK && memcmp(p->src, p->back, SPAN) != 0) {
            fail("bytes read back differ from those written", i, OTE_ERR_PROTOCOL);
            st = OTE_ERR_PROTOCOL;
        }
        if (st == OTE_OK) ok++;
        else bad++;
    }
    printf("DONE %" PRIu64 " %" PRIu64 "\n", ok, bad);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 4) return 2;
    const char *target = argv[1];
    uint64_t first = strtoull(argv[2], NULL, 10), n = strtoull(argv[3], NULL, 10);
    peer_t *ps = calloc(n, sizeof(*ps));
    if (ps == NULL) return 3;
    uint64_t ok = 0, bad = 0;
    for (uint64_t j = 0; j < n; j++) {
        ote_status_t st = open_peer(&ps[j], target, first + j);
        if (st == OTE_OK) {
            ok++;
        } else {
            fail("open", first + j, st);
            bad++;
        }
    }
    printf("OPEN %" PRIu64 " %" PRIu64 "\n", ok, bad);
    fflush(stdout);
    char line[128];
    unsigned long long rw = 0;
    if (fgets(line, sizeof(line), stdin) == NULL || sscanf(line, "go %llu", &rw) != 1) return 4;
    run(ps, first, n, rw);
    if (fgets(line, sizeof(line), stdin) == NULL || strncmp(line, "close", 5) != 0) return 5;
    uint64_t cbad = 0;
    for (uint64_t j = 0; j < n; j++) {
        peer_t *p = &ps[j];
        if (p->seg != NULL && ote_segment_close(p->seg) != OTE_OK) cbad++;
        if (p->e != NULL && ote_engine_destroy(p->e) != OTE_OK) cbad++;
        free(p->src);
        free(p->back);
    }
    free(ps);
    printf("CLOSED %" PRIu64 "\n", cbad);
    fflush(stdout);
    return 0;
}

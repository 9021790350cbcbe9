/*
 * A C11 program written against Mooncake's C API (transfer_engine_c.h) and linked with
 * libmooncake_transfer_engine_compat.so, as a Mooncake user's program would be: two
 * engines, a WRITE of three blocks and a READ back, bytes checked. Exit 0 on success.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "transfer_engine_c.h"

#define BLOCK 4096u
#define BLOCKS 3u

static int fail(const char *what) {
    fprintf(stderr, "mooncake_c_abi_test: %s\n", what);
    return 1;
}

/* Poll task until it leaves STATUS_PENDING (10 s at most): its status, or -1. */
static int wait_task(transfer_engine_t e, batch_id_t batch, size_t task) {
    struct timespec pause = {0, 1000000};
    for (int i = 0; i < 10000; i++) {
        transfer_status_t st;
        if (getTransferStatus(e, batch, task, &st) != 0) return -1;
        if (st.status != STATUS_PENDING) return st.status;
        nanosleep(&pause, NULL);
    }
    return -1;
}

static int move(transfer_engine_t a, segment_id_t seg, int opcode, char *local, char *remote) {
    batch_id_t batch = allocateBatchID(a, BLOCKS);
    if (batch == INVALID_BATCH) return fail("allocateBatchID");
    transfer_request_t reqs[BLOCKS];
    for (unsigned i = 0; i < BLOCKS; i++)
        reqs[i] = (transfer_request_t){opcode, local + i * BLOCK, seg,
                                       (uint64_t)(uintptr_t)(remote + i * BLOCK), BLOCK};
    if (submitTransfer(a, batch, reqs, BLOCKS) != 0) return fail("submitTransfer");
    for (unsigned i = 0; i < BLOCKS; i++)
        if (wait_task(a, batch, i) != STATUS_COMPLETED) return fail("a task did not complete");
    return freeBatchID(a, batch) == 0 ? 0 : fail("freeBatchID");
}

int main(void) {
    transfer_engine_t a = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", 0, 0);
    transfer_engine_t b = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", 0, 0);
    if (a == NULL || b == NULL) return fail("createTransferEngine");
    if (installTransport(a, "tcp", NULL) == NULL || installTransport(b, "tcp", NULL) == NULL)
        return fail("installTransport");
    static char src[BLOCKS * BLOCK], dst[BLOCKS * BLOCK], back[BLOCKS * BLOCK];
    for (unsigned i = 0; i < sizeof src; i++) src[i] = (char)(i * 31 + 7);
    buffer_entry_t mine[] = {{src, sizeof src}, {back, sizeof back}};
    if (registerLocalMemoryBatch(a, mine, 2, "cpu:0") != 0 ||
        registerLocalMemory(b, dst, sizeof dst, "cpu:0", 1) != 0)
        return fail("registerLocalMemory");
    char peer[300];
    if (getLocalIpAndPort(b, peer, sizeof peer) != 0) return fail("getLocalIpAndPort");
    segment_id_t seg = openSegment(a, peer);
    if (seg < 0) return fail("openSegment");
    if (move(a, seg, OPCODE_WRITE, src, dst) != 0) return 1;
    if (memcmp(src, dst, sizeof src) != 0) return fail("WRITE: bytes differ");
    if (move(a, seg, OPCODE_READ, back, dst) != 0) return 1;
    if (memcmp(src, back, sizeof src) != 0) return fail("READ: bytes differ");
    if (closeSegment(a, seg) != 0) return fail("closeSegment");
    destroyTransferEngine(a);
    destroyTransferEngine(b);
    printf("mooncake_c_abi_test: ok\n");
    return 0;
}

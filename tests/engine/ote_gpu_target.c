/*
 * tests/engine/ote_gpu_target.c - the target engine of the GPU staging tests, run as a
 * child process (tests/engine/gpu_staging_test.cc, gpu_rdma_staging_test.cc). It loads the
 * CUDA driver named by $OTE_CUDA_LIBRARY (the fake libcuda in tests), allocates two
 * device buffers on device 0 through cuda/memory and one host buffer, registers them
 * (read and write) as "dev", "host" and "dev2", prints one READY line in the format of
 * ote_target and then obeys one command per stdin line:
 *
 *   READY <address> <dev_addr> <dev_len> <host_addr> <host_len> <dev2_addr> <dev2_len>
 *   fill <dev|host|dev2> <seed> [len] -> OK | ERR     fill with the seed pattern (bytes
 *                                                     [0, len) when len is given, not 0;
 *                                                     ERR past the buffer)
 *   sum <dev|host|dev2> <off> <len>   -> SUM <hex>    hash of a range (device memory is
 *                                                     read with a device-to-host copy)
 *   fail <entry> <nth> <count> <res>  -> OK | ERR     arm a fault of the fake driver
 *   clear                             -> OK           disarm the fake's faults
 *   live                              -> LIVE <streams> <events> <pending_ops> <host_allocs>
 *                                        (the fake's live objects)
 *   ipc                               -> IPC <exports> <imports>  (the fake's IPC counters)
 *   unreg <dev|host|dev2>             -> ST <status>  ote_memory_unregister of the buffer
 *   reg <dev|host|dev2>               -> ST <status>  register it again (same perms)
 *   gpu                               -> GPU <staged_source> <ipc_exports>
 *                                        (ote_engine_gpu_stats of its engine)
 *   delay <us>                        -> OK           the fake's stream delay bound
 *   hold <pass>                       -> OK           close the fake's copy gate: `pass`
 *                                                     more copies run, later ones wait
 *   held                              -> HELD <now> <total>  copies waiting at the gate
 *   release                           -> OK           open the copy gate
 *   grants                            -> GRANTS <direct_mrs> <direct_served> <direct_redirects>
 *                                        (its RDMA transport's GPUDirect source grants:
 *                                        exact MRs live now, served, redirects sent)
 *   hostile <kind>                    -> HOSTILE <code> <addr> <len> <perms>  a range
 *                                        (tests/engine/hostile_ranges.h, or "freeddev": a
 *                                        device allocation freed first) given to
 *                                        ote_memory_register: its status
 *   quit / end of input               -> exits 0 after destroying the engine and memory
 *
 * Usage: ote_gpu_target [dev_size] [listen_address]. Config also from OTE_* variables;
 * OTE_GPU_TARGET_DEVICE=N puts the device buffers on device N (default 0);
 * OTE_GPU_TARGET_IPC=1 registers them with OTE_PERM_IPC too; OTE_GPU_TARGET_VMM=1 makes
 * them VMM allocations (cuMemCreate exportable as a POSIX fd, through cuda/memory),
 * OTE_GPU_TARGET_VMM=nofd VMM allocations created without any shareable handle type
 * (made here with the driver's own calls).
 */
#include <dlfcn.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/driver.h"
#include "cuda/memory/device.h"
#include "cuda/memory/memory.h"
#include "engine/rdma/test_hook.h"
#include "ote/ote.h"
#include "tests/cuda/fake_cuda_control.h"
#include "tests/engine/hostile_ranges.h"
#include "tests/engine/pattern.h"
#include "tests/util/sync_point.h"

typedef struct {
    const char *name;
    uint64_t addr;
    size_t len;
    int device;
    ote_cuda_alloc_t *alloc;
    uint8_t *host;
    ote_cu_mem_handle_t nofd; /* a VMM allocation without a shareable handle type */
    size_t nofd_size;
} gbuf_t;

static const ote_cuda_driver_table_t *g_t;

/* hostile <kind>: a range made and registered here (tests/engine/hostile_ranges.h), or
 * "freeddev": a device allocation freed before it is registered. The reply line. */
static const char *hostile(ote_engine_t *e, const char *kind) {
    static char reply[96];
    uint64_t addr = 0, len = 0;
    unsigned perms = OTE_PERM_READ | OTE_PERM_WRITE;
    if (strcmp(kind, "freeddev") == 0) {
        ote_cu_deviceptr_t d = 0;
        len = 2 << 20;
        if (g_t->cuMemAlloc(&d, len) != 0 || g_t->cuMemFree(d) != 0) return "ERR freeddev";
        addr = d;
    } else if (ote_test_hostile_range(kind, &addr, &len, &perms) != 0) {
        return "ERR bad hostile";
    }
    ote_status_t st = ote_memory_register(e, (void *)(uintptr_t)addr, len, perms);
    snprintf(reply, sizeof(reply), "HOSTILE %d %" PRIu64 " %" PRIu64 " %u", (int)st, addr, len,
             perms);
    return reply;
}

static ote_cuda_device_t *g_dev;

/* The device's context current on this thread, and its legacy stream drained. */
static int dev_sync(void) {
    if (ote_cuda_device_make_current(g_dev) != OTE_OK) return -1;
    return g_t->cuStreamSynchronize(NULL) == 0 ? 0 : -1;
}

/* fill's and sum's host side for device buffers: 4 MiB reused, so that a command
 * allocates (and faults in) nothing. The command loop runs on one thread. */
static uint8_t g_scratch[4 << 20];

/* Bytes [0, len) of the buffer := the seed pattern (len 0: the whole buffer; more than
 * the buffer: -1, nothing written). fresh: the buffer is new, not yet registered, and
 * the fill is not instrumented (ote_pattern_fill_fresh; g_scratch is this thread's, and a
 * synchronous copy has read it when it returns). A device
 * buffer is written piece by piece through g_scratch: a synchronous copy from pageable
 * memory has taken its source bytes when it returns. */
static int fill(gbuf_t *b, uint64_t seed, uint64_t len, int fresh) {
    if (len > b->len) return -1;
    if (len == 0) len = b->len;
    if (!b->device) {
        if (fresh) ote_pattern_fill_fresh(b->host, len, seed, 0);
        else ote_pattern_fill(b->host, len, seed, 0);
        return 0;
    }
    int rc = dev_sync();
    for (uint64_t done = 0; rc == 0 && done < len;) {
        size_t n = len - done < sizeof(g_scratch) ? (size_t)(len - done) : sizeof(g_scratch);
        if (fresh) ote_pattern_fill_fresh(g_scratch, n, seed, done);
        else ote_pattern_fill(g_scratch, n, seed, done);
        if (g_t->cuMemcpyHtoD(b->addr + done, g_scratch, n) != 0) rc = -1;
        done += n;
    }
    return rc == 0 ? dev_sync() : rc;
}

static int sum(gbuf_t *b, uint64_t off, uint64_t len, uint64_t *out) {
    if (!b->device) {
        *out = ote_hash(b->host + off, len);
        return 0;
    }
    uint64_t h = ote_hash_begin(len);
    int rc = dev_sync();
    for (uint64_t done = 0; rc == 0 && done < len;) { /* 4 MiB pieces: multiples of 8 */
        size_t n = len - done < sizeof(g_scratch) ? (size_t)(len - done) : sizeof(g_scratch);
        if (g_t->cuMemcpyDtoH(g_scratch, b->addr + off + done, n) != 0) rc = -1;
        else h = ote_hash_more(h, g_scratch, n);
        done += n;
    }
    if (rc == 0) *out = h;
    return rc;
}

/* A VMM allocation of at least b->len bytes created without a shareable handle type:
 * reserved, mapped and made accessible on device `ordinal`. */
static int nofd_alloc(gbuf_t *b, int ordinal) {
    ote_cu_mem_allocation_prop_t prop = {0};
    prop.type = OTE_CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requested_handle_types = 0;
    prop.location.type = OTE_CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ordinal;
    size_t gran = 0;
    if (ote_cuda_device_make_current(g_dev) != OTE_OK ||
        g_t->cuMemGetAllocationGranularity(&gran, &prop, OTE_CU_MEM_ALLOC_GRANULARITY_MINIMUM) !=
            0 ||
        gran == 0)
        return -1;
    b->nofd_size = (b->len + gran - 1) / gran * gran;
    ote_cu_deviceptr_t p = 0;
    ote_cu_mem_access_desc_t ad = {{OTE_CU_MEM_LOCATION_TYPE_DEVICE, ordinal},
                                   OTE_CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    if (g_t->cuMemCreate(&b->nofd, b->nofd_size, &prop, 0) != 0 ||
        g_t->cuMemAddressReserve(&p, b->nofd_size, 0, 0, 0) != 0 ||
        g_t->cuMemMap(p, b->nofd_size, 0, b->nofd, 0) != 0 ||
        g_t->cuMemSetAccess(p, b->nofd_size, &ad, 1) != 0)
        return -1;
    b->addr = p;
    return 0;
}

static void nofd_free(gbuf_t *b) {
    if (b->nofd == 0) return;
    (void)ote_cuda_device_make_current(g_dev);
    (void)g_t->cuMemUnmap(b->addr, b->nofd_size);
    (void)g_t->cuMemAddressFree(b->addr, b->nofd_size);
    (void)g_t->cuMemRelease(b->nofd);
}

int main(int argc, char **argv) {
    size_t dev_len = argc > 1 ? strtoull(argv[1], NULL, 0) : (64u << 20);
    ote_cuda_driver_t *drv = NULL;
    ote_cuda_device_t *dev = NULL;
    if (ote_cuda_driver_load(NULL, &drv) != OTE_OK) return 10;
    g_t = ote_cuda_driver_table(drv);
    const char *devenv = getenv("OTE_GPU_TARGET_DEVICE");
    int ordinal = devenv != NULL ? atoi(devenv) : 0;
    const char *ipcenv = getenv("OTE_GPU_TARGET_IPC"); /* "1": device buffers OTE_PERM_IPC */
    int ipc_optin = ipcenv != NULL && strcmp(ipcenv, "1") == 0;
    const char *vmmenv = getenv("OTE_GPU_TARGET_VMM"); /* "1" or "nofd" */
    int vmm = vmmenv != NULL && strcmp(vmmenv, "1") == 0;
    int vmm_nofd = vmmenv != NULL && strcmp(vmmenv, "nofd") == 0;
    if (ote_cuda_device_open(drv, ordinal, &dev) != OTE_OK) return 11;
    g_dev = dev;
    void *dl = ote_cuda_driver_dl_handle(drv);
    fake_cuda_fail_fn fail = dl ? (fake_cuda_fail_fn)dlsym(dl, "fake_cuda_fail") : NULL;
    fake_cuda_clear_faults_fn clear =
        dl ? (fake_cuda_clear_faults_fn)dlsym(dl, "fake_cuda_clear_faults") : NULL;
    fake_cuda_counters_fn counters =
        dl ? (fake_cuda_counters_fn)dlsym(dl, "fake_cuda_counters") : NULL;
    fake_cuda_set_max_delay_us_fn delay =
        dl ? (fake_cuda_set_max_delay_us_fn)dlsym(dl, "fake_cuda_set_max_delay_us") : NULL;
    fake_cuda_hold_copies_fn hold =
        dl ? (fake_cuda_hold_copies_fn)dlsym(dl, "fake_cuda_hold_copies") : NULL;
    fake_cuda_release_copies_fn release =
        dl ? (fake_cuda_release_copies_fn)dlsym(dl, "fake_cuda_release_copies") : NULL;

    ote_config_t *cfg = NULL;
    if (ote_config_create(&cfg) != OTE_OK) return 2;
    if (argc > 2 && ote_config_set(cfg, "listen_address", argv[2]) != OTE_OK) return 2;
    ote_engine_t *e = NULL;
    ote_status_t st = ote_engine_create(cfg, &e);
    ote_config_destroy(cfg);
    if (st != OTE_OK) {
        printf("ST %d\n", st);
        return 3;
    }
    gbuf_t bufs[3] = {{"dev", 0, dev_len, 1, NULL, NULL, 0, 0},
                      {"host", 0, dev_len, 0, NULL, NULL, 0, 0},
                      {"dev2", 0, 1u << 20, 1, NULL, NULL, 0, 0}};
    for (int i = 0; i < 3; i++) {
        gbuf_t *b = &bufs[i];
        if (b->device && vmm_nofd) {
            if (nofd_alloc(b, ordinal) != 0) return 4;
        } else if (b->device) {
            if (ote_cuda_alloc_create(dev, b->len, vmm ? OTE_CUDA_ALLOC_VMM : 0, &b->alloc) !=
                OTE_OK)
                return 4;
            b->addr = ote_cuda_alloc_ptr(b->alloc);
        } else {
            b->host = malloc(b->len);
            if (b->host == NULL) return 4;
            b->addr = (uintptr_t)b->host;
        }
        if (fill(b, (uint64_t)(i + 1), 0, 1) != 0) return 4;
        unsigned perms = OTE_PERM_READ | OTE_PERM_WRITE;
        if (b->device && ipc_optin) perms |= OTE_PERM_IPC;
        st = ote_memory_register_named(e, (void *)(uintptr_t)b->addr, b->len, perms, b->name);
        if (st != OTE_OK) {
            printf("ST %d\n", st);
            return 5;
        }
    }
    char addr[300];
    if (ote_engine_address(e, addr, sizeof(addr)) != OTE_OK) return 6;
    printf("READY %s %" PRIu64 " %zu %" PRIu64 " %zu %" PRIu64 " %zu\n", addr, bufs[0].addr,
           bufs[0].len, bufs[1].addr, bufs[1].len, bufs[2].addr, bufs[2].len);
    fflush(stdout);

    char line[512];
    while (fgets(line, sizeof(line), stdin) != NULL) {
        ote_test_sync_point(); /* after the test's requests that came before the command */
        char cmd[16] = "", which[64] = "";
        unsigned long long a = 0, b = 0;
        int c1 = 0, c2 = 0;
        int n = sscanf(line, "%15s %63s %llu %llu", cmd, which, &a, &b);
        if (n >= 1 && strcmp(cmd, "quit") == 0) break;
        gbuf_t *bf = NULL;
        for (int i = 0; n >= 2 && i < 3; i++)
            if (strcmp(bufs[i].name, which) == 0) bf = &bufs[i];
        if (strcmp(cmd, "fill") == 0 && bf && n >= 3) { /* fill NAME SEED [LEN] */
            printf(fill(bf, a, n >= 4 ? b : 0, 0) == 0 ? "OK\n" : "ERR fill\n");
        } else if (strcmp(cmd, "sum") == 0 && bf && n >= 4 && a <= bf->len && b <= bf->len - a) {
            uint64_t h = 0;
            if (sum(bf, a, b, &h) == 0) printf("SUM %016" PRIx64 "\n", h);
            else printf("ERR sum\n");
        } else if (strcmp(cmd, "fail") == 0 &&
                   sscanf(line, "%15s %63s %d %d %llu", cmd, which, &c1, &c2, &a) == 5 && fail) {
            fail(which, c1, c2, (int)a);
            printf("OK\n");
        } else if (strcmp(cmd, "clear") == 0 && clear) {
            clear();
            printf("OK\n");
        } else if (strcmp(cmd, "live") == 0 && counters) {
            fake_cuda_counters_t c;
            counters(&c);
            printf("LIVE %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", c.streams, c.events,
                   c.pending_ops, c.host_allocs);
        } else if (strcmp(cmd, "unreg") == 0 && bf) {
            printf("ST %d\n", (int)ote_memory_unregister(e, (void *)(uintptr_t)bf->addr));
        } else if (strcmp(cmd, "reg") == 0 && bf) {
            unsigned perms = OTE_PERM_READ | OTE_PERM_WRITE;
            if (bf->device && ipc_optin) perms |= OTE_PERM_IPC;
            printf("ST %d\n", (int)ote_memory_register_named(e, (void *)(uintptr_t)bf->addr,
                                                             bf->len, perms, bf->name));
        } else if (strcmp(cmd, "gpu") == 0) {
            ote_gpu_stats_t gs;
            if (ote_engine_gpu_stats(e, &gs) == OTE_OK)
                printf("GPU %" PRIu64 " %" PRIu64 "\n", gs.staged_source, gs.ipc_exports);
            else printf("ERR gpu\n");
        } else if (strcmp(cmd, "delay") == 0 && n >= 2 && delay) {
            delay((unsigned)strtoul(which, NULL, 10));
            printf("OK\n");
        } else if (strcmp(cmd, "hold") == 0 && n >= 2 && hold) {
            hold((unsigned)strtoul(which, NULL, 10));
            printf("OK\n");
        } else if (strcmp(cmd, "held") == 0 && counters) {
            fake_cuda_counters_t c;
            counters(&c);
            printf("HELD %" PRIu64 " %" PRIu64 "\n", c.copies_held, c.copies_held_total);
        } else if (strcmp(cmd, "release") == 0 && release) {
            release();
            printf("OK\n");
        } else if (strcmp(cmd, "grants") == 0) {
            ote__rdma_test_grants_t g;
            if (ote__rdma_test_grants(addr, &g) == OTE_OK)
                printf("GRANTS %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", g.direct_mrs,
                       g.direct_served, g.direct_redirects);
            else printf("ERR grants\n");
        } else if (strcmp(cmd, "hostile") == 0) {
            printf("%s\n", hostile(e, which));
        } else if (strcmp(cmd, "ipc") == 0 && counters) {
            fake_cuda_counters_t c;
            counters(&c);
            printf("IPC %" PRIu64 " %" PRIu64 "\n", c.ipc_exports, c.ipc_imports);
        } else {
            printf("ERR bad command\n");
        }
        ote_test_sync_point(); /* before the requests that come after the answer */
        fflush(stdout);
    }
    st = ote_engine_destroy(e);
    for (int i = 0; i < 3; i++) {
        if (bufs[i].alloc)
            (void)ote_cuda_alloc_destroy(bufs[i].alloc, ote_deadline_after(OTE_NSEC_PER_SEC * 10));
        nofd_free(&bufs[i]);
        free(bufs[i].host);
    }
    (void)ote_cuda_device_close(dev);
    (void)ote_cuda_driver_unload(drv);
    return st == OTE_OK ? 0 : 7;
}

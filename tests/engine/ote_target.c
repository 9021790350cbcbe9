/*
 * tests/engine/ote_target.c - the target engine of the end-to-end tests, run as a child
 * process. It registers three buffers under their names ("rw", "ro", "wo": what buffer
 * discovery lists), prints one READY line on stdout and then obeys
 * one command per stdin line (answering one line each):
 *
 *   READY <address> <rw_addr> <rw_len> <ro_addr> <ro_len> <wo_addr> <wo_len>
 *   fill <rw|ro|wo> <seed>          -> OK              fill with the seed pattern
 *   sum <rw|ro|wo> <off> <len>      -> SUM <hex>       hash of a range
 *   unreg <rw|ro|wo>                -> ST <code>       ote_memory_unregister status
 *   recv <timeout_ms> <off> <len>   -> NOTE <len> <text> SUM <hex> | ST <code>
 *                                      (hash of rw[off, off+len) taken on arrival)
 *   recvunreg <timeout_ms>          -> ST <recv code> <unregister code of rw>  the unregister
 *                                      called the moment the notification is received
 *   rereg <rw|ro|wo>                -> ST <code>       register it again (same perms, name)
 *   unregloop <ms>                  -> ST <ok> <busy>  unregister rw again and again for ms
 *                                      (registering it again after each success)
 *   pull <host:port> <addr> <len> <n> -> STARTED | ST <code>  n READs of len bytes at addr
 *                                      of that engine, each into its own len bytes of a
 *                                      registered n * len mapping (no two READs in flight
 *                                      write the same bytes), submitted, answered once
 *                                      some bytes arrived (so that the source has taken
 *                                      them: 30 s at most, else ST <OTE_ERR_TIMEOUT>), not
 *                                      waited for (the process is meant to be killed
 *                                      meanwhile)
 *   hostile <kind>                  -> HOSTILE <code> <addr> <len> <perms>  a range of that
 *                                      kind (tests/engine/hostile_ranges.h) made and given
 *                                      to ote_memory_register: its status
 *   stat                            -> STAT <fds> <rss_kb>  open fds and resident memory
 *                                      (VmRSS, after malloc_trim) of this process
 *   quit / end of input             -> exits 0 after destroying the engine
 *
 * Usage: ote_target [rw_size] [listen_address]. Config also from OTE_* variables.
 */
#include <dirent.h>
#include <inttypes.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "ote/ote.h"
#include "tests/engine/hostile_ranges.h"
#include "tests/engine/pattern.h"
#include "tests/util/sync_point.h"

typedef struct {
    const char *name;
    uint8_t *p;
    size_t len;
    unsigned perms;
} buf_t;

static buf_t *find(buf_t *b, const char *name) {
    for (int i = 0; i < 3; i++)
        if (strcmp(b[i].name, name) == 0) return &b[i];
    return NULL;
}

/* hostile <kind>: a range the engine must refuse (or serve safely), made and registered
 * here (tests/engine/hostile_ranges.h). Returns the reply line. */
static const char *hostile(ote_engine_t *e, const char *line) {
    static char reply[96];
    char cmd[16], kind[32];
    uint64_t addr = 0, len = 0;
    unsigned perms = 0;
    if (sscanf(line, "%15s %31s", cmd, kind) != 2 ||
        ote_test_hostile_range(kind, &addr, &len, &perms) != 0)
        return "ERR bad hostile";
    ote_status_t st = ote_memory_register(e, (void *)(uintptr_t)addr, len, perms);
    snprintf(reply, sizeof(reply), "HOSTILE %d %" PRIu64 " %" PRIu64 " %u", (int)st, addr, len,
             perms);
    return reply;
}

/* Whether some request of b (n submitted) has moved bytes or ended. */
static int pull_moved(ote_batch_t *b, unsigned long long n) {
    for (unsigned long long i = 0; i < n; i++) {
        ote_transfer_status_t ts;
        if (ote_batch_status(b, (size_t)i, &ts) != OTE_OK) return 1; /* cannot tell: go on */
        if (ts.bytes_done > 0 || ts.state != OTE_TRANSFER_PENDING) return 1;
    }
    return 0;
}

/* pull: n READs from another engine, left running, each into its own len bytes of a
 * mapping of n * len registered for them (MAP_NORESERVE: only what arrives is touched).
 * READs in flight into the same bytes would race (the sim writes each connection's
 * payload on that connection's thread: ThreadSanitizer saw it). The segment, batch and
 * mapping stay (the process is killed while they run). The reply comes once bytes
 * arrived, so the source is serving (and has pinned) them when the caller acts on it,
 * however slowly either process runs; a fixed pause instead was a guess. */
static const char *pull(ote_engine_t *e, const char *line) {
    static char reply[32];
    char cmd[16], peer[300];
    unsigned long long addr = 0, len = 0, n = 0;
    if (sscanf(line, "%15s %299s %llu %llu %llu", cmd, peer, &addr, &len, &n) != 5 || len == 0 ||
        len > (1ull << 30) || n == 0 || n > 1024)
        return "ERR bad pull";
    uint8_t *dst = mmap(NULL, n * len, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (dst == MAP_FAILED) return "ERR pull: mmap";
    ote_segment_t *seg = NULL;
    ote_batch_t *b = NULL;
    ote_status_t st = ote_memory_register(e, dst, n * len, OTE_PERM_READ | OTE_PERM_WRITE);
    if (st == OTE_OK) st = ote_segment_open(e, peer, &seg);
    if (st == OTE_OK) st = ote_batch_create(e, n, &b);
    for (unsigned long long i = 0; st == OTE_OK && i < n; i++) {
        ote_request_t r = {OTE_READ, dst + i * len, seg, addr, len};
        st = ote_batch_submit(b, &r, 1);
    }
    if (st != OTE_OK) {
        snprintf(reply, sizeof(reply), "ST %d", st);
        return reply;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (!pull_moved(b, n)) {
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (t1.tv_sec - t0.tv_sec >= 30) {
            snprintf(reply, sizeof(reply), "ST %d", OTE_ERR_TIMEOUT);
            return reply;
        }
        struct timespec pause = {0, 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    return "STARTED";
}

/* stat: "STAT <open fds> <VmRSS in KiB>", freed heap given back to the kernel first. */
static const char *stat_line(void) {
    static char reply[64];
    malloc_trim(0);
    long fds = 0, rss = -1;
    DIR *d = opendir("/proc/self/fd");
    if (d != NULL) {
        for (struct dirent *de = readdir(d); de != NULL; de = readdir(d))
            if (de->d_name[0] != '.') fds++;
        closedir(d);
        fds--; /* the directory's own fd */
    }
    FILE *f = fopen("/proc/self/status", "r");
    char l[128];
    while (f != NULL && fgets(l, sizeof(l), f) != NULL)
        if (sscanf(l, "VmRSS: %ld", &rss) == 1) break;
    if (f != NULL) fclose(f);
    snprintf(reply, sizeof(reply), "STAT %ld %ld", fds, rss);
    return reply;
}

int main(int argc, char **argv) {
    size_t rw_len = argc > 1 ? strtoull(argv[1], NULL, 0) : (64u << 20);
    /* OTE_TARGET_UID: run as that uid (and gid), for tests of a peer of another uid;
     * needs root. Dumpable again afterwards, so /proc/self stays readable. */
    const char *as_uid = getenv("OTE_TARGET_UID");
    if (as_uid != NULL) {
        unsigned long id = strtoul(as_uid, NULL, 10);
        if (setgid((gid_t)id) != 0 || setuid((uid_t)id) != 0) return 7;
        if (prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) != 0) return 7;
    }
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
    buf_t bufs[3] = {{"rw", NULL, rw_len, OTE_PERM_READ | OTE_PERM_WRITE},
                     {"ro", NULL, 1u << 20, OTE_PERM_READ},
                     {"wo", NULL, 1u << 20, OTE_PERM_WRITE}};
    for (int i = 0; i < 3; i++) {
        void *m =
            mmap(NULL, bufs[i].len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return 4;
        bufs[i].p = m;
        ote_pattern_fill_fresh(bufs[i].p, bufs[i].len, (uint64_t)(i + 1), 0); /* not yet shared */
        if (ote_memory_register_named(e, bufs[i].p, bufs[i].len, bufs[i].perms, bufs[i].name) !=
            OTE_OK)
            return 5;
    }
    char addr[300];
    if (ote_engine_address(e, addr, sizeof(addr)) != OTE_OK) return 6;
    printf("READY %s %" PRIuPTR " %zu %" PRIuPTR " %zu %" PRIuPTR " %zu\n", addr,
           (uintptr_t)bufs[0].p, bufs[0].len, (uintptr_t)bufs[1].p, bufs[1].len,
           (uintptr_t)bufs[2].p, bufs[2].len);
    fflush(stdout);

    char line[512];
    while (fgets(line, sizeof(line), stdin) != NULL) {
        ote_test_sync_point(); /* after the test's requests that came before the command */
        char cmd[16] = "", which[8] = "";
        unsigned long long a = 0, b = 0, c = 0;
        int n = sscanf(line, "%15s %7s %llu %llu", cmd, which, &a, &b);
        if (n >= 1 && strcmp(cmd, "quit") == 0) break;
        buf_t *bf = n >= 2 ? find(bufs, which) : NULL;
        if (strcmp(cmd, "fill") == 0 && bf && n >= 3) {
            ote_pattern_fill(bf->p, bf->len, a, 0);
            printf("OK\n");
        } else if (strcmp(cmd, "sum") == 0 && bf && n >= 4 && a <= bf->len && b <= bf->len - a) {
            printf("SUM %016" PRIx64 "\n", ote_hash(bf->p + a, b));
        } else if (strcmp(cmd, "unreg") == 0 && bf) {
            printf("ST %d\n", ote_memory_unregister(e, bf->p));
        } else if (strcmp(cmd, "recv") == 0 &&
                   sscanf(line, "%15s %llu %llu %llu", cmd, &a, &b, &c) == 4 && b <= bufs[0].len &&
                   c <= bufs[0].len - b) {
            char msg[OTE_NOTIFY_MAX + 1], from[300];
            size_t len = 0;
            st = ote_notify_recv(e, msg, OTE_NOTIFY_MAX, &len, from, sizeof(from), a * 1000000ull);
            if (st != OTE_OK) {
                printf("ST %d\n", st);
            } else {
                uint64_t h = ote_hash(bufs[0].p + b, c); /* at arrival: data must be there */
                msg[len] = '\0';
                printf("NOTE %zu %s SUM %016" PRIx64 " FROM %s\n", len, msg, h, from);
            }
        } else if (strcmp(cmd, "recvunreg") == 0 && sscanf(line, "%15s %llu", cmd, &a) == 2) {
            char msg[OTE_NOTIFY_MAX];
            size_t len = 0;
            st = ote_notify_recv(e, msg, sizeof(msg), &len, NULL, 0, a * 1000000ull);
            ote_status_t ust = st == OTE_OK ? ote_memory_unregister(e, bufs[0].p) : OTE_OK;
            printf("ST %d %d\n", st, ust);
        } else if (strcmp(cmd, "unregloop") == 0 && sscanf(line, "%15s %llu", cmd, &a) == 2) {
            unsigned long long ok = 0, busy = 0;
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            do {
                st = ote_memory_unregister(e, bufs[0].p);
                if (st == OTE_OK) {
                    ok++;
                    if (ote_memory_register_named(e, bufs[0].p, bufs[0].len, bufs[0].perms,
                                                  bufs[0].name) != OTE_OK)
                        return 8;
                } else {
                    busy++;
                }
                struct timespec pause = {0, 200 * 1000}; /* let the engine's workers run */
                nanosleep(&pause, NULL);
                clock_gettime(CLOCK_MONOTONIC, &t1);
            } while ((unsigned long long)(t1.tv_sec - t0.tv_sec) * 1000ull +
                         (unsigned long long)(t1.tv_nsec / 1000000) <
                     a + (unsigned long long)(t0.tv_nsec / 1000000));
            printf("ST %llu %llu\n", ok, busy);
        } else if (strcmp(cmd, "rereg") == 0 && bf) {
            printf("ST %d\n", ote_memory_register_named(e, bf->p, bf->len, bf->perms, bf->name));
        } else if (strcmp(cmd, "pull") == 0) {
            printf("%s\n", pull(e, line));
        } else if (strcmp(cmd, "stat") == 0) {
            printf("%s\n", stat_line());
        } else if (strcmp(cmd, "hostile") == 0) {
            printf("%s\n", hostile(e, line));
        } else {
            printf("ERR bad command\n");
        }
        ote_test_sync_point(); /* before the requests that come after the answer */
        fflush(stdout);
    }
    st = ote_engine_destroy(e);
    for (int i = 0; i < 3; i++) munmap(bufs[i].p, bufs[i].len);
    return st == OTE_OK ? 0 : 7;
}

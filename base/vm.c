/* base/vm.c - whether a range of this process's memory can be touched (see vm.h). */
#include "base/vm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/fault.h"

/* One line of /proc/self/maps: "start-end perms offset dev inode   path". */
typedef struct {
    uint64_t start, end;
    unsigned prot; /* OTE_VM_READ / OTE_VM_WRITE */
    int file;      /* backed by a file (inode != 0): may end before the mapping does */
    char name[80]; /* "r--p /path" for a report */
} vm_map_t;

/* The scan of the maps text, fed line by line. */
typedef struct {
    uint64_t addr, end; /* the range asked */
    unsigned access;
    uint64_t cur;  /* the first byte not yet found mapped with the access */
    unsigned prot; /* what every mapping so far had */
    int done;
    ote_vm_report_t *out;
} vm_scan_t;

static uint64_t page_size(void) {
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (uint64_t)p : 4096;
}

/* Reads one byte at a from this process through the kernel (no signal on a bad page):
 * 1 when it could be read, 0 when not (EFAULT), -1 when the call itself is unavailable
 * (seccomp, an old kernel): nothing can be said then. */
static int probe_byte(uint64_t a) {
    char b;
    struct iovec l = {&b, 1}, r = {(void *)(uintptr_t)a, 1};
    ssize_t n = process_vm_readv(getpid(), &l, 1, &r, 1, 0);
    if (n == 1) return 1;
    return n < 0 && errno == EFAULT ? 0 : -1;
}

static int parse_line(const char *s, vm_map_t *m) {
    unsigned long long start, end, off, inode;
    char perms[8];
    int path_at = 0;
    if (sscanf(s, "%llx-%llx %7s %llx %*s %llu %n", &start, &end, perms, &off, &inode, &path_at) <
        5)
        return -1;
    m->start = start;
    m->end = end;
    m->prot = (perms[0] == 'r' ? OTE_VM_READ : 0) | (perms[1] == 'w' ? OTE_VM_WRITE : 0);
    m->file = inode != 0;
    const char *path = path_at > 0 ? s + path_at : "";
    snprintf(m->name, sizeof(m->name), "%.4s %s", perms, path[0] ? path : "[anon]");
    return 0;
}

static void refuse(vm_scan_t *sc, ote_vm_verdict_t v, uint64_t at, const char *what) {
    sc->out->verdict = v;
    sc->out->at = at;
    snprintf(sc->out->what, sizeof(sc->out->what), "%s", what);
    sc->done = 1;
}

/* One mapping against the scan: a hole before it, its access, its file's end. */
static void scan_map(vm_scan_t *sc, const vm_map_t *m) {
    if (sc->done || m->end <= sc->cur) return;
    if (m->start > sc->cur) {
        refuse(sc, OTE_VM_UNMAPPED, sc->cur, "");
        return;
    }
    if ((m->prot & sc->access) != sc->access) {
        refuse(sc, OTE_VM_NO_ACCESS, sc->cur, m->name);
        return;
    }
    uint64_t last = (m->end < sc->end ? m->end : sc->end) - 1; /* last byte in this map */
    if (m->file && probe_byte(last) == 0) {
        /* A file ends inside [cur, last]: past it every page faults. Report the first. */
        uint64_t ps = page_size(), lo = sc->cur & ~(ps - 1), hi = last & ~(ps - 1);
        while (lo < hi) { /* the first page that cannot be read */
            uint64_t mid = lo + ((hi - lo) / ps / 2) * ps;
            if (probe_byte(mid < sc->cur ? sc->cur : mid) == 0) hi = mid;
            else lo = mid + ps;
        }
        refuse(sc, OTE_VM_PAST_EOF, lo < sc->cur ? sc->cur : lo, m->name);
        return;
    }
    sc->prot &= m->prot;
    sc->cur = last + 1;
    if (sc->cur >= sc->end) sc->done = 1;
}

/* Feeds /proc/self/maps to the scan. -1 when it cannot be read. */
static int scan_maps(vm_scan_t *sc) {
    ote_status_t fst;
    if (ote_fault_hit("vm.maps_open", &fst)) return -1;
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    char buf[8192];
    size_t have = 0;
    int rc = 0;
    while (!sc->done) {
        ssize_t n = read(fd, buf + have, sizeof(buf) - 1 - have);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            rc = -1;
            break;
        }
        if (n == 0 && have == 0) break;
        have += (size_t)n;
        buf[have] = '\0';
        char *line = buf, *nl;
        while (!sc->done && (nl = strchr(line, '\n')) != NULL) {
            *nl = '\0';
            vm_map_t m;
            if (parse_line(line, &m) == 0) scan_map(sc, &m);
            line = nl + 1;
        }
        if (n == 0) break; /* a last line without '\n' is never written by the kernel */
        have -= (size_t)(line - buf);
        memmove(buf, line, have);
        if (have == sizeof(buf) - 1) have = 0; /* a line longer than the buffer: skip it */
    }
    close(fd);
    if (rc == 0 && !sc->done) refuse(sc, OTE_VM_UNMAPPED, sc->cur, "");
    return rc;
}

/* Without /proc: every page read once (write access cannot be seen; assumed). */
static void scan_probe(vm_scan_t *sc) {
    uint64_t ps = page_size();
    for (uint64_t a = sc->addr; a < sc->end; a = (a & ~(ps - 1)) + ps) {
        if (probe_byte(a) == 0) {
            refuse(sc, OTE_VM_NO_ACCESS, a, "(not readable)");
            return;
        }
        if ((a & ~(ps - 1)) + ps < a) break; /* the last page of the address space */
    }
    sc->prot = OTE_VM_READ | OTE_VM_WRITE;
}

ote_status_t ote_vm_check(uint64_t addr, uint64_t len, unsigned access, ote_vm_report_t *out) {
    if (out == NULL || len == 0 || addr > UINT64_MAX - len ||
        (access & (OTE_VM_READ | OTE_VM_WRITE)) == 0 ||
        (access & ~(OTE_VM_READ | OTE_VM_WRITE)) != 0)
        return OTE_ERR_INVALID;
    ote_vm_report_t r;
    memset(&r, 0, sizeof(r));
    vm_scan_t sc = {.addr = addr,
                    .end = addr + len,
                    .access = access,
                    .cur = addr,
                    .prot = OTE_VM_READ | OTE_VM_WRITE,
                    .out = &r};
    if (scan_maps(&sc) != 0) {
        memset(&r, 0, sizeof(r));
        sc.done = 0;
        sc.cur = addr;
        scan_probe(&sc);
    }
    if (r.verdict == OTE_VM_OK) r.prot = sc.prot;
    *out = r;
    return OTE_OK;
}

const char *ote_vm_verdict_str(ote_vm_verdict_t v) {
    switch (v) {
        case OTE_VM_OK: return "ok";
        case OTE_VM_UNMAPPED: return "not mapped";
        case OTE_VM_NO_ACCESS: return "mapped without the access asked";
        case OTE_VM_PAST_EOF: return "past the end of its file";
    }
    return "?";
}

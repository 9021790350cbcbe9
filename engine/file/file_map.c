/*
 * engine/file/file_map.c - zero copy for peers' READs of file registrations
 * (file_zero_copy=auto, docs/files.md "How bytes move"). A registration that peers may
 * READ keeps its range mapped read-only and shared: the mapping's pages are the page
 * cache's own. A peer's READ whose whole range the page cache holds (mincore) and whose
 * file still covers it is sent from there by the transport's own kernel copy (tcp's
 * sendmsg, shm's process_vm_writev): page cache -> socket or requester, where the bounce
 * path copies page cache -> bounce -> socket. Any other range takes the bounce path
 * (O_DIRECT where aligned), so a range on disk is read by io_uring at its queue depth,
 * never by a page fault on a transport's thread.
 *
 * Nothing in the process loads from the mapping: a file truncated after the check makes
 * the kernel's copy fail with EFAULT (ote__freg_map_failed turns that into the request's
 * OTE_ERR_IO), where a load would raise SIGBUS.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "engine/file/file_internal.h"

/* Pages whose residency one mincore call reports (its vector on the stack). */
#define MAP_VEC 256u

static size_t page_size(void) {
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096u;
}

/* Whether this process holds CAP_FOWNER (bit 3 of CapEff, /proc/self/status). */
static int map_cap_fowner(void) {
    FILE *f = fopen("/proc/self/status", "re");
    if (f == NULL) return 0;
    char line[256];
    unsigned long long eff = 0;
    int found = 0;
    while (!found && fgets(line, sizeof(line), f) != NULL)
        found = sscanf(line, "CapEff: %llx", &eff) == 1;
    fclose(f);
    return found && ((eff >> 3) & 1u);
}

/* Whether mincore tells the truth about st's file here: since Linux 5.0 it reports every
 * page of a file mapping as resident unless the caller owns the file (or holds
 * CAP_FOWNER over its owner: not the overflow uid 65534 of an owner unmapped in this user
 * namespace) or may write it (can_do_mincore). Where it would lie, a READ of pages on
 * disk would be read by page faults inside the transport's copy. */
static int map_mincore_truthful(const ote__freg_t *r, const struct stat *st) {
    if (st->st_uid == geteuid() || (st->st_uid != 65534 && map_cap_fowner())) return 1;
    char p[64];
    snprintf(p, sizeof(p), "/proc/self/fd/%d", r->fd);
    return faccessat(AT_FDCWD, p, W_OK, AT_EACCESS) == 0;
}

void ote__freg_map(ote__freg_t *r) {
    r->map = NULL;
    if (!(r->perms & OTE_PERM_READ) || r->len > SIZE_MAX / 2) return;
    struct stat st;
    if (fstat(r->fd, &st) != 0) return;
    if (!map_mincore_truthful(r, &st)) {
        OTE_INFO("file",
                 "%s: neither owned by this process's user nor writable by it, so the kernel "
                 "does not say which of its pages are cached (mincore): peers' READs of it "
                 "always go through bounce buffers",
                 r->path);
        return;
    }
    r->map_blk = S_ISBLK(st.st_mode) ? 1 : 0;
    size_t pg = page_size();
    uint64_t start = r->off & ~(uint64_t)(pg - 1);
    size_t skew = (size_t)(r->off - start), len = skew + (size_t)r->len;
    void *p = mmap(NULL, len, PROT_READ, MAP_SHARED, r->fd, (off_t)start);
    if (p == MAP_FAILED) {
        OTE_INFO("file",
                 "%s: cannot map [%llu, +%llu) (%s): peers' READs of it always go through "
                 "bounce buffers",
                 r->path, (unsigned long long)r->off, (unsigned long long)r->len, strerror(errno));
        return;
    }
    r->map = p;
    r->map_len = len;
    r->map_skew = skew;
}

void ote__freg_unmap(ote__freg_t *r) {
    if (r->map != NULL) (void)munmap(r->map, r->map_len);
    r->map = NULL;
}

/* How many pages of [p, +len) the page cache holds now: all (1) or not (0), asked with
 * want 1; any (1) or none (0), asked with want 0. A failed mincore answers 0. */
static int map_pages(const uint8_t *p, size_t len, int want) {
    size_t pg = page_size();
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)(pg - 1);
    size_t pages = ((uintptr_t)p + len - a + pg - 1) / pg;
    unsigned char vec[MAP_VEC];
    for (size_t i = 0; i < pages; i += MAP_VEC) {
        size_t k = pages - i < MAP_VEC ? pages - i : MAP_VEC;
        if (mincore((void *)(a + i * pg), k * pg, vec) != 0) return 0;
        for (size_t j = 0; j < k; j++)
            if ((vec[j] & 1) != want) return !want;
    }
    return want;
}

/* Whether every page of [p, +len) is in the page cache now. */
static int map_resident(const uint8_t *p, size_t len) { return map_pages(p, len, 1); }

int ote__freg_map_partly(const ote__freg_t *r, uint64_t foff, uint64_t len) {
    if (r->map == NULL || len == 0 || foff < r->off || foff - r->off > r->len ||
        len > r->len - (foff - r->off))
        return 0;
    return map_pages(r->map + r->map_skew + (foff - r->off), (size_t)len, 0);
}

/* Whether the file still holds [foff, +len) (a block device cannot shrink). */
static int map_covered(const ote__freg_t *r, uint64_t foff, uint64_t len) {
    if (r->map_blk) return 1;
    struct stat st;
    return fstat(r->fd, &st) == 0 && (uint64_t)st.st_size >= foff + len;
}

ote_status_t ote__freg_map_read(const ote__freg_t *r, uint64_t addr, uint32_t len,
                                const uint8_t **ptr_out) {
    if (r->map == NULL) return OTE_ERR_UNSUPPORTED;
    if (len == 0 || addr < r->addr || addr - r->addr > r->len || len > r->len - (addr - r->addr))
        return OTE_ERR_ACCESS;
    const uint8_t *p = r->map + r->map_skew + (addr - r->addr);
    /* Covered first: pages past a shrunk end have left the page cache, but the page that
     * holds the new end stays, its bytes past the end read as zeros. */
    if (!map_covered(r, r->off + (addr - r->addr), len) || !map_resident(p, len))
        return OTE_ERR_AGAIN;
    *ptr_out = p;
    return OTE_OK;
}

ote_status_t ote__freg_map_failed(const ote__freg_t *r, uint64_t addr, uint32_t len,
                                  ote_status_t st) {
    uint64_t foff = r->off + (addr - r->addr);
    if (r->map == NULL || map_covered(r, foff, len)) return st;
    OTE_WARN_LIMITED("file",
                     "serving a peer: read of %u bytes at offset %llu of %s from the page "
                     "cache failed: the file was truncated",
                     len, (unsigned long long)foff, r->path);
    return ote_status_make(OTE_ERR_IO, ENODATA);
}

/*
 * engine/hugepages.c - register_thp=1: transparent huge pages for registered host memory.
 *
 * Cross-memory attach (the shm transport's default data path) pins the other process's
 * pages one base page at a time, and that per-page cost bounds its speed on 4 KiB pages;
 * a range backed by 2 MiB transparent huge pages costs one pin per 512 base pages (docs/performance.md
 * "Same host"). With the key set, ote_memory_register of host memory (not device memory,
 * not memory pinned by the CUDA driver) asks the kernel to back the range's interior
 * aligned to the huge page size (hpage_pmd_size, 2 MiB on x86-64) with huge pages:
 *
 *   madvise(MADV_HUGEPAGE)  pages faulted in from now on are huge where the kernel can
 *                           (THP "madvise" or "always" mode), and khugepaged may collapse
 *                           the range later;
 *   madvise(MADV_COLLAPSE)  (Linux >= 6.1) collapses the pages already there now, copying
 *                           them into huge pages (pages not yet touched are not filled).
 *
 * Both are advice: a failure of either (a kernel without THP or without MADV_COLLAPSE, a
 * range with a hole, no huge page free) is logged once per engine with its errno and the
 * registration goes on. A range whose aligned interior is empty (shorter than a huge page
 * after rounding) is left alone. The caller's memory changes (VM_HUGEPAGE on its mapping,
 * possibly more resident memory for a sparse buffer), which is why the key is opt-in.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/fault.h"
#include "base/log.h"
#include "engine/core_internal.h"
#include "engine/registry_internal.h"

#ifndef MADV_HUGEPAGE
#define MADV_HUGEPAGE 14 /* <asm-generic/mman-common.h>, Linux >= 2.6.38 */
#endif
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25 /* <asm-generic/mman-common.h>, Linux >= 6.1 */
#endif

#define THP_LOGGED_ADVISE 1u
#define THP_LOGGED_COLLAPSE 2u
#define THP_DEFAULT_SIZE (2ull << 20)

static pthread_once_t g_size_once = PTHREAD_ONCE_INIT;
static uint64_t g_huge_size = THP_DEFAULT_SIZE;

/* The PMD huge page size the kernel reports (a power of two), else 2 MiB. */
static void read_huge_size(void) {
    int fd = open("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    char buf[32];
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0) return;
    buf[n] = '\0';
    unsigned long long v = strtoull(buf, NULL, 10);
    if (v >= 4096 && (v & (v - 1)) == 0) g_huge_size = v;
}

/* One madvise, unless its fault point failed it (injected: errno from the armed point). */
static int advise(bool injected, void *addr, size_t len, int advice) {
    if (injected) {
        if (errno == 0) errno = EINVAL;
        return -1;
    }
    return madvise(addr, len, advice);
}

void ote__thp_advise(ote_engine_t *e, uint64_t addr, uint64_t len) {
    pthread_once(&g_size_once, read_huge_size);
    uint64_t hs = g_huge_size;
    if (addr > UINT64_MAX - (hs - 1) || len > UINT64_MAX - addr) return;
    uint64_t lo = (addr + hs - 1) & ~(hs - 1), hi = (addr + len) & ~(hs - 1);
    if (hi <= lo) return; /* no whole huge page inside: left alone */
    void *p = (void *)(uintptr_t)lo;
    size_t n = (size_t)(hi - lo);
    ote_status_t fst;
    errno = 0;
    if (advise(ote_fault_hit("engine.thp_advise", &fst), p, n, MADV_HUGEPAGE) != 0) {
        int err = errno;
        if (!(atomic_fetch_or(&e->thp_logged, THP_LOGGED_ADVISE) & THP_LOGGED_ADVISE))
            OTE_WARN("engine",
                     "register_thp: madvise(MADV_HUGEPAGE) of [%p, +%zu) failed: %s (errno "
                     "%d); the registration goes on without huge pages (logged once)",
                     p, n, strerror(err), err);
        return; /* the kernel refused the range: a collapse would be refused too */
    }
    errno = 0;
    if (advise(ote_fault_hit("engine.thp_collapse", &fst), p, n, MADV_COLLAPSE) != 0) {
        int err = errno;
        if (!(atomic_fetch_or(&e->thp_logged, THP_LOGGED_COLLAPSE) & THP_LOGGED_COLLAPSE))
            OTE_INFO("engine",
                     "register_thp: madvise(MADV_COLLAPSE) of [%p, +%zu) failed: %s (errno %d; "
                     "Linux < 6.1, pages not touched yet, or no huge page free); pages "
                     "faulted in later are still huge where THP allows (logged once)",
                     p, n, strerror(err), err);
        return;
    }
    OTE_DEBUG("engine", "register_thp: [%p, +%zu) advised and collapsed to huge pages", p, n);
}

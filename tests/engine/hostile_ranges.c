/* tests/engine/hostile_ranges.c - see hostile_ranges.h. */
#include "tests/engine/hostile_ranges.h"

#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ote/ote.h"

/* n fresh pages with prot. The holes a range has (unmapped, crossing, midhole) must stay
 * holes until the registration looks at them, while other threads of the process (the
 * engine's, the sanitizer's allocator) map memory: the kernel places mmap(NULL, ...) top
 * down from below the stack, and would fill a freshly unmapped page first. So the pages
 * are placed low (from 256 MiB up, application memory under ASan and TSan too, far below
 * where the kernel puts mappings it chooses), each range at an address of its own, with
 * MAP_FIXED_NOREPLACE; only when no such address is free is the kernel left to choose. */
static uint8_t *map_pages(size_t n, int prot) {
    static uintptr_t next = 0x10000000u;
    size_t ps = (size_t)sysconf(_SC_PAGESIZE);
    for (int tries = 0; tries < 64; tries++) {
        uintptr_t want = __atomic_fetch_add(&next, 0x100000u, __ATOMIC_RELAXED);
        void *p = mmap((void *)want, n * ps, prot,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        if (p == (void *)want) return (uint8_t *)p;
        if (p != MAP_FAILED) munmap(p, n * ps); /* a kernel that took it as a hint */
    }
    void *p = mmap(NULL, n * ps, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : (uint8_t *)p;
}

int ote_test_hostile_range(const char *kind, uint64_t *addr_out, uint64_t *len_out,
                           unsigned *perms_out) {
    size_t ps = (size_t)sysconf(_SC_PAGESIZE);
    uint8_t *p = NULL;
    uint64_t len = 2 * ps;
    unsigned perms = OTE_PERM_READ | OTE_PERM_WRITE;
    if (strcmp(kind, "unmapped") == 0) {
        p = map_pages(2, PROT_READ | PROT_WRITE);
        if (p == NULL || munmap(p, 2 * ps) != 0) return -1;
    } else if (strcmp(kind, "protnone") == 0) {
        p = map_pages(2, PROT_NONE);
    } else if (strcmp(kind, "rofwrite") == 0 || strcmp(kind, "roforread") == 0) {
        p = map_pages(2, PROT_READ | PROT_WRITE);
        if (p == NULL) return -1;
        memset(p, 0x5a, 2 * ps); /* what a peer's READ of it must find */
        if (mprotect(p, 2 * ps, PROT_READ) != 0) return -1;
        perms = kind[3] == 'w' ? OTE_PERM_WRITE : OTE_PERM_READ;
    } else if (strcmp(kind, "crossing") == 0) {
        p = map_pages(2, PROT_READ | PROT_WRITE);
        if (p == NULL || munmap(p + ps, ps) != 0) return -1;
    } else if (strcmp(kind, "shortfile") == 0) {
        int fd = memfd_create("ote_hostile", MFD_CLOEXEC);
        if (fd < 0 || ftruncate(fd, (off_t)ps) != 0) return -1;
        void *m = mmap(NULL, 4 * ps, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        p = m == MAP_FAILED ? NULL : (uint8_t *)m;
        len = 4 * ps;
    } else if (strcmp(kind, "midhole") == 0) {
        p = map_pages(3, PROT_READ | PROT_WRITE);
        if (p == NULL || munmap(p + ps, ps) != 0) return -1;
        len = 3 * ps;
        perms = OTE_PERM_READ;
    } else {
        return -1;
    }
    if (p == NULL) return -1;
    *addr_out = (uint64_t)(uintptr_t)p;
    *len_out = len;
    *perms_out = perms;
    return 0;
}

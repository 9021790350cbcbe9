/* tests/engine/hostile_ranges.c - see hostile_ranges.h. */
#include "tests/engine/hostile_ranges.h"

#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ote/ote.h"

static uint8_t *map_pages(size_t n, int prot) {
    size_t ps = (size_t)sysconf(_SC_PAGESIZE);
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

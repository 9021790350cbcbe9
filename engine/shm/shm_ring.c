/*
 * engine/shm/shm_ring.c - the shared ring of a connection: the requester's memfd (the
 * ring and its control page), the source's mapping of it, and the source's wait for the
 * requester's staging mark before it copies a piece out of the ring. Design:
 * shm_internal.h ("Ring mode", "Staging marks").
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include <linux/magic.h>

#include "base/log.h"
#include "engine/shm/shm_internal.h"
#include "ote/ote.h"

/* The source looks at a mark it waits for without sleeping for this long (the requester
 * stages a 4 KiB piece in well under a microsecond), then yielding the core until
 * SHM_MARK_YIELD_NS, then sleeping SHM_MARK_NAP_NS between looks (a requester that lost
 * its core, or stopped). */
#define SHM_MARK_SPIN_NS (20u * 1000u)
#define SHM_MARK_YIELD_NS (200u * 1000u)
#define SHM_MARK_NAP_NS (50u * 1000u)

int ote__shm_ring_create(uint8_t **map_out) {
    int fd = ote__memfd_create("orbitte-shm-ring");
    if (fd < 0) return -1;
    void *m = MAP_FAILED;
    /* The source maps only a ring that cannot shrink under it (ote__shm_ring_map). */
    if (ftruncate(fd, SHM_RING_MAP) == 0 && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0)
        m = mmap(NULL, SHM_RING_MAP, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    *map_out = m;
    return fd;
}

const char *ote__shm_memfd_unsafe(int fd, uint64_t need, uint64_t *size_out) {
    struct stat sb;
    struct statfs fs;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) return "not a regular file";
    if ((uint64_t)sb.st_size < need) return "smaller than the size it was sent with";
    /* hugetlbfs: a hole punched after mapping turns a later fault into a SIGBUS when no
     * huge page is free; only shmem (a plain memfd) allocates a page on any fault. */
    if (fstatfs(fd, &fs) != 0 || fs.f_type != TMPFS_MAGIC) return "not a plain memfd (shmem)";
    /* A file the requester could shrink would make our next copy a SIGBUS of the whole
     * engine: only one sealed against shrinking is mapped. */
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK)) return "not sealed against shrinking";
    if (size_out) *size_out = (uint64_t)sb.st_size;
    return NULL;
}

int ote__shm_ring_map(shm_src_t *s, const shm_hello_t *h, int rfd, char *text, size_t tl) {
    uint64_t size = 0;
    if (rfd < 0 || h->ring_len == 0 || h->ring_len > (1ull << 30)) {
        snprintf(text, tl, "no usable shared ring in the HELLO");
        return -1;
    }
    const char *why = ote__shm_memfd_unsafe(rfd, h->ring_len, &size);
    if (why != NULL) {
        snprintf(text, tl, "the shared ring is refused: %s", why);
        return -1;
    }
    /* Marks when asked for and the control page is there (checked against the sealed
     * size: it cannot go away), else the ring alone. Test hook (engine/hooks.h): a source
     * that answers as one of protocol 3 without marks would, so that tests reach the
     * requester's stage-then-send path. */
    int marks = (h->h.pad & SHM_CAP_MARKS) && h->ring_len % 8 == 0 &&
                size >= h->ring_len + SHM_RING_CTL &&
                !(ote__engine_hooks.shm_no_marks && ote__engine_hooks.shm_no_marks());
    size_t map = (size_t)h->ring_len + (marks ? SHM_RING_CTL : 0);
    void *m = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_SHARED, rfd, 0);
    if (m == MAP_FAILED) {
        snprintf(text, tl, "cannot map the shared ring: %s", strerror(errno));
        return -1;
    }
    s->ring = m;
    s->ring_len = (size_t)h->ring_len;
    s->ring_map = map;
    s->marks = marks ? (_Atomic uint64_t *)(void *)((uint8_t *)m + h->ring_len) : NULL;
    return 0;
}

static int mark_passed(const shm_src_t *s, uint64_t id) {
    return atomic_load_explicit(s->marks, memory_order_acquire) > id;
}

int ote__shm_ring_staged(const shm_src_t *s, uint64_t id) {
    return s->marks == NULL || mark_passed(s, id);
}

static void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* The requester is gone, or this connection is ending. */
static int src_over(shm_src_t *s) {
    if (atomic_load(&s->abort) || atomic_load(&s->tp->stop)) return 1;
    struct pollfd p = {.fd = s->fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

ote_status_t ote__shm_ring_ready(shm_src_t *s, uint64_t id) {
    if (s->marks == NULL || mark_passed(s, id)) return OTE_OK;
    /* A wait already timed out at this mark and it has not moved since: the requester is
     * frozen or broken, and each of its pieces waiting a deadline of its own would hold
     * the connection (and its pins) for as many deadlines. */
    uint64_t at = atomic_load_explicit(s->marks, memory_order_relaxed);
    if (atomic_load(&s->stalled) == at + 1) return OTE_ERR_TIMEOUT;
    uint64_t t0 = ote_now_ns();
    ote_deadline_t dl = ote_deadline_after(s->tp->cfg.transfer_timeout_ms * OTE_NSEC_PER_MSEC);
    for (;;) {
        if (mark_passed(s, id)) return OTE_OK;
        uint64_t waited = ote_now_ns() - t0;
        if (waited < SHM_MARK_SPIN_NS) {
            relax();
            continue;
        }
        if (src_over(s)) return OTE_ERR_PEER_LOST;
        if (ote_deadline_expired(dl)) {
            atomic_store(&s->stalled, atomic_load_explicit(s->marks, memory_order_relaxed) + 1);
            OTE_WARN_LIMITED("shm",
                             "requester pid %d (%s) did not stage piece %llu within %llu ms: "
                             "its pieces fail with TIMEOUT until it does, nothing copied",
                             (int)s->pid, s->from, (unsigned long long)id,
                             (unsigned long long)s->tp->cfg.transfer_timeout_ms);
            return OTE_ERR_TIMEOUT;
        }
        if (waited < SHM_MARK_YIELD_NS) {
            sched_yield();
        } else {
            struct timespec ts = {0, SHM_MARK_NAP_NS};
            nanosleep(&ts, NULL);
        }
    }
}

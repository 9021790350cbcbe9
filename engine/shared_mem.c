/*
 * engine/shared_mem.c - shared host memory (ote_memory_alloc_shared): allocations backed
 * by a sealed memfd, so that a same-host peer's source can map them and copy a request's
 * local bytes with memcpy instead of a cross-memory-attach call (engine/shm, "Shared
 * allocations" in shm_internal.h).
 *
 * The engine keeps the allocations in a small array under smu (a leaf lock): the shm
 * requester looks a slice's local range up there (host->shared_find) only when its
 * connection has not mapped the allocation yet, and gets its own duplicate of the fd to
 * send. ote_memory_free_shared takes the allocation out of the array first, then tells
 * every transport (ops->shared_free: the shm peers that sent it queue an UNMAP entry,
 * in order with their requests), and only then unmaps it here.
 *
 * The memfd is sealed against shrinking and growing (F_SEAL_SHRINK, F_SEAL_GROW) and
 * against new seals: a peer that maps it checks F_SEAL_SHRINK, since a file shrunk under
 * its mapping would turn its next copy into a SIGBUS.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/log.h"
#include "engine/core_internal.h"
#include "engine/registry_internal.h"
#include "engine/router_internal.h"
#include "engine/shared_mem_internal.h"

ote_status_t ote__shared_init(ote_engine_t *e) {
    e->shared = NULL;
    e->nshared = e->capshared = 0;
    atomic_store(&e->nshared_hint, 0);
    e->shared_next = 1;
    return ote_mutex_init(&e->smu);
}

void ote__shared_fini(ote_engine_t *e) {
    for (size_t i = 0; i < e->nshared; i++) {
        munmap((void *)(uintptr_t)e->shared[i].base, e->shared[i].size);
        close(e->shared[i].fd);
    }
    ote_free(e->shared);
    e->shared = NULL;
    e->nshared = e->capshared = 0;
    ote_mutex_destroy(&e->smu);
}

ote_status_t ote_memory_alloc_shared(ote_engine_t *e, size_t len, void **addr_out) {
    if (e == NULL || len == 0 || addr_out == NULL) return OTE_ERR_INVALID;
    if (OTE__ENGINE_GONE(e)) return OTE_ERR_STATE;
    long pg = sysconf(_SC_PAGESIZE);
    size_t page = pg > 0 ? (size_t)pg : 4096u;
    if (len > SIZE_MAX - page || len > (size_t)INT64_MAX - page) return OTE_ERR_TOO_BIG;
    size_t size = (len + page - 1) / page * page;
    int fd = ote__memfd_create("ote-shared");
    if (fd < 0) {
        int err = errno;
        OTE_WARN("engine", "ote_memory_alloc_shared: memfd_create failed: %s", strerror(err));
        return ote_status_from_errno(err);
    }
    const char *what = "ftruncate";
    void *p = MAP_FAILED;
    if (ftruncate(fd, (off_t)size) == 0) {
        what = "fcntl(F_ADD_SEALS)";
        if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0) {
            what = "mmap";
            p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        }
    }
    if (p == MAP_FAILED) {
        int err = errno;
        OTE_WARN("engine", "ote_memory_alloc_shared of %zu bytes: %s failed: %s", size, what,
                 strerror(err));
        close(fd);
        return ote_status_from_errno(err);
    }
    ote_mutex_lock(&e->smu);
    if (e->nshared == e->capshared) {
        size_t cap = e->capshared ? 2 * e->capshared : 8;
        ote__shared_t *a = ote_realloc(e->shared, cap * sizeof(*a));
        if (a == NULL) {
            ote_mutex_unlock(&e->smu);
            munmap(p, size);
            close(fd);
            return OTE_ERR_NOMEM;
        }
        e->shared = a;
        e->capshared = cap;
    }
    e->shared[e->nshared++] = (ote__shared_t){
        .base = (uint64_t)(uintptr_t)p, .size = size, .fd = fd, .id = e->shared_next++};
    atomic_store(&e->nshared_hint, e->nshared);
    ote_mutex_unlock(&e->smu);
    OTE_DEBUG("engine", "shared allocation [%p, +%zu) (memfd %d)", p, size, fd);
    *addr_out = p;
    return OTE_OK;
}

ote_status_t ote_memory_free_shared(ote_engine_t *e, void *addr) {
    if (e == NULL || addr == NULL) return OTE_ERR_INVALID;
    if (OTE__ENGINE_GONE(e)) return OTE_ERR_STATE;
    ote_mutex_lock(&e->smu);
    size_t i = 0;
    while (i < e->nshared && e->shared[i].base != (uint64_t)(uintptr_t)addr) i++;
    if (i == e->nshared) {
        ote_mutex_unlock(&e->smu);
        return OTE_ERR_NOT_FOUND;
    }
    ote__shared_t a = e->shared[i];
    /* A registration over it would name memory about to be unmapped. */
    pthread_rwlock_rdlock(&e->reg_lk);
    int busy = ote__reg_overlaps(e, a.base, a.size);
    pthread_rwlock_unlock(&e->reg_lk);
    if (busy) {
        ote_mutex_unlock(&e->smu);
        OTE_INFO("engine", "ote_memory_free_shared(%p): still registered (unregister it first)",
                 addr);
        return OTE_ERR_BUSY;
    }
    e->shared[i] = e->shared[--e->nshared];
    atomic_store(&e->nshared_hint, e->nshared);
    ote_mutex_unlock(&e->smu);
    ote__router_shared_free(e, a.id);
    munmap(addr, a.size);
    close(a.fd);
    return OTE_OK;
}

/* host->shared_find: the shared allocation holding [addr, +len), with a duplicate of its
 * fd for the caller to send and close. OTE_ERR_NOT_FOUND when none holds all of it. */
ote_status_t ote__shared_find(void *arg, uint64_t addr, uint64_t len, ote__shared_ref_t *out) {
    ote_engine_t *e = arg;
    if (atomic_load_explicit(&e->nshared_hint, memory_order_relaxed) == 0) return OTE_ERR_NOT_FOUND;
    ote_status_t st = OTE_ERR_NOT_FOUND;
    ote_mutex_lock(&e->smu);
    for (size_t i = 0; i < e->nshared; i++) {
        const ote__shared_t *a = &e->shared[i];
        if (addr >= a->base && addr - a->base <= a->size && len <= a->size - (addr - a->base)) {
            int fd = fcntl(a->fd, F_DUPFD_CLOEXEC, 0);
            if (fd < 0) {
                st = ote_status_from_errno(errno);
                break;
            }
            *out = (ote__shared_ref_t){.id = a->id, .base = a->base, .size = a->size, .fd = fd};
            st = OTE_OK;
            break;
        }
    }
    ote_mutex_unlock(&e->smu);
    return st;
}

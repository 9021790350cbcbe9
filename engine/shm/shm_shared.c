/*
 * engine/shm/shm_shared.c - shared allocations over a cross-memory-attach connection:
 * the requester sends each allocation its requests use once (SHM_MAP with the memfd),
 * the source maps it and copies those pieces with memcpy; ote_memory_free_shared's
 * UNMAP. Design: shm_internal.h ("Shared allocations").
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/log.h"
#include "engine/shm/shm_internal.h"
#include "engine/shm/shm_proto.h"
#include "ote/ote.h"

/* ---- requester ----------------------------------------------------------------------- */

int ote__shm_peer_shared(shm_peer_t *p, const ote__slice_t *s) {
    const ote__host_t *h = &p->tp->host; /* (peer_pump calls only when one may apply) */
    uint64_t a = (uint64_t)(uintptr_t)s->local, l = s->len;
    for (size_t i = 0; i < p->nshared; i++) {
        const shm_pshared_t *x = &p->shared[i];
        if (a >= x->base && a - x->base <= x->size && l <= x->size - (a - x->base)) return 1;
    }
    if (p->nshared == SHM_SHARED_MAX || h->shared_find == NULL || p->fd < 0) return 0;
    ote__shared_ref_t r;
    if (h->shared_find(h->arg, a, l, &r) != OTE_OK) return 0;
    if (r.size > SHM_SHARED_BYTES) { /* more than a source maps: never sent */
        close(r.fd);
        return 0;
    }
    /* A new map over an older one replaces it at the source: forget the older here. */
    for (size_t i = 0; i < p->nshared;) {
        const shm_pshared_t *x = &p->shared[i];
        if (x->base < r.base + r.size && r.base < x->base + x->size)
            p->shared[i] = p->shared[--p->nshared];
        else i++;
    }
    shm_map_t m;
    memset(&m, 0, sizeof(m));
    m.h = (shm_hdr_t){SHM_MAGIC, SHM_VERSION, SHM_MAP, 0, 0};
    m.id = r.id;
    m.base = r.base;
    m.size = r.size;
    /* Never waiting (p->mu is held). */
    int sent = ote__shm_send_fd(p->fd, &m, sizeof(m), r.fd, MSG_DONTWAIT) == (ssize_t)sizeof(m);
    int err = errno;
    close(r.fd); /* the source has its own now */
    if (!sent) {
        /* A full socket (or a connection about to fail): this piece goes by
         * cross-memory attach, a later one tries again. */
        OTE_DEBUG("shm", "peer %s: shared allocation %llu not sent now: %s", p->addr,
                  (unsigned long long)r.id, strerror(err));
        return 0;
    }
    p->shared[p->nshared++] = (shm_pshared_t){r.id, r.base, r.size};
    OTE_DEBUG("shm", "peer %s: shared allocation %llu [0x%llx, +%llu) sent", p->addr,
              (unsigned long long)r.id, (unsigned long long)r.base, (unsigned long long)r.size);
    return 1;
}

void ote__shm_peers_add(shm_peer_t *p) {
    shm_tp_t *tp = p->tp;
    ote_mutex_lock(&tp->pmu);
    p->pprev = NULL;
    p->pnext = tp->peers;
    if (tp->peers) tp->peers->pprev = p;
    tp->peers = p;
    ote_mutex_unlock(&tp->pmu);
}

void ote__shm_peers_del(shm_peer_t *p) {
    shm_tp_t *tp = p->tp;
    ote_mutex_lock(&tp->pmu);
    if (p->pprev) p->pprev->pnext = p->pnext;
    else if (tp->peers == p) tp->peers = p->pnext;
    if (p->pnext) p->pnext->pprev = p->pprev;
    p->pnext = p->pprev = NULL;
    ote_mutex_unlock(&tp->pmu);
}

void ote__shm_shared_free(ote__transport_t *t, uint64_t id) {
    shm_tp_t *tp = (shm_tp_t *)t;
    shm_slist_t done = {NULL, NULL};
    ote_mutex_lock(&tp->pmu);
    for (shm_peer_t *p = tp->peers; p != NULL; p = p->pnext) {
        ote_mutex_lock(&p->mu);
        for (size_t i = 0; i < p->nshared; i++) {
            if (p->shared[i].id != id) continue;
            p->shared[i] = p->shared[--p->nshared];
            if (p->broken || p->fd < 0) break; /* its reconnect starts with none sent */
            /* An UNMAP entry, with the write-offs: after every piece sent before. */
            if (ote__shm_peer_woff_push(p, (shm_woff_t){.op = SHM_OP_UNMAP, .id = id}) != 0)
                OTE_WARN_LIMITED("shm",
                                 "peer %s: out of memory for an UNMAP entry: its source maps "
                                 "the freed shared allocation until the connection closes",
                                 p->addr);
            else ote__shm_peer_pump(p, &done); /* sent now, unless the socket is full */
            break;
        }
        ote_mutex_unlock(&p->mu);
    }
    ote_mutex_unlock(&tp->pmu);
    ote__shm_slist_finish(&done);
}

/* ---- source -------------------------------------------------------------------------- */

/* nsmaps counts the live and the retired maps; tp->shared_bytes their bytes. */
static void smap_free(shm_src_t *s, shm_smap_t *x) {
    munmap(x->ptr, x->size);
    atomic_fetch_sub(&s->tp->shared_bytes, x->size);
    s->nsmaps--;
    ote_free(x);
}

/* Take x out of the live maps: freed now, or once the last message using it is served. */
static void smap_retire(shm_src_t *s, shm_smap_t **pp) {
    shm_smap_t *x = *pp;
    *pp = x->next;
    if (x->refs == 0) {
        smap_free(s, x);
        return;
    }
    x->retired = 1;
    x->next = s->sretired;
    s->sretired = x;
}

int ote__shm_src_map(shm_src_t *s, const uint8_t *b, size_t n, int fd, int fds_bad) {
    shm_map_t m;
    /* Malformed: not negotiated, not a MAP, without an fd, or with more than one (an fd
     * the kernel could not pass, fds_bad without one, is a refusal below instead). */
    if (!s->shared || ote__shm_map_decode(b, n, &m) != 0 || (fd < 0 && !fds_bad) ||
        (fd >= 0 && fds_bad)) {
        if (fd >= 0) close(fd);
        OTE_WARN_LIMITED("shm", "malformed or unexpected MAP from %s (pid %d): closing", s->from,
                         (int)s->pid);
        return -1;
    }
    /* It replaces every map it overlaps and any of its id (the requester freed those),
     * first: a map refused below must not leave an older one at these addresses. */
    for (shm_smap_t **pp = &s->smaps; *pp != NULL;) {
        if ((*pp)->id == m.id ||
            ((*pp)->base < m.base + m.size && m.base < (*pp)->base + (*pp)->size))
            smap_retire(s, pp);
        else pp = &(*pp)->next;
    }
    const char *why = NULL;
    if (fd < 0) why = "its fd was not received (RLIMIT_NOFILE?)";
    else if (s->nsmaps >= SHM_SHARED_MAX) why = "too many shared allocations on this connection";
    else why = ote__shm_memfd_unsafe(fd, m.size, NULL);
    int counted = 0;
    if (why == NULL) {
        if (atomic_fetch_add(&s->tp->shared_bytes, m.size) + m.size > SHM_SHARED_TP_BYTES)
            why = "the engine maps too many bytes of shared allocations already";
        counted = 1;
    }
    void *p = MAP_FAILED;
    if (why == NULL) {
        p = mmap(NULL, m.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) why = strerror(errno);
    }
    if (fd >= 0) close(fd);
    shm_smap_t *x = p != MAP_FAILED ? ote_calloc(1, sizeof(*x)) : NULL;
    if (x == NULL) {
        if (p != MAP_FAILED) munmap(p, m.size);
        if (counted) atomic_fetch_sub(&s->tp->shared_bytes, m.size);
        OTE_WARN_LIMITED("shm",
                         "requester %s (pid %d): shared allocation %llu not mapped (%s): its "
                         "pieces go by cross-memory attach",
                         s->from, (int)s->pid, (unsigned long long)m.id,
                         why ? why : "out of memory");
        return 0;
    }
    *x = (shm_smap_t){.next = s->smaps, .id = m.id, .base = m.base, .size = m.size, .ptr = p};
    s->smaps = x;
    s->nsmaps++;
    OTE_DEBUG("shm", "requester %s (pid %d): shared allocation %llu [0x%llx, +%llu) mapped",
              s->from, (int)s->pid, (unsigned long long)m.id, (unsigned long long)m.base,
              (unsigned long long)m.size);
    return 0;
}

void ote__shm_src_unmap(shm_src_t *s, uint64_t id) {
    for (shm_smap_t **pp = &s->smaps; *pp != NULL; pp = &(*pp)->next)
        if ((*pp)->id == id) {
            smap_retire(s, pp);
            return;
        }
}

void ote__shm_src_shared_take(shm_src_t *s, shm_msg_t *m, uint32_t i) {
    const shm_req_t *q = (const shm_req_t *)(const void *)(m->in.b + sizeof(shm_hdr_t)) + i;
    for (shm_smap_t *x = s->smaps; x != NULL; x = x->next)
        if (q->local >= x->base && q->local - x->base <= x->size &&
            q->len <= x->size - (q->local - x->base)) {
            x->refs++;
            m->smap[i] = x;
            m->sptr[i] = x->ptr + (q->local - x->base);
            return;
        }
}

void ote__shm_src_shared_release(shm_src_t *s, shm_msg_t *m) {
    if (s->nsmaps == 0) return; /* no map, live or retired: no entry holds one */
    for (uint32_t i = 0; i < m->in.h.n; i++) {
        shm_smap_t *x = m->smap[i];
        m->smap[i] = NULL;
        m->sptr[i] = NULL;
        if (x == NULL || --x->refs > 0 || !x->retired) continue;
        for (shm_smap_t **pp = &s->sretired; *pp != NULL; pp = &(*pp)->next)
            if (*pp == x) {
                *pp = x->next;
                break;
            }
        smap_free(s, x);
    }
}

void ote__shm_src_shared_end(shm_src_t *s) {
    for (shm_smap_t *l = s->smaps; l != NULL;) {
        shm_smap_t *next = l->next;
        smap_free(s, l);
        l = next;
    }
    for (shm_smap_t *l = s->sretired; l != NULL;) {
        shm_smap_t *next = l->next;
        smap_free(s, l);
        l = next;
    }
    s->smaps = s->sretired = NULL;
    s->nsmaps = 0;
}

/*
 * engine/shm/shm_source_ipc.c - the source side's CUDA IPC bookkeeping: the pins of
 * pieces whose IPC copy the requester makes (held until its IPC_DONE or the connection's
 * end), and the allocations offered per connection, to which close receipts go when a
 * registration with OTE_PERM_IPC is unregistered. Design: shm_internal.h ("CUDA IPC").
 */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>

#include "base/alloc.h"
#include "base/log.h"
#include "engine/shm/shm_internal.h"
#include "ote/ote.h"

/* Remember an IPC piece's pin until its IPC_DONE: 1, or 0 when out of memory. */
int ote__shm_src_held_add(shm_src_t *s, uint64_t id, void *pin, uint32_t len) {
    if (s->nheld == s->held_cap) {
        size_t cap = s->held_cap ? 2 * s->held_cap : 64;
        shm_held_t *h = ote_realloc(s->held, cap * sizeof(*h));
        if (h == NULL) return 0;
        s->held = h;
        s->held_cap = cap;
    }
    s->held[s->nheld++] = (shm_held_t){id, pin, len};
    return 1;
}

/* SHM_OP_IPC_DONE: the requester's copy of piece id ended; its pin goes. */
void ote__shm_src_held_done(shm_src_t *s, uint64_t id) {
    for (size_t k = 0; k < s->nheld; k++)
        if (s->held[k].id == id) {
            shm_held_t h = s->held[k];
            s->held[k] = s->held[--s->nheld];
            ote__shm_src_unpin(s, h.pin, h.len);
            return;
        }
    OTE_DEBUG("shm", "IPC_DONE from %s names no piece held (id %llu): ignored", s->from,
              (unsigned long long)id);
}

/* The connection ends: every pin still held for an IPC copy goes. */
void ote__shm_src_held_end(shm_src_t *s) {
    if (s->nheld > 0)
        OTE_INFO("shm", "requester %s gone with %zu CUDA IPC copie(s) unfinished: pins released",
                 s->from, s->nheld);
    while (s->nheld > 0) {
        shm_held_t h = s->held[--s->nheld];
        ote__shm_src_unpin(s, h.pin, h.len);
    }
    ote_free(s->held);
    s->held = NULL;
    s->held_cap = 0;
}

/* Remember that the allocation of d was offered on s (close receipts). */
void ote__shm_src_offered_note(shm_src_t *s, const ote__ipc_desc_t *d) {
    shm_tp_t *tp = s->tp;
    ote_mutex_lock(&tp->mu);
    size_t k;
    for (k = 0; k < s->noffered && s->offered[k].buffer_id != d->buffer_id; k++) {}
    if (k == s->noffered) {
        if (s->noffered == SHM_IPC_OFFERED) { /* the oldest goes: its receipt is not sent */
            memmove(s->offered, s->offered + 1, (SHM_IPC_OFFERED - 1) * sizeof(*s->offered));
            s->noffered--;
        }
        s->offered[s->noffered++] = (shm_offered_t){d->buffer_id, d->base, d->size};
    }
    ote_mutex_unlock(&tp->mu);
}

void ote__shm_ipc_revoke(ote__transport_t *t, uint64_t start, uint64_t len) {
    shm_tp_t *tp = (shm_tp_t *)t;
    ote_mutex_lock(&tp->mu);
    for (shm_src_t *s = tp->srcs; s != NULL; s = s->next) {
        if (atomic_load(&s->done)) continue;
        for (size_t k = 0; k < s->noffered;) {
            const shm_offered_t *o = &s->offered[k];
            if (start >= o->base + o->size || start + len <= o->base) {
                k++;
                continue;
            }
            shm_ipc_close_t c;
            memset(&c, 0, sizeof(c));
            c.h = (shm_hdr_t){SHM_MAGIC, SHM_VERSION, SHM_IPC_CLOSE, 0, 0};
            c.buffer_id = o->buffer_id;
            /* Best effort, never waiting: a requester whose socket is full learns by the
             * buffer id of the next offer (ids are never reused) or by the connection's
             * end. */
            if (send(s->fd, &c, sizeof(c), MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof(c))
                OTE_WARN_LIMITED("shm", "close receipt to %s (pid %d) not sent: %s", s->from,
                                 (int)s->pid, strerror(errno));
            s->offered[k] = s->offered[--s->noffered];
        }
    }
    ote_mutex_unlock(&tp->mu);
}

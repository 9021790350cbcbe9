/*
 * engine/rdma/rdma_stage_mrs.c - the MRs of the bounce buffers that the source's staged
 * grants use and their owner keeps (rdma_stage.c): the pinned pool's chunks (device
 * memory) and the file owner's kept bounces (file registrations). Each is registered once
 * per data device, at its first use there, and its MR is kept for the transport's life
 * (the chunks are the same pinned memory until the engine's destroy, and the kept file
 * bounces until the file owner's destroy: the engine destroys the transports before
 * both). A registration costs pinning and translation setup on a real NIC; a grant on a
 * kept bounce now costs none.
 *
 * The MR is local-only and MW-bindable (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND, as
 * the host registrations' MRs of rdma.c): its own rkey grants no remote access. A peer
 * reaches a chunk only through the window of the grant that holds it, bound over the
 * grant's bytes after their copy into the chunk completed and dead before the chunk goes
 * back to the pool, so a chunk used again never shows the bytes of an earlier grant.
 *
 * At most one entry per (device, chunk): bounded by the pool's chunks and the file
 * owner's kept bounces times the data devices. Listed under tp->mu; a chunk is held by
 * one grant at a time, so two threads never register the same one (a second
 * registration found listed would be dropped).
 * The MRs are single MRs of the transport's buffer manager (context/buffers.h). The
 * teardown drops them once no window can be bound (after the grant managers and the
 * endpoints are gone, before the PDs): one that will not deregister becomes the
 * manager's orphan, counted as a retained MR of its device, and keeps the manager, so
 * the transport, retained (and the engine keeps the pool's memory); the next teardown's
 * reclaim tries it again.
 */
#include <stdint.h>

#include "base/alloc.h"
#include "base/log.h"
#include "engine/rdma/rdma_internal.h"
#include "engine/rdma/rdma_stage.h"
#include "ote/ote.h"

struct rdma_stage_mr {
    struct rdma_stage_mr *next;
    const rdma_nic_t *nic;
    uint8_t *base;
    uint64_t size;
    struct ibv_mr *mr;
};

static struct ibv_mr *find_locked(rdma_tp_t *tp, const rdma_nic_t *nic, const uint8_t *base,
                                  uint64_t size) {
    for (rdma_stage_mr_t *m = tp->stage_mrs; m != NULL; m = m->next)
        if (m->nic == nic && m->base == base && m->size == size) return m->mr;
    return NULL;
}

/* The MR goes to the buffer manager (which keeps it as an orphan if its dereg fails). */
static void drop_mr(rdma_tp_t *tp, rdma_stage_mr_t *m) {
    ote_status_t st = ote_buffer_mr_drop(tp->bm, m->nic->ctx, m->mr, NULL, NULL, NULL);
    if (st != OTE_OK)
        OTE_ERROR("rdma",
                  "%s: dereg of the MR over a %llu-byte staging chunk or file bounce at %p "
                  "failed (%s): the MR is retained (the pool's memory stays with the engine)",
                  ote_context_name(m->nic->ctx), (unsigned long long)m->size, (void *)m->base,
                  ote_status_str(st));
    ote_free(m);
}

ote_status_t ote__rdma_stage_chunk_mr(rdma_tp_t *tp, rdma_nic_t *nic, uint8_t *base, uint64_t size,
                                      struct ibv_mr **mr_out) {
    ote_mutex_lock(&tp->mu);
    struct ibv_mr *mr = find_locked(tp, nic, base, size);
    ote_mutex_unlock(&tp->mu);
    if (mr != NULL) {
        *mr_out = mr;
        return OTE_OK;
    }
    rdma_stage_mr_t *m = ote_calloc(1, sizeof(*m));
    if (m == NULL) return OTE_ERR_NOMEM;
    m->nic = nic;
    m->base = base;
    m->size = size;
    ote_status_t st = ote_buffer_mr_reg(tp->bm, nic->ctx, base, size,
                                        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND, NULL, &m->mr);
    if (st != OTE_OK) {
        OTE_WARN("rdma", "%s: MR over a %llu-byte staging chunk or file bounce failed: %s",
                 ote_context_name(nic->ctx), (unsigned long long)size, ote_status_str(st));
        ote_free(m);
        return st;
    }
    ote_mutex_lock(&tp->mu);
    mr = find_locked(tp, nic, base, size);
    if (mr == NULL) {
        m->next = tp->stage_mrs;
        tp->stage_mrs = m;
        atomic_fetch_add(&tp->stage_mrs_made, 1);
    }
    ote_mutex_unlock(&tp->mu);
    if (mr == NULL) {
        *mr_out = m->mr;
        return OTE_OK;
    }
    drop_mr(tp, m); /* listed meanwhile (not expected: one grant holds a chunk at a time) */
    *mr_out = mr;
    return OTE_OK;
}

void ote__rdma_stage_mrs_drop(rdma_tp_t *tp) {
    while (tp->stage_mrs != NULL) {
        rdma_stage_mr_t *m = tp->stage_mrs;
        tp->stage_mrs = m->next;
        drop_mr(tp, m);
    }
}

size_t ote__rdma_stage_mrs_drop_nic(rdma_tp_t *tp, const rdma_nic_t *nic) {
    rdma_stage_mr_t *mine = NULL;
    ote_mutex_lock(&tp->mu);
    for (rdma_stage_mr_t **pp = &tp->stage_mrs; *pp != NULL;) {
        rdma_stage_mr_t *m = *pp;
        if (m->nic != nic) {
            pp = &m->next;
            continue;
        }
        *pp = m->next;
        m->next = mine;
        mine = m;
    }
    ote_mutex_unlock(&tp->mu);
    size_t n = 0;
    while (mine != NULL) {
        rdma_stage_mr_t *m = mine;
        mine = m->next;
        drop_mr(tp, m);
        n++;
    }
    return n;
}

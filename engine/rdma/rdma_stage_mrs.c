/*
 * engine/rdma/rdma_stage_mrs.c - the MRs of the pinned pool's chunks that the source's
 * staged grants use as bounce buffers (rdma_stage.c): each chunk is registered once per
 * data device, at its first use there, and its MR is kept for the transport's life (the
 * pool's chunks are the same pinned memory until the engine's destroy, which destroys
 * the transports before the pool). A registration costs pinning and translation setup
 * on a real NIC; a pooled grant now costs none.
 *
 * The MR is local-only and MW-bindable (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND, as
 * the host registrations' MRs of rdma.c): its own rkey grants no remote access. A peer
 * reaches a chunk only through the window of the grant that holds it, bound over the
 * grant's bytes after their copy into the chunk completed and dead before the chunk goes
 * back to the pool, so a chunk used again never shows the bytes of an earlier grant.
 *
 * At most one entry per (device, chunk): bounded by the pool's chunks times the data
 * devices. Listed under tp->mu; a chunk is held by one grant at a time, so two threads
 * never register the same one (a second registration found listed would be dropped).
 * The teardown deregisters them once no window can be bound (after the grant managers
 * and the endpoints are gone, before the PDs): one that will not deregister stays
 * listed, counted as a retained MR of its device, and keeps the transport retained (so
 * the engine keeps the pool's memory); the next teardown tries it again.
 */
#include <stdint.h>

#include "base/alloc.h"
#include "base/log.h"
#include "engine/rdma/rdma_internal.h"
#include "ote/ote.h"

struct rdma_stage_mr {
    struct rdma_stage_mr *next;
    const rdma_nic_t *nic;
    uint8_t *base;
    uint64_t size;
    struct ibv_mr *mr;
    int retained; /* a dereg failed: counted in the device's context */
};

static struct ibv_mr *find_locked(rdma_tp_t *tp, const rdma_nic_t *nic, const uint8_t *base,
                                  uint64_t size) {
    for (rdma_stage_mr_t *m = tp->stage_mrs; m != NULL; m = m->next)
        if (m->nic == nic && m->base == base && m->size == size) return m->mr;
    return NULL;
}

/* A dereg that failed: counted once, logged. 0: deregistered. */
static int drop_mr(rdma_tp_t *tp, rdma_stage_mr_t *m) {
    int err = tp->v->ops->dereg_mr(tp->v, m->mr);
    if (err == 0) {
        if (m->retained) ote_context_retained_add(m->nic->ctx, OTE_RETAINED_MR, -1);
        m->retained = 0;
        return 0;
    }
    if (!m->retained) ote_context_retained_add(m->nic->ctx, OTE_RETAINED_MR, 1);
    m->retained = 1;
    OTE_ERROR("rdma",
              "%s: dereg of the MR over a %llu-byte staging chunk at %p failed: errno %d; "
              "the MR is retained (the pool's memory stays with the engine)",
              ote_context_name(m->nic->ctx), (unsigned long long)m->size, (void *)m->base, err);
    return err;
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
    int err = tp->v->ops->reg_mr(tp->v, ote_context_pd(nic->ctx), base, size,
                                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND, &m->mr);
    if (err != 0) {
        OTE_WARN("rdma", "%s: MR over a %llu-byte staging chunk failed: errno %d",
                 ote_context_name(nic->ctx), (unsigned long long)size, err);
        ote_free(m);
        return ote_status_make(OTE_ERR_NATIVE, err);
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
    /* Listed meanwhile (not expected: one grant holds a chunk at a time): ours goes. */
    if (drop_mr(tp, m) != 0) {
        ote_mutex_lock(&tp->mu); /* kept listed, so that the teardown retries it */
        m->next = tp->stage_mrs;
        tp->stage_mrs = m;
        ote_mutex_unlock(&tp->mu);
    } else {
        ote_free(m);
    }
    *mr_out = mr;
    return OTE_OK;
}

size_t ote__rdma_stage_mrs_drop(rdma_tp_t *tp) {
    size_t left = 0;
    rdma_stage_mr_t **pp = &tp->stage_mrs;
    while (*pp != NULL) {
        rdma_stage_mr_t *m = *pp;
        if (drop_mr(tp, m) == 0) {
            *pp = m->next;
            ote_free(m);
            continue;
        }
        left++;
        pp = &m->next;
    }
    return left;
}

/*
 * engine/rdma/rdma_stage.c - source-side staging of device memory for RDMA READs: each
 * grant of a staged request (rdma_accounts.c) gets a host bounce buffer of exactly its
 * length from the engine (host->stage_get: a pinned chunk when it fits one, else heap),
 * the range's bytes copied into it from the device (host->stage_copy, synchronous until
 * the grant's deadline) and a temporary MW-bindable MR over it in the grant's device, so
 * that the grant's window covers exactly the bounce bytes and nothing else. The grant's
 * end (src_unpin in rdma_source.c, after the grant layer invalidated or deallocated the
 * window) deregisters the MR and gives the bounce buffer back; an MR that will not
 * deregister keeps its buffer (the NIC may still reach it): retained for good, counted in
 * the device's context. See rdma_internal.h for the protocol around it.
 */
#include <stdint.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "engine/rdma/rdma_internal.h"
#include "ote/ote.h"

struct rdma_stage {
    rdma_nic_t *nic;
    void *tok; /* the engine's bounce token (host->stage_put) */
    uint8_t *buf;
    uint64_t len;
    struct ibv_mr *mr;
};

ote_status_t ote__rdma_stage_read(rdma_tp_t *tp, rdma_nic_t *nic, void *reg_pin, uint64_t addr,
                                  uint64_t len, ote_deadline_t dl, rdma_stage_t **st_out) {
    if (tp->host.stage_get == NULL || tp->host.stage_copy == NULL || tp->host.stage_put == NULL)
        return OTE_ERR_UNSUPPORTED;
    /* The bounce holds the whole grant: a grant is never larger than rdma_grant_max (the
     * largest a requester asks), and never more than one bounce can hold. */
    if (len == 0 || len > tp->cfg.rdma_grant_max || len > UINT32_MAX) {
        OTE_WARN_LIMITED("rdma",
                         "staged READ grant of %llu bytes at 0x%llx refused: larger than "
                         "rdma_grant_max (%llu), the largest bounce buffer",
                         (unsigned long long)len, (unsigned long long)addr,
                         (unsigned long long)tp->cfg.rdma_grant_max);
        return OTE_ERR_TOO_BIG;
    }
    rdma_stage_t *st = ote_calloc(1, sizeof(*st));
    if (st == NULL) return OTE_ERR_NOMEM;
    st->nic = nic;
    st->len = len;
    /* Path check (gpu_paths has staging, else a WARN naming what is missing) and the
     * buffer. */
    ote_status_t s =
        tp->host.stage_get(tp->host.arg, reg_pin, (uint32_t)len, dl, &st->buf, &st->tok);
    if (s != OTE_OK) {
        ote_free(st);
        return s;
    }
    s = tp->host.stage_copy(tp->host.arg, st->tok, 0, addr, (uint32_t)len, dl);
    if (s != OTE_OK) {
        OTE_WARN_LIMITED("rdma",
                         "staged READ grant of %llu bytes at 0x%llx: the copy from the device "
                         "failed: %s",
                         (unsigned long long)len, (unsigned long long)addr, ote_status_str(s));
        tp->host.stage_put(tp->host.arg, st->tok); /* engine/gpu retains what it must */
        ote_free(st);
        return s;
    }
    int err = tp->v->ops->reg_mr(tp->v, ote_context_pd(nic->ctx), st->buf, len,
                                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND, &st->mr);
    if (err != 0) {
        OTE_WARN("rdma", "%s: MR over a %llu-byte bounce buffer failed: errno %d",
                 ote_context_name(nic->ctx), (unsigned long long)len, err);
        tp->host.stage_put(tp->host.arg, st->tok);
        ote_free(st);
        return ote_status_make(OTE_ERR_NATIVE, err);
    }
    *st_out = st;
    return OTE_OK;
}

struct ibv_mr *ote__rdma_stage_mr(const rdma_stage_t *st) {
    return st->mr;
}

uint64_t ote__rdma_stage_base(const rdma_stage_t *st) { return (uint64_t)(uintptr_t)st->buf; }

void ote__rdma_stage_end(rdma_tp_t *tp, rdma_stage_t *st) {
    if (st == NULL) return;
    int err = tp->v->ops->dereg_mr(tp->v, st->mr);
    if (err != 0) {
        /* The NIC may still reach the buffer: it is never given back (nor reused). */
        ote_context_retained_add(st->nic->ctx, OTE_RETAINED_MR, 1);
        OTE_WARN("rdma",
                 "%s: dereg of a bounce buffer's MR failed: errno %d; MR and its %llu-byte "
                 "buffer retained",
                 ote_context_name(st->nic->ctx), err, (unsigned long long)st->len);
        ote_free(st);
        return;
    }
    tp->host.stage_put(tp->host.arg, st->tok);
    ote_free(st);
}

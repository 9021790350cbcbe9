/*
 * engine/rdma/rdma_direct.c - GPUDirect RDMA in the RDMA transport: device memory
 * registered with a dma-buf MR in every usable context (ops->mem_register_dmabuf).
 *
 * The engine hands over the dma-buf of a device registration (engine/gpu/gpu_direct.c:
 * SYNC_MEMOPS set, the page-aligned range from the allocation's base) and the offset of
 * the user's range in it; the buffer manager publishes MRs of exactly [offset, +len)
 * with the user's address as iova, so lookups (ote_buffer_manager_find) and work
 * requests use the device address like a host one, and the MR covers no byte outside the
 * user's range. The MRs are local-only: a requester uses their lkey for its own device
 * buffer (no staging). Tear-down is the host MRs' (rdma_mem_unregister: a failed dereg
 * retains the registration). The MRs hold their own references on the dma-buf; the
 * engine closes its fd after this returns.
 *
 * Source grants over device memory (an exact-range MR in a private PD where windows
 * cannot bind over dma-buf MRs, as the kernel refuses MW_BIND on them) are not built:
 * the source refuses peers' requests on device memory (rdma_accounts.c).
 */
#include <stdint.h>

#include "base/alloc.h"
#include "base/log.h"
#include "engine/rdma/rdma_internal.h"

ote_status_t ote__rdma_mem_register_dmabuf(ote__transport_t *t, void *addr, size_t len, int fd,
                                           uint64_t offset) {
    rdma_tp_t *tp = (rdma_tp_t *)t;
    reg_ent_t *r = ote_calloc(1, sizeof(*r));
    if (r == NULL) return OTE_ERR_NOMEM;
    ote_status_t st =
        ote_buffer_register_dmabuf(tp->bm, addr, len, IBV_ACCESS_LOCAL_WRITE, fd, offset, &r->buf);
    if (st != OTE_OK) {
        ote_free(r);
        OTE_WARN_LIMITED("rdma",
                         "dma-buf MRs of device memory [%p, +%zu) failed: %s; GPUDirect RDMA "
                         "is not used for it",
                         addr, len, ote_status_str(st));
        return st;
    }
    r->addr = addr;
    ote_mutex_lock(&tp->mu);
    r->next = tp->regs;
    tp->regs = r;
    ote_mutex_unlock(&tp->mu);
    return OTE_OK;
}

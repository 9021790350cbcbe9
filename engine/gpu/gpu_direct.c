/*
 * engine/gpu/gpu_direct.c - GPUDirect RDMA (gpu_paths "direct"): what the RDMA transport
 * needs from the driver to register device memory with the NIC, and the path's counters.
 *
 * A registration of device memory, when direct is allowed, asks for the range's dma-buf
 * (cuMemGetHandleForAddressRange over the page-aligned range from the allocation's base,
 * cuda/memory) after setting SYNC_MEMOPS on the allocation (synchronous copies to it
 * complete before they return, so a NIC never reads bytes a finished cuMemcpy has not
 * yet placed). The transport registers [offset, +len) of that dma-buf, with the user's
 * exact range as its iova; the caller closes the fd once the MRs exist (each MR keeps
 * its own reference on the dma-buf). A driver that cannot export leaves the registration
 * to the other paths; that is logged once per engine.
 */
#include <stdatomic.h>
#include <stdint.h>

#include "base/log.h"
#include "engine/gpu/gpu.h"
#include "engine/gpu/gpu_internal.h"

int ote__gpu_direct_allowed(const ote__gpu_t *g) { return (g->paths & OTE__GPU_PATH_DIRECT) != 0; }

ote_status_t ote__gpu_direct_export(ote__gpu_t *g, uint32_t kind, uint64_t addr, uint64_t len,
                                    int *fd_out, uint64_t *offset_out) {
    if (!OTE_MEM_IS_CUDA(kind) || len == 0 || fd_out == NULL || offset_out == NULL)
        return OTE_ERR_INVALID;
    if (!ote__gpu_direct_allowed(g)) return OTE_ERR_UNSUPPORTED;
    gdev_t *d = NULL;
    ote_status_t st = ote__gpu_dev_open(g, kind, 0, &d);
    if (st == OTE_OK) st = ote_cuda_pointer_set_sync_memops(d->dev, addr);
    ote_cuda_dmabuf_t db = {.fd = -1};
    if (st == OTE_OK) st = ote_cuda_dmabuf_export(d->dev, addr, (size_t)len, &db);
    if (st != OTE_OK) {
        if (atomic_exchange(&g->direct_warned, 1) == 0)
            OTE_WARN("gpu",
                     "cuda:%d: no dma-buf for device memory at 0x%llx (+%llu): %s; GPUDirect "
                     "RDMA is not used for it (nor said again for later registrations), "
                     "the other paths in gpu_paths=\"%s\" still are",
                     OTE_MEM_CUDA_DEVICE(kind), (unsigned long long)addr, (unsigned long long)len,
                     ote_status_str(st), g->paths_text);
        atomic_fetch_add(&g->n_direct_failed, 1);
        return st;
    }
    atomic_fetch_add(&g->n_direct_regs, 1);
    *fd_out = db.fd;
    *offset_out = db.offset;
    return OTE_OK;
}

void ote__gpu_direct_close(int fd) {
    ote_cuda_dmabuf_t db = {.fd = fd};
    ote_cuda_dmabuf_close(&db);
}

void ote__gpu_direct_count(ote__gpu_t *g) { atomic_fetch_add(&g->n_direct, 1); }

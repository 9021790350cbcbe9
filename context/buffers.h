/*
 * context/buffers.h - the buffer manager: persistent MRs of registered memory.
 *
 * A registration publishes one MR for a caller's range in every usable context of a
 * context set (active or paused; not fatal), all or nothing: when the MR of any context
 * fails, the MRs already made for this registration are deregistered and nothing stays
 * published. A device mask restricts where transfers run, not where MRs are published.
 *
 * Deregistration can fail (the provider refuses while windows or work use the MR). A
 * failed dereg keeps that MR (counted per context as OTE_RETAINED_MR and in the
 * manager) and the registration handle stays valid in a retiring state: it is no
 * longer found by lookups, and the caller must keep the backing memory until a retry
 * of ote_buffer_deregister() on the same handle returns OTE_OK. MRs that a rollback
 * could not deregister have no handle; ote_buffer_manager_reclaim() retries them.
 *
 * Thread-safe. The context set must outlive the manager.
 */
#ifndef OTE_CONTEXT_BUFFERS_H
#define OTE_CONTEXT_BUFFERS_H

#include <stddef.h>

#include "base/status.h"
#include "context/context.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ote_buffer_manager ote_buffer_manager_t;
typedef struct ote_buffer ote_buffer_t;

ote_status_t ote_buffer_manager_create(ote_context_set_t *set, ote_buffer_manager_t **bm_out);
/* OTE_ERR_BUSY while registrations (live or retiring) exist, OTE_ERR_RETAINED while
 * orphaned MRs remain (reclaim first); OTE_OK frees the manager. */
ote_status_t ote_buffer_manager_destroy(ote_buffer_manager_t *bm);

/**
 * ote_buffer_register() - publish MRs for [addr, addr+len) with ibv access flags
 * @access (IBV_ACCESS_*) in every usable context. OTE_ERR_EXISTS when the exact range
 * is already registered. On failure nothing of this registration stays published.
 */
ote_status_t ote_buffer_register(ote_buffer_manager_t *bm, void *addr, size_t len, int access,
                                 ote_buffer_t **buf_out);
/**
 * ote_buffer_register_dmabuf() - the same for memory the process may not address (GPU
 * memory, GPUDirect RDMA): in every usable context an MR of bytes [offset, offset+len)
 * of the dma-buf fd (ibv_reg_dmabuf_mr), addressed by work requests and looked up at
 * [addr, addr+len) (its iova). The fd stays the caller's: an MR holds its own reference
 * on the dma-buf, so the caller may close the fd once this returns. offset and addr
 * must have the same offset in their page (the kernel's rule).
 */
ote_status_t ote_buffer_register_dmabuf(ote_buffer_manager_t *bm, void *addr, size_t len,
                                        int access, int fd, uint64_t offset,
                                        ote_buffer_t **buf_out);
/**
 * ote_buffer_deregister() - deregister every MR of @buf. OTE_OK frees @buf.
 * OTE_ERR_RETAINED: some MR could not be deregistered; @buf stays valid (retiring),
 * call again to retry. The backing memory must stay valid until OTE_OK.
 */
ote_status_t ote_buffer_deregister(ote_buffer_manager_t *bm, ote_buffer_t *buf);

/* Retry the orphaned MRs left by failed rollbacks; @remaining_out (optional) receives
 * how many are still retained (orphans and retiring registrations' MRs). */
ote_status_t ote_buffer_manager_reclaim(ote_buffer_manager_t *bm, size_t *remaining_out);
/* MRs currently retained by this manager (orphans + MRs of retiring registrations). */
size_t ote_buffer_manager_retained(ote_buffer_manager_t *bm);
/* Live registrations (not counting retiring ones). */
size_t ote_buffer_manager_count(ote_buffer_manager_t *bm);

/* The MR of @buf in context @ctx: OTE_ERR_NOT_FOUND when @ctx has none. */
ote_status_t ote_buffer_mr(const ote_buffer_t *buf, const ote_context_t *ctx,
                           struct ibv_mr **mr_out);
/* Find the live registration whose range contains [addr, addr+len) and its MR in @ctx
 * (OTE_ERR_ACCESS when no registration covers the range). */
ote_status_t ote_buffer_manager_find(ote_buffer_manager_t *bm, const void *addr, size_t len,
                                     const ote_context_t *ctx, struct ibv_mr **mr_out);

#ifdef __cplusplus
}
#endif
#endif

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
 * The manager also owns the single MRs its users make for a while: an MR of one
 * context (a requester's temporary MR over an unregistered buffer, a bounce buffer's, a
 * source grant's exact dma-buf MR in a private PD). They are made with
 * ote_buffer_mr_reg() and end with ote_buffer_mr_drop(); between the two the caller
 * uses the MR, and the manager counts it (its destroy is OTE_ERR_BUSY meanwhile). Their
 * failed dereg follows the one policy above: the MR becomes an orphan of the manager,
 * counted per context as OTE_RETAINED_MR and in the manager, retried by
 * ote_buffer_manager_reclaim(), and the manager's destroy answers OTE_ERR_RETAINED until
 * it is gone. The caller forgets the MR either way; when the backing memory is its own,
 * it gives the manager a release callback, called once the MR is finally deregistered
 * (at once, or by the reclaim that succeeds), and frees that memory only then.
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
/* OTE_ERR_BUSY while registrations (live or retiring) or single MRs not dropped exist,
 * OTE_ERR_RETAINED while orphaned MRs remain (reclaim first); OTE_OK frees the manager. */
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
 * [addr, addr+len) (its iova). The fd stays the caller's (it may close it once this
 * returns): the buffer keeps a duplicate of its own, closed when the buffer is freed, from
 * which a device reopened after a lost event consumer registers the range anew
 * (ote_buffer_manager_republish). offset and addr must have the same offset in their page
 * (the kernel's rule).
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

/* Where a single MR is made: @pd (NULL: the context's PD) and, for a dma-buf MR, its fd
 * (>= 0; the MR takes its own reference) and the offset in it; @dmabuf_fd < 0 makes an
 * ibv_reg_mr MR of the address. */
typedef struct {
    struct ibv_pd *pd;
    int dmabuf_fd;
    uint64_t dmabuf_off;
} ote_buffer_mr_where_t;

/* Called once when an MR dropped with it is finally deregistered (from
 * ote_buffer_mr_drop itself, or from the reclaim that succeeds, on its thread, no manager
 * lock held). */
typedef void (*ote_buffer_mr_released_fn)(void *owner, void *item);

/**
 * ote_buffer_mr_reg() - make one MR of [addr, addr+len) (for a dma-buf MR, addr is its
 * iova) in context @ctx with ibv access flags @access, where @where says (NULL: an
 * ibv_reg_mr MR in the context's PD). The MR is the manager's until ote_buffer_mr_drop().
 * A provider failure is OTE_ERR_NATIVE with its errno (EFAULT: memory the kernel would
 * not pin with these flags); the caller logs it, naming what the MR was for.
 */
ote_status_t ote_buffer_mr_reg(ote_buffer_manager_t *bm, ote_context_t *ctx, void *addr, size_t len,
                               int access, const ote_buffer_mr_where_t *where,
                               struct ibv_mr **mr_out);
/**
 * ote_buffer_mr_drop() - end an MR of ote_buffer_mr_reg(). OTE_OK: deregistered, and
 * @released (optional) has been called with (@owner, @item). OTE_ERR_RETAINED: the
 * dereg failed; the MR is now the manager's orphan (counted, logged, retried by reclaim)
 * and @released runs when a reclaim deregisters it; the caller must keep the backing
 * memory until then. OTE_ERR_NOMEM: not even the orphan could be recorded: the MR is
 * leaked, counted retained for good and logged, and @released never runs.
 */
ote_status_t ote_buffer_mr_drop(ote_buffer_manager_t *bm, ote_context_t *ctx, struct ibv_mr *mr,
                                ote_buffer_mr_released_fn released, void *owner, void *item);
/* Single MRs made and not dropped yet. */
size_t ote_buffer_manager_single(ote_buffer_manager_t *bm);

/* Retry the orphaned MRs (failed rollbacks, single MRs whose drop failed); @remaining_out (optional) receives
 * how many are still retained (orphans and retiring registrations' MRs). */
ote_status_t ote_buffer_manager_reclaim(ote_buffer_manager_t *bm, size_t *remaining_out);
/* MRs currently retained by this manager (orphans + MRs of retiring registrations). */
size_t ote_buffer_manager_retained(ote_buffer_manager_t *bm);
/* Live registrations (not counting retiring ones). */
size_t ote_buffer_manager_count(ote_buffer_manager_t *bm);

/* The MR of @buf in context @ctx: OTE_ERR_NOT_FOUND when @ctx has none. */
ote_status_t ote_buffer_mr(const ote_buffer_t *buf, const ote_context_t *ctx,
                           struct ibv_mr **mr_out);
/**
 * ote_buffer_manager_drop_context() - for the reopen of @ctx (context.h,
 * ote_context_reopen): every live registration's MR in @ctx is deregistered (one that
 * will not go becomes an orphan: retained, counted, retried by the reclaim); the
 * registrations stay and lookups in @ctx find no MR until ote_buffer_manager_republish.
 * Returns how many MRs were taken out.
 */
size_t ote_buffer_manager_drop_context(ote_buffer_manager_t *bm, ote_context_t *ctx);
/**
 * ote_buffer_manager_republish() - after the reopen of @ctx: every live registration
 * without an MR in @ctx gets one on its current PD (same range and access). A dma-buf
 * registration is refused (OTE_ERR_UNSUPPORTED: its fd is not kept), one whose reg_mr fails
 * too; each stays without an MR in @ctx, with a WARN naming it. Returns OTE_OK or the
 * first failure; @count_out (optional): MRs made or already there. Call it before
 * resuming @ctx and again after: a registration listed between the two gets its MR from
 * the second call, one listed after the resume gets it at its registration.
 */
ote_status_t ote_buffer_manager_republish(ote_buffer_manager_t *bm, ote_context_t *ctx,
                                          size_t *count_out);
/* Find the live registration whose range contains [addr, addr+len) and its MR in @ctx
 * (OTE_ERR_ACCESS when no registration covers the range). */
ote_status_t ote_buffer_manager_find(ote_buffer_manager_t *bm, const void *addr, size_t len,
                                     const ote_context_t *ctx, struct ibv_mr **mr_out);

#ifdef __cplusplus
}
#endif
#endif

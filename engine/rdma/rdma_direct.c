/*
 * engine/rdma/rdma_direct.c - GPUDirect RDMA in the RDMA transport: device memory
 * registered with a dma-buf MR in every usable context (ops->mem_register_dmabuf), and
 * the source's grants over it.
 *
 * Registration. The engine hands over the dma-buf of a device registration
 * (engine/gpu/gpu_direct.c: SYNC_MEMOPS set, the page-aligned range from the
 * allocation's base) and the offset of the user's range in it; the buffer manager
 * publishes MRs of exactly [offset, +len) with the user's address as iova, so lookups
 * (ote_buffer_manager_find) and work requests use the device address like a host one,
 * and the MR covers no byte outside the user's range. These MRs are local-only: a
 * requester uses their lkey for its own device buffer (no staging). We keep our own
 * duplicate of the fd (closed at unregister) for the source grants' exact MRs; the engine
 * closes its fd after this returns. Tear-down is the host MRs' (rdma_mem_unregister: a
 * failed dereg retains the registration).
 *
 * Source grants (the design is in rdma_internal.h, "GPUDirect source grants"). Windows
 * cannot bind over dma-buf MRs (the kernel refuses MW_BIND on them, and so does the
 * sim), so a grant over device memory is an MR of exactly the granted range, registered
 * from our dma-buf fd for this grant alone, in the private PD of the direct endpoint's
 * QP that the requester asked on (endpoint/: ote_endpoint_store_private_pd). Only that
 * QP, connected to that one requester QP, can reach the MR, and only while the grant
 * lives: its end (the requester's SEND_WITH_IMM receipt, a RELEASE, the deadline, the
 * requester's loss) deregisters it here before anything else is released. The MR is a
 * single MR of the transport's buffer manager (context/buffers.h): a dereg that fails
 * leaves it an orphan there (counted, retried by the monitor's reclaim, and by the
 * teardown before the private PDs go; teardown reports RETAINED while one is left).
 *
 * Host memory without windows (rdma_grant_mode, ote__rdma_grant_mode_resolve). A device
 * without type-2 memory windows (or rdma_grant_mode=mr) grants host memory the same way:
 * the request's account (rdma_accounts.c) serves it on direct slots, and
 * ote__rdma_direct_mr registers the exact MR from the registration's address instead of
 * its dma-buf. One mechanism for both kinds: the private PD, the rkey answered at once,
 * the SEND_WITH_IMM receipt, the dereg before the account's pin goes. No MR cache: each
 * grant's MR is registered for it and deregistered at its end (ote.h, rdma_grant_mode).
 * A requester of such a source (rdma_grant_mr=1) asks on direct slots first
 * (ote__rdma_direct_recall), so it builds no plain QP that would carry only redirects.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/log.h"
#include "engine/rdma/rdma_internal.h"

ote_status_t ote__rdma_mem_register_dmabuf(ote__transport_t *t, void *addr, size_t len, int fd,
                                           uint64_t offset) {
    rdma_tp_t *tp = (rdma_tp_t *)t;
    ote__rdma_topo_gpus(tp); /* the driver is loaded now: the GPUs' NIC ranks */
    reg_ent_t *r = ote_calloc(1, sizeof(*r));
    if (r == NULL) return OTE_ERR_NOMEM;
    r->dmabuf_fd = dup(fd);
    if (r->dmabuf_fd < 0) {
        int err = errno;
        ote_free(r);
        OTE_WARN_LIMITED("rdma", "dma-buf of device memory [%p, +%zu): dup failed: errno %d", addr,
                         len, err);
        return ote_status_make(OTE_ERR_NATIVE, err);
    }
    ote_status_t st =
        ote_buffer_register_dmabuf(tp->bm, addr, len, IBV_ACCESS_LOCAL_WRITE, fd, offset, &r->buf);
    if (st != OTE_OK) {
        (void)close(r->dmabuf_fd);
        ote_free(r);
        OTE_WARN_LIMITED("rdma",
                         "dma-buf MRs of device memory [%p, +%zu) failed: %s; GPUDirect RDMA "
                         "is not used for it",
                         addr, len, ote_status_str(st));
        return st;
    }
    r->addr = addr;
    r->len = len;
    r->dmabuf_off = offset;
    ote_mutex_lock(&tp->mu);
    r->next = tp->regs;
    tp->regs = r;
    ote_mutex_unlock(&tp->mu);
    return OTE_OK;
}

void ote__rdma_direct_reg_end(reg_ent_t *r) {
    if (r->dmabuf_fd >= 0) (void)close(r->dmabuf_fd);
    r->dmabuf_fd = -1;
}

ote_status_t ote__rdma_grant_mode_resolve(rdma_tp_t *tp) {
    const char *want = tp->cfg.rdma_grant_mode[0] != '\0' ? tp->cfg.rdma_grant_mode : "auto";
    const char *nomw = NULL; /* the first data device without type-2 windows */
    for (uint32_t i = 0; i < tp->nnics && nomw == NULL; i++) {
        ote_context_info_t info;
        ote_context_get_info(tp->nics[i].ctx, &info);
        if (!info.limits.mw_type2) nomw = ote_context_name(tp->nics[i].ctx);
    }
    tp->have_mw = nomw == NULL;
    if (strcmp(want, "mw") == 0 && nomw != NULL) {
        OTE_ERROR("rdma",
                  "transport=rdma: rdma_grant_mode=mw, but device %s has no type-2 memory "
                  "windows (device_cap_flags, max_mw): set rdma_grant_mode=mr or auto",
                  nomw);
        return OTE_ERR_UNSUPPORTED;
    }
    int mr = strcmp(want, "mr") == 0 || (strcmp(want, "auto") == 0 && nomw != NULL);
    tp->grant_mode = mr ? OTE__RDMA_GRANT_MR : OTE__RDMA_GRANT_MW;
    OTE_INFO("rdma", "transport=rdma: host memory is granted by %s (rdma_grant_mode=%s%s%s%s)",
             mr ? "exact MRs, one per grant" : "type-2 memory windows", want,
             nomw != NULL ? "; device " : "", nomw != NULL ? nomw : "",
             nomw != NULL ? " has no type-2 windows" : "");
    return OTE_OK;
}

/* The registration holding [addr, +len) (with a dma-buf only when dmabuf), or NULL.
 * tp->mu held. */
static const reg_ent_t *reg_find_locked(rdma_tp_t *tp, uint64_t addr, uint64_t len, int dmabuf) {
    for (const reg_ent_t *r = tp->regs; r != NULL; r = r->next) {
        uint64_t base = (uint64_t)(uintptr_t)r->addr;
        if ((!dmabuf || r->dmabuf_fd >= 0) && addr >= base && len <= r->len &&
            addr - base <= r->len - len)
            return r;
    }
    return NULL;
}

int ote__rdma_direct_servable(rdma_tp_t *tp, uint64_t addr, uint64_t len) {
    ote_mutex_lock(&tp->mu);
    int yes = reg_find_locked(tp, addr, len, 1) != NULL;
    ote_mutex_unlock(&tp->mu);
    return yes;
}

ote_status_t ote__rdma_direct_mr(rdma_tp_t *tp, ote_qp_t *qp, uint64_t addr, uint64_t len,
                                 int access, struct ibv_mr **mr_out) {
    ote_mutex_lock(&tp->mu);
    const reg_ent_t *r = reg_find_locked(tp, addr, len, 0);
    /* The registration is pinned by the grant's account: it (and a dma-buf's fd) stays
     * until then. Host memory: an ibv_reg_mr MR of the address (fd -1). */
    int found = r != NULL;
    int fd = found ? r->dmabuf_fd : -1;
    uint64_t off = fd >= 0 ? r->dmabuf_off + (addr - (uint64_t)(uintptr_t)r->addr) : 0;
    ote_mutex_unlock(&tp->mu);
    if (!found) return OTE_ERR_ACCESS;
    /* Remote WRITE needs local write too (verbs); nothing else is given. */
    int acc = access | ((access & IBV_ACCESS_REMOTE_WRITE) ? IBV_ACCESS_LOCAL_WRITE : 0);
    ote_buffer_mr_where_t where = {.pd = ote_qp_pd(qp), .dmabuf_fd = fd, .dmabuf_off = off};
    ote_status_t st = ote_buffer_mr_reg(tp->bm, ote_qp_context(qp), (void *)(uintptr_t)addr,
                                        (size_t)len, acc, &where, mr_out);
    if (st != OTE_OK) {
        OTE_WARN_LIMITED("rdma",
                         "exact MR of %s [0x%llx, +%llu) for a grant failed: %s: the grant is "
                         "refused",
                         fd >= 0 ? "device memory (dma-buf)" : "host memory",
                         (unsigned long long)addr, (unsigned long long)len, ote_status_str(st));
        return st;
    }
    atomic_fetch_add(&tp->direct_mrs, 1);
    atomic_fetch_add(&tp->direct_served, 1);
    if (fd < 0) atomic_fetch_add(&tp->direct_host_served, 1);
    return OTE_OK;
}

/* An exact MR is gone (at its drop, or at the reclaim that deregistered it). */
static void direct_mr_released(void *owner, void *item) {
    (void)item;
    rdma_tp_t *tp = owner;
    atomic_fetch_add(&tp->direct_released, 1);
    atomic_fetch_sub(&tp->direct_mrs, 1);
}

void ote__rdma_direct_mr_drop(rdma_tp_t *tp, ote_context_t *ctx, struct ibv_mr *mr) {
    ote_status_t st = ote_buffer_mr_drop(tp->bm, ctx, mr, direct_mr_released, tp, NULL);
    if (st != OTE_OK)
        OTE_ERROR("rdma",
                  "dereg of a grant's exact MR failed (%s); retained (its rkey stays "
                  "reachable only through its private QP, which is fenced)",
                  ote_status_str(st));
}

int ote__rdma_direct_is_redirect(const conn_t *c, ote_status_t st, uint32_t rkey) {
    return c->direct_ok && st == OTE_ERR_UNSUPPORTED && rkey == OTE_RP_RKEY_DIRECT;
}

/* The remote start of s's request (of the run itself when it has no request length). */
static uint64_t req_at(const ote__slice_t *s) {
    return s->req_len != 0 ? s->req_remote : s->remote;
}

void ote__rdma_direct_remember(ote__tpeer_t *p, const ote__slice_t *s) {
    if (s->req_uid == 0) return;
    uint64_t lo = req_at(s), hi = lo + (s->req_len != 0 ? s->req_len : s->len);
    ote_mutex_lock(&p->mu);
    int known = 0;
    for (uint32_t i = 0; i < OTE__RDMA_REDIRECT_MEMO && !known; i++)
        known = p->direct.redirected[i] == s->req_uid;
    if (!known) {
        p->direct.redirected[p->direct.next] = s->req_uid;
        p->direct.next = (p->direct.next + 1) % OTE__RDMA_REDIRECT_MEMO;
    }
    if (p->direct.hi != 0 && lo <= p->direct.hi && hi >= p->direct.lo) { /* meets or touches */
        if (lo > p->direct.lo) lo = p->direct.lo;
        if (hi < p->direct.hi) hi = p->direct.hi;
    }
    p->direct.lo = lo;
    p->direct.hi = hi;
    ote_mutex_unlock(&p->mu);
}

void ote__rdma_direct_forget(ote__tpeer_t *p, const ote__slice_t *s) {
    uint64_t at = req_at(s);
    ote_mutex_lock(&p->mu);
    if (at >= p->direct.lo && at < p->direct.hi) p->direct.lo = p->direct.hi = 0;
    ote_mutex_unlock(&p->mu);
}

void ote__rdma_direct_recall(ote__tpeer_t *p, ote__slice_t *s) {
    if (ote__rdma_xp(s)->direct || s->req_uid == 0 || p->conn.c == NULL || !p->conn.c->direct_ok)
        return;
    int known = 0;
    ote_mutex_lock(&p->mu);
    for (uint32_t i = 0; i < OTE__RDMA_REDIRECT_MEMO && !known; i++)
        known = p->direct.redirected[i] == s->req_uid;
    /* A source with rdma_grant_mr=1 serves host memory, and device memory with a dma-buf,
     * on direct slots only; a plain QP would carry nothing but the redirect (and count
     * against both sides' rdma_max_qps). Only device memory it serves staged stays on
     * plain slots: it sends such a run back (plain), and its range is known staged. */
    uint64_t at = req_at(s);
    int seen = at >= p->direct.lo && at < p->direct.hi; /* redirected there before */
    int first = !known && (p->conn.c->grant_mr || seen) && !ote__rdma_xp(s)->plain &&
                !(at >= p->staged.lo && at < p->staged.hi);
    ote_mutex_unlock(&p->mu);
    if (!known && !first) return;
    for (ote__slice_t *x = s; x != NULL; x = x->next) ote__rdma_xp(x)->direct = 1;
    if (known || seen) atomic_fetch_add(&p->tp->direct_recalled, 1);
}

/*
 * grant/grant.h - exact-range DMA authority over RDMA: grants, their slices and receipts.
 *
 * A grant is one loan of exactly [addr, addr+len) of a source's registered host memory,
 * for exactly one operation (READ or WRITE), to one requester QP:
 *
 *   requester                              source
 *   ote_grant_start() -- ctl->request --->  ote_grant_serve(): check the registration
 *                                           (refused before any window exists), bind a
 *                                           type-2 MW over exactly the range and access
 *                                           with IBV_WR_BIND_MW on the QP connected to
 *                                           this requester; on the bind CQE answer rkey
 *   ote_grant_on_answer(rkey) <-- answer --
 *   post the slices (RDMA_WRITE/READ, TENT geometry, windowed through the QP's SQ);
 *   after every data CQE succeeded, SEND_WITH_INV(rkey) on the same QP ---------------->
 *                                           receive CQE WITH_INV, invalidated_rkey:
 *                                           ote_grant_source_receipt() releases the
 *                                           window, the registration pin and the QP borrow
 *   the SEND's CQE ends the grant: done(OK).
 *
 * The grant layer never includes engine headers: the control plane is a callback table
 * (ote_grant_ctl_t for the requester, ote_grant_source_ops_t for the source).
 *
 * Ownership: a grant takes over the caller's borrow of its QP from an endpoint slot and
 * gives it back exactly once (retiring the slot first when the QP broke). Its WRs are
 * named in one lane namespace per manager and lane (OTE_CQ_WR_ID(ns, seq<<16|index)).
 * A failed or expired grant stops posting, fences/cancels its QP and ends (done()) only
 * once every WR it posted was discharged by a CQE, a flush, or the QP's destruction, so
 * nothing the NIC could still write is given back early.
 *
 * Windows: every bind re-keys its window with a new 8-bit tag (ibv_inc_rkey). The manager
 * keeps the key history of every window index of its PD (its key domain), so no rkey
 * repeats within the manager's life, across windows too: a bind takes the next tag its
 * index has not used, and a window whose index used all 256 is kept allocated (never
 * bound again, counted in mw_retired) until the manager is destroyed, or until the
 * provider has no window left for a new grant (grant/window.c).
 *
 * Thread-safe. Completion work runs in the lane's polling thread. The lanes of one
 * manager run in parallel: each lane's grants post and complete under that lane's own
 * lock (see grant_internal.h), so no lane waits for another's post or completions.
 */
#ifndef OTE_GRANT_GRANT_H
#define OTE_GRANT_GRANT_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "base/time.h"
#include "context/context.h"
#include "cq/lane.h"
#include "endpoint/endpoint.h"
#include "qp/qp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- slice geometry (TENT): 64 KiB blocks, a tail under a quarter block folded into
 * the last full block. */
#define OTE_GRANT_BLOCK (64u << 10)
#define OTE_GRANT_MAX_SLICES 0xfff0u
/* Number of slices of a len-byte grant (0 for 0). */
uint32_t ote_grant_slice_count(uint64_t len);
/* Offset and length of slice i (< count) of a len-byte grant. */
void ote_grant_slice_at(uint64_t len, uint32_t i, uint64_t *off_out, uint32_t *len_out);
/* Largest grant this layer accepts. */
#define OTE_GRANT_MAX_LEN ((uint64_t)OTE_GRANT_MAX_SLICES * OTE_GRANT_BLOCK)

typedef struct ote_grant_mgr ote_grant_mgr_t;

typedef enum { OTE_GRANT_READ = 0, OTE_GRANT_WRITE = 1 } ote_grant_op_t;

/* Requester: the control plane asks the source for a grant. request() sends it and
 * returns OTE_OK, after which the engine calls ote_grant_on_answer(mgr, id, ...) at most
 * once (a lost answer is ended by the grant's deadline). */
typedef struct ote_grant_ctl {
    void *arg;
    ote_status_t (*request)(void *arg, uint64_t grant_id, uint32_t slot, uint32_t remote_qpn,
                            ote_grant_op_t op, uint64_t addr, uint64_t len);
} ote_grant_ctl_t;

typedef void (*ote_grant_done_fn)(void *arg, ote_status_t st);

typedef struct ote_grant_desc {
    ote_grant_op_t op;
    uint8_t *local;     /* requester buffer */
    uint32_t lkey;      /* its MR's lkey in the QP's context */
    uint64_t remote;    /* source address */
    uint64_t len;       /* 1..OTE_GRANT_MAX_LEN */
    ote_endpoint_t *ep; /* the QP's endpoint and slot: the borrow is handed over */
    uint32_t slot;
    ote_qp_t *qp;
    ote_deadline_t deadline;
    ote_grant_done_fn done; /* exactly once, without grant locks */
    void *done_arg;
    /* Optional (NULL: never): nonzero once the caller canceled the grant. Slices not yet
     * posted are then never posted; what was posted completes, the window is invalidated
     * by the receipt as usual (the source releases it at once) and done() reports
     * OTE_ERR_CANCELED. Looked at under the grant's lane lock: it must not block nor
     * call into the grant layer. */
    int (*canceled)(void *done_arg);
    /* Optional (NULL: never): called once, just before done() and without grant locks,
     * when the grant ends failed although the source answered it (so the source still
     * holds its window: no receipt invalidated it). Every WR the grant posted has been
     * discharged by then (CQE, flush or the QP's destruction), so nothing of it is in
     * flight: the caller may tell the source to release the window now (identified by
     * the slot, the source's QP number on it and the window's rkey; see
     * ote_grant_source_release) instead of leaving it to the source's deadline. */
    void (*abandoned)(void *done_arg, uint32_t slot, uint32_t remote_qpn, uint32_t rkey);
    /* Nonzero: the source serves this grant with an exact-range MR (ote_grant_serve_exact:
     * GPUDirect device memory, no window), which a SEND_WITH_INV cannot invalidate; the
     * receipt is then a SEND_WITH_IMM whose immediate is htonl(rkey). */
    int receipt_imm;
} ote_grant_desc_t;

/* Source: checks against registrations and the answer channel. */
typedef struct ote_grant_source_ops {
    void *arg;
    /* Check [addr, addr+len) against the registrations for `access` (IBV_ACCESS_REMOTE_
     * READ or _WRITE) and pin it; give its MW-bindable MR in ctx. `call` is the one given
     * to the ote_grant_serve() that calls this (before it returns, on its thread): the
     * caller's state of that one request. */
    ote_status_t (*pin)(void *arg, void *call, ote_context_t *ctx, uint64_t addr, uint64_t len,
                        int access, struct ibv_mr **mr_out, void **pin_out);
    void (*unpin)(void *arg, void *pin);
    /* Answer a served request (exactly once per request ote_grant_serve() accepted). */
    void (*answer)(void *arg, uint64_t answer_ctx, ote_status_t st, uint32_t rkey);
    /* Optional (ote_grant_serve_exact only): check [addr, addr+len) for `access` as pin
     * does, pin it and register an MR of exactly that range with that remote access in
     * the PD of qp (the requester's only way in); give its rkey. unpin(pin) deregisters
     * it (synchronous revocation: no byte of it is reachable once unpin returns, or it is
     * retained by the owner of pin when the dereg fails) and releases the pin. `call` as
     * for pin (ote_grant_serve_exact's). */
    ote_status_t (*pin_exact)(void *arg, void *call, ote_qp_t *qp, uint64_t addr, uint64_t len,
                              int access, uint32_t *rkey_out, void **pin_out);
} ote_grant_source_ops_t;

typedef struct ote_grant_stats {
    uint64_t started, completed, failed, expired;
    uint64_t slices_posted, slices_completed, partial_posts, sq_waits;
    uint64_t served, refused, bind_failures, receipts, source_expired;
    uint64_t stale_cqes, stale_receipts;
    uint64_t live_requester, live_source, mw_pool;
    uint64_t mw_retained;    /* windows whose dealloc failed, kept until a retry succeeds */
    uint64_t abandoned;      /* requester: failed grants handed to desc.abandoned */
    uint64_t released;       /* source: grants ended by ote_grant_source_release */
    uint64_t stale_releases; /* source: releases naming no bound grant (ignored) */
    uint64_t rq_busy;        /* source: refused OTE_ERR_AGAIN, no receive slot for the receipt */
    uint64_t mw_allocated;   /* source: windows allocated (alloc_mw succeeded) */
    uint64_t mw_retired; /* source: windows kept allocated, every rkey tag of their index used */
} ote_grant_stats_t;

/**
 * ote_grant_mgr_create() - grants on @ctx whose QPs use @lanes (one namespace is
 * registered per lane). @src may be NULL for a requester-only manager.
 */
ote_status_t ote_grant_mgr_create(ote_context_t *ctx, ote_cq_lane_t *const *lanes, uint32_t nlanes,
                                  const ote_grant_source_ops_t *src, ote_grant_mgr_t **mgr_out);
/* OTE_ERR_BUSY while grants live. OTE_ERR_RETAINED when a window (pooled, or retained
 * earlier) would not dealloc: it is kept, counted as OTE_RETAINED_MW in the manager's
 * context and in its stats, the manager stays valid, and a later destroy retries. A
 * window that a finished grant could not dealloc is retained the same way; the monitor's
 * ote_grant_mgr_tick() retries those too. */
ote_status_t ote_grant_mgr_destroy(ote_grant_mgr_t *m);
/* For the reopen of the manager's context (context.h, ote_context_reopen): with no grant
 * live, deallocate its pooled windows and retry the retained ones (they are of the old
 * PD; new grants allocate windows on the current one). OTE_ERR_BUSY while a grant lives;
 * OTE_ERR_RETAINED when a window would not go (kept, counted; a later call retries). */
ote_status_t ote_grant_mgr_drop_windows(ote_grant_mgr_t *m);
/* Fence the manager (its transport's teardown): new grants (requester and source) are
 * refused with @why, and the next ote_grant_mgr_tick() ends every live grant at once with
 * @why, as a context that is down does. */
void ote_grant_mgr_fence(ote_grant_mgr_t *m, ote_status_t why);
void ote_grant_mgr_get_stats(ote_grant_mgr_t *m, ote_grant_stats_t *out);

/**
 * ote_grant_start() - requester: take over d->qp's borrow, ask the source for the
 * grant through @ctl and, once answered, post the slices. On OTE_OK, d->done is called
 * exactly once later. On failure nothing was sent, the borrow is still the caller's, and
 * done is not called.
 */
ote_status_t ote_grant_start(ote_grant_mgr_t *m, const ote_grant_desc_t *d,
                             const ote_grant_ctl_t *ctl);
/* The source's answer to grant @grant_id: OTE_OK with the window's rkey, else refused.
 * A refusal with OTE_ERR_REMOTE_ACCESS (the source could not bind a window: its end of
 * the QP may be in ERR), OTE_ERR_REMOTE or OTE_ERR_PEER_LOST also retires the grant's QP
 * from its slot so that it is rebuilt. Unknown/late ids are ignored (counted) and return
 * OTE_ERR_NOT_FOUND: a late OTE_OK answer then names a window that nothing will use (its
 * grant ended before the answer, posting nothing), which the caller may release at the
 * source at once (ote_grant_source_release). Returns OTE_OK when a grant took it. */
ote_status_t ote_grant_on_answer(ote_grant_mgr_t *m, uint64_t grant_id, ote_status_t st,
                                 uint32_t rkey);
/* The same; with rebase, an OTE_OK answer also moves the grant's remote address to
 * @remote (its slices then address [remote, +len)): the source's window covers a copy of
 * the range there (a staged grant: engine/rdma/rdma_stage.c), not the range itself. The
 * length is the grant's own, so nothing outside the window is ever addressed. */
ote_status_t ote_grant_on_answer_at(ote_grant_mgr_t *m, uint64_t grant_id, ote_status_t st,
                                    uint32_t rkey, int rebase, uint64_t remote);

/**
 * ote_grant_serve() - source: serve a request from the requester connected to slot
 * @slot of @ep (whose QP the caller borrowed; the borrow is handed over on OTE_OK). The
 * range is checked first: OTE_ERR_ACCESS (or the pin's status) refuses before any window
 * exists. On OTE_OK the answer comes through ops->answer once the bind completes (or
 * fails: bind failure answers an error and retires the QP). @call (any value, NULL
 * included) is handed to ops->pin, which runs before this returns: the caller's
 * per-request state, so no pin needs a thread-local.
 */
ote_status_t ote_grant_serve(ote_grant_mgr_t *m, ote_endpoint_t *ep, uint32_t slot, ote_qp_t *qp,
                             ote_grant_op_t op, uint64_t addr, uint64_t len,
                             ote_deadline_t deadline, uint64_t answer_ctx, void *call);
/**
 * ote_grant_serve_exact() - source: as ote_grant_serve(), for memory a window cannot
 * cover (a dma-buf MR of device memory: the kernel refuses MW binds on it). ops->pin_exact
 * registers an MR of exactly the range in the PD of @qp (a private PD: see
 * engine/rdma/rdma_direct.c), and the grant is answered with its rkey at once (nothing to
 * bind). It ends as a window grant does: by the requester's receipt (a SEND_WITH_IMM of
 * the rkey on @qp, desc.receipt_imm), a release, the deadline (QP moved to ERR first) or
 * the requester's loss; then ops->unpin deregisters the MR. OTE_ERR_UNSUPPORTED when the
 * manager's ops have no pin_exact.
 */
ote_status_t ote_grant_serve_exact(ote_grant_mgr_t *m, ote_endpoint_t *ep, uint32_t slot,
                                   ote_qp_t *qp, ote_grant_op_t op, uint64_t addr, uint64_t len,
                                   ote_deadline_t deadline, uint64_t answer_ctx, void *call);
/* Source: the requester behind endpoint @ep is gone (its control connection died). End
 * every live source grant of @ep now, as its deadline would (the QP its window is bound
 * to is moved to ERR first, then window, pin and QP borrow are released), and answer a
 * grant still binding with OTE_ERR_PEER_LOST. Returns how many were ended. */
size_t ote_grant_source_end_endpoint(ote_grant_mgr_t *m, const ote_endpoint_t *ep);
/* Source: the requester asks for a new QP on @slot of @ep (CONNECT): its QP there is gone,
 * so the grants served on that slot's old QP can neither be used nor released by it. End
 * them now as ote_grant_source_end_endpoint() does, so that the slot's old QP is idle and
 * can be replaced at once rather than after their deadlines. Returns how many. */
size_t ote_grant_source_end_slot(ote_grant_mgr_t *m, const ote_endpoint_t *ep, uint32_t slot);
/* Source: as ote_grant_source_end_slot(), for the grants of @slot served on the QP
 * numbered @qp_num only (a QP the slot no longer has: a grant served there after the
 * CONNECT's end_slot ran; a borrow the caller holds keeps the slot on that QP, so the
 * number names it among the slot's grants). @qp_num 0 names no QP: nothing is ended.
 * Returns how many. */
size_t ote_grant_source_end_slot_qp(ote_grant_mgr_t *m, const ote_endpoint_t *ep, uint32_t slot,
                                    uint32_t qp_num);
/* Source: how many source grants of @ep are live (not yet ended). */
size_t ote_grant_source_live_endpoint(ote_grant_mgr_t *m, const ote_endpoint_t *ep);
/* Source: the requester of a bound grant abandoned it (it failed there after every WR it
 * posted under the window was discharged, or its answer came too late to be used): end
 * the grant of @ep on slot @slot whose window has @rkey on the source QP @qp_num now.
 * The window is deallocated (which invalidates it whether or not it is still bound), the
 * pin released and the QP borrow given back as it is (other grants may share the QP).
 * OTE_ERR_NOT_FOUND, changing nothing, when no bound grant matches all four (already
 * ended by its receipt or deadline, or never ours): the caller ignores it. */
ote_status_t ote_grant_source_release(ote_grant_mgr_t *m, const ote_endpoint_t *ep, uint32_t slot,
                                      uint32_t qp_num, uint32_t rkey);
/* Source: a receive CQE on QP qp_num (call from the QP's on_recv): IBV_WC_WITH_INV ends
 * the window grant of that rkey; IBV_WC_WITH_IMM (immediate htonl(rkey)) ends the
 * exact-MR grant of that rkey; anything else is not a receipt. */
void ote_grant_source_receipt(ote_grant_mgr_t *m, uint32_t qp_num, const struct ibv_wc *wc);

/**
 * ote_grant_mgr_tick() - periodic work (the transport's monitor, every few ms): retry
 * grants waiting for SQ room, fail requester grants past their deadline (their QP is
 * cancelled and its slot retired), and release source grants whose requester never
 * invalidated them by their deadline (QP moved to ERR first, so the window is dead).
 * While the manager's context is down (ote_context_check() fails: port down, device
 * fatal) or the manager is fenced, every live grant ends the same way at once, with that
 * status. A requester grant whose ote_grant_start() is still in ctl->request is left to
 * the next tick (its start may yet fail, and then it never was).
 * Returns the number of grants still live.
 */
size_t ote_grant_mgr_tick(ote_grant_mgr_t *m);

#ifdef __cplusplus
}
#endif
#endif

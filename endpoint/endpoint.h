/*
 * endpoint/endpoint.h - the endpoint store: peers, their fixed-width QP arrays and the
 * construction slots of those arrays.
 *
 * A store belongs to one context and borrows that context's CQ lanes (lane i carries
 * slot i of every array). It owns every endpoint it ever inserted and every QP built in
 * their slots; upper layers borrow a slot's connected QP and give it back.
 *
 * Key: an endpoint is named by (the store's context, remote process id, remote PD id,
 * NIC path = local NIC id + remote NIC id, role requester/source, capability READ/WRITE).
 * Opposite roles and capabilities never share an endpoint, so they never wait on one
 * another. ote_endpoint_get() gives every caller the same endpoint for the same key,
 * even before any QP exists.
 *
 * Width: each endpoint has min(local lanes, remote lanes) slots, fixed at insertion. A
 * later lookup that announces a different remote width is malformed (OTE_ERR_PROTOCOL)
 * and changes nothing.
 *
 * Slots (one per lane): EMPTY -> BUILDING (one builder, identified by a unique
 * construction token) -> READY (connected QP, borrowable) -> RETIRING (broken or
 * replaced; no new borrows) -> EMPTY once native destruction succeeds. The builder holds
 * no store/endpoint lock while it creates, exchanges and connects; others that want the
 * slot wait on it with their own deadline and cannot cancel the builder. The builder
 * attaches its QP to the slot before connecting, so a created QP occupies the slot until
 * its native destroy succeeds: a failed construction destroys it and frees the slot; a
 * destroy that fails keeps the QP in the slot (RETIRING, counted as retained by the qp
 * layer) until ote_endpoint_store_reclaim() succeeds. Cancelling an unbuilt claim frees
 * the slot at once; a stale claim (wrong token) can never release a newer one.
 *
 * Thread-safe. Nothing here is called from completion callbacks except
 * ote_endpoint_return() and ote_endpoint_retire(), which never block.
 */
#ifndef OTE_ENDPOINT_ENDPOINT_H
#define OTE_ENDPOINT_ENDPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "base/time.h"
#include "context/context.h"
#include "cq/lane.h"
#include "qp/qp.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ote_endpoint_store ote_endpoint_store_t;
typedef struct ote_endpoint ote_endpoint_t;

typedef enum { OTE_EP_REQUESTER = 0, OTE_EP_SOURCE = 1 } ote_ep_role_t;
typedef enum { OTE_EP_READ = 0, OTE_EP_WRITE = 1 } ote_ep_cap_t;
/* Upper layers may name more capabilities (key.cap, e.g. engine/rdma's direct READ 2 and
 * WRITE 3); per-capability QP flags exist for caps below this. */
#define OTE_EP_MAX_CAPS 4

/* Build keys with ote_ep_key_make() so padding is zero (keys are compared bytewise). */
typedef struct ote_ep_key {
    uint64_t remote_process;
    uint64_t remote_pd;
    uint32_t local_nic;
    uint32_t remote_nic;
    uint32_t role; /* ote_ep_role_t */
    uint32_t cap;  /* ote_ep_cap_t */
} ote_ep_key_t;

void ote_ep_key_make(ote_ep_key_t *key, uint64_t remote_process, uint64_t remote_pd,
                     uint32_t local_nic, uint32_t remote_nic, ote_ep_role_t role, ote_ep_cap_t cap);

/* A construction reservation: unique token, never reused within a store. */
typedef struct ote_ep_claim {
    ote_endpoint_t *ep;
    uint32_t slot;
    uint64_t token; /* 0: no claim */
} ote_ep_claim_t;

/* The bilateral exchange of a construction: give @local to the peer, learn its path.
 * For the requester this is a control-plane round trip; for the source, which already
 * knows the requester's path, it just copies it. Runs without endpoint locks. */
typedef ote_status_t (*ote_ep_exchange_fn)(void *arg, uint32_t slot, const ote_qp_path_t *local,
                                           ote_qp_path_t *peer_out, ote_deadline_t deadline);

typedef struct ote_endpoint_stats {
    uint64_t built, build_failures, destroyed, retired, retained_now, waits;
    uint64_t endpoints; /* endpoints the store holds now (evicted ones not yet freed too) */
    uint64_t evicted;   /* evicted endpoints freed so far */
    uint64_t qps;       /* QPs the store's slots hold now (created, not yet destroyed) */
    uint64_t pds_live;  /* private PDs (ote_endpoint_store_private_pd) not yet deallocated */
} ote_endpoint_stats_t;

/**
 * ote_endpoint_store_create() - a store on @ctx whose slot i uses lanes[i].
 * @qp_cfg is the template of every QP it builds (copied). The lanes must outlive it.
 */
ote_status_t ote_endpoint_store_create(ote_context_t *ctx, ote_cq_lane_t *const *lanes,
                                       uint32_t nlanes, const ote_qp_config_t *qp_cfg,
                                       ote_endpoint_store_t **store_out);
/**
 * ote_endpoint_store_private_pd() - from now on every QP this store builds is created in
 * a protection domain of its own (allocated before the QP, deallocated after its native
 * destroy): a remote peer connected to that QP reaches only the MRs registered in that PD
 * (ote_qp_pd), never the context's. Call before the store builds anything. A PD whose
 * dealloc fails keeps its slot RETIRING (counted as OTE_RETAINED_PD in the context and in
 * retained_now) until a later reclaim or destroy deallocates it. pds_live counts them.
 */
void ote_endpoint_store_private_pd(ote_endpoint_store_t *store);
/* From now on, the QP this store builds in slot i takes its receives from srqs[i], a
 * shared receive queue of lane i (qp/srq.h; copied array, the SRQs must outlive the
 * store's QPs). The template must have no receive slots of its own (OTE_ERR_INVALID). */
struct ote_srq;
ote_status_t ote_endpoint_store_srqs(ote_endpoint_store_t *store, struct ote_srq *const *srqs);
/* From now on, the QPs this store builds for endpoints of @role and @cap are created with
 * these OTE_VERBS_QP_* flags added to the template's (e.g. OTE_VERBS_QP_NO_SCATTER_TO_CQE
 * for the requester's READ QPs when READs may land in device memory). Call before the
 * store builds anything. */
void ote_endpoint_store_qp_flags(ote_endpoint_store_t *store, ote_ep_role_t role, uint32_t cap,
                                 uint32_t flags);
/**
 * ote_endpoint_store_destroy() - destroy every QP (flush bounded by @deadline) and free
 * the store. OTE_ERR_BUSY while a slot is borrowed or being built; OTE_ERR_RETAINED when
 * a native destroy failed (the store stays valid with the retained QPs; call again).
 */
ote_status_t ote_endpoint_store_destroy(ote_endpoint_store_t *store, ote_deadline_t deadline);
/* Destroy QPs of RETIRING slots that nobody borrows any more. @remaining_out (optional):
 * slots still RETIRING afterwards (borrowed, or destroy failed). */
ote_status_t ote_endpoint_store_reclaim(ote_endpoint_store_t *store, ote_deadline_t deadline,
                                        size_t *remaining_out);
/**
 * ote_endpoint_store_fence() - the QPs built on what failed under them: every slot's QP
 * on @lane (NULL: any lane) built on a route generation below @below_gen (0: any;
 * ote_qp_route_generation), READY or already RETIRING, is retired (no new borrow) and
 * fenced with @cause (ote_qp_fence: its WRs flush and end with @cause, never as a peer's
 * loss), or with @abandon also natively destroyed at once (ote_qp_abandon: for a lane
 * whose CQs cannot be trusted to deliver the flush), borrowed or not. The QPs leave
 * their slots through ote_endpoint_store_reclaim() once nobody borrows them; the slots
 * are then built anew. @fenced_out (optional): how many were fenced. The first failure
 * is returned (a QP retained by a failed native destroy stays RETIRING). Never from a
 * completion callback.
 */
ote_status_t ote_endpoint_store_fence(ote_endpoint_store_t *store, const ote_cq_lane_t *lane,
                                      uint64_t below_gen, ote_status_t cause, int abandon,
                                      ote_deadline_t deadline, size_t *fenced_out);
ote_context_t *ote_endpoint_store_context(const ote_endpoint_store_t *store);
uint32_t ote_endpoint_store_lanes(const ote_endpoint_store_t *store);
void ote_endpoint_store_stats(ote_endpoint_store_t *store, ote_endpoint_stats_t *out);

/**
 * ote_endpoint_get() - the endpoint for @key, inserted with width
 * min(store lanes, @remote_lanes) when new. OTE_ERR_PROTOCOL when @remote_lanes is 0 or
 * disagrees with the width already negotiated for this key.
 */
ote_status_t ote_endpoint_get(ote_endpoint_store_t *store, const ote_ep_key_t *key,
                              uint32_t remote_lanes, ote_endpoint_t **ep_out);
uint32_t ote_endpoint_width(const ote_endpoint_t *ep);
const ote_ep_key_t *ote_endpoint_key(const ote_endpoint_t *ep);

/**
 * ote_endpoint_reserve() - take slot @slot: OTE_OK with *qp_out set (the slot's QP,
 * borrowed: give it back with ote_endpoint_return()) when it is READY, or with
 * *qp_out NULL and @claim filled when the slot was EMPTY: the caller is its builder and
 * must call ote_endpoint_build() or ote_endpoint_cancel(). Waits (OTE_ERR_TIMEOUT at
 * @deadline) while another builder holds the slot or a retiring QP still occupies it.
 */
ote_status_t ote_endpoint_reserve(ote_endpoint_t *ep, uint32_t slot, ote_deadline_t deadline,
                                  ote_qp_t **qp_out, ote_ep_claim_t *claim);
/**
 * ote_endpoint_build() - create the slot's QP on its lane, attach it to the slot,
 * exchange paths, connect and publish it. On success the QP is returned borrowed. On
 * failure the QP is destroyed and the slot is EMPTY again (usable by the next
 * reserve); when that destroy fails the QP stays in the slot (RETIRING). The claim is
 * consumed either way.
 */
ote_status_t ote_endpoint_build(ote_ep_claim_t *claim, ote_ep_exchange_fn exchange, void *arg,
                                ote_deadline_t deadline, ote_qp_t **qp_out);
/* Release an unbuilt claim. OTE_ERR_STATE for a stale token (nothing changes). */
ote_status_t ote_endpoint_cancel(ote_ep_claim_t *claim);
/* reserve + build in one call. */
ote_status_t ote_endpoint_borrow(ote_endpoint_t *ep, uint32_t slot, ote_ep_exchange_fn exchange,
                                 void *arg, ote_deadline_t deadline, ote_qp_t **qp_out);
/* Borrow the slot's QP only if it is READY and connected to the peer QP number
 * @remote_qpn (0: any). OTE_ERR_NOT_FOUND otherwise. Never waits. */
ote_status_t ote_endpoint_borrow_ready(ote_endpoint_t *ep, uint32_t slot, uint32_t remote_qpn,
                                       ote_qp_t **qp_out);
/* Give back a borrowed QP. */
void ote_endpoint_return(ote_endpoint_t *ep, uint32_t slot, ote_qp_t *qp);
/* Mark @qp (if still the slot's QP) broken: no new borrows; it is destroyed by reclaim
 * once nobody borrows it. Never blocks. */
void ote_endpoint_retire(ote_endpoint_t *ep, uint32_t slot, const ote_qp_t *qp);
/* The peer QP number the slot's READY QP is connected to (0 when not READY). */
uint32_t ote_endpoint_remote_qpn(ote_endpoint_t *ep, uint32_t slot);
/* The least-borrowed READY slot, or an EMPTY one when some slot is EMPTY (ties rotate). */
uint32_t ote_endpoint_pick_slot(ote_endpoint_t *ep);
/* Number of READY slots; number of borrows outstanding on a slot. */
uint32_t ote_endpoint_ready_count(ote_endpoint_t *ep);
uint32_t ote_endpoint_users(ote_endpoint_t *ep, uint32_t slot);

/**
 * ote_endpoint_evict() - the peer of @ep is gone (its process died or restarted): take
 * the endpoint out of the store's table (a later ote_endpoint_get() of its key inserts a
 * new one) and retire every READY slot. Its QPs are destroyed by
 * ote_endpoint_store_reclaim() once nobody borrows them (a failed native destroy keeps
 * the QP in its slot, retained, and is tried again by the next reclaim), and the
 * endpoint itself is freed by the reclaim that finds every slot EMPTY and nobody
 * borrowing, building or waiting in ote_endpoint_reserve() (which fails with
 * OTE_ERR_PEER_LOST for an EMPTY slot of an evicted endpoint: nothing is built for it).
 * The caller must hold no other use of @ep than borrows it will return. Never blocks.
 */
ote_status_t ote_endpoint_evict(ote_endpoint_t *ep);

#ifdef __cplusplus
}
#endif
#endif

/*
 * qp/qp.h - one physical RC QP: its connection, send queue and receive queue.
 *
 * A QP borrows a CQ lane (its send CQ for the SQ, its receive CQ for the RQ) and, through
 * it, the lane's context; both must outlive it. Any number of upper-layer records may
 * post on one QP: each owns the WR ids it posts (see OTE_CQ_WR_ID in cq/lane.h) and gets
 * their completions through its lane namespace.
 *
 * Send queue. Every WR is signaled. At most max_send_wr WRs are outstanding; each
 * accepted WR id is owned by the SQ until its CQE (or a flush CQE) discharges it exactly
 * once, and only then is it forwarded to its record. A post that the provider accepts
 * only in part is resolved from bad_wr: the WRs before it are owned by the SQ, the rest
 * are returned to the caller untouched. A post whose outcome is unknown keeps the whole
 * chain as debt and fences the SQ: no new admission on this QP, ever (replace it). WRs
 * carry a deadline; ote_qp_expire() reports the ones past it and fences the SQ, but
 * keeps them owned (the NIC could still write their buffers) until a CQE, a flush, or
 * the QP's destruction resolves them.
 *
 * Receive queue. The QP owns recv_slots buffers of recv_size bytes, registered with a
 * QP-owned MR. Each posted slot is a receive credit and stays charged until its CQE;
 * a successful receive is handed to the on_recv callback (the buffer is valid during
 * the call only) and the slot is posted again. Flushed slots are not reposted.
 *
 * Connection: create leaves the QP in INIT; ote_qp_connect() posts the receive slots
 * and moves it INIT -> RTR -> RTS from the peer's path. A failed RTR leaves it in INIT;
 * a failed RTS resets it to INIT: connect can be retried either way.
 *
 * Port down / fatal events on the QP's context, and fatal events of the QP itself,
 * fence it and move it to ERR, so in-flight WRs end with error CQEs instead of hanging.
 *
 * Teardown: ote_qp_destroy() fences, moves the QP to ERR, waits for the flush until its
 * deadline, then destroys the QP. WRs still owed after a successful native destroy can
 * never complete: each gets one synthesized IBV_WC_WR_FLUSH_ERR completion with
 * vendor_err OTE_QP_VENDOR_ERR_DESTROYED. When a native destroy (QP or RQ MR) fails,
 * the QP keeps its native objects, buffers and charges, is counted as retained in its
 * context and OTE_ERR_RETAINED is returned; call ote_qp_destroy() again later.
 *
 * Thread-safe. Completion callbacks may post on the QP, but must not call
 * ote_qp_wait_idle() or ote_qp_destroy() (both drive the lane that runs them).
 */
#ifndef OTE_QP_QP_H
#define OTE_QP_QP_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "base/time.h"
#include "cq/lane.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ote_qp ote_qp_t;

/* vendor_err of the completions synthesized for WRs resolved by destruction. */
#define OTE_QP_VENDOR_ERR_DESTROYED 0x07e0de57u

/* One end of a connection, as the peer learns it (its descriptor). */
typedef struct ote_qp_path {
    union ibv_gid gid;
    uint16_t lid;
    uint32_t qp_num;
    uint32_t psn;     /* initial send PSN of that end (24 bits) */
    enum ibv_mtu mtu; /* active MTU of that end's port, clamped by its max_path_mtu */
    /* RDMA READs that end accepts in flight as a responder (its max_dest_rd_atomic);
     * 0: unknown (the local depth is used). A requester never keeps more outstanding. */
    uint8_t rd_atom;
} ote_qp_path_t;

/* A successful receive: buf holds wc->byte_len bytes, valid during the call only. */
typedef void (*ote_qp_recv_fn)(void *arg, ote_qp_t *qp, const struct ibv_wc *wc, const void *buf);

typedef struct ote_qp_config {
    uint32_t max_send_wr; /* SQ depth */
    uint32_t max_send_sge;
    uint32_t max_inline;
    uint32_t recv_slots; /* QP-owned receive buffers (0: none) */
    uint32_t recv_size;  /* bytes per receive buffer */
    int access;          /* qp_access_flags: IBV_ACCESS_REMOTE_{READ,WRITE,ATOMIC} */
    uint8_t timeout;     /* ACK timeout exponent (4.096 us << timeout) */
    uint8_t retry_cnt;
    uint8_t rnr_retry;
    uint8_t min_rnr_timer;
    /* Both initiator and responder depth, at most the device's (max_qp_init_rd_atom,
     * max_qp_rd_atom: ote_context_limits_t) and, as initiator, the peer's rd_atom: the QP
     * uses the smaller. */
    uint8_t max_rd_atomic;
    /* The address vector of every connect: the GRH traffic class (on RoCE v2 the IP
     * header's DSCP << 2 | ECN, what a lossless fabric classifies on) and the service
     * level (0..15; on RoCE the priority the NIC maps to a VLAN PCP; a larger one fails
     * create). */
    uint8_t traffic_class;
    uint8_t service_level;
    /* Largest path MTU (IBV_MTU_256..IBV_MTU_4096; 0: none). The QP tells its peer
     * min(port's active MTU, this) and connects with the smaller of that and the peer's. */
    enum ibv_mtu max_path_mtu;
    /* OTE_VERBS_QP_* create flags (verbs.h), e.g. OTE_VERBS_QP_NO_SCATTER_TO_CQE for a QP
     * that may READ into device memory; 0: none. A flag the provider refuses fails create. */
    uint32_t create_flags;
    ote_qp_recv_fn on_recv;
    void *recv_arg;
    /* The protection domain of the QP and of its receive MR; NULL: the context's. A QP
     * in a private PD reaches, as a target, only the MRs and windows of that PD (the
     * GPUDirect source grant of engine/rdma/rdma_direct.c). The PD must outlive the QP. */
    struct ibv_pd *pd;
    /* Send credits shared with other QPs (ote_sq_pool_t, sq_pool.c); NULL: none. */
    struct ote_sq_pool *sq_pool;
    /* Receives from this shared receive queue (qp/srq.h) of the same lane instead of
     * receive slots of its own (recv_slots must be 0): receive completions are handed to
     * on_recv by QP number, and ote_qp_rq_admit/unadmit/ote_qp_recv_credits act on the
     * SRQ. NULL: none. The SRQ must outlive the QP. */
    struct ote_srq *srq;
} ote_qp_config_t;

/*
 * Send credits shared by many QPs (one engine's, every context): at most @limit send WRs
 * outstanding over all the QPs whose config names the pool. A post takes one credit per
 * WR before it is entered (with too few for its chain, a prefix of the chain is posted
 * as far as credits go and the post says OTE_ERR_AGAIN with result.accepted/unposted, as
 * for a partial post; with none, OTE_ERR_AGAIN and nothing posted); the WR's CQE (flush
 * included), its return unposted, or the QP's destruction gives the credit back. The
 * pool must outlive every QP that names it. Any thread.
 */
typedef struct ote_sq_pool ote_sq_pool_t;
typedef struct {
    uint64_t in_use, peak; /* credits held now; the most held at once */
    uint64_t waits;        /* posts refused (in part or whole) for want of credits */
} ote_sq_pool_stats_t;
ote_status_t ote_sq_pool_create(uint32_t limit, ote_sq_pool_t **pool_out);
void ote_sq_pool_destroy(ote_sq_pool_t *pool);
void ote_sq_pool_get_stats(ote_sq_pool_t *pool, ote_sq_pool_stats_t *out);

/* What ote_qp_post_send() did. Written on every return, failures included: a partial
 * post is a result the caller must act on, not only an error. */
typedef struct ote_qp_post_result {
    size_t accepted;              /* WRs now owned by the SQ */
    struct ibv_send_wr *unposted; /* first WR returned to the caller (NULL: none) */
} ote_qp_post_result_t;

typedef struct ote_qp_stats {
    uint32_t qp_num;
    enum ibv_qp_state state; /* as last set or learned (ERR after an error CQE) */
    int fenced;
    int retained;
    uint32_t sq_outstanding, sq_capacity;
    uint32_t rq_posted, rq_slots;
    uint64_t send_completions, send_errors, recv_completions, recv_errors;
    uint64_t unknown_cqes;        /* CQEs naming no outstanding WR: never forwarded */
    uint64_t expired;             /* WRs reported past their deadline */
    uint64_t resolved_by_destroy; /* WRs ended by the QP's destruction */
} ote_qp_stats_t;

/* Defaults: 128 send WRs, 1 SGE, no inline, no receive slots, REMOTE_READ|WRITE, timeout
 * 14, retry 7, rnr_retry 7, min_rnr_timer 12, max_rd_atomic 16, the context's PD. */
void ote_qp_config_default(ote_qp_config_t *cfg);

/* Create the QP on @lane (its context must be active) and move it to INIT. */
ote_status_t ote_qp_create(ote_cq_lane_t *lane, const ote_qp_config_t *cfg, ote_qp_t **qp_out);
/* This end's path, to give to the peer. */
void ote_qp_local_path(const ote_qp_t *qp, ote_qp_path_t *path_out);
/* INIT -> RTR -> RTS toward @peer. */
ote_status_t ote_qp_connect(ote_qp_t *qp, const ote_qp_path_t *peer);

/**
 * ote_qp_post_send() - post a chain of WRs (wr_ids unique among outstanding ones).
 * Admission is all or nothing: OTE_ERR_AGAIN when the SQ or the lane's send CQ lacks
 * room for the whole chain (a shared credit pool, ote_sq_pool_t, may admit a prefix), OTE_ERR_FENCED after an unknown outcome or an expired WR,
 * OTE_ERR_PORT_DOWN on a paused context, OTE_ERR_STATE unless connected. A provider
 * failure returns its status with @result telling which WRs the SQ now owns.
 */
ote_status_t ote_qp_post_send(ote_qp_t *qp, struct ibv_send_wr *wrs, ote_deadline_t deadline,
                              ote_qp_post_result_t *result);

/* Report up to @cap outstanding WR ids past their deadline (each once) into @ids; if any,
 * the SQ is fenced. Returns how many were written. */
size_t ote_qp_expire(ote_qp_t *qp, uint64_t *ids, size_t cap);

/* Fence admission and move the QP to ERR: every outstanding WR flushes. */
ote_status_t ote_qp_cancel(ote_qp_t *qp);
/* As cancel, recording why: a device-scope cause (OTE_ERR_FENCED with an errno: the
 * QP's CQ lane failed, its route changed) that posts refused from now on answer and that
 * ote_qp_fence_cause() reports, so that the owner of its WRs ends them with this cause
 * rather than as a peer's loss. The first cause stays. */
ote_status_t ote_qp_fence(ote_qp_t *qp, ote_status_t cause);
ote_status_t ote_qp_fence_cause(const ote_qp_t *qp);
/**
 * ote_qp_abandon() - fence with @cause, then do the native half of ote_qp_destroy() now,
 * while the QP may still be borrowed: ERR, a flush wait bounded by @deadline (none on a
 * faulted lane that gives nothing), native destroy, and one synthesized flush completion
 * (vendor_err OTE_QP_VENDOR_ERR_DESTROYED) for each WR still owed, delivered to its
 * record. For a QP whose CQs can no longer be trusted (its lane faulted). The ote_qp_t
 * stays until ote_qp_destroy(), which then only detaches it. A failed native destroy:
 * OTE_ERR_RETAINED (counted, as for destroy). Not from a completion callback.
 */
ote_status_t ote_qp_abandon(ote_qp_t *qp, ote_status_t cause, ote_deadline_t deadline);
/* The context's route generation (ote_context_info_t) when the QP was created: the route
 * its path was learned from. */
uint64_t ote_qp_route_generation(const ote_qp_t *qp);

/* Drive the lane until the SQ has nothing outstanding (OTE_ERR_TIMEOUT otherwise). */
ote_status_t ote_qp_wait_idle(ote_qp_t *qp, ote_deadline_t deadline);

/* See the header comment. The deadline bounds the wait for flush CQEs. */
ote_status_t ote_qp_destroy(ote_qp_t *qp, ote_deadline_t deadline);

uint32_t ote_qp_num(const ote_qp_t *qp);
ote_cq_lane_t *ote_qp_lane(const ote_qp_t *qp);
/* The PD the QP was created in (its config's, else its context's). */
struct ibv_pd *ote_qp_pd(const ote_qp_t *qp);
/* The device context the QP lives in. */
ote_context_t *ote_qp_context(const ote_qp_t *qp);
/* The native QP, for verbs that take one (e.g. memory window binds). */
struct ibv_qp *ote_qp_native(const ote_qp_t *qp);
/* Receive credits: slots posted and not yet consumed (its SRQ's, on an SRQ). */
uint32_t ote_qp_recv_credits(const ote_qp_t *qp);
/* Receive admission: a peer's message to come (a grant receipt) reserves one posted
 * receive slot before the peer may send it, so it never meets an empty receive queue
 * (no RNR). OTE_ERR_AGAIN when every posted slot is already reserved (admitted <
 * posted slots is kept; a consumed slot counts again once reposted); fault point
 * "qp.rq_admit". Unadmit gives the reservation back once its message was consumed or
 * will never come. Any thread. */
ote_status_t ote_qp_rq_admit(ote_qp_t *qp);
void ote_qp_rq_unadmit(ote_qp_t *qp);
/* On an SRQ QP (cfg.srq) admission reserves a slot of the SRQ (OTE_ERR_AGAIN also
 * while the QP is not connected) and the QP counts what it holds: unadmit gives back only
 * those, and its destruction gives back the rest. */
/* Reservations held now (by this QP, on an SRQ). */
uint32_t ote_qp_rq_admitted(const ote_qp_t *qp);
void ote_qp_get_stats(const ote_qp_t *qp, ote_qp_stats_t *stats_out);

#ifdef __cplusplus
}
#endif
#endif

/*
 * engine/rdma/rdma_src_parents.h - the source side of whole-parent credit reservation.
 * Private to engine/rdma/ (never in a public hdrs).
 *
 * A requester with rdma_max_grants names, in each GRANT_REQ to a source that advertised
 * rdma_parent=1, the parent (request) the grant belongs to and the budget that parent
 * reserved at the requester (proto.h, the parent trailer). The first GRANT_REQ of a parent
 * on a control connection reserves, all of it or nothing, before any window, pin or QP
 * authority of the grant exists:
 *   - grant credits: the parent's budget from the source's engine-wide pool
 *     (rdma_max_served_grants; a budget above the whole pool takes the whole pool; 0: no
 *     pool, the credits are only counted);
 *   - receive credits: one receive slot of the grant's QP for every receipt the parent
 *     may have outstanding (its budget, at most the QP's rdma_recv_slots: a larger parent
 *     spreads over several QPs, and its grants past them are admitted per grant).
 * Either failing answers OTE_ERR_AGAIN, exactly as a per-grant refusal (the requester
 * asks again after a pause, until its deadline); the grant credits are given back first.
 *
 * Each grant of the parent takes one slot of the reservation: its receive slot is handed
 * to the grant layer (which admits it again at once: one server thread serves every grant
 * of a source QP, so nothing else takes it in between), and comes back to the parent when
 * the grant ends. A grant on another QP of the same parent (another slot, device or a
 * rebuilt QP) moves a free slot of the parent there; with none free (its last grant's
 * receipt not handled yet) it is admitted per grant, as without a trailer. With a pool, a
 * parent never has more grants live than its credits (else AGAIN). The reservation holds a
 * borrow of each QP it has slots on.
 *
 * A parent's reservation is returned when the account of the request of its latest
 * grant ends (every byte of that request asked for and its grants ended, or written off:
 * rdma_accounts.c; a run asked again after an AGAIN is a request of its own, with the
 * same parent; a grant of a parent already returned makes a new reservation), when the
 * control connection ends (requester lost), on EP_RESET of an endpoint it has slots on,
 * when it has no live grant and saw no GRANT_REQ for transfer_timeout_ms + 1 s (swept by
 * the next parent's first grant), and at teardown. Grants still live then keep their own
 * slot until they end. A GRANT_REQ without a trailer is served per grant.
 *
 * Locks: a mutex of its own, a leaf but for the QPs' own (ote_qp_rq_admit); endpoint
 * borrows are taken and returned with it released.
 */
#ifndef OTE_ENGINE_RDMA_RDMA_SRC_PARENTS_H
#define OTE_ENGINE_RDMA_RDMA_SRC_PARENTS_H

#include <stdint.h>

#include "base/status.h"
#include "engine/rdma/rdma_internal.h"

typedef struct sparent sparent_t;

/* The slot of its parent's reservation that a grant holds (sp NULL: none). */
typedef struct {
    sparent_t *sp;
    int qi; /* the QP entry whose receive slot the grant took; -1: admitted per grant */
} sp_slot_t;

ote_status_t ote__rdma_sp_create(rdma_tp_t *tp);
void ote__rdma_sp_destroy(rdma_tp_t *tp);

/* A GRANT_REQ on c whose QP qp (slot of ep) is borrowed and checked: with a parent
 * trailer, its parent's reservation (made now on its first grant) and one slot of it in
 * *out; without one, *out is empty. OTE_ERR_AGAIN: no reservation or slot now (nothing
 * held); OTE_ERR_TOO_BIG: a budget this source never reserves (past
 * rdma_max_served_grants); OTE_ERR_INVALID: a budget that contradicts the parent's first. Server
 * thread of c; no lock held. */
ote_status_t ote__rdma_sp_take(conn_t *c, const ote_rp_msg_t *rq, ote_endpoint_t *ep, ote_qp_t *qp,
                               sp_slot_t *out);
/* The grant that took *s ended or was never served, after the grant layer gave back its
 * own receive admission: the slot returns to its parent. No-op for an empty one. */
void ote__rdma_sp_put(rdma_tp_t *tp, sp_slot_t *s);

/* Reservations returned: of the request uid of c; of every parent of c (NULL: all); of
 * every parent with slots on ep. No lock held. */
void ote__rdma_sp_end_req(rdma_tp_t *tp, const conn_t *c, uint64_t uid);
void ote__rdma_sp_end_conn(rdma_tp_t *tp, const conn_t *c);
void ote__rdma_sp_end_ep(rdma_tp_t *tp, const ote_endpoint_t *ep);

/* Counters for the test hooks. */
typedef struct {
    uint64_t parents;               /* parents holding a reservation now */
    uint64_t credits, credits_peak; /* grant credits they reserved: now, the most at once */
    uint64_t rq, rq_peak;           /* receive slots they reserved: now, the most at once */
    uint64_t refused;               /* first grants refused (no whole reservation) */
    uint64_t rq_refused;            /* of them, for want of receive slots */
    uint64_t busy;                  /* grants refused AGAIN: their parent's credits all live */
    uint64_t served;                /* grants served on a slot of their parent */
    uint64_t per_grant;             /* grants of a parent admitted per grant (no slot free) */
    uint64_t bad;                   /* trailers refused (another budget than the parent's) */
    uint64_t ended;                 /* reservations returned */
} rdma_sp_stats_t;
void ote__rdma_sp_stats(rdma_tp_t *tp, rdma_sp_stats_t *out);

#endif

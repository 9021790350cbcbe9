/*
 * engine/rdma/rdma_srq.c - the shared receive queues of a data device: one per CQ lane
 * (qp/srq.h), from which every QP of the device's endpoint store takes its receives.
 *
 * A source QP receives only grant receipts (SEND_WITH_INV, 64 bytes at most), and a
 * requester QP nothing at all; with a receive queue of its own, each QP posted
 * rdma_recv_slots buffers against its lane's receive CQ, so the CQ size divided by the
 * slots bounded the QPs of a lane (16 at defaults): a hidden ceiling of peers per NIC.
 * With an SRQ per lane, QPs cost no receive buffers, and receive credits stay exact per
 * SRQ (a receipt is admitted only with a posted slot reserved for it, ote_qp_rq_admit).
 *
 * rdma_srq_slots sets each SRQ's depth (0, the default: half of the lane's receive CQ,
 * leaving the other half to the direct endpoints' QPs, which live in PDs of their own
 * and so keep receive queues of their own); it is clamped to the device's max_srq_wr and
 * to the receive CQ with an INFO line. A device without SRQs (max_srq 0) keeps per-QP
 * receive queues, with one INFO line naming what bounds its peers then.
 */
#include "base/log.h"
#include "context/context.h"
#include "endpoint/endpoint.h"
#include "engine/engine_internal.h"
#include "engine/rdma/rdma_internal.h"
#include "qp/srq.h"

#define RECEIPT_SIZE 64u

/* The depth of n's SRQs (0: n keeps per-QP receive queues). */
static uint32_t srq_depth(rdma_tp_t *tp, rdma_nic_t *n, const ote_context_limits_t *l,
                          const char *dev) {
    if (l->max_srq == 0 || l->max_srq_wr == 0) {
        OTE_INFO("rdma",
                 "device %s has no shared receive queues: each QP posts its own %u receive "
                 "slots (rdma_recv_slots), so a lane's receive CQ of %u holds %u QPs",
                 dev, n->recv_slots, n->cq_depth,
                 n->cq_depth / (n->recv_slots ? n->recv_slots : 1));
        return 0;
    }
    uint32_t want = tp->cfg.rdma_srq_slots != 0 ? tp->cfg.rdma_srq_slots : n->cq_depth / 2;
    uint32_t d = want;
    if (d > l->max_srq_wr) d = l->max_srq_wr;
    if (d > n->cq_depth) d = n->cq_depth;
    if (d != want)
        OTE_INFO("rdma", "device %s: rdma_srq_slots=%u is above the device's %s=%u: using %u", dev,
                 want, want > l->max_srq_wr ? "max_srq_wr" : "receive CQ depth",
                 want > l->max_srq_wr ? l->max_srq_wr : n->cq_depth, d);
    return d;
}

ote_status_t ote__rdma_srqs_start(rdma_tp_t *tp, rdma_nic_t *n) {
    ote_context_info_t info;
    ote_context_get_info(n->ctx, &info);
    uint32_t depth = srq_depth(tp, n, &info.limits, info.name);
    if (depth == 0) return OTE_OK;
    for (uint32_t i = 0; i < n->nlanes; i++) {
        ote_srq_config_t sc;
        ote_srq_config_default(&sc);
        sc.slots = depth;
        sc.size = RECEIPT_SIZE;
        sc.low_water = depth / 8;
        ote_status_t st = ote_srq_create(n->lanes[i], &sc, &n->srq[i]);
        if (st != OTE_OK) {
            n->srq[i] = NULL;
            OTE_ERROR("rdma", "device %s: shared receive queue of lane %u (%u slots): %s",
                      info.name, i, depth, ote_status_str(st));
            return st;
        }
    }
    n->srq_slots = depth;
    return OTE_OK;
}

size_t ote__rdma_srqs_drop(rdma_nic_t *n, uint32_t dev) {
    size_t left = 0;
    for (uint32_t i = 0; i < OTE__RDMA_MAX_LANES; i++) {
        if (n->srq[i] == NULL) continue;
        ote_status_t st = ote_srq_destroy(n->srq[i]);
        if (st == OTE_OK) {
            n->srq[i] = NULL;
        } else {
            left++;
            OTE_ERROR("rdma",
                      "device %u: shared receive queue of lane %u retained at shutdown "
                      "(%s): its lane's CQs and the PD stay",
                      dev, i, ote_status_str(st));
        }
    }
    return left;
}

/*
 * engine/rdma/rdma_limits.c - what each data device can do, asked once at creation
 * (ote_context_limits_t: query_device_ex), and the depths the transport uses on it.
 *
 * Every depth the transport would otherwise assume is drawn from the device: the lanes'
 * CQ size (at most max_cqe), each QP's send depth and receive slots (at most max_qp_wr;
 * the receive slots also within the lane's receive CQ), its READ depth (the qp layer keeps
 * max_rd_atomic within max_qp_rd_atom / max_qp_init_rd_atom, and a requester within its
 * peer's responder depth, which the CONNECT path carries). A configured value above the
 * device's limit is clamped with one INFO line naming both; nothing is refused here, since
 * a smaller depth changes how much runs at once, not what a request means.
 *
 * Scatter-to-CQE (mlx5; VERBS_FACTS.md 11): a signalled READ of at most 64 bytes may be
 * delivered inside its CQE and copied by the CPU into the destination at poll time, which
 * faults when the destination is GPU memory. On such a device, when GPUDirect RDMA is
 * allowed (gpu_paths "direct"), the requester's READ QPs, and only those (no other QP ever
 * receives READ response data), are created with OTE_VERBS_QP_NO_SCATTER_TO_CQE.
 */
#include <stdio.h>

#include "base/log.h"
#include "context/context.h"
#include "endpoint/endpoint.h"
#include "engine/engine_internal.h"
#include "engine/rdma/rdma_internal.h"

/* The lane CQ size and QP depths the transport wants before the device has its say. */
#define WANT_CQ_DEPTH 4096u
#define WANT_SEND_WR 256u

static uint32_t clamp(const char *dev, const char *what, uint32_t want, uint32_t limit,
                      const char *limit_name) {
    if (limit == 0 || want <= limit) return want;
    OTE_INFO("rdma", "device %s: %s=%u is above the device's %s=%u: using %u", dev, what, want,
             limit_name, limit, limit);
    return limit;
}

void ote__rdma_nic_depths(rdma_tp_t *tp, rdma_nic_t *n) {
    ote_context_info_t info;
    ote_context_get_info(n->ctx, &info);
    const ote_context_limits_t *l = &info.limits;
    const char *dev = info.name;
    n->cq_depth = clamp(dev, "CQ depth (per lane)", WANT_CQ_DEPTH, l->max_cqe, "max_cqe");
    uint32_t send = clamp(dev, "QP send depth", WANT_SEND_WR, l->max_qp_wr, "max_qp_wr");
    n->send_wr = clamp(dev, "QP send depth", send, n->cq_depth, "CQ depth");
    uint32_t slots = tp->cfg.rdma_recv_slots != 0 ? tp->cfg.rdma_recv_slots : 256;
    slots = clamp(dev, "rdma_recv_slots", slots, l->max_qp_wr, "max_qp_wr");
    n->recv_slots = clamp(dev, "rdma_recv_slots", slots, n->cq_depth, "CQ depth (max_cqe)");
    n->read_flags = 0;
    if (l->scatter_to_cqe && (tp->cfg.gpu_paths & OTE__GPU_PATH_DIRECT) != 0) {
        if (l->scatter_opt_out) {
            n->read_flags = OTE_VERBS_QP_NO_SCATTER_TO_CQE;
        } else {
            OTE_ERROR("rdma",
                      "device %s scatters small READ responses into CQEs and this provider "
                      "cannot turn it off per QP (no mlx5dv): a READ of 64 bytes or less into "
                      "GPU memory would fault; set MLX5_SCATTER_TO_CQE=0 in the environment "
                      "before the engine starts, or leave \"direct\" out of gpu_paths",
                      dev);
        }
    }
}

/* The receive slots every source QP of the transport has: the smallest over its devices
 * (the source's parent reservations count in them, rdma_src_parents.c). */
uint32_t ote__rdma_recv_slots(const rdma_tp_t *tp) {
    uint32_t s = 0;
    for (uint32_t i = 0; i < tp->nnics; i++)
        if (tp->nics[i].recv_slots != 0 && (s == 0 || tp->nics[i].recv_slots < s))
            s = tp->nics[i].recv_slots;
    if (s != 0) return s;
    return tp->cfg.rdma_recv_slots != 0 ? tp->cfg.rdma_recv_slots : 256;
}

/*
 * verbs/sim/profile.c - device profiles of the sim (the list and the config item in sim.h):
 * the limits query_device / query_device_ex report (create_qp, create_cq, modify_qp and
 * alloc_mw enforce them where they are made), the OrbitTE QP create flags, and mlx5's
 * requester scatter-to-CQE hazard.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "verbs/sim/sim_internal.h"

/*
 * mlx5: a ConnectX-6/7 as `ibv_devinfo -v` reports it (max_qp_wr 32768, max_sge 30,
 * max_cqe 4194303, 16 RD atoms each way, SRQs of 32767 WRs x 31 SGEs, type-2B windows);
 * the inline size is what a QP of a few SGEs gets (libmlx5 derives it from the WQE size).
 * rxe: the kernel's soft-RoCE defaults (rxe_param.h). nomw: mlx5 without memory windows
 * and without the scatter hazard. small: a constrained RNIC.
 */
static const sim_profile_t k_profiles[] = {
    {.name = "mlx5",
     .vendor_part_id = 4125,
     .max_qp_wr = 32768,
     .max_sge = 30,
     .max_sge_rd = 30,
     .max_cqe = 4194303,
     .max_inline = 220,
     .max_qp_rd_atom = 16,
     .max_qp_init_rd_atom = 16,
     .max_srq = 8388608,
     .max_srq_wr = 32767,
     .max_srq_sge = 31,
     .mw = true,
     .scatter_to_cqe = true},
    {.name = "rxe",
     .vendor_part_id = 0,
     .max_qp_wr = 0x4000,
     .max_sge = 32,
     .max_sge_rd = 32,
     .max_cqe = 32767,
     .max_inline = 400,
     .max_qp_rd_atom = 128,
     .max_qp_init_rd_atom = 128,
     .max_srq = 0x40000,
     .max_srq_wr = 0x4000,
     .max_srq_sge = 27,
     .mw = true,
     .scatter_to_cqe = false},
    {.name = "nomw",
     .vendor_part_id = 4125,
     .max_qp_wr = 32768,
     .max_sge = 30,
     .max_sge_rd = 30,
     .max_cqe = 4194303,
     .max_inline = 220,
     .max_qp_rd_atom = 16,
     .max_qp_init_rd_atom = 16,
     .max_srq = 8388608,
     .max_srq_wr = 32767,
     .max_srq_sge = 31,
     .mw = false,
     .scatter_to_cqe = false},
    {.name = "small",
     .vendor_part_id = 2,
     .max_qp_wr = 512,
     .max_sge = 2,
     .max_sge_rd = 1,
     .max_cqe = 1024,
     .max_inline = 64,
     .max_qp_rd_atom = 4,
     .max_qp_init_rd_atom = 4,
     .max_srq = 1024,
     .max_srq_wr = 512,
     .max_srq_sge = 2,
     .mw = true,
     .scatter_to_cqe = false},
};

const sim_profile_t *ote__sim_profile_find(const char *name) {
    if (!name) return NULL;
    for (size_t i = 0; i < sizeof(k_profiles) / sizeof(k_profiles[0]); i++)
        if (!strcmp(k_profiles[i].name, name)) return &k_profiles[i];
    return NULL;
}

const sim_profile_t *ote__sim_profile_default(void) {
    const char *env = getenv("OTE_SIM_PROFILE");
    if (!env || !*env) return &k_profiles[0];
    const sim_profile_t *pr = ote__sim_profile_find(env);
    if (!pr) OTE_WARN(SIM_LOG, "sim: OTE_SIM_PROFILE=%s names no profile", env);
    return pr;
}

/* ---- device queries ---- */

int ote__sim_query_device(ote_verbs_t *v, struct ibv_context *ctx, struct ibv_device_attr *a) {
    (void)v;
    if (!ctx || !a) return EINVAL;
    sim_dev_t *d = to_sim_ctx(ctx)->dev;
    const sim_profile_t *pr = d->profile;
    memset(a, 0, sizeof(*a));
    snprintf(a->fw_ver, sizeof(a->fw_ver), "ote-sim 1.0 (%s)", pr->name);
    a->node_guid = d->guid;
    a->sys_image_guid = d->guid;
    a->max_mr_size = SIM_MAX_MR_SIZE;
    a->page_size_cap = 4096;
    a->vendor_id = 0x5e5e;
    a->vendor_part_id = pr->vendor_part_id;
    a->hw_ver = 1;
    a->max_qp = SIM_MAX_QP;
    a->max_qp_wr = (int)pr->max_qp_wr;
    a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_MEM_MGT_EXTENSIONS;
    if (pr->mw) a->device_cap_flags |= IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B;
    a->max_sge = (int)pr->max_sge;
    a->max_sge_rd = (int)pr->max_sge_rd;
    a->max_cq = SIM_MAX_QP;
    a->max_cqe = (int)pr->max_cqe;
    a->max_mr = SIM_MAX_KEYS / 2;
    a->max_pd = SIM_MAX_QP;
    a->max_qp_rd_atom = (int)pr->max_qp_rd_atom;
    a->max_qp_init_rd_atom = (int)pr->max_qp_init_rd_atom;
    a->max_res_rd_atom = (int)pr->max_qp_rd_atom * SIM_MAX_QP;
    a->atomic_cap = IBV_ATOMIC_NONE;
    a->max_mw = pr->mw ? SIM_MAX_KEYS / 2 : 0;
    a->max_srq = (int)pr->max_srq;
    a->max_srq_wr = (int)pr->max_srq_wr;
    a->max_srq_sge = (int)pr->max_srq_sge;
    a->max_pkeys = 1;
    a->local_ca_ack_delay = 15;
    a->phys_port_cnt = (uint8_t)d->nports;
    return 0;
}

/* orig_attr as query_device; of the extended fields the sim knows only the capability
 * flags and the port count: everything else (ODP, TSO, RSS, timestamps, ...) is zero. */
int ote__sim_query_device_ex(ote_verbs_t *v, struct ibv_context *ctx,
                             struct ibv_device_attr_ex *attr) {
    if (!ctx || !attr) return EINVAL;
    struct ibv_device_attr_ex a;
    memset(&a, 0, sizeof(a));
    int r = ote__sim_query_device(v, ctx, &a.orig_attr);
    if (r != 0) return r;
    a.device_cap_flags_ex = a.orig_attr.device_cap_flags;
    a.phys_port_cnt_ex = a.orig_attr.phys_port_cnt;
    *attr = a;
    return 0;
}

int ote__sim_device_flags(ote_verbs_t *v, struct ibv_context *ctx, uint32_t *flags_out) {
    (void)v;
    if (!ctx || !flags_out) return EINVAL;
    const sim_profile_t *pr = to_sim_ctx(ctx)->dev->profile;
    *flags_out =
        pr->scatter_to_cqe ? OTE_VERBS_DEV_SCATTER_TO_CQE | OTE_VERBS_DEV_SCATTER_OPT_OUT : 0;
    return 0;
}

/* ---- QP create flags ---- */

/* Every profile honours OTE_VERBS_QP_NO_SCATTER_TO_CQE (trivially where the device has no
 * scatter-to-CQE); an unknown flag fails EOPNOTSUPP. The flags are set before the QP is
 * handed out, under prov->mu (no peer can reach a QP still in RESET). */
int ote__sim_create_qp_flags(ote_verbs_t *v, struct ibv_pd *pd, struct ibv_qp_init_attr *init_attr,
                             uint32_t flags, struct ibv_qp **qp_out) {
    if (flags & ~OTE_VERBS_QP_NO_SCATTER_TO_CQE) return EOPNOTSUPP;
    if (!qp_out) return EINVAL;
    struct ibv_qp *ibqp = NULL;
    int r = ote__sim_create_qp(v, pd, init_attr, &ibqp);
    if (r != 0) return r;
    sim_prov_t *p = to_sim_prov(v);
    ote_mutex_lock(&p->mu);
    to_sim_qp(ibqp)->ote_flags = flags;
    ote_mutex_unlock(&p->mu);
    *qp_out = ibqp;
    return 0;
}

int ote__sim_qp_flags(ote_verbs_t *v, struct ibv_qp *ibqp, uint32_t *flags_out) {
    if (!ibqp || !flags_out) return EINVAL;
    sim_prov_t *p = to_sim_prov(v);
    ote_mutex_lock(&p->mu);
    uint32_t f = to_sim_qp(ibqp)->ote_flags;
    ote_mutex_unlock(&p->mu);
    *flags_out = f;
    return 0;
}

/* ---- scatter-to-CQE ---- */

static _Atomic uint64_t g_scatter_hazards;

uint64_t ote_sim_scatter_hazards(void) { return atomic_load(&g_scatter_hazards); }

/* Whether a local SGE of e lies in a dma-buf MR (memory the host may not address). */
static bool sge_in_dmabuf(sim_prov_t *p, const sim_swr_t *e) {
    for (int i = 0; i < e->nsge; i++) {
        if (e->sge[i].length == 0) continue;
        sim_mr_t *mr = ote__sim_mr_lookup(p, e->sge[i].lkey);
        if (mr && mr->map) return true;
    }
    return false;
}

/*
 * On mlx5 a signalled READ whose response fits the CQE is delivered inside the CQE, and
 * libmlx5 copies it into the destination with the CPU at poll time: into GPU memory, a
 * fault. (The kernel's mlx5 driver turns requester scatter on only for QPs whose send
 * CQEs can carry it, typically sq_sig_all ones; the sim takes every signalled READ, the
 * stricter reading.) The sim fails such a READ before it leaves: IBV_WC_LOC_PROT_ERR.
 */
bool ote__sim_scatter_hazard(sim_prov_t *p, sim_qp_t *qp, const sim_swr_t *e) {
    if (e->op != IBV_WR_RDMA_READ || !e->signaled || e->len > SIM_SCATTER_CQE_MAX) return false;
    if (!qp->ctx->dev->profile->scatter_to_cqe) return false;
    if (qp->ote_flags & OTE_VERBS_QP_NO_SCATTER_TO_CQE) return false;
    if (!sge_in_dmabuf(p, e)) return false;
    atomic_fetch_add(&g_scatter_hazards, 1);
    OTE_ERROR(SIM_LOG,
              "sim: QP %u (profile %s): signalled RDMA READ of %llu bytes into a dma-buf MR on "
              "a QP with scatter-to-CQE on: libmlx5 would copy it from the CQE with the CPU "
              "(a fault on GPU memory); create the QP with OTE_VERBS_QP_NO_SCATTER_TO_CQE. "
              "Failing wr_id %llu with LOC_PROT_ERR",
              qp->ibqp.qp_num, qp->ctx->dev->profile->name, (unsigned long long)e->len,
              (unsigned long long)e->wr_id);
    return true;
}

/* ---- control API ---- */

ote_status_t ote_sim_device_profile(const ote_verbs_t *v, const char *dev, const char **name_out) {
    if (!ote_sim_is_sim(v) || !dev || !name_out) return OTE_ERR_INVALID;
    const sim_prov_t *p = (const sim_prov_t *)v->priv;
    for (int i = 0; i < p->cfg.ndev; i++) {
        if (!strcmp(p->cfg.devs[i].ibdev.name, dev)) {
            *name_out = p->cfg.devs[i].profile->name;
            return OTE_OK;
        }
    }
    return OTE_ERR_NOT_FOUND;
}

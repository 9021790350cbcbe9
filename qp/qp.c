/*
 * qp/qp.c - QP lifecycle: create (RESET -> INIT), connect (INIT -> RTR -> RTS), the
 * completion hook on the lane, context event handling, cancel and destroy.
 */
#include <errno.h>
#include <string.h>

#include "base/alloc.h"
#include "base/fault.h"
#include "base/log.h"
#include "context/context.h"
#include "qp/qp_internal.h"

void ote_qp_config_default(ote_qp_config_t *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->max_send_wr = 128;
    cfg->max_send_sge = 1;
    cfg->access = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    cfg->timeout = 14;
    cfg->retry_cnt = 7;
    cfg->rnr_retry = 7;
    cfg->min_rnr_timer = 12;
    cfg->max_rd_atomic = 16;
}

static int qp_hook(void *arg, ote_cq_lane_t *lane, ote_cq_dir_t dir, const struct ibv_wc *wc) {
    (void)lane;
    ote_qp_t *qp = arg;
    if (dir == OTE_CQ_SEND) return ote__sq_complete(qp, wc);
    if (qp->cfg.srq != NULL) return 1; /* an SRQ slot: the SRQ's namespace takes it (srq.c) */
    ote__rq_complete(qp, wc);
    return 0;
}

/* Move the native QP to ERR (caller holds native_mu). */
static ote_status_t move_to_err(ote_qp_t *qp) {
    if (qp->qp == NULL) return OTE_ERR_STATE;
    struct ibv_qp_attr attr;
    memset(&attr, 0, sizeof(attr));
    attr.qp_state = IBV_QPS_ERR;
    int err = qp->v->ops->modify_qp(qp->v, qp->qp, &attr, IBV_QP_STATE);
    if (err != 0) {
        OTE_WARN("qp", "QP %u: modify to ERR failed: errno %d", qp->qp_num, err);
        return ote_status_make(OTE_ERR_NATIVE, err);
    }
    ote_mutex_lock(&qp->mu);
    qp->state = IBV_QPS_ERR;
    ote_mutex_unlock(&qp->mu);
    return OTE_OK;
}

ote_status_t ote_qp_cancel(ote_qp_t *qp) { return ote_qp_fence(qp, OTE_OK); }

ote_status_t ote_qp_fence(ote_qp_t *qp, ote_status_t cause) {
    ote_mutex_lock(&qp->native_mu);
    ote_mutex_lock(&qp->mu);
    if (!qp->fenced) qp->fence_cause = cause; /* the first fence's cause stays */
    qp->fenced = 1;
    enum ibv_qp_state state = qp->state;
    ote_mutex_unlock(&qp->mu);
    ote_status_t st = OTE_OK;
    /* ERR also when the hook already saw an error CQE: re-entering ERR is harmless. */
    if (qp->qp != NULL && state != IBV_QPS_RESET) st = move_to_err(qp);
    ote_mutex_unlock(&qp->native_mu);
    return st;
}

static void qp_listener(void *arg, ote_context_t *ctx, const struct ibv_async_event *ev) {
    ote_qp_t *qp = arg;
    const char *why = NULL;
    switch (ev->event_type) {
        case IBV_EVENT_PORT_ERR:
            if (ctx == qp->ctx && ev->element.port_num == qp->port) why = "port down";
            break;
        case IBV_EVENT_DEVICE_FATAL:
            if (ctx == qp->ctx) why = "device fatal";
            break;
        case IBV_EVENT_QP_FATAL:
        case IBV_EVENT_QP_REQ_ERR:
        case IBV_EVENT_QP_ACCESS_ERR:
            if (ev->element.qp != NULL && ev->element.qp == qp->qp) why = "QP error event";
            break;
        default: break;
    }
    if (why == NULL) return;
    /* A QP_FATAL that follows its lane's CQ error (an overrun): the lane's cause, so that
     * the work on it ends as this device's failure. */
    ote_status_t cause = OTE_OK;
    (void)ote_cq_lane_state(qp->lane, &cause);
    OTE_WARN("qp", "QP %u on %s: %s: fencing and flushing outstanding work", qp->qp_num,
             ote_context_name(qp->ctx), why);
    (void)ote_qp_fence(qp, cause);
}

static void free_qp(ote_qp_t *qp) {
    ote__sq_fini(qp);
    ote_mutex_destroy(&qp->mu);
    ote_mutex_destroy(&qp->native_mu);
    ote_free(qp);
}

/* A QP is created only on a usable context, and the "qp.create" fault point can refuse
 * it (logged WARN when the context refuses). */
static ote_status_t create_admit(ote_context_t *ctx) {
    ote_status_t st = ote_context_check(ctx);
    if (st != OTE_OK) {
        OTE_WARN("qp", "create on %s refused: %s", ote_context_name(ctx), ote_status_str(st));
        return st;
    }
    if (ote_fault_hit("qp.create", &st)) return st;
    return OTE_OK;
}

/* The native RC QP on the lane's CQ pair, in cfg->pd or the context's PD: sets qp->qp
 * and qp->qp_num (needs qp->ctx, qp->v and qp->cfg). */
static ote_status_t create_native_qp(ote_qp_t *qp, struct ibv_cq *const cqs[2]) {
    const ote_qp_config_t *cfg = &qp->cfg;
    struct ibv_qp_init_attr ia;
    memset(&ia, 0, sizeof(ia));
    ia.send_cq = cqs[0];
    ia.recv_cq = cqs[1];
    ia.qp_type = IBV_QPT_RC;
    ia.sq_sig_all = 1; /* every WR completes: exact discharge per WR id */
    ia.cap.max_send_wr = cfg->max_send_wr;
    ia.cap.max_recv_wr = cfg->recv_slots > 0 ? cfg->recv_slots : 1;
    ia.cap.max_send_sge = cfg->max_send_sge > 0 ? cfg->max_send_sge : 1;
    ia.cap.max_recv_sge = 1;
    ia.cap.max_inline_data = cfg->max_inline;
    if (cfg->srq != NULL) { /* receives come from the SRQ: no receive queue of its own */
        ia.srq = ote_srq_native(cfg->srq);
        ia.cap.max_recv_wr = 0;
        ia.cap.max_recv_sge = 0;
    }
    struct ibv_pd *pd = cfg->pd != NULL ? cfg->pd : ote_context_pd(qp->ctx);
    int err = cfg->create_flags != 0
                  ? qp->v->ops->create_qp_flags(qp->v, pd, &ia, cfg->create_flags, &qp->qp)
                  : qp->v->ops->create_qp(qp->v, pd, &ia, &qp->qp);
    if (err != 0) {
        OTE_ERROR("qp", "%s: create_qp(RC, %u send WRs, %u recv WRs, flags 0x%x) failed: errno %d",
                  ote_context_name(qp->ctx), ia.cap.max_send_wr, ia.cap.max_recv_wr,
                  cfg->create_flags, err);
        return ote_status_make(OTE_ERR_NATIVE, err);
    }
    qp->qp_num = qp->qp->qp_num;
    return OTE_OK;
}

/* RESET -> INIT on qp->port with the configured access flags; sets qp->state. */
static ote_status_t create_move_to_init(ote_qp_t *qp) {
    struct ibv_qp_attr attr;
    memset(&attr, 0, sizeof(attr));
    attr.qp_state = IBV_QPS_INIT;
    attr.pkey_index = 0;
    attr.port_num = qp->port;
    attr.qp_access_flags = (unsigned)qp->cfg.access;
    int err = qp->v->ops->modify_qp(
        qp->v, qp->qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    if (err != 0) {
        OTE_ERROR("qp", "%s: QP %u RESET->INIT failed: errno %d", ote_context_name(qp->ctx),
                  qp->qp_num, err);
        return ote_status_make(OTE_ERR_NATIVE, err);
    }
    qp->state = IBV_QPS_INIT;
    return OTE_OK;
}

/* The path a peer needs to reach this QP (qp->local) and its starting PSN (qp->psn),
 * from the context's port info. */
static void create_local_path(ote_qp_t *qp, const ote_context_info_t *info) {
    qp->psn = (uint32_t)((ote_now_ns() ^ ((uint64_t)qp->qp_num * 2654435761u)) & 0xffffff);
    memset(&qp->local, 0, sizeof(qp->local));
    qp->local.gid = info->gid;
    qp->local.lid = info->lid;
    qp->local.qp_num = qp->qp_num;
    qp->local.psn = qp->psn;
    qp->local.mtu = info->active_mtu;
    if (qp->cfg.max_path_mtu != 0 && qp->cfg.max_path_mtu < qp->local.mtu)
        qp->local.mtu = qp->cfg.max_path_mtu;
    qp->local.rd_atom = qp->cfg.max_rd_atomic;
}

/* qp->cfg.max_rd_atomic within the device's depths (both directions use one value). */
static void clamp_rd_atomic(ote_qp_t *qp, const ote_context_info_t *info) {
    uint32_t lim = info->limits.max_qp_rd_atom;
    if (info->limits.max_qp_init_rd_atom < lim) lim = info->limits.max_qp_init_rd_atom;
    if (lim > 255) lim = 255;
    if (lim > 0 && qp->cfg.max_rd_atomic > lim) qp->cfg.max_rd_atomic = (uint8_t)lim;
}

/* Destroy the native QP of a failed create: 0 when it is gone; otherwise it stays
 * counted as retained (ERROR logged) and the caller must keep its memory with it. */
static int create_destroy_native(ote_qp_t *qp) {
    int err = qp->v->ops->destroy_qp(qp->v, qp->qp);
    if (err != 0) {
        /* A QP that will not die moments after creation: it stays counted, and its
         * memory (MR, buffers) is kept with it rather than freed on a guess. */
        ote_context_retained_add(qp->ctx, OTE_RETAINED_QP, 1);
        OTE_ERROR("qp", "%s: destroy of a half-created QP %u failed: errno %d; leaked",
                  ote_context_name(qp->ctx), qp->qp_num, err);
    }
    return err;
}

ote_status_t ote_qp_create(ote_cq_lane_t *lane, const ote_qp_config_t *cfg, ote_qp_t **qp_out) {
    if (lane == NULL || cfg == NULL || qp_out == NULL || cfg->max_send_wr == 0 ||
        (cfg->recv_slots > 0 && cfg->recv_size == 0) ||
        (cfg->srq != NULL && (cfg->recv_slots > 0 || ote_srq_lane(cfg->srq) != lane)) ||
        cfg->service_level > 15 ||
        (cfg->max_path_mtu != 0 &&
         (cfg->max_path_mtu < IBV_MTU_256 || cfg->max_path_mtu > IBV_MTU_4096)))
        return OTE_ERR_INVALID;
    ote_context_t *ctx = ote_cq_lane_context(lane);
    ote_status_t st = create_admit(ctx);
    if (st != OTE_OK) return st;
    ote_qp_t *qp = ote_calloc(1, sizeof(*qp));
    if (qp == NULL) return OTE_ERR_NOMEM;
    qp->lane = lane;
    qp->ctx = ctx;
    qp->v = ote_context_verbs(ctx);
    qp->cfg = *cfg;
    qp->state = IBV_QPS_RESET;
    if ((st = ote_mutex_init(&qp->native_mu)) != OTE_OK) goto err_free;
    if ((st = ote_mutex_init(&qp->mu)) != OTE_OK) goto err_native_mu;
    if ((st = ote__sq_init(qp)) != OTE_OK) goto err_mu;
    if ((st = ote__rq_init(qp)) != OTE_OK) goto err_sq;

    ote_context_info_t info;
    ote_context_get_info(ctx, &info);
    qp->port = info.port;
    qp->gid_index = info.gid_index;
    qp->route_gen = info.route_generation;
    clamp_rd_atomic(qp, &info);
    /* The lane's CQs stay (no replacement) from here until the QP is attached. */
    struct ibv_cq *cqs[2];
    if ((st = ote_cq_lane_pin(lane, cqs)) != OTE_OK) goto err_rq;
    if ((st = create_native_qp(qp, cqs)) != OTE_OK) {
        ote_cq_lane_unpin(lane);
        goto err_rq;
    }
    st = create_move_to_init(qp);
    if (st == OTE_OK) st = ote_cq_lane_attach_qp(lane, qp->qp_num, qp_hook, qp);
    ote_cq_lane_unpin(lane);
    if (st != OTE_OK) goto err_destroy_qp;
    qp->hook_attached = 1;
    if (cfg->srq != NULL && (st = ote__srq_attach(cfg->srq, qp, qp->qp_num)) != OTE_OK)
        goto err_detach;
    st = ote_context_set_add_listener(ote_context_owner(ctx), qp_listener, qp, &qp->listener_id);
    if (st != OTE_OK) goto err_srq;
    qp->listener_added = 1;
    create_local_path(qp, &info);
    OTE_DEBUG("qp", "%s: QP %u created on lane %u (%u send WRs, %u receive slots)",
              ote_context_name(ctx), qp->qp_num, ote_cq_lane_index(lane), cfg->max_send_wr,
              cfg->recv_slots);
    *qp_out = qp;
    return OTE_OK;

err_srq:
    if (cfg->srq != NULL) ote__srq_detach(cfg->srq, qp->qp_num, 0);
err_detach:
    ote_cq_lane_detach_qp(lane, qp->qp_num);
err_destroy_qp:
    if (create_destroy_native(qp) != 0) return st; /* retained with its memory */
err_rq:
    if (ote__rq_fini(qp) != OTE_OK) return st; /* MR retained and counted with its buffers */
err_sq:
    ote__sq_fini(qp);
err_mu:
    ote_mutex_destroy(&qp->mu);
err_native_mu:
    ote_mutex_destroy(&qp->native_mu);
err_free:
    ote_free(qp);
    return st;
}

void ote_qp_local_path(const ote_qp_t *qp, ote_qp_path_t *path_out) { *path_out = qp->local; }

/* From RTR back to INIT so that connect can be retried (RESET drops posted receives). */
static ote_status_t back_to_init(ote_qp_t *qp) {
    struct ibv_qp_attr attr;
    memset(&attr, 0, sizeof(attr));
    attr.qp_state = IBV_QPS_RESET;
    int err = qp->v->ops->modify_qp(qp->v, qp->qp, &attr, IBV_QP_STATE);
    if (err == 0) {
        ote__rq_forget_posted(qp); /* RESET discards receive WQEs without completions */
        memset(&attr, 0, sizeof(attr));
        attr.qp_state = IBV_QPS_INIT;
        attr.port_num = qp->port;
        attr.qp_access_flags = (unsigned)qp->cfg.access;
        err = qp->v->ops->modify_qp(
            qp->v, qp->qp, &attr,
            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
        ote_mutex_lock(&qp->mu);
        qp->state = err == 0 ? IBV_QPS_INIT : IBV_QPS_RESET;
        ote_mutex_unlock(&qp->mu);
    }
    if (err != 0) {
        OTE_WARN("qp",
                 "QP %u: could not return to INIT after a failed connect: errno %d; "
                 "destroy it",
                 qp->qp_num, err);
        ote_mutex_lock(&qp->mu);
        qp->fenced = 1;
        ote_mutex_unlock(&qp->mu);
        return ote_status_make(OTE_ERR_NATIVE, err);
    }
    return OTE_OK;
}

ote_status_t ote_qp_connect(ote_qp_t *qp, const ote_qp_path_t *peer) {
    if (qp == NULL || peer == NULL) return OTE_ERR_INVALID;
    ote_status_t st = ote_context_check(qp->ctx);
    if (st != OTE_OK) return st;
    ote_mutex_lock(&qp->native_mu);
    ote_mutex_lock(&qp->mu);
    enum ibv_qp_state state = qp->state;
    int refused = qp->closing || qp->fenced || qp->qp == NULL;
    ote_mutex_unlock(&qp->mu);
    if (refused || state != IBV_QPS_INIT) {
        ote_mutex_unlock(&qp->native_mu);
        return OTE_ERR_STATE;
    }
    /* Receives first: a peer's SEND must find a posted buffer as soon as we are RTR. */
    st = ote__rq_post_idle(qp);
    if (st != OTE_OK) {
        ote_mutex_unlock(&qp->native_mu);
        return st;
    }
    struct ibv_qp_attr attr;
    memset(&attr, 0, sizeof(attr));
    attr.qp_state = IBV_QPS_RTR;
    attr.path_mtu = qp->local.mtu < peer->mtu ? qp->local.mtu : peer->mtu;
    if (attr.path_mtu < IBV_MTU_256) attr.path_mtu = IBV_MTU_1024;
    if (qp->cfg.max_path_mtu != 0 && attr.path_mtu > qp->cfg.max_path_mtu)
        attr.path_mtu = qp->cfg.max_path_mtu;
    attr.dest_qp_num = peer->qp_num;
    attr.rq_psn = peer->psn & 0xffffff;
    attr.max_dest_rd_atomic = qp->cfg.max_rd_atomic;
    attr.min_rnr_timer = qp->cfg.min_rnr_timer;
    attr.ah_attr.is_global = 1;
    attr.ah_attr.grh.dgid = peer->gid;
    if (qp->gid_index < 0 || qp->gid_index > OTE_CONTEXT_MAX_SGID_INDEX) {
        /* The context never selects one (context/gid.c); never truncate to another GID. */
        OTE_ERROR("qp", "%s: QP %u: GID index %d does not fit sgid_index (8 bits)",
                  ote_context_name(qp->ctx), qp->qp_num, qp->gid_index);
        ote_mutex_unlock(&qp->native_mu);
        return OTE_ERR_INVALID;
    }
    attr.ah_attr.grh.sgid_index = (uint8_t)qp->gid_index;
    attr.ah_attr.grh.hop_limit = 64;
    attr.ah_attr.grh.traffic_class = qp->cfg.traffic_class;
    attr.ah_attr.sl = qp->cfg.service_level;
    attr.ah_attr.dlid = peer->lid;
    attr.ah_attr.port_num = qp->port;
    int err =
        qp->v->ops->modify_qp(qp->v, qp->qp, &attr,
                              IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (err != 0) {
        OTE_ERROR("qp", "%s: QP %u INIT->RTR toward QP %u failed: errno %d; still INIT",
                  ote_context_name(qp->ctx), qp->qp_num, peer->qp_num, err);
        ote_mutex_unlock(&qp->native_mu);
        return ote_status_make(OTE_ERR_NATIVE, err);
    }
    ote_mutex_lock(&qp->mu);
    qp->state = IBV_QPS_RTR;
    ote_mutex_unlock(&qp->mu);

    memset(&attr, 0, sizeof(attr));
    attr.qp_state = IBV_QPS_RTS;
    attr.sq_psn = qp->psn;
    attr.timeout = qp->cfg.timeout;
    attr.retry_cnt = qp->cfg.retry_cnt;
    attr.rnr_retry = qp->cfg.rnr_retry;
    /* Initiator depth: never more READs in flight than the peer's responder accepts. */
    attr.max_rd_atomic = qp->cfg.max_rd_atomic;
    if (peer->rd_atom != 0 && peer->rd_atom < attr.max_rd_atomic)
        attr.max_rd_atomic = peer->rd_atom;
    err = qp->v->ops->modify_qp(qp->v, qp->qp, &attr,
                                IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                    IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
    if (err != 0) {
        OTE_ERROR("qp", "%s: QP %u RTR->RTS failed: errno %d; returning to INIT",
                  ote_context_name(qp->ctx), qp->qp_num, err);
        (void)back_to_init(qp);
        ote_mutex_unlock(&qp->native_mu);
        return ote_status_make(OTE_ERR_NATIVE, err);
    }
    ote_mutex_lock(&qp->mu);
    qp->state = IBV_QPS_RTS;
    ote_mutex_unlock(&qp->mu);
    ote_mutex_unlock(&qp->native_mu);
    OTE_DEBUG("qp", "%s: QP %u connected to QP %u", ote_context_name(qp->ctx), qp->qp_num,
              peer->qp_num);
    return OTE_OK;
}

static int sq_idle(void *arg) {
    ote_qp_t *qp = arg;
    ote_mutex_lock(&qp->mu);
    int idle = qp->sq_count == 0;
    ote_mutex_unlock(&qp->mu);
    return idle;
}

static int all_quiet(void *arg) {
    ote_qp_t *qp = arg;
    ote_mutex_lock(&qp->mu);
    int quiet = qp->sq_count == 0 && qp->rq_count == 0;
    ote_mutex_unlock(&qp->mu);
    return quiet;
}

ote_status_t ote_qp_wait_idle(ote_qp_t *qp, ote_deadline_t deadline) {
    return ote_cq_lane_progress(qp->lane, sq_idle, qp, deadline);
}

/* Move the native QP to ERR, wait for its flush until the deadline (a faulted lane
 * gives none: no wait then), destroy it and end what is still owed with synthesized
 * flushes. OTE_ERR_RETAINED keeps the native QP (counted). */
static ote_status_t destroy_native(ote_qp_t *qp, ote_deadline_t deadline) {
    if (qp->qp != NULL) {
        ote_mutex_lock(&qp->native_mu);
        ote_mutex_lock(&qp->mu);
        enum ibv_qp_state state = qp->state;
        ote_mutex_unlock(&qp->mu);
        if (state != IBV_QPS_RESET && state != IBV_QPS_ERR) (void)move_to_err(qp);
        ote_mutex_unlock(&qp->native_mu);
        /* The flush discharges what the provider still holds; a lost CQE cannot be
         * waited for, so the deadline bounds this, and destruction resolves the rest. */
        if (ote_cq_lane_progress(qp->lane, all_quiet, qp, deadline) != OTE_OK) {
            ote_mutex_lock(&qp->mu);
            uint32_t s = qp->sq_count, r = qp->rq_count;
            ote_mutex_unlock(&qp->mu);
            OTE_WARN("qp",
                     "QP %u: %u send / %u receive WRs not flushed by the deadline; "
                     "native destruction will resolve them",
                     qp->qp_num, s, r);
        }
        ote_mutex_lock(&qp->native_mu);
        int err = qp->v->ops->destroy_qp(qp->v, qp->qp);
        if (err != 0) {
            if (!qp->retained_qp) {
                qp->retained_qp = 1;
                ote_context_retained_add(qp->ctx, OTE_RETAINED_QP, 1);
            }
            ote_mutex_unlock(&qp->native_mu);
            OTE_WARN("qp",
                     "QP %u on %s: destroy_qp failed: errno %d; QP, buffers and "
                     "charges retained",
                     qp->qp_num, ote_context_name(qp->ctx), err);
            return ote_status_make(OTE_ERR_RETAINED, err);
        }
        ote_mutex_lock(&qp->mu);
        qp->qp = NULL;
        qp->state = IBV_QPS_RESET;
        ote_mutex_unlock(&qp->mu);
        ote_mutex_unlock(&qp->native_mu);
        if (qp->retained_qp) {
            qp->retained_qp = 0;
            ote_context_retained_add(qp->ctx, OTE_RETAINED_QP, -1);
        }
        /* The NIC can no longer touch this QP's WRs: end what is still owed. */
        ote__sq_resolve_destroyed(qp);
        ote__rq_forget_posted(qp);
    }
    return OTE_OK;
}

ote_status_t ote_qp_abandon(ote_qp_t *qp, ote_status_t cause, ote_deadline_t deadline) {
    if (qp == NULL) return OTE_ERR_INVALID;
    (void)ote_qp_fence(qp, cause);
    ote_mutex_lock(&qp->mu);
    int open = qp->qp != NULL && !qp->closing;
    ote_mutex_unlock(&qp->mu);
    if (!open) return OTE_OK;
    ote_status_t st = destroy_native(qp, deadline);
    if (st == OTE_OK)
        OTE_DEBUG("qp", "QP %u abandoned (%s): native QP destroyed, owed WRs ended", qp->qp_num,
                  ote_status_str(cause));
    return st;
}

ote_status_t ote_qp_destroy(ote_qp_t *qp, ote_deadline_t deadline) {
    if (qp == NULL) return OTE_OK;
    if (qp->listener_added) {
        ote_context_set_remove_listener(ote_context_owner(qp->ctx), qp->listener_id);
        qp->listener_added = 0;
    }
    ote_mutex_lock(&qp->mu);
    qp->closing = 1;
    qp->fenced = 1;
    ote_mutex_unlock(&qp->mu);

    ote_status_t nst = destroy_native(qp, deadline);
    if (nst != OTE_OK) return nst;
    if (qp->hook_attached && qp->cfg.srq != NULL) {
        /* Off the SRQ's map first (its completions of this QP become orphans), then off
         * the lane, which waits for a poll that may still hand one to this QP. */
        ote_mutex_lock(&qp->mu);
        uint32_t admitted = qp->rq_admitted;
        qp->rq_admitted = 0;
        ote_mutex_unlock(&qp->mu);
        ote__srq_detach(qp->cfg.srq, qp->qp_num, admitted);
    }
    if (qp->hook_attached) {
        ote_cq_lane_detach_qp(qp->lane, qp->qp_num);
        qp->hook_attached = 0;
    }
    ote_status_t st = ote__rq_fini(qp);
    if (st != OTE_OK) return st; /* receive MR and buffers retained with the QP object */
    OTE_DEBUG("qp", "QP %u destroyed", qp->qp_num);
    free_qp(qp);
    return OTE_OK;
}

uint32_t ote_qp_num(const ote_qp_t *qp) { return qp->qp_num; }
uint64_t ote_qp_route_generation(const ote_qp_t *qp) { return qp->route_gen; }
ote_status_t ote_qp_fence_cause(const ote_qp_t *qp) {
    ote_qp_t *q = (ote_qp_t *)qp;
    ote_mutex_lock(&q->mu);
    ote_status_t st = q->fence_cause;
    ote_mutex_unlock(&q->mu);
    return st;
}
ote_cq_lane_t *ote_qp_lane(const ote_qp_t *qp) { return qp->lane; }
struct ibv_pd *ote_qp_pd(const ote_qp_t *qp) {
    return qp->cfg.pd != NULL ? qp->cfg.pd : ote_context_pd(qp->ctx);
}
ote_context_t *ote_qp_context(const ote_qp_t *qp) { return qp->ctx; }
struct ibv_qp *ote_qp_native(const ote_qp_t *qp) {
    ote_qp_t *q = (ote_qp_t *)qp;
    ote_mutex_lock(&q->mu);
    struct ibv_qp *n = q->qp; /* NULL once abandoned or destroyed */
    ote_mutex_unlock(&q->mu);
    return n;
}

void ote_qp_get_stats(const ote_qp_t *qp, ote_qp_stats_t *s) {
    ote_qp_t *q = (ote_qp_t *)qp;
    memset(s, 0, sizeof(*s));
    ote_mutex_lock(&q->mu);
    s->qp_num = q->qp_num;
    s->state = q->state;
    s->fenced = q->fenced;
    s->retained = q->retained_qp || q->retained_mr;
    s->sq_outstanding = q->sq_count;
    s->sq_capacity = q->cfg.max_send_wr;
    s->rq_posted = q->rq_count;
    s->rq_slots = q->cfg.recv_slots;
    s->send_completions = q->send_completions;
    s->send_errors = q->send_errors;
    s->recv_completions = q->recv_completions;
    s->recv_errors = q->recv_errors;
    s->unknown_cqes = q->unknown_cqes;
    s->expired = q->expired;
    s->resolved_by_destroy = q->resolved_by_destroy;
    ote_mutex_unlock(&q->mu);
}

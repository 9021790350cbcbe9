/*
 * verbs/sim/sim.c - the software RC provider: instance open/close, its ops table, the
 * control API of sim.h and CQ-overrun handling. See sim.h for the configuration and
 * sim_internal.h for the object model and locking.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "verbs/provider.h"
#include "verbs/sim/sim_internal.h"

static _Atomic uint32_t g_instances;

static const ote_verbs_ops_t k_sim_ops = {
    .get_device_list = ote__sim_get_device_list,
    .free_device_list = ote__sim_free_device_list,
    .get_device_name = ote__sim_get_device_name,
    .open_device = ote__sim_open_device,
    .close_device = ote__sim_close_device,
    .query_device = ote__sim_query_device,
    .query_port = ote__sim_query_port,
    .query_gid = ote__sim_query_gid,
    .query_gid_ex = ote__sim_query_gid_ex,
    .device_numa_node = ote__sim_device_numa_node,
    .get_async_event = ote__sim_get_async_event,
    .ack_async_event = ote__sim_ack_async_event,
    .alloc_pd = ote__sim_alloc_pd,
    .dealloc_pd = ote__sim_dealloc_pd,
    .reg_mr = ote__sim_reg_mr,
    .reg_dmabuf_mr = ote__sim_reg_dmabuf_mr,
    .dereg_mr = ote__sim_dereg_mr,
    .alloc_mw = ote__sim_alloc_mw,
    .dealloc_mw = ote__sim_dealloc_mw,
    .create_comp_channel = ote__sim_create_comp_channel,
    .destroy_comp_channel = ote__sim_destroy_comp_channel,
    .create_cq = ote__sim_create_cq,
    .destroy_cq = ote__sim_destroy_cq,
    .req_notify_cq = ote__sim_req_notify_cq,
    .get_cq_event = ote__sim_get_cq_event,
    .ack_cq_events = ote__sim_ack_cq_events,
    .poll_cq = ote__sim_poll_cq,
    .create_qp = ote__sim_create_qp,
    .modify_qp = ote__sim_modify_qp,
    .query_qp = ote__sim_query_qp,
    .destroy_qp = ote__sim_destroy_qp,
    .post_send = ote__sim_post_send,
    .post_recv = ote__sim_post_recv,
    .create_srq = ote__sim_create_srq,
    .modify_srq = ote__sim_modify_srq,
    .query_srq = ote__sim_query_srq,
    .destroy_srq = ote__sim_destroy_srq,
    .post_srq_recv = ote__sim_post_srq_recv,
    .query_device_ex = ote__sim_query_device_ex,
    .create_qp_flags = ote__sim_create_qp_flags,
    .qp_flags = ote__sim_qp_flags,
    .device_flags = ote__sim_device_flags,
};

static void sim_close(ote_verbs_t *v);

static void prov_free(sim_prov_t *p) {
    ote__sim_wire_stop(p);
    for (int i = 0; i < p->cfg.ndev; i++)
        for (int j = 1; j <= p->cfg.devs[i].nports; j++)
            ote__sim_port_unbind(p, &p->cfg.devs[i], j);
    /* Objects the user did not destroy are leaked on purpose (as rdma-core). */
    if (p->ctxs) OTE_WARN(SIM_LOG, "sim: closed with device contexts still open");
    HASH_CLEAR(hh, p->qps);
    if (p->wake_efd >= 0) close(p->wake_efd);
    if (p->epfd >= 0) close(p->epfd);
    ote_free(p->keys);
    ote_cond_destroy(&p->cv);
    ote_mutex_destroy(&p->mu);
    ote_free(p);
}

ote_status_t ote__verbs_sim_open(const char *config, ote_verbs_t **v_out) {
    if (!v_out) return OTE_ERR_INVALID;
    if (!config || !*config) config = getenv("OTE_SIM_CONFIG");
    sim_prov_t *p = ote_calloc(1, sizeof(*p));
    if (!p) return OTE_ERR_NOMEM;
    p->epfd = -1;
    p->wake_efd = -1;
    ote_status_t st = ote__sim_config_parse(config, &p->cfg);
    if (st == OTE_OK) st = ote__sim_inject_parse(p);
    if (st != OTE_OK) {
        ote_free(p);
        return st;
    }
    st = ote_mutex_init(&p->mu);
    if (st != OTE_OK) {
        ote_free(p);
        return st;
    }
    st = ote_cond_init(&p->cv);
    if (st != OTE_OK) {
        ote_mutex_destroy(&p->mu);
        ote_free(p);
        return st;
    }
    p->instance = atomic_fetch_add(&g_instances, 1);
    p->next_qpn = 0x100 + (p->instance & 0xff) * 0x1000;
    p->wake_kind = SIM_FD_WAKE;
    p->epfd = epoll_create1(EPOLL_CLOEXEC);
    p->wake_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (p->epfd < 0 || p->wake_efd < 0) {
        st = ote_status_make(OTE_ERR_NATIVE, errno);
        goto err_free;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &p->wake_kind};
    if (epoll_ctl(p->epfd, EPOLL_CTL_ADD, p->wake_efd, &ev) != 0) {
        st = ote_status_make(OTE_ERR_NATIVE, errno);
        goto err_free;
    }
    for (int i = 0; i < p->cfg.ndev; i++) {
        sim_dev_t *d = &p->cfg.devs[i];
        d->prov = p;
        d->guid = ((uint64_t)getpid() << 24) ^ ((uint64_t)p->instance << 8) ^ (uint64_t)i ^
                  0x025e000000000000ull;
        for (int j = 1; j <= d->nports; j++) {
            st = ote__sim_port_bind(p, d, j);
            if (st != OTE_OK) goto err_free;
        }
    }
    p->v.ops = &k_sim_ops;
    p->v.provider = "sim";
    p->v.priv = p;
    p->magic = SIM_MAGIC;
    p->v.close = sim_close;
    st = ote__sim_wire_start(p);
    if (st != OTE_OK) goto err_free;
    *v_out = &p->v;
    return OTE_OK;
err_free:
    prov_free(p);
    return st;
}

static void sim_close(ote_verbs_t *v) {
    if (!v) return;
    to_sim_prov(v)->magic = 0;
    prov_free(to_sim_prov(v));
}

void ote__sim_handle_overflow(sim_prov_t *p) {
    sim_qp_t *qp;
    bool any = false;
    DL_FOREACH2(p->qp_list, qp, next) {
        sim_cq_t *cqs[2] = {qp->scq, qp->rcq};
        for (int i = 0; i < 2; i++) {
            sim_cq_t *cq = cqs[i];
            if (cq->overflowed && !cq->overflow_handled) {
                cq->overflow_handled = true;
                struct ibv_async_event ev;
                memset(&ev, 0, sizeof(ev));
                ev.event_type = IBV_EVENT_CQ_ERR;
                ev.element.cq = &cq->ibcq;
                ote__sim_async_push(cq->ctx, &ev);
                any = true;
            }
        }
    }
    if (!any) return;
    DL_FOREACH2(p->qp_list, qp, next) {
        if ((qp->scq->overflowed || qp->rcq->overflowed) && qp->state != IBV_QPS_ERR &&
            qp->state != IBV_QPS_RESET)
            ote__sim_qp_fatal(qp, IBV_EVENT_QP_FATAL);
    }
}

/* ---- control API ---- */

int ote_sim_is_sim(const ote_verbs_t *v) {
    return v && v->provider && !strcmp(v->provider, "sim") && v->priv &&
           ((const sim_prov_t *)v->priv)->magic == SIM_MAGIC;
}

static sim_dev_t *find_dev(sim_prov_t *p, const char *name) {
    for (int i = 0; i < p->cfg.ndev; i++)
        if (name && !strcmp(p->cfg.devs[i].ibdev.name, name)) return &p->cfg.devs[i];
    return NULL;
}

static void port_event(sim_prov_t *p, sim_dev_t *d, uint8_t port, enum ibv_event_type t) {
    sim_ctx_t *c;
    DL_FOREACH(p->ctxs, c) {
        if (c->dev != d) continue;
        struct ibv_async_event ev;
        memset(&ev, 0, sizeof(ev));
        ev.event_type = t;
        ev.element.port_num = port;
        ote__sim_async_push(c, &ev);
    }
}

ote_status_t ote_sim_set_port_state(ote_verbs_t *v, const char *dev, uint8_t port,
                                    enum ibv_port_state state) {
    if (!ote_sim_is_sim(v)) return OTE_ERR_INVALID;
    if (state != IBV_PORT_DOWN && state != IBV_PORT_ACTIVE && state != IBV_PORT_INIT)
        return OTE_ERR_INVALID;
    sim_prov_t *p = to_sim_prov(v);
    sim_dev_t *d = find_dev(p, dev);
    if (!d || port < 1 || port > d->nports) return OTE_ERR_NOT_FOUND;
    ote_mutex_lock(&p->mu);
    enum ibv_port_state old = d->ports[port - 1].state;
    d->ports[port - 1].state = state;
    if (old == IBV_PORT_ACTIVE && state != IBV_PORT_ACTIVE)
        port_event(p, d, port, IBV_EVENT_PORT_ERR);
    if (old != IBV_PORT_ACTIVE && state == IBV_PORT_ACTIVE)
        port_event(p, d, port, IBV_EVENT_PORT_ACTIVE);
    ote_mutex_unlock(&p->mu);
    ote__sim_wake(p);
    return OTE_OK;
}

ote_status_t ote_sim_set_port_bw(ote_verbs_t *v, const char *dev, uint8_t port,
                                 uint64_t bytes_per_sec) {
    if (!ote_sim_is_sim(v) || bytes_per_sec > SIM_MAX_BW) return OTE_ERR_INVALID;
    sim_prov_t *p = to_sim_prov(v);
    sim_dev_t *d = find_dev(p, dev);
    if (!d || port < 1 || port > d->nports) return OTE_ERR_NOT_FOUND;
    ote_mutex_lock(&p->mu);
    sim_port_t *pt = &d->ports[port - 1];
    pt->bw = bytes_per_sec;
    pt->bw_last_ns = 0; /* the bucket starts again from one quantum */
    ote_mutex_unlock(&p->mu);
    ote__sim_wake(p);
    return OTE_OK;
}

/* One of a port's byte counters (payload: tx_payload, else tx_bytes), read under p->mu. */
static ote_status_t port_tx_counter(ote_verbs_t *v, const char *dev, uint8_t port, bool payload,
                                    uint64_t *bytes_out) {
    if (!ote_sim_is_sim(v) || !bytes_out) return OTE_ERR_INVALID;
    sim_prov_t *p = to_sim_prov(v);
    sim_dev_t *d = find_dev(p, dev);
    if (!d || port < 1 || port > d->nports) return OTE_ERR_NOT_FOUND;
    ote_mutex_lock(&p->mu);
    const sim_port_t *pt = &d->ports[port - 1];
    *bytes_out = payload ? pt->tx_payload : pt->tx_bytes;
    ote_mutex_unlock(&p->mu);
    return OTE_OK;
}

ote_status_t ote_sim_port_tx_bytes(ote_verbs_t *v, const char *dev, uint8_t port,
                                   uint64_t *bytes_out) {
    return port_tx_counter(v, dev, port, false, bytes_out);
}

ote_status_t ote_sim_port_tx_payload_bytes(ote_verbs_t *v, const char *dev, uint8_t port,
                                           uint64_t *bytes_out) {
    return port_tx_counter(v, dev, port, true, bytes_out);
}

ote_status_t ote_sim_set_gid(ote_verbs_t *v, const char *dev, uint8_t port, int index,
                             const union ibv_gid *gid, enum ibv_gid_type type) {
    if (!ote_sim_is_sim(v)) return OTE_ERR_INVALID;
    sim_prov_t *p = to_sim_prov(v);
    sim_dev_t *d = find_dev(p, dev);
    if (!d || port < 1 || port > d->nports) return OTE_ERR_NOT_FOUND;
    sim_port_t *pt = &d->ports[port - 1];
    if (index < 0 || index >= pt->ngid) return OTE_ERR_INVALID;
    if (type != IBV_GID_TYPE_IB && type != IBV_GID_TYPE_ROCE_V1 && type != IBV_GID_TYPE_ROCE_V2)
        return OTE_ERR_INVALID;
    ote_mutex_lock(&p->mu);
    sim_gid_t saved[SIM_GID_TBL_LEN];
    memcpy(saved, pt->gids, sizeof(saved));
    ote__sim_port_unbind(p, d, port);
    if (gid) {
        pt->gids[index].valid = true;
        pt->gids[index].gid = *gid;
        pt->gids[index].type = type;
        pt->gids[index].kind = SIM_GID_EXPLICIT;
    } else {
        memset(&pt->gids[index], 0, sizeof(pt->gids[index]));
    }
    /* Rebind keeping the port's unique id (auto GIDs are recomputed identically). */
    ote_status_t st = ote__sim_port_bind(p, d, port);
    if (st != OTE_OK) {
        memcpy(pt->gids, saved, sizeof(saved));
        ote_status_t st2 = ote__sim_port_bind(p, d, port);
        if (st2 != OTE_OK)
            OTE_WARN(SIM_LOG, "sim: %s port %u lost its listeners", d->ibdev.name, port);
    } else {
        port_event(p, d, port, IBV_EVENT_GID_CHANGE);
    }
    ote_mutex_unlock(&p->mu);
    return st;
}

ote_status_t ote_sim_qp_fatal(ote_verbs_t *v, struct ibv_qp *ibqp) {
    if (!ote_sim_is_sim(v) || !ibqp) return OTE_ERR_INVALID;
    sim_prov_t *p = to_sim_prov(v);
    ote_mutex_lock(&p->mu);
    ote__sim_qp_fatal(to_sim_qp(ibqp), IBV_EVENT_QP_FATAL);
    ote__sim_handle_overflow(p);
    ote_mutex_unlock(&p->mu);
    return OTE_OK;
}

ote_status_t ote_sim_device_fatal(ote_verbs_t *v, const char *dev) {
    if (!ote_sim_is_sim(v)) return OTE_ERR_INVALID;
    sim_prov_t *p = to_sim_prov(v);
    sim_dev_t *d = find_dev(p, dev);
    if (!d) return OTE_ERR_NOT_FOUND;
    ote_mutex_lock(&p->mu);
    port_event(p, d, 0, IBV_EVENT_DEVICE_FATAL);
    ote_mutex_unlock(&p->mu);
    return OTE_OK;
}

uint32_t ote_sim_retry_cap_ms(const ote_verbs_t *v) {
    if (!ote_sim_is_sim(v)) return 0;
    return ((const sim_prov_t *)v->priv)->cfg.retry_cap_ms;
}

_Atomic uint64_t ote__sim_rnr_naks;

uint64_t ote_sim_rnr_naks(void) { return atomic_load(&ote__sim_rnr_naks); }

int ote_sim_device_count(const ote_verbs_t *v) {
    if (!ote_sim_is_sim(v)) return 0;
    return ((const sim_prov_t *)v->priv)->cfg.ndev;
}

ote_status_t ote_sim_qp_paths(const ote_verbs_t *v, ote_sim_qp_path_t *out, size_t cap,
                              size_t *n_out) {
    if (!ote_sim_is_sim(v) || !n_out || (cap > 0 && !out)) return OTE_ERR_INVALID;
    sim_prov_t *p = to_sim_prov((ote_verbs_t *)v);
    size_t n = 0;
    ote_mutex_lock(&p->mu);
    sim_qp_t *qp;
    DL_FOREACH2(p->qp_list, qp, next) {
        if (qp->state != IBV_QPS_RTR && qp->state != IBV_QPS_RTS && qp->state != IBV_QPS_SQD)
            continue;
        if (n < cap) {
            ote_sim_qp_path_t *o = &out[n];
            memset(o, 0, sizeof(*o));
            snprintf(o->dev, sizeof(o->dev), "%s", qp->ctx->dev->ibdev.name);
            o->qp_num = qp->ibqp.qp_num;
            o->state = qp->state;
            o->sgid_index = qp->attr.ah_attr.grh.sgid_index;
            o->traffic_class = qp->attr.ah_attr.grh.traffic_class;
            o->sl = qp->attr.ah_attr.sl;
            o->path_mtu = qp->attr.path_mtu;
        }
        n++;
    }
    ote_mutex_unlock(&p->mu);
    *n_out = n;
    return OTE_OK;
}

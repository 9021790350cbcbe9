/*
 * engine/rdma/rdma.c - the RDMA transport's lifecycle: creation (provider, contexts,
 * buffer manager, lanes and their workers, grant manager, endpoint store, monitor
 * thread; control connections come from the engine's listener), teardown, the monitor
 * thread (async events, grant and notification deadlines, endpoint reclaim, reaping of
 * ended server threads), the engine's registration hooks and the transport ops table.
 * What the transport owns, its control-plane rules and its lock order are described in
 * rdma_internal.h; each job lives in its own file there.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/log.h"
#include "engine/rdma/rdma_internal.h"
#include "engine/rdma/test_hook.h"

static _Atomic uint64_t ote__rdma_retained_transports;
ote_status_t (*ote__rdma_test_verbs_hook)(ote_verbs_t **v);
uint64_t ote__rdma_retained_transports_get(void) {
    return atomic_load(&ote__rdma_retained_transports);
}

/* ---- registrations (engine hooks) ------------------------------------------------ */

static ote_status_t rdma_mem_register(ote__transport_t *t, void *addr, size_t len, unsigned perms) {
    rdma_tp_t *tp = (rdma_tp_t *)t;
    (void)perms; /* permissions are enforced per grant against the engine's registry */
    reg_ent_t *r = ote_calloc(1, sizeof(*r));
    if (r == NULL) return OTE_ERR_NOMEM;
    /* Local-only and MW-bindable: a peer reaches it only through a grant's window. */
    ote_status_t st = ote_buffer_register(tp->bm, addr, len,
                                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND, &r->buf);
    if (st != OTE_OK) {
        ote_free(r);
        OTE_WARN("rdma", "registration of [%p, +%zu) failed: %s", addr, len, ote_status_str(st));
        return st;
    }
    r->addr = addr;
    ote_mutex_lock(&tp->mu);
    r->next = tp->regs;
    tp->regs = r;
    ote_mutex_unlock(&tp->mu);
    return OTE_OK;
}

static ote_status_t rdma_mem_unregister(ote__transport_t *t, void *addr) {
    rdma_tp_t *tp = (rdma_tp_t *)t;
    ote_mutex_lock(&tp->mu);
    reg_ent_t **pp = &tp->regs;
    while (*pp != NULL && (*pp)->addr != addr) pp = &(*pp)->next;
    if (*pp == NULL) {
        ote_mutex_unlock(&tp->mu);
        return OTE_ERR_NOT_FOUND;
    }
    reg_ent_t *r = *pp;
    ote_status_t st = ote_buffer_deregister(tp->bm, r->buf);
    if (st == OTE_OK) *pp = r->next;
    ote_mutex_unlock(&tp->mu);
    if (st == OTE_OK) ote_free(r);
    return st;
}

void ote__rdma_local_info(const rdma_tp_t *tp, ote_rp_msg_t *rp, uint16_t type) {
    memset(rp, 0, sizeof(*rp));
    rp->type = type;
    rp->u.info.process = tp->process_id;
    rp->u.info.pd = tp->pd_id;
    rp->u.info.nic = ote_context_nic_id(tp->ctx);
    rp->u.info.lanes = tp->nlanes;
}

/* ---- monitor -------------------------------------------------------------------- */

static void *monitor_main(void *arg) {
    rdma_tp_t *tp = arg;
    uint64_t last_reclaim = 0;
    while (!atomic_load(&tp->stop)) {
        (void)ote_context_set_poll_events(tp->set, NULL);
        (void)ote_grant_mgr_tick(tp->gm);
        ote__rdma_notes_expire(tp);
        uint64_t now = ote_now_ns();
        if (now - last_reclaim > 50 * OTE_NSEC_PER_MSEC) {
            last_reclaim = now;
            ote__rdma_servers_reap(tp); /* closes what ended server threads left */
            (void)ote_endpoint_store_reclaim(tp->eps, ote_deadline_after(200 * OTE_NSEC_PER_MSEC),
                                             NULL);
        }
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static ote_status_t rdma_address(ote__transport_t *t, char *buf, size_t len) {
    rdma_tp_t *tp = (rdma_tp_t *)t;
    if (strlen(tp->addr) >= len) return OTE_ERR_TOO_BIG;
    memcpy(buf, tp->addr, strlen(tp->addr) + 1);
    return OTE_OK;
}

/* ---- lifecycle ------------------------------------------------------------------- */

static void teardown(rdma_tp_t *tp) {
    atomic_store(&tp->stop, 1);
    /* One server connection thread that does not end within the bound is still using
     * tp: then nothing is freed (the transport is retained, counted in
     * ote__rdma_retained_transports, and logged), never freed under a running thread. */
    uint64_t wait_ms = tp->cfg.connect_timeout_ms + 10000;
    size_t stuck = ote__rdma_servers_stop(tp, wait_ms);
    if (stuck != 0) {
        atomic_fetch_add(&ote__rdma_retained_transports, 1);
        OTE_ERROR("rdma",
                  "%zu control connection thread(s) did not end within %llu ms: the "
                  "transport and everything it owns are retained (not freed)",
                  stuck, (unsigned long long)wait_ms);
        return;
    }
    if (tp->gm != NULL) {
        /* Let in-flight grants end (their own deadlines bound this). */
        ote_deadline_t gdl =
            ote_deadline_after((tp->cfg.transfer_timeout_ms + 2000) * OTE_NSEC_PER_MSEC);
        while (ote_grant_mgr_tick(tp->gm) > 0 && !ote_deadline_expired(gdl)) {
            struct timespec ts = {0, 2 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    if (tp->monitor_started) pthread_join(tp->monitor, NULL);
    if (tp->eps != NULL &&
        ote_endpoint_store_destroy(tp->eps, ote_deadline_after(2 * OTE_NSEC_PER_SEC)) != OTE_OK)
        OTE_ERROR("rdma", "endpoint store retained at shutdown (QPs that would not die)");
    if (tp->gm != NULL && ote_grant_mgr_destroy(tp->gm) != OTE_OK)
        OTE_ERROR("rdma", "grant manager retained at shutdown");
    ote__rdma_acct_end_conn(tp, NULL); /* no grant is left: every account ends */
    for (uint32_t i = 0; i < tp->nlanes; i++) {
        if (tp->lanes[i] == NULL) continue;
        if (tp->workers != NULL) (void)ote_cq_workers_remove(tp->workers, tp->lanes[i]);
        if (ote_cq_lane_destroy(tp->lanes[i]) != OTE_OK)
            OTE_ERROR("rdma", "CQ lane %u retained at shutdown", i);
    }
    if (tp->workers != NULL) (void)ote_cq_workers_stop(tp->workers);
    while (tp->regs != NULL) {
        reg_ent_t *r = tp->regs;
        tp->regs = r->next;
        if (ote_buffer_deregister(tp->bm, r->buf) != OTE_OK)
            OTE_ERROR("rdma", "MRs of [%p] retained at shutdown", r->addr);
        ote_free(r);
    }
    if (tp->bm != NULL && ote_buffer_manager_destroy(tp->bm) != OTE_OK)
        OTE_ERROR("rdma", "buffer manager retained at shutdown");
    if (tp->set != NULL && ote_context_set_close(tp->set) != OTE_OK)
        OTE_ERROR("rdma", "context set retained at shutdown");
    if (tp->v != NULL) ote_verbs_close(tp->v);
    ote_cond_destroy(&tp->cv);
    ote_mutex_destroy(&tp->mu);
    ote_free(tp);
}

static void rdma_destroy(ote__transport_t *t) { teardown((rdma_tp_t *)t); }

static const ote__transport_ops_t g_rdma_ops = {
    .name = "rdma",
    .address = rdma_address,
    .peer_open = ote__rdma_peer_open,
    .peer_ensure = ote__rdma_peer_ensure,
    .peer_max_slice = ote__rdma_peer_max_slice,
    .submit = ote__rdma_submit,
    .cancel = ote__rdma_cancel,
    .peer_close = ote__rdma_peer_close,
    .destroy = rdma_destroy,
    .mem_register = rdma_mem_register,
    .mem_unregister = rdma_mem_unregister,
    .adopt = ote__rdma_adopt,
};

/* The provider (wrapped by the test hook when set), its context set and the data
 * context: the first with an active port. OTE_ERR_NO_DEVICE (or the native error)
 * when none is usable. */
static ote_status_t open_devices(rdma_tp_t *tp) {
    const char *prov = tp->cfg.verbs_provider[0] ? tp->cfg.verbs_provider : "rdma-core";
    ote_status_t st = ote_verbs_open(prov, NULL, &tp->v);
    if (st != OTE_OK) {
        OTE_ERROR("rdma", "transport=rdma: verbs provider \"%s\" could not be opened: %s", prov,
                  ote_status_str(st));
        return st;
    }
    if (ote__rdma_test_verbs_hook != NULL) {
        st = ote__rdma_test_verbs_hook(&tp->v);
        if (st != OTE_OK) return st;
    }
    ote_context_config_t cc;
    memset(&cc, 0, sizeof(cc));
    const char *devs[1] = {tp->cfg.rdma_device};
    if (tp->cfg.rdma_device[0]) {
        cc.devices = devs;
        cc.num_devices = 1;
    }
    st = ote_context_set_open(tp->v, &cc, &tp->set);
    if (st != OTE_OK || ote_context_set_count(tp->set) == 0) {
        if (st == OTE_OK) st = OTE_ERR_NO_DEVICE;
        OTE_ERROR("rdma",
                  "transport=rdma: no usable RDMA device through provider \"%s\"%s%s: %s "
                  "(no fallback to tcp)",
                  prov, tp->cfg.rdma_device[0] ? " named " : "", tp->cfg.rdma_device,
                  ote_status_str(st));
        if (ote_status_code(st) != OTE_ERR_NO_DEVICE && ote_status_code(st) != OTE_ERR_NATIVE)
            st = OTE_ERR_NO_DEVICE;
        return st;
    }
    /* Data path: the first active context. */
    for (size_t i = 0; i < ote_context_set_count(tp->set) && tp->ctx == NULL; i++) {
        ote_context_t *c = ote_context_set_get(tp->set, i);
        if (ote_context_check(c) == OTE_OK) tp->ctx = c;
    }
    if (tp->ctx == NULL) {
        OTE_ERROR("rdma", "transport=rdma: every device of provider \"%s\" has its port down",
                  prov);
        return OTE_ERR_NO_DEVICE;
    }
    return OTE_OK;
}

/* nlanes CQ lanes on the data context, one worker each, on the NIC's NUMA node. */
static ote_status_t start_lanes(rdma_tp_t *tp, const ote_context_info_t *info) {
    uint32_t want = tp->cfg.tcp_workers;
    tp->nlanes = want < 2 ? 2 : (want > OTE__RDMA_MAX_LANES ? OTE__RDMA_MAX_LANES : want);
    ote_status_t st = ote_cq_workers_start_numa(
        tp->nlanes, info->numa_node >= 0 ? info->numa_node : -1, &tp->workers);
    if (st != OTE_OK) return st;
    for (uint32_t i = 0; i < tp->nlanes; i++) {
        ote_cq_lane_config_t lc = {
            .index = i, .send_depth = 4096, .recv_depth = 4096, .use_channel = 1};
        st = ote_cq_lane_create(tp->ctx, &lc, &tp->lanes[i]);
        if (st == OTE_OK) st = ote_cq_workers_add(tp->workers, tp->lanes[i]);
        if (st != OTE_OK) return st;
    }
    return OTE_OK;
}

ote_status_t ote__rdma_create(const ote__cfg_t *cfg, const ote__host_t *host,
                              ote__transport_t **tp_out) {
    rdma_tp_t *tp = ote_calloc(1, sizeof(*tp));
    if (tp == NULL) return OTE_ERR_NOMEM;
    tp->base.ops = &g_rdma_ops;
    tp->cfg = *cfg;
    tp->host = *host;
    if (host->self_addr == NULL || strlen(host->self_addr) >= sizeof(tp->addr)) {
        ote_free(tp);
        return OTE_ERR_INVALID;
    }
    snprintf(tp->addr, sizeof(tp->addr), "%s", host->self_addr);
    ote_status_t st = ote_mutex_init(&tp->mu);
    if (st != OTE_OK) {
        ote_free(tp);
        return st;
    }
    st = ote_cond_init(&tp->cv);
    if (st != OTE_OK) {
        ote_mutex_destroy(&tp->mu);
        ote_free(tp);
        return st;
    }
    st = open_devices(tp);
    if (st != OTE_OK) goto err;
    st = ote_buffer_manager_create(tp->set, &tp->bm);
    if (st != OTE_OK) goto err;
    /* Lane workers run on the CPUs of the data NIC's NUMA node (unbound when unknown). */
    ote_context_info_t info;
    ote_context_get_info(tp->ctx, &info);
    st = start_lanes(tp, &info);
    if (st != OTE_OK) goto err;
    ote_grant_source_ops_t src = ote__rdma_source_ops(tp);
    st = ote_grant_mgr_create(tp->ctx, tp->lanes, tp->nlanes, &src, &tp->gm);
    if (st != OTE_OK) goto err;
    ote_qp_config_t qc;
    ote_qp_config_default(&qc);
    qc.max_send_wr = 256;
    qc.recv_slots = 64; /* grant receipts (SEND_WITH_INV) land here */
    qc.recv_size = 64;
    qc.on_recv = ote__rdma_src_on_recv;
    qc.recv_arg = tp;
    st = ote_endpoint_store_create(tp->ctx, tp->lanes, tp->nlanes, &qc, &tp->eps);
    if (st != OTE_OK) goto err;
    tp->process_id = ((uint64_t)getpid() << 32) ^ ote_now_ns() ^ (uint64_t)(uintptr_t)tp;
    tp->pd_id = (uint64_t)(uintptr_t)ote_context_pd(tp->ctx) ^ tp->process_id;
    if (pthread_create(&tp->monitor, NULL, monitor_main, tp) != 0) {
        st = OTE_ERR_NOMEM;
        goto err;
    }
    tp->monitor_started = 1;
    OTE_INFO("rdma",
             "transport=rdma over \"%s\": data context %s port %u GID index %d, %u lanes, "
             "serving %s",
             tp->v->provider, info.name, info.port, info.gid_index, tp->nlanes, tp->addr);
    *tp_out = &tp->base;
    return OTE_OK;
err:
    teardown(tp);
    return st;
}

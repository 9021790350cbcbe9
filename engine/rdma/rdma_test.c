/*
 * engine/rdma/rdma_test.c - the test-only library //engine/rdma:testing (never in
 * liborbitte.so): what engine/rdma/test_hook.h reads. It installs the transport's `track`
 * hook (rdma_hooks.h) before main, so the live transports of this process are linked from
 * creation until their teardown begins, found by the engine they serve, and their grant
 * and endpoint counters read.
 */
#include <pthread.h>
#include <string.h>

#include "base/lock.h"
#include "engine/rdma/rdma_credits.h"
#include "engine/rdma/rdma_internal.h"
#include "engine/rdma/rdma_src_parents.h"
#include "engine/rdma/test_hook.h"

static ote_mutex_t g_track_mu = {PTHREAD_MUTEX_INITIALIZER};
static rdma_tp_t *g_track; /* linked by live_next */

static void track(rdma_tp_t *tp, int on) {
    ote_mutex_lock(&g_track_mu);
    rdma_tp_t **pp = &g_track;
    while (*pp != NULL && *pp != tp) pp = &(*pp)->live_next;
    if (on && *pp == NULL) {
        tp->live_next = g_track;
        g_track = tp;
    } else if (!on && *pp == tp) {
        *pp = tp->live_next;
        tp->live_next = NULL;
    }
    ote_mutex_unlock(&g_track_mu);
}

__attribute__((constructor)) static void install(void) { ote__rdma_hooks.track = track; }

ote_status_t ote__rdma_test_grants(const char *engine_addr, ote__rdma_test_grants_t *out) {
    if (engine_addr == NULL || out == NULL) return OTE_ERR_INVALID;
    ote_status_t st = OTE_ERR_NOT_FOUND;
    ote_mutex_lock(&g_track_mu);
    for (rdma_tp_t *tp = g_track; tp != NULL; tp = tp->live_next) {
        if (strcmp(tp->addr, engine_addr) != 0) continue;
        ote__rdma_test_grants_t r;
        memset(&r, 0, sizeof(r));
        for (uint32_t k = 0; k < tp->nnics; k++) {
            ote_grant_stats_t gs;
            ote_grant_mgr_get_stats(tp->nics[k].gm, &gs);
            r.live_source += gs.live_source;
            r.live_requester += gs.live_requester;
            r.released += gs.released;
            r.abandoned += gs.abandoned;
            r.receipts += gs.receipts;
            r.src_rq_busy += gs.rq_busy;
        }
        r.rel_sent = atomic_load(&tp->rel_sent);
        r.rel_applied = atomic_load(&tp->rel_applied);
        r.rel_ignored = atomic_load(&tp->rel_ignored);
        r.starts_inline = atomic_load(&tp->starts_inline);
        r.starts_pumped = atomic_load(&tp->starts_pumped);
        r.inflight_now = atomic_load(&tp->inflight_all);
        r.inflight_peak = atomic_load(&tp->inflight_peak);
        r.cap_waits = atomic_load(&tp->cap_waits);
        r.qp_builds = atomic_load(&tp->qp_builds);
        rdma_credit_stats_t cs;
        ote__rdma_credit_stats(tp, &cs);
        r.grants_live = cs.grants_live;
        r.grants_peak = cs.grants_peak;
        r.grants_reserved = cs.reserved;
        r.reserved_peak = cs.reserved_peak;
        r.parents = cs.parents;
        r.grant_waits = cs.grant_waits;
        r.busy_retries = cs.busy_retries;
        r.qps = cs.qps;
        r.qp_waits = cs.qp_waits;
        r.qp_evictions = cs.qp_evictions;
        r.qps_peak = cs.qps_peak;
        r.src_qp_evictions = cs.src_qp_evictions;
        r.src_qp_refusals = cs.src_qp_refusals;
        r.sq_in_use = cs.sq_in_use;
        r.sq_peak = cs.sq_peak;
        r.sq_waits = cs.sq_waits;
        rdma_sp_stats_t sp;
        ote__rdma_sp_stats(tp, &sp);
        r.src_rq_busy += sp.rq_refused;
        r.sp_parents = sp.parents;
        r.sp_credits = sp.credits;
        r.sp_credits_peak = sp.credits_peak;
        r.sp_rq = sp.rq;
        r.sp_rq_peak = sp.rq_peak;
        r.sp_refused = sp.refused;
        r.sp_busy = sp.busy;
        r.sp_served = sp.served;
        r.sp_per_grant = sp.per_grant;
        r.sp_bad = sp.bad;
        r.sp_ended = sp.ended;
        r.src_copies = (uint64_t)atomic_load(&tp->src_copies);
        r.src_stages = (uint64_t)atomic_load(&tp->src_stages);
        r.src_stage_mrs = atomic_load(&tp->stage_mrs_made);
        r.src_stage_tmp_mrs = atomic_load(&tp->stage_tmp_mrs);
        r.direct_mrs = atomic_load(&tp->direct_mrs);
        r.direct_served = atomic_load(&tp->direct_served);
        r.direct_redirects = atomic_load(&tp->direct_redirects);
        r.direct_followed = atomic_load(&tp->direct_followed);
        r.direct_recalled = atomic_load(&tp->direct_recalled);
        r.grant_mode_mr = tp->grant_mode == OTE__RDMA_GRANT_MR;
        r.direct_released = atomic_load(&tp->direct_released);
        r.direct_host_served = atomic_load(&tp->direct_host_served);
        r.lane_replacements = atomic_load(&tp->lane_replacements);
        r.lane_fenced_qps = atomic_load(&tp->lane_fenced_qps);
        r.route_fenced_qps = atomic_load(&tp->route_fenced_qps);
        r.device_reopens = atomic_load(&tp->device_reopens);
        r.device_reopen_failures = atomic_load(&tp->device_reopen_failures);
        r.sel_resyncs = atomic_load(&tp->sel_resyncs);
        r.mrs_retained = tp->bm != NULL ? ote_buffer_manager_retained(tp->bm) : 0;
        r.mrs_single = tp->bm != NULL ? ote_buffer_manager_single(tp->bm) : 0;
        for (uint32_t k = 0; k < tp->nnics; k++) {
            if (tp->nics[k].deps == NULL) continue;
            ote_endpoint_stats_t es;
            ote_endpoint_store_stats(tp->nics[k].deps, &es);
            r.direct_pds += es.pds_live;
            r.direct_qps += es.built - es.destroyed;
        }
        *out = r;
        st = OTE_OK;
        break;
    }
    ote_mutex_unlock(&g_track_mu);
    return st;
}

ote_status_t ote__rdma_test_selector_out(const char *engine_addr, uint32_t k) {
    if (engine_addr == NULL) return OTE_ERR_INVALID;
    ote_status_t st = OTE_ERR_NOT_FOUND;
    ote_mutex_lock(&g_track_mu);
    for (rdma_tp_t *tp = g_track; tp != NULL; tp = tp->live_next) {
        if (strcmp(tp->addr, engine_addr) != 0) continue;
        st = k < tp->nnics ? ote_selector_set_active(tp->sel, (int)k, 0) : OTE_ERR_INVALID;
        break;
    }
    ote_mutex_unlock(&g_track_mu);
    return st;
}

uint64_t ote__rdma_test_endpoints(const void *engine) {
    uint64_t n = 0;
    ote_mutex_lock(&g_track_mu);
    for (rdma_tp_t *tp = g_track; tp != NULL; tp = tp->live_next) {
        if (tp->host.arg != engine) continue;
        for (uint32_t i = 0; i < tp->nnics; i++) {
            /* The plain store, and the direct one (a source's exact-MR grants). */
            ote_endpoint_store_t *stores[2] = {tp->nics[i].eps, tp->nics[i].deps};
            for (int k = 0; k < 2; k++) {
                if (stores[k] == NULL) continue;
                ote_endpoint_stats_t es;
                ote_endpoint_store_stats(stores[k], &es);
                n += es.endpoints;
            }
        }
    }
    ote_mutex_unlock(&g_track_mu);
    return n;
}

/*
 * engine/rdma/test_hook.h - what tests of the RDMA transport may reach inside it: the
 * header of the test-only library //engine/rdma:testing (never in liborbitte.so).
 *
 * ote__rdma_test_verbs_hook / ote__rdma_test_distance: the transport's hooks
 * (rdma_hooks.h: wrap_verbs, distance) under the names tests use; set them before
 * ote_engine_create() and clear them after.
 *
 * ote__rdma_retained_transports_get (rdma_hooks.h): transports retained now.
 *
 * ote__rdma_test_grants: the grant counters (and the requester's start and QP build
 * counters) of the RDMA transport of the engine whose
 * address (ote_engine_address) is engine_addr, summed over its data devices, read now;
 * OTE_ERR_NOT_FOUND when no live RDMA transport of this process serves that address.
 * Call it only while that engine exists.
 *
 * ote__rdma_test_endpoints: the endpoints (requester and source, plain and direct, every
 * data device) that the RDMA transport of the engine (an ote_engine_t *) holds now,
 * evicted ones not yet freed included; 0 for an engine without one. Any thread.
 */
#ifndef OTE_ENGINE_RDMA_TEST_HOOK_H
#define OTE_ENGINE_RDMA_TEST_HOOK_H

#include <stdint.h>

#include "base/status.h"
#include "engine/rdma/rdma_hooks.h"
#include "verbs/verbs.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ote__rdma_test_verbs_hook (ote__rdma_hooks.wrap_verbs)
#define ote__rdma_test_distance (ote__rdma_hooks.distance)
uint64_t ote__rdma_test_endpoints(const void *engine);

typedef struct {
    uint64_t live_source;    /* source grants live (window bound or binding) */
    uint64_t live_requester; /* requester grants live */
    uint64_t receipts;       /* source grants ended by their requester's receipt */
    uint64_t released;       /* source grants ended by a RELEASE */
    uint64_t abandoned;      /* requester grants that failed after their answer */
    uint64_t rel_sent;       /* RELEASE messages sent (requester) */
    uint64_t rel_applied;    /* RELEASE messages that ended a grant (source) */
    uint64_t rel_ignored;    /* RELEASE messages that named no bound grant (source) */
    uint64_t starts_inline;  /* requester runs started by the submitting thread */
    uint64_t starts_pumped;  /* requester runs started by the pump thread */
    uint64_t qp_builds;      /* requester QP builds (always by the pump thread) */
    uint64_t inflight_now;   /* requester bytes in flight, every peer and device */
    uint64_t inflight_peak;  /* the most there have been at once */
    uint64_t cap_waits;      /* runs that waited queued for room under rdma_max_inflight */
    /* Credits and aggregate limits (engine/rdma/rdma_credits.h). */
    uint64_t grants_live;     /* requester grants (runs) started and not yet ended */
    uint64_t grants_peak;     /* the most at once */
    uint64_t grants_reserved; /* grant credits reserved by requests now (rdma_max_grants) */
    uint64_t reserved_peak;   /* the most reserved at once */
    uint64_t parents;         /* requests holding a reservation or queued slices */
    uint64_t grant_waits;     /* runs that waited queued for grant credits */
    uint64_t busy_retries;    /* runs asked again after a source refused them AGAIN */
    uint64_t src_rq_busy;     /* source: grants refused AGAIN for want of a receive slot */
    uint64_t qps;             /* QPs the engine holds now (every device, peer and role) */
    uint64_t qp_waits;        /* requester QP builds that waited under rdma_max_qps */
    uint64_t qp_evictions;    /* idle requester QPs retired to make room under it */
    /* rdma_max_qps: the most QPs held right after a build (either role); idle source QPs
     * retired for a CONNECT under it; source CONNECTs refused AGAIN under it. */
    uint64_t qps_peak, src_qp_evictions, src_qp_refusals;
    /* rdma_max_send_wrs: send credits held now, the most held at once, posts that waited. */
    uint64_t sq_in_use, sq_peak, sq_waits;
    /* GPUDirect source grants (rdma_direct.c): exact MRs not deregistered yet (live or
     * retained), grants served by one, redirects sent (source) and followed (requester),
     * private PDs and QPs of the direct endpoints alive now (source). */
    uint64_t direct_mrs, direct_served, direct_redirects, direct_followed;
    /* The transport's buffer manager (context/buffers.h): MRs retained now (a dereg
     * failed: registrations' and orphans, exact MRs of grants among them), and single MRs
     * held now (temporary, bounce, pool chunk and exact MRs). */
    uint64_t mrs_retained, mrs_single;
    uint64_t direct_pds, direct_qps;
    /* Source: whole-parent reservations (rdma_src_parents.h): parents holding one now;
     * grant credits and receive slots they reserved now and the most at once; first
     * grants refused (no whole reservation; src_rq_busy counts those refused for want of
     * receive slots too); grants refused while their parent's credits were all live;
     * grants served on a slot of their parent, or admitted per grant; trailers refused;
     * reservations returned. */
    uint64_t sp_parents, sp_credits, sp_credits_peak, sp_rq, sp_rq_peak;
    uint64_t sp_refused, sp_busy, sp_served, sp_per_grant, sp_bad, sp_ended;
    /* Requester runs sent to a direct slot first: their request, or a request whose remote
     * range they start in, was redirected before. */
    uint64_t direct_recalled;
    /* Source: staged grants whose copy into their bounce (or a WRITE's back out of it)
     * runs now (rdma_source.c, rdma_stage.c); bounce buffers with their MR held now. */
    uint64_t src_copies;
    uint64_t src_stages;
    uint64_t src_stage_mrs;     /* kept bounces' MRs registered so far (rdma_stage_mrs.c) */
    uint64_t src_stage_tmp_mrs; /* temporary MRs over one grant's bounce, so far */
    /* rdma_grant_mode (rdma_direct.c): 1 when this source grants host memory by exact
     * MRs; exact MRs deregistered in all (direct_served - direct_released ==
     * direct_mrs), and those of direct_served over host memory. */
    uint64_t grant_mode_mr, direct_released, direct_host_served;
    /* The monitor's recoveries (rdma_monitor.c): CQ lanes replaced after a lane error, QPs
     * fenced because their lane failed, QPs fenced because their route changed. */
    uint64_t lane_replacements, lane_fenced_qps, route_fenced_qps;
    /* Devices reopened after a lost event consumer, and reopens that failed
     * (rdma_reopen.c). */
    uint64_t device_reopens, device_reopen_failures;
    /* Devices put back in the selector by the pump before the monitor's pass (rdma_pump.c). */
    uint64_t sel_resyncs;
} ote__rdma_test_grants_t;
ote_status_t ote__rdma_test_grants(const char *engine_addr, ote__rdma_test_grants_t *out);
/* Take data device k of the engine at engine_addr out of its selector, as if its port had
 * just come back and the monitor's device pass had not followed yet. */
ote_status_t ote__rdma_test_selector_out(const char *engine_addr, uint32_t k);

#ifdef __cplusplus
}
#endif
#endif

/*
 * engine/rdma/rdma_build.c - the QP build the pump thread owes a requester peer
 * (p->build, rdma_internal.h): its state and every transition of it, one function each.
 * A run that finds no READY QP asks a build and goes back to the queue (rdma_requester.c);
 * the pump thread alone begins and ends builds (rdma_pump.c). Every function here is
 * called with p->mu held and neither waits nor sends.
 *
 * Only one thread pumps a peer at a time, and asks come only from a pump (start_on), so
 * no ask can come while the pump thread has a build UNDER_WAY; the transitions still
 * keep an ask made then (as the flags they replace did), and ote__rdma_build_end leaves
 * the state alone unless it is still UNDER_WAY.
 */
#include "engine/rdma/rdma_internal.h"

void ote__rdma_build_ask(ote__tpeer_t *p, uint32_t k, uint32_t cap, uint32_t slot, int for_run) {
    ote__rdma_build_t *b = &p->build;
    if (ote__rdma_build_wanted(p)) { /* one build at a time: this one folds into it */
        if (for_run) b->state = OTE__RDMA_BUILD_WANTED_FOR_RUN;
        return;
    }
    b->state = for_run ? OTE__RDMA_BUILD_WANTED_FOR_RUN : OTE__RDMA_BUILD_WANTED;
    b->k = k;
    b->cap = cap;
    b->slot = slot;
}

void ote__rdma_build_drop(ote__tpeer_t *p) {
    if (ote__rdma_build_wanted(p)) p->build.state = OTE__RDMA_BUILD_IDLE;
}

void ote__rdma_build_begin(ote__tpeer_t *p, ote__rdma_build_job_t *job) {
    ote__rdma_build_t *b = &p->build;
    job->k = b->k;
    job->cap = b->cap;
    job->slot = b->slot;
    job->for_run = b->state == OTE__RDMA_BUILD_WANTED_FOR_RUN;
    b->state = OTE__RDMA_BUILD_UNDER_WAY;
}

void ote__rdma_build_end(ote__tpeer_t *p, const ote__rdma_build_job_t *job, ote_status_t st) {
    ote__rdma_build_t *b = &p->build;
    if (st == OTE_OK) b->src_refused = 0;
    if (st != OTE_OK && job->for_run) { /* the waiting run ends with it (start_on) */
        b->fail_st = st;
        b->fail_k = job->k;
        b->fail_cap = job->cap;
    }
    if (b->state == OTE__RDMA_BUILD_UNDER_WAY) b->state = OTE__RDMA_BUILD_IDLE;
}

/* cap and fail_cap are endpoint indexes (rdma_pairing.h: the peer's device and the
 * capability). A cache miss is the peer's, not the device's: it is owed to the run of the
 * same capability on whichever pair it picked now (else, with two devices, a run that
 * misses on every CONNECT would alternate between them, building for ever). */
int ote__rdma_build_failure_take(ote__tpeer_t *p, uint32_t k, uint32_t cap, ote_status_t *st_out) {
    ote__rdma_build_t *b = &p->build;
    int miss = b->fail_st == OTE__RDMA_CACHE_MISS;
    if (b->fail_st == OTE_OK || OTE__RDMA_EPI_CAP(b->fail_cap) != OTE__RDMA_EPI_CAP(cap)) return 0;
    if (!miss && (b->fail_k != k || b->fail_cap != cap)) return 0;
    *st_out = b->fail_st;
    b->fail_st = OTE_OK;
    return 1;
}

void ote__rdma_build_round_end(ote__tpeer_t *p) {
    if (!ote__rdma_build_wanted(p)) p->build.fail_st = OTE_OK;
}

void ote__rdma_build_flush_ask(ote__tpeer_t *p, uint32_t k, uint32_t cap) {
    p->build.miss_flush[k][cap] = 1;
}

int ote__rdma_build_flush_take(ote__tpeer_t *p, uint32_t k, uint32_t cap) {
    int flush = p->build.miss_flush[k][cap];
    p->build.miss_flush[k][cap] = 0;
    return flush;
}

void ote__rdma_build_src_refused(ote__tpeer_t *p) { p->build.src_refused = 1; }

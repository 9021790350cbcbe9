/*
 * qp/sq_pool.c - send credits shared by many QPs (qp.h: ote_sq_pool_t). The send queue
 * (send_queue.c) takes them at admission and gives them back as its WR entries leave.
 */
#include <stdatomic.h>

#include "base/alloc.h"
#include "qp/qp_internal.h"

struct ote_sq_pool {
    uint32_t limit;
    _Atomic uint64_t in_use, peak, waits;
};

ote_status_t ote_sq_pool_create(uint32_t limit, ote_sq_pool_t **pool_out) {
    if (pool_out == NULL || limit == 0) return OTE_ERR_INVALID;
    ote_sq_pool_t *p = ote_calloc(1, sizeof(*p));
    if (p == NULL) return OTE_ERR_NOMEM;
    p->limit = limit;
    *pool_out = p;
    return OTE_OK;
}

void ote_sq_pool_destroy(ote_sq_pool_t *pool) { ote_free(pool); }

void ote_sq_pool_get_stats(ote_sq_pool_t *pool, ote_sq_pool_stats_t *out) {
    out->in_use = atomic_load(&pool->in_use);
    out->peak = atomic_load(&pool->peak);
    out->waits = atomic_load(&pool->waits);
}

size_t ote__sq_pool_take(ote_sq_pool_t *pool, size_t n) {
    if (pool == NULL) return n;
    uint64_t cur = atomic_load(&pool->in_use), got;
    do {
        uint64_t room = cur < pool->limit ? pool->limit - cur : 0;
        got = n < room ? n : room;
        if (got == 0) break;
    } while (!atomic_compare_exchange_weak(&pool->in_use, &cur, cur + got));
    if (got < n) atomic_fetch_add(&pool->waits, 1);
    if (got == 0) return 0;
    uint64_t now = cur + got, peak = atomic_load(&pool->peak);
    while (now > peak && !atomic_compare_exchange_weak(&pool->peak, &peak, now)) {}
    return (size_t)got;
}

void ote__sq_pool_put(ote_sq_pool_t *pool, size_t n) {
    if (pool != NULL && n != 0) atomic_fetch_sub(&pool->in_use, n);
}

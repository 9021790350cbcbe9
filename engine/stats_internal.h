/*
 * engine/stats_internal.h - the engine's statistics (engine/stats.c): what the data path
 * adds to a segment's counters (inline: relaxed atomic adds, no lock), and the list of
 * open segments that ote_engine_stats sums (segment open and close).
 */
#ifndef OTE_ENGINE_STATS_INTERNAL_H
#define OTE_ENGINE_STATS_INTERNAL_H

#ifndef OTE__INSIDE_ENGINE
#error "engine/stats_internal.h is internal to OrbitTE's engine; include <ote/ote.h> instead"
#endif

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/core_internal.h"

#define OTE__RELAXED memory_order_relaxed

/* A request of opcode op and len bytes was submitted to c's segment (before it can end). */
static inline void ote__stats_submitted(ote__counters_t *c, int op, uint64_t len) {
    atomic_fetch_add_explicit(&c->submitted[op], 1, OTE__RELAXED);
    atomic_fetch_add_explicit(&c->submitted_bytes, len, OTE__RELAXED);
}

/* The slot of a latency of ns nanoseconds: 0 under 1 us, else the bit length of its
 * whole microseconds u (2^(i-1) <= u < 2^i for slot i): the highest set bit of 2u + 1,
 * without a branch. 2u + 1 is ns / 500 with its low bit set; clz ^ 63 is that bit's
 * index (one bsr). */
static inline size_t ote__stats_slot(uint64_t ns) {
    return (size_t)(__builtin_clzll(ns / 500u | 1u) ^ 63);
}

/* A slice of len bytes of a request of c's segment failed: those bytes will not move. */
static inline void ote__stats_unmoved(ote__counters_t *c, uint64_t len) {
    atomic_fetch_add_explicit(&c->unmoved, len, OTE__RELAXED);
}

/* A request of c's segment ended in `state` (an ended ote_transfer_state_t) after moving
 * done bytes, ns after its submit: three adds when it completed (its slot counts it). */
static inline void ote__stats_ended(ote__counters_t *c, int op, int state, uint64_t done,
                                    uint64_t ns) {
    size_t slot = ote__stats_slot(ns);
    if (__builtin_expect(state == OTE_TRANSFER_COMPLETED, 1)) {
        atomic_fetch_add_explicit(&c->done_us[slot][op], 1, OTE__RELAXED);
    } else {
        atomic_fetch_add_explicit(&c->other[state - OTE_TRANSFER_FAILED][op], 1, OTE__RELAXED);
        atomic_fetch_add_explicit(&c->other_us[slot], 1, OTE__RELAXED);
    }
    atomic_fetch_add_explicit(&c->bytes[op], done, OTE__RELAXED);
    atomic_fetch_add_explicit(&c->lat_ns_sum, ns, OTE__RELAXED);
}

/* The ote_transport_id_t of a transport's name ("shm", "tcp", "rdma"). */
uint32_t ote__stats_transport_id(const char *name);
/* A segment opened (its tpid set): on the engine's list until ote__stats_detach. */
void ote__stats_attach(ote_engine_t *e, ote_segment_t *s);
/* A segment closes (nothing of it in flight): its counters are folded into the engine's
 * closed ones of its transport, and it leaves the list. */
void ote__stats_detach(ote_engine_t *e, ote_segment_t *s);

#endif

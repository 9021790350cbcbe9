/*
 * tests/engine/stats_slot_check.c - engine/stats_internal.h's data-path helpers seen from
 * C (the header's _Atomic counters are C11 only), for stats_slot_test.cc: the latency slot
 * of a duration, and where ote__stats_ended and ote__stats_submitted count.
 */
#include <stdint.h>
#include <string.h>

#include "engine/stats_internal.h"

unsigned ote_test_stats_slot(uint64_t ns) { return (unsigned)ote__stats_slot(ns); }

/* Counters after one call of each kind: a READ submitted (len bytes), a READ completed
 * after ns, a WRITE ended in `state` after ns; out: submitted[2], submitted_bytes,
 * done_us[slot][op] for op 0 and 1, other[state - FAILED][1], other_us[slot], bytes[2],
 * lat_ns_sum (11 values). */
void ote_test_stats_counts(uint64_t len, uint64_t ns, int state, uint64_t out[11]) {
    static ote__counters_t c;
    memset(&c, 0, sizeof(c));
    ote__stats_submitted(&c, OTE_READ, len);
    ote__stats_ended(&c, OTE_READ, OTE_TRANSFER_COMPLETED, len, ns);
    ote__stats_ended(&c, OTE_WRITE, state, len / 2, ns);
    size_t slot = ote__stats_slot(ns);
    uint64_t v[11] = {
        c.submitted[OTE_READ],
        c.submitted[OTE_WRITE],
        c.submitted_bytes,
        c.done_us[slot][OTE_READ],
        c.done_us[slot][OTE_WRITE],
        state == OTE_TRANSFER_COMPLETED ? 0 : c.other[state - OTE_TRANSFER_FAILED][OTE_WRITE],
        c.other_us[slot],
        c.bytes[OTE_READ],
        c.bytes[OTE_WRITE],
        c.lat_ns_sum,
        0,
    };
    memcpy(out, v, sizeof(v));
}

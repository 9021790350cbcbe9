/*
 * base/retained.h - the process-wide registry of retained native owners.
 *
 * "Fallible cleanup retains": when a native destroy (PD, MR, MW, CQ, channel, QP) fails,
 * the owner keeps the object and counts it as retained. Each layer keeps its own
 * per-owner counts (a context's per-kind counters, a transport's list); every one of
 * those increments and decrements is also noted here, by kind, so that one place knows
 * how many native owners the whole process holds on to right now. The test fixture
 * (tests/util/test_base.h) reads the total at the start and the end of every test and
 * fails a test that ends with more retained owners than it declared.
 *
 * Counters only: nothing here owns or frees anything. Lock-free and thread-safe.
 */
#ifndef OTE_BASE_RETAINED_H
#define OTE_BASE_RETAINED_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Kinds of native owner that a failed destroy can leave alive. */
typedef enum {
    OTE_RETAINED_PD = 0,
    OTE_RETAINED_MR = 1,
    OTE_RETAINED_CQ = 2,
    OTE_RETAINED_CHANNEL = 3,
    OTE_RETAINED_QP = 4,
    OTE_RETAINED_MW = 5,
    OTE_RETAINED_OTHER = 6, /* an owner above the verbs objects (a transport, say) */
    OTE_RETAINED_KINDS = 7,
} ote_retained_kind_t;

/* +n when a layer retains n owners of `kind`, -n when a later destroy of them succeeds.
 * An out-of-range kind is ignored. */
void ote_retained_note(ote_retained_kind_t kind, int delta);
/* Owners of `kind` retained right now, process-wide (0 for an out-of-range kind). */
uint64_t ote_retained_count(ote_retained_kind_t kind);
/* Owners of every kind retained right now, process-wide. */
uint64_t ote_retained_total(void);
/* The kind's name ("PD", "MR", ...), "?" when out of range. */
const char *ote_retained_kind_name(ote_retained_kind_t kind);

#ifdef __cplusplus
}
#endif
#endif

#include "base/retained.h"

#include <stdatomic.h>

static _Atomic uint64_t counts[OTE_RETAINED_KINDS];

void ote_retained_note(ote_retained_kind_t kind, int delta) {
    if ((unsigned)kind >= OTE_RETAINED_KINDS || delta == 0) return;
    if (delta > 0) atomic_fetch_add(&counts[kind], (uint64_t)delta);
    else atomic_fetch_sub(&counts[kind], (uint64_t)(-(int64_t)delta));
}

uint64_t ote_retained_count(ote_retained_kind_t kind) {
    if ((unsigned)kind >= OTE_RETAINED_KINDS) return 0;
    return atomic_load(&counts[kind]);
}

uint64_t ote_retained_total(void) {
    uint64_t n = 0;
    for (int k = 0; k < OTE_RETAINED_KINDS; k++) n += atomic_load(&counts[k]);
    return n;
}

const char *ote_retained_kind_name(ote_retained_kind_t kind) {
    static const char *const names[OTE_RETAINED_KINDS] = {"PD", "MR", "CQ",   "channel",
                                                          "QP", "MW", "other"};
    if ((unsigned)kind >= OTE_RETAINED_KINDS) return "?";
    return names[kind];
}

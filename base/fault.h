/*
 * base/fault.h - named fault points.
 *
 * Library code marks places where a failure can be injected:
 *
 *     ote_status_t st;
 *     if (ote_fault_hit("qp.post_send", &st)) return st;
 *
 * Tests arm a point by name to fail the Nth hit, every hit, or every hit from the Nth
 * on, with a chosen status and errno. Hits are counted per armed point. When nothing is
 * armed a hit is one relaxed atomic load. Thread-safe.
 */
#ifndef OTE_BASE_FAULT_H
#define OTE_BASE_FAULT_H

#include <stdbool.h>
#ifndef __cplusplus
#include <stdatomic.h>
#endif
#include <stdint.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    OTE_FAULT_NTH = 0,   /* fail only hit number n (1-based) */
    OTE_FAULT_EVERY = 1, /* fail every hit (n ignored) */
    OTE_FAULT_FROM = 2,  /* fail hit n and every later hit */
} ote_fault_mode_t;

/* Arm (or re-arm, resetting its counter) the point `name`. status is the code returned
 * by the failing hit; err, if nonzero, is attached to it and stored in errno. */
ote_status_t ote_fault_arm(const char *name, ote_fault_mode_t mode, uint64_t n, int status,
                           int err);
/* Disarm one point (OTE_ERR_NOT_FOUND when not armed) or all of them. */
ote_status_t ote_fault_disarm(const char *name);
void ote_fault_disarm_all(void);
/* Hits seen by an armed point since it was armed (0 when not armed). */
uint64_t ote_fault_hits(const char *name);
/* Failures injected by an armed point since it was armed. */
uint64_t ote_fault_failures(const char *name);

bool ote__fault_hit_slow(const char *name, ote_status_t *st_out);

#ifndef __cplusplus
extern _Atomic int ote__fault_armed;
/* True when the hit must fail; then *st_out holds the status to return. */
static inline bool ote_fault_hit(const char *name, ote_status_t *st_out) {
    if (__builtin_expect(atomic_load_explicit(&ote__fault_armed, memory_order_relaxed) == 0, 1))
        return false;
    return ote__fault_hit_slow(name, st_out);
}
#else
static inline bool ote_fault_hit(const char *name, ote_status_t *st_out) {
    return ote__fault_hit_slow(name, st_out);
}
#endif

#ifdef __cplusplus
}
#endif
#endif

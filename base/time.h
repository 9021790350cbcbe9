/*
 * base/time.h - monotonic time and deadlines.
 *
 * Every wait in OrbitTE has a deadline: an absolute CLOCK_MONOTONIC time in
 * nanoseconds. Deadlines are computed once and passed down, so nested waits share one
 * budget instead of each starting its own.
 */
#ifndef OTE_BASE_TIME_H
#define OTE_BASE_TIME_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

#define OTE_NSEC_PER_USEC 1000ull
#define OTE_NSEC_PER_MSEC 1000000ull
#define OTE_NSEC_PER_SEC 1000000000ull

typedef uint64_t ote_deadline_t; /* absolute CLOCK_MONOTONIC ns */

/* Nanoseconds on CLOCK_MONOTONIC. */
static inline uint64_t ote_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * OTE_NSEC_PER_SEC + (uint64_t)ts.tv_nsec;
}

/* Deadline timeout_ns from now, saturating instead of overflowing. */
static inline ote_deadline_t ote_deadline_after(uint64_t timeout_ns) {
    uint64_t now = ote_now_ns();
    return timeout_ns > UINT64_MAX - now ? UINT64_MAX : now + timeout_ns;
}

static inline bool ote_deadline_expired(ote_deadline_t d) { return ote_now_ns() >= d; }

/* Nanoseconds left, 0 when expired. */
static inline uint64_t ote_deadline_remaining_ns(ote_deadline_t d) {
    uint64_t now = ote_now_ns();
    return d > now ? d - now : 0;
}

/* Milliseconds left for poll()/epoll_wait(), rounded up, capped at cap_ms (>= 0). */
static inline int ote_deadline_remaining_ms(ote_deadline_t d, int cap_ms) {
    uint64_t ns = ote_deadline_remaining_ns(d);
    uint64_t ms = (ns + OTE_NSEC_PER_MSEC - 1) / OTE_NSEC_PER_MSEC;
    return ms > (uint64_t)cap_ms ? cap_ms : (int)ms;
}

/* The deadline as a CLOCK_MONOTONIC timespec (for pthread_cond_timedwait). */
static inline struct timespec ote_deadline_timespec(ote_deadline_t d) {
    struct timespec ts;
    ts.tv_sec = (time_t)(d / OTE_NSEC_PER_SEC);
    ts.tv_nsec = (long)(d % OTE_NSEC_PER_SEC);
    return ts;
}

/* The earlier of two deadlines. */
static inline ote_deadline_t ote_deadline_min(ote_deadline_t a, ote_deadline_t b) {
    return a < b ? a : b;
}

#ifdef __cplusplus
}
#endif
#endif

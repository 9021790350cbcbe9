/*
 * base/lock.h - mutex and condition helpers.
 *
 * Thin wrappers over pthreads whose waits take a deadline (CLOCK_MONOTONIC), so no
 * wait in the library can hang forever. Initialisation is fallible and returns a
 * status; lock/unlock on an initialised mutex cannot fail.
 */
#ifndef OTE_BASE_LOCK_H
#define OTE_BASE_LOCK_H

#include <pthread.h>

#include "base/status.h"
#include "base/time.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    pthread_mutex_t m;
} ote_mutex_t;

typedef struct {
    pthread_cond_t c;
} ote_cond_t;

ote_status_t ote_mutex_init(ote_mutex_t *mu);
void ote_mutex_destroy(ote_mutex_t *mu);
static inline void ote_mutex_lock(ote_mutex_t *mu) { pthread_mutex_lock(&mu->m); }
static inline void ote_mutex_unlock(ote_mutex_t *mu) { pthread_mutex_unlock(&mu->m); }
/* OTE_OK when taken, OTE_ERR_BUSY when held by another thread. */
ote_status_t ote_mutex_trylock(ote_mutex_t *mu);
/* Take mu by the deadline: OTE_OK, or OTE_ERR_TIMEOUT (not taken). pthread_mutex_timedlock
 * waits on CLOCK_REALTIME: the time left is measured on CLOCK_MONOTONIC and added to it. */
ote_status_t ote_mutex_lock_until(ote_mutex_t *mu, ote_deadline_t deadline);

/* Condition variable on CLOCK_MONOTONIC. */
ote_status_t ote_cond_init(ote_cond_t *cv);
void ote_cond_destroy(ote_cond_t *cv);
static inline void ote_cond_signal(ote_cond_t *cv) { pthread_cond_signal(&cv->c); }
static inline void ote_cond_broadcast(ote_cond_t *cv) { pthread_cond_broadcast(&cv->c); }
/* Wait until signalled or the deadline passes: OTE_OK or OTE_ERR_TIMEOUT. Spurious
 * wakeups return OTE_OK; callers loop on their predicate. */
ote_status_t ote_cond_wait(ote_cond_t *cv, ote_mutex_t *mu, ote_deadline_t deadline);

#ifdef __cplusplus
}
#endif
#endif

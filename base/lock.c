#include "base/lock.h"

#include <errno.h>

#include "base/fault.h"

ote_status_t ote_mutex_init(ote_mutex_t *mu) {
    ote_status_t st;
    if (mu == NULL) return OTE_ERR_INVALID;
    if (ote_fault_hit("base.mutex_init", &st)) return st;
    int rc = pthread_mutex_init(&mu->m, NULL);
    return rc == 0 ? OTE_OK : ote_status_from_errno(rc);
}

void ote_mutex_destroy(ote_mutex_t *mu) {
    if (mu != NULL) pthread_mutex_destroy(&mu->m);
}

ote_status_t ote_mutex_trylock(ote_mutex_t *mu) {
    int rc = pthread_mutex_trylock(&mu->m);
    if (rc == 0) return OTE_OK;
    return rc == EBUSY ? OTE_ERR_BUSY : ote_status_from_errno(rc);
}

ote_status_t ote_mutex_lock_until(ote_mutex_t *mu, ote_deadline_t deadline) {
    int rc = pthread_mutex_trylock(&mu->m);
    if (rc == EBUSY) {
        uint64_t left = ote_deadline_remaining_ns(deadline);
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        uint64_t at = (uint64_t)now.tv_sec * OTE_NSEC_PER_SEC + (uint64_t)now.tv_nsec;
        if (left > UINT64_MAX - at) { /* no deadline (ote_deadline_after saturated) */
            rc = pthread_mutex_lock(&mu->m);
        } else {
            at += left;
            struct timespec ts = {(time_t)(at / OTE_NSEC_PER_SEC), (long)(at % OTE_NSEC_PER_SEC)};
            rc = pthread_mutex_timedlock(&mu->m, &ts);
        }
    }
    if (rc == 0) return OTE_OK;
    return rc == ETIMEDOUT ? OTE_ERR_TIMEOUT : ote_status_from_errno(rc);
}

ote_status_t ote_cond_init(ote_cond_t *cv) {
    ote_status_t st;
    if (cv == NULL) return OTE_ERR_INVALID;
    if (ote_fault_hit("base.cond_init", &st)) return st;
    pthread_condattr_t attr;
    int rc = pthread_condattr_init(&attr);
    if (rc != 0) return ote_status_from_errno(rc);
    rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    if (rc == 0) rc = pthread_cond_init(&cv->c, &attr);
    pthread_condattr_destroy(&attr);
    return rc == 0 ? OTE_OK : ote_status_from_errno(rc);
}

void ote_cond_destroy(ote_cond_t *cv) {
    if (cv != NULL) pthread_cond_destroy(&cv->c);
}

ote_status_t ote_cond_wait(ote_cond_t *cv, ote_mutex_t *mu, ote_deadline_t deadline) {
    struct timespec ts = ote_deadline_timespec(deadline);
    int rc = pthread_cond_timedwait(&cv->c, &mu->m, &ts);
    if (rc == 0) return OTE_OK;
    if (rc == ETIMEDOUT) return OTE_ERR_TIMEOUT;
    return ote_status_from_errno(rc);
}

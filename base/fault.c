#include "base/fault.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "base/hash.h"

typedef struct fault_point {
    char *name;
    ote_fault_mode_t mode;
    uint64_t n;
    int status;
    int err;
    uint64_t hits;
    uint64_t failures;
    UT_hash_handle hh;
} fault_point_t;

_Atomic int ote__fault_armed;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static fault_point_t *g_points;

static void point_free(fault_point_t *p) {
    ote_free(p->name);
    ote_free(p);
}

ote_status_t ote_fault_arm(const char *name, ote_fault_mode_t mode, uint64_t n, int status,
                           int err) {
    if (name == NULL || *name == '\0') return OTE_ERR_INVALID;
    if (mode != OTE_FAULT_NTH && mode != OTE_FAULT_EVERY && mode != OTE_FAULT_FROM)
        return OTE_ERR_INVALID;
    if (mode != OTE_FAULT_EVERY && n == 0) return OTE_ERR_INVALID;
    if (status == OTE_OK) return OTE_ERR_INVALID;
    ote_status_t st = OTE_OK;
    pthread_mutex_lock(&g_lock);
    fault_point_t *p = NULL;
    HASH_FIND_STR(g_points, name, p);
    if (p == NULL) {
        p = ote_calloc(1, sizeof(*p));
        if (p == NULL) {
            st = OTE_ERR_NOMEM;
            goto out;
        }
        p->name = ote_strdup(name);
        if (p->name == NULL) {
            ote_free(p);
            st = OTE_ERR_NOMEM;
            goto out;
        }
        OTE_HASH_ADD_KEYPTR(hh, g_points, p->name, strlen(p->name), p, st);
        if (st != OTE_OK) {
            point_free(p);
            goto out;
        }
        atomic_fetch_add(&ote__fault_armed, 1);
    }
    p->mode = mode;
    p->n = n;
    p->status = status;
    p->err = err;
    p->hits = 0;
    p->failures = 0;
out:
    pthread_mutex_unlock(&g_lock);
    return st;
}

ote_status_t ote_fault_disarm(const char *name) {
    if (name == NULL) return OTE_ERR_INVALID;
    pthread_mutex_lock(&g_lock);
    fault_point_t *p = NULL;
    HASH_FIND_STR(g_points, name, p);
    if (p != NULL) {
        HASH_DEL(g_points, p);
        point_free(p);
        atomic_fetch_sub(&ote__fault_armed, 1);
    }
    pthread_mutex_unlock(&g_lock);
    return p != NULL ? OTE_OK : OTE_ERR_NOT_FOUND;
}

void ote_fault_disarm_all(void) {
    pthread_mutex_lock(&g_lock);
    fault_point_t *p, *tmp;
    HASH_ITER(hh, g_points, p, tmp) {
        HASH_DEL(g_points, p);
        point_free(p);
        atomic_fetch_sub(&ote__fault_armed, 1);
    }
    pthread_mutex_unlock(&g_lock);
}

static uint64_t point_read(const char *name, int failures) {
    uint64_t v = 0;
    if (name == NULL) return 0;
    pthread_mutex_lock(&g_lock);
    fault_point_t *p = NULL;
    HASH_FIND_STR(g_points, name, p);
    if (p != NULL) v = failures ? p->failures : p->hits;
    pthread_mutex_unlock(&g_lock);
    return v;
}

uint64_t ote_fault_hits(const char *name) { return point_read(name, 0); }

uint64_t ote_fault_failures(const char *name) { return point_read(name, 1); }

bool ote__fault_hit_slow(const char *name, ote_status_t *st_out) {
    bool fail = false;
    int err = 0;
    ote_status_t st = OTE_OK;
    if (atomic_load(&ote__fault_armed) == 0 || name == NULL) return false;
    pthread_mutex_lock(&g_lock);
    fault_point_t *p = NULL;
    HASH_FIND_STR(g_points, name, p);
    if (p != NULL) {
        uint64_t hit = ++p->hits;
        switch (p->mode) {
            case OTE_FAULT_NTH: fail = hit == p->n; break;
            case OTE_FAULT_EVERY: fail = true; break;
            case OTE_FAULT_FROM: fail = hit >= p->n; break;
        }
        if (fail) {
            p->failures++;
            err = p->err;
            st = ote_status_make(p->status, err);
        }
    }
    pthread_mutex_unlock(&g_lock);
    if (fail) {
        if (err != 0) errno = err;
        if (st_out != NULL) *st_out = st;
    }
    return fail;
}

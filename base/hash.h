/*
 * base/hash.h - uthash (Debian uthash-dev) configured for library use.
 *
 * Tables allocate through the OrbitTE allocation hook and never exit() on OOM: with
 * HASH_NONFATAL_OOM a failed add leaves the table unchanged and records the failure in
 * a thread-local flag. Always add through OTE_HASH_ADD_* so the failure becomes a status.
 * Include this header instead of <uthash.h>.
 */
#ifndef OTE_BASE_HASH_H
#define OTE_BASE_HASH_H

#include "base/alloc.h"
#include "base/status.h"

#ifdef __cplusplus
extern "C" thread_local int ote__hash_oom;
#else
extern _Thread_local int ote__hash_oom;
#endif

#define HASH_NONFATAL_OOM 1
#define uthash_malloc(sz) ote_malloc(sz)
#define uthash_free(ptr, sz) ote_free(ptr)
#define uthash_nonfatal_oom(elt) (ote__hash_oom = 1)
#include <uthash.h>
#include <utlist.h>

/* Add with a key field; evaluates to OTE_OK or OTE_ERR_NOMEM (element not added). */
#define OTE_HASH_ADD(hh, head, fieldname, keylen, add, st_out) \
    do { \
        ote__hash_oom = 0; \
        HASH_ADD(hh, head, fieldname, keylen, add); \
        (st_out) = ote__hash_oom ? OTE_ERR_NOMEM : OTE_OK; \
    } while (0)

#define OTE_HASH_ADD_KEYPTR(hh, head, keyptr, keylen, add, st_out) \
    do { \
        ote__hash_oom = 0; \
        HASH_ADD_KEYPTR(hh, head, keyptr, keylen, add); \
        (st_out) = ote__hash_oom ? OTE_ERR_NOMEM : OTE_OK; \
    } while (0)

#endif

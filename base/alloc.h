/*
 * base/alloc.h - the one allocation hook of OrbitTE.
 *
 * All library allocation goes through ote_malloc()/ote_calloc()/ote_realloc()/
 * ote_free(), so a test can replace the allocator or fail the Nth allocation and sweep N
 * over a function (libuv's uv_replace_allocator + test-loop-oom pattern). uthash tables
 * use the same hook through base/hash.h.
 */
#ifndef OTE_BASE_ALLOC_H
#define OTE_BASE_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef void *(*ote_malloc_fn)(size_t size);
typedef void *(*ote_realloc_fn)(void *ptr, size_t size);
typedef void *(*ote_calloc_fn)(size_t count, size_t size);
typedef void (*ote_free_fn)(void *ptr);

/* Replace the allocator (all four, or NULL for all to restore libc). Call only while no
 * OrbitTE object is alive: memory must be freed by the allocator that made it. */
ote_status_t ote_alloc_replace(ote_malloc_fn m, ote_realloc_fn r, ote_calloc_fn c, ote_free_fn f);

void *ote_malloc(size_t size);
void *ote_calloc(size_t count, size_t size);
void *ote_realloc(void *ptr, size_t size);
void ote_free(void *ptr);
char *ote_strdup(const char *s);
/* Aligned allocation; alignment is a power of two >= sizeof(void*). Free only with
 * ote_aligned_free(). */
void *ote_aligned_alloc(size_t alignment, size_t size);
void ote_aligned_free(void *ptr);

/* Test hooks. ote_alloc_fail_nth(n): the nth allocation counted from this call fails
 * (n=1 is the next one), once; n=0 disarms. ote_alloc_fail_from(n): allocations from the
 * nth on all fail until disarmed. Thread-safe. */
void ote_alloc_fail_nth(uint64_t n);
void ote_alloc_fail_from(uint64_t n);
void ote_alloc_fail_disarm(void);
/* Number of allocation calls made (successful or not) since process start. */
uint64_t ote_alloc_calls(void);
/* Number of allocations failed by the hooks above since process start. */
uint64_t ote_alloc_injected_failures(void);

#ifdef __cplusplus
}
#endif
#endif

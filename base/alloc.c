#include "base/alloc.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static ote_malloc_fn g_malloc = malloc;
static ote_realloc_fn g_realloc = realloc;
static ote_calloc_fn g_calloc = calloc;
static ote_free_fn g_free = free;

/* Failure injection: 0 = off. g_fail_at is the absolute call number to fail. */
static _Atomic uint64_t g_calls;
static _Atomic uint64_t g_fail_at;
static _Atomic int g_fail_sticky;
static _Atomic uint64_t g_injected;

ote_status_t ote_alloc_replace(ote_malloc_fn m, ote_realloc_fn r, ote_calloc_fn c, ote_free_fn f) {
    if (m == NULL && r == NULL && c == NULL && f == NULL) {
        g_malloc = malloc;
        g_realloc = realloc;
        g_calloc = calloc;
        g_free = free;
        return OTE_OK;
    }
    if (m == NULL || r == NULL || c == NULL || f == NULL) return OTE_ERR_INVALID;
    g_malloc = m;
    g_realloc = r;
    g_calloc = c;
    g_free = f;
    return OTE_OK;
}

/* Counts the call; returns nonzero when this allocation must fail. */
static int alloc_should_fail(void) {
    uint64_t n = atomic_fetch_add_explicit(&g_calls, 1, memory_order_relaxed) + 1;
    uint64_t at = atomic_load_explicit(&g_fail_at, memory_order_relaxed);
    if (at == 0) return 0;
    int sticky = atomic_load_explicit(&g_fail_sticky, memory_order_relaxed);
    if (sticky ? n >= at : n == at) {
        atomic_fetch_add_explicit(&g_injected, 1, memory_order_relaxed);
        return 1;
    }
    return 0;
}

void *ote_malloc(size_t size) {
    if (alloc_should_fail()) return NULL;
    return g_malloc(size == 0 ? 1 : size);
}

void *ote_calloc(size_t count, size_t size) {
    if (alloc_should_fail()) return NULL;
    if (count == 0 || size == 0) count = size = 1;
    return g_calloc(count, size);
}

void *ote_realloc(void *ptr, size_t size) {
    if (alloc_should_fail()) return NULL;
    return g_realloc(ptr, size == 0 ? 1 : size);
}

void ote_free(void *ptr) {
    if (ptr != NULL) g_free(ptr);
}

char *ote_strdup(const char *s) {
    if (s == NULL) return NULL;
    size_t n = strlen(s) + 1;
    char *d = ote_malloc(n);
    if (d != NULL) memcpy(d, s, n);
    return d;
}

void *ote_aligned_alloc(size_t alignment, size_t size) {
    if (alignment < sizeof(void *) || (alignment & (alignment - 1)) != 0) return NULL;
    if (size > SIZE_MAX - alignment - sizeof(void *)) return NULL;
    if (alloc_should_fail()) return NULL;
    /* Over-allocate through the hook; the raw pointer sits just before the block. */
    char *raw = g_malloc(size + alignment + sizeof(void *));
    if (raw == NULL) return NULL;
    uintptr_t p = ((uintptr_t)raw + sizeof(void *) + alignment - 1) & ~(uintptr_t)(alignment - 1);
    ((void **)p)[-1] = raw;
    return (void *)p;
}

void ote_aligned_free(void *ptr) {
    if (ptr != NULL) g_free(((void **)ptr)[-1]);
}

void ote_alloc_fail_nth(uint64_t n) {
    atomic_store(&g_fail_sticky, 0);
    atomic_store(&g_fail_at, n == 0 ? 0 : atomic_load(&g_calls) + n);
}

void ote_alloc_fail_from(uint64_t n) {
    atomic_store(&g_fail_sticky, 1);
    atomic_store(&g_fail_at, n == 0 ? 0 : atomic_load(&g_calls) + n);
}

void ote_alloc_fail_disarm(void) { atomic_store(&g_fail_at, 0); }

uint64_t ote_alloc_calls(void) { return atomic_load(&g_calls); }

uint64_t ote_alloc_injected_failures(void) { return atomic_load(&g_injected); }

/* tests/engine/pattern.h - deterministic buffer contents and a fast hash, shared by the
 * test target (C) and the tests (C++), so both sides can check every byte. */
#ifndef OTE_TESTS_ENGINE_PATTERN_H
#define OTE_TESTS_ENGINE_PATTERN_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The byte at absolute offset i of a buffer filled with seed. */
static inline uint8_t ote_pattern_byte(uint64_t seed, uint64_t i) {
    uint64_t w = (i >> 3) * 0x9E3779B97F4A7C15ull + seed * 0xBF58476D1CE4E5B9ull;
    w ^= w >> 29;
    return (uint8_t)(w >> ((i & 7) * 8));
}

/* Fill buf[0, len) with the bytes at offsets [base, base+len) of the seed pattern. */
static inline void ote_pattern_fill(void *buf, size_t len, uint64_t seed, uint64_t base) {
    uint8_t *p = (uint8_t *)buf;
    size_t i = 0;
    while (i < len && ((base + i) & 7) != 0) {
        p[i] = ote_pattern_byte(seed, base + i);
        i++;
    }
    for (; i + 8 <= len; i += 8) {
        uint64_t w = ((base + i) >> 3) * 0x9E3779B97F4A7C15ull + seed * 0xBF58476D1CE4E5B9ull;
        w ^= w >> 29;
        memcpy(p + i, &w, 8); /* little endian: byte k is w >> 8k */
    }
    for (; i < len; i++) p[i] = ote_pattern_byte(seed, base + i);
}

/* ote_pattern_fill for memory that no other thread or process can reach yet (a buffer just
 * mapped, before it is registered or shared): the same bytes as ote_pattern_fill, with the
 * sanitizers' instrumentation left out; base must be a multiple of 8. Under ThreadSanitizer
 * every 8-byte store of the checked fill also writes its shadow cells: filling the test
 * target's 64 MiB buffer took 1.3 of the 1.9 s of a trivial end-to-end case. Nothing can
 * race with or overflow these stores: the caller owns the whole fresh range. Later fills,
 * of memory a peer may be moving, use ote_pattern_fill and stay checked. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((no_sanitize_thread, no_sanitize_address))
#elif defined(__clang__)
__attribute__((no_sanitize("thread", "address")))
#endif
static inline void
ote_pattern_fill_fresh(void *buf, size_t len, uint64_t seed, uint64_t base) {
    uint8_t *p = (uint8_t *)buf; /* base: a multiple of 8 (the callers' are) */
    size_t i = 0;
    for (; i < len / 8; i++) {
        uint64_t v = ((base >> 3) + i) * 0x9E3779B97F4A7C15ull + seed * 0xBF58476D1CE4E5B9ull;
        v ^= v >> 29;
        memcpy(p + i * 8, &v, 8); /* inlined: a plain store, not the intercepted memcpy */
    }
    for (i *= 8; i < len; i++) p[i] = ote_pattern_byte(seed, base + i);
}

/* ote_hash in pieces: h = ote_hash_begin(total), then h = ote_hash_more(h, piece, n) for
 * each piece in order, every piece but the last a multiple of 8 bytes: the result is
 * ote_hash of the pieces laid end to end. */
static inline uint64_t ote_hash_begin(size_t total) { return 0xcbf29ce484222325ull ^ total; }

static inline uint64_t ote_hash_more(uint64_t h, const void *buf, size_t len) {
    const uint8_t *p = (const uint8_t *)buf;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 31;
    }
    for (; i < len; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* 64-bit hash of a byte range (word-wise, position dependent). */
static inline uint64_t ote_hash(const void *buf, size_t len) {
    return ote_hash_more(ote_hash_begin(len), buf, len);
}

/* ote_hash of bytes [base, base+len) of the seed pattern, generated 64 KiB at a time on
 * the stack (no allocation: a test's expected hash costs no page faults). */
static inline uint64_t ote_pattern_hash(uint64_t seed, uint64_t base, uint64_t len) {
    uint64_t piece[8192]; /* 64 KiB, a multiple of 8 bytes */
    uint64_t h = ote_hash_begin(len);
    for (uint64_t done = 0; done < len;) {
        size_t n = len - done < sizeof(piece) ? (size_t)(len - done) : sizeof(piece);
        ote_pattern_fill(piece, n, seed, base + done);
        h = ote_hash_more(h, piece, n);
        done += n;
    }
    return h;
}

#endif

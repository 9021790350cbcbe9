/*
 * tools/bench_wire.c - what ote_bench's processes exchange: the --check byte pattern
 * written and verified in the buffers, the control lines between initiator and target
 * (bench_ctl_*) and the target's report line (bench_report_*). See bench_lib.h; nothing
 * here touches the engine.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/bench_lib.h"

/* ---- pattern ---- */

static inline uint64_t pattern_word(uint64_t seed, uint64_t word_index) {
    /* splitmix64 finaliser over a seed-dependent start: cheap and well mixed. */
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + word_index;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline uint8_t pattern_byte(uint64_t seed, uint64_t off) {
    return (uint8_t)(pattern_word(seed, off >> 3) >> ((off & 7) * 8));
}

/* Word as bytes in little-endian order, whatever the host order. */
static inline uint64_t to_le(uint64_t w) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return __builtin_bswap64(w);
#else
    return w;
#endif
}

void bench_pattern_fill(void *buf, uint64_t offset, size_t len, uint64_t seed) {
    uint8_t *p = buf;
    size_t i = 0;
    while (i < len && ((offset + i) & 7) != 0) {
        p[i] = pattern_byte(seed, offset + i);
        i++;
    }
    for (; i + 8 <= len; i += 8) {
        uint64_t w = to_le(pattern_word(seed, (offset + i) >> 3));
        memcpy(p + i, &w, 8);
    }
    for (; i < len; i++) p[i] = pattern_byte(seed, offset + i);
}

bool bench_pattern_check(const void *buf, uint64_t offset, size_t len, uint64_t seed,
                         uint64_t *bad_out) {
    const uint8_t *p = buf;
    size_t i = 0;
    while (i < len && ((offset + i) & 7) != 0) {
        if (p[i] != pattern_byte(seed, offset + i)) goto bad_byte;
        i++;
    }
    for (; i + 8 <= len; i += 8) {
        uint64_t w = to_le(pattern_word(seed, (offset + i) >> 3));
        if (memcmp(p + i, &w, 8) != 0) {
            while (p[i] == pattern_byte(seed, offset + i)) i++;
            goto bad_byte;
        }
    }
    for (; i < len; i++)
        if (p[i] != pattern_byte(seed, offset + i)) goto bad_byte;
    return true;
bad_byte:
    if (bad_out != NULL) *bad_out = offset + i;
    return false;
}

/* ---- control messages ---- */

static const char *const verb_names[] = {
    [BENCH_CTL_INFO] = "INFO",     [BENCH_CTL_FILL] = "FILL", [BENCH_CTL_ZERO] = "ZERO",
    [BENCH_CTL_VERIFY] = "VERIFY", [BENCH_CTL_QUIT] = "QUIT", [BENCH_CTL_OK] = "OK",
    [BENCH_CTL_BAD] = "BAD",       [BENCH_CTL_ERR] = "ERR",
};
#define N_VERBS (sizeof verb_names / sizeof verb_names[0])

int bench_ctl_format(const bench_ctl_msg_t *m, char *buf, size_t len) {
    if ((size_t)m->verb >= N_VERBS) return -1;
    const char *v = verb_names[m->verb];
    int n;
    switch (m->verb) {
        case BENCH_CTL_FILL:
        case BENCH_CTL_VERIFY:
            n = snprintf(buf, len, "OTEB1 %" PRIu64 " %s %" PRIu64 " %" PRIu64 " %" PRIu64, m->id,
                         v, m->a, m->b, m->c);
            break;
        case BENCH_CTL_ZERO:
        case BENCH_CTL_OK:
            n = snprintf(buf, len, "OTEB1 %" PRIu64 " %s %" PRIu64 " %" PRIu64, m->id, v, m->a,
                         m->b);
            break;
        case BENCH_CTL_BAD:
            n = snprintf(buf, len, "OTEB1 %" PRIu64 " %s %" PRIu64, m->id, v, m->a);
            break;
        case BENCH_CTL_ERR:
            n = snprintf(buf, len, "OTEB1 %" PRIu64 " %s %s", m->id, v, m->text);
            break;
        default: n = snprintf(buf, len, "OTEB1 %" PRIu64 " %s", m->id, v); break;
    }
    if (n < 0 || (size_t)n >= len) return -1;
    return n;
}

int bench_ctl_parse(const char *buf, size_t len, bench_ctl_msg_t *out) {
    char line[256];
    if (buf == NULL || len == 0 || len >= sizeof line) return -1;
    memcpy(line, buf, len);
    line[len] = '\0';
    if (strlen(line) != len) return -1; /* embedded NUL */

    bench_ctl_msg_t m;
    memset(&m, 0, sizeof m);
    char *save = NULL;
    char *tok = strtok_r(line, " ", &save);
    if (tok == NULL || strcmp(tok, "OTEB1") != 0) return -1;
    tok = strtok_r(NULL, " ", &save);
    if (tok == NULL || bench_parse_u64(tok, 10, &m.id) != 0) return -1;
    tok = strtok_r(NULL, " ", &save);
    if (tok == NULL) return -1;
    size_t verb;
    for (verb = 0; verb < N_VERBS; verb++)
        if (strcmp(tok, verb_names[verb]) == 0) break;
    if (verb == N_VERBS) return -1;
    m.verb = (bench_ctl_verb_t)verb;

    if (m.verb == BENCH_CTL_ERR) {
        const char *rest = save != NULL ? save : "";
        snprintf(m.text, sizeof m.text, "%s", rest);
        *out = m;
        return 0;
    }
    size_t want_min, want_max;
    switch (m.verb) {
        case BENCH_CTL_FILL:
        case BENCH_CTL_VERIFY: want_min = want_max = 3; break;
        case BENCH_CTL_ZERO: want_min = want_max = 2; break;
        case BENCH_CTL_OK:
            want_min = 0;
            want_max = 2;
            break;
        case BENCH_CTL_BAD: want_min = want_max = 1; break;
        default: want_min = want_max = 0; break;
    }
    uint64_t *args[3] = {&m.a, &m.b, &m.c};
    size_t got = 0;
    while ((tok = strtok_r(NULL, " ", &save)) != NULL) {
        if (got == want_max) return -1;
        if (bench_parse_u64(tok, 10, args[got]) != 0) return -1;
        got++;
    }
    if (got < want_min || (m.verb == BENCH_CTL_OK && got == 1)) return -1;
    *out = m;
    return 0;
}

int bench_report_format(const char *address, uint64_t buf_addr, uint64_t buf_len, char *out,
                        size_t len) {
    int n =
        snprintf(out, len, "OTEB1 TARGET %s 0x%" PRIx64 " %" PRIu64, address, buf_addr, buf_len);
    if (n < 0 || (size_t)n >= len) return -1;
    return n;
}

int bench_report_parse(const char *line, char *address, size_t address_len, uint64_t *buf_addr_out,
                       uint64_t *buf_len_out) {
    char copy[BENCH_ADDR_MAX + 96];
    if (line == NULL || strlen(line) >= sizeof copy) return -1;
    snprintf(copy, sizeof copy, "%s", line);
    size_t l = strlen(copy);
    while (l > 0 && (copy[l - 1] == '\n' || copy[l - 1] == '\r')) copy[--l] = '\0';
    char *save = NULL;
    char *t0 = strtok_r(copy, " ", &save);
    char *t1 = strtok_r(NULL, " ", &save);
    char *addr = strtok_r(NULL, " ", &save);
    char *ba = strtok_r(NULL, " ", &save);
    char *bl = strtok_r(NULL, " ", &save);
    if (t0 == NULL || t1 == NULL || addr == NULL || ba == NULL || bl == NULL ||
        strtok_r(NULL, " ", &save) != NULL)
        return -1;
    if (strcmp(t0, "OTEB1") != 0 || strcmp(t1, "TARGET") != 0) return -1;
    char host[BENCH_ADDR_MAX];
    uint16_t port;
    if (bench_split_hostport(addr, host, sizeof host, &port) != 0) return -1;
    uint64_t a, n;
    if (bench_parse_u64(ba, 0, &a) != 0 || bench_parse_u64(bl, 10, &n) != 0 || a == 0 || n == 0)
        return -1;
    if (strlen(addr) >= address_len) return -1;
    snprintf(address, address_len, "%s", addr);
    *buf_addr_out = a;
    *buf_len_out = n;
    return 0;
}

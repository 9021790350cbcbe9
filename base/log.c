#include "base/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static _Atomic int g_level = -1; /* -1: not yet read from the environment */
static _Atomic uint64_t g_errors;
static pthread_mutex_t g_sink_lock = PTHREAD_MUTEX_INITIALIZER;
static ote_log_sink_fn g_sink;
static void *g_sink_arg;

int ote_log_parse_level(const char *s) {
    static const char *const names[] = {"error", "warn", "info", "debug", "trace"};
    if (s == NULL || *s == '\0') return -1;
    if (s[1] == '\0' && s[0] >= '0' && s[0] <= '4') return s[0] - '0';
    for (int i = 0; i < 5; i++)
        if (strcasecmp(s, names[i]) == 0) return i;
    if (strcasecmp(s, "warning") == 0) return OTE_LOG_WARN;
    return -1;
}

ote_log_level_t ote_log_level(void) {
    int lv = atomic_load_explicit(&g_level, memory_order_relaxed);
    if (lv >= 0) return (ote_log_level_t)lv;
    lv = ote_log_parse_level(getenv("OTE_LOG_LEVEL"));
    if (lv < 0) lv = OTE_LOG_WARN;
    int expected = -1;
    atomic_compare_exchange_strong(&g_level, &expected, lv);
    return (ote_log_level_t)atomic_load(&g_level);
}

void ote_log_set_level(ote_log_level_t level) { atomic_store(&g_level, (int)level); }

void ote_log_set_sink(ote_log_sink_fn fn, void *arg) {
    pthread_mutex_lock(&g_sink_lock);
    g_sink = fn;
    g_sink_arg = arg;
    pthread_mutex_unlock(&g_sink_lock);
}

uint64_t ote_log_error_count(void) { return atomic_load(&g_errors); }

int ote_log_limit_pass(ote_log_limit_t *l, uint64_t every_ns, uint64_t *suppressed_out) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    uint64_t last = __atomic_load_n(&l->last_ns, __ATOMIC_RELAXED);
    if ((last != 0 && now - last < every_ns) ||
        !__atomic_compare_exchange_n(&l->last_ns, &last, now, 0, __ATOMIC_RELAXED,
                                     __ATOMIC_RELAXED)) {
        __atomic_fetch_add(&l->suppressed, 1, __ATOMIC_RELAXED);
        return 0;
    }
    *suppressed_out = __atomic_exchange_n(&l->suppressed, 0, __ATOMIC_RELAXED);
    return 1;
}

void ote_log_write(ote_log_level_t level, const char *component, const char *fmt, ...) {
    static const char letters[] = "EWIDT";
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (level == OTE_LOG_ERROR) atomic_fetch_add(&g_errors, 1);
    if (component == NULL) component = "-";
    pthread_mutex_lock(&g_sink_lock);
    if (g_sink != NULL) {
        g_sink(g_sink_arg, level, component, msg);
    } else {
        char line[1200];
        int n = snprintf(line, sizeof(line), "orbitte %c [%s] %s\n",
                         letters[(unsigned)level < 5 ? level : 4], component, msg);
        if (n > 0) fwrite(line, 1, (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1, stderr);
    }
    pthread_mutex_unlock(&g_sink_lock);
}

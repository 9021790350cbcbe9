#include "base/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static _Atomic int g_level = -1; /* -1: not yet read from the environment */
static _Atomic uint64_t g_errors;
/* The callback and its arg change and are called under g_cb_lock: a line is delivered
 * whole, and once ote_log_set_callback returns the old callback is neither running nor
 * about to run (<ote/log.h>'s contract). */
static pthread_mutex_t g_cb_lock = PTHREAD_MUTEX_INITIALIZER;
static ote_log_callback_t g_cb;
static void *g_cb_arg;
static _Thread_local const char *tl_engine; /* the engine this thread's lines are about */
static _Thread_local int tl_in_callback;    /* this thread is inside g_cb */

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

void ote_log_set_level(ote_log_level_t level) {
    if ((int)level >= OTE_LOG_ERROR && (int)level <= OTE_LOG_TRACE)
        atomic_store(&g_level, (int)level);
}

ote_status_t ote_log_set_callback(ote_log_callback_t fn, void *arg) {
    if (tl_in_callback) return OTE_ERR_STATE; /* the lock is held by this very thread */
    pthread_mutex_lock(&g_cb_lock);
    g_cb = fn;
    g_cb_arg = arg;
    pthread_mutex_unlock(&g_cb_lock);
    return OTE_OK;
}

const char *ote_log_set_thread_engine(const char *tag) {
    const char *prev = tl_engine;
    tl_engine = tag;
    return prev;
}

const char *ote_log_thread_engine(void) { return tl_engine; }

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

/* The engine tag as one word of the stderr line: ' ' and '%' (an engine_name may hold
 * them) as %20 and %25, cut to fit out (cap > 0). */
static void engine_word(const char *tag, char *out, size_t cap) {
    size_t n = 0;
    for (; *tag != '\0'; tag++) {
        const char *rep = *tag == ' ' ? "%20" : *tag == '%' ? "%25" : NULL;
        size_t len = rep != NULL ? 3 : 1;
        if (n + len >= cap) break;
        if (rep != NULL) memcpy(out + n, rep, 3);
        else out[n] = *tag;
        n += len;
    }
    out[n] = '\0';
}

/* The default line (<ote/log.h>): UTC time to the ms, level, pid, tid, engine, component. */
static void write_stderr(ote_log_level_t level, const char *component, const char *engine,
                         const char *msg) {
    static const char letters[] = "EWIDT";
    char word[200] = "";
    if (engine != NULL) engine_word(engine, word, sizeof(word));
    struct timespec ts;
    struct tm tm;
    char when[32] = "";
    clock_gettime(CLOCK_REALTIME, &ts);
    if (gmtime_r(&ts.tv_sec, &tm) != NULL) strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
    char line[1400];
    int n = snprintf(line, sizeof(line), "%s.%03ldZ orbitte %c pid=%ld tid=%ld%s%s [%s] %s\n", when,
                     ts.tv_nsec / 1000000, letters[(unsigned)level < 5 ? level : 4], (long)getpid(),
                     (long)syscall(SYS_gettid), engine ? " engine=" : "", word, component, msg);
    if (n <= 0) return;
    if ((size_t)n >= sizeof(line)) { /* cut, but still one line */
        n = (int)sizeof(line) - 1;
        line[n - 1] = '\n';
    }
    fwrite(line, 1, (size_t)n, stderr);
}

void ote_log_write(ote_log_level_t level, const char *component, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (level == OTE_LOG_ERROR) atomic_fetch_add(&g_errors, 1);
    if (component == NULL) component = "-";
    const char *engine = tl_engine != NULL && tl_engine[0] != '\0' ? tl_engine : NULL;
    if (tl_in_callback) { /* the callback called into OrbitTE: its lock is this thread's */
        write_stderr(level, component, engine, msg);
        return;
    }
    pthread_mutex_lock(&g_cb_lock);
    if (g_cb != NULL) {
        tl_in_callback = 1;
        g_cb(g_cb_arg, level, component, engine, msg);
        tl_in_callback = 0;
    } else {
        write_stderr(level, component, engine, msg);
    }
    pthread_mutex_unlock(&g_cb_lock);
}

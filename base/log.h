/*
 * base/log.h - leveled logging with a component tag.
 *
 * Lines look like "orbitte W [verbs] reg_mr failed: ...". The level comes from the
 * OTE_LOG_LEVEL environment variable (error, warn, info, debug, trace; default warn),
 * read once, or from ote_log_set_level(). Tests install a sink to capture lines and to
 * fail on unexpected errors; ote_log_error_count() counts every ERROR line emitted.
 */
#ifndef OTE_BASE_LOG_H
#define OTE_BASE_LOG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    OTE_LOG_ERROR = 0,
    OTE_LOG_WARN = 1,
    OTE_LOG_INFO = 2,
    OTE_LOG_DEBUG = 3,
    OTE_LOG_TRACE = 4,
} ote_log_level_t;

typedef void (*ote_log_sink_fn)(void *arg, ote_log_level_t level, const char *component,
                                const char *message);

ote_log_level_t ote_log_level(void);
void ote_log_set_level(ote_log_level_t level);
/* Parse "error", "warn", ..., or a digit 0-4. Returns -1 when unknown. */
int ote_log_parse_level(const char *s);
/* Install a sink (NULL restores stderr). The sink receives every line at or below the
 * current level; it must not call back into the logger. */
void ote_log_set_sink(ote_log_sink_fn fn, void *arg);
uint64_t ote_log_error_count(void);

void ote_log_write(ote_log_level_t level, const char *component, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define OTE_LOG(level, component, ...) \
    do { \
        if ((int)(level) <= (int)ote_log_level()) \
            ote_log_write((level), (component), __VA_ARGS__); \
    } while (0)

/*
 * Rate limit of one kind of line (one static limiter per call site, zero-initialized):
 * the first line goes out, then at most one per `every_ns`; the line that goes out after
 * a quiet spell says how many were swallowed since. Thread-safe (atomic builtins).
 */
typedef struct {
    uint64_t last_ns;    /* when a line last went out (0: never) */
    uint64_t suppressed; /* lines swallowed since */
} ote_log_limit_t;
#define OTE_LOG_EVERY_NS 1000000000ull
/* 1: log now (*suppressed_out: lines swallowed since the previous one); 0: swallow. */
int ote_log_limit_pass(ote_log_limit_t *l, uint64_t every_ns, uint64_t *suppressed_out);

/* A line of level at most once per OTE_LOG_EVERY_NS from this call site, with the count
 * of the lines swallowed since the previous one. fmt must be a string literal. For lines a
 * remote peer can cause once per connection (a flood must not flood the log). */
#define OTE_LOG_LIMITED(level, component, fmt, ...) \
    do { \
        static ote_log_limit_t ote_lim_; \
        uint64_t ote_sup_ = 0; \
        if ((int)(level) <= (int)ote_log_level() && \
            ote_log_limit_pass(&ote_lim_, OTE_LOG_EVERY_NS, &ote_sup_)) { \
            if (ote_sup_ == 0) ote_log_write((level), (component), fmt, __VA_ARGS__); \
            else \
                ote_log_write((level), (component), fmt " (%llu more like it since the last)", \
                              __VA_ARGS__, (unsigned long long)ote_sup_); \
        } \
    } while (0)
/* A WARN at most once per OTE_LOG_EVERY_NS from this call site (OTE_LOG_LIMITED). */
#define OTE_WARN_LIMITED(component, fmt, ...) \
    OTE_LOG_LIMITED(OTE_LOG_WARN, component, fmt, __VA_ARGS__)

#define OTE_ERROR(component, ...) OTE_LOG(OTE_LOG_ERROR, component, __VA_ARGS__)
#define OTE_WARN(component, ...) OTE_LOG(OTE_LOG_WARN, component, __VA_ARGS__)
#define OTE_INFO(component, ...) OTE_LOG(OTE_LOG_INFO, component, __VA_ARGS__)
#define OTE_DEBUG(component, ...) OTE_LOG(OTE_LOG_DEBUG, component, __VA_ARGS__)
#define OTE_TRACE(component, ...) OTE_LOG(OTE_LOG_TRACE, component, __VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif

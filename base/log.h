/*
 * base/log.h - leveled logging with a component tag and the engine a line is about.
 *
 * The public half (levels, the callback, the process-wide level, the stderr line's
 * format) is <ote/log.h>. The level comes from the OTE_LOG_LEVEL environment variable
 * (error, warn, info, debug, trace; default warn), read once, or from
 * ote_log_set_level(). ote_log_error_count() counts every ERROR line emitted.
 *
 * The engine tag is per thread: ote_log_set_thread_engine() names the engine the calling
 * thread works for (a string the caller keeps alive while it is set), and every line the
 * thread writes carries it; ote_thread_create (base/thread.h) starts a thread with its
 * creator's tag. The engine's public calls that name one set it for their duration.
 */
#ifndef OTE_BASE_LOG_H
#define OTE_BASE_LOG_H

/* Workspace-relative, as in base/status.h: compilers outside Bazel need only the root. */
#include "base/include/ote/log.h"
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Parse "error", "warn", ..., or a digit 0-4. Returns -1 when unknown. */
int ote_log_parse_level(const char *s);
/* The engine tag of the calling thread's lines (NULL or "" for none); returns the previous
 * one, for the caller to put back. tag must stay valid while it is set. */
const char *ote_log_set_thread_engine(const char *tag);
const char *ote_log_thread_engine(void);
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

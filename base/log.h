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

#define OTE_ERROR(component, ...) OTE_LOG(OTE_LOG_ERROR, component, __VA_ARGS__)
#define OTE_WARN(component, ...) OTE_LOG(OTE_LOG_WARN, component, __VA_ARGS__)
#define OTE_INFO(component, ...) OTE_LOG(OTE_LOG_INFO, component, __VA_ARGS__)
#define OTE_DEBUG(component, ...) OTE_LOG(OTE_LOG_DEBUG, component, __VA_ARGS__)
#define OTE_TRACE(component, ...) OTE_LOG(OTE_LOG_TRACE, component, __VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif

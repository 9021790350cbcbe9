/*
 * <ote/log.h> - OrbitTE's log lines (part of the public API, included by <ote/ote.h>).
 *
 * Every library line has a level, a component (the layer that wrote it: "engine", "tcp",
 * "shm", "rdma", "verbs", ...) and, when the line knows it, the engine it is about. By
 * default a line goes to stderr as
 *
 *     2026-12-06T01:56:08.123Z orbitte W pid=4242 tid=4250 engine=127.0.0.1:41000 [tcp] message
 *
 * (UTC time to the millisecond, the level's letter E W I D T, the process and the kernel
 * thread id; "engine=..." only on a line that knows its engine). Regular expression:
 *
 *     ^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z orbitte [EWIDT]
 *      pid=[0-9]+ tid=[0-9]+( engine=[^ ]+)? \[[^]]+\] .*$      (one line)
 *
 * The engine is named by its engine_name and advertised address, "name@host:port", or by
 * the address alone ("host:port", ote_engine_address) when it has no name; on the stderr
 * line a space or '%' of the name is written %20 or %25, so that the tag stays one word
 * (the callback gets it as it is). Lines written on a thread an engine started (its
 * listener, transport workers, progress, pumper and reader threads, started through one
 * helper that passes the tag on; docs/api.md lists the exceptions) and lines written on
 * the caller's thread during ote_engine_create, ote_engine_destroy, ote_segment_open,
 * ote_segment_close, ote_memory_register(_named), ote_memory_unregister,
 * ote_batch_submit(_v), ote_batch_wait and ote_batch_cancel carry it; a line written on
 * the caller's thread by another call or before the engine has its address (a refused
 * configuration) carries none.
 *
 * The level is process-wide: OTE_LOG_LEVEL in the environment (read once), the
 * log_level key of any engine's configuration (applied when that engine is created, for
 * every engine of the process), or ote_log_set_level. Lines above it are not formatted.
 *
 * This is the one definition of the levels and of the callback, owned by the bottom layer
 * (base/include, next to <ote/status.h>); base/log.c implements it.
 */
#ifndef OTE_OTE_LOG_H
#define OTE_OTE_LOG_H

#include "status.h" /* <ote/status.h>, beside this header */

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

/* One line: engine is the engine's tag ("name@host:port", or "host:port" for an engine
 * without engine_name) or NULL when the line knows none;
 * component and message are never NULL. The strings live only during the call. */
typedef void (*ote_log_callback_t)(void *arg, ote_log_level_t level, const char *component,
                                   const char *engine, const char *message);

/*
 * Send every line at or below the level to fn(arg, ...) instead of stderr; fn NULL
 * restores stderr. Process-wide: one callback for every engine of the process.
 *
 * Contract: lines are delivered one at a time (calls to fn never overlap), from whatever
 * thread wrote the line, the library's own threads included. When ote_log_set_callback
 * returns, no call to the previous callback is running or will start: its arg may be
 * freed then. fn must not block for long (every thread that logs waits for it) and must
 * not call ote_log_set_callback (OTE_ERR_STATE, nothing changed); a line the library
 * writes on fn's thread while fn runs (fn called into OrbitTE) goes to stderr.
 * OTE_OK otherwise.
 */
ote_status_t ote_log_set_callback(ote_log_callback_t fn, void *arg);

/* The process-wide level; lines above it are dropped before formatting. */
ote_log_level_t ote_log_level(void);
void ote_log_set_level(ote_log_level_t level);

#ifdef __cplusplus
}
#endif
#endif

/*
 * <ote/naming.h> - names across a cluster: engines published under a name in etcd or
 * Redis, resolved, listed, watched, and segments opened by name.
 *
 * liborbitte_naming (//naming) sits beside the engine, on its public API only; the
 * engine itself stays peer-to-peer and gains no dependency. A name's value is the
 * engine's metadata blob (ote_engine_metadata: its address, its incarnation (epoch)
 * and its named buffers) in a versioned envelope that also carries the name; every value
 * read from the store is checked before use, and one that does not decode is reported
 * OTE_ERR_PROTOCOL, never used.
 *
 * URLs: "etcd://host:port[,host:port...]" (etcd v3's JSON gateway; the endpoints are
 * tried in order and the one that answered is used first next time) and
 * "redis://host:port". Keys are "<prefix><name>" (prefix "orbitte/" by default).
 *
 * Liveness: a published name lives as long as its publisher refreshes it: an etcd lease
 * of ttl_ms kept alive, or a Redis key expiring after ttl_ms refreshed, every ttl_ms/3,
 * by the handle's thread. A publisher that dies (SIGKILL) leaves its name for at most
 * ttl_ms.
 *
 * Deadlines: every call to the store ends within timeout_ms (connect and answer
 * together, per endpoint tried); a store that does not answer gives OTE_ERR_CONNECT (no
 * endpoint reachable) or OTE_ERR_TIMEOUT (one connected but did not answer in time).
 */
#ifndef OTE_NAMING_H
#define OTE_NAMING_H

#include <stddef.h>
#include <stdint.h>

#include <ote/ote.h>

#ifdef __cplusplus
extern "C" {
#endif

#define OTE_NAMING_NAME_MAX 200 /* bytes of a name, printable ASCII, no ' ' */

typedef struct ote_naming ote_naming_t;

typedef struct {
    uint32_t timeout_ms;      /* every store call; 0: 2000 */
    uint32_t ttl_ms;          /* a published name's lease / expiry; 0: 10000 (>= 1000) */
    uint32_t cache_ms;        /* how long a resolved name is served without asking; 0: none */
    uint32_t watch_period_ms; /* how often watched names are polled; 0: 200 */
    const char *prefix;       /* key prefix; NULL: "orbitte/" */
} ote_naming_opts_t;

/* Connect to the store named by url (a first round trip checks it answers, within
 * timeout_ms). OTE_ERR_INVALID for a malformed url or option, OTE_ERR_UNSUPPORTED for
 * another scheme, OTE_ERR_CONNECT / OTE_ERR_TIMEOUT when the store does not answer. */
ote_status_t ote_naming_open(const char *url, const ote_naming_opts_t *opts,
                             ote_naming_t **naming_out);
/* Stops the thread, withdraws this handle's published names (best effort, within
 * timeout_ms each) and frees the handle. */
ote_status_t ote_naming_close(ote_naming_t *naming);

/* Publish engine's metadata under name and keep it alive until unpublished or closed.
 * Publishing a name again replaces its value (the current metadata is taken again). */
ote_status_t ote_naming_publish(ote_naming_t *naming, const char *name, ote_engine_t *engine);
/* Withdraw a name this handle published: OTE_ERR_NOT_FOUND when it did not. */
ote_status_t ote_naming_unpublish(ote_naming_t *naming, const char *name);

/* What a name resolves to. */
typedef struct {
    char addr[272]; /* the engine's "host:port" */
    uint64_t epoch; /* its incarnation */
} ote_naming_entry_t;

/* Resolve name: from the cache when it was resolved less than cache_ms ago (no round
 * trip), else one round trip to the store. entry_out (may be NULL) gets the address and
 * epoch; md/cap/md_len_out (md may be NULL with cap 0) get the metadata blob itself, for
 * ote_segment_open_md or ote_engine_metadata_buffers: OTE_ERR_TOO_BIG with *md_len_out
 * the size when cap is short. OTE_ERR_NOT_FOUND when no live engine has that name,
 * OTE_ERR_PROTOCOL for a value that does not decode (logged). */
ote_status_t ote_naming_resolve(ote_naming_t *naming, const char *name,
                                ote_naming_entry_t *entry_out, void *md, size_t cap,
                                size_t *md_len_out);
/* The names under prefix (a name prefix, "" for all), sorted, NUL-terminated into
 * names[cap][OTE_NAMING_NAME_MAX + 1]; OTE_ERR_TOO_BIG with *count_out the number when
 * cap is short. */
ote_status_t ote_naming_list(ote_naming_t *naming, const char *prefix,
                             char (*names)[OTE_NAMING_NAME_MAX + 1], size_t cap, size_t *count_out);

/* Events of a watched name. */
typedef enum {
    OTE_NAMING_UP = 1,      /* it resolves (first seen, or back after GONE) */
    OTE_NAMING_CHANGED = 2, /* it resolves to another incarnation (epoch) or address */
    OTE_NAMING_GONE = 3,    /* its lease ended or it was withdrawn */
} ote_naming_event_t;
/* Called from the handle's thread, never concurrently with itself; must not call back
 * into this handle's watch/unwatch/close. entry is NULL for GONE. */
typedef void (*ote_naming_watch_fn)(void *arg, const char *name, ote_naming_event_t ev,
                                    const ote_naming_entry_t *entry);
typedef struct ote_naming_watch ote_naming_watch_t;
/* Watch name: the handle's thread reads it every watch_period_ms (polling, one range
 * read per watched name, for both stores) and calls fn on each change seen. A store that
 * does not answer is not a change (the name keeps its last state; a WARN says so). */
ote_status_t ote_naming_watch(ote_naming_t *naming, const char *name, ote_naming_watch_fn fn,
                              void *arg, ote_naming_watch_t **watch_out);
/* After it returns fn is not running and is never called again for this watch. */
ote_status_t ote_naming_unwatch(ote_naming_watch_t *watch);

/* Resolve name and open a segment to the engine it names (ote_segment_open_md, which
 * refuses another incarnation at that address with OTE_ERR_STATE). A cached entry that
 * turns out stale (OTE_ERR_STATE or OTE_ERR_CONNECT) is dropped and the name resolved
 * once more from the store. OTE_ERR_NOT_FOUND when the name does not resolve.
 *
 * Fail-fast: the name stays watched (every watch_period_ms, as ote_naming_watch) for as
 * long as the segment is open through this handle. When it is gone (its publisher's
 * lease ended: the publisher died, hangs or lost the store, or it withdrew the name) or
 * resolves to another incarnation (epoch) than the one the segment was opened to, the
 * segment is invalidated (ote_segment_invalidate, a WARN says why): its requests in
 * flight end OTE_ERR_PEER_LOST then, within about ttl_ms + watch_period_ms of the
 * publisher's last refresh, not at their deadlines, and later submits fail
 * OTE_ERR_PEER_LOST. A store that does not answer invalidates nothing. Close such a
 * segment with ote_segment_close or ote_naming_segment_close (the same): the watch ends
 * with the close (the handle keeps a close hook on the segment,
 * ote_segment_set_close_hook: do not replace it). ote_naming_close stops watching the
 * ones still open, which then stay open, no longer guarded; not concurrently with a
 * close of one of them. */
ote_status_t ote_naming_segment_open(ote_naming_t *naming, ote_engine_t *engine, const char *name,
                                     ote_segment_t **seg_out);
/* Close a segment that ote_naming_segment_open gave: ote_segment_close, kept for symmetry
 * (the name is no longer watched once that succeeds). OTE_ERR_BUSY etc. as
 * ote_segment_close: then it is still open and still watched. */
ote_status_t ote_naming_segment_close(ote_naming_t *naming, ote_segment_t *seg);

#ifdef __cplusplus
}
#endif
#endif

/*
 * context/context_internal.h - internal: the context and context-set structures.
 * Only the .c files of context/ include this.
 */
#ifndef OTE_CONTEXT_CONTEXT_INTERNAL_H
#define OTE_CONTEXT_CONTEXT_INTERNAL_H

/* Compiled only inside the context library (Bazel local_defines, never passed on to
 * dependents): an outside file that includes this header fails here. */
#ifndef OTE__INSIDE_CONTEXT
#error \
    "context/context_internal.h is internal to OrbitTE's context layer; include context/context.h instead"
#endif

#include <stdatomic.h>

#include "base/lock.h"
#include "context/context.h"

typedef struct ote_context_listener {
    uint64_t id;
    ote_context_event_fn fn;
    void *arg;
    struct ote_context_listener *next;
} ote_context_listener_t;

/* The selected port and GID with what was learned from the port query. */
typedef struct ote_context_route {
    uint8_t port;
    int gid_index;
    union ibv_gid gid;
    uint32_t gid_type;
    uint16_t lid;
    uint8_t link_layer;
    enum ibv_mtu active_mtu;
    char netdev[16]; /* the GID's netdev from sysfs ("" when none) */
    ote_context_netdev_t netdev_state;
} ote_context_route_t;

/* A native device context and its PD that a reopen replaced but could not release (the
 * old PD's dealloc or the device's close failed): kept, counted (OTE_RETAINED_PD), retried
 * by every later reopen and by the set's close (reopen.c). */
typedef struct ote_context_retired {
    struct ibv_context *native;
    struct ibv_pd *pd; /* NULL once deallocated */
    struct ote_context_retired *next;
} ote_context_retired_t;

struct ote_context {
    ote_context_set_t *set;
    ote_verbs_t *v;
    /* Atomic: a reopen (reopen.c) replaces both while other threads may read them; it
     * does so only while the context is LOST, when no layer builds anything on them. */
    _Atomic(struct ibv_context *) native;
    _Atomic(struct ibv_pd *) pd; /* NULL once deallocated */
    uint32_t nic_id;
    char name[64];
    int pin_gid_index; /* -1 = automatic; else strict (a pin or the fixed GID index) */
    int pinned;        /* 1 when the route is a pin (for the log) */
    _Atomic int state; /* ote_context_state_t; read lock-free by admission */
    _Atomic uint64_t retained[OTE_RETAINED_KINDS];
    ote_context_route_t route; /* guarded by set->mu */
    int numa_node;
    uint64_t route_generation;
    struct ibv_device_attr device_attr;
    ote_context_limits_t limits; /* derived at open (context.c, context_limits) */
    /* reopen.c, guarded by set->mu: one reopen at a time, the backoff after a failed one,
     * the counts, and the natives a reopen could not release. */
    int reopening;
    int reopened; /* new natives swapped in; LOST until ote_context_resume */
    uint64_t reopen_next_ns, reopen_backoff_ns;
    uint64_t reopens, reopen_failures;
    ote_status_t reopen_error;
    ote_context_retired_t *retired;
};

struct ote_context_set {
    ote_verbs_t *v;
    ote_mutex_t mu;           /* route fields of every context */
    ote_mutex_t listeners_mu; /* held while listeners run: removal waits for them */
    ote_context_listener_t *listeners;
    uint64_t next_listener_id;
    size_t count;
    ote_context_t **contexts; /* NIC id order */
    char *sysfs_root;         /* NULL = "/sys" (sysfs.c) */
};

/* gid.c: choose the route of ctx on `port` (automatic when pin_gid_index < 0) or check
 * the strict index; on success writes *route_out and whether the port is active. Touches
 * no field of ctx and logs nothing but a failed query_port (WARN; why stays ""): when a
 * strict index cannot be used, why (why_len bytes) says so, for the caller to log. */
ote_status_t ote__context_select_route(ote_context_t *ctx, uint8_t port, int pin_gid_index,
                                       ote_context_route_t *route_out, int *active_out, char *why,
                                       size_t why_len);
/* gid.c: one INFO line naming ctx's route (port, GID index, GID, type, netdev). */
void ote__context_log_route(const ote_context_t *ctx, const char *what);

/* sysfs.c: the sysfs root of set ("/sys" by default), and the netdev of GID entry index
 * of port (its name into name_out, "" when none) with its state. */
const char *ote__context_sysfs_root(const ote_context_set_t *set);
ote_context_netdev_t ote__context_gid_netdev(const ote_context_t *ctx, uint8_t port, uint32_t index,
                                             char name_out[16]);
/* reopen.c: make native's async fd nonblocking (get_async_event then answers EAGAIN). */
void ote__context_nonblocking(struct ibv_context *native);
/* reopen.c: release what reopens retired (for the set's close): OTE_OK when nothing is
 * left, else OTE_ERR_RETAINED (what failed stays listed and counted). */
ote_status_t ote__context_release_retired(ote_context_t *ctx);

/* events.c: re-select the route of ctx and pause or resume it. */
ote_status_t ote__context_refresh(ote_context_t *ctx, const char *why);

#endif

/*
 * context/context.h - the RDMA context set: one context per usable device.
 *
 * A context set owns, for each device it opened, the native device context, the chosen
 * port and GID (the route), the protection domain (PD) and the device's counters of
 * retained native owners. Upper layers (cq, qp, endpoint, grant) borrow a context from
 * its set; they must destroy everything they created on it before the set is closed.
 *
 * NIC ids are stable: a device's id is its position in the provider's device list
 * sorted by name, so the same device gets the same id in every process that sees the
 * same devices, whatever subset a configuration opens.
 *
 * Route selection, per device: automatic (scan the selected port's GID table, skip
 * empty and zero entries, prefer entries whose netdev sysfs shows up, then RoCE v2, then
 * IPv4-mapped or routable global entries over link-local ones; the first active port
 * with a usable GID wins, else the first port with one and the context starts paused)
 * or strict from a pin (device, port, GID index) or a fixed GID index for every device:
 * a strict route that does not match fails the whole open with a message naming the
 * device, port and GID index. A strict route is never replaced by another entry. The
 * open logs one INFO line per device naming its port, GID index, GID and netdev.
 *
 * Port state: the monitor calls ote_context_set_poll_events(); PORT_ERR on a context's
 * selected port pauses it (no new route admission: ote_context_check() fails
 * OTE_ERR_PORT_DOWN), PORT_ACTIVE / GID_CHANGE / LID_CHANGE refresh its route (automatic
 * GID selection is repeated on the same port; a pin stays strict) and resume it,
 * DEVICE_FATAL fences it for good, and so does a failed get_async_event (the event
 * consumer is lost: OTE_CONTEXT_LOST) until ote_context_reopen() gives it a new native
 * context and PD. A paused context keeps its PD and MRs. Each change
 * bumps the context's route generation. Registered listeners see every event (after
 * the context's state was updated) in the thread that polls; this is how upper layers
 * fail their in-flight work on a port that went down. Lower layers never call up.
 *
 * Thread safety: all functions are thread-safe unless noted. Listeners are called
 * without context locks held; a listener must not add or remove listeners.
 */
#ifndef OTE_CONTEXT_CONTEXT_H
#define OTE_CONTEXT_CONTEXT_H

#include <stddef.h>
#include <stdint.h>

#include "base/retained.h"
#include "base/status.h"
#include "verbs/verbs.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ote_context_set ote_context_set_t;
typedef struct ote_context ote_context_t;

/* A strict route pin: device name, 1-based port, GID index. */
typedef struct ote_context_pin {
    const char *device;
    uint8_t port;
    int gid_index;
} ote_context_pin_t;

/* How a device without a pin chooses its GID index. */
typedef enum {
    OTE_CONTEXT_GID_AUTO = 0,  /* ranked per port (context/gid.c) */
    OTE_CONTEXT_GID_FIXED = 1, /* ote_context_config_t.gid_index, strict */
} ote_context_gid_mode_t;

typedef struct ote_context_config {
    /* Devices to open, by name; NULL/0 = every device of the provider. A listed name the
     * provider does not have fails the open (OTE_ERR_NO_DEVICE, naming it). */
    const char *const *devices;
    size_t num_devices;
    /* Strict pins; a pinned device is opened even when `devices` does not list it. */
    const ote_context_pin_t *pins;
    size_t num_pins;
    /* The port of every device without a pin: 0 = any (the first active port with a usable
     * GID); otherwise only that port (a device without it fails the open). */
    uint8_t port;
    /* The GID index of every device without a pin: OTE_CONTEXT_GID_AUTO chooses one per
     * port (gid.c); OTE_CONTEXT_GID_FIXED uses gid_index strictly, like a pin: a device
     * where no allowed port has a usable entry there fails the open, naming device, port
     * and index. */
    ote_context_gid_mode_t gid_mode;
    int gid_index;
    /* Where sysfs is mounted (for tests and containers with a bind-mounted /sys); every
     * sysfs read of this layer goes under it. NULL or "" = "/sys". */
    const char *sysfs_root;
} ote_context_config_t;

/* What sysfs says about the network device of a GID table entry (RoCE ports list one per
 * entry under ports/<port>/gid_attrs/ndevs/<index>; InfiniBand ports list none). */
typedef enum {
    OTE_CONTEXT_NETDEV_NONE = 0, /* no netdev: no ndevs file, unreadable, or not a name */
    OTE_CONTEXT_NETDEV_DOWN = 1, /* class/net/<netdev>/operstate says anything else */
    OTE_CONTEXT_NETDEV_UP = 2,   /* operstate "up" or "unknown" (see context/sysfs.c) */
} ote_context_netdev_t;

typedef enum {
    OTE_CONTEXT_ACTIVE = 0, /* route usable */
    OTE_CONTEXT_PAUSED = 1, /* selected port down or route invalid: PD and MRs kept */
    OTE_CONTEXT_FATAL = 2,  /* device fatal: nothing new, not even MR registration */
    /* Its async event consumer was lost (get_async_event failed other than EAGAIN): events
     * (QP_FATAL, PORT_ERR, DEVICE_FATAL...) may have gone unseen, so the device is fenced
     * as a fatal one (ote_context_check: OTE_ERR_FENCED; no MR registration); no port
     * query heals it and no event of its native context is asked for again. Only
     * ote_context_reopen() (a new native context and PD) ends it. */
    OTE_CONTEXT_LOST = 3,
} ote_context_state_t;

/* Native owners that a failed destroy left alive are counted per context, by the kinds
 * of base/retained.h (every count is also noted in its process-wide registry). */

/* A snapshot of one context's identity and route. */
/* What the device says it can do (query_device_ex at open, query_device where the
 * provider lacks it), the numbers every depth, SGE count, CQ size and RD-atom count is
 * drawn from. Maxima are upper bounds, not guarantees (VERBS_FACTS.md 10). */
typedef struct ote_context_limits {
    uint32_t max_qp_wr;           /* per work queue */
    uint32_t max_sge, max_sge_rd; /* SGEs per send/recv WR; per READ */
    uint32_t max_cqe;             /* CQ entries */
    uint32_t max_qp;
    uint32_t max_qp_rd_atom;                   /* responder depth (max_dest_rd_atomic) */
    uint32_t max_qp_init_rd_atom;              /* initiator depth (max_rd_atomic) */
    uint32_t max_srq, max_srq_wr, max_srq_sge; /* 0: no SRQ */
    uint32_t max_mw;
    uint64_t max_mr_size;
    int mw_type2;        /* type-2 memory windows (IBV_DEVICE_MEM_WINDOW_TYPE_2A/2B) */
    int scatter_to_cqe;  /* small READ responses may be copied from CQEs by the CPU */
    int scatter_opt_out; /* QPs can opt out of it (OTE_VERBS_QP_NO_SCATTER_TO_CQE) */
} ote_context_limits_t;

/* The largest GID index a QP can use as its source GID (ibv_ah_attr.grh.sgid_index is 8
 * bits); the GID table itself may be larger. */
#define OTE_CONTEXT_MAX_SGID_INDEX 255

typedef struct ote_context_info {
    uint32_t nic_id;
    char name[64];
    uint8_t port;
    int gid_index;
    union ibv_gid gid;
    uint32_t gid_type; /* IBV_GID_TYPE_* (IB when the provider cannot tell) */
    int pinned;        /* 1 when the GID index is strict (a pin or a fixed GID index) */
    char netdev[16];   /* the GID's network device from sysfs; "" when none is known */
    ote_context_netdev_t netdev_state;
    uint16_t lid;
    uint8_t link_layer; /* IBV_LINK_LAYER_* */
    enum ibv_mtu active_mtu;
    int numa_node; /* -1 when unknown */
    ote_context_state_t state;
    uint64_t route_generation; /* bumped by every route/state change */
    struct ibv_device_attr device_attr;
    ote_context_limits_t limits;
    /* ote_context_reopen(): successful reopens, failed ones, the last failure's status
     * (OTE_OK after a success), and old native contexts/PDs kept because they would not
     * be released (each also counted as OTE_RETAINED_PD). */
    uint64_t reopens, reopen_failures;
    ote_status_t reopen_error;
    uint32_t retired_natives;
} ote_context_info_t;

/* A listener sees every async event of every context, after its state was updated. */
typedef void (*ote_context_event_fn)(void *arg, ote_context_t *ctx,
                                     const struct ibv_async_event *ev);

/**
 * ote_context_set_open() - open the configured devices of provider @v.
 * Devices without any usable GID are skipped with a warning (unless pinned: then the
 * open fails). OTE_ERR_NO_DEVICE when no device is usable, naming what was missing.
 * @v must outlive the set.
 */
ote_status_t ote_context_set_open(ote_verbs_t *v, const ote_context_config_t *cfg,
                                  ote_context_set_t **set_out);
/**
 * ote_context_set_close() - deallocate every PD and close every device.
 * When a native dealloc fails (EBUSY: something still lives on the PD), that context is
 * kept with its PD, counted as retained, the set stays valid and OTE_ERR_RETAINED is
 * returned; call again once the cause is gone. OTE_OK frees the set.
 */
ote_status_t ote_context_set_close(ote_context_set_t *set);

size_t ote_context_set_count(const ote_context_set_t *set);
/* The i-th context (i < count), in NIC id order; NULL when out of range. */
ote_context_t *ote_context_set_get(ote_context_set_t *set, size_t i);
/* The context with this NIC id, or NULL. */
ote_context_t *ote_context_set_find(ote_context_set_t *set, uint32_t nic_id);

/**
 * ote_context_set_poll_events() - consume every queued async event of every context
 * without blocking: update context state, call the listeners, ack each event.
 * @handled_out (optional) receives the number of events consumed.
 */
ote_status_t ote_context_set_poll_events(ote_context_set_t *set, size_t *handled_out);
/* The async event fds of the set's contexts (ibv_context.async_fd: readable while an
 * event is queued), at most cap of them, for a monitor that sleeps until one is readable;
 * returns how many were written. Events a decorator injects (verbs/fault.h) do not make
 * these readable: a monitor also wakes on a timeout. */
size_t ote_context_set_async_fds(const ote_context_set_t *set, int *fds, size_t cap);
ote_status_t ote_context_set_add_listener(ote_context_set_t *set, ote_context_event_fn fn,
                                          void *arg, uint64_t *id_out);
/* Remove a listener; when this returns, it is not running and will not be called. */
void ote_context_set_remove_listener(ote_context_set_t *set, uint64_t id);

/* The owning set, the provider, the native context and the PD. */
ote_context_set_t *ote_context_owner(const ote_context_t *ctx);
ote_verbs_t *ote_context_verbs(const ote_context_t *ctx);
struct ibv_context *ote_context_native(const ote_context_t *ctx);
struct ibv_pd *ote_context_pd(const ote_context_t *ctx);
uint32_t ote_context_nic_id(const ote_context_t *ctx);
const char *ote_context_name(const ote_context_t *ctx);

/* Route admission: OTE_OK when active, OTE_ERR_PORT_DOWN when paused,
 * OTE_ERR_DEVICE_FATAL when fatal, OTE_ERR_FENCED (errno EIO) when its event consumer was
 * lost. Lock-free. */
ote_status_t ote_context_check(const ote_context_t *ctx);
ote_context_state_t ote_context_state(const ote_context_t *ctx);
void ote_context_get_info(const ote_context_t *ctx, ote_context_info_t *info_out);
/* The route generation alone (as in ote_context_info_t): bumped by every route or state
 * change; a QP built on an older one was built on a route that is gone. */
uint64_t ote_context_route_generation(const ote_context_t *ctx);

/**
 * ote_context_refresh() - query the selected port now (the monitor's periodic pass, for
 * missed PORT_ACTIVE events): an active port with a valid route resumes a paused context;
 * a down port or an invalid route pauses it. A fatal context stays fatal. The query
 * runs without the set's lock: when the route generation changed meanwhile (an event
 * paused the context, another refresh moved the route), its result is stale and is
 * discarded (OTE_ERR_AGAIN, nothing changed), so an older query never clears a newer
 * fault; the next refresh asks again.
 */
ote_status_t ote_context_refresh(ote_context_t *ctx);

/**
 * ote_context_reopen() - the first half of ending OTE_CONTEXT_LOST (context/reopen.c): the
 * device is opened again with a new PD, its route selected on the same port, and the new
 * native context and PD swapped in; the context stays LOST (nothing is admitted) until
 * ote_context_resume(), so the caller can rebuild what it had on the old ones first.
 * The caller must have destroyed everything it built on the old PD and native context
 * (MRs, MWs, QPs, SRQs, CQs, completion channels): they are released after the swap, and
 * what will not be released is retained (counted as OTE_RETAINED_PD, retried by later
 * reopens and by ote_context_set_close, which answers OTE_ERR_RETAINED meanwhile).
 * OTE_OK (also when already reopened and not yet resumed: nothing is done again);
 * OTE_ERR_STATE when the context is not LOST, OTE_ERR_BUSY while another reopen of it
 * runs, OTE_ERR_AGAIN (nothing tried) until the backoff after a failed reopen has passed
 * (100 ms doubled per failure, at most 5 s), else the failure (WARN logged; the context
 * stays LOST with its old natives). The limits stay those of the first open.
 */
ote_status_t ote_context_reopen(ote_context_t *ctx);
/* The second half: a reopened LOST context admits work again: its route is refreshed
 * (ACTIVE, or PAUSED when its port is down), its route generation bumped, its events
 * consumed again. OTE_ERR_STATE when it is not a reopened LOST context. */
ote_status_t ote_context_resume(ote_context_t *ctx);

/* Retention accounting, kept by the layer that failed a native destroy: +1 when it
 * retains an owner, -1 when a later destroy of that owner succeeds. */
void ote_context_retained_add(ote_context_t *ctx, ote_retained_kind_t kind, int delta);
uint64_t ote_context_retained(const ote_context_t *ctx, ote_retained_kind_t kind);

/* Choose the best GID index in a table (exposed for tests): skip zero entries; an entry
 * whose netdev is up first, then RoCE v2, then IPv4-mapped > routable global >
 * link-local, lowest index on ties. netdevs[i] is entry i's netdev state; NULL = none
 * known (as on InfiniBand): the netdev criterion then changes nothing. -1 if none. */
int ote_context_rank_gids_netdev(const struct ibv_gid_entry *entries,
                                 const ote_context_netdev_t *netdevs, size_t n);
/* The same without netdev information. */
int ote_context_rank_gids(const struct ibv_gid_entry *entries, size_t n);

#ifdef __cplusplus
}
#endif
#endif

/*
 * engine/core_internal.h - the objects the engine's owner libraries share: the structs
 * behind the public handles (engine, segment, batch and its request slots),
 * registrations and notifications. Owned by the lowest core library (//engine:core);
 * each owner above it declares its cross-file functions in its own header. Transports
 * never include any of them (they see engine/transport.h and engine/engine_internal.h
 * only). engine/DESIGN.md draws the graph of who calls whom.
 *
 * Libraries (engine/BUILD.bazel), one job each, lowest first:
 *   :core        this header
 *   :listener    listen.c: the one listening socket          (listen_internal.h)
 *   :router      router.c: the engine's transports, its advertisement and the choice of
 *                a transport per segment (ote_segment_info); nic_stats.c
 *                                                             (router_internal.h)
 *   :registry    registered memory: registry.c register/unregister (with optional
 *                names) and the pins the source side of a transport (host->pin) and
 *                local buffers of requests take; the list of registrations peers
 *                discover (host->buffers); mem_node.c, hugepages.c
 *                                                             (registry_internal.h)
 *   :shared_mem  shared_mem.c: shared allocations (host->shared_find)
 *                                                             (shared_mem_internal.h)
 *   :notify      notify.c: the received queue, ote_notify_*, and notifications attached
 *                to batches (decided when no request of the batch is pending)
 *                                                             (notify_internal.h)
 *   :discover    discover.c: ote_segment_buffers, the requester side of discovery
 *   :stats       stats.c: ote_engine_stats, ote_segment_stats over the segments'
 *                counters, which the data path adds to inline      (stats_internal.h)
 *   :batch       batch.c: submit (validate, plan, reserve, cut into slices),
 *                completion, status, wait, cancel, reset, destroy
 *   //engine     engine.c: the lifecycle (create, destroy, address) and segments; it
 *                hands the router the host services of registry, notify and
 *                shared_mem (ote__router_upcalls_t)
 *
 * Ownership: the engine owns its transport, registrations and the queue of received
 * notifications. A segment owns its transport peer; a batch owns its request slots.
 * Segments and batches hold the engine (destroy is BUSY while they exist); a request in
 * flight holds its segment (close is BUSY) and, when its local buffer lies in a
 * registration, that registration (unregister is BUSY).
 *
 * Threads (each joined before the engine's memory is freed; ote_engine_destroy):
 *   listen.c  the acceptor and one thread per handshake: stop flag, shutdown of the
 *             handshake sockets (each also bounded by connect_timeout_ms), join.
 *   tcp       workers: stop flag and an eventfd wake (their epoll waits are bounded).
 *   shm       the acceptor (100 ms poll) and one thread per source connection (its copy
 *             helpers joined by it), woken by the shutdown of its socket; a requester's
 *             receive thread, joined at segment close.
 *   rdma      the monitor (2 ms sleeps), the pump (10 ms waits), the CQ lane workers, a
 *             requester's reader (joined at segment close) and one thread per control
 *             connection served: woken by the shutdown of its socket and waited for
 *             connect_timeout_ms + 10 s; one that does not end keeps the transport, and
 *             so the engine, retained (destroy answers OTE_ERR_RETAINED; call again).
 *   gpu       the staging worker: signalled and joined after the transports.
 *
 * Hot path: ote_batch_submit() takes the batch mutex once to reserve slots, builds the
 * slices in the request slots (one embedded slice for requests up to slice_size, one
 * allocation per larger request) and hands one list per segment to the transport.
 * Completion is lock-free per slice and per request; only the request that ends the
 * batch takes the batch mutex to wake waiters and send attached notifications.
 * ote_batch_wait() first polls the pending count, yielding the CPU, for about as long as
 * the batch's previous wait took when that was short (at most BATCH_SPIN_MAX_NS), and
 * only then sleeps on the condition variable: small batches end without a waiter wakeup.
 *
 * Locks: reg_lk (registrations) is written by (un)register, which call the transport's
 * mem_(un)register hook under it, and read by pins and by submit, which hands slices to
 * the transport under it. A batch's mu is held by ote_batch_cancel around the
 * transport's cancel, never around its submit. nmu (received notifications) and omu
 * (completion of outgoing notifications; unpins waking an unregister) are leaves; an
 * unregister takes omu under reg_lk (written) and releases reg_lk before it waits. segmu
 * (the open segments' list, stats.c) is a leaf, taken by segment open and close and the
 * stats calls only, which take reg_lk (read) once it is released. done() of a slice runs with no
 * transport lock held (transport.h) and may take a batch's mu or omu.
 */
#ifndef OTE_ENGINE_CORE_INTERNAL_H
#define OTE_ENGINE_CORE_INTERNAL_H

/* Internal to OrbitTE's engine: only its own targets (and tests) compile with
 * OTE__INSIDE_ENGINE (Bazel local_defines, never passed on to dependents), so an outside
 * workspace that includes this header fails here instead of building against internals.
 * Use <ote/ote.h>. */
#ifndef OTE__INSIDE_ENGINE
#error "engine/core_internal.h is internal to OrbitTE's engine; include <ote/ote.h> instead"
#endif

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "base/lock.h"
#include "engine/engine_internal.h"
#include "engine/gpu/gpu.h"
#include "engine/transport.h"
#include "ote/ote.h"

typedef struct ote__reg {
    /* First: host->pin gives &pin (a transport and the GPU services read it). kind:
     * ote_mem_kind_t, classified at registration (engine/gpu); perms: OTE_PERM_*. */
    ote__pin_t pin;
    uint64_t start;
    uint64_t len;
    _Atomic long inuse;
    int numa;   /* NUMA node of the memory at registration (-1: unknown) */
    int direct; /* device memory with dma-buf MRs (GPUDirect RDMA): its transports' hooks */
    char name[OTE_NAME_MAX + 1]; /* "" without a name; unique among live registrations */
} ote__reg_t;

typedef struct ote__nin {
    struct ote__nin *next;
    size_t len;
    char from[OTE__ADDR_MAX];
    char name[OTE__ENGINE_NAME_LEN]; /* the sender's engine name, "" for none */
    uint8_t data[];
} ote__nin_t;

/* An outgoing notification: either synchronous (ote_notify_send waits for its ack) or
 * attached to a batch (its outcome kept for ote_batch_notify_result). A batch's one that
 * the receiver refuses for a full queue (OTE_ERR_AGAIN) is sent again by the engine's
 * retry thread (notify.c) until `until`, the deadline of its first send. done, st, rnext,
 * retry_at and backoff_ms under e->omu. */
typedef struct ote__nout {
    ote__slice_t slice;
    struct ote__nout *next;  /* the batch's attached list, then the list being sent */
    struct ote__nout *bnext; /* the batch's sent list (b->sent, under b->mu) */
    struct ote__nout *rnext; /* the engine's retry list */
    ote_engine_t *e;
    ote_segment_t *seg;
    _Atomic int refs;
    int done;
    int batch; /* attached to a batch: retried while the receiver is full */
    ote_status_t st;
    ote_deadline_t until;
    uint64_t retry_at;
    uint32_t backoff_ms;
    size_t len;
    uint8_t msg[];
} ote__nout_t;

#define OTE__MAX_TRANSPORTS 3

/* The request counters of a segment (ote_segment_stats; engine/stats.c), and of the
 * segments an engine closed, per transport (folded in at close). Relaxed atomics, added
 * to by the threads that submit and end the segment's requests (batch.c) and its
 * notifications (notify.c): no lock on the data path. The opcode (ote_opcode_t) is the
 * last index of each array, so that the data path reaches a counter in one address.
 * unmoved: bytes of failed slices, which will not move (in flight = submitted - ended,
 * submitted_bytes - bytes - unmoved). An ended request costs three adds: its latency slot
 * (done_us for a completed one, whose count is the sum of its slots; else other_us and
 * other[state]: the rare path), its bytes and lat_ns_sum. */
/* Latency slots: the bit length of a latency's whole microseconds, at most 54 (2^64 ns);
 * the stats calls fold the slots past the public histogram's last bucket into it, so the
 * data path needs no clamp. */
#define OTE__LAT_SLOTS 56
typedef struct {
    _Atomic uint64_t submitted[2];
    _Atomic uint64_t bytes[2];    /* bytes_done of ended requests */
    _Atomic uint64_t other[3][2]; /* ended not completed: [state - OTE_TRANSFER_FAILED] */
    _Atomic uint64_t submitted_bytes;
    _Atomic uint64_t unmoved;
    _Atomic uint64_t lat_ns_sum;                 /* every ended request */
    _Atomic uint64_t done_us[OTE__LAT_SLOTS][2]; /* completed requests by latency slot */
    _Atomic uint64_t other_us[OTE__LAT_SLOTS];   /* requests ended not completed, by slot */
    _Atomic uint64_t notify_sent;
    _Atomic uint64_t notify_failed;
} ote__counters_t;

/* One shared allocation (shared_mem.c). */
typedef struct {
    uint64_t base, size, id;
    int fd;
} ote__shared_t;

struct ote_engine {
    ote__cfg_t cfg;
    ote__transport_t *tp;    /* tps[0]: answers the INFO handshakes on the listener */
    struct ote__listen *lst; /* the one listening socket (listen.c) */
    ote__transport_t *tps[OTE__MAX_TRANSPORTS];
    char tpnames[OTE__MAX_TRANSPORTS][8];
    size_t ntps;
    char self_addr[OTE__ADDR_MAX]; /* host->self_addr */
    /* What its log lines name (base/log.h's thread tag; host->log_tag): "name@host:port"
     * with an engine_name, else "host:port"; "" until the listener has the address. */
    char log_tag[OTE__ENGINE_NAME_LEN + OTE__ADDR_MAX];
    char info[1025];               /* host->info: the advertisement (router.c) */
    struct ote_auth_key *auth_key; /* host->auth_key: the cluster key, or NULL */
    ote__gpu_t *gpu;               /* memory kinds and GPU paths (engine/gpu) */
    struct ote__files *files;      /* file registrations and the local segment (engine/file) */

    pthread_rwlock_t reg_lk;
    ote__reg_t **regs; /* sorted by start, non-overlapping */
    size_t nregs, capregs;
    _Atomic size_t nregs_hint;
    _Atomic unsigned thp_logged; /* register_thp failures logged once (hugepages.c), a bit each */

    ote_mutex_t nmu; /* received notifications */
    ote_cond_t ncv;
    ote__nin_t *nhead, *ntail;
    size_t nqcount, nqbytes; /* queued: at most OTE_NOTIFY_QUEUE_MAX / _BYTES */
    int nqfull_logged;       /* one WARN per episode of a full queue */

    ote_mutex_t omu; /* completion of synchronous outgoing notifications, and the last */
    ote_cond_t ocv;  /* unpin of a registration that an unregister waits for */
    /* Batch notifications a full receiver refused, sent again by nretry_th (notify.c),
     * started at the first; under omu. */
    ote__nout_t *nretry;
    pthread_t nretry_th;
    int nretry_started, nretry_stop;
    _Atomic long unreg_waiters; /* unregisters waiting on ocv for a pin to drop */

    _Atomic long nsegments;
    _Atomic long nbatches;
    /* ote_engine_destroy began (and was retained): every call but destroy is refused
     * with OTE_ERR_STATE (OTE__ENGINE_GONE). */
    _Atomic int destroying;
    int retained; /* a failed creation's rollback retained a transport: e is not freed */
    _Atomic uint64_t next_uid; /* request ids (slice req_uid): the source's per-request account */
    uint64_t epoch;            /* host->epoch: this instance's random identity (engine.c) */

    ote_mutex_t smu; /* shared allocations (shared_mem.c); a leaf lock */
    ote__shared_t *shared;
    size_t nshared, capshared;
    _Atomic size_t nshared_hint; /* nshared, read without smu */
    uint64_t shared_next;        /* the next allocation's id (never 0) */

    /* Statistics (stats.c). segmu, a leaf lock, holds the list of open segments and the
     * counters of closed ones (by ote_transport_id_t); never taken on the data path. */
    ote_mutex_t segmu;
    struct ote_segment *segs;
    ote__counters_t closed[OTE_STATS_TRANSPORTS];
    uint64_t regs_total; /* successful registrations; under reg_lk (written) */
    _Atomic uint64_t notify_received, notify_refused, auth_open_failures;
};

struct ote_segment {
    ote_engine_t *e;
    ote__transport_t *tp; /* the transport the router chose */
    const char *tpname;
    ote__tpeer_t *peer;
    _Atomic long pending; /* requests in flight */
    _Atomic long notes;   /* notifications attached to batches or in flight */
    char name[OTE__ADDR_MAX];
    /* SEG_LIVE, or SEG_INVALIDATED once ote_segment_invalidate said its peer is gone:
     * every later submit and notification fails OTE_ERR_PEER_LOST (ote__segment_ensure). */
    _Atomic int state;
    uint32_t tpid; /* ote_transport_id_t of tp */
    /* ote_segment_set_close_hook: told when a close begins and how it ended. */
    ote_segment_close_hook_t close_hook;
    void *close_arg;
    struct ote_segment *snext, *sprev; /* e->segs, under e->segmu */
    ote__counters_t c;                 /* its requests and notifications */
};

typedef struct ote__req {
    ote_batch_t *b;
    ote_segment_t *seg;
    ote_opcode_t op;
    uint8_t *local;
    uint64_t remote;
    size_t length;
    _Atomic int state;
    _Atomic ote_status_t error;
    _Atomic uint64_t bytes_done;
    _Atomic uint32_t left;
    _Atomic int canceled;
    /* Timing (ote_batch_status_ex): CLOCK_MONOTONIC ns at submit and at the end (0 while
     * pending), and the transport's ote_transport_id_t; relaxed, the end published by
     * the store of state. */
    _Atomic uint64_t t_submit, t_end;
    _Atomic uint32_t tpid;
    _Atomic uint32_t file_io; /* OTE_FILE_IO_* of its slices (the local segment's) */
    ote__reg_t *local_pin;
    ote__slice_t one;
    ote__slice_t *many;
} ote__req_t;

struct ote_batch {
    ote_engine_t *e;
    size_t cap;
    ote__req_t *reqs;
    ote_mutex_t mu;
    ote_cond_t cv;
    _Atomic size_t nsub;
    _Atomic size_t pending;
    ote__nout_t *notes;            /* attached, not yet decided */
    ote__nout_t *sent;             /* decided and sent (the batch holds a reference each) */
    ote_status_t notes_dropped;    /* a decided one not sent (its requests failed): CANCELED */
    _Atomic uint64_t last_wait_ns; /* how long the last completed wait took (0: none yet) */
};

enum { OTE__SEG_LIVE = 0, OTE__SEG_INVALIDATED = 1 };

/* Before anything is handed to seg's transport: OTE_ERR_PEER_LOST for an invalidated
 * segment, else the transport's reconnect of a lost peer (peer_ensure). */
static inline ote_status_t ote__segment_ensure(ote_segment_t *seg) {
    if (atomic_load_explicit(&seg->state, memory_order_acquire) == OTE__SEG_INVALIDATED)
        return OTE_ERR_PEER_LOST;
    return seg->tp->ops->peer_ensure(seg->peer);
}

/* Whether e is being destroyed (a destroy was retained): the public calls other than
 * ote_engine_destroy return OTE_ERR_STATE then. */
#define OTE__ENGINE_GONE(e) (atomic_load_explicit(&(e)->destroying, memory_order_acquire) != 0)

#endif

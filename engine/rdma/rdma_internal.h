/*
 * engine/rdma/rdma_internal.h - what the files of the RDMA transport share: its structs,
 * its lock order and its cross-file functions. Private to engine/rdma/ (never in a
 * public hdrs).
 *
 * The RDMA transport composes context, cq, qp, endpoint and grant behind the engine's
 * transport table (engine/transport.h). How it works (what it owns, the requester and
 * source paths, source-side staging, GPUDirect source grants, the data devices, and the
 * job of each file) is written down in engine/rdma/DESIGN.md; this header keeps the
 * contract: the shared structs, the lock order and the cross-file functions.
 *
 * Lock order: tp->mu, then p->mu (the monitor walks tp->peers and each peer's notes).
 * c->wmu is a leaf: nothing else is locked under it, and no thread holds tp->mu or p->mu
 * while it sends (ote__rdma_conn_send* may be called from any thread, with no transport
 * lock held).
 * The grant and endpoint layers call this transport's callbacks (source pin/answer,
 * grant request, CONNECT exchange) with none of their own locks held. A slice's done()
 * is never called with a transport lock held.
 */
#ifndef OTE_ENGINE_RDMA_RDMA_INTERNAL_H
#define OTE_ENGINE_RDMA_RDMA_INTERNAL_H

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "base/lock.h"
#include "base/status.h"
#include "base/time.h"
#include "context/buffers.h"
#include "context/context.h"
#include "cq/lane.h"
#include "cq/workers.h"
#include "endpoint/endpoint.h"
#include "engine/control/auth.h"
#include "engine/control/ctl.h"
#include "engine/engine_internal.h"
#include "engine/src_account.h"
#include "engine/rdma/proto.h"
#include "engine/rdma/rdma_pairing.h"
#include "engine/rdma/selector/selector.h"
#include "engine/transport.h"
#include "grant/grant.h"
#include "qp/qp.h"
#include "verbs/verbs.h"

#define OTE__RDMA_MAX_LANES 64 /* rdma_lanes at most (the INFO message allows 64) */
#define OTE__RDMA_FRAME_MAX (OTE_CTL_HDR_LEN + OTE_CTL_MAX_NOTIFY + 64)
/* Bytes a control connection may queue beyond what its socket accepted. A peer that lets
 * more pile up (it does not read) is dropped, never waited on. */
#define OTE__RDMA_OUT_CAP (256u << 10)
/* Poll period of a connection's own thread while its output queue holds bytes: it
 * flushes the queue and checks the queue's deadline at least this often. */
#define OTE__RDMA_CONN_POLL_MS 10
/* ... and while the queue is empty: nothing is due then (bytes queued by another thread,
 * a kill, the peer's input all wake it at once: wake_fd, shutdown, the socket), so an idle
 * connection's thread costs one wake-up a second, not a hundred (1,000s of peers). */
#define OTE__RDMA_CONN_IDLE_MS 1000
/* Notification ids carry this tag; call (INFO/CONNECT) ids never do, grant ids are
 * 24-bit: an answer of the wrong kind is recognised as such. */
#define OTE__RDMA_NOTE_TAG (1ull << 62)
#define OTE__RDMA_MAX_NICS OTE_RP_MAX_DEVS

/*
 * Epochs and cache misses (restarted peers). Every engine has a random epoch
 * (host->epoch); INFO / INFO_ACK carry it (proto.h). A requester peer remembers the
 * incarnation it met first (epoch, else process id for an older peer without one); a
 * reconnect that meets another one fails the segment for good with OTE_ERR_PEER_LOST (a
 * WARN says the peer restarted and the segment must be reopened): the user's remote
 * addresses named the old incarnation's memory, so nothing is sent to the new one. A
 * GRANT_REQ carries the source's epoch; the source refuses one for another epoch, or
 * one that names a QP it does not have (its endpoints for this requester were evicted),
 * with OTE_ERR_STATE in the frame header: a cache miss. The requester's reader turns that
 * into OTE__RDMA_CACHE_MISS; the grant layer retires the slot's QP (so the next pick
 * rebuilds it with CONNECT), and the run goes back to the queue once (retries): nothing of
 * it was posted, since a grant posts only after a GRANT_RESP OK, so a WRITE is as safe to
 * retry as a READ. A second miss fails the run with OTE_ERR_PEER_LOST. CONNECT carries
 * both epochs too (to a source that advertises rdma_connect_epoch=1): a source refuses
 * one for another incarnation of either end the same way, before it builds anything; the
 * requester's build fails with the miss and the run that waited for it is retried once
 * as above (it had not started).
 *
 * Dead peers' endpoints are evicted (ote_endpoint_evict: out of the store, QPs destroyed
 * by the monitor's reclaim once drained, a failed destroy retained): a requester's, by
 * the monitor once its control connection is dead and nothing of it is queued or pumped,
 * at a reconnect and at peer_close; a source's, when the requester's control connection
 * ends (after its grants were ended), unless another connection of the same requester
 * process already uses them.
 */
#define OTE__RDMA_CACHE_MISS ote_status_make(OTE_ERR_STATE, ESTALE)
/* A GRANT_REQ the source refused OTE_ERR_AGAIN (no receive slot for its receipt, or too
 * many requests open): nothing was bound, so the run goes back to the queue (a fresh
 * request id) and is asked again after a short pause, until its deadline
 * (rdma_credits.h). */
#define OTE__RDMA_SRC_BUSY ote_status_make(OTE_ERR_AGAIN, EBUSY)

typedef struct ote__rdma_tp rdma_tp_t;

/* A slice's rdma scratch (ote__slice_t.xp): ote__rdma_xp(s). */
typedef struct {
    rdma_tp_t *tp;           /* the transport that took the slice */
    struct ibv_mr *mr;       /* temporary MR of an unregistered local buffer, or NULL */
    uint32_t nic;            /* the data device the selector picked */
    uint32_t retries;        /* READ slices moved to another device after a loss */
    struct ote__tpeer *peer; /* the peer whose queue the slice came from */
    void *conn;              /* a run's first slice: a reference on the control connection
                              * its grant was asked on (for a RELEASE), or NULL */
    void *parent;            /* its request's grant reservation (rdma_credits.c), or NULL */
    uint32_t credit;         /* a run's first slice: the run holds a grant credit */
    uint32_t direct;         /* it goes to a direct slot (rdma_direct.c) */
    uint32_t plain;          /* the source sent it back to a plain slot: never direct again */
    uint32_t rdev;           /* the peer's device it was paired with (rdma_pairing.h) */
} rdma_xp_t;
_Static_assert(sizeof(rdma_xp_t) <= OTE__SLICE_SCRATCH, "rdma's slice scratch fits a slice's");
static inline rdma_xp_t *ote__rdma_xp(ote__slice_t *s) { return (rdma_xp_t *)(void *)s->xp; }
static inline const rdma_xp_t *ote__rdma_cxp(const ote__slice_t *s) {
    return (const rdma_xp_t *)(const void *)s->xp;
}
typedef ote__acct_t acct_t; /* the source's account of one request (rdma_accounts.c) */

/* A registration's MRs. rdma.c owns the list (tp->regs, under tp->mu). */
typedef struct reg_ent {
    struct reg_ent *next;
    void *addr;
    ote_buffer_t *buf;
    /* Device memory with a dma-buf (rdma_direct.c): our own fd of it (-1: host memory),
     * the range's offset in it and its length, for the exact MRs of source grants. */
    int dmabuf_fd;
    uint64_t dmabuf_off, len;
} reg_ent_t;

/*
 * A control connection (either side). The socket is non-blocking and nobody ever waits on
 * it while holding a lock or on a thread that is not the connection's own:
 * ote__rdma_conn_send*() (any thread: lane workers answering grants, the monitor, user
 * threads) sends what the socket takes at once and queues the rest (at most
 * OTE__RDMA_OUT_CAP bytes); the connection's own thread (reader or server) flushes the
 * queue. A queue that overflows or makes no
 * progress for send_timeout_ns kills the connection (dead, socket shut down): its owner
 * thread then fails whatever waited on it with OTE_ERR_PEER_LOST.
 *
 * Fields: rdma_conn.c owns fd, wmu, the out queue, refs, dead and the in buffer (in,
 * ilen, iconsumed: the owner thread only). The handshake sets version and peer_addr
 * once, before any other thread uses the connection: rdma_server.c on the source side,
 * rdma_peer.c on the requester side. process, pd, nic and lanes (the peer's INFO) are
 * written by the server thread on INFO (rdma_server.c) or, on the requester side, by the
 * reader under p->mu on INFO_ACK (rdma_peer.c) before the caller of the INFO call reads
 * them.
 */
typedef struct conn {
    rdma_tp_t *tp;
    int fd;
    int wake_fd;     /* eventfd: wakes the owner thread when bytes were queued */
    ote_mutex_t wmu; /* out queue */
    uint8_t *out;    /* OTE__RDMA_OUT_CAP bytes once needed */
    size_t ooff, olen;
    uint64_t out_progress_ns; /* last time the queue drained some bytes (or was empty) */
    uint64_t send_timeout_ns;
    _Atomic int refs;
    _Atomic int dead;
    uint8_t *in; /* FRAME_MAX bytes: received, not yet consumed (owner thread only) */
    size_t ilen, iconsumed;
    uint16_t version; /* negotiated in the handshake; 0 before it */
    int release_ok;   /* requester side: the source advertised rdma_release=1 (RELEASE) */
    int cepoch_ok;    /* requester side: it advertised rdma_connect_epoch=1 (proto.h) */
    int stage_ok;     /* requester side: the source advertised rdma_stage=1 (staged READs) */
    int direct_ok;    /* requester side: the source advertised rdma_direct=1 (rdma_direct.c) */
    int parent_ok;    /* requester side: it advertised rdma_parent=1 (rdma_src_parents.c) */
    int grant_mr;     /* requester side: it grants host memory by exact MRs (rdma_grant_mr=1) */
    int pair_ok;      /* requester side: it advertised rdma_pair=1 (rdma_pairing.h) */
    uint64_t process, pd;
    uint32_t nic, lanes;
    uint32_t ndev;                     /* the peer's data devices (1..) */
    uint32_t nics[OTE__RDMA_MAX_NICS]; /* their NIC ids (nics[0] == nic) */
    char peer_addr[OTE__ADDR_MAX];
    char peer_name[OTE__ENGINE_NAME_LEN]; /* its HELLO's engine name ("" for none) */
    int adopted;    /* from the engine's listener: the last put calls host->conn_closed */
    uint64_t epoch; /* the peer's epoch (its INFO / INFO_ACK); 0: not sent (older engine) */
    /* Source side (the connection's own thread): our device that serves the pairs whose
     * source index is i, plus 1 (0: not chosen yet): device i itself, or an active one
     * while i is paused, chosen again when a device of ours comes up (map_gen behind
     * tp->dev_gen: rdma_source.c); src_used[r]: bit d set once our device d made an
     * endpoint for its device r (evicted when the connection ends). */
    uint8_t src_map[OTE__RDMA_MAX_NICS];
    uint8_t src_used[OTE__RDMA_MAX_NICS];
    uint32_t map_gen;
    /* Source side: when its last CONNECT built a QP here (ns), and whether a grant was
     * served here since (rdma_srcqp.c: until then its QPs are not retired for
     * rdma_max_qps, within a bound). */
    _Atomic uint64_t src_connect_ns;
    _Atomic int src_granted;
    /* Source side: staged grants of this connection whose copy into the bounce runs
     * (rdma_source.c); its server thread waits for them before it releases anything. */
    _Atomic int src_copies;
} conn_t;

/* Requester: an INFO or CONNECT call waiting for its answer (on the caller's stack).
 * rdma_peer.c only: linked by the caller, ended by the reader, both under p->mu. */
typedef struct call {
    struct call *next;
    uint64_t req_id;
    uint16_t want; /* OTE_RP_INFO_ACK or OTE_RP_CONNECT_ACK */
    int done;
    ote_status_t st;
    ote_qp_path_t path;
} call_t;

/* Requester: a notification waiting for its NOTIFY_ACK (heap). Created and linked by
 * rdma_requester.c; taken (under p->mu) and ended by whoever takes it first: the reader
 * on its NOTIFY_ACK or on loss of the connection (rdma_peer.c), the monitor at its
 * deadline, or the sender when the send fails (rdma_requester.c). */
typedef struct note {
    struct note *next;
    uint64_t req_id; /* OTE__RDMA_NOTE_TAG | n */
    ote_deadline_t deadline;
    ote__slice_t *s;
} note_t;

/* Requester: a grant id waiting for its GRANT_RESP. Linked by rdma_requester.c, taken by
 * the reader (rdma_peer.c), both under p->mu. */
typedef struct grant_id_ent {
    struct grant_id_ent *next;
    uint64_t id; /* on the wire: (device index << 32) | the device's grant id */
    /* What a RELEASE of a late answer names: the pair, the capability (0 READ, 1 WRITE),
     * the slot and the source's QP on it. */
    uint32_t pair, cap, slot, src_qpn;
    /* The run (its first slice): a staged WRITE's COMMIT wait names it. Only a name: the
     * run may have ended (its deadline, a cancel) before the answer came, so the reader
     * never reads it; what it needs of it is copied here. */
    ote__slice_t *s;
    ote_deadline_t deadline; /* the run's */
    /* Its request's id and remote range (a staged answer marks them: rdma_pump.c). */
    uint64_t req_uid, req_remote, req_len;
} gid_ent_t;

/* Requester: a staged WRITE grant answered OK (GRANT_RESP with OTE_RP_RESP_COMMIT): its
 * run ends only with the source's COMMIT (rdma_commit.c). Linked in p->waits.commits under
 * p->mu by the reader before the answer goes to the grant layer; taken by whoever ends
 * the run: the grant's end (a COMMIT already here), the COMMIT (a run parked by its
 * grant's end, OK or not: the source may still copy a canceled grant's bounce), the loss
 * of the connection, or the monitor at the run's deadline. */
typedef struct commit_wait {
    struct commit_wait *next;
    uint64_t id;   /* the grant's wire id */
    uint32_t rkey; /* the window its answer named */
    /* The run, named by its first slice and its request's id (uid: a slice freed before
     * the wait was linked and another at its address never match: ids are never reused). */
    ote__slice_t *s;
    uint64_t uid;
    ote_deadline_t deadline;
    int parked;       /* its grant ended (gst): the run waits here for the COMMIT */
    ote_status_t gst; /* the grant's own status (a failure or cancel is kept) */
    int got;          /* the COMMIT came (or the connection was lost): st */
    ote_status_t st;
} cwait_t;

/* A requester grant's id on the wire names the device whose grant manager owns it. */
#define OTE__RDMA_GRANT_WIRE(nic, id) (((uint64_t)(nic) << 32) | (uint64_t)(id))

/*
 * The QP build the pump thread owes a requester peer (p->build.state). Only the
 * functions of rdma_build.c move it, under p->mu; one build is owed at a time (a build
 * asked while one is wanted folds into it). Every state but IDLE makes the monitor end
 * the peer's queued slices at their deadline or cancel (ote__rdma_queue_expire): the
 * pump thread may be inside a slow build.
 *
 *   IDLE --ask--> WANTED / WANTED_FOR_RUN --begin--> UNDER_WAY --end--> IDLE
 *   WANTED --ask for a run--> WANTED_FOR_RUN;  WANTED* --drop--> IDLE
 *
 * A failed build that a run waited for leaves its status owed to the next run on that
 * device and capability (p->build.fail_*): that is a record beside the state, not a
 * state, because it outlives the next ask (the run picked another device and asked a
 * build there) and that build's whole course.
 */
typedef enum {
    OTE__RDMA_BUILD_IDLE = 0, /* nothing owed */
    /* A slot to build in the background: the run that picked it went on another READY
     * slot of the endpoint (a submitting thread, or any pump at rdma_max_qps). */
    OTE__RDMA_BUILD_WANTED,
    /* A run found no READY QP on its endpoint and waits at the head of the queue for this
     * build (started by the pump thread once rdma_max_qps has room: p->pump.qp_wait). */
    OTE__RDMA_BUILD_WANTED_FOR_RUN,
    /* The pump thread builds it (the CONNECT round trip), p->mu dropped. */
    OTE__RDMA_BUILD_UNDER_WAY,
} ote__rdma_build_state_t;

/* The build taken by the pump thread (ote__rdma_build_begin): which slot of which
 * endpoint, and whether a queued run waits for it. */
typedef struct {
    uint32_t k, cap, slot;
    int for_run;
} ote__rdma_build_job_t;

/* p->build: what the pump owes and learnt about this peer's requester QPs. Under p->mu;
 * written only by rdma_build.c's functions (called by rdma_pump.c and
 * rdma_requester.c). */
typedef struct {
    ote__rdma_build_state_t state;
    uint32_t k, cap, slot; /* the build wanted or under way (state != IDLE) */
    /* The failure owed to the run that waited for a build: the next run that starts on
     * device fail_k (any device for a cache miss, the peer's) and capability fail_cap
     * ends with fail_st, as it would have had it built the QP itself. OTE_OK: none owed.
     * The pump thread forgets it at the end of a round with no build wanted. */
    ote_status_t fail_st;
    uint32_t fail_k, fail_cap;
    /* A GRANT_REQ on (device, cap) met a cache miss: the source forgot that endpoint, so
     * the next start there retires every idle READY QP of it (rebuilt by CONNECT), not
     * only the one that missed. Indexed like p->conn.ep[][] (the endpoint the run used). */
    uint8_t miss_flush[OTE__RDMA_MAX_NICS][OTE__RDMA_EPS];
    /* The source refused this peer's last QP build AGAIN (its rdma_max_qps), until a
     * build works: a queued run that ends at its deadline says so. */
    int src_refused;
} ote__rdma_build_t;

/* p->pump.state: who pumps the peer's queue. rdma_pump.c alone, under p->mu. */
typedef enum {
    OTE__RDMA_PUMP_IDLE = 0, /* nobody: a submitting thread or the pump thread may take it */
    OTE__RDMA_PUMP_BUSY,     /* one thread pumps (mu dropped around each start and build) */
    OTE__RDMA_PUMP_AGAIN,    /* ... and was asked to go round again before it lets go */
} ote__rdma_pump_state_t;

/*
 * A requester peer (the engine's ote__tpeer_t). Its fields are grouped by owner; each
 * group names its writer and its lock. tp, name, mu and cv are set at open (rdma_peer.c)
 * and read-only after; tp_next links tp->peers under tp->mu (rdma_peer.c; walked by the
 * monitor and the pump thread).
 */
#define OTE__RDMA_REDIRECT_MEMO 8
struct ote__tpeer {
    rdma_tp_t *tp;
    struct ote__tpeer *tp_next; /* tp->peers, under tp->mu */
    char name[OTE__ADDR_MAX];
    ote_mutex_t mu;
    ote_cond_t cv;
    /* rdma_peer.c: the control connection. c and ep[][] are written under mu at connect
     * and disconnect (read by the monitor and the pump; read-only while connected);
     * reader and reader_started only by the thread that opens, ensures or closes the
     * peer. met_*: the incarnation this peer met at open (its epoch, and process id for
     * an older peer without one); restarted: a reconnect met another one (then the peer
     * fails for good). */
    struct {
        conn_t *c;
        pthread_t reader;
        int reader_started;
        /* requester endpoints per local device and endpoint index (the peer's device, the
         * capability; 2, 3: direct, rdma_direct.c): rdma_pairing.h says which exist */
        ote_endpoint_t *ep[OTE__RDMA_MAX_NICS][OTE__RDMA_EPS];
        uint64_t met_epoch, met_process;
        int restarted;
    } conn;
    /* Under mu: what waits for an answer from the peer, ended by the reader (its answer,
     * or the loss of the connection). calls, next_call: rdma_peer.c; notes, next_note and
     * grants (grant ids waiting for their GRANT_RESP): linked by rdma_requester.c;
     * commits (staged WRITE runs waiting for their COMMIT): rdma_commit.c. */
    struct {
        call_t *calls;
        note_t *notes;
        gid_ent_t *grants;
        cwait_t *commits;
        uint64_t next_call, next_note;
    } waits;
    /* Under mu: data slices not started yet (FIFO: rdma_pump.c appends and takes runs,
     * rdma_requester.c puts a run back at the head), and the bytes of this peer's started
     * runs per device (at most OTE__RDMA_NIC_WINDOW each, or one run: added by the pump,
     * given back by rdma_requester.c when the run ends or does not start). */
    struct {
        ote__slice_t *head, *tail;
        uint64_t inflight[OTE__RDMA_MAX_NICS];
    } queue;
    /* rdma_pump.c, under mu: who pumps (one thread; peer_close waits until nobody does),
     * and what the queue's head waits for: grant credits (rdma_max_grants: credit_wait,
     * rdma_credits.c) or room under rdma_max_qps for its build (qp_wait); then the
     * monitor ends queued slices at their deadline or cancel. No run starts before
     * busy_until (ns; set by rdma_requester.c when a source answered AGAIN). purge: a
     * cancel asked the pump to drop canceled queued slices (atomic, no lock). */
    struct {
        ote__rdma_pump_state_t state;
        int credit_wait, qp_wait;
        uint64_t busy_until;
        _Atomic int purge;
    } pump;
    /* rdma_build.c, under mu: the QP build owed (above). */
    ote__rdma_build_t build;
    /* rdma_direct.c, under mu: the last requests (req_uid) the source redirected to
     * direct slots; their later runs go there first (a ring, oldest overwritten at
     * next). [lo, hi): the remote range of those requests (joined where they meet or
     * touch, else the last one's): a later request that starts in it goes direct first;
     * one the source sends back to a plain slot forgets it. */
    struct {
        uint64_t redirected[OTE__RDMA_REDIRECT_MEMO];
        uint32_t next;
        uint64_t lo, hi;
    } direct;
    /* rdma_peer.c's reader writes, rdma_pump.c reads, under mu: the last request (uid)
     * the source answered staged and its remote range [lo, hi) (joined with the ranges
     * of earlier staged requests it meets): its further runs, and those of later
     * requests that start in that range, are cut at gpu_staging_chunk, at most
     * gpu_staging_depth of them in flight per device (rdma_stage.c). An answer not
     * staged for a request that starts in the range forgets the range. */
    struct {
        uint64_t uid, lo, hi;
    } staged;
    ote__rdma_pairs_t pairs; /* under mu: the peer's registrations' best devices */
};

/* Whether a build is wanted (the pump thread has work for this peer even with nothing
 * queued), and whether one is owed at all (wanted or under way). Under p->mu. */
static inline int ote__rdma_build_wanted(const ote__tpeer_t *p) {
    return p->build.state == OTE__RDMA_BUILD_WANTED ||
           p->build.state == OTE__RDMA_BUILD_WANTED_FOR_RUN;
}

static inline int ote__rdma_build_owed(const ote__tpeer_t *p) {
    return p->build.state != OTE__RDMA_BUILD_IDLE;
}

/* Whether a thread pumps p (under p->mu). */
static inline int ote__rdma_pumping(const ote__tpeer_t *p) {
    return p->pump.state != OTE__RDMA_PUMP_IDLE;
}

/* Bytes of one peer's slices in flight on one device: the rest wait in the peer's queue,
 * so a device that goes down takes only these with it (the queued ones go elsewhere).
 * The window is this or rdma_grant_max, whichever is larger (one grant always fits). */
#define OTE__RDMA_NIC_WINDOW (16u << 20)

/*
 * One data device (NIC) of the transport: its context, CQ lanes and their workers (on the
 * NIC's NUMA node), endpoint store and grant manager. Created at transport creation for
 * every allowed device with an active or down port (rdma_devices / rdma_exclude; a down
 * one paused in the selector until the monitor sees it active), read-only after
 * but for the counters. The selector (tp->sel, same index) picks one per slice.
 */
/* A lost device's reopen (rdma_reopen.c): nothing to do (or waiting for its work to
 * drain), everything of the old native context destroyed (the reopen is tried, with
 * the context layer's backoff), or reopened with the lanes, SRQs and MRs still to be made
 * anew before it is resumed. */
typedef enum { RDMA_REOPEN_NONE = 0, RDMA_REOPEN_UNBOUND, RDMA_REOPEN_REBIND } rdma_reopen_t;

typedef struct rdma_nic {
    rdma_tp_t *tp;
    uint32_t index;
    ote_context_t *ctx;
    uint32_t nlanes;
    ote_cq_lane_t *lanes[OTE__RDMA_MAX_LANES];
    ote_cq_workers_t *workers;
    ote_endpoint_store_t *eps;
    ote_endpoint_store_t *deps; /* source: direct endpoints, a private PD per QP */
    ote_grant_mgr_t *gm;
    _Atomic uint64_t req_bytes;  /* requester: bytes of slices that ended OK on it */
    _Atomic uint64_t grant_reqs; /* requester: GRANT_REQs sent on it (control round trips) */
    _Atomic uint64_t src_bytes;  /* source: bytes of grants served on it */
    _Atomic int was_active;      /* the monitor's last view of its port */
    /* The monitor's (rdma_monitor.c): the context's route generation its QPs were last
     * fenced against (0: not looked at yet). */
    uint64_t route_gen;
    /* Depths drawn from the device's limits at creation (rdma_limits.c). */
    uint32_t cq_depth;   /* each lane's send and receive CQ */
    uint32_t send_wr;    /* each QP's send depth */
    uint32_t recv_slots; /* each QP's receive slots (rdma_recv_slots, clamped) */
    uint32_t read_flags; /* OTE_VERBS_QP_* of the requester's READ QPs */
    /* rdma_srq.c: the shared receive queue of each lane (NULL: per-QP receive queues). */
    struct ote_srq *srq[OTE__RDMA_MAX_LANES];
    uint32_t srq_slots; /* each SRQ's depth (0: none) */
    /* rdma_reopen.c (the monitor's): where the reopen of a device whose event consumer
     * was lost stands. */
    rdma_reopen_t reopen;
    uint32_t rebind_failures; /* in a row (the WARN's rate) */
} rdma_nic_t;

/* rdma_reopen.c: the monitor's pass over devices whose event consumer was lost: their
 * work drained, what they built on the old native context destroyed, the context
 * reopened, the lanes, SRQs and registrations' MRs made anew, the device resumed. */
void ote__rdma_reopen_watch(rdma_tp_t *tp);

/* rdma_srq.c: n's SRQs, one per lane (none on a device without SRQs); and their
 * destruction after the endpoint stores (returns how many were retained). */
ote_status_t ote__rdma_srqs_start(rdma_tp_t *tp, rdma_nic_t *n);
size_t ote__rdma_srqs_drop(rdma_nic_t *n, uint32_t dev);

/* rdma_limits.c: n's depths and QP flags from its device's limits (INFO when clamped). */
void ote__rdma_nic_depths(rdma_tp_t *tp, rdma_nic_t *n);
/* The receive slots of the transport's source QPs (the smallest over its devices). */
uint32_t ote__rdma_recv_slots(const rdma_tp_t *tp);

/* A server connection and its (joinable) thread. rdma_server.c only. */
typedef struct srv {
    conn_t *c;
    pthread_t th;
    int exited; /* under tp->mu: the thread is past its last use of tp but for this */
} srv_t;

/* How a source grants its host memory (rdma_grant_mode; rdma_direct.c): a type-2 window
 * bound over the range on the requester's QP, or an exact MR in a private PD. */
typedef enum { OTE__RDMA_GRANT_MW = 0, OTE__RDMA_GRANT_MR = 1 } ote__rdma_grant_mode_t;

/*
 * The transport. rdma.c creates and tears down everything here and owns base, cfg, host,
 * the layer objects (v .. gm), process_id, pd_id, the monitor thread, stop and regs.
 * rdma.c sets addr (the engine's address) at creation, read-only after. rdma_server.c
 * owns sconns/nsconns (under mu). rdma_peer.c links peers
 * (under mu). Every file reads the read-only part (cfg, host, layer objects) freely.
 */
struct ote__rdma_tp {
    ote__transport_t base;
    ote__cfg_t cfg;
    ote__host_t host;
    ote_verbs_t *v;
    ote_context_set_t *set;
    ote_buffer_manager_t *bm;
    rdma_nic_t nics[OTE__RDMA_MAX_NICS];
    uint32_t nnics;
    ote_selector_t *sel;
    struct rdma_topo *topo; /* rdma_topo.c: rank tables per GPU and node, the file */
    uint64_t process_id, pd_id;
    char addr[OTE__ADDR_MAX];
    pthread_t monitor, pumper;
    int monitor_started, pumper_started;
    /* rdma_monitor.c: written by ote__rdma_monitor_wake while the monitor says idle. */
    int monitor_efd;
    _Atomic int monitor_idle;
    /* rdma.c: a teardown could not finish (counted once in the retained transports) */
    int retained_counted;
    /* The pump thread (rdma_requester.c): a slice that ends (under a CQ lane's poll lock,
     * in the monitor or in a reader) only kicks it; it starts the peers' queued slices
     * with no lock held. pump_kick under mu. */
    ote_cond_t pump_cv;
    int pump_kick;
    _Atomic int stop;
    _Atomic int src_copies; /* staged copies running (into a bounce, or back), every connection */
    _Atomic int src_stages; /* source bounce buffers (and their MRs) held now (rdma_stage.c) */
    ote_mutex_t mu;         /* registrations, server connections, peers */
    ote_cond_t cv;
    reg_ent_t *regs;
    srv_t **sconns; /* heap entries: a thread keeps its own; grows to rdma_max_peers */
    size_t nsconns, capsconns;
    ote__tpeer_t *peers;       /* open requester peers (notification deadlines) */
    ote__acct_set_t accts;     /* source: accounts of requests, by connection, under mu */
    struct rdma_stage *stages; /* source: staged WRITEs answered OK (rdma_stage.c), under mu */
    struct rdma_stage_mr *stage_mrs; /* source: kept bounces' MRs (rdma_stage_mrs.c), under mu */
    _Atomic uint64_t stage_mrs_made; /* ... registered so far */
    _Atomic uint64_t stage_tmp_mrs;  /* temporary MRs over a grant's bounce, so far */
    uint64_t epoch;                  /* host->epoch, sent in INFO / INFO_ACK (read-only) */
    _Atomic uint32_t dev_gen;        /* monitor: +1 each time a data device comes up */
    struct ote__rdma_tp *live_next;  /* rdma_test.c (test-only): the process's transports */
    /* RELEASE messages: sent as a requester; applied / ignored as a source. */
    _Atomic uint64_t rel_sent, rel_applied, rel_ignored;
    /* rdma_requester.c: bytes of runs in flight over every peer and device (the
     * rdma_max_inflight limit), its highest value, and whether a peer's queue waits for
     * room under the limit (an ending run then kicks the pump thread). */
    _Atomic uint64_t inflight_all, inflight_peak, cap_waits;
    _Atomic int cap_wait;
    /* Requester runs started by a submitting thread / by the pump thread; QP builds done
     * by the pump thread (a submitting thread never builds). rdma_requester.c. */
    _Atomic uint64_t starts_inline, starts_pumped, qp_builds;
    /* rdma_credits.c: grant credits, receive-credit retries and the QP limit. */
    struct rdma_credits *cred;
    /* rdma_src_parents.c: the source's reservations of whole parents. */
    struct rdma_sparents *sparents;
    /* rdma_direct.c: exact-range MRs of source grants not deregistered yet (live, or
     * orphans of bm whose dereg failed) and served in all; redirects sent (source) and
     * followed (requester). */
    _Atomic uint64_t direct_mrs, direct_served, direct_redirects, direct_followed;
    /* runs sent direct first: their request, or its remote range, was redirected before */
    _Atomic uint64_t direct_recalled;
    /* The monitor's recoveries (rdma_monitor.c): CQ lanes replaced after a lane error;
     * QPs fenced because their lane failed or their route changed. */
    _Atomic uint64_t lane_replacements, lane_fenced_qps, route_fenced_qps;
    /* rdma_reopen.c: devices reopened after a lost event consumer; reopens that failed. */
    _Atomic uint64_t device_reopens, device_reopen_failures;
    /* Devices the pump put back in the selector ahead of the monitor (rdma_pump.c). */
    _Atomic uint64_t sel_resyncs;
    /* rdma_direct.c: how host memory is granted (rdma_grant_mode, resolved at creation,
     * read-only after); whether every data device has type-2 windows; exact MRs
     * deregistered in all (direct_served - direct_released == direct_mrs) and those of
     * them over host memory registered in all. */
    ote__rdma_grant_mode_t grant_mode;
    int have_mw;
    _Atomic uint64_t direct_released, direct_host_served;
    int pair_adv; /* rdma_pair=1 advertised (not under the no_pair test hook) */
};

/* ---- rdma_conn.c: one control connection ----------------------------------------- */

/* Takes over fd (closed on failure); NULL when out of memory. One reference. */
conn_t *ote__rdma_conn_new(rdma_tp_t *tp, int fd);
void ote__rdma_conn_get(conn_t *c);
/* Drops a reference; the last one closes the socket and frees the connection. */
void ote__rdma_conn_put(conn_t *c);
/* Marks the connection dead (logging why, once, when why is not NULL) and shuts its
 * socket down, which wakes its own thread. Any thread. */
void ote__rdma_conn_kill(conn_t *c, const char *why);
/*
 * Owner thread: the next frame (valid until the next call), flushing queued output while
 * waiting. OTE_ERR_PEER_LOST when the connection closed or died (or *stop was set),
 * OTE_ERR_PROTOCOL for bad framing, OTE_ERR_TIMEOUT at dl.
 */
ote_status_t ote__rdma_conn_next(conn_t *c, ote_ctl_msg_t *m, ote_deadline_t dl,
                                 const _Atomic int *stop);
/* Queue one encoded frame / encode and queue one message / one OTE_CTL_RDMA message of
 * the negotiated version. Any thread; never blocks on the socket. */
ote_status_t ote__rdma_conn_send_raw(conn_t *c, const uint8_t *buf, size_t len);
ote_status_t ote__rdma_conn_send(conn_t *c, const ote_ctl_msg_t *m);
/* The owner thread's frames of c as a channel for the key's challenge-response
 * (engine/control/auth.h), each receive bounded by dl (and *stop when not NULL). */
typedef struct {
    conn_t *c;
    ote_deadline_t dl;
    const _Atomic int *stop;
} rdma_auth_chan_t;
ote_auth_io_t ote__rdma_auth_io(rdma_auth_chan_t *ch);
ote_status_t ote__rdma_conn_send_rp(conn_t *c, uint64_t req_id, ote_status_t status,
                                    const ote_rp_msg_t *rp);

/* ---- rdma_server.c: adopted control connections ------------------------------------ */

/* ops->adopt: a control connection from the engine's listener, its HELLO in hello[0,
 * len); a server thread answers it. Takes fd in every case. */
ote_status_t ote__rdma_adopt(ote__transport_t *t, int fd, const char *from, const uint8_t *hello,
                             size_t len);
/* Join the server threads that have exited and drop their connections (the last
 * reference closes the socket, which is how a dropped peer learns it). Monitor thread. */
void ote__rdma_servers_reap(rdma_tp_t *tp);
/* Teardown, after tp->stop is set: wake the server threads and join them within
 * wait_ms. Returns how many did not end (they still use tp). */
size_t ote__rdma_servers_stop(rdma_tp_t *tp, uint64_t wait_ms);

/* ---- rdma_source.c: the source side ------------------------------------------------ */

/* Server thread: answer a CONNECT / GRANT_REQ (always answered, now or by the grant). */
void ote__rdma_src_connect(conn_t *c, uint64_t req_id, const ote_rp_msg_t *rq);
void ote__rdma_src_grant(conn_t *c, uint64_t req_id, const ote_rp_msg_t *rq);
/* The source endpoint (and our device) of the requester on c for pair ((our device <<
 * 8) | its device) and cap. OTE_ERR_PROTOCOL for a device index out of range. Our device
 * is the one c->src_map chose for that index (c's own thread only). */
/* The source endpoint of the requester on c for its device ri on our device d (made when
 * absent, and noted in c->src_used). */
ote_status_t ote__rdma_src_ep_on(conn_t *c, uint32_t d, uint32_t ri, ote_ep_cap_t cap,
                                 ote_endpoint_t **ep_out);
ote_status_t ote__rdma_src_ep(conn_t *c, uint32_t pair, ote_ep_cap_t cap, rdma_nic_t **nic_out,
                              ote_endpoint_t **ep_out);
/* RELEASE from the requester on c: end the bound grant it names at once (window
 * deallocated, pin and QP borrow given back); one naming nothing of c's is ignored with
 * a DEBUG line (server thread). */
void ote__rdma_src_release(conn_t *c, const ote_rp_msg_t *rq);
/* EP_RESET from the requester on c: end the grants served on that pair's endpoints and
 * retire their QPs (server thread). */
void ote__rdma_src_reset(conn_t *c, const ote_rp_msg_t *rq);
/* The requester's device k went down: tell every peer (EP_RESET of the pair). Monitor. */
void ote__rdma_reset_device(rdma_tp_t *tp, uint32_t k);
/* The grant layer's source callbacks (pin, unpin, answer) for this transport. */
ote_grant_source_ops_t ote__rdma_source_ops(rdma_tp_t *tp);
/* Receive callback of every QP (qp_config.on_recv): grant receipts. */
void ote__rdma_src_on_recv(void *arg, ote_qp_t *qp, const struct ibv_wc *wc, const void *buf);

/* ---- rdma_accounts.c: one check and one pin per request at the source ------------- */

/* GRANT_REQ rq on c: its request's account, checked and pinned over the whole extent by
 * the request's first grant. OTE_OK with *a_out (the grant then holds its bytes with
 * ote__rdma_acct_hold), or the refusal (its bytes already accounted for). Server thread. */
ote_status_t ote__rdma_acct_take(conn_t *c, const ote_rp_msg_t *rq, acct_t **a_out);
/* ... and whether that request is device memory served on direct slots (rdma_direct.c). */
int ote__rdma_acct_direct(rdma_tp_t *tp, const acct_t *a);
void ote__rdma_acct_hold(rdma_tp_t *tp, acct_t *a, uint64_t len);
/* seen: bytes of the request that will never be held (refused, never served); done:
 * held bytes released. The last byte releases the pin. Any thread, no lock held. */
void ote__rdma_acct_settle(rdma_tp_t *tp, acct_t *a, uint64_t seen, uint64_t done);
/* A staged grant's len bytes while its copy into the bounce runs (src_copied on another
 * thread uses the account after it): the account outlives a write-off of its request or
 * its connection's end until the unstage (which may end it). Any thread, no lock held. */
void ote__rdma_acct_stage(rdma_tp_t *tp, acct_t *a, uint64_t len);
void ote__rdma_acct_unstage(rdma_tp_t *tp, acct_t *a, uint64_t len);
void ote__rdma_acct_write_off(conn_t *c, const ote_rp_msg_t *rq);
/* c's control connection ended (NULL: teardown, no grant left): nothing more will come;
 * accounts end now or with their last grant. */
void ote__rdma_acct_end_conn(rdma_tp_t *tp, const conn_t *c);
/* The engine's pin of the request's registration when the request is served by
 * staging (device memory), else NULL. */
void *ote__rdma_acct_staged(const acct_t *a);

/* ---- rdma_stage.c: bounce buffers of staged grants at the source: rdma_stage.h ---- */

/* rdma_source.c: wait until dl for the staged grants of c (NULL: of every connection)
 * whose copy runs to end (c's server thread, once c is dead; the teardown). */
void ote__rdma_src_wait_copies(rdma_tp_t *tp, conn_t *c, ote_deadline_t dl);

/* ---- rdma_peer.c: the requester's control connection ------------------------------ */

ote_status_t ote__rdma_peer_open(ote__transport_t *t, const char *peer, ote__tpeer_t **peer_out);
ote_status_t ote__rdma_peer_ensure(ote__tpeer_t *p);
ote_status_t ote__rdma_peer_close(ote__tpeer_t *p);
/* ops->peer_lost: its control connection dropped as on a loss (its reader fails what
 * waits on it: grants, calls, notifications, commits). */
void ote__rdma_peer_lost(ote__tpeer_t *p);
/* Send a request and wait (until dl) for its CONNECT_ACK / INFO_ACK. */
ote_status_t ote__rdma_peer_call(ote__tpeer_t *p, const ote_rp_msg_t *rq, uint16_t want,
                                 ote_deadline_t dl, ote_qp_path_t *path_out);
/* Monitor: evict the endpoints of requester peers whose control connection is dead and
 * that have nothing queued or pumping (a reconnect gets fresh ones). */
void ote__rdma_peers_evict_dead(rdma_tp_t *tp);

/* ---- rdma_commit.c: the requester's waits for COMMIT (staged WRITEs) ---------------- */

/* Reader, before a staged WRITE's OK answer goes to the grant layer: its run (g->s, which
 * may have ended already: only named, never read) ends only with the COMMIT of grant id
 * naming rkey. OTE_ERR_NOMEM: nothing linked. */
ote_status_t ote__rdma_commit_expect(ote__tpeer_t *p, uint64_t id, uint32_t rkey,
                                     const gid_ent_t *g);
/* Reader: the grant layer did not take that answer (its grant had ended): unlink it. */
void ote__rdma_commit_drop(ote__tpeer_t *p, uint64_t id);
/* The grant of run s ended with *st: 1 when the run now waits for its COMMIT (parked,
 * whatever *st: the source may still copy; the caller leaves it), else 0 with *st its
 * final status (the COMMIT's when it came and the grant ended OK). */
int ote__rdma_commit_park(ote__tpeer_t *p, ote__slice_t *s, ote_status_t *st);
/* Reader: a COMMIT (req_id id, status st, rkey). One naming no wait of p, or another
 * rkey, is ignored (logged). */
void ote__rdma_commit_on_msg(ote__tpeer_t *p, uint64_t id, ote_status_t st, uint32_t rkey);
/* Reader, its connection lost: parked runs end with OTE_ERR_PEER_LOST, the others will
 * when their grant ends. */
void ote__rdma_commits_lost(ote__tpeer_t *p);
/* Monitor: parked runs past their deadline end with OTE_ERR_TIMEOUT. */
void ote__rdma_commits_expire(rdma_tp_t *tp);
/* rdma_requester.c: end the run s whose grant (and COMMIT, if staged) ended with st. */
void ote__rdma_run_finish(ote__slice_t *s, ote_status_t st);

/* ---- rdma_build.c: the QP build owed to a peer (p->build), every call under p->mu --- */

/* A run on device k asks the build of slot `slot` of its endpoint for capability cap:
 * for_run, it waits queued for it (it found no READY QP); else it went on another READY
 * slot and the build is for later. IDLE (or UNDER_WAY) -> WANTED / WANTED_FOR_RUN with
 * that target; WANTED -> WANTED_FOR_RUN (its target kept) for a run; WANTED_FOR_RUN
 * stays. Called by rdma_requester.c (start_on, from a pump). */
void ote__rdma_build_ask(ote__tpeer_t *p, uint32_t k, uint32_t cap, uint32_t slot, int for_run);
/* WANTED / WANTED_FOR_RUN -> IDLE, never built: the run that waited is gone (the queue
 * is empty), or rdma_max_qps has no room for a background build. The pump thread. */
void ote__rdma_build_drop(ote__tpeer_t *p);
/* WANTED / WANTED_FOR_RUN -> UNDER_WAY: the pump thread takes the build into *job and
 * builds it with p->mu dropped (ote__rdma_build_qp), then calls ote__rdma_build_end. */
void ote__rdma_build_begin(ote__tpeer_t *p, ote__rdma_build_job_t *job);
/* UNDER_WAY -> IDLE once job's build returned st: a success clears build.src_refused; a
 * failure of a build that a run waited for is owed to that run (build.fail_*). */
void ote__rdma_build_end(ote__tpeer_t *p, const ote__rdma_build_job_t *job, ote_status_t st);
/* A run is about to start on device k and capability cap: 1 with *st_out when a failed
 * build is owed to it (then taken: none owed); else 0 (rdma_requester.c, start_on). */
int ote__rdma_build_failure_take(ote__tpeer_t *p, uint32_t k, uint32_t cap, ote_status_t *st_out);
/* The end of a pump thread's round: with no build wanted, an owed failure is dropped
 * (the run it was for took it in the round, or ended meanwhile: deadline, cancel). */
void ote__rdma_build_round_end(ote__tpeer_t *p);
/* A cache miss on endpoint (k, cap): its idle QPs are to be retired at the next start
 * there (ote__rdma_build_flush_take: whether that was asked, and no longer). */
void ote__rdma_build_flush_ask(ote__tpeer_t *p, uint32_t k, uint32_t cap);
int ote__rdma_build_flush_take(ote__tpeer_t *p, uint32_t k, uint32_t cap);
/* The source refused a build of this peer AGAIN (its rdma_max_qps). */
void ote__rdma_build_src_refused(ote__tpeer_t *p);

/* ---- rdma_pump.c: the peers' slice queues and the pump ----------------------------- */

void ote__rdma_submit(ote__tpeer_t *p, ote__slice_t *list);
void ote__rdma_cancel(ote__tpeer_t *p);
/* The pump thread: started at creation, ended by tp->stop (after a kick). */
void *ote__rdma_pumper_main(void *arg);
void ote__rdma_pump_kick(rdma_tp_t *tp);
/* The pump's rounds: p->mu held and p->pump.state taken (BUSY) by the caller; returns
 * with both released. inline_: a submitting thread (never builds a QP). */
void ote__rdma_pump_locked(ote__tpeer_t *p, int inline_);
/* Give back n bytes of the engine-wide count in flight (rdma_max_inflight); whether a
 * peer waits for that room (then the caller kicks the pump thread, with no lock held). */
int ote__rdma_all_sub(rdma_tp_t *tp, uint64_t n);
/* Monitor (through ote__rdma_notes_expire): end the queued slices of peers waiting for a
 * QP build whose deadline passed or whose request was canceled. */
void ote__rdma_queue_expire(rdma_tp_t *tp);

/* ---- rdma_requester.c: the requester data path ------------------------------------- */

uint32_t ote__rdma_peer_max_slice(ote__tpeer_t *p);
/* start_on's results: the run was consumed (started, or ended/moved by start_failed), or
 * it waits for a QP build (nothing of it changed but its device's selector load given
 * back: the pump puts it back at the head of the queue). */
enum { OTE__RDMA_START_TAKEN = 0, OTE__RDMA_START_NEEDS_BUILD = 1 };
/* Start a run (s and the slices linked by next) on device k, its window taken, as one
 * grant; no lock held, pumping set. */
int ote__rdma_start_on(ote__tpeer_t *p, ote__slice_t *s, int k, int inline_);
/* End the run s (device k, or -1: never given one) with st, or move a READ to another
 * device where that is safe. */
void ote__rdma_start_failed(ote__tpeer_t *p, ote__slice_t *s, int k, ote_status_t st);
/* Build the QP of slot `slot` of device k's endpoint for capability cap (the pump
 * thread only; bounded by connect_timeout_ms). */
ote_status_t ote__rdma_build_qp(ote__tpeer_t *p, uint32_t k, uint32_t cap, uint32_t slot);
/* Under p->mu: put the run s back at the head of p's queue. */
void ote__rdma_run_requeue(ote__tpeer_t *p, ote__slice_t *s);
/* The source's account of a request whose slice s will not reach it any more. */
void ote__rdma_slice_write_off(ote__tpeer_t *p, const ote__slice_t *s);
/* Send the notification slice s (a NOTIFY frame; its ack or deadline ends it). */
void ote__rdma_submit_notify(ote__tpeer_t *p, ote__slice_t *s);
/* Whether a device other than k is active; a slice's transport scratch renewed for a
 * run on another device (a new request id at the source). */
int ote__rdma_other_active(const rdma_tp_t *tp, uint32_t k);
void ote__rdma_slice_renew(ote__slice_t *s);
/* Under p->mu: unlink and return the notification / grant id, if it still waits. */
note_t *ote__rdma_note_take(ote__tpeer_t *p, uint64_t req_id);
int ote__rdma_grant_id_take(ote__tpeer_t *p, uint64_t id);
/* The same, handing the entry to the caller (ote_free it), or NULL. */
gid_ent_t *ote__rdma_grant_id_take_ent(ote__tpeer_t *p, uint64_t id);
/* Tell the source on c to release the window rkey of the grant it served on (pair, cap,
 * slot, src_qpn): its requester abandoned it and nothing of it is in flight. Only to a
 * source that advertised RELEASE, while c lives; best effort (its deadline is the
 * fallback). Any thread, no lock held. */
void ote__rdma_send_release(conn_t *c, uint32_t pair, uint32_t cap, uint32_t slot, uint32_t src_qpn,
                            uint32_t rkey);
/* End each notification of an unlinked list with st (no lock held) and free it. */
void ote__rdma_notes_end(note_t *list, ote_status_t st);
/* Monitor: fail notifications whose NOTIFY_ACK did not come by their deadline, and the
 * queued slices of a peer that waits for a QP build whose deadline passed (TIMEOUT) or
 * whose request was canceled (CANCELED). Nonzero when a peer still has a notification
 * or a staged commit awaited, or slices queued: a deadline the monitor must keep. */
int ote__rdma_notes_expire(rdma_tp_t *tp);

/* ---- rdma_monitor.c: the monitor thread ------------------------------------------ */

/* Creates its eventfd and starts it (monitor_started); OTE_ERR_* with nothing started. */
ote_status_t ote__rdma_monitor_start(rdma_tp_t *tp);
/* With tp->stop set: wakes it, joins it and closes the eventfd (idempotent). */
void ote__rdma_monitor_join(rdma_tp_t *tp);
/* Work with a deadline arrived (a submission, a grant asked, a notification sent): an
 * idle monitor wakes now instead of within 100 ms. One atomic load when it is busy. */
void ote__rdma_monitor_wake(rdma_tp_t *tp);

/* ---- rdma_direct.c: GPUDirect RDMA ----------------------------------------------- */

/* ops->mem_register_dmabuf: dma-buf MRs of device memory in every usable context, listed
 * in tp->regs like a host registration (rdma_mem_unregister ends them), with our own
 * duplicate of the fd for the source grants' exact MRs. */
ote_status_t ote__rdma_mem_register_dmabuf(ote__transport_t *t, void *addr, size_t len, int fd,
                                           uint64_t offset);
/* rdma_mem_unregister: close r's dma-buf fd (after its MRs are gone). */
void ote__rdma_direct_reg_end(reg_ent_t *r);
/* Creation, once the data devices are open: rdma_grant_mode resolved against their
 * type-2 window support (tp->grant_mode, tp->have_mw); OTE_ERR_UNSUPPORTED (an ERROR
 * naming the key and the device) for mw on a device without windows. */
ote_status_t ote__rdma_grant_mode_resolve(rdma_tp_t *tp);
/* Whether [addr, +len) lies in one registration that has a dma-buf (served directly). */
int ote__rdma_direct_servable(rdma_tp_t *tp, uint64_t addr, uint64_t len);
/* An MR of exactly [addr, +len) of one registration (device memory from its dma-buf, or
 * host memory), with `access` (remote READ or WRITE), in the PD of qp (a direct
 * endpoint's private PD). The caller pinned the registration. */
ote_status_t ote__rdma_direct_mr(rdma_tp_t *tp, ote_qp_t *qp, uint64_t addr, uint64_t len,
                                 int access, struct ibv_mr **mr_out);
/* Deregister such an MR (of the QP's context ctx) now (synchronous revocation), else it
 * stays an orphan of tp->bm (counted, retried by ote_buffer_manager_reclaim: the
 * monitor's and the teardown's). Any thread, no lock held. */
void ote__rdma_direct_mr_drop(rdma_tp_t *tp, ote_context_t *ctx, struct ibv_mr *mr);
/* Requester: whether a GRANT_RESP (status st, rkey) from c is the redirect to a direct
 * slot (proto.h), and the status the grant then ends with. */
#define OTE__RDMA_DIRECT_REDIRECT ote_status_make(OTE_ERR_UNSUPPORTED, EXDEV)
int ote__rdma_direct_is_redirect(const conn_t *c, ote_status_t st, uint32_t rkey);
/* Requester, no lock held: the source redirected the request req_uid of p to direct
 * slots (remembered per peer, the last OTE__RDMA_REDIRECT_MEMO requests); and, before a
 * run s of a request starts, mark it direct when its request was redirected earlier, so
 * that it goes to a direct slot first (the source's account of the request is the same,
 * so it would redirect it again), or when the source grants host memory by exact MRs
 * (rdma_grant_mr=1: it serves nearly everything on direct slots, and a plain QP would
 * only carry the redirect) or when it starts in the remote range of requests redirected
 * before (device memory there is served on direct slots, so a new request into it skips
 * the redirect's round trip), unless the source sent the run back to a plain slot or its
 * range was served staged. forget: the source sent s back to a plain slot (its memory is
 * not served by exact MRs): the redirected range it starts in is forgotten. */
void ote__rdma_direct_remember(ote__tpeer_t *p, const ote__slice_t *s);
void ote__rdma_direct_forget(ote__tpeer_t *p, const ote__slice_t *s);
void ote__rdma_direct_recall(ote__tpeer_t *p, ote__slice_t *s);

/* ---- rdma_topo.c: NIC ranks per GPU and NUMA node --------------------------------- */
/* After the data devices joined the selector: the rdma_topology file (a bad one:
 * OTE_ERR_INVALID, logged with its line), the PCIe tree, the tables. stop frees them. */
ote_status_t ote__rdma_topo_start(rdma_tp_t *tp);
void ote__rdma_topo_stop(rdma_tp_t *tp);
/* The GPUs' tables once the CUDA driver is loaded (a no-op after that). */
void ote__rdma_topo_gpus(rdma_tp_t *tp);
/* ops->topology: the ranking per GPU and per NUMA node (engine/transport.h). */
size_t ote__rdma_topology(ote__transport_t *t, char *buf, size_t cap);

/* ---- rdma.c: lifecycle ------------------------------------------------------------- */

/* ops->advert: this transport's part of the engine's advertisement (rdma_release=1: its
 * source side takes RELEASE; rdma_connect_epoch=1: CONNECT with epochs). rdma_source.c. */
ote_status_t ote__rdma_advert(ote__transport_t *t, char *buf, size_t len);

/* This transport's identity (INFO / INFO_ACK of the given type). */
void ote__rdma_local_info(const rdma_tp_t *tp, ote_rp_msg_t *rp, uint16_t type);

#endif

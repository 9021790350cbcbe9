/*
 * engine/tcp/tcp_internal.h - what the files of the TCP transport share: its structs,
 * their lock order and ownership, and the cross-file functions. Nothing outside
 * engine/tcp/ includes it (the engine reaches the transport through ote__tcp_create and
 * the ops table only).
 *
 * Files, one job each:
 *   tcp.c            the ops table, ote__tcp_create (workers), adopt, destroy
 *   tcp_conn.c       one connection: creation, epoll interest, death (conn_kill)
 *   tcp_worker.c     the worker threads: epoll loop, commands, receive loop and framing
 *                    dispatch, deadlines (tick)
 *   tcp_requester.c  requester data path: submit (queued or inline), numbering and
 *                    encoding, sending, responses, cancel
 *   tcp_source.c     source data path: the handshake it answers, requests checked
 *                    against registrations (host->pin), responses, pause/resume, deadlines,
 *                    CANCEL (withdrawn READs, written-off bytes)
 *   tcp_pins.c       source: one account and one pin per request (version 2), sessions
 *   tcp_fread.c      source: READs of file registrations read without waiting (several
 *                    per connection in flight, answered in order)
 *   tcp_connect.c    connect and handshake as requester, peer open/reconnect/close
 *
 * The TCP transport.
 *
 * Roles. Every engine listens, on one socket shared by its transports (engine/listen.c),
 * which hands this transport the connections whose HELLO names it (ops->adopt). An
 * engine that opens a segment is the requester on the connections it makes; the engine
 * that accepted them is the source: it owns the
 * remote addresses, checks every request against its registrations (host->pin) before
 * touching memory, and answers. One connection serves one role only.
 *
 * Threads and ownership. tcp_workers worker threads each own an epoll set and the
 * connections attached to it; only the owning worker receives on a connection, owns its
 * receive buffer, its response ring (source), its epoll interest and its close. Other
 * threads talk to a worker through (a) a connection's submission queue (qmu) plus an
 * eventfd wake, and (b) attach/detach commands. A requester connection is freed by its
 * peer (segment) after the worker reports it detached; a source connection is freed by
 * its worker.
 *
 * Inline send (requester). Sending on a requester connection is done under its send
 * lock smu, by the worker or by a submitting thread: ote__tcp_submit tries smu (never waits
 * for it) and, when it gets it and the connection has nothing queued or unsent and its
 * share of the list is at most TCP_INLINE_MAX bytes, numbers the slices and sendmsg()s
 * them itself (non-blocking), saving the worker's wakeup on the small-request path.
 * What the socket does not take, or a send error, is left to the worker (qflag + wake):
 * it sends the rest under EPOLLOUT or fails the connection. Otherwise the list is queued
 * for the worker as before. Lock order smu before qmu; the worker closes the socket only
 * under smu, so an inline sender never sees a reused fd; no done() runs under either lock.
 *
 * Data path. A requester connection keeps its slices in seq order in three lists: under
 * smu, [tx, tx_tail] wait to be sent (tx partly sent when tx_off > 0) and [sent,
 * sent_tail] are fully sent; worker-owned, [head, tail] are sent slices awaiting their
 * response (the receive side takes the whole sent list, one lock per take, when its own
 * list runs out). The source answers frames of one connection in order, so a response
 * always belongs to the head; anything else (including a response to a slice not fully
 * sent) is a protocol error that closes the connection. Sends gather many frames into one
 * sendmsg(): WRITE payloads go straight from the caller's memory, READ payloads straight
 * from registered memory. Receives read up to 256 KiB into a connection buffer; once a
 * frame header is validated, a large payload remainder is received straight into its
 * destination (small payloads are copied out of the buffer: cheaper than a syscall
 * each). Slices are never allocated here and no lock is taken per slice.
 *
 * Requests (version 2). Every slice frame names its request's extent and id: the source
 * checks the whole extent, and pins it once per request (tcp_pins.c), before the first
 * byte moves. Cancel withdraws what is not on the wire: unsent slices are dropped and
 * written off, READs already requested are withdrawn, both by a CANCEL frame that travels
 * behind the connection's unsent frames and needs no answer.
 *
 * Failure. EOF/reset fails every slice of the connection with OTE_ERR_PEER_LOST and
 * marks the peer broken (a later submit reconnects). A reconnect that meets another
 * incarnation of the peer (the engine's epoch in the HELLO_ACK advertisement: it
 * restarted at the same address) fails instead, for good, with OTE_ERR_PEER_LOST and a
 * WARN: the segment's remote addresses named the old process's memory. A slice whose deadline passes
 * closes its connection (its data can no longer arrive) and fails with
 * OTE_ERR_TIMEOUT. Peers are independent: one peer's death never blocks another's.
 *
 * Hostile or stuck requesters (source side). The engine's listener caps the connections
 * it holds (tcp_max_accepted), bounds the HELLO and its deadline (connect_timeout_ms), and
 * with a cluster key runs the AUTH exchange (engine/control/auth.h) before it hands a
 * connection over: an adopted connection is authenticated, its HELLO waiting in its
 * receive buffer, answered as soon as a worker attaches it. Each data connection
 * authenticates itself (the listener does it once per connection). A connection queues
 * at most TCP_SRC_MAX_RESP responses: at the cap it stops reading (EPOLLIN off) until the
 * requester drains them. A connection that owes responses or is receiving a payload must
 * make progress (bytes in or out) every transfer_timeout_ms, else it is closed and its
 * registrations unpinned.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#ifndef OTE_ENGINE_TCP_TCP_INTERNAL_H
#define OTE_ENGINE_TCP_TCP_INTERNAL_H

/* Internal to OrbitTE's engine: only its own targets (and tests) compile with
 * OTE__INSIDE_ENGINE (Bazel local_defines, never passed on to dependents), so an outside
 * workspace that includes this header fails here instead of building against internals.
 * Use <ote/ote.h>. */
#ifndef OTE__INSIDE_ENGINE
#error "engine/tcp/tcp_internal.h is internal to OrbitTE's engine; include <ote/ote.h> instead"
#endif

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "base/lock.h"
#include "base/time.h"
#include "engine/control/auth.h"
#include "engine/control/ctl.h"
#include "engine/engine_internal.h"
#include "engine/src_account.h"
#include "engine/transport.h"

/* A slice's tcp scratch (ote__slice_t.xp): ote__tcp_xp(s). */
typedef struct {
    uint64_t seq;      /* req_id of the slice's frame on its connection */
    uint16_t wire_len; /* bytes of wire[] in use */
    uint8_t withdrawn; /* a READ whose CANCEL went to the source */
    uint8_t wire[64];  /* the encoded frame header (OTE_CTL_RW2_FRAME_LEN max) */
} tcp_xp_t;
_Static_assert(sizeof(tcp_xp_t) <= OTE__SLICE_SCRATCH, "tcp's slice scratch fits a slice's");
_Static_assert(sizeof(((tcp_xp_t *)0)->wire) >= OTE_CTL_RW2_FRAME_LEN,
               "a slice's tcp scratch holds the largest frame header it sends");
static inline tcp_xp_t *ote__tcp_xp(ote__slice_t *s) { return (tcp_xp_t *)(void *)s->xp; }
static inline const tcp_xp_t *ote__tcp_cxp(const ote__slice_t *s) {
    return (const tcp_xp_t *)(const void *)s->xp;
}

#define TCP_RXBUF (256u << 10)
#define TCP_DIRECT_MIN (16u << 10) /* payload remainders this large are received in place */
#define TCP_IOV 128
#define TCP_SOCKBUF (4 << 20)
#define TCP_TICK_NS (20 * OTE_NSEC_PER_MSEC)
#define TCP_RX_BUDGET (16u << 20) /* bytes per readable event per connection (fairness) */
#define TCP_MAX_CONNS 64
#define TCP_INLINE_MAX (256u << 10) /* submit: a connection's share this small may go inline */
#define TCP_SRC_MAX_RESP 256u       /* queued responses per source connection */
#define TCP_SRC_FILE_READS 16u      /* file reads in flight per source connection */
#define TCP_HS_RXBUF 512u           /* receive buffer before the handshake: one HELLO fits */
#define TCP_HSBUF (OTE_CTL_HDR_LEN + 8 + OTE_CTL_MAX_TEXT + OTE_CTL_MAX_HELLO_BODY)

enum { ROLE_REQUESTER = 1, ROLE_SOURCE = 2 };
enum { RX_HDR = 0, RX_DATA = 1, RX_DISCARD = 2 };
enum { CMD_ATTACH = 1, CMD_DETACH = 2 };

typedef struct tcp tcp_t;
typedef struct tcp_worker tcp_worker_t;
typedef struct tcp_conn tcp_conn_t;
typedef struct tcp_peer tcp_peer_t;

/* A READ of a file registration whose bytes the file owner reads into the response's
 * bounce (host->file.bounce_io_start) while earlier responses are sent, or a WRITE's
 * bounce being written to the file before its WRITE_ACK goes (write 1; tcp_fread.c).
 * Its response points to it; the ring is sent up to the first response whose I/O has
 * not ended. The read's done() (the file owner's thread) puts it on its worker's done
 * list and wakes the worker, which marks it DONE and sends on. A connection that dies
 * first unpins at once and leaves it the bounce (c NULL): the worker gives that back when
 * the read ends. */
typedef enum { FREAD_READING = 0, FREAD_DONE = 1 } tcp_fread_state_t;
typedef struct tcp_fread {
    struct tcp_fread *next; /* the worker's done list */
    tcp_worker_t *w;        /* its connection's worker (outlives it) */
    tcp_conn_t *c;          /* NULL once its connection died (it owns tok then) */
    void *tok;              /* the bounce, while an orphan */
    ote_status_t st;        /* the read's outcome (set by done()) */
    tcp_fread_state_t state;
    uint8_t withdrawn; /* CANCEL reached its READ: answered CANCELED once it ends */
    uint8_t write;     /* a WRITE's write of its bounce to the file */
} tcp_fread_t;

typedef struct tcp_cmd {
    struct tcp_cmd *next;
    int kind;
    tcp_conn_t *c;
} tcp_cmd_t;

/* A response of the source side, waiting to be sent. */
typedef struct {
    uint8_t hdr[OTE_CTL_HDR_LEN];
    uint8_t hdr_len;
    uint8_t close_after; /* close the connection once sent (handshake refusal) */
    uint8_t owned;       /* data is an allocation of the response (BUFS): freed once sent */
    const uint8_t *data;
    uint32_t len;
    void *pin;   /* registration pinned until the data is sent */
    void *stage; /* device memory: the host bounce buffer data points into (host->gpu.stage_*) */
    uint8_t stage_file; /* stage is a file registration's bounce (host->file), not the GPU's */
    uint64_t id;        /* req_id it answers */
    uint16_t opcode;    /* what it answers with */
    tcp_fread_t *fread; /* its file read, until the ring sends past it (tcp_fread.c) */
} tcp_resp_t;

struct tcp_conn {
    tcp_worker_t *w;
    tcp_conn_t *wnext, *wprev; /* worker list, or graveyard (wnext) */
    int fd;
    int role;
    uint16_t version;
    uint16_t index;
    tcp_peer_t *peer; /* requester role */
    char from[OTE__ADDR_MAX];
    char from_name[OTE__ENGINE_NAME_LEN]; /* the requester's engine name ("" for none) */
    uint32_t ev;
    int out_wanted;   /* EPOLLOUT requested */
    int rx_paused;    /* source: EPOLLIN off (response cap reached, or closing) */
    int closing;      /* source: a close_after response is queued; parse nothing more */
    int bufs_queued;  /* source: a BUFS answer waits to be sent; parse nothing until it is */
    uint64_t born_ns; /* source: adoption time (handshake deadline) */
    uint64_t progress, progress_seen, progress_ns; /* bytes moved: a counter, its tick view */

    /* Submission queue (requester): any thread under qmu. */
    ote_mutex_t qmu;
    ote__slice_t *qhead, *qtail;
    int qdead;
    _Atomic int qflag;
    _Atomic int purge;

    /* Lifecycle, under tp->mu. */
    int detached;
    int cmd_pending;
    tcp_cmd_t attach_cmd, detach_cmd;

    /* Requester transmit state, under smu (held by whoever sends: the worker, or a
     * submitting thread sending inline). Lock order: smu before qmu. sent..sent_tail are
     * fully on the wire and not yet taken by the receive side; tx..tx_tail wait to be
     * sent (tx partly sent when tx_off > 0). The fd is closed only under smu. */
    ote_mutex_t smu;
    ote__slice_t *sent, *sent_tail, *tx, *tx_tail;
    size_t tx_off;
    uint64_t seq;

    /* Requester, worker-owned: sent slices awaiting their responses, in seq order. */
    ote__slice_t *head, *tail;

    /* Source, worker-owned. */
    tcp_resp_t *ring;
    size_t rcap, rhead, rcount, rtx_off;
    int handshaken;
    struct src_sess *sess;     /* version 2: the session it belongs to (tcp_pins.c) */
    uint32_t rx_len;           /* length of the WRITE slice being received */
    uint32_t freads;           /* file reads in flight (at most TCP_SRC_FILE_READS) */
    uint64_t last_refused_req; /* extent start of the last refused request (one WARN each) */
    uint8_t hsbuf[TCP_HSBUF];

    /* Receive, worker-owned. */
    uint8_t *rxbuf;
    size_t rxcap;
    size_t rx_start, rx_end;
    int rx_state;
    uint8_t *rx_dst;
    size_t rx_left;
    void *rx_pin;
    void *rx_stage;        /* device memory or a file: the bounce buffer rx_dst points into */
    uint8_t rx_stage_file; /* rx_stage is host->file's (a file registration), else host->gpu's */
    uint64_t rx_dev;       /* ... and the device address its bytes go to */
    uint64_t rx_id;
    ote_status_t rx_status;
    int last_large;
};

struct tcp_worker {
    tcp_t *tp;
    uint32_t idx;
    pthread_t th;
    int started;
    int epfd;
    int evfd;
    _Atomic int woken;
    ote_mutex_t cmu;
    tcp_cmd_t *chead, *ctail;
    tcp_conn_t *conns;
    tcp_conn_t *grave;
    uint64_t next_tick;
    struct iovec iov[TCP_IOV];
    /* File reads of its source connections (tcp_fread.c), under fmu: those ended and not
     * yet taken, and how many were started and not yet taken. */
    ote_mutex_t fmu;
    tcp_fread_t *fdone;
    uint32_t finflight;
};

struct tcp {
    ote__transport_t base;
    ote__cfg_t cfg;
    ote__host_t host;
    char addr[OTE__ADDR_MAX]; /* the engine's advertised address (host->self_addr) */
    uint32_t nworkers;
    tcp_worker_t *workers;
    _Atomic uint32_t rr;
    _Atomic int stop;
    ote_mutex_t mu;   /* conn lifecycle */
    int leak_workers; /* a worker's file reads outlived its teardown wait: keep workers */
    ote_cond_t cv;
    int sockbuf;
    _Atomic uint64_t session;
    /* Source: the account of each request in flight from a version-2 requester (one pin
     * per request) and the sessions (requester engines' connection sets) they belong
     * to; tcp_pins.c, under pmu (a leaf but for the engine's pin, taken under it). */
    ote_mutex_t pmu;
    ote__acct_set_t paccts; /* scoped by session id (engine/src_account.h) */
    struct src_sess *psess;
};

struct tcp_peer {
    tcp_t *tp;
    char addr[OTE__ADDR_MAX];        /* as the user gave it */
    char remote_addr[OTE__ADDR_MAX]; /* as the peer advertises itself */
    pthread_rwlock_t lk;             /* read: submit; write: reconnect/close */
    uint32_t n;
    tcp_conn_t **conns;
    _Atomic int broken;
    _Atomic uint32_t rr;
    /* The source's max_data from the handshake, in [OTE_CTL_MIN_DATA, OTE_CTL_MAX_DATA].
     * Written by a (re)connect under lk for writing, read by submitters without it. */
    _Atomic uint32_t max_data;
    /* Restarted peers: the incarnation (ote_ctl_info_incarnation of its HELLO_ACK info)
     * the first connection met at open; a connection that meets another one fails the
     * peer for good (restarted: every later ensure answers PEER_LOST). Under lk for
     * writing (or p private). */
    uint64_t met;
    int met_set;
    _Atomic int restarted;
};

static inline tcp_t *to_tcp(ote__transport_t *t) { return (tcp_t *)t; }

static inline uint32_t slice_payload(const ote__slice_t *s) {
    return s->op == OTE__SLICE_READ ? 0 : s->len;
}

/* Set on worker threads: they must never block on a peer lock (a reconnecting thread
 * holds it while it waits for the workers). */
extern _Thread_local int ote__tcp_on_worker;

/* ---- tcp_conn.c: one connection --------------------------------------------------- */
void ote__tcp_set_sockopts(tcp_t *tp, int fd);
/* A new connection of `role` on fd, given to a worker round-robin (not attached yet).
 * NULL when out of memory (fd stays the caller's). */
tcp_conn_t *ote__tcp_conn_new(tcp_t *tp, int fd, int role);
void ote__tcp_conn_free(tcp_conn_t *c);
/* ops->adopt: a source connection from the engine's listener, its HELLO in rxbuf. */
ote_status_t ote__tcp_adopt(ote__transport_t *t, int fd, const char *from, const uint8_t *hello,
                            size_t len);
/* Keep the epoll interest of c in line with out_wanted and rx_paused. Worker only. */
void ote__tcp_conn_events(tcp_conn_t *c);
void ote__tcp_want_out(tcp_conn_t *c, int on);
/* Complete every slice of a NULL-terminated list with `why` (CANCELED for a canceled
 * slice, PEER_LOST for a TIMEOUT before the slice's own deadline). No lock held. */
void ote__tcp_complete_list(ote__slice_t *list, ote_status_t why);
/* Close c, fail or release all it holds, move it to its worker's graveyard. Worker only. */
void ote__tcp_conn_kill(tcp_conn_t *c, ote_status_t why);

/* ---- tcp_worker.c: worker threads -------------------------------------------------- */
void ote__tcp_worker_wake(tcp_worker_t *w);
/* Queue an attach/detach command for w and wake it. Any thread. */
void ote__tcp_worker_post(tcp_worker_t *w, tcp_cmd_t *cmd);
void *ote__tcp_worker_main(void *arg);
/* Receive and dispatch frames of c within a byte budget. Worker only. */
void ote__tcp_conn_read(tcp_conn_t *c);

/* ---- tcp_requester.c: requester data path ------------------------------------------ */
/* Worker: take the queue (when flagged), drop canceled unsent slices (when asked), send
 * what waits, and keep EPOLLOUT in line with what is left. */
void ote__tcp_req_write(tcp_conn_t *c);
/* A response frame; returns 0, or -1 when the connection was killed. Worker only. */
int ote__tcp_req_frame(tcp_conn_t *c, const ote_ctl_msg_t *m);
/* Complete the oldest slice awaiting a response with st. Worker only. */
void ote__tcp_req_pop_complete(tcp_conn_t *c, ote_status_t st);
/* Deadline of the oldest slice of a requester connection (UINT64_MAX: none). */
uint64_t ote__tcp_req_oldest_deadline(tcp_conn_t *c);
void ote__tcp_submit(ote__tpeer_t *tpeer, ote__slice_t *list);
void ote__tcp_cancel(ote__tpeer_t *tpeer);

/* ---- tcp_source.c: source data path ------------------------------------------------ */
/* A request frame (or the HELLO); returns 0, or -1 when the connection was killed. */
int ote__tcp_src_frame(tcp_conn_t *c, const ote_ctl_msg_t *m);
/* A WRITE payload has fully arrived (or was discarded): unpin and answer WRITE_ACK. */
int ote__tcp_src_payload_done(tcp_conn_t *c);
int ote__tcp_src_may_parse(const tcp_conn_t *c);
/* Queue a response (pin unpinned, c killed and -1 when out of memory); 0 otherwise. */
int ote__tcp_src_respond(tcp_conn_t *c, uint16_t opcode, uint64_t id, ote_status_t st,
                         const uint8_t *data, uint32_t len, void *pin);
void ote__tcp_src_pause(tcp_conn_t *c);
void ote__tcp_src_pump(tcp_conn_t *c);
void ote__tcp_src_tick(tcp_conn_t *c, uint64_t now);

/* ---- tcp_fread.c: file reads in flight (source) ----------------------------------- */
/* READ of a file registration (pin): bounce, read started, response queued waiting for
 * it; a failure answers the slice with its status. Returns 0, or -1 when c was killed. */
int ote__tcp_fread_start(tcp_conn_t *c, const ote_ctl_msg_t *m, void *pin);
/* A WRITE slice of a file registration fully received into its bounce (c->rx_stage): its
 * pin dropped, WRITE_ACK queued waiting for the write of the bounce to the file (its
 * status then). Returns 0, or -1 when c was killed. */
int ote__tcp_fwrite_start(tcp_conn_t *c);
/* Sending reached r, which has a file read: 1 when it may go (its read ended; a failed
 * or withdrawn one is now an answer without data), 0 while the read runs. */
int ote__tcp_fread_ready(tcp_conn_t *c, tcp_resp_t *r);
/* CANCEL reached r (a READ with a file read): answered CANCELED once its read ends. */
void ote__tcp_fread_withdraw(tcp_resp_t *r);
/* c dies: r's pin goes now; a running read keeps the bounce until it ends. */
void ote__tcp_fread_drop(tcp_conn_t *c, tcp_resp_t *r);
/* Worker: take the ended reads, send on their connections, give back orphans' bounces. */
void ote__tcp_fread_drain(tcp_worker_t *w);
/* Worker teardown, its connections gone: wait (bounded) for its reads still running.
 * 0 when none is left; -1 when some outlived the wait (their memory must stay). */
int ote__tcp_fread_settle(tcp_worker_t *w);

/* ---- tcp_pins.c: one pin per request at the source (version 2) -------------------- */
/* A handshaken version-2 source connection joins its requester's session; at close it
 * leaves it, and the last one to leave ends the accounts the session still has open
 * (requests whose bytes will never come), unpinning them. Worker only. */
ote_status_t ote__tcp_src_sess_join(tcp_conn_t *c, uint64_t session);
void ote__tcp_src_sess_leave(tcp_conn_t *c);
/* A WRITE/READ slice frame: the source's pin for it. Version 2: the request's account
 * (pinned once, over the request's extent, by its first slice; a refusal is kept and
 * given to every slice of the request). Version 1: a pin of the slice's own range.
 * OTE_OK with *pin_out, or the refusal (the slice's bytes are then already accounted). */
ote_status_t ote__tcp_src_pin(tcp_conn_t *c, const ote_ctl_msg_t *m, unsigned perm, void **pin_out);
/* The slice holding pin (len bytes) is done: served, discarded or withdrawn. */
void ote__tcp_src_unpin(tcp_conn_t *c, void *pin, uint32_t len);
/* The engine's pin (host->pin's) behind a pin of ote__tcp_src_pin, for ote__pin_kind. */
void *ote__tcp_src_engine_pin(tcp_conn_t *c, void *pin);
/* Give back a response's or a receive's bounce buffer of device memory or of a file
 * registration (*file says which; *stage then NULL, *file 0). */
void ote__tcp_src_stage_put(tcp_conn_t *c, void **stage, uint8_t *file);
/* CANCEL's withdrawals: bytes of request uid that will never come. */
void ote__tcp_src_write_off(tcp_conn_t *c, uint64_t uid, uint64_t req_len, uint64_t bytes);
/* Transport teardown, no connection left: end every account. */
void ote__tcp_src_reqs_drop_all(tcp_t *tp);

/* ---- tcp_connect.c: connect and handshake (requester), peers ----------------------- */
ote_status_t ote__tcp_peer_open(ote__transport_t *t, const char *peer, ote__tpeer_t **peer_out);
ote_status_t ote__tcp_peer_ensure(ote__tpeer_t *tpeer);
uint32_t ote__tcp_peer_max_slice(ote__tpeer_t *tpeer);
ote_status_t ote__tcp_peer_close(ote__tpeer_t *tpeer);
/* ops->peer_lost: the peer fails for good (as restarted), its connections killed. */
void ote__tcp_peer_lost(ote__tpeer_t *tpeer);

#endif

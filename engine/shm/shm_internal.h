/*
 * engine/shm/shm_internal.h - what the files of the same-host transport share: its
 * structs, the messages of its control socket, lock order and the cross-file functions.
 * Nothing outside engine/shm/ includes it (the engine reaches the transport through
 * ote__shm_create and the ops table only).
 *
 * Files, one job each:
 *   shm.c            the ops table, ote__shm_create (the control socket and its accept
 *                    thread), advert, destroy
 *   shm_requester.c  requester side: reachability, submit, the
 *                    window of requests in flight, the receive thread (responses,
 *                    deadlines, peer death), cancel, reconnect, close
 *   shm_requester_ipc.c  requester side, CUDA IPC: messages received with an fd, offers
 *                    taken and their copies started, polled and settled, IPC_DONE,
 *                    close receipts
 *   shm_source.c     source side: one thread per accepted requester, its handshake
 *                    (credentials, cross-memory-attach probe) and every request checked
 *                    against the engine's registrations before any byte moves
 *   shm_source_ipc.c source side, CUDA IPC: pins held for the requester's IPC copies,
 *                    allocations offered, close receipts
 *   shm_connect.c    requester side: connect, HELLO (probe, ring), the answer adopted
 *   shm_pins.c       source side: one account and one pin per request of a connection
 *   shm_ring.c       the shared ring: the requester's memfd, the source's mapping of it,
 *                    and the source's wait for a staging mark (see "Staging marks")
 *
 * Reaching the peer. Every engine with shm in its list listens on an abstract UNIX
 * SOCK_SEQPACKET socket whose name it advertises ("shm=<name>") in its HELLO_ACK info. A
 * requester uses it only when the peer's advertisement shows the same boot id and the
 * same network namespace (the abstract socket namespace) and the same user namespace;
 * otherwise peer_open_info answers OTE_ERR_UNSUPPORTED and the router moves on. Each side
 * reads the other's pid and uid with SO_PEERCRED; either's death is an EOF on the socket,
 * seen at once by the other's thread. A source with a cluster key answers a HELLO with
 * SHM_AUTH CHALLENGE and reads nothing but the requester's PROOF (engine/control/auth.h,
 * bound to the HELLO's bytes) before it acts on the HELLO (probe, ring) or any request.
 *
 * Authority. The requester names its request (op, the source's remote range, its own
 * local address); the source pins the remote range through host->pin (registrations and
 * permissions) and only then copies, itself, with process_vm_readv (WRITE: from the
 * requester's local buffer into its registered memory) or process_vm_writev (READ), one
 * copy, no staging; pieces of at most SHM_RING_SMALL bytes go through the ring instead
 * when the source could map it (SHM_ACK_RING, SHM_REQ_RING: a process_vm_* call costs
 * about 0.7 us per 4 KiB page, two memcpy far less). A refused request moves no byte and
 * answers OTE_ERR_ACCESS.
 *
 * One pin per request. Every piece names its request (an id unique in the requester's
 * engine, and the extent). The source keeps one account per request of the connection:
 * the first piece to arrive checks the whole extent and pins it once (or records the
 * refusal, which every later piece of the request gets too); the pin is released when the
 * last byte of the request has been served, refused or written off. Pieces the requester
 * drops without sending them (cancel, a deadline in its queue) are written off by a
 * WRITE_OFF entry in its next REQS message; the accounts a connection leaves open end
 * when it closes. Unregister of the range is therefore BUSY from the first piece of a
 * request to its last, never between two of its pieces. The source reads the requester's
 * memory only at the local addresses the requester itself named, which the kernel allows
 * because both run under one uid (checked by SO_PEERCRED, probed once per connection by
 * reading a cookie the requester names in its HELLO; under Yama ptrace_scope 1 the
 * requester first names the source with PR_SET_PTRACER). A peer the probe fails for
 * (another uid, ptrace_scope 2/3, a seccomp filter) is refused with OTE_ERR_UNSUPPORTED
 * and a reason, before any transfer: the router then uses the next transport.
 *
 * Ring mode (config shm_mode=ring, or when the probe fails: another uid, ptrace refused).
 * The requester creates a memfd of SHM_RING_BYTES sealed against shrinking
 * (F_SEAL_SHRINK: the source maps no other fd, since a ring shrunk under it would turn its
 * next copy into a SIGBUS), maps it and passes it in its HELLO (SCM_RIGHTS; a HELLO with
 * more fds is refused and every fd received closed); the source maps it too and copies
 * only between the ring and its own registered memory (offsets bounded by the ring,
 * checked). Slices are at most SHM_RING_SLICE; each one in flight owns a piece of the
 * ring, allocated in order and freed in order by its response, so the requester stages
 * WRITE data (and copies READ data out) for one slice while the source copies another:
 * both processes copy at once. With staging marks (below) the requester sends a message
 * before it stages its pieces, and the source copies each piece once it is staged. An
 * empty ring starts again at 0 for a READ piece only: WRITE pieces go on around it, so the
 * requester does not stage into lines the source has just read (A/B in shm_requester.c).
 *
 * Requests. A requester connection carries REQS messages (up to SHM_BATCH_MAX requests
 * each, so a batch of small requests costs one message per 64) and receives RESPS in the
 * same order; at most SHM_WINDOW slices and SHM_WINDOW_BYTES bytes are in flight, the rest wait in the peer's queue,
 * where cancel drops them and their deadlines are watched. A large request is already cut
 * by the engine into slices (slice_size), so several requests of a batch proceed together.
 * The source reads messages ahead of the one it copies (up to SHM_LOOKAHEAD): each is
 * checked and pinned when read, and its WRITE_OFF and CANCEL entries act at once. It
 * copies large pieces in chunks (SHM_PAR_CHUNK) shared with its helper threads, and
 * between two of its chunks reads what came meanwhile, so a requester that gave up
 * (deadline, death) is written at most a chunk per copying thread later.
 *
 * Cancel. Queued slices of a canceled request are dropped (and written off); for those
 * already sent the requester sends a CANCEL entry naming the request. The source marks
 * the request's account: every copying thread checks the mark before each chunk, so the
 * pieces not yet copied answer OTE_ERR_CANCELED having moved no further byte (a piece
 * already copied keeps its OTE_OK). The requester completes each piece with its response,
 * so a canceled request ends CANCELED only once no byte of it can move any more; the
 * account (and the pin) ends with its last byte, served, canceled or written off.
 *
 * CUDA IPC (gpu_paths "ipc" on both ends, negotiated per connection; see SHM_IPC_OFFER
 * below): a piece on device memory registered with OTE_PERM_IPC is checked and pinned as
 * any other, then the requester copies it itself through the allocation's IPC handle;
 * its receive thread polls the copies' events and tells the source when each ended.
 *
 * Reconnect. A lost peer is reconnected on the next submit (peer_ensure): the transport
 * asks the engine for the peer's advertisement again (host->query_info), since a
 * restarted peer at the same "host:port" listens on another socket. When that
 * advertisement names another incarnation than the one met at open (the engine's
 * epoch: the peer restarted), the peer fails for good with OTE_ERR_PEER_LOST and a WARN
 * instead: the segment's remote addresses named the old process's memory.
 *
 * Threads and locks. Requester: submitting threads and the peer's receive thread share
 * the peer's mu (queue, window, fd state); done() runs with no lock held. Source: the
 * accept thread creates one thread per connection, for at most tcp_max_accepted
 * connections at once (the engine's accept limit, as on TCP: any local process may
 * connect, so more are closed at once); tp->mu guards the list of connections and each
 * one's offered allocations (close receipts are sent from the unregistering thread). A
 * connection's copy helpers take units of its current job (an atomic counter tagged with
 * the job's generation) and touch nothing else but the job's statuses (atomic) and the
 * accounts' cancel marks (atomic); its thread alone reads the socket, pins and unpins.
 * Lock order: peer->ensure_mu before peer->mu; tp->mu and a connection's jmu are leaves.
 */
#ifndef OTE_ENGINE_SHM_SHM_INTERNAL_H
#define OTE_ENGINE_SHM_SHM_INTERNAL_H

#ifndef OTE__INSIDE_ENGINE
#error "engine/shm/shm_internal.h is internal to OrbitTE's engine; include <ote/ote.h> instead"
#endif

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/lock.h"
#include "engine/engine_internal.h"
#include "engine/src_account.h"
#include "engine/transport.h"

/* A slice's shm scratch (ote__slice_t.xp): ote__shm_xp(s). */
typedef struct {
    uint64_t id;       /* number of the slice's request on its peer connection */
    uint64_t ring_end; /* ring mode: where its bytes end in the ring (virtual) */
    void *ipc;         /* the CUDA IPC copy under way (host->gpu.ipc_copy_start) */
} shm_xp_t;
_Static_assert(sizeof(shm_xp_t) <= OTE__SLICE_SCRATCH, "shm's slice scratch fits a slice's");
static inline shm_xp_t *ote__shm_xp(ote__slice_t *s) { return (shm_xp_t *)(void *)s->xp; }
static inline const shm_xp_t *ote__shm_cxp(const ote__slice_t *s) {
    return (const shm_xp_t *)(const void *)s->xp;
}

#define SHM_MAGIC 0x4d48534fu /* "OSHM" */
#define SHM_VERSION 3         /* 2: pieces name their request (req_uid); WRITE_OFF; 3: CANCEL */
#define SHM_BATCH_MAX 64      /* requests per REQS message */
#define SHM_SRC_FILE_READS 16 /* file reads ahead of the piece being copied (shm_fread.c) */
#define SHM_WINDOW 256        /* slices in flight per peer */
/* Bytes in flight per peer (one slice always may go). 64 MiB rather than 16: the source
 * reads ahead and keeps copying while the requester's receive thread waits for a core
 * (A/B on the loaded 2-core machine, 64 MiB batch-1 transfers: 2.8-6.6 GB/s against
 * 2.1-4.4 GB/s); cancel does not wait for the window (CANCEL entries). */
#define SHM_WINDOW_BYTES (64u << 20)
/* Payload bytes named by one REQS message (at least one request): the source answers per
 * message, so large slices travel one per message and the window refills while the
 * source copies the next. */
#define SHM_MSG_BYTES (4u << 20)
/* The source copies a message's large pieces in chunks of this size (larger when a
 * message would need more than SHM_UNITS_MAX of them), shared between its connection
 * thread and up to SHM_COPY_HELPERS helper threads (one fewer than the online CPUs,
 * started on the first such message) when the message holds at least
 * SHM_PAR_MIN bytes of them: several cross-memory-attach copies at once. Between two of
 * its chunks the connection thread reads what the requester sent meanwhile (CANCEL
 * entries, its death); every thread checks the piece's request for a cancel before each
 * chunk. */
#define SHM_PAR_CHUNK (512u << 10)
#define SHM_PAR_MIN (1u << 20)
#define SHM_COPY_HELPERS 3 /* at most; one fewer than the online CPUs */
#define SHM_UNITS_MAX 256
#define SHM_LOOKAHEAD \
    20                            /* REQS messages read ahead of the one being copied (a window
                          * of 64 MiB is 16 messages of 4 MiB: a CANCEL after them is read) */
#define SHM_MAX_SLICE (64u << 20) /* largest slice a source accepts (as TCP's max_data) */
#define SHM_SOCK_MAX 100          /* abstract socket name, without its leading NUL */
#define SHM_TICK_MS 20            /* receive thread: deadline checks */
/* A thread that expects a message soon polls without sleeping for at most this long
 * before it sleeps in poll(2): no busy core when idle, no wakeup on a busy connection.
 * SHM_SPIN_NS: the requester's receive thread while requests are in flight;
 * SHM_SRC_SPIN_NS: a source that just answered, yielding the core between looks. On the
 * shared 2-core machine (A/B of the 4 KiB x64 batch latency, p50) a source spinning 5 us
 * without yielding beat 20 us (46 against 61 us) and 100 us was far worse (141 us: the
 * spin took the core the requester needs); yielding between looks, 40 us beat 5 us by
 * about 1.5x in message rate (4 KiB x64, batch after batch, READ and WRITE, same runs
 * interleaved: 1.0-1.5M against 0.7-0.9M msg/s): the requester's next REQS, which comes
 * after its own completion, staging and submit, then finds the source awake; at low load
 * 100 us beat 40 us by about 1.13x more for WRITE (whose requester then staged 256 KiB
 * before it sent: 0.83-1.05M against 0.62-0.93M msg/s, four interleaved repetitions) and
 * 200 us by a little more still; 100 us bounds what an idle connection's thread burns
 * after each answer. The receive thread's 20 us beat 5 us. */
#define SHM_SPIN_NS (20u * 1000u)
#define SHM_SRC_SPIN_NS (100u * 1000u)
#define SHM_SRC_SPIN_BUSY_NS (20u * 1000u) /* a yield longer than this ends the spin */

/* SHM_AUTH: the key's challenge-response (engine/control/auth.h) between HELLO and
 * HELLO_ACK when the source has a key; steps as the control frame's (OTE_CTL_AUTH_*). */
enum { SHM_HELLO = 1, SHM_HELLO_ACK = 2, SHM_REQS = 3, SHM_RESPS = 4, SHM_AUTH = 5 };
/* CUDA IPC (a capability of protocol 3, negotiated: SHM_CAP_IPC in the HELLO header's
 * pad, SHM_ACK_IPC in the HELLO_ACK's flags; a peer without it never sees the messages
 * below nor the request flags SHM_REQ_IPC / SHM_REQ_LOCAL_DEV, and keeps staging).
 *  - SHM_IPC_OFFER (source -> requester, shm_ipc_offer_t) answers a piece flagged
 *    SHM_REQ_IPC in the place of its RESPS entry (responses stay in order): the piece
 *    is on device memory registered with OTE_PERM_IPC, checked and pinned as any piece;
 *    the offer carries the allocation's IPC handle and the piece's offset in it (for a
 *    VMM allocation, OTE__IPC_VMM: no handle, and exactly one fd, the allocation's
 *    POSIX fd, travels with the offer by SCM_RIGHTS; any other message carrying an fd,
 *    or an offer with more than one, is a protocol error, every fd received closed). The
 *    requester imports the allocation (engine/gpu's bounded cache), copies the piece
 *    with an asynchronous copy on a stream, polls its event, and then sends an
 *    SHM_OP_IPC_DONE entry naming the piece's id: only then does the source drop the
 *    piece's pin (unregister is BUSY until then). IPC_DONE is sent only once the driver
 *    proved the copy complete: a copy whose outcome is unknown (a failed event query, a
 *    deadline) ends its request with that status at once but stays on the peer's
 *    unsettled list (shm_unsettled_t), its mapping referenced, until ipc_copy_settle
 *    proves it complete. The connection's end drops every pin it still holds this way
 *    (the requester's engine then retains the unsettled copies' streams and mappings).
 *  - SHM_IPC_CLOSE (source -> requester, shm_ipc_close_t): a close receipt. A
 *    registration with OTE_PERM_IPC was unregistered; the requester closes its import
 *    of that allocation (buffer id) once no copy uses it, before it is used again.
 *  - A piece flagged SHM_REQ_LOCAL_DEV (with SHM_REQ_IPC) has a local buffer in device
 *    memory: the source never copies it itself; when it does not offer IPC (no opt-in,
 *    host memory, ipc not in its gpu_paths) it answers OTE_ERR_UNSUPPORTED having
 *    touched nothing, and the requester's engine stages the piece instead. */
enum { SHM_IPC_OFFER = 6, SHM_IPC_CLOSE = 7 };
#define SHM_CAP_IPC 1u     /* HELLO h.pad: the requester may take CUDA IPC */
#define SHM_OP_IPC_DONE 13 /* a REQS entry: the IPC copy of piece `id` ended */
#define SHM_IPC_OFFERED 64 /* allocations remembered per connection for close receipts */
/* A REQS entry that is no request: `local` bytes of request req_uid will never come
 * (dropped unsent by the requester). It gets no response. (OTE__SLICE_* are 3, 5, 7.) */
#define SHM_OP_WRITE_OFF 9
/* A REQS entry that is no request: request req_uid ([req_remote, +req_len), as its
 * pieces named it) is canceled. The source serves none of its pieces' remaining chunks
 * (those get OTE_ERR_CANCELED; a piece already copied keeps its OTE_OK); it gets no
 * response and is ignored when no open request of the connection matches it. */
#define SHM_OP_CANCEL 11
#define SHM_SRC_MAX_REQS 65536u /* accounts per connection; pieces past it pin alone */
enum { SHM_MODE_CMA = 1, SHM_MODE_RING = 2 };
#define SHM_RING_BYTES (16u << 20) /* the shared ring of one connection (ring mode) */
#define SHM_RING_SLICE (1u << 20)  /* largest slice in ring mode */
/* Staging marks (a capability: SHM_CAP_MARKS in the HELLO's h.pad, SHM_ACK_MARKS in the
 * HELLO_ACK's flags; shm_ring.c). The ring's memfd holds SHM_RING_CTL bytes more than the
 * ring_len its HELLO names: a control page whose first word is the requester's staging
 * mark, the id of the last piece it staged into the ring plus one. With marks, the
 * requester sends a REQS message first and then stages its WRITE and NOTIFY bytes,
 * publishing the mark after each piece (release); the source copies a ring piece only
 * once the mark passed its id (acquire). Its copy of one piece then overlaps the staging
 * of the next, where it used to start only after the whole message was staged (4 KiB x64
 * WRITE: 256 KiB staged before the message left). A mark that does not come is waited
 * for while the requester lives and at most transfer_timeout_ms (the piece then answers
 * OTE_ERR_TIMEOUT having moved nothing, and so does every later piece at once until the
 * mark moves again: a frozen requester costs one deadline, not one per piece). Without the capability on both sides the
 * requester stages before it sends, as protocol 3 always did. The mark is the
 * requester's to write: a wrong one only lets the source read the requester's own ring
 * early, into memory the piece was allowed to write. */
#define SHM_CAP_MARKS 2u
#define SHM_RING_CTL 4096u
/* Shared allocations (a capability of cross-memory-attach mode: SHM_CAP_SHARED in the
 * HELLO's h.pad, SHM_ACK_SHARED in the HELLO_ACK's flags; shm_shared.c). A request's
 * local buffer inside one of the requester engine's shared allocations
 * (ote_memory_alloc_shared: a memfd sealed against shrinking) is copied by the source
 * with memcpy through its own mapping of that memfd, where a process_vm_* call would pin
 * each 4 KiB page of the requester's buffer again every time (64 MiB on 4 KiB pages: 0.7x
 * UCX's shared-memory put_bw, against memcpy speed). The requester sends the allocation
 * once per connection, before the first piece that uses it: an SHM_MAP message
 * (shm_map_t: its id, its address in the requester and its size) with its memfd
 * (SCM_RIGHTS, exactly one fd), and flags those pieces SHM_REQ_SHARED. The source maps it
 * (at most SHM_SHARED_MAX per connection, SHM_SHARED_TP_BYTES in all; a plain memfd on
 * shmem sealed F_SEAL_SHRINK, at least `size` bytes; else, or when the fd could not be
 * received (RLIMIT_NOFILE), refused with a WARN and the fd closed) and copies a flagged piece
 * lying wholly inside a mapping through it; any other piece (unflagged, or a map it
 * refused) goes by process_vm_* as before: the flag is a hint that never widens what the
 * piece names (the requester's own local range, which the source could already read and
 * write by cross-memory attach; the remote range is checked and pinned as always). A map
 * overlapping an earlier one replaces it. ote_memory_free_shared queues an SHM_OP_UNMAP
 * entry (id: the allocation's) on every connection that was sent it; the source drops
 * the mapping once no message it read before holds a piece on it, and every mapping
 * when the connection ends. */
#define SHM_CAP_SHARED 4u
#define SHM_MAP 8
#define SHM_OP_UNMAP 15
#define SHM_REQ_SHARED 8u
#define SHM_SHARED_MAX 64
#define SHM_RING_MAP (SHM_RING_BYTES + SHM_RING_CTL) /* the requester's memfd and mapping */

typedef struct {
    uint32_t magic;
    uint16_t version;
    uint16_t kind;
    uint32_t n; /* entries that follow (REQS, RESPS) */
    uint32_t pad;
} shm_hdr_t;

typedef struct {
    shm_hdr_t h;
    uint64_t probe_addr; /* a cookie in the requester's memory the source must read (0:
                          * ring mode forced) */
    uint64_t probe_val;
    uint64_t ring_len;        /* bytes of the memfd passed with this message (SCM_RIGHTS) */
    char addr[OTE__ADDR_MAX]; /* the requester's advertised "host:port" (notifications) */
    /* The requester's engine name (engine_name): sent only by a named requester, whose
     * HELLO is then sizeof(shm_hello_t) bytes; an unnamed one (and every engine before
     * names) sends SHM_HELLO_BASE_LEN bytes. A source before names reads the first
     * SHM_HELLO_BASE_LEN bytes of a named HELLO and serves it (without a key: with one, the
     * proof covers every byte sent and fails). 1..OTE_CTL_MAX_NAME printable ASCII bytes,
     * NUL-terminated (the decoder takes an empty one as none). */
    char name[OTE__ENGINE_NAME_LEN];
} shm_hello_t;
#define SHM_HELLO_BASE_LEN offsetof(shm_hello_t, name)

typedef struct {
    shm_hdr_t h;
    int32_t status; /* OTE_OK, or why the source refuses this requester */
    uint32_t max_slice;
    uint32_t mode;  /* SHM_MODE_CMA or SHM_MODE_RING */
    uint32_t flags; /* SHM_ACK_* */
    char text[160];
} shm_hello_ack_t;
/* Cross-memory-attach mode: the source mapped the ring too, so small pieces may travel
 * through it (SHM_REQ_RING). */
#define SHM_ACK_RING 1u
#define SHM_ACK_IPC 2u    /* the source offers CUDA IPC on this connection */
#define SHM_ACK_MARKS 4u  /* the source waits for staging marks (SHM_CAP_MARKS) */
#define SHM_ACK_SHARED 8u /* the source maps shared allocations (SHM_CAP_SHARED) */

typedef struct {
    shm_hdr_t h;   /* kind SHM_MAP, n 0, pad 0; one fd travels with it */
    uint64_t id;   /* the allocation's id in the requester's engine (nonzero) */
    uint64_t base; /* its address in the requester (page aligned) */
    uint64_t size; /* its bytes (a multiple of the page size, at most SHM_SHARED_BYTES) */
} shm_map_t;
#define SHM_SHARED_BYTES (1ull << 42) /* 4 TiB: at most this much per allocation */
/* Bytes of shared allocations mapped at once by one engine's source side, retired maps
 * still used by a read message included (the address space is 128 TiB): a MAP past it is
 * refused, its pieces go by process_vm_*. */
#define SHM_SHARED_TP_BYTES (1ull << 44)

/* Source: one shared allocation the requester sent, mapped here. */
typedef struct shm_smap {
    struct shm_smap *next;
    uint64_t id, base, size;
    uint8_t *ptr;
    uint32_t refs; /* pieces of read messages that copy through it */
    int retired;   /* replaced or unmapped: freed once refs is 0 */
} shm_smap_t;

/* Requester: a shared allocation sent on the current connection. */
typedef struct {
    uint64_t id, base, size;
} shm_pshared_t;

typedef struct {
    shm_hdr_t h;
    uint64_t id; /* the piece it answers */
    ote__ipc_desc_t d;
} shm_ipc_offer_t;

typedef struct {
    shm_hdr_t h;
    uint64_t buffer_id;
} shm_ipc_close_t;

typedef struct {
    shm_hdr_t h;
    uint16_t step; /* OTE_CTL_AUTH_CHALLENGE, _PROOF or _OK */
    uint16_t pad[3];
    uint8_t nonce[32]; /* CHALLENGE: the source's; PROOF: the requester's */
    uint8_t mac[32];   /* PROOF, OK */
} shm_auth_t;

typedef struct {
    uint64_t id;
    uint64_t remote; /* the source's address */
    uint64_t local;  /* the requester's address (CMA) or the offset in the ring (ring) */
    uint32_t len;
    uint16_t op;    /* OTE__SLICE_* */
    uint16_t flags; /* SHM_REQ_*; other bits refused */
    /* The whole request this piece belongs to, at the source ([req_remote, +req_len);
     * 0, 0 for a notification): the source checks and pins that extent, never the piece
     * alone, so a request partly outside a registration moves no byte. */
    uint64_t req_remote, req_len;
    uint64_t req_uid; /* the request's id in the requester's engine (0: no account) */
} shm_req_t;

/* In cross-memory-attach mode, a piece whose `local` is an offset in the ring (staged
 * there by the requester, copied with memcpy by the source), not a requester address:
 * pieces of at most SHM_RING_SMALL bytes, for which one process_vm_* call per message
 * costs far more than two user-space copies. (In ring mode every piece is in the ring.) */
#define SHM_REQ_RING 1u
#define SHM_REQ_IPC 2u       /* the requester takes CUDA IPC for this piece if offered */
#define SHM_REQ_LOCAL_DEV 4u /* its local buffer is device memory: IPC or nothing */
#define SHM_RING_SMALL (64u << 10)

typedef struct {
    uint64_t id;
    int32_t status;
    uint32_t pad;
} shm_resp_t;

typedef struct shm_src shm_src_t;

/* Bytes of one request the requester dropped unsent, to write off at the source
 * (op SHM_OP_WRITE_OFF), or a request to cancel there (op SHM_OP_CANCEL, bytes 0). */
typedef struct {
    uint64_t uid, req_remote, req_len, bytes;
    uint16_t op;
    uint64_t id; /* SHM_OP_IPC_DONE: the piece */
} shm_woff_t;

/* One received REQS message (source side), checked and pinned when read, then copied. */
typedef struct {
    union {
        shm_hdr_t h;
        uint8_t b[sizeof(shm_hdr_t) + SHM_BATCH_MAX * sizeof(shm_req_t)];
    } in;
    void *pin[SHM_BATCH_MAX];
    _Atomic int32_t st[SHM_BATCH_MAX]; /* the first error of each entry wins (a file
                                        * WRITE's outcome replaces it once its write ran:
                                        * shm_fread.c) */
    uint8_t ipc[SHM_BATCH_MAX];        /* answered by an SHM_IPC_OFFER (offer[i]) */
    ote__ipc_desc_t offer[SHM_BATCH_MAX];
    int offer_fd[SHM_BATCH_MAX];     /* a VMM offer's fd (sent with it, then closed), else -1 */
    shm_smap_t *smap[SHM_BATCH_MAX]; /* a shared allocation the entry copies through */
    uint8_t *sptr[SHM_BATCH_MAX];    /* its local bytes there, else NULL */
    /* A file READ piece sent from the page cache (ote__shm_fread_mapped): its bytes in the
     * file owner's mapping, read only by process_vm_writev; else NULL. */
    const uint8_t *fmap[SHM_BATCH_MAX];
} shm_msg_t;

/* A piece whose IPC copy the requester is making: its pin, held until SHM_OP_IPC_DONE. */
typedef struct {
    uint64_t id;
    void *pin;
    uint32_t len;
} shm_held_t;

/* Requester: an IPC copy whose outcome is unknown (its request already ended): the
 * source keeps the piece pinned (no IPC_DONE) until the driver proves it complete. */
typedef struct shm_unsettled {
    struct shm_unsettled *next;
    uint64_t id; /* the piece */
    void *op;    /* host->gpu.ipc_copy_settle's */
} shm_unsettled_t;

/* An allocation offered on a connection (for close receipts). */
typedef struct {
    uint64_t buffer_id, base, size;
} shm_offered_t;

/* A piece of copy work of one message: whole entries [i, j) with one system call, or
 * (len > 0) bytes [off, off + len) of entry i. */
typedef struct {
    uint16_t i, j;
    uint32_t len;
    uint64_t off;
} shm_unit_t;

typedef struct shm_tp {
    ote__transport_t base;
    ote__cfg_t cfg;
    ote__host_t host;
    int lfd;
    char sock[SHM_SOCK_MAX + 1];
    pthread_t accept_thr;
    _Atomic int stop;
    ote_mutex_t mu; /* srcs, nsrcs */
    shm_src_t *srcs;
    size_t nsrcs;    /* at most cfg.tcp_max_accepted: more connections are closed at once */
    ote_mutex_t pmu; /* peers (requester side); taken before a peer's mu */
    struct shm_peer *peers;
    _Atomic uint64_t shared_bytes; /* mapped by every connection (SHM_SHARED_TP_BYTES) */
} shm_tp_t;

/* One accepted requester (source side). */
struct shm_src {
    shm_src_t *next;
    shm_tp_t *tp;
    int fd;
    pid_t pid;
    uid_t uid;
    int mode;                 /* SHM_MODE_* chosen at the handshake */
    uint8_t *ring;            /* ring mode: the requester's memfd, mapped */
    size_t ring_len;          /* the ring's bytes (pieces lie in [0, ring_len)) */
    size_t ring_map;          /* bytes mapped (ring_len, plus SHM_RING_CTL with marks) */
    _Atomic uint64_t *marks;  /* the requester's staging mark (SHM_ACK_MARKS), or NULL */
    _Atomic uint64_t stalled; /* 1 + the mark a wait timed out at (0: none, shm_ring.c) */
    pthread_t thr;
    _Atomic int done;      /* its thread has returned */
    ote__acct_set_t accts; /* open requests (engine/src_account.h); its thread's only */
    char from[OTE__ADDR_MAX];
    char from_name[OTE__ENGINE_NAME_LEN]; /* the requester's engine name ("" for none) */
    shm_msg_t *msgs; /* SHM_LOOKAHEAD received messages, a ring: [mhead, +mcount) */
    uint32_t mhead, mcount;
    _Atomic int abort; /* the requester is gone: copy nothing more */
    int ipc;           /* CUDA IPC negotiated (SHM_ACK_IPC) */
    shm_held_t *held;  /* pieces offered by IPC, pinned until their IPC_DONE; thread's */
    size_t nheld, held_cap;
    shm_offered_t offered[SHM_IPC_OFFERED]; /* under tp->mu */
    size_t noffered;
    int shared;           /* shared allocations negotiated (SHM_ACK_SHARED) */
    shm_smap_t *smaps;    /* mapped, in use; its thread's only */
    shm_smap_t *sretired; /* replaced or unmapped, still used by a read message */
    size_t nsmaps;
    /* Copy helpers (started on the first large message) and the job they share. */
    pthread_t helper[SHM_COPY_HELPERS];
    int nhelpers;
    ote_mutex_t jmu; /* job fields below; helpers sleep on jcv, the thread on jdone_cv */
    ote_cond_t jcv, jdone_cv;
    int jstop;
    uint64_t jgen;
    shm_msg_t *jmsg;
    shm_unit_t jun[SHM_UNITS_MAX];
    uint32_t jn;
    _Atomic uint64_t jnext; /* (generation << 32) | next unit */
    _Atomic uint32_t jdone; /* units finished */
    struct shm_frwin *frw;  /* file reads ahead (shm_fread.c), the thread's; NULL: none yet */
};

/* A peer (requester side). */
typedef struct shm_peer {
    shm_tp_t *tp;
    struct shm_peer *pnext, *pprev; /* tp->peers, under tp->pmu */
    char addr[OTE__ADDR_MAX];
    char sock[SHM_SOCK_MAX + 1];
    ote_mutex_t ensure_mu; /* reconnect */
    ote_mutex_t mu;
    int fd;
    int broken;
    int stop;
    pid_t src_pid;
    uint32_t max_slice;
    int mode;              /* SHM_MODE_* of the current connection */
    int ipc;               /* the current connection carries CUDA IPC (SHM_ACK_IPC) */
    ote__slice_t *ih, *it; /* slices whose IPC copy runs (receive thread polls them) */
    shm_unsettled_t *uh;   /* IPC copies of unknown outcome (receive thread's) */
    uint8_t *ring;         /* the shared ring (mapped while connected; in CMA mode only when the
                    * source mapped it too: small pieces then travel through it) */
    uint64_t ring_head, ring_tail; /* in-order allocation (virtual offsets) */
    _Atomic uint64_t *marks;       /* staging mark in the ring's control page (SHM_ACK_MARKS) */
    pthread_t rx;
    int rx_started;
    ote__slice_t *qh, *qt;  /* waiting to be sent */
    ote__slice_t *fh, *ft;  /* sent, in order, awaiting their response */
    _Atomic size_t nflight; /* read without mu by the receive thread's spin */
    uint64_t flight_bytes;
    uint64_t next_id;
    shm_woff_t *woff; /* write-offs to send with the next REQS message */
    size_t nwoff, woff_cap;
    /* Restarted peers: the incarnation its advertisement named at open
     * (ote_ctl_info_incarnation); a reconnect whose advertisement names another one
     * fails the peer for good (restarted). Under ensure_mu (met: set at open). */
    uint64_t met;
    int restarted;
    /* Shared allocations (SHM_ACK_SHARED on the current connection), under mu. */
    int shared_ok;
    shm_pshared_t shared[SHM_SHARED_MAX]; /* sent on the current connection */
    size_t nshared;
} shm_peer_t;

/* shm_requester.c */
ote_status_t ote__shm_peer_open_info(ote__transport_t *tp, const char *peer, const char *peer_info,
                                     ote__tpeer_t **peer_out);
ote_status_t ote__shm_peer_open(ote__transport_t *tp, const char *peer, ote__tpeer_t **peer_out);
ote_status_t ote__shm_peer_ensure(ote__tpeer_t *peer);
uint32_t ote__shm_peer_max_slice(ote__tpeer_t *peer);
void ote__shm_submit(ote__tpeer_t *peer, ote__slice_t *list);
void ote__shm_cancel(ote__tpeer_t *peer);
ote_status_t ote__shm_peer_close(ote__tpeer_t *peer);
/* ops->peer_lost: the peer killed as on a lost connection (its slices end PEER_LOST). */
void ote__shm_peer_lost(ote__tpeer_t *peer);
int ote__shm_ipc_ready(ote__tpeer_t *peer);
/* The slices a call of the requester side completes, in order: each one's done() runs
 * once no lock is held. */
typedef struct {
    ote__slice_t *h, *t;
} shm_slist_t;
void ote__shm_slist_add(shm_slist_t *l, ote__slice_t *s, ote_status_t st);
void ote__shm_slist_finish(shm_slist_t *l); /* done() of each, in order; no lock held */
/* Send pending write-offs, and queued slices while the window allows. p->mu held. */
void ote__shm_peer_pump(shm_peer_t *p, shm_slist_t *done);
/* Queue entry w (write-off, cancel, IPC_DONE, UNMAP) for the next REQS message: 0, or -1
 * out of memory (the caller says what the source then keeps). p->mu held. */
int ote__shm_peer_woff_push(shm_peer_t *p, shm_woff_t w);

/* shm_requester_ipc.c (the receive thread; p->mu held but for recv_fds). */
ssize_t ote__shm_recv_fds(int sock, uint8_t *buf, size_t cap, int *fd_out, int *bad);
int ote__shm_peer_offer(shm_peer_t *p, const uint8_t *b, size_t n, int fd, shm_slist_t *done);
void ote__shm_peer_ipc_poll(shm_peer_t *p, shm_slist_t *done);
void ote__shm_peer_ipc_settle(shm_peer_t *p);
int ote__shm_peer_close_receipt(shm_peer_t *p, const uint8_t *b, size_t n);

/* shm_pins.c (the connection's thread only). Check and pin piece q, whose request's
 * extent (validated by the caller) is [start, start + len): through its request's account
 * (pinned once, by the first piece) or alone; *pin_out goes back to src_unpin with the
 * piece's length once it is copied. A refusal is the request's: every piece gets it. */
ote_status_t ote__shm_src_pin(shm_src_t *s, const shm_req_t *q, uint64_t start, uint64_t len,
                              unsigned perm, void **pin_out);
void ote__shm_src_unpin(shm_src_t *s, void *pin, uint32_t len);
/* The engine's pin (host->pin's) behind a pin of ote__shm_src_pin, for ote__pin_kind. */
void *ote__shm_src_engine_pin(shm_src_t *s, void *pin);
void ote__shm_src_write_off(shm_src_t *s, const shm_req_t *q); /* a WRITE_OFF entry */
void ote__shm_src_cancel(shm_src_t *s, const shm_req_t *q);    /* a CANCEL entry */
/* Nonzero when the request a pin of ote__shm_src_pin belongs to was canceled; any
 * thread, while the piece is held. */
int ote__shm_src_canceled(const void *pin);
void ote__shm_src_accts_end(shm_src_t *s); /* the connection closed */

static inline const shm_req_t *ote__shm_msg_reqs(const shm_msg_t *m) {
    return (const shm_req_t *)(m->in.b + sizeof(shm_hdr_t));
}
/* The piece's `local` is an offset in the ring (ring mode, or a small piece so marked). */
static inline int ote__shm_in_ring(const shm_src_t *s, const shm_req_t *q) {
    if (q->flags & SHM_REQ_LOCAL_DEV) return 0; /* a device address, never copied here */
    return s->mode == SHM_MODE_RING || (q->flags & SHM_REQ_RING) != 0;
}
/* Whether pin is a file registration's (engine/file: host->file). */
static inline int ote__shm_src_is_file(shm_src_t *s, void *pin) {
    return pin != NULL && ote__pin_kind(ote__shm_src_engine_pin(s, pin)) == OTE_MEM_FILE;
}

/* shm_source.c: copy len bytes of piece q between this process's `mine` and the
 * requester's `theirs` (CMA), the ring at offset theirs (ring; a WRITE's bytes once the
 * requester's staging mark says they are there), or its shared allocation mapped here. */
ote_status_t ote__shm_copy_bytes(shm_src_t *s, const shm_req_t *q, uint8_t *mine, uint64_t theirs,
                                 uint8_t *mapped, size_t len);

/* Piece i of m failed with st (its first failure stays). */
void ote__shm_set_st(shm_msg_t *m, uint32_t i, ote_status_t st);
/* The connection thread, between two steps of serving a message: the messages the
 * requester sent meanwhile read into the lookahead (s->abort set when it is gone). */
void ote__shm_src_pull_between(shm_src_t *s);
/* shm_fread.c (the connection's thread): piece i of message m, on a file registration,
 * served through a bounce (a READ's read started ahead with those of the run's later
 * READ pieces up to b and, past m's end, of the READs read after it; a WRITE's write
 * started once its bytes are in the bounce, or already by the settle of the message
 * before, its status set at the settle of its run; at most SHM_SRC_FILE_READS of them);
 * its status. settle: wait for the I/O of m's entries [a, b) still running (reads of
 * pieces skipped, and the WRITEs' writes, whose outcome becomes their piece's status; m
 * NULL: all of it), bounces back, after starting the writes of later messages when [a, b)
 * ends m; end: the connection closes. */
ote_status_t ote__shm_fread_piece(shm_src_t *s, shm_msg_t *m, uint32_t i, uint32_t b);
/* Zero copy (host->file.map_read): 1 when file READ piece i of m is to be copied from the
 * page cache by the copy units like memory (m->fmap[i] set): the page cache holds all of
 * it, and it is not a piece the ring or a shared allocation carries (both copied with
 * memcpy here, which must never load from the mapping), nor one whose read started ahead,
 * nor one that a running write meets; chosen when it is served, or earlier by reading
 * ahead (which then starts no read for it). 0: serve it by ote__shm_fread_piece. */
int ote__shm_fread_mapped(shm_src_t *s, shm_msg_t *m, uint32_t i);
void ote__shm_fread_settle(shm_src_t *s, shm_msg_t *m, uint32_t a, uint32_t b);
void ote__shm_fread_end(shm_src_t *s);

/* shm_connect.c: connect and handshake p with its source (p->fd, src_pid, mode, ring,
 * marks, ipc and max_slice set on success; *shared_ok: the source maps shared
 * allocations). Nothing of it is left on failure. */
ote_status_t ote__shm_peer_connect(shm_peer_t *p, int *shared_ok);

/* shm_ring.c: the shared ring's memfd (requester: created, SHM_RING_MAP bytes, mapped;
 * the fd returned, -1 on error), its mapping by the source (0, or -1 with the reason in
 * text; marks when the HELLO asks for them and the memfd holds the control page), and the
 * source's wait for the staging mark of piece id (OTE_OK; OTE_ERR_PEER_LOST when the
 * requester or this connection ended first; OTE_ERR_TIMEOUT after transfer_timeout_ms). */
int ote__shm_ring_create(uint8_t **map_out);
/* Why the source must not map fd (a ring or a shared allocation) of at least need bytes:
 * not a regular file on shmem (a plain memfd; hugetlbfs can SIGBUS), shorter, or not
 * sealed against shrinking; NULL when it may (*size_out: its size, when not NULL). */
const char *ote__shm_memfd_unsafe(int fd, uint64_t need, uint64_t *size_out);
int ote__shm_ring_map(shm_src_t *s, const shm_hello_t *h, int rfd, char *text, size_t tl);
ote_status_t ote__shm_ring_ready(shm_src_t *s, uint64_t id);
/* Whether piece id's bytes are staged already (ote__shm_ring_ready without waiting). */
int ote__shm_ring_staged(const shm_src_t *s, uint64_t id);

/* shm_shared.c. Requester: whether slice s (host memory, a READ or WRITE) lies in a
 * shared allocation the source was sent (sending it now when not yet: SHM_MAP; p->mu
 * held); the transport's peer list (open, close); ops->shared_free. Source: an SHM_MAP
 * message with its fd (-1: none; the fd is always consumed): 0, or -1 when it is a
 * protocol error; an SHM_OP_UNMAP entry; entry i of a message just read (checked, flagged
 * SHM_REQ_SHARED) takes its mapping; a served message lets its mappings go; the
 * connection's end unmaps all. */
int ote__shm_peer_shared(shm_peer_t *p, const ote__slice_t *s);
void ote__shm_peers_add(shm_peer_t *p);
void ote__shm_peers_del(shm_peer_t *p);
void ote__shm_shared_free(ote__transport_t *tp, uint64_t id);
int ote__shm_src_map(shm_src_t *s, const uint8_t *b, size_t n, int fd, int fds_bad);
void ote__shm_src_unmap(shm_src_t *s, uint64_t id);
void ote__shm_src_shared_take(shm_src_t *s, shm_msg_t *m, uint32_t i);
void ote__shm_src_shared_release(shm_src_t *s, shm_msg_t *m);
void ote__shm_src_shared_end(shm_src_t *s);

/* shm_source_ipc.c (the connection's thread, but offered_note and ipc_revoke, which
 * take tp->mu): a piece offered by IPC keeps its pin until IPC_DONE (held_add: 1, or 0
 * out of memory; held_done; held_end when the connection ends); offered_note remembers
 * an allocation offered on s for close receipts. */
int ote__shm_src_held_add(shm_src_t *s, uint64_t id, void *pin, uint32_t len);
void ote__shm_src_held_done(shm_src_t *s, uint64_t id);
void ote__shm_src_held_end(shm_src_t *s);
void ote__shm_src_offered_note(shm_src_t *s, const ote__ipc_desc_t *d);

/* Close receipts for the allocation holding [start, +len) to every connection it was
 * offered on (any thread; takes tp->mu). */
void ote__shm_ipc_revoke(ote__transport_t *tp, uint64_t start, uint64_t len);

/* shm_source.c: the thread of one accepted connection (arg: its shm_src_t). */
void *ote__shm_src_main(void *arg);

/* Fill an abstract socket address for name; returns its length. */
socklen_t ote__shm_sockaddr(const char *name, void *sun_out);
/* sendmsg of one message with fd attached (SCM_RIGHTS; none when fd < 0), MSG_NOSIGNAL
 * and flags (MSG_DONTWAIT: never waits): sendmsg's answer. */
ssize_t ote__shm_send_fd(int sock, const void *buf, size_t len, int fd, int flags);

#endif

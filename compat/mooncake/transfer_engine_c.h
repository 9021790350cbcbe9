/*
 * transfer_engine_c.h - Mooncake's transfer engine C API, served by OrbitTE.
 *
 * This header declares the functions, types and constants of Mooncake's C API (the
 * header of the same name in kvcache-ai/Mooncake) with the same names, types, struct
 * layouts and return conventions, written for OrbitTE from the documented contract. A
 * program written against Mooncake's C API builds against this header and links
 * libmooncake_transfer_engine_compat.so (//compat/mooncake) instead. Both ends must run
 * OrbitTE: the wire protocol is OrbitTE's, not Mooncake's.
 *
 * Conventions (Mooncake's):
 *  - Strings passed in are copied: the caller may free them when a call returns.
 *  - Calls returning int answer 0 on success. Memory and segment calls answer Mooncake's
 *    negative error codes (OTE_MC_ERR_* below); batch calls (submitTransfer,
 *    getTransferStatus, freeBatchID) answer Mooncake's positive Status codes
 *    (OTE_MC_CODE_* below). Outputs are written only on success.
 *  - Remote addresses (transfer_request_t.target_offset) are the peer's absolute virtual
 *    addresses inside memory it registered.
 *  - Every call is thread-safe. No lock of this library is held across a network call.
 *  - Failures are logged on stderr through OrbitTE's logger (component "mooncake";
 *    OTE_LOG_LEVEL sets the level) with the OrbitTE status that caused them.
 *
 * What OrbitTE does not have returns an error and logs why (see each function below):
 * metadata servers other than "P2PHANDSHAKE", uninstallTransport, removeLocalSegment and
 * enableGracefulShutdown (a WARN; it returns nothing).
 */
#ifndef ORBITTE_COMPAT_MOONCAKE_TRANSFER_ENGINE_C_H
#define ORBITTE_COMPAT_MOONCAKE_TRANSFER_ENGINE_C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Mooncake spells these as macros, not typedefs; so does this header, so that code that
 * tests or redefines them behaves the same. */
#define segment_handle_t int32_t
#define segment_id_t int32_t
#define batch_id_t uint64_t
#define LOCAL_SEGMENT (0)
#define INVALID_BATCH UINT64_MAX

#define OPCODE_READ (0)
#define OPCODE_WRITE (1)

struct transfer_request {
    int opcode;             /* OPCODE_READ (remote -> source) or OPCODE_WRITE */
    void *source;           /* local buffer */
    segment_id_t target_id; /* from openSegment, or LOCAL_SEGMENT */
    uint64_t target_offset; /* the peer's absolute virtual address */
    uint64_t length;
};
typedef struct transfer_request transfer_request_t;

struct notify_msg {
    char *name;
    char *msg;
};
typedef struct notify_msg notify_msg_t;

#define STATUS_WAITING (0)
#define STATUS_PENDING (1)
#define STATUS_INVALID (2)
#define STATUS_CANCELED (3)
#define STATUS_COMPLETED (4)
#define STATUS_TIMEOUT (5)
#define STATUS_FAILED (6)

struct transfer_status {
    int status; /* STATUS_* */
    uint64_t transferred_bytes;
};

/* Mooncake's segment descriptor (RDMA memory or an NVMe-oF file). No function of this
 * API takes it; it is declared for source compatibility. */
struct segment_desc {
    int type;
    union {
        struct {
            void *addr;
            uint64_t size;
            const char *location;
        } rdma;
        struct {
            const char *file_path;
            const char *subsystem_name;
            const char *proto;
            const char *ip;
            uint64_t port;
        } nvmeof;
    } desc_;
};
typedef struct transfer_status transfer_status_t;

struct buffer_entry {
    void *addr;
    size_t length;
};
typedef struct buffer_entry buffer_entry_t;

typedef struct segment_desc segment_desc_t;
typedef void *transfer_engine_t;
typedef void *transport_t;

/* Mooncake's negative error codes (its error.h), returned by the memory, segment and
 * notification calls. */
#define OTE_MC_ERR_INVALID_ARGUMENT (-1)
#define OTE_MC_ERR_TOO_MANY_REQUESTS (-2)
#define OTE_MC_ERR_ADDRESS_NOT_REGISTERED (-3)
#define OTE_MC_ERR_BATCH_BUSY (-4)
#define OTE_MC_ERR_DEVICE_NOT_FOUND (-6)
#define OTE_MC_ERR_ADDRESS_OVERLAPPED (-7)
#define OTE_MC_ERR_SOCKET (-102)
#define OTE_MC_ERR_REJECT_HANDSHAKE (-104)
#define OTE_MC_ERR_METADATA (-200)
#define OTE_MC_ERR_ENDPOINT (-201)
#define OTE_MC_ERR_CONTEXT (-202)
#define OTE_MC_ERR_MEMORY (-302)
#define OTE_MC_ERR_NOT_IMPLEMENTED (-303)

/* Mooncake's positive Status codes, returned by the batch calls. */
#define OTE_MC_CODE_OK 0
#define OTE_MC_CODE_INVALID_ARGUMENT 1
#define OTE_MC_CODE_TOO_MANY_REQUESTS 2
#define OTE_MC_CODE_ADDRESS_NOT_REGISTERED 3
#define OTE_MC_CODE_BATCH_BUSY 4
#define OTE_MC_CODE_DEVICE_NOT_FOUND 6
#define OTE_MC_CODE_ADDRESS_OVERLAPPED 7
#define OTE_MC_CODE_NOT_SUPPORTED_TRANSPORT 8
#define OTE_MC_CODE_SOCKET 102
#define OTE_MC_CODE_REJECT_HANDSHAKE 104
#define OTE_MC_CODE_ENDPOINT 201
#define OTE_MC_CODE_CONTEXT 202
#define OTE_MC_CODE_MEMORY 302
#define OTE_MC_CODE_NOT_IMPLEMENTED 999

/* ---- engine ---------------------------------------------------------------------------
 * metadata_conn_string must be "P2PHANDSHAKE" (peers exchange what they need directly);
 * anything else (etcd, redis, http) returns NULL with an ERROR: OrbitTE has no name
 * service. The engine listens on ip_or_host_name:rpc_port (rpc_port 0: a free port; an
 * empty ip_or_host_name: the host of local_server_name, else 127.0.0.1); a non-loopback
 * address needs OrbitTE's cluster key (OTE_AUTH_KEY_FILE) or OTE_ALLOW_UNAUTHENTICATED=1.
 * auto_discover != 0 creates the OrbitTE engine at once with the rdma transport when an
 * RDMA device is present (and MC_FORCE_TCP is not set), falling back to tcp with a WARN,
 * else tcp. auto_discover == 0 creates it at the first installTransport; until then the
 * calls that need it fail (logged). Same-host peers use shared memory either way. Other
 * settings come from OTE_* environment variables (<ote/ote.h>). */
transfer_engine_t createTransferEngine(const char *metadata_conn_string,
                                       const char *local_server_name, const char *ip_or_host_name,
                                       uint64_t rpc_port, int auto_discover);

/* 0 when the engine exists: OrbitTE discovers its devices when it is created. */
int discoverTopology(transfer_engine_t engine);

/* "ip:port" peers pass to openSegment. -1 when it does not fit buf_out (never truncated). */
int getLocalIpAndPort(transfer_engine_t engine, char *buf_out, size_t buf_len);

/* "tcp" or "rdma" (args, Mooncake's NIC priority matrix, are ignored: OrbitTE picks NICs
 * itself; OTE_RDMA_DEVICES restricts them). Creates the engine on the first call; a
 * protocol the engine already serves returns its handle again; another one, or an
 * unknown one, returns NULL and logs why (an engine's transports are fixed at creation). */
transport_t installTransport(transfer_engine_t engine, const char *proto, void **args);

/* OTE_MC_ERR_NOT_IMPLEMENTED (logged): a running OrbitTE engine keeps its transports. */
int uninstallTransport(transfer_engine_t engine, const char *proto);

/* Connects to the engine at "host:port" (leading '/' ignored) and returns a small id,
 * the same for the same name while it is open; this engine's own name gives
 * LOCAL_SEGMENT. -1 on failure (logged). */
segment_id_t openSegment(transfer_engine_t engine, const char *segment_name);

/* The same: OrbitTE caches no descriptor of a peer (each request is checked against the
 * peer's registrations when it arrives), so there is nothing to refresh. */
segment_id_t openSegmentNoCache(transfer_engine_t engine, const char *segment_name);

/* 0, or OTE_MC_ERR_BATCH_BUSY while requests of a batch on it are pending (the segment
 * stays open), OTE_MC_ERR_INVALID_ARGUMENT for an unknown id. */
int closeSegment(transfer_engine_t engine, segment_id_t segment_id);

/* Opens (handshakes with) the segment now, so the first transfer does not: 0 or -1. */
int warmupEfaSegment(transfer_engine_t engine, const char *segment_name);

/* OTE_MC_ERR_NOT_IMPLEMENTED (logged): OrbitTE publishes no segment descriptor. */
int removeLocalSegment(transfer_engine_t engine, const char *segment_name);

/* Cancels pending requests, frees batches, closes segments and destroys the engine.
 * Should OrbitTE refuse (a native object it cannot destroy), an ERROR says what is kept. */
void destroyTransferEngine(transfer_engine_t engine);

/* ---- memory ---------------------------------------------------------------------------
 * remote_accessible != 0: peers may READ and WRITE the range; 0: the range is only
 * recorded as a valid local source (OrbitTE needs no registration for that). location
 * ("cpu:0", "cuda:0", "*") is ignored: OrbitTE finds the memory's kind and node itself.
 * 0, OTE_MC_ERR_INVALID_ARGUMENT (NULL, length 0, unmapped), OTE_MC_ERR_ADDRESS_OVERLAPPED,
 * or the mapped OrbitTE failure. Batch: all or nothing. */
int registerLocalMemory(transfer_engine_t engine, void *addr, size_t length, const char *location,
                        int remote_accessible);
/* 0, OTE_MC_ERR_ADDRESS_NOT_REGISTERED, or OTE_MC_ERR_BATCH_BUSY while a transfer uses it.
 * Batch: every address is tried; the first failure is returned. */
int unregisterLocalMemory(transfer_engine_t engine, void *addr);
int registerLocalMemoryBatch(transfer_engine_t engine, buffer_entry_t *buffer_list,
                             size_t buffer_len, const char *location);
int unregisterLocalMemoryBatch(transfer_engine_t engine, void **addr_list, size_t addr_len);

/* ---- batches --------------------------------------------------------------------------
 * A batch holds up to batch_size requests; INVALID_BATCH on failure. */
batch_id_t allocateBatchID(transfer_engine_t engine, size_t batch_size);

/* Appends count requests (task ids follow: the i-th request submitted is task i).
 * Validated as a whole, nothing is submitted on failure: OTE_MC_CODE_INVALID_ARGUMENT
 * (unknown batch or segment id, bad opcode, NULL source), OTE_MC_CODE_TOO_MANY_REQUESTS
 * (more than batch_size in all), OTE_MC_CODE_ADDRESS_NOT_REGISTERED (a source range not
 * inside memory given to registerLocalMemory), or the mapped OrbitTE failure. */
int submitTransfer(transfer_engine_t engine, batch_id_t batch_id, struct transfer_request *entries,
                   size_t count);

/* The same, and notify_msg is sent to the segment of entries[0] (as Mooncake) once every
 * request of the batch has ended and those to that segment COMPLETED; it is not sent when
 * one of them failed. The tasks read STATUS_PENDING until it is acknowledged, and
 * STATUS_FAILED (logged) when it could not be delivered. */
int submitTransferWithNotify(transfer_engine_t engine, batch_id_t batch_id,
                             struct transfer_request *entries, size_t count,
                             notify_msg_t notify_msg);

/* Every notification received and not yet taken, as a malloc'd array of *size entries
 * (free it with freeNotifsMsgBuf); NULL with *size 0 when there is none. A notification
 * sent through this library (or Python's orbitte.mooncake) carries the name its sender
 * gave; one sent with OrbitTE's own ote_notify_send is named by its sender's engine name
 * (config key engine_name, e.g. OTE_ENGINE_NAME), else by its "host:port". */
notify_msg_t *getNotifsFromEngine(transfer_engine_t engine, int *size);
int freeNotifsMsgBuf(notify_msg_t *msg, int size);

/* Sends notify_msg to an open segment now: 0, OTE_MC_ERR_METADATA for an unknown id, or
 * the mapped OrbitTE failure (OTE_MC_ERR_SOCKET: lost, unreachable or its queue full). */
int genNotifyInEngine(transfer_engine_t engine, uint64_t target_id, notify_msg_t notify_msg);

/* Task task_id's state: 0 and *status, or OTE_MC_CODE_INVALID_ARGUMENT (unknown batch,
 * task not submitted). */
int getTransferStatus(transfer_engine_t engine, batch_id_t batch_id, size_t task_id,
                      struct transfer_status *status);

/* 0, or OTE_MC_CODE_BATCH_BUSY (nothing freed) while a task or its notification is
 * pending, OTE_MC_CODE_INVALID_ARGUMENT for an unknown id. */
int freeBatchID(transfer_engine_t engine, batch_id_t batch_id);

/* 0: OrbitTE keeps no segment cache to resynchronize (see openSegmentNoCache). */
int syncSegmentCache(transfer_engine_t engine);

/* ---- diagnostics ---------------------------------------------------------------------- */
struct nic_load_stat {
    char device_name[64];
    uint64_t inflight_bytes;
    double ewma_bandwidth_bps;
};
typedef struct nic_load_stat nic_load_stat_t;

/* The RDMA NICs of the engine (none over tcp): *count in = room in stats, out = how many
 * there are (the first min of both are written). inflight_bytes is always 0 (OrbitTE
 * counts bytes carried, not bytes in flight); ewma_bandwidth_bps is the rate of bytes
 * carried (sent and served) between successive calls, smoothed (0 at the first call). */
int getNicLoadStats(transfer_engine_t engine, nic_load_stat_t *stats, size_t *count);

/* Not supported (a WARN says so): OrbitTE installs no signal handler. A killed process's
 * peers see its connections close: their requests to it fail and its pins are released. */
void enableGracefulShutdown(transfer_engine_t engine);

/* The engine's address, transports, NICs and open segments, as text or (json != 0) one
 * JSON object. -1 when it does not fit buf_out (never truncated). */
int showLinks(transfer_engine_t engine, char *buf_out, size_t buf_len, int json);

#ifdef __cplusplus
}
#endif
#endif

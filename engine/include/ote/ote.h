/*
 * <ote/ote.h> - the OrbitTE public C API.
 *
 * OrbitTE moves bytes between registered memory of processes and hosts. A user creates
 * an engine, registers large buffers once, opens a peer's segment by its "host:port"
 * address (the peer's descriptor comes from the peer itself over the control
 * connection), submits batches of READ/WRITE requests against the peer's buffers, and
 * polls or waits for completion.
 *
 * Conventions: every call returns ote_status_t (OTE_OK == 0) unless noted; outputs are
 * written only on success; bad input returns OTE_ERR_INVALID and changes nothing. All
 * calls are thread-safe: many threads may submit and poll at once. Every wait takes a
 * timeout. Compare statuses with ote_status_code(); ote_status_str() names them and
 * ote_status_errno() gives the errno of a failed native call.
 */
#ifndef OTE_OTE_H
#define OTE_OTE_H

#include <stddef.h>
#include <stdint.h>

#include "ote/log.h"
#include "ote/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define OTE_API_VERSION 1

/* The library's version; the shared library's SONAME is liborbitte.so.<OTE_VERSION_MAJOR>. */
#define OTE_VERSION_MAJOR 1
#define OTE_VERSION_MINOR 0
#define OTE_VERSION_PATCH 0

/* "MAJOR.MINOR.PATCH" of the library linked or loaded (which may be newer than the header
 * a program was built with). Never fails; the string is static. */
const char *ote_version(void);

/* What this library can use on this machine, now (ote_features). */
#define OTE_FEATURE_RDMA_CORE (1u << 0) /* libibverbs loads: transports=rdma on real NICs */
#define OTE_FEATURE_VERBS_SIM (1u << 1) /* the software verbs provider (always built in) */
#define OTE_FEATURE_CUDA (1u << 2)      /* a CUDA driver library loads (libcuda.so.1) */
#define OTE_FEATURE_AUTH (1u << 3)      /* cluster-key authentication (always built in) */
/* The OTE_FEATURE_* bits that hold, in *features_out: libibverbs and the CUDA driver are
 * looked for ($OTE_IBVERBS_LIBRARY, $OTE_CUDA_LIBRARY, else their sonames) without
 * opening a device or initialising the driver, so a bit says the library is there, not
 * that a NIC or GPU is. OTE_ERR_INVALID for NULL. */
ote_status_t ote_features(uint32_t *features_out);

typedef struct ote_config ote_config_t;
typedef struct ote_engine ote_engine_t;
typedef struct ote_segment ote_segment_t;
typedef struct ote_batch ote_batch_t;

/* ---- configuration ------------------------------------------------------------------
 * Every value is a string (sizes accept K/M/G suffixes, powers of 1024). Each key's values,
 * default and behaviour: docs/configuration.md, generated from engine/config.c's key table
 * (CI checks that this list, the table and that file agree). Every key can also come from
 * the environment as OTE_<KEY> (upper case); a value set with ote_config_set() wins.
 *   transports           ordered transport list out of shm, tcp, rdma (default "shm,tcp")
 *   transport            the one-element form of transports
 *   shm_mode             auto (cross-memory attach where allowed) or ring
 *   listen_address       "host:port" / "[v6]:port" of the one listening socket
 *   advertise_address    the address peers are told, in place of the listen address
 *   engine_name          this engine's name, given to receivers with its notifications
 *   tcp_connections      TCP data connections per peer
 *   tcp_workers          TCP worker threads
 *   tcp_max_accepted     connections the listener holds at once
 *   slice_size           bytes per slice a request is cut into
 *   transfer_timeout_ms  deadline of every transfer
 *   connect_timeout_ms   deadline of a connection attempt and handshake
 *   handshake_timeout_ms deadline of an accepted connection's HELLO (and proof)
 *   verbs_provider       rdma-core or sim
 *   sim_profile          device profile of the sim's devices (mlx5, rxe, nomw, small)
 *   rdma_device          one RDMA device to use alone
 *   rdma_devices         the RDMA devices the data path may use
 *   rdma_exclude         RDMA devices never used
 *   rdma_topology        file: RDMA NICs in order per GPU and NUMA node (else hwloc)
 *   rdma_lanes           CQ lanes (worker threads) per RDMA device
 *   rdma_pin             strict routes "device:port:gid_index"
 *   rdma_port            the port of every device rdma_pin does not name
 *   rdma_gid_index       the GID index of every device rdma_pin does not name (strict)
 *   rdma_traffic_class   GRH traffic class of every QP (RoCE v2: DSCP << 2 | ECN)
 *   rdma_service_level   service level of every QP
 *   rdma_mtu             largest path MTU (256..4096 bytes)
 *   rdma_sysfs_root      where sysfs is mounted (default /sys)
 *   rdma_grant_max       most bytes one RDMA grant covers
 *   rdma_max_inflight    most bytes of RDMA requests in flight (0: no limit)
 *   rdma_max_grants      most grant credits held by this engine's requests (0: no limit)
 *   rdma_max_qps         most QPs this engine holds (0: no limit)
 *   rdma_recv_slots      receive slots of a QP without the shared receive queue
 *   rdma_srq_slots       receive buffers of each lane's shared receive queue
 *   rdma_max_peers       requesters served over RDMA at once
 *   rdma_max_send_wrs    most send WRs outstanding over every QP (0: no limit)
 *   rdma_max_served_grants most grant credits a source reserves for its peers (0: no limit)
 *   rdma_grant_mode      how a source grants host memory: auto, mw or mr
 *   log_level            error, warn, info, debug or trace: process-wide (<ote/log.h>)
 *   auth_key_file        path of the cluster key (needed to listen off loopback)
 *   allow_unauthenticated "1": listen off loopback without a key
 *   gpu_paths            paths device memory may take: staging, ipc, direct
 *   gpu_staging_chunk    bytes of one pinned staging chunk
 *   gpu_staging_depth    staging chunks in flight per request
 *   register_thp         "1": advise transparent huge pages for registered host memory
 *   file_engine          file I/O by auto, uring (io_uring) or threads (preadv/pwritev)
 *   file_queue_depth     file I/O operations in flight
 *   file_chunk_size      bytes of one file I/O operation
 *   file_sync            none or data (fdatasync before a file WRITE completes)
 *   file_zero_copy       auto or off (peers' READs of cached file ranges skip the bounce)
 * RDMA depths are drawn from the device (query_device_ex at open): a configured value above
 * a device limit is clamped with one INFO line naming both.
 */
ote_status_t ote_config_create(ote_config_t **cfg_out);
/* OTE_ERR_NOT_FOUND for an unknown key, OTE_ERR_INVALID for a malformed value. */
ote_status_t ote_config_set(ote_config_t *cfg, const char *key, const char *value);
/* Effective value (set, else environment, else default) copied into buf. */
ote_status_t ote_config_get(const ote_config_t *cfg, const char *key, char *buf, size_t len);
void ote_config_destroy(ote_config_t *cfg);

/* ---- engine ------------------------------------------------------------------------ */
/* cfg may be NULL (environment and defaults). The engine copies what it needs. */
ote_status_t ote_engine_create(const ote_config_t *cfg, ote_engine_t **engine_out);
/* Refused with OTE_ERR_BUSY (nothing done, the engine usable) while segments or batches
 * are open. Otherwise stops the listener and every thread of every transport and
 * destroys what they own: OTE_OK, the engine is freed.
 * OTE_ERR_RETAINED: a native destroy failed (a QP, memory window, CQ, MR or PD the
 * provider would not destroy) or a transport thread did not end within its bound (an
 * RDMA control thread: connect_timeout_ms + 10 s after its socket was shut down). The
 * engine object, its registrations and everything not yet destroyed are kept (ERROR
 * lines name them); while a QP, window or CQ is kept the registrations' MRs stay
 * registered, so the application must keep registered memory allocated until a destroy
 * returns OTE_OK. Every other call on the engine then returns OTE_ERR_STATE; call
 * ote_engine_destroy again to retry exactly what is left (OTE_OK once it succeeds, which
 * frees everything). No thread of the engine outlives it. */
ote_status_t ote_engine_destroy(ote_engine_t *engine);
/* "host:port" (or "[v6]:port") other engines use to reach this one. */
ote_status_t ote_engine_address(ote_engine_t *engine, char *buf, size_t len);

/* One data device (NIC) of an engine's transports and the bytes it carried. */
typedef struct {
    char transport[8];     /* "rdma" */
    char name[64];         /* the device's name */
    uint64_t bytes_out;    /* bytes of this engine's READ/WRITE requests it carried */
    uint64_t bytes_served; /* bytes of peers' requests it served */
    int active;            /* its port is active now */
    uint64_t grants;       /* grants this engine asked of peers on it (control round trips) */
} ote_nic_stats_t;

/* The data devices of the engine's transports (TCP and shm have none) in out; *n_out is
 * how many there are. cap too small: OTE_ERR_TOO_BIG with *n_out the number needed, out
 * untouched. Counters only grow. OTE_ERR_INVALID for a NULL engine or n_out, or out NULL
 * with cap. */
ote_status_t ote_engine_nic_stats(ote_engine_t *engine, ote_nic_stats_t *out, size_t cap,
                                  size_t *n_out);

/* The order in which the engine picks its data devices for memory of each CUDA device
 * and of each NUMA node (docs/rdma.md, "Which NIC carries a buffer"): text, one line each,
 *     gpu<N> <PCI bus id> <source>: <device>=<rank> ...
 *     numa<N> <source>: <device>=<rank> ...
 * devices best first (lower rank; equal ranks share the load). source: "pcie" (the PCIe
 * tree: 0 same leaf switch, 1 same switch, 2 same socket, 3 elsewhere, 4 not placed),
 * "file" (rdma_topology), "numa" (NUMA distances; a GPU the PCIe tree lacks ranks as its
 * node) or "equal". GPUs are listed once the CUDA driver is loaded in the process. "" for
 * an engine without RDMA. OTE_OK with *len_out the text's length (NUL written); cap too
 * small: OTE_ERR_TOO_BIG with *len_out the size needed (NUL included), buf untouched. */
ote_status_t ote_engine_topology(ote_engine_t *engine, char *buf, size_t cap, size_t *len_out);

/* How device memory moved through this engine (docs/gpu.md), counters since
 * creation (the *_now fields are the current state). A request's path shows as the
 * counter it moved: staged (pinned chunks), ipc_copies (CUDA IPC, same host) or
 * direct_requests (GPUDirect RDMA). */
typedef struct {
    uint64_t staged_requests; /* requests with a local device buffer staged here (a piece
                               * a source declined for IPC counts as one more) */
    uint64_t staged_source;   /* peers' pieces on device memory here staged by this source */
    uint64_t ipc_copies;      /* pieces this engine copied by CUDA IPC (ended OK) */
    uint64_t ipc_failed;      /* CUDA IPC copies that failed here */
    uint64_t ipc_exports;     /* allocations described to peers for CUDA IPC (once each) */
    uint64_t ipc_imports;     /* peers' allocations imported (cuIpcOpenMemHandle) */
    uint64_t ipc_imports_now; /* imports open now (cached or in use) */
    uint64_t ipc_in_use_now;  /* imports a copy uses now */
    uint64_t ipc_closed;      /* imports invalidated by close receipts or a peer's death */
    uint64_t direct_requests; /* requests whose local device buffer moved by GPUDirect RDMA */
} ote_gpu_stats_t;
/* OTE_ERR_INVALID for a NULL argument. Never loads the CUDA driver. */
ote_status_t ote_engine_gpu_stats(ote_engine_t *engine, ote_gpu_stats_t *out);

/* ---- memory ------------------------------------------------------------------------
 * Registration makes [addr, addr+len) reachable by remote peers with the given
 * permissions: OTE_PERM_READ lets peers READ from it, OTE_PERM_WRITE lets peers WRITE
 * into it. Local buffers used as the source/destination of this engine's own requests
 * need no registration on TCP. Overlapping registrations are refused with
 * OTE_ERR_EXISTS: each byte has exactly one registration and one set of permissions.
 * Unregister takes the start address given at registration and is refused with
 * OTE_ERR_BUSY while a transfer uses the range: a peer's request at this source, or a
 * request of this engine whose local buffer lies in it. It first waits up to
 * OTE_UNREGISTER_WAIT_MS for such transfers to end, so an OK may follow a status read as
 * PENDING just before; once it answers OK, every request that used the range has its
 * final state and none touches the range again.
 *
 * The range must be there for what peers may do with it, now (checked against the
 * kernel's list of mappings, whatever drivers are loaded): OTE_ERR_INVALID when some byte
 * is not mapped (a hole, a range running into unmapped memory, a freed allocation) or a
 * file mapping runs past its file's end; OTE_ERR_ACCESS when it is mapped without read
 * access for OTE_PERM_READ or write access for OTE_PERM_WRITE (PROT_NONE, read-only).
 * A WARN names the first address found wanting. (A PROT_NONE range while no CUDA driver
 * loads may be device memory: OTE_ERR_NO_DEVICE, below.) With rdma among the transports,
 * memory this process cannot write is OTE_ERR_UNSUPPORTED even for OTE_PERM_READ alone
 * (its memory-window MR is pinned for writing). Unmapping or truncating registered memory
 * before unregistering it is the caller's error.
 *
 * When a peer's transfer uses the range (what a user can rely on):
 *  - The source checks a peer's request as a whole, its entire remote range against one
 *    registration and its permission, before the request's first byte moves (TCP and shm:
 *    on every slice, each of which names its request's range; RDMA: on every grant). A
 *    request that is partly outside a registration, or lacks the permission, is refused
 *    with OTE_ERR_ACCESS on every slice: no byte of it is read or written here.
 *  - The range is pinned once per request, on every transport: from the arrival of the
 *    request's first slice (TCP, shm) or grant (RDMA) until its last byte is served, refused,
 *    or written off by the requester's cancel, or until the requester's connections
 *    close. While that holds, unregister is BUSY: it can succeed between two requests,
 *    never inside one, so a request is either served whole or refused whole
 *    (OTE_ERR_ACCESS, no byte moved).
 *  - Free again: when the requester sees a request COMPLETED (or receives a notification
 *    attached to its batch), the source's last release may still be in flight (RDMA: the
 *    receipt is processed by the source after the requester's completion). Unregister
 *    therefore waits up to OTE_UNREGISTER_WAIT_MS for the pins of the range to drop
 *    before it answers OTE_ERR_BUSY: an unregister on such a signal succeeds. Over RDMA
 *    a notification is delivered only after the source took the completions its CQ
 *    lanes held (the receipts among them), so an unregister on a notification does not
 *    depend on that wait being long enough on a loaded machine.
 *  - A requester that dies releases its pins at once on every transport: TCP when its
 *    connections close; shm when its UNIX socket closes; RDMA when its control connection closes (its windows are
 *    invalidated by moving their QPs to the error state first). Only a requester that
 *    stays connected but stops making progress holds them until transfer_timeout_ms.
 *
 * Memory kinds (docs/gpu.md): the range is host memory, pinned host memory or
 * device memory of one CUDA device (ote_memory_query reports which). Device memory is
 * recognized when the CUDA driver is loaded in the process; a range that is not host
 * memory while no driver loads is refused with OTE_ERR_NO_DEVICE (logged, naming the
 * library tried). A device range must lie within one allocation, else OTE_ERR_INVALID;
 * managed memory is OTE_ERR_UNSUPPORTED. Local buffers of requests may be device memory
 * too, registered or not (moved by the staging path, gpu_paths). A registered device
 * range that a local file request moves by GPUDirect Storage stays registered with
 * cuFile from that request until ote_memory_unregister or ote_engine_destroy
 * (docs/files.md).
 */
#define OTE_UNREGISTER_WAIT_MS 100
#define OTE_PERM_READ 0x1u
#define OTE_PERM_WRITE 0x2u
/* Opt-in to CUDA IPC for a device registration (with READ and/or WRITE, never alone):
 * IPC exposes the WHOLE allocation holding the range to a same-host peer, not just the
 * range, so without this flag the ipc path is never used for the registration. Refused
 * (OTE_ERR_INVALID) on a range that is not device memory. Reported by ote_memory_query;
 * peers' buffer discovery does not list it (their perms stay READ/WRITE). Same-host
 * peers over shm then copy the range by CUDA IPC where gpu_paths allows it on both sides
 * (docs/gpu.md); unregister is OTE_ERR_BUSY while a peer's IPC copy of it runs. */
#define OTE_PERM_IPC 0x4u
ote_status_t ote_memory_register(ote_engine_t *engine, void *addr, size_t len, unsigned perms);
ote_status_t ote_memory_unregister(ote_engine_t *engine, void *addr);

/* The same with a name that peers see in ote_segment_buffers: 1..OTE_NAME_MAX printable
 * ASCII characters (0x20..0x7e), NUL-terminated, else OTE_ERR_INVALID; unique among this
 * engine's live registrations, else OTE_ERR_EXISTS (and nothing is registered).
 * Unregistering frees the name. name NULL registers without a name (as
 * ote_memory_register does). */
#define OTE_NAME_MAX 63
ote_status_t ote_memory_register_named(ote_engine_t *engine, void *addr, size_t len, unsigned perms,
                                       const char *name);

/* Shared host memory (docs/performance.md, "Shared allocations"): len bytes (rounded up to the page size) of
 * zeroed host memory that a same-host peer can map too. Use it for the local buffers of
 * requests to same-host peers: over shm in cross-memory-attach mode the source then maps
 * the allocation once per connection (its memfd travels over the control socket) and
 * copies with memcpy, instead of a process_vm_readv/writev call that pins every page of
 * the buffer each time. Authority is unchanged: the source still checks every request
 * against its own registrations, and copies only the local range each request names.
 * The memory may also be registered (as any host memory) and used with every transport;
 * elsewhere it is plain host memory. OTE_ERR_INVALID for len 0 or addr_out NULL;
 * OTE_ERR_TOO_BIG past the address space; when memfd_create, ftruncate, the seals or
 * mmap fail, their errno as a status (OTE_ERR_NOMEM for ENOMEM, ote_status_errno gives
 * it), with a WARN; OTE_ERR_NOMEM when the engine's table cannot grow. A peer maps at
 * most 64 allocations per connection and 4 TiB per allocation: the others go by
 * cross-memory attach. Pages a peer's READ first touches are charged to that peer's
 * memory cgroup (they belong to the allocation, whichever process faults them). Free it with
 * ote_memory_free_shared only (never munmap/free it yourself: a peer may still map it),
 * after unregistering it and once no request uses it; the engine's destroy frees what
 * is left. */
ote_status_t ote_memory_alloc_shared(ote_engine_t *engine, size_t len, void **addr_out);
/* OTE_ERR_NOT_FOUND when addr is not the start of one of this engine's shared
 * allocations; OTE_ERR_BUSY (nothing freed) while a registration overlaps it. Peers that
 * mapped it are told to unmap it (in order with the requests sent before; should that
 * message find no memory, a WARN, and the peer unmaps it when the connection ends). */
ote_status_t ote_memory_free_shared(ote_engine_t *engine, void *addr);

/* ---- files (docs/files.md) ---------------------------------------------------------
 * A file registration makes bytes [offset, offset + len) of a regular file or block
 * device an endpoint of requests: this engine's local segment (ote_segment_open_local)
 * READs from it into memory and WRITEs memory into it, through the normal batch, status,
 * wait and cancel calls. Give the file by path (fd -1: the engine opens it, read-only
 * for OTE_PERM_READ, read-write with OTE_PERM_WRITE) or by an open fd (path NULL: the
 * engine duplicates it; the caller keeps and closes its own). *addr_out is the
 * registration's address, which requests name as remote_addr (byte offset + i of the
 * range at *addr_out + i); it never overlaps memory. perms: OTE_PERM_READ lets requests
 * READ it, OTE_PERM_WRITE lets them WRITE it (a request without the permission, or not
 * inside one registration, fails OTE_ERR_ACCESS and touches nothing). name as in
 * ote_memory_register_named, unique among file registrations (OTE_ERR_EXISTS).
 * Refused: a path that is neither a regular file nor a block device (a directory, a
 * character device, a FIFO), a range past the file's end, len 0, both or neither of
 * path and fd: OTE_ERR_INVALID, with a WARN; an fd whose open mode does not allow perms
 * (read-only with OTE_PERM_WRITE) or a file the process may not open so: OTE_ERR_ACCESS.
 * I/O (file_engine, file_queue_depth, file_chunk_size, file_sync): io_uring, or a
 * preadv/pwritev thread pool where io_uring is not available (one INFO line); O_DIRECT
 * for each chunk whose file offset, length and memory address are 4 KiB-aligned where
 * the file system takes O_DIRECT, buffered otherwise (ote_transfer_status_ex_t.file_io
 * says which). A WRITE completes once the page cache (O_DIRECT: the device) has its
 * bytes, or with file_sync=data once fdatasync returned. A chunk that finds the file
 * truncated under the registration fails its request with OTE_ERR_IO (errno ENODATA,
 * a WARN); ENOSPC, EIO and other failures of the kernel are OTE_ERR_IO with their errno.
 * Unregister waits up to OTE_UNREGISTER_WAIT_MS for requests using it, then is
 * OTE_ERR_BUSY; OTE_ERR_NOT_FOUND for an address that is not a registration's start.
 * Peers: over tcp, shm and rdma a peer READs and WRITEs a file registration at its
 * address like registered memory, with the same permission checks; the source moves the
 * bytes through bounce buffers, except that over tcp and shm a READ of a range the page
 * cache holds in full is sent from the page cache (file_zero_copy, docs/files.md).
 * ote_segment_buffers lists file registrations (kind OTE_MEM_FILE). */
ote_status_t ote_file_register(ote_engine_t *engine, const char *path, int fd, uint64_t offset,
                               uint64_t len, unsigned perms, const char *name, uint64_t *addr_out);
ote_status_t ote_file_unregister(ote_engine_t *engine, uint64_t addr);
/* The I/O engine file registrations use: "io_uring" or "threads" ("" before the first
 * file registration), NUL-terminated into buf (OTE_ERR_TOO_BIG when len is short). */
ote_status_t ote_file_engine(ote_engine_t *engine, char *buf, size_t len);

/* ---- segments ---------------------------------------------------------------------- */
/* Connect to the engine at "host:port" / "[v6]:port" and handshake. A closed or lost
 * segment can be opened again; a later open reconnects. Failures are peer-scope and come
 * within connect_timeout_ms (each transport tried gets its own): OTE_ERR_CONNECT when
 * nothing listens there or the peer does not complete the handshake in time (errno
 * ETIMEDOUT: a server that accepts and never answers), OTE_ERR_PROTOCOL when it answers
 * with something that is not OrbitTE's handshake, OTE_ERR_VERSION for a protocol version
 * this engine does not speak, OTE_ERR_UNSUPPORTED when the two engines' transports
 * lists have nothing in common that reaches (both lists logged); OTE_ERR_INVALID for a
 * peer that is not "host:port". OTE_ERR_AUTH (logged on both
 * sides) when the two engines do not share a cluster key (auth_key_file): another key, or
 * a key on one side only. A segment, over every transport, is bound to the engine
 * instance it met (its epoch): once that engine is gone and another listens at the same address, the
 * segment's submits fail with OTE_ERR_PEER_LOST (a WARN says the peer restarted) and
 * nothing reaches the new instance; close it and open a new segment, which works at
 * once. */
ote_status_t ote_segment_open(ote_engine_t *engine, const char *peer, ote_segment_t **seg_out);
/* Refused with OTE_ERR_BUSY while a batch has pending requests on it. Notifications
 * still on their way to the peer are waited for (each ends by its deadline); one still
 * attached to an undecided batch makes the close BUSY once that wait runs out. */
ote_status_t ote_segment_close(ote_segment_t *seg);
/* Declare the segment's peer gone (what <ote/naming.h> does when the name a segment was
 * opened by loses its lease or names another incarnation): every request in flight or
 * queued on it ends OTE_ERR_PEER_LOST now, on every transport, without waiting for its
 * deadline or for the peer, and every later submit or notification on it fails
 * OTE_ERR_PEER_LOST at once. For good: close the segment and open a new one. OTE_OK
 * (also when it was invalidated already). Any thread, while the segment is open (not
 * concurrently with its close). On shm a copy the peer process already began into local
 * memory may still land (as after a request's deadline): reuse such buffers only once
 * that peer is known dead or the request was retried elsewhere. */
ote_status_t ote_segment_invalidate(ote_segment_t *seg);
/* A close hook, for libraries that keep a reference to a segment they gave the caller
 * (<ote/naming.h> watches the name of each segment it opened). ote_segment_close calls
 * fn(arg, seg, ev) on the closing thread: OTE_SEGMENT_CLOSING before it touches anything,
 * then OTE_SEGMENT_CLOSE_REFUSED (the close failed: seg stays open) or
 * OTE_SEGMENT_CLOSED (seg is freed: an identity only, never to be dereferenced). From
 * CLOSING until REFUSED the hook's owner must not use seg (not even
 * ote_segment_invalidate); fn must not close seg. One hook per segment: a new call
 * replaces it, fn NULL removes it. Not concurrently with the segment's close. */
typedef enum {
    OTE_SEGMENT_CLOSING = 0,
    OTE_SEGMENT_CLOSE_REFUSED = 1,
    OTE_SEGMENT_CLOSED = 2,
} ote_segment_close_event_t;
typedef void (*ote_segment_close_hook_t)(void *arg, ote_segment_t *seg,
                                         ote_segment_close_event_t ev);
ote_status_t ote_segment_set_close_hook(ote_segment_t *seg, ote_segment_close_hook_t fn, void *arg);
/* A segment to this engine itself whose remote addresses are its file registrations
 * (ote_file_register): READ moves file bytes into local_addr, WRITE moves local_addr's
 * bytes into the file. Its transport is "file" (OTE_TRANSPORT_FILE). Close it with
 * ote_segment_close. */
ote_status_t ote_segment_open_local(ote_engine_t *engine, ote_segment_t **seg_out);

/* What ote_segment_open chose for a segment: the transport (the first of the engine's
 * `transports` list that the peer offers and that reaches it: "shm", "tcp" or "rdma") and
 * the peer's "host:port". */
typedef struct {
    char transport[16];
    char peer[272];
} ote_segment_info_t;
ote_status_t ote_segment_info(ote_segment_t *seg, ote_segment_info_t *info_out);

/* ---- discovery ---------------------------------------------------------------------
 * ote_segment_buffers asks the peer now (one request on a short connection to its
 * listener, whatever transport the segment uses, all within connect_timeout_ms) for its
 * registrations: every live one, named or not (name "" when registered without one),
 * sorted by address; its file registrations too (kind OTE_MEM_FILE, after its memory),
 * from a peer of this version on (engines before it do not list them). Each call asks
 * again: a registration made or removed at the peer
 * is seen by the next call. An address the peer has unregistered since fails in a
 * transfer with OTE_ERR_ACCESS and touches nothing there.
 *
 * cap entries fit in out. OTE_OK: *count_out entries written. OTE_ERR_TOO_BIG: the peer
 * has more than cap; *count_out = how many it listed, out unchanged (call again with
 * that many, the list may have changed meanwhile). A peer with more than
 * OTE_BUFFERS_MAX registrations lists its OTE_BUFFERS_MAX lowest addresses only.
 * Failures: OTE_ERR_CONNECT / OTE_ERR_TIMEOUT / OTE_ERR_PEER_LOST (the peer is gone or
 * did not answer by the deadline), OTE_ERR_UNSUPPORTED (a peer whose engine does not
 * publish its registrations), OTE_ERR_PROTOCOL (a malformed answer), OTE_ERR_AGAIN or
 * OTE_ERR_REMOTE (the peer could not list them). */
#define OTE_BUFFERS_MAX 2048
/* Memory kinds (ote_buffer_info_t.kind, ote_memory_query): host memory, pinned host
 * memory (page-locked by the CUDA driver), or memory of CUDA device N, as the value
 * OTE_MEM_CUDA + N (N < OTE_MEM_CUDA_MAX_DEVICES). */
typedef enum {
    OTE_MEM_HOST = 0,        /* pageable host (CPU) memory */
    OTE_MEM_HOST_PINNED = 1, /* host memory pinned by the CUDA driver (host-addressable) */
    OTE_MEM_FILE = 2,        /* a byte range of a file or block device (ote_file_register) */
    OTE_MEM_CUDA = 16,       /* device memory of CUDA device 0; OTE_MEM_CUDA + N: device N */
} ote_mem_kind_t;
#define OTE_MEM_CUDA_MAX_DEVICES 240
#define OTE_MEM_IS_CUDA(kind) \
    ((kind) >= OTE_MEM_CUDA && (kind) < OTE_MEM_CUDA + OTE_MEM_CUDA_MAX_DEVICES)
#define OTE_MEM_CUDA_DEVICE(kind) ((int)(kind) - (int)OTE_MEM_CUDA)
typedef struct {
    char name[OTE_NAME_MAX + 1]; /* NUL-terminated; "" when registered without a name */
    uint64_t addr;               /* the peer's address: ote_request_t.remote_addr */
    uint64_t length;
    unsigned perms; /* OTE_PERM_READ / OTE_PERM_WRITE (/ OTE_PERM_IPC: ote_memory_query) */
    uint32_t kind;  /* ote_mem_kind_t */
    /* ote_memory_query: the NUMA node of the memory when it was registered (host memory:
     * where its first, middle and last pages were; device memory: its GPU's node), -1 when
     * unknown (pages not yet touched, spread over nodes, no NUMA). The RDMA transport
     * prefers the NICs nearest it. ote_segment_buffers: always -1. */
    int32_t numa_node;
} ote_buffer_info_t;
ote_status_t ote_segment_buffers(ote_segment_t *seg, ote_buffer_info_t *out, size_t cap,
                                 size_t *count_out);
/* A metadata blob of this engine for a side channel (NIXL's get_agent_metadata shape):
 * its address, its incarnation (epoch) and its registrations as ote_segment_buffers
 * lists them (the OTE_BUFFERS_MAX lowest addresses), versioned and checked on decode.
 * Another process opens a segment from it (ote_segment_open_md) or reads the buffers out
 * of it (ote_engine_metadata_buffers) without asking this engine. OTE_ERR_TOO_BIG when
 * cap is short, with *len_out the size needed; OTE_OK with *len_out the size written. */
ote_status_t ote_engine_metadata(ote_engine_t *engine, void *buf, size_t cap, size_t *len_out);
/* The registrations a metadata blob carries, like ote_segment_buffers (OTE_ERR_TOO_BIG
 * with *count_out the number when cap is short); OTE_ERR_PROTOCOL for a malformed blob. */
ote_status_t ote_engine_metadata_buffers(const void *md, size_t len, ote_buffer_info_t *out,
                                         size_t cap, size_t *count_out);
/* The engine name (engine_name) a metadata blob carries, NUL-terminated into name: "" for
 * an unnamed engine's blob. OTE_ERR_TOO_BIG when cap is short (OTE_ENGINE_NAME_MAX + 1
 * always fits), OTE_ERR_PROTOCOL for a malformed blob. */
ote_status_t ote_engine_metadata_name(const void *md, size_t len, char *name, size_t cap);
/* The engine a metadata blob names: its "host:port" (NUL-terminated into addr, cap
 * bytes; OTE_ERR_TOO_BIG when short) and its incarnation (*epoch_out, nonzero), both
 * checked like every other field; OTE_ERR_PROTOCOL for a malformed blob. Outputs are
 * written only on OTE_OK. */
ote_status_t ote_engine_metadata_peer(const void *md, size_t len, char *addr, size_t cap,
                                      uint64_t *epoch_out);
/* ote_segment_open to the engine a metadata blob names, refused with OTE_ERR_STATE (no
 * segment) when the engine at that address now is another incarnation (restarted since
 * the blob was made), OTE_ERR_PROTOCOL for a malformed blob. */
ote_status_t ote_segment_open_md(ote_engine_t *engine, const void *md, size_t len,
                                 ote_segment_t **seg_out);
/* This engine's own registration that contains addr, as a peer would list it (its name,
 * start, length, permissions and memory kind). OTE_ERR_NOT_FOUND when no registration
 * contains addr. */
ote_status_t ote_memory_query(ote_engine_t *engine, const void *addr, ote_buffer_info_t *info_out);
/* The file registration containing addr, kind OTE_MEM_FILE (OTE_ERR_NOT_FOUND). */
ote_status_t ote_file_query(ote_engine_t *engine, uint64_t addr, ote_buffer_info_t *info_out);

/* ---- transfers --------------------------------------------------------------------- */
typedef enum {
    OTE_READ = 0,  /* remote -> local */
    OTE_WRITE = 1, /* local -> remote */
} ote_opcode_t;

typedef struct {
    ote_opcode_t opcode;
    void *local_addr;       /* this process's buffer */
    ote_segment_t *segment; /* the peer */
    uint64_t remote_addr;   /* the peer's virtual address */
    size_t length;          /* bytes; 0 completes at once */
} ote_request_t;

typedef enum {
    OTE_TRANSFER_WAITING = 0, /* slot not yet submitted */
    OTE_TRANSFER_PENDING = 1, /* submitted, in progress */
    OTE_TRANSFER_COMPLETED = 2,
    OTE_TRANSFER_FAILED = 3,
    OTE_TRANSFER_CANCELED = 4,
    OTE_TRANSFER_TIMEOUT = 5,
} ote_transfer_state_t;

typedef struct {
    ote_transfer_state_t state;
    uint64_t bytes_done;
    ote_status_t error; /* OTE_OK unless FAILED/CANCELED/TIMEOUT */
} ote_transfer_status_t;

/* A batch holds up to `capacity` requests. Submissions append; index i names the i-th
 * request submitted since creation or the last reset. */
ote_status_t ote_batch_create(ote_engine_t *engine, size_t capacity, ote_batch_t **batch_out);
/* Validates all n requests first (OTE_ERR_INVALID / OTE_ERR_TOO_BIG and nothing is
 * submitted), then starts them. */
ote_status_t ote_batch_submit(ote_batch_t *batch, const ote_request_t *reqs, size_t n);
/* The same for n requests of one opcode to one segment given as arrays (a KV cache's
 * scattered blocks): request i moves len[i] bytes between local[i] (an address in this
 * process) and remote[i] (the peer's). Validated as a whole like ote_batch_submit, and
 * started as one submission: indices follow the arrays' order. */
ote_status_t ote_batch_submit_v(ote_batch_t *batch, ote_opcode_t opcode, ote_segment_t *segment,
                                const uint64_t *local, const uint64_t *remote, const uint64_t *len,
                                size_t n);
ote_status_t ote_batch_status(ote_batch_t *batch, size_t index, ote_transfer_status_t *status_out);
/* Wait until every submitted request has ended, and the notifications they sent have been
 * acknowledged or failed (ote_batch_notify_result), or timeout_ns passes. Returns OTE_OK
 * when all requests COMPLETED, OTE_ERR_TIMEOUT when some requests or notifications are
 * still pending at the timeout (they go on), else the error of the first request that
 * did not complete.
 *
 * Statuses a request can end with, each request-scope and from its first cause (never
 * from the cleanup that followed it):
 *   OTE_ERR_ACCESS       the peer refused the request as a whole (outside a registration,
 *                        or without the permission); no byte of it moved.
 *   OTE_ERR_PEER_LOST    the peer died or its connection broke (on RDMA also: the queue
 *                        pair to it broke). The request may have moved part of its bytes
 *                        (bytes_done says how many were proven done); retry on a peer
 *                        that is up. Within transfer_timeout_ms of the death, usually at
 *                        once (TCP: when the connection resets; RDMA: within about
 *                        0.5 s over verbs/sim).
 *   OTE_ERR_CANCELED     only after ote_batch_cancel on this batch; never for a peer's
 *                        death or a broken connection.
 *   OTE_ERR_TIMEOUT      transfer_timeout_ms passed (the peer is alive but stuck).
 *   OTE_ERR_FENCED, OTE_ERR_PORT_DOWN, OTE_ERR_NO_DEVICE (RDMA): this engine's own device
 *                        or port failed; never used for a peer's death.
 *   OTE_ERR_REMOTE, OTE_ERR_REMOTE_ACCESS: the peer failed the request for a reason of
 *                        its own (logged there). */
ote_status_t ote_batch_wait(ote_batch_t *batch, uint64_t timeout_ns);
/* Cancel every pending request. Returns at once; in-flight slices end before their
 * request reports CANCELED, and no byte outside the requested ranges is touched.
 * What is stopped, on both transports and for READ and WRITE: every slice not yet on the
 * wire. WRITE: slices not yet handed to the socket (TCP) or not yet posted (RDMA) are
 * never sent. READ: slices whose data the source has not started to send are withdrawn
 * from the source (TCP: a CANCEL frame; the source answers them without data and drops
 * its pins) or never requested (RDMA: grants stop before posting). Slices already on the
 * wire complete. A canceled request ends CANCELED with bytes_done counting the bytes
 * proven moved (it may be COMPLETED if every slice was already on the wire); the source
 * releases a canceled request's pins as soon as its last moving slice ends. */
ote_status_t ote_batch_cancel(ote_batch_t *batch);
/* Forget all finished requests so the batch can be reused; OTE_ERR_BUSY if any pending. */
ote_status_t ote_batch_reset(ote_batch_t *batch);
/* OTE_ERR_BUSY while requests are pending (cancel and wait first). */
ote_status_t ote_batch_destroy(ote_batch_t *batch);

/* ---- statistics ---------------------------------------------------------------------
 * Counters of an engine (ote_engine_stats), of one segment (ote_segment_stats) and the
 * timing of one request (ote_batch_status_ex), read at any time from any thread without
 * stopping anything: the data path counts with relaxed atomics (no lock), so a reading
 * taken while requests run may be a few requests apart between two counters. Counters
 * only grow from the engine's creation; the *_now fields and in-flight figures are the
 * present state.
 *
 * Versioned by size: struct_size comes first and the caller sets it to sizeof of the
 * struct it was built with (zero the rest). The library fills the first
 * min(struct_size, its own size) bytes and writes that size back into struct_size:
 * fields past it were not filled (a library older than the header). OTE_ERR_INVALID for a
 * NULL argument or a struct_size smaller than OTE_STATS_MIN_SIZE. New fields are only
 * ever appended. */
#define OTE_STATS_MIN_SIZE 8u

/* Transports, as an index into ote_engine_stats_t.transport and in
 * ote_transfer_status_ex_t.transport. */
typedef enum {
    OTE_TRANSPORT_SHM = 0,
    OTE_TRANSPORT_TCP = 1,
    OTE_TRANSPORT_RDMA = 2,
    OTE_TRANSPORT_FILE = 3, /* the local segment to file registrations (ote_segment_open_local) */
} ote_transport_id_t;
#define OTE_STATS_TRANSPORTS 4 /* entries of ote_engine_stats_t.transport */

/* The latency histogram: every ended request (whatever its state) by its time from
 * submit to end in whole microseconds u: bucket 0 holds u == 0 (under 1 us), bucket i
 * (1 <= i < 31) holds 2^(i-1) <= u < 2^i, bucket 31 everything from 2^30 us (about 18
 * minutes) up. Every request in buckets 0..i took less than 2^i us (Prometheus' le). */
#define OTE_STATS_LATENCY_BUCKETS 32

/* Requests of this engine (one transport's, or one segment's), by ote_opcode_t where an
 * array has two entries ([OTE_READ], [OTE_WRITE]). Every submitted request ends exactly
 * once, as completed, failed, canceled or timed_out (its ote_transfer_state_t). */
typedef struct {
    uint64_t submitted[2];
    uint64_t completed[2];
    uint64_t failed[2];    /* ended FAILED (e.g. refused by the peer: OTE_ERR_ACCESS) */
    uint64_t canceled[2];  /* ended CANCELED (ote_batch_cancel) */
    uint64_t timed_out[2]; /* ended TIMEOUT (transfer_timeout_ms) */
    /* Bytes moved by ended requests: [OTE_READ] read from peers into this process,
     * [OTE_WRITE] written to peers (bytes_done, so a failed request's proven bytes too). */
    uint64_t bytes[2];
    uint64_t inflight_requests_now;                 /* submitted and not yet ended */
    uint64_t inflight_bytes_now;                    /* their lengths */
    uint64_t latency_ns_sum;                        /* submit to end, summed over ended requests */
    uint64_t latency_us[OTE_STATS_LATENCY_BUCKETS]; /* ended requests (above) */
} ote_request_stats_t;

typedef struct {
    char name[8];       /* "shm", "tcp", "rdma", "file" (the local segment to files) */
    uint32_t enabled;   /* 1: in this engine's transports list (file: 0, never listed) */
    uint64_t peers_now; /* segments open now over this transport */
    ote_request_stats_t requests;
} ote_transport_stats_t;

/* Memory kinds of ote_engine_stats_t's registration arrays. */
#define OTE_STATS_MEM_HOST 0        /* OTE_MEM_HOST */
#define OTE_STATS_MEM_HOST_PINNED 1 /* OTE_MEM_HOST_PINNED */
#define OTE_STATS_MEM_CUDA 2        /* device memory of every CUDA device */
#define OTE_STATS_MEM_KINDS 3

typedef struct {
    size_t struct_size;
    ote_transport_stats_t transport[OTE_STATS_TRANSPORTS]; /* by ote_transport_id_t */
    uint64_t registrations_now;                            /* live registrations */
    uint64_t registered_bytes_now;
    uint64_t registrations_kind_now[OTE_STATS_MEM_KINDS]; /* by OTE_STATS_MEM_* */
    uint64_t registered_bytes_kind_now[OTE_STATS_MEM_KINDS];
    uint64_t registrations_total; /* successful registrations since creation */
    uint64_t notify_sent;         /* notifications sent and acknowledged by their receiver */
    uint64_t notify_send_failed;  /* sent and failed (refused to their deadline, peer lost) */
    uint64_t notify_received;     /* queued here for ote_notify_recv */
    uint64_t notify_refused;      /* refused here: the queue was full (each refusal) */
    /* Connections to this engine whose authentication failed (wrong key, no key, no
     * proof in time), and connections refused unheard by the back-off of a peer address
     * that failed too often (auth_key_file set; 0 without a key). */
    uint64_t auth_failures;
    uint64_t auth_backoff_refused;
    uint64_t auth_open_failures; /* this engine's segment opens that failed with OTE_ERR_AUTH */
    /* Peers' requests to this engine's file registrations (tcp, shm, rdma): bytes of
     * READs sent straight from the page cache (file_zero_copy=auto, the range cached in
     * full), and bytes read from files into bounce buffers (READs, and rdma's WRITEs,
     * whose bounce is read from the file first), counted when the way is chosen
     * (docs/files.md). */
    uint64_t file_read_bytes_mapped;
    uint64_t file_read_bytes_bounced;
} ote_engine_stats_t;
/* The engine's counters, its closed segments' included. */
ote_status_t ote_engine_stats(ote_engine_t *engine, ote_engine_stats_t *out);

typedef struct {
    size_t struct_size;
    char transport[8];     /* the segment's transport (ote_segment_info) */
    uint32_t transport_id; /* ote_transport_id_t */
    char peer[272];
    ote_request_stats_t requests; /* this segment's requests */
    uint64_t notify_sent;         /* notifications to this peer, acknowledged */
    uint64_t notify_send_failed;
} ote_segment_stats_t;
/* The counters of one segment (one peer), since it was opened. */
ote_status_t ote_segment_stats(ote_segment_t *seg, ote_segment_stats_t *out);

/* ote_transfer_status_t with the request's timing: the same state, bytes_done and error,
 * the transport that carries it and CLOCK_MONOTONIC timestamps in nanoseconds (0 when not
 * reached yet: submit_ns of a WAITING slot, end_ns of a PENDING request). end_ns -
 * submit_ns is what the latency histogram counts. Versioned by size like the stats. */
typedef struct {
    size_t struct_size;
    ote_transfer_state_t state;
    ote_status_t error;
    uint64_t bytes_done;
    uint32_t transport; /* ote_transport_id_t (0 for a WAITING slot) */
    uint64_t submit_ns;
    uint64_t end_ns;
    /* A request of the local segment to a file registration: how its bytes moved,
     * OTE_FILE_IO_DIRECT (O_DIRECT) and/or OTE_FILE_IO_BUFFERED (through the page cache),
     * one bit per kind its chunks took; 0 for every other request. A local device buffer:
     * OTE_FILE_IO_GDS for chunks moved by GPUDirect Storage (libcufile), DIRECT/BUFFERED
     * for chunks staged through pinned host memory (ote_gpu_stats_t.staged_requests). */
    uint32_t file_io;
} ote_transfer_status_ex_t;
#define OTE_FILE_IO_DIRECT 1u
#define OTE_FILE_IO_BUFFERED 2u
#define OTE_FILE_IO_GDS 4u
ote_status_t ote_batch_status_ex(ote_batch_t *batch, size_t index,
                                 ote_transfer_status_ex_t *status_out);

/* ---- notifications ----------------------------------------------------------------- */
#define OTE_NOTIFY_MAX 4096
/* Received messages wait in a queue of at most OTE_NOTIFY_QUEUE_MAX messages and
 * OTE_NOTIFY_QUEUE_BYTES message bytes until ote_notify_recv takes them. While it is
 * full, new messages are refused: their senders' ote_notify_send fails with
 * OTE_ERR_AGAIN (retry later), and a batch notification is sent again (after 1 ms,
 * doubling to 50 ms) until room comes or its deadline (transfer_timeout_ms from its first
 * send) passes; then it fails with OTE_ERR_AGAIN, which ote_batch_notify_result reports.
 * No notification is lost silently. */
#define OTE_NOTIFY_QUEUE_MAX 1024
#define OTE_NOTIFY_QUEUE_BYTES (1u << 20)
/* Send a small message (<= OTE_NOTIFY_MAX bytes) to the peer. OTE_ERR_AGAIN when the
 * peer's queue of received messages is full. */
ote_status_t ote_notify_send(ote_engine_t *engine, ote_segment_t *seg, const void *msg, size_t len);
/* Attach a message to a batch: it is sent to seg once every request of the batch that
 * targets seg has COMPLETED, so the peer receives it only after the data is complete in
 * its memory. It is not sent if any of those requests fails or is canceled. The decision
 * is taken when no request of the batch is pending any more: at once when requests were
 * submitted and all have ended, else when the pending (or the next submitted) requests
 * end. A reset keeps undecided notifications; destroy drops them. While attached, the
 * notification holds seg (ote_segment_close is BUSY). */
ote_status_t ote_batch_notify(ote_batch_t *batch, ote_segment_t *seg, const void *msg, size_t len);
/* The outcome of the batch's notifications since creation or the last reset: OTE_OK when
 * every one sent was acknowledged by its receiver; OTE_ERR_AGAIN while one is undecided
 * or in flight; OTE_ERR_CANCELED when one was not sent because a request to its segment
 * did not complete; else the first failure of one sent (OTE_ERR_AGAIN: its receiver's
 * queue stayed full until its deadline; OTE_ERR_PEER_LOST, ...). The data requests keep
 * their own statuses. ote_batch_wait waits for the sent ones to end too, so after it
 * returns (not OTE_ERR_TIMEOUT) this is final. */
ote_status_t ote_batch_notify_result(ote_batch_t *batch, ote_status_t *result_out);
/* Receive the next message sent to this engine, waiting up to timeout_ns. The message is
 * copied into buf (OTE_ERR_TOO_BIG if cap is too small; it stays queued: receive it into
 * a bigger buffer, e.g. OTE_NOTIFY_MAX bytes, or drop it with ote_notify_discard); the
 * sender's address is copied into from (may be NULL). OTE_ERR_TIMEOUT when none arrived. */
ote_status_t ote_notify_recv(ote_engine_t *engine, void *buf, size_t cap, size_t *len_out,
                             char *from, size_t from_len, uint64_t timeout_ns);
/* The longest engine name (config key engine_name), without its NUL. */
#define OTE_ENGINE_NAME_MAX 63
/* ote_notify_recv, and the sender's engine name (its engine_name; "" when it has none or
 * runs an OrbitTE without names) copied into name (may be NULL; OTE_ERR_TOO_BIG, the
 * message staying queued, when name_len is too short: OTE_ENGINE_NAME_MAX + 1 always
 * fits). */
ote_status_t ote_notify_recv_ex(ote_engine_t *engine, void *buf, size_t cap, size_t *len_out,
                                char *from, size_t from_len, char *name, size_t name_len,
                                uint64_t timeout_ns);
/* Every queued message at once, in arrival order, without waiting: as many whole
 * messages as fit both out (cap records) and data (data_cap bytes, the messages back to
 * back: record i's bytes at data + out[i].offset); *count_out how many were taken (0 when
 * none is queued). Call again while it returns cap records or data was too short for the
 * next one; a single message longer than data_cap is OTE_ERR_TOO_BIG (nothing taken). */
typedef struct {
    char from[272];                     /* the sender's "host:port", NUL-terminated */
    size_t offset;                      /* in data */
    size_t len;                         /* message bytes */
    char name[OTE_ENGINE_NAME_MAX + 1]; /* the sender's engine name, "" for none */
} ote_notification_t;
ote_status_t ote_notify_drain(ote_engine_t *engine, ote_notification_t *out, size_t cap, void *data,
                              size_t data_cap, size_t *count_out);
/* Drop the next queued message without waiting (typically the one ote_notify_recv just
 * refused with OTE_ERR_TOO_BIG); its length goes to len_out (may be NULL).
 * OTE_ERR_NOT_FOUND when none is queued. With several threads receiving, the next
 * message may already be another one: discard from the thread that owns the receiving. */
ote_status_t ote_notify_discard(ote_engine_t *engine, size_t *len_out);

#ifdef __cplusplus
}
#endif
#endif

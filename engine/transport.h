/*
 * engine/transport.h - the internal interface between the engine and a transport.
 *
 * The engine owns registrations, batches and requests; a transport owns connections to
 * peers and moves slices. TCP (engine/tcp/), RDMA (engine/rdma/) and shm (engine/shm/)
 * each fill this table
 * in a library of their own (//engine:transport_api is this header): a transport sees
 * this interface, the control plane and the layers it composes, never another
 * transport; only //engine, which composes them, calls ote__tcp_create/ote__rdma_create.
 *
 * Ownership: a slice belongs to the engine. Between submit() and the call of its done
 * function the transport may read it and the memory it names; after calling done() the
 * transport never touches the slice again. done() is called exactly once per submitted
 * slice, from a transport thread or from the submitting thread (when the peer is known
 * to be lost), never with a transport lock held. done() must not block.
 */
#ifndef OTE_ENGINE_TRANSPORT_H
#define OTE_ENGINE_TRANSPORT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <errno.h>
#include <sys/mman.h>

#include "base/status.h"
#include "base/time.h"
#include "engine/hooks.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ote__slice ote__slice_t;

/* With OTE_PERM_READ/WRITE in mem_register's perms: this process can write the whole
 * range (checked at registration), so its MRs may take IBV_ACCESS_LOCAL_WRITE. */
#define OTE__MEM_WRITABLE 0x100u

/* CUDA IPC: what a source hands a same-host requester for one piece on device memory
 * registered with OTE_PERM_IPC (plain data; engine/gpu fills and reads it). */
typedef struct ote__ipc_desc {
    uint8_t handle[64];  /* CUipcMemHandle of the whole allocation */
    uint64_t buffer_id;  /* the exporter's buffer id of the allocation (never reused) */
    uint64_t base, size; /* the allocation in the exporter's address space */
    uint64_t offset;     /* the piece's start within the allocation */
    int32_t device;      /* the exporter's device ordinal */
    uint32_t flags;      /* OTE__IPC_VMM; other bits refused */
} ote__ipc_desc_t;
/* A VMM allocation (cuMemCreate + cuMemMap): handle unused; the allocation's POSIX fd
 * (cuMemExportToShareableHandle) travels with the description (SCM_RIGHTS). */
#define OTE__IPC_VMM 1u
/* Bytes of a slice's transport scratch (ote__slice_t.xp). */
#define OTE__SLICE_SCRATCH 80
/* ote__slice_t.file_io; the same bits as OTE_FILE_IO_* of <ote/ote.h>. */
#define OTE__FILE_IO_DIRECT 1u
#define OTE__FILE_IO_BUFFERED 2u
#define OTE__FILE_IO_GDS 4u
typedef void (*ote__slice_done_fn)(ote__slice_t *s, ote_status_t st);

enum {
    OTE__SLICE_WRITE = 3,  /* == OTE_CTL_WRITE_REQ */
    OTE__SLICE_READ = 5,   /* == OTE_CTL_READ_REQ */
    OTE__SLICE_NOTIFY = 7, /* == OTE_CTL_NOTIFY; local/len is the message */
};

/* The locality of a slice's local memory (s->mem_loc), by which the RDMA transport ranks
 * its devices: NUMA node n (0 <= n < OTE__LOC_GPU0) for host memory, OTE__LOC_GPU(g) for
 * device memory of CUDA device g (g < OTE__LOC_GPUS) that moves as it is (GPUDirect),
 * -1 unknown. */
#define OTE__LOC_GPU0 64
#define OTE__LOC_GPUS 64
#define OTE__LOC_GPU(g) (OTE__LOC_GPU0 + (g))

/* The locality of memory of CUDA device cuda_dev (-1: host memory) whose NUMA node is
 * numa (-1: unknown): its GPU for device memory, else its node; -1 when out of range. */
static inline int ote__mem_loc(int cuda_dev, int numa) {
    if (cuda_dev >= 0) return cuda_dev < OTE__LOC_GPUS ? OTE__LOC_GPU(cuda_dev) : -1;
    return numa >= 0 && numa < OTE__LOC_GPU0 ? numa : -1;
}

/* One unit of transport work: a contiguous piece of one request (or a notification). */
struct ote__slice {
    ote__slice_t *next; /* transport queue link */
    ote__slice_done_fn done;
    void *owner;                 /* the engine's request or notification */
    const _Atomic int *canceled; /* nonzero: skip if not yet on the wire; may be NULL */
    uint8_t *local;
    uint64_t remote;
    /* The whole request this slice belongs to, [req_remote, req_remote + req_len) at the
     * peer (a notification: 0, 0). The source checks and pins that extent, never the
     * slice alone, so a request partly outside a registration moves no byte. */
    uint64_t req_remote, req_len;
    uint64_t req_uid; /* the request's id, unique in this engine (nonzero; 0: a notification) */
    uint32_t len;
    uint16_t op;
    int16_t mem_loc; /* locality of the local memory (OTE__LOC_*), -1: unknown */
    /* Device-path try (engine/batch.c): the local buffer is device memory of this kind
     * (ote_mem_kind_t) and the slice was not staged; the transport may move it only
     * through its own device path (shm: CUDA IPC, ipc_ready; the local segment:
     * GPUDirect Storage, gds_ready), and ends it with OTE_ERR_UNSUPPORTED having touched
     * nothing when that path declines (the engine then stages it). 0 = ipc_try unset:
     * local is host memory. */
    uint8_t ipc_try;
    /* How the file owner moved the slice (engine/file): OTE__FILE_IO_* set before done(),
     * 0 for every other transport (the engine hands it over 0). */
    uint8_t file_io;
    uint32_t local_kind;
    /* The engine's registration that holds the local buffer (pinned by the request until
     * it ends), or NULL when the buffer lies in none: the file owner keeps a device
     * registration's cuFile buffer registration across requests (engine/file/gds.c). */
    const struct ote__pin *local_reg;
    ote_deadline_t deadline;
    /* When the slice ended (CLOCK_MONOTONIC ns), for the request's timing: a transport
     * that ends many slices at once may read the clock once and set this on each before
     * done(); 0 (as the engine hands it over) lets the engine read the clock itself. */
    uint64_t end_ns;
    /* Transport scratch: the submitting transport's own record (its header declares
     * it, checks that it fits and reaches it through one accessor), from submit() until
     * it calls done(); the engine never reads it. */
    union {
        unsigned char xp[OTE__SLICE_SCRATCH];
        uint64_t xp_align_; /* 8-byte aligned, in C and C++ alike */
    };
};

/* A memfd that can be sealed and is not executable, for memory a same-host peer maps (the
 * shm ring, shared allocations): MFD_NOEXEC_SEAL where the kernel knows it (6.3 and later,
 * where vm.memfd_noexec=2 refuses a memfd without it), else without (EINVAL). -1 with
 * errno on failure. */
#ifndef MFD_NOEXEC_SEAL
#define MFD_NOEXEC_SEAL 0x0008U
#endif
static inline int ote__memfd_create(const char *name) {
    int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_NOEXEC_SEAL);
    if (fd < 0 && errno == EINVAL) fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    return fd;
}

/* A shared allocation of the engine (ote_memory_alloc_shared): host->shared_find's
 * answer; fd is the caller's own duplicate of the allocation's memfd (it closes it). */
typedef struct {
    uint64_t id, base, size;
    int fd;
} ote__shared_ref_t;

/* What a transport may read of a pin that host->pin gave (the head of the engine's
 * registration): the memory kind it was classified as at registration (ote_mem_kind_t),
 * the permissions (OTE_PERM_*) it was registered with, its locality (OTE__LOC_*, -1:
 * unknown; ote__mem_loc) and the registration's extent. All set at registration, then
 * read-only. */
typedef struct ote__pin {
    uint32_t kind;
    unsigned perms;
    int loc;
    uint64_t base, len;
} ote__pin_t;

static inline uint32_t ote__pin_kind(const void *pin) { return ((const ote__pin_t *)pin)->kind; }

/* The engine's GPU services (engine/gpu/gpu.h: ote__gpu_services fills them; arg is the
 * engine's ote__gpu_t). A pin here is host->pin's (the engine's, not a transport's
 * account of it); the services check the registration's own path rules (staging in
 * gpu_paths; IPC only for a registration with OTE_PERM_IPC) and refuse with a WARN naming
 * what is missing. Every member is set. */
typedef struct {
    void *arg;
    /* Source side. A transport never touches device memory
     * (OTE_MEM_IS_CUDA) itself: it takes a host bounce buffer of the slice's length
     * (stage_get, waiting for a pinned chunk until dl), copies between it and the device
     * range (stage_copy: to_device 1 after a WRITE's bytes arrived in it, 0 before a
     * READ's bytes are sent from it; synchronous until dl) and gives it back (stage_put,
     * also on every path that drops the slice). A stage_get or stage_copy failure fails
     * that slice with the status. */
    ote_status_t (*stage_get)(void *arg, const ote__pin_t *pin, uint32_t len, ote_deadline_t dl,
                              uint8_t **buf_out, void **tok_out);
    ote_status_t (*stage_copy)(void *arg, void *tok, int to_device, uint64_t dev_addr, uint32_t len,
                               ote_deadline_t dl);
    void (*stage_put)(void *arg, void *tok);
    /* stage_get from the pinned pool only (the RDMA source): OTE_ERR_AGAIN when len fits
     * a chunk and none is free now (never heap, never waits); a larger len is heap. */
    ote_status_t (*stage_pooled)(void *arg, const ote__pin_t *pin, uint32_t len, uint8_t **buf_out,
                                 void **tok_out);
    /* 1 when tok's buffer is a chunk of the pinned pool (the same memory until the
     * engine's destroy, which destroys the transports first): *base_out, *size_out the
     * whole chunk (the RDMA source registers it once per device); 0 for heap memory. */
    int (*stage_chunk)(void *arg, void *tok, uint8_t **base_out, uint64_t *size_out);
    /* stage_copy without waiting (the RDMA source; to_device as there): OTE_OK and
     * done(done_arg, status) runs once later on another thread (the bounce is neither
     * read nor put before), or the failure now (done never runs). See
     * ote__gpu_src_copy_start (engine/gpu/gpu.h). */
    ote_status_t (*stage_copy_start)(void *arg, void *tok, int to_device, uint64_t dev_addr,
                                     uint32_t len, ote_deadline_t dl,
                                     void (*done)(void *, ote_status_t), void *done_arg);
    /* CUDA IPC (engine/gpu, gpu_paths "ipc"). Source side: ipc_export describes the
     * allocation behind the pinned device registration pin for the piece [addr, +len)
     * (exported once per allocation, cached), OTE_ERR_UNSUPPORTED when the registration
     * lacks OTE_PERM_IPC, is not device memory, ipc is not in gpu_paths, or it is VMM
     * memory created without the POSIX-fd handle type. *fd_out: -1, or for a VMM
     * allocation (out->flags OTE__IPC_VMM) an fd that the caller sends with the offer
     * and closes. ipc_copy_start's fd: the one received with a VMM desc (the caller's;
     * it closes it after the call), else -1.
     * Requester side: ipc_usable says whether this engine may take the path now (ipc in
     * gpu_paths and the CUDA driver loaded); ipc_copy_start imports the allocation of
     * desc from `exporter` (a key of the exporting peer) through the engine's bounded
     * cache and enqueues the copy of len bytes between it and local (local_kind: host
     * or device memory), write 1 = local to remote; *op_out is polled with
     * ipc_copy_poll: OTE_ERR_AGAIN while running, OTE_OK when complete (the op is gone),
     * else the request's status (the driver's; OTE_ERR_TIMEOUT when give_up: the deadline
     * passed) and the op stays, its outcome unknown (as a failed ipc_copy_start that set
     * *op_out): ipc_copy_settle answers OTE_ERR_AGAIN until the driver proves the copy
     * complete, then OTE_OK (the op is gone): only then may the source's pin go;
     * abandon (the peer is gone) hands the op to the engine, which retains its stream and
     * mapping until proven complete, and answers OTE_OK.
     * ipc_revoked: the exporter unregistered buffer_id (a close receipt);
     * ipc_exporter_dead: every import of exporter is released (closed once unused). */
    ote_status_t (*ipc_export)(void *arg, const ote__pin_t *pin, uint64_t addr, uint32_t len,
                               ote__ipc_desc_t *out, int *fd_out);
    int (*ipc_usable)(void *arg);
    ote_status_t (*ipc_copy_start)(void *arg, uint64_t exporter, const ote__ipc_desc_t *desc,
                                   int fd, uint8_t *local, uint32_t local_kind, uint32_t len,
                                   int write, void **op_out);
    ote_status_t (*ipc_copy_poll)(void *arg, void *op, int give_up);
    ote_status_t (*ipc_copy_settle)(void *arg, void *op, int abandon);
    void (*ipc_revoked)(void *arg, uint64_t exporter, uint64_t buffer_id);
    void (*ipc_exporter_dead)(void *arg, uint64_t exporter);
    /* Where CUDA device dev is (the RDMA transport's PCIe ranks): its PCI bus id
     * ("dddd:bb:dd.f") in bus[0, cap >= 16) and its NUMA node (-1: unknown) in *node_out;
     * OTE_ERR_NOT_FOUND when no CUDA driver is loaded in this process or it has no such
     * device. */
    ote_status_t (*device_place)(void *arg, int dev, char *bus, size_t cap, int *node_out);
} ote__gpu_ops_t;

/* The engine's file registrations as a source serves them (engine/file; arg is the
 * engine's file owner). A transport that can serve them asks host->pin with
 * OTE__PIN_FILE in perm; only then may the pin be a file registration's (its kind
 * OTE_MEM_FILE), never otherwise, so a transport that cannot serve them never sees one.
 * Like device memory, a transport never touches a file's bytes itself: it takes a host
 * bounce buffer of the slice's length (bounce_get), reads the file range into it before
 * sending (bounce_copy, to_file 0) or writes it to the file once a WRITE's bytes arrived
 * (to_file 1), synchronously or queued (bounce_io_start), with the file owner's O_DIRECT
 * and file_sync rules, and
 * gives it back (bounce_put, on every path). Every member is set. */
#define OTE__PIN_FILE 0x200u /* apart from OTE__MEM_WRITABLE */
typedef struct {
    void *arg;
    ote_status_t (*bounce_get)(void *arg, const ote__pin_t *pin, uint32_t len, uint8_t **buf_out,
                               void **tok_out);
    ote_status_t (*bounce_copy)(void *arg, void *tok, int to_file, uint64_t addr, uint32_t len);
    void (*bounce_put)(void *arg, void *tok);
    /* bounce_copy without waiting (to_file 0: the read into the bounce, 1: the write of
     * it, then its fdatasync when file_sync=data): queued on the file owner's I/O engine
     * (io_uring, or its thread pool) with deadline dl (TIMEOUT when it passes). OTE_OK:
     * done(done_arg, status) runs exactly once later, on the owner's reaper or a pool
     * thread (rarely on the caller's, before this returns); until then the bounce is
     * neither used nor put, and the registration stays in use (unregister is BUSY) even
     * if the caller drops its pin. Any other answer: nothing started, done never runs. */
    ote_status_t (*bounce_io_start)(void *arg, void *tok, int to_file, uint64_t addr, uint32_t len,
                                    ote_deadline_t dl, void (*done)(void *, ote_status_t),
                                    void *done_arg);
    /* 1 when tok's buffer is one the pool keeps (the same memory until the file owner's
     * destroy, which the engine runs after the transports'): *base_out, *size_out the
     * whole buffer (the RDMA source registers it once per device and keeps the MR); 0
     * for a buffer freed when given back. */
    int (*bounce_kept)(void *arg, void *tok, uint8_t **base_out, uint64_t *size_out);
    /* Zero copy for a peer's READ (config file_zero_copy=auto): [addr, +len) of pin's
     * registration, when the page cache holds all of it now and the file still covers it,
     * as bytes of the owner's read-only shared mapping of the file in *ptr_out, valid while
     * the pin is held. Only the kernel may read them (sendmsg, process_vm_writev): a file
     * truncated after this answer fails such a copy with EFAULT, where a load from the
     * mapping would raise SIGBUS. Any other answer (OTE_ERR_AGAIN: not all of it cached;
     * OTE_ERR_UNSUPPORTED: not mapped, file_zero_copy=off): read it through a bounce. */
    ote_status_t (*map_read)(void *arg, const ote__pin_t *pin, uint64_t addr, uint32_t len,
                             const uint8_t **ptr_out);
    /* A kernel copy out of map_read's bytes failed with st: the status its request gets
     * (OTE_ERR_IO, errno ENODATA, with a WARN when the file no longer covers the range, as
     * the bounce path answers a truncated file; st otherwise). */
    ote_status_t (*map_failed)(void *arg, const ote__pin_t *pin, uint64_t addr, uint32_t len,
                               ote_status_t st);
} ote__file_ops_t;

/* Services of the engine that the source side of a transport uses. */
typedef struct {
    void *arg;
    /* Check [addr, addr+len) against the registrations and perms (OTE_PERM_*); on
     * success the registration is pinned (unregister is BUSY) until unpin(*pin_out). */
    ote_status_t (*pin)(void *arg, uint64_t addr, uint64_t len, unsigned perm, void **pin_out);
    void (*unpin)(void *arg, void *pin);
    /* A notification arrived from the peer whose advertised address is `from` and whose
     * engine name (its HELLO's, "" when it sent none) is `name`. OTE_OK when queued;
     * OTE_ERR_AGAIN when the engine's queue is full (or out of memory): the transport
     * answers NOTIFY_ACK with the returned status. */
    ote_status_t (*deliver_notify)(void *arg, const char *from, const char *name, const void *msg,
                                   size_t len);
    /* The engine's advertisement ("transports=...;boot=...;..." text, see engine/router.c)
     * and its advertised "host:port": NUL-terminated, owned by the engine, unchanged until
     * the engine is destroyed. self_addr is filled before any transport is created (the
     * engine's listener names it); info once all its transports exist ("" before that).
     * A transport's source side sends info in its HELLO_ACK. */
    const char *info;
    const char *self_addr;
    /* This engine's name (config key engine_name, "" for none): what the requester side
     * sends in its HELLOs (engine/control/ctl.h, OTE_CTL_MAX_NAME). */
    const char *self_name;
    /* What this engine's log lines name ("name@host:port", or "host:port" without a
     * name): the tag a thread the transport starts itself sets (base/log.h). */
    const char *log_tag;
    /* Ask the engine listening at "host:port" for its advertisement now (a short
     * handshake on its listener, bounded by connect_timeout_ms): how a transport that
     * reaches peers by advertised names (shm) finds a restarted peer again. */
    ote_status_t (*query_info)(void *arg, const char *peer, char *buf, size_t cap);
    /* Buffer discovery: the engine's answer to a BUFS_REQ that arrived on the listener
     * (engine/control/ctl.h): the whole BUFS frame in `version`, echoing req_id, in an
     * allocation the transport ote_free()s once it is sent or dropped. On failure (out of
     * memory) the transport answers BUFS with OTE_ERR_AGAIN itself. */
    ote_status_t (*buffers)(void *arg, uint16_t version, uint64_t req_id, uint8_t **frame_out,
                            size_t *len_out);
    /* The cluster key (engine/control/auth.h), owned by the engine, or NULL: none. With
     * a key every connection a transport accepts proves it before anything it sends is
     * acted on, and every connection it makes proves it and checks the peer's proof. */
    const struct ote_auth_key *auth_key;
    /* A connection the transport adopted (ops->adopt) is closed: called once per adopted
     * connection, from any thread, when the transport frees it. */
    void (*conn_closed)(void *arg);
    /* Device memory (CUDA staging and IPC): the engine's GPU services, their own
     * interface (below), implemented by engine/gpu. */
    ote__gpu_ops_t gpu;
    /* File registrations (ote__file_ops_t above). */
    ote__file_ops_t file;
    /* Requester side: the shared allocation holding all of [addr, +len)
     * (ote__shared_ref_t), or OTE_ERR_NOT_FOUND (fast when the engine has none). */
    ote_status_t (*shared_find)(void *arg, uint64_t addr, uint64_t len, ote__shared_ref_t *out);
    /* How many shared allocations the engine has (read relaxed, without a lock): 0 lets
     * a transport skip shared_find on its hot path. NULL: none ever. */
    const _Atomic size_t *shared_count;
    /* This engine instance's epoch: 64 random bits (nonzero) drawn at ote_engine_create,
     * so that a peer tells a restarted engine at the same address from the one it knew
     * (the RDMA transport sends it in its handshake). */
    uint64_t epoch;
} ote__host_t;

typedef struct ote__transport ote__transport_t;
typedef struct ote__tpeer ote__tpeer_t;

/* One data device of a transport with NICs and its byte counters (ote_engine_nic_stats). */
typedef struct {
    char name[64];
    uint64_t req_bytes; /* bytes of this engine's READ/WRITE slices it carried (ended OK) */
    uint64_t src_bytes; /* bytes of peers' grants it served */
    int active;         /* its port is active */
    uint64_t grants;    /* grant round trips this engine asked of peers on it */
} ote__nic_stat_t;

typedef struct {
    const char *name;
    /* Nonzero: the transport picks devices by the NUMA node of a slice's local memory
     * (s->mem_loc), so the engine looks up that node per request for a local buffer in
     * no registration too (engine/mem_node.c); the others never pay for it. */
    int ranks_by_node;
    ote_status_t (*address)(ote__transport_t *tp, char *buf, size_t len);
    /* Connect and handshake with "host:port". */
    ote_status_t (*peer_open)(ote__transport_t *tp, const char *peer, ote__tpeer_t **peer_out);
    /* Reconnect a peer whose connections were lost; OTE_OK at once when healthy. */
    ote_status_t (*peer_ensure)(ote__tpeer_t *peer);
    /* Largest slice the peer accepts. */
    uint32_t (*peer_max_slice)(ote__tpeer_t *peer);
    /* Start a NULL-terminated list of slices. Never fails: a slice that cannot start
     * is completed through its done() with the reason. */
    void (*submit)(ote__tpeer_t *peer, ote__slice_t *list);
    /* Skip queued slices whose canceled flag is set (promptly, without waiting). Called
     * with no engine lock held: it may complete slices through their done(), the last
     * of which ends its batch. */
    void (*cancel)(ote__tpeer_t *peer);
    /* The peer is known gone (ote_segment_invalidate: a name's lease ended or it names
     * another incarnation now): fail every slice queued or in flight on it with
     * OTE_ERR_PEER_LOST now, through the transport's own path for a lost connection,
     * without waiting on the peer. Any thread, not concurrently with peer_close; once per
     * peer. The engine submits nothing to the peer after it (a submit racing with it
     * fails PEER_LOST too). */
    void (*peer_lost)(ote__tpeer_t *peer);
    /* Close the peer's connections; the peer must have no slices in flight. */
    ote_status_t (*peer_close)(ote__tpeer_t *peer);
    /* Stop every thread of the transport and free it: OTE_OK. Anything else keeps the
     * transport allocated and valid for another destroy only (which retries exactly what
     * is left): OTE_ERR_RETAINED when a native owner (QP, MW, MR, CQ, PD, ...) would not
     * be destroyed, or when one of its threads did not end within its bound (that thread
     * may still use the transport and the host, so the engine keeps both). Called with no
     * engine lock held, after the engine's listener stopped; never concurrently. */
    ote_status_t (*destroy)(ote__transport_t *tp);
    /* Optional (NULL: not needed, as for tcp). Called by ote_memory_register/unregister
     * under the engine's registry lock: the RDMA transport publishes/deregisters the
     * range's MRs here. A failure refuses the (un)registration.
     * perms: OTE_PERM_READ/WRITE, and OTE__MEM_WRITABLE when this process can write the
     * whole range (host memory checked at registration): only then may an MR of it take
     * IBV_ACCESS_LOCAL_WRITE (a NIC pins a read-only mapping for reading only: EFAULT). */
    ote_status_t (*mem_register)(ote__transport_t *tp, void *addr, size_t len, unsigned perms);
    ote_status_t (*mem_unregister)(ote__transport_t *tp, void *addr);
    /* Optional (GPUDirect RDMA, engine/gpu/gpu_direct.c): device memory [addr, +len)
     * published as MRs of bytes [offset, +len) of the dma-buf fd (the caller's; closed
     * by it after this returns), under the same lock and rules as mem_register; its
     * mem_unregister is the same call. */
    ote_status_t (*mem_register_dmabuf)(ote__transport_t *tp, void *addr, size_t len, int fd,
                                        uint64_t offset);
    /* Optional. This transport's own part of the engine's advertisement ("key=value"
     * pairs joined by ';', e.g. the shm transport's control socket), or "". */
    ote_status_t (*advert)(ote__transport_t *tp, char *buf, size_t len);
    /* Optional: used instead of peer_open when set. peer_info is the peer's
     * advertisement (its HELLO_ACK info). OTE_ERR_UNSUPPORTED, logged at INFO and quietly
     * returned, when this transport cannot reach that peer (another host, another
     * namespace, no kernel support): the router then tries the next transport. */
    ote_status_t (*peer_open_info)(ote__transport_t *tp, const char *peer, const char *peer_info,
                                   ote__tpeer_t **peer_out);
    /* Optional: a connection that the engine's one listener (engine/listen.c) accepted
     * for this transport, after the listener applied the back-off and, with a cluster
     * key, authenticated it. fd is non-blocking; hello[0, len) is the HELLO frame it
     * began with, exactly as received (checked by ote_ctl_decode; nothing after it was
     * read). The transport answers the HELLO (versions, HELLO_ACK) and serves the
     * connection from then on. It owns fd whatever it returns (closed on failure); on
     * OTE_OK it calls host->conn_closed once the connection is gone. Any thread, never
     * concurrently with destroy. A transport without it has no listening role (shm). */
    ote_status_t (*adopt)(ote__transport_t *tp, int fd, const char *from, const uint8_t *hello,
                          size_t len);
    /* Optional: the transport's data devices (at most cap) and their counters; returns
     * how many it has. */
    size_t (*nic_stats)(ote__transport_t *tp, ote__nic_stat_t *out, size_t cap);
    /* Optional: the devices it would pick first per GPU and per NUMA node, as text lines
     * (ote_engine_topology), written snprintf-like into buf[0, cap); returns the length
     * of the whole text. */
    size_t (*topology)(ote__transport_t *tp, char *buf, size_t cap);
    /* Optional (shm): whether the peer's connection carries CUDA IPC (both ends allow
     * it); a slice with ipc_try set may then be submitted. */
    int (*ipc_ready)(ote__tpeer_t *peer);
    /* Optional (the local segment, engine/file): whether it moves device memory itself
     * (GPUDirect Storage: libcufile loaded, which the first call tries); a slice with
     * ipc_try set may then be submitted. Never called for host memory. */
    int (*gds_ready)(ote__tpeer_t *peer);
    /* Optional (shm): the device registration [start, +len) was unregistered: peers that
     * imported its allocation are told (close receipts). Called without engine locks. */
    void (*ipc_revoke)(ote__transport_t *tp, uint64_t start, uint64_t len);
    /* Optional: shared allocation id (ote__shared_ref_t) is being freed; any mapping of
     * it the transport gave a peer is to be dropped (engine/shm: an UNMAP entry). */
    void (*shared_free)(ote__transport_t *tp, uint64_t id);
} ote__transport_ops_t;

struct ote__transport {
    const ote__transport_ops_t *ops;
};

/* The TCP transport (engine/tcp/). cfg is the engine's resolved configuration. Neither
 * it nor the RDMA transport listens: connections reach them through ops->adopt. */
struct ote__cfg_s;
ote_status_t ote__tcp_create(const struct ote__cfg_s *cfg, const ote__host_t *host,
                             ote__transport_t **tp_out);
/* The RDMA transport (engine/rdma/): verbs_provider sim|rdma-core. OTE_ERR_NO_DEVICE when
 * no device is usable (never a fallback to tcp). */
ote_status_t ote__rdma_create(const struct ote__cfg_s *cfg, const ote__host_t *host,
                              ote__transport_t **tp_out);
/* The same-host transport (engine/shm/): UNIX-domain control socket, cross-memory attach
 * data path. It has no TCP listener of its own: peers learn its socket from the engine's
 * advertisement. */
ote_status_t ote__shm_create(const struct ote__cfg_s *cfg, const ote__host_t *host,
                             ote__transport_t **tp_out);

#ifdef __cplusplus
}
#endif
#endif

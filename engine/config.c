/*
 * engine/config.c - ote_config_t (public), its resolution into ote__cfg_t, and
 * "host:port" / "[v6]:port" parsing.
 *
 * One table (g_keys) is the configuration: each key's name, its kind (which says how a
 * value is checked, how the check is described when a value is refused, and what the
 * value's numeric form is), its default, and the fields of ote__cfg_t that its resolved
 * value goes to. ote_config_set, ote_config_get, the OTE_<KEY> environment and
 * ote__config_resolve all walk that table, and no key is named outside it. The one rule
 * between keys (transport against transports) runs on the resolved fields afterwards.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/list.h"
#include "base/log.h"
#include "engine/control/ctl.h"
#include "engine/control/sock.h"
#include "engine/engine_internal.h"

/* How a key's value is checked and what its numeric form is (kind_check). */
typedef enum {
    K_STRING,     /* text of at most max characters */
    K_NAME,       /* text of at most max printable ASCII characters (0x20..0x7e), or "" */
    K_UINT,       /* a decimal integer in [min, max] */
    K_SIZE,       /* a size with an optional K/M/G suffix, in [min, max] bytes; number: bytes */
    K_BOOL,       /* "0" or "1"; number: 0 or 1 */
    K_ENUM,       /* one of choices */
    K_ADDR,       /* "host:port" or "[v6]:port" */
    K_ADDR_OPT,   /* an address or "" */
    K_LOGLEVEL,   /* a log level name, or "" */
    K_TRANSPORTS, /* a comma list of 1..3 distinct transports */
    K_GPU_PATHS,  /* a comma list of distinct GPU paths, or ""; number: OTE__GPU_PATH_* mask */
    K_RDMA_PIN,   /* "device:port:gid_index" routes, comma-separated, or "" */
    K_UINT_OPT,   /* "" (number: OTE__CFG_UNSET) or a decimal integer in [min, max] */
    K_MTU         /* "" (number 0) or an IB MTU in bytes; number: its IBV_MTU_* value */
} kind_t;

/* A field of ote__cfg_t: its offset and size; size 0 = no such field. */
typedef struct {
    size_t off, size;
} slot_t;

typedef struct {
    const char *key;
    kind_t kind;
    const char *def;
    uint64_t min, max;      /* K_UINT / K_SIZE; K_STRING: max characters */
    const char *choices[4]; /* K_ENUM */
    slot_t text;            /* a char array that gets the value as text (truncated to fit) */
    slot_t number;          /* a 4- or 8-byte integer that gets the value's numeric form */
} key_def_t;

/* Destinations, checked at compile time: TEXT names a char array, NUMBER a 4- or 8-byte
 * integer (a negative array size stops the build otherwise). */
#define CFG_FIELD(f) (((ote__cfg_t *)0)->f)
#define CFG_CHECK0(cond) (0 * sizeof(char[(cond) ? 1 : -1]))
#define TEXT(f) \
    .text = {offsetof(ote__cfg_t, f), \
             sizeof(CFG_FIELD(f)) + CFG_CHECK0(_Generic(CFG_FIELD(f), char * : 1, default : 0))}
#define NUMBER(f) \
    .number = { \
        offsetof(ote__cfg_t, f), \
        sizeof(CFG_FIELD(f)) + CFG_CHECK0(sizeof(CFG_FIELD(f)) == 4 || sizeof(CFG_FIELD(f)) == 8)}

/* The table is also the configuration reference: the comment right above each entry is
 * that key's documentation, rendered with its values and default into
 * docs/configuration.md by scripts/config_doc.py (CI fails when the two differ, when a key
 * has no comment, or when <ote/ote.h>'s key list and this table disagree). Write it for
 * users; `backticks` and "docs/ section" references are kept as written. */
static const key_def_t g_keys[] = {
    /* Ordered list of distinct transports out of `shm`, `tcp`, `rdma`, in any order and any
     * subset (e.g. `shm,rdma,tcp`, `rdma,tcp`): each segment takes the first one the peer
     * also offers and that reaches it; never one outside the list. `shm` reaches only
     * engines on the same host. */
    {"transports", K_TRANSPORTS, "shm,tcp", TEXT(transports)},
    /* The one-element form of `transports`; setting both to different lists is refused. */
    {"transport", K_ENUM, "", .choices = {"", "tcp", "rdma", "shm"}, TEXT(transport)},
    /* shm data path: `auto` uses cross-memory attach (process_vm_readv/writev) where the
     * kernel allows it, else the shared ring; `ring` always uses the shared ring. */
    {"shm_mode", K_ENUM, "auto", .choices = {"auto", "ring"}, TEXT(shm_mode)},
    /* `host:port` or `[v6]:port` of the engine's one listening socket, shared by every
     * transport (port 0: any free port). A non-loopback address needs `auth_key_file` or
     * `allow_unauthenticated=1`. */
    {"listen_address", K_ADDR, "127.0.0.1:0", TEXT(listen_address)},
    /* This engine's name, sent to every peer it connects to (in the HELLO of its TCP, shm
     * and RDMA connections) and handed to the receiver with each notification it sends,
     * beside its `host:port` (ote_notify_recv_ex, ote_notify_drain, Python
     * `Notification.name`, Mooncake's `TransferNotify.name`); also in the metadata blob
     * (ote_engine_metadata). Empty: no name (receivers see ""). A peer older than
     * OrbitTE's engine names refuses a named engine's HELLO: leave it empty in a cluster
     * that mixes versions (docs/api.md, "Notifications"). */
    {"engine_name", K_NAME, "", 0, 63, TEXT(engine_name)},
    /* Address reported by ote_engine_address() and sent to peers in place of the listen
     * address, whatever that is (a wildcard, or a specific address behind NAT or a
     * container's published port); port 0 means the port listened on. Empty: the listen
     * address, a wildcard host (0.0.0.0, ::) replaced by the loopback of its family. */
    {"advertise_address", K_ADDR_OPT, "", TEXT(advertise_address)},
    /* TCP data connections per peer. */
    {"tcp_connections", K_UINT, "4", 1, 64, NUMBER(tcp_connections)},
    /* TCP transport worker threads (epoll). */
    {"tcp_workers", K_UINT, "2", 1, 64, NUMBER(tcp_workers)},
    /* Connections the listener holds at once (TCP data, RDMA control and handshakes
     * together; the shm socket has its own limit of the same value); more are closed at
     * accept. An accepted connection that owes answers or data must make progress at least
     * every `transfer_timeout_ms`, else it is closed (a WARN names the peer). */
    {"tcp_max_accepted", K_UINT, "1024", 1, 65536, NUMBER(tcp_max_accepted)},
    /* Bytes per slice a request is cut into (the unit of striping and retry). */
    {"slice_size", K_SIZE, "1M", 4096, 32u << 20, NUMBER(slice_size)},
    /* Deadline of every transfer, from submit; a request past it ends OTE_ERR_TIMEOUT. */
    {"transfer_timeout_ms", K_UINT, "30000", 1, 86400000, NUMBER(transfer_timeout_ms)},
    /* Deadline of a connection attempt and its handshake (each transport tried gets its
     * own). */
    {"connect_timeout_ms", K_UINT, "5000", 1, 600000, NUMBER(connect_timeout_ms)},
    /* Deadline, from accept, of the HELLO (and, with a key, the proof) of a connection this
     * engine accepted, on the listener and the shm socket; the smaller of it and
     * `connect_timeout_ms` applies; a connection past it is closed with a rate-limited
     * WARN (docs/security.md). */
    {"handshake_timeout_ms", K_UINT, "5000", 1, 600000, NUMBER(handshake_timeout_ms)},
    /* The verbs provider of the `rdma` transport: `rdma-core` (libibverbs, real devices)
     * or `sim` (OrbitTE's software provider, for tests and machines without a NIC). Empty:
     * `rdma-core`. */
    {"verbs_provider", K_ENUM, "", .choices = {"", "sim", "rdma-core"}, TEXT(verbs_provider)},
    /* `verbs_provider=sim`: the device profile every sim device takes, `mlx5`, `rxe`,
     * `nomw` or `small` (limits, memory windows, scatter-to-CQE; verbs/sim/sim.h). Empty:
     * $OTE_SIM_PROFILE, else `mlx5`. An unknown name fails ote_engine_create. */
    {"sim_profile", K_STRING, "", 0, 15, TEXT(sim_profile)},
    /* One RDMA device to use alone (empty: automatic, every device with an active port). */
    {"rdma_device", K_STRING, "", 0, 63, TEXT(rdma_device)},
    /* Comma-separated device names the RDMA data path may use (empty: every device with
     * an active port). */
    {"rdma_devices", K_STRING, "", 0, 255, TEXT(rdma_devices)},
    /* Comma-separated device names the RDMA data path never uses. */
    {"rdma_exclude", K_STRING, "", 0, 255, TEXT(rdma_exclude)},
    /* A file naming, per GPU and per NUMA node, the RDMA NICs in order of preference
     * (format: engine/rdma/selector/topo_file.h, docs/rdma.md "Which NIC carries a
     * buffer"), for machines whose PCIe tree hwloc reads wrongly; what it names replaces
     * hwloc's ranking (GPUs: the NICs behind the GPU's own PCIe switch first, then the same
     * socket, then the rest; host memory: NUMA distance). Read and checked at
     * ote_engine_create: a bad file fails it with an ERROR naming the line. Empty: hwloc's
     * ranking only (hwloc reads the machine, or the XML file named by $HWLOC_XMLFILE). */
    {"rdma_topology", K_STRING, "", 0, 1023, TEXT(rdma_topology)},
    /* CQ lanes (one worker thread each) per RDMA data device, independent of
     * `tcp_workers`. */
    {"rdma_lanes", K_UINT, "2", 1, 64, NUMBER(rdma_lanes)},
    /* Strict routes `device:port:gid_index` (port 1..255, GID index 0..255: a QP's source
     * GID index is 8 bits), up to 8 distinct devices, comma-separated: exactly those
     * devices carry data, each on that port and GID index, never an automatic choice
     * (overrides `rdma_device` / `rdma_devices`). A device, port or GID index the provider
     * lacks fails ote_engine_create with OTE_ERR_NO_DEVICE and an ERROR line naming what
     * was asked and what exists; malformed text is refused by ote_config_set
     * (OTE_ERR_INVALID). With every pinned port down the transport starts paused. */
    {"rdma_pin", K_RDMA_PIN, "", 0, 255, TEXT(rdma_pin)},
    /* The port of every RDMA device `rdma_pin` does not name. Empty: the first active port
     * with a usable GID. A device without that port, or without a usable GID on it, fails
     * ote_engine_create with an ERROR line naming device and port. Refused beside
     * `rdma_pin` (OTE_ERR_INVALID: the pin opens no other device). */
    {"rdma_port", K_UINT_OPT, "", 1, 255, NUMBER(rdma_port)},
    /* The GID index of every RDMA device `rdma_pin` does not name (Mooncake's
     * MC_GID_INDEX). Empty: ranked per port: an entry whose netdev is up first (sysfs
     * gid_attrs/ndevs and class/net/<netdev>/operstate, "up" or "unknown"), then RoCE v2,
     * then IPv4-mapped over other routable over link-local, lowest index on ties; a port
     * without netdev information (InfiniBand) is ranked by type alone. Set, it is strict
     * like a pin: an index that is empty or past the GID table on every allowed port fails
     * ote_engine_create with an ERROR line naming device, port and index. Refused beside
     * `rdma_pin`. Each device's chosen route (port, GID index, GID, type, netdev and its
     * state, how it was chosen) is logged at INFO when it opens. */
    {"rdma_gid_index", K_UINT_OPT, "", 0, 255, NUMBER(rdma_gid_index)},
    /* GRH traffic class of every RDMA QP's address vector; on RoCE v2 it is the IP
     * header's DSCP << 2 | ECN (DSCP 26: 104), what a lossless fabric classifies on. */
    {"rdma_traffic_class", K_UINT, "0", 0, 255, NUMBER(rdma_traffic_class)},
    /* Service level of every RDMA QP's address vector; on RoCE the priority the NIC maps
     * to a VLAN PCP / lossless traffic class. */
    {"rdma_service_level", K_UINT, "0", 0, 15, NUMBER(rdma_service_level)},
    /* Largest path MTU in bytes. Empty: no clamp. A QP's path MTU is min(the local port's
     * active MTU, the peer's, this); the peer learns the clamped value, so both ends
     * agree. */
    {"rdma_mtu", K_MTU, "", TEXT(rdma_mtu_text), NUMBER(rdma_mtu)},
    /* Where sysfs is mounted, for the GID netdev checks and the devices' NUMA nodes.
     * Empty: /sys. For tests (a fixture tree) and containers that bind-mount the host's
     * /sys elsewhere. */
    {"rdma_sysfs_root", K_STRING, "", 0, 255, TEXT(rdma_sysfs_root)},
    /* Most bytes one RDMA grant covers: contiguous slices of one request on one device up
     * to this size share one GRANT_REQ round trip; a device's window of one peer's bytes
     * in flight is at least this. */
    {"rdma_grant_max", K_SIZE, "16M", 1u << 20, 1u << 30, NUMBER(rdma_grant_max)},
    /* Most bytes of this engine's RDMA requests in flight at once over every peer and
     * device together (0: no limit beyond the per-device windows): a run past it waits in
     * its peer's queue until ending runs make room; runs are cut to it; a lone run always
     * goes. */
    {"rdma_max_inflight", K_SIZE, "0", 0, 1ull << 40, NUMBER(rdma_max_inflight)},
    /* Most grant credits this engine's RDMA requests hold at once over every peer and
     * device (0: no limit): a request reserves its whole budget (the grants it needs at
     * the size of its first run, at most this) before its first GRANT_REQ, all or nothing;
     * each started run holds one slot of it; a request that cannot get its budget waits in
     * its peer's queue (deadline and cancel still end it) and is woken when credits
     * return. */
    {"rdma_max_grants", K_UINT, "0", 0, 65536, NUMBER(rdma_max_grants)},
    /* Most QPs this engine holds over every device, peer and role (0: no limit): a
     * requester QP build past it retires an idle requester QP to make room, else waits; a
     * requester's CONNECT past it retires an idle source QP, else is refused OTE_ERR_AGAIN
     * and that requester asks again; at the limit runs use the peer's QPs that are built. */
    {"rdma_max_qps", K_UINT, "0", 0, 65536, NUMBER(rdma_max_qps)},
    /* Receive slots of each RDMA QP that cannot use the shared receive queue (the direct
     * endpoints' QPs, in PDs of their own; every QP of a device without SRQs), clamped to
     * the device's max_qp_wr with an INFO line. */
    {"rdma_recv_slots", K_UINT, "256", 1, 4096, NUMBER(rdma_recv_slots)},
    /* Receive buffers of each CQ lane's shared receive queue, from which every QP of the
     * device takes its receives (grant receipts), so peers cost no receive buffers of their
     * own. A source serves a grant only with a slot reserved for its receipt, else answers
     * OTE_ERR_AGAIN and the requester asks again. 0: half the lane's receive CQ (e.g.
     * 2048), clamped to the device's max_srq_wr with an INFO line. */
    {"rdma_srq_slots", K_UINT, "0", 0, 1048576, NUMBER(rdma_srq_slots)},
    /* Requesters this engine serves over RDMA at once (their control connections); one
     * more is refused with a WARN naming this key, and its segment open fails
     * (OTE_ERR_PEER_LOST at the requester). */
    {"rdma_max_peers", K_UINT, "4096", 1, 1048576, NUMBER(rdma_max_peers)},
    /* Most send WRs (RDMA WRITE/READ, receipts, window binds) outstanding over every QP of
     * this engine, both roles (0: only each QP's own depth): a post past it waits, retried
     * as sends complete, its deadline and cancel applying. */
    {"rdma_max_send_wrs", K_UINT, "0", 0, 1048576, NUMBER(rdma_max_send_wrs)},
    /* Most grant credits this engine reserves at once, as a source, for its requesters'
     * parents (requests of a requester with `rdma_max_grants`; 0: no limit, credits only
     * counted): a budget past it is refused OTE_ERR_TOO_BIG; a parent never has more grants
     * live than its credits. */
    {"rdma_max_served_grants", K_UINT, "0", 0, 65536, NUMBER(rdma_max_served_grants)},
    /* How this engine, as an RDMA source, lets a peer reach its host memory: `mw` a type-2
     * memory window bound over exactly the granted range, `mr` an MR registered for the
     * grant over exactly that range in a PD only the requester's QP reaches (no cache: one
     * registration per grant, deregistered at its end), `auto` windows when every data
     * device has them, else `mr`. `mw` on a device without windows fails ote_engine_create
     * (OTE_ERR_UNSUPPORTED, an ERROR naming the key and the device). Either way the peer
     * reaches exactly the granted bytes, and nothing after the grant's receipt. */
    {"rdma_grant_mode", K_ENUM, "auto", .choices = {"auto", "mw", "mr"}, TEXT(rdma_grant_mode)},
    /* `error`, `warn`, `info`, `debug` or `trace` (empty: leave the level as it is; `warn`
     * unless `OTE_LOG_LEVEL` says otherwise). Process-wide, not per engine: creating an
     * engine with this key sets the level of every engine of the process, and of the lines
     * written outside any engine, until another engine or `ote_log_set_level` changes it.
     * A WARN that an event can repeat per slice or per grant is logged at most once a
     * second per kind, the next line saying how many were swallowed. Where lines go (stderr
     * or a callback) and their format: `<ote/log.h>`, docs/api.md. */
    {"log_level", K_LOGLEVEL, "", TEXT(log_level)},
    /* Path of the cluster key: a regular file of 32..4096 raw bytes (e.g. `head -c 32
     * /dev/urandom`) that group and others can neither read nor write (a symlink to one is
     * followed, as Kubernetes mounts secrets). Every connection to this engine then proves
     * the key, and this engine proves it to every peer; a peer without the same key fails
     * with OTE_ERR_AUTH. ote_engine_create fails at once, with an ERROR line, for a missing
     * file (OTE_ERR_NOT_FOUND), one that is not a regular file or is open to group or
     * others (OTE_ERR_ACCESS), or one of the wrong size (OTE_ERR_INVALID). Empty: no key,
     * and only a loopback `listen_address` unless `allow_unauthenticated=1`. */
    {"auth_key_file", K_STRING, "", 0, 255, TEXT(auth_key_file)},
    /* `1` lets an engine without a key listen on a non-loopback address (logged at WARN);
     * otherwise ote_engine_create refuses it with OTE_ERR_INVALID. */
    {"allow_unauthenticated", K_BOOL, "0", NUMBER(allow_unauthenticated)},
    /* The paths device memory may take: a comma list of `staging` (pinned host chunks),
     * `ipc` (CUDA IPC over an shm segment, both ends allowing it, the remote range
     * registered with OTE_PERM_IPC) and `direct` (GPUDirect RDMA: dma-buf MRs, over an
     * `rdma` segment), or empty for none. A request on local device memory with no possible
     * path fails at submit (OTE_ERR_UNSUPPORTED, a WARN naming what is missing). */
    {"gpu_paths", K_GPU_PATHS, "staging", TEXT(gpu_paths_text), NUMBER(gpu_paths)},
    /* Bytes of one pinned staging chunk: a staged request is cut into slices of at most
     * this size; over RDMA a request the source serves staged is cut into grants of this
     * size. */
    {"gpu_staging_chunk", K_SIZE, "2M", 64u << 10, 64u << 20, NUMBER(gpu_staging_chunk)},
    /* Staging chunks in flight per request; each device's pool has 4 x this many chunks;
     * over RDMA the staged grants in flight per device toward one peer. */
    {"gpu_staging_depth", K_UINT, "4", 1, 64, NUMBER(gpu_staging_depth)},
    /* `1`: ote_memory_register of pageable host memory advises the kernel to back the
     * range's interior aligned to 2 MiB with transparent huge pages (MADV_HUGEPAGE, then
     * MADV_COLLAPSE on Linux >= 6.1), best effort (a failure is logged once per engine and
     * the registration goes on). It changes the application's memory (its mapping becomes
     * THP-advised; registering a large touched buffer costs about one copy of it), hence
     * opt-in; memory already on huge pages needs no key. */
    {"register_thp", K_BOOL, "0", NUMBER(register_thp)},
    /* How file registrations (ote_file_register, docs/files.md) move their bytes: `uring`
     * (io_uring, liburing; refused at the first registration when the kernel has none),
     * `threads` (a pool of preadv/pwritev threads) or `auto` (io_uring where
     * io_uring_queue_init succeeds, else the thread pool with one INFO line saying why). */
    {"file_engine", K_ENUM, "auto", .choices = {"auto", "uring", "threads"}, TEXT(file_engine)},
    /* File I/O operations in flight per engine: the io_uring's queue depth (each one is a
     * chunk), or the thread pool's threads (at most 16 of them). */
    {"file_queue_depth", K_UINT, "32", 1, 4096, NUMBER(file_queue_depth)},
    /* Bytes of one file I/O operation: a request to a file registration is cut into chunks
     * of this size (a multiple of 4 KiB keeps aligned requests aligned for O_DIRECT). */
    {"file_chunk_size", K_SIZE, "1M", 4u << 10, 64u << 20, NUMBER(file_chunk_size)},
    /* When a WRITE to a file registration completes: `none` once the page cache (or, with
     * O_DIRECT, the device) has its bytes; `data` only after fdatasync of the file
     * returned, so that the bytes survive a crash. */
    {"file_sync", K_ENUM, "none", .choices = {"none", "data"}, TEXT(file_sync)},
    /* How a peer's READ of a file registration leaves this engine (tcp, shm): `auto` sends
     * a range the page cache holds in full straight from the page cache (the file mapped
     * read-only; one copy fewer) and reads any other range into a bounce buffer first;
     * `off` reads every range into a bounce buffer (O_DIRECT where aligned). */
    {"file_zero_copy", K_ENUM, "auto", .choices = {"auto", "off"}, TEXT(file_zero_copy)},
};
#define NKEYS (sizeof(g_keys) / sizeof(g_keys[0]))

/* The lists' names; a name's index is its bit in the mask (OTE__GPU_PATH_* for gpu_paths). */
static const char *const g_transport_names[] = {"tcp", "rdma", "shm"};
static const char *const g_gpu_path_names[] = {"staging", "ipc", "direct"};
static const char *const g_bool_choices[4] = {"0", "1"};

struct ote_config {
    char *values[NKEYS]; /* NULL = not set */
};

static int key_index(const char *key) {
    if (key == NULL) return -1;
    for (size_t i = 0; i < NKEYS; i++)
        if (strcmp(g_keys[i].key, key) == 0) return (int)i;
    return -1;
}

const char *ote__config_key(size_t i) { return i < NKEYS ? g_keys[i].key : NULL; }

ote_status_t ote__parse_size(const char *s, uint64_t *out) {
    if (s == NULL || out == NULL || !isdigit((unsigned char)s[0])) return OTE_ERR_INVALID;
    errno = 0;
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0) return OTE_ERR_INVALID;
    uint64_t mul = 1;
    if (*end != '\0') {
        switch (*end) {
            case 'k':
            case 'K': mul = 1ull << 10; break;
            case 'm':
            case 'M': mul = 1ull << 20; break;
            case 'g':
            case 'G': mul = 1ull << 30; break;
            default: return OTE_ERR_INVALID;
        }
        end++;
        if (*end == 'i' || *end == 'B' || *end == 'b')
            end += (*end == 'i' && (end[1] == 'B' || end[1] == 'b')) ? 2 : 1;
        if (*end != '\0') return OTE_ERR_INVALID;
    }
    if (v > UINT64_MAX / mul) return OTE_ERR_INVALID;
    *out = (uint64_t)v * mul;
    return OTE_OK;
}

ote_status_t ote__addr_split(const char *s, char *host, size_t host_len, uint16_t *port_out,
                             int *is_v6_out) {
    if (s == NULL || host == NULL || port_out == NULL || host_len == 0) return OTE_ERR_INVALID;
    const char *h, *hend, *colon;
    int v6 = 0;
    if (s[0] == '[') {
        h = s + 1;
        hend = strchr(h, ']');
        if (hend == NULL || hend[1] != ':') return OTE_ERR_INVALID;
        colon = hend + 1;
        v6 = 1;
    } else {
        colon = strrchr(s, ':');
        if (colon == NULL) return OTE_ERR_INVALID;
        if (memchr(s, ':', (size_t)(colon - s)) != NULL)
            return OTE_ERR_INVALID; /* unbracketed v6 */
        h = s;
        hend = colon;
    }
    size_t hl = (size_t)(hend - h);
    if (hl == 0 || hl >= host_len || hl > 255) return OTE_ERR_INVALID;
    const char *p = colon + 1;
    if (*p == '\0' || strlen(p) > 5) return OTE_ERR_INVALID;
    unsigned long port = 0;
    for (const char *q = p; *q; q++) {
        if (!isdigit((unsigned char)*q)) return OTE_ERR_INVALID;
        port = port * 10 + (unsigned long)(*q - '0');
    }
    if (port > 65535) return OTE_ERR_INVALID;
    if (v6) {
        char tmp[256];
        memcpy(tmp, h, hl);
        tmp[hl] = '\0';
        char *pct = strchr(tmp, '%'); /* scope id: validate the address part only */
        if (pct) *pct = '\0';
        struct in6_addr a6;
        if (inet_pton(AF_INET6, tmp, &a6) != 1) return OTE_ERR_INVALID;
    } else {
        for (size_t i = 0; i < hl; i++) {
            unsigned char c = (unsigned char)h[i];
            if (!(isalnum(c) || c == '.' || c == '-' || c == '_')) return OTE_ERR_INVALID;
        }
    }
    memcpy(host, h, hl);
    host[hl] = '\0';
    *port_out = (uint16_t)port;
    if (is_v6_out) *is_v6_out = v6;
    return OTE_OK;
}

ote_status_t ote__addr_dial(const char *s, ote_deadline_t dl, const char *component, int *fd_out) {
    struct sockaddr_storage ss;
    socklen_t sl;
    ote_status_t st = ote__addr_resolve(s, &ss, &sl);
    if (st != OTE_OK) return st;
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        int err = errno;
        OTE_WARN(component, "socket() for %s failed: %s", s, strerror(err));
        return ote_status_make(OTE_ERR_CONNECT, err);
    }
    st = ote_ctl_connect(fd, (struct sockaddr *)&ss, sl, dl);
    if (st != OTE_OK) {
        OTE_WARN(component, "connect to %s failed: %s", s,
                 st == OTE_ERR_TIMEOUT ? "timed out (connect_timeout_ms)"
                                       : strerror(ote_status_errno(st)));
        close(fd);
        return st;
    }
    *fd_out = fd;
    return OTE_OK;
}

ote_status_t ote__addr_resolve(const char *s, struct sockaddr_storage *ss, socklen_t *len_out) {
    char host[256];
    uint16_t port;
    int v6;
    ote_status_t st = ote__addr_split(s, host, sizeof(host), &port, &v6);
    if (st != OTE_OK) return st;
    struct sockaddr_storage tmp;
    memset(&tmp, 0, sizeof(tmp));
    if (!v6) {
        struct sockaddr_in *a = (struct sockaddr_in *)&tmp;
        if (inet_pton(AF_INET, host, &a->sin_addr) == 1) {
            a->sin_family = AF_INET;
            a->sin_port = htons(port);
            *ss = tmp;
            *len_out = sizeof(*a);
            return OTE_OK;
        }
    }
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = v6 ? AF_INET6 : AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV | (v6 ? AI_NUMERICHOST : 0);
    char ps[8];
    snprintf(ps, sizeof(ps), "%u", port);
    int rc = getaddrinfo(host, ps, &hints, &res);
    if (rc != 0 || res == NULL) {
        OTE_WARN("engine", "cannot resolve \"%s\": %s", s, gai_strerror(rc));
        if (res) freeaddrinfo(res);
        return OTE_ERR_NOT_FOUND;
    }
    memcpy(&tmp, res->ai_addr, res->ai_addrlen);
    *len_out = res->ai_addrlen;
    freeaddrinfo(res);
    *ss = tmp;
    return OTE_OK;
}

ote_status_t ote__addr_format(const struct sockaddr *sa, char *buf, size_t len) {
    if (sa == NULL || buf == NULL) return OTE_ERR_INVALID;
    char h[INET6_ADDRSTRLEN];
    int n;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
        if (!inet_ntop(AF_INET, &a->sin_addr, h, sizeof(h))) return OTE_ERR_INVALID;
        n = snprintf(buf, len, "%s:%u", h, ntohs(a->sin_port));
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
        if (!inet_ntop(AF_INET6, &a->sin6_addr, h, sizeof(h))) return OTE_ERR_INVALID;
        n = snprintf(buf, len, "[%s]:%u", h, ntohs(a->sin6_port));
    } else {
        return OTE_ERR_INVALID;
    }
    if (n < 0 || (size_t)n >= len) return OTE_ERR_TOO_BIG;
    return OTE_OK;
}

/* A decimal number of 1..digits digits, at most max; *pp moves past it. */
static int parse_dec(const char **pp, unsigned digits, unsigned long max, unsigned long *out) {
    const char *p = *pp;
    unsigned long v = 0;
    unsigned n = 0;
    while (isdigit((unsigned char)*p) && n < digits) {
        v = v * 10 + (unsigned long)(*p++ - '0');
        n++;
    }
    if (n == 0 || isdigit((unsigned char)*p) || v > max) return -1;
    *pp = p;
    *out = v;
    return 0;
}

/* One rdma_pin item "device:port:gid_index" of len bytes into *pin. */
static ote_status_t parse_pin(const char *p, size_t len, ote__rdma_pin_t *pin) {
    const char *end = p + len;
    const char *colon = memchr(p, ':', len);
    if (colon == NULL) return OTE_ERR_INVALID;
    size_t dl = (size_t)(colon - p);
    if (dl == 0 || dl >= sizeof(pin->device)) return OTE_ERR_INVALID;
    for (size_t i = 0; i < dl; i++)
        if (!isgraph((unsigned char)p[i])) return OTE_ERR_INVALID;
    const char *q = colon + 1;
    unsigned long port, gid;
    if (parse_dec(&q, 3, 255, &port) != 0 || port == 0 || *q++ != ':') return OTE_ERR_INVALID;
    if (parse_dec(&q, 3, 255, &gid) != 0 || q != end)
        return OTE_ERR_INVALID; /* sgid_index: 8 bits */
    memcpy(pin->device, p, dl);
    pin->device[dl] = '\0';
    pin->port = (uint8_t)port;
    pin->gid_index = (int)gid;
    return OTE_OK;
}

ote_status_t ote__rdma_pin_parse(const char *text, ote__rdma_pin_t *pins, size_t *n_out) {
    if (text == NULL || pins == NULL || n_out == NULL || strlen(text) > 255) return OTE_ERR_INVALID;
    size_t n = 0;
    ote_list_iter_t it = ote_list_iter(text, ',');
    const char *item;
    size_t len;
    while (ote_list_next(&it, &item, &len)) { /* "a:1:0," has an empty, malformed last item */
        if (n == OTE__RDMA_PIN_MAX || parse_pin(item, len, &pins[n]) != OTE_OK)
            return OTE_ERR_INVALID;
        for (size_t i = 0; i < n; i++)
            if (strcmp(pins[i].device, pins[n].device) == 0) return OTE_ERR_INVALID;
        n++;
    }
    *n_out = n;
    return OTE_OK;
}

/* K_UINT: 1..19 decimal digits, nothing else. */
static ote_status_t parse_uint(const char *v, uint64_t *out) {
    size_t l = strlen(v);
    if (l == 0 || l > 19) return OTE_ERR_INVALID;
    for (const char *p = v; *p; p++)
        if (!isdigit((unsigned char)*p)) return OTE_ERR_INVALID;
    *out = strtoull(v, NULL, 10);
    return OTE_OK;
}

/* engine_name: the key's bound, the HELLO's (ctl.h) and the public one are the same. */
_Static_assert(OTE__ENGINE_NAME_LEN == OTE_CTL_MAX_NAME + 1 &&
                   OTE__ENGINE_NAME_LEN == OTE_ENGINE_NAME_MAX + 1,
               "engine_name bounds agree");

/* K_NAME: at most max characters, each printable ASCII (what the HELLO carries). */
static int name_ok(const char *v, uint64_t max) {
    size_t n = strlen(v);
    if (n > max) return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)v[i] < 0x20 || (unsigned char)v[i] > 0x7e) return 0;
    return 1;
}

/* K_MTU: "" is 0 (no clamp); 256..4096 bytes are IBV_MTU_256 (1) .. IBV_MTU_4096 (5). */
static ote_status_t parse_mtu(const char *v, uint64_t *out) {
    static const char *const sizes[] = {"256", "512", "1024", "2048", "4096"};
    if (v[0] == '\0') {
        *out = 0;
        return OTE_OK;
    }
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        if (strcmp(v, sizes[i]) == 0) {
            *out = i + 1;
            return OTE_OK;
        }
    return OTE_ERR_INVALID;
}

static ote_status_t one_of(const char *const choices[4], const char *v) {
    for (int i = 0; i < 4 && choices[i]; i++)
        if (strcmp(v, choices[i]) == 0) return OTE_OK;
    return OTE_ERR_INVALID;
}

/* Checks v against k's kind and range: OTE_OK with *number_out its numeric form (0 for a
 * text kind), else OTE_ERR_INVALID with *number_out untouched. */
static ote_status_t kind_check(const key_def_t *k, const char *v, uint64_t *number_out) {
    char host[256];
    uint16_t port;
    ote__rdma_pin_t pins[OTE__RDMA_PIN_MAX];
    size_t npins;
    unsigned mask = 0;
    uint64_t n = 0;
    ote_status_t st = OTE_ERR_INVALID;
    switch (k->kind) {
        case K_STRING: st = strlen(v) <= k->max ? OTE_OK : OTE_ERR_INVALID; break;
        case K_NAME: st = name_ok(v, k->max) ? OTE_OK : OTE_ERR_INVALID; break;
        case K_UINT: st = parse_uint(v, &n); break;
        case K_SIZE: st = ote__parse_size(v, &n) == OTE_OK ? OTE_OK : OTE_ERR_INVALID; break;
        case K_BOOL:
            st = one_of(g_bool_choices, v);
            n = strcmp(v, "1") == 0;
            break;
        case K_ENUM: st = one_of(k->choices, v); break;
        case K_ADDR_OPT:
            if (v[0] == '\0') {
                st = OTE_OK;
                break;
            }
            /* fallthrough */
        case K_ADDR: st = ote__addr_split(v, host, sizeof(host), &port, NULL); break;
        case K_LOGLEVEL:
            st = (v[0] == '\0' || ote_log_parse_level(v) >= 0) ? OTE_OK : OTE_ERR_INVALID;
            break;
        case K_TRANSPORTS:
            st = ote_list_match(v, g_transport_names, 3, &mask);
            if (st == OTE_OK && mask == 0) st = OTE_ERR_INVALID; /* "": none */
            break;
        case K_GPU_PATHS:
            st = ote_list_match(v, g_gpu_path_names, 3, &mask);
            n = mask;
            break;
        case K_RDMA_PIN: st = ote__rdma_pin_parse(v, pins, &npins); break;
        case K_UINT_OPT:
            if (v[0] == '\0') {
                st = OTE_OK;
                n = OTE__CFG_UNSET;
            } else {
                st = parse_uint(v, &n);
            }
            break;
        case K_MTU: st = parse_mtu(v, &n); break;
    }
    if (st == OTE_OK && (k->kind == K_UINT || k->kind == K_SIZE || k->kind == K_UINT_OPT) &&
        !(k->kind == K_UINT_OPT && v[0] == '\0') && (n < k->min || n > k->max))
        st = OTE_ERR_INVALID;
    if (st != OTE_OK) return OTE_ERR_INVALID;
    *number_out = n;
    return OTE_OK;
}

static void describe_allowed(const key_def_t *k, char *buf, size_t len) {
    switch (k->kind) {
        case K_ENUM:
        case K_BOOL: {
            const char *const *choices = k->kind == K_BOOL ? g_bool_choices : k->choices;
            size_t o = (size_t)snprintf(buf, len, "one of");
            for (int i = 0; i < 4 && choices[i] && o < len; i++)
                o += (size_t)snprintf(buf + o, len - o, " \"%s\"", choices[i]);
            break;
        }
        case K_ADDR:
        case K_ADDR_OPT: snprintf(buf, len, "\"host:port\" or \"[v6]:port\""); break;
        case K_UINT:
            snprintf(buf, len, "an integer in [%llu, %llu]", (unsigned long long)k->min,
                     (unsigned long long)k->max);
            break;
        case K_UINT_OPT:
            snprintf(buf, len, "an integer in [%llu, %llu], or \"\" (automatic)",
                     (unsigned long long)k->min, (unsigned long long)k->max);
            break;
        case K_MTU:
            snprintf(buf, len, "256, 512, 1024, 2048 or 4096 (bytes), or \"\" (none)");
            break;
        case K_SIZE:
            snprintf(buf, len, "a size (K/M/G suffix) in [%llu, %llu] bytes",
                     (unsigned long long)k->min, (unsigned long long)k->max);
            break;
        case K_LOGLEVEL: snprintf(buf, len, "error, warn, info, debug or trace"); break;
        case K_TRANSPORTS:
            snprintf(buf, len, "a comma list of distinct tcp, rdma, shm (e.g. \"shm,tcp\")");
            break;
        case K_GPU_PATHS:
            snprintf(buf, len, "a comma list of distinct staging, ipc, direct, or \"\"");
            break;
        case K_RDMA_PIN:
            snprintf(buf, len,
                     "\"device:port:gid_index\" (port 1..255, GID index 0..255), up to %d "
                     "distinct devices comma-separated, or \"\"",
                     OTE__RDMA_PIN_MAX);
            break;
        case K_NAME:
            snprintf(buf, len, "at most %llu printable ASCII characters (0x20..0x7e), or \"\"",
                     (unsigned long long)k->max);
            break;
        default: snprintf(buf, len, "at most %llu characters", (unsigned long long)k->max);
    }
}

/* The WARN of a refused ote_config_set (src NULL) or the ERROR of a refused resolution. */
static void log_invalid(const key_def_t *k, const char *v, const char *src) {
    char allowed[160];
    describe_allowed(k, allowed, sizeof(allowed));
    if (src == NULL)
        OTE_WARN("engine", "config: invalid %s=\"%s\": expected %s", k->key, v, allowed);
    else
        OTE_ERROR("engine", "config: invalid %s=\"%s\" (from %s): expected %s", k->key, v, src,
                  allowed);
}

ote_status_t ote_config_create(ote_config_t **cfg_out) {
    if (cfg_out == NULL) return OTE_ERR_INVALID;
    ote_config_t *c = ote_calloc(1, sizeof(*c));
    if (c == NULL) return OTE_ERR_NOMEM;
    *cfg_out = c;
    return OTE_OK;
}

void ote_config_destroy(ote_config_t *cfg) {
    if (cfg == NULL) return;
    for (size_t i = 0; i < NKEYS; i++) ote_free(cfg->values[i]);
    ote_free(cfg);
}

ote_status_t ote_config_set(ote_config_t *cfg, const char *key, const char *value) {
    if (cfg == NULL || key == NULL || value == NULL) return OTE_ERR_INVALID;
    int i = key_index(key);
    if (i < 0) {
        OTE_WARN("engine", "config: unknown key \"%s\"", key);
        return OTE_ERR_NOT_FOUND;
    }
    uint64_t number;
    if (kind_check(&g_keys[i], value, &number) != OTE_OK) {
        log_invalid(&g_keys[i], value, NULL);
        return OTE_ERR_INVALID;
    }
    char *dup = ote_strdup(value);
    if (dup == NULL) return OTE_ERR_NOMEM;
    ote_free(cfg->values[i]);
    cfg->values[i] = dup;
    return OTE_OK;
}

/* Effective value and where it came from. */
static const char *effective(const ote_config_t *cfg, size_t i, const char **src) {
    if (cfg != NULL && cfg->values[i] != NULL) {
        *src = "ote_config_set";
        return cfg->values[i];
    }
    char env[64] = "OTE_";
    size_t n = 4;
    for (const char *p = g_keys[i].key; *p && n + 1 < sizeof(env); p++)
        env[n++] = (char)toupper((unsigned char)*p);
    env[n] = '\0';
    const char *v = getenv(env);
    if (v != NULL) {
        *src = "environment";
        return v;
    }
    *src = "default";
    return g_keys[i].def;
}

ote_status_t ote_config_get(const ote_config_t *cfg, const char *key, char *buf, size_t len) {
    if (key == NULL || buf == NULL || len == 0) return OTE_ERR_INVALID;
    int i = key_index(key);
    if (i < 0) return OTE_ERR_NOT_FOUND;
    const char *src;
    const char *v = effective(cfg, (size_t)i, &src);
    size_t vl = strlen(v);
    if (vl >= len) return OTE_ERR_TOO_BIG;
    memcpy(buf, v, vl + 1);
    return OTE_OK;
}

static void copy_str(char *dst, size_t cap, const char *src) {
    size_t n = strlen(src);
    if (n >= cap) n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* Puts a checked value where k says: its text, its numeric form. */
static void store(const key_def_t *k, const char *v, uint64_t number, ote__cfg_t *r) {
    char *base = (char *)r;
    if (k->text.size != 0) copy_str(base + k->text.off, k->text.size, v);
    if (k->number.size == sizeof(uint64_t)) {
        memcpy(base + k->number.off, &number, sizeof(number));
    } else if (k->number.size == sizeof(uint32_t)) {
        uint32_t n32 = (uint32_t)number;
        memcpy(base + k->number.off, &n32, sizeof(n32));
    }
}

/* The rules between keys, once each key is resolved on its own. transport (one element)
 * counts when transports was left at its default; setting both to different lists is
 * refused rather than guessed. transport is then the first of transports. */
static ote_status_t resolve_transports(ote__cfg_t *r, int transports_set) {
    if (r->transport[0] != '\0') {
        if (transports_set && strcmp(r->transport, r->transports) != 0) {
            OTE_ERROR("engine", "config: transport=%s and transports=%s disagree: set one of them",
                      r->transport, r->transports);
            return OTE_ERR_INVALID;
        }
        copy_str(r->transports, sizeof(r->transports), r->transport);
    }
    ote_list_iter_t it = ote_list_iter(r->transports, ',');
    const char *first = "";
    size_t fl = 0;
    (void)ote_list_next(&it, &first, &fl); /* checked: one item at least */
    memcpy(r->transport, first, fl);
    r->transport[fl] = '\0';
    return OTE_OK;
}

ote_status_t ote__config_resolve(const ote_config_t *cfg, ote__cfg_t *out) {
    if (out == NULL) return OTE_ERR_INVALID;
    ote__cfg_t r;
    memset(&r, 0, sizeof(r));
    int transports_set = 0;
    for (size_t i = 0; i < NKEYS; i++) {
        const char *src;
        const char *v = effective(cfg, i, &src);
        uint64_t number = 0;
        if (kind_check(&g_keys[i], v, &number) != OTE_OK || strlen(v) >= OTE__ADDR_MAX) {
            log_invalid(&g_keys[i], v, src);
            return OTE_ERR_INVALID;
        }
        store(&g_keys[i], v, number, &r);
        if (g_keys[i].kind == K_TRANSPORTS) transports_set = strcmp(src, "default") != 0;
    }
    if (r.slice_size > OTE_CTL_MAX_DATA / 2) r.slice_size = OTE_CTL_MAX_DATA / 2;
    ote_status_t st = resolve_transports(&r, transports_set);
    if (st != OTE_OK) return st;
    if (r.rdma_pin[0] != '\0' &&
        (r.rdma_gid_index != OTE__CFG_UNSET || r.rdma_port != OTE__CFG_UNSET)) {
        /* rdma_pin opens exactly its devices, each on its own route: nothing is left for a
         * port or GID index of every device, so one of the two would be ignored. */
        OTE_ERROR("engine",
                  "config: rdma_pin=%s names each device's port and GID index; rdma_port and "
                  "rdma_gid_index route the devices it does not name, and it opens no other: "
                  "set one of them",
                  r.rdma_pin);
        return OTE_ERR_INVALID;
    }
    *out = r;
    return OTE_OK;
}

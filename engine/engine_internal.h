/*
 * engine/engine_internal.h - what the engine's own files share: the resolved
 * configuration and "host:port" parsing (C and C++; the transport interface, which
 * uses C11 atomics, is engine/transport.h).
 *
 * Not part of the public API; only engine/ and its tests include it.
 */
#ifndef OTE_ENGINE_ENGINE_INTERNAL_H
#define OTE_ENGINE_ENGINE_INTERNAL_H

/* Internal to OrbitTE's engine: only its own targets (and tests) compile with
 * OTE__INSIDE_ENGINE (Bazel local_defines, never passed on to dependents), so an outside
 * workspace that includes this header fails here instead of building against internals.
 * Use <ote/ote.h>. */
#ifndef OTE__INSIDE_ENGINE
#error "engine/engine_internal.h is internal to OrbitTE's engine; include <ote/ote.h> instead"
#endif

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "base/status.h"
#include "base/time.h"
#include "ote/ote.h"

#ifdef __cplusplus
extern "C" {
#endif

#define OTE__ADDR_MAX 272 /* "[" + 255 host chars + "]:" + port + NUL, rounded */
/* An engine name (engine_name) with its NUL: OTE_CTL_MAX_NAME + 1, OTE_ENGINE_NAME_MAX + 1. */
#define OTE__ENGINE_NAME_LEN 64

#define OTE__GPU_PATH_STAGING 0x1u /* gpu_paths: pinned staging chunks */
#define OTE__GPU_PATH_IPC 0x2u     /* CUDA IPC (not built yet) */
#define OTE__GPU_PATH_DIRECT 0x4u  /* GPUDirect RDMA (requester side; gpu_direct.c) */

/* Resolved, validated configuration: what an engine copies at creation. */
typedef struct ote__cfg_s {
    char transport[16];  /* the first of transports */
    char transports[32]; /* ordered list, e.g. "shm,tcp" (validated) */
    char shm_mode[8];    /* "auto" or "ring" */
    char listen_address[OTE__ADDR_MAX];
    char advertise_address[OTE__ADDR_MAX];  /* "" = none */
    char engine_name[OTE__ENGINE_NAME_LEN]; /* "" = none (printable ASCII, in HELLOs) */
    uint32_t tcp_connections;
    uint32_t tcp_workers;
    uint32_t tcp_max_accepted;
    uint64_t slice_size;
    uint64_t transfer_timeout_ms;
    uint64_t connect_timeout_ms;
    /* The longest a connection accepted by this engine (listener, shm socket) may take to
     * complete its HELLO (and, with a key, its proof) before it is closed: the smaller of
     * handshake_timeout_ms and connect_timeout_ms (ote__cfg_handshake_ms). */
    uint64_t handshake_timeout_ms;
    char verbs_provider[32];
    char sim_profile[16]; /* verbs_provider=sim: profile of every device ("": the sim's) */
    char rdma_device[64];
    char rdma_devices[256];            /* comma-separated allow list ("" = all) */
    char rdma_exclude[256];            /* comma-separated deny list */
    char rdma_topology[1024];          /* NICs in order per GPU / NUMA node (file, "" = none) */
    uint32_t rdma_lanes;               /* CQ lanes (worker threads) per data device */
    char rdma_pin[256];                /* "dev:port:gid[,...]" strict routes ("" = none) */
    uint32_t rdma_port;                /* port of every unpinned device (OTE__CFG_UNSET: any) */
    uint32_t rdma_gid_index;           /* GID index of every unpinned device (UNSET: ranked) */
    uint32_t rdma_traffic_class;       /* every QP's GRH traffic class, 0..255 */
    uint32_t rdma_service_level;       /* every QP's service level, 0..15 */
    uint32_t rdma_mtu;                 /* path MTU clamp, IBV_MTU_* (0: none) */
    char rdma_mtu_text[8];             /* as configured ("" = none) */
    char rdma_sysfs_root[256];         /* sysfs mount for GID netdev checks ("" = /sys) */
    uint64_t rdma_grant_max;           /* bytes one RDMA grant may cover */
    uint64_t rdma_max_inflight;        /* RDMA bytes in flight, all peers and devices (0: any) */
    uint32_t rdma_max_grants;          /* RDMA grants reserved at once, all peers (0: any) */
    uint32_t rdma_max_qps;             /* RDMA QPs, all devices and peers (0: any) */
    uint32_t rdma_recv_slots;          /* receive slots per RDMA QP */
    uint32_t rdma_srq_slots;           /* depth of each lane's SRQ (0: half its recv CQ) */
    uint32_t rdma_max_peers;           /* requesters served at once (control connections) */
    uint32_t rdma_max_send_wrs;        /* RDMA send WRs outstanding, every QP (0: any) */
    uint32_t rdma_max_served_grants;   /* grants reserved at once by served parents (0: any) */
    char rdma_grant_mode[8];           /* "auto", "mw" or "mr" (source grants of host memory) */
    char log_level[16];                /* "" = leave the process-wide level alone */
    char auth_key_file[OTE__ADDR_MAX]; /* "" = no cluster key */
    int allow_unauthenticated;         /* no key on a non-loopback listen_address */
    unsigned gpu_paths;                /* OTE__GPU_PATH_* allowed */
    char gpu_paths_text[32];           /* as configured, for log lines */
    uint64_t gpu_staging_chunk;        /* bytes per pinned staging chunk */
    uint32_t gpu_staging_depth;        /* staging chunks in flight per request */
    int register_thp;                  /* THP advice on registered host ranges (hugepages.c) */
    char file_engine[8];               /* "auto", "uring" or "threads" (engine/file) */
    uint32_t file_queue_depth;         /* file I/O operations in flight */
    uint64_t file_chunk_size;          /* bytes of one file I/O operation */
    char file_sync[8];                 /* "none" or "data": fdatasync after file WRITEs */
    char file_zero_copy[8];            /* "auto" or "off": peers' READs from the page cache */
} ote__cfg_t;

/* The numeric form of an optional key ("" = not set: rdma_port, rdma_gid_index). */
#define OTE__CFG_UNSET UINT32_MAX

/* The deadline, from accept, of an accepted connection's handshake (ms). */
static inline uint64_t ote__cfg_handshake_ms(const ote__cfg_t *c) {
    return c->handshake_timeout_ms < c->connect_timeout_ms ? c->handshake_timeout_ms
                                                           : c->connect_timeout_ms;
}

/* Effective values of every key (set > OTE_<KEY> environment > default), each
 * validated. OTE_ERR_INVALID names the key and its source in an ERROR log line. */
ote_status_t ote__config_resolve(const ote_config_t *cfg, ote__cfg_t *out);
/* The i-th key of the configuration table, NULL past the last: every key, in the order
 * they resolve (tests walk them all). */
const char *ote__config_key(size_t i);
#define OTE__RDMA_PIN_MAX 8 /* pins an rdma_pin list may name */
/* One parsed rdma_pin entry. */
typedef struct ote__rdma_pin_s {
    char device[64];
    uint8_t port;  /* 1..255 */
    int gid_index; /* 0..255 (sgid_index is 8 bits) */
} ote__rdma_pin_t;
/* Parse rdma_pin text "device:port:gid_index[,device:port:gid_index...]" into at most
 * OTE__RDMA_PIN_MAX distinct devices. OTE_ERR_INVALID for malformed text; "" gives 0. */
ote_status_t ote__rdma_pin_parse(const char *text, ote__rdma_pin_t *pins, size_t *n_out);
/* Parse a size with an optional K/M/G suffix (powers of 1024). */
ote_status_t ote__parse_size(const char *s, uint64_t *out);

/*
 * Split "host:port" or "[v6 literal]:port" into host (without brackets) and port.
 * An IPv6 literal must be bracketed: "::1:80" is OTE_ERR_INVALID (ambiguous), not a
 * host "::1" and port 80. is_v6_out (may be NULL) tells whether the host was bracketed.
 */
ote_status_t ote__addr_split(const char *s, char *host, size_t host_len, uint16_t *port_out,
                             int *is_v6_out);
/* Resolve "host:port" to a socket address (numeric first, then getaddrinfo). */
ote_status_t ote__addr_resolve(const char *s, struct sockaddr_storage *ss, socklen_t *len_out);
/* A non-blocking TCP connection to "host:port", connected by dl (ote_ctl_connect): *fd_out
 * on success (close-on-exec); nothing left open and a WARN from component naming the
 * peer on failure: the resolution's status, OTE_ERR_TIMEOUT, or OTE_ERR_CONNECT with the
 * errno. */
ote_status_t ote__addr_dial(const char *s, ote_deadline_t dl, const char *component, int *fd_out);
/* Format a socket address as "a.b.c.d:port" or "[v6]:port". */
ote_status_t ote__addr_format(const struct sockaddr *sa, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif

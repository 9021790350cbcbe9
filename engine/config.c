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
    K_UINT,       /* a decimal integer in [min, max] */
    K_SIZE,       /* a size with an optional K/M/G suffix, in [min, max] bytes; number: bytes */
    K_BOOL,       /* "0" or "1"; number: 0 or 1 */
    K_ENUM,       /* one of choices */
    K_ADDR,       /* "host:port" or "[v6]:port" */
    K_ADDR_OPT,   /* an address or "" */
    K_LOGLEVEL,   /* a log level name, or "" */
    K_TRANSPORTS, /* a comma list of 1..3 distinct transports */
    K_GPU_PATHS,  /* a comma list of distinct GPU paths, or ""; number: OTE__GPU_PATH_* mask */
    K_RDMA_PIN    /* "device:port:gid_index" routes, comma-separated, or "" */
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

static const key_def_t g_keys[] = {
    /* transport: the one-element form of transports; "" = not set (transports rules). */
    {"transport", K_ENUM, "", .choices = {"", "tcp", "rdma", "shm"}, TEXT(transport)},
    {"transports", K_TRANSPORTS, "shm,tcp", TEXT(transports)},
    /* shm data path: auto = cross-memory attach where the kernel allows it, else the
     * shared ring; ring = always the shared ring. */
    {"shm_mode", K_ENUM, "auto", .choices = {"auto", "ring"}, TEXT(shm_mode)},
    {"listen_address", K_ADDR, "127.0.0.1:0", TEXT(listen_address)},
    {"advertise_address", K_ADDR_OPT, "", TEXT(advertise_address)},
    {"tcp_connections", K_UINT, "4", 1, 64, NUMBER(tcp_connections)},
    {"tcp_workers", K_UINT, "2", 1, 64, NUMBER(tcp_workers)},
    {"tcp_max_accepted", K_UINT, "1024", 1, 65536, NUMBER(tcp_max_accepted)},
    {"slice_size", K_SIZE, "1M", 4096, 32u << 20, NUMBER(slice_size)},
    {"transfer_timeout_ms", K_UINT, "30000", 1, 86400000, NUMBER(transfer_timeout_ms)},
    {"connect_timeout_ms", K_UINT, "5000", 1, 600000, NUMBER(connect_timeout_ms)},
    /* Accepted connections (listener, shm socket) that have not completed their HELLO
     * (and proof, with a key) by then are closed (bounded by connect_timeout_ms too). */
    {"handshake_timeout_ms", K_UINT, "5000", 1, 600000, NUMBER(handshake_timeout_ms)},
    {"verbs_provider", K_ENUM, "", .choices = {"", "sim", "rdma-core"}, TEXT(verbs_provider)},
    /* verbs_provider=sim: the device profile of every sim device (verbs/sim/sim.h). */
    {"sim_profile", K_STRING, "", 0, 15, TEXT(sim_profile)},
    {"rdma_device", K_STRING, "", 0, 63, TEXT(rdma_device)},
    /* Comma-separated device names: the data devices (empty: every one) and those never used. */
    {"rdma_devices", K_STRING, "", 0, 255, TEXT(rdma_devices)},
    {"rdma_exclude", K_STRING, "", 0, 255, TEXT(rdma_exclude)},
    /* A file of NICs in order per GPU and NUMA node (engine/rdma/selector/topo_file.h);
     * "" = hwloc's ranking only. Read and checked at ote_engine_create. */
    {"rdma_topology", K_STRING, "", 0, 1023, TEXT(rdma_topology)},
    /* CQ lanes (one worker thread each) per RDMA data device. */
    {"rdma_lanes", K_UINT, "2", 1, 64, NUMBER(rdma_lanes)},
    /* Strict routes "device:port:gid_index", comma-separated: exactly those devices, each
     * on that port and GID index (no automatic choice, no other device). */
    {"rdma_pin", K_RDMA_PIN, "", 0, 255, TEXT(rdma_pin)},
    /* Largest grant: a run of one request's slices on one device up to this many bytes
     * is asked of the source in one GRANT_REQ round trip (and a device's window of one
     * peer's bytes in flight is at least this). */
    {"rdma_grant_max", K_SIZE, "16M", 1u << 20, 1u << 30, NUMBER(rdma_grant_max)},
    /* Bytes of this engine's RDMA requests in flight at once over every peer and device
     * together (0: no limit beyond the per-device windows); runs past it wait queued. */
    {"rdma_max_inflight", K_SIZE, "0", 0, 1ull << 40, NUMBER(rdma_max_inflight)},
    /* RDMA credits (engine/rdma/rdma_credits.c): grants reserved at once by this engine's
     * requests over every peer and device (0: no limit), physical QPs of every device and
     * peer together (0: no limit), and receive slots per QP (a source admits a grant only
     * with a slot for its receipt). */
    {"rdma_max_grants", K_UINT, "0", 0, 65536, NUMBER(rdma_max_grants)},
    {"rdma_max_qps", K_UINT, "0", 0, 65536, NUMBER(rdma_max_qps)},
    {"rdma_recv_slots", K_UINT, "256", 1, 4096, NUMBER(rdma_recv_slots)},
    /* Depth of each lane's shared receive queue (0: half the lane's receive CQ). */
    {"rdma_srq_slots", K_UINT, "0", 0, 1048576, NUMBER(rdma_srq_slots)},
    /* Requesters this engine serves at once over rdma (control connections). */
    {"rdma_max_peers", K_UINT, "4096", 1, 1048576, NUMBER(rdma_max_peers)},
    /* Send WRs posted and not completed, every QP of this engine (0: per-QP depth only). */
    {"rdma_max_send_wrs", K_UINT, "0", 0, 1048576, NUMBER(rdma_max_send_wrs)},
    /* Grants a source reserves at once for its requesters' parents (engine/rdma/
     * rdma_src_parents.c; 0: no limit). */
    {"rdma_max_served_grants", K_UINT, "0", 0, 65536, NUMBER(rdma_max_served_grants)},
    /* How this engine, as a source, grants host memory (engine/rdma/rdma_direct.c): auto
     * = type-2 memory windows when every data device has them, else exact MRs; mw: windows
     * (creation fails on a device without them); mr: an exact MR per grant. */
    {"rdma_grant_mode", K_ENUM, "auto", .choices = {"auto", "mw", "mr"}, TEXT(rdma_grant_mode)},
    {"log_level", K_LOGLEVEL, "", TEXT(log_level)},
    /* The cluster key (engine/control/auth.h): a file of 32..4096 raw bytes, mode 0600 or
     * stricter. "" = no key: only a loopback listen_address, unless allow_unauthenticated. */
    {"auth_key_file", K_STRING, "", 0, 255, TEXT(auth_key_file)},
    {"allow_unauthenticated", K_BOOL, "0", NUMBER(allow_unauthenticated)},
    /* GPU memory (engine/gpu): the paths device memory may take (a comma list out of
     * staging, ipc, direct, or "" for none; the mask and the text for log lines), and the
     * staging pipeline's chunk size and chunks in flight per request. */
    {"gpu_paths", K_GPU_PATHS, "staging", TEXT(gpu_paths_text), NUMBER(gpu_paths)},
    {"gpu_staging_chunk", K_SIZE, "2M", 64u << 10, 64u << 20, NUMBER(gpu_staging_chunk)},
    {"gpu_staging_depth", K_UINT, "4", 1, 64, NUMBER(gpu_staging_depth)},
    /* 1: ote_memory_register advises the kernel to back host ranges with transparent huge
     * pages (engine/hugepages.c); it changes the application's memory, hence opt-in. */
    {"register_thp", K_BOOL, "0", NUMBER(register_thp)},
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
    }
    if (st == OTE_OK && (k->kind == K_UINT || k->kind == K_SIZE) && (n < k->min || n > k->max))
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
    *out = r;
    return OTE_OK;
}

/*
 * engine/config.c - ote_config_t (public), its resolution into ote__cfg_t, and
 * "host:port" / "[v6]:port" parsing.
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

#include "base/alloc.h"
#include "base/log.h"
#include "engine/control/ctl.h"
#include "engine/engine_internal.h"

typedef enum {
    K_STRING,
    K_UINT,
    K_SIZE,
    K_ENUM,
    K_ADDR,
    K_ADDR_OPT,
    K_LOGLEVEL,
    K_TRANSPORTS,
    K_GPU_PATHS,
    K_RDMA_PIN
} kind_t;

typedef struct {
    const char *key;
    kind_t kind;
    const char *def;
    uint64_t min, max;      /* K_UINT / K_SIZE */
    const char *choices[4]; /* K_ENUM */
} key_def_t;

static const key_def_t g_keys[] = {
    /* transport: the one-element form of transports; "" = not set (transports rules). */
    {"transport", K_ENUM, "", 0, 0, {"", "tcp", "rdma", "shm"}},
    {"transports", K_TRANSPORTS, "shm,tcp", 0, 0, {NULL}},
    /* shm data path: auto = cross-memory attach where the kernel allows it, else the
     * shared ring; ring = always the shared ring. */
    {"shm_mode", K_ENUM, "auto", 0, 0, {"auto", "ring", NULL, NULL}},
    {"listen_address", K_ADDR, "127.0.0.1:0", 0, 0, {NULL}},
    {"advertise_address", K_ADDR_OPT, "", 0, 0, {NULL}},
    {"tcp_connections", K_UINT, "4", 1, 64, {NULL}},
    {"tcp_workers", K_UINT, "2", 1, 64, {NULL}},
    {"tcp_max_accepted", K_UINT, "1024", 1, 65536, {NULL}},
    {"slice_size", K_SIZE, "1M", 4096, 32u << 20, {NULL}},
    {"transfer_timeout_ms", K_UINT, "30000", 1, 86400000, {NULL}},
    {"connect_timeout_ms", K_UINT, "5000", 1, 600000, {NULL}},
    /* Accepted connections (listener, shm socket) that have not completed their HELLO
     * (and proof, with a key) by then are closed (bounded by connect_timeout_ms too). */
    {"handshake_timeout_ms", K_UINT, "5000", 1, 600000, {NULL}},
    {"verbs_provider", K_ENUM, "", 0, 0, {"", "sim", "rdma-core", NULL}},
    {"rdma_device", K_STRING, "", 0, 63, {NULL}},
    /* Comma-separated device names: the data devices (empty: every one) and those never used. */
    {"rdma_devices", K_STRING, "", 0, 255, {NULL}},
    {"rdma_exclude", K_STRING, "", 0, 255, {NULL}},
    /* CQ lanes (one worker thread each) per RDMA data device. */
    {"rdma_lanes", K_UINT, "2", 1, 64, {NULL}},
    /* Strict routes "device:port:gid_index", comma-separated: exactly those devices, each
     * on that port and GID index (no automatic choice, no other device). */
    {"rdma_pin", K_RDMA_PIN, "", 0, 255, {NULL}},
    /* Largest grant: a run of one request's slices on one device up to this many bytes
     * is asked of the source in one GRANT_REQ round trip (and a device's window of one
     * peer's bytes in flight is at least this). */
    {"rdma_grant_max", K_SIZE, "16M", 1u << 20, 1u << 30, {NULL}},
    /* Bytes of this engine's RDMA requests in flight at once over every peer and device
     * together (0: no limit beyond the per-device windows); runs past it wait queued. */
    {"rdma_max_inflight", K_SIZE, "0", 0, 1ull << 40, {NULL}},
    /* RDMA credits (engine/rdma/rdma_credits.c): grants reserved at once by this engine's
     * requests over every peer and device (0: no limit), physical QPs of every device and
     * peer together (0: no limit), and receive slots per QP (a source admits a grant only
     * with a slot for its receipt). */
    {"rdma_max_grants", K_UINT, "0", 0, 65536, {NULL}},
    {"rdma_max_qps", K_UINT, "0", 0, 65536, {NULL}},
    {"rdma_recv_slots", K_UINT, "256", 1, 4096, {NULL}},
    /* Send WRs posted and not completed, every QP of this engine (0: per-QP depth only). */
    {"rdma_max_send_wrs", K_UINT, "0", 0, 1048576, {NULL}},
    /* Grants a source reserves at once for its requesters' parents (engine/rdma/
     * rdma_src_parents.c; 0: no limit). */
    {"rdma_max_served_grants", K_UINT, "0", 0, 65536, {NULL}},
    {"log_level", K_LOGLEVEL, "", 0, 0, {NULL}},
    /* The cluster key (engine/control/auth.h): a file of 32..4096 raw bytes, mode 0600 or
     * stricter. "" = no key: only a loopback listen_address, unless allow_unauthenticated. */
    {"auth_key_file", K_STRING, "", 0, 255, {NULL}},
    {"allow_unauthenticated", K_ENUM, "0", 0, 0, {"0", "1", NULL, NULL}},
    /* GPU memory (engine/gpu): the paths device memory may take (a comma list out of
     * staging, ipc, direct, or "" for none), and the staging pipeline's chunk size and
     * chunks in flight per request. */
    {"gpu_paths", K_GPU_PATHS, "staging", 0, 0, {NULL}},
    {"gpu_staging_chunk", K_SIZE, "2M", 64u << 10, 64u << 20, {NULL}},
    {"gpu_staging_depth", K_UINT, "4", 1, 64, {NULL}},
    /* 1: ote_memory_register advises the kernel to back host ranges with transparent huge
     * pages (engine/hugepages.c); it changes the application's memory, hence opt-in. */
    {"register_thp", K_ENUM, "0", 0, 0, {"0", "1", NULL, NULL}},
};
#define NKEYS (sizeof(g_keys) / sizeof(g_keys[0]))

struct ote_config {
    char *values[NKEYS]; /* NULL = not set */
};

static int key_index(const char *key) {
    if (key == NULL) return -1;
    for (size_t i = 0; i < NKEYS; i++)
        if (strcmp(g_keys[i].key, key) == 0) return (int)i;
    return -1;
}

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

/* "shm,rdma,tcp": 1..3 distinct names out of tcp, rdma, shm, comma-separated. */
static ote_status_t validate_transports(const char *v) {
    static const char *const names[] = {"tcp", "rdma", "shm"};
    unsigned seen = 0, n = 0;
    for (const char *p = v;;) {
        const char *end = strchr(p, ',');
        size_t l = end ? (size_t)(end - p) : strlen(p);
        int found = -1;
        for (int i = 0; i < 3; i++)
            if (strlen(names[i]) == l && memcmp(names[i], p, l) == 0) found = i;
        if (found < 0 || (seen & (1u << found))) return OTE_ERR_INVALID;
        seen |= 1u << found;
        n++;
        if (end == NULL) break;
        p = end + 1;
    }
    return n >= 1 ? OTE_OK : OTE_ERR_INVALID;
}

/* "staging,ipc": distinct names out of staging, ipc, direct; "" allows none. */
static ote_status_t parse_gpu_paths(const char *v, unsigned *mask_out) {
    static const char *const names[] = {"staging", "ipc", "direct"};
    unsigned seen = 0;
    for (const char *p = v; *p != '\0';) {
        const char *end = strchr(p, ',');
        size_t l = end ? (size_t)(end - p) : strlen(p);
        int found = -1;
        for (int i = 0; i < 3; i++)
            if (strlen(names[i]) == l && memcmp(names[i], p, l) == 0) found = i;
        if (found < 0 || (seen & (1u << found))) return OTE_ERR_INVALID;
        seen |= 1u << found;
        if (end == NULL) break;
        p = end + 1;
        if (*p == '\0') return OTE_ERR_INVALID;
    }
    *mask_out = seen;
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

ote_status_t ote__rdma_pin_parse(const char *text, ote__rdma_pin_t *pins, size_t *n_out) {
    if (text == NULL || pins == NULL || n_out == NULL || strlen(text) > 255) return OTE_ERR_INVALID;
    size_t n = 0;
    for (const char *p = text; *p != '\0';) {
        if (n == OTE__RDMA_PIN_MAX) return OTE_ERR_INVALID;
        const char *colon = strchr(p, ':');
        const char *comma = strchr(p, ',');
        if (colon == NULL || (comma != NULL && comma < colon)) return OTE_ERR_INVALID;
        size_t dl = (size_t)(colon - p);
        if (dl == 0 || dl >= sizeof(pins[n].device)) return OTE_ERR_INVALID;
        for (size_t i = 0; i < dl; i++)
            if (!isgraph((unsigned char)p[i])) return OTE_ERR_INVALID;
        memcpy(pins[n].device, p, dl);
        pins[n].device[dl] = '\0';
        for (size_t i = 0; i < n; i++)
            if (strcmp(pins[i].device, pins[n].device) == 0) return OTE_ERR_INVALID;
        p = colon + 1;
        unsigned long port, gid;
        if (parse_dec(&p, 3, 255, &port) != 0 || port == 0 || *p++ != ':') return OTE_ERR_INVALID;
        if (parse_dec(&p, 5, 65535, &gid) != 0) return OTE_ERR_INVALID;
        pins[n].port = (uint8_t)port;
        pins[n].gid_index = (int)gid;
        n++;
        if (*p == '\0') break;
        if (*p++ != ',' || *p == '\0') return OTE_ERR_INVALID;
    }
    *n_out = n;
    return OTE_OK;
}

static ote_status_t validate(const key_def_t *k, const char *v) {
    char host[256];
    uint16_t port;
    uint64_t n;
    switch (k->kind) {
        case K_STRING: return strlen(v) <= k->max ? OTE_OK : OTE_ERR_INVALID;
        case K_ENUM:
            for (int i = 0; i < 4 && k->choices[i]; i++)
                if (strcmp(v, k->choices[i]) == 0) return OTE_OK;
            return OTE_ERR_INVALID;
        case K_ADDR_OPT:
            if (v[0] == '\0') return OTE_OK;
            /* fallthrough */
        case K_ADDR: return ote__addr_split(v, host, sizeof(host), &port, NULL);
        case K_LOGLEVEL:
            return (v[0] == '\0' || ote_log_parse_level(v) >= 0) ? OTE_OK : OTE_ERR_INVALID;
        case K_TRANSPORTS: return validate_transports(v);
        case K_GPU_PATHS: {
            unsigned mask;
            return parse_gpu_paths(v, &mask);
        }
        case K_RDMA_PIN: {
            ote__rdma_pin_t pins[OTE__RDMA_PIN_MAX];
            size_t np;
            return ote__rdma_pin_parse(v, pins, &np);
        }
        case K_UINT:
            for (const char *p = v; *p; p++)
                if (!isdigit((unsigned char)*p)) return OTE_ERR_INVALID;
            if (v[0] == '\0' || strlen(v) > 19) return OTE_ERR_INVALID;
            n = strtoull(v, NULL, 10);
            return (n >= k->min && n <= k->max) ? OTE_OK : OTE_ERR_INVALID;
        case K_SIZE:
            if (ote__parse_size(v, &n) != OTE_OK) return OTE_ERR_INVALID;
            return (n >= k->min && n <= k->max) ? OTE_OK : OTE_ERR_INVALID;
    }
    return OTE_ERR_INVALID;
}

static void describe_allowed(const key_def_t *k, char *buf, size_t len) {
    switch (k->kind) {
        case K_ENUM: {
            size_t o = (size_t)snprintf(buf, len, "one of");
            for (int i = 0; i < 4 && k->choices[i] && o < len; i++)
                o += (size_t)snprintf(buf + o, len - o, " \"%s\"", k->choices[i]);
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
                     "\"device:port:gid_index\" (port 1..255, GID index 0..65535), up to %d "
                     "distinct devices comma-separated, or \"\"",
                     OTE__RDMA_PIN_MAX);
            break;
        default: snprintf(buf, len, "at most %llu characters", (unsigned long long)k->max);
    }
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
    if (validate(&g_keys[i], value) != OTE_OK) {
        char allowed[160];
        describe_allowed(&g_keys[i], allowed, sizeof(allowed));
        OTE_WARN("engine", "config: invalid %s=\"%s\": expected %s", key, value, allowed);
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

ote_status_t ote__config_resolve(const ote_config_t *cfg, ote__cfg_t *out) {
    if (out == NULL) return OTE_ERR_INVALID;
    ote__cfg_t r;
    memset(&r, 0, sizeof(r));
    int transports_set = 0;
    for (size_t i = 0; i < NKEYS; i++) {
        const char *src;
        const char *v = effective(cfg, i, &src);
        const key_def_t *k = &g_keys[i];
        if (validate(k, v) != OTE_OK || strlen(v) >= OTE__ADDR_MAX) {
            char allowed[160];
            describe_allowed(k, allowed, sizeof(allowed));
            OTE_ERROR("engine", "config: invalid %s=\"%s\" (from %s): expected %s", k->key, v, src,
                      allowed);
            return OTE_ERR_INVALID;
        }
        uint64_t n = 0;
        if (k->kind == K_UINT) n = strtoull(v, NULL, 10);
        if (k->kind == K_SIZE) (void)ote__parse_size(v, &n);
        if (strcmp(k->key, "transport") == 0) copy_str(r.transport, sizeof(r.transport), v);
        else if (strcmp(k->key, "transports") == 0) {
            copy_str(r.transports, sizeof(r.transports), v);
            transports_set = strcmp(src, "default") != 0;
        } else if (strcmp(k->key, "shm_mode") == 0) copy_str(r.shm_mode, sizeof(r.shm_mode), v);
        else if (strcmp(k->key, "listen_address") == 0)
            copy_str(r.listen_address, sizeof(r.listen_address), v);
        else if (strcmp(k->key, "advertise_address") == 0)
            copy_str(r.advertise_address, sizeof(r.advertise_address), v);
        else if (strcmp(k->key, "tcp_connections") == 0) r.tcp_connections = (uint32_t)n;
        else if (strcmp(k->key, "tcp_workers") == 0) r.tcp_workers = (uint32_t)n;
        else if (strcmp(k->key, "tcp_max_accepted") == 0) r.tcp_max_accepted = (uint32_t)n;
        else if (strcmp(k->key, "slice_size") == 0) r.slice_size = n;
        else if (strcmp(k->key, "transfer_timeout_ms") == 0) r.transfer_timeout_ms = n;
        else if (strcmp(k->key, "connect_timeout_ms") == 0) r.connect_timeout_ms = n;
        else if (strcmp(k->key, "handshake_timeout_ms") == 0) r.handshake_timeout_ms = n;
        else if (strcmp(k->key, "verbs_provider") == 0)
            copy_str(r.verbs_provider, sizeof(r.verbs_provider), v);
        else if (strcmp(k->key, "rdma_device") == 0)
            copy_str(r.rdma_device, sizeof(r.rdma_device), v);
        else if (strcmp(k->key, "rdma_devices") == 0)
            copy_str(r.rdma_devices, sizeof(r.rdma_devices), v);
        else if (strcmp(k->key, "rdma_exclude") == 0)
            copy_str(r.rdma_exclude, sizeof(r.rdma_exclude), v);
        else if (strcmp(k->key, "rdma_lanes") == 0) r.rdma_lanes = (uint32_t)n;
        else if (strcmp(k->key, "rdma_pin") == 0) copy_str(r.rdma_pin, sizeof(r.rdma_pin), v);
        else if (strcmp(k->key, "rdma_grant_max") == 0) r.rdma_grant_max = n;
        else if (strcmp(k->key, "rdma_max_inflight") == 0) r.rdma_max_inflight = n;
        else if (strcmp(k->key, "rdma_max_grants") == 0) r.rdma_max_grants = (uint32_t)n;
        else if (strcmp(k->key, "rdma_max_qps") == 0) r.rdma_max_qps = (uint32_t)n;
        else if (strcmp(k->key, "rdma_recv_slots") == 0) r.rdma_recv_slots = (uint32_t)n;
        else if (strcmp(k->key, "rdma_max_send_wrs") == 0) r.rdma_max_send_wrs = (uint32_t)n;
        else if (strcmp(k->key, "rdma_max_served_grants") == 0)
            r.rdma_max_served_grants = (uint32_t)n;
        else if (strcmp(k->key, "log_level") == 0) copy_str(r.log_level, sizeof(r.log_level), v);
        else if (strcmp(k->key, "auth_key_file") == 0)
            copy_str(r.auth_key_file, sizeof(r.auth_key_file), v);
        else if (strcmp(k->key, "allow_unauthenticated") == 0)
            r.allow_unauthenticated = strcmp(v, "1") == 0;
        else if (strcmp(k->key, "gpu_paths") == 0) {
            (void)parse_gpu_paths(v, &r.gpu_paths);
            copy_str(r.gpu_paths_text, sizeof(r.gpu_paths_text), v);
        } else if (strcmp(k->key, "gpu_staging_chunk") == 0) r.gpu_staging_chunk = n;
        else if (strcmp(k->key, "gpu_staging_depth") == 0) r.gpu_staging_depth = (uint32_t)n;
        else if (strcmp(k->key, "register_thp") == 0) r.register_thp = strcmp(v, "1") == 0;
    }
    if (r.slice_size > OTE_CTL_MAX_DATA / 2) r.slice_size = OTE_CTL_MAX_DATA / 2;
    /* transport (one element) counts when transports was left at its default; setting
     * both to different lists is refused rather than guessed. */
    if (r.transport[0] != '\0') {
        if (transports_set && strcmp(r.transport, r.transports) != 0) {
            OTE_ERROR("engine", "config: transport=%s and transports=%s disagree: set one of them",
                      r.transport, r.transports);
            return OTE_ERR_INVALID;
        }
        copy_str(r.transports, sizeof(r.transports), r.transport);
    }
    size_t first = strcspn(r.transports, ",");
    memcpy(r.transport, r.transports, first);
    r.transport[first] = '\0';
    *out = r;
    return OTE_OK;
}

/*
 * verbs/sim/config.c - devices, ports and GID tables of the sim: the configuration
 * parser (syntax in sim.h), unique auto GIDs, the listening socket of every GID and the
 * port/GID query verbs (query_device is in profile.c).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/list.h"
#include "verbs/sim/sim_internal.h"

static const char k_default[] =
    "dev=sim0,numa=0;port;gid=auto-ll,type=v1;gid=auto-ll,type=v2;gid=auto-v4,type=v1;"
    "gid=auto-v4,type=v2;dev=sim1,numa=1;port;gid=auto-ll,type=v1;gid=auto-ll,type=v2;"
    "gid=auto-v4,type=v1;gid=auto-v4,type=v2";

const char *ote_sim_default_config(void) { return k_default; }

static enum ibv_mtu mtu_from_netdev(int mtu) {
    if (mtu >= 4096 + 128) return IBV_MTU_4096;
    if (mtu >= 2048 + 128) return IBV_MTU_2048;
    if (mtu >= 1024 + 128) return IBV_MTU_1024;
    if (mtu >= 512 + 128) return IBV_MTU_512;
    return IBV_MTU_256;
}

static bool parse_uint(const char *s, unsigned long max, unsigned long *out) {
    if (!s || !*s) return false;
    char *end = NULL;
    errno = 0;
    unsigned long x = strtoul(s, &end, 0);
    if (errno || *end || x > max) return false;
    *out = x;
    return true;
}

/* A rate in bytes per second: digits with an optional K, M or G (powers of 1000). */
static bool parse_rate(const char *s, uint64_t *out) {
    if (!s || *s < '0' || *s > '9') return false;
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(s, &end, 10);
    if (errno) return false;
    uint64_t mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1000ull;
    else if (*end == 'M' || *end == 'm') mul = 1000ull * 1000;
    else if (*end == 'G' || *end == 'g') mul = 1000ull * 1000 * 1000;
    if (mul != 1) end++;
    if (*end || x > SIM_MAX_BW / mul) return false;
    *out = (uint64_t)x * mul;
    return true;
}

static void port_defaults(sim_port_t *pt) {
    memset(pt, 0, sizeof(*pt));
    pt->state = IBV_PORT_ACTIVE;
    pt->netdev_mtu = 1500;
    pt->active_mtu = mtu_from_netdev(1500);
    pt->max_mtu = IBV_MTU_4096;
    pt->link_layer = IBV_LINK_LAYER_ETHERNET;
    pt->ngid = SIM_GID_TBL_LEN;
}

/* Log why the configuration is refused and refuse it. */
#define CFG_FAIL(...) \
    do { \
        OTE_WARN(SIM_LOG, __VA_ARGS__); \
        return OTE_ERR_INVALID; \
    } while (0)

/* The item being parsed: what its first key made (kind) and where its options go. */
enum { ITEM_NONE = 0, ITEM_DEV, ITEM_PORT, ITEM_GID, ITEM_GLOBAL };

typedef struct {
    int kind;
    sim_dev_t *d;   /* the last device */
    sim_port_t *pt; /* ITEM_PORT, ITEM_GID: the port */
    sim_gid_t gid;  /* ITEM_GID: the entry, placed when the item ends */
    long gid_index; /* ITEM_GID: -1 = the first free index */
} cfg_item_t;

/* An IPv6 literal, or an IPv4 address stored IPv4-mapped. */
static ote_status_t parse_gid_addr(const char *val, union ibv_gid *gid) {
    struct in_addr a4;
    if (inet_pton(AF_INET6, val, gid->raw) == 1) return OTE_OK;
    if (inet_pton(AF_INET, val, &a4) != 1) CFG_FAIL("sim config: bad gid '%s'", val);
    memset(gid->raw, 0, 16);
    gid->raw[10] = 0xff;
    gid->raw[11] = 0xff;
    memcpy(&gid->raw[12], &a4, 4);
    return OTE_OK;
}

static ote_status_t head_dev(sim_config_t *cfg, cfg_item_t *it, const char *val) {
    if (cfg->ndev >= SIM_MAX_DEVS) CFG_FAIL("sim config: more than %d devices", SIM_MAX_DEVS);
    if (!val || !*val || strlen(val) >= IBV_SYSFS_NAME_MAX) CFG_FAIL("sim config: bad device name");
    sim_dev_t *d = &cfg->devs[cfg->ndev++];
    memset(d, 0, sizeof(*d));
    d->index = cfg->ndev - 1;
    snprintf(d->ibdev.name, sizeof(d->ibdev.name), "%s", val);
    snprintf(d->ibdev.dev_name, sizeof(d->ibdev.dev_name), "uverbs-%s", val);
    d->ibdev.node_type = IBV_NODE_CA;
    d->ibdev.transport_type = IBV_TRANSPORT_IB;
    it->d = d;
    it->kind = ITEM_DEV;
    return OTE_OK;
}

static ote_status_t head_port(cfg_item_t *it, const char *val) {
    sim_dev_t *d = it->d;
    unsigned long x = 0;
    if (!d) CFG_FAIL("sim config: port before dev");
    if (d->nports >= SIM_MAX_PORTS) CFG_FAIL("sim config: more than %d ports", SIM_MAX_PORTS);
    if (val && (!parse_uint(val, SIM_MAX_PORTS, &x) || (int)x != d->nports + 1))
        CFG_FAIL("sim config: ports must be numbered 1, 2, ... in order");
    it->pt = &d->ports[d->nports++];
    port_defaults(it->pt);
    it->kind = ITEM_PORT;
    return OTE_OK;
}

static ote_status_t head_gid(cfg_item_t *it, const char *val) {
    if (!it->d || !it->d->nports) CFG_FAIL("sim config: gid before port");
    if (!val) CFG_FAIL("sim config: gid needs a value");
    it->pt = &it->d->ports[it->d->nports - 1];
    it->gid.valid = true;
    it->gid.type = IBV_GID_TYPE_ROCE_V2;
    it->kind = ITEM_GID;
    if (!strcmp(val, "auto-v4")) it->gid.kind = SIM_GID_AUTO_V4;
    else if (!strcmp(val, "auto-ll")) it->gid.kind = SIM_GID_AUTO_LL;
    else if (!strcmp(val, "auto-v6")) it->gid.kind = SIM_GID_AUTO_V6;
    else {
        it->gid.kind = SIM_GID_EXPLICIT;
        return parse_gid_addr(val, &it->gid.gid);
    }
    return OTE_OK;
}

/* The first key of an item says what it is. */
static ote_status_t parse_head(sim_config_t *cfg, cfg_item_t *it, const char *key,
                               const char *val) {
    if (!strcmp(key, "dev")) return head_dev(cfg, it, val);
    if (!strcmp(key, "port")) return head_port(it, val);
    if (!strcmp(key, "gid")) return head_gid(it, val);
    if (!strcmp(key, "profile")) {
        if (cfg->profile) CFG_FAIL("sim config: the global profile is given twice");
        cfg->profile = ote__sim_profile_find(val);
        if (!cfg->profile) CFG_FAIL("sim config: unknown profile '%s'", val ? val : "");
        it->kind = ITEM_GLOBAL;
        return OTE_OK;
    }
    if (!strcmp(key, "retry_cap_ms")) {
        unsigned long x = 0;
        if (!parse_uint(val, 3600000, &x) || x == 0) CFG_FAIL("sim config: bad retry_cap_ms");
        cfg->retry_cap_ms = (uint32_t)x;
        it->kind = ITEM_GLOBAL;
        return OTE_OK;
    }
    CFG_FAIL("sim config: unknown item '%s'", key);
}

static ote_status_t port_option(sim_port_t *pt, const char *key, const char *val) {
    unsigned long x = 0;
    if (!strcmp(key, "state")) {
        if (val && !strcmp(val, "active")) pt->state = IBV_PORT_ACTIVE;
        else if (val && !strcmp(val, "down")) pt->state = IBV_PORT_DOWN;
        else if (val && !strcmp(val, "init")) pt->state = IBV_PORT_INIT;
        else CFG_FAIL("sim config: bad port state");
    } else if (!strcmp(key, "mtu")) {
        if (!parse_uint(val, 65536, &x) || x < 256) CFG_FAIL("sim config: bad mtu");
        pt->netdev_mtu = (int)x;
        pt->active_mtu = mtu_from_netdev((int)x);
    } else if (!strcmp(key, "link")) {
        if (val && !strcmp(val, "eth")) pt->link_layer = IBV_LINK_LAYER_ETHERNET;
        else if (val && !strcmp(val, "ib")) pt->link_layer = IBV_LINK_LAYER_INFINIBAND;
        else CFG_FAIL("sim config: bad link");
    } else if (!strcmp(key, "lid")) {
        if (!parse_uint(val, 0xbfff, &x)) CFG_FAIL("sim config: bad lid");
        pt->lid = (uint16_t)x;
    } else if (!strcmp(key, "gids")) {
        if (!parse_uint(val, SIM_GID_TBL_LEN, &x) || x == 0) CFG_FAIL("sim config: bad gids");
        pt->ngid = (int)x;
    } else if (!strcmp(key, "bw")) {
        uint64_t r = 0;
        if (!parse_rate(val, &r)) CFG_FAIL("sim config: bad bw '%s'", val ? val : "");
        pt->bw = r;
    } else {
        CFG_FAIL("sim config: unknown key '%s'", key);
    }
    return OTE_OK;
}

static ote_status_t gid_option(cfg_item_t *it, const char *key, const char *val) {
    unsigned long x = 0;
    if (!strcmp(key, "type")) {
        if (val && !strcmp(val, "v1")) it->gid.type = IBV_GID_TYPE_ROCE_V1;
        else if (val && !strcmp(val, "v2")) it->gid.type = IBV_GID_TYPE_ROCE_V2;
        else if (val && !strcmp(val, "ib")) it->gid.type = IBV_GID_TYPE_IB;
        else CFG_FAIL("sim config: bad gid type");
    } else if (!strcmp(key, "index")) {
        if (!parse_uint(val, SIM_GID_TBL_LEN - 1, &x)) CFG_FAIL("sim config: bad gid index");
        it->gid_index = (long)x;
    } else {
        CFG_FAIL("sim config: unknown key '%s'", key);
    }
    return OTE_OK;
}

/* A key after the first one: an option of what the item made. */
static ote_status_t parse_option(cfg_item_t *it, const char *key, const char *val) {
    if (it->kind == ITEM_DEV && !strcmp(key, "numa")) {
        if (!val || !*val) CFG_FAIL("sim config: bad numa");
        long n = strtol(val, NULL, 10);
        if (n < -1 || n > 1023) CFG_FAIL("sim config: bad numa");
        it->d->numa = (int)n;
        return OTE_OK;
    }
    if (it->kind == ITEM_DEV && !strcmp(key, "profile")) {
        it->d->profile = ote__sim_profile_find(val);
        if (!it->d->profile) CFG_FAIL("sim config: unknown profile '%s'", val ? val : "");
        return OTE_OK;
    }
    if (it->kind == ITEM_PORT) return port_option(it->pt, key, val);
    if (it->kind == ITEM_GID) return gid_option(it, key, val);
    CFG_FAIL("sim config: unknown key '%s'", key);
}

/* A GID item ends by taking its index (the first free one unless given). */
static ote_status_t place_gid(cfg_item_t *it) {
    sim_port_t *pt = it->pt;
    long i = it->gid_index;
    if (i < 0) {
        for (i = 0; i < pt->ngid && pt->gids[i].valid; i++) {}
    }
    if (i >= pt->ngid) CFG_FAIL("sim config: GID table full");
    if (pt->gids[i].valid) CFG_FAIL("sim config: GID index %ld used twice", i);
    pt->gids[i] = it->gid;
    return OTE_OK;
}

/* One ';'-separated item: comma-separated key=value, the first key says what it is. */
static ote_status_t parse_item(sim_config_t *cfg, char *item) {
    cfg_item_t it;
    memset(&it, 0, sizeof(it));
    it.d = cfg->ndev ? &cfg->devs[cfg->ndev - 1] : NULL;
    it.gid_index = -1;
    ote_list_iter_t kvs = ote_list_iter(item, ',');
    const char *p;
    size_t len;
    while (ote_list_next(&kvs, &p, &len)) {
        if (len == 0) continue; /* empty items are skipped, leading blanks dropped */
        char *kv = ote_list_cut(item, p, len);
        while (*kv == ' ') kv++;
        char *val = strchr(kv, '=');
        if (val) *val++ = '\0';
        ote_status_t st =
            it.kind == ITEM_NONE ? parse_head(cfg, &it, kv, val) : parse_option(&it, kv, val);
        if (st != OTE_OK) return st;
    }
    return it.kind == ITEM_GID ? place_gid(&it) : OTE_OK;
}

/* Whole-configuration rules: at least one device, every device has a port, names differ. */
static ote_status_t config_check(const sim_config_t *cfg) {
    if (cfg->ndev == 0) CFG_FAIL("sim config: no device");
    for (int i = 0; i < cfg->ndev; i++) {
        if (cfg->devs[i].nports == 0)
            CFG_FAIL("sim config: device %s has no port", cfg->devs[i].ibdev.name);
        for (int j = 0; j < i; j++)
            if (!strcmp(cfg->devs[i].ibdev.name, cfg->devs[j].ibdev.name))
                CFG_FAIL("sim config: device name %s used twice", cfg->devs[i].ibdev.name);
    }
    return OTE_OK;
}

ote_status_t ote__sim_config_parse(const char *text, sim_config_t *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->retry_cap_ms = 3000;
    if (!text || !*text) text = k_default;
    char *copy = ote_strdup(text);
    if (!copy) return OTE_ERR_NOMEM;
    ote_status_t st = OTE_OK;
    ote_list_iter_t items = ote_list_iter(copy, ';');
    const char *p;
    size_t len;
    while (st == OTE_OK && ote_list_next(&items, &p, &len)) {
        char *item = ote_list_cut(copy, p, len); /* blank and empty items are skipped */
        while (*item == ' ' || *item == '\n' || *item == '\t') item++;
        if (*item) st = parse_item(cfg, item);
    }
    ote_free(copy);
    if (st == OTE_OK) st = config_check(cfg);
    if (st != OTE_OK) return st;
    /* A device that names no profile: the global item's, else $OTE_SIM_PROFILE, else mlx5. */
    const sim_profile_t *dflt = cfg->profile ? cfg->profile : ote__sim_profile_default();
    for (int i = 0; i < cfg->ndev; i++) {
        if (cfg->devs[i].profile) continue;
        if (!dflt) return OTE_ERR_INVALID; /* a bad $OTE_SIM_PROFILE, logged */
        cfg->devs[i].profile = dflt;
    }
    const char *env = getenv("OTE_SIM_RETRY_CAP_MS");
    unsigned long x = 0;
    if (env && parse_uint(env, 3600000, &x) && x > 0) cfg->retry_cap_ms = (uint32_t)x;
    return OTE_OK;
}

/* ---- unique auto GIDs and listeners ---- */

static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static void make_auto(sim_gid_t *g, uint32_t uid) {
    uint8_t *r = g->gid.raw;
    memset(r, 0, 16);
    switch (g->kind) {
        case SIM_GID_AUTO_V4:
            r[10] = 0xff;
            r[11] = 0xff;
            r[12] = 10;
            r[13] = (uint8_t)(uid >> 16);
            r[14] = (uint8_t)(uid >> 8);
            r[15] = (uint8_t)uid;
            break;
        case SIM_GID_AUTO_LL: /* EUI-64 of MAC 02:5e:00:XX:YY:ZZ */
            r[0] = 0xfe;
            r[1] = 0x80;
            r[8] = 0x00;
            r[9] = 0x5e;
            r[10] = 0x00;
            r[11] = 0xff;
            r[12] = 0xfe;
            r[13] = (uint8_t)(uid >> 16);
            r[14] = (uint8_t)(uid >> 8);
            r[15] = (uint8_t)uid;
            break;
        case SIM_GID_AUTO_V6:
            r[0] = 0xfd;
            r[1] = 0x5e;
            r[13] = (uint8_t)(uid >> 16);
            r[14] = (uint8_t)(uid >> 8);
            r[15] = (uint8_t)uid;
            break;
        default: break;
    }
}

socklen_t ote__sim_gid_sockaddr(const union ibv_gid *gid, void *sun_out) {
    struct sockaddr_un *sun = (struct sockaddr_un *)sun_out;
    memset(sun, 0, sizeof(*sun));
    sun->sun_family = AF_UNIX;
    static const char hex[] = "0123456789abcdef";
    char name[64];
    int n = snprintf(name, sizeof(name), "orbitte-sim/");
    for (int i = 0; i < 16; i++) {
        name[n++] = hex[gid->raw[i] >> 4];
        name[n++] = hex[gid->raw[i] & 15];
    }
    /* abstract namespace: leading NUL, not NUL-terminated */
    memcpy(sun->sun_path + 1, name, (size_t)n);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

static bool gid_zero(const union ibv_gid *g) {
    static const uint8_t z[16];
    return memcmp(g->raw, z, 16) == 0;
}

/* Bind one listener for GID g; EADDRINUSE keeps *busy. */
static ote_status_t listener_open(sim_prov_t *p, sim_dev_t *d, int port, const union ibv_gid *g,
                                  sim_listener_t **out, bool *busy) {
    *busy = false;
    sim_listener_t *l = ote_calloc(1, sizeof(*l));
    if (!l) return OTE_ERR_NOMEM;
    l->dev = d;
    l->port = port;
    l->gid = *g;
    l->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (l->fd < 0) {
        int e = errno;
        ote_free(l);
        return ote_status_make(OTE_ERR_NATIVE, e);
    }
    struct sockaddr_un sun;
    socklen_t len = ote__sim_gid_sockaddr(g, &sun);
    if (bind(l->fd, (struct sockaddr *)&sun, len) != 0 || listen(l->fd, 256) != 0) {
        int e = errno;
        close(l->fd);
        ote_free(l);
        if (e == EADDRINUSE) {
            *busy = true;
            return OTE_ERR_EXISTS;
        }
        return ote_status_make(OTE_ERR_NATIVE, e);
    }
    ote_status_t st = ote__sim_listener_add(p, l);
    if (st != OTE_OK) {
        close(l->fd);
        ote_free(l);
        return st;
    }
    *out = l;
    return OTE_OK;
}

void ote__sim_port_unbind(sim_prov_t *p, sim_dev_t *d, int port) {
    sim_port_t *pt = &d->ports[port - 1];
    for (int i = 0; i < SIM_GID_TBL_LEN; i++) {
        if (pt->listeners[i]) {
            ote__sim_listener_del(p, pt->listeners[i]);
            pt->listeners[i] = NULL;
        }
    }
}

/* Listen on every distinct valid GID of the port. */
static ote_status_t port_listen(sim_prov_t *p, sim_dev_t *d, int port, bool *auto_busy) {
    sim_port_t *pt = &d->ports[port - 1];
    *auto_busy = false;
    for (int i = 0; i < pt->ngid; i++) {
        sim_gid_t *g = &pt->gids[i];
        if (!g->valid || gid_zero(&g->gid)) continue;
        bool dup = false;
        for (int j = 0; j < i; j++)
            if (pt->gids[j].valid && !memcmp(pt->gids[j].gid.raw, g->gid.raw, 16)) dup = true;
        if (dup) continue;
        bool busy = false;
        ote_status_t st = listener_open(p, d, port, &g->gid, &pt->listeners[i], &busy);
        if (st != OTE_OK) {
            ote__sim_port_unbind(p, d, port);
            if (busy && g->kind != SIM_GID_EXPLICIT) *auto_busy = true;
            return st;
        }
    }
    return OTE_OK;
}

ote_status_t ote__sim_port_bind(sim_prov_t *p, sim_dev_t *d, int port) {
    sim_port_t *pt = &d->ports[port - 1];
    uint64_t seed = ((uint64_t)getpid() << 32) ^ ((uint64_t)p->instance << 12) ^
                    ((uint64_t)d->index << 4) ^ (uint64_t)port;
    for (int attempt = 0; attempt < 64; attempt++) {
        uint32_t uid = (uint32_t)(mix64(seed + (uint64_t)attempt * 0x100000001ull) & 0xffffff);
        if (uid == 0) uid = 1;
        pt->uid = uid;
        for (int i = 0; i < pt->ngid; i++)
            if (pt->gids[i].valid && pt->gids[i].kind != SIM_GID_EXPLICIT)
                make_auto(&pt->gids[i], uid);
        bool auto_busy = false;
        ote_status_t st = port_listen(p, d, port, &auto_busy);
        if (st == OTE_OK) return OTE_OK;
        if (!auto_busy) {
            OTE_ERROR(SIM_LOG, "sim: cannot listen on the GIDs of %s port %d (%s)", d->ibdev.name,
                      port, ote_status_str(st));
            return st;
        }
    }
    return OTE_ERR_EXISTS;
}

/* ---- device and port verbs ---- */

int ote__sim_get_device_list(ote_verbs_t *v, struct ibv_device ***list_out, int *num_out) {
    sim_prov_t *p = to_sim_prov(v);
    struct ibv_device **list = ote_calloc((size_t)p->cfg.ndev + 1, sizeof(*list));
    if (!list) return ENOMEM;
    for (int i = 0; i < p->cfg.ndev; i++) list[i] = &p->cfg.devs[i].ibdev;
    *list_out = list;
    if (num_out) *num_out = p->cfg.ndev;
    return 0;
}

void ote__sim_free_device_list(ote_verbs_t *v, struct ibv_device **list) {
    (void)v;
    ote_free(list);
}

const char *ote__sim_get_device_name(ote_verbs_t *v, struct ibv_device *dev) {
    (void)v;
    return dev ? dev->name : NULL;
}

int ote__sim_query_port(ote_verbs_t *v, struct ibv_context *ctx, uint8_t port,
                        struct ibv_port_attr *a) {
    if (!ctx || !a) return EINVAL;
    sim_prov_t *p = to_sim_prov(v);
    sim_dev_t *d = to_sim_ctx(ctx)->dev;
    if (port < 1 || port > d->nports) return EINVAL;
    ote_mutex_lock(&p->mu);
    sim_port_t *pt = &d->ports[port - 1];
    memset(a, 0, sizeof(*a));
    a->state = pt->state;
    a->max_mtu = pt->max_mtu;
    a->active_mtu = pt->active_mtu;
    a->gid_tbl_len = pt->ngid;
    a->port_cap_flags = 0;
    a->max_msg_sz = (uint32_t)SIM_MAX_MSG_SZ;
    a->pkey_tbl_len = 1;
    a->link_layer = pt->link_layer;
    if (pt->link_layer == IBV_LINK_LAYER_INFINIBAND) {
        a->lid = pt->lid;
        a->sm_lid = 1;
    }
    a->active_width = 2;  /* 4X */
    a->active_speed = 32; /* EDR */
    a->phys_state = pt->state == IBV_PORT_ACTIVE ? 5 : 3;
    ote_mutex_unlock(&p->mu);
    return 0;
}

int ote__sim_query_gid(ote_verbs_t *v, struct ibv_context *ctx, uint8_t port, int index,
                       union ibv_gid *gid) {
    if (!ctx || !gid) return EINVAL;
    sim_prov_t *p = to_sim_prov(v);
    sim_dev_t *d = to_sim_ctx(ctx)->dev;
    if (port < 1 || port > d->nports) return EINVAL;
    sim_port_t *pt = &d->ports[port - 1];
    if (index < 0 || index >= pt->ngid) return EINVAL;
    ote_mutex_lock(&p->mu);
    if (pt->gids[index].valid) *gid = pt->gids[index].gid;
    else memset(gid, 0, sizeof(*gid));
    ote_mutex_unlock(&p->mu);
    return 0;
}

int ote__sim_query_gid_ex(ote_verbs_t *v, struct ibv_context *ctx, uint32_t port, uint32_t index,
                          struct ibv_gid_entry *e) {
    if (!ctx || !e) return EINVAL;
    sim_prov_t *p = to_sim_prov(v);
    sim_dev_t *d = to_sim_ctx(ctx)->dev;
    if (port < 1 || port > (uint32_t)d->nports) return EINVAL;
    sim_port_t *pt = &d->ports[port - 1];
    if (index >= (uint32_t)pt->ngid) return EINVAL;
    int rc = 0;
    ote_mutex_lock(&p->mu);
    if (!pt->gids[index].valid || gid_zero(&pt->gids[index].gid)) {
        rc = ENODATA;
    } else {
        memset(e, 0, sizeof(*e));
        e->gid = pt->gids[index].gid;
        e->gid_index = index;
        e->port_num = port;
        e->gid_type = pt->gids[index].type;
        e->ndev_ifindex =
            pt->link_layer == IBV_LINK_LAYER_ETHERNET ? (uint32_t)(100 + d->index) : 0;
    }
    ote_mutex_unlock(&p->mu);
    return rc;
}

int ote__sim_device_numa_node(ote_verbs_t *v, struct ibv_context *ctx, int *node_out) {
    (void)v;
    if (!ctx || !node_out) return EINVAL;
    *node_out = to_sim_ctx(ctx)->dev->numa;
    return 0;
}

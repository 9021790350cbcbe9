/*
 * context/gid.c - route selection: which port and GID a context uses.
 *
 * Automatic selection asks the fabric first: scan the port's GID table, skip empty
 * (ENODATA) and all-zero entries, and prefer an entry whose network device exists and
 * is up (sysfs gid_attrs/ndevs and class/net/<netdev>/operstate, read by sysfs.c): an
 * IPv4-mapped entry can belong to an address that lives on another host's or another
 * namespace's interface (Mooncake #946), and only a GID on a live local interface
 * carries this host's RoCE traffic. Then RoCE v2 (routable UDP), then IPv4-mapped
 * entries, then other routable ones (global IPv6 on IPv6-only fabrics, Mooncake #1593),
 * then link-local; ties go to the lowest index. On a port without netdev information
 * (InfiniBand, or a sysfs without gid_attrs) no entry gets the netdev preference, so the
 * order is the type order alone. A strict index (a pin, or the fixed GID index of every
 * device) is used exactly as given or the call fails naming device, port and index.
 *
 * GID indices are 32 bits wide in the table (ibv_query_gid_ex) but 8 bits in the address
 * vector every RC QP is connected with (ibv_ah_attr.grh.sgid_index): an entry past index
 * OTE_CONTEXT_MAX_SGID_INDEX cannot be a QP's source GID, so automatic selection passes it
 * by and a strict index there fails naming the limit (it is never truncated to another).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "context/context_internal.h"

static int gid_is_zero(const union ibv_gid *g) {
    static const uint8_t zero[16];
    return memcmp(g->raw, zero, sizeof(zero)) == 0;
}

/* 2 = IPv4-mapped (::ffff:a.b.c.d), 1 = other routable, 0 = link-local fe80::/10. */
static int gid_class(const union ibv_gid *g) {
    static const uint8_t v4prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (memcmp(g->raw, v4prefix, sizeof(v4prefix)) == 0) return 2;
    if (g->raw[0] == 0xfe && (g->raw[1] & 0xc0) == 0x80) return 0;
    return 1;
}

/* Higher is better; -1 for an entry that cannot be used. */
static int gid_score(const struct ibv_gid_entry *e, ote_context_netdev_t nd) {
    if (gid_is_zero(&e->gid)) return -1;
    return (nd == OTE_CONTEXT_NETDEV_UP ? 16 : 0) + (e->gid_type == IBV_GID_TYPE_ROCE_V2 ? 8 : 0) +
           gid_class(&e->gid);
}

int ote_context_rank_gids_netdev(const struct ibv_gid_entry *entries,
                                 const ote_context_netdev_t *netdevs, size_t n) {
    int best = -1, best_score = -1;
    for (size_t i = 0; i < n; i++) {
        int s = gid_score(&entries[i], netdevs != NULL ? netdevs[i] : OTE_CONTEXT_NETDEV_NONE);
        if (s > best_score ||
            (s == best_score && s >= 0 && entries[i].gid_index < entries[best].gid_index)) {
            best_score = s;
            best = (int)i;
        }
    }
    return best < 0 ? -1 : (int)entries[best].gid_index;
}

int ote_context_rank_gids(const struct ibv_gid_entry *entries, size_t n) {
    return ote_context_rank_gids_netdev(entries, NULL, n);
}

/* One GID table entry: 0, ENODATA for an empty slot, or the native errno. Providers
 * without query_gid_ex fall back to query_gid (type unknown: reported as IB). */
static int query_entry(ote_context_t *ctx, uint8_t port, int index, struct ibv_gid_entry *e) {
    ote_verbs_t *v = ctx->v;
    memset(e, 0, sizeof(*e));
    int err = v->ops->query_gid_ex(v, ctx->native, port, (uint32_t)index, e);
    if (err == EOPNOTSUPP) {
        memset(e, 0, sizeof(*e));
        err = v->ops->query_gid(v, ctx->native, port, index, &e->gid);
        if (err != 0) return err;
        e->gid_index = (uint32_t)index;
        e->port_num = port;
        e->gid_type = IBV_GID_TYPE_IB;
        return gid_is_zero(&e->gid) ? ENODATA : 0;
    }
    if (err == 0 && gid_is_zero(&e->gid)) return ENODATA;
    if (err == 0) e->gid_index = (uint32_t)index;
    return err;
}

/* The strict entry pin_gid_index of port (table length tbl_len) into *chosen; when it
 * cannot be used, why says so. */
static ote_status_t select_strict(ote_context_t *ctx, uint8_t port, int pin_gid_index, int tbl_len,
                                  struct ibv_gid_entry *chosen, char *why, size_t why_len) {
    if (pin_gid_index > OTE_CONTEXT_MAX_SGID_INDEX) {
        snprintf(why, why_len,
                 "cannot be used: a QP's source GID index is 8 bits "
                 "(ibv_ah_attr.grh.sgid_index, at most %d)",
                 OTE_CONTEXT_MAX_SGID_INDEX);
        return OTE_ERR_INVALID;
    }
    if (pin_gid_index >= tbl_len) {
        snprintf(why, why_len, "does not exist (the GID table has %d entries)", tbl_len);
        return OTE_ERR_NOT_FOUND;
    }
    int err = query_entry(ctx, port, pin_gid_index, chosen);
    if (err != 0) {
        snprintf(why, why_len, "is %s", err == ENODATA ? "empty (zero GID)" : "not queryable");
        return err == ENODATA ? OTE_ERR_NOT_FOUND : ote_status_make(OTE_ERR_NATIVE, err);
    }
    return OTE_OK;
}

/* The best entry of port's table (tbl_len entries) into *chosen and its netdev into
 * route (gid.c's header: netdev up, RoCE v2, IPv4-mapped, routable, lowest index). */
static ote_status_t select_auto(ote_context_t *ctx, uint8_t port, int tbl_len,
                                struct ibv_gid_entry *chosen, ote_context_route_t *route) {
    int best_score = -1;
    int n = tbl_len;
    if (n > OTE_CONTEXT_MAX_SGID_INDEX + 1) {
        OTE_DEBUG("context",
                  "device %s port %u: GID entries past index %d are not considered (a "
                  "QP's source GID index is 8 bits); the table has %d",
                  ctx->name, (unsigned)port, OTE_CONTEXT_MAX_SGID_INDEX, n);
        n = OTE_CONTEXT_MAX_SGID_INDEX + 1;
    }
    for (int i = 0; i < n; i++) {
        struct ibv_gid_entry e;
        if (query_entry(ctx, port, i, &e) != 0) continue;
        char netdev[16];
        ote_context_netdev_t nd = ote__context_gid_netdev(ctx, port, (uint32_t)i, netdev);
        int s = gid_score(&e, nd);
        if (s > best_score) { /* ascending index: a tie keeps the lower one */
            best_score = s;
            *chosen = e;
            memcpy(route->netdev, netdev, sizeof(route->netdev));
            route->netdev_state = nd;
        }
    }
    if (best_score < 0) {
        OTE_DEBUG("context", "device %s port %u: no usable GID among %d entries", ctx->name,
                  (unsigned)port, tbl_len);
        return OTE_ERR_NOT_FOUND;
    }
    return OTE_OK;
}

ote_status_t ote__context_select_route(ote_context_t *ctx, uint8_t port, int pin_gid_index,
                                       ote_context_route_t *route_out, int *active_out, char *why,
                                       size_t why_len) {
    ote_verbs_t *v = ctx->v;
    struct ibv_port_attr pa;
    memset(&pa, 0, sizeof(pa));
    int err = v->ops->query_port(v, ctx->native, port, &pa);
    if (err != 0) {
        OTE_WARN("context", "device %s port %u: query_port failed: errno %d", ctx->name,
                 (unsigned)port, err);
        return ote_status_make(OTE_ERR_NATIVE, err);
    }
    ote_context_route_t route;
    memset(&route, 0, sizeof(route));
    struct ibv_gid_entry chosen;
    memset(&chosen, 0, sizeof(chosen));
    ote_status_t st;
    if (pin_gid_index >= 0) {
        st = select_strict(ctx, port, pin_gid_index, pa.gid_tbl_len, &chosen, why, why_len);
        if (st == OTE_OK)
            route.netdev_state =
                ote__context_gid_netdev(ctx, port, (uint32_t)pin_gid_index, route.netdev);
    } else {
        st = select_auto(ctx, port, pa.gid_tbl_len, &chosen, &route);
    }
    if (st != OTE_OK) return st;
    route.port = port;
    route.gid_index = (int)chosen.gid_index;
    route.gid = chosen.gid;
    route.gid_type = chosen.gid_type;
    route.lid = pa.lid;
    route.link_layer = pa.link_layer;
    route.active_mtu = pa.active_mtu;
    *route_out = route;
    *active_out = pa.state == IBV_PORT_ACTIVE;
    return OTE_OK;
}

static const char *gid_type_name(uint32_t t) {
    switch (t) {
        case IBV_GID_TYPE_IB: return "IB";
        case IBV_GID_TYPE_ROCE_V1: return "RoCE v1";
        case IBV_GID_TYPE_ROCE_V2: return "RoCE v2";
        default: return "unknown type";
    }
}

void ote__context_log_route(const ote_context_t *ctx, const char *what) {
    const ote_context_route_t *r = &ctx->route;
    char addr[INET6_ADDRSTRLEN];
    if (inet_ntop(AF_INET6, r->gid.raw, addr, sizeof(addr)) == NULL)
        snprintf(addr, sizeof(addr), "?");
    char netdev[48];
    if (r->netdev[0] != '\0')
        snprintf(netdev, sizeof(netdev), "netdev %s %s", r->netdev,
                 r->netdev_state == OTE_CONTEXT_NETDEV_UP ? "up" : "down");
    else snprintf(netdev, sizeof(netdev), "no netdev");
    OTE_INFO("context", "nic %u %s: port %u GID index %d %s (%s, %s, %s), NUMA node %d",
             ctx->nic_id, ctx->name, (unsigned)r->port, r->gid_index, addr,
             gid_type_name(r->gid_type), netdev, what, ctx->numa_node);
}

/*
 * context/gid.c - route selection: which port and GID a context uses.
 *
 * Automatic selection follows what perftest and Mooncake do on RoCE: scan the port's GID
 * table, skip empty (ENODATA) and all-zero entries, prefer RoCE v2, then IPv4-mapped
 * entries, then other routable (non link-local) ones; ties go to the lowest index. A pin
 * is strict: it is used exactly as given or the call fails naming device, port and index.
 *
 * GID indices are 32 bits wide in the table (ibv_query_gid_ex) but 8 bits in the address
 * vector every RC QP is connected with (ibv_ah_attr.grh.sgid_index): an entry past index
 * OTE_CONTEXT_MAX_SGID_INDEX cannot be a QP's source GID, so automatic selection passes it
 * by and a pin to one fails naming the limit (it is never truncated to another entry).
 */
#include <errno.h>
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

static int gid_score(const struct ibv_gid_entry *e) {
    if (gid_is_zero(&e->gid)) return -1;
    return (e->gid_type == IBV_GID_TYPE_ROCE_V2 ? 8 : 0) + gid_class(&e->gid);
}

int ote_context_rank_gids(const struct ibv_gid_entry *entries, size_t n) {
    int best = -1, best_score = -1;
    for (size_t i = 0; i < n; i++) {
        int s = gid_score(&entries[i]);
        if (s > best_score ||
            (s == best_score && s >= 0 && entries[i].gid_index < entries[best].gid_index)) {
            best_score = s;
            best = (int)i;
        }
    }
    return best < 0 ? -1 : (int)entries[best].gid_index;
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

ote_status_t ote__context_select_route(ote_context_t *ctx, uint8_t port, int pin_gid_index,
                                       ote_context_route_t *route_out, int *active_out) {
    ote_verbs_t *v = ctx->v;
    struct ibv_port_attr pa;
    memset(&pa, 0, sizeof(pa));
    int err = v->ops->query_port(v, ctx->native, port, &pa);
    if (err != 0) {
        OTE_WARN("context", "device %s port %u: query_port failed: errno %d", ctx->name,
                 (unsigned)port, err);
        return ote_status_make(OTE_ERR_NATIVE, err);
    }
    struct ibv_gid_entry chosen;
    memset(&chosen, 0, sizeof(chosen));
    if (pin_gid_index >= 0) {
        if (pin_gid_index > OTE_CONTEXT_MAX_SGID_INDEX) {
            OTE_ERROR("context",
                      "pinned route device %s port %u GID index %d cannot be used: a QP's "
                      "source GID index is 8 bits (ibv_ah_attr.grh.sgid_index, at most %d)",
                      ctx->name, (unsigned)port, pin_gid_index, OTE_CONTEXT_MAX_SGID_INDEX);
            return OTE_ERR_INVALID;
        }
        if (pin_gid_index >= pa.gid_tbl_len) {
            OTE_ERROR("context",
                      "pinned route device %s port %u GID index %d does not exist (the GID "
                      "table has %d entries)",
                      ctx->name, (unsigned)port, pin_gid_index, pa.gid_tbl_len);
            return OTE_ERR_NOT_FOUND;
        }
        err = query_entry(ctx, port, pin_gid_index, &chosen);
        if (err != 0) {
            OTE_ERROR("context", "pinned route device %s port %u GID index %d is %s", ctx->name,
                      (unsigned)port, pin_gid_index,
                      err == ENODATA ? "empty (zero GID)" : "not queryable");
            return err == ENODATA ? OTE_ERR_NOT_FOUND : ote_status_make(OTE_ERR_NATIVE, err);
        }
    } else {
        int best_score = -1;
        int n = pa.gid_tbl_len;
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
            int s = gid_score(&e);
            if (s > best_score) {
                best_score = s;
                chosen = e;
            }
        }
        if (best_score < 0) {
            OTE_DEBUG("context", "device %s port %u: no usable GID among %d entries", ctx->name,
                      (unsigned)port, pa.gid_tbl_len);
            return OTE_ERR_NOT_FOUND;
        }
    }
    route_out->port = port;
    route_out->gid_index = (int)chosen.gid_index;
    route_out->gid = chosen.gid;
    route_out->gid_type = chosen.gid_type;
    route_out->lid = pa.lid;
    route_out->link_layer = pa.link_layer;
    route_out->active_mtu = pa.active_mtu;
    *active_out = pa.state == IBV_PORT_ACTIVE;
    return OTE_OK;
}

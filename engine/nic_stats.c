/*
 * engine/nic_stats.c - ote_engine_nic_stats: the data devices (NICs) of the engine's
 * transports and the bytes each carried, from the transports that have devices (the
 * optional nic_stats op of engine/transport.h; RDMA today); ote_engine_topology: the
 * order in which they are picked per GPU and NUMA node (the optional topology op).
 */
#include <stdio.h>
#include <string.h>

#include "engine/core_internal.h"

ote_status_t ote_engine_nic_stats(ote_engine_t *e, ote_nic_stats_t *out, size_t cap,
                                  size_t *n_out) {
    if (e == NULL || n_out == NULL || (out == NULL && cap != 0)) return OTE_ERR_INVALID;
    if (OTE__ENGINE_GONE(e)) return OTE_ERR_STATE;
    ote_nic_stats_t all[32];
    size_t n = 0;
    for (size_t t = 0; t < e->ntps; t++) {
        ote__transport_t *tp = e->tps[t];
        if (tp == NULL || tp->ops->nic_stats == NULL) continue;
        ote__nic_stat_t st[16];
        size_t k = tp->ops->nic_stats(tp, st, sizeof(st) / sizeof(st[0]));
        for (size_t i = 0; i < k && n < sizeof(all) / sizeof(all[0]); i++, n++) {
            memset(&all[n], 0, sizeof(all[n]));
            snprintf(all[n].transport, sizeof(all[n].transport), "%s", tp->ops->name);
            memcpy(all[n].name, st[i].name, sizeof(all[n].name));
            all[n].name[sizeof(all[n].name) - 1] = '\0';
            all[n].bytes_out = st[i].req_bytes;
            all[n].bytes_served = st[i].src_bytes;
            all[n].grants = st[i].grants;
            all[n].active = st[i].active;
        }
    }
    *n_out = n;
    if (n > cap) return OTE_ERR_TOO_BIG; /* out untouched */
    if (n > 0) memcpy(out, all, n * sizeof(all[0]));
    return OTE_OK;
}

ote_status_t ote_engine_topology(ote_engine_t *e, char *buf, size_t cap, size_t *len_out) {
    if (e == NULL || len_out == NULL || (buf == NULL && cap != 0)) return OTE_ERR_INVALID;
    if (OTE__ENGINE_GONE(e)) return OTE_ERR_STATE;
    size_t len = 0;
    for (size_t t = 0; t < e->ntps; t++) {
        ote__transport_t *tp = e->tps[t];
        if (tp == NULL || tp->ops->topology == NULL) continue;
        len += tp->ops->topology(tp, NULL, 0);
    }
    *len_out = len + 1;
    if (len + 1 > cap) return OTE_ERR_TOO_BIG; /* buf untouched */
    size_t at = 0;
    for (size_t t = 0; t < e->ntps; t++) {
        ote__transport_t *tp = e->tps[t];
        if (tp == NULL || tp->ops->topology == NULL) continue;
        size_t k = tp->ops->topology(tp, buf + at, cap - at);
        at += k < cap - at ? k : cap - at - 1;
    }
    buf[at] = '\0';
    *len_out = at;
    return OTE_OK;
}

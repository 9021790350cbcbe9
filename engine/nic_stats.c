/*
 * engine/nic_stats.c - ote_engine_nic_stats: the data devices (NICs) of the engine's
 * transports and the bytes each carried, from the transports that have devices (the
 * optional nic_stats op of engine/transport.h; RDMA today).
 */
#include <stdio.h>
#include <string.h>

#include "engine/core_internal.h"

ote_status_t ote_engine_nic_stats(ote_engine_t *e, ote_nic_stats_t *out, size_t cap,
                                  size_t *n_out) {
    if (e == NULL || n_out == NULL || (out == NULL && cap != 0)) return OTE_ERR_INVALID;
    size_t n = 0;
    for (size_t t = 0; t < e->ntps; t++) {
        ote__transport_t *tp = e->tps[t];
        if (tp == NULL || tp->ops->nic_stats == NULL) continue;
        ote__nic_stat_t st[16];
        size_t k = tp->ops->nic_stats(tp, st, sizeof(st) / sizeof(st[0]));
        for (size_t i = 0; i < k; i++, n++) {
            if (n >= cap) continue;
            memset(&out[n], 0, sizeof(out[n]));
            snprintf(out[n].transport, sizeof(out[n].transport), "%s", tp->ops->name);
            memcpy(out[n].name, st[i].name, sizeof(out[n].name));
            out[n].name[sizeof(out[n].name) - 1] = '\0';
            out[n].bytes_out = st[i].req_bytes;
            out[n].bytes_served = st[i].src_bytes;
            out[n].active = st[i].active;
        }
    }
    *n_out = n;
    return OTE_OK;
}

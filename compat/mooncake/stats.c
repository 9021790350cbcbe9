/*
 * compat/mooncake/stats.c - getNicLoadStats and showLinks, from ote_engine_nic_stats and
 * the open segments. OrbitTE counts the bytes each NIC carried; the bandwidth Mooncake
 * reports is derived here from those counters between successive calls (e->nics keeps
 * the previous sample per NIC).
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "base/log.h"
#include "compat/mooncake/compat_internal.h"

#define NIC_MAX 64
#define EWMA_WEIGHT 0.5 /* of the newest rate */

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The engine's NICs into out (at most NIC_MAX): OTE_OK with *n_out. */
static ote_status_t nics(ote_engine_t *ote, ote_nic_stats_t *out, size_t *n_out) {
    ote_status_t st = ote_engine_nic_stats(ote, out, NIC_MAX, n_out);
    if (st == OTE_ERR_TOO_BIG) *n_out = NIC_MAX; /* more than any host has: the first ones */
    return st == OTE_ERR_TOO_BIG ? ote_engine_nic_stats(ote, out, NIC_MAX, n_out) : st;
}

/* The smoothed rate of NIC s, updating its sample. Called with mu held. */
static double nic_rate(mc_engine_t *e, const ote_nic_stats_t *s, uint64_t now) {
    uint64_t bytes = s->bytes_out + s->bytes_served;
    mc_nic_t *p = NULL;
    for (size_t i = 0; i < e->nnics && p == NULL; i++)
        if (strcmp(e->nics[i].name, s->name) == 0) p = &e->nics[i];
    if (p == NULL) {
        mc_nic_t *grown = ote_realloc(e->nics, (e->nnics + 1) * sizeof *grown);
        if (grown == NULL) return 0.0; /* no sample kept: 0 until memory comes */
        e->nics = grown;
        p = &e->nics[e->nnics++];
        *p = (mc_nic_t){.bytes = bytes, .at_ns = now};
        snprintf(p->name, sizeof p->name, "%s", s->name);
        return 0.0;
    }
    if (now > p->at_ns && bytes >= p->bytes) {
        double rate = (double)(bytes - p->bytes) * 8e9 / (double)(now - p->at_ns);
        p->ewma_bps = EWMA_WEIGHT * rate + (1.0 - EWMA_WEIGHT) * p->ewma_bps;
    }
    p->bytes = bytes;
    p->at_ns = now;
    return p->ewma_bps;
}

int getNicLoadStats(transfer_engine_t engine, nic_load_stat_t *stats, size_t *count) {
    mc_engine_t *e = ote__mc_engine(engine, "getNicLoadStats");
    if (e == NULL || stats == NULL || count == NULL) return OTE_MC_ERR_INVALID_ARGUMENT;
    ote_engine_t *ote = ote__mc_ote(e, "getNicLoadStats");
    if (ote == NULL) return OTE_MC_ERR_CONTEXT;
    ote_nic_stats_t s[NIC_MAX];
    size_t n = 0;
    ote_status_t st = nics(ote, s, &n);
    if (st != OTE_OK) {
        OTE_ERROR(MC_LOG, "getNicLoadStats: %s", ote_status_str(st));
        return ote__mc_err(st);
    }
    uint64_t now = now_ns();
    ote_mutex_lock(&e->mu);
    for (size_t i = 0; i < n; i++) {
        double bps = nic_rate(e, &s[i], now);
        if (i >= *count) continue;
        snprintf(stats[i].device_name, sizeof stats[i].device_name, "%s", s[i].name);
        stats[i].inflight_bytes = 0; /* not measured by OrbitTE */
        stats[i].ewma_bandwidth_bps = bps;
    }
    ote_mutex_unlock(&e->mu);
    *count = n;
    return 0;
}

/* Append to buf (len bytes) at *used what fmt makes; *used counts what was needed. */
#define APPEND(buf, len, used, ...) \
    do { \
        int k_ = snprintf(*(used) < (len) ? (buf) + *(used) : NULL, \
                          *(used) < (len) ? (len) - *(used) : 0, __VA_ARGS__); \
        *(used) += k_ > 0 ? (size_t)k_ : 0; \
    } while (0)

static void describe_nics(const ote_nic_stats_t *s, size_t n, char *buf, size_t len, size_t *used,
                          int json) {
    for (size_t i = 0; i < n; i++) {
        if (json)
            APPEND(buf, len, used,
                   "%s{\"name\":\"%s\",\"transport\":\"%s\",\"active\":%s,\"bytes_out\":%llu,"
                   "\"bytes_served\":%llu}",
                   i ? "," : "", s[i].name, s[i].transport, s[i].active ? "true" : "false",
                   (unsigned long long)s[i].bytes_out, (unsigned long long)s[i].bytes_served);
        else
            APPEND(buf, len, used, "nic %s (%s): %s, %llu bytes out, %llu bytes served\n",
                   s[i].name, s[i].transport, s[i].active ? "active" : "down",
                   (unsigned long long)s[i].bytes_out, (unsigned long long)s[i].bytes_served);
    }
}

int showLinks(transfer_engine_t engine, char *buf_out, size_t buf_len, int json) {
    mc_engine_t *e = ote__mc_engine(engine, "showLinks");
    if (e == NULL || buf_out == NULL || buf_len == 0) return OTE_MC_ERR_INVALID_ARGUMENT;
    ote_engine_t *ote = ote__mc_ote(e, "showLinks");
    if (ote == NULL) return OTE_MC_ERR_CONTEXT;
    ote_nic_stats_t s[NIC_MAX];
    size_t n = 0;
    ote_status_t st = nics(ote, s, &n);
    if (st != OTE_OK) {
        OTE_ERROR(MC_LOG, "showLinks: %s", ote_status_str(st));
        return ote__mc_err(st);
    }
    size_t used = 0;
    if (json)
        APPEND(buf_out, buf_len, &used, "{\"address\":\"%s\",\"transports\":\"%s\",\"nics\":[",
               e->address, e->transports);
    else APPEND(buf_out, buf_len, &used, "engine %s (%s)\n", e->address, e->transports);
    describe_nics(s, n, buf_out, buf_len, &used, json);
    if (json) APPEND(buf_out, buf_len, &used, "],\"segments\":[");
    used += ote__mc_segs_describe(e, used < buf_len ? buf_out + used : NULL,
                                  used < buf_len ? buf_len - used : 0, json);
    if (json) APPEND(buf_out, buf_len, &used, "]}");
    if (used >= buf_len) {
        OTE_ERROR(MC_LOG, "showLinks: %zu bytes needed, buf_len is %zu", used + 1, buf_len);
        return OTE_MC_ERR_INVALID_ARGUMENT;
    }
    return 0;
}

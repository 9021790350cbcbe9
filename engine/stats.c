/*
 * engine/stats.c - ote_engine_stats and ote_segment_stats.
 *
 * The data path counts per segment (stats_internal.h: relaxed atomic adds as requests are
 * submitted and end, no lock). An engine's figures are the sum of its open segments'
 * counters and of the closed ones', which a segment's close folds into the engine's
 * per-transport counters; both under segmu, which only segment open and close and these
 * calls take. Registrations are counted from the registry itself (under reg_lk, read),
 * authentication failures by the cluster key's back-off table (engine/control).
 */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "base/list.h"
#include "engine/control/auth.h"
#include "engine/control/auth_limit.h"
#include "engine/core_internal.h"
#include "engine/file/file.h"
#include "engine/stats_internal.h"

static const char *const k_names[OTE_STATS_TRANSPORTS] = {"shm", "tcp", "rdma", "file"};

uint32_t ote__stats_transport_id(const char *name) {
    for (uint32_t i = 0; i < OTE_STATS_TRANSPORTS; i++)
        if (strcmp(name, k_names[i]) == 0) return i;
    return OTE_TRANSPORT_TCP; /* the router names only shm, tcp and rdma; the local segment file */
}

void ote__stats_attach(ote_engine_t *e, ote_segment_t *s) {
    ote_mutex_lock(&e->segmu);
    s->sprev = NULL;
    s->snext = e->segs;
    if (e->segs != NULL) e->segs->sprev = s;
    e->segs = s;
    ote_mutex_unlock(&e->segmu);
}

static uint64_t ld(const _Atomic uint64_t *v) {
    return atomic_load_explicit(v, memory_order_relaxed);
}

/* dst += src, counter by counter (dst: the engine's closed counters, under segmu). */
static void counters_add(ote__counters_t *dst, const ote__counters_t *src) {
    _Static_assert(sizeof(ote__counters_t) % sizeof(uint64_t) == 0, "counters are u64s");
    _Atomic uint64_t *d = (_Atomic uint64_t *)dst;
    const _Atomic uint64_t *s = (const _Atomic uint64_t *)src;
    for (size_t i = 0; i < sizeof(*dst) / sizeof(uint64_t); i++)
        atomic_fetch_add_explicit(&d[i], ld(&s[i]), memory_order_relaxed);
}

void ote__stats_detach(ote_engine_t *e, ote_segment_t *s) {
    ote_mutex_lock(&e->segmu);
    counters_add(&e->closed[s->tpid], &s->c);
    if (s->sprev != NULL) s->sprev->snext = s->snext;
    else e->segs = s->snext;
    if (s->snext != NULL) s->snext->sprev = s->sprev;
    s->snext = s->sprev = NULL;
    ote_mutex_unlock(&e->segmu);
}

/* out += the request figures of c. Ended counters are read before submitted ones, so
 * that what is in flight never reads negative on its own (clamped anyway); a completed
 * request is counted once, by its latency slot, so completed and the histogram agree. */
static void request_add(ote_request_stats_t *out, const ote__counters_t *c) {
    _Static_assert(OTE__LAT_SLOTS >= OTE_STATS_LATENCY_BUCKETS, "slots cover the buckets");
    uint64_t ended = 0, moved = ld(&c->unmoved);
    for (int i = 0; i < OTE__LAT_SLOTS; i++) {
        int k = i < OTE_STATS_LATENCY_BUCKETS ? i : OTE_STATS_LATENCY_BUCKETS - 1;
        for (int op = 0; op < 2; op++) {
            uint64_t v = ld(&c->done_us[i][op]);
            out->completed[op] += v;
            out->latency_us[k] += v;
            ended += v;
        }
        uint64_t v = ld(&c->other_us[i]);
        out->latency_us[k] += v;
        ended += v;
    }
    for (int op = 0; op < 2; op++) {
        out->failed[op] += ld(&c->other[0][op]);
        out->canceled[op] += ld(&c->other[1][op]);
        out->timed_out[op] += ld(&c->other[2][op]);
        uint64_t b = ld(&c->bytes[op]);
        out->bytes[op] += b;
        moved += b;
    }
    uint64_t submitted = 0;
    for (int op = 0; op < 2; op++) {
        uint64_t n = ld(&c->submitted[op]);
        out->submitted[op] += n;
        submitted += n;
    }
    uint64_t sbytes = ld(&c->submitted_bytes);
    out->inflight_requests_now += submitted > ended ? submitted - ended : 0;
    out->inflight_bytes_now += sbytes > moved ? sbytes - moved : 0;
    out->latency_ns_sum += ld(&c->lat_ns_sum);
}

/* The live registrations by memory kind, and the count since creation. */
static void registrations(ote_engine_t *e, ote_engine_stats_t *out) {
    pthread_rwlock_rdlock(&e->reg_lk);
    for (size_t i = 0; i < e->nregs; i++) {
        const ote__reg_t *r = e->regs[i];
        int k = r->pin.kind == OTE_MEM_HOST          ? OTE_STATS_MEM_HOST
                : r->pin.kind == OTE_MEM_HOST_PINNED ? OTE_STATS_MEM_HOST_PINNED
                                                     : OTE_STATS_MEM_CUDA;
        out->registrations_kind_now[k]++;
        out->registered_bytes_kind_now[k] += r->len;
        out->registrations_now++;
        out->registered_bytes_now += r->len;
    }
    out->registrations_total = e->regs_total;
    pthread_rwlock_unlock(&e->reg_lk);
}

/* Copy the first min(*size, have) bytes of full into dst and say how many. */
static void fill(void *dst, const void *full, size_t have) {
    size_t want = *(const size_t *)dst;
    size_t n = want < have ? want : have;
    memcpy(dst, full, n);
    *(size_t *)dst = n;
}

ote_status_t ote_engine_stats(ote_engine_t *e, ote_engine_stats_t *out) {
    if (e == NULL || out == NULL || out->struct_size < OTE_STATS_MIN_SIZE) return OTE_ERR_INVALID;
    if (OTE__ENGINE_GONE(e)) return OTE_ERR_STATE;
    ote_engine_stats_t s;
    memset(&s, 0, sizeof(s));
    for (uint32_t t = 0; t < OTE_STATS_TRANSPORTS; t++) {
        snprintf(s.transport[t].name, sizeof(s.transport[t].name), "%s", k_names[t]);
        s.transport[t].enabled = ote_list_has(e->cfg.transports, k_names[t]);
    }
    ote_mutex_lock(&e->segmu);
    for (uint32_t t = 0; t < OTE_STATS_TRANSPORTS; t++) {
        request_add(&s.transport[t].requests, &e->closed[t]);
        s.notify_sent += ld(&e->closed[t].notify_sent);
        s.notify_send_failed += ld(&e->closed[t].notify_failed);
    }
    for (const ote_segment_t *g = e->segs; g != NULL; g = g->snext) {
        request_add(&s.transport[g->tpid].requests, &g->c);
        s.transport[g->tpid].peers_now++;
        s.notify_sent += ld(&g->c.notify_sent);
        s.notify_send_failed += ld(&g->c.notify_failed);
    }
    ote_mutex_unlock(&e->segmu);
    registrations(e, &s);
    s.notify_received = ld(&e->notify_received);
    s.notify_refused = ld(&e->notify_refused);
    ote_auth_limit_t *lim = ote_auth_key_limit(e->auth_key);
    s.auth_failures = lim != NULL ? ote_auth_limit_failures(lim) : 0;
    s.auth_backoff_refused = lim != NULL ? ote_auth_limit_refused(lim) : 0;
    s.auth_open_failures = ld(&e->auth_open_failures);
    ote__files_read_bytes(e->files, &s.file_read_bytes_mapped, &s.file_read_bytes_bounced);
    fill(out, &s, sizeof(s));
    return OTE_OK;
}

ote_status_t ote_segment_stats(ote_segment_t *seg, ote_segment_stats_t *out) {
    if (seg == NULL || out == NULL || out->struct_size < OTE_STATS_MIN_SIZE) return OTE_ERR_INVALID;
    ote_segment_stats_t s;
    memset(&s, 0, sizeof(s));
    snprintf(s.transport, sizeof(s.transport), "%s", seg->tpname);
    s.transport_id = seg->tpid;
    snprintf(s.peer, sizeof(s.peer), "%s", seg->name);
    request_add(&s.requests, &seg->c);
    s.notify_sent = ld(&seg->c.notify_sent);
    s.notify_send_failed = ld(&seg->c.notify_failed);
    fill(out, &s, sizeof(s));
    return OTE_OK;
}

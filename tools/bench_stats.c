/*
 * tools/bench_stats.c - ote_bench --stats: the initiator engine's counters
 * (ote_engine_stats) at the end of the run, every result and its warm-up and control
 * traffic included. Lines after the table, or with --json one more line:
 *
 *   {"stats":{"transports":{"tcp":{"peers":1,"submitted":{"read":R,"write":W},
 *     "completed":{...},"failed":{...},"canceled":{...},"timed_out":{...},
 *     "bytes_read":N,"bytes_written":N,"inflight_requests":0,"inflight_bytes":0,
 *     "latency_ns_sum":N,"latency_us_log2":[32 counts]}},
 *   "registrations":1,"registered_bytes":N,"registrations_total":N,"notify_sent":N,
 *   "notify_send_failed":N,"notify_received":N,"notify_refused":N,"auth_failures":N,
 *   "auth_backoff_refused":N,"auth_open_failures":N}}
 *
 * Only the transports of the engine's list appear. latency_us_log2[i]: requests that took
 * less than 2^i microseconds (and at least 2^(i-1)), the last one everything longer.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "tools/bench_internal.h"

typedef struct {
    char *buf;
    size_t len, off;
} out_t;

static void put(out_t *o, const char *fmt, ...) {
    if (o->off >= o->len) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(o->buf + o->off, o->len - o->off, fmt, ap);
    va_end(ap);
    if (n > 0) o->off += (size_t)n;
}

static void put_ops(out_t *o, const char *key, const uint64_t v[2]) {
    put(o, "\"%s\":{\"read\":%llu,\"write\":%llu},", key, (unsigned long long)v[OTE_READ],
        (unsigned long long)v[OTE_WRITE]);
}

static void json_transport(out_t *o, const ote_transport_stats_t *t) {
    const ote_request_stats_t *r = &t->requests;
    put(o, "\"%s\":{\"peers\":%llu,", t->name, (unsigned long long)t->peers_now);
    put_ops(o, "submitted", r->submitted);
    put_ops(o, "completed", r->completed);
    put_ops(o, "failed", r->failed);
    put_ops(o, "canceled", r->canceled);
    put_ops(o, "timed_out", r->timed_out);
    put(o,
        "\"bytes_read\":%llu,\"bytes_written\":%llu,\"inflight_requests\":%llu,"
        "\"inflight_bytes\":%llu,\"latency_ns_sum\":%llu,\"latency_us_log2\":[",
        (unsigned long long)r->bytes[OTE_READ], (unsigned long long)r->bytes[OTE_WRITE],
        (unsigned long long)r->inflight_requests_now, (unsigned long long)r->inflight_bytes_now,
        (unsigned long long)r->latency_ns_sum);
    for (int i = 0; i < OTE_STATS_LATENCY_BUCKETS; i++)
        put(o, "%s%llu", i ? "," : "", (unsigned long long)r->latency_us[i]);
    put(o, "]}");
}

static void json_stats(out_t *o, const ote_engine_stats_t *s) {
    put(o, "{\"stats\":{\"transports\":{");
    int first = 1;
    for (int t = 0; t < OTE_STATS_TRANSPORTS; t++) {
        if (!s->transport[t].enabled) continue;
        if (!first) put(o, ",");
        first = 0;
        json_transport(o, &s->transport[t]);
    }
    put(o,
        "},\"registrations\":%llu,\"registered_bytes\":%llu,\"registrations_total\":%llu,"
        "\"notify_sent\":%llu,\"notify_send_failed\":%llu,\"notify_received\":%llu,"
        "\"notify_refused\":%llu,\"auth_failures\":%llu,\"auth_backoff_refused\":%llu,"
        "\"auth_open_failures\":%llu}}",
        (unsigned long long)s->registrations_now, (unsigned long long)s->registered_bytes_now,
        (unsigned long long)s->registrations_total, (unsigned long long)s->notify_sent,
        (unsigned long long)s->notify_send_failed, (unsigned long long)s->notify_received,
        (unsigned long long)s->notify_refused, (unsigned long long)s->auth_failures,
        (unsigned long long)s->auth_backoff_refused, (unsigned long long)s->auth_open_failures);
}

/* The smallest 2^i us bound that at least num/den of the histogram's requests are under. */
static unsigned long long hist_bound_us(const uint64_t *h, uint64_t num, uint64_t den) {
    uint64_t total = 0, seen = 0;
    for (int i = 0; i < OTE_STATS_LATENCY_BUCKETS; i++) total += h[i];
    for (int i = 0; i < OTE_STATS_LATENCY_BUCKETS; i++) {
        seen += h[i];
        if (total > 0 && seen * den >= total * num) return 1ull << i;
    }
    return 0;
}

static void text_stats(const ote_engine_stats_t *s) {
    printf("stats (this engine, whole run):\n");
    for (int t = 0; t < OTE_STATS_TRANSPORTS; t++) {
        const ote_transport_stats_t *x = &s->transport[t];
        if (!x->enabled) continue;
        const ote_request_stats_t *r = &x->requests;
        printf(
            "  %-4s peers %llu; requests read %llu/%llu/%llu/%llu/%llu, write "
            "%llu/%llu/%llu/%llu/%llu (submitted/completed/failed/canceled/timed out)\n",
            x->name, (unsigned long long)x->peers_now, (unsigned long long)r->submitted[0],
            (unsigned long long)r->completed[0], (unsigned long long)r->failed[0],
            (unsigned long long)r->canceled[0], (unsigned long long)r->timed_out[0],
            (unsigned long long)r->submitted[1], (unsigned long long)r->completed[1],
            (unsigned long long)r->failed[1], (unsigned long long)r->canceled[1],
            (unsigned long long)r->timed_out[1]);
        printf(
            "       bytes read %llu, written %llu; in flight %llu (%llu bytes); latency "
            "p50 < %llu us, p99 < %llu us\n",
            (unsigned long long)r->bytes[OTE_READ], (unsigned long long)r->bytes[OTE_WRITE],
            (unsigned long long)r->inflight_requests_now, (unsigned long long)r->inflight_bytes_now,
            hist_bound_us(r->latency_us, 1, 2), hist_bound_us(r->latency_us, 99, 100));
    }
    printf(
        "  registrations %llu (%llu bytes); notifications sent %llu, failed %llu, received "
        "%llu, refused %llu; authentication failures %llu\n",
        (unsigned long long)s->registrations_now, (unsigned long long)s->registered_bytes_now,
        (unsigned long long)s->notify_sent, (unsigned long long)s->notify_send_failed,
        (unsigned long long)s->notify_received, (unsigned long long)s->notify_refused,
        (unsigned long long)s->auth_failures);
}

int bench__print_stats(ote_engine_t *engine, bool json) {
    ote_engine_stats_t s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    ote_status_t st = ote_engine_stats(engine, &s);
    if (st != OTE_OK) {
        bench__print_status("ote_engine_stats", st);
        return 1;
    }
    if (json) {
        char line[8192];
        out_t o = {line, sizeof line, 0};
        json_stats(&o, &s);
        printf("%s\n", line);
    } else {
        text_stats(&s);
    }
    fflush(stdout);
    return 0;
}

/*
 * tools/bench_run.c - one measured result of the initiator: `threads` worker threads,
 * each keeping `depth` preallocated batches of `batch` requests in flight round-robin.
 * The timed loop only submits, waits and resets; latency samples go into preallocated
 * arrays (reservoir-sampled past their capacity) and are sorted once at the end.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <ote/ote.h>

#include "base/lock.h"
#include "base/status.h"
#include "base/time.h"
#include "tools/bench_internal.h"
#include "tools/bench_lib.h"

/* One thread's batches: `depth` of them, each with its own `batch` slots of the buffer,
 * kept in flight round-robin. */
struct bench_worker {
    run_t *run;
    size_t idx;
    pthread_t tid;
    ote_batch_t *batches[BENCH_DEPTH_MAX];
    ote_request_t *reqs;               /* depth * batch requests, batch d at d * batch */
    uint64_t t0[BENCH_DEPTH_MAX];      /* submit time of batch d */
    size_t n_in[BENCH_DEPTH_MAX];      /* requests of batch d in flight (0 = idle) */
    uint64_t covered[BENCH_DEPTH_MAX]; /* most requests batch d submitted at once */
    uint64_t *lat;                     /* kept samples (ns) */
    size_t lat_cap;
    size_t lat_n;
    uint64_t lat_count; /* samples taken */
    uint64_t lat_sum;
    uint64_t rng;
    unsigned retries[BENCH_DEPTH_MAX]; /* resubmissions of batch d (device failures) */
    uint64_t bytes;
    uint64_t requests;
    uint64_t end_ns;
    ote_status_t err;
    char err_what[96];
};

static uint64_t xorshift(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static void worker_fail(worker_t *w, const char *what, ote_status_t st) {
    if (w->err == OTE_OK) {
        w->err = st;
        snprintf(w->err_what, sizeof w->err_what, "%s", what);
    }
    atomic_store(&w->run->failed, 1);
}

/* Submit n requests on batch d. Returns 0, or -1 after worker_fail. */
static int batch_start(worker_t *w, size_t d, size_t n) {
    run_t *r = w->run;
    w->t0[d] = ote_now_ns();
    ote_status_t st = ote_batch_submit(w->batches[d], w->reqs + d * r->batch, n);
    if (st != OTE_OK) {
        worker_fail(w, "ote_batch_submit", st);
        return -1;
    }
    w->n_in[d] = n;
    if (n > w->covered[d]) w->covered[d] = n;
    return 0;
}

/* A batch whose failed requests all ended with this engine's own device failing them
 * (OTE_ERR_FENCED: a CQ lane error, a route change; OTE_ERR_PORT_DOWN), which the
 * engine recovers from (README "RDMA recovery"): it is reset and submitted again, whole
 * (the same bytes to the same slots, so --check still holds), at most
 * BENCH_DEVICE_RETRIES times. Returns 1 when resubmitted, 0 when not, -1 after
 * worker_fail. */
#define BENCH_DEVICE_RETRIES 8
static int batch_resubmit(worker_t *w, size_t d, size_t n) {
    ote_batch_t *b = w->batches[d];
    ote_status_t first = OTE_OK;
    for (size_t i = 0; i < n; i++) {
        ote_transfer_status_t ts;
        if (ote_batch_status(b, i, &ts) != OTE_OK) return 0;
        if (ts.state == OTE_TRANSFER_COMPLETED) continue;
        int code = ote_status_code(ts.error);
        if (ts.state == OTE_TRANSFER_PENDING ||
            (code != OTE_ERR_FENCED && code != OTE_ERR_PORT_DOWN))
            return 0;
        if (first == OTE_OK) first = ts.error;
    }
    if (first == OTE_OK || w->retries[d] >= BENCH_DEVICE_RETRIES) return 0;
    w->retries[d]++;
    fprintf(stderr, "ote_bench: a batch ended %s (this engine's device): resubmitted (%u of %d)\n",
            ote_status_str(first), w->retries[d], BENCH_DEVICE_RETRIES);
    ote_status_t st = ote_batch_reset(b);
    if (st != OTE_OK) {
        worker_fail(w, "ote_batch_reset", st);
        return -1;
    }
    w->n_in[d] = 0;
    return batch_start(w, d, n) == 0 ? 1 : -1;
}

/* --sweep: batch d's target offsets one working set further, back to the start past the
 * last whole working set of the span. Batches never share bytes: each keeps its slot's
 * offset within a working set. */
static void batch_sweep(worker_t *w, size_t d) {
    run_t *r = w->run;
    uint64_t region = r->block * r->batch * r->depth * r->threads;
    uint64_t end = r->sweep_span / region * region;
    if (end <= region) return;
    for (uint64_t j = 0; j < r->batch; j++) {
        ote_request_t *q = &w->reqs[d * r->batch + j];
        uint64_t off = q->remote_addr - r->remote_base + region;
        q->remote_addr = r->remote_base + (off >= end ? off - end : off);
    }
}

/* Wait for batch d, record it when timed, reset it. Returns 0, or -1 after worker_fail. */
static int batch_finish(worker_t *w, size_t d, bool timed) {
    run_t *r = w->run;
    ote_batch_t *b = w->batches[d];
    size_t n = w->n_in[d];
    ote_status_t st = ote_batch_wait(b, r->o->timeout_ns);
    while (st != OTE_OK && ote_status_code(st) != OTE_ERR_TIMEOUT) {
        int again = batch_resubmit(w, d, n);
        if (again < 0) return -1;
        if (again == 0) break;
        st = ote_batch_wait(b, r->o->timeout_ns);
    }
    w->retries[d] = 0;
    uint64_t t1 = ote_now_ns();
    if (st != OTE_OK) {
        if (ote_status_code(st) == OTE_ERR_TIMEOUT) {
            ote_batch_cancel(b);
            ote_batch_wait(b, 10 * OTE_NSEC_PER_SEC);
            worker_fail(w, "a batch passed --timeout", st);
            return -1;
        }
        /* Name the first request that did not complete. */
        for (size_t i = 0; i < n; i++) {
            ote_transfer_status_t ts;
            if (ote_batch_status(b, i, &ts) == OTE_OK && ts.state != OTE_TRANSFER_COMPLETED &&
                ts.error != OTE_OK) {
                char what[96];
                snprintf(what, sizeof what, "request %zu of a batch (state %d)", i, (int)ts.state);
                worker_fail(w, what, ts.error);
                return -1;
            }
        }
        worker_fail(w, "ote_batch_wait", st);
        return -1;
    }
    st = ote_batch_reset(b);
    if (st != OTE_OK) {
        worker_fail(w, "ote_batch_reset", st);
        return -1;
    }
    w->n_in[d] = 0;
    if (r->sweep_span != 0) batch_sweep(w, d);
    if (timed) {
        uint64_t lat = t1 - w->t0[d];
        w->lat_count++;
        w->lat_sum += lat;
        if (w->lat_n < w->lat_cap) {
            w->lat[w->lat_n++] = lat;
        } else {
            uint64_t j = xorshift(&w->rng) % w->lat_count; /* reservoir sampling */
            if (j < w->lat_cap) w->lat[j] = lat;
        }
        w->bytes += n * r->block;
        w->requests += n;
        atomic_fetch_add_explicit(&r->progress_bytes, n * r->block, memory_order_relaxed);
    }
    return 0;
}

/* Requests the next batch may carry: 0 when the run is over. */
static size_t claim(run_t *r) {
    if (atomic_load_explicit(&r->failed, memory_order_relaxed) || bench__stop) return 0;
    if (r->total_ops != 0) {
        uint64_t c = atomic_fetch_add(&r->ops_claimed, r->batch);
        if (c >= r->total_ops) return 0;
        return (size_t)(r->total_ops - c < r->batch ? r->total_ops - c : r->batch);
    }
    return ote_now_ns() < r->deadline_ns ? (size_t)r->batch : 0;
}

static void *worker_main(void *arg) {
    worker_t *w = arg;
    run_t *r = w->run;
    /* Warm-up: every batch once per round, untimed. */
    for (uint64_t i = 0; i < r->o->warmup_batches && !atomic_load(&r->failed) && !bench__stop;
         i++) {
        size_t d = (size_t)(i % r->depth);
        if (batch_start(w, d, (size_t)r->batch) != 0 || batch_finish(w, d, false) != 0) break;
    }

    ote_mutex_lock(&r->mu);
    r->ready++;
    ote_cond_broadcast(&r->cv);
    while (!r->go) ote_cond_wait(&r->cv, &r->mu, ote_deadline_after(OTE_NSEC_PER_SEC));
    ote_mutex_unlock(&r->mu);

    /* Fill the pipeline, then wait for the oldest batch and refill it, until the run is
     * over; batches in flight at the end are waited for and counted. */
    size_t inflight = 0;
    if (!atomic_load(&r->failed)) {
        for (size_t d = 0; d < r->depth; d++) {
            size_t n = claim(r);
            if (n == 0 || batch_start(w, d, n) != 0) break;
            inflight++;
        }
    }
    size_t d = 0;
    while (inflight > 0) {
        while (w->n_in[d] == 0) d = (d + 1) % r->depth;
        if (batch_finish(w, d, true) != 0) break; /* the rest is canceled at destroy */
        inflight--;
        size_t n = claim(r);
        if (n > 0) {
            if (batch_start(w, d, n) != 0) break;
            inflight++;
        }
        d = (d + 1) % r->depth;
    }
    w->end_ns = ote_now_ns();

    ote_mutex_lock(&r->mu);
    r->done++;
    ote_cond_broadcast(&r->cv);
    ote_mutex_unlock(&r->mu);
    return NULL;
}

static void progress_line(const run_t *r, uint64_t now, bool clear) {
    if (clear) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
        return;
    }
    char bs[32];
    double secs = (double)(now - r->start_ns) / 1e9;
    uint64_t moved = atomic_load_explicit(&r->progress_bytes, memory_order_relaxed);
    double gbps = secs > 0 ? (double)moved / secs / 1e9 : 0;
    if (r->total_ops != 0)
        fprintf(stderr, "\r\033[K[ote_bench] %s %s x%" PRIu64 " t%zu: %5.1f%% %.3f GB/s",
                bench_op_name(r->o->op), bench_format_size(r->block, bs, sizeof bs), r->batch,
                r->threads, 100.0 * (double)moved / ((double)r->total_ops * (double)r->block),
                gbps);
    else
        fprintf(stderr, "\r\033[K[ote_bench] %s %s x%" PRIu64 " t%zu: %.1f / %.1f s %.3f GB/s",
                bench_op_name(r->o->op), bench_format_size(r->block, bs, sizeof bs), r->batch,
                r->threads, secs, (double)r->o->duration_ns / 1e9, gbps);
    fflush(stderr);
}

/* Release what bench__run_one allocated for its workers. */
static void free_workers(run_t *r) {
    if (r->w == NULL) return;
    for (size_t i = 0; i < r->threads; i++) {
        worker_t *w = &r->w[i];
        for (size_t d = 0; d < r->depth; d++) {
            ote_batch_t *b = w->batches[d];
            if (b == NULL) continue;
            ote_status_t st = ote_batch_destroy(b);
            if (ote_status_code(st) == OTE_ERR_BUSY) {
                /* Still in flight after a failure elsewhere: cancel, then destroy. */
                ote_batch_cancel(b);
                ote_batch_wait(b, 10 * OTE_NSEC_PER_SEC);
                st = ote_batch_destroy(b);
            }
            if (st != OTE_OK) bench__print_status("ote_batch_destroy", st);
        }
        free(w->reqs);
        free(w->lat);
    }
    free(r->w);
    r->w = NULL;
}

/* Offset of slot j of batch d of thread t, the same on both sides. */
uint64_t bench__slot_offset(const run_t *r, size_t t, size_t d, uint64_t j) {
    return (((uint64_t)t * r->depth + d) * r->batch + j) * r->block;
}

/* Workers of r with their requests and batches. On failure everything allocated here
 * is released again (free_workers) and -1 returned. */
static int prepare_workers(run_t *r, ote_engine_t *engine) {
    const bench_options_t *o = r->o;
    r->w = calloc(r->threads, sizeof r->w[0]);
    if (r->w == NULL) goto err_nomem;
    size_t lat_cap = LAT_SAMPLES_TOTAL / r->threads;
    for (size_t t = 0; t < r->threads; t++) {
        worker_t *w = &r->w[t];
        w->run = r;
        w->idx = t;
        w->rng = 0x9E3779B97F4A7C15ull ^ (t + 1);
        w->reqs = calloc(r->depth * (size_t)r->batch, sizeof w->reqs[0]);
        w->lat = calloc(lat_cap, sizeof w->lat[0]);
        if (w->reqs == NULL || w->lat == NULL) goto err_nomem;
        memset(w->lat, 0, lat_cap * sizeof w->lat[0]); /* fault the pages in now */
        w->lat_cap = lat_cap;
        for (size_t d = 0; d < r->depth; d++) {
            for (uint64_t j = 0; j < r->batch; j++) {
                uint64_t off = bench__slot_offset(r, t, d, j);
                ote_request_t *q = &w->reqs[d * r->batch + j];
                q->opcode = o->op == BENCH_OP_READ ? OTE_READ : OTE_WRITE;
                q->local_addr = r->local + off;
                q->segment = r->seg;
                q->remote_addr = r->remote_base + off;
                q->length = (size_t)r->block;
            }
            ote_status_t st = ote_batch_create(engine, (size_t)r->batch, &w->batches[d]);
            if (st != OTE_OK) {
                bench__print_status("ote_batch_create", st);
                goto err_free;
            }
        }
    }
    return 0;
err_nomem:
    fprintf(stderr, "ote_bench: out of memory preparing a run\n");
err_free:
    free_workers(r);
    return -1;
}

/* One result: threads workers, each keeping `depth` batches of `batch` requests of
 * `block` bytes in flight. Returns 0 and fills res (all but check), or -1 when a transfer
 * failed. */
int bench__run_one(run_t *r, ote_engine_t *engine, bench_result_t *res) {
    const bench_options_t *o = r->o;
    int rc = -1;
    if (prepare_workers(r, engine) != 0) return -1;
    if (ote_mutex_init(&r->mu) != OTE_OK) goto err_free;
    if (ote_cond_init(&r->cv) != OTE_OK) goto err_mutex;
    r->ready = r->done = 0;
    r->go = false;
    atomic_store(&r->ops_claimed, 0);
    atomic_store(&r->progress_bytes, 0);
    atomic_store(&r->failed, 0);

    size_t started = 0;
    for (; started < r->threads; started++) {
        int e = pthread_create(&r->w[started].tid, NULL, worker_main, &r->w[started]);
        if (e != 0) {
            fprintf(stderr, "ote_bench: pthread_create: %s\n", strerror(e));
            atomic_store(&r->failed, 1);
            break;
        }
    }

    bool show = o->progress && isatty(STDERR_FILENO);
    bool shown = false;
    ote_mutex_lock(&r->mu);
    while (r->ready < started) ote_cond_wait(&r->cv, &r->mu, ote_deadline_after(OTE_NSEC_PER_SEC));
    r->start_ns = ote_now_ns();
    r->deadline_ns = r->start_ns + o->duration_ns;
    r->go = true;
    ote_cond_broadcast(&r->cv);
    while (r->done < started) {
        ote_cond_wait(&r->cv, &r->mu, ote_deadline_after(250 * OTE_NSEC_PER_MSEC));
        uint64_t now = ote_now_ns();
        /* Only a run that lasts over 2 s shows it: a short one ends before it appears. */
        if (show && r->done < started && now - r->start_ns > 2 * OTE_NSEC_PER_SEC) {
            progress_line(r, now, false);
            shown = true;
        }
    }
    ote_mutex_unlock(&r->mu);
    for (size_t t = 0; t < started; t++) pthread_join(r->w[t].tid, NULL);
    if (shown) progress_line(r, 0, true);

    /* Results. */
    uint64_t end = r->start_ns, bytes = 0, reqs = 0, count = 0, sum = 0;
    size_t kept = 0;
    for (size_t t = 0; t < started; t++) {
        worker_t *w = &r->w[t];
        if (w->end_ns > end) end = w->end_ns;
        bytes += w->bytes;
        reqs += w->requests;
        count += w->lat_count;
        sum += w->lat_sum;
        kept += w->lat_n;
        for (size_t d = 0; d < r->depth; d++) r->covered[t * r->depth + d] = w->covered[d];
        if (w->err != OTE_OK) {
            char bs[32], what[160];
            snprintf(what, sizeof what, "%s %s x%" PRIu64 " thread %zu: %s", bench_op_name(o->op),
                     bench_format_size(r->block, bs, sizeof bs), r->batch, t, w->err_what);
            bench__print_status(what, w->err);
        }
    }
    if (atomic_load(&r->failed) || started < r->threads || bench__stop) {
        if (bench__stop) fprintf(stderr, "ote_bench: interrupted\n");
        goto err_cond;
    }
    /* All kept samples in one array, sorted once. */
    uint64_t *all = malloc((kept ? kept : 1) * sizeof *all);
    if (all == NULL) goto err_cond;
    size_t k = 0;
    for (size_t t = 0; t < started; t++) {
        memcpy(all + k, r->w[t].lat, r->w[t].lat_n * sizeof *all);
        k += r->w[t].lat_n;
    }
    memset(res, 0, sizeof *res);
    res->transport = o->transport;
    res->op = o->op;
    res->block_size = r->block;
    res->batch_size = r->batch;
    res->threads = r->threads;
    res->bytes = bytes;
    res->requests = reqs;
    res->seconds = (double)(end - r->start_ns) / 1e9;
    bench_latency_summarize(all, kept, sum, count, &res->lat);
    free(all);
    rc = 0;

err_cond:
    ote_cond_destroy(&r->cv);
err_mutex:
    ote_mutex_destroy(&r->mu);
err_free:
    free_workers(r);
    return rc;
}

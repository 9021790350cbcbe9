/*
 * engine/gpu/gpu_stage.c - staging device memory through pinned chunks on copy streams:
 * the source side's bounce buffers, and the requester side's worker that pipelines a
 * staged request's slices (gpu.h; shared state in gpu_internal.h).
 */
#include "engine/gpu/gpu_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/lock.h"
#include "base/log.h"
#include "base/thread.h"
#include "cuda/driver.h"
#include "cuda/ipc/ipc.h"
#include "cuda/memory/device.h"
#include "cuda/memory/memory.h"
#include "cuda/pinned/pinned.h"
#include "cuda/stream/stream.h"
#include "ote/ote.h"

/* One copy on *sp, waited for until dl. On a failure after which the device may still
 * touch the memory, the stream and the chunk are parked (*sp = NULL, *chunk_lost = 1). */
ote_status_t ote__gpu_copy_wait(ote__gpu_t *g, gdev_t *d, ote_cuda_stream_t **sp,
                                ote_cuda_copy_kind_t kind, uint64_t dst, uint64_t src, size_t len,
                                const ote_cuda_chunk_t *chunk, ote_deadline_t dl, int *chunk_lost) {
    ote_cuda_stream_t *s = *sp;
    *chunk_lost = 0;
    ote_status_t st = ote_cuda_stream_copy(s, kind, dst, src, len);
    if (st == OTE_OK) st = ote_cuda_stream_commit(s, NULL, NULL);
    if (st == OTE_OK) st = ote_cuda_stream_wait(s, dl);
    if (st == OTE_OK) return OTE_OK;
    if (ote_cuda_stream_state(s) != OTE_CUDA_STREAM_IDLE) {
        ote__gpu_park(g, d, s, chunk);
        *sp = NULL;
        *chunk_lost = chunk != NULL;
    }
    OTE_WARN_LIMITED("gpu", "cuda:%d: staging copy (%s, %zu bytes) failed: %s",
                     ote_cuda_device_ordinal(d->dev), kind == OTE_CUDA_COPY_DTOH ? "DtoH" : "HtoD",
                     len, ote_status_str(st));
    return st;
}

/* ---- source side ---- */

static ote_status_t src_get(ote__gpu_t *g, uint32_t kind, uint32_t len, int pooled,
                            uint8_t **buf_out, ote__gpu_bounce_t **tok_out);

ote_status_t ote__gpu_src_get(ote__gpu_t *g, uint32_t kind, uint32_t len, ote_deadline_t dl,
                              uint8_t **buf_out, ote__gpu_bounce_t **tok_out) {
    (void)dl; /* never waits for a chunk (see src_get) */
    return src_get(g, kind, len, 0, buf_out, tok_out);
}

ote_status_t ote__gpu_src_get_pooled(ote__gpu_t *g, uint32_t kind, uint32_t len, uint8_t **buf_out,
                                     ote__gpu_bounce_t **tok_out) {
    return src_get(g, kind, len, 1, buf_out, tok_out);
}

static ote_status_t src_get(ote__gpu_t *g, uint32_t kind, uint32_t len, int pooled,
                            uint8_t **buf_out, ote__gpu_bounce_t **tok_out) {
    gdev_t *d = NULL;
    ote_status_t st = ote__gpu_dev_get(g, kind, &d);
    if (st != OTE_OK) return st;
    ote__gpu_bounce_t *t = ote_calloc(1, sizeof(*t));
    if (t == NULL) return OTE_ERR_NOMEM;
    t->d = d;
    /* A pinned chunk when one is free now. A source never waits for one: its chunks are
     * held by answers queued on connections this same thread sends, so waiting could
     * wait for itself. Otherwise heap memory, copied directly (the driver stages
     * pageable memory itself, slower but never stuck). */
    if (len <= g->chunk && ote_cuda_staging_acquire(d->pool, ote_now_ns(), &t->chunk) == OTE_OK) {
        t->has_chunk = 1;
        t->buf = t->chunk.ptr;
    } else if (pooled && len <= g->chunk && atomic_load(&g->nparked) == 0) {
        /* Every chunk is out and will come back: asked again later. With parked work
         * (a copy of unknown outcome holds its chunk, maybe for good) heap is used. */
        ote_free(t);
        return OTE_ERR_AGAIN;
    } else {
        t->buf = ote_malloc(len ? len : 1);
        if (t->buf == NULL) {
            ote_free(t);
            return OTE_ERR_NOMEM;
        }
    }
    *buf_out = t->buf;
    *tok_out = t;
    return OTE_OK;
}

ote_status_t ote__gpu_src_copy(ote__gpu_t *g, ote__gpu_bounce_t *t, int to_device,
                               uint64_t dev_addr, uint32_t len, ote_deadline_t dl) {
    gdev_t *d = t->d;
    /* Work parked by an earlier failure is looked at again here too (a source may have no
     * staging worker). */
    if (atomic_load(&g->nparked) > 0) ote__gpu_reclaim_parked(g);
    atomic_fetch_add(&g->n_src, 1);
    ote_cuda_stream_t *s = NULL;
    ote_status_t st = ote__gpu_stream_get(g, d, &s);
    if (st != OTE_OK) return st;
    ote_cuda_copy_kind_t kind = to_device ? OTE_CUDA_COPY_HTOD : OTE_CUDA_COPY_DTOH;
    int lost = 0;
    uint64_t h = (uintptr_t)t->buf;
    st = ote__gpu_copy_wait(g, d, &s, kind, to_device ? dev_addr : h, to_device ? h : dev_addr, len,
                            t->has_chunk ? &t->chunk : NULL, dl, &lost);
    if (lost) {
        /* Parked with the stream: the device may still touch the chunk. */
        t->has_chunk = 0;
        t->buf = NULL;
    } else if (st != OTE_OK && s == NULL && !t->has_chunk) {
        /* Heap memory the device may still touch: never freed (leaked on purpose, logged). */
        OTE_ERROR("gpu", "a %u-byte bounce buffer is abandoned: the copy into it may still run",
                  len);
        t->buf = NULL;
    }
    ote__gpu_stream_put(g, d, s);
    return st;
}

int ote__gpu_src_chunk(const ote__gpu_bounce_t *t, uint8_t **base_out, uint64_t *size_out) {
    if (t == NULL || !t->has_chunk) return 0;
    *base_out = t->chunk.ptr;
    *size_out = t->chunk.size;
    return 1;
}

void ote__gpu_src_put(ote__gpu_t *g, ote__gpu_bounce_t *t) {
    (void)g;
    if (t == NULL) return;
    if (t->has_chunk) (void)ote_cuda_staging_release(t->d->pool, &t->chunk);
    else ote_free(t->buf);
    ote_free(t);
}

/* ---- requester side: the staging worker ---- */

/* Slice idx of j ends with st; j is freed with its last slice (before that slice's
 * done(), which may free the slices). */
static void job_finish_slice(ote__gpu_t *g, job_t *j, uint32_t idx, ote_status_t st) {
    ote__slice_t *s = &j->slices[idx];
    s->owner = j->owner;
    s->local = (uint8_t *)(uintptr_t)j->dev[idx];
    s->done = j->done;
    s->end_ns = 0; /* it ends now, after its staging copy, not when its transport ended it */
    ote__slice_done_fn done = j->done;
    if (st != OTE_OK && j->fail == OTE_OK) j->fail = st;
    if (--j->left == 0) {
        ote_mutex_lock(&g->mu);
        job_t **pp = &g->jobs;
        while (*pp != NULL && *pp != j) pp = &(*pp)->next;
        if (*pp == j) *pp = j->next;
        g->njobs--;
        ote_mutex_unlock(&g->mu);
        ote__gpu_stream_put(g, j->d, j->stream);
        ote_free(j->dev);
        ote_free(j->chunks);
        ote_free(j->evs);
        ote_free(j);
    }
    done(s, st);
}

/* A slice came back from the transport (worker thread). */
static void job_slice_back(ote__gpu_t *g, job_t *j, uint32_t idx, ote_status_t st) {
    ote_cuda_chunk_t *c = &j->chunks[idx];
    int lost = 0;
    if (!j->write && st == OTE_OK) {
        /* READ: the bytes are in the chunk; copy them to their place on the device. */
        if (j->stream == NULL) st = ote__gpu_stream_get(g, j->d, &j->stream);
        if (st == OTE_OK)
            st = ote__gpu_copy_wait(g, j->d, &j->stream, OTE_CUDA_COPY_HTOD, j->dev[idx],
                                    (uintptr_t)c->ptr, j->slices[idx].len, c,
                                    j->slices[idx].deadline, &lost);
    }
    if (!lost) (void)ote_cuda_staging_release(j->d->pool, c);
    j->inflight--;
    job_finish_slice(g, j, idx, st);
}

static void job_slice_done(ote__slice_t *s, ote_status_t st) {
    job_t *j = s->owner;
    ote__gpu_t *g = j->g;
    uint32_t idx = (uint32_t)(s - j->slices);
    jev_t *ev = &j->evs[idx];
    ev->job = j;
    ev->idx = idx;
    ev->st = st;
    ote_mutex_lock(&g->mu);
    ev->next = g->evq;
    g->evq = ev;
    ote_cond_signal(&g->cv);
    ote_mutex_unlock(&g->mu);
}

/* Start what may start of j. Returns 1 when j waits for a free chunk. May free j (when
 * its last slice ends here), so the caller must not touch j afterwards. */
static int job_pump(ote__gpu_t *g, job_t *j) {
    while (j->next_idx < j->ns && j->inflight < g->depth) {
        uint32_t idx = j->next_idx;
        ote__slice_t *s = &j->slices[idx];
        int canceled = s->canceled != NULL && atomic_load(s->canceled);
        if (j->fail != OTE_OK || canceled) {
            j->next_idx++;
            int last = j->left == 1;
            job_finish_slice(g, j, idx, j->fail != OTE_OK ? j->fail : OTE_ERR_CANCELED);
            if (last) return 0;
            continue;
        }
        if (ote_now_ns() >= s->deadline) {
            j->next_idx++;
            int last = j->left == 1;
            job_finish_slice(g, j, idx, OTE_ERR_TIMEOUT);
            if (last) return 0;
            continue;
        }
        ote_cuda_chunk_t *c = &j->chunks[idx];
        if (ote_cuda_staging_acquire(j->d->pool, ote_now_ns(), c) != OTE_OK) return 1;
        ote_status_t st = OTE_OK;
        int lost = 0;
        if (j->write) {
            if (j->stream == NULL) st = ote__gpu_stream_get(g, j->d, &j->stream);
            if (st == OTE_OK)
                st = ote__gpu_copy_wait(g, j->d, &j->stream, OTE_CUDA_COPY_DTOH, (uintptr_t)c->ptr,
                                        j->dev[idx], s->len, c, s->deadline, &lost);
        }
        j->next_idx++;
        if (st != OTE_OK) {
            if (!lost) (void)ote_cuda_staging_release(j->d->pool, c);
            int last = j->left == 1;
            job_finish_slice(g, j, idx, st);
            if (last) return 0;
            continue;
        }
        j->inflight++;
        s->local = c->ptr;
        s->next = NULL;
        j->submit(j->submit_arg, s);
    }
    return 0;
}

static void *worker_main(void *arg) {
    ote__gpu_t *g = arg;
    ote_mutex_lock(&g->mu);
    for (;;) {
        while (g->newjobs != NULL) {
            job_t *j = g->newjobs;
            g->newjobs = j->next;
            j->next = g->jobs;
            g->jobs = j;
        }
        jev_t *evs = g->evq;
        g->evq = NULL;
        if (evs == NULL && g->stop && g->jobs == NULL && g->src_pending == NULL) break;
        ote_mutex_unlock(&g->mu);
        /* Oldest first: the queue is a stack. */
        jev_t *rev = NULL;
        while (evs != NULL) {
            jev_t *e = evs;
            evs = e->next;
            e->next = rev;
            rev = e;
        }
        while (rev != NULL) {
            jev_t *e = rev;
            rev = e->next;
            job_slice_back(g, e->job, e->idx, e->st);
        }
        /* Pump every job once; a job freed by the pump was unlinked under mu. */
        int waiting = 0;
        ote_mutex_lock(&g->mu);
        size_t n = g->njobs;
        job_t **snap = n > 0 ? ote_malloc(n * sizeof(*snap)) : NULL;
        size_t k = 0;
        for (job_t *j = g->jobs; j != NULL && snap != NULL && k < n; j = j->next) snap[k++] = j;
        ote_mutex_unlock(&g->mu);
        if (n > 0 && snap == NULL) waiting = 1; /* out of memory: try again after a tick */
        for (size_t i = 0; i < k; i++) waiting |= job_pump(g, snap[i]);
        ote_free(snap);
        if (g->nparked > 0) ote__gpu_reclaim_parked(g);
        ote__gpu_src_poll(g); /* the sources' copies (gpu_src_async.c) */
        ote_mutex_lock(&g->mu);
        if (g->evq == NULL && g->newjobs == NULL && !(g->stop && g->jobs == NULL)) {
            if (g->src_pending != NULL) /* a grant's answer waits for each */
                (void)ote_cond_wait(&g->cv, &g->mu, ote_deadline_after(GPU_SRC_TICK_NS));
            else if (waiting || g->nparked > 0)
                (void)ote_cond_wait(&g->cv, &g->mu, ote_deadline_after(GPU_IDLE_TICK_NS));
            else (void)ote_cond_wait(&g->cv, &g->mu, ote_deadline_after(100 * OTE_NSEC_PER_MSEC));
        }
    }
    ote_mutex_unlock(&g->mu);
    return NULL;
}

void ote__gpu_worker_ensure(ote__gpu_t *g) {
    ote_mutex_lock(&g->mu);
    if (!g->thread_started && !g->stop && ote_thread_create(&g->thread, NULL, worker_main, g) == 0)
        g->thread_started = 1;
    if (!g->thread_started)
        OTE_WARN_LIMITED("gpu",
                         "the GPU worker could not start: parked work is looked at "
                         "again by the next copy only (%zu parked)",
                         (size_t)g->nparked);
    ote_cond_signal(&g->cv);
    ote_mutex_unlock(&g->mu);
}

void ote__gpu_stage(ote__gpu_t *g, uint32_t kind, ote__slice_t *slices, uint32_t ns,
                    ote__gpu_submit_fn submit, void *arg) {
    gdev_t *d = NULL;
    ote_status_t st = ote__gpu_dev_get(g, kind, &d);
    job_t *j = st == OTE_OK ? ote_calloc(1, sizeof(*j)) : NULL;
    if (st == OTE_OK && j == NULL) st = OTE_ERR_NOMEM;
    if (j != NULL) {
        j->dev = ote_calloc(ns, sizeof(*j->dev));
        j->chunks = ote_calloc(ns, sizeof(*j->chunks));
        j->evs = ote_calloc(ns, sizeof(*j->evs));
        if (j->dev == NULL || j->chunks == NULL || j->evs == NULL) st = OTE_ERR_NOMEM;
    }
    if (st == OTE_OK) {
        ote_mutex_lock(&g->mu);
        if (!g->thread_started) {
            if (ote_thread_create(&g->thread, NULL, worker_main, g) == 0) g->thread_started = 1;
            else st = OTE_ERR_NOMEM;
        }
        ote_mutex_unlock(&g->mu);
    }
    if (st != OTE_OK) {
        if (j != NULL) {
            ote_free(j->dev);
            ote_free(j->chunks);
            ote_free(j->evs);
            ote_free(j);
        }
        OTE_WARN_LIMITED("gpu", "a request on device memory could not be staged: %s",
                         ote_status_str(st));
        for (uint32_t i = 0; i < ns; i++) slices[i].done(&slices[i], st);
        return;
    }
    atomic_fetch_add(&g->n_staged, 1);
    j->g = g;
    j->d = d;
    j->slices = slices;
    j->ns = j->left = ns;
    j->write = slices[0].op == OTE__SLICE_WRITE;
    j->owner = slices[0].owner;
    j->done = slices[0].done;
    j->submit = submit;
    j->submit_arg = arg;
    for (uint32_t i = 0; i < ns; i++) {
        j->dev[i] = (uintptr_t)slices[i].local;
        slices[i].owner = j;
        slices[i].done = job_slice_done;
    }
    ote_mutex_lock(&g->mu);
    j->next = g->newjobs;
    g->newjobs = j;
    g->njobs++;
    ote_cond_signal(&g->cv);
    ote_mutex_unlock(&g->mu);
}

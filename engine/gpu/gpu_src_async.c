/*
 * engine/gpu/gpu_src_async.c - a source's copy between a bounce buffer and the device,
 * started on a copy stream without waiting: device-to-host into the bounce (the RDMA
 * source's staged grants: the thread that serves the grant request goes on, and the
 * grant is answered when its copy is done) and host-to-device back out of it (a staged
 * WRITE's bytes once its grant ended: the thread that ended the grant goes on, and the
 * COMMIT goes when the copy is done). The GPU worker (gpu_stage.c) polls the running
 * copies every GPU_SRC_TICK_NS and runs each one's done() once it ended: complete, failed
 * (the stream and the chunk parked when the device may still touch the bounce, as a
 * synchronous copy does), or past its deadline (parked too). Once the engine stops, the
 * copies still running are given up the same way (OTE_ERR_CANCELED); the transports wait
 * for their own copies before that.
 */
#include <stdatomic.h>
#include <string.h>

#include "base/alloc.h"
#include "base/fault.h"
#include "base/lock.h"
#include "base/log.h"
#include "base/time.h"
#include "cuda/memory/device.h"
#include "cuda/stream/stream.h"
#include "engine/gpu/gpu_internal.h"
#include "ote/ote.h"

static const char *src_dir(int to_device) { return to_device ? "HtoD" : "DtoH"; }

/* The copy into (to_device: out of) t failed with st on *sp: when the device may still
 * touch the bounce, the stream and the chunk are parked (*sp = NULL) and the bounce lets
 * go of its memory (a heap bounce is abandoned, logged, as ote__gpu_src_copy does). A
 * copy back whose outcome is unknown leaves the device range's bytes unknown: ERROR. */
static void src_lost(ote__gpu_t *g, ote__gpu_bounce_t *t, ote_cuda_stream_t **sp, uint32_t len,
                     int to_device, ote_status_t st) {
    ote_cuda_stream_t *s = *sp;
    if (s != NULL && ote_cuda_stream_state(s) != OTE_CUDA_STREAM_IDLE) {
        ote__gpu_park(g, t->d, s, t->has_chunk ? &t->chunk : NULL);
        *sp = NULL;
        if (!t->has_chunk)
            OTE_ERROR("gpu", "a %u-byte bounce buffer is abandoned: the copy %s it may still run",
                      len, to_device ? "out of" : "into");
        else if (to_device)
            OTE_ERROR("gpu",
                      "cuda:%d: a source's copy back to the device (HtoD, %u bytes) has an "
                      "unknown outcome (%s): its stream and bounce chunk are parked",
                      ote_cuda_device_ordinal(t->d->dev), len, ote_status_str(st));
        t->has_chunk = 0;
        t->buf = NULL;
    }
    OTE_WARN_LIMITED("gpu", "cuda:%d: a source's staging copy (%s, %u bytes) failed: %s",
                     ote_cuda_device_ordinal(t->d->dev), src_dir(to_device), len,
                     ote_status_str(st));
}

ote_status_t ote__gpu_src_copy_start(ote__gpu_t *g, ote__gpu_bounce_t *t, int to_device,
                                     uint64_t dev_addr, uint32_t len, ote_deadline_t dl,
                                     ote__gpu_src_done_fn done, void *arg) {
    if (t == NULL || t->buf == NULL || done == NULL) return OTE_ERR_INVALID;
    src_async_t *p = ote_calloc(1, sizeof(*p));
    if (p == NULL) return OTE_ERR_NOMEM;
    /* The worker polls it: without one, nothing would. */
    ote__gpu_worker_ensure(g);
    ote_mutex_lock(&g->mu);
    int ok = g->thread_started && !g->stop;
    ote_mutex_unlock(&g->mu);
    if (!ok) {
        ote_free(p);
        return OTE_ERR_STATE;
    }
    atomic_fetch_add(&g->n_src, 1);
    ote_cuda_stream_t *s = NULL;
    ote_status_t st = ote__gpu_stream_get(g, t->d, &s);
    if (st == OTE_OK && to_device)
        st = ote_cuda_stream_copy(s, OTE_CUDA_COPY_HTOD, dev_addr, (uintptr_t)t->buf, len);
    else if (st == OTE_OK)
        st = ote_cuda_stream_copy(s, OTE_CUDA_COPY_DTOH, (uintptr_t)t->buf, dev_addr, len);
    if (st == OTE_OK) st = ote_cuda_stream_commit(s, NULL, NULL);
    if (st == OTE_OK) {
        p->t = t;
        p->s = s;
        p->len = len;
        p->to_device = to_device;
        p->dl = dl;
        p->done = done;
        p->arg = arg;
        ote_mutex_lock(&g->mu);
        if (!g->stop) { /* else the worker may be gone: waited for here */
            p->next = g->src_pending;
            g->src_pending = p;
            ote_cond_signal(&g->cv);
            p = NULL;
        }
        ote_mutex_unlock(&g->mu);
        if (p == NULL) return OTE_OK;
        st = ote_cuda_stream_wait(s, dl);
        if (st == OTE_OK) st = OTE_ERR_CANCELED; /* the engine stops: not answered */
    }
    ote_free(p);
    if (s != NULL && ote_cuda_stream_state(s) != OTE_CUDA_STREAM_IDLE)
        src_lost(g, t, &s, len, to_device, st);
    else if (s != NULL)
        OTE_WARN_LIMITED("gpu", "cuda:%d: a source's staging copy (%s, %u bytes) failed: %s",
                         ote_cuda_device_ordinal(t->d->dev), src_dir(to_device), len,
                         ote_status_str(st));
    ote__gpu_stream_put(g, t->d, s);
    return st;
}

void ote__gpu_src_poll(ote__gpu_t *g) {
    ote_mutex_lock(&g->mu);
    src_async_t *list = g->src_pending;
    g->src_pending = NULL;
    int stop = g->stop;
    ote_mutex_unlock(&g->mu);
    if (list == NULL) return;
    src_async_t *keep = NULL, *ended = NULL;
    ote_status_t sts[64];
    size_t nended = 0;
    while (list != NULL) {
        src_async_t *p = list;
        list = p->next;
        ote_status_t st, fst;
        /* gpu.src_copy_pending, gpu.src_copyback_pending: the copy into, or back out
         * of, the bounce is seen still running (tests). */
        if (!p->to_device && ote_fault_hit("gpu.src_copy_pending", &fst)) st = OTE_ERR_AGAIN;
        else if (p->to_device && ote_fault_hit("gpu.src_copyback_pending", &fst))
            st = OTE_ERR_AGAIN;
        else st = ote_cuda_stream_poll(p->s);
        if (st == OTE_ERR_AGAIN && !stop && !ote_deadline_expired(p->dl)) {
            p->next = keep;
            keep = p;
            continue;
        }
        if (nended == sizeof(sts) / sizeof(sts[0])) { /* the rest on the next look */
            p->next = keep;
            keep = p;
            continue;
        }
        if (st == OTE_ERR_AGAIN) st = stop ? OTE_ERR_CANCELED : OTE_ERR_TIMEOUT;
        if (st != OTE_OK) src_lost(g, p->t, &p->s, p->len, p->to_device, st);
        ote__gpu_stream_put(g, p->t->d, p->s);
        p->s = NULL;
        sts[nended++] = st;
        p->next = ended;
        ended = p;
    }
    if (keep != NULL) {
        ote_mutex_lock(&g->mu);
        src_async_t *tail = keep;
        while (tail->next != NULL) tail = tail->next;
        tail->next = g->src_pending;
        g->src_pending = keep;
        ote_mutex_unlock(&g->mu);
    }
    /* ended is in the reverse order of sts. */
    while (ended != NULL) {
        src_async_t *p = ended;
        ended = p->next;
        p->done(p->arg, sts[--nended]);
        ote_free(p);
    }
}

#include "cuda/stream/stream.h"

#include <time.h>

#include "base/alloc.h"
#include "base/log.h"

typedef enum { HOLD_ALLOC = 1, HOLD_HOST = 2, HOLD_CHUNK = 3 } hold_kind_t;

typedef struct {
    hold_kind_t kind;
    void *owner; /* ote_cuda_alloc_t, ote_cuda_host_mem_t or ote_cuda_staging_t */
    ote_cuda_chunk_t chunk;
} hold_t;

struct ote_cuda_stream {
    ote_cuda_device_t *dev;
    ote_cuda_driver_t *drv;
    const ote_cuda_driver_table_t *t;
    ote_cu_stream_t stream; /* NULL once destroyed */
    ote_cu_event_t event;   /* NULL once destroyed */
    ote_cuda_stream_state_t state;
    hold_t *holds;
    size_t n_holds, cap_holds;
    ote__cuda_retained_node_t retained;
};

static void release_holds(ote_cuda_stream_t *s) {
    for (size_t i = 0; i < s->n_holds; i++) {
        hold_t *h = &s->holds[i];
        switch (h->kind) {
            case HOLD_ALLOC: ote_cuda_alloc_release(h->owner); break;
            case HOLD_HOST: ote_cuda_host_mem_release(h->owner); break;
            case HOLD_CHUNK: ote_cuda_staging_release(h->owner, &h->chunk); break;
        }
    }
    s->n_holds = 0;
}

static void to_retained(ote_cuda_stream_t *s) {
    if (s->state == OTE_CUDA_STREAM_RETAINED) return;
    s->state = OTE_CUDA_STREAM_RETAINED;
    ote__cuda_retained_note(s->drv, 1);
    OTE_WARN("cuda", "device %d: copy stream retained with %zu holds (completion unknown)",
             ote_cuda_device_ordinal(s->dev), s->n_holds);
}

/* After a failed enqueue or record: only a successful drain proves that the work already
 * enqueued is done. */
static void drain_after_failure(ote_cuda_stream_t *s) {
    ote_status_t st =
        ote_cuda_check(s->drv, s->t->cuStreamSynchronize(s->stream), "cuStreamSynchronize");
    if (st != OTE_OK) {
        to_retained(s);
        return;
    }
    release_holds(s);
    s->state = OTE_CUDA_STREAM_IDLE;
}

static ote_status_t destroy_natives(ote_cuda_stream_t *s) {
    ote_status_t st = ote_cuda_device_make_current(s->dev);
    if (st != OTE_OK) return st;
    if (s->event != NULL) {
        st = ote_cuda_check(s->drv, s->t->cuEventDestroy(s->event), "cuEventDestroy");
        if (st != OTE_OK) return st;
        s->event = NULL;
    }
    if (s->stream != NULL) {
        st = ote_cuda_check(s->drv, s->t->cuStreamDestroy(s->stream), "cuStreamDestroy");
        if (st != OTE_OK) return st;
        s->stream = NULL;
    }
    return OTE_OK;
}

static void free_struct(ote_cuda_stream_t *s) {
    ote_cuda_device_t *dev = s->dev;
    ote_free(s->holds);
    ote_free(s);
    ote__cuda_device_unref(dev);
}

/* Device reclaim of a parked stream: prove completion, then destroy. */
static ote_status_t stream_retry(void *owner) {
    ote_cuda_stream_t *s = owner;
    if (s->state == OTE_CUDA_STREAM_RETAINED) {
        ote_status_t st = ote_cuda_device_make_current(s->dev);
        if (st != OTE_OK) return st;
        /* The stream, not the event: a failed record leaves work the event does not cover. */
        ote_cu_result_t res = s->t->cuStreamQuery(s->stream);
        if (res != OTE_CU_SUCCESS) return ote_cuda_status(res);
        release_holds(s);
        s->state = OTE_CUDA_STREAM_IDLE;
    }
    ote_status_t st = destroy_natives(s);
    if (st != OTE_OK) return st;
    free_struct(s);
    return OTE_OK;
}

ote_status_t ote_cuda_stream_create(ote_cuda_device_t *dev, ote_cuda_stream_t **stream_out) {
    if (dev == NULL || stream_out == NULL) return OTE_ERR_INVALID;
    ote_cuda_stream_t *s = ote_calloc(1, sizeof(*s));
    if (s == NULL) return OTE_ERR_NOMEM;
    s->dev = dev;
    s->drv = ote_cuda_device_driver(dev);
    s->t = ote_cuda_device_table(dev);
    ote_status_t st = ote_cuda_device_make_current(dev);
    if (st != OTE_OK) goto err_free;
    ote_cu_stream_t cs = NULL;
    st = ote_cuda_check(s->drv, s->t->cuStreamCreate(&cs, OTE_CU_STREAM_NON_BLOCKING),
                        "cuStreamCreate");
    if (st != OTE_OK) goto err_free;
    s->stream = cs;
    ote_cu_event_t ev = NULL;
    st = ote_cuda_check(s->drv, s->t->cuEventCreate(&ev, OTE_CU_EVENT_DISABLE_TIMING),
                        "cuEventCreate");
    if (st != OTE_OK) goto err_stream;
    s->event = ev;
    ote__cuda_device_ref(dev);
    *stream_out = s;
    return OTE_OK;

err_stream:
    if (ote_cuda_check(s->drv, s->t->cuStreamDestroy(s->stream), "cuStreamDestroy") != OTE_OK) {
        /* Nothing was ever enqueued; the stream handle is retained with its owner. */
        ote__cuda_device_ref(dev);
        ote__cuda_device_retain(dev, &s->retained, s, stream_retry,
                                "copy stream (create rollback)");
        return st;
    }
err_free:
    ote_free(s);
    return st;
}

/* A pending unit must be seen complete before the stream takes new work. */
static ote_status_t ready_for_work(ote_cuda_stream_t *s) {
    switch (s->state) {
        case OTE_CUDA_STREAM_IDLE:
        case OTE_CUDA_STREAM_OPEN: return OTE_OK;
        case OTE_CUDA_STREAM_RETAINED: return OTE_ERR_RETAINED;
        case OTE_CUDA_STREAM_PENDING: break;
    }
    ote_status_t st = ote_cuda_stream_poll(s);
    if (st == OTE_OK) return OTE_OK;
    return ote_status_code(st) == OTE_ERR_AGAIN ? OTE_ERR_BUSY : st;
}

ote_status_t ote_cuda_stream_copy(ote_cuda_stream_t *s, ote_cuda_copy_kind_t kind,
                                  ote_cu_deviceptr_t dst, ote_cu_deviceptr_t src, size_t len) {
    if (s == NULL || len == 0) return OTE_ERR_INVALID;
    if (kind != OTE_CUDA_COPY_HTOD && kind != OTE_CUDA_COPY_DTOH && kind != OTE_CUDA_COPY_DTOD)
        return OTE_ERR_INVALID;
    ote_status_t st = ready_for_work(s);
    if (st != OTE_OK) return st;
    st = ote_cuda_device_make_current(s->dev);
    if (st != OTE_OK) return st;
    ote_cu_result_t res;
    const char *call;
    switch (kind) {
        case OTE_CUDA_COPY_HTOD:
            res = s->t->cuMemcpyHtoDAsync(dst, (const void *)(uintptr_t)src, len, s->stream);
            call = "cuMemcpyHtoDAsync";
            break;
        case OTE_CUDA_COPY_DTOH:
            res = s->t->cuMemcpyDtoHAsync((void *)(uintptr_t)dst, src, len, s->stream);
            call = "cuMemcpyDtoHAsync";
            break;
        default:
            res = s->t->cuMemcpyDtoDAsync(dst, src, len, s->stream);
            call = "cuMemcpyDtoDAsync";
            break;
    }
    if (res != OTE_CU_SUCCESS) {
        st = ote_cuda_check(s->drv, res, call);
        if (s->state == OTE_CUDA_STREAM_OPEN) drain_after_failure(s);
        return st;
    }
    s->state = OTE_CUDA_STREAM_OPEN;
    return OTE_OK;
}

static ote_status_t add_hold(ote_cuda_stream_t *s, const hold_t *h) {
    if (s->n_holds == s->cap_holds) {
        size_t cap = s->cap_holds == 0 ? 4 : s->cap_holds * 2;
        hold_t *n = ote_realloc(s->holds, cap * sizeof(*n));
        if (n == NULL) return OTE_ERR_NOMEM;
        s->holds = n;
        s->cap_holds = cap;
    }
    s->holds[s->n_holds++] = *h;
    s->state = OTE_CUDA_STREAM_OPEN;
    return OTE_OK;
}

ote_status_t ote_cuda_stream_hold_alloc(ote_cuda_stream_t *s, ote_cuda_alloc_t *a) {
    if (s == NULL || a == NULL) return OTE_ERR_INVALID;
    ote_status_t st = ready_for_work(s);
    if (st != OTE_OK) return st;
    st = ote_cuda_alloc_acquire(a);
    if (st != OTE_OK) return st;
    hold_t h = {HOLD_ALLOC, a, {0}};
    st = add_hold(s, &h);
    if (st != OTE_OK) ote_cuda_alloc_release(a);
    return st;
}

ote_status_t ote_cuda_stream_hold_host(ote_cuda_stream_t *s, ote_cuda_host_mem_t *m) {
    if (s == NULL || m == NULL) return OTE_ERR_INVALID;
    ote_status_t st = ready_for_work(s);
    if (st != OTE_OK) return st;
    st = ote_cuda_host_mem_acquire(m);
    if (st != OTE_OK) return st;
    hold_t h = {HOLD_HOST, m, {0}};
    st = add_hold(s, &h);
    if (st != OTE_OK) ote_cuda_host_mem_release(m);
    return st;
}

ote_status_t ote_cuda_stream_hold_chunk(ote_cuda_stream_t *s, ote_cuda_staging_t *pool,
                                        const ote_cuda_chunk_t *chunk) {
    if (s == NULL || pool == NULL || chunk == NULL) return OTE_ERR_INVALID;
    ote_status_t st = ready_for_work(s);
    if (st != OTE_OK) return st;
    hold_t h = {HOLD_CHUNK, pool, *chunk};
    return add_hold(s, &h);
}

ote_status_t ote_cuda_stream_commit(ote_cuda_stream_t *s, ote_cuda_stream_done_fn done, void *arg) {
    if (s == NULL) return OTE_ERR_INVALID;
    ote_status_t st = ready_for_work(s);
    if (st != OTE_OK) return st;
    st = ote_cuda_device_make_current(s->dev);
    if (st != OTE_OK) return st;
    if (done != NULL) {
        /* Before the event, so that a completed event proves the callback has run. */
        st = ote_cuda_check(s->drv, s->t->cuLaunchHostFunc(s->stream, done, arg),
                            "cuLaunchHostFunc");
        if (st != OTE_OK) {
            drain_after_failure(s);
            return st;
        }
    }
    st = ote_cuda_check(s->drv, s->t->cuEventRecord(s->event, s->stream), "cuEventRecord");
    if (st != OTE_OK) {
        drain_after_failure(s);
        return st;
    }
    s->state = OTE_CUDA_STREAM_PENDING;
    return OTE_OK;
}

ote_status_t ote_cuda_stream_poll(ote_cuda_stream_t *s) {
    if (s == NULL) return OTE_ERR_INVALID;
    switch (s->state) {
        case OTE_CUDA_STREAM_IDLE: return OTE_OK;
        case OTE_CUDA_STREAM_OPEN: return OTE_ERR_STATE;
        case OTE_CUDA_STREAM_RETAINED: return OTE_ERR_RETAINED;
        case OTE_CUDA_STREAM_PENDING: break;
    }
    ote_status_t st = ote_cuda_device_make_current(s->dev);
    if (st != OTE_OK) return st; /* nothing was asked of the stream: still pending */
    ote_cu_result_t res = s->t->cuEventQuery(s->event);
    if (res == OTE_CU_ERROR_NOT_READY) return OTE_ERR_AGAIN;
    if (res != OTE_CU_SUCCESS) {
        st = ote_cuda_check(s->drv, res, "cuEventQuery");
        to_retained(s);
        return st;
    }
    release_holds(s);
    s->state = OTE_CUDA_STREAM_IDLE;
    return OTE_OK;
}

ote_status_t ote_cuda_stream_wait(ote_cuda_stream_t *s, ote_deadline_t deadline) {
    uint64_t pause_ns = 1000;
    for (;;) {
        ote_status_t st = ote_cuda_stream_poll(s);
        if (ote_status_code(st) != OTE_ERR_AGAIN) return st;
        uint64_t left = ote_deadline_remaining_ns(deadline);
        if (left == 0) return OTE_ERR_TIMEOUT;
        uint64_t ns = pause_ns < left ? pause_ns : left;
        struct timespec ts = {(time_t)(ns / OTE_NSEC_PER_SEC), (long)(ns % OTE_NSEC_PER_SEC)};
        nanosleep(&ts, NULL);
        if (pause_ns < 500 * OTE_NSEC_PER_USEC) pause_ns *= 2;
    }
}

ote_status_t ote_cuda_stream_reclaim(ote_cuda_stream_t *s) {
    if (s == NULL) return OTE_ERR_INVALID;
    if (s->state != OTE_CUDA_STREAM_RETAINED) return OTE_OK;
    ote_status_t st = ote_cuda_device_make_current(s->dev);
    if (st != OTE_OK) return st;
    /* An idle stream proves every piece of work enqueued on it complete, including work a
     * failed record left without an event. */
    ote_cu_result_t res = s->t->cuStreamQuery(s->stream);
    if (res == OTE_CU_ERROR_NOT_READY) return OTE_ERR_AGAIN;
    if (res != OTE_CU_SUCCESS) return ote_cuda_check(s->drv, res, "cuStreamQuery (reclaim)");
    release_holds(s);
    s->state = OTE_CUDA_STREAM_IDLE;
    ote__cuda_retained_note(s->drv, -1);
    OTE_INFO("cuda", "device %d: retained copy stream reclaimed", ote_cuda_device_ordinal(s->dev));
    return OTE_OK;
}

ote_status_t ote_cuda_stream_destroy(ote_cuda_stream_t *s, ote_deadline_t deadline) {
    if (s == NULL) return OTE_OK;
    if (s->state == OTE_CUDA_STREAM_OPEN) {
        /* Work enqueued but never committed: record it so it can be drained. */
        ote_status_t st = ote_cuda_stream_commit(s, NULL, NULL);
        if (st != OTE_OK && s->state == OTE_CUDA_STREAM_OPEN) return st;
    }
    if (s->state == OTE_CUDA_STREAM_PENDING) {
        ote_status_t st = ote_cuda_stream_wait(s, deadline);
        if (st == OTE_ERR_TIMEOUT) return st;
        /* any other failure left the stream retained */
    }
    if (s->state == OTE_CUDA_STREAM_RETAINED) {
        ote__cuda_retained_note(s->drv, -1); /* counted again by the device's list */
        ote__cuda_device_retain(s->dev, &s->retained, s, stream_retry, "copy stream");
        return OTE_ERR_RETAINED;
    }
    ote_status_t st = destroy_natives(s);
    if (st != OTE_OK) {
        ote__cuda_device_retain(s->dev, &s->retained, s, stream_retry, "copy stream handles");
        return ote_status_make(OTE_ERR_RETAINED, ote_status_errno(st));
    }
    free_struct(s);
    return OTE_OK;
}

ote_cuda_stream_state_t ote_cuda_stream_state(const ote_cuda_stream_t *s) { return s->state; }
size_t ote_cuda_stream_holds(const ote_cuda_stream_t *s) { return s->n_holds; }
ote_cu_stream_t ote_cuda_stream_handle(const ote_cuda_stream_t *s) { return s->stream; }
ote_cuda_device_t *ote_cuda_stream_device(const ote_cuda_stream_t *s) { return s->dev; }

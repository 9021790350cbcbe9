/* The fake libcuda's streams and events. Each stream has a worker thread that runs its
 * queued operations in order, each after a random delay of up to max_delay_us, so work
 * that a caller does not wait for really is unfinished when the call returns.
 *
 * Host synchronisation follows CUDA's documented rules: async copies touching only pinned
 * host memory or device memory return at once; an async HtoD from pageable memory stages
 * the source before returning; an async DtoH into pageable memory waits for the stream up
 * to it. The synchronous cuMemcpy* run on the context's legacy stream: DtoH and HtoD from
 * pinned memory return when done, HtoD from pageable memory once staged, DtoD and
 * cuMemsetD8 on device memory at once -- unless the device memory has
 * CU_POINTER_ATTRIBUTE_SYNC_MEMOPS set, then they return complete (what a NIC reading
 * the memory through a dmabuf needs). The legacy stream (NULL, CU_STREAM_LEGACY and, here,
 * CU_STREAM_PER_THREAD) synchronises implicitly with blocking streams (flags 0): an
 * operation on one waits for the work queued before it on the other(s); non-blocking
 * streams never wait for it. The copy gate (fake_cuda_hold_copies) holds copies before
 * they move a byte, as long as a test wants: a slow copy, nothing a GPU could not do.
 * See fake_internal.h. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/cuda/fake/fake_internal.h"

#define FK_STREAM_MAGIC 0x5354524du
#define FK_EVENT_MAGIC 0x45564e54u
/* The longest a synchronize waits before giving up with CUDA_ERROR_LAUNCH_TIMEOUT. */
#define FK_SYNC_LIMIT_NS (120ull * 1000000000ull)

typedef enum { FK_OP_COPY, FK_OP_MEMSET, FK_OP_EVENT, FK_OP_HOSTFN, FK_OP_MARK } fk_op_kind_t;

/* Work queued on another stream before this operation, which it must wait for. */
typedef struct fk_dep {
    struct CUstream_st *s;
    uint64_t seq;
} fk_dep_t;

typedef struct fk_op {
    struct fk_op *next;
    fk_op_kind_t kind;
    uint64_t seq;
    fk_dep_t *deps;
    unsigned ndeps;
    unsigned char value; /* FK_OP_MEMSET */
    char *dst;
    const char *src;
    size_t n;
    fk_region_t *pin[2];
    void *staging;
    struct CUevent_st *ev;
    uint64_t ev_gen;
    CUhostFn fn;
    void *arg;
} fk_op_t;

struct CUstream_st {
    uint32_t magic;
    struct CUstream_st *next; /* fk_g.streams */
    struct CUctx_st *ctx;
    unsigned flags;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* new work, or an operation finished */
    fk_op_t *head, *tail;
    uint64_t enq_seq, done_seq;
    int destroying;   /* cuStreamDestroy called: the handle is dead, the queue drains */
    int exited;       /* the worker has returned */
    int legacy;       /* a context's legacy stream (not a handle; lives until unload) */
    unsigned users;   /* callers between lookup and return */
    unsigned deprefs; /* other streams' operations waiting for this one's work */
    unsigned seed;
};

struct CUevent_st {
    uint32_t magic;
    struct CUevent_st *next; /* fk_g.events */
    struct CUctx_st *ctx;
    unsigned flags;
    uint64_t gen;      /* records issued */
    uint64_t done_gen; /* newest record completed */
    unsigned refs;     /* the handle + queued records */
    int destroyed;
};

static void fk_deadline(struct timespec *ts, uint64_t ns_from_now) {
    clock_gettime(CLOCK_REALTIME, ts);
    uint64_t ns = (uint64_t)ts->tv_nsec + ns_from_now % 1000000000ull;
    ts->tv_sec += (time_t)(ns_from_now / 1000000000ull + ns / 1000000000ull);
    ts->tv_nsec = (long)(ns % 1000000000ull);
}

/* ---- events ---- */

static void fk_event_unref(struct CUevent_st *e) {
    /* ev_mu held */
    if (--e->refs == 0) {
        e->magic = 0;
        free(e);
    }
}

static void fk_event_complete(struct CUevent_st *e, uint64_t gen) {
    pthread_mutex_lock(&fk_g.ev_mu);
    if (gen > e->done_gen) e->done_gen = gen;
    pthread_cond_broadcast(&fk_g.ev_cv);
    fk_event_unref(e);
    pthread_mutex_unlock(&fk_g.ev_mu);
}

/* Finds a live event (ev_mu held). */
static struct CUevent_st *fk_event_find(CUevent h) {
    for (struct CUevent_st *e = fk_g.events; e != NULL; e = e->next)
        if (e == h && !e->destroyed) return e;
    return NULL;
}

/* ---- the worker ---- */

static void fk_op_free(fk_op_t *op) {
    fk__unpin(op->pin[0]);
    fk__unpin(op->pin[1]);
    free(op->staging);
    free(op->deps);
    free(op);
}

static void fk_delay(struct CUstream_st *s) {
    unsigned max = atomic_load(&fk_g.max_delay_us);
    if (max == 0) return;
    unsigned us = (unsigned)rand_r(&s->seed) % (max + 1);
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (long)(us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* ---- the copy gate (fake_cuda_control.h) ---- */

/* A copy about to move its bytes: runs at once while the gate is open or its pass budget
 * lasts, else waits (counted in gate_held) until the gate opens. The caller, a stream
 * worker, holds no lock. */
static void fk_gate(void) {
    pthread_mutex_lock(&fk_g.gate_mu);
    if (fk_g.gate_closed && fk_g.gate_pass > 0) {
        fk_g.gate_pass--;
    } else if (fk_g.gate_closed) {
        fk_g.gate_held++;
        fk_g.gate_held_total++;
        while (fk_g.gate_closed) pthread_cond_wait(&fk_g.gate_cv, &fk_g.gate_mu);
        fk_g.gate_held--;
    }
    pthread_mutex_unlock(&fk_g.gate_mu);
}

FK_EXPORT void fake_cuda_hold_copies(unsigned pass) {
    pthread_mutex_lock(&fk_g.gate_mu);
    fk_g.gate_closed = 1;
    fk_g.gate_pass = pass;
    pthread_mutex_unlock(&fk_g.gate_mu);
}

static void fk_gate_open(void) {
    pthread_mutex_lock(&fk_g.gate_mu);
    fk_g.gate_closed = 0;
    fk_g.gate_pass = 0;
    pthread_cond_broadcast(&fk_g.gate_cv);
    pthread_mutex_unlock(&fk_g.gate_mu);
}

FK_EXPORT void fake_cuda_release_copies(void) { fk_gate_open(); }

/* Waits until the stream has finished operation seq (s->mu held). */
static CUresult fk_wait_seq(struct CUstream_st *s, uint64_t seq) {
    struct timespec dl;
    fk_deadline(&dl, FK_SYNC_LIMIT_NS);
    while (s->done_seq < seq) {
        if (pthread_cond_timedwait(&s->cv, &s->mu, &dl) == ETIMEDOUT && s->done_seq < seq)
            return CUDA_ERROR_LAUNCH_TIMEOUT;
    }
    return CUDA_SUCCESS;
}

static void *fk_worker(void *arg) {
    struct CUstream_st *s = arg;
    fk_current = s->ctx; /* host functions run with the stream's context current */
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->head == NULL && !s->destroying) pthread_cond_wait(&s->cv, &s->mu);
        if (s->head == NULL) break;
        fk_op_t *op = s->head; /* stays queued (the stream is busy) while it runs */
        pthread_mutex_unlock(&s->mu);
        /* Implicit synchronisation: work queued earlier on the other stream(s) first. */
        for (unsigned i = 0; i < op->ndeps; i++) {
            struct CUstream_st *o = op->deps[i].s;
            pthread_mutex_lock(&o->mu);
            (void)fk_wait_seq(o, op->deps[i].seq);
            o->deprefs--;
            pthread_mutex_unlock(&o->mu);
        }
        fk_delay(s);
        if (op->kind == FK_OP_COPY) fk_gate(); /* a held copy is a slow copy */
        switch (op->kind) {
            case FK_OP_COPY: memmove(op->dst, op->src, op->n); break;
            case FK_OP_MEMSET: memset(op->dst, op->value, op->n); break;
            case FK_OP_HOSTFN: op->fn(op->arg); break;
            case FK_OP_EVENT: fk_event_complete(op->ev, op->ev_gen); break;
            case FK_OP_MARK: break;
        }
        fk__unpin(op->pin[0]);
        op->pin[0] = NULL;
        fk__unpin(op->pin[1]);
        op->pin[1] = NULL;
        atomic_fetch_sub(&fk_g.c_pending_ops, 1);
        pthread_mutex_lock(&s->mu);
        s->head = op->next;
        if (s->head == NULL) s->tail = NULL;
        s->done_seq = op->seq;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        fk_op_free(op);
        pthread_mutex_lock(&s->mu);
    }
    s->exited = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (!s->legacy) atomic_fetch_sub(&fk_g.c_streams, 1);
    return NULL;
}

/* Joins and frees destroyed streams whose worker has ended (st_mu held). */
static void fk_reap(void) {
    struct CUstream_st **pp = &fk_g.streams;
    while (*pp != NULL) {
        struct CUstream_st *s = *pp;
        pthread_mutex_lock(&s->mu);
        int done = s->destroying && s->exited && s->users == 0 && s->deprefs == 0;
        pthread_mutex_unlock(&s->mu);
        if (!done) {
            pp = &s->next;
            continue;
        }
        *pp = s->next;
        pthread_join(s->thread, NULL);
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        s->magic = 0;
        free(s);
    }
}

FK_HIDDEN void fk__streams_shutdown(void) {
    fk_gate_open(); /* a copy held at the gate would never let its worker end */
    pthread_mutex_lock(&fk_g.st_mu);
    for (struct CUstream_st *s = fk_g.streams; s != NULL; s = s->next) {
        pthread_mutex_lock(&s->mu);
        s->destroying = 1;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
    }
    for (struct CUstream_st *s = fk_g.streams; s != NULL; s = s->next) {
        pthread_mutex_lock(&s->mu);
        while (!s->exited) pthread_cond_wait(&s->cv, &s->mu);
        s->users = 0;
        pthread_mutex_unlock(&s->mu);
    }
    fk_reap();
    for (int d = 0; d < FAKE_CUDA_MAX_DEVICES; d++) fk_g.devs[d].legacy = NULL;
    pthread_mutex_unlock(&fk_g.st_mu);
    pthread_mutex_lock(&fk_g.ev_mu);
    while (fk_g.events != NULL) {
        struct CUevent_st *e = fk_g.events;
        fk_g.events = e->next;
        free(e);
    }
    pthread_mutex_unlock(&fk_g.ev_mu);
}

/* Creates a stream and its worker (st_mu held). */
static CUresult fk_stream_new(struct CUctx_st *ctx, unsigned flags, int legacy,
                              struct CUstream_st **out) {
    struct CUstream_st *s = calloc(1, sizeof(*s));
    if (s == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    s->magic = FK_STREAM_MAGIC;
    s->ctx = ctx;
    s->flags = flags;
    s->legacy = legacy;
    s->seed = (unsigned)fk__now_ns() ^ (unsigned)(uintptr_t)s;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->thread, NULL, fk_worker, s) != 0) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        free(s);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    s->next = fk_g.streams;
    fk_g.streams = s;
    if (!legacy) atomic_fetch_add(&fk_g.c_streams, 1);
    *out = s;
    return CUDA_SUCCESS;
}

static int fk_special_stream(CUstream s);

/* Looks a stream up (the current context's legacy stream for the special handles,
 * created on first use) and takes a user reference on it. */
static CUresult fk_stream_get(CUstream h, struct CUctx_st *ctx, struct CUstream_st **out) {
    CUresult res = CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&fk_g.st_mu);
    struct CUstream_st *s = NULL;
    if (fk_special_stream(h)) {
        s = fk_g.devs[ctx->dev].legacy;
        if (s == NULL) {
            res = fk_stream_new(ctx, CU_STREAM_DEFAULT, 1, &s);
            if (res != CUDA_SUCCESS) s = NULL;
            fk_g.devs[ctx->dev].legacy = s;
        }
    } else {
        s = fk_g.streams;
        while (s != NULL && (s != h || s->legacy)) s = s->next;
    }
    if (s != NULL) {
        pthread_mutex_lock(&s->mu);
        if (!s->destroying) {
            s->users++;
            res = CUDA_SUCCESS;
        } else {
            res = CUDA_ERROR_INVALID_HANDLE;
        }
        pthread_mutex_unlock(&s->mu);
    }
    pthread_mutex_unlock(&fk_g.st_mu);
    if (res == CUDA_SUCCESS) *out = s;
    return res;
}

static void fk_stream_put(struct CUstream_st *s) {
    pthread_mutex_lock(&s->mu);
    s->users--;
    pthread_mutex_unlock(&s->mu);
}

/* Adds a dependency on o's queued work if it has any (st_mu held). */
static void fk_add_dep(fk_op_t *op, struct CUstream_st *o) {
    pthread_mutex_lock(&o->mu);
    if (o->done_seq < o->enq_seq && !o->exited) {
        op->deps[op->ndeps].s = o;
        op->deps[op->ndeps].seq = o->enq_seq;
        op->ndeps++;
        o->deprefs++;
    }
    pthread_mutex_unlock(&o->mu);
}

/* Queues op on s (ownership passes to the stream) after recording what it must wait for
 * on other streams; returns its sequence number, or 0 when out of memory (op kept). */
static uint64_t fk_submit(struct CUstream_st *s, fk_op_t *op) {
    pthread_mutex_lock(&fk_g.st_mu);
    size_t n = 0;
    for (struct CUstream_st *o = fk_g.streams; o != NULL; o = o->next) n++;
    op->deps = calloc(n, sizeof(*op->deps));
    if (op->deps == NULL) {
        pthread_mutex_unlock(&fk_g.st_mu);
        return 0;
    }
    if (s->legacy) {
        for (struct CUstream_st *o = fk_g.streams; o != NULL; o = o->next)
            if (o != s && !o->legacy && o->ctx == s->ctx && o->flags == CU_STREAM_DEFAULT)
                fk_add_dep(op, o);
    } else if (s->flags == CU_STREAM_DEFAULT && fk_g.devs[s->ctx->dev].legacy != NULL) {
        fk_add_dep(op, fk_g.devs[s->ctx->dev].legacy);
    }
    atomic_fetch_add(&fk_g.c_pending_ops, 1);
    pthread_mutex_lock(&s->mu);
    uint64_t seq = op->seq = ++s->enq_seq;
    op->next = NULL;
    if (s->tail != NULL) s->tail->next = op;
    else s->head = op;
    s->tail = op;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_unlock(&fk_g.st_mu);
    return seq; /* op may be run and freed by the worker from here on */
}

/* Queues op and, when wait is set, waits until it has run. Consumes op. */
static CUresult fk_submit_wait(struct CUstream_st *s, fk_op_t *op, int wait) {
    uint64_t seq = fk_submit(s, op);
    if (seq == 0) {
        fk_op_free(op);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (!wait) return CUDA_SUCCESS;
    pthread_mutex_lock(&s->mu);
    CUresult res = fk_wait_seq(s, seq);
    pthread_mutex_unlock(&s->mu);
    return res;
}

static int fk_special_stream(CUstream s) {
    return s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD;
}

/* ---- streams ---- */

CUresult CUDAAPI cuStreamCreate(CUstream *phStream, unsigned int Flags) {
    FK_ENTER(cuStreamCreate);
    struct CUctx_st *ctx = NULL;
    CUresult res = fk__need_ctx(&ctx);
    if (res != CUDA_SUCCESS) return res;
    if (phStream == NULL || (Flags & ~(unsigned)CU_STREAM_NON_BLOCKING) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s = NULL;
    pthread_mutex_lock(&fk_g.st_mu);
    fk_reap();
    res = fk_stream_new(ctx, Flags, 0, &s);
    pthread_mutex_unlock(&fk_g.st_mu);
    if (res != CUDA_SUCCESS) return res;
    *phStream = s;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamDestroy_v2(CUstream hStream) {
    FK_ENTER(cuStreamDestroy);
    CUresult res = fk__need_ctx(NULL);
    if (res != CUDA_SUCCESS) return res;
    pthread_mutex_lock(&fk_g.st_mu);
    struct CUstream_st *s = fk_g.streams;
    while (s != NULL && (s != hStream || s->legacy)) s = s->next;
    res = CUDA_ERROR_INVALID_HANDLE;
    if (s != NULL) {
        pthread_mutex_lock(&s->mu);
        if (!s->destroying) {
            /* Queued work still completes; the worker ends after it and is reaped later. */
            s->destroying = 1;
            pthread_cond_broadcast(&s->cv);
            res = CUDA_SUCCESS;
        }
        pthread_mutex_unlock(&s->mu);
    }
    fk_reap();
    pthread_mutex_unlock(&fk_g.st_mu);
    return res;
}

CUresult CUDAAPI cuStreamQuery(CUstream hStream) {
    FK_ENTER(cuStreamQuery);
    struct CUctx_st *ctx = NULL;
    CUresult res = fk__need_ctx(&ctx);
    if (res != CUDA_SUCCESS) return res;
    struct CUstream_st *s = NULL;
    res = fk_stream_get(hStream, ctx, &s);
    if (res != CUDA_SUCCESS) return res;
    pthread_mutex_lock(&s->mu);
    res = s->done_seq < s->enq_seq ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
    pthread_mutex_unlock(&s->mu);
    fk_stream_put(s);
    return res;
}

CUresult CUDAAPI cuStreamSynchronize(CUstream hStream) {
    FK_ENTER(cuStreamSynchronize);
    struct CUctx_st *ctx = NULL;
    CUresult res = fk__need_ctx(&ctx);
    if (res != CUDA_SUCCESS) return res;
    struct CUstream_st *s = NULL;
    res = fk_stream_get(hStream, ctx, &s);
    if (res != CUDA_SUCCESS) return res;
    if (s->legacy) {
        /* A marker on the legacy stream also waits for the blocking streams. */
        fk_op_t *op = calloc(1, sizeof(*op));
        if (op == NULL) {
            res = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            op->kind = FK_OP_MARK;
            res = fk_submit_wait(s, op, 1);
        }
    } else {
        pthread_mutex_lock(&s->mu);
        res = fk_wait_seq(s, s->enq_seq);
        pthread_mutex_unlock(&s->mu);
    }
    fk_stream_put(s);
    return res;
}

/* Waits for every stream of the current context: the non-blocking ones one by one, then
 * the legacy stream, whose marker also waits for the blocking streams. */
CUresult CUDAAPI cuCtxSynchronize(void) {
    FK_ENTER(cuCtxSynchronize);
    struct CUctx_st *ctx = NULL;
    CUresult res = fk__need_ctx(&ctx);
    if (res != CUDA_SUCCESS) return res;
    size_t n = 0, cap = 0;
    pthread_mutex_lock(&fk_g.st_mu);
    for (struct CUstream_st *o = fk_g.streams; o != NULL; o = o->next) cap++;
    struct CUstream_st **held = calloc(cap > 0 ? cap : 1, sizeof(*held));
    if (held == NULL) {
        pthread_mutex_unlock(&fk_g.st_mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (struct CUstream_st *o = fk_g.streams; o != NULL; o = o->next) {
        if (o->legacy || o->ctx != ctx) continue;
        pthread_mutex_lock(&o->mu);
        if (!o->destroying) {
            o->users++;
            held[n++] = o;
        }
        pthread_mutex_unlock(&o->mu);
    }
    pthread_mutex_unlock(&fk_g.st_mu);
    for (size_t i = 0; i < n; i++) {
        pthread_mutex_lock(&held[i]->mu);
        CUresult r = fk_wait_seq(held[i], held[i]->enq_seq);
        pthread_mutex_unlock(&held[i]->mu);
        if (res == CUDA_SUCCESS) res = r;
        fk_stream_put(held[i]);
    }
    free(held);
    struct CUstream_st *s = NULL;
    CUresult r = fk_stream_get(NULL, ctx, &s);
    if (r == CUDA_SUCCESS) {
        fk_op_t *op = calloc(1, sizeof(*op));
        if (op == NULL) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            op->kind = FK_OP_MARK;
            r = fk_submit_wait(s, op, 1);
        }
        fk_stream_put(s);
    }
    return res != CUDA_SUCCESS ? res : r;
}

CUresult CUDAAPI cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData) {
    FK_ENTER(cuLaunchHostFunc);
    struct CUctx_st *ctx = NULL;
    CUresult res = fk__need_ctx(&ctx);
    if (res != CUDA_SUCCESS) return res;
    if (fn == NULL) return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s = NULL;
    res = fk_stream_get(hStream, ctx, &s);
    if (res != CUDA_SUCCESS) return res;
    fk_op_t *op = calloc(1, sizeof(*op));
    if (op == NULL) {
        fk_stream_put(s);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    op->kind = FK_OP_HOSTFN;
    op->fn = fn;
    op->arg = userData;
    res = fk_submit_wait(s, op, 0);
    fk_stream_put(s);
    return res;
}

/* ---- copies and memset ---- */

static int fk_sync_memops(fk_region_t *r) {
    if (r == NULL) return 0;
    pthread_mutex_lock(&fk_g.mu);
    int v = r->sync_memops != 0;
    pthread_mutex_unlock(&fk_g.mu);
    return v;
}

FK_HIDDEN CUresult fk__copy(uint64_t dst_dev, void *dst_host, uint64_t src_dev,
                            const void *src_host, size_t n, CUstream hStream, int sync_api) {
    struct CUctx_st *ctx = NULL;
    CUresult res = fk__need_ctx(&ctx);
    if (res != CUDA_SUCCESS) return res;
    struct CUstream_st *s = NULL;
    res = fk_stream_get(hStream, ctx, &s);
    if (res != CUDA_SUCCESS) return res;
    fk_op_t *op = calloc(1, sizeof(*op));
    if (op == NULL) {
        fk_stream_put(s);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    op->kind = FK_OP_COPY;
    op->n = n;
    int wait = 0;
    if (dst_host != NULL) {
        int k = fk__classify_host(dst_host, n, &op->pin[0]);
        if (k < 0) res = CUDA_ERROR_INVALID_VALUE;
        op->dst = dst_host;
        /* DtoH: the synchronous call always returns complete, the async one when the
         * destination is pageable. */
        wait = sync_api || k == 0;
    } else {
        res = fk__resolve_device(dst_dev, n, 1, &op->dst, &op->pin[0]);
    }
    if (res == CUDA_SUCCESS && src_host != NULL) {
        int k = fk__classify_host(src_host, n, &op->pin[1]);
        if (k < 0) {
            res = CUDA_ERROR_INVALID_VALUE;
        } else if (k == 0 && n > 0) {
            /* Pageable source: staged before the call returns, copied later. */
            op->staging = malloc(n);
            if (op->staging == NULL) {
                res = CUDA_ERROR_OUT_OF_MEMORY;
            } else {
                memcpy(op->staging, src_host, n);
                op->src = op->staging;
            }
        } else {
            op->src = src_host;
            wait = sync_api; /* HtoD from pinned memory: synchronous for cuMemcpyHtoD */
        }
    } else if (res == CUDA_SUCCESS) {
        char *p = NULL;
        res = fk__resolve_device(src_dev, n, 0, &p, &op->pin[1]);
        op->src = p;
    }
    if (res == CUDA_SUCCESS && sync_api &&
        (fk_sync_memops(op->pin[0]) || fk_sync_memops(op->pin[1])))
        wait = 1; /* CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: synchronous copies always complete */
    if (res != CUDA_SUCCESS || n == 0) {
        fk_op_free(op);
    } else {
        res = fk_submit_wait(s, op, wait); /* op belongs to the stream now */
    }
    fk_stream_put(s);
    return res;
}

FK_HIDDEN CUresult fk__memset(uint64_t dst_dev, unsigned char value, size_t n) {
    struct CUctx_st *ctx = NULL;
    CUresult res = fk__need_ctx(&ctx);
    if (res != CUDA_SUCCESS || n == 0) return res;
    fk_op_t *op = calloc(1, sizeof(*op));
    if (op == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    op->kind = FK_OP_MEMSET;
    op->n = n;
    op->value = value;
    res = fk__resolve_device(dst_dev, n, 1, &op->dst, &op->pin[0]);
    if (res != CUDA_SUCCESS) {
        fk_op_free(op);
        return res;
    }
    /* Asynchronous on device memory, synchronous on pinned host memory (UVA). */
    int host = op->pin[0]->kind == FK_HOST_ALLOC || op->pin[0]->kind == FK_HOST_REG ||
               fk_sync_memops(op->pin[0]);
    struct CUstream_st *s = NULL;
    res = fk_stream_get(NULL, ctx, &s);
    if (res != CUDA_SUCCESS) {
        fk_op_free(op);
        return res;
    }
    res = fk_submit_wait(s, op, host);
    fk_stream_put(s);
    return res;
}

CUresult CUDAAPI cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
                                      CUstream hStream) {
    FK_ENTER(cuMemcpyHtoDAsync);
    if (srcHost == NULL) return CUDA_ERROR_INVALID_VALUE;
    return fk__copy(dstDevice, NULL, 0, srcHost, ByteCount, hStream, 0);
}

CUresult CUDAAPI cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                                      CUstream hStream) {
    FK_ENTER(cuMemcpyDtoHAsync);
    if (dstHost == NULL) return CUDA_ERROR_INVALID_VALUE;
    return fk__copy(0, dstHost, srcDevice, NULL, ByteCount, hStream, 0);
}

CUresult CUDAAPI cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                      size_t ByteCount, CUstream hStream) {
    FK_ENTER(cuMemcpyDtoDAsync);
    return fk__copy(dstDevice, NULL, srcDevice, NULL, ByteCount, hStream, 0);
}

/* ---- events ---- */

CUresult CUDAAPI cuEventCreate(CUevent *phEvent, unsigned int Flags) {
    FK_ENTER(cuEventCreate);
    struct CUctx_st *ctx = NULL;
    CUresult res = fk__need_ctx(&ctx);
    if (res != CUDA_SUCCESS) return res;
    if (phEvent == NULL || (Flags & ~(unsigned)(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING |
                                                CU_EVENT_INTERPROCESS)) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUevent_st *e = calloc(1, sizeof(*e));
    if (e == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    e->magic = FK_EVENT_MAGIC;
    e->ctx = ctx;
    e->flags = Flags;
    e->refs = 1;
    pthread_mutex_lock(&fk_g.ev_mu);
    e->next = fk_g.events;
    fk_g.events = e;
    pthread_mutex_unlock(&fk_g.ev_mu);
    atomic_fetch_add(&fk_g.c_events, 1);
    *phEvent = e;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventDestroy_v2(CUevent hEvent) {
    FK_ENTER(cuEventDestroy);
    CUresult res = fk__need_ctx(NULL);
    if (res != CUDA_SUCCESS) return res;
    pthread_mutex_lock(&fk_g.ev_mu);
    struct CUevent_st **pp = &fk_g.events;
    while (*pp != NULL && (*pp != hEvent || (*pp)->destroyed)) pp = &(*pp)->next;
    struct CUevent_st *e = *pp;
    if (e == NULL) {
        pthread_mutex_unlock(&fk_g.ev_mu);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    *pp = e->next;
    e->destroyed = 1;
    fk_event_unref(e); /* queued records keep it until they complete */
    pthread_mutex_unlock(&fk_g.ev_mu);
    atomic_fetch_sub(&fk_g.c_events, 1);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream) {
    FK_ENTER(cuEventRecord);
    struct CUctx_st *ctx = NULL;
    CUresult res = fk__need_ctx(&ctx);
    if (res != CUDA_SUCCESS) return res;
    struct CUstream_st *s = NULL;
    res = fk_stream_get(hStream, ctx, &s);
    if (res != CUDA_SUCCESS) return res;
    fk_op_t *op = calloc(1, sizeof(*op));
    if (op == NULL) {
        fk_stream_put(s);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&fk_g.ev_mu);
    struct CUevent_st *e = fk_event_find(hEvent);
    if (e != NULL) {
        op->kind = FK_OP_EVENT;
        op->ev = e;
        op->ev_gen = ++e->gen;
        e->refs++; /* the queued record's reference */
    }
    pthread_mutex_unlock(&fk_g.ev_mu);
    if (e == NULL) {
        free(op);
        fk_stream_put(s);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    uint64_t gen = op->ev_gen;
    res = fk_submit_wait(s, op, 0);
    if (res != CUDA_SUCCESS) {
        /* Not queued: the record never happened. */
        pthread_mutex_lock(&fk_g.ev_mu);
        if (e->gen == gen) e->gen--;
        fk_event_unref(e);
        pthread_mutex_unlock(&fk_g.ev_mu);
    }
    fk_stream_put(s);
    return res;
}

CUresult CUDAAPI cuEventQuery(CUevent hEvent) {
    FK_ENTER(cuEventQuery);
    CUresult res = fk__need_ctx(NULL);
    if (res != CUDA_SUCCESS) return res;
    pthread_mutex_lock(&fk_g.ev_mu);
    struct CUevent_st *e = fk_event_find(hEvent);
    if (e == NULL) res = CUDA_ERROR_INVALID_HANDLE;
    else res = e->done_gen < e->gen ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
    pthread_mutex_unlock(&fk_g.ev_mu);
    return res;
}

CUresult CUDAAPI cuEventSynchronize(CUevent hEvent) {
    FK_ENTER(cuEventSynchronize);
    CUresult res = fk__need_ctx(NULL);
    if (res != CUDA_SUCCESS) return res;
    struct timespec dl;
    fk_deadline(&dl, FK_SYNC_LIMIT_NS);
    pthread_mutex_lock(&fk_g.ev_mu);
    struct CUevent_st *e = fk_event_find(hEvent);
    if (e == NULL) {
        pthread_mutex_unlock(&fk_g.ev_mu);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    uint64_t want = e->gen;
    e->refs++; /* a concurrent destroy must not free it under us */
    while (e->done_gen < want) {
        if (pthread_cond_timedwait(&fk_g.ev_cv, &fk_g.ev_mu, &dl) == ETIMEDOUT &&
            e->done_gen < want) {
            res = CUDA_ERROR_LAUNCH_TIMEOUT;
            break;
        }
    }
    fk_event_unref(e);
    pthread_mutex_unlock(&fk_g.ev_mu);
    return res;
}

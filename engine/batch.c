/*
 * engine/batch.c - batches: submit validates every request, plans its slices, reserves
 * the slots under the batch mutex and hands one list of slices per segment to the
 * transport; completion is lock-free per slice and per request, and only the request
 * that ends the batch takes the mutex (to wake waiters and decide attached
 * notifications). Also status, wait (a short poll before sleeping), cancel, reset and
 * destroy.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "base/time.h"
#include "engine/core_internal.h"
#include "engine/notify_internal.h"
#include "engine/registry_internal.h"
#include "engine/stats_internal.h"

#define BATCH_SPIN_MAX_NS (500u * 1000u)

ote_status_t ote_batch_create(ote_engine_t *e, size_t capacity, ote_batch_t **batch_out) {
    if (e == NULL || batch_out == NULL || capacity == 0 || capacity > (1u << 24))
        return OTE_ERR_INVALID;
    if (OTE__ENGINE_GONE(e)) return OTE_ERR_STATE;
    ote_batch_t *b = ote_calloc(1, sizeof(*b));
    if (b == NULL) return OTE_ERR_NOMEM;
    b->reqs = ote_calloc(capacity, sizeof(*b->reqs));
    if (b->reqs == NULL) {
        ote_free(b);
        return OTE_ERR_NOMEM;
    }
    ote_status_t st = ote_mutex_init(&b->mu);
    if (st == OTE_OK) {
        st = ote_cond_init(&b->cv);
        if (st != OTE_OK) ote_mutex_destroy(&b->mu);
    }
    if (st != OTE_OK) {
        ote_free(b->reqs);
        ote_free(b);
        return st;
    }
    b->e = e;
    b->cap = capacity;
    atomic_fetch_add(&e->nbatches, 1);
    *batch_out = b;
    return OTE_OK;
}

/* One request of b ended. The last one takes the mutex so that a thread that sees
 * pending == 0 under it knows every completer is done with the batch. */
static void batch_end_one(ote_batch_t *b) {
    size_t old = atomic_load(&b->pending);
    while (old > 1)
        if (atomic_compare_exchange_weak(&b->pending, &old, old - 1)) return;
    ote_mutex_lock(&b->mu);
    ote__nout_t *send = NULL;
    if (atomic_fetch_sub(&b->pending, 1) == 1) {
        send = ote__batch_decide_notes(b);
        ote_cond_broadcast(&b->cv);
    }
    ote_mutex_unlock(&b->mu);
    ote__notes_send(send);
}

/* r ended; end_ns: when (a transport's stamp of its last slice), 0: now. */
static void req_finalize(ote__req_t *r, uint64_t end_ns) {
    ote_status_t err = atomic_load(&r->error);
    int state;
    switch (ote_status_code(err)) {
        case OTE_OK: state = OTE_TRANSFER_COMPLETED; break;
        case OTE_ERR_CANCELED: state = OTE_TRANSFER_CANCELED; break;
        case OTE_ERR_TIMEOUT: state = OTE_TRANSFER_TIMEOUT; break;
        default: state = OTE_TRANSFER_FAILED; break;
    }
    ote_segment_t *seg = r->seg;
    /* Timed and counted before the state is published and before the segment's pending
     * count drops (its close folds the counters, stats.c); first, so that the end time
     * need not outlive a call. */
    uint64_t now = end_ns != 0 ? end_ns : ote_now_ns();
    uint64_t t0 = atomic_load_explicit(&r->t_submit, OTE__RELAXED);
    atomic_store_explicit(&r->t_end, now, OTE__RELAXED);
    ote__stats_ended(&seg->c, r->op, state, atomic_load_explicit(&r->bytes_done, OTE__RELAXED),
                     now - t0);
    ote__reg_t *pin = r->local_pin;
    r->local_pin = NULL;
    if (r->many != NULL) { /* a multi-slice request's array (a call less for the others) */
        ote_free(r->many);
        r->many = NULL;
    }
    ote_batch_t *b = r->b;
    atomic_store(&r->state, state);
    /* The local registration's pin goes after the final state is visible: once its
     * unregister answers OK, no request that used it still reads PENDING. (The batch
     * cannot be reset or destroyed before batch_end_one below.) */
    if (pin) ote__reg_unpin(b->e, pin);
    atomic_fetch_sub(&seg->pending, 1);
    batch_end_one(b);
}

static void staged_submit(void *arg, ote__slice_t *s);

/* req_slice_done's rare cases, one test there: s tried CUDA IPC (ipc_try) or came from
 * the local file segment (file_io). 1: s went on to be staged (nothing else to do). */
static int slice_done_rare(ote__req_t *r, ote__slice_t *s, ote_status_t st) {
    if (s->ipc_try && ote_status_code(st) == OTE_ERR_UNSUPPORTED) {
        /* The source declined CUDA IPC for this piece of local device memory (no
         * OTE_PERM_IPC there, host memory there, or ipc not allowed there) and touched
         * nothing: it is staged instead, when gpu_paths allows staging. */
        ote_engine_t *e = r->b->e;
        uint32_t kind = s->local_kind;
        s->ipc_try = 0;
        s->local_kind = OTE_MEM_HOST;
        if (ote__gpu_path_check(e->gpu, kind, -1, "a request's local buffer (ipc declined)") ==
            OTE_OK) {
            /* A request of its own at the source: the declined piece was accounted for
             * there (served), so the staged one must not count against its request. */
            s->req_uid = atomic_fetch_add_explicit(&e->next_uid, 1, memory_order_relaxed) + 1;
            s->req_remote = s->remote;
            s->req_len = s->len;
            ote__gpu_stage(e->gpu, kind, s, 1, staged_submit, r->seg);
            return 1;
        }
    }
    s->ipc_try = 0;
    if (s->file_io != 0) atomic_fetch_or_explicit(&r->file_io, s->file_io, OTE__RELAXED);
    return 0;
}

static void req_slice_done(ote__slice_t *s, ote_status_t st) {
    ote__req_t *r = s->owner;
    if (__builtin_expect((s->ipc_try | s->file_io) != 0, 0) && slice_done_rare(r, s, st)) return;
    if (st == OTE_OK) {
        atomic_fetch_add_explicit(&r->bytes_done, s->len, memory_order_relaxed);
    } else {
        ote_status_t zero = OTE_OK;
        atomic_compare_exchange_strong(&r->error, &zero, st);
        ote__stats_unmoved(&r->seg->c, s->len);
    }
    if (atomic_fetch_sub(&r->left, 1) == 1) req_finalize(r, s->end_ns);
}

/* How one request is cut: ns slices of ssz bytes, the last one taking the rest. Computed
 * once per request and used for both the allocation and the slices themselves: the
 * peer's limit may change under us (a reconnect), and the two must agree. */
typedef struct {
    ote__slice_t *arr; /* ns > 1: the request's slice array */
    uint64_t ssz;
    uint32_t ns;
    uint32_t kind; /* memory kind of the local buffer (ote_mem_kind_t) */
    int ipc;       /* device memory tried through the transport's device path first (CUDA
                    * IPC, GPUDirect Storage), not staged up front */
    int direct;    /* planning: the local buffer's registration has dma-buf MRs */
    /* The registration holding the local buffer, pinned (inuse) when it was found: the
     * request's local_pin once started, unpinned by batch_submit if the submit fails. */
    ote__reg_t *pin;
} req_plan_t;

/* The slice geometry of a `length`-byte request to seg. A slice is at most half the
 * peer's max_data, so the last one (ssz plus a folded tail shorter than ssz / 2) stays
 * under it. OTE_ERR_TOO_BIG when the request would need more than UINT32_MAX slices;
 * OTE_ERR_PROTOCOL when the transport reports a peer limit too small to slice by (the
 * handshake refuses such peers; this keeps the slice size from ever being 0). */
static ote_status_t req_plan(ote_segment_t *seg, uint64_t length, uint32_t kind, req_plan_t *out) {
    uint64_t ssz = seg->e->cfg.slice_size;
    uint64_t mx = (uint64_t)seg->tp->ops->peer_max_slice(seg->peer) / 2;
    if (mx < ssz) ssz = mx;
    /* Device memory is staged: each slice fits one pinned chunk, and no tail is folded. */
    int staged = OTE_MEM_IS_CUDA(kind);
    if (staged && ote__gpu_max_slice(seg->e->gpu) < ssz) ssz = ote__gpu_max_slice(seg->e->gpu);
    if (ssz == 0) {
        OTE_ERROR("engine", "segment %s: the transport reports a slice limit of %llu bytes",
                  seg->name, (unsigned long long)mx * 2);
        return OTE_ERR_PROTOCOL;
    }
    uint64_t n = 1;
    if (length > ssz) {
        n = length / ssz;
        uint64_t tail = length % ssz;
        if (tail != 0 && (staged || tail >= ssz / 2))
            n++; /* a short tail is folded into the last slice */
    }
    if (n > UINT32_MAX) return OTE_ERR_TOO_BIG;
    out->arr = NULL;
    out->ssz = ssz;
    out->ns = (uint32_t)n;
    out->kind = kind;
    out->ipc = 0;
    return OTE_OK;
}

/* Every request is checked before anything happens (OTE_ERR_INVALID), and the batch
 * must have room for all of them (OTE_ERR_TOO_BIG). */
static ote_status_t submit_validate(const ote_batch_t *b, const ote_request_t *reqs, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const ote_request_t *q = &reqs[i];
        if ((q->opcode != OTE_READ && q->opcode != OTE_WRITE) || q->segment == NULL ||
            q->segment->e != b->e || (q->local_addr == NULL && q->length > 0) ||
            (q->length > 0 && (q->remote_addr > UINT64_MAX - q->length ||
                               (uintptr_t)q->local_addr > UINTPTR_MAX - q->length)))
            return OTE_ERR_INVALID;
    }
    if (n > b->cap - atomic_load(&b->nsub)) return OTE_ERR_TOO_BIG;
    return OTE_OK;
}

/* Reconnect lost peers before anything is reserved. */
static ote_status_t submit_ensure_peers(ote_engine_t *e, const ote_request_t *reqs, size_t n) {
    (void)e; /* each segment names its own transport */
    ote_segment_t *last = NULL;
    for (size_t i = 0; i < n; i++) {
        if (reqs[i].segment == last) continue;
        last = reqs[i].segment;
        ote_status_t st = ote__segment_ensure(last);
        if (st != OTE_OK) return st;
    }
    return OTE_OK;
}

/* Each request's geometry (once) and the slice arrays of multi-slice requests, all
 * before anything starts. Every plans[i] is set, also after a failure, so that the
 * caller can free the arrays that were allocated and drop the pins that were taken. */
#define KIND_UNKNOWN UINT32_MAX

static ote_status_t submit_plan(ote_engine_t *e, const ote_request_t *reqs, size_t n,
                                req_plan_t *plans) {
    ote_status_t st = OTE_OK;
    /* The local buffers' memory kinds: their registrations', found (and pinned: one
     * lookup per request) under one hold of reg_lk for the whole batch (consecutive
     * requests mostly share a registration); the others are asked of engine/gpu after the
     * lock: host memory while no CUDA driver is loaded (looked at once per submit), else
     * classified. */
    int locked = atomic_load_explicit(&e->nregs_hint, memory_order_relaxed) > 0;
    if (locked) pthread_rwlock_rdlock(&e->reg_lk);
    const ote__reg_t *near = NULL;
    for (size_t i = 0; i < n; i++) {
        plans[i] = (req_plan_t){NULL, 0, 1, KIND_UNKNOWN, 0, 0, NULL};
        if (!locked || reqs[i].length == 0) continue;
        ote__reg_t *r =
            ote__reg_covering_near(e, (uintptr_t)reqs[i].local_addr, reqs[i].length, near);
        if (r != NULL) {
            atomic_fetch_add(&r->inuse, 1);
            plans[i].pin = r;
            plans[i].kind = r->pin.kind;
            plans[i].direct = r->direct;
            near = r;
        }
    }
    if (locked) pthread_rwlock_unlock(&e->reg_lk);
    int drv = -1;
    for (size_t i = 0; i < n; i++) {
        uint32_t kind = plans[i].kind;
        plans[i].kind = OTE_MEM_HOST;
        if (reqs[i].length == 0 || st != OTE_OK) continue;
        if (kind == KIND_UNKNOWN) {
            if (drv < 0) drv = ote__gpu_driver_present(e->gpu);
            kind = OTE_MEM_HOST;
            if (drv)
                st = ote__gpu_classify(e->gpu, (uintptr_t)reqs[i].local_addr, reqs[i].length, 0,
                                       &kind);
        }
        /* CUDA IPC first where the segment's connection carries it (shm, both ends allow
         * ipc): the source decides per piece, and a piece it declines is staged. Otherwise
         * device memory needs a GPU path that gpu_paths allows, else the submit fails here. */
        const ote__transport_ops_t *ops = reqs[i].segment->tp->ops;
        /* GPUDirect RDMA: a local device buffer inside a registration with dma-buf MRs, on
         * a segment of the transport that holds them, moves as it is (the transport finds
         * its MR like a host one): nothing is staged. */
        int direct = st == OTE_OK && OTE_MEM_IS_CUDA(kind) && plans[i].direct &&
                     ote__gpu_direct_allowed(e->gpu) && ops->mem_register_dmabuf != NULL;
        plans[i].direct = direct; /* from here: the request takes the direct path */
        if (direct) kind = OTE_MEM_HOST;
        int ipc = st == OTE_OK && OTE_MEM_IS_CUDA(kind) && ote__gpu_ipc_allowed(e->gpu) &&
                  ops->ipc_ready != NULL && ops->ipc_ready(reqs[i].segment->peer);
        /* GPUDirect Storage (the local segment, engine/file/gds.c): tried like IPC, a
         * slice it declines is staged. */
        if (!ipc && st == OTE_OK && OTE_MEM_IS_CUDA(kind) && ops->gds_ready != NULL)
            ipc = ops->gds_ready(reqs[i].segment->peer);
        if (st == OTE_OK && OTE_MEM_IS_CUDA(kind) && !ipc)
            st = ote__gpu_path_check(e->gpu, kind, -1, "a request's local buffer");
        if (st != OTE_OK) continue;
        st = req_plan(reqs[i].segment, reqs[i].length, kind, &plans[i]);
        plans[i].ipc = ipc;
        if (st == OTE_OK && plans[i].ns > 1) {
            /* ns <= UINT32_MAX: the product fits a 64-bit size_t. */
            plans[i].arr = ote_malloc((size_t)plans[i].ns * sizeof(ote__slice_t));
            if (plans[i].arr == NULL) st = OTE_ERR_NOMEM;
        }
    }
    return st;
}

/* Reserve n request slots (PENDING) under the batch mutex; *k_out is the first. */
static ote_status_t submit_reserve(ote_batch_t *b, size_t n, size_t *k_out) {
    ote_status_t st = OTE_OK;
    ote_mutex_lock(&b->mu);
    size_t k = atomic_load(&b->nsub);
    if (n > b->cap - k) {
        st = OTE_ERR_TOO_BIG;
    } else {
        /* Relaxed: published by the store of nsub below (seq_cst, a release). */
        for (size_t i = 0; i < n; i++)
            atomic_store_explicit(&b->reqs[k + i].state, OTE_TRANSFER_PENDING, OTE__RELAXED);
        atomic_fetch_add(&b->pending, n);
        atomic_store(&b->nsub, k + n);
        *k_out = k;
    }
    ote_mutex_unlock(&b->mu);
    return st;
}

/* Slices of consecutive requests to one segment, handed to the transport as one list. */
typedef struct {
    ote__slice_t *head, *tail;
    ote_segment_t *seg;
} slice_list_t;

static void slice_list_flush(ote_engine_t *e, slice_list_t *l) {
    (void)e; /* each segment names its own transport */
    if (l->head != NULL) l->seg->tp->ops->submit(l->seg->peer, l->head);
    l->head = l->tail = NULL;
}

/* engine/gpu hands a staged request's slices to the transport one at a time. */
static void staged_submit(void *arg, ote__slice_t *s) {
    ote_segment_t *seg = arg;
    seg->tp->ops->submit(seg->peer, s);
}

/* Fill request slot r for q: its fields, its hold on the segment, and the pin of its
 * plan p (when its local buffer lies in a registration). */
static void req_init(ote__req_t *r, ote_batch_t *b, const ote_request_t *q, const req_plan_t *p,
                     uint64_t now) {
    r->b = b;
    atomic_store_explicit(&r->t_submit, now, OTE__RELAXED);
    atomic_store_explicit(&r->tpid, q->segment->tpid, OTE__RELAXED);
    r->seg = q->segment;
    r->op = q->opcode;
    r->local = q->local_addr;
    r->remote = q->remote_addr;
    r->length = q->length;
    /* Relaxed: the slot is not read for these before its slices reach the transport
     * (under the transport's lock) or before its state says it ended (seq_cst). */
    atomic_store_explicit(&r->error, OTE_OK, OTE__RELAXED);
    atomic_store_explicit(&r->bytes_done, 0, OTE__RELAXED);
    atomic_store_explicit(&r->canceled, 0, OTE__RELAXED);
    atomic_store_explicit(&r->file_io, 0, OTE__RELAXED);
    r->local_pin = p->pin;
    r->many = p->arr;
    atomic_fetch_add(&q->segment->pending, 1);
    ote__stats_submitted(&q->segment->c, (int)q->opcode, q->length); /* before it can end */
}

/* The locality of a request's local memory in registration lp: its GPU for device memory
 * that moves as it is (not staged: GPUDirect or CUDA IPC), else its NUMA node (-1:
 * unknown). The registration's pin.loc (ote__mem_loc, set at registration) is that
 * already for host memory and unstaged device memory; the rest is worked out here. */
static int req_loc(const ote__reg_t *lp, int staged) {
    int loc = lp->pin.loc;
    if (loc >= 0 && (loc < OTE__LOC_GPU0 || !staged)) return loc;
    int node = lp->numa < OTE__LOC_GPU0 ? lp->numa : -1;
    if (!staged && OTE_MEM_IS_CUDA(lp->pin.kind) &&
        OTE_MEM_CUDA_DEVICE(lp->pin.kind) < OTE__LOC_GPUS)
        node = OTE__LOC_GPU(OTE_MEM_CUDA_DEVICE(lp->pin.kind));
    return node;
}

/* Cut r (length > 0) into its planned slices and append them to l, handing l to the
 * transport first when it holds another segment's slices. */
static void req_cut(ote__req_t *r, const ote_request_t *q, const req_plan_t *p, ote_deadline_t dl,
                    slice_list_t *l) {
    /* Staged requests are started by submit_start through engine/gpu. */
    int staged = OTE_MEM_IS_CUDA(p->kind) && !p->ipc;
    uint64_t ssz = p->ssz;
    uint32_t ns = p->ns;
    uint64_t uid = atomic_fetch_add_explicit(&r->b->e->next_uid, 1, memory_order_relaxed) + 1;
    atomic_store_explicit(&r->left, ns, OTE__RELAXED); /* published with the slices */
    ote__slice_t *sl = ns > 1 ? r->many : &r->one;
    if (!staged && l->seg != q->segment) slice_list_flush(r->b->e, l);
    if (!staged) l->seg = q->segment;
    /* The locality of the local memory (req_loc), or (no registration; for a transport
     * that ranks devices by it) its NUMA node asked of the kernel once for the request. */
    int node = -1;
    if (r->local_pin != NULL) {
        node = req_loc(r->local_pin, staged);
    } else if (!staged && q->segment->tp->ops->ranks_by_node) {
        node = ote__mem_node(r->b->e, (uintptr_t)q->local_addr, q->length, p->kind);
        if (node >= OTE__LOC_GPU0) node = -1;
    }
    uint64_t off = 0;
    for (uint32_t j = 0; j < ns; j++) {
        ote__slice_t *s = &sl[j];
        uint64_t len = j + 1 == ns ? q->length - off : ssz;
        s->next = NULL;
        s->done = req_slice_done;
        s->owner = r;
        s->canceled = &r->canceled;
        s->local = (uint8_t *)q->local_addr + off;
        s->remote = q->remote_addr + off;
        s->req_remote = q->remote_addr;
        s->req_len = q->length;
        s->req_uid = uid;
        s->len = (uint32_t)len;
        s->op = q->opcode == OTE_WRITE ? OTE__SLICE_WRITE : OTE__SLICE_READ;
        s->mem_loc = (int16_t)node;
        s->ipc_try = (uint8_t)(p->ipc != 0);
        s->file_io = 0;
        s->local_kind = p->ipc ? p->kind : OTE_MEM_HOST;
        s->local_reg = r->local_pin != NULL ? &r->local_pin->pin : NULL;
        s->deadline = dl;
        s->end_ns = 0;
        off += len;
        if (staged) continue;
        if (l->tail) l->tail->next = s;
        else l->head = s;
        l->tail = s;
    }
}

/* Start the n requests reserved at slot k: one list per run of requests to the same
 * segment goes to the transport; zero-length requests complete once no lock is held. */
static void submit_start(ote_batch_t *b, const ote_request_t *reqs, size_t n, size_t k,
                         const req_plan_t *plans) {
    ote_engine_t *e = b->e;
    uint64_t now = ote_now_ns(), tmo = e->cfg.transfer_timeout_ms * OTE_NSEC_PER_MSEC;
    ote_deadline_t dl = tmo > UINT64_MAX - now ? UINT64_MAX : now + tmo;
    slice_list_t l = {NULL, NULL, NULL};
    for (size_t i = 0; i < n; i++) {
        ote__req_t *r = &b->reqs[k + i];
        const ote_request_t *q = &reqs[i];
        req_init(r, b, q, &plans[i], now);
        if (q->length == 0) {
            atomic_store(&r->left, 1);
            continue; /* completed below, after the lock */
        }
        req_cut(r, q, &plans[i], dl, &l);
    }
    slice_list_flush(e, &l);
    for (size_t i = 0; i < n; i++) {
        ote__req_t *r = &b->reqs[k + i];
        if (plans[i].direct) ote__gpu_direct_count(e->gpu);
        if (reqs[i].length == 0) req_finalize(r, 0);
        else if (OTE_MEM_IS_CUDA(plans[i].kind) && !plans[i].ipc)
            ote__gpu_stage(e->gpu, plans[i].kind, plans[i].ns > 1 ? r->many : &r->one, plans[i].ns,
                           staged_submit, reqs[i].segment);
    }
}

static ote_status_t batch_submit(ote_batch_t *b, const ote_request_t *reqs, size_t n) {
    ote_status_t st = submit_validate(b, reqs, n);
    if (st == OTE_OK) st = submit_ensure_peers(b->e, reqs, n);
    if (st != OTE_OK) return st;
    req_plan_t stack_plans[64];
    req_plan_t *plans = n <= 64 ? stack_plans : ote_calloc(n, sizeof(*plans));
    if (plans == NULL) return OTE_ERR_NOMEM;
    size_t k = 0;
    st = submit_plan(b->e, reqs, n, plans);
    if (st == OTE_OK) st = submit_reserve(b, n, &k);
    if (st != OTE_OK) {
        for (size_t i = 0; i < n; i++) { /* what the plans took: arrays, pins */
            ote_free(plans[i].arr);
            if (plans[i].pin != NULL) ote__reg_unpin(b->e, plans[i].pin);
        }
        if (plans != stack_plans) ote_free(plans);
        return st;
    }
    submit_start(b, reqs, n, k, plans);
    if (plans != stack_plans) ote_free(plans);
    return OTE_OK;
}

/* The lines a submit, wait or cancel writes on the caller's thread name the batch's
 * engine (base/log.h's thread tag, put back on return): one store of a thread-local each
 * way per call. */
ote_status_t ote_batch_submit(ote_batch_t *b, const ote_request_t *reqs, size_t n) {
    if (b == NULL || (reqs == NULL && n > 0)) return OTE_ERR_INVALID;
    if (n == 0) return OTE_OK;
    const char *prev = ote_log_set_thread_engine(b->e->log_tag);
    ote_status_t st = batch_submit(b, reqs, n);
    ote_log_set_thread_engine(prev);
    return st;
}

ote_status_t ote_batch_submit_v(ote_batch_t *b, ote_opcode_t opcode, ote_segment_t *seg,
                                const uint64_t *local, const uint64_t *remote, const uint64_t *len,
                                size_t n) {
    if (b == NULL || ((local == NULL || remote == NULL || len == NULL) && n > 0))
        return OTE_ERR_INVALID;
    if (n == 0) return OTE_OK;
    if (n > b->cap) return OTE_ERR_TOO_BIG; /* before an allocation sized by n */
    /* One path for every submission: the arrays become requests, checked and started by
     * ote_batch_submit (a copy of 32 bytes per request, next to what each one costs). */
    ote_request_t stack_reqs[64];
    ote_request_t *reqs = n <= 64 ? stack_reqs : ote_malloc(n * sizeof(*reqs));
    if (reqs == NULL) return OTE_ERR_NOMEM;
    _Static_assert(sizeof(uintptr_t) == sizeof(uint64_t) && sizeof(size_t) == sizeof(uint64_t),
                   "addresses and lengths are 64-bit");
    for (size_t i = 0; i < n; i++)
        reqs[i] =
            (ote_request_t){opcode, (void *)(uintptr_t)local[i], seg, remote[i], (size_t)len[i]};
    ote_status_t st = ote_batch_submit(b, reqs, n);
    if (reqs != stack_reqs) ote_free(reqs);
    return st;
}

/* Request index of b (< cap) as ote_batch_status_ex reports it. */
static void status_read(ote_batch_t *b, size_t index, ote_transfer_status_ex_t *s) {
    memset(s, 0, sizeof(*s));
    s->state = OTE_TRANSFER_WAITING;
    if (index >= atomic_load(&b->nsub)) return;
    ote__req_t *r = &b->reqs[index];
    s->state = (ote_transfer_state_t)atomic_load(&r->state);
    s->bytes_done = atomic_load_explicit(&r->bytes_done, memory_order_relaxed);
    s->transport = atomic_load_explicit(&r->tpid, OTE__RELAXED);
    s->submit_ns = atomic_load_explicit(&r->t_submit, OTE__RELAXED);
    if (s->state != OTE_TRANSFER_PENDING && s->state != OTE_TRANSFER_WAITING) {
        s->error = atomic_load(&r->error);
        s->end_ns = atomic_load_explicit(&r->t_end, OTE__RELAXED);
        s->file_io = atomic_load_explicit(&r->file_io, OTE__RELAXED);
    }
}

ote_status_t ote_batch_status(ote_batch_t *b, size_t index, ote_transfer_status_t *status_out) {
    if (b == NULL || status_out == NULL || index >= b->cap) return OTE_ERR_INVALID;
    ote_transfer_status_ex_t s;
    status_read(b, index, &s);
    *status_out = (ote_transfer_status_t){s.state, s.bytes_done, s.error};
    return OTE_OK;
}

ote_status_t ote_batch_status_ex(ote_batch_t *b, size_t index, ote_transfer_status_ex_t *out) {
    if (b == NULL || out == NULL || index >= b->cap || out->struct_size < OTE_STATS_MIN_SIZE)
        return OTE_ERR_INVALID;
    ote_transfer_status_ex_t s;
    status_read(b, index, &s);
    size_t n = out->struct_size < sizeof(s) ? out->struct_size : sizeof(s);
    s.struct_size = n;
    memcpy(out, &s, n);
    return OTE_OK;
}

static ote_status_t state_error(const ote__req_t *r) {
    ote_status_t err = atomic_load(&r->error);
    return err != OTE_OK ? err : OTE_ERR_STATE;
}

/* Before sleeping, a wait whose batch is likely to end soon (its previous wait took at
 * most BATCH_SPIN_MAX_NS) polls the pending count for about that long (1.5x, at most
 * BATCH_SPIN_MAX_NS, never past the deadline), yielding the CPU between looks: a small
 * batch's completion then costs no sleep and wakeup of the waiter. */
static void batch_spin(ote_batch_t *b, uint64_t now, ote_deadline_t dl) {
    uint64_t hint = atomic_load_explicit(&b->last_wait_ns, memory_order_relaxed);
    if (hint == 0 || hint > BATCH_SPIN_MAX_NS) return;
    uint64_t span = hint + hint / 2;
    if (span > BATCH_SPIN_MAX_NS) span = BATCH_SPIN_MAX_NS;
    ote_deadline_t until = ote_deadline_min(now + span, dl);
    while (atomic_load(&b->pending) > 0 && ote_now_ns() < until) sched_yield();
}

static ote_status_t batch_wait(ote_batch_t *b, uint64_t timeout_ns) {
    ote_deadline_t dl = ote_deadline_after(timeout_ns);
    uint64_t t0 = 0;
    if (atomic_load(&b->pending) > 0) {
        t0 = ote_now_ns();
        batch_spin(b, t0, dl);
    }
    ote_mutex_lock(&b->mu);
    while (atomic_load(&b->pending) > 0) {
        if (ote_cond_wait(&b->cv, &b->mu, dl) == OTE_ERR_TIMEOUT && atomic_load(&b->pending) > 0) {
            ote_mutex_unlock(&b->mu);
            return OTE_ERR_TIMEOUT;
        }
    }
    if (t0 != 0) atomic_store_explicit(&b->last_wait_ns, ote_now_ns() - t0, memory_order_relaxed);
    ote_status_t st = OTE_OK;
    size_t nsub = atomic_load(&b->nsub);
    for (size_t i = 0; i < nsub; i++) {
        if (atomic_load(&b->reqs[i].state) != OTE_TRANSFER_COMPLETED) {
            st = state_error(&b->reqs[i]);
            break;
        }
    }
    int notes = b->sent != NULL;
    ote_mutex_unlock(&b->mu);
    /* The notifications sent after the data: acknowledged or failed before the wait
     * returns (ote_batch_notify_result then has their final outcome). */
    if (notes && ote__batch_wait_notes(b, dl) != OTE_OK) return OTE_ERR_TIMEOUT;
    return st;
}

ote_status_t ote_batch_wait(ote_batch_t *b, uint64_t timeout_ns) {
    if (b == NULL) return OTE_ERR_INVALID;
    const char *prev = ote_log_set_thread_engine(b->e->log_tag);
    ote_status_t st = batch_wait(b, timeout_ns);
    ote_log_set_thread_engine(prev);
    return st;
}

static void batch_cancel(ote_batch_t *b) {
    ote_segment_t *segs[16];
    size_t nsegs = 0;
    int overflow = 0;
    ote_mutex_lock(&b->mu);
    size_t nsub = atomic_load(&b->nsub);
    for (size_t i = 0; i < nsub; i++) {
        ote__req_t *r = &b->reqs[i];
        if (atomic_load(&r->state) != OTE_TRANSFER_PENDING) continue;
        atomic_store(&r->canceled, 1);
        size_t j;
        for (j = 0; j < nsegs && segs[j] != r->seg; j++) {}
        if (j == nsegs) {
            if (nsegs < 16) segs[nsegs++] = r->seg;
            else overflow = 1;
        }
    }
    /* Each segment named is held (its pending count) so that it stays open while its
     * transport is told below, without the batch's mutex: a transport may complete the
     * dropped slices inside cancel (shm does), and the last of them ends the batch,
     * which takes the mutex (batch_end_one); holding it here deadlocked this caller. */
    for (size_t j = 0; j < nsegs; j++) atomic_fetch_add(&segs[j]->pending, 1);
    ote_mutex_unlock(&b->mu);
    /* The transports drop queued slices now; slices on the wire finish first. With many
     * segments, the others see the flag when they next touch the queue. */
    for (size_t j = 0; j < nsegs; j++) {
        segs[j]->tp->ops->cancel(segs[j]->peer);
        atomic_fetch_sub(&segs[j]->pending, 1);
    }
    if (overflow) OTE_DEBUG("engine", "cancel: more than 16 segments; others drop lazily");
}

ote_status_t ote_batch_cancel(ote_batch_t *b) {
    if (b == NULL) return OTE_ERR_INVALID;
    const char *prev = ote_log_set_thread_engine(b->e->log_tag);
    batch_cancel(b);
    ote_log_set_thread_engine(prev);
    return OTE_OK;
}

ote_status_t ote_batch_reset(ote_batch_t *b) {
    if (b == NULL) return OTE_ERR_INVALID;
    ote_mutex_lock(&b->mu);
    if (atomic_load(&b->pending) > 0) {
        ote_mutex_unlock(&b->mu);
        return OTE_ERR_BUSY;
    }
    size_t nsub = atomic_load(&b->nsub);
    for (size_t i = 0; i < nsub; i++) {
        ote__req_t *r = &b->reqs[i];
        atomic_store(&r->state, OTE_TRANSFER_WAITING);
        atomic_store(&r->bytes_done, 0);
        atomic_store(&r->error, OTE_OK);
        r->seg = NULL;
    }
    atomic_store(&b->nsub, 0);
    ote__batch_drop_sent(b);
    ote_mutex_unlock(&b->mu);
    return OTE_OK;
}

ote_status_t ote_batch_destroy(ote_batch_t *b) {
    if (b == NULL) return OTE_ERR_INVALID;
    ote_mutex_lock(&b->mu);
    if (atomic_load(&b->pending) > 0) {
        ote_mutex_unlock(&b->mu);
        return OTE_ERR_BUSY;
    }
    ote__nout_t *notes = b->notes; /* attached to requests never submitted */
    b->notes = NULL;
    ote__batch_drop_sent(b);
    ote_mutex_unlock(&b->mu);
    while (notes) {
        ote__nout_t *n = notes;
        notes = n->next;
        atomic_fetch_sub(&n->seg->notes, 1);
        ote__nout_put(n);
    }
    ote_engine_t *e = b->e;
    ote_cond_destroy(&b->cv);
    ote_mutex_destroy(&b->mu);
    ote_free(b->reqs);
    ote_free(b);
    atomic_fetch_sub(&e->nbatches, 1);
    return OTE_OK;
}

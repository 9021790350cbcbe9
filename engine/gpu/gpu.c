/*
 * engine/gpu/gpu.c - memory kinds and the staging paths of device memory (gpu.h).
 *
 * Locks: g->mu guards the driver pointer's first setting, the devices, their free
 * streams, the parked list and the worker's queues. Driver calls (copies, waits) are
 * made without it. The worker is the only thread that runs a staged request's pipeline;
 * transports only queue completed slices for it (their done() never blocks).
 */
#include "engine/gpu/gpu.h"

#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/lock.h"
#include "base/log.h"
#include "cuda/driver.h"
#include "cuda/ipc/ipc.h"
#include "cuda/memory/device.h"
#include "cuda/memory/memory.h"
#include "cuda/pinned/pinned.h"
#include "cuda/stream/stream.h"
#include "ote/ote.h"

#define GPU_MAX_DEVICES 8
#define GPU_FREE_STREAMS 8
#define GPU_POOL_FACTOR 4 /* chunks per device = GPU_POOL_FACTOR x gpu_staging_depth */
#define GPU_IDLE_TICK_NS (2u * OTE_NSEC_PER_MSEC)
#define GPU_CACHE 8        /* device allocations remembered by the per-request classification */
#define GPU_IPC_EXPORTS 32 /* source: allocations whose IPC description is cached */
#define GPU_IPC_ENTRIES 32 /* requester: open IPC mappings per device, at most */
#define GPU_IPC_BYTES (64ull << 30) /* requester: bytes of open IPC mappings per device */

/* A device allocation a request's local buffer lay in: a later request inside it is
 * classified by one cuPointerGetAttribute(BUFFER_ID) that must return the same id
 * (buffer ids are never reused, so a freed and reallocated range misses). */
typedef struct {
    uint64_t start, size;
    unsigned long long buffer_id;
    uint32_t kind;
    uint64_t used; /* for eviction: least recently used goes */
} cache_ent_t;

/* A stream (and the chunk it was copying into or out of) whose outcome is unknown. */
typedef struct parked {
    struct parked *next;
    struct gdev *d;
    ote_cuda_stream_t *s;
    ote_cuda_chunk_t chunk;
    int has_chunk;
    ote_cuda_ipc_mapping_t *map; /* an IPC copy's mapping, put back when released */
} parked_t;

typedef struct gdev {
    ote_cuda_device_t *dev;
    ote_cuda_staging_t *pool;
    ote_cuda_ipc_cache_t *ipc; /* requester: imports of peers' allocations */
    ote_cuda_stream_t *free_streams[GPU_FREE_STREAMS];
    size_t nfree;
} gdev_t;

/* One staged request. */
typedef struct job job_t;
typedef struct jev {
    struct jev *next;
    job_t *job;
    uint32_t idx;
    ote_status_t st;
} jev_t;

struct job {
    job_t *next;
    ote__gpu_t *g;
    gdev_t *d;
    ote_cuda_stream_t *stream;
    ote__slice_t *slices;
    uint32_t ns, next_idx, inflight, left;
    int write;
    ote_status_t fail; /* first failure: slices not yet staged end with it */
    void *owner;
    ote__slice_done_fn done;
    ote__gpu_submit_fn submit;
    void *submit_arg;
    uint64_t *dev;            /* each slice's device address */
    ote_cuda_chunk_t *chunks; /* each slice's chunk while in flight */
    jev_t *evs;               /* one completion event per slice */
};

/* Source: one allocation's IPC description, exported once. */
typedef struct {
    unsigned long long buffer_id; /* 0: free slot */
    ote_cuda_ipc_export_t *ex;
    uint64_t used;
} ipc_exp_t;

struct ote__gpu_ipc_op {
    struct gdev *d;
    ote_cuda_ipc_mapping_t *map;
    ote_cuda_stream_t *s;
};

struct ote__gpu {
    ote_mutex_t mu;
    ote_cond_t cv;
    ote_cuda_driver_t *drv; /* NULL until device memory was seen */
    _Atomic int drv_ready;
    _Atomic unsigned long long seen_adds; /* dl_iterate_phdr's load count last looked at */
    char libpath[256];
    gdev_t devs[GPU_MAX_DEVICES];
    unsigned paths;
    char paths_text[32];
    uint64_t chunk;
    uint32_t depth;
    parked_t *parked;
    _Atomic size_t nparked;
    cache_ent_t cache[GPU_CACHE]; /* under mu */
    uint64_t cache_clock;
    ipc_exp_t exps[GPU_IPC_EXPORTS]; /* under mu */
    uint64_t exp_clock;
    _Atomic uint64_t n_staged, n_src, n_exports, n_ipc_ok, n_ipc_failed;
    /* worker */
    pthread_t thread;
    int thread_started, stop;
    job_t *jobs;    /* active */
    job_t *newjobs; /* handed over, not yet started by the worker */
    jev_t *evq;     /* completed slices */
    size_t njobs;
};

/* ---- the driver, loaded only when device memory can exist ---- */

static int adds_cb(struct dl_phdr_info *info, size_t size, void *data) {
    if (size >= offsetof(struct dl_phdr_info, dlpi_subs))
        *(unsigned long long *)data = info->dlpi_adds;
    return 1; /* the first object tells the process-wide count */
}

static unsigned long long dl_adds(void) {
    unsigned long long n = 0;
    dl_iterate_phdr(adds_cb, &n);
    return n;
}

/* Load the driver. g->mu held. */
static ote_status_t driver_load_locked(ote__gpu_t *g) {
    if (g->drv != NULL) return OTE_OK;
    ote_cuda_driver_t *drv = NULL;
    ote_status_t st = ote_cuda_driver_load(NULL, &drv);
    if (st != OTE_OK) return st;
    g->drv = drv;
    atomic_store(&g->drv_ready, 1);
    OTE_INFO("gpu", "CUDA driver %s loaded: device memory is classified from now on", g->libpath);
    return OTE_OK;
}

/* Whether the driver is loaded in this process (then it is loaded for the engine too).
 * Cheap when nothing was loaded since the last look: one dl_iterate_phdr step. */
static int driver_present(ote__gpu_t *g) {
    if (atomic_load_explicit(&g->drv_ready, memory_order_acquire)) return 1;
    unsigned long long adds = dl_adds();
    if (adds == atomic_load_explicit(&g->seen_adds, memory_order_relaxed)) return 0;
    int present = 0;
    ote_mutex_lock(&g->mu);
    void *h = dlopen(g->libpath, RTLD_LAZY | RTLD_NOLOAD);
    if (h != NULL) {
        dlclose(h);
        present = driver_load_locked(g) == OTE_OK;
    }
    if (!present) atomic_store(&g->seen_adds, adds);
    ote_mutex_unlock(&g->mu);
    return present;
}

/* Whether the bytes at addr can be read by this process (process_vm_readv of one byte
 * from itself: no signal on an unmapped or PROT_NONE page). Unknown counts as readable. */
static int host_readable(uint64_t addr) {
    char b;
    struct iovec l = {&b, 1}, r = {(void *)(uintptr_t)addr, 1};
    ssize_t n = process_vm_readv(getpid(), &l, 1, &r, 1, 0);
    return n == 1 || (n < 0 && errno != EFAULT);
}

int ote__gpu_driver_present(ote__gpu_t *g) { return driver_present(g); }

ote_status_t ote__gpu_create(const ote__cfg_t *cfg, ote__gpu_t **gpu_out) {
    ote__gpu_t *g = ote_calloc(1, sizeof(*g));
    if (g == NULL) return OTE_ERR_NOMEM;
    ote_status_t st = ote_mutex_init(&g->mu);
    if (st != OTE_OK) {
        ote_free(g);
        return st;
    }
    st = ote_cond_init(&g->cv);
    if (st != OTE_OK) {
        ote_mutex_destroy(&g->mu);
        ote_free(g);
        return st;
    }
    const char *lib = getenv("OTE_CUDA_LIBRARY");
    if (lib == NULL || lib[0] == '\0') lib = "libcuda.so.1";
    size_t l = strlen(lib);
    if (l >= sizeof(g->libpath)) l = sizeof(g->libpath) - 1;
    memcpy(g->libpath, lib, l);
    g->paths = cfg->gpu_paths;
    memcpy(g->paths_text, cfg->gpu_paths_text, sizeof(g->paths_text));
    g->paths_text[sizeof(g->paths_text) - 1] = '\0';
    g->chunk = cfg->gpu_staging_chunk ? cfg->gpu_staging_chunk : (2u << 20);
    g->depth = cfg->gpu_staging_depth ? cfg->gpu_staging_depth : 4;
    atomic_store(&g->seen_adds, ~0ull);
    *gpu_out = g;
    return OTE_OK;
}

/* The cached kind of [addr, addr+len) when a cached allocation holds it and the driver
 * confirms its buffer id; 0 on a miss. */
static int cache_lookup(ote__gpu_t *g, uint64_t addr, uint64_t len, uint32_t *kind_out) {
    cache_ent_t hit;
    int found = 0;
    ote_mutex_lock(&g->mu);
    for (int i = 0; i < GPU_CACHE; i++) {
        cache_ent_t *c = &g->cache[i];
        if (c->size != 0 && addr >= c->start && addr - c->start < c->size &&
            len <= c->size - (addr - c->start)) {
            c->used = ++g->cache_clock;
            hit = *c;
            found = 1;
            break;
        }
    }
    ote_mutex_unlock(&g->mu);
    if (!found) return 0;
    unsigned long long id = 0;
    const ote_cuda_driver_table_t *t = ote_cuda_driver_table(g->drv);
    if (t->cuPointerGetAttribute(&id, OTE_CU_POINTER_ATTRIBUTE_BUFFER_ID, addr) != OTE_CU_SUCCESS ||
        id != hit.buffer_id) {
        /* Freed (and maybe reallocated) since: forget it and ask in full. */
        ote_mutex_lock(&g->mu);
        for (int i = 0; i < GPU_CACHE; i++)
            if (g->cache[i].buffer_id == hit.buffer_id) g->cache[i].size = 0;
        ote_mutex_unlock(&g->mu);
        return 0;
    }
    *kind_out = hit.kind;
    return 1;
}

static void cache_put(ote__gpu_t *g, const ote_cuda_pointer_info_t *info, uint32_t kind) {
    ote_mutex_lock(&g->mu);
    cache_ent_t *victim = &g->cache[0];
    for (int i = 0; i < GPU_CACHE; i++) {
        cache_ent_t *c = &g->cache[i];
        if (c->size != 0 && c->buffer_id == info->buffer_id) {
            victim = c;
            break;
        }
        if (c->size == 0 || c->used < victim->used) victim = c;
    }
    victim->start = info->range_start;
    victim->size = info->range_size;
    victim->buffer_id = info->buffer_id;
    victim->kind = kind;
    victim->used = ++g->cache_clock;
    ote_mutex_unlock(&g->mu);
}

ote_status_t ote__gpu_classify(ote__gpu_t *g, uint64_t addr, uint64_t len, int for_register,
                               uint32_t *kind_out) {
    if (!driver_present(g)) {
        if (!for_register || (host_readable(addr) && host_readable(addr + len - 1))) {
            *kind_out = OTE_MEM_HOST;
            return OTE_OK;
        }
        ote_mutex_lock(&g->mu);
        ote_status_t st = driver_load_locked(g);
        ote_mutex_unlock(&g->mu);
        if (st != OTE_OK) {
            OTE_ERROR("gpu",
                      "register [0x%llx, +%llu): not host memory, and no CUDA driver loads "
                      "(tried %s, from $OTE_CUDA_LIBRARY or libcuda.so.1): %s",
                      (unsigned long long)addr, (unsigned long long)len, g->libpath,
                      ote_status_str(st));
            return ote_status_code(st) == OTE_ERR_NO_DEVICE ? st : OTE_ERR_NO_DEVICE;
        }
    }
    if (!for_register && cache_lookup(g, addr, len, kind_out)) return OTE_OK;
    ote_cuda_pointer_info_t info;
    ote_status_t st = ote_cuda_pointer_classify(g->drv, addr, &info);
    if (st != OTE_OK) return st;
    switch (info.kind) {
        case OTE_CUDA_MEM_PAGEABLE:
        case OTE_CUDA_MEM_PINNED:
            if (for_register && len > 1) {
                /* Host memory must not run into device memory. */
                ote_cuda_pointer_info_t last;
                st = ote_cuda_pointer_classify(g->drv, addr + len - 1, &last);
                if (st != OTE_OK) return st;
                if (last.kind == OTE_CUDA_MEM_DEVICE || last.kind == OTE_CUDA_MEM_MANAGED) {
                    OTE_WARN("gpu",
                             "[0x%llx, +%llu) starts in host memory and ends in device memory",
                             (unsigned long long)addr, (unsigned long long)len);
                    return OTE_ERR_INVALID;
                }
            }
            *kind_out = info.kind == OTE_CUDA_MEM_PINNED ? OTE_MEM_HOST_PINNED : OTE_MEM_HOST;
            return OTE_OK;
        case OTE_CUDA_MEM_MANAGED:
            OTE_WARN("gpu", "[0x%llx, +%llu) is CUDA managed memory: not supported",
                     (unsigned long long)addr, (unsigned long long)len);
            return OTE_ERR_UNSUPPORTED;
        case OTE_CUDA_MEM_DEVICE: break;
    }
    uint64_t end = (uint64_t)info.range_start + info.range_size;
    if (addr < info.range_start || len > end - addr) {
        OTE_WARN("gpu",
                 "[0x%llx, +%llu) crosses the end of its device allocation [0x%llx, +%zu): a "
                 "range must lie within one allocation",
                 (unsigned long long)addr, (unsigned long long)len,
                 (unsigned long long)info.range_start, info.range_size);
        return OTE_ERR_INVALID;
    }
    if (info.device_ordinal < 0 || info.device_ordinal >= GPU_MAX_DEVICES) {
        OTE_WARN("gpu", "device memory of CUDA device %d: at most %d devices are supported",
                 info.device_ordinal, GPU_MAX_DEVICES);
        return OTE_ERR_UNSUPPORTED;
    }
    *kind_out = OTE_MEM_CUDA + (uint32_t)info.device_ordinal;
    if (!for_register) cache_put(g, &info, *kind_out);
    return OTE_OK;
}

/* One WARN site per reason (each rate-limited on its own, so that no reason hides
 * another). */
#define GPU_PATH_WARN(what, kind, g, missing) \
    OTE_WARN_LIMITED("gpu", \
                     "%s is device memory of cuda:%d: no GPU path is possible with " \
                     "gpu_paths=\"%s\" (staging is not allowed; " missing \
                     "; direct is not built yet)", \
                     (what), OTE_MEM_CUDA_DEVICE(kind), (g)->paths_text)

ote_status_t ote__gpu_path_check(ote__gpu_t *g, uint32_t kind, int ipc_optin, const char *what) {
    if (!OTE_MEM_IS_CUDA(kind)) return OTE_OK;
    if (g->paths & OTE__GPU_PATH_STAGING) return OTE_OK;
    /* What ipc lacks here, named in the refusal: the path in gpu_paths, the registration's
     * opt-in, or a peer to take it with. */
    if (!(g->paths & OTE__GPU_PATH_IPC)) GPU_PATH_WARN(what, kind, g, "ipc is not allowed");
    else if (ipc_optin == 0)
        GPU_PATH_WARN(what, kind, g, "ipc needs OTE_PERM_IPC on the registration, which it lacks");
    else if (ipc_optin > 0)
        GPU_PATH_WARN(what, kind, g,
                      "ipc is allowed and opted in to, but the requester did not ask for it "
                      "(not an shm segment, ipc not in its gpu_paths or no CUDA driver there)");
    else
        GPU_PATH_WARN(what, kind, g,
                      "ipc is allowed but needs a same-host shm segment whose peer allows ipc "
                      "and a remote registration with OTE_PERM_IPC");
    return OTE_ERR_UNSUPPORTED;
}

uint64_t ote__gpu_max_slice(const ote__gpu_t *g) { return g->chunk; }

/* ---- devices, streams, parked work ---- */

/* The device of kind, opened on first use; with its staging pool when pool. */
static ote_status_t dev_open(ote__gpu_t *g, uint32_t kind, int pool, gdev_t **out) {
    int ord = OTE_MEM_CUDA_DEVICE(kind);
    if (!OTE_MEM_IS_CUDA(kind) || ord >= GPU_MAX_DEVICES) return OTE_ERR_INVALID;
    ote_status_t st = OTE_OK;
    ote_mutex_lock(&g->mu);
    gdev_t *d = &g->devs[ord];
    if (g->drv == NULL) st = OTE_ERR_NO_DEVICE;
    if (st == OTE_OK && d->dev == NULL) st = ote_cuda_device_open(g->drv, ord, &d->dev);
    if (st == OTE_OK && pool && d->pool == NULL) {
        st = ote_cuda_staging_create(d->dev, g->chunk, GPU_POOL_FACTOR * g->depth, &d->pool);
        if (st != OTE_OK)
            OTE_ERROR("gpu", "cuda:%d: staging pool of %u x %llu bytes: %s", ord,
                      GPU_POOL_FACTOR * g->depth, (unsigned long long)g->chunk, ote_status_str(st));
    }
    ote_mutex_unlock(&g->mu);
    if (st == OTE_OK) *out = d;
    return st;
}

static ote_status_t dev_get(ote__gpu_t *g, uint32_t kind, gdev_t **out) {
    return dev_open(g, kind, 1, out);
}

static ote_status_t stream_get(ote__gpu_t *g, gdev_t *d, ote_cuda_stream_t **out) {
    ote_mutex_lock(&g->mu);
    ote_cuda_stream_t *s = d->nfree > 0 ? d->free_streams[--d->nfree] : NULL;
    ote_mutex_unlock(&g->mu);
    if (s != NULL) {
        *out = s;
        return OTE_OK;
    }
    return ote_cuda_stream_create(d->dev, out);
}

static void stream_put(ote__gpu_t *g, gdev_t *d, ote_cuda_stream_t *s) {
    if (s == NULL) return;
    if (ote_cuda_stream_state(s) == OTE_CUDA_STREAM_IDLE) {
        ote_mutex_lock(&g->mu);
        if (d->nfree < GPU_FREE_STREAMS) {
            d->free_streams[d->nfree++] = s;
            s = NULL;
        }
        ote_mutex_unlock(&g->mu);
    }
    if (s != NULL) (void)ote_cuda_stream_destroy(s, ote_deadline_after(OTE_NSEC_PER_SEC));
}

/* Keep s (and chunk, which its work may still touch) until the driver proves the work
 * complete. */
static void park_map(ote__gpu_t *g, gdev_t *d, ote_cuda_stream_t *s, const ote_cuda_chunk_t *chunk,
                     ote_cuda_ipc_mapping_t *map);
static void park(ote__gpu_t *g, gdev_t *d, ote_cuda_stream_t *s, const ote_cuda_chunk_t *chunk) {
    park_map(g, d, s, chunk, NULL);
}

/* As park; map (an IPC mapping the work reads or writes) stays in use until then. */
static void park_map(ote__gpu_t *g, gdev_t *d, ote_cuda_stream_t *s, const ote_cuda_chunk_t *chunk,
                     ote_cuda_ipc_mapping_t *map) {
    parked_t *p = ote_calloc(1, sizeof(*p));
    OTE_ERROR("gpu", "cuda:%d: a %s copy's outcome is unknown: its stream%s retained",
              ote_cuda_device_ordinal(d->dev), map ? "CUDA IPC" : "staging",
              chunk ? " and pinned chunk are"
              : map ? " and the peer's mapping are"
                    : " is");
    if (p == NULL) {
        /* Out of memory: the stream itself parks on its device (cuda/stream); the chunk
         * stays out of the pool for good. */
        (void)ote_cuda_stream_destroy(s, ote_now_ns());
        return;
    }
    p->d = d;
    p->s = s;
    p->map = map;
    if (chunk) {
        p->chunk = *chunk;
        p->has_chunk = 1;
    }
    ote_mutex_lock(&g->mu);
    p->next = g->parked;
    g->parked = p;
    g->nparked++;
    ote_mutex_unlock(&g->mu);
}

/* Ask the driver again about parked work; what proved complete is released. */
static void reclaim_parked(ote__gpu_t *g) {
    ote_mutex_lock(&g->mu);
    parked_t *list = g->parked;
    g->parked = NULL;
    ote_mutex_unlock(&g->mu);
    while (list != NULL) {
        parked_t *p = list;
        list = p->next;
        ote_status_t st = ote_cuda_stream_state(p->s) == OTE_CUDA_STREAM_RETAINED
                              ? ote_cuda_stream_reclaim(p->s)
                              : ote_cuda_stream_poll(p->s);
        if (st == OTE_OK) {
            if (p->has_chunk) (void)ote_cuda_staging_release(p->d->pool, &p->chunk);
            if (p->map != NULL) ote_cuda_ipc_mapping_put(p->d->ipc, p->map);
            stream_put(g, p->d, p->s);
            ote_free(p);
            ote_mutex_lock(&g->mu);
            g->nparked--;
            ote_mutex_unlock(&g->mu);
            OTE_INFO("gpu", "retained staging work proved complete: released");
        } else {
            ote_mutex_lock(&g->mu);
            p->next = g->parked;
            g->parked = p;
            ote_mutex_unlock(&g->mu);
        }
    }
}

/* One copy on *sp, waited for until dl. On a failure after which the device may still
 * touch the memory, the stream and the chunk are parked (*sp = NULL, *chunk_lost = 1). */
static ote_status_t copy_wait(ote__gpu_t *g, gdev_t *d, ote_cuda_stream_t **sp,
                              ote_cuda_copy_kind_t kind, uint64_t dst, uint64_t src, size_t len,
                              const ote_cuda_chunk_t *chunk, ote_deadline_t dl, int *chunk_lost) {
    ote_cuda_stream_t *s = *sp;
    *chunk_lost = 0;
    ote_status_t st = ote_cuda_stream_copy(s, kind, dst, src, len);
    if (st == OTE_OK) st = ote_cuda_stream_commit(s, NULL, NULL);
    if (st == OTE_OK) st = ote_cuda_stream_wait(s, dl);
    if (st == OTE_OK) return OTE_OK;
    if (ote_cuda_stream_state(s) != OTE_CUDA_STREAM_IDLE) {
        park(g, d, s, chunk);
        *sp = NULL;
        *chunk_lost = chunk != NULL;
    }
    OTE_WARN_LIMITED("gpu", "cuda:%d: staging copy (%s, %zu bytes) failed: %s",
                     ote_cuda_device_ordinal(d->dev), kind == OTE_CUDA_COPY_DTOH ? "DtoH" : "HtoD",
                     len, ote_status_str(st));
    return st;
}

/* ---- source side ---- */

struct ote__gpu_bounce {
    gdev_t *d;
    uint8_t *buf;
    ote_cuda_chunk_t chunk;
    int has_chunk; /* buf is the chunk; else heap memory (copied to/from directly) */
};

ote_status_t ote__gpu_src_get(ote__gpu_t *g, uint32_t kind, uint32_t len, ote_deadline_t dl,
                              uint8_t **buf_out, ote__gpu_bounce_t **tok_out) {
    gdev_t *d = NULL;
    ote_status_t st = dev_get(g, kind, &d);
    if (st != OTE_OK) return st;
    ote__gpu_bounce_t *t = ote_calloc(1, sizeof(*t));
    if (t == NULL) return OTE_ERR_NOMEM;
    t->d = d;
    (void)dl; /* never waits for a chunk (see below) */
    /* A pinned chunk when one is free now. A source never waits for one: its chunks are
     * held by answers queued on connections this same thread sends, so waiting could
     * wait for itself. Otherwise heap memory, copied directly (the driver stages
     * pageable memory itself, slower but never stuck). */
    if (len <= g->chunk && ote_cuda_staging_acquire(d->pool, ote_now_ns(), &t->chunk) == OTE_OK) {
        t->has_chunk = 1;
        t->buf = t->chunk.ptr;
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
    if (atomic_load(&g->nparked) > 0) reclaim_parked(g);
    atomic_fetch_add(&g->n_src, 1);
    ote_cuda_stream_t *s = NULL;
    ote_status_t st = stream_get(g, d, &s);
    if (st != OTE_OK) return st;
    ote_cuda_copy_kind_t kind = to_device ? OTE_CUDA_COPY_HTOD : OTE_CUDA_COPY_DTOH;
    int lost = 0;
    uint64_t h = (uintptr_t)t->buf;
    st = copy_wait(g, d, &s, kind, to_device ? dev_addr : h, to_device ? h : dev_addr, len,
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
    stream_put(g, d, s);
    return st;
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
    ote__slice_done_fn done = j->done;
    if (st != OTE_OK && j->fail == OTE_OK) j->fail = st;
    if (--j->left == 0) {
        ote_mutex_lock(&g->mu);
        job_t **pp = &g->jobs;
        while (*pp != NULL && *pp != j) pp = &(*pp)->next;
        if (*pp == j) *pp = j->next;
        g->njobs--;
        ote_mutex_unlock(&g->mu);
        stream_put(g, j->d, j->stream);
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
        if (j->stream == NULL) st = stream_get(g, j->d, &j->stream);
        if (st == OTE_OK)
            st = copy_wait(g, j->d, &j->stream, OTE_CUDA_COPY_HTOD, j->dev[idx], (uintptr_t)c->ptr,
                           j->slices[idx].len, c, j->slices[idx].deadline, &lost);
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
            if (j->stream == NULL) st = stream_get(g, j->d, &j->stream);
            if (st == OTE_OK)
                st = copy_wait(g, j->d, &j->stream, OTE_CUDA_COPY_DTOH, (uintptr_t)c->ptr,
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
        if (evs == NULL && g->stop && g->jobs == NULL) break;
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
        if (g->nparked > 0) reclaim_parked(g);
        ote_mutex_lock(&g->mu);
        if (g->evq == NULL && g->newjobs == NULL && !(g->stop && g->jobs == NULL)) {
            if (waiting || g->nparked > 0)
                (void)ote_cond_wait(&g->cv, &g->mu, ote_deadline_after(GPU_IDLE_TICK_NS));
            else (void)ote_cond_wait(&g->cv, &g->mu, ote_deadline_after(100 * OTE_NSEC_PER_MSEC));
        }
    }
    ote_mutex_unlock(&g->mu);
    return NULL;
}

void ote__gpu_stage(ote__gpu_t *g, uint32_t kind, ote__slice_t *slices, uint32_t ns,
                    ote__gpu_submit_fn submit, void *arg) {
    gdev_t *d = NULL;
    ote_status_t st = dev_get(g, kind, &d);
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
            if (pthread_create(&g->thread, NULL, worker_main, g) == 0) g->thread_started = 1;
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

/* ---- CUDA IPC ---- */

int ote__gpu_ipc_allowed(const ote__gpu_t *g) { return (g->paths & OTE__GPU_PATH_IPC) != 0; }
int ote__gpu_staging_allowed(const ote__gpu_t *g) {
    return (g->paths & OTE__GPU_PATH_STAGING) != 0;
}

ote_status_t ote__gpu_ipc_export(ote__gpu_t *g, uint32_t kind, uint64_t addr, uint32_t len,
                                 ote__ipc_desc_t *out) {
    if (!(g->paths & OTE__GPU_PATH_IPC) || !OTE_MEM_IS_CUDA(kind)) return OTE_ERR_UNSUPPORTED;
    gdev_t *d = NULL;
    ote_status_t st = dev_open(g, kind, 0, &d);
    ote_cuda_pointer_info_t info;
    if (st == OTE_OK) st = ote_cuda_pointer_classify(g->drv, addr, &info);
    if (st == OTE_OK && (info.kind != OTE_CUDA_MEM_DEVICE || addr < info.range_start ||
                         len > info.range_start + info.range_size - addr))
        st = OTE_ERR_INVALID;
    if (st != OTE_OK) {
        OTE_WARN_LIMITED("gpu", "IPC export of [0x%llx, +%u): %s", (unsigned long long)addr, len,
                         ote_status_str(st));
        return st;
    }
    /* The cached description of this allocation (buffer ids are never reused). */
    ote_cuda_ipc_desc_t cd;
    int found = 0;
    ote_mutex_lock(&g->mu);
    for (int i = 0; i < GPU_IPC_EXPORTS; i++)
        if (g->exps[i].buffer_id == info.buffer_id && g->exps[i].ex != NULL) {
            g->exps[i].used = ++g->exp_clock;
            cd = *ote_cuda_ipc_export_desc(g->exps[i].ex);
            found = 1;
            break;
        }
    ote_mutex_unlock(&g->mu);
    if (!found) {
        ote_cuda_ipc_export_t *ex = NULL;
        st = ote_cuda_ipc_export_create(d->dev, addr, &ex);
        if (st != OTE_OK) {
            OTE_WARN_LIMITED("gpu", "cuda:%d: cuIpcGetMemHandle of [0x%llx, +%u): %s",
                             OTE_MEM_CUDA_DEVICE(kind), (unsigned long long)addr, len,
                             ote_status_str(st));
            return st;
        }
        cd = *ote_cuda_ipc_export_desc(ex);
        ote_cuda_ipc_export_t *drop = NULL;
        ote_mutex_lock(&g->mu);
        ipc_exp_t *v = &g->exps[0];
        for (int i = 0; i < GPU_IPC_EXPORTS; i++) {
            if (g->exps[i].ex == NULL) {
                v = &g->exps[i];
                break;
            }
            if (g->exps[i].used < v->used) v = &g->exps[i];
        }
        drop = v->ex;
        v->ex = ex;
        v->buffer_id = info.buffer_id;
        v->used = ++g->exp_clock;
        ote_mutex_unlock(&g->mu);
        ote_cuda_ipc_export_destroy(drop); /* a description only: nothing native to release */
        atomic_fetch_add(&g->n_exports, 1);
    }
    memset(out, 0, sizeof(*out));
    memcpy(out->handle, &cd.handle, sizeof(out->handle));
    out->buffer_id = cd.buffer_id;
    out->base = cd.base;
    out->size = cd.size;
    out->offset = addr - cd.base;
    out->device = cd.device_ordinal;
    return OTE_OK;
}

/* The device an IPC copy runs on (its import cache created on first use). */
static ote_status_t ipc_dev(ote__gpu_t *g, uint32_t kind, gdev_t **out) {
    gdev_t *d = NULL;
    ote_status_t st = dev_open(g, kind, 0, &d);
    if (st != OTE_OK) return st;
    ote_mutex_lock(&g->mu);
    if (d->ipc == NULL)
        st = ote_cuda_ipc_cache_create(d->dev, GPU_IPC_ENTRIES, GPU_IPC_BYTES, &d->ipc);
    ote_mutex_unlock(&g->mu);
    if (st == OTE_OK) *out = d;
    return st;
}

ote_status_t ote__gpu_ipc_copy_start(ote__gpu_t *g, uint64_t exporter, const ote__ipc_desc_t *desc,
                                     uint8_t *local, uint32_t local_kind, uint32_t len, int write,
                                     ote__gpu_ipc_op_t **op_out) {
    int local_dev = OTE_MEM_IS_CUDA(local_kind);
    if (atomic_load(&g->nparked) > 0) reclaim_parked(g);
    if (!driver_present(g)) return OTE_ERR_NO_DEVICE;
    if (desc->device < 0 || desc->device >= GPU_MAX_DEVICES || desc->offset > desc->size ||
        len > desc->size - desc->offset || desc->base > UINT64_MAX - desc->size)
        return OTE_ERR_PROTOCOL;
    /* The copy runs on the local buffer's device, else on the exporter's (one host: the
     * same ordinals). */
    uint32_t kind = local_dev ? local_kind : OTE_MEM_CUDA + (uint32_t)desc->device;
    gdev_t *d = NULL;
    ote_status_t st = ipc_dev(g, kind, &d);
    ote__gpu_ipc_op_t *op = st == OTE_OK ? ote_calloc(1, sizeof(*op)) : NULL;
    if (st == OTE_OK && op == NULL) st = OTE_ERR_NOMEM;
    ote_cuda_ipc_desc_t cd;
    memset(&cd, 0, sizeof(cd));
    memcpy(&cd.handle, desc->handle, sizeof(cd.handle));
    cd.buffer_id = desc->buffer_id;
    cd.base = desc->base;
    cd.size = desc->size;
    cd.device_ordinal = desc->device;
    if (st == OTE_OK) st = ote_cuda_ipc_import(d->ipc, exporter, &cd, &op->map);
    ote_cu_deviceptr_t remote = 0;
    if (st == OTE_OK)
        st = ote_cuda_ipc_mapping_translate(op->map, desc->base + desc->offset, len, &remote);
    if (st == OTE_OK) st = stream_get(g, d, &op->s);
    if (st == OTE_OK) {
        uint64_t l = (uintptr_t)local;
        ote_cuda_copy_kind_t k = local_dev ? OTE_CUDA_COPY_DTOD
                                 : write   ? OTE_CUDA_COPY_HTOD
                                           : OTE_CUDA_COPY_DTOH;
        st = ote_cuda_stream_copy(op->s, k, write ? remote : l, write ? l : remote, len);
        if (st == OTE_OK) st = ote_cuda_stream_commit(op->s, NULL, NULL);
        if (st != OTE_OK && ote_cuda_stream_state(op->s) != OTE_CUDA_STREAM_IDLE) {
            park_map(g, d, op->s, NULL, op->map); /* the copy may still run */
            op->s = NULL;
            op->map = NULL;
        }
    }
    if (st == OTE_OK) {
        op->d = d;
        *op_out = op;
        return OTE_OK;
    }
    OTE_WARN_LIMITED("gpu", "CUDA IPC copy of %u bytes (%s, buffer %llu of exporter %llu): %s", len,
                     write ? "write" : "read", (unsigned long long)desc->buffer_id,
                     (unsigned long long)exporter, ote_status_str(st));
    atomic_fetch_add(&g->n_ipc_failed, 1);
    if (op != NULL) {
        if (op->s != NULL) stream_put(g, d, op->s);
        if (op->map != NULL) ote_cuda_ipc_mapping_put(d->ipc, op->map);
        ote_free(op);
    }
    return st;
}

ote_status_t ote__gpu_ipc_copy_poll(ote__gpu_t *g, ote__gpu_ipc_op_t *op, int give_up) {
    ote_status_t st = ote_cuda_stream_poll(op->s);
    if (st == OTE_ERR_AGAIN && !give_up) return OTE_ERR_AGAIN;
    if (st == OTE_OK) {
        ote_cuda_ipc_mapping_put(op->d->ipc, op->map);
        stream_put(g, op->d, op->s);
        atomic_fetch_add(&g->n_ipc_ok, 1);
    } else {
        /* Pending past the deadline, or an unknown outcome (the stream is retained):
         * the copy may still touch both ends. */
        if (st == OTE_ERR_AGAIN) st = OTE_ERR_TIMEOUT;
        OTE_WARN_LIMITED("gpu", "cuda:%d: CUDA IPC copy failed: %s",
                         ote_cuda_device_ordinal(op->d->dev), ote_status_str(st));
        park_map(g, op->d, op->s, NULL, op->map);
        atomic_fetch_add(&g->n_ipc_failed, 1);
    }
    ote_free(op);
    return st;
}

void ote__gpu_ipc_revoked(ote__gpu_t *g, uint64_t exporter, uint64_t buffer_id) {
    for (int i = 0; i < GPU_MAX_DEVICES; i++) {
        ote_mutex_lock(&g->mu);
        ote_cuda_ipc_cache_t *c = g->devs[i].ipc;
        ote_mutex_unlock(&g->mu);
        if (c != NULL) (void)ote_cuda_ipc_close_receipt(c, exporter, buffer_id);
    }
}

void ote__gpu_ipc_exporter_dead(ote__gpu_t *g, uint64_t exporter) {
    for (int i = 0; i < GPU_MAX_DEVICES; i++) {
        ote_mutex_lock(&g->mu);
        ote_cuda_ipc_cache_t *c = g->devs[i].ipc;
        ote_mutex_unlock(&g->mu);
        size_t n = c != NULL ? ote_cuda_ipc_exporter_dead(c, exporter) : 0;
        if (n > 0)
            OTE_INFO("gpu", "cuda:%d: %zu CUDA IPC import(s) of dead exporter %llu released", i, n,
                     (unsigned long long)exporter);
    }
}

void ote__gpu_stats(ote__gpu_t *g, ote__gpu_stats_t *out) {
    ote_mutex_lock(&g->mu);
    out->jobs_active = g->njobs;
    out->parked = g->nparked;
    out->driver_loaded = g->drv != NULL;
    out->chunks_out = 0;
    ote_cuda_ipc_cache_t *caches[GPU_MAX_DEVICES];
    for (int i = 0; i < GPU_MAX_DEVICES; i++) {
        if (g->devs[i].pool != NULL)
            out->chunks_out +=
                GPU_POOL_FACTOR * g->depth - ote_cuda_staging_free_count(g->devs[i].pool);
        caches[i] = g->devs[i].ipc;
    }
    ote_mutex_unlock(&g->mu);
    out->staged_jobs = atomic_load(&g->n_staged);
    out->src_copies = atomic_load(&g->n_src);
    out->ipc_exports = atomic_load(&g->n_exports);
    out->ipc_copies = atomic_load(&g->n_ipc_ok);
    out->ipc_failed = atomic_load(&g->n_ipc_failed);
    out->ipc_imports = out->ipc_mapped = out->ipc_in_use = out->ipc_invalidated = 0;
    for (int i = 0; i < GPU_MAX_DEVICES; i++) {
        if (caches[i] == NULL) continue;
        ote_cuda_ipc_cache_stats_t cs;
        ote_cuda_ipc_cache_stats(caches[i], &cs);
        out->ipc_imports += cs.imports;
        out->ipc_mapped += cs.entries;
        out->ipc_in_use += cs.in_use;
        out->ipc_invalidated += cs.invalidations;
    }
}

void ote__gpu_destroy(ote__gpu_t *g) {
    if (g == NULL) return;
    ote_mutex_lock(&g->mu);
    g->stop = 1;
    ote_cond_signal(&g->cv);
    int started = g->thread_started;
    ote_mutex_unlock(&g->mu);
    if (started) pthread_join(g->thread, NULL);
    /* Parked work: one more look, generously. */
    ote_deadline_t dl = ote_deadline_after(2 * OTE_NSEC_PER_SEC);
    while (g->nparked > 0 && ote_now_ns() < dl) {
        reclaim_parked(g);
        if (g->nparked > 0) usleep(1000);
    }
    while (g->parked != NULL) {
        parked_t *p = g->parked;
        g->parked = p->next;
        OTE_ERROR("gpu",
                  "cuda:%d: a staging stream is still retained at engine destroy: left "
                  "to its device's retained list",
                  ote_cuda_device_ordinal(p->d->dev));
        (void)ote_cuda_stream_destroy(p->s, ote_now_ns());
        ote_free(p);
    }
    for (int i = 0; i < GPU_IPC_EXPORTS; i++) ote_cuda_ipc_export_destroy(g->exps[i].ex);
    for (int i = 0; i < GPU_MAX_DEVICES; i++) {
        gdev_t *d = &g->devs[i];
        if (d->ipc != NULL) {
            ote_status_t cst = ote_cuda_ipc_cache_destroy(d->ipc);
            if (ote_status_code(cst) == OTE_ERR_BUSY)
                OTE_ERROR("gpu",
                          "cuda:%d: CUDA IPC mappings still in use at engine destroy: the "
                          "import cache is left open",
                          i);
            else d->ipc = NULL;
        }
        while (d->nfree > 0) (void)ote_cuda_stream_destroy(d->free_streams[--d->nfree], dl);
        if (d->pool != NULL && ote_cuda_staging_destroy(d->pool) == OTE_ERR_BUSY)
            OTE_ERROR("gpu",
                      "cuda:%d: staging chunks still out at engine destroy: the pool is "
                      "left allocated",
                      i);
        if (d->dev != NULL) {
            (void)ote_cuda_device_reclaim(d->dev, NULL);
            ote_status_t st = ote_cuda_device_close(d->dev);
            if (st != OTE_OK)
                OTE_ERROR("gpu", "cuda:%d: device close at engine destroy: %s", i,
                          ote_status_str(st));
        }
    }
    if (g->drv != NULL && ote_cuda_driver_unload(g->drv) != OTE_OK)
        OTE_WARN("gpu", "the CUDA driver stays loaded: owners are still retained on it");
    ote_cond_destroy(&g->cv);
    ote_mutex_destroy(&g->mu);
    ote_free(g);
}

/* The NUMA node of CUDA device `dev`'s PCI function (sysfs numa_node of the bus id the
 * driver reports), -1 when unknown: no driver, no such device, or no NUMA information. */
int ote__gpu_device_node(ote__gpu_t *g, int dev) {
    if (g == NULL || dev < 0 || !atomic_load_explicit(&g->drv_ready, memory_order_acquire))
        return -1;
    const ote_cuda_driver_table_t *t = ote_cuda_driver_table(g->drv);
    ote_cu_device_t d = 0;
    char bus[32] = {0};
    if (t->cuDeviceGet(&d, dev) != OTE_CU_SUCCESS ||
        t->cuDeviceGetPCIBusId(bus, (int)sizeof(bus) - 1, d) != OTE_CU_SUCCESS)
        return -1;
    for (char *c = bus; *c != '\0'; c++) {
        if (*c >= 'A' && *c <= 'F') *c = (char)(*c - 'A' + 'a');
        else if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f') || *c == ':' || *c == '.'))
            return -1; /* only a bus id names a sysfs path */
    }
    char path[96];
    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/numa_node", bus);
    FILE *f = fopen(path, "re");
    if (f == NULL) return -1;
    int node = -1;
    if (fscanf(f, "%d", &node) != 1) node = -1;
    fclose(f);
    return node < 0 ? -1 : node;
}

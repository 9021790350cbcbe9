/*
 * engine/gpu/gpu.c - the driver, memory kinds, gpu_paths, devices, streams and parked
 * work, create, stats and destroy (gpu.h; the files of engine/gpu: gpu_internal.h).
 *
 * Locks: g->mu guards the driver pointer's first setting, the devices, their free
 * streams, the parked list and the worker's queues. Driver calls (copies, waits) are
 * made without it. The worker is the only thread that runs a staged request's pipeline;
 * transports only queue completed slices for it (their done() never blocks).
 */
#include "engine/gpu/gpu_internal.h"

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
#include "base/vm.h"
#include "cuda/driver.h"
#include "cuda/ipc/ipc.h"
#include "cuda/memory/device.h"
#include "cuda/memory/memory.h"
#include "cuda/pinned/pinned.h"
#include "cuda/stream/stream.h"
#include "ote/ote.h"

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
int ote__gpu_driver_present(ote__gpu_t *g) {
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

/* Whether [addr, +len) may be host memory as far as this process can tell without a
 * driver: everything but a range that is mapped and unreadable (PROT_NONE, which device
 * memory is at its address). A hole or a file past its end is host memory gone wrong,
 * which the registry's own check refuses; no driver is needed for that. */
static int maybe_host(uint64_t addr, uint64_t len) {
    ote_vm_report_t r;
    if (ote_vm_check(addr, len, OTE_VM_READ, &r) != OTE_OK) return 1;
    return r.verdict != OTE_VM_NO_ACCESS;
}

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
    if (!ote__gpu_driver_present(g)) {
        if (!for_register || maybe_host(addr, len)) {
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
                     "; direct needs a registration with a dma-buf MR and an rdma segment)", \
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
ote_status_t ote__gpu_dev_open(ote__gpu_t *g, uint32_t kind, int pool, gdev_t **out) {
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

ote_status_t ote__gpu_dev_get(ote__gpu_t *g, uint32_t kind, gdev_t **out) {
    return ote__gpu_dev_open(g, kind, 1, out);
}

ote_status_t ote__gpu_stream_get(ote__gpu_t *g, gdev_t *d, ote_cuda_stream_t **out) {
    ote_mutex_lock(&g->mu);
    ote_cuda_stream_t *s = d->nfree > 0 ? d->free_streams[--d->nfree] : NULL;
    ote_mutex_unlock(&g->mu);
    if (s != NULL) {
        *out = s;
        return OTE_OK;
    }
    return ote_cuda_stream_create(d->dev, out);
}

void ote__gpu_stream_put(ote__gpu_t *g, gdev_t *d, ote_cuda_stream_t *s) {
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
void ote__gpu_park(ote__gpu_t *g, gdev_t *d, ote_cuda_stream_t *s, const ote_cuda_chunk_t *chunk) {
    ote__gpu_park_map(g, d, s, chunk, NULL);
}

/* As park; map (an IPC mapping the work reads or writes) stays in use until then. */
void ote__gpu_park_map(ote__gpu_t *g, gdev_t *d, ote_cuda_stream_t *s,
                       const ote_cuda_chunk_t *chunk, ote_cuda_ipc_mapping_t *map) {
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
void ote__gpu_reclaim_parked(ote__gpu_t *g) {
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
            ote__gpu_stream_put(g, p->d, p->s);
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
    out->direct = atomic_load(&g->n_direct);
    out->direct_regs = atomic_load(&g->n_direct_regs);
    out->direct_failed = atomic_load(&g->n_direct_failed);
    out->ipc_settled = atomic_load(&g->n_ipc_settled);
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

/* What device i still holds at engine destroy, released where it can be: 1 while something
 * stays (IPC mappings in use, chunks out, owners the CUDA layer retained, a context that
 * would not be released), each logged; a later call retries exactly that. */
static int release_device(ote__gpu_t *g, int i, ote_deadline_t dl) {
    gdev_t *d = &g->devs[i];
    int left = 0;
    if (d->ipc != NULL) {
        ote_status_t cst = ote_cuda_ipc_cache_destroy(d->ipc);
        if (ote_status_code(cst) == OTE_ERR_BUSY) {
            OTE_ERROR("gpu",
                      "cuda:%d: CUDA IPC mappings still in use at engine destroy: the import "
                      "cache is left open",
                      i);
            left = 1;
        } else {
            d->ipc = NULL; /* gone; a RETAINED close is the device's to retry */
        }
    }
    while (d->nfree > 0) (void)ote_cuda_stream_destroy(d->free_streams[--d->nfree], dl);
    if (d->pool != NULL) {
        if (ote_status_code(ote_cuda_staging_destroy(d->pool)) == OTE_ERR_BUSY) {
            OTE_ERROR("gpu",
                      "cuda:%d: staging chunks still out at engine destroy: the pool is left "
                      "allocated",
                      i);
            left = 1;
        } else {
            d->pool = NULL; /* its memory, if retained, is on the device's retained list */
        }
    }
    if (d->dev != NULL) {
        (void)ote_cuda_device_reclaim(d->dev, NULL);
        ote_status_t st = ote_cuda_device_close(d->dev);
        if (st == OTE_OK) {
            d->dev = NULL;
        } else {
            OTE_ERROR("gpu", "cuda:%d: device close at engine destroy: %s (owners retained)", i,
                      ote_status_str(st));
            left = 1;
        }
    }
    return left;
}

/* Stops the GPU service thread, then releases what the engine's GPU paths hold: OTE_OK
 * frees g; OTE_ERR_RETAINED (something the CUDA layer could not release: a stream still
 * running, chunks out, mappings in use, retained owners) keeps g with what is left, and
 * a later call retries exactly that. */
ote_status_t ote__gpu_destroy(ote__gpu_t *g) {
    if (g == NULL) return OTE_OK;
    ote_mutex_lock(&g->mu);
    g->stop = 1;
    ote_cond_signal(&g->cv);
    int started = g->thread_started;
    g->thread_started = 0;
    ote_mutex_unlock(&g->mu);
    if (started) pthread_join(g->thread, NULL);
    /* Parked work: one more look, generously. */
    ote_deadline_t dl = ote_deadline_after(2 * OTE_NSEC_PER_SEC);
    while (g->nparked > 0 && ote_now_ns() < dl) {
        ote__gpu_reclaim_parked(g);
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
    g->nparked = 0;
    for (int i = 0; i < GPU_IPC_EXPORTS; i++) {
        ote_cuda_ipc_export_destroy(g->exps[i].ex);
        g->exps[i].ex = NULL;
    }
    int left = 0;
    for (int i = 0; i < GPU_MAX_DEVICES; i++) left |= release_device(g, i, dl);
    if (left) return OTE_ERR_RETAINED;
    if (g->drv != NULL) {
        if (ote_cuda_driver_unload(g->drv) != OTE_OK) {
            OTE_WARN("gpu", "the CUDA driver stays loaded: owners are still retained on it");
            return OTE_ERR_RETAINED;
        }
        g->drv = NULL;
    }
    ote_cond_destroy(&g->cv);
    ote_mutex_destroy(&g->mu);
    ote_free(g);
    return OTE_OK;
}

/* The PCI bus id of CUDA device `dev` ("dddd:bb:dd.f", lower case) in bus[0, cap): OTE_OK,
 * OTE_ERR_NOT_FOUND when there is no driver (none loaded in this process) or no such
 * device, OTE_ERR_PROTOCOL for an answer that is not a bus id. */
ote_status_t ote__gpu_pci_bus_id(ote__gpu_t *g, int dev, char *bus, size_t cap) {
    if (g == NULL || dev < 0 || bus == NULL || cap < 16) return OTE_ERR_INVALID;
    if (!ote__gpu_driver_present(g)) return OTE_ERR_NOT_FOUND;
    const ote_cuda_driver_table_t *t = ote_cuda_driver_table(g->drv);
    ote_cu_device_t d = 0;
    char id[32] = {0};
    if (t->cuDeviceGet(&d, dev) != OTE_CU_SUCCESS ||
        t->cuDeviceGetPCIBusId(id, (int)sizeof(id) - 1, d) != OTE_CU_SUCCESS)
        return OTE_ERR_NOT_FOUND;
    for (char *c = id; *c != '\0'; c++) {
        if (*c >= 'A' && *c <= 'F') *c = (char)(*c - 'A' + 'a');
        else if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f') || *c == ':' || *c == '.'))
            return OTE_ERR_PROTOCOL; /* only a bus id names a sysfs path */
    }
    if (id[0] == '\0' || strlen(id) >= cap) return OTE_ERR_PROTOCOL;
    snprintf(bus, cap, "%s", id);
    return OTE_OK;
}

/* The NUMA node of CUDA device `dev`'s PCI function (sysfs numa_node of the bus id the
 * driver reports), -1 when unknown: no driver, no such device, or no NUMA information. */
int ote__gpu_device_node(ote__gpu_t *g, int dev) {
    if (g == NULL || dev < 0 || !atomic_load_explicit(&g->drv_ready, memory_order_acquire))
        return -1;
    char bus[32];
    if (ote__gpu_pci_bus_id(g, dev, bus, sizeof(bus)) != OTE_OK) return -1;
    char path[96];
    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/numa_node", bus);
    FILE *f = fopen(path, "re");
    if (f == NULL) return -1;
    int node = -1;
    if (fscanf(f, "%d", &node) != 1) node = -1;
    fclose(f);
    return node < 0 ? -1 : node;
}

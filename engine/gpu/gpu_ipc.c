/*
 * engine/gpu/gpu_ipc.c - CUDA IPC: the source exports an allocation registered with
 * OTE_PERM_IPC (once, cached), the requester imports it through a bounded cache and
 * copies on a stream (gpu.h; shared state in gpu_internal.h).
 */
#include "engine/gpu/gpu_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* ---- CUDA IPC ---- */

int ote__gpu_ipc_allowed(const ote__gpu_t *g) { return (g->paths & OTE__GPU_PATH_IPC) != 0; }
int ote__gpu_staging_allowed(const ote__gpu_t *g) {
    return (g->paths & OTE__GPU_PATH_STAGING) != 0;
}

/* The export slot of buffer_id, else NULL. g->mu held. */
static ipc_exp_t *exp_find(ote__gpu_t *g, unsigned long long buffer_id) {
    for (int i = 0; i < GPU_IPC_EXPORTS; i++)
        if (g->exps[i].buffer_id == buffer_id && buffer_id != 0) return &g->exps[i];
    return NULL;
}

/* Remember ex (NULL: the allocation was refused) for buffer_id, evicting the least
 * recently used slot; returns the export it evicted (the caller destroys it). g->mu held. */
static ote_cuda_ipc_export_t *exp_put(ote__gpu_t *g, unsigned long long buffer_id,
                                      ote_cuda_ipc_export_t *ex) {
    ipc_exp_t *v = &g->exps[0];
    for (int i = 0; i < GPU_IPC_EXPORTS; i++) {
        if (g->exps[i].buffer_id == 0) {
            v = &g->exps[i];
            break;
        }
        if (g->exps[i].used < v->used) v = &g->exps[i];
    }
    ote_cuda_ipc_export_t *drop = v->ex;
    v->ex = ex;
    v->buffer_id = buffer_id;
    v->used = ++g->exp_clock;
    return drop;
}

ote_status_t ote__gpu_ipc_export(ote__gpu_t *g, uint32_t kind, uint64_t addr, uint32_t len,
                                 ote__ipc_desc_t *out, int *fd_out) {
    if (!(g->paths & OTE__GPU_PATH_IPC) || !OTE_MEM_IS_CUDA(kind)) return OTE_ERR_UNSUPPORTED;
    gdev_t *d = NULL;
    ote_status_t st = ote__gpu_dev_open(g, kind, 0, &d);
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
    /* The cached description of this allocation (buffer ids are never reused); a VMM
     * export's fd is duplicated under the lock (eviction closes the export's own). */
    ote_cuda_ipc_desc_t cd;
    int found = 0, fd = -1, vmm = 0;
    ote_mutex_lock(&g->mu);
    ipc_exp_t *hit = exp_find(g, info.buffer_id);
    if (hit != NULL) {
        hit->used = ++g->exp_clock;
        found = hit->ex != NULL ? 1 : -1; /* -1: refused before */
        if (hit->ex != NULL) {
            cd = *ote_cuda_ipc_export_desc(hit->ex);
            int efd = ote_cuda_ipc_export_fd(hit->ex);
            vmm = efd >= 0;
            if (vmm && (fd = fcntl(efd, F_DUPFD_CLOEXEC, 0)) < 0) st = OTE_ERR_NOMEM;
        }
    }
    ote_mutex_unlock(&g->mu);
    if (found < 0) return OTE_ERR_UNSUPPORTED;
    if (st != OTE_OK) {
        OTE_WARN_LIMITED("gpu", "IPC export: dup of a VMM export's fd: %s", strerror(errno));
        return st;
    }
    if (!found) {
        ote_cuda_ipc_export_t *ex = NULL;
        /* VMM memory first (one cuMemRetainAllocationHandle, which fails on cuMemAlloc
         * memory: OTE_ERR_NOT_FOUND), else cuIpcGetMemHandle. */
        st = ote_cuda_ipc_export_vmm(d->dev, addr, &ex);
        vmm = st == OTE_OK;
        if (st == OTE_ERR_NOT_FOUND) st = ote_cuda_ipc_export_create(d->dev, addr, &ex);
        if (st != OTE_OK) {
            if (ote_status_code(st) == OTE_ERR_UNSUPPORTED) {
                /* VMM memory without the POSIX-fd handle type: never exportable. */
                OTE_WARN("gpu",
                         "cuda:%d: the VMM allocation at 0x%llx (+%zu) was created without "
                         "the POSIX-fd handle type: CUDA IPC cannot export it; its pieces "
                         "keep staging",
                         OTE_MEM_CUDA_DEVICE(kind), (unsigned long long)info.range_start,
                         info.range_size);
                ote_mutex_lock(&g->mu);
                ote_cuda_ipc_export_t *drop =
                    exp_find(g, info.buffer_id) == NULL ? exp_put(g, info.buffer_id, NULL) : NULL;
                ote_mutex_unlock(&g->mu);
                ote_cuda_ipc_export_destroy(drop);
                return OTE_ERR_UNSUPPORTED;
            }
            OTE_WARN_LIMITED("gpu", "cuda:%d: IPC export of [0x%llx, +%u): %s",
                             OTE_MEM_CUDA_DEVICE(kind), (unsigned long long)addr, len,
                             ote_status_str(st));
            return st;
        }
        cd = *ote_cuda_ipc_export_desc(ex);
        if (vmm && (fd = fcntl(ote_cuda_ipc_export_fd(ex), F_DUPFD_CLOEXEC, 0)) < 0) {
            OTE_WARN_LIMITED("gpu", "IPC export: dup of a VMM export's fd: %s", strerror(errno));
            ote_cuda_ipc_export_destroy(ex);
            return OTE_ERR_NOMEM;
        }
        ote_mutex_lock(&g->mu);
        ote_cuda_ipc_export_t *drop = NULL;
        if (exp_find(g, info.buffer_id) == NULL) {
            drop = exp_put(g, info.buffer_id, ex);
            ex = NULL;
        }
        ote_mutex_unlock(&g->mu);
        ote_cuda_ipc_export_destroy(drop); /* an evicted export (a VMM one closes its fd) */
        ote_cuda_ipc_export_destroy(ex);   /* another thread cached it meanwhile */
        atomic_fetch_add(&g->n_exports, 1);
    }
    memset(out, 0, sizeof(*out));
    memcpy(out->handle, &cd.handle, sizeof(out->handle));
    out->buffer_id = cd.buffer_id;
    out->base = cd.base;
    out->size = cd.size;
    out->offset = addr - cd.base;
    out->device = cd.device_ordinal;
    out->flags = vmm ? OTE__IPC_VMM : 0;
    *fd_out = fd;
    return OTE_OK;
}

void ote__gpu_ipc_forget(ote__gpu_t *g, uint64_t start, uint64_t len) {
    ote_cuda_ipc_export_t *drop[GPU_IPC_EXPORTS];
    int n = 0;
    ote_mutex_lock(&g->mu);
    for (int i = 0; i < GPU_IPC_EXPORTS; i++) {
        ipc_exp_t *v = &g->exps[i];
        if (v->ex == NULL) continue;
        const ote_cuda_ipc_desc_t *cd = ote_cuda_ipc_export_desc(v->ex);
        if (cd->base < start + len && start < cd->base + cd->size) {
            drop[n++] = v->ex;
            memset(v, 0, sizeof(*v));
        }
    }
    ote_mutex_unlock(&g->mu);
    for (int i = 0; i < n; i++) ote_cuda_ipc_export_destroy(drop[i]);
}

/* The device an IPC copy runs on (its import cache created on first use). */
static ote_status_t ipc_dev(ote__gpu_t *g, uint32_t kind, gdev_t **out) {
    gdev_t *d = NULL;
    ote_status_t st = ote__gpu_dev_open(g, kind, 0, &d);
    if (st != OTE_OK) return st;
    ote_mutex_lock(&g->mu);
    if (d->ipc == NULL)
        st = ote_cuda_ipc_cache_create(d->dev, GPU_IPC_ENTRIES, GPU_IPC_BYTES, &d->ipc);
    ote_mutex_unlock(&g->mu);
    if (st == OTE_OK) *out = d;
    return st;
}

ote_status_t ote__gpu_ipc_copy_start(ote__gpu_t *g, uint64_t exporter, const ote__ipc_desc_t *desc,
                                     int fd, uint8_t *local, uint32_t local_kind, uint32_t len,
                                     int write, ote__gpu_ipc_op_t **op_out) {
    int local_dev = OTE_MEM_IS_CUDA(local_kind);
    if (atomic_load(&g->nparked) > 0) ote__gpu_reclaim_parked(g);
    if (!ote__gpu_driver_present(g)) return OTE_ERR_NO_DEVICE;
    if (desc->device < 0 || desc->device >= GPU_MAX_DEVICES || desc->offset > desc->size ||
        len > desc->size - desc->offset || desc->base > UINT64_MAX - desc->size ||
        (desc->flags & ~OTE__IPC_VMM) != 0 || ((desc->flags & OTE__IPC_VMM) != 0) != (fd >= 0))
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
    if (st == OTE_OK)
        st = fd >= 0 ? ote_cuda_ipc_import_vmm(d->ipc, exporter, &cd, fd, &op->map)
                     : ote_cuda_ipc_import(d->ipc, exporter, &cd, &op->map);
    ote_cu_deviceptr_t remote = 0;
    if (st == OTE_OK)
        st = ote_cuda_ipc_mapping_translate(op->map, desc->base + desc->offset, len, &remote);
    if (st == OTE_OK) st = ote__gpu_stream_get(g, d, &op->s);
    if (st == OTE_OK) {
        uint64_t l = (uintptr_t)local;
        ote_cuda_copy_kind_t k = local_dev ? OTE_CUDA_COPY_DTOD
                                 : write   ? OTE_CUDA_COPY_HTOD
                                           : OTE_CUDA_COPY_DTOH;
        st = ote_cuda_stream_copy(op->s, k, write ? remote : l, write ? l : remote, len);
        if (st == OTE_OK) st = ote_cuda_stream_commit(op->s, NULL, NULL);
        if (st != OTE_OK && ote_cuda_stream_state(op->s) != OTE_CUDA_STREAM_IDLE) {
            /* The copy may still run: the op is the caller's to settle (its mapping stays
             * referenced, and the source's pin must stay until the driver proves the copy
             * complete). */
            OTE_WARN_LIMITED("gpu",
                             "CUDA IPC copy of %u bytes (buffer %llu of exporter %llu): %s; "
                             "outcome unknown until the driver proves it complete",
                             len, (unsigned long long)desc->buffer_id, (unsigned long long)exporter,
                             ote_status_str(st));
            atomic_fetch_add(&g->n_ipc_failed, 1);
            op->d = d;
            *op_out = op;
            return st;
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
        if (op->s != NULL) ote__gpu_stream_put(g, d, op->s);
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
        ote__gpu_stream_put(g, op->d, op->s);
        atomic_fetch_add(&g->n_ipc_ok, 1);
        ote_free(op);
        return OTE_OK;
    }
    /* Pending past the deadline, or an unknown outcome (the stream is retained): the copy
     * may still touch both ends. The op stays the caller's, unsettled, until
     * ote__gpu_ipc_copy_settle proves it complete (or abandons it to the parked list). */
    if (st == OTE_ERR_AGAIN) st = OTE_ERR_TIMEOUT;
    OTE_WARN_LIMITED("gpu",
                     "cuda:%d: CUDA IPC copy failed: %s; its outcome is unknown until the "
                     "driver proves it complete",
                     ote_cuda_device_ordinal(op->d->dev), ote_status_str(st));
    atomic_fetch_add(&g->n_ipc_failed, 1);
    return st;
}

ote_status_t ote__gpu_ipc_copy_settle(ote__gpu_t *g, ote__gpu_ipc_op_t *op, int abandon) {
    if (!abandon) {
        ote_status_t st = ote_cuda_stream_state(op->s) == OTE_CUDA_STREAM_RETAINED
                              ? ote_cuda_stream_reclaim(op->s)
                              : ote_cuda_stream_poll(op->s);
        if (st == OTE_OK) {
            /* Proven complete: the mapping's reference goes back, the stream is reused. */
            ote_cuda_ipc_mapping_put(op->d->ipc, op->map);
            ote__gpu_stream_put(g, op->d, op->s);
            atomic_fetch_add(&g->n_ipc_settled, 1);
            OTE_INFO("gpu", "cuda:%d: a CUDA IPC copy of unknown outcome proved complete",
                     ote_cuda_device_ordinal(op->d->dev));
            ote_free(op);
            return OTE_OK;
        }
        return OTE_ERR_AGAIN;
    }
    /* The peer is gone (or the transport closes): the engine keeps the stream and the
     * mapping until the driver proves the work complete (engine destroy retains them). */
    ote__gpu_park_map(g, op->d, op->s, NULL, op->map);
    ote_free(op);
    ote__gpu_worker_ensure(g); /* it looks at parked work every tick */
    return OTE_OK;
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

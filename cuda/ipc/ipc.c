#include "cuda/ipc/ipc.h"

#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/lock.h"
#include "base/log.h"
#include "base/time.h"

/* ---- export ---- */

struct ote_cuda_ipc_export {
    ote_cuda_ipc_desc_t desc;
    ote_cuda_alloc_t *alloc; /* held (access lock) when exported from an owned allocation */
    int fd;                  /* VMM export */
};

static ote_status_t export_describe(ote_cuda_device_t *dev, ote_cu_deviceptr_t ptr,
                                    ote_cuda_ipc_desc_t *desc) {
    ote_cuda_driver_t *drv = ote_cuda_device_driver(dev);
    ote_cuda_pointer_info_t info;
    ote_status_t st = ote_cuda_pointer_classify(drv, ptr, &info);
    if (st != OTE_OK) return st;
    if (info.kind != OTE_CUDA_MEM_DEVICE) {
        OTE_WARN("cuda", "IPC export: 0x%llx is not device memory", ptr);
        return OTE_ERR_INVALID;
    }
    st = ote_cuda_device_make_current(dev);
    if (st != OTE_OK) return st;
    ote_cu_ipc_mem_handle_t h;
    memset(&h, 0, sizeof(h));
    st = ote_cuda_check(drv, ote_cuda_device_table(dev)->cuIpcGetMemHandle(&h, info.range_start),
                        "cuIpcGetMemHandle");
    if (st != OTE_OK) return st;
    memset(desc, 0, sizeof(*desc));
    desc->handle = h;
    desc->buffer_id = info.buffer_id;
    desc->base = info.range_start;
    desc->size = info.range_size;
    desc->device_ordinal = info.device_ordinal;
    return OTE_OK;
}

ote_status_t ote_cuda_ipc_export_create(ote_cuda_device_t *dev, ote_cu_deviceptr_t ptr,
                                        ote_cuda_ipc_export_t **export_out) {
    if (dev == NULL || export_out == NULL) return OTE_ERR_INVALID;
    ote_cuda_ipc_export_t *e = ote_calloc(1, sizeof(*e));
    if (e == NULL) return OTE_ERR_NOMEM;
    e->fd = -1;
    ote_status_t st = export_describe(dev, ptr, &e->desc);
    if (st != OTE_OK) {
        ote_free(e);
        return st;
    }
    *export_out = e;
    return OTE_OK;
}

ote_status_t ote_cuda_ipc_export_alloc(ote_cuda_alloc_t *a, ote_cuda_ipc_export_t **export_out) {
    if (a == NULL || export_out == NULL) return OTE_ERR_INVALID;
    ote_cuda_device_t *dev = ote_cuda_alloc_device(a);
    ote_cuda_ipc_export_t *e = ote_calloc(1, sizeof(*e));
    if (e == NULL) return OTE_ERR_NOMEM;
    e->fd = -1;
    ote_status_t st = ote_cuda_alloc_acquire(a); /* the export is a user of the memory */
    if (st != OTE_OK) goto err_free;
    if (ote_cuda_alloc_is_vmm(a)) {
        st = ote_cuda_device_make_current(dev);
        if (st != OTE_OK) goto err_release;
        int fd = -1;
        st = ote_cuda_check(
            ote_cuda_device_driver(dev),
            ote_cuda_device_table(dev)->cuMemExportToShareableHandle(
                &fd, ote_cuda_alloc_vmm_handle(a), OTE_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
            "cuMemExportToShareableHandle(POSIX_FD)");
        if (st != OTE_OK) goto err_release;
        e->fd = fd;
        e->desc.base = ote_cuda_alloc_ptr(a);
        e->desc.size = ote_cuda_alloc_size(a);
        e->desc.device_ordinal = ote_cuda_device_ordinal(dev);
    } else {
        st = export_describe(dev, ote_cuda_alloc_ptr(a), &e->desc);
        if (st != OTE_OK) goto err_release;
    }
    e->alloc = a;
    *export_out = e;
    return OTE_OK;

err_release:
    ote_cuda_alloc_release(a);
err_free:
    ote_free(e);
    return st;
}

ote_status_t ote_cuda_ipc_export_vmm(ote_cuda_device_t *dev, ote_cu_deviceptr_t ptr,
                                     ote_cuda_ipc_export_t **export_out) {
    if (dev == NULL || export_out == NULL) return OTE_ERR_INVALID;
    ote_cuda_driver_t *drv = ote_cuda_device_driver(dev);
    const ote_cuda_driver_table_t *t = ote_cuda_device_table(dev);
    ote_cuda_pointer_info_t info;
    ote_status_t st = ote_cuda_pointer_classify(drv, ptr, &info);
    if (st != OTE_OK) return st;
    if (info.kind != OTE_CUDA_MEM_DEVICE) {
        OTE_WARN("cuda", "IPC export: 0x%llx is not device memory", ptr);
        return OTE_ERR_INVALID;
    }
    st = ote_cuda_device_make_current(dev);
    if (st != OTE_OK) return st;
    ote_cu_mem_handle_t h = 0;
    ote_cu_result_t res = t->cuMemRetainAllocationHandle(&h, (void *)(uintptr_t)info.range_start);
    if (res != OTE_CU_SUCCESS) return OTE_ERR_NOT_FOUND; /* not a VMM mapping */
    int fd = -1;
    res = t->cuMemExportToShareableHandle(&fd, h, OTE_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    /* The retained reference goes either way (the fd, when there is one, keeps the memory). */
    (void)ote_cuda_check(drv, t->cuMemRelease(h), "cuMemRelease (retained handle)");
    if (res != OTE_CU_SUCCESS) {
        OTE_INFO("cuda",
                 "VMM allocation at 0x%llx (+%zu) cannot be exported as a POSIX fd (created "
                 "without that handle type?): CUresult %d",
                 info.range_start, info.range_size, (int)res);
        return OTE_ERR_UNSUPPORTED;
    }
    ote_cuda_ipc_export_t *e = ote_calloc(1, sizeof(*e));
    if (e == NULL) {
        close(fd);
        return OTE_ERR_NOMEM;
    }
    e->fd = fd;
    e->desc.buffer_id = info.buffer_id;
    e->desc.base = info.range_start;
    e->desc.size = info.range_size;
    e->desc.device_ordinal = info.device_ordinal;
    *export_out = e;
    return OTE_OK;
}

const ote_cuda_ipc_desc_t *ote_cuda_ipc_export_desc(const ote_cuda_ipc_export_t *e) {
    return &e->desc;
}
int ote_cuda_ipc_export_fd(const ote_cuda_ipc_export_t *e) { return e->fd; }

void ote_cuda_ipc_export_destroy(ote_cuda_ipc_export_t *e) {
    if (e == NULL) return;
    /* cuIpcGetMemHandle has nothing to release; importers keep their own mappings. */
    if (e->fd >= 0) close(e->fd);
    if (e->alloc != NULL) ote_cuda_alloc_release(e->alloc);
    ote_free(e);
}

/* ---- import cache ---- */

struct ote_cuda_ipc_mapping {
    struct ote_cuda_ipc_mapping *prev, *next; /* all entries, most recently used first */
    uint64_t exporter_id;
    ote_cuda_ipc_desc_t desc;
    ote_cu_deviceptr_t local;
    ote_cuda_alloc_t *alloc; /* a VMM import (else a cuIpcOpenMemHandle mapping) */
    uint32_t users;
    int invalid;            /* never handed out again; closed when unused */
    ote_cuda_device_t *dev; /* set while parked on the device's retained list */
    ote__cuda_retained_node_t retained;
};

struct ote_cuda_ipc_cache {
    ote_cuda_device_t *dev;
    size_t max_entries;
    uint64_t max_bytes;
    ote_mutex_t mu;
    ote_cuda_ipc_mapping_t *head, *tail;
    ote_cuda_ipc_cache_stats_t stats;
};

static void unlink_entry(ote_cuda_ipc_cache_t *c, ote_cuda_ipc_mapping_t *m) {
    if (m->prev != NULL) m->prev->next = m->next;
    else c->head = m->next;
    if (m->next != NULL) m->next->prev = m->prev;
    else c->tail = m->prev;
    m->prev = m->next = NULL;
    c->stats.entries--;
    c->stats.bytes -= m->desc.size;
}

static void push_front(ote_cuda_ipc_cache_t *c, ote_cuda_ipc_mapping_t *m) {
    m->prev = NULL;
    m->next = c->head;
    if (c->head != NULL) c->head->prev = m;
    else c->tail = m;
    c->head = m;
}

static ote_status_t mapping_retry(void *owner) {
    ote_cuda_ipc_mapping_t *m = owner;
    ote_cuda_device_t *dev = m->dev;
    ote_status_t st = ote_cuda_device_make_current(dev);
    if (st == OTE_OK)
        st = ote_cuda_check(ote_cuda_device_driver(dev),
                            ote_cuda_device_table(dev)->cuIpcCloseMemHandle(m->local),
                            "cuIpcCloseMemHandle (retry)");
    if (st != OTE_OK) return st;
    ote_free(m);
    ote__cuda_device_unref(dev);
    return OTE_OK;
}

/* Close an unlinked, unused mapping. Called with c->mu held. */
static ote_status_t close_mapping(ote_cuda_ipc_cache_t *c, ote_cuda_ipc_mapping_t *m) {
    if (m->alloc != NULL) {
        /* Unmap, free the range and release the imported handle; a failure retains the
         * import on the device (cuda/memory), retried by ote_cuda_device_reclaim(). */
        ote_status_t ast = ote_cuda_alloc_destroy(m->alloc, ote_now_ns());
        ote_free(m);
        return ast;
    }
    ote_status_t st = ote_cuda_device_make_current(c->dev);
    if (st == OTE_OK)
        st = ote_cuda_check(ote_cuda_device_driver(c->dev),
                            ote_cuda_device_table(c->dev)->cuIpcCloseMemHandle(m->local),
                            "cuIpcCloseMemHandle");
    if (st != OTE_OK) {
        /* Still mapped: the mapping is retained with a device reference of its own. */
        m->dev = c->dev;
        ote__cuda_device_ref(c->dev);
        ote__cuda_device_retain(c->dev, &m->retained, m, mapping_retry, "IPC mapping");
        return ote_status_make(OTE_ERR_RETAINED, ote_status_errno(st));
    }
    ote_free(m);
    return OTE_OK;
}

ote_status_t ote_cuda_ipc_cache_create(ote_cuda_device_t *dev, size_t max_entries,
                                       uint64_t max_bytes, ote_cuda_ipc_cache_t **cache_out) {
    if (dev == NULL || cache_out == NULL || max_entries == 0 || max_bytes == 0)
        return OTE_ERR_INVALID;
    ote_cuda_ipc_cache_t *c = ote_calloc(1, sizeof(*c));
    if (c == NULL) return OTE_ERR_NOMEM;
    ote_status_t st = ote_mutex_init(&c->mu);
    if (st != OTE_OK) {
        ote_free(c);
        return st;
    }
    c->dev = dev;
    c->max_entries = max_entries;
    c->max_bytes = max_bytes;
    ote__cuda_device_ref(dev);
    *cache_out = c;
    return OTE_OK;
}

ote_status_t ote_cuda_ipc_cache_destroy(ote_cuda_ipc_cache_t *c) {
    if (c == NULL) return OTE_OK;
    ote_mutex_lock(&c->mu);
    if (c->stats.in_use != 0) {
        ote_mutex_unlock(&c->mu);
        return OTE_ERR_BUSY;
    }
    ote_status_t result = OTE_OK;
    while (c->head != NULL) {
        ote_cuda_ipc_mapping_t *m = c->head;
        unlink_entry(c, m);
        ote_status_t st = close_mapping(c, m);
        if (st != OTE_OK) result = st;
    }
    ote_mutex_unlock(&c->mu);
    ote_mutex_destroy(&c->mu);
    ote__cuda_device_unref(c->dev);
    ote_free(c);
    return result;
}

static int same_handle(const ote_cuda_ipc_desc_t *a, const ote_cuda_ipc_desc_t *b) {
    return memcmp(&a->handle, &b->handle, sizeof(a->handle)) == 0 && a->base == b->base &&
           a->size == b->size;
}

/* Make room for size more bytes and one more entry by closing unused mappings, least
 * recently used first. Called with c->mu held. */
static ote_status_t make_room(ote_cuda_ipc_cache_t *c, uint64_t size) {
    ote_cuda_ipc_mapping_t *m = c->tail;
    while ((c->stats.entries + 1 > c->max_entries || c->stats.bytes + size > c->max_bytes) &&
           m != NULL) {
        ote_cuda_ipc_mapping_t *prev = m->prev;
        if (m->users == 0) {
            unlink_entry(c, m);
            c->stats.evictions++;
            (void)close_mapping(c, m); /* a failed close is retained and counted */
        }
        m = prev;
    }
    if (c->stats.entries + 1 > c->max_entries || c->stats.bytes + size > c->max_bytes)
        return OTE_ERR_AGAIN;
    return OTE_OK;
}

/* fd < 0: a cuIpcGetMemHandle export; else a VMM export's POSIX fd (the caller's). */
static ote_status_t import_any(ote_cuda_ipc_cache_t *c, uint64_t exporter_id,
                               const ote_cuda_ipc_desc_t *desc, int fd,
                               ote_cuda_ipc_mapping_t **map_out) {
    if (c == NULL || desc == NULL || map_out == NULL || desc->size == 0) return OTE_ERR_INVALID;
    if (desc->size > c->max_bytes) return OTE_ERR_TOO_BIG;
    ote_mutex_lock(&c->mu);
    for (ote_cuda_ipc_mapping_t *m = c->head; m != NULL; m = m->next) {
        if (m->invalid || m->exporter_id != exporter_id || m->desc.buffer_id != desc->buffer_id)
            continue;
        if (!same_handle(&m->desc, desc)) {
            /* Same key, other allocation: the cached one is stale. */
            m->invalid = 1;
            c->stats.invalidations++;
            if (m->users == 0) {
                unlink_entry(c, m);
                (void)close_mapping(c, m);
            }
            break;
        }
        if (m->users++ == 0) c->stats.in_use++;
        if (m != c->head) {
            ote_cuda_ipc_mapping_t *tmp = m;
            /* move to the front without touching the counters */
            if (tmp->prev != NULL) tmp->prev->next = tmp->next;
            if (tmp->next != NULL) tmp->next->prev = tmp->prev;
            else c->tail = tmp->prev;
            push_front(c, tmp);
        }
        c->stats.hits++;
        ote_mutex_unlock(&c->mu);
        *map_out = m;
        return OTE_OK;
    }
    ote_status_t st = make_room(c, desc->size);
    if (st != OTE_OK) goto out_unlock;
    /* Allocated before the open so that a failure after it cannot leave a mapping. */
    ote_cuda_ipc_mapping_t *m = ote_calloc(1, sizeof(*m));
    if (m == NULL) {
        st = OTE_ERR_NOMEM;
        goto out_unlock;
    }
    st = ote_cuda_device_make_current(c->dev);
    ote_cu_deviceptr_t local = 0;
    if (st == OTE_OK && fd >= 0) {
        /* cuMemImportFromShareableHandle, cuMemAddressReserve, cuMemMap, cuMemSetAccess;
         * a failure leaves nothing mapped (or retains what did not unwind). */
        st = ote_cuda_alloc_import_vmm(c->dev, fd, desc->size, &m->alloc);
        if (st == OTE_OK) local = ote_cuda_alloc_ptr(m->alloc);
    } else if (st == OTE_OK) {
        st = ote_cuda_check(ote_cuda_device_driver(c->dev),
                            ote_cuda_device_table(c->dev)->cuIpcOpenMemHandle(
                                &local, desc->handle, OTE_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                            "cuIpcOpenMemHandle");
    }
    if (st != OTE_OK) {
        ote_free(m);
        goto out_unlock;
    }
    m->exporter_id = exporter_id;
    m->desc = *desc;
    m->local = local;
    m->users = 1;
    push_front(c, m);
    c->stats.entries++;
    c->stats.bytes += desc->size;
    c->stats.in_use++;
    c->stats.imports++;
    ote_mutex_unlock(&c->mu);
    *map_out = m;
    return OTE_OK;

out_unlock:
    ote_mutex_unlock(&c->mu);
    return st;
}

ote_status_t ote_cuda_ipc_import(ote_cuda_ipc_cache_t *c, uint64_t exporter_id,
                                 const ote_cuda_ipc_desc_t *desc,
                                 ote_cuda_ipc_mapping_t **map_out) {
    return import_any(c, exporter_id, desc, -1, map_out);
}

ote_status_t ote_cuda_ipc_import_vmm(ote_cuda_ipc_cache_t *c, uint64_t exporter_id,
                                     const ote_cuda_ipc_desc_t *desc, int fd,
                                     ote_cuda_ipc_mapping_t **map_out) {
    if (fd < 0) return OTE_ERR_INVALID;
    return import_any(c, exporter_id, desc, fd, map_out);
}

void ote_cuda_ipc_mapping_put(ote_cuda_ipc_cache_t *c, ote_cuda_ipc_mapping_t *m) {
    if (c == NULL || m == NULL) return;
    ote_mutex_lock(&c->mu);
    if (--m->users == 0) {
        c->stats.in_use--;
        if (m->invalid) {
            unlink_entry(c, m);
            (void)close_mapping(c, m);
        }
    }
    ote_mutex_unlock(&c->mu);
}

ote_cu_deviceptr_t ote_cuda_ipc_mapping_base(const ote_cuda_ipc_mapping_t *m) { return m->local; }

ote_status_t ote_cuda_ipc_mapping_translate(const ote_cuda_ipc_mapping_t *m,
                                            ote_cu_deviceptr_t remote, size_t len,
                                            ote_cu_deviceptr_t *local_out) {
    if (m == NULL || local_out == NULL) return OTE_ERR_INVALID;
    if (remote < m->desc.base || len > m->desc.size || remote - m->desc.base > m->desc.size - len)
        return OTE_ERR_ACCESS;
    *local_out = m->local + (remote - m->desc.base);
    return OTE_OK;
}

/* Invalidate every entry matching; close the unused ones. Called with c->mu held. */
static size_t invalidate(ote_cuda_ipc_cache_t *c, uint64_t exporter_id, int any_buffer,
                         unsigned long long buffer_id) {
    size_t n = 0;
    ote_cuda_ipc_mapping_t *m = c->head;
    while (m != NULL) {
        ote_cuda_ipc_mapping_t *next = m->next;
        if (!m->invalid && m->exporter_id == exporter_id &&
            (any_buffer || m->desc.buffer_id == buffer_id)) {
            m->invalid = 1;
            n++;
            c->stats.invalidations++;
            if (m->users == 0) {
                unlink_entry(c, m);
                (void)close_mapping(c, m);
            }
        }
        m = next;
    }
    return n;
}

ote_status_t ote_cuda_ipc_close_receipt(ote_cuda_ipc_cache_t *c, uint64_t exporter_id,
                                        unsigned long long buffer_id) {
    if (c == NULL) return OTE_ERR_INVALID;
    ote_mutex_lock(&c->mu);
    size_t n = invalidate(c, exporter_id, 0, buffer_id);
    ote_mutex_unlock(&c->mu);
    return n == 0 ? OTE_ERR_NOT_FOUND : OTE_OK;
}

size_t ote_cuda_ipc_exporter_dead(ote_cuda_ipc_cache_t *c, uint64_t exporter_id) {
    if (c == NULL) return 0;
    ote_mutex_lock(&c->mu);
    size_t n = invalidate(c, exporter_id, 1, 0);
    ote_mutex_unlock(&c->mu);
    return n;
}

void ote_cuda_ipc_cache_stats(ote_cuda_ipc_cache_t *c, ote_cuda_ipc_cache_stats_t *out) {
    ote_mutex_lock(&c->mu);
    *out = c->stats;
    ote_mutex_unlock(&c->mu);
}

#include "cuda/pinned/pinned.h"

#include "base/alloc.h"
#include "base/lock.h"
#include "base/log.h"

struct ote_cuda_host_mem {
    ote_cuda_device_t *dev;
    void *ptr;
    size_t size;
    int registered; /* cuMemHostRegister of caller memory (else cuMemHostAlloc) */
    int live;       /* the native allocation/registration exists */
    ote_mutex_t mu;
    ote_cond_t cv;
    uint32_t users;
    int closing;
    ote__cuda_retained_node_t retained;
};

static ote_status_t host_release_native(ote_cuda_host_mem_t *m) {
    if (!m->live) return OTE_OK;
    ote_cuda_driver_t *drv = ote_cuda_device_driver(m->dev);
    const ote_cuda_driver_table_t *t = ote_cuda_device_table(m->dev);
    ote_status_t st = ote_cuda_device_make_current(m->dev);
    if (st != OTE_OK) return st;
    st = m->registered ? ote_cuda_check(drv, t->cuMemHostUnregister(m->ptr), "cuMemHostUnregister")
                       : ote_cuda_check(drv, t->cuMemFreeHost(m->ptr), "cuMemFreeHost");
    if (st == OTE_OK) m->live = 0;
    return st;
}

static void host_free_struct(ote_cuda_host_mem_t *m) {
    ote_cuda_device_t *dev = m->dev;
    ote_cond_destroy(&m->cv);
    ote_mutex_destroy(&m->mu);
    ote_free(m);
    ote__cuda_device_unref(dev);
}

static ote_status_t host_retry(void *owner) {
    ote_cuda_host_mem_t *m = owner;
    ote_status_t st = host_release_native(m);
    if (st != OTE_OK) return st;
    host_free_struct(m);
    return OTE_OK;
}

static ote_status_t host_create(ote_cuda_device_t *dev, void *ptr, size_t size, int registered,
                                ote_cuda_host_mem_t **mem_out) {
    if (dev == NULL || mem_out == NULL || size == 0 || (registered && ptr == NULL))
        return OTE_ERR_INVALID;
    ote_cuda_host_mem_t *m = ote_calloc(1, sizeof(*m));
    if (m == NULL) return OTE_ERR_NOMEM;
    m->dev = dev;
    m->size = size;
    m->registered = registered;
    ote_status_t st = ote_mutex_init(&m->mu);
    if (st != OTE_OK) goto err_free;
    st = ote_cond_init(&m->cv);
    if (st != OTE_OK) goto err_mutex;
    st = ote_cuda_device_make_current(dev);
    if (st != OTE_OK) goto err_cond;
    ote_cuda_driver_t *drv = ote_cuda_device_driver(dev);
    const ote_cuda_driver_table_t *t = ote_cuda_device_table(dev);
    if (registered) {
        st = ote_cuda_check(drv, t->cuMemHostRegister(ptr, size, OTE_CU_MEMHOSTREGISTER_PORTABLE),
                            "cuMemHostRegister");
        if (st != OTE_OK) goto err_cond;
        m->ptr = ptr;
    } else {
        void *p = NULL;
        st = ote_cuda_check(drv, t->cuMemHostAlloc(&p, size, OTE_CU_MEMHOSTALLOC_PORTABLE),
                            "cuMemHostAlloc");
        if (st != OTE_OK) goto err_cond;
        m->ptr = p;
    }
    m->live = 1;
    ote__cuda_device_ref(dev); /* held until the memory is gone */
    *mem_out = m;
    return OTE_OK;

err_cond:
    ote_cond_destroy(&m->cv);
err_mutex:
    ote_mutex_destroy(&m->mu);
err_free:
    ote_free(m);
    return st;
}

ote_status_t ote_cuda_host_alloc(ote_cuda_device_t *dev, size_t size,
                                 ote_cuda_host_mem_t **mem_out) {
    return host_create(dev, NULL, size, 0, mem_out);
}

ote_status_t ote_cuda_host_register(ote_cuda_device_t *dev, void *ptr, size_t size,
                                    ote_cuda_host_mem_t **mem_out) {
    return host_create(dev, ptr, size, 1, mem_out);
}

ote_status_t ote_cuda_host_mem_destroy(ote_cuda_host_mem_t *m, ote_deadline_t deadline) {
    if (m == NULL) return OTE_OK;
    ote_mutex_lock(&m->mu);
    m->closing = 1;
    while (m->users != 0) {
        if (ote_cond_wait(&m->cv, &m->mu, deadline) == OTE_ERR_TIMEOUT && m->users != 0) {
            m->closing = 0;
            ote_mutex_unlock(&m->mu);
            return OTE_ERR_BUSY;
        }
    }
    ote_mutex_unlock(&m->mu);
    ote_status_t st = host_release_native(m);
    if (st != OTE_OK) {
        ote__cuda_device_retain(m->dev, &m->retained, m, host_retry,
                                m->registered ? "host registration" : "pinned host allocation");
        return ote_status_make(OTE_ERR_RETAINED, ote_status_errno(st));
    }
    host_free_struct(m);
    return OTE_OK;
}

void *ote_cuda_host_mem_ptr(const ote_cuda_host_mem_t *m) { return m->ptr; }
size_t ote_cuda_host_mem_size(const ote_cuda_host_mem_t *m) { return m->size; }
int ote_cuda_host_mem_is_registered(const ote_cuda_host_mem_t *m) { return m->registered; }
ote_cuda_device_t *ote_cuda_host_mem_device(const ote_cuda_host_mem_t *m) { return m->dev; }

ote_status_t ote_cuda_host_mem_acquire(ote_cuda_host_mem_t *m) {
    if (m == NULL) return OTE_ERR_INVALID;
    ote_mutex_lock(&m->mu);
    ote_status_t st = m->closing ? OTE_ERR_STATE : OTE_OK;
    if (st == OTE_OK) m->users++;
    ote_mutex_unlock(&m->mu);
    return st;
}

void ote_cuda_host_mem_release(ote_cuda_host_mem_t *m) {
    ote_mutex_lock(&m->mu);
    if (--m->users == 0) ote_cond_broadcast(&m->cv);
    ote_mutex_unlock(&m->mu);
}

uint32_t ote_cuda_host_mem_users(ote_cuda_host_mem_t *m) {
    ote_mutex_lock(&m->mu);
    uint32_t n = m->users;
    ote_mutex_unlock(&m->mu);
    return n;
}

/* ---- staging chunks ---- */

struct ote_cuda_staging {
    ote_cuda_host_mem_t *mem;
    size_t chunk_size;
    uint32_t count;
    ote_mutex_t mu;
    ote_cond_t cv;
    uint32_t *free_stack; /* indices of free chunks */
    uint32_t n_free;
    uint8_t *out; /* out[i]: chunk i is handed out */
};

ote_status_t ote_cuda_staging_create(ote_cuda_device_t *dev, size_t chunk_size,
                                     uint32_t chunk_count, ote_cuda_staging_t **pool_out) {
    if (dev == NULL || pool_out == NULL || chunk_size == 0 || chunk_count == 0)
        return OTE_ERR_INVALID;
    if (chunk_size > SIZE_MAX / chunk_count) return OTE_ERR_TOO_BIG;
    ote_cuda_staging_t *p = ote_calloc(1, sizeof(*p));
    if (p == NULL) return OTE_ERR_NOMEM;
    p->chunk_size = chunk_size;
    p->count = chunk_count;
    ote_status_t st = OTE_ERR_NOMEM;
    p->free_stack = ote_calloc(chunk_count, sizeof(*p->free_stack));
    p->out = ote_calloc(chunk_count, 1);
    if (p->free_stack == NULL || p->out == NULL) goto err_arrays;
    st = ote_mutex_init(&p->mu);
    if (st != OTE_OK) goto err_arrays;
    st = ote_cond_init(&p->cv);
    if (st != OTE_OK) goto err_mutex;
    st = ote_cuda_host_alloc(dev, chunk_size * chunk_count, &p->mem);
    if (st != OTE_OK) goto err_cond;
    for (uint32_t i = 0; i < chunk_count; i++) p->free_stack[i] = chunk_count - 1 - i;
    p->n_free = chunk_count;
    *pool_out = p;
    return OTE_OK;

err_cond:
    ote_cond_destroy(&p->cv);
err_mutex:
    ote_mutex_destroy(&p->mu);
err_arrays:
    ote_free(p->out);
    ote_free(p->free_stack);
    ote_free(p);
    return st;
}

ote_status_t ote_cuda_staging_destroy(ote_cuda_staging_t *p) {
    if (p == NULL) return OTE_OK;
    ote_mutex_lock(&p->mu);
    uint32_t n_free = p->n_free;
    ote_mutex_unlock(&p->mu);
    if (n_free != p->count) return OTE_ERR_BUSY;
    /* Every chunk is home, so nobody uses the memory: destroy does not wait. A retained
     * memory owner lives on, on its device's list; the pool itself is gone either way. */
    ote_status_t st = ote_cuda_host_mem_destroy(p->mem, 0);
    ote_cond_destroy(&p->cv);
    ote_mutex_destroy(&p->mu);
    ote_free(p->out);
    ote_free(p->free_stack);
    ote_free(p);
    return st;
}

ote_status_t ote_cuda_staging_acquire(ote_cuda_staging_t *p, ote_deadline_t deadline,
                                      ote_cuda_chunk_t *chunk_out) {
    if (p == NULL || chunk_out == NULL) return OTE_ERR_INVALID;
    ote_mutex_lock(&p->mu);
    while (p->n_free == 0) {
        if (ote_cond_wait(&p->cv, &p->mu, deadline) == OTE_ERR_TIMEOUT && p->n_free == 0) {
            ote_mutex_unlock(&p->mu);
            return OTE_ERR_TIMEOUT;
        }
    }
    uint32_t i = p->free_stack[--p->n_free];
    p->out[i] = 1;
    ote_mutex_unlock(&p->mu);
    chunk_out->ptr = (char *)ote_cuda_host_mem_ptr(p->mem) + (size_t)i * p->chunk_size;
    chunk_out->size = p->chunk_size;
    chunk_out->index = i;
    return OTE_OK;
}

ote_status_t ote_cuda_staging_release(ote_cuda_staging_t *p, const ote_cuda_chunk_t *chunk) {
    if (p == NULL || chunk == NULL || chunk->index >= p->count) return OTE_ERR_INVALID;
    ote_mutex_lock(&p->mu);
    if (!p->out[chunk->index]) {
        ote_mutex_unlock(&p->mu);
        return OTE_ERR_INVALID;
    }
    p->out[chunk->index] = 0;
    p->free_stack[p->n_free++] = chunk->index;
    ote_cond_signal(&p->cv);
    ote_mutex_unlock(&p->mu);
    return OTE_OK;
}

uint32_t ote_cuda_staging_free_count(ote_cuda_staging_t *p) {
    ote_mutex_lock(&p->mu);
    uint32_t n = p->n_free;
    ote_mutex_unlock(&p->mu);
    return n;
}

ote_cuda_host_mem_t *ote_cuda_staging_host_mem(ote_cuda_staging_t *p) { return p->mem; }

#include "cuda/memory/device.h"

#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/lock.h"
#include "base/log.h"

struct ote_cuda_device {
    ote_cuda_driver_t *drv;
    const ote_cuda_driver_table_t *t;
    int ordinal;
    ote_cu_device_t handle;
    ote_cu_context_t ctx;
    int release_failed; /* the device itself is retained (counted once) */
    char name[128];
    ote_mutex_t mu; /* guards owners and the retained list */
    size_t owners;
    size_t n_retained;
    ote__cuda_retained_node_t *retained;
};

ote_status_t ote_cuda_device_open(ote_cuda_driver_t *drv, int ordinal,
                                  ote_cuda_device_t **dev_out) {
    if (drv == NULL || dev_out == NULL || ordinal < 0) return OTE_ERR_INVALID;
    const ote_cuda_driver_table_t *t = ote_cuda_driver_table(drv);
    ote_cuda_device_t *dev = ote_calloc(1, sizeof(*dev));
    if (dev == NULL) return OTE_ERR_NOMEM;
    dev->drv = drv;
    dev->t = t;
    dev->ordinal = ordinal;
    ote_status_t st = ote_mutex_init(&dev->mu);
    if (st != OTE_OK) goto err_free;
    st = ote_cuda_check(drv, t->cuDeviceGet(&dev->handle, ordinal), "cuDeviceGet");
    if (st != OTE_OK) goto err_mutex;
    if (ote_cuda_check(drv, t->cuDeviceGetName(dev->name, (int)sizeof(dev->name) - 1, dev->handle),
                       "cuDeviceGetName") != OTE_OK)
        snprintf(dev->name, sizeof(dev->name), "CUDA device %d", ordinal);
    st = ote_cuda_check(drv, t->cuDevicePrimaryCtxRetain(&dev->ctx, dev->handle),
                        "cuDevicePrimaryCtxRetain");
    if (st != OTE_OK) goto err_mutex;
    *dev_out = dev;
    return OTE_OK;

err_mutex:
    ote_mutex_destroy(&dev->mu);
err_free:
    ote_free(dev);
    return st;
}

ote_status_t ote_cuda_device_close(ote_cuda_device_t *dev) {
    if (dev == NULL) return OTE_OK;
    ote_mutex_lock(&dev->mu);
    size_t owners = dev->owners;
    ote_mutex_unlock(&dev->mu);
    if (owners != 0) return OTE_ERR_BUSY;
    ote_cu_result_t res = dev->t->cuDevicePrimaryCtxRelease(dev->handle);
    if (res != OTE_CU_SUCCESS) {
        ote_status_t st = ote_cuda_check(dev->drv, res, "cuDevicePrimaryCtxRelease");
        if (!dev->release_failed) {
            dev->release_failed = 1;
            ote__cuda_retained_note(dev->drv, 1);
        }
        OTE_WARN("cuda", "device %d: primary context retained (%s)", dev->ordinal,
                 ote_status_str(st));
        return ote_status_make(OTE_ERR_RETAINED, res);
    }
    if (dev->release_failed) ote__cuda_retained_note(dev->drv, -1);
    ote_mutex_destroy(&dev->mu);
    ote_free(dev);
    return OTE_OK;
}

ote_status_t ote_cuda_device_make_current(ote_cuda_device_t *dev) {
    if (dev == NULL) return OTE_ERR_INVALID;
    return ote_cuda_check(dev->drv, dev->t->cuCtxSetCurrent(dev->ctx), "cuCtxSetCurrent");
}

ote_status_t ote_cuda_device_reclaim(ote_cuda_device_t *dev, size_t *left_out) {
    if (dev == NULL) return OTE_ERR_INVALID;
    /* Take the whole list, retry without the lock (a successful retry frees its owner and
     * unrefs the device, which takes the lock), put the failures back. */
    ote_mutex_lock(&dev->mu);
    ote__cuda_retained_node_t *list = dev->retained;
    dev->retained = NULL;
    ote_mutex_unlock(&dev->mu);
    ote__cuda_retained_node_t *keep = NULL;
    size_t released = 0;
    while (list != NULL) {
        ote__cuda_retained_node_t *n = list;
        list = n->next;
        const char *what = n->what;
        if (n->retry(n->owner) == OTE_OK) {
            /* n is gone with its owner. */
            released++;
            OTE_INFO("cuda", "device %d: retained %s released", dev->ordinal, what);
        } else {
            n->next = keep;
            keep = n;
        }
    }
    ote_mutex_lock(&dev->mu);
    while (keep != NULL) {
        ote__cuda_retained_node_t *n = keep;
        keep = n->next;
        n->next = dev->retained;
        dev->retained = n;
    }
    dev->n_retained -= released;
    size_t left = dev->n_retained;
    ote_mutex_unlock(&dev->mu);
    if (released != 0) ote__cuda_retained_note(dev->drv, -(int)released);
    if (left_out != NULL) *left_out = left;
    return left == 0 ? OTE_OK : OTE_ERR_RETAINED;
}

size_t ote_cuda_device_retained(ote_cuda_device_t *dev) {
    if (dev == NULL) return 0;
    ote_mutex_lock(&dev->mu);
    size_t n = dev->n_retained;
    ote_mutex_unlock(&dev->mu);
    return n;
}

size_t ote_cuda_device_owners(ote_cuda_device_t *dev) {
    if (dev == NULL) return 0;
    ote_mutex_lock(&dev->mu);
    size_t n = dev->owners;
    ote_mutex_unlock(&dev->mu);
    return n;
}

ote_cuda_driver_t *ote_cuda_device_driver(const ote_cuda_device_t *dev) { return dev->drv; }
const ote_cuda_driver_table_t *ote_cuda_device_table(const ote_cuda_device_t *dev) {
    return dev->t;
}
int ote_cuda_device_ordinal(const ote_cuda_device_t *dev) { return dev->ordinal; }
ote_cu_device_t ote_cuda_device_handle(const ote_cuda_device_t *dev) { return dev->handle; }
ote_cu_context_t ote_cuda_device_context(const ote_cuda_device_t *dev) { return dev->ctx; }
const char *ote_cuda_device_name(const ote_cuda_device_t *dev) { return dev->name; }

void ote__cuda_device_ref(ote_cuda_device_t *dev) {
    ote_mutex_lock(&dev->mu);
    dev->owners++;
    ote_mutex_unlock(&dev->mu);
}

void ote__cuda_device_unref(ote_cuda_device_t *dev) {
    ote_mutex_lock(&dev->mu);
    dev->owners--;
    ote_mutex_unlock(&dev->mu);
}

void ote__cuda_device_retain(ote_cuda_device_t *dev, ote__cuda_retained_node_t *node, void *owner,
                             ote__cuda_retry_fn retry, const char *what) {
    node->owner = owner;
    node->retry = retry;
    node->what = what;
    ote_mutex_lock(&dev->mu);
    node->next = dev->retained;
    dev->retained = node;
    dev->n_retained++;
    ote_mutex_unlock(&dev->mu);
    ote__cuda_retained_note(dev->drv, 1);
    OTE_WARN("cuda", "device %d: %s retained after a failed or uncertain cleanup", dev->ordinal,
             what);
}

/*
 * engine/file/gds.c - GPUDirect Storage for the local segment (file_internal.h): the
 * bytes of a request between device memory and a file registration moved by libcufile
 * (cuda/cufile.h) instead of being staged through pinned host chunks.
 *
 * libcufile is loaded the first time such a request is submitted (ote__gds_create; a
 * host-only user never loads it). Where it is absent or cuFileDriverOpen fails, one INFO
 * line says so and every such request is staged by engine/gpu as before. A registration
 * gets its cuFile handle (cuFileHandleRegister of its O_DIRECT descriptor where it has
 * one, else the buffered one) with its first GDS slice and loses it when it is freed.
 * Device memory the user registered with the engine (ote_memory_register) is registered
 * with cuFile whole (cuFileBufRegister of the registration's extent) by its first GDS
 * slice and stays so until ote_memory_unregister (dev_unregister, under the registry's
 * lock, when no request holds it) or the engine's destroy (ote__gds_release): the
 * library's "streaming buffer reused across many I/Os" use, its slices passing the
 * registration's base and their offset in it. Where the library refuses the whole extent
 * (an INFO line, once per registration), and for device memory the engine has not
 * registered, each slice registers its own range for its one cuFileRead or cuFileWrite and
 * deregisters it after; a range the library refuses to register, or a handle it refuses,
 * ends the slice OTE_ERR_UNSUPPORTED with nothing moved, so the engine stages that slice
 * instead (the declined-device-slice path of engine/batch.c). The calls run on the file
 * owner's second thread pool (file_io.c, its `gds` slices): like preadv, a cuFile call
 * once started is not interrupted; cancel and deadlines reach the slices still queued.
 */

#include <errno.h>
#include <string.h>

#include "base/alloc.h"
#include "base/hash.h"
#include "base/lock.h"
#include "base/log.h"
#include "cuda/cufile.h"
#include "engine/file/file_internal.h"

/* A device registration of the engine as cuFile knows it: registered whole (KEPT) or
 * refused (each slice then registers its own range). Keyed by the registration's base. */
typedef enum { GDS_BUF_KEPT = 0, GDS_BUF_REFUSED } gds_buf_state_t;
typedef struct {
    uint64_t base, len;
    gds_buf_state_t state;
    UT_hash_handle hh;
} gds_buf_t;

struct ote__gds {
    ote_cufile_t *cf;
    const ote_cufile_table_t *t;
    ote_mutex_t mu;     /* handle registration, bufs (never held across a cuFile call on bufs) */
    ote_mutex_t reg_mu; /* one whole-extent cuFileBufRegister at a time (gds_kept) */
    gds_buf_t *bufs;    /* by base */
};

ote_status_t ote__gds_create(ote__gds_t **out) {
    ote__gds_t *g = ote_calloc(1, sizeof(*g));
    if (g == NULL) return OTE_ERR_NOMEM;
    ote_status_t st = ote_mutex_init(&g->mu);
    if (st == OTE_OK && (st = ote_mutex_init(&g->reg_mu)) != OTE_OK) ote_mutex_destroy(&g->mu);
    if (st == OTE_OK) {
        st = ote_cufile_load(NULL, &g->cf);
        if (st != OTE_OK) {
            ote_mutex_destroy(&g->reg_mu);
            ote_mutex_destroy(&g->mu);
        }
    }
    if (st != OTE_OK) {
        if (ote_status_code(st) == OTE_ERR_NO_DEVICE)
            OTE_INFO("file",
                     "device memory <-> file requests are staged through pinned host "
                     "memory (no GPUDirect Storage)");
        ote_free(g);
        return st;
    }
    g->t = ote_cufile_table(g->cf);
    OTE_INFO("file", "device memory <-> file requests use GPUDirect Storage (libcufile)");
    *out = g;
    return OTE_OK;
}

void ote__gds_release(ote__gds_t *g) {
    if (g == NULL) return;
    gds_buf_t *b, *tmp;
    HASH_ITER(hh, g->bufs, b, tmp) {
        if (b->state == GDS_BUF_KEPT)
            (void)ote_cufile_check(g->t->cuFileBufDeregister((void *)(uintptr_t)b->base),
                                   "cuFileBufDeregister");
        HASH_DEL(g->bufs, b);
        ote_free(b);
    }
}

void ote__gds_destroy(ote__gds_t *g) {
    if (g == NULL) return;
    ote__gds_release(g);
    ote_cufile_unload(g->cf);
    ote_mutex_destroy(&g->reg_mu);
    ote_mutex_destroy(&g->mu);
    ote_free(g);
}

ote_status_t ote__gds_reg_open(ote__gds_t *g, ote__freg_t *r) {
    ote_status_t st = OTE_OK;
    ote_mutex_lock(&g->mu);
    if (r->gds_fh == NULL) {
        ote_cufile_descr_t d;
        memset(&d, 0, sizeof(d));
        d.type = OTE_CUFILE_HANDLE_TYPE_OPAQUE_FD;
        d.handle.fd = r->dfd >= 0 ? r->dfd : r->fd;
        ote_cufile_handle_t fh = NULL;
        st = ote_cufile_check(g->t->cuFileHandleRegister(&fh, &d), "cuFileHandleRegister");
        if (st == OTE_OK) {
            r->gds_fh = fh;
            r->gds = g;
        }
    }
    ote_mutex_unlock(&g->mu);
    return st;
}

void ote__gds_reg_close(ote__freg_t *r) {
    if (r->gds_fh == NULL) return;
    r->gds->t->cuFileHandleDeregister(r->gds_fh);
    r->gds_fh = NULL;
}

void ote__gds_dev_unregister(ote__gds_t *g, uint64_t base) {
    if (g == NULL) return;
    ote_mutex_lock(&g->mu);
    gds_buf_t *b = NULL;
    HASH_FIND(hh, g->bufs, &base, sizeof(base), b);
    if (b != NULL) HASH_DEL(g->bufs, b);
    ote_mutex_unlock(&g->mu);
    if (b != NULL && b->state == GDS_BUF_KEPT)
        (void)ote_cufile_check(g->t->cuFileBufDeregister((void *)(uintptr_t)b->base),
                               "cuFileBufDeregister");
    ote_free(b);
}

/* The entry of the registration reg (under g->mu), NULL when there is none yet. One whose
 * extent is not reg's (a stale entry: never expected) is dropped with a WARN. */
static gds_buf_t *buf_find(ote__gds_t *g, const ote__pin_t *reg) {
    gds_buf_t *b = NULL;
    HASH_FIND(hh, g->bufs, &reg->base, sizeof(reg->base), b);
    if (b == NULL || b->len == reg->len) return b;
    OTE_WARN("file", "cuFile registration of %p (+%llu) outlived its registration: dropped",
             (void *)(uintptr_t)b->base, (unsigned long long)b->len);
    HASH_DEL(g->bufs, b);
    if (b->state == GDS_BUF_KEPT)
        (void)ote_cufile_check(g->t->cuFileBufDeregister((void *)(uintptr_t)b->base),
                               "cuFileBufDeregister");
    ote_free(b);
    return NULL;
}

/* reg's entry, its extent registered with cuFile whole (KEPT) or refused (an INFO line),
 * made by the first slice that asks; the cuFile call under reg_mu only, so that an
 * unregister (g->mu, under the registry's lock) never waits for one. NULL: no memory. */
static gds_buf_t *buf_make(ote__gds_t *g, const ote__pin_t *reg) {
    ote_mutex_lock(&g->reg_mu);
    ote_mutex_lock(&g->mu);
    gds_buf_t *b = buf_find(g, reg); /* made meanwhile by another slice? */
    ote_mutex_unlock(&g->mu);
    if (b == NULL && (b = ote_calloc(1, sizeof(*b))) != NULL) {
        b->base = reg->base;
        b->len = reg->len;
        ote_status_t st = ote_cufile_check(
            g->t->cuFileBufRegister((void *)(uintptr_t)b->base, b->len, 0), "cuFileBufRegister");
        b->state = st == OTE_OK ? GDS_BUF_KEPT : GDS_BUF_REFUSED;
        if (st != OTE_OK)
            OTE_INFO("file",
                     "device registration %p (+%llu) not registered with cuFile whole (%s): "
                     "each GPUDirect Storage chunk registers its own range",
                     (void *)(uintptr_t)b->base, (unsigned long long)b->len, ote_status_str(st));
        ote_mutex_lock(&g->mu);
        OTE_HASH_ADD(hh, g->bufs, base, sizeof(b->base), b, st);
        ote_mutex_unlock(&g->mu);
        if (st != OTE_OK) {
            if (b->state == GDS_BUF_KEPT)
                (void)ote_cufile_check(g->t->cuFileBufDeregister((void *)(uintptr_t)b->base),
                                       "cuFileBufDeregister");
            ote_free(b);
            b = NULL;
        }
    }
    ote_mutex_unlock(&g->reg_mu);
    if (b == NULL)
        OTE_WARN("file",
                 "no memory to keep the cuFile registration of %p: this chunk registers "
                 "its own range",
                 (void *)(uintptr_t)reg->base);
    return b;
}

/* The kept cuFile registration that covers s's device range, its registration's base in
 * *base_out: OTE_OK, else OTE_ERR_NOT_FOUND (no engine registration holds the range, or
 * cuFile refused it whole, or no memory for the entry): the slice then registers its own
 * range. The slice's request pins the registration, so no unregister removes the entry
 * while the slice uses it. */
static ote_status_t gds_kept(ote__gds_t *g, const ote__slice_t *s, uint64_t *base_out) {
    const ote__pin_t *reg = s->local_reg;
    uint64_t at = (uint64_t)(uintptr_t)s->local;
    if (reg == NULL || !OTE_MEM_IS_CUDA(reg->kind) || at < reg->base || at - reg->base > reg->len ||
        s->len > reg->len - (at - reg->base))
        return OTE_ERR_NOT_FOUND;
    ote_mutex_lock(&g->mu);
    gds_buf_t *b = buf_find(g, reg);
    int kept = b != NULL && b->state == GDS_BUF_KEPT; /* an entry's state never changes */
    ote_mutex_unlock(&g->mu);
    if (b == NULL) {
        b = buf_make(g, reg);
        kept = b != NULL && b->state == GDS_BUF_KEPT;
    }
    if (!kept) return OTE_ERR_NOT_FOUND;
    *base_out = reg->base;
    return OTE_OK;
}

ote_status_t ote__gds_move(ote__slice_t *s) {
    ote__fop_t *op = ote__fop(s);
    ote__gds_t *g = op->reg->gds;
    const char *call = op->write ? "cuFileWrite" : "cuFileRead";
    uint64_t kbase = 0;
    int kept = gds_kept(g, s, &kbase) == OTE_OK;
    void *base = kept ? (void *)(uintptr_t)kbase : s->local;
    off_t boff = kept ? (off_t)((uint64_t)(uintptr_t)s->local - kbase) : 0;
    ote_status_t st = OTE_OK;
    if (!kept)
        st = ote_cufile_check(g->t->cuFileBufRegister(s->local, s->len, 0), "cuFileBufRegister");
    if (st != OTE_OK) {
        OTE_INFO("file", "device buffer %p (+%u) not registered with cuFile: staged instead",
                 (void *)s->local, s->len);
        return ote_status_make(OTE_ERR_UNSUPPORTED, ote_status_errno(st));
    }
    ssize_t ret = op->write
                      ? g->t->cuFileWrite(op->reg->gds_fh, base, s->len, (off_t)op->foff, boff)
                      : g->t->cuFileRead(op->reg->gds_fh, base, s->len, (off_t)op->foff, boff);
    int err = errno;
    st = ote_cufile_io_status(ret, err, s->len, call);
    if (!kept) (void)ote_cufile_check(g->t->cuFileBufDeregister(s->local), "cuFileBufDeregister");
    if (st != OTE_OK)
        OTE_WARN("file", "GPUDirect Storage %s of %u bytes at offset %llu of %s failed: %s", call,
                 s->len, (unsigned long long)op->foff, op->reg->path, ote_status_str(st));
    return st;
}

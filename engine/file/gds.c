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
 * Each slice registers its device range (cuFileBufRegister) for the length of its one
 * cuFileRead or cuFileWrite and deregisters it after; a range the library refuses to
 * register, or a handle it refuses, ends the slice OTE_ERR_UNSUPPORTED with nothing moved,
 * so the engine stages that slice instead (the declined-device-slice path of
 * engine/batch.c). The calls run on the file owner's second thread pool (file_io.c, its
 * `gds` slices): like preadv, a cuFile call once started is not interrupted; cancel and
 * deadlines reach the slices still queued.
 */

#include <errno.h>
#include <string.h>

#include "base/alloc.h"
#include "base/lock.h"
#include "base/log.h"
#include "cuda/cufile.h"
#include "engine/file/file_internal.h"

struct ote__gds {
    ote_cufile_t *cf;
    const ote_cufile_table_t *t;
    ote_mutex_t mu; /* handle registration */
};

ote_status_t ote__gds_create(ote__gds_t **out) {
    ote__gds_t *g = ote_calloc(1, sizeof(*g));
    if (g == NULL) return OTE_ERR_NOMEM;
    ote_status_t st = ote_mutex_init(&g->mu);
    if (st == OTE_OK) {
        st = ote_cufile_load(NULL, &g->cf);
        if (st != OTE_OK) ote_mutex_destroy(&g->mu);
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

void ote__gds_destroy(ote__gds_t *g) {
    if (g == NULL) return;
    ote_cufile_unload(g->cf);
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

ote_status_t ote__gds_move(ote__slice_t *s) {
    ote__fop_t *op = ote__fop(s);
    ote__gds_t *g = op->reg->gds;
    const char *call = op->write ? "cuFileWrite" : "cuFileRead";
    ote_status_t st =
        ote_cufile_check(g->t->cuFileBufRegister(s->local, s->len, 0), "cuFileBufRegister");
    if (st != OTE_OK) {
        OTE_INFO("file", "device buffer %p (+%u) not registered with cuFile: staged instead",
                 (void *)s->local, s->len);
        return ote_status_make(OTE_ERR_UNSUPPORTED, ote_status_errno(st));
    }
    ssize_t ret = op->write
                      ? g->t->cuFileWrite(op->reg->gds_fh, s->local, s->len, (off_t)op->foff, 0)
                      : g->t->cuFileRead(op->reg->gds_fh, s->local, s->len, (off_t)op->foff, 0);
    int err = errno;
    st = ote_cufile_io_status(ret, err, s->len, call);
    (void)ote_cufile_check(g->t->cuFileBufDeregister(s->local), "cuFileBufDeregister");
    if (st != OTE_OK)
        OTE_WARN("file", "GPUDirect Storage %s of %u bytes at offset %llu of %s failed: %s", call,
                 s->len, (unsigned long long)op->foff, op->reg->path, ote_status_str(st));
    return st;
}

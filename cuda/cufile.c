#include "cuda/cufile.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"

struct ote_cufile {
    ote_cufile_table_t t;
    void *dl;
};

/* Every entry with the symbols tried for it, first found wins. */
#define ENTRY(field, sym, alt) \
    { #field, sym, alt, offsetof(ote_cufile_table_t, field) }
static const struct {
    const char *name;
    const char *symbol;
    const char *alt; /* NULL: none */
    size_t offset;
} k_entries[] = {
    ENTRY(cuFileDriverOpen, "cuFileDriverOpen", NULL),
    ENTRY(cuFileDriverClose, "cuFileDriverClose_v2", "cuFileDriverClose"),
    ENTRY(cuFileHandleRegister, "cuFileHandleRegister", NULL),
    ENTRY(cuFileHandleDeregister, "cuFileHandleDeregister", NULL),
    ENTRY(cuFileBufRegister, "cuFileBufRegister", NULL),
    ENTRY(cuFileBufDeregister, "cuFileBufDeregister", NULL),
    ENTRY(cuFileRead, "cuFileRead", NULL),
    ENTRY(cuFileWrite, "cuFileWrite", NULL),
};
#undef ENTRY
#define N_ENTRIES (sizeof(k_entries) / sizeof(k_entries[0]))

static ote_status_t resolve(ote_cufile_t *cf, const char *path) {
    for (size_t i = 0; i < N_ENTRIES; i++) {
        void *sym = dlsym(cf->dl, k_entries[i].symbol);
        if (sym == NULL && k_entries[i].alt != NULL) sym = dlsym(cf->dl, k_entries[i].alt);
        if (sym == NULL) {
            OTE_WARN("cufile", "cuFile library %s lacks %s", path, k_entries[i].symbol);
            return OTE_ERR_UNSUPPORTED;
        }
        *(void **)((char *)&cf->t + k_entries[i].offset) = sym;
    }
    return OTE_OK;
}

ote_status_t ote_cufile_load(const char *path, ote_cufile_t **out) {
    if (out == NULL) return OTE_ERR_INVALID;
    if (path == NULL) path = getenv("OTE_CUFILE_LIBRARY");
    if (path == NULL || path[0] == '\0') path = "libcufile.so.0";
    /* NODELETE like the CUDA driver: libcufile keeps threads of its own. */
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (dl == NULL) {
        OTE_INFO("cufile", "no GPUDirect Storage: dlopen(%s) failed: %s", path, dlerror());
        return OTE_ERR_NO_DEVICE;
    }
    ote_cufile_t *cf = ote_calloc(1, sizeof(*cf));
    if (cf == NULL) {
        dlclose(dl);
        return OTE_ERR_NOMEM;
    }
    cf->dl = dl;
    ote_status_t st = resolve(cf, path);
    if (st == OTE_OK) {
        ote_cufile_error_t e = cf->t.cuFileDriverOpen();
        if (e.err != OTE_CUFILE_SUCCESS) {
            OTE_INFO("cufile",
                     "no GPUDirect Storage: cuFileDriverOpen of %s: CUfileOpError %d "
                     "(CUresult %d)",
                     path, e.err, e.cu_err);
            st = ote_status_make(OTE_ERR_NO_DEVICE, e.err);
        }
    }
    if (st != OTE_OK) {
        dlclose(dl);
        ote_free(cf);
        return st;
    }
    *out = cf;
    return OTE_OK;
}

void ote_cufile_unload(ote_cufile_t *cf) {
    if (cf == NULL) return;
    (void)ote_cufile_check(cf->t.cuFileDriverClose(), "cuFileDriverClose");
    dlclose(cf->dl);
    ote_free(cf);
}

const ote_cufile_table_t *ote_cufile_table(const ote_cufile_t *cf) {
    return cf == NULL ? NULL : &cf->t;
}

void *ote_cufile_dl_handle(const ote_cufile_t *cf) { return cf == NULL ? NULL : cf->dl; }

ote_status_t ote_cufile_check(ote_cufile_error_t e, const char *call) {
    if (e.err == OTE_CUFILE_SUCCESS) return OTE_OK;
    OTE_WARN("cufile", "%s: CUfileOpError %d (CUresult %d)", call, e.err, e.cu_err);
    return ote_status_make(OTE_ERR_NATIVE, e.err);
}

ote_status_t ote_cufile_io_status(ssize_t ret, int err, size_t want, const char *call) {
    if (ret >= 0 && (size_t)ret == want) return OTE_OK;
    if (ret == -1) {
        OTE_WARN("cufile", "%s of %zu bytes failed: %s", call, want, strerror(err));
        return ote_status_make(err == ENOMEM ? OTE_ERR_NOMEM : OTE_ERR_IO, err);
    }
    if (ret < 0) {
        OTE_WARN("cufile", "%s of %zu bytes failed: CUfileOpError %lld", call, want,
                 (long long)-ret);
        return ote_status_make(OTE_ERR_NATIVE, (int)(-ret));
    }
    OTE_WARN("cufile", "%s moved %lld of %zu bytes (file ends early)", call, (long long)ret, want);
    return ote_status_make(OTE_ERR_IO, ENODATA);
}

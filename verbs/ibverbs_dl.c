/*
 * verbs/ibverbs_dl.c - libibverbs loaded at run time (ibverbs_dl.h).
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "verbs/ibverbs_dl.h"

#define IBVERBS_SONAME "libibverbs.so.1"

static ote__ibv_t g_ibv;
static ote_status_t g_load_status = OTE_ERR_UNSUPPORTED;
static char g_path[256];   /* what was loaded, or tried */
static char g_reason[512]; /* why it failed (dlerror, or the missing verb) */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* Symbol name of each table entry, in the table's order. */
#define SYM(field, name) \
    { offsetof(ote__ibv_t, field), name }
static const struct {
    size_t off;
    const char *name;
} k_syms[] = {
    SYM(get_device_list, "ibv_get_device_list"),
    SYM(free_device_list, "ibv_free_device_list"),
    SYM(get_device_name, "ibv_get_device_name"),
    SYM(open_device, "ibv_open_device"),
    SYM(close_device, "ibv_close_device"),
    SYM(get_async_event, "ibv_get_async_event"),
    SYM(ack_async_event, "ibv_ack_async_event"),
    SYM(query_device, "ibv_query_device"),
    SYM(query_port, "ibv_query_port"),
    SYM(query_gid, "ibv_query_gid"),
    SYM(query_gid_ex, "_ibv_query_gid_ex"),
    SYM(alloc_pd, "ibv_alloc_pd"),
    SYM(dealloc_pd, "ibv_dealloc_pd"),
    SYM(reg_mr_iova2, "ibv_reg_mr_iova2"),
    SYM(reg_dmabuf_mr, "ibv_reg_dmabuf_mr"),
    SYM(dereg_mr, "ibv_dereg_mr"),
    SYM(create_comp_channel, "ibv_create_comp_channel"),
    SYM(destroy_comp_channel, "ibv_destroy_comp_channel"),
    SYM(create_cq, "ibv_create_cq"),
    SYM(destroy_cq, "ibv_destroy_cq"),
    SYM(get_cq_event, "ibv_get_cq_event"),
    SYM(ack_cq_events, "ibv_ack_cq_events"),
    SYM(create_qp, "ibv_create_qp"),
    SYM(modify_qp, "ibv_modify_qp"),
    SYM(query_qp, "ibv_query_qp"),
    SYM(destroy_qp, "ibv_destroy_qp"),
    SYM(create_srq, "ibv_create_srq"),
    SYM(modify_srq, "ibv_modify_srq"),
    SYM(query_srq, "ibv_query_srq"),
    SYM(destroy_srq, "ibv_destroy_srq"),
};

static void load_once(void) {
    const char *path = getenv("OTE_IBVERBS_LIBRARY");
    if (path == NULL || path[0] == '\0') path = IBVERBS_SONAME;
    snprintf(g_path, sizeof(g_path), "%s", path);
    /* RTLD_GLOBAL: the library's device providers (libmlx5, ...) resolve against it. */
    void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (h == NULL) {
        const char *why = dlerror();
        snprintf(g_reason, sizeof(g_reason), "%s", why != NULL ? why : "unknown reason");
        return;
    }
    ote__ibv_t t;
    memset(&t, 0, sizeof(t));
    for (size_t i = 0; i < sizeof(k_syms) / sizeof(k_syms[0]); i++) {
        void *f = dlsym(h, k_syms[i].name);
        if (f == NULL) {
            snprintf(g_reason, sizeof(g_reason), "it has no %s (rdma-core older than v34?)",
                     k_syms[i].name);
            dlclose(h);
            return;
        }
        memcpy((char *)&t + k_syms[i].off, &f, sizeof(f));
    }
    g_ibv = t; /* the handle stays open for the process's life, as a linked library would */
    g_load_status = OTE_OK;
}

int ote__ibv_available(void) {
    pthread_once(&g_once, load_once);
    return g_load_status == OTE_OK;
}

ote_status_t ote__ibv_load(void) {
    if (ote__ibv_available()) return OTE_OK;
    OTE_ERROR("verbs.rdma_core",
              "cannot load %s (rdma-core's libibverbs; Debian: apt-get install libibverbs1 "
              "ibverbs-providers): %s; the rdma-core provider is unavailable, tcp and shm are "
              "not affected",
              g_path, g_reason);
    return OTE_ERR_UNSUPPORTED;
}

const ote__ibv_t *ote__ibv(void) { return &g_ibv; }

/* <infiniband/verbs.h>'s ___ibv_query_port: the device's extended op, else the exported
 * verb over the compat layout (which ends before the fields it lacks, cleared here). */
int ote__ibv_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr) {
    struct verbs_context *vctx = verbs_get_ctx_op(ctx, query_port);
    if (vctx != NULL) return vctx->query_port(ctx, port, attr, sizeof(*attr));
    memset(attr, 0, sizeof(*attr));
    return g_ibv.query_port(ctx, port, (struct _compat_ibv_port_attr *)attr);
}

/* <infiniband/verbs.h>'s ibv_query_device_ex with no input: the extended op, else (absent,
 * or EOPNOTSUPP/ENOSYS) the legacy query into the attributes' first part. */
int ote__ibv_query_device_ex(struct ibv_context *ctx, struct ibv_device_attr_ex *attr) {
    struct verbs_context *vctx = verbs_get_ctx_op(ctx, query_device_ex);
    if (vctx != NULL) {
        int r = vctx->query_device_ex(ctx, NULL, attr, sizeof(*attr));
        if (r != EOPNOTSUPP && r != ENOSYS) return r;
    }
    memset(attr, 0, sizeof(*attr));
    return g_ibv.query_device(ctx, &attr->orig_attr);
}

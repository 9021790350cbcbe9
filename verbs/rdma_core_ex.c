/*
 * verbs/rdma_core_ex.c - the "rdma-core" provider's extended entries: query_device_ex,
 * QP create flags (create_qp_flags, qp_flags) and device facts (device_flags), with the
 * optional mlx5 direct-verbs entry points loaded at run time.
 *
 * libmlx5 is never a link-time dependency: the first call that needs it dlopen()s
 * "libmlx5.so.1" (already mapped when libibverbs drives an mlx5 device, since the mlx5
 * provider links it) and looks up mlx5dv_create_qp and mlx5dv_is_supported. Without it,
 * mlx5 devices are recognised by name ("mlx5_*") and cannot opt a QP out of
 * scatter-to-CQE per QP.
 *
 * Scatter-to-CQE (VERBS_FACTS.md 11): on mlx5 a signalled READ whose response fits the
 * CQE is written into the destination by libmlx5 with a CPU memcpy at poll time, which
 * faults on GPU memory. Two ways to turn it off:
 *  - per QP: create_qp_flags(OTE_VERBS_QP_NO_SCATTER_TO_CQE) -> mlx5dv_create_qp with
 *    MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE (needs libmlx5);
 *  - process-wide: the environment variable MLX5_SCATTER_TO_CQE=0, set before the device
 *    is opened (libmlx5 reads it; setting it later does not change open contexts). When it
 *    is "0" at the time of the call, device_flags leaves out OTE_VERBS_DEV_SCATTER_TO_CQE
 *    and create_qp_flags honours OTE_VERBS_QP_NO_SCATTER_TO_CQE even without libmlx5
 *    (plain ibv_create_qp: nothing is scattered in this process).
 * On a device that is not mlx5 the flag is honoured trivially (there is nothing to
 * disable). An mlx5 device with neither libmlx5 nor the environment variable fails the
 * flag with EOPNOTSUPP: it is never silently ignored.
 *
 * qp_flags: the provider remembers the flags of every QP created with nonzero flags in a
 * small table (per instance, one mutex; removed by destroy_qp); any other QP has flags 0.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/lock.h"
#include "base/log.h"
#include "verbs/ibverbs_dl.h"
#include "verbs/provider.h"

#if defined(__has_include)
#if __has_include(<infiniband/mlx5dv.h>)
#include <infiniband/mlx5dv.h>
#define OTE_HAVE_MLX5DV_H 1
#endif
#endif

#ifndef OTE_HAVE_MLX5DV_H
/* No mlx5dv.h: the minimal declarations, as in rdma-core v44's infiniband/mlx5dv.h (the
 * ABI of mlx5dv_create_qp and of these fields is stable since rdma-core v22). */
enum { MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE = 1 << 3 };
enum { MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS = 1 << 0 };
struct mlx5dv_dc_init_attr {
    int dc_type;
    union {
        uint64_t dct_access_key;
        struct {
            uint8_t log_num_concurent;
            uint8_t log_num_errored;
        } dci_streams;
    };
};
struct mlx5dv_qp_init_attr {
    uint64_t comp_mask;
    uint32_t create_flags;
    struct mlx5dv_dc_init_attr dc_init_attr;
    uint64_t send_ops_flags;
};
#endif

#define LOGC "verbs.rdma_core"

typedef struct ibv_qp *(*dv_create_qp_fn)(struct ibv_context *, struct ibv_qp_init_attr_ex *,
                                          struct mlx5dv_qp_init_attr *);
typedef bool (*dv_is_supported_fn)(struct ibv_device *);

typedef struct {
    struct ibv_qp *qp;
    uint32_t flags;
} rc_qp_flags_t;

struct ote__rc_state {
    ote_mutex_t mu;
    bool dv_tried;
    void *dv; /* dlopen handle of libmlx5.so.1, NULL when absent */
    dv_create_qp_fn dv_create_qp;
    dv_is_supported_fn dv_is_supported;
    rc_qp_flags_t *qps; /* QPs created with nonzero flags */
    size_t nqps, cap;
    char *sysfs_root; /* the open's "sysfs_root=PATH"; NULL = /sys */
};

ote_status_t ote__rc_state_set_sysfs_root(ote__rc_state_t *s, const char *root) {
    char *dup = ote_strdup(root);
    if (dup == NULL) return OTE_ERR_NOMEM;
    ote_free(s->sysfs_root);
    s->sysfs_root = dup;
    return OTE_OK;
}

const char *ote__rc_sysfs_root(const ote_verbs_t *v) {
    const ote__rc_state_t *s = v->priv;
    return s != NULL && s->sysfs_root != NULL ? s->sysfs_root : "/sys";
}

ote_status_t ote__rc_state_new(ote__rc_state_t **out) {
    ote__rc_state_t *s = ote_calloc(1, sizeof(*s));
    if (s == NULL) return OTE_ERR_NOMEM;
    ote_status_t st = ote_mutex_init(&s->mu);
    if (st != OTE_OK) {
        ote_free(s);
        return st;
    }
    *out = s;
    return OTE_OK;
}

void ote__rc_state_free(ote__rc_state_t *s) {
    if (s == NULL) return;
    if (s->dv != NULL) dlclose(s->dv);
    ote_free(s->sysfs_root);
    ote_free(s->qps);
    ote_mutex_destroy(&s->mu);
    ote_free(s);
}

/* Load libmlx5 once (s->mu held). */
static void dv_load(ote__rc_state_t *s) {
    if (s->dv_tried) return;
    s->dv_tried = true;
    void *h = dlopen("libmlx5.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        OTE_DEBUG(LOGC, "libmlx5.so.1 not loaded (%s): no per-QP scatter-to-CQE opt-out",
                  dlerror());
        return;
    }
    dv_create_qp_fn c = (dv_create_qp_fn)dlsym(h, "mlx5dv_create_qp");
    dv_is_supported_fn i = (dv_is_supported_fn)dlsym(h, "mlx5dv_is_supported");
    if (c == NULL || i == NULL) {
        OTE_DEBUG(LOGC, "libmlx5.so.1 lacks mlx5dv_create_qp/mlx5dv_is_supported");
        dlclose(h);
        return;
    }
    s->dv = h;
    s->dv_create_qp = c;
    s->dv_is_supported = i;
}

static bool scatter_env_off(void) {
    const char *e = getenv("MLX5_SCATTER_TO_CQE");
    return e != NULL && strcmp(e, "0") == 0;
}

/* What the provider knows of ctx's device: mlx5 or not, and whether mlx5dv is there. */
static void device_kind(ote_verbs_t *v, struct ibv_context *ctx, bool *mlx5, bool *dv) {
    ote__rc_state_t *s = v->priv;
    ote_mutex_lock(&s->mu);
    dv_load(s);
    dv_is_supported_fn is_supported = s->dv_is_supported;
    ote_mutex_unlock(&s->mu);
    *dv = is_supported != NULL;
    if (is_supported != NULL) {
        *mlx5 = is_supported(ctx->device);
    } else {
        const char *name = ote__ibv()->get_device_name(ctx->device);
        *mlx5 = name != NULL && strncmp(name, "mlx5", 4) == 0;
    }
}

int ote__rc_query_device_ex(ote_verbs_t *v, struct ibv_context *ctx,
                            struct ibv_device_attr_ex *attr) {
    (void)v;
    if (ctx == NULL || attr == NULL) return EINVAL;
    struct ibv_device_attr_ex a;
    memset(&a, 0, sizeof(a));
    errno = 0;
    int r = ote__ibv_query_device_ex(ctx, &a);
    if (r < 0) r = errno != 0 ? errno : EIO;
    if (r != 0) return r;
    *attr = a;
    return 0;
}

int ote__rc_device_flags(ote_verbs_t *v, struct ibv_context *ctx, uint32_t *flags_out) {
    if (ctx == NULL || flags_out == NULL) return EINVAL;
    bool mlx5 = false, dv = false;
    device_kind(v, ctx, &mlx5, &dv);
    uint32_t f = 0;
    if (mlx5) {
        if (!scatter_env_off()) f |= OTE_VERBS_DEV_SCATTER_TO_CQE;
        if (dv) f |= OTE_VERBS_DEV_SCATTER_OPT_OUT;
    }
    *flags_out = f;
    return 0;
}

/* Remember qp's flags (nonzero). ENOMEM when the table cannot grow. */
static int remember(ote__rc_state_t *s, struct ibv_qp *qp, uint32_t flags) {
    int r = 0;
    ote_mutex_lock(&s->mu);
    if (s->nqps == s->cap) {
        size_t ncap = s->cap ? s->cap * 2 : 16;
        rc_qp_flags_t *n = ote_realloc(s->qps, ncap * sizeof(*n));
        if (n == NULL) r = ENOMEM;
        else {
            s->qps = n;
            s->cap = ncap;
        }
    }
    if (r == 0) s->qps[s->nqps++] = (rc_qp_flags_t){.qp = qp, .flags = flags};
    ote_mutex_unlock(&s->mu);
    return r;
}

void ote__rc_forget_qp(ote_verbs_t *v, struct ibv_qp *qp) {
    ote__rc_state_t *s = v->priv;
    ote_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->nqps; i++) {
        if (s->qps[i].qp == qp) {
            s->qps[i] = s->qps[--s->nqps];
            break;
        }
    }
    ote_mutex_unlock(&s->mu);
}

int ote__rc_qp_flags(ote_verbs_t *v, struct ibv_qp *qp, uint32_t *flags_out) {
    if (qp == NULL || flags_out == NULL) return EINVAL;
    ote__rc_state_t *s = v->priv;
    uint32_t f = 0;
    ote_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->nqps; i++)
        if (s->qps[i].qp == qp) f = s->qps[i].flags;
    ote_mutex_unlock(&s->mu);
    *flags_out = f;
    return 0;
}

/* mlx5dv_create_qp with scatter-to-CQE disabled; init_attr->cap written on success. */
static int dv_create(ote__rc_state_t *s, struct ibv_pd *pd, struct ibv_qp_init_attr *init_attr,
                     struct ibv_qp **qp_out) {
    struct ibv_qp_init_attr_ex ex;
    memset(&ex, 0, sizeof(ex));
    ex.qp_context = init_attr->qp_context;
    ex.send_cq = init_attr->send_cq;
    ex.recv_cq = init_attr->recv_cq;
    ex.srq = init_attr->srq;
    ex.cap = init_attr->cap;
    ex.qp_type = init_attr->qp_type;
    ex.sq_sig_all = init_attr->sq_sig_all;
    ex.comp_mask = IBV_QP_INIT_ATTR_PD;
    ex.pd = pd;
    struct mlx5dv_qp_init_attr dv;
    memset(&dv, 0, sizeof(dv));
    dv.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS;
    dv.create_flags = MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE;
    errno = 0;
    struct ibv_qp *qp = s->dv_create_qp(pd->context, &ex, &dv);
    if (qp == NULL) return errno != 0 ? errno : EIO;
    init_attr->cap = ex.cap;
    *qp_out = qp;
    return 0;
}

int ote__rc_create_qp_flags(ote_verbs_t *v, struct ibv_pd *pd, struct ibv_qp_init_attr *init_attr,
                            uint32_t flags, struct ibv_qp **qp_out) {
    if (flags & ~OTE_VERBS_QP_NO_SCATTER_TO_CQE) return EOPNOTSUPP;
    if (pd == NULL || init_attr == NULL || qp_out == NULL) return EINVAL;
    if (flags == 0) return v->ops->create_qp(v, pd, init_attr, qp_out);
    ote__rc_state_t *s = v->priv;
    bool mlx5 = false, dv = false;
    device_kind(v, pd->context, &mlx5, &dv);
    struct ibv_qp *qp = NULL;
    struct ibv_qp_cap cap = init_attr->cap; /* restored when the QP does not survive */
    int r;
    if (mlx5 && dv) {
        r = dv_create(s, pd, init_attr, &qp);
    } else if (!mlx5 || scatter_env_off()) {
        r = v->ops->create_qp(v, pd, init_attr, &qp); /* nothing to disable on this QP */
    } else {
        OTE_WARN(LOGC,
                 "create_qp_flags: %s is mlx5 but libmlx5 is not loadable: cannot disable "
                 "scatter-to-CQE on a QP (set MLX5_SCATTER_TO_CQE=0 before opening the device)",
                 ote__ibv()->get_device_name(pd->context->device));
        return EOPNOTSUPP;
    }
    if (r != 0) return r;
    r = remember(s, qp, flags);
    if (r != 0) {
        (void)ote__ibv()->destroy_qp(qp);
        init_attr->cap = cap;
        return r;
    }
    *qp_out = qp;
    return 0;
}

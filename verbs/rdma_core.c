/*
 * verbs/rdma_core.c - the "rdma-core" provider: a thin binding over libibverbs.
 *
 * Each op calls the libibverbs function of the same name and converts rdma-core's mixed
 * return conventions (NULL + errno from create/alloc/reg, -1 + errno from
 * ibv_get_async_event/ibv_get_cq_event/ibv_query_gid/ibv_close_device, a positive errno
 * from the int verbs, a negative value from ibv_poll_cq) to the table's uniform one: 0 or
 * a positive errno, outputs written only on success. The objects are rdma-core's own, so
 * nothing is translated. The extended entries (query_device_ex, QP create flags, device
 * facts) and the instance's only state (libmlx5 loaded at run time, the flags table) are
 * in rdma_core_ex.c.
 *
 * A machine without RDMA support (no uverbs in the kernel: ibv_get_device_list fails
 * with ENOSYS) lists zero devices, as one with support but no devices does. libibverbs
 * itself is loaded at run time (ibverbs_dl.h): without it the provider's open fails
 * OTE_ERR_UNSUPPORTED with an ERROR line naming the library.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "verbs/ibverbs_dl.h"
#include "verbs/provider.h"
#include "verbs/verbs.h"

#define IBV ote__ibv()

/* errno of the native call that just failed; EIO when it failed without setting one. */
static int failed_errno(void) { return errno != 0 ? errno : EIO; }

/* rdma-core's int verbs return 0, a positive errno, or (older paths) -1 with errno. */
static int int_ret(int r) {
    if (r == 0) return 0;
    if (r > 0) return r;
    return failed_errno();
}

/* An empty device list handed out when libibverbs has no kernel support at all; it is
 * static, so free_device_list recognises it and frees nothing. */
static struct ibv_device *g_empty_list[1] = {NULL};

static int rc_get_device_list(ote_verbs_t *v, struct ibv_device ***list_out, int *num_out) {
    (void)v;
    if (list_out == NULL) return EINVAL;
    int num = 0;
    errno = 0;
    struct ibv_device **list = IBV->get_device_list(&num);
    if (list == NULL) {
        int err = failed_errno();
        if (err != ENOSYS) return err;
        /* No uverbs ABI in the kernel: no device can exist, which is not an error. */
        OTE_DEBUG("verbs.rdma_core", "no kernel RDMA support (ENOSYS): zero devices");
        list = g_empty_list;
        num = 0;
    }
    *list_out = list;
    if (num_out != NULL) *num_out = num;
    return 0;
}

static void rc_free_device_list(ote_verbs_t *v, struct ibv_device **list) {
    (void)v;
    if (list == NULL || list == g_empty_list) return;
    IBV->free_device_list(list);
}

static const char *rc_get_device_name(ote_verbs_t *v, struct ibv_device *dev) {
    (void)v;
    if (dev == NULL) return NULL;
    return IBV->get_device_name(dev);
}

static int rc_open_device(ote_verbs_t *v, struct ibv_device *dev, struct ibv_context **ctx_out) {
    (void)v;
    if (dev == NULL || ctx_out == NULL) return EINVAL;
    errno = 0;
    struct ibv_context *ctx = IBV->open_device(dev);
    if (ctx == NULL) return failed_errno();
    *ctx_out = ctx;
    return 0;
}

static int rc_close_device(ote_verbs_t *v, struct ibv_context *ctx) {
    (void)v;
    errno = 0;
    return int_ret(IBV->close_device(ctx));
}

static int rc_query_device(ote_verbs_t *v, struct ibv_context *ctx, struct ibv_device_attr *attr) {
    (void)v;
    struct ibv_device_attr tmp;
    errno = 0;
    int r = int_ret(IBV->query_device(ctx, &tmp));
    if (r == 0) *attr = tmp;
    return r;
}

static int rc_query_port(ote_verbs_t *v, struct ibv_context *ctx, uint8_t port,
                         struct ibv_port_attr *attr) {
    (void)v;
    struct ibv_port_attr tmp;
    errno = 0;
    int r = int_ret(ote__ibv_query_port(ctx, port, &tmp));
    if (r == 0) *attr = tmp;
    return r;
}

static int rc_query_gid(ote_verbs_t *v, struct ibv_context *ctx, uint8_t port, int index,
                        union ibv_gid *gid) {
    (void)v;
    union ibv_gid tmp;
    errno = 0;
    int r = int_ret(IBV->query_gid(ctx, port, index, &tmp));
    if (r == 0) *gid = tmp;
    return r;
}

static int rc_query_gid_ex(ote_verbs_t *v, struct ibv_context *ctx, uint32_t port, uint32_t index,
                           struct ibv_gid_entry *entry) {
    (void)v;
    struct ibv_gid_entry tmp;
    errno = 0;
    int r = int_ret(IBV->query_gid_ex(ctx, port, index, &tmp, 0, sizeof(tmp)));
    if (r == 0) *entry = tmp;
    return r;
}

/* <sysfs>/class/infiniband/<dev>/device/numa_node holds the node, or -1 when the platform
 * does not say; a missing file also means "unknown", which is a success with -1. <sysfs>
 * is /sys unless the open's configuration named another root. */
static int rc_device_numa_node(ote_verbs_t *v, struct ibv_context *ctx, int *node_out) {
    if (ctx == NULL || ctx->device == NULL || node_out == NULL) return EINVAL;
    const char *name = IBV->get_device_name(ctx->device);
    if (name == NULL) return EINVAL;
    char path[512];
    int n = snprintf(path, sizeof(path), "%s/class/infiniband/%s/device/numa_node",
                     ote__rc_sysfs_root(v), name);
    if (n < 0 || (size_t)n >= sizeof(path)) return ENAMETOOLONG;
    FILE *f = fopen(path, "re");
    if (f == NULL) {
        OTE_DEBUG("verbs.rdma_core", "%s: %s (NUMA node unknown)", path, strerror(errno));
        *node_out = -1;
        return 0;
    }
    int node = -1;
    if (fscanf(f, "%d", &node) != 1) node = -1;
    fclose(f);
    *node_out = node < 0 ? -1 : node;
    return 0;
}

static int rc_get_async_event(ote_verbs_t *v, struct ibv_context *ctx, struct ibv_async_event *ev) {
    (void)v;
    struct ibv_async_event tmp;
    errno = 0;
    if (IBV->get_async_event(ctx, &tmp) != 0) return failed_errno();
    *ev = tmp;
    return 0;
}

static void rc_ack_async_event(ote_verbs_t *v, struct ibv_async_event *ev) {
    (void)v;
    IBV->ack_async_event(ev);
}

static int rc_alloc_pd(ote_verbs_t *v, struct ibv_context *ctx, struct ibv_pd **pd_out) {
    (void)v;
    errno = 0;
    struct ibv_pd *pd = IBV->alloc_pd(ctx);
    if (pd == NULL) return failed_errno();
    *pd_out = pd;
    return 0;
}

static int rc_dealloc_pd(ote_verbs_t *v, struct ibv_pd *pd) {
    (void)v;
    errno = 0;
    return int_ret(IBV->dealloc_pd(pd));
}

static int rc_reg_mr(ote_verbs_t *v, struct ibv_pd *pd, void *addr, size_t length, int access,
                     struct ibv_mr **mr_out) {
    (void)v;
    errno = 0;
    struct ibv_mr *mr = IBV->reg_mr_iova2(pd, addr, length, (uintptr_t)addr, (unsigned)access);
    if (mr == NULL) return failed_errno();
    *mr_out = mr;
    return 0;
}

static int rc_reg_dmabuf_mr(ote_verbs_t *v, struct ibv_pd *pd, uint64_t offset, size_t length,
                            uint64_t iova, int fd, int access, struct ibv_mr **mr_out) {
    (void)v;
    if (pd == NULL || mr_out == NULL) return EINVAL;
    errno = 0;
    struct ibv_mr *mr = IBV->reg_dmabuf_mr(pd, offset, length, iova, fd, access);
    if (mr == NULL) return failed_errno();
    *mr_out = mr;
    return 0;
}

static int rc_dereg_mr(ote_verbs_t *v, struct ibv_mr *mr) {
    (void)v;
    errno = 0;
    return int_ret(IBV->dereg_mr(mr));
}

static int rc_alloc_mw(ote_verbs_t *v, struct ibv_pd *pd, enum ibv_mw_type type,
                       struct ibv_mw **mw_out) {
    (void)v;
    errno = 0;
    struct ibv_mw *mw = ibv_alloc_mw(pd, type);
    if (mw == NULL) return failed_errno();
    *mw_out = mw;
    return 0;
}

static int rc_dealloc_mw(ote_verbs_t *v, struct ibv_mw *mw) {
    (void)v;
    errno = 0;
    return int_ret(ibv_dealloc_mw(mw));
}

static int rc_create_comp_channel(ote_verbs_t *v, struct ibv_context *ctx,
                                  struct ibv_comp_channel **ch_out) {
    (void)v;
    errno = 0;
    struct ibv_comp_channel *ch = IBV->create_comp_channel(ctx);
    if (ch == NULL) return failed_errno();
    *ch_out = ch;
    return 0;
}

static int rc_destroy_comp_channel(ote_verbs_t *v, struct ibv_comp_channel *ch) {
    (void)v;
    errno = 0;
    return int_ret(IBV->destroy_comp_channel(ch));
}

static int rc_create_cq(ote_verbs_t *v, struct ibv_context *ctx, int cqe, void *cq_context,
                        struct ibv_comp_channel *ch, int comp_vector, struct ibv_cq **cq_out) {
    (void)v;
    errno = 0;
    struct ibv_cq *cq = IBV->create_cq(ctx, cqe, cq_context, ch, comp_vector);
    if (cq == NULL) return failed_errno();
    *cq_out = cq;
    return 0;
}

static int rc_destroy_cq(ote_verbs_t *v, struct ibv_cq *cq) {
    (void)v;
    errno = 0;
    return int_ret(IBV->destroy_cq(cq));
}

static int rc_req_notify_cq(ote_verbs_t *v, struct ibv_cq *cq, int solicited_only) {
    (void)v;
    errno = 0;
    return int_ret(ibv_req_notify_cq(cq, solicited_only));
}

static int rc_get_cq_event(ote_verbs_t *v, struct ibv_comp_channel *ch, struct ibv_cq **cq_out,
                           void **cq_context_out) {
    (void)v;
    struct ibv_cq *cq = NULL;
    void *cq_context = NULL;
    errno = 0;
    if (IBV->get_cq_event(ch, &cq, &cq_context) != 0) return failed_errno();
    *cq_out = cq;
    if (cq_context_out != NULL) *cq_context_out = cq_context;
    return 0;
}

static void rc_ack_cq_events(ote_verbs_t *v, struct ibv_cq *cq, unsigned int nevents) {
    (void)v;
    IBV->ack_cq_events(cq, nevents);
}

/* ibv_poll_cq returns a provider-specific negative value on failure (mlx5: -2); the
 * table's convention is a negative errno, so use errno when set, else EIO. */
static int rc_poll_cq(ote_verbs_t *v, struct ibv_cq *cq, int num_entries, struct ibv_wc *wc) {
    (void)v;
    errno = 0;
    int r = ibv_poll_cq(cq, num_entries, wc);
    if (r >= 0) return r;
    return -failed_errno();
}

/* ibv_create_qp writes the actual caps back into init_attr->cap; do it on a copy so that
 * the caller's attributes change only when the QP was created. */
static int rc_create_qp(ote_verbs_t *v, struct ibv_pd *pd, struct ibv_qp_init_attr *init_attr,
                        struct ibv_qp **qp_out) {
    (void)v;
    if (init_attr == NULL || qp_out == NULL) return EINVAL;
    struct ibv_qp_init_attr attr = *init_attr;
    errno = 0;
    struct ibv_qp *qp = IBV->create_qp(pd, &attr);
    if (qp == NULL) return failed_errno();
    init_attr->cap = attr.cap;
    *qp_out = qp;
    return 0;
}

static int rc_modify_qp(ote_verbs_t *v, struct ibv_qp *qp, struct ibv_qp_attr *attr,
                        int attr_mask) {
    (void)v;
    errno = 0;
    return int_ret(IBV->modify_qp(qp, attr, attr_mask));
}

static int rc_query_qp(ote_verbs_t *v, struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask,
                       struct ibv_qp_init_attr *init_attr) {
    (void)v;
    errno = 0;
    return int_ret(IBV->query_qp(qp, attr, attr_mask, init_attr));
}

static int rc_destroy_qp(ote_verbs_t *v, struct ibv_qp *qp) {
    errno = 0;
    int r = int_ret(IBV->destroy_qp(qp));
    if (r == 0) ote__rc_forget_qp(v, qp);
    return r;
}

static int rc_post_send(ote_verbs_t *v, struct ibv_qp *qp, struct ibv_send_wr *wr,
                        struct ibv_send_wr **bad_wr) {
    (void)v;
    struct ibv_send_wr *bad = NULL;
    errno = 0;
    int r = int_ret(ibv_post_send(qp, wr, &bad));
    if (r != 0 && bad_wr != NULL) *bad_wr = bad;
    return r;
}

static int rc_post_recv(ote_verbs_t *v, struct ibv_qp *qp, struct ibv_recv_wr *wr,
                        struct ibv_recv_wr **bad_wr) {
    (void)v;
    struct ibv_recv_wr *bad = NULL;
    errno = 0;
    int r = int_ret(ibv_post_recv(qp, wr, &bad));
    if (r != 0 && bad_wr != NULL) *bad_wr = bad;
    return r;
}

/* ibv_create_srq writes the actual attributes back into init_attr->attr: on a copy, so
 * that the caller's change only when the SRQ was created. */
static int rc_create_srq(ote_verbs_t *v, struct ibv_pd *pd, struct ibv_srq_init_attr *init_attr,
                         struct ibv_srq **srq_out) {
    (void)v;
    if (init_attr == NULL || srq_out == NULL) return EINVAL;
    struct ibv_srq_init_attr attr = *init_attr;
    errno = 0;
    struct ibv_srq *srq = IBV->create_srq(pd, &attr);
    if (srq == NULL) return failed_errno();
    init_attr->attr = attr.attr;
    *srq_out = srq;
    return 0;
}

static int rc_modify_srq(ote_verbs_t *v, struct ibv_srq *srq, struct ibv_srq_attr *attr,
                         int attr_mask) {
    (void)v;
    errno = 0;
    return int_ret(IBV->modify_srq(srq, attr, attr_mask));
}

static int rc_query_srq(ote_verbs_t *v, struct ibv_srq *srq, struct ibv_srq_attr *attr) {
    (void)v;
    if (attr == NULL) return EINVAL;
    struct ibv_srq_attr a;
    memset(&a, 0, sizeof(a));
    errno = 0;
    int r = int_ret(IBV->query_srq(srq, &a));
    if (r == 0) *attr = a;
    return r;
}

static int rc_destroy_srq(ote_verbs_t *v, struct ibv_srq *srq) {
    (void)v;
    errno = 0;
    return int_ret(IBV->destroy_srq(srq));
}

static int rc_post_srq_recv(ote_verbs_t *v, struct ibv_srq *srq, struct ibv_recv_wr *wr,
                            struct ibv_recv_wr **bad_wr) {
    (void)v;
    struct ibv_recv_wr *bad = NULL;
    errno = 0;
    int r = int_ret(ibv_post_srq_recv(srq, wr, &bad));
    if (r != 0 && bad_wr != NULL) *bad_wr = bad;
    return r;
}

static const ote_verbs_ops_t g_rdma_core_ops = {
    .get_device_list = rc_get_device_list,
    .free_device_list = rc_free_device_list,
    .get_device_name = rc_get_device_name,
    .open_device = rc_open_device,
    .close_device = rc_close_device,
    .query_device = rc_query_device,
    .query_port = rc_query_port,
    .query_gid = rc_query_gid,
    .query_gid_ex = rc_query_gid_ex,
    .device_numa_node = rc_device_numa_node,
    .get_async_event = rc_get_async_event,
    .ack_async_event = rc_ack_async_event,
    .alloc_pd = rc_alloc_pd,
    .dealloc_pd = rc_dealloc_pd,
    .reg_mr = rc_reg_mr,
    .reg_dmabuf_mr = rc_reg_dmabuf_mr,
    .dereg_mr = rc_dereg_mr,
    .alloc_mw = rc_alloc_mw,
    .dealloc_mw = rc_dealloc_mw,
    .create_comp_channel = rc_create_comp_channel,
    .destroy_comp_channel = rc_destroy_comp_channel,
    .create_cq = rc_create_cq,
    .destroy_cq = rc_destroy_cq,
    .req_notify_cq = rc_req_notify_cq,
    .get_cq_event = rc_get_cq_event,
    .ack_cq_events = rc_ack_cq_events,
    .poll_cq = rc_poll_cq,
    .create_qp = rc_create_qp,
    .modify_qp = rc_modify_qp,
    .query_qp = rc_query_qp,
    .destroy_qp = rc_destroy_qp,
    .post_send = rc_post_send,
    .post_recv = rc_post_recv,
    .query_device_ex = ote__rc_query_device_ex,
    .create_qp_flags = ote__rc_create_qp_flags,
    .qp_flags = ote__rc_qp_flags,
    .device_flags = ote__rc_device_flags,
    .create_srq = rc_create_srq,
    .modify_srq = rc_modify_srq,
    .query_srq = rc_query_srq,
    .destroy_srq = rc_destroy_srq,
    .post_srq_recv = rc_post_srq_recv,
};

static void rc_close(ote_verbs_t *v) {
    ote__rc_state_free(v->priv);
    ote_free(v);
}

/* The configuration text: NULL or "" (nothing), or "sysfs_root=PATH" (an absolute path:
 * where sysfs is mounted, for containers that bind-mount the host's /sys elsewhere). */
static ote_status_t rc_parse_config(const char *config, const char **root_out) {
    static const char key[] = "sysfs_root=";
    *root_out = NULL;
    if (config == NULL || config[0] == '\0') return OTE_OK;
    if (strncmp(config, key, sizeof(key) - 1) == 0 && config[sizeof(key) - 1] == '/' &&
        strlen(config) < 256 + sizeof(key)) {
        *root_out = config + sizeof(key) - 1;
        return OTE_OK;
    }
    OTE_WARN("verbs.rdma_core", "rdma-core: bad configuration \"%s\" (known: sysfs_root=/PATH)",
             config);
    return OTE_ERR_INVALID;
}

ote_status_t ote__verbs_rdma_core_open(const char *config, ote_verbs_t **v_out) {
    const char *root = NULL;
    if (v_out == NULL || rc_parse_config(config, &root) != OTE_OK) return OTE_ERR_INVALID;
    ote_status_t lst = ote__ibv_load(); /* libibverbs at run time (ibverbs_dl.h) */
    if (lst != OTE_OK) return lst;
    ote_verbs_t *v = ote_calloc(1, sizeof(*v));
    if (v == NULL) return OTE_ERR_NOMEM;
    ote__rc_state_t *s = NULL;
    ote_status_t st = ote__rc_state_new(&s);
    if (st == OTE_OK && root != NULL && (st = ote__rc_state_set_sysfs_root(s, root)) != OTE_OK)
        ote__rc_state_free(s);
    if (st != OTE_OK) {
        ote_free(v);
        return st;
    }
    v->ops = &g_rdma_core_ops;
    v->provider = "rdma-core";
    v->priv = s;
    v->close = rc_close;
    *v_out = v;
    return OTE_OK;
}

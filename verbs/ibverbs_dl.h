/*
 * verbs/ibverbs_dl.h - libibverbs loaded at run time (private to //verbs).
 *
 * liborbitte carries no link-time dependency on libibverbs: a machine without rdma-core
 * runs the tcp and shm transports, and only opening the "rdma-core" provider needs the
 * library. ote__ibv_load() dlopen()s it once per process ("libibverbs.so.1", or the path
 * in $OTE_IBVERBS_LIBRARY) and resolves every exported verb the provider calls into one
 * table; the verbs rdma-core implements as static inlines in <infiniband/verbs.h>
 * (posting, polling, memory windows) reach the device's own ops and need no symbol. The
 * inlines that fall back to an exported symbol (query_port, query_device_ex, query_gid_ex,
 * reg_mr) are done here with the same fallbacks, through the table.
 */
#ifndef OTE_VERBS_IBVERBS_DL_H
#define OTE_VERBS_IBVERBS_DL_H

#ifndef OTE__INSIDE_VERBS
#error "verbs/ibverbs_dl.h is private to //verbs"
#endif

#include <infiniband/verbs.h>

#include "base/status.h"

typedef struct {
    struct ibv_device **(*get_device_list)(int *num);
    void (*free_device_list)(struct ibv_device **list);
    const char *(*get_device_name)(struct ibv_device *dev);
    struct ibv_context *(*open_device)(struct ibv_device *dev);
    int (*close_device)(struct ibv_context *ctx);
    int (*get_async_event)(struct ibv_context *ctx, struct ibv_async_event *ev);
    void (*ack_async_event)(struct ibv_async_event *ev);
    int (*query_device)(struct ibv_context *ctx, struct ibv_device_attr *attr);
    int (*query_port)(struct ibv_context *ctx, uint8_t port, struct _compat_ibv_port_attr *a);
    int (*query_gid)(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid);
    int (*query_gid_ex)(struct ibv_context *ctx, uint32_t port, uint32_t index,
                        struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *ctx);
    int (*dealloc_pd)(struct ibv_pd *pd);
    struct ibv_mr *(*reg_mr_iova2)(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
                                   unsigned int access);
    struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *pd, uint64_t offset, size_t len, uint64_t iova,
                                    int fd, int access);
    int (*dereg_mr)(struct ibv_mr *mr);
    struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *ctx);
    int (*destroy_comp_channel)(struct ibv_comp_channel *ch);
    struct ibv_cq *(*create_cq)(struct ibv_context *ctx, int cqe, void *cq_context,
                                struct ibv_comp_channel *ch, int comp_vector);
    int (*destroy_cq)(struct ibv_cq *cq);
    int (*get_cq_event)(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_context);
    void (*ack_cq_events)(struct ibv_cq *cq, unsigned int nevents);
    struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
    int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
    int (*query_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask,
                    struct ibv_qp_init_attr *init);
    int (*destroy_qp)(struct ibv_qp *qp);
    struct ibv_srq *(*create_srq)(struct ibv_pd *pd, struct ibv_srq_init_attr *attr);
    int (*modify_srq)(struct ibv_srq *srq, struct ibv_srq_attr *attr, int mask);
    int (*query_srq)(struct ibv_srq *srq, struct ibv_srq_attr *attr);
    int (*destroy_srq)(struct ibv_srq *srq);
} ote__ibv_t;

/* Whether the library loads and has every verb the provider needs (loaded on the first
 * call, once per process; silent). */
int ote__ibv_available(void);
/* OTE_OK when available, else OTE_ERR_UNSUPPORTED with an ERROR line naming the library
 * and the loader's reason (a missing library, or one without a verb the provider needs). */
ote_status_t ote__ibv_load(void);
/* The loaded table; only after ote__ibv_load() returned OTE_OK (the provider's ops run only
 * on an instance whose open loaded it). */
const ote__ibv_t *ote__ibv(void);

/* The exported verbs' inline wrappers of <infiniband/verbs.h>, through the table. */
int ote__ibv_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr);
int ote__ibv_query_device_ex(struct ibv_context *ctx, struct ibv_device_attr_ex *attr);

#endif

/*
 * verbs/verbs.h - the fallible verbs function table.
 *
 * Every verb OrbitTE calls goes through one ote_verbs_ops_t, so the same layers run on
 * rdma-core ("rdma-core"), on the software RC provider ("sim"), and under the fault
 * decorator that wraps either. The table uses rdma-core's own data structures
 * (struct ibv_send_wr, struct ibv_wc, struct ibv_qp_attr, union ibv_gid, ...), so the
 * real path needs no translation; providers embed rdma-core's object structs
 * (struct ibv_context, ibv_pd, ibv_mr, ibv_mw, ibv_cq, ibv_qp, ibv_comp_channel) in their
 * private objects and recover them with container_of.
 *
 * Uniform error convention: every op returns 0 on success or a positive errno value
 * (the native errno) on failure; objects are returned through an _out parameter that is
 * written only on success. poll_cq returns the number of completions (>= 0) or a
 * negative errno. No entry of a table returned by ote_verbs_open() is ever NULL: an op a
 * provider lacks fails with EOPNOTSUPP.
 *
 * Upper layers must never call ibv_* functions or the inline helpers of <infiniband/
 * verbs.h> (ibv_post_send, ibv_poll_cq, ...) directly: only through this table.
 */
#ifndef OTE_VERBS_VERBS_H
#define OTE_VERBS_VERBS_H

#include <infiniband/verbs.h>
#include <stdint.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ote_verbs ote_verbs_t;

typedef struct ote_verbs_ops {
    /* Device. The list is owned by the provider until free_device_list. */
    int (*get_device_list)(ote_verbs_t *v, struct ibv_device ***list_out, int *num_out);
    void (*free_device_list)(ote_verbs_t *v, struct ibv_device **list);
    const char *(*get_device_name)(ote_verbs_t *v, struct ibv_device *dev);
    int (*open_device)(ote_verbs_t *v, struct ibv_device *dev, struct ibv_context **ctx_out);
    int (*close_device)(ote_verbs_t *v, struct ibv_context *ctx);
    int (*query_device)(ote_verbs_t *v, struct ibv_context *ctx, struct ibv_device_attr *attr);
    int (*query_port)(ote_verbs_t *v, struct ibv_context *ctx, uint8_t port,
                      struct ibv_port_attr *attr);
    int (*query_gid)(ote_verbs_t *v, struct ibv_context *ctx, uint8_t port, int index,
                     union ibv_gid *gid);
    /* ENODATA for an empty slot, as ibv_query_gid_ex. */
    int (*query_gid_ex)(ote_verbs_t *v, struct ibv_context *ctx, uint32_t port, uint32_t index,
                        struct ibv_gid_entry *entry);
    /* NUMA node of the device, -1 when unknown. */
    int (*device_numa_node)(ote_verbs_t *v, struct ibv_context *ctx, int *node_out);
    /* Async events: the fd (ctx->async_fd) can be polled; get returns EAGAIN when the fd
     * is non-blocking and no event is queued. Every event must be acked. */
    int (*get_async_event)(ote_verbs_t *v, struct ibv_context *ctx, struct ibv_async_event *ev);
    void (*ack_async_event)(ote_verbs_t *v, struct ibv_async_event *ev);

    /* Protection domain. */
    int (*alloc_pd)(ote_verbs_t *v, struct ibv_context *ctx, struct ibv_pd **pd_out);
    int (*dealloc_pd)(ote_verbs_t *v, struct ibv_pd *pd);

    /* Memory regions and windows. */
    int (*reg_mr)(ote_verbs_t *v, struct ibv_pd *pd, void *addr, size_t length, int access,
                  struct ibv_mr **mr_out);
    /* A dma-buf MR, as ibv_reg_dmabuf_mr: bytes [offset, offset+length) of the dma-buf fd
     * (GPU memory the host may not address), reached through lkey/rkey at addresses
     * [iova, iova+length) by local SGEs and remote requests alike. As rdma-core, the MR's
     * addr is `offset` and its length `length`. iova and offset must lie at the same
     * offset within a page (EINVAL); a bad fd fails with EBADF, a range past the end of
     * the dma-buf with EINVAL; access flags as for reg_mr. The fd stays the caller's (it
     * may be closed once the MR exists); dereg_mr releases the MR. */
    int (*reg_dmabuf_mr)(ote_verbs_t *v, struct ibv_pd *pd, uint64_t offset, size_t length,
                         uint64_t iova, int fd, int access, struct ibv_mr **mr_out);
    int (*dereg_mr)(ote_verbs_t *v, struct ibv_mr *mr);
    int (*alloc_mw)(ote_verbs_t *v, struct ibv_pd *pd, enum ibv_mw_type type,
                    struct ibv_mw **mw_out);
    int (*dealloc_mw)(ote_verbs_t *v, struct ibv_mw *mw);

    /* Completion channels and queues. */
    int (*create_comp_channel)(ote_verbs_t *v, struct ibv_context *ctx,
                               struct ibv_comp_channel **ch_out);
    int (*destroy_comp_channel)(ote_verbs_t *v, struct ibv_comp_channel *ch);
    int (*create_cq)(ote_verbs_t *v, struct ibv_context *ctx, int cqe, void *cq_context,
                     struct ibv_comp_channel *ch, int comp_vector, struct ibv_cq **cq_out);
    int (*destroy_cq)(ote_verbs_t *v, struct ibv_cq *cq);
    int (*req_notify_cq)(ote_verbs_t *v, struct ibv_cq *cq, int solicited_only);
    int (*get_cq_event)(ote_verbs_t *v, struct ibv_comp_channel *ch, struct ibv_cq **cq_out,
                        void **cq_context_out);
    void (*ack_cq_events)(ote_verbs_t *v, struct ibv_cq *cq, unsigned int nevents);
    int (*poll_cq)(ote_verbs_t *v, struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);

    /* Queue pairs. create_qp writes back the actual caps into init_attr->cap. */
    int (*create_qp)(ote_verbs_t *v, struct ibv_pd *pd, struct ibv_qp_init_attr *init_attr,
                     struct ibv_qp **qp_out);
    int (*modify_qp)(ote_verbs_t *v, struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask);
    int (*query_qp)(ote_verbs_t *v, struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask,
                    struct ibv_qp_init_attr *init_attr);
    int (*destroy_qp)(ote_verbs_t *v, struct ibv_qp *qp);
    /* post_send carries SEND*, RDMA_WRITE*, RDMA_READ, BIND_MW and LOCAL_INV WRs. */
    int (*post_send)(ote_verbs_t *v, struct ibv_qp *qp, struct ibv_send_wr *wr,
                     struct ibv_send_wr **bad_wr);
    int (*post_recv)(ote_verbs_t *v, struct ibv_qp *qp, struct ibv_recv_wr *wr,
                     struct ibv_recv_wr **bad_wr);

    /* Extended device attributes, as ibv_query_device_ex with no input: attr->orig_attr is
     * what query_device answers; the rest as the provider reports it (zero where it does
     * not). Limits every depth, SGE count, CQ size, RD-atom count and MW type is drawn from. */
    int (*query_device_ex)(ote_verbs_t *v, struct ibv_context *ctx,
                           struct ibv_device_attr_ex *attr);

    /* Shared receive queues, as ibv_create_srq / ibv_modify_srq / ibv_query_srq /
     * ibv_destroy_srq / ibv_post_srq_recv. create_srq writes the actual attr back into
     * init_attr->attr on success only. A QP created with init_attr->srq takes its receives
     * from that SRQ (its own post_recv fails EINVAL). modify_srq with IBV_SRQ_LIMIT arms the
     * limit: when the posted count falls below it, IBV_EVENT_SRQ_LIMIT_REACHED (element.srq)
     * is raised once and the limit disarms. destroy_srq with a QP still attached: EBUSY. */
    int (*create_srq)(ote_verbs_t *v, struct ibv_pd *pd, struct ibv_srq_init_attr *init_attr,
                      struct ibv_srq **srq_out);
    int (*modify_srq)(ote_verbs_t *v, struct ibv_srq *srq, struct ibv_srq_attr *attr,
                      int attr_mask);
    int (*query_srq)(ote_verbs_t *v, struct ibv_srq *srq, struct ibv_srq_attr *attr);
    int (*destroy_srq)(ote_verbs_t *v, struct ibv_srq *srq);
    int (*post_srq_recv)(ote_verbs_t *v, struct ibv_srq *srq, struct ibv_recv_wr *wr,
                         struct ibv_recv_wr **bad_wr);

    /* create_qp with OrbitTE create flags (OTE_VERBS_QP_*). flags 0 is create_qp. A flag
     * the device cannot honour fails EOPNOTSUPP (never silently ignored); a flag the device
     * does not need (no scatter-to-CQE on this device) is honoured trivially. */
    int (*create_qp_flags)(ote_verbs_t *v, struct ibv_pd *pd, struct ibv_qp_init_attr *init_attr,
                           uint32_t flags, struct ibv_qp **qp_out);
    /* The OTE_VERBS_QP_* flags qp was created with, and OTE_VERBS_QP_* facts of the device
     * it lives on (OTE_VERBS_DEV_SCATTER_TO_CQE: the device may scatter small READ responses
     * into CQEs, so a CPU copies them at poll time). */
    int (*qp_flags)(ote_verbs_t *v, struct ibv_qp *qp, uint32_t *flags_out);
    int (*device_flags)(ote_verbs_t *v, struct ibv_context *ctx, uint32_t *flags_out);
} ote_verbs_ops_t;

/* create_qp_flags / qp_flags: scatter-to-CQE disabled on this QP (mlx5dv's
 * MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE): no READ response is ever copied by the CPU
 * from a CQE into its destination, so a QP that may READ into device memory needs it.
 * rdma-core: through mlx5dv_create_qp of a libmlx5.so.1 loaded at run time (no link-time
 * dependency). Where libmlx5 is missing, the process-wide fallback is the environment
 * variable MLX5_SCATTER_TO_CQE=0, set before the device is opened (libmlx5 reads it): with
 * it, device_flags leaves out OTE_VERBS_DEV_SCATTER_TO_CQE and this flag is honoured by a
 * plain create_qp; without either, an mlx5 device fails the flag with EOPNOTSUPP. */
#define OTE_VERBS_QP_NO_SCATTER_TO_CQE 0x1u
/* device_flags: the device scatters small READ responses into signalled CQEs unless a QP
 * opts out (mlx5; the "mlx5" sim profile). */
#define OTE_VERBS_DEV_SCATTER_TO_CQE 0x1u
/* device_flags: QPs can opt out of scatter-to-CQE (create_qp_flags honours
 * OTE_VERBS_QP_NO_SCATTER_TO_CQE: mlx5dv found, or a sim profile). */
#define OTE_VERBS_DEV_SCATTER_OPT_OUT 0x2u

/* A provider instance. Upper layers read ->ops and pass the instance back as `v`. */
struct ote_verbs {
    const ote_verbs_ops_t *ops;
    const char *provider;          /* "rdma-core", "sim", "fault(sim)", ... */
    void *priv;                    /* provider state */
    void (*close)(ote_verbs_t *v); /* frees the instance; set by the provider */
};

/*
 * Open a provider by name: "rdma-core" or "sim". config is provider-specific (for
 * "sim" the device configuration string, NULL = OTE_SIM_CONFIG or the default; for
 * "rdma-core" NULL, "" or "sysfs_root=/PATH", where sysfs is mounted for the provider's
 * own reads, else OTE_ERR_INVALID); it may be NULL. The returned table has no NULL entry.
 * OTE_ERR_NOT_FOUND for an unknown name.
 */
ote_status_t ote_verbs_open(const char *provider, const char *config, ote_verbs_t **v_out);
/* The name of an async event type without the IBV_EVENT_ prefix ("PORT_ERR", "CQ_ERR",
 * ...), "other" for one not listed: for log lines, with no libibverbs call. */
const char *ote_verbs_event_name(enum ibv_event_type t);

/* Whether provider can be opened on this machine, without opening it: "sim" always;
 * "rdma-core" when libibverbs loads ($OTE_IBVERBS_LIBRARY, else libibverbs.so.1) with every
 * verb the binding calls (it may still list no device). 0 for an unknown name. Silent. */
int ote_verbs_provider_available(const char *provider);
/* Close a provider instance. Objects opened through it must be destroyed first. */
void ote_verbs_close(ote_verbs_t *v);

/* Fill every NULL entry of ops with an EOPNOTSUPP stub. */
void ote_verbs_ops_fill_stubs(ote_verbs_ops_t *ops);

/* Status for a failed verb: OTE_ERR_NATIVE (or a more specific code) carrying err. */
ote_status_t ote_verbs_status(int err);

/* Which object an async event is about, i.e. which member of ev->element it carries. */
typedef enum {
    OTE_VERBS_EVENT_ON_DEVICE = 0, /* DEVICE_FATAL (and types this table does not know) */
    OTE_VERBS_EVENT_ON_QP,         /* element.qp */
    OTE_VERBS_EVENT_ON_CQ,         /* element.cq */
    OTE_VERBS_EVENT_ON_SRQ,        /* element.srq */
    OTE_VERBS_EVENT_ON_WQ,         /* element.wq */
    OTE_VERBS_EVENT_ON_PORT        /* element.port_num */
} ote_verbs_event_target_t;

ote_verbs_event_target_t ote_verbs_event_target(enum ibv_event_type type);

/* Names for logs. */
const char *ote_verbs_wc_status_str(enum ibv_wc_status st);
const char *ote_verbs_qp_state_str(enum ibv_qp_state st);

#ifdef __cplusplus
}
#endif
#endif

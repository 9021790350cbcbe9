/*
 * verbs/verbs.c - opening providers by name, EOPNOTSUPP stubs, names for logs.
 *
 * ote_verbs_open() guarantees the table it returns has no NULL entry. A provider whose
 * table has gaps (it may be const, so it cannot be filled in place) gets a filled copy:
 * a small "stubbed" record owned by the instance, installed in v->ops, and removed again
 * by the close hook that ote_verbs_open() installs in front of the provider's own.
 */
#include <errno.h>
#include <stddef.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "verbs/ibverbs_dl.h"
#include "verbs/provider.h"
#include "verbs/verbs.h"

/* ---- EOPNOTSUPP stubs, one per op signature ---- */

static int stub_get_device_list(ote_verbs_t *v, struct ibv_device ***list_out, int *num_out) {
    (void)v;
    (void)list_out;
    (void)num_out;
    return EOPNOTSUPP;
}
static void stub_free_device_list(ote_verbs_t *v, struct ibv_device **list) {
    (void)v;
    (void)list;
}
static const char *stub_get_device_name(ote_verbs_t *v, struct ibv_device *dev) {
    (void)v;
    (void)dev;
    return NULL;
}
static int stub_open_device(ote_verbs_t *v, struct ibv_device *dev, struct ibv_context **ctx_out) {
    (void)v;
    (void)dev;
    (void)ctx_out;
    return EOPNOTSUPP;
}
static int stub_close_device(ote_verbs_t *v, struct ibv_context *ctx) {
    (void)v;
    (void)ctx;
    return EOPNOTSUPP;
}
static int stub_query_device(ote_verbs_t *v, struct ibv_context *ctx, struct ibv_device_attr *a) {
    (void)v;
    (void)ctx;
    (void)a;
    return EOPNOTSUPP;
}
static int stub_query_port(ote_verbs_t *v, struct ibv_context *ctx, uint8_t port,
                           struct ibv_port_attr *a) {
    (void)v;
    (void)ctx;
    (void)port;
    (void)a;
    return EOPNOTSUPP;
}
static int stub_query_gid(ote_verbs_t *v, struct ibv_context *ctx, uint8_t port, int index,
                          union ibv_gid *gid) {
    (void)v;
    (void)ctx;
    (void)port;
    (void)index;
    (void)gid;
    return EOPNOTSUPP;
}
static int stub_query_gid_ex(ote_verbs_t *v, struct ibv_context *ctx, uint32_t port, uint32_t index,
                             struct ibv_gid_entry *entry) {
    (void)v;
    (void)ctx;
    (void)port;
    (void)index;
    (void)entry;
    return EOPNOTSUPP;
}
static int stub_device_numa_node(ote_verbs_t *v, struct ibv_context *ctx, int *node_out) {
    (void)v;
    (void)ctx;
    (void)node_out;
    return EOPNOTSUPP;
}
static int stub_get_async_event(ote_verbs_t *v, struct ibv_context *ctx,
                                struct ibv_async_event *ev) {
    (void)v;
    (void)ctx;
    (void)ev;
    return EOPNOTSUPP;
}
static void stub_ack_async_event(ote_verbs_t *v, struct ibv_async_event *ev) {
    (void)v;
    (void)ev;
}
static int stub_alloc_pd(ote_verbs_t *v, struct ibv_context *ctx, struct ibv_pd **pd_out) {
    (void)v;
    (void)ctx;
    (void)pd_out;
    return EOPNOTSUPP;
}
static int stub_dealloc_pd(ote_verbs_t *v, struct ibv_pd *pd) {
    (void)v;
    (void)pd;
    return EOPNOTSUPP;
}
static int stub_reg_mr(ote_verbs_t *v, struct ibv_pd *pd, void *addr, size_t length, int access,
                       struct ibv_mr **mr_out) {
    (void)v;
    (void)pd;
    (void)addr;
    (void)length;
    (void)access;
    (void)mr_out;
    return EOPNOTSUPP;
}
static int stub_reg_dmabuf_mr(ote_verbs_t *v, struct ibv_pd *pd, uint64_t offset, size_t length,
                              uint64_t iova, int fd, int access, struct ibv_mr **mr_out) {
    (void)v;
    (void)pd;
    (void)offset;
    (void)length;
    (void)iova;
    (void)fd;
    (void)access;
    (void)mr_out;
    return EOPNOTSUPP;
}
static int stub_dereg_mr(ote_verbs_t *v, struct ibv_mr *mr) {
    (void)v;
    (void)mr;
    return EOPNOTSUPP;
}
static int stub_alloc_mw(ote_verbs_t *v, struct ibv_pd *pd, enum ibv_mw_type type,
                         struct ibv_mw **mw_out) {
    (void)v;
    (void)pd;
    (void)type;
    (void)mw_out;
    return EOPNOTSUPP;
}
static int stub_dealloc_mw(ote_verbs_t *v, struct ibv_mw *mw) {
    (void)v;
    (void)mw;
    return EOPNOTSUPP;
}
static int stub_create_comp_channel(ote_verbs_t *v, struct ibv_context *ctx,
                                    struct ibv_comp_channel **ch_out) {
    (void)v;
    (void)ctx;
    (void)ch_out;
    return EOPNOTSUPP;
}
static int stub_destroy_comp_channel(ote_verbs_t *v, struct ibv_comp_channel *ch) {
    (void)v;
    (void)ch;
    return EOPNOTSUPP;
}
static int stub_create_cq(ote_verbs_t *v, struct ibv_context *ctx, int cqe, void *cq_context,
                          struct ibv_comp_channel *ch, int comp_vector, struct ibv_cq **cq_out) {
    (void)v;
    (void)ctx;
    (void)cqe;
    (void)cq_context;
    (void)ch;
    (void)comp_vector;
    (void)cq_out;
    return EOPNOTSUPP;
}
static int stub_destroy_cq(ote_verbs_t *v, struct ibv_cq *cq) {
    (void)v;
    (void)cq;
    return EOPNOTSUPP;
}
static int stub_req_notify_cq(ote_verbs_t *v, struct ibv_cq *cq, int solicited_only) {
    (void)v;
    (void)cq;
    (void)solicited_only;
    return EOPNOTSUPP;
}
static int stub_get_cq_event(ote_verbs_t *v, struct ibv_comp_channel *ch, struct ibv_cq **cq_out,
                             void **cq_context_out) {
    (void)v;
    (void)ch;
    (void)cq_out;
    (void)cq_context_out;
    return EOPNOTSUPP;
}
static void stub_ack_cq_events(ote_verbs_t *v, struct ibv_cq *cq, unsigned int nevents) {
    (void)v;
    (void)cq;
    (void)nevents;
}
static int stub_poll_cq(ote_verbs_t *v, struct ibv_cq *cq, int num_entries, struct ibv_wc *wc) {
    (void)v;
    (void)cq;
    (void)num_entries;
    (void)wc;
    return -EOPNOTSUPP;
}
static int stub_create_qp(ote_verbs_t *v, struct ibv_pd *pd, struct ibv_qp_init_attr *init_attr,
                          struct ibv_qp **qp_out) {
    (void)v;
    (void)pd;
    (void)init_attr;
    (void)qp_out;
    return EOPNOTSUPP;
}
static int stub_modify_qp(ote_verbs_t *v, struct ibv_qp *qp, struct ibv_qp_attr *attr,
                          int attr_mask) {
    (void)v;
    (void)qp;
    (void)attr;
    (void)attr_mask;
    return EOPNOTSUPP;
}
static int stub_query_qp(ote_verbs_t *v, struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask,
                         struct ibv_qp_init_attr *init_attr) {
    (void)v;
    (void)qp;
    (void)attr;
    (void)attr_mask;
    (void)init_attr;
    return EOPNOTSUPP;
}
static int stub_destroy_qp(ote_verbs_t *v, struct ibv_qp *qp) {
    (void)v;
    (void)qp;
    return EOPNOTSUPP;
}
/* Nothing is posted: *bad_wr names the first WR, as a failed post does. */
static int stub_post_send(ote_verbs_t *v, struct ibv_qp *qp, struct ibv_send_wr *wr,
                          struct ibv_send_wr **bad_wr) {
    (void)v;
    (void)qp;
    if (bad_wr != NULL) *bad_wr = wr;
    return EOPNOTSUPP;
}
static int stub_post_recv(ote_verbs_t *v, struct ibv_qp *qp, struct ibv_recv_wr *wr,
                          struct ibv_recv_wr **bad_wr) {
    (void)v;
    (void)qp;
    if (bad_wr != NULL) *bad_wr = wr;
    return EOPNOTSUPP;
}

static int stub_query_device_ex(ote_verbs_t *v, struct ibv_context *ctx,
                                struct ibv_device_attr_ex *attr) {
    (void)v;
    (void)ctx;
    (void)attr;
    return EOPNOTSUPP;
}
static int stub_create_srq(ote_verbs_t *v, struct ibv_pd *pd, struct ibv_srq_init_attr *init_attr,
                           struct ibv_srq **srq_out) {
    (void)v;
    (void)pd;
    (void)init_attr;
    (void)srq_out;
    return EOPNOTSUPP;
}
static int stub_modify_srq(ote_verbs_t *v, struct ibv_srq *srq, struct ibv_srq_attr *attr,
                           int attr_mask) {
    (void)v;
    (void)srq;
    (void)attr;
    (void)attr_mask;
    return EOPNOTSUPP;
}
static int stub_query_srq(ote_verbs_t *v, struct ibv_srq *srq, struct ibv_srq_attr *attr) {
    (void)v;
    (void)srq;
    (void)attr;
    return EOPNOTSUPP;
}
static int stub_destroy_srq(ote_verbs_t *v, struct ibv_srq *srq) {
    (void)v;
    (void)srq;
    return EOPNOTSUPP;
}
/* Nothing is posted: *bad_wr names the first WR, as a failed post does. */
static int stub_post_srq_recv(ote_verbs_t *v, struct ibv_srq *srq, struct ibv_recv_wr *wr,
                              struct ibv_recv_wr **bad_wr) {
    (void)v;
    (void)srq;
    if (bad_wr != NULL) *bad_wr = wr;
    return EOPNOTSUPP;
}
static int stub_create_qp_flags(ote_verbs_t *v, struct ibv_pd *pd,
                                struct ibv_qp_init_attr *init_attr, uint32_t flags,
                                struct ibv_qp **qp_out) {
    (void)v;
    (void)pd;
    (void)init_attr;
    (void)flags;
    (void)qp_out;
    return EOPNOTSUPP;
}
static int stub_qp_flags(ote_verbs_t *v, struct ibv_qp *qp, uint32_t *flags_out) {
    (void)v;
    (void)qp;
    (void)flags_out;
    return EOPNOTSUPP;
}
static int stub_device_flags(ote_verbs_t *v, struct ibv_context *ctx, uint32_t *flags_out) {
    (void)v;
    (void)ctx;
    (void)flags_out;
    return EOPNOTSUPP;
}

#define FILL(ops, name) \
    do { \
        if ((ops)->name == NULL) (ops)->name = stub_##name; \
    } while (0)

void ote_verbs_ops_fill_stubs(ote_verbs_ops_t *ops) {
    if (ops == NULL) return;
    FILL(ops, get_device_list);
    FILL(ops, free_device_list);
    FILL(ops, get_device_name);
    FILL(ops, open_device);
    FILL(ops, close_device);
    FILL(ops, query_device);
    FILL(ops, query_port);
    FILL(ops, query_gid);
    FILL(ops, query_gid_ex);
    FILL(ops, device_numa_node);
    FILL(ops, get_async_event);
    FILL(ops, ack_async_event);
    FILL(ops, alloc_pd);
    FILL(ops, dealloc_pd);
    FILL(ops, reg_mr);
    FILL(ops, reg_dmabuf_mr);
    FILL(ops, dereg_mr);
    FILL(ops, alloc_mw);
    FILL(ops, dealloc_mw);
    FILL(ops, create_comp_channel);
    FILL(ops, destroy_comp_channel);
    FILL(ops, create_cq);
    FILL(ops, destroy_cq);
    FILL(ops, req_notify_cq);
    FILL(ops, get_cq_event);
    FILL(ops, ack_cq_events);
    FILL(ops, poll_cq);
    FILL(ops, create_qp);
    FILL(ops, modify_qp);
    FILL(ops, query_qp);
    FILL(ops, destroy_qp);
    FILL(ops, post_send);
    FILL(ops, post_recv);
    FILL(ops, query_device_ex);
    FILL(ops, create_srq);
    FILL(ops, modify_srq);
    FILL(ops, query_srq);
    FILL(ops, destroy_srq);
    FILL(ops, post_srq_recv);
    FILL(ops, create_qp_flags);
    FILL(ops, qp_flags);
    FILL(ops, device_flags);
}
#undef FILL

/* ---- opening by name ---- */

/* A filled copy of a provider table that had NULL entries, owned by the instance. */
typedef struct {
    ote_verbs_ops_t ops; /* first: v->ops points here */
    const ote_verbs_ops_t *orig_ops;
    void (*orig_close)(ote_verbs_t *v);
} stubbed_t;

static void stubbed_close(ote_verbs_t *v) {
    stubbed_t *s = (stubbed_t *)(void *)((char *)(uintptr_t)v->ops - offsetof(stubbed_t, ops));
    v->ops = s->orig_ops;
    v->close = s->orig_close;
    ote_free(s);
    if (v->close != NULL) v->close(v);
}

static int table_has_gap(const ote_verbs_ops_t *ops) {
    /* The table is a struct of function pointers only; compare against a filled copy. */
    ote_verbs_ops_t filled = *ops;
    ote_verbs_ops_fill_stubs(&filled);
    return memcmp(&filled, ops, sizeof(filled)) != 0;
}

const char *ote_verbs_event_name(enum ibv_event_type t) {
    switch (t) {
        case IBV_EVENT_CQ_ERR: return "CQ_ERR";
        case IBV_EVENT_QP_FATAL: return "QP_FATAL";
        case IBV_EVENT_QP_REQ_ERR: return "QP_REQ_ERR";
        case IBV_EVENT_QP_ACCESS_ERR: return "QP_ACCESS_ERR";
        case IBV_EVENT_COMM_EST: return "COMM_EST";
        case IBV_EVENT_SQ_DRAINED: return "SQ_DRAINED";
        case IBV_EVENT_PATH_MIG: return "PATH_MIG";
        case IBV_EVENT_PATH_MIG_ERR: return "PATH_MIG_ERR";
        case IBV_EVENT_DEVICE_FATAL: return "DEVICE_FATAL";
        case IBV_EVENT_PORT_ACTIVE: return "PORT_ACTIVE";
        case IBV_EVENT_PORT_ERR: return "PORT_ERR";
        case IBV_EVENT_LID_CHANGE: return "LID_CHANGE";
        case IBV_EVENT_PKEY_CHANGE: return "PKEY_CHANGE";
        case IBV_EVENT_SM_CHANGE: return "SM_CHANGE";
        case IBV_EVENT_SRQ_ERR: return "SRQ_ERR";
        case IBV_EVENT_SRQ_LIMIT_REACHED: return "SRQ_LIMIT_REACHED";
        case IBV_EVENT_QP_LAST_WQE_REACHED: return "QP_LAST_WQE_REACHED";
        case IBV_EVENT_CLIENT_REREGISTER: return "CLIENT_REREGISTER";
        case IBV_EVENT_GID_CHANGE: return "GID_CHANGE";
        case IBV_EVENT_WQ_FATAL: return "WQ_FATAL";
        default: return "other";
    }
}

int ote_verbs_provider_available(const char *provider) {
    if (provider == NULL) return 0;
    if (strcmp(provider, "sim") == 0) return 1;
    if (strcmp(provider, "rdma-core") == 0) return ote__ibv_available();
    return 0;
}

ote_status_t ote_verbs_open(const char *provider, const char *config, ote_verbs_t **v_out) {
    if (provider == NULL || v_out == NULL) return OTE_ERR_INVALID;
    ote_status_t (*open_fn)(const char *, ote_verbs_t **) = NULL;
    if (strcmp(provider, "rdma-core") == 0) {
        open_fn = ote__verbs_rdma_core_open;
    } else if (strcmp(provider, "sim") == 0) {
        open_fn = ote__verbs_sim_open;
    } else {
        OTE_WARN("verbs", "unknown verbs provider \"%s\" (known: rdma-core, sim)", provider);
        return OTE_ERR_NOT_FOUND;
    }
    ote_verbs_t *v = NULL;
    ote_status_t st = open_fn(config, &v);
    if (st != OTE_OK) {
        OTE_INFO("verbs", "opening provider %s failed: %s", provider, ote_status_str(st));
        return st;
    }
    if (v == NULL || v->ops == NULL) {
        OTE_ERROR("verbs", "provider %s returned no table", provider);
        return OTE_ERR_INVALID;
    }
    if (table_has_gap(v->ops)) {
        stubbed_t *s = ote_malloc(sizeof(*s));
        if (s == NULL) {
            ote_verbs_close(v);
            return OTE_ERR_NOMEM;
        }
        s->ops = *v->ops;
        ote_verbs_ops_fill_stubs(&s->ops);
        s->orig_ops = v->ops;
        s->orig_close = v->close;
        v->ops = &s->ops; /* the instance owns s from here; stubbed_close frees it */
        v->close = stubbed_close;
    }
    *v_out = v;
    return OTE_OK;
}

void ote_verbs_close(ote_verbs_t *v) {
    if (v == NULL || v->close == NULL) return;
    v->close(v);
}

ote_status_t ote_verbs_status(int err) {
    if (err < 0) err = -err;
    if (err == 0) return OTE_ERR_NATIVE; /* a failed verb that set no errno */
    return ote_status_from_errno(err);
}

ote_verbs_event_target_t ote_verbs_event_target(enum ibv_event_type type) {
    switch (type) {
        case IBV_EVENT_QP_FATAL:
        case IBV_EVENT_QP_REQ_ERR:
        case IBV_EVENT_QP_ACCESS_ERR:
        case IBV_EVENT_COMM_EST:
        case IBV_EVENT_SQ_DRAINED:
        case IBV_EVENT_PATH_MIG:
        case IBV_EVENT_PATH_MIG_ERR:
        case IBV_EVENT_QP_LAST_WQE_REACHED: return OTE_VERBS_EVENT_ON_QP;
        case IBV_EVENT_CQ_ERR: return OTE_VERBS_EVENT_ON_CQ;
        case IBV_EVENT_SRQ_ERR:
        case IBV_EVENT_SRQ_LIMIT_REACHED: return OTE_VERBS_EVENT_ON_SRQ;
        case IBV_EVENT_WQ_FATAL: return OTE_VERBS_EVENT_ON_WQ;
        case IBV_EVENT_PORT_ACTIVE:
        case IBV_EVENT_PORT_ERR:
        case IBV_EVENT_LID_CHANGE:
        case IBV_EVENT_PKEY_CHANGE:
        case IBV_EVENT_SM_CHANGE:
        case IBV_EVENT_CLIENT_REREGISTER:
        case IBV_EVENT_GID_CHANGE: return OTE_VERBS_EVENT_ON_PORT;
        case IBV_EVENT_DEVICE_FATAL: return OTE_VERBS_EVENT_ON_DEVICE;
    }
    return OTE_VERBS_EVENT_ON_DEVICE;
}

const char *ote_verbs_wc_status_str(enum ibv_wc_status st) {
    switch (st) {
        case IBV_WC_SUCCESS: return "SUCCESS";
        case IBV_WC_LOC_LEN_ERR: return "LOC_LEN_ERR";
        case IBV_WC_LOC_QP_OP_ERR: return "LOC_QP_OP_ERR";
        case IBV_WC_LOC_EEC_OP_ERR: return "LOC_EEC_OP_ERR";
        case IBV_WC_LOC_PROT_ERR: return "LOC_PROT_ERR";
        case IBV_WC_WR_FLUSH_ERR: return "WR_FLUSH_ERR";
        case IBV_WC_MW_BIND_ERR: return "MW_BIND_ERR";
        case IBV_WC_BAD_RESP_ERR: return "BAD_RESP_ERR";
        case IBV_WC_LOC_ACCESS_ERR: return "LOC_ACCESS_ERR";
        case IBV_WC_REM_INV_REQ_ERR: return "REM_INV_REQ_ERR";
        case IBV_WC_REM_ACCESS_ERR: return "REM_ACCESS_ERR";
        case IBV_WC_REM_OP_ERR: return "REM_OP_ERR";
        case IBV_WC_RETRY_EXC_ERR: return "RETRY_EXC_ERR";
        case IBV_WC_RNR_RETRY_EXC_ERR: return "RNR_RETRY_EXC_ERR";
        case IBV_WC_LOC_RDD_VIOL_ERR: return "LOC_RDD_VIOL_ERR";
        case IBV_WC_REM_INV_RD_REQ_ERR: return "REM_INV_RD_REQ_ERR";
        case IBV_WC_REM_ABORT_ERR: return "REM_ABORT_ERR";
        case IBV_WC_INV_EECN_ERR: return "INV_EECN_ERR";
        case IBV_WC_INV_EEC_STATE_ERR: return "INV_EEC_STATE_ERR";
        case IBV_WC_FATAL_ERR: return "FATAL_ERR";
        case IBV_WC_RESP_TIMEOUT_ERR: return "RESP_TIMEOUT_ERR";
        case IBV_WC_GENERAL_ERR: return "GENERAL_ERR";
        case IBV_WC_TM_ERR: return "TM_ERR";
        case IBV_WC_TM_RNDV_INCOMPLETE: return "TM_RNDV_INCOMPLETE";
    }
    return "UNKNOWN_WC_STATUS";
}

const char *ote_verbs_qp_state_str(enum ibv_qp_state st) {
    switch (st) {
        case IBV_QPS_RESET: return "RESET";
        case IBV_QPS_INIT: return "INIT";
        case IBV_QPS_RTR: return "RTR";
        case IBV_QPS_RTS: return "RTS";
        case IBV_QPS_SQD: return "SQD";
        case IBV_QPS_SQE: return "SQE";
        case IBV_QPS_ERR: return "ERR";
        case IBV_QPS_UNKNOWN: return "UNKNOWN";
    }
    return "UNKNOWN_QP_STATE";
}

/*
 * verbs/fault.c - the fault-injection decorator (see fault.h for the rules).
 *
 * A decorator owns: its name, its rules, its counters, and per context (created lazily
 * by inject/async_fd) an eventfd, an epoll set and a queue of injected events. It holds
 * no verbs object of its own; every object it hands out is the inner provider's.
 * One mutex guards everything above; it is never held across a call into the inner
 * provider, so a blocking inner call (get_async_event, get_cq_event) does not stall
 * other threads arming rules or reading counters.
 */
#include "verbs/fault.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/hash.h"
#include "base/lock.h"
#include "base/log.h"

#define OP(name) OTE_VERBS_FAULT_OP_##name
#define LOGC "verbs.fault"

static const char *const g_op_names[OTE_VERBS_FAULT_OP_COUNT] = {
    "get_device_list", "free_device_list", "get_device_name", "open_device",
    "close_device", "query_device", "query_port", "query_gid",
    "query_gid_ex", "device_numa_node", "get_async_event", "ack_async_event",
    "alloc_pd", "dealloc_pd", "reg_mr", "reg_dmabuf_mr", "dereg_mr",
    "alloc_mw", "dealloc_mw", "create_comp_channel", "destroy_comp_channel",
    "create_cq", "destroy_cq", "req_notify_cq", "get_cq_event",
    "ack_cq_events", "poll_cq", "create_qp", "modify_qp",
    "query_qp", "destroy_qp", "post_send", "post_recv",
};

const char *ote_verbs_fault_op_name(ote_verbs_fault_op_t op) {
    if ((int)op < 0 || op >= OTE_VERBS_FAULT_OP_COUNT) return "unknown";
    return g_op_names[op];
}

ote_status_t ote_verbs_fault_op_from_name(const char *name, ote_verbs_fault_op_t *op_out) {
    if (name == NULL || op_out == NULL) return OTE_ERR_INVALID;
    for (int i = 0; i < OTE_VERBS_FAULT_OP_COUNT; i++) {
        if (strcmp(g_op_names[i], name) == 0) {
            *op_out = (ote_verbs_fault_op_t)i;
            return OTE_OK;
        }
    }
    return OTE_ERR_NOT_FOUND;
}

bool ote_verbs_fault_op_is_destroy(ote_verbs_fault_op_t op) {
    switch (op) {
        case OP(CLOSE_DEVICE):
        case OP(DEALLOC_PD):
        case OP(DEREG_MR):
        case OP(DEALLOC_MW):
        case OP(DESTROY_COMP_CHANNEL):
        case OP(DESTROY_CQ):
        case OP(DESTROY_QP):
            return true;
        default:
            return false;
    }
}

/* Ops whose signature cannot carry a failure. */
static bool op_can_fail(ote_verbs_fault_op_t op) {
    return op != OP(FREE_DEVICE_LIST) && op != OP(GET_DEVICE_NAME) &&
           op != OP(ACK_ASYNC_EVENT) && op != OP(ACK_CQ_EVENTS);
}

/* ---- state ---- */

typedef struct {
    bool armed;
    ote_fault_mode_t mode;
    uint64_t n;
    uint64_t hits;
    int err;
} fail_rule_t;

typedef struct {
    bool armed;
    const void *obj;
    uint64_t left;
} busy_rule_t;

typedef struct {
    bool armed;
    unsigned k;
    int err;
} partial_rule_t;

typedef struct cqe_rule {
    struct ibv_cq *cq; /* NULL: any */
    bool by_wr_id;
    uint64_t wr_id;
    uint64_t nth;
    uint64_t seen;
    bool lose;         /* else rewrite the status */
    enum ibv_wc_status status;
    uint32_t vendor_err;
    struct cqe_rule *prev, *next;
} cqe_rule_t;

/* An injected async event: queued on its context, then outstanding until acked. */
typedef struct ev_node {
    struct ibv_async_event ev;
    struct ev_node *prev, *next;
} ev_node_t;

typedef struct ctx_state {
    struct ibv_context *ctx; /* key */
    int efd;                 /* eventfd: readable while `queue` is not empty */
    int epfd;                /* epoll over efd and ctx->async_fd */
    ev_node_t *queue;
    UT_hash_handle hh;
} ctx_state_t;

typedef struct {
    ote_verbs_t v; /* first: the decorated instance handed out */
    ote_verbs_t *inner;
    unsigned flags;
    char *name;
    ote_mutex_t mu;
    fail_rule_t fail[OTE_VERBS_FAULT_OP_COUNT];
    busy_rule_t busy[OTE_VERBS_FAULT_OP_COUNT];
    partial_rule_t partial_send, partial_recv;
    cqe_rule_t *cqe_rules;
    ctx_state_t *ctxs;
    ev_node_t *outstanding; /* injected events delivered and not yet acked */
    uint64_t calls[OTE_VERBS_FAULT_OP_COUNT];
    uint64_t injected[OTE_VERBS_FAULT_OP_COUNT];
} fault_t;

static const ote_verbs_ops_t g_fault_ops;

static fault_t *to_fault(ote_verbs_t *v) { return (fault_t *)(void *)v; }
static const ote_verbs_ops_t *in_ops(fault_t *f) { return f->inner->ops; }

bool ote_verbs_fault_is(const ote_verbs_t *v) { return v != NULL && v->ops == &g_fault_ops; }

ote_verbs_t *ote_verbs_fault_inner(ote_verbs_t *v) {
    return ote_verbs_fault_is(v) ? to_fault(v)->inner : NULL;
}

/*
 * Entry of every op: count the call, then apply the op's fail rule and (for destroys)
 * its busy rule. Returns 0 to go on to the inner provider, else the errno to return.
 */
static int enter(fault_t *f, ote_verbs_fault_op_t op, const void *obj) {
    int err = 0;
    uint64_t call;
    ote_mutex_lock(&f->mu);
    call = ++f->calls[op];
    fail_rule_t *r = &f->fail[op];
    if (r->armed) {
        r->hits++;
        bool fire = false;
        switch (r->mode) {
            case OTE_FAULT_NTH:
                fire = r->hits == r->n;
                if (fire) r->armed = false; /* one-shot */
                break;
            case OTE_FAULT_EVERY: fire = true; break;
            case OTE_FAULT_FROM: fire = r->hits >= r->n; break;
        }
        if (fire) err = r->err;
    }
    bool busy = false;
    if (err == 0 && f->busy[op].armed && (f->busy[op].obj == NULL || f->busy[op].obj == obj)) {
        err = EBUSY;
        busy = true;
        if (--f->busy[op].left == 0) f->busy[op].armed = false;
    }
    if (err != 0) f->injected[op]++;
    ote_mutex_unlock(&f->mu);
    if (err != 0) {
        OTE_DEBUG(LOGC, "%s: %s call %llu fails with errno %d (%s)%s", f->name,
                  g_op_names[op], (unsigned long long)call, err, strerror(err),
                  busy ? " [busy destroy]" : "");
    }
    return err;
}

static void count_only(fault_t *f, ote_verbs_fault_op_t op) {
    ote_mutex_lock(&f->mu);
    f->calls[op]++;
    ote_mutex_unlock(&f->mu);
}

/* ---- per-context async event state ---- */

static void ctx_state_free(ctx_state_t *cs) {
    ev_node_t *e, *tmp;
    DL_FOREACH_SAFE(cs->queue, e, tmp) {
        DL_DELETE(cs->queue, e);
        ote_free(e);
    }
    if (cs->epfd >= 0) close(cs->epfd);
    if (cs->efd >= 0) close(cs->efd);
    ote_free(cs);
}

/* Find or create the state of ctx; called with f->mu held. */
static ote_status_t ctx_state_get(fault_t *f, struct ibv_context *ctx, ctx_state_t **cs_out) {
    ctx_state_t *cs = NULL;
    HASH_FIND_PTR(f->ctxs, &ctx, cs);
    if (cs != NULL) {
        *cs_out = cs;
        return OTE_OK;
    }
    ote_status_t st;
    cs = ote_calloc(1, sizeof(*cs));
    if (cs == NULL) return OTE_ERR_NOMEM;
    cs->ctx = ctx;
    cs->epfd = -1;
    cs->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (cs->efd < 0) {
        st = ote_status_from_errno(errno);
        goto err_free;
    }
    cs->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (cs->epfd < 0) {
        st = ote_status_from_errno(errno);
        goto err_free;
    }
    struct epoll_event ee;
    memset(&ee, 0, sizeof(ee));
    ee.events = EPOLLIN;
    ee.data.fd = cs->efd;
    if (epoll_ctl(cs->epfd, EPOLL_CTL_ADD, cs->efd, &ee) != 0) {
        st = ote_status_from_errno(errno);
        goto err_free;
    }
    /* The inner provider's fd, when it has a pollable one: then the decorator's fd also
     * wakes for the inner provider's own events. */
    if (ctx != NULL && ctx->async_fd >= 0) {
        ee.data.fd = ctx->async_fd;
        if (epoll_ctl(cs->epfd, EPOLL_CTL_ADD, ctx->async_fd, &ee) != 0) {
            OTE_DEBUG(LOGC, "%s: async fd %d of the inner provider is not pollable (%s); "
                      "only injected events wake the decorator's fd",
                      f->name, ctx->async_fd, strerror(errno));
        }
    }
    OTE_HASH_ADD_KEYPTR(hh, f->ctxs, &cs->ctx, sizeof(cs->ctx), cs, st);
    if (st != OTE_OK) goto err_free;
    *cs_out = cs;
    return OTE_OK;

err_free:
    ctx_state_free(cs);
    return st;
}

/* Drop the state of a context that was closed through the decorator. */
static void ctx_state_drop(fault_t *f, struct ibv_context *ctx) {
    ctx_state_t *cs = NULL;
    ote_mutex_lock(&f->mu);
    HASH_FIND_PTR(f->ctxs, &ctx, cs);
    if (cs != NULL) HASH_DEL(f->ctxs, cs);
    ote_mutex_unlock(&f->mu);
    if (cs != NULL) ctx_state_free(cs);
}

static void efd_signal(ctx_state_t *cs) {
    uint64_t one = 1;
    ssize_t n = write(cs->efd, &one, sizeof(one));
    (void)n; /* fails only on counter overflow, when the fd is readable anyway */
}

static void efd_drain(ctx_state_t *cs) {
    uint64_t val;
    ssize_t n = read(cs->efd, &val, sizeof(val));
    (void)n; /* EAGAIN: already drained */
}

/* Two events are "the same" for ack matching when type and element agree. */
static bool event_matches(const struct ibv_async_event *a, const struct ibv_async_event *b) {
    if (a->event_type != b->event_type) return false;
    switch (ote_verbs_event_target(a->event_type)) {
        case OTE_VERBS_EVENT_ON_QP: return a->element.qp == b->element.qp;
        case OTE_VERBS_EVENT_ON_CQ: return a->element.cq == b->element.cq;
        case OTE_VERBS_EVENT_ON_SRQ: return a->element.srq == b->element.srq;
        case OTE_VERBS_EVENT_ON_WQ: return a->element.wq == b->element.wq;
        case OTE_VERBS_EVENT_ON_PORT: return a->element.port_num == b->element.port_num;
        case OTE_VERBS_EVENT_ON_DEVICE: return true;
    }
    return true;
}

/* ---- decorated ops ---- */

static int f_get_device_list(ote_verbs_t *v, struct ibv_device ***list_out, int *num_out) {
    fault_t *f = to_fault(v);
    int err = enter(f, OP(GET_DEVICE_LIST), NULL);
    if (err != 0) return err;
    return in_ops(f)->get_device_list(f->inner, list_out, num_out);
}

static void f_free_device_list(ote_verbs_t *v, struct ibv_device **list) {
    fault_t *f = to_fault(v);
    count_only(f, OP(FREE_DEVICE_LIST));
    in_ops(f)->free_device_list(f->inner, list);
}

static const char *f_get_device_name(ote_verbs_t *v, struct ibv_device *dev) {
    fault_t *f = to_fault(v);
    count_only(f, OP(GET_DEVICE_NAME));
    return in_ops(f)->get_device_name(f->inner, dev);
}

static int f_open_device(ote_verbs_t *v, struct ibv_device *dev, struct ibv_context **ctx_out) {
    fault_t *f = to_fault(v);
    int err = enter(f, OP(OPEN_DEVICE), NULL);
    if (err != 0) return err;
    return in_ops(f)->open_device(f->inner, dev, ctx_out);
}

static int f_close_device(ote_verbs_t *v, struct ibv_context *ctx) {
    fault_t *f = to_fault(v);
    int err = enter(f, OP(CLOSE_DEVICE), ctx);
    if (err != 0) return err;
    err = in_ops(f)->close_device(f->inner, ctx);
    if (err == 0) ctx_state_drop(f, ctx); /* a failed close keeps the context, and its state */
    return err;
}

static int f_query_device(ote_verbs_t *v, struct ibv_context *ctx, struct ibv_device_attr *attr) {
    fault_t *f = to_fault(v);
    int err = enter(f, OP(QUERY_DEVICE), NULL);
    if (err != 0) return err;
    return in_ops(f)->query_device(f->inner, ctx, attr);
}

static int f_query_port(ote_verbs_t *v, struct ibv_context *ctx, uint8_t port,
                        struct ibv_port_attr *attr) {
    fault_t *f = to_fault(v);
    int err = enter(f, OP(QUERY_PORT), NULL);
    if (err != 0) return err;
    return in_ops(f)->query_port(f->inner, ctx, port, attr);
}

static int f_query_gid(ote_verbs_t *v, struct ibv_context *ctx, uint8_t port, int index,
                       union ibv_gid *gid) {
    fault_t *f = to_fault(v);
    int err = enter(f, OP(QUERY_GID), NULL);
    if (err != 0) return err;
    return in_ops(f)->query_gid(f->inner, ctx, port, index, gid);
}

static int f_query_gid_ex(ote_verbs_t *v, struct ibv_context *ctx, uint32_t port, uint32_t index,
                          struct ibv_gid_entry *entry) {
    fault_t *f = to_fault(v);
    int err = enter(f, OP(QUERY_GID_EX), NULL);
    if (err != 0) return err;
    return in_ops(f)->query_gid_ex(f->inner, ctx, port, index, entry);
}

static int f_device_numa_node(ote_verbs_t *v, struct ibv_context *ctx, int *node_out) {
    fault_t *f = to_fault(v);
    int err = enter(f, OP(DEVICE_NUMA_NODE), NULL);
    if (err != 0) return err;
    return in_ops(f)->device_numa_node(f->inner, ctx, node_out);
}

static int f_get_async_event(ote_verbs_t *v, struct ibv_context *ctx, struct ibv_async_event *ev) {
    fault_t *f = to_fault(v);
    int err = enter(f, OP(GET_ASYNC_EVENT), NULL);
    if (err != 0) return err;
    if (ev == NULL) return EINVAL;
    ev_node_t *e = NULL;
    ote_mutex_lock(&f->mu);
    ctx_state_t *cs = NULL;
    HASH_FIND_PTR(f->ctxs, &ctx, cs);
    if (cs != NULL && cs->queue != NULL) {
        e = cs->queue;
        DL_DELETE(cs->queue, e);
        if (cs->queue == NULL) efd_drain(cs);
        DL_APPEND(f->outstanding, e); /* until acked */
        *ev = e->ev;
        f->injected[OP(GET_ASYNC_EVENT)]++;
    }
    ote_mutex_unlock(&f->mu);
    if (e != NULL) {
        OTE_DEBUG(LOGC, "%s: get_async_event returns injected event %s", f->name,
                  ibv_event_type_str(e->ev.event_type));
        return 0;
    }
    return in_ops(f)->get_async_event(f->inner, ctx, ev);
}

static void f_ack_async_event(ote_verbs_t *v, struct ibv_async_event *ev) {
    fault_t *f = to_fault(v);
    ev_node_t *e = NULL;
    ote_mutex_lock(&f->mu);
    f->calls[OP(ACK_ASYNC_EVENT)]++;
    if (ev != NULL) {
        DL_FOREACH(f->outstanding, e) {
            if (event_matches(&e->ev, ev)) break;
        }
        if (e != NULL) DL_DELETE(f->outstanding, e);
    }
    ote_mutex_unlock(&f->mu);
    if (e != NULL) {
        ote_free(e); /* an injected event: the inner provider never saw it */
        return;
    }
    in_ops(f)->ack_async_event(f->inner, ev);
}

static int f_alloc_pd(ote_verbs_t *v, struct ibv_context *ctx, struct ibv_pd **pd_out) {
    fault_t *f = to_fault(v);
    int err = enter(f, OP(ALLOC_PD), NULL);
    if (err != 0) return err;
    return in_ops(f)->alloc_pd(f->inner, ctx, pd_out);
}

static int f_dealloc_pd(ote_verbs_t *v, struct ibv_pd *pd) {
    fault_t *f = to_fault(v);
    int err = enter(f, OP(DEALLOC_PD), pd);
    if (err != 0) return err;
    return in_ops(f)->dealloc_pd(f->inner, pd);
}

static int f_reg_mr(ote_verbs_t *v, struct ibv_pd *pd, void *addr, size_t length, int access,
                    struct ibv_mr **mr_out) {
    fault_t *f = to_fault(v);
    int err = enter(f, OP(REG_MR), NULL);
    if (err != 0) return err;
    return in_ops(f)->reg_mr(f->inner, pd, addr, length, access, mr_out);
}

static int f_reg_dmabuf_mr(ote_verbs_t *v, struct ibv_pd *pd, uint64_t offset, size_t length,
                           uint64_t iova, int fd, int access, struct ibv_mr **mr_out) {
    fault_t *f = to_fault(v);
    int err = enter(f, OP(REG_DMABUF_MR), NULL);
    if (err != 0) return err;
    return in_ops(f)->reg_dmabuf_mr(f->inner, pd, offset, length, iova, fd, access, mr_out);
}

static int f_dereg_mr(ote_verbs_t *v, struct ibv_mr *mr) {
    fault_t *f = to_fault(v);
    int err = enter(f, OP(DEREG_MR), mr);
    if (err != 0) return err;
    return in_ops(f)->dereg_mr(f->inner, mr);
}

static int f_alloc_mw(ote_verbs_t *v, struct ibv_pd *pd, enum ibv_mw_type type,
                      struct ibv_mw **mw_out) {
    fault_t *f = to_fault(v);
    int err = enter(f, OP(ALLOC_MW), NULL);
    if (err != 0) return err;
    return in_ops(f)->alloc_mw(f->inner, pd, type, mw_out);
}

static int f_dealloc_mw(ote_verbs_t *v, struct ibv_mw *mw) {
    fault_t *f = to_fault(v);
    int err = enter(f, OP(DEALLOC_MW), mw);
    if (err != 0) return err;
    return in_ops(f)->dealloc_mw(f->inner, mw);
}

static int f_create_comp_channel(ote_verbs_t *v, struct ibv_context *ctx,
                                 struct ibv_comp_channel **ch_out) {
    fault_t *f = to_fault(v);
    int err = enter(f, OP(CREATE_COMP_CHANNEL), NULL);
    if (err != 0) return err;
    return in_ops(f)->create_comp_channel(f->inner, ctx, ch_out);
}

static int f_destroy_comp_channel(ote_verbs_t *v, struct ibv_comp_channel *ch) {
    fault_t *f = to_fault(v);
    int err = enter(f, OP(DESTROY_COMP_CHANNEL), ch);
    if (err != 0) return err;
    return in_ops(f)->destroy_comp_channel(f->inner, ch);
}

static int f_create_cq(ote_verbs_t *v, struct ibv_context *ctx, int cqe, void *cq_context,
                       struct ibv_comp_channel *ch, int comp_vector, struct ibv_cq **cq_out) {
    fault_t *f = to_fault(v);
    int err = enter(f, OP(CREATE_CQ), NULL);
    if (err != 0) return err;
    return in_ops(f)->create_cq(f->inner, ctx, cqe, cq_context, ch, comp_vector, cq_out);
}

static int f_destroy_cq(ote_verbs_t *v, struct ibv_cq *cq) {
    fault_t *f = to_fault(v);
    int err = enter(f, OP(DESTROY_CQ), cq);
    if (err != 0) return err;
    return in_ops(f)->destroy_cq(f->inner, cq);
}

static int f_req_notify_cq(ote_verbs_t *v, struct ibv_cq *cq, int solicited_only) {
    fault_t *f = to_fault(v);
    int err = enter(f, OP(REQ_NOTIFY_CQ), NULL);
    if (err != 0) return err;
    return in_ops(f)->req_notify_cq(f->inner, cq, solicited_only);
}

static int f_get_cq_event(ote_verbs_t *v, struct ibv_comp_channel *ch, struct ibv_cq **cq_out,
                          void **cq_context_out) {
    fault_t *f = to_fault(v);
    int err = enter(f, OP(GET_CQ_EVENT), NULL);
    if (err != 0) return err;
    return in_ops(f)->get_cq_event(f->inner, ch, cq_out, cq_context_out);
}

static void f_ack_cq_events(ote_verbs_t *v, struct ibv_cq *cq, unsigned int nevents) {
    fault_t *f = to_fault(v);
    count_only(f, OP(ACK_CQ_EVENTS));
    in_ops(f)->ack_cq_events(f->inner, cq, nevents);
}

/* Apply the CQE rules to n fresh CQEs of cq; returns how many remain (compacted). */
static int filter_cqes(fault_t *f, struct ibv_cq *cq, struct ibv_wc *wc, int n) {
    int kept = 0;
    ote_mutex_lock(&f->mu);
    if (f->cqe_rules == NULL) {
        ote_mutex_unlock(&f->mu);
        return n;
    }
    for (int i = 0; i < n; i++) {
        cqe_rule_t *fired = NULL, *r;
        DL_FOREACH(f->cqe_rules, r) {
            if (r->cq != NULL && r->cq != cq) continue;
            bool match;
            if (r->by_wr_id) {
                match = wc[i].wr_id == r->wr_id;
            } else {
                r->seen++; /* every position rule counts every CQE of its CQ */
                match = r->seen == r->nth;
            }
            if (match && fired == NULL) fired = r;
        }
        if (fired == NULL) {
            if (kept != i) wc[kept] = wc[i];
            kept++;
            continue;
        }
        DL_DELETE(f->cqe_rules, fired);
        f->injected[OP(POLL_CQ)]++;
        if (fired->lose) {
            OTE_DEBUG(LOGC, "%s: poll_cq swallows the CQE of wr_id %llu (qp %u, %s)", f->name,
                      (unsigned long long)wc[i].wr_id, wc[i].qp_num,
                      ote_verbs_wc_status_str(wc[i].status));
        } else {
            OTE_DEBUG(LOGC, "%s: poll_cq rewrites the CQE of wr_id %llu (qp %u) from %s to %s",
                      f->name, (unsigned long long)wc[i].wr_id, wc[i].qp_num,
                      ote_verbs_wc_status_str(wc[i].status),
                      ote_verbs_wc_status_str(fired->status));
            wc[i].status = fired->status;
            wc[i].vendor_err = fired->vendor_err;
            if (fired->status != IBV_WC_SUCCESS) {
                /* Undefined on an error CQE: make a caller that reads them fail loudly. */
                wc[i].opcode = (enum ibv_wc_opcode)OTE_VERBS_FAULT_POISON_OPCODE;
                wc[i].byte_len = OTE_VERBS_FAULT_POISON_BYTE_LEN;
                wc[i].wc_flags = OTE_VERBS_FAULT_POISON_WC_FLAGS;
                wc[i].imm_data = 0;
            }
            if (kept != i) wc[kept] = wc[i];
            kept++;
        }
        ote_free(fired);
    }
    ote_mutex_unlock(&f->mu);
    return kept;
}

static int f_poll_cq(ote_verbs_t *v, struct ibv_cq *cq, int num_entries, struct ibv_wc *wc) {
    fault_t *f = to_fault(v);
    int err = enter(f, OP(POLL_CQ), NULL);
    if (err != 0) return -err;
    if (num_entries <= 0) return in_ops(f)->poll_cq(f->inner, cq, num_entries, wc);
    int total = 0;
    for (;;) {
        int want = num_entries - total;
        int r = in_ops(f)->poll_cq(f->inner, cq, want, wc + total);
        if (r < 0) return total > 0 ? total : r; /* CQEs already taken must be returned */
        int kept = filter_cqes(f, cq, wc + total, r);
        total += kept;
        /* Refill only when something was swallowed from a full batch. */
        if (r < want || kept == r) break;
    }
    return total;
}

static int f_create_qp(ote_verbs_t *v, struct ibv_pd *pd, struct ibv_qp_init_attr *init_attr,
                       struct ibv_qp **qp_out) {
    fault_t *f = to_fault(v);
    int err = enter(f, OP(CREATE_QP), NULL);
    if (err != 0) return err;
    return in_ops(f)->create_qp(f->inner, pd, init_attr, qp_out);
}

static int f_modify_qp(ote_verbs_t *v, struct ibv_qp *qp, struct ibv_qp_attr *attr,
                       int attr_mask) {
    fault_t *f = to_fault(v);
    int err = enter(f, OP(MODIFY_QP), NULL);
    if (err != 0) return err;
    return in_ops(f)->modify_qp(f->inner, qp, attr, attr_mask);
}

static int f_query_qp(ote_verbs_t *v, struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask,
                      struct ibv_qp_init_attr *init_attr) {
    fault_t *f = to_fault(v);
    int err = enter(f, OP(QUERY_QP), NULL);
    if (err != 0) return err;
    return in_ops(f)->query_qp(f->inner, qp, attr, attr_mask, init_attr);
}

static int f_destroy_qp(ote_verbs_t *v, struct ibv_qp *qp) {
    fault_t *f = to_fault(v);
    int err = enter(f, OP(DESTROY_QP), qp);
    if (err != 0) return err;
    return in_ops(f)->destroy_qp(f->inner, qp);
}

/* Take (consume) the partial rule of a post op. */
static bool take_partial(fault_t *f, partial_rule_t *p, unsigned *k_out, int *err_out) {
    bool armed;
    ote_mutex_lock(&f->mu);
    armed = p->armed;
    if (armed) {
        *k_out = p->k;
        *err_out = p->err;
        p->armed = false;
    }
    ote_mutex_unlock(&f->mu);
    return armed;
}

static void count_injected(fault_t *f, ote_verbs_fault_op_t op) {
    ote_mutex_lock(&f->mu);
    f->injected[op]++;
    ote_mutex_unlock(&f->mu);
}

static int f_post_send(ote_verbs_t *v, struct ibv_qp *qp, struct ibv_send_wr *wr,
                       struct ibv_send_wr **bad_wr) {
    fault_t *f = to_fault(v);
    int err = enter(f, OP(POST_SEND), NULL);
    if (err != 0) {
        if (bad_wr != NULL) *bad_wr = wr; /* nothing was posted */
        return err;
    }
    unsigned k = 0;
    if (!take_partial(f, &f->partial_send, &k, &err))
        return in_ops(f)->post_send(f->inner, qp, wr, bad_wr);
    /* Cut the caller's list after WR k-1, post the head, and restore the list. */
    struct ibv_send_wr *last = NULL, *cut = wr;
    for (unsigned i = 0; i < k && cut != NULL; i++) {
        last = cut;
        cut = cut->next;
    }
    if (cut == NULL) return in_ops(f)->post_send(f->inner, qp, wr, bad_wr); /* <= k WRs */
    if (last != NULL) {
        last->next = NULL;
        int r = in_ops(f)->post_send(f->inner, qp, wr, bad_wr);
        last->next = cut;
        if (r != 0) return r; /* the inner provider refused one of the first k itself */
    }
    count_injected(f, OP(POST_SEND));
    OTE_DEBUG(LOGC, "%s: post_send accepts only %u WRs, fails with errno %d at wr_id %llu",
              f->name, k, err, (unsigned long long)cut->wr_id);
    if (bad_wr != NULL) *bad_wr = cut;
    return err;
}

static int f_post_recv(ote_verbs_t *v, struct ibv_qp *qp, struct ibv_recv_wr *wr,
                       struct ibv_recv_wr **bad_wr) {
    fault_t *f = to_fault(v);
    int err = enter(f, OP(POST_RECV), NULL);
    if (err != 0) {
        if (bad_wr != NULL) *bad_wr = wr;
        return err;
    }
    unsigned k = 0;
    if (!take_partial(f, &f->partial_recv, &k, &err))
        return in_ops(f)->post_recv(f->inner, qp, wr, bad_wr);
    struct ibv_recv_wr *last = NULL, *cut = wr;
    for (unsigned i = 0; i < k && cut != NULL; i++) {
        last = cut;
        cut = cut->next;
    }
    if (cut == NULL) return in_ops(f)->post_recv(f->inner, qp, wr, bad_wr);
    if (last != NULL) {
        last->next = NULL;
        int r = in_ops(f)->post_recv(f->inner, qp, wr, bad_wr);
        last->next = cut;
        if (r != 0) return r;
    }
    count_injected(f, OP(POST_RECV));
    OTE_DEBUG(LOGC, "%s: post_recv accepts only %u WRs, fails with errno %d at wr_id %llu",
              f->name, k, err, (unsigned long long)cut->wr_id);
    if (bad_wr != NULL) *bad_wr = cut;
    return err;
}

static const ote_verbs_ops_t g_fault_ops = {
    .get_device_list = f_get_device_list,
    .free_device_list = f_free_device_list,
    .get_device_name = f_get_device_name,
    .open_device = f_open_device,
    .close_device = f_close_device,
    .query_device = f_query_device,
    .query_port = f_query_port,
    .query_gid = f_query_gid,
    .query_gid_ex = f_query_gid_ex,
    .device_numa_node = f_device_numa_node,
    .get_async_event = f_get_async_event,
    .ack_async_event = f_ack_async_event,
    .alloc_pd = f_alloc_pd,
    .dealloc_pd = f_dealloc_pd,
    .reg_mr = f_reg_mr,
    .reg_dmabuf_mr = f_reg_dmabuf_mr,
    .dereg_mr = f_dereg_mr,
    .alloc_mw = f_alloc_mw,
    .dealloc_mw = f_dealloc_mw,
    .create_comp_channel = f_create_comp_channel,
    .destroy_comp_channel = f_destroy_comp_channel,
    .create_cq = f_create_cq,
    .destroy_cq = f_destroy_cq,
    .req_notify_cq = f_req_notify_cq,
    .get_cq_event = f_get_cq_event,
    .ack_cq_events = f_ack_cq_events,
    .poll_cq = f_poll_cq,
    .create_qp = f_create_qp,
    .modify_qp = f_modify_qp,
    .query_qp = f_query_qp,
    .destroy_qp = f_destroy_qp,
    .post_send = f_post_send,
    .post_recv = f_post_recv,
};

/* ---- lifetime ---- */

static void clear_locked(fault_t *f) {
    memset(f->fail, 0, sizeof(f->fail));
    memset(f->busy, 0, sizeof(f->busy));
    memset(&f->partial_send, 0, sizeof(f->partial_send));
    memset(&f->partial_recv, 0, sizeof(f->partial_recv));
    cqe_rule_t *r, *rtmp;
    DL_FOREACH_SAFE(f->cqe_rules, r, rtmp) {
        DL_DELETE(f->cqe_rules, r);
        ote_free(r);
    }
    ctx_state_t *cs, *cstmp;
    HASH_ITER(hh, f->ctxs, cs, cstmp) {
        ev_node_t *e, *etmp;
        DL_FOREACH_SAFE(cs->queue, e, etmp) {
            DL_DELETE(cs->queue, e);
            ote_free(e);
        }
        efd_drain(cs);
    }
}

static void fault_close(ote_verbs_t *v) {
    fault_t *f = to_fault(v);
    clear_locked(f); /* closing: no other thread may use v any more */
    ctx_state_t *cs, *cstmp;
    HASH_ITER(hh, f->ctxs, cs, cstmp) {
        HASH_DEL(f->ctxs, cs);
        ctx_state_free(cs);
    }
    ev_node_t *e, *etmp;
    DL_FOREACH_SAFE(f->outstanding, e, etmp) {
        DL_DELETE(f->outstanding, e);
        ote_free(e);
    }
    ote_verbs_t *inner = f->inner;
    bool own = (f->flags & OTE_VERBS_FAULT_OWN_INNER) != 0;
    ote_mutex_destroy(&f->mu);
    ote_free(f->name);
    ote_free(f);
    if (own) ote_verbs_close(inner); /* ownership was passed to us at wrap */
}

static bool table_complete(const ote_verbs_ops_t *ops) {
    ote_verbs_ops_t filled = *ops;
    ote_verbs_ops_fill_stubs(&filled);
    return memcmp(&filled, ops, sizeof(filled)) == 0;
}

ote_status_t ote_verbs_fault_wrap(ote_verbs_t *inner, unsigned flags, ote_verbs_t **v_out) {
    if (inner == NULL || inner->ops == NULL || v_out == NULL ||
        (flags & ~OTE_VERBS_FAULT_OWN_INNER) != 0)
        return OTE_ERR_INVALID;
    if (!table_complete(inner->ops)) return OTE_ERR_INVALID;
    ote_status_t st;
    fault_t *f = ote_calloc(1, sizeof(*f));
    if (f == NULL) return OTE_ERR_NOMEM;
    const char *iname = inner->provider != NULL ? inner->provider : "?";
    size_t len = strlen(iname) + sizeof("fault()");
    f->name = ote_malloc(len);
    if (f->name == NULL) {
        st = OTE_ERR_NOMEM;
        goto err_free_f;
    }
    snprintf(f->name, len, "fault(%s)", iname);
    st = ote_mutex_init(&f->mu);
    if (st != OTE_OK) goto err_free_name;
    f->inner = inner;
    f->flags = flags;
    f->v.ops = &g_fault_ops;
    f->v.provider = f->name;
    f->v.priv = f;
    f->v.close = fault_close;
    *v_out = &f->v;
    return OTE_OK;

err_free_name:
    ote_free(f->name);
err_free_f:
    ote_free(f);
    return st;
}

/* ---- rules ---- */

#define GET_FAULT_OR(v, ret)                       \
    do {                                           \
        if (!ote_verbs_fault_is(v)) return (ret);  \
    } while (0)

static bool op_valid(ote_verbs_fault_op_t op) {
    return (int)op >= 0 && op < OTE_VERBS_FAULT_OP_COUNT;
}

ote_status_t ote_verbs_fault_fail(ote_verbs_t *v, ote_verbs_fault_op_t op, ote_fault_mode_t mode,
                                  uint64_t n, int err) {
    GET_FAULT_OR(v, OTE_ERR_INVALID);
    if (!op_valid(op) || !op_can_fail(op) || err <= 0) return OTE_ERR_INVALID;
    if (mode != OTE_FAULT_NTH && mode != OTE_FAULT_EVERY && mode != OTE_FAULT_FROM)
        return OTE_ERR_INVALID;
    if (mode != OTE_FAULT_EVERY && n == 0) return OTE_ERR_INVALID;
    fault_t *f = to_fault(v);
    ote_mutex_lock(&f->mu);
    f->fail[op] = (fail_rule_t){.armed = true, .mode = mode, .n = n, .hits = 0, .err = err};
    ote_mutex_unlock(&f->mu);
    return OTE_OK;
}

ote_status_t ote_verbs_fault_partial_post(ote_verbs_t *v, ote_verbs_fault_op_t op, unsigned k,
                                          int err) {
    GET_FAULT_OR(v, OTE_ERR_INVALID);
    if ((op != OP(POST_SEND) && op != OP(POST_RECV)) || err <= 0) return OTE_ERR_INVALID;
    fault_t *f = to_fault(v);
    ote_mutex_lock(&f->mu);
    partial_rule_t *p = op == OP(POST_SEND) ? &f->partial_send : &f->partial_recv;
    *p = (partial_rule_t){.armed = true, .k = k, .err = err};
    ote_mutex_unlock(&f->mu);
    return OTE_OK;
}

static ote_status_t add_cqe_rule(ote_verbs_t *v, const cqe_rule_t *tmpl) {
    GET_FAULT_OR(v, OTE_ERR_INVALID);
    fault_t *f = to_fault(v);
    cqe_rule_t *r = ote_malloc(sizeof(*r));
    if (r == NULL) return OTE_ERR_NOMEM;
    *r = *tmpl;
    r->seen = 0;
    r->prev = r->next = NULL;
    ote_mutex_lock(&f->mu);
    DL_APPEND(f->cqe_rules, r);
    ote_mutex_unlock(&f->mu);
    return OTE_OK;
}

ote_status_t ote_verbs_fault_lose_cqe_wr_id(ote_verbs_t *v, struct ibv_cq *cq, uint64_t wr_id) {
    cqe_rule_t t = {.cq = cq, .by_wr_id = true, .wr_id = wr_id, .lose = true};
    return add_cqe_rule(v, &t);
}

ote_status_t ote_verbs_fault_lose_cqe_nth(ote_verbs_t *v, struct ibv_cq *cq, uint64_t n) {
    if (n == 0) return OTE_ERR_INVALID;
    cqe_rule_t t = {.cq = cq, .by_wr_id = false, .nth = n, .lose = true};
    return add_cqe_rule(v, &t);
}

ote_status_t ote_verbs_fault_error_cqe_wr_id(ote_verbs_t *v, struct ibv_cq *cq, uint64_t wr_id,
                                             enum ibv_wc_status status, uint32_t vendor_err) {
    cqe_rule_t t = {.cq = cq, .by_wr_id = true, .wr_id = wr_id, .lose = false,
                    .status = status, .vendor_err = vendor_err};
    return add_cqe_rule(v, &t);
}

ote_status_t ote_verbs_fault_error_cqe_nth(ote_verbs_t *v, struct ibv_cq *cq, uint64_t n,
                                           enum ibv_wc_status status, uint32_t vendor_err) {
    if (n == 0) return OTE_ERR_INVALID;
    cqe_rule_t t = {.cq = cq, .by_wr_id = false, .nth = n, .lose = false,
                    .status = status, .vendor_err = vendor_err};
    return add_cqe_rule(v, &t);
}

ote_status_t ote_verbs_fault_destroy_busy(ote_verbs_t *v, ote_verbs_fault_op_t op,
                                          const void *obj, uint64_t times) {
    GET_FAULT_OR(v, OTE_ERR_INVALID);
    if (!ote_verbs_fault_op_is_destroy(op)) return OTE_ERR_INVALID;
    fault_t *f = to_fault(v);
    ote_mutex_lock(&f->mu);
    f->busy[op] = (busy_rule_t){.armed = times > 0, .obj = obj, .left = times};
    ote_mutex_unlock(&f->mu);
    return OTE_OK;
}

ote_status_t ote_verbs_fault_inject_async_event(ote_verbs_t *v, struct ibv_context *ctx,
                                                const struct ibv_async_event *ev) {
    GET_FAULT_OR(v, OTE_ERR_INVALID);
    if (ctx == NULL || ev == NULL) return OTE_ERR_INVALID;
    fault_t *f = to_fault(v);
    ev_node_t *e = ote_calloc(1, sizeof(*e));
    if (e == NULL) return OTE_ERR_NOMEM;
    e->ev = *ev;
    ote_mutex_lock(&f->mu);
    ctx_state_t *cs = NULL;
    ote_status_t st = ctx_state_get(f, ctx, &cs);
    if (st == OTE_OK) {
        DL_APPEND(cs->queue, e);
        efd_signal(cs);
    }
    ote_mutex_unlock(&f->mu);
    if (st != OTE_OK) {
        ote_free(e);
        return st;
    }
    OTE_DEBUG(LOGC, "%s: queued injected async event %s", f->name,
              ibv_event_type_str(ev->event_type));
    return OTE_OK;
}

ote_status_t ote_verbs_fault_async_fd(ote_verbs_t *v, struct ibv_context *ctx, int *fd_out) {
    GET_FAULT_OR(v, OTE_ERR_INVALID);
    if (ctx == NULL || fd_out == NULL) return OTE_ERR_INVALID;
    fault_t *f = to_fault(v);
    ote_mutex_lock(&f->mu);
    ctx_state_t *cs = NULL;
    ote_status_t st = ctx_state_get(f, ctx, &cs);
    if (st == OTE_OK) *fd_out = cs->epfd;
    ote_mutex_unlock(&f->mu);
    return st;
}

uint64_t ote_verbs_fault_calls(ote_verbs_t *v, ote_verbs_fault_op_t op) {
    GET_FAULT_OR(v, 0);
    if (!op_valid(op)) return 0;
    fault_t *f = to_fault(v);
    ote_mutex_lock(&f->mu);
    uint64_t n = f->calls[op];
    ote_mutex_unlock(&f->mu);
    return n;
}

uint64_t ote_verbs_fault_injected(ote_verbs_t *v, ote_verbs_fault_op_t op) {
    GET_FAULT_OR(v, 0);
    if (!op_valid(op)) return 0;
    fault_t *f = to_fault(v);
    ote_mutex_lock(&f->mu);
    uint64_t n = f->injected[op];
    ote_mutex_unlock(&f->mu);
    return n;
}

void ote_verbs_fault_clear(ote_verbs_t *v) {
    if (!ote_verbs_fault_is(v)) return;
    fault_t *f = to_fault(v);
    ote_mutex_lock(&f->mu);
    clear_locked(f);
    ote_mutex_unlock(&f->mu);
}

void ote_verbs_fault_reset_counters(ote_verbs_t *v) {
    if (!ote_verbs_fault_is(v)) return;
    fault_t *f = to_fault(v);
    ote_mutex_lock(&f->mu);
    memset(f->calls, 0, sizeof(f->calls));
    memset(f->injected, 0, sizeof(f->injected));
    ote_mutex_unlock(&f->mu);
}

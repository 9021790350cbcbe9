/*
 * verbs/fault_ops.c - the decorated ops of the fault decorator: each counts and checks
 * its rules (ote__verbs_fault_enter), then forwards to the inner provider; poll_cq applies
 * the CQE rules, the posts the partial-post rules, get/ack_async_event the injected events.
 */
#include <errno.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "verbs/fault_internal.h"

static int f_get_device_list(ote_verbs_t *v, struct ibv_device ***list_out, int *num_out) {
    fault_t *f = to_fault(v);
    int err = ote__verbs_fault_enter(f, OP(GET_DEVICE_LIST), NULL);
    if (err != 0) return err;
    return in_ops(f)->get_device_list(f->inner, list_out, num_out);
}

static void f_free_device_list(ote_verbs_t *v, struct ibv_device **list) {
    fault_t *f = to_fault(v);
    ote__verbs_fault_count_only(f, OP(FREE_DEVICE_LIST));
    in_ops(f)->free_device_list(f->inner, list);
}

static const char *f_get_device_name(ote_verbs_t *v, struct ibv_device *dev) {
    fault_t *f = to_fault(v);
    ote__verbs_fault_count_only(f, OP(GET_DEVICE_NAME));
    return in_ops(f)->get_device_name(f->inner, dev);
}

static int f_open_device(ote_verbs_t *v, struct ibv_device *dev, struct ibv_context **ctx_out) {
    fault_t *f = to_fault(v);
    int err = ote__verbs_fault_enter(f, OP(OPEN_DEVICE), NULL);
    if (err != 0) return err;
    return in_ops(f)->open_device(f->inner, dev, ctx_out);
}

static int f_close_device(ote_verbs_t *v, struct ibv_context *ctx) {
    fault_t *f = to_fault(v);
    int err = ote__verbs_fault_enter(f, OP(CLOSE_DEVICE), ctx);
    if (err != 0) return err;
    err = in_ops(f)->close_device(f->inner, ctx);
    if (err == 0)
        ote__verbs_fault_ctx_drop(f, ctx); /* a failed close keeps the context, and its state */
    return err;
}

static int f_query_device(ote_verbs_t *v, struct ibv_context *ctx, struct ibv_device_attr *attr) {
    fault_t *f = to_fault(v);
    int err = ote__verbs_fault_enter(f, OP(QUERY_DEVICE), NULL);
    if (err != 0) return err;
    return in_ops(f)->query_device(f->inner, ctx, attr);
}

static int f_query_port(ote_verbs_t *v, struct ibv_context *ctx, uint8_t port,
                        struct ibv_port_attr *attr) {
    fault_t *f = to_fault(v);
    int err = ote__verbs_fault_enter(f, OP(QUERY_PORT), NULL);
    if (err != 0) return err;
    return in_ops(f)->query_port(f->inner, ctx, port, attr);
}

static int f_query_gid(ote_verbs_t *v, struct ibv_context *ctx, uint8_t port, int index,
                       union ibv_gid *gid) {
    fault_t *f = to_fault(v);
    int err = ote__verbs_fault_enter(f, OP(QUERY_GID), NULL);
    if (err != 0) return err;
    return in_ops(f)->query_gid(f->inner, ctx, port, index, gid);
}

static int f_query_gid_ex(ote_verbs_t *v, struct ibv_context *ctx, uint32_t port, uint32_t index,
                          struct ibv_gid_entry *entry) {
    fault_t *f = to_fault(v);
    int err = ote__verbs_fault_enter(f, OP(QUERY_GID_EX), NULL);
    if (err != 0) return err;
    return in_ops(f)->query_gid_ex(f->inner, ctx, port, index, entry);
}

static int f_device_numa_node(ote_verbs_t *v, struct ibv_context *ctx, int *node_out) {
    fault_t *f = to_fault(v);
    int err = ote__verbs_fault_enter(f, OP(DEVICE_NUMA_NODE), NULL);
    if (err != 0) return err;
    return in_ops(f)->device_numa_node(f->inner, ctx, node_out);
}

static int f_get_async_event(ote_verbs_t *v, struct ibv_context *ctx, struct ibv_async_event *ev) {
    fault_t *f = to_fault(v);
    int err = ote__verbs_fault_enter(f, OP(GET_ASYNC_EVENT), NULL);
    if (err != 0) return err;
    if (ev == NULL) return EINVAL;
    ev_node_t *e = NULL;
    ote_mutex_lock(&f->mu);
    ctx_state_t *cs = NULL;
    HASH_FIND_PTR(f->ctxs, &ctx, cs);
    if (cs != NULL && cs->queue != NULL) {
        e = cs->queue;
        DL_DELETE(cs->queue, e);
        if (cs->queue == NULL) ote__verbs_fault_efd_drain(cs);
        DL_APPEND(f->outstanding, e); /* until acked */
        *ev = e->ev;
        f->injected[OP(GET_ASYNC_EVENT)]++;
    }
    ote_mutex_unlock(&f->mu);
    if (e != NULL) {
        OTE_DEBUG(LOGC, "%s: get_async_event returns injected event %s", f->name,
                  ote_verbs_event_name(e->ev.event_type));
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
            if (ote__verbs_fault_event_matches(&e->ev, ev)) break;
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
    int err = ote__verbs_fault_enter(f, OP(ALLOC_PD), NULL);
    if (err != 0) return err;
    return in_ops(f)->alloc_pd(f->inner, ctx, pd_out);
}

static int f_dealloc_pd(ote_verbs_t *v, struct ibv_pd *pd) {
    fault_t *f = to_fault(v);
    int err = ote__verbs_fault_enter(f, OP(DEALLOC_PD), pd);
    if (err != 0) return err;
    return in_ops(f)->dealloc_pd(f->inner, pd);
}

static int f_reg_mr(ote_verbs_t *v, struct ibv_pd *pd, void *addr, size_t length, int access,
                    struct ibv_mr **mr_out) {
    fault_t *f = to_fault(v);
    int err = ote__verbs_fault_enter(f, OP(REG_MR), NULL);
    if (err != 0) return err;
    return in_ops(f)->reg_mr(f->inner, pd, addr, length, access, mr_out);
}

static int f_reg_dmabuf_mr(ote_verbs_t *v, struct ibv_pd *pd, uint64_t offset, size_t length,
                           uint64_t iova, int fd, int access, struct ibv_mr **mr_out) {
    fault_t *f = to_fault(v);
    int err = ote__verbs_fault_enter(f, OP(REG_DMABUF_MR), NULL);
    if (err != 0) return err;
    return in_ops(f)->reg_dmabuf_mr(f->inner, pd, offset, length, iova, fd, access, mr_out);
}

static int f_dereg_mr(ote_verbs_t *v, struct ibv_mr *mr) {
    fault_t *f = to_fault(v);
    int err = ote__verbs_fault_enter(f, OP(DEREG_MR), mr);
    if (err != 0) return err;
    return in_ops(f)->dereg_mr(f->inner, mr);
}

static int f_alloc_mw(ote_verbs_t *v, struct ibv_pd *pd, enum ibv_mw_type type,
                      struct ibv_mw **mw_out) {
    fault_t *f = to_fault(v);
    int err = ote__verbs_fault_enter(f, OP(ALLOC_MW), NULL);
    if (err != 0) return err;
    return in_ops(f)->alloc_mw(f->inner, pd, type, mw_out);
}

static int f_dealloc_mw(ote_verbs_t *v, struct ibv_mw *mw) {
    fault_t *f = to_fault(v);
    int err = ote__verbs_fault_enter(f, OP(DEALLOC_MW), mw);
    if (err != 0) return err;
    return in_ops(f)->dealloc_mw(f->inner, mw);
}

static int f_create_comp_channel(ote_verbs_t *v, struct ibv_context *ctx,
                                 struct ibv_comp_channel **ch_out) {
    fault_t *f = to_fault(v);
    int err = ote__verbs_fault_enter(f, OP(CREATE_COMP_CHANNEL), NULL);
    if (err != 0) return err;
    return in_ops(f)->create_comp_channel(f->inner, ctx, ch_out);
}

static int f_destroy_comp_channel(ote_verbs_t *v, struct ibv_comp_channel *ch) {
    fault_t *f = to_fault(v);
    int err = ote__verbs_fault_enter(f, OP(DESTROY_COMP_CHANNEL), ch);
    if (err != 0) return err;
    return in_ops(f)->destroy_comp_channel(f->inner, ch);
}

static int f_create_cq(ote_verbs_t *v, struct ibv_context *ctx, int cqe, void *cq_context,
                       struct ibv_comp_channel *ch, int comp_vector, struct ibv_cq **cq_out) {
    fault_t *f = to_fault(v);
    int err = ote__verbs_fault_enter(f, OP(CREATE_CQ), NULL);
    if (err != 0) return err;
    return in_ops(f)->create_cq(f->inner, ctx, cqe, cq_context, ch, comp_vector, cq_out);
}

static int f_destroy_cq(ote_verbs_t *v, struct ibv_cq *cq) {
    fault_t *f = to_fault(v);
    int err = ote__verbs_fault_enter(f, OP(DESTROY_CQ), cq);
    if (err != 0) return err;
    return in_ops(f)->destroy_cq(f->inner, cq);
}

static int f_req_notify_cq(ote_verbs_t *v, struct ibv_cq *cq, int solicited_only) {
    fault_t *f = to_fault(v);
    int err = ote__verbs_fault_enter(f, OP(REQ_NOTIFY_CQ), NULL);
    if (err != 0) return err;
    return in_ops(f)->req_notify_cq(f->inner, cq, solicited_only);
}

static int f_get_cq_event(ote_verbs_t *v, struct ibv_comp_channel *ch, struct ibv_cq **cq_out,
                          void **cq_context_out) {
    fault_t *f = to_fault(v);
    int err = ote__verbs_fault_enter(f, OP(GET_CQ_EVENT), NULL);
    if (err != 0) return err;
    return in_ops(f)->get_cq_event(f->inner, ch, cq_out, cq_context_out);
}

static void f_ack_cq_events(ote_verbs_t *v, struct ibv_cq *cq, unsigned int nevents) {
    fault_t *f = to_fault(v);
    ote__verbs_fault_count_only(f, OP(ACK_CQ_EVENTS));
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
    int err = ote__verbs_fault_enter(f, OP(POLL_CQ), NULL);
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
    int err = ote__verbs_fault_enter(f, OP(CREATE_QP), NULL);
    if (err != 0) return err;
    return in_ops(f)->create_qp(f->inner, pd, init_attr, qp_out);
}

static int f_modify_qp(ote_verbs_t *v, struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask) {
    fault_t *f = to_fault(v);
    int err = ote__verbs_fault_enter(f, OP(MODIFY_QP), NULL);
    if (err != 0) return err;
    return in_ops(f)->modify_qp(f->inner, qp, attr, attr_mask);
}

static int f_query_qp(ote_verbs_t *v, struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask,
                      struct ibv_qp_init_attr *init_attr) {
    fault_t *f = to_fault(v);
    int err = ote__verbs_fault_enter(f, OP(QUERY_QP), NULL);
    if (err != 0) return err;
    return in_ops(f)->query_qp(f->inner, qp, attr, attr_mask, init_attr);
}

static int f_destroy_qp(ote_verbs_t *v, struct ibv_qp *qp) {
    fault_t *f = to_fault(v);
    int err = ote__verbs_fault_enter(f, OP(DESTROY_QP), qp);
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
    int err = ote__verbs_fault_enter(f, OP(POST_SEND), NULL);
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
    OTE_DEBUG(LOGC, "%s: post_send accepts only %u WRs, fails with errno %d at wr_id %llu", f->name,
              k, err, (unsigned long long)cut->wr_id);
    if (bad_wr != NULL) *bad_wr = cut;
    return err;
}

static int f_post_recv(ote_verbs_t *v, struct ibv_qp *qp, struct ibv_recv_wr *wr,
                       struct ibv_recv_wr **bad_wr) {
    fault_t *f = to_fault(v);
    int err = ote__verbs_fault_enter(f, OP(POST_RECV), NULL);
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
    OTE_DEBUG(LOGC, "%s: post_recv accepts only %u WRs, fails with errno %d at wr_id %llu", f->name,
              k, err, (unsigned long long)cut->wr_id);
    if (bad_wr != NULL) *bad_wr = cut;
    return err;
}

/* ---- the extended device query, shared receive queues, QP create flags ---- */

static int f_query_device_ex(ote_verbs_t *v, struct ibv_context *ctx,
                             struct ibv_device_attr_ex *attr) {
    fault_t *f = to_fault(v);
    int err = ote__verbs_fault_enter(f, OP(QUERY_DEVICE_EX), NULL);
    if (err != 0) return err;
    return in_ops(f)->query_device_ex(f->inner, ctx, attr);
}

static int f_create_srq(ote_verbs_t *v, struct ibv_pd *pd, struct ibv_srq_init_attr *init_attr,
                        struct ibv_srq **srq_out) {
    fault_t *f = to_fault(v);
    int err = ote__verbs_fault_enter(f, OP(CREATE_SRQ), NULL);
    if (err != 0) return err;
    return in_ops(f)->create_srq(f->inner, pd, init_attr, srq_out);
}

static int f_modify_srq(ote_verbs_t *v, struct ibv_srq *srq, struct ibv_srq_attr *attr,
                        int attr_mask) {
    fault_t *f = to_fault(v);
    int err = ote__verbs_fault_enter(f, OP(MODIFY_SRQ), NULL);
    if (err != 0) return err;
    return in_ops(f)->modify_srq(f->inner, srq, attr, attr_mask);
}

static int f_query_srq(ote_verbs_t *v, struct ibv_srq *srq, struct ibv_srq_attr *attr) {
    fault_t *f = to_fault(v);
    int err = ote__verbs_fault_enter(f, OP(QUERY_SRQ), NULL);
    if (err != 0) return err;
    return in_ops(f)->query_srq(f->inner, srq, attr);
}

static int f_destroy_srq(ote_verbs_t *v, struct ibv_srq *srq) {
    fault_t *f = to_fault(v);
    int err = ote__verbs_fault_enter(f, OP(DESTROY_SRQ), srq);
    if (err != 0) return err;
    return in_ops(f)->destroy_srq(f->inner, srq);
}

/* No partial-post rule for SRQ receives: a fail rule fails the whole list (nothing posted). */
static int f_post_srq_recv(ote_verbs_t *v, struct ibv_srq *srq, struct ibv_recv_wr *wr,
                           struct ibv_recv_wr **bad_wr) {
    fault_t *f = to_fault(v);
    int err = ote__verbs_fault_enter(f, OP(POST_SRQ_RECV), NULL);
    if (err != 0) {
        if (bad_wr != NULL) *bad_wr = wr;
        return err;
    }
    return in_ops(f)->post_srq_recv(f->inner, srq, wr, bad_wr);
}

static int f_create_qp_flags(ote_verbs_t *v, struct ibv_pd *pd, struct ibv_qp_init_attr *init_attr,
                             uint32_t flags, struct ibv_qp **qp_out) {
    fault_t *f = to_fault(v);
    int err = ote__verbs_fault_enter(f, OP(CREATE_QP_FLAGS), NULL);
    if (err != 0) return err;
    return in_ops(f)->create_qp_flags(f->inner, pd, init_attr, flags, qp_out);
}

static int f_qp_flags(ote_verbs_t *v, struct ibv_qp *qp, uint32_t *flags_out) {
    fault_t *f = to_fault(v);
    int err = ote__verbs_fault_enter(f, OP(QP_FLAGS), NULL);
    if (err != 0) return err;
    return in_ops(f)->qp_flags(f->inner, qp, flags_out);
}

static int f_device_flags(ote_verbs_t *v, struct ibv_context *ctx, uint32_t *flags_out) {
    fault_t *f = to_fault(v);
    int err = ote__verbs_fault_enter(f, OP(DEVICE_FLAGS), NULL);
    if (err != 0) return err;
    return in_ops(f)->device_flags(f->inner, ctx, flags_out);
}

const ote_verbs_ops_t ote__verbs_fault_ops = {
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
    .query_device_ex = f_query_device_ex,
    .create_srq = f_create_srq,
    .modify_srq = f_modify_srq,
    .query_srq = f_query_srq,
    .destroy_srq = f_destroy_srq,
    .post_srq_recv = f_post_srq_recv,
    .create_qp_flags = f_create_qp_flags,
    .qp_flags = f_qp_flags,
    .device_flags = f_device_flags,
};

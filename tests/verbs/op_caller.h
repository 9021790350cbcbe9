// tests/verbs/op_caller.h - call any op of an ote_verbs_ops_t by its fault-op number.
//
// Table-driven tests (every stub fails with EOPNOTSUPP, every op can be failed by the
// fault decorator) call each op through CallOp() with placeholder objects, and check
// that an op's object output stayed untouched when it failed.
#ifndef OTE_TESTS_VERBS_OP_CALLER_H
#define OTE_TESTS_VERBS_OP_CALLER_H

#include <cstring>

extern "C" {
#include "verbs/fault.h"
#include "verbs/verbs.h"
}

namespace ote_test {

struct OpArgs {
    struct ibv_device *dev = nullptr;
    struct ibv_context *ctx = nullptr;
    struct ibv_pd *pd = nullptr;
    struct ibv_mr *mr = nullptr;
    struct ibv_mw *mw = nullptr;
    struct ibv_comp_channel *ch = nullptr;
    struct ibv_cq *cq = nullptr;
    struct ibv_qp *qp = nullptr;
    struct ibv_srq *srq = nullptr;
};

struct OpResult {
    int ret = 0;                  // the op's return value (void ops: 0)
    bool output_untouched = true; // the op's object/list output kept its sentinel
    bool bad_wr_is_first = false; // post ops: *bad_wr named the first (only) WR
};

// Calls `op` once. poll_cq is called for 4 entries.
inline OpResult CallOp(ote_verbs_t *v, ote_verbs_fault_op_t op, const OpArgs &a) {
    static char sentinel_storage;
    void *const kSentinel = &sentinel_storage;
    OpResult r;
    const ote_verbs_ops_t *o = v->ops;
    switch (op) {
        case OTE_VERBS_FAULT_OP_GET_DEVICE_LIST: {
            auto list = static_cast<struct ibv_device **>(kSentinel);
            int num = -7;
            r.ret = o->get_device_list(v, &list, &num);
            r.output_untouched = list == kSentinel && num == -7;
            if (r.ret == 0) o->free_device_list(v, list);
            break;
        }
        case OTE_VERBS_FAULT_OP_FREE_DEVICE_LIST: o->free_device_list(v, nullptr); break;
        case OTE_VERBS_FAULT_OP_GET_DEVICE_NAME: (void)o->get_device_name(v, a.dev); break;
        case OTE_VERBS_FAULT_OP_OPEN_DEVICE: {
            auto ctx = static_cast<struct ibv_context *>(kSentinel);
            r.ret = o->open_device(v, a.dev, &ctx);
            r.output_untouched = ctx == kSentinel;
            break;
        }
        case OTE_VERBS_FAULT_OP_CLOSE_DEVICE: r.ret = o->close_device(v, a.ctx); break;
        case OTE_VERBS_FAULT_OP_QUERY_DEVICE: {
            struct ibv_device_attr attr;
            r.ret = o->query_device(v, a.ctx, &attr);
            break;
        }
        case OTE_VERBS_FAULT_OP_QUERY_PORT: {
            struct ibv_port_attr attr;
            r.ret = o->query_port(v, a.ctx, 1, &attr);
            break;
        }
        case OTE_VERBS_FAULT_OP_QUERY_GID: {
            union ibv_gid gid;
            r.ret = o->query_gid(v, a.ctx, 1, 0, &gid);
            break;
        }
        case OTE_VERBS_FAULT_OP_QUERY_GID_EX: {
            struct ibv_gid_entry e;
            r.ret = o->query_gid_ex(v, a.ctx, 1, 0, &e);
            break;
        }
        case OTE_VERBS_FAULT_OP_DEVICE_NUMA_NODE: {
            int node = -77;
            r.ret = o->device_numa_node(v, a.ctx, &node);
            r.output_untouched = node == -77;
            break;
        }
        case OTE_VERBS_FAULT_OP_GET_ASYNC_EVENT: {
            struct ibv_async_event ev;
            std::memset(&ev, 0, sizeof(ev));
            r.ret = o->get_async_event(v, a.ctx, &ev);
            if (r.ret == 0) o->ack_async_event(v, &ev);
            break;
        }
        case OTE_VERBS_FAULT_OP_ACK_ASYNC_EVENT: {
            struct ibv_async_event ev;
            std::memset(&ev, 0, sizeof(ev));
            ev.event_type = IBV_EVENT_SM_CHANGE;
            ev.element.port_num = 1;
            o->ack_async_event(v, &ev);
            break;
        }
        case OTE_VERBS_FAULT_OP_ALLOC_PD: {
            auto pd = static_cast<struct ibv_pd *>(kSentinel);
            r.ret = o->alloc_pd(v, a.ctx, &pd);
            r.output_untouched = pd == kSentinel;
            break;
        }
        case OTE_VERBS_FAULT_OP_DEALLOC_PD: r.ret = o->dealloc_pd(v, a.pd); break;
        case OTE_VERBS_FAULT_OP_REG_MR: {
            static char buf[64];
            auto mr = static_cast<struct ibv_mr *>(kSentinel);
            r.ret = o->reg_mr(v, a.pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE, &mr);
            r.output_untouched = mr == kSentinel;
            break;
        }
        case OTE_VERBS_FAULT_OP_REG_DMABUF_MR: {
            // fd -1: a provider that gets this far fails it (EBADF) and creates nothing
            auto mr = static_cast<struct ibv_mr *>(kSentinel);
            r.ret = o->reg_dmabuf_mr(v, a.pd, 0, 4096, 0, -1, IBV_ACCESS_LOCAL_WRITE, &mr);
            r.output_untouched = mr == kSentinel;
            break;
        }
        case OTE_VERBS_FAULT_OP_DEREG_MR: r.ret = o->dereg_mr(v, a.mr); break;
        case OTE_VERBS_FAULT_OP_ALLOC_MW: {
            auto mw = static_cast<struct ibv_mw *>(kSentinel);
            r.ret = o->alloc_mw(v, a.pd, IBV_MW_TYPE_2, &mw);
            r.output_untouched = mw == kSentinel;
            break;
        }
        case OTE_VERBS_FAULT_OP_DEALLOC_MW: r.ret = o->dealloc_mw(v, a.mw); break;
        case OTE_VERBS_FAULT_OP_CREATE_COMP_CHANNEL: {
            auto ch = static_cast<struct ibv_comp_channel *>(kSentinel);
            r.ret = o->create_comp_channel(v, a.ctx, &ch);
            r.output_untouched = ch == kSentinel;
            break;
        }
        case OTE_VERBS_FAULT_OP_DESTROY_COMP_CHANNEL:
            r.ret = o->destroy_comp_channel(v, a.ch);
            break;
        case OTE_VERBS_FAULT_OP_CREATE_CQ: {
            auto cq = static_cast<struct ibv_cq *>(kSentinel);
            r.ret = o->create_cq(v, a.ctx, 16, nullptr, nullptr, 0, &cq);
            r.output_untouched = cq == kSentinel;
            break;
        }
        case OTE_VERBS_FAULT_OP_DESTROY_CQ: r.ret = o->destroy_cq(v, a.cq); break;
        case OTE_VERBS_FAULT_OP_REQ_NOTIFY_CQ: r.ret = o->req_notify_cq(v, a.cq, 0); break;
        case OTE_VERBS_FAULT_OP_GET_CQ_EVENT: {
            auto cq = static_cast<struct ibv_cq *>(kSentinel);
            void *cq_ctx = kSentinel;
            r.ret = o->get_cq_event(v, a.ch, &cq, &cq_ctx);
            r.output_untouched = cq == kSentinel && cq_ctx == kSentinel;
            break;
        }
        case OTE_VERBS_FAULT_OP_ACK_CQ_EVENTS: o->ack_cq_events(v, a.cq, 0); break;
        case OTE_VERBS_FAULT_OP_POLL_CQ: {
            struct ibv_wc wc[4];
            r.ret = o->poll_cq(v, a.cq, 4, wc);
            break;
        }
        case OTE_VERBS_FAULT_OP_CREATE_QP: {
            struct ibv_qp_init_attr init;
            std::memset(&init, 0, sizeof(init));
            init.send_cq = a.cq;
            init.recv_cq = a.cq;
            init.qp_type = IBV_QPT_RC;
            init.cap.max_send_wr = 4;
            init.cap.max_recv_wr = 4;
            init.cap.max_send_sge = 1;
            init.cap.max_recv_sge = 1;
            auto qp = static_cast<struct ibv_qp *>(kSentinel);
            r.ret = o->create_qp(v, a.pd, &init, &qp);
            r.output_untouched = qp == kSentinel;
            break;
        }
        case OTE_VERBS_FAULT_OP_MODIFY_QP: {
            struct ibv_qp_attr attr;
            std::memset(&attr, 0, sizeof(attr));
            attr.qp_state = IBV_QPS_ERR;
            r.ret = o->modify_qp(v, a.qp, &attr, IBV_QP_STATE);
            break;
        }
        case OTE_VERBS_FAULT_OP_QUERY_QP: {
            struct ibv_qp_attr attr;
            struct ibv_qp_init_attr init;
            r.ret = o->query_qp(v, a.qp, &attr, IBV_QP_STATE, &init);
            break;
        }
        case OTE_VERBS_FAULT_OP_DESTROY_QP: r.ret = o->destroy_qp(v, a.qp); break;
        case OTE_VERBS_FAULT_OP_POST_SEND: {
            struct ibv_send_wr wr;
            std::memset(&wr, 0, sizeof(wr));
            wr.wr_id = 1;
            wr.opcode = IBV_WR_RDMA_WRITE;
            struct ibv_send_wr *bad = nullptr;
            r.ret = o->post_send(v, a.qp, &wr, &bad);
            r.bad_wr_is_first = bad == &wr;
            break;
        }
        case OTE_VERBS_FAULT_OP_POST_RECV: {
            struct ibv_recv_wr wr;
            std::memset(&wr, 0, sizeof(wr));
            wr.wr_id = 1;
            struct ibv_recv_wr *bad = nullptr;
            r.ret = o->post_recv(v, a.qp, &wr, &bad);
            r.bad_wr_is_first = bad == &wr;
            break;
        }
        case OTE_VERBS_FAULT_OP_QUERY_DEVICE_EX: {
            struct ibv_device_attr_ex attr;
            std::memset(&attr, 0, sizeof(attr));
            r.ret = o->query_device_ex(v, a.ctx, &attr);
            break;
        }
        case OTE_VERBS_FAULT_OP_CREATE_SRQ: {
            struct ibv_srq_init_attr init;
            std::memset(&init, 0, sizeof(init));
            init.attr.max_wr = 4;
            init.attr.max_sge = 1;
            auto srq = static_cast<struct ibv_srq *>(kSentinel);
            r.ret = o->create_srq(v, a.pd, &init, &srq);
            r.output_untouched = srq == kSentinel;
            break;
        }
        case OTE_VERBS_FAULT_OP_MODIFY_SRQ: {
            struct ibv_srq_attr attr;
            std::memset(&attr, 0, sizeof(attr));
            attr.srq_limit = 1;
            r.ret = o->modify_srq(v, a.srq, &attr, IBV_SRQ_LIMIT);
            break;
        }
        case OTE_VERBS_FAULT_OP_QUERY_SRQ: {
            struct ibv_srq_attr attr;
            r.ret = o->query_srq(v, a.srq, &attr);
            break;
        }
        case OTE_VERBS_FAULT_OP_DESTROY_SRQ: r.ret = o->destroy_srq(v, a.srq); break;
        case OTE_VERBS_FAULT_OP_POST_SRQ_RECV: {
            struct ibv_recv_wr wr;
            std::memset(&wr, 0, sizeof(wr));
            wr.wr_id = 1;
            struct ibv_recv_wr *bad = nullptr;
            r.ret = o->post_srq_recv(v, a.srq, &wr, &bad);
            r.bad_wr_is_first = bad == &wr;
            break;
        }
        case OTE_VERBS_FAULT_OP_CREATE_QP_FLAGS: {
            struct ibv_qp_init_attr init;
            std::memset(&init, 0, sizeof(init));
            init.send_cq = a.cq;
            init.recv_cq = a.cq;
            init.qp_type = IBV_QPT_RC;
            init.cap.max_send_wr = 4;
            init.cap.max_recv_wr = 4;
            init.cap.max_send_sge = 1;
            init.cap.max_recv_sge = 1;
            auto qp = static_cast<struct ibv_qp *>(kSentinel);
            r.ret = o->create_qp_flags(v, a.pd, &init, OTE_VERBS_QP_NO_SCATTER_TO_CQE, &qp);
            r.output_untouched = qp == kSentinel;
            break;
        }
        case OTE_VERBS_FAULT_OP_QP_FLAGS: {
            uint32_t flags = 0xdeadu;
            r.ret = o->qp_flags(v, a.qp, &flags);
            r.output_untouched = flags == 0xdeadu;
            break;
        }
        case OTE_VERBS_FAULT_OP_DEVICE_FLAGS: {
            uint32_t flags = 0xdeadu;
            r.ret = o->device_flags(v, a.ctx, &flags);
            r.output_untouched = flags == 0xdeadu;
            break;
        }
        case OTE_VERBS_FAULT_OP_COUNT: break;
    }
    return r;
}

// Ops whose signature returns a result (the others are void or return a name).
inline bool OpReturnsStatus(ote_verbs_fault_op_t op) {
    return op != OTE_VERBS_FAULT_OP_FREE_DEVICE_LIST && op != OTE_VERBS_FAULT_OP_GET_DEVICE_NAME &&
           op != OTE_VERBS_FAULT_OP_ACK_ASYNC_EVENT && op != OTE_VERBS_FAULT_OP_ACK_CQ_EVENTS;
}

} // namespace ote_test

#endif

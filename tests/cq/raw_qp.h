// tests/cq/raw_qp.h - a raw RC QP on a lane's CQs, moved to ERR so that every WR posted
// on it completes at once with IBV_WC_WR_FLUSH_ERR: a CQE source for cq tests that uses
// no layer above cq.
#ifndef OTE_TESTS_CQ_RAW_QP_H
#define OTE_TESTS_CQ_RAW_QP_H

#include <cstring>
#include <vector>

extern "C" {
#include "context/context.h"
#include "cq/lane.h"
#include "verbs/verbs.h"
}

namespace ote_test {

class RawQp {
  public:
    // Returns 0 or the errno of the failing verb.
    int Create(ote_cq_lane_t *lane) {
        ctx_ = ote_cq_lane_context(lane);
        v_ = ote_context_verbs(ctx_);
        ibv_qp_init_attr ia;
        memset(&ia, 0, sizeof(ia));
        ia.send_cq = ote_cq_lane_native_cq(lane, OTE_CQ_SEND);
        ia.recv_cq = ote_cq_lane_native_cq(lane, OTE_CQ_RECV);
        ia.qp_type = IBV_QPT_RC;
        ia.sq_sig_all = 1;
        ia.cap.max_send_wr = 64;
        ia.cap.max_recv_wr = 64;
        ia.cap.max_send_sge = 1;
        ia.cap.max_recv_sge = 1;
        int err = v_->ops->create_qp(v_, ote_context_pd(ctx_), &ia, &qp_);
        if (err != 0) return err;
        ibv_qp_attr a;
        memset(&a, 0, sizeof(a));
        a.qp_state = IBV_QPS_INIT;
        a.port_num = 1;
        err = v_->ops->modify_qp(
            v_, qp_, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
        if (err != 0) return err;
        memset(&a, 0, sizeof(a));
        a.qp_state = IBV_QPS_ERR;
        return v_->ops->modify_qp(v_, qp_, &a, IBV_QP_STATE);
    }
    int Destroy() {
        if (qp_ == nullptr) return 0;
        int err = v_->ops->destroy_qp(v_, qp_);
        if (err == 0) qp_ = nullptr;
        return err;
    }
    ~RawQp() { Destroy(); }
    uint32_t Num() const { return qp_->qp_num; }
    // Post zero-length SENDs with these WR ids (each flushes).
    int PostSends(const std::vector<uint64_t> &ids) {
        std::vector<ibv_send_wr> wrs(ids.size());
        memset(wrs.data(), 0, wrs.size() * sizeof(wrs[0]));
        for (size_t i = 0; i < ids.size(); i++) {
            wrs[i].wr_id = ids[i];
            wrs[i].opcode = IBV_WR_SEND;
            wrs[i].next = i + 1 < ids.size() ? &wrs[i + 1] : nullptr;
        }
        ibv_send_wr *bad = nullptr;
        return v_->ops->post_send(v_, qp_, wrs.data(), &bad);
    }
    int PostRecvs(const std::vector<uint64_t> &ids) {
        std::vector<ibv_recv_wr> wrs(ids.size());
        memset(wrs.data(), 0, wrs.size() * sizeof(wrs[0]));
        for (size_t i = 0; i < ids.size(); i++) {
            wrs[i].wr_id = ids[i];
            wrs[i].next = i + 1 < ids.size() ? &wrs[i + 1] : nullptr;
        }
        ibv_recv_wr *bad = nullptr;
        return v_->ops->post_recv(v_, qp_, wrs.data(), &bad);
    }

  private:
    ote_context_t *ctx_ = nullptr;
    ote_verbs_t *v_ = nullptr;
    ibv_qp *qp_ = nullptr;
};

} // namespace ote_test

#endif

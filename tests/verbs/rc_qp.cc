#include "tests/verbs/rc_qp.h"

#include <cstring>

extern "C" {
#include "base/time.h"
}

namespace ote_test {

int CreateRcQp(ote_verbs_t *v, struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq,
               const RcQpCaps &caps, struct ibv_qp **qp, struct ibv_qp_cap *caps_out) {
    struct ibv_qp_init_attr ia;
    memset(&ia, 0, sizeof(ia));
    ia.send_cq = scq;
    ia.recv_cq = rcq;
    ia.qp_type = IBV_QPT_RC;
    ia.sq_sig_all = caps.sq_sig_all;
    ia.cap.max_send_wr = caps.max_send_wr;
    ia.cap.max_recv_wr = caps.max_recv_wr;
    ia.cap.max_send_sge = caps.max_sge;
    ia.cap.max_recv_sge = caps.max_sge;
    ia.cap.max_inline_data = caps.max_inline_data;
    int err = v->ops->create_qp(v, pd, &ia, qp);
    if (caps_out) *caps_out = ia.cap;
    return err;
}

int QpToInit(ote_verbs_t *v, struct ibv_qp *qp, int access) {
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = 1;
    a.qp_access_flags = (unsigned)access;
    return v->ops->modify_qp(v, qp, &a,
                             IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

int QpToRtr(ote_verbs_t *v, struct ibv_qp *qp, const QpPath &path) {
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = path.mtu;
    a.dest_qp_num = path.dest_qpn;
    a.rq_psn = path.rq_psn;
    a.max_dest_rd_atomic = path.max_dest_rd_atomic;
    a.min_rnr_timer = path.min_rnr_timer;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = path.dgid;
    a.ah_attr.grh.sgid_index = path.sgid_index;
    a.ah_attr.grh.hop_limit = path.hop_limit;
    a.ah_attr.port_num = 1;
    return v->ops->modify_qp(v, qp, &a,
                             IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                 IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

int QpToRts(ote_verbs_t *v, struct ibv_qp *qp, const QpRetry &retry) {
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = retry.sq_psn;
    a.timeout = retry.timeout;
    a.retry_cnt = retry.retry_cnt;
    a.rnr_retry = retry.rnr_retry;
    a.max_rd_atomic = retry.max_rd_atomic;
    return v->ops->modify_qp(v, qp, &a,
                             IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                 IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
}

int QpToErr(ote_verbs_t *v, struct ibv_qp *qp) {
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_ERR;
    return v->ops->modify_qp(v, qp, &a, IBV_QP_STATE);
}

int QpState(ote_verbs_t *v, struct ibv_qp *qp, enum ibv_qp_state *state) {
    struct ibv_qp_attr a;
    struct ibv_qp_init_attr ia;
    memset(&a, 0, sizeof(a));
    int err = v->ops->query_qp(v, qp, &a, IBV_QP_STATE, &ia);
    *state = a.qp_state;
    return err;
}

int PostRecvOne(ote_verbs_t *v, struct ibv_qp *qp, uint64_t addr, uint32_t len, uint32_t lkey,
                uint64_t wr_id) {
    struct ibv_sge sge = {addr, len, lkey};
    struct ibv_recv_wr wr, *bad = nullptr;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    return v->ops->post_recv(v, qp, &wr, &bad);
}

int PollCq(ote_verbs_t *v, struct ibv_cq *cq, size_t n, uint64_t wait_ns,
           std::vector<struct ibv_wc> *out) {
    ote_deadline_t dl = ote_deadline_after(wait_ns);
    size_t got = 0;
    while (got < n && !ote_deadline_expired(dl)) {
        struct ibv_wc wc[32];
        int want = n - got < 32 ? (int)(n - got) : 32;
        int r = v->ops->poll_cq(v, cq, want, wc);
        if (r < 0) return r;
        for (int i = 0; i < r; i++) out->push_back(wc[i]);
        got += (size_t)r;
    }
    return 0;
}

} // namespace ote_test

// tests/verbs/rc_qp.h - RC queue pairs through the verbs ops table for the verbs tests
// and multiprocess_peer: creation with plain caps, the INIT -> RTR -> RTS (and ERR)
// transitions with the attributes each test chooses, one-SGE receives and CQ polling
// with a deadline. Plain functions returning the verbs' errno (no gtest), so that the
// peer process, which is no test, uses them too.
#ifndef OTE_TESTS_VERBS_RC_QP_H
#define OTE_TESTS_VERBS_RC_QP_H

#include <infiniband/verbs.h>

#include <cstdint>
#include <vector>

extern "C" {
#include "verbs/verbs.h"
}

namespace ote_test {

struct RcQpCaps {
    uint32_t max_send_wr = 16;
    uint32_t max_recv_wr = 16;
    uint32_t max_sge = 1; // send and receive
    uint32_t max_inline_data = 0;
    int sq_sig_all = 1;
};

// An RC QP on (scq, rcq); 0 or the errno of create_qp (the actual caps go to *caps_out).
int CreateRcQp(ote_verbs_t *v, struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq,
               const RcQpCaps &caps, struct ibv_qp **qp, struct ibv_qp_cap *caps_out = nullptr);

// RESET -> INIT on port 1, pkey index 0, with these remote access flags.
int QpToInit(ote_verbs_t *v, struct ibv_qp *qp,
             int access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);

// The RTR attributes: the destination, the path MTU, the local GID index and the rest.
struct QpPath {
    uint32_t dest_qpn = 0;
    union ibv_gid dgid = {};
    enum ibv_mtu mtu = IBV_MTU_1024;
    uint8_t sgid_index = 0;
    uint8_t hop_limit = 64;
    uint8_t min_rnr_timer = 1;
    uint32_t rq_psn = 0;
    uint8_t max_dest_rd_atomic = 4;
};
// INIT -> RTR (global route on port 1).
int QpToRtr(ote_verbs_t *v, struct ibv_qp *qp, const QpPath &path);

struct QpRetry {
    uint8_t timeout = 14;
    uint8_t retry_cnt = 7;
    uint8_t rnr_retry = 7;
    uint32_t sq_psn = 0;
    uint8_t max_rd_atomic = 4;
};
// RTR -> RTS.
int QpToRts(ote_verbs_t *v, struct ibv_qp *qp, const QpRetry &retry = QpRetry());
// Any state -> ERR.
int QpToErr(ote_verbs_t *v, struct ibv_qp *qp);
// The QP's current state (query_qp); 0 or its errno.
int QpState(ote_verbs_t *v, struct ibv_qp *qp, enum ibv_qp_state *state);

// One receive of [addr, addr+len) with lkey.
int PostRecvOne(ote_verbs_t *v, struct ibv_qp *qp, uint64_t addr, uint32_t len, uint32_t lkey,
                uint64_t wr_id);

// Poll cq until n completions arrived or wait_ns passed; they are appended to *out.
// Returns 0, or the negative value of a failing poll_cq (polling stops there).
int PollCq(ote_verbs_t *v, struct ibv_cq *cq, size_t n, uint64_t wait_ns,
           std::vector<struct ibv_wc> *out);

} // namespace ote_test

#endif

// Conformance of a provider's shared receive queues (VERBS_FACTS 2, 7, 10, 11), written
// against the ops table and parametrized by provider like conformance_test: "sim" always,
// "rdma-core" when it lists a device. A QP created with init_attr.srq takes every SEND
// from the SRQ (its completion on the QP's receive CQ with that QP's number), an empty
// SRQ is RNR, the armed limit raises its event once, a QP in ERR leaves the SRQ's WQEs to
// the others, and the device's limits bound creation.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <poll.h>

#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "tests/verbs/verbs_fixture.h"

extern "C" {
#include "base/time.h"
#include "verbs/verbs.h"
}

namespace {

using Buf = ote_test::VerbsBuf;

class SrqConformance : public ote_test::ProviderTest {
  protected:
    void TearDown() override {
        if (v_ != nullptr) {
            for (auto *qp : srq_qps_) EXPECT_EQ(o_->destroy_qp(v_, qp), 0);
            for (auto *s : srqs_) EXPECT_EQ(o_->destroy_srq(v_, s), 0);
        }
        ProviderTest::TearDown();
    }

    // An SRQ of max_wr WQEs of max_sge SGEs (destroyed at the end, after its QPs).
    struct ibv_srq *Srq(uint32_t max_wr, uint32_t max_sge = 1) {
        struct ibv_srq_init_attr ia;
        memset(&ia, 0, sizeof(ia));
        ia.attr.max_wr = max_wr;
        ia.attr.max_sge = max_sge;
        struct ibv_srq *s = nullptr;
        EXPECT_EQ(o_->create_srq(v_, pd_, &ia, &s), 0);
        if (s != nullptr) {
            EXPECT_GE(ia.attr.max_wr, max_wr);
            srqs_.push_back(s);
        }
        return s;
    }

    // An RC QP whose receives come from srq.
    struct ibv_qp *SrqQp(struct ibv_cq *scq, struct ibv_cq *rcq, struct ibv_srq *srq) {
        struct ibv_qp_init_attr ia;
        memset(&ia, 0, sizeof(ia));
        ia.send_cq = scq;
        ia.recv_cq = rcq;
        ia.srq = srq;
        ia.qp_type = IBV_QPT_RC;
        ia.sq_sig_all = 1;
        ia.cap.max_send_wr = 16;
        ia.cap.max_send_sge = 1;
        struct ibv_qp *qp = nullptr;
        EXPECT_EQ(o_->create_qp(v_, pd_, &ia, &qp), 0);
        if (qp != nullptr) srq_qps_.push_back(qp);
        return qp;
    }

    void DestroySrqQp(struct ibv_qp *qp) {
        ASSERT_EQ(o_->destroy_qp(v_, qp), 0);
        for (size_t i = 0; i < srq_qps_.size(); i++) {
            if (srq_qps_[i] == qp) srq_qps_.erase(srq_qps_.begin() + (long)i);
        }
    }

    int PostSrqRecv(struct ibv_srq *srq, const Buf *b, uint64_t off, uint32_t len, uint64_t id) {
        struct ibv_sge sge = {b->addr() + off, len, b->mr->lkey};
        struct ibv_recv_wr wr, *bad = nullptr;
        memset(&wr, 0, sizeof(wr));
        wr.wr_id = id;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        return o_->post_srq_recv(v_, srq, &wr, &bad);
    }

    // The next async event within wait_ms (acked); false when none came.
    bool NextEvent(struct ibv_async_event *out, int wait_ms) {
        struct pollfd pfd = {ctx_->async_fd, POLLIN, 0};
        if (poll(&pfd, 1, wait_ms) != 1) return false;
        struct ibv_async_event ev;
        if (o_->get_async_event(v_, ctx_, &ev) != 0) return false;
        *out = ev;
        o_->ack_async_event(v_, &ev);
        return true;
    }

    // The next async event of type t within wait_ms (others are skipped).
    bool WaitEvent(enum ibv_event_type t, struct ibv_async_event *out, int wait_ms) {
        uint64_t end = ote_now_ns() + (uint64_t)wait_ms * OTE_NSEC_PER_MSEC;
        while (ote_now_ns() < end) {
            int left = (int)((end - ote_now_ns()) / OTE_NSEC_PER_MSEC) + 1;
            if (!NextEvent(out, left)) return false;
            if (out->event_type == t) return true;
        }
        return false;
    }

    std::vector<struct ibv_qp *> srq_qps_;
    std::vector<struct ibv_srq *> srqs_;
};

constexpr int kEventMs = 10000;

// Three QPs on one SRQ, each fed by its own sender: every SEND lands in an SRQ buffer,
// completes on the receive CQ with wc.qp_num the QP it came in on and wc.wr_id the
// SRQ WQE's id.
TEST_P(SrqConformance, SendIntoSrqSharedByThreeQps) {
    struct ibv_cq *scq = Cq(), *rcq = Cq(), *own = Cq();
    struct ibv_srq *srq = Srq(32);
    ASSERT_NE(srq, nullptr);
    struct ibv_qp *snd[3], *rcv[3];
    for (int i = 0; i < 3; i++) {
        snd[i] = Qp(scq, own);
        rcv[i] = SrqQp(scq, rcq, srq);
        ASSERT_TRUE(snd[i] && rcv[i]);
        ASSERT_NO_FATAL_FAILURE(Connect(snd[i], rcv[i]));
    }
    Buf *dst = Mem(64 * 12), *src = Mem(64 * 6);
    for (int k = 0; k < 12; k++) ASSERT_EQ(PostSrqRecv(srq, dst, 64u * k, 64, 100 + k), 0);
    for (int i = 0; i < 3; i++) {
        for (int j = 0; j < 2; j++) {
            int m = i * 2 + j;
            snprintf((char *)src->mem.data() + 64 * m, 64, "from sender %d message %d", i, j);
            enum ibv_wr_opcode op = j == 0 ? IBV_WR_SEND : IBV_WR_SEND_WITH_IMM;
            ASSERT_EQ(PostSend(snd[i], op, src, 64u * m, 32, (uint64_t)m, 0, 0, htonl(7 + m)), 0);
        }
    }
    auto s = Poll(scq, 6);
    ASSERT_EQ(s.size(), 6u);
    for (auto &w : s) EXPECT_EQ(w.status, IBV_WC_SUCCESS);
    auto r = Poll(rcq, 6);
    ASSERT_EQ(r.size(), 6u);
    std::set<uint64_t> ids;
    int per_qp[3] = {0, 0, 0};
    for (auto &w : r) {
        ASSERT_EQ(w.status, IBV_WC_SUCCESS);
        EXPECT_TRUE(w.opcode & IBV_WC_RECV);
        EXPECT_EQ(w.byte_len, 32u);
        ASSERT_GE(w.wr_id, 100u);
        ASSERT_LT(w.wr_id, 112u);
        EXPECT_TRUE(ids.insert(w.wr_id).second) << "one WQE per message";
        int i = -1;
        for (int k = 0; k < 3; k++) {
            if (w.qp_num == rcv[k]->qp_num) i = k;
        }
        ASSERT_GE(i, 0) << "wc.qp_num " << w.qp_num << " is no QP on the SRQ";
        // the bytes in that WQE's buffer came from the sender of that QP, in order
        int j = per_qp[i]++;
        char want[64];
        snprintf(want, sizeof(want), "from sender %d message %d", i, j);
        EXPECT_STREQ((const char *)dst->mem.data() + 64 * (w.wr_id - 100), want);
        EXPECT_EQ((w.wc_flags & IBV_WC_WITH_IMM) != 0, j == 1);
        if (j == 1) {
            EXPECT_EQ(ntohl(w.imm_data), (uint32_t)(7 + i * 2 + j));
        }
    }
    for (int i = 0; i < 3; i++) EXPECT_EQ(per_qp[i], 2);
    struct ibv_srq_attr a;
    ASSERT_EQ(o_->query_srq(v_, srq, &a), 0);
    EXPECT_GE(a.max_wr, 32u);
    EXPECT_GE(a.max_sge, 1u);
    EXPECT_EQ(a.srq_limit, 0u);
}

// An empty SRQ answers a SEND with RNR exactly as an empty RQ does: a finite rnr_retry
// ends in RNR_RETRY_EXC_ERR; an infinite one waits until a WQE is posted to the SRQ.
TEST_P(SrqConformance, EmptySrqIsRnr) {
    struct ibv_cq *scq = Cq(), *rcq = Cq(), *own = Cq();
    struct ibv_srq *srq = Srq(8);
    ASSERT_NE(srq, nullptr);
    struct ibv_qp *a = Qp(scq, own), *b = SrqQp(scq, rcq, srq);
    ASSERT_TRUE(a && b);
    ASSERT_NO_FATAL_FAILURE(Connect(a, b, /*rnr_retry=*/1, /*min_rnr=*/1));
    Buf *src = Mem(64), *dst = Mem(64);
    ASSERT_EQ(PostSend(a, IBV_WR_SEND, src, 0, 8, 1), 0);
    auto s = Poll(scq, 1);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_EQ(s[0].status, IBV_WC_RNR_RETRY_EXC_ERR);
    EXPECT_EQ(State(a), IBV_QPS_ERR);

    struct ibv_qp *c = Qp(scq, own), *d = SrqQp(scq, rcq, srq);
    ASSERT_TRUE(c && d);
    ASSERT_NO_FATAL_FAILURE(Connect(c, d, /*rnr_retry=*/7, /*min_rnr=*/1));
    memcpy(src->mem.data(), "late", 4);
    ASSERT_EQ(PostSend(c, IBV_WR_SEND, src, 0, 4, 2), 0);
    EXPECT_EQ(Poll(scq, 1, 100 * OTE_NSEC_PER_MSEC).size(), 0u) << "completed without a WQE";
    ASSERT_EQ(PostSrqRecv(srq, dst, 0, 64, 9), 0);
    s = Poll(scq, 1);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_EQ(s[0].status, IBV_WC_SUCCESS);
    auto r = Poll(rcq, 1);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].wr_id, 9u);
    EXPECT_EQ(r[0].qp_num, d->qp_num);
    EXPECT_EQ(memcmp(dst->mem.data(), "late", 4), 0);
}

// modify_srq(IBV_SRQ_LIMIT) arms the limit: IBV_EVENT_SRQ_LIMIT_REACHED (element.srq)
// comes once when the posted count falls below it, and the limit reads back disarmed.
TEST_P(SrqConformance, LimitEventOnceThenDisarmed) {
    struct ibv_cq *scq = Cq(), *rcq = Cq(), *own = Cq();
    struct ibv_srq *srq = Srq(16);
    ASSERT_NE(srq, nullptr);
    struct ibv_qp *a = Qp(scq, own), *b = SrqQp(scq, rcq, srq);
    ASSERT_TRUE(a && b);
    ASSERT_NO_FATAL_FAILURE(Connect(a, b));
    Buf *src = Mem(64), *dst = Mem(64 * 8);
    for (int k = 0; k < 8; k++) ASSERT_EQ(PostSrqRecv(srq, dst, 64u * k, 64, (uint64_t)k), 0);
    struct ibv_srq_attr attr;
    memset(&attr, 0, sizeof(attr));
    attr.srq_limit = 6;
    ASSERT_EQ(o_->modify_srq(v_, srq, &attr, IBV_SRQ_LIMIT), 0);
    ASSERT_EQ(o_->query_srq(v_, srq, &attr), 0);
    EXPECT_EQ(attr.srq_limit, 6u);
    attr.srq_limit = attr.max_wr + 1;
    EXPECT_NE(o_->modify_srq(v_, srq, &attr, IBV_SRQ_LIMIT), 0) << "limit above the depth";

    auto send = [&](uint64_t id) {
        ASSERT_EQ(PostSend(a, IBV_WR_SEND, src, 0, 8, id), 0);
        ASSERT_EQ(Poll(scq, 1).size(), 1u);
        ASSERT_EQ(Poll(rcq, 1).size(), 1u);
    };
    struct ibv_async_event ev;
    ASSERT_NO_FATAL_FAILURE(send(1)); // 7 posted: not below 6
    ASSERT_NO_FATAL_FAILURE(send(2)); // 6 posted: not below 6
    EXPECT_FALSE(NextEvent(&ev, 100)) << "event " << ev.event_type << " before the limit";
    ASSERT_NO_FATAL_FAILURE(send(3)); // 5 posted: below
    ASSERT_TRUE(WaitEvent(IBV_EVENT_SRQ_LIMIT_REACHED, &ev, kEventMs));
    EXPECT_EQ(ev.element.srq, srq);
    ASSERT_EQ(o_->query_srq(v_, srq, &attr), 0);
    EXPECT_EQ(attr.srq_limit, 0u) << "disarmed by the event";
    ASSERT_NO_FATAL_FAILURE(send(4)); // 4 posted: no second event
    EXPECT_FALSE(NextEvent(&ev, 200)) << "second event " << ev.event_type;
}

// destroy_srq while a QP takes its receives from it: EBUSY (the SRQ stays usable); once
// the QP is gone it succeeds.
TEST_P(SrqConformance, DestroyWithQpAttachedIsBusy) {
    struct ibv_cq *cq = Cq();
    struct ibv_srq_init_attr ia;
    memset(&ia, 0, sizeof(ia));
    ia.attr.max_wr = 4;
    ia.attr.max_sge = 1;
    struct ibv_srq *srq = nullptr;
    ASSERT_EQ(o_->create_srq(v_, pd_, &ia, &srq), 0);
    struct ibv_qp *qp = SrqQp(cq, cq, srq);
    ASSERT_NE(qp, nullptr);
    EXPECT_EQ(o_->destroy_srq(v_, srq), EBUSY);
    Buf *dst = Mem(64);
    EXPECT_EQ(PostSrqRecv(srq, dst, 0, 64, 1), 0) << "still usable";
    ASSERT_NO_FATAL_FAILURE(DestroySrqQp(qp));
    EXPECT_EQ(o_->destroy_srq(v_, srq), 0);
}

// A QP on an SRQ has no receive queue of its own: post_recv fails (EINVAL on rxe, mlx5
// and the sim) with bad_wr naming the first WR.
TEST_P(SrqConformance, PostRecvOnSrqQpFails) {
    struct ibv_cq *cq = Cq();
    struct ibv_srq *srq = Srq(4);
    ASSERT_NE(srq, nullptr);
    struct ibv_qp *qp = SrqQp(cq, cq, srq);
    ASSERT_NE(qp, nullptr);
    ASSERT_EQ(ToInit(qp), 0);
    Buf *dst = Mem(64);
    struct ibv_sge sge = {dst->addr(), 64, dst->mr->lkey};
    struct ibv_recv_wr wr, *bad = nullptr;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = 5;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    int rc = o_->post_recv(v_, qp, &wr, &bad);
    EXPECT_NE(rc, 0);
    if (IsSim()) {
        EXPECT_EQ(rc, EINVAL);
    }
    EXPECT_EQ(bad, &wr);
}

// A QP that enters ERR flushes no SRQ WQE: they stay for the other QPs, which take every
// one of them; the QP gets IBV_EVENT_QP_LAST_WQE_REACHED.
TEST_P(SrqConformance, QpInErrLeavesSrqWqesForOthers) {
    struct ibv_cq *scq = Cq(), *rcq = Cq(), *own = Cq();
    struct ibv_srq *srq = Srq(8);
    ASSERT_NE(srq, nullptr);
    struct ibv_qp *s0 = Qp(scq, own), *r0 = SrqQp(scq, rcq, srq);
    struct ibv_qp *s1 = Qp(scq, own), *r1 = SrqQp(scq, rcq, srq);
    ASSERT_TRUE(s0 && r0 && s1 && r1);
    ASSERT_NO_FATAL_FAILURE(Connect(s0, r0));
    ASSERT_NO_FATAL_FAILURE(Connect(s1, r1));
    Buf *src = Mem(64), *dst = Mem(64 * 4);
    for (int k = 0; k < 4; k++) ASSERT_EQ(PostSrqRecv(srq, dst, 64u * k, 64, 10 + k), 0);
    ASSERT_EQ(ToErr(r0), 0);
    EXPECT_EQ(Poll(rcq, 1, 100 * OTE_NSEC_PER_MSEC).size(), 0u) << "an SRQ WQE was flushed";
    struct ibv_async_event ev;
    ASSERT_TRUE(WaitEvent(IBV_EVENT_QP_LAST_WQE_REACHED, &ev, kEventMs));
    EXPECT_EQ(ev.element.qp, r0);
    for (int k = 0; k < 4; k++) ASSERT_EQ(PostSend(s1, IBV_WR_SEND, src, 0, 8, (uint64_t)k), 0);
    auto s = Poll(scq, 4);
    ASSERT_EQ(s.size(), 4u);
    for (auto &w : s) EXPECT_EQ(w.status, IBV_WC_SUCCESS);
    auto r = Poll(rcq, 4);
    ASSERT_EQ(r.size(), 4u);
    for (int k = 0; k < 4; k++) {
        EXPECT_EQ(r[(size_t)k].status, IBV_WC_SUCCESS);
        EXPECT_EQ(r[(size_t)k].qp_num, r1->qp_num);
        EXPECT_EQ(r[(size_t)k].wr_id, (uint64_t)(10 + k)) << "SRQ WQEs in posting order";
    }
}

// Creation within the device's max_srq_wr / max_srq_sge succeeds; one more of either is
// refused (EINVAL on rxe and the sim; mlx5 may say ENOMEM), as is an empty SRQ.
TEST_P(SrqConformance, CapsOverTheDeviceLimitAreRefused) {
    struct ibv_device_attr da;
    ASSERT_EQ(o_->query_device(v_, ctx_, &da), 0);
    ASSERT_GT(da.max_srq_wr, 0) << "the device reports no SRQ depth";
    ASSERT_GT(da.max_srq_sge, 0);
    auto create = [&](uint32_t wr, uint32_t sge, struct ibv_srq **out) {
        struct ibv_srq_init_attr ia;
        memset(&ia, 0, sizeof(ia));
        ia.attr.max_wr = wr;
        ia.attr.max_sge = sge;
        *out = nullptr;
        return o_->create_srq(v_, pd_, &ia, out);
    };
    struct ibv_srq *s = nullptr;
    int rc = create((uint32_t)da.max_srq_wr + 1, 1, &s);
    EXPECT_NE(rc, 0);
    EXPECT_EQ(s, nullptr);
    if (IsSim()) {
        EXPECT_EQ(rc, EINVAL);
    }
    rc = create(4, (uint32_t)da.max_srq_sge + 1, &s);
    EXPECT_NE(rc, 0);
    EXPECT_EQ(s, nullptr);
    if (IsSim()) {
        EXPECT_EQ(rc, EINVAL);
    }
    if (IsSim()) {
        EXPECT_EQ(create(0, 1, &s), EINVAL);
    }
    ASSERT_EQ(create((uint32_t)da.max_srq_wr, (uint32_t)da.max_srq_sge, &s), 0);
    EXPECT_EQ(o_->destroy_srq(v_, s), 0);
}

INSTANTIATE_TEST_SUITE_P(Providers, SrqConformance, ote_test::AllProviders(),
                         ote_test::ProviderName);

} // namespace

// The fault decorator over the software RC provider ("sim"): the rules act on real
// traffic between two connected QPs of one process (RDMA WRITEs with data checks).
#include <gtest/gtest.h>

#include <poll.h>
#include <sched.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "tests/util/wait.h"
#include "tests/verbs/verbs_fixture.h"

extern "C" {
#include "base/time.h"
#include "verbs/fault.h"
#include "verbs/verbs.h"
}

namespace {

#define OP(x) OTE_VERBS_FAULT_OP_##x

constexpr size_t kBuf = 4096;
constexpr size_t kChunk = 256;

class FaultSimTest : public ote_test::VerbsFixture {
  protected:
    void SetUp() override {
        VerbsFixture::SetUp();
        ASSERT_NO_FATAL_FAILURE(OpenVerbs("sim", nullptr, /*fault=*/true));
        ASSERT_STREQ(v_->provider, "fault(sim)");
        src_ = Mem(kBuf);
        dst_ = Mem(kBuf);
        for (size_t i = 0; i < kBuf; i++) src_->mem[i] = static_cast<uint8_t>(i * 7 + 1);
        cq_ = Cq(64);
        a_ = CreateQp();
        b_ = CreateQp();
        ASSERT_NE(a_, nullptr);
        ASSERT_NE(b_, nullptr);
        Connect(a_, b_);
    }

    struct ibv_qp *CreateQp() {
        struct ibv_qp_cap actual;
        struct ibv_qp *qp = Qp(cq_, cq_, 16, 16, /*sig_all=*/0, &actual);
        if (qp != nullptr) {
            EXPECT_GE(actual.max_send_wr, 16u) << "actual caps are written back";
        }
        return qp;
    }

    // The test destroyed a_ itself.
    void DestroyedA() {
        Forget(a_);
        a_ = nullptr;
    }

    // n signaled RDMA WRITEs of chunk i (wr_id first+i) from src_ into dst_ on QP a_.
    int PostWrites(uint64_t first, int n, struct ibv_send_wr **bad,
                   std::vector<struct ibv_send_wr> *wrs, std::vector<struct ibv_sge> *sges) {
        wrs->assign(static_cast<size_t>(n), ibv_send_wr{});
        sges->assign(static_cast<size_t>(n), ibv_sge{});
        for (int i = 0; i < n; i++) {
            size_t off = static_cast<size_t>(first - 1 + static_cast<uint64_t>(i)) * kChunk;
            (*sges)[i].addr = reinterpret_cast<uintptr_t>(src_->mem.data() + off);
            (*sges)[i].length = kChunk;
            (*sges)[i].lkey = src_->mr->lkey;
            auto &w = (*wrs)[i];
            w.wr_id = first + static_cast<uint64_t>(i);
            w.opcode = IBV_WR_RDMA_WRITE;
            w.send_flags = IBV_SEND_SIGNALED;
            w.sg_list = &(*sges)[i];
            w.num_sge = 1;
            w.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(dst_->mem.data() + off);
            w.wr.rdma.rkey = dst_->mr->rkey;
            w.next = i + 1 < n ? &(*wrs)[i + 1] : nullptr;
        }
        return v_->ops->post_send(v_, a_, wrs->data(), bad);
    }

    // Polls until `want` CQEs arrived or the wait ran out; PollQuiet checks nothing more comes
    // within a short grace period (the sim completes promptly).
    std::vector<struct ibv_wc> PollN(size_t want) {
        std::vector<struct ibv_wc> out;
        ote_test::WaitUntil(
            [&] {
                struct ibv_wc wc[8];
                int n = v_->ops->poll_cq(v_, cq_, 8, wc);
                EXPECT_GE(n, 0);
                for (int i = 0; i < n; i++) out.push_back(wc[i]);
                return out.size() >= want;
            },
            std::chrono::nanoseconds(ote_test::kVerbsWaitNs),
            std::to_string(want) + " completions");
        return out;
    }
    std::vector<struct ibv_wc> PollQuiet(uint64_t ms) {
        std::vector<struct ibv_wc> out;
        ote_deadline_t d = ote_deadline_after(ms * OTE_NSEC_PER_MSEC);
        while (!ote_deadline_expired(d)) {
            struct ibv_wc wc[8];
            int n = v_->ops->poll_cq(v_, cq_, 8, wc);
            for (int i = 0; i < n; i++) out.push_back(wc[i]);
            if (n == 0) sched_yield();
        }
        return out;
    }
    bool ChunkArrived(uint64_t wr_id) {
        size_t off = static_cast<size_t>(wr_id - 1) * kChunk;
        return std::memcmp(src_->mem.data() + off, dst_->mem.data() + off, kChunk) == 0;
    }

    ote_test::VerbsBuf *src_ = nullptr, *dst_ = nullptr;
    struct ibv_cq *cq_ = nullptr;
    struct ibv_qp *a_ = nullptr, *b_ = nullptr;
};

TEST_F(FaultSimTest, PartialPostMovesOnlyTheAcceptedWrs) {
    ASSERT_EQ(ote_verbs_fault_partial_post(v_, OP(POST_SEND), 2, ENOMEM), OTE_OK);
    std::vector<struct ibv_send_wr> wrs;
    std::vector<struct ibv_sge> sges;
    struct ibv_send_wr *bad = nullptr;
    ASSERT_EQ(PostWrites(1, 4, &bad, &wrs, &sges), ENOMEM);
    EXPECT_EQ(bad, &wrs[2]);
    auto wc = PollN(2);
    ASSERT_EQ(wc.size(), 2u);
    EXPECT_EQ(wc[0].wr_id, 1u);
    EXPECT_EQ(wc[1].wr_id, 2u);
    for (auto &w : wc) EXPECT_EQ(w.status, IBV_WC_SUCCESS);
    EXPECT_TRUE(PollQuiet(50).empty()) << "WRs past k must not complete";
    EXPECT_TRUE(ChunkArrived(1));
    EXPECT_TRUE(ChunkArrived(2));
    EXPECT_FALSE(ChunkArrived(3));
    // The caller reposts from bad_wr and everything lands.
    ASSERT_EQ(v_->ops->post_send(v_, a_, bad, &bad), 0);
    wc = PollN(2);
    ASSERT_EQ(wc.size(), 2u);
    EXPECT_TRUE(ChunkArrived(3));
    EXPECT_TRUE(ChunkArrived(4));
}

TEST_F(FaultSimTest, LostAndErrorCqesOnRealTraffic) {
    ASSERT_EQ(ote_verbs_fault_lose_cqe_wr_id(v_, cq_, 2), OTE_OK);
    ASSERT_EQ(ote_verbs_fault_error_cqe_wr_id(v_, cq_, 3, IBV_WC_REM_ACCESS_ERR, 9), OTE_OK);
    std::vector<struct ibv_send_wr> wrs;
    std::vector<struct ibv_sge> sges;
    struct ibv_send_wr *bad = nullptr;
    ASSERT_EQ(PostWrites(1, 4, &bad, &wrs, &sges), 0);
    auto wc = PollN(3);
    ASSERT_EQ(wc.size(), 3u);
    EXPECT_EQ(wc[0].wr_id, 1u);
    EXPECT_EQ(wc[1].wr_id, 3u);
    EXPECT_EQ(wc[1].status, IBV_WC_REM_ACCESS_ERR);
    EXPECT_EQ(wc[1].vendor_err, 9u);
    EXPECT_EQ(wc[1].qp_num, a_->qp_num);
    EXPECT_EQ(wc[2].wr_id, 4u);
    EXPECT_TRUE(PollQuiet(50).empty()) << "the lost CQE never appears";
    EXPECT_TRUE(ChunkArrived(2)) << "losing the CQE does not undo the data movement";
    EXPECT_EQ(ote_verbs_fault_injected(v_, OP(POLL_CQ)), 2u);
}

TEST_F(FaultSimTest, BusyDestroyRetainsTheQpUntilItSucceeds) {
    ASSERT_EQ(ote_verbs_fault_destroy_busy(v_, OP(DESTROY_QP), a_, 2), OTE_OK);
    EXPECT_EQ(v_->ops->destroy_qp(v_, a_), EBUSY);
    EXPECT_EQ(v_->ops->destroy_qp(v_, a_), EBUSY);
    // Still alive: it still moves data.
    std::vector<struct ibv_send_wr> wrs;
    std::vector<struct ibv_sge> sges;
    struct ibv_send_wr *bad = nullptr;
    ASSERT_EQ(PostWrites(1, 1, &bad, &wrs, &sges), 0);
    ASSERT_EQ(PollN(1).size(), 1u);
    EXPECT_TRUE(ChunkArrived(1));
    EXPECT_EQ(v_->ops->destroy_qp(v_, a_), 0);
    DestroyedA();
    EXPECT_EQ(ote_verbs_fault_calls(v_, OP(DESTROY_QP)), 3u);
}

TEST_F(FaultSimTest, FailedRegistrationAndInjectedAsyncEvent) {
    ASSERT_EQ(ote_verbs_fault_fail(v_, OP(REG_MR), OTE_FAULT_NTH, 1, ENOMEM), OTE_OK);
    struct ibv_mr *mr = nullptr;
    EXPECT_EQ(v_->ops->reg_mr(v_, pd_, src_->mem.data(), 64, IBV_ACCESS_LOCAL_WRITE, &mr), ENOMEM);
    EXPECT_EQ(mr, nullptr);
    ASSERT_EQ(v_->ops->reg_mr(v_, pd_, src_->mem.data(), 64, IBV_ACCESS_LOCAL_WRITE, &mr), 0);
    EXPECT_EQ(v_->ops->dereg_mr(v_, mr), 0);

    int fd = -1;
    ASSERT_EQ(ote_verbs_fault_async_fd(v_, ctx_, &fd), OTE_OK);
    struct ibv_async_event inj;
    std::memset(&inj, 0, sizeof(inj));
    inj.event_type = IBV_EVENT_QP_FATAL;
    inj.element.qp = a_;
    ASSERT_EQ(ote_verbs_fault_inject_async_event(v_, ctx_, &inj), OTE_OK);
    struct pollfd p = {fd, POLLIN, 0};
    ASSERT_EQ(poll(&p, 1, 10000), 1); // readable at once; the wait only bounds a failure
    struct ibv_async_event ev;
    ASSERT_EQ(v_->ops->get_async_event(v_, ctx_, &ev), 0);
    EXPECT_EQ(ev.event_type, IBV_EVENT_QP_FATAL);
    EXPECT_EQ(ev.element.qp, a_);
    v_->ops->ack_async_event(v_, &ev);
    EXPECT_EQ(v_->ops->destroy_qp(v_, a_), 0);
    DestroyedA();
}

} // namespace

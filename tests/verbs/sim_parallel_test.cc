// The sim's copies outside its lock (verbs/sim/sim_internal.h "Copies outside prov->mu"),
// through the copy hook (ote_sim_set_copy_hook), which runs inside a copy on the progress
// thread that owns the connection:
//  - the payload copies of two QP pairs of one instance overlap in time: while the copy
//    of pair 1's WRITE is held in the hook, pair 2's WRITE enters its own copy (with one
//    lock around every copy it could not, and the test would fail at its deadline);
//  - dereg_mr of the destination while a copy into it is held returns only after that
//    copy ended, and no byte lands in the memory after dereg returned (the rest of the
//    payload is dropped and the WRITE fails with a remote access error).
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "tests/verbs/verbs_fixture.h"

extern "C" {
#include "base/time.h"
#include "verbs/sim/sim.h"
#include "verbs/verbs.h"
}

namespace {

using Buf = ote_test::VerbsBuf;

constexpr std::chrono::nanoseconds kWait(ote_test::kVerbsWaitNs);

void Fill(std::vector<uint8_t> *m, uint8_t seed) {
    for (size_t i = 0; i < m->size(); i++) (*m)[i] = (uint8_t)(i * 131 + seed + (i >> 12));
}

// What the hook saw, shared with the test thread under mu.
struct HookState {
    std::mutex mu;
    std::condition_variable cv;
    uint32_t hold_qpn = 0; // the first payload copy of this QP is held ...
    int hold_dir = OTE_SIM_COPY_TX;
    uint32_t other_qpn = 0; // ... until a copy of this QP starts (overlap test), or
    bool release = false;   // ... until the test releases it (dereg test)
    bool held = false;      // the held copy is in the hook
    bool other_seen = false;
    bool overlapped = false; // the other QP's copy started while the held one was held
    bool hold_done = false;  // the held copy left the hook
};

void Hook(void *arg, uint32_t qpn, int dir, size_t len) {
    auto *s = static_cast<HookState *>(arg);
    std::unique_lock<std::mutex> lk(s->mu);
    if (s->other_qpn && qpn == s->other_qpn && len > 0) {
        s->other_seen = true;
        s->cv.notify_all();
        return;
    }
    if (qpn != s->hold_qpn || dir != s->hold_dir || len == 0 || s->held) return;
    s->held = true;
    s->cv.notify_all();
    if (s->other_qpn) {
        s->cv.wait_for(lk, kWait, [&] { return s->other_seen; });
        s->overlapped = s->other_seen;
    } else {
        s->cv.wait_for(lk, kWait, [&] { return s->release; });
        lk.unlock();
        // Long enough for the dereg just started to reach its wait for this copy (it
        // passes either way; with less, the test only checks less).
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        lk.lock();
    }
    s->hold_done = true;
}

class SimParallel : public ote_test::VerbsFixture {
  protected:
    void SetUp() override {
        ote_test::VerbsFixture::SetUp();
        ASSERT_NO_FATAL_FAILURE(OpenVerbs("sim"));
    }
    void TearDown() override {
        ote_sim_set_copy_hook(nullptr, nullptr);
        ote_test::VerbsFixture::TearDown();
    }
    HookState hs_;
};

TEST_F(SimParallel, CopiesOfTwoQpPairsOverlap) {
    struct ibv_cq *cq = Cq();
    struct ibv_qp *a1 = Qp(cq, cq), *b1 = Qp(cq, cq), *a2 = Qp(cq, cq), *b2 = Qp(cq, cq);
    Connect(a1, b1);
    Connect(a2, b2);
    constexpr uint32_t kLen = 1u << 20;
    Buf *src = Mem(kLen), *d1 = Mem(kLen), *d2 = Mem(kLen);
    Fill(&src->mem, 7);
    hs_.hold_qpn = a1->qp_num;
    hs_.hold_dir = OTE_SIM_COPY_TX;
    hs_.other_qpn = a2->qp_num;
    ote_sim_set_copy_hook(Hook, &hs_);

    ASSERT_EQ(PostSend(a1, IBV_WR_RDMA_WRITE, src, 0, kLen, 1, d1->addr(), d1->mr->rkey), 0);
    {
        std::unique_lock<std::mutex> lk(hs_.mu);
        ASSERT_TRUE(hs_.cv.wait_for(lk, kWait, [&] { return hs_.held; }))
            << "pair 1's copy never started";
    }
    // Pair 1's copy is held in the hook now; pair 2's must start anyway.
    ASSERT_EQ(PostSend(a2, IBV_WR_RDMA_WRITE, src, 0, kLen, 2, d2->addr(), d2->mr->rkey), 0);
    auto wcs = Poll(cq, 2);
    ASSERT_EQ(wcs.size(), 2u);
    for (auto &wc : wcs) EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << "wr " << wc.wr_id;
    {
        std::lock_guard<std::mutex> lk(hs_.mu);
        EXPECT_TRUE(hs_.overlapped) << "pair 2's copy did not start while pair 1's was held";
        EXPECT_TRUE(hs_.hold_done);
    }
    // Completions are per QP, and the data is intact on both pairs.
    EXPECT_EQ(memcmp(d1->mem.data(), src->mem.data(), kLen), 0);
    EXPECT_EQ(memcmp(d2->mem.data(), src->mem.data(), kLen), 0);
}

TEST_F(SimParallel, DeregWaitsForACopyInFlightAndNothingLandsAfter) {
    struct ibv_cq *cq = Cq();
    struct ibv_qp *a = Qp(cq, cq), *b = Qp(cq, cq);
    Connect(a, b);
    // Larger than both socket buffers: most of it is still to come when dereg returns.
    constexpr uint32_t kLen = 32u << 20;
    Buf *src = Mem(kLen);
    Fill(&src->mem, 3);
    std::vector<uint8_t> dst(kLen, 0);
    struct ibv_mr *mr = nullptr;
    ASSERT_EQ(o_->reg_mr(v_, pd_, dst.data(), kLen, ote_test::kAccessRw, &mr), 0);
    hs_.hold_qpn = b->qp_num; // the responder's copy into dst
    hs_.hold_dir = OTE_SIM_COPY_RX;
    ote_sim_set_copy_hook(Hook, &hs_);

    ASSERT_EQ(
        PostSend(a, IBV_WR_RDMA_WRITE, src, 0, kLen, 1, (uint64_t)(uintptr_t)dst.data(), mr->rkey),
        0);
    {
        std::unique_lock<std::mutex> lk(hs_.mu);
        ASSERT_TRUE(hs_.cv.wait_for(lk, kWait, [&] { return hs_.held; }))
            << "the copy into the destination never started";
    }
    int rc = -1;
    bool copy_done_at_return = false;
    std::thread t([&] {
        {
            std::lock_guard<std::mutex> lk(hs_.mu);
            hs_.release = true;
            hs_.cv.notify_all();
        }
        rc = o_->dereg_mr(v_, mr);
        std::lock_guard<std::mutex> lk(hs_.mu);
        copy_done_at_return = hs_.hold_done;
    });
    t.join();
    ASSERT_EQ(rc, 0);
    EXPECT_TRUE(copy_done_at_return) << "dereg_mr returned while a copy into the MR was held";
    std::vector<uint8_t> snap = dst;
    // The rest of the payload is read and dropped; the WRITE fails at its end.
    auto wcs = Poll(cq, 1);
    ASSERT_EQ(wcs.size(), 1u);
    EXPECT_EQ(wcs[0].wr_id, 1u);
    EXPECT_EQ(wcs[0].status, IBV_WC_REM_ACCESS_ERR);
    EXPECT_EQ(memcmp(snap.data(), dst.data(), kLen), 0) << "bytes landed after dereg_mr returned";
    EXPECT_NE(memcmp(dst.data(), src->mem.data(), kLen), 0) << "the whole payload landed";
}

} // namespace

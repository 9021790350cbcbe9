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

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "tests/verbs/rc_qp.h"
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

// A second sim instance in this process (its own progress threads) with one device, one
// GID (index 0), a PD, a CQ, an RC QP and a registered buffer: a QP pair across the two
// instances runs its requester and its responder on different threads.
struct PeerInstance {
    ote_verbs_t *v = nullptr;
    struct ibv_context *ctx = nullptr;
    struct ibv_pd *pd = nullptr;
    struct ibv_cq *cq = nullptr;
    struct ibv_qp *qp = nullptr;
    struct ibv_mr *mr = nullptr;
    std::vector<uint8_t> mem;
    union ibv_gid gid = {};
    void Open(size_t len) {
        ASSERT_EQ(ote_verbs_open("sim", "dev=peer0;port;gid=auto-v4,type=v2", &v), OTE_OK);
        const ote_verbs_ops_t *o = v->ops;
        struct ibv_device **list = nullptr;
        int num = 0;
        ASSERT_EQ(o->get_device_list(v, &list, &num), 0);
        ASSERT_GE(num, 1);
        int rc = o->open_device(v, list[0], &ctx);
        o->free_device_list(v, list);
        ASSERT_EQ(rc, 0);
        ASSERT_EQ(o->alloc_pd(v, ctx, &pd), 0);
        ASSERT_EQ(o->query_gid(v, ctx, 1, 0, &gid), 0);
        ASSERT_EQ(o->create_cq(v, ctx, 64, nullptr, nullptr, 0, &cq), 0);
        ASSERT_EQ(ote_test::CreateRcQp(v, pd, cq, cq, ote_test::RcQpCaps(), &qp), 0);
        mem.assign(len, 0);
        ASSERT_EQ(o->reg_mr(v, pd, mem.data(), len, ote_test::kAccessRw, &mr), 0);
    }
    ~PeerInstance() {
        if (v == nullptr) return;
        const ote_verbs_ops_t *o = v->ops;
        if (qp) {
            EXPECT_EQ(o->destroy_qp(v, qp), 0);
        }
        if (mr) {
            EXPECT_EQ(o->dereg_mr(v, mr), 0);
        }
        if (cq) {
            EXPECT_EQ(o->destroy_cq(v, cq), 0);
        }
        if (pd) {
            EXPECT_EQ(o->dealloc_pd(v, pd), 0);
        }
        if (ctx) {
            EXPECT_EQ(o->close_device(v, ctx), 0);
        }
        ote_verbs_close(v);
    }
};

// Holds the first payload copy of one QP in a given direction for a fixed time.
struct SleepHook {
    std::atomic<uint32_t> qpn{0};
    std::atomic<int> dir{OTE_SIM_COPY_RX};
    std::atomic<bool> held{false};
    std::chrono::milliseconds hold{0};
};

void Sleeper(void *arg, uint32_t qpn, int dir, size_t len) {
    auto *s = static_cast<SleepHook *>(arg);
    if (len == 0 || qpn != s->qpn.load() || dir != s->dir.load() || s->held.exchange(true)) return;
    std::this_thread::sleep_for(s->hold);
}

// The word of a dropped request (SIM_MSG_DROP) says the peer will never answer what it
// dropped, so the retry clock may run out; but after a go-back the drops of what was sent
// before say nothing of the resent requests. Three SENDs into a peer with no receive:
// the first is answered RNR NAK (go-back), the other two are dropped (out of sequence),
// over and over, until receives are posted; then the peer's thread is held in the copy of
// the resent first SEND for 1.5 s, past the 1 s retry bound of a live peer, while the
// requester's thread (another instance) watches the clock. A slow peer is not a silent
// one: the three SENDs complete. Before go-backs had generations, the drops of the old
// round ended them RETRY_EXC_ERR.
TEST_F(SimParallel, DropsBeforeAGoBackDoNotFailTheResentRequests) {
    PeerInstance peer;
    ASSERT_NO_FATAL_FAILURE(peer.Open(3 * 4096));
    struct ibv_cq *cq = Cq();
    struct ibv_qp *a = Qp(cq, cq);
    ASSERT_EQ(ToInit(a), 0);
    ASSERT_EQ(ToRtr(a, peer.qp->qp_num, peer.gid), 0);
    ASSERT_EQ(ToRts(a, 7, 14, 7), 0); // rnr_retry 7: RNR NAKs retry for ever
    ASSERT_EQ(ote_test::QpToInit(peer.v, peer.qp), 0);
    ote_test::QpPath path;
    path.dest_qpn = a->qp_num;
    path.dgid = gid_;
    ASSERT_EQ(ote_test::QpToRtr(peer.v, peer.qp, path), 0);
    ASSERT_EQ(ote_test::QpToRts(peer.v, peer.qp), 0);

    Buf *src = Mem(3 * 4096);
    Fill(&src->mem, 5);
    for (uint64_t i = 0; i < 3; i++)
        ASSERT_EQ(PostSend(a, IBV_WR_SEND, src, i * 4096, 4096, i + 1), 0);
    // Rounds of RNR NAK + two drops while no receive is posted.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    SleepHook sh;
    sh.qpn = peer.qp->qp_num;
    sh.hold = std::chrono::milliseconds(1500);
    ote_sim_set_copy_hook(Sleeper, &sh);
    for (uint64_t i = 0; i < 3; i++)
        ASSERT_EQ(
            ote_test::PostRecvOne(peer.v, peer.qp, (uint64_t)(uintptr_t)peer.mem.data() + i * 4096,
                                  4096, peer.mr->lkey, 100 + i),
            0);
    auto wcs = Poll(cq, 3);
    ASSERT_EQ(wcs.size(), 3u);
    for (auto &wc : wcs) EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << "wr " << wc.wr_id;
    EXPECT_TRUE(sh.held.load()) << "the peer's copy was never held";
    std::vector<struct ibv_wc> rwcs;
    ASSERT_EQ(ote_test::PollCq(peer.v, peer.cq, 3, ote_test::kVerbsWaitNs, &rwcs), 0);
    ASSERT_EQ(rwcs.size(), 3u);
    ote_sim_set_copy_hook(nullptr, nullptr);
    EXPECT_EQ(memcmp(peer.mem.data(), src->mem.data(), 3 * 4096), 0);
}

} // namespace

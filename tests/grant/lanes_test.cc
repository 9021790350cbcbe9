// lanes_test: the lanes of one grant manager post in parallel (issue 25.4). A test-local
// provider table in front of the rig's wraps post_send: for posts on the requester's
// context it counts the callers inside at once, holding each call a few ms so that two
// posts allowed to overlap do. Two threads drive grants on two lanes of the requester's
// manager (slot i is on lane i; each lane's answers and completions come in its own CQ
// worker). Before the per-lane locks, the manager mutex was held across every post of
// every lane, and at most one caller was ever inside.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "tests/grant/rig.h"
#include "tests/util/test_base.h"

namespace {

using ote_test::Done;
using ote_test::kMs;
using ote_test::Rig;

struct PostProbe {
    static const ote_verbs_ops_t *inner;
    static std::atomic<struct ibv_context *> watched;
    static std::atomic<int> inside, max_inside;
    static std::atomic<uint64_t> calls;
    static int PostSend(ote_verbs_t *v, struct ibv_qp *qp, struct ibv_send_wr *wr,
                        struct ibv_send_wr **bad) {
        bool mine = qp != nullptr && qp->context == watched.load();
        if (mine) {
            int now = ++inside;
            int seen = max_inside.load();
            while (now > seen && !max_inside.compare_exchange_weak(seen, now)) {}
            calls++;
            std::this_thread::sleep_for(std::chrono::milliseconds(3));
        }
        int rc = inner->post_send(v, qp, wr, bad);
        if (mine) inside--;
        return rc;
    }
};
const ote_verbs_ops_t *PostProbe::inner = nullptr;
std::atomic<struct ibv_context *> PostProbe::watched{nullptr};
std::atomic<int> PostProbe::inside{0}, PostProbe::max_inside{0};
std::atomic<uint64_t> PostProbe::calls{0};

class LanesTest : public ote_test::OteTest {
  protected:
    void SetUp() override {
        OteTest::SetUp();
        rig_.Open(8u << 20);
    }
    void TearDown() override {
        if (PostProbe::inner != nullptr) rig_.SetOps(PostProbe::inner);
        PostProbe::inner = nullptr;
        for (auto *mr : mrs_) EXPECT_EQ(rig_.v->ops->dereg_mr(rig_.v, mr), 0);
        rig_.Close();
        OteTest::TearDown();
    }

    // One WRITE grant of len bytes from out on slot `slot` to [src + off, +len), to its end.
    ote_status_t Write(uint32_t slot, uint8_t *out, uint32_t lkey, uint64_t off, uint64_t len) {
        ote_qp_t *qp = nullptr;
        ote_status_t st = rig_.Borrow(1, slot, &qp);
        if (st != OTE_OK) return st;
        Done d;
        ote_grant_desc_t g = {};
        g.op = OTE_GRANT_WRITE;
        g.local = out;
        g.lkey = lkey;
        g.remote = (uintptr_t)rig_.src.data() + off;
        g.len = len;
        g.ep = rig_.ep0[1];
        g.slot = slot;
        g.qp = qp;
        g.deadline = ote_deadline_after(30000 * kMs);
        g.done = Done::Fn;
        g.done_arg = &d;
        ote_grant_ctl_t ctl = {&rig_, Rig::Request};
        st = ote_grant_start(rig_.g0, &g, &ctl);
        if (st != OTE_OK) {
            ote_endpoint_return(rig_.ep0[1], slot, qp);
            return st;
        }
        EXPECT_TRUE(d.Wait(rig_, 60000)) << "grant did not end";
        return d.st.load();
    }

    Rig rig_;
    std::vector<struct ibv_mr *> mrs_;
};

TEST_F(LanesTest, TwoLanesOfOneManagerPostAtTheSameTime) {
    constexpr uint64_t kLen = 4 * OTE_GRANT_BLOCK; /* 4 slices: one chain, then the receipt */
    constexpr int kMaxGrants = 40;                 /* per thread; stops at the first overlap */
    std::vector<uint8_t> out[2];
    struct ibv_mr *mr[2] = {};
    for (int t = 0; t < 2; t++) {
        out[t].assign(kLen, (uint8_t)(0x31 + t));
        ASSERT_EQ(rig_.v->ops->reg_mr(rig_.v, ote_context_pd(rig_.c0), out[t].data(), kLen,
                                      IBV_ACCESS_LOCAL_WRITE, &mr[t]),
                  0);
        mrs_.push_back(mr[t]);
        /* Both slots connected before any post is watched. */
        ASSERT_EQ(Write((uint32_t)t, out[t].data(), mr[t]->lkey, (uint64_t)t * kLen, kLen), OTE_OK);
    }
    ASSERT_TRUE(rig_.WaitSourceIdle());

    static ote_verbs_ops_t probe_ops;
    PostProbe::inner = rig_.v->ops;
    probe_ops = *rig_.v->ops;
    probe_ops.post_send = PostProbe::PostSend;
    PostProbe::watched = ote_context_native(rig_.c0);
    PostProbe::inside = 0;
    PostProbe::max_inside = 0;
    PostProbe::calls = 0;
    rig_.SetOps(&probe_ops);

    std::atomic<int> failures{0}, grants{0};
    std::vector<std::thread> th;
    for (int t = 0; t < 2; t++) {
        th.emplace_back([&, t] {
            for (int i = 0; i < kMaxGrants && PostProbe::max_inside.load() < 2; i++) {
                ote_status_t st =
                    Write((uint32_t)t, out[t].data(), mr[t]->lkey, (uint64_t)t * kLen, kLen);
                if (st != OTE_OK) failures++;
                grants++;
            }
        });
    }
    for (auto &t : th) t.join();
    EXPECT_EQ(failures.load(), 0);
    EXPECT_GE(PostProbe::calls.load(), 2u);
    /* Two lanes' posts were inside the provider at once: neither waited for the other. */
    EXPECT_EQ(PostProbe::max_inside.load(), 2)
        << PostProbe::calls.load() << " posts of " << grants.load() << " grants never overlapped";
    ASSERT_TRUE(rig_.WaitSourceIdle());
    for (int t = 0; t < 2; t++)
        EXPECT_EQ(memcmp(rig_.src.data() + (uint64_t)t * kLen, out[t].data(), kLen), 0);
    ote_grant_stats_t s;
    ote_grant_mgr_get_stats(rig_.g0, &s);
    EXPECT_EQ(s.failed, 0u);
    EXPECT_EQ(s.live_requester, 0u);
    EXPECT_EQ(s.completed, (uint64_t)grants.load() + 2);
    EXPECT_EQ(s.stale_cqes, 0u);
}

} // namespace

// Unit tests of cq/ over the software provider: lane creation, dispatch of completions
// to the record owning the WR id namespace (through the QP hook), stray completions,
// the CQ budget, drain deadlines, and worker threads (worker i polls lane i across
// contexts).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "tests/cq/raw_qp.h"
#include "tests/util/test_base.h"
#include "tests/util/wait.h"

extern "C" {
#include "base/status.h"
#include "base/time.h"
#include "context/context.h"
#include "cq/lane.h"
#include "cq/workers.h"
#include "verbs/verbs.h"
}

namespace {

using ote_test::OteTest;
using ote_test::RawQp;

struct Seen {
    uint32_t ns;
    ote_cq_dir_t dir;
    uint64_t wr_id;
    ibv_wc_status status;
    std::thread::id thread;
};

// A record: collects its completions.
struct Record {
    std::mutex mu;
    std::vector<Seen> seen;
    uint32_t ns = 0;
    static void Fn(void *arg, ote_cq_lane_t *, ote_cq_dir_t dir, const ibv_wc *wc) {
        auto *r = static_cast<Record *>(arg);
        std::lock_guard<std::mutex> g(r->mu);
        r->seen.push_back(
            {OTE_CQ_WR_NS(wc->wr_id), dir, wc->wr_id, wc->status, std::this_thread::get_id()});
    }
    size_t Count() {
        std::lock_guard<std::mutex> g(mu);
        return seen.size();
    }
};

// A QP hook that forwards everything and counts.
struct Hook {
    std::atomic<int> calls{0};
    static int Fn(void *arg, ote_cq_lane_t *, ote_cq_dir_t, const ibv_wc *) {
        static_cast<Hook *>(arg)->calls++;
        return 1;
    }
};

struct Wait {
    Record *r;
    size_t n;
    static int Pred(void *arg) {
        auto *w = static_cast<Wait *>(arg);
        return w->r->Count() >= w->n;
    }
};

class CqTest : public OteTest {
  protected:
    void SetUp() override {
        OteTest::SetUp();
        ASSERT_EQ(ote_verbs_open("sim", nullptr, &v_), OTE_OK);
        ASSERT_EQ(ote_context_set_open(v_, nullptr, &set_), OTE_OK);
    }
    void TearDown() override {
        if (set_ != nullptr) {
            EXPECT_EQ(ote_context_set_close(set_), OTE_OK);
        }
        if (v_ != nullptr) ote_verbs_close(v_);
        OteTest::TearDown();
    }
    ote_cq_lane_t *Lane(size_t ctx, uint32_t index, int channel = 1, int depth = 64) {
        ote_cq_lane_config_t cfg = {index, depth, depth, channel};
        ote_cq_lane_t *lane = nullptr;
        EXPECT_EQ(ote_cq_lane_create(ote_context_set_get(set_, ctx), &cfg, &lane), OTE_OK);
        return lane;
    }
    ote_verbs_t *v_ = nullptr;
    ote_context_set_t *set_ = nullptr;
};

TEST_F(CqTest, LaneOwnsTwoCqsAndAChannel) {
    ote_cq_lane_t *lane = Lane(0, 3, 1, 100);
    ASSERT_NE(lane, nullptr);
    EXPECT_EQ(ote_cq_lane_index(lane), 3u);
    EXPECT_EQ(ote_cq_lane_context(lane), ote_context_set_get(set_, 0));
    EXPECT_NE(ote_cq_lane_native_cq(lane, OTE_CQ_SEND), nullptr);
    EXPECT_NE(ote_cq_lane_native_cq(lane, OTE_CQ_RECV), nullptr);
    EXPECT_NE(ote_cq_lane_native_cq(lane, OTE_CQ_SEND), ote_cq_lane_native_cq(lane, OTE_CQ_RECV));
    EXPECT_EQ(ote_cq_lane_capacity(lane, OTE_CQ_SEND), 100u);
    EXPECT_GE(ote_cq_lane_channel_fd(lane), 0);
    EXPECT_EQ(ote_cq_lane_destroy(lane), OTE_OK);
    ote_cq_lane_t *plain = Lane(1, 0, 0);
    EXPECT_EQ(ote_cq_lane_channel_fd(plain), -1);
    EXPECT_EQ(ote_cq_lane_destroy(plain), OTE_OK);
    ote_cq_lane_config_t bad = {0, 0, 8, 0};
    ote_cq_lane_t *none = nullptr;
    EXPECT_EQ(ote_cq_lane_create(ote_context_set_get(set_, 0), &bad, &none), OTE_ERR_INVALID);
}

TEST_F(CqTest, CompletionsReachTheRecordOwningTheNamespaceThroughTheHook) {
    ote_cq_lane_t *lane = Lane(0, 0);
    Record a, b;
    ASSERT_EQ(ote_cq_lane_register_ns(lane, &Record::Fn, &a, &a.ns), OTE_OK);
    ASSERT_EQ(ote_cq_lane_register_ns(lane, &Record::Fn, &b, &b.ns), OTE_OK);
    EXPECT_NE(a.ns, b.ns);
    EXPECT_NE(a.ns, 0u);
    RawQp qp;
    ASSERT_EQ(qp.Create(lane), 0);
    Hook hook;
    ASSERT_EQ(ote_cq_lane_attach_qp(lane, qp.Num(), &Hook::Fn, &hook), OTE_OK);
    EXPECT_EQ(ote_cq_lane_attach_qp(lane, qp.Num(), &Hook::Fn, &hook), OTE_ERR_EXISTS);

    ASSERT_EQ(qp.PostSends({OTE_CQ_WR_ID(a.ns, 1), OTE_CQ_WR_ID(b.ns, 2), OTE_CQ_WR_ID(a.ns, 3)}),
              0);
    ASSERT_EQ(qp.PostRecvs({OTE_CQ_WR_ID(b.ns, 7)}), 0);
    Wait wa{&a, 2}, wb{&b, 2};
    ote_deadline_t d = ote_deadline_after(30 * OTE_NSEC_PER_SEC);
    ASSERT_EQ(ote_cq_lane_progress(lane, &Wait::Pred, &wa, d), OTE_OK);
    ASSERT_EQ(ote_cq_lane_progress(lane, &Wait::Pred, &wb, d), OTE_OK);
    ASSERT_EQ(a.seen.size(), 2u);
    EXPECT_EQ(a.seen[0].wr_id, OTE_CQ_WR_ID(a.ns, 1)); // SQ completes in posting order
    EXPECT_EQ(a.seen[1].wr_id, OTE_CQ_WR_ID(a.ns, 3));
    EXPECT_EQ(a.seen[0].status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(a.seen[0].dir, OTE_CQ_SEND);
    ASSERT_EQ(b.seen.size(), 2u);
    int recvs = 0;
    for (auto &s : b.seen) recvs += s.dir == OTE_CQ_RECV && OTE_CQ_WR_LOCAL(s.wr_id) == 7;
    EXPECT_EQ(recvs, 1);
    EXPECT_EQ(hook.calls.load(), 4);

    // A namespace that left: its late completion is stray, never handed to another.
    ote_cq_lane_unregister_ns(lane, a.ns);
    Record c;
    ASSERT_EQ(ote_cq_lane_register_ns(lane, &Record::Fn, &c, &c.ns), OTE_OK);
    EXPECT_GT(c.ns, b.ns); // never reused
    ASSERT_EQ(qp.PostSends({OTE_CQ_WR_ID(a.ns, 9), OTE_CQ_WR_ID(c.ns, 1)}), 0);
    Wait wc{&c, 1};
    ASSERT_EQ(ote_cq_lane_progress(lane, &Wait::Pred, &wc, d), OTE_OK);
    ote_cq_lane_stats_t st;
    ote_cq_lane_get_stats(lane, &st);
    EXPECT_EQ(st.stray, 1u);
    EXPECT_EQ(st.completions, 6u);
    EXPECT_EQ(st.errors, 6u);
    EXPECT_EQ(a.seen.size(), 2u);

    // A CQE of a QP without a hook is stray too.
    ote_cq_lane_detach_qp(lane, qp.Num());
    ASSERT_EQ(qp.PostSends({OTE_CQ_WR_ID(c.ns, 2)}), 0);
    struct StrayPred {
        ote_cq_lane_t *lane;
        static int Fn(void *arg) {
            ote_cq_lane_stats_t s;
            ote_cq_lane_get_stats(static_cast<StrayPred *>(arg)->lane, &s);
            return s.stray >= 2;
        }
    } sp{lane};
    ASSERT_EQ(ote_cq_lane_progress(lane, &StrayPred::Fn, &sp, d), OTE_OK);
    EXPECT_EQ(c.Count(), 1u);
    ASSERT_EQ(qp.Destroy(), 0);
    ote_cq_lane_unregister_ns(lane, b.ns);
    ote_cq_lane_unregister_ns(lane, c.ns);
    EXPECT_EQ(ote_cq_lane_destroy(lane), OTE_OK);
}

TEST_F(CqTest, BudgetRefusesWhatCouldOverrunTheCq) {
    ote_cq_lane_t *lane = Lane(0, 0, 0, 16);
    EXPECT_EQ(ote_cq_lane_reserve(lane, OTE_CQ_SEND, 10), OTE_OK);
    EXPECT_EQ(ote_cq_lane_reserve(lane, OTE_CQ_SEND, 7), OTE_ERR_AGAIN);
    EXPECT_EQ(ote_cq_lane_reserve(lane, OTE_CQ_SEND, 6), OTE_OK);
    EXPECT_EQ(ote_cq_lane_reserve(lane, OTE_CQ_RECV, 16), OTE_OK); // separate budget
    EXPECT_EQ(ote_cq_lane_outstanding(lane, OTE_CQ_SEND), 16u);
    ote_cq_lane_release(lane, OTE_CQ_SEND, 16);
    ote_cq_lane_release(lane, OTE_CQ_RECV, 16);
    EXPECT_EQ(ote_cq_lane_outstanding(lane, OTE_CQ_SEND), 0u);
    EXPECT_EQ(ote_cq_lane_destroy(lane), OTE_OK);
}

TEST_F(CqTest, DrainHasADeadline) {
    ote_cq_lane_t *lane = Lane(0, 0);
    ASSERT_EQ(ote_cq_lane_reserve(lane, OTE_CQ_SEND, 1), OTE_OK); // a CQE that never comes
    uint64_t t0 = ote_now_ns();
    EXPECT_EQ(ote_cq_lane_drain(lane, ote_deadline_after(50 * OTE_NSEC_PER_MSEC)), OTE_ERR_TIMEOUT);
    uint64_t took = ote_now_ns() - t0;
    EXPECT_GE(took, 50 * OTE_NSEC_PER_MSEC);
    EXPECT_LT(took, 60 * OTE_NSEC_PER_SEC); // bounded (a hang would fail), not a speed check
    EXPECT_TRUE(LogContains("drain deadline passed"));
    ote_cq_lane_release(lane, OTE_CQ_SEND, 1);
    EXPECT_EQ(ote_cq_lane_drain(lane, ote_deadline_after(30 * OTE_NSEC_PER_SEC)), OTE_OK);
    EXPECT_EQ(ote_cq_lane_destroy(lane), OTE_OK);
}

TEST_F(CqTest, WorkerIPollsLaneIAcrossContexts) {
    ote_cq_workers_t *w = nullptr;
    ASSERT_EQ(ote_cq_workers_start(2, &w), OTE_OK);
    EXPECT_EQ(ote_cq_workers_count(w), 2u);
    // Lanes 0 and 1 on both contexts; one without a channel to cover both sleep modes.
    ote_cq_lane_t *lanes[4] = {Lane(0, 0), Lane(0, 1), Lane(1, 0, 0), Lane(1, 1)};
    Record recs[4];
    RawQp qps[4];
    Hook hook;
    for (int i = 0; i < 4; i++) {
        ASSERT_EQ(ote_cq_lane_register_ns(lanes[i], &Record::Fn, &recs[i], &recs[i].ns), OTE_OK);
        ASSERT_EQ(qps[i].Create(lanes[i]), 0);
        ASSERT_EQ(ote_cq_lane_attach_qp(lanes[i], qps[i].Num(), &Hook::Fn, &hook), OTE_OK);
        ASSERT_EQ(ote_cq_workers_add(w, lanes[i]), OTE_OK);
    }
    EXPECT_EQ(ote_cq_workers_add(w, lanes[0]), OTE_ERR_EXISTS);
    EXPECT_EQ(ote_cq_lane_destroy(lanes[0]), OTE_ERR_BUSY); // QP attached, worker polling
    for (int round = 0; round < 20; round++)
        for (int i = 0; i < 4; i++)
            ASSERT_EQ(qps[i].PostSends({OTE_CQ_WR_ID(recs[i].ns, (uint64_t)round)}), 0);
    // Nobody but the workers polls: wait for their progress.
    ote_test::WaitUntil(
        [&] {
            for (int i = 0; i < 4; i++)
                if (recs[i].Count() < 20) return false;
            return true;
        },
        std::chrono::seconds(30), "20 completions on each of the 4 QPs");
    for (int i = 0; i < 4; i++) ASSERT_EQ(recs[i].Count(), 20u) << "lane " << i;
    std::set<std::thread::id> lane0, lane1;
    for (int i = 0; i < 4; i++)
        for (auto &s : recs[i].seen) (i % 2 == 0 ? lane0 : lane1).insert(s.thread);
    ASSERT_EQ(lane0.size(), 1u); // one worker for lane 0 of both contexts
    ASSERT_EQ(lane1.size(), 1u);
    EXPECT_NE(*lane0.begin(), *lane1.begin());
    EXPECT_NE(*lane0.begin(), std::this_thread::get_id());

    EXPECT_EQ(ote_cq_workers_stop(w), OTE_ERR_BUSY);
    for (int i = 0; i < 4; i++) {
        ASSERT_EQ(ote_cq_workers_remove(w, lanes[i]), OTE_OK);
        ote_cq_lane_detach_qp(lanes[i], qps[i].Num());
        ASSERT_EQ(qps[i].Destroy(), 0);
        ote_cq_lane_unregister_ns(lanes[i], recs[i].ns);
        EXPECT_EQ(ote_cq_lane_destroy(lanes[i]), OTE_OK);
    }
    EXPECT_EQ(ote_cq_workers_stop(w), OTE_OK);
}

TEST_F(CqTest, CallbackMayUnregisterItsOwnNamespace) {
    ote_cq_lane_t *lane = Lane(0, 0);
    struct SelfRemoving {
        ote_cq_lane_t *lane;
        uint32_t ns = 0;
        int calls = 0;
        static void Fn(void *arg, ote_cq_lane_t *lane, ote_cq_dir_t, const ibv_wc *) {
            auto *s = static_cast<SelfRemoving *>(arg);
            s->calls++;
            ote_cq_lane_unregister_ns(lane, s->ns);
        }
        static int Done(void *arg) { return static_cast<SelfRemoving *>(arg)->calls > 0; }
    } s{lane};
    ASSERT_EQ(ote_cq_lane_register_ns(lane, &SelfRemoving::Fn, &s, &s.ns), OTE_OK);
    RawQp qp;
    ASSERT_EQ(qp.Create(lane), 0);
    Hook hook;
    ASSERT_EQ(ote_cq_lane_attach_qp(lane, qp.Num(), &Hook::Fn, &hook), OTE_OK);
    ASSERT_EQ(qp.PostSends({OTE_CQ_WR_ID(s.ns, 1), OTE_CQ_WR_ID(s.ns, 2)}), 0);
    ASSERT_EQ(ote_cq_lane_progress(lane, &SelfRemoving::Done, &s,
                                   ote_deadline_after(30 * OTE_NSEC_PER_SEC)),
              OTE_OK);
    struct Both {
        ote_cq_lane_t *lane;
        static int Fn(void *arg) {
            ote_cq_lane_stats_t st;
            ote_cq_lane_get_stats(static_cast<Both *>(arg)->lane, &st);
            return st.completions >= 2;
        }
    } both{lane};
    ASSERT_EQ(
        ote_cq_lane_progress(lane, &Both::Fn, &both, ote_deadline_after(30 * OTE_NSEC_PER_SEC)),
        OTE_OK);
    EXPECT_EQ(s.calls, 1); // the second CQE found no record
    ote_cq_lane_detach_qp(lane, qp.Num());
    ASSERT_EQ(qp.Destroy(), 0);
    EXPECT_EQ(ote_cq_lane_destroy(lane), OTE_OK);
}

} // namespace

// Drives cq/ through the verbs fault decorator over the software provider: lane
// creation failing at each native step (nothing leaked, retry works), destroy_cq and
// destroy_comp_channel returning EBUSY (lane retained and counted, later destroy
// succeeds), a lost CQE (the charge stays owed, drain ends at its deadline), an error
// CQE (the record sees the error, the lane counts it), and a failing poll_cq.
#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "tests/cq/raw_qp.h"
#include "tests/util/test_base.h"
#include "tests/util/wait.h"

extern "C" {
#include "base/alloc.h"
#include "base/fault.h"
#include "base/status.h"
#include "base/time.h"
#include "context/context.h"
#include "cq/lane.h"
#include "cq/workers.h"
#include "verbs/fault.h"
#include "verbs/verbs.h"
}

namespace {

using ote_test::OteTest;
using ote_test::RawQp;

struct Record {
    std::vector<ibv_wc> seen;
    uint32_t ns = 0;
    static void Fn(void *arg, ote_cq_lane_t *, ote_cq_dir_t, const ibv_wc *wc) {
        static_cast<Record *>(arg)->seen.push_back(*wc);
    }
};

// Forwards and releases the lane charge the test took for each WR.
static int ChargedHook(void *, ote_cq_lane_t *lane, ote_cq_dir_t dir, const ibv_wc *) {
    ote_cq_lane_release(lane, dir, 1);
    return 1;
}

class CqFaultTest : public OteTest {
  protected:
    void SetUp() override {
        OteTest::SetUp();
        ote_verbs_t *sim = nullptr;
        ASSERT_EQ(ote_verbs_open("sim", nullptr, &sim), OTE_OK);
        ASSERT_EQ(ote_verbs_fault_wrap(sim, OTE_VERBS_FAULT_OWN_INNER, &v_), OTE_OK);
        ASSERT_EQ(ote_context_set_open(v_, nullptr, &set_), OTE_OK);
        ctx_ = ote_context_set_get(set_, 0);
    }
    void TearDown() override {
        if (set_ != nullptr) {
            EXPECT_EQ(ote_context_set_close(set_), OTE_OK);
        }
        if (v_ != nullptr) ote_verbs_close(v_);
        OteTest::TearDown();
    }
    ote_status_t Create(ote_cq_lane_t **lane, int channel = 1) {
        ote_cq_lane_config_t cfg = {0, 32, 32, channel};
        return ote_cq_lane_create(ctx_, &cfg, lane);
    }
    ote_verbs_t *v_ = nullptr;
    ote_context_set_t *set_ = nullptr;
    ote_context_t *ctx_ = nullptr;
};

TEST_F(CqFaultTest, CreationFailingAtEachStepLeaksNothingAndRetryWorks) {
    struct Step {
        ote_verbs_fault_op_t op;
        uint64_t nth;
    } steps[] = {{OTE_VERBS_FAULT_OP_CREATE_COMP_CHANNEL, 1},
                 {OTE_VERBS_FAULT_OP_CREATE_CQ, 1},
                 {OTE_VERBS_FAULT_OP_CREATE_CQ, 2}};
    for (auto &s : steps) {
        ote_verbs_fault_reset_counters(v_);
        ASSERT_EQ(ote_verbs_fault_fail(v_, s.op, OTE_FAULT_NTH, s.nth, ENOMEM), OTE_OK);
        ote_cq_lane_t *lane = nullptr;
        ote_status_t st = OTE_OK;
        ExpectErrorLogsIn([&] { st = Create(&lane); }); // the failed native call is logged
        EXPECT_EQ(ote_status_errno(st), ENOMEM);
        EXPECT_EQ(lane, nullptr);
        // Every CQ and channel that was made was destroyed again.
        EXPECT_EQ(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_DESTROY_CQ),
                  ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_CREATE_CQ) -
                      ote_verbs_fault_injected(v_, OTE_VERBS_FAULT_OP_CREATE_CQ));
        EXPECT_EQ(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_DESTROY_COMP_CHANNEL),
                  ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_CREATE_COMP_CHANNEL) -
                      ote_verbs_fault_injected(v_, OTE_VERBS_FAULT_OP_CREATE_COMP_CHANNEL));
        ote_verbs_fault_clear(v_);
    }
    ote_cq_lane_t *lane = nullptr;
    ASSERT_EQ(Create(&lane), OTE_OK);
    EXPECT_EQ(ote_cq_lane_destroy(lane), OTE_OK);
}

TEST_F(CqFaultTest, AllocationFailuresDuringCreationLeakNothing) {
    int failures = 0;
    for (uint64_t n = 1; n < 200; n++) {
        ote_cq_lane_t *lane = nullptr;
        ote_status_t st;
        {
            // The provider's own allocations fail too: their create errors are logged.
            ote_test::ErrorLogsExpected guard;
            ote_alloc_fail_nth(n);
            st = Create(&lane);
            ote_alloc_fail_disarm();
        }
        if (st == OTE_OK) {
            EXPECT_EQ(ote_cq_lane_destroy(lane), OTE_OK);
            EXPECT_GT(failures, 0);
            return;
        }
        failures++;
        EXPECT_EQ(lane, nullptr);
    }
    FAIL() << "lane creation never succeeded";
}

TEST_F(CqFaultTest, DestroyCqBusyRetainsTheLaneAndALaterDestroySucceeds) {
    ote_cq_lane_t *lane = nullptr;
    ASSERT_EQ(Create(&lane), OTE_OK);
    ibv_cq *recv_cq = ote_cq_lane_native_cq(lane, OTE_CQ_RECV);
    ASSERT_EQ(ote_verbs_fault_destroy_busy(v_, OTE_VERBS_FAULT_OP_DESTROY_CQ, recv_cq, 2), OTE_OK);
    ote_verbs_fault_reset_counters(v_);
    EXPECT_EQ(ote_status_code(ote_cq_lane_destroy(lane)), OTE_ERR_RETAINED);
    EXPECT_EQ(ote_context_retained(ctx_, OTE_RETAINED_CQ), 1u);
    // The channel cannot go while a CQ is still attached to it: kept and counted too.
    EXPECT_EQ(ote_context_retained(ctx_, OTE_RETAINED_CHANNEL), 1u);
    EXPECT_EQ(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_DESTROY_COMP_CHANNEL), 0u);
    // A retained lane accepts no new work.
    EXPECT_EQ(ote_cq_lane_reserve(lane, OTE_CQ_SEND, 1), OTE_ERR_STATE);
    EXPECT_EQ(ote_status_code(ote_cq_lane_destroy(lane)), OTE_ERR_RETAINED);
    EXPECT_EQ(ote_context_retained(ctx_, OTE_RETAINED_CQ), 1u); // still counted once
    EXPECT_EQ(ote_cq_lane_destroy(lane), OTE_OK);
    EXPECT_EQ(ote_context_retained(ctx_, OTE_RETAINED_CQ), 0u);
    EXPECT_EQ(ote_context_retained(ctx_, OTE_RETAINED_CHANNEL), 0u);
    // 1 send + 3 tries of the receive CQ; the channel once.
    EXPECT_EQ(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_DESTROY_CQ), 4u);
    EXPECT_EQ(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_DESTROY_COMP_CHANNEL), 1u);
}

TEST_F(CqFaultTest, DestroyChannelBusyIsRetainedToo) {
    ote_cq_lane_t *lane = nullptr;
    ASSERT_EQ(Create(&lane), OTE_OK);
    ASSERT_EQ(ote_verbs_fault_destroy_busy(v_, OTE_VERBS_FAULT_OP_DESTROY_COMP_CHANNEL, nullptr, 1),
              OTE_OK);
    EXPECT_EQ(ote_status_code(ote_cq_lane_destroy(lane)), OTE_ERR_RETAINED);
    EXPECT_EQ(ote_context_retained(ctx_, OTE_RETAINED_CHANNEL), 1u);
    EXPECT_EQ(ote_context_retained(ctx_, OTE_RETAINED_CQ), 0u);
    EXPECT_EQ(ote_cq_lane_destroy(lane), OTE_OK);
    EXPECT_EQ(ote_context_retained(ctx_, OTE_RETAINED_CHANNEL), 0u);
}

TEST_F(CqFaultTest, LostCqeKeepsItsChargeOwedAndDrainEndsAtTheDeadline) {
    ote_cq_lane_t *lane = nullptr;
    ASSERT_EQ(Create(&lane), OTE_OK);
    Record rec;
    ASSERT_EQ(ote_cq_lane_register_ns(lane, &Record::Fn, &rec, &rec.ns), OTE_OK);
    RawQp qp;
    ASSERT_EQ(qp.Create(lane), 0);
    ASSERT_EQ(ote_cq_lane_attach_qp(lane, qp.Num(), &ChargedHook, nullptr), OTE_OK);
    uint64_t lost = OTE_CQ_WR_ID(rec.ns, 2);
    ASSERT_EQ(ote_verbs_fault_lose_cqe_wr_id(v_, nullptr, lost), OTE_OK);
    ASSERT_EQ(ote_cq_lane_reserve(lane, OTE_CQ_SEND, 3), OTE_OK);
    ASSERT_EQ(qp.PostSends({OTE_CQ_WR_ID(rec.ns, 1), lost, OTE_CQ_WR_ID(rec.ns, 3)}), 0);
    // First the two CQEs that do come (generous deadline), so that the short drain below
    // cannot time out before it ever polled, however long this thread is preempted.
    struct Two {
        static int Fn(void *arg) { return static_cast<Record *>(arg)->seen.size() >= 2; }
    };
    ASSERT_EQ(ote_cq_lane_progress(lane, &Two::Fn, &rec, ote_deadline_after(30 * OTE_NSEC_PER_SEC)),
              OTE_OK);
    EXPECT_EQ(ote_cq_lane_drain(lane, ote_deadline_after(100 * OTE_NSEC_PER_MSEC)),
              OTE_ERR_TIMEOUT);
    ASSERT_EQ(rec.seen.size(), 2u);
    EXPECT_EQ(rec.seen[0].wr_id, OTE_CQ_WR_ID(rec.ns, 1));
    EXPECT_EQ(rec.seen[1].wr_id, OTE_CQ_WR_ID(rec.ns, 3));
    EXPECT_EQ(ote_cq_lane_outstanding(lane, OTE_CQ_SEND), 1u); // the lost one stays owed
    EXPECT_EQ(ote_verbs_fault_injected(v_, OTE_VERBS_FAULT_OP_POLL_CQ), 1u);
    // Destroying the QP proves nothing more can come: its owner releases the charge.
    ote_cq_lane_detach_qp(lane, qp.Num());
    ASSERT_EQ(qp.Destroy(), 0);
    ote_cq_lane_release(lane, OTE_CQ_SEND, 1);
    EXPECT_EQ(ote_cq_lane_drain(lane, ote_deadline_after(30 * OTE_NSEC_PER_SEC)), OTE_OK);
    ote_cq_lane_unregister_ns(lane, rec.ns);
    EXPECT_EQ(ote_cq_lane_destroy(lane), OTE_OK);
}

TEST_F(CqFaultTest, ErrorCqeReachesTheRecordWithItsStatus) {
    ote_cq_lane_t *lane = nullptr;
    ASSERT_EQ(Create(&lane, 0), OTE_OK);
    Record rec;
    ASSERT_EQ(ote_cq_lane_register_ns(lane, &Record::Fn, &rec, &rec.ns), OTE_OK);
    RawQp qp;
    ASSERT_EQ(qp.Create(lane), 0);
    ASSERT_EQ(ote_cq_lane_attach_qp(lane, qp.Num(), &ChargedHook, nullptr), OTE_OK);
    uint64_t id = OTE_CQ_WR_ID(rec.ns, 5);
    ASSERT_EQ(ote_verbs_fault_error_cqe_wr_id(v_, nullptr, id, IBV_WC_REM_ACCESS_ERR, 77), OTE_OK);
    ASSERT_EQ(ote_cq_lane_reserve(lane, OTE_CQ_SEND, 1), OTE_OK);
    ASSERT_EQ(qp.PostSends({id}), 0);
    ASSERT_EQ(ote_cq_lane_drain(lane, ote_deadline_after(30 * OTE_NSEC_PER_SEC)), OTE_OK);
    ASSERT_EQ(rec.seen.size(), 1u);
    EXPECT_EQ(rec.seen[0].status, IBV_WC_REM_ACCESS_ERR);
    EXPECT_EQ(rec.seen[0].vendor_err, 77u);
    ote_cq_lane_stats_t st;
    ote_cq_lane_get_stats(lane, &st);
    EXPECT_EQ(st.errors, 1u);
    ote_cq_lane_detach_qp(lane, qp.Num());
    ASSERT_EQ(qp.Destroy(), 0);
    ote_cq_lane_unregister_ns(lane, rec.ns);
    EXPECT_EQ(ote_cq_lane_destroy(lane), OTE_OK);
}

// A failed poll is a lane error (cq/lane.h "Faults and replacement"): the lane is FAULTED
// (logged once) but goes on polling what its CQs still give.
TEST_F(CqFaultTest, FailingPollIsReportedAndCountedThenPollingRecovers) {
    ote_cq_lane_t *lane = nullptr;
    ASSERT_EQ(Create(&lane), OTE_OK);
    ASSERT_EQ(ote_verbs_fault_fail(v_, OTE_VERBS_FAULT_OP_POLL_CQ, OTE_FAULT_NTH, 1, EIO), OTE_OK);
    int n = -1;
    ote_test::ErrorLogsExpected lane_error;
    ote_status_t st = ote_cq_lane_poll(lane, &n);
    EXPECT_EQ(ote_cq_lane_state(lane, nullptr), OTE_CQ_LANE_FAULTED);
    EXPECT_EQ(ote_status_code(st), OTE_ERR_NATIVE);
    EXPECT_EQ(ote_status_errno(st), EIO);
    ote_cq_lane_stats_t stats;
    ote_cq_lane_get_stats(lane, &stats);
    EXPECT_EQ(stats.poll_failures, 1u);
    EXPECT_EQ(ote_cq_lane_poll(lane, &n), OTE_OK);
    EXPECT_EQ(n, 0);
    EXPECT_EQ(ote_cq_lane_destroy(lane), OTE_OK);
}

// The injected poll failure must land in the worker: the test thread never polls this
// lane (no drain/progress: it only waits, without polling, for the worker to deliver),
// so the third poll_cq of the lane is the worker's third, wherever the scheduler runs it.
TEST_F(CqFaultTest, WorkersKeepPollingThroughPollFailures) {
    struct Seen {
        std::mutex mu;
        std::vector<uint64_t> wr_ids;
        std::set<std::thread::id> threads;
        uint32_t ns = 0;
        static void Fn(void *arg, ote_cq_lane_t *, ote_cq_dir_t, const ibv_wc *wc) {
            auto *self = static_cast<Seen *>(arg);
            std::lock_guard<std::mutex> g(self->mu);
            self->wr_ids.push_back(wc->wr_id);
            self->threads.insert(std::this_thread::get_id());
        }
        size_t Count() {
            std::lock_guard<std::mutex> g(mu);
            return wr_ids.size();
        }
    } rec;
    ote_cq_lane_t *lane = nullptr;
    ASSERT_EQ(Create(&lane), OTE_OK);
    ASSERT_EQ(ote_cq_lane_register_ns(lane, &Seen::Fn, &rec, &rec.ns), OTE_OK);
    RawQp qp;
    ASSERT_EQ(qp.Create(lane), 0);
    ASSERT_EQ(ote_cq_lane_attach_qp(lane, qp.Num(), &ChargedHook, nullptr), OTE_OK);
    ote_cq_workers_t *w = nullptr;
    ASSERT_EQ(ote_cq_workers_start(1, &w), OTE_OK);
    ote_test::ErrorLogsExpected lane_error; // the failed poll faults the lane (logged)
    ASSERT_EQ(ote_verbs_fault_fail(v_, OTE_VERBS_FAULT_OP_POLL_CQ, OTE_FAULT_NTH, 3, EIO), OTE_OK);
    ASSERT_EQ(ote_cq_workers_add(w, lane), OTE_OK);
    // The worker's first polls (and the failing third) may come before or after the
    // posts; either way it must keep polling and deliver all four.
    ASSERT_EQ(ote_cq_lane_reserve(lane, OTE_CQ_SEND, 4), OTE_OK);
    ASSERT_EQ(qp.PostSends({OTE_CQ_WR_ID(rec.ns, 1), OTE_CQ_WR_ID(rec.ns, 2),
                            OTE_CQ_WR_ID(rec.ns, 3), OTE_CQ_WR_ID(rec.ns, 4)}),
              0);
    // Wait (generous deadline, no polling here) until the failure was injected, the worker
    // delivered every completion and polled at least once more than the failing third
    // (all four may have come in its first poll, before the failure: then only a later
    // poll shows that it went on).
    ote_test::WaitUntil(
        [&] {
            return rec.Count() >= 4 &&
                   ote_verbs_fault_injected(v_, OTE_VERBS_FAULT_OP_POLL_CQ) >= 1 &&
                   ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_POLL_CQ) >= 4;
        },
        std::chrono::seconds(30), "4 completions, the failed poll and 4 polls in all");
    ASSERT_EQ(ote_cq_workers_remove(w, lane), OTE_OK);
    EXPECT_EQ(ote_verbs_fault_injected(v_, OTE_VERBS_FAULT_OP_POLL_CQ), 1u);
    EXPECT_GE(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_POLL_CQ), 4u); // it polled on
    ote_cq_lane_stats_t stats;
    ote_cq_lane_get_stats(lane, &stats);
    EXPECT_EQ(stats.poll_failures, 1u); // the one injected failure, seen by the lane
    EXPECT_EQ(stats.completions, 4u);
    EXPECT_TRUE(LogContains("poll_cq(") && LogContains("failed: errno 5"));
    {
        std::lock_guard<std::mutex> g(rec.mu);
        ASSERT_EQ(rec.wr_ids.size(), 4u);
        for (uint64_t i = 0; i < 4; i++) EXPECT_EQ(rec.wr_ids[i], OTE_CQ_WR_ID(rec.ns, i + 1));
        // Delivered by the worker, never by this thread.
        ASSERT_EQ(rec.threads.size(), 1u);
        EXPECT_NE(*rec.threads.begin(), std::this_thread::get_id());
    }
    EXPECT_EQ(ote_cq_lane_outstanding(lane, OTE_CQ_SEND), 0u);
    EXPECT_EQ(ote_cq_workers_stop(w), OTE_OK);
    ote_cq_lane_detach_qp(lane, qp.Num());
    ASSERT_EQ(qp.Destroy(), 0);
    ote_cq_lane_unregister_ns(lane, rec.ns);
    EXPECT_EQ(ote_cq_lane_destroy(lane), OTE_OK);
}

// The layer's own fault points: lane creation and worker start fail with the armed
// status before anything is made (no CQ, no thread, no output), then succeed.
TEST_F(CqFaultTest, FaultPointsFailLaneCreateAndWorkerStartBeforeAnythingIsMade) {
    ote_verbs_fault_reset_counters(v_);
    ASSERT_EQ(ote_fault_arm("cq.lane_create", OTE_FAULT_NTH, 1, OTE_ERR_NOMEM, 0), OTE_OK);
    ote_cq_lane_t *lane = nullptr;
    EXPECT_EQ(Create(&lane), OTE_ERR_NOMEM);
    EXPECT_EQ(lane, nullptr);
    EXPECT_EQ(ote_fault_failures("cq.lane_create"), 1u);
    EXPECT_EQ(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_CREATE_CQ), 0u);
    EXPECT_EQ(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_CREATE_COMP_CHANNEL), 0u);
    ASSERT_EQ(Create(&lane), OTE_OK);
    ASSERT_EQ(ote_fault_arm("cq.workers_start", OTE_FAULT_EVERY, 0, OTE_ERR_NATIVE, EAGAIN),
              OTE_OK);
    ote_cq_workers_t *w = nullptr;
    int fds = ote_test::CountOpenFds();
    ote_status_t st = ote_cq_workers_start(2, &w);
    EXPECT_EQ(ote_status_code(st), OTE_ERR_NATIVE);
    EXPECT_EQ(ote_status_errno(st), EAGAIN);
    EXPECT_EQ(w, nullptr);
    EXPECT_EQ(ote_test::CountOpenFds(), fds); // no wake fd left behind
    EXPECT_EQ(ote_status_code(ote_cq_workers_start_numa(1, -1, &w)), OTE_ERR_NATIVE); // same path
    EXPECT_EQ(w, nullptr);
    EXPECT_EQ(ote_fault_failures("cq.workers_start"), 2u);
    ASSERT_EQ(ote_fault_disarm("cq.workers_start"), OTE_OK);
    ASSERT_EQ(ote_cq_workers_start(2, &w), OTE_OK);
    ASSERT_EQ(ote_cq_workers_add(w, lane), OTE_OK);
    ASSERT_EQ(ote_cq_workers_remove(w, lane), OTE_OK);
    EXPECT_EQ(ote_cq_workers_stop(w), OTE_OK);
    EXPECT_EQ(ote_cq_lane_destroy(lane), OTE_OK);
}

} // namespace

// Lane errors and lane replacement (cq/lane.h "Faults and replacement"), over the verbs
// fault decorator and the software provider: an IBV_EVENT_CQ_ERR naming a lane's CQ, a
// failed poll_cq and a CQ the sim made unusable each fault that lane (and only it) with a
// device-scope cause; a faulted lane attaches no new QP; once its QPs are gone it
// replaces its two CQs in place (two destroy_cq, two create_cq, no PD or MR call), keeps
// its namespaces and works again; an old CQ that will not die is retained and retried.
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <mutex>
#include <vector>

#include "tests/cq/raw_qp.h"
#include "tests/util/test_base.h"

extern "C" {
#include "base/retained.h"
#include "base/status.h"
#include "base/time.h"
#include "context/context.h"
#include "cq/lane.h"
#include "verbs/fault.h"
#include "verbs/sim/sim.h"
#include "verbs/verbs.h"
}

namespace {

using ote_test::OteTest;
using ote_test::RawQp;

struct Record {
    std::mutex mu;
    std::vector<ibv_wc> seen;
    uint32_t ns = 0;
    static void Fn(void *arg, ote_cq_lane_t *, ote_cq_dir_t, const ibv_wc *wc) {
        auto *r = static_cast<Record *>(arg);
        std::lock_guard<std::mutex> g(r->mu);
        r->seen.push_back(*wc);
    }
    size_t Count() {
        std::lock_guard<std::mutex> g(mu);
        return seen.size();
    }
    static int Has(void *arg) { return static_cast<Record *>(arg)->Count() >= 2; }
};

int Forward(void *, ote_cq_lane_t *, ote_cq_dir_t, const ibv_wc *) { return 1; }

class LaneRecoveryTest : public OteTest {
  protected:
    void SetUp() override {
        OteTest::SetUp();
        ote_verbs_t *sim = nullptr;
        ASSERT_EQ(ote_verbs_open("sim", nullptr, &sim), OTE_OK);
        ASSERT_EQ(ote_verbs_fault_wrap(sim, OTE_VERBS_FAULT_OWN_INNER, &v_), OTE_OK);
        ASSERT_EQ(ote_context_set_open(v_, nullptr, &set_), OTE_OK);
        ctx_ = ote_context_set_get(set_, 0);
        pd_ = ote_context_pd(ctx_);
        for (uint32_t i = 0; i < 2; i++) {
            ote_cq_lane_config_t cfg = {i, 32, 32, 1};
            ASSERT_EQ(ote_cq_lane_create(ctx_, &cfg, &lanes_[i]), OTE_OK);
        }
        ote_verbs_fault_reset_counters(v_);
    }
    void TearDown() override {
        for (auto *l : lanes_) {
            if (l != nullptr) {
                EXPECT_EQ(ote_cq_lane_destroy(l), OTE_OK);
            }
        }
        if (set_ != nullptr) {
            EXPECT_EQ(ote_context_set_close(set_), OTE_OK);
        }
        if (v_ != nullptr) ote_verbs_close(v_);
        OteTest::TearDown();
    }
    // The lane's async CQ_ERR, as the device raises it, consumed as the monitor does.
    void RaiseCqErr(ote_cq_lane_t *lane) {
        ibv_async_event ev;
        memset(&ev, 0, sizeof(ev));
        ev.event_type = IBV_EVENT_CQ_ERR;
        ev.element.cq = ote_cq_lane_native_cq(lane, OTE_CQ_SEND);
        ASSERT_EQ(ote_verbs_fault_inject_async_event(v_, ote_context_native(ctx_), &ev), OTE_OK);
        size_t handled = 0;
        ASSERT_EQ(ote_context_set_poll_events(set_, &handled), OTE_OK);
        EXPECT_EQ(handled, 1u);
    }
    // What replacement did natively: two CQs destroyed and two made, nothing else.
    void ExpectOnlyCqsReplaced() {
        EXPECT_EQ(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_DESTROY_CQ), 2u);
        EXPECT_EQ(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_CREATE_CQ), 2u);
        EXPECT_EQ(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_ALLOC_PD), 0u);
        EXPECT_EQ(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_DEALLOC_PD), 0u);
        EXPECT_EQ(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_REG_MR), 0u);
        EXPECT_EQ(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_DEREG_MR), 0u);
        EXPECT_EQ(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_CREATE_COMP_CHANNEL), 0u);
        EXPECT_EQ(ote_context_pd(ctx_), pd_);
    }
    // A namespace registered before the fault still gets the replacement's completions.
    void ExpectWorksAgain(ote_cq_lane_t *lane, Record *rec) {
        RawQp qp;
        ASSERT_EQ(qp.Create(lane), 0); // on the new CQs
        ASSERT_EQ(ote_cq_lane_attach_qp(lane, qp.Num(), &Forward, nullptr), OTE_OK);
        ASSERT_EQ(qp.PostSends({OTE_CQ_WR_ID(rec->ns, 1), OTE_CQ_WR_ID(rec->ns, 2)}), 0);
        ASSERT_EQ(ote_cq_lane_progress(lane, &Record::Has, rec,
                                       ote_deadline_after(30 * OTE_NSEC_PER_SEC)),
                  OTE_OK);
        EXPECT_EQ(rec->seen[0].wr_id, OTE_CQ_WR_ID(rec->ns, 1));
        ote_cq_lane_detach_qp(lane, qp.Num());
        EXPECT_EQ(qp.Destroy(), 0);
    }
    ote_verbs_t *v_ = nullptr;
    ote_context_set_t *set_ = nullptr;
    ote_context_t *ctx_ = nullptr;
    ibv_pd *pd_ = nullptr;
    ote_cq_lane_t *lanes_[2] = {nullptr, nullptr};
};

// CQ_ERR naming lane 0's CQ: lane 0 FAULTED (OTE_ERR_FENCED, EIO), lane 1 untouched; no new
// QP on lane 0; replace is BUSY while its QP is attached, then replaces only the CQs; the
// namespace registered before the fault gets the new CQs' completions.
TEST_F(LaneRecoveryTest, CqErrEventFaultsItsLaneWhichIsReplacedOnceItsQpsAreGone) {
    ote_cq_lane_t *lane = lanes_[0];
    Record rec;
    ASSERT_EQ(ote_cq_lane_register_ns(lane, &Record::Fn, &rec, &rec.ns), OTE_OK);
    RawQp old_qp;
    ASSERT_EQ(old_qp.Create(lane), 0);
    ASSERT_EQ(ote_cq_lane_attach_qp(lane, old_qp.Num(), &Forward, nullptr), OTE_OK);
    ote_test::ErrorLogsExpected fault_logs; // the lane error is logged
    RaiseCqErr(lane);
    ote_status_t cause = OTE_OK;
    ASSERT_EQ(ote_cq_lane_state(lane, &cause), OTE_CQ_LANE_FAULTED);
    EXPECT_EQ(ote_status_code(cause), OTE_ERR_FENCED);
    EXPECT_EQ(ote_status_errno(cause), EIO);
    EXPECT_EQ(ote_cq_lane_state(lanes_[1], nullptr), OTE_CQ_LANE_HEALTHY);

    RawQp refused;
    ASSERT_EQ(refused.Create(lane), 0);
    EXPECT_EQ(ote_cq_lane_attach_qp(lane, refused.Num(), &Forward, nullptr), cause);
    ASSERT_EQ(refused.Destroy(), 0);

    EXPECT_EQ(ote_cq_lane_replace(lane), OTE_ERR_BUSY); // its QP still holds the old CQs
    EXPECT_EQ(ote_cq_lane_state(lane, nullptr), OTE_CQ_LANE_FAULTED);
    ote_cq_lane_detach_qp(lane, old_qp.Num());
    ASSERT_EQ(old_qp.Destroy(), 0);
    ote_verbs_fault_reset_counters(v_);
    ASSERT_EQ(ote_cq_lane_replace(lane), OTE_OK);
    EXPECT_EQ(ote_cq_lane_state(lane, nullptr), OTE_CQ_LANE_HEALTHY);
    ExpectOnlyCqsReplaced();
    ote_cq_lane_stats_t st;
    ote_cq_lane_get_stats(lane, &st);
    EXPECT_EQ(st.replacements, 1u);
    EXPECT_EQ(ote_cq_lane_replace(lane), OTE_OK); // healthy: nothing to do
    EXPECT_EQ(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_CREATE_CQ), 2u);
    ExpectWorksAgain(lane, &rec);
    ote_cq_lane_unregister_ns(lane, rec.ns);
}

// A failed poll_cq (injected EAGAIN-free errno) faults the lane with that errno; a CQ the
// sim made unusable (poll fails -EIO forever, CQ_ERR raised) does too, and its lane is
// replaced all the same (the broken CQ is destroyed).
TEST_F(LaneRecoveryTest, PollErrorsFaultTheLaneAndABrokenCqIsReplaced) {
    ote_test::ErrorLogsExpected fault_logs;
    ASSERT_EQ(ote_verbs_fault_fail(v_, OTE_VERBS_FAULT_OP_POLL_CQ, OTE_FAULT_NTH, 1, ENOMEM),
              OTE_OK);
    int n = 0;
    EXPECT_EQ(ote_status_code(ote_cq_lane_poll(lanes_[0], &n)), OTE_ERR_NATIVE);
    ote_status_t cause = OTE_OK;
    ASSERT_EQ(ote_cq_lane_state(lanes_[0], &cause), OTE_CQ_LANE_FAULTED);
    EXPECT_EQ(cause, ote_status_make(OTE_ERR_FENCED, ENOMEM));
    ote_verbs_fault_clear(v_);
    ote_verbs_fault_reset_counters(v_);
    ASSERT_EQ(ote_cq_lane_replace(lanes_[0]), OTE_OK);
    ExpectOnlyCqsReplaced();

    ote_cq_lane_t *lane = lanes_[1];
    Record rec;
    ASSERT_EQ(ote_cq_lane_register_ns(lane, &Record::Fn, &rec, &rec.ns), OTE_OK);
    ASSERT_EQ(ote_sim_cq_error(ote_verbs_fault_inner(v_), ote_cq_lane_native_cq(lane, OTE_CQ_RECV)),
              OTE_OK);
    EXPECT_EQ(ote_status_errno(ote_cq_lane_poll(lane, &n)), EIO);
    ASSERT_EQ(ote_cq_lane_state(lane, &cause), OTE_CQ_LANE_FAULTED);
    EXPECT_EQ(ote_status_code(cause), OTE_ERR_FENCED);
    EXPECT_EQ(ote_status_code(ote_cq_lane_poll(lane, &n)), OTE_ERR_NATIVE); // broken for good
    ASSERT_EQ(ote_context_set_poll_events(set_, nullptr), OTE_OK);          // its CQ_ERR, acked
    ote_verbs_fault_reset_counters(v_);
    ASSERT_EQ(ote_cq_lane_replace(lane), OTE_OK);
    ExpectOnlyCqsReplaced();
    EXPECT_EQ(ote_cq_lane_poll(lane, &n), OTE_OK);
    ExpectWorksAgain(lane, &rec);
    ote_cq_lane_unregister_ns(lane, rec.ns);
}

// An old CQ whose destroy fails (EBUSY) is retained and counted; the lane stays FAULTED
// and refuses QPs; the next replace destroys it and makes the new CQs.
TEST_F(LaneRecoveryTest, OldCqThatWillNotDieIsRetainedAndTheReplacementRetried) {
    ote_cq_lane_t *lane = lanes_[0];
    ote_test::ErrorLogsExpected fault_logs;
    RaiseCqErr(lane);
    uint64_t retained0 = ote_retained_total();
    ASSERT_EQ(ote_verbs_fault_destroy_busy(v_, OTE_VERBS_FAULT_OP_DESTROY_CQ, nullptr, 1), OTE_OK);
    EXPECT_EQ(ote_status_code(ote_cq_lane_replace(lane)), OTE_ERR_RETAINED);
    EXPECT_EQ(ote_retained_total(), retained0 + 1);
    EXPECT_EQ(ote_context_retained(ctx_, OTE_RETAINED_CQ), 1u);
    EXPECT_EQ(ote_cq_lane_state(lane, nullptr), OTE_CQ_LANE_FAULTED);
    ASSERT_EQ(ote_cq_lane_replace(lane), OTE_OK);
    EXPECT_EQ(ote_retained_total(), retained0);
    EXPECT_EQ(ote_context_retained(ctx_, OTE_RETAINED_CQ), 0u);
    EXPECT_EQ(ote_cq_lane_state(lane, nullptr), OTE_CQ_LANE_HEALTHY);
}

} // namespace

namespace {

// Across a reopen of the lanes' context (a lost event consumer): a healthy lane is not
// unbound, a faulted one not while a QP is attached; unbound, each lane has destroyed its
// two CQs and its channel; after ote_context_reopen, replace makes a new channel and CQs
// on the new native context, and the namespace registered before gets their completions.
TEST_F(LaneRecoveryTest, UnbindThenReplaceMovesTheLaneToAReopenedContext) {
    Record rec;
    ote_cq_lane_t *lane = lanes_[0];
    ASSERT_EQ(ote_cq_lane_register_ns(lane, &Record::Fn, &rec, &rec.ns), OTE_OK);
    EXPECT_EQ(ote_cq_lane_unbind(lane), OTE_ERR_STATE); // healthy
    RawQp qp;
    ASSERT_EQ(qp.Create(lane), 0);
    ASSERT_EQ(ote_cq_lane_attach_qp(lane, qp.Num(), &Forward, nullptr), OTE_OK);
    {
        ote_test::ErrorLogsExpected lost_log;
        ASSERT_EQ(
            ote_verbs_fault_fail(v_, OTE_VERBS_FAULT_OP_GET_ASYNC_EVENT, OTE_FAULT_NTH, 1, EIO),
            OTE_OK);
        (void)ote_context_set_poll_events(set_, nullptr);
        ote_verbs_fault_clear(v_);
        ASSERT_EQ(ote_context_state(ctx_), OTE_CONTEXT_LOST);
        for (auto *l : lanes_) ote_cq_lane_fault(l, ote_context_check(ctx_)); // logged
    }
    EXPECT_EQ(ote_cq_lane_unbind(lane), OTE_ERR_BUSY); // a QP attached
    ote_cq_lane_detach_qp(lane, qp.Num());
    EXPECT_EQ(qp.Destroy(), 0);
    ote_verbs_fault_reset_counters(v_);
    for (auto *l : lanes_) ASSERT_EQ(ote_cq_lane_unbind(l), OTE_OK);
    EXPECT_EQ(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_DESTROY_CQ), 4u);
    EXPECT_EQ(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_DESTROY_COMP_CHANNEL), 2u);
    ASSERT_EQ(ote_context_reopen(ctx_), OTE_OK);
    for (auto *l : lanes_) ASSERT_EQ(ote_cq_lane_replace(l), OTE_OK);
    EXPECT_EQ(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_CREATE_COMP_CHANNEL), 2u);
    EXPECT_EQ(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_CREATE_CQ), 4u);
    ASSERT_EQ(ote_context_resume(ctx_), OTE_OK);
    EXPECT_EQ(ote_cq_lane_native_cq(lane, OTE_CQ_SEND)->context, ote_context_native(ctx_));
    EXPECT_GE(ote_cq_lane_channel_fd(lane), 0);
    ExpectWorksAgain(lane, &rec);
    ote_cq_lane_unregister_ns(lane, rec.ns);
}

} // namespace

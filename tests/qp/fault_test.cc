// Drives qp/ through the verbs fault decorator over the software provider: create_qp
// and the INIT/RTR/RTS transitions failing (nothing leaked, usable on retry), a post_send
// accepting only part of a window (exact accounting, no double completion), a post whose
// outcome is unknown (fenced), a lost CQE (deadline, fence, nothing freed until native
// destruction proves it), destroy_qp and dereg_mr EBUSY (retained, counted, retried),
// a port going down under in-flight work (error completions, not a hang), and a QP
// abandoned on a lane whose CQ broke (its owed WRs ended with the lane's cause).
#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "tests/qp/qp_fixture.h"
#include "tests/util/wait.h"

extern "C" {
#include "base/alloc.h"
#include "base/fault.h"
#include "verbs/sim/sim.h"
}

namespace {

using ote_test::ErrorLogsExpected;
using ote_test::QpFixture;
using ote_test::Record;

class QpFaultTest : public QpFixture {
  protected:
    void SetUp() override {
        QpFixture::SetUp();
        // The default two devices; lost peers fail within 300 ms instead of 3 s.
        config_ = std::string(ote_sim_default_config()) + ";retry_cap_ms=300";
        Start(true, config_.c_str());
    }
    std::string config_;
    uint64_t Calls(ote_verbs_fault_op_t op) { return ote_verbs_fault_calls(v_, op); }

    // Post one byte-checked WRITE over a fresh pair to prove the layer is usable.
    void ProveUsable(ote_qp_t *a, ote_qp_t *b, uint64_t id) {
        (void)b;
        for (size_t i = 0; i < 4096; i++) mem_[0][i] = (uint8_t)(id + i);
        Wr w;
        Rdma(&w, 0, id, IBV_WR_RDMA_WRITE, 0, 4096);
        ote_qp_post_result_t res;
        ASSERT_EQ(ote_qp_post_send(a, &w.wr, Soon(), &res), OTE_OK);
        ASSERT_EQ(ote_qp_wait_idle(a, Soon()), OTE_OK);
        EXPECT_EQ(rec_[0].First(id).status, IBV_WC_SUCCESS);
        EXPECT_EQ(memcmp(mem_[0].data(), mem_[1].data(), 4096), 0);
    }
};

// A QP whose lane's send CQ broke (ote_sim_cq_error: polls fail, the QP's flushes are lost
// with the CQ) still owes its WRs. ote_qp_abandon(cause) fences it with that cause,
// destroys it natively at once (the failed poll faults the lane: no flush to wait for)
// and ends each owed WR with one synthesized flush (vendor_err DESTROYED); later posts
// are refused with the cause; the QP records the route generation it was built on.
// ote_qp_destroy then only detaches it, and its lane, with no QP left, is replaced and
// carries a byte-checked WRITE on a new pair. Without abandon the WRs stay owed until a
// destroy's flush deadline, and a post on the QP is refused only as FENCED.
TEST_F(QpFaultTest, AbandonEndsTheOwedWorkOfABrokenLaneWithItsCause) {
    ote_qp_config_t cfg = Config(16);
    ote_qp_t *a = MakeQp(0, cfg);
    ote_qp_t *b = MakeQp(1, cfg);
    ASSERT_EQ(ConnectPair(a, b), OTE_OK);
    ote_context_info_t info;
    ote_context_get_info(ctx_[0], &info);
    EXPECT_EQ(ote_qp_route_generation(a), info.route_generation);
    ErrorLogsExpected guard; // the lane error
    ASSERT_EQ(ote_sim_cq_error(sim_, ote_cq_lane_native_cq(lane_[0], OTE_CQ_SEND)), OTE_OK);
    auto w = Window(0, 10, 3, 4096);
    ote_qp_post_result_t res;
    ASSERT_EQ(ote_qp_post_send(a, &w[0].wr, Soon(), &res), OTE_OK); // QP_FATAL not seen yet
    const ote_status_t cause = ote_status_make(OTE_ERR_FENCED, EIO);
    uint64_t destroys = Calls(OTE_VERBS_FAULT_OP_DESTROY_QP);
    uint64_t t0 = ote_now_ns();
    ASSERT_EQ(ote_qp_abandon(a, cause, Soon()), OTE_OK);
    EXPECT_LT(ote_now_ns() - t0, 10 * OTE_NSEC_PER_SEC) << "waited for flushes that cannot come";
    EXPECT_EQ(Calls(OTE_VERBS_FAULT_OP_DESTROY_QP), destroys + 1);
    for (uint64_t id = 10; id < 13; id++) {
        ASSERT_EQ(rec_[0].Count(id), 1u) << "WR " << id;
        EXPECT_EQ(rec_[0].First(id).status, IBV_WC_WR_FLUSH_ERR);
        EXPECT_EQ(rec_[0].First(id).vendor_err, OTE_QP_VENDOR_ERR_DESTROYED);
    }
    EXPECT_EQ(ote_qp_fence_cause(a), cause);
    auto w2 = Window(0, 20, 1, 4096);
    EXPECT_EQ(ote_qp_post_send(a, &w2[0].wr, Soon(), &res), cause);
    EXPECT_EQ(ote_cq_lane_state(lane_[0], nullptr), OTE_CQ_LANE_FAULTED);
    EXPECT_EQ(ote_cq_lane_replace(lane_[0]), OTE_ERR_BUSY); // a is still attached
    EXPECT_EQ(ote_qp_destroy(a, Soon()), OTE_OK);
    Forget(a);
    ASSERT_EQ(ote_context_set_poll_events(set_, nullptr), OTE_OK); // CQ_ERR, QP_FATAL acked
    ASSERT_EQ(ote_cq_lane_replace(lane_[0]), OTE_OK);
    ote_qp_t *c = MakeQp(0, cfg);
    ote_qp_t *d = MakeQp(1, cfg);
    ASSERT_EQ(ConnectPair(c, d), OTE_OK);
    ProveUsable(c, d, 30);
}

TEST_F(QpFaultTest, CreateQpFailingLeaksNothingAndRetrySucceeds) {
    ote_verbs_fault_reset_counters(v_);
    ASSERT_EQ(ote_verbs_fault_fail(v_, OTE_VERBS_FAULT_OP_CREATE_QP, OTE_FAULT_NTH, 1, ENOMEM),
              OTE_OK);
    ote_qp_t *qp = nullptr;
    ote_qp_config_t cfg = Config(16, 8, 128); // with an RQ MR to unwind
    ote_status_t st = OTE_OK;
    ExpectErrorLogsIn([&] { st = ote_qp_create(lane_[0], &cfg, &qp); });
    EXPECT_EQ(ote_status_errno(st), ENOMEM);
    EXPECT_EQ(qp, nullptr);
    EXPECT_EQ(Calls(OTE_VERBS_FAULT_OP_DEREG_MR), Calls(OTE_VERBS_FAULT_OP_REG_MR));
    // INIT failing: the created QP is destroyed again.
    ASSERT_EQ(ote_verbs_fault_fail(v_, OTE_VERBS_FAULT_OP_MODIFY_QP, OTE_FAULT_NTH, 1, EINVAL),
              OTE_OK);
    ExpectErrorLogsIn([&] { st = ote_qp_create(lane_[0], &cfg, &qp); });
    EXPECT_EQ(ote_status_errno(st), EINVAL);
    EXPECT_EQ(Calls(OTE_VERBS_FAULT_OP_DESTROY_QP), 1u);
    EXPECT_EQ(Calls(OTE_VERBS_FAULT_OP_DEREG_MR), Calls(OTE_VERBS_FAULT_OP_REG_MR));
    EXPECT_EQ(ote_cq_lane_destroy(lane_[0]), OTE_OK); // nothing left attached
    lane_[0] = nullptr;
    ote_cq_lane_config_t lc = {0, 256, 256, 1};
    ASSERT_EQ(ote_cq_lane_create(ctx_[0], &lc, &lane_[0]), OTE_OK);
    ASSERT_EQ(ote_cq_lane_register_ns(lane_[0], &ote_test::Record::Fn, &rec_[0], &rec_[0].ns),
              OTE_OK);
    ote_qp_t *a = MakeQp(0, cfg);
    ote_qp_t *b = MakeQp(1, cfg);
    ASSERT_EQ(ConnectPair(a, b), OTE_OK);
    ProveUsable(a, b, 1);
}

TEST_F(QpFaultTest, AllocationFailuresDuringCreateAndConnectLeakNothing) {
    ote_qp_config_t cfg = Config(16, 4, 64);
    int failures = 0;
    for (uint64_t n = 1; n < 300; n++) {
        ote_qp_t *qp = nullptr;
        ote_status_t st;
        {
            ErrorLogsExpected guard; // the provider's own allocations fail too
            ote_alloc_fail_nth(n);
            st = ote_qp_create(lane_[0], &cfg, &qp);
            ote_alloc_fail_disarm();
        }
        if (st != OTE_OK) {
            failures++;
            EXPECT_EQ(qp, nullptr);
            continue;
        }
        EXPECT_EQ(ote_qp_destroy(qp, Soon()), OTE_OK);
        EXPECT_GT(failures, 0);
        break;
    }
    EXPECT_GT(failures, 0);
    EXPECT_EQ(ote_context_retained(ctx_[0], OTE_RETAINED_QP), 0u);
    EXPECT_EQ(ote_context_retained(ctx_[0], OTE_RETAINED_MR), 0u);
    // Connect under allocation failure: a failed connect can be retried.
    ote_qp_t *a = MakeQp(0, cfg);
    ote_qp_t *b = MakeQp(1, cfg);
    ote_qp_path_t pa, pb;
    ote_qp_local_path(a, &pa);
    ote_qp_local_path(b, &pb);
    ote_status_t st;
    {
        ErrorLogsExpected guard;
        ote_alloc_fail_nth(1);
        st = ote_qp_connect(a, &pb);
        ote_alloc_fail_disarm();
    }
    EXPECT_NE(st, OTE_OK);
    ASSERT_EQ(ote_qp_connect(a, &pb), OTE_OK);
    ASSERT_EQ(ote_qp_connect(b, &pa), OTE_OK);
    ProveUsable(a, b, 1);
    // Every lane charge is accounted for: destroying the QPs returns all of them.
    Forget(a);
    Forget(b);
    EXPECT_EQ(ote_qp_destroy(a, Soon()), OTE_OK);
    EXPECT_EQ(ote_qp_destroy(b, Soon()), OTE_OK);
    EXPECT_EQ(ote_cq_lane_outstanding(lane_[0], OTE_CQ_RECV), 0u);
    EXPECT_EQ(ote_cq_lane_outstanding(lane_[1], OTE_CQ_RECV), 0u);
}

TEST_F(QpFaultTest, ModifyToRtrFailingLeavesInitAndConnectRetrySucceeds) {
    ote_qp_t *a = MakeQp(0, Config(16, 4, 64));
    ote_qp_t *b = MakeQp(1, Config(16, 4, 64));
    ote_qp_path_t pa, pb;
    ote_qp_local_path(a, &pa);
    ote_qp_local_path(b, &pb);
    ASSERT_EQ(ote_verbs_fault_fail(v_, OTE_VERBS_FAULT_OP_MODIFY_QP, OTE_FAULT_NTH, 1, EINVAL),
              OTE_OK);
    ExpectErrorLogsIn([&] { EXPECT_EQ(ote_status_errno(ote_qp_connect(a, &pb)), EINVAL); });
    ote_qp_stats_t st;
    ote_qp_get_stats(a, &st);
    EXPECT_EQ(st.state, IBV_QPS_INIT);
    EXPECT_EQ(st.fenced, 0);
    EXPECT_EQ(st.rq_posted, 4u); // receives posted in INIT stay posted
    EXPECT_TRUE(LogContains("INIT->RTR"));
    ASSERT_EQ(ote_qp_connect(a, &pb), OTE_OK);
    ASSERT_EQ(ote_qp_connect(b, &pa), OTE_OK);
    ote_qp_get_stats(a, &st);
    EXPECT_EQ(st.rq_posted, 4u); // not posted twice
    EXPECT_EQ(ote_cq_lane_outstanding(lane_[0], OTE_CQ_RECV), 4u);
    ProveUsable(a, b, 1);
}

TEST_F(QpFaultTest, ModifyToRtsFailingReturnsToInitAndConnectRetrySucceeds) {
    ote_qp_t *a = MakeQp(0, Config(16, 4, 64));
    ote_qp_t *b = MakeQp(1, Config(16, 4, 64));
    ote_qp_path_t pa, pb;
    ote_qp_local_path(a, &pa);
    ote_qp_local_path(b, &pb);
    ASSERT_EQ(ote_verbs_fault_fail(v_, OTE_VERBS_FAULT_OP_MODIFY_QP, OTE_FAULT_NTH, 2, EINVAL),
              OTE_OK);
    ExpectErrorLogsIn([&] { EXPECT_NE(ote_qp_connect(a, &pb), OTE_OK); });
    ote_qp_stats_t st;
    ote_qp_get_stats(a, &st);
    EXPECT_EQ(st.state, IBV_QPS_INIT);
    EXPECT_EQ(st.rq_posted, 0u); // RESET dropped them: credits returned
    EXPECT_EQ(ote_cq_lane_outstanding(lane_[0], OTE_CQ_RECV), 0u);
    ASSERT_EQ(ote_qp_connect(a, &pb), OTE_OK);
    ASSERT_EQ(ote_qp_connect(b, &pa), OTE_OK);
    ote_qp_get_stats(a, &st);
    EXPECT_EQ(st.rq_posted, 4u);
    ProveUsable(a, b, 1);
}

TEST_F(QpFaultTest, PartialPostIsResolvedFromBadWrWithExactAccounting) {
    ote_qp_t *a = MakeQp(0, Config(16));
    ote_qp_t *b = MakeQp(1, Config(16));
    ASSERT_EQ(ConnectPair(a, b), OTE_OK);
    for (size_t i = 0; i < 5 * 1024; i++) mem_[0][i] = (uint8_t)(i * 13);
    auto win = Window(0, 1, 5, 1024);
    ASSERT_EQ(ote_verbs_fault_partial_post(v_, OTE_VERBS_FAULT_OP_POST_SEND, 2, ENOMEM), OTE_OK);
    ote_qp_post_result_t res;
    ote_status_t st = ote_qp_post_send(a, &win[0].wr, Soon(), &res);
    EXPECT_EQ(ote_status_errno(st), ENOMEM);
    EXPECT_EQ(res.accepted, 2u);
    ASSERT_EQ(res.unposted, &win[2].wr); // the caller gets WRs 3..5 back
    ote_qp_stats_t s;
    ote_qp_get_stats(a, &s);
    EXPECT_EQ(s.fenced, 0); // the outcome is known: no fence
    EXPECT_LE(s.sq_outstanding, 2u);
    ASSERT_EQ(ote_qp_wait_idle(a, Soon()), OTE_OK);
    EXPECT_EQ(rec_[0].Total(), 2u);
    EXPECT_EQ(rec_[0].Count(1), 1u);
    EXPECT_EQ(rec_[0].Count(2), 1u);
    EXPECT_EQ(rec_[0].Count(3), 0u);
    // Re-post what came back: every WR completes exactly once.
    ASSERT_EQ(ote_qp_post_send(a, res.unposted, Soon(), &res), OTE_OK);
    EXPECT_EQ(res.accepted, 3u);
    ASSERT_EQ(ote_qp_wait_idle(a, Soon()), OTE_OK);
    EXPECT_EQ(rec_[0].Total(), 5u);
    for (uint64_t id = 1; id <= 5; id++) EXPECT_EQ(rec_[0].Count(id), 1u) << id;
    ote_qp_get_stats(a, &s);
    EXPECT_EQ(s.send_completions, 5u);
    EXPECT_EQ(s.unknown_cqes, 0u);
    EXPECT_EQ(ote_cq_lane_outstanding(lane_[0], OTE_CQ_SEND), 0u);
    EXPECT_EQ(memcmp(mem_[0].data(), mem_[1].data(), 5 * 1024), 0);
}

// A post_send that posts everything through the real table and then fails with a
// bad_wr outside the chain: the caller cannot know what was accepted.
struct Ambiguous {
    static const ote_verbs_ops_t *real;
    static int PostSend(ote_verbs_t *v, ibv_qp *qp, ibv_send_wr *wr, ibv_send_wr **bad) {
        int err = real->post_send(v, qp, wr, bad);
        if (err != 0) return err;
        *bad = nullptr;
        return EIO;
    }
};
const ote_verbs_ops_t *Ambiguous::real = nullptr;

TEST_F(QpFaultTest, UnknownPostOutcomeKeepsTheWholeDebtAndFences) {
    ote_qp_t *a = MakeQp(0, Config(16));
    ote_qp_t *b = MakeQp(1, Config(16));
    ASSERT_EQ(ConnectPair(a, b), OTE_OK);
    // For one post, the provider instance the QP uses gets a table whose post_send is
    // ambiguous; every other op (and the real post) is the decorator's.
    const ote_verbs_ops_t *orig = v_->ops;
    ote_verbs_ops_t amb = *orig;
    amb.post_send = &Ambiguous::PostSend;
    Ambiguous::real = orig;
    auto win = Window(0, 1, 3, 256);
    ote_qp_post_result_t res;
    ote_status_t st = OTE_OK;
    ExpectErrorLogsIn([&] {
        v_->ops = &amb;
        st = ote_qp_post_send(a, &win[0].wr, Soon(), &res);
        v_->ops = orig;
    });
    EXPECT_EQ(ote_status_code(st), OTE_ERR_FENCED);
    EXPECT_EQ(res.accepted, 3u); // all possibly accepted: all owed
    EXPECT_EQ(res.unposted, nullptr);
    // The WRs were in fact posted: their CQEs discharge them, the fence stays.
    ASSERT_EQ(ote_qp_wait_idle(a, Soon()), OTE_OK);
    for (uint64_t id = 1; id <= 3; id++) EXPECT_EQ(rec_[0].Count(id), 1u);
    ote_qp_stats_t s;
    ote_qp_get_stats(a, &s);
    EXPECT_EQ(s.fenced, 1);
    auto more = Window(0, 10, 1, 8);
    EXPECT_EQ(ote_qp_post_send(a, &more[0].wr, Soon(), &res), OTE_ERR_FENCED);
    EXPECT_EQ(res.accepted, 0u);
}

TEST_F(QpFaultTest, LostCqeExpiresFencesAndOnlyDestructionResolvesIt) {
    ote_qp_t *a = MakeQp(0, Config(16));
    ote_qp_t *b = MakeQp(1, Config(16));
    ASSERT_EQ(ConnectPair(a, b), OTE_OK);
    auto win = Window(0, 1, 3, 512);
    ASSERT_EQ(ote_verbs_fault_lose_cqe_wr_id(v_, nullptr, win[1].wr.wr_id), OTE_OK);
    ote_qp_post_result_t res;
    ASSERT_EQ(ote_qp_post_send(a, &win[0].wr, ote_deadline_after(100 * OTE_NSEC_PER_MSEC), &res),
              OTE_OK);
    // The two CQEs that do come first (generous deadline), so the short wait below cannot
    // time out before it polled, however long this thread is preempted.
    struct Both {
        static int Fn(void *arg) {
            auto *r = static_cast<Record *>(arg);
            return r->Count(1) == 1 && r->Count(3) == 1;
        }
    };
    ASSERT_EQ(ote_cq_lane_progress(lane_[0], &Both::Fn, &rec_[0], Soon()), OTE_OK);
    EXPECT_EQ(ote_qp_wait_idle(a, ote_deadline_after(300 * OTE_NSEC_PER_MSEC)), OTE_ERR_TIMEOUT);
    EXPECT_EQ(rec_[0].Count(1), 1u);
    EXPECT_EQ(rec_[0].Count(2), 0u);
    EXPECT_EQ(rec_[0].Count(3), 1u);
    // The deadline (100 ms) has passed: the lost WR is reported once, the SQ fenced.
    uint64_t ids[4];
    ASSERT_EQ(ote_qp_expire(a, ids, 4), 1u);
    EXPECT_EQ(ids[0], win[1].wr.wr_id);
    EXPECT_EQ(ote_qp_expire(a, ids, 4), 0u);
    ote_qp_stats_t s;
    ote_qp_get_stats(a, &s);
    EXPECT_EQ(s.fenced, 1);
    EXPECT_EQ(s.sq_outstanding, 1u); // still owed: the NIC could still write it
    EXPECT_EQ(s.expired, 1u);
    EXPECT_EQ(ote_cq_lane_outstanding(lane_[0], OTE_CQ_SEND), 1u);
    auto more = Window(0, 10, 1, 8);
    EXPECT_EQ(ote_qp_post_send(a, &more[0].wr, Soon(), &res), OTE_ERR_FENCED);
    // Destruction: the flush cannot bring it (it is gone), destroy_qp proves it.
    Forget(a);
    EXPECT_EQ(ote_qp_destroy(a, ote_deadline_after(200 * OTE_NSEC_PER_MSEC)), OTE_OK);
    ASSERT_EQ(rec_[0].Count(2), 1u);
    ibv_wc wc = rec_[0].First(2);
    EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(wc.vendor_err, OTE_QP_VENDOR_ERR_DESTROYED);
    EXPECT_EQ(rec_[0].Total(), 3u); // each WR ended exactly once
    EXPECT_EQ(ote_cq_lane_outstanding(lane_[0], OTE_CQ_SEND), 0u);
    EXPECT_TRUE(LogContains("not flushed by the deadline"));
}

TEST_F(QpFaultTest, DestroyQpBusyRetainsQpBuffersAndChargesUntilRetry) {
    ote_qp_t *a = MakeQp(0, Config(16));
    ote_qp_t *b = MakeQp(1, Config(16, 4, 128));
    ASSERT_EQ(ConnectPair(a, b), OTE_OK);
    ASSERT_EQ(ote_verbs_fault_destroy_busy(v_, OTE_VERBS_FAULT_OP_DESTROY_QP, ote_qp_native(b), 1),
              OTE_OK);
    EXPECT_EQ(ote_status_code(ote_qp_destroy(b, Soon())), OTE_ERR_RETAINED);
    ote_qp_stats_t s;
    ote_qp_get_stats(b, &s);
    EXPECT_EQ(s.retained, 1);
    EXPECT_EQ(ote_context_retained(ctx_[1], OTE_RETAINED_QP), 1u);
    EXPECT_NE(ote_qp_native(b), nullptr);
    // The lane refuses to die under its retained QP.
    EXPECT_EQ(ote_cq_lane_destroy(lane_[1]), OTE_ERR_BUSY);
    ote_qp_post_result_t res;
    auto w = Window(1, 1, 1, 8);
    EXPECT_NE(ote_qp_post_send(b, &w[0].wr, Soon(), &res), OTE_OK);
    Forget(b);
    EXPECT_EQ(ote_qp_destroy(b, Soon()), OTE_OK);
    EXPECT_EQ(ote_context_retained(ctx_[1], OTE_RETAINED_QP), 0u);
    EXPECT_EQ(ote_cq_lane_outstanding(lane_[1], OTE_CQ_RECV), 0u);
}

TEST_F(QpFaultTest, ReceiveMrDeregBusyRetainsBuffersUntilRetry) {
    ote_qp_t *b = MakeQp(1, Config(16, 4, 128));
    ASSERT_EQ(ote_verbs_fault_destroy_busy(v_, OTE_VERBS_FAULT_OP_DEREG_MR, nullptr, 1), OTE_OK);
    EXPECT_EQ(ote_status_code(ote_qp_destroy(b, Soon())), OTE_ERR_RETAINED);
    EXPECT_EQ(ote_context_retained(ctx_[1], OTE_RETAINED_MR), 1u);
    EXPECT_EQ(ote_context_retained(ctx_[1], OTE_RETAINED_QP), 0u); // the QP itself is gone
    Forget(b);
    EXPECT_EQ(ote_qp_destroy(b, Soon()), OTE_OK);
    EXPECT_EQ(ote_context_retained(ctx_[1], OTE_RETAINED_MR), 0u);
}

TEST_F(QpFaultTest, PortDownEndsInFlightWorkWithErrorsAndPausesAdmission) {
    ote_qp_t *a = MakeQp(0, Config(16));
    ote_qp_t *b = MakeQp(1, Config(16));
    ASSERT_EQ(ConnectPair(a, b), OTE_OK);
    ote_verbs_t *sim = ote_verbs_fault_inner(v_);
    // The port goes down before the monitor has heard of it: the posts are accepted and
    // can never be acknowledged.
    ASSERT_EQ(ote_sim_set_port_state(sim, "sim0", 1, IBV_PORT_DOWN), OTE_OK);
    auto win = Window(0, 1, 4, 4096);
    ote_qp_post_result_t res;
    ASSERT_EQ(ote_qp_post_send(a, &win[0].wr, Soon(), &res), OTE_OK);
    // The monitor's poll pauses the context and fails the QP's outstanding work.
    auto poll_until = [&](bool want_ok, const char *what) {
        ote_test::WaitUntil(
            [&] {
                if ((ote_context_check(ctx_[0]) == OTE_OK) == want_ok) return true;
                EXPECT_EQ(ote_context_set_poll_events(set_, nullptr), OTE_OK);
                return false;
            },
            std::chrono::seconds(30), what);
    };
    poll_until(false, "the context to see its port down");
    ASSERT_EQ(ote_context_check(ctx_[0]), OTE_ERR_PORT_DOWN);
    ASSERT_EQ(ote_qp_wait_idle(a, Soon()), OTE_OK); // ended, not hung
    for (uint64_t id = 1; id <= 4; id++) {
        ASSERT_EQ(rec_[0].Count(id), 1u);
        EXPECT_NE(rec_[0].First(id).status, IBV_WC_SUCCESS);
    }
    // No new work on that context.
    auto more = Window(0, 10, 1, 8);
    EXPECT_NE(ote_qp_post_send(a, &more[0].wr, Soon(), &res), OTE_OK);
    ote_qp_t *c = nullptr;
    ote_qp_config_t cfg = Config(16);
    EXPECT_EQ(ote_qp_create(lane_[0], &cfg, &c), OTE_ERR_PORT_DOWN);
    // The port returns: a fresh pair works again.
    ASSERT_EQ(ote_sim_set_port_state(sim, "sim0", 1, IBV_PORT_ACTIVE), OTE_OK);
    poll_until(true, "the context to see its port up again");
    ASSERT_EQ(ote_context_check(ctx_[0]), OTE_OK);
    ote_qp_t *a2 = MakeQp(0, Config(16));
    ote_qp_t *b2 = MakeQp(1, Config(16));
    ASSERT_EQ(ConnectPair(a2, b2), OTE_OK);
    ProveUsable(a2, b2, 50);
}

// The layer's own fault point: QP creation fails with the armed status before anything
// is made (no QP, no receive MR, no lane charge, no output), then succeeds.
TEST_F(QpFaultTest, FaultPointFailsCreateBeforeAnythingIsMade) {
    ote_verbs_fault_reset_counters(v_);
    ASSERT_EQ(ote_fault_arm("qp.create", OTE_FAULT_NTH, 1, OTE_ERR_NOMEM, 0), OTE_OK);
    ote_qp_config_t cfg = Config(16, 4, 64);
    ote_qp_t *qp = nullptr;
    EXPECT_EQ(ote_qp_create(lane_[0], &cfg, &qp), OTE_ERR_NOMEM);
    EXPECT_EQ(qp, nullptr);
    EXPECT_EQ(ote_fault_failures("qp.create"), 1u);
    EXPECT_EQ(Calls(OTE_VERBS_FAULT_OP_CREATE_QP), 0u);
    EXPECT_EQ(Calls(OTE_VERBS_FAULT_OP_REG_MR), 0u);
    EXPECT_EQ(ote_cq_lane_outstanding(lane_[0], OTE_CQ_RECV), 0u);
    ote_qp_t *a = MakeQp(0, cfg);
    ote_qp_t *b = MakeQp(1, cfg);
    ASSERT_EQ(ConnectPair(a, b), OTE_OK);
    ProveUsable(a, b, 1);
}

} // namespace

// grant fault_test: grants under verbs faults and port events. Each fault test checks the
// error, what was released or retained (records, pins, QP borrows, windows), and that the
// layer works again once the fault clears.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <vector>

extern "C" {
#include "base/fault.h"
}
#include "tests/grant/rig.h"
#include "tests/util/test_base.h"
#include "tests/util/wait.h"

namespace {

using ote_test::Done;
using ote_test::kMs;
using ote_test::Rig;
using ote_test::WaitUntil;

constexpr unsigned long long B = OTE_GRANT_BLOCK;

class GrantFaultTest : public ote_test::OteTest {
  protected:
    void SetUp() override {
        OteTest::SetUp();
        rig_.Open(8u << 20);
        out_.resize(8u << 20);
        for (size_t i = 0; i < out_.size(); i++) out_[i] = (uint8_t)(i * 3 + 11);
        ASSERT_EQ(rig_.v->ops->reg_mr(rig_.v, ote_context_pd(rig_.c0), out_.data(), out_.size(),
                                      IBV_ACCESS_LOCAL_WRITE, &mr_),
                  0);
    }
    void TearDown() override {
        rig_.Close(); /* first: ends grants, destroys QPs */
        EXPECT_EQ(rig_.pins.load(), 0) << "registration pins leaked";
        OteTest::TearDown();
    }
    void CloseMr() {
        if (mr_) {
            EXPECT_EQ(rig_.v->ops->dereg_mr(rig_.v, mr_), 0);
        }
        mr_ = nullptr;
    }
    ote_status_t Start(ote_grant_op_t op, uint64_t len, Done *d, uint64_t timeout_ms = 30000,
                       uint32_t slot = 0) {
        int cap = op == OTE_GRANT_WRITE ? 1 : 0;
        ote_qp_t *qp = nullptr;
        ote_status_t st = rig_.Borrow(cap, slot, &qp);
        if (st != OTE_OK) return st;
        ote_grant_desc_t g = {};
        g.op = op;
        g.local = out_.data();
        g.lkey = mr_->lkey;
        g.remote = (uintptr_t)rig_.src.data();
        g.len = len;
        g.ep = rig_.ep0[cap];
        g.slot = slot;
        g.qp = qp;
        g.deadline = ote_deadline_after(timeout_ms * kMs);
        g.done = Done::Fn;
        g.done_arg = d;
        ote_grant_ctl_t ctl = {&rig_, Rig::Request};
        st = ote_grant_start(rig_.g0, &g, &ctl);
        if (st != OTE_OK) ote_endpoint_return(rig_.ep0[cap], slot, qp);
        return st;
    }
    // Ticks the source's manager alone (as its monitor would) until no source grant is
    // live (30 s).
    bool TickSourceUntilIdle(const char *what) {
        return WaitUntil(
            [&] {
                ote_grant_mgr_tick(rig_.g1);
                ote_grant_stats_t s;
                ote_grant_mgr_get_stats(rig_.g1, &s);
                return s.live_source == 0;
            },
            std::chrono::seconds(30), what);
    }
    // Until the verbs fault decorator lost the CQE it was told to lose (30 s).
    void WaitCqeLost() {
        WaitUntil([&] { return ote_verbs_fault_injected(rig_.v, OTE_VERBS_FAULT_OP_POLL_CQ) > 0; },
                  std::chrono::seconds(30), "the lost CQE");
    }
    // Polls the context set's events until the requester's context is (not) usable (30 s).
    void WaitContext(bool usable, const char *what) {
        WaitUntil(
            [&] {
                if ((ote_context_check(rig_.c0) == OTE_OK) == usable) return true;
                ote_context_set_poll_events(rig_.set, nullptr);
                return false;
            },
            std::chrono::seconds(30), what);
    }
    ote_status_t Run(ote_grant_op_t op, uint64_t len, uint64_t timeout_ms = 30000) {
        Done d;
        ote_status_t st = Start(op, len, &d, timeout_ms);
        if (st != OTE_OK) return st;
        EXPECT_TRUE(d.Wait(rig_, 60000));
        EXPECT_EQ(d.calls.load(), 1);
        return d.st.load();
    }
    Rig rig_;
    std::vector<uint8_t> out_;
    struct ibv_mr *mr_ = nullptr;
};

TEST_F(GrantFaultTest, AllocMwFailsGrantRefusedRequesterToldEverythingReleased) {
    ASSERT_EQ(ote_verbs_fault_fail(rig_.v, OTE_VERBS_FAULT_OP_ALLOC_MW, OTE_FAULT_NTH, 1, ENOMEM),
              OTE_OK);
    ote_status_t st = Run(OTE_GRANT_WRITE, B);
    EXPECT_EQ(ote_status_code(st), OTE_ERR_NATIVE);
    EXPECT_EQ(ote_status_errno(st), ENOMEM);
    EXPECT_EQ(ote_verbs_fault_injected(rig_.v, OTE_VERBS_FAULT_OP_ALLOC_MW), 1u);
    // Released: no window exists or is pooled, the registration pin was dropped, both
    // sides' records ended, both QP borrows were given back; nothing was retained.
    ote_grant_stats_t s0, s1;
    ote_grant_mgr_get_stats(rig_.g0, &s0);
    ote_grant_mgr_get_stats(rig_.g1, &s1);
    EXPECT_EQ(s1.bind_failures, 1u);
    EXPECT_EQ(s1.refused, 1u);
    EXPECT_EQ(s1.live_source, 0u);
    EXPECT_EQ(s1.mw_pool, 0u);
    EXPECT_EQ(s1.mw_retained, 0u);
    EXPECT_EQ(s0.live_requester, 0u);
    EXPECT_EQ(s0.failed, 1u);
    EXPECT_EQ(rig_.pins.load(), 0);
    EXPECT_EQ(ote_endpoint_users(rig_.ep0[1], 0), 0u);
    EXPECT_EQ(ote_endpoint_users(rig_.ep1[1], 0), 0u);
    EXPECT_EQ(ote_context_retained(rig_.c1, OTE_RETAINED_MW), 0u);
    EXPECT_EQ(RetainedSinceStart(), 0);
    // Recovery: the fault cleared, the layer works again on the same slot.
    EXPECT_EQ(Run(OTE_GRANT_WRITE, B), OTE_OK);
    EXPECT_EQ(memcmp(rig_.src.data(), out_.data(), B), 0);
    ASSERT_TRUE(rig_.WaitSourceIdle()) << "the source never took the receipt";
    ote_grant_mgr_get_stats(rig_.g1, &s1);
    EXPECT_EQ(s1.receipts, 1u);
    EXPECT_EQ(s1.mw_pool, 1u); /* the new window, invalidated, back in the pool */
    EXPECT_EQ(rig_.pins.load(), 0);
    CloseMr();
}

// The source has no receive slot for the grant's receipt (qp.rq_admit refused): the grant
// is refused OTE_ERR_AGAIN after the pin and before any window exists, the pin is given
// back and no receive reservation stays on the QP; the next grant is served.
TEST_F(GrantFaultTest, ReceiveAdmissionRefusedRollsBackBeforeAnyWindow) {
    ASSERT_EQ(ote_fault_arm("qp.rq_admit", OTE_FAULT_NTH, 1, OTE_ERR_AGAIN, 0), OTE_OK);
    EXPECT_EQ(ote_status_code(Run(OTE_GRANT_WRITE, B)), OTE_ERR_AGAIN);
    EXPECT_EQ(ote_fault_failures("qp.rq_admit"), 1u);
    ote_grant_stats_t s0, s1;
    ote_grant_mgr_get_stats(rig_.g0, &s0);
    ote_grant_mgr_get_stats(rig_.g1, &s1);
    EXPECT_EQ(s1.rq_busy, 1u);
    EXPECT_EQ(s1.refused, 1u);
    EXPECT_EQ(s1.served, 0u);
    EXPECT_EQ(s1.live_source, 0u);
    EXPECT_EQ(s0.live_requester, 0u);
    EXPECT_EQ(rig_.pins.load(), 0);
    EXPECT_EQ(ote_verbs_fault_calls(rig_.v, OTE_VERBS_FAULT_OP_ALLOC_MW), 0u);
    ote_qp_t *sq = nullptr;
    ASSERT_EQ(ote_endpoint_borrow_ready(rig_.ep1[1], 0, 0, &sq), OTE_OK);
    EXPECT_EQ(ote_qp_rq_admitted(sq), 0u);
    ote_endpoint_return(rig_.ep1[1], 0, sq);
    ASSERT_EQ(ote_fault_disarm("qp.rq_admit"), OTE_OK);
    EXPECT_EQ(Run(OTE_GRANT_WRITE, B), OTE_OK);
    EXPECT_EQ(memcmp(rig_.src.data(), out_.data(), B), 0);
    ASSERT_TRUE(rig_.WaitSourceIdle()) << "the source never took the receipt";
    ASSERT_EQ(ote_endpoint_borrow_ready(rig_.ep1[1], 0, 0, &sq), OTE_OK);
    EXPECT_EQ(ote_qp_rq_admitted(sq), 0u); // the receipt's reservation given back
    ote_endpoint_return(rig_.ep1[1], 0, sq);
    CloseMr();
}

// A window that a source grant could not leave unbound (no receipt by its deadline) is
// deallocated; when that dealloc fails the window is retained and counted (MW is a
// retained kind), and the monitor's next tick retries it.
TEST_F(GrantFaultTest, DeallocMwBusyRetainsTheWindowUntilTheRetrySucceeds) {
    ote_qp_t *qp = nullptr;
    ASSERT_EQ(rig_.Borrow(1, 0, &qp), OTE_OK); /* builds both ends of slot 0 */
    uint32_t remote_qpn = ote_endpoint_remote_qpn(rig_.ep0[1], 0);
    ote_endpoint_return(rig_.ep0[1], 0, qp);
    // Serve a request as the source would, but the requester never answers: its id is
    // unknown to the requester's manager, so the answer is dropped there.
    rig_.src_deadline_ms = 200;
    ASSERT_EQ(Rig::Request(&rig_, 0xabcdef00ull, 0, remote_qpn, OTE_GRANT_WRITE,
                           (uintptr_t)rig_.src.data(), B),
              OTE_OK);
    ote_grant_stats_t s1;
    ote_grant_mgr_get_stats(rig_.g1, &s1);
    EXPECT_EQ(s1.served, 1u);
    ASSERT_EQ(ote_verbs_fault_destroy_busy(rig_.v, OTE_VERBS_FAULT_OP_DEALLOC_MW, nullptr, 1),
              OTE_OK);
    // Wait for the source deadline: tick g1 alone until the record ended.
    // Tick as the monitor does; nothing is retained yet, so no tick retries.
    TickSourceUntilIdle("the source's record to end at its deadline");
    ote_grant_mgr_get_stats(rig_.g1, &s1);
    ASSERT_EQ(s1.live_source, 0u);
    EXPECT_EQ(s1.source_expired, 1u);
    EXPECT_EQ(ote_verbs_fault_injected(rig_.v, OTE_VERBS_FAULT_OP_DEALLOC_MW), 1u);
    // Retained, counted once in the manager, its context and the process registry; the
    // pin and the QP borrow were still released (the window alone is kept).
    EXPECT_EQ(s1.mw_retained, 1u);
    EXPECT_EQ(s1.mw_pool, 0u);
    EXPECT_EQ(ote_context_retained(rig_.c1, OTE_RETAINED_MW), 1u);
    EXPECT_EQ(RetainedSinceStart(), 1);
    EXPECT_EQ(rig_.pins.load(), 0);
    EXPECT_TRUE(LogContains("dealloc_mw failed"));
    // The fault is spent: the next tick's retry deallocates it.
    ote_grant_mgr_tick(rig_.g1);
    ote_grant_mgr_get_stats(rig_.g1, &s1);
    EXPECT_EQ(s1.mw_retained, 0u);
    EXPECT_EQ(ote_context_retained(rig_.c1, OTE_RETAINED_MW), 0u);
    EXPECT_EQ(RetainedSinceStart(), 0);
    EXPECT_EQ(ote_verbs_fault_calls(rig_.v, OTE_VERBS_FAULT_OP_DEALLOC_MW), 2u);
    // The source QP was killed with the window: retire the requester's end too, then a
    // fresh pair serves a full grant.
    ASSERT_EQ(rig_.Borrow(1, 0, &qp), OTE_OK);
    ote_endpoint_retire(rig_.ep0[1], 0, qp);
    ote_endpoint_return(rig_.ep0[1], 0, qp);
    rig_.Reclaim();
    rig_.src_deadline_ms = 30000;
    EXPECT_EQ(Run(OTE_GRANT_WRITE, B), OTE_OK);
    EXPECT_EQ(memcmp(rig_.src.data(), out_.data(), B), 0);
    CloseMr();
}

// A pooled window whose dealloc fails at manager destroy: the manager is retained with
// it (OTE_ERR_RETAINED, counted as MW), and the next destroy succeeds.
TEST_F(GrantFaultTest, DeallocMwBusyAtManagerDestroyRetainsUntilTheNextDestroy) {
    EXPECT_EQ(Run(OTE_GRANT_WRITE, B), OTE_OK);
    ASSERT_TRUE(rig_.WaitSourceIdle()) << "the source never took the receipt";
    ote_grant_stats_t s1;
    ote_grant_mgr_get_stats(rig_.g1, &s1);
    ASSERT_EQ(s1.mw_pool, 1u);
    ASSERT_EQ(ote_grant_mgr_tick(rig_.g1), 0u);
    ASSERT_EQ(ote_verbs_fault_destroy_busy(rig_.v, OTE_VERBS_FAULT_OP_DEALLOC_MW, nullptr, 1),
              OTE_OK);
    ote_status_t st = ote_grant_mgr_destroy(rig_.g1);
    EXPECT_EQ(ote_status_code(st), OTE_ERR_RETAINED);
    ote_grant_mgr_get_stats(rig_.g1, &s1); /* still valid */
    EXPECT_EQ(s1.mw_pool, 0u);
    EXPECT_EQ(s1.mw_retained, 1u);
    EXPECT_EQ(ote_context_retained(rig_.c1, OTE_RETAINED_MW), 1u);
    EXPECT_EQ(RetainedSinceStart(), 1);
    EXPECT_EQ(ote_grant_mgr_destroy(rig_.g1), OTE_OK);
    rig_.g1 = nullptr;
    EXPECT_EQ(ote_context_retained(rig_.c1, OTE_RETAINED_MW), 0u);
    EXPECT_EQ(RetainedSinceStart(), 0);
    CloseMr();
}

TEST_F(GrantFaultTest, BindPostFailsGrantRefusedQpStillUsable) {
    ote_qp_t *qp = nullptr; /* build the pair first so the next post_send is the bind */
    ASSERT_EQ(rig_.Borrow(1, 0, &qp), OTE_OK);
    ote_endpoint_return(rig_.ep0[1], 0, qp);
    ASSERT_EQ(ote_verbs_fault_fail(rig_.v, OTE_VERBS_FAULT_OP_POST_SEND, OTE_FAULT_NTH, 1, EINVAL),
              OTE_OK);
    EXPECT_NE(Run(OTE_GRANT_WRITE, B), OTE_OK);
    ote_grant_stats_t s1;
    ote_grant_mgr_get_stats(rig_.g1, &s1);
    EXPECT_EQ(s1.bind_failures, 1u);
    EXPECT_EQ(s1.live_source, 0u);
    EXPECT_EQ(Run(OTE_GRANT_WRITE, B), OTE_OK);
    EXPECT_EQ(memcmp(rig_.src.data(), out_.data(), B), 0);
    CloseMr();
}

TEST_F(GrantFaultTest, BindErrorCqeRefusesRetiresQpAndNextGrantRebuilds) {
    ote_qp_t *qp = nullptr;
    ASSERT_EQ(rig_.Borrow(1, 0, &qp), OTE_OK);
    ote_endpoint_return(rig_.ep0[1], 0, qp);
    ASSERT_EQ(ote_verbs_fault_error_cqe_nth(rig_.v, ote_cq_lane_native_cq(rig_.l1[0], OTE_CQ_SEND),
                                            1, IBV_WC_MW_BIND_ERR, 0),
              OTE_OK);
    EXPECT_NE(Run(OTE_GRANT_WRITE, B), OTE_OK);
    ote_grant_stats_t s1;
    ote_grant_mgr_get_stats(rig_.g1, &s1);
    EXPECT_EQ(s1.bind_failures, 1u);
    rig_.Reclaim();
    // The source QP was retired; the requester side still holds a QP whose peer is gone:
    // retire it too (the engine does this when a grant fails), then a fresh pair works.
    ASSERT_EQ(rig_.Borrow(1, 0, &qp), OTE_OK);
    ote_endpoint_retire(rig_.ep0[1], 0, qp);
    ote_endpoint_return(rig_.ep0[1], 0, qp);
    rig_.Reclaim();
    EXPECT_EQ(Run(OTE_GRANT_WRITE, 2 * B), OTE_OK);
    EXPECT_EQ(memcmp(rig_.src.data(), out_.data(), 2 * B), 0);
    CloseMr();
}

TEST_F(GrantFaultTest, PartialPostExactAccountingNoDoubleCompletion) {
    ote_qp_t *qp = nullptr;
    ASSERT_EQ(rig_.Borrow(1, 0, &qp), OTE_OK);
    ote_endpoint_return(rig_.ep0[1], 0, qp);
    // Armed as the answer arrives: the first chain of 16 slices is accepted up to 5.
    rig_.partial_k = 5;
    uint64_t len = 40 * B;
    EXPECT_EQ(Run(OTE_GRANT_WRITE, len), OTE_OK);
    EXPECT_EQ(memcmp(rig_.src.data(), out_.data(), len), 0);
    ote_grant_stats_t s0;
    ote_grant_mgr_get_stats(rig_.g0, &s0);
    EXPECT_EQ(s0.partial_posts, 1u);
    EXPECT_EQ(s0.slices_posted, 40u);
    EXPECT_EQ(s0.slices_completed, 40u);
    EXPECT_EQ(s0.stale_cqes, 0u);
    ote_qp_stats_t qs;
    ote_qp_get_stats(qp, &qs);
    EXPECT_EQ(qs.sq_outstanding, 0u);
    EXPECT_EQ(qs.unknown_cqes, 0u);
    EXPECT_EQ(qs.send_completions, 41u); /* 40 slices + the receipt SEND */
    CloseMr();
}

// Cancel between send-queue windows: the first chain of 16 slices is accepted up to 5
// (a proven partial post: the grant waits for room); the grant is canceled before its
// next window, so those 5 slices complete, nothing more is ever posted, the window is
// invalidated by the usual receipt (the source releases it at once) and done() reports
// OTE_ERR_CANCELED. Exactly the 5 slices' bytes land; the rest of the range is untouched.
struct CancelAfterFirst {
    std::atomic<int> looks{0};
    Done done;
    static int Canceled(void *arg) {
        Done *d = static_cast<Done *>(arg);
        return static_cast<CancelAfterFirst *>(d->ctx)->looks.fetch_add(1) >= 1;
    }
};

TEST_F(GrantFaultTest, CancelBetweenSendQueueWindowsPostsNothingMore) {
    ote_qp_t *qp = nullptr;
    ASSERT_EQ(rig_.Borrow(1, 0, &qp), OTE_OK);
    rig_.partial_k = 5;
    uint64_t len = 40 * B;
    CancelAfterFirst c;
    c.done.ctx = &c;
    ote_grant_desc_t g = {};
    g.op = OTE_GRANT_WRITE;
    g.local = out_.data();
    g.lkey = mr_->lkey;
    g.remote = (uintptr_t)rig_.src.data();
    g.len = len;
    g.ep = rig_.ep0[1];
    g.slot = 0;
    g.qp = qp;
    g.deadline = ote_deadline_after(30000 * kMs);
    g.done = Done::Fn;
    g.done_arg = &c.done;
    g.canceled = CancelAfterFirst::Canceled;
    ote_grant_ctl_t ctl = {&rig_, Rig::Request};
    ASSERT_EQ(ote_grant_start(rig_.g0, &g, &ctl), OTE_OK);
    ASSERT_TRUE(c.done.Wait(rig_, 60000));
    EXPECT_EQ(c.done.calls.load(), 1);
    EXPECT_EQ(ote_status_code(c.done.st.load()), OTE_ERR_CANCELED);
    EXPECT_GE(c.looks.load(), 2);
    ASSERT_TRUE(rig_.WaitSourceIdle()) << "the source never took the receipt";
    ote_grant_stats_t s0, s1;
    ote_grant_mgr_get_stats(rig_.g0, &s0);
    ote_grant_mgr_get_stats(rig_.g1, &s1);
    EXPECT_EQ(s0.slices_posted, 5u) << "slices posted after the cancel";
    EXPECT_EQ(s0.slices_completed, 5u);
    EXPECT_EQ(s0.abandoned, 0u) << "a canceled grant is invalidated by its receipt";
    EXPECT_EQ(s1.receipts, 1u);
    EXPECT_EQ(s1.live_source, 0u);
    EXPECT_EQ(rig_.pins.load(), 0);
    EXPECT_EQ(memcmp(rig_.src.data(), out_.data(), 5 * B), 0);
    for (uint64_t i = 5 * B; i < len + B; i++)
        ASSERT_EQ(rig_.src[i], 0) << "byte " << i << " written after the cancel";
    ote_qp_stats_t qs;
    ote_qp_get_stats(qp, &qs);
    EXPECT_EQ(qs.sq_outstanding, 0u);
    CloseMr();
}

TEST_F(GrantFaultTest, LostCqeFailsAtDeadlineQpFencedNothingFreedEarly) {
    ote_qp_t *qp = nullptr;
    ASSERT_EQ(rig_.Borrow(1, 0, &qp), OTE_OK);
    ote_endpoint_return(rig_.ep0[1], 0, qp);
    rig_.src_deadline_ms = 6000;
    ASSERT_EQ(
        ote_verbs_fault_lose_cqe_nth(rig_.v, ote_cq_lane_native_cq(rig_.l0[0], OTE_CQ_SEND), 2),
        OTE_OK);
    uint64_t t0 = ote_now_ns();
    Done d;
    // The deadline (5 s) must pass after the slices were posted, not before the source
    // answered (a hop through the CQ workers' threads): generous enough for a loaded
    // machine, still short for the test. The source's own (6 s) comes after it.
    ASSERT_EQ(Start(OTE_GRANT_WRITE, 4 * B, &d, 5000), OTE_OK);
    // Tick (as the monitor does) without reclaiming, until the deadline failed the grant:
    // its QP is fenced, and the grant has not ended: the lost WR is still owed.
    ote_grant_stats_t s;
    WaitUntil(
        [&] {
            ote_grant_mgr_tick(rig_.g0);
            ote_grant_mgr_tick(rig_.g1);
            ote_grant_mgr_get_stats(rig_.g0, &s);
            return s.expired > 0;
        },
        std::chrono::seconds(30), "the requester's grant to expire");
    ASSERT_EQ(s.expired, 1u);
    ASSERT_GT(s.slices_posted, 0u) << "the deadline passed before the slices were posted";
    ote_qp_stats_t qs;
    ote_qp_get_stats(qp, &qs); /* the grant's QP: not destroyed before reclaim */
    EXPECT_EQ(qs.fenced, 1) << "the QP that lost a completion was not fenced";
    EXPECT_GE(qs.sq_outstanding, 1u) << "the lost WR must stay owed until the QP is destroyed";
    EXPECT_EQ(d.calls.load(), 0) << "the grant ended while the NIC could still write its buffer";
    ASSERT_TRUE(d.Wait(rig_, 30000));
    uint64_t took = ote_now_ns() - t0;
    EXPECT_EQ(d.calls.load(), 1);
    EXPECT_EQ(ote_status_code(d.st.load()), OTE_ERR_TIMEOUT);
    EXPECT_GE(took, 5000 * kMs); /* not before its deadline (no upper bound: load) */
    ote_grant_stats_t s0;
    ote_grant_mgr_get_stats(rig_.g0, &s0);
    EXPECT_EQ(s0.expired, 1u);
    // The lost WR was owed until the QP's destruction resolved it (done came after).
    ote_endpoint_stats_t es;
    ote_endpoint_store_stats(rig_.s0, &es);
    EXPECT_EQ(es.destroyed, 1u);
    CloseMr();
}

TEST_F(GrantFaultTest, PortDownEndsInFlightGrantReleasesItAndGrantsWorkAfterRecovery) {
    rig_.src_deadline_ms = 1500; /* the source releases windows its dead requester never ends */
    ote_qp_t *qp = nullptr;
    ASSERT_EQ(rig_.Borrow(1, 0, &qp), OTE_OK);
    ote_endpoint_return(rig_.ep0[1], 0, qp);
    // The first data CQE is lost: the grant cannot finish on its own, so it is certainly
    // still in flight when the port goes down.
    ASSERT_EQ(
        ote_verbs_fault_lose_cqe_nth(rig_.v, ote_cq_lane_native_cq(rig_.l0[0], OTE_CQ_SEND), 1),
        OTE_OK);
    Done d;
    ASSERT_EQ(Start(OTE_GRANT_WRITE, 8 * B, &d, 120000), OTE_OK);
    WaitCqeLost();
    ASSERT_EQ(ote_verbs_fault_injected(rig_.v, OTE_VERBS_FAULT_OP_POLL_CQ), 1u);
    EXPECT_EQ(d.calls.load(), 0);
    ASSERT_EQ(ote_sim_set_port_state(rig_.sim, "sim0", 1, IBV_PORT_DOWN), OTE_OK);
    WaitContext(false, "the requester's context to see its port down");
    EXPECT_EQ(ote_context_check(rig_.c0), OTE_ERR_PORT_DOWN);
    ASSERT_TRUE(d.Wait(rig_, 60000)) << "in-flight grant hung after port down";
    EXPECT_EQ(d.calls.load(), 1);
    // It ended with the port's error, not at its own (120 s) deadline.
    EXPECT_EQ(ote_status_code(d.st.load()), OTE_ERR_PORT_DOWN) << ote_status_str(d.st.load());
    Done d2;
    EXPECT_EQ(ote_status_code(Start(OTE_GRANT_WRITE, B, &d2)), OTE_ERR_PORT_DOWN);
    EXPECT_EQ(d2.calls.load(), 0);
    // Released: the requester's record ended and its QP borrow came back (retired: it
    // carried the grant's WRs); the source's window is released by its deadline, with
    // its pin; nothing was retained.
    ote_grant_stats_t s0, s1;
    WaitUntil(
        [&] {
            ote_grant_mgr_tick(rig_.g0);
            ote_grant_mgr_tick(rig_.g1);
            ote_grant_mgr_get_stats(rig_.g0, &s0);
            ote_grant_mgr_get_stats(rig_.g1, &s1);
            return s0.live_requester == 0 && s1.live_source == 0 && rig_.pins.load() == 0;
        },
        std::chrono::seconds(30), "both records ended and every pin back");
    EXPECT_EQ(s0.live_requester, 0u);
    EXPECT_EQ(s0.failed, 1u);
    EXPECT_EQ(s1.live_source, 0u);
    EXPECT_EQ(s1.mw_retained, 0u);
    EXPECT_EQ(rig_.pins.load(), 0);
    EXPECT_EQ(ote_endpoint_users(rig_.ep0[1], 0), 0u);
    EXPECT_EQ(ote_endpoint_users(rig_.ep1[1], 0), 0u);
    EXPECT_EQ(RetainedSinceStart(), 0);
    // Recovery: the port returns, the context resumes, and a grant works again.
    ASSERT_EQ(ote_sim_set_port_state(rig_.sim, "sim0", 1, IBV_PORT_ACTIVE), OTE_OK);
    WaitContext(true, "the requester's context to resume");
    ASSERT_EQ(ote_context_check(rig_.c0), OTE_OK);
    rig_.Reclaim();
    // The source's end of the old pair was killed with its window: retire it so that the
    // requester's rebuild of the slot builds a fresh pair (the engine does this on failure).
    ote_qp_t *src_old = nullptr;
    if (ote_endpoint_borrow_ready(rig_.ep1[1], 0, 0, &src_old) == OTE_OK) {
        ote_endpoint_retire(rig_.ep1[1], 0, src_old);
        ote_endpoint_return(rig_.ep1[1], 0, src_old);
    }
    rig_.Reclaim();
    rig_.src_deadline_ms = 30000;
    for (size_t i = 0; i < 2 * B; i++) out_[i] = (uint8_t)(i * 7 + 1);
    EXPECT_EQ(Run(OTE_GRANT_WRITE, 2 * B), OTE_OK);
    EXPECT_EQ(memcmp(rig_.src.data(), out_.data(), 2 * B), 0);
    CloseMr();
}

// A fenced manager (its transport's teardown) ends its live grants at its next tick, as a
// port that went down does, not at their (120 s) deadlines: the requester's in-flight
// grant fails with the fence's status (its QP fenced and flushed), the source's grant,
// whose receipt will never come, is ended (QP to ERR, window and pin released), and new
// grants are refused.
TEST_F(GrantFaultTest, FencedManagerEndsLiveGrantsAtTheNextTick) {
    rig_.src_deadline_ms = 120000;
    ote_qp_t *qp = nullptr;
    ASSERT_EQ(rig_.Borrow(1, 0, &qp), OTE_OK);
    ote_endpoint_return(rig_.ep0[1], 0, qp);
    // The first data CQE is lost: the grant cannot finish on its own.
    ASSERT_EQ(
        ote_verbs_fault_lose_cqe_nth(rig_.v, ote_cq_lane_native_cq(rig_.l0[0], OTE_CQ_SEND), 1),
        OTE_OK);
    Done d;
    ASSERT_EQ(Start(OTE_GRANT_WRITE, 8 * B, &d, 120000), OTE_OK);
    WaitCqeLost();
    ASSERT_EQ(ote_verbs_fault_injected(rig_.v, OTE_VERBS_FAULT_OP_POLL_CQ), 1u);
    ote_grant_stats_t s0, s1;
    ote_grant_mgr_get_stats(rig_.g1, &s1);
    ASSERT_EQ(s1.live_source, 1u);
    EXPECT_EQ(d.calls.load(), 0);
    ote_grant_mgr_fence(rig_.g0, OTE_ERR_CANCELED);
    ote_grant_mgr_fence(rig_.g1, OTE_ERR_CANCELED);
    // The source's grant ends at the tick (its bind long done, nothing owed).
    WaitUntil(
        [&] {
            ote_grant_mgr_tick(rig_.g1);
            ote_grant_mgr_get_stats(rig_.g1, &s1);
            return s1.live_source == 0 && rig_.pins.load() == 0;
        },
        std::chrono::seconds(30), "the source's grant to end at the tick, its pin back");
    ASSERT_EQ(s1.live_source, 0u) << "the source's grant waits for its deadline";
    // The requester's fails at the tick; it ends once its QP's destruction resolved the
    // WR whose CQE was lost (the reclaim of the retired slot, as the monitor's).
    ASSERT_TRUE(d.Wait(rig_, 30000));
    ote_grant_mgr_get_stats(rig_.g0, &s0);
    EXPECT_EQ(d.calls.load(), 1);
    EXPECT_EQ(ote_status_code(d.st.load()), OTE_ERR_CANCELED) << ote_status_str(d.st.load());
    EXPECT_EQ(s0.live_requester, 0u);
    EXPECT_EQ(s0.expired, 0u) << "ended by the fence, not its deadline";
    EXPECT_EQ(s1.live_source, 0u);
    EXPECT_EQ(s1.source_expired, 0u);
    EXPECT_EQ(s1.receipts, 0u);
    EXPECT_EQ(s1.mw_retained, 0u);
    EXPECT_EQ(rig_.pins.load(), 0);
    EXPECT_EQ(ote_endpoint_users(rig_.ep1[1], 0), 0u) << "the source's QP borrow came back";
    Done d2;
    EXPECT_EQ(ote_status_code(Start(OTE_GRANT_WRITE, B, &d2)), OTE_ERR_CANCELED);
    EXPECT_EQ(d2.calls.load(), 0);
    EXPECT_EQ(RetainedSinceStart(), 0);
    CloseMr();
}

// A tick (the monitor's, with the context down or the deadline passed, or a fenced
// manager's) that runs while ote_grant_start is still inside its request() callback,
// whose sending then fails (the control connection went): the start fails, so the grant
// never was (done never runs, the QP borrow stays the caller's, nothing is counted live);
// the tick must not end it meanwhile (it did: done ran, the borrow went back twice, and
// the start then withdrew a record the tick had already freed).
struct TickDuringRequest {
    static ote_status_t Request(void *arg, uint64_t, uint32_t, uint32_t, ote_grant_op_t, uint64_t,
                                uint64_t) {
        Rig *r = static_cast<Rig *>(arg);
        ote_grant_mgr_fence(r->g0, OTE_ERR_CANCELED);
        (void)ote_grant_mgr_tick(r->g0); /* as another thread's tick would, right now */
        return OTE_ERR_PEER_LOST;
    }
};

TEST_F(GrantFaultTest, TickDuringAFailedRequestLeavesTheGrantToItsStart) {
    ote_qp_t *qp = nullptr;
    ASSERT_EQ(rig_.Borrow(1, 0, &qp), OTE_OK);
    Done d;
    ote_grant_desc_t g = {};
    g.op = OTE_GRANT_WRITE;
    g.local = out_.data();
    g.lkey = mr_->lkey;
    g.remote = (uintptr_t)rig_.src.data();
    g.len = 8 * B;
    g.ep = rig_.ep0[1];
    g.slot = 0;
    g.qp = qp;
    g.deadline = ote_deadline_after(30000 * kMs);
    g.done = Done::Fn;
    g.done_arg = &d;
    ote_grant_ctl_t ctl = {&rig_, TickDuringRequest::Request};
    EXPECT_EQ(ote_status_code(ote_grant_start(rig_.g0, &g, &ctl)), OTE_ERR_PEER_LOST);
    EXPECT_EQ(d.calls.load(), 0) << "done ran for a grant whose start failed";
    EXPECT_EQ(ote_endpoint_users(rig_.ep0[1], 0), 1u) << "the caller's borrow was given back";
    ote_endpoint_return(rig_.ep0[1], 0, qp); /* a failed start leaves it to the caller */
    EXPECT_EQ(ote_endpoint_users(rig_.ep0[1], 0), 0u);
    ote_grant_stats_t s0;
    ote_grant_mgr_get_stats(rig_.g0, &s0);
    EXPECT_EQ(s0.live_requester, 0u);
    EXPECT_EQ(s0.started, 0u);
    EXPECT_EQ(s0.failed, 0u);
    CloseMr();
}

// A post whose outcome is unknown (the provider fails it with bad_wr outside the chain
// after having posted it): the grant's QP is fenced, the grant fails, and it ends only
// after every WR it might have posted was discharged. A fresh QP then works.
struct AmbiguousWrite {
    static const ote_verbs_ops_t *real;
    static std::atomic<int> armed;
    static int PostSend(ote_verbs_t *v, ibv_qp *qp, ibv_send_wr *wr, ibv_send_wr **bad) {
        int err = real->post_send(v, qp, wr, bad);
        if (err != 0 || wr->opcode != IBV_WR_RDMA_WRITE || armed.exchange(0) == 0) return err;
        *bad = nullptr;
        return EIO;
    }
};
const ote_verbs_ops_t *AmbiguousWrite::real = nullptr;
std::atomic<int> AmbiguousWrite::armed{0};

TEST_F(GrantFaultTest, UnknownPostOutcomeFencesTheQueueAndFailsTheGrant) {
    ote_qp_t *qp = nullptr;
    ASSERT_EQ(rig_.Borrow(1, 0, &qp), OTE_OK);
    ote_endpoint_return(rig_.ep0[1], 0, qp);
    const ote_verbs_ops_t *orig = rig_.v->ops;
    static ote_verbs_ops_t amb;
    amb = *orig;
    amb.post_send = &AmbiguousWrite::PostSend;
    AmbiguousWrite::real = orig;
    AmbiguousWrite::armed = 1;
    rig_.src_deadline_ms = 800; /* the source releases the window nobody will invalidate */
    rig_.SetOps(&amb);          /* every other op is the decorator's own */
    Done d;
    ote_grant_stats_t s;
    {
        // The qp layer logs the unknown outcome (from whichever thread posts the slices).
        ote_test::ErrorLogsExpected guard;
        ASSERT_EQ(Start(OTE_GRANT_WRITE, 4 * B, &d, 30000), OTE_OK);
        WaitUntil(
            [&] {
                ote_grant_mgr_tick(rig_.g0);
                ote_grant_mgr_tick(rig_.g1);
                ote_grant_mgr_get_stats(rig_.g0, &s);
                return s.slices_posted > 0 && AmbiguousWrite::armed.load() == 0 && guard.Seen() > 0;
            },
            std::chrono::seconds(30), "the ambiguous post and its ERROR line");
        EXPECT_EQ(guard.Seen(), 1u);
    }
    ASSERT_EQ(AmbiguousWrite::armed.load(), 0) << "no slice was posted";
    ote_qp_stats_t qs;
    ote_qp_get_stats(qp, &qs);
    EXPECT_EQ(qs.fenced, 1) << "an unknown post outcome did not fence the queue";
    ASSERT_TRUE(d.Wait(rig_, 30000));
    rig_.SetOps(orig);
    EXPECT_EQ(d.calls.load(), 1);
    EXPECT_EQ(ote_status_code(d.st.load()), OTE_ERR_FENCED) << ote_status_str(d.st.load());
    ote_grant_mgr_get_stats(rig_.g0, &s);
    EXPECT_EQ(s.slices_posted, 4u); /* the whole chain stays owed: it may have been posted */
    EXPECT_EQ(s.stale_cqes, 0u);
    EXPECT_TRUE(TickSourceUntilIdle("the source's window released at its deadline"));
    rig_.Reclaim();
    EXPECT_EQ(Run(OTE_GRANT_WRITE, 2 * B), OTE_OK); /* a fresh pair works */
    EXPECT_EQ(memcmp(rig_.src.data(), out_.data(), 2 * B), 0);
    CloseMr();
}

} // namespace

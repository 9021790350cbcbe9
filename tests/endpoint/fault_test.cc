// endpoint fault_test: construction under verbs faults leaks nothing and leaves the slot
// usable; a QP that will not die keeps its slot (retained) until a destroy succeeds.
#include <gtest/gtest.h>

#include "tests/grant/rig.h"
#include "tests/util/test_base.h"

namespace {

using ote_test::kMs;
using ote_test::Rig;

class EndpointFaultTest : public ote_test::OteTest {
  protected:
    void SetUp() override {
        OteTest::SetUp();
        rig_.with_grants = false;
        rig_.Open(1 << 20);
    }
    void TearDown() override {
        rig_.Close();
        OteTest::TearDown();
    }
    Rig rig_;
};

TEST_F(EndpointFaultTest, CreateQpFailsNothingLeakedSlotUsableOnRetry) {
    ote_verbs_fault_reset_counters(rig_.v);
    uint32_t recv_charged = ote_cq_lane_outstanding(rig_.l0[0], OTE_CQ_RECV);
    ASSERT_EQ(ote_verbs_fault_fail(rig_.v, OTE_VERBS_FAULT_OP_CREATE_QP, OTE_FAULT_NTH, 1, ENOMEM),
              OTE_OK);
    ote_qp_t *qp = nullptr;
    ote_status_t st = OTE_OK;
    ExpectErrorLogsIn([&] { st = rig_.Borrow(1, 0, &qp); }); // the qp layer logs create_qp
    EXPECT_EQ(ote_status_errno(st), ENOMEM);
    EXPECT_EQ(qp, nullptr);
    EXPECT_EQ(ote_verbs_fault_injected(rig_.v, OTE_VERBS_FAULT_OP_CREATE_QP), 1u);
    // Released: no QP was made (none to destroy), the receive buffers' MR registered for
    // it was deregistered, no receive charge stays on the lane, the slot is empty again
    // (no builder, no user) and nothing was retained.
    EXPECT_EQ(ote_verbs_fault_calls(rig_.v, OTE_VERBS_FAULT_OP_DESTROY_QP), 0u);
    EXPECT_EQ(ote_verbs_fault_calls(rig_.v, OTE_VERBS_FAULT_OP_DEREG_MR),
              ote_verbs_fault_calls(rig_.v, OTE_VERBS_FAULT_OP_REG_MR));
    EXPECT_EQ(ote_cq_lane_outstanding(rig_.l0[0], OTE_CQ_RECV), recv_charged);
    EXPECT_EQ(ote_cq_lane_outstanding(rig_.l0[1], OTE_CQ_RECV), 0u);
    EXPECT_EQ(ote_endpoint_users(rig_.ep0[1], 0), 0u);
    EXPECT_EQ(ote_endpoint_ready_count(rig_.ep0[1]), 0u);
    EXPECT_EQ(ote_context_retained(rig_.c0, OTE_RETAINED_QP), 0u);
    EXPECT_EQ(ote_context_retained(rig_.c0, OTE_RETAINED_MR), 0u);
    EXPECT_EQ(RetainedSinceStart(), 0);
    // The slot is usable: the retry builds and connects it.
    ASSERT_EQ(rig_.Borrow(1, 0, &qp), OTE_OK);
    ote_endpoint_return(rig_.ep0[1], 0, qp);
    ote_endpoint_stats_t es;
    ote_endpoint_store_stats(rig_.s0, &es);
    EXPECT_EQ(es.build_failures, 1u);
    EXPECT_EQ(es.built, 1u);
}

// Exchange that builds the source side, then makes the requester's next modify_qp (its
// INIT->RTR) fail.
ote_status_t FailRtrExchange(void *arg, uint32_t slot, const ote_qp_path_t *local,
                             ote_qp_path_t *peer_out, ote_deadline_t dl) {
    Rig::Xarg *x = static_cast<Rig::Xarg *>(arg);
    ote_status_t st = Rig::Exchange(arg, slot, local, peer_out, dl);
    if (st == OTE_OK)
        ote_verbs_fault_fail(x->r->v, OTE_VERBS_FAULT_OP_MODIFY_QP, OTE_FAULT_NTH, 1, EINVAL);
    return st;
}

TEST_F(EndpointFaultTest, ModifyToRtrFailsQpDestroyedSlotUsableOnRetry) {
    Rig::Xarg x = {&rig_, 1};
    ote_qp_t *qp = nullptr;
    uint64_t destroys = ote_verbs_fault_calls(rig_.v, OTE_VERBS_FAULT_OP_DESTROY_QP);
    ExpectErrorLogsIn([&] {
        EXPECT_NE(ote_endpoint_borrow(rig_.ep0[1], 0, FailRtrExchange, &x,
                                      ote_deadline_after(30000 * kMs), &qp),
                  OTE_OK);
    });
    EXPECT_EQ(ote_verbs_fault_calls(rig_.v, OTE_VERBS_FAULT_OP_DESTROY_QP), destroys + 1);
    EXPECT_EQ(ote_context_retained(rig_.c0, OTE_RETAINED_QP), 0u);
    EXPECT_EQ(ote_endpoint_ready_count(rig_.ep0[1]), 0u);
    // Retry: the requester builds a new QP; the source replaces its orphaned pair.
    ote_qp_t *src_old = nullptr;
    ASSERT_EQ(ote_endpoint_borrow_ready(rig_.ep1[1], 0, 0, &src_old), OTE_OK);
    ote_endpoint_retire(rig_.ep1[1], 0, src_old);
    ote_endpoint_return(rig_.ep1[1], 0, src_old);
    ASSERT_EQ(rig_.Borrow(1, 0, &qp), OTE_OK);
    ote_qp_stats_t s;
    ote_qp_get_stats(qp, &s);
    EXPECT_EQ(s.state, IBV_QPS_RTS);
    ote_endpoint_return(rig_.ep0[1], 0, qp);
}

TEST_F(EndpointFaultTest, DestroyBusyRetainsQpInSlotUntilReclaimSucceeds) {
    ote_qp_t *qp = nullptr;
    ASSERT_EQ(rig_.Borrow(0, 0, &qp), OTE_OK);
    ote_endpoint_retire(rig_.ep0[0], 0, qp);
    ote_endpoint_return(rig_.ep0[0], 0, qp);
    ASSERT_EQ(ote_verbs_fault_destroy_busy(rig_.v, OTE_VERBS_FAULT_OP_DESTROY_QP, nullptr, 1),
              OTE_OK);
    size_t left = 0;
    EXPECT_NE(ote_endpoint_store_reclaim(rig_.s0, ote_deadline_after(30000 * kMs), &left), OTE_OK);
    EXPECT_EQ(left, 1u);
    EXPECT_EQ(ote_context_retained(rig_.c0, OTE_RETAINED_QP), 1u);
    EXPECT_EQ(RetainedSinceStart(), 1);
    ote_endpoint_stats_t st;
    ote_endpoint_store_stats(rig_.s0, &st);
    EXPECT_EQ(st.retained_now, 1u);
    // The slot stays occupied while retained; the next reclaim succeeds and frees it.
    EXPECT_EQ(ote_endpoint_store_reclaim(rig_.s0, ote_deadline_after(30000 * kMs), &left), OTE_OK);
    EXPECT_EQ(left, 0u);
    EXPECT_EQ(ote_context_retained(rig_.c0, OTE_RETAINED_QP), 0u);
    EXPECT_EQ(RetainedSinceStart(), 0);
}

// An evicted endpoint (its peer died) whose QP's native destroy fails keeps the QP in its
// slot, retained, and is not freed; the next reclaim destroys it and frees the endpoint.
TEST_F(EndpointFaultTest, EvictedEndpointWithBusyDestroyIsRetainedThenFreed) {
    ote_qp_t *qp = nullptr;
    ASSERT_EQ(rig_.Borrow(0, 1, &qp), OTE_OK);
    ote_endpoint_return(rig_.ep0[0], 1, qp);
    ASSERT_EQ(ote_endpoint_evict(rig_.ep0[0]), OTE_OK);
    rig_.ep0[0] = nullptr; // freed by the reclaim that finds it drained
    ASSERT_EQ(ote_verbs_fault_destroy_busy(rig_.v, OTE_VERBS_FAULT_OP_DESTROY_QP, nullptr, 1),
              OTE_OK);
    size_t left = 0;
    EXPECT_NE(ote_endpoint_store_reclaim(rig_.s0, ote_deadline_after(30000 * kMs), &left), OTE_OK);
    EXPECT_EQ(left, 1u);
    EXPECT_EQ(ote_context_retained(rig_.c0, OTE_RETAINED_QP), 1u);
    ote_endpoint_stats_t st;
    ote_endpoint_store_stats(rig_.s0, &st);
    EXPECT_EQ(st.retained_now, 1u);
    EXPECT_EQ(st.evicted, 0u);
    EXPECT_EQ(st.endpoints, 2u);
    EXPECT_EQ(ote_endpoint_store_reclaim(rig_.s0, ote_deadline_after(30000 * kMs), &left), OTE_OK);
    EXPECT_EQ(left, 0u);
    EXPECT_EQ(ote_context_retained(rig_.c0, OTE_RETAINED_QP), 0u);
    EXPECT_EQ(RetainedSinceStart(), 0);
    ote_endpoint_store_stats(rig_.s0, &st);
    EXPECT_EQ(st.retained_now, 0u);
    EXPECT_EQ(st.evicted, 1u);
    EXPECT_EQ(st.endpoints, 1u);
}

// A store whose QPs each get a PD of their own (the GPUDirect source's direct endpoints):
// each source QP is in its own PD (neither the context's nor another QP's); an alloc_pd
// failure fails that build cleanly and the retry works; a PD whose dealloc fails keeps
// its slot, retained, until the next reclaim deallocates it; no PD is left at the end.
TEST_F(EndpointFaultTest, PrivatePdPerQpFaultsRetainAndNothingIsLeft) {
    ote_endpoint_store_private_pd(rig_.s1);
    ote_verbs_fault_reset_counters(rig_.v);
    ASSERT_EQ(ote_verbs_fault_fail(rig_.v, OTE_VERBS_FAULT_OP_ALLOC_PD, OTE_FAULT_NTH, 1, ENOMEM),
              OTE_OK);
    ote_qp_t *qp = nullptr;
    ote_status_t st = OTE_OK;
    ExpectErrorLogsIn([&] { st = rig_.Borrow(0, 0, &qp); });
    EXPECT_EQ(ote_status_errno(st), ENOMEM);
    ote_endpoint_stats_t es;
    ote_endpoint_store_stats(rig_.s1, &es);
    EXPECT_EQ(es.pds_live, 0u);
    EXPECT_EQ(es.built, 0u);
    ote_qp_t *a = nullptr, *b = nullptr;
    ASSERT_EQ(rig_.Borrow(0, 0, &a), OTE_OK);
    ASSERT_EQ(rig_.Borrow(0, 1, &b), OTE_OK);
    ote_qp_t *sa = nullptr, *sb = nullptr;
    ASSERT_EQ(ote_endpoint_borrow_ready(rig_.ep1[0], 0, 0, &sa), OTE_OK);
    ASSERT_EQ(ote_endpoint_borrow_ready(rig_.ep1[0], 1, 0, &sb), OTE_OK);
    EXPECT_NE(ote_qp_pd(sa), ote_context_pd(rig_.c1));
    EXPECT_NE(ote_qp_pd(sb), ote_context_pd(rig_.c1));
    EXPECT_NE(ote_qp_pd(sa), ote_qp_pd(sb));
    EXPECT_EQ(ote_qp_pd(a), ote_context_pd(rig_.c0)); /* the other store: shared PD */
    ote_endpoint_store_stats(rig_.s1, &es);
    EXPECT_EQ(es.pds_live, 2u);
    ote_endpoint_retire(rig_.ep1[0], 0, sa);
    ote_endpoint_return(rig_.ep1[0], 0, sa);
    ote_endpoint_retire(rig_.ep1[0], 1, sb);
    ote_endpoint_return(rig_.ep1[0], 1, sb);
    ote_endpoint_return(rig_.ep0[0], 0, a);
    ote_endpoint_return(rig_.ep0[0], 1, b);
    ASSERT_EQ(ote_verbs_fault_fail(rig_.v, OTE_VERBS_FAULT_OP_DEALLOC_PD, OTE_FAULT_NTH, 1, EBUSY),
              OTE_OK);
    size_t left = 0;
    EXPECT_NE(ote_endpoint_store_reclaim(rig_.s1, ote_deadline_after(30000 * kMs), &left), OTE_OK);
    EXPECT_EQ(left, 1u);
    EXPECT_EQ(ote_context_retained(rig_.c1, OTE_RETAINED_PD), 1u);
    ote_endpoint_store_stats(rig_.s1, &es);
    EXPECT_EQ(es.retained_now, 1u);
    EXPECT_EQ(es.pds_live, 1u);
    EXPECT_EQ(ote_endpoint_store_reclaim(rig_.s1, ote_deadline_after(30000 * kMs), &left), OTE_OK);
    EXPECT_EQ(left, 0u);
    EXPECT_EQ(ote_context_retained(rig_.c1, OTE_RETAINED_PD), 0u);
    ote_endpoint_store_stats(rig_.s1, &es);
    EXPECT_EQ(es.pds_live, 0u);
    /* Every PD allocated was deallocated (each op failed once, injected). */
    EXPECT_EQ(ote_verbs_fault_calls(rig_.v, OTE_VERBS_FAULT_OP_ALLOC_PD) -
                  ote_verbs_fault_injected(rig_.v, OTE_VERBS_FAULT_OP_ALLOC_PD),
              ote_verbs_fault_calls(rig_.v, OTE_VERBS_FAULT_OP_DEALLOC_PD) -
                  ote_verbs_fault_injected(rig_.v, OTE_VERBS_FAULT_OP_DEALLOC_PD));
    EXPECT_EQ(RetainedSinceStart(), 0);
}

} // namespace

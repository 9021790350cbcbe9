// endpoint_test: the endpoint store and its construction slots over the sim.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "tests/grant/rig.h"
#include "tests/util/test_base.h"

namespace {

using ote_test::kMs;
using ote_test::Rig;

class EndpointTest : public ote_test::OteTest {
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

TEST_F(EndpointTest, SameKeySameEndpointFixedWidth) {
    ote_ep_key_t k;
    ote_ep_key_make(&k, 2, 22, 0, 1, OTE_EP_REQUESTER, OTE_EP_WRITE);
    ote_endpoint_t *ep = nullptr;
    ASSERT_EQ(ote_endpoint_get(rig_.s0, &k, 2, &ep), OTE_OK);
    EXPECT_EQ(ep, rig_.ep0[OTE_EP_WRITE]);
    EXPECT_EQ(ote_endpoint_width(ep), 2u);
    // A different width for the same key is malformed and changes nothing.
    ote_endpoint_t *other = nullptr;
    EXPECT_EQ(ote_endpoint_get(rig_.s0, &k, 1, &other), OTE_ERR_PROTOCOL);
    EXPECT_EQ(other, nullptr);
    EXPECT_EQ(ote_endpoint_get(rig_.s0, &k, 0, &other), OTE_ERR_PROTOCOL);
    // Opposite role / capability / peer: distinct endpoints; width = min(local, remote).
    ote_ep_key_t k2;
    ote_ep_key_make(&k2, 3, 22, 0, 1, OTE_EP_REQUESTER, OTE_EP_WRITE);
    ASSERT_EQ(ote_endpoint_get(rig_.s0, &k2, 1, &other), OTE_OK);
    EXPECT_NE(other, ep);
    EXPECT_EQ(ote_endpoint_width(other), 1u);
    EXPECT_NE(rig_.ep0[OTE_EP_READ], rig_.ep0[OTE_EP_WRITE]);
}

TEST_F(EndpointTest, OneBuilderWaitersUseOwnDeadlineCancelFreesSlot) {
    ote_endpoint_t *ep = rig_.ep0[1];
    ote_ep_claim_t claim, claim2;
    ote_qp_t *qp = nullptr;
    ASSERT_EQ(ote_endpoint_reserve(ep, 0, ote_deadline_after(30000 * kMs), &qp, &claim), OTE_OK);
    EXPECT_EQ(qp, nullptr);
    EXPECT_NE(claim.token, 0u);
    // Another caller waits with its own deadline and cannot take or cancel the slot.
    uint64_t t0 = ote_now_ns();
    EXPECT_EQ(ote_endpoint_reserve(ep, 0, ote_deadline_after(50 * kMs), &qp, &claim2),
              OTE_ERR_TIMEOUT);
    EXPECT_GE(ote_now_ns() - t0, 45 * kMs);
    // Slot 1 is independent.
    ASSERT_EQ(ote_endpoint_reserve(ep, 1, ote_deadline_after(30000 * kMs), &qp, &claim2), OTE_OK);
    EXPECT_NE(claim2.token, claim.token);
    EXPECT_EQ(ote_endpoint_cancel(&claim2), OTE_OK);
    // A stale guard (old token) cannot release a replacement.
    ote_ep_claim_t stale = claim;
    EXPECT_EQ(ote_endpoint_cancel(&claim), OTE_OK);
    ASSERT_EQ(ote_endpoint_reserve(ep, 0, ote_deadline_after(30000 * kMs), &qp, &claim2), OTE_OK);
    EXPECT_EQ(ote_endpoint_cancel(&stale), OTE_ERR_STATE);
    EXPECT_EQ(ote_endpoint_reserve(ep, 0, ote_deadline_after(20 * kMs), &qp, &claim),
              OTE_ERR_TIMEOUT);
    EXPECT_EQ(ote_endpoint_cancel(&claim2), OTE_OK);
}

TEST_F(EndpointTest, ConcurrentBorrowersShareOneBuild) {
    std::vector<std::thread> th;
    std::vector<ote_qp_t *> got(8, nullptr);
    std::atomic<int> fails{0};
    for (int i = 0; i < 8; i++) {
        th.emplace_back([&, i] {
            if (rig_.Borrow(1, 0, &got[i]) != OTE_OK) fails++;
        });
    }
    for (auto &t : th) t.join();
    EXPECT_EQ(fails.load(), 0);
    for (int i = 1; i < 8; i++) EXPECT_EQ(got[i], got[0]);
    EXPECT_EQ(ote_endpoint_users(rig_.ep0[1], 0), 8u);
    ote_endpoint_stats_t st;
    ote_endpoint_store_stats(rig_.s0, &st);
    EXPECT_EQ(st.built, 1u);
    EXPECT_NE(ote_endpoint_remote_qpn(rig_.ep0[1], 0), 0u);
    for (int i = 0; i < 8; i++) ote_endpoint_return(rig_.ep0[1], 0, got[i]);
    EXPECT_EQ(ote_endpoint_users(rig_.ep0[1], 0), 0u);
    // Least-loaded pick prefers the empty slot 1 now that slot 0 is borrowed.
    ote_qp_t *qp = nullptr;
    ASSERT_EQ(rig_.Borrow(1, 0, &qp), OTE_OK);
    EXPECT_EQ(ote_endpoint_pick_slot(rig_.ep0[1]), 1u);
    ote_endpoint_return(rig_.ep0[1], 0, qp);
}

TEST_F(EndpointTest, RetiredQpKeepsSlotUntilDestroyedThenRebuilds) {
    ote_qp_t *qp = nullptr;
    ASSERT_EQ(rig_.Borrow(0, 1, &qp), OTE_OK);
    uint32_t old_num = ote_qp_num(qp);
    ote_endpoint_retire(rig_.ep0[0], 1, qp);
    EXPECT_EQ(ote_endpoint_ready_count(rig_.ep0[0]), 0u);
    // Borrowed: reclaim cannot destroy it, and a new reserve waits.
    size_t left = 0;
    EXPECT_EQ(ote_endpoint_store_reclaim(rig_.s0, ote_deadline_after(30000 * kMs), &left), OTE_OK);
    EXPECT_EQ(left, 1u);
    ote_ep_claim_t c;
    ote_qp_t *q2 = nullptr;
    EXPECT_EQ(ote_endpoint_reserve(rig_.ep0[0], 1, ote_deadline_after(20 * kMs), &q2, &c),
              OTE_ERR_TIMEOUT);
    ote_endpoint_return(rig_.ep0[0], 1, qp);
    EXPECT_EQ(ote_endpoint_store_reclaim(rig_.s0, ote_deadline_after(30000 * kMs), &left), OTE_OK);
    EXPECT_EQ(left, 0u);
    // The source side's old pair is replaced when the requester rebuilds the slot.
    ote_qp_t *src_old = nullptr;
    ASSERT_EQ(ote_endpoint_borrow_ready(rig_.ep1[0], 1, 0, &src_old), OTE_OK);
    ote_endpoint_retire(rig_.ep1[0], 1, src_old);
    ote_endpoint_return(rig_.ep1[0], 1, src_old);
    ASSERT_EQ(rig_.Borrow(0, 1, &q2), OTE_OK);
    EXPECT_NE(ote_qp_num(q2), old_num);
    ote_endpoint_return(rig_.ep0[0], 1, q2);
}

// A dead peer's endpoint is evicted: out of the table at once (the same key then gets a new
// endpoint), nothing is built for it any more, its borrowed QP stays until returned, and
// reclaim destroys the QP and frees the endpoint once nothing holds it.
TEST_F(EndpointTest, EvictedEndpointDrainsThenIsFreed) {
    ote_endpoint_stats_t st;
    ote_endpoint_store_stats(rig_.s0, &st);
    const uint64_t n0 = st.endpoints;
    EXPECT_EQ(n0, 2u); // the rig's READ and WRITE endpoints
    ote_qp_t *qp = nullptr;
    ASSERT_EQ(rig_.Borrow(1, 0, &qp), OTE_OK);
    ote_endpoint_t *old = rig_.ep0[1];
    EXPECT_EQ(ote_endpoint_evict(old), OTE_OK);
    EXPECT_EQ(ote_endpoint_evict(old), OTE_OK); // idempotent
    EXPECT_EQ(ote_endpoint_ready_count(old), 0u);
    // Nothing is built on an evicted endpoint.
    ote_ep_claim_t claim;
    ote_qp_t *q2 = nullptr;
    EXPECT_EQ(ote_endpoint_reserve(old, 1, ote_deadline_after(30000 * kMs), &q2, &claim),
              OTE_ERR_PEER_LOST);
    // Its key names a new endpoint now.
    ote_ep_key_t k = *ote_endpoint_key(old);
    ote_endpoint_t *fresh = nullptr;
    ASSERT_EQ(ote_endpoint_get(rig_.s0, &k, 2, &fresh), OTE_OK);
    EXPECT_NE(fresh, old);
    ote_endpoint_store_stats(rig_.s0, &st);
    EXPECT_EQ(st.endpoints, n0 + 1);
    // Borrowed: reclaim keeps the QP and the endpoint.
    size_t left = 0;
    EXPECT_EQ(ote_endpoint_store_reclaim(rig_.s0, ote_deadline_after(30000 * kMs), &left), OTE_OK);
    EXPECT_EQ(left, 1u);
    ote_endpoint_store_stats(rig_.s0, &st);
    EXPECT_EQ(st.endpoints, n0 + 1);
    EXPECT_EQ(st.evicted, 0u);
    ote_endpoint_return(old, 0, qp);
    uint64_t destroyed = st.destroyed;
    EXPECT_EQ(ote_endpoint_store_reclaim(rig_.s0, ote_deadline_after(30000 * kMs), &left), OTE_OK);
    EXPECT_EQ(left, 0u);
    ote_endpoint_store_stats(rig_.s0, &st);
    EXPECT_EQ(st.endpoints, n0);
    EXPECT_EQ(st.evicted, 1u);
    EXPECT_EQ(st.destroyed, destroyed + 1);
    rig_.ep0[1] = fresh; // the old one is freed
    // The new endpoint builds and lends as usual.
    ASSERT_EQ(rig_.Borrow(1, 0, &qp), OTE_OK);
    ote_endpoint_return(fresh, 0, qp);
}

} // namespace

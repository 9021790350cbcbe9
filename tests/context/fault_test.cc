// Drives context/ through the verbs fault decorator over the software provider: MR
// publication rolled back when the second context fails, EBUSY on dereg_mr and
// dealloc_pd retained and counted then retried, injected port events pausing and
// resuming a context, a stale refresh that must not clear a newer port fault, failed
// opens leaving nothing behind.
#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "tests/util/test_base.h"
#include "tests/util/wait.h"

extern "C" {
#include "base/alloc.h"
#include "base/fault.h"
#include "base/status.h"
#include "context/buffers.h"
#include "context/context.h"
#include "verbs/fault.h"
#include "verbs/verbs.h"
}

namespace {

using ote_test::OteTest;

constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;

class ContextFaultTest : public OteTest {
  protected:
    void SetUp() override {
        OteTest::SetUp();
        ote_verbs_t *sim = nullptr;
        ASSERT_EQ(ote_verbs_open("sim", nullptr, &sim), OTE_OK);
        ASSERT_EQ(ote_verbs_fault_wrap(sim, OTE_VERBS_FAULT_OWN_INNER, &v_), OTE_OK);
    }
    void TearDown() override {
        if (bm_ != nullptr) {
            EXPECT_EQ(ote_buffer_manager_destroy(bm_), OTE_OK);
        }
        if (set_ != nullptr) {
            EXPECT_EQ(ote_context_set_close(set_), OTE_OK);
        }
        if (v_ != nullptr) ote_verbs_close(v_);
        OteTest::TearDown();
    }
    void Open() {
        ASSERT_EQ(ote_context_set_open(v_, nullptr, &set_), OTE_OK);
        ASSERT_EQ(ote_context_set_count(set_), 2u);
        ASSERT_EQ(ote_buffer_manager_create(set_, &bm_), OTE_OK);
    }
    uint64_t Retained(ote_retained_kind_t kind) {
        uint64_t n = 0;
        for (size_t i = 0; i < ote_context_set_count(set_); i++)
            n += ote_context_retained(ote_context_set_get(set_, i), kind);
        return n;
    }
    ote_verbs_t *v_ = nullptr;
    ote_context_set_t *set_ = nullptr;
    ote_buffer_manager_t *bm_ = nullptr;
    std::vector<char> mem_ = std::vector<char>(256 * 1024);
};

TEST_F(ContextFaultTest, MrFailingInSecondContextRollsBackTheFirst) {
    Open();
    ote_verbs_fault_reset_counters(v_);
    ASSERT_EQ(ote_verbs_fault_fail(v_, OTE_VERBS_FAULT_OP_REG_MR, OTE_FAULT_NTH, 2, ENOMEM),
              OTE_OK);
    ote_buffer_t *buf = nullptr;
    ote_status_t st = OTE_OK;
    ExpectErrorLogsIn(
        [&] { st = ote_buffer_register(bm_, mem_.data(), mem_.size(), kAccess, &buf); });
    EXPECT_EQ(ote_status_code(st), OTE_ERR_NATIVE);
    EXPECT_EQ(ote_status_errno(st), ENOMEM);
    EXPECT_EQ(buf, nullptr);
    // Exactly one MR was made (in the first context) and exactly it was deregistered.
    EXPECT_EQ(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_REG_MR), 2u);
    EXPECT_EQ(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_DEREG_MR), 1u);
    EXPECT_EQ(ote_buffer_manager_count(bm_), 0u);
    EXPECT_EQ(ote_buffer_manager_retained(bm_), 0u);
    ibv_mr *mr = nullptr;
    EXPECT_EQ(ote_buffer_manager_find(bm_, mem_.data(), 1, ote_context_set_get(set_, 0), &mr),
              OTE_ERR_ACCESS);
    EXPECT_TRUE(LogContains("sim1"));
    // Once the fault clears the same range registers in both contexts.
    ASSERT_EQ(ote_buffer_register(bm_, mem_.data(), mem_.size(), kAccess, &buf), OTE_OK);
    for (size_t i = 0; i < 2; i++)
        EXPECT_EQ(ote_buffer_mr(buf, ote_context_set_get(set_, i), &mr), OTE_OK);
    EXPECT_EQ(ote_buffer_deregister(bm_, buf), OTE_OK);
}

TEST_F(ContextFaultTest, RollbackThatCannotDeregisterKeepsAnOrphanUntilReclaimed) {
    Open();
    ote_context_t *first = ote_context_set_get(set_, 0);
    ASSERT_EQ(ote_verbs_fault_fail(v_, OTE_VERBS_FAULT_OP_REG_MR, OTE_FAULT_NTH, 2, EFAULT),
              OTE_OK);
    ASSERT_EQ(ote_verbs_fault_destroy_busy(v_, OTE_VERBS_FAULT_OP_DEREG_MR, nullptr, 1), OTE_OK);
    ote_buffer_t *buf = nullptr;
    ExpectErrorLogsIn([&] {
        EXPECT_NE(ote_buffer_register(bm_, mem_.data(), mem_.size(), kAccess, &buf), OTE_OK);
    });
    EXPECT_EQ(ote_buffer_manager_count(bm_), 0u);
    EXPECT_EQ(ote_buffer_manager_retained(bm_), 1u);
    EXPECT_EQ(ote_context_retained(first, OTE_RETAINED_MR), 1u);
    EXPECT_EQ(RetainedSinceStart(), 1);
    EXPECT_EQ(ote_buffer_manager_destroy(bm_), OTE_ERR_RETAINED);
    size_t left = 99;
    EXPECT_EQ(ote_buffer_manager_reclaim(bm_, &left), OTE_OK);
    EXPECT_EQ(left, 0u);
    EXPECT_EQ(ote_context_retained(first, OTE_RETAINED_MR), 0u);
    EXPECT_EQ(RetainedSinceStart(), 0);
}

TEST_F(ContextFaultTest, DeregBusyRetainsTheMrAndALaterRetrySucceeds) {
    Open();
    ote_buffer_t *buf = nullptr;
    ASSERT_EQ(ote_buffer_register(bm_, mem_.data(), mem_.size(), kAccess, &buf), OTE_OK);
    ote_verbs_fault_reset_counters(v_);
    ASSERT_EQ(ote_verbs_fault_destroy_busy(v_, OTE_VERBS_FAULT_OP_DEREG_MR, nullptr, 2), OTE_OK);
    // Two contexts, both refuse once: both MRs retained, counted once each.
    EXPECT_EQ(ote_status_code(ote_buffer_deregister(bm_, buf)), OTE_ERR_RETAINED);
    EXPECT_EQ(ote_buffer_manager_retained(bm_), 2u);
    EXPECT_EQ(Retained(OTE_RETAINED_MR), 2u);
    EXPECT_EQ(ote_buffer_manager_count(bm_), 0u); // retiring: no longer found
    ibv_mr *mr = nullptr;
    EXPECT_EQ(ote_buffer_manager_find(bm_, mem_.data(), 8, ote_context_set_get(set_, 0), &mr),
              OTE_ERR_ACCESS);
    EXPECT_EQ(ote_buffer_manager_destroy(bm_), OTE_ERR_BUSY);
    // The retry reaches the provider and succeeds.
    EXPECT_EQ(ote_buffer_deregister(bm_, buf), OTE_OK);
    EXPECT_EQ(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_DEREG_MR), 4u);
    EXPECT_EQ(ote_buffer_manager_retained(bm_), 0u);
    EXPECT_EQ(Retained(OTE_RETAINED_MR), 0u);
}

// A single MR (one context, made and dropped by its user) follows the registrations'
// policy for a failed dereg: the drop answers RETAINED, the MR becomes the manager's
// orphan (counted in its context and the manager, the manager's destroy RETAINED), the
// release callback waits for the reclaim that deregisters it, and runs exactly once.
// While a single MR is held the manager's destroy is BUSY.
TEST_F(ContextFaultTest, SingleMrWhoseDropFailsIsAnOrphanUntilReclaimReleasesIt) {
    Open();
    ote_context_t *second = ote_context_set_get(set_, 1);
    ibv_mr *mr = nullptr;
    ASSERT_EQ(
        ote_buffer_mr_reg(bm_, second, mem_.data(), 8192, IBV_ACCESS_LOCAL_WRITE, nullptr, &mr),
        OTE_OK);
    ASSERT_NE(mr, nullptr);
    EXPECT_EQ(ote_buffer_manager_single(bm_), 1u);
    EXPECT_EQ(ote_buffer_manager_destroy(bm_), OTE_ERR_BUSY);
    // The manager never finds a single MR: it is its user's, not a registration.
    ibv_mr *found = nullptr;
    EXPECT_EQ(ote_buffer_manager_find(bm_, mem_.data(), 8, second, &found), OTE_ERR_ACCESS);

    struct Released {
        int calls = 0;
        void *item = nullptr;
    } rel;
    auto cb = [](void *owner, void *item) {
        auto *r = static_cast<Released *>(owner);
        r->calls++;
        r->item = item;
    };
    ASSERT_EQ(ote_verbs_fault_destroy_busy(v_, OTE_VERBS_FAULT_OP_DEREG_MR, nullptr, 2), OTE_OK);
    ote_status_t st = ote_buffer_mr_drop(bm_, second, mr, cb, &rel, mem_.data()); // a WARN names it
    EXPECT_EQ(st, OTE_ERR_RETAINED);
    EXPECT_EQ(rel.calls, 0) << "released before the MR is gone";
    EXPECT_EQ(ote_buffer_manager_single(bm_), 0u);
    EXPECT_EQ(ote_buffer_manager_retained(bm_), 1u);
    EXPECT_EQ(ote_context_retained(second, OTE_RETAINED_MR), 1u);
    EXPECT_EQ(ote_buffer_manager_destroy(bm_), OTE_ERR_RETAINED);
    // The first reclaim still meets the provider's refusal; the second deregisters.
    size_t left = 0;
    EXPECT_EQ(ote_buffer_manager_reclaim(bm_, &left), OTE_ERR_RETAINED);
    EXPECT_EQ(left, 1u);
    EXPECT_EQ(rel.calls, 0);
    EXPECT_EQ(ote_buffer_manager_reclaim(bm_, &left), OTE_OK);
    EXPECT_EQ(left, 0u);
    EXPECT_EQ(rel.calls, 1);
    EXPECT_EQ(rel.item, mem_.data());
    EXPECT_EQ(ote_context_retained(second, OTE_RETAINED_MR), 0u);
    EXPECT_EQ(ote_buffer_manager_reclaim(bm_, &left), OTE_OK);
    EXPECT_EQ(rel.calls, 1) << "released once";

    // A drop that works releases at once; a dma-buf-less MR in a PD of the caller's
    // choosing (here the context's own, named explicitly) is made there.
    ote_buffer_mr_where_t where = {ote_context_pd(second), -1, 0};
    ASSERT_EQ(ote_buffer_mr_reg(bm_, second, mem_.data(), 4096, 0, &where, &mr), OTE_OK);
    EXPECT_EQ(mr->pd, ote_context_pd(second));
    EXPECT_EQ(ote_buffer_mr_drop(bm_, second, mr, cb, &rel, nullptr), OTE_OK);
    EXPECT_EQ(rel.calls, 2);
    EXPECT_EQ(ote_buffer_manager_single(bm_), 0u);
    EXPECT_EQ(Retained(OTE_RETAINED_MR), 0u);
}

// A provider's refusal of a single MR comes back with its errno and leaves nothing held.
TEST_F(ContextFaultTest, SingleMrRefusedByTheProviderHoldsNothing) {
    Open();
    ote_context_t *first = ote_context_set_get(set_, 0);
    ASSERT_EQ(ote_verbs_fault_fail(v_, OTE_VERBS_FAULT_OP_REG_MR, OTE_FAULT_NTH, 1, ENOMEM),
              OTE_OK);
    ibv_mr *mr = nullptr;
    ote_status_t st = ote_buffer_mr_reg(bm_, first, mem_.data(), 4096, 0, nullptr, &mr);
    EXPECT_EQ(ote_status_code(st), OTE_ERR_NATIVE);
    EXPECT_EQ(ote_status_errno(st), ENOMEM);
    EXPECT_EQ(mr, nullptr);
    EXPECT_EQ(ote_buffer_manager_single(bm_), 0u);
    EXPECT_EQ(ote_buffer_mr_reg(bm_, first, nullptr, 4096, 0, nullptr, &mr), OTE_ERR_INVALID);
    EXPECT_EQ(ote_buffer_mr_reg(bm_, first, mem_.data(), 0, 0, nullptr, &mr), OTE_ERR_INVALID);
    EXPECT_EQ(ote_buffer_mr_drop(bm_, first, nullptr, nullptr, nullptr, nullptr), OTE_ERR_INVALID);
}

TEST_F(ContextFaultTest, DeallocPdBusyRetainsTheContextAndCloseRetries) {
    Open();
    ASSERT_EQ(ote_buffer_manager_destroy(bm_), OTE_OK);
    bm_ = nullptr;
    ote_context_t *second = ote_context_set_get(set_, 1);
    ASSERT_EQ(
        ote_verbs_fault_destroy_busy(v_, OTE_VERBS_FAULT_OP_DEALLOC_PD, ote_context_pd(second), 1),
        OTE_OK);
    EXPECT_EQ(ote_status_code(ote_context_set_close(set_)), OTE_ERR_RETAINED);
    ASSERT_EQ(ote_context_set_count(set_), 1u);
    EXPECT_EQ(ote_context_set_get(set_, 0), second);
    EXPECT_EQ(ote_context_retained(second, OTE_RETAINED_PD), 1u);
    EXPECT_EQ(ote_context_set_close(set_), OTE_OK);
    set_ = nullptr;
}

TEST_F(ContextFaultTest, InjectedPortEventsPauseAndResumeOnlyTheSelectedPort) {
    Open();
    ote_context_t *ctx = ote_context_set_get(set_, 0);
    ibv_async_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.event_type = IBV_EVENT_PORT_ERR;
    ev.element.port_num = 2; // not the selected port: ignored (but acked)
    ASSERT_EQ(ote_verbs_fault_inject_async_event(v_, ote_context_native(ctx), &ev), OTE_OK);
    size_t handled = 0;
    ASSERT_EQ(ote_context_set_poll_events(set_, &handled), OTE_OK);
    EXPECT_EQ(handled, 1u);
    EXPECT_EQ(ote_context_check(ctx), OTE_OK);

    ev.element.port_num = 1;
    ASSERT_EQ(ote_verbs_fault_inject_async_event(v_, ote_context_native(ctx), &ev), OTE_OK);
    ASSERT_EQ(ote_context_set_poll_events(set_, &handled), OTE_OK);
    EXPECT_EQ(ote_context_check(ctx), OTE_ERR_PORT_DOWN);
    // Paused contexts still take persistent MRs (publication includes them).
    ote_buffer_t *buf = nullptr;
    ASSERT_EQ(ote_buffer_register(bm_, mem_.data(), mem_.size(), kAccess, &buf), OTE_OK);
    ibv_mr *mr = nullptr;
    EXPECT_EQ(ote_buffer_mr(buf, ctx, &mr), OTE_OK);
    EXPECT_EQ(ote_buffer_deregister(bm_, buf), OTE_OK);

    // PORT_ACTIVE refreshes the route from a real query: the sim port is active.
    ev.event_type = IBV_EVENT_PORT_ACTIVE;
    ASSERT_EQ(ote_verbs_fault_inject_async_event(v_, ote_context_native(ctx), &ev), OTE_OK);
    ASSERT_EQ(ote_context_set_poll_events(set_, &handled), OTE_OK);
    EXPECT_EQ(ote_context_check(ctx), OTE_OK);
}

// A refresh whose port query started before a PORT_ERR and returns after it (the query
// held by a delay rule) carries the port's older, active state: it must not resume the
// context the event paused. The route generation read before the query has moved, so the
// result is discarded (OTE_ERR_AGAIN). Without the generation check the stale result
// resumes the context (this test then sees OTE_OK). A fresh refresh then resumes it.
TEST_F(ContextFaultTest, StaleRefreshCannotClearANewerPortFault) {
    Open();
    ote_context_t *ctx = ote_context_set_get(set_, 0);
    ote_context_info_t info;
    ote_context_get_info(ctx, &info);
    uint64_t gen0 = info.route_generation;
    ote_verbs_fault_reset_counters(v_);
    ASSERT_EQ(ote_verbs_fault_delay(v_, OTE_VERBS_FAULT_OP_QUERY_PORT, 60000), OTE_OK);
    ote_status_t stale = OTE_OK;
    std::thread refresher([&] { stale = ote_context_refresh(ctx); });
    // The refresh is inside its (delayed) port query.
    ASSERT_TRUE(ote_test::WaitUntil(
        [&] { return ote_verbs_fault_injected(v_, OTE_VERBS_FAULT_OP_QUERY_PORT) >= 1; },
        std::chrono::seconds(30), "the refresh's port query held"));
    ibv_async_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.event_type = IBV_EVENT_PORT_ERR;
    ev.element.port_num = 1;
    ASSERT_EQ(ote_verbs_fault_inject_async_event(v_, ote_context_native(ctx), &ev), OTE_OK);
    ASSERT_EQ(ote_context_set_poll_events(set_, nullptr), OTE_OK);
    EXPECT_EQ(ote_context_check(ctx), OTE_ERR_PORT_DOWN);
    EXPECT_GT(ote_context_route_generation(ctx), gen0);
    ASSERT_EQ(ote_verbs_fault_delay(v_, OTE_VERBS_FAULT_OP_QUERY_PORT, 0), OTE_OK); // lift it
    refresher.join();
    EXPECT_EQ(stale, OTE_ERR_AGAIN) << ote_status_str(stale);
    EXPECT_EQ(ote_context_check(ctx), OTE_ERR_PORT_DOWN) << "a stale query resumed the context";
    EXPECT_EQ(ote_context_refresh(ctx), OTE_OK); // asked again: the sim port is active
    EXPECT_EQ(ote_context_check(ctx), OTE_OK);
}

// A get_async_event that fails (EIO, not EAGAIN) loses that context's event consumer:
// the context is fenced for good (OTE_CONTEXT_LOST, check OTE_ERR_FENCED with EIO, its
// route generation bumped so that upper layers fence its QPs), no refresh resumes it, its
// events are never asked for again, and new registrations skip it; the other context is
// untouched. Without the fence the failure was only logged and the context stayed ACTIVE.
TEST_F(ContextFaultTest, FailedGetAsyncEventLosesTheConsumerAndFencesTheDevice) {
    Open();
    ote_context_t *lost = ote_context_set_get(set_, 0), *other = ote_context_set_get(set_, 1);
    uint64_t gen0 = ote_context_route_generation(lost);
    ASSERT_EQ(ote_verbs_fault_fail(v_, OTE_VERBS_FAULT_OP_GET_ASYNC_EVENT, OTE_FAULT_NTH, 1, EIO),
              OTE_OK);
    ote_status_t st = OTE_OK;
    ExpectErrorLogsIn([&] { st = ote_context_set_poll_events(set_, nullptr); });
    EXPECT_EQ(st, ote_status_make(OTE_ERR_NATIVE, EIO));
    EXPECT_EQ(ote_context_state(lost), OTE_CONTEXT_LOST);
    EXPECT_EQ(ote_context_check(lost), ote_status_make(OTE_ERR_FENCED, EIO));
    EXPECT_GT(ote_context_route_generation(lost), gen0);
    EXPECT_EQ(ote_context_check(other), OTE_OK);
    EXPECT_EQ(ote_context_refresh(lost), ote_status_make(OTE_ERR_FENCED, EIO)); // not healed
    EXPECT_EQ(ote_context_state(lost), OTE_CONTEXT_LOST);
    // Never asked again: one more poll calls get_async_event for the other context only.
    ote_verbs_fault_clear(v_);
    uint64_t calls = ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_GET_ASYNC_EVENT);
    EXPECT_EQ(ote_context_set_poll_events(set_, nullptr), OTE_OK);
    EXPECT_EQ(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_GET_ASYNC_EVENT), calls + 1);
    ote_buffer_t *buf = nullptr;
    ASSERT_EQ(ote_buffer_register(bm_, mem_.data(), mem_.size(), kAccess, &buf), OTE_OK);
    ibv_mr *mr = nullptr;
    EXPECT_NE(ote_buffer_mr(buf, lost, &mr), OTE_OK); // no MR where events go unseen
    EXPECT_EQ(ote_buffer_mr(buf, other, &mr), OTE_OK);
    EXPECT_EQ(ote_buffer_deregister(bm_, buf), OTE_OK);
}

TEST_F(ContextFaultTest, DeviceFatalFencesAndPublicationSkipsTheContext) {
    Open();
    ote_context_t *fatal = ote_context_set_get(set_, 1);
    ibv_async_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.event_type = IBV_EVENT_DEVICE_FATAL;
    ASSERT_EQ(ote_verbs_fault_inject_async_event(v_, ote_context_native(fatal), &ev), OTE_OK);
    ExpectErrorLogsIn([&] { ASSERT_EQ(ote_context_set_poll_events(set_, nullptr), OTE_OK); });
    EXPECT_EQ(ote_context_check(fatal), OTE_ERR_DEVICE_FATAL);
    EXPECT_EQ(ote_context_refresh(fatal), OTE_ERR_DEVICE_FATAL); // a query cannot heal it
    ote_buffer_t *buf = nullptr;
    ASSERT_EQ(ote_buffer_register(bm_, mem_.data(), mem_.size(), kAccess, &buf), OTE_OK);
    ibv_mr *mr = nullptr;
    EXPECT_EQ(ote_buffer_mr(buf, fatal, &mr), OTE_ERR_NOT_FOUND);
    EXPECT_EQ(ote_buffer_mr(buf, ote_context_set_get(set_, 0), &mr), OTE_OK);
    EXPECT_EQ(ote_buffer_deregister(bm_, buf), OTE_OK);
}

// A provider without query_device_ex (EOPNOTSUPP) is asked query_device instead, and the
// limits come from it; a failing query_device then fails the open like any other verb.
TEST_F(ContextFaultTest, LimitsFallBackToQueryDeviceWithoutTheExtendedVerb) {
    ASSERT_EQ(ote_verbs_fault_fail(v_, OTE_VERBS_FAULT_OP_QUERY_DEVICE_EX, OTE_FAULT_EVERY, 0,
                                   EOPNOTSUPP),
              OTE_OK);
    ote_context_set_t *set = nullptr;
    ASSERT_EQ(ote_context_set_open(v_, nullptr, &set), OTE_OK);
    ote_context_info_t info;
    ote_context_get_info(ote_context_set_get(set, 0), &info);
    EXPECT_GT(info.limits.max_qp_wr, 0u);
    EXPECT_GT(info.limits.max_cqe, 0u);
    EXPECT_EQ(info.limits.max_qp_wr, (uint32_t)info.device_attr.max_qp_wr);
    EXPECT_GE(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_QUERY_DEVICE), 1u);
    ASSERT_EQ(ote_context_set_close(set), OTE_OK);
    ASSERT_EQ(ote_verbs_fault_fail(v_, OTE_VERBS_FAULT_OP_QUERY_DEVICE, OTE_FAULT_NTH, 1, EIO),
              OTE_OK);
    ote_status_t st = OTE_OK;
    ExpectErrorLogsIn([&] { st = ote_context_set_open(v_, nullptr, &set); });
    EXPECT_EQ(ote_status_errno(st), EIO);
    ote_verbs_fault_clear(v_);
}

TEST_F(ContextFaultTest, FailedOpenLeavesNothingAndRetrySucceeds) {
    const ote_verbs_fault_op_t ops[] = {OTE_VERBS_FAULT_OP_OPEN_DEVICE,
                                        OTE_VERBS_FAULT_OP_QUERY_DEVICE_EX,
                                        OTE_VERBS_FAULT_OP_ALLOC_PD};
    for (auto op : ops) {
        ote_verbs_fault_reset_counters(v_);
        ASSERT_EQ(ote_verbs_fault_fail(v_, op, OTE_FAULT_NTH, 2, EIO), OTE_OK);
        ote_context_set_t *set = nullptr;
        ote_status_t st = OTE_OK;
        ExpectErrorLogsIn([&] { st = ote_context_set_open(v_, nullptr, &set); });
        EXPECT_EQ(ote_status_errno(st), EIO) << ote_verbs_fault_op_name(op);
        EXPECT_EQ(set, nullptr);
        // Everything the first device got was undone.
        EXPECT_EQ(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_CLOSE_DEVICE),
                  ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_OPEN_DEVICE) -
                      (op == OTE_VERBS_FAULT_OP_OPEN_DEVICE ? 1 : 0))
            << ote_verbs_fault_op_name(op);
        EXPECT_EQ(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_DEALLOC_PD),
                  ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_ALLOC_PD) -
                      (op == OTE_VERBS_FAULT_OP_ALLOC_PD ? 1 : 0))
            << ote_verbs_fault_op_name(op);
        ote_verbs_fault_clear(v_);
    }
    Open();
}

TEST_F(ContextFaultTest, AllocationFailuresDuringRegistrationLeakNothing) {
    Open();
    int failures = 0;
    for (uint64_t n = 1; n < 200; n++) {
        ote_buffer_t *buf = nullptr;
        ote_status_t st;
        {
            ote_test::ErrorLogsExpected guard; // the provider's own allocations fail too
            ote_alloc_fail_nth(n);
            st = ote_buffer_register(bm_, mem_.data(), mem_.size(), kAccess, &buf);
            ote_alloc_fail_disarm();
        }
        EXPECT_EQ(ote_buffer_manager_retained(bm_), 0u) << n;
        if (st == OTE_OK) {
            EXPECT_EQ(ote_buffer_deregister(bm_, buf), OTE_OK);
            EXPECT_GT(failures, 0);
            return;
        }
        failures++;
        EXPECT_EQ(ote_buffer_manager_count(bm_), 0u) << n;
    }
    FAIL() << "registration never succeeded";
}

// The layer's own fault points: an armed point fails the call with its status before
// anything is made (no device opened, no MR registered, no output written), and the
// same call succeeds once it is disarmed.
TEST_F(ContextFaultTest, FaultPointsFailOpenAndRegisterBeforeAnythingIsMade) {
    ote_verbs_fault_reset_counters(v_);
    ASSERT_EQ(ote_fault_arm("context.set_open", OTE_FAULT_NTH, 1, OTE_ERR_NATIVE, EIO), OTE_OK);
    ote_context_set_t *set = nullptr;
    ote_status_t st = ote_context_set_open(v_, nullptr, &set);
    EXPECT_EQ(ote_status_code(st), OTE_ERR_NATIVE);
    EXPECT_EQ(ote_status_errno(st), EIO);
    EXPECT_EQ(set, nullptr);
    EXPECT_EQ(ote_fault_failures("context.set_open"), 1u);
    EXPECT_EQ(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_OPEN_DEVICE), 0u);
    Open(); // the NTH rule is spent: the next open succeeds
    ASSERT_EQ(ote_fault_arm("context.buffer_register", OTE_FAULT_NTH, 1, OTE_ERR_NOMEM, 0), OTE_OK);
    ote_verbs_fault_reset_counters(v_);
    ote_buffer_t *buf = nullptr;
    EXPECT_EQ(ote_buffer_register(bm_, mem_.data(), mem_.size(), kAccess, &buf), OTE_ERR_NOMEM);
    EXPECT_EQ(buf, nullptr);
    EXPECT_EQ(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_REG_MR), 0u);
    EXPECT_EQ(ote_buffer_manager_count(bm_), 0u);
    ASSERT_EQ(ote_buffer_register(bm_, mem_.data(), mem_.size(), kAccess, &buf), OTE_OK);
    EXPECT_EQ(ote_buffer_manager_count(bm_), 1u);
    EXPECT_EQ(ote_buffer_deregister(bm_, buf), OTE_OK);
}

} // namespace

// Drives context/ through the verbs fault decorator over the software provider: MR
// publication rolled back when the second context fails, EBUSY on dereg_mr and
// dealloc_pd retained and counted then retried, injected port events pausing and
// resuming a context, a stale refresh that must not clear a newer port fault, failed
// opens leaving nothing behind, and the reopen of a context whose event consumer was lost
// (new native context and PD, backoff after a failed try, an old PD that will not go
// retained until the set's close, registrations dropped and republished, concurrency).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
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

namespace {

// Loses ctx's event consumer through an injected get_async_event failure.
void LoseConsumer(ote_verbs_t *v, ote_context_set_t *set, ote_context_t *ctx) {
    ASSERT_EQ(ote_verbs_fault_fail(v, OTE_VERBS_FAULT_OP_GET_ASYNC_EVENT, OTE_FAULT_NTH,
                                   (int)ote_context_nic_id(ctx) + 1, EIO),
              OTE_OK);
    ote_test::ErrorLogsExpected lost_log;
    (void)ote_context_set_poll_events(set, nullptr);
    ote_verbs_fault_clear(v);
    ASSERT_EQ(ote_context_state(ctx), OTE_CONTEXT_LOST);
}

// Calls ote_context_reopen until it answers something other than OTE_ERR_AGAIN (the
// backoff after a failed try), for at most 30 s.
ote_status_t ReopenWhenDue(ote_context_t *ctx) {
    ote_status_t st = OTE_ERR_AGAIN;
    EXPECT_TRUE(ote_test::WaitUntil([&] { return (st = ote_context_reopen(ctx)) != OTE_ERR_AGAIN; },
                                    std::chrono::seconds(30), "the reopen's backoff to pass"));
    return st;
}

} // namespace

// A lost consumer ends with a reopen: a new native context and PD (the old ones released:
// one close_device, one dealloc_pd more), the context ACTIVE again with a newer route
// generation, its events asked for again, and a registration publishes an MR on the new
// PD. A context that is not LOST is not reopened. Without ote_context_reopen the context
// stayed LOST for the life of the set.
TEST_F(ContextFaultTest, ReopenAfterALostConsumerGivesANewNativeContextAndPd) {
    Open();
    ote_context_t *lost = ote_context_set_get(set_, 0), *other = ote_context_set_get(set_, 1);
    EXPECT_EQ(ote_context_reopen(other), OTE_ERR_STATE);
    LoseConsumer(v_, set_, lost);
    ibv_context *old_native = ote_context_native(lost);
    ibv_pd *old_pd = ote_context_pd(lost);
    uint64_t gen0 = ote_context_route_generation(lost);
    uint64_t opens0 = ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_OPEN_DEVICE);
    uint64_t closes0 = ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_CLOSE_DEVICE);
    uint64_t deallocs0 = ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_DEALLOC_PD);
    EXPECT_EQ(ote_context_resume(lost), OTE_ERR_STATE); // not reopened yet
    ASSERT_EQ(ote_context_reopen(lost), OTE_OK);
    // Reopened, not resumed: still fenced (the caller rebuilds first); a second reopen
    // does nothing.
    EXPECT_EQ(ote_context_check(lost), ote_status_make(OTE_ERR_FENCED, EIO));
    EXPECT_EQ(ote_context_reopen(lost), OTE_OK);
    ASSERT_EQ(ote_context_resume(lost), OTE_OK);
    EXPECT_EQ(ote_context_state(lost), OTE_CONTEXT_ACTIVE);
    EXPECT_EQ(ote_context_check(lost), OTE_OK);
    EXPECT_GT(ote_context_route_generation(lost), gen0);
    EXPECT_NE(ote_context_native(lost), old_native);
    EXPECT_NE(ote_context_pd(lost), old_pd);
    EXPECT_EQ(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_OPEN_DEVICE), opens0 + 1);
    EXPECT_EQ(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_CLOSE_DEVICE), closes0 + 1);
    EXPECT_EQ(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_DEALLOC_PD), deallocs0 + 1);
    ote_context_info_t info;
    ote_context_get_info(lost, &info);
    EXPECT_EQ(info.reopens, 1u);
    EXPECT_EQ(info.reopen_failures, 0u);
    EXPECT_EQ(info.retired_natives, 0u);
    EXPECT_EQ(Retained(OTE_RETAINED_PD), 0u);
    // Its events are consumed again: one poll asks both contexts.
    uint64_t calls = ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_GET_ASYNC_EVENT);
    EXPECT_EQ(ote_context_set_poll_events(set_, nullptr), OTE_OK);
    EXPECT_EQ(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_GET_ASYNC_EVENT), calls + 2);
    EXPECT_EQ(ote_context_reopen(lost), OTE_ERR_STATE); // healthy: nothing to reopen
    ote_buffer_t *buf = nullptr;
    ASSERT_EQ(ote_buffer_register(bm_, mem_.data(), mem_.size(), kAccess, &buf), OTE_OK);
    ibv_mr *mr = nullptr;
    ASSERT_EQ(ote_buffer_mr(buf, lost, &mr), OTE_OK);
    EXPECT_EQ(mr->pd, ote_context_pd(lost));
    EXPECT_EQ(ote_buffer_deregister(bm_, buf), OTE_OK);
}

// A reopen that fails (open_device ENODEV, then alloc_pd ENOMEM on the new device) keeps
// the context LOST and fenced with its status, says why (reopen_error), refuses to try
// again before its backoff (OTE_ERR_AGAIN, nothing opened), closes what the failed try
// opened, and a later try after the backoff succeeds.
TEST_F(ContextFaultTest, FailedReopenKeepsTheDeviceFencedAndRetriesAfterABackoff) {
    Open();
    ote_context_t *lost = ote_context_set_get(set_, 0);
    LoseConsumer(v_, set_, lost);
    ASSERT_EQ(ote_verbs_fault_fail(v_, OTE_VERBS_FAULT_OP_OPEN_DEVICE, OTE_FAULT_NTH, 1, ENODEV),
              OTE_OK);
    EXPECT_EQ(ote_context_reopen(lost), ote_status_make(OTE_ERR_NATIVE, ENODEV));
    EXPECT_EQ(ote_context_state(lost), OTE_CONTEXT_LOST);
    EXPECT_EQ(ote_context_check(lost), ote_status_make(OTE_ERR_FENCED, EIO));
    ote_context_info_t info;
    ote_context_get_info(lost, &info);
    EXPECT_EQ(info.reopen_failures, 1u);
    EXPECT_EQ(info.reopen_error, ote_status_make(OTE_ERR_NATIVE, ENODEV));
    uint64_t opens = ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_OPEN_DEVICE);
    EXPECT_EQ(ote_context_reopen(lost), OTE_ERR_AGAIN); // within the backoff: not tried
    EXPECT_EQ(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_OPEN_DEVICE), opens);
    ote_verbs_fault_clear(v_);
    ASSERT_EQ(ote_verbs_fault_fail(v_, OTE_VERBS_FAULT_OP_ALLOC_PD, OTE_FAULT_NTH, 1, ENOMEM),
              OTE_OK);
    uint64_t closes = ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_CLOSE_DEVICE);
    EXPECT_EQ(ReopenWhenDue(lost), ote_status_make(OTE_ERR_NATIVE, ENOMEM));
    EXPECT_EQ(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_CLOSE_DEVICE), closes + 1);
    EXPECT_EQ(ote_context_state(lost), OTE_CONTEXT_LOST);
    ote_verbs_fault_clear(v_);
    EXPECT_EQ(ReopenWhenDue(lost), OTE_OK);
    EXPECT_EQ(ote_context_resume(lost), OTE_OK);
    EXPECT_EQ(ote_context_check(lost), OTE_OK);
    ote_context_get_info(lost, &info);
    EXPECT_EQ(info.reopens, 1u);
    EXPECT_EQ(info.reopen_failures, 2u);
    EXPECT_EQ(info.reopen_error, OTE_OK);
}

// The old PD will not be deallocated (EBUSY): the reopen still succeeds on the new PD, the
// old PD and native context are retired (counted as a retained PD), and the set's close
// answers OTE_ERR_RETAINED until they are released; a later close releases them.
TEST_F(ContextFaultTest, OldPdThatWillNotGoIsRetainedUntilTheSetCloses) {
    Open();
    ASSERT_EQ(ote_buffer_manager_destroy(bm_), OTE_OK);
    bm_ = nullptr;
    ote_context_t *lost = ote_context_set_get(set_, 0);
    LoseConsumer(v_, set_, lost);
    ASSERT_EQ(
        ote_verbs_fault_destroy_busy(v_, OTE_VERBS_FAULT_OP_DEALLOC_PD, ote_context_pd(lost), 3),
        OTE_OK);
    ASSERT_EQ(ote_context_reopen(lost), OTE_OK);
    ASSERT_EQ(ote_context_resume(lost), OTE_OK);
    EXPECT_EQ(ote_context_check(lost), OTE_OK);
    ote_context_info_t info;
    ote_context_get_info(lost, &info);
    EXPECT_EQ(info.retired_natives, 1u);
    EXPECT_EQ(ote_context_retained(lost, OTE_RETAINED_PD), 1u);
    EXPECT_EQ(ote_status_code(ote_context_set_close(set_)), OTE_ERR_RETAINED);
    EXPECT_EQ(ote_context_retained(lost, OTE_RETAINED_PD), 1u);
    EXPECT_EQ(ote_context_set_close(set_), OTE_OK);
    set_ = nullptr;
}

// Two threads reopen the same LOST context while a third reads its native context, PD,
// admission and info: one reopen opens the device once, the other is told BUSY (one runs)
// or OK (done already, nothing opened again), and the readers see either the old or the new natives, never
// a torn pair (the swap happens while the context admits nothing). For TSan.
TEST_F(ContextFaultTest, ConcurrentReopensOneWinsReadersSeeAWholeContext) {
    Open();
    ote_context_t *lost = ote_context_set_get(set_, 0);
    LoseConsumer(v_, set_, lost);
    std::atomic<bool> stop{false};
    std::thread reader([&] {
        while (!stop.load()) {
            ote_context_info_t info;
            ote_context_get_info(lost, &info);
            (void)ote_context_native(lost);
            (void)ote_context_pd(lost);
            (void)ote_context_check(lost);
        }
    });
    ote_status_t st[2] = {OTE_ERR_INVALID, OTE_ERR_INVALID};
    uint64_t opens0 = ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_OPEN_DEVICE);
    std::thread a([&] { st[0] = ote_context_reopen(lost); });
    std::thread b([&] { st[1] = ote_context_reopen(lost); });
    a.join();
    b.join();
    EXPECT_EQ(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_OPEN_DEVICE), opens0 + 1);
    EXPECT_EQ(ote_context_resume(lost), OTE_OK);
    stop.store(true);
    reader.join();
    int ok = 0;
    for (ote_status_t s : st) {
        if (s == OTE_OK) ok++;
        else EXPECT_EQ(s, OTE_ERR_BUSY) << ote_status_str(s);
    }
    EXPECT_GE(ok, 1);
    EXPECT_EQ(ote_context_check(lost), OTE_OK);
    ote_context_info_t info;
    ote_context_get_info(lost, &info);
    EXPECT_EQ(info.reopens, 1u);
}

// A reopen with the buffer manager: the registrations' MRs of the lost context are
// dropped (deregistered; the other context's stay), and after the reopen republished on
// the new PD, including a registration made while the context was LOST (it had none
// there). An MR that will not deregister becomes a counted orphan, which the reclaim
// deregisters later.
TEST_F(ContextFaultTest, RegistrationsAreDroppedThenRepublishedOnTheReopenedPd) {
    Open();
    ote_context_t *lost = ote_context_set_get(set_, 0), *other = ote_context_set_get(set_, 1);
    ote_buffer_t *a = nullptr, *b = nullptr;
    ASSERT_EQ(ote_buffer_register(bm_, mem_.data(), 4096, kAccess, &a), OTE_OK);
    ibv_mr *other_mr = nullptr, *mr = nullptr;
    ASSERT_EQ(ote_buffer_mr(a, other, &other_mr), OTE_OK);
    LoseConsumer(v_, set_, lost);
    ASSERT_EQ(ote_buffer_register(bm_, mem_.data() + 8192, 4096, kAccess, &b), OTE_OK);
    EXPECT_NE(ote_buffer_mr(b, lost, &mr), OTE_OK); // none while LOST
    ASSERT_EQ(ote_verbs_fault_destroy_busy(v_, OTE_VERBS_FAULT_OP_DEREG_MR, nullptr, 1), OTE_OK);
    EXPECT_EQ(ote_buffer_manager_drop_context(bm_, lost), 1u);
    EXPECT_EQ(ote_buffer_manager_retained(bm_), 1u); // the orphan
    EXPECT_NE(ote_buffer_mr(a, lost, &mr), OTE_OK);
    ASSERT_EQ(ote_buffer_manager_reclaim(bm_, nullptr), OTE_OK);
    EXPECT_EQ(ote_buffer_manager_retained(bm_), 0u);
    ASSERT_EQ(ote_context_reopen(lost), OTE_OK);
    size_t made = 0;
    ASSERT_EQ(ote_buffer_manager_republish(bm_, lost, &made), OTE_OK);
    EXPECT_EQ(made, 2u);
    // Listed after that republish but before the resume: none there yet; the second
    // republish (after the resume) gives it one.
    ote_buffer_t *c = nullptr;
    ASSERT_EQ(ote_buffer_register(bm_, mem_.data() + 16384, 4096, kAccess, &c), OTE_OK);
    EXPECT_NE(ote_buffer_mr(c, lost, &mr), OTE_OK);
    ASSERT_EQ(ote_context_resume(lost), OTE_OK);
    ASSERT_EQ(ote_buffer_manager_republish(bm_, lost, &made), OTE_OK);
    EXPECT_EQ(made, 3u);
    for (ote_buffer_t *buf : {a, b, c}) {
        ASSERT_EQ(ote_buffer_mr(buf, lost, &mr), OTE_OK);
        EXPECT_EQ(mr->pd, ote_context_pd(lost));
    }
    ibv_mr *still = nullptr;
    ASSERT_EQ(ote_buffer_mr(a, other, &still), OTE_OK);
    EXPECT_EQ(still, other_mr); // the other context's MR untouched
    EXPECT_EQ(ote_buffer_deregister(bm_, a), OTE_OK);
    EXPECT_EQ(ote_buffer_deregister(bm_, b), OTE_OK);
    EXPECT_EQ(ote_buffer_deregister(bm_, c), OTE_OK);
}

// A dma-buf registration (GPUDirect RDMA's shape; a memfd stands in for a GPU's dma-buf)
// is published anew on the reopened PD from the buffer's own duplicate of the fd: the
// caller closed its fd right after registering, and the new MR covers the same bytes of
// the dma-buf at the same iova. The duplicate goes with the buffer.
TEST_F(ContextFaultTest, DmabufRegistrationRepublishedFromItsOwnFd) {
    Open();
    ote_context_t *lost = ote_context_set_get(set_, 0);
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    int fd = memfd_create("dmabuf", MFD_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, static_cast<off_t>(4 * page)), 0);
    const int fds0 = ote_test::CountOpenFds();
    void *iova = reinterpret_cast<void *>(0x7e0000000000ull + page + 123);
    const size_t len = 2 * page + 5;
    ote_buffer_t *buf = nullptr;
    ASSERT_EQ(ote_buffer_register_dmabuf(bm_, iova, len, kAccess, fd, page + 123, &buf), OTE_OK);
    close(fd);                                 // the caller's; the buffer keeps its own
    EXPECT_EQ(ote_test::CountOpenFds(), fds0); // the memfd's place taken by the duplicate
    LoseConsumer(v_, set_, lost);
    EXPECT_EQ(ote_buffer_manager_drop_context(bm_, lost), 1u);
    ibv_mr *mr = nullptr;
    EXPECT_NE(ote_buffer_mr(buf, lost, &mr), OTE_OK);
    ASSERT_EQ(ote_context_reopen(lost), OTE_OK);
    ASSERT_EQ(ote_context_resume(lost), OTE_OK);
    size_t made = 0;
    ASSERT_EQ(ote_buffer_manager_republish(bm_, lost, &made), OTE_OK);
    EXPECT_EQ(made, 1u);
    ASSERT_EQ(ote_buffer_mr(buf, lost, &mr), OTE_OK);
    EXPECT_EQ(mr->pd, ote_context_pd(lost));
    EXPECT_EQ(mr->length, len);
    ibv_mr *found = nullptr;
    EXPECT_EQ(ote_buffer_manager_find(bm_, iova, len, lost, &found), OTE_OK);
    EXPECT_EQ(found, mr);
    EXPECT_EQ(ote_buffer_deregister(bm_, buf), OTE_OK);
    EXPECT_EQ(ote_test::CountOpenFds(), fds0 - 1); // the duplicate closed with the buffer
}

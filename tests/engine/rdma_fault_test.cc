// RDMA transport under verbs faults, engine to engine: both engines run in this process
// over verbs/sim, each wrapped by the verbs fault decorator through the transport's test
// hook (engine/rdma/test_hook.h), so a test arms faults on either side. Between each
// decorator and its sim sits a NativeCounter: it counts the native objects (QPs, MWs,
// MRs) that really exist, so a test checks what a failure released or retained, and
// every test ends by checking that destroying both engines released every one of them.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/engine/native_counter.h"
#include "tests/util/test_base.h"
#include "tests/util/wait.h"

extern "C" {
#include "base/retained.h"
#include "base/time.h"
#include "engine/rdma/test_hook.h"
#include "ote/ote.h"
#include "verbs/fault.h"
}

namespace {

constexpr uint64_t kMs = 1000000ull;
constexpr uint64_t kSec = 1000 * kMs;
constexpr size_t kBlock = 64u << 10;

using ote_test::NativeCounter;

std::vector<ote_verbs_t *> *g_wrapped = nullptr;
std::vector<std::unique_ptr<NativeCounter>> *g_owned = nullptr;

ote_status_t WrapWithFault(ote_verbs_t **v) { return ote_test::WrapCounted(v, g_owned, g_wrapped); }

class RdmaFaultTest : public ote_test::OteTest {
  protected:
    void SetUp() override {
        OteTest::SetUp();
        g_wrapped = &wrapped_;
        g_owned = &counters_;
        retained0_ = ote_retained_total();
        ote__rdma_test_verbs_hook = WrapWithFault;
        src_ = Create(timeout_ms_);
        req_ = Create(timeout_ms_);
        ote__rdma_test_verbs_hook = nullptr;
        ASSERT_NE(src_, nullptr);
        ASSERT_NE(req_, nullptr);
        ASSERT_EQ(wrapped_.size(), 2u);
        vs_ = wrapped_[0];
        vr_ = wrapped_[1];
        ns_ = counters_[0].get();
        nr_ = counters_[1].get();
        mem_.assign(4u << 20, 0);
        ASSERT_EQ(
            ote_memory_register(src_, mem_.data(), mem_.size(), OTE_PERM_READ | OTE_PERM_WRITE),
            OTE_OK);
        char addr[300];
        ASSERT_EQ(ote_engine_address(src_, addr, sizeof(addr)), OTE_OK);
        ASSERT_EQ(ote_segment_open(req_, addr, &seg_), OTE_OK);
        out_.resize(1u << 20);
        for (size_t i = 0; i < out_.size(); i++) out_[i] = (uint8_t)(i * 13 + 5);
    }
    void TearDown() override {
        DestroyEngines();
        // Every native object either engine created was destroyed with it: nothing a
        // failure touched was leaked, and nothing was retained.
        for (auto &c : counters_) {
            EXPECT_TRUE(c->closed.load()) << "an engine did not close its provider";
            EXPECT_EQ(c->qps.load(), 0) << "QPs left alive";
            EXPECT_EQ(c->mws.load(), 0) << "memory windows left alive";
            EXPECT_EQ(c->mrs.load(), 0) << "memory regions left alive";
        }
        EXPECT_EQ(ote_retained_total(), retained0_);
        ote__rdma_test_verbs_hook = nullptr;
        OteTest::TearDown();
    }
    void DestroyEngines() {
        if (seg_) {
            EXPECT_EQ(ote_segment_close(seg_), OTE_OK);
        }
        seg_ = nullptr;
        if (req_) {
            EXPECT_EQ(ote_engine_destroy(req_), OTE_OK);
        }
        req_ = nullptr;
        /* A source grant whose requester vanished keeps its registration pinned until its
         * own deadline; destroy waits for that (bounded) and drops the registration. */
        if (src_) {
            EXPECT_EQ(ote_engine_destroy(src_), OTE_OK);
        }
        src_ = nullptr;
        vs_ = vr_ = nullptr;
    }
    // The source's registration of mem_ is not pinned by anything: it can be dropped
    // (within 30 s: a refused grant ends on the source's own threads, at once unless the
    // machine is loaded). It is registered again at once, so the test goes on as before.
    bool SourceRegistrationFree() {
        ote_status_t st = OTE_ERR_BUSY;
        ote_test::WaitUntil(
            [&] { return (st = ote_memory_unregister(src_, mem_.data())) != OTE_ERR_BUSY; },
            std::chrono::seconds(30), "the source's registration to unregister (not BUSY)");
        if (st != OTE_OK) return false;
        return ote_memory_register(src_, mem_.data(), mem_.size(),
                                   OTE_PERM_READ | OTE_PERM_WRITE) == OTE_OK;
    }
    static ote_engine_t *Create(const char *timeout_ms) {
        ote_config_t *cfg = nullptr;
        EXPECT_EQ(ote_config_create(&cfg), OTE_OK);
        EXPECT_EQ(ote_config_set(cfg, "transport", "rdma"), OTE_OK);
        EXPECT_EQ(ote_config_set(cfg, "verbs_provider", "sim"), OTE_OK);
        EXPECT_EQ(ote_config_set(cfg, "transfer_timeout_ms", timeout_ms), OTE_OK);
        // One data device: these tests count the windows and QPs of one grant manager
        // (striping over the sim's two devices is covered by rdma_stripe_test).
        EXPECT_EQ(ote_config_set(cfg, "rdma_devices", "sim0"), OTE_OK);
        ote_engine_t *e = nullptr;
        EXPECT_EQ(ote_engine_create(cfg, &e), OTE_OK);
        ote_config_destroy(cfg);
        return e;
    }
    ote_status_t Write(size_t len, uint64_t off = 0) {
        ote_batch_t *b = nullptr;
        EXPECT_EQ(ote_batch_create(req_, 1, &b), OTE_OK);
        ote_request_t r = {OTE_WRITE, out_.data(), seg_, (uint64_t)(uintptr_t)mem_.data() + off,
                           len};
        ote_status_t st = ote_batch_submit(b, &r, 1);
        if (st == OTE_OK) st = ote_batch_wait(b, 30 * kSec);
        if (st != OTE_OK) {
            ote_transfer_status_t ts;
            EXPECT_EQ(ote_batch_status(b, 0, &ts), OTE_OK);
            if (ts.state == OTE_TRANSFER_FAILED) st = ts.error;
        }
        EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
        return st;
    }

    // The source's transport counters (engine/rdma/test_hook.h).
    ote__rdma_test_grants_t SourceGrants() {
        char addr[300];
        ote__rdma_test_grants_t g{};
        EXPECT_EQ(ote_engine_address(src_, addr, sizeof(addr)), OTE_OK);
        EXPECT_EQ(ote__rdma_test_grants(addr, &g), OTE_OK);
        return g;
    }
    // Whether the source grants host memory by exact MRs (rdma_grant_mode auto on a
    // device without type-2 windows: the nomw profile) instead of windows; there a
    // grant's native step that can fail is its MR's registration, not a bind.
    bool SourceGrantsByMr() { return SourceGrants().grant_mode_mr != 0; }
    // Exact-MR grants: every QP of the requester's direct WRITE endpoint (one per lane, 2
    // by default) built at both ends, each source QP with the MR of its own receive queue
    // (a private PD has no SRQ), so that the next reg_mr at the source is a grant's.
    void BuildEveryDirectWriteQp() {
        for (int i = 0; i < 2; i++) ASSERT_EQ(Write(kBlock), OTE_OK);
        ASSERT_TRUE(ote_test::WaitUntil([&] { return SourceGrants().direct_qps >= 2; },
                                        std::chrono::seconds(30),
                                        "the source's direct QPs of both lanes"));
        ASSERT_TRUE(SourceRegistrationFree()) << "the warm-up grants' pins were never released";
    }
    // The source's MRs over mem_ (its registration's and its live grants' exact MRs).
    void WatchSourceMem() {
        ns_->watch_lo = (uintptr_t)mem_.data();
        ns_->watch_hi = (uintptr_t)mem_.data() + mem_.size();
    }
    // A grant by exact MR whose registration fails at the source (how = OTE_FAULT_NTH 1:
    // once; OTE_FAULT_EVERY: every time), the equivalent of a window's failed bind or
    // alloc: the grant is refused, the requester told OTE_ERR_REMOTE_ACCESS, no byte
    // touched; on the source no exact MR is left (none alive in the provider, none
    // counted or retained) and the registration is not pinned; once registrations work
    // the next transfer lands through a new exact MR.
    void ExactMrFailureRefusesTheGrant(ote_fault_mode_t how, int err) {
        BuildEveryDirectWriteQp();
        std::fill(mem_.begin(), mem_.end(), 0);
        WatchSourceMem();
        const int64_t mrs0 = ns_->mrs.load(), watched0 = ns_->watched_mrs.load();
        const ote__rdma_test_grants_t g0 = SourceGrants();
        ote_test::ErrorLogsExpected fault_logs; // from the fault to the end of the test body
        ASSERT_EQ(ote_verbs_fault_fail(vs_, OTE_VERBS_FAULT_OP_REG_MR, how, 1, err), OTE_OK);
        ote_status_t st = Write(2 * kBlock);
        EXPECT_EQ(ote_status_code(st), OTE_ERR_REMOTE_ACCESS) << ote_status_str(st);
        EXPECT_GE(ote_verbs_fault_injected(vs_, OTE_VERBS_FAULT_OP_REG_MR), 1u);
        for (size_t i = 0; i < 2 * kBlock; i++)
            ASSERT_EQ(mem_[i], 0) << "a refused grant wrote at " << i;
        ote__rdma_test_grants_t g = SourceGrants();
        EXPECT_EQ(g.direct_mrs, 0u) << "the refused grant left an exact MR counted";
        EXPECT_EQ(g.direct_host_served, g0.direct_host_served) << "a refused grant was served";
        EXPECT_EQ(g.live_source, 0u);
        EXPECT_EQ(ns_->mrs.load(), mrs0) << "an MR exists although its registration failed";
        EXPECT_EQ(ns_->watched_mrs.load(), watched0) << "an exact MR over the range is alive";
        EXPECT_EQ(ote_retained_count(OTE_RETAINED_MR), 0u);
        ote_verbs_fault_clear(vs_); // the check below registers the range again
        EXPECT_TRUE(SourceRegistrationFree())
            << "the refused grant left the source's registration pinned";
        EXPECT_EQ(ote_retained_total(), retained0_);
        EXPECT_EQ(Write(2 * kBlock), OTE_OK);
        EXPECT_EQ(memcmp(mem_.data(), out_.data(), 2 * kBlock), 0);
        EXPECT_GT(SourceGrants().direct_host_served, g0.direct_host_served)
            << "the working grant was not served by an exact MR";
    }

    // Both engines' transfer_timeout_ms. Generous: every transfer that must succeed
    // (the first one builds the QPs) runs under it, on a machine that may be loaded; a
    // test that waits for the deadline sets a shorter one in its constructor.
    const char *timeout_ms_ = "30000";
    std::vector<ote_verbs_t *> wrapped_;
    std::vector<std::unique_ptr<NativeCounter>> counters_; // outlive the engines
    uint64_t retained0_ = 0;
    ote_engine_t *src_ = nullptr, *req_ = nullptr;
    ote_verbs_t *vs_ = nullptr, *vr_ = nullptr;   // fault decorators (owned by the engines)
    NativeCounter *ns_ = nullptr, *nr_ = nullptr; // source's and requester's sims
    ote_segment_t *seg_ = nullptr;
    std::vector<uint8_t> mem_, out_;
};

// A data CQE lost at the requester: the transfer fails at its deadline, its QP is fenced
// and destroyed before the request ends (nothing the NIC could still write is given
// back), and the next transfer works over a rebuilt QP. The order is observed, not
// inferred: the requester's first QP destroy after the fault is held inside the provider
// while the test reads the request's state, which must still be PENDING.
class RdmaFaultDeadlineTest : public RdmaFaultTest {
  protected:
    // 5 s: the test waits for it, and the QP-building write before the fault must end
    // within it too, on a loaded machine.
    RdmaFaultDeadlineTest() { timeout_ms_ = "5000"; }
};

TEST_F(RdmaFaultDeadlineTest, LostCqeFailsAtDeadlineQpDestroyedBeforeTheRequestEnds) {
    ASSERT_EQ(Write(kBlock), OTE_OK); /* QPs built */
    ASSERT_GE(nr_->qps.load(), 1);
    uint64_t destroyed0 = nr_->qps_destroyed.load();
    ote_test::ErrorLogsExpected fault_logs; // from the fault to the end of the test body
    ASSERT_EQ(ote_verbs_fault_lose_cqe_nth(vr_, nullptr, 2), OTE_OK);
    nr_->hold_next_qp_destroy = true;
    ote_batch_t *b = nullptr;
    ASSERT_EQ(ote_batch_create(req_, 1, &b), OTE_OK);
    ote_request_t r = {OTE_WRITE, out_.data(), seg_, (uint64_t)(uintptr_t)mem_.data(), 4 * kBlock};
    uint64_t t0 = ote_now_ns();
    ASSERT_EQ(ote_batch_submit(b, &r, 1), OTE_OK);
    // The fenced QP's destroy arrives (at the 5 s deadline) and waits for us.
    bool held = ote_test::WaitUntil([&] { return nr_->holding.load(); }, std::chrono::seconds(30),
                                    "the fenced QP's destroy held");
    ote_transfer_status_t during{};
    EXPECT_EQ(ote_batch_status(b, 0, &during), OTE_OK);
    nr_->hold_next_qp_destroy = false;
    nr_->release = true;
    EXPECT_TRUE(held) << "no QP was destroyed within 30 s of the lost CQE";
    EXPECT_EQ(during.state, OTE_TRANSFER_PENDING)
        << "the request ended (state " << during.state << ") before its fenced QP was destroyed";
    EXPECT_EQ(ote_batch_wait(b, 30 * kSec), OTE_ERR_TIMEOUT);
    uint64_t took = ote_now_ns() - t0;
    ote_transfer_status_t ts{};
    ASSERT_EQ(ote_batch_status(b, 0, &ts), OTE_OK);
    EXPECT_EQ(ts.state, OTE_TRANSFER_TIMEOUT);
    EXPECT_EQ(ote_status_code(ts.error), OTE_ERR_TIMEOUT) << ote_status_str(ts.error);
    EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    EXPECT_EQ(ote_verbs_fault_injected(vr_, OTE_VERBS_FAULT_OP_POLL_CQ), 1u);
    EXPECT_GE(took, 5000 * kMs) << "ended before its 5 s deadline";
    EXPECT_LT(took, 60 * kSec); // the 30 s holding loop and the 30 s wait, at worst
    EXPECT_GE(nr_->qps_destroyed.load(), destroyed0 + 1)
        << "the fenced QP's destroy did not succeed";
    ote_verbs_fault_clear(vr_);
    std::fill(mem_.begin(), mem_.end(), 0);
    EXPECT_EQ(Write(3 * kBlock + 100, 4096), OTE_OK);
    EXPECT_EQ(memcmp(mem_.data() + 4096, out_.data(), 3 * kBlock + 100), 0);
    EXPECT_EQ(ote_retained_total(), retained0_);
}

// The source's MW bind fails (its post is refused): the grant is refused, the requester
// is told OTE_ERR_REMOTE_ACCESS, no byte is touched, and the next transfer works (the
// requester retired the QP whose other end the failed bind broke). On the source, what
// the grant held is released and nothing is retained: the window that was never bound
// stays with the source's pool (no new MW is created for a refused grant), its
// registration is not left pinned, and no owner is counted as retained.
//
// A source without windows (the nomw profile) binds nothing: there the grant's exact MR
// fails to register, once, with the same outcome (ExactMrFailureRefusesTheGrant).
TEST_F(RdmaFaultTest, BindFailureRefusesTheGrantRequesterTold) {
    if (SourceGrantsByMr()) return ExactMrFailureRefusesTheGrant(OTE_FAULT_NTH, EINVAL);
    ASSERT_EQ(Write(kBlock), OTE_OK);
    std::fill(mem_.begin(), mem_.end(), 0);
    // The source ends the first grant (window back to its pool, then the pin released)
    // after the requester saw COMPLETED: wait for that before counting its windows, or the
    // refused grant below may find the pool still empty and rightly create a window.
    ASSERT_TRUE(SourceRegistrationFree()) << "the first grant's pin was never released";
    int64_t mws0 = ns_->mws.load();
    ASSERT_GE(mws0, 1) << "the first grant bound no window";
    // The source posts nothing but binds on its send queues (receipts arrive on its RQ).
    ote_test::ErrorLogsExpected fault_logs; // from the fault to the end of the test body
    ASSERT_EQ(ote_verbs_fault_fail(vs_, OTE_VERBS_FAULT_OP_POST_SEND, OTE_FAULT_NTH, 1, EINVAL),
              OTE_OK);
    ote_status_t st = Write(2 * kBlock);
    EXPECT_EQ(ote_status_code(st), OTE_ERR_REMOTE_ACCESS) << ote_status_str(st) << [&] {
        std::string all;
        for (auto &l : Logs()) all += l + "\n";
        return all;
    }();
    EXPECT_EQ(ote_verbs_fault_injected(vs_, OTE_VERBS_FAULT_OP_POST_SEND), 1u);
    for (size_t i = 0; i < 2 * kBlock; i++)
        ASSERT_EQ(mem_[i], 0) << "a refused grant wrote at " << i;
    // Released on the source: the registration is free, no window was added or retained.
    EXPECT_TRUE(SourceRegistrationFree())
        << "the refused grant left the source's registration pinned";
    EXPECT_LE(ns_->mws.load(), mws0) << "the refused grant left a new window alive";
    EXPECT_EQ(ote_retained_count(OTE_RETAINED_MW), 0u);
    EXPECT_EQ(ote_retained_total(), retained0_);
    EXPECT_EQ(Write(2 * kBlock), OTE_OK);
    EXPECT_EQ(memcmp(mem_.data(), out_.data(), 2 * kBlock), 0);
}

// A requester's temporary MR (over its unregistered buffer) whose dereg fails when its
// run ends: the request still completes, the MR is the buffer manager's orphan (counted
// retained, logged), and the monitor's reclaim deregisters it once the provider agrees:
// nothing retained, no single MR held, the MR gone from the sim.
TEST_F(RdmaFaultTest, TemporaryMrWhoseDeregFailsIsReclaimedByTheMonitor) {
    char addr[300];
    ASSERT_EQ(ote_engine_address(req_, addr, sizeof(addr)), OTE_OK);
    auto grants = [&] {
        ote__rdma_test_grants_t g;
        EXPECT_EQ(ote__rdma_test_grants(addr, &g), OTE_OK);
        return g;
    };
    ASSERT_EQ(Write(kBlock), OTE_OK); // builds the QPs
    const int64_t mrs0 = nr_->mrs.load();
    ASSERT_EQ(ote_verbs_fault_destroy_busy(vr_, OTE_VERBS_FAULT_OP_DEREG_MR, nullptr, 1), OTE_OK);
    ASSERT_EQ(Write(2 * kBlock), OTE_OK);
    EXPECT_EQ(memcmp(mem_.data(), out_.data(), 2 * kBlock), 0);
    EXPECT_EQ(ote_verbs_fault_injected(vr_, OTE_VERBS_FAULT_OP_DEREG_MR), 1u);
    EXPECT_TRUE(LogContains("temporary MR"));
    // Retained until a reclaim (the monitor's, every 50 ms) deregisters it.
    EXPECT_TRUE(ote_test::WaitUntil([&] { return grants().mrs_retained == 0; },
                                    std::chrono::seconds(30),
                                    "the monitor's reclaim to deregister the temporary MR"));
    ote__rdma_test_grants_t g = grants();
    EXPECT_EQ(g.mrs_single, 0u) << "a temporary MR still held";
    EXPECT_EQ(nr_->mrs.load(), mrs0) << "the temporary MR is still alive in the provider";
    EXPECT_EQ(ote_retained_total(), retained0_);
}

// alloc_mw failing at the source: refused before any window, requester told. On the
// source no window exists afterwards (none was created, none is retained), the
// registration is not pinned, and once alloc_mw works again the next grant creates its
// window and the transfer lands. A source without windows (the nomw profile): every
// registration of a grant's exact MR fails instead, with the same outcome.
TEST_F(RdmaFaultTest, AllocMwFailureRefusesTheGrant) {
    if (SourceGrantsByMr()) return ExactMrFailureRefusesTheGrant(OTE_FAULT_EVERY, ENOMEM);
    ote_test::ErrorLogsExpected fault_logs; // from the fault to the end of the test body
    ASSERT_EQ(ote_verbs_fault_fail(vs_, OTE_VERBS_FAULT_OP_ALLOC_MW, OTE_FAULT_EVERY, 0, ENOMEM),
              OTE_OK);
    ote_status_t st = Write(kBlock);
    EXPECT_EQ(ote_status_code(st), OTE_ERR_REMOTE_ACCESS) << ote_status_str(st);
    EXPECT_GE(ote_verbs_fault_injected(vs_, OTE_VERBS_FAULT_OP_ALLOC_MW), 1u);
    EXPECT_EQ(ns_->mws.load(), 0) << "a window exists although every alloc_mw failed";
    for (size_t i = 0; i < kBlock; i++) ASSERT_EQ(mem_[i], 0) << "a refused grant wrote at " << i;
    EXPECT_TRUE(SourceRegistrationFree())
        << "the refused grant left the source's registration pinned";
    EXPECT_EQ(ote_retained_total(), retained0_);
    ote_verbs_fault_clear(vs_);
    EXPECT_EQ(Write(kBlock), OTE_OK);
    EXPECT_EQ(memcmp(mem_.data(), out_.data(), kBlock), 0);
    EXPECT_GE(ns_->mws.load(), 1) << "the working grant bound no window";
}

} // namespace

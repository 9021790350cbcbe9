// ote_engine_destroy when something below it cannot be destroyed: an RDMA engine over
// verbs/sim, wrapped by the verbs fault decorator through the transport's test hook
// (engine/rdma/test_hook.h), with a counter of the native QPs, MWs and MRs between the
// decorator and the sim. A native destroy made to fail (destroy_qp, dealloc_mw,
// destroy_cq, dereg_mr, dealloc_pd) leaves the engine retained: destroy answers
// OTE_ERR_RETAINED, the memory stays registered while a QP or window could still reach it,
// every other call answers OTE_ERR_STATE, and a later destroy retries what is left and
// frees everything (LSan checks under --config=asan). A control thread stuck in a native
// call at destroy keeps the engine alive (never freed under it) until it ends.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <ostream>
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

constexpr uint64_t kSec = 1000000000ull;

using Native = ote_test::NativeCounter;

std::vector<ote_verbs_t *> *g_wrapped = nullptr;
std::vector<std::unique_ptr<Native>> *g_owned = nullptr;

ote_status_t Wrap(ote_verbs_t **v) { return ote_test::WrapCounted(v, g_owned, g_wrapped); }

class EngineDestroyTest : public ote_test::OteTest {
  protected:
    void SetUp() override {
        OteTest::SetUp();
        g_wrapped = &wrapped_;
        g_owned = &natives_;
        retained0_ = ote_retained_total();
        transports0_ = ote__rdma_retained_transports_get();
        ote__rdma_test_verbs_hook = Wrap;
        src_ = Create(src_connect_ms_, src_transfer_ms_);
        req_ = Create("30000");
        ote__rdma_test_verbs_hook = nullptr;
        ASSERT_NE(src_, nullptr);
        ASSERT_NE(req_, nullptr);
        ASSERT_EQ(wrapped_.size(), 2u);
        vs_ = wrapped_[0];
        ns_ = natives_[0].get();
        nr_ = natives_[1].get();
        mem_.assign(4u << 20, 0);
        out_.resize(1u << 20);
        ns_->watch_lo = (uintptr_t)mem_.data();
        ns_->watch_hi = (uintptr_t)mem_.data() + mem_.size();
        nr_->watch_lo = (uintptr_t)out_.data();
        nr_->watch_hi = (uintptr_t)out_.data() + out_.size();
        ASSERT_EQ(
            ote_memory_register(src_, mem_.data(), mem_.size(), OTE_PERM_READ | OTE_PERM_WRITE),
            OTE_OK);
        char addr[300];
        ASSERT_EQ(ote_engine_address(src_, addr, sizeof(addr)), OTE_OK);
        ASSERT_EQ(ote_segment_open(req_, addr, &seg_), OTE_OK);
        for (size_t i = 0; i < out_.size(); i++) out_[i] = (uint8_t)(i * 7 + 3);
    }
    void TearDown() override {
        if (batch_ != nullptr) {
            EXPECT_EQ(ote_batch_destroy(batch_), OTE_OK);
        }
        if (seg_ != nullptr) {
            EXPECT_EQ(ote_segment_close(seg_), OTE_OK);
        }
        if (req_ != nullptr) {
            EXPECT_EQ(ote_engine_destroy(req_), OTE_OK);
        }
        if (src_ != nullptr) {
            if (vs_ != nullptr) ote_verbs_fault_clear(vs_);
            ns_->release = true;
            EXPECT_EQ(ote_engine_destroy(src_), OTE_OK);
        }
        for (auto &n : natives_) {
            EXPECT_TRUE(n->closed.load()) << "an engine did not close its provider";
            EXPECT_EQ(n->qps.load(), 0) << "QPs left alive";
            EXPECT_EQ(n->mws.load(), 0) << "memory windows left alive";
            EXPECT_EQ(n->mrs.load(), 0) << "memory regions left alive";
        }
        EXPECT_EQ(ote_retained_total(), retained0_) << "owners still counted as retained";
        EXPECT_EQ(ote__rdma_retained_transports_get(), transports0_);
        ote__rdma_test_verbs_hook = nullptr;
        OteTest::TearDown();
    }
    static ote_engine_t *Create(const char *connect_ms, const char *transfer_ms = "30000") {
        ote_config_t *cfg = nullptr;
        EXPECT_EQ(ote_config_create(&cfg), OTE_OK);
        EXPECT_EQ(ote_config_set(cfg, "transport", "rdma"), OTE_OK);
        EXPECT_EQ(ote_config_set(cfg, "verbs_provider", "sim"), OTE_OK);
        EXPECT_EQ(ote_config_set(cfg, "transfer_timeout_ms", transfer_ms), OTE_OK);
        EXPECT_EQ(ote_config_set(cfg, "connect_timeout_ms", connect_ms), OTE_OK);
        EXPECT_EQ(ote_config_set(cfg, "rdma_devices", "sim0"), OTE_OK);
        ote_engine_t *e = nullptr;
        EXPECT_EQ(ote_engine_create(cfg, &e), OTE_OK);
        ote_config_destroy(cfg);
        return e;
    }
    // Submit one WRITE (or READ) of out_ into (from) mem_ at the source (batch_ holds it).
    void Submit(ote_opcode_t op = OTE_WRITE) {
        ASSERT_EQ(ote_batch_create(req_, 1, &batch_), OTE_OK);
        ote_request_t r = {op, out_.data(), seg_, (uint64_t)(uintptr_t)mem_.data(), out_.size()};
        ASSERT_EQ(ote_batch_submit(batch_, &r, 1), OTE_OK);
    }
    // One WRITE that completes, every byte checked. The requester stays connected with
    // its segment open: a requester that goes away has its endpoints evicted at the
    // source, whose QPs are then destroyed by the monitor before the destroy under test
    // could meet them (the QP case raced with that eviction and lost).
    void TransferKeepingRequester() {
        Submit();
        ASSERT_EQ(ote_batch_wait(batch_, 60 * kSec), OTE_OK);
        ASSERT_EQ(memcmp(mem_.data(), out_.data(), out_.size()), 0);
        ASSERT_EQ(ote_batch_destroy(batch_), OTE_OK);
        batch_ = nullptr;
    }
    // Every public call on a half-destroyed engine but destroy is refused.
    void ExpectRefused(ote_engine_t *e) {
        char addr[300];
        EXPECT_EQ(ote_engine_address(e, addr, sizeof(addr)), OTE_ERR_STATE);
        std::vector<uint8_t> other(4096);
        EXPECT_EQ(ote_memory_register(e, other.data(), other.size(), OTE_PERM_READ), OTE_ERR_STATE);
        EXPECT_EQ(ote_memory_unregister(e, mem_.data()), OTE_ERR_STATE);
        ote_buffer_info_t info;
        EXPECT_EQ(ote_memory_query(e, mem_.data(), &info), OTE_ERR_STATE);
        ote_batch_t *b = nullptr;
        EXPECT_EQ(ote_batch_create(e, 1, &b), OTE_ERR_STATE);
        EXPECT_EQ(b, nullptr);
        ote_segment_t *s = nullptr;
        EXPECT_EQ(ote_segment_open(e, "127.0.0.1:1", &s), OTE_ERR_STATE);
        EXPECT_EQ(s, nullptr);
        size_t n = 0;
        EXPECT_EQ(ote_engine_nic_stats(e, nullptr, 0, &n), OTE_ERR_STATE);
        uint8_t msg[16];
        EXPECT_EQ(ote_notify_recv(e, msg, sizeof(msg), &n, nullptr, 0, 0), OTE_ERR_STATE);
        EXPECT_EQ(ote_notify_discard(e, &n), OTE_ERR_STATE);
    }

    const char *src_connect_ms_ = "30000";
    const char *src_transfer_ms_ = "30000";
    std::vector<ote_verbs_t *> wrapped_;
    std::vector<std::unique_ptr<Native>> natives_; // outlive the engines
    uint64_t retained0_ = 0, transports0_ = 0;
    ote_engine_t *src_ = nullptr, *req_ = nullptr;
    ote_verbs_t *vs_ = nullptr; // the source's fault decorator (owned by the source)
    Native *ns_ = nullptr, *nr_ = nullptr;
    ote_segment_t *seg_ = nullptr;
    ote_batch_t *batch_ = nullptr;
    std::vector<uint8_t> mem_, out_;
};

struct Case {
    const char *name;
    ote_verbs_fault_op_t op;
    bool keeps_mrs; // retained before the MRs are deregistered: every MR stays
};

class EngineDestroyRetainedTest : public EngineDestroyTest,
                                  public ::testing::WithParamInterface<Case> {};

// The source engine (memory registered, a transfer done, its requester connected) cannot
// destroy one kind of native owner: destroy is RETAINED, and again while the fault
// lasts (each retry reaches the failing destroy again), with the engine refusing every
// other call; memory a QP or window could still reach stays registered. Once the fault
// clears, destroy finishes, and nothing is left alive or counted as retained.
TEST_P(EngineDestroyRetainedTest, RetainedOwnerKeepsTheEngineAndALaterDestroyFinishes) {
    const Case &c = GetParam();
    TransferKeepingRequester();
    ASSERT_EQ(ns_->watched_mrs.load(), 1) << "the source's registration has its MR";
    {
        ote_test::ErrorLogsExpected retained_logs;
        ASSERT_EQ(ote_verbs_fault_fail(vs_, c.op, OTE_FAULT_EVERY, 0, EBUSY), OTE_OK);
        ASSERT_EQ(ote_engine_destroy(src_), OTE_ERR_RETAINED);
        uint64_t calls = ote_verbs_fault_injected(vs_, c.op);
        EXPECT_GE(calls, 1u) << "the failing destroy was reached";
        EXPECT_GT(ote_retained_total(), retained0_) << "the retained owner is counted";
        EXPECT_EQ(ote__rdma_retained_transports_get(), transports0_ + 1);
        if (c.keeps_mrs) {
            EXPECT_EQ(ns_->watched_mrs.load(), 1) << "the registered memory stays registered";
        } else {
            EXPECT_EQ(ns_->watched_mrs.load(), 0) << "retained after the MRs were deregistered";
        }
        EXPECT_FALSE(ns_->closed.load()) << "the provider of a retained owner stays open";
        ExpectRefused(src_);
        // Still failing: the retry reaches the same destroy again and is retained again.
        ASSERT_EQ(ote_engine_destroy(src_), OTE_ERR_RETAINED);
        EXPECT_GT(ote_verbs_fault_injected(vs_, c.op), calls);
        if (c.keeps_mrs) {
            EXPECT_EQ(ns_->watched_mrs.load(), 1);
        }
        EXPECT_EQ(ote__rdma_retained_transports_get(), transports0_ + 1) << "counted once";
    }
    ote_verbs_fault_clear(vs_);
    ASSERT_EQ(ote_engine_destroy(src_), OTE_OK);
    src_ = nullptr;
    vs_ = nullptr;
    EXPECT_TRUE(ns_->closed.load());
    EXPECT_EQ(ns_->mrs.load(), 0);
    EXPECT_EQ(ns_->watched_mrs.load(), 0);
    EXPECT_EQ(ns_->qps.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Owners, EngineDestroyRetainedTest,
                         ::testing::Values(Case{"Qp", OTE_VERBS_FAULT_OP_DESTROY_QP, true},
                                           Case{"Mw", OTE_VERBS_FAULT_OP_DEALLOC_MW, true},
                                           Case{"Cq", OTE_VERBS_FAULT_OP_DESTROY_CQ, true},
                                           Case{"Mr", OTE_VERBS_FAULT_OP_DEREG_MR, true},
                                           Case{"Pd", OTE_VERBS_FAULT_OP_DEALLOC_PD, false}),
                         [](const ::testing::TestParamInfo<Case> &i) {
                             return std::string(i.param.name);
                         });

// The requester's side: its own registration (the local buffer of its WRITE) stays
// registered while a QP of its endpoint store is retained; a later destroy finishes.
TEST_F(EngineDestroyTest, RequesterWithRetainedQpKeepsItsRegistration) {
    ASSERT_EQ(ote_memory_register(req_, out_.data(), out_.size(), OTE_PERM_READ), OTE_OK);
    Submit();
    ASSERT_EQ(ote_batch_wait(batch_, 60 * kSec), OTE_OK);
    ASSERT_EQ(memcmp(mem_.data(), out_.data(), out_.size()), 0);
    ASSERT_EQ(ote_batch_destroy(batch_), OTE_OK);
    batch_ = nullptr;
    ASSERT_EQ(ote_segment_close(seg_), OTE_OK);
    seg_ = nullptr;
    ote_verbs_t *vr = wrapped_[1];
    ASSERT_EQ(nr_->watched_mrs.load(), 1) << "the requester's registration has its MR";
    ASSERT_GT(nr_->qps.load(), 0) << "the WRITE built the requester's QP";
    {
        ote_test::ErrorLogsExpected retained_logs;
        ASSERT_EQ(
            ote_verbs_fault_fail(vr, OTE_VERBS_FAULT_OP_DESTROY_QP, OTE_FAULT_EVERY, 0, EBUSY),
            OTE_OK);
        ASSERT_EQ(ote_engine_destroy(req_), OTE_ERR_RETAINED);
        EXPECT_GT(nr_->qps.load(), 0);
        EXPECT_EQ(nr_->watched_mrs.load(), 1) << "the local buffer stays registered";
        ExpectRefused(req_);
    }
    ote_verbs_fault_clear(vr);
    ASSERT_EQ(ote_engine_destroy(req_), OTE_OK);
    req_ = nullptr;
    EXPECT_EQ(nr_->qps.load(), 0);
    EXPECT_EQ(nr_->mrs.load(), 0);
    EXPECT_EQ(nr_->watched_mrs.load(), 0);
}

// An engine of two transports (tcp, then rdma): the TCP transport is destroyed by the
// first call, the RDMA one (an MR that will not deregister) is kept with the engine, and
// the retry destroys only what is left.
TEST_F(EngineDestroyTest, RetainedRdmaNextToTcpIsRetriedAlone) {
    ote_config_t *cfg = nullptr;
    ASSERT_EQ(ote_config_create(&cfg), OTE_OK);
    ASSERT_EQ(ote_config_set(cfg, "transports", "tcp,rdma"), OTE_OK);
    ASSERT_EQ(ote_config_set(cfg, "verbs_provider", "sim"), OTE_OK);
    ASSERT_EQ(ote_config_set(cfg, "rdma_devices", "sim0"), OTE_OK);
    ote__rdma_test_verbs_hook = Wrap;
    ote_engine_t *e = nullptr;
    ote_status_t st = ote_engine_create(cfg, &e);
    ote__rdma_test_verbs_hook = nullptr;
    ote_config_destroy(cfg);
    ASSERT_EQ(st, OTE_OK);
    ASSERT_EQ(wrapped_.size(), 3u);
    ote_verbs_t *v = wrapped_[2];
    Native *n = natives_[2].get();
    std::vector<uint8_t> buf(1u << 20);
    n->watch_lo = (uintptr_t)buf.data();
    n->watch_hi = (uintptr_t)buf.data() + buf.size();
    ASSERT_EQ(ote_memory_register(e, buf.data(), buf.size(), OTE_PERM_READ | OTE_PERM_WRITE),
              OTE_OK);
    ASSERT_EQ(n->watched_mrs.load(), 1);
    {
        ote_test::ErrorLogsExpected retained_logs;
        ASSERT_EQ(ote_verbs_fault_fail(v, OTE_VERBS_FAULT_OP_DEREG_MR, OTE_FAULT_EVERY, 0, EBUSY),
                  OTE_OK);
        ASSERT_EQ(ote_engine_destroy(e), OTE_ERR_RETAINED);
        EXPECT_EQ(n->watched_mrs.load(), 1) << "the registration stays registered";
        char addr[300];
        EXPECT_EQ(ote_engine_address(e, addr, sizeof(addr)), OTE_ERR_STATE);
        EXPECT_EQ(ote_memory_unregister(e, buf.data()), OTE_ERR_STATE);
        uint64_t calls = ote_verbs_fault_injected(v, OTE_VERBS_FAULT_OP_DEREG_MR);
        ASSERT_EQ(ote_engine_destroy(e), OTE_ERR_RETAINED);
        EXPECT_GT(ote_verbs_fault_injected(v, OTE_VERBS_FAULT_OP_DEREG_MR), calls);
    }
    ote_verbs_fault_clear(v);
    ASSERT_EQ(ote_engine_destroy(e), OTE_OK);
    EXPECT_TRUE(n->closed.load());
    EXPECT_EQ(n->watched_mrs.load(), 0);
    EXPECT_EQ(n->mrs.load(), 0);
}

// A source whose control thread is stuck in a native call (the requester's CONNECT,
// held in create_qp) while the requester's WRITE is in flight: the source's destroy
// wakes the thread's connection (shutdown), waits its bound (connect_timeout_ms + 10 s),
// and, the thread not having ended, keeps the engine: RETAINED, nothing freed under the
// thread (ASan would catch it touching freed memory once let go). The requester's WRITE
// ends (failed, or at its transfer_timeout_ms deadline). Once the thread is let go it
// ends, and the next destroy finishes.
class EngineDestroyStuckTest : public EngineDestroyTest {
  protected:
    // 3 s: the source's destroy waits 13 s for its stuck thread; the handshake of the
    // setup (loopback) fits in it on a loaded machine.
    EngineDestroyStuckTest() { src_connect_ms_ = "3000"; }
};

TEST_F(EngineDestroyStuckTest, StuckControlThreadKeepsTheEngineUntilItEnds) {
    ns_->hold_next_create = true;
    Submit();
    ASSERT_TRUE(ote_test::WaitUntil([&] { return ns_->holding.load(); }, std::chrono::seconds(60),
                                    "the source's CONNECT to reach create_qp"));
    {
        ote_test::ErrorLogsExpected stuck_logs;
        EXPECT_EQ(ote_engine_destroy(src_), OTE_ERR_RETAINED);
        EXPECT_EQ(ote__rdma_retained_transports_get(), transports0_ + 1);
        ExpectRefused(src_);
        // The requester's WRITE fails: its peer's connection is gone.
        EXPECT_NE(ote_batch_wait(batch_, 120 * kSec), OTE_OK);
        ote_transfer_status_t ts;
        ASSERT_EQ(ote_batch_status(batch_, 0, &ts), OTE_OK);
        EXPECT_TRUE(ts.state == OTE_TRANSFER_FAILED || ts.state == OTE_TRANSFER_TIMEOUT)
            << "the WRITE ended (by its deadline at the latest): state " << ts.state;
        // The thread is let go: it finishes its call on the engine that was kept, sees
        // its connection dead and ends; the next destroy joins it and frees everything.
        ns_->release = true;
        EXPECT_EQ(ote_engine_destroy(src_), OTE_OK);
    }
    src_ = nullptr;
    vs_ = nullptr;
    EXPECT_EQ(ote__rdma_retained_transports_get(), transports0_);
}

// A requester that got a grant and went quiet: its every post_send is held (the verbs
// fault decorator's delay), so it took the source's key and stalls before its first WR,
// and never sends the grant's receipt. The source's destroy (transfer_timeout_ms 60 s,
// so waiting for the grant's deadline would take over a minute) ends the grant at once:
// its QP to ERR, its window deallocated, the QP destroyed; it returns well before that
// deadline (a bound on a hang, not a speed check). Then the requester is let go: its
// WR, under the old key to a source that is gone, fails, and the source's memory (WRITE)
// or the requester's buffer (READ) is never touched. With a native destroy that fails
// during that revocation (the QP, or the window), the destroy is RETAINED just as fast,
// the registration stays registered, and a later destroy finishes.
struct LiveCase {
    const char *name;
    ote_opcode_t op;
    bool fault; // arm `fail` on the source for the first destroy
    ote_verbs_fault_op_t fail;
};

class EngineDestroyLiveGrantTest : public EngineDestroyTest,
                                   public ::testing::WithParamInterface<LiveCase> {
  protected:
    EngineDestroyLiveGrantTest() { src_transfer_ms_ = "60000"; }
    ote__rdma_test_grants_t SourceGrants() {
        ote__rdma_test_grants_t g{};
        char addr[300];
        EXPECT_EQ(ote_engine_address(src_, addr, sizeof(addr)), OTE_OK);
        EXPECT_EQ(ote__rdma_test_grants(addr, &g), OTE_OK);
        return g;
    }
};

TEST_P(EngineDestroyLiveGrantTest, DestroyRevokesALiveGrantAtOnce) {
    const LiveCase &c = GetParam();
    ote_verbs_t *vr = wrapped_[1];
    // What must stay as it is: the source's memory (a WRITE's target), the requester's
    // buffer (a READ's target).
    for (size_t i = 0; i < mem_.size(); i++) mem_[i] = (uint8_t)(i * 13 + 1);
    const std::vector<uint8_t> mem0 = mem_, out0 = out_;
    ASSERT_EQ(ote_verbs_fault_delay(vr, OTE_VERBS_FAULT_OP_POST_SEND, 120000), OTE_OK);
    Submit(c.op);
    ote_test::WaitUntil(
        [&] {
            return SourceGrants().live_source > 0 &&
                   ote_verbs_fault_injected(vr, OTE_VERBS_FAULT_OP_POST_SEND) > 0;
        },
        std::chrono::seconds(60), "a live source grant and the requester stalled at its post");
    ASSERT_GE(SourceGrants().live_source, 1u) << "the source served the grant";
    ASSERT_GE(ote_verbs_fault_injected(vr, OTE_VERBS_FAULT_OP_POST_SEND), 1u)
        << "the requester holds the key, stalled at its first post";
    {
        ote_test::ErrorLogsExpected logs; // the revoked grant's WARN, a retained owner's ERRORs
        if (c.fault) {
            ASSERT_EQ(ote_verbs_fault_fail(vs_, c.fail, OTE_FAULT_EVERY, 0, EBUSY), OTE_OK);
        }
        auto t0 = std::chrono::steady_clock::now();
        ote_status_t st = ote_engine_destroy(src_);
        double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        EXPECT_LT(took, 20.0) << "destroy waited for the live grant's deadline (60 s)";
        if (c.fault) {
            ASSERT_EQ(st, OTE_ERR_RETAINED);
            EXPECT_GE(ote_verbs_fault_injected(vs_, c.fail), 1u)
                << "the failing destroy was reached";
            EXPECT_EQ(ns_->watched_mrs.load(), 1) << "the registered memory stays registered";
        } else {
            ASSERT_EQ(st, OTE_OK);
            src_ = nullptr;
            vs_ = nullptr;
            EXPECT_EQ(ns_->qps.load(), 0);
            EXPECT_EQ(ns_->mws.load(), 0);
            EXPECT_EQ(ns_->watched_mrs.load(), 0);
        }
        // The requester goes on: its WR under the old key fails, its request with it.
        ASSERT_EQ(ote_verbs_fault_delay(vr, OTE_VERBS_FAULT_OP_POST_SEND, 0), OTE_OK);
        EXPECT_NE(ote_batch_wait(batch_, 120 * kSec), OTE_OK);
        ote_transfer_status_t ts;
        ASSERT_EQ(ote_batch_status(batch_, 0, &ts), OTE_OK);
        EXPECT_EQ(ts.state, OTE_TRANSFER_FAILED) << "ended by the lost source, not a deadline";
        EXPECT_EQ(memcmp(mem_.data(), mem0.data(), mem_.size()), 0) << "source memory touched";
        EXPECT_EQ(memcmp(out_.data(), out0.data(), out_.size()), 0) << "nothing was read";
        if (c.fault) {
            ote_verbs_fault_clear(vs_);
            ASSERT_EQ(ote_engine_destroy(src_), OTE_OK);
            src_ = nullptr;
            vs_ = nullptr;
        }
    }
    EXPECT_TRUE(ns_->closed.load());
    EXPECT_EQ(ns_->qps.load(), 0);
    EXPECT_EQ(ns_->mws.load(), 0);
    EXPECT_EQ(ns_->mrs.load(), 0);
    // The requester's side: its request failed, its source is gone; its destroy waits
    // for no deadline either.
    ASSERT_EQ(ote_batch_destroy(batch_), OTE_OK);
    batch_ = nullptr;
    ASSERT_EQ(ote_segment_close(seg_), OTE_OK);
    seg_ = nullptr;
    auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(ote_engine_destroy(req_), OTE_OK);
    req_ = nullptr;
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0);
}

void PrintTo(const LiveCase &c, std::ostream *os) { *os << c.name; }

INSTANTIATE_TEST_SUITE_P(
    Grants, EngineDestroyLiveGrantTest,
    ::testing::Values(LiveCase{"Write", OTE_WRITE, false, OTE_VERBS_FAULT_OP_DESTROY_QP},
                      LiveCase{"Read", OTE_READ, false, OTE_VERBS_FAULT_OP_DESTROY_QP},
                      LiveCase{"WriteQpRetained", OTE_WRITE, true, OTE_VERBS_FAULT_OP_DESTROY_QP},
                      LiveCase{"WriteMwRetained", OTE_WRITE, true, OTE_VERBS_FAULT_OP_DEALLOC_MW}),
    [](const ::testing::TestParamInfo<LiveCase> &i) { return std::string(i.param.name); });

} // namespace

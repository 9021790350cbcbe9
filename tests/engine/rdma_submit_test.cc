// ote_batch_submit over RDMA never waits on QP construction: engine to engine in this
// process over verbs/sim, each engine's provider wrapped by the verbs fault decorator
// through the transport's test hook (engine/rdma/test_hook.h), so that the requester's
// create_qp can be made slow (ote_verbs_fault_delay: a stall the test lifts).
//
// A request on a fresh peer (no QP yet) whose QP builds stall (lifted by the test only
// after the submit returned and a stalled build was entered): its submit returns under
// 2.5 s, the request waits PENDING, the pump thread builds the QPs once the stall is
// lifted, the request completes with every byte checked. A stall far past the request's deadline (2 s): the
// request ends TIMEOUT at about its deadline (checked only against "long before the
// stall would end"), and once the stall is lifted the next request works. Cancel of a
// request that waits for its QP ends CANCELED. On a warm peer the submitting thread
// starts the request itself (no hop through the pump thread: counters of the hook).
// Deadlines are generous for a loaded 2-core machine.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/util/test_base.h"
#include "tests/util/wait.h"

extern "C" {
#include "base/time.h"
#include "engine/rdma/test_hook.h"
#include "ote/ote.h"
#include "tests/engine/pattern.h"
#include "verbs/fault.h"
#include "verbs/verbs.h"
}

namespace {

constexpr uint64_t kMs = 1000000ull;
constexpr uint64_t kSec = 1000 * kMs;
constexpr uint64_t kLen = 4ull << 20;
constexpr uint64_t kSrcSeed = 21, kLocSeed = 22, kNewSeed = 23;

// The decorators of the engines created while the hook is set, in creation order.
std::vector<ote_verbs_t *> *g_faults = nullptr;
ote_status_t WrapInFault(ote_verbs_t **v) {
    ote_verbs_t *f = nullptr;
    ote_status_t st = ote_verbs_fault_wrap(*v, OTE_VERBS_FAULT_OWN_INNER, &f);
    if (st != OTE_OK) return st;
    if (g_faults != nullptr) g_faults->push_back(f);
    *v = f;
    return OTE_OK;
}

std::string EngineAddr(ote_engine_t *e) {
    char addr[300];
    EXPECT_EQ(ote_engine_address(e, addr, sizeof(addr)), OTE_OK);
    return addr;
}

class RdmaSubmitTest : public ote_test::OteTest {
  protected:
    void SetUp() override {
        OteTest::SetUp();
        g_faults = &faults_;
        ote__rdma_test_verbs_hook = WrapInFault;
        src_ = Create("60000");
        req_ = Create(req_timeout_);
        ote__rdma_test_verbs_hook = nullptr;
        g_faults = nullptr;
        ASSERT_NE(src_, nullptr);
        ASSERT_NE(req_, nullptr);
        ASSERT_EQ(faults_.size(), 2u);
        req_addr_ = EngineAddr(req_);
        src_mem_.resize(kLen);
        loc_mem_.resize(kLen);
        ASSERT_EQ(ote_memory_register(src_, src_mem_.data(), src_mem_.size(),
                                      OTE_PERM_READ | OTE_PERM_WRITE),
                  OTE_OK);
        ASSERT_EQ(ote_memory_register(req_, loc_mem_.data(), loc_mem_.size(),
                                      OTE_PERM_READ | OTE_PERM_WRITE),
                  OTE_OK);
        // The control connection only: no QP exists until the first request.
        ASSERT_EQ(ote_segment_open(req_, EngineAddr(src_).c_str(), &seg_), OTE_OK);
    }
    void TearDown() override {
        ote__rdma_test_verbs_hook = nullptr;
        for (ote_verbs_t *f : faults_) ote_verbs_fault_clear(f); // no stall left
        if (seg_ != nullptr) {
            EXPECT_EQ(ote_segment_close(seg_), OTE_OK);
        }
        if (req_ != nullptr) {
            EXPECT_EQ(ote_memory_unregister(req_, loc_mem_.data()), OTE_OK);
            EXPECT_EQ(ote_engine_destroy(req_), OTE_OK);
        }
        if (src_ != nullptr) {
            EXPECT_EQ(ote_memory_unregister(src_, src_mem_.data()), OTE_OK);
            EXPECT_EQ(ote_engine_destroy(src_), OTE_OK);
        }
        OteTest::TearDown();
    }

    // connect_timeout_ms 30 s: a build that a stall held for seconds still connects.
    static ote_engine_t *Create(const char *timeout_ms) {
        ote_config_t *cfg = nullptr;
        EXPECT_EQ(ote_config_create(&cfg), OTE_OK);
        EXPECT_EQ(ote_config_set(cfg, "transport", "rdma"), OTE_OK);
        EXPECT_EQ(ote_config_set(cfg, "verbs_provider", "sim"), OTE_OK);
        EXPECT_EQ(ote_config_set(cfg, "transfer_timeout_ms", timeout_ms), OTE_OK);
        EXPECT_EQ(ote_config_set(cfg, "connect_timeout_ms", "30000"), OTE_OK);
        ote_engine_t *e = nullptr;
        EXPECT_EQ(ote_engine_create(cfg, &e), OTE_OK);
        ote_config_destroy(cfg);
        return e;
    }

    ote_verbs_t *ReqFault() { return faults_[1]; }

    ote__rdma_test_grants_t ReqCounters() {
        ote__rdma_test_grants_t g{};
        EXPECT_EQ(ote__rdma_test_grants(req_addr_.c_str(), &g), OTE_OK);
        return g;
    }

    // Fills the source with seed src and the local range with seed loc.
    void Fill(uint64_t src, uint64_t loc) {
        ote_pattern_fill(src_mem_.data(), kLen, src, 0);
        ote_pattern_fill(loc_mem_.data(), kLen, loc, 0);
    }
    static bool Holds(const std::vector<uint8_t> &buf, uint64_t seed, uint64_t len) {
        std::vector<uint8_t> want(len);
        ote_pattern_fill(want.data(), len, seed, 0);
        return memcmp(buf.data(), want.data(), len) == 0;
    }

    // Submits one request of len bytes; *submit_ns: how long the submit call took.
    ote_batch_t *Submit(ote_opcode_t op, uint64_t len, uint64_t *submit_ns) {
        ote_batch_t *b = nullptr;
        EXPECT_EQ(ote_batch_create(req_, 1, &b), OTE_OK);
        ote_request_t r = {op, loc_mem_.data(), seg_, (uint64_t)(uintptr_t)src_mem_.data(), len};
        uint64_t t0 = ote_now_ns();
        EXPECT_EQ(ote_batch_submit(b, &r, 1), OTE_OK);
        if (submit_ns != nullptr) *submit_ns = ote_now_ns() - t0;
        return b;
    }

    // Waits for b (60 s at most), destroys it and returns its final status.
    static ote_transfer_status_t Finish(ote_batch_t *b) {
        (void)ote_batch_wait(b, 60 * kSec); // the request's error, if any: see its state
        ote_transfer_status_t ts{};
        EXPECT_EQ(ote_batch_status(b, 0, &ts), OTE_OK);
        EXPECT_NE(ts.state, OTE_TRANSFER_PENDING) << "the request did not end within 60 s";
        if (ts.state != OTE_TRANSFER_PENDING) {
            EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
        }
        return ts;
    }

    // One whole request that must complete, bytes checked (READ: local gets the source).
    void WholeRead(uint64_t len = kLen) {
        Fill(kNewSeed, kLocSeed);
        ote_transfer_status_t ts = Finish(Submit(OTE_READ, len, nullptr));
        EXPECT_EQ(ts.state, OTE_TRANSFER_COMPLETED) << ote_status_str(ts.error);
        EXPECT_EQ(ts.bytes_done, len);
        EXPECT_TRUE(Holds(loc_mem_, kNewSeed, len)) << "the READ did not bring the source's bytes";
    }

    // Lifts the stall and waits (30 s at most) until the pump thread built a QP.
    void LiftAndWaitForBuild(uint64_t builds_before) {
        ASSERT_EQ(ote_verbs_fault_delay(ReqFault(), OTE_VERBS_FAULT_OP_CREATE_QP, 0), OTE_OK);
        ote_test::WaitUntil([&] { return ReqCounters().qp_builds > builds_before; },
                            std::chrono::seconds(30), "a QP built after the stall");
    }

    const char *req_timeout_ = "60000";
    std::vector<ote_verbs_t *> faults_; // [0] the source's, [1] the requester's
    ote_engine_t *src_ = nullptr, *req_ = nullptr;
    ote_segment_t *seg_ = nullptr;
    std::string req_addr_;
    std::vector<uint8_t> src_mem_, loc_mem_;
};

TEST_F(RdmaSubmitTest, SubmitOnAFreshPeerDoesNotWaitForTheQpBuild) {
    for (ote_opcode_t op : {OTE_READ, OTE_WRITE}) {
        SCOPED_TRACE(op == OTE_READ ? "READ" : "WRITE");
        // Every QP build of the requester (each device, each capability) stalls until the
        // test lifts the stall (60 s at most), which it does only after the submit returned
        // and a stalled build was entered: a submit that waited for the build could not
        // return before the stall ends.
        ASSERT_EQ(ote_verbs_fault_delay(ReqFault(), OTE_VERBS_FAULT_OP_CREATE_QP, 60000), OTE_OK);
        uint64_t stalled0 = ote_verbs_fault_injected(ReqFault(), OTE_VERBS_FAULT_OP_CREATE_QP);
        uint64_t builds0 = ReqCounters().qp_builds;
        Fill(kSrcSeed, kLocSeed);
        uint64_t submit_ns = 0;
        ote_batch_t *b = Submit(op, kLen, &submit_ns);
        EXPECT_LT(submit_ns, 2500 * kMs) << "ote_batch_submit waited for the QP build";
        // The pump thread entered a stalled build; the request waits for it.
        ote_test::WaitUntil(
            [&] {
                return ote_verbs_fault_injected(ReqFault(), OTE_VERBS_FAULT_OP_CREATE_QP) >
                       stalled0;
            },
            std::chrono::seconds(30), "a QP build entered under the stall");
        ote_transfer_status_t ts{};
        ASSERT_EQ(ote_batch_status(b, 0, &ts), OTE_OK);
        EXPECT_EQ(ts.state, OTE_TRANSFER_PENDING) << "the request ended without its QP";
        ASSERT_EQ(ote_verbs_fault_delay(ReqFault(), OTE_VERBS_FAULT_OP_CREATE_QP, 0), OTE_OK);
        ts = Finish(b);
        EXPECT_EQ(ts.state, OTE_TRANSFER_COMPLETED) << ote_status_str(ts.error);
        EXPECT_EQ(ts.bytes_done, kLen);
        if (op == OTE_READ) {
            EXPECT_TRUE(Holds(loc_mem_, kSrcSeed, kLen)) << "READ bytes differ";
        } else {
            EXPECT_TRUE(Holds(src_mem_, kLocSeed, kLen)) << "WRITE bytes differ";
        }
        // The request ran on QPs built (after a stall) by the pump thread.
        EXPECT_GT(ReqCounters().qp_builds, builds0);
    }
}

class RdmaSubmitDeadlineTest : public RdmaSubmitTest {
  protected:
    void SetUp() override {
        req_timeout_ = "2000";
        RdmaSubmitTest::SetUp();
    }
};

TEST_F(RdmaSubmitDeadlineTest, RequestWaitingForItsQpEndsTimeoutAtItsDeadline) {
    // A stall of 60 s (lifted by the test), far past the request's 2 s deadline.
    ASSERT_EQ(ote_verbs_fault_delay(ReqFault(), OTE_VERBS_FAULT_OP_CREATE_QP, 60000), OTE_OK);
    uint64_t builds0 = ReqCounters().qp_builds;
    Fill(kSrcSeed, kLocSeed);
    uint64_t submit_ns = 0, t0 = ote_now_ns();
    ote_batch_t *b = Submit(OTE_READ, kLen, &submit_ns);
    EXPECT_LT(submit_ns, 2500 * kMs) << "ote_batch_submit waited for the QP build";
    ote_transfer_status_t ts = Finish(b);
    uint64_t took = ote_now_ns() - t0;
    EXPECT_EQ(ts.state, OTE_TRANSFER_TIMEOUT);
    EXPECT_EQ(ote_status_code(ts.error), OTE_ERR_TIMEOUT) << ote_status_str(ts.error);
    // About its deadline: long before the stall (60 s) would have let the build go on.
    EXPECT_LT(took, 20 * kSec) << "the request waited for the builder past its deadline";
    EXPECT_GE(ote_verbs_fault_injected(ReqFault(), OTE_VERBS_FAULT_OP_CREATE_QP), 1u);
    EXPECT_TRUE(Holds(loc_mem_, kLocSeed, kLen)) << "a request that never started wrote bytes";
    // The engine stays usable: once the stall is lifted, the next request works.
    LiftAndWaitForBuild(builds0);
    WholeRead();
}

TEST_F(RdmaSubmitTest, CancelOfARequestWaitingForItsQpEndsCanceled) {
    ASSERT_EQ(ote_verbs_fault_delay(ReqFault(), OTE_VERBS_FAULT_OP_CREATE_QP, 60000), OTE_OK);
    uint64_t builds0 = ReqCounters().qp_builds;
    Fill(kSrcSeed, kLocSeed);
    uint64_t submit_ns = 0, t0 = ote_now_ns();
    ote_batch_t *b = Submit(OTE_WRITE, kLen, &submit_ns);
    EXPECT_LT(submit_ns, 2500 * kMs) << "ote_batch_submit waited for the QP build";
    // The build is under way (the stalled create_qp was entered), the request waits.
    ote_test::WaitUntil(
        [&] { return ote_verbs_fault_injected(ReqFault(), OTE_VERBS_FAULT_OP_CREATE_QP) > 0; },
        std::chrono::seconds(30), "the stalled create_qp entered");
    ote_transfer_status_t ts{};
    ASSERT_EQ(ote_batch_status(b, 0, &ts), OTE_OK);
    EXPECT_EQ(ts.state, OTE_TRANSFER_PENDING);
    EXPECT_EQ(ote_batch_cancel(b), OTE_OK);
    ts = Finish(b);
    EXPECT_EQ(ts.state, OTE_TRANSFER_CANCELED);
    EXPECT_EQ(ote_status_code(ts.error), OTE_ERR_CANCELED) << ote_status_str(ts.error);
    EXPECT_LT(ote_now_ns() - t0, 30 * kSec) << "the cancel waited for the builder";
    EXPECT_TRUE(Holds(src_mem_, kSrcSeed, kLen)) << "a canceled WRITE that never started wrote";
    LiftAndWaitForBuild(builds0);
    WholeRead();
}

TEST_F(RdmaSubmitTest, WarmPeerStartsSmallRequestsOnTheSubmittingThread) {
    // Warm up: the first requests build the QPs (on the pump thread); then every slot
    // the endpoints pick is READY.
    for (int i = 0; i < 16; i++) WholeRead(64u << 10);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ote__rdma_test_grants_t before = ReqCounters();
    EXPECT_GT(before.qp_builds, 0u);
    constexpr uint64_t kN = 20;
    for (uint64_t i = 0; i < kN; i++) WholeRead(64u << 10);
    ote__rdma_test_grants_t after = ReqCounters();
    // Each 64 KiB request is one run, started by its submitting thread. The pump thread's
    // periodic round may, rarely, take a request in the instant between its queueing and
    // its submitter's pump: at most two of twenty.
    EXPECT_EQ(
        (after.starts_inline - before.starts_inline) + (after.starts_pumped - before.starts_pumped),
        kN);
    EXPECT_GE(after.starts_inline - before.starts_inline, kN - 2);
    EXPECT_EQ(after.qp_builds, before.qp_builds) << "a warm peer built QPs";
}

} // namespace

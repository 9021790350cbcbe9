// RDMA transport under verbs faults, engine to engine: both engines run in this process
// over verbs/sim, each wrapped by the verbs fault decorator through the transport's test
// hook (engine/rdma/test_hook.h), so a test arms faults on either side.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "tests/util/test_base.h"

extern "C" {
#include "base/time.h"
#include "engine/rdma/test_hook.h"
#include "ote/ote.h"
#include "verbs/fault.h"
}

namespace {

constexpr uint64_t kMs = 1000000ull;
constexpr uint64_t kSec = 1000 * kMs;
constexpr size_t kBlock = 64u << 10;

std::vector<ote_verbs_t *> *g_wrapped = nullptr;

ote_status_t WrapWithFault(ote_verbs_t **v) {
    ote_verbs_t *f = nullptr;
    ote_status_t st = ote_verbs_fault_wrap(*v, OTE_VERBS_FAULT_OWN_INNER, &f);
    if (st != OTE_OK) return st;
    *v = f;
    g_wrapped->push_back(f);
    return OTE_OK;
}

class RdmaFaultTest : public ote_test::OteTest {
  protected:
    void SetUp() override {
        OteTest::SetUp();
        ExpectErrorLogs();
        g_wrapped = &wrapped_;
        ote__rdma_test_verbs_hook = WrapWithFault;
        src_ = Create();
        req_ = Create();
        ote__rdma_test_verbs_hook = nullptr;
        ASSERT_NE(src_, nullptr);
        ASSERT_NE(req_, nullptr);
        ASSERT_EQ(wrapped_.size(), 2u);
        vs_ = wrapped_[0];
        vr_ = wrapped_[1];
        mem_.assign(4u << 20, 0);
        ASSERT_EQ(ote_memory_register(src_, mem_.data(), mem_.size(), OTE_PERM_READ | OTE_PERM_WRITE), OTE_OK);
        char addr[300];
        ASSERT_EQ(ote_engine_address(src_, addr, sizeof(addr)), OTE_OK);
        ASSERT_EQ(ote_segment_open(req_, addr, &seg_), OTE_OK);
        out_.resize(1u << 20);
        for (size_t i = 0; i < out_.size(); i++) out_[i] = (uint8_t)(i * 13 + 5);
    }
    void TearDown() override {
        if (seg_) { EXPECT_EQ(ote_segment_close(seg_), OTE_OK); }
        if (req_) { EXPECT_EQ(ote_engine_destroy(req_), OTE_OK); }
        /* A source grant whose requester vanished keeps its registration pinned until its
         * own deadline; destroy waits for that (bounded) and drops the registration. */
        if (src_) { EXPECT_EQ(ote_engine_destroy(src_), OTE_OK); }
        ote__rdma_test_verbs_hook = nullptr;
        OteTest::TearDown();
    }
    static ote_engine_t *Create() {
        ote_config_t *cfg = nullptr;
        EXPECT_EQ(ote_config_create(&cfg), OTE_OK);
        EXPECT_EQ(ote_config_set(cfg, "transport", "rdma"), OTE_OK);
        EXPECT_EQ(ote_config_set(cfg, "verbs_provider", "sim"), OTE_OK);
        EXPECT_EQ(ote_config_set(cfg, "transfer_timeout_ms", "1500"), OTE_OK);
        ote_engine_t *e = nullptr;
        EXPECT_EQ(ote_engine_create(cfg, &e), OTE_OK);
        ote_config_destroy(cfg);
        return e;
    }
    ote_status_t Write(size_t len, uint64_t off = 0) {
        ote_batch_t *b = nullptr;
        EXPECT_EQ(ote_batch_create(req_, 1, &b), OTE_OK);
        ote_request_t r = {OTE_WRITE, out_.data(), seg_, (uint64_t)(uintptr_t)mem_.data() + off, len};
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

    std::vector<ote_verbs_t *> wrapped_;
    ote_engine_t *src_ = nullptr, *req_ = nullptr;
    ote_verbs_t *vs_ = nullptr, *vr_ = nullptr;
    ote_segment_t *seg_ = nullptr;
    std::vector<uint8_t> mem_, out_;
};

// A data CQE lost at the requester: the transfer fails at its deadline, its QP is fenced
// and destroyed before the request ends (nothing the NIC could still write is given
// back), and the next transfer works over a rebuilt QP.
TEST_F(RdmaFaultTest, LostCqeFailsAtDeadlineQpDestroyedBeforeTheRequestEnds) {
    ASSERT_EQ(Write(kBlock), OTE_OK); /* QPs built */
    uint64_t destroyed0 = ote_verbs_fault_calls(vr_, OTE_VERBS_FAULT_OP_DESTROY_QP);
    ASSERT_EQ(ote_verbs_fault_lose_cqe_nth(vr_, nullptr, 2), OTE_OK);
    uint64_t t0 = ote_now_ns();
    ote_status_t st = Write(4 * kBlock);
    uint64_t took = ote_now_ns() - t0;
    uint64_t destroyed = ote_verbs_fault_calls(vr_, OTE_VERBS_FAULT_OP_DESTROY_QP);
    EXPECT_EQ(ote_verbs_fault_injected(vr_, OTE_VERBS_FAULT_OP_POLL_CQ), 1u);
    EXPECT_EQ(ote_status_code(st), OTE_ERR_TIMEOUT) << ote_status_str(st);
    EXPECT_GE(took, 1400 * kMs);
    EXPECT_LT(took, 10 * kSec);
    EXPECT_GT(destroyed, destroyed0) << "the request ended before its fenced QP was destroyed";
    ote_verbs_fault_clear(vr_);
    std::fill(mem_.begin(), mem_.end(), 0);
    EXPECT_EQ(Write(3 * kBlock + 100, 4096), OTE_OK);
    EXPECT_EQ(memcmp(mem_.data() + 4096, out_.data(), 3 * kBlock + 100), 0);
}

// The source's MW bind fails (its post is refused): the grant is refused, the requester
// is told OTE_ERR_REMOTE_ACCESS, no byte is touched, and the next transfer works (the
// requester retired the QP whose other end the failed bind broke).
TEST_F(RdmaFaultTest, BindFailureRefusesTheGrantRequesterTold) {
    ASSERT_EQ(Write(kBlock), OTE_OK);
    std::fill(mem_.begin(), mem_.end(), 0);
    // The source posts nothing but binds on its send queues (receipts arrive on its RQ).
    ASSERT_EQ(ote_verbs_fault_fail(vs_, OTE_VERBS_FAULT_OP_POST_SEND, OTE_FAULT_NTH, 1, EINVAL), OTE_OK);
    ote_status_t st = Write(2 * kBlock);
    EXPECT_EQ(ote_status_code(st), OTE_ERR_REMOTE_ACCESS) << ote_status_str(st) << [&] {
        std::string all;
        for (auto &l : Logs()) all += l + "\n";
        return all;
    }();
    EXPECT_EQ(ote_verbs_fault_injected(vs_, OTE_VERBS_FAULT_OP_POST_SEND), 1u);
    for (size_t i = 0; i < 2 * kBlock; i++) ASSERT_EQ(mem_[i], 0) << "a refused grant wrote at " << i;
    EXPECT_EQ(Write(2 * kBlock), OTE_OK);
    EXPECT_EQ(memcmp(mem_.data(), out_.data(), 2 * kBlock), 0);
}

// alloc_mw failing at the source: refused before any window, requester told.
TEST_F(RdmaFaultTest, AllocMwFailureRefusesTheGrant) {
    ASSERT_EQ(ote_verbs_fault_fail(vs_, OTE_VERBS_FAULT_OP_ALLOC_MW, OTE_FAULT_EVERY, 0, ENOMEM), OTE_OK);
    ote_status_t st = Write(kBlock);
    EXPECT_EQ(ote_status_code(st), OTE_ERR_REMOTE_ACCESS) << ote_status_str(st);
    EXPECT_GE(ote_verbs_fault_injected(vs_, OTE_VERBS_FAULT_OP_ALLOC_MW), 1u);
    ote_verbs_fault_clear(vs_);
    EXPECT_EQ(Write(kBlock), OTE_OK);
    EXPECT_EQ(memcmp(mem_.data(), out_.data(), kBlock), 0);
}

}  // namespace

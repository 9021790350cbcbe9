// The engine-wide limit of RDMA bytes in flight (rdma_max_inflight), engine to engine in
// this process over verbs/sim: one requester with a 4 MiB limit and two source engines
// (two peers). 64 requests of 2 MiB (16 under TSan) in one batch, spread over both peers,
// exhaust the limit at once: the runs past it wait queued (counted), never more than 4 MiB
// is in flight over both peers and both devices together, and every request completes
// with its bytes checked, WRITE and then READ back.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/engine/engine_util.h"
#include "tests/util/test_base.h"

extern "C" {
#include "base/time.h"
#include "engine/rdma/test_hook.h"
#include "ote/ote.h"
#include "tests/engine/pattern.h"
}

namespace {

constexpr uint64_t kSec = 1000000000ull;
constexpr uint64_t kCap = 4ull << 20;
constexpr uint64_t kReq = 2ull << 20;
// 64 requests; 16 under ThreadSanitizer (32 MiB each way instead of 128 MiB, the case took
// 36 s there): still eight times the limit in one batch, so runs wait for room at once.
constexpr size_t kN = ote_test::TsanScaled(64, 4);

std::string Addr(ote_engine_t *e) {
    char addr[300];
    EXPECT_EQ(ote_engine_address(e, addr, sizeof(addr)), OTE_OK);
    return addr;
}

TEST(RdmaCreditTest, SixtyFourRequestsPastTheLimitQueueAndComplete) {
    const ote_test::ConfigKv rdma = {
        {"transport", "rdma"}, {"verbs_provider", "sim"}, {"transfer_timeout_ms", "120000"}};
    ote_test::ConfigKv limited = rdma;
    limited.push_back({"rdma_max_inflight", "4M"});
    ote_engine_t *src[2] = {ote_test::NewEngine(rdma), ote_test::NewEngine(rdma)};
    ote_engine_t *req = ote_test::NewEngine(limited);
    ASSERT_NE(src[0], nullptr);
    ASSERT_NE(src[1], nullptr);
    ASSERT_NE(req, nullptr);

    const uint64_t half = kN / 2 * kReq; // each source takes half of the requests
    std::vector<uint8_t> smem[2] = {std::vector<uint8_t>(half, 0), std::vector<uint8_t>(half, 0)};
    std::vector<uint8_t> out(kN * kReq), back(kN * kReq, 0);
    ote_pattern_fill(out.data(), out.size(), 41, 0);
    ote_segment_t *seg[2] = {nullptr, nullptr};
    for (int i = 0; i < 2; i++) {
        ASSERT_EQ(ote_memory_register(src[i], smem[i].data(), half, OTE_PERM_READ | OTE_PERM_WRITE),
                  OTE_OK);
        ASSERT_EQ(ote_segment_open(req, Addr(src[i]).c_str(), &seg[i]), OTE_OK);
    }
    ASSERT_EQ(ote_memory_register(req, out.data(), out.size(), OTE_PERM_READ), OTE_OK);
    ASSERT_EQ(ote_memory_register(req, back.data(), back.size(), OTE_PERM_WRITE), OTE_OK);

    // Request j goes to source j % 2, at offset (j / 2) * kReq there.
    for (ote_opcode_t op : {OTE_WRITE, OTE_READ}) {
        std::vector<ote_request_t> r(kN);
        for (size_t j = 0; j < kN; j++) {
            uint8_t *local = (op == OTE_WRITE ? out.data() : back.data()) + j * kReq;
            r[j] = {op, local, seg[j % 2], (uint64_t)(uintptr_t)(smem[j % 2].data() + j / 2 * kReq),
                    kReq};
        }
        ote_batch_t *b = nullptr;
        ASSERT_EQ(ote_batch_create(req, kN, &b), OTE_OK);
        ASSERT_EQ(ote_batch_submit(b, r.data(), kN), OTE_OK);
        ASSERT_EQ(ote_batch_wait(b, ote_deadline_after(120 * kSec)), OTE_OK);
        for (size_t j = 0; j < kN; j++) {
            ote_transfer_status_t ts;
            ASSERT_EQ(ote_batch_status(b, j, &ts), OTE_OK);
            EXPECT_EQ(ts.state, OTE_TRANSFER_COMPLETED) << j << ": " << ote_status_str(ts.error);
            EXPECT_EQ(ts.bytes_done, kReq) << j;
        }
        EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    }
    for (size_t j = 0; j < kN; j++)
        ASSERT_EQ(memcmp(smem[j % 2].data() + j / 2 * kReq, out.data() + j * kReq, kReq), 0) << j;
    EXPECT_EQ(memcmp(back.data(), out.data(), out.size()), 0);

    ote__rdma_test_grants_t g;
    ASSERT_EQ(ote__rdma_test_grants(Addr(req).c_str(), &g), OTE_OK);
    EXPECT_LE(g.inflight_peak, kCap) << "more than the limit in flight at once";
    EXPECT_GE(g.inflight_peak, kReq) << "the limit was not used";
    EXPECT_GT(g.cap_waits, 0u) << kN << " x 2 MiB never waited for room under 4 MiB";
    EXPECT_EQ(g.inflight_now, 0u);

    for (int i = 0; i < 2; i++) EXPECT_EQ(ote_segment_close(seg[i]), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    for (int i = 0; i < 2; i++) EXPECT_EQ(ote_engine_destroy(src[i]), OTE_OK);
}

// The key is a size like the others: malformed text is refused at ote_config_set.
TEST(RdmaCreditTest, RefusesAMalformedLimit) {
    ote_config_t *cfg = nullptr;
    ASSERT_EQ(ote_config_create(&cfg), OTE_OK);
    EXPECT_EQ(ote_config_set(cfg, "rdma_max_inflight", "lots"), OTE_ERR_INVALID);
    EXPECT_EQ(ote_config_set(cfg, "rdma_max_inflight", "64M"), OTE_OK);
    EXPECT_EQ(ote_config_set(cfg, "rdma_max_inflight", "0"), OTE_OK);
    ote_config_destroy(cfg);
}

} // namespace

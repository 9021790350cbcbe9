// tests/engine/gpu_direct_range_test.cc - the requester's memory of remote ranges served
// on direct slots (engine/rdma/rdma_direct.c): a request into a range where an earlier
// request was redirected to a direct slot goes there first, skipping the redirect's round
// trip; when the memory there changed and is served on plain slots, the source's redirect
// sends it back and the range is forgotten. Over verbs/sim with the fake libcuda.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "tests/engine/engine_util.h"
#include "tests/engine/gpu_fixture.h"
#include "tests/engine/pattern.h"

extern "C" {
#include "engine/rdma/test_hook.h"
#include "ote/ote.h"
}

namespace {

using ote_gpu_test::RdmaGpuEngine;
using ote_test::kSec;

constexpr int kCudaErrorUnknown = 999;

class GpuDirectRangeTest : public ote_gpu_test::GpuTest {
  protected:
    static ote_status_t Run(ote_engine_t *e, ote_segment_t *seg, ote_opcode_t op, uint64_t local,
                            uint64_t remote, size_t len) {
        ote_request_t r = {op, reinterpret_cast<void *>(local), seg, remote, len};
        ote_transfer_status_t ts{};
        return ote_test::RunOne(e, r, 120 * kSec, &ts);
    }
    static ote__rdma_test_grants_t Grants(ote_engine_t *e) {
        ote__rdma_test_grants_t g{};
        EXPECT_EQ(ote__rdma_test_grants(ote_test::EngineAddress(e).c_str(), &g), OTE_OK);
        return g;
    }
};

// The remote range the requester remembers as direct is only a hint: the source's buffer
// there unregistered and registered again without its dma-buf (the driver's export
// failed: served staged, on plain slots), the next request into the range, asked on a
// direct slot first, is sent back to a plain slot by the same redirect, moves staged with
// every byte right, and the range is forgotten (the request after it goes plain at once).
TEST_F(GpuDirectRangeTest, RangeKnownDirectIsSentBackWhenTheMemoryChanged) {
    ote_engine_t *src = RdmaGpuEngine("direct,staging");
    ASSERT_NE(src, nullptr);
    ote_engine_t *req = RdmaGpuEngine("direct,staging");
    ASSERT_NE(req, nullptr);
    constexpr size_t kLen = 1u << 20;
    uint64_t rd = DevAlloc(kLen);
    ASSERT_NE(rd, 0u);
    ASSERT_EQ(ote_memory_register(src, reinterpret_cast<void *>(rd), kLen,
                                  OTE_PERM_READ | OTE_PERM_WRITE),
              OTE_OK);
    std::vector<uint8_t> host(kLen);
    const uint64_t h = reinterpret_cast<uintptr_t>(host.data());
    ASSERT_EQ(ote_memory_register(req, host.data(), kLen, OTE_PERM_READ | OTE_PERM_WRITE), OTE_OK);
    ote_segment_t *seg = nullptr;
    ASSERT_NO_FATAL_FAILURE(OpenSegment(req, src, &seg));
    // Served by exact MRs: redirected once, then known direct.
    DevFill(rd, kLen, 500);
    ASSERT_EQ(Run(req, seg, OTE_READ, h, rd, kLen), OTE_OK);
    EXPECT_EQ(ote_hash(host.data(), kLen), ote_hash(DevRead(rd, kLen).data(), kLen));
    EXPECT_GE(Grants(req).direct_followed, 1u);
    // Registered again without its dma-buf: the source stages it.
    ASSERT_EQ(ote_test::UnregisterWhenFree(src, reinterpret_cast<void *>(rd)), OTE_OK);
    fake_.fail("cuMemGetHandleForAddressRange", 1, 1, kCudaErrorUnknown);
    ASSERT_EQ(ote_memory_register(src, reinterpret_cast<void *>(rd), kLen,
                                  OTE_PERM_READ | OTE_PERM_WRITE),
              OTE_OK);
    fake_.clear_faults();
    for (int round = 0; round < 2; round++) {
        SCOPED_TRACE(round == 0 ? "first request after the change" : "the next one");
        DevFill(rd, kLen, 501 + round);
        ote__rdma_test_grants_t s1 = Grants(src), r1 = Grants(req);
        ASSERT_EQ(Run(req, seg, OTE_READ, h, rd, kLen), OTE_OK);
        EXPECT_EQ(ote_hash(host.data(), kLen), ote_hash(DevRead(rd, kLen).data(), kLen));
        ote__rdma_test_grants_t s2 = Grants(src), r2 = Grants(req);
        // The first: asked direct (the range), sent back (a redirect per device that
        // started a run at once, at most 2); the next: never asked direct.
        if (round == 0) {
            EXPECT_GE(r2.direct_recalled - r1.direct_recalled, 1u) << "not sent direct first";
        } else {
            EXPECT_EQ(r2.direct_recalled, r1.direct_recalled) << "the range not forgotten";
        }
        EXPECT_LE(s2.direct_redirects - s1.direct_redirects, round == 0 ? 2u : 0u);
        if (round == 0) {
            EXPECT_GE(s2.direct_redirects - s1.direct_redirects, 1u) << "not asked direct";
        }
        EXPECT_EQ(s2.direct_served, s1.direct_served) << "served by an exact MR";
        EXPECT_EQ(r2.direct_followed, r1.direct_followed);
    }
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(ote_test::UnregisterWhenFree(req, host.data()), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    EXPECT_EQ(ote_test::UnregisterWhenFree(src, reinterpret_cast<void *>(rd)), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
}

} // namespace

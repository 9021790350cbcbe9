// Engine destroy with GPU work the CUDA layer cannot release (issue 26, teardown): a
// staging pool whose pinned memory will not free (cuMemFreeHost fails at the fake driver)
// keeps the engine: ote_engine_destroy returns OTE_ERR_RETAINED, not OK; once the driver
// frees again, a second destroy releases exactly what was left and returns OK.
#include <gtest/gtest.h>

#include <vector>

#include "tests/engine/engine_util.h"
#include "tests/engine/gpu_fixture.h"
#include "tests/engine/pattern.h"

extern "C" {
#include "ote/ote.h"
}

namespace {

using ote_test::kSec;

constexpr size_t kLen = 4u << 20;
constexpr int kCudaErrorUnknown = 999;

class GpuDestroyTest : public ote_gpu_test::GpuTest {};

TEST_F(GpuDestroyTest, RetainedStagingMemoryKeepsTheEngineUntilItFrees) {
    if (!fake_.present()) GTEST_SKIP() << "needs the fake driver's fault injection";
    ote_engine_t *src = ote_test::NewEngine({{"transports", "tcp"}, {"gpu_paths", "staging"}});
    ote_engine_t *dst = ote_test::NewEngine({{"transports", "tcp"}});
    ASSERT_NE(src, nullptr);
    ASSERT_NE(dst, nullptr);
    uint64_t d = DevAlloc(kLen);
    ASSERT_NE(d, 0u);
    DevFill(d, kLen, 5);
    std::vector<uint8_t> host(kLen, 0);
    void *dptr = reinterpret_cast<void *>(d);
    ASSERT_EQ(ote_memory_register(src, dptr, kLen, OTE_PERM_READ | OTE_PERM_WRITE), OTE_OK);
    ASSERT_EQ(ote_memory_register(dst, host.data(), kLen, OTE_PERM_READ | OTE_PERM_WRITE), OTE_OK);
    ote_segment_t *seg = nullptr;
    OpenSegment(src, dst, &seg);
    ASSERT_NE(seg, nullptr);
    // A staged WRITE from device memory: src's staging pool now holds pinned chunks.
    ote_batch_t *b = nullptr;
    ASSERT_EQ(ote_batch_create(src, 1, &b), OTE_OK);
    ote_request_t r = {OTE_WRITE, dptr, seg, reinterpret_cast<uint64_t>(host.data()), kLen};
    ASSERT_EQ(ote_batch_submit(b, &r, 1), OTE_OK);
    ASSERT_EQ(ote_batch_wait(b, 60 * kSec), OTE_OK);
    ASSERT_EQ(ote_batch_destroy(b), OTE_OK);
    EXPECT_EQ(ote_hash(host.data(), kLen), ote_gpu_test::PatternHash(5, 0, kLen));
    ASSERT_EQ(ote_segment_close(seg), OTE_OK);
    ASSERT_EQ(ote_engine_destroy(dst), OTE_OK);

    // The pinned memory will not free: the engine is kept, and says so.
    fake_.fail("cuMemFreeHost", 1, 1 << 20, kCudaErrorUnknown);
    ote_status_t st;
    {
        ote_test::ErrorLogsExpected retained_logs; // the device and the engine say so
        st = ote_engine_destroy(src);
    }
    EXPECT_EQ(ote_status_code(st), OTE_ERR_RETAINED) << ote_status_str(st);
    EXPECT_GE(fake_.calls("cuMemFreeHost"), 1u);
    // Every other call on a kept engine is refused.
    char addr[64];
    EXPECT_EQ(ote_status_code(ote_engine_address(src, addr, sizeof(addr))), OTE_ERR_STATE);

    // The driver frees again: a second destroy releases what was left.
    fake_.clear_faults();
    uint64_t frees = fake_.calls("cuMemFreeHost");
    if (ote_status_code(st) == OTE_ERR_RETAINED) {
        EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
        EXPECT_GT(fake_.calls("cuMemFreeHost"), frees) << "the retained chunks were freed";
    }
}

} // namespace

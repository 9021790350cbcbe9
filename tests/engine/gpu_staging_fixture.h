// tests/engine/gpu_staging_fixture.h - what gpu_staging_test.cc and
// gpu_rdma_staging_test.cc share (test-only): their data sizes, the fake's CUDA error
// codes they inject, and GpuStagingTest, the GPU fixture with an ote_gpu_target child and
// one request run to its end.
#ifndef OTE_TESTS_ENGINE_GPU_STAGING_FIXTURE_H
#define OTE_TESTS_ENGINE_GPU_STAGING_FIXTURE_H

#include <string>

#include "tests/engine/engine_util.h"
#include "tests/engine/gpu_fixture.h"
#include "tests/engine/target.h"
#include "tests/util/test_base.h"

extern "C" {
#include "ote/ote.h"
}

namespace ote_gpu_test {

// The largest data case: 64 MiB, 16 MiB under TSan (ote_test::TsanScaled: the target
// fills and hashes its whole buffer for every case, instrumented there too).
constexpr uint64_t kBigLen = ote_test::TsanScaled(64ull << 20, 4);
constexpr uint64_t kTargetLen = kBigLen + 4096;
constexpr int kCudaErrorUnknown = 999;
constexpr int kCudaErrorInvalidValue = 1;

class GpuStagingTest : public ote_gpu_test::GpuTest {
  protected:
    bool StartTarget(ote_test::Target &t, uint64_t len = kTargetLen,
                     const std::string &transports = "shm,tcp") {
        return ote_gpu_test::StartGpuTarget(t, len, {"OTE_TRANSPORTS=" + transports});
    }

    // One request, waited for; its final status in *out.
    ote_status_t Run(ote_engine_t *e, ote_segment_t *seg, ote_opcode_t op, uint64_t local,
                     uint64_t remote, size_t len, ote_transfer_status_t *out = nullptr) {
        ote_batch_t *b = nullptr;
        EXPECT_EQ(ote_batch_create(e, 1, &b), OTE_OK);
        if (b == nullptr) return OTE_ERR_NOMEM;
        ote_request_t r = {op, reinterpret_cast<void *>(local), seg, remote, len};
        ote_status_t st = ote_batch_submit(b, &r, 1);
        if (st == OTE_OK) {
            st = ote_batch_wait(b, 120 * ote_test::kSec);
            ote_transfer_status_t ts{};
            EXPECT_EQ(ote_batch_status(b, 0, &ts), OTE_OK);
            if (out) *out = ts;
        }
        EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
        return st;
    }
};

} // namespace ote_gpu_test

#endif

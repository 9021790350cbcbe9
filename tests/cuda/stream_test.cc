// cuda/stream: asynchronous copies with holds and a reusable event; pending work drained
// before reuse or destroy; an unknown outcome retains the stream and its holds.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <vector>

#include "tests/cuda/cuda_test_util.h"

extern "C" {
#include "cuda/memory/memory.h"
#include "cuda/pinned/pinned.h"
#include "cuda/stream/stream.h"
}

namespace {

using ote_cuda_test::CudaTest;
using ote_cuda_test::LongDeadline;

// A host function that keeps its stream busy until released (bounded: it gives up after
// 30 s so a failing test cannot hang the driver thread forever).
struct Gate {
    std::atomic<bool> open{false};
    std::atomic<bool> entered{false};
    static void Fn(void *arg) {
        Gate *g = static_cast<Gate *>(arg);
        g->entered = true;
        ote_test::WaitUntil([g] { return g->open.load(); }, ote_cuda_test::kLongWait,
                            "the test to open the gate");
    }
};

class CudaStreamTest : public CudaTest {
  protected:
    void SetUp() override {
        CudaTest::SetUp();
        if (IsSkipped() || HasFatalFailure()) return;
        ASSERT_EQ(ote_cuda_stream_create(dev_, &s_), OTE_OK);
        ASSERT_EQ(ote_cuda_host_alloc(dev_, kSize, &host_), OTE_OK);
        ASSERT_EQ(ote_cuda_host_alloc(dev_, kSize, &back_), OTE_OK);
        ASSERT_EQ(ote_cuda_alloc_create(dev_, kSize, 0, &a_), OTE_OK);
        ASSERT_EQ(ote_cuda_alloc_create(dev_, kSize, 0, &b_), OTE_OK);
        unsigned char *h = static_cast<unsigned char *>(ote_cuda_host_mem_ptr(host_));
        for (size_t i = 0; i < kSize; i++) h[i] = static_cast<unsigned char>(i * 13 + 1);
    }
    void TearDown() override {
        if (s_ != nullptr) {
            EXPECT_EQ(ote_cuda_stream_destroy(s_, LongDeadline()), OTE_OK);
        }
        if (a_ != nullptr) {
            EXPECT_EQ(ote_cuda_alloc_destroy(a_, LongDeadline()), OTE_OK);
        }
        if (b_ != nullptr) {
            EXPECT_EQ(ote_cuda_alloc_destroy(b_, LongDeadline()), OTE_OK);
        }
        if (host_ != nullptr) {
            EXPECT_EQ(ote_cuda_host_mem_destroy(host_, LongDeadline()), OTE_OK);
        }
        if (back_ != nullptr) {
            EXPECT_EQ(ote_cuda_host_mem_destroy(back_, LongDeadline()), OTE_OK);
        }
        CudaTest::TearDown();
    }
    ote_cu_deviceptr_t H(ote_cuda_host_mem_t *m) {
        return reinterpret_cast<uintptr_t>(ote_cuda_host_mem_ptr(m));
    }
    // HtoD host_ -> a_, DtoD a_ -> b_, DtoH b_ -> back_, all held, not committed.
    void EnqueueRoundTrip() {
        ASSERT_EQ(ote_cuda_stream_hold_host(s_, host_), OTE_OK);
        ASSERT_EQ(ote_cuda_stream_hold_host(s_, back_), OTE_OK);
        ASSERT_EQ(ote_cuda_stream_hold_alloc(s_, a_), OTE_OK);
        ASSERT_EQ(ote_cuda_stream_hold_alloc(s_, b_), OTE_OK);
        ASSERT_EQ(
            ote_cuda_stream_copy(s_, OTE_CUDA_COPY_HTOD, ote_cuda_alloc_ptr(a_), H(host_), kSize),
            OTE_OK);
        ASSERT_EQ(ote_cuda_stream_copy(s_, OTE_CUDA_COPY_DTOD, ote_cuda_alloc_ptr(b_),
                                       ote_cuda_alloc_ptr(a_), kSize),
                  OTE_OK);
        ASSERT_EQ(
            ote_cuda_stream_copy(s_, OTE_CUDA_COPY_DTOH, H(back_), ote_cuda_alloc_ptr(b_), kSize),
            OTE_OK);
    }
    bool RoundTripArrived() {
        return memcmp(ote_cuda_host_mem_ptr(host_), ote_cuda_host_mem_ptr(back_), kSize) == 0;
    }
    static constexpr size_t kSize = 4 << 20;
    ote_cuda_stream_t *s_ = nullptr;
    ote_cuda_host_mem_t *host_ = nullptr, *back_ = nullptr;
    ote_cuda_alloc_t *a_ = nullptr, *b_ = nullptr;
};

TEST_F(CudaStreamTest, RoundTripIsAsynchronousAndHoldsItsMemoryUntilComplete) {
    EnqueueRoundTrip();
    EXPECT_EQ(ote_cuda_stream_state(s_), OTE_CUDA_STREAM_OPEN);
    EXPECT_EQ(ote_cuda_stream_poll(s_), OTE_ERR_STATE); // not committed yet
    EXPECT_EQ(ote_cuda_alloc_users(a_), 1u);
    EXPECT_EQ(ote_cuda_host_mem_users(back_), 1u);
    ASSERT_EQ(ote_cuda_stream_commit(s_, nullptr, nullptr), OTE_OK);
    ASSERT_EQ(ote_cuda_stream_wait(s_, LongDeadline()), OTE_OK);
    EXPECT_EQ(ote_cuda_stream_state(s_), OTE_CUDA_STREAM_IDLE);
    EXPECT_EQ(ote_cuda_stream_holds(s_), 0u);
    EXPECT_EQ(ote_cuda_alloc_users(a_), 0u);
    EXPECT_EQ(ote_cuda_host_mem_users(back_), 0u);
    EXPECT_TRUE(RoundTripArrived());
    // The same stream and event again (reuse).
    memset(ote_cuda_host_mem_ptr(back_), 0, kSize);
    EnqueueRoundTrip();
    ASSERT_EQ(ote_cuda_stream_commit(s_, nullptr, nullptr), OTE_OK);
    ASSERT_EQ(ote_cuda_stream_wait(s_, LongDeadline()), OTE_OK);
    EXPECT_TRUE(RoundTripArrived());
}

TEST_F(CudaStreamTest, PendingWorkIsDrainedBeforeReuseOrDestroy) {
    Gate gate;
    EnqueueRoundTrip();
    ASSERT_EQ(ote_cuda_stream_commit(s_, Gate::Fn, &gate), OTE_OK);
    ASSERT_TRUE(ote_test::WaitUntil([&] { return gate.entered.load(); }, ote_cuda_test::kLongWait,
                                    "the stream's worker to enter the gate"));
    // The stream is held up by the gate: pending, reuse refused, destroy not possible.
    EXPECT_EQ(ote_status_code(ote_cuda_stream_poll(s_)), OTE_ERR_AGAIN);
    EXPECT_EQ(ote_cuda_stream_copy(s_, OTE_CUDA_COPY_HTOD, ote_cuda_alloc_ptr(a_), H(host_), 16),
              OTE_ERR_BUSY);
    EXPECT_EQ(ote_cuda_stream_wait(s_, ote_deadline_after(5 * OTE_NSEC_PER_MSEC)), OTE_ERR_TIMEOUT);
    EXPECT_EQ(ote_cuda_stream_destroy(s_, ote_deadline_after(5 * OTE_NSEC_PER_MSEC)),
              OTE_ERR_TIMEOUT);
    EXPECT_EQ(ote_cuda_alloc_destroy(a_, ote_deadline_after(5 * OTE_NSEC_PER_MSEC)), OTE_ERR_BUSY);
    EXPECT_EQ(ote_cuda_alloc_users(a_), 1u);
    gate.open = true;
    ASSERT_EQ(ote_cuda_stream_wait(s_, LongDeadline()), OTE_OK);
    EXPECT_TRUE(RoundTripArrived());
    EXPECT_EQ(ote_cuda_alloc_users(a_), 0u);
    ASSERT_EQ(ote_cuda_stream_copy(s_, OTE_CUDA_COPY_HTOD, ote_cuda_alloc_ptr(a_), H(host_), 16),
              OTE_OK);
    // Destroy of a stream with uncommitted work commits and drains it.
    ASSERT_EQ(ote_cuda_stream_destroy(s_, LongDeadline()), OTE_OK);
    s_ = nullptr;
}

TEST_F(CudaStreamTest, CompletionCallbackHasRunWhenThePollSucceeds) {
    struct Flag {
        std::atomic<int> n{0};
        static void Fn(void *arg) { static_cast<Flag *>(arg)->n++; }
    } flag;
    EnqueueRoundTrip();
    ASSERT_EQ(ote_cuda_stream_commit(s_, Flag::Fn, &flag), OTE_OK);
    ASSERT_EQ(ote_cuda_stream_wait(s_, LongDeadline()), OTE_OK);
    EXPECT_EQ(flag.n.load(), 1);
    EXPECT_TRUE(RoundTripArrived());
}

TEST_F(CudaStreamTest, StagingChunkGoesBackWhenItsCopyCompletes) {
    ote_cuda_staging_t *pool = nullptr;
    ASSERT_EQ(ote_cuda_staging_create(dev_, 1 << 16, 1, &pool), OTE_OK);
    ote_cuda_chunk_t c{};
    ASSERT_EQ(ote_cuda_staging_acquire(pool, LongDeadline(), &c), OTE_OK);
    memset(c.ptr, 0x77, c.size);
    ASSERT_EQ(ote_cuda_stream_hold_chunk(s_, pool, &c), OTE_OK); // the stream owns it now
    ASSERT_EQ(ote_cuda_stream_copy(s_, OTE_CUDA_COPY_HTOD, ote_cuda_alloc_ptr(a_),
                                   reinterpret_cast<uintptr_t>(c.ptr), c.size),
              OTE_OK);
    ASSERT_EQ(ote_cuda_stream_commit(s_, nullptr, nullptr), OTE_OK);
    ASSERT_EQ(ote_cuda_stream_wait(s_, LongDeadline()), OTE_OK);
    EXPECT_EQ(ote_cuda_staging_free_count(pool), 1u);
    std::vector<unsigned char> out(c.size);
    ASSERT_EQ(ote_cuda_device_make_current(dev_), OTE_OK);
    ASSERT_EQ(t_->cuMemcpyDtoH(out.data(), ote_cuda_alloc_ptr(a_), out.size()), OTE_CU_SUCCESS);
    EXPECT_EQ(out, std::vector<unsigned char>(c.size, 0x77));
    ASSERT_EQ(ote_cuda_staging_destroy(pool), OTE_OK);
}

TEST_F(CudaStreamTest, UnknownWaitOutcomeRetainsTheStreamAndItsHoldsUntilReclaimed) {
    REQUIRE_FAKE();
    EnqueueRoundTrip();
    ASSERT_EQ(ote_cuda_stream_commit(s_, nullptr, nullptr), OTE_OK);
    fake_.fail("cuEventQuery", 1, 1, OTE_CU_ERROR_UNKNOWN);
    ote_status_t st = ote_cuda_stream_poll(s_);
    EXPECT_EQ(ote_status_errno(st), OTE_CU_ERROR_UNKNOWN);
    EXPECT_EQ(ote_cuda_stream_state(s_), OTE_CUDA_STREAM_RETAINED);
    EXPECT_EQ(ote_cuda_driver_retained(drv_), 1u);
    EXPECT_EQ(ote_cuda_stream_holds(s_), 4u);
    EXPECT_EQ(ote_cuda_alloc_users(a_), 1u); // the memory stays held
    EXPECT_EQ(ote_cuda_alloc_destroy(a_, ote_deadline_after(5 * OTE_NSEC_PER_MSEC)), OTE_ERR_BUSY);
    EXPECT_EQ(ote_cuda_stream_copy(s_, OTE_CUDA_COPY_HTOD, ote_cuda_alloc_ptr(a_), H(host_), 16),
              OTE_ERR_RETAINED);
    EXPECT_EQ(ote_cuda_stream_poll(s_), OTE_ERR_RETAINED);
    // Asked again (the driver answers now): the work proved complete, holds released.
    ote_test::WaitUntil(
        [&] {
            st = ote_cuda_stream_reclaim(s_);
            return ote_status_code(st) != OTE_ERR_AGAIN;
        },
        ote_cuda_test::kLongWait, "ote_cuda_stream_reclaim to answer other than AGAIN");
    ASSERT_EQ(st, OTE_OK);
    EXPECT_EQ(ote_cuda_stream_state(s_), OTE_CUDA_STREAM_IDLE);
    EXPECT_EQ(ote_cuda_alloc_users(a_), 0u);
    EXPECT_EQ(ote_cuda_driver_retained(drv_), 0u);
    EXPECT_TRUE(RoundTripArrived());
}

TEST_F(CudaStreamTest, RetainedStreamDestroyIsParkedOnTheDevice) {
    REQUIRE_FAKE();
    EnqueueRoundTrip();
    ASSERT_EQ(ote_cuda_stream_commit(s_, nullptr, nullptr), OTE_OK);
    fake_.fail("cuEventQuery", 1, 1, OTE_CU_ERROR_ILLEGAL_ADDRESS);
    EXPECT_EQ(ote_status_code(ote_cuda_stream_wait(s_, LongDeadline())), OTE_ERR_DEVICE_FATAL);
    EXPECT_EQ(ote_cuda_stream_destroy(s_, LongDeadline()), OTE_ERR_RETAINED);
    s_ = nullptr; // owned by the device's retained list now
    EXPECT_EQ(ote_cuda_device_retained(dev_), 1u);
    EXPECT_EQ(ote_cuda_driver_retained(drv_), 1u);
    EXPECT_EQ(ote_cuda_alloc_users(b_), 1u);
    EXPECT_EQ(ote_cuda_device_close(dev_), OTE_ERR_BUSY);
    SettleFake();
    ASSERT_EQ(ote_cuda_device_reclaim(dev_, nullptr), OTE_OK);
    EXPECT_EQ(ote_cuda_alloc_users(b_), 0u);
    EXPECT_EQ(ote_cuda_driver_retained(drv_), 0u);
}

TEST_F(CudaStreamTest, FailedEnqueueDrainsAndReleasesHolds) {
    REQUIRE_FAKE();
    ASSERT_EQ(ote_cuda_stream_hold_alloc(s_, a_), OTE_OK);
    ASSERT_EQ(ote_cuda_stream_copy(s_, OTE_CUDA_COPY_HTOD, ote_cuda_alloc_ptr(a_), H(host_), kSize),
              OTE_OK);
    fake_.fail("cuMemcpyDtoDAsync", 1, 1, OTE_CU_ERROR_INVALID_VALUE);
    ote_status_t st = ote_cuda_stream_copy(s_, OTE_CUDA_COPY_DTOD, ote_cuda_alloc_ptr(b_),
                                           ote_cuda_alloc_ptr(a_), kSize);
    EXPECT_EQ(ote_status_errno(st), OTE_CU_ERROR_INVALID_VALUE);
    EXPECT_EQ(ote_cuda_stream_state(s_), OTE_CUDA_STREAM_IDLE); // drained
    EXPECT_EQ(ote_cuda_alloc_users(a_), 0u);
    // A failed record after a drain that fails: retained.
    ASSERT_EQ(ote_cuda_stream_hold_alloc(s_, a_), OTE_OK);
    fake_.fail("cuEventRecord", 1, 1, OTE_CU_ERROR_INVALID_HANDLE);
    fake_.fail("cuStreamSynchronize", 1, 1, OTE_CU_ERROR_UNKNOWN);
    EXPECT_NE(ote_cuda_stream_commit(s_, nullptr, nullptr), OTE_OK);
    EXPECT_EQ(ote_cuda_stream_state(s_), OTE_CUDA_STREAM_RETAINED);
    EXPECT_EQ(ote_cuda_alloc_users(a_), 1u);
    // Reclaim asks the stream itself (idle: every enqueued piece of work is done).
    ASSERT_EQ(ote_cuda_stream_reclaim(s_), OTE_OK);
    EXPECT_EQ(ote_cuda_alloc_users(a_), 0u);
}

} // namespace

// cuda/pinned: cuMemHostAlloc / cuMemHostRegister owners and the staging chunk pool.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "tests/cuda/cuda_test_util.h"

extern "C" {
#include "cuda/memory/memory.h"
#include "cuda/pinned/pinned.h"
}

namespace {

using ote_cuda_test::CudaTest;
using ote_cuda_test::LongDeadline;

class CudaPinnedTest : public CudaTest {};

TEST_F(CudaPinnedTest, HostAllocationIsPinnedAndClassified) {
    ote_cuda_host_mem_t *m = nullptr;
    ASSERT_EQ(ote_cuda_host_alloc(dev_, 1 << 20, &m), OTE_OK);
    EXPECT_EQ(ote_cuda_host_mem_size(m), size_t{1} << 20);
    EXPECT_EQ(ote_cuda_host_mem_is_registered(m), 0);
    if (fake_.present()) {
        EXPECT_EQ(Counters().host_allocs, at_start_.host_allocs + 1);
    }
    char *p = static_cast<char *>(ote_cuda_host_mem_ptr(m));
    memset(p, 0x5a, 1 << 20); // host memory: the host may touch it
    ote_cuda_pointer_info_t info;
    ASSERT_EQ(ote_cuda_pointer_classify(drv_, reinterpret_cast<uintptr_t>(p + 100), &info), OTE_OK);
    EXPECT_EQ(info.kind, OTE_CUDA_MEM_PINNED);
    EXPECT_EQ(info.range_start, reinterpret_cast<uintptr_t>(p));
    EXPECT_NE(info.buffer_id, 0u);
    EXPECT_EQ(ote_cuda_device_owners(dev_), 1u);
    ASSERT_EQ(ote_cuda_host_mem_destroy(m, LongDeadline()), OTE_OK);
    EXPECT_EQ(ote_cuda_device_owners(dev_), 0u);
}

TEST_F(CudaPinnedTest, RegistrationPinsCallerMemoryAndKeepsItTheCallers) {
    size_t n = 2 << 20;
    void *buf = aligned_alloc(4096, n);
    ASSERT_NE(buf, nullptr);
    memset(buf, 1, n);
    ote_cuda_host_mem_t *m = nullptr;
    ASSERT_EQ(ote_cuda_host_register(dev_, buf, n, &m), OTE_OK);
    EXPECT_EQ(ote_cuda_host_mem_ptr(m), buf);
    EXPECT_EQ(ote_cuda_host_mem_is_registered(m), 1);
    if (fake_.present()) {
        EXPECT_EQ(Counters().host_registrations, at_start_.host_registrations + 1);
    }
    ote_cuda_pointer_info_t info;
    ASSERT_EQ(ote_cuda_pointer_classify(drv_, reinterpret_cast<uintptr_t>(buf) + 4096, &info),
              OTE_OK);
    EXPECT_EQ(info.kind, OTE_CUDA_MEM_PINNED);
    // A pinned buffer moves bytes to and from the device with a synchronous copy.
    ote_cuda_alloc_t *a = nullptr;
    ASSERT_EQ(ote_cuda_alloc_create(dev_, n, 0, &a), OTE_OK);
    ASSERT_EQ(ote_cuda_device_make_current(dev_), OTE_OK);
    static_cast<char *>(buf)[n - 1] = 42;
    ASSERT_EQ(t_->cuMemcpyHtoD(ote_cuda_alloc_ptr(a), buf, n), OTE_CU_SUCCESS);
    memset(buf, 0, n);
    ASSERT_EQ(t_->cuMemcpyDtoH(buf, ote_cuda_alloc_ptr(a), n), OTE_CU_SUCCESS);
    EXPECT_EQ(static_cast<char *>(buf)[n - 1], 42);
    EXPECT_EQ(static_cast<char *>(buf)[0], 1);
    ASSERT_EQ(ote_cuda_alloc_destroy(a, LongDeadline()), OTE_OK);
    // Users hold it; destroy refuses at its deadline.
    ASSERT_EQ(ote_cuda_host_mem_acquire(m), OTE_OK);
    EXPECT_EQ(ote_cuda_host_mem_destroy(m, ote_deadline_after(10 * OTE_NSEC_PER_MSEC)),
              OTE_ERR_BUSY);
    ote_cuda_host_mem_release(m);
    ASSERT_EQ(ote_cuda_host_mem_destroy(m, LongDeadline()), OTE_OK);
    ASSERT_EQ(ote_cuda_pointer_classify(drv_, reinterpret_cast<uintptr_t>(buf), &info), OTE_OK);
    EXPECT_EQ(info.kind, OTE_CUDA_MEM_PAGEABLE); // unregistered, still ours
    free(buf);
}

TEST_F(CudaPinnedTest, FailedUnregisterIsRetainedAndReclaimed) {
    REQUIRE_FAKE();
    std::vector<char> buf(1 << 16);
    ote_cuda_host_mem_t *m = nullptr;
    fake_.fail("cuMemHostRegister", 1, 1, OTE_CU_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    EXPECT_EQ(ote_status_errno(ote_cuda_host_register(dev_, buf.data(), buf.size(), &m)),
              OTE_CU_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    EXPECT_EQ(m, nullptr);
    ASSERT_EQ(ote_cuda_host_register(dev_, buf.data(), buf.size(), &m), OTE_OK);
    fake_.fail("cuMemHostUnregister", 1, 1, OTE_CU_ERROR_UNKNOWN);
    EXPECT_EQ(ote_status_code(ote_cuda_host_mem_destroy(m, LongDeadline())), OTE_ERR_RETAINED);
    EXPECT_EQ(ote_cuda_device_retained(dev_), 1u);
    EXPECT_EQ(Counters().host_registrations, at_start_.host_registrations + 1);
    ASSERT_EQ(ote_cuda_device_reclaim(dev_, nullptr), OTE_OK);
    EXPECT_EQ(Counters().host_registrations, at_start_.host_registrations);
}

TEST_F(CudaPinnedTest, StagingPoolHandsOutDistinctChunksAndTimesOutWhenEmpty) {
    ote_cuda_staging_t *pool = nullptr;
    ASSERT_EQ(ote_cuda_staging_create(dev_, 64 << 10, 4, &pool), OTE_OK);
    EXPECT_EQ(ote_cuda_staging_free_count(pool), 4u);
    std::vector<ote_cuda_chunk_t> got(4);
    std::set<void *> ptrs;
    for (auto &c : got) {
        ASSERT_EQ(ote_cuda_staging_acquire(pool, LongDeadline(), &c), OTE_OK);
        EXPECT_EQ(c.size, size_t{64} << 10);
        memset(c.ptr, c.index, c.size); // pinned host memory
        ptrs.insert(c.ptr);
    }
    EXPECT_EQ(ptrs.size(), 4u);
    ote_cuda_pointer_info_t info;
    ASSERT_EQ(ote_cuda_pointer_classify(drv_, reinterpret_cast<uintptr_t>(got[2].ptr), &info),
              OTE_OK);
    EXPECT_EQ(info.kind, OTE_CUDA_MEM_PINNED);
    ote_cuda_chunk_t extra{};
    EXPECT_EQ(ote_cuda_staging_acquire(pool, ote_deadline_after(10 * OTE_NSEC_PER_MSEC), &extra),
              OTE_ERR_TIMEOUT);
    EXPECT_EQ(ote_cuda_staging_destroy(pool), OTE_ERR_BUSY);
    ASSERT_EQ(ote_cuda_staging_release(pool, &got[1]), OTE_OK);
    EXPECT_EQ(ote_cuda_staging_release(pool, &got[1]), OTE_ERR_INVALID); // not out any more
    ASSERT_EQ(ote_cuda_staging_acquire(pool, LongDeadline(), &extra), OTE_OK);
    EXPECT_EQ(extra.ptr, got[1].ptr);
    got[1] = extra;
    for (auto &c : got) ASSERT_EQ(ote_cuda_staging_release(pool, &c), OTE_OK);
    ASSERT_EQ(ote_cuda_staging_destroy(pool), OTE_OK);
}

TEST_F(CudaPinnedTest, StagingWaiterIsServedWhenAChunkComesBack) {
    ote_cuda_staging_t *pool = nullptr;
    ASSERT_EQ(ote_cuda_staging_create(dev_, 4096, 1, &pool), OTE_OK);
    ote_cuda_chunk_t held{};
    ASSERT_EQ(ote_cuda_staging_acquire(pool, LongDeadline(), &held), OTE_OK);
    std::atomic<int> result{-1};
    ote_cuda_chunk_t waited{};
    std::thread waiter([&] { result = ote_cuda_staging_acquire(pool, LongDeadline(), &waited); });
    usleep(20000);
    EXPECT_EQ(result.load(), -1); // still waiting (the deadline is far)
    ASSERT_EQ(ote_cuda_staging_release(pool, &held), OTE_OK);
    waiter.join();
    EXPECT_EQ(result.load(), OTE_OK);
    EXPECT_EQ(waited.ptr, held.ptr);
    ASSERT_EQ(ote_cuda_staging_release(pool, &waited), OTE_OK);
    ASSERT_EQ(ote_cuda_staging_destroy(pool), OTE_OK);
}

} // namespace

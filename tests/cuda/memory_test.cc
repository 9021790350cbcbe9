// cuda/memory: devices and primary contexts, pointer classification, device allocations
// (cuMemAlloc and VMM) with their access lock, SYNC_MEMOPS, dmabuf export.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "tests/cuda/cuda_test_util.h"

extern "C" {
#include "cuda/memory/memory.h"
}

namespace {

using ote_cuda_test::CudaTest;
using ote_cuda_test::LongDeadline;

class CudaMemoryTest : public CudaTest {
  protected:
    // Sync copies through the driver table, with the device's context current.
    void Put(ote_cu_deviceptr_t d, const void *src, size_t n) {
        ASSERT_EQ(ote_cuda_device_make_current(dev_), OTE_OK);
        ASSERT_EQ(t_->cuMemcpyHtoD(d, src, n), OTE_CU_SUCCESS);
        // A pageable HtoD returns once the source is staged; a synchronous DtoH after it
        // returns when both are done (what a NIC or another mapping reads is then there).
        unsigned char fence = 0;
        ASSERT_EQ(t_->cuMemcpyDtoH(&fence, d, 1), OTE_CU_SUCCESS);
    }
    void Get(void *dst, ote_cu_deviceptr_t d, size_t n) {
        ASSERT_EQ(ote_cuda_device_make_current(dev_), OTE_OK);
        ASSERT_EQ(t_->cuMemcpyDtoH(dst, d, n), OTE_CU_SUCCESS);
    }
};

TEST_F(CudaMemoryTest, DeviceHoldsItsPrimaryContextAndRefusesToCloseWithOwners) {
    ASSERT_NE(ote_cuda_device_context(dev_), nullptr);
    EXPECT_EQ(ote_cuda_device_ordinal(dev_), 0);
    uint64_t retains = Counters().primary_ctx_retains;
    ote_cuda_device_t *second = nullptr;
    ASSERT_EQ(ote_cuda_device_open(drv_, 0, &second), OTE_OK);
    EXPECT_EQ(ote_cuda_device_context(second), ote_cuda_device_context(dev_)); // the primary one
    if (fake_.present()) {
        EXPECT_EQ(Counters().primary_ctx_retains, retains + 1);
    }
    ote_cuda_alloc_t *a = nullptr;
    ASSERT_EQ(ote_cuda_alloc_create(second, 4096, 0, &a), OTE_OK);
    EXPECT_EQ(ote_cuda_device_owners(second), 1u);
    EXPECT_EQ(ote_cuda_device_close(second), OTE_ERR_BUSY);
    ASSERT_EQ(ote_cuda_alloc_destroy(a, LongDeadline()), OTE_OK);
    ASSERT_EQ(ote_cuda_device_close(second), OTE_OK);
    if (fake_.present()) {
        EXPECT_EQ(Counters().primary_ctx_retains, retains);
    }
    ote_cuda_device_t *none = reinterpret_cast<ote_cuda_device_t *>(0x1);
    int n = 0;
    ASSERT_EQ(ote_cuda_device_count(drv_, &n), OTE_OK);
    EXPECT_NE(ote_cuda_device_open(drv_, n, &none), OTE_OK);
    EXPECT_EQ(none, reinterpret_cast<ote_cuda_device_t *>(0x1));
}

TEST_F(CudaMemoryTest, ClassifiesDeviceAndPageableMemoryWithoutTouchingIt) {
    ote_cuda_alloc_t *a = nullptr, *b = nullptr;
    ASSERT_EQ(ote_cuda_alloc_create(dev_, 1 << 20, 0, &a), OTE_OK);
    ASSERT_EQ(ote_cuda_alloc_create(dev_, 4096, 0, &b), OTE_OK);
    ote_cu_deviceptr_t base = ote_cuda_alloc_ptr(a);
    EXPECT_EQ(base % 256, 0u);
    ote_cuda_pointer_info_t info;
    ASSERT_EQ(ote_cuda_pointer_classify(drv_, base + 12345, &info), OTE_OK);
    EXPECT_EQ(info.kind, OTE_CUDA_MEM_DEVICE);
    EXPECT_EQ(info.device_ordinal, 0);
    EXPECT_EQ(info.context, ote_cuda_device_context(dev_));
    EXPECT_EQ(info.range_start, base);
    EXPECT_GE(info.range_size, size_t{1} << 20);
    EXPECT_NE(info.buffer_id, 0u);
    ote_cuda_pointer_info_t other;
    ASSERT_EQ(ote_cuda_pointer_classify(drv_, ote_cuda_alloc_ptr(b), &other), OTE_OK);
    EXPECT_NE(other.buffer_id, info.buffer_id);
    // Buffer ids are never reused: a new allocation after a free gets a new one.
    unsigned long long old_id = other.buffer_id;
    ASSERT_EQ(ote_cuda_alloc_destroy(b, LongDeadline()), OTE_OK);
    ASSERT_EQ(ote_cuda_alloc_create(dev_, 4096, 0, &b), OTE_OK);
    ASSERT_EQ(ote_cuda_pointer_classify(drv_, ote_cuda_alloc_ptr(b), &other), OTE_OK);
    EXPECT_NE(other.buffer_id, old_id);
    EXPECT_NE(other.buffer_id, info.buffer_id);

    std::vector<char> heap(4096);
    int on_stack = 0;
    for (const void *p :
         {static_cast<const void *>(heap.data()), static_cast<const void *>(&on_stack)}) {
        ote_cuda_pointer_info_t h;
        ASSERT_EQ(ote_cuda_pointer_classify(drv_, reinterpret_cast<uintptr_t>(p), &h), OTE_OK);
        EXPECT_EQ(h.kind, OTE_CUDA_MEM_PAGEABLE);
        EXPECT_EQ(h.device_ordinal, -1);
        EXPECT_EQ(h.buffer_id, 0u);
    }
    ASSERT_EQ(ote_cuda_alloc_destroy(a, LongDeadline()), OTE_OK);
    ASSERT_EQ(ote_cuda_alloc_destroy(b, LongDeadline()), OTE_OK);
}

TEST_F(CudaMemoryTest, AllocationHoldsBytes) {
    ote_cuda_alloc_t *a = nullptr;
    const size_t n = 3 << 20;
    ASSERT_EQ(ote_cuda_alloc_create(dev_, n, 0, &a), OTE_OK);
    EXPECT_EQ(ote_cuda_alloc_size(a), n);
    EXPECT_EQ(ote_cuda_alloc_is_vmm(a), 0);
    std::vector<unsigned char> in(n), out(n);
    for (size_t i = 0; i < n; i++) in[i] = static_cast<unsigned char>(i * 7 + 3);
    Put(ote_cuda_alloc_ptr(a), in.data(), n);
    Get(out.data(), ote_cuda_alloc_ptr(a), n);
    EXPECT_EQ(in, out);
    ASSERT_EQ(ote_cuda_alloc_destroy(a, LongDeadline()), OTE_OK);
}

TEST_F(CudaMemoryTest, VmmAllocationIsMappedAccessibleAndFreed) {
    int vmm = 0;
    ASSERT_EQ(
        t_->cuDeviceGetAttribute(&vmm, OTE_CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                 ote_cuda_device_handle(dev_)),
        OTE_CU_SUCCESS);
    if (!vmm) GTEST_SKIP() << "the device does not support virtual memory management";
    ote_cuda_alloc_t *a = nullptr;
    ASSERT_EQ(ote_cuda_alloc_create(dev_, 1000, OTE_CUDA_ALLOC_VMM, &a), OTE_OK);
    EXPECT_EQ(ote_cuda_alloc_is_vmm(a), 1);
    EXPECT_GE(ote_cuda_alloc_size(a), 1000u); // rounded to the granularity
    EXPECT_NE(ote_cuda_alloc_vmm_handle(a), 0u);
    if (fake_.present()) {
        EXPECT_EQ(Counters().vmm_handles, at_start_.vmm_handles + 1);
        EXPECT_EQ(Counters().vmm_mappings, at_start_.vmm_mappings + 1);
    }
    ote_cuda_pointer_info_t info;
    ASSERT_EQ(ote_cuda_pointer_classify(drv_, ote_cuda_alloc_ptr(a) + 10, &info), OTE_OK);
    EXPECT_EQ(info.kind, OTE_CUDA_MEM_DEVICE);
    char in[64] = "bytes in a VMM allocation", out[64] = {};
    Put(ote_cuda_alloc_ptr(a) + 512, in, sizeof(in));
    Get(out, ote_cuda_alloc_ptr(a) + 512, sizeof(out));
    EXPECT_STREQ(out, in);
    ASSERT_EQ(ote_cuda_alloc_destroy(a, LongDeadline()), OTE_OK);
}

TEST_F(CudaMemoryTest, AccessLockMakesDestroyWaitOrRefuse) {
    ote_cuda_alloc_t *a = nullptr;
    ASSERT_EQ(ote_cuda_alloc_create(dev_, 4096, 0, &a), OTE_OK);
    ASSERT_EQ(ote_cuda_alloc_acquire(a), OTE_OK);
    EXPECT_EQ(ote_cuda_alloc_users(a), 1u);
    // A user at the deadline: refused, nothing changed, still usable.
    EXPECT_EQ(ote_cuda_alloc_destroy(a, ote_deadline_after(20 * OTE_NSEC_PER_MSEC)), OTE_ERR_BUSY);
    char x[8] = "alive", y[8] = {};
    Put(ote_cuda_alloc_ptr(a), x, sizeof(x));
    Get(y, ote_cuda_alloc_ptr(a), sizeof(y));
    EXPECT_STREQ(y, "alive");
    ASSERT_EQ(ote_cuda_alloc_acquire(a), OTE_OK); // new users are welcome again
    ote_cuda_alloc_release(a);
    // Destroy waits for the user: meanwhile new users are refused.
    std::atomic<int> destroyed{-1};
    std::thread th([&] { destroyed = ote_cuda_alloc_destroy(a, LongDeadline()); });
    ote_status_t st = OTE_OK;
    ote_test::WaitUntil(
        [&] {
            st = ote_cuda_alloc_acquire(a);
            if (st != OTE_OK) return true;
            ote_cuda_alloc_release(a);
            return false;
        },
        ote_cuda_test::kLongWait, "a new user refused once the destroy began");
    EXPECT_EQ(st, OTE_ERR_STATE);
    EXPECT_EQ(destroyed.load(), -1); // still waiting for the first user
    ote_cuda_alloc_release(a);
    th.join();
    EXPECT_EQ(destroyed.load(), OTE_OK);
}

TEST_F(CudaMemoryTest, SyncMemopsIsSetOnTheAllocation) {
    ote_cuda_alloc_t *a = nullptr;
    ASSERT_EQ(ote_cuda_alloc_create(dev_, 1 << 16, 0, &a), OTE_OK);
    ASSERT_EQ(ote_cuda_pointer_set_sync_memops(dev_, ote_cuda_alloc_ptr(a) + 100), OTE_OK);
    unsigned int v = 0;
    ASSERT_EQ(
        t_->cuPointerGetAttribute(&v, OTE_CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, ote_cuda_alloc_ptr(a)),
        OTE_CU_SUCCESS);
    EXPECT_EQ(v & 0xff, 1u);
    ASSERT_EQ(ote_cuda_alloc_destroy(a, LongDeadline()), OTE_OK);
}

TEST_F(CudaMemoryTest, DmabufCoversTheRangeFromTheAllocationBase) {
    int dmabuf = 0;
    ASSERT_EQ(t_->cuDeviceGetAttribute(&dmabuf, OTE_CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
                                       ote_cuda_device_handle(dev_)),
              OTE_CU_SUCCESS);
    if (!dmabuf) GTEST_SKIP() << "the device does not support dmabuf export";
    ote_cuda_alloc_t *a = nullptr;
    const size_t n = 3 << 20;
    ASSERT_EQ(ote_cuda_alloc_create(dev_, n, 0, &a), OTE_OK);
    ote_cu_deviceptr_t base = ote_cuda_alloc_ptr(a);
    const size_t off = 4096 + 100, len = 1000;
    char msg[32] = "reached through the dmabuf";
    Put(base + off, msg, sizeof(msg));
    ote_cuda_dmabuf_t d;
    ASSERT_EQ(ote_cuda_dmabuf_export(dev_, base + off, len, &d), OTE_OK);
    EXPECT_GE(d.fd, 0);
    EXPECT_EQ(d.base, base);
    EXPECT_EQ(d.offset, off);
    size_t pg = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    EXPECT_EQ(d.length % pg, 0u);
    EXPECT_GE(d.length, off + len);
    if (fake_.present()) {
        // The fake's dmabuf is the allocation's memory: offset 0 = the base.
        void *m = mmap(nullptr, d.length, PROT_READ, MAP_SHARED, d.fd, 0);
        ASSERT_NE(m, MAP_FAILED);
        EXPECT_STREQ(static_cast<const char *>(m) + off, msg);
        munmap(m, d.length);
    }
    ote_cuda_dmabuf_close(&d);
    EXPECT_EQ(d.fd, -1);
    // Not device memory, or past the allocation: refused, no fd.
    std::vector<char> host(4096);
    ote_cuda_dmabuf_t bad = {-7, 0, 0, 0};
    EXPECT_EQ(ote_cuda_dmabuf_export(dev_, reinterpret_cast<uintptr_t>(host.data()), 100, &bad),
              OTE_ERR_INVALID);
    EXPECT_EQ(ote_cuda_dmabuf_export(dev_, base + n - 10, 100, &bad), OTE_ERR_INVALID);
    EXPECT_EQ(bad.fd, -7);
    ASSERT_EQ(ote_cuda_alloc_destroy(a, LongDeadline()), OTE_OK);
}

TEST_F(CudaMemoryTest, DriverFailuresAreStatusesAndAFailedFreeIsRetained) {
    REQUIRE_FAKE();
    ote_cuda_alloc_t *a = reinterpret_cast<ote_cuda_alloc_t *>(0x1);
    fake_.fail("cuMemAlloc", 1, 1, OTE_CU_ERROR_OUT_OF_MEMORY);
    ote_status_t st = ote_cuda_alloc_create(dev_, 4096, 0, &a);
    EXPECT_EQ(ote_status_code(st), OTE_ERR_NATIVE);
    EXPECT_EQ(ote_status_errno(st), OTE_CU_ERROR_OUT_OF_MEMORY);
    EXPECT_EQ(a, reinterpret_cast<ote_cuda_alloc_t *>(0x1));
    EXPECT_TRUE(LogContains("cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY (2)"));
    EXPECT_EQ(ote_cuda_device_owners(dev_), 0u);

    ASSERT_EQ(ote_cuda_alloc_create(dev_, 4096, 0, &a), OTE_OK);
    fake_.fail("cuMemFree", 1, 1, OTE_CU_ERROR_UNKNOWN);
    EXPECT_EQ(ote_status_code(ote_cuda_alloc_destroy(a, LongDeadline())), OTE_ERR_RETAINED);
    EXPECT_EQ(ote_cuda_device_retained(dev_), 1u);
    EXPECT_EQ(ote_cuda_driver_retained(drv_), 1u);
    EXPECT_EQ(Counters().device_allocs, at_start_.device_allocs + 1); // still allocated
    EXPECT_EQ(ote_cuda_device_close(dev_), OTE_ERR_BUSY);
    size_t left = 9;
    ASSERT_EQ(ote_cuda_device_reclaim(dev_, &left), OTE_OK);
    EXPECT_EQ(left, 0u);
    EXPECT_EQ(ote_cuda_driver_retained(drv_), 0u);
    EXPECT_EQ(Counters().device_allocs, at_start_.device_allocs);

    // A failed primary context release retains the device; closing again releases it.
    ote_cuda_device_t *d2 = nullptr;
    ASSERT_EQ(ote_cuda_device_open(drv_, 0, &d2), OTE_OK);
    fake_.fail("cuDevicePrimaryCtxRelease", 1, 1, OTE_CU_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(ote_status_code(ote_cuda_device_close(d2)), OTE_ERR_RETAINED);
    EXPECT_EQ(ote_cuda_driver_retained(drv_), 1u);
    EXPECT_EQ(ote_cuda_device_close(d2), OTE_OK);
    EXPECT_EQ(ote_cuda_driver_retained(drv_), 0u);
}

} // namespace

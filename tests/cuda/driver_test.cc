// cuda/ on CPU: the dlopen path against a fake driver library, and a fake table.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "tests/util/test_base.h"

extern "C" {
#include "base/alloc.h"
#include "cuda/driver.h"
}

namespace {

using ote_test::OteTest;

std::string FakeLibPath() {
    const char *srcdir = std::getenv("TEST_SRCDIR");
    const char *ws = std::getenv("TEST_WORKSPACE");
    if (srcdir == nullptr || ws == nullptr) return "tests/cuda/libfake_cuda.so";
    return std::string(srcdir) + "/" + ws + "/tests/cuda/libfake_cuda.so";
}

class CudaDriverTest : public OteTest {};

TEST_F(CudaDriverTest, MissingLibraryIsNoDevice) {
    ote_cuda_driver_t *drv = reinterpret_cast<ote_cuda_driver_t *>(0x1);
    EXPECT_EQ(ote_cuda_driver_load("/nonexistent/libcuda.so.1", &drv), OTE_ERR_NO_DEVICE);
    EXPECT_EQ(drv, reinterpret_cast<ote_cuda_driver_t *>(0x1));  // untouched on failure
}

TEST_F(CudaDriverTest, LibraryWithoutEntryPointsIsUnsupported) {
    // libc is a loadable library that lacks every cu* symbol.
    ote_cuda_driver_t *drv = nullptr;
    EXPECT_EQ(ote_cuda_driver_load("libc.so.6", &drv), OTE_ERR_UNSUPPORTED);
    EXPECT_EQ(drv, nullptr);
    EXPECT_TRUE(LogContains("lacks cuInit"));
}

TEST_F(CudaDriverTest, LoadsFakeDriverAndUsesIt) {
    ote_cuda_driver_t *drv = nullptr;
    ASSERT_EQ(ote_cuda_driver_load(FakeLibPath().c_str(), &drv), OTE_OK);
    int n = 0;
    ASSERT_EQ(ote_cuda_device_count(drv, &n), OTE_OK);
    EXPECT_EQ(n, 1);
    const ote_cuda_driver_table_t *t = ote_cuda_driver_table(drv);
    ote_cu_deviceptr_t d = 0;
    ASSERT_EQ(t->cuMemAlloc(&d, 4096), OTE_CU_SUCCESS);
    char host[16] = "orbitte";
    char back[16] = {};
    ASSERT_EQ(t->cuMemcpyHtoD(d, host, sizeof(host)), OTE_CU_SUCCESS);
    ASSERT_EQ(t->cuMemcpyDtoH(back, d, sizeof(back)), OTE_CU_SUCCESS);
    EXPECT_STREQ(back, "orbitte");
    int is_dev = -1;
    ASSERT_EQ(ote_cuda_pointer_is_device(drv, reinterpret_cast<void *>(d + 100), &is_dev), OTE_OK);
    EXPECT_EQ(is_dev, 1);
    ASSERT_EQ(ote_cuda_pointer_is_device(drv, host, &is_dev), OTE_OK);
    EXPECT_EQ(is_dev, 0);
    EXPECT_EQ(t->cuMemFree(d), OTE_CU_SUCCESS);
    ote_cuda_driver_unload(drv);
}

TEST_F(CudaDriverTest, InitFailureIsReported) {
    setenv("FAKE_CUDA_INIT_FAIL", "1", 1);
    ote_cuda_driver_t *drv = nullptr;
    EXPECT_EQ(ote_cuda_driver_load(FakeLibPath().c_str(), &drv), OTE_ERR_NO_DEVICE);
    unsetenv("FAKE_CUDA_INIT_FAIL");
    EXPECT_EQ(drv, nullptr);
}

// A fake table built in the test: validation and result mapping.
extern "C" int FakeInit(unsigned int) { return 0; }

TEST_F(CudaDriverTest, TableMustBeComplete) {
    ote_cuda_driver_table_t t = {};
    t.cuInit = FakeInit;
    ote_cuda_driver_t *drv = nullptr;
    EXPECT_EQ(ote_cuda_driver_from_table(&t, &drv), OTE_ERR_INVALID);
    EXPECT_EQ(drv, nullptr);
    EXPECT_EQ(ote_cuda_driver_from_table(nullptr, &drv), OTE_ERR_INVALID);
}

TEST_F(CudaDriverTest, ResultMapping) {
    EXPECT_EQ(ote_cuda_status(OTE_CU_SUCCESS), OTE_OK);
    EXPECT_EQ(ote_cuda_status(OTE_CU_ERROR_NOT_READY), OTE_ERR_AGAIN);
    EXPECT_EQ(ote_cuda_status(OTE_CU_ERROR_NO_DEVICE), OTE_ERR_NO_DEVICE);
    ote_status_t st = ote_cuda_status(2);
    EXPECT_EQ(ote_status_code(st), OTE_ERR_NATIVE);
    EXPECT_EQ(ote_status_errno(st), 2);
}

TEST_F(CudaDriverTest, AllocationFailureLeavesNothing) {
    for (uint64_t n = 1; n <= 2; n++) {
        ote_alloc_fail_nth(n);
        ote_cuda_driver_t *drv = nullptr;
        ote_status_t st = ote_cuda_driver_load(FakeLibPath().c_str(), &drv);
        ote_alloc_fail_disarm();
        if (st == OTE_OK) {
            ote_cuda_driver_unload(drv);
            break;
        }
        EXPECT_EQ(st, OTE_ERR_NOMEM);
        EXPECT_EQ(drv, nullptr);
    }
}

}  // namespace

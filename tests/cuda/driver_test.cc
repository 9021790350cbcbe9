// cuda/driver: loading through the production dlopen path (the fake libcuda, or the real
// one with OTE_TEST_REAL_CUDA=1), entry point resolution, result mapping and naming.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "tests/cuda/cuda_test_util.h"
#include "tests/util/test_base.h"

extern "C" {
#include "base/alloc.h"
#include "cuda/driver.h"
}

namespace {

using ote_cuda_test::CudaTest;
using ote_cuda_test::FakeControl;
using ote_test::OteTest;

class CudaDriverTest : public OteTest {};

TEST_F(CudaDriverTest, MissingLibraryIsNoDevice) {
    ote_cuda_driver_t *drv = reinterpret_cast<ote_cuda_driver_t *>(0x1);
    EXPECT_EQ(ote_status_code(ote_cuda_driver_load("/nonexistent/libcuda.so.1", &drv)),
              OTE_ERR_NO_DEVICE);
    EXPECT_EQ(drv, reinterpret_cast<ote_cuda_driver_t *>(0x1)); // untouched on failure
}

TEST_F(CudaDriverTest, EnvironmentNamesTheLibrary) {
    const char *old = std::getenv("OTE_CUDA_LIBRARY");
    std::string saved = old != nullptr ? old : "";
    setenv("OTE_CUDA_LIBRARY", "/nonexistent/libcuda-from-env.so", 1);
    ote_cuda_driver_t *drv = nullptr;
    EXPECT_EQ(ote_status_code(ote_cuda_driver_load(nullptr, &drv)), OTE_ERR_NO_DEVICE);
    EXPECT_EQ(drv, nullptr);
    EXPECT_TRUE(LogContains("libcuda-from-env.so") || ote_log_level() < OTE_LOG_INFO);
    if (old != nullptr) setenv("OTE_CUDA_LIBRARY", saved.c_str(), 1);
    else unsetenv("OTE_CUDA_LIBRARY");
}

TEST_F(CudaDriverTest, LibraryWithoutEntryPointsIsUnsupported) {
    // libc is a loadable library that lacks every cu* symbol (and cuGetProcAddress_v2).
    ote_cuda_driver_t *drv = nullptr;
    EXPECT_EQ(ote_cuda_driver_load("libc.so.6", &drv), OTE_ERR_UNSUPPORTED);
    EXPECT_EQ(drv, nullptr);
    EXPECT_TRUE(LogContains("lacks cuInit"));
}

TEST_F(CudaDriverTest, ResultMappingKeepsTheCUresult) {
    EXPECT_EQ(ote_cuda_status(OTE_CU_SUCCESS), OTE_OK);
    EXPECT_EQ(ote_status_code(ote_cuda_status(OTE_CU_ERROR_NOT_READY)), OTE_ERR_AGAIN);
    EXPECT_EQ(ote_status_code(ote_cuda_status(OTE_CU_ERROR_NO_DEVICE)), OTE_ERR_NO_DEVICE);
    EXPECT_EQ(ote_status_code(ote_cuda_status(OTE_CU_ERROR_ILLEGAL_ADDRESS)), OTE_ERR_DEVICE_FATAL);
    ote_status_t st = ote_cuda_status(OTE_CU_ERROR_OUT_OF_MEMORY);
    EXPECT_EQ(ote_status_code(st), OTE_ERR_NATIVE);
    EXPECT_EQ(ote_status_errno(st), OTE_CU_ERROR_OUT_OF_MEMORY);
    EXPECT_EQ(ote_status_errno(ote_cuda_status(OTE_CU_ERROR_UNKNOWN)), OTE_CU_ERROR_UNKNOWN);
}

extern "C" int FakeInit(unsigned int) { return 0; }

TEST_F(CudaDriverTest, TableMustBeComplete) {
    ote_cuda_driver_table_t t = {};
    t.cuInit = FakeInit;
    ote_cuda_driver_t *drv = nullptr;
    EXPECT_EQ(ote_cuda_driver_from_table(&t, &drv), OTE_ERR_INVALID);
    EXPECT_EQ(drv, nullptr);
    EXPECT_TRUE(LogContains("lacks cuDriverGetVersion"));
    EXPECT_EQ(ote_cuda_driver_from_table(nullptr, &drv), OTE_ERR_INVALID);
}

class CudaDriverLoadTest : public CudaTest {};

TEST_F(CudaDriverLoadTest, ResolvesEveryEntryPointAndNamesResults) {
    const ote_cuda_driver_table_t *t = ote_cuda_driver_table(drv_);
    const void *const *slots = reinterpret_cast<const void *const *>(t);
    for (size_t i = 0; i < sizeof(*t) / sizeof(void *); i++)
        EXPECT_NE(slots[i], nullptr) << "entry " << i;
    // Both the fake and CUDA >= 12 drivers have cuGetProcAddress_v2, which the loader
    // prefers over dlsym.
    EXPECT_EQ(ote_cuda_driver_used_proc_address(drv_), 1);
    int version = 0;
    ASSERT_EQ(t->cuDriverGetVersion(&version), OTE_CU_SUCCESS);
    EXPECT_GE(version, 12000);
    EXPECT_STREQ(ote_cuda_result_name(drv_, OTE_CU_ERROR_OUT_OF_MEMORY),
                 "CUDA_ERROR_OUT_OF_MEMORY");
    EXPECT_STREQ(ote_cuda_result_name(drv_, OTE_CU_ERROR_NOT_READY), "CUDA_ERROR_NOT_READY");
    // A failed call is logged with the driver's name of the result.
    EXPECT_EQ(ote_status_code(ote_cuda_check(drv_, OTE_CU_ERROR_INVALID_VALUE, "cuSomething")),
              OTE_ERR_NATIVE);
    EXPECT_TRUE(LogContains("cuSomething: CUDA_ERROR_INVALID_VALUE (1)"));
    EXPECT_STRNE(ote_cuda_device_name(dev_), "");
}

TEST_F(CudaDriverLoadTest, InitFailureIsReported) {
    REQUIRE_FAKE();
    fake_.fail("cuInit", 1, 1, OTE_CU_ERROR_NO_DEVICE);
    ote_cuda_driver_t *drv = nullptr;
    EXPECT_EQ(ote_status_code(ote_cuda_driver_load(nullptr, &drv)), OTE_ERR_NO_DEVICE);
    EXPECT_EQ(drv, nullptr);
    EXPECT_TRUE(LogContains("cuInit: CUDA_ERROR_NO_DEVICE"));
}

TEST_F(CudaDriverLoadTest, ProcAddressFailureIsReported) {
    REQUIRE_FAKE();
    fake_.fail("cuGetProcAddress", 3, 1, OTE_CU_ERROR_NOT_FOUND);
    ote_cuda_driver_t *drv = nullptr;
    EXPECT_NE(ote_cuda_driver_load(nullptr, &drv), OTE_OK);
    EXPECT_EQ(drv, nullptr);
}

TEST_F(CudaDriverLoadTest, UnloadRefusedWhileOwnersAreRetained) {
    ote_cuda_driver_t *drv = nullptr;
    ASSERT_EQ(ote_cuda_driver_load(nullptr, &drv), OTE_OK);
    ote__cuda_retained_note(drv, 1);
    EXPECT_EQ(ote_cuda_driver_retained(drv), 1u);
    EXPECT_EQ(ote_cuda_driver_unload(drv), OTE_ERR_BUSY);
    ote__cuda_retained_note(drv, -1);
    EXPECT_EQ(ote_cuda_driver_unload(drv), OTE_OK);
}

TEST_F(CudaDriverLoadTest, AllocationFailureLeavesNothing) {
    bool loaded = false;
    for (uint64_t n = 1; n <= 8 && !loaded; n++) {
        ote_alloc_fail_nth(n);
        ote_cuda_driver_t *drv = nullptr;
        ote_status_t st = ote_cuda_driver_load(nullptr, &drv);
        ote_alloc_fail_disarm();
        if (st == OTE_OK) {
            loaded = true;
            EXPECT_EQ(ote_cuda_driver_unload(drv), OTE_OK);
        } else {
            EXPECT_EQ(st, OTE_ERR_NOMEM);
            EXPECT_EQ(drv, nullptr);
        }
    }
    EXPECT_TRUE(loaded);
}

} // namespace

// cuda/cufile.h: loading libcufile through dlopen ($OTE_CUFILE_LIBRARY) and the mapping
// of cuFile results to statuses. The fake libcufile (fake_cufile.c) needs the fake
// libcuda loaded in the process, which CudaTest does.
#include <gtest/gtest.h>

#include <dlfcn.h>

#include <cerrno>
#include <cstdlib>
#include <string>

#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/fake_cufile_control.h"

extern "C" {
#include "base/log.h"
#include "cuda/cufile.h"
}

namespace {

std::string Runfile(const char *rel) {
    const char *srcdir = std::getenv("TEST_SRCDIR");
    const char *ws = std::getenv("TEST_WORKSPACE");
    if (srcdir == nullptr || ws == nullptr) return rel;
    return std::string(srcdir) + "/" + ws + "/" + rel;
}

// INFO lines captured (the level is restored after each case).
class CufileTest : public ote_cuda_test::CudaTest {
  protected:
    void SetUp() override {
        CudaTest::SetUp();
        level_ = ote_log_level();
        ote_log_set_level(OTE_LOG_INFO);
    }
    void TearDown() override {
        ote_log_set_level(level_);
        CudaTest::TearDown();
    }
    ote_log_level_t level_ = OTE_LOG_WARN;
};

// A missing library is OTE_ERR_NO_DEVICE with an INFO line (the caller stages instead).
TEST_F(CufileTest, MissingLibraryIsNoDevice) {
    ote_cufile_t *cf = nullptr;
    ote_status_t st = ote_cufile_load("/nonexistent/libcufile.so.0", &cf);
    EXPECT_EQ(ote_status_code(st), OTE_ERR_NO_DEVICE);
    EXPECT_EQ(cf, nullptr);
    EXPECT_TRUE(LogContains("no GPUDirect Storage"));
}

// A library without the cuFile entry points (the fake libcuda) is OTE_ERR_UNSUPPORTED
// naming the first one missing.
TEST_F(CufileTest, LibraryWithoutEntryPointsIsUnsupported) {
    ote_cufile_t *cf = nullptr;
    EXPECT_EQ(ote_cufile_load(ote_cuda_test::FakeLibraryPath().c_str(), &cf), OTE_ERR_UNSUPPORTED);
    EXPECT_EQ(cf, nullptr);
    EXPECT_TRUE(LogContains("lacks cuFileDriverOpen"));
}

// $OTE_CUFILE_LIBRARY is the path used when none is given; the driver opens once per
// load and closes with unload.
TEST_F(CufileTest, LoadsFromEnvironmentAndBalancesDriverOpens) {
    REQUIRE_FAKE();
    setenv("OTE_CUFILE_LIBRARY", Runfile("tests/cuda/libfake_cufile.so").c_str(), 1);
    ote_cufile_t *cf = nullptr;
    ASSERT_EQ(ote_cufile_load(nullptr, &cf), OTE_OK);
    auto counters = reinterpret_cast<fake_cufile_counters_fn>(
        dlsym(ote_cufile_dl_handle(cf), "fake_cufile_counters"));
    ASSERT_NE(counters, nullptr);
    fake_cufile_counters_t c{};
    counters(&c);
    EXPECT_EQ(c.driver_opens, 1);
    const ote_cufile_table_t *t = ote_cufile_table(cf);
    ASSERT_NE(t, nullptr);
    EXPECT_NE(t->cuFileRead, nullptr);
    EXPECT_NE(t->cuFileDriverClose, nullptr);
    ote_cufile_unload(cf);
    counters(&c);
    EXPECT_EQ(c.driver_opens, 0);
    unsetenv("OTE_CUFILE_LIBRARY");
}

// cuFileDriverOpen failing: OTE_ERR_NO_DEVICE carrying the CUfileOpError, INFO line.
TEST_F(CufileTest, DriverOpenFailureIsNoDevice) {
    REQUIRE_FAKE();
    std::string path = Runfile("tests/cuda/libfake_cufile.so");
    void *dl = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    ASSERT_NE(dl, nullptr) << dlerror();
    auto fail = reinterpret_cast<fake_cufile_fail_fn>(dlsym(dl, "fake_cufile_fail"));
    ASSERT_NE(fail, nullptr);
    ASSERT_EQ(fail("cuFileDriverOpen", 5001, 1), 0);
    ote_cufile_t *cf = nullptr;
    ote_status_t st = ote_cufile_load(path.c_str(), &cf);
    EXPECT_EQ(ote_status_code(st), OTE_ERR_NO_DEVICE);
    EXPECT_EQ(ote_status_errno(st), 5001);
    EXPECT_TRUE(LogContains("cuFileDriverOpen"));
    dlclose(dl);
}

// Results of cuFileRead / cuFileWrite: -1 with errno, a negative CUfileOpError, a short
// count, the full count.
TEST_F(CufileTest, IoResultsMapToStatuses) {
    EXPECT_EQ(ote_cufile_io_status(4096, 0, 4096, "cuFileRead"), OTE_OK);
    ote_status_t st = ote_cufile_io_status(-1, EIO, 4096, "cuFileRead");
    EXPECT_EQ(ote_status_code(st), OTE_ERR_IO);
    EXPECT_EQ(ote_status_errno(st), EIO);
    st = ote_cufile_io_status(-5011, 0, 4096, "cuFileWrite");
    EXPECT_EQ(ote_status_code(st), OTE_ERR_NATIVE);
    EXPECT_EQ(ote_status_errno(st), 5011);
    st = ote_cufile_io_status(100, 0, 4096, "cuFileRead");
    EXPECT_EQ(ote_status_code(st), OTE_ERR_IO);
    EXPECT_EQ(ote_status_errno(st), ENODATA);
    EXPECT_EQ(ote_cufile_check({0, 0}, "x"), OTE_OK);
    EXPECT_EQ(ote_status_code(ote_cufile_check({5022, 0}, "x")), OTE_ERR_NATIVE);
}

} // namespace

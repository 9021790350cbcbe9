#include "tests/cuda/cuda_test_util.h"

#include <dlfcn.h>

#include <cstdlib>
#include <sstream>

namespace ote_cuda_test {

std::string FakeLibraryPath() {
    const char *srcdir = std::getenv("TEST_SRCDIR");
    const char *ws = std::getenv("TEST_WORKSPACE");
    if (srcdir == nullptr || ws == nullptr) return "tests/cuda/libfake_cuda.so";
    return std::string(srcdir) + "/" + ws + "/tests/cuda/libfake_cuda.so";
}

bool UseRealCuda() {
    const char *v = std::getenv("OTE_TEST_REAL_CUDA");
    return v != nullptr && std::string(v) == "1";
}

void SelectDriverLibrary() {
    if (UseRealCuda()) return; // the production default, or what the caller set
    setenv("OTE_CUDA_LIBRARY", FakeLibraryPath().c_str(), 1);
}

FakeControl LookupFake(ote_cuda_driver_t *drv) {
    FakeControl f;
    void *dl = ote_cuda_driver_dl_handle(drv);
    if (dl == nullptr) return f;
    f.is_fake = reinterpret_cast<fake_cuda_is_fake_fn>(dlsym(dl, "fake_cuda_is_fake"));
    if (f.is_fake == nullptr) return f;
    f.fail = reinterpret_cast<fake_cuda_fail_fn>(dlsym(dl, "fake_cuda_fail"));
    f.clear_faults =
        reinterpret_cast<fake_cuda_clear_faults_fn>(dlsym(dl, "fake_cuda_clear_faults"));
    f.set_max_delay_us =
        reinterpret_cast<fake_cuda_set_max_delay_us_fn>(dlsym(dl, "fake_cuda_set_max_delay_us"));
    f.counters = reinterpret_cast<fake_cuda_counters_fn>(dlsym(dl, "fake_cuda_counters"));
    f.calls = reinterpret_cast<fake_cuda_calls_fn>(dlsym(dl, "fake_cuda_calls"));
    f.hold_copies = reinterpret_cast<fake_cuda_hold_copies_fn>(dlsym(dl, "fake_cuda_hold_copies"));
    f.release_copies =
        reinterpret_cast<fake_cuda_release_copies_fn>(dlsym(dl, "fake_cuda_release_copies"));
    if (f.fail == nullptr || f.clear_faults == nullptr || f.set_max_delay_us == nullptr ||
        f.counters == nullptr || f.calls == nullptr || f.hold_copies == nullptr ||
        f.release_copies == nullptr)
        f.is_fake = nullptr; // an incomplete control API is no control API
    return f;
}

bool LiveCounts::operator==(const LiveCounts &o) const {
    return device_allocs == o.device_allocs && host_allocs == o.host_allocs &&
           host_registrations == o.host_registrations && streams == o.streams &&
           events == o.events && pending_ops == o.pending_ops && ipc_imports == o.ipc_imports &&
           ipc_import_refs == o.ipc_import_refs && primary_ctx_retains == o.primary_ctx_retains &&
           vmm_handles == o.vmm_handles && vmm_reservations == o.vmm_reservations &&
           vmm_mappings == o.vmm_mappings;
}

LiveCounts Live(const fake_cuda_counters_t &c) {
    return LiveCounts{c.device_allocs, c.host_allocs,      c.host_registrations,
                      c.streams,       c.events,           c.pending_ops,
                      c.ipc_imports,   c.ipc_import_refs,  c.primary_ctx_retains,
                      c.vmm_handles,   c.vmm_reservations, c.vmm_mappings};
}

std::string Describe(const LiveCounts &c) {
    std::ostringstream os;
    os << "device_allocs=" << c.device_allocs << " host_allocs=" << c.host_allocs
       << " host_registrations=" << c.host_registrations << " streams=" << c.streams
       << " events=" << c.events << " pending_ops=" << c.pending_ops
       << " ipc_imports=" << c.ipc_imports << " ipc_import_refs=" << c.ipc_import_refs
       << " primary_ctx_retains=" << c.primary_ctx_retains << " vmm_handles=" << c.vmm_handles
       << " vmm_reservations=" << c.vmm_reservations << " vmm_mappings=" << c.vmm_mappings;
    return os.str();
}

void CudaTest::SetUp() {
    OteTest::SetUp();
    SelectDriverLibrary();
    ote_status_t st = ote_cuda_driver_load(nullptr, &drv_);
    if (st != OTE_OK) {
        if (UseRealCuda()) GTEST_SKIP() << "no CUDA driver/GPU here: " << ote_status_str(st);
        FAIL() << "the fake libcuda did not load from " << FakeLibraryPath() << ": "
               << ote_status_str(st);
    }
    t_ = ote_cuda_driver_table(drv_);
    fake_ = LookupFake(drv_);
    if (fake_.present()) {
        fake_.clear_faults();
        fake_.release_copies();
        at_start_ = Live(Counters());
    }
    int n = 0;
    ASSERT_EQ(ote_cuda_device_count(drv_, &n), OTE_OK);
    if (n < 1) GTEST_SKIP() << "the driver reports no device";
    ASSERT_EQ(ote_cuda_device_open(drv_, 0, &dev_), OTE_OK);
}

fake_cuda_counters_t CudaTest::Counters() {
    fake_cuda_counters_t c{};
    if (fake_.present()) fake_.counters(&c);
    return c;
}

void CudaTest::SettleFake() {
    if (!fake_.present()) return;
    ote_test::WaitUntil([&] { return Counters().pending_ops == at_start_.pending_ops; }, kLongWait,
                        "the fake's queued stream work back to its start count");
}

LiveCounts CudaTest::WaitCounts(const LiveCounts &want) {
    LiveCounts now{};
    // Silent: the caller compares the last snapshot and describes both.
    ote_test::PollUntil(
        [&] {
            now = Live(Counters());
            return now == want;
        },
        kLongWait);
    return now;
}

void CudaTest::TearDown() {
    if (fake_.present()) {
        fake_.clear_faults();
        fake_.release_copies(); // a case that stopped while holding copies
    }
    if (dev_ != nullptr) {
        size_t left = 0;
        EXPECT_EQ(ote_cuda_device_reclaim(dev_, &left), OTE_OK) << left << " owners still retained";
        EXPECT_EQ(ote_cuda_device_close(dev_), OTE_OK);
        dev_ = nullptr;
    }
    if (drv_ != nullptr) {
        EXPECT_EQ(ote_cuda_driver_retained(drv_), 0u);
        if (fake_.present() && check_counts_) {
            LiveCounts now = WaitCounts(at_start_);
            EXPECT_TRUE(now == at_start_)
                << "fake driver objects leaked: at start {" << Describe(at_start_) << "}, now {"
                << Describe(now) << "}";
        }
        EXPECT_EQ(ote_cuda_driver_unload(drv_), OTE_OK);
        drv_ = nullptr;
    }
    OteTest::TearDown();
}

} // namespace ote_cuda_test

// tests/cuda/cuda_test_util.h - what the cuda/ owner tests share.
//
// Every test loads the driver through the production path (ote_cuda_driver_load() with
// $OTE_CUDA_LIBRARY): the fake libcuda from the test's runfiles by default, the real
// libcuda.so.1 when OTE_TEST_REAL_CUDA=1 (or, then, the library $OTE_CUDA_LIBRARY names
// when it was set outside the test). A missing real driver skips the test.
//
// The fake's control API (tests/cuda/fake_cuda_control.h) is looked up with dlsym on the
// driver's own handle; its presence is how a test knows it runs on the fake. Fake-only
// cases (fault points, counters) call REQUIRE_FAKE() and skip with the reason elsewhere.
// CudaTest's TearDown checks that the fake's counters of live objects are back to what
// they were at SetUp (nothing leaked on the device) and that nothing stayed retained.
#ifndef OTE_TESTS_CUDA_CUDA_TEST_UTIL_H
#define OTE_TESTS_CUDA_CUDA_TEST_UTIL_H

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "tests/cuda/fake_cuda_control.h"
#include "tests/util/test_base.h"
#include "tests/util/wait.h"

extern "C" {
#include "base/time.h"
#include "cuda/driver.h"
#include "cuda/memory/device.h"
}

namespace ote_cuda_test {

// The runfiles path of the fake libcuda.
std::string FakeLibraryPath();
// True when OTE_TEST_REAL_CUDA=1.
bool UseRealCuda();
// Points $OTE_CUDA_LIBRARY at the driver the tests use (the fake unless real), once.
void SelectDriverLibrary();

// The fake's control API, all NULL on a real driver.
struct FakeControl {
    fake_cuda_is_fake_fn is_fake = nullptr;
    fake_cuda_fail_fn fail = nullptr;
    fake_cuda_clear_faults_fn clear_faults = nullptr;
    fake_cuda_set_max_delay_us_fn set_max_delay_us = nullptr;
    fake_cuda_counters_fn counters = nullptr;
    fake_cuda_calls_fn calls = nullptr;
    fake_cuda_hold_copies_fn hold_copies = nullptr;
    fake_cuda_release_copies_fn release_copies = nullptr;
    bool present() const { return is_fake != nullptr && is_fake() == 1; }
};
FakeControl LookupFake(ote_cuda_driver_t *drv);

// A generous deadline for waits that must succeed (loaded 2-core machines), as a deadline
// for the owners' calls and as a timeout for ote_test::WaitUntil.
constexpr std::chrono::seconds kLongWait{30};
inline ote_deadline_t LongDeadline() {
    return ote_deadline_after(static_cast<uint64_t>(kLongWait.count()) * OTE_NSEC_PER_SEC);
}

// Live-object counters of the fake that must return to their start values.
struct LiveCounts {
    uint64_t device_allocs, host_allocs, host_registrations, streams, events, pending_ops,
        ipc_imports, ipc_import_refs, primary_ctx_retains, vmm_handles, vmm_reservations,
        vmm_mappings;
    bool operator==(const LiveCounts &o) const;
};
LiveCounts Live(const fake_cuda_counters_t &c);
std::string Describe(const LiveCounts &c);

// Loads the driver and opens device 0 (skips the test when there is no driver).
class CudaTest : public ote_test::OteTest {
  protected:
    void SetUp() override;
    void TearDown() override;

    // Current live counters (fake only; zeros on a real driver).
    fake_cuda_counters_t Counters();
    // Waits (generously) until the fake's queued stream work is back to its start count.
    void SettleFake();
    // Waits (generously) until the fake's live counters equal want; returns the last
    // snapshot (a stream destroyed with pending work counts until its worker ends).
    LiveCounts WaitCounts(const LiveCounts &want);

    ote_cuda_driver_t *drv_ = nullptr;
    ote_cuda_device_t *dev_ = nullptr;
    const ote_cuda_driver_table_t *t_ = nullptr;
    FakeControl fake_;
    LiveCounts at_start_{};
    bool check_counts_ = true;
};

} // namespace ote_cuda_test

#define REQUIRE_FAKE() \
    do { \
        if (!fake_.present()) \
            GTEST_SKIP() << "needs the fake libcuda's control API (fault points/counters); " \
                            "the driver in use is a real one"; \
    } while (0)

#endif

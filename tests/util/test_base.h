// tests/util/test_base.h - base fixture for OrbitTE tests.
//
// OteTest fails a test that, by its end:
//  - leaked file descriptors (SkipFdCheck() for a test that keeps one on purpose);
//  - emitted an ERROR log line outside a scope that announced it: wrap exactly the
//    statements that log errors in an ErrorLogsExpected guard or ExpectErrorLogsIn();
//  - holds more retained native owners (base/retained.h: PD, MR, MW, CQ, channel, QP,
//    other) than when it started, beyond what it declared with ExpectRetained(n).
// It disarms fault points and allocation failures after every test. Log lines are
// captured (Logs()) instead of cluttering the test output.
//
//     {
//         ote_test::ErrorLogsExpected guard;   // ERROR lines allowed in this block only
//         EXPECT_EQ(ote_thing_that_fails(), OTE_ERR_NATIVE);
//         EXPECT_GE(guard.Seen(), 1u);          // and the failure really logged one
//     }
//     ExpectErrorLogsIn([&] { EXPECT_NE(ote_other_failure(), OTE_OK); });  // must log >= 1
//
// The guard counts ERROR lines from every thread while it lives, so an asynchronous
// error (a worker's) must be waited for inside the scope.
#ifndef OTE_TESTS_UTIL_TEST_BASE_H
#define OTE_TESTS_UTIL_TEST_BASE_H

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

extern "C" {
#include "base/log.h"
}

namespace ote_test {

// True in a ThreadSanitizer build (gcc and clang define __SANITIZE_THREAD__ with
// -fsanitize=thread). Under TSan every memory access is instrumented: byte checks and
// copies of tens of MiB run 5-15x slower than in the other configurations.
#if defined(__SANITIZE_THREAD__)
constexpr bool kUnderTsan = true;
#else
constexpr bool kUnderTsan = false;
#endif

// The size of a large data case: len in the default and ASan configurations, len / div
// under TSan. The big sizes (a pipeline's many chunks, byte checks over 64-256 MiB) run in
// the default and ASan builds; TSan runs the same case over the same paths (still several
// chunks, pipelined) for its concurrency checks, at a fraction of the bytes.
constexpr uint64_t TsanScaled(uint64_t len, uint64_t div) { return kUnderTsan ? len / div : len; }

// Number of open file descriptors of this process.
int CountOpenFds();

class ErrorLogsExpected;

class OteTest : public ::testing::Test {
  protected:
    void SetUp() override;
    void TearDown() override;

    // DEPRECATED: allows ERROR log lines anywhere in the rest of the test. Kept compiling
    // for the packages not yet converted (tests/verbs, tests/cuda, tests/engine); new code
    // uses ErrorLogsExpected / ExpectErrorLogsIn, which scope the allowance.
    void ExpectErrorLogs() { allow_errors_ = true; }
    // Runs fn with ERROR log lines allowed and expects it to have logged at least one.
    // Returns how many it logged.
    uint64_t ExpectErrorLogsIn(const std::function<void()> &fn);
    // This test may end with up to n more retained native owners than it started with
    // (base/retained.h); the default is 0.
    void ExpectRetained(uint64_t n) { retained_allowed_ = n; }
    // Retained native owners of the process now, minus those when the test started.
    int64_t RetainedSinceStart() const;
    // Skip the fd leak check (a test that deliberately keeps a listener open, say).
    void SkipFdCheck() { check_fds_ = false; }
    std::vector<std::string> Logs();
    bool LogContains(const std::string &needle);

  private:
    friend class ErrorLogsExpected;
    static void Sink(void *arg, ote_log_level_t level, const char *component, const char *engine,
                     const char *msg);
    std::mutex mu_;
    std::vector<std::string> lines_;
    int errors_ = 0;                         // unexpected ERROR lines
    std::atomic<int> expect_depth_{0};       // live ErrorLogsExpected scopes
    std::atomic<uint64_t> expected_seen_{0}; // ERROR lines seen inside such scopes
    int fds_at_start_ = 0;
    uint64_t retained_at_start_ = 0;
    uint64_t retained_allowed_ = 0;
    bool allow_errors_ = false;
    bool check_fds_ = true;
};

// While alive, ERROR log lines (from any thread) do not fail the running OteTest.
// Must be created inside a test body (between SetUp and TearDown).
class ErrorLogsExpected {
  public:
    ErrorLogsExpected();
    ~ErrorLogsExpected();
    ErrorLogsExpected(const ErrorLogsExpected &) = delete;
    ErrorLogsExpected &operator=(const ErrorLogsExpected &) = delete;
    // ERROR lines logged since this guard was created.
    uint64_t Seen() const;

  private:
    OteTest *test_;
    uint64_t seen_at_start_;
};

} // namespace ote_test

#endif

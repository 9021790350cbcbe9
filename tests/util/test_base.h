// tests/util/test_base.h - base fixture for OrbitTE tests.
//
// OteTest fails a test that leaks file descriptors or emits an ERROR log line it did not
// announce with ExpectErrorLogs(); it disarms fault points and allocation failures after
// every test. Log lines are captured (Logs()) instead of cluttering the test output.
#ifndef OTE_TESTS_UTIL_TEST_BASE_H
#define OTE_TESTS_UTIL_TEST_BASE_H

#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

extern "C" {
#include "base/log.h"
}

namespace ote_test {

// Number of open file descriptors of this process.
int CountOpenFds();

class OteTest : public ::testing::Test {
  protected:
    void SetUp() override;
    void TearDown() override;

    // Allow ERROR log lines in this test (a test of a failure path logs errors).
    void ExpectErrorLogs() { allow_errors_ = true; }
    // Skip the fd leak check (a test that deliberately keeps a listener open, say).
    void SkipFdCheck() { check_fds_ = false; }
    std::vector<std::string> Logs();
    bool LogContains(const std::string &needle);

  private:
    static void Sink(void *arg, ote_log_level_t level, const char *component, const char *msg);
    std::mutex mu_;
    std::vector<std::string> lines_;
    int errors_ = 0;
    int fds_at_start_ = 0;
    bool allow_errors_ = false;
    bool check_fds_ = true;
};

}  // namespace ote_test

#endif

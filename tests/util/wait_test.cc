// WaitUntil / PollUntil (tests/util/wait.h): a predicate that becomes true on another
// thread is seen in time, a predicate already true costs no sleep, a timeout returns false
// after about the limit and (WaitUntil only) reports one non-fatal failure at the caller's
// line naming what was waited for and how long; a fixed pause paces the polls.
#include <gtest/gtest.h>

#include "tests/util/wait.h"

#include <gtest/gtest-spi.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "tests/util/test_base.h"

namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

class WaitTest : public ote_test::OteTest {};

// Runs fn with the failures this thread reports captured instead of failing the test.
std::vector<::testing::TestPartResult> Captured(const std::function<void()> &fn) {
    ::testing::TestPartResultArray failures;
    {
        ::testing::ScopedFakeTestPartResultReporter reporter(
            ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &failures);
        fn();
    }
    std::vector<::testing::TestPartResult> out;
    for (int i = 0; i < failures.size(); i++) out.push_back(failures.GetTestPartResult(i));
    return out;
}

// A predicate that counts its calls in *calls and answers `answer`.
std::function<bool()> Counting(int *calls, bool answer) {
    return [calls, answer] {
        ++*calls;
        return answer;
    };
}

TEST_F(WaitTest, TrueAtOnceCallsThePredicateOnce) {
    int calls = 0;
    std::chrono::nanoseconds waited{-1};
    EXPECT_TRUE(ote_test::PollUntil(Counting(&calls, true), milliseconds(1000), &waited));
    EXPECT_EQ(calls, 1);
    EXPECT_GE(waited.count(), 0);
    EXPECT_LT(waited, milliseconds(100));
    EXPECT_TRUE(ote_test::WaitUntil([] { return true; }, milliseconds(0), "already true"))
        << "a zero timeout still checks once";
}

TEST_F(WaitTest, SeesAConditionSetByAnotherThread) {
    std::atomic<bool> flag{false};
    std::thread setter([&] {
        std::this_thread::sleep_for(milliseconds(30));
        flag.store(true);
    });
    int calls = 0;
    const Clock::time_point t0 = Clock::now();
    EXPECT_TRUE(ote_test::WaitUntil(
        [&] {
            calls++;
            return flag.load();
        },
        std::chrono::seconds(30), "the setter thread's flag"));
    const auto took = Clock::now() - t0;
    setter.join();
    EXPECT_LT(took, std::chrono::seconds(10)) << "returned long after the flag was set";
    // Backoff: polled more than once, far fewer times than a 50 us busy loop would.
    EXPECT_GT(calls, 1);
    EXPECT_LT(calls, 600);
}

TEST_F(WaitTest, PollUntilTimesOutSilently) {
    int calls = 0;
    std::chrono::nanoseconds waited{0};
    const Clock::time_point t0 = Clock::now();
    EXPECT_FALSE(ote_test::PollUntil(Counting(&calls, false), milliseconds(40), &waited));
    EXPECT_GE(Clock::now() - t0, milliseconds(40));
    EXPECT_GE(waited, milliseconds(40));
    EXPECT_GE(calls, 2) << "checked again at the deadline";
}

// The last check happens at the deadline: a condition that turns true during the final
// pause is reported as met, not as a timeout.
TEST_F(WaitTest, ChecksOnceMoreAtTheDeadline) {
    const Clock::time_point until = Clock::now() + milliseconds(20);
    EXPECT_TRUE(ote_test::PollUntil([&] { return Clock::now() >= until; }, milliseconds(20)));
}

TEST_F(WaitTest, WaitUntilTimeoutReportsWhatAndHowLong) {
    bool got = true;
    int line = 0;
    auto failures = Captured([&] {
        line = __LINE__ + 1;
        got = ote_test::WaitUntil([] { return false; }, milliseconds(25), "the moon to turn blue");
    });
    EXPECT_FALSE(got);
    ASSERT_EQ(failures.size(), 1u);
    const ::testing::TestPartResult &r = failures[0];
    EXPECT_TRUE(r.nonfatally_failed());
    const std::string msg = r.message();
    EXPECT_NE(msg.find("waiting for: the moon to turn blue"), std::string::npos) << msg;
    EXPECT_NE(msg.find("limit 25 ms"), std::string::npos) << msg;
    EXPECT_NE(msg.find("timed out after "), std::string::npos) << msg;
    // Reported where the caller waited, not inside the helper.
    EXPECT_EQ(r.line_number(), line) << msg;
    EXPECT_NE(std::string(r.file_name()).find("wait_test.cc"), std::string::npos) << r.file_name();
}

// A fixed pause paces the polls: over 100 ms at 20 ms, about 6 polls (the first at once,
// the last at the deadline), never the hundreds of the backoff's first pauses.
TEST_F(WaitTest, FixedPausePacesThePolls) {
    int calls = 0;
    std::chrono::nanoseconds waited{0};
    EXPECT_FALSE(
        ote_test::PollUntil(Counting(&calls, false), milliseconds(100), milliseconds(20), &waited));
    EXPECT_GE(waited, milliseconds(100));
    EXPECT_GE(calls, 2);
    EXPECT_LE(calls, 7);
    auto failures = Captured([] {
        EXPECT_FALSE(ote_test::WaitUntil([] { return false; }, milliseconds(10), milliseconds(5),
                                         "a paced wait"));
    });
    ASSERT_EQ(failures.size(), 1u);
    EXPECT_NE(std::string(failures[0].message()).find("waiting for: a paced wait"),
              std::string::npos);
}

TEST_F(WaitTest, WaitUntilSuccessReportsNothing) {
    int n = 0;
    auto failures = Captured([&] {
        EXPECT_TRUE(ote_test::WaitUntil([&] { return ++n == 3; }, std::chrono::seconds(30),
                                        "the third call"));
    });
    EXPECT_EQ(failures.size(), 0u);
    EXPECT_EQ(n, 3);
}

} // namespace

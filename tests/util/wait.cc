// tests/util/wait.cc - see wait.h.
#include "tests/util/wait.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

namespace ote_test {

namespace {

constexpr std::chrono::nanoseconds kFirstPause = std::chrono::microseconds(50);
constexpr std::chrono::nanoseconds kMaxPause = std::chrono::milliseconds(2);

// fixed == 0: the backoff; else a fixed pause between polls.
bool Poll(const std::function<bool()> &pred, std::chrono::nanoseconds timeout,
          std::chrono::nanoseconds fixed, std::chrono::nanoseconds *waited_out) {
    using Clock = std::chrono::steady_clock;
    const Clock::time_point start = Clock::now();
    const Clock::time_point deadline = start + timeout;
    std::chrono::nanoseconds pause = fixed.count() > 0 ? fixed : kFirstPause;
    bool ok = false;
    for (;;) {
        if (pred()) {
            ok = true;
            break;
        }
        const Clock::time_point now = Clock::now();
        if (now >= deadline) break; // pred was checked at or after the deadline
        std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(pause, deadline - now));
        if (fixed.count() == 0) pause = std::min(pause * 2, kMaxPause);
    }
    if (waited_out != nullptr) *waited_out = Clock::now() - start;
    return ok;
}

bool Fail(std::chrono::nanoseconds waited, std::chrono::nanoseconds timeout,
          const std::string &what, const char *file, int line) {
    using std::chrono::duration_cast;
    using std::chrono::milliseconds;
    ADD_FAILURE_AT(file, line) << "timed out after " << duration_cast<milliseconds>(waited).count()
                               << " ms (limit " << duration_cast<milliseconds>(timeout).count()
                               << " ms) waiting for: " << what;
    return false;
}

} // namespace

bool PollUntil(const std::function<bool()> &pred, std::chrono::nanoseconds timeout,
               std::chrono::nanoseconds *waited_out) {
    return Poll(pred, timeout, std::chrono::nanoseconds(0), waited_out);
}

bool PollUntil(const std::function<bool()> &pred, std::chrono::nanoseconds timeout,
               std::chrono::nanoseconds every, std::chrono::nanoseconds *waited_out) {
    return Poll(pred, timeout, std::max(every, std::chrono::nanoseconds(1)), waited_out);
}

bool WaitUntil(const std::function<bool()> &pred, std::chrono::nanoseconds timeout,
               const std::string &what, const char *file, int line) {
    std::chrono::nanoseconds waited{0};
    if (Poll(pred, timeout, std::chrono::nanoseconds(0), &waited)) return true;
    return Fail(waited, timeout, what, file, line);
}

bool WaitUntil(const std::function<bool()> &pred, std::chrono::nanoseconds timeout,
               std::chrono::nanoseconds every, const std::string &what, const char *file,
               int line) {
    std::chrono::nanoseconds waited{0};
    if (PollUntil(pred, timeout, every, &waited)) return true;
    return Fail(waited, timeout, what, file, line);
}

} // namespace ote_test

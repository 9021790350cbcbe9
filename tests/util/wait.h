// tests/util/wait.h - the one way a test waits for something that happens on another
// thread or in another process.
//
// WaitUntil polls a predicate until it holds or a timeout passes, on the monotonic clock
// (std::chrono::steady_clock), with a short exponential backoff (50 us doubling up to
// 2 ms between polls, or a fixed pause the caller gives; never sleeping past the deadline). The predicate is checked once
// more at the deadline, so a condition that became true during the last pause counts.
//
//     EXPECT_TRUE(ote_test::WaitUntil([&] { return Grants(src).live_source == 0; },
//                                     std::chrono::seconds(30), "no live source grant"));
//
// On timeout it adds a non-fatal gtest failure at the caller's file and line:
//     timed out after 30012 ms (limit 30000 ms) waiting for: no live source grant
// and returns false, so a test that cannot go on writes ASSERT_TRUE(WaitUntil(...)).
// PollUntil is the same wait without the failure, for a test whose expected outcome may
// be the timeout (it then says what it checks instead).
//
// The predicate may have side effects (a retried unregister that answers BUSY, say): it is
// called from the waiting thread only, once per poll. Use this in place of hand-written
// for/while loops around usleep; a blind sleep is never a wait.
#ifndef OTE_TESTS_UTIL_WAIT_H
#define OTE_TESTS_UTIL_WAIT_H

#include <chrono>
#include <functional>
#include <string>

namespace ote_test {

// Polls pred until it returns true (true) or timeout passes (false, silently).
// *waited_out, when not null, receives the time spent.
bool PollUntil(const std::function<bool()> &pred, std::chrono::nanoseconds timeout,
               std::chrono::nanoseconds *waited_out = nullptr);

// PollUntil, and on timeout a non-fatal gtest failure naming `what` and the time waited,
// reported at the caller's file and line.
bool WaitUntil(const std::function<bool()> &pred, std::chrono::nanoseconds timeout,
               const std::string &what, const char *file = __builtin_FILE(),
               int line = __builtin_LINE());

// The same with a fixed pause of `every` between polls instead of the backoff: for a
// predicate that is itself an attempt a peer sees (a connection, a handshake) and must not
// be repeated faster than the test means to.
bool PollUntil(const std::function<bool()> &pred, std::chrono::nanoseconds timeout,
               std::chrono::nanoseconds every, std::chrono::nanoseconds *waited_out = nullptr);
bool WaitUntil(const std::function<bool()> &pred, std::chrono::nanoseconds timeout,
               std::chrono::nanoseconds every, const std::string &what,
               const char *file = __builtin_FILE(), int line = __builtin_LINE());

} // namespace ote_test

#endif

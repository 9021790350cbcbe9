// Staging marks of the same-host transport's ring (engine/shm/shm_internal.h, "Staging
// marks"), at the source, played by a raw local process (tests/engine/shm_raw_fixture.h):
// the requester sends a REQS message before it stages the message's WRITE bytes into the
// ring, and the source copies a ring piece only once the mark in the ring's control page
// passed the piece's id.
//
//   - a piece is copied only after its mark, with the bytes the ring holds then (bytes
//     changed after the message was sent arrive; the response waits for every piece);
//   - a READ piece never waits for a mark;
//   - a mark that never comes: the pieces answer OTE_ERR_TIMEOUT after one
//     transfer_timeout_ms (not one each) having moved nothing, the connection goes on;
//   - a requester that dies while the source waits: its connection and pin end with it,
//     long before transfer_timeout_ms;
//   - no marks unless asked for and the memfd holds the control page.
// The engine's own requester with and without marks: shm_e2e_test (ShmNoMarksTest, and
// every other case, which runs with marks).
#include <gtest/gtest.h>

#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "tests/engine/shm_raw_fixture.h"

namespace {

using namespace ote_shm_raw; // NOLINT(google-build-using-namespace): the fixture's helpers
using ote_test::kMs;

constexpr int kQuietMs = 300; // how long a response that must not come is looked for

using ShmMarksTest = ShmHostileTest;

TEST_F(ShmMarksTest, APieceIsCopiedOnlyOnceItsMarkPassedIt) {
    int fd = GoodRing(true);
    memset(ring_, 0x11, 2 * 4096);
    tw_req_t a = Req(TW_OP_WRITE, Buf(4096), 0, 4096);
    tw_req_t b = Req(TW_OP_WRITE, Buf(3 * 4096), 4096, 4096);
    ASSERT_LT(a.id, b.id);
    SendReqs(fd, {a, b});
    // Nothing is staged yet: no answer, nothing written.
    EXPECT_TRUE(Responses(fd, {a, b}, kQuietMs).empty());
    EXPECT_TRUE(BufIntact());
    // Staged now, after the message: these bytes are the ones that arrive.
    memset(ring_, 0x22, 4096);
    mark()->store(a.id + 1, std::memory_order_release);
    EXPECT_TRUE(Responses(fd, {a, b}, kQuietMs).empty()) << "answered before b was staged";
    memset(ring_ + 4096, 0x33, 4096);
    mark()->store(b.id + 1, std::memory_order_release);
    std::vector<int32_t> st = Responses(fd, {a, b});
    ASSERT_EQ(st.size(), 2u);
    EXPECT_EQ(st[0], OTE_OK);
    EXPECT_EQ(st[1], OTE_OK);
    for (size_t i = 0; i < 4096; i++) {
        ASSERT_EQ(buf_[4096 + i], 0x22) << i;
        ASSERT_EQ(buf_[3 * 4096 + i], 0x33) << i;
    }
    EXPECT_FALSE(Pinned());
}

TEST_F(ShmMarksTest, AReadNeverWaitsForAMark) {
    int fd = GoodRing(true);
    mark()->store(0);
    EXPECT_EQ(One(fd, Req(TW_OP_READ, Buf(100), 8192, 4096)), OTE_OK);
    EXPECT_EQ(memcmp(ring_ + 8192, buf_.data() + 100, 4096), 0);
    EXPECT_TRUE(BufIntact());
}

class ShmMarksTimeoutTest : public ShmHostileTest {
  protected:
    ShmMarksTimeoutTest() { transfer_timeout_ms_ = "1500"; }
};

// Eight pieces whose mark never comes: they all answer OTE_ERR_TIMEOUT having moved
// nothing, after one deadline (1.5 s), not one each (12 s): once a wait timed out, the
// pieces behind the same mark fail at once until it moves.
TEST_F(ShmMarksTimeoutTest, AMarkThatNeverComesTimesOutHavingMovedNothing) {
    int fd = GoodRing(true);
    memset(ring_, 0x44, 8 * 4096);
    std::vector<tw_req_t> q;
    for (uint32_t i = 0; i < 8; i++) q.push_back(Req(TW_OP_WRITE, Buf(i * 4096), i * 4096, 4096));
    ote_deadline_t t0 = ote_now_ns();
    SendReqs(fd, q);
    std::vector<int32_t> st = Responses(fd, q);
    uint64_t took_ms = (ote_now_ns() - t0) / kMs;
    ASSERT_EQ(st.size(), 8u);
    for (int32_t v : st) EXPECT_EQ(v, OTE_ERR_TIMEOUT);
    EXPECT_LT(took_ms, 6000u) << "each piece waited a deadline of its own";
    EXPECT_TRUE(BufIntact());
    EXPECT_TRUE(LogContains("did not stage piece"));
    // The connection goes on: a piece staged and marked before it is sent is copied.
    tw_req_t r = Req(TW_OP_WRITE, Buf(8192), 4096, 16);
    memset(ring_ + 4096, 0x55, 16);
    mark()->store(r.id + 1, std::memory_order_release);
    EXPECT_EQ(One(fd, r), OTE_OK);
    for (size_t i = 0; i < 16; i++) EXPECT_EQ(buf_[8192 + i], 0x55);
}

// The source waits for a mark while the requester lives: the requester's death (its
// socket's hangup) ends the wait and the connection, with the piece's pin, well before
// the 60 s transfer_timeout_ms would have. With one connection allowed at a time, a new
// requester is served only once that connection has ended.
TEST_F(ShmMarksTest, ARequesterThatDiesWhileTheSourceWaitsEndsItsConnection) {
    ote_engine_t *e = ote_test::NewEngine(
        {{"transports", "shm,tcp"}, {"tcp_max_accepted", "1"}, {"transfer_timeout_ms", "60000"}});
    ASSERT_NE(e, nullptr);
    std::vector<uint8_t> mem(8192, 0x5a);
    ASSERT_EQ(ote_memory_register(e, mem.data(), mem.size(), OTE_PERM_WRITE), OTE_OK);
    std::string sock = ShmSocketOf(e);
    int fd = GoodRing(true, true, sock);
    ASSERT_FALSE(HasFailure());
    uint64_t base = reinterpret_cast<uintptr_t>(mem.data());
    SendReqs(fd, {Req(TW_OP_WRITE, base, 0, 4096, 7, base, 4096)});
    // The source took the message (the socket's send queue is empty), then waits.
    int queued = 1;
    ote_test::WaitUntil([&] { return ioctl(fd, SIOCOUTQ, &queued) != 0 || queued == 0; },
                        std::chrono::milliseconds(kWaitMs), "the source to read the request");
    ASSERT_EQ(queued, 0) << "the source never read the request";
    shutdown(fd, SHUT_RDWR); // what the requester's death does to its end
    tw_hello_t h2 = Hello(TW_RING_BYTES);
    auto served = [&] { // a refused connection is closed at once
        int c = Connect(sock);
        tw_hello_ack_t a2;
        if (SendWithFds(c, &h2, sizeof(h2), {ring_fd_}) &&
            RecvMsg(c, &a2, sizeof(a2)) == static_cast<ssize_t>(sizeof(a2)) && a2.status == OTE_OK)
            return true;
        raw_.pop_back();
        close(c);
        return false;
    };
    EXPECT_TRUE(ote_test::WaitUntil(served, std::chrono::milliseconds(kWaitMs),
                                    "a new connection served: the waiting one ended with its "
                                    "requester"));
    EXPECT_EQ(ote_memory_unregister(e, mem.data()), OTE_OK) << "its pin outlived it";
    for (uint8_t v : mem) ASSERT_EQ(v, 0x5a);
    CloseRaw();
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
}

// Marks only when asked for and the memfd holds the control page; otherwise the source
// copies a ring piece as soon as it reads it (the requester staged it before sending).
TEST_F(ShmMarksTest, NoControlPageNoMarks) {
    int fd = GoodRing(true, false); // asks for marks, no control page: none granted
    ASSERT_FALSE(HasFailure());
    memset(ring_, 0x66, 64);
    EXPECT_EQ(One(fd, Req(TW_OP_WRITE, Buf(), 0, 64)), OTE_OK);
    for (size_t i = 0; i < 64; i++) EXPECT_EQ(buf_[i], 0x66);
}

TEST_F(ShmMarksTest, WithoutTheCapabilityTheRingIsReadAtOnce) {
    int fd = GoodRing(false); // expects no SHM_ACK_MARKS
    memset(ring_, 0x77, 64);
    EXPECT_EQ(One(fd, Req(TW_OP_WRITE, Buf(), 0, 64)), OTE_OK);
    for (size_t i = 0; i < 64; i++) EXPECT_EQ(buf_[i], 0x77);
}

} // namespace

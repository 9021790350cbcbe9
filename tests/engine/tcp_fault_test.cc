// The TCP transport under the fault points of engine/ (base/fault.h). engine/tcp has one,
// "tcp.connect", hit before each data connection of a peer is made; engine/control has
// none. A requester connects tcp_connections = 4 data connections per peer, so failing
// the Nth hit makes a partial connect: N-1 connections are made (each with its
// handshake), then the Nth fails. The contract: the whole connect rolls back (no fd is
// left open on either side, no segment is handed out, the injected status is returned as
// it was), and the peer can be opened (or reconnected) again once the fault clears.
#include <gtest/gtest.h>

#include <cerrno>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/engine/engine_util.h"
#include "tests/engine/target.h"
#include "tests/util/test_base.h"
#include "tests/util/wait.h"

extern "C" {
#include "base/fault.h"
#include "base/time.h"
#include "ote/ote.h"
#include "tests/engine/pattern.h"
}

namespace {

using ote_test::CountOpenFds;
using ote_test::EngineAddress;
using ote_test::kMs;
using ote_test::kSec;
using ote_test::NewEngine;
using ote_test::RunOne;

constexpr uint32_t kConns = 4;
const char *const kPoint = "tcp.connect";

class TcpFaultTest : public ote_test::OteTest {
  protected:
    void SetUp() override {
        OteTest::SetUp();
        src_ = NewEngine();
        // The requester uses TCP only: a same-host peer would otherwise get shm.
        req_ = NewEngine({{"transports", "tcp"}, {"tcp_connections", "4"}});
        ASSERT_NE(src_, nullptr);
        ASSERT_NE(req_, nullptr);
        mem_.assign(1u << 20, 0);
        ASSERT_EQ(
            ote_memory_register(src_, mem_.data(), mem_.size(), OTE_PERM_READ | OTE_PERM_WRITE),
            OTE_OK);
        addr_ = EngineAddress(src_);
        out_.resize(300001);
        ote_pattern_fill(out_.data(), out_.size(), 41, 0);
    }
    void TearDown() override {
        ote_fault_disarm_all();
        if (req_) {
            EXPECT_EQ(ote_engine_destroy(req_), OTE_OK);
        }
        if (src_) {
            EXPECT_EQ(ote_engine_destroy(src_), OTE_OK);
        }
        OteTest::TearDown();
    }
    // The open fds of this process come back to `want` (the source closes the accepted
    // halves of a rolled-back connect when it sees their EOF, on its own thread).
    static bool FdsSettleAt(int want) {
        return ote_test::WaitUntil([&] { return CountOpenFds() == want; }, std::chrono::seconds(10),
                                   "this process's fd count back to " + std::to_string(want));
    }
    // WRITE out_ at offset 7 of the source's buffer and READ it back; both byte-checked.
    void RoundTrip(ote_segment_t *seg) {
        std::fill(mem_.begin(), mem_.end(), 0);
        uint64_t remote = reinterpret_cast<uintptr_t>(mem_.data()) + 7;
        ASSERT_EQ(RunOne(req_, {OTE_WRITE, out_.data(), seg, remote, out_.size()}, 30 * kSec),
                  OTE_OK);
        EXPECT_EQ(memcmp(mem_.data() + 7, out_.data(), out_.size()), 0);
        std::vector<uint8_t> back(out_.size(), 0);
        ASSERT_EQ(RunOne(req_, {OTE_READ, back.data(), seg, remote, back.size()}, 30 * kSec),
                  OTE_OK);
        EXPECT_EQ(back, out_);
    }

    ote_engine_t *src_ = nullptr, *req_ = nullptr;
    std::string addr_;
    std::vector<uint8_t> mem_, out_;
};

// Fail connection 1, 2, 3 and then 4 of 4: each open fails with the injected status,
// after exactly that many hits, leaves no fd behind and no segment; the next open works.
TEST_F(TcpFaultTest, PartialConnectRollsBackAndThePeerOpensAgain) {
    for (uint32_t n = 1; n <= kConns; n++) {
        SCOPED_TRACE("failing data connection " + std::to_string(n) + " of " +
                     std::to_string(kConns));
        int fds0 = CountOpenFds();
        ASSERT_EQ(ote_fault_arm(kPoint, OTE_FAULT_NTH, n, OTE_ERR_CONNECT, ECONNREFUSED), OTE_OK);
        ote_segment_t *seg = nullptr;
        ote_status_t st = ote_segment_open(req_, addr_.c_str(), &seg);
        EXPECT_EQ(ote_status_code(st), OTE_ERR_CONNECT) << ote_status_str(st);
        EXPECT_EQ(ote_status_errno(st), ECONNREFUSED);
        EXPECT_EQ(seg, nullptr); // outputs only on success
        EXPECT_EQ(ote_fault_hits(kPoint), n) << "the connect went on after its failure";
        EXPECT_EQ(ote_fault_failures(kPoint), 1u);
        EXPECT_TRUE(FdsSettleAt(fds0)) << "fds: " << CountOpenFds() << ", before: " << fds0;
        ASSERT_EQ(ote_fault_disarm(kPoint), OTE_OK);
        // Cleared: the same peer opens, moves bytes both ways and closes.
        ASSERT_EQ(ote_segment_open(req_, addr_.c_str(), &seg), OTE_OK);
        RoundTrip(seg);
        EXPECT_EQ(ote_segment_close(seg), OTE_OK);
        EXPECT_TRUE(FdsSettleAt(fds0)) << "fds: " << CountOpenFds() << ", before: " << fds0;
    }
}

// Every connect failing (OTE_FAULT_FROM 1): the open fails at the first connection with
// a status of another kind (a timeout, which segment_open reports as what it is for the
// caller: OTE_ERR_CONNECT, ETIMEDOUT), nothing is retried behind the caller's back, and
// the engines stay usable.
TEST_F(TcpFaultTest, EveryConnectFailingFailsTheOpenOnce) {
    int fds0 = CountOpenFds();
    ASSERT_EQ(ote_fault_arm(kPoint, OTE_FAULT_FROM, 1, OTE_ERR_TIMEOUT, 0), OTE_OK);
    for (int i = 0; i < 3; i++) {
        ote_segment_t *seg = nullptr;
        ote_status_t st = ote_segment_open(req_, addr_.c_str(), &seg);
        EXPECT_EQ(ote_status_code(st), OTE_ERR_CONNECT);
        EXPECT_EQ(ote_status_errno(st), ETIMEDOUT);
        EXPECT_EQ(seg, nullptr);
    }
    EXPECT_EQ(ote_fault_hits(kPoint), 3u);
    EXPECT_EQ(ote_fault_failures(kPoint), 3u);
    EXPECT_TRUE(FdsSettleAt(fds0));
    ote_fault_disarm_all();
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_segment_open(req_, addr_.c_str(), &seg), OTE_OK);
    RoundTrip(seg);
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
}

// The reconnect path: the peer stops answering (SIGSTOP), a slice times out and closes
// its connection, the peer is marked broken; the same process, resumed, is reconnected
// on the next submit (a restarted process instead fails the segment: peer_restart_test).
// When that reconnect fails part-way (connection 3 of 4), the submit fails with the
// injected status and queues nothing, every connection of the peer is closed (no fd
// left), the segment stays usable, and the next submit reconnects for real.
TEST_F(TcpFaultTest, PartialReconnectRollsBackAndTheNextSubmitReconnects) {
    // A requester of its own with a short transfer deadline: the stopped peer's slice
    // times out at it (its wait below is far longer, so only the deadline decides).
    ote_engine_t *req = NewEngine(
        {{"transports", "tcp"}, {"tcp_connections", "4"}, {"transfer_timeout_ms", "1500"}});
    ASSERT_NE(req, nullptr);
    struct Destroy {
        ote_engine_t *e;
        ~Destroy() { EXPECT_EQ(ote_engine_destroy(e), OTE_OK); }
    } destroy{req};
    ote_test::Target target;
    ASSERT_TRUE(target.Start(4u << 20));
    int fds0 = CountOpenFds(); // the peer's connections not yet made
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_segment_open(req, target.address.c_str(), &seg), OTE_OK);
    std::vector<uint8_t> buf(100000);
    ote_pattern_fill(buf.data(), buf.size(), 5, 0);
    ASSERT_EQ(RunOne(req, {OTE_WRITE, buf.data(), seg, target.rw, buf.size()}, 30 * kSec), OTE_OK);
    ASSERT_TRUE(target.Stop());
    ote_status_t st = RunOne(req, {OTE_WRITE, buf.data(), seg, target.rw, 16}, 60 * kSec);
    EXPECT_EQ(ote_status_code(st), OTE_ERR_TIMEOUT) << ote_status_str(st);
    ASSERT_TRUE(target.Cont());

    ASSERT_EQ(ote_fault_arm(kPoint, OTE_FAULT_NTH, 3, OTE_ERR_CONNECT, EHOSTUNREACH), OTE_OK);
    ote_batch_t *b = nullptr;
    ASSERT_EQ(ote_batch_create(req, 1, &b), OTE_OK);
    ote_request_t w = {OTE_WRITE, buf.data(), seg, target.rw + 3, buf.size()};
    st = ote_batch_submit(b, &w, 1);
    EXPECT_EQ(ote_status_code(st), OTE_ERR_CONNECT) << ote_status_str(st);
    EXPECT_EQ(ote_status_errno(st), EHOSTUNREACH);
    EXPECT_EQ(ote_fault_hits(kPoint), 3u);
    ote_transfer_status_t ts;
    ASSERT_EQ(ote_batch_status(b, 0, &ts), OTE_OK);
    EXPECT_EQ(ts.state, OTE_TRANSFER_WAITING) << "a refused submit queued its request";
    EXPECT_TRUE(FdsSettleAt(fds0)) << "fds: " << CountOpenFds() << ", before: " << fds0;
    ASSERT_EQ(ote_fault_disarm(kPoint), OTE_OK);

    ASSERT_EQ(ote_batch_submit(b, &w, 1), OTE_OK);
    EXPECT_EQ(ote_batch_wait(b, 30 * kSec), OTE_OK);
    EXPECT_EQ(target.Hash("rw", 3, buf.size()), ote_hash(buf.data(), buf.size()));
    EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(target.Quit(), 0);
}

} // namespace

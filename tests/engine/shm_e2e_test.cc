// The same-host transport and the router, end to end: this process is the requester, the
// target engine runs in a child process (ote_target). Which transport a segment got is
// read with ote_segment_info; the whole e2e_test suite also runs over shm (its default
// configuration) and over tcp (e2e_tcp_test).
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <mutex>
#include <thread>
#include <vector>

#include "tests/engine/e2e_fixture.h"
#include "tests/util/wait.h"

extern "C" {
#include "base/log.h"
#include "base/time.h"
#include "ote/ote.h"
#include "tests/engine/pattern.h"
}

namespace {

using ote_test::kSec;
using ote_test::Target;
using ote_test::WaitUntil;

std::string TransportOf(ote_segment_t *seg) {
    ote_segment_info_t info;
    if (ote_segment_info(seg, &info) != OTE_OK) return "?";
    return info.transport;
}

// Every shm test runs in both data-path modes: shm_mode=auto (cross-memory attach, which
// this host allows) and shm_mode=ring (the shared memfd ring, forced).
ote_test::TargetSession ModeSession(const char *mode, const char *timeout_ms = nullptr) {
    ote_test::TargetSession s;
    // INFO: the requester's line on each connection names its data path.
    s.config = {{"shm_mode", mode}, {"log_level", "info"}};
    if (timeout_ms != nullptr) s.config.push_back({"transfer_timeout_ms", timeout_ms});
    return s;
}

class ShmE2eTest : public ote_test::TargetE2eTest,
                   public ::testing::WithParamInterface<const char *> {
  protected:
    ShmE2eTest() : TargetE2eTest(ModeSession(GetParam())) {}
};

TEST_P(ShmE2eTest, SameHostPeerGetsShmAndEveryByteArrives) {
    EXPECT_EQ(TransportOf(seg_), "shm");
    EXPECT_TRUE(LogContains(", staging marks")); // both ends speak them
    ote_segment_info_t info;
    EXPECT_EQ(ote_segment_info(nullptr, &info), OTE_ERR_INVALID);
    EXPECT_EQ(ote_segment_info(seg_, nullptr), OTE_ERR_INVALID);
    RoundTrip(0, 0, 0, 1);
    RoundTrip(1, 7, 3, 2);
    RoundTrip(123457, 4099, 5, 3);
    RoundTrip((3u << 20) + 13, 1, 1, 4); // several slices, unaligned both sides
    RoundTrip(64u << 20, 0, 0, 5);
}

TEST_P(ShmE2eTest, OutOfRangeAndWrongPermissionTouchNothing) {
    std::vector<uint8_t> buf(8192, 0x5A);
    uint64_t ro0 = target_.Hash("ro", 0, target_.ro_len);
    uint64_t wo0 = target_.Hash("wo", 0, target_.wo_len);
    uint64_t rw_tail = target_.Hash("rw", target_.rw_len - 4096, 4096);
    // Straddling the end of rw, into ro (WRITE), out of wo (READ), wrapping addresses.
    EXPECT_EQ(Transfer(OTE_WRITE, buf.data(), target_.rw + target_.rw_len - 4096, 8192),
              OTE_ERR_ACCESS);
    EXPECT_EQ(Transfer(OTE_WRITE, buf.data(), target_.ro, 4096), OTE_ERR_ACCESS);
    EXPECT_EQ(Transfer(OTE_READ, buf.data(), target_.wo, 4096), OTE_ERR_ACCESS);
    EXPECT_EQ(Transfer(OTE_READ, buf.data(), UINT64_MAX - 8192, 8192), OTE_ERR_ACCESS);
    for (uint8_t c : buf) ASSERT_EQ(c, 0x5A);
    EXPECT_EQ(target_.Hash("ro", 0, target_.ro_len), ro0);
    EXPECT_EQ(target_.Hash("wo", 0, target_.wo_len), wo0);
    EXPECT_EQ(target_.Hash("rw", target_.rw_len - 4096, 4096), rw_tail);
    // The connection stays usable; the allowed directions work.
    EXPECT_EQ(Transfer(OTE_READ, buf.data(), target_.ro, 4096), OTE_OK);
    EXPECT_EQ(Transfer(OTE_WRITE, buf.data(), target_.wo, 4096), OTE_OK);
    EXPECT_EQ(TransportOf(seg_), "shm");
}

TEST_P(ShmE2eTest, UnregisterWhileInUseIsBusy) {
    std::vector<uint8_t> buf(1u << 20, 3);
    ASSERT_EQ(ote_memory_register(engine_, buf.data(), buf.size(), OTE_PERM_READ), OTE_OK);
    ASSERT_TRUE(target_.Stop()); // the source cannot serve: the request stays in flight
    ote_batch_t *b = nullptr;
    ASSERT_EQ(ote_batch_create(engine_, 1, &b), OTE_OK);
    ote_request_t r = {OTE_WRITE, buf.data() + 100, seg_, target_.rw, 4096};
    ASSERT_EQ(ote_batch_submit(b, &r, 1), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(engine_, buf.data()), OTE_ERR_BUSY);
    EXPECT_EQ(ote_segment_close(seg_), OTE_ERR_BUSY);
    EXPECT_EQ(ote_batch_wait(b, 50 * 1000 * 1000), OTE_ERR_TIMEOUT);
    ASSERT_TRUE(target_.Cont());
    EXPECT_EQ(ote_batch_wait(b, 30 * kSec), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(engine_, buf.data()), OTE_OK);
    EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    EXPECT_EQ(target_.Hash("rw", 0, 4096), ote_hash(buf.data() + 100, 4096));
}

TEST_P(ShmE2eTest, PeerKilledIsLostAtOnceAndANewPeerWorks) {
    std::vector<uint8_t> big(64u << 20, 7);
    ASSERT_TRUE(target_.Stop()); // certainly mid-transfer when killed
    ote_batch_t *b = nullptr;
    ASSERT_EQ(ote_batch_create(engine_, 2, &b), OTE_OK);
    ote_request_t r = {OTE_WRITE, big.data(), seg_, target_.rw, big.size()};
    ASSERT_EQ(ote_batch_submit(b, &r, 1), OTE_OK);
    uint64_t t0 = ote_now_ns();
    target_.Kill();
    ote_status_t st = ote_batch_wait(b, 20 * kSec);
    uint64_t took_ms = (ote_now_ns() - t0) / 1000000;
    // PEER_LOST, not TIMEOUT: seen from the socket, not waited out (default deadline 30 s).
    EXPECT_EQ(ote_status_code(st), OTE_ERR_PEER_LOST) << ote_status_str(st);
    EXPECT_LT(took_ms, 10000u);
    EXPECT_EQ(ote_batch_reset(b), OTE_OK);
    // While it is gone, a submit fails fast and nothing is queued.
    EXPECT_EQ(ote_status_code(ote_batch_submit(b, &r, 1)), OTE_ERR_CONNECT);
    // A new peer: a new segment reaches it over shm and every byte arrives.
    Target fresh;
    ASSERT_TRUE(fresh.Start(16u << 20));
    ote_segment_t *s2 = nullptr;
    ASSERT_EQ(ote_segment_open(engine_, fresh.address.c_str(), &s2), OTE_OK);
    EXPECT_EQ(TransportOf(s2), "shm");
    std::vector<uint8_t> src(777777);
    ote_pattern_fill(src.data(), src.size(), 9, 0);
    ote_request_t w = {OTE_WRITE, src.data(), s2, fresh.rw + 3, src.size()};
    ASSERT_EQ(ote_batch_submit(b, &w, 1), OTE_OK);
    EXPECT_EQ(ote_batch_wait(b, 30 * kSec), OTE_OK);
    EXPECT_EQ(fresh.Hash("rw", 3, src.size()), ote_hash(src.data(), src.size()));
    EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    EXPECT_EQ(ote_segment_close(s2), OTE_OK);
    EXPECT_EQ(fresh.Quit(), 0);
}

// A stopped source fails requests at their deadline (not before) and does not hold up
// another peer of the same engine.
class ShmDeadlineTest : public ote_test::TargetE2eTest,
                        public ::testing::WithParamInterface<const char *> {
  protected:
    ShmDeadlineTest() : TargetE2eTest(ModeSession(GetParam(), "1500")) {}
};

TEST_P(ShmDeadlineTest, StoppedPeerFailsAtTheDeadlineOthersUnaffected) {
    Target other;
    ASSERT_TRUE(other.Start(16u << 20));
    ote_segment_t *s2 = nullptr;
    ASSERT_EQ(ote_segment_open(engine_, other.address.c_str(), &s2), OTE_OK);
    ASSERT_TRUE(target_.Stop());
    std::vector<uint8_t> buf(4u << 20, 1);
    ote_batch_t *b = nullptr;
    ASSERT_EQ(ote_batch_create(engine_, 1, &b), OTE_OK);
    ote_request_t r = {OTE_WRITE, buf.data(), seg_, target_.rw, buf.size()};
    uint64_t t0 = ote_now_ns();
    ASSERT_EQ(ote_batch_submit(b, &r, 1), OTE_OK);
    // Meanwhile the other peer serves.
    std::vector<uint8_t> src(1u << 20), dst(1u << 20);
    ote_pattern_fill(src.data(), src.size(), 4, 0);
    EXPECT_EQ(
        ote_test::RunOne(engine_, {OTE_WRITE, src.data(), s2, other.rw, src.size()}, 30 * kSec),
        OTE_OK);
    EXPECT_EQ(
        ote_test::RunOne(engine_, {OTE_READ, dst.data(), s2, other.rw, dst.size()}, 30 * kSec),
        OTE_OK);
    EXPECT_EQ(src, dst);
    ote_status_t st = ote_batch_wait(b, 60 * kSec);
    uint64_t took_ms = (ote_now_ns() - t0) / 1000000;
    EXPECT_EQ(ote_status_code(st), OTE_ERR_TIMEOUT) << ote_status_str(st);
    EXPECT_GE(took_ms, 1400u); // not before the deadline (clock granularity aside)
    ASSERT_TRUE(target_.Cont());
    EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    EXPECT_EQ(ote_segment_close(s2), OTE_OK);
    EXPECT_EQ(other.Quit(), 0);
}

// Every step of the cancel tests runs under a deadline: a call that never returns (a
// deadlock, a completion that never comes) ends the process at once with the step's name,
// instead of hanging until the target's timeout. Phase() starts a step with its own limit;
// the limits are generous (a loaded 2-core machine, ASan) and never measure speed.
class StepWatchdog {
  public:
    explicit StepWatchdog(const char *test) : test_(test), thread_([this] { Watch(); }) {}
    ~StepWatchdog() {
        {
            std::lock_guard<std::mutex> g(mu_);
            quit_ = true;
        }
        cv_.notify_all();
        thread_.join();
    }
    void Phase(const std::string &step, uint64_t limit_ns) {
        std::lock_guard<std::mutex> g(mu_);
        step_ = step;
        dl_ = ote_deadline_after(limit_ns);
        limit_s_ = limit_ns / ote_test::kSec;
    }

  private:
    void Watch() {
        std::unique_lock<std::mutex> g(mu_);
        while (!quit_) {
            if (dl_ != 0 && ote_deadline_expired(dl_)) {
                std::fprintf(stderr,
                             "[ WATCHDOG ] %s: step \"%s\" did not end within %llu s (a wait "
                             "without an end: deadlock or lost completion); aborting\n",
                             test_.c_str(), step_.c_str(), (unsigned long long)limit_s_);
                std::fflush(stderr);
                std::abort();
            }
            cv_.wait_for(g, std::chrono::milliseconds(100));
        }
    }
    std::string test_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::string step_;
    ote_deadline_t dl_ = 0;
    uint64_t limit_s_ = 0;
    bool quit_ = false;
    std::thread thread_;
};

// Cancel reaches pieces already sent to the source (CANCEL entries): large requests
// (256 MiB, 32 MiB slices in cross-memory-attach mode, 2 MiB in ring mode) canceled while
// their pieces are at the source end CANCELED; no byte of them moves once the request
// reported it; the destination changes only where a piece was served before the cancel;
// nothing outside the range is touched; and the target can unregister the range at once.
//
// Under TSan (ote_test::TsanScaled) the request is 128 MiB and slice_size 16 MiB: in
// cross-memory-attach mode still 8 slices, of which the 64 MiB window (SHM_WINDOW_BYTES,
// the transport's) sends only some (4 rather than 2; the rest wait at the requester, where
// a cancel drops them, while those sent wait at the source for the CANCEL entry); in ring
// mode 64 slices of 2 MiB rather than 128, 8 at a time in the 16 MiB ring. A cancel so
// still lands with pieces at the source and pieces queued (the mid-flight READ's once its
// first slice arrived: 7 of 8, or 63 of 64, to go), and the mid-flight bound (the window,
// a slice and a MiB: 81 of 128 MiB) still bounds. The target fills its whole rw when it
// starts and the checks hash all of it several times: at 256 MiB those fresh pages, fills
// and hashes took 25-45 s a case under TSan.
constexpr size_t kCancelLen = ote_test::TsanScaled(256ull << 20, 2);
constexpr size_t kCancelSlice = kCancelLen / 8;
static_assert(kCancelSlice == (ote_test::kUnderTsan ? 16u << 20 : 32u << 20),
              "slice_size below names the slice");

ote_test::TargetSession CancelSession(const char *mode) {
    ote_test::TargetSession s = ModeSession(mode, "60000");
    s.rw_size = kCancelLen + (1u << 20); // the request, then a guard MiB
    s.config.push_back({"slice_size", ote_test::kUnderTsan ? "16M" : "32M"});
    s.wait_ns = 120 * kSec;
    return s;
}

// Bytes of p[0, len) other than c, compared a MiB at a time with memcmp (a block that
// differs is counted byte by byte): a loop over every byte of a few hundred MiB costs
// seconds under TSan, an instrumented read each.
size_t CountOtherThan(const uint8_t *p, size_t len, uint8_t c) {
    constexpr size_t kBlock = 1u << 20;
    const std::vector<uint8_t> same(std::min(kBlock, len), c);
    size_t n = 0;
    for (size_t off = 0; off < len; off += kBlock) {
        size_t m = std::min(kBlock, len - off);
        if (memcmp(p + off, same.data(), m) == 0) continue;
        for (size_t i = off; i < off + m; i++) n += p[i] != c;
    }
    return n;
}

class ShmCancelTest : public ote_test::TargetE2eTest,
                      public ::testing::WithParamInterface<const char *> {
  protected:
    ShmCancelTest() : TargetE2eTest(CancelSession(GetParam())) {}

    void SetUp() override {
        dog_.Phase("SetUp", 120 * kSec);
        TargetE2eTest::SetUp();
    }
    void TearDown() override {
        dog_.Phase("TearDown", 120 * kSec);
        TargetE2eTest::TearDown();
    }

    static constexpr size_t kLen = kCancelLen;
    static constexpr size_t kMiB = 1u << 20;

    // This process's side of the requests (kLen and a guard MiB), one buffer for the
    // suite: each case's fresh one took seconds of page faults under TSan. A case fills
    // what it uses before each request; the engines and targets of earlier cases are gone.
    static void SetUpTestSuite() { local_ = new std::vector<uint8_t>(kLen + kMiB); }
    static void TearDownTestSuite() {
        delete local_;
        local_ = nullptr;
    }
    static std::vector<uint8_t> *local_;

    std::vector<uint64_t> BlockHashes() {
        std::vector<uint64_t> h;
        for (size_t off = 0; off < kLen + kMiB; off += kMiB)
            h.push_back(target_.Hash("rw", off, kMiB));
        return h;
    }

    ote_transfer_status_t StatusOf(ote_batch_t *b) {
        ote_transfer_status_t ts;
        memset(&ts, 0, sizeof(ts));
        EXPECT_EQ(ote_batch_status(b, 0, &ts), OTE_OK);
        return ts;
    }

    // The target lets the range go (every pin of the canceled request released).
    void ExpectUnregisterable() {
        EXPECT_TRUE(WaitUntil([&] { return target_.Command("unreg rw") == "ST 0"; },
                              std::chrono::seconds(20),
                              "the target's rw to unregister: the canceled request's pins gone"));
        ASSERT_EQ(target_.Command("rereg rw"), "ST 0");
    }

    StepWatchdog dog_{"ShmCancelTest"};
};

std::vector<uint8_t> *ShmCancelTest::local_ = nullptr;

// The source is stopped while the request's first piece and then the CANCEL reach it: it
// reads both before it copies, so not one byte of the request moves.
TEST_P(ShmCancelTest, CanceledBeforeTheSourceCopiedMovesNoByte) {
    for (ote_opcode_t op : {OTE_READ, OTE_WRITE}) {
        const char *name = op == OTE_READ ? "READ" : "WRITE";
        std::vector<uint8_t> &local = *local_;
        memset(local.data(), 0xEE, local.size());
        if (op == OTE_WRITE) ote_pattern_fill(local.data(), kLen, 21, 0);
        std::vector<uint64_t> before = BlockHashes();
        ote_batch_t *b = nullptr;
        ASSERT_EQ(ote_batch_create(engine_, 1, &b), OTE_OK);
        ASSERT_TRUE(target_.Stop());
        dog_.Phase(std::string(name) + ": submit and cancel at the stopped source", 30 * kSec);
        ote_request_t r = {op, local.data(), seg_, target_.rw, kLen};
        ASSERT_EQ(ote_batch_submit(b, &r, 1), OTE_OK);
        ASSERT_EQ(ote_batch_cancel(b), OTE_OK);
        ASSERT_TRUE(target_.Cont());
        dog_.Phase(std::string(name) + ": ote_batch_wait after the cancel", 90 * kSec);
        uint64_t t0 = ote_now_ns();
        ote_status_t st = ote_batch_wait(b, 60 * kSec);
        uint64_t took = ote_now_ns() - t0;
        dog_.Phase(std::string(name) + ": checks after the cancel", 120 * kSec);
        EXPECT_EQ(ote_status_code(st), OTE_ERR_CANCELED) << name << ": " << ote_status_str(st);
        ote_transfer_status_t ts = StatusOf(b);
        EXPECT_EQ(ts.state, OTE_TRANSFER_CANCELED) << name;
        EXPECT_EQ(ts.bytes_done, 0u) << name;
        if (op == OTE_READ) {
            ASSERT_EQ(CountOtherThan(local.data(), local.size(), 0xEE), 0u)
                << name << ": bytes arrived here";
        }
        EXPECT_EQ(BlockHashes(), before) << name << ": the target's memory changed";
        ExpectUnregisterable();
        std::printf(
            "[ figures ] shm %s %s: canceled at a stopped source, ended %.1f ms after it "
            "went on\n",
            GetParam(), name, took / 1e6);
        EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    }
    dog_.Phase("the round trip after the cancels", 150 * kSec);
    RoundTrip((1u << 20) + 3, 100, 1, 9); // the segment still works, every byte right
}

// Canceled while the source copies: CANCELED, and what changed is bounded by what the
// request reports done plus the pieces that were at the source (at most the 64 MiB
// window plus one slice); after CANCELED nothing changes any more.
TEST_P(ShmCancelTest, CanceledMidFlightStopsAtTheSource) {
    const size_t bound = (64u << 20) + kCancelSlice + kMiB;
    static_assert((64u << 20) + kCancelSlice + kMiB < kLen, "the bound is below the request");
    for (ote_opcode_t op : {OTE_READ, OTE_WRITE}) {
        const char *name = op == OTE_READ ? "READ" : "WRITE";
        dog_.Phase(std::string(name) + ": hashes before the request", 90 * kSec);
        std::vector<uint8_t> &local = *local_;
        memset(local.data(), 0xEE, local.size());
        if (op == OTE_WRITE) ote_pattern_fill(local.data(), kLen, 22, 0);
        std::vector<uint64_t> before = BlockHashes();
        ote_batch_t *b = nullptr;
        ASSERT_EQ(ote_batch_create(engine_, 1, &b), OTE_OK);
        dog_.Phase(std::string(name) + ": submit and the first bytes", 90 * kSec);
        ote_request_t r = {op, local.data(), seg_, target_.rw, kLen};
        ASSERT_EQ(ote_batch_submit(b, &r, 1), OTE_OK);
        if (op == OTE_READ) { // until the first slice arrived: the source is copying
            // (asked of the batch: reading `local` while the engine writes it is a race)
            EXPECT_TRUE(WaitUntil(
                [&] {
                    ote_transfer_status_t now = StatusOf(b);
                    return now.bytes_done > 0 || now.state != OTE_TRANSFER_PENDING;
                },
                std::chrono::seconds(60), "the READ's first bytes"));
        }
        dog_.Phase(std::string(name) + ": ote_batch_cancel mid-flight", 30 * kSec);
        uint64_t t0 = ote_now_ns();
        ASSERT_EQ(ote_batch_cancel(b), OTE_OK);
        dog_.Phase(std::string(name) + ": ote_batch_wait after the cancel", 90 * kSec);
        ote_status_t st = ote_batch_wait(b, 60 * kSec);
        uint64_t took = ote_now_ns() - t0;
        dog_.Phase(std::string(name) + ": checks after the cancel", 120 * kSec);
        ote_transfer_status_t ts = StatusOf(b);
        ASSERT_NE(ote_status_code(st), OTE_ERR_TIMEOUT) << name;
        // Too late only when the whole request was served before the cancel.
        if (ts.state != OTE_TRANSFER_COMPLETED) {
            EXPECT_EQ(ts.state, OTE_TRANSFER_CANCELED) << name;
            EXPECT_EQ(ote_status_code(st), OTE_ERR_CANCELED) << name;
            EXPECT_LT(ts.bytes_done, kLen) << name;
        }
        // Nothing moves any more once the request ended.
        std::vector<uint64_t> after = BlockHashes();
        uint64_t local_hash = ote_hash(local.data(), local.size());
        usleep(100 * 1000);
        EXPECT_EQ(BlockHashes(), after) << name;
        EXPECT_EQ(ote_hash(local.data(), local.size()), local_hash) << name;
        size_t changed = 0;
        if (op == OTE_READ) {
            changed = CountOtherThan(local.data(), kLen, 0xEE);
            ASSERT_EQ(CountOtherThan(local.data() + kLen, kMiB, 0xEE), 0u)
                << name << ": the READ wrote past its range";
        } else {
            for (size_t k = 0; k < kLen / kMiB; k++) changed += after[k] != before[k] ? kMiB : 0;
        }
        EXPECT_EQ(after[kLen / kMiB], before[kLen / kMiB]) << name << ": the guard changed";
        EXPECT_LE(changed, ts.bytes_done + bound) << name;
        ExpectUnregisterable();
        std::printf(
            "[ figures ] shm %s %s: canceled mid-flight: %s, %zu MiB reported done, "
            "%zu MiB changed of %zu, ended %.1f ms after the cancel\n",
            GetParam(), name, ts.state == OTE_TRANSFER_CANCELED ? "CANCELED" : "too late",
            (size_t)(ts.bytes_done >> 20), changed >> 20, kLen >> 20, took / 1e6);
        EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    }
    dog_.Phase("the round trip after the cancels", 150 * kSec);
    RoundTrip((1u << 20) + 5, 100, 1, 11);
}

// A batch whose requests are all still queued (the window, or the ring, is full of
// another batch's pieces at a stopped source) is canceled: the transport completes its
// pieces inside ote_batch_cancel, the last of them ending the batch. ote_batch_cancel
// returns (it once held the batch's mutex there, and the batch's end took it again: a
// deadlock of the caller), the batch ends CANCELED with no byte moved, and the other
// batch completes once the source goes on.
TEST_P(ShmCancelTest, CancelOfABatchStillQueuedBehindAnotherReturns) {
    // The big batch fills the 64 MiB window; the small one's bytes lie well past it (200
    // MiB into rw, 100 MiB under TSan).
    const size_t big = 64u << 20, off_small = kLen / 32 * 25;
    uint8_t *a_src = local_->data();
    std::vector<uint8_t> b_src(4096);
    ote_pattern_fill(a_src, big, 31, 0);
    ote_pattern_fill(b_src.data(), b_src.size(), 32, 0);
    uint64_t small_before = target_.Hash("rw", off_small, b_src.size());
    ote_batch_t *a = nullptr, *b = nullptr;
    ASSERT_EQ(ote_batch_create(engine_, 1, &a), OTE_OK);
    ASSERT_EQ(ote_batch_create(engine_, 1, &b), OTE_OK);
    ASSERT_TRUE(target_.Stop());
    dog_.Phase("submit of the 64 MiB batch and the queued one", 30 * kSec);
    ote_request_t ra = {OTE_WRITE, a_src, seg_, target_.rw, big};
    ASSERT_EQ(ote_batch_submit(a, &ra, 1), OTE_OK);
    ote_request_t rb = {OTE_WRITE, b_src.data(), seg_, target_.rw + off_small, b_src.size()};
    ASSERT_EQ(ote_batch_submit(b, &rb, 1), OTE_OK);
    dog_.Phase("ote_batch_cancel of the queued batch", 30 * kSec);
    EXPECT_EQ(ote_batch_cancel(b), OTE_OK);
    dog_.Phase("ote_batch_wait of the canceled batch", 60 * kSec);
    EXPECT_EQ(ote_status_code(ote_batch_wait(b, 30 * kSec)), OTE_ERR_CANCELED);
    ote_transfer_status_t ts = StatusOf(b);
    EXPECT_EQ(ts.state, OTE_TRANSFER_CANCELED);
    EXPECT_EQ(ts.bytes_done, 0u);
    ASSERT_TRUE(target_.Cont());
    dog_.Phase("ote_batch_wait of the other batch", 90 * kSec);
    EXPECT_EQ(ote_batch_wait(a, 60 * kSec), OTE_OK);
    dog_.Phase("checks after the cancel of the queued batch", 120 * kSec);
    EXPECT_EQ(target_.Hash("rw", 0, big), ote_hash(a_src, big));
    EXPECT_EQ(target_.Hash("rw", off_small, b_src.size()), small_before)
        << "a canceled piece moved";
    ExpectUnregisterable();
    EXPECT_EQ(ote_batch_destroy(a), OTE_OK);
    EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    dog_.Phase("the round trip after the cancel", 150 * kSec);
    RoundTrip((1u << 20) + 7, 100, 1, 13);
}

// A source that does not wait for staging marks (as one of protocol 3 before them): the
// requester stages every ring piece before it sends its message. Ring pieces are the
// small ones in cross-memory-attach mode, all of them in ring mode.
ote_test::TargetSession NoMarksSession(const char *mode) {
    ote_test::TargetSession s = ModeSession(mode);
    s.target_env = {"OTE_TEST_SHM_NO_MARKS=1"};
    return s;
}

// All of reqs in one batch, waited for up to wait_ns: ote_batch_wait's status.
ote_status_t RunBatch(ote_engine_t *e, const std::vector<ote_request_t> &reqs, uint64_t wait_ns) {
    ote_batch_t *b = nullptr;
    ote_status_t st = ote_batch_create(e, reqs.size(), &b);
    if (st != OTE_OK) return st;
    st = ote_batch_submit(b, reqs.data(), reqs.size());
    if (st == OTE_OK) st = ote_batch_wait(b, wait_ns);
    EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    return st;
}

class ShmNoMarksTest : public ote_test::TargetE2eTest,
                       public ::testing::WithParamInterface<const char *> {
  protected:
    ShmNoMarksTest() : TargetE2eTest(NoMarksSession(GetParam())) {}
};

TEST_P(ShmNoMarksTest, EveryByteArrivesStagedBeforeTheMessage) {
    EXPECT_EQ(TransportOf(seg_), "shm");
    EXPECT_TRUE(LogContains("ring staged before sending (no staging marks)"));
    RoundTrip(1, 7, 3, 21);
    RoundTrip(4096, 0, 0, 22);
    RoundTrip(123457, 4099, 5, 23);
    RoundTrip((3u << 20) + 13, 1, 1, 24);
    // A batch of small pieces in one message, each staged before it left.
    std::vector<uint8_t> src(64 * 4096), dst(src.size(), 0);
    ote_pattern_fill(src.data(), src.size(), 25, 0);
    std::vector<ote_request_t> w, r;
    for (size_t i = 0; i < 64; i++) {
        w.push_back({OTE_WRITE, src.data() + i * 4096, seg_, target_.rw + i * 8192, 4096});
        r.push_back({OTE_READ, dst.data() + i * 4096, seg_, target_.rw + i * 8192, 4096});
    }
    EXPECT_EQ(RunBatch(engine_, w, 30 * kSec), OTE_OK);
    EXPECT_EQ(RunBatch(engine_, r, 30 * kSec), OTE_OK);
    EXPECT_EQ(src, dst);
}

INSTANTIATE_TEST_SUITE_P(Modes, ShmNoMarksTest, ::testing::Values("auto", "ring"));
INSTANTIATE_TEST_SUITE_P(Modes, ShmCancelTest, ::testing::Values("auto", "ring"));
INSTANTIATE_TEST_SUITE_P(Modes, ShmE2eTest, ::testing::Values("auto", "ring"));
INSTANTIATE_TEST_SUITE_P(Modes, ShmDeadlineTest, ::testing::Values("auto", "ring"));

// Routing between engines of different lists and hosts.
class RoutingTest : public ote_test::OteTest {
  protected:
    // Opens a segment from an engine configured kv to a target started with env, checks
    // the transport and one round trip. Returns the transport's name.
    std::string OpenAndMove(const ote_test::ConfigKv &kv, const std::vector<std::string> &env) {
        Target t;
        EXPECT_TRUE(t.Start(8u << 20, "127.0.0.1:0", env));
        ote_engine_t *e = ote_test::NewEngine(kv);
        EXPECT_NE(e, nullptr);
        if (e == nullptr) return "?";
        ote_segment_t *seg = nullptr;
        std::string name = "none";
        if (ote_segment_open(e, t.address.c_str(), &seg) == OTE_OK) {
            name = TransportOf(seg);
            std::vector<uint8_t> src(300001), dst(300001);
            ote_pattern_fill(src.data(), src.size(), 12, 0);
            EXPECT_EQ(
                ote_test::RunOne(e, {OTE_WRITE, src.data(), seg, t.rw + 1, src.size()}, 30 * kSec),
                OTE_OK);
            EXPECT_EQ(
                ote_test::RunOne(e, {OTE_READ, dst.data(), seg, t.rw + 1, dst.size()}, 30 * kSec),
                OTE_OK);
            EXPECT_EQ(src, dst);
            EXPECT_EQ(ote_segment_close(seg), OTE_OK);
        }
        EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
        EXPECT_EQ(t.Quit(), 0);
        return name;
    }
};

TEST_F(RoutingTest, TcpOnlyTargetAndShmTcpRequesterInteroperateOverTcp) {
    EXPECT_EQ(OpenAndMove({}, {"OTE_TRANSPORTS=tcp"}), "tcp");
}

TEST_F(RoutingTest, TcpOnlyRequesterAndShmTcpTargetInteroperateOverTcp) {
    EXPECT_EQ(OpenAndMove({{"transports", "tcp"}}, {}), "tcp");
    EXPECT_EQ(OpenAndMove({{"transport", "tcp"}}, {}), "tcp");
}

TEST_F(RoutingTest, PeerOfAnotherHostGetsTcp) {
    // The test hook makes the target's boot id differ: another host as far as shm knows.
    EXPECT_EQ(OpenAndMove({}, {"OTE_TEST_HOST_SUFFIX=-elsewhere"}), "tcp");
}

TEST_F(RoutingTest, ShmOnlyEngineUsesShm) {
    EXPECT_EQ(OpenAndMove({{"transports", "shm"}}, {}), "shm");
    EXPECT_EQ(OpenAndMove({{"transports", "tcp,shm"}}, {}), "tcp"); // the requester's order
}

// Whether this process may start a child as uid 65534 (root outside a user namespace
// that maps only root).
bool CanRunAsNobody() {
    if (getuid() != 0) return false;
    pid_t pid = fork();
    if (pid == 0) _exit(setgid(65534) == 0 && setuid(65534) == 0 ? 0 : 1);
    int status = 0;
    return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
           WEXITSTATUS(status) == 0;
}

TEST_F(RoutingTest, PeerOfAnotherUidGetsTheRing) {
    if (!CanRunAsNobody())
        GTEST_SKIP() << "cannot start a process as uid 65534 here (not root, or a user "
                        "namespace that maps only root): the other-uid case is not shown";
    // Cross-memory attach needs one uid; the source sees the requester's uid differ and
    // takes the shared ring the HELLO carries, before any transfer.
    ote_log_level_t old = ote_log_level();
    ote_log_set_level(OTE_LOG_INFO);
    EXPECT_EQ(OpenAndMove({}, {"OTE_TARGET_UID=65534"}), "shm");
    ote_log_set_level(old);
    EXPECT_TRUE(LogContains("shared ring"));
}

TEST_F(RoutingTest, NoCommonTransportFailsNamingBothLists) {
    Target t;
    ASSERT_TRUE(t.Start(8u << 20, "127.0.0.1:0", {"OTE_TRANSPORTS=tcp"}));
    ote_engine_t *e = ote_test::NewEngine({{"transports", "shm"}});
    ASSERT_NE(e, nullptr);
    ote_segment_t *seg = nullptr;
    ExpectErrorLogsIn(
        [&] { EXPECT_EQ(ote_segment_open(e, t.address.c_str(), &seg), OTE_ERR_UNSUPPORTED); });
    EXPECT_EQ(seg, nullptr);
    EXPECT_TRUE(LogContains("this engine offers transports=shm, the peer transports=tcp"));
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
    // transports=rdma (over verbs/sim) meeting the tcp-only peer: the same refusal.
    ote_engine_t *r = ote_test::NewEngine({{"transports", "rdma"}, {"verbs_provider", "sim"}});
    ASSERT_NE(r, nullptr);
    ExpectErrorLogsIn(
        [&] { EXPECT_EQ(ote_segment_open(r, t.address.c_str(), &seg), OTE_ERR_UNSUPPORTED); });
    EXPECT_TRUE(LogContains("this engine offers transports=rdma, the peer transports=tcp"));
    EXPECT_EQ(ote_engine_destroy(r), OTE_OK);
    EXPECT_EQ(t.Quit(), 0);
}

} // namespace

// Request-level contracts of <ote/ote.h>, end to end between two processes, on TCP and on
// RDMA over verbs/sim (each test runs for both): a request partly outside a registration
// moves no byte; a peer killed mid-batch ends every unfinished request OTE_ERR_PEER_LOST
// (never CANCELED or FENCED); cancel stops WRITE and READ work not on the wire yet; a
// requester that dies releases the source's pins at once; a range is free to unregister
// the moment the requester saw COMPLETED (its notification arrived); buffer discovery
// follows the target's registrations; and none of this floods the log. Each test prints the figure it observed ("[ figures ]" lines).
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/engine/e2e_fixture.h"
#include "tests/engine/engine_util.h"
#include "tests/util/wait.h"

extern "C" {
#include "base/time.h"
#include "ote/ote.h"
#include "tests/engine/pattern.h"
}

namespace {

using ote_test::kMs;
using ote_test::kSec;

// The contracts hold on every transport: "tcp" and "shm" against the same target (the
// requester's transports list picks one), "rdma" over the software verbs provider.
ote_test::TargetSession SessionFor(const std::string &tp, uint64_t rw_size) {
    ote_test::TargetSession s;
    s.rw_size = rw_size;
    s.target_env = {"OTE_TRANSFER_TIMEOUT_MS=30000"};
    if (tp == "rdma") {
        for (const auto &kv : ote_test::kRdmaTargetEnv) s.target_env.push_back(kv);
        s.config = {
            {"transport", "rdma"}, {"verbs_provider", "sim"}, {"transfer_timeout_ms", "30000"}};
    } else {
        s.config = {{"transports", tp.c_str()}, {"transfer_timeout_ms", "30000"}};
    }
    s.wait_ns = 120 * kSec;
    return s;
}

// UnregisterNeverSucceedsInsideARequest's WRITEs: 16 MiB (16 slices of the default 1 MiB)
// in every configuration. Under TSan 4 MiB saved most of the case's time, but then the
// target's unregister loop met no request in flight in most runs (0 BUSY answers), and
// an unregister racing a request is what the case is for.
constexpr size_t kUnregLen = 16u << 20;
// UnregisterOnTheNotificationSucceeds's requests: 8 MiB, 2 MiB under TSan (still 2 slices).
constexpr size_t kNotifyLen = ote_test::TsanScaled(8u << 20, 4);

// The target's rw for the running test: the bytes its requests lie on. A target maps and
// fills its whole rw when it starts, fresh pages that took about a second per 64 MiB in
// every case under TSan, so a test that uses a few MiB of it (or none) gets no more. A
// test not named here gets 64 MiB; Submit checks that a batch fits.
uint64_t RwSizeFor(const std::string &test) {
    static const std::pair<const char *, uint64_t> kNeeds[] = {
        {"RequestPartlyOutsideARegistrationMovesNoByte/", 4u << 20},
        {"UnregisterNeverSucceedsInsideARequest/", 4 * kUnregLen},
        {"RequestersOwnRegistrationIsBusyWhileARequestUsesIt/", 4u << 20},
        {"CanceledRequestsLeaveNothingPinnedAtTheSource/", 24 * (2u << 20)},
        {"DeadRequesterReleasesTheSourcePinAtOnce/", 4u << 20},
        {"UnregisterOnTheNotificationSucceeds/", 4 * kNotifyLen},
        {"DiscoveredBuffersFollowTheTargetsRegistrations/", 4u << 20},
        {"DiscoveryOfADeadTargetFailsByTheDeadline/", 4u << 20},
    };
    for (const auto &n : kNeeds)
        if (test.rfind(n.first, 0) == 0) return n.second;
    return 64ull << 20;
}

std::string CurrentTest() {
    return ::testing::UnitTest::GetInstance()->current_test_info()->name();
}

class ContractTest : public ote_test::TargetE2eTest,
                     public ::testing::WithParamInterface<std::string> {
  protected:
    explicit ContractTest(uint64_t rw_size = RwSizeFor(CurrentTest()))
        : TargetE2eTest(SessionFor(GetParam(), rw_size)) {}
    const char *Tp() const { return GetParam().c_str(); }
    size_t Warns() {
        size_t n = 0;
        for (const auto &l : Logs())
            if (!l.empty() && l[0] == 'W') n++;
        return n;
    }
    size_t list_size() {
        size_t n = 0;
        EXPECT_EQ(ote_segment_buffers(seg_, nullptr, 0, &n), OTE_ERR_TOO_BIG);
        return n;
    }
    // Submit n requests of len bytes (op), request i at rw + (i % spread) * len and at
    // local + (i % spread) * local_step (spread 0: n). Over rdma requests of one batch never
    // share destination bytes (a WRITE's in rw, a READ's at local unless local_step is 0):
    // two of them may be in flight at once on two devices or lanes, and the sim writes each
    // connection's payload from its own thread, a data race of the test's own making under
    // TSan. (tcp deals one submit's slices round-robin over its 4 connections, each served
    // by one worker: with 1 MiB slices, 16 MiB requests and a spread of 4, slices on the
    // same bytes share a connection; shm has one source thread per connection.)
    ote_batch_t *Submit(ote_opcode_t op, uint8_t *local, size_t len, int n, size_t local_step = 0,
                        int spread = 0) {
        if (spread == 0) spread = n;
        EXPECT_TRUE(spread == n || GetParam() != "rdma") << "shared bytes over rdma";
        EXPECT_LE(spread * len, target_.rw_len) << "requests would run past rw";
        ote_batch_t *b = nullptr;
        EXPECT_EQ(ote_batch_create(engine_, n, &b), OTE_OK);
        if (b == nullptr) return nullptr;
        std::vector<ote_request_t> r;
        for (int i = 0; i < n; i++)
            r.push_back({op, local + (i % spread) * local_step, seg_,
                         target_.rw + (i % spread) * len, len});
        EXPECT_EQ(ote_batch_submit(b, r.data(), r.size()), OTE_OK);
        return b;
    }
};

// Point 2: the source checks the whole request before its first byte moves.
TEST_P(ContractTest, RequestPartlyOutsideARegistrationMovesNoByte) {
    size_t inside = 3u << 20, len = inside + (64u << 10); // the last 64 KiB run past rw
    uint64_t off = target_.rw_len - inside;
    std::vector<uint8_t> buf(len, 0x5A);
    uint64_t before = target_.Hash("rw", off, inside);
    size_t w0 = Warns();
    ote_transfer_status_t ts;
    EXPECT_NE(Transfer(OTE_WRITE, buf.data(), target_.rw + off, len, &ts), OTE_OK);
    EXPECT_EQ(ts.state, OTE_TRANSFER_FAILED);
    EXPECT_EQ(ote_status_code(ts.error), OTE_ERR_ACCESS);
    EXPECT_EQ(ts.bytes_done, 0u);
    EXPECT_EQ(target_.Hash("rw", off, inside), before) << "a refused WRITE wrote into the target";
    std::vector<uint8_t> dst(len, 0xEE);
    EXPECT_NE(Transfer(OTE_READ, dst.data(), target_.rw + off, len, &ts), OTE_OK);
    EXPECT_EQ(ote_status_code(ts.error), OTE_ERR_ACCESS);
    EXPECT_EQ(ts.bytes_done, 0u);
    size_t touched = 0;
    for (uint8_t c : dst) touched += c != 0xEE;
    EXPECT_EQ(touched, 0u) << "a refused READ brought bytes here";
    // Permission: a WRITE that lies inside the read-only buffer (ro, 1 MiB) is refused as a
    // whole for its permission alone (it fails before a byte moves).
    std::vector<uint8_t> small(target_.ro_len / 2, 0x11);
    uint64_t ro_before = target_.Hash("ro", 0, target_.ro_len);
    EXPECT_EQ(ote_status_code(Transfer(OTE_WRITE, small.data(), target_.ro, small.size(), &ts)),
              OTE_ERR_ACCESS);
    EXPECT_EQ(ts.bytes_done, 0u);
    EXPECT_EQ(target_.Hash("ro", 0, target_.ro_len), ro_before);
    size_t warns = Warns() - w0;
    std::printf("[ figures ] %s: refused requests: %zu WARN line(s) here for 3 refused requests\n",
                Tp(), warns);
    EXPECT_LE(warns, 3u) << "refusals flood the log";
    RoundTrip(4096, 0, 0, 5); // the segment still works
}

// Point 1: one pin per request at the source. The target unregisters its buffer again
// and again (registering it again after each success) while WRITEs into it run: an
// unregister may succeed between requests, never inside one, so every request either
// completes or is refused as a whole (OTE_ERR_ACCESS with no byte moved).
TEST_P(ContractTest, UnregisterNeverSucceedsInsideARequest) {
    constexpr int kN = 4, kRounds = 16; // 4 x kUnregLen fill rw: no two share bytes
    size_t len = kUnregLen;
    std::vector<uint8_t> src(len, 5);
    ASSERT_TRUE(target_.Send("unregloop 1500"));
    int completed = 0, refused = 0;
    for (int round = 0; round < kRounds; round++) {
        ote_batch_t *b = Submit(OTE_WRITE, src.data(), len, kN);
        ASSERT_NE(b, nullptr);
        (void)ote_batch_wait(b, 120 * kSec);
        for (int i = 0; i < kN; i++) {
            ote_transfer_status_t ts;
            ASSERT_EQ(ote_batch_status(b, i, &ts), OTE_OK);
            if (ts.state == OTE_TRANSFER_COMPLETED) {
                completed++;
                continue;
            }
            EXPECT_EQ(ts.state, OTE_TRANSFER_FAILED) << round << " " << i;
            EXPECT_EQ(ote_status_code(ts.error), OTE_ERR_ACCESS) << round << " " << i;
            EXPECT_EQ(ts.bytes_done, 0u) << "request " << i << " of round " << round
                                         << " was cut in the middle by an unregister";
            refused++;
        }
        EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    }
    std::string reply = target_.Reply(30000);
    std::printf(
        "[ figures ] %s: unregister loop during %d x %d x %zu MiB WRITEs: %s (ok, busy); "
        "%d completed, %d refused whole\n",
        Tp(), kRounds, kN, len >> 20, reply.c_str(), completed, refused);
    EXPECT_EQ(reply.rfind("ST ", 0), 0u) << reply;
}

// The requester's side of the same rule: a request whose local buffer lies in one of
// this engine's registrations holds it, so ote_memory_unregister of it is BUSY until the
// request ended (a user who frees the memory after an OK unregister must never have it
// read or written afterwards). The target is stopped so that the requests stay pending;
// once it runs again, the unregister that answers OK (it waits up to
// OTE_UNREGISTER_WAIT_MS for the pin) finds every request that used the range ended.
TEST_P(ContractTest, RequestersOwnRegistrationIsBusyWhileARequestUsesIt) {
    const size_t len = 4u << 20;
    for (ote_opcode_t op : {OTE_WRITE, OTE_READ}) {
        SCOPED_TRACE(op == OTE_WRITE ? "WRITE" : "READ");
        std::vector<uint8_t> local(len + 8192, 7);
        uint8_t *reg = local.data() + 4096; // the request uses the registration's middle
        ASSERT_EQ(ote_memory_register(engine_, reg, len, OTE_PERM_READ | OTE_PERM_WRITE), OTE_OK);
        ASSERT_TRUE(target_.Stop());
        // Two requests, each on bytes of its own in the registration's middle.
        ote_batch_t *b = Submit(op, reg + 4096, len / 2 - 4096, 2, len / 2);
        ASSERT_NE(b, nullptr);
        EXPECT_EQ(ote_memory_unregister(engine_, reg), OTE_ERR_BUSY);
        ASSERT_TRUE(target_.Cont());
        // Each ask waits up to OTE_UNREGISTER_WAIT_MS (100 ms) itself; 1200 asks before.
        EXPECT_EQ(ote_test::UnregisterWhenFree(engine_, reg, std::chrono::seconds(120)), OTE_OK);
        for (size_t i = 0; i < 2; i++) {
            ote_transfer_status_t ts;
            ASSERT_EQ(ote_batch_status(b, i, &ts), OTE_OK);
            EXPECT_EQ(ts.state, OTE_TRANSFER_COMPLETED) << "unregister OK under request " << i;
        }
        EXPECT_EQ(ote_batch_wait(b, 120 * kSec), OTE_OK);
        EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    }
}

// A target with 256 MiB in rw (64 MiB under TSan, which moves bytes several times slower
// and fills a target's rw at startup slowly): enough bytes of their own for requests that
// are still moving (over tcp and shm too) when the target dies.
constexpr uint64_t kDeathRw = ote_test::TsanScaled(256ull << 20, 4);
class PeerDeathTest : public ContractTest {
  protected:
    PeerDeathTest() : ContractTest(kDeathRw) {}
};

// Point 3: peer death is reported as OTE_ERR_PEER_LOST, request-scope, from the first cause.
TEST_P(PeerDeathTest, PeerKilledMidBatchEveryUnfinishedRequestEndsPeerLost) {
    constexpr int kN = 64; // 64 x 4 MiB (1 MiB under TSan): every request on rw bytes of its own
    size_t len = kDeathRw / kN;
    std::vector<uint8_t> src(len, 3);
    size_t w0 = Warns();
    ote_batch_t *b = Submit(OTE_WRITE, src.data(), len, kN);
    ASSERT_NE(b, nullptr);
    // Let the first request finish (data is moving), then kill the target: polled every
    // 100 us, since tcp and shm move the whole 256 MiB in a few tens of ms.
    ote_transfer_status_t ts{};
    // Silent: past 20 s the kill comes anyway, with the first request still moving.
    ote_test::PollUntil(
        [&] { return ote_batch_status(b, 0, &ts) != OTE_OK || ts.state != OTE_TRANSFER_PENDING; },
        std::chrono::seconds(20), std::chrono::microseconds(100));
    target_.Kill();
    uint64_t t0 = ote_now_ns();
    ote_status_t st = ote_batch_wait(b, 60 * kSec);
    uint64_t took = ote_now_ns() - t0;
    ASSERT_NE(ote_status_code(st), OTE_ERR_TIMEOUT) << "requests still pending 60 s after the kill";
    int lost = 0, done = 0;
    for (int i = 0; i < kN; i++) {
        ASSERT_EQ(ote_batch_status(b, i, &ts), OTE_OK);
        if (ts.state == OTE_TRANSFER_COMPLETED) {
            done++;
            continue;
        }
        EXPECT_EQ(ts.state, OTE_TRANSFER_FAILED) << i;
        EXPECT_EQ(ote_status_code(ts.error), OTE_ERR_PEER_LOST)
            << i << ": " << ote_status_str(ts.error);
        lost++;
    }
    if (lost > 0) {
        EXPECT_EQ(ote_status_code(st), OTE_ERR_PEER_LOST) << ote_status_str(st);
    }
    EXPECT_LT(took, 25 * kSec) << "peer death waited for the transfer timeout (30 s)";
    size_t warns = Warns() - w0;
    std::printf(
        "[ figures ] %s: SIGKILL mid-batch: %d of %d requests PEER_LOST (%d completed) "
        "%.1f ms after the kill; %zu WARN line(s) here\n",
        Tp(), lost, kN, done, took / 1e6, warns);
    EXPECT_LE(warns, 20u) << "peer death floods the log";
    EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
}

// Point 4: cancel stops what is not on the wire yet, for WRITE and for READ.
TEST_P(ContractTest, CancelStopsWriteAndReadWorkNotOnTheWire) {
    constexpr int kN = 32;
    // 64 MiB, left as the allocator gives it except what the WRITEs send: the canceled
    // READs land in few of these bytes and nothing reads them, so filling all of them was
    // only page faults (a second under TSan).
    std::unique_ptr<uint8_t[]> local(new uint8_t[64u << 20]);
    for (ote_opcode_t op : {OTE_WRITE, OTE_READ}) {
        const char *name = op == OTE_WRITE ? "WRITE" : "READ";
        // WRITEs from one buffer, READs into local bytes as rw's. Over rdma 2 MiB each on
        // bytes of their own; over tcp and shm 16 MiB each on 4 slots (Submit): there the
        // READs' request frames are tiny and 64 MiB of them may all be on the wire before
        // the cancel (seen under TSan), 512 MiB keeps most of them queued.
        const bool rdma = GetParam() == "rdma";
        const size_t len = rdma ? 2u << 20 : 16u << 20;
        if (op == OTE_WRITE) memset(local.get(), 7, len);
        ote_batch_t *b = Submit(op, local.get(), len, kN, op == OTE_WRITE ? 0 : len, rdma ? 0 : 4);
        ASSERT_NE(b, nullptr);
        uint64_t t0 = ote_now_ns();
        ASSERT_EQ(ote_batch_cancel(b), OTE_OK);
        ote_status_t st = ote_batch_wait(b, 120 * kSec);
        uint64_t took = ote_now_ns() - t0;
        ASSERT_NE(ote_status_code(st), OTE_ERR_TIMEOUT) << name;
        int canceled = 0, completed = 0;
        for (int i = 0; i < kN; i++) {
            ote_transfer_status_t ts;
            ASSERT_EQ(ote_batch_status(b, i, &ts), OTE_OK);
            if (ts.state == OTE_TRANSFER_COMPLETED) {
                EXPECT_EQ(ts.bytes_done, len);
                completed++;
                continue;
            }
            EXPECT_EQ(ts.state, OTE_TRANSFER_CANCELED) << name << " " << i;
            EXPECT_EQ(ote_status_code(ts.error), OTE_ERR_CANCELED) << name << " " << i;
            EXPECT_LT(ts.bytes_done, len) << name << " " << i;
            canceled++;
        }
        std::printf(
            "[ figures ] %s: cancel just after submit: %d of %d %s requests CANCELED, "
            "%d completed, batch ended %.1f ms after the cancel\n",
            Tp(), canceled, kN, name, completed, took / 1e6);
        EXPECT_GT(canceled, 0) << name << ": cancel reached nothing";
        if (canceled > 0) {
            EXPECT_EQ(ote_status_code(st), OTE_ERR_CANCELED) << name;
        }
        EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    }
    RoundTrip((1u << 20) + 3, 100, 1, 9); // the segment still works, every byte right
}

// Point 1 with cancel: requests canceled half sent (their first pieces served, the rest
// dropped unsent by the requester) leave no pin at the source: the dropped bytes are
// written off, so the target can unregister the range once the batch has ended.
TEST_P(ContractTest, CanceledRequestsLeaveNothingPinnedAtTheSource) {
    constexpr int kN = 24; // 24 x 2 MiB: every request on rw bytes of its own
    size_t len = 2u << 20;
    std::vector<uint8_t> local(len, 3);
    int partial = 0;
    for (int round = 0; round < 3; round++) {
        ote_batch_t *b = Submit(OTE_WRITE, local.data(), len, kN);
        ASSERT_NE(b, nullptr);
        usleep(2000 * (round + 1)); // let some pieces of the first requests go out
        ASSERT_EQ(ote_batch_cancel(b), OTE_OK);
        ASSERT_NE(ote_status_code(ote_batch_wait(b, 120 * kSec)), OTE_ERR_TIMEOUT);
        for (int i = 0; i < kN; i++) {
            ote_transfer_status_t ts;
            ASSERT_EQ(ote_batch_status(b, i, &ts), OTE_OK);
            partial += ts.state == OTE_TRANSFER_CANCELED && ts.bytes_done > 0;
        }
        EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
        // Every request has ended here: the source must let the range go.
        uint64_t t0 = ote_now_ns();
        EXPECT_TRUE(ote_test::WaitUntil([&] { return target_.Command("unreg rw") == "ST 0"; },
                                        std::chrono::seconds(20),
                                        "the target's rw to unregister: no canceled request "
                                        "pinned"))
            << "round " << round;
        uint64_t took = ote_now_ns() - t0;
        std::printf("[ figures ] %s: cancel round %d: range free %.1f ms after the batch ended\n",
                    Tp(), round, took / 1e6);
        ASSERT_EQ(target_.Command("rereg rw"), "ST 0");
    }
    std::printf("[ figures ] %s: %d request(s) canceled with some bytes moved\n", Tp(), partial);
    RoundTrip((1u << 20) + 5, 100, 1, 11); // the segment still works, every byte right
}

// Point 5: a requester that dies releases what it pinned at the source at once.
TEST_P(ContractTest, DeadRequesterReleasesTheSourcePinAtOnce) {
    // Every READ reads the same 16 MiB: the registration is those bytes (fresh pages that
    // no READ reads only cost page faults, seconds under TSan).
    size_t len = 16u << 20, piece = len;
    void *mem = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(mem, MAP_FAILED);
    memset(mem, 9, len);
    ASSERT_EQ(ote_memory_register(engine_, mem, len, OTE_PERM_READ), OTE_OK);
    // The target becomes a requester: 64 READs of 16 MiB from this engine's buffer.
    std::string cmd = "pull " + ote_test::EngineAddress(engine_) + " " +
                      std::to_string((uintptr_t)mem) + " " + std::to_string(piece) + " 64";
    // STARTED once bytes arrived there: this engine serves the READs (and pins) by then.
    ASSERT_EQ(target_.Command(cmd, 60000), "STARTED");
    ASSERT_TRUE(target_.Stop()); // it can no longer make progress: its pins stay
    ote_status_t st0 = ote_memory_unregister(engine_, mem);
    if (GetParam() == "shm" && st0 == OTE_OK) {
        // Over shm with cross-memory attach the source copies into the stopped requester
        // itself: every READ finished and nothing stays pinned by a requester that stopped.
        std::printf(
            "[ figures ] shm: a stopped requester pins nothing (the source copied "
            "its READs into it)\n");
        target_.Kill();
        munmap(mem, len);
        return;
    }
    EXPECT_EQ(st0, OTE_ERR_BUSY) << "nothing was pinned";
    target_.Kill();
    uint64_t t0 = ote_now_ns();
    ote_status_t st = ote_test::UnregisterWhenFree(engine_, mem, std::chrono::seconds(60));
    uint64_t took = ote_now_ns() - t0;
    EXPECT_EQ(st, OTE_OK);
    std::printf(
        "[ figures ] %s: requester SIGKILLed mid-READ: source pin released %.1f ms "
        "after the kill (transfer_timeout 30000 ms)\n",
        Tp(), took / 1e6);
    EXPECT_LT(took, 15 * kSec) << "the pins waited for the transfer timeout";
    if (st != OTE_OK) (void)ote_memory_unregister(engine_, mem);
    munmap(mem, len);
}

// Point 6: a range is free again once the requester saw COMPLETED: the target unregisters
// the moment the batch's notification arrives, and that succeeds every time.
TEST_P(ContractTest, UnregisterOnTheNotificationSucceeds) {
    size_t len = kNotifyLen;
    // Each request on bytes of its own: a READ into the buffer that a WRITE in flight
    // sends from (or another READ fills) would race.
    std::vector<uint8_t> src(4 * len);
    ote_pattern_fill(src.data(), src.size(), 77, 0);
    for (int round = 0; round < 5; round++) {
        ote_batch_t *b = nullptr;
        ASSERT_EQ(ote_batch_create(engine_, 4, &b), OTE_OK);
        ASSERT_TRUE(target_.Send("recvunreg 30000"));
        std::vector<ote_request_t> r;
        for (int i = 0; i < 4; i++)
            r.push_back({i % 2 ? OTE_READ : OTE_WRITE, src.data() + (uint64_t)i * len, seg_,
                         target_.rw + (uint64_t)i * len, len});
        ASSERT_EQ(ote_batch_submit(b, r.data(), r.size()), OTE_OK);
        ASSERT_EQ(ote_batch_notify(b, seg_, "done", 4), OTE_OK);
        ASSERT_EQ(ote_batch_wait(b, 60 * kSec), OTE_OK);
        EXPECT_EQ(target_.Reply(), "ST 0 0") << "round " << round;
        EXPECT_EQ(target_.Command("rereg rw"), "ST 0");
        EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    }
}

// Buffer discovery (ote_segment_buffers) over every transport: the target's named buffers
// as it registered them; one unregistered disappears on the next call and comes back
// when registered again; a transfer by name lands; the discovered address used after
// the target unregistered it fails OTE_ERR_ACCESS and touches nothing; a cap too small
// says how many are needed.
TEST_P(ContractTest, DiscoveredBuffersFollowTheTargetsRegistrations) {
    auto list = [&]() {
        std::vector<ote_buffer_info_t> out(16);
        size_t n = 0;
        EXPECT_EQ(ote_segment_buffers(seg_, out.data(), out.size(), &n), OTE_OK);
        out.resize(n);
        return out;
    };
    auto find = [](const std::vector<ote_buffer_info_t> &l, const char *name) {
        for (const auto &b : l)
            if (std::strcmp(b.name, name) == 0) return b;
        return ote_buffer_info_t{};
    };
    auto l = list();
    ASSERT_EQ(l.size(), 3u);
    const struct {
        const char *name;
        uint64_t addr, len;
        unsigned perms;
    } want[] = {{"rw", target_.rw, target_.rw_len, OTE_PERM_READ | OTE_PERM_WRITE},
                {"ro", target_.ro, target_.ro_len, OTE_PERM_READ},
                {"wo", target_.wo, target_.wo_len, OTE_PERM_WRITE}};
    for (const auto &w : want) {
        ote_buffer_info_t b = find(l, w.name);
        EXPECT_EQ(b.addr, w.addr) << w.name;
        EXPECT_EQ(b.length, w.len) << w.name;
        EXPECT_EQ(b.perms, w.perms) << w.name;
        EXPECT_EQ(b.kind, (uint32_t)OTE_MEM_HOST) << w.name;
    }
    size_t n = 0;
    std::vector<ote_buffer_info_t> two(2);
    EXPECT_EQ(ote_segment_buffers(seg_, two.data(), two.size(), &n), OTE_ERR_TOO_BIG);
    EXPECT_EQ(n, 3u);

    // A WRITE into "wo" found by name: the bytes are there.
    ote_buffer_info_t wo = find(l, "wo");
    ASSERT_NE(wo.addr, 0u);
    std::vector<uint8_t> src(wo.length / 2);
    ote_pattern_fill(src.data(), src.size(), 77, 0);
    ASSERT_EQ(Transfer(OTE_WRITE, src.data(), wo.addr + 100, src.size()), OTE_OK);
    EXPECT_EQ(target_.Hash("wo", 100, src.size()), ote_hash(src.data(), src.size()));

    // The target unregisters "wo": gone from the next list; the stale address is refused.
    ASSERT_EQ(target_.Command("unreg wo"), "ST 0");
    l = list();
    EXPECT_EQ(l.size(), 2u);
    EXPECT_EQ(find(l, "wo").addr, 0u) << "an unregistered buffer is still listed";
    uint64_t before = target_.Hash("wo", 0, target_.wo_len);
    std::vector<uint8_t> other(64u << 10, 0x6B);
    ote_transfer_status_t ts;
    EXPECT_NE(Transfer(OTE_WRITE, other.data(), wo.addr, other.size(), &ts), OTE_OK);
    EXPECT_EQ(ote_status_code(ts.error), OTE_ERR_ACCESS) << ote_status_str(ts.error);
    EXPECT_EQ(ts.bytes_done, 0u);
    EXPECT_EQ(target_.Hash("wo", 0, target_.wo_len), before) << "a stale WRITE landed";
    // Registered again: listed again, and usable.
    ASSERT_EQ(target_.Command("rereg wo"), "ST 0");
    l = list();
    EXPECT_EQ(l.size(), 3u);
    EXPECT_EQ(find(l, "wo").addr, target_.wo);
    EXPECT_EQ(Transfer(OTE_WRITE, other.data(), target_.wo, other.size()), OTE_OK);
    EXPECT_EQ(target_.Hash("wo", 0, other.size()), ote_hash(other.data(), other.size()));
}

// A target that died: the next listing fails with a peer-scope status, by its deadline.
TEST_P(ContractTest, DiscoveryOfADeadTargetFailsByTheDeadline) {
    ASSERT_EQ(list_size(), 3u);
    target_.Kill();
    std::vector<ote_buffer_info_t> out(4);
    size_t n = 999;
    uint64_t t0 = ote_now_ns();
    ote_status_t st = ote_segment_buffers(seg_, out.data(), out.size(), &n);
    uint64_t took = ote_now_ns() - t0;
    int code = ote_status_code(st);
    EXPECT_TRUE(code == OTE_ERR_CONNECT || code == OTE_ERR_PEER_LOST || code == OTE_ERR_TIMEOUT)
        << ote_status_str(st);
    EXPECT_EQ(n, 999u);
    EXPECT_LT(took, 60 * kSec);
    std::printf("[ figures ] %s: listing a dead target: %s after %.1f ms\n", Tp(),
                ote_status_str(st), took / 1e6);
}

INSTANTIATE_TEST_SUITE_P(Transports, ContractTest,
                         ::testing::Values(std::string("tcp"), std::string("shm"),
                                           std::string("rdma")),
                         [](const ::testing::TestParamInfo<std::string> &i) { return i.param; });

INSTANTIATE_TEST_SUITE_P(Transports, PeerDeathTest,
                         ::testing::Values(std::string("tcp"), std::string("shm"),
                                           std::string("rdma")),
                         [](const ::testing::TestParamInfo<std::string> &i) { return i.param; });

} // namespace

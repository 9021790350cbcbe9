// Striping over several NICs, over verbs/sim with two devices whose ports are each limited
// to the same egress rate (the sim's bw=, on both sides): this process is the requester,
// the target runs in a child process. One 64 MiB WRITE and its READ back (64 MiB rather
// than 256 MiB to keep the sim's run short on the 2-core build machines; the bench gives
// the precise figure) are spread over both NICs: bytes land intact, each NIC carries a
// non-zero, roughly equal share (ote_engine_nic_stats), and in the same run an engine
// restricted to one NIC (rdma_devices=sim0) is at least 1.4x slower for the same
// request: a same-run ratio with a wide margin under the ideal 2x, of the best of
// kTimings runs on each side (one run of 0.3 s over two NICs could lose a tenth of a
// second to a loaded 2-core machine under ASan: 1.38x was seen once in three runs).
// Failover: the requester's sim1 port taken down mid-transfer (READ completes on sim0,
// an in-flight WRITE is not replayed), then up again: it carries traffic again; a missed
// PORT_ACTIVE event (verbs/fault swallowing async events) recovered by the monitor's
// periodic refresh. Late devices: the requester's sim1 down at creation while sim0 is up
// joins once its port comes up; a target whose sim1 is down at creation serves the
// requester's sim1 pairs on its sim0, and on the device itself once it comes up.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "tests/engine/e2e_fixture.h"
#include "tests/engine/engine_util.h"
#include "tests/util/wait.h"

extern "C" {
#include "base/time.h"
#include "engine/rdma/test_hook.h"
#include "ote/ote.h"
#include "tests/engine/pattern.h"
#include "verbs/fault.h"
#include "verbs/sim/sim.h"
}

#include <thread>

namespace {

using ote_test::kSec;
using ote_test::WaitUntil;

constexpr uint64_t kLen = 64ull << 20;
constexpr int kTimings = 3; // runs of each timed request; the fastest counts
// Two sim devices (the default's GIDs), each port limited to 100 MB/s of egress.
const char kLimited[] =
    "dev=sim0,numa=0;port,bw=100M;gid=auto-ll,type=v1;gid=auto-ll,type=v2;gid=auto-v4,type=v1;"
    "gid=auto-v4,type=v2;dev=sim1,numa=1;port,bw=100M;gid=auto-ll,type=v1;gid=auto-ll,type=v2;"
    "gid=auto-v4,type=v1;gid=auto-v4,type=v2";

// Sets OTE_SIM_CONFIG for this process before the fixture creates its engine.
struct SimEnv {
    SimEnv() { setenv("OTE_SIM_CONFIG", kLimited, 1); }
    ~SimEnv() { unsetenv("OTE_SIM_CONFIG"); }
};

ote_test::TargetSession Session() {
    ote_test::TargetSession s;
    s.rw_size = kLen;
    s.target_env = ote_test::kRdmaTargetEnv;
    s.target_env.push_back(std::string("OTE_SIM_CONFIG=") + kLimited);
    s.config = {
        {"transport", "rdma"}, {"verbs_provider", "sim"}, {"transfer_timeout_ms", "120000"}};
    s.wait_ns = 180 * kSec;
    return s;
}

class RdmaStripeTest : private SimEnv, public ote_test::TargetE2eTest {
  protected:
    RdmaStripeTest() : TargetE2eTest(Session()) {}

    static std::vector<ote_nic_stats_t> Nics(ote_engine_t *e) {
        std::vector<ote_nic_stats_t> v(8);
        size_t n = 0;
        EXPECT_EQ(ote_engine_nic_stats(e, v.data(), v.size(), &n), OTE_OK);
        v.resize(n < v.size() ? n : v.size());
        return v;
    }

    // One request of kLen bytes on seg (op), waited for; returns its wall time.
    static uint64_t Timed(ote_engine_t *e, ote_segment_t *seg, ote_opcode_t op, void *local,
                          uint64_t remote) {
        ote_batch_t *b = nullptr;
        EXPECT_EQ(ote_batch_create(e, 1, &b), OTE_OK);
        ote_request_t r = {op, local, seg, remote, kLen};
        uint64_t t0 = ote_now_ns();
        EXPECT_EQ(ote_batch_submit(b, &r, 1), OTE_OK);
        EXPECT_EQ(ote_batch_wait(b, ote_deadline_after(180 * kSec)), OTE_OK);
        uint64_t ns = ote_now_ns() - t0;
        ote_transfer_status_t ts;
        EXPECT_EQ(ote_batch_status(b, 0, &ts), OTE_OK);
        EXPECT_EQ(ts.state, OTE_TRANSFER_COMPLETED);
        EXPECT_EQ(ts.bytes_done, kLen);
        EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
        return ns;
    }
};

TEST_F(RdmaStripeTest, OneRequestSpreadOverTwoLimitedNicsRunsFaster) {
    std::vector<uint8_t> src(kLen), dst(kLen, 0);
    ote_pattern_fill(src.data(), kLen, 77, 0);
    ASSERT_EQ(ote_memory_register(engine_, src.data(), kLen, OTE_PERM_READ), OTE_OK);
    ASSERT_EQ(ote_memory_register(engine_, dst.data(), kLen, OTE_PERM_WRITE), OTE_OK);
    auto before = Nics(engine_);
    ASSERT_EQ(before.size(), 2u) << "both sim devices are data devices";
    size_t need = 0;
    ote_nic_stats_t small[1];
    small[0].bytes_out = 12345;
    EXPECT_EQ(ote_engine_nic_stats(engine_, small, 1, &need), OTE_ERR_TOO_BIG);
    EXPECT_EQ(need, 2u);
    EXPECT_EQ(small[0].bytes_out, 12345u) << "out touched on failure";
    EXPECT_STREQ(before[0].name, "sim0");
    EXPECT_STREQ(before[1].name, "sim1");
    EXPECT_STREQ(before[0].transport, "rdma");
    EXPECT_TRUE(before[0].active && before[1].active);

    // Striped: WRITE, checked at the target, and READ back, checked here.
    uint64_t w2 = Timed(engine_, seg_, OTE_WRITE, src.data(), target_.rw);
    EXPECT_EQ(target_.Hash("rw", 0, kLen), ote_hash(src.data(), kLen));
    auto mid = Nics(engine_);
    uint64_t r2 = Timed(engine_, seg_, OTE_READ, dst.data(), target_.rw);
    EXPECT_EQ(memcmp(dst.data(), src.data(), kLen), 0);
    auto after = Nics(engine_);
    ASSERT_EQ(after.size(), 2u);
    uint64_t w[2], all[2];
    for (int i = 0; i < 2; i++) {
        w[i] = mid[i].bytes_out - before[i].bytes_out;
        all[i] = after[i].bytes_out - before[i].bytes_out;
    }
    EXPECT_EQ(w[0] + w[1], kLen);
    EXPECT_EQ(all[0] + all[1], 2 * kLen);
    // A device takes a run of up to rdma_grant_max (16 MiB, a quarter of the request) at
    // a time, so a share is a multiple of a quarter: each NIC takes at least one run of
    // each request (a loaded machine may give one NIC three of the four).
    for (int i = 0; i < 2; i++) {
        EXPECT_GE(w[i], kLen / 4) << "NIC " << i << " carried " << w[i] << " of the WRITE";
        EXPECT_GE(all[i], 2 * kLen / 4) << "NIC " << i << " carried " << all[i];
    }
    for (int k = 1; k < kTimings; k++) { // the fastest of kTimings runs counts
        w2 = std::min(w2, Timed(engine_, seg_, OTE_WRITE, src.data(), target_.rw));
        r2 = std::min(r2, Timed(engine_, seg_, OTE_READ, dst.data(), target_.rw));
    }
    EXPECT_EQ(memcmp(dst.data(), src.data(), kLen), 0);

    // The same requests from an engine that may use sim0 alone.
    ote_engine_t *one = ote_test::NewEngine({{"transport", "rdma"},
                                             {"verbs_provider", "sim"},
                                             {"transfer_timeout_ms", "120000"},
                                             {"rdma_devices", "sim0"}});
    ASSERT_NE(one, nullptr);
    ASSERT_EQ(Nics(one).size(), 1u);
    ASSERT_EQ(ote_memory_register(one, src.data(), kLen, OTE_PERM_READ), OTE_OK);
    ASSERT_EQ(ote_memory_register(one, dst.data(), kLen, OTE_PERM_WRITE), OTE_OK);
    ote_segment_t *seg1 = nullptr;
    ASSERT_EQ(ote_segment_open(one, target_.address.c_str(), &seg1), OTE_OK);
    std::memset(dst.data(), 0, kLen);
    uint64_t w1 = UINT64_MAX, r1 = UINT64_MAX;
    for (int k = 0; k < kTimings; k++) {
        w1 = std::min(w1, Timed(one, seg1, OTE_WRITE, src.data(), target_.rw));
        r1 = std::min(r1, Timed(one, seg1, OTE_READ, dst.data(), target_.rw));
    }
    EXPECT_EQ(memcmp(dst.data(), src.data(), kLen), 0);
    EXPECT_EQ(Nics(one)[0].bytes_out, 2 * kTimings * kLen);
    EXPECT_EQ(ote_segment_close(seg1), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(one, src.data()), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(one, dst.data()), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(one), OTE_OK);

    double wr = (double)w1 / (double)w2, rr = (double)r1 / (double)r2;
    printf(
        "64 MiB over 2 NICs at 100 MB/s each (best of %d): WRITE %.1f MB/s (one NIC %.1f MB/s, "
        "%.2fx), "
        "READ %.1f MB/s (one NIC %.1f MB/s, %.2fx); WRITE bytes per NIC %llu / %llu, READ %llu / "
        "%llu\n",
        kTimings, kLen / (w2 / 1e9) / 1e6, kLen / (w1 / 1e9) / 1e6, wr, kLen / (r2 / 1e9) / 1e6,
        kLen / (r1 / 1e9) / 1e6, rr, (unsigned long long)w[0], (unsigned long long)w[1],
        (unsigned long long)(all[0] - w[0]), (unsigned long long)(all[1] - w[1]));
    // The ports' 100 MB/s shaping bounds these runs only where the CPUs keep up: under TSan
    // the sim itself is slower than two shaped ports on a loaded machine (READ 1.25x seen
    // in CI at 112 MB/s), so there the figure is printed and the byte split above is the
    // check.
    if (!ote_test::kUnderTsan) {
        EXPECT_GE(wr, 1.4) << "WRITE over two NICs vs one";
        EXPECT_GE(rr, 1.4) << "READ over two NICs vs one";
    }
    EXPECT_EQ(ote_memory_unregister(engine_, src.data()), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(engine_, dst.data()), OTE_OK);
}

// ---- failover: the requester's sim1 port goes down mid-transfer and comes back ----

ote_verbs_t *g_sim = nullptr;   // the requester engine's sim instance
ote_verbs_t *g_fault = nullptr; // its fault decorator, when g_wrap
bool g_wrap = false;
ote_status_t KeepSim(ote_verbs_t **v) {
    g_sim = *v;
    if (!g_wrap) return OTE_OK;
    ote_status_t st = ote_verbs_fault_wrap(*v, OTE_VERBS_FAULT_OWN_INNER, &g_fault);
    if (st == OTE_OK) *v = g_fault;
    return st;
}
// Captures the sim of the engine the fixture creates (set before it, cleared after).
struct SimHook {
    SimHook() { ote__rdma_test_verbs_hook = KeepSim; }
};

class RdmaFailoverTest : private SimEnv, private SimHook, public ote_test::TargetE2eTest {
  protected:
    RdmaFailoverTest() : TargetE2eTest(Session()) {}
    void SetUp() override {
        ote_test::TargetE2eTest::SetUp();
        ote__rdma_test_verbs_hook = nullptr;
        ASSERT_NE(g_sim, nullptr);
        ASSERT_TRUE(ote_sim_is_sim(g_sim));
    }
    void TearDown() override {
        ote__rdma_test_verbs_hook = nullptr;
        if (g_fault != nullptr) ote_verbs_fault_clear(g_fault);
        ote_test::TargetE2eTest::TearDown();
        g_sim = nullptr;
        g_fault = nullptr;
        g_wrap = false;
    }
    uint64_t Sim1Bytes() {
        std::vector<ote_nic_stats_t> v(4);
        size_t n = 0;
        EXPECT_EQ(ote_engine_nic_stats(engine_, v.data(), v.size(), &n), OTE_OK);
        return n >= 2 ? v[1].bytes_out : 0;
    }
    bool Sim1Active() {
        std::vector<ote_nic_stats_t> v(4);
        size_t n = 0;
        EXPECT_EQ(ote_engine_nic_stats(engine_, v.data(), v.size(), &n), OTE_OK);
        return n >= 2 && v[1].active;
    }
    uint64_t Sim1Tx() {
        uint64_t n = 0;
        EXPECT_EQ(ote_sim_port_tx_bytes(g_sim, "sim1", 1, &n), OTE_OK);
        return n;
    }
    // Submits one kLen request, takes sim1's port down once some bytes moved, waits.
    // A READ: once a quarter of the request is done. A WRITE: once sim1 sent an eighth of
    // it (half of its first grant of up to 16 MiB, which a grant completes as a whole), so
    // that a WRITE is on the wire on sim1 when its port goes down.
    ote_transfer_status_t DownMidway(ote_opcode_t op, void *local) {
        ote_batch_t *b = nullptr;
        EXPECT_EQ(ote_batch_create(engine_, 1, &b), OTE_OK);
        ote_request_t r = {op, local, seg_, target_.rw, kLen};
        uint64_t tx0 = Sim1Tx();
        EXPECT_EQ(ote_batch_submit(b, &r, 1), OTE_OK);
        ote_transfer_status_t ts = {};
        WaitUntil(
            [&] { // some bytes done, not all
                EXPECT_EQ(ote_batch_status(b, 0, &ts), OTE_OK);
                if (ts.state != OTE_TRANSFER_PENDING) return true;
                return op == OTE_READ ? ts.bytes_done >= kLen / 4 : Sim1Tx() - tx0 >= kLen / 8;
            },
            std::chrono::seconds(60), "the request part way through");
        EXPECT_EQ(ts.state, OTE_TRANSFER_PENDING) << "the request ended before the port went down";
        EXPECT_EQ(ote_sim_set_port_state(g_sim, "sim1", 1, IBV_PORT_DOWN), OTE_OK);
        (void)ote_batch_wait(b, ote_deadline_after(120 * kSec));
        EXPECT_EQ(ote_batch_status(b, 0, &ts), OTE_OK);
        EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
        return ts;
    }
    // sim1 up again: the monitor puts it back (event or periodic refresh).
    void UpAndBack() {
        ASSERT_EQ(ote_sim_set_port_state(g_sim, "sim1", 1, IBV_PORT_ACTIVE), OTE_OK);
        ASSERT_TRUE(
            WaitUntil([&] { return Sim1Active(); }, std::chrono::seconds(30), "sim1 to come back"));
    }
};

// READ: the slices queued behind sim1's window move to sim0, the ones in flight on sim1
// when it went down run again on sim0 (a READ is safe to repeat); the request completes
// with every byte. sim1 comes back and carries the next request's slices.
TEST_F(RdmaFailoverTest, ReadCompletesOnTheOtherNicAndThePortComesBack) {
    ote_test::ErrorLogsExpected lost; // the lost QPs' flushes may log
    std::vector<uint8_t> src(kLen), dst(kLen, 0);
    ote_pattern_fill(src.data(), kLen, 91, 0);
    ASSERT_EQ(Transfer(OTE_WRITE, src.data(), target_.rw, kLen), OTE_OK);
    ASSERT_EQ(ote_memory_register(engine_, dst.data(), kLen, OTE_PERM_WRITE), OTE_OK);
    uint64_t sim1_before = Sim1Bytes();
    ote_transfer_status_t ts = DownMidway(OTE_READ, dst.data());
    EXPECT_EQ(ts.state, OTE_TRANSFER_COMPLETED) << ote_status_str(ts.error);
    EXPECT_EQ(ts.bytes_done, kLen);
    EXPECT_EQ(memcmp(dst.data(), src.data(), kLen), 0);
    EXPECT_FALSE(Sim1Active());
    uint64_t sim1_down = Sim1Bytes();
    // It went down a quarter into the request: it finished at most two of the four runs
    // (one more than the quarter, if this thread was slow to see it).
    EXPECT_LE(sim1_down - sim1_before, kLen / 2) << "sim1 carried more than its half";
    ASSERT_NO_FATAL_FAILURE(UpAndBack());
    std::memset(dst.data(), 0, kLen);
    ASSERT_EQ(Transfer(OTE_READ, dst.data(), target_.rw, kLen), OTE_OK);
    EXPECT_EQ(memcmp(dst.data(), src.data(), kLen), 0);
    EXPECT_GE(Sim1Bytes() - sim1_down, kLen / 4) << "sim1 carries traffic again";
    EXPECT_EQ(ote_memory_unregister(engine_, dst.data()), OTE_OK);
}

// WRITE: a slice in flight on sim1 when it went down is never replayed (its WRITE may or
// may not have landed): the request fails; the slices not started yet went to sim0. Once
// sim1 is back a WRITE runs on both NICs and lands whole.
TEST_F(RdmaFailoverTest, WriteInFlightIsNotReplayedAndThePortComesBack) {
    ote_test::ErrorLogsExpected lost;
    std::vector<uint8_t> src(kLen);
    ote_pattern_fill(src.data(), kLen, 92, 0);
    ASSERT_EQ(ote_memory_register(engine_, src.data(), kLen, OTE_PERM_READ), OTE_OK);
    ote_transfer_status_t ts = DownMidway(OTE_WRITE, src.data());
    EXPECT_EQ(ts.state, OTE_TRANSFER_FAILED);
    EXPECT_LT(ts.bytes_done, kLen);
    EXPECT_NE(ote_status_code(ts.error), OTE_OK);
    ASSERT_NO_FATAL_FAILURE(UpAndBack());
    uint64_t sim1_up = Sim1Bytes();
    ASSERT_EQ(Transfer(OTE_WRITE, src.data(), target_.rw, kLen), OTE_OK);
    EXPECT_EQ(target_.Hash("rw", 0, kLen), ote_hash(src.data(), kLen));
    EXPECT_GE(Sim1Bytes() - sim1_up, kLen / 4) << "sim1 carries traffic again";
    EXPECT_EQ(ote_memory_unregister(engine_, src.data()), OTE_OK);
}

// The requester's provider under verbs/fault, so that its async events can be lost.
struct WrapFirst {
    WrapFirst() { g_wrap = true; }
};
class RdmaMissedEventTest : private WrapFirst, public RdmaFailoverTest {};

// sim1 goes down (PORT_ERR delivered), then every get_async_event finds nothing (EAGAIN:
// the PORT_ACTIVE event is never seen) while it comes back: the monitor's periodic
// ote_context_refresh alone brings it back, and it carries traffic again.
TEST_F(RdmaMissedEventTest, PeriodicRefreshRecoversAMissedPortActive) {
    ASSERT_NE(g_fault, nullptr);
    ASSERT_EQ(ote_sim_set_port_state(g_sim, "sim1", 1, IBV_PORT_DOWN), OTE_OK);
    ASSERT_TRUE(
        WaitUntil([&] { return !Sim1Active(); }, std::chrono::seconds(30), "sim1 seen down"));
    ASSERT_EQ(ote_verbs_fault_fail(g_fault, OTE_VERBS_FAULT_OP_GET_ASYNC_EVENT, OTE_FAULT_EVERY, 0,
                                   EAGAIN),
              OTE_OK);
    uint64_t swallowed = ote_verbs_fault_injected(g_fault, OTE_VERBS_FAULT_OP_GET_ASYNC_EVENT);
    ASSERT_NO_FATAL_FAILURE(UpAndBack());
    EXPECT_GT(ote_verbs_fault_injected(g_fault, OTE_VERBS_FAULT_OP_GET_ASYNC_EVENT), swallowed)
        << "the monitor did not look for events while sim1 came back";
    std::vector<uint8_t> src(kLen);
    ote_pattern_fill(src.data(), kLen, 93, 0);
    uint64_t sim1 = Sim1Bytes();
    ASSERT_EQ(Transfer(OTE_WRITE, src.data(), target_.rw, kLen), OTE_OK);
    EXPECT_EQ(target_.Hash("rw", 0, kLen), ote_hash(src.data(), kLen));
    EXPECT_GE(Sim1Bytes() - sim1, kLen / 4) << "sim1 carries traffic again";
}

// rdma_devices / rdma_exclude choose the data devices; none left: OTE_ERR_NO_DEVICE.
class RdmaDeviceLists : public ote_test::OteTest {};

TEST_F(RdmaDeviceLists, AllowAndDenyListsChooseTheDataDevices) {
    auto names = [](ote_engine_t *e) {
        std::vector<ote_nic_stats_t> v(8);
        size_t n = 0;
        EXPECT_EQ(ote_engine_nic_stats(e, v.data(), v.size(), &n), OTE_OK);
        std::string all;
        for (size_t i = 0; i < n; i++) all += std::string(i ? "," : "") + v[i].name;
        return all;
    };
    const ote_test::ConfigKv base = {{"transport", "rdma"}, {"verbs_provider", "sim"}};
    struct Case {
        const char *key, *value, *want;
    } cases[] = {
        {"rdma_exclude", "sim1", "sim0"}, {"rdma_exclude", "sim0, nosuch", "sim1"},
        {"rdma_devices", "sim1", "sim1"}, {"rdma_devices", "sim0,sim1", "sim0,sim1"},
        {"rdma_device", "sim1", "sim1"},  {"rdma_devices", ",sim1,, ,", "sim1"},
    };
    for (const Case &c : cases) {
        ote_test::ConfigKv kv = base;
        kv.push_back({c.key, c.value});
        ote_engine_t *e = ote_test::NewEngine(kv);
        ASSERT_NE(e, nullptr) << c.key << "=" << c.value;
        EXPECT_EQ(names(e), c.want) << c.key << "=" << c.value;
        EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
    }
    // Nothing left: creation fails, naming why (ERROR logged).
    ote_test::ErrorLogsExpected none;
    for (auto kv : {ote_test::ConfigKv{{"rdma_devices", "sim0"}, {"rdma_exclude", "sim0"}},
                    ote_test::ConfigKv{{"rdma_devices", "nosuch"}}}) {
        ote_config_t *cfg = nullptr;
        ASSERT_EQ(ote_config_create(&cfg), OTE_OK);
        for (auto &p : base) ASSERT_EQ(ote_config_set(cfg, p.first, p.second), OTE_OK);
        for (auto &p : kv) ASSERT_EQ(ote_config_set(cfg, p.first, p.second), OTE_OK);
        ote_engine_t *e = nullptr;
        EXPECT_EQ(ote_status_code(ote_engine_create(cfg, &e)), OTE_ERR_NO_DEVICE);
        EXPECT_EQ(e, nullptr);
        ote_config_destroy(cfg);
    }
}

// ---- every port down at creation: the transport starts paused ----

// The requester's sim with both ports taken down before its contexts open (the target,
// another process, keeps its own sim's ports active).
ote_status_t DownSim(ote_verbs_t **v) {
    g_sim = *v;
    for (const char *dev : {"sim0", "sim1"}) {
        ote_status_t st = ote_sim_set_port_state(*v, dev, 1, IBV_PORT_DOWN);
        if (st != OTE_OK) return st;
    }
    return OTE_OK;
}
struct DownHook {
    DownHook() { ote__rdma_test_verbs_hook = DownSim; }
};

class RdmaStartPausedTest : private SimEnv, private DownHook, public ote_test::TargetE2eTest {
  protected:
    RdmaStartPausedTest() : TargetE2eTest(Session()) {}
    void SetUp() override {
        ote_test::TargetE2eTest::SetUp();
        ote__rdma_test_verbs_hook = nullptr;
        ASSERT_NE(g_sim, nullptr);
        ASSERT_TRUE(ote_sim_is_sim(g_sim));
    }
    void TearDown() override {
        ote__rdma_test_verbs_hook = nullptr;
        ote_test::TargetE2eTest::TearDown();
        g_sim = nullptr;
    }
    std::vector<ote_nic_stats_t> Nics() {
        std::vector<ote_nic_stats_t> v(4);
        size_t n = 0;
        EXPECT_EQ(ote_engine_nic_stats(engine_, v.data(), v.size(), &n), OTE_OK);
        v.resize(n < v.size() ? n : v.size());
        return v;
    }
};

// Creation succeeds with both devices paused; a request fails with OTE_ERR_PORT_DOWN (no
// wait past its deadline); once sim0's port comes up the monitor adds it and a WRITE
// lands whole on sim0 while sim1, still down, carries nothing.
TEST_F(RdmaStartPausedTest, RequestsFailUntilAPortComesUpThenRun) {
    std::vector<ote_nic_stats_t> v = Nics();
    ASSERT_EQ(v.size(), 2u);
    EXPECT_FALSE(v[0].active);
    EXPECT_FALSE(v[1].active);
    EXPECT_TRUE(LogContains("starts paused"));
    std::vector<uint8_t> src(kLen);
    ote_pattern_fill(src.data(), kLen, 95, 0);
    ASSERT_EQ(ote_memory_register(engine_, src.data(), kLen, OTE_PERM_READ), OTE_OK);
    ote_transfer_status_t ts = {};
    (void)Transfer(OTE_WRITE, src.data(), target_.rw, kLen, &ts);
    EXPECT_EQ(ts.state, OTE_TRANSFER_FAILED);
    EXPECT_EQ(ote_status_code(ts.error), OTE_ERR_PORT_DOWN) << ote_status_str(ts.error);
    ASSERT_EQ(ote_sim_set_port_state(g_sim, "sim0", 1, IBV_PORT_ACTIVE), OTE_OK);
    ASSERT_TRUE(
        WaitUntil([&] { return Nics()[0].active; }, std::chrono::seconds(30), "sim0 to join"));
    uint64_t sim0 = Nics()[0].bytes_out;
    ASSERT_EQ(Transfer(OTE_WRITE, src.data(), target_.rw, kLen), OTE_OK);
    EXPECT_EQ(target_.Hash("rw", 0, kLen), ote_hash(src.data(), kLen));
    v = Nics();
    EXPECT_GE(v[0].bytes_out - sim0, kLen);
    EXPECT_EQ(v[1].bytes_out, 0u);
    EXPECT_FALSE(v[1].active);
    // The port is up but the selector does not have the device yet: the monitor's device
    // pass (rdma_monitor.c) has not followed the context's state (ci26: a WRITE right
    // after the context turned active ended PORT_DOWN in that gap). The pump puts the
    // device back itself: each WRITE lands.
    const std::string me = ote_test::EngineAddress(engine_);
    const size_t small = 1u << 20;
    for (int i = 0; i < 5; i++) {
        ASSERT_EQ(ote__rdma_test_selector_out(me.c_str(), 0), OTE_OK);
        ote_pattern_fill(src.data(), small, 96 + i, 0);
        ASSERT_EQ(Transfer(OTE_WRITE, src.data(), target_.rw, small), OTE_OK) << i;
        EXPECT_EQ(target_.Hash("rw", 0, small), ote_hash(src.data(), small));
    }
    ote__rdma_test_grants_t g{};
    ASSERT_EQ(ote__rdma_test_grants(me.c_str(), &g), OTE_OK);
    EXPECT_GE(g.sel_resyncs, 1u) << "the monitor put the device back each time";
    EXPECT_EQ(ote_memory_unregister(engine_, src.data()), OTE_OK);
}

// ---- a device whose port is down at creation while another is up ----

// The requester's sim1 port taken down before its contexts open; sim0 stays up (the
// target, another process, keeps its own sim's ports active).
ote_status_t DownSim1(ote_verbs_t **v) {
    g_sim = *v;
    return ote_sim_set_port_state(*v, "sim1", 1, IBV_PORT_DOWN);
}
struct DownSim1Hook {
    DownSim1Hook() { ote__rdma_test_verbs_hook = DownSim1; }
};

class RdmaLateDeviceTest : private SimEnv, private DownSim1Hook, public ote_test::TargetE2eTest {
  protected:
    RdmaLateDeviceTest() : TargetE2eTest(Session()) {}
    void SetUp() override {
        ote_test::TargetE2eTest::SetUp();
        ote__rdma_test_verbs_hook = nullptr;
        ASSERT_NE(g_sim, nullptr);
        ASSERT_TRUE(ote_sim_is_sim(g_sim));
    }
    void TearDown() override {
        ote__rdma_test_verbs_hook = nullptr;
        ote_test::TargetE2eTest::TearDown();
        g_sim = nullptr;
    }
    std::vector<ote_nic_stats_t> Nics() {
        std::vector<ote_nic_stats_t> v(4);
        size_t n = 0;
        EXPECT_EQ(ote_engine_nic_stats(engine_, v.data(), v.size(), &n), OTE_OK);
        v.resize(n < v.size() ? n : v.size());
        return v;
    }
};

// sim1 is a data device from the start, paused: traffic runs on sim0 alone; once sim1's
// port comes up it joins (the monitor), and within a deadline bytes flow on it too, every
// byte checked at both ends.
TEST_F(RdmaLateDeviceTest, DeviceDownAtCreationJoinsWhenItsPortComesUp) {
    std::vector<ote_nic_stats_t> v = Nics();
    ASSERT_EQ(v.size(), 2u) << "the paused device is a data device";
    EXPECT_TRUE(v[0].active);
    EXPECT_FALSE(v[1].active);
    std::vector<uint8_t> src(kLen), dst(kLen, 0);
    ote_pattern_fill(src.data(), kLen, 96, 0);
    ASSERT_EQ(ote_memory_register(engine_, src.data(), kLen, OTE_PERM_READ), OTE_OK);
    ASSERT_EQ(ote_memory_register(engine_, dst.data(), kLen, OTE_PERM_WRITE), OTE_OK);
    ASSERT_EQ(Transfer(OTE_WRITE, src.data(), target_.rw, kLen), OTE_OK);
    EXPECT_EQ(target_.Hash("rw", 0, kLen), ote_hash(src.data(), kLen));
    v = Nics();
    EXPECT_GE(v[0].bytes_out, kLen);
    EXPECT_EQ(v[1].bytes_out, 0u);

    ASSERT_EQ(ote_sim_set_port_state(g_sim, "sim1", 1, IBV_PORT_ACTIVE), OTE_OK);
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(
        WaitUntil([&] { return Nics()[1].active; }, std::chrono::seconds(60), "sim1 to join"));
    // Requests until sim1 has carried bytes both ways (the selector spreads each request's
    // slices by load; one request normally suffices), within the same 60 s.
    uint64_t wrote = 0, read = 0; // sim1's bytes of WRITE and of READ requests
    uint64_t seed = 97;
    auto one = [&] {
        ote_pattern_fill(src.data(), kLen, seed, 0);
        seed++;
        uint64_t b0 = Nics()[1].bytes_out;
        ASSERT_EQ(Transfer(OTE_WRITE, src.data(), target_.rw, kLen), OTE_OK);
        EXPECT_EQ(target_.Hash("rw", 0, kLen), ote_hash(src.data(), kLen));
        uint64_t b1 = Nics()[1].bytes_out;
        memset(dst.data(), 0, kLen);
        ASSERT_EQ(Transfer(OTE_READ, dst.data(), target_.rw, kLen), OTE_OK);
        EXPECT_EQ(memcmp(dst.data(), src.data(), kLen), 0);
        wrote += b1 - b0;
        read += Nics()[1].bytes_out - b1;
    };
    WaitUntil(
        [&] {
            one();
            return HasFatalFailure() || (wrote > 0 && read > 0);
        },
        std::chrono::seconds(60) - (std::chrono::steady_clock::now() - t0),
        "sim1 to carry WRITE and READ bytes");
    if (HasFatalFailure()) return;
    EXPECT_GT(wrote, 0u) << "no WRITE byte on sim1 after it joined";
    EXPECT_GT(read, 0u) << "no READ byte on sim1 after it joined";
    EXPECT_EQ(ote_memory_unregister(engine_, src.data()), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(engine_, dst.data()), OTE_OK);
}

// The target's sim1 port is down when its engine is created (its sim config): it is a
// data device there too (advertised in INFO), paused; the requester's sim1 pairs with it
// and the target serves that pair on its active sim0, so both of the requester's NICs
// carry bytes and every byte arrives.
ote_test::TargetSession SessionTargetSim1Down() {
    ote_test::TargetSession s = Session();
    std::string cfg = kLimited;
    size_t at = cfg.find("dev=sim1,numa=1;port,bw=100M");
    cfg.insert(at + strlen("dev=sim1,numa=1;port,bw=100M"), ",state=down");
    s.target_env.pop_back();
    s.target_env.push_back("OTE_SIM_CONFIG=" + cfg);
    return s;
}

// No SimEnv here: the child would inherit this process's OTE_SIM_CONFIG in place of its
// own (the requester keeps the sim's default two devices, unlimited).
class RdmaPeerLateDeviceTest : public ote_test::TargetE2eTest {
  protected:
    RdmaPeerLateDeviceTest() : TargetE2eTest(SessionTargetSim1Down()) {}
};

TEST_F(RdmaPeerLateDeviceTest, PairsWithAPausedDeviceOfThePeerAreServedOnAnActiveOne) {
    std::vector<uint8_t> src(kLen), dst(kLen, 0);
    ote_pattern_fill(src.data(), kLen, 98, 0);
    ASSERT_EQ(ote_memory_register(engine_, src.data(), kLen, OTE_PERM_READ), OTE_OK);
    ASSERT_EQ(ote_memory_register(engine_, dst.data(), kLen, OTE_PERM_WRITE), OTE_OK);
    std::vector<ote_nic_stats_t> v(4);
    size_t n = 0;
    uint64_t seed = 98;
    auto one = [&] {
        ote_pattern_fill(src.data(), kLen, seed, 0);
        seed++;
        ASSERT_EQ(Transfer(OTE_WRITE, src.data(), target_.rw, kLen), OTE_OK);
        EXPECT_EQ(target_.Hash("rw", 0, kLen), ote_hash(src.data(), kLen));
        memset(dst.data(), 0, kLen);
        ASSERT_EQ(Transfer(OTE_READ, dst.data(), target_.rw, kLen), OTE_OK);
        EXPECT_EQ(memcmp(dst.data(), src.data(), kLen), 0);
        ASSERT_EQ(ote_engine_nic_stats(engine_, v.data(), v.size(), &n), OTE_OK);
        ASSERT_EQ(n, 2u);
    };
    WaitUntil(
        [&] {
            one();
            return HasFatalFailure() || (v[0].bytes_out > 0 && v[1].bytes_out > 0);
        },
        std::chrono::seconds(60), "both of the requester's devices to carry bytes");
    if (HasFatalFailure()) return;
    EXPECT_GT(v[0].bytes_out, 0u);
    EXPECT_GT(v[1].bytes_out, 0u) << "the requester's sim1 carried nothing";
    EXPECT_EQ(ote_memory_unregister(engine_, src.data()), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(engine_, dst.data()), OTE_OK);
}

// Both engines in this process (each has its own sim instance): the target's sim1 is down
// at its creation, so it serves the requester's sim1 pairs on its sim0; once its sim1
// comes up, the pairs of the segment already open move back to it (the requester's QPs
// meet one cache miss each and are rebuilt) and, within a deadline, the target's sim1
// serves bytes, every request completing and every byte checked.
ote_verbs_t *g_target_sim = nullptr;
ote_status_t DownTargetSim1(ote_verbs_t **v) {
    g_target_sim = *v;
    return ote_sim_set_port_state(*v, "sim1", 1, IBV_PORT_DOWN);
}

class RdmaPeerDeviceJoinsTest : public ote_test::OteTest {};

TEST_F(RdmaPeerDeviceJoinsTest, ConnectedPeersPairsMoveToTheDeviceThatCameUp) {
    constexpr size_t kBytes = 16u << 20;
    const ote_test::ConfigKv kv = {
        {"transport", "rdma"}, {"verbs_provider", "sim"}, {"transfer_timeout_ms", "60000"}};
    ote__rdma_test_verbs_hook = DownTargetSim1;
    ote_engine_t *target = ote_test::NewEngine(kv);
    ote__rdma_test_verbs_hook = nullptr;
    ASSERT_NE(target, nullptr);
    ASSERT_TRUE(ote_sim_is_sim(g_target_sim));
    ote_engine_t *req = ote_test::NewEngine(kv);
    ASSERT_NE(req, nullptr);
    std::vector<uint8_t> tbuf(kBytes, 0), src(kBytes), dst(kBytes, 0);
    ASSERT_EQ(ote_memory_register(target, tbuf.data(), kBytes, OTE_PERM_READ | OTE_PERM_WRITE),
              OTE_OK);
    ASSERT_EQ(ote_memory_register(req, src.data(), kBytes, OTE_PERM_READ), OTE_OK);
    ASSERT_EQ(ote_memory_register(req, dst.data(), kBytes, OTE_PERM_WRITE), OTE_OK);
    auto nics = [](ote_engine_t *e) {
        std::vector<ote_nic_stats_t> v(4);
        size_t n = 0;
        EXPECT_EQ(ote_engine_nic_stats(e, v.data(), v.size(), &n), OTE_OK);
        v.resize(n < v.size() ? n : v.size());
        return v;
    };
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_segment_open(req, ote_test::EngineAddress(target).c_str(), &seg), OTE_OK);
    const uint64_t remote = (uint64_t)(uintptr_t)tbuf.data();
    auto round = [&](uint64_t seed) {
        ote_pattern_fill(src.data(), kBytes, seed, 0);
        ASSERT_EQ(ote_test::RunOne(req, {OTE_WRITE, src.data(), seg, remote, kBytes}, 120 * kSec),
                  OTE_OK);
        ASSERT_EQ(memcmp(tbuf.data(), src.data(), kBytes), 0);
        memset(dst.data(), 0, kBytes);
        ASSERT_EQ(ote_test::RunOne(req, {OTE_READ, dst.data(), seg, remote, kBytes}, 120 * kSec),
                  OTE_OK);
        ASSERT_EQ(memcmp(dst.data(), src.data(), kBytes), 0);
    };
    auto t = nics(target);
    ASSERT_EQ(t.size(), 2u);
    EXPECT_TRUE(t[0].active);
    EXPECT_FALSE(t[1].active);
    const auto t0 = std::chrono::steady_clock::now();
    uint64_t seed = 200;
    WaitUntil( // until the requester's sim1 has carried bytes (its pairs served on sim0)
        [&] {
            round(seed++);
            return HasFatalFailure() || nics(req)[1].bytes_out > 0;
        },
        std::chrono::seconds(60), "the requester's sim1 to carry bytes");
    t = nics(target);
    EXPECT_GT(nics(req)[1].bytes_out, 0u);
    EXPECT_EQ(t[1].bytes_served, 0u) << "a paused device served";
    EXPECT_GE(t[0].bytes_served, 2 * kBytes);

    ASSERT_EQ(ote_sim_set_port_state(g_target_sim, "sim1", 1, IBV_PORT_ACTIVE), OTE_OK);
    ASSERT_TRUE(WaitUntil([&] { return nics(target)[1].active; },
                          std::chrono::seconds(60) - (std::chrono::steady_clock::now() - t0),
                          "the target's sim1 to join"));
    WaitUntil(
        [&] {
            round(seed++);
            return HasFatalFailure() || nics(target)[1].bytes_served > 0;
        },
        std::chrono::seconds(60), "the target's sim1 to serve bytes");
    EXPECT_GT(nics(target)[1].bytes_served, 0u) << "the target's sim1 served nothing";
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(req, src.data()), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(req, dst.data()), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(target, tbuf.data()), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(target), OTE_OK);
    g_target_sim = nullptr;
}

// ---- rdma_pin / rdma_lanes ----

// Raises the log level to INFO while alive (the engine logs each data device's route and
// lane count at INFO when it starts), restoring the previous level after.
struct InfoLogs {
    InfoLogs() : prev(ote_log_level()) { ote_log_set_level(OTE_LOG_INFO); }
    ~InfoLogs() { ote_log_set_level(prev); }
    ote_log_level_t prev;
};

// The requester pinned to sim1's port 1, GID index 3, with one lane per device (the
// target keeps its defaults: automatic route, two lanes).
ote_test::TargetSession PinSession() {
    ote_test::TargetSession s = Session();
    s.config.push_back({"rdma_pin", "sim1:1:3"});
    s.config.push_back({"rdma_lanes", "1"});
    return s;
}

class RdmaPinTest : private SimEnv, private InfoLogs, public ote_test::TargetE2eTest {
  protected:
    RdmaPinTest() : TargetE2eTest(PinSession()) {}
};

// A valid pin: sim1 alone is the data device, on the pinned route, and carries every byte
// of a WRITE and its READ back (sim0 carries none: it is not even opened as one).
TEST_F(RdmaPinTest, PinnedDeviceCarriesAllBytes) {
    EXPECT_TRUE(LogContains("data device 0: sim1 port 1 GID index 3, 1 lanes"));
    EXPECT_FALSE(LogContains("data device 1:"));
    // The context layer took the route from the strict pin and never opened sim0.
    bool pinned = false;
    for (const std::string &l : Logs())
        pinned |= l.find("sim1: port 1 GID index 3 ") != std::string::npos &&
                  l.find("(RoCE v2, no netdev, pinned), NUMA node") != std::string::npos;
    EXPECT_TRUE(pinned);
    EXPECT_FALSE(LogContains(" sim0: port"));
    std::vector<uint8_t> src(kLen), dst(kLen, 0);
    ote_pattern_fill(src.data(), kLen, 94, 0);
    ASSERT_EQ(Transfer(OTE_WRITE, src.data(), target_.rw, kLen), OTE_OK);
    EXPECT_EQ(target_.Hash("rw", 0, kLen), ote_hash(src.data(), kLen));
    ASSERT_EQ(Transfer(OTE_READ, dst.data(), target_.rw, kLen), OTE_OK);
    EXPECT_EQ(memcmp(dst.data(), src.data(), kLen), 0);
    std::vector<ote_nic_stats_t> v(8);
    size_t n = 0;
    ASSERT_EQ(ote_engine_nic_stats(engine_, v.data(), v.size(), &n), OTE_OK);
    ASSERT_EQ(n, 1u);
    EXPECT_STREQ(v[0].name, "sim1");
    EXPECT_GE(v[0].bytes_out, 2 * kLen) << "the WRITE's and the READ's bytes";
}

class RdmaPinConfig : public ote_test::OteTest {};

// Malformed rdma_pin / rdma_lanes values are refused by ote_config_set; well-formed ones
// are kept.
TEST_F(RdmaPinConfig, MalformedValuesAreRefused) {
    ote_config_t *cfg = nullptr;
    ASSERT_EQ(ote_config_create(&cfg), OTE_OK);
    for (const char *bad :
         {"sim1", "sim1:1", "sim1:1:", ":1:0", "sim1:0:0", "sim1:256:0", "sim1:1:-1",
          "sim1:1:65536", "sim1:1:0x", "sim1:1:0,", ",sim1:1:0", "sim1:1:0,sim1:1:1",
          "sim1:01234:0", "sim 1:1:0", "a:1:0,b:1:0,c:1:0,d:1:0,e:1:0,f:1:0,g:1:0,h:1:0,i:1:0"}) {
        EXPECT_EQ(ote_config_set(cfg, "rdma_pin", bad), OTE_ERR_INVALID) << bad;
    }
    for (const char *good : {"", "sim1:1:3", "sim0:1:0,sim1:2:255", "mlx5_0:255:7"})
        EXPECT_EQ(ote_config_set(cfg, "rdma_pin", good), OTE_OK) << good;
    char buf[64];
    ASSERT_EQ(ote_config_get(cfg, "rdma_pin", buf, sizeof(buf)), OTE_OK);
    EXPECT_STREQ(buf, "mlx5_0:255:7");
    for (const char *bad : {"0", "65", "", "x", "-1"})
        EXPECT_EQ(ote_config_set(cfg, "rdma_lanes", bad), OTE_ERR_INVALID) << bad;
    ASSERT_EQ(ote_config_get(cfg, "rdma_lanes", buf, sizeof(buf)), OTE_OK);
    EXPECT_STREQ(buf, "2") << "the default";
    for (const char *good : {"1", "64"})
        EXPECT_EQ(ote_config_set(cfg, "rdma_lanes", good), OTE_OK) << good;
    ote_config_destroy(cfg);
}

// A pin naming a device, port or GID index the provider lacks fails ote_engine_create
// with OTE_ERR_NO_DEVICE and an ERROR line naming what was asked and what exists; a
// malformed pin from the environment fails it with OTE_ERR_INVALID.
TEST_F(RdmaPinConfig, MissingDevicePortOrGidIsRefusedWithALogLine) {
    struct Case {
        const char *pin, *asked, *exists;
    } cases[] = {
        {"sim7:1:0", "device sim7 not found", "lists 2 device(s), first sim0"},
        {"sim1:2:0", "device sim1 port 2 GID index 0", "the device has ports 1..1"},
        {"sim1:1:200", "device sim1 port 1 GID index 200 does not exist", "the GID table has"},
        {"sim0:1:0,sim7:1:0", "device sim7 not found", "first sim0"},
    };
    for (const Case &c : cases) {
        ote_config_t *cfg = nullptr;
        ASSERT_EQ(ote_config_create(&cfg), OTE_OK);
        ASSERT_EQ(ote_config_set(cfg, "transport", "rdma"), OTE_OK);
        ASSERT_EQ(ote_config_set(cfg, "verbs_provider", "sim"), OTE_OK);
        ASSERT_EQ(ote_config_set(cfg, "rdma_pin", c.pin), OTE_OK);
        ote_engine_t *e = nullptr;
        {
            ote_test::ErrorLogsExpected guard;
            EXPECT_EQ(ote_status_code(ote_engine_create(cfg, &e)), OTE_ERR_NO_DEVICE) << c.pin;
            EXPECT_GE(guard.Seen(), 1u) << c.pin;
        }
        EXPECT_EQ(e, nullptr);
        EXPECT_TRUE(LogContains(c.asked)) << c.pin;
        EXPECT_TRUE(LogContains(c.exists)) << c.pin;
        EXPECT_TRUE(LogContains(std::string("rdma_pin ") + c.pin)) << c.pin;
        ote_config_destroy(cfg);
    }
    setenv("OTE_RDMA_PIN", "sim1:1", 1);
    ote_config_t *cfg = nullptr;
    ASSERT_EQ(ote_config_create(&cfg), OTE_OK);
    ASSERT_EQ(ote_config_set(cfg, "transport", "rdma"), OTE_OK);
    ASSERT_EQ(ote_config_set(cfg, "verbs_provider", "sim"), OTE_OK);
    ote_engine_t *e = nullptr;
    {
        ote_test::ErrorLogsExpected guard;
        EXPECT_EQ(ote_status_code(ote_engine_create(cfg, &e)), OTE_ERR_INVALID);
        EXPECT_GE(guard.Seen(), 1u);
    }
    unsetenv("OTE_RDMA_PIN");
    EXPECT_EQ(e, nullptr);
    EXPECT_TRUE(LogContains("rdma_pin=\"sim1:1\""));
    ote_config_destroy(cfg);
}

// rdma_lanes sets the lanes of every data device (no longer tcp_workers).
TEST_F(RdmaPinConfig, LanesPerDeviceFollowRdmaLanes) {
    InfoLogs info;
    ote_engine_t *e = ote_test::NewEngine({{"transport", "rdma"},
                                           {"verbs_provider", "sim"},
                                           {"rdma_lanes", "5"},
                                           {"tcp_workers", "3"}});
    ASSERT_NE(e, nullptr);
    EXPECT_TRUE(LogContains("data device 0: sim0 port 1"));
    EXPECT_TRUE(LogContains("data device 1: sim1 port 1"));
    std::vector<std::string> lines = Logs();
    int with5 = 0;
    for (const std::string &l : lines)
        if (l.find("data device") != std::string::npos && l.find(", 5 lanes") != std::string::npos)
            with5++;
    EXPECT_EQ(with5, 2);
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
}

TEST(RdmaNicStats, ArgumentsAndEnginesWithoutNics) {
    ote_engine_t *e = ote_test::NewEngine({{"transports", "tcp"}});
    ASSERT_NE(e, nullptr);
    size_t n = 99;
    EXPECT_EQ(ote_engine_nic_stats(e, nullptr, 0, &n), OTE_OK);
    EXPECT_EQ(n, 0u);
    ote_nic_stats_t one;
    EXPECT_EQ(ote_engine_nic_stats(e, nullptr, 1, &n), OTE_ERR_INVALID);
    EXPECT_EQ(ote_engine_nic_stats(e, &one, 1, nullptr), OTE_ERR_INVALID);
    EXPECT_EQ(ote_engine_nic_stats(nullptr, &one, 1, &n), OTE_ERR_INVALID);
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
}

} // namespace

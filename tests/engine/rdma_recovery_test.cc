// Recovery of a live RDMA engine from what its monitor heals (engine/rdma/rdma_monitor.c),
// engine to engine in this process over verbs/sim, each engine's provider wrapped by the
// verbs fault decorator over a NativeCounter (tests/engine/native_counter.h):
// - a CQ lane error: the sim breaks the requester's CQs (as an overrun does: CQ_ERR,
//   polls fail) while a WRITE is on the wire; that WRITE ends OTE_ERR_FENCED (this
//   engine's device, not the peer), the lanes are replaced, the next WRITE lands every
//   byte, and no registration's MR was registered again;
// - a route change: the requester's GID changes (GID_CHANGE) while a WRITE is on the
//   wire; the QPs of the old route are fenced (that WRITE ends OTE_ERR_FENCED) and rebuilt
//   on the new route; the next WRITE lands every byte; no MR registered again;
// - a lost event consumer: the requester's get_async_event fails while a WRITE is on the
//   wire; the device is fenced, that WRITE ends OTE_ERR_FENCED, then the monitor reopens
//   the device (new native context, PD, lanes, MRs) and the next WRITE lands every byte;
//   a reopen that fails keeps the device fenced and is retried.
// Transfers are slowed by the source port's egress limit so that the fault meets work in
// flight. Each test fails without its fix (checked by disabling the monitor's lane and
// route passes): without lane recovery the broken lane's WRITE ends only at its deadline
// (TIMEOUT) and no lane is replaced; without the route fence the WRITE on the old route
// ends OTE_ERR_PEER_LOST (blamed on the peer) and no QP is fenced.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <sys/random.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tests/engine/native_counter.h"
#include "tests/util/test_base.h"
#include "tests/util/wait.h"

extern "C" {
#include "base/fault.h"
#include "base/retained.h"
#include "base/time.h"
#include "engine/rdma/test_hook.h"
#include "ote/ote.h"
#include "verbs/fault.h"
#include "verbs/sim/sim.h"
}

namespace {

constexpr uint64_t kSec = 1000000000ull;
constexpr size_t kLen = 4u << 20;

using ote_test::NativeCounter;

std::vector<ote_verbs_t *> *g_wrapped = nullptr;
std::vector<std::unique_ptr<NativeCounter>> *g_owned = nullptr;

ote_status_t WrapWithFault(ote_verbs_t **v) { return ote_test::WrapCounted(v, g_owned, g_wrapped); }

class RdmaRecoveryTest : public ote_test::OteTest {
  protected:
    void SetUp() override {
        OteTest::SetUp();
        g_wrapped = &wrapped_;
        g_owned = &counters_;
        retained0_ = ote_retained_total();
        ote__rdma_test_verbs_hook = WrapWithFault;
        src_ = Create();
        req_ = Create();
        ote__rdma_test_verbs_hook = nullptr;
        ASSERT_NE(src_, nullptr);
        ASSERT_NE(req_, nullptr);
        ASSERT_EQ(wrapped_.size(), 2u);
        vs_ = wrapped_[0];
        vr_ = wrapped_[1];
        nr_ = counters_[1].get();
        mem_.assign(kLen, 0);
        out_.resize(kLen);
        ASSERT_EQ(
            ote_memory_register(src_, mem_.data(), mem_.size(), OTE_PERM_READ | OTE_PERM_WRITE),
            OTE_OK);
        // The requester's buffer is registered too: its persistent MR must survive.
        ASSERT_EQ(
            ote_memory_register(req_, out_.data(), out_.size(), OTE_PERM_READ | OTE_PERM_WRITE),
            OTE_OK);
        char addr[300];
        ASSERT_EQ(ote_engine_address(src_, addr, sizeof(addr)), OTE_OK);
        snprintf(src_addr_, sizeof(src_addr_), "%s", addr);
        ASSERT_EQ(ote_segment_open(req_, addr, &seg_), OTE_OK);
        ASSERT_EQ(ote_engine_address(req_, req_addr_, sizeof(req_addr_)), OTE_OK);
    }
    void TearDown() override {
        if (seg_) {
            EXPECT_EQ(ote_segment_close(seg_), OTE_OK);
        }
        if (req_) {
            EXPECT_EQ(ote_memory_unregister(req_, out_.data()), OTE_OK);
            EXPECT_EQ(ote_engine_destroy(req_), OTE_OK);
        }
        if (src_) {
            EXPECT_EQ(ote_engine_destroy(src_), OTE_OK);
        }
        for (auto &c : counters_) {
            EXPECT_TRUE(c->closed.load());
            EXPECT_EQ(c->qps.load(), 0) << "QPs left alive";
            EXPECT_EQ(c->mrs.load(), 0) << "memory regions left alive";
            EXPECT_TRUE(c->LiveCqs().empty()) << "CQs left alive";
        }
        EXPECT_EQ(ote_retained_total(), retained0_);
        OteTest::TearDown();
    }
    ote_engine_t *Create() {
        ote_config_t *cfg = nullptr;
        EXPECT_EQ(ote_config_create(&cfg), OTE_OK);
        EXPECT_EQ(ote_config_set(cfg, "transport", "rdma"), OTE_OK);
        EXPECT_EQ(ote_config_set(cfg, "verbs_provider", "sim"), OTE_OK);
        EXPECT_EQ(ote_config_set(cfg, "transfer_timeout_ms", "15000"), OTE_OK);
        EXPECT_EQ(ote_config_set(cfg, "rdma_devices", devices_), OTE_OK);
        ote_engine_t *e = nullptr;
        EXPECT_EQ(ote_engine_create(cfg, &e), OTE_OK);
        ote_config_destroy(cfg);
        return e;
    }
    void Fill(uint8_t seed) {
        for (size_t i = 0; i < out_.size(); i++) out_[i] = (uint8_t)(i * 31 + seed);
    }
    ote_status_t Start(ote_batch_t **b) {
        EXPECT_EQ(ote_batch_create(req_, 1, b), OTE_OK);
        ote_request_t r = {OTE_WRITE, out_.data(), seg_, (uint64_t)(uintptr_t)mem_.data(), kLen};
        return ote_batch_submit(*b, &r, 1);
    }
    ote_status_t End(ote_batch_t *b) {
        ote_status_t st = ote_batch_wait(b, 60 * kSec);
        if (st != OTE_OK) {
            ote_transfer_status_t ts;
            EXPECT_EQ(ote_batch_status(b, 0, &ts), OTE_OK);
            if (ts.state != OTE_TRANSFER_PENDING) st = ts.error;
        }
        EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
        return st;
    }
    // A whole checked WRITE: every byte lands.
    void WriteChecked(uint8_t seed) {
        Fill(seed);
        ote_batch_t *b = nullptr;
        ASSERT_EQ(Start(&b), OTE_OK);
        ASSERT_EQ(End(b), OTE_OK);
        ASSERT_EQ(memcmp(mem_.data(), out_.data(), kLen), 0) << "a wrong byte at the source";
    }
    ote__rdma_test_grants_t Req() {
        ote__rdma_test_grants_t g{};
        EXPECT_EQ(ote__rdma_test_grants(req_addr_, &g), OTE_OK);
        return g;
    }
    ote__rdma_test_grants_t Src() {
        ote__rdma_test_grants_t g{};
        EXPECT_EQ(ote__rdma_test_grants(src_addr_, &g), OTE_OK);
        return g;
    }
    // The requester's port sends at most 8 MB/s: a 4 MiB WRITE stays on the wire for
    // about half a second.
    void Slow(bool on) {
        ASSERT_EQ(ote_sim_set_port_bw(ote_verbs_fault_inner(vr_), "sim0", 1, on ? 8000000 : 0),
                  OTE_OK);
    }
    // A WRITE started and on the wire (requester bytes in flight).
    void StartOnTheWire(ote_batch_t **b) {
        Fill(0x5a);
        ASSERT_EQ(Start(b), OTE_OK);
        ASSERT_TRUE(ote_test::WaitUntil([&] { return Req().inflight_now > 0; },
                                        std::chrono::seconds(30), "the WRITE on the wire"));
    }

    std::vector<ote_verbs_t *> wrapped_;
    std::vector<std::unique_ptr<NativeCounter>> counters_; // outlive the engines
    ote_engine_t *src_ = nullptr, *req_ = nullptr;
    ote_segment_t *seg_ = nullptr;
    ote_verbs_t *vs_ = nullptr, *vr_ = nullptr;
    NativeCounter *nr_ = nullptr;
    std::vector<uint8_t> mem_, out_;
    char req_addr_[300] = "", src_addr_[300] = "";
    uint64_t retained0_ = 0;
    const char *devices_ = "sim0"; // the data devices of both engines
};

// Both sim devices: a registration is a persistent MR in each.
class RdmaRecoveryTwoDeviceTest : public RdmaRecoveryTest {
  protected:
    RdmaRecoveryTwoDeviceTest() { devices_ = "sim0,sim1"; }
};

// Lane error (item 1): every requester CQ broken while a WRITE is on the wire.
TEST_F(RdmaRecoveryTest, LaneErrorEndsItsWorkFencedLanesReplacedNextWriteLands) {
    WriteChecked(1); // QPs built
    uint64_t regs0 = ote_verbs_fault_calls(vr_, OTE_VERBS_FAULT_OP_REG_MR);
    uint64_t pds0 = ote_verbs_fault_calls(vr_, OTE_VERBS_FAULT_OP_ALLOC_PD);
    std::vector<ibv_cq *> old = nr_->LiveCqs();
    ASSERT_FALSE(old.empty());
    uint64_t made0 = nr_->cqs_made.load();
    Slow(true);
    ote_batch_t *b = nullptr;
    StartOnTheWire(&b);
    ote_test::ErrorLogsExpected fault_logs; // the lane errors are logged
    // No old CQ may be destroyed (a lane replaced) before all of them are broken: their
    // destroys answer EBUSY meanwhile (the replacement is retried by later rounds).
    ASSERT_EQ(ote_verbs_fault_destroy_busy(vr_, OTE_VERBS_FAULT_OP_DESTROY_CQ, nullptr, 1000000),
              OTE_OK);
    for (ibv_cq *cq : old) ASSERT_EQ(ote_sim_cq_error(ote_verbs_fault_inner(vr_), cq), OTE_OK);
    ASSERT_EQ(ote_verbs_fault_destroy_busy(vr_, OTE_VERBS_FAULT_OP_DESTROY_CQ, nullptr, 0), OTE_OK);
    ote_status_t st = End(b);
    EXPECT_EQ(ote_status_code(st), OTE_ERR_FENCED) << ote_status_str(st);
    Slow(false);
    ASSERT_TRUE(ote_test::WaitUntil([&] { return Req().lane_replacements >= old.size() / 2; },
                                    std::chrono::seconds(30), "every lane replaced"));
    EXPECT_GE(Req().lane_fenced_qps, 1u);
    // Every lane's two CQs were made anew (addresses may be reused: counted instead), and
    // as many CQs are alive as before.
    EXPECT_GE(nr_->cqs_made.load(), made0 + old.size());
    EXPECT_EQ(nr_->LiveCqs().size(), old.size());
    WriteChecked(2);
    WriteChecked(3);
    // The PD and the persistent MRs stayed: nothing was registered or allocated again.
    EXPECT_EQ(ote_verbs_fault_calls(vr_, OTE_VERBS_FAULT_OP_REG_MR), regs0);
    EXPECT_EQ(ote_verbs_fault_calls(vr_, OTE_VERBS_FAULT_OP_ALLOC_PD), pds0);
}

// Route change (item 2): the requester's GIDs change while a WRITE is on the wire.
TEST_F(RdmaRecoveryTest, RouteChangeFencesOldQpsWhichAreRebuiltOnTheNewRoute) {
    WriteChecked(1);
    uint64_t regs0 = ote_verbs_fault_calls(vr_, OTE_VERBS_FAULT_OP_REG_MR);
    uint64_t builds0 = Req().qp_builds;
    Slow(true);
    ote_batch_t *b = nullptr;
    StartOnTheWire(&b);
    // A new IPv4-mapped RoCE v2 GID at the index the requester routes by (the sim's
    // default table: index 3), random: the sim listens on an abstract socket named by the
    // GID, and tests run side by side in sandboxes whose PID namespaces give them the same
    // getpid(), so a pid-derived one collided (EXISTS) when two runs overlapped.
    union ibv_gid gid;
    memset(&gid, 0, sizeof(gid));
    gid.raw[10] = gid.raw[11] = 0xff;
    uint8_t rnd[3] = {0, 0, 0};
    ASSERT_EQ(getrandom(rnd, sizeof(rnd), 0), (ssize_t)sizeof(rnd));
    gid.raw[12] = 172;
    gid.raw[13] = (uint8_t)(16 + rnd[0] % 16);
    gid.raw[14] = rnd[1];
    gid.raw[15] = rnd[2];
    ote_test::ErrorLogsExpected fault_logs;
    ASSERT_EQ(ote_sim_set_gid(ote_verbs_fault_inner(vr_), "sim0", 1, 3, &gid, IBV_GID_TYPE_ROCE_V2),
              OTE_OK);
    ote_status_t st = End(b);
    EXPECT_EQ(ote_status_code(st), OTE_ERR_FENCED) << ote_status_str(st);
    Slow(false);
    EXPECT_TRUE(ote_test::WaitUntil([&] { return Req().route_fenced_qps >= 1; },
                                    std::chrono::seconds(30), "the old route's QPs fenced"));
    WriteChecked(2);
    WriteChecked(3);
    EXPECT_GT(Req().qp_builds, builds0) << "no QP was rebuilt on the new route";
    EXPECT_EQ(ote_verbs_fault_calls(vr_, OTE_VERBS_FAULT_OP_REG_MR), regs0);
}

// Lost event consumer (item 3): the requester's get_async_event fails (EIO) while a WRITE
// is on the wire. Its only data device is fenced: that WRITE ends OTE_ERR_FENCED (EIO: its
// QP fenced with the context's status). Once its work drained, the monitor destroys what
// it built on the old native context, reopens the device (one more open_device and
// alloc_pd) and makes its lanes and the registrations' MRs anew (the requester's
// registered buffer is registered again: the new PD needs its own MR); the next WRITEs
// land every byte. Without the reopen the device stayed fenced for the engine's life and
// every later WRITE failed.
TEST_F(RdmaRecoveryTest, LostEventConsumerFencesTheDeviceThenItIsReopened) {
    WriteChecked(1);
    uint64_t opens0 = ote_verbs_fault_calls(vr_, OTE_VERBS_FAULT_OP_OPEN_DEVICE);
    uint64_t pds0 = ote_verbs_fault_calls(vr_, OTE_VERBS_FAULT_OP_ALLOC_PD);
    uint64_t regs0 = ote_verbs_fault_calls(vr_, OTE_VERBS_FAULT_OP_REG_MR);
    Slow(true);
    ote_batch_t *b = nullptr;
    StartOnTheWire(&b);
    ote_test::ErrorLogsExpected fault_logs;
    ASSERT_EQ(ote_verbs_fault_fail(vr_, OTE_VERBS_FAULT_OP_GET_ASYNC_EVENT, OTE_FAULT_NTH, 1, EIO),
              OTE_OK);
    ote_status_t st = End(b);
    EXPECT_EQ(st, ote_status_make(OTE_ERR_FENCED, EIO)) << ote_status_str(st);
    Slow(false);
    EXPECT_EQ(ote_verbs_fault_injected(vr_, OTE_VERBS_FAULT_OP_GET_ASYNC_EVENT), 1u);
    ASSERT_TRUE(ote_test::WaitUntil([&] { return Req().device_reopens >= 1; },
                                    std::chrono::seconds(30), "the device reopened"));
    EXPECT_EQ(Req().device_reopen_failures, 0u);
    EXPECT_EQ(ote_verbs_fault_calls(vr_, OTE_VERBS_FAULT_OP_OPEN_DEVICE), opens0 + 1);
    EXPECT_EQ(ote_verbs_fault_calls(vr_, OTE_VERBS_FAULT_OP_ALLOC_PD), pds0 + 1);
    EXPECT_GT(ote_verbs_fault_calls(vr_, OTE_VERBS_FAULT_OP_REG_MR), regs0);
    uint64_t builds0 = Req().qp_builds;
    WriteChecked(2);
    WriteChecked(3);
    EXPECT_GT(Req().qp_builds, builds0) << "no QP built on the reopened device";
}

// As above, and every RELEASE the requester sends is lost: the source still serves the
// in-flight WRITE's grant on its old QP when the requester, on the reopened device, asks
// for a new QP on that slot. The CONNECT ends the grants of the slot's old QP (their
// requester QP is gone), so the slot is rebuilt at once: without that its CONNECT waited
// for the grant's deadline (15 s) and failed after connect_timeout_ms with
// OTE_ERR_TIMEOUT (the flake of ci21 when the RELEASE had not been applied in time).
TEST_F(RdmaRecoveryTest, ReconnectAfterReopenEndsTheSourceGrantsOfTheSlotsOldQp) {
    WriteChecked(1);
    Slow(true);
    ote_batch_t *b = nullptr;
    StartOnTheWire(&b);
    // The WRITE's grant bound at the source (a run counts as in flight before it asks):
    // the fence below then ends a grant the source serves, whose RELEASE is lost.
    ASSERT_TRUE(ote_test::WaitUntil([&] { return Src().live_source > 0; }, std::chrono::seconds(30),
                                    "the WRITE's grant bound"));
    ote_test::ErrorLogsExpected fault_logs;
    ASSERT_EQ(ote_fault_arm("rdma.release_lost", OTE_FAULT_EVERY, 0, OTE_ERR_FAULT, 0), OTE_OK);
    ASSERT_EQ(ote_verbs_fault_fail(vr_, OTE_VERBS_FAULT_OP_GET_ASYNC_EVENT, OTE_FAULT_NTH, 1, EIO),
              OTE_OK);
    ote_status_t st = End(b);
    EXPECT_EQ(st, ote_status_make(OTE_ERR_FENCED, EIO)) << ote_status_str(st);
    Slow(false);
    ASSERT_TRUE(ote_test::WaitUntil([&] { return Req().device_reopens >= 1; },
                                    std::chrono::seconds(30), "the device reopened"));
    // The RELEASE goes when the grant is abandoned, or (the fence came before the grant's
    // answer) when the late answer arrives, which a loaded machine may deliver after the
    // reopen: wait for it to be held back.
    EXPECT_TRUE(ote_test::WaitUntil([] { return ote_fault_failures("rdma.release_lost") >= 1; },
                                    std::chrono::seconds(30), "a RELEASE held back"));
    WriteChecked(2); // OTE_ERR_TIMEOUT here when the slot waited for the old grant
    WriteChecked(3);
    EXPECT_EQ(ote_fault_disarm("rdma.release_lost"), OTE_OK);
}

// The reopen fails (open_device ENODEV, every try): the device stays fenced, a new WRITE
// fails without a QP built for it, and the reopen is retried (after a backoff: two
// failures counted); once the device opens again the next try succeeds and WRITEs land.
TEST_F(RdmaRecoveryTest, FailingReopenKeepsTheDeviceFencedAndIsRetried) {
    WriteChecked(1);
    ote_test::ErrorLogsExpected fault_logs;
    ASSERT_EQ(ote_verbs_fault_fail(vr_, OTE_VERBS_FAULT_OP_OPEN_DEVICE, OTE_FAULT_EVERY, 0, ENODEV),
              OTE_OK);
    ASSERT_EQ(ote_verbs_fault_fail(vr_, OTE_VERBS_FAULT_OP_GET_ASYNC_EVENT, OTE_FAULT_NTH, 1, EIO),
              OTE_OK);
    ASSERT_TRUE(ote_test::WaitUntil([&] { return Req().device_reopen_failures >= 2; },
                                    std::chrono::seconds(30), "two failed reopens"));
    uint64_t builds0 = Req().qp_builds;
    Fill(7);
    ote_batch_t *b = nullptr;
    ASSERT_EQ(Start(&b), OTE_OK);
    ote_status_t st = End(b);
    EXPECT_NE(st, OTE_OK) << "new work started on a device whose events go unseen";
    EXPECT_EQ(Req().qp_builds, builds0) << "a QP was built on the fenced device";
    EXPECT_EQ(Req().device_reopens, 0u);
    ote_verbs_fault_clear(vr_);
    ASSERT_TRUE(ote_test::WaitUntil([&] { return Req().device_reopens >= 1; },
                                    std::chrono::seconds(30), "the device reopened"));
    WriteChecked(2);
}

// The old PD will not be deallocated after the reopen (EBUSY, as while something of the
// old device context still lived on it): the device is reopened anyway on a new PD and
// WRITEs land, the old PD stays retained (counted), and the engine's destroy answers
// OTE_ERR_RETAINED until the driver lets it go; then a second destroy releases it.
TEST_F(RdmaRecoveryTest, OldPdThatWillNotGoIsRetainedUntilTheEngineDestroyReleasesIt) {
    WriteChecked(1);
    ote_test::ErrorLogsExpected fault_logs;
    ASSERT_EQ(ote_verbs_fault_destroy_busy(vr_, OTE_VERBS_FAULT_OP_DEALLOC_PD, nullptr, 1000000),
              OTE_OK);
    ASSERT_EQ(ote_verbs_fault_fail(vr_, OTE_VERBS_FAULT_OP_GET_ASYNC_EVENT, OTE_FAULT_NTH, 1, EIO),
              OTE_OK);
    ASSERT_TRUE(ote_test::WaitUntil([&] { return Req().device_reopens >= 1; },
                                    std::chrono::seconds(30), "the device reopened"));
    WriteChecked(2);
    EXPECT_GE(ote_retained_total(), retained0_ + 1) << "the old PD was not kept";
    EXPECT_EQ(ote_segment_close(seg_), OTE_OK);
    seg_ = nullptr;
    EXPECT_EQ(ote_memory_unregister(req_, out_.data()), OTE_OK);
    EXPECT_EQ(ote_status_code(ote_engine_destroy(req_)), OTE_ERR_RETAINED);
    ASSERT_EQ(ote_verbs_fault_destroy_busy(vr_, OTE_VERBS_FAULT_OP_DEALLOC_PD, nullptr, 0), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req_), OTE_OK);
    req_ = nullptr;
}

// Teardown (item 4): a registration whose second MR fails rolls back the first, and that
// rollback's dereg fails (EBUSY once): the MR is the buffer manager's orphan (retained,
// counted), the registration fails, and the monitor's reclaim deregisters the orphan
// within a few of its 50 ms passes, with no MR left over the buffer. Without the
// monitor's reclaim the orphan stays retained (and engine destroy would be RETAINED).
TEST_F(RdmaRecoveryTwoDeviceTest, MrOrphanedByAFailedRollbackIsReclaimedByTheMonitor) {
    std::vector<uint8_t> extra(1u << 20, 1);
    nr_->watch_lo = (uintptr_t)extra.data();
    nr_->watch_hi = (uintptr_t)extra.data() + extra.size();
    ote_test::ErrorLogsExpected fault_logs;
    ASSERT_EQ(ote_verbs_fault_fail(vr_, OTE_VERBS_FAULT_OP_REG_MR, OTE_FAULT_NTH, 2, ENOMEM),
              OTE_OK);
    ASSERT_EQ(ote_verbs_fault_destroy_busy(vr_, OTE_VERBS_FAULT_OP_DEREG_MR, nullptr, 1), OTE_OK);
    EXPECT_NE(ote_memory_register(req_, extra.data(), extra.size(), OTE_PERM_READ), OTE_OK);
    EXPECT_EQ(ote_verbs_fault_injected(vr_, OTE_VERBS_FAULT_OP_DEREG_MR), 1u);
    ASSERT_TRUE(ote_test::WaitUntil(
        [&] { return Req().mrs_retained == 0 && nr_->watched_mrs.load() == 0; },
        std::chrono::seconds(30), "the orphaned MR deregistered by the monitor's reclaim"));
    EXPECT_GE(ote_verbs_fault_calls(vr_, OTE_VERBS_FAULT_OP_DEREG_MR), 2u);
    EXPECT_EQ(ote_retained_total(), retained0_);
    ote_verbs_fault_clear(vr_);
    WriteChecked(4); // the engine goes on
}

} // namespace

// Peer pairing by the remote buffer's locality (engine/rdma/rdma_pairing.c), engine to
// engine in one process over verbs/sim (two devices each, sim0 and sim1). The target's
// rdma_topology file ranks its sim1 first for host memory on any node, the requester's
// ranks its own sim0 first: the requester's runs leave on its sim0 (device 0), which
// used to pair with the target's device 0 % 2 = sim0 whatever the remote buffer. Now the
// target says, in its first grant's answer, that its sim1 is best for the registration,
// and every later run into it goes to the target's sim1 (per-NIC counters on both sides,
// every byte checked). A target that does not advertise rdma_pair=1 (the no_pair hook: an
// older engine) keeps the old pairing: its sim0 serves everything. A target without a
// preference (no topology file: both devices rank the same) also keeps the rail.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/engine/engine_util.h"
#include "tests/util/test_base.h"

extern "C" {
#include "engine/rdma/test_hook.h"
#include "ote/ote.h"
#include "tests/engine/pattern.h"
}

namespace {

using ote_test::kSec;

constexpr size_t kBytes = 8u << 20;

struct Nic {
    uint64_t out, served;
};

std::vector<Nic> Nics(ote_engine_t *e) {
    std::vector<ote_nic_stats_t> v(4);
    size_t n = 0;
    EXPECT_EQ(ote_engine_nic_stats(e, v.data(), v.size(), &n), OTE_OK);
    EXPECT_EQ(n, 2u);
    std::vector<Nic> r;
    for (size_t i = 0; i < n && i < v.size(); i++) r.push_back({v[i].bytes_out, v[i].bytes_served});
    return r;
}

class RdmaPairingTest : public ote_test::OteTest {
  protected:
    void TearDown() override {
        ote__rdma_hooks.no_pair = 0;
        for (const std::string &f : files_) unlink(f.c_str());
        ote_test::OteTest::TearDown();
    }
    // An rdma_topology file naming first the device for host memory on every node.
    std::string Topology(const char *nic) {
        std::string text;
        for (int n = 0; n < 8; n++) text += "numa" + std::to_string(n) + " " + nic + "\n";
        char path[] = "/tmp/ote_rdma_pairing_XXXXXX";
        int fd = mkstemp(path);
        EXPECT_GE(fd, 0);
        EXPECT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
        close(fd);
        files_.push_back(path);
        return path;
    }
    ote_engine_t *Engine(const std::string &topology) {
        ote_test::ConfigKv kv = {
            {"transport", "rdma"}, {"verbs_provider", "sim"}, {"transfer_timeout_ms", "60000"}};
        if (!topology.empty()) kv.push_back({"rdma_topology", topology.c_str()});
        return ote_test::NewEngine(kv);
    }
    // Bytes each side's devices carried for one WRITE and one READ of kBytes after a
    // small WRITE (whose answer tells the requester where the target's buffer is best
    // served), every byte checked: {requester out per NIC, target served per NIC}.
    void Run(ote_engine_t *req, ote_engine_t *target, std::vector<Nic> *req_d,
             std::vector<Nic> *tgt_d) {
        std::vector<uint8_t> tbuf(kBytes, 1), src(kBytes), dst(kBytes, 0);
        ASSERT_EQ(ote_memory_register(target, tbuf.data(), kBytes, OTE_PERM_READ | OTE_PERM_WRITE),
                  OTE_OK);
        ASSERT_EQ(ote_memory_register(req, src.data(), kBytes, OTE_PERM_READ), OTE_OK);
        ASSERT_EQ(ote_memory_register(req, dst.data(), kBytes, OTE_PERM_WRITE), OTE_OK);
        ote_segment_t *seg = nullptr;
        ASSERT_EQ(ote_segment_open(req, ote_test::EngineAddress(target).c_str(), &seg), OTE_OK);
        const uint64_t remote = (uint64_t)(uintptr_t)tbuf.data();
        ote_pattern_fill(src.data(), kBytes, 31, 0);
        ASSERT_EQ(ote_test::RunOne(req, {OTE_WRITE, src.data(), seg, remote, 4096}, 60 * kSec),
                  OTE_OK);
        const std::vector<Nic> r0 = Nics(req), t0 = Nics(target);
        ASSERT_EQ(ote_test::RunOne(req, {OTE_WRITE, src.data(), seg, remote, kBytes}, 60 * kSec),
                  OTE_OK);
        EXPECT_EQ(memcmp(tbuf.data(), src.data(), kBytes), 0);
        ASSERT_EQ(ote_test::RunOne(req, {OTE_READ, dst.data(), seg, remote, kBytes}, 60 * kSec),
                  OTE_OK);
        EXPECT_EQ(memcmp(dst.data(), src.data(), kBytes), 0);
        const std::vector<Nic> r1 = Nics(req), t1 = Nics(target);
        for (size_t i = 0; i < 2; i++) {
            req_d->push_back({r1[i].out - r0[i].out, r1[i].served - r0[i].served});
            tgt_d->push_back({t1[i].out - t0[i].out, t1[i].served - t0[i].served});
        }
        EXPECT_EQ(ote_segment_close(seg), OTE_OK);
        EXPECT_EQ(ote_memory_unregister(req, src.data()), OTE_OK);
        EXPECT_EQ(ote_memory_unregister(req, dst.data()), OTE_OK);
        EXPECT_EQ(ote_memory_unregister(target, tbuf.data()), OTE_OK);
    }
    std::vector<std::string> files_;
};

// The target's buffer is nearest its sim1: every byte of the requester's sim0 goes there.
TEST_F(RdmaPairingTest, RunsGoToThePeersNicNearestTheRemoteBuffer) {
    ote_engine_t *target = Engine(Topology("sim1"));
    ASSERT_NE(target, nullptr);
    ote_engine_t *req = Engine(Topology("sim0"));
    ASSERT_NE(req, nullptr);
    std::vector<Nic> r, t;
    Run(req, target, &r, &t);
    if (!HasFatalFailure()) {
        EXPECT_EQ(r[0].out, 2 * kBytes) << "the requester's sim0 (its buffers' first NIC)";
        EXPECT_EQ(r[1].out, 0u);
        EXPECT_EQ(t[1].served, 2 * kBytes) << "the target's sim1 serves its buffer";
        EXPECT_EQ(t[0].served, 0u) << "the old pairing (0 % 2): the target's sim0";
    }
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(target), OTE_OK);
}

// Both of the requester's devices carry bytes (no topology file: they rank the same) and
// both pair with the target's sim1.
TEST_F(RdmaPairingTest, EveryLocalDevicePairsWithTheRemoteBuffersNic) {
    ote_engine_t *target = Engine(Topology("sim1"));
    ASSERT_NE(target, nullptr);
    ote_engine_t *req = Engine("");
    ASSERT_NE(req, nullptr);
    std::vector<Nic> r, t;
    Run(req, target, &r, &t);
    if (!HasFatalFailure()) {
        EXPECT_EQ(r[0].out + r[1].out, 2 * kBytes);
        EXPECT_EQ(t[1].served, 2 * kBytes);
        EXPECT_EQ(t[0].served, 0u);
    }
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(target), OTE_OK);
}

// An older target (no rdma_pair=1, no pair form): the requester's sim0 pairs with its
// sim0, as before, even though the target would rather serve the buffer on sim1.
TEST_F(RdmaPairingTest, AnOlderPeerKeepsTheRailPairing) {
    ote__rdma_hooks.no_pair = 1;
    ote_engine_t *target = Engine(Topology("sim1"));
    ote__rdma_hooks.no_pair = 0;
    ASSERT_NE(target, nullptr);
    ote_engine_t *req = Engine(Topology("sim0"));
    ASSERT_NE(req, nullptr);
    std::vector<Nic> r, t;
    Run(req, target, &r, &t);
    if (!HasFatalFailure()) {
        EXPECT_EQ(r[0].out, 2 * kBytes);
        EXPECT_EQ(t[0].served, 2 * kBytes) << "an older target: the rail (0 % 2)";
        EXPECT_EQ(t[1].served, 0u);
    }
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(target), OTE_OK);
}

// A target whose devices rank the same for the buffer sends no preference: the rail.
TEST_F(RdmaPairingTest, NoPreferenceKeepsTheRailPairing) {
    ote_engine_t *target = Engine("");
    ASSERT_NE(target, nullptr);
    ote_engine_t *req = Engine(Topology("sim0"));
    ASSERT_NE(req, nullptr);
    std::vector<Nic> r, t;
    Run(req, target, &r, &t);
    if (!HasFatalFailure()) {
        EXPECT_EQ(t[0].served, 2 * kBytes);
        EXPECT_EQ(t[1].served, 0u);
    }
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(target), OTE_OK);
}

} // namespace

// The route and address-vector keys end to end, two engines in this process over
// verbs/sim (each engine opens its own sim instance, captured through the transport's
// verbs hook, whose ote_sim_qp_paths says what every connected QP was connected with):
// - rdma_traffic_class / rdma_service_level / rdma_mtu: a WRITE and a READ move their
//   bytes, and every QP of both engines (requester and source side) carries its own
//   engine's class and level, with the path MTU min(active, peer's, clamp);
// - rdma_sysfs_root: the GID choice reads the netdevs of a fixture tree;
// - rdma_gid_index: a fixed index is the source GID of every QP and transfers work; an
//   index that is an empty entry fails ote_engine_create with an ERROR naming device,
//   port and index.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/engine/engine_util.h"
#include "tests/util/test_base.h"

extern "C" {
#include "base/log.h"
#include "base/time.h"
#include "engine/rdma/test_hook.h"
#include "ote/ote.h"
#include "tests/engine/pattern.h"
#include "verbs/sim/sim.h"
}

namespace {

constexpr uint64_t kLen = 1 << 20;

std::vector<ote_verbs_t *> g_sims; // each engine's sim, in creation order

ote_status_t KeepSim(ote_verbs_t **v) {
    g_sims.push_back(*v);
    return OTE_OK;
}

class RdmaAvTest : public ote_test::OteTest {
  protected:
    void SetUp() override {
        OteTest::SetUp();
        g_sims.clear();
        ote__rdma_test_verbs_hook = KeepSim;
    }
    void TearDown() override {
        for (ote_segment_t *s : segs_) EXPECT_EQ(ote_segment_close(s), OTE_OK);
        for (ote_engine_t *e : engines_) EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
        ote__rdma_test_verbs_hook = nullptr;
        g_sims.clear();
        OteTest::TearDown();
    }
    ote_engine_t *Engine(ote_test::ConfigKv kv) {
        kv.insert(
            kv.begin(),
            {{"transport", "rdma"}, {"verbs_provider", "sim"}, {"transfer_timeout_ms", "60000"}});
        ote_engine_t *e = ote_test::NewEngine(kv);
        if (e != nullptr) engines_.push_back(e);
        return e;
    }
    // WRITE kLen bytes from a to b's memory and READ them back, bytes checked.
    void WriteAndReadBack(ote_engine_t *a, ote_engine_t *b) {
        std::vector<uint8_t> src(kLen), remote(kLen, 0), back(kLen, 0);
        ote_pattern_fill(src.data(), kLen, 26, 0);
        ASSERT_EQ(ote_memory_register(b, remote.data(), kLen, OTE_PERM_READ | OTE_PERM_WRITE),
                  OTE_OK);
        ASSERT_EQ(ote_memory_register(a, src.data(), kLen, OTE_PERM_READ), OTE_OK);
        ASSERT_EQ(ote_memory_register(a, back.data(), kLen, OTE_PERM_WRITE), OTE_OK);
        ote_segment_t *seg = nullptr;
        ASSERT_EQ(ote_segment_open(a, ote_test::EngineAddress(b).c_str(), &seg), OTE_OK);
        segs_.push_back(seg);
        ote_request_t w = {OTE_WRITE, src.data(), seg, (uint64_t)(uintptr_t)remote.data(), kLen};
        ASSERT_EQ(ote_test::RunOne(a, w, 60 * ote_test::kSec), OTE_OK);
        EXPECT_EQ(memcmp(src.data(), remote.data(), kLen), 0);
        ote_request_t r = {OTE_READ, back.data(), seg, (uint64_t)(uintptr_t)remote.data(), kLen};
        ASSERT_EQ(ote_test::RunOne(a, r, 60 * ote_test::kSec), OTE_OK);
        EXPECT_EQ(memcmp(src.data(), back.data(), kLen), 0);
        // Paths are read while the QPs live; unregistering waits for grants to end.
        paths_.clear();
        for (ote_verbs_t *v : g_sims) paths_.push_back(Paths(v));
        EXPECT_EQ(ote_test::UnregisterWhenFree(b, remote.data()), OTE_OK);
        EXPECT_EQ(ote_test::UnregisterWhenFree(a, src.data()), OTE_OK);
        EXPECT_EQ(ote_test::UnregisterWhenFree(a, back.data()), OTE_OK);
    }
    static std::vector<ote_sim_qp_path_t> Paths(ote_verbs_t *v) {
        size_t n = 0;
        EXPECT_EQ(ote_sim_qp_paths(v, nullptr, 0, &n), OTE_OK);
        std::vector<ote_sim_qp_path_t> p(n + 16);
        EXPECT_EQ(ote_sim_qp_paths(v, p.data(), p.size(), &n), OTE_OK);
        p.resize(std::min(n, p.size()));
        return p;
    }
    std::vector<ote_engine_t *> engines_;
    std::vector<ote_segment_t *> segs_;
    std::vector<std::vector<ote_sim_qp_path_t>> paths_; // per sim, after the transfers
};

// Engine a (the requester) asks for traffic class 106 (DSCP 26, ECN 2), service level 3
// and a 512-byte path MTU; engine b (the source) for class 184 (DSCP 46), level 5 and no
// clamp. The sim's ports are active at 1024. Every QP of a connects with a's values, every
// QP of b with b's, and all of them with path MTU 512: a's clamp, which b learns from a.
TEST_F(RdmaAvTest, TrafficClassServiceLevelAndMtuReachEveryQpOfBothEngines) {
    ote_engine_t *a =
        Engine({{"rdma_traffic_class", "106"}, {"rdma_service_level", "3"}, {"rdma_mtu", "512"}});
    ote_engine_t *b = Engine({{"rdma_traffic_class", "184"}, {"rdma_service_level", "5"}});
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    ASSERT_EQ(g_sims.size(), 2u);
    WriteAndReadBack(a, b);
    ASSERT_EQ(paths_.size(), 2u);
    const struct { uint8_t tc, sl; } want[2] = {{106, 3}, {184, 5}};
    for (int side = 0; side < 2; side++) {
        EXPECT_GE(paths_[side].size(), 1u) << "engine " << side << " connected no QP";
        for (const auto &p : paths_[side]) {
            EXPECT_EQ(p.traffic_class, want[side].tc) << "engine " << side << " QP " << p.qp_num;
            EXPECT_EQ(p.sl, want[side].sl) << "engine " << side << " QP " << p.qp_num;
            EXPECT_EQ(p.path_mtu, IBV_MTU_512) << "engine " << side << " QP " << p.qp_num;
        }
    }
}

// A clamp above the ports' active MTU (1024) does not raise it: min(active, peer, clamp).
TEST_F(RdmaAvTest, MtuClampAboveTheActiveMtuKeepsTheActiveMtu) {
    ote_engine_t *a = Engine({{"rdma_mtu", "4096"}});
    ote_engine_t *b = Engine({});
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    WriteAndReadBack(a, b);
    for (const auto &side : paths_) {
        EXPECT_GE(side.size(), 1u);
        for (const auto &p : side) {
            EXPECT_EQ(p.path_mtu, IBV_MTU_1024) << p.qp_num;
            EXPECT_EQ(p.traffic_class, 0);
            EXPECT_EQ(p.sl, 0);
        }
    }
}

// rdma_gid_index=1 (the sim's link-local RoCE v2 entry, which the ranking never chooses)
// on both engines: every QP's source GID is entry 1 and the transfers work.
TEST_F(RdmaAvTest, FixedGidIndexIsEveryQpsSourceGid) {
    ote_engine_t *a = Engine({{"rdma_gid_index", "1"}});
    ote_engine_t *b = Engine({{"rdma_gid_index", "1"}});
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    WriteAndReadBack(a, b);
    for (const auto &side : paths_) {
        EXPECT_GE(side.size(), 1u);
        for (const auto &p : side) EXPECT_EQ(p.sgid_index, 1) << p.dev << " QP " << p.qp_num;
    }
}

// rdma_sysfs_root reaches the GID choice: a fixture tree where only sim0's entry 1 (its
// link-local RoCE v2 GID) has a netdev, eth0, which is up. sim0 then routes on entry 1
// (the only GID on a live interface), sim1 (no netdev information) keeps entry 3, the
// INFO line at open says so, and transfers work over both.
TEST_F(RdmaAvTest, SysfsRootReachesTheGidChoice) {
    const char *tmp = getenv("TEST_TMPDIR");
    std::string root = std::string(tmp != nullptr ? tmp : "/tmp") + "/av_sysfs";
    std::string ndevs = root + "/class/infiniband/sim0/ports/1/gid_attrs/ndevs";
    std::string net = root + "/class/net/eth0";
    ASSERT_EQ(system(("rm -rf '" + root + "' && mkdir -p '" + ndevs + "' '" + net +
                      "' && echo eth0 > '" + ndevs + "/1' && echo up > '" + net + "/operstate'")
                         .c_str()),
              0);
    ote_log_level_t saved = ote_log_level();
    ote_log_set_level(OTE_LOG_INFO);
    ote_engine_t *a = Engine({{"rdma_sysfs_root", root.c_str()}});
    ote_engine_t *b = Engine({{"rdma_sysfs_root", root.c_str()}});
    ote_log_set_level(saved);
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    EXPECT_TRUE(LogContains("sim0: port 1 GID index 1 fe80::"));
    EXPECT_TRUE(LogContains("(RoCE v2, netdev eth0 up, automatic)"));
    EXPECT_TRUE(LogContains("sim1: port 1 GID index 3 ::ffff:"));
    WriteAndReadBack(a, b);
    for (const auto &side : paths_) {
        EXPECT_GE(side.size(), 1u);
        for (const auto &p : side)
            EXPECT_EQ(p.sgid_index, std::string(p.dev) == "sim0" ? 1 : 3)
                << p.dev << " QP " << p.qp_num;
    }
}

// rdma_gid_index=9 names an empty entry of the sim's 16-entry table (entries 0..3 hold
// GIDs): ote_engine_create fails, and the ERROR line names device, port and index.
TEST_F(RdmaAvTest, FixedGidIndexOnAnEmptyEntryFailsTheOpenNamingIt) {
    ote_config_t *cfg = ote_test::RdmaConfig();
    ASSERT_EQ(ote_config_set(cfg, "rdma_gid_index", "9"), OTE_OK);
    ote_engine_t *e = nullptr;
    ote_status_t st = OTE_OK;
    ExpectErrorLogsIn([&] { st = ote_engine_create(cfg, &e); });
    ote_config_destroy(cfg);
    EXPECT_EQ(st, OTE_ERR_NO_DEVICE);
    EXPECT_EQ(e, nullptr);
    EXPECT_TRUE(
        LogContains("device sim0: the GID index 9 fixed for every device cannot be used: "
                    "port 1: GID index 9 is empty (zero GID)"));
}

} // namespace

// GID choice that asks the fabric (context/gid.c, context/sysfs.c), on sysfs fixture trees
// that each test writes into a temporary directory and hands to the context set as its
// sysfs root, over sim devices configured with the same GID tables:
// - Mooncake #946: two IPv4-mapped RoCE v2 GIDs, the first without a local netdev (or its
//   netdev down, or not in this namespace) -> the second, the one on the live interface;
// - Mooncake #1593: IPv6 only (link-local + global) -> the global RoCE v2 entry whose
//   netdev is up, also when a global entry on a down VLAN comes first;
// - InfiniBand: no ndevs at all -> the type order alone, as before;
// - garbage ndevs / operstate files (binary, oversized, a path, a directory, a FIFO, an
//   unreadable file) -> no crash, no hang, counted as "no netdev";
// - a fixed GID index for every device and a fixed port: strict, failing with the
//   device, port and index named; the chosen index in the open's INFO line.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/util/test_base.h"

extern "C" {
#include "base/log.h"
#include "base/status.h"
#include "context/context.h"
#include "verbs/sim/sim.h"
#include "verbs/verbs.h"
}

namespace {

using ote_test::OteTest;

// A directory tree under $TEST_TMPDIR that the test fills, removed at the end.
class SysfsTree {
  public:
    SysfsTree() {
        const char *tmp = getenv("TEST_TMPDIR");
        std::string templ = std::string(tmp != nullptr ? tmp : "/tmp") + "/sysfs.XXXXXX";
        std::vector<char> buf(templ.begin(), templ.end());
        buf.push_back('\0');
        if (mkdtemp(buf.data()) != nullptr) root_ = buf.data();
    }
    ~SysfsTree() {
        if (!root_.empty()) {
            std::string cmd = "chmod -R u+rwx '" + root_ + "' && rm -rf '" + root_ + "'";
            if (system(cmd.c_str()) != 0) ADD_FAILURE() << "could not remove " << root_;
        }
    }
    const std::string &Root() const { return root_; }
    void MkdirP(const std::string &rel) {
        std::string path = root_;
        size_t pos = 0;
        while (pos != std::string::npos) {
            size_t next = rel.find('/', pos);
            path = root_ + "/" + rel.substr(0, next);
            if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST)
                ADD_FAILURE() << "mkdir " << path << ": " << strerror(errno);
            pos = next == std::string::npos ? next : next + 1;
        }
    }
    void Write(const std::string &rel, const std::string &content) {
        size_t slash = rel.rfind('/');
        if (slash != std::string::npos) MkdirP(rel.substr(0, slash));
        std::string path = root_ + "/" + rel;
        FILE *f = fopen(path.c_str(), "wb");
        ASSERT_NE(f, nullptr) << path;
        ASSERT_EQ(fwrite(content.data(), 1, content.size(), f), content.size());
        fclose(f);
    }
    // The kernel's files for one GID entry of dev/port: its netdev name.
    void Ndev(const std::string &dev, int index, const std::string &netdev, int port = 1) {
        Write("class/infiniband/" + dev + "/ports/" + std::to_string(port) + "/gid_attrs/ndevs/" +
                  std::to_string(index),
              netdev + "\n");
    }
    void Operstate(const std::string &netdev, const std::string &state) {
        Write("class/net/" + netdev + "/operstate", state + "\n");
    }

  private:
    std::string root_;
};

class GidSysfsTest : public OteTest {
  protected:
    void SetUp() override {
        OteTest::SetUp();
        ASSERT_FALSE(tree_.Root().empty());
        saved_level_ = ote_log_level();
        ote_log_set_level(OTE_LOG_INFO); // the route's INFO line is checked
    }
    void TearDown() override {
        if (set_ != nullptr) {
            EXPECT_EQ(ote_context_set_close(set_), OTE_OK);
        }
        if (v_ != nullptr) ote_verbs_close(v_);
        ote_log_set_level(saved_level_);
        OteTest::TearDown();
    }
    void Sim(const std::string &config) {
        ASSERT_EQ(ote_verbs_open("sim", config.c_str(), &v_), OTE_OK);
    }
    // Opens the set with the fixture tree as sysfs; the chosen GID index of NIC 0.
    int OpenAndChosenIndex(ote_context_config_t cfg = {}) {
        cfg.sysfs_root = tree_.Root().c_str();
        EXPECT_EQ(ote_context_set_open(v_, &cfg, &set_), OTE_OK);
        if (set_ == nullptr || ote_context_set_count(set_) == 0) return -2;
        ote_context_get_info(ote_context_set_get(set_, 0), &info_);
        return info_.gid_index;
    }
    bool InfoLine(const std::string &needle) {
        for (const auto &l : Logs())
            if (l.rfind("I [context]", 0) == 0 && l.find(needle) != std::string::npos) return true;
        return false;
    }
    SysfsTree tree_;
    ote_verbs_t *v_ = nullptr;
    ote_context_set_t *set_ = nullptr;
    ote_context_info_t info_{};
    ote_log_level_t saved_level_ = OTE_LOG_WARN;
};

// Mooncake #946 (a container's view of a ConnectX port): the GID table holds the host's
// IPv4-mapped addresses too. Index 2/3 is 26.208.8.250, an address of another interface
// (not this host's eth1); index 6/7 is 26.208.8.252 on eth1, which is up. Both 3 and 7
// are RoCE v2 IPv4-mapped, so type ranking alone takes 3, the lower one.
const char kMooncake946[] =
    "dev=mlx5_1,numa=0;port;"
    "gid=fe80::a288:c2ff:fe5b:13a4,type=v1,index=0;gid=fe80::a288:c2ff:fe5b:13a4,type=v2,index=1;"
    "gid=26.208.8.250,type=v1,index=2;gid=26.208.8.250,type=v2,index=3;"
    "gid=26.208.8.252,type=v1,index=6;gid=26.208.8.252,type=v2,index=7";

void Mooncake946Tree(SysfsTree &t) {
    for (int i : {0, 1, 6, 7}) t.Ndev("mlx5_1", i, "eth1");
    t.Operstate("eth1", "up");
}

// A network engineer picks index 7: RoCE v2 (routed UDP) on the IPv4 address of eth1,
// the interface this host's traffic leaves by; index 3's address lives elsewhere, and
// packets sourced from it are not this host's. Here 2/3 have no ndevs file at all.
TEST_F(GidSysfsTest, Mooncake946SecondIpv4GidOnTheLocalNetdevIsChosen) {
    Sim(kMooncake946);
    Mooncake946Tree(tree_);
    EXPECT_EQ(OpenAndChosenIndex(), 7);
    EXPECT_EQ(info_.gid_type, (uint32_t)IBV_GID_TYPE_ROCE_V2);
    EXPECT_STREQ(info_.netdev, "eth1");
    EXPECT_EQ(info_.netdev_state, OTE_CONTEXT_NETDEV_UP);
    EXPECT_EQ(info_.pinned, 0);
    EXPECT_TRUE(InfoLine(
        "mlx5_1: port 1 GID index 7 ::ffff:26.208.8.252 (RoCE v2, netdev eth1 up, automatic)"));
}

// The same table where 2/3 do name a netdev, eth2, whose link is down: the engineer still
// picks 7, the address on the interface that can carry traffic now.
TEST_F(GidSysfsTest, Mooncake946FirstGidOnADownNetdevLosesToTheUpOne) {
    Sim(kMooncake946);
    Mooncake946Tree(tree_);
    tree_.Ndev("mlx5_1", 2, "eth2");
    tree_.Ndev("mlx5_1", 3, "eth2");
    tree_.Operstate("eth2", "down");
    EXPECT_EQ(OpenAndChosenIndex(), 7);
    EXPECT_TRUE(InfoLine("GID index 7 "));
}

// In a container's network namespace class/net lists only its own interfaces: a netdev
// named in ndevs but absent from class/net (host0) is not this namespace's, so it counts
// down and the engineer's choice stays 7.
TEST_F(GidSysfsTest, Mooncake946NetdevOutsideThisNamespaceCountsDown) {
    Sim(kMooncake946);
    Mooncake946Tree(tree_);
    tree_.Ndev("mlx5_1", 3, "host0");
    EXPECT_EQ(OpenAndChosenIndex(), 7);
}

// Without any netdev information (no gid_attrs in the tree) the order is the type order:
// index 3, the first IPv4-mapped RoCE v2 entry, exactly as before this change.
TEST_F(GidSysfsTest, Mooncake946WithoutNetdevInformationKeepsTheTypeOrder) {
    Sim(kMooncake946);
    tree_.MkdirP("class/infiniband/mlx5_1/ports/1");
    EXPECT_EQ(OpenAndChosenIndex(), 3);
    EXPECT_TRUE(InfoLine("GID index 3 ::ffff:26.208.8.250 (RoCE v2, no netdev, automatic)"));
}

// Mooncake #1593 (mlx5_bond_0, IPv6 only): link-local fe80 entries at 0/1 and a global
// IPv6 address at 2/3 (v1/v2), all on bond0, which is up; no IPv4-mapped entry at all.
// The engineer picks 3: RoCE v2 on the global address routes across L3 hops, a link-local
// address never leaves its L2 segment, and v1 is not routable at all.
TEST_F(GidSysfsTest, Mooncake1593Ipv6OnlyChoosesTheGlobalRoceV2Entry) {
    Sim("dev=mlx5_bond_0,numa=0;port;"
        "gid=fe80::225:9dff:fe33:33aa,type=v1,index=0;gid=fe80::225:9dff:fe33:33aa,type=v2,index=1;"
        "gid=2001:db8:1593::33aa,type=v1,index=2;gid=2001:db8:1593::33aa,type=v2,index=3");
    for (int i = 0; i < 4; i++) tree_.Ndev("mlx5_bond_0", i, "bond0");
    tree_.Operstate("bond0", "up");
    EXPECT_EQ(OpenAndChosenIndex(), 3);
    EXPECT_STREQ(info_.netdev, "bond0");
    EXPECT_TRUE(
        InfoLine("mlx5_bond_0: port 1 GID index 3 2001:db8:1593::33aa (RoCE v2, netdev bond0 up"));
}

// #1593's shape with a second global address first, on a VLAN interface whose lower link
// is down (operstate lowerlayerdown), and the bond's own global address after it; the
// bond reports "unknown" (a driver that does not track operstate), which counts as up.
// The engineer picks 5: the global RoCE v2 entry of the interface that carries traffic.
TEST_F(GidSysfsTest, Mooncake1593GlobalEntryOnADownVlanLosesToTheUpNetdev) {
    Sim("dev=mlx5_bond_0,numa=0;port;"
        "gid=fe80::225:9dff:fe33:33ab,type=v1,index=0;gid=fe80::225:9dff:fe33:33ab,type=v2,index=1;"
        "gid=2001:db8:200::33ab,type=v1,index=2;gid=2001:db8:200::33ab,type=v2,index=3;"
        "gid=2001:db8:1593::33ab,type=v1,index=4;gid=2001:db8:1593::33ab,type=v2,index=5");
    for (int i : {0, 1, 4, 5}) tree_.Ndev("mlx5_bond_0", i, "bond0");
    for (int i : {2, 3}) tree_.Ndev("mlx5_bond_0", i, "bond0.200");
    tree_.Operstate("bond0", "unknown");
    tree_.Operstate("bond0.200", "lowerlayerdown");
    EXPECT_EQ(OpenAndChosenIndex(), 5);
    EXPECT_TRUE(InfoLine("GID index 5 2001:db8:1593::33ab (RoCE v2, netdev bond0 up"));
}

// An InfiniBand port: no gid_attrs/ndevs (the kernel has no netdevs for IB GIDs), even
// though the device's sysfs directory exists. The choice is the type order, the same as
// ote_context_rank_gids without netdev information: the global-prefix GID (index 1)
// over the default fe80 subnet prefix (index 0), as before.
TEST_F(GidSysfsTest, InfinibandPortWithoutNdevsKeepsItsChoice) {
    Sim("dev=mlx5_ib0,numa=0;port,link=ib,lid=7;"
        "gid=fe80::2c9:300:a:1,type=ib,index=0;gid=2001:db8:1b::2c9:300:a:1,type=ib,index=1");
    tree_.Write("class/infiniband/mlx5_ib0/ports/1/state", "4: ACTIVE\n");
    tree_.Operstate("ib0", "up"); // an IPoIB netdev exists, but no GID names it
    EXPECT_EQ(OpenAndChosenIndex(), 1);
    EXPECT_EQ(info_.link_layer, IBV_LINK_LAYER_INFINIBAND);
    EXPECT_STREQ(info_.netdev, "");
    EXPECT_EQ(info_.netdev_state, OTE_CONTEXT_NETDEV_NONE);
    ibv_gid_entry t[2] = {};
    t[0].gid = info_.gid; // the same table ranked without any netdev information
    t[0].gid_index = 1;
    t[0].gid_type = IBV_GID_TYPE_IB;
    t[1].gid.raw[0] = 0xfe;
    t[1].gid.raw[1] = 0x80;
    t[1].gid.raw[15] = 1;
    t[1].gid_index = 0;
    t[1].gid_type = IBV_GID_TYPE_IB;
    EXPECT_EQ(ote_context_rank_gids(t, 2), 1);
    EXPECT_TRUE(InfoLine(
        "mlx5_ib0: port 1 GID index 1 2001:db8:1b:0:2c9:300:a:1 (IB, no netdev, automatic)"));
}

// Files no kernel writes: binary bytes, a name too long for a netdev, a path, "..", an
// empty file, a directory, a FIFO (a blocking read would hang the open), an unreadable
// file, and an oversized operstate. None may crash or block; each is "no netdev" (or, for
// the operstate, down), so the valid eth1 entry (7) wins, and with every entry garbage
// the type order decides (3).
TEST_F(GidSysfsTest, GarbageNdevsFilesDoNotCrash) {
    Sim(kMooncake946);
    const std::string ndevs = "class/infiniband/mlx5_1/ports/1/gid_attrs/ndevs/";
    tree_.Write(ndevs + "0", std::string("\x00\xff\x01garbage\x00", 11));
    tree_.Write(ndevs + "1", std::string(5000, 'e'));
    tree_.Write(ndevs + "2", "../../../etc\n");
    tree_.Write(ndevs + "3", "");
    tree_.MkdirP(ndevs + "4");
    ASSERT_EQ(mkfifo((tree_.Root() + "/" + ndevs + "5").c_str(), 0644), 0);
    tree_.Write(ndevs + "6", "eth9\n");
    tree_.Operstate("eth9", std::string(100000, 'u')); // oversized: counted down
    tree_.Write(ndevs + "7", "eth1\n");
    tree_.Operstate("eth1", "up");
    EXPECT_EQ(OpenAndChosenIndex(), 7);
    ASSERT_EQ(ote_context_set_close(set_), OTE_OK);
    set_ = nullptr;
    // Every entry garbage now: 7 unreadable (mode 0; root reads it anyway: then its
    // content, "eth1 up", is still valid, so make it garbage too for a fixed answer).
    tree_.Write(ndevs + "7", "eth 1\n");
    ASSERT_EQ(chmod((tree_.Root() + "/" + ndevs + "7").c_str(), 0), 0);
    EXPECT_EQ(OpenAndChosenIndex(), 3);
    EXPECT_TRUE(InfoLine("GID index 3 ::ffff:26.208.8.250 (RoCE v2, no netdev, automatic)"));
}

// The netdev criterion in the ranking function itself: up first, then the type order;
// "down" and "none" rank alike; no netdev information changes nothing.
TEST_F(GidSysfsTest, RankingPutsUpNetdevsFirstThenTypes) {
    std::vector<ibv_gid_entry> t(4);
    memset(t.data(), 0, t.size() * sizeof(t[0]));
    for (uint32_t i = 0; i < t.size(); i++) {
        t[i].gid_index = i;
        t[i].gid.raw[10] = t[i].gid.raw[11] = 0xff; // IPv4-mapped
        t[i].gid.raw[15] = (uint8_t)(i + 1);
    }
    t[0].gid_type = IBV_GID_TYPE_ROCE_V2;
    t[1].gid_type = IBV_GID_TYPE_ROCE_V1;
    t[2].gid_type = IBV_GID_TYPE_ROCE_V2;
    t[3].gid_type = IBV_GID_TYPE_ROCE_V1;
    ote_context_netdev_t nd[4] = {OTE_CONTEXT_NETDEV_DOWN, OTE_CONTEXT_NETDEV_UP,
                                  OTE_CONTEXT_NETDEV_NONE, OTE_CONTEXT_NETDEV_UP};
    EXPECT_EQ(ote_context_rank_gids_netdev(t.data(), nd, 4), 1); // up v1 beats down v2
    nd[2] = OTE_CONTEXT_NETDEV_UP;
    EXPECT_EQ(ote_context_rank_gids_netdev(t.data(), nd, 4), 2); // up v2 beats up v1
    for (auto &x : nd) x = OTE_CONTEXT_NETDEV_DOWN;
    EXPECT_EQ(ote_context_rank_gids_netdev(t.data(), nd, 4), 0); // all down: type order
    EXPECT_EQ(ote_context_rank_gids_netdev(t.data(), nullptr, 4), 0);
    EXPECT_EQ(ote_context_rank_gids(t.data(), 4), 0);
}

// A fixed GID index for every device (rdma_gid_index): used as given even where the
// ranking would choose another, reported strict; an empty entry fails the open naming
// device, port and index, and so does a fixed port the device lacks.
TEST_F(GidSysfsTest, FixedGidIndexAndPortAreStrict) {
    Sim(kMooncake946);
    Mooncake946Tree(tree_);
    ote_context_config_t cfg = {};
    cfg.gid_mode = OTE_CONTEXT_GID_FIXED;
    cfg.gid_index = 1; // link-local v2: never chosen automatically
    EXPECT_EQ(OpenAndChosenIndex(cfg), 1);
    EXPECT_EQ(info_.pinned, 1);
    EXPECT_TRUE(InfoLine(
        "GID index 1 fe80::a288:c2ff:fe5b:13a4 (RoCE v2, netdev eth1 up, fixed GID index)"));
    ASSERT_EQ(ote_context_set_close(set_), OTE_OK);
    set_ = nullptr;

    cfg.gid_index = 5; // a hole in the table
    cfg.sysfs_root = tree_.Root().c_str();
    ExpectErrorLogsIn([&] { EXPECT_EQ(ote_context_set_open(v_, &cfg, &set_), OTE_ERR_NOT_FOUND); });
    EXPECT_EQ(set_, nullptr);
    EXPECT_TRUE(
        LogContains("device mlx5_1: the GID index 5 fixed for every device cannot be used: "
                    "port 1: GID index 5 is empty (zero GID)"));
    cfg.gid_index = 16; // past the table (16 entries)
    ExpectErrorLogsIn([&] { EXPECT_EQ(ote_context_set_open(v_, &cfg, &set_), OTE_ERR_NOT_FOUND); });
    EXPECT_TRUE(LogContains("GID index 16 does not exist (the GID table has 16 entries)"));

    ote_context_config_t pcfg = {};
    pcfg.port = 2; // the device has one port
    pcfg.sysfs_root = tree_.Root().c_str();
    ExpectErrorLogsIn(
        [&] { EXPECT_EQ(ote_context_set_open(v_, &pcfg, &set_), OTE_ERR_NOT_FOUND); });
    EXPECT_TRUE(LogContains("configured route of device mlx5_1 port 2: the device has ports 1..1"));
    pcfg.port = 1;
    EXPECT_EQ(OpenAndChosenIndex(pcfg), 7);
}

// A port is chosen among several with the fixed index: port 1 lacks the entry, port 2
// has it, so port 2 carries the route (no ERROR for port 1: another port served).
TEST_F(GidSysfsTest, FixedGidIndexTakesThePortThatHasIt) {
    Sim("dev=mlx5_2,numa=0;port;gid=auto-v4,type=v2,index=0;"
        "port;gid=auto-ll,type=v1,index=0;gid=auto-v4,type=v2,index=4");
    ote_context_config_t cfg = {};
    cfg.gid_mode = OTE_CONTEXT_GID_FIXED;
    cfg.gid_index = 4;
    EXPECT_EQ(OpenAndChosenIndex(cfg), 4);
    EXPECT_EQ(info_.port, 2);
}

} // namespace

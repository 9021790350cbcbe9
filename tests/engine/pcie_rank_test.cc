// NIC ranks from recorded machine shapes (hwloc XML written by hand from hwloc's schema,
// tests/engine/topology/): the PCIe ranks of every NIC for every GPU of a 2-socket,
// 4-switch, 8-GPU, 8-NIC server (each switch: two leaf switches, each with one GPU and
// one NIC) and of a 1-socket, 2-GPU, 1-NIC workstation (GPUs and NIC on their own root
// ports); the NUMA ranks of every node from the same files; the rdma_topology file reader
// (a good file's entries, each kind of bad line refused with its line number).
#include <gtest/gtest.h>

#include <stdlib.h>

#include <cstdio>
#include <string>
#include <vector>

#include "tests/util/test_base.h"

extern "C" {
#include "engine/rdma/selector/pcie.h"
#include "engine/rdma/selector/selector.h"
#include "engine/rdma/selector/topo_file.h"
}

namespace {

std::string TopologyFile(const char *name) {
    const char *srcdir = std::getenv("TEST_SRCDIR");
    const char *ws = std::getenv("TEST_WORKSPACE");
    std::string rel = std::string("tests/engine/topology/") + name;
    if (srcdir == nullptr || ws == nullptr) return rel;
    return std::string(srcdir) + "/" + ws + "/" + rel;
}

// HWLOC_XMLFILE names the recorded shape while the test runs.
class PcieRankTest : public ote_test::OteTest {
  protected:
    void Use(const char *xml) {
        ASSERT_EQ(setenv("HWLOC_XMLFILE", TopologyFile(xml).c_str(), 1), 0);
        ASSERT_EQ(ote_pcie_topo_load(&topo_), OTE_OK);
    }
    std::vector<int> Ranks(const char *gpu, const std::vector<const char *> &nics) {
        std::vector<int> r(nics.size(), -7);
        EXPECT_EQ(ote_pcie_rank_nics(topo_, gpu, nics.data(), nics.size(), r.data()), OTE_OK)
            << gpu;
        return r;
    }
    void TearDown() override {
        ote_pcie_topo_destroy(topo_);
        unsetenv("HWLOC_XMLFILE");
        ote_test::OteTest::TearDown();
    }
    ote_pcie_topo_t *topo_ = nullptr;
};

const char *const kServerGpus[8] = {"0000:16:00.0", "0000:1e:00.0", "0000:56:00.0", "0000:5e:00.0",
                                    "0000:96:00.0", "0000:9e:00.0", "0000:d6:00.0", "0000:de:00.0"};
const std::vector<const char *> kServerNics = {"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4",
                                               "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_9"};

// GPU k sits beside NIC k behind a leaf switch (rank 0), NIC k^1 behind the same switch
// (1), the other switch's NICs of its socket (2), the other socket's (3); mlx5_9 is in no
// topology (4).
TEST_F(PcieRankTest, ServerEveryGpuRanksItsOwnSwitchFirst) {
    ASSERT_NO_FATAL_FAILURE(Use("server_8gpu.xml"));
    for (int k = 0; k < 8; k++) {
        std::vector<int> want(9);
        for (int n = 0; n < 8; n++) {
            if (n == k) want[n] = OTE_PCIE_RANK_NEAREST;
            else if (n / 2 == k / 2) want[n] = OTE_PCIE_RANK_SWITCH;
            else if (n / 4 == k / 4) want[n] = OTE_PCIE_RANK_PACKAGE;
            else want[n] = OTE_PCIE_RANK_SYSTEM;
        }
        want[8] = OTE_PCIE_RANK_UNPLACED;
        EXPECT_EQ(Ranks(kServerGpus[k], kServerNics), want) << "GPU " << k;
    }
    // Upper-case hex is the same bus id; an id the tree lacks and a malformed one.
    EXPECT_EQ(Ranks("0000:DE:00.0", {"mlx5_7"}), std::vector<int>{0});
    EXPECT_EQ(Ranks("00000000:de:00.0", {"mlx5_7"}), std::vector<int>{0}) << "NVML's form";
    int r = -7;
    const char *nic = "mlx5_0";
    EXPECT_EQ(ote_pcie_rank_nics(topo_, "0000:17:00.0", &nic, 1, &r), OTE_OK)
        << "a NIC's own PCI function is found too";
    EXPECT_EQ(ote_pcie_rank_nics(topo_, "0000:44:00.0", &nic, 1, &r), OTE_ERR_NOT_FOUND);
    EXPECT_EQ(ote_pcie_rank_nics(topo_, "gpu0", &nic, 1, &r), OTE_ERR_INVALID);
    for (const char *bad : {"0000:16:00.0x", "000:16:00.0", "000000000:16:00.0", "0000:16:20.0",
                            "0000:16:00.8", "0000:1g:00.0", "0000-16:00.0", ""})
        EXPECT_EQ(ote_pcie_rank_nics(topo_, bad, &nic, 1, &r), OTE_ERR_INVALID) << bad;
}

// Root ports of one host bridge are no switch: both GPUs rank the NIC by the socket.
TEST_F(PcieRankTest, WorkstationGpusShareTheSocketNic) {
    ASSERT_NO_FATAL_FAILURE(Use("workstation_2gpu.xml"));
    for (const char *gpu : {"0000:01:00.0", "0000:02:00.0"})
        EXPECT_EQ(Ranks(gpu, {"mlx5_0", "mlx5_1"}),
                  (std::vector<int>{OTE_PCIE_RANK_PACKAGE, OTE_PCIE_RANK_UNPLACED}))
            << gpu;
}

// Host memory keeps NUMA ranking: the selector's distances come from the same files.
TEST_F(PcieRankTest, NumaRanksOfEveryNodeFromTheRecordedShapes) {
    ASSERT_EQ(setenv("HWLOC_XMLFILE", TopologyFile("server_8gpu.xml").c_str(), 1), 0);
    ote_selector_config_t cfg = {};
    cfg.use_topology = 1;
    ote_selector_t *s = nullptr;
    ASSERT_EQ(ote_selector_create(&cfg, &s), OTE_OK);
    for (int n = 0; n < 8; n++) {
        int i = -1;
        ASSERT_EQ(ote_selector_add(s, ("mlx5_" + std::to_string(n)).c_str(), n / 4, &i), OTE_OK);
    }
    for (int node = 0; node < 2; node++)
        for (int n = 0; n < 8; n++)
            EXPECT_EQ(ote_selector_rank(s, n, node), n / 4 == node ? 10 : 21)
                << "node " << node << " NIC " << n;
    ote_selector_destroy(s);
    ASSERT_EQ(setenv("HWLOC_XMLFILE", TopologyFile("workstation_2gpu.xml").c_str(), 1), 0);
    ASSERT_EQ(ote_selector_create(&cfg, &s), OTE_OK);
    int i = -1;
    ASSERT_EQ(ote_selector_add(s, "mlx5_0", 0, &i), OTE_OK);
    EXPECT_EQ(ote_selector_rank(s, i, 0), 0) << "one node, no distance matrix: rank 0";
    ote_selector_destroy(s);
}

class TopoFileTest : public ote_test::OteTest {
  protected:
    std::string Write(const std::string &text) {
        char path[] = "/tmp/ote_topo_XXXXXX";
        int fd = mkstemp(path);
        EXPECT_GE(fd, 0);
        FILE *f = fdopen(fd, "w");
        fputs(text.c_str(), f);
        fclose(f);
        paths_.push_back(path);
        return path;
    }
    // The reader's answer for text, and its message.
    ote_status_t Read(const std::string &text, std::string *err, ote_topo_file_t **out = nullptr) {
        char buf[256] = {};
        ote_topo_file_t *f = nullptr;
        ote_status_t st = ote_topo_file_read(Write(text).c_str(), &f, buf, sizeof(buf));
        *err = buf;
        if (out != nullptr) *out = f;
        else ote_topo_file_free(f);
        return st;
    }
    void TearDown() override {
        for (const std::string &p : paths_) unlink(p.c_str());
        ote_test::OteTest::TearDown();
    }
    std::vector<std::string> paths_;
};

TEST_F(TopoFileTest, EntriesInOrder) {
    std::string err;
    ote_topo_file_t *f = nullptr;
    ASSERT_EQ(Read("# machine A\n\ngpu0 mlx5_1 mlx5_0   # swapped\n\tnuma1\tmlx5_4 mlx5_5\r\n"
                   "gpu7 mlx5_6",
                   &err, &f),
              OTE_OK)
        << err;
    ASSERT_EQ(f->n, 3u);
    const ote_topo_entry_t *g0 = ote_topo_file_find(f, OTE_TOPO_GPU, 0);
    ASSERT_NE(g0, nullptr);
    EXPECT_EQ(g0->line, 3);
    ASSERT_EQ(g0->n, 2u);
    EXPECT_STREQ(g0->nics[0], "mlx5_1");
    EXPECT_STREQ(g0->nics[1], "mlx5_0");
    const ote_topo_entry_t *n1 = ote_topo_file_find(f, OTE_TOPO_NUMA, 1);
    ASSERT_NE(n1, nullptr);
    ASSERT_EQ(n1->n, 2u);
    EXPECT_STREQ(n1->nics[1], "mlx5_5");
    const ote_topo_entry_t *g7 = ote_topo_file_find(f, OTE_TOPO_GPU, 7);
    ASSERT_NE(g7, nullptr);
    EXPECT_EQ(g7->line, 5);
    EXPECT_EQ(ote_topo_file_find(f, OTE_TOPO_GPU, 1), nullptr);
    EXPECT_EQ(ote_topo_file_find(f, OTE_TOPO_NUMA, 0), nullptr);
    ote_topo_file_free(f);
}

TEST_F(TopoFileTest, BadLinesAreNamed) {
    struct Case {
        std::string text, want;
    } cases[] = {
        {"gpu0 mlx5_0\nnic3 mlx5_1\n", "line 2: \"nic3\" is not gpu<N> or numa<N>"},
        {"gpu64 mlx5_0\n", "line 1: \"gpu64\" is not gpu<N> or numa<N>"},
        {"gpu-1 mlx5_0\n", "line 1: \"gpu-1\""},
        {"gpu mlx5_0\n", "line 1: \"gpu\""},
        {"numa0 mlx5_0\n\ngpu1\n", "line 3: no device listed"},
        {"gpu1 mlx5_0 mlx5_1 mlx5_0\n", "line 1: device mlx5_0 is listed twice"},
        {"gpu1 a\n# x\ngpu1 b\n", "line 3: gpu1 is already given on line 1"},
        {"gpu1 a b c d e f g h i j k l m n o p q\n", "line 1: more than 16 devices"},
    };
    const std::string long_name = "gpu1 " + std::string(80, 'x') + "\n";
    for (const Case &c : cases) {
        std::string err;
        EXPECT_EQ(Read(c.text, &err), OTE_ERR_INVALID) << c.text;
        EXPECT_EQ(err.rfind(c.want, 0), 0u) << "got: " << err;
    }
    std::string err;
    EXPECT_EQ(Read(long_name, &err), OTE_ERR_INVALID);
    EXPECT_EQ(err.rfind("line 1: device name", 0), 0u) << err;
    std::string long_line = "gpu0 " + std::string(5000, 'a') + "\n";
    EXPECT_EQ(Read(long_line, &err), OTE_ERR_INVALID);
    EXPECT_EQ(err.rfind("line 1: longer than", 0), 0u) << err;
    char buf[128] = {};
    ote_topo_file_t *f = nullptr;
    EXPECT_EQ(ote_topo_file_read("/nonexistent/ote_topology", &f, buf, sizeof(buf)),
              OTE_ERR_NOT_FOUND);
    EXPECT_EQ(std::string(buf).rfind("cannot open it", 0), 0u) << buf;
    EXPECT_EQ(f, nullptr);
}

} // namespace

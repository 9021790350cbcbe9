// NIC choice by PCIe affinity, end to end over verbs/sim with the fake libcuda, on the
// recorded 2-socket, 4-switch, 8-GPU, 8-NIC server (tests/engine/topology/server_8gpu.xml,
// read by hwloc through HWLOC_XMLFILE): eight sim devices named like the XML's NICs
// (mlx5_0..7, NUMA nodes 0,0,0,0,1,1,1,1) and eight fake GPUs at the XML's PCI bus ids.
// ote_engine_topology lists, for every GPU, the NIC behind its own leaf switch first
// (then its switch, its socket, the rest) and for every node the NUMA ranks; a 64 MiB
// GPUDirect WRITE from GPU k moves at least 90% of its bytes on mlx5_k (per-NIC stats),
// for every k, every byte checked at the peer. An rdma_topology file replaces the ranking
// for what it names (GPU 3 and node 1 here), the rest keeps hwloc's; a bad file fails
// ote_engine_create, its ERROR naming the line.
#include <gtest/gtest.h>

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tests/engine/engine_util.h"
#include "tests/engine/gpu_fixture.h"

extern "C" {
#include "cuda/memory/device.h"
#include "cuda/memory/memory.h"
#include "ote/ote.h"
#include "tests/engine/pattern.h"
#include "tests/util/test_base.h"
}

namespace {

using ote_test::kSec;

// 16 MiB under TSan (ote_test::TsanScaled): the same striping decision, a quarter of the bytes.
constexpr size_t kLen = ote_test::TsanScaled(64ull << 20, 4);
constexpr int kGpus = 8;
const char *const kBus[kGpus] = {"0000:16:00.0", "0000:1e:00.0", "0000:56:00.0", "0000:5e:00.0",
                                 "0000:96:00.0", "0000:9e:00.0", "0000:d6:00.0", "0000:de:00.0"};

std::string TopologyFile(const char *name) {
    const char *srcdir = std::getenv("TEST_SRCDIR");
    const char *ws = std::getenv("TEST_WORKSPACE");
    std::string rel = std::string("tests/engine/topology/") + name;
    if (srcdir == nullptr || ws == nullptr) return rel;
    return std::string(srcdir) + "/" + ws + "/" + rel;
}

// The process's environment before any driver loads or engine starts: the fake's GPUs at
// the XML's bus ids, the sim's devices named like its NICs, hwloc reading the XML.
struct ServerEnv {
    ServerEnv() {
        std::string ids, sim;
        for (int k = 0; k < kGpus; k++) {
            ids += std::string(k ? "," : "") + kBus[k];
            sim += std::string(k ? ";" : "") + "dev=mlx5_" + std::to_string(k) +
                   ",numa=" + std::to_string(k / 4) +
                   ";port;gid=auto-ll,type=v1;gid=auto-ll,type=v2;gid=auto-v4,type=v1;"
                   "gid=auto-v4,type=v2";
        }
        setenv("FAKE_CUDA_DEVICES", "8", 1);
        setenv("FAKE_CUDA_PCI_BUS_IDS", ids.c_str(), 1);
        setenv("OTE_SIM_CONFIG", sim.c_str(), 1);
        setenv("HWLOC_XMLFILE", TopologyFile("server_8gpu.xml").c_str(), 1);
    }
};
const ServerEnv g_env;

// GPU k's expected line: mlx5_k (0), its switch partner (1), its socket's other switch
// (2), the other socket (3).
std::string GpuLine(int k) {
    std::string line = "gpu" + std::to_string(k) + " " + kBus[k] + " pcie:";
    for (int rank = 0; rank < 4; rank++)
        for (int n = 0; n < kGpus; n++) {
            int r = n == k ? 0 : n / 2 == k / 2 ? 1 : n / 4 == k / 4 ? 2 : 3;
            if (r == rank) line += " mlx5_" + std::to_string(n) + "=" + std::to_string(r);
        }
    return line;
}

std::string NumaLine(int node) {
    std::string line = "numa" + std::to_string(node) + " numa:";
    for (int far = 0; far < 2; far++)
        for (int n = 0; n < kGpus; n++)
            if ((n / 4 != node) == (far != 0))
                line += " mlx5_" + std::to_string(n) + "=" + (far ? "21" : "10");
    return line;
}

class RdmaPcieTest : public ote_gpu_test::GpuTest {
  protected:
    void SetUp() override {
        GpuTest::SetUp();
        if (IsSkipped() || HasFatalFailure()) return;
        int n = 0;
        ASSERT_EQ(ote_cuda_device_count(drv_, &n), OTE_OK);
        ASSERT_EQ(n, kGpus) << "FAKE_CUDA_DEVICES=8";
        for (int k = 0; k < kGpus; k++) {
            ote_cuda_device_t *d = nullptr;
            ASSERT_EQ(ote_cuda_device_open(drv_, k, &d), OTE_OK);
            devs_.push_back(d);
        }
    }
    void TearDown() override {
        for (ote_cuda_alloc_t *a : gpu_allocs_)
            EXPECT_EQ(ote_cuda_alloc_destroy(a, ote_cuda_test::LongDeadline()), OTE_OK);
        gpu_allocs_.clear();
        if (!devs_.empty()) (void)ote_cuda_device_make_current(devs_[0]);
        for (ote_cuda_device_t *d : devs_) EXPECT_EQ(ote_cuda_device_close(d), OTE_OK);
        devs_.clear();
        GpuTest::TearDown();
    }

    static std::string Topology(ote_engine_t *e) {
        size_t need = 0;
        EXPECT_EQ(ote_engine_topology(e, nullptr, 0, &need), OTE_ERR_TOO_BIG);
        std::string text(need, '\0');
        size_t len = 0;
        EXPECT_EQ(ote_engine_topology(e, &text[0], text.size(), &len), OTE_OK);
        EXPECT_EQ(len + 1, need);
        text.resize(len);
        return text;
    }
    static std::vector<std::string> Lines(const std::string &text) {
        std::vector<std::string> out;
        size_t at = 0;
        while (at < text.size()) {
            size_t nl = text.find('\n', at);
            if (nl == std::string::npos) nl = text.size();
            out.push_back(text.substr(at, nl - at));
            at = nl + 1;
        }
        return out;
    }
    // Bytes each mlx5_k carried as requester (out) or served as source.
    static std::vector<uint64_t> BytesOut(ote_engine_t *e, bool served = false) {
        ote_nic_stats_t st[16];
        size_t n = 0;
        EXPECT_EQ(ote_engine_nic_stats(e, st, 16, &n), OTE_OK);
        std::vector<uint64_t> v(kGpus, 0);
        for (size_t i = 0; i < n; i++) {
            int k = -1;
            if (std::sscanf(st[i].name, "mlx5_%d", &k) == 1 && k >= 0 && k < kGpus)
                v[k] = served ? st[i].bytes_served : st[i].bytes_out;
        }
        return v;
    }

    // kLen bytes of device memory on GPU k, filled with the pattern of seed.
    uint64_t GpuBuffer(int k, uint64_t seed) {
        EXPECT_EQ(ote_cuda_device_make_current(devs_[k]), OTE_OK);
        ote_cuda_alloc_t *a = nullptr;
        EXPECT_EQ(ote_cuda_alloc_create(devs_[k], kLen, 0, &a), OTE_OK);
        if (a == nullptr) return 0;
        gpu_allocs_.push_back(a);
        uint64_t d = ote_cuda_alloc_ptr(a);
        DevFill(d, kLen, seed);
        return d;
    }

    // A GPUDirect WRITE of GPU k's buffer to host (registered at the peer): the bytes
    // each NIC of req carried for it.
    std::vector<uint64_t> WriteFrom(int k, ote_engine_t *req, ote_segment_t *seg,
                                    std::vector<uint8_t> &host) {
        const uint64_t seed = 100 + static_cast<uint64_t>(k);
        uint64_t d = GpuBuffer(k, seed);
        EXPECT_NE(d, 0u);
        EXPECT_EQ(ote_memory_register(req, reinterpret_cast<void *>(d), kLen, OTE_PERM_READ),
                  OTE_OK);
        std::vector<uint64_t> before = BytesOut(req);
        ote_request_t r = {OTE_WRITE, reinterpret_cast<void *>(d), seg,
                           reinterpret_cast<uintptr_t>(host.data()), kLen};
        ote_transfer_status_t ts{};
        EXPECT_EQ(ote_test::RunOne(req, r, 120 * kSec, &ts), OTE_OK);
        EXPECT_EQ(ts.bytes_done, kLen);
        EXPECT_EQ(ote_hash(host.data(), kLen), ote_pattern_hash(seed, 0, kLen))
            << "GPU " << k << ": the peer's bytes differ";
        std::vector<uint64_t> after = BytesOut(req);
        for (int n = 0; n < kGpus; n++) after[n] -= before[n];
        EXPECT_EQ(ote_memory_unregister(req, reinterpret_cast<void *>(d)), OTE_OK);
        return after;
    }

    std::vector<ote_cuda_device_t *> devs_;
    std::vector<ote_cuda_alloc_t *> gpu_allocs_;
};

TEST_F(RdmaPcieTest, EveryGpuWritesOnTheNicBehindItsOwnSwitch) {
    ote_engine_t *peer = ote_test::RdmaEngine("120000");
    ASSERT_NE(peer, nullptr);
    ote_engine_t *req = ote_gpu_test::RdmaGpuEngine("direct", {}, "120000");
    ASSERT_NE(req, nullptr);
    std::vector<std::string> lines = Lines(Topology(req));
    ASSERT_EQ(lines.size(), 10u) << Topology(req);
    for (int k = 0; k < kGpus; k++) EXPECT_EQ(lines[k], GpuLine(k));
    EXPECT_EQ(lines[8], NumaLine(0));
    EXPECT_EQ(lines[9], NumaLine(1));

    std::vector<uint8_t> host(kLen, 0);
    ASSERT_EQ(ote_memory_register(peer, host.data(), kLen, OTE_PERM_WRITE), OTE_OK);
    ote_segment_t *seg = nullptr;
    ASSERT_NO_FATAL_FAILURE(OpenSegment(req, peer, &seg));
    for (int k = 0; k < kGpus; k++) {
        std::vector<uint64_t> moved = WriteFrom(k, req, seg, host);
        uint64_t total = 0;
        for (uint64_t b : moved) total += b;
        EXPECT_EQ(total, kLen) << "GPU " << k;
        EXPECT_GE(moved[k] * 10, kLen * 9) << "GPU " << k << ": mlx5_" << k << " carried "
                                           << moved[k] << " of " << kLen << " bytes";
    }
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(peer, host.data()), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(peer), OTE_OK);
}

// The other way round: the peer's buffer is on its GPU k and the requester's is host
// memory (its runs leave on the NICs of its socket). The peer's first grant answer says
// that mlx5_k is best for that buffer (rdma_pairing.c), so every later run pairs with
// the peer's mlx5_k whichever NIC of ours it leaves on: the peer serves all of a 64 MiB
// WRITE there, for every k, every byte checked in the GPU's memory.
TEST_F(RdmaPcieTest, ThePeerServesEachGpusBufferOnTheNicBehindItsSwitch) {
    ote_engine_t *peer = ote_gpu_test::RdmaGpuEngine("direct", {}, "120000");
    ASSERT_NE(peer, nullptr);
    ote_engine_t *req = ote_test::RdmaEngine("120000");
    ASSERT_NE(req, nullptr);
    std::vector<uint8_t> host(kLen);
    ASSERT_EQ(ote_memory_register(req, host.data(), kLen, OTE_PERM_READ), OTE_OK);
    ote_segment_t *seg = nullptr;
    ASSERT_NO_FATAL_FAILURE(OpenSegment(req, peer, &seg));
    for (int k = 0; k < kGpus; k++) {
        uint64_t d = GpuBuffer(k, 300 + static_cast<uint64_t>(k));
        ASSERT_NE(d, 0u);
        void *dp = reinterpret_cast<void *>(d);
        ASSERT_EQ(ote_memory_register(peer, dp, kLen, OTE_PERM_READ | OTE_PERM_WRITE), OTE_OK);
        ote_pattern_fill(host.data(), kLen, 400 + static_cast<uint64_t>(k), 0);
        ASSERT_EQ(ote_test::RunOne(req, {OTE_WRITE, host.data(), seg, d, 4096}, 120 * kSec),
                  OTE_OK);
        std::vector<uint64_t> before = BytesOut(peer, true);
        ASSERT_EQ(ote_test::RunOne(req, {OTE_WRITE, host.data(), seg, d, kLen}, 120 * kSec),
                  OTE_OK);
        std::vector<uint64_t> after = BytesOut(peer, true);
        EXPECT_EQ(DevHash(d, kLen), ote_hash(host.data(), kLen))
            << "GPU " << k << ": the peer's bytes differ";
        uint64_t total = 0;
        for (int n = 0; n < kGpus; n++) total += after[n] - before[n];
        EXPECT_EQ(total, kLen) << "GPU " << k;
        EXPECT_EQ(after[k] - before[k], kLen)
            << "GPU " << k << ": the peer's mlx5_" << k << " served " << after[k] - before[k];
        EXPECT_EQ(ote_memory_unregister(peer, dp), OTE_OK);
    }
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(req, host.data()), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(peer), OTE_OK);
}

class RdmaTopologyFileTest : public RdmaPcieTest {
  protected:
    std::string WriteFile(const std::string &text) {
        char path[] = "/tmp/ote_rdma_topology_XXXXXX";
        int fd = mkstemp(path);
        EXPECT_GE(fd, 0);
        EXPECT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
        close(fd);
        files_.push_back(path);
        return path;
    }
    void TearDown() override {
        for (const std::string &f : files_) unlink(f.c_str());
        RdmaPcieTest::TearDown();
    }
    std::vector<std::string> files_;
};

// GPU 3 and node 1 as the file says (mlx5_6 for GPU 3: say its cable goes elsewhere); the
// other GPUs and node 0 keep hwloc's ranking; GPU 3's WRITE goes to mlx5_6.
TEST_F(RdmaTopologyFileTest, TheFileReplacesWhatItNames) {
    const std::string path = WriteFile(
        "# GPU 3's own NIC is cabled to another fabric\ngpu3 mlx5_6 mlx5_2\n"
        "numa1 mlx5_7\n");
    ote_engine_t *peer = ote_test::RdmaEngine("120000");
    ASSERT_NE(peer, nullptr);
    ote_engine_t *req =
        ote_gpu_test::RdmaGpuEngine("direct", {{"rdma_topology", path.c_str()}}, "120000");
    ASSERT_NE(req, nullptr);
    std::vector<std::string> lines = Lines(Topology(req));
    ASSERT_EQ(lines.size(), 10u);
    EXPECT_EQ(lines[3],
              "gpu3 0000:5e:00.0 file: mlx5_6=0 mlx5_2=1 mlx5_0=2 mlx5_1=2 mlx5_3=2 "
              "mlx5_4=2 mlx5_5=2 mlx5_7=2");
    EXPECT_EQ(lines[2], GpuLine(2));
    EXPECT_EQ(lines[8], NumaLine(0));
    EXPECT_EQ(lines[9],
              "numa1 file: mlx5_7=0 mlx5_0=1 mlx5_1=1 mlx5_2=1 mlx5_3=1 mlx5_4=1 "
              "mlx5_5=1 mlx5_6=1");

    std::vector<uint8_t> host(kLen, 0);
    ASSERT_EQ(ote_memory_register(peer, host.data(), kLen, OTE_PERM_WRITE), OTE_OK);
    ote_segment_t *seg = nullptr;
    ASSERT_NO_FATAL_FAILURE(OpenSegment(req, peer, &seg));
    std::vector<uint64_t> moved = WriteFrom(3, req, seg, host);
    EXPECT_GE(moved[6] * 10, kLen * 9) << "mlx5_6 carried " << moved[6];
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(peer, host.data()), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(peer), OTE_OK);
}

TEST_F(RdmaTopologyFileTest, ABadFileFailsCreationNamingTheLine) {
    const std::string path = WriteFile("gpu0 mlx5_0\ngpu0 mlx5_1\n");
    ote_config_t *cfg = ote_test::RdmaConfig();
    ASSERT_EQ(ote_config_set(cfg, "rdma_topology", path.c_str()), OTE_OK);
    ote_engine_t *e = nullptr;
    ExpectErrorLogsIn([&] { EXPECT_EQ(ote_engine_create(cfg, &e), OTE_ERR_INVALID); });
    EXPECT_EQ(e, nullptr);
    EXPECT_TRUE(LogContains("rdma_topology=" + path + ": line 2: gpu0 is already given on line 1"));
    ASSERT_EQ(ote_config_set(cfg, "rdma_topology", "/nonexistent/topology"), OTE_OK);
    ExpectErrorLogsIn([&] { EXPECT_EQ(ote_engine_create(cfg, &e), OTE_ERR_INVALID); });
    EXPECT_TRUE(LogContains("rdma_topology=/nonexistent/topology: cannot open it"));
    ote_config_destroy(cfg);
}

} // namespace

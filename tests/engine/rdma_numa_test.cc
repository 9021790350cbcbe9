// The RDMA device selector's topology rank, end to end over verbs/sim: a registration
// records the NUMA node of its memory (ote_memory_query's numa_node: host memory where
// its pages are, -1 while they are untouched), each request's slices carry it, and the
// transport puts them on the NICs nearest that node first. The sim's devices have NUMA
// nodes (sim0 0, sim1 1) but no topology, so a test hook gives the distance: 10 within a
// node, 20 across. The near NIC carries everything while it is up; memory of unknown node
// is spread over both; with the near NIC's port down the far one carries it. A local
// buffer in no registration is ranked by the node of its pages too (asked per request).
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/engine/e2e_fixture.h"
#include "tests/util/wait.h"

extern "C" {
#include "base/time.h"
#include "engine/rdma/test_hook.h"
#include "ote/ote.h"
#include "tests/engine/pattern.h"
#include "verbs/sim/sim.h"
}

namespace {

using ote_test::kSec;
using ote_test::WaitUntil;

constexpr uint64_t kLen = 16ull << 20;

ote_verbs_t *g_sim = nullptr; // the requester engine's sim instance
ote_status_t KeepSim(ote_verbs_t **v) {
    g_sim = *v;
    return OTE_OK;
}
int Distance(void *, int a, int b) { return a == b ? 10 : 20; }

// Hooks set before the fixture creates its engine (base classes construct first).
struct Hooks {
    Hooks() {
        ote__rdma_test_verbs_hook = KeepSim;
        ote__rdma_test_distance = Distance;
    }
};

ote_test::TargetSession Session() {
    ote_test::TargetSession s;
    s.rw_size = kLen;
    s.target_env = ote_test::kRdmaTargetEnv;
    s.config = {{"transport", "rdma"}, {"verbs_provider", "sim"}, {"transfer_timeout_ms", "60000"}};
    return s;
}

class RdmaNumaTest : private Hooks, public ote_test::TargetE2eTest {
  protected:
    RdmaNumaTest() : TargetE2eTest(Session()) {}
    void SetUp() override {
        ote_test::TargetE2eTest::SetUp();
        ote__rdma_test_verbs_hook = nullptr;
        ote__rdma_test_distance = nullptr; // the engine's selector keeps its own copy
        ASSERT_NE(g_sim, nullptr);
    }
    void TearDown() override {
        ote__rdma_test_verbs_hook = nullptr;
        ote__rdma_test_distance = nullptr;
        ote_test::TargetE2eTest::TearDown();
        g_sim = nullptr;
    }
    std::vector<uint64_t> BytesOut() {
        std::vector<ote_nic_stats_t> v(4);
        size_t n = 0;
        EXPECT_EQ(ote_engine_nic_stats(engine_, v.data(), v.size(), &n), OTE_OK);
        EXPECT_EQ(n, 2u);
        std::vector<uint64_t> out;
        for (size_t i = 0; i < n && i < v.size(); i++) out.push_back(v[i].bytes_out);
        return out;
    }
    // WRITE kLen from local (registered) to the target, then READ it back into check:
    // bytes intact; returns each NIC's share of the WRITE.
    std::vector<uint64_t> WriteShare(uint8_t *local) {
        auto before = BytesOut();
        EXPECT_EQ(Transfer(OTE_WRITE, local, target_.rw, kLen), OTE_OK);
        EXPECT_EQ(target_.Hash("rw", 0, kLen), ote_hash(local, kLen));
        auto after = BytesOut();
        std::vector<uint64_t> d;
        for (size_t i = 0; i < after.size() && i < before.size(); i++)
            d.push_back(after[i] - before[i]);
        return d;
    }
};

TEST_F(RdmaNumaTest, RegistrationRecordsTheNodeOfItsPages) {
    std::vector<uint8_t> touched(1 << 20, 1);
    ASSERT_EQ(ote_memory_register(engine_, touched.data(), touched.size(), OTE_PERM_READ), OTE_OK);
    ote_buffer_info_t info;
    ASSERT_EQ(ote_memory_query(engine_, touched.data(), &info), OTE_OK);
    EXPECT_GE(info.numa_node, 0) << "touched pages have a node (Linux move_pages)";

    // Pages never touched have no node yet: unknown (the query itself faults nothing in).
    size_t len = 4 << 20;
    void *fresh = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(fresh, MAP_FAILED);
    ASSERT_EQ(ote_memory_register(engine_, fresh, len, OTE_PERM_READ), OTE_OK);
    ASSERT_EQ(ote_memory_query(engine_, fresh, &info), OTE_OK);
    EXPECT_EQ(info.numa_node, -1);
    // A peer's list never carries the node.
    ote_buffer_info_t peer[4];
    size_t n = 0;
    ASSERT_EQ(ote_segment_buffers(seg_, peer, 4, &n), OTE_OK);
    ASSERT_GE(n, 1u);
    for (size_t i = 0; i < n; i++) EXPECT_EQ(peer[i].numa_node, -1);
    EXPECT_EQ(ote_memory_unregister(engine_, fresh), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(engine_, touched.data()), OTE_OK);
    munmap(fresh, len);
}

TEST_F(RdmaNumaTest, SlicesGoToTheNicNearestTheMemory) {
    std::vector<uint8_t> src(kLen);
    ote_pattern_fill(src.data(), kLen, 5, 0);
    ASSERT_EQ(ote_memory_register(engine_, src.data(), kLen, OTE_PERM_READ), OTE_OK);
    ote_buffer_info_t info;
    ASSERT_EQ(ote_memory_query(engine_, src.data(), &info), OTE_OK);
    if (info.numa_node != 0 && info.numa_node != 1)
        GTEST_SKIP() << "memory on node " << info.numa_node << ": neither sim NIC's node";
    int near = info.numa_node, far = 1 - near;

    auto share = WriteShare(src.data());
    ASSERT_EQ(share.size(), 2u);
    EXPECT_EQ(share[near], kLen) << "the NIC on the memory's node carries all of it";
    EXPECT_EQ(share[far], 0u);

    // The near NIC's port down: the far one carries the next request; back up, near again.
    const char *near_dev = near == 0 ? "sim0" : "sim1";
    ASSERT_EQ(ote_sim_set_port_state(g_sim, near_dev, 1, IBV_PORT_DOWN), OTE_OK);
    auto near_active = [&] {
        std::vector<ote_nic_stats_t> v(4);
        size_t n = 0;
        EXPECT_EQ(ote_engine_nic_stats(engine_, v.data(), v.size(), &n), OTE_OK);
        return v[near].active;
    };
    // The monitor sees the event and the selector drops the device.
    ASSERT_TRUE(WaitUntil([&] { return !near_active(); }, std::chrono::seconds(30),
                          std::string(near_dev) + " inactive"));
    ote_test::ErrorLogsExpected lost; // QPs of the downed port may log their flush
    share = WriteShare(src.data());
    EXPECT_EQ(share[near], 0u);
    EXPECT_EQ(share[far], kLen) << "the far NIC carries it while the near one is down";
    ASSERT_EQ(ote_sim_set_port_state(g_sim, near_dev, 1, IBV_PORT_ACTIVE), OTE_OK);
    ASSERT_TRUE(WaitUntil([&] { return near_active(); }, std::chrono::seconds(30),
                          std::string(near_dev) + " back"));
    // Active again in the selector; its QPs of the downed port are rebuilt by the next
    // runs' builds, and a run placed meanwhile may still take the far NIC (every byte
    // right either way: ci23 under TSan). Within 30 s the near one carries a whole WRITE.
    EXPECT_TRUE(WaitUntil(
        [&] {
            share = WriteShare(src.data());
            return share.size() == 2 && share[near] == kLen;
        },
        std::chrono::seconds(30), std::string(near_dev) + " to carry a whole WRITE again"));
    EXPECT_EQ(ote_memory_unregister(engine_, src.data()), OTE_OK);
}

// The node of the first, middle and last page of [p, p + len) when they agree, else -1
// (the kernel's answer, as engine/mem_node.c asks it).
int PagesNode(const uint8_t *p, size_t len) {
    long psz = sysconf(_SC_PAGESIZE);
    uintptr_t first = reinterpret_cast<uintptr_t>(p) & ~(uintptr_t)(psz - 1);
    uintptr_t last = (reinterpret_cast<uintptr_t>(p) + len - 1) & ~(uintptr_t)(psz - 1);
    uintptr_t mid = (first + (last - first) / 2) & ~(uintptr_t)(psz - 1);
    void *pages[3] = {(void *)first, (void *)mid, (void *)last};
    int status[3] = {-1, -1, -1};
    if (syscall(SYS_move_pages, 0, 3L, pages, nullptr, status, 0) != 0) return -1;
    return status[0] >= 0 && status[1] == status[0] && status[2] == status[0] ? status[0] : -1;
}

TEST_F(RdmaNumaTest, UnregisteredMemoryGoesToTheNicNearestItsPages) {
    std::vector<uint8_t> src(kLen);
    ote_pattern_fill(src.data(), kLen, 7, 0); // touched: its pages have a node
    int near = PagesNode(src.data(), kLen);
    if (near != 0 && near != 1) GTEST_SKIP() << "memory on node " << near << ": no sim NIC's";
    ote_buffer_info_t info;
    ASSERT_EQ(ote_memory_query(engine_, src.data(), &info), OTE_ERR_NOT_FOUND);
    auto share = WriteShare(src.data());
    ASSERT_EQ(share.size(), 2u);
    EXPECT_EQ(share[near], kLen) << "the NIC on the pages' node carries all of it";
    EXPECT_EQ(share[1 - near], 0u);
}

TEST_F(RdmaNumaTest, MemoryOfUnknownNodeIsSpreadOverEveryNic) {
    // Registered before its pages were touched: node unknown, every NIC ranks equal.
    void *p = mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(p, MAP_FAILED);
    auto *src = static_cast<uint8_t *>(p);
    ASSERT_EQ(ote_memory_register(engine_, src, kLen, OTE_PERM_READ), OTE_OK);
    ote_buffer_info_t info;
    ASSERT_EQ(ote_memory_query(engine_, src, &info), OTE_OK);
    ASSERT_EQ(info.numa_node, -1);
    ote_pattern_fill(src, kLen, 6, 0);
    auto share = WriteShare(src);
    ASSERT_EQ(share.size(), 2u);
    EXPECT_EQ(share[0] + share[1], kLen);
    EXPECT_GT(share[0], 0u);
    EXPECT_GT(share[1], 0u);
    EXPECT_EQ(ote_memory_unregister(engine_, src), OTE_OK);
    munmap(p, kLen);
}

} // namespace

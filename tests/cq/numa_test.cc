// Worker placement: a pool started for a NUMA node runs its threads only on that node's
// CPUs that the creator may use (read back from /proc for each worker thread); a node
// the machine lacks, or a failing topology query, leaves the pool unbound.
#include <gtest/gtest.h>

#include <dirent.h>
#include <sched.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/util/test_base.h"

extern "C" {
#include "base/fault.h"
#include "base/log.h"
#include "cq/workers.h"
}

namespace {

using ote_test::OteTest;

// CPU sets of this process's threads named ote-cq-*, from /proc/self/task.
std::vector<cpu_set_t> WorkerAffinities() {
    std::vector<cpu_set_t> out;
    DIR *d = opendir("/proc/self/task");
    if (d == nullptr) return out;
    while (struct dirent *e = readdir(d)) {
        if (e->d_name[0] == '.') continue;
        std::string base = std::string("/proc/self/task/") + e->d_name;
        std::ifstream comm(base + "/comm");
        std::string name;
        std::getline(comm, name);
        if (name.rfind("ote-cq-", 0) != 0) continue;
        cpu_set_t set;
        CPU_ZERO(&set);
        if (sched_getaffinity(static_cast<pid_t>(std::stoi(e->d_name)), sizeof(set), &set) == 0)
            out.push_back(set);
    }
    closedir(d);
    return out;
}

class NumaTest : public OteTest {
  protected:
    void SetUp() override {
        OteTest::SetUp();
        ASSERT_EQ(sched_getaffinity(0, sizeof(saved_), &saved_), 0);
    }
    void TearDown() override {
        sched_setaffinity(0, sizeof(saved_), &saved_);
        OteTest::TearDown();
    }
    cpu_set_t saved_;
};

TEST_F(NumaTest, WorkersRunOnTheNodesAllowedCpus) {
    // Narrow the creator to its first allowed CPU: node 0 holds it on every machine this
    // runs on, and the pool must inherit exactly that intersection.
    int first = -1;
    for (int c = 0; c < CPU_SETSIZE && first < 0; c++)
        if (CPU_ISSET(c, &saved_)) first = c;
    ASSERT_GE(first, 0);
    std::ifstream cpulist("/sys/devices/system/node/node0/cpulist");
    if (!cpulist.good()) GTEST_SKIP() << "this kernel exposes no NUMA node 0 in sysfs";
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);

    ote_cq_workers_t *w = nullptr;
    ASSERT_EQ(ote_cq_workers_start_numa(2, 0, &w), OTE_OK);
    cpu_set_t bound;
    ASSERT_EQ(ote_cq_workers_cpus(w, &bound), OTE_OK);
    EXPECT_TRUE(CPU_EQUAL(&bound, &one));
    // Restore the creator's mask: the workers must stay where the pool put them.
    ASSERT_EQ(sched_setaffinity(0, sizeof(saved_), &saved_), 0);
    std::vector<cpu_set_t> seen = WorkerAffinities();
    ASSERT_EQ(seen.size(), 2u);
    for (auto &s : seen) {
        EXPECT_TRUE(CPU_EQUAL(&s, &one));
    }
    ASSERT_EQ(ote_cq_workers_stop(w), OTE_OK);
    EXPECT_TRUE(WorkerAffinities().empty());
}

TEST_F(NumaTest, MissingNodeLeavesThePoolUnbound) {
    ote_log_level_t old = ote_log_level();
    ote_log_set_level(OTE_LOG_INFO);
    ote_cq_workers_t *w = nullptr;
    ASSERT_EQ(ote_cq_workers_start_numa(1, 4000, &w), OTE_OK);
    cpu_set_t bound;
    EXPECT_EQ(ote_cq_workers_cpus(w, &bound), OTE_ERR_NOT_FOUND);
    EXPECT_TRUE(LogContains("not bound to NUMA node 4000"));
    std::vector<cpu_set_t> seen = WorkerAffinities();
    EXPECT_EQ(seen.size(), 1u);
    if (!seen.empty()) {
        EXPECT_TRUE(CPU_EQUAL(&seen[0], &saved_)); // the creator's mask
    }
    EXPECT_EQ(ote_cq_workers_stop(w), OTE_OK);
    ote_log_set_level(old);
}

TEST_F(NumaTest, TopologyFailureLeavesThePoolUnbound) {
    ote_log_level_t old = ote_log_level();
    ote_log_set_level(OTE_LOG_INFO);
    ASSERT_EQ(ote_fault_arm("cq.workers_numa", OTE_FAULT_EVERY, 0, OTE_ERR_NATIVE, EIO), OTE_OK);
    ote_cq_workers_t *w = nullptr;
    ASSERT_EQ(ote_cq_workers_start_numa(1, 0, &w), OTE_OK);
    cpu_set_t bound;
    EXPECT_EQ(ote_cq_workers_cpus(w, &bound), OTE_ERR_NOT_FOUND);
    EXPECT_TRUE(LogContains("errno 5"));
    EXPECT_EQ(ote_cq_workers_stop(w), OTE_OK);
    ote_log_set_level(old);
}

TEST_F(NumaTest, BadArguments) {
    ote_cq_workers_t *w = nullptr;
    EXPECT_EQ(ote_cq_workers_start_numa(1, -2, &w), OTE_ERR_INVALID);
    EXPECT_EQ(ote_cq_workers_start_numa(0, 0, &w), OTE_ERR_INVALID);
    EXPECT_EQ(w, nullptr);
    cpu_set_t s;
    EXPECT_EQ(ote_cq_workers_cpus(nullptr, &s), OTE_ERR_INVALID);
}

} // namespace

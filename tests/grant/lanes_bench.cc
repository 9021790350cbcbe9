// lanes_bench: grant throughput over the sim with 1 lane and 1 requester thread against 2
// lanes and 2 requester threads of one grant manager, in the same run (issue 25 part 4).
//
// Each requester thread owns one slot of the WRITE endpoint (slot i is on lane i) and keeps
// OTE_LANES_BENCH_WINDOW grants of OTE_LANES_BENCH_KIB KiB in flight on it until its time
// is up; a grant ends on its receipt's CQE, as in the engine. The rig's source serves every
// request at once (a type-2 window bound on its side of the slot), so the source's lanes
// work as hard as the requester's. Sim port limits are off (the rig's sim config sets none).
//
// Default (a test run): a short smoke of both configurations that checks the bytes and the
// grant accounting; no timing is asserted. Bench mode (tools/rdma_lanes_bench.sh):
//   OTE_LANES_BENCH=seconds per round (rounds alternate 1x1 and 2x2, OTE_LANES_BENCH_ROUNDS
//   pairs), printing grants/s and MiB/s per round, CPU time (user+sys) per grant, and the
//   2x2 / 1x1 throughput ratio of each pair and of their medians.
#include <gtest/gtest.h>
#include <dirent.h>
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <mutex>
#include <thread>
#include <vector>

#include "tests/grant/rig.h"
#include "tests/util/test_base.h"

namespace {

using ote_test::kMs;
using ote_test::Rig;

uint64_t EnvU64(const char *name, uint64_t dflt) {
    const char *s = getenv(name);
    return s != nullptr && *s != '\0' ? strtoull(s, nullptr, 10) : dflt;
}

// CPU ticks per thread of this process (name, utime + stime), from /proc/self/task.
std::map<int, std::pair<std::string, uint64_t>> ThreadTicks() {
    std::map<int, std::pair<std::string, uint64_t>> out;
    DIR *d = opendir("/proc/self/task");
    if (d == nullptr) return out;
    while (struct dirent *e = readdir(d)) {
        if (e->d_name[0] == '.') continue;
        std::string path = std::string("/proc/self/task/") + e->d_name + "/stat";
        FILE *f = fopen(path.c_str(), "r");
        if (f == nullptr) continue;
        char buf[1024];
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[n] = '\0';
        char *l = strchr(buf, '('), *r = strrchr(buf, ')');
        if (l == nullptr || r == nullptr) continue;
        std::string name(l + 1, r);
        unsigned long long ut = 0, st = 0;
        /* after ") ": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
         * utime stime */
        if (sscanf(r + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
            continue;
        out[atoi(e->d_name)] = {name, ut + st};
    }
    closedir(d);
    return out;
}

// The busiest threads between two snapshots, as a share of one CPU over `secs`.
std::string BusiestThreads(const std::map<int, std::pair<std::string, uint64_t>> &a,
                           const std::map<int, std::pair<std::string, uint64_t>> &b, double secs) {
    std::vector<std::pair<double, std::string>> v;
    double hz = (double)sysconf(_SC_CLK_TCK);
    for (auto &kv : b) {
        auto it = a.find(kv.first);
        uint64_t t0 = it != a.end() ? it->second.second : 0;
        double pct = 100.0 * (double)(kv.second.second - t0) / hz / secs;
        if (pct >= 1.0) v.push_back({pct, kv.second.first});
    }
    std::sort(v.rbegin(), v.rend());
    std::string s;
    char one[96];
    for (auto &p : v) {
        snprintf(one, sizeof(one), "%s%s %.0f%%", s.empty() ? "" : ", ", p.second.c_str(), p.first);
        s += one;
    }
    return s;
}

double CpuSeconds() {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

// One requester thread: a window of grants in flight on its slot.
struct Flow {
    Rig *rig = nullptr;
    uint32_t slot = 0;
    uint8_t *local = nullptr;
    uint32_t lkey = 0;
    uint64_t remote_off = 0; /* its region of the source buffer */
    uint64_t len = 0;
    uint32_t window = 0;
    std::mutex mu;
    std::condition_variable cv;
    uint32_t inflight = 0;
    uint64_t done = 0, failed = 0;

    static void Done(void *arg, ote_status_t st) {
        Flow *f = static_cast<Flow *>(arg);
        std::lock_guard<std::mutex> lk(f->mu);
        f->inflight--;
        if (st == OTE_OK) f->done++;
        else f->failed++;
        f->cv.notify_one();
    }

    ote_status_t StartOne(uint32_t k) {
        ote_qp_t *qp = nullptr;
        ote_status_t st = rig->Borrow(1, slot, &qp);
        if (st != OTE_OK) return st;
        ote_grant_desc_t g = {};
        g.op = OTE_GRANT_WRITE;
        g.local = local + (uint64_t)k * len;
        g.lkey = lkey;
        g.remote = (uintptr_t)rig->src.data() + remote_off + (uint64_t)k * len;
        g.len = len;
        g.ep = rig->ep0[1];
        g.slot = slot;
        g.qp = qp;
        g.deadline = ote_deadline_after(30000 * kMs);
        g.done = Done;
        g.done_arg = this;
        ote_grant_ctl_t ctl = {rig, Rig::Request};
        st = ote_grant_start(rig->g0, &g, &ctl);
        if (st != OTE_OK) ote_endpoint_return(rig->ep0[1], slot, qp);
        return st;
    }

    // Keep the window full until `until`, then wait for what is in flight.
    void Run(std::chrono::steady_clock::time_point until, uint64_t max_grants) {
        uint64_t started = 0;
        uint32_t k = 0;
        std::unique_lock<std::mutex> lk(mu);
        while (std::chrono::steady_clock::now() < until && started < max_grants && failed == 0) {
            while (inflight < window && started < max_grants) {
                inflight++;
                lk.unlock();
                ote_status_t st = StartOne(k);
                k = (k + 1) % window;
                lk.lock();
                if (st != OTE_OK) {
                    inflight--;
                    failed++;
                    break;
                }
                started++;
            }
            cv.wait_for(lk, std::chrono::milliseconds(100), [&] { return inflight < window; });
        }
        cv.wait_for(lk, std::chrono::seconds(60), [&] { return inflight == 0; });
    }
};

class LanesBench : public ote_test::OteTest {
  protected:
    static constexpr uint64_t kSrc = 64u << 20;
    void SetUp() override {
        OteTest::SetUp();
        rig_.Open(kSrc);
    }
    void TearDown() override {
        for (auto *mr : mrs_) EXPECT_EQ(rig_.v->ops->dereg_mr(rig_.v, mr), 0);
        rig_.Close();
        OteTest::TearDown();
    }

    struct Result {
        uint64_t grants = 0, failed = 0;
        double secs = 0, cpu = 0;
        std::string threads; /* busiest threads, % of one CPU */
    };

    // `threads` flows on slots 0..threads-1 (lanes 0..threads-1) for `secs` seconds, or
    // `max_grants` grants each.
    Result RunConfig(uint32_t threads, double secs, uint64_t max_grants) {
        std::vector<std::unique_ptr<Flow>> flows;
        for (uint32_t t = 0; t < threads; t++) {
            auto f = std::make_unique<Flow>();
            f->rig = &rig_;
            f->slot = t;
            f->local = out_[t].data();
            f->lkey = mr_[t]->lkey;
            f->remote_off = (uint64_t)t * (kSrc / 2);
            f->len = len_;
            f->window = window_;
            flows.push_back(std::move(f));
        }
        auto ticks0 = ThreadTicks();
        double cpu0 = CpuSeconds();
        auto t0 = std::chrono::steady_clock::now();
        auto until = t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(secs));
        std::vector<std::thread> th;
        for (auto &f : flows)
            th.emplace_back([&f, until, max_grants] {
                char name[16];
                snprintf(name, sizeof(name), "requester-%u", f->slot);
                pthread_setname_np(pthread_self(), name);
                f->Run(until, max_grants);
            });
        for (auto &t : th) t.join();
        Result r;
        r.secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        r.cpu = CpuSeconds() - cpu0;
        r.threads = BusiestThreads(ticks0, ThreadTicks(), r.secs);
        for (auto &f : flows) {
            r.grants += f->done;
            r.failed += f->failed;
            EXPECT_EQ(f->inflight, 0u) << "slot " << f->slot << ": grants still in flight";
        }
        EXPECT_TRUE(rig_.WaitSourceIdle());
        return r;
    }

    void Prepare() {
        len_ = EnvU64("OTE_LANES_BENCH_KIB", 256) << 10;
        window_ = (uint32_t)EnvU64("OTE_LANES_BENCH_WINDOW", 4);
        ASSERT_GE(len_, 1u);
        ASSERT_LE(len_ * window_, kSrc / 2);
        ASSERT_GE(window_, 1u);
        ASSERT_LE(window_, 16u); /* the rig's 64 receive slots per source QP bound it */
        for (int t = 0; t < 2; t++) {
            out_[t].assign(len_ * window_, 0);
            for (size_t i = 0; i < out_[t].size(); i++) out_[t][i] = (uint8_t)(i * 7 + t * 3 + 1);
            struct ibv_mr *mr = nullptr;
            ASSERT_EQ(rig_.v->ops->reg_mr(rig_.v, ote_context_pd(rig_.c0), out_[t].data(),
                                          out_[t].size(), IBV_ACCESS_LOCAL_WRITE, &mr),
                      0);
            mrs_.push_back(mr);
            mr_[t] = mr;
        }
    }

    void CheckBytes(uint32_t threads) {
        for (uint32_t t = 0; t < threads; t++)
            EXPECT_EQ(
                memcmp(rig_.src.data() + (uint64_t)t * (kSrc / 2), out_[t].data(), out_[t].size()),
                0)
                << "slot " << t;
    }

    Rig rig_;
    std::vector<struct ibv_mr *> mrs_;
    std::vector<uint8_t> out_[2];
    struct ibv_mr *mr_[2] = {};
    uint64_t len_ = 0;
    uint32_t window_ = 0;
};

// Both configurations move exact bytes and end every grant OK (the bench's machinery);
// with OTE_LANES_BENCH set, the measurement itself.
TEST_F(LanesBench, OneLaneOneThreadAgainstTwoLanesTwoThreads) {
    pthread_setname_np(pthread_self(), "main"); /* the sim's progress thread keeps its own */
    Prepare();
    double secs = (double)EnvU64("OTE_LANES_BENCH", 0);
    if (secs <= 0) {
        for (uint32_t threads : {1u, 2u}) {
            Result r = RunConfig(threads, 3600.0, 8);
            EXPECT_EQ(r.failed, 0u);
            EXPECT_EQ(r.grants, 8u * threads);
            CheckBytes(threads);
        }
        ote_grant_stats_t s;
        ote_grant_mgr_get_stats(rig_.g0, &s);
        EXPECT_EQ(s.completed, 24u);
        EXPECT_EQ(s.failed, 0u);
        EXPECT_EQ(s.stale_cqes, 0u);
        return;
    }
    uint64_t rounds = EnvU64("OTE_LANES_BENCH_ROUNDS", 3);
    printf("lanes bench: %llu KiB grants (%u slices), window %u per thread, %.0f s per run\n",
           (unsigned long long)(len_ >> 10), ote_grant_slice_count(len_), window_, secs);
    printf("%-6s %-8s %10s %10s %14s\n", "round", "config", "grants/s", "MiB/s", "cpu us/grant");
    (void)RunConfig(2, 0.5, UINT64_MAX); /* warm up: both slots' QPs built, MW pool primed */
    std::vector<double> ratios, one, two;
    for (uint64_t i = 0; i < rounds; i++) {
        Result r1 = RunConfig(1, secs, UINT64_MAX);
        Result r2 = RunConfig(2, secs, UINT64_MAX);
        ASSERT_EQ(r1.failed + r2.failed, 0u);
        double g1 = r1.grants / r1.secs, g2 = r2.grants / r2.secs;
        for (auto *p : {&r1, &r2}) {
            double g = p->grants / p->secs;
            printf("%-6llu %-8s %10.0f %10.1f %14.1f\n", (unsigned long long)i,
                   p == &r1 ? "1L x 1T" : "2L x 2T", g, g * (double)len_ / (1 << 20),
                   p->grants ? p->cpu * 1e6 / (double)p->grants : 0.0);
            printf("       threads (%% of one CPU): %s\n", p->threads.c_str());
        }
        one.push_back(g1);
        two.push_back(g2);
        ratios.push_back(g2 / g1);
        printf("%-6llu ratio 2L2T/1L1T: %.2f\n", (unsigned long long)i, g2 / g1);
    }
    CheckBytes(2);
    std::sort(one.begin(), one.end());
    std::sort(two.begin(), two.end());
    std::sort(ratios.begin(), ratios.end());
    printf(
        "median: 1L1T %.0f grants/s, 2L2T %.0f grants/s, ratio of medians %.2f, median "
        "ratio %.2f\n",
        one[one.size() / 2], two[two.size() / 2], two[two.size() / 2] / one[one.size() / 2],
        ratios[ratios.size() / 2]);
}

} // namespace

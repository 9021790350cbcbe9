// The device selector (//engine/rdma/selector) with a deterministic clock and injected
// NUMA distances: allow/deny lists, ranks (best rank only, unknown topology ranks equal),
// rank tables per locality, load by bytes in flight, the completion-rate EWMA steering slices towards the faster
// NIC, inactive devices and masks, and its counters.
#include <gtest/gtest.h>

#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "tests/util/test_base.h"

extern "C" {
#include "engine/rdma/selector/selector.h"
}

namespace {

struct Clock {
    uint64_t ns = 1000;
};
uint64_t ClockNow(void *arg) { return static_cast<Clock *>(arg)->ns; }

// NUMA distances: 10 on the same node, 20 across; node 7 unknown.
int Distance(void *, int a, int b) {
    if (a == 7 || b == 7) return -1;
    return a == b ? 10 : 20;
}

class SelectorTest : public ote_test::OteTest {
  protected:
    void Make(ote_selector_config_t cfg = {}) {
        cfg.clock = ClockNow;
        cfg.clock_arg = &clock_;
        if (cfg.distance == nullptr) {
            cfg.distance = Distance;
        }
        ASSERT_EQ(ote_selector_create(&cfg, &s_), OTE_OK);
    }
    int Add(const char *name, int numa) {
        int i = -1;
        EXPECT_EQ(ote_selector_add(s_, name, numa, &i), OTE_OK) << name;
        return i;
    }
    int Pick(uint64_t len, int numa = -1, uint32_t mask = ~0u) {
        int i = -1;
        EXPECT_EQ(ote_selector_pick(s_, numa, len, mask, &i), OTE_OK);
        return i;
    }
    ote_selector_stats_t Stats(int i) {
        ote_selector_stats_t st = {};
        EXPECT_EQ(ote_selector_stats(s_, i, &st), OTE_OK);
        return st;
    }
    void TearDown() override {
        ote_selector_destroy(s_);
        ote_test::OteTest::TearDown();
    }
    Clock clock_;
    ote_selector_t *s_ = nullptr;
};

TEST_F(SelectorTest, AllowAndDenyLists) {
    const char *allow[] = {"mlx5_0", "mlx5_1", "mlx5_2"};
    const char *deny[] = {"mlx5_1"};
    ote_selector_config_t cfg = {};
    cfg.allow = allow;
    cfg.nallow = 3;
    cfg.deny = deny;
    cfg.ndeny = 1;
    EXPECT_TRUE(ote_selector_config_allows(&cfg, "mlx5_0"));
    EXPECT_FALSE(ote_selector_config_allows(&cfg, "mlx5_1"));
    EXPECT_FALSE(ote_selector_config_allows(&cfg, "mlx5_3"));
    EXPECT_FALSE(ote_selector_config_allows(&cfg, nullptr));
    ASSERT_NO_FATAL_FAILURE(Make(cfg));
    int i = -1;
    EXPECT_EQ(ote_selector_add(s_, "mlx5_1", 0, &i), OTE_ERR_NOT_FOUND);
    EXPECT_EQ(ote_selector_add(s_, "mlx5_3", 0, &i), OTE_ERR_NOT_FOUND);
    EXPECT_EQ(ote_selector_add(s_, "", 0, &i), OTE_ERR_INVALID);
    EXPECT_EQ(i, -1);
    EXPECT_EQ(Add("mlx5_2", 0), 0);
    EXPECT_EQ(Add("mlx5_0", 0), 1);
    EXPECT_EQ(ote_selector_count(s_), 2u);
    EXPECT_STREQ(Stats(1).name, "mlx5_0");
    // An empty allow list allows all but the denied.
    ote_selector_config_t open = {};
    open.deny = deny;
    open.ndeny = 1;
    EXPECT_TRUE(ote_selector_config_allows(&open, "anything"));
    EXPECT_FALSE(ote_selector_config_allows(&open, "mlx5_1"));
}

TEST_F(SelectorTest, EqualRanksAlternateAndBalance) {
    ASSERT_NO_FATAL_FAILURE(Make());
    Add("sim0", 0);
    Add("sim1", 1);
    // Memory of unknown node: every NIC ranks 0; equal load alternates.
    EXPECT_EQ(ote_selector_rank(s_, 0, -1), 0);
    EXPECT_EQ(ote_selector_rank(s_, 1, 7), 0);
    uint64_t bytes[2] = {0, 0};
    for (int k = 0; k < 64; k++) {
        int i = Pick(1 << 20);
        ASSERT_GE(i, 0);
        bytes[i] += 1 << 20;
    }
    EXPECT_EQ(bytes[0], bytes[1]);
    EXPECT_EQ(Stats(0).inflight, 32u << 20);
    for (int k = 0; k < 32; k++) {
        ote_selector_done(s_, 0, 1 << 20, 1);
        ote_selector_done(s_, 1, 1 << 20, k % 2);
    }
    EXPECT_EQ(Stats(0).inflight, 0u);
    EXPECT_EQ(Stats(0).bytes_done, 32u << 20);
    EXPECT_EQ(Stats(1).bytes_done, 16u << 20);
    EXPECT_EQ(Stats(1).bytes_failed, 16u << 20);
    EXPECT_EQ(Stats(0).picks, 32u);
}

TEST_F(SelectorTest, BestRankOnlyUntilItGoesDown) {
    ASSERT_NO_FATAL_FAILURE(Make());
    Add("near", 0);
    Add("far", 1);
    Add("far2", 1);
    EXPECT_EQ(ote_selector_rank(s_, 0, 0), 10);
    EXPECT_EQ(ote_selector_rank(s_, 1, 0), 20);
    for (int k = 0; k < 8; k++) EXPECT_EQ(Pick(4096, 0), 0) << "a far NIC for near memory";
    // Memory on node 1: the two far-from-0 NICs are near; they share.
    int a = Pick(4096, 1), b = Pick(4096, 1);
    EXPECT_NE(a, 0);
    EXPECT_NE(b, 0);
    EXPECT_NE(a, b);
    // The best NIC goes down: the next rank takes over; it comes back: it is first again.
    ASSERT_EQ(ote_selector_set_active(s_, 0, 0), OTE_OK);
    EXPECT_FALSE(ote_selector_is_active(s_, 0));
    EXPECT_NE(Pick(4096, 0), 0);
    ASSERT_EQ(ote_selector_set_active(s_, 0, 1), OTE_OK);
    EXPECT_EQ(Pick(4096, 0), 0);
    EXPECT_EQ(ote_selector_set_active(s_, 9, 1), OTE_ERR_NOT_FOUND);
}

// A NIC whose distance is unknown (no node, or a node the topology does not know) ranks
// as the farthest known placement: it never wins over a near NIC, it shares with far ones,
// and it takes over when the near NIC goes down.
TEST_F(SelectorTest, AnUnknownNodeRanksAsTheFarthest) {
    ASSERT_NO_FATAL_FAILURE(Make());
    Add("near", 0);
    Add("nonode", -1);
    Add("unknown", 7);
    EXPECT_EQ(ote_selector_rank(s_, 0, 0), 10);
    EXPECT_EQ(ote_selector_rank(s_, 1, 0), 10) << "only a near NIC is known: ties with it";
    Add("far", 1);
    EXPECT_EQ(ote_selector_rank(s_, 1, 0), 20);
    EXPECT_EQ(ote_selector_rank(s_, 2, 0), 20);
    EXPECT_EQ(ote_selector_rank(s_, 3, 0), 20);
    EXPECT_EQ(ote_selector_rank(s_, 1, -1), 0) << "memory of unknown node ranks every NIC 0";
    for (int k = 0; k < 8; k++) EXPECT_EQ(Pick(4096, 0), 0) << "an unknown NIC beat a near one";
    ASSERT_EQ(ote_selector_set_active(s_, 0, 0), OTE_OK);
    int seen[4] = {0, 0, 0, 0};
    for (int k = 0; k < 9; k++) {
        int i = Pick(4096, 0);
        ASSERT_GE(i, 0);
        ASSERT_LT(i, 4);
        seen[i]++;
    }
    EXPECT_EQ(seen[0], 0);
    EXPECT_EQ(seen[1], 3);
    EXPECT_EQ(seen[2], 3);
    EXPECT_EQ(seen[3], 3);
}

TEST_F(SelectorTest, FewestBytesInFlightFirst) {
    ASSERT_NO_FATAL_FAILURE(Make());
    Add("a", -1);
    Add("b", -1);
    EXPECT_EQ(Pick(3 << 20), 0);
    EXPECT_EQ(Pick(1 << 20), 1);
    EXPECT_EQ(Pick(1 << 20), 1); // 3 MiB vs 1 MiB in flight
    EXPECT_EQ(Pick(1 << 20), 1); // 3 vs 2
    EXPECT_EQ(Pick(1 << 20), 0); // 3 vs 3: the least recently picked
    ote_selector_done(s_, 0, 3 << 20, 1);
    EXPECT_EQ(Pick(1 << 20), 0); // 1 vs 3
}

TEST_F(SelectorTest, NoActiveDeviceAndMasks) {
    ASSERT_NO_FATAL_FAILURE(Make());
    int i = -1;
    EXPECT_EQ(ote_selector_pick(s_, -1, 1, ~0u, &i), OTE_ERR_NO_DEVICE);
    Add("a", -1);
    Add("b", -1);
    EXPECT_EQ(Pick(1, -1, 1u << 1), 1);
    EXPECT_EQ(Pick(1, -1, 1u << 1), 1);
    ASSERT_EQ(ote_selector_set_active(s_, 1, 0), OTE_OK);
    EXPECT_EQ(ote_selector_pick(s_, -1, 1, 1u << 1, &i), OTE_ERR_NO_DEVICE);
    EXPECT_EQ(ote_selector_pick(s_, -1, 1, 0, &i), OTE_ERR_NO_DEVICE);
    EXPECT_EQ(Pick(1), 0);
    EXPECT_EQ(ote_selector_pick(nullptr, -1, 1, ~0u, &i), OTE_ERR_INVALID);
}

// Two NICs that complete at 2 GB/s and 1 GB/s (a simulated clock, slices of 1 MiB, 8 in
// flight): once their rates are measured the fast one carries about two thirds.
TEST_F(SelectorTest, CompletionRateSteersTowardsTheFasterNic) {
    ote_selector_config_t cfg = {};
    cfg.rate_window_ns = 50 * 1000 * 1000; // never idle here: 50 ms samples
    ASSERT_NO_FATAL_FAILURE(Make(cfg));
    Add("fast", -1);
    Add("slow", -1);
    const uint64_t slice = 1 << 20;
    const double rate[2] = {2e9, 1e9};
    std::deque<std::pair<uint64_t, int>> q[2]; // (finish time, nic) per NIC, FIFO
    uint64_t busy_until[2] = {clock_.ns, clock_.ns};
    uint64_t bytes[2] = {0, 0};
    int inflight = 0;
    for (int k = 0; k < 4000; k++) {
        while (inflight < 8) {
            int i = Pick(slice);
            uint64_t start = busy_until[i] > clock_.ns ? busy_until[i] : clock_.ns;
            busy_until[i] = start + (uint64_t)(slice / rate[i] * 1e9);
            q[i].push_back({busy_until[i], i});
            inflight++;
            if (k > 1000) bytes[i] += slice;
        }
        int n = q[0].empty()
                    ? 1
                    : (q[1].empty() ? 0 : (q[0].front().first <= q[1].front().first ? 0 : 1));
        clock_.ns = q[n].front().first;
        q[n].pop_front();
        ote_selector_done(s_, n, slice, 1);
        inflight--;
    }
    EXPECT_GT(Stats(0).rate_bps, 1.5e9);
    EXPECT_LT(Stats(0).rate_bps, 2.5e9);
    EXPECT_GT(Stats(1).rate_bps, 0.7e9);
    EXPECT_LT(Stats(1).rate_bps, 1.3e9);
    double share = (double)bytes[0] / (double)(bytes[0] + bytes[1]);
    EXPECT_GT(share, 0.58);
    EXPECT_LT(share, 0.75);
}

// One request at a time (both devices idle at each pick): the one that measured faster
// wins every pick, so the slower one's rate is never sampled again; once it is older than
// OTE_SELECTOR_RATE_STALE windows it is not trusted, and the idle, least recently picked
// device is tried (and measured) again.
TEST_F(SelectorTest, AStaleRateIsMeasuredAgain) {
    ote_selector_config_t cfg = {};
    cfg.rate_window_ns = 100 * 1000 * 1000;
    ASSERT_NO_FATAL_FAILURE(Make(cfg));
    Add("a", -1);
    Add("b", -1);
    const uint64_t slice = 1 << 20;
    // One busy period each: a 2 ms per MiB, b 4 ms (a twice as fast).
    int i = Pick(slice), j = Pick(slice);
    ASSERT_NE(i, j);
    clock_.ns += 2 * 1000 * 1000;
    ote_selector_done(s_, 0, slice, 1);
    clock_.ns += 2 * 1000 * 1000;
    ote_selector_done(s_, 1, slice, 1);
    ASSERT_GT(Stats(0).rate_bps, 1.5 * Stats(1).rate_bps);
    // One at a time, each taking 2 ms on a: a every time, for as long as b's rate is fresh.
    const uint64_t stale = OTE_SELECTOR_RATE_STALE * cfg.rate_window_ns;
    const uint64_t b_sampled = clock_.ns;
    int picks_of_b = 0;
    while (clock_.ns - b_sampled <= stale) {
        int k = Pick(slice);
        if (k == 1) picks_of_b++;
        clock_.ns += 2 * 1000 * 1000;
        ote_selector_done(s_, k, slice, 1);
    }
    EXPECT_EQ(picks_of_b, 0) << "b picked while its slower rate was fresh";
    // b's rate is stale now: the next pick goes to b, and measures it again.
    EXPECT_EQ(Pick(slice), 1);
    clock_.ns += 2 * 1000 * 1000;
    ote_selector_done(s_, 1, slice, 1);
    EXPECT_GT(Stats(1).rate_bps, 0.0);
    EXPECT_EQ(Stats(1).picks, 2u);
}

// Rates within OTE_SELECTOR_RATE_SPREAD of each other are noise: the split follows bytes
// in flight alone, so one request's slices, all picked at once, are split evenly.
TEST_F(SelectorTest, NearlyEqualRatesSplitEvenly) {
    ASSERT_NO_FATAL_FAILURE(Make());
    Add("a", -1);
    Add("b", -1);
    // Busy periods of one 1 MiB slice each: a ends after 20 ms, b after 22 ms (a is 1.1x
    // as fast).
    const uint64_t slice = 1 << 20;
    for (int k = 0; k < 40; k++) {
        int i = Pick(slice), j = Pick(slice);
        ASSERT_NE(i, j);
        clock_.ns += 20 * 1000 * 1000;
        ote_selector_done(s_, 0, slice, 1);
        clock_.ns += 2 * 1000 * 1000;
        ote_selector_done(s_, 1, slice, 1);
    }
    double ra = Stats(0).rate_bps, rb = Stats(1).rate_bps;
    EXPECT_NEAR(ra / rb, 1.1, 0.01);
    // A slice smaller than 1 MiB alone is latency, not rate: no sample.
    int i = Pick(4096);
    clock_.ns += 50 * 1000 * 1000;
    ote_selector_done(s_, i, 4096, 1);
    EXPECT_EQ(Stats(i).rate_bps, i == 0 ? ra : rb);
    // Now 64 slices at once: 32 each.
    int n[2] = {0, 0};
    for (int k = 0; k < 64; k++) n[Pick(slice)]++;
    EXPECT_EQ(n[0], 32);
    EXPECT_EQ(n[1], 32);
}

TEST_F(SelectorTest, BadArguments) {
    ote_selector_config_t cfg = {};
    cfg.ewma_weight_pct = 101;
    ote_selector_t *s = nullptr;
    EXPECT_EQ(ote_selector_create(&cfg, &s), OTE_ERR_INVALID);
    EXPECT_EQ(ote_selector_create(nullptr, &s), OTE_ERR_INVALID);
    EXPECT_EQ(s, nullptr);
    ASSERT_NO_FATAL_FAILURE(Make());
    for (int k = 0; k < OTE_SELECTOR_MAX_DEVICES; k++) Add(("d" + std::to_string(k)).c_str(), -1);
    int i = -1;
    EXPECT_EQ(ote_selector_add(s_, "one_more", -1, &i), OTE_ERR_TOO_BIG);
    ote_selector_stats_t st;
    EXPECT_EQ(ote_selector_stats(s_, OTE_SELECTOR_MAX_DEVICES, &st), OTE_ERR_NOT_FOUND);
    ote_selector_done(s_, 99, 1, 1); // ignored
}

// A locality with a rank table ranks by it (unplaced devices after every placed one),
// picks go to its best rank only and share the load among equals; a locality without a
// table keeps the NUMA distances; a later table replaces the first.
TEST_F(SelectorTest, RankTablesReplaceDistancesForTheirLocality) {
    ASSERT_NO_FATAL_FAILURE(Make());
    int a = Add("a", 0), b = Add("b", 0), c = Add("c", 1);
    const int loc = 70;
    EXPECT_FALSE(ote_selector_has_ranks(s_, loc));
    const int ranks[2] = {3, 0}; // a: 3, b: 0, c: past the table (unplaced)
    ASSERT_EQ(ote_selector_set_ranks(s_, loc, ranks, 2), OTE_OK);
    EXPECT_TRUE(ote_selector_has_ranks(s_, loc));
    EXPECT_EQ(ote_selector_rank(s_, a, loc), 3);
    EXPECT_EQ(ote_selector_rank(s_, b, loc), 0);
    EXPECT_EQ(ote_selector_rank(s_, c, loc), 4) << "unplaced: after the worst placed rank";
    for (int k = 0; k < 4; k++) EXPECT_EQ(Pick(1 << 20, loc), b);
    EXPECT_EQ(Pick(1 << 20, loc, 1u << a | 1u << c), a) << "b masked out: the next rank";
    // Node 1 keeps its distances: c is near.
    EXPECT_EQ(ote_selector_rank(s_, c, 1), 10);
    EXPECT_EQ(Pick(1 << 20, 1), c);
    // Equal table ranks share the load.
    const int equal[3] = {0, 0, -1};
    ASSERT_EQ(ote_selector_set_ranks(s_, loc, equal, 3), OTE_OK);
    EXPECT_EQ(ote_selector_rank(s_, c, loc), 1);
    for (int i : {a, b, c}) ote_selector_done(s_, i, Stats(i).inflight, 1);
    uint64_t before_a = Stats(a).picks, before_b = Stats(b).picks;
    for (int k = 0; k < 8; k++) Pick(1 << 20, loc);
    EXPECT_EQ(Stats(a).picks - before_a, 4u);
    EXPECT_EQ(Stats(b).picks - before_b, 4u);
    EXPECT_EQ(Stats(c).picks, 1u) << "c only took the node-1 pick";
    // The best devices of a locality, among the active ones of a mask.
    EXPECT_EQ(ote_selector_best_mask(s_, loc, ~0u), 1u << a | 1u << b);
    EXPECT_EQ(ote_selector_best_mask(s_, loc, 1u << c), 1u << c);
    ASSERT_EQ(ote_selector_set_active(s_, a, 0), OTE_OK);
    EXPECT_EQ(ote_selector_best_mask(s_, loc, ~0u), 1u << b);
    EXPECT_EQ(ote_selector_best_mask(s_, loc, 1u << a), 0u) << "a is not active";
    EXPECT_EQ(ote_selector_best_mask(s_, 1, ~0u), 1u << c);
    // Bad arguments.
    EXPECT_EQ(ote_selector_set_ranks(s_, -1, ranks, 2), OTE_ERR_INVALID);
    EXPECT_EQ(ote_selector_set_ranks(s_, OTE_SELECTOR_MAX_LOCS, ranks, 2), OTE_ERR_INVALID);
    EXPECT_EQ(ote_selector_set_ranks(s_, 1, nullptr, 2), OTE_ERR_INVALID);
    EXPECT_EQ(ote_selector_set_ranks(s_, 1, ranks, OTE_SELECTOR_MAX_DEVICES + 1), OTE_ERR_INVALID);
    EXPECT_FALSE(ote_selector_has_ranks(s_, 1));
}

// With hwloc's topology (use_topology): on this machine ranks are whatever hwloc knows;
// an unknown memory node always ranks 0.
TEST(SelectorHwloc, TopologyLoadsAndUnknownNodesRankZero) {
    ote_selector_config_t cfg = {};
    cfg.use_topology = 1;
    ote_selector_t *s = nullptr;
    ASSERT_EQ(ote_selector_create(&cfg, &s), OTE_OK);
    int i = -1;
    ASSERT_EQ(ote_selector_add(s, "nic", 0, &i), OTE_OK);
    EXPECT_EQ(ote_selector_rank(s, i, -1), 0);
    EXPECT_GE(ote_selector_rank(s, i, 0), 0);
    EXPECT_EQ(ote_selector_pick(s, 0, 1, ~0u, &i), OTE_OK);
    ote_selector_destroy(s);
}

} // namespace

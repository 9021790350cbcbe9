// The data path's statistics helpers (engine/stats_internal.h, through
// stats_slot_check.c): a duration's latency slot is the bit length of its whole
// microseconds at every boundary (computed without a division by 1,000: ns / 500 | 1), and
// a completed request is counted once, in its opcode's latency slot, a request that ended
// otherwise in its state's counter and the shared slot.
#include <gtest/gtest.h>

#include <cstdint>

extern "C" {
#include "ote/ote.h"
unsigned ote_test_stats_slot(uint64_t ns);
void ote_test_stats_counts(uint64_t len, uint64_t ns, int state, uint64_t out[11]);
}

namespace {

unsigned BitLength(uint64_t v) {
    unsigned n = 0;
    for (; v != 0; v >>= 1) n++;
    return n;
}

TEST(StatsSlotTest, BitLengthOfWholeMicroseconds) {
    for (uint64_t ns : {0ull, 1ull, 499ull, 500ull, 999ull}) EXPECT_EQ(ote_test_stats_slot(ns), 0u);
    for (unsigned i = 0; i < 54; i++) { // each boundary 1000 * 2^i ns, and its neighbours
        uint64_t edge = 1000ull << i;
        for (uint64_t ns : {edge - 1, edge, edge + 1, edge + 499, edge + 500, 2 * edge - 1})
            EXPECT_EQ(ote_test_stats_slot(ns), BitLength(ns / 1000)) << ns;
    }
    EXPECT_EQ(ote_test_stats_slot(UINT64_MAX), BitLength(UINT64_MAX / 1000));
    EXPECT_LT(ote_test_stats_slot(UINT64_MAX), 56u); // OTE__LAT_SLOTS
}

TEST(StatsSlotTest, CompletedCountedByItsSlotOthersByState) {
    uint64_t v[11];
    for (int state : {OTE_TRANSFER_COMPLETED, OTE_TRANSFER_FAILED, OTE_TRANSFER_CANCELED,
                      OTE_TRANSFER_TIMEOUT}) {
        ote_test_stats_counts(8192, 5000, state, v);
        bool done = state == OTE_TRANSFER_COMPLETED;
        EXPECT_EQ(v[0], 1u);             // READs submitted
        EXPECT_EQ(v[1], 0u);             // WRITEs submitted
        EXPECT_EQ(v[2], 8192u);          // bytes submitted
        EXPECT_EQ(v[3], 1u);             // the completed READ in its slot
        EXPECT_EQ(v[4], done ? 1u : 0u); // the WRITE there only when it completed
        EXPECT_EQ(v[5], done ? 0u : 1u); // else in its state's counter
        EXPECT_EQ(v[6], done ? 0u : 1u); // and in the slots of requests not completed
        EXPECT_EQ(v[7], 8192u);          // READ bytes moved
        EXPECT_EQ(v[8], 4096u);          // WRITE bytes moved
        EXPECT_EQ(v[9], 10000u);         // both latencies
    }
}

} // namespace

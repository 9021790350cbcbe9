// Sweeps allocation failures and fault points over base's own functions: every failure
// returns a status, leaves no partial state behind and leaks nothing (ASan/LSan).
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "tests/util/test_base.h"

extern "C" {
#include "base/alloc.h"
#include "base/fault.h"
#include "base/hash.h"
#include "base/lock.h"
#include "base/status.h"
}

namespace {

using ote_test::OteTest;

class BaseFaultTest : public OteTest {};

TEST_F(BaseFaultTest, FaultArmSurvivesEveryAllocationFailure) {
    int failures_seen = 0;
    for (uint64_t n = 1; n < 64; n++) {
        ote_alloc_fail_nth(n);
        ote_status_t st = ote_fault_arm("sweep.point", OTE_FAULT_EVERY, 0, OTE_ERR_IO, 0);
        ote_alloc_fail_disarm();
        if (st == OTE_OK) {
            // Armed: the point fails, and disarming frees everything.
            ote_status_t hit = OTE_OK;
            EXPECT_TRUE(ote_fault_hit("sweep.point", &hit));
            EXPECT_EQ(hit, OTE_ERR_IO);
            EXPECT_EQ(ote_fault_disarm("sweep.point"), OTE_OK);
            EXPECT_GT(failures_seen, 0) << "the sweep never reached an allocation";
            return;
        }
        failures_seen++;
        EXPECT_EQ(st, OTE_ERR_NOMEM) << "n=" << n;
        // Nothing half-armed is left behind.
        ote_status_t hit = OTE_OK;
        EXPECT_FALSE(ote_fault_hit("sweep.point", &hit)) << "n=" << n;
        EXPECT_EQ(ote_fault_disarm("sweep.point"), OTE_ERR_NOT_FOUND) << "n=" << n;
    }
    FAIL() << "ote_fault_arm never succeeded";
}

TEST_F(BaseFaultTest, SecondPointSurvivesAllocationFailureWithoutLosingTheFirst) {
    ASSERT_EQ(ote_fault_arm("first", OTE_FAULT_EVERY, 0, OTE_ERR_BUSY, 0), OTE_OK);
    for (uint64_t n = 1; n < 64; n++) {
        ote_alloc_fail_nth(n);
        ote_status_t st = ote_fault_arm("second", OTE_FAULT_NTH, 1, OTE_ERR_IO, 0);
        ote_alloc_fail_disarm();
        ote_status_t hit;
        EXPECT_TRUE(ote_fault_hit("first", &hit)) << "n=" << n;
        if (st == OTE_OK) break;
        EXPECT_EQ(st, OTE_ERR_NOMEM);
    }
}

TEST_F(BaseFaultTest, StrdupAndAlignedAllocFailCleanly) {
    ote_alloc_fail_nth(1);
    EXPECT_EQ(ote_strdup("abc"), nullptr);
    ote_alloc_fail_nth(1);
    EXPECT_EQ(ote_aligned_alloc(64, 100), nullptr);
    ote_alloc_fail_disarm();
    char *s = ote_strdup("abc");
    ASSERT_NE(s, nullptr);
    EXPECT_STREQ(s, "abc");
    ote_free(s);
    void *p = ote_aligned_alloc(4096, 10);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 4096, 0u);
    ote_aligned_free(p);
    EXPECT_EQ(ote_aligned_alloc(3, 10), nullptr); // not a power of two
}

TEST_F(BaseFaultTest, FailFromFailsEveryLaterAllocation) {
    uint64_t before = ote_alloc_injected_failures();
    ote_alloc_fail_from(2);
    void *a = ote_malloc(8);
    void *b = ote_malloc(8);
    void *c = ote_calloc(1, 8);
    ote_alloc_fail_disarm();
    EXPECT_NE(a, nullptr);
    EXPECT_EQ(b, nullptr);
    EXPECT_EQ(c, nullptr);
    EXPECT_EQ(ote_alloc_injected_failures() - before, 2u);
    ote_free(a);
}

struct Item {
    int key;
    UT_hash_handle hh;
};

TEST_F(BaseFaultTest, HashAddUnderAllocationFailureLeavesTableConsistent) {
    Item *table = nullptr;
    std::vector<Item> items(200);
    int added = 0, refused = 0;
    for (int i = 0; i < 200; i++) {
        items[i].key = i;
        // Fail every 7th allocation: table creation and bucket expansion both fail.
        if (i % 7 == 0) ote_alloc_fail_nth(1);
        ote_status_t st;
        OTE_HASH_ADD(hh, table, key, sizeof(int), &items[i], st);
        ote_alloc_fail_disarm();
        if (st == OTE_OK) {
            added++;
        } else {
            EXPECT_EQ(st, OTE_ERR_NOMEM);
            refused++;
        }
    }
    EXPECT_GT(refused, 0);
    EXPECT_EQ(static_cast<int>(HASH_COUNT(table)), added);
    for (int i = 0; i < 200; i++) {
        Item *found = nullptr;
        int key = i;
        HASH_FIND_INT(table, &key, found);
        if (found != nullptr) {
            EXPECT_EQ(found, &items[i]);
        }
    }
    HASH_CLEAR(hh, table);
}

TEST_F(BaseFaultTest, MutexAndCondInitFaultPoints) {
    ote_mutex_t mu;
    ote_cond_t cv;
    ASSERT_EQ(ote_fault_arm("base.mutex_init", OTE_FAULT_NTH, 1, OTE_ERR_NATIVE, EAGAIN), OTE_OK);
    ote_status_t st = ote_mutex_init(&mu);
    EXPECT_EQ(ote_status_code(st), OTE_ERR_NATIVE);
    EXPECT_EQ(ote_status_errno(st), EAGAIN);
    ASSERT_EQ(ote_mutex_init(&mu), OTE_OK); // only the first hit fails
    ASSERT_EQ(ote_fault_arm("base.cond_init", OTE_FAULT_EVERY, 0, OTE_ERR_NOMEM, 0), OTE_OK);
    EXPECT_EQ(ote_cond_init(&cv), OTE_ERR_NOMEM);
    EXPECT_EQ(ote_cond_init(&cv), OTE_ERR_NOMEM);
    EXPECT_EQ(ote_fault_failures("base.cond_init"), 2u);
    ASSERT_EQ(ote_fault_disarm("base.cond_init"), OTE_OK);
    ASSERT_EQ(ote_cond_init(&cv), OTE_OK);
    ote_cond_destroy(&cv);
    ote_mutex_destroy(&mu);
}

TEST_F(BaseFaultTest, ModesNthEveryFrom) {
    ote_status_t st;
    ASSERT_EQ(ote_fault_arm("m.nth", OTE_FAULT_NTH, 3, OTE_ERR_IO, EIO), OTE_OK);
    ASSERT_EQ(ote_fault_arm("m.from", OTE_FAULT_FROM, 2, OTE_ERR_BUSY, 0), OTE_OK);
    std::vector<bool> nth, from;
    for (int i = 0; i < 5; i++) {
        errno = 0;
        bool f = ote_fault_hit("m.nth", &st);
        nth.push_back(f);
        if (f) {
            EXPECT_EQ(ote_status_code(st), OTE_ERR_IO);
            EXPECT_EQ(ote_status_errno(st), EIO);
            EXPECT_EQ(errno, EIO);
        }
        from.push_back(ote_fault_hit("m.from", &st));
    }
    EXPECT_EQ(nth, (std::vector<bool>{false, false, true, false, false}));
    EXPECT_EQ(from, (std::vector<bool>{false, true, true, true, true}));
    EXPECT_EQ(ote_fault_hits("m.nth"), 5u);
    EXPECT_EQ(ote_fault_failures("m.from"), 4u);
    // Re-arming resets the counters.
    ASSERT_EQ(ote_fault_arm("m.nth", OTE_FAULT_NTH, 1, OTE_ERR_IO, 0), OTE_OK);
    EXPECT_EQ(ote_fault_hits("m.nth"), 0u);
    EXPECT_TRUE(ote_fault_hit("m.nth", &st));
    // An unarmed point never fails.
    EXPECT_FALSE(ote_fault_hit("m.other", &st));
    EXPECT_EQ(ote_fault_hits("m.other"), 0u);
}

TEST_F(BaseFaultTest, ArmRejectsBadArguments) {
    EXPECT_EQ(ote_fault_arm(nullptr, OTE_FAULT_EVERY, 0, OTE_ERR_IO, 0), OTE_ERR_INVALID);
    EXPECT_EQ(ote_fault_arm("", OTE_FAULT_EVERY, 0, OTE_ERR_IO, 0), OTE_ERR_INVALID);
    EXPECT_EQ(ote_fault_arm("x", OTE_FAULT_NTH, 0, OTE_ERR_IO, 0), OTE_ERR_INVALID);
    EXPECT_EQ(ote_fault_arm("x", OTE_FAULT_EVERY, 0, OTE_OK, 0), OTE_ERR_INVALID);
    EXPECT_EQ(ote_fault_arm("x", static_cast<ote_fault_mode_t>(9), 1, OTE_ERR_IO, 0),
              OTE_ERR_INVALID);
    EXPECT_EQ(ote_fault_disarm(nullptr), OTE_ERR_INVALID);
}

TEST_F(BaseFaultTest, ConcurrentHitsAreCountedExactly) {
    ASSERT_EQ(ote_fault_arm("mt.point", OTE_FAULT_NTH, 5000, OTE_ERR_IO, 0), OTE_OK);
    std::atomic<int> failed{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; t++) {
        threads.emplace_back([&] {
            for (int i = 0; i < 1000; i++) {
                ote_status_t st;
                if (ote_fault_hit("mt.point", &st)) failed++;
            }
        });
    }
    for (auto &t : threads) t.join();
    EXPECT_EQ(ote_fault_hits("mt.point"), 8000u);
    EXPECT_EQ(failed.load(), 1); // exactly the 5000th hit, whichever thread made it
}

} // namespace

// Shared allocations (ote_memory_alloc_shared) end to end: this process is the requester,
// the target engine runs in a child process (ote_target). A local buffer in a shared
// allocation is copied by the target's source through its own mapping of the memfd
// (cross-memory-attach mode), which /proc/<target>/maps shows; in ring mode the same
// buffer goes through the ring and the target maps nothing. Every case checks the bytes.
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <atomic>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/engine/e2e_fixture.h"
#include "tests/util/wait.h"

extern "C" {
#include "base/time.h"
#include "ote/ote.h"
#include "tests/engine/pattern.h"
}

namespace {

using ote_test::kMs;
using ote_test::kSec;

// Mappings of the requester's shared allocations in process pid.
int SharedMaps(pid_t pid) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/maps");
    int n = 0;
    for (std::string line; std::getline(f, line);)
        if (line.find("memfd:ote-shared") != std::string::npos) n++;
    return n;
}

// SharedMaps(pid) reaches want within 20 s (the source acts on its own thread).
bool SharedMapsBecome(pid_t pid, int want) {
    return ote_test::WaitUntil(
        [&] { return SharedMaps(pid) == want; }, std::chrono::seconds(20),
        std::to_string(want) + " shared memfd mappings in process " + std::to_string(pid));
}

ote_test::TargetSession ModeSession(const char *mode) {
    ote_test::TargetSession s;
    s.config = {{"shm_mode", mode}, {"log_level", "info"}};
    return s;
}

class ShmSharedTest : public ote_test::TargetE2eTest,
                      public ::testing::WithParamInterface<const char *> {
  protected:
    ShmSharedTest() : TargetE2eTest(ModeSession(GetParam())) {}
    bool Cma() const { return strcmp(GetParam(), "auto") == 0; }

    // WRITE len bytes from local to rw+off and READ them back into back; both checked.
    void WriteRead(uint8_t *local, uint8_t *back, size_t len, uint64_t off, uint64_t seed) {
        ote_pattern_fill(local, len, seed, 0);
        ASSERT_EQ(Transfer(OTE_WRITE, local, target_.rw + off, len), OTE_OK) << len;
        ASSERT_EQ(target_.Hash("rw", off, len), ote_hash(local, len)) << len;
        memset(back, 0, len);
        ASSERT_EQ(Transfer(OTE_READ, back, target_.rw + off, len), OTE_OK) << len;
        ASSERT_EQ(memcmp(back, local, len), 0) << len;
    }
};

TEST_P(ShmSharedTest, AllocAndFreeContract) {
    void *p = nullptr;
    EXPECT_EQ(ote_memory_alloc_shared(nullptr, 4096, &p), OTE_ERR_INVALID);
    EXPECT_EQ(ote_memory_alloc_shared(engine_, 0, &p), OTE_ERR_INVALID);
    EXPECT_EQ(ote_memory_alloc_shared(engine_, 4096, nullptr), OTE_ERR_INVALID);
    EXPECT_EQ(ote_memory_alloc_shared(engine_, SIZE_MAX - 10, &p), OTE_ERR_TOO_BIG);
    EXPECT_EQ(p, nullptr); // outputs only on success
    ASSERT_EQ(ote_memory_alloc_shared(engine_, 5000, &p), OTE_OK);
    ASSERT_NE(p, nullptr);
    auto *b = static_cast<uint8_t *>(p);
    for (size_t i = 0; i < 8192; i++) ASSERT_EQ(b[i], 0) << i; // zeroed, page-rounded
    memset(b, 0x3c, 8192);
    EXPECT_EQ(ote_memory_free_shared(engine_, nullptr), OTE_ERR_INVALID);
    EXPECT_EQ(ote_memory_free_shared(engine_, b + 4096), OTE_ERR_NOT_FOUND);
    ASSERT_EQ(ote_memory_register(engine_, b + 100, 1000, OTE_PERM_READ), OTE_OK);
    EXPECT_EQ(ote_memory_free_shared(engine_, b), OTE_ERR_BUSY);
    EXPECT_EQ(b[0], 0x3c); // still mapped
    ASSERT_EQ(ote_memory_unregister(engine_, b + 100), OTE_OK);
    EXPECT_EQ(ote_memory_free_shared(engine_, b), OTE_OK);
    EXPECT_EQ(ote_memory_free_shared(engine_, b), OTE_ERR_NOT_FOUND);
}

TEST_P(ShmSharedTest, EveryByteArrivesAndTheSourceMapsItOnlyInCmaMode) {
    EXPECT_EQ(LogContains(", shared allocations"), Cma());
    const size_t len = 72u << 20;
    void *p = nullptr;
    ASSERT_EQ(ote_memory_alloc_shared(engine_, len, &p), OTE_OK);
    auto *a = static_cast<uint8_t *>(p);
    std::vector<uint8_t> back(64u << 20);
    EXPECT_EQ(SharedMaps(target_.pid), 0);
    WriteRead(a + 3, back.data(), 1, 7, 1);
    EXPECT_EQ(SharedMaps(target_.pid), Cma() ? 1 : 0); // sent once, mapped once
    WriteRead(a + 4097, back.data(), 4099, 5, 2);      // unaligned both sides
    WriteRead(a + 123, back.data(), (3u << 20) + 13, 11, 3);
    WriteRead(a + (8u << 20), back.data(), 64u << 20, 0, 4);
    // Read into the shared buffer too (the source writes through its mapping).
    memset(a, 0, 1u << 20);
    ASSERT_EQ(Transfer(OTE_READ, a + 1, target_.rw + 11, 777777), OTE_OK);
    EXPECT_EQ(ote_hash(a + 1, 777777), target_.Hash("rw", 11, 777777));
    EXPECT_EQ(a[0], 0);
    EXPECT_EQ(a[777778], 0);
    EXPECT_EQ(SharedMaps(target_.pid), Cma() ? 1 : 0);
    // A batch of 64 pieces of 4 KiB from it, and back.
    ote_batch_t *b = nullptr;
    ASSERT_EQ(ote_batch_create(engine_, 64, &b), OTE_OK);
    std::vector<ote_request_t> w(64), r(64);
    ote_pattern_fill(a, 64 * 4096, 5, 0);
    for (size_t i = 0; i < 64; i++) {
        w[i] = {OTE_WRITE, a + i * 4096, seg_, target_.rw + (63 - i) * 4096, 4096};
        r[i] = {OTE_READ, back.data() + i * 4096, seg_, target_.rw + (63 - i) * 4096, 4096};
    }
    ASSERT_EQ(ote_batch_submit(b, w.data(), 64), OTE_OK);
    ASSERT_EQ(ote_batch_wait(b, 60 * kSec), OTE_OK);
    ASSERT_EQ(ote_batch_reset(b), OTE_OK);
    ASSERT_EQ(ote_batch_submit(b, r.data(), 64), OTE_OK);
    ASSERT_EQ(ote_batch_wait(b, 60 * kSec), OTE_OK);
    EXPECT_EQ(memcmp(back.data(), a, 64 * 4096), 0);
    EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    // Freed: the source is told and unmaps it.
    EXPECT_EQ(ote_memory_free_shared(engine_, a), OTE_OK);
    EXPECT_TRUE(SharedMapsBecome(target_.pid, 0));
}

TEST_P(ShmSharedTest, FreedThenReusedAddressesGoToTheNewMemory) {
    // Free an allocation and allocate again, many times: the addresses come back, and
    // every transfer must use the memory there now, never a mapping of the freed one.
    for (int round = 0; round < 6; round++) {
        void *p = nullptr;
        ASSERT_EQ(ote_memory_alloc_shared(engine_, 1u << 20, &p), OTE_OK);
        auto *a = static_cast<uint8_t *>(p);
        std::vector<uint8_t> back(1u << 20);
        WriteRead(a, back.data(), 1u << 20, 4096, 100 + round);
        ASSERT_EQ(ote_memory_free_shared(engine_, a), OTE_OK);
        // Plain memory, possibly at the same address: cross-memory attach.
        void *q =
            mmap(nullptr, 1u << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        ASSERT_NE(q, MAP_FAILED);
        WriteRead(static_cast<uint8_t *>(q), back.data(), 1u << 20, 4096, 200 + round);
        munmap(q, 1u << 20);
    }
    EXPECT_TRUE(SharedMapsBecome(target_.pid, 0));
}

TEST_P(ShmSharedTest, ManyAllocationsAndThreadsAtOnce) {
    // More allocations than a connection maps (64): the rest go by cross-memory attach.
    const int kAllocs = 70, kThreads = 8;
    std::vector<uint8_t *> al(kAllocs);
    for (int i = 0; i < kAllocs; i++) {
        void *p = nullptr;
        ASSERT_EQ(ote_memory_alloc_shared(engine_, 64u << 10, &p), OTE_OK);
        al[i] = static_cast<uint8_t *>(p);
        ote_pattern_fill(al[i], 64u << 10, 1000 + i, 0);
    }
    std::vector<std::thread> th;
    std::atomic<int> bad{0};
    for (int t = 0; t < kThreads; t++)
        th.emplace_back([&, t] {
            ote_batch_t *b = nullptr;
            if (ote_batch_create(engine_, 16, &b) != OTE_OK) {
                bad++;
                return;
            }
            for (int i = t; i < kAllocs; i += kThreads) {
                ote_request_t w = {OTE_WRITE, al[i], seg_, target_.rw + (uint64_t)i * (64u << 10),
                                   64u << 10};
                if (ote_batch_submit(b, &w, 1) != OTE_OK ||
                    ote_batch_wait(b, 60 * kSec) != OTE_OK || ote_batch_reset(b) != OTE_OK)
                    bad++;
            }
            ote_batch_destroy(b);
        });
    for (auto &x : th) x.join();
    EXPECT_EQ(bad.load(), 0);
    for (int i = 0; i < kAllocs; i++)
        EXPECT_EQ(target_.Hash("rw", (uint64_t)i * (64u << 10), 64u << 10),
                  ote_hash(al[i], 64u << 10))
            << i;
    EXPECT_EQ(SharedMaps(target_.pid), Cma() ? 64 : 0);
    for (int i = 0; i < kAllocs; i++) EXPECT_EQ(ote_memory_free_shared(engine_, al[i]), OTE_OK);
    EXPECT_TRUE(SharedMapsBecome(target_.pid, 0));
}

TEST_P(ShmSharedTest, SegmentCloseUnmapsAtThePeer) {
    void *p = nullptr;
    ASSERT_EQ(ote_memory_alloc_shared(engine_, 1u << 20, &p), OTE_OK);
    std::vector<uint8_t> back(1u << 20);
    WriteRead(static_cast<uint8_t *>(p), back.data(), 1u << 20, 0, 9);
    EXPECT_EQ(SharedMaps(target_.pid), Cma() ? 1 : 0);
    ASSERT_EQ(ote_segment_close(seg_), OTE_OK);
    seg_ = nullptr;
    EXPECT_TRUE(SharedMapsBecome(target_.pid, 0)); // the connection's end unmaps all
    // A new segment maps it again and the bytes still arrive.
    ASSERT_EQ(ote_segment_open(engine_, target_.address.c_str(), &seg_), OTE_OK);
    WriteRead(static_cast<uint8_t *>(p), back.data(), 1u << 20, 0, 10);
    EXPECT_EQ(SharedMaps(target_.pid), Cma() ? 1 : 0);
    EXPECT_EQ(ote_memory_free_shared(engine_, p), OTE_OK);
}

TEST_P(ShmSharedTest, PeerKilledWhileMappedIsLostAndTheAllocationStaysUsable) {
    void *p = nullptr;
    ASSERT_EQ(ote_memory_alloc_shared(engine_, 64u << 20, &p), OTE_OK);
    auto *a = static_cast<uint8_t *>(p);
    std::vector<uint8_t> back(4096);
    WriteRead(a, back.data(), 4096, 0, 11);
    ASSERT_TRUE(target_.Stop());
    ote_batch_t *b = nullptr;
    ASSERT_EQ(ote_batch_create(engine_, 1, &b), OTE_OK);
    ote_request_t r = {OTE_WRITE, a, seg_, target_.rw, 64u << 20};
    ASSERT_EQ(ote_batch_submit(b, &r, 1), OTE_OK);
    uint64_t t0 = ote_now_ns();
    target_.Kill();
    ote_status_t st = ote_batch_wait(b, 20 * kSec);
    EXPECT_EQ(ote_status_code(st), OTE_ERR_PEER_LOST) << ote_status_str(st);
    EXPECT_LT((ote_now_ns() - t0) / 1000000, 10000u);
    EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    // This side's allocation is untouched and still usable; a new peer gets it mapped.
    a[5] = 0x42;
    EXPECT_EQ(a[5], 0x42);
    ote_test::Target fresh;
    ASSERT_TRUE(fresh.Start(16u << 20));
    ote_segment_t *s2 = nullptr;
    ASSERT_EQ(ote_segment_open(engine_, fresh.address.c_str(), &s2), OTE_OK);
    ote_pattern_fill(a, 999999, 12, 0);
    ote_request_t w = {OTE_WRITE, a, s2, fresh.rw + 1, 999999};
    EXPECT_EQ(ote_test::RunOne(engine_, w, 30 * kSec), OTE_OK);
    EXPECT_EQ(fresh.Hash("rw", 1, 999999), ote_hash(a, 999999));
    EXPECT_EQ(SharedMaps(fresh.pid), Cma() ? 1 : 0);
    EXPECT_EQ(ote_segment_close(s2), OTE_OK);
    EXPECT_EQ(fresh.Quit(), 0);
    EXPECT_EQ(ote_memory_free_shared(engine_, a), OTE_OK);
}

INSTANTIATE_TEST_SUITE_P(Modes, ShmSharedTest, ::testing::Values("auto", "ring"),
                         [](const ::testing::TestParamInfo<const char *> &i) {
                             return std::string(i.param);
                         });

} // namespace

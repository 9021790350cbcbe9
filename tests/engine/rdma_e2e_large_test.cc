// RDMA transport end to end over verbs/sim, the large cases: 1 GiB WRITE and READ with
// every byte checked (two processes), and a peer killed mid-transfer while the survivor
// keeps working with a third process.
#include <gtest/gtest.h>

#include <sys/mman.h>

#include <cstring>
#include <string>
#include <vector>

#include "tests/engine/engine_util.h"
#include "tests/engine/target.h"
#include "tests/util/test_base.h"

extern "C" {
#include "base/time.h"
#include "ote/ote.h"
#include "tests/engine/pattern.h"
}

namespace {

using ote_test::kRdmaTargetEnv;
using ote_test::kSec;
using ote_test::RdmaEngine;

// One request, waited for; a completed one moved all len bytes.
ote_status_t Xfer(ote_engine_t *e, ote_opcode_t op, void *local, ote_segment_t *seg,
                  uint64_t remote, size_t len) {
    ote_transfer_status_t ts;
    ote_status_t st = ote_test::RunOne(e, {op, local, seg, remote, len}, 120 * kSec, &ts);
    if (st == OTE_OK) {
        EXPECT_EQ(ts.bytes_done, len);
    }
    return st;
}

class RdmaE2eLargeTest : public ote_test::OteTest {};

TEST_F(RdmaE2eLargeTest, OneGiBWriteThenReadEveryByteChecked) {
    constexpr size_t kLen = 1ull << 30;
    ote_test::Target t;
    ASSERT_TRUE(t.Start(kLen + 4096, "127.0.0.1:0", kRdmaTargetEnv));
    ote_engine_t *e = RdmaEngine("60000");
    ASSERT_NE(e, nullptr);
    ote_segment_t *s = nullptr;
    ASSERT_EQ(ote_segment_open(e, t.address.c_str(), &s), OTE_OK);
    auto *buf = static_cast<uint8_t *>(
        mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    ASSERT_NE(buf, MAP_FAILED);
    ote_pattern_fill(buf, kLen, 4343, 0);
    uint64_t want = ote_hash(buf, kLen);
    ASSERT_EQ(ote_memory_register(e, buf, kLen, OTE_PERM_READ | OTE_PERM_WRITE), OTE_OK);
    // Unaligned remote offset: 16384 grants of 64 KiB slices each way.
    ASSERT_EQ(Xfer(e, OTE_WRITE, buf, s, t.rw + 4096, kLen), OTE_OK);
    EXPECT_EQ(t.Hash("rw", 4096, kLen), want) << "WRITE: the target's bytes differ";
    memset(buf, 0, kLen);
    ASSERT_EQ(Xfer(e, OTE_READ, buf, s, t.rw + 4096, kLen), OTE_OK);
    // Every byte read back against the pattern, chunk by chunk.
    std::vector<uint8_t> chunk(1u << 20);
    size_t bad = 0;
    for (size_t off = 0; off < kLen; off += chunk.size()) {
        ote_pattern_fill(chunk.data(), chunk.size(), 4343, off);
        if (memcmp(buf + off, chunk.data(), chunk.size()) != 0) bad++;
    }
    EXPECT_EQ(bad, 0u) << "READ: MiB chunks that differ";
    EXPECT_EQ(ote_memory_unregister(e, buf), OTE_OK);
    munmap(buf, kLen);
    EXPECT_EQ(ote_segment_close(s), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
    EXPECT_EQ(t.Quit(), 0);
}

TEST_F(RdmaE2eLargeTest, PeerKilledMidTransferSurvivorKeepsWorkingWithAThirdProcess) {
    constexpr size_t kLen = 64u << 20;
    ote_test::Target victim, third;
    ASSERT_TRUE(victim.Start(kLen, "127.0.0.1:0", kRdmaTargetEnv));
    ASSERT_TRUE(third.Start(kLen, "127.0.0.1:0", kRdmaTargetEnv));
    ote_engine_t *e = RdmaEngine("20000");
    ASSERT_NE(e, nullptr);
    ote_segment_t *sv = nullptr, *st3 = nullptr;
    ASSERT_EQ(ote_segment_open(e, victim.address.c_str(), &sv), OTE_OK);
    ASSERT_EQ(ote_segment_open(e, third.address.c_str(), &st3), OTE_OK);
    std::vector<uint8_t> src(kLen), dst(kLen, 0);
    ote_pattern_fill(src.data(), kLen, 99, 0);
    // Much in flight to the victim, then it dies.
    ote_batch_t *bv = nullptr;
    ASSERT_EQ(ote_batch_create(e, 8, &bv), OTE_OK);
    std::vector<ote_request_t> rv;
    for (int i = 0; i < 8; i++) rv.push_back({OTE_WRITE, src.data(), sv, victim.rw, kLen});
    uint64_t t0 = ote_now_ns();
    ASSERT_EQ(ote_batch_submit(bv, rv.data(), rv.size()), OTE_OK);
    victim.Kill();
    // Meanwhile the third process is served: WRITE and READ with byte checks.
    ASSERT_EQ(Xfer(e, OTE_WRITE, src.data(), st3, third.rw, kLen), OTE_OK);
    EXPECT_EQ(third.Hash("rw", 0, kLen), ote_hash(src.data(), kLen));
    ote_status_t stv = ote_batch_wait(bv, 40 * kSec);
    uint64_t took = ote_now_ns() - t0;
    EXPECT_NE(stv, OTE_OK);
    EXPECT_NE(ote_status_code(stv), OTE_ERR_TIMEOUT)
        << "requests to the dead peer still pending after 40 s";
    EXPECT_LT(took, 25 * kSec); /* transfer_timeout_ms is 20 s */
    EXPECT_EQ(ote_batch_destroy(bv), OTE_OK);
    // After the victim's requests ended, the survivor still works with the third process.
    ASSERT_EQ(Xfer(e, OTE_READ, dst.data(), st3, third.rw, kLen), OTE_OK);
    EXPECT_EQ(memcmp(dst.data(), src.data(), kLen), 0);
    ote_pattern_fill(src.data(), kLen, 100, 0);
    ASSERT_EQ(Xfer(e, OTE_WRITE, src.data() + 1, st3, third.rw + 3, kLen - 7), OTE_OK);
    EXPECT_EQ(third.Hash("rw", 3, kLen - 7), ote_hash(src.data() + 1, kLen - 7));
    // Requests to the dead peer fail at once, and its segment closes.
    EXPECT_NE(Xfer(e, OTE_WRITE, src.data(), sv, victim.rw, 4096), OTE_OK);
    EXPECT_EQ(ote_segment_close(sv), OTE_OK);
    EXPECT_EQ(ote_segment_close(st3), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
    EXPECT_EQ(third.Quit(), 0);
}

} // namespace

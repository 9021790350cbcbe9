// 1 GiB WRITE and READ against a target in a child process, every byte checked.
#include <gtest/gtest.h>

#include <sys/mman.h>

#include "tests/engine/target.h"
#include "tests/util/test_base.h"

extern "C" {
#include "ote/ote.h"
#include "tests/engine/pattern.h"
}

namespace {

TEST(E2eLargeTest, OneGiBWriteThenRead) {
    constexpr size_t kLen = 1ull << 30;
    ote_test::Target t;
    ASSERT_TRUE(t.Start(kLen + 4096));
    ote_engine_t *e = nullptr;
    ASSERT_EQ(ote_engine_create(nullptr, &e), OTE_OK);
    ote_segment_t *s = nullptr;
    ASSERT_EQ(ote_segment_open(e, t.address.c_str(), &s), OTE_OK);
    auto *src = static_cast<uint8_t *>(
        mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    ASSERT_NE(src, MAP_FAILED);
    ote_pattern_fill(src, kLen, 4242, 0);
    uint64_t want = ote_hash(src, kLen);
    ote_batch_t *b = nullptr;
    ASSERT_EQ(ote_batch_create(e, 2, &b), OTE_OK);
    ote_request_t w = {OTE_WRITE, src, s, t.rw + 4096, kLen};
    ASSERT_EQ(ote_batch_submit(b, &w, 1), OTE_OK);
    ASSERT_EQ(ote_batch_wait(b, 120ull * 1000000000ull), OTE_OK);
    EXPECT_EQ(t.Hash("rw", 4096, kLen), want);
    memset(src, 0, kLen);
    ote_request_t r = {OTE_READ, src, s, t.rw + 4096, kLen};
    ASSERT_EQ(ote_batch_submit(b, &r, 1), OTE_OK);
    ASSERT_EQ(ote_batch_wait(b, 120ull * 1000000000ull), OTE_OK);
    ote_transfer_status_t ts;
    ASSERT_EQ(ote_batch_status(b, 1, &ts), OTE_OK);
    EXPECT_EQ(ts.bytes_done, kLen);
    EXPECT_EQ(ote_hash(src, kLen), want);
    munmap(src, kLen);
    EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    EXPECT_EQ(ote_segment_close(s), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
    EXPECT_EQ(t.Quit(), 0);
}

} // namespace

#include "tests/engine/e2e_fixture.h"

#include <gtest/gtest.h>

#include <cstring>

extern "C" {
#include "tests/engine/pattern.h"
}

namespace ote_test {

void TargetE2eTest::SetUp() {
    OteTest::SetUp();
    ASSERT_TRUE(target_.Start(session_.rw_size, "127.0.0.1:0", session_.target_env))
        << "target did not start";
    if (session_.config.empty()) {
        ASSERT_EQ(ote_engine_create(nullptr, &engine_), OTE_OK);
    } else {
        engine_ = NewEngine(session_.config);
        ASSERT_NE(engine_, nullptr);
    }
    ASSERT_EQ(ote_segment_open(engine_, target_.address.c_str(), &seg_), OTE_OK);
}

void TargetE2eTest::TearDown() {
    if (seg_) {
        EXPECT_EQ(ote_segment_close(seg_), OTE_OK);
    }
    if (engine_) {
        EXPECT_EQ(ote_engine_destroy(engine_), OTE_OK);
    }
    if (target_.pid > 0) {
        EXPECT_EQ(target_.Quit(), 0);
    }
    OteTest::TearDown();
}

ote_status_t TargetE2eTest::Transfer(ote_opcode_t op, void *local, uint64_t remote, size_t len,
                                     ote_transfer_status_t *st_out) {
    return RunOne(engine_, {op, local, seg_, remote, len}, session_.wait_ns, st_out);
}

void TargetE2eTest::RoundTrip(size_t len, uint64_t off, size_t local_shift, uint64_t seed) {
    std::vector<uint8_t> src(len + local_shift + 1), dst(len + local_shift + 2, 0xEE);
    ote_pattern_fill(src.data() + local_shift, len, seed, 0);
    ASSERT_EQ(Transfer(OTE_WRITE, src.data() + local_shift, target_.rw + off, len), OTE_OK) << len;
    EXPECT_EQ(target_.Hash("rw", off, len), ote_hash(src.data() + local_shift, len)) << len;
    ote_transfer_status_t ts;
    ASSERT_EQ(Transfer(OTE_READ, dst.data() + local_shift, target_.rw + off, len, &ts), OTE_OK)
        << len;
    EXPECT_EQ(ts.state, OTE_TRANSFER_COMPLETED);
    EXPECT_EQ(ts.bytes_done, len);
    EXPECT_EQ(memcmp(dst.data() + local_shift, src.data() + local_shift, len), 0) << len;
    for (size_t i = 0; i < local_shift; i++) ASSERT_EQ(dst[i], 0xEE);
    ASSERT_EQ(dst[local_shift + len], 0xEE) << "READ wrote past its range";
}

} // namespace ote_test

// A restarted peer at the same address over TCP and shm (engine epochs in the advertisement
// of every HELLO_ACK): the target runs as a child process (ote_target), is killed with
// SIGKILL and started again on the same "host:port" (shm: the new process listens on a
// socket of its own, which the requester learns from the new advertisement).
//  - a segment opened before the restart is bound to the incarnation it met: its requests
//    fail with OTE_ERR_PEER_LOST, a WARN says the peer restarted and the segment must be
//    opened again, and no byte of the new process changes;
//  - closing it and opening a new segment works on the first try, WRITE and READ, every
//    byte checked;
//  - a segment of the same incarnation that was never disturbed keeps working.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "tests/engine/engine_util.h"
#include "tests/engine/target.h"
#include "tests/util/test_base.h"

extern "C" {
#include "ote/ote.h"
#include "tests/engine/pattern.h"
}

namespace {

using ote_test::kSec;

constexpr size_t kLen = 4u << 20;

struct Mode {
    const char *name;       // the transport the segment must get
    const char *transports; // the requester engine's list
    std::vector<std::string> target_env;
};

const Mode kModes[] = {
    {"tcp", "tcp", {"OTE_TRANSPORTS=tcp"}},
    {"shm", "shm,tcp", {}},
    {"shm", "shm,tcp", {"OTE_SHM_MODE=ring"}},
};

class PeerRestartTest : public ote_test::OteTest, public ::testing::WithParamInterface<int> {
  protected:
    const Mode &M() const { return kModes[GetParam()]; }
    void SetUp() override {
        OteTest::SetUp();
        req_ =
            ote_test::NewEngine({{"transports", M().transports}, {"transfer_timeout_ms", "30000"}});
        ASSERT_NE(req_, nullptr);
        src_.resize(kLen);
        dst_.assign(kLen, 0);
        ASSERT_EQ(ote_memory_register(req_, src_.data(), kLen, OTE_PERM_READ), OTE_OK);
        ASSERT_EQ(ote_memory_register(req_, dst_.data(), kLen, OTE_PERM_WRITE), OTE_OK);
    }
    void TearDown() override {
        if (req_ != nullptr) {
            EXPECT_EQ(ote_memory_unregister(req_, src_.data()), OTE_OK);
            EXPECT_EQ(ote_memory_unregister(req_, dst_.data()), OTE_OK);
            EXPECT_EQ(ote_engine_destroy(req_), OTE_OK);
        }
        OteTest::TearDown();
    }

    ote_segment_t *Open(const std::string &addr) {
        ote_segment_t *seg = nullptr;
        EXPECT_EQ(ote_segment_open(req_, addr.c_str(), &seg), OTE_OK);
        if (seg == nullptr) return nullptr;
        ote_segment_info_t info;
        EXPECT_EQ(ote_segment_info(seg, &info), OTE_OK);
        EXPECT_STREQ(info.transport, M().name);
        return seg;
    }

    // WRITE a fresh pattern into t's rw buffer and READ it back, both checked.
    void WriteThenRead(ote_test::Target &t, ote_segment_t *seg, uint64_t seed) {
        ote_pattern_fill(src_.data(), kLen, seed, 0);
        ASSERT_EQ(ote_test::RunOne(req_, {OTE_WRITE, src_.data(), seg, t.rw, kLen}, 60 * kSec),
                  OTE_OK);
        EXPECT_EQ(t.Hash("rw", 0, kLen), ote_hash(src_.data(), kLen));
        memset(dst_.data(), 0, kLen);
        ASSERT_EQ(ote_test::RunOne(req_, {OTE_READ, dst_.data(), seg, t.rw, kLen}, 60 * kSec),
                  OTE_OK);
        EXPECT_EQ(memcmp(dst_.data(), src_.data(), kLen), 0);
    }

    size_t RestartWarnings() {
        size_t n = 0;
        for (const auto &l : Logs())
            if (l.rfind("W [", 0) == 0 && l.find("restarted") != std::string::npos &&
                l.find("open a new segment") != std::string::npos)
                n++;
        return n;
    }

    ote_engine_t *req_ = nullptr;
    std::vector<uint8_t> src_, dst_;
};

TEST_P(PeerRestartTest, SegmentOpenedBeforeRestartFailsPeerLostAndANewOneWorksFirstTry) {
    ote_test::Target t;
    ASSERT_TRUE(t.Start(kLen, "127.0.0.1:0", M().target_env));
    const std::string addr = t.address;
    ote_segment_t *old = Open(addr);
    ASSERT_NE(old, nullptr);
    WriteThenRead(t, old, 1);
    t.Kill();
    ASSERT_TRUE(t.Start(kLen, addr, M().target_env)) << "no target on " << addr;
    ASSERT_EQ(t.address, addr);
    const uint64_t fresh = t.Hash("rw", 0, kLen); // the new process's own bytes
    ote_pattern_fill(src_.data(), kLen, 2, 0);
    for (int round = 0; round < 2; round++) {
        for (ote_opcode_t op : {OTE_WRITE, OTE_READ}) {
            ote_status_t st = ote_test::RunOne(
                req_, {op, op == OTE_WRITE ? src_.data() : dst_.data(), old, t.rw, kLen},
                60 * kSec);
            EXPECT_EQ(ote_status_code(st), OTE_ERR_PEER_LOST)
                << ote_status_str(st) << " round " << round << " op " << op;
            ASSERT_EQ(t.Hash("rw", 0, kLen), fresh) << "the old segment wrote into the new peer";
        }
    }
    EXPECT_EQ(RestartWarnings(), 1u) << "one WARN names the restart";
    EXPECT_EQ(ote_segment_close(old), OTE_OK);
    ote_segment_t *seg = Open(addr);
    ASSERT_NE(seg, nullptr);
    WriteThenRead(t, seg, 3); // the first requests after the restart
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(t.Quit(), 0);
}

TEST_P(PeerRestartTest, NewSegmentAfterRestartReadFirstWorks) {
    ote_test::Target t;
    ASSERT_TRUE(t.Start(kLen, "127.0.0.1:0", M().target_env));
    const std::string addr = t.address;
    ote_segment_t *seg = Open(addr);
    ASSERT_NE(seg, nullptr);
    WriteThenRead(t, seg, 4);
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    t.Kill();
    ASSERT_TRUE(t.Start(kLen, addr, M().target_env)) << "no target on " << addr;
    seg = Open(addr);
    ASSERT_NE(seg, nullptr);
    memset(dst_.data(), 0, kLen);
    ote_transfer_status_t ts;
    ASSERT_EQ(ote_test::RunOne(req_, {OTE_READ, dst_.data(), seg, t.rw, kLen}, 60 * kSec, &ts),
              OTE_OK);
    EXPECT_EQ(ts.state, OTE_TRANSFER_COMPLETED);
    EXPECT_EQ(ote_hash(dst_.data(), kLen), t.Hash("rw", 0, kLen));
    WriteThenRead(t, seg, 5);
    EXPECT_EQ(RestartWarnings(), 0u) << "no segment met two incarnations";
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(t.Quit(), 0);
}

// Another target restarting does not disturb a segment of a peer that lives on.
TEST_P(PeerRestartTest, OtherPeersSegmentKeepsWorking) {
    ote_test::Target a, b;
    ASSERT_TRUE(a.Start(kLen, "127.0.0.1:0", M().target_env));
    ASSERT_TRUE(b.Start(kLen, "127.0.0.1:0", M().target_env));
    ote_segment_t *sa = Open(a.address), *sb = Open(b.address);
    ASSERT_NE(sa, nullptr);
    ASSERT_NE(sb, nullptr);
    WriteThenRead(a, sa, 6);
    WriteThenRead(b, sb, 7);
    const std::string baddr = b.address;
    b.Kill();
    ASSERT_TRUE(b.Start(kLen, baddr, M().target_env));
    WriteThenRead(a, sa, 8);
    EXPECT_EQ(ote_segment_close(sa), OTE_OK);
    EXPECT_EQ(ote_segment_close(sb), OTE_OK);
    EXPECT_EQ(a.Quit(), 0);
    EXPECT_EQ(b.Quit(), 0);
}

INSTANTIATE_TEST_SUITE_P(Transports, PeerRestartTest, ::testing::Values(0, 1, 2),
                         [](const ::testing::TestParamInfo<int> &i) {
                             return std::string(i.param == 0   ? "tcp"
                                                : i.param == 1 ? "shm"
                                                               : "shm_ring");
                         });

} // namespace

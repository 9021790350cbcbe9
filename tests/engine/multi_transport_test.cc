// TCP and RDMA in one engine behind its one listening socket (engine/listen.c): an engine
// with transports=rdma,tcp (RDMA over verbs/sim) meeting tcp-only, rdma-only and
// rdma,tcp targets in a child process (ote_target), with byte checks on WRITE and READ
// and the chosen transport read with ote_segment_info; and raw connections whose HELLO
// names a transport the engine does not serve, refused while the engine serves on.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "tests/engine/ctl_peer.h"
#include "tests/engine/e2e_fixture.h"

extern "C" {
#include "engine/control/ctl.h"
#include "ote/ote.h"
#include "tests/engine/pattern.h"
}

namespace {

using ote_test::ConfigKv;
using ote_test::kSec;
using ote_test::Target;

const ConfigKv kRdmaTcp = {
    {"transports", "rdma,tcp"}, {"verbs_provider", "sim"}, {"transfer_timeout_ms", "20000"}};

std::string TransportOf(ote_segment_t *seg) {
    ote_segment_info_t info;
    if (ote_segment_info(seg, &info) != OTE_OK) return "?";
    return info.transport;
}

class MultiTransportTest : public ote_test::OteTest {
  protected:
    // Opens a segment from an engine configured kv to a target started with env, moves
    // WRITE then READ of several sizes (1 byte, odd and unaligned, several slices) with
    // byte checks both ways, and returns the transport ote_segment_info names ("none"
    // when the open failed).
    std::string OpenAndMove(const ConfigKv &kv, const std::vector<std::string> &env) {
        Target t;
        EXPECT_TRUE(t.Start(8u << 20, "127.0.0.1:0", env));
        ote_engine_t *e = ote_test::NewEngine(kv);
        EXPECT_NE(e, nullptr);
        if (e == nullptr) return "?";
        ote_segment_t *seg = nullptr;
        std::string name = "none";
        if (ote_segment_open(e, t.address.c_str(), &seg) == OTE_OK) {
            name = TransportOf(seg);
            uint64_t seed = 40;
            for (size_t len : {size_t{1}, size_t{300001}, size_t{(3u << 20) + 12345}}) {
                uint64_t off = 1 + seed % 7; // unaligned at the target
                std::vector<uint8_t> src(len), dst(len, 0);
                ote_pattern_fill(src.data(), src.size(), seed++, 0);
                EXPECT_EQ(
                    ote_test::RunOne(e, {OTE_WRITE, src.data(), seg, t.rw + off, len}, 60 * kSec),
                    OTE_OK)
                    << name << " WRITE " << len;
                EXPECT_EQ(
                    ote_test::RunOne(e, {OTE_READ, dst.data(), seg, t.rw + off, len}, 60 * kSec),
                    OTE_OK)
                    << name << " READ " << len;
                EXPECT_TRUE(src == dst) << name << ": bytes differ after " << len;
                // The target's own view of the bytes written: nothing outside them moved.
                EXPECT_EQ(t.Hash("rw", off, len), ote_hash(src.data(), len)) << name;
            }
            EXPECT_EQ(ote_segment_close(seg), OTE_OK);
        }
        EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
        EXPECT_EQ(t.Quit(), 0);
        return name;
    }
};

TEST_F(MultiTransportTest, RdmaTcpMeetsTcpOnlyOverTcp) {
    EXPECT_EQ(OpenAndMove(kRdmaTcp, {"OTE_TRANSPORTS=tcp"}), "tcp");
}

TEST_F(MultiTransportTest, RdmaTcpMeetsRdmaOnlyOverRdma) {
    EXPECT_EQ(OpenAndMove(kRdmaTcp, {"OTE_TRANSPORTS=rdma", "OTE_VERBS_PROVIDER=sim"}), "rdma");
}

TEST_F(MultiTransportTest, RdmaTcpMeetsRdmaTcpOverRdma) {
    EXPECT_EQ(OpenAndMove(kRdmaTcp, {"OTE_TRANSPORTS=rdma,tcp", "OTE_VERBS_PROVIDER=sim"}), "rdma");
}

// The target side of the shared listener: one rdma,tcp engine serves a tcp-only and an
// rdma-only requester, each on its own transport, and a requester that prefers tcp gets
// tcp from it (the requester's order decides).
TEST_F(MultiTransportTest, RdmaTcpTargetServesEachTransport) {
    const std::vector<std::string> env = {"OTE_TRANSPORTS=rdma,tcp", "OTE_VERBS_PROVIDER=sim"};
    EXPECT_EQ(OpenAndMove({{"transports", "tcp"}}, env), "tcp");
    EXPECT_EQ(OpenAndMove({{"transports", "rdma"}, {"verbs_provider", "sim"}}, env), "rdma");
    EXPECT_EQ(OpenAndMove({{"transports", "tcp,rdma"}, {"verbs_provider", "sim"}}, env), "tcp");
}

// All three: same host, so shm first; with another host's identity (the test hook),
// rdma, the next both offer.
TEST_F(MultiTransportTest, ShmRdmaTcpChoosesShmThenRdma) {
    const ConfigKv all = {{"transports", "shm,rdma,tcp"}, {"verbs_provider", "sim"}};
    EXPECT_EQ(OpenAndMove(all, {"OTE_TRANSPORTS=shm,rdma,tcp", "OTE_VERBS_PROVIDER=sim"}), "shm");
    EXPECT_EQ(OpenAndMove(all, {"OTE_TRANSPORTS=shm,rdma,tcp", "OTE_VERBS_PROVIDER=sim",
                                "OTE_TEST_HOST_SUFFIX=-elsewhere"}),
              "rdma");
}

std::vector<uint8_t> Hello(uint16_t role, uint64_t req_id) {
    ote_ctl_msg_t h{};
    h.version = OTE_CTL_VERSION_MAX;
    h.opcode = OTE_CTL_HELLO;
    h.req_id = req_id;
    h.u.hello.min_version = OTE_CTL_VERSION_MIN;
    h.u.hello.max_version = OTE_CTL_VERSION_MAX;
    h.u.hello.role = role;
    h.u.hello.addr = "raw:1";
    h.u.hello.addr_len = 5;
    return ote_test::Encode(h);
}

// One raw connection: HELLO of role, the first frame back. False when none came.
bool HelloAnswer(const std::string &addr, uint16_t role, ote_ctl_msg_t *m,
                 std::vector<uint8_t> *buf, int *fd_out) {
    int fd = ote_test::ConnectTo(addr);
    if (fd < 0) return false;
    *fd_out = fd;
    return ote_test::SendAll(fd, Hello(role, 77)) && ote_test::ReadFrame(fd, buf, m);
}

// A refusal: ERROR, OTE_ERR_UNSUPPORTED, echoing the HELLO's req_id, a text holding every
// needle, then the connection closed.
void ExpectRefused(const std::string &addr, uint16_t role,
                   const std::vector<std::string> &needles) {
    ote_ctl_msg_t m;
    std::vector<uint8_t> buf;
    int fd = -1;
    ASSERT_TRUE(HelloAnswer(addr, role, &m, &buf, &fd)) << "role " << role;
    EXPECT_EQ(m.opcode, OTE_CTL_ERROR);
    EXPECT_EQ(m.status, OTE_ERR_UNSUPPORTED);
    EXPECT_EQ(m.req_id, 77u);
    std::string text(m.u.error.text ? m.u.error.text : "",
                     m.opcode == OTE_CTL_ERROR ? m.u.error.text_len : 0);
    for (const auto &n : needles) EXPECT_NE(text.find(n), std::string::npos) << text;
    EXPECT_TRUE(ote_test::ClosedByPeer(fd));
    close(fd);
}

void ExpectServed(const std::string &addr, uint16_t role) {
    ote_ctl_msg_t m;
    std::vector<uint8_t> buf;
    int fd = -1;
    ASSERT_TRUE(HelloAnswer(addr, role, &m, &buf, &fd)) << "role " << role;
    EXPECT_EQ(m.opcode, OTE_CTL_HELLO_ACK) << "role " << role;
    close(fd);
}

// An shm,tcp engine: a HELLO for the RDMA control connection, or for a role that names
// nothing, gets an ERROR naming what was asked and what the engine serves, and a log
// line; the engine goes on serving TCP data connections, INFO handshakes and segments.
TEST_F(MultiTransportTest, HelloForATransportNotServedIsRefused) {
    ote_engine_t *e = ote_test::NewEngine({{"transports", "shm,tcp"}});
    ASSERT_NE(e, nullptr);
    std::string addr = ote_test::EngineAddress(e);
    ExpectRefused(addr, 2, {"rdma", "transports=shm,tcp"});
    EXPECT_TRUE(LogContains("does not serve transport rdma (transports=shm,tcp)"));
    ExpectRefused(addr, 9, {"role 9", "transports=shm,tcp"});
    ExpectRefused(addr, 0, {"role 0"});
    ExpectServed(addr, 1);
    ExpectServed(addr, OTE_CTL_ROLE_INFO);
    // A real requester still gets a segment and moves bytes.
    ote_engine_t *r = ote_test::NewEngine({{"transports", "tcp"}});
    ASSERT_NE(r, nullptr);
    std::vector<uint8_t> mem(1u << 20, 0), src(4097), dst(4097);
    ASSERT_EQ(ote_memory_register(e, mem.data(), mem.size(), OTE_PERM_READ | OTE_PERM_WRITE),
              OTE_OK);
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_segment_open(r, addr.c_str(), &seg), OTE_OK);
    EXPECT_EQ(TransportOf(seg), "tcp");
    ote_pattern_fill(src.data(), src.size(), 5, 0);
    uint64_t at = reinterpret_cast<uint64_t>(mem.data()) + 3;
    EXPECT_EQ(ote_test::RunOne(r, {OTE_WRITE, src.data(), seg, at, src.size()}, 30 * kSec), OTE_OK);
    EXPECT_EQ(ote_test::RunOne(r, {OTE_READ, dst.data(), seg, at, dst.size()}, 30 * kSec), OTE_OK);
    EXPECT_TRUE(src == dst);
    EXPECT_EQ(memcmp(mem.data() + 3, src.data(), src.size()), 0);
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(r), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(e, mem.data()), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
}

// The other way round: an rdma-only engine refuses TCP data connections and answers
// INFO (its listener transport is rdma) and RDMA control.
TEST_F(MultiTransportTest, RdmaOnlyEngineRefusesTcpData) {
    ote_engine_t *e = ote_test::NewEngine({{"transports", "rdma"}, {"verbs_provider", "sim"}});
    ASSERT_NE(e, nullptr);
    std::string addr = ote_test::EngineAddress(e);
    ExpectRefused(addr, 1, {"tcp", "transports=rdma"});
    ExpectServed(addr, 2);
    ExpectServed(addr, OTE_CTL_ROLE_INFO);
    ExpectRefused(addr, 1, {"tcp"}); // and again: nothing stuck
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
}

} // namespace

// RDMA transport control plane, against hostile or broken peers: a fake source (this
// test speaking the control protocol on a socket) and raw clients of a real RDMA engine's
// control listener. Each test is the regression test of one review finding of
// engine/rdma/rdma.c (numbers as in the review).
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/engine/ctl_peer.h"
#include "tests/engine/engine_util.h"
#include "tests/engine/target.h"
#include "tests/util/test_base.h"

extern "C" {
#include "base/time.h"
#include "engine/control/ctl.h"
#include "engine/rdma/test_hook.h"
#include "ote/ote.h"
}

namespace {

using ote_test::AcceptWithin;
using ote_test::ClosedByPeer;
using ote_test::Encode;
using ote_test::EngineAddress;
using ote_test::kMs;
using ote_test::kSec;
using ote_test::RdmaEngine;
using ote_test::ReadFrame;
using ote_test::SendAll;

// The RDMA body of an INFO / INFO_ACK (engine/rdma/proto.h): type, reserved, process,
// pd, nic, lanes.
std::vector<uint8_t> InfoBody(uint16_t type) {
    std::vector<uint8_t> b(28, 0);
    b[0] = (uint8_t)type;
    uint64_t process = 0x1234, pd = 0x5678;
    uint32_t nic = 1, lanes = 2;
    memcpy(&b[4], &process, 8);
    memcpy(&b[12], &pd, 8);
    memcpy(&b[20], &nic, 4);
    memcpy(&b[24], &lanes, 4);
    return b;
}

std::vector<uint8_t> Frame(uint16_t opcode, uint64_t req_id, ote_status_t st,
                           const std::vector<uint8_t> &rdma_body = {}, uint16_t version = 1) {
    ote_ctl_msg_t m = {};
    m.version = 1;
    m.opcode = opcode;
    m.req_id = req_id;
    m.status = st;
    if (opcode == OTE_CTL_RDMA) {
        m.u.rdma.body = rdma_body.data();
        m.u.rdma.len = (uint32_t)rdma_body.size();
    }
    std::vector<uint8_t> b = Encode(m);
    b[4] = (uint8_t)version; /* header: magic u32, version u16, ... */
    b[5] = (uint8_t)(version >> 8);
    return b;
}

std::vector<uint8_t> Hello() {
    static const char kAddr[] = "127.0.0.1:1";
    ote_ctl_msg_t m = {};
    m.version = 1;
    m.opcode = OTE_CTL_HELLO;
    m.u.hello.min_version = 1; /* this raw client speaks version 1 only */
    m.u.hello.max_version = 1;
    m.u.hello.role = 2;
    m.u.hello.addr = kAddr;
    m.u.hello.addr_len = sizeof(kAddr) - 1;
    return Encode(m);
}

// Fake source side of the handshake: accept, read HELLO and answer HELLO_ACK. The
// engine's router first asks for the source's advertisement on a connection of its own
// (HELLO role OTE_CTL_ROLE_INFO): that one is answered and closed, and the transport's
// connection that follows is returned.
int FakeHandshake(int lfd, const std::string &addr) {
    for (;;) {
        int fd = AcceptWithin(lfd, 10000);
        if (fd < 0) return -1;
        std::vector<uint8_t> buf;
        ote_ctl_msg_t m;
        if (!ote_test::ReadFrame(fd, &buf, &m) || m.opcode != OTE_CTL_HELLO ||
            !ote_test::SendHelloAck(fd, m.req_id, OTE_CTL_MAX_DATA, addr)) {
            close(fd);
            return -1;
        }
        if (m.u.hello.role != OTE_CTL_ROLE_INFO) return fd;
        close(fd);
    }
}

// The same with the source's advertisement (HELLO_ACK info) on both connections, e.g.
// "transports=rdma;rdma_release=1".
int FakeSourceHandshake(int lfd, const std::string &addr, const std::string &info) {
    for (int i = 0; i < 4; i++) {
        int c = AcceptWithin(lfd, 10000);
        if (c < 0) return -1;
        std::vector<uint8_t> buf;
        ote_ctl_msg_t m;
        if (!ReadFrame(c, &buf, &m) || m.opcode != OTE_CTL_HELLO) {
            close(c);
            return -1;
        }
        ote_ctl_msg_t a{};
        a.version = 1;
        a.opcode = OTE_CTL_HELLO_ACK;
        a.req_id = m.req_id;
        a.u.hello_ack.version = 1;
        a.u.hello_ack.max_data = OTE_CTL_MAX_DATA;
        a.u.hello_ack.addr = addr.c_str();
        a.u.hello_ack.addr_len = (uint32_t)addr.size();
        a.u.hello_ack.info = info.c_str();
        a.u.hello_ack.info_len = (uint16_t)info.size();
        if (!SendAll(c, Encode(a))) {
            close(c);
            return -1;
        }
        if (m.u.hello.role != OTE_CTL_ROLE_INFO) return c;
        close(c);
    }
    return -1;
}

class RdmaControlTest : public ote_test::OteTest {};

// Joins a thread on every way out of its scope, ASSERTs included: a failed assertion then
// fails the test instead of destroying a joinable std::thread (std::terminate). Each
// thread it guards runs one engine call, which is bounded by the engine's own deadlines.
struct JoinOnExit {
    std::thread &t;
    ~JoinOnExit() {
        if (t.joinable()) t.join();
    }
};

// Finding 2: a NOTIFY_ACK naming the id of a pending INFO call (on the requester's
// stack) used to free that stack address. Now it is a protocol error for that peer.
TEST_F(RdmaControlTest, NotifyAckNamingACallIsAProtocolErrorNotAFree) {
    std::string addr;
    int lfd = ote_test::ListenLoopback(16, &addr);
    ASSERT_GE(lfd, 0);
    ote_engine_t *e = RdmaEngine();
    ASSERT_NE(e, nullptr);
    std::atomic<ote_status_t> open_st{OTE_OK};
    ote_segment_t *seg = nullptr;
    std::thread opener([&] { open_st = ote_segment_open(e, addr.c_str(), &seg); });
    JoinOnExit join_opener{opener};
    int fd = FakeHandshake(lfd, addr);
    ASSERT_GE(fd, 0);
    std::vector<uint8_t> buf;
    ote_ctl_msg_t m;
    ASSERT_TRUE(ReadFrame(fd, &buf, &m));
    ASSERT_EQ(m.opcode, OTE_CTL_RDMA); /* INFO */
    ASSERT_TRUE(SendAll(fd, Frame(OTE_CTL_NOTIFY_ACK, m.req_id, OTE_OK)));
    EXPECT_TRUE(ClosedByPeer(fd))
        << "the requester kept a peer that answered a call with NOTIFY_ACK";
    opener.join();
    EXPECT_NE(open_st.load(), OTE_OK);
    EXPECT_EQ(seg, nullptr);
    // A reply of the wrong RDMA kind (CONNECT_ACK to INFO) is refused the same way.
    std::thread opener2([&] { open_st = ote_segment_open(e, addr.c_str(), &seg); });
    JoinOnExit join_opener2{opener2};
    int fd2 = FakeHandshake(lfd, addr);
    ASSERT_GE(fd2, 0);
    ASSERT_TRUE(ReadFrame(fd2, &buf, &m));
    std::vector<uint8_t> cack(4 + 32, 0);
    cack[0] = 4; /* CONNECT_ACK with a zero path */
    ASSERT_TRUE(SendAll(fd2, Frame(OTE_CTL_RDMA, m.req_id, OTE_OK, cack)));
    EXPECT_TRUE(ClosedByPeer(fd2));
    opener2.join();
    EXPECT_NE(open_st.load(), OTE_OK);
    close(fd);
    close(fd2);
    close(lfd);
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
}

// Finding 15: statuses chosen by the peer are sanitized before they are returned.
TEST_F(RdmaControlTest, PeerChosenStatusesAreSanitized) {
    std::string addr;
    int lfd = ote_test::ListenLoopback(16, &addr);
    ASSERT_GE(lfd, 0);
    ote_engine_t *e = RdmaEngine();
    ASSERT_NE(e, nullptr);
    const ote_status_t kLies[] = {OTE_ERR_RETAINED, OTE_ERR_BUSY,
                                  ote_status_make(OTE_ERR_NATIVE, 12), (ote_status_t)0x7fff0007};
    for (ote_status_t lie : kLies) {
        std::atomic<ote_status_t> open_st{OTE_OK};
        ote_segment_t *seg = nullptr;
        std::thread opener([&] { open_st = ote_segment_open(e, addr.c_str(), &seg); });
        JoinOnExit join_opener{opener};
        int fd = FakeHandshake(lfd, addr);
        ASSERT_GE(fd, 0);
        std::vector<uint8_t> buf;
        ote_ctl_msg_t m;
        ASSERT_TRUE(ReadFrame(fd, &buf, &m));
        ASSERT_TRUE(SendAll(fd, Frame(OTE_CTL_RDMA, m.req_id, lie, InfoBody(2))));
        opener.join();
        EXPECT_EQ(ote_status_code(open_st.load()), OTE_ERR_REMOTE)
            << ote_status_str(open_st.load());
        EXPECT_EQ(ote_status_errno(open_st.load()), 0);
        close(fd);
    }
    // NOTIFY_ACK: AGAIN (the receiver's queue is full) passes, a local-state code does not.
    ote_segment_t *seg = nullptr;
    std::atomic<ote_status_t> open_st{OTE_ERR_STATE};
    std::thread opener([&] { open_st = ote_segment_open(e, addr.c_str(), &seg); });
    JoinOnExit join_opener{opener};
    int fd = FakeHandshake(lfd, addr);
    ASSERT_GE(fd, 0);
    std::vector<uint8_t> buf;
    ote_ctl_msg_t m;
    ASSERT_TRUE(ReadFrame(fd, &buf, &m));
    ASSERT_TRUE(SendAll(fd, Frame(OTE_CTL_RDMA, m.req_id, OTE_OK, InfoBody(2))));
    opener.join();
    ASSERT_EQ(open_st.load(), OTE_OK);
    const std::pair<ote_status_t, int> kNotes[] = {{OTE_ERR_AGAIN, OTE_ERR_AGAIN},
                                                   {OTE_ERR_NOMEM, OTE_ERR_REMOTE},
                                                   {OTE_ERR_TIMEOUT, OTE_ERR_REMOTE},
                                                   {OTE_OK, OTE_OK}};
    for (auto [sent, want] : kNotes) {
        std::atomic<ote_status_t> nst{OTE_ERR_STATE};
        std::thread sender([&] { nst = ote_notify_send(e, seg, "hi", 2); });
        JoinOnExit join_sender{sender};
        ASSERT_TRUE(ReadFrame(fd, &buf, &m));
        ASSERT_EQ(m.opcode, OTE_CTL_NOTIFY);
        ASSERT_TRUE(SendAll(fd, Frame(OTE_CTL_NOTIFY_ACK, m.req_id, sent)));
        sender.join();
        EXPECT_EQ(ote_status_code(nst.load()), want) << ote_status_str(sent);
    }
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    close(fd);
    close(lfd);
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
}

// Finding 16: the control server refuses frames before HELLO and frames of a version
// other than the negotiated one (and closes the connection).
TEST_F(RdmaControlTest, ServerRefusesFramesBeforeHelloAndOfAnotherVersion) {
    ote_engine_t *e = RdmaEngine();
    ASSERT_NE(e, nullptr);
    std::string addr = EngineAddress(e);
    std::vector<uint8_t> buf;
    ote_ctl_msg_t m;
    // INFO before HELLO: no INFO_ACK, closed.
    int a = ote_test::ConnectTo(addr);
    ASSERT_GE(a, 0);
    ASSERT_TRUE(SendAll(a, Frame(OTE_CTL_RDMA, 1, OTE_OK, InfoBody(1))));
    EXPECT_FALSE(ReadFrame(a, &buf, &m, 3000)) << "answered a frame sent before HELLO";
    EXPECT_TRUE(ClosedByPeer(a));
    close(a);
    // NOTIFY before HELLO: not delivered, closed.
    int b = ote_test::ConnectTo(addr);
    ASSERT_GE(b, 0);
    ote_ctl_msg_t n = {};
    n.version = 1;
    n.opcode = OTE_CTL_NOTIFY;
    n.req_id = 5;
    n.u.notify.msg = (const uint8_t *)"x";
    n.u.notify.len = 1;
    ASSERT_TRUE(SendAll(b, Encode(n)));
    EXPECT_TRUE(ClosedByPeer(b));
    close(b);
    char note[16];
    size_t nlen = 0;
    EXPECT_EQ(ote_notify_recv(e, note, sizeof(note), &nlen, nullptr, 0, 100 * kMs),
              OTE_ERR_TIMEOUT);
    // After HELLO (version 1), an INFO claiming version 2: closed without an answer.
    int c = ote_test::ConnectTo(addr);
    ASSERT_GE(c, 0);
    ASSERT_TRUE(SendAll(c, Hello()));
    ASSERT_TRUE(ReadFrame(c, &buf, &m));
    ASSERT_EQ(m.opcode, OTE_CTL_HELLO_ACK);
    ASSERT_TRUE(SendAll(c, Frame(OTE_CTL_RDMA, 1, OTE_OK, InfoBody(1), /*version=*/2)));
    EXPECT_FALSE(ReadFrame(c, &buf, &m, 3000)) << "answered a frame of another version";
    EXPECT_TRUE(ClosedByPeer(c));
    close(c);
    // The well-behaved sequence is answered.
    int d = ote_test::ConnectTo(addr);
    ASSERT_GE(d, 0);
    ASSERT_TRUE(SendAll(d, Hello()));
    ASSERT_TRUE(ReadFrame(d, &buf, &m));
    ASSERT_TRUE(SendAll(d, Frame(OTE_CTL_RDMA, 1, OTE_OK, InfoBody(1))));
    ASSERT_TRUE(ReadFrame(d, &buf, &m));
    EXPECT_EQ(m.opcode, OTE_CTL_RDMA);
    EXPECT_EQ(m.status, OTE_OK);
    close(d);
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
}

// The several-device forms (the sim's two devices): a long INFO naming its devices is
// answered by a long INFO_ACK naming the engine's two; a device count of 0 or past 8,
// and an EP_RESET naming a device index past 7, close the connection; a CONNECT naming a
// source device the engine does not have is refused (PROTOCOL) without closing; an
// EP_RESET of a pair with no grants is taken quietly.
std::vector<uint8_t> LongInfo(uint32_t ndev) {
    std::vector<uint8_t> b = InfoBody(1);
    b.resize(64, 0);
    memcpy(&b[28], &ndev, 4);
    uint32_t nic = 1; // nics[0] must equal the short form's nic
    memcpy(&b[32], &nic, 4);
    uint32_t nic2 = 2;
    memcpy(&b[36], &nic2, 4);
    return b;
}

TEST_F(RdmaControlTest, SeveralDeviceFormsAreCheckedAndAnswered) {
    ote_engine_t *e = RdmaEngine();
    ASSERT_NE(e, nullptr);
    std::string addr = EngineAddress(e);
    std::vector<uint8_t> buf;
    ote_ctl_msg_t m;
    auto session = [&](const std::vector<uint8_t> &info) {
        int fd = ote_test::ConnectTo(addr);
        EXPECT_GE(fd, 0);
        EXPECT_TRUE(SendAll(fd, Hello()));
        EXPECT_TRUE(ReadFrame(fd, &buf, &m));
        EXPECT_TRUE(SendAll(fd, Frame(OTE_CTL_RDMA, 1, OTE_OK, info)));
        return fd;
    };
    for (uint32_t bad : {0u, 9u}) {
        int fd = session(LongInfo(bad));
        EXPECT_FALSE(ReadFrame(fd, &buf, &m, 3000)) << "answered an INFO of " << bad << " devices";
        EXPECT_TRUE(ClosedByPeer(fd));
        close(fd);
    }
    int fd = session(LongInfo(2));
    ASSERT_TRUE(ReadFrame(fd, &buf, &m));
    ASSERT_EQ(m.opcode, OTE_CTL_RDMA);
    // The long form, followed by the engine's epoch (engine/rdma/proto.h).
    ASSERT_EQ(m.u.rdma.len, 72u) << "a two-device engine answers the long form";
    uint32_t ndev = 0;
    memcpy(&ndev, m.u.rdma.body + 28, 4);
    EXPECT_EQ(ndev, 2u);
    uint64_t epoch = 0;
    memcpy(&epoch, m.u.rdma.body + 64, 8);
    EXPECT_NE(epoch, 0u);
    // CONNECT (long form) naming source device 5: refused, connection kept.
    std::vector<uint8_t> conn(48, 0);
    conn[0] = 3; // OTE_RP_CONNECT
    uint32_t qpn = 77, mtu = 3, pair = (5u << 8) | 1u;
    memcpy(&conn[4 + 8 + 20], &qpn, 4);
    memcpy(&conn[4 + 8 + 28], &mtu, 4);
    memcpy(&conn[44], &pair, 4);
    ASSERT_TRUE(SendAll(fd, Frame(OTE_CTL_RDMA, 2, OTE_OK, conn)));
    ASSERT_TRUE(ReadFrame(fd, &buf, &m));
    EXPECT_EQ(m.opcode, OTE_CTL_RDMA);
    EXPECT_EQ(ote_status_code(m.status), OTE_ERR_PROTOCOL);
    // EP_RESET of a pair with nothing on it: no answer, the connection stays.
    std::vector<uint8_t> reset(8, 0);
    reset[0] = 8; // OTE_RP_EP_RESET
    pair = (1u << 8) | 1u;
    memcpy(&reset[4], &pair, 4);
    ASSERT_TRUE(SendAll(fd, Frame(OTE_CTL_RDMA, 0, OTE_OK, reset)));
    ASSERT_TRUE(SendAll(fd, Frame(OTE_CTL_RDMA, 3, OTE_OK, LongInfo(2))));
    ASSERT_TRUE(ReadFrame(fd, &buf, &m));
    EXPECT_EQ(m.req_id, 3u) << "the EP_RESET was answered or closed the connection";
    // EP_RESET naming device 9: malformed, closed.
    pair = (9u << 8) | 0u;
    memcpy(&reset[4], &pair, 4);
    ASSERT_TRUE(SendAll(fd, Frame(OTE_CTL_RDMA, 0, OTE_OK, reset)));
    EXPECT_TRUE(ClosedByPeer(fd));
    close(fd);
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
}

// RELEASE (engine/rdma/proto.h): the engine advertises it (rdma_release=1 in its
// HELLO_ACK info, so that only sources that take it are sent one); a RELEASE naming no
// bound grant of the sender (an unknown window, a slot past the endpoint's width, a
// device the engine does not have) is ignored: no answer, the connection stays and the
// engine serves on. A malformed one (wrong size, capability past the direct WRITE, QP number 0 or
// past 24 bits, device index past 7) closes the connection like any malformed message.
std::vector<uint8_t> ReleaseBody(uint32_t pair, uint32_t cap, uint32_t slot, uint32_t qpn,
                                 uint32_t rkey) {
    std::vector<uint8_t> b(24, 0);
    b[0] = 9; // OTE_RP_RELEASE
    memcpy(&b[4], &pair, 4);
    memcpy(&b[8], &cap, 4);
    memcpy(&b[12], &slot, 4);
    memcpy(&b[16], &qpn, 4);
    memcpy(&b[20], &rkey, 4);
    return b;
}

TEST_F(RdmaControlTest, ReleaseOfNoGrantIsIgnoredMalformedReleaseCloses) {
    ote_engine_t *e = RdmaEngine();
    ASSERT_NE(e, nullptr);
    std::string addr = EngineAddress(e);
    std::vector<uint8_t> buf;
    ote_ctl_msg_t m;
    bool advertised = false;
    auto session = [&]() {
        int fd = ote_test::ConnectTo(addr);
        EXPECT_GE(fd, 0);
        EXPECT_TRUE(SendAll(fd, Hello()));
        EXPECT_TRUE(ReadFrame(fd, &buf, &m));
        EXPECT_EQ(m.opcode, OTE_CTL_HELLO_ACK);
        std::string info(m.u.hello_ack.info != nullptr ? m.u.hello_ack.info : "",
                         m.u.hello_ack.info_len);
        advertised = info.find("rdma_release=1") != std::string::npos;
        EXPECT_TRUE(SendAll(fd, Frame(OTE_CTL_RDMA, 1, OTE_OK, InfoBody(1))));
        EXPECT_TRUE(ReadFrame(fd, &buf, &m));
        EXPECT_EQ(m.opcode, OTE_CTL_RDMA);
        return fd;
    };
    ote__rdma_test_grants_t g0{}, g1{};
    ASSERT_EQ(ote__rdma_test_grants(addr.c_str(), &g0), OTE_OK);
    int fd = session();
    EXPECT_TRUE(advertised) << "the HELLO_ACK does not advertise RELEASE";
    // Naming nothing: an unknown window, a slot past the width, a device the engine lacks.
    const std::vector<uint8_t> ignored[] = {
        ReleaseBody(0, 1, 0, 77, 0x1234), ReleaseBody(0, 0, 1000, 77, 0x1234),
        ReleaseBody(7u << 8, 1, 0, 77, 0x1234), ReleaseBody(0, 1, 0, 0xffffff, 0),
        ReleaseBody(0, 2, 0, 77, 0x1234) /* a direct endpoint's (rdma_direct.c) */};
    uint64_t id = 2;
    for (const auto &rel : ignored) {
        ASSERT_TRUE(SendAll(fd, Frame(OTE_CTL_RDMA, 0, OTE_OK, rel)));
        ASSERT_TRUE(SendAll(fd, Frame(OTE_CTL_RDMA, id, OTE_OK, InfoBody(1))));
        ASSERT_TRUE(ReadFrame(fd, &buf, &m)) << "the RELEASE closed the connection";
        EXPECT_EQ(m.req_id, id) << "the RELEASE was answered";
        id++;
    }
    ASSERT_EQ(ote__rdma_test_grants(addr.c_str(), &g1), OTE_OK);
    EXPECT_EQ(g1.rel_ignored - g0.rel_ignored, 5u);
    EXPECT_EQ(g1.rel_applied, g0.rel_applied);
    close(fd);
    // Malformed: each closes its connection, unanswered.
    std::vector<uint8_t> short_body = ReleaseBody(0, 1, 0, 77, 1);
    short_body.resize(20);
    std::vector<uint8_t> long_body = ReleaseBody(0, 1, 0, 77, 1);
    long_body.resize(28, 0);
    const std::vector<uint8_t> malformed[] = {short_body,
                                              long_body,
                                              ReleaseBody(0, 4, 0, 77, 1),
                                              ReleaseBody(0, 1, 0, 0, 1),
                                              ReleaseBody(0, 1, 0, 1u << 24, 1),
                                              ReleaseBody(9u << 8, 1, 0, 77, 1),
                                              ReleaseBody(1u << 16, 1, 0, 77, 1)};
    for (const auto &rel : malformed) {
        int bad = session();
        ASSERT_TRUE(SendAll(bad, Frame(OTE_CTL_RDMA, 0, OTE_OK, rel)));
        EXPECT_FALSE(ReadFrame(bad, &buf, &m, 3000)) << "a malformed RELEASE was answered";
        EXPECT_TRUE(ClosedByPeer(bad));
        close(bad);
    }
    // The engine serves on.
    int ok = session();
    close(ok);
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
}

// The requester side of RELEASE, against a fake source: a grant whose answer comes after
// its request passed its deadline (1.5 s) posted nothing, so the requester releases the
// window that late OK answer names (RELEASE: pair, capability, slot, the source's QP,
// rkey), but only to a source that advertised rdma_release=1 in its HELLO_ACK; an older
// source (no such key) is sent nothing (it would close the connection on the unknown
// message; its window ends at its own deadline).
void LateAnswerToFakeSource(bool advertise) {
    std::string addr;
    int lfd = ote_test::ListenLoopback(16, &addr);
    ASSERT_GE(lfd, 0);
    ote_config_t *cfg = ote_test::RdmaConfig("1500");
    ASSERT_EQ(ote_config_set(cfg, "rdma_devices", "sim0"), OTE_OK);
    ote_engine_t *e = nullptr;
    ASSERT_EQ(ote_engine_create(cfg, &e), OTE_OK);
    ote_config_destroy(cfg);
    std::atomic<ote_status_t> open_st{OTE_ERR_STATE};
    ote_segment_t *seg = nullptr;
    std::thread opener([&] { open_st = ote_segment_open(e, addr.c_str(), &seg); });
    JoinOnExit join_opener{opener};
    // The handshakes: the router's (answered with the advertisement, closed), then the
    // transport's control connection.
    std::vector<uint8_t> buf;
    ote_ctl_msg_t m;
    const std::string info = advertise ? "transports=rdma;rdma_release=1" : "transports=rdma";
    int fd = FakeSourceHandshake(lfd, addr, info);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(ReadFrame(fd, &buf, &m)); // INFO
    ASSERT_TRUE(SendAll(fd, Frame(OTE_CTL_RDMA, m.req_id, OTE_OK, InfoBody(2))));
    opener.join();
    ASSERT_EQ(open_st.load(), OTE_OK);
    // A 64 KiB WRITE: CONNECT (answered with a path of ours), then GRANT_REQ (left
    // unanswered until the request has ended).
    std::vector<uint8_t> data(64u << 10, 7);
    ote_batch_t *b = nullptr;
    ASSERT_EQ(ote_batch_create(e, 1, &b), OTE_OK);
    ote_request_t r = {OTE_WRITE, data.data(), seg, 0x100000, data.size()};
    // Submit may build the QP (a CONNECT round trip) on its own thread: answered below.
    std::atomic<ote_status_t> sub_st{OTE_ERR_STATE};
    std::thread submitter([&] { sub_st = ote_batch_submit(b, &r, 1); });
    JoinOnExit join_submitter{submitter};
    constexpr uint32_t kQpn = 0x4321, kRkey = 0xabcd01;
    uint64_t grant_id = 0;
    uint32_t slot = 0;
    while (grant_id == 0) {
        ASSERT_TRUE(ReadFrame(fd, &buf, &m)) << "no GRANT_REQ came";
        ASSERT_EQ(m.opcode, OTE_CTL_RDMA);
        ASSERT_GE(m.u.rdma.len, 4u);
        uint16_t type = (uint16_t)(m.u.rdma.body[0] | (m.u.rdma.body[1] << 8));
        if (type == 3) { // CONNECT: answer our path (gid, lid, qpn, psn, mtu 1024)
            std::vector<uint8_t> ack(36, 0);
            ack[0] = 4; // CONNECT_ACK
            ack[4 + 15] = 1;
            uint32_t qpn = kQpn, psn = 1, mtu = 3;
            memcpy(&ack[4 + 20], &qpn, 4);
            memcpy(&ack[4 + 24], &psn, 4);
            memcpy(&ack[4 + 28], &mtu, 4);
            ASSERT_TRUE(SendAll(fd, Frame(OTE_CTL_RDMA, m.req_id, OTE_OK, ack)));
        } else {
            ASSERT_EQ(type, 5) << "neither CONNECT nor GRANT_REQ";
            grant_id = m.req_id;
            memcpy(&slot, m.u.rdma.body + 4, 4);
        }
    }
    submitter.join();
    ASSERT_EQ(sub_st.load(), OTE_OK);
    (void)ote_batch_wait(b, 30 * kSec);
    ote_transfer_status_t ts{};
    ASSERT_EQ(ote_batch_status(b, 0, &ts), OTE_OK);
    EXPECT_EQ(ts.state, OTE_TRANSFER_TIMEOUT) << ote_status_str(ts.error);
    // The late answer: OK, window kRkey.
    std::vector<uint8_t> resp(8, 0);
    resp[0] = 6; // GRANT_RESP
    uint32_t rkey = kRkey;
    memcpy(&resp[4], &rkey, 4);
    ASSERT_TRUE(SendAll(fd, Frame(OTE_CTL_RDMA, grant_id, OTE_OK, resp)));
    if (advertise) {
        ASSERT_TRUE(ReadFrame(fd, &buf, &m, 10000)) << "no RELEASE of the late window";
        ASSERT_EQ(m.opcode, OTE_CTL_RDMA);
        ASSERT_EQ(m.u.rdma.len, 24u);
        uint32_t f[6];
        memcpy(f, m.u.rdma.body, 24);
        EXPECT_EQ(f[0] & 0xffff, 9u) << "not a RELEASE";
        EXPECT_EQ(f[1], 0u) << "pair";
        EXPECT_EQ(f[2], 1u) << "capability (WRITE)";
        EXPECT_EQ(f[3], slot);
        EXPECT_EQ(f[4], kQpn);
        EXPECT_EQ(f[5], kRkey);
    } else {
        // Nothing comes (a late frame could only go unseen here, never fail the test).
        EXPECT_FALSE(ReadFrame(fd, &buf, &m, 1500)) << "a frame was sent to an older source";
    }
    if (ts.state != OTE_TRANSFER_PENDING) {
        EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    }
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    close(fd);
    close(lfd);
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
}

// GPUDirect source grants (engine/rdma/rdma_direct.c, proto.h): the engine advertises
// rdma_direct=1; a GRANT_REQ asked on a direct slot for memory that is not device memory
// with a dma-buf (here: nothing registered) is refused and the connection stays; an op
// word with a bit the codec does not know, or a CONNECT with a capability past the direct
// WRITE (3), is malformed and closes the connection.
TEST_F(RdmaControlTest, DirectFlagsAreCheckedAndAdvertised) {
    ote_engine_t *e = RdmaEngine();
    ASSERT_NE(e, nullptr);
    std::string addr = EngineAddress(e);
    std::vector<uint8_t> buf;
    ote_ctl_msg_t m;
    bool advertised = false;
    auto session = [&]() {
        int fd = ote_test::ConnectTo(addr);
        EXPECT_GE(fd, 0);
        EXPECT_TRUE(SendAll(fd, Hello()));
        EXPECT_TRUE(ReadFrame(fd, &buf, &m));
        std::string info(m.u.hello_ack.info != nullptr ? m.u.hello_ack.info : "",
                         m.u.hello_ack.info_len);
        advertised = info.find("rdma_direct=1") != std::string::npos;
        EXPECT_TRUE(SendAll(fd, Frame(OTE_CTL_RDMA, 1, OTE_OK, InfoBody(1))));
        EXPECT_TRUE(ReadFrame(fd, &buf, &m));
        return fd;
    };
    auto grant = [](uint32_t op_word) {
        std::vector<uint8_t> g(60, 0);
        g[0] = 5; // OTE_RP_GRANT_REQ, short form
        uint32_t qpn = 77;
        uint64_t at = 0x100000, len = 4096, uid = 9;
        memcpy(&g[8], &op_word, 4);
        memcpy(&g[12], &qpn, 4);
        memcpy(&g[16], &qpn, 4);
        memcpy(&g[20], &at, 8);
        memcpy(&g[28], &len, 8);
        memcpy(&g[36], &at, 8);
        memcpy(&g[44], &len, 8);
        memcpy(&g[52], &uid, 8);
        return g;
    };
    int fd = session();
    EXPECT_TRUE(advertised) << "the HELLO_ACK does not advertise rdma_direct";
    ASSERT_TRUE(SendAll(fd, Frame(OTE_CTL_RDMA, 2, OTE_OK, grant(0x301))));
    ASSERT_TRUE(ReadFrame(fd, &buf, &m)) << "a direct GRANT_REQ closed the connection";
    EXPECT_EQ(m.req_id, 2u);
    EXPECT_NE(m.status, OTE_OK) << "nothing registered: refused";
    close(fd);
    std::vector<uint8_t> conn(44, 0);
    conn[0] = 3; // OTE_RP_CONNECT, short form, cap 4
    uint32_t cap = 4, qpn = 77, mtu = 3;
    memcpy(&conn[8], &cap, 4);
    memcpy(&conn[4 + 8 + 20], &qpn, 4);
    memcpy(&conn[4 + 8 + 28], &mtu, 4);
    for (const auto &body : {grant(0x401), grant(0x303), conn}) {
        int bad = session();
        ASSERT_TRUE(SendAll(bad, Frame(OTE_CTL_RDMA, 3, OTE_OK, body)));
        EXPECT_FALSE(ReadFrame(bad, &buf, &m, 3000)) << "a malformed direct form was answered";
        EXPECT_TRUE(ClosedByPeer(bad));
        close(bad);
    }
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
}

// The parent trailer of GRANT_REQ (proto.h: 88 bytes, after the epoch and flags): a
// source advertises rdma_parent=1 and decodes it (a well-formed one for another epoch is
// answered: a cache miss); a parent of 0, a budget of 0 or past OTE_RP_MAX_BUDGET,
// unknown flags or a truncated trailer is a protocol error: the connection is closed, no
// answer and no crash.
TEST_F(RdmaControlTest, ParentTrailerIsCheckedAndAdvertised) {
    ote_engine_t *e = RdmaEngine();
    ASSERT_NE(e, nullptr);
    std::string addr = EngineAddress(e);
    std::vector<uint8_t> buf;
    ote_ctl_msg_t m;
    bool advertised = false;
    auto session = [&]() {
        int fd = ote_test::ConnectTo(addr);
        EXPECT_GE(fd, 0);
        EXPECT_TRUE(SendAll(fd, Hello()));
        EXPECT_TRUE(ReadFrame(fd, &buf, &m));
        std::string info(m.u.hello_ack.info != nullptr ? m.u.hello_ack.info : "",
                         m.u.hello_ack.info_len);
        advertised = info.find("rdma_parent=1") != std::string::npos;
        EXPECT_TRUE(SendAll(fd, Frame(OTE_CTL_RDMA, 1, OTE_OK, InfoBody(1))));
        EXPECT_TRUE(ReadFrame(fd, &buf, &m));
        return fd;
    };
    auto grant = [](uint64_t parent, uint32_t budget, uint32_t flags, size_t size) {
        std::vector<uint8_t> g(88, 0);
        g[0] = 5; // OTE_RP_GRANT_REQ with epoch, flags and the parent trailer
        uint32_t qpn = 77, op = 1;
        uint64_t at = 0x100000, len = 4096, uid = 9, epoch = 1;
        memcpy(&g[8], &op, 4);
        memcpy(&g[12], &qpn, 4);
        memcpy(&g[16], &qpn, 4);
        memcpy(&g[20], &at, 8);
        memcpy(&g[28], &len, 8);
        memcpy(&g[36], &at, 8);
        memcpy(&g[44], &len, 8);
        memcpy(&g[52], &uid, 8);
        memcpy(&g[64], &epoch, 8);
        memcpy(&g[72], &flags, 4);
        memcpy(&g[76], &parent, 8);
        memcpy(&g[84], &budget, 4);
        g.resize(size);
        return g;
    };
    int fd = session();
    EXPECT_TRUE(advertised) << "the HELLO_ACK does not advertise rdma_parent";
    ASSERT_TRUE(SendAll(fd, Frame(OTE_CTL_RDMA, 2, OTE_OK, grant(7, 4, 0, 88))));
    ASSERT_TRUE(ReadFrame(fd, &buf, &m)) << "a well-formed parent trailer closed the connection";
    EXPECT_EQ(m.req_id, 2u);
    EXPECT_NE(m.status, OTE_OK) << "another epoch, nothing registered: refused";
    close(fd);
    for (const auto &body : {grant(0, 4, 0, 88), grant(7, 0, 0, 88), grant(7, 65537, 0, 88),
                             grant(7, 4, 4, 88), grant(7, 4, 0, 84)}) {
        int bad = session();
        ASSERT_TRUE(SendAll(bad, Frame(OTE_CTL_RDMA, 3, OTE_OK, body)));
        EXPECT_FALSE(ReadFrame(bad, &buf, &m, 3000)) << "a malformed parent trailer was answered";
        EXPECT_TRUE(ClosedByPeer(bad));
        close(bad);
    }
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
}

TEST_F(RdmaControlTest, LateAnswerReleasedToASourceThatAdvertisesRelease) {
    LateAnswerToFakeSource(true);
}

TEST_F(RdmaControlTest, NoReleaseToASourceWithoutTheAdvertisement) {
    LateAnswerToFakeSource(false);
}

// Finding 4: a peer that never reads its answers cannot block the engine's threads: its
// answers queue (bounded) and it is dropped; the source then still serves a healthy
// requester (its threads were not left blocked on the dropped peer).
TEST_F(RdmaControlTest, PeerThatNeverReadsIsDroppedNotWaitedOn) {
    ote_engine_t *src = RdmaEngine("20000", "1000");
    ASSERT_NE(src, nullptr);
    std::string addr = EngineAddress(src);
    int fd = ote_test::ConnectTo(addr, 4096);
    ASSERT_GE(fd, 0);
    std::vector<uint8_t> buf;
    ote_ctl_msg_t m;
    ASSERT_TRUE(SendAll(fd, Hello()));
    ASSERT_TRUE(ReadFrame(fd, &buf, &m));
    // Flood INFO requests (each answered) and never read again.
    std::vector<uint8_t> one = Frame(OTE_CTL_RDMA, 1, OTE_OK, InfoBody(1)), many;
    for (int i = 0; i < 1024; i++) many.insert(many.end(), one.begin(), one.end());
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    ote_deadline_t dl = ote_deadline_after(30 * kSec);
    bool dropped = false;
    size_t off = 0;
    uint64_t sent = 0;
    while (!dropped && !ote_deadline_expired(dl)) {
        pollfd pf = {fd, POLLOUT, 0};
        poll(&pf, 1, 100);
        ssize_t r = send(fd, many.data() + off, many.size() - off, MSG_NOSIGNAL);
        if (r > 0) {
            sent += (uint64_t)r;
            off = (off + (size_t)r) % many.size();
        } else if (r < 0 && errno != EAGAIN && errno != EINTR) {
            dropped = true; /* EPIPE / ECONNRESET: the source closed it */
        }
        if (!dropped && (pf.revents & (POLLHUP | POLLERR))) dropped = true;
    }
    EXPECT_TRUE(dropped) << "a peer that never reads was not dropped (" << sent << " bytes sent)";
    // Healthy peers are unaffected: a real requester transfers through the same source.
    ote_engine_t *req = RdmaEngine();
    ASSERT_NE(req, nullptr);
    std::vector<uint8_t> target(1 << 20, 0), data(1 << 20);
    for (size_t i = 0; i < data.size(); i++) data[i] = (uint8_t)(i * 7 + 1);
    ASSERT_EQ(
        ote_memory_register(src, target.data(), target.size(), OTE_PERM_READ | OTE_PERM_WRITE),
        OTE_OK);
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_segment_open(req, addr.c_str(), &seg), OTE_OK);
    ote_batch_t *bt = nullptr;
    ASSERT_EQ(ote_batch_create(req, 1, &bt), OTE_OK);
    ote_request_t r = {OTE_WRITE, data.data(), seg, (uint64_t)(uintptr_t)target.data(),
                       data.size()};
    ASSERT_EQ(ote_batch_submit(bt, &r, 1), OTE_OK);
    EXPECT_EQ(ote_batch_wait(bt, 20 * kSec), OTE_OK);
    EXPECT_EQ(ote_batch_destroy(bt), OTE_OK);
    EXPECT_EQ(memcmp(target.data(), data.data(), data.size()), 0);
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    close(fd);
    EXPECT_EQ(ote_memory_unregister(src, target.data()), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
}

// Finding 5: the control connect is bounded by connect_timeout_ms (a listener whose
// accept queue is full drops SYNs, so a blocking connect would wait for minutes).
TEST_F(RdmaControlTest, ConnectIsBoundedByConnectTimeout) {
    std::string addr;
    int lfd = ote_test::ListenLoopback(0, &addr);
    ASSERT_GE(lfd, 0);
    std::vector<int> fill;
    for (int i = 0; i < 4; i++) {
        int f = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        sockaddr_in sa = {};
        sa.sin_family = AF_INET;
        sa.sin_port = htons((uint16_t)std::stoi(addr.substr(addr.rfind(':') + 1)));
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        connect(f, (sockaddr *)&sa, sizeof(sa));
        fill.push_back(f);
    }
    ote_engine_t *e = RdmaEngine("60000", "500");
    ASSERT_NE(e, nullptr);
    uint64_t t0 = ote_now_ns();
    ote_segment_t *seg = nullptr;
    ote_status_t st = ote_segment_open(e, addr.c_str(), &seg);
    uint64_t took = ote_now_ns() - t0;
    // Nobody accepts or answers: the open ends with CONNECT (ETIMEDOUT) at
    // connect_timeout_ms (500 ms), not before it and not at transfer_timeout_ms (60 s: far
    // from the 30 s bound below, which a loaded machine cannot reach by slowness alone);
    // no segment is handed out.
    EXPECT_EQ(ote_status_code(st), OTE_ERR_CONNECT) << ote_status_str(st);
    EXPECT_EQ(ote_status_errno(st), ETIMEDOUT);
    EXPECT_EQ(seg, nullptr);
    EXPECT_GE(took, 500 * kMs) << "connect gave up after " << took / kMs << " ms";
    EXPECT_LT(took, 30 * kSec) << "connect waited " << took / kMs << " ms";
    for (int f : fill) close(f);
    close(lfd);
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
}

// Finding 8: a notification the peer never acknowledges fails at its deadline, and the
// segment can be closed afterwards (it was BUSY forever).
TEST_F(RdmaControlTest, UnacknowledgedNotificationFailsAtItsDeadline) {
    ote_test::Target target;
    ASSERT_TRUE(target.Start(16ull << 20, "127.0.0.1:0", ote_test::kRdmaTargetEnv));
    ote_engine_t *e = RdmaEngine("1500");
    ASSERT_NE(e, nullptr);
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_segment_open(e, target.address.c_str(), &seg), OTE_OK);
    ASSERT_TRUE(target.Stop()); /* certainly does not answer now */
    uint64_t t0 = ote_now_ns();
    ote_status_t st = ote_notify_send(e, seg, "ping", 4);
    uint64_t took = ote_now_ns() - t0;
    EXPECT_EQ(ote_status_code(st), OTE_ERR_TIMEOUT) << ote_status_str(st);
    // The notification's deadline starts inside ote_notify_send, after t0: not before it;
    // and it did end (at its deadline, seen late at worst on a loaded machine).
    EXPECT_GE(took, 1500 * kMs) << took / kMs << " ms";
    EXPECT_LT(took, 30 * kSec) << took / kMs << " ms";
    EXPECT_EQ(ote_segment_close(seg), OTE_OK) << "the expired notification still holds the segment";
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
    ASSERT_TRUE(target.Cont());
    EXPECT_EQ(target.Quit(), 0);
}

// host_deliver's status reaches the sender: AGAIN once the receiver's queue is full.
TEST_F(RdmaControlTest, FullNotificationQueueAnswersAgain) {
    ote_engine_t *dst = RdmaEngine();
    ote_engine_t *e = RdmaEngine();
    ASSERT_NE(dst, nullptr);
    ASSERT_NE(e, nullptr);
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_segment_open(e, EngineAddress(dst).c_str(), &seg), OTE_OK);
    for (int i = 0; i < OTE_NOTIFY_QUEUE_MAX; i++)
        ASSERT_EQ(ote_notify_send(e, seg, "n", 1), OTE_OK) << i;
    EXPECT_EQ(ote_status_code(ote_notify_send(e, seg, "n", 1)), OTE_ERR_AGAIN);
    char b[8];
    size_t len = 0;
    ASSERT_EQ(ote_notify_recv(dst, b, sizeof(b), &len, nullptr, 0, 10 * kSec), OTE_OK);
    EXPECT_EQ(ote_notify_send(e, seg, "n", 1), OTE_OK);
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(dst), OTE_OK);
}

// Finding 14: destroy joins the control connection threads (woken, joinable) instead of
// freeing the transport under detached ones; nothing is retained.
TEST_F(RdmaControlTest, DestroyJoinsControlThreadsOfOpenConnections) {
    // connect_timeout_ms 60 s: destroy would wait up to 70 s (connect_timeout_ms + 10 s)
    // for threads that are not woken, far beyond the 30 s bound below; woken ones end at
    // once, and 30 s leaves a loaded machine all the slack it needs.
    ote_engine_t *e = RdmaEngine("20000", "60000");
    ASSERT_NE(e, nullptr);
    std::string addr = EngineAddress(e);
    std::vector<int> fds;
    std::vector<uint8_t> buf;
    ote_ctl_msg_t m;
    for (int i = 0; i < 4; i++) {
        int fd = ote_test::ConnectTo(addr);
        ASSERT_GE(fd, 0);
        if (i % 2 == 0) { /* half of them past the handshake, half silent */
            ASSERT_TRUE(SendAll(fd, Hello()));
            ASSERT_TRUE(ReadFrame(fd, &buf, &m));
        }
        fds.push_back(fd);
    }
    uint64_t before = ote__rdma_retained_transports_get();
    uint64_t t0 = ote_now_ns();
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
    EXPECT_LT(ote_now_ns() - t0, 30 * kSec);
    EXPECT_EQ(ote__rdma_retained_transports_get(), before);
    for (int fd : fds) {
        EXPECT_TRUE(ClosedByPeer(fd, 20000));
        close(fd);
    }
}

// Source-side staging against a hostile source (engine/rdma/rdma_commit.c): a source
// that advertises rdma_stage=1 (and sends its epoch) is asked with the staging flag
// (GRANT_REQ of 76 bytes, flags 1). A COMMIT is the source's word that a staged WRITE's
// bytes reached its device memory, so a requester takes one only for a staged WRITE grant
// it is waiting on: COMMITs naming another grant, or the right grant before its answer,
// complete nothing (the request still ends at its deadline) and keep the connection; a
// malformed COMMIT (a body of the wrong size) is a protocol error that closes it.
TEST_F(RdmaControlTest, ForgedOrMalformedCommitIsRefused) {
    std::string addr;
    int lfd = ote_test::ListenLoopback(16, &addr);
    ASSERT_GE(lfd, 0);
    ote_config_t *cfg = ote_test::RdmaConfig("1500");
    ASSERT_EQ(ote_config_set(cfg, "rdma_devices", "sim0"), OTE_OK);
    ote_engine_t *e = nullptr;
    ASSERT_EQ(ote_engine_create(cfg, &e), OTE_OK);
    ote_config_destroy(cfg);
    std::atomic<ote_status_t> open_st{OTE_ERR_STATE};
    ote_segment_t *seg = nullptr;
    std::thread opener([&] { open_st = ote_segment_open(e, addr.c_str(), &seg); });
    JoinOnExit join_opener{opener};
    std::vector<uint8_t> buf;
    ote_ctl_msg_t m;
    int fd = FakeSourceHandshake(lfd, addr, "transports=rdma;rdma_release=1;rdma_stage=1");
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(ReadFrame(fd, &buf, &m)); // INFO
    // INFO_ACK with the source's epoch (proto.h: one device, then the epoch): 72 bytes.
    std::vector<uint8_t> info = InfoBody(2);
    info.resize(72, 0);
    uint32_t ndev = 1, nic = 1;
    uint64_t epoch = 0x5eed5eed5eedull;
    memcpy(&info[28], &ndev, 4);
    memcpy(&info[32], &nic, 4);
    memcpy(&info[64], &epoch, 8);
    ASSERT_TRUE(SendAll(fd, Frame(OTE_CTL_RDMA, m.req_id, OTE_OK, info)));
    opener.join();
    ASSERT_EQ(open_st.load(), OTE_OK);
    std::vector<uint8_t> data(64u << 10, 7);
    ote_batch_t *b = nullptr;
    ASSERT_EQ(ote_batch_create(e, 1, &b), OTE_OK);
    ote_request_t r = {OTE_WRITE, data.data(), seg, 0x100000, data.size()};
    std::atomic<ote_status_t> sub_st{OTE_ERR_STATE};
    std::thread submitter([&] { sub_st = ote_batch_submit(b, &r, 1); });
    JoinOnExit join_submitter{submitter};
    constexpr uint32_t kQpn = 0x4321, kRkey = 0xabcd01;
    uint64_t grant_id = 0;
    while (grant_id == 0) {
        ASSERT_TRUE(ReadFrame(fd, &buf, &m)) << "no GRANT_REQ came";
        ASSERT_EQ(m.opcode, OTE_CTL_RDMA);
        ASSERT_GE(m.u.rdma.len, 4u);
        uint16_t type = (uint16_t)(m.u.rdma.body[0] | (m.u.rdma.body[1] << 8));
        if (type == 3) { // CONNECT: answer our path (gid, lid, qpn, psn, mtu 1024)
            std::vector<uint8_t> ack(36, 0);
            ack[0] = 4; // CONNECT_ACK
            ack[4 + 15] = 1;
            uint32_t qpn = kQpn, psn = 1, mtu = 3;
            memcpy(&ack[4 + 20], &qpn, 4);
            memcpy(&ack[4 + 24], &psn, 4);
            memcpy(&ack[4 + 28], &mtu, 4);
            ASSERT_TRUE(SendAll(fd, Frame(OTE_CTL_RDMA, m.req_id, OTE_OK, ack)));
        } else {
            ASSERT_EQ(type, 5) << "neither CONNECT nor GRANT_REQ";
            // Asked with the staging flag, after the source's epoch.
            ASSERT_EQ(m.u.rdma.len, 76u);
            uint64_t got_epoch = 0;
            uint32_t flags = 0;
            memcpy(&got_epoch, m.u.rdma.body + 64, 8);
            memcpy(&flags, m.u.rdma.body + 72, 4);
            EXPECT_EQ(got_epoch, epoch);
            EXPECT_EQ(flags, 1u);
            grant_id = m.req_id;
        }
    }
    submitter.join();
    ASSERT_EQ(sub_st.load(), OTE_OK);
    // COMMITs the requester waits for none of: another grant id, and the right grant
    // before its answer (so before any staged WRITE of it exists), OK status.
    std::vector<uint8_t> commit(8, 0);
    commit[0] = 10; // COMMIT
    uint32_t rkey = kRkey;
    memcpy(&commit[4], &rkey, 4);
    ASSERT_TRUE(SendAll(fd, Frame(OTE_CTL_RDMA, grant_id ^ 0x5, OTE_OK, commit)));
    ASSERT_TRUE(SendAll(fd, Frame(OTE_CTL_RDMA, grant_id, OTE_OK, commit)));
    // Nothing completes the request: it ends at its deadline (unanswered grant).
    (void)ote_batch_wait(b, 30 * kSec);
    ote_transfer_status_t ts{};
    ASSERT_EQ(ote_batch_status(b, 0, &ts), OTE_OK);
    EXPECT_EQ(ts.state, OTE_TRANSFER_TIMEOUT) << ote_status_str(ts.error);
    EXPECT_EQ(ts.bytes_done, 0u);
    // The connection is still up (the forged COMMITs were ignored): a malformed COMMIT
    // now closes it.
    EXPECT_FALSE(ClosedByPeer(fd, 200));
    std::vector<uint8_t> bad = commit;
    bad.resize(12, 0);
    ASSERT_TRUE(SendAll(fd, Frame(OTE_CTL_RDMA, grant_id, OTE_OK, bad)));
    EXPECT_TRUE(ClosedByPeer(fd, 10000)) << "a malformed COMMIT did not close the connection";
    if (ts.state != OTE_TRANSFER_PENDING) {
        EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    }
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    close(fd);
    close(lfd);
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
}

} // namespace

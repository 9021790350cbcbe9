// Authentication seen from raw sockets: the shm socket (a requester that skips the proof
// and sends REQS, a wrong key, a replayed proof) and the engine's one listener (RDMA
// control connections: a HELLO followed at once by an RDMA control frame; the back-off
// per address, shared by tcp and rdma). Each is closed before anything it sent is acted
// on, and counted.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "tests/engine/ctl_peer.h"
#include "tests/engine/engine_util.h"
#include "tests/engine/shm_wire.h"
#include "tests/util/test_base.h"
#include "tests/util/wait.h"

extern "C" {
#include "base/time.h"
#include "engine/control/auth.h"
#include "engine/control/ctl.h"
#include "ote/ote.h"
}

namespace {

using ote_test::kMs;
using ote_test::NewEngine;

std::string KeyFile(const char *name, unsigned seed) {
    const char *dir = getenv("TEST_TMPDIR");
    std::string path = std::string(dir ? dir : "/tmp") + "/" + name;
    unlink(path.c_str());
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    EXPECT_GE(fd, 0) << path;
    std::vector<uint8_t> b(48);
    for (size_t i = 0; i < b.size(); i++) b[i] = static_cast<uint8_t>(seed * 31 + i);
    EXPECT_EQ(write(fd, b.data(), b.size()), static_cast<ssize_t>(b.size()));
    close(fd);
    return path;
}

// True once fd reports EOF or an error within timeout_ms (what arrives is dropped).
bool SeqClosed(int fd, int timeout_ms = 20000) {
    uint8_t b[512];
    for (int waited = 0; waited < timeout_ms; waited += 100) {
        pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 100) <= 0) continue;
        ssize_t n = recv(fd, b, sizeof(b), MSG_DONTWAIT);
        if (n <= 0) return true;
    }
    return false;
}

// One message of at most cap bytes within timeout_ms: its length, or -1.
ssize_t SeqRecv(int fd, void *buf, size_t cap, int timeout_ms = 20000) {
    pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) return -1;
    return recv(fd, buf, cap, MSG_DONTWAIT | MSG_TRUNC);
}

class AuthRawTest : public ote_test::OteTest {
  protected:
    void SetUp() override {
        OteTest::SetUp();
        key_path_ = KeyFile("raw_key", 3);
        other_path_ = KeyFile("raw_other", 4);
        ASSERT_EQ(ote_auth_key_load(key_path_.c_str(), &key_), OTE_OK);
        ASSERT_EQ(ote_auth_key_load(other_path_.c_str(), &other_), OTE_OK);
    }
    void TearDown() override {
        ote_auth_key_free(key_);
        ote_auth_key_free(other_);
        OteTest::TearDown();
    }

    // The engine's advertisement, asked with an authenticated INFO handshake (this test
    // knows the key) through the library's own requester side.
    std::string InfoOf(ote_engine_t *e) {
        int fd = ote_test::ConnectTo(ote_test::EngineAddress(e));
        EXPECT_GE(fd, 0);
        ote_ctl_msg_t h{};
        h.version = OTE_CTL_VERSION_MAX;
        h.opcode = OTE_CTL_HELLO;
        h.u.hello.min_version = OTE_CTL_VERSION_MIN;
        h.u.hello.max_version = OTE_CTL_VERSION_MAX;
        h.u.hello.role = OTE_CTL_ROLE_INFO;
        h.u.hello.addr = "127.0.0.1:1";
        h.u.hello.addr_len = 11;
        EXPECT_TRUE(ote_test::SendAll(fd, ote_test::Encode(h)));
        std::vector<uint8_t> buf(OTE_CTL_HDR_LEN + OTE_CTL_MAX_BODY);
        ote_auth_sock_t s = {fd, buf.data(), buf.size(), ote_deadline_after(20000 * kMs)};
        ote_auth_io_t io = ote_auth_sock_io(&s);
        ote_ctl_msg_t ack{};
        EXPECT_EQ(ote_auth_requester(key_, &h, &io, "raw", &ack), OTE_OK);
        std::string info;
        if (ack.opcode == OTE_CTL_HELLO_ACK)
            info.assign(ack.u.hello_ack.info, ack.u.hello_ack.info_len);
        close(fd);
        return info;
    }

    // A raw SOCK_SEQPACKET connection to the engine's shm socket.
    int ShmConnect(ote_engine_t *e) {
        char sock[128] = {0};
        EXPECT_EQ(ote_ctl_info_get(InfoOf(e).c_str(), "shm", sock, sizeof(sock)), OTE_OK);
        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        EXPECT_GE(fd, 0);
        sockaddr_un sun;
        memset(&sun, 0, sizeof(sun));
        sun.sun_family = AF_UNIX;
        size_t n = strlen(sock);
        memcpy(sun.sun_path + 1, sock, n);
        socklen_t sl = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
        EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr *>(&sun), sl), 0) << strerror(errno);
        return fd;
    }

    static tw_hello_t ShmHello() {
        tw_hello_t h;
        memset(&h, 0, sizeof(h));
        h.h = {TW_MAGIC, TW_VERSION, TW_HELLO, 0, 0};
        snprintf(h.addr, sizeof(h.addr), "raw:1");
        return h;
    }

    // Send a HELLO and read the CHALLENGE: its nonce.
    static void ShmChallenge(int fd, const tw_hello_t &h, uint8_t *ns) {
        ASSERT_EQ(send(fd, &h, sizeof(h), MSG_NOSIGNAL), static_cast<ssize_t>(sizeof(h)));
        tw_auth_t c;
        ASSERT_EQ(SeqRecv(fd, &c, sizeof(c)), static_cast<ssize_t>(sizeof(c)));
        ASSERT_EQ(c.h.kind, TW_AUTH);
        ASSERT_EQ(c.step, OTE_CTL_AUTH_CHALLENGE);
        memcpy(ns, c.nonce, sizeof(c.nonce));
    }

    static tw_auth_t ShmProof(const ote_auth_key_t *k, const tw_hello_t &h, const uint8_t *ns) {
        ote_auth_t a;
        ote_auth_bind(&a, "shm", &h, sizeof(h));
        ote_auth_prove(&a, k, ns);
        tw_auth_t p;
        memset(&p, 0, sizeof(p));
        p.h = {TW_MAGIC, TW_VERSION, TW_AUTH, 0, 0};
        p.step = OTE_CTL_AUTH_PROOF;
        memcpy(p.nonce, a.nc, sizeof(p.nonce));
        memcpy(p.mac, a.mac, sizeof(p.mac));
        return p;
    }

    std::string key_path_, other_path_;
    ote_auth_key_t *key_ = nullptr, *other_ = nullptr;
};

TEST_F(AuthRawTest, ShmRequesterThatSkipsTheProofIsClosedAndNothingIsWritten) {
    ote_engine_t *src =
        NewEngine({{"transports", "shm,tcp"}, {"auth_key_file", key_path_.c_str()}});
    ASSERT_NE(src, nullptr);
    std::vector<uint8_t> mem(4096, 0x33), mine(4096, 0xcc);
    ASSERT_EQ(ote_memory_register(src, mem.data(), mem.size(), OTE_PERM_READ | OTE_PERM_WRITE),
              OTE_OK);
    uint64_t fails = ote_auth_failures();
    int fd = ShmConnect(src);
    tw_hello_t h = ShmHello();
    h.probe_addr = reinterpret_cast<uintptr_t>(mine.data()); // cross-memory attach
    uint8_t ns[32];
    ShmChallenge(fd, h, ns);
    // A WRITE of this process's bytes into the source's registration instead of a proof.
    struct {
        tw_hdr_t h;
        tw_req_t q;
    } msg;
    memset(&msg, 0, sizeof(msg));
    msg.h = {TW_MAGIC, TW_VERSION, TW_REQS, 1, 0};
    msg.q.id = 1;
    msg.q.remote = reinterpret_cast<uintptr_t>(mem.data());
    msg.q.local = reinterpret_cast<uintptr_t>(mine.data());
    msg.q.len = 4096;
    msg.q.op = TW_OP_WRITE;
    msg.q.req_remote = msg.q.remote;
    msg.q.req_len = 4096;
    msg.q.req_uid = 1;
    ASSERT_EQ(send(fd, &msg, sizeof(msg), MSG_NOSIGNAL), static_cast<ssize_t>(sizeof(msg)));
    EXPECT_TRUE(SeqClosed(fd));
    close(fd);
    EXPECT_EQ(ote_auth_failures(), fails + 1);
    EXPECT_EQ(mem, std::vector<uint8_t>(4096, 0x33));
    EXPECT_EQ(ote_memory_unregister(src, mem.data()), OTE_OK); // nothing pinned it
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
}

TEST_F(AuthRawTest, ShmWrongKeyAndReplayedProofAreRefused) {
    ote_engine_t *src =
        NewEngine({{"transports", "shm,tcp"}, {"auth_key_file", key_path_.c_str()}});
    ASSERT_NE(src, nullptr);
    uint64_t fails = ote_auth_failures();
    tw_hello_t h = ShmHello();
    uint8_t ns[32];
    // The right key: OK (the source's proof checks), then the HELLO_ACK.
    int fd = ShmConnect(src);
    ShmChallenge(fd, h, ns);
    tw_auth_t good = ShmProof(key_, h, ns);
    ASSERT_EQ(send(fd, &good, sizeof(good), MSG_NOSIGNAL), static_cast<ssize_t>(sizeof(good)));
    tw_auth_t ok;
    ASSERT_EQ(SeqRecv(fd, &ok, sizeof(ok)), static_cast<ssize_t>(sizeof(ok)));
    EXPECT_EQ(ok.h.kind, TW_AUTH);
    EXPECT_EQ(ok.step, OTE_CTL_AUTH_OK);
    ote_auth_t a;
    ote_auth_bind(&a, "shm", &h, sizeof(h));
    memcpy(a.ns, ns, sizeof(a.ns));
    memcpy(a.nc, good.nonce, sizeof(a.nc));
    EXPECT_EQ(ote_auth_check_ok(&a, key_, ok.mac), OTE_OK);
    EXPECT_EQ(ote_auth_check_ok(&a, other_, ok.mac), OTE_ERR_AUTH);
    tw_hello_ack_t ack;
    ASSERT_EQ(SeqRecv(fd, &ack, sizeof(ack)), static_cast<ssize_t>(sizeof(ack)));
    EXPECT_EQ(ack.h.kind, TW_HELLO_ACK);
    EXPECT_NE(ack.status, OTE_ERR_AUTH); // (no ring in this HELLO: refused for that, later)
    close(fd);
    EXPECT_EQ(ote_auth_failures(), fails);
    // The recorded proof on a new connection (another challenge): refused.
    fd = ShmConnect(src);
    ShmChallenge(fd, h, ns);
    ASSERT_EQ(send(fd, &good, sizeof(good), MSG_NOSIGNAL), static_cast<ssize_t>(sizeof(good)));
    ASSERT_EQ(SeqRecv(fd, &ack, sizeof(ack)), static_cast<ssize_t>(sizeof(ack)));
    EXPECT_EQ(ack.h.kind, TW_HELLO_ACK);
    EXPECT_EQ(ack.status, OTE_ERR_AUTH);
    EXPECT_TRUE(SeqClosed(fd));
    close(fd);
    EXPECT_EQ(ote_auth_failures(), fails + 1);
    // Another key: refused.
    fd = ShmConnect(src);
    ShmChallenge(fd, h, ns);
    tw_auth_t bad = ShmProof(other_, h, ns);
    ASSERT_EQ(send(fd, &bad, sizeof(bad), MSG_NOSIGNAL), static_cast<ssize_t>(sizeof(bad)));
    ASSERT_EQ(SeqRecv(fd, &ack, sizeof(ack)), static_cast<ssize_t>(sizeof(ack)));
    EXPECT_EQ(ack.status, OTE_ERR_AUTH);
    EXPECT_TRUE(SeqClosed(fd));
    close(fd);
    EXPECT_EQ(ote_auth_failures(), fails + 2);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
}

TEST_F(AuthRawTest, RdmaControlFrameBeforeTheProofIsNeverServed) {
    ote_engine_t *src = NewEngine({{"transport", "rdma"},
                                   {"verbs_provider", "sim"},
                                   {"connect_timeout_ms", "10000"},
                                   {"auth_key_file", key_path_.c_str()}});
    ASSERT_NE(src, nullptr);
    uint64_t fails = ote_auth_failures();
    int fd = ote_test::ConnectTo(ote_test::EngineAddress(src));
    ASSERT_GE(fd, 0);
    ote_ctl_msg_t h{};
    h.version = OTE_CTL_VERSION_MAX;
    h.opcode = OTE_CTL_HELLO;
    h.u.hello.min_version = OTE_CTL_VERSION_MIN;
    h.u.hello.max_version = OTE_CTL_VERSION_MAX;
    h.u.hello.role = 2; // RDMA control
    h.u.hello.addr = "127.0.0.1:1";
    h.u.hello.addr_len = 11;
    std::vector<uint8_t> out = ote_test::Encode(h);
    uint8_t body[16] = {1, 0, 0, 0};
    ote_ctl_msg_t r{};
    r.version = OTE_CTL_VERSION_MAX;
    r.opcode = OTE_CTL_RDMA;
    r.u.rdma.body = body;
    r.u.rdma.len = sizeof(body);
    std::vector<uint8_t> rf = ote_test::Encode(r);
    out.insert(out.end(), rf.begin(), rf.end());
    ASSERT_TRUE(ote_test::SendAll(fd, out));
    std::vector<uint8_t> buf;
    ote_ctl_msg_t m;
    ASSERT_TRUE(ote_test::ReadFrame(fd, &buf, &m));
    EXPECT_EQ(m.opcode, OTE_CTL_AUTH);
    EXPECT_EQ(m.u.auth.step, OTE_CTL_AUTH_CHALLENGE);
    EXPECT_FALSE(ote_test::ReadFrame(fd, &buf, &m)); // nothing more: closed
    EXPECT_TRUE(ote_test::ClosedByPeer(fd));
    close(fd);
    EXPECT_EQ(ote_auth_failures(), fails + 1);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
}

// ---- back-off of addresses that fail authentication (engine/control/auth_limit.h) ----

// A TCP connection to "127.0.0.1:port" from the source address src_ip (any loopback
// address: all of 127/8 is local on Linux); -1 on failure.
int ConnectFrom(const char *src_ip, const std::string &addr) {
    size_t colon = addr.rfind(':');
    sockaddr_in to{}, from{};
    to.sin_family = from.sin_family = AF_INET;
    to.sin_port = htons(static_cast<uint16_t>(std::stoi(addr.substr(colon + 1))));
    if (inet_pton(AF_INET, addr.substr(0, colon).c_str(), &to.sin_addr) != 1 ||
        inet_pton(AF_INET, src_ip, &from.sin_addr) != 1)
        return -1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (bind(fd, reinterpret_cast<sockaddr *>(&from), sizeof(from)) != 0 ||
        connect(fd, reinterpret_cast<sockaddr *>(&to), sizeof(to)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

// True when the peer closes fd (EOF) before sending a single byte, within 20 s.
bool ClosedWithoutAByte(int fd) {
    pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 20000) != 1) return false;
    uint8_t b;
    return recv(fd, &b, 1, MSG_DONTWAIT) == 0;
}

// The back-off the engines of these tests get: 5 failures within 2 minutes, then 2 s (long
// enough that the checks made during it hold on a loaded machine), up to 4 s.
constexpr uint64_t kBackoffNs = 2000 * OTE_NSEC_PER_MSEC;

class AuthBackoffTest : public AuthRawTest {
  protected:
    void SetUp() override {
        AuthRawTest::SetUp();
        ote_auth_limit_cfg_t c;
        ote_auth_limit_cfg_default(&c);
        c.window_ns = 120 * OTE_NSEC_PER_SEC;
        c.backoff_min_ns = kBackoffNs;
        c.backoff_max_ns = 2 * kBackoffNs;
        c.quiet_ns = 120 * OTE_NSEC_PER_SEC;
        ote__auth_limit_test_cfg(&c); // for the engines created from here
    }
    void TearDown() override {
        ote__auth_limit_test_cfg(nullptr);
        AuthRawTest::TearDown();
    }
    // A HELLO of role on fd, then the library's requester side of the exchange with key k:
    // OTE_OK with the HELLO_ACK in *ack, OTE_ERR_AUTH when refused, a channel status.
    static ote_status_t Handshake(int fd, const ote_auth_key_t *k, uint16_t role,
                                  ote_ctl_msg_t *ack, std::vector<uint8_t> *buf) {
        ote_ctl_msg_t h{};
        h.version = OTE_CTL_VERSION_MAX;
        h.opcode = OTE_CTL_HELLO;
        h.u.hello.min_version = OTE_CTL_VERSION_MIN;
        h.u.hello.max_version = OTE_CTL_VERSION_MAX;
        h.u.hello.role = role;
        h.u.hello.addr = "127.0.0.1:1";
        h.u.hello.addr_len = 11;
        if (!ote_test::SendAll(fd, ote_test::Encode(h))) return OTE_ERR_IO;
        buf->assign(OTE_CTL_HDR_LEN + OTE_CTL_MAX_BODY, 0);
        ote_auth_sock_t s = {fd, buf->data(), buf->size(), ote_deadline_after(20000 * kMs)};
        ote_auth_io_t io = ote_auth_sock_io(&s);
        return ote_auth_requester(k, &h, &io, "raw", ack);
    }
};

struct Listener {
    const char *name;
    ote_test::ConfigKv kv;
    uint16_t role; // of the HELLO the raw peer sends
};

void PrintTo(const Listener &l, std::ostream *os) { *os << l.name; }

class AuthBackoffListenerTest : public AuthBackoffTest,
                                public ::testing::WithParamInterface<Listener> {};

// A wrong key 5 times from 127.0.0.1: its next connection is closed at accept without a
// byte and counted, while the right key from 127.0.0.2 is served; once the back-off is
// over (never before it), the right key from 127.0.0.1 is served again.
TEST_P(AuthBackoffListenerTest, WrongKeyFromOneAddressIsClosedAtAcceptUntilItsBackOffEnds) {
    ote_test::ConfigKv kv = GetParam().kv;
    kv.push_back({"connect_timeout_ms", "10000"});
    kv.push_back({"auth_key_file", key_path_.c_str()});
    ote_engine_t *src = NewEngine(kv);
    ASSERT_NE(src, nullptr);
    std::string addr = ote_test::EngineAddress(src);
    uint16_t role = GetParam().role;
    std::vector<uint8_t> buf;
    ote_ctl_msg_t ack{};
    uint64_t fails = ote_auth_failures(), t0 = 0;
    for (int i = 0; i < 5; i++) {
        int fd = ConnectFrom("127.0.0.1", addr);
        ASSERT_GE(fd, 0);
        t0 = ote_now_ns(); // before the source's clock reads the last failure
        EXPECT_EQ(Handshake(fd, other_, role, &ack, &buf), OTE_ERR_AUTH) << i;
        close(fd);
    }
    EXPECT_EQ(ote_auth_failures(), fails + 5);
    uint64_t refused = ote_auth_refused();
    int fd = ConnectFrom("127.0.0.1", addr);
    ASSERT_GE(fd, 0);
    EXPECT_TRUE(ClosedWithoutAByte(fd)); // no CHALLENGE: closed at accept
    close(fd);
    EXPECT_EQ(ote_auth_refused(), refused + 1);
    // Another address with the right key is not slowed down.
    fd = ConnectFrom("127.0.0.2", addr);
    ASSERT_GE(fd, 0) << "the listener on 127.0.0.1 takes connections from 127.0.0.2";
    EXPECT_EQ(Handshake(fd, key_, role, &ack, &buf), OTE_OK);
    EXPECT_EQ(ack.opcode, OTE_CTL_HELLO_ACK);
    close(fd);
    // The right key from 127.0.0.1, again and again, until the back-off is over.
    // One attempt every 50 ms (each is a connection the listener sees), for 30 s.
    bool no_fd = false;
    EXPECT_TRUE(ote_test::WaitUntil(
        [&] {
            fd = ConnectFrom("127.0.0.1", addr);
            if (fd < 0) {
                no_fd = true;
                return true;
            }
            bool served =
                Handshake(fd, key_, role, &ack, &buf) == OTE_OK && ack.opcode == OTE_CTL_HELLO_ACK;
            close(fd);
            return served;
        },
        std::chrono::seconds(30), std::chrono::milliseconds(50),
        "the right key served once the back-off is over"));
    ASSERT_FALSE(no_fd) << "could not connect";
    EXPECT_GE(ote_now_ns(), t0 + kBackoffNs); // not before the back-off ended
    EXPECT_GT(ote_auth_refused(), refused);
    EXPECT_EQ(ote_auth_failures(), fails + 5); // refused connections are not failures
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
}

INSTANTIATE_TEST_SUITE_P(
    Listeners, AuthBackoffListenerTest,
    ::testing::Values(Listener{"tcp", {{"transports", "tcp"}}, OTE_CTL_ROLE_INFO},
                      Listener{"rdma", {{"transport", "rdma"}, {"verbs_provider", "sim"}}, 2},
                      Listener{
                          "rdma_tcp", {{"transports", "rdma,tcp"}, {"verbs_provider", "sim"}}, 2}),
    [](const ::testing::TestParamInfo<Listener> &i) { return std::string(i.param.name); });

// An engine with tcp and rdma has one listener, so one back-off and one authentication
// per connection for both: failures on TCP data connections close that address's RDMA
// control connections at accept too, while another address is served on both; and a
// HELLO naming a transport the engine does not serve is authenticated before it is
// refused (a peer without the key learns nothing of the engine's transports).
TEST_F(AuthBackoffTest, OneListenerOneBackOffForTcpAndRdma) {
    ote_engine_t *src = NewEngine({{"transports", "rdma,tcp"},
                                   {"verbs_provider", "sim"},
                                   {"connect_timeout_ms", "10000"},
                                   {"auth_key_file", key_path_.c_str()}});
    ASSERT_NE(src, nullptr);
    std::string addr = ote_test::EngineAddress(src);
    std::vector<uint8_t> buf;
    ote_ctl_msg_t ack{};
    uint64_t fails = ote_auth_failures();
    for (int i = 0; i < 5; i++) {
        int fd = ConnectFrom("127.0.0.1", addr);
        ASSERT_GE(fd, 0);
        EXPECT_EQ(Handshake(fd, other_, 1, &ack, &buf), OTE_ERR_AUTH) << i; // TCP data
        close(fd);
    }
    EXPECT_EQ(ote_auth_failures(), fails + 5);
    uint64_t refused = ote_auth_refused();
    int fd = ConnectFrom("127.0.0.1", addr); // the RDMA control connection it would make
    ASSERT_GE(fd, 0);
    EXPECT_TRUE(ClosedWithoutAByte(fd));
    close(fd);
    EXPECT_EQ(ote_auth_refused(), refused + 1);
    for (uint16_t role : {uint16_t{1}, uint16_t{2}, uint16_t{OTE_CTL_ROLE_INFO}}) {
        fd = ConnectFrom("127.0.0.2", addr);
        ASSERT_GE(fd, 0);
        EXPECT_EQ(Handshake(fd, key_, role, &ack, &buf), OTE_OK) << role;
        EXPECT_EQ(ack.opcode, OTE_CTL_HELLO_ACK) << role;
        close(fd);
    }
    // Role 9 names no transport: with the key, authenticated, then refused with a reason.
    fd = ConnectFrom("127.0.0.2", addr);
    ASSERT_GE(fd, 0);
    EXPECT_EQ(Handshake(fd, key_, 9, &ack, &buf), OTE_OK);
    EXPECT_EQ(ack.opcode, OTE_CTL_ERROR);
    EXPECT_EQ(ack.status, OTE_ERR_UNSUPPORTED);
    if (ack.opcode == OTE_CTL_ERROR) {
        EXPECT_NE(std::string(ack.u.error.text, ack.u.error.text_len).find("transports=rdma,tcp"),
                  std::string::npos);
    }
    close(fd);
    // Without it: an authentication failure like any other, no word on the transports.
    fd = ConnectFrom("127.0.0.2", addr);
    ASSERT_GE(fd, 0);
    EXPECT_EQ(Handshake(fd, other_, 9, &ack, &buf), OTE_ERR_AUTH);
    close(fd);
    EXPECT_EQ(ote_auth_failures(), fails + 6);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
}

// shm: the address is the requester's uid (this test's own). A wrong key 5 times: the
// next connection of that uid is closed at accept; the right key is served again once
// the back-off is over.
TEST_F(AuthBackoffTest, ShmWrongKeyBacksOffItsUidUntilTheBackOffEnds) {
    ote_engine_t *src =
        NewEngine({{"transports", "shm,tcp"}, {"auth_key_file", key_path_.c_str()}});
    ASSERT_NE(src, nullptr);
    uint64_t fails = ote_auth_failures(), t0 = 0;
    tw_hello_t h = ShmHello();
    uint8_t ns[32];
    for (int i = 0; i < 5; i++) {
        int fd = ShmConnect(src);
        ShmChallenge(fd, h, ns);
        t0 = ote_now_ns();
        tw_auth_t bad = ShmProof(other_, h, ns);
        ASSERT_EQ(send(fd, &bad, sizeof(bad), MSG_NOSIGNAL), static_cast<ssize_t>(sizeof(bad)));
        tw_hello_ack_t ack;
        ASSERT_EQ(SeqRecv(fd, &ack, sizeof(ack)), static_cast<ssize_t>(sizeof(ack)));
        EXPECT_EQ(ack.status, OTE_ERR_AUTH);
        EXPECT_TRUE(SeqClosed(fd));
        close(fd);
    }
    EXPECT_EQ(ote_auth_failures(), fails + 5);
    uint64_t refused = ote_auth_refused();
    int fd = ShmConnect(src);
    uint8_t b[64];
    EXPECT_EQ(SeqRecv(fd, b, sizeof(b)), 0); // EOF before any message: closed at accept
    close(fd);
    EXPECT_EQ(ote_auth_refused(), refused + 1);
    // One attempt every 50 ms (each is a connection the listener sees), for 30 s.
    bool served = false;
    ote_test::WaitUntil(
        [&] {
            fd = ShmConnect(src);
            tw_auth_t c;
            if (send(fd, &h, sizeof(h), MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(h)) &&
                SeqRecv(fd, &c, sizeof(c)) == static_cast<ssize_t>(sizeof(c)) &&
                c.h.kind == TW_AUTH) {
                tw_auth_t good = ShmProof(key_, h, c.nonce);
                tw_auth_t ok;
                served = send(fd, &good, sizeof(good), MSG_NOSIGNAL) ==
                             static_cast<ssize_t>(sizeof(good)) &&
                         SeqRecv(fd, &ok, sizeof(ok)) == static_cast<ssize_t>(sizeof(ok)) &&
                         ok.h.kind == TW_AUTH && ok.step == OTE_CTL_AUTH_OK;
            }
            close(fd);
            return served;
        },
        std::chrono::seconds(30), std::chrono::milliseconds(50),
        "the right key served once the back-off is over");
    EXPECT_TRUE(served);
    EXPECT_GE(ote_now_ns(), t0 + kBackoffNs); // not before the back-off ended
    EXPECT_EQ(ote_auth_failures(), fails + 5);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
}

} // namespace

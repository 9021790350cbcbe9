// Authentication seen from raw sockets on the transports' own connections: the shm
// socket (a requester that skips the proof and sends REQS, a wrong key, a replayed proof)
// and the RDMA transport's control listener (a HELLO followed at once by an RDMA control
// frame). Each is closed before anything it sent is acted on, and counted.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/engine/ctl_peer.h"
#include "tests/engine/engine_util.h"
#include "tests/engine/shm_wire.h"
#include "tests/util/test_base.h"

extern "C" {
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

} // namespace

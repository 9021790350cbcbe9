// Authentication with the cluster key (engine/control/auth.h), in process: the key file's
// checks, the listen policy without a key, the right key moving bytes on tcp, shm and
// rdma (verbs sim), a wrong key, a key on one side only, a replayed handshake, and raw
// connections that skip authentication and send requests (closed; nothing written or
// listed).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/engine/ctl_peer.h"
#include "tests/engine/engine_util.h"
#include "tests/engine/target.h"
#include "tests/util/wait.h"
#include "tests/util/test_base.h"

extern "C" {
#include "base/time.h"
#include "engine/control/auth.h"
#include "engine/control/ctl.h"
#include "ote/ote.h"
}

namespace {

using ote_test::ConfigKv;
using ote_test::kMs;
using ote_test::NewEngine;

// A key file of n bytes (byte i = seed + i) with mode, in the test's temporary directory.
std::string KeyFile(const char *name, size_t n, unsigned seed, mode_t mode) {
    const char *dir = getenv("TEST_TMPDIR");
    std::string path = std::string(dir ? dir : "/tmp") + "/" + name;
    unlink(path.c_str());
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    EXPECT_GE(fd, 0) << path;
    std::vector<uint8_t> b(n);
    for (size_t i = 0; i < n; i++) b[i] = static_cast<uint8_t>(seed + i * 7);
    EXPECT_EQ(write(fd, b.data(), n), static_cast<ssize_t>(n));
    EXPECT_EQ(fchmod(fd, mode), 0);
    close(fd);
    return path;
}

ote_status_t TryEngine(const ConfigKv &kv, ote_engine_t **e) {
    ote_config_t *cfg = nullptr;
    EXPECT_EQ(ote_config_create(&cfg), OTE_OK);
    for (const auto &p : kv) EXPECT_EQ(ote_config_set(cfg, p.first, p.second), OTE_OK) << p.first;
    ote_status_t st = ote_engine_create(cfg, e);
    ote_config_destroy(cfg);
    return st;
}

class AuthTest : public ote_test::OteTest {
  protected:
    void SetUp() override {
        OteTest::SetUp();
        key_a_ = KeyFile("key_a", 32, 1, 0600);
        key_b_ = KeyFile("key_b", 32, 2, 0600);
    }
    std::string key_a_, key_b_;
};

TEST_F(AuthTest, KeyFileMustBePrivateRegularAndLongEnough) {
    ote_engine_t *e = nullptr;
    std::string open_key = KeyFile("key_0644", 32, 1, 0644);
    ExpectErrorLogsIn([&] {
        EXPECT_EQ(TryEngine({{"auth_key_file", open_key.c_str()}}, &e), OTE_ERR_ACCESS);
    });
    EXPECT_TRUE(LogContains("mode 0644"));
    EXPECT_TRUE(LogContains(open_key));
    std::string group_write = KeyFile("key_0620", 32, 1, 0620);
    ExpectErrorLogsIn([&] {
        EXPECT_EQ(TryEngine({{"auth_key_file", group_write.c_str()}}, &e), OTE_ERR_ACCESS);
    });
    std::string short_key = KeyFile("key_short", 31, 1, 0600);
    ExpectErrorLogsIn([&] {
        EXPECT_EQ(TryEngine({{"auth_key_file", short_key.c_str()}}, &e), OTE_ERR_INVALID);
    });
    const char *dir = getenv("TEST_TMPDIR");
    std::string missing = std::string(dir ? dir : "/tmp") + "/no_such_key";
    ExpectErrorLogsIn([&] {
        EXPECT_EQ(TryEngine({{"auth_key_file", missing.c_str()}}, &e), OTE_ERR_NOT_FOUND);
    });
    // A directory is not a key file, whatever its mode.
    ExpectErrorLogsIn([&] {
        EXPECT_EQ(TryEngine({{"auth_key_file", dir ? dir : "/tmp"}}, &e), OTE_ERR_ACCESS);
    });
    ASSERT_EQ(TryEngine({{"auth_key_file", key_a_.c_str()}}, &e), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
}

// The length limits exactly as ote.h states them: 0, 31 and 4097 bytes are not a key
// (OTE_ERR_INVALID), 32 and 4096 are; a symlink to a good key is followed (Kubernetes
// mounts secrets as symlinks).
TEST_F(AuthTest, KeyLengthLimitsAndSymlinks) {
    ote_engine_t *e = nullptr;
    for (size_t n : {size_t{0}, size_t{31}, size_t{4097}}) {
        std::string k = KeyFile(("key_len_" + std::to_string(n)).c_str(), n, 3, 0600);
        ExpectErrorLogsIn([&] {
            EXPECT_EQ(TryEngine({{"auth_key_file", k.c_str()}}, &e), OTE_ERR_INVALID) << n;
        });
    }
    for (size_t n : {size_t{32}, size_t{4096}}) {
        std::string k = KeyFile(("key_len_" + std::to_string(n)).c_str(), n, 3, 0600);
        ASSERT_EQ(TryEngine({{"auth_key_file", k.c_str()}}, &e), OTE_OK) << n;
        EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
    }
    std::string link = key_a_ + ".link";
    unlink(link.c_str());
    ASSERT_EQ(symlink(key_a_.c_str(), link.c_str()), 0);
    ASSERT_EQ(TryEngine({{"auth_key_file", link.c_str()}}, &e), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
    unlink(link.c_str());
}

// A key file that is a FIFO (or a symlink to one) is refused at once: the open must not
// wait for a writer that never comes. Run in a child with an alarm, so that a hang fails
// this test in 20 s instead of hanging it.
TEST_F(AuthTest, FifoKeyFileIsRefusedWithoutWaiting) {
    const char *dir = getenv("TEST_TMPDIR");
    std::string fifo = std::string(dir ? dir : "/tmp") + "/key_fifo";
    std::string link = fifo + ".link";
    unlink(fifo.c_str());
    unlink(link.c_str());
    ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
    ASSERT_EQ(symlink(fifo.c_str(), link.c_str()), 0);
    for (const std::string &path : {fifo, link}) {
        uint64_t t0 = ote_now_ns();
        pid_t pid = fork();
        ASSERT_GE(pid, 0);
        if (pid == 0) {
            alarm(20);
            ote_engine_t *e = nullptr;
            ote_config_t *cfg = nullptr;
            if (ote_config_create(&cfg) != OTE_OK ||
                ote_config_set(cfg, "auth_key_file", path.c_str()) != OTE_OK)
                _exit(100);
            ote_status_t st = ote_engine_create(cfg, &e);
            _exit(st == OTE_OK ? 101 : ote_status_code(st));
        }
        int ws = 0;
        ASSERT_EQ(waitpid(pid, &ws, 0), pid);
        ASSERT_TRUE(WIFEXITED(ws))
            << path << ": killed by signal " << WTERMSIG(ws) << " (the open waited for a writer)";
        EXPECT_EQ(WEXITSTATUS(ws), OTE_ERR_ACCESS) << path;
        EXPECT_LT(ote_now_ns() - t0, 10000 * kMs) << path;
    }
    unlink(link.c_str());
    unlink(fifo.c_str());
}

TEST_F(AuthTest, WildcardListenNeedsAKeyOrAllowUnauthenticated) {
    ote_engine_t *e = nullptr;
    ExpectErrorLogsIn([&] {
        EXPECT_EQ(TryEngine({{"listen_address", "0.0.0.0:0"}}, &e), OTE_ERR_INVALID);
    });
    EXPECT_TRUE(LogContains("allow_unauthenticated=1"));
    EXPECT_TRUE(LogContains("auth_key_file"));
    // The IPv6 wildcard and a routable address are refused the same way (before any bind).
    for (const char *addr : {"[::]:0", "192.0.2.1:0"}) {
        ExpectErrorLogsIn([&] {
            EXPECT_EQ(TryEngine({{"listen_address", addr}}, &e), OTE_ERR_INVALID) << addr;
        });
        EXPECT_TRUE(LogContains(std::string("listen_address ") + addr + " is not loopback"));
    }
    ASSERT_EQ(TryEngine({{"listen_address", "0.0.0.0:0"}, {"allow_unauthenticated", "1"}}, &e),
              OTE_OK);
    EXPECT_TRUE(LogContains("without a key (allow_unauthenticated=1)"));
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
    ASSERT_EQ(TryEngine({{"listen_address", "0.0.0.0:0"}, {"auth_key_file", key_a_.c_str()}}, &e),
              OTE_OK);
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
    // Loopback without a key works as it always did.
    ASSERT_EQ(TryEngine({{"listen_address", "127.0.0.1:0"}}, &e), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
}

// One transport, as the engines' configuration names it.
struct Transport {
    const char *name;
    ConfigKv kv;
};

class AuthTransportTest : public AuthTest, public ::testing::WithParamInterface<Transport> {
  protected:
    ote_engine_t *Engine(const char *key) {
        ConfigKv kv = GetParam().kv;
        kv.push_back({"connect_timeout_ms", "10000"});
        if (key != nullptr) kv.push_back({"auth_key_file", key});
        return NewEngine(kv);
    }
    // Open a segment from req to src: its status (the segment is closed again).
    static ote_status_t Open(ote_engine_t *req, ote_engine_t *src) {
        ote_segment_t *seg = nullptr;
        ote_status_t st = ote_segment_open(req, ote_test::EngineAddress(src).c_str(), &seg);
        if (st == OTE_OK) {
            EXPECT_EQ(ote_segment_close(seg), OTE_OK);
        }
        return st;
    }
};

TEST_P(AuthTransportTest, RightKeyMovesBytesBothWays) {
    ote_engine_t *src = Engine(key_a_.c_str());
    ote_engine_t *req = Engine(key_a_.c_str());
    ASSERT_NE(src, nullptr);
    ASSERT_NE(req, nullptr);
    std::vector<uint8_t> remote(1 << 16, 0), local(1 << 16), back(1 << 16, 0);
    for (size_t i = 0; i < local.size(); i++) local[i] = static_cast<uint8_t>(i * 13 + 5);
    ASSERT_EQ(
        ote_memory_register(src, remote.data(), remote.size(), OTE_PERM_READ | OTE_PERM_WRITE),
        OTE_OK);
    ASSERT_EQ(ote_memory_register(req, local.data(), local.size(), OTE_PERM_READ), OTE_OK);
    ASSERT_EQ(ote_memory_register(req, back.data(), back.size(), OTE_PERM_WRITE), OTE_OK);
    uint64_t fails = ote_auth_failures();
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_segment_open(req, ote_test::EngineAddress(src).c_str(), &seg), OTE_OK);
    ote_segment_info_t info{};
    ASSERT_EQ(ote_segment_info(seg, &info), OTE_OK);
    EXPECT_STREQ(info.transport, GetParam().name);
    ote_request_t w = {OTE_WRITE, local.data(), seg, reinterpret_cast<uintptr_t>(remote.data()),
                       local.size()};
    ASSERT_EQ(ote_test::RunOne(req, w, 20000 * kMs), OTE_OK);
    EXPECT_EQ(remote, local);
    ote_request_t r = {OTE_READ, back.data(), seg, reinterpret_cast<uintptr_t>(remote.data()),
                       back.size()};
    ASSERT_EQ(ote_test::RunOne(req, r, 20000 * kMs), OTE_OK);
    EXPECT_EQ(back, local);
    std::vector<ote_buffer_info_t> bufs(4);
    size_t n = 0;
    ASSERT_EQ(ote_segment_buffers(seg, bufs.data(), bufs.size(), &n), OTE_OK);
    EXPECT_EQ(n, 1u);
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(ote_auth_failures(), fails);
    EXPECT_EQ(ote_memory_unregister(req, back.data()), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(req, local.data()), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(src, remote.data()), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
}

TEST_P(AuthTransportTest, WrongKeyIsRefusedAndCounted) {
    ote_engine_t *src = Engine(key_a_.c_str());
    ote_engine_t *req = Engine(key_b_.c_str());
    ASSERT_NE(src, nullptr);
    ASSERT_NE(req, nullptr);
    uint64_t fails = ote_auth_failures();
    EXPECT_EQ(Open(req, src), OTE_ERR_AUTH);
    EXPECT_GT(ote_auth_failures(), fails); // the source counted it (and logged, rate-limited)
    EXPECT_TRUE(LogContains("refused this engine's key"));
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
}

TEST_P(AuthTransportTest, KeyOnOneSideOnlyIsRefusedBothWays) {
    ote_engine_t *keyed = Engine(key_a_.c_str());
    ote_engine_t *open = Engine(nullptr);
    ASSERT_NE(keyed, nullptr);
    ASSERT_NE(open, nullptr);
    uint64_t fails = ote_auth_failures();
    EXPECT_EQ(Open(open, keyed), OTE_ERR_AUTH);
    EXPECT_TRUE(LogContains("requires authentication and this engine has no key"));
    // The keyed source counts (and logs) it too, once it has read the refusal.
    EXPECT_TRUE(ote_test::WaitUntil([&] { return ote_auth_failures() > fails; },
                                    std::chrono::seconds(20),
                                    "the keyed source's refusal counted"));
    EXPECT_EQ(Open(keyed, open), OTE_ERR_AUTH);
    EXPECT_TRUE(LogContains("does not authenticate"));
    EXPECT_EQ(ote_engine_destroy(open), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(keyed), OTE_OK);
}

INSTANTIATE_TEST_SUITE_P(
    Transports, AuthTransportTest,
    ::testing::Values(Transport{"tcp", {{"transports", "tcp"}}},
                      Transport{"shm", {{"transports", "shm"}}},
                      Transport{"rdma", {{"transport", "rdma"}, {"verbs_provider", "sim"}}}),
    [](const ::testing::TestParamInfo<Transport> &i) { return std::string(i.param.name); });

// Another process (tests/engine/ote_target) whose key comes from the environment
// (OTE_AUTH_KEY_FILE): the same key moves bytes, another key or none is refused; a
// wildcard listen without a key stops it at engine creation unless
// OTE_ALLOW_UNAUTHENTICATED=1.
TEST_F(AuthTest, TargetProcessTakesItsKeyFromTheEnvironment) {
    for (const char *tps : {"tcp", "shm,tcp"}) {
        ote_test::Target t;
        std::string tenv = std::string("OTE_TRANSPORTS=") + tps;
        ASSERT_TRUE(t.Start(1u << 20, "127.0.0.1:0", {"OTE_AUTH_KEY_FILE=" + key_a_, tenv}));
        ote_engine_t *req = NewEngine({{"transports", tps}, {"auth_key_file", key_a_.c_str()}});
        ASSERT_NE(req, nullptr);
        std::vector<uint8_t> out(8192), back(8192, 0);
        for (size_t i = 0; i < out.size(); i++) out[i] = static_cast<uint8_t>(i * 3 + 1);
        ote_segment_t *seg = nullptr;
        ASSERT_EQ(ote_segment_open(req, t.address.c_str(), &seg), OTE_OK) << tps;
        ote_request_t w = {OTE_WRITE, out.data(), seg, t.rw, out.size()};
        ote_request_t r = {OTE_READ, back.data(), seg, t.rw, back.size()};
        EXPECT_EQ(ote_test::RunOne(req, w, 30000 * kMs), OTE_OK);
        EXPECT_EQ(ote_test::RunOne(req, r, 30000 * kMs), OTE_OK);
        EXPECT_EQ(back, out);
        EXPECT_EQ(ote_segment_close(seg), OTE_OK);
        EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
        for (const char *key : {key_b_.c_str(), static_cast<const char *>(nullptr)}) {
            ConfigKv kv = {{"transports", tps}};
            if (key != nullptr) kv.push_back({"auth_key_file", key});
            ote_engine_t *other = NewEngine(kv);
            ASSERT_NE(other, nullptr);
            EXPECT_EQ(ote_segment_open(other, t.address.c_str(), &seg), OTE_ERR_AUTH) << tps;
            EXPECT_EQ(ote_engine_destroy(other), OTE_OK);
        }
        EXPECT_EQ(t.Quit(), 0);
    }
    {
        ote_test::Target t;
        EXPECT_FALSE(t.Start(1u << 20, "0.0.0.0:0"));
    }
    ote_test::Target t;
    ASSERT_TRUE(t.Start(1u << 20, "0.0.0.0:0", {"OTE_ALLOW_UNAUTHENTICATED=1"}));
    EXPECT_EQ(t.Quit(), 0);
}

// ---- raw connections to a keyed TCP listener ----------------------------------------

// The key bytes of KeyFile(.., 32, seed, ..), loaded as the engine loads them.
ote_auth_key_t *LoadKey(const std::string &path) {
    ote_auth_key_t *k = nullptr;
    EXPECT_EQ(ote_auth_key_load(path.c_str(), &k), OTE_OK);
    return k;
}

ote_ctl_msg_t Hello(uint16_t role) {
    ote_ctl_msg_t h{};
    h.version = OTE_CTL_VERSION_MAX;
    h.opcode = OTE_CTL_HELLO;
    h.req_id = 1;
    h.u.hello.min_version = OTE_CTL_VERSION_MIN;
    h.u.hello.max_version = OTE_CTL_VERSION_MAX;
    h.u.hello.role = role;
    h.u.hello.session = 77;
    h.u.hello.addr = "127.0.0.1:9";
    h.u.hello.addr_len = 11;
    return h;
}

TEST_F(AuthTest, ReplayedHandshakeIsRefused) {
    ote_engine_t *src = NewEngine({{"transports", "tcp"}, {"auth_key_file", key_a_.c_str()}});
    ASSERT_NE(src, nullptr);
    ote_auth_key_t *key = LoadKey(key_a_);
    ASSERT_NE(key, nullptr);
    std::string addr = ote_test::EngineAddress(src);
    // Connection 1: an honest requester; its HELLO and PROOF bytes are recorded.
    int fd = ote_test::ConnectTo(addr);
    ASSERT_GE(fd, 0);
    ote_ctl_msg_t h = Hello(OTE_CTL_ROLE_INFO);
    std::vector<uint8_t> hello_bytes = ote_test::Encode(h);
    ASSERT_TRUE(ote_test::SendAll(fd, hello_bytes));
    std::vector<uint8_t> buf;
    ote_ctl_msg_t m;
    ASSERT_TRUE(ote_test::ReadFrame(fd, &buf, &m));
    ASSERT_EQ(m.opcode, OTE_CTL_AUTH);
    ASSERT_EQ(m.u.auth.step, OTE_CTL_AUTH_CHALLENGE);
    ote_auth_t a;
    ASSERT_EQ(ote_auth_bind_hello(&a, &h), OTE_OK);
    ote_auth_prove(&a, key, m.u.auth.nonce);
    ote_ctl_msg_t p;
    ote_auth_frame(&p, OTE_CTL_AUTH_PROOF, a.nc, a.mac);
    std::vector<uint8_t> proof_bytes = ote_test::Encode(p);
    ASSERT_TRUE(ote_test::SendAll(fd, proof_bytes));
    ASSERT_TRUE(ote_test::ReadFrame(fd, &buf, &m));
    ASSERT_EQ(m.opcode, OTE_CTL_AUTH);
    ASSERT_EQ(m.u.auth.step, OTE_CTL_AUTH_OK);
    EXPECT_EQ(ote_auth_check_ok(&a, key, m.u.auth.mac), OTE_OK);
    ASSERT_TRUE(ote_test::ReadFrame(fd, &buf, &m));
    EXPECT_EQ(m.opcode, OTE_CTL_HELLO_ACK);
    close(fd);
    // Connection 2: the same bytes replayed answer another challenge: refused, closed.
    uint64_t fails = ote_auth_failures();
    fd = ote_test::ConnectTo(addr);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(ote_test::SendAll(fd, hello_bytes));
    ASSERT_TRUE(ote_test::ReadFrame(fd, &buf, &m));
    ASSERT_EQ(m.opcode, OTE_CTL_AUTH);
    ASSERT_TRUE(ote_test::SendAll(fd, proof_bytes));
    ASSERT_TRUE(ote_test::ReadFrame(fd, &buf, &m));
    EXPECT_EQ(m.opcode, OTE_CTL_ERROR);
    EXPECT_EQ(m.status, OTE_ERR_AUTH);
    EXPECT_TRUE(ote_test::ClosedByPeer(fd));
    close(fd);
    EXPECT_EQ(ote_auth_failures(), fails + 1);
    // A reflected source proof (its OK sent back as the PROOF) does not check either.
    fd = ote_test::ConnectTo(addr);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(ote_test::SendAll(fd, hello_bytes));
    ASSERT_TRUE(ote_test::ReadFrame(fd, &buf, &m));
    ASSERT_EQ(m.opcode, OTE_CTL_AUTH);
    ote_auth_t r;
    ASSERT_EQ(ote_auth_bind_hello(&r, &h), OTE_OK);
    ote_auth_prove(&r, key, m.u.auth.nonce);
    ASSERT_EQ(ote_auth_check_proof(&r, key, r.nc, r.mac), OTE_OK); // r.mac: the source's MAC
    ote_auth_frame(&p, OTE_CTL_AUTH_PROOF, r.nc, r.mac);
    ote_test::SendMsg(fd, p);
    ASSERT_TRUE(ote_test::ReadFrame(fd, &buf, &m));
    EXPECT_EQ(m.status, OTE_ERR_AUTH);
    EXPECT_TRUE(ote_test::ClosedByPeer(fd));
    close(fd);
    EXPECT_EQ(ote_auth_failures(), fails + 2);
    ote_auth_key_free(key);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
}

// Requests sent without authenticating, on a HELLO (pipelined after it) or instead of
// one: the connection closes, the registered memory stays as it was, nothing is listed.
TEST_F(AuthTest, RequestsBeforeAuthenticationAreNeverServed) {
    ote_engine_t *src = NewEngine({{"transports", "tcp"}, {"auth_key_file", key_a_.c_str()}});
    ASSERT_NE(src, nullptr);
    std::vector<uint8_t> mem(4096, 0x11);
    ASSERT_EQ(ote_memory_register(src, mem.data(), mem.size(), OTE_PERM_READ | OTE_PERM_WRITE),
              OTE_OK);
    std::string addr = ote_test::EngineAddress(src);
    uint64_t fails = ote_auth_failures();
    std::vector<uint8_t> payload(512, 0xEE);
    for (int with_hello = 0; with_hello < 2; with_hello++) {
        for (uint16_t op : {OTE_CTL_WRITE_REQ, OTE_CTL_BUFS_REQ, OTE_CTL_NOTIFY}) {
            int fd = ote_test::ConnectTo(addr);
            ASSERT_GE(fd, 0);
            std::vector<uint8_t> out;
            if (with_hello) out = ote_test::Encode(Hello(1));
            std::vector<uint8_t> f(OTE_CTL_RW2_FRAME_LEN);
            if (op == OTE_CTL_WRITE_REQ) {
                uint16_t fl = 0;
                ASSERT_EQ(
                    ote_ctl_put_rw2(f.data(), 2, op, 5, reinterpret_cast<uintptr_t>(mem.data()),
                                    512, reinterpret_cast<uintptr_t>(mem.data()), 512, 9, &fl),
                    OTE_OK);
                f.resize(fl);
                f.insert(f.end(), payload.begin(), payload.end());
            } else if (op == OTE_CTL_BUFS_REQ) {
                f.resize(OTE_CTL_HDR_LEN);
                ote_ctl_put_hdr(f.data(), 2, op, 5, OTE_OK, 0);
            } else {
                ote_ctl_msg_t n{};
                n.version = 2;
                n.opcode = OTE_CTL_NOTIFY;
                n.u.notify.msg = payload.data();
                n.u.notify.len = 16;
                f = ote_test::Encode(n);
            }
            out.insert(out.end(), f.begin(), f.end());
            ASSERT_TRUE(ote_test::SendAll(fd, out));
            // Whatever comes back is a CHALLENGE at most; then the connection closes.
            std::vector<uint8_t> buf;
            ote_ctl_msg_t m;
            while (ote_test::ReadFrame(fd, &buf, &m)) {
                EXPECT_EQ(m.opcode, OTE_CTL_AUTH) << with_hello << " " << op;
                EXPECT_EQ(m.u.auth.step, OTE_CTL_AUTH_CHALLENGE);
            }
            EXPECT_TRUE(ote_test::ClosedByPeer(fd));
            close(fd);
        }
    }
    EXPECT_EQ(std::vector<uint8_t>(mem.size(), 0x11), mem);
    EXPECT_GE(ote_auth_failures(), fails + 3); // the ones that sent a HELLO first
    char note[64];
    size_t nl = 0;
    EXPECT_EQ(ote_notify_recv(src, note, sizeof(note), &nl, nullptr, 0, 0), OTE_ERR_TIMEOUT);
    EXPECT_EQ(ote_memory_unregister(src, mem.data()), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
}

// A requester whose versions stop before authentication gets a clear refusal.
TEST_F(AuthTest, OldVersionRequesterIsToldAuthenticationIsRequired) {
    ote_engine_t *src = NewEngine({{"transports", "tcp"}, {"auth_key_file", key_a_.c_str()}});
    ASSERT_NE(src, nullptr);
    int fd = ote_test::ConnectTo(ote_test::EngineAddress(src));
    ASSERT_GE(fd, 0);
    ote_ctl_msg_t h = Hello(1);
    h.version = 2;
    h.u.hello.max_version = 2;
    ote_test::SendMsg(fd, h);
    std::vector<uint8_t> buf;
    ote_ctl_msg_t m;
    ASSERT_TRUE(ote_test::ReadFrame(fd, &buf, &m));
    EXPECT_EQ(m.opcode, OTE_CTL_ERROR);
    EXPECT_EQ(m.status, OTE_ERR_AUTH);
    uint16_t v = 0;
    EXPECT_EQ(ote_ctl_check_hello_ack(&m, 1, 2, &v), OTE_ERR_AUTH);
    EXPECT_TRUE(ote_test::ClosedByPeer(fd));
    close(fd);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
}

} // namespace

// tests/engine/shm_raw_fixture.h - a raw local process against an engine's shm socket:
// the helpers and the fixture that speak the same-host transport's wire messages
// (tests/engine/shm_wire.h) directly, shared by shm_hostile_test (malformed and hostile
// protocol) and shm_marks_test (staging marks). Each case gets a fresh target engine
// with a registered 1 MiB buffer; TearDown closes the raw connections, checks that the
// target still serves a normal transfer over shm, that the buffer unregisters (no pin
// outlived the raw connection) and, through OteTest, that no fd leaked.
#ifndef OTE_TESTS_ENGINE_SHM_RAW_FIXTURE_H
#define OTE_TESTS_ENGINE_SHM_RAW_FIXTURE_H

#include <gtest/gtest.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "tests/engine/ctl_peer.h"
#include "tests/engine/engine_util.h"
#include "tests/util/test_base.h"
#include "tests/util/wait.h"

extern "C" {
#include "base/time.h"
#include "engine/control/ctl.h"
#include "ote/ote.h"
#include "tests/engine/shm_wire.h"
}

namespace ote_shm_raw {

using ote_test::kMs;
using ote_test::kSec;

constexpr size_t kBufLen = 1u << 20;
constexpr int kWaitMs = 20000; // generous: a loaded 2-core machine under ASan

// The engine's advertised shm socket name, asked the way any local process can: a HELLO
// of role INFO on its TCP listener.
inline std::string ShmSocketOf(ote_engine_t *e) {
    int fd = ote_test::ConnectTo(ote_test::EngineAddress(e));
    EXPECT_GE(fd, 0);
    if (fd < 0) return "";
    ote_ctl_msg_t m;
    memset(&m, 0, sizeof(m));
    m.version = OTE_CTL_VERSION_MAX;
    m.opcode = OTE_CTL_HELLO;
    m.u.hello.min_version = OTE_CTL_VERSION_MIN;
    m.u.hello.max_version = OTE_CTL_VERSION_MAX;
    m.u.hello.role = OTE_CTL_ROLE_INFO;
    m.u.hello.addr = "127.0.0.1:1";
    m.u.hello.addr_len = 11;
    std::vector<uint8_t> frame;
    ote_ctl_msg_t ack;
    EXPECT_TRUE(ote_test::SendAll(fd, ote_test::Encode(m)));
    EXPECT_TRUE(ote_test::ReadFrame(fd, &frame, &ack));
    close(fd);
    if (ack.opcode != OTE_CTL_HELLO_ACK) return "";
    std::string info(ack.u.hello_ack.info, ack.u.hello_ack.info_len);
    char sock[128] = {0};
    EXPECT_EQ(ote_ctl_info_get(info.c_str(), "shm", sock, sizeof(sock)), OTE_OK) << info;
    return sock;
}

// A memfd of len bytes (sealed against shrinking when seal), or -1.
inline int MakeRing(size_t len, bool seal) {
    int fd = memfd_create("hostile-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return -1;
    if (ftruncate(fd, static_cast<off_t>(len)) != 0 ||
        (seal && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0)) {
        close(fd);
        return -1;
    }
    return fd;
}

// Send one message with fds (SCM_RIGHTS) attached.
inline bool SendWithFds(int sock, const void *buf, size_t len, const std::vector<int> &fds) {
    iovec iov = {const_cast<void *>(buf), len};
    msghdr m = {};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    std::vector<char> cb(CMSG_SPACE(sizeof(int) * (fds.empty() ? 1 : fds.size())), 0);
    if (!fds.empty()) {
        m.msg_control = cb.data();
        m.msg_controllen = cb.size();
        cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
        memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    return sendmsg(sock, &m, MSG_NOSIGNAL) == static_cast<ssize_t>(len);
}

// One message within timeout_ms: its length, 0 on EOF, -1 on the deadline or an error.
inline ssize_t RecvMsg(int fd, void *buf, size_t cap, int timeout_ms = kWaitMs) {
    pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) return -1;
    ssize_t n = recv(fd, buf, cap, 0);
    return n < 0 && errno == ECONNRESET ? 0 : n;
}

inline tw_hello_t Hello(uint64_t ring_len, uint64_t probe_addr = 0, uint64_t probe_val = 0) {
    tw_hello_t h;
    memset(&h, 0, sizeof(h));
    h.h = {TW_MAGIC, TW_VERSION, TW_HELLO, 0, 0};
    h.probe_addr = probe_addr;
    h.probe_val = probe_val;
    h.ring_len = ring_len;
    snprintf(h.addr, sizeof(h.addr), "hostile:1");
    return h;
}

inline tw_req_t Req(uint16_t op, uint64_t remote, uint64_t local, uint32_t len, uint64_t uid = 0,
                    uint64_t req_remote = 0, uint64_t req_len = 0) {
    static uint64_t next_id = 1;
    tw_req_t q;
    memset(&q, 0, sizeof(q));
    q.id = next_id++;
    q.remote = remote;
    q.local = local;
    q.len = len;
    q.op = op;
    q.req_uid = uid;
    q.req_remote = req_remote;
    q.req_len = req_len;
    return q;
}

class ShmHostileTest : public ote_test::OteTest {
  protected:
    void SetUp() override {
        OteTest::SetUp();
        target_ = ote_test::NewEngine({{"transports", "shm,tcp"},
                                       {"connect_timeout_ms", "1000"},
                                       {"transfer_timeout_ms", transfer_timeout_ms_}});
        ASSERT_NE(target_, nullptr);
        buf_.assign(kBufLen, 0);
        for (size_t i = 0; i < kBufLen; i++) buf_[i] = static_cast<uint8_t>(i * 7 + 1);
        ASSERT_EQ(
            ote_memory_register(target_, buf_.data(), kBufLen, OTE_PERM_READ | OTE_PERM_WRITE),
            OTE_OK);
        sock_ = ShmSocketOf(target_);
        ASSERT_FALSE(sock_.empty());
    }

    void TearDown() override {
        CloseRaw();
        if (target_ != nullptr) {
            if (!::testing::Test::HasFatalFailure()) ServesANormalTransfer();
            // The hostile connection is closed: every pin it held goes with it.
            EXPECT_EQ(ote_test::UnregisterWhenFree(target_, buf_.data(),
                                                   std::chrono::milliseconds(kWaitMs)),
                      OTE_OK)
                << "a pin outlived the hostile connection";
            EXPECT_EQ(ote_engine_destroy(target_), OTE_OK);
        }
        OteTest::TearDown();
    }

    // A second engine of this process opens the target over shm and round-trips bytes.
    void ServesANormalTransfer() {
        ote_engine_t *req = ote_test::NewEngine({{"transports", "shm,tcp"}});
        ASSERT_NE(req, nullptr);
        ote_segment_t *seg = nullptr;
        ASSERT_EQ(ote_segment_open(req, ote_test::EngineAddress(target_).c_str(), &seg), OTE_OK);
        ote_segment_info_t info;
        EXPECT_EQ(ote_segment_info(seg, &info), OTE_OK);
        EXPECT_STREQ(info.transport, "shm");
        std::vector<uint8_t> out(8192), back(8192, 0);
        for (size_t i = 0; i < out.size(); i++) out[i] = static_cast<uint8_t>(i ^ 0xa5);
        uint64_t remote = reinterpret_cast<uintptr_t>(buf_.data()) + 4096;
        ote_request_t w = {OTE_WRITE, out.data(), seg, remote, out.size()};
        ote_request_t r = {OTE_READ, back.data(), seg, remote, back.size()};
        EXPECT_EQ(ote_test::RunOne(req, w, 30 * kSec), OTE_OK);
        EXPECT_EQ(ote_test::RunOne(req, r, 30 * kSec), OTE_OK);
        EXPECT_EQ(back, out);
        EXPECT_EQ(memcmp(buf_.data() + 4096, out.data(), out.size()), 0);
        EXPECT_EQ(ote_segment_close(seg), OTE_OK);
        EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    }

    // A raw SOCK_SEQPACKET connection to the target's shm socket.
    int Connect(std::string sock = "") {
        if (sock.empty()) sock = sock_;
        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        EXPECT_GE(fd, 0);
        sockaddr_un sun;
        memset(&sun, 0, sizeof(sun));
        sun.sun_family = AF_UNIX;
        memcpy(sun.sun_path + 1, sock.data(), sock.size());
        socklen_t sl = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + sock.size());
        EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr *>(&sun), sl), 0) << strerror(errno);
        raw_.push_back(fd);
        return fd;
    }

    void CloseRaw() {
        for (int fd : raw_) close(fd);
        raw_.clear();
        if (ring_ != nullptr) munmap(ring_, ring_map_);
        ring_ = nullptr;
        if (ring_fd_ >= 0) close(ring_fd_);
        ring_fd_ = -1;
    }

    // Send a HELLO (with fds) and read the answer: true with *ack when one came.
    bool Handshake(int fd, const void *hello, size_t len, const std::vector<int> &fds,
                   tw_hello_ack_t *ack) {
        EXPECT_TRUE(SendWithFds(fd, hello, len, fds));
        return RecvMsg(fd, ack, sizeof(*ack)) == static_cast<ssize_t>(sizeof(*ack));
    }

    // Expect the HELLO to be answered with status st, then the connection closed.
    void ExpectRefused(const tw_hello_t &h, const std::vector<int> &fds, ote_status_t st) {
        int fd = Connect();
        tw_hello_ack_t a;
        ASSERT_TRUE(Handshake(fd, &h, sizeof(h), fds, &a));
        EXPECT_EQ(a.h.magic, TW_MAGIC);
        EXPECT_EQ(a.h.kind, TW_HELLO_ACK);
        EXPECT_EQ(a.status, st) << a.text;
        EXPECT_TRUE(ote_test::ClosedByPeer(fd));
    }

    // A served connection in ring mode (probe_addr 0, a sealed memfd ring mapped here),
    // to the target's socket or to sock. With marks, the HELLO asks for staging marks and
    // (with ctl_page) the memfd holds the control page: mark() is then the staging mark
    // the source waits for; without the page the source must answer without marks.
    int GoodRing(bool marks = false, bool ctl_page = true, const std::string &sock = "") {
        int fd = Connect(sock);
        ring_map_ = TW_RING_BYTES + (marks && ctl_page ? TW_RING_CTL : 0);
        ring_fd_ = MakeRing(ring_map_, true);
        EXPECT_GE(ring_fd_, 0);
        void *m = mmap(nullptr, ring_map_, PROT_READ | PROT_WRITE, MAP_SHARED, ring_fd_, 0);
        EXPECT_NE(m, MAP_FAILED);
        ring_ = static_cast<uint8_t *>(m);
        tw_hello_t h = Hello(TW_RING_BYTES);
        if (marks) h.h.pad |= TW_CAP_MARKS;
        tw_hello_ack_t a;
        EXPECT_TRUE(Handshake(fd, &h, sizeof(h), {ring_fd_}, &a));
        EXPECT_EQ(a.status, OTE_OK) << a.text;
        EXPECT_EQ(a.mode, static_cast<uint32_t>(TW_MODE_RING));
        EXPECT_EQ((a.flags & TW_ACK_MARKS) != 0, marks && ctl_page);
        return fd;
    }

    // The staging mark in the ring's control page (GoodRing(true)), through the source's
    // own mapping of the memfd when it has one. The memfd is mapped twice in this process
    // (ring_ here, and by the target's source). ThreadSanitizer keeps its order per
    // address: a mark stored through ring_ does not show it the release that the source's
    // acquire of its own mapping pairs with, and it reported buf_ read here before a mark
    // and written by the source after it. Stored where the source loads it, the
    // release/acquire pair has one address; the memory is the same either way.
    std::atomic<uint64_t> *mark() {
        uint8_t *base = SourceMapping();
        return reinterpret_cast<std::atomic<uint64_t> *>((base ? base : ring_) + TW_RING_BYTES);
    }

    // The other mapping of ring_fd_'s memfd at offset 0 in this process (the source's),
    // from /proc/self/maps; nullptr when there is none.
    uint8_t *SourceMapping() const {
        struct stat st;
        if (ring_fd_ < 0 || fstat(ring_fd_, &st) != 0) return nullptr;
        std::ifstream maps("/proc/self/maps");
        std::string line;
        while (std::getline(maps, line)) {
            unsigned long lo = 0, hi = 0, off = 0, ino = 0;
            char perms[8];
            if (sscanf(line.c_str(), "%lx-%lx %7s %lx %*s %lu", &lo, &hi, perms, &off, &ino) != 5)
                continue;
            if (ino == st.st_ino && off == 0 && reinterpret_cast<uint8_t *>(lo) != ring_ &&
                hi - lo >= ring_map_)
                return reinterpret_cast<uint8_t *>(lo);
        }
        return nullptr;
    }

    // Send one REQS message of reqs (header n = n_hdr unless negative) and return the
    // statuses of its RESPS by request id order; empty when the connection closed.
    std::vector<int32_t> Exchange(int fd, const std::vector<tw_req_t> &reqs, long n_hdr = -1) {
        SendReqs(fd, reqs, n_hdr);
        return Responses(fd, reqs);
    }

    // Send one REQS message of reqs (header n = n_hdr unless negative).
    void SendReqs(int fd, const std::vector<tw_req_t> &reqs, long n_hdr = -1) {
        std::vector<uint8_t> msg(sizeof(tw_hdr_t) + reqs.size() * sizeof(tw_req_t));
        tw_hdr_t h = {TW_MAGIC, TW_VERSION, TW_REQS,
                      static_cast<uint32_t>(n_hdr < 0 ? static_cast<long>(reqs.size()) : n_hdr), 0};
        memcpy(msg.data(), &h, sizeof(h));
        if (!reqs.empty())
            memcpy(msg.data() + sizeof(h), reqs.data(), reqs.size() * sizeof(tw_req_t));
        EXPECT_EQ(send(fd, msg.data(), msg.size(), MSG_NOSIGNAL), static_cast<ssize_t>(msg.size()));
    }

    // The statuses of the RESPS answering reqs (sent by SendReqs), within timeout_ms;
    // empty when the connection closed or nothing came.
    std::vector<int32_t> Responses(int fd, const std::vector<tw_req_t> &reqs,
                                   int timeout_ms = kWaitMs) {
        std::vector<uint8_t> in(sizeof(tw_hdr_t) + TW_BATCH_MAX * sizeof(tw_resp_t) + 64);
        ssize_t got = RecvMsg(fd, in.data(), in.size(), timeout_ms);
        if (got <= 0) return {};
        tw_hdr_t rh;
        memcpy(&rh, in.data(), sizeof(rh));
        EXPECT_EQ(rh.magic, TW_MAGIC);
        EXPECT_EQ(rh.kind, TW_RESPS);
        EXPECT_EQ(static_cast<size_t>(got), sizeof(rh) + rh.n * sizeof(tw_resp_t));
        std::vector<int32_t> st;
        size_t k = 0;
        for (uint32_t i = 0; i < rh.n; i++) {
            tw_resp_t r;
            memcpy(&r, in.data() + sizeof(rh) + i * sizeof(r), sizeof(r));
            while (k < reqs.size() && (reqs[k].op == TW_OP_WRITE_OFF ||
                                       reqs[k].op == TW_OP_CANCEL || reqs[k].op == TW_OP_UNMAP))
                k++;
            EXPECT_LT(k, reqs.size());
            if (k < reqs.size()) {
                EXPECT_EQ(r.id, reqs[k].id);
            }
            k++;
            st.push_back(r.status);
        }
        return st;
    }

    // One request's status (a closed connection fails the test).
    int32_t One(int fd, const tw_req_t &q) {
        std::vector<int32_t> st = Exchange(fd, {q});
        EXPECT_EQ(st.size(), 1u);
        return st.empty() ? 0x7fffffff : st[0];
    }

    // The registration is pinned: unregister answers BUSY (it is re-registered otherwise).
    bool Pinned() {
        ote_status_t st = ote_memory_unregister(target_, buf_.data());
        if (st == OTE_OK) {
            EXPECT_EQ(
                ote_memory_register(target_, buf_.data(), kBufLen, OTE_PERM_READ | OTE_PERM_WRITE),
                OTE_OK);
            return false;
        }
        EXPECT_EQ(st, OTE_ERR_BUSY);
        return true;
    }

    // The message closes the connection without an answer.
    void ExpectClosedBy(int fd, const void *msg, size_t len) {
        EXPECT_EQ(send(fd, msg, len, MSG_NOSIGNAL), static_cast<ssize_t>(len));
        EXPECT_TRUE(ote_test::ClosedByPeer(fd));
    }

    uint64_t Buf(size_t off = 0) const { return reinterpret_cast<uintptr_t>(buf_.data()) + off; }
    bool BufIntact() const {
        for (size_t i = 0; i < kBufLen; i++)
            if (buf_[i] != static_cast<uint8_t>(i * 7 + 1)) return false;
        return true;
    }

    const char *transfer_timeout_ms_ = "5000"; // the target's
    ote_engine_t *target_ = nullptr;
    std::vector<uint8_t> buf_;
    std::string sock_;
    std::vector<int> raw_;
    int ring_fd_ = -1;
    uint8_t *ring_ = nullptr;
    size_t ring_map_ = TW_RING_BYTES;
};

} // namespace ote_shm_raw

#endif

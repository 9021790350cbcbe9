// Security properties of the software RC provider ("sim"), found by a review and kept here
// as regressions. A raw client speaks the sim's wire format over the abstract UNIX socket
// of a GID (as another process could), so the tests can behave as a hostile or stalled
// requester, or as a lying responder:
//  - a connection binds only to a connected QP, and only from that QP's RTR destination
//    (source QPN and GID, the GID held by the connecting process), once;
//  - SEND_WITH_INV cannot invalidate a type-2 window bound to another QP;
//  - a READ response is sent before a later request on its connection executes, and no
//    byte of it is read once its window/MR is revoked;
//  - an inbound payload stops landing once the QP leaves RTS or its window/MR is revoked;
//  - an ACK cannot complete an RDMA READ.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <linux/sockios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tests/util/wait.h"
#include "tests/verbs/verbs_fixture.h"

extern "C" {
#include "base/time.h"
#include "verbs/sim/sim.h"
#include "verbs/verbs.h"
}

namespace {

constexpr uint64_t kWaitNs = ote_test::kVerbsWaitNs;
// How long a poll for an fd that must become readable may wait (reached only on failure).
constexpr int kPollMs = 10000;

// The sim's wire header (verbs/sim/sim_internal.h, sim_hdr_t), mirrored: the tests speak
// the protocol from outside, as a process that is not a sim would.
struct WireHdr {
    uint8_t type;
    uint8_t op;
    uint8_t flags;
    uint8_t syndrome;
    uint32_t psn;
    uint32_t imm; // REQ READ: length; SEND_WITH_INV: rkey; HELLO: source QPN
    uint32_t rkey;
    uint32_t npsn;
    uint32_t pad;
    uint64_t raddr; // HELLO: destination QPN
    uint64_t len;   // payload bytes that follow
};
static_assert(sizeof(WireHdr) == 40, "wire header layout");
enum : uint8_t { kHello = 1, kReq = 2, kAck = 3, kNak = 4, kRresp = 5 };
enum : uint8_t { kNakAccess = 2 };

// The abstract socket name of a GID's listener ("\0orbitte-sim/<32 hex digits>").
socklen_t GidAddr(const union ibv_gid &g, struct sockaddr_un *sun) {
    memset(sun, 0, sizeof(*sun));
    sun->sun_family = AF_UNIX;
    static const char hex[] = "0123456789abcdef";
    std::string name = "orbitte-sim/";
    for (uint8_t b : g.raw) {
        name += hex[b >> 4];
        name += hex[b & 15];
    }
    memcpy(sun->sun_path + 1, name.data(), name.size());
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + name.size());
}

// A byte stream with deadlines: a raw requester (connected to a GID) or a raw responder
// (accepted from a fake GID's listener).
class Raw {
  public:
    explicit Raw(int fd) : fd_(fd) {}
    ~Raw() {
        if (fd_ >= 0) close(fd_);
    }
    static std::unique_ptr<Raw> Connect(const union ibv_gid &g) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) return nullptr;
        struct sockaddr_un sun;
        socklen_t l = GidAddr(g, &sun);
        if (connect(fd, (struct sockaddr *)&sun, l) != 0) {
            close(fd);
            return nullptr;
        }
        return std::make_unique<Raw>(fd);
    }
    int fd() const { return fd_; }

    bool Send(const void *buf, size_t n, uint64_t wait_ns = kWaitNs) {
        const char *p = static_cast<const char *>(buf);
        ote_deadline_t dl = ote_deadline_after(wait_ns);
        while (n > 0) {
            ssize_t w = send(fd_, p, n, MSG_NOSIGNAL);
            if (w > 0) {
                p += w;
                n -= (size_t)w;
                continue;
            }
            if (w < 0 && errno != EAGAIN && errno != EINTR) {
                if (errno == EPIPE || errno == ECONNRESET) eof_ = true; // the peer ended it
                return false;
            }
            if (ote_deadline_expired(dl)) return false;
            struct pollfd pf = {fd_, POLLOUT, 0};
            poll(&pf, 1, 10);
        }
        return true;
    }
    // Header and payload in one send: the sim may end the stream once it has read a
    // message, so a message is never split across two sends that could race that.
    bool SendHdr(const WireHdr &h, const void *payload = nullptr, size_t n = 0) {
        std::vector<uint8_t> msg(sizeof(h) + n);
        memcpy(msg.data(), &h, sizeof(h));
        if (n > 0) memcpy(msg.data() + sizeof(h), payload, n);
        return Send(msg.data(), msg.size());
    }
    bool Hello(uint32_t src_qpn, uint32_t dst_qpn, const union ibv_gid &src_gid) {
        WireHdr h{};
        h.type = kHello;
        h.imm = src_qpn;
        h.raddr = dst_qpn;
        h.len = 16;
        return SendHdr(h, src_gid.raw, 16);
    }
    // Read exactly n bytes; false on EOF (eof() then true) or at the deadline.
    bool Recv(void *buf, size_t n, uint64_t wait_ns = kWaitNs) {
        char *p = static_cast<char *>(buf);
        ote_deadline_t dl = ote_deadline_after(wait_ns);
        while (n > 0) {
            ssize_t r = recv(fd_, p, n, 0);
            if (r > 0) {
                p += r;
                n -= (size_t)r;
                continue;
            }
            if (r == 0) {
                eof_ = true;
                return false;
            }
            if (errno != EAGAIN && errno != EINTR) {
                eof_ = true; // reset by the peer: the stream ended
                return false;
            }
            if (ote_deadline_expired(dl)) return false;
            struct pollfd pf = {fd_, POLLIN, 0};
            poll(&pf, 1, 10);
        }
        return true;
    }
    // True when the peer ends the stream before the deadline (data before it is dropped).
    // Silent: the callers say what a missing end means.
    bool WaitEof(uint64_t wait_ns = kWaitNs) {
        char buf[4096];
        return ote_test::PollUntil([&] { return !Recv(buf, 1, 20 * OTE_NSEC_PER_MSEC) && eof_; },
                                   std::chrono::nanoseconds(wait_ns));
    }
    // Wait until the peer has read everything sent so far (nothing left in our queue).
    // Silent: one caller only gives the peer a second to read.
    bool WaitConsumed(uint64_t wait_ns = kWaitNs) {
        return ote_test::PollUntil(
            [&] {
                int q = -1;
                return ioctl(fd_, SIOCOUTQ, &q) == 0 && q == 0;
            },
            std::chrono::nanoseconds(wait_ns));
    }
    bool eof() const { return eof_; }

  private:
    int fd_;
    bool eof_ = false;
};

using Buf = ote_test::VerbsBuf;

class SimSecurity : public ote_test::VerbsFixture {
  protected:
    void SetUp() override {
        VerbsFixture::SetUp();
        ASSERT_NO_FATAL_FAILURE(OpenVerbs("sim"));
        scq_ = Cq();
        rcq_ = Cq();
        ASSERT_TRUE(scq_ && rcq_);
        mtu_ = 128u << port_.active_mtu; // IBV_MTU_256 = 1 ... IBV_MTU_4096 = 5
    }

    using VerbsFixture::Qp;
    struct ibv_qp *Qp() {
        return Qp(scq_, rcq_, 16, 16);
    }
    Buf *NewMem(size_t n, int access, uint8_t fill) { return VerbsFixture::Mem(n, access, fill); }

    // Bind mw on qp over [off, off+len) of m; returns the new rkey (0 on failure).
    uint32_t Bind(struct ibv_qp *qp, struct ibv_mw *mw, const Buf *m, uint64_t off, uint64_t len,
                  unsigned acc) {
        uint32_t rkey = ibv_inc_rkey(mw->rkey);
        if (BindMw(qp, mw, rkey, m, off, len, acc, 900) != 0) return 0;
        auto wc = Poll(scq_, 1);
        if (wc.size() != 1 || wc[0].status != IBV_WC_SUCCESS) return 0;
        return rkey;
    }
    bool LocalInv(struct ibv_qp *qp, uint32_t rkey) {
        if (PostLocalInv(qp, rkey, 901) != 0) return false;
        auto wc = Poll(scq_, 1);
        return wc.size() == 1 && wc[0].status == IBV_WC_SUCCESS && wc[0].opcode == IBV_WC_LOCAL_INV;
    }

    uint32_t Packets(uint64_t len) const { return len ? (uint32_t)((len + mtu_ - 1) / mtu_) : 1; }

    WireHdr Req(enum ibv_wr_opcode op, uint32_t psn, uint64_t len, uint64_t raddr = 0,
                uint32_t rkey = 0, uint32_t imm = 0) const {
        WireHdr h{};
        h.type = kReq;
        h.op = (uint8_t)op;
        h.psn = psn;
        h.npsn = Packets(len);
        h.raddr = raddr;
        h.rkey = rkey;
        h.imm = imm;
        if (op == IBV_WR_RDMA_READ) h.imm = (uint32_t)len; // a READ carries its length here
        else h.len = len;
        return h;
    }

    // A victim QP "b" connected to a peer that does not exist as a QP here: the raw client
    // speaks for it (source QPN kPeerQpn, source GID = this process's own GID).
    static constexpr uint32_t kPeerQpn = 0x0abcde;
    struct ibv_qp *Victim() {
        struct ibv_qp *b = Qp();
        if (!b) return nullptr;
        Connect(b, kPeerQpn, gid_);
        return b;
    }

    uint32_t mtu_ = 1024;
    struct ibv_cq *scq_ = nullptr, *rcq_ = nullptr;
};

constexpr int kRw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
constexpr int kRwBind = kRw | IBV_ACCESS_MW_BIND;
constexpr uint64_t kIova =
    0x7e5a00000000ull; // where dma-buf MRs are addressed (nothing of the host there)

// ------------------------------------------------------------------ 10: HELLO identity

TEST_F(SimSecurity, HelloFromTheRtrDestinationBindsOnce) {
    struct ibv_qp *b = Victim();
    ASSERT_TRUE(b);
    Buf *t = NewMem(4096, kRw, 0);
    std::vector<uint8_t> data(64, 0xee);
    auto c = Raw::Connect(gid_);
    ASSERT_TRUE(c);
    ASSERT_TRUE(c->Hello(kPeerQpn, b->qp_num, gid_));
    ASSERT_TRUE(c->SendHdr(Req(IBV_WR_RDMA_WRITE, 0, 64, t->addr(), t->mr->rkey), data.data(), 64));
    WireHdr r{};
    ASSERT_TRUE(c->Recv(&r, sizeof(r))) << "the RTR destination is served";
    EXPECT_EQ(r.type, kAck);
    EXPECT_EQ(r.psn, 0u);
    EXPECT_EQ(t->mem[63], 0xee);
    // a second HELLO on the bound connection (to re-bind it elsewhere) ends it; the sim
    // may close as soon as it has read the header, so sending the HELLO's payload can
    // already fail: only the end of the stream is the outcome under test
    (void)c->Hello(kPeerQpn, b->qp_num, gid_);
    EXPECT_TRUE(c->WaitEof());
    EXPECT_EQ(State(b), IBV_QPS_RTS);
}

TEST_F(SimSecurity, HelloNotFromTheRtrDestinationIsRefused) {
    struct ibv_qp *b = Victim();
    struct ibv_qp *idle = Qp(); // exists, but never connected (INIT)
    ASSERT_TRUE(b && idle);
    ASSERT_EQ(ToInit(idle), 0);
    Buf *t = NewMem(4096, kRw, 0);
    std::vector<uint8_t> data(64, 0xee);
    union ibv_gid other = gid_;
    other.raw[15] ^= 0x5a;
    struct Case {
        const char *what;
        uint32_t src, dst;
        union ibv_gid gid;
    } cases[] = {
        {"wrong source QPN", kPeerQpn + 1, b->qp_num, gid_},
        {"wrong source GID", kPeerQpn, b->qp_num, other},
        {"QP not connected", kPeerQpn, idle->qp_num, gid_},
        {"no such QP", kPeerQpn, 0xfffff0, gid_},
    };
    for (const Case &k : cases) {
        auto c = Raw::Connect(gid_);
        ASSERT_TRUE(c) << k.what;
        ASSERT_TRUE(c->Hello(k.src, k.dst, k.gid)) << k.what;
        (void)c->SendHdr(Req(IBV_WR_RDMA_WRITE, 0, 64, t->addr(), t->mr->rkey), data.data(), 64);
        EXPECT_TRUE(c->WaitEof()) << k.what << ": the connection must be refused";
    }
    EXPECT_EQ(t->mem[0], 0) << "nothing landed";
    EXPECT_EQ(State(b), IBV_QPS_RTS);
}

// A third QP of the same instance aims at the victim: its HELLO names itself, which is
// not the victim's destination, so its WRITE never lands (and the legitimate peer still works).
TEST_F(SimSecurity, HostileThirdQpCannotReachAConnectedQp) {
    struct ibv_qp *a = Qp(), *b = Qp(), *x = Qp();
    ASSERT_TRUE(a && b && x);
    Connect(a, b->qp_num, gid_);
    Connect(b, a->qp_num, gid_);
    Connect(x, b->qp_num, gid_, 8); // ~1 ms ACK timeout: the refusal ends it quickly
    Buf *t = NewMem(4096, kRw, 0);
    Buf *s = NewMem(64, kRw, 0x77);
    ASSERT_EQ(PostSend(x, IBV_WR_RDMA_WRITE, s, 0, 64, 1, t->addr(), t->mr->rkey), 0);
    auto wc = Poll(scq_, 1);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].qp_num, x->qp_num);
    EXPECT_EQ(wc[0].status, IBV_WC_RETRY_EXC_ERR);
    EXPECT_EQ(t->mem[0], 0);
    EXPECT_EQ(State(b), IBV_QPS_RTS);
    ASSERT_EQ(PostSend(a, IBV_WR_RDMA_WRITE, s, 0, 64, 2, t->addr(), t->mr->rkey), 0);
    wc = Poll(scq_, 1);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(t->mem[0], 0x77);
}

// Another process that claims the right source QPN and GID is still refused: the GID is
// not its own (its listener belongs to this process).
TEST_F(SimSecurity, ForgedIdentityFromAnotherProcessIsRefused) {
    struct ibv_qp *b = Victim();
    ASSERT_TRUE(b);
    Buf *t = NewMem(4096, kRw, 0);
    // everything the child sends is prepared before fork (the child only makes syscalls)
    struct {
        WireHdr hello;
        uint8_t gid[16];
        WireHdr write;
        uint8_t data[64];
    } __attribute__((packed)) msg;
    memset(&msg, 0, sizeof(msg));
    msg.hello.type = kHello;
    msg.hello.imm = kPeerQpn;
    msg.hello.raddr = b->qp_num;
    msg.hello.len = 16;
    memcpy(msg.gid, gid_.raw, 16);
    msg.write = Req(IBV_WR_RDMA_WRITE, 0, 64, t->addr(), t->mr->rkey);
    memset(msg.data, 0xee, sizeof(msg.data));
    struct sockaddr_un sun;
    socklen_t sl = GidAddr(gid_, &sun);
    int pfd[2];
    ASSERT_EQ(pipe2(pfd, O_CLOEXEC), 0);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        char verdict = 'X';
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&sun, sl) == 0 &&
            send(fd, &msg, sizeof(msg), MSG_NOSIGNAL) == (ssize_t)sizeof(msg)) {
            struct pollfd pf = {fd, POLLIN, 0};
            verdict = 'T'; // neither answer nor end within 20 s
            if (poll(&pf, 1, 20000) == 1) {
                char b1;
                ssize_t r = recv(fd, &b1, 1, 0);
                verdict = r <= 0 ? 'E' : 'A'; // ended / answered
            }
        }
        ssize_t w = write(pfd[1], &verdict, 1);
        (void)w;
        _exit(0);
    }
    close(pfd[1]);
    char verdict = 0;
    struct pollfd pf = {pfd[0], POLLIN, 0};
    ASSERT_EQ(poll(&pf, 1, 40000), 1);
    ASSERT_EQ(read(pfd[0], &verdict, 1), 1);
    close(pfd[0]);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_EQ(verdict, 'E') << "A = the forged requester was answered, T = no answer";
    EXPECT_EQ(t->mem[0], 0) << "nothing landed";
}

// ------------------------------------------------------------------ 11: SEND_WITH_INV

TEST_F(SimSecurity, SendWithInvCannotInvalidateAWindowBoundToAnotherQp) {
    struct ibv_qp *a = Qp(), *b = Qp(), *c = Qp(), *d = Qp();
    ASSERT_TRUE(a && b && c && d);
    Connect(a, b->qp_num, gid_);
    Connect(b, a->qp_num, gid_);
    Connect(c, d->qp_num, gid_);
    Connect(d, c->qp_num, gid_);
    Buf *t = NewMem(4096, kRwBind, 0);
    Buf *s = NewMem(64, kRw, 0x33);
    Buf *r = NewMem(64, kRw, 0);
    struct ibv_mw *mw = Mw();
    ASSERT_TRUE(mw);
    uint32_t rkey = Bind(b, mw, t, 0, 4096, IBV_ACCESS_REMOTE_WRITE);
    ASSERT_NE(rkey, 0u);
    // c -> d: same PD, but the window is bound to b
    ASSERT_EQ(PostRecv(d, r, 0, 64, 10), 0);
    ASSERT_EQ(PostSend(c, IBV_WR_SEND_WITH_INV, s, 0, 8, 11, 0, 0, rkey), 0);
    auto wc = Poll(scq_, 1);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].qp_num, c->qp_num);
    EXPECT_EQ(wc[0].status, IBV_WC_REM_INV_REQ_ERR);
    auto rw = Poll(rcq_, 1);
    ASSERT_EQ(rw.size(), 1u);
    EXPECT_EQ(rw[0].wr_id, 10u);
    EXPECT_EQ(rw[0].status, IBV_WC_LOC_QP_OP_ERR);
    EXPECT_EQ(State(d), IBV_QPS_ERR);
    // the window still grants b's peer
    ASSERT_EQ(PostSend(a, IBV_WR_RDMA_WRITE, s, 0, 64, 12, t->addr(), rkey), 0);
    wc = Poll(scq_, 1);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(t->mem[0], 0x33);
    // and b's own peer may invalidate it
    ASSERT_EQ(PostRecv(b, r, 0, 64, 13), 0);
    ASSERT_EQ(PostSend(a, IBV_WR_SEND_WITH_INV, s, 0, 8, 14, 0, 0, rkey), 0);
    wc = Poll(scq_, 1);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
    rw = Poll(rcq_, 1);
    ASSERT_EQ(rw.size(), 1u);
    EXPECT_EQ(rw[0].status, IBV_WC_SUCCESS);
    EXPECT_TRUE(rw[0].wc_flags & IBV_WC_WITH_INV);
    EXPECT_EQ(rw[0].invalidated_rkey, rkey);
}

// ------------------------------------------------------------------ 12: READ responses

constexpr size_t kBig = 64u << 20; // far more than the sockets hold

// Read a READ response's payload of n bytes; every byte must be `want`. Returns bytes read
// (less than n when the stream ended).
size_t ReadPayload(Raw &c, size_t n, uint8_t want, size_t *bad) {
    std::vector<uint8_t> buf(1 << 20);
    size_t got = 0;
    *bad = 0;
    while (got < n) {
        size_t k = std::min(buf.size(), n - got);
        // Recv wants all k bytes; take what arrives in pieces so a short tail still counts
        ssize_t r;
        ote_deadline_t dl = ote_deadline_after(kWaitNs);
        for (;;) {
            r = recv(c.fd(), buf.data(), k, 0);
            if (r > 0 || r == 0 || (errno != EAGAIN && errno != EINTR) || ote_deadline_expired(dl))
                break;
            struct pollfd pf = {c.fd(), POLLIN, 0};
            poll(&pf, 1, 10);
        }
        if (r <= 0) break;
        for (ssize_t i = 0; i < r; i++) *bad += buf[(size_t)i] != want;
        got += (size_t)r;
    }
    return got;
}

TEST_F(SimSecurity, ReadResponseIsSentBeforeALaterInvalidateExecutes) {
    struct ibv_qp *b = Victim();
    ASSERT_TRUE(b);
    Buf *t = NewMem(kBig, kRwBind, 0xa5);
    Buf *r = NewMem(64, kRw, 0);
    struct ibv_mw *mw = Mw();
    ASSERT_TRUE(mw);
    uint32_t rkey = Bind(b, mw, t, 0, kBig, IBV_ACCESS_REMOTE_READ);
    ASSERT_NE(rkey, 0u);
    ASSERT_EQ(PostRecv(b, r, 0, 64, 20), 0);
    auto c = Raw::Connect(gid_);
    ASSERT_TRUE(c);
    // HELLO, a 64 MiB READ and a SEND_WITH_INV of its window, pipelined, then read nothing
    uint8_t inv_payload[8] = {};
    WireHdr rd = Req(IBV_WR_RDMA_READ, 0, kBig, t->addr(), rkey);
    WireHdr inv = Req(IBV_WR_SEND_WITH_INV, rd.npsn, 8, 0, 0, rkey);
    std::vector<uint8_t> all;
    WireHdr hello{};
    hello.type = kHello;
    hello.imm = kPeerQpn;
    hello.raddr = b->qp_num;
    hello.len = 16;
    auto put = [&all](const void *p, size_t n) {
        all.insert(all.end(), (const uint8_t *)p, (const uint8_t *)p + n);
    };
    put(&hello, sizeof(hello));
    put(gid_.raw, 16);
    put(&rd, sizeof(rd));
    put(&inv, sizeof(inv));
    put(inv_payload, 8);
    ASSERT_TRUE(c->Send(all.data(), all.size())); // one write: the sim reads it at once
    // Either the sim has read it all (then the pass that parsed it has ended once State()
    // gets the lock) or it stopped reading before the SEND_WITH_INV: both are fine.
    (void)c->WaitConsumed(OTE_NSEC_PER_SEC);
    (void)State(b);
    struct ibv_wc wc;
    EXPECT_EQ(o_->poll_cq(v_, rcq_, 1, &wc), 0)
        << "the invalidation ran before the READ response was sent";
    // drain: the whole response, all of it the window's contents, then the SEND's ACK
    WireHdr h{};
    ASSERT_TRUE(c->Recv(&h, sizeof(h)));
    ASSERT_EQ(h.type, kRresp);
    ASSERT_EQ(h.len, kBig);
    size_t bad = 0;
    EXPECT_EQ(ReadPayload(*c, kBig, 0xa5, &bad), kBig);
    EXPECT_EQ(bad, 0u);
    ASSERT_TRUE(c->Recv(&h, sizeof(h)));
    EXPECT_EQ(h.type, kAck);
    EXPECT_EQ(h.psn, inv.psn);
    auto rw = Poll(rcq_, 1);
    ASSERT_EQ(rw.size(), 1u);
    EXPECT_EQ(rw[0].status, IBV_WC_SUCCESS);
    EXPECT_TRUE(rw[0].wc_flags & IBV_WC_WITH_INV);
}

// The requester stalls a large READ response; the owner revokes the memory (invalidates
// the window, or deregisters the MR and frees it). No byte is read from it afterwards:
// the requester gets only what was sent before, then the stream ends.
TEST_F(SimSecurity, RevokedWindowIsNotReadByAStalledReadResponse) {
    struct ibv_qp *b = Victim();
    ASSERT_TRUE(b);
    Buf *t = NewMem(kBig, kRwBind, 0xa5);
    struct ibv_mw *mw = Mw();
    ASSERT_TRUE(mw);
    uint32_t rkey = Bind(b, mw, t, 0, kBig, IBV_ACCESS_REMOTE_READ);
    ASSERT_NE(rkey, 0u);
    auto c = Raw::Connect(gid_);
    ASSERT_TRUE(c);
    ASSERT_TRUE(c->Hello(kPeerQpn, b->qp_num, gid_));
    ASSERT_TRUE(c->SendHdr(Req(IBV_WR_RDMA_READ, 0, kBig, t->addr(), rkey)));
    struct pollfd pf = {c->fd(), POLLIN, 0};
    ASSERT_EQ(poll(&pf, 1, kPollMs), 1) << "the response started";
    ASSERT_TRUE(LocalInv(b, rkey));
    memset(t->mem.data(), 0x5a, kBig); // the owner reuses the memory
    WireHdr h{};
    ASSERT_TRUE(c->Recv(&h, sizeof(h)));
    ASSERT_EQ(h.type, kRresp);
    size_t bad = 0;
    size_t got = ReadPayload(*c, kBig, 0xa5, &bad);
    EXPECT_LT(got, kBig) << "the response was cut";
    EXPECT_EQ(bad, 0u) << "bytes read after the window was invalidated";
    EXPECT_TRUE(c->eof() || c->WaitEof());
}

TEST_F(SimSecurity, DeregisteredMrIsNotReadByAStalledReadResponse) {
    struct ibv_qp *b = Victim();
    ASSERT_TRUE(b);
    auto mem = std::make_unique<std::vector<uint8_t>>(kBig, 0xa5);
    struct ibv_mr *mr = nullptr;
    ASSERT_EQ(o_->reg_mr(v_, pd_, mem->data(), kBig, kRw, &mr), 0);
    auto c = Raw::Connect(gid_);
    ASSERT_TRUE(c);
    ASSERT_TRUE(c->Hello(kPeerQpn, b->qp_num, gid_));
    ASSERT_TRUE(
        c->SendHdr(Req(IBV_WR_RDMA_READ, 0, kBig, (uint64_t)(uintptr_t)mem->data(), mr->rkey)));
    struct pollfd pf = {c->fd(), POLLIN, 0};
    ASSERT_EQ(poll(&pf, 1, kPollMs), 1) << "the response started";
    ASSERT_EQ(o_->dereg_mr(v_, mr), 0);
    // The owner reuses the memory at once: a response still reading it would send 0x5a.
    // (Freeing it instead proves little: the sim reads it with the kernel's copy, which
    // fails quietly on an unmapped page and is not seen by ASan on a quarantined one.)
    memset(mem->data(), 0x5a, kBig);
    WireHdr h{};
    ASSERT_TRUE(c->Recv(&h, sizeof(h)));
    ASSERT_EQ(h.type, kRresp);
    size_t bad = 0;
    EXPECT_LT(ReadPayload(*c, kBig, 0xa5, &bad), kBig);
    EXPECT_EQ(bad, 0u);
    EXPECT_TRUE(c->eof() || c->WaitEof());
}

// The same for a dma-buf MR: dereg revokes the READ response, then unmaps the sim's own
// mapping of the dma-buf (a later read through it would fault); the device memory is reused.
TEST_F(SimSecurity, DeregisteredDmabufMrIsNotReadByAStalledReadResponse) {
    struct ibv_qp *b = Victim();
    ASSERT_TRUE(b);
    ote_test::Memfd dev(kBig);
    ASSERT_TRUE(dev.ok());
    memset(dev.view(), 0xa5, kBig);
    struct ibv_mr *mr = nullptr;
    ASSERT_EQ(o_->reg_dmabuf_mr(v_, pd_, 0, kBig, kIova, dev.fd(), kRw, &mr), 0);
    auto c = Raw::Connect(gid_);
    ASSERT_TRUE(c);
    ASSERT_TRUE(c->Hello(kPeerQpn, b->qp_num, gid_));
    ASSERT_TRUE(c->SendHdr(Req(IBV_WR_RDMA_READ, 0, kBig, kIova, mr->rkey)));
    struct pollfd pf = {c->fd(), POLLIN, 0};
    ASSERT_EQ(poll(&pf, 1, kPollMs), 1) << "the response started";
    // The sim's own mapping of the dma-buf: the range that is not the test's view.
    uintptr_t sim_at = 0, sim_end = 0;
    for (auto &r : ote_test::MemfdRanges()) {
        if (r.first != (uintptr_t)dev.view()) sim_at = r.first, sim_end = r.second;
    }
    ASSERT_NE(sim_at, 0u);
    ASSERT_EQ(o_->dereg_mr(v_, mr), 0);
    EXPECT_EQ(ote_test::MemfdMappings(), 1) << "the sim's mapping is gone";
    memset(dev.view(), 0x5a, kBig); // the device reuses its memory
    // and the process reuses the addresses: a response still reading them would send 0x5a
    // (where nothing is mapped, the kernel's copy would only fail, which proves nothing)
    size_t reuse_len = sim_end - sim_at;
    void *reuse = mmap((void *)sim_at, reuse_len, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    ASSERT_EQ(reuse, (void *)sim_at) << "could not map the released range again";
    memset(reuse, 0x5a, reuse_len);
    WireHdr h{};
    ASSERT_TRUE(c->Recv(&h, sizeof(h)));
    ASSERT_EQ(h.type, kRresp);
    size_t bad = 0;
    EXPECT_LT(ReadPayload(*c, kBig, 0xa5, &bad), kBig);
    EXPECT_EQ(bad, 0u) << "bytes read after the dma-buf MR was deregistered";
    EXPECT_TRUE(c->eof() || c->WaitEof());
    munmap(reuse, reuse_len);
}

// A READ not yet started when its window is invalidated is answered with an access NAK.
TEST_F(SimSecurity, ReadQueuedBehindARevokedWindowIsNaked) {
    struct ibv_qp *b = Victim();
    ASSERT_TRUE(b);
    Buf *t = NewMem(kBig, kRwBind, 0xa5);
    Buf *t2 = NewMem(4096, kRwBind, 0xa5);
    struct ibv_mw *mw = Mw(), *mw2 = Mw();
    ASSERT_TRUE(mw && mw2);
    uint32_t rkey = Bind(b, mw, t, 0, kBig, IBV_ACCESS_REMOTE_READ);
    uint32_t rkey2 = Bind(b, mw2, t2, 0, 4096, IBV_ACCESS_REMOTE_READ);
    ASSERT_TRUE(rkey && rkey2);
    auto c = Raw::Connect(gid_);
    ASSERT_TRUE(c);
    WireHdr r1 = Req(IBV_WR_RDMA_READ, 0, kBig, t->addr(), rkey);
    WireHdr r2 = Req(IBV_WR_RDMA_READ, r1.npsn, 4096, t2->addr(), rkey2);
    ASSERT_TRUE(c->Hello(kPeerQpn, b->qp_num, gid_));
    ASSERT_TRUE(c->SendHdr(r1));
    ASSERT_TRUE(c->SendHdr(r2));
    struct pollfd pf = {c->fd(), POLLIN, 0};
    ASSERT_EQ(poll(&pf, 1, kPollMs), 1);
    // r2 waits behind r1; revoke r2's window, then drain r1
    ASSERT_TRUE(LocalInv(b, rkey2));
    WireHdr h{};
    ASSERT_TRUE(c->Recv(&h, sizeof(h)));
    ASSERT_EQ(h.type, kRresp);
    size_t bad = 0;
    EXPECT_EQ(ReadPayload(*c, kBig, 0xa5, &bad), kBig);
    EXPECT_EQ(bad, 0u);
    ASSERT_TRUE(c->Recv(&h, sizeof(h)));
    EXPECT_EQ(h.type, kNak);
    EXPECT_EQ(h.syndrome, kNakAccess);
    EXPECT_EQ(h.psn, r2.psn);
}

// ------------------------------------------------------------------ 13: inbound payloads

constexpr size_t kIn = 16u << 20;

// Send the header and the first MiB of a kIn-byte WRITE and wait until the sim has taken
// it (so the copy is in progress).
void StartWrite(Raw &c, const WireHdr &h, const std::vector<uint8_t> &payload) {
    ASSERT_TRUE(c.SendHdr(h));
    ASSERT_TRUE(c.Send(payload.data(), 1u << 20));
    ASSERT_TRUE(c.WaitConsumed());
}

bool AllEqual(const std::vector<uint8_t> &v, uint8_t x) {
    return std::all_of(v.begin(), v.end(), [x](uint8_t b) { return b == x; });
}

TEST_F(SimSecurity, InboundWriteStopsLandingWhenTheQpGoesToErr) {
    struct ibv_qp *b = Victim();
    ASSERT_TRUE(b);
    Buf *t = NewMem(kIn, kRw, 0);
    std::vector<uint8_t> payload(kIn, 0xee);
    auto c = Raw::Connect(gid_);
    ASSERT_TRUE(c);
    ASSERT_TRUE(c->Hello(kPeerQpn, b->qp_num, gid_));
    StartWrite(*c, Req(IBV_WR_RDMA_WRITE, 0, kIn, t->addr(), t->mr->rkey), payload);
    ASSERT_EQ(ToErr(b), 0);
    // Read only now: the provider lock that ToErr took orders this thread after the pass
    // that copied the first MiB (read before, it raced with the copy still running).
    EXPECT_EQ(t->mem[0], 0xee) << "the copy had started";
    memset(t->mem.data(), 0, kIn);
    // The contract is only that no byte lands once the QP is in ERR. The sim may keep
    // reading and dropping the rest, or end the stream: neither outcome is asserted, so
    // the send may fail, but it may not stall (the sim must not stop reading).
    bool sent = c->Send(payload.data() + (1u << 20), kIn - (1u << 20), 30 * OTE_NSEC_PER_SEC);
    ASSERT_TRUE(sent || c->eof()) << "the sim neither read the payload nor ended the stream";
    // Everything sent was taken by the sim (read and dropped, or discarded with the
    // stream); the provider lock then orders this thread after the pass that took it.
    ASSERT_TRUE(c->WaitConsumed(30 * OTE_NSEC_PER_SEC));
    EXPECT_EQ(State(b), IBV_QPS_ERR);
    EXPECT_TRUE(AllEqual(t->mem, 0)) << "payload landed after the QP went to ERR";
}

TEST_F(SimSecurity, InboundWriteStopsLandingWhenTheWindowIsInvalidated) {
    struct ibv_qp *b = Victim();
    ASSERT_TRUE(b);
    Buf *t = NewMem(kIn, kRwBind, 0);
    struct ibv_mw *mw = Mw();
    ASSERT_TRUE(mw);
    uint32_t rkey = Bind(b, mw, t, 0, kIn, IBV_ACCESS_REMOTE_WRITE);
    ASSERT_NE(rkey, 0u);
    std::vector<uint8_t> payload(kIn, 0xee);
    auto c = Raw::Connect(gid_);
    ASSERT_TRUE(c);
    ASSERT_TRUE(c->Hello(kPeerQpn, b->qp_num, gid_));
    WireHdr w = Req(IBV_WR_RDMA_WRITE, 0, kIn, t->addr(), rkey);
    StartWrite(*c, w, payload);
    ASSERT_TRUE(LocalInv(b, rkey));
    memset(t->mem.data(), 0, kIn);
    ASSERT_TRUE(c->Send(payload.data() + (1u << 20), kIn - (1u << 20)));
    WireHdr h{};
    ASSERT_TRUE(c->Recv(&h, sizeof(h))) << "the responder answers at the payload's end";
    EXPECT_EQ(h.type, kNak);
    EXPECT_EQ(h.syndrome, kNakAccess);
    EXPECT_EQ(h.psn, w.psn);
    EXPECT_TRUE(AllEqual(t->mem, 0)) << "payload landed after the window was invalidated";
    EXPECT_EQ(State(b), IBV_QPS_ERR);
    struct ibv_async_event ev;
    ASSERT_EQ(o_->get_async_event(v_, ctx_, &ev), 0);
    EXPECT_EQ(ev.event_type, IBV_EVENT_QP_ACCESS_ERR);
    o_->ack_async_event(v_, &ev);
}

TEST_F(SimSecurity, InboundWriteStopsLandingWhenTheMrIsDeregistered) {
    struct ibv_qp *b = Victim();
    ASSERT_TRUE(b);
    auto *mem = new std::vector<uint8_t>(kIn, 0);
    struct ibv_mr *mr = nullptr;
    ASSERT_EQ(o_->reg_mr(v_, pd_, mem->data(), kIn, kRw, &mr), 0);
    std::vector<uint8_t> payload(kIn, 0xee);
    auto c = Raw::Connect(gid_);
    ASSERT_TRUE(c);
    ASSERT_TRUE(c->Hello(kPeerQpn, b->qp_num, gid_));
    WireHdr w = Req(IBV_WR_RDMA_WRITE, 0, kIn, (uint64_t)(uintptr_t)mem->data(), mr->rkey);
    StartWrite(*c, w, payload);
    ASSERT_EQ(o_->dereg_mr(v_, mr), 0);
    delete mem; // freed: a later write into it would fault or trip ASan
    ASSERT_TRUE(c->Send(payload.data() + (1u << 20), kIn - (1u << 20)));
    WireHdr h{};
    ASSERT_TRUE(c->Recv(&h, sizeof(h)));
    EXPECT_EQ(h.type, kNak);
    EXPECT_EQ(h.syndrome, kNakAccess);
    EXPECT_EQ(State(b), IBV_QPS_ERR);
    struct ibv_async_event ev;
    ASSERT_EQ(o_->get_async_event(v_, ctx_, &ev), 0);
    EXPECT_EQ(ev.event_type, IBV_EVENT_QP_ACCESS_ERR);
    o_->ack_async_event(v_, &ev);
}

// An inbound WRITE into a dma-buf MR stops landing when the MR is deregistered (and its
// mapping unmapped) mid-payload: the rest is read and dropped, then an access NAK.
TEST_F(SimSecurity, InboundWriteStopsLandingWhenTheDmabufMrIsDeregistered) {
    struct ibv_qp *b = Victim();
    ASSERT_TRUE(b);
    ote_test::Memfd dev(kIn);
    ASSERT_TRUE(dev.ok());
    struct ibv_mr *mr = nullptr;
    ASSERT_EQ(o_->reg_dmabuf_mr(v_, pd_, 0, kIn, kIova, dev.fd(), kRw, &mr), 0);
    std::vector<uint8_t> payload(kIn, 0xee);
    auto c = Raw::Connect(gid_);
    ASSERT_TRUE(c);
    ASSERT_TRUE(c->Hello(kPeerQpn, b->qp_num, gid_));
    WireHdr w = Req(IBV_WR_RDMA_WRITE, 0, kIn, kIova, mr->rkey);
    StartWrite(*c, w, payload);
    EXPECT_EQ(dev.view()[0], 0xee) << "the copy had started";
    ASSERT_EQ(o_->dereg_mr(v_, mr), 0);
    memset(dev.view(), 0, kIn);
    ASSERT_TRUE(c->Send(payload.data() + (1u << 20), kIn - (1u << 20), 30 * OTE_NSEC_PER_SEC));
    WireHdr h{};
    ASSERT_TRUE(c->Recv(&h, sizeof(h)));
    EXPECT_EQ(h.type, kNak);
    EXPECT_EQ(h.syndrome, kNakAccess);
    EXPECT_EQ(State(b), IBV_QPS_ERR);
    size_t landed = 0;
    for (size_t i = 0; i < kIn; i++) landed += dev.view()[i] != 0;
    EXPECT_EQ(landed, 0u) << "payload landed after the dma-buf MR was deregistered";
    struct ibv_async_event ev;
    ASSERT_EQ(o_->get_async_event(v_, ctx_, &ev), 0);
    EXPECT_EQ(ev.event_type, IBV_EVENT_QP_ACCESS_ERR);
    o_->ack_async_event(v_, &ev);
}

// ------------------------------------------------------------------ 18: ACK for a READ

// A fake responder (a listener on a GID no sim holds) answers the requester's first READ
// properly and its second with a plain ACK: the second must not complete as a READ.
TEST_F(SimSecurity, AckInPlaceOfAReadResponseIsABadResponse) {
    union ibv_gid fake = {};
    fake.raw[0] = 0xfd;
    fake.raw[1] = 0x7e;
    uint32_t pid = (uint32_t)getpid();
    memcpy(fake.raw + 12, &pid, 4);
    int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    ASSERT_GE(lfd, 0);
    struct sockaddr_un sun;
    socklen_t sl = GidAddr(fake, &sun);
    ASSERT_EQ(bind(lfd, (struct sockaddr *)&sun, sl), 0);
    ASSERT_EQ(listen(lfd, 4), 0);
    Raw listener(lfd);
    struct ibv_qp *a = Qp();
    ASSERT_TRUE(a);
    Connect(a, 0x123456, fake);
    Buf *l = NewMem(8192, kRw, 0);
    ASSERT_EQ(PostSend(a, IBV_WR_RDMA_READ, l, 0, 4096, 1, 0x10000, 0x777), 0);
    struct pollfd pf = {lfd, POLLIN, 0};
    ASSERT_EQ(poll(&pf, 1, kPollMs), 1);
    int fd = accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    ASSERT_GE(fd, 0);
    Raw peer(fd);
    WireHdr h{};
    uint8_t g[16];
    ASSERT_TRUE(peer.Recv(&h, sizeof(h)));
    ASSERT_EQ(h.type, kHello);
    EXPECT_EQ(h.imm, a->qp_num);
    ASSERT_TRUE(peer.Recv(g, 16));
    ASSERT_TRUE(peer.Recv(&h, sizeof(h)));
    ASSERT_EQ(h.type, kReq);
    ASSERT_EQ(h.op, (uint8_t)IBV_WR_RDMA_READ);
    // first READ: a real response
    std::vector<uint8_t> data(4096, 0x42);
    WireHdr resp{};
    resp.type = kRresp;
    resp.psn = h.psn;
    resp.len = 4096;
    ASSERT_TRUE(peer.SendHdr(resp, data.data(), data.size()));
    auto wc = Poll(scq_, 1);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc[0].opcode, IBV_WC_RDMA_READ);
    EXPECT_EQ(l->mem[4095], 0x42);
    // second READ: a plain ACK instead
    ASSERT_EQ(PostSend(a, IBV_WR_RDMA_READ, l, 4096, 4096, 2, 0x10000, 0x777), 0);
    ASSERT_TRUE(peer.Recv(&h, sizeof(h)));
    ASSERT_EQ(h.op, (uint8_t)IBV_WR_RDMA_READ);
    WireHdr ack{};
    ack.type = kAck;
    ack.psn = h.psn;
    ASSERT_TRUE(peer.SendHdr(ack));
    wc = Poll(scq_, 1);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].wr_id, 2u);
    EXPECT_EQ(wc[0].status, IBV_WC_BAD_RESP_ERR);
    EXPECT_EQ(State(a), IBV_QPS_ERR);
    EXPECT_EQ(l->mem[4096], 0) << "nothing was read";
}

} // namespace

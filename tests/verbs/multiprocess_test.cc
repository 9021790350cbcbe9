// Two processes over the sim: this test and multiprocess_peer (a data dependency,
// started with posix_spawn so no fork happens after the sim's thread exists) exchange
// GID, QPN and rkey over a socketpair, then RDMA WRITE, READ and SEND with data checks,
// a large transfer whose throughput goes to the log, a peer stopped (SIGSTOP) past the
// retry bound whose work still completes, and finally the peer is killed with SIGKILL
// mid-stream and this side must see IBV_WC_RETRY_EXC_ERR within the bound.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tests/util/test_base.h"
#include "tests/util/wait.h"
#include "tests/verbs/verbs_fixture.h"
#include "tests/verbs/multiprocess_common.h"

extern "C" {
#include "base/alloc.h"
#include "base/time.h"
#include "verbs/sim/sim.h"
#include "verbs/verbs.h"
}

extern char **environ;

namespace {

uint64_t TransferBytes() {
    const char *e = getenv("OTE_MP_BYTES"); // e.g. 1073741824 for the 1 GiB figure
    if (e && *e) return strtoull(e, nullptr, 10);
    // A quarter under ThreadSanitizer, which checks every byte the sim moves and the
    // fills and checks touch (still 8 WRs of 8 MiB per stream, 16 of 4 MiB when killed).
    return ote_test::TsanScaled(256ull << 20, 4);
}

std::string PeerPath() {
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) return "";
    self[n] = '\0';
    std::string s(self);
    return s.substr(0, s.rfind('/')) + "/multiprocess_peer";
}

class MultiProcess : public ote_test::VerbsFixture {
  protected:
    void SetUp() override {
        VerbsFixture::SetUp();
        bytes_ = TransferBytes();
        ASSERT_NO_FATAL_FAILURE(OpenVerbs("sim"));
        scq_ = Cq(1024);
        rcq_ = Cq(1024);
        ASSERT_TRUE(scq_ && rcq_);
        buf_ = static_cast<uint8_t *>(ote_aligned_alloc(4096, bytes_));
        ASSERT_NE(buf_, nullptr);
        memset(buf_, 0, bytes_);
        ASSERT_EQ(o_->reg_mr(v_, pd_, buf_, bytes_,
                             IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, &mr_),
                  0);
        TrackMr(mr_); // deregistered by the fixture before buf_ is freed
        qp_ = Qp(scq_, rcq_, 64, 16);
        ASSERT_NE(qp_, nullptr);
        const union ibv_gid &gid = gid_;
        dev_ = std::make_unique<ote_test::Memfd>(kDevBytes); // the peer's "device memory"
        ASSERT_TRUE(dev_->ok());

        // the peer gets its end of a socketpair as fd 100
        int sv[2];
        ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        sock_ = sv[0];
        // Every exchange with the peer is bounded: a peer that hangs (rather than dies)
        // fails the test after 120 s instead of blocking it until Bazel's timeout.
        struct timeval tv = {120, 0};
        ASSERT_EQ(setsockopt(sock_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
        ASSERT_EQ(setsockopt(sock_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)), 0);
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_adddup2(&fa, sv[1], 100);
        posix_spawn_file_actions_adddup2(&fa, dev_->fd(), mp::kDmabufFd);
        std::string path = PeerPath();
        std::string nbytes = std::to_string(bytes_ + (1 << 20));
        char *args[] = {const_cast<char *>(path.c_str()), const_cast<char *>("100"),
                        const_cast<char *>(nbytes.c_str()), nullptr};
        int rc = posix_spawn(&pid_, path.c_str(), &fa, nullptr, args, environ);
        posix_spawn_file_actions_destroy(&fa);
        close(sv[1]);
        ASSERT_EQ(rc, 0) << "spawning " << path;

        mp::Msg m;
        memset(&m, 0, sizeof(m));
        m.type = mp::kHello;
        m.qpn = qp_->qp_num;
        memcpy(m.gid, gid.raw, 16);
        ASSERT_TRUE(mp::WriteMsg(sock_, m));
        ASSERT_TRUE(mp::ReadMsg(sock_, &peer_));
        ASSERT_EQ(peer_.type, (uint32_t)mp::kHello);
        EXPECT_NE(memcmp(peer_.gid, gid.raw, 16), 0) << "both processes got the same GID";

        ASSERT_EQ(ote_test::QpToInit(v_, qp_, 0), 0);
        ASSERT_EQ(ote_test::QpToRtr(v_, qp_, mp::PathTo(peer_, port_.active_mtu, gid_index_)), 0);
        ASSERT_EQ(ote_test::QpToRts(v_, qp_, mp::Retry()), 0);
    }

    void TearDown() override {
        if (sock_ >= 0) close(sock_);
        if (pid_ > 0) {
            int status = 0;
            pid_t r = 0;
            if (!ote_test::WaitUntil([&] { return (r = waitpid(pid_, &status, WNOHANG)) != 0; },
                                     std::chrono::seconds(30), "the peer process to exit")) {
                kill(pid_, SIGKILL);
                waitpid(pid_, &status, 0);
            } else {
                EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
                    << "peer status " << status;
            }
        }
        dev_.reset();             // before the fixture's fd check
        VerbsFixture::TearDown(); // QP, MR, CQs, PD, context, provider
        ote_aligned_free(buf_);
    }

    mp::Msg Ask(uint32_t type, uint64_t off, uint64_t len, uint32_t seed) {
        mp::Msg m;
        memset(&m, 0, sizeof(m));
        m.type = type;
        m.off = off;
        m.len = len;
        m.seed = seed;
        EXPECT_TRUE(mp::WriteMsg(sock_, m));
        mp::Msg r;
        memset(&r, 0, sizeof(r));
        EXPECT_TRUE(mp::ReadMsg(sock_, &r));
        return r;
    }

    int Post(enum ibv_wr_opcode op, uint64_t loff, uint32_t len, uint64_t roff, uint64_t id,
             uint32_t imm = 0) {
        return PostSendSge(qp_, op, (uint64_t)(uintptr_t)(buf_ + loff), len, mr_->lkey, id,
                           peer_.addr + roff, peer_.rkey, htonl(imm));
    }

    std::vector<struct ibv_wc> Poll(struct ibv_cq *cq, size_t n, uint64_t ns) {
        std::vector<struct ibv_wc> out;
        ote_test::PollCq(v_, cq, n, ns, &out);
        return out;
    }

    // Move `total` bytes with `op` in chunks, keeping `depth` WRs in flight. Returns MB/s.
    double Stream(enum ibv_wr_opcode op, uint64_t total, uint32_t chunk, int depth) {
        uint64_t t0 = ote_now_ns();
        uint64_t posted = 0, done = 0, id = 0;
        int inflight = 0;
        ote_deadline_t dl = ote_deadline_after(300 * OTE_NSEC_PER_SEC);
        while (done < total && !ote_deadline_expired(dl)) {
            while (inflight < depth && posted < total) {
                uint32_t len = (uint32_t)(total - posted < chunk ? total - posted : chunk);
                if (Post(op, posted, len, posted, id++) != 0) {
                    ADD_FAILURE() << "post failed";
                    return 0;
                }
                posted += len;
                inflight++;
            }
            struct ibv_wc wc[32];
            int r = o_->poll_cq(v_, scq_, 32, wc);
            if (r < 0) {
                ADD_FAILURE() << "poll failed";
                return 0;
            }
            for (int i = 0; i < r; i++) {
                if (wc[i].status != IBV_WC_SUCCESS) {
                    ADD_FAILURE() << "status " << ote_verbs_wc_status_str(wc[i].status);
                    return 0;
                }
                done += (uint64_t)chunk < total ? chunk : total;
                inflight--;
            }
            if (inflight == 0 && posted >= total) break;
        }
        double secs = (double)(ote_now_ns() - t0) / 1e9;
        return (double)total / (1024.0 * 1024.0) / secs;
    }

    static constexpr size_t kDevBytes = 2 << 20;
    std::unique_ptr<ote_test::Memfd> dev_;
    struct ibv_cq *scq_ = nullptr, *rcq_ = nullptr;
    struct ibv_qp *qp_ = nullptr;
    struct ibv_mr *mr_ = nullptr;
    uint8_t *buf_ = nullptr;
    uint64_t bytes_ = 0;
    int sock_ = -1;
    pid_t pid_ = -1;
    mp::Msg peer_;
};

TEST_F(MultiProcess, WriteReadSendWithDataChecks) {
    constexpr uint32_t kLen = 1 << 20;
    // WRITE then SEND: when the peer polls the SEND's receive, the WRITE data is there
    mp::Fill(buf_, kLen, 1, 0);
    ASSERT_EQ(Post(IBV_WR_RDMA_WRITE, 0, kLen, 0, 1), 0);
    ASSERT_EQ(Post(IBV_WR_SEND_WITH_IMM, 0, 64, 0, 2, 0x1234), 0);
    auto wc = Poll(scq_, 2, 30 * OTE_NSEC_PER_SEC);
    ASSERT_EQ(wc.size(), 2u);
    EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc[0].opcode, IBV_WC_RDMA_WRITE);
    EXPECT_EQ(wc[1].status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc[1].opcode, IBV_WC_SEND);
    mp::Msg r = Ask(mp::kRecv, 0, kLen, 1);
    EXPECT_EQ(r.value, 1u) << "peer did not see the WRITE data with the SEND";
    EXPECT_EQ(r.aux, 0x1234u);
    // READ what the peer wrote into its own memory
    ASSERT_EQ(Ask(mp::kFill, 4 << 20, kLen, 2).value, 1u);
    memset(buf_, 0, kLen);
    ASSERT_EQ(Post(IBV_WR_RDMA_READ, 0, kLen, 4 << 20, 3), 0);
    wc = Poll(scq_, 1, 30 * OTE_NSEC_PER_SEC);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc[0].opcode, IBV_WC_RDMA_READ);
    EXPECT_EQ(wc[0].byte_len, kLen);
    EXPECT_TRUE(mp::Check(buf_, kLen, 2, 0));
    // SEND from the peer into a receive posted here
    ASSERT_EQ(Ask(mp::kFill, 8 << 20, 4096, 3).value, 1u);
    ASSERT_EQ(
        ote_test::PostRecvOne(v_, qp_, (uint64_t)(uintptr_t)(buf_ + (2 << 20)), 8192, mr_->lkey, 9),
        0);
    mp::Msg s;
    memset(&s, 0, sizeof(s));
    s.type = mp::kSend;
    s.off = 8 << 20;
    s.len = 4096;
    s.seed = 77;
    ASSERT_TRUE(mp::WriteMsg(sock_, s));
    auto rwc = Poll(rcq_, 1, 30 * OTE_NSEC_PER_SEC);
    ASSERT_TRUE(mp::ReadMsg(sock_, &r));
    EXPECT_EQ(r.value, 1u);
    ASSERT_EQ(rwc.size(), 1u);
    EXPECT_EQ(rwc[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(rwc[0].wr_id, 9u);
    EXPECT_EQ(rwc[0].byte_len, 4096u);
    EXPECT_TRUE(rwc[0].wc_flags & IBV_WC_WITH_IMM);
    EXPECT_EQ(ntohl(rwc[0].imm_data), 77u);
    // the peer filled with seed 3 but the pattern is position based from 0
    std::vector<uint8_t> expect(4096);
    mp::Fill(expect.data(), 4096, 3, 0);
    EXPECT_EQ(memcmp(buf_ + (2 << 20), expect.data(), 4096), 0);
}

// The peer registers a dma-buf MR over this process's memfd (GPU memory's stand-in, shared
// with the peer as an fd): the peer's software NIC writes and reads it for this process's
// WRITE and READ, and this process sees the bytes through its own mapping of the memfd.
TEST_F(MultiProcess, DmabufMrInThePeerIsReachedByWriteAndRead) {
    constexpr uint64_t kOff = 3 * 4096 + 200, kLen = 256 * 1024;
    constexpr uint64_t kIova = 0x7e5a00000000ull + kOff % 4096;
    mp::Msg m;
    memset(&m, 0, sizeof(m));
    m.type = mp::kDmabuf;
    m.off = kOff;
    m.len = kLen;
    m.addr = kIova;
    ASSERT_TRUE(mp::WriteMsg(sock_, m));
    mp::Msg r;
    ASSERT_TRUE(mp::ReadMsg(sock_, &r));
    ASSERT_EQ(r.value, 1u) << "the peer could not register the dma-buf MR";
    uint32_t rkey = r.rkey;
    mp::Fill(buf_, kLen, 5, 0);
    ASSERT_EQ(PostSendSge(qp_, IBV_WR_RDMA_WRITE, (uint64_t)(uintptr_t)buf_, kLen, mr_->lkey, 1,
                          kIova, rkey),
              0);
    auto wc = Poll(scq_, 1, 30 * OTE_NSEC_PER_SEC);
    ASSERT_EQ(wc.size(), 1u);
    ASSERT_EQ(wc[0].status, IBV_WC_SUCCESS);
    EXPECT_TRUE(mp::Check(dev_->view() + kOff, kLen, 5, 0)) << "the WRITE did not reach the memfd";
    EXPECT_EQ(dev_->view()[kOff - 1], 0);
    EXPECT_EQ(dev_->view()[kOff + kLen], 0);
    mp::Fill(dev_->view() + kOff, kLen, 6, 0); // the "device" changes its memory
    memset(buf_, 0, kLen);
    ASSERT_EQ(PostSendSge(qp_, IBV_WR_RDMA_READ, (uint64_t)(uintptr_t)buf_, kLen, mr_->lkey, 2,
                          kIova, rkey),
              0);
    wc = Poll(scq_, 1, 30 * OTE_NSEC_PER_SEC);
    ASSERT_EQ(wc.size(), 1u);
    ASSERT_EQ(wc[0].status, IBV_WC_SUCCESS);
    EXPECT_TRUE(mp::Check(buf_, kLen, 6, 0)) << "the READ did not see the memfd";
    // deregistered in the peer: the rkey no longer reaches the memory
    m.type = mp::kDmabufDereg;
    ASSERT_TRUE(mp::WriteMsg(sock_, m));
    ASSERT_TRUE(mp::ReadMsg(sock_, &r));
    ASSERT_EQ(r.value, 1u);
    memset(dev_->view(), 0, kDevBytes);
    ASSERT_EQ(PostSendSge(qp_, IBV_WR_RDMA_WRITE, (uint64_t)(uintptr_t)buf_, 4096, mr_->lkey, 3,
                          kIova, rkey),
              0);
    wc = Poll(scq_, 1, 30 * OTE_NSEC_PER_SEC);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].status, IBV_WC_REM_ACCESS_ERR);
    size_t landed = 0;
    for (size_t i = 0; i < kDevBytes; i++) landed += dev_->view()[i] != 0;
    EXPECT_EQ(landed, 0u);
}

TEST_F(MultiProcess, LargeTransferThroughput) {
    mp::Fill(buf_, bytes_, 4, 0);
    double w = Stream(IBV_WR_RDMA_WRITE, bytes_, 8 << 20, 16);
    ASSERT_GT(w, 0);
    ASSERT_EQ(Post(IBV_WR_SEND, 0, 0, 0, 1000), 0);
    auto wc = Poll(scq_, 1, 30 * OTE_NSEC_PER_SEC);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(Ask(mp::kRecv, 0, bytes_, 4).value, 1u) << "data check of the large WRITE";
    ASSERT_EQ(Ask(mp::kFill, 0, bytes_, 5).value, 1u);
    memset(buf_, 0, bytes_);
    double r = Stream(IBV_WR_RDMA_READ, bytes_, 8 << 20, 16);
    ASSERT_GT(r, 0);
    EXPECT_TRUE(mp::Check(buf_, bytes_, 5, 0)) << "data check of the large READ";
    printf(
        "[ multiprocess ] %llu MiB between two processes: RDMA WRITE %.0f MB/s, RDMA READ %.0f "
        "MB/s\n",
        (unsigned long long)(bytes_ >> 20), w, r);
    RecordProperty("write_MBps", std::to_string((int)w));
    RecordProperty("read_MBps", std::to_string((int)r));
}

// A NIC takes and ACKs packets without its host's CPU, so a peer process that is stopped,
// or starved of CPU on a loaded machine, for longer than the retry bound (1 s for a live
// peer) is slow, not lost: no RETRY_EXC_ERR while it cannot read, and its WRITE, SEND and
// READ complete once it runs again.
TEST_F(MultiProcess, PeerStoppedLongerThanTheRetryBoundIsNotLost) {
    constexpr uint32_t kLen = 1 << 20;
    mp::Fill(buf_, kLen, 6, 0);
    ASSERT_EQ(Ask(mp::kFill, 4 << 20, kLen, 7).value, 1u);
    memset(buf_ + (2 << 20), 0, kLen);
    ASSERT_EQ(kill(pid_, SIGSTOP), 0);
    struct Resume { // the peer runs again whatever happens below
        pid_t pid;
        ~Resume() { kill(pid, SIGCONT); }
    } resume{pid_};
    int status = 0; // kill() may return before the peer has stopped: wait until it has
    ASSERT_EQ(waitpid(pid_, &status, WUNTRACED), pid_);
    ASSERT_TRUE(WIFSTOPPED(status)) << "peer status " << status;
    ASSERT_EQ(Post(IBV_WR_RDMA_WRITE, 0, kLen, 0, 1), 0);
    ASSERT_EQ(Post(IBV_WR_SEND_WITH_IMM, 0, 64, 0, 2, 0x77), 0);
    ASSERT_EQ(Post(IBV_WR_RDMA_READ, 2 << 20, kLen, 4 << 20, 3), 0);
    // 1.5 s stopped: past the 1 s bound (nothing can complete while the peer is stopped)
    auto early = Poll(scq_, 1, 1500 * OTE_NSEC_PER_MSEC);
    EXPECT_TRUE(early.empty()) << ote_verbs_wc_status_str(early[0].status);
    ASSERT_EQ(kill(pid_, SIGCONT), 0);
    auto wc = Poll(scq_, 3 - early.size(), 30 * OTE_NSEC_PER_SEC);
    ASSERT_EQ(wc.size(), 3 - early.size());
    for (auto &w : wc) EXPECT_EQ(w.status, IBV_WC_SUCCESS) << ote_verbs_wc_status_str(w.status);
    mp::Msg r = Ask(mp::kRecv, 0, kLen, 6);
    EXPECT_EQ(r.value, 1u) << "peer did not see the WRITE data with the SEND";
    EXPECT_EQ(r.aux, 0x77u);
    EXPECT_TRUE(mp::Check(buf_ + (2 << 20), kLen, 7, 0)) << "data check of the READ";
}

TEST_F(MultiProcess, PeerKilledMidStreamGivesRetryExceeded) {
    constexpr uint32_t kChunk = 4 << 20;
    int n = (int)(bytes_ / kChunk < 32 ? bytes_ / kChunk : 32);
    ASSERT_GE(n, 4);
    for (int i = 0; i < n; i++)
        ASSERT_EQ(Post(IBV_WR_RDMA_WRITE, (uint64_t)i * kChunk, kChunk, (uint64_t)i * kChunk,
                       (uint64_t)i),
                  0);
    auto first = Poll(scq_, 1, 30 * OTE_NSEC_PER_SEC);
    ASSERT_EQ(first.size(), 1u);
    EXPECT_EQ(first[0].status, IBV_WC_SUCCESS);
    ASSERT_EQ(kill(pid_, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(waitpid(pid_, &status, 0), pid_);
    pid_ = -1;
    uint64_t t_kill = ote_now_ns();
    // more work after the death: it can never be acknowledged
    for (int i = 0; i < 4; i++)
        ASSERT_EQ(Post(IBV_WR_RDMA_WRITE, 0, 4096, 0, (uint64_t)(100 + i)), 0);
    uint64_t bound_ns = (uint64_t)ote_sim_retry_cap_ms(v_) * OTE_NSEC_PER_MSEC;
    auto rest = Poll(scq_, (size_t)n - 1 + 4, bound_ns + 30 * OTE_NSEC_PER_SEC);
    ASSERT_EQ(rest.size(), (size_t)n - 1 + 4);
    size_t i = 0;
    while (i < rest.size() && rest[i].status == IBV_WC_SUCCESS) i++;
    ASSERT_LT(i, rest.size());
    EXPECT_EQ(rest[i].status, IBV_WC_RETRY_EXC_ERR) << ote_verbs_wc_status_str(rest[i].status);
    for (size_t j = i + 1; j < rest.size(); j++) {
        EXPECT_EQ(rest[j].status, IBV_WC_WR_FLUSH_ERR);
    }
    uint64_t took = ote_now_ns() - t_kill;
    printf(
        "[ multiprocess ] peer killed: %zu WRs had completed, RETRY_EXC_ERR after %.0f ms (cap %u "
        "ms)\n",
        i + 1, (double)took / 1e6, ote_sim_retry_cap_ms(v_));
    EXPECT_LE(took, bound_ns + 20 * OTE_NSEC_PER_SEC)
        << "bounded by the cap (room left for a loaded machine)";
    struct ibv_qp_attr a;
    struct ibv_qp_init_attr ia;
    ASSERT_EQ(o_->query_qp(v_, qp_, &a, IBV_QP_STATE, &ia), 0);
    EXPECT_EQ(a.qp_state, IBV_QPS_ERR);
}

} // namespace

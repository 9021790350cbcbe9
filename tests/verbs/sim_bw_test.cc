// The sim's per-port egress limit (config `bw=`, ote_sim_set_port_bw) and its byte
// counters: the configuration is parsed and bad rates refused; WRITE, SEND and READ
// payloads over a limited port arrive intact and never faster than the bucket allows (a
// lower bound on the elapsed time, which load can only lengthen); a throttled transfer
// sleeps instead of spinning (the progress thread's CPU time well under the wall time); many QPs
// sharing one limited port all complete (none starves into a retry timeout); removing the
// limit lets traffic run unlimited. Port down/up is covered by conformance_test.
#include <gtest/gtest.h>

#include <time.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tests/verbs/verbs_fixture.h"

extern "C" {
#include "base/time.h"
#include "verbs/sim/sim.h"
#include "verbs/verbs.h"
}

namespace {

using Buf = ote_test::VerbsBuf;

constexpr uint64_t kRate = 16ull * 1000 * 1000; // bytes per second
constexpr uint32_t kWr = 1u << 20;              // bytes per WR
constexpr int kWrs = 4;                         // WRs per transfer
// The bucket's burst (10 ms of traffic, at least 4 quanta of 4 KiB..256 KiB).
constexpr uint64_t kBurst = kRate / 100 > 4 * 16000 ? kRate / 100 : 4 * 16000;
// Elapsed time a transfer of n bytes cannot beat: (n - burst) / rate, minus a 10% margin.
uint64_t MinNs(uint64_t n) { return (n - kBurst) * 9 / 10 * OTE_NSEC_PER_SEC / kRate; }

uint64_t ClockNs(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * OTE_NSEC_PER_SEC + (uint64_t)ts.tv_nsec;
}
// CPU time of the process's other threads (the sim's progress thread): the test thread
// itself polls its CQ without sleeping.
uint64_t CpuNs() { return ClockNs(CLOCK_PROCESS_CPUTIME_ID) - ClockNs(CLOCK_THREAD_CPUTIME_ID); }

void Fill(Buf *b, uint8_t seed) {
    for (size_t i = 0; i < b->mem.size(); i++) b->mem[i] = (uint8_t)(i * 131 + seed + (i >> 12));
}

class SimBw : public ote_test::VerbsFixture {
  protected:
    void SetUp() override {
        ote_test::VerbsFixture::SetUp();
        ASSERT_NO_FATAL_FAILURE(OpenVerbs("sim"));
        dev_ = ctx_->device->name;
    }
    uint64_t TxBytes() {
        uint64_t b = 0;
        EXPECT_EQ(ote_sim_port_tx_bytes(v_, dev_.c_str(), 1, &b), OTE_OK);
        return b;
    }
    uint64_t TxPayload() {
        uint64_t b = 0;
        EXPECT_EQ(ote_sim_port_tx_payload_bytes(v_, dev_.c_str(), 1, &b), OTE_OK);
        return b;
    }
    // kWrs WRs of op from src into dst (or, for READ, from dst into src); returns the
    // elapsed wall time and checks every completion.
    uint64_t Run(struct ibv_qp *a, struct ibv_qp *b, struct ibv_cq *scq, struct ibv_cq *rcq,
                 enum ibv_wr_opcode op, Buf *src, Buf *dst) {
        uint64_t t0 = ote_now_ns();
        for (int i = 0; i < kWrs; i++) {
            uint64_t off = (uint64_t)i * kWr;
            if (op == IBV_WR_SEND) {
                EXPECT_EQ(PostRecv(b, dst, off, kWr, 100 + i), 0);
            }
            EXPECT_EQ(PostSend(a, op, src, off, kWr, 1 + i, dst->addr() + off, dst->mr->rkey), 0);
        }
        auto s = Poll(scq, kWrs, 60 * OTE_NSEC_PER_SEC);
        EXPECT_EQ(s.size(), (size_t)kWrs);
        for (auto &wc : s) EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << "wc status " << wc.status;
        if (op == IBV_WR_SEND) {
            auto r = Poll(rcq, kWrs, 60 * OTE_NSEC_PER_SEC);
            EXPECT_EQ(r.size(), (size_t)kWrs);
            for (auto &wc : r) EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
        }
        return ote_now_ns() - t0;
    }
    std::string dev_;
};

TEST(SimBwConfig, RatesParsedAndBadOnesRefused) {
    const char *good[] = {
        "dev=d0;port,bw=32M;gid=auto-v4",
        "dev=d0;port,bw=1500000;gid=auto-v4",
        "dev=d0;port,bw=2G;gid=auto-v4;port,bw=0;gid=auto-v4",
    };
    for (const char *c : good) {
        ote_verbs_t *v = nullptr;
        ASSERT_EQ(ote_verbs_open("sim", c, &v), OTE_OK) << c;
        uint64_t b = 1;
        EXPECT_EQ(ote_sim_port_tx_bytes(v, "d0", 1, &b), OTE_OK);
        EXPECT_EQ(b, 0u);
        EXPECT_EQ(ote_sim_port_tx_bytes(v, "d0", 9, &b), OTE_ERR_NOT_FOUND);
        EXPECT_EQ(ote_sim_port_tx_bytes(v, "nope", 1, &b), OTE_ERR_NOT_FOUND);
        b = 1;
        EXPECT_EQ(ote_sim_port_tx_payload_bytes(v, "d0", 1, &b), OTE_OK);
        EXPECT_EQ(b, 0u);
        EXPECT_EQ(ote_sim_port_tx_payload_bytes(v, "d0", 9, &b), OTE_ERR_NOT_FOUND);
        EXPECT_EQ(ote_sim_set_port_bw(v, "d0", 1, 5), OTE_OK);
        EXPECT_EQ(ote_sim_set_port_bw(v, "d0", 1, 2000ull * 1000 * 1000 * 1000), OTE_ERR_INVALID);
        EXPECT_EQ(ote_sim_set_port_bw(v, "d9", 1, 5), OTE_ERR_NOT_FOUND);
        ote_verbs_close(v);
    }
    const char *bad[] = {
        "dev=d0;port,bw=;gid=auto-v4",      "dev=d0;port,bw=x;gid=auto-v4",
        "dev=d0;port,bw=5T;gid=auto-v4",    "dev=d0;port,bw=-1;gid=auto-v4",
        "dev=d0;port,bw=2000G;gid=auto-v4", "dev=d0;port,bw;gid=auto-v4",
    };
    for (const char *c : bad) {
        ote_verbs_t *v = nullptr;
        EXPECT_EQ(ote_verbs_open("sim", c, &v), OTE_ERR_INVALID) << c;
        EXPECT_EQ(v, nullptr);
    }
    EXPECT_EQ(ote_sim_set_port_bw(nullptr, "d0", 1, 5), OTE_ERR_INVALID);
}

TEST_F(SimBw, WriteSendReadArePacedIntactAndDoNotSpin) {
    ASSERT_EQ(ote_sim_set_port_bw(v_, dev_.c_str(), 1, kRate), OTE_OK);
    struct ibv_cq *scq = Cq(), *rcq = Cq();
    struct ibv_qp *a = Qp(scq, rcq), *b = Qp(scq, rcq);
    ASSERT_TRUE(a && b);
    Connect(a, b);
    const size_t n = (size_t)kWr * kWrs;
    struct Case {
        enum ibv_wr_opcode op;
        const char *name;
    } cases[] = {{IBV_WR_RDMA_WRITE, "WRITE"}, {IBV_WR_SEND, "SEND"}, {IBV_WR_RDMA_READ, "READ"}};
    for (const Case &c : cases) {
        SCOPED_TRACE(c.name);
        Buf *src = Mem(n), *dst = Mem(n);
        Fill(c.op == IBV_WR_RDMA_READ ? dst : src, (uint8_t)c.op);
        uint64_t tx0 = TxBytes(), cpu0 = CpuNs();
        uint64_t ns = Run(a, b, scq, rcq, c.op, src, dst);
        uint64_t cpu = CpuNs() - cpu0;
        EXPECT_TRUE(src->mem == dst->mem);
        EXPECT_GE(TxBytes() - tx0, (uint64_t)n);
        EXPECT_GE(ns, MinNs(n)) << "faster than the port's limit";
        // Spinning would burn about one core for the whole transfer.
        EXPECT_LT(cpu, ns / 2) << "cpu " << cpu << " ns of " << ns << " ns wall";
    }
}

TEST_F(SimBw, ManyQpsShareALimitedPortWithoutStarving) {
    // 8 QPs, 1 MiB each, at 4 MB/s: about 2 s in all; each must make progress well within
    // the 1 s a live peer gets before RETRY_EXC_ERR.
    constexpr uint64_t kSlow = 4ull * 1000 * 1000;
    ASSERT_EQ(ote_sim_set_port_bw(v_, dev_.c_str(), 1, kSlow), OTE_OK);
    struct ibv_cq *scq = Cq(), *rcq = Cq();
    constexpr int kQps = 8;
    std::vector<struct ibv_qp *> qa, qb;
    for (int i = 0; i < kQps; i++) {
        qa.push_back(Qp(scq, rcq));
        qb.push_back(Qp(scq, rcq));
        ASSERT_TRUE(qa.back() && qb.back());
        Connect(qa.back(), qb.back(), 7, 1, 14, 7);
    }
    Buf *src = Mem((size_t)kWr * kQps), *dst = Mem((size_t)kWr * kQps);
    Fill(src, 7);
    uint64_t t0 = ote_now_ns();
    for (int i = 0; i < kQps; i++) {
        uint64_t off = (uint64_t)i * kWr;
        ASSERT_EQ(PostSend(qa[i], IBV_WR_RDMA_WRITE, src, off, kWr, 1 + i, dst->addr() + off,
                           dst->mr->rkey),
                  0);
    }
    auto s = Poll(scq, kQps, 120 * OTE_NSEC_PER_SEC);
    ASSERT_EQ(s.size(), (size_t)kQps);
    for (auto &wc : s) EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << "wc status " << wc.status;
    EXPECT_TRUE(src->mem == dst->mem);
    uint64_t n = (uint64_t)kWr * kQps;
    EXPECT_GE(ote_now_ns() - t0, (n - kSlow / 100) * 9 / 10 * OTE_NSEC_PER_SEC / kSlow);
}

TEST_F(SimBw, NoLimitAfterTheLimitIsRemovedAndBytesAreCounted) {
    ASSERT_EQ(ote_sim_set_port_bw(v_, dev_.c_str(), 1, 1000), OTE_OK); // 1 kB/s
    ASSERT_EQ(ote_sim_set_port_bw(v_, dev_.c_str(), 1, 0), OTE_OK);
    struct ibv_cq *scq = Cq(), *rcq = Cq();
    struct ibv_qp *a = Qp(scq, rcq), *b = Qp(scq, rcq);
    ASSERT_TRUE(a && b);
    Connect(a, b);
    const size_t n = (size_t)kWr * kWrs;
    Buf *src = Mem(n), *dst = Mem(n);
    Fill(src, 3);
    uint64_t tx0 = TxBytes(), pay0 = TxPayload();
    // At 1 kB/s this would take more than an hour: it finishes within the poll deadline
    // only because the limit is gone.
    Run(a, b, scq, rcq, IBV_WR_RDMA_WRITE, src, dst);
    EXPECT_TRUE(src->mem == dst->mem);
    EXPECT_GE(TxBytes() - tx0, (uint64_t)n);
    // The data exactly: the WRITEs' headers and their ACKs are not payload.
    EXPECT_EQ(TxPayload() - pay0, (uint64_t)n);
    EXPECT_GT(TxBytes() - tx0, TxPayload() - pay0);
}

} // namespace

// Grants without memory windows (engine/rdma/rdma_direct.c, rdma_grant_mode; issue 25
// part 2), two engines in this process over verbs/sim:
// - rdma_grant_mode=mr on both sides and mixed (mr source / mw requester, mw source / mr
//   requester): WRITE and READ, 1 byte to multi-MiB (several grants), every byte
//   checked; the mr source's exact MRs over host memory counted registered and
//   deregistered (none left, fds back to their count), the mw source makes none, a
//   requester never allocates a memory window, and one of an mr source asks on direct
//   slots first (nothing redirected).
// - Authority: a READ or WRITE one byte past the grant (inside the source's
//   registration) fails and the byte past is untouched; a 1-byte probe through the
//   grant's rkey, posted on the grant's QP just before its receipt, reaches the range,
//   and the same probe after the receipt fails.
// - The wire: the advertisement says rdma_grant_mr=1; a GRANT_REQ for host memory from a
//   requester that takes redirects gets the redirect, one that does not a refusal.
// - The "nomw" sim profile: auto chooses exact MRs (its INFO line, the counter) and moves
//   bytes; rdma_grant_mode=mw fails the engine's creation naming the key and device.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "tests/engine/ctl_peer.h"
#include "tests/engine/engine_util.h"
#include "tests/util/test_base.h"
#include "tests/util/wait.h"

extern "C" {
#include "base/log.h"
#include "base/time.h"
#include "engine/control/ctl.h"
#include "engine/rdma/test_hook.h"
#include "ote/ote.h"
#include "tests/engine/pattern.h"
}

namespace {

using ote_test::kSec;
using std::chrono::seconds;

constexpr uint64_t kProbeWrId = 0x70726f6265ull; // "probe": swallowed by SpyPoll

// A spy on the requester engine's sim provider: its ops table is replaced in place by a
// copy whose post_send can stretch the grant's last READ/WRITE by one byte, records the
// rkey, remote address and local SGE of the last READ/WRITE (and its QP), can put a 1-byte
// probe through that rkey just before the receipt (SEND_WITH_IMM), and whose poll_cq
// takes the probes' completions; alloc_mw is counted.
struct Spy {
    const ote_verbs_ops_t *orig = nullptr;
    ote_verbs_ops_t ops{};
    ote_verbs_t *v = nullptr;
    std::atomic<bool> stretch{false};
    std::atomic<uint64_t> stretch_end{0}; // the remote end of the request
    std::atomic<int> stretched{0};
    std::atomic<bool> probe_before_receipt{false};
    std::atomic<int> alloc_mw{0};
    std::mutex mu;
    struct ibv_qp *qp = nullptr;
    ibv_wr_opcode op = IBV_WR_RDMA_READ;
    uint32_t rkey = 0;
    uint64_t raddr = 0, laddr = 0;
    uint32_t lkey = 0;
    std::vector<int> probe_status; // IBV_WC_* of each probe, in completion order
};
Spy g_spy;

bool IsData(const ibv_send_wr *w) {
    return w->opcode == IBV_WR_RDMA_READ || w->opcode == IBV_WR_RDMA_WRITE;
}

// A 1-byte probe of the last recorded grant (its op, rkey, first byte).
ibv_send_wr ProbeWr(ibv_sge *sge) {
    ibv_send_wr w{};
    sge->addr = g_spy.laddr;
    sge->length = 1;
    sge->lkey = g_spy.lkey;
    w.wr_id = kProbeWrId;
    w.sg_list = sge;
    w.num_sge = 1;
    w.opcode = g_spy.op;
    w.send_flags = IBV_SEND_SIGNALED;
    w.wr.rdma.remote_addr = g_spy.raddr;
    w.wr.rdma.rkey = g_spy.rkey;
    return w;
}

int SpyPost(ote_verbs_t *v, struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
    // A copy of the chain (the caller's WRs stay as they are), one slot more for a probe.
    std::vector<ibv_send_wr> w;
    std::vector<ibv_send_wr *> orig;
    std::vector<ibv_sge> sges;
    size_t nsge = 1;
    for (ibv_send_wr *x = wr; x != nullptr; x = x->next) nsge += (size_t)x->num_sge;
    sges.reserve(nsge);
    w.reserve(64);
    ibv_sge probe_sge{};
    for (ibv_send_wr *x = wr; x != nullptr; x = x->next) {
        bool receipt = x->opcode == IBV_WR_SEND_WITH_IMM;
        if (receipt && g_spy.probe_before_receipt.load()) {
            std::lock_guard<std::mutex> l(g_spy.mu);
            if (g_spy.qp == qp) {
                w.push_back(ProbeWr(&probe_sge));
                orig.push_back(x);
            }
        }
        w.push_back(*x);
        orig.push_back(x);
        ibv_send_wr &c = w.back();
        size_t first = sges.size();
        for (int i = 0; i < x->num_sge; i++) sges.push_back(x->sg_list[i]);
        c.sg_list = x->num_sge > 0 ? &sges[first] : nullptr;
        if (!IsData(x) || x->num_sge != 1) continue;
        uint64_t end = x->wr.rdma.remote_addr + x->sg_list[0].length;
        if (g_spy.stretch.load() && end == g_spy.stretch_end.load()) {
            sges[first].length += 1; // one byte past the grant
            g_spy.stretched++;
        }
        std::lock_guard<std::mutex> l(g_spy.mu);
        g_spy.qp = qp;
        g_spy.op = x->opcode;
        g_spy.rkey = x->wr.rdma.rkey;
        g_spy.raddr = x->wr.rdma.remote_addr;
        g_spy.laddr = x->sg_list[0].addr;
        g_spy.lkey = x->sg_list[0].lkey;
    }
    for (size_t i = 0; i + 1 < w.size(); i++) w[i].next = &w[i + 1];
    if (!w.empty()) w.back().next = nullptr;
    ibv_send_wr *cbad = nullptr;
    int rc = g_spy.orig->post_send(v, qp, w.empty() ? wr : w.data(), &cbad);
    if (rc != 0 && bad != nullptr) {
        *bad = wr;
        for (size_t i = 0; i < w.size(); i++)
            if (cbad == &w[i]) *bad = orig[i];
    }
    return rc;
}

int SpyPoll(ote_verbs_t *v, struct ibv_cq *cq, int num, struct ibv_wc *wc) {
    int n = g_spy.orig->poll_cq(v, cq, num, wc);
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (wc[i].wr_id == kProbeWrId) {
            std::lock_guard<std::mutex> l(g_spy.mu);
            g_spy.probe_status.push_back((int)wc[i].status);
            continue;
        }
        wc[k++] = wc[i];
    }
    return n < 0 ? n : k;
}

int SpyAllocMw(ote_verbs_t *v, struct ibv_pd *pd, enum ibv_mw_type t, struct ibv_mw **out) {
    g_spy.alloc_mw++;
    return g_spy.orig->alloc_mw(v, pd, t, out);
}

ote_status_t WrapSpy(ote_verbs_t **v) {
    g_spy.orig = (*v)->ops;
    g_spy.ops = *(*v)->ops;
    g_spy.ops.post_send = SpyPost;
    g_spy.ops.poll_cq = SpyPoll;
    g_spy.ops.alloc_mw = SpyAllocMw;
    (*v)->ops = &g_spy.ops;
    g_spy.v = *v;
    return OTE_OK;
}

void SpyReset() {
    g_spy.stretch = false;
    g_spy.stretched = 0;
    g_spy.probe_before_receipt = false;
    g_spy.alloc_mw = 0;
    std::lock_guard<std::mutex> l(g_spy.mu);
    g_spy.qp = nullptr;
    g_spy.probe_status.clear();
}

std::vector<int> Probes() {
    std::lock_guard<std::mutex> l(g_spy.mu);
    return g_spy.probe_status;
}

ote_engine_t *Engine(const char *mode, const char *grant_max = "16M") {
    return ote_test::NewEngine({{"transport", "rdma"},
                                {"verbs_provider", "sim"},
                                {"transfer_timeout_ms", "20000"},
                                {"rdma_grant_max", grant_max},
                                {"rdma_grant_mode", mode}});
}

ote__rdma_test_grants_t Grants(ote_engine_t *e) {
    ote__rdma_test_grants_t g{};
    EXPECT_EQ(ote__rdma_test_grants(ote_test::EngineAddress(e).c_str(), &g), OTE_OK);
    return g;
}

// The source holds no exact MR, no live grant and no single MR.
bool SourceIdle(ote_engine_t *src) {
    return ote_test::WaitUntil(
        [&] {
            ote__rdma_test_grants_t g = Grants(src);
            return g.direct_mrs == 0 && g.live_source == 0 && g.mrs_single == 0 &&
                   g.direct_served == g.direct_released;
        },
        seconds(30), "the source's exact MRs and grants to end");
}

class RdmaGrantMrTest : public ote_test::OteTest {
  public:
    void Open(const char *src_mode, const char *req_mode, bool spy = true) {
        src_ = Engine(src_mode);
        ASSERT_NE(src_, nullptr);
        if (spy) ote__rdma_test_verbs_hook = WrapSpy;
        req_ = Engine(req_mode);
        ote__rdma_test_verbs_hook = nullptr;
        ASSERT_NE(req_, nullptr);
        SpyReset();
        ASSERT_EQ(ote_segment_open(req_, ote_test::EngineAddress(src_).c_str(), &seg_), OTE_OK);
    }
    void TearDown() override {
        if (seg_ != nullptr) {
            EXPECT_EQ(ote_segment_close(seg_), OTE_OK);
        }
        if (req_ != nullptr) {
            EXPECT_EQ(ote_engine_destroy(req_), OTE_OK);
        }
        if (src_ != nullptr) {
            EXPECT_EQ(ote_engine_destroy(src_), OTE_OK);
        }
        OteTest::TearDown();
    }
    ote_status_t Run(ote_opcode_t op, void *local, void *remote, size_t len,
                     ote_transfer_status_t *ts) {
        ote_request_t r = {op, local, seg_, (uint64_t)(uintptr_t)remote, len};
        return ote_test::RunOne(req_, r, 60 * kSec, ts);
    }
    // WRITE then READ of each length at offset off of the source's buffer, every byte
    // checked; the source's exact MRs over host memory counted (mr: at least one per
    // grant, all deregistered; mw: none).
    void MovesAndChecks(bool src_mr) {
        constexpr size_t kBuf = 40u << 20;
        std::vector<uint8_t> remote(kBuf, 0), local(kBuf), back(kBuf, 0);
        ote_pattern_fill(local.data(), kBuf, 7, 0);
        ASSERT_EQ(ote_memory_register(src_, remote.data(), kBuf, OTE_PERM_READ | OTE_PERM_WRITE),
                  OTE_OK);
        ASSERT_EQ(ote_memory_register(req_, local.data(), kBuf, OTE_PERM_READ), OTE_OK);
        ASSERT_EQ(ote_memory_register(req_, back.data(), kBuf, OTE_PERM_WRITE), OTE_OK);
        EXPECT_EQ(Grants(src_).grant_mode_mr, src_mr ? 1u : 0u);
        ote__rdma_test_grants_t g0 = Grants(src_);
        // Twice: the second pass ends with as many fds as the first (the direct slots'
        // QPs and PDs are a bounded cache; an MR or fd per grant would show).
        int fds1 = 0;
        for (int pass = 0; pass < 2; pass++) {
            const size_t lens[] = {1, 4096, 100000, 3u << 20, 36u << 20};
            size_t off = 17 + (size_t)pass * 8;
            for (size_t len : lens) {
                ote_transfer_status_t ts{};
                ASSERT_EQ(Run(OTE_WRITE, local.data() + off, remote.data() + off, len, &ts), OTE_OK)
                    << "WRITE of " << len << ": " << ote_status_str(ts.error);
                ASSERT_EQ(memcmp(remote.data() + off, local.data() + off, len), 0)
                    << "WRITE " << len;
                ASSERT_EQ(Run(OTE_READ, back.data() + off, remote.data() + off, len, &ts), OTE_OK)
                    << "READ of " << len << ": " << ote_status_str(ts.error);
                ASSERT_EQ(memcmp(back.data() + off, local.data() + off, len), 0) << "READ " << len;
                off += 4096 + 5;
            }
            ASSERT_TRUE(SourceIdle(src_));
            if (pass == 0) fds1 = ote_test::CountOpenFds();
        }
        EXPECT_EQ(ote_test::CountOpenFds(), fds1) << "fds grew with the grants";
        ASSERT_TRUE(SourceIdle(src_));
        ote__rdma_test_grants_t g1 = Grants(src_);
        uint64_t host_mrs = g1.direct_host_served - g0.direct_host_served;
        printf(
            "source %s: %llu exact MRs over host memory registered, %llu deregistered, "
            "%llu redirects\n",
            src_mr ? "mr" : "mw", (unsigned long long)host_mrs,
            (unsigned long long)(g1.direct_released - g0.direct_released),
            (unsigned long long)(g1.direct_redirects - g0.direct_redirects));
        if (src_mr) {
            // 20 requests; the 36 MiB ones take at least 3 grants each (16 MiB grants).
            EXPECT_GE(host_mrs, 28u);
            EXPECT_EQ(g1.direct_released - g0.direct_released, host_mrs) << "an MR leaked";
            // The requester saw rdma_grant_mr=1 and asks on direct slots first: nothing
            // is redirected (the redirect itself, for a requester that asks on a plain
            // slot, is HostGrantIsRedirectedOrRefusedOnTheWire's).
            EXPECT_EQ(g1.direct_redirects - g0.direct_redirects, 0u)
                << "a run was asked on a plain slot first";
            EXPECT_EQ(Grants(req_).direct_followed, 0u);
        } else {
            EXPECT_EQ(host_mrs, 0u) << "a window source made exact MRs";
        }
        EXPECT_EQ(g1.direct_mrs, 0u);
        EXPECT_EQ(g1.mrs_retained, 0u);
        EXPECT_EQ(g1.mrs_single, 0u);
        EXPECT_EQ(g_spy.alloc_mw.load(), 0) << "the requester allocated a memory window";
        EXPECT_EQ(ote_test::UnregisterWhenFree(src_, remote.data()), OTE_OK);
        EXPECT_EQ(ote_memory_unregister(req_, local.data()), OTE_OK);
        EXPECT_EQ(ote_memory_unregister(req_, back.data()), OTE_OK);
    }
    ote_engine_t *src_ = nullptr;
    ote_engine_t *req_ = nullptr;
    ote_segment_t *seg_ = nullptr;
};

TEST_F(RdmaGrantMrTest, MrOnBothSidesMovesEveryByte) {
    Open("mr", "mr");
    MovesAndChecks(true);
}

TEST_F(RdmaGrantMrTest, MrSourceAndWindowRequester) {
    Open("mr", "mw");
    MovesAndChecks(true);
}

TEST_F(RdmaGrantMrTest, WindowSourceAndMrRequester) {
    Open("mw", "mr");
    MovesAndChecks(false);
}

// One byte past the grant (still inside the source's registration): the stretched last
// READ or WRITE of the grant fails, the request fails, and the byte past is untouched. In
// both modes (a window is exact too); an unstretched request then moves.
void PastTheGrant(RdmaGrantMrTest *t, ote_engine_t *src, ote_engine_t *req, ote_opcode_t op) {
    constexpr size_t kLen = 256u << 10, kBuf = kLen + 8192;
    std::vector<uint8_t> remote(kBuf, 0xEE), local(kBuf, 0x11);
    ASSERT_EQ(ote_memory_register(src, remote.data(), kBuf, OTE_PERM_READ | OTE_PERM_WRITE),
              OTE_OK);
    ASSERT_EQ(ote_memory_register(req, local.data(), kBuf, OTE_PERM_READ | OTE_PERM_WRITE), OTE_OK);
    uint8_t *at = remote.data() + 4096;
    g_spy.stretch_end = (uint64_t)(uintptr_t)(at + kLen);
    g_spy.stretch = true;
    ote_transfer_status_t ts{};
    ote_status_t st = t->Run(op, local.data(), at, kLen, &ts);
    g_spy.stretch = false;
    EXPECT_GE(g_spy.stretched.load(), 1) << "no WR reached the grant's end";
    EXPECT_NE(st, OTE_OK) << "a " << (op == OTE_READ ? "READ" : "WRITE")
                          << " one byte past the grant succeeded";
    EXPECT_NE(ts.state, OTE_TRANSFER_COMPLETED);
    EXPECT_EQ(at[kLen], 0xEE) << "the byte past the grant was written";
    if (op == OTE_READ) {
        EXPECT_EQ(local[kLen], 0x11) << "the byte past the grant was read";
    }
    // The same request unstretched moves (a rebuilt QP).
    st = t->Run(op, local.data(), at, kLen, &ts);
    EXPECT_EQ(st, OTE_OK) << ote_status_str(ts.error);
    EXPECT_EQ(at[kLen], 0xEE);
    EXPECT_TRUE(SourceIdle(src));
    EXPECT_EQ(ote_test::UnregisterWhenFree(src, remote.data()), OTE_OK);
    EXPECT_EQ(ote_test::UnregisterWhenFree(req, local.data()), OTE_OK);
}

TEST_F(RdmaGrantMrTest, OneBytePastTheGrantFailsExactMr) {
    Open("mr", "mr");
    PastTheGrant(this, src_, req_, OTE_READ);
    PastTheGrant(this, src_, req_, OTE_WRITE);
}

TEST_F(RdmaGrantMrTest, OneBytePastTheGrantFailsWindow) {
    Open("mw", "mw");
    PastTheGrant(this, src_, req_, OTE_READ);
    PastTheGrant(this, src_, req_, OTE_WRITE);
}

// The grant's rkey reaches its range while the grant lives (a probe posted on its QP just
// before the receipt succeeds), and nothing after the receipt (the same probe, once the
// source deregistered the MR, fails; a WRITE probe changes no byte).
void ReplayAfterReceipt(ote_engine_t *src, ote_engine_t *req, ote_segment_t *seg, ote_opcode_t op) {
    constexpr size_t kLen = 128u << 10;
    std::vector<uint8_t> remote(kLen, 0x5A), local(kLen, 0x5A);
    ASSERT_EQ(ote_memory_register(src, remote.data(), kLen, OTE_PERM_READ | OTE_PERM_WRITE),
              OTE_OK);
    ASSERT_EQ(ote_memory_register(req, local.data(), kLen, OTE_PERM_READ | OTE_PERM_WRITE), OTE_OK);
    SpyReset();
    g_spy.probe_before_receipt = true;
    ote_request_t r = {op, local.data(), seg, (uint64_t)(uintptr_t)remote.data(), kLen};
    ote_transfer_status_t ts{};
    ASSERT_EQ(ote_test::RunOne(req, r, 60 * kSec, &ts), OTE_OK) << ote_status_str(ts.error);
    g_spy.probe_before_receipt = false;
    ASSERT_TRUE(ote_test::WaitUntil([] { return !Probes().empty(); }, seconds(10),
                                    "the probe before the receipt"));
    EXPECT_EQ(Probes()[0], IBV_WC_SUCCESS) << "the live grant's rkey did not reach its range";
    ASSERT_TRUE(SourceIdle(src)); // the receipt ended the grant: its MR is gone
    // The replay: the same rkey on the same QP, after the receipt.
    local[0] = 0xA5;
    ibv_sge sge{};
    ibv_send_wr w{}, *bad = nullptr;
    struct ibv_qp *qp = nullptr;
    {
        std::lock_guard<std::mutex> l(g_spy.mu);
        ASSERT_NE(g_spy.qp, nullptr);
        w = ProbeWr(&sge);
        qp = g_spy.qp;
    }
    ASSERT_EQ(g_spy.orig->post_send(g_spy.v, qp, &w, &bad), 0);
    ASSERT_TRUE(ote_test::WaitUntil([] { return Probes().size() >= 2; }, seconds(20),
                                    "the replay's completion"));
    EXPECT_NE(Probes()[1], IBV_WC_SUCCESS) << "a replayed rkey reached the range after the receipt";
    EXPECT_EQ(remote[0], 0x5A) << "a replayed WRITE landed";
    EXPECT_EQ(ote_test::UnregisterWhenFree(src, remote.data()), OTE_OK);
    EXPECT_EQ(ote_test::UnregisterWhenFree(req, local.data()), OTE_OK);
}

TEST_F(RdmaGrantMrTest, ReplayedRkeyAfterTheReceiptFailsRead) {
    Open("mr", "mr");
    ReplayAfterReceipt(src_, req_, seg_, OTE_READ);
}

TEST_F(RdmaGrantMrTest, ReplayedRkeyAfterTheReceiptFailsWrite) {
    Open("mr", "mr");
    ReplayAfterReceipt(src_, req_, seg_, OTE_WRITE);
}

// "nomw" devices (no type-2 windows): auto grants by exact MRs (said at INFO, counted) and
// moves bytes both ways; mw is refused at creation, naming the key and the device.
class RdmaNomwTest : public RdmaGrantMrTest {
  protected:
    void SetUp() override {
        RdmaGrantMrTest::SetUp();
        level_ = ote_log_level();
        ote_log_set_level(OTE_LOG_INFO); // the mode's INFO lines
        setenv("OTE_SIM_PROFILE", "nomw", 1);
    }
    void TearDown() override {
        unsetenv("OTE_SIM_PROFILE");
        ote_log_set_level(level_);
        RdmaGrantMrTest::TearDown();
    }
    ote_log_level_t level_ = OTE_LOG_WARN;
};

TEST_F(RdmaNomwTest, AutoChoosesExactMrsAndMoves) {
    Open("auto", "auto");
    EXPECT_TRUE(LogContains("host memory is granted by exact MRs"));
    EXPECT_TRUE(LogContains("grants host memory by exact MRs (rdma_grant_mr=1)"));
    EXPECT_EQ(Grants(src_).grant_mode_mr, 1u);
    EXPECT_EQ(Grants(req_).grant_mode_mr, 1u);
    MovesAndChecks(true);
}

TEST_F(RdmaNomwTest, MwModeFailsCreationNamingKeyAndDevice) {
    ote_config_t *cfg = ote_test::RdmaConfig();
    ASSERT_EQ(ote_config_set(cfg, "rdma_grant_mode", "mw"), OTE_OK);
    ote_engine_t *e = nullptr;
    ote_status_t st = OTE_OK;
    ExpectErrorLogsIn([&] { st = ote_engine_create(cfg, &e); });
    ote_config_destroy(cfg);
    EXPECT_EQ(ote_status_code(st), OTE_ERR_UNSUPPORTED) << ote_status_str(st);
    EXPECT_EQ(e, nullptr);
    bool named = false;
    for (const std::string &l : Logs())
        named |= l.find("rdma_grant_mode=mw") != std::string::npos &&
                 l.find("sim0") != std::string::npos;
    EXPECT_TRUE(named) << "no line names the key and the device";
}

// The wire, against a raw requester: the advertisement, the redirect of a host GRANT_REQ
// to a direct slot for a requester that takes it (UNSUPPORTED, rkey 1), and a plain
// refusal (rkey 0) for one that does not.
std::vector<uint8_t> RawFrame(uint64_t req_id, const std::vector<uint8_t> &body) {
    ote_ctl_msg_t m = {};
    m.version = 1;
    m.opcode = OTE_CTL_RDMA;
    m.req_id = req_id;
    m.u.rdma.body = body.data();
    m.u.rdma.len = (uint32_t)body.size();
    return ote_test::Encode(m);
}

TEST_F(RdmaGrantMrTest, HostGrantIsRedirectedOrRefusedOnTheWire) {
    src_ = Engine("mr");
    ASSERT_NE(src_, nullptr);
    std::vector<uint8_t> mem(1u << 20, 0);
    ASSERT_EQ(ote_memory_register(src_, mem.data(), mem.size(), OTE_PERM_READ), OTE_OK);
    int fd = ote_test::ConnectTo(ote_test::EngineAddress(src_));
    ASSERT_GE(fd, 0);
    static const char kAddr[] = "127.0.0.1:1";
    ote_ctl_msg_t h = {};
    h.version = 1;
    h.opcode = OTE_CTL_HELLO;
    h.u.hello.min_version = 1;
    h.u.hello.max_version = 1;
    h.u.hello.role = 2;
    h.u.hello.addr = kAddr;
    h.u.hello.addr_len = sizeof(kAddr) - 1;
    ASSERT_TRUE(ote_test::SendAll(fd, ote_test::Encode(h)));
    std::vector<uint8_t> buf;
    ote_ctl_msg_t m;
    ASSERT_TRUE(ote_test::ReadFrame(fd, &buf, &m));
    std::string info(m.u.hello_ack.info != nullptr ? m.u.hello_ack.info : "",
                     m.u.hello_ack.info_len);
    EXPECT_NE(info.find("rdma_grant_mr=1"), std::string::npos) << info;
    std::vector<uint8_t> ib(28, 0); // INFO: type 1, process, pd, nic, lanes
    ib[0] = 1;
    ib[20] = 1;
    ib[24] = 2;
    ASSERT_TRUE(ote_test::SendAll(fd, RawFrame(1, ib)));
    ASSERT_TRUE(ote_test::ReadFrame(fd, &buf, &m));
    auto grant = [&](uint32_t op_word, uint64_t uid) {
        std::vector<uint8_t> g(60, 0);
        g[0] = 5; // GRANT_REQ, short form
        uint32_t qpn = 77;
        uint64_t at = (uint64_t)(uintptr_t)mem.data(), len = 4096;
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
    // READ (op 0) with DIRECT_OK (0x100), on a plain slot: the redirect.
    ASSERT_TRUE(ote_test::SendAll(fd, RawFrame(2, grant(0x100, 11))));
    ASSERT_TRUE(ote_test::ReadFrame(fd, &buf, &m));
    EXPECT_EQ(m.req_id, 2u);
    EXPECT_EQ(ote_status_code(m.status), OTE_ERR_UNSUPPORTED);
    uint32_t rkey = 0;
    ASSERT_GE(m.u.rdma.len, 8u);
    memcpy(&rkey, m.u.rdma.body + 4, 4);
    EXPECT_EQ(rkey, 1u) << "not the redirect to a direct slot";
    // Without DIRECT_OK: refused, no redirect.
    ASSERT_TRUE(ote_test::SendAll(fd, RawFrame(3, grant(0x0, 12))));
    ASSERT_TRUE(ote_test::ReadFrame(fd, &buf, &m));
    EXPECT_EQ(m.req_id, 3u);
    EXPECT_EQ(ote_status_code(m.status), OTE_ERR_UNSUPPORTED);
    ASSERT_GE(m.u.rdma.len, 8u);
    memcpy(&rkey, m.u.rdma.body + 4, 4);
    EXPECT_EQ(rkey, 0u) << "a requester that takes no redirect was redirected";
    EXPECT_TRUE(LogContains("grants host memory by exact MRs (rdma_grant_mode mr"));
    close(fd);
    EXPECT_EQ(ote_test::UnregisterWhenFree(src_, mem.data()), OTE_OK);
}

} // namespace

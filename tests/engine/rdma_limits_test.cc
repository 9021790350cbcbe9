// RDMA credits and aggregate limits (engine/rdma/rdma_credits.h), engine to engine in this
// process over verbs/sim:
// - grant credits: 64 concurrent requests over two peers with rdma_max_grants=2 queue and
//   complete (WRITE, then READ back, bytes checked); never more than 2 grants reserved or
//   live at once; the same load without the limit has more than 2 grants live at once;
// - receive credits: a source with rdma_recv_slots=2 under many concurrent grants refuses
//   what it has no receive slot for (AGAIN), the requester asks again, every request
//   completes, and the sim sent no RNR NAK;
// - rollback: a fault on the source's receive admission returns the grant (its pin and
//   the requester's reservation), counters back to zero, and the next request works;
// - rdma_max_qps=1 with two peers: both complete, the second peer's QP built after an
//   idle one was retired;
// - rdma_max_qps at a source: 2 QPs for 3 requesters, each CONNECT past it retiring an
//   idle source QP (the requesters rebuild theirs after a cache miss), every request
//   complete and never more than 2 QPs held; with no idle source QP the CONNECT is
//   refused AGAIN until the request's deadline (OTE_ERR_TIMEOUT), and then works;
// - rdma_max_send_wrs=2: 64 concurrent requests complete with at most 2 send WRs
//   outstanding in each engine;
// - whole parents at the source (engine/rdma/rdma_src_parents.h): a parent of 4 grants
//   reserves 4 credits and 4 receive slots at its first grant, all returned when it
//   ends (at most a QP's receive slots); grants without a parent are served per grant;
//   parents take turns for a small rdma_max_served_grants pool; a refused reservation is
//   asked again (or the request fails TIMEOUT at its deadline); a budget past the pool is
//   refused TOO_BIG at once; a parent whose grants fail midway returns its reservation.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/engine/engine_util.h"
#include "tests/util/wait.h"

extern "C" {
#include "base/fault.h"
#include "base/time.h"
#include "engine/rdma/test_hook.h"
#include "ote/ote.h"
#include "tests/engine/pattern.h"
#include "verbs/sim/sim.h"
}

namespace {

using ote_test::WaitUntil;

constexpr uint64_t kSec = 1000000000ull;

std::string Addr(ote_engine_t *e) {
    char addr[300];
    EXPECT_EQ(ote_engine_address(e, addr, sizeof(addr)), OTE_OK);
    return addr;
}

ote__rdma_test_grants_t Grants(ote_engine_t *e) {
    ote__rdma_test_grants_t g;
    memset(&g, 0, sizeof(g));
    EXPECT_EQ(ote__rdma_test_grants(Addr(e).c_str(), &g), OTE_OK);
    return g;
}

ote_test::ConfigKv Rdma(std::initializer_list<std::pair<const char *, const char *>> extra = {}) {
    ote_test::ConfigKv kv = {
        {"transport", "rdma"}, {"verbs_provider", "sim"}, {"transfer_timeout_ms", "120000"}};
    for (const auto &x : extra) kv.push_back(x);
    return kv;
}

// One requester, nsrc sources, n requests of len bytes (request j to source j % nsrc):
// WRITE all in one batch, then READ all back, each request checked COMPLETED with its
// bytes, and the memory compared.
class Rig {
  public:
    Rig(const ote_test::ConfigKv &req_cfg, const ote_test::ConfigKv &src_cfg, int nsrc, size_t n,
        uint64_t len)
        : nsrc_(nsrc), n_(n), len_(len) {
        for (int i = 0; i < nsrc_; i++) src_.push_back(ote_test::NewEngine(src_cfg));
        req_ = ote_test::NewEngine(req_cfg);
        per_src_ = (n_ + nsrc_ - 1) / nsrc_ * len_;
        for (int i = 0; i < nsrc_; i++) smem_.emplace_back(per_src_, 0);
        out_.resize(n_ * len_);
        back_.assign(n_ * len_, 0);
        ote_pattern_fill(out_.data(), out_.size(), 77, 0);
    }
    void Open() {
        ASSERT_NE(req_, nullptr);
        for (int i = 0; i < nsrc_; i++) {
            ASSERT_NE(src_[i], nullptr);
            ASSERT_EQ(ote_memory_register(src_[i], smem_[i].data(), per_src_,
                                          OTE_PERM_READ | OTE_PERM_WRITE),
                      OTE_OK);
            ote_segment_t *s = nullptr;
            ASSERT_EQ(ote_segment_open(req_, Addr(src_[i]).c_str(), &s), OTE_OK);
            seg_.push_back(s);
        }
        ASSERT_EQ(ote_memory_register(req_, out_.data(), out_.size(), OTE_PERM_READ), OTE_OK);
        ASSERT_EQ(ote_memory_register(req_, back_.data(), back_.size(), OTE_PERM_WRITE), OTE_OK);
    }
    uint8_t *Remote(size_t j) { return smem_[j % nsrc_].data() + j / nsrc_ * len_; }
    // Requests [first, first + count) of op in one batch; each must end with `want`.
    void Run(ote_opcode_t op, size_t first, size_t count, ote_status_t want = OTE_OK) {
        std::vector<ote_request_t> r(count);
        for (size_t i = 0; i < count; i++) {
            size_t j = first + i;
            uint8_t *local = (op == OTE_WRITE ? out_.data() : back_.data()) + j * len_;
            r[i] = {op, local, seg_[j % nsrc_], (uint64_t)(uintptr_t)Remote(j), len_};
        }
        ote_batch_t *b = nullptr;
        ASSERT_EQ(ote_batch_create(req_, count, &b), OTE_OK);
        ASSERT_EQ(ote_batch_submit(b, r.data(), count), OTE_OK);
        ote_status_t ws = ote_batch_wait(b, ote_deadline_after(180 * kSec));
        if (want == OTE_OK) {
            EXPECT_EQ(ws, OTE_OK);
        }
        for (size_t i = 0; i < count; i++) {
            ote_transfer_status_t ts;
            ASSERT_EQ(ote_batch_status(b, i, &ts), OTE_OK);
            if (want == OTE_OK) {
                EXPECT_EQ(ts.state, OTE_TRANSFER_COMPLETED)
                    << i << ": " << ote_status_str(ts.error);
                EXPECT_EQ(ts.bytes_done, len_) << i;
            } else {
                EXPECT_EQ(ts.state, ote_status_code(want) == OTE_ERR_TIMEOUT ? OTE_TRANSFER_TIMEOUT
                                                                             : OTE_TRANSFER_FAILED)
                    << i;
                EXPECT_EQ(ote_status_code(ts.error), ote_status_code(want))
                    << i << ": " << ote_status_str(ts.error);
            }
        }
        EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    }
    void RunAll() {
        Run(OTE_WRITE, 0, n_);
        Run(OTE_READ, 0, n_);
        Check(0, n_);
    }
    void Check(size_t first, size_t count) {
        for (size_t j = first; j < first + count; j++) {
            ASSERT_EQ(memcmp(Remote(j), out_.data() + j * len_, len_), 0) << "WRITE " << j;
            ASSERT_EQ(memcmp(back_.data() + j * len_, out_.data() + j * len_, len_), 0)
                << "READ " << j;
        }
    }
    ~Rig() {
        for (ote_segment_t *s : seg_) EXPECT_EQ(ote_segment_close(s), OTE_OK);
        if (req_ != nullptr) {
            EXPECT_EQ(ote_engine_destroy(req_), OTE_OK);
        }
        for (ote_engine_t *e : src_) {
            if (e != nullptr) {
                EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
            }
        }
    }
    ote_engine_t *req_ = nullptr;
    std::vector<ote_engine_t *> src_;
    int nsrc_;
    size_t n_;
    uint64_t len_;
    uint64_t per_src_ = 0;
    std::vector<std::vector<uint8_t>> smem_;
    std::vector<ote_segment_t *> seg_;
    std::vector<uint8_t> out_, back_;
};

// Every grant and reservation of the requester given back, no source grant left.
void ExpectDrained(const Rig &rig) {
    ote__rdma_test_grants_t g = Grants(rig.req_);
    EXPECT_EQ(g.grants_live, 0u);
    EXPECT_EQ(g.grants_reserved, 0u);
    EXPECT_EQ(g.parents, 0u);
    EXPECT_EQ(g.live_requester, 0u);
    EXPECT_EQ(g.inflight_now, 0u);
    for (ote_engine_t *s : rig.src_) {
        // A source grant ends with its receipt, whose receive completion the source may
        // handle just after the requester saw its SEND complete: waited for (generously).
        EXPECT_TRUE(WaitUntil([&] { return Grants(s).live_source == 0; }, std::chrono::seconds(60),
                              "no live source grant"));
    }
}

constexpr size_t kN = 64;
constexpr uint64_t kLen = 256ull << 10; // one grant per request

// Without a grant limit the same load has more than two grants live at once: the limit
// below is what keeps it at two.
TEST(RdmaLimitsTest, WithoutGrantLimitMoreThanTwoGrantsLive) {
    Rig rig(Rdma(), Rdma(), 2, kN, kLen);
    rig.Open();
    rig.RunAll();
    ote__rdma_test_grants_t g = Grants(rig.req_);
    EXPECT_GT(g.grants_peak, 2u) << "64 concurrent requests never had 3 grants live";
    EXPECT_EQ(g.grant_waits, 0u);
    EXPECT_EQ(g.reserved_peak, 0u) << "no pool without rdma_max_grants";
    ExpectDrained(rig);
}

TEST(RdmaLimitsTest, SixtyFourRequestsQueueForTwoGrantCredits) {
    Rig rig(Rdma({{"rdma_max_grants", "2"}}), Rdma(), 2, kN, kLen);
    rig.Open();
    rig.RunAll();
    ote__rdma_test_grants_t g = Grants(rig.req_);
    EXPECT_LE(g.grants_peak, 2u) << "more grants live than credits";
    EXPECT_LE(g.reserved_peak, 2u) << "more credits reserved than the pool";
    EXPECT_GE(g.reserved_peak, 1u);
    EXPECT_GT(g.grant_waits, 0u) << "64 requests never waited for 2 credits";
    ExpectDrained(rig);
}

// A request larger than one grant reserves its whole budget (capped by the pool) before
// its first grant: with 4 credits, 8 requests of 4 grants each, never more than 4 live.
TEST(RdmaLimitsTest, MultiGrantRequestsReserveTheirBudget) {
    Rig rig(Rdma({{"rdma_max_grants", "4"}, {"rdma_grant_max", "1M"}}), Rdma(), 2, 8, 4ull << 20);
    rig.Open();
    rig.RunAll();
    ote__rdma_test_grants_t g = Grants(rig.req_);
    EXPECT_LE(g.grants_peak, 4u);
    EXPECT_EQ(g.reserved_peak, 4u) << "a request of 4 grants reserves 4 credits at once";
    ExpectDrained(rig);
}

// Two receive slots per QP at the source (one lane: one QP per peer and capability):
// grants past them are refused AGAIN before anything is bound and asked again; all
// complete and no receipt ever met an empty receive queue.
TEST(RdmaLimitsTest, FewReceiveSlotsManyGrantsNoRnr) {
    uint64_t rnr0 = ote_sim_rnr_naks();
    {
        // Two receive slots for every QP of the source: its lane's SRQ and its own.
        auto cfg = Rdma({{"rdma_recv_slots", "2"}, {"rdma_srq_slots", "2"}, {"rdma_lanes", "1"}});
        Rig rig(cfg, cfg, 1, kN, kLen);
        rig.Open();
        rig.RunAll();
        ote__rdma_test_grants_t g = Grants(rig.req_);
        ote__rdma_test_grants_t sg = Grants(rig.src_[0]);
        EXPECT_GT(sg.src_rq_busy, 0u) << "64 concurrent grants never met 2 receive slots full";
        EXPECT_GT(g.busy_retries, 0u);
        ExpectDrained(rig);
    }
    EXPECT_EQ(ote_sim_rnr_naks(), rnr0) << "a receipt met an empty receive queue";
}

// The source's receive admission fails: the grant is refused before any window exists,
// its pin and the requester's reservation are given back. AGAIN: asked again, completes;
// any other failure: the request fails, and the next one works.
TEST(RdmaLimitsTest, ReceiveAdmissionFaultRollsBack) {
    Rig rig(Rdma({{"rdma_max_grants", "2"}}), Rdma(), 1, 4, kLen);
    rig.Open();
    ASSERT_EQ(ote_fault_arm("qp.rq_admit", OTE_FAULT_NTH, 1, OTE_ERR_AGAIN, 0), OTE_OK);
    rig.Run(OTE_WRITE, 0, 1);
    EXPECT_EQ(ote_fault_failures("qp.rq_admit"), 1u);
    ote__rdma_test_grants_t g = Grants(rig.req_);
    EXPECT_GE(g.busy_retries, 1u);
    EXPECT_GE(Grants(rig.src_[0]).src_rq_busy, 1u);
    ExpectDrained(rig);

    ASSERT_EQ(ote_fault_arm("qp.rq_admit", OTE_FAULT_EVERY, 0, OTE_ERR_FAULT, 0), OTE_OK);
    rig.Run(OTE_WRITE, 1, 1, OTE_ERR_REMOTE_ACCESS);
    EXPECT_GE(ote_fault_failures("qp.rq_admit"), 1u);
    ASSERT_EQ(ote_fault_disarm("qp.rq_admit"), OTE_OK);
    ExpectDrained(rig);

    rig.Run(OTE_WRITE, 1, 3);
    rig.Run(OTE_READ, 0, 4);
    rig.Check(0, 4);
    ExpectDrained(rig);
}

// One QP for the whole engine and two peers: the second peer's build waits for the first
// peer's QP to go idle, which is retired for it; both peers' requests complete.
TEST(RdmaLimitsTest, OneQpTwoPeersBothComplete) {
    Rig rig(Rdma({{"rdma_max_qps", "1"}, {"rdma_lanes", "1"}}), Rdma({{"rdma_lanes", "1"}}), 2, 16,
            kLen);
    rig.Open();
    rig.RunAll();
    ote__rdma_test_grants_t g = Grants(rig.req_);
    EXPECT_LE(g.qps, 1u);
    EXPECT_GE(g.qp_evictions, 1u) << "two peers shared one QP without a retirement";
    ExpectDrained(rig);
}

// A QP the limit cannot take back: the requester is also a source, and its one QP (a
// source QP, never retired for a build) is in use by another requester. Its own request
// waits for a QP and fails at its deadline with OTE_ERR_TIMEOUT (never hangs); once the
// other requester is gone (its source QP destroyed) the next request works.
TEST(RdmaLimitsTest, OneQpHeldElsewhereFailsAtTheDeadlineThenWorks) {
    Rig rig(Rdma({{"rdma_max_qps", "1"}, {"rdma_lanes", "1"}, {"transfer_timeout_ms", "2000"}}),
            Rdma({{"rdma_lanes", "1"}}), 1, 2, kLen);
    rig.Open();
    // Another engine reads from the requester: the requester builds a source QP for it.
    ote_engine_t *x = ote_test::NewEngine(Rdma({{"rdma_lanes", "1"}}));
    ASSERT_NE(x, nullptr);
    std::vector<uint8_t> xbuf(kLen, 0);
    ASSERT_EQ(ote_memory_register(x, xbuf.data(), kLen, OTE_PERM_WRITE), OTE_OK);
    ote_segment_t *xs = nullptr;
    ASSERT_EQ(ote_segment_open(x, Addr(rig.req_).c_str(), &xs), OTE_OK);
    ote_request_t xr = {OTE_READ, xbuf.data(), xs, (uint64_t)(uintptr_t)rig.out_.data(), kLen};
    ote_batch_t *b = nullptr;
    ASSERT_EQ(ote_batch_create(x, 1, &b), OTE_OK);
    ASSERT_EQ(ote_batch_submit(b, &xr, 1), OTE_OK);
    ASSERT_EQ(ote_batch_wait(b, ote_deadline_after(120 * kSec)), OTE_OK);
    EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    EXPECT_EQ(memcmp(xbuf.data(), rig.out_.data(), kLen), 0);
    EXPECT_GE(Grants(rig.req_).qps, 1u); // source QPs: x's, one per device it used

    rig.Run(OTE_WRITE, 0, 1, OTE_ERR_TIMEOUT);
    ote__rdma_test_grants_t g = Grants(rig.req_);
    EXPECT_GT(g.qp_waits, 0u);
    EXPECT_GE(g.qps, 1u);
    EXPECT_EQ(g.qp_builds, 0u) << "a requester QP was built past rdma_max_qps";
    ExpectDrained(rig);

    EXPECT_EQ(ote_segment_close(xs), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(x), OTE_OK);
    // The requester's source endpoints for x are evicted and their QP destroyed.
    ASSERT_TRUE(WaitUntil([&] { return Grants(rig.req_).qps == 0; }, std::chrono::seconds(60),
                          "the requester's QPs for x destroyed"));
    rig.Run(OTE_WRITE, 0, 2);
    rig.Run(OTE_READ, 0, 2);
    rig.Check(0, 2);
    ExpectDrained(rig);
}

// rdma_max_send_wrs=2 at both ends: 64 concurrent requests over two peers (each grant's
// chain of slices longer than the credits, so posts go in part and wait) all complete,
// bytes checked, and neither engine ever had more than 2 send WRs outstanding; every
// credit is back once they ended.
TEST(RdmaLimitsTest, SixtyFourRequestsShareTwoSendCredits) {
    Rig rig(Rdma({{"rdma_max_send_wrs", "2"}}), Rdma({{"rdma_max_send_wrs", "2"}}), 2, kN, kLen);
    rig.Open();
    rig.RunAll();
    ote__rdma_test_grants_t g = Grants(rig.req_);
    EXPECT_LE(g.sq_peak, 2u) << "more send WRs outstanding than rdma_max_send_wrs";
    EXPECT_GE(g.sq_peak, 1u);
    EXPECT_GT(g.sq_waits, 0u) << "no post waited for a send credit";
    ExpectDrained(rig);
    EXPECT_EQ(Grants(rig.req_).sq_in_use, 0u);
    for (ote_engine_t *s : rig.src_) {
        ote__rdma_test_grants_t gs = Grants(s);
        EXPECT_LE(gs.sq_peak, 2u);
        EXPECT_EQ(gs.sq_in_use, 0u);
    }
}

// One request of op between a requester's buffer and a source's: COMPLETED with its
// bytes, or ending with want (its state and status).
void RunOneRequest(ote_engine_t *req, ote_segment_t *seg, ote_opcode_t op, uint8_t *local,
                   uint8_t *remote, uint64_t len, ote_status_t want = OTE_OK) {
    ote_request_t r = {op, local, seg, (uint64_t)(uintptr_t)remote, len};
    ote_transfer_status_t ts;
    memset(&ts, 0, sizeof(ts));
    (void)ote_test::RunOne(req, r, 180 * kSec, &ts);
    if (want == OTE_OK) {
        EXPECT_EQ(ts.state, OTE_TRANSFER_COMPLETED) << ote_status_str(ts.error);
        EXPECT_EQ(ts.bytes_done, len);
    } else {
        EXPECT_EQ(ts.state, OTE_TRANSFER_TIMEOUT) << ote_status_str(ts.error);
        EXPECT_EQ(ote_status_code(ts.error), ote_status_code(want)) << ote_status_str(ts.error);
    }
}

// rdma_max_qps at the source: a source that may hold 2 QPs serves 3 requesters (one
// device, one lane: a READ and a WRITE QP each), one after another and then the first
// again. Each CONNECT past the limit retires the idle QPs of the requester before (once
// its grace passed; until then it is refused AGAIN and asked again), whose next request
// meets a cache miss and rebuilds them. Every request completes with its bytes, and the
// source never held more than 2 QPs.
TEST(RdmaLimitsTest, SourceQpLimitRetiresIdleSourceQpsForThreeRequesters) {
    ote_test::ConfigKv scfg =
        Rdma({{"rdma_lanes", "1"}, {"rdma_devices", "sim0"}, {"rdma_max_qps", "2"}});
    ote_engine_t *src = ote_test::NewEngine(scfg);
    ASSERT_NE(src, nullptr);
    constexpr int kReq = 3;
    std::vector<uint8_t> smem(kReq * kLen, 0);
    ASSERT_EQ(ote_memory_register(src, smem.data(), smem.size(), OTE_PERM_READ | OTE_PERM_WRITE),
              OTE_OK);
    std::vector<ote_engine_t *> req;
    std::vector<ote_segment_t *> seg;
    std::vector<std::vector<uint8_t>> out(kReq), back(kReq);
    for (int i = 0; i < kReq; i++) {
        req.push_back(ote_test::NewEngine(Rdma({{"rdma_lanes", "1"}, {"rdma_devices", "sim0"}})));
        ASSERT_NE(req[i], nullptr);
        out[i].resize(kLen);
        back[i].assign(kLen, 0);
        ASSERT_EQ(ote_memory_register(req[i], out[i].data(), kLen, OTE_PERM_READ), OTE_OK);
        ASSERT_EQ(ote_memory_register(req[i], back[i].data(), kLen, OTE_PERM_WRITE), OTE_OK);
        ote_segment_t *s = nullptr;
        ASSERT_EQ(ote_segment_open(req[i], Addr(src).c_str(), &s), OTE_OK);
        seg.push_back(s);
    }
    const int order[] = {0, 1, 2, 0};
    uint64_t seed = 500;
    for (int i : order) {
        SCOPED_TRACE("requester " + std::to_string(i));
        ote_pattern_fill(out[i].data(), kLen, ++seed, 0);
        uint8_t *remote = smem.data() + i * kLen;
        RunOneRequest(req[i], seg[i], OTE_WRITE, out[i].data(), remote, kLen);
        ASSERT_EQ(memcmp(remote, out[i].data(), kLen), 0);
        std::fill(back[i].begin(), back[i].end(), 0);
        RunOneRequest(req[i], seg[i], OTE_READ, back[i].data(), remote, kLen);
        ASSERT_EQ(memcmp(back[i].data(), out[i].data(), kLen), 0);
        EXPECT_LE(Grants(src).qps, 2u);
    }
    ote__rdma_test_grants_t g = Grants(src);
    EXPECT_LE(g.qps_peak, 2u) << "the source held more QPs than rdma_max_qps";
    EXPECT_GE(g.qps_peak, 2u);
    EXPECT_GE(g.src_qp_evictions, 4u) << "each later requester's two QPs retired idle ones";
    for (int i = 0; i < kReq; i++) {
        EXPECT_EQ(ote_segment_close(seg[i]), OTE_OK);
        EXPECT_EQ(ote_engine_destroy(req[i]), OTE_OK);
    }
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
}

// A source at rdma_max_qps=1 whose one QP is not a source QP (it reads from another
// engine itself): no idle source QP to retire, so a requester's CONNECT is refused AGAIN
// until the request's deadline, which ends it with OTE_ERR_TIMEOUT (no byte moved, the
// submitter never blocked); once that QP is gone the next request works.
TEST(RdmaLimitsTest, SourceQpLimitRefusesUntilTheDeadlineThenWorks) {
    ote_engine_t *src = ote_test::NewEngine(
        Rdma({{"rdma_lanes", "1"}, {"rdma_devices", "sim0"}, {"rdma_max_qps", "1"}}));
    ote_engine_t *x = ote_test::NewEngine(Rdma({{"rdma_lanes", "1"}, {"rdma_devices", "sim0"}}));
    // Its deadline (transfer_timeout_ms) the last of the key: 1.5 s.
    ote_engine_t *req = ote_test::NewEngine(
        Rdma({{"rdma_lanes", "1"}, {"rdma_devices", "sim0"}, {"transfer_timeout_ms", "1500"}}));
    ASSERT_NE(src, nullptr);
    ASSERT_NE(x, nullptr);
    ASSERT_NE(req, nullptr);
    std::vector<uint8_t> smem(kLen, 0), xmem(kLen), out(kLen);
    ote_pattern_fill(xmem.data(), kLen, 61, 0);
    ote_pattern_fill(out.data(), kLen, 62, 0);
    ASSERT_EQ(ote_memory_register(src, smem.data(), kLen, OTE_PERM_READ | OTE_PERM_WRITE), OTE_OK);
    ASSERT_EQ(ote_memory_register(x, xmem.data(), kLen, OTE_PERM_READ), OTE_OK);
    ASSERT_EQ(ote_memory_register(req, out.data(), kLen, OTE_PERM_READ), OTE_OK);
    // The source reads from x: its one QP is a requester QP.
    ote_segment_t *sx = nullptr;
    ASSERT_EQ(ote_segment_open(src, Addr(x).c_str(), &sx), OTE_OK);
    RunOneRequest(src, sx, OTE_READ, smem.data(), xmem.data(), kLen);
    ASSERT_EQ(memcmp(smem.data(), xmem.data(), kLen), 0);
    ASSERT_EQ(Grants(src).qps, 1u);

    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_segment_open(req, Addr(src).c_str(), &seg), OTE_OK);
    RunOneRequest(req, seg, OTE_WRITE, out.data(), smem.data(), kLen, OTE_ERR_TIMEOUT);
    EXPECT_EQ(memcmp(smem.data(), xmem.data(), kLen), 0) << "a refused WRITE moved bytes";
    ote__rdma_test_grants_t g = Grants(src);
    EXPECT_GT(g.src_qp_refusals, 0u);
    EXPECT_EQ(g.src_qp_evictions, 0u);
    EXPECT_LE(g.qps_peak, 1u);

    // The source's requester QP goes with its segment (its endpoints evicted, reclaimed).
    EXPECT_EQ(ote_segment_close(sx), OTE_OK);
    ASSERT_TRUE(WaitUntil([&] { return Grants(src).qps == 0; }, std::chrono::seconds(60),
                          "the source's requester QP destroyed"));
    RunOneRequest(req, seg, OTE_WRITE, out.data(), smem.data(), kLen);
    EXPECT_EQ(memcmp(smem.data(), out.data(), kLen), 0);
    EXPECT_LE(Grants(src).qps_peak, 1u);
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(x), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
}

// Whole-parent reservation at the source (engine/rdma/rdma_src_parents.h): every parent
// reservation of the source returned, its grant credits and receive slots back to zero
// (a parent ends with its request's account, just after its last receipt: waited for).
void ExpectSourceParentsReturned(ote_engine_t *src) {
    WaitUntil([&] { return Grants(src).sp_parents == 0; }, std::chrono::seconds(60),
              "every parent reservation of the source returned");
    ote__rdma_test_grants_t g = Grants(src);
    EXPECT_EQ(g.sp_parents, 0u);
    EXPECT_EQ(g.sp_credits, 0u);
    EXPECT_EQ(g.sp_rq, 0u);
}

constexpr uint64_t kParentLen = 4ull << 20; // four grants of rdma_grant_max 1M

// A parent of 4 grants (rdma_max_grants 4 at the requester) reserves, at its first
// grant, 4 grant credits and 4 receive slots at the source; every grant of it is served
// on its reservation (or per grant), and all of it returns when the request ends.
TEST(RdmaLimitsTest, SourceReservesAParentsWholeBudgetAtItsFirstGrant) {
    Rig rig(Rdma({{"rdma_max_grants", "4"}, {"rdma_grant_max", "1M"}}), Rdma(), 1, 1, kParentLen);
    rig.Open();
    rig.Run(OTE_WRITE, 0, 1);
    ote__rdma_test_grants_t s = Grants(rig.src_[0]);
    EXPECT_EQ(s.sp_rq_peak, 4u) << "a parent of 4 grants reserves 4 receive slots";
    EXPECT_EQ(s.sp_credits_peak, 4u);
    EXPECT_GE(s.sp_served + s.sp_per_grant, 4u) << "its grants did not carry their parent";
    EXPECT_GE(s.sp_served, 1u);
    EXPECT_EQ(s.sp_refused, 0u);
    ExpectSourceParentsReturned(rig.src_[0]);
    EXPECT_GE(Grants(rig.src_[0]).sp_ended, 1u);
    rig.Run(OTE_READ, 0, 1);
    rig.Check(0, 1);
    ExpectDrained(rig);
    ExpectSourceParentsReturned(rig.src_[0]);
    EXPECT_EQ(Grants(rig.src_[0]).sp_rq_peak, 4u);
}

// A parent larger than a QP's receive slots (4 grants, rdma_recv_slots 2 at the source)
// reserves all of that QP's slots, not more, and still completes (its grants past them,
// on other QPs or later, admitted per grant or on slots that came back).
TEST(RdmaLimitsTest, ParentPastAQpsSlotsReservesThemAll) {
    Rig rig(Rdma({{"rdma_max_grants", "4"}, {"rdma_grant_max", "1M"}}),
            Rdma({{"rdma_recv_slots", "2"}}), 1, 1, kParentLen);
    rig.Open();
    // The WRITE's parent is returned before the READ's is made: the two (on the WRITE and
    // the READ QPs) never overlap, so the peak is one parent's (it once read 4, the
    // WRITE's reservation not yet returned when the READ's came).
    rig.Run(OTE_WRITE, 0, 1);
    ExpectSourceParentsReturned(rig.src_[0]);
    ote__rdma_test_grants_t s = Grants(rig.src_[0]);
    EXPECT_EQ(s.sp_rq_peak, 2u);
    EXPECT_EQ(s.sp_credits_peak, 4u);
    rig.Run(OTE_READ, 0, 1);
    rig.Check(0, 1);
    ExpectDrained(rig);
    ExpectSourceParentsReturned(rig.src_[0]);
    s = Grants(rig.src_[0]);
    EXPECT_EQ(s.sp_rq_peak, 2u);
    EXPECT_EQ(s.sp_credits_peak, 4u);
}

// A requester without rdma_max_grants names no parent (the old GRANT_REQ forms): the
// source serves it per grant, as before, and reserves nothing.
TEST(RdmaLimitsTest, GrantsWithoutAParentAreServedPerGrant) {
    Rig rig(Rdma({{"rdma_grant_max", "1M"}}), Rdma({{"rdma_max_served_grants", "1"}}), 1, 2,
            kParentLen);
    rig.Open();
    rig.RunAll();
    ote__rdma_test_grants_t s = Grants(rig.src_[0]);
    EXPECT_EQ(s.sp_rq_peak, 0u);
    EXPECT_EQ(s.sp_credits_peak, 0u);
    EXPECT_EQ(s.sp_served + s.sp_per_grant + s.sp_refused, 0u);
    ExpectDrained(rig);
}

// The source's pool (rdma_max_served_grants 4) holds one parent of 4 at a time: 8
// concurrent parents of 4 grants each take turns (the others are refused AGAIN and ask
// again), never more than 4 credits reserved, and all complete with their bytes.
TEST(RdmaLimitsTest, ParentsTakeTurnsForTheSourcesPool) {
    Rig rig(Rdma({{"rdma_max_grants", "16"}, {"rdma_grant_max", "1M"}}),
            Rdma({{"rdma_max_served_grants", "4"}}), 1, 8, kParentLen);
    rig.Open();
    rig.RunAll();
    ote__rdma_test_grants_t s = Grants(rig.src_[0]);
    EXPECT_LE(s.sp_credits_peak, 4u) << "more credits reserved than the source's pool";
    EXPECT_EQ(s.sp_credits_peak, 4u);
    EXPECT_GE(s.sp_ended, 16u) << "8 WRITE and 8 READ parents";
    ExpectDrained(rig);
    ExpectSourceParentsReturned(rig.src_[0]);
}

// A parent's reservation refused (AGAIN) is asked again by the requester and then made;
// refused until the request's deadline, the request fails OTE_ERR_TIMEOUT (never hangs)
// and nothing stays reserved on either side.
TEST(RdmaLimitsTest, RefusedParentReservationIsAskedAgainOrTimesOut) {
    Rig rig(
        Rdma({{"rdma_max_grants", "4"}, {"rdma_grant_max", "1M"}, {"transfer_timeout_ms", "1500"}}),
        Rdma(), 1, 2, kParentLen);
    rig.Open();
    ASSERT_EQ(ote_fault_arm("rdma.sp_reserve", OTE_FAULT_NTH, 1, OTE_ERR_AGAIN, 0), OTE_OK);
    rig.Run(OTE_WRITE, 0, 1);
    EXPECT_EQ(ote_fault_failures("rdma.sp_reserve"), 1u);
    EXPECT_GE(Grants(rig.req_).busy_retries, 1u);
    EXPECT_GE(Grants(rig.src_[0]).sp_refused, 1u);
    ExpectDrained(rig);
    ExpectSourceParentsReturned(rig.src_[0]);

    ASSERT_EQ(ote_fault_arm("rdma.sp_reserve", OTE_FAULT_EVERY, 0, OTE_ERR_AGAIN, 0), OTE_OK);
    rig.Run(OTE_WRITE, 1, 1, OTE_ERR_TIMEOUT);
    EXPECT_GE(ote_fault_failures("rdma.sp_reserve"), 1u);
    ASSERT_EQ(ote_fault_disarm("rdma.sp_reserve"), OTE_OK);
    ExpectDrained(rig);
    ExpectSourceParentsReturned(rig.src_[0]);

    rig.Run(OTE_WRITE, 1, 1);
    rig.Run(OTE_READ, 0, 2);
    rig.Check(0, 2);
    ExpectDrained(rig);
    ExpectSourceParentsReturned(rig.src_[0]);
}

// A budget larger than the source's whole pool can never be reserved there: refused at
// once (OTE_ERR_TOO_BIG), not asked again to the deadline; nothing stays reserved.
TEST(RdmaLimitsTest, BudgetPastTheSourcesPoolIsRefusedAtOnce) {
    Rig rig(Rdma({{"rdma_max_grants", "4"}, {"rdma_grant_max", "1M"}}),
            Rdma({{"rdma_max_served_grants", "2"}}), 1, 1, kParentLen);
    rig.Open();
    rig.Run(OTE_WRITE, 0, 1, OTE_ERR_TOO_BIG);
    EXPECT_GE(Grants(rig.src_[0]).sp_refused, 1u);
    ExpectDrained(rig);
    ExpectSourceParentsReturned(rig.src_[0]);
}

// A requester whose grants fail mid-parent (the source's receive admission fails from
// the grant after the reservation on): the request fails, the source's reservation is
// returned (counters back to zero), and the next request works.
TEST(RdmaLimitsTest, ParentFailingMidwayReturnsItsReservation) {
    Rig rig(Rdma({{"rdma_max_grants", "4"}, {"rdma_grant_max", "1M"}, {"rdma_lanes", "1"}}),
            Rdma({{"rdma_lanes", "1"}}), 1, 1, kParentLen);
    rig.Open();
    // Build every QP of both devices first: a QP built while the fault below is armed
    // cannot be built at all, and its build then waits out connect deadlines (once seen
    // to take 120 s under ASan) instead of testing the reservation's return.
    rig.Run(OTE_WRITE, 0, 1);
    ExpectDrained(rig);
    ExpectSourceParentsReturned(rig.src_[0]);
    // Hits 1..4: the parent's reservation; 5: its first grant's admission; the rest fail.
    ASSERT_EQ(ote_fault_arm("qp.rq_admit", OTE_FAULT_FROM, 6, OTE_ERR_FAULT, 0), OTE_OK);
    rig.Run(OTE_WRITE, 0, 1, OTE_ERR_REMOTE_ACCESS);
    EXPECT_GE(ote_fault_failures("qp.rq_admit"), 1u);
    ASSERT_EQ(ote_fault_disarm("qp.rq_admit"), OTE_OK);
    EXPECT_EQ(Grants(rig.src_[0]).sp_rq_peak, 4u);
    ExpectDrained(rig);
    ExpectSourceParentsReturned(rig.src_[0]);
    rig.Run(OTE_WRITE, 0, 1);
    rig.Run(OTE_READ, 0, 1);
    rig.Check(0, 1);
    ExpectDrained(rig);
    ExpectSourceParentsReturned(rig.src_[0]);
}

// A requester process killed mid-parent: the source saw its parent's reservation, then
// the requester (a child forked before any engine of this test exists, its sim ports
// limited to 50 MB/s so that its 64 MiB WRITE of 64 grants of 1 MiB lasts) is killed with
// SIGKILL. Its control connection ends and the source returns the parent's reservation
// (and ends its live grants): counters back to zero, the memory unregisters.
TEST(RdmaLimitsTest, RequesterKilledMidParentReturnsTheReservation) {
    constexpr uint64_t kBig = 64ull << 20;
    int to_child[2];
    ASSERT_EQ(pipe(to_child), 0);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        close(to_child[1]);
        setenv("OTE_SIM_CONFIG",
               "dev=sim0;port,bw=50M;gid=auto-ll,type=v1;gid=auto-ll,type=v2;gid=auto-v4,"
               "type=v1;gid=auto-v4,type=v2;dev=sim1;port,bw=50M;gid=auto-ll,type=v1;"
               "gid=auto-ll,type=v2;gid=auto-v4,type=v1;gid=auto-v4,type=v2",
               1);
        char addr[300] = {0};
        uint64_t remote = 0;
        if (read(to_child[0], addr, sizeof(addr)) != (ssize_t)sizeof(addr) ||
            read(to_child[0], &remote, sizeof(remote)) != (ssize_t)sizeof(remote))
            _exit(2);
        ote_engine_t *req =
            ote_test::NewEngine(Rdma({{"rdma_max_grants", "4"}, {"rdma_grant_max", "1M"}}));
        std::vector<uint8_t> out(kBig, 5);
        ote_segment_t *seg = nullptr;
        if (req == nullptr || ote_memory_register(req, out.data(), kBig, OTE_PERM_READ) != OTE_OK ||
            ote_segment_open(req, addr, &seg) != OTE_OK)
            _exit(3);
        ote_request_t r = {OTE_WRITE, out.data(), seg, remote, kBig};
        ote_batch_t *b = nullptr;
        if (ote_batch_create(req, 1, &b) != OTE_OK || ote_batch_submit(b, &r, 1) != OTE_OK)
            _exit(4);
        (void)ote_batch_wait(b, ote_deadline_after(120 * kSec)); // killed before it ends
        _exit(5);
    }
    close(to_child[0]);
    ote_engine_t *src = ote_test::NewEngine(Rdma());
    ASSERT_NE(src, nullptr);
    std::vector<uint8_t> mem(kBig, 0);
    ASSERT_EQ(ote_memory_register(src, mem.data(), kBig, OTE_PERM_WRITE), OTE_OK);
    char addr[300] = {0};
    ASSERT_EQ(ote_engine_address(src, addr, sizeof(addr)), OTE_OK);
    uint64_t remote = (uint64_t)(uintptr_t)mem.data();
    ASSERT_EQ(write(to_child[1], addr, sizeof(addr)), (ssize_t)sizeof(addr));
    ASSERT_EQ(write(to_child[1], &remote, sizeof(remote)), (ssize_t)sizeof(remote));
    close(to_child[1]);
    // Its parent's reservation is made here at its first grant.
    int wst = 0;
    pid_t gone = 0;
    WaitUntil(
        [&] {
            if (Grants(src).sp_parents != 0) return true;
            gone = waitpid(pid, &wst, WNOHANG);
            return gone != 0;
        },
        std::chrono::seconds(60), "the child requester's parent reservation");
    EXPECT_EQ(gone, 0) << "the requester ended before its parent was reserved: " << wst;
    EXPECT_EQ(Grants(src).sp_parents, 1u);
    EXPECT_EQ(Grants(src).sp_rq, 4u) << "a parent of 4 grants holds 4 receive slots";
    if (gone == 0) {
        ASSERT_EQ(kill(pid, SIGKILL), 0);
        ASSERT_EQ(waitpid(pid, &wst, 0), pid);
    }
    ExpectSourceParentsReturned(src);
    EXPECT_TRUE(WaitUntil([&] { return Grants(src).live_source == 0; }, std::chrono::seconds(60),
                          "no live source grant"));
    EXPECT_GE(Grants(src).sp_ended, 1u);
    // The dead requester's pin of the range is released with its connection.
    EXPECT_EQ(ote_test::UnregisterWhenFree(src, mem.data(), std::chrono::seconds(60)), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
}

TEST(RdmaLimitsTest, RefusesMalformedKeys) {
    ote_config_t *cfg = nullptr;
    ASSERT_EQ(ote_config_create(&cfg), OTE_OK);
    EXPECT_EQ(ote_config_set(cfg, "rdma_max_grants", "many"), OTE_ERR_INVALID);
    EXPECT_EQ(ote_config_set(cfg, "rdma_max_grants", "2"), OTE_OK);
    EXPECT_EQ(ote_config_set(cfg, "rdma_recv_slots", "0"), OTE_ERR_INVALID);
    EXPECT_EQ(ote_config_set(cfg, "rdma_recv_slots", "2"), OTE_OK);
    EXPECT_EQ(ote_config_set(cfg, "rdma_max_qps", "-1"), OTE_ERR_INVALID);
    EXPECT_EQ(ote_config_set(cfg, "rdma_max_qps", "1"), OTE_OK);
    EXPECT_EQ(ote_config_set(cfg, "rdma_max_send_wrs", "x"), OTE_ERR_INVALID);
    EXPECT_EQ(ote_config_set(cfg, "rdma_max_send_wrs", "2"), OTE_OK);
    EXPECT_EQ(ote_config_set(cfg, "rdma_max_served_grants", "65537"), OTE_ERR_INVALID);
    EXPECT_EQ(ote_config_set(cfg, "rdma_max_served_grants", "4"), OTE_OK);
    ote_config_destroy(cfg);
}

} // namespace

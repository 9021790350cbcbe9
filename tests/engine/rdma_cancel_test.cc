// RDMA cancel and the release of source grants, engine to engine in this process over
// verbs/sim (each engine its own sim instance with the default two devices, every port
// limited to kRate bytes/s of egress with the sim's bw limit, so that a 256 MiB request
// is still on the wire when it is canceled).
//
// Cancel mid-flight, WRITE and READ: the request ends CANCELED (not an error) within a
// generous deadline and only once nothing of it can still move (no grant of it is live
// at the requester, its data sender sends nothing more, its destination stays as it is); the guard bytes around
// the destination range are untouched on both sides and every changed byte lies inside
// the range (holding either the old or the transferred value); the source's grants end
// (its live grant count reaches 0 well before transfer_timeout_ms, 60 s) and its range
// can be unregistered; a follow-up request over the same peer moves every byte.
// Abandoned grants: a requester whose request passes its own (short) deadline tells the
// source (RELEASE) once its WRs under each answered grant have ended, and the source ends
// those grants at once, not at its own 60 s deadline; a grant that ended before its answer
// came (the source's bind held past the requester's deadline) releases the window the
// late answer names.
// Nothing here times anything beyond "well before 60 s": deadlines are generous for a
// loaded 2-core machine.
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/engine/engine_util.h"
#include "tests/util/test_base.h"
#include "tests/util/wait.h"

extern "C" {
#include "base/time.h"
#include "engine/rdma/test_hook.h"
#include "ote/ote.h"
#include "tests/engine/pattern.h"
#include "verbs/sim/sim.h"
#include "verbs/verbs.h"
}

namespace {

constexpr uint64_t kMs = 1000000ull;
constexpr uint64_t kSec = 1000 * kMs;
// The request, and the rate per port that makes it take > 2.5 s: halved both under
// ThreadSanitizer (which checks every byte the sim moves and the fills and checks
// touch), so that the request takes as long and a cancel still finds most of it to do.
constexpr uint64_t kLen = ote_test::TsanScaled(256ull << 20, 2);
constexpr uint64_t kGuard = 1ull << 20;                       // guard bytes on each side of a range
constexpr uint64_t kRate = ote_test::TsanScaled(50000000, 2); // 50 MB/s per port

// The sim instances of the engines created while the hook is set, in creation order.
std::vector<ote_verbs_t *> *g_sims = nullptr;
ote_status_t KeepSim(ote_verbs_t **v) {
    if (g_sims != nullptr) g_sims->push_back(*v);
    return OTE_OK;
}

// The source's provider for RdmaLateAnswerTest: its sim, except that one BIND_MW post
// can be held (the answer of that grant comes only once the test lets it go, bounded by
// 30 s). The engine owns it; close() closes the sim.
struct HoldingSim {
    ote_verbs_t v{};
    ote_verbs_ops_t ops{};
    ote_verbs_t *sim = nullptr;
    std::atomic<bool> arm{false}, holding{false}, release{false};
};
HoldingSim *g_hold = nullptr;

int HoldPostSend(ote_verbs_t *v, struct ibv_qp *qp, struct ibv_send_wr *wr,
                 struct ibv_send_wr **bad) {
    HoldingSim *h = g_hold;
    if (h == nullptr || &h->v != v) return EINVAL;
    if (wr != nullptr && wr->opcode == IBV_WR_BIND_MW && h->arm.exchange(false)) {
        h->holding = true;
        ote_test::WaitUntil([h] { return h->release.load(); }, std::chrono::seconds(30),
                            "the test to release the held bind");
    }
    return h->sim->ops->post_send(h->sim, qp, wr, bad);
}

void HoldClose(ote_verbs_t *v) {
    HoldingSim *h = g_hold;
    if (h != nullptr && &h->v == v) ote_verbs_close(h->sim);
}

ote_status_t HoldFirstSim(ote_verbs_t **v) {
    if (g_sims != nullptr) g_sims->push_back(*v);
    if (g_hold == nullptr || g_hold->sim != nullptr) return OTE_OK; /* the source only */
    g_hold->sim = *v;
    g_hold->ops = *(*v)->ops;
    g_hold->ops.post_send = HoldPostSend;
    g_hold->v.ops = &g_hold->ops;
    g_hold->v.provider = (*v)->provider;
    g_hold->v.priv = (*v)->priv;
    g_hold->v.close = HoldClose;
    *v = &g_hold->v;
    return OTE_OK;
}

std::string EngineAddr(ote_engine_t *e) {
    char addr[300];
    EXPECT_EQ(ote_engine_address(e, addr, sizeof(addr)), OTE_OK);
    return addr;
}

// Seeds of the patterns.
constexpr uint64_t kSrcGuard = 11, kLocGuard = 12;

class RdmaCancelTest : public ote_test::OteTest {
  protected:
    void SetUp() override {
        OteTest::SetUp();
        g_sims = &sims_;
        ote__rdma_test_verbs_hook = hook_;
        src_ = Create(src_timeout_);
        req_ = Create(req_timeout_);
        ote__rdma_test_verbs_hook = nullptr;
        g_sims = nullptr;
        ASSERT_NE(src_, nullptr);
        ASSERT_NE(req_, nullptr);
        ASSERT_EQ(sims_.size(), 2u);
        for (ote_verbs_t *v : sims_) ASSERT_TRUE(ote_sim_is_sim(v));
        SetRate(rate_);
        src_addr_ = EngineAddr(src_);
        src_mem_.resize(kLen + 2 * kGuard);
        loc_mem_.resize(kLen + 2 * kGuard);
        ASSERT_EQ(ote_memory_register(src_, src_mem_.data(), src_mem_.size(),
                                      OTE_PERM_READ | OTE_PERM_WRITE),
                  OTE_OK);
        ASSERT_EQ(ote_memory_register(req_, loc_mem_.data(), loc_mem_.size(),
                                      OTE_PERM_READ | OTE_PERM_WRITE),
                  OTE_OK);
        ASSERT_EQ(ote_segment_open(req_, src_addr_.c_str(), &seg_), OTE_OK);
    }
    void TearDown() override {
        ote__rdma_test_verbs_hook = nullptr;
        if (seg_ != nullptr) {
            EXPECT_EQ(ote_segment_close(seg_), OTE_OK);
        }
        if (req_ != nullptr) {
            EXPECT_EQ(ote_memory_unregister(req_, loc_mem_.data()), OTE_OK);
            EXPECT_EQ(ote_engine_destroy(req_), OTE_OK);
        }
        if (src_ != nullptr) {
            (void)ote_memory_unregister(src_, src_mem_.data()); // may be unregistered
            EXPECT_EQ(ote_engine_destroy(src_), OTE_OK);
        }
        OteTest::TearDown();
    }

    static ote_engine_t *Create(const char *timeout_ms) {
        ote_config_t *cfg = nullptr;
        EXPECT_EQ(ote_config_create(&cfg), OTE_OK);
        EXPECT_EQ(ote_config_set(cfg, "transport", "rdma"), OTE_OK);
        EXPECT_EQ(ote_config_set(cfg, "verbs_provider", "sim"), OTE_OK);
        EXPECT_EQ(ote_config_set(cfg, "transfer_timeout_ms", timeout_ms), OTE_OK);
        ote_engine_t *e = nullptr;
        EXPECT_EQ(ote_engine_create(cfg, &e), OTE_OK);
        ote_config_destroy(cfg);
        return e;
    }

    // Every port of both engines' sims limited to rate bytes/s (0: unlimited).
    void SetRate(uint64_t rate) {
        for (ote_verbs_t *v : sims_)
            for (const char *dev : {"sim0", "sim1"})
                ASSERT_EQ(ote_sim_set_port_bw(v, dev, 1, rate), OTE_OK) << dev;
    }

    // Payload bytes (data: no header, ACK, NAK or word of a dropped request) the ports of
    // sims_[i] (0: the source's, 1: the requester's) have sent. A responder may still answer
    // a request it read before the end with a header (ci: 40 bytes, one frame header).
    uint64_t TxBytes(size_t i) {
        uint64_t all = 0;
        for (const char *dev : {"sim0", "sim1"}) {
            uint64_t n = 0;
            EXPECT_EQ(ote_sim_port_tx_payload_bytes(sims_[i], dev, 1, &n), OTE_OK);
            all += n;
        }
        return all;
    }

    // Right after the request ended: no grant of it is left at the requester, and for a
    // while after (300 ms) the side that sends its data (sender: index into sims_) sends
    // nothing more and the destination range does not change. Nothing here can fail
    // because the machine is slow: a late byte can only go unseen.
    void NothingMovesAfterTheEnd(size_t sender, const std::vector<uint8_t> &dst) {
        ote__rdma_test_grants_t rg{};
        ASSERT_EQ(ote__rdma_test_grants(EngineAddr(req_).c_str(), &rg), OTE_OK);
        EXPECT_EQ(rg.live_requester, 0u) << "the request ended with a grant of it still live";
        uint64_t tx0 = TxBytes(sender), h0 = ote_hash(dst.data(), dst.size());
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        EXPECT_EQ(TxBytes(sender), tx0) << "data was still sent after the request ended";
        EXPECT_EQ(ote_hash(dst.data(), dst.size()), h0) << "bytes landed after the request ended";
    }

    uint8_t *Src() { return src_mem_.data() + kGuard; }
    uint8_t *Loc() { return loc_mem_.data() + kGuard; }
    uint64_t SrcAddr() { return (uint64_t)(uintptr_t)Src(); }

    // buf: guards of seed guard around a range of seed range.
    static void Fill(std::vector<uint8_t> &buf, uint64_t guard, uint64_t range) {
        ote_pattern_fill(buf.data(), kGuard, guard, 0);
        ote_pattern_fill(buf.data() + kGuard, kLen, range, 0);
        ote_pattern_fill(buf.data() + kGuard + kLen, kGuard, guard, kGuard);
    }

    // The guards of buf (seed guard) are intact.
    static bool GuardsIntact(const std::vector<uint8_t> &buf, uint64_t guard) {
        std::vector<uint8_t> want(2 * kGuard);
        ote_pattern_fill(want.data(), 2 * kGuard, guard, 0);
        return memcmp(buf.data(), want.data(), kGuard) == 0 &&
               memcmp(buf.data() + kGuard + kLen, want.data() + kGuard, kGuard) == 0;
    }

    // Every byte of the range of buf holds the pattern `before` or the pattern `after`
    // at its offset: *changed counts those that hold `after` only. False at the first
    // byte that holds neither.
    static bool RangeOldOrNew(const std::vector<uint8_t> &buf, uint64_t before, uint64_t after,
                              uint64_t *changed) {
        constexpr size_t kChunk = 64u << 10;
        std::vector<uint8_t> a(kChunk), b(kChunk);
        *changed = 0;
        for (uint64_t off = 0; off < kLen; off += kChunk) {
            const uint8_t *p = buf.data() + kGuard + off;
            ote_pattern_fill(a.data(), kChunk, before, off);
            if (memcmp(p, a.data(), kChunk) == 0) continue;
            ote_pattern_fill(b.data(), kChunk, after, off);
            if (memcmp(p, b.data(), kChunk) == 0) {
                *changed += kChunk;
                continue;
            }
            for (size_t i = 0; i < kChunk; i++) {
                if (p[i] == a[i]) continue;
                if (p[i] != b[i]) {
                    ADD_FAILURE() << "byte " << off + i << " of the range holds neither value";
                    return false;
                }
                (*changed)++;
            }
        }
        return true;
    }

    ote__rdma_test_grants_t SrcGrants() {
        ote__rdma_test_grants_t g{};
        EXPECT_EQ(ote__rdma_test_grants(src_addr_.c_str(), &g), OTE_OK);
        return g;
    }

    // The source's live grants reach 0 within 10 s (its transfer_timeout_ms is 60 s).
    bool SourceGrantsEnd() {
        return ote_test::WaitUntil([&] { return SrcGrants().live_source == 0; },
                                   std::chrono::seconds(10), "no live source grant");
    }

    // The source's range is unregistered within 10 s (nothing pins it any more), then
    // registered again.
    bool SourceRangeFree() {
        if (ote_test::UnregisterWhenFree(src_, src_mem_.data(), std::chrono::seconds(10)) != OTE_OK)
            return false;
        return ote_memory_register(src_, src_mem_.data(), src_mem_.size(),
                                   OTE_PERM_READ | OTE_PERM_WRITE) == OTE_OK;
    }

    // Submits one kLen request (op) between the ranges; once some of it is done, and
    // while it is still pending, cancels its batch (when cancel) and waits for it to end
    // (60 s at most). Returns its final status; *live_seen: the source's live grants seen
    // while it ran.
    ote_transfer_status_t RunAndCancel(ote_opcode_t op, bool cancel, uint64_t *live_seen) {
        ote_batch_t *b = nullptr;
        EXPECT_EQ(ote_batch_create(req_, 1, &b), OTE_OK);
        ote_request_t r = {op, Loc(), seg_, SrcAddr(), kLen};
        EXPECT_EQ(ote_batch_submit(b, &r, 1), OTE_OK);
        ote_transfer_status_t ts = {};
        *live_seen = 0;
        ote_test::WaitUntil(
            [&] {
                EXPECT_EQ(ote_batch_status(b, 0, &ts), OTE_OK);
                uint64_t live = SrcGrants().live_source;
                if (live > *live_seen) *live_seen = live;
                return ts.state != OTE_TRANSFER_PENDING || (cancel && ts.bytes_done > 0);
            },
            std::chrono::seconds(60),
            cancel ? "some bytes of the request done" : "the request's end");
        if (cancel) {
            EXPECT_EQ(ts.state, OTE_TRANSFER_PENDING) << "the request ended before its cancel";
            EXPECT_EQ(ote_batch_cancel(b), OTE_OK);
        }
        // The wait's status is the request's error (CANCELED, TIMEOUT): its state says
        // whether it ended.
        (void)ote_batch_wait(b, 60 * kSec);
        EXPECT_EQ(ote_batch_status(b, 0, &ts), OTE_OK);
        EXPECT_NE(ts.state, OTE_TRANSFER_PENDING) << "the batch did not end within 60 s";
        if (ts.state != OTE_TRANSFER_PENDING) {
            EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
        }
        return ts;
    }

    // One request of the first len bytes of the ranges, waited for.
    void Whole(ote_opcode_t op, uint64_t len = kLen) {
        ote_batch_t *b = nullptr;
        ASSERT_EQ(ote_batch_create(req_, 1, &b), OTE_OK);
        ote_request_t r = {op, Loc(), seg_, SrcAddr(), len};
        ASSERT_EQ(ote_batch_submit(b, &r, 1), OTE_OK);
        EXPECT_EQ(ote_batch_wait(b, 120 * kSec), OTE_OK);
        ote_transfer_status_t ts;
        EXPECT_EQ(ote_batch_status(b, 0, &ts), OTE_OK);
        EXPECT_EQ(ts.state, OTE_TRANSFER_COMPLETED) << ote_status_str(ts.error);
        EXPECT_EQ(ts.bytes_done, len);
        EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    }

    uint64_t rate_ = kRate;
    ote_status_t (*hook_)(ote_verbs_t **v) = KeepSim;
    const char *src_timeout_ = "60000";
    const char *req_timeout_ = "60000";
    std::vector<ote_verbs_t *> sims_; // [0] the source's, [1] the requester's
    ote_engine_t *src_ = nullptr, *req_ = nullptr;
    ote_segment_t *seg_ = nullptr;
    std::string src_addr_;
    std::vector<uint8_t> src_mem_, loc_mem_;
};

// WRITE canceled mid-flight: CANCELED, only bytes inside the range changed at the source
// (each to the written value), nothing at the requester; the source's grants end and its
// range is free; a WRITE of the whole range then lands intact.
TEST_F(RdmaCancelTest, WriteCanceledMidFlight) {
    constexpr uint64_t kOld = 21, kNew = 22;
    Fill(src_mem_, kSrcGuard, kOld);
    Fill(loc_mem_, kLocGuard, kNew);
    uint64_t live = 0;
    ote_transfer_status_t ts = RunAndCancel(OTE_WRITE, true, &live);
    ASSERT_NO_FATAL_FAILURE(NothingMovesAfterTheEnd(1, src_mem_));
    EXPECT_EQ(ts.state, OTE_TRANSFER_CANCELED) << ote_status_str(ts.error);
    EXPECT_EQ(ote_status_code(ts.error), OTE_ERR_CANCELED) << ote_status_str(ts.error);
    EXPECT_LT(ts.bytes_done, kLen) << "nothing was left to cancel";
    EXPECT_GE(live, 1u) << "no source grant was ever seen live";
    // Source: guards intact, the range old or new byte by byte, some of it written.
    EXPECT_TRUE(GuardsIntact(src_mem_, kSrcGuard)) << "bytes outside the range were written";
    uint64_t changed = 0;
    EXPECT_TRUE(RangeOldOrNew(src_mem_, kOld, kNew, &changed));
    EXPECT_GE(changed, ts.bytes_done) << "bytes reported done did not land";
    EXPECT_LT(changed, kLen) << "the whole range was written although canceled mid-flight";
    // Requester: a WRITE only reads its buffer.
    std::vector<uint8_t> want(loc_mem_.size());
    Fill(want, kLocGuard, kNew);
    EXPECT_EQ(memcmp(loc_mem_.data(), want.data(), want.size()), 0) << "a WRITE changed its source";
    // The source's grants ended and nothing pins its range, long before its 60 s deadline.
    EXPECT_TRUE(SourceGrantsEnd()) << SrcGrants().live_source << " source grant(s) still live";
    EXPECT_TRUE(SourceRangeFree()) << "the canceled WRITE left the source's range pinned";
    ote__rdma_test_grants_t rg{};
    ASSERT_EQ(ote__rdma_test_grants(EngineAddr(req_).c_str(), &rg), OTE_OK);
    EXPECT_EQ(rg.live_requester, 0u);
    std::printf("[ figures ] WRITE canceled after %llu of %llu bytes; %llu bytes landed\n",
                (unsigned long long)ts.bytes_done, (unsigned long long)kLen,
                (unsigned long long)changed);
    // The next request on the same peer moves every byte.
    SetRate(0);
    constexpr uint64_t kNext = 23;
    Fill(loc_mem_, kLocGuard, kNext);
    ASSERT_NO_FATAL_FAILURE(Whole(OTE_WRITE));
    EXPECT_TRUE(GuardsIntact(src_mem_, kSrcGuard));
    EXPECT_TRUE(RangeOldOrNew(src_mem_, kNext, kNext, &changed));
}

// READ canceled mid-flight: CANCELED, only bytes inside the requester's range changed
// (each to the source's value), nothing at the source; the source's grants end and its
// range is free; a READ of the whole range then brings every byte.
TEST_F(RdmaCancelTest, ReadCanceledMidFlight) {
    constexpr uint64_t kOld = 31, kSrc = 32;
    Fill(src_mem_, kSrcGuard, kSrc);
    Fill(loc_mem_, kLocGuard, kOld);
    uint64_t live = 0;
    ote_transfer_status_t ts = RunAndCancel(OTE_READ, true, &live);
    ASSERT_NO_FATAL_FAILURE(NothingMovesAfterTheEnd(0, loc_mem_));
    EXPECT_EQ(ts.state, OTE_TRANSFER_CANCELED) << ote_status_str(ts.error);
    EXPECT_EQ(ote_status_code(ts.error), OTE_ERR_CANCELED) << ote_status_str(ts.error);
    EXPECT_LT(ts.bytes_done, kLen) << "nothing was left to cancel";
    EXPECT_GE(live, 1u) << "no source grant was ever seen live";
    EXPECT_TRUE(GuardsIntact(loc_mem_, kLocGuard)) << "bytes outside the range were written";
    uint64_t changed = 0;
    EXPECT_TRUE(RangeOldOrNew(loc_mem_, kOld, kSrc, &changed));
    EXPECT_GE(changed, ts.bytes_done) << "bytes reported done did not arrive";
    EXPECT_LT(changed, kLen) << "the whole range was read although canceled mid-flight";
    std::vector<uint8_t> want(src_mem_.size());
    Fill(want, kSrcGuard, kSrc);
    EXPECT_EQ(memcmp(src_mem_.data(), want.data(), want.size()), 0) << "a READ changed its source";
    EXPECT_TRUE(SourceGrantsEnd()) << SrcGrants().live_source << " source grant(s) still live";
    EXPECT_TRUE(SourceRangeFree()) << "the canceled READ left the source's range pinned";
    std::printf("[ figures ] READ canceled after %llu of %llu bytes; %llu bytes arrived\n",
                (unsigned long long)ts.bytes_done, (unsigned long long)kLen,
                (unsigned long long)changed);
    SetRate(0);
    ASSERT_NO_FATAL_FAILURE(Whole(OTE_READ));
    EXPECT_TRUE(GuardsIntact(loc_mem_, kLocGuard));
    EXPECT_TRUE(RangeOldOrNew(loc_mem_, kSrc, kSrc, &changed));
}

// The requester's own deadline (3 s) passes mid-WRITE; the source's is 60 s. Each grant
// the source answered is released by the requester (RELEASE, once its WRs under it
// ended), so the source's grants end and its range is free within 10 s, not at its own
// deadline. Nothing outside the range is touched; the next request works.
class RdmaAbandonTest : public RdmaCancelTest {
  protected:
    // 20 MB/s per port (10 under TSan, with kLen halved): the request takes > 6 s, well
    // past the requester's 3 s.
    RdmaAbandonTest() {
        req_timeout_ = "3000";
        rate_ = ote_test::TsanScaled(20000000, 2);
    }
};

TEST_F(RdmaAbandonTest, SourceGrantsReleasedWhenTheRequesterGivesUp) {
    constexpr uint64_t kOld = 41, kNew = 42;
    Fill(src_mem_, kSrcGuard, kOld);
    Fill(loc_mem_, kLocGuard, kNew);
    uint64_t live = 0;
    ote_transfer_status_t ts = RunAndCancel(OTE_WRITE, false, &live);
    EXPECT_EQ(ts.state, OTE_TRANSFER_TIMEOUT) << ote_status_str(ts.error);
    EXPECT_LT(ts.bytes_done, kLen);
    EXPECT_GE(live, 1u) << "no source grant was ever seen live";
    EXPECT_TRUE(SourceGrantsEnd())
        << SrcGrants().live_source << " source grant(s) held after their requester gave up";
    EXPECT_TRUE(SourceRangeFree()) << "the abandoned grants left the source's range pinned";
    // The source's server thread counts a RELEASE after it ended the grant (the grant
    // layer's count, `released`, goes first): the two agree a moment later.
    ote__rdma_test_grants_t sg{}, rg{};
    EXPECT_TRUE(ote_test::WaitUntil(
        [&] {
            sg = SrcGrants();
            return sg.rel_applied >= 1 && sg.released == sg.rel_applied;
        },
        std::chrono::seconds(30), "the source to count every RELEASE it applied"));
    ASSERT_EQ(ote__rdma_test_grants(EngineAddr(req_).c_str(), &rg), OTE_OK);
    std::printf(
        "[ figures ] requester gave up: %llu grant(s) abandoned, %llu RELEASE sent; "
        "source: %llu applied, %llu ignored, %llu receipts\n",
        (unsigned long long)rg.abandoned, (unsigned long long)rg.rel_sent,
        (unsigned long long)sg.rel_applied, (unsigned long long)sg.rel_ignored,
        (unsigned long long)sg.receipts);
    EXPECT_GE(rg.rel_sent, 1u) << "no grant was in flight at the requester's deadline";
    EXPECT_GE(sg.rel_applied, 1u);
    EXPECT_EQ(sg.released, sg.rel_applied);
    EXPECT_EQ(rg.live_requester, 0u);
    EXPECT_TRUE(GuardsIntact(src_mem_, kSrcGuard)) << "bytes outside the range were written";
    uint64_t changed = 0;
    EXPECT_TRUE(RangeOldOrNew(src_mem_, kOld, kNew, &changed));
    // The next request (its QPs rebuilt where the deadline fenced them) works: 4 MiB,
    // well inside the requester's 3 s.
    SetRate(0);
    constexpr uint64_t kNext = 43, kSmall = 4ull << 20;
    Fill(loc_mem_, kLocGuard, kNext);
    ASSERT_NO_FATAL_FAILURE(Whole(OTE_WRITE, kSmall));
    EXPECT_TRUE(GuardsIntact(src_mem_, kSrcGuard));
    EXPECT_EQ(memcmp(Src(), Loc(), kSmall), 0) << "the follow-up WRITE did not land";
}

// A grant that ends before its answer comes (the requester's 2 s deadline passes while
// the source's bind is held) posts nothing; when the late OK answer arrives the requester
// releases its window at once (RELEASE), so the source (60 s deadline) does not hold it.
// The QP of that grant was never used: the next request on it works.
class RdmaLateAnswerTest : public RdmaCancelTest {
  protected:
    RdmaLateAnswerTest() {
        req_timeout_ = "2000";
        rate_ = 0;
        hook_ = HoldFirstSim;
        g_hold = &hold_;
    }
    ~RdmaLateAnswerTest() override { g_hold = nullptr; }
    void TearDown() override {
        hold_.release = true;
        RdmaCancelTest::TearDown();
    }
    HoldingSim hold_;
};

TEST_F(RdmaLateAnswerTest, LateAnswerOfAnEndedGrantIsReleased) {
    constexpr uint64_t kSmall = 1ull << 20;
    Fill(src_mem_, kSrcGuard, 51);
    Fill(loc_mem_, kLocGuard, 52);
    ASSERT_NO_FATAL_FAILURE(Whole(OTE_WRITE, kSmall)); /* QPs built */
    ASSERT_TRUE(SourceGrantsEnd());
    // Read before the hold: the held bind keeps the source's grant manager locked.
    ote__rdma_test_grants_t g0 = SrcGrants();
    hold_.arm = true;
    ote_batch_t *b = nullptr;
    ASSERT_EQ(ote_batch_create(req_, 1, &b), OTE_OK);
    ote_request_t r = {OTE_WRITE, Loc(), seg_, SrcAddr(), kSmall};
    ASSERT_EQ(ote_batch_submit(b, &r, 1), OTE_OK);
    (void)ote_batch_wait(b, 30 * kSec);
    ote_transfer_status_t ts{};
    ASSERT_EQ(ote_batch_status(b, 0, &ts), OTE_OK);
    EXPECT_TRUE(hold_.holding.load()) << "the source never bound a window for the grant";
    EXPECT_EQ(ts.state, OTE_TRANSFER_TIMEOUT) << ote_status_str(ts.error);
    EXPECT_EQ(ts.bytes_done, 0u);
    if (ts.state != OTE_TRANSFER_PENDING) {
        EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    }
    hold_.release = true; // the bind goes on, the late answer goes out
    EXPECT_TRUE(SourceGrantsEnd()) << "the window of the ended grant is still held";
    EXPECT_TRUE(SourceRangeFree());
    // The source's server thread counts the RELEASE after it ended the grant: the
    // count may follow the end by a moment.
    ote__rdma_test_grants_t sg{}, rg{};
    EXPECT_TRUE(
        ote_test::WaitUntil([&] { return (sg = SrcGrants()).rel_applied - g0.rel_applied >= 1; },
                            std::chrono::seconds(30), "the source to count the RELEASE applied"));
    // The requester counts its RELEASE once the send returned: on a loaded machine the
    // source may have applied it before that (ci21), so that count is waited for too.
    EXPECT_TRUE(ote_test::WaitUntil(
        [&] {
            EXPECT_EQ(ote__rdma_test_grants(EngineAddr(req_).c_str(), &rg), OTE_OK);
            return rg.rel_sent >= 1;
        },
        std::chrono::seconds(30), "the requester to count the RELEASE sent"));
    EXPECT_EQ(rg.abandoned, 0u) << "the grant posted nothing: its answer came too late";
    EXPECT_TRUE(GuardsIntact(src_mem_, kSrcGuard));
    // The QP was never used by that grant: the next request works on it.
    Fill(loc_mem_, kLocGuard, 53);
    ASSERT_NO_FATAL_FAILURE(Whole(OTE_WRITE, kSmall));
    EXPECT_EQ(memcmp(Src(), Loc(), kSmall), 0);
    EXPECT_TRUE(GuardsIntact(src_mem_, kSrcGuard));
}

} // namespace

// grant_test: slice geometry, and grants between two contexts of one sim instance.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "base/fault.h"
#include "tests/grant/rig.h"
#include "tests/util/test_base.h"

namespace {

using ote_test::Done;
using ote_test::kMs;
using ote_test::Rig;

constexpr unsigned long long B = OTE_GRANT_BLOCK;

TEST(GrantGeometryTest, BlocksAndFoldedTails) {
    EXPECT_EQ(ote_grant_slice_count(0), 0u);
    EXPECT_EQ(ote_grant_slice_count(1), 1u);
    EXPECT_EQ(ote_grant_slice_count(B - 1), 1u);
    EXPECT_EQ(ote_grant_slice_count(B), 1u);
    EXPECT_EQ(ote_grant_slice_count(B + 1), 1u);         /* 1-byte tail folded */
    EXPECT_EQ(ote_grant_slice_count(B + B / 4 - 1), 1u); /* under a quarter: folded */
    EXPECT_EQ(ote_grant_slice_count(B + B / 4), 2u);     /* a quarter: own slice */
    EXPECT_EQ(ote_grant_slice_count(2 * B), 2u);
    EXPECT_EQ(ote_grant_slice_count(64ull << 20), 1024u);
    uint64_t off;
    uint32_t len;
    ote_grant_slice_at(B + 100, 0, &off, &len);
    EXPECT_EQ(off, 0u);
    EXPECT_EQ(len, B + 100);
    ote_grant_slice_at(B + B / 4, 1, &off, &len);
    EXPECT_EQ(off, B);
    EXPECT_EQ(len, B / 4);
    // Slices tile [0, len) exactly for many lengths.
    for (uint64_t n :
         {1ull, 7ull, B - 3, B, B + 5, 3 * B + B / 4 - 1, 3 * B + B / 4, 10 * B + 12345}) {
        uint64_t next = 0;
        for (uint32_t i = 0; i < ote_grant_slice_count(n); i++) {
            ote_grant_slice_at(n, i, &off, &len);
            EXPECT_EQ(off, next) << n;
            EXPECT_GT(len, 0u);
            EXPECT_LT(len, B + B / 4) << n;
            next = off + len;
        }
        EXPECT_EQ(next, n);
    }
}

// The abandoned() callback of a requester grant: what it was given, and whether done()
// had come before it.
struct Abandoned {
    std::atomic<int> calls{0}, done_seen{0};
    uint32_t slot = 0, qpn = 0, rkey = 0;
    Done *done = nullptr;
    static void Fn(void *arg, uint32_t slot, uint32_t qpn, uint32_t rkey) {
        Abandoned *a = static_cast<Abandoned *>(static_cast<Done *>(arg)->ctx);
        a->slot = slot;
        a->qpn = qpn;
        a->rkey = rkey;
        a->done_seen = a->done->calls.load(); /* done() must come after */
        a->calls++;
    }
};

class GrantTest : public ote_test::OteTest {
  protected:
    void SetUp() override {
        OteTest::SetUp();
        rig_.Open(8u << 20);
    }
    void TearDown() override {
        rig_.Close();
        EXPECT_EQ(rig_.pins.load(), 0) << "registration pins leaked";
        OteTest::TearDown();
    }

    // Run one grant over [src+off, +len) to completion; returns its status.
    ote_status_t Run(ote_grant_op_t op, uint8_t *local, uint32_t lkey, uint64_t off, uint64_t len,
                     uint32_t slot = 0, uint64_t timeout_ms = 30000) {
        int cap = op == OTE_GRANT_WRITE ? 1 : 0;
        ote_qp_t *qp = nullptr;
        ote_status_t st = rig_.Borrow(cap, slot, &qp);
        if (st != OTE_OK) return st;
        Done d;
        ote_grant_desc_t g = {};
        g.op = op;
        g.local = local;
        g.lkey = lkey;
        g.remote = (uintptr_t)rig_.src.data() + off;
        g.len = len;
        g.ep = rig_.ep0[cap];
        g.slot = slot;
        g.qp = qp;
        g.deadline = ote_deadline_after(timeout_ms * kMs);
        g.done = Done::Fn;
        g.done_arg = &d;
        g.receipt_imm = rig_.exact;
        ote_grant_ctl_t ctl = {&rig_, Rig::Request};
        st = ote_grant_start(rig_.g0, &g, &ctl);
        if (st != OTE_OK) {
            ote_endpoint_return(rig_.ep0[cap], slot, qp);
            return st;
        }
        EXPECT_TRUE(d.Wait(rig_, 60000)) << "grant did not end";
        EXPECT_EQ(d.calls.load(), 1);
        return d.st.load();
    }

    // A WRITE grant of [off, off + len) of the source's memory from local (lkey) on slot 0
    // whose requester's first data post is refused (post 1 is the source's bind, post 2
    // the data chain): it fails after the source answered it, so it is abandoned (ab) and
    // the source keeps its window and pin until released or its deadline. Waits for done().
    void RunAbandoned(uint8_t *local, uint32_t lkey, uint64_t off, uint64_t len, Done &d,
                      Abandoned &ab) {
        ote_qp_t *qp = nullptr;
        ASSERT_EQ(rig_.Borrow(1, 0, &qp), OTE_OK);
        ASSERT_EQ(ote_verbs_fault_fail(rig_.v, OTE_VERBS_FAULT_OP_POST_SEND, OTE_FAULT_NTH, 2, EIO),
                  OTE_OK);
        ab.done = &d;
        d.ctx = &ab;
        ote_grant_desc_t g = {};
        g.op = OTE_GRANT_WRITE;
        g.local = local;
        g.lkey = lkey;
        g.remote = (uintptr_t)rig_.src.data() + off;
        g.len = len;
        g.ep = rig_.ep0[1];
        g.slot = 0;
        g.qp = qp;
        g.deadline = ote_deadline_after(30000 * kMs);
        g.done = Done::Fn;
        g.done_arg = &d;
        g.abandoned = Abandoned::Fn;
        ote_grant_ctl_t ctl = {&rig_, Rig::Request};
        ASSERT_EQ(ote_grant_start(rig_.g0, &g, &ctl), OTE_OK);
        ASSERT_TRUE(d.Wait(rig_, 60000));
        ote_verbs_fault_clear(rig_.v);
    }

    struct ibv_mr *LocalMr(std::vector<uint8_t> &buf) {
        struct ibv_mr *mr = nullptr;
        EXPECT_EQ(rig_.v->ops->reg_mr(rig_.v, ote_context_pd(rig_.c0), buf.data(), buf.size(),
                                      IBV_ACCESS_LOCAL_WRITE, &mr),
                  0);
        mrs_.push_back(mr);
        return mr;
    }
    void FreeMrs() {
        for (auto *mr : mrs_) EXPECT_EQ(rig_.v->ops->dereg_mr(rig_.v, mr), 0);
        mrs_.clear();
    }

    Rig rig_;
    std::vector<struct ibv_mr *> mrs_;
};

TEST_F(GrantTest, WriteThenReadExactBytesThroughWindows) {
    std::vector<uint8_t> out(3 * B + 999), in(3 * B + 999 + 2, 0xEE);
    for (size_t i = 0; i < out.size(); i++) out[i] = (uint8_t)(i * 7 + 1);
    struct ibv_mr *mo = LocalMr(out), *mi = LocalMr(in);
    for (uint64_t len : {1ull, 4093ull, B, B + 1, 3 * B + 999}) {
        std::fill(rig_.src.begin(), rig_.src.end(), 0);
        ASSERT_EQ(Run(OTE_GRANT_WRITE, out.data(), mo->lkey, 4097, len), OTE_OK) << len;
        EXPECT_EQ(memcmp(rig_.src.data() + 4097, out.data(), len), 0) << len;
        EXPECT_EQ(rig_.src[4096], 0) << "WRITE before its range";
        EXPECT_EQ(rig_.src[4097 + len], 0) << "WRITE past its range";
        ASSERT_EQ(Run(OTE_GRANT_READ, in.data() + 1, mi->lkey, 4097, len, 1), OTE_OK) << len;
        EXPECT_EQ(memcmp(in.data() + 1, out.data(), len), 0) << len;
        EXPECT_EQ(in[0], 0xEE);
        EXPECT_EQ(in[1 + len], 0xEE);
    }
    ASSERT_TRUE(rig_.WaitSourceIdle()) << "the source never took the last receipt";
    ote_grant_stats_t s0, s1;
    ote_grant_mgr_get_stats(rig_.g0, &s0);
    ote_grant_mgr_get_stats(rig_.g1, &s1);
    EXPECT_EQ(s0.completed, 10u);
    EXPECT_EQ(s0.live_requester, 0u);
    EXPECT_EQ(s1.receipts, 10u); /* every window invalidated by the requester's SEND_WITH_INV */
    EXPECT_EQ(rig_.serving.load(), 10u) << "every pin met its ote_grant_serve call's context";
    EXPECT_EQ(s1.live_source, 0u);
    EXPECT_GE(s1.mw_pool, 1u); /* invalidated windows are reused */
    EXPECT_EQ(ote_verbs_fault_calls(rig_.v, OTE_VERBS_FAULT_OP_ALLOC_MW), s1.mw_pool);
    FreeMrs();
}

// Exact-range MR grants (ote_grant_serve_exact, the GPUDirect source's: no window):
// answered with the MR's rkey, ended by the SEND_WITH_IMM receipt, the MR deregistered at
// the end; the MR covers nothing outside the grant (a READ one byte past it is refused
// and writes nothing), and no window is ever allocated.
class GrantExactTest : public GrantTest {
  protected:
    void SetUp() override {
        OteTest::SetUp();
        rig_.exact = true;
        rig_.Open(8u << 20);
    }
};

// An exact-MR grant reserves its receipt's receive slot before its key is answered:
// refused for want of one (OTE_ERR_AGAIN), the MR it registered is deregistered at once
// and nothing is held; the next grant moves its bytes and gives the reservation back.
TEST_F(GrantExactTest, ReceiveAdmissionRefusedRollsBackBeforeAnyKey) {
    std::vector<uint8_t> out(B);
    for (size_t i = 0; i < out.size(); i++) out[i] = (uint8_t)(i * 7 + 1);
    struct ibv_mr *mo = LocalMr(out);
    ASSERT_EQ(ote_fault_arm("qp.rq_admit", OTE_FAULT_NTH, 1, OTE_ERR_AGAIN, 0), OTE_OK);
    EXPECT_EQ(ote_status_code(Run(OTE_GRANT_WRITE, out.data(), mo->lkey, 4097, B)), OTE_ERR_AGAIN);
    EXPECT_EQ(ote_fault_failures("qp.rq_admit"), 1u);
    ASSERT_EQ(ote_fault_disarm("qp.rq_admit"), OTE_OK);
    ote_grant_stats_t s1;
    ote_grant_mgr_get_stats(rig_.g1, &s1);
    EXPECT_EQ(s1.rq_busy, 1u);
    EXPECT_EQ(s1.served, 0u);
    EXPECT_EQ(s1.live_source, 0u);
    EXPECT_EQ(rig_.exact_mrs.load(), 0) << "the refused grant's MR outlived it";
    std::fill(rig_.src.begin(), rig_.src.end(), 0);
    ASSERT_EQ(Run(OTE_GRANT_WRITE, out.data(), mo->lkey, 4097, B), OTE_OK);
    EXPECT_EQ(memcmp(rig_.src.data() + 4097, out.data(), B), 0);
    ASSERT_TRUE(rig_.WaitSourceIdle()) << "the source never took the receipt";
    EXPECT_EQ(rig_.exact_mrs.load(), 0);
    ote_qp_t *sq = nullptr;
    ASSERT_EQ(ote_endpoint_borrow_ready(rig_.ep1[1], 0, 0, &sq), OTE_OK);
    EXPECT_EQ(ote_qp_rq_admitted(sq), 0u); // the receipt's reservation given back
    ote_endpoint_return(rig_.ep1[1], 0, sq);
    FreeMrs();
}

TEST_F(GrantExactTest, ExactMrGrantsMoveExactBytesAndDeregisterAtTheirReceipt) {
    std::vector<uint8_t> out(3 * B + 999), in(3 * B + 999 + 2, 0xEE);
    for (size_t i = 0; i < out.size(); i++) out[i] = (uint8_t)(i * 11 + 3);
    struct ibv_mr *mo = LocalMr(out), *mi = LocalMr(in);
    for (uint64_t len : {1ull, 4093ull, B + 1, 3 * B + 999}) {
        std::fill(rig_.src.begin(), rig_.src.end(), 0);
        ASSERT_EQ(Run(OTE_GRANT_WRITE, out.data(), mo->lkey, 4097, len), OTE_OK) << len;
        EXPECT_EQ(memcmp(rig_.src.data() + 4097, out.data(), len), 0) << len;
        EXPECT_EQ(rig_.src[4096], 0) << "WRITE before its range";
        EXPECT_EQ(rig_.src[4097 + len], 0) << "WRITE past its range";
        ASSERT_EQ(Run(OTE_GRANT_READ, in.data() + 1, mi->lkey, 4097, len, 1), OTE_OK) << len;
        EXPECT_EQ(memcmp(in.data() + 1, out.data(), len), 0) << len;
        EXPECT_EQ(in[0], 0xEE);
        EXPECT_EQ(in[1 + len], 0xEE);
    }
    ASSERT_TRUE(rig_.WaitSourceIdle()) << "the source never took the last receipt";
    EXPECT_EQ(rig_.exact_mrs.load(), 0) << "an exact MR outlived its grant";
    ote_grant_stats_t s0, s1;
    ote_grant_mgr_get_stats(rig_.g0, &s0);
    ote_grant_mgr_get_stats(rig_.g1, &s1);
    EXPECT_EQ(s0.completed, 8u);
    EXPECT_EQ(s1.receipts, 8u); /* every grant ended by its SEND_WITH_IMM receipt */
    EXPECT_EQ(s1.live_source, 0u);
    EXPECT_EQ(s1.stale_receipts, 0u);
    EXPECT_EQ(ote_verbs_fault_calls(rig_.v, OTE_VERBS_FAULT_OP_ALLOC_MW), 0u);

    // A READ one byte past a live grant's MR, posted by hand on the grant's own QP: the
    // source refuses it (remote access error), nothing lands past the guard.
    ote_qp_t *qp = nullptr;
    ASSERT_EQ(rig_.Borrow(0, 0, &qp), OTE_OK);
    uint32_t src_qpn = ote_endpoint_remote_qpn(rig_.ep0[0], 0);
    ote_qp_t *sqp = nullptr;
    ASSERT_EQ(ote_endpoint_borrow_ready(rig_.ep1[0], 0, 0, &sqp), OTE_OK);
    ASSERT_EQ(ote_qp_num(sqp), src_qpn);
    uint32_t rkey = 0;
    void *pin = nullptr;
    uint64_t at = (uintptr_t)rig_.src.data() + 8192;
    ASSERT_EQ(Rig::PinExact(&rig_, nullptr, sqp, at, 100, IBV_ACCESS_REMOTE_READ, &rkey, &pin),
              OTE_OK);
    std::fill(in.begin(), in.end(), 0xEE);
    struct ibv_sge sge = {(uintptr_t)in.data(), 101, mi->lkey};
    struct ibv_send_wr wr = {};
    wr.wr_id = OTE_CQ_WR_ID(0, 1); /* no namespace: the lane counts it as unknown */
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.wr.rdma.remote_addr = at;
    wr.wr.rdma.rkey = rkey;
    ote_qp_post_result_t res;
    ASSERT_EQ(ote_qp_post_send(qp, &wr, ote_deadline_after(30000 * kMs), &res), OTE_OK);
    ASSERT_EQ(ote_qp_wait_idle(qp, ote_deadline_after(30000 * kMs)), OTE_OK);
    ote_qp_stats_t qs;
    ote_qp_get_stats(qp, &qs);
    EXPECT_EQ(qs.send_errors, 1u) << "a READ past the exact MR was not refused";
    EXPECT_EQ(in[100], 0xEE);
    Rig::Unpin(&rig_, pin);
    ote_endpoint_retire(rig_.ep0[0], 0, qp);
    ote_endpoint_return(rig_.ep0[0], 0, qp);
    ote_endpoint_retire(rig_.ep1[0], 0, sqp);
    ote_endpoint_return(rig_.ep1[0], 0, sqp);
    rig_.Reclaim();
    EXPECT_EQ(rig_.exact_mrs.load(), 0);
    FreeMrs();
}

TEST_F(GrantTest, OutsideRegistrationOrAccessRefusedBeforeAnyWindow) {
    std::vector<uint8_t> out(2 * B, 0x33);
    struct ibv_mr *mo = LocalMr(out);
    EXPECT_EQ(
        ote_status_code(Run(OTE_GRANT_WRITE, out.data(), mo->lkey, rig_.src.size() - 100, 200)),
        OTE_ERR_ACCESS);
    rig_.src_access = IBV_ACCESS_REMOTE_READ;
    EXPECT_EQ(ote_status_code(Run(OTE_GRANT_WRITE, out.data(), mo->lkey, 0, 100)), OTE_ERR_ACCESS);
    EXPECT_EQ(ote_verbs_fault_calls(rig_.v, OTE_VERBS_FAULT_OP_ALLOC_MW), 0u);
    for (uint8_t b : rig_.src) ASSERT_EQ(b, 0);
    EXPECT_EQ(Run(OTE_GRANT_READ, out.data(), mo->lkey, 0, 100), OTE_OK);
    ote_grant_stats_t s1;
    ote_grant_mgr_get_stats(rig_.g1, &s1);
    EXPECT_EQ(s1.refused, 2u);
    FreeMrs();
}

TEST_F(GrantTest, ManyGrantsShareOneQpBeyondItsDepth) {
    // 16 grants x 8 slices on one QP of depth 32: admission waits and resumes.
    constexpr int kN = 16;
    constexpr uint64_t kLen = 8 * B;
    std::vector<uint8_t> out(kN * kLen);
    for (size_t i = 0; i < out.size(); i++) out[i] = (uint8_t)(i * 13 + 5);
    struct ibv_mr *mo = LocalMr(out);
    ote_qp_t *qp = nullptr;
    ASSERT_EQ(rig_.Borrow(1, 0, &qp), OTE_OK);
    std::vector<Done> done(kN);
    ote_grant_ctl_t ctl = {&rig_, Rig::Request};
    for (int i = 0; i < kN; i++) {
        ote_qp_t *q = nullptr;
        ASSERT_EQ(rig_.Borrow(1, 0, &q), OTE_OK);
        ASSERT_EQ(q, qp);
        ote_grant_desc_t g = {};
        g.op = OTE_GRANT_WRITE;
        g.local = out.data() + i * kLen;
        g.lkey = mo->lkey;
        g.remote = (uintptr_t)rig_.src.data() + i * kLen;
        g.len = kLen;
        g.ep = rig_.ep0[1];
        g.slot = 0;
        g.qp = q;
        g.deadline = ote_deadline_after(30000 * kMs);
        g.done = Done::Fn;
        g.done_arg = &done[i];
        ASSERT_EQ(ote_grant_start(rig_.g0, &g, &ctl), OTE_OK);
    }
    ote_endpoint_return(rig_.ep0[1], 0, qp);
    for (int i = 0; i < kN; i++) {
        ASSERT_TRUE(done[i].Wait(rig_, 60000));
        EXPECT_EQ(done[i].st.load(), OTE_OK);
        EXPECT_EQ(done[i].calls.load(), 1);
    }
    EXPECT_EQ(memcmp(rig_.src.data(), out.data(), out.size()), 0);
    ote_grant_stats_t s0;
    ote_grant_mgr_get_stats(rig_.g0, &s0);
    EXPECT_EQ(s0.slices_completed, (uint64_t)kN * 8);
    EXPECT_EQ(s0.stale_cqes, 0u);
    ote_qp_stats_t qs;
    ote_qp_get_stats(qp, &qs);
    EXPECT_EQ(qs.sq_outstanding, 0u);
    EXPECT_EQ(qs.unknown_cqes, 0u);
    FreeMrs();
}

// Key history: every bind re-keys the window with the next 8-bit tag its index has not
// used. One grant at a time (each source grant ends before the next is served) keeps
// reusing the one pooled window: after 255 binds every tag of its index is used (the
// allocation's too), it is kept allocated (retired: never bound again, so the provider
// cannot give the index out again) and the next grants bind a fresh window. Across 300
// grants no rkey repeats; the counters show two windows allocated, one retired, none
// retained. Then, with the pooled window held by a grant, alloc_mw fails once: the kept
// window is given back to the provider (a WARN: its index starts a new history) and the
// allocation tried again, so the grant is served.
TEST_F(GrantTest, WindowRetiredWhenItsRkeyTagsAreUsedUpNoRkeyRepeats) {
    constexpr int kGrants = 300;
    std::vector<uint8_t> out(4096, 0x6B);
    struct ibv_mr *mo = LocalMr(out);
    std::vector<uint32_t> rkeys;
    for (int i = 0; i < kGrants; i++) {
        rig_.last_rkey = 0;
        ASSERT_EQ(Run(OTE_GRANT_WRITE, out.data(), mo->lkey, 0, out.size()), OTE_OK) << i;
        ASSERT_TRUE(rig_.WaitSourceIdle()) << i; /* its window back in the pool */
        rkeys.push_back(rig_.last_rkey.load());
    }
    std::set<uint32_t> distinct(rkeys.begin(), rkeys.end());
    EXPECT_EQ(distinct.size(), (size_t)kGrants) << "an rkey repeated";
    /* The first window carried 255 binds (one index, 255 tags); the 256th grant bound a
     * new window (another index). */
    for (int i = 1; i < 255; i++) EXPECT_EQ(rkeys[i] >> 8, rkeys[0] >> 8) << i;
    EXPECT_NE(rkeys[255] >> 8, rkeys[0] >> 8);
    for (int i = 256; i < kGrants; i++) EXPECT_EQ(rkeys[i] >> 8, rkeys[255] >> 8) << i;
    ote_grant_stats_t s1;
    ote_grant_mgr_get_stats(rig_.g1, &s1);
    EXPECT_EQ(s1.mw_allocated, 2u);
    EXPECT_EQ(s1.mw_retired, 1u);
    EXPECT_EQ(s1.mw_pool, 1u);
    EXPECT_EQ(s1.mw_retained, 0u);
    EXPECT_EQ(s1.receipts, (uint64_t)kGrants);
    EXPECT_EQ(ote_context_retained(rig_.c1, OTE_RETAINED_MW), 0u);
    EXPECT_EQ(memcmp(rig_.src.data(), out.data(), out.size()), 0);

    // The pooled window held: a grant abandoned after its answer (its data post refused)
    // keeps it until released.
    ote_test::ErrorLogsExpected refused;
    Done d;
    Abandoned ab;
    ASSERT_NO_FATAL_FAILURE(RunAbandoned(out.data(), mo->lkey, 0, out.size(), d, ab));
    ASSERT_EQ(ab.calls.load(), 1);
    ote_grant_mgr_get_stats(rig_.g1, &s1);
    ASSERT_EQ(s1.mw_pool, 0u);
    // The next grant needs a new window; the provider refuses the first alloc_mw.
    ASSERT_EQ(ote_verbs_fault_fail(rig_.v, OTE_VERBS_FAULT_OP_ALLOC_MW, OTE_FAULT_NTH, 1, ENOMEM),
              OTE_OK);
    EXPECT_EQ(Run(OTE_GRANT_WRITE, out.data(), mo->lkey, 0, out.size(), 1), OTE_OK);
    ote_verbs_fault_clear(rig_.v);
    ote_grant_mgr_get_stats(rig_.g1, &s1);
    EXPECT_EQ(s1.mw_retired, 0u) << "the kept window was not given back";
    EXPECT_EQ(s1.mw_allocated, 3u);
    EXPECT_EQ(s1.mw_retained, 0u);
    EXPECT_EQ(ote_grant_source_release(rig_.g1, rig_.ep1[1], 0, ab.qpn, ab.rkey), OTE_OK);
    FreeMrs();
}

// A requester grant that fails after the source answered it (its first data post is
// refused) hands the source's window to desc.abandoned once nothing of it is in flight,
// before done(); the source's ote_grant_source_release ends exactly that grant (slot,
// source QP and rkey must all match, on its endpoint): window deallocated, pin released,
// QP kept. A release naming anything else, or the same grant again, is NOT_FOUND and
// changes nothing. Grants go on.

TEST_F(GrantTest, AbandonedGrantIsReleasedAtTheSourceOnRequest) {
    std::vector<uint8_t> out(4 * B, 0x5A);
    struct ibv_mr *mo = LocalMr(out);
    ASSERT_EQ(Run(OTE_GRANT_WRITE, out.data(), mo->lkey, 0, B), OTE_OK); /* QPs built */
    ote_grant_stats_t before;
    ote_grant_mgr_get_stats(rig_.g1, &before);
    uint32_t src_qpn = ote_endpoint_remote_qpn(rig_.ep0[1], 0);
    ote_test::ErrorLogsExpected refused;
    Done d;
    Abandoned ab;
    ASSERT_NO_FATAL_FAILURE(RunAbandoned(out.data(), mo->lkey, B, 4 * B, d, ab));
    EXPECT_NE(d.st.load(), OTE_OK);
    ASSERT_EQ(ab.calls.load(), 1) << "a grant failed after its answer was not abandoned";
    EXPECT_EQ(ab.done_seen.load(), 0) << "done() came before abandoned()";
    EXPECT_EQ(ab.slot, 0u);
    EXPECT_EQ(ab.qpn, src_qpn);
    // The source still holds the window and the pin: its deadline is 5 s away.
    ote_grant_stats_t s1;
    ote_grant_mgr_get_stats(rig_.g1, &s1);
    EXPECT_EQ(s1.live_source, 1u);
    EXPECT_EQ(rig_.pins.load(), 1);
    // Releases naming anything else change nothing.
    EXPECT_EQ(ote_grant_source_release(rig_.g1, rig_.ep1[1], 1, ab.qpn, ab.rkey),
              OTE_ERR_NOT_FOUND);
    EXPECT_EQ(ote_grant_source_release(rig_.g1, rig_.ep1[1], 0, ab.qpn + 1, ab.rkey),
              OTE_ERR_NOT_FOUND);
    EXPECT_EQ(ote_grant_source_release(rig_.g1, rig_.ep1[1], 0, ab.qpn, ab.rkey ^ 0x100),
              OTE_ERR_NOT_FOUND);
    EXPECT_EQ(ote_grant_source_release(rig_.g1, rig_.ep1[0], 0, ab.qpn, ab.rkey),
              OTE_ERR_NOT_FOUND);
    EXPECT_EQ(ote_grant_source_release(rig_.g0, rig_.ep1[1], 0, ab.qpn, ab.rkey),
              OTE_ERR_INVALID); /* a requester-only manager serves nothing */
    ote_grant_mgr_get_stats(rig_.g1, &s1);
    EXPECT_EQ(s1.live_source, 1u);
    EXPECT_EQ(s1.stale_releases, 4u);
    // The right one ends it at once; a second is NOT_FOUND.
    EXPECT_EQ(ote_grant_source_release(rig_.g1, rig_.ep1[1], 0, ab.qpn, ab.rkey), OTE_OK);
    EXPECT_EQ(ote_grant_source_release(rig_.g1, rig_.ep1[1], 0, ab.qpn, ab.rkey),
              OTE_ERR_NOT_FOUND);
    ote_grant_mgr_get_stats(rig_.g1, &s1);
    EXPECT_EQ(s1.live_source, 0u);
    EXPECT_EQ(s1.released, 1u);
    EXPECT_EQ(s1.source_expired, before.source_expired);
    EXPECT_EQ(rig_.pins.load(), 0) << "the released grant kept its pin";
    ote_grant_stats_t s0;
    ote_grant_mgr_get_stats(rig_.g0, &s0);
    EXPECT_EQ(s0.abandoned, 1u);
    // The source's QP was kept: grants go on (on another slot: this rig's exchange does
    // not rebuild the source's end of a slot whose requester QP was retired, as the
    // engine's CONNECT does).
    std::fill(rig_.src.begin(), rig_.src.end(), 0);
    EXPECT_EQ(Run(OTE_GRANT_WRITE, out.data(), mo->lkey, B, 4 * B, 1), OTE_OK);
    EXPECT_EQ(memcmp(rig_.src.data() + B, out.data(), 4 * B), 0);
    FreeMrs();
}

// ote_grant_source_end_slot_qp ends the live grants of one slot served on one QP number
// only (the engine's staged grant served on a slot a CONNECT replaced meanwhile): another
// number or another slot ends nothing; the right one ends the grant, its window and pin.
TEST_F(GrantTest, EndSlotQpEndsOnlyTheGrantsOfThatQpNumber) {
    std::vector<uint8_t> out(4 * B, 0x5A);
    struct ibv_mr *mo = LocalMr(out);
    ASSERT_EQ(Run(OTE_GRANT_WRITE, out.data(), mo->lkey, 0, B), OTE_OK); /* QPs built */
    ote_test::ErrorLogsExpected refused;
    Done d;
    Abandoned ab;
    ASSERT_NO_FATAL_FAILURE(RunAbandoned(out.data(), mo->lkey, B, 4 * B, d, ab));
    ASSERT_EQ(ab.calls.load(), 1);
    ote_grant_stats_t s1;
    ote_grant_mgr_get_stats(rig_.g1, &s1);
    ASSERT_EQ(s1.live_source, 1u);
    EXPECT_EQ(ote_grant_source_end_slot_qp(rig_.g1, rig_.ep1[1], ab.slot, ab.qpn + 1), 0u);
    EXPECT_EQ(ote_grant_source_end_slot_qp(rig_.g1, rig_.ep1[1], ab.slot + 1, ab.qpn), 0u);
    EXPECT_EQ(ote_grant_source_end_slot_qp(rig_.g1, rig_.ep1[0], ab.slot, ab.qpn), 0u);
    EXPECT_EQ(ote_grant_source_end_slot_qp(rig_.g1, rig_.ep1[1], ab.slot, 0), 0u); /* names none */
    ote_grant_mgr_get_stats(rig_.g1, &s1);
    EXPECT_EQ(s1.live_source, 1u);
    EXPECT_EQ(rig_.pins.load(), 1);
    EXPECT_EQ(ote_grant_source_end_slot_qp(rig_.g1, rig_.ep1[1], ab.slot, ab.qpn), 1u);
    ote_grant_mgr_get_stats(rig_.g1, &s1);
    EXPECT_EQ(s1.live_source, 0u);
    EXPECT_EQ(rig_.pins.load(), 0) << "the ended grant kept its pin";
    EXPECT_EQ(ote_grant_source_release(rig_.g1, rig_.ep1[1], ab.slot, ab.qpn, ab.rkey),
              OTE_ERR_NOT_FOUND); /* ended once */
    FreeMrs();
}

// The key domain across many windows at one index: grants whose windows are deallocated
// as maybe bound (each abandoned after its answer, then released) hand the index back to
// the next window again and again; over 300 such grants, more than the 256 tags of one
// index, no rkey repeats: once the index used every tag its window is kept allocated
// (mw_retired) and the grants go on at another index.
TEST_F(GrantTest, KeyDomainNoRkeyRepeatsAcrossWindowsAtOneIndex) {
    constexpr int kGrants = 300;
    std::vector<uint8_t> out(B, 0x3C);
    struct ibv_mr *mo = LocalMr(out);
    ASSERT_EQ(Run(OTE_GRANT_WRITE, out.data(), mo->lkey, 0, B), OTE_OK); /* QPs built */
    ote_test::ErrorLogsExpected refused;
    std::set<uint32_t> seen;
    std::map<uint32_t, int> per_index; // grants per window index
    for (int i = 0; i < kGrants; i++) {
        // Abandoned after its answer, so its window is released as maybe bound.
        Done d;
        Abandoned ab;
        ASSERT_NO_FATAL_FAILURE(RunAbandoned(out.data(), mo->lkey, 0, B, d, ab)) << i;
        ASSERT_EQ(ab.calls.load(), 1) << i;
        EXPECT_TRUE(seen.insert(ab.rkey).second)
            << "grant " << i << ": rkey 0x" << std::hex << ab.rkey << " repeated";
        per_index[ab.rkey >> 8]++;
        ASSERT_EQ(ote_grant_source_release(rig_.g1, rig_.ep1[1], 0, ab.qpn, ab.rkey), OTE_OK) << i;
    }
    // The provider gave one index back again and again (its free list; now and then
    // another key takes it first): without that the test would show nothing.
    int most = 0;
    for (const auto &kv : per_index) most = std::max(most, kv.second);
    EXPECT_GE(most, 64) << per_index.size() << " indexes";
    ote_grant_stats_t s1;
    ote_grant_mgr_get_stats(rig_.g1, &s1);
    if (most >= 255) { // its 256 tags (the allocation's and the binds') used: window kept
        EXPECT_GE(s1.mw_retired, 1u) << "an index out of tags must keep its window";
    }
    EXPECT_EQ(s1.live_source, 0u);
    EXPECT_EQ(rig_.pins.load(), 0);
    FreeMrs();
}

} // namespace

// Unit tests of qp/ with real data movement over the software provider: two RC QPs in
// one process (sim0 <-> sim1) connected INIT -> RTR -> RTS, RDMA WRITE and READ with
// byte checks, SEND into QP-owned receive buffers with credits, bounded admission,
// exact WR accounting, worker-driven completion, and send credits shared by QPs.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/qp/qp_fixture.h"

extern "C" {
#include "cq/workers.h"
#include "verbs/sim/sim.h"
}

namespace {

using ote_test::QpFixture;

class QpTest : public QpFixture {
  protected:
    void SetUp() override {
        QpFixture::SetUp();
        Start(false);
    }
};

TEST_F(QpTest, ConnectedPairMovesBytesWithWriteAndRead) {
    ote_qp_t *a = MakeQp(0, Config());
    ote_qp_t *b = MakeQp(1, Config());
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    ote_qp_stats_t st;
    ote_qp_get_stats(a, &st);
    EXPECT_EQ(st.state, IBV_QPS_INIT);
    ASSERT_EQ(ConnectPair(a, b), OTE_OK);
    ote_qp_get_stats(a, &st);
    EXPECT_EQ(st.state, IBV_QPS_RTS);

    for (size_t i = 0; i < 64 * 1024; i++) mem_[0][i] = (uint8_t)(i * 7 + 1);
    Wr w;
    Rdma(&w, 0, 1, IBV_WR_RDMA_WRITE, 0, 64 * 1024);
    ote_qp_post_result_t res;
    ASSERT_EQ(ote_qp_post_send(a, &w.wr, Soon(), &res), OTE_OK);
    EXPECT_EQ(res.accepted, 1u);
    EXPECT_EQ(res.unposted, nullptr);
    ASSERT_EQ(ote_qp_wait_idle(a, Soon()), OTE_OK);
    ASSERT_EQ(rec_[0].Count(1), 1u);
    EXPECT_EQ(rec_[0].First(1).status, IBV_WC_SUCCESS);
    EXPECT_EQ(rec_[0].First(1).opcode, IBV_WC_RDMA_WRITE);
    EXPECT_EQ(memcmp(mem_[0].data(), mem_[1].data(), 64 * 1024), 0);

    // READ back from b into another part of a's memory (1 byte .. odd sizes).
    const size_t sizes[] = {1, 3, 4095, 65537};
    size_t off = 200 * 1024;
    uint64_t id = 10;
    for (size_t len : sizes) {
        for (size_t i = 0; i < len; i++) mem_[1][off + i] = (uint8_t)(len + i);
        Rdma(&w, 0, id, IBV_WR_RDMA_READ, off, len);
        w.wr.wr.rdma.remote_addr = (uintptr_t)(mem_[1].data() + off);
        w.sge.addr = (uintptr_t)(mem_[0].data() + off + 300 * 1024);
        ASSERT_EQ(ote_qp_post_send(a, &w.wr, Soon(), &res), OTE_OK);
        ASSERT_EQ(ote_qp_wait_idle(a, Soon()), OTE_OK);
        EXPECT_EQ(rec_[0].First(id).status, IBV_WC_SUCCESS);
        EXPECT_EQ(memcmp(mem_[0].data() + off + 300 * 1024, mem_[1].data() + off, len), 0) << len;
        id++;
    }
    ote_qp_get_stats(a, &st);
    EXPECT_EQ(st.send_completions, 5u);
    EXPECT_EQ(st.sq_outstanding, 0u);
    EXPECT_EQ(st.unknown_cqes, 0u);
    EXPECT_EQ(ote_cq_lane_outstanding(lane_[0], OTE_CQ_SEND), 0u);
}

struct Inbox {
    std::mutex mu;
    std::vector<std::string> msgs;
    static void Fn(void *arg, ote_qp_t *, const ibv_wc *wc, const void *buf) {
        auto *in = static_cast<Inbox *>(arg);
        std::lock_guard<std::mutex> g(in->mu);
        in->msgs.emplace_back(static_cast<const char *>(buf), wc->byte_len);
    }
    struct Want {
        Inbox *in;
        size_t n;
    };
    static int Reached(void *arg) {
        auto *w = static_cast<Want *>(arg);
        std::lock_guard<std::mutex> g(w->in->mu);
        return w->in->msgs.size() >= w->n;
    }
};

TEST_F(QpTest, SendsLandInQpOwnedReceiveBuffersAndCreditsAreReturned) {
    Inbox inbox;
    ote_qp_config_t cb = Config(16, 4, 256);
    cb.on_recv = &Inbox::Fn;
    cb.recv_arg = &inbox;
    ote_qp_t *a = MakeQp(0, Config(16));
    ote_qp_t *b = MakeQp(1, cb);
    EXPECT_EQ(ote_qp_recv_credits(b), 0u); // posted at connect
    ASSERT_EQ(ConnectPair(a, b), OTE_OK);
    EXPECT_EQ(ote_qp_recv_credits(b), 4u);
    EXPECT_EQ(ote_cq_lane_outstanding(lane_[1], OTE_CQ_RECV), 4u);
    // Ten messages through four slots: each slot is reposted after its CQE.
    for (int i = 0; i < 10; i++) {
        std::string msg = "message " + std::to_string(i);
        memcpy(mem_[0].data() + i * 64, msg.data(), msg.size());
        Wr w;
        Rdma(&w, 0, 100 + i, IBV_WR_SEND, i * 64, msg.size());
        ote_qp_post_result_t res;
        ASSERT_EQ(ote_qp_post_send(a, &w.wr, Soon(), &res), OTE_OK);
        // Only this thread polls: take the receive, which reposts its slot.
        Inbox::Want want{&inbox, (size_t)i + 1};
        ASSERT_EQ(ote_cq_lane_progress(lane_[1], &Inbox::Reached, &want, Soon()), OTE_OK);
        ASSERT_EQ(ote_qp_wait_idle(a, Soon()), OTE_OK);
    }
    ASSERT_EQ(inbox.msgs.size(), 10u);
    for (int i = 0; i < 10; i++) EXPECT_EQ(inbox.msgs[i], "message " + std::to_string(i));
    EXPECT_EQ(ote_qp_recv_credits(b), 4u);
    ote_qp_stats_t st;
    ote_qp_get_stats(b, &st);
    EXPECT_EQ(st.recv_completions, 10u);
    EXPECT_EQ(st.rq_slots, 4u);
    EXPECT_EQ(rec_[1].Total(), 0u); // receive CQEs belong to the RQ, not to a record
}

// Receive admission: every admitted message to come has a posted slot of its own; past
// the posted slots ote_qp_rq_admit answers AGAIN until a reservation is given back.
TEST_F(QpTest, ReceiveAdmissionKeepsAPostedSlotForEveryAdmittedMessage) {
    Inbox inbox;
    ote_qp_config_t cb = Config(16, 2, 256);
    cb.on_recv = &Inbox::Fn;
    cb.recv_arg = &inbox;
    ote_qp_t *a = MakeQp(0, Config(16));
    ote_qp_t *b = MakeQp(1, cb);
    EXPECT_EQ(ote_qp_rq_admit(b), OTE_ERR_AGAIN); // nothing posted before connect
    ASSERT_EQ(ConnectPair(a, b), OTE_OK);
    EXPECT_EQ(ote_qp_rq_admit(b), OTE_OK);
    EXPECT_EQ(ote_qp_rq_admit(b), OTE_OK);
    EXPECT_EQ(ote_qp_rq_admit(b), OTE_ERR_AGAIN);
    EXPECT_EQ(ote_qp_rq_admitted(b), 2u);
    // One admitted message arrives (its slot is reposted): its reservation is still held
    // until given back, so a third one is still refused.
    memcpy(mem_[0].data(), "receipt", 7);
    Wr w;
    Rdma(&w, 0, 100, IBV_WR_SEND, 0, 7);
    ote_qp_post_result_t res;
    ASSERT_EQ(ote_qp_post_send(a, &w.wr, Soon(), &res), OTE_OK);
    Inbox::Want want{&inbox, 1};
    ASSERT_EQ(ote_cq_lane_progress(lane_[1], &Inbox::Reached, &want, Soon()), OTE_OK);
    ASSERT_EQ(ote_qp_wait_idle(a, Soon()), OTE_OK);
    EXPECT_EQ(ote_qp_recv_credits(b), 2u);
    EXPECT_EQ(ote_qp_rq_admit(b), OTE_ERR_AGAIN);
    ote_qp_rq_unadmit(b);
    EXPECT_EQ(ote_qp_rq_admitted(b), 1u);
    EXPECT_EQ(ote_qp_rq_admit(b), OTE_OK);
    ote_qp_rq_unadmit(b);
    ote_qp_rq_unadmit(b);
    EXPECT_EQ(ote_qp_rq_admitted(b), 0u);
    ote_qp_rq_unadmit(b); // never below zero
    EXPECT_EQ(ote_qp_rq_admitted(b), 0u);
}

// A QP created in a private PD (config.pd) is a target only for the MRs of that PD: a
// WRITE through an MR of the same range in the context's PD is refused by the target
// (remote access error), one through the private PD's MR lands, and its receive
// buffers (registered in the private PD too) take SENDs.
TEST_F(QpTest, QpInAPrivatePdReachesOnlyThatPdsMemory) {
    ote_verbs_t *v = ote_context_verbs(ctx_[1]);
    ibv_pd *pd = nullptr;
    ASSERT_EQ(v->ops->alloc_pd(v, ote_context_native(ctx_[1]), &pd), 0);
    ibv_mr *pmr = nullptr;
    ASSERT_EQ(v->ops->reg_mr(v, pd, mem_[1].data(), 4096,
                             IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, &pmr),
              0);
    Inbox inbox;
    ote_qp_config_t cb = Config(16, 2, 64);
    cb.on_recv = &Inbox::Fn;
    cb.recv_arg = &inbox;
    cb.pd = pd;
    ote_qp_t *a = MakeQp(0, Config(16));
    ote_qp_t *b = nullptr;
    ASSERT_EQ(ote_qp_create(lane_[1], &cb, &b), OTE_OK);
    ASSERT_EQ(ConnectPair(a, b), OTE_OK);
    EXPECT_EQ(ote_qp_recv_credits(b), 2u);

    for (size_t i = 0; i < 4096; i++) mem_[0][i] = (uint8_t)(i * 13 + 5);
    Wr w;
    Rdma(&w, 0, 1, IBV_WR_RDMA_WRITE, 0, 4096);
    w.wr.wr.rdma.rkey = pmr->rkey; // the private PD's MR
    ote_qp_post_result_t res;
    ASSERT_EQ(ote_qp_post_send(a, &w.wr, Soon(), &res), OTE_OK);
    ASSERT_EQ(ote_qp_wait_idle(a, Soon()), OTE_OK);
    EXPECT_EQ(rec_[0].First(1).status, IBV_WC_SUCCESS);
    EXPECT_EQ(memcmp(mem_[0].data(), mem_[1].data(), 4096), 0);

    const char msg[] = "receipt";
    memcpy(mem_[0].data() + 8192, msg, sizeof(msg));
    Rdma(&w, 0, 2, IBV_WR_SEND, 8192, sizeof(msg));
    ASSERT_EQ(ote_qp_post_send(a, &w.wr, Soon(), &res), OTE_OK);
    Inbox::Want want{&inbox, 1};
    ASSERT_EQ(ote_cq_lane_progress(lane_[1], &Inbox::Reached, &want, Soon()), OTE_OK);
    ASSERT_EQ(ote_qp_wait_idle(a, Soon()), OTE_OK);
    {
        std::lock_guard<std::mutex> g(inbox.mu);
        EXPECT_EQ(inbox.msgs.at(0), std::string(msg, sizeof(msg)));
    }

    // The same range through the context PD's MR: refused, nothing written.
    std::vector<uint8_t> before(mem_[1].begin() + 4096, mem_[1].begin() + 8192);
    for (size_t i = 4096; i < 8192; i++) mem_[0][i] = 0xEE;
    Rdma(&w, 0, 3, IBV_WR_RDMA_WRITE, 4096, 4096);
    ASSERT_EQ(ote_qp_post_send(a, &w.wr, Soon(), &res), OTE_OK);
    ASSERT_EQ(ote_qp_wait_idle(a, Soon()), OTE_OK);
    ASSERT_EQ(rec_[0].Count(3), 1u);
    EXPECT_NE(rec_[0].First(3).status, IBV_WC_SUCCESS);
    EXPECT_TRUE(std::equal(before.begin(), before.end(), mem_[1].begin() + 4096));

    EXPECT_EQ(ote_qp_destroy(b, Soon()), OTE_OK);
    EXPECT_EQ(v->ops->dereg_mr(v, pmr), 0);
    EXPECT_EQ(v->ops->dealloc_pd(v, pd), 0);
}

TEST_F(QpTest, AdmissionIsBoundedByMaxSendWrAndAllOrNothing) {
    ote_qp_t *a = MakeQp(0, Config(4));
    ote_qp_t *b = MakeQp(1, Config(4));
    ote_qp_post_result_t res;
    Wr w;
    Rdma(&w, 0, 1, IBV_WR_RDMA_WRITE, 0, 8);
    EXPECT_EQ(ote_qp_post_send(a, &w.wr, Soon(), &res), OTE_ERR_STATE); // not connected
    EXPECT_EQ(res.accepted, 0u);
    ASSERT_EQ(ConnectPair(a, b), OTE_OK);

    auto five = Window(0, 1, 5, 512);
    EXPECT_EQ(ote_qp_post_send(a, &five[0].wr, Soon(), &res), OTE_ERR_AGAIN);
    EXPECT_EQ(res.accepted, 0u);
    EXPECT_EQ(res.unposted, &five[0].wr);
    ote_qp_stats_t st;
    ote_qp_get_stats(a, &st);
    EXPECT_EQ(st.sq_outstanding, 0u);

    auto four = Window(0, 1, 4, 512);
    ASSERT_EQ(ote_qp_post_send(a, &four[0].wr, Soon(), &res), OTE_OK);
    EXPECT_EQ(res.accepted, 4u);
    // An id that is still outstanding is refused (until its CQE is polled).
    ote_qp_get_stats(a, &st);
    if (st.sq_outstanding == 4) {
        Wr again;
        Rdma(&again, 0, 1, IBV_WR_RDMA_WRITE, 0, 8);
        EXPECT_NE(ote_qp_post_send(a, &again.wr, Soon(), &res), OTE_OK);
    }
    ASSERT_EQ(ote_qp_wait_idle(a, Soon()), OTE_OK);
    for (uint64_t i = 1; i <= 4; i++) EXPECT_EQ(rec_[0].Count(i), 1u);
    // Within a chain a duplicate is refused before anything is posted.
    auto dup = Window(0, 7, 2, 8);
    dup[1].wr.wr_id = dup[0].wr.wr_id;
    EXPECT_EQ(ote_qp_post_send(a, &dup[0].wr, Soon(), &res), OTE_ERR_INVALID);
    ote_qp_get_stats(a, &st);
    EXPECT_EQ(st.sq_outstanding, 0u);
    EXPECT_EQ(st.send_completions, 4u);
}

// Send credits shared by two QPs (ote_sq_pool_t, limit 3): a chain of 5 posts the 3 WRs
// it has credits for and returns the rest unposted (AGAIN); a post on the other QP finds
// none (AGAIN, nothing posted); once the completions came every credit is back, the
// suffix posts, and the peak never passed the limit.
TEST_F(QpTest, SharedSendCreditsAdmitAPrefixAndReturnOnCompletion) {
    ote_sq_pool_t *pool = nullptr;
    ASSERT_EQ(ote_sq_pool_create(0, &pool), OTE_ERR_INVALID);
    ASSERT_EQ(ote_sq_pool_create(3, &pool), OTE_OK);
    ote_qp_config_t cfg = Config();
    cfg.sq_pool = pool;
    ote_qp_t *a = MakeQp(0, cfg);
    ote_qp_t *b = MakeQp(1, cfg);
    ote_qp_t *c = MakeQp(0, cfg);
    ote_qp_t *d = MakeQp(1, cfg);
    ASSERT_EQ(ConnectPair(a, b), OTE_OK);
    ASSERT_EQ(ConnectPair(c, d), OTE_OK);
    auto five = Window(0, 1, 5, 512);
    ote_qp_post_result_t res;
    EXPECT_EQ(ote_qp_post_send(a, &five[0].wr, Soon(), &res), OTE_ERR_AGAIN);
    EXPECT_EQ(res.accepted, 3u);
    EXPECT_EQ(res.unposted, &five[3].wr);
    EXPECT_EQ(five[2].wr.next, &five[3].wr) << "the caller's chain is left as it was";
    ote_sq_pool_stats_t ps;
    ote_sq_pool_get_stats(pool, &ps);
    EXPECT_LE(ps.in_use, 3u);
    auto other = Window(0, 100, 1, 8);
    ote_status_t st = ote_qp_post_send(c, &other[0].wr, Soon(), &res);
    if (st != OTE_OK) { // else a completion already gave a credit back
        EXPECT_EQ(st, OTE_ERR_AGAIN);
        EXPECT_EQ(res.accepted, 0u);
        EXPECT_EQ(res.unposted, &other[0].wr);
    }
    ASSERT_EQ(ote_qp_wait_idle(a, Soon()), OTE_OK);
    ASSERT_EQ(ote_qp_wait_idle(c, Soon()), OTE_OK);
    ote_sq_pool_get_stats(pool, &ps);
    EXPECT_EQ(ps.in_use, 0u);
    ASSERT_EQ(ote_qp_post_send(a, &five[3].wr, Soon(), &res), OTE_OK);
    EXPECT_EQ(res.accepted, 2u);
    ASSERT_EQ(ote_qp_wait_idle(a, Soon()), OTE_OK);
    for (uint64_t i = 1; i <= 5; i++) EXPECT_EQ(rec_[0].Count(i), 1u);
    ote_sq_pool_get_stats(pool, &ps);
    EXPECT_EQ(ps.in_use, 0u);
    EXPECT_EQ(ps.peak, 3u);
    EXPECT_GE(ps.waits, 1u);
    // A destroyed QP gives back what it still held.
    auto two = Window(0, 200, 2, 512);
    ASSERT_EQ(ote_qp_post_send(c, &two[0].wr, Soon(), &res), OTE_OK);
    Forget(c);
    EXPECT_EQ(ote_qp_destroy(c, Soon()), OTE_OK);
    ote_sq_pool_get_stats(pool, &ps);
    EXPECT_EQ(ps.in_use, 0u);
    Forget(a);
    Forget(b);
    Forget(d);
    EXPECT_EQ(ote_qp_destroy(a, Soon()), OTE_OK);
    EXPECT_EQ(ote_qp_destroy(b, Soon()), OTE_OK);
    EXPECT_EQ(ote_qp_destroy(d, Soon()), OTE_OK);
    ote_sq_pool_destroy(pool);
}

TEST_F(QpTest, WorkersCompleteManyWindowsExactlyOnce) {
    ote_cq_workers_t *w = nullptr;
    ASSERT_EQ(ote_cq_workers_start(1, &w), OTE_OK);
    ASSERT_EQ(ote_cq_workers_add(w, lane_[0]), OTE_OK);
    ASSERT_EQ(ote_cq_workers_add(w, lane_[1]), OTE_OK);
    ote_qp_t *a = MakeQp(0, Config(32));
    ote_qp_t *b = MakeQp(1, Config(32));
    ASSERT_EQ(ConnectPair(a, b), OTE_OK);
    for (size_t i = 0; i < kMem; i++) mem_[0][i] = (uint8_t)(i % 251);
    const size_t kWindows = 50, kPer = 8, kLen = 2048;
    size_t posted = 0;
    ote_deadline_t d = Soon(60000);
    for (size_t win = 0; win < kWindows && !ote_deadline_expired(d);) {
        auto v = Window(0, win * kPer, kPer, kLen);
        ote_qp_post_result_t res;
        ote_status_t st = ote_qp_post_send(a, &v[0].wr, d, &res);
        if (st == OTE_ERR_AGAIN) continue; // SQ full: the worker frees it
        ASSERT_EQ(st, OTE_OK);
        posted += res.accepted;
        win++;
    }
    ASSERT_EQ(ote_qp_wait_idle(a, Soon()), OTE_OK);
    EXPECT_EQ(posted, kWindows * kPer);
    EXPECT_EQ(rec_[0].Total(), kWindows * kPer);
    for (uint64_t id = 0; id < kWindows * kPer; id++) ASSERT_EQ(rec_[0].Count(id), 1u) << id;
    EXPECT_EQ(memcmp(mem_[0].data(), mem_[1].data(), kPer * kLen), 0);
    ASSERT_EQ(ote_cq_workers_remove(w, lane_[0]), OTE_OK);
    ASSERT_EQ(ote_cq_workers_remove(w, lane_[1]), OTE_OK);
    EXPECT_EQ(ote_cq_workers_stop(w), OTE_OK);
}

// The QP settles its count in its hook, before the lane delivers the same CQE to the
// WR's namespace: ote_qp_wait_idle() must not return between the two (it once did, and
// WorkersCompleteManyWindowsExactlyOnce saw 399 of 400 completions).
struct SlowRecord {
    std::atomic<int> delivered{0};
    static void Fn(void *arg, ote_cq_lane_t *, ote_cq_dir_t, const ibv_wc *) {
        auto *r = static_cast<SlowRecord *>(arg);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        r->delivered.fetch_add(1);
    }
};

TEST_F(QpTest, WaitIdleReturnsOnlyOnceTheCompletionIsDelivered) {
    SlowRecord slow;
    uint32_t ns = 0;
    ASSERT_EQ(ote_cq_lane_register_ns(lane_[0], &SlowRecord::Fn, &slow, &ns), OTE_OK);
    ote_cq_workers_t *w = nullptr;
    ASSERT_EQ(ote_cq_workers_start(1, &w), OTE_OK);
    ASSERT_EQ(ote_cq_workers_add(w, lane_[0]), OTE_OK);
    ote_qp_t *a = MakeQp(0, Config(8));
    ote_qp_t *b = MakeQp(1, Config(8));
    ASSERT_EQ(ConnectPair(a, b), OTE_OK);
    for (int round = 0; round < 3; round++) {
        Wr wr;
        Rdma(&wr, 0, 0, IBV_WR_RDMA_WRITE, 0, 64);
        wr.wr.wr_id = OTE_CQ_WR_ID(ns, (uint64_t)round);
        ote_qp_post_result_t res;
        ASSERT_EQ(ote_qp_post_send(a, &wr.wr, Soon(), &res), OTE_OK);
        ASSERT_EQ(ote_qp_wait_idle(a, Soon()), OTE_OK);
        EXPECT_EQ(slow.delivered.load(), round + 1);
    }
    ASSERT_EQ(ote_cq_workers_remove(w, lane_[0]), OTE_OK);
    EXPECT_EQ(ote_cq_workers_stop(w), OTE_OK);
    ote_cq_lane_unregister_ns(lane_[0], ns);
}

TEST_F(QpTest, DestroyFlushesAndEndsEveryOutstandingWrOnce) {
    ote_qp_t *a = MakeQp(0, Config(16));
    ote_qp_t *b = MakeQp(1, Config(16, 2, 64));
    ASSERT_EQ(ConnectPair(a, b), OTE_OK);
    auto v = Window(0, 1, 3, 64);
    ote_qp_post_result_t res;
    ASSERT_EQ(ote_qp_post_send(a, &v[0].wr, Soon(), &res), OTE_OK);
    Forget(a);
    Forget(b);
    EXPECT_EQ(ote_qp_destroy(a, Soon()), OTE_OK);
    for (uint64_t i = 1; i <= 3; i++) EXPECT_EQ(rec_[0].Count(i), 1u);
    EXPECT_EQ(ote_cq_lane_outstanding(lane_[0], OTE_CQ_SEND), 0u);
    EXPECT_EQ(ote_qp_destroy(b, Soon()), OTE_OK);
    EXPECT_EQ(ote_cq_lane_outstanding(lane_[1], OTE_CQ_RECV), 0u); // slots flushed or dropped
}

} // namespace

namespace {

// The READ depth a QP connects with stays within the device's limits and, as initiator,
// within the responder depth its peer's path announces; the path carries this end's
// responder depth for the peer.
TEST_F(QpTest, ReadDepthStaysWithinTheDeviceAndThePeersResponderDepth) {
    ote_context_info_t info;
    ote_context_get_info(ctx_[0], &info);
    uint32_t dev = std::min(info.limits.max_qp_rd_atom, info.limits.max_qp_init_rd_atom);
    ASSERT_GT(dev, 0u);
    ote_qp_config_t big = Config();
    big.max_rd_atomic = 255; // far above any device: clamped, not refused
    ote_qp_t *a = MakeQp(0, big);
    ote_qp_config_t small = Config();
    small.max_rd_atomic = 2;
    ote_qp_t *b = MakeQp(1, small);
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    ote_qp_path_t pa, pb;
    ote_qp_local_path(a, &pa);
    ote_qp_local_path(b, &pb);
    EXPECT_EQ(pa.rd_atom, std::min<uint32_t>(dev, 255));
    EXPECT_EQ(pb.rd_atom, 2u);
    ASSERT_EQ(ConnectPair(a, b), OTE_OK);
    ibv_qp_attr attr;
    ibv_qp_init_attr init;
    ASSERT_EQ(v_->ops->query_qp(v_, ote_qp_native(a), &attr,
                                IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC, &init),
              0);
    EXPECT_EQ(attr.max_rd_atomic, 2u); // b accepts 2 READs in flight: a keeps no more
    EXPECT_EQ(attr.max_dest_rd_atomic, std::min<uint32_t>(dev, 255));

    // READs still move bytes at that depth.
    for (size_t i = 0; i < 4096; i++) mem_[1][i] = (uint8_t)(i * 13 + 5);
    Wr w;
    Rdma(&w, 0, 1, IBV_WR_RDMA_READ, 0, 4096);
    ote_qp_post_result_t res;
    ASSERT_EQ(ote_qp_post_send(a, &w.wr, Soon(), &res), OTE_OK);
    ASSERT_EQ(ote_qp_wait_idle(a, Soon()), OTE_OK);
    EXPECT_EQ(memcmp(mem_[0].data(), mem_[1].data(), 4096), 0);
}

// Ports with a 9000-byte netdev MTU (active MTU 4096) on both devices.
class QpAddressVectorTest : public QpFixture {
  protected:
    void SetUp() override {
        QpFixture::SetUp();
        Start(false,
              "dev=sim0,numa=0;port,mtu=9000;gid=auto-v4,type=v2;"
              "dev=sim1,numa=1;port,mtu=9000;gid=auto-v4,type=v2");
    }
    ibv_qp_attr Query(ote_qp_t *qp) {
        ibv_qp_attr attr;
        ibv_qp_init_attr init;
        memset(&attr, 0, sizeof(attr));
        EXPECT_EQ(
            v_->ops->query_qp(v_, ote_qp_native(qp), &attr, IBV_QP_AV | IBV_QP_PATH_MTU, &init), 0);
        return attr;
    }
};

// Each end connects with its own traffic class and service level in the address vector,
// and with the path MTU min(its port's active MTU, the peer's, its clamp): the clamped
// end tells its peer the clamped MTU, so both ends agree. A service level past 4 bits is
// refused at create. Bytes still move.
TEST_F(QpAddressVectorTest, TrafficClassServiceLevelAndMtuClampReachTheQps) {
    ote_qp_config_t ca = Config();
    ca.traffic_class = 106; // DSCP 26, ECN 2
    ca.service_level = 3;
    ca.max_path_mtu = IBV_MTU_2048;
    ote_qp_config_t cb = Config();
    cb.traffic_class = 184; // DSCP 46
    cb.service_level = 5;
    ote_qp_t *a = MakeQp(0, ca);
    ote_qp_t *b = MakeQp(1, cb);
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    ote_qp_path_t pa, pb;
    ote_qp_local_path(a, &pa);
    ote_qp_local_path(b, &pb);
    EXPECT_EQ(pa.mtu, IBV_MTU_2048); // active 4096, clamped
    EXPECT_EQ(pb.mtu, IBV_MTU_4096);
    ASSERT_EQ(ConnectPair(a, b), OTE_OK);
    ibv_qp_attr qa = Query(a), qb = Query(b);
    EXPECT_EQ(qa.ah_attr.grh.traffic_class, 106);
    EXPECT_EQ(qa.ah_attr.sl, 3);
    EXPECT_EQ(qa.path_mtu, IBV_MTU_2048);
    EXPECT_EQ(qb.ah_attr.grh.traffic_class, 184);
    EXPECT_EQ(qb.ah_attr.sl, 5);
    EXPECT_EQ(qb.path_mtu, IBV_MTU_2048); // the peer's clamped MTU
    // The sim's record of the same connections.
    ote_sim_qp_path_t paths[8];
    size_t n = 0;
    ASSERT_EQ(ote_sim_qp_paths(sim_, paths, 8, &n), OTE_OK);
    ASSERT_EQ(n, 2u);
    EXPECT_STREQ(paths[0].dev, "sim0");
    EXPECT_EQ(paths[0].qp_num, ote_qp_native(a)->qp_num);
    EXPECT_EQ(paths[0].traffic_class, 106);
    EXPECT_EQ(paths[0].sl, 3);
    EXPECT_EQ(paths[1].traffic_class, 184);
    EXPECT_EQ(paths[1].path_mtu, IBV_MTU_2048);

    for (size_t i = 0; i < 8192; i++) mem_[0][i] = (uint8_t)(i * 11 + 3);
    Wr w;
    Rdma(&w, 0, 1, IBV_WR_RDMA_WRITE, 0, 8192);
    ote_qp_post_result_t res;
    ASSERT_EQ(ote_qp_post_send(a, &w.wr, Soon(), &res), OTE_OK);
    ASSERT_EQ(ote_qp_wait_idle(a, Soon()), OTE_OK);
    EXPECT_EQ(memcmp(mem_[0].data(), mem_[1].data(), 8192), 0);

    ote_qp_config_t bad = Config();
    bad.service_level = 16;
    ote_qp_t *q = nullptr;
    EXPECT_EQ(ote_qp_create(lane_[0], &bad, &q), OTE_ERR_INVALID);
    bad = Config();
    bad.max_path_mtu = (ibv_mtu)6;
    EXPECT_EQ(ote_qp_create(lane_[0], &bad, &q), OTE_ERR_INVALID);
    EXPECT_EQ(q, nullptr);
}

} // namespace

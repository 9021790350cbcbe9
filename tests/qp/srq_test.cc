// tests/qp/srq_test.cc - the qp layer's shared receive queue (qp/srq.h) over the sim:
// three QPs of one lane receive through one SRQ (each message handed to its own QP's
// on_recv, slots reposted), receive credits exact per SRQ (admission refused at the
// posted slots, reservations given back by unadmit and by a QP's destruction), destroy
// order (BUSY while a QP is attached), a QP in ERR while the others go on, and a
// completion of a QP already destroyed coming back to the SRQ.
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "tests/qp/qp_fixture.h"

extern "C" {
#include "base/fault.h"
#include "qp/srq.h"
}

namespace {

using ote_test::QpFixture;

// What one receiving QP got through on_recv: (its QP number, the message).
struct Inbox {
    std::mutex mu;
    std::vector<std::pair<uint32_t, std::string>> msgs;
    static void Fn(void *arg, ote_qp_t *qp, const ibv_wc *wc, const void *buf) {
        auto *in = static_cast<Inbox *>(arg);
        std::lock_guard<std::mutex> g(in->mu);
        in->msgs.emplace_back(ote_qp_num(qp),
                              std::string(static_cast<const char *>(buf), wc->byte_len));
    }
    size_t Size() {
        std::lock_guard<std::mutex> g(mu);
        return msgs.size();
    }
};

struct Want {
    Inbox *in;
    size_t n;
    static int Reached(void *arg) {
        auto *w = static_cast<Want *>(arg);
        return w->in->Size() >= w->n;
    }
};

class SrqTest : public QpFixture {
  protected:
    void SetUp() override {
        QpFixture::SetUp();
        ASSERT_NO_FATAL_FAILURE(Start(false));
    }
    void TearDown() override {
        // QPs first, then the SRQ (it refuses while a QP is attached), then the lanes.
        for (auto *&qp : qps_) {
            if (qp != nullptr) {
                EXPECT_EQ(ote_qp_destroy(qp, Soon()), OTE_OK);
            }
            qp = nullptr;
        }
        if (srq_ != nullptr) {
            EXPECT_EQ(ote_srq_destroy(srq_), OTE_OK);
        }
        QpFixture::TearDown();
    }

    void MakeSrq(uint32_t slots, uint32_t size = 256, uint32_t low_water = 0) {
        ote_srq_config_t c;
        ote_srq_config_default(&c);
        c.slots = slots;
        c.size = size;
        c.low_water = low_water;
        ASSERT_EQ(ote_srq_create(lane_[1], &c, &srq_), OTE_OK);
    }

    // A receiving QP on side 1 on the SRQ, its messages into *in.
    ote_qp_t *SrqQp(Inbox *in) {
        ote_qp_config_t c = Config(16);
        c.srq = srq_;
        c.on_recv = &Inbox::Fn;
        c.recv_arg = in;
        return MakeQp(1, c);
    }

    // One SEND of msg from sender a (side 0), waited for on the sender's side.
    void Send(ote_qp_t *a, const std::string &msg, uint64_t id) {
        size_t off = (size_t)(id % 1000) * 128;
        memcpy(mem_[0].data() + off, msg.data(), msg.size());
        Wr w;
        Rdma(&w, 0, id, IBV_WR_SEND, off, msg.size());
        ote_qp_post_result_t res;
        ASSERT_EQ(ote_qp_post_send(a, &w.wr, Soon(), &res), OTE_OK);
        ASSERT_EQ(ote_qp_wait_idle(a, Soon()), OTE_OK);
        ASSERT_EQ(rec_[0].First(id).status, IBV_WC_SUCCESS) << msg;
    }

    ote_srq_t *srq_ = nullptr;
};

// Three QPs on one SRQ of 8 slots take 30 messages: each reaches the on_recv of the QP
// it came in on, in order; every slot is reposted; credits are exact throughout.
TEST_F(SrqTest, ThreeQpsShareOneSrq) {
    ASSERT_NO_FATAL_FAILURE(MakeSrq(8));
    EXPECT_EQ(ote_srq_credits(srq_), 8u);
    EXPECT_EQ(ote_cq_lane_outstanding(lane_[1], OTE_CQ_RECV), 8u);
    Inbox in[3];
    ote_qp_t *snd[3], *rcv[3];
    for (int i = 0; i < 3; i++) {
        snd[i] = MakeQp(0, Config(16));
        rcv[i] = SrqQp(&in[i]);
        ASSERT_TRUE(snd[i] && rcv[i]);
        ASSERT_EQ(ConnectPair(snd[i], rcv[i]), OTE_OK);
        EXPECT_EQ(ote_qp_recv_credits(rcv[i]), 8u) << "no receives of its own";
    }
    for (int k = 0; k < 10; k++) {
        for (int i = 0; i < 3; i++) {
            ASSERT_EQ(ote_qp_rq_admit(rcv[i]), OTE_OK); // a slot kept for the message
            std::string msg = "qp " + std::to_string(i) + " message " + std::to_string(k);
            ASSERT_NO_FATAL_FAILURE(Send(snd[i], msg, (uint64_t)(100 * i + k)));
            Want w{&in[i], (size_t)k + 1};
            ASSERT_EQ(ote_cq_lane_progress(lane_[1], &Want::Reached, &w, Soon()), OTE_OK);
            ote_qp_rq_unadmit(rcv[i]); // consumed
        }
    }
    for (int i = 0; i < 3; i++) {
        ASSERT_EQ(in[i].msgs.size(), 10u);
        for (int k = 0; k < 10; k++) {
            EXPECT_EQ(in[i].msgs[(size_t)k].first, ote_qp_num(rcv[i]));
            EXPECT_EQ(in[i].msgs[(size_t)k].second,
                      "qp " + std::to_string(i) + " message " + std::to_string(k));
        }
        ote_qp_stats_t qs;
        ote_qp_get_stats(rcv[i], &qs);
        EXPECT_EQ(qs.recv_completions, 10u);
        EXPECT_EQ(qs.rq_slots, 0u);
    }
    ote_srq_stats_t st;
    ote_srq_get_stats(srq_, &st);
    EXPECT_EQ(st.slots, 8u);
    EXPECT_EQ(st.posted, 8u) << "every slot reposted";
    EXPECT_EQ(st.completions, 30u);
    EXPECT_EQ(st.errors, 0u);
    EXPECT_EQ(st.orphans, 0u);
    EXPECT_EQ(st.admitted, 0u);
    EXPECT_EQ(st.peak_admitted, 1u);
    EXPECT_EQ(st.attached, 3u);
    EXPECT_EQ(ote_cq_lane_outstanding(lane_[1], OTE_CQ_RECV), 8u);
    EXPECT_EQ(rec_[1].Total(), 0u) << "receive CQEs belong to the SRQ, not to a record";
}

// Admission: the reservations of all QPs together never exceed the SRQ's posted slots;
// a QP gives back only what it holds, and its destruction gives back the rest.
TEST_F(SrqTest, AdmissionIsExactPerSrq) {
    ASSERT_NO_FATAL_FAILURE(MakeSrq(4));
    Inbox in[2];
    ote_qp_t *s0 = MakeQp(0, Config(16)), *s1 = MakeQp(0, Config(16));
    ote_qp_t *r0 = SrqQp(&in[0]), *r1 = SrqQp(&in[1]);
    ASSERT_TRUE(s0 && s1 && r0 && r1);
    EXPECT_EQ(ote_qp_rq_admit(r0), OTE_ERR_AGAIN) << "not connected yet";
    ASSERT_EQ(ConnectPair(s0, r0), OTE_OK);
    ASSERT_EQ(ConnectPair(s1, r1), OTE_OK);
    EXPECT_EQ(ote_qp_rq_admit(r0), OTE_OK);
    EXPECT_EQ(ote_qp_rq_admit(r0), OTE_OK);
    EXPECT_EQ(ote_qp_rq_admit(r1), OTE_OK);
    EXPECT_EQ(ote_srq_admit(srq_), OTE_OK); // the SRQ's own API shares the same slots
    EXPECT_EQ(ote_qp_rq_admit(r1), OTE_ERR_AGAIN);
    EXPECT_EQ(ote_qp_rq_admit(r0), OTE_ERR_AGAIN);
    EXPECT_EQ(ote_srq_admit(srq_), OTE_ERR_AGAIN);
    EXPECT_EQ(ote_srq_admitted(srq_), 4u);
    EXPECT_EQ(ote_qp_rq_admitted(r0), 2u);
    EXPECT_EQ(ote_qp_rq_admitted(r1), 1u);
    ote_srq_unadmit(srq_);
    EXPECT_EQ(ote_qp_rq_admit(r1), OTE_OK);
    // A message consumes a slot: until it is reposted, the posted count is what admits.
    ASSERT_NO_FATAL_FAILURE(Send(s0, "one", 1));
    Want w{&in[0], 1};
    ASSERT_EQ(ote_cq_lane_progress(lane_[1], &Want::Reached, &w, Soon()), OTE_OK);
    EXPECT_EQ(ote_srq_credits(srq_), 4u) << "reposted after on_recv";
    ote_qp_rq_unadmit(r0);
    EXPECT_EQ(ote_srq_admitted(srq_), 3u);
    // r1 holds 2; its destruction gives them back.
    ASSERT_EQ(ote_qp_destroy(r1, Soon()), OTE_OK);
    Forget(r1);
    EXPECT_EQ(ote_srq_admitted(srq_), 1u);
    ote_qp_rq_unadmit(r0);
    ote_qp_rq_unadmit(r0); // holds none now: the SRQ is not touched
    EXPECT_EQ(ote_qp_rq_admitted(r0), 0u);
    EXPECT_EQ(ote_srq_admitted(srq_), 0u);
    ote_srq_stats_t st;
    ote_srq_get_stats(srq_, &st);
    EXPECT_EQ(st.peak_admitted, 4u);
    EXPECT_EQ(st.attached, 1u);
}

// QPs first, then the SRQ: BUSY while a QP is attached, and a QP's config is checked
// against the SRQ (no receive slots of its own, the SRQ's lane).
TEST_F(SrqTest, DestroyOrderAndConfigChecks) {
    ASSERT_NO_FATAL_FAILURE(MakeSrq(4));
    Inbox in;
    ote_qp_t *r = SrqQp(&in);
    ASSERT_NE(r, nullptr);
    ote_qp_config_t bad = Config(16, 4, 256);
    bad.srq = srq_;
    ote_qp_t *q = nullptr;
    EXPECT_EQ(ote_qp_create(lane_[1], &bad, &q), OTE_ERR_INVALID) << "own slots and an SRQ";
    bad = Config(16);
    bad.srq = srq_;
    EXPECT_EQ(ote_qp_create(lane_[0], &bad, &q), OTE_ERR_INVALID) << "another lane's SRQ";
    EXPECT_EQ(q, nullptr);
    EXPECT_EQ(ote_srq_destroy(srq_), OTE_ERR_BUSY);
    ote_srq_stats_t st;
    ote_srq_get_stats(srq_, &st);
    EXPECT_EQ(st.attached, 1u);
    EXPECT_EQ(st.posted, 4u) << "still whole after the refusal";
    ASSERT_EQ(ote_qp_destroy(r, Soon()), OTE_OK);
    Forget(r);
    EXPECT_EQ(ote_srq_destroy(srq_), OTE_OK);
    srq_ = nullptr;
    EXPECT_EQ(ote_cq_lane_outstanding(lane_[1], OTE_CQ_RECV), 0u) << "its charges went back";
}

// One QP goes to ERR: its receives are refused, the SRQ keeps every slot (nothing is
// flushed) and the other QP goes on receiving through it.
TEST_F(SrqTest, QpInErrWhileOthersContinue) {
    ASSERT_NO_FATAL_FAILURE(MakeSrq(4));
    Inbox in[2];
    ote_qp_t *s0 = MakeQp(0, Config(16)), *s1 = MakeQp(0, Config(16));
    ote_qp_t *r0 = SrqQp(&in[0]), *r1 = SrqQp(&in[1]);
    ASSERT_TRUE(s0 && s1 && r0 && r1);
    ASSERT_EQ(ConnectPair(s0, r0), OTE_OK);
    ASSERT_EQ(ConnectPair(s1, r1), OTE_OK);
    ASSERT_EQ(ote_qp_cancel(r0), OTE_OK); // r0 to ERR
    EXPECT_EQ(ote_qp_rq_admit(r0), OTE_ERR_AGAIN);
    for (int k = 0; k < 6; k++) {
        ASSERT_EQ(ote_qp_rq_admit(r1), OTE_OK);
        ASSERT_NO_FATAL_FAILURE(Send(s1, "to r1 #" + std::to_string(k), (uint64_t)k));
        Want w{&in[1], (size_t)k + 1};
        ASSERT_EQ(ote_cq_lane_progress(lane_[1], &Want::Reached, &w, Soon()), OTE_OK);
        ote_qp_rq_unadmit(r1);
    }
    EXPECT_EQ(in[1].msgs.back().second, "to r1 #5");
    EXPECT_EQ(in[0].Size(), 0u);
    ote_srq_stats_t st;
    ote_srq_get_stats(srq_, &st);
    EXPECT_EQ(st.posted, 4u);
    EXPECT_EQ(st.completions, 6u);
    EXPECT_EQ(st.errors, 0u) << "no SRQ slot flushed by r0's ERR";
    ote_qp_stats_t qs;
    ote_qp_get_stats(r0, &qs);
    EXPECT_EQ(qs.state, IBV_QPS_ERR);
}

// A message that arrived for a QP destroyed before its CQE was polled: the SRQ gets the
// slot back (an orphan, reposted) and nobody's on_recv sees it.
TEST_F(SrqTest, CompletionOfADestroyedQpReturnsItsSlot) {
    ASSERT_NO_FATAL_FAILURE(MakeSrq(4));
    Inbox in;
    ote_qp_t *s = MakeQp(0, Config(16)), *r = SrqQp(&in);
    ASSERT_TRUE(s && r);
    ASSERT_EQ(ConnectPair(s, r), OTE_OK);
    ASSERT_NO_FATAL_FAILURE(Send(s, "late", 1)); // its receive CQE waits on lane 1
    ASSERT_EQ(ote_qp_destroy(r, Soon()), OTE_OK);
    Forget(r);
    struct Full {
        ote_srq_t *srq;
        static int Fn(void *arg) {
            ote_srq_stats_t st;
            ote_srq_get_stats(static_cast<Full *>(arg)->srq, &st);
            return st.completions + st.errors == 1 && st.posted == 4;
        }
    } full{srq_};
    ASSERT_EQ(ote_cq_lane_progress(lane_[1], &Full::Fn, &full, Soon()), OTE_OK);
    ote_srq_stats_t st;
    ote_srq_get_stats(srq_, &st);
    EXPECT_EQ(st.orphans, 1u);
    EXPECT_EQ(st.attached, 0u);
    EXPECT_EQ(in.Size(), 0u);
    ote_cq_lane_stats_t ls;
    ote_cq_lane_get_stats(lane_[1], &ls);
    EXPECT_EQ(ls.stray, 0u) << "the shared namespace took it";
}

// The native limit: receives consumed faster than they are polled take the posted
// count below the low water; the event reaches the SRQ through the context set's async
// dispatch (counted, WARN), and the limit is armed again once every slot is reposted.
TEST_F(SrqTest, LimitEventIsSeenAndRearmed) {
    ASSERT_NO_FATAL_FAILURE(MakeSrq(4, 256, /*low_water=*/3));
    Inbox in;
    ote_qp_t *s = MakeQp(0, Config(16)), *r = SrqQp(&in);
    ASSERT_TRUE(s && r);
    ASSERT_EQ(ConnectPair(s, r), OTE_OK);
    for (int round = 0; round < 2; round++) {
        // Two messages consumed by the device, not yet polled: 2 posted < 3.
        ASSERT_NO_FATAL_FAILURE(Send(s, "a", (uint64_t)(10 * round + 1)));
        ASSERT_NO_FATAL_FAILURE(Send(s, "b", (uint64_t)(10 * round + 2)));
        size_t handled = 0;
        uint64_t end = ote_now_ns() + 10 * OTE_NSEC_PER_SEC;
        ote_srq_stats_t st;
        do {
            ASSERT_EQ(ote_context_set_poll_events(set_, &handled), OTE_OK);
            ote_srq_get_stats(srq_, &st);
        } while (st.limit_events < (uint64_t)round + 1 && ote_now_ns() < end);
        EXPECT_EQ(st.limit_events, (uint64_t)round + 1);
        Want w{&in, (size_t)(2 * round + 2)};
        ASSERT_EQ(ote_cq_lane_progress(lane_[1], &Want::Reached, &w, Soon()), OTE_OK);
        ote_srq_get_stats(srq_, &st);
        EXPECT_EQ(st.posted, 4u);
        struct ibv_srq_attr a;
        ASSERT_EQ(v_->ops->query_srq(v_, ote_srq_native(srq_), &a), 0);
        EXPECT_EQ(a.srq_limit, 3u) << "armed again once full";
    }
}

} // namespace

namespace {

// The SRQ's own fault point: creation fails with the armed status before anything is
// made (no native SRQ, no MR, no lane charge, no output), then succeeds on the same lane.
TEST_F(SrqTest, FaultPointFailsCreateBeforeAnythingIsMade) {
    ASSERT_EQ(ote_fault_arm("qp.srq_create", OTE_FAULT_NTH, 1, OTE_ERR_NOMEM, 0), OTE_OK);
    ote_srq_config_t c;
    ote_srq_config_default(&c);
    c.slots = 8;
    c.low_water = 2;
    ote_srq_t *s = nullptr;
    EXPECT_EQ(ote_srq_create(lane_[1], &c, &s), OTE_ERR_NOMEM);
    EXPECT_EQ(s, nullptr);
    EXPECT_EQ(ote_fault_failures("qp.srq_create"), 1u);
    EXPECT_EQ(ote_cq_lane_outstanding(lane_[1], OTE_CQ_RECV), 0u);
    ASSERT_NO_FATAL_FAILURE(MakeSrq(8));
    ote_srq_stats_t st;
    ote_srq_get_stats(srq_, &st);
    EXPECT_EQ(st.posted, 8u);
}

} // namespace

namespace {

// Unbind and rebind (the reopen of its context, engine/rdma/rdma_reopen.c): refused while
// a QP is attached (and a bound SRQ is not rebound); unbound, it holds no posted slot and
// no receive-CQ charge; rebound (here on the same context's PD) it posts every slot again
// and a new QP on it receives.
TEST_F(SrqTest, UnbindThenRebindMakesItsNativesAnew) {
    ASSERT_NO_FATAL_FAILURE(MakeSrq(4));
    Inbox in;
    ote_qp_t *r = SrqQp(&in);
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(ote_srq_unbind(srq_), OTE_ERR_BUSY);
    EXPECT_EQ(ote_srq_rebind(srq_), OTE_ERR_STATE);
    ASSERT_EQ(ote_qp_destroy(r, Soon()), OTE_OK);
    Forget(r);
    ASSERT_EQ(ote_srq_unbind(srq_), OTE_OK);
    ote_srq_stats_t st;
    ote_srq_get_stats(srq_, &st);
    EXPECT_EQ(st.posted, 0u);
    EXPECT_EQ(ote_cq_lane_outstanding(lane_[1], OTE_CQ_RECV), 0u) << "its charges went back";
    ASSERT_EQ(ote_srq_rebind(srq_), OTE_OK);
    ote_srq_get_stats(srq_, &st);
    EXPECT_EQ(st.posted, 4u);
    EXPECT_EQ(ote_cq_lane_outstanding(lane_[1], OTE_CQ_RECV), 4u);
    ote_qp_t *s = MakeQp(0, Config(16));
    r = SrqQp(&in);
    ASSERT_TRUE(s && r);
    ASSERT_EQ(ConnectPair(s, r), OTE_OK);
    ASSERT_EQ(ote_qp_rq_admit(r), OTE_OK);
    ASSERT_NO_FATAL_FAILURE(Send(s, "after the rebind", 7));
    Want w{&in, 1};
    ASSERT_EQ(ote_cq_lane_progress(lane_[1], &Want::Reached, &w, Soon()), OTE_OK);
    ote_qp_rq_unadmit(r);
    ASSERT_EQ(in.msgs.size(), 1u);
    EXPECT_EQ(in.msgs[0].second, "after the rebind");
}

} // namespace

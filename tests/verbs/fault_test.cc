// Tests of verbs/fault: every rule of the decorator, over a small in-test mock provider
// (tests/verbs/mock_provider.h) so that the rules are checked independently of the sim.
#include <gtest/gtest.h>

#include <poll.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/util/test_base.h"
#include "tests/util/wait.h"
#include "tests/verbs/mock_provider.h"
#include "tests/verbs/op_caller.h"

extern "C" {
#include "base/alloc.h"
#include "base/log.h"
#include "base/time.h"
#include "verbs/fault.h"
#include "verbs/verbs.h"
}

namespace {

using ote_test::CallOp;
using ote_test::kMockDeviceFlags;
using ote_test::MockProvider;
using ote_test::OpArgs;
using ote_test::OpResult;
using ote_test::OpReturnsStatus;
using ote_test::OteTest;

#define OP(x) OTE_VERBS_FAULT_OP_##x

bool Readable(int fd) {
    struct pollfd p = {fd, POLLIN, 0};
    return poll(&p, 1, 0) == 1 && (p.revents & POLLIN) != 0;
}

class FaultTest : public OteTest {
  protected:
    void SetUp() override {
        OteTest::SetUp();
        ASSERT_EQ(ote_verbs_fault_wrap(mock_.verbs(), 0, &v_), OTE_OK);
    }
    void TearDown() override {
        DestroyAll();
        ote_verbs_close(v_);
        EXPECT_FALSE(mock_.closed()) << "the decorator closed a borrowed provider";
        EXPECT_EQ(mock_.live_objects(), 0);
        OteTest::TearDown();
    }

    // Opens the mock device and one of each object through the decorator.
    void OpenAll() {
        struct ibv_device **list = nullptr;
        int num = 0;
        ASSERT_EQ(v_->ops->get_device_list(v_, &list, &num), 0);
        ASSERT_EQ(num, 1);
        a_.dev = list[0];
        ASSERT_EQ(v_->ops->open_device(v_, list[0], &a_.ctx), 0);
        v_->ops->free_device_list(v_, list);
        ASSERT_EQ(v_->ops->alloc_pd(v_, a_.ctx, &a_.pd), 0);
        ASSERT_EQ(v_->ops->reg_mr(v_, a_.pd, buf_, sizeof(buf_), IBV_ACCESS_LOCAL_WRITE, &a_.mr),
                  0);
        ASSERT_EQ(v_->ops->alloc_mw(v_, a_.pd, IBV_MW_TYPE_2, &a_.mw), 0);
        ASSERT_EQ(v_->ops->create_comp_channel(v_, a_.ctx, &a_.ch), 0);
        ASSERT_EQ(v_->ops->create_cq(v_, a_.ctx, 64, nullptr, a_.ch, 0, &a_.cq), 0);
        a_.qp = CreateQp(a_.cq);
        ASSERT_NE(a_.qp, nullptr);
    }
    struct ibv_qp *CreateQp(struct ibv_cq *cq) {
        struct ibv_qp_init_attr init;
        std::memset(&init, 0, sizeof(init));
        init.send_cq = cq;
        init.recv_cq = cq;
        init.qp_type = IBV_QPT_RC;
        struct ibv_qp *qp = nullptr;
        EXPECT_EQ(v_->ops->create_qp(v_, a_.pd, &init, &qp), 0);
        return qp;
    }
    // Destroys what OpenAll made, in the order verbs require, through the inner provider
    // (so that rules still armed by a test do not get in the way).
    void DestroyAll() {
        ote_verbs_t *in = mock_.verbs();
        for (auto *qp : extra_qps_) in->ops->destroy_qp(in, qp);
        extra_qps_.clear();
        if (a_.qp) in->ops->destroy_qp(in, a_.qp);
        if (a_.srq) in->ops->destroy_srq(in, a_.srq);
        for (auto *cq : extra_cqs_) in->ops->destroy_cq(in, cq);
        extra_cqs_.clear();
        if (a_.cq) in->ops->destroy_cq(in, a_.cq);
        if (a_.ch) in->ops->destroy_comp_channel(in, a_.ch);
        if (a_.mw) in->ops->dealloc_mw(in, a_.mw);
        if (a_.mr) in->ops->dereg_mr(in, a_.mr);
        if (a_.pd) in->ops->dealloc_pd(in, a_.pd);
        // Contexts go through the decorator so that it drops its per-context state.
        if (a_.ctx) {
            ote_verbs_fault_clear(v_);
            EXPECT_EQ(v_->ops->close_device(v_, a_.ctx), 0);
        }
        a_ = OpArgs();
    }
    // Posts `n` RDMA WRITEs with wr_id first..first+n-1 as one list.
    int PostWrites(struct ibv_qp *qp, uint64_t first, int n, struct ibv_send_wr **bad,
                   std::vector<struct ibv_send_wr> *wrs) {
        wrs->assign(static_cast<size_t>(n), ibv_send_wr{});
        for (int i = 0; i < n; i++) {
            (*wrs)[i].wr_id = first + static_cast<uint64_t>(i);
            (*wrs)[i].opcode = IBV_WR_RDMA_WRITE;
            (*wrs)[i].next = i + 1 < n ? &(*wrs)[i + 1] : nullptr;
        }
        return v_->ops->post_send(v_, qp, wrs->data(), bad);
    }
    std::vector<uint64_t> PollIds(struct ibv_cq *cq, int max = 16) {
        std::vector<struct ibv_wc> wc(static_cast<size_t>(max));
        int n = v_->ops->poll_cq(v_, cq, max, wc.data());
        EXPECT_GE(n, 0);
        std::vector<uint64_t> ids;
        for (int i = 0; i < n; i++) ids.push_back(wc[i].wr_id);
        return ids;
    }

    MockProvider mock_;
    ote_verbs_t *v_ = nullptr;
    OpArgs a_;
    std::vector<struct ibv_qp *> extra_qps_;
    std::vector<struct ibv_cq *> extra_cqs_;
    char buf_[256] = {};
};

using Ids = std::vector<uint64_t>;

// ---- wrapping, names, counters ----

TEST_F(FaultTest, WrapNamesTheInnerProviderAndForwards) {
    EXPECT_STREQ(v_->provider, "fault(mock)");
    EXPECT_TRUE(ote_verbs_fault_is(v_));
    EXPECT_FALSE(ote_verbs_fault_is(mock_.verbs()));
    EXPECT_FALSE(ote_verbs_fault_is(nullptr));
    EXPECT_EQ(ote_verbs_fault_inner(v_), mock_.verbs());
    EXPECT_EQ(ote_verbs_fault_inner(mock_.verbs()), nullptr);
    OpenAll();
    EXPECT_STREQ(v_->ops->get_device_name(v_, a_.dev), "mock0");
    EXPECT_EQ(ote_verbs_fault_calls(v_, OP(ALLOC_PD)), 1u);
    EXPECT_EQ(mock_.inner_calls(OP(ALLOC_PD)), 1u);
    EXPECT_EQ(ote_verbs_fault_calls(v_, OP(GET_DEVICE_NAME)), 1u);
    EXPECT_EQ(ote_verbs_fault_calls(v_, OP(FREE_DEVICE_LIST)), 1u);
    EXPECT_EQ(ote_verbs_fault_injected(v_, OP(ALLOC_PD)), 0u);
    // Unimplemented inner ops still answer EOPNOTSUPP through the decorator.
    struct ibv_device_attr attr;
    EXPECT_EQ(v_->ops->query_device(v_, a_.ctx, &attr), EOPNOTSUPP);
    EXPECT_EQ(ote_verbs_fault_calls(v_, OP(QUERY_DEVICE)), 1u);
    // Objects are the inner provider's own.
    EXPECT_EQ(a_.pd->context, a_.ctx);
    EXPECT_EQ(mock_.live_objects(), 6);
}

TEST_F(FaultTest, WrapRejectsBadArguments) {
    ote_verbs_t *w = reinterpret_cast<ote_verbs_t *>(0x1);
    EXPECT_EQ(ote_verbs_fault_wrap(nullptr, 0, &w), OTE_ERR_INVALID);
    EXPECT_EQ(ote_verbs_fault_wrap(mock_.verbs(), 0, nullptr), OTE_ERR_INVALID);
    EXPECT_EQ(ote_verbs_fault_wrap(mock_.verbs(), 0x80, &w), OTE_ERR_INVALID);
    // A table with gaps is refused: the decorator never calls a NULL entry.
    ote_verbs_ops_t gappy;
    std::memset(&gappy, 0, sizeof(gappy));
    ote_verbs_t inner{};
    inner.ops = &gappy;
    inner.provider = "gappy";
    EXPECT_EQ(ote_verbs_fault_wrap(&inner, 0, &w), OTE_ERR_INVALID);
    EXPECT_EQ(w, reinterpret_cast<ote_verbs_t *>(0x1));
    // Rule functions refuse a provider that is not a decorator.
    EXPECT_EQ(ote_verbs_fault_fail(mock_.verbs(), OP(ALLOC_PD), OTE_FAULT_EVERY, 0, EIO),
              OTE_ERR_INVALID);
    EXPECT_EQ(ote_verbs_fault_calls(mock_.verbs(), OP(ALLOC_PD)), 0u);
}

TEST_F(FaultTest, WrapSurvivesEveryAllocationFailure) {
    int failures = 0;
    for (uint64_t n = 1; n < 32; n++) {
        ote_verbs_t *w = nullptr;
        ote_alloc_fail_nth(n);
        ote_status_t st = ote_verbs_fault_wrap(mock_.verbs(), 0, &w);
        ote_alloc_fail_disarm();
        if (st == OTE_OK) {
            ASSERT_NE(w, nullptr);
            ote_verbs_close(w);
            EXPECT_GT(failures, 0);
            return;
        }
        EXPECT_EQ(st, OTE_ERR_NOMEM);
        EXPECT_EQ(w, nullptr);
        failures++;
    }
    FAIL() << "wrap never succeeded";
}

TEST_F(FaultTest, OwnInnerClosesTheInnerProvider) {
    MockProvider other;
    ote_verbs_t *w = nullptr;
    ASSERT_EQ(ote_verbs_fault_wrap(other.verbs(), OTE_VERBS_FAULT_OWN_INNER, &w), OTE_OK);
    EXPECT_FALSE(other.closed());
    ote_verbs_close(w);
    EXPECT_TRUE(other.closed());
}

TEST_F(FaultTest, OpNamesCoverTheWholeTable) {
    ASSERT_EQ(sizeof(ote_verbs_ops_t) / sizeof(void *), static_cast<size_t>(OP(COUNT)));
    for (int i = 0; i < OP(COUNT); i++) {
        auto op = static_cast<ote_verbs_fault_op_t>(i);
        const char *name = ote_verbs_fault_op_name(op);
        ASSERT_STRNE(name, "unknown") << i;
        ote_verbs_fault_op_t back;
        ASSERT_EQ(ote_verbs_fault_op_from_name(name, &back), OTE_OK) << name;
        EXPECT_EQ(back, op) << name;
    }
    EXPECT_STREQ(ote_verbs_fault_op_name(OP(POST_SEND)), "post_send");
    EXPECT_STREQ(ote_verbs_fault_op_name(OP(DESTROY_COMP_CHANNEL)), "destroy_comp_channel");
    EXPECT_STREQ(ote_verbs_fault_op_name(OP(COUNT)), "unknown");
    ote_verbs_fault_op_t op;
    EXPECT_EQ(ote_verbs_fault_op_from_name("post_everything", &op), OTE_ERR_NOT_FOUND);
    int destroys = 0;
    for (int i = 0; i < OP(COUNT); i++)
        destroys += ote_verbs_fault_op_is_destroy(static_cast<ote_verbs_fault_op_t>(i));
    EXPECT_EQ(destroys, 8);
    EXPECT_TRUE(ote_verbs_fault_op_is_destroy(OP(DESTROY_SRQ)));
    EXPECT_TRUE(ote_verbs_fault_op_is_destroy(OP(CLOSE_DEVICE)));
    EXPECT_FALSE(ote_verbs_fault_op_is_destroy(OP(CREATE_QP)));
}

// ---- the extended entries (issue 25): pass-through, counted, failable by name ----

TEST_F(FaultTest, ExtendedEntriesPassThroughToTheInnerProvider) {
    OpenAll();
    const ote_verbs_ops_t *o = v_->ops;
    struct ibv_device_attr_ex ax;
    ASSERT_EQ(o->query_device_ex(v_, a_.ctx, &ax), 0);
    EXPECT_EQ(ax.orig_attr.max_qp_wr, 77) << "the answer is the inner provider's";
    uint32_t df = 0;
    ASSERT_EQ(o->device_flags(v_, a_.ctx, &df), 0);
    EXPECT_EQ(df, kMockDeviceFlags);

    struct ibv_qp_init_attr init;
    std::memset(&init, 0, sizeof(init));
    init.send_cq = a_.cq;
    init.recv_cq = a_.cq;
    init.qp_type = IBV_QPT_RC;
    struct ibv_qp *qp = nullptr;
    ASSERT_EQ(o->create_qp_flags(v_, a_.pd, &init, OTE_VERBS_QP_NO_SCATTER_TO_CQE, &qp), 0);
    extra_qps_.push_back(qp);
    uint32_t qf = 0;
    ASSERT_EQ(o->qp_flags(v_, qp, &qf), 0);
    EXPECT_EQ(qf, OTE_VERBS_QP_NO_SCATTER_TO_CQE);
    ASSERT_EQ(o->qp_flags(v_, a_.qp, &qf), 0);
    EXPECT_EQ(qf, 0u) << "a QP made by create_qp has no flags";

    struct ibv_srq_init_attr si;
    std::memset(&si, 0, sizeof(si));
    si.attr.max_wr = 8;
    si.attr.max_sge = 1;
    ASSERT_EQ(o->create_srq(v_, a_.pd, &si, &a_.srq), 0);
    struct ibv_srq_attr sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.srq_limit = 2;
    EXPECT_EQ(o->modify_srq(v_, a_.srq, &sa, IBV_SRQ_LIMIT), 0);
    ASSERT_EQ(o->query_srq(v_, a_.srq, &sa), 0);
    EXPECT_EQ(sa.srq_limit, 5u);
    struct ibv_recv_wr wr;
    std::memset(&wr, 0, sizeof(wr));
    wr.wr_id = 42;
    struct ibv_recv_wr *bad = nullptr;
    EXPECT_EQ(o->post_srq_recv(v_, a_.srq, &wr, &bad), 0);
    EXPECT_EQ(mock_.posted_recv().back(), 42u);

    const ote_verbs_fault_op_t ops[] = {OP(QUERY_DEVICE_EX), OP(CREATE_SRQ),    OP(MODIFY_SRQ),
                                        OP(QUERY_SRQ),       OP(POST_SRQ_RECV), OP(CREATE_QP_FLAGS),
                                        OP(QP_FLAGS),        OP(DEVICE_FLAGS)};
    for (auto op : ops) {
        EXPECT_EQ(mock_.inner_calls(op), op == OP(QP_FLAGS) ? 2u : 1u)
            << ote_verbs_fault_op_name(op);
        EXPECT_EQ(ote_verbs_fault_calls(v_, op), mock_.inner_calls(op))
            << ote_verbs_fault_op_name(op);
        EXPECT_EQ(ote_verbs_fault_injected(v_, op), 0u) << ote_verbs_fault_op_name(op);
    }
    // destroy_srq passes through too (and is a destroy: busy rules apply).
    ASSERT_EQ(ote_verbs_fault_destroy_busy(v_, OP(DESTROY_SRQ), a_.srq, 1), OTE_OK);
    EXPECT_EQ(o->destroy_srq(v_, a_.srq), EBUSY);
    EXPECT_EQ(mock_.inner_calls(OP(DESTROY_SRQ)), 0u);
    EXPECT_EQ(o->destroy_srq(v_, a_.srq), 0);
    EXPECT_EQ(mock_.inner_calls(OP(DESTROY_SRQ)), 1u);
    a_.srq = nullptr;
}

TEST_F(FaultTest, ExtendedEntriesFailByNameWithoutReachingTheInnerProvider) {
    OpenAll();
    for (const char *name :
         {"query_device_ex", "create_srq", "modify_srq", "query_srq", "destroy_srq",
          "post_srq_recv", "create_qp_flags", "qp_flags", "device_flags"}) {
        ote_verbs_fault_op_t op;
        ASSERT_EQ(ote_verbs_fault_op_from_name(name, &op), OTE_OK) << name;
        EXPECT_STREQ(ote_verbs_fault_op_name(op), name);
        ASSERT_EQ(ote_verbs_fault_fail(v_, op, OTE_FAULT_NTH, 1, ENOSPC), OTE_OK) << name;
        OpResult r = CallOp(v_, op, a_);
        EXPECT_EQ(r.ret, ENOSPC) << name;
        EXPECT_TRUE(r.output_untouched) << name;
        if (op == OP(POST_SRQ_RECV)) {
            EXPECT_TRUE(r.bad_wr_is_first);
        }
        EXPECT_EQ(mock_.inner_calls(op), 0u) << name;
        EXPECT_EQ(ote_verbs_fault_injected(v_, op), 1u) << name;
    }
}

// ---- fail rules ----

TEST_F(FaultTest, FailNthCallOnceWithoutReachingTheInnerProvider) {
    OpenAll();
    ASSERT_EQ(ote_verbs_fault_fail(v_, OP(ALLOC_PD), OTE_FAULT_NTH, 2, ENOMEM), OTE_OK);
    struct ibv_pd *pd1 = nullptr, *pd2 = reinterpret_cast<struct ibv_pd *>(0x2), *pd3 = nullptr;
    uint64_t inner_before = mock_.inner_calls(OP(ALLOC_PD));
    ASSERT_EQ(v_->ops->alloc_pd(v_, a_.ctx, &pd1), 0);
    EXPECT_EQ(v_->ops->alloc_pd(v_, a_.ctx, &pd2), ENOMEM);
    EXPECT_EQ(pd2, reinterpret_cast<struct ibv_pd *>(0x2)) << "output written on failure";
    ASSERT_EQ(v_->ops->alloc_pd(v_, a_.ctx, &pd3), 0);
    EXPECT_EQ(mock_.inner_calls(OP(ALLOC_PD)) - inner_before, 2u);
    EXPECT_EQ(ote_verbs_fault_injected(v_, OP(ALLOC_PD)), 1u);
    // One-shot: later calls pass.
    struct ibv_pd *pd4 = nullptr;
    ASSERT_EQ(v_->ops->alloc_pd(v_, a_.ctx, &pd4), 0);
    for (auto *pd : {pd1, pd3, pd4}) EXPECT_EQ(v_->ops->dealloc_pd(v_, pd), 0);
}

TEST_F(FaultTest, FailEveryAndFromNth) {
    OpenAll();
    ASSERT_EQ(ote_verbs_fault_fail(v_, OP(REQ_NOTIFY_CQ), OTE_FAULT_EVERY, 0, EIO), OTE_OK);
    for (int i = 0; i < 3; i++) EXPECT_EQ(v_->ops->req_notify_cq(v_, a_.cq, 0), EIO);
    EXPECT_EQ(mock_.inner_calls(OP(REQ_NOTIFY_CQ)), 0u);

    ASSERT_EQ(ote_verbs_fault_fail(v_, OP(MODIFY_QP), OTE_FAULT_FROM, 3, EINVAL), OTE_OK);
    struct ibv_qp_attr attr;
    std::memset(&attr, 0, sizeof(attr));
    attr.qp_state = IBV_QPS_INIT;
    std::vector<int> rets;
    for (int i = 0; i < 5; i++) rets.push_back(v_->ops->modify_qp(v_, a_.qp, &attr, IBV_QP_STATE));
    EXPECT_EQ(rets, (std::vector<int>{0, 0, EINVAL, EINVAL, EINVAL}));
    EXPECT_EQ(mock_.inner_calls(OP(MODIFY_QP)), 2u);
    EXPECT_EQ(ote_verbs_fault_injected(v_, OP(MODIFY_QP)), 3u);
    EXPECT_EQ(ote_verbs_fault_calls(v_, OP(MODIFY_QP)), 5u);
    // Re-arming replaces the rule and restarts its count.
    ASSERT_EQ(ote_verbs_fault_fail(v_, OP(MODIFY_QP), OTE_FAULT_NTH, 1, EPERM), OTE_OK);
    EXPECT_EQ(v_->ops->modify_qp(v_, a_.qp, &attr, IBV_QP_STATE), EPERM);
    EXPECT_EQ(v_->ops->modify_qp(v_, a_.qp, &attr, IBV_QP_STATE), 0);
}

TEST_F(FaultTest, EveryFailableOpFailsWithTheChosenErrno) {
    OpenAll();
    for (int i = 0; i < OP(COUNT); i++) {
        auto op = static_cast<ote_verbs_fault_op_t>(i);
        if (!OpReturnsStatus(op)) {
            EXPECT_EQ(ote_verbs_fault_fail(v_, op, OTE_FAULT_EVERY, 0, EIO), OTE_ERR_INVALID)
                << ote_verbs_fault_op_name(op) << " cannot fail, the rule must be refused";
            continue;
        }
        ASSERT_EQ(ote_verbs_fault_fail(v_, op, OTE_FAULT_EVERY, 0, EIO), OTE_OK);
        uint64_t inner_before = mock_.total_inner_calls();
        OpResult r = CallOp(v_, op, a_);
        EXPECT_EQ(r.ret, op == OP(POLL_CQ) ? -EIO : EIO) << ote_verbs_fault_op_name(op);
        EXPECT_TRUE(r.output_untouched) << ote_verbs_fault_op_name(op);
        if (op == OP(POST_SEND) || op == OP(POST_RECV) || op == OP(POST_SRQ_RECV)) {
            EXPECT_TRUE(r.bad_wr_is_first) << ote_verbs_fault_op_name(op);
        }
        EXPECT_EQ(mock_.total_inner_calls(), inner_before)
            << ote_verbs_fault_op_name(op) << " reached the inner provider";
        EXPECT_EQ(ote_verbs_fault_injected(v_, op), 1u) << ote_verbs_fault_op_name(op);
    }
    EXPECT_EQ(mock_.live_objects(), 6) << "a failed destroy freed its object";
}

TEST_F(FaultTest, FailRuleArgumentsAreChecked) {
    EXPECT_EQ(ote_verbs_fault_fail(v_, OP(ALLOC_PD), OTE_FAULT_NTH, 1, 0), OTE_ERR_INVALID);
    EXPECT_EQ(ote_verbs_fault_fail(v_, OP(ALLOC_PD), OTE_FAULT_NTH, 1, -5), OTE_ERR_INVALID);
    EXPECT_EQ(ote_verbs_fault_fail(v_, OP(ALLOC_PD), OTE_FAULT_NTH, 0, EIO), OTE_ERR_INVALID);
    EXPECT_EQ(ote_verbs_fault_fail(v_, OP(ALLOC_PD), OTE_FAULT_FROM, 0, EIO), OTE_ERR_INVALID);
    EXPECT_EQ(ote_verbs_fault_fail(v_, OP(COUNT), OTE_FAULT_EVERY, 0, EIO), OTE_ERR_INVALID);
    EXPECT_EQ(ote_verbs_fault_fail(v_, OP(ALLOC_PD), static_cast<ote_fault_mode_t>(9), 1, EIO),
              OTE_ERR_INVALID);
}

TEST_F(FaultTest, InjectedFailuresAreLoggedAtDebug) {
    ote_log_level_t old = ote_log_level();
    ote_log_set_level(OTE_LOG_DEBUG);
    ASSERT_EQ(ote_verbs_fault_fail(v_, OP(GET_DEVICE_LIST), OTE_FAULT_NTH, 1, ENODEV), OTE_OK);
    struct ibv_device **list = nullptr;
    EXPECT_EQ(v_->ops->get_device_list(v_, &list, nullptr), ENODEV);
    ote_log_set_level(old);
    EXPECT_TRUE(LogContains("D [verbs.fault] fault(mock): get_device_list call 1 fails"));
}

// ---- partial posts ----

TEST_F(FaultTest, PartialPostSendAcceptsOnlyTheFirstKWrs) {
    OpenAll();
    ASSERT_EQ(ote_verbs_fault_partial_post(v_, OP(POST_SEND), 2, ENOMEM), OTE_OK);
    std::vector<struct ibv_send_wr> wrs;
    struct ibv_send_wr *bad = nullptr;
    EXPECT_EQ(PostWrites(a_.qp, 1, 4, &bad, &wrs), ENOMEM);
    EXPECT_EQ(bad, &wrs[2]) << "bad_wr must name WR k";
    EXPECT_EQ(mock_.posted_send(), (Ids{1, 2}));
    // The caller's list is intact.
    EXPECT_EQ(wrs[1].next, &wrs[2]);
    EXPECT_EQ(wrs[2].next, &wrs[3]);
    EXPECT_EQ(PollIds(a_.cq), (Ids{1, 2})) << "exactly the accepted WRs complete";
    EXPECT_EQ(ote_verbs_fault_injected(v_, OP(POST_SEND)), 1u);
    // Consumed: the repost of the rest goes through.
    EXPECT_EQ(v_->ops->post_send(v_, a_.qp, &wrs[2], &bad), 0);
    EXPECT_EQ(mock_.posted_send(), (Ids{1, 2, 3, 4}));
    EXPECT_EQ(PollIds(a_.cq), (Ids{3, 4}));
}

TEST_F(FaultTest, PartialPostWithZeroAcceptsNothing) {
    OpenAll();
    ASSERT_EQ(ote_verbs_fault_partial_post(v_, OP(POST_SEND), 0, ENOMEM), OTE_OK);
    std::vector<struct ibv_send_wr> wrs;
    struct ibv_send_wr *bad = nullptr;
    EXPECT_EQ(PostWrites(a_.qp, 10, 3, &bad, &wrs), ENOMEM);
    EXPECT_EQ(bad, &wrs[0]);
    EXPECT_TRUE(mock_.posted_send().empty());
    EXPECT_EQ(mock_.inner_calls(OP(POST_SEND)), 0u);
}

TEST_F(FaultTest, PartialPostOfAShortListPassesWholeAndIsConsumed) {
    OpenAll();
    ASSERT_EQ(ote_verbs_fault_partial_post(v_, OP(POST_SEND), 3, ENOMEM), OTE_OK);
    std::vector<struct ibv_send_wr> wrs;
    struct ibv_send_wr *bad = nullptr;
    EXPECT_EQ(PostWrites(a_.qp, 1, 3, &bad, &wrs), 0);
    EXPECT_EQ(PostWrites(a_.qp, 4, 5, &bad, &wrs), 0) << "the rule was consumed";
    EXPECT_EQ(mock_.posted_send().size(), 8u);
    EXPECT_EQ(ote_verbs_fault_injected(v_, OP(POST_SEND)), 0u);
    EXPECT_EQ(PollIds(a_.cq).size(), 8u);
}

TEST_F(FaultTest, PartialPostReturnsTheInnerFailureWithinTheFirstK) {
    OpenAll();
    mock_.set_refused_wr_id(2);
    ASSERT_EQ(ote_verbs_fault_partial_post(v_, OP(POST_SEND), 3, ENOMEM), OTE_OK);
    std::vector<struct ibv_send_wr> wrs;
    struct ibv_send_wr *bad = nullptr;
    EXPECT_EQ(PostWrites(a_.qp, 1, 5, &bad, &wrs), EINVAL);
    EXPECT_EQ(bad, &wrs[1]);
    EXPECT_EQ(wrs[2].next, &wrs[3]) << "list restored";
    EXPECT_EQ(PollIds(a_.cq), (Ids{1}));
}

TEST_F(FaultTest, PartialPostRecv) {
    OpenAll();
    ASSERT_EQ(ote_verbs_fault_partial_post(v_, OP(POST_RECV), 1, EAGAIN), OTE_OK);
    struct ibv_recv_wr wrs[3];
    std::memset(wrs, 0, sizeof(wrs));
    for (int i = 0; i < 3; i++) {
        wrs[i].wr_id = 50 + static_cast<uint64_t>(i);
        wrs[i].next = i < 2 ? &wrs[i + 1] : nullptr;
    }
    struct ibv_recv_wr *bad = nullptr;
    EXPECT_EQ(v_->ops->post_recv(v_, a_.qp, wrs, &bad), EAGAIN);
    EXPECT_EQ(bad, &wrs[1]);
    EXPECT_EQ(wrs[0].next, &wrs[1]);
    EXPECT_EQ(mock_.posted_recv(), (Ids{50}));
    EXPECT_EQ(ote_verbs_fault_injected(v_, OP(POST_RECV)), 1u);
    EXPECT_EQ(ote_verbs_fault_partial_post(v_, OP(POLL_CQ), 1, EAGAIN), OTE_ERR_INVALID);
    EXPECT_EQ(ote_verbs_fault_partial_post(v_, OP(POST_RECV), 1, 0), OTE_ERR_INVALID);
}

// ---- CQE rules ----

TEST_F(FaultTest, LostCqeByWrIdNeverAppears) {
    OpenAll();
    ASSERT_EQ(ote_verbs_fault_lose_cqe_wr_id(v_, a_.cq, 2), OTE_OK);
    std::vector<struct ibv_send_wr> wrs;
    struct ibv_send_wr *bad = nullptr;
    ASSERT_EQ(PostWrites(a_.qp, 1, 3, &bad, &wrs), 0);
    EXPECT_EQ(PollIds(a_.cq), (Ids{1, 3}));
    EXPECT_EQ(ote_verbs_fault_injected(v_, OP(POLL_CQ)), 1u);
    // The rule fired once: the same wr_id completes normally later.
    ASSERT_EQ(PostWrites(a_.qp, 2, 1, &bad, &wrs), 0);
    EXPECT_EQ(PollIds(a_.cq), (Ids{2}));
    EXPECT_TRUE(PollIds(a_.cq).empty());
}

TEST_F(FaultTest, LostCqeRefillsTheCallersArray) {
    OpenAll();
    ASSERT_EQ(ote_verbs_fault_lose_cqe_nth(v_, nullptr, 1), OTE_OK);
    std::vector<struct ibv_send_wr> wrs;
    struct ibv_send_wr *bad = nullptr;
    ASSERT_EQ(PostWrites(a_.qp, 1, 3, &bad, &wrs), 0);
    // Asking for 2 still yields 2: the swallowed one is replaced from the CQ.
    EXPECT_EQ(PollIds(a_.cq, 2), (Ids{2, 3}));
    EXPECT_TRUE(PollIds(a_.cq).empty());
}

TEST_F(FaultTest, LostCqeNthCountsOnlyItsCq) {
    OpenAll();
    struct ibv_cq *cq2 = nullptr;
    ASSERT_EQ(v_->ops->create_cq(v_, a_.ctx, 16, nullptr, nullptr, 0, &cq2), 0);
    extra_cqs_.push_back(cq2);
    struct ibv_qp *qp2 = CreateQp(cq2);
    ASSERT_NE(qp2, nullptr);
    extra_qps_.push_back(qp2);
    ASSERT_EQ(ote_verbs_fault_lose_cqe_nth(v_, a_.cq, 3), OTE_OK);
    std::vector<struct ibv_send_wr> wrs;
    struct ibv_send_wr *bad = nullptr;
    ASSERT_EQ(PostWrites(qp2, 100, 4, &bad, &wrs), 0);
    EXPECT_EQ(PollIds(cq2), (Ids{100, 101, 102, 103})) << "another CQ is untouched";
    ASSERT_EQ(PostWrites(a_.qp, 1, 2, &bad, &wrs), 0);
    EXPECT_EQ(PollIds(a_.cq), (Ids{1, 2}));
    ASSERT_EQ(PostWrites(a_.qp, 3, 2, &bad, &wrs), 0);
    EXPECT_EQ(PollIds(a_.cq), (Ids{4})) << "the 3rd CQE of this CQ, across polls, is lost";
    EXPECT_EQ(ote_verbs_fault_lose_cqe_nth(v_, a_.cq, 0), OTE_ERR_INVALID);
}

TEST_F(FaultTest, ErrorCqeByWrIdKeepsIdentityAndPoisonsUndefinedFields) {
    OpenAll();
    ASSERT_EQ(ote_verbs_fault_error_cqe_wr_id(v_, a_.cq, 7, IBV_WC_REM_ACCESS_ERR, 0x42), OTE_OK);
    std::vector<struct ibv_send_wr> wrs;
    struct ibv_send_wr *bad = nullptr;
    ASSERT_EQ(PostWrites(a_.qp, 6, 3, &bad, &wrs), 0);
    struct ibv_wc wc[8];
    ASSERT_EQ(v_->ops->poll_cq(v_, a_.cq, 8, wc), 3);
    EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc[0].byte_len, 64u);
    EXPECT_EQ(wc[1].wr_id, 7u);
    EXPECT_EQ(wc[1].status, IBV_WC_REM_ACCESS_ERR);
    EXPECT_EQ(wc[1].vendor_err, 0x42u);
    EXPECT_EQ(wc[1].qp_num, a_.qp->qp_num);
    EXPECT_EQ(static_cast<int>(wc[1].opcode), OTE_VERBS_FAULT_POISON_OPCODE);
    EXPECT_EQ(wc[1].byte_len, OTE_VERBS_FAULT_POISON_BYTE_LEN);
    EXPECT_EQ(wc[1].wc_flags, OTE_VERBS_FAULT_POISON_WC_FLAGS);
    EXPECT_EQ(wc[2].status, IBV_WC_SUCCESS);
    EXPECT_EQ(ote_verbs_fault_injected(v_, OP(POLL_CQ)), 1u);
}

TEST_F(FaultTest, ErrorCqeNthOnAnyCq) {
    OpenAll();
    ASSERT_EQ(ote_verbs_fault_error_cqe_nth(v_, nullptr, 2, IBV_WC_RETRY_EXC_ERR, 0), OTE_OK);
    std::vector<struct ibv_send_wr> wrs;
    struct ibv_send_wr *bad = nullptr;
    ASSERT_EQ(PostWrites(a_.qp, 1, 3, &bad, &wrs), 0);
    struct ibv_wc wc[8];
    ASSERT_EQ(v_->ops->poll_cq(v_, a_.cq, 1, wc), 1);
    EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
    ASSERT_EQ(v_->ops->poll_cq(v_, a_.cq, 8, wc), 2);
    EXPECT_EQ(wc[0].wr_id, 2u);
    EXPECT_EQ(wc[0].status, IBV_WC_RETRY_EXC_ERR);
    EXPECT_EQ(wc[1].status, IBV_WC_SUCCESS);
}

TEST_F(FaultTest, OldestMatchingCqeRuleActsFirst) {
    OpenAll();
    ASSERT_EQ(ote_verbs_fault_error_cqe_wr_id(v_, a_.cq, 1, IBV_WC_REM_OP_ERR, 0), OTE_OK);
    ASSERT_EQ(ote_verbs_fault_lose_cqe_wr_id(v_, a_.cq, 1), OTE_OK);
    std::vector<struct ibv_send_wr> wrs;
    struct ibv_send_wr *bad = nullptr;
    ASSERT_EQ(PostWrites(a_.qp, 1, 1, &bad, &wrs), 0);
    struct ibv_wc wc[4];
    ASSERT_EQ(v_->ops->poll_cq(v_, a_.cq, 4, wc), 1);
    EXPECT_EQ(wc[0].status, IBV_WC_REM_OP_ERR);
    ASSERT_EQ(PostWrites(a_.qp, 1, 1, &bad, &wrs), 0);
    EXPECT_EQ(v_->ops->poll_cq(v_, a_.cq, 4, wc), 0) << "the second rule swallows the next one";
}

// ---- busy destroys ----

TEST_F(FaultTest, EveryDestroyCanReturnEbusyNTimesThenSucceed) {
    OpenAll();
    const ote_verbs_fault_op_t order[] = {OP(DESTROY_QP),  OP(DESTROY_CQ), OP(DESTROY_COMP_CHANNEL),
                                          OP(DEALLOC_MW),  OP(DEREG_MR),   OP(DEALLOC_PD),
                                          OP(CLOSE_DEVICE)};
    int live = mock_.live_objects();
    for (auto op : order) {
        ASSERT_EQ(ote_verbs_fault_destroy_busy(v_, op, nullptr, 2), OTE_OK);
        for (int i = 0; i < 2; i++) {
            OpResult r = CallOp(v_, op, a_);
            EXPECT_EQ(r.ret, EBUSY) << ote_verbs_fault_op_name(op);
        }
        EXPECT_EQ(mock_.inner_calls(op), 0u) << ote_verbs_fault_op_name(op);
        EXPECT_EQ(mock_.live_objects(), live) << "a busy destroy freed its object";
        EXPECT_EQ(CallOp(v_, op, a_).ret, 0) << ote_verbs_fault_op_name(op);
        EXPECT_EQ(mock_.inner_calls(op), 1u) << ote_verbs_fault_op_name(op);
        EXPECT_EQ(ote_verbs_fault_injected(v_, op), 2u) << ote_verbs_fault_op_name(op);
        EXPECT_EQ(ote_verbs_fault_calls(v_, op), 3u) << ote_verbs_fault_op_name(op);
        if (op != OP(CLOSE_DEVICE)) {
            EXPECT_EQ(mock_.live_objects(), --live);
        }
    }
    a_ = OpArgs(); // all destroyed
}

TEST_F(FaultTest, BusyDestroyForOneObjectOnly) {
    OpenAll();
    struct ibv_qp *qp2 = CreateQp(a_.cq);
    ASSERT_NE(qp2, nullptr);
    ASSERT_EQ(ote_verbs_fault_destroy_busy(v_, OP(DESTROY_QP), a_.qp, 1), OTE_OK);
    EXPECT_EQ(v_->ops->destroy_qp(v_, qp2), 0) << "another QP is not affected";
    EXPECT_EQ(v_->ops->destroy_qp(v_, a_.qp), EBUSY);
    EXPECT_EQ(v_->ops->destroy_qp(v_, a_.qp), 0);
    a_.qp = nullptr;
    EXPECT_EQ(ote_verbs_fault_destroy_busy(v_, OP(CREATE_QP), nullptr, 1), OTE_ERR_INVALID);
}

TEST_F(FaultTest, FailRuleOnDestroyKeepsTheObject) {
    OpenAll();
    ASSERT_EQ(ote_verbs_fault_fail(v_, OP(DEREG_MR), OTE_FAULT_NTH, 1, EINVAL), OTE_OK);
    ASSERT_EQ(ote_verbs_fault_destroy_busy(v_, OP(DEREG_MR), nullptr, 1), OTE_OK);
    EXPECT_EQ(v_->ops->dereg_mr(v_, a_.mr), EINVAL) << "fail rules come before busy rules";
    EXPECT_EQ(v_->ops->dereg_mr(v_, a_.mr), EBUSY);
    EXPECT_EQ(mock_.live_objects(), 6);
    EXPECT_EQ(v_->ops->dereg_mr(v_, a_.mr), 0);
    a_.mr = nullptr;
}

// ---- async events ----

TEST_F(FaultTest, InjectedAsyncEventComesFirstAndWakesTheDecoratorFd) {
    OpenAll();
    int fd = -1;
    ASSERT_EQ(ote_verbs_fault_async_fd(v_, a_.ctx, &fd), OTE_OK);
    ASSERT_GE(fd, 0);
    EXPECT_FALSE(Readable(fd));

    struct ibv_async_event native;
    std::memset(&native, 0, sizeof(native));
    native.event_type = IBV_EVENT_PORT_ACTIVE;
    native.element.port_num = 1;
    mock_.raise_async_event(a_.ctx, native);
    EXPECT_TRUE(Readable(fd)) << "the inner provider's event wakes the decorator fd";

    struct ibv_async_event inj;
    std::memset(&inj, 0, sizeof(inj));
    inj.event_type = IBV_EVENT_PORT_ERR;
    inj.element.port_num = 1;
    ASSERT_EQ(ote_verbs_fault_inject_async_event(v_, a_.ctx, &inj), OTE_OK);
    inj.event_type = IBV_EVENT_QP_FATAL;
    inj.element.qp = a_.qp;
    ASSERT_EQ(ote_verbs_fault_inject_async_event(v_, a_.ctx, &inj), OTE_OK);

    struct ibv_async_event ev;
    ASSERT_EQ(v_->ops->get_async_event(v_, a_.ctx, &ev), 0);
    EXPECT_EQ(ev.event_type, IBV_EVENT_PORT_ERR);
    EXPECT_EQ(ev.element.port_num, 1);
    v_->ops->ack_async_event(v_, &ev);
    ASSERT_EQ(v_->ops->get_async_event(v_, a_.ctx, &ev), 0);
    EXPECT_EQ(ev.event_type, IBV_EVENT_QP_FATAL);
    EXPECT_EQ(ev.element.qp, a_.qp);
    v_->ops->ack_async_event(v_, &ev);
    EXPECT_EQ(mock_.async_acks(), 0) << "acks of injected events must not reach the inner provider";
    EXPECT_EQ(mock_.inner_calls(OP(GET_ASYNC_EVENT)), 0u);
    EXPECT_EQ(ote_verbs_fault_injected(v_, OP(GET_ASYNC_EVENT)), 2u);

    ASSERT_EQ(v_->ops->get_async_event(v_, a_.ctx, &ev), 0);
    EXPECT_EQ(ev.event_type, IBV_EVENT_PORT_ACTIVE);
    v_->ops->ack_async_event(v_, &ev);
    EXPECT_EQ(mock_.async_acks(), 1);
    EXPECT_FALSE(Readable(fd)) << "drained";
    EXPECT_EQ(v_->ops->get_async_event(v_, a_.ctx, &ev), EAGAIN);
}

TEST_F(FaultTest, InjectedEventAloneMakesTheFdReadable) {
    OpenAll();
    struct ibv_async_event inj;
    std::memset(&inj, 0, sizeof(inj));
    inj.event_type = IBV_EVENT_GID_CHANGE;
    inj.element.port_num = 1;
    ASSERT_EQ(ote_verbs_fault_inject_async_event(v_, a_.ctx, &inj), OTE_OK);
    int fd = -1;
    ASSERT_EQ(ote_verbs_fault_async_fd(v_, a_.ctx, &fd), OTE_OK);
    EXPECT_TRUE(Readable(fd));
    // clear drops undelivered events and the fd goes quiet.
    ote_verbs_fault_clear(v_);
    EXPECT_FALSE(Readable(fd));
    struct ibv_async_event ev;
    EXPECT_EQ(v_->ops->get_async_event(v_, a_.ctx, &ev), EAGAIN);
    EXPECT_EQ(ote_verbs_fault_inject_async_event(v_, nullptr, &inj), OTE_ERR_INVALID);
    EXPECT_EQ(ote_verbs_fault_async_fd(v_, a_.ctx, nullptr), OTE_ERR_INVALID);
}

TEST_F(FaultTest, ClosingTheContextReleasesTheDecoratorFds) {
    int fds_before = ote_test::CountOpenFds();
    OpenAll();
    int fd = -1;
    ASSERT_EQ(ote_verbs_fault_async_fd(v_, a_.ctx, &fd), OTE_OK);
    EXPECT_GT(ote_test::CountOpenFds(), fds_before + 1); // mock's eventfd + ours
    DestroyAll();
    EXPECT_EQ(ote_test::CountOpenFds(), fds_before);
}

TEST_F(FaultTest, InjectSurvivesAllocationFailure) {
    OpenAll();
    struct ibv_async_event inj;
    std::memset(&inj, 0, sizeof(inj));
    inj.event_type = IBV_EVENT_PORT_ERR;
    inj.element.port_num = 1;
    bool done = false;
    for (uint64_t n = 1; n < 16 && !done; n++) {
        ote_alloc_fail_nth(n);
        ote_status_t st = ote_verbs_fault_inject_async_event(v_, a_.ctx, &inj);
        ote_alloc_fail_disarm();
        if (st == OTE_OK) {
            done = true;
        } else {
            EXPECT_EQ(st, OTE_ERR_NOMEM);
        }
    }
    ASSERT_TRUE(done);
    struct ibv_async_event ev;
    ASSERT_EQ(v_->ops->get_async_event(v_, a_.ctx, &ev), 0) << "exactly one event was queued";
    v_->ops->ack_async_event(v_, &ev);
    EXPECT_EQ(v_->ops->get_async_event(v_, a_.ctx, &ev), EAGAIN);
}

// ---- clear, reset, threads ----

TEST_F(FaultTest, ClearRemovesRulesAndResetZeroesCounters) {
    OpenAll();
    ASSERT_EQ(ote_verbs_fault_fail(v_, OP(ALLOC_PD), OTE_FAULT_EVERY, 0, EIO), OTE_OK);
    ASSERT_EQ(ote_verbs_fault_partial_post(v_, OP(POST_SEND), 0, ENOMEM), OTE_OK);
    ASSERT_EQ(ote_verbs_fault_lose_cqe_nth(v_, nullptr, 1), OTE_OK);
    ASSERT_EQ(ote_verbs_fault_destroy_busy(v_, OP(DESTROY_QP), nullptr, 5), OTE_OK);
    ote_verbs_fault_clear(v_);
    struct ibv_pd *pd = nullptr;
    ASSERT_EQ(v_->ops->alloc_pd(v_, a_.ctx, &pd), 0);
    EXPECT_EQ(v_->ops->dealloc_pd(v_, pd), 0);
    std::vector<struct ibv_send_wr> wrs;
    struct ibv_send_wr *bad = nullptr;
    EXPECT_EQ(PostWrites(a_.qp, 1, 2, &bad, &wrs), 0);
    EXPECT_EQ(PollIds(a_.cq), (Ids{1, 2}));
    EXPECT_EQ(v_->ops->destroy_qp(v_, a_.qp), 0);
    a_.qp = nullptr;
    EXPECT_GT(ote_verbs_fault_calls(v_, OP(ALLOC_PD)), 0u);
    ote_verbs_fault_reset_counters(v_);
    for (int i = 0; i < OP(COUNT); i++) {
        EXPECT_EQ(ote_verbs_fault_calls(v_, static_cast<ote_verbs_fault_op_t>(i)), 0u);
        EXPECT_EQ(ote_verbs_fault_injected(v_, static_cast<ote_verbs_fault_op_t>(i)), 0u);
    }
}

// ---- delay rules ----

TEST_F(FaultTest, DelayHoldsEachCallAtLeastItsTime) {
    OpenAll();
    ASSERT_EQ(ote_verbs_fault_delay(v_, OP(MODIFY_QP), 50), OTE_OK);
    struct ibv_qp_attr attr;
    std::memset(&attr, 0, sizeof(attr));
    attr.qp_state = IBV_QPS_INIT;
    for (int i = 0; i < 2; i++) {
        uint64_t t0 = ote_now_ns();
        EXPECT_EQ(v_->ops->modify_qp(v_, a_.qp, &attr, IBV_QP_STATE), 0);
        EXPECT_GE(ote_now_ns() - t0, 50 * OTE_NSEC_PER_MSEC) << "call " << i << " not delayed";
    }
    EXPECT_EQ(mock_.inner_calls(OP(MODIFY_QP)), 2u) << "a delayed call must still go through";
    EXPECT_EQ(ote_verbs_fault_injected(v_, OP(MODIFY_QP)), 2u);
    // Removed: calls go straight on (and other ops were never delayed).
    ASSERT_EQ(ote_verbs_fault_delay(v_, OP(MODIFY_QP), 0), OTE_OK);
    EXPECT_EQ(v_->ops->modify_qp(v_, a_.qp, &attr, IBV_QP_STATE), 0);
    EXPECT_EQ(ote_verbs_fault_injected(v_, OP(MODIFY_QP)), 2u);
}

TEST_F(FaultTest, DelayedCallIsReleasedWhenTheRuleIsLiftedOrCleared) {
    OpenAll();
    for (int how = 0; how < 2; how++) {
        // A stall far longer than the test: lifting it must release the waiting call.
        ASSERT_EQ(ote_verbs_fault_delay(v_, OP(CREATE_QP), 120000), OTE_OK);
        ASSERT_EQ(ote_verbs_fault_fail(v_, OP(CREATE_QP), OTE_FAULT_NTH, 1, EAGAIN), OTE_OK);
        uint64_t inner_before = mock_.inner_calls(OP(CREATE_QP));
        std::atomic<int> ret{-1};
        std::thread t([&] {
            struct ibv_qp_init_attr init;
            std::memset(&init, 0, sizeof(init));
            init.send_cq = a_.cq;
            init.recv_cq = a_.cq;
            init.qp_type = IBV_QPT_RC;
            struct ibv_qp *qp = nullptr;
            ret = v_->ops->create_qp(v_, a_.pd, &init, &qp);
            if (qp != nullptr) extra_qps_.push_back(qp);
        });
        // It entered the decorator (counted) and is held before the inner provider.
        ASSERT_TRUE(ote_test::WaitUntil(
            [&] {
                return ote_verbs_fault_calls(v_, OP(CREATE_QP)) > 0 &&
                       ote_verbs_fault_injected(v_, OP(CREATE_QP)) > 0;
            },
            std::chrono::seconds(30), "create_qp held in the decorator"));
        // Held, not merely slow: still held a while later.
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        EXPECT_EQ(ret.load(), -1) << "the call was not held";
        EXPECT_EQ(mock_.inner_calls(OP(CREATE_QP)), inner_before);
        uint64_t t0 = ote_now_ns();
        if (how == 0) {
            ASSERT_EQ(ote_verbs_fault_delay(v_, OP(CREATE_QP), 0), OTE_OK);
        } else {
            ote_verbs_fault_clear(v_);
        }
        t.join();
        EXPECT_LT(ote_now_ns() - t0, 60ull * 1000 * OTE_NSEC_PER_MSEC) << "not released";
        // Lifting the delay (how 0) keeps the fail rule, which then applies; clear (how 1)
        // removed it too.
        EXPECT_EQ(ret.load(), how == 0 ? EAGAIN : 0);
        EXPECT_EQ(mock_.inner_calls(OP(CREATE_QP)) - inner_before, how == 0 ? 0u : 1u);
        ote_verbs_fault_clear(v_);
        ote_verbs_fault_reset_counters(v_);
    }
}

TEST_F(FaultTest, DelayRuleArgumentsAreChecked) {
    EXPECT_EQ(ote_verbs_fault_delay(v_, OP(COUNT), 10), OTE_ERR_INVALID);
    EXPECT_EQ(ote_verbs_fault_delay(v_, OP(ACK_CQ_EVENTS), 10), OTE_ERR_INVALID);
    EXPECT_EQ(ote_verbs_fault_delay(v_, OP(CREATE_QP), OTE_VERBS_FAULT_DELAY_MAX_MS + 1),
              OTE_ERR_INVALID);
    EXPECT_EQ(ote_verbs_fault_delay(mock_.verbs(), OP(CREATE_QP), 10), OTE_ERR_INVALID);
    EXPECT_EQ(ote_verbs_fault_delay(v_, OP(CREATE_QP), 0), OTE_OK);
}

TEST_F(FaultTest, NthFailureIsExactUnderConcurrentCallers) {
    OpenAll();
    constexpr int kThreads = 4, kPerThread = 250;
    ASSERT_EQ(ote_verbs_fault_fail(v_, OP(QUERY_PORT), OTE_FAULT_NTH, 500, EIO), OTE_OK);
    std::atomic<int> failures{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < kThreads; t++) {
        ts.emplace_back([&] {
            for (int i = 0; i < kPerThread; i++) {
                struct ibv_port_attr attr;
                int r = v_->ops->query_port(v_, a_.ctx, 1, &attr);
                if (r == EIO) {
                    failures++;
                } else if (r != 0) {
                    ADD_FAILURE() << "unexpected " << r;
                }
            }
        });
    }
    for (auto &t : ts) t.join();
    EXPECT_EQ(failures.load(), 1);
    EXPECT_EQ(ote_verbs_fault_calls(v_, OP(QUERY_PORT)), uint64_t{kThreads * kPerThread});
    EXPECT_EQ(mock_.inner_calls(OP(QUERY_PORT)), uint64_t{kThreads * kPerThread - 1});
}

} // namespace

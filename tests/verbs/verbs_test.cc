// Tests of verbs/verbs.c and verbs/rdma_core.c: opening providers by name, the
// EOPNOTSUPP stubs behind every op, status mapping and names, and the rdma-core binding
// on a machine without RDMA devices.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "tests/util/test_base.h"
#include "tests/verbs/op_caller.h"

extern "C" {
#include "base/alloc.h"
#include "base/status.h"
#include "verbs/fault.h"
#include "verbs/verbs.h"
}

namespace {

using ote_test::CallOp;
using ote_test::OpArgs;
using ote_test::OpResult;
using ote_test::OpReturnsStatus;
using ote_test::OteTest;

class VerbsTest : public OteTest {};

bool HasInfinibandSysfs() {
    struct stat st;
    return stat("/sys/class/infiniband", &st) == 0;
}

TEST_F(VerbsTest, UnknownProviderIsNotFoundAndLogged) {
    ote_verbs_t *v = reinterpret_cast<ote_verbs_t *>(0x1);
    EXPECT_EQ(ote_verbs_open("no-such-provider", nullptr, &v), OTE_ERR_NOT_FOUND);
    EXPECT_EQ(v, reinterpret_cast<ote_verbs_t *>(0x1)) << "output written on failure";
    EXPECT_TRUE(LogContains("no-such-provider"));
    EXPECT_EQ(ote_verbs_open(nullptr, nullptr, &v), OTE_ERR_INVALID);
    EXPECT_EQ(ote_verbs_open("rdma-core", nullptr, nullptr), OTE_ERR_INVALID);
    ote_verbs_close(nullptr); // closing nothing is a no-op
}

TEST_F(VerbsTest, StubsFailEveryOpWithEopnotsupp) {
    ote_verbs_ops_t ops;
    std::memset(&ops, 0, sizeof(ops));
    ote_verbs_ops_fill_stubs(&ops);
    // No entry is left NULL.
    const void *const *slots = reinterpret_cast<const void *const *>(&ops);
    for (size_t i = 0; i < sizeof(ops) / sizeof(void *); i++) {
        EXPECT_NE(slots[i], nullptr) << "entry " << i;
    }
    ASSERT_EQ(sizeof(ops) / sizeof(void *), static_cast<size_t>(OTE_VERBS_FAULT_OP_COUNT))
        << "fault op enum and ops table disagree";

    ote_verbs_t v{};
    v.ops = &ops;
    v.provider = "stubs";
    OpArgs args;
    for (int i = 0; i < OTE_VERBS_FAULT_OP_COUNT; i++) {
        auto op = static_cast<ote_verbs_fault_op_t>(i);
        OpResult r = CallOp(&v, op, args);
        if (!OpReturnsStatus(op)) continue;
        if (op == OTE_VERBS_FAULT_OP_POLL_CQ) {
            EXPECT_EQ(r.ret, -EOPNOTSUPP) << ote_verbs_fault_op_name(op);
        } else {
            EXPECT_EQ(r.ret, EOPNOTSUPP) << ote_verbs_fault_op_name(op);
        }
        EXPECT_TRUE(r.output_untouched) << ote_verbs_fault_op_name(op);
        if (op == OTE_VERBS_FAULT_OP_POST_SEND || op == OTE_VERBS_FAULT_OP_POST_RECV ||
            op == OTE_VERBS_FAULT_OP_POST_SRQ_RECV) {
            EXPECT_TRUE(r.bad_wr_is_first) << ote_verbs_fault_op_name(op);
        }
    }
    EXPECT_EQ(ops.get_device_name(&v, nullptr), nullptr);
}

int MyQueryDevice(ote_verbs_t *, struct ibv_context *, struct ibv_device_attr *) { return 0; }

TEST_F(VerbsTest, FillStubsKeepsExistingEntries) {
    ote_verbs_ops_t ops;
    std::memset(&ops, 0, sizeof(ops));
    ops.query_device = MyQueryDevice;
    ote_verbs_ops_fill_stubs(&ops);
    EXPECT_EQ(ops.query_device, &MyQueryDevice);
    ote_verbs_t v{};
    v.ops = &ops;
    EXPECT_EQ(ops.alloc_pd(&v, nullptr, nullptr), EOPNOTSUPP);
    ote_verbs_ops_fill_stubs(nullptr); // tolerated
}

TEST_F(VerbsTest, StatusCarriesErrno) {
    ote_status_t st = ote_verbs_status(ENOMEM);
    EXPECT_EQ(ote_status_code(st), OTE_ERR_NOMEM);
    EXPECT_EQ(ote_status_errno(st), ENOMEM);
    st = ote_verbs_status(EPROTO);
    EXPECT_EQ(ote_status_code(st), OTE_ERR_NATIVE);
    EXPECT_EQ(ote_status_errno(st), EPROTO);
    st = ote_verbs_status(-EBUSY); // poll_cq's negative convention
    EXPECT_EQ(ote_status_code(st), OTE_ERR_BUSY);
    EXPECT_EQ(ote_status_errno(st), EBUSY);
    EXPECT_EQ(ote_status_code(ote_verbs_status(EOPNOTSUPP)), OTE_ERR_UNSUPPORTED);
    EXPECT_NE(ote_verbs_status(0), OTE_OK) << "a failed verb never maps to OK";
    EXPECT_EQ(ote_status_code(ote_verbs_status(0)), OTE_ERR_NATIVE);
}

TEST_F(VerbsTest, NamesForLogs) {
    EXPECT_STREQ(ote_verbs_wc_status_str(IBV_WC_SUCCESS), "SUCCESS");
    EXPECT_STREQ(ote_verbs_wc_status_str(IBV_WC_WR_FLUSH_ERR), "WR_FLUSH_ERR");
    EXPECT_STREQ(ote_verbs_wc_status_str(IBV_WC_REM_ACCESS_ERR), "REM_ACCESS_ERR");
    EXPECT_STREQ(ote_verbs_wc_status_str(IBV_WC_RNR_RETRY_EXC_ERR), "RNR_RETRY_EXC_ERR");
    EXPECT_STREQ(ote_verbs_wc_status_str(IBV_WC_RETRY_EXC_ERR), "RETRY_EXC_ERR");
    EXPECT_STREQ(ote_verbs_wc_status_str(static_cast<enum ibv_wc_status>(999)),
                 "UNKNOWN_WC_STATUS");
    EXPECT_STREQ(ote_verbs_qp_state_str(IBV_QPS_RESET), "RESET");
    EXPECT_STREQ(ote_verbs_qp_state_str(IBV_QPS_RTS), "RTS");
    EXPECT_STREQ(ote_verbs_qp_state_str(IBV_QPS_ERR), "ERR");
    EXPECT_STREQ(ote_verbs_qp_state_str(static_cast<enum ibv_qp_state>(99)), "UNKNOWN_QP_STATE");
}

// Which member of ev->element an async event carries: the fault decorator's ack matching
// and the sim's per-object event counters both go by this one classification.
TEST_F(VerbsTest, AsyncEventTargets) {
    EXPECT_EQ(ote_verbs_event_target(IBV_EVENT_QP_FATAL), OTE_VERBS_EVENT_ON_QP);
    EXPECT_EQ(ote_verbs_event_target(IBV_EVENT_QP_ACCESS_ERR), OTE_VERBS_EVENT_ON_QP);
    EXPECT_EQ(ote_verbs_event_target(IBV_EVENT_SQ_DRAINED), OTE_VERBS_EVENT_ON_QP);
    EXPECT_EQ(ote_verbs_event_target(IBV_EVENT_QP_LAST_WQE_REACHED), OTE_VERBS_EVENT_ON_QP);
    EXPECT_EQ(ote_verbs_event_target(IBV_EVENT_CQ_ERR), OTE_VERBS_EVENT_ON_CQ);
    EXPECT_EQ(ote_verbs_event_target(IBV_EVENT_SRQ_LIMIT_REACHED), OTE_VERBS_EVENT_ON_SRQ);
    EXPECT_EQ(ote_verbs_event_target(IBV_EVENT_WQ_FATAL), OTE_VERBS_EVENT_ON_WQ);
    EXPECT_EQ(ote_verbs_event_target(IBV_EVENT_PORT_ERR), OTE_VERBS_EVENT_ON_PORT);
    EXPECT_EQ(ote_verbs_event_target(IBV_EVENT_GID_CHANGE), OTE_VERBS_EVENT_ON_PORT);
    EXPECT_EQ(ote_verbs_event_target(IBV_EVENT_DEVICE_FATAL), OTE_VERBS_EVENT_ON_DEVICE);
    EXPECT_EQ(ote_verbs_event_target(static_cast<enum ibv_event_type>(999)),
              OTE_VERBS_EVENT_ON_DEVICE);
}

// The rdma-core provider opens anywhere and its table is complete.
TEST_F(VerbsTest, RdmaCoreOpensWithCompleteTable) {
    ote_verbs_t *v = nullptr;
    ASSERT_EQ(ote_verbs_open("rdma-core", nullptr, &v), OTE_OK);
    ASSERT_NE(v, nullptr);
    EXPECT_STREQ(v->provider, "rdma-core");
    const void *const *slots = reinterpret_cast<const void *const *>(v->ops);
    for (size_t i = 0; i < sizeof(ote_verbs_ops_t) / sizeof(void *); i++) {
        EXPECT_NE(slots[i], nullptr) << "entry " << i;
    }
    ote_verbs_close(v);
}

// rdma-core's configuration: nothing, or where sysfs is mounted for its own reads (a
// device's NUMA node: README "rdma_sysfs_root"); anything else is refused, never ignored.
TEST_F(VerbsTest, RdmaCoreConfigurationNamesOnlyTheSysfsRoot) {
    for (const char *good : {"", "sysfs_root=/host/sys", "sysfs_root=/"}) {
        ote_verbs_t *v = nullptr;
        ASSERT_EQ(ote_verbs_open("rdma-core", good, &v), OTE_OK) << good;
        ote_verbs_close(v);
    }
    for (const char *bad :
         {"sysfs_root=", "sysfs_root=host/sys", "sysroot=/sys", "x", " sysfs_root=/s"}) {
        ote_verbs_t *v = nullptr;
        EXPECT_EQ(ote_verbs_open("rdma-core", bad, &v), OTE_ERR_INVALID) << bad;
        EXPECT_EQ(v, nullptr) << bad;
    }
    std::string long_root = "sysfs_root=/" + std::string(300, 'd');
    ote_verbs_t *v = nullptr;
    EXPECT_EQ(ote_verbs_open("rdma-core", long_root.c_str(), &v), OTE_ERR_INVALID);
    EXPECT_TRUE(LogContains("known: sysfs_root=/PATH"));
}

// The extended entries' argument rules need no device: an unknown create flag is refused
// (never ignored), missing outputs are EINVAL, and a QP the instance never created with
// flags reads back flags 0 (the table is looked up by pointer, the QP never touched).
TEST_F(VerbsTest, RdmaCoreExtendedEntriesCheckTheirArguments) {
    ote_verbs_t *v = nullptr;
    ASSERT_EQ(ote_verbs_open("rdma-core", nullptr, &v), OTE_OK);
    const ote_verbs_ops_t *o = v->ops;
    struct ibv_qp_init_attr ia;
    std::memset(&ia, 0, sizeof(ia));
    struct ibv_qp *qp = reinterpret_cast<struct ibv_qp *>(0x1);
    EXPECT_EQ(o->create_qp_flags(v, nullptr, &ia, 0x80, &qp), EOPNOTSUPP);
    EXPECT_EQ(o->create_qp_flags(v, nullptr, &ia, OTE_VERBS_QP_NO_SCATTER_TO_CQE, &qp), EINVAL);
    EXPECT_EQ(qp, reinterpret_cast<struct ibv_qp *>(0x1)) << "output written on failure";
    uint32_t f = 0xdead;
    EXPECT_EQ(o->qp_flags(v, reinterpret_cast<struct ibv_qp *>(0x10), &f), 0);
    EXPECT_EQ(f, 0u);
    EXPECT_EQ(o->qp_flags(v, nullptr, &f), EINVAL);
    EXPECT_EQ(o->device_flags(v, nullptr, &f), EINVAL);
    struct ibv_device_attr_ex ax;
    EXPECT_EQ(o->query_device_ex(v, nullptr, &ax), EINVAL);
    ote_verbs_close(v);
}

TEST_F(VerbsTest, RdmaCoreListsZeroDevicesWithoutRdma) {
    ote_verbs_t *v = nullptr;
    ASSERT_EQ(ote_verbs_open("rdma-core", nullptr, &v), OTE_OK);
    struct ibv_device **list = nullptr;
    int num = -1;
    ASSERT_EQ(v->ops->get_device_list(v, &list, &num), 0);
    ASSERT_NE(list, nullptr);
    if (HasInfinibandSysfs()) {
        // A machine with RDMA support: the list is NULL-terminated and names each device.
        EXPECT_GE(num, 0);
        for (int i = 0; i < num; i++) EXPECT_NE(v->ops->get_device_name(v, list[i]), nullptr);
    } else {
        EXPECT_EQ(num, 0) << "no /sys/class/infiniband, yet devices were listed";
        EXPECT_EQ(list[0], nullptr);
    }
    v->ops->free_device_list(v, list);
    v->ops->free_device_list(v, nullptr); // tolerated
    // Listing again works the same way (no state left behind by the first list).
    int num2 = -1;
    ASSERT_EQ(v->ops->get_device_list(v, &list, &num2), 0);
    EXPECT_EQ(num2, num);
    v->ops->free_device_list(v, list);
    ote_verbs_close(v);
}

TEST_F(VerbsTest, RdmaCoreOpenFailsCleanlyWithoutMemory) {
    ote_verbs_t *v = nullptr;
    ote_alloc_fail_nth(1);
    EXPECT_EQ(ote_verbs_open("rdma-core", nullptr, &v), OTE_ERR_NOMEM);
    ote_alloc_fail_disarm();
    EXPECT_EQ(v, nullptr);
}

TEST_F(VerbsTest, RdmaCoreUnderTheFaultDecorator) {
    ote_verbs_t *v = nullptr;
    ASSERT_EQ(ote_verbs_open("rdma-core", nullptr, &v), OTE_OK);
    ote_verbs_t *f = nullptr;
    ASSERT_EQ(ote_verbs_fault_wrap(v, OTE_VERBS_FAULT_OWN_INNER, &f), OTE_OK);
    EXPECT_STREQ(f->provider, "fault(rdma-core)");
    struct ibv_device **list = nullptr;
    int num = -1;
    ASSERT_EQ(f->ops->get_device_list(f, &list, &num), 0);
    if (!HasInfinibandSysfs()) {
        EXPECT_EQ(num, 0);
    }
    f->ops->free_device_list(f, list);
    ASSERT_EQ(ote_verbs_fault_fail(f, OTE_VERBS_FAULT_OP_GET_DEVICE_LIST, OTE_FAULT_NTH, 1, EPERM),
              OTE_OK);
    EXPECT_EQ(f->ops->get_device_list(f, &list, &num), EPERM);
    EXPECT_EQ(ote_verbs_fault_calls(f, OTE_VERBS_FAULT_OP_GET_DEVICE_LIST), 2u);
    ote_verbs_close(f); // closes rdma-core too
}

} // namespace

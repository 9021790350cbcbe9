// The sim's device profiles (verbs/sim/sim.h, "Device profiles"): what query_device_ex
// and device_flags report per profile, the limits create_qp / create_cq / modify_qp
// enforce (at the limit accepted, one over EINVAL), memory windows absent on "nomw", the
// QP create flags read back, mlx5's scatter-to-CQE hazard (a signalled READ of at most 64
// bytes into a dma-buf MR on a QP without OTE_VERBS_QP_NO_SCATTER_TO_CQE fails loudly;
// everything else moves the bytes), and how a device gets its profile (per-device option,
// global item, $OTE_SIM_PROFILE, default mlx5).
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tests/verbs/verbs_fixture.h"

extern "C" {
#include "verbs/sim/sim.h"
#include "verbs/verbs.h"
}

namespace {

using ote_test::ErrorLogsExpected;
using ote_test::kAccessRw;
using ote_test::Memfd;
using ote_test::VerbsBuf;

struct Profile {
    const char *name;
    int max_qp_wr, max_sge, max_sge_rd, max_cqe, max_inline;
    int max_qp_rd_atom, max_qp_init_rd_atom;
    int max_srq, max_srq_wr, max_srq_sge;
    bool mw;
    uint32_t dev_flags;
};

constexpr uint32_t kScatter = OTE_VERBS_DEV_SCATTER_TO_CQE | OTE_VERBS_DEV_SCATTER_OPT_OUT;

// The values sim.h documents (and the issue lists).
const Profile kProfiles[] = {
    {"mlx5", 32768, 30, 30, 4194303, 220, 16, 16, 8388608, 32767, 31, true, kScatter},
    {"rxe", 16384, 32, 32, 32767, 400, 128, 128, 0x40000, 16384, 27, true, 0},
    {"nomw", 32768, 30, 30, 4194303, 220, 16, 16, 8388608, 32767, 31, false, 0},
    {"small", 512, 2, 1, 1024, 64, 4, 4, 1024, 512, 2, true, 0},
};

std::string OneDevice(const std::string &profile) {
    return "dev=sim0,numa=0,profile=" + profile + ";port;gid=auto-ll,type=v2;gid=auto-v4,type=v2";
}

constexpr uint64_t kIova = 0x7e5a00000000ull; // an address the host has nothing at

class SimProfile : public ote_test::VerbsFixture, public ::testing::WithParamInterface<Profile> {
  protected:
    void SetUp() override {
        VerbsFixture::SetUp();
        config_ = OneDevice(GetParam().name);
        ASSERT_NO_FATAL_FAILURE(OpenVerbs("sim", config_.c_str()));
    }
    void TearDown() override {
        for (auto *mr : dmrs_) EXPECT_EQ(o_->dereg_mr(v_, mr), 0);
        VerbsFixture::TearDown();
    }

    // create_qp with caps {1, 1, 1, 1, 0} changed by `set`; destroys what it created.
    template <typename F>
    int TryQp(F set) {
        struct ibv_cq *cq = cq_ ? cq_ : (cq_ = Cq(16));
        struct ibv_qp_init_attr ia;
        std::memset(&ia, 0, sizeof(ia));
        ia.send_cq = cq;
        ia.recv_cq = cq;
        ia.qp_type = IBV_QPT_RC;
        ia.cap.max_send_wr = ia.cap.max_recv_wr = 1;
        ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
        set(ia.cap);
        struct ibv_qp *qp = nullptr;
        int rc = o_->create_qp(v_, pd_, &ia, &qp);
        if (rc == 0) {
            EXPECT_EQ(o_->destroy_qp(v_, qp), 0);
        }
        return rc;
    }
    int TryCq(int n) {
        struct ibv_cq *cq = nullptr;
        int rc = o_->create_cq(v_, ctx_, n, nullptr, nullptr, 0, &cq);
        if (rc == 0) {
            EXPECT_EQ(o_->destroy_cq(v_, cq), 0);
        }
        return rc;
    }
    struct ibv_mr *Dmabuf(const Memfd &m, size_t len) {
        struct ibv_mr *mr = nullptr;
        EXPECT_EQ(o_->reg_dmabuf_mr(v_, pd_, 0, len, kIova, m.fd(), kAccessRw, &mr), 0);
        if (mr) dmrs_.push_back(mr);
        return mr;
    }

    std::string config_;
    struct ibv_cq *cq_ = nullptr;
    std::vector<struct ibv_mr *> dmrs_;
};

TEST_P(SimProfile, QueryDeviceExReportsTheProfile) {
    const Profile &p = GetParam();
    struct ibv_device_attr da;
    ASSERT_EQ(o_->query_device(v_, ctx_, &da), 0);
    struct ibv_device_attr_ex ax;
    std::memset(&ax, 0xab, sizeof(ax));
    ASSERT_EQ(o_->query_device_ex(v_, ctx_, &ax), 0);
    EXPECT_EQ(std::memcmp(&ax.orig_attr, &da, sizeof(da)), 0) << "orig_attr is query_device's";
    const struct ibv_device_attr &a = ax.orig_attr;
    EXPECT_EQ(a.max_qp_wr, p.max_qp_wr);
    EXPECT_EQ(a.max_sge, p.max_sge);
    EXPECT_EQ(a.max_sge_rd, p.max_sge_rd);
    EXPECT_EQ(a.max_cqe, p.max_cqe);
    EXPECT_EQ(a.max_qp_rd_atom, p.max_qp_rd_atom);
    EXPECT_EQ(a.max_qp_init_rd_atom, p.max_qp_init_rd_atom);
    EXPECT_EQ(a.max_srq, p.max_srq);
    EXPECT_EQ(a.max_srq_wr, p.max_srq_wr);
    EXPECT_EQ(a.max_srq_sge, p.max_srq_sge);
    EXPECT_EQ(a.phys_port_cnt, 1);
    const unsigned mw_flags = IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B;
    if (p.mw) {
        EXPECT_EQ(a.device_cap_flags & mw_flags, mw_flags);
        EXPECT_GT(a.max_mw, 0);
    } else {
        EXPECT_EQ(a.device_cap_flags & (mw_flags | IBV_DEVICE_MEM_WINDOW_TYPE_2A), 0u);
        EXPECT_EQ(a.max_mw, 0);
    }
    // the extended fields the sim knows; the rest zero
    EXPECT_EQ(ax.device_cap_flags_ex, (uint64_t)a.device_cap_flags);
    EXPECT_EQ(ax.phys_port_cnt_ex, 1u);
    EXPECT_EQ(ax.comp_mask, 0u);
    EXPECT_EQ(ax.completion_timestamp_mask, 0u);
    EXPECT_EQ(ax.hca_core_clock, 0u);
    EXPECT_EQ(ax.odp_caps.general_caps, 0u);
    EXPECT_EQ(ax.tso_caps.max_tso, 0u);
    EXPECT_EQ(ax.max_dm_size, 0u);

    uint32_t df = 0xdead;
    ASSERT_EQ(o_->device_flags(v_, ctx_, &df), 0);
    EXPECT_EQ(df, p.dev_flags);
    const char *name = nullptr;
    ASSERT_EQ(ote_sim_device_profile(v_, "sim0", &name), OTE_OK);
    EXPECT_STREQ(name, p.name);
}

TEST_P(SimProfile, CreateQpLimitsAreEnforced) {
    const Profile &p = GetParam();
    const uint32_t wr = (uint32_t)p.max_qp_wr, sge = (uint32_t)p.max_sge;
    const uint32_t inl = (uint32_t)p.max_inline;
    EXPECT_EQ(TryQp([&](ibv_qp_cap &c) { c.max_send_wr = wr; }), 0);
    EXPECT_EQ(TryQp([&](ibv_qp_cap &c) { c.max_send_wr = wr + 1; }), EINVAL);
    EXPECT_EQ(TryQp([&](ibv_qp_cap &c) { c.max_recv_wr = wr; }), 0);
    EXPECT_EQ(TryQp([&](ibv_qp_cap &c) { c.max_recv_wr = wr + 1; }), EINVAL);
    EXPECT_EQ(TryQp([&](ibv_qp_cap &c) { c.max_send_sge = sge; }), 0);
    EXPECT_EQ(TryQp([&](ibv_qp_cap &c) { c.max_send_sge = sge + 1; }), EINVAL);
    EXPECT_EQ(TryQp([&](ibv_qp_cap &c) { c.max_recv_sge = sge; }), 0);
    EXPECT_EQ(TryQp([&](ibv_qp_cap &c) { c.max_recv_sge = sge + 1; }), EINVAL);
    EXPECT_EQ(TryQp([&](ibv_qp_cap &c) { c.max_inline_data = inl; }), 0);
    EXPECT_EQ(TryQp([&](ibv_qp_cap &c) { c.max_inline_data = inl + 1; }), EINVAL);
}

TEST_P(SimProfile, CreateCqLimitIsEnforced) {
    const Profile &p = GetParam();
    EXPECT_EQ(TryCq(p.max_cqe + 1), EINVAL);
    EXPECT_EQ(TryCq(p.max_cqe), 0);
    EXPECT_EQ(TryCq(0), EINVAL);
}

TEST_P(SimProfile, ModifyQpRdAtomicLimitsAreEnforced) {
    const Profile &p = GetParam();
    struct ibv_cq *cq = Cq(16);
    struct ibv_qp *a = Qp(cq, cq, 4, 4), *b = Qp(cq, cq, 4, 4);
    ASSERT_TRUE(a && b);
    ASSERT_EQ(ToInit(a), 0);
    ote_test::QpPath path;
    path.dest_qpn = b->qp_num;
    path.dgid = gid_;
    path.sgid_index = (uint8_t)gid_index_;
    path.max_dest_rd_atomic = (uint8_t)(p.max_qp_rd_atom + 1);
    EXPECT_EQ(ote_test::QpToRtr(v_, a, path), EINVAL) << "max_dest_rd_atomic > max_qp_rd_atom";
    EXPECT_EQ(State(a), IBV_QPS_INIT);
    path.max_dest_rd_atomic = (uint8_t)p.max_qp_rd_atom;
    ASSERT_EQ(ote_test::QpToRtr(v_, a, path), 0);
    ote_test::QpRetry retry;
    retry.max_rd_atomic = (uint8_t)(p.max_qp_init_rd_atom + 1);
    EXPECT_EQ(ote_test::QpToRts(v_, a, retry), EINVAL) << "max_rd_atomic > max_qp_init_rd_atom";
    EXPECT_EQ(State(a), IBV_QPS_RTR);
    retry.max_rd_atomic = (uint8_t)p.max_qp_init_rd_atom;
    EXPECT_EQ(ote_test::QpToRts(v_, a, retry), 0);
    EXPECT_EQ(State(a), IBV_QPS_RTS);
}

TEST_P(SimProfile, MemoryWindowsOnlyWhereTheProfileHasThem) {
    struct ibv_mw *mw = reinterpret_cast<struct ibv_mw *>(0x1);
    if (GetParam().mw) {
        ASSERT_EQ(o_->alloc_mw(v_, pd_, IBV_MW_TYPE_2, &mw), 0);
        EXPECT_EQ(o_->dealloc_mw(v_, mw), 0);
        return;
    }
    EXPECT_EQ(o_->alloc_mw(v_, pd_, IBV_MW_TYPE_2, &mw), EOPNOTSUPP);
    EXPECT_EQ(o_->alloc_mw(v_, pd_, IBV_MW_TYPE_1, &mw), EOPNOTSUPP);
    EXPECT_EQ(mw, reinterpret_cast<struct ibv_mw *>(0x1)) << "output written on failure";
}

TEST_P(SimProfile, CreateQpFlagsReadBack) {
    struct ibv_cq *cq = Cq(16);
    struct ibv_qp_init_attr ia;
    std::memset(&ia, 0, sizeof(ia));
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = ia.cap.max_recv_wr = 4;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    struct ibv_qp *with = nullptr, *without = nullptr;
    ASSERT_EQ(o_->create_qp_flags(v_, pd_, &ia, OTE_VERBS_QP_NO_SCATTER_TO_CQE, &with), 0);
    TrackQp(with);
    ASSERT_EQ(o_->create_qp_flags(v_, pd_, &ia, 0, &without), 0);
    TrackQp(without);
    struct ibv_qp *plain = Qp(cq, cq, 4, 4);
    ASSERT_NE(plain, nullptr);
    uint32_t f = 0xdead;
    ASSERT_EQ(o_->qp_flags(v_, with, &f), 0);
    EXPECT_EQ(f, OTE_VERBS_QP_NO_SCATTER_TO_CQE);
    ASSERT_EQ(o_->qp_flags(v_, without, &f), 0);
    EXPECT_EQ(f, 0u);
    ASSERT_EQ(o_->qp_flags(v_, plain, &f), 0);
    EXPECT_EQ(f, 0u);
    // a flag nobody knows is refused, never ignored; the limits hold with flags too
    struct ibv_qp *qp = reinterpret_cast<struct ibv_qp *>(0x1);
    EXPECT_EQ(o_->create_qp_flags(v_, pd_, &ia, 0x80, &qp), EOPNOTSUPP);
    ia.cap.max_send_wr = (uint32_t)GetParam().max_qp_wr + 1;
    EXPECT_EQ(o_->create_qp_flags(v_, pd_, &ia, OTE_VERBS_QP_NO_SCATTER_TO_CQE, &qp), EINVAL);
    EXPECT_EQ(qp, reinterpret_cast<struct ibv_qp *>(0x1)) << "output written on failure";
}

// A signalled 64-byte READ into a dma-buf MR on a QP created without the flag: on mlx5 the
// hazard (LOC_PROT_ERR, QP to ERR, an ERROR, the counter); elsewhere the bytes arrive.
TEST_P(SimProfile, SignalledSmallReadIntoDeviceMemory) {
    const bool hazard = (GetParam().dev_flags & OTE_VERBS_DEV_SCATTER_TO_CQE) != 0;
    Memfd dev(4096);
    ASSERT_TRUE(dev.ok());
    struct ibv_mr *dmr = Dmabuf(dev, 4096);
    ASSERT_NE(dmr, nullptr);
    struct ibv_cq *cq = Cq(64);
    struct ibv_qp *a = Qp(cq, cq), *b = Qp(cq, cq);
    ASSERT_TRUE(a && b);
    Connect(a, b);
    VerbsBuf *src = Mem(64, kAccessRw, 0x5a);
    const uint64_t before = ote_sim_scatter_hazards();
    ErrorLogsExpected guard;
    ASSERT_EQ(PostSendSge(a, IBV_WR_RDMA_READ, kIova, 64, dmr->lkey, 7, src->addr(), src->mr->rkey),
              0);
    auto wc = Poll(cq, 1);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].wr_id, 7u);
    if (hazard) {
        EXPECT_EQ(wc[0].status, IBV_WC_LOC_PROT_ERR);
        EXPECT_EQ(ote_sim_scatter_hazards(), before + 1);
        EXPECT_EQ(dev.view()[0], 0) << "no byte moved";
        EXPECT_EQ(State(a), IBV_QPS_ERR);
        EXPECT_GE(guard.Seen(), 1u);
        EXPECT_TRUE(LogContains("scatter-to-CQE"));
    } else {
        EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
        EXPECT_EQ(ote_sim_scatter_hazards(), before);
        EXPECT_EQ(dev.view()[0], 0x5a);
        EXPECT_EQ(dev.view()[63], 0x5a);
        EXPECT_EQ(guard.Seen(), 0u);
    }
}

INSTANTIATE_TEST_SUITE_P(Profiles, SimProfile, ::testing::ValuesIn(kProfiles),
                         [](const ::testing::TestParamInfo<Profile> &i) { return i.param.name; });

// On mlx5, what does not trip the hazard moves the bytes: a QP created with the flag, an
// unsignalled READ, a 65-byte READ, a small READ into host memory.
class ScatterOnMlx5 : public ote_test::VerbsFixture {
  protected:
    void SetUp() override {
        VerbsFixture::SetUp();
        config_ = OneDevice("mlx5");
        ASSERT_NO_FATAL_FAILURE(OpenVerbs("sim", config_.c_str()));
        ASSERT_TRUE(dev_.ok());
        ASSERT_EQ(o_->reg_dmabuf_mr(v_, pd_, 0, 4096, kIova, dev_.fd(), kAccessRw, &dmr_), 0);
        cq_ = Cq(64);
        src_ = Mem(128, kAccessRw, 0x6b);
        before_ = ote_sim_scatter_hazards();
    }
    void TearDown() override {
        EXPECT_EQ(ote_sim_scatter_hazards(), before_) << "a hazard where none was";
        if (dmr_) {
            EXPECT_EQ(o_->dereg_mr(v_, dmr_), 0);
        }
        VerbsFixture::TearDown();
    }
    // b connected to a (both on cq_).
    void Pair(struct ibv_qp *a) {
        struct ibv_qp *b = Qp(cq_, cq_);
        ASSERT_NE(b, nullptr);
        Connect(a, b);
    }
    void ExpectOne(uint64_t id) {
        auto wc = Poll(cq_, 1);
        ASSERT_EQ(wc.size(), 1u);
        EXPECT_EQ(wc[0].wr_id, id);
        EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
    }
    std::string config_;
    Memfd dev_{4096};
    struct ibv_mr *dmr_ = nullptr;
    struct ibv_cq *cq_ = nullptr;
    VerbsBuf *src_ = nullptr;
    uint64_t before_ = 0;
};

TEST_F(ScatterOnMlx5, QpWithTheFlagReadsSmallIntoDeviceMemory) {
    struct ibv_qp_init_attr ia;
    std::memset(&ia, 0, sizeof(ia));
    ia.send_cq = ia.recv_cq = cq_;
    ia.qp_type = IBV_QPT_RC;
    ia.sq_sig_all = 1;
    ia.cap.max_send_wr = ia.cap.max_recv_wr = 16;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    struct ibv_qp *a = nullptr;
    ASSERT_EQ(o_->create_qp_flags(v_, pd_, &ia, OTE_VERBS_QP_NO_SCATTER_TO_CQE, &a), 0);
    TrackQp(a);
    ASSERT_NO_FATAL_FAILURE(Pair(a));
    ASSERT_EQ(
        PostSendSge(a, IBV_WR_RDMA_READ, kIova, 64, dmr_->lkey, 1, src_->addr(), src_->mr->rkey),
        0);
    ASSERT_NO_FATAL_FAILURE(ExpectOne(1));
    EXPECT_EQ(dev_.view()[0], 0x6b);
    EXPECT_EQ(dev_.view()[63], 0x6b);
    EXPECT_EQ(dev_.view()[64], 0);
}

TEST_F(ScatterOnMlx5, UnsignalledSmallReadIntoDeviceMemoryMovesTheBytes) {
    struct ibv_qp *a = Qp(cq_, cq_, 64, 64, /*sig_all=*/0);
    ASSERT_NE(a, nullptr);
    ASSERT_NO_FATAL_FAILURE(Pair(a));
    // an unsignalled READ into the dma-buf MR, then a signalled one into host memory
    struct ibv_sge sge = {kIova, 64, dmr_->lkey};
    struct ibv_send_wr wr;
    std::memset(&wr, 0, sizeof(wr));
    wr.wr_id = 2;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.send_flags = 0; // unsignalled
    wr.wr.rdma.remote_addr = src_->addr();
    wr.wr.rdma.rkey = src_->mr->rkey;
    struct ibv_send_wr *bad = nullptr;
    ASSERT_EQ(o_->post_send(v_, a, &wr, &bad), 0);
    VerbsBuf *host = Mem(64);
    ASSERT_EQ(PostSend(a, IBV_WR_RDMA_READ, host, 0, 64, 3, src_->addr(), src_->mr->rkey), 0);
    ASSERT_NO_FATAL_FAILURE(ExpectOne(3));
    EXPECT_EQ(dev_.view()[0], 0x6b);
    EXPECT_EQ(dev_.view()[63], 0x6b);
    EXPECT_EQ(host->mem[0], 0x6b) << "a small READ into host memory is no hazard";
}

TEST_F(ScatterOnMlx5, SignalledReadOf65BytesIntoDeviceMemoryMovesTheBytes) {
    struct ibv_qp *a = Qp(cq_, cq_);
    ASSERT_NE(a, nullptr);
    ASSERT_NO_FATAL_FAILURE(Pair(a));
    ASSERT_EQ(
        PostSendSge(a, IBV_WR_RDMA_READ, kIova, 65, dmr_->lkey, 1, src_->addr(), src_->mr->rkey),
        0);
    ASSERT_NO_FATAL_FAILURE(ExpectOne(1));
    EXPECT_EQ(dev_.view()[0], 0x6b);
    EXPECT_EQ(dev_.view()[64], 0x6b);
    EXPECT_EQ(dev_.view()[65], 0);
}

// ---- how a device gets its profile ----

class ProfileConfig : public ote_test::OteTest {
  protected:
    void SetUp() override {
        OteTest::SetUp();
        const char *e = getenv("OTE_SIM_PROFILE");
        had_env_ = e != nullptr;
        if (had_env_) saved_env_ = e;
        unsetenv("OTE_SIM_PROFILE");
    }
    void TearDown() override {
        if (had_env_) setenv("OTE_SIM_PROFILE", saved_env_.c_str(), 1);
        else unsetenv("OTE_SIM_PROFILE");
        OteTest::TearDown();
    }
    // The profiles of devices a and b under config (empty: open failed with *st).
    std::string Profiles(const std::string &config, ote_status_t *st = nullptr) {
        ote_verbs_t *v = nullptr;
        ote_status_t s = ote_verbs_open("sim", config.c_str(), &v);
        if (st) *st = s;
        if (s != OTE_OK) return "";
        std::string out;
        for (const char *dev : {"a", "b"}) {
            const char *name = nullptr;
            if (ote_sim_device_profile(v, dev, &name) == OTE_OK)
                out += std::string(dev) + "=" + name + " ";
        }
        const char *name = nullptr;
        EXPECT_EQ(ote_sim_device_profile(v, "nope", &name), OTE_ERR_NOT_FOUND);
        ote_verbs_close(v);
        return out;
    }
    bool had_env_ = false;
    std::string saved_env_;
};

const char kTwoDevs[] =
    "dev=a,numa=0;port;gid=auto-v4,type=v2;dev=b,numa=0,profile=small;port;"
    "gid=auto-v4,type=v2";

TEST_F(ProfileConfig, DefaultIsMlx5AndADeviceOptionWins) {
    EXPECT_EQ(Profiles(kTwoDevs), "a=mlx5 b=small ");
}

TEST_F(ProfileConfig, GlobalItemAnywhereAppliesToDevicesThatNameNone) {
    EXPECT_EQ(Profiles(std::string("profile=rxe;") + kTwoDevs), "a=rxe b=small ");
    EXPECT_EQ(Profiles(std::string(kTwoDevs) + ";profile=nomw"), "a=nomw b=small ");
}

TEST_F(ProfileConfig, EnvironmentAppliesWhenTheConfigNamesNone) {
    setenv("OTE_SIM_PROFILE", "rxe", 1);
    EXPECT_EQ(Profiles(kTwoDevs), "a=rxe b=small ");
    EXPECT_EQ(Profiles(std::string("profile=nomw;") + kTwoDevs), "a=nomw b=small ")
        << "the global item beats the environment";
}

TEST_F(ProfileConfig, UnknownProfilesAreRefused) {
    ote_status_t st = OTE_OK;
    EXPECT_EQ(Profiles("dev=a,profile=bogus;port", &st), "");
    EXPECT_EQ(st, OTE_ERR_INVALID);
    EXPECT_EQ(Profiles("profile=bogus;dev=a;port", &st), "");
    EXPECT_EQ(st, OTE_ERR_INVALID);
    EXPECT_EQ(Profiles("profile=rxe;profile=small;dev=a;port", &st), "");
    EXPECT_EQ(st, OTE_ERR_INVALID) << "the global profile twice";
    setenv("OTE_SIM_PROFILE", "bogus", 1);
    EXPECT_EQ(Profiles("dev=a;port", &st), "");
    EXPECT_EQ(st, OTE_ERR_INVALID);
    EXPECT_EQ(Profiles("dev=a,profile=rxe;port", &st), "a=rxe ")
        << "a bad environment matters only to devices that take it";
    EXPECT_TRUE(LogContains("bogus"));
    const char *name = nullptr;
    EXPECT_EQ(ote_sim_device_profile(nullptr, "a", &name), OTE_ERR_INVALID);
}

} // namespace

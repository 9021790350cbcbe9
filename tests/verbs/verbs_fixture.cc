// tests/verbs/verbs_fixture.cc - see verbs_fixture.h.
#include "tests/verbs/verbs_fixture.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>

extern "C" {
#include "verbs/fault.h"
}

namespace ote_test {

namespace {
constexpr char kMemfdName[] = "ote-dmabuf-test";
}

Memfd::Memfd(size_t size) : size_(size) {
    fd_ = memfd_create(kMemfdName, MFD_CLOEXEC);
    if (fd_ < 0 || ftruncate(fd_, (off_t)size) != 0) return;
    void *p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (p != MAP_FAILED) view_ = static_cast<uint8_t *>(p);
}

Memfd::~Memfd() {
    if (view_ != nullptr) munmap(view_, size_);
    if (fd_ >= 0) close(fd_);
}

std::vector<std::pair<uintptr_t, uintptr_t>> MemfdRanges() {
    std::ifstream maps("/proc/self/maps");
    std::string line, name = std::string("memfd:") + kMemfdName;
    std::vector<std::pair<uintptr_t, uintptr_t>> out;
    while (std::getline(maps, line)) {
        if (line.find(name) == std::string::npos) continue;
        unsigned long start = 0, end = 0;
        if (sscanf(line.c_str(), "%lx-%lx", &start, &end) == 2) out.emplace_back(start, end);
    }
    return out;
}

void VerbsFixture::OpenVerbs(const std::string &provider, const char *config, bool fault,
                             int dev_index) {
    ote_verbs_t *v = nullptr;
    ASSERT_EQ(ote_verbs_open(provider.c_str(), config, &v), OTE_OK) << provider;
    if (fault) {
        sim_ = v;
        ASSERT_EQ(ote_verbs_fault_wrap(sim_, OTE_VERBS_FAULT_OWN_INNER, &v_), OTE_OK);
    } else {
        v_ = v;
    }
    o_ = v_->ops;
    struct ibv_device **list = nullptr;
    int num = 0;
    ASSERT_EQ(o_->get_device_list(v_, &list, &num), 0);
    ASSERT_GT(num, dev_index);
    int rc = o_->open_device(v_, list[dev_index], &ctx_);
    o_->free_device_list(v_, list);
    ASSERT_EQ(rc, 0);
    ASSERT_EQ(o_->alloc_pd(v_, ctx_, &pd_), 0);
    ASSERT_EQ(o_->query_port(v_, ctx_, 1, &port_), 0);
    gid_index_ = PickGid(ctx_);
    ASSERT_GE(gid_index_, 0) << "no GID on port 1";
    ASSERT_EQ(o_->query_gid(v_, ctx_, 1, gid_index_, &gid_), 0);
}

bool VerbsFixture::ProviderHasDevice(const std::string &provider) {
    if (provider == "sim") return true;
    ote_verbs_t *probe = nullptr;
    if (ote_verbs_open(provider.c_str(), nullptr, &probe) != OTE_OK) return false;
    struct ibv_device **list = nullptr;
    int num = 0;
    int rc = probe->ops->get_device_list(probe, &list, &num);
    if (rc == 0) probe->ops->free_device_list(probe, list);
    ote_verbs_close(probe);
    return rc == 0 && num > 0;
}

void VerbsFixture::TearDown() {
    if (v_ != nullptr) {
        if (sim_ != nullptr) ote_verbs_fault_clear(v_);
        for (auto *qp : qps_) EXPECT_EQ(o_->destroy_qp(v_, qp), 0);
        for (auto *mw : mws_) EXPECT_EQ(o_->dealloc_mw(v_, mw), 0);
        for (auto *b : bufs_) {
            if (b->mr != nullptr) {
                EXPECT_EQ(o_->dereg_mr(v_, b->mr), 0);
            }
            delete b;
        }
        for (auto *mr : mrs_) EXPECT_EQ(o_->dereg_mr(v_, mr), 0);
        for (auto *cq : cqs_) EXPECT_EQ(o_->destroy_cq(v_, cq), 0);
        for (auto *ch : chs_) EXPECT_EQ(o_->destroy_comp_channel(v_, ch), 0);
        if (pd_ != nullptr) {
            EXPECT_EQ(o_->dealloc_pd(v_, pd_), 0);
        }
        if (ctx_ != nullptr) {
            EXPECT_EQ(o_->close_device(v_, ctx_), 0);
        }
        ote_verbs_close(v_); // with the decorator: closes the wrapped provider too
    } else if (sim_ != nullptr) {
        ote_verbs_close(sim_);
    }
    v_ = sim_ = nullptr;
    OteTest::TearDown();
}

int VerbsFixture::PickGid(struct ibv_context *ctx) {
    int best = -1, score = -1;
    for (int i = 0; i < port_.gid_tbl_len; i++) {
        struct ibv_gid_entry e;
        if (o_->query_gid_ex(v_, ctx, 1, (uint32_t)i, &e) != 0) continue;
        bool v4 = e.gid.raw[10] == 0xff && e.gid.raw[11] == 0xff;
        int s = (e.gid_type == IBV_GID_TYPE_ROCE_V2 ? 2 : 0) + (v4 ? 1 : 0);
        if (s > score) score = s, best = i;
    }
    return best;
}

struct ibv_cq *VerbsFixture::Cq(int n, struct ibv_comp_channel *ch) {
    struct ibv_cq *cq = nullptr;
    EXPECT_EQ(o_->create_cq(v_, ctx_, n, nullptr, ch, 0, &cq), 0);
    if (cq != nullptr) cqs_.push_back(cq);
    return cq;
}

struct ibv_comp_channel *VerbsFixture::Channel() {
    struct ibv_comp_channel *ch = nullptr;
    EXPECT_EQ(o_->create_comp_channel(v_, ctx_, &ch), 0);
    if (ch != nullptr) chs_.push_back(ch);
    return ch;
}

struct ibv_qp *VerbsFixture::Qp(struct ibv_cq *scq, struct ibv_cq *rcq, uint32_t sw, uint32_t rw,
                                int sig_all, struct ibv_qp_cap *actual) {
    RcQpCaps caps;
    caps.max_send_wr = sw;
    caps.max_recv_wr = rw;
    // 4 SGEs and 64 bytes inline, or what the device allows when it allows less (the sim's
    // "small" profile has 2 SGEs), as an application that asks the device would.
    struct ibv_device_attr da;
    EXPECT_EQ(o_->query_device(v_, ctx_, &da), 0);
    caps.max_sge = std::min<uint32_t>(4, (uint32_t)da.max_sge);
    caps.max_inline_data = 64;
    caps.sq_sig_all = sig_all;
    struct ibv_qp *qp = nullptr;
    EXPECT_EQ(CreateRcQp(v_, pd_, scq, rcq, caps, &qp, actual), 0);
    if (qp != nullptr) qps_.push_back(qp);
    return qp;
}

void VerbsFixture::Forget(struct ibv_qp *qp) {
    auto it = std::find(qps_.begin(), qps_.end(), qp);
    if (it != qps_.end()) qps_.erase(it);
}

VerbsBuf *VerbsFixture::Mem(size_t n, int access, uint8_t fill) {
    VerbsBuf *b = new VerbsBuf;
    b->mem.assign(n, fill);
    EXPECT_EQ(o_->reg_mr(v_, pd_, b->mem.data(), n, access, &b->mr), 0);
    bufs_.push_back(b);
    return b;
}

struct ibv_mw *VerbsFixture::Mw(enum ibv_mw_type type) {
    struct ibv_mw *mw = nullptr;
    EXPECT_EQ(o_->alloc_mw(v_, pd_, type, &mw), 0);
    if (mw != nullptr) mws_.push_back(mw);
    return mw;
}

int VerbsFixture::ToInit(struct ibv_qp *qp, int access) { return QpToInit(v_, qp, access); }

int VerbsFixture::ToRtr(struct ibv_qp *qp, uint32_t dqpn, const union ibv_gid &dgid,
                        uint8_t min_rnr, uint32_t rq_psn) {
    QpPath path;
    path.dest_qpn = dqpn;
    path.dgid = dgid;
    path.mtu = port_.active_mtu;
    path.sgid_index = (uint8_t)gid_index_;
    path.min_rnr_timer = min_rnr;
    path.rq_psn = rq_psn;
    return QpToRtr(v_, qp, path);
}

int VerbsFixture::ToRts(struct ibv_qp *qp, uint8_t rnr_retry, uint8_t timeout, uint8_t retry,
                        uint32_t sq_psn) {
    QpRetry r;
    r.timeout = timeout;
    r.retry_cnt = retry;
    r.rnr_retry = rnr_retry;
    r.sq_psn = sq_psn;
    return QpToRts(v_, qp, r);
}

enum ibv_qp_state VerbsFixture::State(struct ibv_qp *qp) {
    enum ibv_qp_state st = IBV_QPS_UNKNOWN;
    EXPECT_EQ(QpState(v_, qp, &st), 0);
    return st;
}

void VerbsFixture::Connect(struct ibv_qp *a, struct ibv_qp *b, uint8_t rnr_retry, uint8_t min_rnr,
                           uint8_t timeout, uint8_t retry) {
    ASSERT_EQ(ToInit(a), 0);
    ASSERT_EQ(ToInit(b), 0);
    ASSERT_EQ(ToRtr(a, b->qp_num, gid_, min_rnr), 0);
    ASSERT_EQ(ToRtr(b, a->qp_num, gid_, min_rnr), 0);
    ASSERT_EQ(ToRts(a, rnr_retry, timeout, retry), 0);
    ASSERT_EQ(ToRts(b, rnr_retry, timeout, retry), 0);
}

void VerbsFixture::Connect(struct ibv_qp *qp, uint32_t dqpn, const union ibv_gid &dgid,
                           uint8_t timeout) {
    ASSERT_EQ(ToInit(qp), 0);
    ASSERT_EQ(ToRtr(qp, dqpn, dgid), 0);
    ASSERT_EQ(ToRts(qp, 7, timeout), 0);
}

std::vector<struct ibv_wc> VerbsFixture::Poll(struct ibv_cq *cq, int n, uint64_t wait_ns) {
    std::vector<struct ibv_wc> out;
    EXPECT_GE(PollCq(v_, cq, (size_t)n, wait_ns, &out), 0);
    return out;
}

int VerbsFixture::PostRecv(struct ibv_qp *qp, const VerbsBuf *b, uint64_t off, uint32_t len,
                           uint64_t id) {
    return PostRecvOne(v_, qp, b->addr() + off, len, b->mr->lkey, id);
}

int VerbsFixture::PostSend(struct ibv_qp *qp, enum ibv_wr_opcode op, const VerbsBuf *b,
                           uint64_t off, uint32_t len, uint64_t id, uint64_t raddr, uint32_t rkey,
                           uint32_t imm, unsigned flags, uint32_t lkey_override) {
    struct ibv_sge sge = {b ? b->addr() + off : 0, len, b ? b->mr->lkey : 0};
    if (lkey_override) sge.lkey = lkey_override;
    struct ibv_send_wr wr, *bad = nullptr;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = id;
    wr.opcode = op;
    wr.sg_list = &sge;
    wr.num_sge = b ? 1 : 0;
    wr.send_flags = flags;
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    if (op == IBV_WR_SEND_WITH_INV) wr.invalidate_rkey = imm;
    else wr.imm_data = imm;
    return o_->post_send(v_, qp, &wr, &bad);
}

int VerbsFixture::PostSendSge(struct ibv_qp *qp, enum ibv_wr_opcode op, uint64_t addr, uint32_t len,
                              uint32_t lkey, uint64_t id, uint64_t raddr, uint32_t rkey,
                              uint32_t imm) {
    struct ibv_sge sge = {addr, len, lkey};
    struct ibv_send_wr wr, *bad = nullptr;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = id;
    wr.opcode = op;
    wr.sg_list = &sge;
    wr.num_sge = len ? 1 : 0;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = imm;
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    return o_->post_send(v_, qp, &wr, &bad);
}

int VerbsFixture::PostLocalInv(struct ibv_qp *qp, uint32_t rkey, uint64_t id) {
    struct ibv_send_wr wr, *bad = nullptr;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = id;
    wr.opcode = IBV_WR_LOCAL_INV;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.invalidate_rkey = rkey;
    return o_->post_send(v_, qp, &wr, &bad);
}

int VerbsFixture::BindMw(struct ibv_qp *qp, struct ibv_mw *mw, uint32_t rkey, const VerbsBuf *b,
                         uint64_t off, uint64_t len, unsigned access, uint64_t id) {
    struct ibv_send_wr wr, *bad = nullptr;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = id;
    wr.opcode = IBV_WR_BIND_MW;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.bind_mw.mw = mw;
    wr.bind_mw.rkey = rkey;
    wr.bind_mw.bind_info.mr = b->mr;
    wr.bind_mw.bind_info.addr = b->addr() + off;
    wr.bind_mw.bind_info.length = len;
    wr.bind_mw.bind_info.mw_access_flags = access;
    return o_->post_send(v_, qp, &wr, &bad);
}

void ProviderTest::SetUp() {
    VerbsFixture::SetUp();
    if (!ProviderHasDevice(GetParam()))
        GTEST_SKIP() << "no " << GetParam() << " device on this machine";
    ASSERT_NO_FATAL_FAILURE(OpenVerbs(GetParam()));
}

std::string ProviderName(const ::testing::TestParamInfo<std::string> &info) {
    std::string n = info.param;
    for (auto &ch : n) {
        if (ch == '-') ch = '_'; // gtest names: letters, digits and '_'
    }
    return n;
}

} // namespace ote_test

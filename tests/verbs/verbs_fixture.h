// tests/verbs/verbs_fixture.h - the one fixture of the verbs tests that drive a provider
// (conformance, dma-buf MRs, the sim's security regressions, the fault decorator over the
// sim, the two-process test): it opens a provider (optionally under the fault decorator),
// the first device, a PD, and picks a GID of port 1; it creates CQs, QPs, registered
// memory and windows that it destroys itself at the end of the test, checking every
// destroy; and it wraps the QP transitions, posts and polls the tests use.
#ifndef OTE_TESTS_VERBS_VERBS_FIXTURE_H
#define OTE_TESTS_VERBS_VERBS_FIXTURE_H

#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tests/util/test_base.h"
#include "tests/verbs/rc_qp.h"

extern "C" {
#include "base/time.h"
#include "verbs/verbs.h"
}

namespace ote_test {

// How long a wait for something that must happen may take before the test fails: it is
// only reached when the provider is broken, so it is generous for a loaded machine.
constexpr uint64_t kVerbsWaitNs = 10 * OTE_NSEC_PER_SEC;

constexpr int kAccessRw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

// Host memory registered by the fixture (deregistered and freed at the end of the test).
struct VerbsBuf {
    std::vector<uint8_t> mem;
    struct ibv_mr *mr = nullptr;
    uint64_t addr() const { return (uint64_t)(uintptr_t)mem.data(); }
};

// "Device memory" for dma-buf MRs: a memfd (as the fake GPU driver's memory is) and the
// test's own MAP_SHARED view of it, through which the test checks what a NIC wrote.
class Memfd {
  public:
    explicit Memfd(size_t size);
    ~Memfd();
    Memfd(const Memfd &) = delete;
    Memfd &operator=(const Memfd &) = delete;
    bool ok() const { return view_ != nullptr; }
    int fd() const { return fd_; }
    uint8_t *view() const { return view_; }
    size_t size() const { return size_; }

  private:
    int fd_ = -1;
    size_t size_;
    uint8_t *view_ = nullptr;
};

// Mappings of Memfd memory in this process (the test's views and any provider's own),
// as [start, end) address ranges.
std::vector<std::pair<uintptr_t, uintptr_t>> MemfdRanges();
inline int MemfdMappings() { return (int)MemfdRanges().size(); }

class VerbsFixture : public OteTest {
  protected:
    // Opens `provider` with `config` (NULL: its default), wrapped in the fault decorator
    // when `fault` (then v_ is the decorator and sim_ the inner instance), device
    // `dev_index`, a PD and port 1 (port_), and picks gid_/gid_index_ (perftest's choice:
    // RoCE v2, IPv4-mapped first). Call under ASSERT_NO_FATAL_FAILURE.
    void OpenVerbs(const std::string &provider, const char *config = nullptr, bool fault = false,
                   int dev_index = 0);
    // True for "sim"; for another provider, whether it opens and lists a device (tests of
    // hardware providers skip with the reason otherwise).
    static bool ProviderHasDevice(const std::string &provider);
    // Destroys what the fixture created (QPs, windows, MRs, extra MRs, CQs, channels, PD,
    // context) expecting each destroy to succeed, then closes the provider.
    void TearDown() override;

    // A RoCE v2 entry of port 1, preferring IPv4-mapped, then any non-zero one; -1: none.
    int PickGid(struct ibv_context *ctx);

    struct ibv_cq *Cq(int n = 256, struct ibv_comp_channel *ch = nullptr);
    struct ibv_comp_channel *Channel();
    // An RC QP with 4 SGEs (fewer if the device has fewer) and 64 bytes inline; its actual
    // caps go to *actual if given.
    struct ibv_qp *Qp(struct ibv_cq *scq, struct ibv_cq *rcq, uint32_t sw = 64, uint32_t rw = 64,
                      int sig_all = 1, struct ibv_qp_cap *actual = nullptr);
    VerbsBuf *Mem(size_t n, int access = kAccessRw, uint8_t fill = 0);
    struct ibv_mw *Mw(enum ibv_mw_type type = IBV_MW_TYPE_2);
    // Objects the test created itself, destroyed at the end with the others.
    void TrackMr(struct ibv_mr *mr) { mrs_.push_back(mr); }
    void TrackQp(struct ibv_qp *qp) { qps_.push_back(qp); }
    void TrackChannel(struct ibv_comp_channel *ch) { chs_.push_back(ch); }
    // The test destroyed qp itself: the fixture no longer does.
    void Forget(struct ibv_qp *qp);

    int ToInit(struct ibv_qp *qp, int access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    int ToRtr(struct ibv_qp *qp, uint32_t dqpn, const union ibv_gid &dgid, uint8_t min_rnr = 1,
              uint32_t rq_psn = 0);
    int ToRts(struct ibv_qp *qp, uint8_t rnr_retry = 7, uint8_t timeout = 14, uint8_t retry = 7,
              uint32_t sq_psn = 0);
    int ToErr(struct ibv_qp *qp) { return QpToErr(v_, qp); }
    enum ibv_qp_state State(struct ibv_qp *qp);
    // a and b (same context) connected back to back through gid_.
    void Connect(struct ibv_qp *a, struct ibv_qp *b, uint8_t rnr_retry = 7, uint8_t min_rnr = 1,
                 uint8_t timeout = 14, uint8_t retry = 7);
    // qp alone connected to (dqpn, dgid): INIT, RTR, RTS.
    void Connect(struct ibv_qp *qp, uint32_t dqpn, const union ibv_gid &dgid, uint8_t timeout = 14);

    // Polls until n completions arrived or wait_ns passed; returns what arrived.
    std::vector<struct ibv_wc> Poll(struct ibv_cq *cq, int n, uint64_t wait_ns = kVerbsWaitNs);
    int PostRecv(struct ibv_qp *qp, const VerbsBuf *b, uint64_t off, uint32_t len, uint64_t id);
    // One WR with one SGE of b (none when b is NULL); imm is the invalidated rkey of a
    // SEND_WITH_INV, else the immediate data.
    int PostSend(struct ibv_qp *qp, enum ibv_wr_opcode op, const VerbsBuf *b, uint64_t off,
                 uint32_t len, uint64_t id, uint64_t raddr = 0, uint32_t rkey = 0, uint32_t imm = 0,
                 unsigned flags = IBV_SEND_SIGNALED, uint32_t lkey_override = 0);
    // One signaled WR whose SGE is (addr, len, lkey) as given (none when len is 0): for
    // memory the fixture does not own. imm is the immediate data.
    int PostSendSge(struct ibv_qp *qp, enum ibv_wr_opcode op, uint64_t addr, uint32_t len,
                    uint32_t lkey, uint64_t id, uint64_t raddr, uint32_t rkey, uint32_t imm = 0);
    // A signaled LOCAL_INV of rkey.
    int PostLocalInv(struct ibv_qp *qp, uint32_t rkey, uint64_t id);
    int BindMw(struct ibv_qp *qp, struct ibv_mw *mw, uint32_t rkey, const VerbsBuf *b, uint64_t off,
               uint64_t len, unsigned access, uint64_t id);

    ote_verbs_t *v_ = nullptr;   // the provider the test drives
    ote_verbs_t *sim_ = nullptr; // with the fault decorator: the wrapped provider
    const ote_verbs_ops_t *o_ = nullptr;
    struct ibv_context *ctx_ = nullptr;
    struct ibv_pd *pd_ = nullptr;
    struct ibv_port_attr port_ = {};
    union ibv_gid gid_ = {};
    int gid_index_ = -1;

  private:
    std::vector<struct ibv_qp *> qps_;
    std::vector<struct ibv_mw *> mws_;
    std::vector<VerbsBuf *> bufs_;
    std::vector<struct ibv_mr *> mrs_;
    std::vector<struct ibv_cq *> cqs_;
    std::vector<struct ibv_comp_channel *> chs_;
};

// VerbsFixture over each provider of a parametrized suite: "sim" always, a hardware
// provider ("rdma-core") only where it lists a device (skipped with the reason otherwise).
class ProviderTest : public VerbsFixture, public ::testing::WithParamInterface<std::string> {
  protected:
    void SetUp() override;
    bool IsSim() const { return GetParam() == "sim"; }
};

// The providers of a ProviderTest suite and their test-name suffixes:
//   INSTANTIATE_TEST_SUITE_P(Providers, MySuite, ote_test::AllProviders(), ote_test::ProviderName);
inline auto AllProviders() {
    return ::testing::Values(std::string("sim"), std::string("rdma-core"));
}
std::string ProviderName(const ::testing::TestParamInfo<std::string> &info);

} // namespace ote_test

#endif

// dma-buf MRs (reg_dmabuf_mr) against every provider: "sim" always, "rdma-core" when it
// lists a device. A memfd stands in for a GPU's dma-buf: the MR is registered over the
// fd alone, remote WRITE and READ reach it at its iova, and the bytes are checked through
// a separate mapping of the memfd (the test's own view of the "device" memory). A memfd
// is no dma-buf to a real NIC, so on rdma-core the data cases skip with that reason and
// only the argument checks run.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "tests/verbs/verbs_fixture.h"

extern "C" {
#include "base/alloc.h"
#include "base/time.h"
#include "verbs/fault.h"
#include "verbs/verbs.h"
}

namespace {

using ote_test::kAccessRw;
using ote_test::Memfd;
using ote_test::MemfdMappings;
using ote_test::VerbsBuf;

constexpr size_t kPage = 4096;
constexpr uint64_t kIovaBase = 0x7e5a00000000ull; // an address the host has nothing at

class Dmabuf : public ote_test::ProviderTest {
  protected:
    void TearDown() override {
        for (auto *mr : dmrs_) EXPECT_EQ(o_->dereg_mr(v_, mr), 0);
        VerbsFixture::TearDown();
    }

    // A dma-buf MR over [off, off+len) of m at iova kIovaBase + the page offset of off.
    int RegDmabuf(const Memfd &m, uint64_t off, size_t len, struct ibv_mr **mr,
                  int access = kAccessRw) {
        int rc = o_->reg_dmabuf_mr(v_, pd_, off, len, Iova(off), m.fd(), access, mr);
        if (rc == 0) dmrs_.push_back(*mr);
        return rc;
    }
    static uint64_t Iova(uint64_t off) { return kIovaBase + (off % kPage); }
    void Dereg(struct ibv_mr *mr) {
        EXPECT_EQ(o_->dereg_mr(v_, mr), 0);
        for (auto it = dmrs_.begin(); it != dmrs_.end(); ++it) {
            if (*it == mr) {
                dmrs_.erase(it);
                break;
            }
        }
    }

    // WRITE from host memory into the dma-buf MR and READ it back into host memory, checked
    // through the test's own mapping of the memfd; then the dma-buf MR as the local side
    // (source of a WRITE, destination of a READ, a receive WQE); then its bounds.
    void WriteAndRead(uint64_t off, size_t len) {
        Memfd dev(off + len + 2 * kPage);
        ASSERT_TRUE(dev.ok());
        struct ibv_mr *mr = nullptr;
        ASSERT_EQ(RegDmabuf(dev, off, len, &mr), 0);
        EXPECT_EQ(mr->addr, reinterpret_cast<void *>(off)) << "as rdma-core: addr is the offset";
        EXPECT_EQ(mr->length, len);
        EXPECT_EQ(mr->pd, pd_);
        struct ibv_cq *scq = Cq(), *rcq = Cq();
        struct ibv_qp *a = Qp(scq, rcq), *b = Qp(scq, rcq);
        ASSERT_TRUE(a && b);
        Connect(a, b);
        VerbsBuf *src = Mem(len), *back = Mem(len), *out = Mem(len);
        for (size_t i = 0; i < len; i++) src->mem[i] = (uint8_t)(i * 7 + 3);
        ASSERT_EQ(PostSend(a, IBV_WR_RDMA_WRITE, src, 0, (uint32_t)len, 1, Iova(off), mr->rkey), 0);
        auto wc = Poll(scq, 1);
        ASSERT_EQ(wc.size(), 1u);
        ASSERT_EQ(wc[0].status, IBV_WC_SUCCESS);
        EXPECT_EQ(memcmp(dev.view() + off, src->mem.data(), len), 0)
            << "the WRITE reached the memfd";
        EXPECT_EQ(dev.view()[off + len], 0) << "nothing past the MR was written";
        if (off > 0) {
            EXPECT_EQ(dev.view()[off - 1], 0) << "nothing before the MR was written";
        }
        // the "device" changes its memory; a READ sees the new bytes
        for (size_t i = 0; i < len; i++) dev.view()[off + i] = (uint8_t)(i * 13 + 5);
        ASSERT_EQ(PostSend(a, IBV_WR_RDMA_READ, back, 0, (uint32_t)len, 2, Iova(off), mr->rkey), 0);
        wc = Poll(scq, 1);
        ASSERT_EQ(wc.size(), 1u);
        ASSERT_EQ(wc[0].status, IBV_WC_SUCCESS);
        EXPECT_EQ(memcmp(back->mem.data(), dev.view() + off, len), 0)
            << "the READ reached the memfd";
        // the dma-buf MR as the local side: b WRITEs from it (SGE at its iova) into host memory
        ASSERT_EQ(PostSendSge(b, IBV_WR_RDMA_WRITE, Iova(off), (uint32_t)len, mr->lkey, 3,
                              out->addr(), out->mr->rkey),
                  0);
        wc = Poll(scq, 1);
        ASSERT_EQ(wc.size(), 1u);
        ASSERT_EQ(wc[0].status, IBV_WC_SUCCESS);
        EXPECT_EQ(memcmp(out->mem.data(), dev.view() + off, len), 0);
        // a READ whose local SGE is the dma-buf MR: the response lands in the memfd
        for (size_t i = 0; i < len; i++) out->mem[i] = (uint8_t)(i * 3 + 11);
        ASSERT_EQ(PostSendSge(b, IBV_WR_RDMA_READ, Iova(off), (uint32_t)len, mr->lkey, 5,
                              out->addr(), out->mr->rkey),
                  0);
        wc = Poll(scq, 1);
        ASSERT_EQ(wc.size(), 1u);
        ASSERT_EQ(wc[0].status, IBV_WC_SUCCESS);
        EXPECT_EQ(memcmp(dev.view() + off, out->mem.data(), len), 0)
            << "the READ response reached the memfd";
        // a receive WQE in the dma-buf MR: a SEND lands in the memfd
        ASSERT_EQ(ote_test::PostRecvOne(v_, b, Iova(off), (uint32_t)len, mr->lkey, 6), 0);
        ASSERT_EQ(PostSend(a, IBV_WR_SEND, src, 0, (uint32_t)len, 7), 0);
        wc = Poll(rcq, 1);
        ASSERT_EQ(wc.size(), 1u);
        ASSERT_EQ(wc[0].status, IBV_WC_SUCCESS);
        EXPECT_EQ(wc[0].byte_len, len);
        ASSERT_EQ(Poll(scq, 1).size(), 1u);
        EXPECT_EQ(memcmp(dev.view() + off, src->mem.data(), len), 0)
            << "the SEND reached the memfd";
        // one byte past the end of the MR is a remote access error
        ASSERT_EQ(PostSend(a, IBV_WR_RDMA_WRITE, src, 0, 8, 4, Iova(off) + len - 7, mr->rkey), 0);
        wc = Poll(scq, 1);
        ASSERT_EQ(wc.size(), 1u);
        EXPECT_EQ(wc[0].status, IBV_WC_REM_ACCESS_ERR);
        EXPECT_EQ(dev.view()[off + len], 0);
        Dereg(mr); // before the memfd goes
    }

    std::vector<struct ibv_mr *> dmrs_;
};

TEST_P(Dmabuf, RemoteWriteAndReadReachTheMemfdAtOffsetZero) {
    if (!IsSim()) GTEST_SKIP() << "a memfd is not a dma-buf to a real NIC (needs a GPU exporter)";
    WriteAndRead(0, 64 * 1024);
}

TEST_P(Dmabuf, RemoteWriteAndReadReachTheMemfdAtAnUnalignedOffset) {
    if (!IsSim()) GTEST_SKIP() << "a memfd is not a dma-buf to a real NIC (needs a GPU exporter)";
    WriteAndRead(3 * kPage + 123, 10000);
}

TEST_P(Dmabuf, BadFdAndBadArgumentsFailAndCreateNothing) {
    struct ibv_mr *const kSentinel = reinterpret_cast<struct ibv_mr *>(0x1);
    struct ibv_mr *mr = kSentinel;
    int rc = o_->reg_dmabuf_mr(v_, pd_, 0, kPage, kIovaBase, -1, kAccessRw, &mr);
    if (IsSim()) {
        EXPECT_EQ(rc, EBADF);
    } else {
        EXPECT_TRUE(rc == EBADF || rc == EOPNOTSUPP) << rc;
    }
    EXPECT_EQ(mr, kSentinel) << "output written on failure";
    Memfd dev(4 * kPage);
    ASSERT_TRUE(dev.ok());
    int closed = dup(dev.fd());
    ASSERT_GE(closed, 0);
    close(closed); // a number that names no open file
    rc = o_->reg_dmabuf_mr(v_, pd_, 0, kPage, kIovaBase, closed, kAccessRw, &mr);
    EXPECT_NE(rc, 0);
    if (IsSim()) {
        EXPECT_EQ(rc, EBADF);
    }
    if (!IsSim()) return; // the rest needs the memfd to count as a dma-buf
    // a range past the end of the dma-buf
    EXPECT_EQ(o_->reg_dmabuf_mr(v_, pd_, 3 * kPage, 2 * kPage, kIovaBase, dev.fd(), kAccessRw, &mr),
              EINVAL);
    EXPECT_EQ(o_->reg_dmabuf_mr(v_, pd_, 0, 4 * kPage + 1, kIovaBase, dev.fd(), kAccessRw, &mr),
              EINVAL);
    EXPECT_EQ(o_->reg_dmabuf_mr(v_, pd_, ~0ull - 10, 100, kIovaBase, dev.fd(), kAccessRw, &mr),
              EINVAL);
    // iova and offset at different offsets within a page
    EXPECT_EQ(o_->reg_dmabuf_mr(v_, pd_, 100, kPage, kIovaBase + 101, dev.fd(), kAccessRw, &mr),
              EINVAL);
    // access flags as for reg_mr: remote write needs local write; no window binding
    EXPECT_EQ(
        o_->reg_dmabuf_mr(v_, pd_, 0, kPage, kIovaBase, dev.fd(), IBV_ACCESS_REMOTE_WRITE, &mr),
        EINVAL);
    EXPECT_EQ(o_->reg_dmabuf_mr(v_, pd_, 0, kPage, kIovaBase, dev.fd(),
                                kAccessRw | IBV_ACCESS_MW_BIND, &mr),
              EINVAL);
    EXPECT_EQ(o_->reg_dmabuf_mr(v_, pd_, 0, 0, kIovaBase, dev.fd(), kAccessRw, &mr), EINVAL);
    // a file that cannot be mapped is no dma-buf
    int pfd[2];
    ASSERT_EQ(pipe(pfd), 0);
    EXPECT_EQ(o_->reg_dmabuf_mr(v_, pd_, 0, kPage, kIovaBase, pfd[0], kAccessRw, &mr), EINVAL);
    close(pfd[0]);
    close(pfd[1]);
    EXPECT_EQ(mr, kSentinel);
    EXPECT_EQ(MemfdMappings(), 1) << "a failed registration left a mapping behind";
    EXPECT_EQ(o_->dealloc_pd(v_, pd_), 0) << "a failed registration left a child of the PD";
    pd_ = nullptr;
}

// Deregistration revokes like any MR (remote access with the old rkey fails, nothing
// lands) and unmaps the sim's view of the fd. The caller's fd may be closed while the MR
// lives: the registration keeps the memory.
TEST_P(Dmabuf, DeregThenRemoteAccessFails) {
    if (!IsSim()) GTEST_SKIP() << "a memfd is not a dma-buf to a real NIC (needs a GPU exporter)";
    Memfd dev(8 * kPage);
    ASSERT_TRUE(dev.ok());
    int fd = dup(dev.fd());
    ASSERT_GE(fd, 0);
    struct ibv_mr *mr = nullptr;
    ASSERT_EQ(o_->reg_dmabuf_mr(v_, pd_, kPage, 4 * kPage, kIovaBase, fd, kAccessRw, &mr), 0);
    close(fd);
    EXPECT_EQ(MemfdMappings(), 2) << "the provider's own mapping of the dma-buf";
    struct ibv_cq *scq = Cq(), *rcq = Cq();
    struct ibv_qp *a = Qp(scq, rcq), *b = Qp(scq, rcq);
    ASSERT_TRUE(a && b);
    Connect(a, b);
    VerbsBuf *src = Mem(kPage, kAccessRw, 0x6b);
    ASSERT_EQ(PostSend(a, IBV_WR_RDMA_WRITE, src, 0, kPage, 1, kIovaBase, mr->rkey), 0);
    auto wc = Poll(scq, 1);
    ASSERT_EQ(wc.size(), 1u);
    ASSERT_EQ(wc[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(dev.view()[kPage], 0x6b);
    uint32_t rkey = mr->rkey;
    ASSERT_EQ(o_->dereg_mr(v_, mr), 0);
    EXPECT_EQ(MemfdMappings(), 1) << "dereg unmaps the provider's mapping";
    memset(dev.view(), 0, dev.size());
    ASSERT_EQ(PostSend(a, IBV_WR_RDMA_WRITE, src, 0, kPage, 2, kIovaBase, rkey), 0);
    wc = Poll(scq, 1);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].status, IBV_WC_REM_ACCESS_ERR);
    EXPECT_EQ(State(a), IBV_QPS_ERR);
    for (size_t i = 0; i < dev.size(); i++)
        ASSERT_EQ(dev.view()[i], 0) << "byte " << i << " landed after dereg";
}

// Every allocation of a registration can fail: the call fails with ENOMEM, leaves no
// mapping of the dma-buf and no MR behind; once the allocations go through it registers.
TEST_P(Dmabuf, RegistrationSurvivesEveryAllocationFailure) {
    if (!IsSim()) GTEST_SKIP() << "a memfd is not a dma-buf to a real NIC (needs a GPU exporter)";
    Memfd dev(2 * kPage);
    ASSERT_TRUE(dev.ok());
    struct ibv_mr *const kSentinel = reinterpret_cast<struct ibv_mr *>(0x1);
    bool registered = false;
    uint64_t failed = 0;
    for (uint64_t n = 1; n <= 16 && !registered; n++) {
        struct ibv_mr *mr = kSentinel;
        uint64_t before = ote_alloc_injected_failures();
        ote_alloc_fail_nth(n);
        int rc = o_->reg_dmabuf_mr(v_, pd_, 0, kPage, kIovaBase, dev.fd(), kAccessRw, &mr);
        ote_alloc_fail_disarm();
        if (rc == 0) {
            registered = true;
            EXPECT_EQ(o_->dereg_mr(v_, mr), 0);
            break;
        }
        EXPECT_EQ(rc, ENOMEM) << "allocation " << n;
        EXPECT_EQ(ote_alloc_injected_failures(), before + 1) << "allocation " << n;
        EXPECT_EQ(mr, kSentinel) << "allocation " << n;
        EXPECT_EQ(MemfdMappings(), 1)
            << "allocation " << n << ": the failed registration left its mapping";
        failed++;
    }
    EXPECT_TRUE(registered) << "never registered within 16 allocations";
    EXPECT_GE(failed, 1u) << "no allocation of the registration was failed";
    EXPECT_EQ(MemfdMappings(), 1);
}

INSTANTIATE_TEST_SUITE_P(Providers, Dmabuf, ote_test::AllProviders(), ote_test::ProviderName);

// The fault decorator fails reg_dmabuf_mr like any op: nothing reaches the provider, the
// output is untouched, and the next call registers.
class DmabufFault : public ote_test::VerbsFixture {};

TEST_F(DmabufFault, DecoratorFailsRegDmabufMr) {
    ASSERT_NO_FATAL_FAILURE(OpenVerbs("sim", nullptr, /*fault=*/true));
    Memfd dev(2 * kPage);
    ASSERT_TRUE(dev.ok());
    ASSERT_EQ(ote_verbs_fault_fail(v_, OTE_VERBS_FAULT_OP_REG_DMABUF_MR, OTE_FAULT_NTH, 1, ENOMEM),
              OTE_OK);
    struct ibv_mr *const kSentinel = reinterpret_cast<struct ibv_mr *>(0x1);
    struct ibv_mr *mr = kSentinel;
    EXPECT_EQ(o_->reg_dmabuf_mr(v_, pd_, 0, kPage, kIovaBase, dev.fd(), kAccessRw, &mr), ENOMEM);
    EXPECT_EQ(mr, kSentinel);
    EXPECT_EQ(MemfdMappings(), 1) << "the failed call reached the provider";
    EXPECT_EQ(ote_verbs_fault_injected(v_, OTE_VERBS_FAULT_OP_REG_DMABUF_MR), 1u);
    ASSERT_EQ(o_->reg_dmabuf_mr(v_, pd_, 0, kPage, kIovaBase, dev.fd(), kAccessRw, &mr), 0);
    EXPECT_EQ(ote_verbs_fault_calls(v_, OTE_VERBS_FAULT_OP_REG_DMABUF_MR), 2u);
    EXPECT_EQ(o_->dereg_mr(v_, mr), 0);
}

} // namespace

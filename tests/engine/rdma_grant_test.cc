// Grants sized to requests, over verbs/sim (its two default devices, unlimited): the pump
// takes the contiguous slices of one request queued for one device as one grant, so the
// control plane costs at most one GRANT_REQ round trip per request per device used (up to
// rdma_grant_max), not one per 1 MiB engine slice. Counted through ote_engine_nic_stats
// (grants per device); every byte checked at both ends. A request over the grant size
// takes several grants, none over it; a grant of several slices that the source refuses
// (a request partly outside its registration) moves no byte.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "tests/engine/e2e_fixture.h"

extern "C" {
#include "base/time.h"
#include "ote/ote.h"
#include "tests/engine/pattern.h"
}

namespace {

using ote_test::kSec;

constexpr uint64_t kRw = 128ull << 20;

ote_test::TargetSession Session(const char *grant_max) {
    ote_test::TargetSession s;
    s.rw_size = kRw;
    s.target_env = ote_test::kRdmaTargetEnv;
    s.config = {{"transport", "rdma"},
                {"verbs_provider", "sim"},
                {"transfer_timeout_ms", "60000"},
                {"rdma_grant_max", grant_max}};
    s.wait_ns = 120 * kSec;
    return s;
}

std::vector<ote_nic_stats_t> Nics(ote_engine_t *e) {
    std::vector<ote_nic_stats_t> v(8);
    size_t n = 0;
    EXPECT_EQ(ote_engine_nic_stats(e, v.data(), v.size(), &n), OTE_OK);
    v.resize(n < v.size() ? n : v.size());
    return v;
}

uint64_t Grants(ote_engine_t *e) {
    uint64_t g = 0;
    for (const auto &n : Nics(e)) g += n.grants;
    return g;
}

// n requests of len bytes each (op), local[i * len] <-> remote + i * len, in one batch.
void Batch(ote_engine_t *e, ote_segment_t *seg, ote_opcode_t op, uint8_t *local, uint64_t remote,
           uint64_t len, uint32_t n) {
    ote_batch_t *b = nullptr;
    ASSERT_EQ(ote_batch_create(e, n, &b), OTE_OK);
    std::vector<ote_request_t> r(n);
    for (uint32_t i = 0; i < n; i++) r[i] = {op, local + i * len, seg, remote + i * len, len};
    ASSERT_EQ(ote_batch_submit(b, r.data(), n), OTE_OK);
    EXPECT_EQ(ote_batch_wait(b, ote_deadline_after(120 * kSec)), OTE_OK);
    for (uint32_t i = 0; i < n; i++) {
        ote_transfer_status_t ts;
        ASSERT_EQ(ote_batch_status(b, i, &ts), OTE_OK);
        EXPECT_EQ(ts.state, OTE_TRANSFER_COMPLETED) << "request " << i;
        EXPECT_EQ(ts.bytes_done, len) << "request " << i;
    }
    EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
}

class RdmaGrantTest : public ote_test::TargetE2eTest {
  protected:
    RdmaGrantTest() : TargetE2eTest(Session("16M")) {}
};

TEST_F(RdmaGrantTest, OneGrantPerRequestPerDevice) {
    constexpr uint64_t kReq = 8ull << 20;
    // 16 requests of 8 slices; 4 under ThreadSanitizer (the case took 36 s there): a grant
    // per slice (kN * 8) would still be four times the bound over the sim's two devices.
    constexpr uint32_t kN = ote_test::TsanScaled(16, 4);
    std::vector<uint8_t> src(kN * kReq), dst(kN * kReq, 0);
    ote_pattern_fill(src.data(), src.size(), 131, 0);
    ASSERT_EQ(ote_memory_register(engine_, src.data(), src.size(), OTE_PERM_READ), OTE_OK);
    ASSERT_EQ(ote_memory_register(engine_, dst.data(), dst.size(), OTE_PERM_WRITE), OTE_OK);
    auto before = Nics(engine_);
    size_t ndev = before.size();
    ASSERT_GE(ndev, 1u);
    uint64_t g0 = Grants(engine_);

    Batch(engine_, seg_, OTE_WRITE, src.data(), target_.rw, kReq, kN);
    EXPECT_EQ(target_.Hash("rw", 0, kN * kReq), ote_hash(src.data(), kN * kReq));
    uint64_t gw = Grants(engine_) - g0;
    Batch(engine_, seg_, OTE_READ, dst.data(), target_.rw, kReq, kN);
    EXPECT_EQ(memcmp(dst.data(), src.data(), dst.size()), 0);
    uint64_t gr = Grants(engine_) - g0 - gw;

    // One grant per engine slice would be kN * 8 each way.
    printf("%u x 8 MiB over %zu device(s): %llu WRITE grants, %llu READ grants (per slice: %u)\n",
           kN, ndev, (unsigned long long)gw, (unsigned long long)gr, kN * 8);
    EXPECT_GE(gw, kN);
    EXPECT_LE(gw, kN * ndev);
    EXPECT_GE(gr, kN);
    EXPECT_LE(gr, kN * ndev);
    auto after = Nics(engine_);
    uint64_t bytes = 0;
    for (size_t i = 0; i < ndev; i++) bytes += after[i].bytes_out - before[i].bytes_out;
    EXPECT_EQ(bytes, 2 * kN * kReq);
    EXPECT_EQ(ote_memory_unregister(engine_, src.data()), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(engine_, dst.data()), OTE_OK);
}

// A request partly outside the target's registration: the source checks the whole extent
// before its first grant, so the multi-slice grant is refused and no byte lands.
TEST_F(RdmaGrantTest, RequestPartlyOutsideRegistrationMovesNoByte) {
    constexpr uint64_t kReq = 8ull << 20;
    std::vector<uint8_t> src(kReq);
    ote_pattern_fill(src.data(), kReq, 7, 0);
    ASSERT_EQ(ote_memory_register(engine_, src.data(), kReq, OTE_PERM_READ), OTE_OK);
    uint64_t off = kRw - kReq / 2; // half inside, half past the end
    uint64_t h0 = target_.Hash("rw", off, kReq / 2);
    ote_transfer_status_t ts;
    ote_status_t st = Transfer(OTE_WRITE, src.data(), target_.rw + off, kReq, &ts);
    EXPECT_NE(st, OTE_OK);
    EXPECT_NE(ts.state, OTE_TRANSFER_COMPLETED);
    EXPECT_EQ(target_.Hash("rw", off, kReq / 2), h0) << "bytes landed inside the registration";
    EXPECT_EQ(ote_memory_unregister(engine_, src.data()), OTE_OK);
}

// With a 2 MiB grant size a request of 8 MiB takes several grants, each at most 2 MiB:
// never one grant over rdma_grant_max, and the bytes still land intact.
class RdmaSmallGrantTest : public ote_test::TargetE2eTest {
  protected:
    RdmaSmallGrantTest() : TargetE2eTest(Session("2M")) {}
};

TEST_F(RdmaSmallGrantTest, RequestsOverTheGrantSizeTakeSeveralGrants) {
    constexpr uint64_t kReq = 8ull << 20;
    constexpr uint32_t kN = 4;
    std::vector<uint8_t> src(kN * kReq), dst(kN * kReq, 0);
    ote_pattern_fill(src.data(), src.size(), 99, 0);
    ASSERT_EQ(ote_memory_register(engine_, src.data(), src.size(), OTE_PERM_READ), OTE_OK);
    ASSERT_EQ(ote_memory_register(engine_, dst.data(), dst.size(), OTE_PERM_WRITE), OTE_OK);
    uint64_t g0 = Grants(engine_);
    Batch(engine_, seg_, OTE_WRITE, src.data(), target_.rw, kReq, kN);
    Batch(engine_, seg_, OTE_READ, dst.data(), target_.rw, kReq, kN);
    EXPECT_EQ(target_.Hash("rw", 0, kN * kReq), ote_hash(src.data(), kN * kReq));
    EXPECT_EQ(memcmp(dst.data(), src.data(), dst.size()), 0);
    uint64_t g = Grants(engine_) - g0;
    EXPECT_GE(g, 2 * kN * (kReq / (2u << 20))) << "a grant over rdma_grant_max";
    EXPECT_LE(g, 2 * kN * (kReq / (1u << 20)));
    EXPECT_EQ(ote_memory_unregister(engine_, src.data()), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(engine_, dst.data()), OTE_OK);
}

} // namespace

// tests/engine/gpu_fixture.cc - see gpu_fixture.h.
#include "tests/engine/gpu_fixture.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>

#include "tests/util/wait.h"

extern "C" {
#include "tests/engine/pattern.h"
}

namespace ote_gpu_test {

std::string Hex(uint64_t h) {
    char b[32];
    snprintf(b, sizeof(b), "SUM %016llx", static_cast<unsigned long long>(h));
    return b;
}

uint64_t PatternHash(uint64_t seed, uint64_t off, uint64_t len) {
    return ote_pattern_hash(seed, off, len);
}

std::string Num(uint64_t v) { return std::to_string(v); }

ote_engine_t *RdmaGpuEngine(const char *gpu_paths, const ote_test::ConfigKv &kv,
                            const char *timeout_ms) {
    ote_config_t *cfg = ote_test::RdmaConfig(timeout_ms, nullptr);
    if (gpu_paths != nullptr) {
        EXPECT_EQ(ote_config_set(cfg, "gpu_paths", gpu_paths), OTE_OK);
    }
    for (const auto &k : kv) {
        EXPECT_EQ(ote_config_set(cfg, k.first, k.second), OTE_OK) << k.first;
    }
    ote_engine_t *e = nullptr;
    EXPECT_EQ(ote_engine_create(cfg, &e), OTE_OK);
    ote_config_destroy(cfg);
    return e;
}

bool StartGpuTarget(ote_test::Target &t, uint64_t len, const std::vector<std::string> &env) {
    t.binary = "ote_gpu_target";
    return t.Start(len, "127.0.0.1:0", env);
}

CopyGate TargetGate(ote_test::Target &t) {
    CopyGate g;
    g.hold = [&t](unsigned pass) { EXPECT_EQ(t.Command("hold " + std::to_string(pass)), "OK"); };
    g.held = [&t]() -> uint64_t {
        std::istringstream in(t.Command("held"));
        std::string word;
        uint64_t now = 0, total = 0;
        in >> word >> now >> total;
        EXPECT_EQ(word, "HELD");
        return now;
    };
    g.release = [&t] { EXPECT_EQ(t.Command("release"), "OK"); };
    return g;
}

CopyGate GpuTest::LocalGate() {
    CopyGate g;
    g.hold = [this](unsigned pass) { fake_.hold_copies(pass); };
    g.held = [this] { return Counters().copies_held; };
    g.release = [this] { fake_.release_copies(); };
    return g;
}

ote_transfer_status_t GpuTest::CancelWhileCopyHeld(ote_engine_t *e, const ote_request_t &r,
                                                   const CopyGate &gate, unsigned pass) {
    ote_transfer_status_t ts{};
    ts.state = OTE_TRANSFER_FAILED;
    ote_batch_t *b = nullptr;
    EXPECT_EQ(ote_batch_create(e, 1, &b), OTE_OK);
    if (b == nullptr) return ts;
    gate.hold(pass);
    EXPECT_EQ(ote_batch_submit(b, &r, 1), OTE_OK);
    const bool held = ote_test::WaitUntil([&] { return gate.held() > 0; }, std::chrono::seconds(60),
                                          "a copy held at the gate");
    EXPECT_EQ(ote_batch_cancel(b), OTE_OK);
    gate.release();
    ote_status_t st = ote_batch_wait(b, 120 * ote_test::kSec);
    EXPECT_NE(st, OTE_ERR_TIMEOUT) << "the canceled request did not end";
    EXPECT_EQ(ote_batch_status(b, 0, &ts), OTE_OK);
    EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    if (!held) ts.state = OTE_TRANSFER_FAILED;
    EXPECT_EQ(ts.state, OTE_TRANSFER_CANCELED) << ote_status_str(ts.error);
    EXPECT_EQ(ts.error, OTE_ERR_CANCELED);
    EXPECT_LT(ts.bytes_done, r.length);
    return ts;
}

void GpuTest::SetUp() {
    CudaTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (!fake_.present()) GTEST_SKIP() << "these cases drive the fake libcuda";
}

void GpuTest::TearDown() {
    for (ote_cuda_alloc_t *a : allocs_)
        EXPECT_EQ(ote_cuda_alloc_destroy(a, ote_cuda_test::LongDeadline()), OTE_OK);
    allocs_.clear();
    CudaTest::TearDown();
}

uint64_t GpuTest::DevAlloc(size_t n, unsigned flags) {
    ote_cuda_alloc_t *a = nullptr;
    EXPECT_EQ(ote_cuda_alloc_create(dev_, n, flags, &a), OTE_OK);
    if (a == nullptr) return 0;
    allocs_.push_back(a);
    return ote_cuda_alloc_ptr(a);
}

std::vector<uint8_t> &GpuTest::Scratch() {
    if (scratch_.empty()) scratch_.resize(4 << 20);
    return scratch_;
}

// Piece by piece through the scratch buffer: a synchronous copy from pageable memory
// has taken its source bytes when it returns, so the buffer is refilled at once.
void GpuTest::DevFill(uint64_t addr, size_t len, uint64_t seed, uint64_t base) {
    std::vector<uint8_t> &v = Scratch();
    for (size_t done = 0; done < len;) {
        size_t n = std::min(len - done, v.size());
        ote_pattern_fill(v.data(), n, seed, base + done);
        ASSERT_EQ(t_->cuMemcpyHtoD(addr + done, v.data(), n), 0);
        done += n;
    }
    ASSERT_EQ(t_->cuStreamSynchronize(nullptr), 0);
}

std::vector<uint8_t> GpuTest::DevRead(uint64_t addr, size_t len) {
    std::vector<uint8_t> v(len ? len : 1);
    EXPECT_EQ(t_->cuStreamSynchronize(nullptr), 0);
    if (len > 0) {
        EXPECT_EQ(t_->cuMemcpyDtoH(v.data(), addr, len), 0);
    }
    v.resize(len);
    return v;
}

uint64_t GpuTest::DevHash(uint64_t addr, size_t len) {
    std::vector<uint8_t> &v = Scratch(); // 4 MiB: every piece but the last a multiple of 8
    uint64_t h = ote_hash_begin(len);
    EXPECT_EQ(t_->cuStreamSynchronize(nullptr), 0);
    for (size_t done = 0; done < len;) {
        size_t n = std::min(len - done, v.size());
        EXPECT_EQ(t_->cuMemcpyDtoH(v.data(), addr + done, n), 0);
        h = ote_hash_more(h, v.data(), n);
        done += n;
    }
    return h;
}

void GpuTest::OpenSegment(ote_engine_t *e, const std::string &addr, ote_segment_t **seg) {
    *seg = nullptr;
    ASSERT_NE(e, nullptr);
    ASSERT_EQ(ote_segment_open(e, addr.c_str(), seg), OTE_OK) << "segment to " << addr;
}

void GpuTest::OpenSegment(ote_engine_t *e, ote_engine_t *peer, ote_segment_t **seg) {
    *seg = nullptr;
    ASSERT_NE(peer, nullptr);
    OpenSegment(e, ote_test::EngineAddress(peer), seg);
}

} // namespace ote_gpu_test

// tests/engine/gpu_direct_test.cc - GPUDirect RDMA (gpu_paths "direct") over verbs/sim
// with the fake libcuda, whose device memory is not host-addressable and whose dma-bufs
// are memfds the sim maps: a requester's registered device buffer moves to and from a
// peer's host memory with its dma-buf MR (no staging), READ and WRITE, 1 byte to 64 MiB
// at unaligned device offsets, every byte checked through the driver and the device
// bytes around the range untouched; without "direct" in gpu_paths the path is never
// used (staged instead, or refused at submit when nothing else is allowed); a failed
// dma-buf export (driver fault) leaves the registration to staging, logged, and the next
// registration gets its dma-buf again. GPUDirect source grants: a peer's device memory
// (registered with its dma-buf) is served by exact-range MRs in private PDs, host and
// device memory to and from it, 1 byte to 64 MiB, a request past its registration
// refused, unregister BUSY while a grant lives, faults on the private PD, QP and MR
// failing one request cleanly, a failed dereg retained and the engine's destroy retried;
// a source without the dma-buf still refuses it.
#include <gtest/gtest.h>

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <memory>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tests/engine/engine_util.h"
#include "tests/engine/gpu_fixture.h"
#include "tests/engine/native_counter.h"
#include "tests/engine/pattern.h"
#include "tests/util/test_base.h"
#include "tests/util/wait.h"

extern "C" {
#include "base/fault.h"
#include "cuda/memory/memory.h"
#include "engine/rdma/test_hook.h"
#include "ote/ote.h"
#include "verbs/fault.h"
}

namespace {

using ote_gpu_test::PatternHash;
using ote_gpu_test::RdmaGpuEngine;
using ote_test::kSec;
using ote_test::NativeCounter;
using ote_test::WaitUntil;

std::vector<ote_verbs_t *> *g_wrapped = nullptr;
std::vector<std::unique_ptr<NativeCounter>> *g_owned = nullptr;
ote_status_t WrapWithFault(ote_verbs_t **v) { return ote_test::WrapCounted(v, g_owned, g_wrapped); }

// 16 MiB under TSan (ote_test::TsanScaled): the same runs and MRs, a quarter of the bytes.
constexpr size_t kBig = ote_test::TsanScaled(64ull << 20, 4);
constexpr size_t kDevLen = kBig + (64 << 10);
constexpr int kCudaErrorUnknown = 999;

class GpuDirectTest : public ote_gpu_test::GpuTest {
  protected:
    ote_status_t Run(ote_engine_t *e, ote_segment_t *seg, ote_opcode_t op, uint64_t local,
                     uint64_t remote, size_t len) {
        ote_request_t r = {op, reinterpret_cast<void *>(local), seg, remote, len};
        ote_transfer_status_t ts{};
        ote_status_t st = ote_test::RunOne(e, r, 120 * kSec, &ts);
        if (st == OTE_OK) {
            EXPECT_EQ(ts.state, OTE_TRANSFER_COMPLETED);
            EXPECT_EQ(ts.bytes_done, len);
        }
        return st;
    }

    // Open fds of this process that are memfds.
    static int MemfdCount() {
        int n = 0;
        DIR *dir = opendir("/proc/self/fd");
        if (dir == nullptr) return -1;
        while (struct dirent *de = readdir(dir)) {
            char link[512];
            std::string path = std::string("/proc/self/fd/") + de->d_name;
            ssize_t k = readlink(path.c_str(), link, sizeof(link) - 1);
            if (k <= 0) continue;
            link[k] = '\0';
            n += strncmp(link, "/memfd:", 7) == 0;
        }
        closedir(dir);
        return n;
    }

    static ote_gpu_stats_t Stats(ote_engine_t *e) {
        ote_gpu_stats_t s{};
        EXPECT_EQ(ote_engine_gpu_stats(e, &s), OTE_OK);
        return s;
    }
};

// Local device memory (registered, dma-buf MRs) against a peer's host memory, both ways,
// with gpu_paths="direct" alone: staging is not even allowed, so every request that
// completes moved directly, and the counters say so.
TEST_F(GpuDirectTest, LocalDeviceMemoryMovesDirectBothWays) {
    ote_engine_t *src = ote_test::RdmaEngine();
    ASSERT_NE(src, nullptr);
    ote_engine_t *req = RdmaGpuEngine("direct");
    ASSERT_NE(req, nullptr);
    std::vector<uint8_t> host(kDevLen);
    ote_pattern_fill(host.data(), host.size(), 11, 0);
    ASSERT_EQ(ote_memory_register(src, host.data(), host.size(), OTE_PERM_READ | OTE_PERM_WRITE),
              OTE_OK);
    uint64_t d = DevAlloc(kDevLen);
    ASSERT_NE(d, 0u);
    // The registration sets SYNC_MEMOPS and exports one dma-buf, whose fd the engine
    // closes once the MRs exist (the fake's dma-bufs are dups of its memfds); the RDMA
    // transport keeps one duplicate of its own for source grants (exact MRs) and the
    // buffer manager one (a reopened device registers the range anew from it), both
    // closed at unregister.
    const uint64_t sync0 = fake_.calls("cuPointerSetAttribute");
    const uint64_t exp0 = fake_.calls("cuMemGetHandleForAddressRange");
    const int memfds0 = MemfdCount();
    ASSERT_EQ(ote_memory_register(req, reinterpret_cast<void *>(d), kDevLen,
                                  OTE_PERM_READ | OTE_PERM_WRITE),
              OTE_OK);
    EXPECT_EQ(fake_.calls("cuPointerSetAttribute"), sync0 + 1);
    EXPECT_EQ(fake_.calls("cuMemGetHandleForAddressRange"), exp0 + 1);
    EXPECT_EQ(MemfdCount(), memfds0 + 2);
    ote_segment_t *seg = nullptr;
    ASSERT_NO_FATAL_FAILURE(OpenSegment(req, src, &seg));
    const uintptr_t h = reinterpret_cast<uintptr_t>(host.data());

    struct Case {
        size_t len, dev_off, host_off;
    };
    const Case cases[] = {{1, 0, 0},       {1, 4097, 3},          {777, 3, 1},
                          {65537, 101, 7}, {(1 << 20) + 5, 9, 0}, {kBig, 4096 + 13, 5}};
    uint64_t seed = 20;
    uint64_t n_req = 0;
    for (const Case &c : cases) {
        SCOPED_TRACE("len " + std::to_string(c.len) + " at device offset " +
                     std::to_string(c.dev_off));
        // READ: peer host -> local device; the device bytes around the range keep theirs.
        // (Checked by hashes of the pattern: no copy of the buffers per case.)
        const uint64_t dseed = ++seed;
        DevFill(d, kDevLen, dseed);
        ASSERT_EQ(Run(req, seg, OTE_READ, d + c.dev_off, h + c.host_off, c.len), OTE_OK);
        n_req++;
        const size_t dend = c.dev_off + c.len, hend = c.host_off + c.len;
        EXPECT_EQ(DevHash(d + c.dev_off, c.len), ote_hash(host.data() + c.host_off, c.len));
        EXPECT_EQ(DevHash(d, c.dev_off), PatternHash(dseed, 0, c.dev_off));
        EXPECT_EQ(DevHash(d + dend, kDevLen - dend), PatternHash(dseed, dend, kDevLen - dend));
        // WRITE: local device -> peer host; the host bytes around the range keep theirs.
        const uint64_t wseed = ++seed;
        DevFill(d, kDevLen, wseed);
        const uint64_t head = ote_hash(host.data(), c.host_off),
                       rest = ote_hash(host.data() + hend, host.size() - hend);
        ASSERT_EQ(Run(req, seg, OTE_WRITE, d + c.dev_off, h + c.host_off, c.len), OTE_OK);
        n_req++;
        EXPECT_EQ(ote_hash(host.data() + c.host_off, c.len), PatternHash(wseed, c.dev_off, c.len));
        EXPECT_EQ(ote_hash(host.data(), c.host_off), head);
        EXPECT_EQ(ote_hash(host.data() + hend, host.size() - hend), rest);
    }
    ote_gpu_stats_t s = Stats(req);
    EXPECT_EQ(s.direct_requests, n_req);
    EXPECT_EQ(s.staged_requests, 0u);
    // A local device buffer that is not registered has no dma-buf MR: with direct alone
    // in gpu_paths it is refused at submit, naming what is missing.
    uint64_t loose = DevAlloc(1 << 16);
    ote_request_t r = {OTE_READ, reinterpret_cast<void *>(loose), seg, h, 100};
    EXPECT_EQ(ote_test::RunOne(req, r, 30 * kSec), OTE_ERR_UNSUPPORTED);
    EXPECT_TRUE(LogContains("direct needs a registration with a dma-buf MR"));
    EXPECT_EQ(Stats(req).direct_requests, n_req);

    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    const int memfds1 = MemfdCount(); // (the loose allocation is a memfd of the fake too)
    EXPECT_EQ(ote_memory_unregister(req, reinterpret_cast<void *>(d)), OTE_OK);
    EXPECT_EQ(MemfdCount(), memfds1 - 2); // the transport's and the buffer's duplicates
    EXPECT_EQ(ote_memory_unregister(src, host.data()), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
}

// Without "direct" in gpu_paths the path is never used: the same registered device buffer
// is staged through pinned chunks, bytes checked both ways.
TEST_F(GpuDirectTest, WithoutDirectInGpuPathsStages) {
    ote_engine_t *src = ote_test::RdmaEngine();
    ASSERT_NE(src, nullptr);
    ote_engine_t *req = RdmaGpuEngine("staging");
    ASSERT_NE(req, nullptr);
    const size_t n = (1 << 20) + 33;
    std::vector<uint8_t> host(n + 64);
    ote_pattern_fill(host.data(), host.size(), 31, 0);
    ASSERT_EQ(ote_memory_register(src, host.data(), host.size(), OTE_PERM_READ | OTE_PERM_WRITE),
              OTE_OK);
    uint64_t d = DevAlloc(n + 4096);
    ASSERT_EQ(ote_memory_register(req, reinterpret_cast<void *>(d), n + 4096, OTE_PERM_READ),
              OTE_OK);
    ote_segment_t *seg = nullptr;
    ASSERT_NO_FATAL_FAILURE(OpenSegment(req, src, &seg));
    const uintptr_t h = reinterpret_cast<uintptr_t>(host.data());
    ASSERT_EQ(Run(req, seg, OTE_READ, d + 5, h + 3, n), OTE_OK);
    std::vector<uint8_t> got = DevRead(d + 5, n);
    EXPECT_TRUE(std::equal(got.begin(), got.end(), host.begin() + 3));
    DevFill(d, n + 4096, 32);
    std::vector<uint8_t> dev = DevRead(d + 7, n);
    ASSERT_EQ(Run(req, seg, OTE_WRITE, d + 7, h + 1, n), OTE_OK);
    EXPECT_TRUE(std::equal(dev.begin(), dev.end(), host.begin() + 1));
    ote_gpu_stats_t s = Stats(req);
    EXPECT_EQ(s.direct_requests, 0u);
    EXPECT_EQ(s.staged_requests, 2u);
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(req, reinterpret_cast<void *>(d)), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(src, host.data()), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
}

// The driver cannot export a dma-buf (cuMemGetHandleForAddressRange fails): the
// registration still succeeds, is logged once, and its requests are staged; with the
// fault gone, the next registration gets its dma-buf MRs and moves directly.
TEST_F(GpuDirectTest, DmabufExportFailureFallsBackToStaging) {
    ote_engine_t *src = ote_test::RdmaEngine();
    ASSERT_NE(src, nullptr);
    ote_engine_t *req = RdmaGpuEngine("direct,staging");
    ASSERT_NE(req, nullptr);
    const size_t n = 300000;
    std::vector<uint8_t> host(n + 64);
    ote_pattern_fill(host.data(), host.size(), 41, 0);
    ASSERT_EQ(ote_memory_register(src, host.data(), host.size(), OTE_PERM_READ | OTE_PERM_WRITE),
              OTE_OK);
    ote_segment_t *seg = nullptr;
    ASSERT_NO_FATAL_FAILURE(OpenSegment(req, src, &seg));
    const uintptr_t h = reinterpret_cast<uintptr_t>(host.data());

    uint64_t d1 = DevAlloc(n + 4096);
    fake_.fail("cuMemGetHandleForAddressRange", 1, 1, kCudaErrorUnknown);
    ASSERT_EQ(ote_memory_register(req, reinterpret_cast<void *>(d1), n + 4096, OTE_PERM_READ),
              OTE_OK);
    fake_.clear_faults();
    EXPECT_TRUE(LogContains("no dma-buf for device memory"));
    ASSERT_EQ(Run(req, seg, OTE_READ, d1 + 1, h + 2, n), OTE_OK);
    std::vector<uint8_t> got = DevRead(d1 + 1, n);
    EXPECT_TRUE(std::equal(got.begin(), got.end(), host.begin() + 2));
    ote_gpu_stats_t s = Stats(req);
    EXPECT_EQ(s.direct_requests, 0u);
    EXPECT_EQ(s.staged_requests, 1u);

    uint64_t d2 = DevAlloc(n + 4096);
    ASSERT_EQ(ote_memory_register(req, reinterpret_cast<void *>(d2), n + 4096, OTE_PERM_READ),
              OTE_OK);
    DevFill(d2, n + 4096, 42);
    std::vector<uint8_t> dev = DevRead(d2 + 3, n);
    ASSERT_EQ(Run(req, seg, OTE_WRITE, d2 + 3, h + 5, n), OTE_OK);
    EXPECT_TRUE(std::equal(dev.begin(), dev.end(), host.begin() + 5));
    s = Stats(req);
    EXPECT_EQ(s.direct_requests, 1u);
    EXPECT_EQ(s.staged_requests, 1u);

    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(req, reinterpret_cast<void *>(d1)), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(req, reinterpret_cast<void *>(d2)), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(src, host.data()), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
}

// A source without a dma-buf for its device memory (gpu_paths without "direct") serves no
// GPUDirect grant on it. With staging in its gpu_paths the requests are served through its
// bounce buffers (engine/rdma/rdma_stage.c), bytes checked through the driver and the
// source's bytes around the range untouched; with neither path they are refused, also to a
// requester whose own device buffer could move directly: no byte moved on either side, the
// source's log says what is missing (a rate-limited WARN).
TEST_F(GpuDirectTest, RemoteDeviceMemoryWithoutDmabufIsStagedOrRefused) {
    for (const char *src_paths : {"staging", ""}) {
        SCOPED_TRACE(std::string("source gpu_paths=\"") + src_paths + "\"");
        const bool staged = src_paths[0] != '\0';
        ote_engine_t *src = RdmaGpuEngine(src_paths);
        ASSERT_NE(src, nullptr);
        ote_engine_t *req = RdmaGpuEngine("direct");
        ASSERT_NE(req, nullptr);
        const size_t n = 70000;
        uint64_t rd = DevAlloc(n);
        DevFill(rd, n, 51);
        ASSERT_EQ(ote_memory_register(src, reinterpret_cast<void *>(rd), n,
                                      OTE_PERM_READ | OTE_PERM_WRITE),
                  OTE_OK);
        uint64_t ld = DevAlloc(n);
        DevFill(ld, n, 52);
        ASSERT_EQ(ote_memory_register(req, reinterpret_cast<void *>(ld), n,
                                      OTE_PERM_READ | OTE_PERM_WRITE),
                  OTE_OK);
        std::vector<uint8_t> rbefore = DevRead(rd, n), lbefore = DevRead(ld, n);
        ote_segment_t *seg = nullptr;
        ASSERT_NO_FATAL_FAILURE(OpenSegment(req, src, &seg));
        ote_gpu_stats_t g0{};
        ASSERT_EQ(ote_engine_gpu_stats(src, &g0), OTE_OK);
        // READ [rd+2, +n-10) into [ld+1, ...), then WRITE it back one byte further on.
        const size_t len = n - 10;
        ote_request_t rr = {OTE_READ, reinterpret_cast<void *>(ld + 1), seg, rd + 2, len};
        ote_request_t rw = {OTE_WRITE, reinterpret_cast<void *>(ld + 1), seg, rd + 3, len};
        for (const ote_request_t &r : {rr, rw}) {
            ote_transfer_status_t ts{};
            (void)ote_test::RunOne(req, r, 60 * kSec, &ts);
            if (staged) {
                EXPECT_EQ(ts.state, OTE_TRANSFER_COMPLETED);
                EXPECT_EQ(ts.bytes_done, len);
            } else {
                EXPECT_EQ(ts.state, OTE_TRANSFER_FAILED);
                EXPECT_EQ(ts.bytes_done, 0u);
            }
        }
        std::vector<uint8_t> rafter = DevRead(rd, n), lafter = DevRead(ld, n);
        if (staged) {
            // READ: the local range holds the remote bytes; its neighbours theirs.
            EXPECT_TRUE(
                std::equal(lafter.begin() + 1, lafter.begin() + 1 + len, rbefore.begin() + 2));
            EXPECT_EQ(lafter[0], lbefore[0]);
            EXPECT_TRUE(
                std::equal(lafter.begin() + 1 + len, lafter.end(), lbefore.begin() + 1 + len));
            // WRITE: those bytes at rd+3; the remote bytes around the range unchanged.
            EXPECT_TRUE(
                std::equal(rafter.begin() + 3, rafter.begin() + 3 + len, rbefore.begin() + 2));
            EXPECT_TRUE(std::equal(rafter.begin(), rafter.begin() + 3, rbefore.begin()));
            EXPECT_TRUE(
                std::equal(rafter.begin() + 3 + len, rafter.end(), rbefore.begin() + 3 + len));
            ote_gpu_stats_t g1{};
            ASSERT_EQ(ote_engine_gpu_stats(src, &g1), OTE_OK);
            EXPECT_GT(g1.staged_source, g0.staged_source) << "served through bounce buffers";
        } else {
            // (The source's WARN naming what is missing is rate-limited per call site, so
            // an earlier case of this process may have used it up: not asserted here.)
            ote_gpu_stats_t g1{};
            ASSERT_EQ(ote_engine_gpu_stats(src, &g1), OTE_OK);
            EXPECT_EQ(g1.staged_source, g0.staged_source) << "nothing staged";
            EXPECT_TRUE(rafter == rbefore);
            EXPECT_TRUE(lafter == lbefore);
        }
        EXPECT_EQ(ote_segment_close(seg), OTE_OK);
        EXPECT_EQ(ote_memory_unregister(req, reinterpret_cast<void *>(ld)), OTE_OK);
        EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
        // The source's last receipt may still be on its way in: BUSY until it lands.
        EXPECT_EQ(ote_test::UnregisterWhenFree(src, reinterpret_cast<void *>(rd)), OTE_OK);
        EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
    }
}

// GPUDirect source grants: the source's device memory, registered with its dma-buf
// (gpu_paths direct), served by an exact-range MR in the private PD of a direct
// endpoint's QP (rdma_direct.c).
class GpuDirectSourceTest : public GpuDirectTest {
  protected:
    // A source engine with gpu_paths "direct"; when wrap, its provider is counted and
    // fault-wrapped (vs_, ns_).
    ote_engine_t *Source(bool wrap) {
        g_wrapped = &wrapped_;
        g_owned = &owned_;
        if (wrap) ote__rdma_test_verbs_hook = WrapWithFault;
        ote_engine_t *e = RdmaGpuEngine("direct");
        ote__rdma_test_verbs_hook = nullptr;
        if (wrap && wrapped_.size() == 1) {
            vs_ = wrapped_[0];
            ns_ = owned_[0].get();
        }
        return e;
    }
    static ote__rdma_test_grants_t Grants(ote_engine_t *e) {
        ote__rdma_test_grants_t g{};
        EXPECT_EQ(ote__rdma_test_grants(ote_test::EngineAddress(e).c_str(), &g), OTE_OK);
        return g;
    }
    // Until the source holds no exact MR, private PD or direct QP (its monitor reclaims
    // a gone requester's endpoints), within a generous bound.
    static bool WaitDirectIdle(ote_engine_t *src) {
        return WaitUntil(
            [&] {
                ote__rdma_test_grants_t g = Grants(src);
                return g.direct_mrs == 0 && g.direct_pds == 0 && g.direct_qps == 0 &&
                       g.live_source == 0;
            },
            std::chrono::seconds(30), "no exact MR, private PD, direct QP or live grant");
    }
    // The requester's segment closed, its device buffer ld unregistered and its engine
    // destroyed; then, once the source holds no direct resource for it, the source's
    // buffer rd unregistered (no grant pins it) and its engine destroyed.
    static void End(ote_engine_t *src, ote_engine_t *req, ote_segment_t *seg, uint64_t rd,
                    uint64_t ld) {
        EXPECT_EQ(ote_segment_close(seg), OTE_OK);
        EXPECT_EQ(ote_memory_unregister(req, reinterpret_cast<void *>(ld)), OTE_OK);
        EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
        EXPECT_TRUE(WaitDirectIdle(src)) << "an exact MR, private PD or direct QP was left";
        EXPECT_EQ(ote_memory_unregister(src, reinterpret_cast<void *>(rd)), OTE_OK);
        EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
    }
    std::vector<ote_verbs_t *> wrapped_;
    std::vector<std::unique_ptr<NativeCounter>> owned_;
    ote_verbs_t *vs_ = nullptr;
    NativeCounter *ns_ = nullptr;
};

// Host and device memory of the requester against the source's device memory, READ and
// WRITE, 1 byte to 64 MiB at unaligned device offsets on both sides, every byte checked
// through the driver and the source's device bytes around the range untouched. The first
// grant of each request is redirected to a direct slot; every grant served is an exact
// MR; a request past the end of the registration is refused with nothing moved; once the
// requester is gone no exact MR, private PD or direct QP is left at the source.
TEST_F(GpuDirectSourceTest, RemoteDeviceMemoryMovesByExactMrsBothWays) {
    ote_engine_t *src = Source(false);
    ASSERT_NE(src, nullptr);
    ote_engine_t *req = RdmaGpuEngine("direct");
    ASSERT_NE(req, nullptr);
    uint64_t rd = DevAlloc(kDevLen);
    ASSERT_NE(rd, 0u);
    const uint64_t sync0 = fake_.calls("cuPointerSetAttribute");
    ASSERT_EQ(ote_memory_register(src, reinterpret_cast<void *>(rd), kDevLen,
                                  OTE_PERM_READ | OTE_PERM_WRITE),
              OTE_OK);
    // The exposed range's allocation has SYNC_MEMOPS set (engine/gpu/gpu_direct.c).
    EXPECT_EQ(fake_.calls("cuPointerSetAttribute"), sync0 + 1);
    uint64_t ld = DevAlloc(kDevLen);
    ASSERT_NE(ld, 0u);
    ASSERT_EQ(ote_memory_register(req, reinterpret_cast<void *>(ld), kDevLen,
                                  OTE_PERM_READ | OTE_PERM_WRITE),
              OTE_OK);
    std::vector<uint8_t> host(kDevLen);
    ote_segment_t *seg = nullptr;
    ASSERT_NO_FATAL_FAILURE(OpenSegment(req, src, &seg));
    const uintptr_t h = reinterpret_cast<uintptr_t>(host.data());

    struct Case {
        size_t len, remote_off, local_off;
    };
    const Case cases[] = {{1, 0, 0}, {1, 4097, 3}, {777, 3, 1}, {65537, 101, 7}, {kBig, 13, 5}};
    uint64_t seed = 70;
    for (int dev_local = 0; dev_local < 2; dev_local++) {
        for (const Case &c : cases) {
            SCOPED_TRACE(std::string(dev_local ? "device" : "host") + " local, len " +
                         std::to_string(c.len) + " at remote offset " +
                         std::to_string(c.remote_off));
            uint64_t local = dev_local ? ld + c.local_off : h + c.local_off;
            // READ: remote device -> local. (Checked by hashes of the patterns: no copy
            // of the buffers per case.)
            const uint64_t rseed = ++seed;
            DevFill(rd, kDevLen, rseed);
            ASSERT_EQ(Run(req, seg, OTE_READ, local, rd + c.remote_off, c.len), OTE_OK);
            EXPECT_EQ(dev_local ? DevHash(ld + c.local_off, c.len)
                                : ote_hash(host.data() + c.local_off, c.len),
                      PatternHash(rseed, c.remote_off, c.len));
            // WRITE: local -> remote device; its bytes around the range keep theirs.
            const uint64_t lseed = ++seed;
            if (dev_local) {
                DevFill(ld, kDevLen, lseed);
            } else {
                ote_pattern_fill(host.data(), host.size(), lseed, 0);
            }
            ASSERT_EQ(Run(req, seg, OTE_WRITE, local, rd + c.remote_off, c.len), OTE_OK);
            const size_t end = c.remote_off + c.len;
            EXPECT_EQ(DevHash(rd + c.remote_off, c.len), PatternHash(lseed, c.local_off, c.len));
            EXPECT_EQ(DevHash(rd, c.remote_off), PatternHash(rseed, 0, c.remote_off));
            EXPECT_EQ(DevHash(rd + end, kDevLen - end), PatternHash(rseed, end, kDevLen - end));
        }
    }
    ote__rdma_test_grants_t gs = Grants(src), gr = Grants(req);
    EXPECT_GE(gs.direct_served, 20u) << "every request served by exact MRs";
    EXPECT_GE(gs.direct_redirects, 1u);
    EXPECT_GE(gr.direct_followed, 1u);
    EXPECT_EQ(gs.mrs_retained, 0u);

    // A READ running one byte past the registration: refused as a whole, no byte moved
    // into the local guard.
    std::fill(host.begin(), host.end(), 0xA5);
    ote_request_t past = {OTE_READ, reinterpret_cast<void *>(h + 8), seg, rd + kDevLen - 100, 101};
    ote_transfer_status_t ts{};
    (void)ote_test::RunOne(req, past, 60 * kSec, &ts);
    EXPECT_EQ(ts.state, OTE_TRANSFER_FAILED);
    EXPECT_EQ(ts.bytes_done, 0u);
    EXPECT_TRUE(std::all_of(host.begin(), host.end(), [](uint8_t b) { return b == 0xA5; }));

    End(src, req, seg, rd, ld);
}

// A request of several runs (grants of 1 MiB, one run in flight at a time) on the
// source's device memory: its first run is redirected to a direct slot, and the requester
// remembers it, so every later run of the request goes to a direct slot first; so does
// every run of a later request into the same remote range: one redirect for the first
// request, none after, READ and WRITE, device and host memory here, bytes checked
// through the driver.
TEST_F(GpuDirectSourceTest, MultiRunRequestIsRedirectedOnce) {
    ote_engine_t *src = Source(false);
    ASSERT_NE(src, nullptr);
    ote_engine_t *req =
        RdmaGpuEngine("direct", {{"rdma_grant_max", "1M"}, {"rdma_max_inflight", "1M"}});
    ASSERT_NE(req, nullptr);
    constexpr size_t kLen = 8u << 20; // 8 runs
    uint64_t rd = DevAlloc(kLen);
    uint64_t ld = DevAlloc(kLen);
    ASSERT_NE(rd, 0u);
    ASSERT_NE(ld, 0u);
    ASSERT_EQ(ote_memory_register(src, reinterpret_cast<void *>(rd), kLen,
                                  OTE_PERM_READ | OTE_PERM_WRITE),
              OTE_OK);
    ASSERT_EQ(ote_memory_register(req, reinterpret_cast<void *>(ld), kLen,
                                  OTE_PERM_READ | OTE_PERM_WRITE),
              OTE_OK);
    std::vector<uint8_t> host(kLen);
    const uint64_t h = reinterpret_cast<uintptr_t>(host.data());
    ote_segment_t *seg = nullptr;
    ASSERT_NO_FATAL_FAILURE(OpenSegment(req, src, &seg));
    uint64_t seed = 300;
    for (int dev_local = 0; dev_local < 2; dev_local++) {
        for (ote_opcode_t op : {OTE_READ, OTE_WRITE}) {
            SCOPED_TRACE(std::string(dev_local ? "device" : "host") + " local, " +
                         (op == OTE_READ ? "READ" : "WRITE"));
            const uint64_t local = dev_local ? ld : h;
            if (op == OTE_READ) {
                DevFill(rd, kLen, ++seed);
            } else if (dev_local) {
                DevFill(ld, kLen, ++seed);
            } else {
                ote_pattern_fill(host.data(), kLen, ++seed, 0);
            }
            ote__rdma_test_grants_t s0 = Grants(src), r0 = Grants(req);
            ASSERT_EQ(Run(req, seg, op, local, rd, kLen), OTE_OK);
            ote__rdma_test_grants_t s1 = Grants(src), r1 = Grants(req);
            const bool first = dev_local == 0 && op == OTE_READ;
            EXPECT_EQ(r1.direct_followed - r0.direct_followed, first ? 1u : 0u)
                << "redirected per run, or again in a range known direct";
            EXPECT_EQ(s1.direct_redirects - s0.direct_redirects, first ? 1u : 0u);
            EXPECT_EQ(r1.direct_recalled - r0.direct_recalled, first ? 7u : 8u)
                << "later runs not direct";
            EXPECT_GE(s1.direct_served - s0.direct_served, 8u);
            std::vector<uint8_t> a = DevRead(rd, kLen);
            std::vector<uint8_t> b = dev_local ? DevRead(ld, kLen) : host;
            EXPECT_TRUE(a == b) << "bytes differ";
        }
    }
    End(src, req, seg, rd, ld);
}

// Unregistering the source's device memory while a grant over it is live is BUSY (the
// request's account pins it); once the request ended it succeeds. The requester's posts
// are slowed (verbs fault delay) so that the grant is seen live.
TEST_F(GpuDirectSourceTest, UnregisterWhileAGrantIsLiveIsBusyThenOk) {
    ote_engine_t *src = Source(false);
    ASSERT_NE(src, nullptr);
    std::vector<ote_verbs_t *> wrapped;
    std::vector<std::unique_ptr<NativeCounter>> owned;
    g_wrapped = &wrapped;
    g_owned = &owned;
    ote__rdma_test_verbs_hook = WrapWithFault;
    ote_engine_t *req = RdmaGpuEngine("direct");
    ote__rdma_test_verbs_hook = nullptr;
    ASSERT_NE(req, nullptr);
    ASSERT_EQ(wrapped.size(), 1u);
    const size_t n = 300001;
    uint64_t rd = DevAlloc(n + 4096);
    DevFill(rd, n + 4096, 81);
    ASSERT_EQ(ote_memory_register(src, reinterpret_cast<void *>(rd), n + 4096, OTE_PERM_READ),
              OTE_OK);
    std::vector<uint8_t> host(n);
    ote_segment_t *seg = nullptr;
    ASSERT_NO_FATAL_FAILURE(OpenSegment(req, src, &seg));
    // Long enough that a loaded machine still sees the grant live; removing the rule below
    // releases the waiting post at once.
    ASSERT_EQ(ote_verbs_fault_delay(wrapped[0], OTE_VERBS_FAULT_OP_POST_SEND, 5000), OTE_OK);
    ote_batch_t *b = nullptr;
    ASSERT_EQ(ote_batch_create(req, 1, &b), OTE_OK);
    ote_request_t r = {OTE_READ, host.data(), seg, rd + 3, n};
    ASSERT_EQ(ote_batch_submit(b, &r, 1), OTE_OK);
    ASSERT_TRUE(WaitUntil([&] { return Grants(src).direct_mrs > 0; }, std::chrono::seconds(30),
                          "a direct grant live"));
    EXPECT_EQ(ote_memory_unregister(src, reinterpret_cast<void *>(rd)), OTE_ERR_BUSY);
    ASSERT_EQ(ote_verbs_fault_delay(wrapped[0], OTE_VERBS_FAULT_OP_POST_SEND, 0), OTE_OK);
    ASSERT_EQ(ote_batch_wait(b, 120 * kSec), OTE_OK);
    std::vector<uint8_t> want = DevRead(rd + 3, n);
    EXPECT_TRUE(want == host);
    // The grant ends at the source when it takes the receipt: then the range is free.
    EXPECT_EQ(ote_test::UnregisterWhenFree(src, reinterpret_cast<void *>(rd)), OTE_OK);
    EXPECT_EQ(Grants(src).direct_mrs, 0u);
    EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    EXPECT_TRUE(WaitDirectIdle(src));
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
}

// A verbs fault on the private PD, the direct QP or the exact MR fails that request
// cleanly (nothing moved) and the next request works; each fault is met by a requester
// engine of its own (a new requester gets new direct endpoints at the source).
TEST_F(GpuDirectSourceTest, PrivatePdQpAndMrFaultsFailOneRequestAndTheNextWorks) {
    ote_engine_t *src = Source(true);
    ASSERT_NE(src, nullptr);
    ASSERT_NE(vs_, nullptr);
    const size_t n = 100003;
    uint64_t rd = DevAlloc(n + 4096);
    DevFill(rd, n + 4096, 91);
    ASSERT_EQ(ote_memory_register(src, reinterpret_cast<void *>(rd), n + 4096,
                                  OTE_PERM_READ | OTE_PERM_WRITE),
              OTE_OK);
    std::vector<uint8_t> want = DevRead(rd + 1, n);
    const ote_verbs_fault_op_t ops[] = {OTE_VERBS_FAULT_OP_ALLOC_PD, OTE_VERBS_FAULT_OP_CREATE_QP,
                                        OTE_VERBS_FAULT_OP_REG_DMABUF_MR};
    for (ote_verbs_fault_op_t op : ops) {
        SCOPED_TRACE("fault op " + std::to_string((int)op));
        ote_engine_t *req = RdmaGpuEngine("direct");
        ASSERT_NE(req, nullptr);
        ote_segment_t *seg = nullptr;
        ASSERT_NO_FATAL_FAILURE(OpenSegment(req, src, &seg));
        std::vector<uint8_t> host(n, 0x5A);
        ote_request_t r = {OTE_READ, host.data(), seg, rd + 1, n};
        {
            ote_test::ErrorLogsExpected guard; // the failed native call is logged
            ASSERT_EQ(ote_verbs_fault_fail(vs_, op, OTE_FAULT_NTH, 1, ENOMEM), OTE_OK);
            ote_transfer_status_t ts{};
            (void)ote_test::RunOne(req, r, 60 * kSec, &ts);
            EXPECT_EQ(ts.state, OTE_TRANSFER_FAILED);
            EXPECT_EQ(ts.bytes_done, 0u);
            EXPECT_EQ(ote_verbs_fault_injected(vs_, op), 1u);
            ote_verbs_fault_clear(vs_);
        }
        EXPECT_TRUE(std::all_of(host.begin(), host.end(), [](uint8_t x) { return x == 0x5A; }));
        ASSERT_EQ(ote_test::RunOne(req, r, 60 * kSec), OTE_OK);
        EXPECT_TRUE(host == want);
        EXPECT_EQ(ote_segment_close(seg), OTE_OK);
        EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
        EXPECT_TRUE(WaitDirectIdle(src));
        ote_verbs_fault_reset_counters(vs_);
    }
    EXPECT_EQ(ote_memory_unregister(src, reinterpret_cast<void *>(rd)), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
    EXPECT_EQ(ns_->mrs.load(), 0);
    EXPECT_EQ(ns_->qps.load(), 0);
}

// The exact MR's dereg fails when its grant ends: it is retained (counted), the request
// still completed; the source engine's destroy is RETAINED while deregs keep failing, and
// once they work a retry finishes with no MR or QP left.
TEST_F(GpuDirectSourceTest, FailedExactMrDeregIsRetainedAndDestroyRetries) {
    ote_engine_t *src = Source(true);
    ASSERT_NE(src, nullptr);
    ASSERT_NE(vs_, nullptr);
    ote_engine_t *req = RdmaGpuEngine("direct");
    ASSERT_NE(req, nullptr);
    const size_t n = 65539;
    uint64_t rd = DevAlloc(n + 4096);
    DevFill(rd, n + 4096, 95);
    ASSERT_EQ(ote_memory_register(src, reinterpret_cast<void *>(rd), n + 4096, OTE_PERM_READ),
              OTE_OK);
    std::vector<uint8_t> host(n);
    ote_segment_t *seg = nullptr;
    ASSERT_NO_FATAL_FAILURE(OpenSegment(req, src, &seg));
    ote_request_t r = {OTE_READ, host.data(), seg, rd + 2, n};
    {
        ote_test::ErrorLogsExpected guard; // retained MRs and QPs are logged
        ASSERT_EQ(ote_verbs_fault_fail(vs_, OTE_VERBS_FAULT_OP_DEREG_MR, OTE_FAULT_EVERY, 0, EBUSY),
                  OTE_OK);
        ASSERT_EQ(ote_test::RunOne(req, r, 60 * kSec), OTE_OK);
        EXPECT_TRUE(host == DevRead(rd + 2, n));
        EXPECT_TRUE(WaitUntil([&] { return Grants(src).mrs_retained >= 1; },
                              std::chrono::seconds(30),
                              "the exact MR whose dereg failed counted retained"));
        EXPECT_EQ(ote_segment_close(seg), OTE_OK);
        EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
        EXPECT_EQ(ote_engine_destroy(src), OTE_ERR_RETAINED);
        ote_verbs_fault_clear(vs_);
    }
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
    EXPECT_EQ(ns_->mrs.load(), 0);
    EXPECT_EQ(ns_->qps.load(), 0);
}

// The provider refuses a dma-buf MR (the second context's): the MRs already made for
// the registration are rolled back, the registration still succeeds (logged) and its
// requests are staged. A dereg of a dma-buf MR that fails retains the registration
// (OTE_ERR_RETAINED, the memory stays registered); the retry deregisters it, and no MR
// is left once the engine is gone.
TEST_F(GpuDirectTest, DmabufMrFaultsRollBackAndRetain) {
    std::vector<ote_verbs_t *> wrapped;
    std::vector<std::unique_ptr<NativeCounter>> owned;
    g_wrapped = &wrapped;
    g_owned = &owned;
    ote_engine_t *src = ote_test::RdmaEngine();
    ASSERT_NE(src, nullptr);
    ote__rdma_test_verbs_hook = WrapWithFault;
    ote_engine_t *req = RdmaGpuEngine("direct,staging");
    ote__rdma_test_verbs_hook = nullptr;
    ASSERT_NE(req, nullptr);
    ASSERT_EQ(wrapped.size(), 1u);
    ote_verbs_t *vr = wrapped[0];
    NativeCounter *nr = owned[0].get();
    const size_t n = 200000;
    std::vector<uint8_t> host(n + 64);
    ote_pattern_fill(host.data(), host.size(), 61, 0);
    ASSERT_EQ(ote_memory_register(src, host.data(), host.size(), OTE_PERM_READ | OTE_PERM_WRITE),
              OTE_OK);
    ote_segment_t *seg = nullptr;
    ASSERT_NO_FATAL_FAILURE(OpenSegment(req, src, &seg));
    const uintptr_t h = reinterpret_cast<uintptr_t>(host.data());
    const int64_t mrs0 = nr->mrs.load();

    uint64_t d1 = DevAlloc(n + 4096);
    ASSERT_EQ(ote_verbs_fault_fail(vr, OTE_VERBS_FAULT_OP_REG_DMABUF_MR, OTE_FAULT_NTH, 2, ENOMEM),
              OTE_OK);
    {
        ote_test::ErrorLogsExpected guard; // the failed MR and its rollback are logged
        ASSERT_EQ(ote_memory_register(req, reinterpret_cast<void *>(d1), n + 4096, OTE_PERM_READ),
                  OTE_OK);
    }
    EXPECT_EQ(ote_verbs_fault_injected(vr, OTE_VERBS_FAULT_OP_REG_DMABUF_MR), 1u);
    ote_verbs_fault_clear(vr);
    EXPECT_TRUE(LogContains("dma-buf MRs of device memory"));
    EXPECT_EQ(nr->mrs.load(), mrs0); // the first context's MR was rolled back
    ASSERT_EQ(Run(req, seg, OTE_READ, d1 + 3, h + 1, n), OTE_OK);
    std::vector<uint8_t> got = DevRead(d1 + 3, n);
    EXPECT_TRUE(std::equal(got.begin(), got.end(), host.begin() + 1));
    ote_gpu_stats_t s = Stats(req);
    EXPECT_EQ(s.direct_requests, 0u);
    EXPECT_EQ(s.staged_requests, 1u);

    uint64_t d2 = DevAlloc(n + 4096);
    ASSERT_EQ(ote_memory_register(req, reinterpret_cast<void *>(d2), n + 4096, OTE_PERM_READ),
              OTE_OK);
    DevFill(d2, n + 4096, 62);
    std::vector<uint8_t> dev = DevRead(d2 + 5, n);
    ASSERT_EQ(Run(req, seg, OTE_WRITE, d2 + 5, h + 7, n), OTE_OK);
    EXPECT_TRUE(std::equal(dev.begin(), dev.end(), host.begin() + 7));
    EXPECT_EQ(Stats(req).direct_requests, 1u);
    ASSERT_EQ(ote_verbs_fault_fail(vr, OTE_VERBS_FAULT_OP_DEREG_MR, OTE_FAULT_NTH, 1, EBUSY),
              OTE_OK);
    EXPECT_EQ(ote_status_code(ote_memory_unregister(req, reinterpret_cast<void *>(d2))),
              OTE_ERR_RETAINED);
    ote_verbs_fault_clear(vr);
    ote_buffer_info_t bi{};
    EXPECT_EQ(ote_memory_query(req, reinterpret_cast<void *>(d2), &bi), OTE_OK); // still there
    EXPECT_EQ(ote_memory_unregister(req, reinterpret_cast<void *>(d2)), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(req, reinterpret_cast<void *>(d1)), OTE_OK);

    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(src, host.data()), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
    EXPECT_EQ(nr->mrs.load(), 0);
}

// A requester on one device and lane with the given gpu_paths and extra keys.
ote_engine_t *OneLaneRequester(const char *paths, const char *max_qps) {
    ote_config_t *cfg = ote_test::RdmaConfig();
    EXPECT_EQ(ote_config_set(cfg, "gpu_paths", paths), OTE_OK);
    EXPECT_EQ(ote_config_set(cfg, "rdma_lanes", "1"), OTE_OK);
    EXPECT_EQ(ote_config_set(cfg, "rdma_devices", "sim0"), OTE_OK);
    if (max_qps != nullptr) {
        EXPECT_EQ(ote_config_set(cfg, "rdma_max_qps", max_qps), OTE_OK);
    }
    ote_engine_t *e = nullptr;
    EXPECT_EQ(ote_engine_create(cfg, &e), OTE_OK);
    ote_config_destroy(cfg);
    return e;
}

// A cache miss on a direct slot (rdma.src_grant_miss on the direct GRANT_REQ of a request
// into a range redirected before) flushes the idle QPs of the direct endpoint it used, not those of the
// plain endpoint: after the retried run rebuilt its direct QP, a plain READ uses the
// plain QP it had, with no build (regression: the flag was set by op, read by endpoint).
TEST_F(GpuDirectSourceTest, CacheMissOnADirectSlotFlushesOnlyTheDirectEndpoint) {
    ote_engine_t *src = Source(false);
    ASSERT_NE(src, nullptr);
    ote_engine_t *req = OneLaneRequester("direct", nullptr);
    ASSERT_NE(req, nullptr);
    const size_t n = 65537;
    uint64_t rd = DevAlloc(n);
    ASSERT_NE(rd, 0u);
    DevFill(rd, n, 31);
    std::vector<uint8_t> want = DevRead(rd, n);
    std::vector<uint8_t> shost(n), local(n);
    ote_pattern_fill(shost.data(), n, 32, 0);
    ASSERT_EQ(ote_memory_register(src, reinterpret_cast<void *>(rd), n, OTE_PERM_READ), OTE_OK);
    ASSERT_EQ(ote_memory_register(src, shost.data(), n, OTE_PERM_READ), OTE_OK);
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_segment_open(req, ote_test::EngineAddress(src).c_str(), &seg), OTE_OK);
    const uint64_t lh = reinterpret_cast<uintptr_t>(local.data());
    const uint64_t sh = reinterpret_cast<uintptr_t>(shost.data());
    // Both endpoints built: the plain READ QP (host memory, and the redirect) and the
    // direct one.
    ASSERT_EQ(Run(req, seg, OTE_READ, lh, rd, n), OTE_OK);
    EXPECT_TRUE(local == want);
    ASSERT_EQ(Run(req, seg, OTE_READ, lh, sh, n), OTE_OK);
    EXPECT_TRUE(local == shost);
    const uint64_t builds = Grants(req).qp_builds;
    EXPECT_GE(Grants(req).direct_followed, 1u);
    {
        // Its range known direct, the request asks on a direct slot first: that GRANT_REQ
        // misses.
        ASSERT_EQ(ote_fault_arm("rdma.src_grant_miss", OTE_FAULT_NTH, 1, OTE_ERR_FAULT, 0), OTE_OK);
        std::fill(local.begin(), local.end(), 0);
        ASSERT_EQ(Run(req, seg, OTE_READ, lh, rd, n), OTE_OK);
        EXPECT_EQ(ote_fault_failures("rdma.src_grant_miss"), 1u);
        ote_fault_disarm_all();
    }
    EXPECT_TRUE(local == want);
    EXPECT_EQ(Grants(req).qp_builds, builds + 1) << "the direct QP rebuilt after its miss";
    std::fill(local.begin(), local.end(), 0);
    ASSERT_EQ(Run(req, seg, OTE_READ, lh, sh, n), OTE_OK);
    EXPECT_TRUE(local == shost);
    EXPECT_EQ(Grants(req).qp_builds, builds + 1) << "the plain READ QP was flushed for a miss "
                                                    "on the direct endpoint";
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    EXPECT_TRUE(WaitDirectIdle(src));
    EXPECT_EQ(ote_memory_unregister(src, shost.data()), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(src, reinterpret_cast<void *>(rd)), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
}

// rdma_max_qps=1 at a requester whose one QP is a direct QP (the plain one it built for
// the redirect was retired for it): a request to another (host) source retires that idle
// direct QP for its plain one and completes (regression: only plain endpoints' QPs were
// considered, so it waited to its deadline); the source's private PDs are freed once the
// requester is gone.
TEST_F(GpuDirectSourceTest, QpLimitRetiresAnIdleDirectQp) {
    ote_engine_t *src = Source(false);
    ASSERT_NE(src, nullptr);
    ote_engine_t *other = ote_test::RdmaEngine();
    ASSERT_NE(other, nullptr);
    ote_engine_t *req = OneLaneRequester("direct", "1");
    ASSERT_NE(req, nullptr);
    const size_t n = 100003;
    uint64_t rd = DevAlloc(n);
    ASSERT_NE(rd, 0u);
    DevFill(rd, n, 41);
    std::vector<uint8_t> want = DevRead(rd, n);
    std::vector<uint8_t> ohost(n), local(n);
    ote_pattern_fill(ohost.data(), n, 42, 0);
    ASSERT_EQ(ote_memory_register(src, reinterpret_cast<void *>(rd), n, OTE_PERM_READ), OTE_OK);
    ASSERT_EQ(ote_memory_register(other, ohost.data(), n, OTE_PERM_READ), OTE_OK);
    ote_segment_t *seg = nullptr, *oseg = nullptr;
    ASSERT_EQ(ote_segment_open(req, ote_test::EngineAddress(src).c_str(), &seg), OTE_OK);
    ASSERT_EQ(ote_segment_open(req, ote_test::EngineAddress(other).c_str(), &oseg), OTE_OK);
    const uint64_t lh = reinterpret_cast<uintptr_t>(local.data());
    ASSERT_EQ(Run(req, seg, OTE_READ, lh, rd, n), OTE_OK);
    EXPECT_TRUE(local == want);
    ote__rdma_test_grants_t g = Grants(req);
    EXPECT_GE(g.direct_followed, 1u);
    EXPECT_LE(g.qps, 1u);
    const uint64_t ev = g.qp_evictions;
    EXPECT_GE(ev, 1u) << "the plain QP retired for the direct one";
    ASSERT_EQ(Run(req, oseg, OTE_READ, lh, reinterpret_cast<uintptr_t>(ohost.data()), n), OTE_OK);
    EXPECT_TRUE(local == ohost);
    g = Grants(req);
    EXPECT_GE(g.qp_evictions, ev + 1) << "the idle direct QP was not retired";
    EXPECT_LE(g.qps_peak, 1u);
    EXPECT_LE(g.qps, 1u);
    EXPECT_EQ(ote_segment_close(oseg), OTE_OK);
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    EXPECT_TRUE(WaitDirectIdle(src)) << "a private PD or direct QP was left at the source";
    EXPECT_EQ(ote_memory_unregister(other, ohost.data()), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(other), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(src, reinterpret_cast<void *>(rd)), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
}

} // namespace

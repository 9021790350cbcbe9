// tests/engine/gpu_rdma_staging_test.cc - GPU memory over RDMA (verbs/sim) through the
// fake libcuda: both engines in this process, and ote_gpu_target as the source once. READs
// and WRITEs of remote device memory staged at the source through bounce buffers (bytes,
// sizes, offsets, gpu_paths without staging, driver faults on the source's copy, cancel),
// local device buffers staged by the requester. The memory kinds and the tcp and shm
// paths: gpu_staging_test.cc.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/engine/engine_util.h"
#include "tests/engine/gpu_fixture.h"
#include "tests/engine/gpu_staging_fixture.h"
#include "tests/engine/pattern.h"
#include "tests/engine/target.h"
#include "tests/util/test_base.h"

extern "C" {
#include "ote/ote.h"
}

namespace {

using ote_gpu_test::GpuStagingTest;
using ote_gpu_test::Hex;
using ote_gpu_test::kBigLen;
using ote_gpu_test::kCudaErrorInvalidValue;
using ote_gpu_test::kCudaErrorUnknown;
using ote_gpu_test::kTargetLen;
using ote_gpu_test::PatternHash;
using ote_gpu_test::StartGpuTarget;
using ote_test::Target;

// ---- RDMA (verbs/sim) and device memory ----
// GPUDirect RDMA is not built: a registered device range has no MR. It is served by
// source-side staging (engine/rdma/rdma_stage.c): each grant's bytes are copied into a
// bounce buffer whose window alone the requester reaches (a WRITE's copied back to the
// device after its receipt, its request completing on the source's COMMIT). Both
// engines live in this process (the sim and the fake driver are per process; the
// source's copies are counted in its gpu stats, staged_source), but for one case whose
// source is ote_gpu_target in another process.

class RdmaStagingTest : public GpuStagingTest {
  protected:
    // An RDMA (sim) engine; gpu_paths given when not null, and other keys.
    static ote_engine_t *Engine(const char *gpu_paths = nullptr,
                                const ote_test::ConfigKv &kv = {}) {
        return ote_gpu_test::RdmaGpuEngine(gpu_paths, kv);
    }
    // Source and requester engines, a device range of len bytes registered at the source
    // (READ|WRITE, pattern seed 81) and the requester's segment on it.
    void Open(size_t len, const char *src_paths = nullptr, const ote_test::ConfigKv &src_kv = {}) {
        src_ = Engine(src_paths, src_kv);
        ASSERT_NE(src_, nullptr);
        req_ = Engine();
        ASSERT_NE(req_, nullptr);
        rdev_ = DevAlloc(len);
        rlen_ = len;
        DevFill(rdev_, len, 81);
        ASSERT_EQ(ote_memory_register(src_, reinterpret_cast<void *>(rdev_), len,
                                      OTE_PERM_READ | OTE_PERM_WRITE),
                  OTE_OK);
        ASSERT_NO_FATAL_FAILURE(OpenSegment(req_, src_, &seg_));
    }
    void TearDown() override {
        Close();
        GpuStagingTest::TearDown();
    }
    void Close() {
        if (seg_ != nullptr) {
            EXPECT_EQ(ote_segment_close(seg_), OTE_OK);
        }
        seg_ = nullptr;
        if (req_ != nullptr) {
            EXPECT_EQ(ote_engine_destroy(req_), OTE_OK);
        }
        req_ = nullptr;
        // Unregister works: no grant holds the range any more.
        if (src_ != nullptr && rdev_ != 0) {
            EXPECT_EQ(ote_memory_unregister(src_, reinterpret_cast<void *>(rdev_)), OTE_OK);
        }
        rdev_ = 0;
        if (src_ != nullptr) {
            EXPECT_EQ(ote_engine_destroy(src_), OTE_OK);
        }
        src_ = nullptr;
    }
    uint64_t SourceCopies() {
        ote_gpu_stats_t gs{};
        EXPECT_EQ(ote_engine_gpu_stats(src_, &gs), OTE_OK);
        return gs.staged_source;
    }

    ote_engine_t *src_ = nullptr, *req_ = nullptr;
    ote_segment_t *seg_ = nullptr;
    uint64_t rdev_ = 0, rlen_ = 0;
};

// Remote device memory, READ and WRITE, with local host memory and with local device
// memory (the requester stages its own side too): 1 byte, an odd size and 64 MiB minus an
// odd tail, at unaligned offsets on both sides; every byte checked through the driver,
// and the guards around the range on the side written. A WRITE completes only once the
// source copied its bounce buffer to the device (the COMMIT): the bytes are there when
// the request ends.
TEST_F(RdmaStagingTest, MovesRemoteDeviceMemoryThroughBounceBuffers) {
    const uint64_t big = kBigLen; // 16 MiB under TSan
    const uint64_t cap = big + 4096;
    ASSERT_NO_FATAL_FAILURE(Open(cap));
    uint64_t ldev = DevAlloc(cap);
    std::vector<uint8_t> lhost(cap);
    const uint64_t loff = 3, roff = 5, tail = 64;
    const uint64_t sizes[] = {1, 12345, big - 77};
    int cases = 0;
    for (int local_dev = 0; local_dev < 2; local_dev++) {
        uint64_t lbase = local_dev ? ldev : reinterpret_cast<uintptr_t>(lhost.data());
        for (uint64_t len : sizes) {
            for (ote_opcode_t op : {OTE_WRITE, OTE_READ}) {
                SCOPED_TRACE(std::string(local_dev ? "local=cuda:0 " : "local=host ") +
                             (op == OTE_WRITE ? "WRITE " : "READ ") + std::to_string(len));
                const uint64_t lseed = 300 + cases, rseed = 400 + cases;
                uint64_t lspan = loff + len + tail;
                if (local_dev) DevFill(ldev, lspan, lseed);
                else ote_pattern_fill(lhost.data(), lspan, lseed, 0);
                DevFill(rdev_, roff + len + tail, rseed);
                uint64_t copies = SourceCopies();
                ote_transfer_status_t ts{};
                ASSERT_EQ(Run(req_, seg_, op, lbase + loff, rdev_ + roff, len, &ts), OTE_OK);
                EXPECT_EQ(ts.bytes_done, len);
                EXPECT_GT(SourceCopies(), copies); // served staged at the source
                if (op == OTE_WRITE) {
                    EXPECT_EQ(DevHash(rdev_ + roff, len), PatternHash(lseed, loff, len));
                    EXPECT_EQ(DevHash(rdev_, roff), PatternHash(rseed, 0, roff));
                    EXPECT_EQ(DevHash(rdev_ + roff + len, tail),
                              PatternHash(rseed, roff + len, tail));
                } else {
                    uint64_t got =
                        local_dev ? DevHash(ldev + loff, len) : ote_hash(lhost.data() + loff, len);
                    EXPECT_EQ(got, PatternHash(rseed, roff, len));
                    uint64_t before =
                        local_dev ? DevHash(ldev, loff) : ote_hash(lhost.data(), loff);
                    uint64_t after = local_dev ? DevHash(ldev + loff + len, tail)
                                               : ote_hash(lhost.data() + loff + len, tail);
                    EXPECT_EQ(before, PatternHash(lseed, 0, loff));
                    EXPECT_EQ(after, PatternHash(lseed, loff + len, tail));
                }
                cases++;
            }
        }
    }
    EXPECT_EQ(cases, 12);
    Close();
}

// Two processes: the source is ote_gpu_target over rdma (verbs/sim), its "dev" buffer
// device memory registered there. WRITE and READ, 1 byte, an odd size and 64 MiB minus an
// odd tail at unaligned offsets, every byte (and the target's bytes around a WRITE)
// checked through the target's driver.
TEST_F(RdmaStagingTest, TwoProcessesStagedAtTheTarget) {
    Target t;
    ASSERT_TRUE(StartGpuTarget(t, kTargetLen, ote_test::kRdmaTargetEnv));
    req_ = Engine();
    ASSERT_NE(req_, nullptr);
    ASSERT_EQ(ote_segment_open(req_, t.address.c_str(), &seg_), OTE_OK);
    std::vector<uint8_t> lhost(kTargetLen);
    const uint64_t loff = 3, roff = 5, tail = 64;
    int cases = 0;
    const uint64_t sizes[] = {1, 12345, kBigLen - 77};
    for (uint64_t len : sizes) {
        for (ote_opcode_t op : {OTE_WRITE, OTE_READ}) {
            SCOPED_TRACE((op == OTE_WRITE ? "WRITE " : "READ ") + std::to_string(len));
            const uint64_t lseed = 500 + cases, rseed = 600 + cases;
            ote_pattern_fill(lhost.data(), loff + len + tail, lseed, 0);
            ASSERT_EQ(t.Command("fill dev " + std::to_string(rseed) + " " +
                                std::to_string(roff + len + tail)),
                      "OK"); // the span the checks read
            ote_transfer_status_t ts{};
            ASSERT_EQ(Run(req_, seg_, op, reinterpret_cast<uintptr_t>(lhost.data()) + loff,
                          t.rw + roff, len, &ts),
                      OTE_OK);
            EXPECT_EQ(ts.bytes_done, len);
            if (op == OTE_WRITE) {
                EXPECT_EQ(t.Command("sum dev " + std::to_string(roff) + " " + std::to_string(len)),
                          Hex(PatternHash(lseed, loff, len)));
                EXPECT_EQ(t.Command("sum dev 0 " + std::to_string(roff)),
                          Hex(PatternHash(rseed, 0, roff)));
                EXPECT_EQ(
                    t.Command("sum dev " + std::to_string(roff + len) + " " + std::to_string(tail)),
                    Hex(PatternHash(rseed, roff + len, tail)));
            } else {
                EXPECT_EQ(ote_hash(lhost.data() + loff, len), PatternHash(rseed, roff, len));
                EXPECT_EQ(ote_hash(lhost.data(), loff), PatternHash(lseed, 0, loff));
                EXPECT_EQ(ote_hash(lhost.data() + loff + len, tail),
                          PatternHash(lseed, loff + len, tail));
            }
            cases++;
        }
    }
    EXPECT_EQ(cases, 6);
    Close();
    EXPECT_EQ(t.Quit(), 0);
}

// The source's gpu_paths without staging: a READ or WRITE of its device memory is
// refused at the source naming what is missing; its device bytes and the local buffer
// are untouched.
TEST_F(RdmaStagingTest, SourceWithoutStagingRefusesNamingWhatIsMissing) {
    ASSERT_NO_FATAL_FAILURE(Open(1 << 20, ""));
    std::vector<uint8_t> back(1 << 16);
    ote_pattern_fill(back.data(), back.size(), 84, 0);
    for (ote_opcode_t op : {OTE_READ, OTE_WRITE}) {
        ote_transfer_status_t ts{};
        EXPECT_NE(
            Run(req_, seg_, op, reinterpret_cast<uintptr_t>(back.data()), rdev_ + 3, 4000, &ts),
            OTE_OK);
        EXPECT_EQ(ts.state, OTE_TRANSFER_FAILED);
        EXPECT_EQ(ts.bytes_done, 0u);
        EXPECT_EQ(ts.error, OTE_ERR_UNSUPPORTED);
    }
    EXPECT_TRUE(LogContains("staging is not allowed"));
    EXPECT_EQ(SourceCopies(), 0u);
    EXPECT_EQ(ote_hash(back.data(), back.size()), PatternHash(84, 0, back.size()));
    EXPECT_EQ(DevHash(rdev_, rlen_), PatternHash(81, 0, rlen_));
    Close();
}

// A driver fault on the source's copies: into the bounce buffer (a READ's, and a
// WRITE's first copy) and back to the device (a WRITE's copy after its receipt: the
// COMMIT carries the failure), the enqueue failing, and the event query failing (outcome
// unknown: engine/gpu retains the stream and the chunk). That request fails, the next
// one works (every byte), and nothing of the driver leaks once both engines are gone
// (TearDown compares the fake's live objects). The requester's local buffer is host
// memory, so every driver call is the source's. The source's chunks hold a whole grant
// (8 MiB): a bounce of unknown outcome is then a pinned chunk, parked and reclaimed once
// the driver answers again (a heap bounce would be abandoned for good, engine/gpu).
TEST_F(RdmaStagingTest, SourceCopyFaultFailsOneRequestOnly) {
    REQUIRE_FAKE();
    const uint64_t len = 8 << 20;
    ASSERT_NO_FATAL_FAILURE(
        Open(len, nullptr, {{"gpu_staging_chunk", "8M"}, {"gpu_staging_depth", "1"}}));
    std::vector<uint8_t> host(len);
    struct Fault {
        const char *entry;
        ote_opcode_t op;
        int result;
    } faults[] = {{"cuMemcpyDtoHAsync", OTE_READ, kCudaErrorInvalidValue},
                  {"cuEventQuery", OTE_READ, kCudaErrorUnknown},
                  {"cuMemcpyDtoHAsync", OTE_WRITE, kCudaErrorInvalidValue},
                  {"cuMemcpyHtoDAsync", OTE_WRITE, kCudaErrorInvalidValue},
                  {"cuEventQuery", OTE_WRITE, kCudaErrorUnknown}};
    int seed = 90;
    for (int round = 0; round < 2; round++) {
        for (const Fault &f : faults) {
            SCOPED_TRACE(std::string(f.entry) + (f.op == OTE_WRITE ? " WRITE" : " READ") +
                         " round " + std::to_string(round));
            seed++;
            DevFill(rdev_, len, seed);
            ote_pattern_fill(host.data(), len, seed + 1000, 0);
            fake_.fail(f.entry, 1, 1, f.result);
            ote_transfer_status_t ts{};
            auto failing = [&] {
                EXPECT_NE(Run(req_, seg_, f.op, reinterpret_cast<uintptr_t>(host.data()), rdev_,
                              len, &ts),
                          OTE_OK);
            };
            if (f.result == kCudaErrorUnknown) ExpectErrorLogsIn(failing);
            else failing();
            EXPECT_EQ(ts.state, OTE_TRANSFER_FAILED);
            EXPECT_NE(ts.error, OTE_OK);
            fake_.clear_faults();
            // The next request works, every byte.
            ASSERT_EQ(Run(req_, seg_, f.op, reinterpret_cast<uintptr_t>(host.data()) + 1, rdev_ + 2,
                          len - 2),
                      OTE_OK);
            if (f.op == OTE_WRITE) {
                EXPECT_EQ(DevHash(rdev_ + 2, len - 2), PatternHash(seed + 1000, 1, len - 2));
            } else {
                EXPECT_EQ(ote_hash(host.data() + 1, len - 2), PatternHash(seed, 2, len - 2));
            }
        }
    }
    Close();
}

// Cancel while staged READs and WRITEs run, proven: a copy (the source's or, for device
// memory here, the requester's; both engines are in this process) is held at the fake's
// copy gate after two ran; released, the request ends CANCELED with fewer bytes done than
// asked, the bytes outside the range on the side written are untouched (and a READ leaves
// the source's device memory as it was), and the next request works. A first 1-byte READ
// teaches the requester that the range is staged, so each request is cut into grants of
// gpu_staging_chunk (a whole 32 MiB grant would be one copy: nothing to cancel between).
TEST_F(RdmaStagingTest, CancelMidTransferTouchesNothingOutside) {
    REQUIRE_FAKE();
    // 32 MiB, 8 MiB under TSan: 16 or 4 grants of the default 2 MiB chunk, a copy held
    // after two ran.
    const uint64_t total = ote_test::TsanScaled(32 << 20, 4), guard = 4096, len = total - 2 * guard;
    ASSERT_NO_FATAL_FAILURE(Open(total));
    std::vector<uint8_t> host(total);
    uint64_t ldev = DevAlloc(total);
    ASSERT_EQ(Run(req_, seg_, OTE_READ, reinterpret_cast<uintptr_t>(host.data()), rdev_ + guard, 1),
              OTE_OK);
    for (int i = 0; i < 4; i++) {
        const int local_dev = i & 1;
        const ote_opcode_t op = i < 2 ? OTE_READ : OTE_WRITE;
        SCOPED_TRACE(std::string(local_dev ? "local=cuda:0" : "local=host") +
                     (op == OTE_WRITE ? " WRITE" : " READ"));
        DevFill(rdev_, total, 81);
        if (local_dev) DevFill(ldev, total, 85);
        else ote_pattern_fill(host.data(), total, 85, 0);
        uint64_t lbase = local_dev ? ldev : reinterpret_cast<uintptr_t>(host.data());
        ote_request_t r = {op, reinterpret_cast<void *>(lbase + guard), seg_, rdev_ + guard, len};
        CancelWhileCopyHeld(req_, r, LocalGate(), 2); // CANCELED, bytes_done < len
        uint64_t head = local_dev ? DevHash(ldev, guard) : ote_hash(host.data(), guard);
        uint64_t end = local_dev ? DevHash(ldev + guard + len, guard)
                                 : ote_hash(host.data() + guard + len, guard);
        EXPECT_EQ(head, PatternHash(85, 0, guard));
        EXPECT_EQ(end, PatternHash(85, guard + len, guard));
        if (op == OTE_READ) {
            EXPECT_EQ(DevHash(rdev_, rlen_), PatternHash(81, 0, rlen_));
        } else {
            EXPECT_EQ(DevHash(rdev_, guard), PatternHash(81, 0, guard));
            EXPECT_EQ(DevHash(rdev_ + guard + len, guard), PatternHash(81, guard + len, guard));
        }
        // The next request works.
        ASSERT_EQ(Run(req_, seg_, op, lbase + guard, rdev_ + guard, 1 << 20), OTE_OK);
        if (op == OTE_READ) {
            uint64_t got =
                local_dev ? DevHash(ldev + guard, 1 << 20) : ote_hash(host.data() + guard, 1 << 20);
            EXPECT_EQ(got, PatternHash(81, guard, 1 << 20));
        } else {
            EXPECT_EQ(DevHash(rdev_ + guard, 1 << 20), PatternHash(85, guard, 1 << 20));
        }
    }
    Close();
}

// A local device buffer against remote host memory over RDMA: the requester stages it,
// both directions (no source-side staging involved).
TEST_F(GpuStagingTest, RdmaStagesLocalDeviceBuffers) {
    ote_engine_t *src = ote_test::RdmaEngine();
    ASSERT_NE(src, nullptr);
    ote_engine_t *req = ote_test::RdmaEngine();
    ASSERT_NE(req, nullptr);
    ote_segment_t *seg = nullptr;
    ASSERT_NO_FATAL_FAILURE(OpenSegment(req, src, &seg));
    uint64_t d2 = DevAlloc(1 << 20);
    std::vector<uint8_t> h(1 << 20);
    ote_pattern_fill(h.data(), h.size(), 83, 0);
    ASSERT_EQ(ote_memory_register(src, h.data(), h.size(), OTE_PERM_READ | OTE_PERM_WRITE), OTE_OK);
    const size_t n = (1 << 20) - 77;
    ASSERT_EQ(Run(req, seg, OTE_READ, d2 + 5, reinterpret_cast<uintptr_t>(h.data()) + 3, n),
              OTE_OK);
    EXPECT_EQ(DevHash(d2 + 5, n), ote_hash(h.data() + 3, n));
    DevFill(d2, 1 << 20, 84);
    ASSERT_EQ(Run(req, seg, OTE_WRITE, d2 + 9, reinterpret_cast<uintptr_t>(h.data()) + 1, n),
              OTE_OK);
    EXPECT_EQ(ote_hash(h.data() + 1, n), DevHash(d2 + 9, n));
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(src, h.data()), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
}

} // namespace

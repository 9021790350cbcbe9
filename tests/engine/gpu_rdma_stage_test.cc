// tests/engine/gpu_rdma_stage_test.cc - the pipelined source-side staging of RDMA
// (engine/rdma/rdma_stage.c, rdma_pump.c) over verbs/sim with the fake libcuda: once a
// source answered a request staged, the requester cuts that request's runs, and later
// requests starting in its range, at gpu_staging_chunk with at most gpu_staging_depth of
// them in flight per device, so the source copies grant k+1 into a pinned chunk while
// grant k moves; the source's bounce buffers come from its bounded pinned pool, and a
// pool with every chunk out answers AGAIN (the requester asks again, the request still
// completes). READ and WRITE of 1 byte, an odd size and 3.5 chunks (64 KiB chunks) with
// every byte and the guards checked through the driver and the source's copy count
// proving the cut; a driver fault on the source's copy mid-pipeline fails that request
// only; a cancel mid-pipeline touches nothing outside the range; the source's copy runs
// asynchronously (held running by the fault point gpu.src_copy_pending: its control
// thread serves other requests meanwhile; a fault on the copy's event fails that request
// only and releases everything; the source engine's destroy and the requester's loss with
// a copy running are clean); a staged WRITE's copy back runs asynchronously too (held by
// gpu.src_copyback_pending: other requests complete meanwhile, and the range stays
// registered (its unregister BUSY) until it ended; a fault on it fails that WRITE only
// and releases everything; the source's destroy waits for it); the source registers each
// pool chunk at most once per device however many grants run (its MR kept; reg_mr of
// MW-bindable MRs counted under the verbs fault decorator), and a chunk's MR that will
// not deregister keeps the source's destroy RETAINED until a retry; and a same-run
// figure of a 64 MiB staged transfer with the cut (2 MiB chunks) and without it (grants of
// rdma_grant_max, the earlier behaviour), printed against its parts; a source with
// rdma_grant_mode=mr (its requester asks on direct slots first) sends staged runs back to
// plain slots, once per range.
#include <gtest/gtest.h>

#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tests/engine/gpu_fixture.h"
#include "tests/engine/native_counter.h"
#include "tests/engine/engine_util.h"
#include "tests/engine/pattern.h"
#include "tests/util/wait.h"

extern "C" {
#include "base/fault.h"
#include "base/retained.h"
#include "cuda/memory/memory.h"
#include "engine/rdma/test_hook.h"
#include "ote/ote.h"
#include "verbs/fault.h"
}

namespace {

using ote_gpu_test::PatternHash;
using ote_test::kSec;

constexpr int kCudaErrorInvalidValue = 1;
constexpr uint64_t kChunk = 64 << 10;

class GpuRdmaStageTest : public ote_gpu_test::GpuTest {
  protected:
    void TearDown() override {
        Close();
        GpuTest::TearDown();
    }
    static ote_engine_t *Engine(const ote_test::ConfigKv &kv) {
        return ote_gpu_test::RdmaGpuEngine("staging", kv);
    }
    // Source and requester engines (keys of each), a device range of len bytes registered
    // at the source (pattern seed 81) and the requester's segment on it.
    void Open(size_t len, const ote_test::ConfigKv &src_kv, const ote_test::ConfigKv &req_kv) {
        src_ = Engine(src_kv);
        ASSERT_NE(src_, nullptr);
        req_ = Engine(req_kv);
        ASSERT_NE(req_, nullptr);
        rdev_ = DevAlloc(len);
        rlen_ = len;
        DevFill(rdev_, len, 81);
        ASSERT_EQ(ote_memory_register(src_, reinterpret_cast<void *>(rdev_), len,
                                      OTE_PERM_READ | OTE_PERM_WRITE),
                  OTE_OK);
        ASSERT_NO_FATAL_FAILURE(OpenSegment(req_, src_, &seg_));
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
        if (src_ != nullptr && rdev_ != 0) {
            // The source's last receipt may still be on its way in: BUSY until it lands.
            EXPECT_EQ(UnregisterSourceRange(), OTE_OK);
        }
        rdev_ = 0;
        if (src_ != nullptr) {
            EXPECT_EQ(ote_engine_destroy(src_), OTE_OK);
        }
        src_ = nullptr;
    }
    ote_status_t Run(ote_opcode_t op, uint64_t local, uint64_t remote, size_t len,
                     ote_transfer_status_t *out = nullptr) {
        ote_request_t r = {op, reinterpret_cast<void *>(local), seg_, remote, len};
        ote_transfer_status_t ts{};
        ote_status_t st = ote_test::RunOne(req_, r, 120 * kSec, &ts);
        if (out) *out = ts;
        return st;
    }
    uint64_t SourceCopies() {
        ote_gpu_stats_t gs{};
        EXPECT_EQ(ote_engine_gpu_stats(src_, &gs), OTE_OK);
        return gs.staged_source;
    }

  public:
    uint64_t SrcCopies() { return Grants(src_).src_copies; }

  protected:
    ote__rdma_test_grants_t Grants(ote_engine_t *e) {
        ote__rdma_test_grants_t g{};
        EXPECT_EQ(ote__rdma_test_grants(ote_test::EngineAddress(e).c_str(), &g), OTE_OK);
        return g;
    }
    // Until pred holds of the source's grant counters (generously); the last snapshot.
    ote__rdma_test_grants_t WaitSourceGrants(
        const std::function<bool(const ote__rdma_test_grants_t &)> &pred, const std::string &what) {
        ote__rdma_test_grants_t g{};
        ote_test::WaitUntil(
            [&] {
                g = Grants(src_);
                return pred(g);
            },
            ote_cuda_test::kLongWait, what);
        return g;
    }
    // Until the GPU worker has seen fault point `name` (a copy held running) at least once.
    void WaitHit(const char *name) {
        ote_test::WaitUntil([&] { return ote_fault_hits(name) > 0; }, ote_cuda_test::kLongWait,
                            std::string("fault point ") + name + " hit");
    }
    // Unregisters the source's device range, asked again while BUSY (a receipt still on
    // its way in) for up to 30 s; the last status.
    ote_status_t UnregisterSourceRange() {
        return ote_test::UnregisterWhenFree(src_, reinterpret_cast<void *>(rdev_));
    }

    ote_engine_t *src_ = nullptr, *req_ = nullptr;
    ote_segment_t *seg_ = nullptr;
    uint64_t rdev_ = 0, rlen_ = 0;
};

const ote_test::ConfigKv kSmall = {
    {"gpu_staging_chunk", "64K"}, {"gpu_staging_depth", "2"}, {"slice_size", "64K"}};

// READ and WRITE of 1 byte, an odd size and 3.5 chunks at unaligned offsets on both
// sides, every byte and the guards around the range checked through the driver. The
// first requests teach the requester that the range is staged: the 3.5-chunk one is then
// cut into four grants (four source copies for a READ; a WRITE's bounce is copied in and
// back out, eight).
TEST_F(GpuRdmaStageTest, ChunkedGrantsMoveEveryByte) {
    const uint64_t cap = 1 << 20, loff = 3, roff = 5, tail = 64;
    ASSERT_NO_FATAL_FAILURE(Open(cap, kSmall, kSmall));
    std::vector<uint8_t> host(cap);
    const uint64_t sizes[] = {1, 12345, 7 * kChunk / 2};
    int cases = 0;
    for (ote_opcode_t op : {OTE_READ, OTE_WRITE}) {
        for (uint64_t len : sizes) {
            SCOPED_TRACE((op == OTE_WRITE ? "WRITE " : "READ ") + std::to_string(len));
            const uint64_t lseed = 100 + cases, rseed = 200 + cases;
            ote_pattern_fill(host.data(), loff + len + tail, lseed, 0);
            DevFill(rdev_, roff + len + tail, rseed);
            uint64_t copies = SourceCopies();
            ote_transfer_status_t ts{};
            ASSERT_EQ(
                Run(op, reinterpret_cast<uintptr_t>(host.data()) + loff, rdev_ + roff, len, &ts),
                OTE_OK);
            EXPECT_EQ(ts.bytes_done, len);
            uint64_t n = SourceCopies() - copies;
            if (len > kChunk) {
                EXPECT_EQ(n, op == OTE_WRITE ? 8u : 4u) << "cut at the chunk size";
            } else {
                EXPECT_EQ(n, op == OTE_WRITE ? 2u : 1u);
            }
            if (op == OTE_WRITE) {
                EXPECT_EQ(DevHash(rdev_ + roff, len), PatternHash(lseed, loff, len));
                EXPECT_EQ(DevHash(rdev_, roff), PatternHash(rseed, 0, roff));
                EXPECT_EQ(DevHash(rdev_ + roff + len, tail), PatternHash(rseed, roff + len, tail));
            } else {
                EXPECT_EQ(ote_hash(host.data() + loff, len), PatternHash(rseed, roff, len));
                EXPECT_EQ(ote_hash(host.data(), loff), PatternHash(lseed, 0, loff));
                EXPECT_EQ(ote_hash(host.data() + loff + len, tail),
                          PatternHash(lseed, loff + len, tail));
            }
            cases++;
        }
    }
    EXPECT_EQ(cases, 6);
}

// A source that grants host memory by exact MRs although its device has windows
// (rdma_grant_mode=mr) still serves device memory staged, through a window over a bounce,
// on plain slots. Its requester saw rdma_grant_mr=1 and asks on direct slots first: the
// source's redirect sends the run back to a plain slot, once, and the request's later
// runs (and later requests) in the range known staged go there at once. READ and WRITE
// of 3.5 chunks, every byte checked, cut at the chunk size as from a window source.
TEST_F(GpuRdmaStageTest, MrSourceSendsStagedRunsBackToPlainSlots) {
    const uint64_t len = 7 * kChunk / 2;
    ote_test::ConfigKv src_kv = kSmall;
    src_kv.push_back({"rdma_grant_mode", "mr"});
    ASSERT_NO_FATAL_FAILURE(Open(1 << 20, src_kv, kSmall));
    ASSERT_EQ(Grants(src_).grant_mode_mr, 1u);
    std::vector<uint8_t> host(len);
    uint64_t seed = 300;
    for (int round = 0; round < 2; round++) {
        for (ote_opcode_t op : {OTE_READ, OTE_WRITE}) {
            SCOPED_TRACE((op == OTE_WRITE ? "WRITE, round " : "READ, round ") +
                         std::to_string(round));
            ote_pattern_fill(host.data(), len, seed, 0);
            DevFill(rdev_, len, seed + 1);
            uint64_t redirects = Grants(src_).direct_redirects, copies = SourceCopies();
            ASSERT_EQ(Run(op, reinterpret_cast<uintptr_t>(host.data()), rdev_, len), OTE_OK);
            if (op == OTE_WRITE) {
                EXPECT_EQ(DevHash(rdev_, len), PatternHash(seed, 0, len));
            } else {
                EXPECT_EQ(ote_hash(host.data(), len), PatternHash(seed + 1, 0, len));
            }
            uint64_t sent_back = Grants(src_).direct_redirects - redirects;
            // The first request's first runs (one per sim device, started together) are
            // sent back; once the range is known staged, nothing is asked on a direct slot.
            bool first = round == 0 && op == OTE_READ;
            EXPECT_LE(sent_back, first ? 2u : 0u);
            if (first) {
                EXPECT_GE(sent_back, 1u) << "the first run was not asked on a direct slot";
            }
            if (round > 0) {
                EXPECT_EQ(SourceCopies() - copies, op == OTE_WRITE ? 8u : 4u)
                    << "cut at the chunk size";
            }
            seed += 2;
        }
    }
    EXPECT_EQ(Grants(src_).direct_served, 0u) << "device memory without a dma-buf by exact MR";
    EXPECT_EQ(Grants(req_).direct_followed, 0u);
}

// The source's pool is smaller than what the requester keeps in flight (source depth 1:
// 4 chunks; requester depth 16): grants that find every chunk out are answered AGAIN and
// asked again, and the requests complete with every byte.
TEST_F(GpuRdmaStageTest, PoolExhaustionAnswersAgainAndCompletes) {
    const uint64_t cap = 2 << 20;
    ASSERT_NO_FATAL_FAILURE(
        Open(cap, {{"gpu_staging_chunk", "64K"}, {"gpu_staging_depth", "1"}},
             {{"gpu_staging_chunk", "64K"}, {"gpu_staging_depth", "16"}, {"slice_size", "64K"}}));
    std::vector<uint8_t> host(cap);
    // Teach the requester that the range is staged.
    ASSERT_EQ(Run(OTE_READ, reinterpret_cast<uintptr_t>(host.data()), rdev_, 1), OTE_OK);
    uint64_t busy = Grants(req_).busy_retries;
    for (int round = 0; round < 2; round++) {
        for (ote_opcode_t op : {OTE_READ, OTE_WRITE}) {
            SCOPED_TRACE((op == OTE_WRITE ? "WRITE round " : "READ round ") +
                         std::to_string(round));
            const uint64_t seed = 30 + round * 2 + (op == OTE_WRITE);
            DevFill(rdev_, cap, seed);
            ote_pattern_fill(host.data(), cap, seed + 100, 0);
            ASSERT_EQ(Run(op, reinterpret_cast<uintptr_t>(host.data()), rdev_, cap - 1), OTE_OK);
            if (op == OTE_WRITE) {
                EXPECT_EQ(DevHash(rdev_, cap - 1), PatternHash(seed + 100, 0, cap - 1));
            } else {
                EXPECT_EQ(ote_hash(host.data(), cap - 1), PatternHash(seed, 0, cap - 1));
            }
        }
    }
    // (Whether a grant met an empty pool depends on timing: counted, not asserted.)
    RecordProperty("busy_retries", std::to_string(Grants(req_).busy_retries - busy));
    printf("grants asked again after AGAIN: %llu\n",
           static_cast<unsigned long long>(Grants(req_).busy_retries - busy));
}

// A driver fault on one of the source's copies in the middle of a cut request (its
// third copy: a later grant's): that request fails and the next works with every byte
// (TearDown compares the fake's live objects once both engines are gone).
TEST_F(GpuRdmaStageTest, CopyFaultMidPipelineFailsOneRequestOnly) {
    const uint64_t cap = 1 << 20;
    ASSERT_NO_FATAL_FAILURE(Open(cap, kSmall, kSmall));
    std::vector<uint8_t> host(cap);
    ASSERT_EQ(Run(OTE_READ, reinterpret_cast<uintptr_t>(host.data()), rdev_, 1), OTE_OK);
    struct Fault {
        const char *entry;
        ote_opcode_t op;
    } faults[] = {{"cuMemcpyDtoHAsync", OTE_READ},
                  {"cuMemcpyDtoHAsync", OTE_WRITE},
                  {"cuMemcpyHtoDAsync", OTE_WRITE}};
    int seed = 60;
    for (const Fault &f : faults) {
        SCOPED_TRACE(std::string(f.entry) + (f.op == OTE_WRITE ? " WRITE" : " READ"));
        seed++;
        DevFill(rdev_, cap, seed);
        ote_pattern_fill(host.data(), cap, seed + 1000, 0);
        uint64_t c0 = SourceCopies();
        fake_.fail(f.entry, 3, 1, kCudaErrorInvalidValue);
        ote_transfer_status_t ts{};
        EXPECT_NE(Run(f.op, reinterpret_cast<uintptr_t>(host.data()), rdev_, 8 * kChunk, &ts),
                  OTE_OK);
        EXPECT_EQ(ts.state, OTE_TRANSFER_FAILED);
        EXPECT_NE(ts.error, OTE_OK);
        EXPECT_GE(SourceCopies() - c0, 3u) << "the fault met a later grant of the request";
        fake_.clear_faults();
        if (f.op == OTE_WRITE) {
            // Nothing past the range was written; the failed request's range may hold
            // some of its chunks.
            EXPECT_EQ(DevHash(rdev_ + 8 * kChunk, cap - 8 * kChunk),
                      PatternHash(seed, 8 * kChunk, cap - 8 * kChunk));
        }
        ASSERT_EQ(Run(f.op, reinterpret_cast<uintptr_t>(host.data()) + 1, rdev_ + 2, 5 * kChunk),
                  OTE_OK);
        if (f.op == OTE_WRITE) {
            EXPECT_EQ(DevHash(rdev_ + 2, 5 * kChunk), PatternHash(seed + 1000, 1, 5 * kChunk));
        } else {
            EXPECT_EQ(ote_hash(host.data() + 1, 5 * kChunk), PatternHash(seed, 2, 5 * kChunk));
        }
    }
}

// Cancel while a cut READ or WRITE runs, proven: the source's copy for a later grant is
// held at the fake's copy gate (two copies ran first) when the cancel comes; released,
// the request ends CANCELED with fewer bytes done than asked, the bytes outside the range
// on the side written are untouched (a READ leaves the source's device memory as it was),
// and the next request works.
TEST_F(GpuRdmaStageTest, CancelMidPipelineTouchesNothingOutside) {
    const uint64_t total = 4 << 20, guard = 4096, len = total - 2 * guard;
    ASSERT_NO_FATAL_FAILURE(Open(total, kSmall, kSmall));
    std::vector<uint8_t> host(total);
    ASSERT_EQ(Run(OTE_READ, reinterpret_cast<uintptr_t>(host.data()), rdev_ + guard, 1), OTE_OK);
    for (ote_opcode_t op : {OTE_READ, OTE_WRITE}) {
        SCOPED_TRACE(op == OTE_WRITE ? "WRITE" : "READ");
        DevFill(rdev_, total, 81);
        ote_pattern_fill(host.data(), total, 85, 0);
        ote_request_t r = {op, host.data() + guard, seg_, rdev_ + guard, len};
        CancelWhileCopyHeld(req_, r, LocalGate(), 2); // CANCELED, bytes_done < len
        EXPECT_EQ(ote_hash(host.data(), guard), PatternHash(85, 0, guard));
        EXPECT_EQ(ote_hash(host.data() + guard + len, guard), PatternHash(85, guard + len, guard));
        if (op == OTE_READ) {
            EXPECT_EQ(DevHash(rdev_, rlen_), PatternHash(81, 0, rlen_));
        } else {
            EXPECT_EQ(DevHash(rdev_, guard), PatternHash(81, 0, guard));
            EXPECT_EQ(DevHash(rdev_ + guard + len, guard), PatternHash(81, guard + len, guard));
        }
        ASSERT_EQ(
            Run(op, reinterpret_cast<uintptr_t>(host.data()) + guard, rdev_ + guard, 5 * kChunk),
            OTE_OK);
        if (op == OTE_READ) {
            EXPECT_EQ(ote_hash(host.data() + guard, 5 * kChunk),
                      PatternHash(81, guard, 5 * kChunk));
        } else {
            EXPECT_EQ(DevHash(rdev_ + guard, 5 * kChunk), PatternHash(85, guard, 5 * kChunk));
        }
    }
}

// Same-run figures (printed, not asserted): a staged READ and WRITE of $OTE_STAGE_BENCH_MB
// MiB (8 unset) with the requester cutting at 2 MiB chunks, and with a requester whose
// chunk is 64 MiB (its grants rdma_grant_max, one bounce per grant: the earlier
// behaviour); the parts: the source's device-to-host copy of the same bytes alone, and
// the same transfer of host memory. Every byte checked.
TEST_F(GpuRdmaStageTest, PipelineFigures) {
    const char *mb = getenv("OTE_STAGE_BENCH_MB");
    const uint64_t len = (mb != nullptr ? strtoull(mb, nullptr, 10) : 8) << 20;
    ASSERT_GT(len, 0u);
    ASSERT_NO_FATAL_FAILURE(Open(len, {}, {}));
    ote_engine_t *old_req = Engine({{"gpu_staging_chunk", "64M"}});
    ASSERT_NE(old_req, nullptr);
    ote_segment_t *old_seg = nullptr;
    ASSERT_EQ(ote_segment_open(old_req, ote_test::EngineAddress(src_).c_str(), &old_seg), OTE_OK);
    std::vector<uint8_t> host(len), shost(len);
    ASSERT_EQ(ote_memory_register(src_, shost.data(), len, OTE_PERM_READ | OTE_PERM_WRITE), OTE_OK);
    auto secs = [](std::chrono::steady_clock::time_point t0) {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    auto timed = [&](ote_engine_t *e, ote_segment_t *sg, ote_opcode_t op, uint64_t remote) {
        ote_request_t r = {op, host.data(), sg, remote, len};
        ote_transfer_status_t ts{};
        auto t0 = std::chrono::steady_clock::now();
        EXPECT_EQ(ote_test::RunOne(e, r, 300 * kSec, &ts), OTE_OK);
        return secs(t0);
    };
    // Teach both requesters (the first request of a range goes in whole grants).
    (void)timed(req_, seg_, OTE_READ, rdev_);
    (void)timed(old_req, old_seg, OTE_READ, rdev_);
    std::string out;
    for (ote_opcode_t op : {OTE_READ, OTE_WRITE}) {
        DevFill(rdev_, len, 11);
        ote_pattern_fill(host.data(), len, 12, 0);
        double cut = timed(req_, seg_, op, rdev_);
        if (op == OTE_READ) EXPECT_EQ(ote_hash(host.data(), len), PatternHash(11, 0, len));
        else EXPECT_EQ(DevHash(rdev_, len), PatternHash(12, 0, len));
        DevFill(rdev_, len, 13);
        ote_pattern_fill(host.data(), len, 14, 0);
        double whole = timed(old_req, old_seg, op, rdev_);
        if (op == OTE_READ) EXPECT_EQ(ote_hash(host.data(), len), PatternHash(13, 0, len));
        else EXPECT_EQ(DevHash(rdev_, len), PatternHash(14, 0, len));
        double xfer = timed(req_, seg_, op, reinterpret_cast<uintptr_t>(shost.data()));
        auto t0 = std::chrono::steady_clock::now();
        if (op == OTE_READ) {
            EXPECT_EQ(t_->cuMemcpyDtoH(shost.data(), rdev_, len), 0);
        } else {
            EXPECT_EQ(t_->cuMemcpyHtoD(rdev_, shost.data(), len), 0);
        }
        double copy = secs(t0);
        char line[320];
        snprintf(line, sizeof(line),
                 "%s %llu MiB staged: cut at 2 MiB %.3f s, whole grants %.3f s; parts: copy "
                 "%.3f s + host transfer %.3f s = %.3f s; cut / sum = %.2f, whole / sum = %.2f",
                 op == OTE_READ ? "READ" : "WRITE", static_cast<unsigned long long>(len >> 20), cut,
                 whole, copy, xfer, copy + xfer, cut / (copy + xfer), whole / (copy + xfer));
        printf("%s\n", line);
        out += std::string(line) + "; ";
    }
    RecordProperty("figures", out);
    EXPECT_EQ(ote_segment_close(old_seg), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(old_req), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(src_, shost.data()), OTE_OK);
}

// Until the source has n staged grants whose copy runs (generous deadline).
void WaitCopies(GpuRdmaStageTest *t, uint64_t n);

constexpr const char *kHold = "gpu.src_copy_pending";

// The source's device-to-host copy of a staged grant runs on a copy stream while its
// control connection's thread goes on: with the copy held running (fault point
// gpu.src_copy_pending: the GPU worker sees it running), READs of the source's host
// memory by the same requester (the same control connection) and by a second requester
// complete while the staged READ is still unanswered; released, it completes with every
// byte and nothing of it is left at the source.
TEST_F(GpuRdmaStageTest, ControlThreadServesOthersWhileACopyRuns) {
    const uint64_t cap = 1 << 20;
    ASSERT_NO_FATAL_FAILURE(Open(cap, kSmall, kSmall));
    std::vector<uint8_t> shost(cap), host(cap), host2(cap), host3(cap);
    ote_pattern_fill(shost.data(), cap, 7, 0);
    ASSERT_EQ(ote_memory_register(src_, shost.data(), cap, OTE_PERM_READ), OTE_OK);
    ote_engine_t *req2 = Engine(kSmall);
    ASSERT_NE(req2, nullptr);
    ote_segment_t *seg2 = nullptr;
    ASSERT_EQ(ote_segment_open(req2, ote_test::EngineAddress(src_).c_str(), &seg2), OTE_OK);
    DevFill(rdev_, cap, 91);
    ASSERT_EQ(ote_fault_arm(kHold, OTE_FAULT_EVERY, 0, OTE_ERR_AGAIN, 0), OTE_OK);
    ote_batch_t *b = nullptr;
    ASSERT_EQ(ote_batch_create(req_, 1, &b), OTE_OK);
    ote_request_t r = {OTE_READ, host.data() + 1, seg_, rdev_ + 3, kChunk - 5};
    ASSERT_EQ(ote_batch_submit(b, &r, 1), OTE_OK);
    WaitCopies(this, 1);
    // Until the GPU worker has seen it running (held from then on).
    WaitHit(kHold);
    ASSERT_GT(ote_fault_hits(kHold), 0u);
    ote_request_t h1 = {OTE_READ, host2.data(), seg_, reinterpret_cast<uintptr_t>(shost.data()),
                        cap};
    EXPECT_EQ(ote_test::RunOne(req_, h1, 120 * kSec), OTE_OK);
    ote_request_t h2 = {OTE_READ, host3.data(), seg2, reinterpret_cast<uintptr_t>(shost.data()),
                        cap};
    EXPECT_EQ(ote_test::RunOne(req2, h2, 120 * kSec), OTE_OK);
    EXPECT_EQ(ote_hash(host2.data(), cap), PatternHash(7, 0, cap));
    EXPECT_EQ(ote_hash(host3.data(), cap), PatternHash(7, 0, cap));
    // Still held: the staged READ is not answered yet.
    ote_transfer_status_t ts{};
    ASSERT_EQ(ote_batch_status(b, 0, &ts), OTE_OK);
    EXPECT_NE(ts.state, OTE_TRANSFER_COMPLETED);
    EXPECT_EQ(Grants(src_).src_copies, 1u);
    ASSERT_EQ(ote_fault_disarm(kHold), OTE_OK);
    EXPECT_EQ(ote_batch_wait(b, 120 * kSec), OTE_OK);
    ASSERT_EQ(ote_batch_status(b, 0, &ts), OTE_OK);
    EXPECT_EQ(ts.state, OTE_TRANSFER_COMPLETED);
    EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    EXPECT_EQ(ote_hash(host.data() + 1, kChunk - 5), PatternHash(91, 3, kChunk - 5));
    // The GPU worker counts the copy ended after it sent the answer: waited for.
    WaitCopies(this, 0);
    EXPECT_EQ(ote_segment_close(seg2), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req2), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(src_, shost.data()), OTE_OK);
}

// A driver fault on the source's asynchronous copy (the event's record when it starts, or
// its query when the GPU worker polls it: the stream is parked, its outcome unknown) fails
// that request only, and everything its grant held at the source is given back (no copy
// running, no grant live, no parent reservation); the next request moves every byte.
TEST_F(GpuRdmaStageTest, AsyncCopyFaultFailsThatRequestAndReleasesAll) {
    const uint64_t cap = 1 << 20;
    ASSERT_NO_FATAL_FAILURE(Open(cap, kSmall, kSmall));
    std::vector<uint8_t> host(cap);
    int seed = 120;
    for (const char *entry : {"cuEventRecord", "cuEventQuery"}) {
        SCOPED_TRACE(entry);
        seed++;
        DevFill(rdev_, cap, seed);
        uint64_t c0 = SourceCopies();
        ote__rdma_test_grants_t g{};
        {
            // A failed query leaves the copy's outcome unknown: its park is logged.
            ote_test::ErrorLogsExpected guard;
            fake_.fail(entry, 1, 1, kCudaErrorInvalidValue);
            ote_transfer_status_t ts{};
            EXPECT_NE(Run(OTE_READ, reinterpret_cast<uintptr_t>(host.data()), rdev_, kChunk, &ts),
                      OTE_OK);
            EXPECT_EQ(ts.state, OTE_TRANSFER_FAILED);
            EXPECT_GT(fake_.calls(entry), 0u);
            EXPECT_GE(SourceCopies() - c0, 1u);
            fake_.clear_faults();
            g = WaitSourceGrants(
                [](const ote__rdma_test_grants_t &x) {
                    return x.src_copies == 0 && x.live_source == 0 && x.sp_parents == 0;
                },
                "no copy running, no grant live, no parent reservation");
        }
        EXPECT_EQ(g.src_copies, 0u);
        EXPECT_EQ(g.live_source, 0u);
        EXPECT_EQ(g.sp_parents, 0u);
        ASSERT_EQ(
            Run(OTE_READ, reinterpret_cast<uintptr_t>(host.data()) + 1, rdev_ + 2, 3 * kChunk),
            OTE_OK);
        EXPECT_EQ(ote_hash(host.data() + 1, 3 * kChunk), PatternHash(seed, 2, 3 * kChunk));
    }
}

// The source engine destroyed while a staged grant's copy runs (held; the grant's
// deadline, 0.5 s + 1 s here, bounds the wait): the destroy succeeds, the requester's
// request fails, and the fake's live objects (chunks, streams, events) are back where
// they were (TearDown).
TEST_F(GpuRdmaStageTest, SourceDestroyWithACopyRunning) {
    const uint64_t cap = 1 << 20;
    ote_test::ConfigKv kv = kSmall;
    kv.push_back({"transfer_timeout_ms", "500"});
    ASSERT_NO_FATAL_FAILURE(Open(cap, kv, kv));
    std::vector<uint8_t> host(cap);
    ASSERT_EQ(ote_fault_arm(kHold, OTE_FAULT_EVERY, 0, OTE_ERR_AGAIN, 0), OTE_OK);
    ote_batch_t *b = nullptr;
    ASSERT_EQ(ote_batch_create(req_, 1, &b), OTE_OK);
    ote_request_t r = {OTE_READ, host.data(), seg_, rdev_, kChunk};
    ASSERT_EQ(ote_batch_submit(b, &r, 1), OTE_OK);
    WaitCopies(this, 1);
    {
        // The held copy is given up at its deadline: parked, logged.
        ote_test::ErrorLogsExpected guard;
        EXPECT_EQ(ote_engine_destroy(src_), OTE_OK);
        EXPECT_GE(guard.Seen(), 1u);
    }
    src_ = nullptr;
    rdev_ = 0; // its registration went with the engine
    EXPECT_EQ(ote_fault_disarm(kHold), OTE_OK);
    (void)ote_batch_wait(b, 120 * kSec);
    ote_transfer_status_t ts{};
    ASSERT_EQ(ote_batch_status(b, 0, &ts), OTE_OK);
    EXPECT_EQ(ts.state, OTE_TRANSFER_FAILED);
    EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
}

// The requester goes (its request canceled, its engine destroyed) while the source's copy
// for its staged grant runs: the source releases the grant once the copy ends (here
// released at once), answers nobody, and serves the next requester.
TEST_F(GpuRdmaStageTest, RequesterGoneWithACopyRunning) {
    const uint64_t cap = 1 << 20;
    ote_test::ConfigKv kv = kSmall;
    kv.push_back({"transfer_timeout_ms", "500"});
    ASSERT_NO_FATAL_FAILURE(Open(cap, kSmall, kv));
    std::vector<uint8_t> host(cap);
    ASSERT_EQ(ote_fault_arm(kHold, OTE_FAULT_EVERY, 0, OTE_ERR_AGAIN, 0), OTE_OK);
    ote_batch_t *b = nullptr;
    ASSERT_EQ(ote_batch_create(req_, 1, &b), OTE_OK);
    ote_request_t r = {OTE_READ, host.data(), seg_, rdev_, kChunk};
    ASSERT_EQ(ote_batch_submit(b, &r, 1), OTE_OK);
    WaitCopies(this, 1);
    EXPECT_EQ(ote_batch_cancel(b), OTE_OK);
    (void)ote_batch_wait(b, 120 * kSec);
    EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    EXPECT_EQ(ote_segment_close(seg_), OTE_OK);
    seg_ = nullptr;
    EXPECT_EQ(ote_engine_destroy(req_), OTE_OK);
    req_ = nullptr;
    EXPECT_EQ(Grants(src_).src_copies, 1u); // still held
    EXPECT_EQ(ote_fault_disarm(kHold), OTE_OK);
    WaitCopies(this, 0);
    ote__rdma_test_grants_t g = WaitSourceGrants(
        [](const ote__rdma_test_grants_t &x) { return x.live_source == 0 && x.sp_parents == 0; },
        "no grant live, no parent reservation");
    EXPECT_EQ(g.live_source, 0u);
    EXPECT_EQ(g.sp_parents, 0u);
    req_ = Engine(kSmall);
    ASSERT_NE(req_, nullptr);
    ASSERT_EQ(ote_segment_open(req_, ote_test::EngineAddress(src_).c_str(), &seg_), OTE_OK);
    DevFill(rdev_, cap, 131);
    ASSERT_EQ(Run(OTE_READ, reinterpret_cast<uintptr_t>(host.data()), rdev_, 2 * kChunk), OTE_OK);
    EXPECT_EQ(ote_hash(host.data(), 2 * kChunk), PatternHash(131, 0, 2 * kChunk));
}

constexpr const char *kHoldBack = "gpu.src_copyback_pending";

// A staged WRITE's copy back to the device (bounce -> device, once its grant ended) runs
// on a copy stream while the thread that ended the grant goes on: with the copy back held
// running (fault point gpu.src_copyback_pending), a staged READ and a host READ by the
// same requester (the same control connection and CQ lane) complete meanwhile and the
// WRITE stays unfinished (its COMMIT waits for the copy); released, it completes with its
// bytes in device memory and nothing of it is left at the source.
TEST_F(GpuRdmaStageTest, CopyBackHeldDoesNotBlockOtherRequests) {
    const uint64_t cap = 1 << 20;
    ASSERT_NO_FATAL_FAILURE(Open(cap, kSmall, kSmall));
    std::vector<uint8_t> shost(cap), host(cap), host2(cap), host3(cap);
    ote_pattern_fill(shost.data(), cap, 8, 0);
    ASSERT_EQ(ote_memory_register(src_, shost.data(), cap, OTE_PERM_READ), OTE_OK);
    DevFill(rdev_, cap, 92);
    ote_pattern_fill(host.data(), cap, 93, 0);
    ASSERT_EQ(ote_fault_arm(kHoldBack, OTE_FAULT_EVERY, 0, OTE_ERR_AGAIN, 0), OTE_OK);
    ote_batch_t *b = nullptr;
    ASSERT_EQ(ote_batch_create(req_, 1, &b), OTE_OK);
    ote_request_t r = {OTE_WRITE, host.data() + 1, seg_, rdev_ + 3, kChunk - 5};
    ASSERT_EQ(ote_batch_submit(b, &r, 1), OTE_OK);
    // Until the GPU worker has seen the copy back running (held from then on).
    WaitHit(kHoldBack);
    ASSERT_GT(ote_fault_hits(kHoldBack), 0u);
    EXPECT_EQ(SrcCopies(), 1u);
    ote_request_t h1 = {OTE_READ, host2.data(), seg_, reinterpret_cast<uintptr_t>(shost.data()),
                        cap};
    EXPECT_EQ(ote_test::RunOne(req_, h1, 120 * kSec), OTE_OK);
    EXPECT_EQ(Run(OTE_READ, reinterpret_cast<uintptr_t>(host3.data()), rdev_ + cap / 2, 2 * kChunk),
              OTE_OK);
    EXPECT_EQ(ote_hash(host2.data(), cap), PatternHash(8, 0, cap));
    EXPECT_EQ(ote_hash(host3.data(), 2 * kChunk), PatternHash(92, cap / 2, 2 * kChunk));
    // Still held: the WRITE waits for its COMMIT.
    ote_transfer_status_t ts{};
    ASSERT_EQ(ote_batch_status(b, 0, &ts), OTE_OK);
    EXPECT_NE(ts.state, OTE_TRANSFER_COMPLETED);
    // The GPU worker counts the staged READ's copy ended after it sent the answer, which
    // can come after the READ completed here (it did, once, under load): waited for; the
    // held copy back stays.
    WaitCopies(this, 1);
    // The staged READ's bounce goes back when the source hears that the requester is done
    // with it, which can come after the READ completed here: only the held WRITE's stays.
    WaitSourceGrants([](const ote__rdma_test_grants_t &x) { return x.src_stages <= 1; },
                     "only the held WRITE's bounce left");
    EXPECT_EQ(Grants(src_).src_stages, 1u);
    ASSERT_EQ(ote_fault_disarm(kHoldBack), OTE_OK);
    EXPECT_EQ(ote_batch_wait(b, 120 * kSec), OTE_OK);
    ASSERT_EQ(ote_batch_status(b, 0, &ts), OTE_OK);
    EXPECT_EQ(ts.state, OTE_TRANSFER_COMPLETED);
    EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    EXPECT_EQ(DevHash(rdev_ + 3, kChunk - 5), PatternHash(93, 1, kChunk - 5));
    EXPECT_EQ(DevHash(rdev_, 3), PatternHash(92, 0, 3));
    EXPECT_EQ(DevHash(rdev_ + kChunk - 2, 2), PatternHash(92, kChunk - 2, 2));
    WaitCopies(this, 0);
    WaitSourceGrants([](const ote__rdma_test_grants_t &x) { return x.src_stages == 0; },
                     "no bounce left at the source");
    EXPECT_EQ(Grants(src_).src_stages, 0u);
    EXPECT_EQ(ote_memory_unregister(src_, shost.data()), OTE_OK);
}

// While a staged WRITE's copy back into the registered device range runs (held), the
// range is still in use: its unregister is BUSY (the request's account keeps its pin
// until the copy back ended, as it did while the copy back was synchronous), never OK
// with the device still being written. Released, the WRITE completes with its bytes and
// the unregister succeeds (Close).
TEST_F(GpuRdmaStageTest, CopyBackHeldKeepsTheRangeRegistered) {
    const uint64_t cap = 1 << 20;
    ASSERT_NO_FATAL_FAILURE(Open(cap, kSmall, kSmall));
    std::vector<uint8_t> host(cap);
    DevFill(rdev_, cap, 95);
    ote_pattern_fill(host.data(), cap, 96, 0);
    ASSERT_EQ(ote_fault_arm(kHoldBack, OTE_FAULT_EVERY, 0, OTE_ERR_AGAIN, 0), OTE_OK);
    ote_batch_t *b = nullptr;
    ASSERT_EQ(ote_batch_create(req_, 1, &b), OTE_OK);
    ote_request_t r = {OTE_WRITE, host.data(), seg_, rdev_, kChunk};
    ASSERT_EQ(ote_batch_submit(b, &r, 1), OTE_OK);
    WaitHit(kHoldBack);
    ASSERT_GT(ote_fault_hits(kHoldBack), 0u);
    // The grant has ended (its copy back runs), so its unpin ran or is about to: asked five
    // times (each unregister waits up to OTE_UNREGISTER_WAIT_MS for the pins to drop), the
    // range stays registered while the copy back is held.
    WaitSourceGrants([](const ote__rdma_test_grants_t &x) { return x.live_source == 0; },
                     "the WRITE's grant ended");
    ote_status_t st = OTE_ERR_BUSY;
    for (int i = 0; i < 5 && ote_status_code(st) == OTE_ERR_BUSY; i++) {
        st = ote_memory_unregister(src_, reinterpret_cast<void *>(rdev_));
        if (ote_status_code(st) == OTE_ERR_BUSY) usleep(10 * 1000);
    }
    EXPECT_EQ(ote_status_code(st), OTE_ERR_BUSY) << "unregistered while its copy back runs";
    const uint64_t dev = rdev_;
    if (st == OTE_OK) rdev_ = 0; // Close must not unregister it again
    EXPECT_EQ(SrcCopies(), 1u);
    ASSERT_EQ(ote_fault_disarm(kHoldBack), OTE_OK);
    EXPECT_EQ(ote_batch_wait(b, 120 * kSec), OTE_OK);
    ote_transfer_status_t ts{};
    ASSERT_EQ(ote_batch_status(b, 0, &ts), OTE_OK);
    EXPECT_EQ(ts.state, OTE_TRANSFER_COMPLETED);
    EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    EXPECT_EQ(DevHash(dev, kChunk), PatternHash(96, 0, kChunk));
    WaitCopies(this, 0);
}

// A driver fault on a staged WRITE's asynchronous copy back: its event's query when the
// GPU worker polls it (held first, then the next query fails: the outcome is unknown,
// the stream and the chunk are parked, logged), or the event's record when it starts
// (the request's second copy). That WRITE fails, everything its grant held at the source is given
// back (no copy running, no bounce or MR held, no grant live, no parent reservation) and
// the next WRITE moves every byte.
TEST_F(GpuRdmaStageTest, CopyBackFaultFailsThatWriteAndReleasesAll) {
    const uint64_t cap = 1 << 20;
    ASSERT_NO_FATAL_FAILURE(Open(cap, kSmall, kSmall));
    std::vector<uint8_t> host(cap);
    ASSERT_EQ(Run(OTE_READ, reinterpret_cast<uintptr_t>(host.data()), rdev_, 1), OTE_OK);
    int seed = 140;
    for (const char *entry : {"cuEventQuery", "cuEventRecord"}) {
        SCOPED_TRACE(entry);
        seed++;
        DevFill(rdev_, cap, seed);
        ote_pattern_fill(host.data(), cap, seed + 1000, 0);
        bool query = std::string(entry) == "cuEventQuery";
        uint64_t c0 = SourceCopies();
        ote__rdma_test_grants_t g{};
        {
            ote_test::ErrorLogsExpected guard; // an unknown outcome's park is logged
            if (query) {
                ASSERT_EQ(ote_fault_arm(kHoldBack, OTE_FAULT_EVERY, 0, OTE_ERR_AGAIN, 0), OTE_OK);
            } else {
                fake_.fail(entry, 2, 1, kCudaErrorInvalidValue);
            }
            ote_batch_t *b = nullptr;
            ASSERT_EQ(ote_batch_create(req_, 1, &b), OTE_OK);
            ote_request_t r = {OTE_WRITE, host.data(), seg_, rdev_, kChunk};
            ASSERT_EQ(ote_batch_submit(b, &r, 1), OTE_OK);
            if (query) {
                WaitHit(kHoldBack);
                ASSERT_GT(ote_fault_hits(kHoldBack), 0u);
                fake_.fail(entry, 1, 1, kCudaErrorInvalidValue);
                ASSERT_EQ(ote_fault_disarm(kHoldBack), OTE_OK);
            }
            (void)ote_batch_wait(b, 120 * kSec);
            ote_transfer_status_t ts{};
            ASSERT_EQ(ote_batch_status(b, 0, &ts), OTE_OK);
            EXPECT_EQ(ts.state, OTE_TRANSFER_FAILED);
            EXPECT_NE(ts.error, OTE_OK);
            EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
            // Both copies started: the fault met the copy back.
            EXPECT_EQ(SourceCopies() - c0, 2u);
            EXPECT_GT(fake_.calls(entry), 0u);
            fake_.clear_faults();
            g = WaitSourceGrants(
                [](const ote__rdma_test_grants_t &x) {
                    return x.src_copies == 0 && x.src_stages == 0 && x.live_source == 0 &&
                           x.sp_parents == 0;
                },
                "no copy running, no bounce, no grant live, no parent reservation");
        }
        EXPECT_EQ(g.src_copies, 0u);
        EXPECT_EQ(g.src_stages, 0u);
        EXPECT_EQ(g.live_source, 0u);
        EXPECT_EQ(g.sp_parents, 0u);
        // Nothing past the range was written.
        EXPECT_EQ(DevHash(rdev_ + kChunk, cap - kChunk), PatternHash(seed, kChunk, cap - kChunk));
        ASSERT_EQ(
            Run(OTE_WRITE, reinterpret_cast<uintptr_t>(host.data()) + 1, rdev_ + 2, 3 * kChunk),
            OTE_OK);
        EXPECT_EQ(DevHash(rdev_ + 2, 3 * kChunk), PatternHash(seed + 1000, 1, 3 * kChunk));
    }
}

// The source engine destroyed while a staged WRITE's copy back runs (held; the grant's
// deadline, 0.5 s + 1 s here, bounds it): the destroy waits for it (its MR and bounce
// released, its COMMIT of the failure sent or its connection gone) and succeeds, the
// requester's request fails, and the fake's live objects are back where they were
// (TearDown; no use after free under ASan).
TEST_F(GpuRdmaStageTest, SourceDestroyWithACopyBackRunning) {
    const uint64_t cap = 1 << 20;
    ote_test::ConfigKv kv = kSmall;
    kv.push_back({"transfer_timeout_ms", "500"});
    ASSERT_NO_FATAL_FAILURE(Open(cap, kv, kv));
    std::vector<uint8_t> host(cap);
    ASSERT_EQ(ote_fault_arm(kHoldBack, OTE_FAULT_EVERY, 0, OTE_ERR_AGAIN, 0), OTE_OK);
    ote_batch_t *b = nullptr;
    ASSERT_EQ(ote_batch_create(req_, 1, &b), OTE_OK);
    ote_request_t r = {OTE_WRITE, host.data(), seg_, rdev_, kChunk};
    ASSERT_EQ(ote_batch_submit(b, &r, 1), OTE_OK);
    WaitHit(kHoldBack);
    ASSERT_GT(ote_fault_hits(kHoldBack), 0u);
    {
        // The held copy is given up at its deadline: parked, logged.
        ote_test::ErrorLogsExpected guard;
        EXPECT_EQ(ote_engine_destroy(src_), OTE_OK);
        EXPECT_GE(guard.Seen(), 1u);
    }
    src_ = nullptr;
    rdev_ = 0; // its registration went with the engine
    EXPECT_EQ(ote_fault_disarm(kHoldBack), OTE_OK);
    (void)ote_batch_wait(b, 120 * kSec);
    ote_transfer_status_t ts{};
    ASSERT_EQ(ote_batch_status(b, 0, &ts), OTE_OK);
    EXPECT_EQ(ts.state, OTE_TRANSFER_FAILED);
    EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
}

// Engines created while the hook is set get a counter of the sim's native objects under
// the verbs fault decorator (native_counter.h), in creation order.
std::vector<ote_verbs_t *> *g_wrapped = nullptr;
std::vector<std::unique_ptr<ote_test::NativeCounter>> *g_owned = nullptr;
ote_status_t WrapCounted(ote_verbs_t **v) { return ote_test::WrapCounted(v, g_owned, g_wrapped); }

class GpuRdmaStageMrTest : public GpuRdmaStageTest {
  protected:
    // Open (source first) with both engines' providers counted; one data device each,
    // so that the source's staging MRs are at most its pool's chunks.
    void OpenCounted(size_t len, ote_test::ConfigKv src_kv, ote_test::ConfigKv req_kv) {
        src_kv.push_back({"rdma_devices", "sim0"});
        req_kv.push_back({"rdma_devices", "sim0"});
        g_wrapped = &wrapped_;
        g_owned = &natives_;
        ote__rdma_test_verbs_hook = WrapCounted;
        Open(len, src_kv, req_kv);
        ote__rdma_test_verbs_hook = nullptr;
        ASSERT_FALSE(HasFatalFailure());
        ASSERT_EQ(wrapped_.size(), 2u);
        vs_ = wrapped_[0];
        ns_ = natives_[0].get();
    }
    void TearDown() override {
        ote__rdma_test_verbs_hook = nullptr;
        if (vs_ != nullptr && src_ != nullptr) ote_verbs_fault_clear(vs_);
        GpuRdmaStageTest::TearDown();
        for (auto &n : natives_) {
            EXPECT_TRUE(n->closed.load()) << "an engine did not close its provider";
            EXPECT_EQ(n->mrs.load(), 0) << "memory regions left alive";
            EXPECT_EQ(n->mws.load(), 0) << "memory windows left alive";
        }
    }
    // Until the source holds no bounce (a grant ends on its receipt, after the
    // requester's request completed).
    void WaitSourceIdle() {
        ote__rdma_test_grants_t g = WaitSourceGrants(
            [](const ote__rdma_test_grants_t &x) {
                return x.src_stages == 0 && x.src_copies == 0 && x.live_source == 0;
            },
            "the source idle (no bounce, no copy, no grant live)");
        EXPECT_EQ(g.src_stages, 0u);
        EXPECT_EQ(g.live_source, 0u);
    }
    std::vector<ote_verbs_t *> wrapped_;
    std::vector<std::unique_ptr<ote_test::NativeCounter>> natives_;
    ote_verbs_t *vs_ = nullptr;
    ote_test::NativeCounter *ns_ = nullptr;
};

// Staged READs and WRITEs (3.5 chunks and an odd size, unaligned, every byte and the
// guards checked through the driver) through a source pool of 4 chunks (depth 1) on one
// data device: each chunk is registered at most once (its MR kept between grants), so
// the source's MW-bindable registrations stay at most chunks x devices however many
// grants ran, and none is deregistered before the engine's destroy, which deregisters
// them all.
TEST_F(GpuRdmaStageMrTest, PoolChunksRegisteredOncePerDevice) {
    const uint64_t cap = 1 << 20, loff = 3, roff = 5, tail = 64;
    const uint64_t chunks = 4, devices = 1;
    ASSERT_NO_FATAL_FAILURE(
        OpenCounted(cap, {{"gpu_staging_chunk", "64K"}, {"gpu_staging_depth", "1"}}, kSmall));
    std::vector<uint8_t> host(cap);
    // Teach the requester that the whole range is staged (its first grants may be larger
    // than a chunk: heap bounces, temporary MRs).
    ASSERT_EQ(Run(OTE_READ, reinterpret_cast<uintptr_t>(host.data()), rdev_, cap), OTE_OK);
    WaitSourceIdle();
    const uint64_t regs0 = ns_->bind_regs.load(), made0 = Grants(src_).src_stage_mrs;
    const int64_t alive0 = ns_->bind_mrs.load();
    const uint64_t fregs0 = ote_verbs_fault_calls(vs_, OTE_VERBS_FAULT_OP_REG_MR);
    const uint64_t copies0 = SourceCopies();
    uint64_t grants = 0;
    int cases = 0;
    for (int round = 0; round < 3; round++) {
        for (ote_opcode_t op : {OTE_READ, OTE_WRITE}) {
            for (uint64_t len : {7 * kChunk / 2, uint64_t{12345}}) {
                SCOPED_TRACE((op == OTE_WRITE ? "WRITE " : "READ ") + std::to_string(len) +
                             " round " + std::to_string(round));
                const uint64_t lseed = 300 + cases, rseed = 400 + cases;
                ote_pattern_fill(host.data(), loff + len + tail, lseed, 0);
                DevFill(rdev_, roff + len + tail, rseed);
                ote_transfer_status_t ts{};
                ASSERT_EQ(Run(op, reinterpret_cast<uintptr_t>(host.data()) + loff, rdev_ + roff,
                              len, &ts),
                          OTE_OK);
                EXPECT_EQ(ts.bytes_done, len);
                if (op == OTE_WRITE) {
                    EXPECT_EQ(DevHash(rdev_ + roff, len), PatternHash(lseed, loff, len));
                    EXPECT_EQ(DevHash(rdev_, roff), PatternHash(rseed, 0, roff));
                    EXPECT_EQ(DevHash(rdev_ + roff + len, tail),
                              PatternHash(rseed, roff + len, tail));
                } else {
                    EXPECT_EQ(ote_hash(host.data() + loff, len), PatternHash(rseed, roff, len));
                    EXPECT_EQ(ote_hash(host.data(), loff), PatternHash(lseed, 0, loff));
                    EXPECT_EQ(ote_hash(host.data() + loff + len, tail),
                              PatternHash(lseed, loff + len, tail));
                }
                grants += len > kChunk ? 4 : 1;
                cases++;
            }
        }
    }
    EXPECT_EQ(cases, 12);
    // A READ grant copies once, a WRITE grant twice: 3 x (5 + 10) copies.
    EXPECT_EQ(SourceCopies() - copies0, 45u) << "every grant was staged through the pool";
    EXPECT_EQ(grants, 30u);
    WaitSourceIdle();
    const uint64_t regs = ns_->bind_regs.load() - regs0;
    const uint64_t made = Grants(src_).src_stage_mrs;
    printf(
        "%llu staged grants: %llu MW-bindable MRs registered after the first request "
        "(%llu chunk MRs in all), reg_mr calls through the decorator +%llu\n",
        static_cast<unsigned long long>(grants), static_cast<unsigned long long>(regs),
        static_cast<unsigned long long>(made),
        static_cast<unsigned long long>(ote_verbs_fault_calls(vs_, OTE_VERBS_FAULT_OP_REG_MR) -
                                        fregs0));
    EXPECT_LE(regs, chunks * devices);
    EXPECT_EQ(regs, made - made0) << "only chunk MRs were registered";
    EXPECT_LE(made, chunks * devices);
    EXPECT_GE(made, 1u);
    // The chunks' MRs stay registered between grants, with no bounce held.
    EXPECT_EQ(ns_->bind_mrs.load(), alive0 + static_cast<int64_t>(regs));
    EXPECT_GE(ns_->bind_mrs.load(), static_cast<int64_t>(made));
    Close();
    EXPECT_EQ(ns_->bind_mrs.load(), 0) << "the destroy deregistered the chunks' MRs";
}

// A chunk's MR that will not deregister at the source's destroy (the verbs fault
// decorator answers EBUSY once for it): the destroy is RETAINED (the MR alive, counted
// as retained, the pool's pinned memory kept with the engine), and a second destroy
// deregisters it and succeeds.
TEST_F(GpuRdmaStageMrTest, ChunkMrDeregFailureAtDestroyRetains) {
    const uint64_t cap = 1 << 20;
    ASSERT_NO_FATAL_FAILURE(OpenCounted(cap, kSmall, kSmall));
    std::vector<uint8_t> host(cap);
    const uint64_t regs0 = ns_->bind_regs.load();
    DevFill(rdev_, kChunk, 61);
    ASSERT_EQ(Run(OTE_READ, reinterpret_cast<uintptr_t>(host.data()), rdev_, kChunk), OTE_OK);
    EXPECT_EQ(ote_hash(host.data(), kChunk), PatternHash(61, 0, kChunk));
    ASSERT_EQ(ns_->bind_regs.load(), regs0 + 1);
    ASSERT_EQ(Grants(src_).src_stage_mrs, 1u);
    struct ibv_mr *mr = ns_->last_bind_mr.load();
    ASSERT_NE(mr, nullptr);
    // The requester and the registration go first (as Close()).
    EXPECT_EQ(ote_segment_close(seg_), OTE_OK);
    seg_ = nullptr;
    EXPECT_EQ(ote_engine_destroy(req_), OTE_OK);
    req_ = nullptr;
    ASSERT_EQ(UnregisterSourceRange(), OTE_OK);
    rdev_ = 0;
    const uint64_t retained0 = ote_retained_total();
    const int64_t alive = ns_->bind_mrs.load();
    ASSERT_EQ(ote_verbs_fault_destroy_busy(vs_, OTE_VERBS_FAULT_OP_DEREG_MR, mr, 1), OTE_OK);
    {
        ote_test::ErrorLogsExpected guard;
        EXPECT_EQ(ote_engine_destroy(src_), OTE_ERR_RETAINED);
        EXPECT_GE(guard.Seen(), 1u);
    }
    EXPECT_EQ(ote_verbs_fault_injected(vs_, OTE_VERBS_FAULT_OP_DEREG_MR), 1u);
    EXPECT_EQ(ns_->bind_mrs.load(), alive) << "the chunk's MR stays registered";
    EXPECT_FALSE(ns_->closed.load());
    EXPECT_EQ(ote_retained_total(), retained0 + 1);
    EXPECT_EQ(ote_engine_destroy(src_), OTE_OK);
    src_ = nullptr;
    EXPECT_EQ(ote_retained_total(), retained0);
    EXPECT_EQ(ns_->bind_mrs.load(), 0);
    EXPECT_TRUE(ns_->closed.load());
}

void WaitCopies(GpuRdmaStageTest *t, uint64_t n) {
    ote_test::WaitUntil([&] { return t->SrcCopies() == n; }, ote_cuda_test::kLongWait,
                        std::to_string(n) + " source copies running");
}

} // namespace

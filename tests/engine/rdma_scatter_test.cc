// tests/engine/rdma_scatter_test.cc - GPUDirect safe on mlx5 (issue 25): on a device that
// scatters small READ responses into CQEs (the sim's mlx5 profile, libmlx5's default), the
// QPs that post RDMA READs are created with OTE_VERBS_QP_NO_SCATTER_TO_CQE when device
// memory may be their destination (gpu_paths has "direct"), and no other QP is: not the
// requester's WRITE QPs, not the source's QPs, not the QPs of an engine without "direct",
// not any QP of a device that does not scatter (rxe). Every QP the engines make goes
// through a counting provider (native_counter.h) that logs its create flags and the
// opcodes it posted; a small READ (1 to 64 bytes) into device memory completes with its
// bytes right (the sim fails it loudly on a QP without the flag).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tests/engine/engine_util.h"
#include "tests/engine/gpu_fixture.h"
#include "tests/engine/native_counter.h"
#include "tests/engine/pattern.h"

extern "C" {
#include "engine/rdma/test_hook.h"
#include "ote/ote.h"
#include "verbs/verbs.h"
}

namespace {

using ote_gpu_test::RdmaGpuEngine;
using ote_test::kSec;
using ote_test::NativeCounter;

std::vector<ote_verbs_t *> *g_wrapped = nullptr;
std::vector<std::unique_ptr<NativeCounter>> *g_owned = nullptr;
ote_status_t Wrap(ote_verbs_t **v) { return ote_test::WrapCounted(v, g_owned, g_wrapped); }

constexpr size_t kLen = 4 << 20;
constexpr size_t kTotal = 1 + 63 + 64 + 65 + (1 << 20); // the bytes of each phase

// The QPs a counter logged from index from on: how many, how many carry the flag, and how
// many break the rule (a READ posted on a QP without it, a WRITE on one with it).
struct Census {
    size_t qps = 0, flagged = 0, reader_not_flagged = 0, writer_flagged = 0;
};

Census Count(NativeCounter *n, size_t from = 0) {
    Census c;
    std::vector<NativeCounter::QpSeen> log = n->QpLog();
    for (size_t i = from; i < log.size(); i++) {
        bool flag = (log[i].flags & OTE_VERBS_QP_NO_SCATTER_TO_CQE) != 0;
        c.qps++;
        c.flagged += flag;
        c.reader_not_flagged += !flag && log[i].reads > 0;
        c.writer_flagged += flag && log[i].writes > 0;
    }
    return c;
}

enum Expect { kNone, kAll };

class RdmaScatterTest : public ote_gpu_test::GpuTest {
  protected:
    void TearDown() override {
        ote__rdma_test_verbs_hook = nullptr;
        ote_gpu_test::GpuTest::TearDown();
    }
    // An engine on profile's devices with gpu_paths, its provider counted (its counter:
    // the one appended to owned_ while it was made).
    ote_engine_t *Engine(const char *profile, const char *gpu_paths, NativeCounter **counter) {
        g_wrapped = &wrapped_;
        g_owned = &owned_;
        ote__rdma_test_verbs_hook = Wrap;
        size_t before = owned_.size();
        ote_engine_t *e = RdmaGpuEngine(gpu_paths, {{"sim_profile", profile}});
        ote__rdma_test_verbs_hook = nullptr;
        *counter = owned_.size() > before ? owned_.back().get() : nullptr;
        return e;
    }
    // Runs fn (one kind of request between the engines), then checks the QPs each engine
    // made meanwhile: at least one (the requester's, when req_new), and flagged all or
    // none as expected.
    static void Phase(const char *what, NativeCounter *req, Expect req_flags, NativeCounter *src,
                      Expect src_flags, const std::function<void()> &fn) {
        SCOPED_TRACE(what);
        size_t r0 = req->QpLog().size(), s0 = src->QpLog().size();
        fn();
        Census r = Count(req, r0), s = Count(src, s0);
        EXPECT_GT(r.qps, 0u) << "the requester made no QP";
        EXPECT_GT(s.qps, 0u) << "the source made no QP";
        EXPECT_EQ(r.flagged, req_flags == kAll ? r.qps : 0u) << "requester's QPs";
        EXPECT_EQ(s.flagged, src_flags == kAll ? s.qps : 0u) << "source's QPs";
    }
    // Between engine a (counter na, a device buffer) and engine b (nb, host memory), each
    // request kind in a phase of its own, every byte checked: a READs into its device
    // memory (its READ QPs: flag where flag_reads; b's source QPs: none), a WRITEs from
    // its device memory (its WRITE QPs: none), b READs a's device memory into host memory
    // (b's READ QPs, plain and direct: flag where flag_reads; a's source QPs: none), b
    // WRITEs into a's device memory (none). Sizes 1, 63, 64, 65 bytes (a small READ
    // response is what mlx5 scatters into the CQE) and 1 MiB.
    void Phases(ote_engine_t *a, NativeCounter *na, ote_engine_t *b, NativeCounter *nb,
                Expect flag_reads) {
        uint64_t dev = DevAlloc(kLen);
        ASSERT_NE(dev, 0u);
        ASSERT_EQ(ote_memory_register(a, reinterpret_cast<void *>(dev), kLen,
                                      OTE_PERM_READ | OTE_PERM_WRITE),
                  OTE_OK);
        std::vector<uint8_t> host(kLen), back(kLen, 0);
        ote_pattern_fill(host.data(), kLen, 7, 0);
        ASSERT_EQ(ote_memory_register(b, host.data(), kLen, OTE_PERM_READ | OTE_PERM_WRITE),
                  OTE_OK);
        ASSERT_EQ(ote_memory_register(b, back.data(), kLen, OTE_PERM_READ | OTE_PERM_WRITE),
                  OTE_OK);
        ote_segment_t *ab = nullptr, *ba = nullptr;
        OpenSegment(a, b, &ab);
        OpenSegment(b, a, &ba);
        ASSERT_NE(ab, nullptr);
        ASSERT_NE(ba, nullptr);
        // Each kind of request: 1, 63, 64, 65 bytes and 1 MiB back to back, kTotal bytes
        // from the bases given (engine e, segment g).
        auto each = [&](ote_engine_t *e, ote_segment_t *g, ote_opcode_t op, uint64_t local,
                        uint64_t remote) {
            uint64_t off = 0;
            for (size_t len : {size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{1} << 20}) {
                ote_request_t r = {op, reinterpret_cast<void *>(local + off), g, remote + off, len};
                ote_transfer_status_t ts{};
                EXPECT_EQ(ote_test::RunOne(e, r, 60 * kSec, &ts), OTE_OK) << len;
                off += len;
            }
        };
        const uint64_t h = reinterpret_cast<uint64_t>(host.data());
        const uint64_t k = reinterpret_cast<uint64_t>(back.data());
        auto same = [](const uint8_t *x, const uint8_t *y) { return memcmp(x, y, kTotal) == 0; };
        Phase("a READs into device memory", na, flag_reads, nb, kNone, [&] {
            each(a, ab, OTE_READ, dev, h);
            EXPECT_TRUE(same(DevRead(dev, kTotal).data(), host.data()));
        });
        Phase("a WRITEs from device memory", na, kNone, nb, kNone, [&] {
            each(a, ab, OTE_WRITE, dev, k);
            EXPECT_TRUE(same(back.data(), host.data()));
        });
        std::fill(back.begin(), back.end(), 0);
        Phase("b READs the peer's device memory", nb, flag_reads, na, kNone, [&] {
            each(b, ba, OTE_READ, k, dev);
            EXPECT_TRUE(same(back.data(), host.data()));
        });
        ote_pattern_fill(back.data(), kLen, 9, 0);
        Phase("b WRITEs into the peer's device memory", nb, kNone, na, kNone, [&] {
            each(b, ba, OTE_WRITE, k, dev);
            EXPECT_TRUE(same(DevRead(dev, kTotal).data(), back.data()));
        });
        // Over the whole run: no READ on a QP without the flag where it is due, no
        // WRITE on one with it.
        for (NativeCounter *n : {na, nb}) {
            Census c = Count(n);
            EXPECT_EQ(c.reader_not_flagged, flag_reads == kAll ? 0u : c.reader_not_flagged);
            EXPECT_EQ(c.writer_flagged, 0u);
        }
        EXPECT_EQ(ote_segment_close(ab), OTE_OK);
        EXPECT_EQ(ote_segment_close(ba), OTE_OK);
        EXPECT_EQ(ote_test::UnregisterWhenFree(b, host.data()), OTE_OK);
        EXPECT_EQ(ote_test::UnregisterWhenFree(b, back.data()), OTE_OK);
        EXPECT_EQ(ote_test::UnregisterWhenFree(a, reinterpret_cast<void *>(dev)), OTE_OK);
    }
    std::vector<ote_verbs_t *> wrapped_;
    std::vector<std::unique_ptr<NativeCounter>> owned_;
};

// mlx5 with "direct" on both engines: the flag is on exactly the QPs of the requester's
// READ endpoints (plain and direct), made while READs ran, and on no other QP.
TEST_F(RdmaScatterTest, Mlx5DirectFlagsExactlyTheReadQps) {
    NativeCounter *na = nullptr, *nb = nullptr;
    ote_engine_t *a = Engine("mlx5", "direct,staging", &na);
    ASSERT_NE(a, nullptr);
    ote_engine_t *b = Engine("mlx5", "direct,staging", &nb);
    ASSERT_NE(b, nullptr);
    ASSERT_NE(na, nullptr);
    ASSERT_NE(nb, nullptr);
    Phases(a, na, b, nb, kAll);
    EXPECT_EQ(ote_engine_destroy(a), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(b), OTE_OK);
}

// Without "direct" no READ lands in device memory through the NIC (staging bounces are
// host memory): no QP is flagged, on mlx5 too; on rxe (no scatter to CQE) none is, even
// with "direct". The bytes move all the same.
TEST_F(RdmaScatterTest, NoFlagWithoutDirectOrWithoutScatter) {
    for (auto pg : {std::make_pair("mlx5", "staging"), std::make_pair("rxe", "direct,staging")}) {
        SCOPED_TRACE(std::string(pg.first) + " gpu_paths " + pg.second);
        NativeCounter *na = nullptr, *nb = nullptr;
        ote_engine_t *a = Engine(pg.first, pg.second, &na);
        ASSERT_NE(a, nullptr);
        ote_engine_t *b = Engine(pg.first, pg.second, &nb);
        ASSERT_NE(b, nullptr);
        ASSERT_NE(na, nullptr);
        ASSERT_NE(nb, nullptr);
        Phases(a, na, b, nb, kNone);
        EXPECT_EQ(ote_engine_destroy(a), OTE_OK);
        EXPECT_EQ(ote_engine_destroy(b), OTE_OK);
    }
}

} // namespace

// tests/engine/gpu_direct_proc_test.cc - GPUDirect RDMA source grants between two
// processes over verbs/sim with the fake libcuda: ote_gpu_target (gpu_paths "direct") in a
// child process serves its device memory ("dev", registered with its dma-buf, which its
// own sim maps) by exact-range MRs to this process's requester, READ and WRITE, with
// device and host memory here, 1 byte to 4 MiB at unaligned offsets; every byte, and the
// target's bytes around each WRITE, checked through the drivers of both processes; the
// path asserted by the requester's redirects followed and the target's staged copies
// (none). The target SIGKILLed while a request is on its direct slot: the request fails
// OTE_ERR_PEER_LOST well within its deadline, and a new target serves the same way.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/engine/engine_util.h"
#include "tests/engine/gpu_fixture.h"
#include "tests/engine/native_counter.h"
#include "tests/engine/target.h"
#include "tests/util/wait.h"

extern "C" {
#include "engine/rdma/test_hook.h"
#include "ote/ote.h"
#include "tests/engine/pattern.h"
#include "verbs/fault.h"
}

namespace {

using ote_gpu_test::Hex;
using ote_gpu_test::Num;
using ote_gpu_test::PatternHash;
using ote_test::kSec;
using ote_test::Target;

constexpr uint64_t kLen = (4ull << 20) + 8192; // each of the target's buffers

std::vector<ote_verbs_t *> *g_wrapped = nullptr;
std::vector<std::unique_ptr<ote_test::NativeCounter>> *g_owned = nullptr;
ote_status_t Wrap(ote_verbs_t **v) { return ote_test::WrapCounted(v, g_owned, g_wrapped); }

class GpuDirectProcTest : public ote_gpu_test::GpuTest {
  protected:
    void TearDown() override {
        if (seg_ != nullptr) {
            EXPECT_EQ(ote_segment_close(seg_), OTE_OK);
        }
        seg_ = nullptr;
        if (req_ != nullptr) {
            if (ldev_ != 0) {
                EXPECT_EQ(ote_memory_unregister(req_, reinterpret_cast<void *>(ldev_)), OTE_OK);
            }
            EXPECT_EQ(ote_engine_destroy(req_), OTE_OK);
        }
        req_ = nullptr;
        GpuTest::TearDown();
    }

    // The requester (gpu_paths "direct", its posts behind the verbs fault decorator) with
    // a registered device buffer of kLen bytes.
    void Requester() {
        g_wrapped = &wrapped_;
        g_owned = &owned_;
        ote__rdma_test_verbs_hook = Wrap;
        req_ = ote_gpu_test::RdmaGpuEngine("direct");
        ote__rdma_test_verbs_hook = nullptr;
        ASSERT_NE(req_, nullptr);
        ASSERT_EQ(wrapped_.size(), 1u);
        ldev_ = DevAlloc(kLen);
        ASSERT_NE(ldev_, 0u);
        ASSERT_EQ(ote_memory_register(req_, reinterpret_cast<void *>(ldev_), kLen,
                                      OTE_PERM_READ | OTE_PERM_WRITE),
                  OTE_OK);
    }
    // ote_gpu_target over rdma (sim) serving its device memory directly, and a segment
    // of the requester to it.
    void Source(Target &t) {
        std::vector<std::string> env = ote_test::kRdmaTargetEnv;
        env.push_back("OTE_GPU_PATHS=direct");
        ASSERT_TRUE(ote_gpu_test::StartGpuTarget(t, kLen, env));
        if (seg_ != nullptr) {
            EXPECT_EQ(ote_segment_close(seg_), OTE_OK);
        }
        ASSERT_NO_FATAL_FAILURE(OpenSegment(req_, t.address, &seg_));
    }
    ote__rdma_test_grants_t Grants() {
        ote__rdma_test_grants_t g{};
        EXPECT_EQ(ote__rdma_test_grants(ote_test::EngineAddress(req_).c_str(), &g), OTE_OK);
        return g;
    }
    // The target's staged copies (ote_engine_gpu_stats there).
    static uint64_t TargetStaged(Target &t) {
        unsigned long long staged = 0, ipc = 0;
        std::string r = t.Command("gpu");
        EXPECT_EQ(sscanf(r.c_str(), "GPU %llu %llu", &staged, &ipc), 2) << r;
        return staged;
    }

    // One request of len bytes between local (device memory here when dev, else host)
    // at offset loff and the target's "dev" at roff, bytes checked: a READ brings the
    // target's pattern (seed 700 + n), a WRITE leaves the local pattern there and the
    // target's bytes around the range as they were.
    void MoveAndCheck(Target &t, bool dev, ote_opcode_t op, uint64_t loff, uint64_t roff,
                      uint64_t len, uint64_t n) {
        SCOPED_TRACE(std::string(dev ? "device" : "host") + " local, " +
                     (op == OTE_READ ? "READ " : "WRITE ") + Num(len) + " at " + Num(roff));
        const uint64_t lseed = 600 + n, rseed = 700 + n;
        if (dev) {
            DevFill(ldev_, kLen, lseed);
        } else {
            ote_pattern_fill(host_.data(), kLen, lseed, 0);
        }
        ASSERT_EQ(t.Command("fill dev " + Num(rseed)), "OK");
        const uint64_t local = (dev ? ldev_ : reinterpret_cast<uintptr_t>(host_.data())) + loff;
        ote_request_t r = {op, reinterpret_cast<void *>(local), seg_, t.rw + roff, len};
        ote_transfer_status_t ts{};
        ASSERT_EQ(ote_test::RunOne(req_, r, 120 * kSec, &ts), OTE_OK) << ote_status_str(ts.error);
        EXPECT_EQ(ts.bytes_done, len);
        auto local_hash = [&](uint64_t off, uint64_t n_) {
            return dev ? DevHash(ldev_ + off, n_) : ote_hash(host_.data() + off, n_);
        };
        if (op == OTE_READ) {
            EXPECT_EQ(local_hash(loff, len), PatternHash(rseed, roff, len));
            EXPECT_EQ(local_hash(0, loff), PatternHash(lseed, 0, loff));
            EXPECT_EQ(local_hash(loff + len, kLen - loff - len),
                      PatternHash(lseed, loff + len, kLen - loff - len));
        } else {
            EXPECT_EQ(t.Command("sum dev " + Num(roff) + " " + Num(len)),
                      Hex(PatternHash(lseed, loff, len)));
            EXPECT_EQ(t.Command("sum dev 0 " + Num(roff)), Hex(PatternHash(rseed, 0, roff)));
            EXPECT_EQ(t.Command("sum dev " + Num(roff + len) + " " + Num(kLen - roff - len)),
                      Hex(PatternHash(rseed, roff + len, kLen - roff - len)));
        }
    }

    std::vector<ote_verbs_t *> wrapped_;
    std::vector<std::unique_ptr<ote_test::NativeCounter>> owned_;
    ote_engine_t *req_ = nullptr;
    ote_segment_t *seg_ = nullptr;
    uint64_t ldev_ = 0;
    std::vector<uint8_t> host_ = std::vector<uint8_t>(kLen);
};

// Device<->device and host<->device, READ and WRITE, 1 byte, an odd size and 4 MiB at
// unaligned offsets: every request served on a direct slot (redirected there, or sent
// there first in a range redirected before; the target staging nothing), bytes checked
// on both sides.
TEST_F(GpuDirectProcTest, DeviceMemoryOfAnotherProcessMovesDirectBothWays) {
    ASSERT_NO_FATAL_FAILURE(Requester());
    Target t;
    ASSERT_NO_FATAL_FAILURE(Source(t));
    struct Case {
        uint64_t len, loff, roff;
    };
    const Case cases[] = {{1, 0, 0}, {65537, 7, 4097}, {4ull << 20, 5, 13}};
    uint64_t n = 0;
    const uint64_t followed0 = Grants().direct_followed, recalled0 = Grants().direct_recalled;
    for (bool dev : {true, false}) {
        for (const Case &c : cases) {
            for (ote_opcode_t op : {OTE_READ, OTE_WRITE}) {
                ASSERT_NO_FATAL_FAILURE(MoveAndCheck(t, dev, op, c.loff, c.roff, c.len, ++n));
            }
        }
    }
    EXPECT_EQ(n, 12u);
    // Every request went to a direct slot: redirected there (its first run at least), or
    // sent there first (it starts in the remote range of a request redirected before);
    // the target never staged.
    const ote__rdma_test_grants_t g = Grants();
    EXPECT_GE(g.direct_followed - followed0, 1u);
    EXPECT_GE(g.direct_followed - followed0 + g.direct_recalled - recalled0, n);
    EXPECT_EQ(TargetStaged(t), 0u);
    EXPECT_EQ(ote_segment_close(seg_), OTE_OK);
    seg_ = nullptr;
    EXPECT_EQ(t.Quit(), 0);
}

// The target SIGKILLed while a READ of its device memory is on its direct slot (its
// exact MR live there, the requester's posts held back by a verbs delay until the target
// is stopped, then sent to it): the request fails OTE_ERR_PEER_LOST,
// not TIMEOUT (its deadline, transfer_timeout_ms 20 s, did not end it), and a new target
// serves device memory directly again, both ways.
TEST_F(GpuDirectProcTest, SourceKilledMidTransferPeerLostAndANewSourceWorks) {
    ASSERT_NO_FATAL_FAILURE(Requester());
    {
        Target t;
        ASSERT_NO_FATAL_FAILURE(Source(t));
        ASSERT_NO_FATAL_FAILURE(MoveAndCheck(t, true, OTE_READ, 0, 0, 4096, 1));
        ASSERT_EQ(ote_verbs_fault_delay(wrapped_[0], OTE_VERBS_FAULT_OP_POST_SEND, 30000), OTE_OK);
        ote_batch_t *b = nullptr;
        ASSERT_EQ(ote_batch_create(req_, 1, &b), OTE_OK);
        ote_request_t r = {OTE_READ, reinterpret_cast<void *>(ldev_), seg_, t.rw, 1 << 20};
        // Submitted on a thread of its own: the held post holds the grant layer's lock,
        // and the submit may itself start the grant whose answer brings that post (then
        // it returns only once the post goes on). Submitted here, it would wait out the
        // whole delay, past the request's deadline, with the target still serving.
        struct Submitter {
            ote_verbs_t *v;
            std::thread th;
            ~Submitter() { // a failed assertion below: the post goes on, the submit returns
                (void)ote_verbs_fault_delay(v, OTE_VERBS_FAULT_OP_POST_SEND, 0);
                if (th.joinable()) th.join();
            }
        } sub{wrapped_[0], {}};
        ote_status_t submitted = OTE_ERR_STATE;
        sub.th = std::thread([&] { submitted = ote_batch_submit(b, &r, 1); });
        // Until the target serves it by an exact MR (a direct grant live there); the
        // requester's held post then waits (its engine is not asked meanwhile: the post
        // holds its locks).
        bool bad_reply = false;
        ASSERT_TRUE(ote_test::WaitUntil(
            [&] {
                unsigned long long mrs = 0, served = 0, redirects = 0;
                std::string g = t.Command("grants");
                if (sscanf(g.c_str(), "GRANTS %llu %llu %llu", &mrs, &served, &redirects) != 3) {
                    ADD_FAILURE() << "the target answered " << g;
                    bad_reply = true;
                }
                return bad_reply || mrs > 0;
            },
            std::chrono::seconds(30), "a direct grant live at the target"));
        ASSERT_FALSE(bad_reply);
        // The target stopped, the held posts go on (to a peer that no longer answers),
        // then it dies with them in flight.
        ASSERT_TRUE(t.Stop());
        ASSERT_EQ(ote_verbs_fault_delay(wrapped_[0], OTE_VERBS_FAULT_OP_POST_SEND, 0), OTE_OK);
        t.Kill();
        sub.th.join();
        ASSERT_EQ(submitted, OTE_OK);
        EXPECT_NE(ote_batch_wait(b, 60 * kSec), OTE_OK);
        ote_transfer_status_t ts{};
        EXPECT_EQ(ote_batch_status(b, 0, &ts), OTE_OK);
        EXPECT_EQ(ts.state, OTE_TRANSFER_FAILED);
        EXPECT_EQ(ote_status_code(ts.error), OTE_ERR_PEER_LOST) << ote_status_str(ts.error);
        EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    }
    Target t2;
    ASSERT_NO_FATAL_FAILURE(Source(t2));
    ASSERT_NO_FATAL_FAILURE(MoveAndCheck(t2, true, OTE_WRITE, 3, 5, 54321, 2));
    ASSERT_NO_FATAL_FAILURE(MoveAndCheck(t2, false, OTE_READ, 5, 3, 54321, 3));
    EXPECT_EQ(TargetStaged(t2), 0u);
    EXPECT_EQ(ote_segment_close(seg_), OTE_OK);
    seg_ = nullptr;
    EXPECT_EQ(t2.Quit(), 0);
}

} // namespace

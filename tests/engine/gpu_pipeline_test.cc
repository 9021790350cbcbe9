// tests/engine/gpu_pipeline_test.cc - engine/gpu's staging pipeline alone, over the fake
// libcuda, with a stand-in transport (a thread that completes each submitted slice after
// a short pause, copying between the slice's chunk and a host buffer): every slice ends
// exactly once, at most gpu_staging_depth are in flight, bytes arrive where they belong,
// a driver fault on the async copy or the event query fails the request and the next one
// works, a cancel stops what is not staged, and no staging chunk or stream stays out
// (ote__gpu_stats, and the fake's live objects after destroy in TearDown).
#include <gtest/gtest.h>

#include <time.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "tests/cuda/cuda_test_util.h"
#include "tests/engine/pattern.h"

// engine/transport.h is C11: its slice's cancel flag is an _Atomic int. C++ sees it
// through a volatile int of the same size and alignment (the flag is only set here
// before the request is handed over, under engine/gpu's mutex).
#include <stdatomic.h>
#undef _Atomic
#define _Atomic volatile
extern "C" {
#include "cuda/memory/memory.h"
#include "engine/engine_internal.h"
#include "engine/gpu/gpu.h"
#include "ote/ote.h"
}
#undef _Atomic

namespace {

constexpr uint64_t kChunk = 64 << 10;
constexpr uint32_t kDepth = 3;

// The stand-in transport: slices queue here and a thread ends them.
struct Wire {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<ote__slice_t *> q;
    std::vector<uint8_t> remote; // the "peer's" memory
    std::atomic<int> inflight{0}, max_inflight{0}, submitted{0};
    std::atomic<ote_status_t> fail_with{OTE_OK}; // every slice ends with this when set
    bool stop = false;
    std::thread th;

    void Start() {
        th = std::thread([this] {
            std::unique_lock<std::mutex> l(mu);
            for (;;) {
                cv.wait(l, [this] { return stop || !q.empty(); });
                if (q.empty() && stop) return;
                ote__slice_t *s = q.front();
                q.pop_front();
                l.unlock();
                struct timespec ts = {0, 200 * 1000};
                nanosleep(&ts, nullptr);
                ote_status_t st = fail_with.load();
                if (st == OTE_OK) {
                    if (s->op == OTE__SLICE_WRITE)
                        memcpy(remote.data() + s->remote, s->local, s->len);
                    else memcpy(s->local, remote.data() + s->remote, s->len);
                }
                inflight--;
                s->done(s, st);
                l.lock();
            }
        });
    }
    void Stop() {
        {
            std::lock_guard<std::mutex> g(mu);
            stop = true;
        }
        cv.notify_all();
        th.join();
    }
    static void Submit(void *arg, ote__slice_t *s) {
        Wire *w = static_cast<Wire *>(arg);
        int now = ++w->inflight;
        int m = w->max_inflight.load();
        while (now > m && !w->max_inflight.compare_exchange_weak(m, now)) {}
        w->submitted++;
        {
            std::lock_guard<std::mutex> g(w->mu);
            w->q.push_back(s);
        }
        w->cv.notify_all();
    }
};

// One request's slices and their endings.
struct Req {
    std::vector<ote__slice_t> slices;
    std::vector<int> ends;
    std::vector<ote_status_t> st;
    std::mutex mu;
    std::condition_variable cv;
    size_t left = 0;
    volatile int canceled = 0;

    static void Done(ote__slice_t *s, ote_status_t st) {
        Req *r = static_cast<Req *>(s->owner);
        std::lock_guard<std::mutex> g(r->mu);
        size_t i = static_cast<size_t>(s - r->slices.data());
        r->ends[i]++;
        r->st[i] = st;
        if (--r->left == 0) r->cv.notify_all();
    }
    // ns slices of kChunk (the last shorter) of [dev, dev+len) against remote offset 0.
    void Build(uint16_t op, uint64_t dev, uint64_t len) {
        size_t ns = static_cast<size_t>((len + kChunk - 1) / kChunk);
        slices.assign(ns, ote__slice_t{});
        ends.assign(ns, 0);
        st.assign(ns, OTE_OK);
        left = ns;
        for (size_t i = 0; i < ns; i++) {
            ote__slice_t &s = slices[i];
            uint64_t off = i * kChunk;
            s.done = Done;
            s.owner = this;
            s.canceled = &canceled;
            s.local = reinterpret_cast<uint8_t *>(dev + off);
            s.remote = off;
            s.req_remote = 0;
            s.req_len = len;
            s.req_uid = 1;
            s.len = static_cast<uint32_t>(len - off < kChunk ? len - off : kChunk);
            s.op = op;
            s.deadline = ote_deadline_after(60ull * OTE_NSEC_PER_SEC);
        }
    }
    bool Wait() {
        std::unique_lock<std::mutex> l(mu);
        return cv.wait_for(l, std::chrono::seconds(60), [this] { return left == 0; });
    }
};

class GpuPipelineTest : public ote_cuda_test::CudaTest {
  protected:
    void SetUp() override {
        CudaTest::SetUp();
        if (IsSkipped() || HasFatalFailure()) return;
        if (!fake_.present()) GTEST_SKIP() << "drives the fake libcuda";
        ote__cfg_t cfg{};
        cfg.gpu_paths = OTE__GPU_PATH_STAGING;
        snprintf(cfg.gpu_paths_text, sizeof(cfg.gpu_paths_text), "staging");
        cfg.gpu_staging_chunk = kChunk;
        cfg.gpu_staging_depth = kDepth;
        ASSERT_EQ(ote__gpu_create(&cfg, &g_), OTE_OK);
        ASSERT_EQ(ote_cuda_alloc_create(dev_, kLen, 0, &alloc_), OTE_OK);
        d_ = ote_cuda_alloc_ptr(alloc_);
        uint32_t kind = 0;
        ASSERT_EQ(ote__gpu_classify(g_, d_, kLen, 0, &kind), OTE_OK);
        ASSERT_EQ(kind, static_cast<uint32_t>(OTE_MEM_CUDA));
        wire_.remote.assign(kLen, 0);
        wire_.Start();
    }
    void TearDown() override {
        if (g_ != nullptr) {
            wire_.Stop();
            ote__gpu_destroy(g_);
            g_ = nullptr;
        }
        if (alloc_ != nullptr) {
            EXPECT_EQ(ote_cuda_alloc_destroy(alloc_, ote_cuda_test::LongDeadline()), OTE_OK);
        }
        CudaTest::TearDown();
    }
    void DevFill(uint64_t seed) {
        std::vector<uint8_t> v(kLen);
        ote_pattern_fill(v.data(), kLen, seed, 0);
        ASSERT_EQ(t_->cuMemcpyHtoD(d_, v.data(), kLen), 0);
        ASSERT_EQ(t_->cuStreamSynchronize(nullptr), 0);
    }
    uint64_t DevHash() {
        std::vector<uint8_t> v(kLen);
        EXPECT_EQ(t_->cuStreamSynchronize(nullptr), 0);
        EXPECT_EQ(t_->cuMemcpyDtoH(v.data(), d_, kLen), 0);
        return ote_hash(v.data(), kLen);
    }
    static uint64_t PatternHash(uint64_t seed, uint64_t len) {
        std::vector<uint8_t> v(len);
        ote_pattern_fill(v.data(), len, seed, 0);
        return ote_hash(v.data(), len);
    }
    // Waits (generously) until nothing is parked or out of the pool.
    ote__gpu_stats_t Settled() {
        ote__gpu_stats_t s{};
        ote_test::WaitUntil(
            [&] {
                ote__gpu_stats(g_, &s);
                return s.parked == 0 && s.chunks_out == 0 && s.jobs_active == 0;
            },
            ote_cuda_test::kLongWait, "nothing parked, no chunk out, no job active");
        return s;
    }
    void ExpectEachEndedOnce(const Req &r) {
        for (size_t i = 0; i < r.ends.size(); i++) EXPECT_EQ(r.ends[i], 1) << "slice " << i;
    }

    static constexpr uint64_t kLen = 2 * 1024 * 1024 + 12345; // 33 slices, the last short
    ote__gpu_t *g_ = nullptr;
    ote_cuda_alloc_t *alloc_ = nullptr;
    uint64_t d_ = 0;
    Wire wire_;
};

TEST_F(GpuPipelineTest, WriteAndReadMoveEveryByteWithinDepth) {
    DevFill(5);
    Req w;
    w.Build(OTE__SLICE_WRITE, d_, kLen);
    ote__gpu_stage(g_, OTE_MEM_CUDA, w.slices.data(), w.slices.size(), Wire::Submit, &wire_);
    ASSERT_TRUE(w.Wait());
    ExpectEachEndedOnce(w);
    for (ote_status_t st : w.st) EXPECT_EQ(st, OTE_OK);
    EXPECT_EQ(ote_hash(wire_.remote.data(), kLen), PatternHash(5, kLen));
    // The slices came back as they were given (owner and device address restored).
    EXPECT_EQ(w.slices[1].owner, &w);
    EXPECT_EQ(reinterpret_cast<uint64_t>(w.slices[1].local), d_ + kChunk);

    ote_pattern_fill(wire_.remote.data(), kLen, 6, 0);
    Req r;
    r.Build(OTE__SLICE_READ, d_, kLen);
    ote__gpu_stage(g_, OTE_MEM_CUDA, r.slices.data(), r.slices.size(), Wire::Submit, &wire_);
    ASSERT_TRUE(r.Wait());
    ExpectEachEndedOnce(r);
    for (ote_status_t st : r.st) EXPECT_EQ(st, OTE_OK);
    EXPECT_EQ(DevHash(), PatternHash(6, kLen));
    EXPECT_LE(wire_.max_inflight.load(), static_cast<int>(kDepth));
    EXPECT_GE(wire_.max_inflight.load(), 1);
    ote__gpu_stats_t s = Settled();
    EXPECT_EQ(s.chunks_out, 0u);
    EXPECT_EQ(s.jobs_active, 0u);
}

// Faults on the async copies (the enqueue fails: the stream drains) and on the event
// query (unknown outcome: the stream and its chunk are parked until the driver answers):
// the request fails from that slice on, every slice ends once, the next request works,
// and nothing stays out of the pool or parked.
TEST_F(GpuPipelineTest, DriverFaultsFailOneRequestAndLeakNothing) {
    struct {
        const char *entry;
        uint16_t op;
        int result;
    } cases[] = {{"cuMemcpyDtoHAsync", OTE__SLICE_WRITE, 1},
                 {"cuMemcpyHtoDAsync", OTE__SLICE_READ, 1},
                 {"cuEventQuery", OTE__SLICE_WRITE, 999},
                 {"cuEventQuery", OTE__SLICE_READ, 999}};
    uint64_t seed = 20;
    for (const auto &c : cases) {
        SCOPED_TRACE(std::string(c.entry) + (c.op == OTE__SLICE_WRITE ? " WRITE" : " READ"));
        DevFill(seed);
        ote_pattern_fill(wire_.remote.data(), kLen, seed + 1, 0);
        fake_.fail(c.entry, 4, 1, c.result);
        Req f;
        f.Build(c.op, d_, kLen);
        auto run = [&] {
            ote__gpu_stage(g_, OTE_MEM_CUDA, f.slices.data(), f.slices.size(), Wire::Submit,
                           &wire_);
            ASSERT_TRUE(f.Wait());
        };
        if (c.result == 999) ExpectErrorLogsIn(run); // the retention is logged at ERROR
        else run();
        ExpectEachEndedOnce(f);
        size_t failed = 0;
        for (ote_status_t st : f.st) failed += st != OTE_OK;
        EXPECT_GT(failed, 0u);
        EXPECT_EQ(f.st.back() != OTE_OK, true) << "slices after the failure end with it";
        fake_.clear_faults();
        ote__gpu_stats_t s = Settled();
        EXPECT_EQ(s.parked, 0u);
        EXPECT_EQ(s.chunks_out, 0u);
        // The next request works.
        Req ok;
        ok.Build(c.op, d_, kLen);
        ote__gpu_stage(g_, OTE_MEM_CUDA, ok.slices.data(), ok.slices.size(), Wire::Submit, &wire_);
        ASSERT_TRUE(ok.Wait());
        for (ote_status_t st : ok.st) EXPECT_EQ(st, OTE_OK);
        if (c.op == OTE__SLICE_WRITE) {
            EXPECT_EQ(ote_hash(wire_.remote.data(), kLen), PatternHash(seed, kLen));
        } else {
            EXPECT_EQ(DevHash(), PatternHash(seed + 1, kLen));
        }
        seed += 2;
    }
    ote__gpu_stats_t s = Settled();
    EXPECT_EQ(s.chunks_out, 0u);
    EXPECT_EQ(s.parked, 0u);
}

// A canceled request stages nothing: no slice reaches the transport, each ends CANCELED.
// A transport failure ends the request's remaining slices with it.
TEST_F(GpuPipelineTest, CancelAndTransportFailureEndEverySlice) {
    Req c;
    c.Build(OTE__SLICE_READ, d_, kLen);
    c.canceled = 1;
    int before = wire_.submitted.load();
    ote__gpu_stage(g_, OTE_MEM_CUDA, c.slices.data(), c.slices.size(), Wire::Submit, &wire_);
    ASSERT_TRUE(c.Wait());
    ExpectEachEndedOnce(c);
    for (ote_status_t st : c.st) EXPECT_EQ(st, OTE_ERR_CANCELED);
    EXPECT_EQ(wire_.submitted.load(), before);

    DevFill(9);
    wire_.fail_with = OTE_ERR_PEER_LOST;
    Req f;
    f.Build(OTE__SLICE_READ, d_, kLen);
    ote__gpu_stage(g_, OTE_MEM_CUDA, f.slices.data(), f.slices.size(), Wire::Submit, &wire_);
    ASSERT_TRUE(f.Wait());
    ExpectEachEndedOnce(f);
    for (ote_status_t st : f.st) EXPECT_EQ(st, OTE_ERR_PEER_LOST);
    EXPECT_LE(wire_.submitted.load() - before, static_cast<int>(kDepth) + 1);
    EXPECT_EQ(DevHash(), PatternHash(9, kLen)) << "a failed READ wrote into the device";
    wire_.fail_with = OTE_OK;
    ote__gpu_stats_t s = Settled();
    EXPECT_EQ(s.chunks_out, 0u);
}

} // namespace

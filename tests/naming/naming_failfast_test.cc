// tests/naming/naming_failfast_test.cc - fail-fast of segments opened by name
// (ote_naming_segment_open, ote_segment_invalidate): a publisher that hangs (SIGSTOP: its
// sockets stay open, so no transport notices by itself) or is replaced by another
// incarnation ends the requests in flight to it OTE_ERR_PEER_LOST through the name's watch,
// long before their own deadline, and later submits fail at once. Each case runs on both
// stores (real etcd and redis-server) and over tcp, shm and rdma (verbs sim).
#include <gtest/gtest.h>

#include <signal.h>
#include <string.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "tests/naming/servers.h"
#include "tests/util/test_base.h"
#include "tests/util/wait.h"

namespace ote_test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

// The requests' own deadline: far past anything the cases wait for.
constexpr int kTransferTimeoutMs = 120000;

class FailFastTest : public OteTest,
                     public ::testing::WithParamInterface<std::tuple<const char *, const char *>> {
  protected:
    void SetUp() override {
        OteTest::SetUp();
        const char *bin = IsEtcd() ? "etcd" : "redis-server";
        if (!HaveBinary(bin)) GTEST_SKIP() << bin << " is not installed (scripts/deps.sh)";
        ASSERT_TRUE(IsEtcd() ? StartEtcd(1, &etcd_, &url_) : StartRedis(&redis_, &url_));
    }
    void TearDown() override {
        etcd_.clear();
        redis_.Stop();
        OteTest::TearDown();
    }
    bool IsEtcd() const { return strcmp(std::get<0>(GetParam()), "etcd") == 0; }
    std::string Transport() const { return std::get<1>(GetParam()); }
    ote_naming_t *Open() {
        ote_naming_opts_t o = {};
        o.timeout_ms = 1000;
        o.watch_period_ms = 100;
        ote_naming_t *n = nullptr;
        EXPECT_EQ(ote_naming_open(url_.c_str(), &o, &n), OTE_OK);
        return n;
    }
    // The requester: the transport under test only, with a long request deadline.
    ote_engine_t *Requester() {
        ote_config_t *cfg = nullptr;
        if (ote_config_create(&cfg) != OTE_OK) return nullptr;
        ote_engine_t *e = nullptr;
        bool ok = ote_config_set(cfg, "transports", Transport().c_str()) == OTE_OK &&
                  ote_config_set(cfg, "listen_address", "127.0.0.1:0") == OTE_OK &&
                  ote_config_set(cfg, "connect_timeout_ms", "2000") == OTE_OK &&
                  ote_config_set(cfg, "transfer_timeout_ms",
                                 std::to_string(kTransferTimeoutMs).c_str()) == OTE_OK &&
                  (Transport() != "rdma" || ote_config_set(cfg, "verbs_provider", "sim") == OTE_OK);
        if (!ok || ote_engine_create(cfg, &e) != OTE_OK) e = nullptr;
        ote_config_destroy(cfg);
        return e;
    }
    // Open decode-3 by name over the transport under test and read it once.
    ote_segment_t *OpenAndRead(ote_naming_t *n, ote_engine_t *req, uint64_t *kv) {
        ote_segment_t *seg = nullptr;
        EXPECT_EQ(ote_naming_segment_open(n, req, "decode-3", &seg), OTE_OK);
        if (seg == nullptr) return nullptr;
        ote_segment_info_t info = {};
        EXPECT_EQ(ote_segment_info(seg, &info), OTE_OK);
        EXPECT_EQ(std::string(info.transport), Transport());
        *kv = RemoteKv(seg);
        EXPECT_NE(*kv, 0u);
        std::vector<uint8_t> got(4096);
        EXPECT_EQ(ReadOnce(req, seg, got.data(), *kv, got.size()), OTE_OK);
        EXPECT_EQ(got[0], 0x33);
        return seg;
    }

    std::vector<ServerProc> etcd_;
    ServerProc redis_;
    std::string url_;
};

// A READ of the whole kv buffer in flight to a publisher that `freeze` stopped;
// `trigger` then makes its name end or move on (or nothing: the lease ends by itself).
// The READ must end PEER_LOST, long before its own deadline (also after a close of the
// segment was refused meanwhile), and a later submit on the segment must fail PEER_LOST
// at once. Returns how long the READ took.
long long InFlightEndsPeerLost(ote_naming_t *n, ote_engine_t *req, ote_segment_t *seg, uint64_t kv,
                               const std::function<bool()> &freeze,
                               const std::function<void()> &trigger) {
    std::vector<uint8_t> got(1u << 20);
    ote_batch_t *b = nullptr;
    EXPECT_EQ(ote_batch_create(req, 2, &b), OTE_OK);
    ote_request_t r = {OTE_READ, got.data(), seg, kv, got.size()};
    EXPECT_TRUE(freeze());
    auto t0 = Clock::now();
    EXPECT_EQ(ote_batch_submit(b, &r, 1), OTE_OK);
    // Still in flight: the frozen peer answers nothing and the transport sees no loss.
    EXPECT_EQ(ote_batch_wait(b, 300000000ull), OTE_ERR_TIMEOUT);
    // A close refused while it is in flight leaves the segment open and still guarded.
    EXPECT_EQ(ote_naming_segment_close(n, seg), OTE_ERR_BUSY);
    trigger();
    // Generous: the watch's reaction is a lease ttl plus polls, far under the deadline.
    ote_status_t st = ote_batch_wait(b, 60000000000ull);
    long long took = std::chrono::duration_cast<milliseconds>(Clock::now() - t0).count();
    EXPECT_EQ(ote_status_code(st), OTE_ERR_PEER_LOST) << ote_status_str(st);
    ote_transfer_status_t ts = {};
    EXPECT_EQ(ote_batch_status(b, 0, &ts), OTE_OK);
    EXPECT_EQ(ts.state, OTE_TRANSFER_FAILED);
    EXPECT_EQ(ote_status_code(ts.error), OTE_ERR_PEER_LOST);
    EXPECT_LT(took, kTransferTimeoutMs / 2) << "it ended at its deadline, not by the watch";
    // Later submits fail at once, with the same status.
    EXPECT_EQ(ote_batch_reset(b), OTE_OK);
    EXPECT_EQ(ote_status_code(ote_batch_submit(b, &r, 1)), OTE_ERR_PEER_LOST);
    EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    return took;
}

// The publisher hangs: its lease ends with its ttl, the watch sees the name gone, and the
// request in flight to it ends PEER_LOST.
TEST_P(FailFastTest, HungPublisherLeaseEnds) {
    ErrorLogsExpected quiet; // the frozen peer's connections may log as they are dropped
    const int ttl_ms = 2000;
    Publisher pub;
    ASSERT_TRUE(pub.Start(url_, "decode-3", ttl_ms, 0x33, "", Transport()));
    ote_engine_t *req = Requester();
    ASSERT_NE(req, nullptr);
    ote_naming_t *n = Open();
    ASSERT_NE(n, nullptr);
    uint64_t kv = 0;
    ote_segment_t *seg = OpenAndRead(n, req, &kv);
    ASSERT_NE(seg, nullptr);
    long long took = InFlightEndsPeerLost(
        n, req, seg, kv, [&] { return pub.Freeze(); }, [] {});
    printf(
        "[ figures ] naming %s/%s: a READ to a hung publisher ended PEER_LOST after %lld ms "
        "(ttl %d ms, deadline %d ms)\n",
        std::get<0>(GetParam()), Transport().c_str(), took, ttl_ms, kTransferTimeoutMs);
    EXPECT_EQ(ote_naming_segment_close(n, seg), OTE_OK);
    pub.Kill();
    EXPECT_EQ(ote_naming_close(n), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
}

// The name is published again by another incarnation (a new engine, a new epoch) while
// the old one hangs with its lease still alive: the watch sees the change, and the
// request in flight to the old one ends PEER_LOST; a new open by name reaches the new one.
TEST_P(FailFastTest, RepublishedWithNewEpoch) {
    ErrorLogsExpected quiet;
    auto a = std::make_unique<Publisher>();
    ASSERT_TRUE(a->Start(url_, "decode-3", 60000, 0x33, "", Transport()));
    ote_engine_t *req = Requester();
    ASSERT_NE(req, nullptr);
    ote_naming_t *n = Open();
    ASSERT_NE(n, nullptr);
    uint64_t kv = 0;
    ote_segment_t *seg = OpenAndRead(n, req, &kv);
    ASSERT_NE(seg, nullptr);
    auto b = std::make_unique<Publisher>();
    long long took = InFlightEndsPeerLost(
        n, req, seg, kv, [&] { return a->Freeze(); },
        [&] { ASSERT_TRUE(b->Start(url_, "decode-3", 60000, 0x44, "", Transport())); });
    printf(
        "[ figures ] naming %s/%s: a READ to a hung publisher replaced by a new epoch ended "
        "PEER_LOST after %lld ms (its lease 60000 ms, deadline %d ms)\n",
        std::get<0>(GetParam()), Transport().c_str(), took, kTransferTimeoutMs);
    EXPECT_EQ(ote_naming_segment_close(n, seg), OTE_OK);
    ote_segment_t *seg2 = nullptr;
    ASSERT_EQ(ote_naming_segment_open(n, req, "decode-3", &seg2), OTE_OK);
    uint64_t kv2 = RemoteKv(seg2);
    ASSERT_NE(kv2, 0u);
    std::vector<uint8_t> got(4096);
    EXPECT_EQ(ReadOnce(req, seg2, got.data(), kv2, got.size()), OTE_OK);
    EXPECT_EQ(got[0], 0x44);
    EXPECT_EQ(ote_naming_segment_close(n, seg2), OTE_OK);
    a->Kill();
    EXPECT_EQ(ote_naming_close(n), OTE_OK);
    b.reset();
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
}

// ote_segment_invalidate itself on a segment whose peer still runs: its submits and
// notifications fail PEER_LOST, it closes, and a new segment to the same peer works.
TEST_P(FailFastTest, InvalidateLiveSegment) {
    Publisher pub;
    ASSERT_TRUE(pub.Start(url_, "decode-3", 10000, 0x33, "", Transport()));
    ote_engine_t *req = Requester();
    ASSERT_NE(req, nullptr);
    ote_naming_t *n = Open();
    ASSERT_NE(n, nullptr);
    uint64_t kv = 0;
    ote_segment_t *seg = OpenAndRead(n, req, &kv);
    ASSERT_NE(seg, nullptr);
    EXPECT_EQ(ote_segment_invalidate(nullptr), OTE_ERR_INVALID);
    {
        ErrorLogsExpected quiet;
        EXPECT_EQ(ote_segment_invalidate(seg), OTE_OK);
        EXPECT_EQ(ote_segment_invalidate(seg), OTE_OK); // again: no change
    }
    std::vector<uint8_t> got(4096);
    EXPECT_EQ(ote_status_code(ReadOnce(req, seg, got.data(), kv, got.size())), OTE_ERR_PEER_LOST);
    EXPECT_EQ(ote_status_code(ote_notify_send(req, seg, "x", 1)), OTE_ERR_PEER_LOST);
    EXPECT_EQ(ote_naming_segment_close(n, seg), OTE_OK);
    ote_segment_t *seg2 = nullptr;
    ASSERT_EQ(ote_naming_segment_open(n, req, "decode-3", &seg2), OTE_OK);
    EXPECT_EQ(ReadOnce(req, seg2, got.data(), kv, got.size()), OTE_OK);
    EXPECT_EQ(got[0], 0x33);
    EXPECT_EQ(ote_naming_segment_close(n, seg2), OTE_OK);
    EXPECT_EQ(ote_naming_close(n), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
}

// A segment opened by name and closed with plain ote_segment_close: the close hook takes
// its guard away, so when the name then ends nothing touches the freed segment (ASan would
// see it) and no invalidation is logged for it; a second watch of the same name on the
// same handle shows the name did end and was polled.
TEST_P(FailFastTest, PlainCloseEndsTheWatch) {
    ErrorLogsExpected quiet; // the killed publisher's connections may log as they drop
    Publisher pub;
    ASSERT_TRUE(pub.Start(url_, "decode-3", 2000, 0x33, "", Transport()));
    ote_engine_t *req = Requester();
    ASSERT_NE(req, nullptr);
    ote_naming_t *n = Open();
    ASSERT_NE(n, nullptr);
    uint64_t kv = 0;
    ote_segment_t *seg = OpenAndRead(n, req, &kv);
    ASSERT_NE(seg, nullptr);
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    struct Seen {
        std::atomic<int> gone{0}, invalidations{0};
    } seen;
    ASSERT_EQ(
        ote_log_set_callback(
            [](void *arg, ote_log_level_t, const char *component, const char *, const char *msg) {
                if (strcmp(component, "naming") == 0 && strstr(msg, "PEER_LOST") != nullptr)
                    static_cast<Seen *>(arg)->invalidations++;
            },
            &seen),
        OTE_OK);
    ote_naming_watch_t *w = nullptr;
    ASSERT_EQ(ote_naming_watch(
                  n, "decode-3",
                  [](void *arg, const char *, ote_naming_event_t ev, const ote_naming_entry_t *) {
                      if (ev == OTE_NAMING_GONE) static_cast<Seen *>(arg)->gone++;
                  },
                  &seen, &w),
              OTE_OK);
    pub.Kill(); // its lease ends with its ttl
    EXPECT_TRUE(WaitUntil([&] { return seen.gone.load() > 0; }, seconds(30), "the name ends"));
    std::this_thread::sleep_for(milliseconds(500)); // a few more watch passes
    EXPECT_EQ(ote_log_set_callback(nullptr, nullptr), OTE_OK);
    EXPECT_EQ(seen.invalidations.load(), 0) << "a closed segment's guard still watched its name";
    EXPECT_EQ(ote_naming_unwatch(w), OTE_OK);
    EXPECT_EQ(ote_naming_close(n), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
}

std::string CaseName(const ::testing::TestParamInfo<std::tuple<const char *, const char *>> &info) {
    return std::string(std::get<0>(info.param)) + "_" + std::get<1>(info.param);
}

INSTANTIATE_TEST_SUITE_P(StoresTransports, FailFastTest,
                         ::testing::Combine(::testing::Values("etcd", "redis"),
                                            ::testing::Values("tcp", "shm", "rdma")),
                         CaseName);

} // namespace
} // namespace ote_test

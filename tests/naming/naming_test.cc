// tests/naming/naming_test.cc - <ote/naming.h> against real servers on loopback: etcd
// (Debian's etcd-server, v3 JSON gateway) and redis-server, started by the test with free
// ports and temporary data directories. Each case runs on both stores.
#include <gtest/gtest.h>

#include <signal.h>
#include <string.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/naming/servers.h"
#include "tests/util/test_base.h"
#include "tests/util/wait.h"

extern "C" {
#include "base/alloc.h"
#include "naming/naming_internal.h"
}

namespace ote_test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

class NamingTest : public OteTest, public ::testing::WithParamInterface<const char *> {
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
    bool IsEtcd() const { return strcmp(GetParam(), "etcd") == 0; }
    ServerProc &Store() { return IsEtcd() ? etcd_[0] : redis_; }
    ote_naming_t *Open(uint32_t cache_ms = 0, uint32_t ttl_ms = 0, uint32_t timeout_ms = 1000) {
        ote_naming_opts_t o = {};
        o.cache_ms = cache_ms;
        o.ttl_ms = ttl_ms;
        o.timeout_ms = timeout_ms;
        o.watch_period_ms = 100;
        ote_naming_t *n = nullptr;
        EXPECT_EQ(ote_naming_open(url_.c_str(), &o, &n), OTE_OK);
        return n;
    }
    // A store handle of the kind under test, for writing raw values.
    void RawPut(const char *key, const uint8_t *val, size_t len) {
        void *st = nullptr;
        const ote__nstore_ops_t *ops = IsEtcd() ? &ote__etcd_ops : &ote__redis_ops;
        std::string hosts = url_.substr(url_.find("://") + 3);
        ASSERT_EQ((IsEtcd() ? ote__etcd_open : ote__redis_open)(hosts.c_str(), 1000, &st), OTE_OK);
        uint64_t lease = 0;
        EXPECT_EQ(ops->put(st, key, val, len, 5000, &lease), OTE_OK);
        ops->close(st);
    }

    std::vector<ServerProc> etcd_;
    ServerProc redis_;
    std::string url_;
};

// What a watch saw, in order.
struct Events {
    std::mutex mu;
    std::vector<std::pair<ote_naming_event_t, uint64_t>> seen;
    static void Fn(void *arg, const char *, ote_naming_event_t ev, const ote_naming_entry_t *e) {
        auto *self = static_cast<Events *>(arg);
        std::lock_guard<std::mutex> g(self->mu);
        self->seen.emplace_back(ev, e != nullptr ? e->epoch : 0);
    }
    bool Has(ote_naming_event_t ev, uint64_t epoch = 0) {
        std::lock_guard<std::mutex> g(mu);
        for (auto &s : seen)
            if (s.first == ev && (epoch == 0 || s.second == epoch)) return true;
        return false;
    }
    // A GONE after an UP: a watch's first poll reports GONE when it comes before the
    // publish, so "any GONE" would not show that the watch saw the name end.
    bool GoneAfterUp() {
        std::lock_guard<std::mutex> g(mu);
        bool up = false;
        for (auto &s : seen) {
            up = up || s.first == OTE_NAMING_UP;
            if (up && s.first == OTE_NAMING_GONE) return true;
        }
        return false;
    }
};

uint64_t EpochOf(ote_engine_t *e) {
    std::vector<uint8_t> md(1 << 16);
    size_t len = 0;
    char addr[300];
    uint64_t epoch = 0;
    EXPECT_EQ(ote_engine_metadata(e, md.data(), md.size(), &len), OTE_OK);
    EXPECT_EQ(ote_engine_metadata_peer(md.data(), len, addr, sizeof(addr), &epoch), OTE_OK);
    return epoch;
}

TEST_P(NamingTest, PublishResolveListWatchUnpublish) {
    ote_engine_t *src = LoopbackEngine();
    ote_engine_t *req = LoopbackEngine();
    ASSERT_NE(src, nullptr);
    ASSERT_NE(req, nullptr);
    std::vector<uint8_t> kv(4096, 0x5a);
    ASSERT_EQ(ote_memory_register_named(src, kv.data(), kv.size(), OTE_PERM_READ, "kv"), OTE_OK);
    ote_naming_t *n = Open();
    ASSERT_NE(n, nullptr);
    Events ev;
    ote_naming_watch_t *w = nullptr;
    ASSERT_EQ(ote_naming_watch(n, "decode-0", Events::Fn, &ev, &w), OTE_OK);
    for (const char *name : {"decode-1", "decode-0", "prefill-0"})
        ASSERT_EQ(ote_naming_publish(n, name, src), OTE_OK) << name;

    ote_naming_entry_t e = {};
    size_t mdlen = 0;
    EXPECT_EQ(ote_naming_resolve(n, "decode-0", &e, nullptr, 0, &mdlen), OTE_ERR_TOO_BIG);
    std::vector<uint8_t> md(mdlen);
    ASSERT_EQ(ote_naming_resolve(n, "decode-0", &e, md.data(), md.size(), &mdlen), OTE_OK);
    EXPECT_EQ(std::string(e.addr), EngineAddr(src));
    EXPECT_EQ(e.epoch, EpochOf(src));
    ote_buffer_info_t bufs[4];
    size_t nb = 0;
    ASSERT_EQ(ote_engine_metadata_buffers(md.data(), mdlen, bufs, 4, &nb), OTE_OK);
    ASSERT_EQ(nb, 1u);
    EXPECT_STREQ(bufs[0].name, "kv");
    EXPECT_EQ(ote_naming_resolve(n, "decode-9", &e, nullptr, 0, nullptr), OTE_ERR_NOT_FOUND);
    EXPECT_EQ(ote_naming_resolve(n, "bad name", &e, nullptr, 0, nullptr), OTE_ERR_INVALID);

    char names[4][OTE_NAMING_NAME_MAX + 1];
    size_t count = 0;
    ASSERT_EQ(ote_naming_list(n, "decode-", names, 4, &count), OTE_OK);
    ASSERT_EQ(count, 2u);
    EXPECT_STREQ(names[0], "decode-0");
    EXPECT_STREQ(names[1], "decode-1");
    ASSERT_EQ(ote_naming_list(n, "", names, 4, &count), OTE_OK);
    EXPECT_EQ(count, 3u);
    EXPECT_EQ(ote_naming_list(n, "", names, 1, &count), OTE_ERR_TOO_BIG);
    EXPECT_EQ(count, 3u);

    // A segment by name moves the buffer's bytes.
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_naming_segment_open(n, req, "decode-0", &seg), OTE_OK);
    std::vector<uint8_t> got(kv.size(), 0);
    EXPECT_EQ(ReadOnce(req, seg, got.data(), bufs[0].addr, got.size()), OTE_OK);
    EXPECT_EQ(got, kv);
    EXPECT_EQ(ote_naming_segment_close(n, seg), OTE_OK);

    EXPECT_TRUE(WaitUntil([&] { return ev.Has(OTE_NAMING_UP, EpochOf(src)); }, seconds(5),
                          "the watch to see decode-0 up"));
    EXPECT_EQ(ote_naming_unpublish(n, "decode-0"), OTE_OK);
    EXPECT_EQ(ote_naming_unpublish(n, "decode-0"), OTE_ERR_NOT_FOUND);
    EXPECT_EQ(ote_naming_resolve(n, "decode-0", &e, nullptr, 0, nullptr), OTE_ERR_NOT_FOUND);
    EXPECT_EQ(ote_naming_segment_open(n, req, "decode-0", &seg), OTE_ERR_NOT_FOUND);
    EXPECT_TRUE(
        WaitUntil([&] { return ev.GoneAfterUp(); }, seconds(5), "the watch to see decode-0 gone"));
    EXPECT_EQ(ote_naming_unwatch(w), OTE_OK);
    EXPECT_EQ(ote_naming_close(n), OTE_OK); // withdraws decode-1 and prefill-0
    n = Open();
    ASSERT_NE(n, nullptr);
    EXPECT_EQ(ote_naming_list(n, "", names, 4, &count), OTE_OK);
    EXPECT_EQ(count, 0u);
    EXPECT_EQ(ote_naming_close(n), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(src, kv.data()), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
}

// A value that does not decode, or that was copied from another name, is never used.
TEST_P(NamingTest, MalformedValuesAreRefused) {
    ote_engine_t *src = LoopbackEngine();
    ote_engine_t *req = LoopbackEngine();
    ASSERT_NE(src, nullptr);
    ASSERT_NE(req, nullptr);
    ote_naming_t *n = Open();
    ASSERT_NE(n, nullptr);
    const uint8_t junk[] = "not an OrbitTE value";
    RawPut("orbitte/junk", junk, sizeof(junk));
    ote_naming_entry_t e = {};
    EXPECT_EQ(ote_naming_resolve(n, "junk", &e, nullptr, 0, nullptr), OTE_ERR_PROTOCOL);
    ote_segment_t *seg = nullptr;
    EXPECT_EQ(ote_naming_segment_open(n, req, "junk", &seg), OTE_ERR_PROTOCOL);
    ASSERT_EQ(ote_naming_publish(n, "real", src), OTE_OK);
    uint8_t *val = nullptr;
    size_t len = 0;
    std::vector<uint8_t> md(1 << 16);
    size_t ml = 0;
    ASSERT_EQ(ote_engine_metadata(src, md.data(), md.size(), &ml), OTE_OK);
    ASSERT_EQ(ote__nval_encode("real", md.data(), ml, &val, &len), OTE_OK);
    RawPut("orbitte/copy", val, len); // real's value under another name
    ote_free(val);
    EXPECT_EQ(ote_naming_resolve(n, "copy", &e, nullptr, 0, nullptr), OTE_ERR_PROTOCOL);
    EXPECT_EQ(ote_naming_resolve(n, "real", &e, nullptr, 0, nullptr), OTE_OK);
    EXPECT_EQ(ote_naming_close(n), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
}

// A publisher SIGKILLed: its name is gone within the ttl, a watch says GONE, an open by
// name fails NOT_FOUND, and a segment already open to it fails its requests PEER_LOST.
TEST_P(NamingTest, LeaseEndsAfterPublisherKilled) {
    const int ttl_ms = 2000;
    Publisher pub;
    ASSERT_TRUE(pub.Start(url_, "decode-3", ttl_ms, 0x33));
    ote_engine_t *req = LoopbackEngine();
    ASSERT_NE(req, nullptr);
    ote_naming_t *n = Open();
    ASSERT_NE(n, nullptr);
    // Alive past its ttl: the publisher's thread refreshes it.
    std::this_thread::sleep_for(milliseconds(ttl_ms + 500));
    ote_naming_entry_t e = {};
    ASSERT_EQ(ote_naming_resolve(n, "decode-3", &e, nullptr, 0, nullptr), OTE_OK);
    EXPECT_EQ(std::string(e.addr), pub.addr);
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_naming_segment_open(n, req, "decode-3", &seg), OTE_OK);
    uint64_t kv = RemoteKv(seg);
    ASSERT_NE(kv, 0u);
    std::vector<uint8_t> got(4096);
    ASSERT_EQ(ReadOnce(req, seg, got.data(), kv, got.size()), OTE_OK);
    EXPECT_EQ(got[0], 0x33);
    Events ev;
    ote_naming_watch_t *w = nullptr;
    ASSERT_EQ(ote_naming_watch(n, "decode-3", Events::Fn, &ev, &w), OTE_OK);
    ASSERT_TRUE(WaitUntil([&] { return ev.Has(OTE_NAMING_UP); }, seconds(5), "watch up"));

    auto killed = Clock::now();
    pub.Kill();
    EXPECT_NE(ReadOnce(req, seg, got.data(), kv, got.size()), OTE_OK);
    ote_transfer_status_t ts = {};
    ote_batch_t *b = nullptr;
    ASSERT_EQ(ote_batch_create(req, 1, &b), OTE_OK);
    ote_request_t r = {OTE_READ, got.data(), seg, kv, got.size()};
    ote_status_t sub = ote_batch_submit(b, &r, 1);
    if (sub == OTE_OK) {
        EXPECT_EQ(ote_batch_wait(b, 5000000000ull), OTE_ERR_PEER_LOST);
        EXPECT_EQ(ote_batch_status(b, 0, &ts), OTE_OK);
        EXPECT_EQ(ts.error, OTE_ERR_PEER_LOST);
    } else { // the submit tried to reconnect to the dead peer
        EXPECT_TRUE(ote_status_code(sub) == OTE_ERR_PEER_LOST ||
                    ote_status_code(sub) == OTE_ERR_CONNECT)
            << ote_status_str(sub);
    }
    EXPECT_EQ(ote_batch_destroy(b), OTE_OK);

    ASSERT_TRUE(WaitUntil(
        [&] {
            return ote_naming_resolve(n, "decode-3", &e, nullptr, 0, nullptr) == OTE_ERR_NOT_FOUND;
        },
        milliseconds(ttl_ms + 2000), "the name to end with its lease"));
    auto gone_after = std::chrono::duration_cast<milliseconds>(Clock::now() - killed).count();
    EXPECT_LE(gone_after, ttl_ms + 1500) << "the name outlived its ttl";
    ote_segment_t *seg2 = nullptr;
    EXPECT_EQ(ote_naming_segment_open(n, req, "decode-3", &seg2), OTE_ERR_NOT_FOUND);
    EXPECT_TRUE(WaitUntil([&] { return ev.GoneAfterUp(); }, seconds(3), "watch gone"));
    printf("[ figures ] naming %s: name gone %lld ms after its publisher's SIGKILL (ttl %d ms)\n",
           GetParam(), static_cast<long long>(gone_after), ttl_ms);
    EXPECT_EQ(ote_naming_unwatch(w), OTE_OK);
    EXPECT_EQ(ote_naming_segment_close(n, seg), OTE_OK);
    EXPECT_EQ(ote_naming_close(n), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
}

// The publisher restarts at the same address (a new epoch): the old metadata is refused,
// the old segment fails PEER_LOST, a stale cached entry is resolved again, the watch sees
// the new incarnation, and a segment by name reaches the new engine.
TEST_P(NamingTest, RestartWithNewEpoch) {
    auto a = std::make_unique<Publisher>();
    ASSERT_TRUE(a->Start(url_, "decode-3", 10000, 0x11));
    std::string addr = a->addr;
    ote_engine_t *req = LoopbackEngine();
    ASSERT_NE(req, nullptr);
    ote_naming_t *n = Open(/*cache_ms=*/60000);
    ASSERT_NE(n, nullptr);
    ote_naming_entry_t old = {};
    std::vector<uint8_t> md(1 << 16);
    size_t ml = 0;
    ASSERT_EQ(ote_naming_resolve(n, "decode-3", &old, md.data(), md.size(), &ml), OTE_OK);
    ote_segment_t *seg_old = nullptr;
    ASSERT_EQ(ote_naming_segment_open(n, req, "decode-3", &seg_old), OTE_OK);
    Events ev;
    ote_naming_watch_t *w = nullptr;
    ASSERT_EQ(ote_naming_watch(n, "decode-3", Events::Fn, &ev, &w), OTE_OK);
    ASSERT_TRUE(WaitUntil([&] { return ev.Has(OTE_NAMING_UP, old.epoch); }, seconds(5), "up"));

    a->Kill();
    auto b = std::make_unique<Publisher>();
    ASSERT_TRUE(WaitUntil([&] { return b->Start(url_, "decode-3", 10000, 0x22, addr); },
                          seconds(10), "the new publisher to listen at the old address"));
    // The watch sees the new incarnation (CHANGED, or UP again after a GONE).
    ASSERT_TRUE(WaitUntil(
        [&] {
            return ev.Has(OTE_NAMING_CHANGED) ||
                   (ev.Has(OTE_NAMING_GONE) && ev.Has(OTE_NAMING_UP, 0));
        },
        seconds(5), "the watch to see the restart"));
    ote_naming_entry_t now = {};
    ote_segment_t *seg = nullptr;
    // The old incarnation's metadata is refused at the new engine; its segment is dead.
    EXPECT_EQ(ote_segment_open_md(req, md.data(), ml, &seg), OTE_ERR_STATE);
    std::vector<uint8_t> got(4096);
    uint64_t kv_old = 0;
    {
        ote_buffer_info_t bi[2];
        size_t nb = 0;
        ASSERT_EQ(ote_engine_metadata_buffers(md.data(), ml, bi, 2, &nb), OTE_OK);
        kv_old = bi[0].addr;
    }
    EXPECT_EQ(ReadOnce(req, seg_old, got.data(), kv_old, got.size()), OTE_ERR_PEER_LOST);
    // The cache still holds the old entry: the open by name resolves again and works.
    ASSERT_EQ(ote_naming_segment_open(n, req, "decode-3", &seg), OTE_OK);
    ASSERT_EQ(ote_naming_resolve(n, "decode-3", &now, nullptr, 0, nullptr), OTE_OK);
    EXPECT_NE(now.epoch, old.epoch);
    EXPECT_EQ(std::string(now.addr), addr);
    uint64_t kv = RemoteKv(seg);
    ASSERT_NE(kv, 0u);
    ASSERT_EQ(ReadOnce(req, seg, got.data(), kv, got.size()), OTE_OK);
    EXPECT_EQ(got[0], 0x22);
    EXPECT_TRUE(ev.Has(OTE_NAMING_CHANGED, now.epoch) || ev.Has(OTE_NAMING_UP, now.epoch));
    EXPECT_EQ(ote_naming_unwatch(w), OTE_OK);
    EXPECT_EQ(ote_naming_segment_close(n, seg), OTE_OK);
    EXPECT_EQ(ote_naming_segment_close(n, seg_old), OTE_OK);
    EXPECT_EQ(ote_naming_close(n), OTE_OK);
    b.reset();
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
}

// The store goes away (frozen, then killed): opens by name fail within their deadline
// with a clear status, a cached name still resolves without a round trip, and segments
// already open keep working.
TEST_P(NamingTest, StoreGoneOpensFailInTimeSegmentsWork) {
    ote_engine_t *src = LoopbackEngine();
    ote_engine_t *req = LoopbackEngine();
    ASSERT_NE(src, nullptr);
    ASSERT_NE(req, nullptr);
    std::vector<uint8_t> kv(4096, 0x77);
    ASSERT_EQ(ote_memory_register_named(src, kv.data(), kv.size(), OTE_PERM_READ, "kv"), OTE_OK);
    const uint32_t timeout_ms = 500;
    ote_naming_t *pub = Open(0, 0, timeout_ms);
    ote_naming_t *fresh = Open(0, 0, timeout_ms);
    ote_naming_t *cached = Open(60000, 0, timeout_ms);
    ASSERT_TRUE(pub != nullptr && fresh != nullptr && cached != nullptr);
    ASSERT_EQ(ote_naming_publish(pub, "decode-3", src), OTE_OK);
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_naming_segment_open(fresh, req, "decode-3", &seg), OTE_OK);
    ote_naming_entry_t e = {};
    ASSERT_EQ(ote_naming_resolve(cached, "decode-3", &e, nullptr, 0, nullptr), OTE_OK);

    for (int sig : {SIGSTOP, SIGKILL}) {
        if (sig == SIGSTOP) {
            ASSERT_TRUE(Store().Freeze());
        } else {
            Store().Kill(sig);
        }
        if (sig == SIGKILL) {
            waitpid(Store().pid, nullptr, 0);
            Store().pid = -1;
        }
        auto t0 = Clock::now();
        ote_segment_t *seg2 = nullptr;
        ote_status_t st = ote_naming_segment_open(fresh, req, "decode-3", &seg2);
        auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - t0).count();
        if (st == OTE_OK) {
            EXPECT_EQ(ote_naming_segment_close(fresh, seg2), OTE_OK);
        }
        EXPECT_TRUE(st == OTE_ERR_TIMEOUT || st == OTE_ERR_CONNECT) << ote_status_str(st);
        EXPECT_EQ(st, sig == SIGSTOP ? OTE_ERR_TIMEOUT : OTE_ERR_CONNECT)
            << "a frozen store times out, a dead one refuses";
        EXPECT_LE(took, timeout_ms + 400) << "open by name past its deadline";
        // Cached: no round trip, so the frozen or dead store does not matter.
        auto t1 = Clock::now();
        EXPECT_EQ(ote_naming_resolve(cached, "decode-3", &e, nullptr, 0, nullptr), OTE_OK);
        EXPECT_LT(std::chrono::duration_cast<milliseconds>(Clock::now() - t1).count(), 50);
        std::vector<uint8_t> got(kv.size(), 0);
        EXPECT_EQ(ReadOnce(req, seg, got.data(), reinterpret_cast<uint64_t>(kv.data()), got.size()),
                  OTE_OK);
        EXPECT_EQ(got, kv);
    }
    EXPECT_EQ(ote_naming_segment_close(fresh, seg), OTE_OK);
    // Closing handles whose store is gone ends within the deadlines (withdrawal fails).
    auto t2 = Clock::now();
    EXPECT_EQ(ote_naming_close(pub), OTE_OK);
    EXPECT_EQ(ote_naming_close(fresh), OTE_OK);
    EXPECT_EQ(ote_naming_close(cached), OTE_OK);
    EXPECT_LE(std::chrono::duration_cast<milliseconds>(Clock::now() - t2).count(), 4000);
    EXPECT_EQ(ote_naming_open(url_.c_str(), nullptr, &pub), OTE_ERR_CONNECT);
    EXPECT_EQ(ote_memory_unregister(src, kv.data()), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
}

double Percentile(std::vector<double> v, double p) {
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

// Resolve latency, fresh (one round trip) and cached (none), printed as figures.
TEST_P(NamingTest, ResolveLatency) {
    ote_engine_t *src = LoopbackEngine();
    ASSERT_NE(src, nullptr);
    ote_naming_t *fresh = Open(0);
    ote_naming_t *cached = Open(60000);
    ASSERT_TRUE(fresh != nullptr && cached != nullptr);
    ASSERT_EQ(ote_naming_publish(fresh, "decode-3", src), OTE_OK);
    const int kN = 1000;
    std::vector<double> f, c;
    ote_naming_entry_t e = {};
    for (int i = 0; i < kN; i++) {
        for (auto *h : {fresh, cached}) {
            auto t0 = Clock::now();
            ASSERT_EQ(ote_naming_resolve(h, "decode-3", &e, nullptr, 0, nullptr), OTE_OK);
            double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
            (h == fresh ? f : c).push_back(us);
        }
    }
    printf(
        "[ figures ] naming resolve %s (loopback, %d each): fresh p50 %.1f us p99 %.1f us; "
        "cached p50 %.2f us p99 %.2f us\n",
        GetParam(), kN, Percentile(f, 0.5), Percentile(f, 0.99), Percentile(c, 0.5),
        Percentile(c, 0.99));
    EXPECT_LT(Percentile(c, 0.5), Percentile(f, 0.5));
    EXPECT_EQ(ote_naming_close(cached), OTE_OK);
    EXPECT_EQ(ote_naming_close(fresh), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
}

TEST_P(NamingTest, OpenRefusesBadUrls) {
    ote_naming_t *n = nullptr;
    EXPECT_EQ(ote_naming_open("http://127.0.0.1:1", nullptr, &n), OTE_ERR_UNSUPPORTED);
    EXPECT_EQ(ote_naming_open("127.0.0.1:1", nullptr, &n), OTE_ERR_INVALID);
    EXPECT_EQ(ote_naming_open("redis://127.0.0.1", nullptr, &n), OTE_ERR_INVALID);
    EXPECT_EQ(ote_naming_open("etcd://", nullptr, &n), OTE_ERR_INVALID);
    EXPECT_EQ(ote_naming_open("etcd://a:1,", nullptr, &n), OTE_ERR_INVALID);
    ote_naming_opts_t o = {};
    o.ttl_ms = 10;
    EXPECT_EQ(ote_naming_open(url_.c_str(), &o, &n), OTE_ERR_INVALID);
    EXPECT_EQ(n, nullptr);
}

INSTANTIATE_TEST_SUITE_P(Stores, NamingTest, ::testing::Values("etcd", "redis"),
                         [](const ::testing::TestParamInfo<const char *> &i) {
                             return std::string(i.param);
                         });

} // namespace
} // namespace ote_test

// Statistics (issue 28): ote_engine_stats, ote_segment_stats and ote_batch_status_ex.
// Two engines move known bytes over shm, tcp and rdma (verbs/sim); the requester's
// counters say exactly what was submitted, completed, refused and moved, per opcode and
// transport, its histogram counts every ended request, and a closed segment's counters stay
// in the engine's. The source counts its registrations and the notifications it received;
// a wrong key counts authentication failures on both sides. The struct_size protocol
// fills what fits and says so.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/engine/engine_util.h"
#include "tests/util/test_base.h"
#include "tests/util/wait.h"

extern "C" {
#include "ote/ote.h"
}

namespace {

using ote_test::ConfigKv;
using ote_test::EngineAddress;
using ote_test::kSec;
using ote_test::NewEngine;

constexpr size_t kBuf = 1u << 20;

ConfigKv TransportConfig(const char *t) {
    ConfigKv kv = {{"transports", t}};
    if (strcmp(t, "rdma") == 0) kv.push_back({"verbs_provider", "sim"});
    return kv;
}

uint32_t TransportId(const char *t) {
    return strcmp(t, "shm") == 0   ? OTE_TRANSPORT_SHM
           : strcmp(t, "tcp") == 0 ? OTE_TRANSPORT_TCP
                                   : OTE_TRANSPORT_RDMA;
}

ote_engine_stats_t EngineStats(ote_engine_t *e) {
    ote_engine_stats_t s;
    memset(&s, 0, sizeof(s));
    s.struct_size = sizeof(s);
    EXPECT_EQ(ote_engine_stats(e, &s), OTE_OK);
    EXPECT_EQ(s.struct_size, sizeof(s));
    return s;
}

uint64_t HistogramCount(const ote_request_stats_t &r) {
    uint64_t n = 0;
    for (uint64_t b : r.latency_us) n += b;
    return n;
}

// What the requester of MovesKnownBytes submitted: three WRITEs and two READs that
// complete, and one READ outside the source's registration that it refuses.
const uint64_t kWrites[] = {4096, 65536, 100000};
const uint64_t kReads[] = {8192, 300000};

void ExpectRequests(const ote_request_stats_t &r, uint64_t wbytes, uint64_t rbytes) {
    EXPECT_EQ(r.submitted[OTE_WRITE], 3u);
    EXPECT_EQ(r.submitted[OTE_READ], 3u);
    EXPECT_EQ(r.completed[OTE_WRITE], 3u);
    EXPECT_EQ(r.completed[OTE_READ], 2u);
    EXPECT_EQ(r.failed[OTE_READ], 1u);
    EXPECT_EQ(r.failed[OTE_WRITE], 0u);
    EXPECT_EQ(r.canceled[OTE_READ] + r.canceled[OTE_WRITE], 0u);
    EXPECT_EQ(r.timed_out[OTE_READ] + r.timed_out[OTE_WRITE], 0u);
    EXPECT_EQ(r.bytes[OTE_WRITE], wbytes);
    EXPECT_EQ(r.bytes[OTE_READ], rbytes);
    EXPECT_EQ(r.inflight_requests_now, 0u);
    EXPECT_EQ(r.inflight_bytes_now, 0u);
    EXPECT_EQ(HistogramCount(r), 6u); // every ended request, the refused one too
    EXPECT_GT(r.latency_ns_sum, 0u);
}

class StatsTest : public ote_test::OteTest, public ::testing::WithParamInterface<const char *> {};

TEST_P(StatsTest, MovesKnownBytes) {
    const char *t = GetParam();
    const uint32_t id = TransportId(t);
    ote_engine_t *a = NewEngine(TransportConfig(t));
    ote_engine_t *b = NewEngine(TransportConfig(t));
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    std::vector<uint8_t> local(kBuf, 0x5a), remote(kBuf, 0);
    ASSERT_EQ(ote_memory_register(b, remote.data(), kBuf, OTE_PERM_READ | OTE_PERM_WRITE), OTE_OK);
    ASSERT_EQ(ote_memory_register(a, local.data(), kBuf, OTE_PERM_READ | OTE_PERM_WRITE), OTE_OK);
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_segment_open(a, EngineAddress(b).c_str(), &seg), OTE_OK);
    ote_segment_info_t info;
    ASSERT_EQ(ote_segment_info(seg, &info), OTE_OK);
    ASSERT_STREQ(info.transport, t);

    std::vector<ote_request_t> reqs;
    uint64_t off = 0, wbytes = 0, rbytes = 0;
    for (uint64_t n : kWrites) {
        reqs.push_back(
            {OTE_WRITE, local.data() + off, seg, (uint64_t)(uintptr_t)(remote.data() + off), n});
        off += n;
        wbytes += n;
    }
    for (uint64_t n : kReads) {
        reqs.push_back(
            {OTE_READ, local.data() + off, seg, (uint64_t)(uintptr_t)(remote.data() + off), n});
        off += n;
        rbytes += n;
    }
    ote_batch_t *bt = nullptr;
    ASSERT_EQ(ote_batch_create(a, 8, &bt), OTE_OK);
    ASSERT_EQ(ote_batch_submit(bt, reqs.data(), reqs.size()), OTE_OK);
    ASSERT_EQ(ote_batch_wait(bt, 30 * kSec), OTE_OK);
    // Refused by the source as a whole: it starts past the end of its registration.
    ote_request_t bad = {OTE_READ, local.data(), seg, (uint64_t)(uintptr_t)remote.data() + kBuf,
                         4096};
    ASSERT_EQ(ote_batch_submit(bt, &bad, 1), OTE_OK);
    EXPECT_EQ(ote_status_code(ote_batch_wait(bt, 30 * kSec)), OTE_ERR_ACCESS);

    // Each request's timing and transport.
    for (size_t i = 0; i <= reqs.size(); i++) {
        ote_transfer_status_ex_t x;
        memset(&x, 0, sizeof(x));
        x.struct_size = sizeof(x);
        ASSERT_EQ(ote_batch_status_ex(bt, i, &x), OTE_OK);
        EXPECT_EQ(x.struct_size, sizeof(x));
        EXPECT_EQ(x.state, i < reqs.size() ? OTE_TRANSFER_COMPLETED : OTE_TRANSFER_FAILED);
        EXPECT_EQ(x.transport, id);
        EXPECT_GT(x.submit_ns, 0u);
        EXPECT_GE(x.end_ns, x.submit_ns);
        ote_transfer_status_t plain;
        ASSERT_EQ(ote_batch_status(bt, i, &plain), OTE_OK);
        EXPECT_EQ(plain.state, x.state);
        EXPECT_EQ(plain.bytes_done, x.bytes_done);
        EXPECT_EQ(plain.error, x.error);
    }
    ote_transfer_status_ex_t waiting;
    memset(&waiting, 0, sizeof(waiting));
    waiting.struct_size = sizeof(waiting);
    ASSERT_EQ(ote_batch_status_ex(bt, 7, &waiting), OTE_OK);
    EXPECT_EQ(waiting.state, OTE_TRANSFER_WAITING);
    EXPECT_EQ(waiting.submit_ns, 0u);

    ote_engine_stats_t s = EngineStats(a);
    const ote_transport_stats_t &ts = s.transport[id];
    EXPECT_STREQ(ts.name, t);
    EXPECT_EQ(ts.enabled, 1u);
    EXPECT_EQ(ts.peers_now, 1u);
    ExpectRequests(ts.requests, wbytes, rbytes);
    for (uint32_t other = 0; other < OTE_STATS_TRANSPORTS; other++) {
        if (other == id) continue;
        EXPECT_EQ(s.transport[other].requests.submitted[OTE_READ] +
                      s.transport[other].requests.submitted[OTE_WRITE],
                  0u);
        EXPECT_EQ(s.transport[other].peers_now, 0u);
    }

    ote_segment_stats_t g;
    memset(&g, 0, sizeof(g));
    g.struct_size = sizeof(g);
    ASSERT_EQ(ote_segment_stats(seg, &g), OTE_OK);
    EXPECT_STREQ(g.transport, t);
    EXPECT_EQ(g.transport_id, id);
    EXPECT_EQ(std::string(g.peer), EngineAddress(b));
    ExpectRequests(g.requests, wbytes, rbytes);

    // A notification: sent and acknowledged here, received there.
    ASSERT_EQ(ote_notify_send(a, seg, "hi", 2), OTE_OK);
    g.struct_size = sizeof(g);
    ASSERT_EQ(ote_segment_stats(seg, &g), OTE_OK);
    EXPECT_EQ(g.notify_sent, 1u);
    EXPECT_EQ(EngineStats(b).notify_received, 1u);

    // The source: one live registration of host memory, none of its own requests.
    ote_engine_stats_t sb = EngineStats(b);
    EXPECT_EQ(sb.registrations_now, 1u);
    EXPECT_EQ(sb.registered_bytes_now, kBuf);
    EXPECT_EQ(sb.registrations_kind_now[OTE_STATS_MEM_HOST], 1u);
    EXPECT_EQ(sb.registered_bytes_kind_now[OTE_STATS_MEM_HOST], kBuf);
    EXPECT_EQ(sb.registrations_total, 1u);
    EXPECT_EQ(sb.transport[id].requests.submitted[OTE_WRITE], 0u);

    // A closed segment's counters stay in the engine's.
    ASSERT_EQ(ote_batch_destroy(bt), OTE_OK);
    ASSERT_EQ(ote_segment_close(seg), OTE_OK);
    s = EngineStats(a);
    EXPECT_EQ(s.transport[id].peers_now, 0u);
    ExpectRequests(s.transport[id].requests, wbytes, rbytes);
    EXPECT_EQ(s.notify_sent, 1u);

    ASSERT_EQ(ote_memory_unregister(a, local.data()), OTE_OK);
    EXPECT_EQ(ote_test::UnregisterWhenFree(b, remote.data()), OTE_OK);
    EXPECT_EQ(EngineStats(b).registrations_now, 0u);
    EXPECT_EQ(EngineStats(b).registrations_total, 1u);
    ASSERT_EQ(ote_engine_destroy(a), OTE_OK);
    ASSERT_EQ(ote_engine_destroy(b), OTE_OK);
}

INSTANTIATE_TEST_SUITE_P(Transports, StatsTest, ::testing::Values("shm", "tcp", "rdma"),
                         [](const ::testing::TestParamInfo<const char *> &i) {
                             return std::string(i.param);
                         });

class StatsApiTest : public ote_test::OteTest {};

// The caller's struct_size decides how much is filled: an older, shorter struct gets its
// part and nothing past it; a newer, longer one gets the library's size back; too short
// or NULL is OTE_ERR_INVALID.
TEST_F(StatsApiTest, StructSizeFillsWhatFits) {
    ote_engine_t *e = NewEngine();
    ASSERT_NE(e, nullptr);
    std::vector<uint8_t> raw(sizeof(ote_engine_stats_t) + 64, 0xee);
    auto *s = reinterpret_cast<ote_engine_stats_t *>(raw.data());
    const size_t part = offsetof(ote_engine_stats_t, transport[1]);
    s->struct_size = part;
    ASSERT_EQ(ote_engine_stats(e, s), OTE_OK);
    EXPECT_EQ(s->struct_size, part);
    EXPECT_STREQ(s->transport[0].name, "shm");
    for (size_t i = part; i < raw.size(); i++) ASSERT_EQ(raw[i], 0xee) << i;

    s->struct_size = raw.size();
    ASSERT_EQ(ote_engine_stats(e, s), OTE_OK);
    EXPECT_EQ(s->struct_size, sizeof(ote_engine_stats_t));
    for (size_t i = sizeof(ote_engine_stats_t); i < raw.size(); i++) ASSERT_EQ(raw[i], 0xee) << i;
    EXPECT_EQ(s->transport[OTE_TRANSPORT_SHM].enabled, 1u); // the default list: shm,tcp
    EXPECT_EQ(s->transport[OTE_TRANSPORT_TCP].enabled, 1u);
    EXPECT_EQ(s->transport[OTE_TRANSPORT_RDMA].enabled, 0u);
    EXPECT_STREQ(s->transport[OTE_TRANSPORT_FILE].name, "file"); // the local segment to files
    EXPECT_EQ(s->transport[OTE_TRANSPORT_FILE].enabled, 0u);     // not a transports list entry

    s->struct_size = OTE_STATS_MIN_SIZE - 1;
    EXPECT_EQ(ote_engine_stats(e, s), OTE_ERR_INVALID);
    EXPECT_EQ(ote_engine_stats(e, nullptr), OTE_ERR_INVALID);
    ote_engine_stats_t ok;
    ok.struct_size = sizeof(ok);
    EXPECT_EQ(ote_engine_stats(nullptr, &ok), OTE_ERR_INVALID);
    ote_segment_stats_t g;
    g.struct_size = sizeof(g);
    EXPECT_EQ(ote_segment_stats(nullptr, &g), OTE_ERR_INVALID);
    ote_batch_t *bt = nullptr;
    ASSERT_EQ(ote_batch_create(e, 1, &bt), OTE_OK);
    ote_transfer_status_ex_t x;
    x.struct_size = 4;
    EXPECT_EQ(ote_batch_status_ex(bt, 0, &x), OTE_ERR_INVALID);
    x.struct_size = sizeof(x);
    EXPECT_EQ(ote_batch_status_ex(bt, 1, &x), OTE_ERR_INVALID); // past the capacity
    ASSERT_EQ(ote_batch_destroy(bt), OTE_OK);
    ASSERT_EQ(ote_engine_destroy(e), OTE_OK);
}

// A key file of 32 bytes (byte i = seed + 7 i), mode 0600, in the test's directory.
std::string KeyFile(const char *name, unsigned seed) {
    const char *dir = getenv("TEST_TMPDIR");
    std::string path = std::string(dir ? dir : "/tmp") + "/" + name;
    unlink(path.c_str());
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    EXPECT_GE(fd, 0) << path;
    uint8_t b[32];
    for (size_t i = 0; i < sizeof(b); i++) b[i] = static_cast<uint8_t>(seed + i * 7);
    EXPECT_EQ(write(fd, b, sizeof(b)), static_cast<ssize_t>(sizeof(b)));
    close(fd);
    return path;
}

// Engines with different cluster keys: the opener counts a failed open, the engine it
// tried counts a failed authentication.
TEST_F(StatsApiTest, CountsAuthenticationFailures) {
    std::string ka = KeyFile("stats_key_a", 1), kb = KeyFile("stats_key_b", 2);
    ote_engine_t *a = NewEngine({{"transports", "tcp"}, {"auth_key_file", ka.c_str()}});
    ote_engine_t *b = NewEngine({{"transports", "tcp"}, {"auth_key_file", kb.c_str()}});
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    ote_segment_t *seg = nullptr;
    EXPECT_EQ(ote_status_code(ote_segment_open(a, EngineAddress(b).c_str(), &seg)), OTE_ERR_AUTH);
    EXPECT_EQ(EngineStats(a).auth_open_failures, 1u);
    ote_test::WaitUntil([&] { return EngineStats(b).auth_failures >= 1; }, std::chrono::seconds(10),
                        "b counts a failed authentication");
    EXPECT_EQ(EngineStats(a).auth_failures, 0u);
    ASSERT_EQ(ote_engine_destroy(a), OTE_OK);
    ASSERT_EQ(ote_engine_destroy(b), OTE_OK);
}

} // namespace

// Buffer discovery in process: named registrations (the name rules), two engines listing
// each other's registrations as they change, the cap-too-small and over-the-cap paths,
// a peer that is gone or that never answers (a status by the deadline), and a lying peer
// whose answers are refused whole (raw control-plane server).
#include <gtest/gtest.h>

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tests/engine/ctl_peer.h"
#include "tests/engine/engine_util.h"
#include "tests/util/test_base.h"

extern "C" {
#include "base/time.h"
#include "engine/control/ctl.h"
#include "ote/ote.h"
}

namespace {

using ote_test::kMs;
using ote_test::kSec;
using ote_test::NewEngine;

class DiscoveryTest : public ote_test::OteTest {
  protected:
    // The peer's list, asserted to succeed.
    static std::vector<ote_buffer_info_t> List(ote_segment_t *seg, size_t cap = 64) {
        std::vector<ote_buffer_info_t> out(cap);
        size_t n = 12345;
        EXPECT_EQ(ote_segment_buffers(seg, out.data(), out.size(), &n), OTE_OK);
        out.resize(n == 12345 ? 0 : n);
        return out;
    }
    static const ote_buffer_info_t *Find(const std::vector<ote_buffer_info_t> &l,
                                         const char *name) {
        for (const auto &b : l)
            if (std::strcmp(b.name, name) == 0) return &b;
        return nullptr;
    }
};

TEST_F(DiscoveryTest, NamedRegistrationRules) {
    ote_engine_t *e = NewEngine();
    std::vector<uint8_t> mem(1 << 16);
    uint8_t *p = mem.data();
    std::string longest(OTE_NAME_MAX, 'n'), too_long(OTE_NAME_MAX + 1, 'n');
    // Bad names: nothing is registered.
    for (const char *bad : {"", too_long.c_str(), "tab\there", "new\nline", "caf\xc3\xa9", "\x7f"})
        EXPECT_EQ(ote_memory_register_named(e, p, 100, OTE_PERM_READ, bad), OTE_ERR_INVALID) << bad;
    ASSERT_EQ(ote_memory_register_named(e, p, 100, OTE_PERM_READ, longest.c_str()), OTE_OK);
    ASSERT_EQ(ote_memory_register_named(e, p + 100, 100, OTE_PERM_WRITE, "kv cache/0 ~!"), OTE_OK);
    // A name is unique among live registrations; the duplicate registers nothing.
    EXPECT_EQ(ote_memory_register_named(e, p + 200, 100, OTE_PERM_READ, "kv cache/0 ~!"),
              OTE_ERR_EXISTS);
    EXPECT_EQ(ote_memory_register(e, p + 200, 100, OTE_PERM_READ), OTE_OK); // the range was free
    EXPECT_EQ(ote_memory_unregister(e, p + 200), OTE_OK);
    // An overlapping range with a fresh name: EXISTS, and the name stays free.
    EXPECT_EQ(ote_memory_register_named(e, p + 150, 100, OTE_PERM_READ, "fresh"), OTE_ERR_EXISTS);
    EXPECT_EQ(ote_memory_register_named(e, p + 300, 100, OTE_PERM_READ, "fresh"), OTE_OK);
    // Unregistering frees the name; unnamed registrations (NULL or the plain call) coexist.
    EXPECT_EQ(ote_memory_unregister(e, p + 100), OTE_OK);
    EXPECT_EQ(ote_memory_register_named(e, p + 1000, 10, OTE_PERM_READ, "kv cache/0 ~!"), OTE_OK);
    EXPECT_EQ(ote_memory_register_named(e, p + 2000, 10, OTE_PERM_READ, nullptr), OTE_OK);
    EXPECT_EQ(ote_memory_register(e, p + 3000, 10, OTE_PERM_READ), OTE_OK);
    // The ordinary checks still apply to named registrations.
    EXPECT_EQ(ote_memory_register_named(e, nullptr, 10, OTE_PERM_READ, "x"), OTE_ERR_INVALID);
    EXPECT_EQ(ote_memory_register_named(e, p + 4000, 10, 0x4, "x"), OTE_ERR_INVALID);
    EXPECT_EQ(ote_memory_register_named(nullptr, p + 4000, 10, OTE_PERM_READ, "x"),
              OTE_ERR_INVALID);
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
}

// Two engines over TCP (the listener answers whatever the transport; the other
// transports run in ote_target's contract tests).
TEST_F(DiscoveryTest, ListsThePeersRegistrationsAsTheyChange) {
    ote_engine_t *src = NewEngine({{"transports", "tcp"}});
    ote_engine_t *req = NewEngine({{"transports", "tcp"}});
    std::vector<uint8_t> mem(1 << 20);
    uint8_t *p = mem.data();
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_segment_open(req, ote_test::EngineAddress(src).c_str(), &seg), OTE_OK);
    EXPECT_TRUE(List(seg).empty()); // nothing registered yet
    ASSERT_EQ(ote_memory_register_named(src, p + 8192, 4096, OTE_PERM_READ | OTE_PERM_WRITE, "b"),
              OTE_OK);
    ASSERT_EQ(ote_memory_register_named(src, p, 4096, OTE_PERM_READ, "a"), OTE_OK);
    ASSERT_EQ(ote_memory_register(src, p + 65536, 100, OTE_PERM_WRITE), OTE_OK);
    auto l = List(seg);
    ASSERT_EQ(l.size(), 3u);
    // Sorted by address, every field as registered.
    EXPECT_STREQ(l[0].name, "a");
    EXPECT_EQ(l[0].addr, (uint64_t)(uintptr_t)p);
    EXPECT_EQ(l[0].length, 4096u);
    EXPECT_EQ(l[0].perms, OTE_PERM_READ);
    EXPECT_EQ(l[0].kind, (uint32_t)OTE_MEM_HOST);
    EXPECT_STREQ(l[1].name, "b");
    EXPECT_EQ(l[1].addr, (uint64_t)(uintptr_t)(p + 8192));
    EXPECT_EQ(l[1].perms, OTE_PERM_READ | OTE_PERM_WRITE);
    EXPECT_STREQ(l[2].name, ""); // unnamed registrations are listed too
    EXPECT_EQ(l[2].length, 100u);
    EXPECT_EQ(l[2].perms, OTE_PERM_WRITE);

    // Cap too small: TOO_BIG with the number needed, out untouched.
    std::vector<ote_buffer_info_t> two(2);
    std::memset(two.data(), 0xAB, sizeof(ote_buffer_info_t) * two.size());
    size_t n = 0;
    EXPECT_EQ(ote_segment_buffers(seg, two.data(), two.size(), &n), OTE_ERR_TOO_BIG);
    EXPECT_EQ(n, 3u);
    for (size_t i = 0; i < sizeof(ote_buffer_info_t) * two.size(); i++)
        ASSERT_EQ(reinterpret_cast<uint8_t *>(two.data())[i], 0xAB) << i;
    n = 0;
    EXPECT_EQ(ote_segment_buffers(seg, nullptr, 0, &n), OTE_ERR_TOO_BIG); // just count
    EXPECT_EQ(n, 3u);
    EXPECT_EQ(ote_segment_buffers(seg, nullptr, 3, &n), OTE_ERR_INVALID);
    EXPECT_EQ(ote_segment_buffers(seg, two.data(), 2, nullptr), OTE_ERR_INVALID);
    EXPECT_EQ(ote_segment_buffers(nullptr, two.data(), 2, &n), OTE_ERR_INVALID);
    EXPECT_EQ(List(seg, 3).size(), 3u); // exactly enough

    // A registration removed or added is seen by the next call; a name can come back.
    ASSERT_EQ(ote_memory_unregister(src, p), OTE_OK);
    l = List(seg);
    EXPECT_EQ(l.size(), 2u);
    EXPECT_EQ(Find(l, "a"), nullptr);
    ASSERT_EQ(ote_memory_register_named(src, p + 200000, 512, OTE_PERM_READ, "a"), OTE_OK);
    l = List(seg);
    ASSERT_EQ(l.size(), 3u);
    ASSERT_NE(Find(l, "a"), nullptr);
    EXPECT_EQ(Find(l, "a")->addr, (uint64_t)(uintptr_t)(p + 200000));

    // A transfer into a discovered buffer by name, then the stale address refused.
    const ote_buffer_info_t *b = Find(l, "b");
    ASSERT_NE(b, nullptr);
    std::vector<uint8_t> src_bytes(4096);
    for (size_t i = 0; i < src_bytes.size(); i++) src_bytes[i] = static_cast<uint8_t>(i * 7 + 1);
    ote_request_t w = {OTE_WRITE, src_bytes.data(), seg, b->addr, src_bytes.size()};
    ASSERT_EQ(ote_test::RunOne(req, w, 60 * kSec), OTE_OK);
    EXPECT_EQ(std::memcmp(p + 8192, src_bytes.data(), src_bytes.size()), 0);
    uint64_t stale = b->addr;
    ASSERT_EQ(ote_memory_unregister(src, p + 8192), OTE_OK);
    std::vector<uint8_t> other(4096, 0x33), before(p + 8192, p + 8192 + 4096);
    ote_transfer_status_t ts;
    w = {OTE_WRITE, other.data(), seg, stale, other.size()};
    EXPECT_NE(ote_test::RunOne(req, w, 60 * kSec, &ts), OTE_OK);
    EXPECT_EQ(ote_status_code(ts.error), OTE_ERR_ACCESS);
    EXPECT_EQ(ts.bytes_done, 0u);
    EXPECT_EQ(std::memcmp(p + 8192, before.data(), before.size()), 0) << "a stale WRITE landed";
    EXPECT_EQ(Find(List(seg), "b"), nullptr);

    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
}

// Over OTE_BUFFERS_MAX registrations: the lowest addresses are listed, no more.
TEST_F(DiscoveryTest, OverTheCapListsTheLowestAddresses) {
    ote_engine_t *src = NewEngine({{"transports", "tcp"}});
    ote_engine_t *req = NewEngine({{"transports", "tcp"}});
    const size_t total = OTE_BUFFERS_MAX + 7;
    std::vector<uint8_t> mem(total * 2);
    for (size_t i = 0; i < total; i++)
        ASSERT_EQ(ote_memory_register(src, mem.data() + 2 * i, 1, OTE_PERM_READ), OTE_OK) << i;
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_segment_open(req, ote_test::EngineAddress(src).c_str(), &seg), OTE_OK);
    size_t n = 0;
    EXPECT_EQ(ote_segment_buffers(seg, nullptr, 0, &n), OTE_ERR_TOO_BIG);
    EXPECT_EQ(n, static_cast<size_t>(OTE_BUFFERS_MAX));
    auto l = List(seg, total);
    ASSERT_EQ(l.size(), static_cast<size_t>(OTE_BUFFERS_MAX));
    for (size_t i = 0; i < l.size(); i++)
        ASSERT_EQ(l[i].addr, (uint64_t)(uintptr_t)(mem.data() + 2 * i)) << i;
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
}

// A requester that sends many BUFS_REQ without reading: the TCP source queues one list at
// a time (it parses the next request once the previous answer is sent), and every
// answer still arrives, whole and in order, once the requester reads.
TEST_F(DiscoveryTest, PipelinedRequestsAreAnsweredOneListAtATime) {
    ote_engine_t *src = NewEngine({{"transports", "tcp"}});
    std::vector<uint8_t> mem(OTE_BUFFERS_MAX * 2);
    for (size_t i = 0; i < OTE_BUFFERS_MAX; i++)
        ASSERT_EQ(ote_memory_register(src, mem.data() + 2 * i, 1, OTE_PERM_WRITE), OTE_OK) << i;
    int fd = ote_test::ConnectTo(ote_test::EngineAddress(src), 4096);
    ASSERT_GE(fd, 0);
    ote_ctl_msg_t h{};
    h.version = OTE_CTL_VERSION_MAX;
    h.opcode = OTE_CTL_HELLO;
    h.req_id = 1;
    h.u.hello.min_version = OTE_CTL_VERSION_MIN;
    h.u.hello.max_version = OTE_CTL_VERSION_MAX;
    h.u.hello.role = OTE_CTL_ROLE_INFO;
    ASSERT_TRUE(ote_test::SendAll(fd, ote_test::Encode(h)));
    std::vector<uint8_t> buf;
    ote_ctl_msg_t m;
    ASSERT_TRUE(ote_test::ReadFrame(fd, &buf, &m));
    ASSERT_EQ(m.opcode, OTE_CTL_HELLO_ACK);
    uint16_t ver = m.u.hello_ack.version;
    constexpr int kN = 48; // 48 lists of 2048 entries: 8.3 MiB, more than the socket holds
    std::vector<uint8_t> reqs(kN * OTE_CTL_HDR_LEN);
    for (int i = 0; i < kN; i++)
        ote_ctl_put_hdr(reqs.data() + i * OTE_CTL_HDR_LEN, ver, OTE_CTL_BUFS_REQ, 100 + i, OTE_OK,
                        0);
    ASSERT_TRUE(ote_test::SendAll(fd, reqs));
    usleep(200 * 1000); // the source fills the socket and stops parsing
    for (int i = 0; i < kN; i++) {
        std::vector<uint8_t> f(OTE_CTL_HDR_LEN);
        ASSERT_TRUE(ote_test::RecvAll(fd, f.data(), f.size())) << i;
        uint32_t len = f[20] | (f[21] << 8) | (f[22] << 16) | (static_cast<uint32_t>(f[23]) << 24);
        ASSERT_LE(len, OTE_CTL_BUFS_MAX_BODY) << i;
        f.resize(OTE_CTL_HDR_LEN + len);
        ASSERT_TRUE(ote_test::RecvAll(fd, f.data() + OTE_CTL_HDR_LEN, len)) << i;
        size_t used = 0;
        ASSERT_EQ(ote_ctl_decode(f.data(), f.size(), &m, &used), OTE_OK) << i;
        EXPECT_EQ(m.opcode, OTE_CTL_BUFS);
        EXPECT_EQ(m.req_id, static_cast<uint64_t>(100 + i));
        EXPECT_EQ(m.u.bufs.count, static_cast<uint32_t>(OTE_BUFFERS_MAX));
        ote_ctl_buf_t b{};
        ASSERT_EQ(ote_ctl_buf_get(&m, m.u.bufs.count - 1, &b), OTE_OK);
        EXPECT_EQ(b.addr, (uint64_t)(uintptr_t)(mem.data() + 2 * (OTE_BUFFERS_MAX - 1)));
    }
    close(fd);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
}

TEST_F(DiscoveryTest, PeerGoneFailsWithAConnectStatus) {
    ote_engine_t *src = NewEngine({{"transports", "tcp"}});
    ote_engine_t *req = NewEngine({{"transports", "tcp"}, {"connect_timeout_ms", "3000"}});
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_segment_open(req, ote_test::EngineAddress(src).c_str(), &seg), OTE_OK);
    EXPECT_TRUE(List(seg).empty());
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK); // its listener closes
    std::vector<ote_buffer_info_t> out(4);
    size_t n = 777;
    uint64_t t0 = ote_now_ns();
    ote_status_t st = ote_segment_buffers(seg, out.data(), out.size(), &n);
    int code = ote_status_code(st);
    EXPECT_TRUE(code == OTE_ERR_CONNECT || code == OTE_ERR_PEER_LOST || code == OTE_ERR_TIMEOUT)
        << ote_status_str(st);
    EXPECT_EQ(n, 777u); // outputs only on success
    EXPECT_LT(ote_now_ns() - t0, 60 * kSec);
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
}

// A raw source: it answers every HELLO (advertising discovery unless told not to), then
// answers a BUFS_REQ as `mode` says.
enum class Lie { kCountPastPayload, kBadName, kWrongReqId, kBusy, kSilent, kClose, kNoAdvert };

void ServeLying(int fd, Lie mode, const std::atomic<bool> &stop) {
    std::vector<uint8_t> buf;
    ote_ctl_msg_t m;
    if (!ote_test::ReadFrame(fd, &buf, &m) || m.opcode != OTE_CTL_HELLO) return;
    std::string info = mode == Lie::kNoAdvert ? "transports=tcp" : "transports=tcp;buffers=1";
    ote_ctl_msg_t a{};
    a.version = 1;
    a.opcode = OTE_CTL_HELLO_ACK;
    a.req_id = m.req_id;
    a.u.hello_ack.version = 1;
    a.u.hello_ack.max_data = OTE_CTL_MAX_DATA;
    a.u.hello_ack.addr = "127.0.0.1:1";
    a.u.hello_ack.addr_len = 11;
    a.u.hello_ack.info = info.data();
    a.u.hello_ack.info_len = static_cast<uint16_t>(info.size());
    if (!ote_test::SendAll(fd, ote_test::Encode(a))) return;
    while (!stop) {
        if (!ote_test::ReadFrame(fd, &buf, &m, 200)) {
            if (ote_test::ClosedByPeer(fd, 0)) return;
            continue;
        }
        if (m.opcode != OTE_CTL_BUFS_REQ) continue;
        if (mode == Lie::kSilent) continue;
        if (mode == Lie::kClose) {
            shutdown(fd, SHUT_RDWR); // the requester sees EOF instead of an answer
            return;
        }
        std::vector<uint8_t> f(OTE_CTL_HDR_LEN + 8 + OTE_CTL_BUF_ENTRY_LEN, 0);
        ote_ctl_buf_t b{};
        b.addr = 0x1000;
        b.len = 64;
        b.perms = OTE_PERM_READ;
        std::snprintf(b.name, sizeof(b.name), "lie");
        EXPECT_EQ(ote_ctl_buf_put(f.data() + OTE_CTL_HDR_LEN + 8, &b), OTE_OK);
        uint32_t count = mode == Lie::kCountPastPayload ? 2 : 1;
        for (int i = 0; i < 4; i++) {
            f[OTE_CTL_HDR_LEN + i] = static_cast<uint8_t>(count >> (8 * i)); // total
            f[OTE_CTL_HDR_LEN + 4 + i] = static_cast<uint8_t>(count >> (8 * i));
        }
        if (mode == Lie::kBadName) f[OTE_CTL_HDR_LEN + 8 + 24 + 1] = '\x01';
        uint64_t id = mode == Lie::kWrongReqId ? m.req_id + 1 : m.req_id;
        ote_status_t st = mode == Lie::kBusy ? OTE_ERR_BUSY : OTE_OK;
        uint32_t len = st == OTE_OK ? static_cast<uint32_t>(f.size() - OTE_CTL_HDR_LEN) : 0;
        ote_ctl_put_hdr(f.data(), 1, OTE_CTL_BUFS, id, st, len);
        ote_test::SendAll(fd, f.data(), OTE_CTL_HDR_LEN + len);
    }
}

TEST_F(DiscoveryTest, LyingOrStalledPeerIsRefusedWhole) {
    struct Case {
        Lie mode;
        int code;
    };
    const Case cases[] = {{Lie::kCountPastPayload, OTE_ERR_PROTOCOL},
                          {Lie::kBadName, OTE_ERR_PROTOCOL},
                          {Lie::kWrongReqId, OTE_ERR_PROTOCOL},
                          {Lie::kBusy, OTE_ERR_REMOTE},
                          {Lie::kSilent, OTE_ERR_TIMEOUT},
                          {Lie::kClose, OTE_ERR_PEER_LOST},
                          {Lie::kNoAdvert, OTE_ERR_UNSUPPORTED}};
    for (const Case &c : cases) {
        SCOPED_TRACE(static_cast<int>(c.mode));
        std::atomic<bool> stop{false};
        ote_test::RawServer srv([&](int fd) { ServeLying(fd, c.mode, stop); }, 16, true);
        ote_engine_t *req = NewEngine(
            {{"transports", "tcp"}, {"tcp_connections", "1"}, {"connect_timeout_ms", "500"}});
        ote_segment_t *seg = nullptr;
        ASSERT_EQ(ote_segment_open(req, srv.address.c_str(), &seg), OTE_OK);
        std::vector<ote_buffer_info_t> out(4);
        std::memset(out.data(), 0x5C, sizeof(ote_buffer_info_t) * out.size());
        size_t n = 999;
        uint64_t t0 = ote_now_ns();
        ote_status_t st = ote_segment_buffers(seg, out.data(), out.size(), &n);
        uint64_t took = ote_now_ns() - t0;
        EXPECT_EQ(ote_status_code(st), c.code) << ote_status_str(st);
        EXPECT_EQ(n, 999u);
        EXPECT_EQ(reinterpret_cast<uint8_t *>(out.data())[0], 0x5C);
        if (c.mode == Lie::kSilent) {
            EXPECT_GE(took, 500 * kMs); // not before its deadline
        }
        EXPECT_LT(took, 60 * kSec);
        stop = true;
        EXPECT_EQ(ote_segment_close(seg), OTE_OK);
        EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    }
}

} // namespace

namespace {

// A metadata blob (ote_engine_metadata) carries the engine's address, epoch and
// registrations: another engine reads the buffers out of it without asking (the same list
// ote_segment_buffers gives), opens a segment from it and moves bytes to an address it
// found there; a short buffer is TOO_BIG with the size needed.
TEST_F(DiscoveryTest, MetadataBlobListsBuffersAndOpensASegment) {
    ote_engine_t *a = NewEngine(), *b = NewEngine();
    std::vector<uint8_t> kv(1 << 16, 0), aux(4096, 0), plain(8192, 0);
    ASSERT_EQ(
        ote_memory_register_named(b, kv.data(), kv.size(), OTE_PERM_READ | OTE_PERM_WRITE, "kv/0"),
        OTE_OK);
    ASSERT_EQ(ote_memory_register_named(b, aux.data(), aux.size(), OTE_PERM_READ, "aux"), OTE_OK);
    ASSERT_EQ(ote_memory_register(b, plain.data(), plain.size(), OTE_PERM_WRITE), OTE_OK);
    size_t need = 0;
    EXPECT_EQ(ote_engine_metadata(b, nullptr, 0, &need), OTE_ERR_TOO_BIG);
    ASSERT_GT(need, 3u * OTE_CTL_BUF_ENTRY_LEN);
    std::vector<uint8_t> md(need);
    size_t len = 0;
    ASSERT_EQ(ote_engine_metadata(b, md.data(), md.size(), &len), OTE_OK);
    EXPECT_EQ(len, need);
    std::vector<ote_buffer_info_t> from_md(3);
    size_t n = 0;
    EXPECT_EQ(ote_engine_metadata_buffers(md.data(), len, from_md.data(), 2, &n), OTE_ERR_TOO_BIG);
    EXPECT_EQ(n, 3u);
    ASSERT_EQ(ote_engine_metadata_buffers(md.data(), len, from_md.data(), 3, &n), OTE_OK);
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_segment_open_md(a, md.data(), len, &seg), OTE_OK);
    std::vector<ote_buffer_info_t> asked = List(seg);
    ASSERT_EQ(asked.size(), 3u);
    for (size_t i = 0; i < 3; i++) {
        EXPECT_STREQ(from_md[i].name, asked[i].name);
        EXPECT_EQ(from_md[i].addr, asked[i].addr);
        EXPECT_EQ(from_md[i].length, asked[i].length);
        EXPECT_EQ(from_md[i].perms, asked[i].perms);
    }
    const ote_buffer_info_t *k = Find(from_md, "kv/0");
    ASSERT_NE(k, nullptr);
    std::vector<uint8_t> src(4096, 0x6b);
    ote_batch_t *bt = nullptr;
    ASSERT_EQ(ote_batch_create(a, 1, &bt), OTE_OK);
    ote_request_t r = {OTE_WRITE, src.data(), seg, k->addr + 100, src.size()};
    ASSERT_EQ(ote_batch_submit(bt, &r, 1), OTE_OK);
    ASSERT_EQ(ote_batch_wait(bt, 30 * kSec), OTE_OK);
    EXPECT_EQ(0, memcmp(kv.data() + 100, src.data(), src.size()));
    EXPECT_EQ(ote_batch_destroy(bt), OTE_OK);
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(a), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(b, kv.data()), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(b, aux.data()), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(b, plain.data()), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(b), OTE_OK);
}

// The engine's name (engine_name) in its metadata blob (issue 27): an unnamed engine's blob
// is version 1 (what engines before names read) and carries ""; a named one's is version 2
// with the name after the entries, and still lists its buffers and opens its segment. A
// named blob whose name is damaged (a control byte, cut, longer than its length, empty) is
// PROTOCOL.
TEST_F(DiscoveryTest, MetadataBlobCarriesTheEngineName) {
    ote_engine_t *a = NewEngine(), *plain = NewEngine();
    ote_engine_t *named = NewEngine({{"engine_name", "decode 7"}});
    std::vector<uint8_t> kv(4096);
    ASSERT_EQ(ote_memory_register_named(named, kv.data(), kv.size(), OTE_PERM_READ, "kv"), OTE_OK);
    std::vector<uint8_t> md(4096), pm(4096);
    size_t len = 0, plen = 0;
    ASSERT_EQ(ote_engine_metadata(named, md.data(), md.size(), &len), OTE_OK);
    ASSERT_EQ(ote_engine_metadata(plain, pm.data(), pm.size(), &plen), OTE_OK);
    md.resize(len);
    pm.resize(plen);
    EXPECT_EQ(pm[4], 1); // version 1
    EXPECT_EQ(md[4], 2); // version 2
    char name[OTE_ENGINE_NAME_MAX + 1] = "x";
    ASSERT_EQ(ote_engine_metadata_name(pm.data(), plen, name, sizeof(name)), OTE_OK);
    EXPECT_STREQ(name, "");
    ASSERT_EQ(ote_engine_metadata_name(md.data(), len, name, sizeof(name)), OTE_OK);
    EXPECT_STREQ(name, "decode 7");
    char small[8];
    EXPECT_EQ(ote_engine_metadata_name(md.data(), len, small, sizeof(small)), OTE_ERR_TOO_BIG);
    ote_buffer_info_t one[1];
    size_t n = 0;
    ASSERT_EQ(ote_engine_metadata_buffers(md.data(), len, one, 1, &n), OTE_OK);
    EXPECT_EQ(n, 1u);
    EXPECT_STREQ(one[0].name, "kv");
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_segment_open_md(a, md.data(), len, &seg), OTE_OK);
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    // The name is the last 2 + 8 bytes: its length, then "decode 7".
    ASSERT_EQ(md[len - 10], 8);
    std::vector<uint8_t> bad = md;
    bad[len - 1] = '\n';
    EXPECT_EQ(ote_engine_metadata_name(bad.data(), len, name, sizeof(name)), OTE_ERR_PROTOCOL);
    EXPECT_EQ(ote_engine_metadata_buffers(bad.data(), len, one, 1, &n), OTE_ERR_PROTOCOL);
    EXPECT_EQ(ote_engine_metadata_name(md.data(), len - 1, name, sizeof(name)), OTE_ERR_PROTOCOL);
    bad = md;
    bad[len - 10] = 9; // one byte more than there is
    EXPECT_EQ(ote_engine_metadata_name(bad.data(), len, name, sizeof(name)), OTE_ERR_PROTOCOL);
    bad = md;
    bad.resize(len - 8);
    bad[len - 10] = 0; // an empty name
    EXPECT_EQ(ote_engine_metadata_name(bad.data(), bad.size(), name, sizeof(name)),
              OTE_ERR_PROTOCOL);
    bad = pm;
    bad[4] = 2; // version 2 without a name
    EXPECT_EQ(ote_engine_metadata_name(bad.data(), plen, name, sizeof(name)), OTE_ERR_PROTOCOL);
    EXPECT_EQ(ote_memory_unregister(named, kv.data()), OTE_OK);
    for (ote_engine_t *e : {named, plain, a}) EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
}

// A blob of an engine that is gone, and another engine now at its address: the segment is
// refused (STATE), nothing of the old incarnation is used. A damaged blob (every single
// byte flipped, cut short, one byte too many) is PROTOCOL, never a crash or a segment.
TEST_F(DiscoveryTest, MetadataBlobOfAnotherIncarnationOrDamagedIsRefused) {
    ote_engine_t *a = NewEngine(), *b = NewEngine();
    std::vector<uint8_t> kv(4096);
    ASSERT_EQ(ote_memory_register_named(b, kv.data(), kv.size(), OTE_PERM_READ, "kv"), OTE_OK);
    std::vector<uint8_t> md(4096);
    size_t len = 0;
    ASSERT_EQ(ote_engine_metadata(b, md.data(), md.size(), &len), OTE_OK);
    md.resize(len);
    ote_segment_t *seg = nullptr;
    std::vector<uint8_t> bad = md;
    for (size_t i = 0; i < len; i++) {
        bad[i] ^= 0xff;
        size_t n = 0;
        ote_buffer_info_t one[1];
        ote_status_t st = ote_engine_metadata_buffers(bad.data(), len, one, 1, &n);
        EXPECT_TRUE(st == OTE_OK || st == OTE_ERR_PROTOCOL) << i;
        bad[i] = md[i];
    }
    EXPECT_EQ(ote_segment_open_md(a, md.data(), len - 1, &seg), OTE_ERR_PROTOCOL);
    bad.push_back(0);
    EXPECT_EQ(ote_segment_open_md(a, bad.data(), bad.size(), &seg), OTE_ERR_PROTOCOL);
    bad = md;
    bad[0] ^= 1; /* magic */
    EXPECT_EQ(ote_segment_open_md(a, bad.data(), bad.size(), &seg), OTE_ERR_PROTOCOL);
    EXPECT_EQ(seg, nullptr);
    // b restarted at the same address: a new engine listening there.
    const std::string addr = ote_test::EngineAddress(b);
    EXPECT_EQ(ote_memory_unregister(b, kv.data()), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(b), OTE_OK);
    ote_engine_t *b2 = NewEngine({{"listen_address", addr.c_str()}});
    ASSERT_NE(b2, nullptr);
    EXPECT_EQ(ote_segment_open_md(a, md.data(), len, &seg), OTE_ERR_STATE);
    EXPECT_EQ(seg, nullptr);
    EXPECT_TRUE(LogContains("another incarnation"));
    EXPECT_EQ(ote_engine_destroy(b2), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(a), OTE_OK);
}

} // namespace

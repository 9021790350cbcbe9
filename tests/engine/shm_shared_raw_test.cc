// Shared allocations at the source (engine/shm/shm_internal.h, "Shared allocations"),
// played by a raw local process (tests/engine/shm_raw_fixture.h) over a cross-memory-attach
// connection: the source maps a memfd the requester sends with an SHM_MAP message and
// copies pieces flagged SHM_REQ_SHARED through that mapping.
//
// To tell the two paths apart, the MAP names a base address in this process where other
// bytes lie: a piece copied through the mapping carries the memfd's bytes, one copied by
// cross-memory attach the bytes at that address. The engine runs in this process, so its
// mappings of a memfd are counted in /proc/self/maps (ours is one more).
//
//   - a flagged piece is copied through the mapping; an UNMAP entry drops it (later
//     pieces go by cross-memory attach), and so does the connection's end;
//   - a memfd not sealed against shrinking, shorter than its size or not a regular file
//     is refused, the connection goes on and its pieces go by cross-memory attach;
//   - at most SHM_SHARED_MAX mappings per connection; a MAP over an earlier one replaces it;
//   - malformed: a MAP without its fd, with two, with an unaligned base, before the
//     capability was negotiated, and any other message with an fd close the connection
//     (every fd received is closed: the fixture checks that none leaked).
// The engine's own requester: shm_shared_test.
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "tests/engine/shm_raw_fixture.h"

namespace {

using namespace ote_shm_raw; // NOLINT(google-build-using-namespace): the fixture's helpers
using ote_test::kMs;

constexpr size_t kLen = 1u << 20;
std::atomic<uint64_t> g_cookie{0x5eed5eed12345678ull};

// Mappings of memfds named name in this process.
int Maps(const char *name) {
    std::ifstream f("/proc/self/maps");
    int n = 0;
    std::string want = std::string("memfd:") + name;
    for (std::string line; std::getline(f, line);)
        if (line.find(want + " (deleted)") != std::string::npos) n++;
    return n;
}

class ShmSharedRawTest : public ShmHostileTest {
  protected:
    void TearDown() override {
        for (auto &m : maps_) munmap(m.first, m.second);
        for (int fd : fds_) close(fd);
        ShmHostileTest::TearDown();
    }

    // A served cross-memory-attach connection (the probe reads g_cookie here), asking for
    // shared allocations when shared.
    int GoodCma(bool shared) {
        int fd = Connect();
        tw_hello_t h = Hello(0, reinterpret_cast<uintptr_t>(&g_cookie), g_cookie.load());
        if (shared) h.h.pad |= TW_CAP_SHARED;
        tw_hello_ack_t a;
        EXPECT_TRUE(Handshake(fd, &h, sizeof(h), {}, &a));
        EXPECT_EQ(a.status, OTE_OK) << a.text;
        EXPECT_EQ(a.mode, static_cast<uint32_t>(TW_MODE_CMA));
        EXPECT_EQ((a.flags & TW_ACK_SHARED) != 0, shared);
        return fd;
    }

    // A memfd of len bytes named name (sealed against shrinking when seal), kept open
    // here; its bytes set to fill (through a mapping here when map, else a temporary one).
    int Memfd(const char *name, size_t len, bool seal, uint8_t fill) {
        int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
        EXPECT_GE(fd, 0);
        EXPECT_EQ(ftruncate(fd, static_cast<off_t>(len)), 0);
        if (seal) {
            EXPECT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
        }
        void *p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        EXPECT_NE(p, MAP_FAILED);
        memset(p, fill, len);
        munmap(p, len);
        fds_.push_back(fd);
        return fd;
    }

    // Plain memory here (page aligned), filled with fill: where MAPs say the allocation is.
    uint8_t *Plain(size_t len, uint8_t fill) {
        void *p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        EXPECT_NE(p, MAP_FAILED);
        memset(p, fill, len);
        maps_.push_back({p, len});
        return static_cast<uint8_t *>(p);
    }

    static tw_map_t Map(uint64_t id, const void *base, uint64_t size) {
        tw_map_t m;
        memset(&m, 0, sizeof(m));
        m.h = {TW_MAGIC, TW_VERSION, TW_MAP, 0, 0};
        m.id = id;
        m.base = reinterpret_cast<uintptr_t>(base);
        m.size = size;
        return m;
    }

    static tw_req_t Shared(uint16_t op, uint64_t remote, const void *local, uint32_t len) {
        tw_req_t q = Req(op, remote, reinterpret_cast<uintptr_t>(local), len);
        q.flags = TW_REQ_SHARED;
        return q;
    }

    // WRITE 4096 bytes from local (flagged shared) into buf_ at off: the byte that arrived.
    int Arrived(int fd, const void *local, size_t off) {
        int32_t st = One(fd, Shared(TW_OP_WRITE, Buf(off), local, 4096));
        EXPECT_EQ(st, OTE_OK);
        for (size_t i = 1; i < 4096; i++)
            if (buf_[off + i] != buf_[off]) return -1;
        return buf_[off];
    }

    std::vector<std::pair<void *, size_t>> maps_;
    std::vector<int> fds_;
};

TEST_F(ShmSharedRawTest, AFlaggedPieceIsCopiedThroughTheMappingUntilUnmapped) {
    int fd = GoodCma(true);
    uint8_t *at = Plain(kLen, 0x77);
    int mfd = Memfd("raw-shared", kLen, true, 0x5a);
    tw_map_t m = Map(1, at, kLen);
    ASSERT_TRUE(SendWithFds(fd, &m, sizeof(m), {mfd}));
    EXPECT_EQ(Arrived(fd, at + 100, 8192), 0x5a); // the memfd's bytes: through the mapping
    EXPECT_EQ(Maps("raw-shared"), 1);             // the engine's (ours is closed)
    // A READ writes into the memfd, not into the memory at `at`.
    tw_req_t r = Shared(TW_OP_READ, Buf(8192), at + 4096, 4096);
    EXPECT_EQ(One(fd, r), OTE_OK);
    EXPECT_EQ(at[4096], 0x77);
    void *p = mmap(nullptr, kLen, PROT_READ, MAP_SHARED, mfd, 0);
    ASSERT_NE(p, MAP_FAILED);
    EXPECT_EQ(memcmp(static_cast<uint8_t *>(p) + 4096, buf_.data() + 8192, 4096), 0);
    munmap(p, kLen);
    // Unflagged pieces of the same range go by cross-memory attach.
    EXPECT_EQ(One(fd, Req(TW_OP_WRITE, Buf(16384), reinterpret_cast<uintptr_t>(at), 4096)), OTE_OK);
    EXPECT_EQ(buf_[16384], 0x77);
    // UNMAP: dropped once the message is served; later flagged pieces go by attach.
    tw_req_t u = Req(TW_OP_UNMAP, 0, 0, 0);
    u.id = 1;
    std::vector<int32_t> st = Exchange(fd, {u, Shared(TW_OP_WRITE, Buf(20480), at, 4096)});
    ASSERT_EQ(st.size(), 1u);
    EXPECT_EQ(st[0], OTE_OK);
    EXPECT_EQ(Maps("raw-shared"), 0);
    EXPECT_EQ(Arrived(fd, at, 24576), 0x77);
    EXPECT_FALSE(Pinned());
}

TEST_F(ShmSharedRawTest, TheConnectionsEndUnmapsEverything) {
    int fd = GoodCma(true);
    for (uint64_t i = 0; i < 3; i++) {
        tw_map_t m = Map(i + 1, Plain(kLen, 1), kLen);
        ASSERT_TRUE(SendWithFds(fd, &m, sizeof(m), {Memfd("raw-end", kLen, true, 2)}));
    }
    EXPECT_EQ(One(fd, Req(TW_OP_READ, Buf(0), reinterpret_cast<uintptr_t>(Plain(4096, 0)), 4096)),
              OTE_OK);
    EXPECT_EQ(Maps("raw-end"), 3);
    CloseRaw();
    EXPECT_TRUE(ote_test::WaitUntil([&] { return Maps("raw-end") == 0; },
                                    std::chrono::milliseconds(kWaitMs),
                                    "the closed connection's memfd mappings gone"));
}

TEST_F(ShmSharedRawTest, UnsafeMemfdsAreRefusedAndTheirPiecesGoByAttach) {
    int fd = GoodCma(true);
    uint8_t *at = Plain(kLen, 0x77);
    tw_map_t m = Map(1, at, kLen);
    // Not sealed against shrinking: a truncation would turn a copy into a SIGBUS.
    ASSERT_TRUE(SendWithFds(fd, &m, sizeof(m), {Memfd("raw-unsealed", kLen, false, 0x5a)}));
    EXPECT_EQ(Arrived(fd, at, 0), 0x77);
    EXPECT_EQ(Maps("raw-unsealed"), 0);
    // Shorter than the size the MAP names.
    ASSERT_TRUE(SendWithFds(fd, &m, sizeof(m), {Memfd("raw-short", kLen / 2, true, 0x5a)}));
    EXPECT_EQ(Arrived(fd, at, 4096), 0x77);
    EXPECT_EQ(Maps("raw-short"), 0);
    // Not a regular file.
    int pp[2];
    ASSERT_EQ(pipe(pp), 0);
    ASSERT_TRUE(SendWithFds(fd, &m, sizeof(m), {pp[0]}));
    close(pp[0]);
    close(pp[1]);
    EXPECT_EQ(Arrived(fd, at, 8192), 0x77);
    // hugetlbfs (where this kernel lets a memfd be created there): a hole punched after
    // the source mapped it could SIGBUS it when no huge page is free. Refused.
    int h = memfd_create("raw-huge", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB);
    if (h >= 0 && ftruncate(h, 2u << 20) == 0 && fcntl(h, F_ADD_SEALS, F_SEAL_SHRINK) == 0) {
        tw_map_t hm = Map(2, at, 2u << 20);
        ASSERT_TRUE(SendWithFds(fd, &hm, sizeof(hm), {h}));
        EXPECT_EQ(Arrived(fd, at, 12288), 0x77);
        EXPECT_EQ(Maps("raw-huge"), 0);
    } else {
        printf("no sealed hugetlb memfd here (%s): that refusal is not exercised\n",
               strerror(errno));
    }
    if (h >= 0) close(h);
    EXPECT_FALSE(Pinned());
}

TEST_F(ShmSharedRawTest, AtMost64MappingsAndANewMapReplacesAnOverlappingOne) {
    int fd = GoodCma(true);
    std::vector<uint8_t *> bases;
    for (uint64_t i = 0; i < TW_SHARED_MAX + 1; i++) {
        bases.push_back(Plain(4096, 0));
        tw_map_t m = Map(i + 1, bases.back(), 4096);
        ASSERT_TRUE(SendWithFds(fd, &m, sizeof(m), {Memfd("raw-many", 4096, true, 3)}));
        if (i % 8 == 7) close(fds_.back()), fds_.pop_back(); // fewer fds held here
    }
    uint8_t *probe = Plain(4096, 0);
    EXPECT_EQ(One(fd, Req(TW_OP_READ, Buf(0), reinterpret_cast<uintptr_t>(probe), 4096)), OTE_OK);
    EXPECT_EQ(Maps("raw-many"), TW_SHARED_MAX);
    EXPECT_EQ(Arrived(fd, bases[3], 0), 3); // through map 4
    // A MAP over map 4 that is refused (not sealed) still retires it: pieces there then go
    // by cross-memory attach, never to the older memfd.
    tw_map_t over = Map(300, bases[3], 4096);
    ASSERT_TRUE(SendWithFds(fd, &over, sizeof(over), {Memfd("raw-over", 4096, false, 9)}));
    EXPECT_EQ(Arrived(fd, bases[3], 4096), 0);
    EXPECT_EQ(Maps("raw-many"), TW_SHARED_MAX - 1);
    EXPECT_EQ(Maps("raw-over"), 0);
    // Two maps at one base: the second replaces the first.
    uint8_t *at = Plain(kLen, 0x77);
    tw_req_t u = Req(TW_OP_UNMAP, 0, 0, 0);
    u.id = 1; // room for them
    tw_req_t u2 = u;
    u2.id = 2;
    std::vector<int32_t> st =
        Exchange(fd, {u, u2, Req(TW_OP_READ, Buf(0), reinterpret_cast<uintptr_t>(probe), 4096)});
    EXPECT_EQ(st.size(), 1u);
    tw_map_t a = Map(100, at, kLen), b = Map(101, at, kLen);
    ASSERT_TRUE(SendWithFds(fd, &a, sizeof(a), {Memfd("raw-first", kLen, true, 0x5a)}));
    EXPECT_EQ(Arrived(fd, at, 0), 0x5a);
    ASSERT_TRUE(SendWithFds(fd, &b, sizeof(b), {Memfd("raw-second", kLen, true, 0x66)}));
    EXPECT_EQ(Arrived(fd, at, 4096), 0x66);
    EXPECT_EQ(Maps("raw-first"), 0);
    EXPECT_EQ(Maps("raw-second"), 1);
}

TEST_F(ShmSharedRawTest, MalformedMapsCloseTheConnection) {
    uint8_t *at = Plain(kLen, 0);
    tw_map_t m = Map(1, at, kLen);
    {
        int fd = GoodCma(true); // a MAP without its fd
        ExpectClosedBy(fd, &m, sizeof(m));
    }
    {
        int fd = GoodCma(true); // with two
        ASSERT_TRUE(SendWithFds(
            fd, &m, sizeof(m), {Memfd("raw-two", kLen, true, 0), Memfd("raw-two", kLen, true, 0)}));
        EXPECT_TRUE(ote_test::ClosedByPeer(fd));
    }
    {
        int fd = GoodCma(true); // an unaligned base
        tw_map_t bad = Map(1, at + 8, kLen);
        ASSERT_TRUE(SendWithFds(fd, &bad, sizeof(bad), {Memfd("raw-bad", kLen, true, 0)}));
        EXPECT_TRUE(ote_test::ClosedByPeer(fd));
    }
    {
        int fd = GoodCma(false); // not negotiated
        ASSERT_TRUE(SendWithFds(fd, &m, sizeof(m), {Memfd("raw-unasked", kLen, true, 0)}));
        EXPECT_TRUE(ote_test::ClosedByPeer(fd));
    }
    {
        int fd = GoodCma(false); // a flagged piece without the capability
        EXPECT_EQ(One(fd, Shared(TW_OP_WRITE, Buf(0), at, 4096)), OTE_ERR_INVALID);
        EXPECT_TRUE(BufIntact());
    }
    {
        int fd = GoodCma(true); // a REQS message with an fd
        std::vector<uint8_t> msg(sizeof(tw_hdr_t) + sizeof(tw_req_t));
        tw_hdr_t h = {TW_MAGIC, TW_VERSION, TW_REQS, 1, 0};
        tw_req_t q = Req(TW_OP_READ, Buf(0), reinterpret_cast<uintptr_t>(at), 4096);
        memcpy(msg.data(), &h, sizeof(h));
        memcpy(msg.data() + sizeof(h), &q, sizeof(q));
        ASSERT_TRUE(SendWithFds(fd, msg.data(), msg.size(), {Memfd("raw-reqs", kLen, true, 0)}));
        EXPECT_TRUE(ote_test::ClosedByPeer(fd));
    }
    EXPECT_EQ(Maps("raw-two") + Maps("raw-bad") + Maps("raw-unasked") + Maps("raw-reqs"), 0);
}

TEST_F(ShmSharedRawTest, RingModeNeverOffersIt) {
    tw_hello_t h = Hello(TW_RING_BYTES);
    h.h.pad |= TW_CAP_SHARED;
    int fd = Connect();
    int rfd = MakeRing(TW_RING_BYTES, true);
    ASSERT_GE(rfd, 0);
    fds_.push_back(rfd);
    tw_hello_ack_t a;
    ASSERT_TRUE(Handshake(fd, &h, sizeof(h), {rfd}, &a));
    EXPECT_EQ(a.status, OTE_OK) << a.text;
    EXPECT_EQ(a.mode, static_cast<uint32_t>(TW_MODE_RING));
    EXPECT_EQ(a.flags & TW_ACK_SHARED, 0u);
    tw_map_t m = Map(1, Plain(kLen, 0), kLen);
    ASSERT_TRUE(SendWithFds(fd, &m, sizeof(m), {Memfd("raw-ring", kLen, true, 0)}));
    EXPECT_TRUE(ote_test::ClosedByPeer(fd));
    EXPECT_EQ(Maps("raw-ring"), 0);
}

} // namespace

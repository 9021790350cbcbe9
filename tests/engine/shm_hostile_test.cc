// The same-host transport's source side against hostile local processes: anything in
// the network namespace can connect to an engine's abstract shm socket, so this test
// plays such a process, speaking raw and malformed protocol (the wire messages of
// engine/shm/shm_internal.h, mirrored in shm_wire.h) to an engine of this process, one
// fresh connection per case:
//
//   handshake: no HELLO, garbage, wrong magic / kind / version, a ring that is missing,
//     too small, not a memfd, unsealed (the SIGBUS of a ring shrunk under the source),
//     two fds, a probe with a wrong cookie or a wild address
//   framing after a good HELLO: n > SHM_BATCH_MAX, n not matching the length, a short
//     header, an empty message, wrong magic or kind (each closes the connection)
//   requests: unknown op, len > SHM_MAX_SLICE, ring ranges outside the ring, remote ranges
//     outside any registration or its permissions, pieces outside their own extent,
//     pieces of one req_uid naming another extent or op, WRITE_OFF for unknown uids / too
//     many bytes / another request, 65536+ requests left open (the accounts cap),
//     notifications too long or outside the ring
//
// After every case (TearDown) the hostile connection is closed, the engine still serves a
// normal transfer over shm from a second engine, the buffer unregisters (no pin leaked)
// and the fixture finds no fd leaked.
#include <gtest/gtest.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "tests/engine/shm_raw_fixture.h"

namespace {

using namespace ote_shm_raw; // NOLINT(google-build-using-namespace): the fixture's helpers
using ote_test::kMs;
using ote_test::kSec;

// ---- the handshake ------------------------------------------------------------------

TEST_F(ShmHostileTest, NoHelloIsClosedAtTheHandshakeDeadline) {
    int fd = Connect();
    EXPECT_TRUE(ote_test::ClosedByPeer(fd)); // connect_timeout_ms 1000 (< handshake_timeout_ms)
    EXPECT_TRUE(LogContains("sent no HELLO within 1000 ms"));
}

TEST_F(ShmHostileTest, GarbageOrWrongFirstMessagesAreClosed) {
    const char junk[] = "GET / HTTP/1.0\r\n";
    ExpectClosedBy(Connect(), junk, sizeof(junk));
    tw_hello_t h = Hello(0);
    ExpectClosedBy(Connect(), &h, sizeof(h) - 1); // one byte short
    tw_hello_t big[2] = {h, h};
    ExpectClosedBy(Connect(), big, sizeof(big)); // truncated by the source's buffer: closed
    h.h.magic = ~TW_MAGIC;
    ExpectClosedBy(Connect(), &h, sizeof(h));
    h = Hello(0);
    h.h.kind = TW_REQS;
    ExpectClosedBy(Connect(), &h, sizeof(h));
    tw_hdr_t reqs = {TW_MAGIC, TW_VERSION, TW_REQS, 0, 0};
    ExpectClosedBy(Connect(), &reqs, sizeof(reqs));
    ExpectClosedBy(Connect(), "", 0); // an empty message
}

// The requester's engine name (issue 27) is optional: a HELLO without it (its first
// offsetof(name) bytes, what engines before names and unnamed ones send) and one with a
// printable name are both served; a name without its NUL or with a control character
// closes the connection.
TEST_F(ShmHostileTest, HelloNameIsOptionalAndChecked) {
    int ring = MakeRing(TW_RING_BYTES, true);
    ASSERT_GE(ring, 0);
    tw_hello_t h = Hello(TW_RING_BYTES);
    for (size_t len : {offsetof(tw_hello_t, name), sizeof(tw_hello_t)}) {
        int fd = Connect();
        tw_hello_ack_t a;
        if (len == sizeof(h)) snprintf(h.name, sizeof(h.name), "decode-1");
        ASSERT_TRUE(Handshake(fd, &h, len, {ring}, &a)) << len;
        EXPECT_EQ(a.status, OTE_OK) << a.text;
        close(fd);
    }
    memset(h.name, 'n', sizeof(h.name)); // unterminated
    ExpectClosedBy(Connect(), &h, sizeof(h));
    snprintf(h.name, sizeof(h.name), "bad\nname");
    ExpectClosedBy(Connect(), &h, sizeof(h));
    close(ring);
}

TEST_F(ShmHostileTest, WrongVersionIsRefusedWithVersionStatus) {
    int ring = MakeRing(TW_RING_BYTES, true);
    ASSERT_GE(ring, 0);
    for (uint16_t v : {0, 1, 2, TW_VERSION + 1, 0xffff}) {
        tw_hello_t h = Hello(TW_RING_BYTES);
        h.h.version = v;
        ExpectRefused(h, {ring}, OTE_ERR_VERSION);
    }
    close(ring);
}

TEST_F(ShmHostileTest, RingModeWithoutAUsableRingIsRefused) {
    ExpectRefused(Hello(TW_RING_BYTES), {}, OTE_ERR_UNSUPPORTED); // no fd at all
    int small = MakeRing(4096, true);
    ASSERT_GE(small, 0);
    ExpectRefused(Hello(TW_RING_BYTES), {small}, OTE_ERR_UNSUPPORTED); // fd smaller than said
    ExpectRefused(Hello(0), {small}, OTE_ERR_UNSUPPORTED);             // ring_len 0
    ExpectRefused(Hello(1ull << 40), {small}, OTE_ERR_UNSUPPORTED);    // absurd ring_len
    close(small);
    int p[2];
    ASSERT_EQ(pipe2(p, O_CLOEXEC), 0); // not mappable, no size
    ExpectRefused(Hello(4096), {p[0]}, OTE_ERR_UNSUPPORTED);
    close(p[0]);
    close(p[1]);
}

// Two fds where the source expects at most one: its control buffer truncates, it closes
// the connection and whatever fd it got (the fixture counts this process's fds).
TEST_F(ShmHostileTest, TwoFdsInTheHelloAreClosedWithoutLeakingEither) {
    int a = MakeRing(TW_RING_BYTES, true), b = MakeRing(TW_RING_BYTES, true);
    ASSERT_GE(a, 0);
    ASSERT_GE(b, 0);
    int fd = Connect();
    tw_hello_t h = Hello(TW_RING_BYTES);
    EXPECT_TRUE(SendWithFds(fd, &h, sizeof(h), {a, b}));
    EXPECT_TRUE(ote_test::ClosedByPeer(fd));
    close(a);
    close(b);
}

// A ring the requester can shrink under the source would turn the source's next copy into
// a SIGBUS of the whole engine process: the source accepts only a ring sealed against
// shrinking. (Before the fix an unsealed ring was accepted; shrinking it and asking for a
// READ killed this process.)
TEST_F(ShmHostileTest, UnsealedRingIsRefusedSoItCannotBeShrunkUnderTheSource) {
    int ring = MakeRing(TW_RING_BYTES, false);
    ASSERT_GE(ring, 0);
    int fd = Connect();
    tw_hello_t h = Hello(TW_RING_BYTES);
    tw_hello_ack_t a;
    ASSERT_TRUE(Handshake(fd, &h, sizeof(h), {ring}, &a));
    EXPECT_EQ(a.status, OTE_ERR_UNSUPPORTED) << a.text;
    if (a.status == OTE_OK) { // what the source must never have accepted
        ASSERT_EQ(ftruncate(ring, 0), 0);
        One(fd, Req(TW_OP_READ, Buf(), 0, 4096));
    } else {
        EXPECT_TRUE(ote_test::ClosedByPeer(fd));
    }
    close(ring);
    // A sealed ring cannot be shrunk at all.
    int sealed = MakeRing(TW_RING_BYTES, true);
    ASSERT_GE(sealed, 0);
    EXPECT_NE(ftruncate(sealed, 0), 0);
    close(sealed);
}

TEST_F(ShmHostileTest, ProbeWithAWrongCookieFallsBackToTheRingOrIsRefused) {
    volatile uint64_t cookie = 0x1234567890abcdefull;
    uint64_t where = reinterpret_cast<uintptr_t>(&cookie);
    // Wrong cookie, no ring: refused.
    ExpectRefused(Hello(0, where, cookie + 1), {}, OTE_ERR_UNSUPPORTED);
    // A wild address, no ring: refused.
    ExpectRefused(Hello(0, 0x10, 1), {}, OTE_ERR_UNSUPPORTED);
    // Wrong cookie with a ring: served over the ring.
    int ring = MakeRing(TW_RING_BYTES, true);
    ASSERT_GE(ring, 0);
    int fd = Connect();
    tw_hello_t h = Hello(TW_RING_BYTES, where, cookie ^ 1);
    tw_hello_ack_t a;
    ASSERT_TRUE(Handshake(fd, &h, sizeof(h), {ring}, &a));
    EXPECT_EQ(a.status, OTE_OK) << a.text;
    EXPECT_EQ(a.mode, static_cast<uint32_t>(TW_MODE_RING));
    close(ring);
}

// ---- framing after a good HELLO -----------------------------------------------------

TEST_F(ShmHostileTest, MalformedReqsFramesCloseTheConnection) {
    std::vector<tw_req_t> many(TW_BATCH_MAX + 1, Req(TW_OP_READ, Buf(), 0, 1));
    auto frame = [&](uint32_t n, size_t entries, size_t extra) {
        std::vector<uint8_t> m(sizeof(tw_hdr_t) + entries * sizeof(tw_req_t) + extra, 0);
        tw_hdr_t h = {TW_MAGIC, TW_VERSION, TW_REQS, n, 0};
        memcpy(m.data(), &h, sizeof(h));
        memcpy(m.data() + sizeof(h), many.data(), entries * sizeof(tw_req_t));
        return m;
    };
    std::vector<std::vector<uint8_t>> bad = {
        frame(TW_BATCH_MAX + 1, TW_BATCH_MAX + 1, 0), // too many, length consistent
        frame(TW_BATCH_MAX + 1, 0, 0),                // too many, header only
        frame(0xffffffffu, 1, 0),                     // n wraps a size computation?
        frame(2, 1, 0),                               // n larger than the entries
        frame(1, 2, 0),                               // n smaller than the entries
        frame(1, 1, 3),                               // trailing bytes
        frame(1, 0, 0),                               // header only, n 1
        // A full batch followed by more bytes than the source's buffer holds: the whole
        // message is refused, never cut to the buffer and served.
        frame(TW_BATCH_MAX, TW_BATCH_MAX, 4096),
    };
    for (auto &m : bad) ExpectClosedBy(GoodRing(), m.data(), m.size()), CloseRaw();
    tw_hdr_t h = {TW_MAGIC, TW_VERSION, TW_REQS, 0, 0};
    ExpectClosedBy(GoodRing(), &h, sizeof(h) - 1); // truncated header
    CloseRaw();
    ExpectClosedBy(GoodRing(), &h, 4);
    CloseRaw();
    ExpectClosedBy(GoodRing(), "", 0);
    CloseRaw();
    h.magic = ~TW_MAGIC;
    ExpectClosedBy(GoodRing(), &h, sizeof(h));
    CloseRaw();
    h = {TW_MAGIC, TW_VERSION + 1, TW_REQS, 0, 0}; // another version than the HELLO's
    ExpectClosedBy(GoodRing(), &h, sizeof(h));
    CloseRaw();
    h = {TW_MAGIC, TW_VERSION, TW_RESPS, 0, 0}; // a kind it does not take
    ExpectClosedBy(GoodRing(), &h, sizeof(h));
    CloseRaw();
    tw_hello_t again = Hello(TW_RING_BYTES); // a second HELLO
    ExpectClosedBy(GoodRing(), &again, sizeof(again));
    EXPECT_TRUE(BufIntact());
}

TEST_F(ShmHostileTest, EmptyReqsGetsNoAnswerAndTheConnectionGoesOn) {
    int fd = GoodRing();
    tw_hdr_t h = {TW_MAGIC, TW_VERSION, TW_REQS, 0, 0};
    ASSERT_EQ(send(fd, &h, sizeof(h), MSG_NOSIGNAL), static_cast<ssize_t>(sizeof(h)));
    memset(ring_, 0, 64);
    EXPECT_EQ(One(fd, Req(TW_OP_READ, Buf(100), 0, 64)), OTE_OK);
    EXPECT_EQ(memcmp(ring_, buf_.data() + 100, 64), 0);
}

// ---- requests -----------------------------------------------------------------------

TEST_F(ShmHostileTest, UnknownOpsAndOversizedPiecesAreRefused) {
    int fd = GoodRing();
    for (uint16_t op : {0, 1, 2, 4, 6, 8, 10, 0xffff})
        EXPECT_EQ(One(fd, Req(op, Buf(), 0, 16)), OTE_ERR_INVALID) << "op " << op;
    EXPECT_EQ(One(fd, Req(TW_OP_WRITE, Buf(), 0, TW_MAX_SLICE + 1)), OTE_ERR_TOO_BIG);
    EXPECT_EQ(One(fd, Req(TW_OP_READ, Buf(), 0, 0xffffffffu)), OTE_ERR_TOO_BIG);
    EXPECT_TRUE(BufIntact());
    EXPECT_FALSE(Pinned());
}

TEST_F(ShmHostileTest, RingRangesOutsideTheRingAreRefused) {
    int fd = GoodRing();
    memset(ring_, 0xee, TW_RING_BYTES);
    struct {
        uint64_t local;
        uint32_t len;
    } bad[] = {{TW_RING_BYTES - 10, 11}, {TW_RING_BYTES, 1}, {TW_RING_BYTES + 1, 0}, {~0ull, 1},
               {~0ull - 5, 10},          {1, TW_RING_BYTES}};
    for (auto &b : bad) {
        // len bounded by the registration so that only the ring check is at stake
        uint32_t len = b.len > kBufLen ? static_cast<uint32_t>(kBufLen) : b.len;
        if (b.len > kBufLen) b.local = TW_RING_BYTES - len + 1;
        EXPECT_EQ(One(fd, Req(TW_OP_WRITE, Buf(), b.local, len)), OTE_ERR_INVALID) << b.local;
        EXPECT_EQ(One(fd, Req(TW_OP_READ, Buf(), b.local, len)), OTE_ERR_INVALID) << b.local;
    }
    EXPECT_TRUE(BufIntact());
    // The very end of the ring is fine.
    EXPECT_EQ(One(fd, Req(TW_OP_READ, Buf(8), TW_RING_BYTES - 8, 8)), OTE_OK);
    EXPECT_EQ(memcmp(ring_ + TW_RING_BYTES - 8, buf_.data() + 8, 8), 0);
    EXPECT_FALSE(Pinned());
}

TEST_F(ShmHostileTest, RemoteRangesOutsideTheRegistrationsAreAccessErrors) {
    std::vector<uint8_t> other(8192, 0x5c); // this process's, never registered
    std::vector<uint8_t> ro(8192, 0x3d);    // registered read-only
    ASSERT_EQ(ote_memory_register(target_, ro.data(), ro.size(), OTE_PERM_READ), OTE_OK);
    int fd = GoodRing();
    memset(ring_, 0x77, 1 << 20);
    uint64_t o = reinterpret_cast<uintptr_t>(other.data());
    uint64_t r = reinterpret_cast<uintptr_t>(ro.data());
    EXPECT_EQ(One(fd, Req(TW_OP_WRITE, o, 0, 100)), OTE_ERR_ACCESS);
    EXPECT_EQ(One(fd, Req(TW_OP_READ, o, 0, 100)), OTE_ERR_ACCESS);
    EXPECT_EQ(One(fd, Req(TW_OP_WRITE, Buf(kBufLen - 10), 0, 20)), OTE_ERR_ACCESS); // straddles
    EXPECT_EQ(One(fd, Req(TW_OP_WRITE, Buf() - 10, 0, 20)), OTE_ERR_ACCESS);
    EXPECT_EQ(One(fd, Req(TW_OP_WRITE, Buf(kBufLen), 0, 1)), OTE_ERR_ACCESS);
    EXPECT_EQ(One(fd, Req(TW_OP_READ, 0x1000, 0, 1)), OTE_ERR_ACCESS);
    EXPECT_NE(One(fd, Req(TW_OP_WRITE, ~0ull - 5, 0, 100)), OTE_OK); // wraps
    EXPECT_NE(One(fd, Req(TW_OP_WRITE, Buf(), 0, 16, 0, Buf(), ~0ull)), OTE_OK);
    EXPECT_NE(One(fd, Req(TW_OP_WRITE, Buf(), 0, 16, 0, Buf(), ~0ull - Buf() + 1)), OTE_OK);
    EXPECT_EQ(One(fd, Req(TW_OP_WRITE, r, 0, 100)), OTE_ERR_ACCESS); // read-only
    EXPECT_EQ(One(fd, Req(TW_OP_READ, r, 0, 100)), OTE_OK);
    EXPECT_EQ(memcmp(ring_, ro.data(), 100), 0);
    // A request whose extent leaves the registration moves none of its pieces, even the
    // ones inside.
    EXPECT_EQ(One(fd, Req(TW_OP_WRITE, Buf(), 0, 16, 41, Buf(), kBufLen + 4096)), OTE_ERR_ACCESS);
    EXPECT_EQ(One(fd, Req(TW_OP_WRITE, Buf(16), 16, 16, 41, Buf(), kBufLen + 4096)),
              OTE_ERR_ACCESS);
    EXPECT_EQ(One(fd, Req(TW_OP_WRITE, Buf(), 0, 16, 0, Buf(), kBufLen + 1)), OTE_ERR_ACCESS);
    EXPECT_TRUE(BufIntact());
    EXPECT_EQ(other, std::vector<uint8_t>(8192, 0x5c));
    EXPECT_EQ(ro, std::vector<uint8_t>(8192, 0x3d));
    EXPECT_FALSE(Pinned()); // request 41 is still open, refused: it holds no pin
    CloseRaw();
    EXPECT_EQ(ote_memory_unregister(target_, ro.data()), OTE_OK);
}

TEST_F(ShmHostileTest, PiecesOutsideTheirOwnExtentAreInvalid) {
    int fd = GoodRing();
    memset(ring_, 0x99, 4096);
    uint64_t ext = Buf(1000);
    EXPECT_EQ(One(fd, Req(TW_OP_WRITE, Buf(1200), 0, 10, 0, ext, 100)), OTE_ERR_INVALID);
    EXPECT_EQ(One(fd, Req(TW_OP_WRITE, Buf(999), 0, 10, 0, ext, 100)), OTE_ERR_INVALID);
    EXPECT_EQ(One(fd, Req(TW_OP_WRITE, Buf(1095), 0, 10, 0, ext, 100)), OTE_ERR_INVALID);
    EXPECT_EQ(One(fd, Req(TW_OP_WRITE, Buf(1000), 0, 101, 0, ext, 100)), OTE_ERR_INVALID);
    EXPECT_EQ(One(fd, Req(TW_OP_WRITE, Buf(1200), 0, 10, 5, ext, 100)), OTE_ERR_INVALID);
    EXPECT_EQ(One(fd, Req(TW_OP_WRITE, ~0ull, 0, 10, 5, ext, 100)), OTE_ERR_INVALID);
    EXPECT_TRUE(BufIntact());
    EXPECT_FALSE(Pinned());
}

TEST_F(ShmHostileTest, PiecesOfOneRequestMustNameItsExtentAndOp) {
    int fd = GoodRing();
    memset(ring_, 0x42, 4096);
    uint64_t ext = Buf(2000);
    EXPECT_EQ(One(fd, Req(TW_OP_WRITE, ext, 0, 100, 7, ext, 300)), OTE_OK);
    EXPECT_TRUE(Pinned()); // 200 bytes of request 7 still to come
    // The same uid naming another extent, or another op, is refused alone.
    EXPECT_EQ(One(fd, Req(TW_OP_WRITE, Buf(2100), 0, 100, 7, Buf(2100), 200)), OTE_ERR_INVALID);
    EXPECT_EQ(One(fd, Req(TW_OP_WRITE, Buf(2100), 0, 100, 7, ext, 400)), OTE_ERR_INVALID);
    EXPECT_EQ(One(fd, Req(TW_OP_READ, Buf(2100), 0, 100, 7, ext, 300)), OTE_ERR_INVALID);
    // More bytes than the request has left (200), though inside its extent.
    EXPECT_EQ(One(fd, Req(TW_OP_WRITE, Buf(2050), 0, 250, 7, ext, 300)), OTE_ERR_INVALID);
    EXPECT_TRUE(Pinned());
    EXPECT_EQ(One(fd, Req(TW_OP_WRITE, Buf(2100), 0, 200, 7, ext, 300)), OTE_OK);
    EXPECT_FALSE(Pinned()); // every byte of request 7 came: its pin is gone
    for (size_t i = 2000; i < 2300; i++) ASSERT_EQ(buf_[i], 0x42) << i;
    for (size_t i = 2000; i < 2300; i++) buf_[i] = static_cast<uint8_t>(i * 7 + 1);
    EXPECT_TRUE(BufIntact());
}

TEST_F(ShmHostileTest, WriteOffsAreBoundedByTheirOwnRequest) {
    int fd = GoodRing();
    uint64_t ext = Buf(4096);
    // For uids nobody opened: the whole request (nothing opened) or more than it.
    tw_req_t woff = Req(TW_OP_WRITE_OFF, 0, 100, 0, 900, ext, 100);
    tw_req_t woff2 = Req(TW_OP_WRITE_OFF, 0, ~0ull, 0, 901, ext, 100);
    tw_req_t woff0 = Req(TW_OP_WRITE_OFF, 0, 5, 0, 0, ext, 100); // no uid
    std::vector<int32_t> st = Exchange(fd, {woff, woff2, woff0, Req(TW_OP_READ, Buf(), 0, 8)});
    ASSERT_EQ(st.size(), 1u); // write-offs get no response
    EXPECT_EQ(st[0], OTE_OK);
    EXPECT_FALSE(Pinned());
    // An open request (pinned), written off by an entry naming another extent: ignored.
    EXPECT_EQ(One(fd, Req(TW_OP_READ, ext, 0, 100, 10, ext, 1000)), OTE_OK);
    EXPECT_TRUE(Pinned());
    st = Exchange(fd, {Req(TW_OP_WRITE_OFF, 0, 900, 0, 10, Buf(), 1000),
                       Req(TW_OP_WRITE_OFF, 0, 900, 0, 10, ext, 999),
                       Req(TW_OP_WRITE_OFF, 0, 900, 0, 11, ext, 1000), // another uid
                       Req(TW_OP_READ, Buf(), 0, 8)});
    ASSERT_EQ(st.size(), 1u);
    EXPECT_TRUE(Pinned());
    // Written off with far more bytes than it has left: ends, pin released, no underflow
    // that would keep it (or another request) open.
    st = Exchange(fd,
                  {Req(TW_OP_WRITE_OFF, 0, ~0ull, 0, 10, ext, 1000), Req(TW_OP_READ, Buf(), 0, 8)});
    ASSERT_EQ(st.size(), 1u);
    EXPECT_FALSE(Pinned());
    // Pieces of a written-off request are a new request (its uid is free again) and
    // are checked as such.
    EXPECT_EQ(One(fd, Req(TW_OP_READ, ext, 0, 100, 10, ext, 100)), OTE_OK);
    EXPECT_FALSE(Pinned());
    EXPECT_TRUE(BufIntact());
}

// CANCEL entries: only the open request they name (uid and extent) is canceled; its
// pieces still to be served get OTE_ERR_CANCELED and move no byte; its pin goes once its
// last byte is accounted for; entries for other uids or extents change nothing.
TEST_F(ShmHostileTest, CancelStopsOnlyTheOpenRequestItNames) {
    int fd = GoodRing();
    uint64_t ext = Buf(4096);
    // Nothing open: ignored, and they get no response.
    std::vector<int32_t> st = Exchange(
        fd,
        {Req(TW_OP_CANCEL, 0, 0, 0, 700, ext, 3000), Req(TW_OP_CANCEL, 0, 0, 0, 0, ext, 3000),
         Req(TW_OP_CANCEL, ~0ull, ~0ull, ~0u, 701, ~0ull, ~0ull), Req(TW_OP_READ, Buf(), 0, 8)});
    ASSERT_EQ(st.size(), 1u);
    EXPECT_EQ(st[0], OTE_OK);
    EXPECT_FALSE(Pinned());
    memset(ring_, 0x33, 3000);
    // A WRITE of three 1000-byte pieces: the first is served and the request stays open.
    EXPECT_EQ(One(fd, Req(TW_OP_WRITE, ext, 0, 1000, 10, ext, 3000)), OTE_OK);
    EXPECT_TRUE(Pinned());
    // Cancels naming another extent or another uid: the request goes on.
    st = Exchange(
        fd, {Req(TW_OP_CANCEL, 0, 0, 0, 10, ext, 2999), Req(TW_OP_CANCEL, 0, 0, 0, 10, Buf(), 3000),
             Req(TW_OP_CANCEL, 0, 0, 0, 11, ext, 3000),
             Req(TW_OP_WRITE, ext + 1000, 1000, 1000, 10, ext, 3000)});
    ASSERT_EQ(st.size(), 1u);
    EXPECT_EQ(st[0], OTE_OK);
    EXPECT_TRUE(Pinned());
    // The real cancel, with the last piece after it in the same message: not served.
    st = Exchange(fd, {Req(TW_OP_CANCEL, 0, 0, 0, 10, ext, 3000),
                       Req(TW_OP_WRITE, ext + 2000, 2000, 1000, 10, ext, 3000)});
    ASSERT_EQ(st.size(), 1u);
    EXPECT_EQ(st[0], OTE_ERR_CANCELED);
    EXPECT_FALSE(Pinned()); // every byte of it accounted for: its pin is gone
    for (size_t i = 0; i < 2000; i++) ASSERT_EQ(buf_[4096 + i], 0x33) << i;
    for (size_t i = 2000; i < kBufLen - 4096; i++)
        ASSERT_EQ(buf_[4096 + i], static_cast<uint8_t>((4096 + i) * 7 + 1)) << i;
    for (size_t i = 0; i < 4096; i++) ASSERT_EQ(buf_[i], static_cast<uint8_t>(i * 7 + 1)) << i;
    // Its uid is free again: a new request of it is served.
    EXPECT_EQ(One(fd, Req(TW_OP_READ, ext, 0, 100, 10, ext, 100)), OTE_OK);
    EXPECT_FALSE(Pinned());
    // A request of one piece (pinned without an account), read but not yet copied when
    // its CANCEL comes: not copied; a cancel naming another extent leaves its neighbour.
    memset(ring_, 0x44, 200);
    st = Exchange(
        fd, {Req(TW_OP_WRITE, ext, 0, 100, 20, ext, 100),
             Req(TW_OP_WRITE, ext + 100, 100, 100, 21, ext + 100, 100),
             Req(TW_OP_CANCEL, 0, 0, 0, 20, ext, 100), Req(TW_OP_CANCEL, 0, 0, 0, 21, ext, 100)});
    ASSERT_EQ(st.size(), 2u);
    EXPECT_EQ(st[0], OTE_ERR_CANCELED);
    EXPECT_EQ(st[1], OTE_OK);
    for (size_t i = 0; i < 100; i++) ASSERT_EQ(buf_[4096 + i], 0x33) << i;
    for (size_t i = 100; i < 200; i++) ASSERT_EQ(buf_[4096 + i], 0x44) << i;
    EXPECT_FALSE(Pinned());
}

// Cross-memory-attach mode with the ring mapped (small pieces): ring pieces are bounded
// by the ring, and unknown flags are refused; pieces without the flag are addresses.
TEST_F(ShmHostileTest, RingPiecesInAttachModeAreBoundedAndUnknownFlagsRefused) {
    int fd = Connect();
    ring_fd_ = MakeRing(TW_RING_BYTES, true);
    ASSERT_GE(ring_fd_, 0);
    void *mp = mmap(nullptr, TW_RING_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, ring_fd_, 0);
    ASSERT_NE(mp, MAP_FAILED);
    ring_ = static_cast<uint8_t *>(mp);
    static uint64_t cookie = 0x1234567890abcdefull;
    tw_hello_t h = Hello(TW_RING_BYTES, reinterpret_cast<uintptr_t>(&cookie), cookie);
    tw_hello_ack_t a;
    ASSERT_TRUE(Handshake(fd, &h, sizeof(h), {ring_fd_}, &a));
    ASSERT_EQ(a.status, OTE_OK) << a.text;
    ASSERT_EQ(a.mode, static_cast<uint32_t>(TW_MODE_CMA));
    ASSERT_EQ(a.flags & TW_ACK_RING, TW_ACK_RING);
    auto flagged = [](tw_req_t q, uint16_t flags) {
        q.flags = flags;
        return q;
    };
    EXPECT_EQ(One(fd, flagged(Req(TW_OP_WRITE, Buf(), TW_RING_BYTES - 8, 16), TW_REQ_RING)),
              OTE_ERR_INVALID);
    EXPECT_EQ(One(fd, flagged(Req(TW_OP_READ, Buf(), ~0ull - 4, 16), TW_REQ_RING)),
              OTE_ERR_INVALID);
    EXPECT_EQ(One(fd, flagged(Req(TW_OP_READ, Buf(), 0, 16), 2)), OTE_ERR_INVALID);
    EXPECT_EQ(One(fd, flagged(Req(TW_OP_READ, Buf(), 0, 16), 0x8001)), OTE_ERR_INVALID);
    EXPECT_TRUE(BufIntact());
    // A good ring piece in attach mode, and a good attach piece (a local address).
    memset(ring_ + 100, 0, 64);
    EXPECT_EQ(One(fd, flagged(Req(TW_OP_READ, Buf(8), 100, 64), TW_REQ_RING)), OTE_OK);
    EXPECT_EQ(memcmp(ring_ + 100, buf_.data() + 8, 64), 0);
    uint8_t mine[32];
    memset(mine, 0, sizeof(mine));
    EXPECT_EQ(One(fd, Req(TW_OP_READ, Buf(40), reinterpret_cast<uintptr_t>(mine), 32)), OTE_OK);
    EXPECT_EQ(memcmp(mine, buf_.data() + 40, 32), 0);
    EXPECT_FALSE(Pinned());
}

// CUDA IPC is a negotiated capability: a source whose gpu_paths lacks ipc answers a HELLO
// asking for it without SHM_ACK_IPC and refuses the IPC request flags as unknown; one that
// allows ipc acks it, and then checks the flags (a local device buffer only with the ipc
// flag and never in the ring), answers a local device buffer against its host memory
// OTE_ERR_UNSUPPORTED touching nothing, serves an ipc-flagged piece on host memory as any
// piece, and ignores an IPC_DONE naming no piece it holds.
TEST_F(ShmHostileTest, IpcFlagsOnlyWhereNegotiatedAndChecked) {
    static uint64_t cookie = 0x2233445566778899ull;
    {
        int fd = Connect();
        tw_hello_t h = Hello(0, reinterpret_cast<uintptr_t>(&cookie), cookie);
        h.h.pad = TW_CAP_IPC;
        tw_hello_ack_t a;
        ASSERT_TRUE(Handshake(fd, &h, sizeof(h), {}, &a));
        ASSERT_EQ(a.status, OTE_OK) << a.text;
        EXPECT_EQ(a.flags & TW_ACK_IPC, 0u);
        tw_req_t q = Req(TW_OP_READ, Buf(), 0, 16);
        q.flags = TW_REQ_IPC;
        EXPECT_EQ(One(fd, q), OTE_ERR_INVALID);
    }
    ote_engine_t *src = ote_test::NewEngine({{"transports", "shm,tcp"},
                                             {"gpu_paths", "ipc,staging"},
                                             {"connect_timeout_ms", "1000"},
                                             {"transfer_timeout_ms", "5000"}});
    ASSERT_NE(src, nullptr);
    std::vector<uint8_t> sbuf(65536);
    for (size_t i = 0; i < sbuf.size(); i++) sbuf[i] = static_cast<uint8_t>(i * 3 + 5);
    ASSERT_EQ(ote_memory_register(src, sbuf.data(), sbuf.size(), OTE_PERM_READ | OTE_PERM_WRITE),
              OTE_OK);
    const uint64_t sb = reinterpret_cast<uintptr_t>(sbuf.data());
    {
        int fd = Connect(ShmSocketOf(src));
        tw_hello_t h = Hello(0, reinterpret_cast<uintptr_t>(&cookie), cookie);
        h.h.pad = TW_CAP_IPC;
        tw_hello_ack_t a;
        ASSERT_TRUE(Handshake(fd, &h, sizeof(h), {}, &a));
        ASSERT_EQ(a.status, OTE_OK) << a.text;
        ASSERT_EQ(a.flags & TW_ACK_IPC, TW_ACK_IPC);
        uint8_t mine[64];
        memset(mine, 0xee, sizeof(mine));
        const uint64_t local = reinterpret_cast<uintptr_t>(mine);
        auto flagged = [](tw_req_t q, uint16_t flags) {
            q.flags = flags;
            return q;
        };
        EXPECT_EQ(One(fd, flagged(Req(TW_OP_READ, sb, local, 32), TW_REQ_LOCAL_DEV)),
                  OTE_ERR_INVALID);
        EXPECT_EQ(One(fd, flagged(Req(TW_OP_READ, sb, 0, 32),
                                  TW_REQ_LOCAL_DEV | TW_REQ_IPC | TW_REQ_RING)),
                  OTE_ERR_INVALID);
        EXPECT_EQ(One(fd, flagged(Req(TW_OP_READ, sb, 0, 32), 0x10)), OTE_ERR_INVALID);
        // A local device buffer against host memory: nothing moves, either way.
        EXPECT_EQ(One(fd, flagged(Req(TW_OP_READ, sb, local, 32), TW_REQ_LOCAL_DEV | TW_REQ_IPC)),
                  OTE_ERR_UNSUPPORTED);
        for (uint8_t c : mine) EXPECT_EQ(c, 0xee);
        memset(mine, 0x11, sizeof(mine));
        EXPECT_EQ(
            One(fd, flagged(Req(TW_OP_WRITE, sb + 8, local, 32), TW_REQ_LOCAL_DEV | TW_REQ_IPC)),
            OTE_ERR_UNSUPPORTED);
        for (size_t i = 0; i < sbuf.size(); i++)
            ASSERT_EQ(sbuf[i], static_cast<uint8_t>(i * 3 + 5)) << i;
        // The ipc flag on host memory: served as any piece.
        memset(mine, 0, sizeof(mine));
        EXPECT_EQ(One(fd, flagged(Req(TW_OP_READ, sb + 4, local, 64), TW_REQ_IPC)), OTE_OK);
        EXPECT_EQ(memcmp(mine, sbuf.data() + 4, 64), 0);
        // An IPC_DONE for no piece: no answer, no effect; the connection goes on.
        tw_req_t done = Req(TW_OP_IPC_DONE, 0, 0, 0);
        done.id = 12345;
        std::vector<uint8_t> msg(sizeof(tw_hdr_t) + sizeof(tw_req_t));
        tw_hdr_t mh = {TW_MAGIC, TW_VERSION, TW_REQS, 1, 0};
        memcpy(msg.data(), &mh, sizeof(mh));
        memcpy(msg.data() + sizeof(mh), &done, sizeof(done));
        EXPECT_EQ(send(fd, msg.data(), msg.size(), MSG_NOSIGNAL), static_cast<ssize_t>(msg.size()));
        EXPECT_EQ(One(fd, Req(TW_OP_READ, sb, local, 16)), OTE_OK);
        EXPECT_EQ(ote_memory_unregister(src, sbuf.data()), OTE_OK); // no pin left
    }
    CloseRaw();
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
}

// A requester that opens requests and never finishes them holds at most
// SHM_SRC_MAX_REQS accounts; past the cap, pieces are served by pinning alone.
TEST_F(ShmHostileTest, OpenRequestsAreCappedAndPiecesPastTheCapStillWork) {
    int fd = GoodRing();
    const uint64_t total = TW_SRC_MAX_REQS + 2 * TW_BATCH_MAX;
    uint64_t uid = 1;
    while (uid <= total) {
        std::vector<tw_req_t> reqs;
        for (int k = 0; k < TW_BATCH_MAX && uid <= total; k++, uid++)
            reqs.push_back(
                Req(TW_OP_READ, Buf(uid % 4096), uid % 4096, 1, uid, Buf(uid % 4096), 2));
        std::vector<int32_t> st = Exchange(fd, reqs);
        ASSERT_EQ(st.size(), reqs.size()) << "uid " << uid;
        for (int32_t s : st) ASSERT_EQ(s, OTE_OK) << "uid " << uid;
    }
    EXPECT_TRUE(LogContains("no account for a request"));
    // Past the cap a request's refusal is still a refusal and a good piece still moves.
    EXPECT_EQ(One(fd, Req(TW_OP_WRITE, Buf(kBufLen - 1), 0, 2, total + 1, Buf(kBufLen - 1), 2)),
              OTE_ERR_ACCESS);
    ring_[0] = 0;
    EXPECT_EQ(One(fd, Req(TW_OP_READ, Buf(3), 0, 1, total + 2, Buf(3), 2)), OTE_OK);
    EXPECT_EQ(ring_[0], buf_[3]);
    EXPECT_TRUE(Pinned()); // the open requests' pins, released when the connection ends
    EXPECT_TRUE(BufIntact());
}

TEST_F(ShmHostileTest, NotificationsAreBoundedByTheLimitAndTheRing) {
    int fd = GoodRing();
    memset(ring_, 'n', OTE_CTL_MAX_NOTIFY + 1);
    EXPECT_EQ(One(fd, Req(TW_OP_NOTIFY, 0, 0, OTE_CTL_MAX_NOTIFY + 1)), OTE_ERR_TOO_BIG);
    EXPECT_EQ(One(fd, Req(TW_OP_NOTIFY, 0, 0, 0xffffffffu)), OTE_ERR_TOO_BIG);
    EXPECT_EQ(One(fd, Req(TW_OP_NOTIFY, 0, TW_RING_BYTES - 10, 11)), OTE_ERR_INVALID);
    EXPECT_EQ(One(fd, Req(TW_OP_NOTIFY, 0, ~0ull, 1)), OTE_ERR_INVALID);
    EXPECT_EQ(One(fd, Req(TW_OP_NOTIFY, 0, 0, OTE_CTL_MAX_NOTIFY)), OTE_OK);
    std::vector<uint8_t> got(OTE_CTL_MAX_NOTIFY + 16);
    size_t len = 0;
    char from[300] = {0};
    ASSERT_EQ(ote_notify_recv(target_, got.data(), got.size(), &len, from, sizeof(from), 10 * kSec),
              OTE_OK);
    EXPECT_EQ(len, OTE_CTL_MAX_NOTIFY);
    EXPECT_STREQ(from, "hostile:1");
    EXPECT_EQ(got[0], 'n');
    EXPECT_EQ(got[OTE_CTL_MAX_NOTIFY - 1], 'n');
    // Nothing else was delivered.
    EXPECT_EQ(ote_notify_recv(target_, got.data(), got.size(), &len, nullptr, 0, 200 * kMs),
              OTE_ERR_TIMEOUT);
}

// The name a requester gives itself fills its HELLO's addr without a terminating NUL: the
// source cuts it, and its notifications carry the cut name.
TEST_F(ShmHostileTest, AnUnterminatedRequesterNameIsCut) {
    int ring = MakeRing(TW_RING_BYTES, true);
    ASSERT_GE(ring, 0);
    void *m = mmap(nullptr, TW_RING_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, ring, 0);
    ASSERT_NE(m, MAP_FAILED);
    int fd = Connect();
    tw_hello_t h = Hello(TW_RING_BYTES);
    memset(h.addr, 'x', sizeof(h.addr));
    tw_hello_ack_t a;
    ASSERT_TRUE(Handshake(fd, &h, sizeof(h), {ring}, &a));
    EXPECT_EQ(a.status, OTE_OK) << a.text;
    memcpy(m, "hi", 2);
    EXPECT_EQ(One(fd, Req(TW_OP_NOTIFY, 0, 0, 2)), OTE_OK);
    char msg[8] = {0}, from[TW_ADDR_MAX + 64];
    memset(from, 0, sizeof(from));
    size_t len = 0;
    ASSERT_EQ(ote_notify_recv(target_, msg, sizeof(msg), &len, from, sizeof(from), 10 * kSec),
              OTE_OK);
    EXPECT_EQ(std::string(msg, len), "hi");
    EXPECT_EQ(std::string(from), std::string(TW_ADDR_MAX - 1, 'x'));
    munmap(m, TW_RING_BYTES);
    close(ring);
}

// A requester that sends requests and never reads the responses does not hold the
// source's thread: once its socket is full, the source gives up at transfer_timeout_ms
// (2 s here: nothing in the case has to happen before it) and closes the connection.
class ShmHostileDropTest : public ShmHostileTest {
  protected:
    ShmHostileDropTest() { transfer_timeout_ms_ = "2000"; }
};

TEST_F(ShmHostileDropTest, ARequesterThatNeverReadsIsDropped) {
    int fd = GoodRing();
    std::vector<uint8_t> msg(sizeof(tw_hdr_t) + sizeof(tw_req_t));
    tw_hdr_t h = {TW_MAGIC, TW_VERSION, TW_REQS, 1, 0};
    tw_req_t q = Req(TW_OP_READ, Buf(), 0, 1);
    memcpy(msg.data(), &h, sizeof(h));
    memcpy(msg.data() + sizeof(h), &q, sizeof(q));
    ote_deadline_t dl = ote_deadline_after(120 * kSec);
    bool closed = false;
    uint64_t sent = 0;
    while (!closed && !ote_deadline_expired(dl)) {
        pollfd p = {fd, POLLOUT, 0};
        if (poll(&p, 1, 100) <= 0) continue;
        ssize_t r = send(fd, msg.data(), msg.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r == static_cast<ssize_t>(msg.size())) sent++;
        else if (r < 0 && (errno == EPIPE || errno == ECONNRESET)) closed = true;
    }
    EXPECT_TRUE(closed) << sent << " requests sent";
    EXPECT_GT(sent, 1u);
}

// Any local process can connect, so the source serves at most tcp_max_accepted
// connections at once (a thread each), like the TCP listener: more are closed at once,
// and a place frees when a connection ends.
TEST_F(ShmHostileTest, AcceptedConnectionsAreCapped) {
    ote_engine_t *e = ote_test::NewEngine({{"transports", "shm,tcp"}, {"tcp_max_accepted", "2"}});
    ASSERT_NE(e, nullptr);
    std::string sock = ShmSocketOf(e);
    int ring = MakeRing(TW_RING_BYTES, true);
    ASSERT_GE(ring, 0);
    tw_hello_t h = Hello(TW_RING_BYTES);
    auto served = [&](int fd) { // the HELLO may meet a connection already closed
        tw_hello_ack_t a;
        return SendWithFds(fd, &h, sizeof(h), {ring}) &&
               RecvMsg(fd, &a, sizeof(a)) == static_cast<ssize_t>(sizeof(a)) && a.status == OTE_OK;
    };
    int a = Connect(sock), b = Connect(sock);
    EXPECT_TRUE(served(a));
    EXPECT_TRUE(served(b));
    EXPECT_FALSE(served(Connect(sock))); // over the cap: closed, no HELLO_ACK
    EXPECT_TRUE(LogContains("connections reached: closing a new one"));
    shutdown(a, SHUT_RDWR); // frees a place once the source's thread has seen the EOF
    EXPECT_TRUE(ote_test::WaitUntil([&] { return served(Connect(sock)); },
                                    std::chrono::milliseconds(kWaitMs),
                                    "a freed place: a new connection served"));
    close(ring);
    CloseRaw();
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
}

} // namespace

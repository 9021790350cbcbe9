// Unit tests of the control-plane codec and handshake checks.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/util/test_base.h"

extern "C" {
#include "engine/control/auth.h"
#include "engine/control/ctl.h"
}

namespace {

class ControlTest : public ote_test::OteTest {
  protected:
    std::vector<uint8_t> Encode(const ote_ctl_msg_t &m) {
        std::vector<uint8_t> buf(OTE_CTL_HDR_LEN + OTE_CTL_MAX_BODY);
        size_t len = 0;
        EXPECT_EQ(ote_ctl_encode(&m, buf.data(), buf.size(), &len), OTE_OK);
        buf.resize(len);
        return buf;
    }
    static ote_ctl_msg_t Hello(uint16_t lo, uint16_t hi) {
        ote_ctl_msg_t m{};
        m.version = hi;
        m.opcode = OTE_CTL_HELLO;
        m.req_id = 9;
        m.u.hello.min_version = lo;
        m.u.hello.max_version = hi;
        m.u.hello.session = 0x1122334455667788ull;
        m.u.hello.addr = "10.0.0.1:99";
        m.u.hello.addr_len = 11;
        return m;
    }
    static void Put32(std::vector<uint8_t> &b, size_t off, uint32_t v) {
        for (int i = 0; i < 4; i++) b[off + i] = static_cast<uint8_t>(v >> (8 * i));
    }
};

TEST_F(ControlTest, RoundTripEveryOpcode) {
    ote_ctl_msg_t out{};
    size_t used = 0;
    auto hello = Encode(Hello(1, 3));
    ASSERT_EQ(ote_ctl_decode(hello.data(), hello.size(), &out, &used), OTE_OK);
    EXPECT_EQ(used, hello.size());
    EXPECT_EQ(out.opcode, OTE_CTL_HELLO);
    EXPECT_EQ(out.req_id, 9u);
    EXPECT_EQ(out.u.hello.min_version, 1);
    EXPECT_EQ(out.u.hello.max_version, 3);
    EXPECT_EQ(out.u.hello.session, 0x1122334455667788ull);
    EXPECT_EQ(std::string(out.u.hello.addr, out.u.hello.addr_len), "10.0.0.1:99");

    uint8_t rw[OTE_CTL_RW_FRAME_LEN];
    ote_ctl_put_rw(rw, 1, OTE_CTL_WRITE_REQ, 77, 0xdeadbeef000ull, 4096);
    ASSERT_EQ(ote_ctl_decode(rw, sizeof(rw), &out, &used), OTE_OK);
    EXPECT_EQ(used, OTE_CTL_RW_FRAME_LEN); // the 4096 data bytes are not consumed
    EXPECT_EQ(out.data_len, 4096u);
    EXPECT_EQ(out.u.rw.addr, 0xdeadbeef000ull);
    ote_ctl_put_rw(rw, 1, OTE_CTL_READ_REQ, 78, 64, 10);
    ASSERT_EQ(ote_ctl_decode(rw, sizeof(rw), &out, &used), OTE_OK);
    EXPECT_EQ(out.data_len, 0u);
    EXPECT_EQ(out.u.rw.len, 10u);

    // Version 2: the slice names its request's extent; one outside it is malformed.
    uint8_t rw2[OTE_CTL_RW2_FRAME_LEN];
    uint16_t flen = 0;
    ASSERT_EQ(
        ote_ctl_put_rw2(rw2, 2, OTE_CTL_READ_REQ, 79, 0x10000, 4096, 0xf000, 3u << 20, 42, &flen),
        OTE_OK);
    EXPECT_EQ(flen, OTE_CTL_RW2_FRAME_LEN);
    ASSERT_EQ(ote_ctl_decode(rw2, flen, &out, &used), OTE_OK);
    EXPECT_EQ(used, OTE_CTL_RW2_FRAME_LEN);
    EXPECT_EQ(out.u.rw.req_addr, 0xf000u);
    EXPECT_EQ(out.u.rw.req_len, 3u << 20);
    EXPECT_EQ(out.u.rw.req_uid, 42u);
    ASSERT_EQ(
        ote_ctl_put_rw2(rw2, 2, OTE_CTL_READ_REQ, 80, 0x10000, 4096, 0x10001, 8192, 42, &flen),
        OTE_OK);
    EXPECT_EQ(ote_ctl_decode(rw2, flen, &out, &used), OTE_ERR_PROTOCOL); // starts before it
    ASSERT_EQ(
        ote_ctl_put_rw2(rw2, 2, OTE_CTL_READ_REQ, 81, 0x10000, 4096, 0x10000, 4095, 42, &flen),
        OTE_OK);
    EXPECT_EQ(ote_ctl_decode(rw2, flen, &out, &used), OTE_ERR_PROTOCOL); // ends past it
    ASSERT_EQ(ote_ctl_put_rw2(rw2, 1, OTE_CTL_READ_REQ, 82, 64, 10, 0, 1u << 20, 42, &flen),
              OTE_OK);
    EXPECT_EQ(flen, OTE_CTL_RW_FRAME_LEN); // version 1 has no extent: the slice is its own
    ASSERT_EQ(ote_ctl_decode(rw2, flen, &out, &used), OTE_OK);
    EXPECT_EQ(out.u.rw.req_addr, 64u);
    EXPECT_EQ(out.u.rw.req_len, 10u);

    // CANCEL (version 2 only): a list of req_ids.
    uint8_t ids[16];
    for (int i = 0; i < 16; i++) ids[i] = 0;
    ids[0] = 5;
    ids[8] = 7;
    ote_ctl_msg_t cm{};
    cm.version = 2;
    cm.opcode = OTE_CTL_CANCEL;
    cm.u.cancel.ids = ids;
    cm.u.cancel.count = 2;
    uint8_t cbuf[64];
    size_t clen = 0;
    ASSERT_EQ(ote_ctl_encode(&cm, cbuf, sizeof(cbuf), &clen), OTE_OK);
    ASSERT_EQ(ote_ctl_decode(cbuf, clen, &out, &used), OTE_OK);
    EXPECT_EQ(out.opcode, OTE_CTL_CANCEL);
    EXPECT_EQ(out.u.cancel.count, 2u);
    EXPECT_EQ(out.u.cancel.ids[8], 7);
    uint8_t wd[24] = {9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0};
    cm.u.cancel.wd = wd;
    cm.u.cancel.nwd = 1;
    uint8_t cbuf2[128];
    ASSERT_EQ(ote_ctl_encode(&cm, cbuf2, sizeof(cbuf2), &clen), OTE_OK);
    ASSERT_EQ(ote_ctl_decode(cbuf2, clen, &out, &used), OTE_OK);
    EXPECT_EQ(out.u.cancel.nwd, 1u);
    EXPECT_EQ(out.u.cancel.wd[0], 9);
    EXPECT_EQ(out.u.cancel.wd[18], 1);
    cm.version = 1;
    EXPECT_EQ(ote_ctl_encode(&cm, cbuf, sizeof(cbuf), &clen), OTE_ERR_INVALID);

    uint8_t hdr[OTE_CTL_HDR_LEN];
    ote_ctl_put_hdr(hdr, 1, OTE_CTL_READ_RESP, 78, OTE_OK, 10);
    ASSERT_EQ(ote_ctl_decode(hdr, sizeof(hdr), &out, &used), OTE_OK);
    EXPECT_EQ(out.data_len, 10u);
    ote_ctl_put_hdr(hdr, 1, OTE_CTL_WRITE_ACK, 77, OTE_ERR_ACCESS, 0);
    ASSERT_EQ(ote_ctl_decode(hdr, sizeof(hdr), &out, &used), OTE_OK);
    EXPECT_EQ(out.status, OTE_ERR_ACCESS);

    ote_ctl_msg_t n{};
    n.version = 1;
    n.opcode = OTE_CTL_NOTIFY;
    n.u.notify.msg = reinterpret_cast<const uint8_t *>("abc");
    n.u.notify.len = 3;
    auto nb = Encode(n);
    ASSERT_EQ(ote_ctl_decode(nb.data(), nb.size(), &out, &used), OTE_OK);
    EXPECT_EQ(std::string(reinterpret_cast<const char *>(out.u.notify.msg), out.u.notify.len),
              "abc");

    ote_ctl_msg_t er{};
    er.version = 1;
    er.opcode = OTE_CTL_ERROR;
    er.status = OTE_ERR_VERSION;
    er.u.error.min_version = 4;
    er.u.error.max_version = 6;
    er.u.error.text = "no";
    er.u.error.text_len = 2;
    auto eb = Encode(er);
    ASSERT_EQ(ote_ctl_decode(eb.data(), eb.size(), &out, &used), OTE_OK);
    EXPECT_EQ(out.u.error.max_version, 6);
}

TEST_F(ControlTest, TruncatedFramesNeedMoreAtEveryLength) {
    auto hello = Encode(Hello(1, 1));
    ote_ctl_msg_t out{};
    out.req_id = 12345;
    size_t used = 777;
    for (size_t n = 0; n < hello.size(); n++) {
        EXPECT_EQ(ote_ctl_decode(hello.data(), n, &out, &used), OTE_ERR_AGAIN) << n;
        EXPECT_EQ(used, 777u); // outputs untouched
        EXPECT_EQ(out.req_id, 12345u);
    }
}

TEST_F(ControlTest, MalformedAndOversizedFramesAreRejected) {
    ote_ctl_msg_t out{};
    size_t used = 0;
    uint8_t hdr[OTE_CTL_HDR_LEN];
    std::vector<uint8_t> b(64, 0);

    ote_ctl_put_hdr(hdr, 1, OTE_CTL_WRITE_ACK, 1, OTE_OK, 0);
    hdr[0] ^= 0xff;
    EXPECT_EQ(ote_ctl_decode(hdr, sizeof(hdr), &out, &used), OTE_ERR_PROTOCOL); // magic
    EXPECT_EQ(ote_ctl_decode(hdr, 2, &out, &used), OTE_ERR_PROTOCOL);           // early
    ote_ctl_put_hdr(hdr, 0, OTE_CTL_WRITE_ACK, 1, OTE_OK, 0);
    EXPECT_EQ(ote_ctl_decode(hdr, sizeof(hdr), &out, &used), OTE_ERR_PROTOCOL); // version 0
    ote_ctl_put_hdr(hdr, 1, 0, 1, OTE_OK, 0);
    EXPECT_EQ(ote_ctl_decode(hdr, sizeof(hdr), &out, &used), OTE_ERR_PROTOCOL); // opcode 0
    ote_ctl_put_hdr(hdr, 1, 200, 1, OTE_OK, 0);
    EXPECT_EQ(ote_ctl_decode(hdr, sizeof(hdr), &out, &used), OTE_ERR_PROTOCOL); // unknown
    ote_ctl_put_hdr(hdr, 1, OTE_CTL_READ_RESP, 1, OTE_OK, OTE_CTL_MAX_FRAME + 1);
    EXPECT_EQ(ote_ctl_decode(hdr, sizeof(hdr), &out, &used), OTE_ERR_TOO_BIG);
    ote_ctl_put_hdr(hdr, 1, OTE_CTL_READ_RESP, 1, OTE_OK, OTE_CTL_MAX_DATA + 1);
    EXPECT_EQ(ote_ctl_decode(hdr, sizeof(hdr), &out, &used), OTE_ERR_TOO_BIG);
    ote_ctl_put_hdr(hdr, 1, OTE_CTL_NOTIFY, 1, OTE_OK, OTE_CTL_MAX_BODY + 1);
    EXPECT_EQ(ote_ctl_decode(hdr, sizeof(hdr), &out, &used), OTE_ERR_TOO_BIG);
    ote_ctl_put_hdr(hdr, 1, OTE_CTL_WRITE_ACK, 1, OTE_OK, 4);
    EXPECT_EQ(ote_ctl_decode(hdr, sizeof(hdr), &out, &used), OTE_ERR_PROTOCOL); // ack with body
    ote_ctl_put_hdr(hdr, 1, OTE_CTL_READ_RESP, 1, OTE_ERR_ACCESS, 8);
    EXPECT_EQ(ote_ctl_decode(hdr, sizeof(hdr), &out, &used), OTE_ERR_PROTOCOL); // error + data

    // WRITE_REQ whose announced data disagrees with its length field.
    ote_ctl_put_rw(b.data(), 1, OTE_CTL_WRITE_REQ, 1, 4096, 100);
    Put32(b, 20, OTE_CTL_RW_BODY_LEN + 99);
    EXPECT_EQ(ote_ctl_decode(b.data(), OTE_CTL_RW_FRAME_LEN, &out, &used), OTE_ERR_PROTOCOL);
    // READ_REQ over the slice limit, or wrapping the address space.
    // (The encoder refuses to write one; the length field is patched in by hand.)
    EXPECT_EQ(ote_ctl_put_rw(b.data(), 1, OTE_CTL_READ_REQ, 1, 4096, OTE_CTL_MAX_DATA + 1),
              OTE_ERR_INVALID);
    ASSERT_EQ(ote_ctl_put_rw(b.data(), 1, OTE_CTL_READ_REQ, 1, 4096, 10), OTE_OK);
    Put32(b, OTE_CTL_HDR_LEN + 8, OTE_CTL_MAX_DATA + 1);
    EXPECT_EQ(ote_ctl_decode(b.data(), OTE_CTL_RW_FRAME_LEN, &out, &used), OTE_ERR_TOO_BIG);
    ote_ctl_put_rw(b.data(), 1, OTE_CTL_READ_REQ, 1, UINT64_MAX - 5, 10);
    EXPECT_EQ(ote_ctl_decode(b.data(), OTE_CTL_RW_FRAME_LEN, &out, &used), OTE_ERR_PROTOCOL);
    // READ_REQ with a short body.
    ote_ctl_put_hdr(b.data(), 1, OTE_CTL_READ_REQ, 1, OTE_OK, 8);
    EXPECT_EQ(ote_ctl_decode(b.data(), 64, &out, &used), OTE_ERR_PROTOCOL);
    // HELLO with min > max, and with an address over the limit.
    auto h = Encode(Hello(3, 3));
    h[OTE_CTL_HDR_LEN] = 5;
    EXPECT_EQ(ote_ctl_decode(h.data(), h.size(), &out, &used), OTE_ERR_PROTOCOL);
    std::vector<uint8_t> big(OTE_CTL_HDR_LEN + 16 + OTE_CTL_MAX_ADDR + 1, 'a');
    auto hh = Encode(Hello(1, 1));
    memcpy(big.data(), hh.data(), OTE_CTL_HDR_LEN + 16);
    Put32(big, 20, static_cast<uint32_t>(big.size() - OTE_CTL_HDR_LEN));
    EXPECT_EQ(ote_ctl_decode(big.data(), big.size(), &out, &used), OTE_ERR_TOO_BIG);
    // Encoding refuses what decoding would refuse.
    ote_ctl_msg_t m = Hello(1, 1);
    m.u.hello.addr_len = OTE_CTL_MAX_ADDR + 1;
    size_t len = 0;
    EXPECT_EQ(ote_ctl_encode(&m, b.data(), b.size(), &len), OTE_ERR_INVALID);
    m = Hello(1, 1);
    EXPECT_EQ(ote_ctl_encode(&m, b.data(), 10, &len), OTE_ERR_TOO_BIG);
    EXPECT_EQ(ote_ctl_decode(nullptr, 0, &out, &used), OTE_ERR_INVALID);
}

TEST_F(ControlTest, VersionNegotiation) {
    uint16_t v = 0;
    ote_ctl_msg_t h = Hello(1, 5);
    EXPECT_EQ(ote_ctl_negotiate(&h, 2, 3, &v), OTE_OK);
    EXPECT_EQ(v, 3);
    h = Hello(4, 9);
    EXPECT_EQ(ote_ctl_negotiate(&h, 1, 4, &v), OTE_OK);
    EXPECT_EQ(v, 4);
    v = 0;
    h = Hello(5, 9);
    EXPECT_EQ(ote_ctl_negotiate(&h, 1, 4, &v), OTE_ERR_VERSION);
    EXPECT_EQ(v, 0);
    h.opcode = OTE_CTL_NOTIFY;
    EXPECT_EQ(ote_ctl_negotiate(&h, 1, 4, &v), OTE_ERR_PROTOCOL);

    ote_ctl_msg_t ack{};
    ack.opcode = OTE_CTL_HELLO_ACK;
    ack.version = 2;
    ack.u.hello_ack.version = 2;
    ack.u.hello_ack.max_data = OTE_CTL_MIN_DATA;
    EXPECT_EQ(ote_ctl_check_hello_ack(&ack, 1, 3, &v), OTE_OK);
    EXPECT_EQ(v, 2);
    // max_data outside [OTE_CTL_MIN_DATA, OTE_CTL_MAX_DATA] refuses the source.
    for (uint32_t md : {1u, 2u, OTE_CTL_MIN_DATA - 1, OTE_CTL_MAX_DATA + 1, 0xfffffff0u}) {
        ote_ctl_msg_t bad = ack;
        bad.u.hello_ack.max_data = md;
        v = 0;
        EXPECT_EQ(ote_ctl_check_hello_ack(&bad, 1, 3, &v), OTE_ERR_PROTOCOL) << md;
        EXPECT_EQ(v, 0);
    }
    ack.u.hello_ack.max_data = OTE_CTL_MAX_DATA;
    EXPECT_EQ(ote_ctl_check_hello_ack(&ack, 1, 3, &v), OTE_OK);
    ack.version = ack.u.hello_ack.version = 7;
    EXPECT_EQ(ote_ctl_check_hello_ack(&ack, 1, 3, &v), OTE_ERR_VERSION);
    ote_ctl_msg_t err{};
    err.opcode = OTE_CTL_ERROR;
    err.status = OTE_ERR_VERSION;
    EXPECT_EQ(ote_ctl_check_hello_ack(&err, 1, 3, &v), OTE_ERR_VERSION);
    // Other refusals pass through ote_ctl_peer_status: a peer's local-only code does not
    // become ours.
    err.status = OTE_ERR_BUSY;
    EXPECT_EQ(ote_ctl_check_hello_ack(&err, 1, 3, &v), OTE_ERR_REMOTE);
    err.status = OTE_ERR_UNSUPPORTED;
    EXPECT_EQ(ote_ctl_check_hello_ack(&err, 1, 3, &v), OTE_ERR_UNSUPPORTED);
    err.opcode = OTE_CTL_WRITE_ACK;
    EXPECT_EQ(ote_ctl_check_hello_ack(&err, 1, 3, &v), OTE_ERR_PROTOCOL);
}

TEST_F(ControlTest, PutRwNeverWrapsTheFrameLength) {
    uint8_t rw[OTE_CTL_RW_FRAME_LEN];
    memset(rw, 0xAB, sizeof(rw));
    // A length near 4 GiB would wrap 16 + len into a short frame: refused, nothing written.
    EXPECT_EQ(ote_ctl_put_rw(rw, 1, OTE_CTL_WRITE_REQ, 1, 4096, 0xfffffff8u), OTE_ERR_INVALID);
    for (uint8_t x : rw) EXPECT_EQ(x, 0xAB);
    ASSERT_EQ(ote_ctl_put_rw(rw, 1, OTE_CTL_WRITE_REQ, 1, 4096, OTE_CTL_MAX_DATA), OTE_OK);
    ote_ctl_msg_t out{};
    size_t used = 0;
    ASSERT_EQ(ote_ctl_decode(rw, sizeof(rw), &out, &used), OTE_OK);
    EXPECT_EQ(out.length, OTE_CTL_RW_BODY_LEN + OTE_CTL_MAX_DATA);
    EXPECT_EQ(out.data_len, OTE_CTL_MAX_DATA);
}

TEST_F(ControlTest, PeerStatusAdmitsOnlyWhatEachAnswerMayCarry) {
    // Ordinary refusals pass.
    EXPECT_EQ(ote_ctl_peer_status(OTE_CTL_WRITE_ACK, OTE_OK), OTE_OK);
    EXPECT_EQ(ote_ctl_peer_status(OTE_CTL_WRITE_ACK, OTE_ERR_ACCESS), OTE_ERR_ACCESS);
    EXPECT_EQ(ote_ctl_peer_status(OTE_CTL_READ_RESP, OTE_ERR_ACCESS), OTE_ERR_ACCESS);
    EXPECT_EQ(ote_ctl_peer_status(OTE_CTL_NOTIFY_ACK, OTE_ERR_AGAIN), OTE_ERR_AGAIN);
    EXPECT_EQ(ote_ctl_peer_status(OTE_CTL_ERROR, OTE_ERR_VERSION), OTE_ERR_VERSION);
    EXPECT_EQ(ote_ctl_peer_status(OTE_CTL_RDMA, OTE_ERR_AGAIN), OTE_ERR_AGAIN);
    // Local-only codes, errno bits and codes outside the answer's set become REMOTE.
    const ote_status_t local_only[] = {OTE_ERR_RETAINED,
                                       OTE_ERR_BUSY,
                                       OTE_ERR_NOMEM,
                                       OTE_ERR_TIMEOUT,
                                       OTE_ERR_CANCELED,
                                       OTE_ERR_PEER_LOST,
                                       OTE_ERR_FENCED,
                                       OTE_ERR_FAULT,
                                       OTE_ERR_STATE,
                                       ote_status_make(OTE_ERR_NATIVE, 12),
                                       ote_status_make(OTE_ERR_ACCESS, 13),
                                       0x7fff1234};
    for (uint16_t op :
         {OTE_CTL_WRITE_ACK, OTE_CTL_READ_RESP, OTE_CTL_NOTIFY_ACK, OTE_CTL_ERROR, OTE_CTL_RDMA}) {
        for (ote_status_t st : local_only) {
            if (op == OTE_CTL_READ_RESP && st == OTE_ERR_CANCELED) continue; /* a withdrawn READ */
            EXPECT_EQ(ote_ctl_peer_status(op, st), OTE_ERR_REMOTE) << op << " " << st;
        }
        // Code 0 with errno bits: not a success, not a reason.
        EXPECT_EQ(ote_ctl_peer_status(op, ote_status_make(OTE_ERR_NATIVE, 5) & ~0xffff),
                  OTE_ERR_PROTOCOL)
            << op;
        EXPECT_EQ(ote_ctl_peer_status(op, static_cast<ote_status_t>(0x80000000u)), OTE_ERR_PROTOCOL)
            << op;
    }
    // A READ the requester withdrew (CANCEL) is answered CANCELED; nothing else is.
    EXPECT_EQ(ote_ctl_peer_status(OTE_CTL_READ_RESP, OTE_ERR_CANCELED), OTE_ERR_CANCELED);
    EXPECT_EQ(ote_ctl_peer_status(OTE_CTL_WRITE_ACK, OTE_ERR_CANCELED), OTE_ERR_REMOTE);
    EXPECT_EQ(ote_ctl_peer_status(OTE_CTL_WRITE_ACK, OTE_ERR_AGAIN), OTE_ERR_REMOTE);
    EXPECT_EQ(ote_ctl_peer_status(OTE_CTL_READ_RESP, OTE_ERR_VERSION), OTE_ERR_REMOTE);
    EXPECT_EQ(ote_ctl_peer_status(OTE_CTL_NOTIFY_ACK, OTE_ERR_ACCESS), OTE_ERR_REMOTE);
    EXPECT_EQ(ote_ctl_peer_status(OTE_CTL_ERROR, OTE_ERR_AGAIN), OTE_ERR_REMOTE);
    EXPECT_EQ(ote_ctl_peer_status(OTE_CTL_ERROR, OTE_OK), OTE_ERR_PROTOCOL);
    EXPECT_EQ(ote_ctl_peer_status(OTE_CTL_HELLO, OTE_ERR_ACCESS), OTE_ERR_REMOTE);
}

// ---- buffer discovery: BUFS_REQ / BUFS ---------------------------------------------

ote_ctl_buf_t Buf(uint64_t addr, uint64_t len, uint32_t perms, const char *name) {
    ote_ctl_buf_t b{};
    b.addr = addr;
    b.len = len;
    b.perms = perms;
    b.kind = 0;
    std::snprintf(b.name, sizeof(b.name), "%s", name);
    return b;
}

// A BUFS frame of the given entries (total = entries unless given).
std::vector<uint8_t> BufsFrame(const std::vector<ote_ctl_buf_t> &bufs, uint32_t total = 0) {
    std::vector<uint8_t> ent(bufs.size() * OTE_CTL_BUF_ENTRY_LEN);
    for (size_t i = 0; i < bufs.size(); i++)
        EXPECT_EQ(ote_ctl_buf_put(ent.data() + i * OTE_CTL_BUF_ENTRY_LEN, &bufs[i]), OTE_OK);
    ote_ctl_msg_t m{};
    m.version = 2;
    m.opcode = OTE_CTL_BUFS;
    m.req_id = 41;
    m.u.bufs.total = total ? total : static_cast<uint32_t>(bufs.size());
    m.u.bufs.count = static_cast<uint32_t>(bufs.size());
    m.u.bufs.entries = ent.data();
    std::vector<uint8_t> out(OTE_CTL_HDR_LEN + OTE_CTL_BUFS_MAX_BODY);
    size_t len = 0;
    EXPECT_EQ(ote_ctl_encode(&m, out.data(), out.size(), &len), OTE_OK);
    out.resize(len);
    return out;
}

// The incarnation an advertisement names (restarted peers): its epoch; else, for an
// engine that advertises none, a hash of boot and pid; else 0 (unknown).
TEST_F(ControlTest, InfoIncarnationFromEpochOrBootAndPid) {
    EXPECT_EQ(ote_ctl_info_incarnation("transports=tcp;epoch=00000000000000ff;pid=3"), 0xffu);
    EXPECT_EQ(ote_ctl_info_incarnation("epoch=0123456789abcdef"), 0x0123456789abcdefull);
    uint64_t a = ote_ctl_info_incarnation("boot=b1;pid=10;transports=tcp");
    EXPECT_NE(a, 0u);
    EXPECT_EQ(ote_ctl_info_incarnation("pid=10;boot=b1"), a) << "order does not matter";
    EXPECT_NE(ote_ctl_info_incarnation("boot=b1;pid=11"), a);
    EXPECT_NE(ote_ctl_info_incarnation("boot=b2;pid=10"), a);
    // A malformed or zero epoch is not one: the fallback applies.
    EXPECT_EQ(ote_ctl_info_incarnation("epoch=0;boot=b1;pid=10"), a);
    EXPECT_EQ(ote_ctl_info_incarnation("epoch=12zz;boot=b1;pid=10"), a);
    EXPECT_EQ(ote_ctl_info_incarnation("epoch=;boot=b1;pid=10"), a);
    EXPECT_EQ(ote_ctl_info_incarnation(""), 0u);
    EXPECT_EQ(ote_ctl_info_incarnation("transports=tcp;pid=10"), 0u);
    EXPECT_EQ(ote_ctl_info_incarnation(nullptr), 0u);
}

TEST_F(ControlTest, BufsRoundTrip) {
    ote_ctl_msg_t out{};
    size_t used = 0;
    uint8_t hdr[OTE_CTL_HDR_LEN];
    ote_ctl_put_hdr(hdr, 2, OTE_CTL_BUFS_REQ, 40, OTE_OK, 0);
    ASSERT_EQ(ote_ctl_decode(hdr, sizeof(hdr), &out, &used), OTE_OK);
    EXPECT_EQ(out.opcode, OTE_CTL_BUFS_REQ);
    EXPECT_EQ(out.req_id, 40u);
    EXPECT_EQ(used, sizeof(hdr));
    EXPECT_STREQ(ote_ctl_opcode_str(OTE_CTL_BUFS_REQ), "BUFS_REQ");
    EXPECT_STREQ(ote_ctl_opcode_str(OTE_CTL_BUFS), "BUFS");

    std::string longest(OTE_CTL_BUF_NAME_LEN - 1, 'k');
    std::vector<ote_ctl_buf_t> in = {Buf(0x1000, 4096, 3, "kv cache/layer-0"),
                                     Buf(0x7f0000000000ull, 1ull << 40, 1, ""),
                                     Buf(UINT64_MAX - 10, 10, 2, longest.c_str())};
    auto f = BufsFrame(in, 7);
    EXPECT_EQ(f.size(), OTE_CTL_HDR_LEN + 8 + 3 * OTE_CTL_BUF_ENTRY_LEN);
    ASSERT_EQ(ote_ctl_decode(f.data(), f.size(), &out, &used), OTE_OK);
    EXPECT_EQ(used, f.size());
    EXPECT_EQ(out.data_len, 0u);
    EXPECT_EQ(out.req_id, 41u);
    EXPECT_EQ(out.u.bufs.total, 7u);
    ASSERT_EQ(out.u.bufs.count, 3u);
    for (uint32_t i = 0; i < 3; i++) {
        ote_ctl_buf_t b{};
        ASSERT_EQ(ote_ctl_buf_get(&out, i, &b), OTE_OK);
        EXPECT_EQ(b.addr, in[i].addr);
        EXPECT_EQ(b.len, in[i].len);
        EXPECT_EQ(b.perms, in[i].perms);
        EXPECT_EQ(b.kind, 0u);
        EXPECT_STREQ(b.name, in[i].name);
    }
    ote_ctl_buf_t b{};
    EXPECT_EQ(ote_ctl_buf_get(&out, 3, &b), OTE_ERR_INVALID);
    // Re-encoding the decoded frame gives the same bytes.
    std::vector<uint8_t> again(f.size());
    size_t len = 0;
    ASSERT_EQ(ote_ctl_encode(&out, again.data(), again.size(), &len), OTE_OK);
    EXPECT_EQ(again, f);
    // An empty list, and a refusal without a body.
    auto empty = BufsFrame({});
    ASSERT_EQ(ote_ctl_decode(empty.data(), empty.size(), &out, &used), OTE_OK);
    EXPECT_EQ(out.u.bufs.count, 0u);
    ote_ctl_put_hdr(hdr, 2, OTE_CTL_BUFS, 41, OTE_ERR_AGAIN, 0);
    ASSERT_EQ(ote_ctl_decode(hdr, sizeof(hdr), &out, &used), OTE_OK);
    EXPECT_EQ(ote_ctl_peer_status(OTE_CTL_BUFS, out.status), OTE_ERR_AGAIN);
    EXPECT_EQ(ote_ctl_peer_status(OTE_CTL_BUFS, OTE_ERR_BUSY), OTE_ERR_REMOTE);
    EXPECT_EQ(ote_ctl_buf_get(&out, 0, &b), OTE_ERR_INVALID);
    // Every prefix of a frame needs more.
    for (size_t n = 4; n < f.size(); n++)
        EXPECT_EQ(ote_ctl_decode(f.data(), n, &out, &used), OTE_ERR_AGAIN) << n;
}

TEST_F(ControlTest, MalformedBufsFramesAreRejected) {
    ote_ctl_msg_t out{};
    size_t used = 0;
    auto good = BufsFrame({Buf(0x1000, 64, 3, "a"), Buf(0x2000, 64, 1, "b")});
    const size_t e0 = OTE_CTL_HDR_LEN + 8, e1 = e0 + OTE_CTL_BUF_ENTRY_LEN;
    auto expect_bad = [&](std::vector<uint8_t> f, const char *what) {
        EXPECT_EQ(ote_ctl_decode(f.data(), f.size(), &out, &used), OTE_ERR_PROTOCOL) << what;
    };
    auto f = good;
    Put32(f, OTE_CTL_HDR_LEN + 4, 3); // count larger than the payload (and than total)
    expect_bad(f, "count > payload");
    f = good;
    Put32(f, OTE_CTL_HDR_LEN, 3);
    Put32(f, OTE_CTL_HDR_LEN + 4, 3);
    expect_bad(f, "count > payload, total agrees");
    f = good;
    Put32(f, OTE_CTL_HDR_LEN, 1); // count > total
    expect_bad(f, "count > total");
    f = good; // body shorter than its entries: the length field says one entry less
    Put32(f, 20, 8 + OTE_CTL_BUF_ENTRY_LEN);
    f.resize(OTE_CTL_HDR_LEN + 8 + OTE_CTL_BUF_ENTRY_LEN);
    expect_bad(f, "truncated list");
    f = good; // a body too short for total and count
    Put32(f, 20, 4);
    f.resize(OTE_CTL_HDR_LEN + 4);
    expect_bad(f, "body < 8");
    f = good; // name without a NUL (64 characters)
    memset(f.data() + e1 + 24, 'x', OTE_CTL_BUF_NAME_LEN);
    expect_bad(f, "name without NUL");
    f = good; // garbage after the name's NUL
    f[e1 + 24 + 10] = 'y';
    expect_bad(f, "padding not NUL");
    f = good; // a control character in the name
    f[e0 + 24] = '\n';
    expect_bad(f, "unprintable name");
    f = good;
    f[e0 + 24] = static_cast<uint8_t>(0xc3);
    expect_bad(f, "non-ASCII name");
    f = good; // zero length, wrapping range, bad perms, unknown kind
    memset(f.data() + e0 + 8, 0, 8);
    expect_bad(f, "zero length");
    f = good;
    memset(f.data() + e0, 0xff, 8);
    expect_bad(f, "range wraps");
    f = good;
    Put32(f, e0 + 16, 0);
    expect_bad(f, "no perms");
    f = good;
    Put32(f, e0 + 16, 4);
    expect_bad(f, "unknown perm bit");
    f = good;
    Put32(f, e0 + 20, OTE_CTL_BUF_KIND_MAX + 1);
    expect_bad(f, "kind out of range");
    f = good; // an error status with a body
    Put32(f, 16, OTE_ERR_AGAIN);
    expect_bad(f, "error with body");
    // A request with a body or a status.
    uint8_t hdr[OTE_CTL_HDR_LEN + 4] = {};
    ote_ctl_put_hdr(hdr, 2, OTE_CTL_BUFS_REQ, 1, OTE_OK, 4);
    EXPECT_EQ(ote_ctl_decode(hdr, sizeof(hdr), &out, &used), OTE_ERR_PROTOCOL);
    ote_ctl_put_hdr(hdr, 2, OTE_CTL_BUFS_REQ, 1, OTE_ERR_ACCESS, 0);
    EXPECT_EQ(ote_ctl_decode(hdr, OTE_CTL_HDR_LEN, &out, &used), OTE_ERR_PROTOCOL);
    // Over the entry cap: too big before any byte of the body is looked at.
    ote_ctl_put_hdr(hdr, 2, OTE_CTL_BUFS, 1, OTE_OK, OTE_CTL_BUFS_MAX_BODY + 1);
    EXPECT_EQ(ote_ctl_decode(hdr, OTE_CTL_HDR_LEN, &out, &used), OTE_ERR_TOO_BIG);
    std::vector<uint8_t> huge(OTE_CTL_HDR_LEN + OTE_CTL_BUFS_MAX_BODY + OTE_CTL_BUF_ENTRY_LEN);
    ote_ctl_put_hdr(huge.data(), 2, OTE_CTL_BUFS, 1, OTE_OK,
                    OTE_CTL_BUFS_MAX_BODY + OTE_CTL_BUF_ENTRY_LEN);
    EXPECT_EQ(ote_ctl_decode(huge.data(), huge.size(), &out, &used), OTE_ERR_TOO_BIG);
    // The largest list decodes.
    std::vector<ote_ctl_buf_t> many;
    for (uint32_t i = 0; i < OTE_CTL_BUFS_MAX; i++)
        many.push_back(Buf(4096ull * (i + 1), 64, 3, ""));
    auto full = BufsFrame(many, OTE_CTL_BUFS_MAX + 5);
    ASSERT_EQ(ote_ctl_decode(full.data(), full.size(), &out, &used), OTE_OK);
    EXPECT_EQ(out.u.bufs.count, OTE_CTL_BUFS_MAX);
    // The encoder refuses what the decoder would.
    uint8_t ent[OTE_CTL_BUF_ENTRY_LEN];
    ote_ctl_buf_t bad = Buf(0x1000, 0, 3, "z");
    EXPECT_EQ(ote_ctl_buf_put(ent, &bad), OTE_ERR_INVALID);
    bad = Buf(0x1000, 8, 8, "z");
    EXPECT_EQ(ote_ctl_buf_put(ent, &bad), OTE_ERR_INVALID);
    bad = Buf(0x1000, 8, 1, "tab\there");
    EXPECT_EQ(ote_ctl_buf_put(ent, &bad), OTE_ERR_INVALID);
    memset(bad.name, 'q', sizeof(bad.name)); // no NUL
    EXPECT_EQ(ote_ctl_buf_put(ent, &bad), OTE_ERR_INVALID);
    ote_ctl_msg_t m{};
    m.version = 2;
    m.opcode = OTE_CTL_BUFS;
    m.u.bufs.total = OTE_CTL_BUFS_MAX + 1;
    m.u.bufs.count = OTE_CTL_BUFS_MAX + 1;
    m.u.bufs.entries = huge.data();
    size_t len = 0;
    EXPECT_EQ(ote_ctl_encode(&m, huge.data(), huge.size(), &len), OTE_ERR_INVALID);
    m.u.bufs.total = 1;
    m.u.bufs.count = 2;
    EXPECT_EQ(ote_ctl_encode(&m, huge.data(), huge.size(), &len), OTE_ERR_INVALID);
    // Names: 1..63 printable ASCII characters.
    EXPECT_TRUE(ote_ctl_buf_name_ok("a", 1));
    EXPECT_TRUE(ote_ctl_buf_name_ok("~ !", 3));
    EXPECT_FALSE(ote_ctl_buf_name_ok("", 0));
    EXPECT_FALSE(ote_ctl_buf_name_ok(std::string(64, 'a').c_str(), 64));
    EXPECT_FALSE(ote_ctl_buf_name_ok("a\x7f", 2));
}

// ---- authentication: the AUTH frame (version 3) ---------------------------------------

TEST_F(ControlTest, AuthFrameRoundTripsAndIsChecked) {
    uint8_t nonce[OTE_CTL_AUTH_NONCE_LEN], mac[OTE_CTL_AUTH_MAC_LEN];
    memset(nonce, 0x5a, sizeof(nonce));
    memset(mac, 0xa5, sizeof(mac));
    ote_ctl_msg_t m{};
    m.version = OTE_CTL_AUTH_VERSION;
    m.opcode = OTE_CTL_AUTH;
    m.u.auth.step = OTE_CTL_AUTH_PROOF;
    m.u.auth.nonce = nonce;
    m.u.auth.mac = mac;
    uint8_t buf[OTE_CTL_AUTH_FRAME_LEN + 8];
    size_t len = 0, used = 0;
    ASSERT_EQ(ote_ctl_encode(&m, buf, sizeof(buf), &len), OTE_OK);
    ASSERT_EQ(len, OTE_CTL_AUTH_FRAME_LEN);
    ote_ctl_msg_t d{};
    ASSERT_EQ(ote_ctl_decode(buf, len, &d, &used), OTE_OK);
    EXPECT_EQ(used, len);
    EXPECT_EQ(d.u.auth.step, OTE_CTL_AUTH_PROOF);
    EXPECT_EQ(memcmp(d.u.auth.nonce, nonce, sizeof(nonce)), 0);
    EXPECT_EQ(memcmp(d.u.auth.mac, mac, sizeof(mac)), 0);
    EXPECT_EQ(ote_ctl_decode(buf, len - 1, &d, &used), OTE_ERR_AGAIN);
    // Below version 3, an unknown step, nonzero padding, a status, another length: refused.
    uint8_t bad[sizeof(buf)];
    memcpy(bad, buf, len);
    bad[4] = 2;
    EXPECT_EQ(ote_ctl_decode(bad, len, &d, &used), OTE_ERR_PROTOCOL);
    for (uint8_t step : {0, 4}) {
        memcpy(bad, buf, len);
        bad[OTE_CTL_HDR_LEN] = step;
        EXPECT_EQ(ote_ctl_decode(bad, len, &d, &used), OTE_ERR_PROTOCOL) << int(step);
    }
    memcpy(bad, buf, len);
    bad[OTE_CTL_HDR_LEN + 5] = 1;
    EXPECT_EQ(ote_ctl_decode(bad, len, &d, &used), OTE_ERR_PROTOCOL);
    memcpy(bad, buf, len);
    bad[16] = 1;
    EXPECT_EQ(ote_ctl_decode(bad, len, &d, &used), OTE_ERR_PROTOCOL);
    memcpy(bad, buf, len);
    bad[20] = OTE_CTL_AUTH_BODY_LEN + 1;
    EXPECT_EQ(ote_ctl_decode(bad, len + 1, &d, &used), OTE_ERR_PROTOCOL);
    m.version = 2;
    EXPECT_EQ(ote_ctl_encode(&m, buf, sizeof(buf), &len), OTE_ERR_INVALID);
    // An ERROR may carry OTE_ERR_AUTH: the handshake's refusal.
    EXPECT_EQ(ote_ctl_peer_status(OTE_CTL_ERROR, OTE_ERR_AUTH), OTE_ERR_AUTH);
    EXPECT_EQ(ote_ctl_peer_status(OTE_CTL_WRITE_ACK, OTE_ERR_AUTH), OTE_ERR_REMOTE);
    EXPECT_STREQ(ote_status_str(OTE_ERR_AUTH), "OTE_ERR_AUTH");
}

// The challenge-response itself: the right key checks both ways; another key, another
// HELLO, another challenge, or a proof reflected to the other side does not.
TEST_F(ControlTest, AuthProofsBindKeyHelloNoncesAndDirection) {
    const char *dir = getenv("TEST_TMPDIR");
    std::string k1 = std::string(dir ? dir : "/tmp") + "/ctl_key1";
    std::string k2 = std::string(dir ? dir : "/tmp") + "/ctl_key2";
    for (const std::string &p : {k1, k2}) {
        FILE *f = fopen(p.c_str(), "wb");
        ASSERT_NE(f, nullptr);
        for (int i = 0; i < 40; i++) fputc(p == k1 ? i : i + 1, f);
        fclose(f);
        ASSERT_EQ(chmod(p.c_str(), 0600), 0);
    }
    ote_auth_key_t *key = nullptr, *other = nullptr;
    ASSERT_EQ(ote_auth_key_load(k1.c_str(), &key), OTE_OK);
    ASSERT_EQ(ote_auth_key_load(k2.c_str(), &other), OTE_OK);
    ote_ctl_msg_t h{};
    h.version = OTE_CTL_VERSION_MAX;
    h.opcode = OTE_CTL_HELLO;
    h.u.hello.min_version = 1;
    h.u.hello.max_version = OTE_CTL_VERSION_MAX;
    h.u.hello.role = 1;
    h.u.hello.conn_index = 2;
    h.u.hello.session = 99;
    h.u.hello.addr = "10.0.0.1:5";
    h.u.hello.addr_len = 10;

    ote_auth_t src, req;
    ASSERT_EQ(ote_auth_bind_hello(&src, &h), OTE_OK);
    ASSERT_EQ(ote_auth_bind_hello(&req, &h), OTE_OK);
    ote_auth_challenge(&src);
    ote_auth_prove(&req, key, src.ns);
    ote_auth_t src_copy = src;
    ASSERT_EQ(ote_auth_check_proof(&src, key, req.nc, req.mac), OTE_OK);
    EXPECT_EQ(ote_auth_check_ok(&req, key, src.mac), OTE_OK);
    EXPECT_NE(memcmp(src.mac, req.mac, OTE_AUTH_LEN), 0); // direction labels differ
    // The source's own MAC offered as a requester's proof: refused (no reflection).
    ote_auth_t s2 = src_copy;
    EXPECT_EQ(ote_auth_check_proof(&s2, key, req.nc, src.mac), OTE_ERR_AUTH);
    // Another key, on either side.
    s2 = src_copy;
    EXPECT_EQ(ote_auth_check_proof(&s2, other, req.nc, req.mac), OTE_ERR_AUTH);
    EXPECT_EQ(ote_auth_check_ok(&req, other, src.mac), OTE_ERR_AUTH);
    // Another challenge (a replay on a new connection).
    ote_auth_t s3;
    ASSERT_EQ(ote_auth_bind_hello(&s3, &h), OTE_OK);
    ote_auth_challenge(&s3);
    EXPECT_EQ(ote_auth_check_proof(&s3, key, req.nc, req.mac), OTE_ERR_AUTH);
    // Another HELLO (conn_index, session or address changed): refused.
    for (int field = 0; field < 3; field++) {
        ote_ctl_msg_t h2 = h;
        if (field == 0) h2.u.hello.conn_index = 3;
        if (field == 1) h2.u.hello.session = 100;
        if (field == 2) h2.u.hello.addr = "10.0.0.1:6";
        ote_auth_t s4;
        ASSERT_EQ(ote_auth_bind_hello(&s4, &h2), OTE_OK);
        memcpy(s4.ns, src_copy.ns, OTE_AUTH_LEN);
        EXPECT_EQ(ote_auth_check_proof(&s4, key, req.nc, req.mac), OTE_ERR_AUTH) << field;
    }
    ote_auth_key_free(key);
    ote_auth_key_free(other);
}

TEST_F(ControlTest, AuthFailuresAreCountedAndLoggedRateLimited) {
    uint64_t n = ote_auth_failures();
    ote_auth_peer_t p = {}; // no back-off table: counted and logged only
    snprintf(p.name, sizeof(p.name), "192.0.2.7:4242");
    ote_auth_failed("tcp", &p, "wrong key");
    EXPECT_EQ(ote_auth_failures(), n + 1);
    EXPECT_TRUE(LogContains("authentication of 192.0.2.7:4242 failed: wrong key"));
    snprintf(p.name, sizeof(p.name), "192.0.2.8:1");
    for (int i = 0; i < 100; i++) ote_auth_failed("tcp", &p, "wrong key");
    EXPECT_EQ(ote_auth_failures(), n + 101);
}

} // namespace

namespace {

// A HELLO's engine name (issue 27): optional, after the address as NUL, name, NUL. A
// HELLO without it (every unnamed engine, every engine before names) decodes with no name;
// with it, the name comes back; an oversized, unterminated, empty or non-printable name is
// refused, and the encoder refuses what the decoder would.
class HelloNameTest : public ote_test::OteTest {
  protected:
    static ote_ctl_msg_t Named(const char *name) {
        ote_ctl_msg_t m{};
        m.version = OTE_CTL_VERSION_MAX;
        m.opcode = OTE_CTL_HELLO;
        m.u.hello.min_version = OTE_CTL_VERSION_MIN;
        m.u.hello.max_version = OTE_CTL_VERSION_MAX;
        m.u.hello.role = OTE_CTL_ROLE_TCP;
        m.u.hello.addr = "10.0.0.1:99";
        m.u.hello.addr_len = 11;
        m.u.hello.name = name;
        m.u.hello.name_len = name != nullptr ? static_cast<uint32_t>(strlen(name)) : 0;
        return m;
    }
    static std::vector<uint8_t> Enc(const ote_ctl_msg_t &m) {
        std::vector<uint8_t> b(OTE_CTL_HDR_LEN + OTE_CTL_MAX_HELLO_BODY);
        size_t len = 0;
        EXPECT_EQ(ote_ctl_encode(&m, b.data(), b.size(), &len), OTE_OK);
        b.resize(len);
        return b;
    }
    // The frame of `m` (no name) with `trailer` appended to its body.
    static std::vector<uint8_t> WithTrailer(const std::string &trailer) {
        std::vector<uint8_t> b = Enc(Named(nullptr));
        b.insert(b.end(), trailer.begin(), trailer.end());
        uint32_t body = static_cast<uint32_t>(b.size() - OTE_CTL_HDR_LEN);
        for (int i = 0; i < 4; i++) b[20 + i] = static_cast<uint8_t>(body >> (8 * i));
        return b;
    }
    static ote_status_t Dec(const std::vector<uint8_t> &b, ote_ctl_msg_t *out) {
        size_t used = 0;
        return ote_ctl_decode(b.data(), b.size(), out, &used);
    }
};

TEST_F(HelloNameTest, WithoutANameDecodesAsBefore) {
    std::vector<uint8_t> b = Enc(Named(nullptr));
    EXPECT_EQ(b.size(), OTE_CTL_HDR_LEN + 16u + 11u); // the frame engines sent before names
    ote_ctl_msg_t out{};
    ASSERT_EQ(Dec(b, &out), OTE_OK);
    EXPECT_EQ(std::string(out.u.hello.addr, out.u.hello.addr_len), "10.0.0.1:99");
    EXPECT_EQ(out.u.hello.name_len, 0u);
    EXPECT_EQ(out.u.hello.name, nullptr);
    // An empty name encodes as none.
    EXPECT_EQ(Enc(Named("")).size(), b.size());
}

TEST_F(HelloNameTest, ANameRoundTrips) {
    std::string longest(OTE_CTL_MAX_NAME, 'n');
    for (const std::string &name : {std::string("prefill-0"), std::string("a b~"), longest}) {
        std::vector<uint8_t> b = Enc(Named(name.c_str()));
        EXPECT_EQ(b.size(), OTE_CTL_HDR_LEN + 16u + 11u + name.size() + 2u);
        ote_ctl_msg_t out{};
        ASSERT_EQ(Dec(b, &out), OTE_OK) << name;
        EXPECT_EQ(std::string(out.u.hello.addr, out.u.hello.addr_len), "10.0.0.1:99");
        EXPECT_EQ(std::string(out.u.hello.name, out.u.hello.name_len), name);
        EXPECT_EQ(out.u.hello.role, OTE_CTL_ROLE_TCP);
        // A short read is AGAIN, never a partial name.
        size_t used = 0;
        EXPECT_EQ(ote_ctl_decode(b.data(), b.size() - 1, &out, &used), OTE_ERR_AGAIN);
    }
}

TEST_F(HelloNameTest, MalformedNamesAreRefused) {
    ote_ctl_msg_t out{};
    EXPECT_EQ(Dec(WithTrailer(std::string("\0prefill", 8)), &out),
              OTE_ERR_PROTOCOL);                                                 // unterminated
    EXPECT_EQ(Dec(WithTrailer(std::string("\0", 1)), &out), OTE_ERR_PROTOCOL);   // nothing after
    EXPECT_EQ(Dec(WithTrailer(std::string("\0\0", 2)), &out), OTE_ERR_PROTOCOL); // empty
    EXPECT_EQ(Dec(WithTrailer(std::string("\0a\0b\0", 5)), &out), OTE_ERR_PROTOCOL);  // two
    EXPECT_EQ(Dec(WithTrailer(std::string("\0a\nb\0", 5)), &out), OTE_ERR_PROTOCOL);  // newline
    EXPECT_EQ(Dec(WithTrailer(std::string("\0a\x7f\0", 4)), &out), OTE_ERR_PROTOCOL); // DEL
    EXPECT_EQ(Dec(WithTrailer(std::string("\0\xc3\xa9\0", 4)), &out), OTE_ERR_PROTOCOL);
    std::string big = std::string(1, '\0') + std::string(OTE_CTL_MAX_NAME + 1, 'n') + '\0';
    EXPECT_EQ(Dec(WithTrailer(big), &out), OTE_ERR_TOO_BIG);
    // The longest name that fits decodes (the bound is the name's, not the frame's).
    std::string fits = std::string(1, '\0') + std::string(OTE_CTL_MAX_NAME, 'n') + '\0';
    EXPECT_EQ(Dec(WithTrailer(fits), &out), OTE_OK);
    // The encoder refuses the same.
    std::vector<uint8_t> buf(OTE_CTL_HDR_LEN + OTE_CTL_MAX_HELLO_BODY);
    size_t len = 0;
    std::string too_long(OTE_CTL_MAX_NAME + 1, 'n');
    ote_ctl_msg_t m = Named(too_long.c_str());
    EXPECT_EQ(ote_ctl_encode(&m, buf.data(), buf.size(), &len), OTE_ERR_INVALID);
    m = Named("tab\there");
    EXPECT_EQ(ote_ctl_encode(&m, buf.data(), buf.size(), &len), OTE_ERR_INVALID);
    m = Named("ok");
    m.u.hello.addr = "a\0b";
    m.u.hello.addr_len = 3; // an address with a NUL would read as a name
    EXPECT_EQ(ote_ctl_encode(&m, buf.data(), buf.size(), &len), OTE_ERR_INVALID);
}

} // namespace

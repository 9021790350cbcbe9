// tests/verbs/multiprocess_common.h - the control protocol between multiprocess_test and
// its peer process (multiprocess_peer): fixed-size messages over a socketpair, and the
// data pattern both sides generate and check.
#ifndef OTE_TESTS_VERBS_MULTIPROCESS_COMMON_H
#define OTE_TESTS_VERBS_MULTIPROCESS_COMMON_H

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "tests/util/sync_point.h"
#include "tests/verbs/rc_qp.h"

extern "C" {
#include "verbs/verbs.h"
}

namespace mp {

enum : uint32_t {
    kHello = 1,       // both ways: gid, qpn, addr, rkey of the sender
    kFill = 2,        // peer fills [off, off+len) with pattern(seed); reply value=1
    kRecv = 3,        // peer waits for one receive CQE, checks [off, off+len) == pattern(seed)
                      // reply value = 1 when status, byte_len and data are right; aux = imm
    kSend = 4,        // peer SENDs [off, off+len) to the test with imm = seed; reply value=1
    kDmabuf = 5,      // peer registers a dma-buf MR over [off, off+len) of the memfd it got as
                      // fd kDmabufFd, addressed at iova = addr; reply value=1, rkey
    kDmabufDereg = 6, // peer deregisters that MR; reply value=1
    kReply = 100,
};

// The fd number under which the peer gets the test's memfd ("device memory").
constexpr int kDmabufFd = 101;

struct Msg {
    uint32_t type;
    uint32_t qpn;
    uint8_t gid[16];
    uint64_t addr;
    uint32_t rkey;
    uint32_t seed;
    uint64_t off;
    uint64_t len;
    uint64_t value;
    uint64_t aux;
};

inline bool WriteMsg(int fd, const Msg &m) {
    ote_test_sync_point(); // before what the other process does on the message
    const char *p = reinterpret_cast<const char *>(&m);
    size_t left = sizeof(m);
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w;
        left -= (size_t)w;
    }
    return true;
}

inline bool ReadMsg(int fd, Msg *m) {
    char *p = reinterpret_cast<char *>(m);
    size_t left = sizeof(*m);
    while (left > 0) {
        ssize_t r = read(fd, p, left);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        p += r;
        left -= (size_t)r;
    }
    ote_test_sync_point(); // after what the other process did before it sent this
    return true;
}

// 8 bytes at a time: fast enough for a GiB.
inline void Fill(uint8_t *p, uint64_t len, uint32_t seed, uint64_t base_off) {
    uint64_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t x = (base_off + i) * 0x9e3779b97f4a7c15ull + seed;
        memcpy(p + i, &x, 8);
    }
    for (; i < len; i++) p[i] = (uint8_t)(seed + i);
}

inline bool Check(const uint8_t *p, uint64_t len, uint32_t seed, uint64_t base_off) {
    uint64_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t x = (base_off + i) * 0x9e3779b97f4a7c15ull + seed, y;
        memcpy(&y, p + i, 8);
        if (x != y) return false;
    }
    for (; i < len; i++)
        if (p[i] != (uint8_t)(seed + i)) return false;
    return true;
}

// The GID both processes use: the last RoCE v2, IPv4-mapped entry of port 1; -1 if none.
inline int RoceV2Ipv4GidIndex(ote_verbs_t *v, struct ibv_context *ctx,
                              const struct ibv_port_attr &pa) {
    int gidx = -1;
    for (int i = 0; i < pa.gid_tbl_len; i++) {
        struct ibv_gid_entry e;
        if (v->ops->query_gid_ex(v, ctx, 1, (uint32_t)i, &e) == 0 &&
            e.gid_type == IBV_GID_TYPE_ROCE_V2 && e.gid.raw[10] == 0xff)
            gidx = i;
    }
    return gidx;
}

// RTR towards the other process (its kHello message): 16 READs in flight, hop limit 0.
inline ote_test::QpPath PathTo(const Msg &peer, enum ibv_mtu mtu, int sgid_index) {
    ote_test::QpPath path;
    path.dest_qpn = peer.qpn;
    memcpy(path.dgid.raw, peer.gid, 16);
    path.mtu = mtu;
    path.sgid_index = (uint8_t)sgid_index;
    path.hop_limit = 0;
    path.max_dest_rd_atomic = 16;
    return path;
}

// RTS settings of both processes: 16 READs in flight, default timeout and retries.
inline ote_test::QpRetry Retry() {
    ote_test::QpRetry r;
    r.max_rd_atomic = 16;
    return r;
}

} // namespace mp

#endif

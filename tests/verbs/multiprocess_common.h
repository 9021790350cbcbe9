// tests/verbs/multiprocess_common.h - the control protocol between multiprocess_test and
// its peer process (multiprocess_peer): fixed-size messages over a socketpair, and the
// data pattern both sides generate and check.
#ifndef OTE_TESTS_VERBS_MULTIPROCESS_COMMON_H
#define OTE_TESTS_VERBS_MULTIPROCESS_COMMON_H

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

namespace mp {

enum : uint32_t {
    kHello = 1,   // both ways: gid, qpn, addr, rkey of the sender
    kFill = 2,    // peer fills [off, off+len) with pattern(seed); reply value=1
    kRecv = 3,    // peer waits for one receive CQE, checks [off, off+len) == pattern(seed)
                  // reply value = 1 when status, byte_len and data are right; aux = imm
    kSend = 4,    // peer SENDs [off, off+len) to the test with imm = seed; reply value=1
    kReply = 100,
};

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

}  // namespace mp

#endif

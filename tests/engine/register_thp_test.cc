// register_thp (engine/hugepages.c): with the key set, ote_memory_register of host memory
// advises the kernel to back the range's 2 MiB-aligned interior with transparent huge
// pages (the mapping's VmFlags in /proc/self/smaps gain "hg"), and an shm transfer over
// such ranges moves every byte; unset, the mapping is left alone; a range without a whole
// huge page inside is left alone; a refused or failed madvise (a range with a hole, the
// fault points) never fails the registration.
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/engine/engine_util.h"
#include "tests/util/test_base.h"

extern "C" {
#include "base/fault.h"
#include "ote/ote.h"
}

namespace {

using ote_test::kSec;
using ote_test::NewEngine;

constexpr size_t kHuge = 2u << 20;

// The VmFlags and THPeligible lines of the mapping of /proc/self/smaps that holds addr.
struct Vma {
    bool found = false;
    std::string flags;
    std::string thp_eligible;
};

Vma VmaOf(const void *addr) {
    Vma v;
    std::ifstream in("/proc/self/smaps");
    std::string line;
    uintptr_t a = reinterpret_cast<uintptr_t>(addr);
    bool in_it = false;
    while (std::getline(in, line)) {
        unsigned long lo = 0, hi = 0;
        char dash = 0;
        std::istringstream head(line);
        if (line.find(':') != std::string::npos && line.find('-') < line.find(' ') &&
            (head >> std::hex >> lo >> dash >> hi) && dash == '-') {
            if (in_it) break; // the next mapping
            in_it = a >= lo && a < hi;
            v.found = v.found || in_it;
            continue;
        }
        if (!in_it) continue;
        if (line.rfind("VmFlags:", 0) == 0) v.flags = line.substr(8);
        if (line.rfind("THPeligible:", 0) == 0) v.thp_eligible = line.substr(12);
    }
    return v;
}

bool Advised(const void *addr) {
    Vma v = VmaOf(addr);
    EXPECT_TRUE(v.found) << "no mapping holds " << addr;
    std::istringstream fl(v.flags);
    std::string f;
    while (fl >> f)
        if (f == "hg") return true;
    return false;
}

// An anonymous mapping of len bytes starting on a 2 MiB boundary, every byte written.
class Aligned {
  public:
    explicit Aligned(size_t len) : len_(len) {
        map_len_ = len + kHuge;
        void *m =
            mmap(nullptr, map_len_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        EXPECT_NE(m, MAP_FAILED);
        if (m == MAP_FAILED) return;
        map_ = static_cast<uint8_t *>(m);
        uintptr_t p = (reinterpret_cast<uintptr_t>(map_) + kHuge - 1) & ~(uintptr_t)(kHuge - 1);
        base_ = reinterpret_cast<uint8_t *>(p);
        memset(base_, 0, len_);
    }
    ~Aligned() {
        if (map_ != nullptr) munmap(map_, map_len_);
    }
    Aligned(const Aligned &) = delete;
    Aligned &operator=(const Aligned &) = delete;
    uint8_t *base() const { return base_; }
    size_t len() const { return len_; }

  private:
    uint8_t *map_ = nullptr, *base_ = nullptr;
    size_t len_, map_len_ = 0;
};

class RegisterThpTest : public ote_test::OteTest {};

TEST_F(RegisterThpTest, KeyIsAnOptInSwitch) {
    ote_config_t *cfg = nullptr;
    ASSERT_EQ(ote_config_create(&cfg), OTE_OK);
    char buf[8];
    unsetenv("OTE_REGISTER_THP");
    EXPECT_EQ(ote_config_get(cfg, "register_thp", buf, sizeof(buf)), OTE_OK);
    EXPECT_STREQ(buf, "0");
    EXPECT_EQ(ote_config_set(cfg, "register_thp", "2"), OTE_ERR_INVALID);
    EXPECT_EQ(ote_config_set(cfg, "register_thp", "yes"), OTE_ERR_INVALID);
    EXPECT_EQ(ote_config_set(cfg, "register_thp", "1"), OTE_OK);
    EXPECT_EQ(ote_config_get(cfg, "register_thp", buf, sizeof(buf)), OTE_OK);
    EXPECT_STREQ(buf, "1");
    ote_config_destroy(cfg);
}

// Both engines with the key: each side's 8 MiB registration is advised, and WRITE and
// READ over shm (cross-memory attach in this process) move every byte.
TEST_F(RegisterThpTest, KeySetAdvisesTheRangeAndShmMovesEveryByte) {
    ote_engine_t *src = NewEngine({{"register_thp", "1"}});
    ote_engine_t *req = NewEngine({{"register_thp", "1"}});
    ASSERT_NE(src, nullptr);
    ASSERT_NE(req, nullptr);
    Aligned remote(8u << 20), local(8u << 20);
    ASSERT_NE(remote.base(), nullptr);
    ASSERT_NE(local.base(), nullptr);
    EXPECT_FALSE(Advised(remote.base()));
    ASSERT_EQ(ote_memory_register(src, remote.base(), remote.len(), OTE_PERM_READ | OTE_PERM_WRITE),
              OTE_OK);
    ASSERT_EQ(ote_memory_register(req, local.base(), local.len(), OTE_PERM_READ | OTE_PERM_WRITE),
              OTE_OK);
    EXPECT_TRUE(Advised(remote.base()));
    EXPECT_TRUE(Advised(local.base() + local.len() - 1));
    // THPeligible also depends on the host's THP mode ("never" makes it 0): shown only.
    std::cout << "THPeligible:" << VmaOf(remote.base()).thp_eligible << "\n";

    for (size_t i = 0; i < local.len(); i++) local.base()[i] = static_cast<uint8_t>(i * 7 + 3);
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_segment_open(req, ote_test::EngineAddress(src).c_str(), &seg), OTE_OK);
    ote_segment_info_t info;
    ASSERT_EQ(ote_segment_info(seg, &info), OTE_OK);
    EXPECT_STREQ(info.transport, "shm");
    uintptr_t raddr = reinterpret_cast<uintptr_t>(remote.base());
    ote_request_t w = {OTE_WRITE, local.base(), seg, raddr, local.len()};
    EXPECT_EQ(ote_test::RunOne(req, w, 60 * kSec), OTE_OK);
    EXPECT_EQ(memcmp(remote.base(), local.base(), local.len()), 0);
    // READ back an unaligned piece over the old bytes.
    for (size_t i = 0; i < remote.len(); i++) remote.base()[i] = static_cast<uint8_t>(i * 13 + 1);
    memset(local.base(), 0, local.len());
    ote_request_t r = {OTE_READ, local.base() + 5, seg, raddr + 4099, (6u << 20) + 11};
    EXPECT_EQ(ote_test::RunOne(req, r, 60 * kSec), OTE_OK);
    EXPECT_EQ(memcmp(local.base() + 5, remote.base() + 4099, (6u << 20) + 11), 0);
    for (size_t i = 0; i < 5; i++) ASSERT_EQ(local.base()[i], 0);
    for (size_t i = 5 + (6u << 20) + 11; i < local.len(); i++) ASSERT_EQ(local.base()[i], 0);

    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(req, local.base()), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(src, remote.base()), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
}

TEST_F(RegisterThpTest, KeyUnsetLeavesTheMappingAlone) {
    unsetenv("OTE_REGISTER_THP");
    ote_engine_t *e = NewEngine();
    ASSERT_NE(e, nullptr);
    Aligned m(8u << 20);
    ASSERT_NE(m.base(), nullptr);
    ASSERT_EQ(ote_memory_register(e, m.base(), m.len(), OTE_PERM_READ), OTE_OK);
    EXPECT_FALSE(Advised(m.base()));
    EXPECT_FALSE(Advised(m.base() + m.len() - 1));
    EXPECT_EQ(ote_memory_unregister(e, m.base()), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
}

// No whole 2 MiB page inside: small, or just short of a huge page at both ends.
TEST_F(RegisterThpTest, RangeWithoutAWholeHugePageIsLeftAlone) {
    ote_engine_t *e = NewEngine({{"register_thp", "1"}});
    ASSERT_NE(e, nullptr);
    Aligned m(8u << 20);
    ASSERT_NE(m.base(), nullptr);
    uint8_t *small = m.base() + 4096;
    ASSERT_EQ(ote_memory_register(e, small, 64u << 10, OTE_PERM_READ), OTE_OK);
    uint8_t *unaligned = m.base() + kHuge + 4096; // ends 4 KiB short of the next 2 MiB
    ASSERT_EQ(ote_memory_register(e, unaligned, kHuge - 4096 + kHuge - 4096, OTE_PERM_WRITE),
              OTE_OK);
    EXPECT_FALSE(Advised(small));
    EXPECT_FALSE(Advised(unaligned));
    EXPECT_FALSE(Advised(m.base() + m.len() - 1));
    EXPECT_EQ(ote_memory_unregister(e, small), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(e, unaligned), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
}

// An unaligned range of several huge pages: only its aligned interior is advised.
TEST_F(RegisterThpTest, OnlyTheAlignedInteriorIsAdvised) {
    ote_engine_t *e = NewEngine({{"register_thp", "1"}});
    ASSERT_NE(e, nullptr);
    Aligned m(8u << 20);
    ASSERT_NE(m.base(), nullptr);
    uint8_t *start = m.base() + 4096; // interior: [base + 2M, base + 6M)
    ASSERT_EQ(ote_memory_register(e, start, (6u << 20) - 4096, OTE_PERM_READ), OTE_OK);
    EXPECT_FALSE(Advised(start));
    EXPECT_TRUE(Advised(m.base() + kHuge));
    EXPECT_TRUE(Advised(m.base() + (6u << 20) - 1));
    EXPECT_FALSE(Advised(m.base() + (6u << 20)));
    EXPECT_EQ(ote_memory_unregister(e, start), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
}

// A range with a hole is refused by the registration's own check (OTE_ERR_INVALID: a
// peer's request would fault there) before any advice is given; the kernel's refusal of
// the advice itself is covered by the fault points below.
TEST_F(RegisterThpTest, RangeWithAHoleIsRefusedBeforeAnyAdvice) {
    ote_engine_t *e = NewEngine({{"register_thp", "1"}});
    ASSERT_NE(e, nullptr);
    Aligned m(8u << 20);
    ASSERT_NE(m.base(), nullptr);
    ASSERT_EQ(munmap(m.base() + (3u << 20), 4096), 0); // a hole inside the interior
    EXPECT_EQ(ote_memory_register(e, m.base(), m.len(), OTE_PERM_READ), OTE_ERR_INVALID);
    EXPECT_TRUE(LogContains("not mapped"));
    EXPECT_FALSE(LogContains("MADV_HUGEPAGE"));
    EXPECT_FALSE(Advised(m.base() + kHuge));
    ote_buffer_info_t bi;
    EXPECT_EQ(ote_memory_query(e, m.base() + 4096, &bi), OTE_ERR_NOT_FOUND);
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
}

// Either madvise failing (the fault points) leaves a working registration; a failed
// MADV_HUGEPAGE skips the collapse, a failed MADV_COLLAPSE keeps the advice.
TEST_F(RegisterThpTest, FailedMadviseStillRegistersAndLogsOnce) {
    ote_engine_t *e = NewEngine({{"register_thp", "1"}});
    ASSERT_NE(e, nullptr);
    Aligned a(4u << 20), b(4u << 20), c(4u << 20);
    ASSERT_NE(a.base(), nullptr);
    ASSERT_NE(b.base(), nullptr);
    ASSERT_NE(c.base(), nullptr);

    ASSERT_EQ(ote_fault_arm("engine.thp_advise", OTE_FAULT_EVERY, 0, OTE_ERR_INVALID, EINVAL),
              OTE_OK);
    ASSERT_EQ(ote_fault_arm("engine.thp_collapse", OTE_FAULT_EVERY, 0, OTE_ERR_AGAIN, EAGAIN),
              OTE_OK);
    ASSERT_EQ(ote_memory_register(e, a.base(), a.len(), OTE_PERM_READ), OTE_OK);
    ASSERT_EQ(ote_memory_register(e, b.base(), b.len(), OTE_PERM_READ), OTE_OK);
    EXPECT_EQ(ote_fault_failures("engine.thp_advise"), 2u);
    EXPECT_EQ(ote_fault_hits("engine.thp_collapse"), 0u);
    EXPECT_FALSE(Advised(a.base()));
    size_t warned = 0;
    for (const std::string &l : Logs())
        if (l.find("MADV_HUGEPAGE") != std::string::npos) warned++;
    EXPECT_EQ(warned, 1u); // once per engine

    ASSERT_EQ(ote_fault_disarm("engine.thp_advise"), OTE_OK);
    ASSERT_EQ(ote_memory_register(e, c.base(), c.len(), OTE_PERM_READ | OTE_PERM_WRITE), OTE_OK);
    EXPECT_EQ(ote_fault_failures("engine.thp_collapse"), 1u);
    EXPECT_TRUE(Advised(c.base()));
    ote_buffer_info_t bi;
    for (uint8_t *p : {a.base(), b.base(), c.base()}) {
        ASSERT_EQ(ote_memory_query(e, p, &bi), OTE_OK);
        EXPECT_EQ(ote_memory_unregister(e, p), OTE_OK);
    }
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
}

} // namespace

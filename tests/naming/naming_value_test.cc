// tests/naming/naming_value_test.cc - the value stored under a name (naming/value.c) and
// ote_engine_metadata_peer: round trip, and every truncation, every single-byte change and
// random mutations of a real value are refused or decode to a checked value.
#include <gtest/gtest.h>

#include <string.h>

#include <random>
#include <vector>

#include "tests/naming/servers.h"
#include "tests/util/test_base.h"

extern "C" {
#include "base/alloc.h"
#include "naming/naming_internal.h"
}

namespace ote_test {
namespace {

class NamingValueTest : public OteTest {
  protected:
    void SetUp() override {
        OteTest::SetUp();
        e_ = LoopbackEngine();
        ASSERT_NE(e_, nullptr);
        ASSERT_EQ(ote_memory_register_named(e_, buf_.data(), buf_.size(), OTE_PERM_READ, "kv"),
                  OTE_OK);
        md_.resize(1 << 16);
        size_t len = 0;
        ASSERT_EQ(ote_engine_metadata(e_, md_.data(), md_.size(), &len), OTE_OK);
        md_.resize(len);
    }
    void TearDown() override {
        if (e_ != nullptr) {
            EXPECT_EQ(ote_memory_unregister(e_, buf_.data()), OTE_OK);
            EXPECT_EQ(ote_engine_destroy(e_), OTE_OK);
        }
        OteTest::TearDown();
    }
    ote_engine_t *e_ = nullptr;
    std::vector<uint8_t> buf_ = std::vector<uint8_t>(4096);
    std::vector<uint8_t> md_;
};

TEST_F(NamingValueTest, MetadataPeerNamesTheEngine) {
    char addr[300];
    uint64_t epoch = 0;
    ASSERT_EQ(ote_engine_metadata_peer(md_.data(), md_.size(), addr, sizeof(addr), &epoch), OTE_OK);
    EXPECT_EQ(std::string(addr), EngineAddr(e_));
    EXPECT_NE(epoch, 0u);
    char small[4] = "xyz";
    uint64_t untouched = 7;
    EXPECT_EQ(ote_engine_metadata_peer(md_.data(), md_.size(), small, sizeof(small), &untouched),
              OTE_ERR_TOO_BIG);
    EXPECT_STREQ(small, "xyz");
    EXPECT_EQ(untouched, 7u);
    EXPECT_EQ(ote_engine_metadata_peer(md_.data(), md_.size() - 1, addr, sizeof(addr), &epoch),
              OTE_ERR_PROTOCOL);
    EXPECT_EQ(ote_engine_metadata_peer(nullptr, 0, addr, sizeof(addr), &epoch), OTE_ERR_INVALID);
}

TEST_F(NamingValueTest, RoundTripAndNameBinding) {
    uint8_t *v = nullptr;
    size_t len = 0;
    ASSERT_EQ(ote__nval_encode("decode-3", md_.data(), md_.size(), &v, &len), OTE_OK);
    const uint8_t *md = nullptr;
    size_t ml = 0;
    ote_naming_entry_t e = {};
    ASSERT_EQ(ote__nval_decode(v, len, "decode-3", &md, &ml, &e), OTE_OK);
    EXPECT_EQ(ml, md_.size());
    EXPECT_EQ(memcmp(md, md_.data(), ml), 0);
    EXPECT_EQ(std::string(e.addr), EngineAddr(e_));
    EXPECT_EQ(ote__nval_decode(v, len, "decode-4", &md, &ml, &e), OTE_ERR_PROTOCOL);
    EXPECT_EQ(ote__nval_decode(v, len, "decode-", &md, &ml, &e), OTE_ERR_PROTOCOL);
    ote_free(v);
    EXPECT_EQ(ote__nval_encode("bad name", md_.data(), md_.size(), &v, &len), OTE_ERR_INVALID);
    EXPECT_EQ(ote__nval_encode("", md_.data(), md_.size(), &v, &len), OTE_ERR_INVALID);
    EXPECT_EQ(ote__nval_encode("x", md_.data(), 0, &v, &len), OTE_ERR_INVALID);
}

// A value whose name could not have been published (a byte outside printable ASCII) is
// refused even when asked for by that very name (found by tests/fuzz/nval_fuzz.c).
TEST_F(NamingValueTest, UnpublishableNameIsRefused) {
    uint8_t *v = nullptr;
    size_t len = 0;
    ASSERT_EQ(ote__nval_encode("decode-3", md_.data(), md_.size(), &v, &len), OTE_OK);
    v[OTE__NVAL_HDR_LEN + 3] = 0xef;
    const char bad[] = {'d', 'e', 'c', '\xef', 'd', 'e', '-', '3', '\0'};
    EXPECT_EQ(ote__nval_decode(v, len, bad, nullptr, nullptr, nullptr), OTE_ERR_PROTOCOL);
    v[OTE__NVAL_HDR_LEN + 3] = ' ';
    EXPECT_EQ(ote__nval_decode(v, len, "dec de-3", nullptr, nullptr, nullptr), OTE_ERR_PROTOCOL);
    ote_free(v);
}

// Every prefix, every single-byte change, and random multi-byte mutations: each one is
// refused, or decodes to an entry whose metadata is itself a valid blob (never a crash,
// never a read outside the value: ASan checks that).
TEST_F(NamingValueTest, MutationsAreRefusedOrChecked) {
    uint8_t *v = nullptr;
    size_t len = 0;
    ASSERT_EQ(ote__nval_encode("decode-3", md_.data(), md_.size(), &v, &len), OTE_OK);
    std::vector<uint8_t> good(v, v + len);
    ote_free(v);
    auto check = [&](const std::vector<uint8_t> &m) {
        const uint8_t *md = nullptr;
        size_t ml = 0;
        ote_naming_entry_t e = {};
        ote_status_t st = ote__nval_decode(m.data(), m.size(), "decode-3", &md, &ml, &e);
        if (st == OTE_OK) {
            char addr[300];
            uint64_t epoch = 0;
            EXPECT_EQ(ote_engine_metadata_peer(md, ml, addr, sizeof(addr), &epoch), OTE_OK);
            EXPECT_NE(e.epoch, 0u);
            return 1;
        }
        EXPECT_EQ(st, OTE_ERR_PROTOCOL);
        return 0;
    };
    for (size_t n = 0; n < good.size(); n++)
        EXPECT_EQ(check(std::vector<uint8_t>(good.begin(), good.begin() + n)), 0) << n;
    // The envelope, the name and the metadata's header: a change is refused, except in
    // the epoch (bytes 8..15 of the metadata), which then names another incarnation (that
    // ote_segment_open_md refuses at the engine).
    const size_t md_at = OTE__NVAL_HDR_LEN + strlen("decode-3");
    ote_naming_entry_t orig = {};
    ASSERT_EQ(ote__nval_decode(good.data(), good.size(), "decode-3", nullptr, nullptr, &orig),
              OTE_OK);
    for (size_t i = 0; i < good.size(); i++) {
        std::vector<uint8_t> m = good;
        m[i] ^= 0x80;
        int ok = check(m);
        if (i >= md_at + 8 && i < md_at + 16) {
            ote_naming_entry_t e = {};
            ASSERT_EQ(ote__nval_decode(m.data(), m.size(), "decode-3", nullptr, nullptr, &e),
                      OTE_OK);
            EXPECT_NE(e.epoch, orig.epoch);
        } else if (i < md_at + 20) {
            EXPECT_EQ(ok, 0) << "a change at byte " << i << " was accepted";
        }
    }
    std::mt19937 rng(30);
    for (int round = 0; round < 20000; round++) {
        std::vector<uint8_t> m = good;
        int edits = 1 + static_cast<int>(rng() % 8);
        for (int k = 0; k < edits; k++) m[rng() % m.size()] = static_cast<uint8_t>(rng());
        if (rng() % 4 == 0) m.resize(rng() % (m.size() + 16), 0xab);
        check(m);
    }
}

} // namespace
} // namespace ote_test

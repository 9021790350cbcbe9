// The back-off of peers that fail authentication (engine/control/auth_limit.h), as a unit
// with the caller's clock: the threshold within the window, the doubling back-off and
// its cap, forgetting after a success or a quiet period, addresses without their port,
// the table's bound under a flood of addresses, and concurrent callers.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>
#include <thread>
#include <vector>

#include "tests/util/test_base.h"

extern "C" {
#include "base/time.h"
#include "engine/control/auth_limit.h"
}

namespace {

constexpr uint64_t kSec = OTE_NSEC_PER_SEC;

ote_auth_addr_t V4(uint32_t host_order, uint16_t port = 4242) {
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    sa.sin_addr.s_addr = htonl(host_order);
    ote_auth_addr_t a;
    ote_auth_addr_of_sockaddr(reinterpret_cast<sockaddr *>(&sa), sizeof(sa), &a);
    return a;
}

ote_auth_limit_cfg_t Cfg(uint32_t entries) {
    ote_auth_limit_cfg_t c;
    ote_auth_limit_cfg_default(&c);
    c.entries = entries;
    c.fails = 5;
    c.window_ns = 10 * kSec;
    c.backoff_min_ns = 1 * kSec;
    c.backoff_max_ns = 4 * kSec;
    c.quiet_ns = 100 * kSec;
    return c;
}

class AuthLimitTest : public ote_test::OteTest {
  protected:
    void SetUp() override {
        OteTest::SetUp();
        ote_auth_limit_cfg_t c = Cfg(64);
        ASSERT_EQ(ote_auth_limit_create(&c, &lim_), OTE_OK);
    }
    void TearDown() override {
        ote_auth_limit_destroy(lim_);
        OteTest::TearDown();
    }
    void Fail(const ote_auth_addr_t &a, uint64_t now, int n = 1) {
        for (int i = 0; i < n; i++) ote_auth_limit_fail(lim_, "tcp", &a, now);
    }
    bool Refused(const ote_auth_addr_t &a, uint64_t now) {
        return ote_auth_limit_refuse(lim_, &a, now) != 0;
    }
    ote_auth_limit_t *lim_ = nullptr;
};

TEST_F(AuthLimitTest, DefaultsAndInvalidConfigurations) {
    ote_auth_limit_cfg_t d;
    ote_auth_limit_cfg_default(&d);
    EXPECT_EQ(d.fails, 5u);
    EXPECT_EQ(d.window_ns, 10 * kSec);
    EXPECT_EQ(d.backoff_min_ns, 1 * kSec);
    EXPECT_EQ(d.backoff_max_ns, 60 * kSec);
    EXPECT_EQ(d.entries, 1024u);
    EXPECT_GE(d.quiet_ns, d.backoff_max_ns);
    ote_auth_limit_t *l = nullptr;
    ote_auth_limit_cfg_t c = d;
    c.backoff_min_ns = c.backoff_max_ns + 1;
    EXPECT_EQ(ote_auth_limit_create(&c, &l), OTE_ERR_INVALID);
    c = d;
    c.entries = 0;
    EXPECT_EQ(ote_auth_limit_create(&c, &l), OTE_ERR_INVALID);
    c = d;
    c.fails = 0;
    EXPECT_EQ(ote_auth_limit_create(&c, &l), OTE_ERR_INVALID);
    EXPECT_EQ(l, nullptr);
    ASSERT_EQ(ote_auth_limit_create(nullptr, &l), OTE_OK);
    ote_auth_limit_destroy(l);
    // No table: nothing is ever refused.
    ote_auth_addr_t a = V4(0x7f000001);
    ote_auth_limit_fail(nullptr, "tcp", &a, 1);
    EXPECT_EQ(ote_auth_limit_refuse(nullptr, &a, 1), 0);
}

TEST_F(AuthLimitTest, AddressesWithoutPortsMappedV4AndUids) {
    ote_auth_addr_t a = V4(0x7f000001, 1), b = V4(0x7f000001, 2), c = V4(0x7f000002, 1);
    EXPECT_EQ(memcmp(&a, &b, sizeof(a)), 0); // the port does not count
    EXPECT_NE(memcmp(&a, &c, sizeof(a)), 0);
    sockaddr_in6 s6{};
    s6.sin6_family = AF_INET6;
    s6.sin6_port = htons(9);
    ASSERT_EQ(inet_pton(AF_INET6, "::ffff:127.0.0.1", &s6.sin6_addr), 1);
    ote_auth_addr_t m;
    ote_auth_addr_of_sockaddr(reinterpret_cast<sockaddr *>(&s6), sizeof(s6), &m);
    EXPECT_EQ(memcmp(&a, &m, sizeof(a)), 0); // IPv4-mapped: the same peer
    ASSERT_EQ(inet_pton(AF_INET6, "2001:db8::1", &s6.sin6_addr), 1);
    ote_auth_addr_of_sockaddr(reinterpret_cast<sockaddr *>(&s6), sizeof(s6), &m);
    EXPECT_EQ(m.kind, 6);
    char s[64];
    ote_auth_addr_str(&m, s, sizeof(s));
    EXPECT_STREQ(s, "2001:db8::1");
    ote_auth_addr_str(&a, s, sizeof(s));
    EXPECT_STREQ(s, "127.0.0.1");
    ote_auth_addr_t u;
    ote_auth_addr_of_uid(1000, &u);
    ote_auth_addr_str(&u, s, sizeof(s));
    EXPECT_STREQ(s, "uid 1000");
    sockaddr sa{};
    sa.sa_family = AF_UNIX;
    ote_auth_addr_of_sockaddr(&sa, sizeof(sa), &m);
    EXPECT_EQ(m.kind, 0); // unknown: never limited
    Fail(m, kSec, 10);
    EXPECT_FALSE(Refused(m, kSec));
    EXPECT_EQ(ote_auth_limit_size(lim_), 0u);
}

TEST_F(AuthLimitTest, FailuresWithinTheWindowStartABackOffThatDoublesToItsCap) {
    ote_auth_addr_t a = V4(0x0a000001), other = V4(0x0a000002);
    uint64_t t = 1000 * kSec;
    EXPECT_FALSE(Refused(a, t)); // never failed: never slowed down
    Fail(a, t, 4);
    EXPECT_FALSE(Refused(a, t));
    uint64_t refused = ote_auth_limit_refused(lim_), all = ote_auth_refused();
    Fail(a, t + kSec); // the 5th within 10 s
    EXPECT_TRUE(Refused(a, t + kSec));
    EXPECT_TRUE(Refused(a, t + 2 * kSec - 1));
    EXPECT_FALSE(Refused(other, t + kSec)); // another address is not affected
    EXPECT_EQ(ote_auth_limit_refused(lim_), refused + 2);
    EXPECT_GE(ote_auth_refused(), all + 2);
    EXPECT_TRUE(LogContains("10.0.0.1: 5 more failed authentication(s)"));
    EXPECT_TRUE(LogContains("closed at accept for 1000 ms"));
    // Over: one more failure is enough now, for twice as long, up to the cap.
    t += 2 * kSec;
    EXPECT_FALSE(Refused(a, t));
    Fail(a, t);
    EXPECT_TRUE(Refused(a, t + 2 * kSec - 1));
    EXPECT_FALSE(Refused(a, t + 2 * kSec));
    t += 2 * kSec;
    Fail(a, t);
    EXPECT_TRUE(Refused(a, t + 4 * kSec - 1));
    EXPECT_FALSE(Refused(a, t + 4 * kSec));
    t += 4 * kSec;
    Fail(a, t);
    EXPECT_TRUE(Refused(a, t + 4 * kSec - 1)); // capped at backoff_max_ns
    EXPECT_FALSE(Refused(a, t + 4 * kSec));
    // Failures during a back-off do not extend it.
    t += 4 * kSec;
    Fail(a, t);
    Fail(a, t + 3 * kSec, 3);
    EXPECT_FALSE(Refused(a, t + 4 * kSec));
    // A success forgets the address: 4 failures are then harmless again.
    ote_auth_limit_ok(lim_, &a);
    EXPECT_EQ(ote_auth_limit_size(lim_), 0u);
    t += 10 * kSec;
    Fail(a, t, 4);
    EXPECT_FALSE(Refused(a, t));
}

TEST_F(AuthLimitTest, SlowFailuresAndAQuietPeriodDoNotAccumulate) {
    ote_auth_addr_t a = V4(0x0a000003);
    uint64_t t = 5000 * kSec;
    // One failure every 3 s: never 5 within 10 s.
    for (int i = 0; i < 20; i++) {
        Fail(a, t);
        EXPECT_FALSE(Refused(a, t)) << i;
        t += 3 * kSec;
    }
    // In penalty, then quiet for quiet_ns: the next failure starts over.
    Fail(a, t, 5);
    EXPECT_TRUE(Refused(a, t));
    t += 101 * kSec;
    Fail(a, t);
    EXPECT_FALSE(Refused(a, t));
}

TEST_F(AuthLimitTest, TheTableStaysBoundedAndKeepsAddressesInBackOff) {
    uint64_t t = 100 * kSec;
    std::vector<ote_auth_addr_t> blocked;
    for (uint32_t i = 0; i < 8; i++) {
        blocked.push_back(V4(0xc0000200 + i));
        Fail(blocked.back(), t, 5);
    }
    // A flood of 100x the table's size of distinct addresses, each failing once.
    for (uint32_t i = 0; i < 6400; i++) {
        Fail(V4(0x0b000000 + i), t + i);
        ASSERT_LE(ote_auth_limit_size(lim_), 64u) << i;
    }
    EXPECT_EQ(ote_auth_limit_size(lim_), 64u);
    for (const auto &b : blocked) EXPECT_TRUE(Refused(b, t + 6400)); // not evicted
    // IPv6 addresses from one /64 count one by one, and are bounded the same way.
    sockaddr_in6 s6{};
    s6.sin6_family = AF_INET6;
    ASSERT_EQ(inet_pton(AF_INET6, "2001:db8::", &s6.sin6_addr), 1);
    for (uint32_t i = 0; i < 1000; i++) {
        memcpy(&s6.sin6_addr.s6_addr[12], &i, sizeof(i));
        ote_auth_addr_t a;
        ote_auth_addr_of_sockaddr(reinterpret_cast<sockaddr *>(&s6), sizeof(s6), &a);
        Fail(a, t + 7000 + i, 5);
        ASSERT_LE(ote_auth_limit_size(lim_), 64u);
    }
    // When every entry is in back-off, the least recently failed one goes.
    EXPECT_FALSE(Refused(blocked[0], t + 7000));
}

TEST_F(AuthLimitTest, ConcurrentCallersKeepTheTableConsistent) {
    std::vector<std::thread> th;
    for (int k = 0; k < 4; k++) {
        th.emplace_back([this, k] {
            for (uint32_t i = 0; i < 20000; i++) {
                ote_auth_addr_t a = V4(0x0c000000 + ((i * 7 + k) % 200));
                uint64_t now = 10 * kSec + i;
                if (i % 3 == 0) ote_auth_limit_fail(lim_, "tcp", &a, now);
                else if (i % 3 == 1) (void)ote_auth_limit_refuse(lim_, &a, now);
                else if (i % 50 == 2) ote_auth_limit_ok(lim_, &a);
            }
        });
    }
    for (auto &t : th) t.join();
    EXPECT_LE(ote_auth_limit_size(lim_), 64u);
    // Still a working table: a fresh address backs off after 5 failures.
    ote_auth_addr_t a = V4(0x0d000001);
    Fail(a, 1000 * kSec, 5);
    EXPECT_TRUE(Refused(a, 1000 * kSec));
}

} // namespace

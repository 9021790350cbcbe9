// tests/naming/naming_cluster_test.cc - a three-member etcd cluster on loopback: with one
// member killed (the endpoint the handle was using), names still resolve, publish, list
// and stay alive past their ttl through the other members.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "tests/naming/servers.h"
#include "tests/util/test_base.h"
#include "tests/util/wait.h"

namespace ote_test {
namespace {

class NamingClusterTest : public OteTest {};

TEST_F(NamingClusterTest, OneMemberKilledKeepsServing) {
    if (!HaveBinary("etcd")) GTEST_SKIP() << "etcd is not installed (scripts/deps.sh)";
    std::vector<ServerProc> members;
    std::string url;
    ASSERT_TRUE(StartEtcd(3, &members, &url));
    ote_engine_t *src = LoopbackEngine();
    ote_engine_t *req = LoopbackEngine();
    ASSERT_NE(src, nullptr);
    ASSERT_NE(req, nullptr);
    ote_naming_opts_t o = {};
    o.timeout_ms = 1000;
    o.ttl_ms = 2000;
    ote_naming_t *pub = nullptr, *n = nullptr;
    ASSERT_EQ(ote_naming_open(url.c_str(), &o, &pub), OTE_OK);
    ASSERT_EQ(ote_naming_open(url.c_str(), &o, &n), OTE_OK);
    ASSERT_EQ(ote_naming_publish(pub, "decode-0", src), OTE_OK);
    ote_naming_entry_t e = {};
    ASSERT_EQ(ote_naming_resolve(n, "decode-0", &e, nullptr, 0, nullptr), OTE_OK);

    members[0].Stop(); // the first endpoint: both handles were using it
    // Resolves go to the next member (the raft leader may be re-elected meanwhile).
    EXPECT_TRUE(WaitUntil(
        [&] { return ote_naming_resolve(n, "decode-0", &e, nullptr, 0, nullptr) == OTE_OK; },
        std::chrono::seconds(5), "a resolve through the surviving members"));
    EXPECT_EQ(std::string(e.addr), EngineAddr(src));
    EXPECT_TRUE(WaitUntil([&] { return ote_naming_publish(pub, "decode-1", src) == OTE_OK; },
                          std::chrono::seconds(5), "a publish through the surviving members"));
    // Past two ttls the names are still there: the lease is kept alive through them.
    std::this_thread::sleep_for(std::chrono::milliseconds(2 * o.ttl_ms + 500));
    char names[4][OTE_NAMING_NAME_MAX + 1];
    size_t count = 0;
    EXPECT_EQ(ote_naming_list(n, "decode-", names, 4, &count), OTE_OK);
    EXPECT_EQ(count, 2u);
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_naming_segment_open(n, req, "decode-1", &seg), OTE_OK);
    EXPECT_EQ(ote_naming_segment_close(n, seg), OTE_OK);
    EXPECT_EQ(ote_naming_close(n), OTE_OK);
    EXPECT_EQ(ote_naming_close(pub), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
}

} // namespace
} // namespace ote_test

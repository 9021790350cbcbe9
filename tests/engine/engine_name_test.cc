// The sender's engine name (config key engine_name, issue 27) travels in the HELLO of every
// connection an engine opens and comes with each notification it sends: a named sender's
// notifications arrive with its name and an unnamed one's with "", through
// ote_notify_recv_ex and ote_notify_drain, whether sent alone or attached to a batch, over
// tcp, shm and rdma (the sim provider). ote_notify_recv (no name) keeps working.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "tests/engine/engine_util.h"
#include "tests/util/test_base.h"

extern "C" {
#include "ote/ote.h"
}

namespace {

using ote_test::ConfigKv;
using ote_test::EngineAddress;
using ote_test::kSec;
using ote_test::NewEngine;

class EngineNameTest : public ote_test::OteTest,
                       public ::testing::WithParamInterface<const char *> {
  protected:
    ConfigKv Config(const char *name) const {
        ConfigKv kv = {{"transports", GetParam()}};
        if (std::string(GetParam()) == "rdma") kv.push_back({"verbs_provider", "sim"});
        if (name != nullptr) kv.push_back({"engine_name", name});
        return kv;
    }
    // The next notification at b: its message, sender address and name.
    static void Recv(ote_engine_t *b, std::string *msg, std::string *from, std::string *name) {
        char buf[OTE_NOTIFY_MAX], f[272], n[OTE_ENGINE_NAME_MAX + 1];
        size_t len = 0;
        ASSERT_EQ(
            ote_notify_recv_ex(b, buf, sizeof(buf), &len, f, sizeof(f), n, sizeof(n), 5 * kSec),
            OTE_OK);
        *msg = std::string(buf, len);
        *from = f;
        *name = n;
    }
};

TEST_P(EngineNameTest, NotificationsCarryTheSendersName) {
    ote_engine_t *b = NewEngine(Config(nullptr));               // the receiver
    ote_engine_t *named = NewEngine(Config("prefill node-0~")); // printable, with a space
    ote_engine_t *plain = NewEngine(Config(nullptr));
    ote_segment_t *sn = nullptr, *sp = nullptr;
    ASSERT_EQ(ote_segment_open(named, EngineAddress(b).c_str(), &sn), OTE_OK);
    ASSERT_EQ(ote_segment_open(plain, EngineAddress(b).c_str(), &sp), OTE_OK);

    ASSERT_EQ(ote_notify_send(named, sn, "from named", 10), OTE_OK);
    std::string msg, from, name;
    Recv(b, &msg, &from, &name);
    EXPECT_EQ(msg, "from named");
    EXPECT_EQ(from, EngineAddress(named));
    EXPECT_EQ(name, "prefill node-0~");
    ASSERT_EQ(ote_notify_send(plain, sp, "from plain", 10), OTE_OK);
    Recv(b, &msg, &from, &name);
    EXPECT_EQ(msg, "from plain");
    EXPECT_EQ(from, EngineAddress(plain));
    EXPECT_EQ(name, "");

    // A batch's notification goes the same way; drain gives each its sender's name.
    ote_batch_t *bt = nullptr;
    ASSERT_EQ(ote_batch_create(named, 1, &bt), OTE_OK);
    ote_request_t zero = {OTE_WRITE, nullptr, sn, 0, 0};
    ASSERT_EQ(ote_batch_notify(bt, sn, "batch", 5), OTE_OK);
    ASSERT_EQ(ote_batch_submit(bt, &zero, 1), OTE_OK);
    ASSERT_EQ(ote_batch_wait(bt, 5 * kSec), OTE_OK);
    ote_status_t nr = OTE_ERR_AGAIN;
    ASSERT_EQ(ote_batch_notify_result(bt, &nr), OTE_OK);
    EXPECT_EQ(nr, OTE_OK);
    ASSERT_EQ(ote_notify_send(plain, sp, "plain again", 11), OTE_OK);
    ote_notification_t rec[4];
    std::vector<char> data(1 << 12);
    size_t n = 0;
    ASSERT_EQ(ote_notify_drain(b, rec, 4, data.data(), data.size(), &n), OTE_OK);
    ASSERT_EQ(n, 2u);
    EXPECT_EQ(std::string(data.data() + rec[0].offset, rec[0].len), "batch");
    EXPECT_STREQ(rec[0].name, "prefill node-0~");
    EXPECT_STREQ(rec[0].from, EngineAddress(named).c_str());
    EXPECT_EQ(std::string(data.data() + rec[1].offset, rec[1].len), "plain again");
    EXPECT_STREQ(rec[1].name, "");

    // A name buffer too short is TOO_BIG with the message kept; the call without a name
    // (and ote_notify_recv) takes it.
    ASSERT_EQ(ote_notify_send(named, sn, "kept", 4), OTE_OK);
    char buf[16], f[272], small[4];
    size_t len = 0;
    EXPECT_EQ(
        ote_notify_recv_ex(b, buf, sizeof(buf), &len, f, sizeof(f), small, sizeof(small), 5 * kSec),
        OTE_ERR_TOO_BIG);
    ASSERT_EQ(ote_notify_recv(b, buf, sizeof(buf), &len, f, sizeof(f), 5 * kSec), OTE_OK);
    EXPECT_EQ(std::string(buf, len), "kept");
    EXPECT_EQ(ote_notify_recv_ex(b, buf, sizeof(buf), &len, nullptr, 0, nullptr, 0, 0),
              OTE_ERR_TIMEOUT);

    EXPECT_EQ(ote_batch_destroy(bt), OTE_OK);
    EXPECT_EQ(ote_segment_close(sn), OTE_OK);
    EXPECT_EQ(ote_segment_close(sp), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(plain), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(named), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(b), OTE_OK);
}

// With a cluster key the proof covers the HELLO as sent, name included: a named requester
// proves the key and its notifications still carry its name.
TEST_P(EngineNameTest, WithAClusterKeyTheNamedHelloProves) {
    const char *dir = getenv("TEST_TMPDIR");
    std::string key = std::string(dir ? dir : "/tmp") + "/engine_name_key";
    unlink(key.c_str());
    int fd = open(key.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    ASSERT_GE(fd, 0);
    std::vector<uint8_t> k(32);
    for (size_t i = 0; i < k.size(); i++) k[i] = static_cast<uint8_t>(3 + i * 7);
    ASSERT_EQ(write(fd, k.data(), k.size()), static_cast<ssize_t>(k.size()));
    close(fd);
    ConfigKv rc = Config(nullptr), nc = Config("keyed-0");
    rc.push_back({"auth_key_file", key.c_str()});
    nc.push_back({"auth_key_file", key.c_str()});
    ote_engine_t *b = NewEngine(rc), *named = NewEngine(nc);
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_segment_open(named, EngineAddress(b).c_str(), &seg), OTE_OK);
    ASSERT_EQ(ote_notify_send(named, seg, "keyed", 5), OTE_OK);
    std::string msg, from, name;
    Recv(b, &msg, &from, &name);
    EXPECT_EQ(msg, "keyed");
    EXPECT_EQ(name, "keyed-0");
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(named), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(b), OTE_OK);
    unlink(key.c_str());
}

INSTANTIATE_TEST_SUITE_P(Transports, EngineNameTest, ::testing::Values("tcp", "shm,tcp", "rdma"),
                         [](const ::testing::TestParamInfo<const char *> &i) {
                             std::string p = i.param;
                             return p == "shm,tcp" ? std::string("shm") : p;
                         });

} // namespace

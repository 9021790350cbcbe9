// tests/engine/open_foreign_test.cc - ote_segment_open to something that is not an
// OrbitTE engine: a server that accepts and never answers ends OTE_ERR_CONNECT, one that
// answers garbage (random bytes, an HTTP reply) OTE_ERR_PROTOCOL; both within
// connect_timeout_ms (plus scheduling slack), with every transports list an engine can
// have, and with a WARN naming the peer. Before, the silent server took twice the
// deadline and ended OTE_ERR_TIMEOUT (tcp), and garbage ended OTE_ERR_UNSUPPORTED (shm,tcp)
// as if the peer offered no common transport.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/engine/engine_util.h"
#include "tests/util/test_base.h"

extern "C" {
#include "base/time.h"
#include "ote/ote.h"
}

namespace {

using ote_test::kMs;

// A loopback server that accepts every connection and then says `reply` (nothing when
// empty) and holds it open until the test ends.
class ForeignServer {
  public:
    explicit ForeignServer(std::string reply) : reply_(std::move(reply)) {
        fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t al = sizeof(a);
        EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr *>(&a), sizeof(a)), 0);
        EXPECT_EQ(listen(fd_, 64), 0);
        EXPECT_EQ(getsockname(fd_, reinterpret_cast<sockaddr *>(&a), &al), 0);
        address_ = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
        thread_ = std::thread([this] { Serve(); });
    }
    ~ForeignServer() {
        stop_ = true;
        thread_.join();
        for (int c : conns_) close(c);
        close(fd_);
    }
    const std::string &address() const { return address_; }

  private:
    void Serve() {
        while (!stop_) {
            pollfd p = {fd_, POLLIN, 0};
            if (poll(&p, 1, 20) <= 0) continue;
            int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
            if (c < 0) continue;
            if (!reply_.empty()) (void)!write(c, reply_.data(), reply_.size());
            conns_.push_back(c);
        }
    }
    std::string reply_, address_;
    int fd_ = -1;
    std::atomic<bool> stop_{false};
    std::thread thread_;
    std::vector<int> conns_;
};

std::string RandomBytes(size_t n) {
    std::mt19937 g(1234);
    std::string s(n, '\0');
    for (auto &c : s) c = static_cast<char>(g());
    return s;
}

struct Param {
    const char *transports;
};

class OpenForeignTest : public ote_test::OteTest, public testing::WithParamInterface<Param> {
  protected:
    // ote_segment_open to the server: its status and how long it took.
    ote_status_t Open(const ForeignServer &s, uint64_t *took_ns) {
        ote_engine_t *e = nullptr;
        std::string tps = GetParam().transports;
        e = ote_test::NewEngine({{"transports", tps.c_str()},
                                 {"verbs_provider", "sim"},
                                 {"connect_timeout_ms", "1000"}});
        EXPECT_NE(e, nullptr);
        if (e == nullptr) return OTE_ERR_STATE;
        ote_segment_t *seg = nullptr;
        uint64_t t0 = ote_now_ns();
        ote_status_t st = ote_segment_open(e, s.address().c_str(), &seg);
        *took_ns = ote_now_ns() - t0;
        if (st == OTE_OK) {
            EXPECT_EQ(ote_segment_close(seg), OTE_OK);
        }
        EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
        return st;
    }
};

TEST_P(OpenForeignTest, SilentServerIsConnectWithinTheDeadline) {
    ForeignServer s("");
    uint64_t took = 0;
    ote_status_t st = Open(s, &took);
    EXPECT_EQ(ote_status_code(st), OTE_ERR_CONNECT) << ote_status_str(st);
    EXPECT_EQ(ote_status_scope(st), OTE_SCOPE_PEER);
    EXPECT_GE(took, 950 * kMs);
    EXPECT_LT(took, 1600 * kMs) << "connect_timeout_ms is 1000";
    EXPECT_TRUE(LogContains(s.address()));
}

TEST_P(OpenForeignTest, GarbageIsProtocolWithinTheDeadline) {
    for (std::string reply : {RandomBytes(64), std::string("HTTP/1.1 400 Bad Request\r\n"
                                                           "Content-Length: 0\r\n\r\n")}) {
        ForeignServer s(reply);
        uint64_t took = 0;
        ote_status_t st = Open(s, &took);
        EXPECT_EQ(ote_status_code(st), OTE_ERR_PROTOCOL) << ote_status_str(st);
        EXPECT_LT(took, 1600 * kMs);
        EXPECT_TRUE(LogContains(s.address()));
    }
}

INSTANTIATE_TEST_SUITE_P(Lists, OpenForeignTest,
                         testing::Values(Param{"tcp"}, Param{"shm,tcp"}, Param{"shm"},
                                         Param{"rdma"}, Param{"rdma,tcp"}),
                         [](const testing::TestParamInfo<Param> &i) {
                             std::string n = i.param.transports;
                             for (auto &c : n)
                                 if (c == ',') c = '_';
                             return n;
                         });

} // namespace

#include "tests/engine/ctl_peer.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

extern "C" {
#include "base/time.h"
}

namespace ote_test {

namespace {

constexpr uint64_t kNsPerMs = 1000000ull;

bool RecvUntil(int fd, uint8_t *p, size_t len, ote_deadline_t dl) {
    while (len > 0) {
        pollfd pf = {fd, POLLIN, 0};
        if (poll(&pf, 1, ote_deadline_remaining_ms(dl, 100)) <= 0) {
            if (ote_deadline_expired(dl)) return false;
            continue;
        }
        ssize_t n = recv(fd, p, len, 0);
        if (n <= 0) return false;
        p += n;
        len -= static_cast<size_t>(n);
    }
    return true;
}

} // namespace

int ListenLoopback(int backlog, std::string *addr) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof(sa);
    if (bind(fd, reinterpret_cast<sockaddr *>(&sa), sizeof(sa)) != 0 || listen(fd, backlog) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr *>(&sa), &sl) != 0) {
        close(fd);
        return -1;
    }
    *addr = "127.0.0.1:" + std::to_string(ntohs(sa.sin_port));
    return fd;
}

int ConnectTo(const std::string &addr, int rcvbuf) {
    size_t colon = addr.rfind(':');
    if (colon == std::string::npos) return -1;
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(std::stoi(addr.substr(colon + 1))));
    if (inet_pton(AF_INET, addr.substr(0, colon).c_str(), &sa.sin_addr) != 1) return -1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (rcvbuf) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    if (connect(fd, reinterpret_cast<sockaddr *>(&sa), sizeof(sa)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

int AcceptWithin(int lfd, int timeout_ms) {
    pollfd p = {lfd, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) != 1) return -1;
    return accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
}

bool SendAll(int fd, const void *p, size_t len) {
    const uint8_t *b = static_cast<const uint8_t *>(p);
    while (len > 0) {
        ssize_t n = send(fd, b, len, MSG_NOSIGNAL);
        if (n <= 0) return false;
        b += n;
        len -= static_cast<size_t>(n);
    }
    return true;
}

bool SendAll(int fd, const std::vector<uint8_t> &b) { return SendAll(fd, b.data(), b.size()); }

bool RecvAll(int fd, void *p, size_t len, int timeout_ms) {
    return RecvUntil(fd, static_cast<uint8_t *>(p), len,
                     ote_deadline_after(static_cast<uint64_t>(timeout_ms) * kNsPerMs));
}

bool ClosedByPeer(int fd, int timeout_ms) {
    ote_deadline_t dl = ote_deadline_after(static_cast<uint64_t>(timeout_ms) * kNsPerMs);
    char junk[4096];
    for (;;) {
        pollfd pf = {fd, POLLIN, 0};
        if (poll(&pf, 1, ote_deadline_remaining_ms(dl, 100)) > 0) {
            ssize_t n = recv(fd, junk, sizeof(junk), MSG_DONTWAIT);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return true;
        } else if (ote_deadline_expired(dl)) {
            return false;
        }
    }
}

bool ReadFrame(int fd, std::vector<uint8_t> *buf, ote_ctl_msg_t *m, int timeout_ms) {
    ote_deadline_t dl = ote_deadline_after(static_cast<uint64_t>(timeout_ms) * kNsPerMs);
    buf->assign(OTE_CTL_HDR_LEN, 0);
    if (!RecvUntil(fd, buf->data(), OTE_CTL_HDR_LEN, dl)) return false;
    size_t used = 0;
    ote_status_t st = ote_ctl_decode(buf->data(), buf->size(), m, &used);
    if (st == OTE_OK) return true; // a header-only frame (bulk data, if any, follows)
    if (st != OTE_ERR_AGAIN) return false;
    const uint8_t *h = buf->data();
    uint32_t body = h[20] | (h[21] << 8) | (h[22] << 16) | (static_cast<uint32_t>(h[23]) << 24);
    uint16_t op = static_cast<uint16_t>(h[6] | (h[7] << 8));
    if (op == OTE_CTL_WRITE_REQ || op == OTE_CTL_READ_REQ)
        body = OTE_CTL_RW_BODY_LEN; // data follows
    if (body > OTE_CTL_MAX_BODY) return false;
    buf->resize(OTE_CTL_HDR_LEN + body);
    if (!RecvUntil(fd, buf->data() + OTE_CTL_HDR_LEN, body, dl)) return false;
    return ote_ctl_decode(buf->data(), buf->size(), m, &used) == OTE_OK;
}

std::vector<uint8_t> Encode(const ote_ctl_msg_t &m) {
    std::vector<uint8_t> b(OTE_CTL_HDR_LEN + OTE_CTL_MAX_BODY);
    size_t len = 0;
    EXPECT_EQ(ote_ctl_encode(&m, b.data(), b.size(), &len), OTE_OK);
    b.resize(len);
    return b;
}

void SendMsg(int fd, const ote_ctl_msg_t &m) {
    uint8_t buf[OTE_CTL_HDR_LEN + OTE_CTL_MAX_BODY];
    size_t len = 0;
    ASSERT_EQ(ote_ctl_encode(&m, buf, sizeof(buf), &len), OTE_OK);
    ASSERT_EQ(send(fd, buf, len, MSG_NOSIGNAL), static_cast<ssize_t>(len));
}

bool SendHelloAck(int fd, uint64_t req_id, uint32_t max_data, const std::string &addr) {
    ote_ctl_msg_t a{};
    a.version = 1;
    a.opcode = OTE_CTL_HELLO_ACK;
    a.req_id = req_id;
    a.u.hello_ack.version = 1;
    a.u.hello_ack.max_data = max_data;
    a.u.hello_ack.addr = addr.c_str();
    a.u.hello_ack.addr_len = static_cast<uint32_t>(addr.size());
    return SendAll(fd, Encode(a));
}

bool AnswerHello(int fd, uint32_t max_data, const std::string &addr) {
    std::vector<uint8_t> buf;
    ote_ctl_msg_t m;
    if (!ReadFrame(fd, &buf, &m) || m.opcode != OTE_CTL_HELLO) return false;
    return SendHelloAck(fd, m.req_id, max_data, addr);
}

RawServer::RawServer(std::function<void(int)> on_conn, int backlog, bool thread_per_connection)
    : on_conn_(std::move(on_conn)), thread_per_connection_(thread_per_connection) {
    lfd_ = ListenLoopback(backlog, &address);
    acceptor_ = std::thread([this] {
        while (!stop_) {
            pollfd p = {lfd_, POLLIN, 0};
            if (poll(&p, 1, 20) <= 0) continue;
            int fd = accept4(lfd_, nullptr, nullptr, SOCK_CLOEXEC);
            if (fd < 0) continue;
            {
                std::lock_guard<std::mutex> g(mu_);
                fds_.push_back(fd);
                if (thread_per_connection_) {
                    threads_.emplace_back([this, fd] { on_conn_(fd); });
                    continue;
                }
            }
            on_conn_(fd);
        }
    });
}

RawServer::~RawServer() {
    stop_ = true;
    acceptor_.join();
    DropAll();
    for (auto &t : threads_) t.join();
    for (int fd : fds_) close(fd);
    if (lfd_ >= 0) close(lfd_);
}

void RawServer::DropAll() {
    std::lock_guard<std::mutex> g(mu_);
    for (int fd : fds_) shutdown(fd, SHUT_RDWR);
}

} // namespace ote_test

// tests/engine/ctl_peer.h - raw peers of the engine's control plane: loopback TCP
// listeners and clients, whole-buffer sends and receives with deadlines, framing of
// engine/control/ctl.h messages, and a raw server that hands each accepted connection
// to a callback. Tests use them to play a lying or stalled source or requester.
#ifndef OTE_TESTS_ENGINE_CTL_PEER_H
#define OTE_TESTS_ENGINE_CTL_PEER_H

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

extern "C" {
#include "engine/control/ctl.h"
}

namespace ote_test {

// A TCP listener on 127.0.0.1 (an ephemeral port); its "127.0.0.1:port" goes to *addr.
// -1 on failure.
int ListenLoopback(int backlog, std::string *addr);
// A connected TCP socket to "host:port" (IPv4), with SO_RCVBUF set first when rcvbuf is
// non-zero; -1 on failure.
int ConnectTo(const std::string &addr, int rcvbuf = 0);
// accept4 once the listener is readable within timeout_ms; -1 otherwise.
int AcceptWithin(int lfd, int timeout_ms);

// The default waits below are generous (a loaded 2-core machine under ASan can stall for
// seconds): they bound what must happen, and cost nothing when it does.

// Send all len bytes (MSG_NOSIGNAL); false on any error.
bool SendAll(int fd, const void *p, size_t len);
bool SendAll(int fd, const std::vector<uint8_t> &b);
// Receive exactly len bytes within timeout_ms; false on EOF, error or the deadline.
bool RecvAll(int fd, void *p, size_t len, int timeout_ms = 20000);
// True once the peer closed (EOF or reset) within timeout_ms; what it sends is dropped.
bool ClosedByPeer(int fd, int timeout_ms = 20000);

// One control frame: header and body, without the bulk data of WRITE_REQ / READ_RESP
// (the caller reads that). Its bytes stay in *buf; m points into them. False on EOF,
// the deadline, or a frame that does not decode.
bool ReadFrame(int fd, std::vector<uint8_t> *buf, ote_ctl_msg_t *m, int timeout_ms = 20000);
// The encoded bytes of m (EXPECTs the encoding to succeed).
std::vector<uint8_t> Encode(const ote_ctl_msg_t &m);
// Encode m and send it; ASSERTs both succeed.
void SendMsg(int fd, const ote_ctl_msg_t &m);
// Send HELLO_ACK (version 1, req_id, max_data, the source address addr).
bool SendHelloAck(int fd, uint64_t req_id, uint32_t max_data, const std::string &addr);
// Read the requester's HELLO and answer it with SendHelloAck; false when no HELLO came.
bool AnswerHello(int fd, uint32_t max_data = OTE_CTL_MAX_DATA,
                 const std::string &addr = "127.0.0.1:1");

// A raw TCP server on 127.0.0.1 that runs on_conn for every accepted connection, on the
// accepting thread or (thread_per_connection) on a thread of its own, and keeps the fds
// until destroyed. Destruction stops accepting, shuts every connection down, joins the
// threads and closes the fds.
class RawServer {
  public:
    explicit RawServer(std::function<void(int)> on_conn, int backlog = 16,
                       bool thread_per_connection = false);
    ~RawServer();
    RawServer(const RawServer &) = delete;
    RawServer &operator=(const RawServer &) = delete;

    // Cut every accepted connection (shutdown): the peer sees EOF.
    void DropAll();
    // True once destruction began (a thread-per-connection callback's loop ends then).
    bool Stopping() const { return stop_.load(); }

    std::string address;

  private:
    std::function<void(int)> on_conn_;
    bool thread_per_connection_;
    int lfd_ = -1;
    std::atomic<bool> stop_{false};
    std::mutex mu_;
    std::vector<int> fds_;
    std::vector<std::thread> threads_;
    std::thread acceptor_;
};

} // namespace ote_test

#endif

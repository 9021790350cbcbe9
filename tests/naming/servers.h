// tests/naming/servers.h - real etcd and Redis servers on loopback for the naming tests:
// free ports, temporary data directories, started as child processes and killed by the
// test (or by the fixture's destructor), plus the naming_publisher child.
#ifndef OTE_TESTS_NAMING_SERVERS_H
#define OTE_TESTS_NAMING_SERVERS_H

#include <sys/types.h>

#include <string>
#include <vector>

extern "C" {
#include "ote/naming.h"
#include "ote/ote.h"
}

namespace ote_test {

// Whether an executable of that name is on $PATH.
bool HaveBinary(const char *name);

// One server process (an etcd member or a redis-server).
struct ServerProc {
    pid_t pid = -1;
    int port = 0;      // client port
    int peer_port = 0; // etcd: the member's peer port
    std::string dir;   // its data directory (removed by Stop)
    std::string log;   // its output
    void Kill(int sig = 9);
    // SIGSTOP, and wait (up to 5 s) until every thread of it is stopped: true then.
    bool Freeze();
    void Stop(); // SIGKILL, reap, remove its directory
    ~ServerProc() { Stop(); }
};

// n etcd members forming one cluster (n == 1: a single node), started together; the url
// "etcd://127.0.0.1:p1,..." once every member answers (false: a failure was reported).
bool StartEtcd(int n, std::vector<ServerProc> *members, std::string *url);
bool StartRedis(ServerProc *server, std::string *url);

// The naming_publisher child: an engine (TCP, listen_addr or 127.0.0.1:0) with a 1 MiB
// buffer "kv" filled with byte `fill`, published under name at url with ttl_ms. Start
// returns once it printed "ready <addr>" (false on failure or after 15 s).
struct Publisher {
    pid_t pid = -1;
    int in = -1; // its stdin: closing it ends the child cleanly
    std::string addr;
    bool Start(const std::string &url, const std::string &name, int ttl_ms, int fill,
               const std::string &listen_addr = "", const std::string &transports = "tcp");
    void Kill(); // SIGKILL and reap
    // SIGSTOP (a hung publisher: its sockets stay open, its lease is no longer kept
    // alive), and wait (up to 5 s) until every thread of it is stopped: true then. The
    // destructor and Kill end it stopped or not.
    bool Freeze();
    ~Publisher();
};

// An engine on TCP listening on 127.0.0.1:0 (nullptr on failure).
ote_engine_t *LoopbackEngine(const char *listen = "127.0.0.1:0");
std::string EngineAddr(ote_engine_t *e);
// One READ of len bytes at remote into local, waited for up to 5 s: its status.
ote_status_t ReadOnce(ote_engine_t *e, ote_segment_t *seg, void *local, uint64_t remote,
                      size_t len);
// The "kv" buffer a segment's peer lists (its address); 0 when absent.
uint64_t RemoteKv(ote_segment_t *seg);

} // namespace ote_test

#endif

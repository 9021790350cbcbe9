// tests/naming/servers.cc - see servers.h.
#include "tests/naming/servers.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "tests/util/wait.h"

extern char **environ;

namespace ote_test {

bool HaveBinary(const char *name) {
    const char *path = getenv("PATH");
    std::string p = path != nullptr ? path : "/usr/bin:/bin";
    size_t start = 0;
    while (start <= p.size()) {
        size_t end = p.find(':', start);
        if (end == std::string::npos) end = p.size();
        std::string f = p.substr(start, end - start) + "/" + name;
        if (access(f.c_str(), X_OK) == 0) return true;
        start = end + 1;
    }
    return false;
}

static int FreePort() {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    sockaddr_in a = {};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    int port = 0;
    if (bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static std::string TempDir(const char *what) {
    const char *t = getenv("TEST_TMPDIR");
    std::string tmpl = std::string(t != nullptr ? t : "/tmp") + "/" + what + ".XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    return mkdtemp(buf.data()) != nullptr ? std::string(buf.data()) : std::string();
}

// Spawn argv with stdout and stderr into log (stdin from /dev/null unless in_fd >= 0,
// stdout into out_fd when >= 0).
static pid_t Spawn(const std::vector<std::string> &args, const std::string &log, int in_fd = -1,
                   int out_fd = -1) {
    std::vector<char *> argv;
    for (auto &a : args) argv.push_back(const_cast<char *>(a.c_str()));
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (in_fd >= 0) posix_spawn_file_actions_adddup2(&fa, in_fd, 0);
    else posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    if (out_fd >= 0) posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
    else posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    pid_t pid = -1;
    int rc = posix_spawnp(&pid, argv[0], &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    return rc == 0 ? pid : -1;
}

void ServerProc::Kill(int sig) {
    if (pid > 0) kill(pid, sig);
}

// Whether every thread of pid is stopped ('T' in /proc/<pid>/task/*/stat).
static bool AllStopped(pid_t pid) {
    std::string cmd = "cat /proc/" + std::to_string(pid) + "/task/*/stat 2>/dev/null";
    FILE *f = popen(cmd.c_str(), "r");
    if (f == nullptr) return false;
    char line[4096];
    int threads = 0, stopped = 0;
    while (fgets(line, sizeof(line), f) != nullptr) {
        const char *close_paren = strrchr(line, ')');
        if (close_paren == nullptr || close_paren[1] == '\0') continue;
        threads++;
        stopped += close_paren[2] == 'T';
    }
    pclose(f);
    return threads > 0 && stopped == threads;
}

bool ServerProc::Freeze() {
    if (pid <= 0 || kill(pid, SIGSTOP) != 0) return false;
    return WaitUntil([&] { return AllStopped(pid); }, std::chrono::seconds(5),
                     "the store to stop (SIGSTOP)");
}

void ServerProc::Stop() {
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
        pid = -1;
    }
    if (!dir.empty()) {
        std::string cmd = "rm -rf '" + dir + "'";
        if (system(cmd.c_str()) != 0) ADD_FAILURE() << "could not remove " << dir;
        dir.clear();
    }
}

// Whether a naming handle opens on url within timeout (the server answers).
static bool Answers(const std::string &url, std::chrono::seconds timeout) {
    return PollUntil(
        [&] {
            ote_naming_opts_t o = {};
            o.timeout_ms = 500;
            ote_naming_t *n = nullptr;
            if (ote_naming_open(url.c_str(), &o, &n) != OTE_OK) return false;
            ote_naming_close(n);
            return true;
        },
        timeout, std::chrono::milliseconds(100));
}

static std::string Log(const std::string &path) {
    std::string cmd = "tail -n 20 '" + path + "' 2>/dev/null", out;
    FILE *f = popen(cmd.c_str(), "r");
    if (f == nullptr) return out;
    char buf[512];
    while (fgets(buf, sizeof(buf), f) != nullptr) out += buf;
    pclose(f);
    return out;
}

bool StartEtcd(int n, std::vector<ServerProc> *members, std::string *url) {
    members->clear();
    members->resize(n);
    std::string cluster;
    for (int i = 0; i < n; i++) {
        ServerProc &m = (*members)[i];
        m.port = FreePort();
        m.peer_port = FreePort();
        m.dir = TempDir("etcd");
        if (m.port == 0 || m.peer_port == 0 || m.dir.empty()) return false;
        m.log = m.dir + ".log";
        cluster += (i ? "," : "") + std::string("m") + std::to_string(i) +
                   "=http://127.0.0.1:" + std::to_string(m.peer_port);
    }
    *url = "etcd://";
    for (int i = 0; i < n; i++) {
        ServerProc &m = (*members)[i];
        std::string client = "http://127.0.0.1:" + std::to_string(m.port);
        std::string peer = "http://127.0.0.1:" + std::to_string(m.peer_port);
        m.pid = Spawn({"etcd",
                       "--name",
                       "m" + std::to_string(i),
                       "--data-dir",
                       m.dir + "/data",
                       "--listen-client-urls",
                       client,
                       "--advertise-client-urls",
                       client,
                       "--listen-peer-urls",
                       peer,
                       "--initial-advertise-peer-urls",
                       peer,
                       "--initial-cluster",
                       cluster,
                       "--initial-cluster-state",
                       "new",
                       "--heartbeat-interval",
                       "50",
                       "--election-timeout",
                       "500"},
                      m.log);
        if (m.pid < 0) return false;
        *url += (i ? "," : "") + std::string("127.0.0.1:") + std::to_string(m.port);
    }
    for (int i = 0; i < n; i++) {
        ServerProc &m = (*members)[i];
        std::string one = "etcd://127.0.0.1:" + std::to_string(m.port);
        if (!Answers(one, std::chrono::seconds(20))) {
            ADD_FAILURE() << "etcd member " << i << " does not answer:\n" << Log(m.log);
            return false;
        }
    }
    return true;
}

bool StartRedis(ServerProc *s, std::string *url) {
    s->port = FreePort();
    s->dir = TempDir("redis");
    if (s->port == 0 || s->dir.empty()) return false;
    s->log = s->dir + ".log";
    s->pid = Spawn({"redis-server", "--port", std::to_string(s->port), "--bind", "127.0.0.1",
                    "--dir", s->dir, "--save", "", "--appendonly", "no", "--daemonize", "no"},
                   s->log);
    if (s->pid < 0) return false;
    *url = "redis://127.0.0.1:" + std::to_string(s->port);
    if (!Answers(*url, std::chrono::seconds(20))) {
        ADD_FAILURE() << "redis-server does not answer:\n" << Log(s->log);
        return false;
    }
    return true;
}

static std::string PublisherBinary() {
    const char *srcdir = getenv("TEST_SRCDIR");
    if (srcdir != nullptr) {
        const char *ws = getenv("TEST_WORKSPACE");
        std::string p =
            std::string(srcdir) + "/" + (ws ? ws : "orbitte") + "/tests/naming/naming_publisher";
        if (access(p.c_str(), X_OK) == 0) return p;
    }
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) return "naming_publisher";
    self[n] = '\0';
    std::string dir(self);
    return dir.substr(0, dir.rfind('/')) + "/naming_publisher";
}

bool Publisher::Start(const std::string &url, const std::string &name, int ttl_ms, int fill,
                      const std::string &listen_addr, const std::string &transports) {
    int inp[2], outp[2];
    if (pipe2(inp, O_CLOEXEC) != 0) return false;
    if (pipe2(outp, O_CLOEXEC) != 0) {
        close(inp[0]);
        close(inp[1]);
        return false;
    }
    std::vector<std::string> args = {PublisherBinary(),
                                     url,
                                     name,
                                     std::to_string(ttl_ms),
                                     std::to_string(fill),
                                     listen_addr.empty() ? "127.0.0.1:0" : listen_addr,
                                     transports};
    const char *t = getenv("TEST_TMPDIR");
    pid = Spawn(args, std::string(t != nullptr ? t : "/tmp") + "/naming_publisher.log", inp[0],
                outp[1]);
    close(inp[0]);
    close(outp[1]);
    in = inp[1];
    std::string line;
    bool ok = pid > 0 && PollUntil(
                             [&] {
                                 char c;
                                 while (read(outp[0], &c, 1) == 1) {
                                     if (c == '\n') return true;
                                     line += c;
                                 }
                                 return false;
                             },
                             std::chrono::seconds(15));
    close(outp[0]);
    if (!ok || line.rfind("ready ", 0) != 0) {
        ADD_FAILURE() << "naming_publisher did not start: '" << line << "'";
        return false;
    }
    addr = line.substr(6);
    return true;
}

void Publisher::Kill() {
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
        pid = -1;
    }
}

bool Publisher::Freeze() {
    if (pid <= 0 || kill(pid, SIGSTOP) != 0) return false;
    return WaitUntil([&] { return AllStopped(pid); }, std::chrono::seconds(5),
                     "the publisher to stop (SIGSTOP)");
}

Publisher::~Publisher() {
    if (in >= 0) close(in); // EOF: the child withdraws its name and exits
    if (pid > 0) {
        kill(pid, SIGCONT); // a frozen one runs again to see it
        bool gone = PollUntil([&] { return waitpid(pid, nullptr, WNOHANG) == pid; },
                              std::chrono::seconds(10));
        if (gone) pid = -1;
        Kill();
    }
}

ote_engine_t *LoopbackEngine(const char *listen) {
    ote_config_t *cfg = nullptr;
    if (ote_config_create(&cfg) != OTE_OK) return nullptr;
    ote_engine_t *e = nullptr;
    if (ote_config_set(cfg, "transports", "tcp") != OTE_OK ||
        ote_config_set(cfg, "listen_address", listen) != OTE_OK ||
        ote_config_set(cfg, "connect_timeout_ms", "2000") != OTE_OK ||
        ote_engine_create(cfg, &e) != OTE_OK)
        e = nullptr;
    ote_config_destroy(cfg);
    return e;
}

std::string EngineAddr(ote_engine_t *e) {
    char buf[300];
    return ote_engine_address(e, buf, sizeof(buf)) == OTE_OK ? std::string(buf) : std::string();
}

ote_status_t ReadOnce(ote_engine_t *e, ote_segment_t *seg, void *local, uint64_t remote,
                      size_t len) {
    ote_batch_t *b = nullptr;
    ote_status_t st = ote_batch_create(e, 1, &b);
    if (st != OTE_OK) return st;
    ote_request_t r = {OTE_READ, local, seg, remote, len};
    st = ote_batch_submit(b, &r, 1);
    if (st == OTE_OK) st = ote_batch_wait(b, 5000000000ull);
    if (ote_batch_destroy(b) != OTE_OK) ADD_FAILURE() << "batch_destroy";
    return st;
}

uint64_t RemoteKv(ote_segment_t *seg) {
    ote_buffer_info_t info[8];
    size_t n = 0;
    if (ote_segment_buffers(seg, info, 8, &n) != OTE_OK) return 0;
    for (size_t i = 0; i < n; i++)
        if (strcmp(info[i].name, "kv") == 0) return info[i].addr;
    return 0;
}

} // namespace ote_test

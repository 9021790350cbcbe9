#include "tests/engine/target.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "tests/util/sync_point.h"
#include "tests/util/wait.h"

extern char **environ;

namespace ote_test {

std::string EngineTestBinary(const char *name) {
    const char *srcdir = getenv("TEST_SRCDIR");
    if (srcdir != nullptr) {
        const char *ws = getenv("TEST_WORKSPACE");
        std::string p = std::string(srcdir) + "/" + (ws ? ws : "orbitte") + "/tests/engine/" + name;
        if (access(p.c_str(), X_OK) == 0) return p;
    }
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) return name;
    self[n] = '\0';
    std::string dir(self);
    return dir.substr(0, dir.rfind('/')) + "/" + name;
}

Target::~Target() {
    if (pid > 0) Kill();
    CloseFds();
}

void Target::CloseFds() {
    if (in_ >= 0) close(in_);
    if (out_ >= 0) close(out_);
    in_ = out_ = -1;
}

bool Target::Start(uint64_t rw_size, const std::string &listen,
                   const std::vector<std::string> &env) {
    int pin[2], pout[2];
    if (pipe2(pin, O_CLOEXEC) != 0) return false;
    if (pipe2(pout, O_CLOEXEC) != 0) {
        close(pin[0]);
        close(pin[1]);
        return false;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, pin[0], 0);
    posix_spawn_file_actions_adddup2(&fa, pout[1], 1);
    std::string bin = EngineTestBinary(binary.c_str());
    std::string size = std::to_string(rw_size);
    std::vector<char *> argv = {const_cast<char *>(bin.c_str())};
    if (args.empty()) {
        argv.push_back(const_cast<char *>(size.c_str()));
        argv.push_back(const_cast<char *>(listen.c_str()));
    }
    for (auto &a : args) argv.push_back(const_cast<char *>(a.c_str()));
    argv.push_back(nullptr);
    std::vector<std::string> envs;
    // An entry of env replaces an inherited one of the same name (getenv finds the first).
    auto named_in_env = [&env](const char *kv) {
        const char *eq = strchr(kv, '=');
        size_t n = eq ? static_cast<size_t>(eq - kv) + 1 : strlen(kv);
        for (auto &e : env)
            if (e.compare(0, n, kv, n) == 0) return true;
        return false;
    };
    for (char **e = environ; *e; e++)
        if (!named_in_env(*e)) envs.emplace_back(*e);
    for (auto &e : env) envs.push_back(e);
    std::vector<char *> envp;
    for (auto &e : envs) envp.push_back(const_cast<char *>(e.c_str()));
    envp.push_back(nullptr);
    int rc = posix_spawn(&pid, bin.c_str(), &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    close(pin[0]);
    close(pout[1]);
    in_ = pin[1];
    out_ = pout[0];
    if (rc != 0) {
        pid = -1;
        CloseFds();
        return false;
    }
    if (!args.empty()) return true; // another program: its own protocol, no READY line
    std::string line = ReadLine(30000);
    std::istringstream is(line);
    std::string word;
    is >> word >> address >> rw >> rw_len >> ro >> ro_len >> wo >> wo_len;
    if (word != "READY" || !is) {
        Kill();
        CloseFds();
        return false;
    }
    return true;
}

std::string Target::ReadLine(int timeout_ms) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
        size_t nl = pending_.find('\n');
        if (nl != std::string::npos) {
            std::string line = pending_.substr(0, nl);
            pending_.erase(0, nl + 1);
            ote_test_sync_point(); /* after what the target did before it answered */
            return line;
        }
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                        deadline - std::chrono::steady_clock::now())
                        .count();
        if (left <= 0 || out_ < 0) return "";
        struct pollfd p = {out_, POLLIN, 0};
        int r = poll(&p, 1, static_cast<int>(left));
        if (r <= 0) continue;
        char buf[4096];
        ssize_t n = read(out_, buf, sizeof(buf));
        if (n <= 0) return "";
        pending_.append(buf, static_cast<size_t>(n));
    }
}

bool Target::Send(const std::string &cmd) {
    std::string line = cmd + "\n";
    ote_test_sync_point(); /* before what the target does on the command */
    return in_ >= 0 && write(in_, line.data(), line.size()) == static_cast<ssize_t>(line.size());
}

std::string Target::Command(const std::string &cmd, int timeout_ms) {
    if (!Send(cmd)) return "";
    return ReadLine(timeout_ms);
}

uint64_t Target::Hash(const char *which, uint64_t off, uint64_t len) {
    std::string r = Command(std::string("sum ") + which + " " + std::to_string(off) + " " +
                            std::to_string(len));
    if (r.rfind("SUM ", 0) != 0) return 0;
    return std::strtoull(r.c_str() + 4, nullptr, 16);
}

int Target::Quit() {
    if (pid <= 0) return -1;
    if (in_ >= 0) {
        ssize_t w = write(in_, "quit\n", 5);
        (void)w;
    }
    int status = 0;
    // Bounded wait: poll waitpid for up to 30 s, then kill (silent: the caller checks the
    // exit status, -1 then).
    if (PollUntil([&] { return waitpid(pid, &status, WNOHANG) == pid; },
                  std::chrono::seconds(30))) {
        pid = -1;
        CloseFds();
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    Kill();
    return -1;
}

bool Target::Stop() {
    if (pid <= 0 || kill(pid, SIGSTOP) != 0) return false;
    int status = 0;
    return waitpid(pid, &status, WUNTRACED) == pid && WIFSTOPPED(status);
}

bool Target::Cont() { return pid > 0 && kill(pid, SIGCONT) == 0; }

void Target::Kill() {
    if (pid <= 0) return;
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    pid = -1;
    CloseFds();
}

} // namespace ote_test

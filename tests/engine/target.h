// tests/engine/target.h - run tests/engine/ote_target as a child process and talk to it
// over its stdin/stdout (one command line, one reply line, each with a deadline).
#ifndef OTE_TESTS_ENGINE_TARGET_H
#define OTE_TESTS_ENGINE_TARGET_H

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ote_test {

class Target {
  public:
    Target() = default;
    ~Target();
    Target(const Target &) = delete;
    Target &operator=(const Target &) = delete;

    // Spawn the target (rw buffer of rw_size bytes, listening on listen), with extra
    // environment entries "KEY=VALUE". Waits for its READY line. False on failure.
    bool Start(uint64_t rw_size = 64ull << 20, const std::string &listen = "127.0.0.1:0",
               const std::vector<std::string> &env = {});
    // Send one command line and return the reply line ("" on timeout or EOF).
    std::string Command(const std::string &cmd, int timeout_ms = 30000);
    // Ask it to quit and reap it; returns its exit status (or -1).
    int Quit();
    // SIGSTOP it and return once it has stopped (waitpid WUNTRACED): from then on it
    // certainly does not answer. Cont() resumes it.
    bool Stop();
    bool Cont();
    // SIGKILL it and reap it.
    void Kill();

    uint64_t Hash(const char *which, uint64_t off, uint64_t len);
    // Send a command without waiting; read its reply later with Reply().
    bool Send(const std::string &cmd);
    std::string Reply(int timeout_ms = 30000) { return ReadLine(timeout_ms); }

    // The child binary (a data dependency in tests/engine); ote_gpu_target prints the same
    // READY line with its "dev", "host" and "dev2" buffers in place of rw, ro and wo.
    std::string binary = "ote_target";
    // When not empty: the child's arguments in place of rw_size and listen, and Start
    // returns once it runs (no READY line: another program, e.g. ote_swarm).
    std::vector<std::string> args;
    std::string address;
    uint64_t rw = 0, rw_len = 0, ro = 0, ro_len = 0, wo = 0, wo_len = 0;
    pid_t pid = -1;

  private:
    std::string ReadLine(int timeout_ms);
    void CloseFds();
    int in_ = -1, out_ = -1;
    std::string pending_;
};

// Path of a data dependency binary in tests/engine (runfiles or next to this test).
std::string EngineTestBinary(const char *name);

} // namespace ote_test

#endif

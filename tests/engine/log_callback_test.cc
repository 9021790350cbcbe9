// The public log sink (<ote/log.h>) over real engines: ote_log_set_callback sees the
// level, component, engine and message of a provoked WARN (a destroy refused while a
// segment is open); lines written on an engine's own threads name that engine; a named
// engine's lines carry "name@host:port", also those a batch's submit and wait write on the
// caller's thread; and the default stderr line matches the documented format, with and
// without an engine, a name's space and '%' escaped.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <regex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/engine/engine_util.h"
#include "tests/util/wait.h"

extern "C" {
#include "ote/ote.h"
}

namespace {

using ote_test::EngineAddress;
using ote_test::NewEngine;

struct Line {
    ote_log_level_t level;
    std::string component, engine, message;
    long tid;
};

struct Captured {
    std::mutex mu;
    std::vector<Line> lines;
};

void Capture(void *arg, ote_log_level_t level, const char *component, const char *engine,
             const char *message) {
    auto *c = static_cast<Captured *>(arg);
    std::lock_guard<std::mutex> g(c->mu);
    c->lines.push_back(Line{level, component, engine ? engine : "", message,
                            static_cast<long>(syscall(SYS_gettid))});
}

// The level and callback of the process, put back at the end of each test.
class LogCallbackTest : public ::testing::Test {
  protected:
    void SetUp() override { level_ = ote_log_level(); }
    void TearDown() override {
        EXPECT_EQ(ote_log_set_callback(nullptr, nullptr), OTE_OK);
        ote_log_set_level(level_);
    }
    ote_log_level_t level_ = OTE_LOG_WARN;
};

TEST_F(LogCallbackTest, RefusedDestroyArrivesAsWarnOfItsEngine) {
    Captured cap;
    ote_engine_t *a = NewEngine({{"transports", "tcp"}});
    ote_engine_t *b = NewEngine({{"transports", "tcp"}});
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    std::string addr_a = EngineAddress(a), addr_b = EngineAddress(b);
    ote_log_set_level(OTE_LOG_TRACE); // every line, so that the engines' threads write some
    ASSERT_EQ(ote_log_set_callback(&Capture, &cap), OTE_OK);
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_segment_open(a, addr_b.c_str(), &seg), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(a), OTE_ERR_BUSY); // refused: a segment is open
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(ote_log_set_callback(nullptr, nullptr), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(a), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(b), OTE_OK);

    long me = static_cast<long>(syscall(SYS_gettid));
    bool warn = false, other_thread = false;
    std::string all;
    std::lock_guard<std::mutex> g(cap.mu);
    for (const Line &l : cap.lines) {
        all += std::to_string(l.level) + " [" + l.component + "] {" + l.engine + "} " + l.message +
               "\n";
        if (l.level == OTE_LOG_WARN && l.component == "engine" &&
            l.message.find("destroy refused") != std::string::npos) {
            warn = true;
            EXPECT_EQ(l.engine, addr_a) << "the refused destroy's line names engine a";
            EXPECT_EQ(l.tid, me) << "written on the caller's thread";
        }
        // A line of an engine's own thread (its listener or workers) names that engine.
        if (l.tid != me && (l.engine == addr_a || l.engine == addr_b)) other_thread = true;
    }
    EXPECT_TRUE(warn) << "no WARN [engine] destroy refused among:\n" << all;
    EXPECT_TRUE(other_thread) << "no line of an engine's thread named its engine:\n" << all;
}

// A callback that sets a callback is refused (its thread holds the log's lock); a line
// the library writes on the callback's own thread goes to stderr instead of deadlocking.
struct Reentrant {
    ote_status_t inner = OTE_OK;
    int calls = 0;
};

void ReentrantCb(void *arg, ote_log_level_t, const char *, const char *, const char *) {
    auto *r = static_cast<Reentrant *>(arg);
    if (r->calls++ > 0) return;
    r->inner = ote_log_set_callback(nullptr, nullptr);
    ote_config_t *cfg = nullptr;
    if (ote_config_create(&cfg) != OTE_OK) return;
    // Logs a WARN on this thread, inside the callback: to stderr, not to the callback.
    ote_config_set(cfg, "log_level", "loud");
    ote_config_destroy(cfg);
}

TEST_F(LogCallbackTest, CallbackMayNotReplaceItselfAndDoesNotDeadlock) {
    Reentrant r;
    ASSERT_EQ(ote_log_set_callback(&ReentrantCb, &r), OTE_OK);
    ote_config_t *cfg = nullptr;
    ASSERT_EQ(ote_config_create(&cfg), OTE_OK);
    EXPECT_EQ(ote_config_set(cfg, "log_level", "noisy"), OTE_ERR_INVALID); // a WARN
    ote_config_destroy(cfg);
    EXPECT_EQ(ote_log_set_callback(nullptr, nullptr), OTE_OK);
    EXPECT_EQ(r.inner, OTE_ERR_STATE);
    EXPECT_EQ(r.calls, 1) << "the line written inside the callback reached it again";
}

// stderr while fn runs, as text.
std::string StderrOf(const std::function<void()> &fn) {
    char path[] = "/tmp/ote_log_stderr_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return "";
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    fn();
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    close(fd);
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    unlink(path);
    return ss.str();
}

// A named engine's tag is "name@host:port". Its peer goes away; the next submits write
// "reconnecting to ..." (INFO, tcp) on the caller's thread while the batch's submit
// asks for the connection again: that line, and every other one the caller's thread
// writes during submit and wait, names the engine.
TEST_F(LogCallbackTest, NamedEngineTagsTheLinesOfItsBatchCalls) {
    Captured cap;
    ote_engine_t *a = NewEngine({{"transports", "tcp"}, {"engine_name", "prefill 0%"}});
    ote_engine_t *b = NewEngine({{"transports", "tcp"}});
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    const std::string tag_a = "prefill 0%@" + EngineAddress(a);
    std::vector<uint8_t> local(4096, 1), remote(4096, 0);
    ASSERT_EQ(ote_memory_register(b, remote.data(), remote.size(), OTE_PERM_WRITE), OTE_OK);
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_segment_open(a, EngineAddress(b).c_str(), &seg), OTE_OK);
    ote_batch_t *bt = nullptr;
    ASSERT_EQ(ote_batch_create(a, 1, &bt), OTE_OK);
    ote_request_t q = {OTE_WRITE, local.data(), seg, (uint64_t)(uintptr_t)remote.data(), 4096};
    ASSERT_EQ(ote_batch_submit(bt, &q, 1), OTE_OK);
    ASSERT_EQ(ote_batch_wait(bt, 30 * ote_test::kSec), OTE_OK);
    ASSERT_EQ(ote_batch_reset(bt), OTE_OK);

    ote_log_set_level(OTE_LOG_INFO);
    ASSERT_EQ(ote_log_set_callback(&Capture, &cap), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(b, remote.data()), OTE_OK);
    ASSERT_EQ(ote_engine_destroy(b), OTE_OK);
    const long me = static_cast<long>(syscall(SYS_gettid));
    auto reconnect_seen = [&] {
        std::lock_guard<std::mutex> g(cap.mu);
        for (const Line &l : cap.lines)
            if (l.tid == me && l.component == "tcp" &&
                l.message.find("reconnecting to") != std::string::npos)
                return true;
        return false;
    };
    // Each try is a submit (and, when one starts, its wait): the peer's loss is noticed
    // by a's connection thread, after which a submit reconnects.
    ote_test::WaitUntil(
        [&] {
            if (ote_batch_submit(bt, &q, 1) == OTE_OK) {
                EXPECT_NE(ote_batch_wait(bt, 30 * ote_test::kSec), OTE_ERR_TIMEOUT);
                EXPECT_EQ(ote_batch_reset(bt), OTE_OK);
            }
            return reconnect_seen();
        },
        std::chrono::seconds(20), std::chrono::milliseconds(20), "a submit reconnecting");
    EXPECT_EQ(ote_log_set_callback(nullptr, nullptr), OTE_OK);
    EXPECT_EQ(ote_batch_destroy(bt), OTE_OK);
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(a), OTE_OK);

    std::lock_guard<std::mutex> g(cap.mu);
    int mine = 0;
    for (const Line &l : cap.lines) {
        if (l.tid != me) continue;
        mine++;
        EXPECT_EQ(l.engine, tag_a) << "[" << l.component << "] " << l.message;
    }
    EXPECT_GT(mine, 0);
}

TEST_F(LogCallbackTest, DefaultLineMatchesTheDocumentedFormat) {
    // <ote/log.h>'s pattern, as POSIX extended regular expression.
    regex_t line;
    ASSERT_EQ(regcomp(&line,
                      "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z orbitte "
                      "[EWIDT] pid=([0-9]+) tid=([0-9]+)( engine=[^ ]+)? \\[[^]]+\\] .*$",
                      REG_EXTENDED),
              0);
    ote_engine_t *a = NewEngine({{"transports", "tcp"}});
    ote_engine_t *b = NewEngine({{"transports", "tcp"}});
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    std::string addr_a = EngineAddress(a), addr_b = EngineAddress(b);
    ote_engine_t *c = NewEngine({{"transports", "tcp"}, {"engine_name", "decode 1%"}});
    ASSERT_NE(c, nullptr);
    const std::string word_c = "decode%201%25@" + EngineAddress(c);
    ote_segment_t *seg = nullptr, *seg_c = nullptr;
    ASSERT_EQ(ote_segment_open(a, addr_b.c_str(), &seg), OTE_OK);
    ASSERT_EQ(ote_segment_open(c, addr_b.c_str(), &seg_c), OTE_OK);
    std::string out = StderrOf([&] {
        EXPECT_EQ(ote_engine_destroy(a), OTE_ERR_BUSY); // WARN, engine a
        EXPECT_EQ(ote_engine_destroy(c), OTE_ERR_BUSY); // WARN, engine c (named)
        ote_config_t *cfg = nullptr;
        ASSERT_EQ(ote_config_create(&cfg), OTE_OK);
        EXPECT_EQ(ote_config_set(cfg, "log_level", "noisy"), OTE_ERR_INVALID); // no engine
        ote_config_destroy(cfg);
    });
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(ote_segment_close(seg_c), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(a), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(c), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(b), OTE_OK);

    std::istringstream lines(out);
    std::string l;
    int with_engine = 0, without = 0, named = 0;
    long me = static_cast<long>(syscall(SYS_gettid));
    while (std::getline(lines, l)) {
        regmatch_t m[4];
        ASSERT_EQ(regexec(&line, l.c_str(), 4, m, 0), 0)
            << "line not in the documented format: " << l;
        auto group = [&](int i) {
            return m[i].rm_so < 0 ? std::string() : l.substr(m[i].rm_so, m[i].rm_eo - m[i].rm_so);
        };
        EXPECT_EQ(std::stol(group(1)), static_cast<long>(getpid())) << l;
        if (l.find(" W ") != std::string::npos &&
            l.find("[engine] destroy refused") != std::string::npos) {
            EXPECT_TRUE(group(3) == " engine=" + addr_a || group(3) == " engine=" + word_c) << l;
            EXPECT_EQ(std::stol(group(2)), me) << l;
            with_engine++;
            if (group(3) == " engine=" + word_c) named++;
        }
        if (l.find("[engine] config: invalid log_level") != std::string::npos) {
            EXPECT_EQ(group(3), "") << "a configuration line knows no engine: " << l;
            EXPECT_EQ(std::stol(group(2)), me) << l;
            without++;
        }
    }
    regfree(&line);
    EXPECT_EQ(with_engine, 2) << out;
    EXPECT_EQ(named, 1) << "the named engine's word, its space and '%' escaped: " << out;
    EXPECT_EQ(without, 1) << out;
}

} // namespace

// base/log.c's callback (<ote/log.h>) under concurrent logging, and the engine tag:
// per thread, handed to threads started with ote_thread_create.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

extern "C" {
#include "base/log.h"
#include "base/thread.h"
}

namespace {

struct Counter {
    std::atomic<uint64_t> lines{0};
    std::string last_engine;
};

void Count(void *arg, ote_log_level_t, const char *, const char *engine, const char *) {
    auto *c = static_cast<Counter *>(arg);
    c->lines++;
    c->last_engine = engine ? engine : "(none)"; // calls never overlap: no lock needed
}

class LogTest : public ::testing::Test {
  protected:
    void SetUp() override {
        level_ = ote_log_level();
        ote_log_set_level(OTE_LOG_WARN);
    }
    void TearDown() override {
        ote_log_set_callback(nullptr, nullptr);
        ote_log_set_level(level_);
    }
    ote_log_level_t level_ = OTE_LOG_WARN;
};

// Callbacks installed and removed while four threads log: once ote_log_set_callback
// returns, the old arg is freed at once (ASan reports a use after free if a line still
// reached it), and every callback saw the lines of its own window only.
TEST_F(LogTest, ArgMayBeFreedOnceReplaced) {
    std::atomic<bool> stop{false};
    std::atomic<int> started{0};
    std::vector<std::thread> writers;
    for (int i = 0; i < 4; i++)
        writers.emplace_back([&] {
            started++;
            while (!stop.load()) OTE_WARN("logtest", "line from a writer");
        });
    // Every writer runs before the rounds start (on a loaded machine a thread may not be
    // scheduled for a while); the rounds go on, past 200, until lines reached a callback.
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (started.load() < 4 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_EQ(started.load(), 4) << "the writers did not start within 30 s";
    uint64_t seen = 0;
    for (int round = 0; round < 200 || (seen == 0 && std::chrono::steady_clock::now() < deadline);
         round++) {
        auto *c = new Counter;
        ASSERT_EQ(ote_log_set_callback(&Count, c), OTE_OK);
        std::this_thread::yield();
        ASSERT_EQ(ote_log_set_callback(nullptr, nullptr), OTE_OK);
        seen += c->lines.load();
        delete c;
    }
    stop = true;
    for (auto &t : writers) t.join();
    EXPECT_GT(seen, 0u) << "no line reached any callback";
}

void *ReportTag(void *arg) {
    const char *tag = ote_log_thread_engine();
    *static_cast<std::string *>(arg) = tag ? tag : "(none)";
    OTE_WARN("logtest", "from a started thread");
    return nullptr;
}

TEST_F(LogTest, EngineTagIsPerThreadAndHandedToStartedThreads) {
    static const char kTag[] = "127.0.0.1:4242";
    Counter c;
    ASSERT_EQ(ote_log_set_callback(&Count, &c), OTE_OK);
    OTE_WARN("logtest", "untagged");
    EXPECT_EQ(c.last_engine, "(none)");
    const char *prev = ote_log_set_thread_engine(kTag);
    OTE_WARN("logtest", "tagged");
    EXPECT_EQ(c.last_engine, kTag);

    std::string in_thread;
    pthread_t th;
    ASSERT_EQ(ote_thread_create(&th, nullptr, &ReportTag, &in_thread), 0);
    pthread_join(th, nullptr);
    EXPECT_EQ(in_thread, kTag);
    EXPECT_EQ(c.last_engine, kTag) << "the started thread's line names the engine";

    std::string plain = "unset";
    std::thread other([&] { ReportTag(&plain); }); // not started through ote_thread_create
    other.join();
    EXPECT_EQ(plain, "(none)");

    EXPECT_EQ(ote_log_set_thread_engine(prev), kTag);
    OTE_WARN("logtest", "untagged again");
    EXPECT_EQ(c.last_engine, "(none)");
    ote_log_set_thread_engine("");
    OTE_WARN("logtest", "empty tag");
    EXPECT_EQ(c.last_engine, "(none)") << "an empty tag is no engine";
    ote_log_set_thread_engine(prev);
    EXPECT_EQ(ote_log_set_callback(nullptr, nullptr), OTE_OK);
}

} // namespace

#include "tests/util/test_base.h"

#include <dirent.h>

#include <cstdlib>

extern "C" {
#include "base/alloc.h"
#include "base/fault.h"
#include "base/retained.h"
}

namespace ote_test {

namespace {
// The test between its SetUp and TearDown (gtest runs one test at a time per process).
std::atomic<OteTest *> g_current{nullptr};

std::string RetainedByKind() {
    std::string s;
    for (int k = 0; k < OTE_RETAINED_KINDS; k++) {
        uint64_t n = ote_retained_count(static_cast<ote_retained_kind_t>(k));
        if (n == 0) continue;
        s += std::string(s.empty() ? "" : ", ") +
             ote_retained_kind_name(static_cast<ote_retained_kind_t>(k)) + " " + std::to_string(n);
    }
    return s.empty() ? "none" : s;
}
} // namespace

int CountOpenFds() {
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (d == nullptr) return -1;
    while (struct dirent *e = readdir(d)) {
        if (e->d_name[0] != '.') n++;
    }
    closedir(d);
    return n - 1; // the DIR's own fd
}

void OteTest::SetUp() {
    ote_log_set_callback(&OteTest::Sink, this);
    fds_at_start_ = CountOpenFds();
    retained_at_start_ = ote_retained_total();
    g_current.store(this);
}

void OteTest::TearDown() {
    ote_alloc_fail_disarm();
    ote_fault_disarm_all();
    ote_log_set_callback(nullptr, nullptr);
    g_current.store(nullptr);
    EXPECT_EQ(expect_depth_.load(), 0) << "an ErrorLogsExpected guard outlived its test";
    if (!allow_errors_) {
        EXPECT_EQ(errors_, 0) << "unexpected ERROR log lines (outside ErrorLogsExpected):\n"
                              << [&] {
                                     std::string all;
                                     for (auto &l : lines_) all += l + "\n";
                                     return all;
                                 }();
    }
    if (check_fds_) {
        EXPECT_EQ(CountOpenFds(), fds_at_start_) << "file descriptors leaked";
    }
    int64_t grown = RetainedSinceStart();
    EXPECT_LE(grown, static_cast<int64_t>(retained_allowed_))
        << "the test ends with " << grown << " more retained native owner(s) than it started "
        << "with, " << retained_allowed_
        << " declared with ExpectRetained(); retained now: " << RetainedByKind();
}

int64_t OteTest::RetainedSinceStart() const {
    return static_cast<int64_t>(ote_retained_total()) - static_cast<int64_t>(retained_at_start_);
}

uint64_t OteTest::ExpectErrorLogsIn(const std::function<void()> &fn) {
    ErrorLogsExpected guard;
    fn();
    uint64_t seen = guard.Seen();
    EXPECT_GE(seen, 1u) << "ExpectErrorLogsIn: the statements logged no ERROR line";
    return seen;
}

void OteTest::Sink(void *arg, ote_log_level_t level, const char *component, const char * /*engine*/,
                   const char *msg) {
    auto *self = static_cast<OteTest *>(arg);
    std::lock_guard<std::mutex> g(self->mu_);
    static const char kLetters[] = "EWIDT";
    self->lines_.push_back(std::string(1, kLetters[level < 5 ? level : 4]) + " [" + component +
                           "] " + msg);
    if (level == OTE_LOG_ERROR) {
        if (self->expect_depth_.load() > 0) self->expected_seen_++;
        else self->errors_++;
    }
}

std::vector<std::string> OteTest::Logs() {
    std::lock_guard<std::mutex> g(mu_);
    return lines_;
}

bool OteTest::LogContains(const std::string &needle) {
    std::lock_guard<std::mutex> g(mu_);
    for (auto &l : lines_)
        if (l.find(needle) != std::string::npos) return true;
    return false;
}

ErrorLogsExpected::ErrorLogsExpected() : test_(g_current.load()), seen_at_start_(0) {
    if (test_ == nullptr) {
        ADD_FAILURE() << "ErrorLogsExpected used outside an OteTest body";
        return;
    }
    std::lock_guard<std::mutex> g(test_->mu_);
    seen_at_start_ = test_->expected_seen_.load();
    test_->expect_depth_++;
}

ErrorLogsExpected::~ErrorLogsExpected() {
    if (test_ == nullptr) return;
    std::lock_guard<std::mutex> g(test_->mu_);
    test_->expect_depth_--;
}

uint64_t ErrorLogsExpected::Seen() const {
    if (test_ == nullptr) return 0;
    return test_->expected_seen_.load() - seen_at_start_;
}

} // namespace ote_test

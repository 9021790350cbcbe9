#include "tests/util/test_base.h"

#include <dirent.h>

extern "C" {
#include "base/alloc.h"
#include "base/fault.h"
}

namespace ote_test {

int CountOpenFds() {
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (d == nullptr) return -1;
    while (struct dirent *e = readdir(d)) {
        if (e->d_name[0] != '.') n++;
    }
    closedir(d);
    return n - 1;  // the DIR's own fd
}

void OteTest::SetUp() {
    ote_log_set_sink(&OteTest::Sink, this);
    fds_at_start_ = CountOpenFds();
}

void OteTest::TearDown() {
    ote_alloc_fail_disarm();
    ote_fault_disarm_all();
    ote_log_set_sink(nullptr, nullptr);
    if (!allow_errors_) {
        EXPECT_EQ(errors_, 0) << "unexpected ERROR log lines:\n" << [&] {
            std::string all;
            for (auto &l : lines_) all += l + "\n";
            return all;
        }();
    }
    if (check_fds_) {
        EXPECT_EQ(CountOpenFds(), fds_at_start_) << "file descriptors leaked";
    }
}

void OteTest::Sink(void *arg, ote_log_level_t level, const char *component, const char *msg) {
    auto *self = static_cast<OteTest *>(arg);
    std::lock_guard<std::mutex> g(self->mu_);
    static const char kLetters[] = "EWIDT";
    self->lines_.push_back(std::string(1, kLetters[level < 5 ? level : 4]) + " [" + component +
                           "] " + msg);
    if (level == OTE_LOG_ERROR) self->errors_++;
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

}  // namespace ote_test

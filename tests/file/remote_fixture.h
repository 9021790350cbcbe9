// tests/file/remote_fixture.h - two engines of this process, one serving a file
// registration and one with a segment to it (tcp on loopback or shm), for the tests of
// peers' requests to files (file_remote_test.cc, file_zero_copy_test.cc).
#ifndef OTE_TESTS_FILE_REMOTE_FIXTURE_H
#define OTE_TESTS_FILE_REMOTE_FIXTURE_H

#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <string>
#include <vector>

extern "C" {
#include "base/fault.h"
#include "ote/ote.h"
}

#include "tests/util/test_base.h"

namespace ote_file_test {

constexpr uint64_t kWaitNs = 30ull * 1000 * 1000 * 1000;

inline std::string TmpPath(const char *name) {
    const char *d = getenv("TEST_TMPDIR");
    return std::string(d != nullptr ? d : "/tmp") + "/" + name;
}

inline uint8_t Pat(uint64_t i) { return static_cast<uint8_t>(i * 7 + (i >> 11)); }

class FileRemoteTest : public ote_test::OteTest {
  protected:
    using Kv = std::vector<std::pair<const char *, std::string>>;
    // An engine with the keys of kv set. The files these tests make are written through the page cache, which a peer's READ
    // would be served from (file_zero_copy=auto): file_zero_copy is off unless kv sets it,
    // so that they test the bounce path (file_zero_copy_test.cc tests the other).
    ote_engine_t *NewEngine(const Kv &kv) {
        ote_config_t *cfg = nullptr;
        EXPECT_EQ(ote_config_create(&cfg), OTE_OK);
        EXPECT_EQ(ote_config_set(cfg, "file_zero_copy", "off"), OTE_OK);
        for (const auto &k : kv) EXPECT_EQ(ote_config_set(cfg, k.first, k.second.c_str()), OTE_OK);
        ote_engine_t *e = nullptr;
        EXPECT_EQ(ote_engine_create(cfg, &e), OTE_OK);
        ote_config_destroy(cfg);
        return e;
    }
    // tcp on loopback, 64 KiB slices, and the keys of more.
    ote_engine_t *TcpEngine(const Kv &more = {}) {
        Kv kv{{"listen_address", "127.0.0.1:0"}, {"transports", "tcp"}, {"slice_size", "64K"}};
        kv.insert(kv.end(), more.begin(), more.end());
        return NewEngine(kv);
    }
    // The pair under test: src (src_) with [off, off + len) of the file at path registered
    // (a_, perms, name), req (req_) with a segment to it (seg_) and a batch of cap
    // requests (b_). TearDown ends them all and removes the file.
    void Connect(ote_engine_t *src, ote_engine_t *req, const std::string &path, uint64_t off,
                 uint64_t len, unsigned perms, const char *name = nullptr, uint32_t cap = 1) {
        src_ = src;
        req_ = req;
        path_ = path;
        ASSERT_NE(src_, nullptr);
        ASSERT_NE(req_, nullptr);
        ASSERT_EQ(ote_file_register(src_, path.c_str(), -1, off, len, perms, name, &a_), OTE_OK);
        char addr[272];
        ASSERT_EQ(ote_engine_address(src_, addr, sizeof(addr)), OTE_OK);
        ASSERT_EQ(ote_segment_open(req_, addr, &seg_), OTE_OK);
        ASSERT_EQ(ote_batch_create(req_, cap, &b_), OTE_OK);
    }
    // The requester side ends: its batch, its segment, its engine (its connections too).
    void CloseRequester() {
        if (b_ != nullptr) {
            EXPECT_EQ(ote_batch_destroy(b_), OTE_OK);
        }
        if (seg_ != nullptr) {
            EXPECT_EQ(ote_segment_close(seg_), OTE_OK);
        }
        if (req_ != nullptr) {
            EXPECT_EQ(ote_engine_destroy(req_), OTE_OK);
        }
        b_ = nullptr, seg_ = nullptr, req_ = nullptr;
    }
    // ote_file_unregister of a_, waiting up to 10 s while reads that the source still has
    // in flight (held by file.stall until their deadline) keep it BUSY.
    ote_status_t UnregisterWaiting() {
        ote_status_t st = OTE_ERR_BUSY;
        for (int i = 0; i < 200 && st == OTE_ERR_BUSY; i++) {
            st = ote_file_unregister(src_, a_);
            if (st == OTE_ERR_BUSY) usleep(50 * 1000);
        }
        return st;
    }
    void TearDown() override {
        CloseRequester();
        if (src_ != nullptr) {
            if (a_ != 0) {
                EXPECT_EQ(UnregisterWaiting(), OTE_OK);
            }
            EXPECT_EQ(ote_engine_destroy(src_), OTE_OK);
        }
        if (!path_.empty()) unlink(path_.c_str());
        OteTest::TearDown();
    }
    void MakeFile(const std::string &p, uint64_t n) {
        std::vector<uint8_t> b(n);
        for (uint64_t i = 0; i < n; i++) b[i] = Pat(i);
        int fd = open(p.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
        ASSERT_GE(fd, 0);
        ASSERT_EQ(write(fd, b.data(), n), static_cast<ssize_t>(n));
        close(fd);
    }
    std::vector<uint8_t> ReadFile(const std::string &p, uint64_t n) {
        std::vector<uint8_t> b(n);
        int fd = open(p.c_str(), O_RDONLY | O_CLOEXEC);
        EXPECT_EQ(pread(fd, b.data(), n, 0), static_cast<ssize_t>(n));
        close(fd);
        return b;
    }
    // One request through b_, waited for; its status.
    ote_transfer_status_t Move(ote_opcode_t op, void *local, uint64_t remote, size_t len) {
        EXPECT_EQ(ote_batch_reset(b_), OTE_OK);
        ote_request_t r{op, local, seg_, remote, len};
        EXPECT_EQ(ote_batch_submit(b_, &r, 1), OTE_OK);
        (void)ote_batch_wait(b_, kWaitNs);
        ote_transfer_status_t s{};
        EXPECT_EQ(ote_batch_status(b_, 0, &s), OTE_OK);
        return s;
    }
    // READs of bufs[i].size() bytes at a_ + offs[i] into bufs through b_, waited for.
    void ReadMany(std::vector<std::vector<uint8_t>> &bufs, const std::vector<uint64_t> &offs) {
        std::vector<ote_request_t> rs;
        for (size_t i = 0; i < bufs.size(); i++)
            rs.push_back({OTE_READ, bufs[i].data(), seg_, a_ + offs[i], bufs[i].size()});
        ASSERT_EQ(ote_batch_reset(b_), OTE_OK);
        ASSERT_EQ(ote_batch_submit(b_, rs.data(), rs.size()), OTE_OK);
        (void)ote_batch_wait(b_, kWaitNs);
    }
    // Every request of the last ReadMany completed, and bufs[i] holds the file's pattern
    // bytes from offs[i].
    void ExpectReadsRight(const std::vector<std::vector<uint8_t>> &bufs,
                          const std::vector<uint64_t> &offs) {
        for (size_t i = 0; i < bufs.size(); i++) {
            ote_transfer_status_t s{};
            ASSERT_EQ(ote_batch_status(b_, i, &s), OTE_OK);
            ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << i << ": " << ote_status_str(s.error);
            for (size_t k = 0; k < bufs[i].size(); k++)
                ASSERT_EQ(bufs[i][k], Pat(offs[i] + k)) << i << " " << k;
        }
    }
    // 24 WRITEs at once through b_ into disjoint ranges of the registration a_ (the whole
    // file at path, n >= 8 MiB, pattern bytes): 64 KiB aligned, 200,001 bytes unaligned, or
    // 32 KiB at an odd offset, each of its own bytes. With fail_nth > 0 the file owner's
    // fail_nth-th operation fails (file.io, EIO): exactly one request fails with
    // OTE_ERR_REMOTE, its range holding old or new bytes (the fault replaces the answer of
    // a write that ran). Every other request completes and its range holds its bytes;
    // nothing outside the ranges changes.
    void WriteManyChecked(const std::string &path, uint64_t n, uint64_t fail_nth) {
        const size_t kCount = 24;
        std::vector<std::vector<uint8_t>> bufs;
        std::vector<uint64_t> offs;
        std::vector<ote_request_t> rs;
        for (size_t i = 0; i < kCount; i++) {
            uint64_t len = i % 3 == 0 ? 65536 : i % 3 == 1 ? 200001 : 32768;
            uint64_t off = i * (320u << 10) + (i % 3 == 2 ? 7 : 0);
            bufs.emplace_back(len);
            for (uint64_t k = 0; k < len; k++) bufs[i][k] = static_cast<uint8_t>(~Pat(off + k) ^ i);
            offs.push_back(off);
        }
        for (size_t i = 0; i < kCount; i++)
            rs.push_back({OTE_WRITE, bufs[i].data(), seg_, a_ + offs[i], bufs[i].size()});
        if (fail_nth > 0) {
            ASSERT_EQ(ote_fault_arm("file.io", OTE_FAULT_NTH, fail_nth, OTE_ERR_FAULT, EIO),
                      OTE_OK);
        }
        ASSERT_EQ(ote_batch_reset(b_), OTE_OK);
        ASSERT_EQ(ote_batch_submit(b_, rs.data(), rs.size()), OTE_OK);
        (void)ote_batch_wait(b_, kWaitNs);
        if (fail_nth > 0) {
            EXPECT_EQ(ote_fault_failures("file.io"), 1u);
            ote_fault_disarm("file.io");
        }
        std::vector<int> failed(kCount, 0);
        size_t nfailed = 0;
        for (size_t i = 0; i < kCount; i++) {
            ote_transfer_status_t s{};
            ASSERT_EQ(ote_batch_status(b_, i, &s), OTE_OK);
            if (fail_nth > 0 && s.state == OTE_TRANSFER_FAILED) {
                EXPECT_EQ(ote_status_code(s.error), OTE_ERR_REMOTE) << ote_status_str(s.error);
                failed[i] = 1;
                nfailed++;
                continue;
            }
            ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << i << ": " << ote_status_str(s.error);
        }
        EXPECT_EQ(nfailed, fail_nth > 0 ? 1u : 0u);
        std::vector<uint8_t> got = ReadFile(path, n);
        std::vector<int> owner(n, -1);
        for (size_t i = 0; i < kCount; i++)
            for (uint64_t k = 0; k < bufs[i].size(); k++) owner[offs[i] + k] = static_cast<int>(i);
        for (uint64_t x = 0; x < n; x++) {
            int i = owner[x];
            if (i < 0) {
                ASSERT_EQ(got[x], Pat(x)) << x;
            } else if (failed[i]) {
                ASSERT_TRUE(got[x] == Pat(x) || got[x] == bufs[i][x - offs[i]]) << x;
            } else {
                ASSERT_EQ(got[x], bufs[i][x - offs[i]]) << i << " @" << x;
            }
        }
    }
    ote_engine_t *src_ = nullptr, *req_ = nullptr;
    ote_segment_t *seg_ = nullptr;
    ote_batch_t *b_ = nullptr;
    uint64_t a_ = 0;
    std::string path_;
};

} // namespace ote_file_test

#endif

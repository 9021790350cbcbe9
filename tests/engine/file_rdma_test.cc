// tests/engine/file_rdma_test.cc - a peer's requests to file registrations over RDMA
// (verbs/sim): the source asks host->pin with OTE__PIN_FILE and serves each grant through
// one of the file owner's bounce buffers (engine/rdma/rdma_stage.c over host->file): a
// READ's file range read into it before the grant's window over it is bound, a WRITE's
// bounce written to the file (fdatasync with file_sync=data) once its receipt came, before
// the COMMIT that completes the requester's run. Bytes checked for 4 KiB, unaligned and
// multi-MiB requests (several staged grants) both ways, under file_sync none and data;
// a request outside the registration or without its permission refused whole
// (OTE_ERR_ACCESS, the file untouched); a file truncated under the registration fails
// READ and WRITE with OTE_ERR_REMOTE (OTE_ERR_IO at the source) and the next in-range
// request still completes; a canceled WRITE writes nothing outside its range, nor does a
// requester that passed its deadline or went away. The file reads are asynchronous
// (host->file.bounce_io_start): 48 READs in flight at once, an injected EIO (file.io)
// failing only its grant, a read held by file.stall while a second request completes on
// the same connection (its server thread not blocked) and then failing at its deadline,
// and the requester or the source engine gone with reads in flight. Every path
// gives back the source's bounces (its src_stages counter back to 0) and its pins (the
// file's unregister succeeds).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "tests/engine/engine_util.h"
#include "tests/util/test_base.h"
#include "tests/util/wait.h"

extern "C" {
#include "base/fault.h"
#include "engine/rdma/test_hook.h"
#include "ote/ote.h"
}

namespace {

using ote_test::kSec;

uint8_t Pat(uint64_t i) { return static_cast<uint8_t>(i * 7 + (i >> 11)); }

std::string TmpPath(const std::string &name) {
    const char *d = getenv("TEST_TMPDIR");
    return std::string(d != nullptr ? d : "/tmp") + "/" + name;
}

class FileRdmaTest : public ote_test::OteTest, public ::testing::WithParamInterface<const char *> {
  protected:
    void TearDown() override {
        if (seg_ != nullptr) {
            EXPECT_EQ(ote_segment_close(seg_), OTE_OK);
        }
        if (req_ != nullptr) {
            EXPECT_EQ(ote_engine_destroy(req_), OTE_OK);
        }
        if (src_ != nullptr && faddr_ != 0) {
            EXPECT_EQ(UnregisterFile(), OTE_OK);
        }
        if (src_ != nullptr) {
            EXPECT_EQ(ote_engine_destroy(src_), OTE_OK);
        }
        if (!path_.empty()) unlink(path_.c_str());
        OteTest::TearDown();
    }
    // device: rdma_device (nullptr: every device of the sim).
    static ote_engine_t *Engine(const char *file_sync, const char *timeout_ms = "20000",
                                const char *device = nullptr) {
        ote_config_t *cfg = ote_test::RdmaConfig(timeout_ms);
        EXPECT_EQ(ote_config_set(cfg, "file_sync", file_sync), OTE_OK);
        if (device != nullptr) {
            EXPECT_EQ(ote_config_set(cfg, "rdma_device", device), OTE_OK);
        }
        ote_engine_t *e = nullptr;
        EXPECT_EQ(ote_engine_create(cfg, &e), OTE_OK);
        ote_config_destroy(cfg);
        return e;
    }
    // A file of n pattern bytes, [off, +len) of it registered at the source with perms,
    // and the requester's segment on the source.
    // The requester's transfer_timeout_ms is req_timeout_ms.
    // The source's is src_timeout_ms (its grants' deadline, the file reads' with them).
    void Open(uint64_t n, uint64_t off, uint64_t len, unsigned perms,
              const char *file_sync = "none", const char *req_timeout_ms = "20000",
              const char *src_timeout_ms = "20000") {
        std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
        for (char &ch : name)
            if (ch == '/') ch = '_';
        path_ = TmpPath("file_rdma_" + name + ".bin");
        std::vector<uint8_t> b(n);
        for (uint64_t i = 0; i < n; i++) b[i] = Pat(i);
        int fd = open(path_.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
        ASSERT_GE(fd, 0);
        ASSERT_EQ(write(fd, b.data(), n), static_cast<ssize_t>(n));
        close(fd);
        n_ = n;
        src_ = Engine(file_sync, src_timeout_ms, device_);
        req_ = Engine("none", req_timeout_ms, device_);
        ASSERT_NE(src_, nullptr);
        ASSERT_NE(req_, nullptr);
        ASSERT_EQ(ote_file_register(src_, path_.c_str(), -1, off, len, perms, "kv", &faddr_),
                  OTE_OK);
        ASSERT_EQ(ote_segment_open(req_, ote_test::EngineAddress(src_).c_str(), &seg_), OTE_OK);
        ote_segment_info_t info{};
        ASSERT_EQ(ote_segment_info(seg_, &info), OTE_OK);
        ASSERT_STREQ(info.transport, "rdma");
    }
    ote_transfer_status_t Run(ote_opcode_t op, void *local, uint64_t remote, size_t len) {
        ote_request_t r{op, local, seg_, remote, len};
        ote_transfer_status_t ts{};
        (void)ote_test::RunOne(req_, r, 120 * kSec, &ts);
        return ts;
    }
    std::vector<uint8_t> ReadFile() {
        std::vector<uint8_t> b(n_);
        int fd = open(path_.c_str(), O_RDONLY | O_CLOEXEC);
        EXPECT_GE(fd, 0);
        EXPECT_EQ(pread(fd, b.data(), n_, 0), static_cast<ssize_t>(n_));
        close(fd);
        return b;
    }
    // READs of [faddr_ + offs[i], +bufs[i].size()) into bufs[i], all in flight in b
    // (whose capacity holds them), waited for.
    void ReadMany(ote_batch_t *b, std::vector<std::vector<uint8_t>> &bufs,
                  const std::vector<uint64_t> &offs) {
        std::vector<ote_request_t> rs;
        for (size_t i = 0; i < bufs.size(); i++)
            rs.push_back({OTE_READ, bufs[i].data(), seg_, faddr_ + offs[i], bufs[i].size()});
        ASSERT_EQ(ote_batch_submit(b, rs.data(), rs.size()), OTE_OK);
        (void)ote_batch_wait(b, 120 * kSec);
    }
    ote__rdma_test_grants_t Grants(ote_engine_t *e) {
        ote__rdma_test_grants_t g{};
        EXPECT_EQ(ote__rdma_test_grants(ote_test::EngineAddress(e).c_str(), &g), OTE_OK);
        return g;
    }
    // Every bounce of the source given back (the last grant's end may still be on its
    // way after the requester's completion).
    void ExpectBouncesBack() {
        EXPECT_TRUE(ote_test::WaitUntil(
            [&] {
                ote__rdma_test_grants_t g = Grants(src_);
                return g.src_stages == 0 && g.src_copies == 0;
            },
            std::chrono::seconds(30), "the source's bounces to be given back"));
    }
    // ote_file_unregister, asked again while a grant's pin is on its way out (BUSY).
    ote_status_t UnregisterFile() {
        ote_status_t st = OTE_ERR_BUSY;
        ote_test::WaitUntil(
            [&] {
                st = ote_file_unregister(src_, faddr_);
                return ote_status_code(st) != OTE_ERR_BUSY;
            },
            std::chrono::seconds(30), "ote_file_unregister to answer other than BUSY");
        faddr_ = 0;
        return st;
    }

    ote_engine_t *src_ = nullptr, *req_ = nullptr;
    ote_segment_t *seg_ = nullptr;
    uint64_t faddr_ = 0, n_ = 0;
    std::string path_;
    const char *device_ = nullptr; // Open's engines: rdma_device (nullptr: all)
};

// READ and WRITE of 4 KiB (aligned: O_DIRECT where the file system takes it), an odd
// unaligned size, and 5 MiB + 123 (several staged grants and chunks), under GetParam()'s
// file_sync; every byte of the file checked after the WRITEs, and read back through the
// source.
TEST_P(FileRdmaTest, ReadsAndWritesBytesChecked) {
    const uint64_t n = 12u << 20, off = 4096;
    ASSERT_NO_FATAL_FAILURE(Open(n, off, n - off, OTE_PERM_READ | OTE_PERM_WRITE, GetParam()));
    struct Case {
        uint64_t at; // offset in the registration
        size_t len;
    };
    const Case cases[] = {{61440, 4096}, {77, 300001}, {1u << 20, (5u << 20) + 123}};
    for (const Case &c : cases) {
        std::vector<uint8_t> buf(c.len, 0);
        ote_transfer_status_t s = Run(OTE_READ, buf.data(), faddr_ + c.at, c.len);
        ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << c.len << ": " << ote_status_str(s.error);
        for (size_t i = 0; i < c.len; i++)
            ASSERT_EQ(buf[i], Pat(off + c.at + i)) << c.len << " @" << i;
    }
    // WRITEs into disjoint ranges: their own bytes, the rest of the file unchanged.
    const Case writes[] = {{8u << 20, 4096}, {9u << 20, 300001}, {2u << 20, (5u << 20) + 123}};
    for (const Case &c : writes) {
        std::vector<uint8_t> buf(c.len);
        for (size_t i = 0; i < c.len; i++) buf[i] = static_cast<uint8_t>(~Pat(i) ^ c.len);
        ote_transfer_status_t s = Run(OTE_WRITE, buf.data(), faddr_ + c.at, c.len);
        ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << c.len << ": " << ote_status_str(s.error);
    }
    std::vector<uint8_t> got = ReadFile();
    for (uint64_t i = 0; i < n; i++) {
        uint8_t want = Pat(i);
        for (const Case &c : writes)
            if (i >= off + c.at && i < off + c.at + c.len)
                want = static_cast<uint8_t>(~Pat(i - off - c.at) ^ c.len);
        ASSERT_EQ(got[i], want) << i;
    }
    // Read back through the source.
    const Case &big = writes[2];
    std::vector<uint8_t> back(big.len, 0);
    ote_transfer_status_t s = Run(OTE_READ, back.data(), faddr_ + big.at, big.len);
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    for (size_t i = 0; i < big.len; i++)
        ASSERT_EQ(back[i], static_cast<uint8_t>(~Pat(i) ^ big.len)) << i;
    ExpectBouncesBack();
    EXPECT_GT(Grants(src_).receipts, 0u);
}

INSTANTIATE_TEST_SUITE_P(FileSync, FileRdmaTest, ::testing::Values("none", "data"));

// The file owner keeps its first bounces of each size class (file_bounce.c) and the
// source keeps an MR over each per device (rdma_stage_mrs.c): after a first round of
// READs and WRITEs (1 MiB aligned and 12,345 bytes at an odd offset, every byte checked),
// two more rounds register no MR at all, kept or temporary. One device (sim0), so that
// the selector's choice of device cannot bring a first use in a later round.
TEST_F(FileRdmaTest, KeptBouncesKeepTheirMrs) {
    const uint64_t n = 8u << 20;
    device_ = "sim0";
    ASSERT_NO_FATAL_FAILURE(Open(n, 0, n, OTE_PERM_READ | OTE_PERM_WRITE));
    struct Case {
        uint64_t at;
        size_t len;
    };
    const Case cases[] = {{1u << 20, 1u << 20}, {3 * (1u << 20) + 7, 12345}};
    uint64_t made1 = 0, tmp1 = 0;
    for (int round = 0; round < 3; round++) {
        for (const Case &c : cases) {
            SCOPED_TRACE("round " + std::to_string(round) + ", " + std::to_string(c.len));
            std::vector<uint8_t> buf(c.len);
            for (size_t i = 0; i < c.len; i++) buf[i] = static_cast<uint8_t>(Pat(i) ^ (round + 1));
            ote_transfer_status_t s = Run(OTE_WRITE, buf.data(), faddr_ + c.at, c.len);
            ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
            std::vector<uint8_t> back(c.len, 0);
            s = Run(OTE_READ, back.data(), faddr_ + c.at, c.len);
            ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
            ASSERT_EQ(back, buf);
        }
        ExpectBouncesBack();
        if (round == 0) {
            made1 = Grants(src_).src_stage_mrs;
            tmp1 = Grants(src_).src_stage_tmp_mrs;
        }
    }
    ote__rdma_test_grants_t g = Grants(src_);
    printf("kept-bounce MRs registered: %llu (after the first round %llu); temporary MRs %llu\n",
           static_cast<unsigned long long>(g.src_stage_mrs), static_cast<unsigned long long>(made1),
           static_cast<unsigned long long>(g.src_stage_tmp_mrs));
    EXPECT_GE(made1, 2u) << "a kept bounce of each size class";
    EXPECT_EQ(g.src_stage_mrs, made1) << "no MR registered after the first round";
    EXPECT_EQ(tmp1, 0u);
    EXPECT_EQ(g.src_stage_tmp_mrs, 0u);
    std::vector<uint8_t> got = ReadFile();
    for (uint64_t i = 0; i < n; i++) {
        uint8_t want = Pat(i);
        for (const Case &c : cases)
            if (i >= c.at && i < c.at + c.len) want = static_cast<uint8_t>(Pat(i - c.at) ^ 3);
        ASSERT_EQ(got[i], want) << i;
    }
}

// Outside the registration, straddling its end, or without the permission: refused whole
// with OTE_ERR_ACCESS, no byte of the file written.
TEST_F(FileRdmaTest, OutsideOrWithoutPermissionRefusedWhole) {
    const uint64_t n = 1u << 20;
    ASSERT_NO_FATAL_FAILURE(Open(n, 0, n / 2, OTE_PERM_READ));
    std::vector<uint8_t> buf(8192, 0x5a);
    ote_transfer_status_t s = Run(OTE_WRITE, buf.data(), faddr_, 100);
    EXPECT_EQ(s.state, OTE_TRANSFER_FAILED);
    EXPECT_EQ(ote_status_code(s.error), OTE_ERR_ACCESS) << ote_status_str(s.error);
    s = Run(OTE_READ, buf.data(), faddr_ + n / 2 - 4096, 8192); // straddles the end
    EXPECT_EQ(s.state, OTE_TRANSFER_FAILED);
    EXPECT_EQ(ote_status_code(s.error), OTE_ERR_ACCESS) << ote_status_str(s.error);
    s = Run(OTE_READ, buf.data(), faddr_ + n / 2, 100); // past it
    EXPECT_EQ(ote_status_code(s.error), OTE_ERR_ACCESS) << ote_status_str(s.error);
    std::vector<uint8_t> got = ReadFile();
    for (uint64_t i = 0; i < n; i++) ASSERT_EQ(got[i], Pat(i)) << i;
    // Within it, READ is allowed.
    s = Run(OTE_READ, buf.data(), faddr_ + n / 2 - 8192, 8192);
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    for (size_t i = 0; i < 8192; i++) ASSERT_EQ(buf[i], Pat(n / 2 - 8192 + i)) << i;
    ExpectBouncesBack();
}

// The file truncated under the registration: a READ (aligned or not) past the new end
// fails, the requester sees OTE_ERR_REMOTE (OTE_ERR_IO with a WARN at the source); so does
// a WRITE there (its bounce starts as a copy of the range, which the file no longer
// holds), writing nothing. A request within what is left still completes, and every
// bounce and pin is given back.
TEST_F(FileRdmaTest, TruncatedFileFailsRemoteAndReleasesEverything) {
    const uint64_t n = 4u << 20;
    ASSERT_NO_FATAL_FAILURE(Open(n, 0, n, OTE_PERM_READ | OTE_PERM_WRITE));
    ASSERT_EQ(truncate(path_.c_str(), 65536 + 4096 + 100), 0);
    std::vector<uint8_t> buf(1u << 20, 0);
    ote_transfer_status_t s = Run(OTE_READ, buf.data(), faddr_ + 65536, 65536);
    EXPECT_EQ(s.state, OTE_TRANSFER_FAILED);
    EXPECT_EQ(ote_status_code(s.error), OTE_ERR_REMOTE) << ote_status_str(s.error);
    s = Run(OTE_READ, buf.data(), faddr_ + 1000, buf.size());
    EXPECT_EQ(s.state, OTE_TRANSFER_FAILED);
    EXPECT_EQ(ote_status_code(s.error), OTE_ERR_REMOTE) << ote_status_str(s.error);
    s = Run(OTE_WRITE, buf.data(), faddr_ + (2u << 20), 4096);
    EXPECT_EQ(s.state, OTE_TRANSFER_FAILED);
    EXPECT_EQ(ote_status_code(s.error), OTE_ERR_REMOTE) << ote_status_str(s.error);
    EXPECT_TRUE(LogContains("truncated file")); // the file owner's WARN
    struct stat stt {};
    ASSERT_EQ(stat(path_.c_str(), &stt), 0);
    EXPECT_EQ(static_cast<uint64_t>(stt.st_size), 65536u + 4096u + 100u);
    s = Run(OTE_READ, buf.data(), faddr_ + 300, 65536);
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    for (size_t i = 0; i < 65536; i++) ASSERT_EQ(buf[i], Pat(300 + i)) << i;
    ExpectBouncesBack();
}

// A WRITE canceled once the source holds a bounce of it (a grant being served) ends
// CANCELED (or COMPLETED, when it was quicker than the cancel): every byte of the file
// outside its range is unchanged, every byte inside is either the old or the new one (a
// canceled grant's bounce starts as the file's bytes), and the source gives back every
// bounce and pin.
TEST_F(FileRdmaTest, CanceledWriteTouchesNothingOutsideItsRange) {
    const uint64_t n = 24u << 20, at = 1u << 20, len = 16u << 20;
    ASSERT_NO_FATAL_FAILURE(Open(n, 0, n, OTE_PERM_READ | OTE_PERM_WRITE));
    std::vector<uint8_t> buf(len);
    for (size_t i = 0; i < len; i++) buf[i] = static_cast<uint8_t>(~Pat(at + i));
    ote_batch_t *b = nullptr;
    ASSERT_EQ(ote_batch_create(req_, 1, &b), OTE_OK);
    ote_request_t r{OTE_WRITE, buf.data(), seg_, faddr_ + at, len};
    ASSERT_EQ(ote_batch_submit(b, &r, 1), OTE_OK);
    ote_test::WaitUntil(
        [&] { return Grants(src_).src_stages > 0 || ote_batch_wait(b, 0) == OTE_OK; },
        std::chrono::seconds(30), "a bounce of the WRITE at the source");
    ASSERT_EQ(ote_batch_cancel(b), OTE_OK);
    (void)ote_batch_wait(b, 120 * kSec);
    ote_transfer_status_t s{};
    ASSERT_EQ(ote_batch_status(b, 0, &s), OTE_OK);
    EXPECT_TRUE(s.state == OTE_TRANSFER_CANCELED || s.state == OTE_TRANSFER_COMPLETED)
        << s.state << " " << ote_status_str(s.error);
    std::printf("canceled WRITE of %llu bytes ended %s\n", static_cast<unsigned long long>(len),
                s.state == OTE_TRANSFER_CANCELED ? "CANCELED" : "COMPLETED");
    EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    std::vector<uint8_t> got = ReadFile();
    uint64_t written = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (i < at || i >= at + len) {
            ASSERT_EQ(got[i], Pat(i)) << i;
        } else {
            ASSERT_TRUE(got[i] == Pat(i) || got[i] == static_cast<uint8_t>(~Pat(i))) << i;
            written += got[i] != Pat(i);
        }
    }
    std::printf("... %llu bytes of its range written\n", static_cast<unsigned long long>(written));
    if (s.state == OTE_TRANSFER_COMPLETED) {
        for (uint64_t i = at; i < at + len; i++) ASSERT_EQ(got[i], static_cast<uint8_t>(~Pat(i)));
    }
    // The connection still serves.
    std::vector<uint8_t> small(4096);
    s = Run(OTE_READ, small.data(), faddr_, small.size());
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    for (size_t i = 0; i < small.size(); i++) ASSERT_EQ(small[i], Pat(i)) << i;
    ExpectBouncesBack();
}

// A requester whose transfer_timeout_ms (1 ms) passes while its grants run: READ and WRITE
// of 32 MiB end TIMEOUT (or COMPLETED, when quicker), a WRITE touches nothing outside its
// range, and the source gives back every bounce and pin (the file's unregister succeeds).
TEST_F(FileRdmaTest, DeadlinePassedReleasesEverything) {
    const uint64_t n = 40u << 20, at = 4096, len = 32u << 20;
    ASSERT_NO_FATAL_FAILURE(Open(n, 0, n, OTE_PERM_READ | OTE_PERM_WRITE, "none", "1"));
    std::vector<uint8_t> buf(len, 0);
    ote_transfer_status_t s = Run(OTE_READ, buf.data(), faddr_ + at, len);
    EXPECT_TRUE(s.state == OTE_TRANSFER_TIMEOUT || s.state == OTE_TRANSFER_COMPLETED)
        << s.state << " " << ote_status_str(s.error);
    std::printf("READ of %llu bytes with a 1 ms deadline ended %s\n",
                static_cast<unsigned long long>(len),
                s.state == OTE_TRANSFER_TIMEOUT ? "TIMEOUT" : "COMPLETED");
    for (size_t i = 0; i < len; i++) buf[i] = static_cast<uint8_t>(~Pat(at + i));
    s = Run(OTE_WRITE, buf.data(), faddr_ + at, len);
    EXPECT_TRUE(s.state == OTE_TRANSFER_TIMEOUT || s.state == OTE_TRANSFER_COMPLETED)
        << s.state << " " << ote_status_str(s.error);
    ExpectBouncesBack();
    std::vector<uint8_t> got = ReadFile();
    for (uint64_t i = 0; i < n; i++) {
        if (i < at || i >= at + len) {
            ASSERT_EQ(got[i], Pat(i)) << i;
        } else {
            ASSERT_TRUE(got[i] == Pat(i) || got[i] == static_cast<uint8_t>(~Pat(i))) << i;
        }
    }
}

// The requester cancels a 32 MiB READ and WRITE while the source serves them, and goes
// away at once (batch, segment, engine destroyed; its control connection closes, possibly
// with grants of the source still bound): the source gives back every bounce and pin
// (the file's unregister succeeds), and writes nothing outside the WRITE's range.
TEST_F(FileRdmaTest, RequesterGoneAfterCancelReleasesEverything) {
    const uint64_t n = 72u << 20, len = 32u << 20;
    ASSERT_NO_FATAL_FAILURE(Open(n, 0, n, OTE_PERM_READ | OTE_PERM_WRITE));
    std::vector<uint8_t> rbuf(len), wbuf(len, 0xa5);
    ote_batch_t *b = nullptr;
    ASSERT_EQ(ote_batch_create(req_, 2, &b), OTE_OK);
    ote_request_t r[2] = {{OTE_READ, rbuf.data(), seg_, faddr_, len},
                          {OTE_WRITE, wbuf.data(), seg_, faddr_ + (36u << 20), len}};
    ASSERT_EQ(ote_batch_submit(b, r, 2), OTE_OK);
    ote_test::WaitUntil(
        [&] { return Grants(src_).src_stages > 0 || ote_batch_wait(b, 0) == OTE_OK; },
        std::chrono::seconds(30), "a bounce of the requests at the source");
    // Gone without waiting: the segment, the batch and the engine.
    ASSERT_EQ(ote_batch_cancel(b), OTE_OK);
    (void)ote_batch_wait(b, 60 * kSec);
    EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    EXPECT_EQ(ote_segment_close(seg_), OTE_OK);
    seg_ = nullptr;
    EXPECT_EQ(ote_engine_destroy(req_), OTE_OK);
    req_ = nullptr;
    ExpectBouncesBack();
    std::vector<uint8_t> got = ReadFile();
    for (uint64_t i = 0; i < n; i++) {
        if (i < (36u << 20) || i >= (36u << 20) + len) {
            ASSERT_EQ(got[i], Pat(i)) << i;
        } else {
            ASSERT_TRUE(got[i] == Pat(i) || got[i] == 0xa5) << i;
        }
    }
    EXPECT_EQ(UnregisterFile(), OTE_OK);
}

// 48 READs in flight at once in one batch (4 KiB aligned, unaligned odd sizes, 1 MiB + 5
// and 3 MiB: several staged grants each), their file reads running on the file owner
// beside each other (bounce_io_start) while the server thread serves the next grants:
// every byte right, every bounce and pin given back.
TEST_F(FileRdmaTest, ManyConcurrentReadsBytesChecked) {
    const uint64_t n = 64u << 20;
    ASSERT_NO_FATAL_FAILURE(Open(n, 0, n, OTE_PERM_READ));
    const size_t sizes[] = {4096, 65536 + 13, (1u << 20) + 5, 3u << 20, 777, 262144};
    std::vector<std::vector<uint8_t>> bufs;
    std::vector<uint64_t> offs;
    for (uint64_t i = 0; i < 48; i++) {
        size_t len = sizes[i % 6];
        bufs.emplace_back(len, 0xee);
        offs.push_back(i * (1u << 20) + (i % 3 == 0 ? 0 : 4096 * i + i)); // < 60 MiB + 3 MiB
    }
    ote_batch_t *b = nullptr;
    ASSERT_EQ(ote_batch_create(req_, bufs.size(), &b), OTE_OK);
    ASSERT_NO_FATAL_FAILURE(ReadMany(b, bufs, offs));
    for (size_t i = 0; i < bufs.size(); i++) {
        ote_transfer_status_t s{};
        ASSERT_EQ(ote_batch_status(b, i, &s), OTE_OK);
        ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << i << ": " << ote_status_str(s.error);
        for (size_t k = 0; k < bufs[i].size(); k++)
            ASSERT_EQ(bufs[i][k], Pat(offs[i] + k)) << i << " @" << k;
    }
    EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    ExpectBouncesBack();
}

// The file.io fault point fails the 5th read the source's file owner completes (EIO):
// only that grant fails (its request FAILED with OTE_ERR_REMOTE, OTE_ERR_IO with a WARN at
// the source, as a synchronous read's failure did); the 15 other READs in flight beside it
// complete with the right bytes, and the connection goes on serving.
TEST_F(FileRdmaTest, ReadErrorFailsOnlyItsGrant) {
    const uint64_t n = 8u << 20;
    ASSERT_NO_FATAL_FAILURE(Open(n, 0, n, OTE_PERM_READ));
    std::vector<std::vector<uint8_t>> bufs;
    std::vector<uint64_t> offs;
    for (uint64_t i = 0; i < 16; i++) { // one 64 KiB grant each
        bufs.emplace_back(65536, 0xee);
        offs.push_back(i * 65536 * 3 + (i % 2) * 100);
    }
    ote_batch_t *b = nullptr;
    ASSERT_EQ(ote_batch_create(req_, bufs.size(), &b), OTE_OK);
    ASSERT_EQ(ote_fault_arm("file.io", OTE_FAULT_NTH, 5, OTE_ERR_FAULT, EIO), OTE_OK);
    ReadMany(b, bufs, offs);
    EXPECT_GE(ote_fault_hits("file.io"), 16u);
    ote_fault_disarm("file.io");
    size_t failed = 0;
    for (size_t i = 0; i < bufs.size(); i++) {
        ote_transfer_status_t s{};
        ASSERT_EQ(ote_batch_status(b, i, &s), OTE_OK);
        if (s.state == OTE_TRANSFER_FAILED) {
            EXPECT_EQ(ote_status_code(s.error), OTE_ERR_REMOTE) << ote_status_str(s.error);
            failed++;
            continue;
        }
        ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << i << ": " << ote_status_str(s.error);
        for (size_t k = 0; k < bufs[i].size(); k++) ASSERT_EQ(bufs[i][k], Pat(offs[i] + k)) << i;
    }
    EXPECT_EQ(failed, 1u);
    EXPECT_TRUE(LogContains("Input/output error")); // the file owner's WARN
    EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    std::vector<uint8_t> again((1u << 20) + 3);
    ote_transfer_status_t s = Run(OTE_READ, again.data(), faddr_ + 4096, again.size());
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    for (size_t k = 0; k < again.size(); k++) ASSERT_EQ(again[k], Pat(4096 + k)) << k;
    ExpectBouncesBack();
}

// The first grant's file read is held in flight (file.stall) until its deadline (the
// source's transfer_timeout_ms of 10 s, plus 1 s): meanwhile a second READ on the same
// connection is served (its GRANT_REQ taken by the server thread the stalled read does not
// block) and completes with the right bytes while the first is still running. The first
// then fails at its deadline (OTE_ERR_REMOTE: the read's TIMEOUT at the source), and every
// bounce and pin comes back.
TEST_F(FileRdmaTest, StalledReadDoesNotBlockTheNextGrant) {
    const uint64_t n = 4u << 20;
    ASSERT_NO_FATAL_FAILURE(Open(n, 0, n, OTE_PERM_READ, "none", "60000", "10000"));
    ote_batch_t *a = nullptr;
    ASSERT_EQ(ote_batch_create(req_, 1, &a), OTE_OK);
    std::vector<uint8_t> abuf(65536, 0xee);
    ote_request_t ra{OTE_READ, abuf.data(), seg_, faddr_ + 8192, abuf.size()};
    ASSERT_EQ(ote_fault_arm("file.stall", OTE_FAULT_NTH, 1, OTE_ERR_FAULT, 0), OTE_OK);
    ASSERT_EQ(ote_batch_submit(a, &ra, 1), OTE_OK);
    ASSERT_TRUE(ote_test::WaitUntil([&] { return ote_fault_failures("file.stall") >= 1; },
                                    std::chrono::seconds(30), "the first read to stall"));
    std::vector<uint8_t> bbuf((1u << 20) + 77, 0);
    ote_transfer_status_t s = Run(OTE_READ, bbuf.data(), faddr_ + (2u << 20), bbuf.size());
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    for (size_t k = 0; k < bbuf.size(); k++) ASSERT_EQ(bbuf[k], Pat((2u << 20) + k)) << k;
    // The stalled one ends only at its 11 s deadline: still running here.
    ote_transfer_status_t sa{};
    ASSERT_EQ(ote_batch_status(a, 0, &sa), OTE_OK);
    EXPECT_NE(sa.state, OTE_TRANSFER_COMPLETED);
    EXPECT_NE(sa.state, OTE_TRANSFER_FAILED);
    (void)ote_batch_wait(a, 120 * kSec);
    ote_fault_disarm("file.stall");
    ASSERT_EQ(ote_batch_status(a, 0, &sa), OTE_OK);
    EXPECT_EQ(sa.state, OTE_TRANSFER_FAILED);
    EXPECT_EQ(ote_status_code(sa.error), OTE_ERR_REMOTE) << ote_status_str(sa.error);
    for (uint8_t v : abuf) ASSERT_EQ(v, 0xee);
    EXPECT_EQ(ote_batch_destroy(a), OTE_OK);
    ExpectBouncesBack();
}

// A READ whose deadline (the requester's 1 s) passes while the source's read of its grant
// is held in flight (file.stall, until the source's 3 s deadline): the request ends
// TIMEOUT, the read's end at the source gives its bounce back, and the connection serves
// the next READ. (The source's account of a request outlives a staged copy that uses it,
// ote__acct_stage; ci21's ASan run caught a write-off freeing it under a running GPU copy.
// This case runs that path; it did not reproduce the race without the fix.)
TEST_F(FileRdmaTest, DeadlinePassesWhileItsReadRuns) {
    const uint64_t n = 4u << 20;
    ASSERT_NO_FATAL_FAILURE(Open(n, 0, n, OTE_PERM_READ, "none", "1000", "3000"));
    ote_batch_t *a = nullptr;
    ASSERT_EQ(ote_batch_create(req_, 1, &a), OTE_OK);
    std::vector<uint8_t> abuf(65536, 0xee);
    ote_request_t ra{OTE_READ, abuf.data(), seg_, faddr_ + 4096, abuf.size()};
    ASSERT_EQ(ote_fault_arm("file.stall", OTE_FAULT_NTH, 1, OTE_ERR_FAULT, 0), OTE_OK);
    ASSERT_EQ(ote_batch_submit(a, &ra, 1), OTE_OK);
    (void)ote_batch_wait(a, 60 * kSec);
    EXPECT_GE(ote_fault_failures("file.stall"), 1u);
    ote_transfer_status_t sa{};
    ASSERT_EQ(ote_batch_status(a, 0, &sa), OTE_OK);
    EXPECT_EQ(sa.state, OTE_TRANSFER_TIMEOUT) << ote_status_str(sa.error);
    EXPECT_EQ(ote_batch_destroy(a), OTE_OK);
    ExpectBouncesBack(); // the stalled read ends at the source's deadline
    ote_fault_disarm("file.stall");
    for (uint8_t v : abuf) ASSERT_EQ(v, 0xee);
    std::vector<uint8_t> bbuf(300001, 0);
    ote_transfer_status_t s = Run(OTE_READ, bbuf.data(), faddr_ + 12345, bbuf.size());
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    for (size_t k = 0; k < bbuf.size(); k++) ASSERT_EQ(bbuf[k], Pat(12345 + k)) << k;
}

// The requester goes away (cancel, then its batch, segment and engine destroyed) while the
// source's reads of its grants are held in flight (file.stall): when they end (their 2 s
// deadline) the grants are refused to the lost connection and every bounce and pin comes
// back exactly once (ASan: nothing leaked, nothing used after free); unregister works.
TEST_F(FileRdmaTest, RequesterGoneWithReadsInFlight) {
    const uint64_t n = 8u << 20;
    ASSERT_NO_FATAL_FAILURE(Open(n, 0, n, OTE_PERM_READ, "none", "30000", "1000"));
    std::vector<std::vector<uint8_t>> bufs(4, std::vector<uint8_t>(300000, 0xee));
    std::vector<ote_request_t> rs;
    for (size_t i = 0; i < bufs.size(); i++)
        rs.push_back({OTE_READ, bufs[i].data(), seg_, faddr_ + i * (1u << 20), bufs[i].size()});
    ote_batch_t *b = nullptr;
    ASSERT_EQ(ote_batch_create(req_, rs.size(), &b), OTE_OK);
    ASSERT_EQ(ote_fault_arm("file.stall", OTE_FAULT_EVERY, 0, OTE_ERR_FAULT, 0), OTE_OK);
    ASSERT_EQ(ote_batch_submit(b, rs.data(), rs.size()), OTE_OK);
    EXPECT_TRUE(ote_test::WaitUntil([&] { return ote_fault_failures("file.stall") >= 1; },
                                    std::chrono::seconds(30), "a read in flight at the source"));
    ASSERT_EQ(ote_batch_cancel(b), OTE_OK);
    (void)ote_batch_wait(b, 60 * kSec);
    EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    EXPECT_EQ(ote_segment_close(seg_), OTE_OK);
    seg_ = nullptr;
    EXPECT_EQ(ote_engine_destroy(req_), OTE_OK);
    req_ = nullptr;
    ExpectBouncesBack();
    ote_fault_disarm("file.stall");
    EXPECT_EQ(UnregisterFile(), OTE_OK);
}

// The source engine is destroyed while its grants' reads are held in flight (file.stall):
// its teardown waits for them (their 2 s deadline), which give back bounce, MR and pin
// before the file owner goes; the requester's READs end, none COMPLETED.
TEST_F(FileRdmaTest, SourceDestroyedWithReadsInFlight) {
    const uint64_t n = 4u << 20;
    ASSERT_NO_FATAL_FAILURE(Open(n, 0, n, OTE_PERM_READ, "none", "30000", "1000"));
    std::vector<uint8_t> x(512u << 10), y(300000);
    ote_request_t rs[2] = {{OTE_READ, x.data(), seg_, faddr_, x.size()},
                           {OTE_READ, y.data(), seg_, faddr_ + 700000, y.size()}};
    ote_batch_t *b = nullptr;
    ASSERT_EQ(ote_batch_create(req_, 2, &b), OTE_OK);
    ASSERT_EQ(ote_fault_arm("file.stall", OTE_FAULT_EVERY, 0, OTE_ERR_FAULT, 0), OTE_OK);
    ASSERT_EQ(ote_batch_submit(b, rs, 2), OTE_OK);
    EXPECT_TRUE(ote_test::WaitUntil([&] { return ote_fault_failures("file.stall") >= 1; },
                                    std::chrono::seconds(30), "a read in flight at the source"));
    faddr_ = 0; // the engine's destroy drops the registration
    EXPECT_EQ(ote_engine_destroy(src_), OTE_OK);
    src_ = nullptr;
    ote_fault_disarm("file.stall");
    (void)ote_batch_wait(b, 120 * kSec);
    for (size_t i = 0; i < 2; i++) {
        ote_transfer_status_t s{};
        ASSERT_EQ(ote_batch_status(b, i, &s), OTE_OK);
        EXPECT_NE(s.state, OTE_TRANSFER_COMPLETED) << i;
    }
    EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
}

// A WRITE's bounce goes to the file through the file owner's I/O engine
// (host->file.bounce_io_start, to_file 1), not on the thread that ends the grant. The
// file.io fault point fails the 2nd operation of one 64 KiB WRITE (the 1st is its bounce's
// initial read): the write back fails with EIO, the COMMIT carries the failure, the
// request ends FAILED with OTE_ERR_REMOTE, nothing outside its range is written; the
// same WRITE again lands, and every bounce and pin comes back.
TEST_F(FileRdmaTest, WriteBackErrorFailsItsWriteOnly) {
    const uint64_t n = 1u << 20, at = 65536, len = 65536;
    ASSERT_NO_FATAL_FAILURE(Open(n, 0, n, OTE_PERM_READ | OTE_PERM_WRITE));
    std::vector<uint8_t> buf(len);
    for (size_t i = 0; i < len; i++) buf[i] = static_cast<uint8_t>(~Pat(at + i));
    ASSERT_EQ(ote_fault_arm("file.io", OTE_FAULT_NTH, 2, OTE_ERR_FAULT, EIO), OTE_OK);
    ote_transfer_status_t s = Run(OTE_WRITE, buf.data(), faddr_ + at, len);
    EXPECT_EQ(ote_fault_failures("file.io"), 1u) << "the write back is not the I/O engine's";
    EXPECT_EQ(ote_fault_hits("file.io"), 2u);
    ote_fault_disarm("file.io");
    EXPECT_EQ(s.state, OTE_TRANSFER_FAILED);
    EXPECT_EQ(ote_status_code(s.error), OTE_ERR_REMOTE) << ote_status_str(s.error);
    EXPECT_TRUE(LogContains("Input/output error")); // the file owner's WARN
    // file.io replaces the kernel's answer: the write ran, so the range may hold either
    // byte (as after a real EIO); nothing outside it is written.
    std::vector<uint8_t> got = ReadFile();
    for (uint64_t i = 0; i < n; i++) {
        if (i >= at && i < at + len)
            ASSERT_TRUE(got[i] == Pat(i) || got[i] == static_cast<uint8_t>(~Pat(i))) << i;
        else ASSERT_EQ(got[i], Pat(i)) << i;
    }
    s = Run(OTE_WRITE, buf.data(), faddr_ + at, len);
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    got = ReadFile();
    for (uint64_t i = 0; i < n; i++)
        ASSERT_EQ(got[i], i >= at && i < at + len ? static_cast<uint8_t>(~Pat(i)) : Pat(i)) << i;
    ExpectBouncesBack();
}

// The write back of a first WRITE is held in flight (file.stall on the file owner's 2nd
// operation, until the source's 10 s deadline): meanwhile a READ on the same connection
// and device completes with the right bytes (the thread that ended the WRITE's grant went
// on), and the WRITE is still running. It then fails at the source's deadline
// (OTE_ERR_REMOTE: its write's TIMEOUT), its range of the file never written.
TEST_F(FileRdmaTest, StalledWriteBackDoesNotHoldTheNextRequest) {
    const uint64_t n = 4u << 20, at = 8192, len = 65536;
    ASSERT_NO_FATAL_FAILURE(
        Open(n, 0, n, OTE_PERM_READ | OTE_PERM_WRITE, "none", "60000", "10000"));
    std::vector<uint8_t> abuf(len);
    for (size_t i = 0; i < len; i++) abuf[i] = static_cast<uint8_t>(~Pat(at + i));
    ote_batch_t *a = nullptr;
    ASSERT_EQ(ote_batch_create(req_, 1, &a), OTE_OK);
    ote_request_t ra{OTE_WRITE, abuf.data(), seg_, faddr_ + at, len};
    ASSERT_EQ(ote_fault_arm("file.stall", OTE_FAULT_NTH, 2, OTE_ERR_FAULT, 0), OTE_OK);
    ASSERT_EQ(ote_batch_submit(a, &ra, 1), OTE_OK);
    ASSERT_TRUE(ote_test::WaitUntil([&] { return ote_fault_failures("file.stall") >= 1; },
                                    std::chrono::seconds(30), "the write back to stall"));
    std::vector<uint8_t> bbuf((1u << 20) + 77, 0);
    ote_transfer_status_t s = Run(OTE_READ, bbuf.data(), faddr_ + (2u << 20), bbuf.size());
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    for (size_t k = 0; k < bbuf.size(); k++) ASSERT_EQ(bbuf[k], Pat((2u << 20) + k)) << k;
    ote_transfer_status_t sa{};
    ASSERT_EQ(ote_batch_status(a, 0, &sa), OTE_OK);
    EXPECT_EQ(sa.state, OTE_TRANSFER_PENDING) << "the WRITE ended before its write back";
    (void)ote_batch_wait(a, 120 * kSec);
    ote_fault_disarm("file.stall");
    ASSERT_EQ(ote_batch_status(a, 0, &sa), OTE_OK);
    EXPECT_EQ(sa.state, OTE_TRANSFER_FAILED);
    EXPECT_EQ(ote_status_code(sa.error), OTE_ERR_REMOTE) << ote_status_str(sa.error);
    EXPECT_EQ(ote_batch_destroy(a), OTE_OK);
    ExpectBouncesBack();
    std::vector<uint8_t> got = ReadFile();
    for (uint64_t i = 0; i < n; i++) ASSERT_EQ(got[i], Pat(i)) << i;
}

// The source engine is destroyed while a WRITE's write back is held in flight (file.stall,
// until its 1 s deadline): the teardown waits for it (ASan: bounce, MR and pin given back
// once, before the file owner goes); the requester's WRITE does not complete.
TEST_F(FileRdmaTest, SourceDestroyedWithWriteBackInFlight) {
    const uint64_t n = 1u << 20;
    ASSERT_NO_FATAL_FAILURE(Open(n, 0, n, OTE_PERM_READ | OTE_PERM_WRITE, "none", "30000", "1000"));
    std::vector<uint8_t> x(300000, 0x3c);
    ote_batch_t *b = nullptr;
    ASSERT_EQ(ote_batch_create(req_, 1, &b), OTE_OK);
    ote_request_t r{OTE_WRITE, x.data(), seg_, faddr_ + 4096, x.size()};
    ASSERT_EQ(ote_fault_arm("file.stall", OTE_FAULT_NTH, 2, OTE_ERR_FAULT, 0), OTE_OK);
    ASSERT_EQ(ote_batch_submit(b, &r, 1), OTE_OK);
    ASSERT_TRUE(ote_test::WaitUntil([&] { return ote_fault_failures("file.stall") >= 1; },
                                    std::chrono::seconds(30), "the write back to stall"));
    faddr_ = 0; // the engine's destroy drops the registration
    EXPECT_EQ(ote_engine_destroy(src_), OTE_OK);
    src_ = nullptr;
    ote_fault_disarm("file.stall");
    (void)ote_batch_wait(b, 120 * kSec);
    ote_transfer_status_t s{};
    ASSERT_EQ(ote_batch_status(b, 0, &s), OTE_OK);
    EXPECT_NE(s.state, OTE_TRANSFER_COMPLETED);
    EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
}

} // namespace

// A peer's requests to file registrations (engine/file through host->file): over tcp and
// shm the source reads the file into a bounce buffer (READ: started ahead on the file
// owner's I/O engine, host->file.bounce_io_start) and sends or copies it, or writes the
// bytes it received (WRITE). Two engines of this process talk over loopback (tcp) or the
// same-host transport (shm).
#include <gtest/gtest.h>

#include <errno.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include "base/fault.h"
#include "engine/testing.h"
#include "ote/ote.h"
}

#include "tests/file/remote_fixture.h"
#include "tests/util/test_base.h"
#include "tests/util/wait.h"

namespace {

using namespace ote_file_test;

TEST_F(FileRemoteTest, TcpPeerReadsAndWritesAFile) {
    const uint64_t n = 1u << 20;
    std::string path = TmpPath("remote_tcp.bin");
    MakeFile(path, n);
    ASSERT_NO_FATAL_FAILURE(Connect(TcpEngine(), TcpEngine(), path, 4096, n - 4096,
                                    OTE_PERM_READ | OTE_PERM_WRITE, "kv"));

    std::vector<uint8_t> buf(300001);
    ote_transfer_status_t s = Move(OTE_READ, buf.data(), a_ + 77, buf.size());
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    for (size_t i = 0; i < buf.size(); i++) ASSERT_EQ(buf[i], Pat(4096 + 77 + i)) << i;

    for (size_t i = 0; i < buf.size(); i++) buf[i] = static_cast<uint8_t>(~Pat(i));
    s = Move(OTE_WRITE, buf.data(), a_ + 1000, buf.size());
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    std::vector<uint8_t> got = ReadFile(path, n);
    for (uint64_t i = 0; i < n; i++) {
        bool in = i >= 5096 && i < 5096 + buf.size();
        ASSERT_EQ(got[i], in ? static_cast<uint8_t>(~Pat(i - 5096)) : Pat(i)) << i;
    }
    // Outside the registration: refused whole, nothing written.
    s = Move(OTE_WRITE, buf.data(), a_ + (n - 4096) - 10, 11);
    EXPECT_EQ(s.state, OTE_TRANSFER_FAILED);
    EXPECT_EQ(ote_status_code(s.error), OTE_ERR_ACCESS);
    // The file truncated under the registration: the READ fails, the peer says why.
    ASSERT_EQ(truncate(path.c_str(), 8192), 0);
    s = Move(OTE_READ, buf.data(), a_, 100000);
    EXPECT_EQ(s.state, OTE_TRANSFER_FAILED);
    EXPECT_NE(ote_status_code(s.error), OTE_OK);
}

// Slices whose file range is 4 KiB-aligned go O_DIRECT at the source, through its pool of
// aligned bounce buffers (engine/file/file_bounce.c), the others buffered; the bytes are
// the same either way. Repeated requests reuse the pooled buffers; an aligned READ that
// meets the end of a truncated file (a short O_DIRECT read, then nothing) fails with
// OTE_ERR_REMOTE at the requester (OTE_ERR_IO at the source, its WARN).
TEST_F(FileRemoteTest, TcpPeerAlignedSlicesThroughPooledBounces) {
    const uint64_t n = 4u << 20;
    std::string path = TmpPath("remote_aligned.bin");
    MakeFile(path, n);
    ASSERT_NO_FATAL_FAILURE(
        Connect(TcpEngine(), TcpEngine(), path, 0, n, OTE_PERM_READ | OTE_PERM_WRITE));

    std::vector<uint8_t> buf(2u << 20);
    for (int round = 0; round < 5; round++) {
        std::fill(buf.begin(), buf.end(), 0);
        ote_transfer_status_t s = Move(OTE_READ, buf.data(), a_ + 65536, buf.size());
        ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
        for (size_t i = 0; i < buf.size(); i++) ASSERT_EQ(buf[i], Pat(65536 + i)) << i;
    }
    // 1 MiB + 100 bytes: sixteen aligned slices, then a 100-byte one.
    const size_t wl = (1u << 20) + 100;
    for (size_t i = 0; i < wl; i++) buf[i] = static_cast<uint8_t>(~Pat(i));
    ote_transfer_status_t s = Move(OTE_WRITE, buf.data(), a_ + (1u << 20), wl);
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    std::vector<uint8_t> got = ReadFile(path, n);
    for (uint64_t i = 0; i < n; i++) {
        bool in = i >= (1u << 20) && i < (1u << 20) + wl;
        ASSERT_EQ(got[i], in ? static_cast<uint8_t>(~Pat(i - (1u << 20))) : Pat(i)) << i;
    }
    // Read back through the source: what the WRITE left, O_DIRECT and buffered slices alike.
    std::vector<uint8_t> back(wl);
    s = Move(OTE_READ, back.data(), a_ + (1u << 20), wl);
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    for (size_t i = 0; i < wl; i++) ASSERT_EQ(back[i], static_cast<uint8_t>(~Pat(i))) << i;

    ASSERT_EQ(truncate(path.c_str(), 65536 + 4096 + 100), 0);
    s = Move(OTE_READ, buf.data(), a_ + 65536, 65536);
    EXPECT_EQ(s.state, OTE_TRANSFER_FAILED);
    EXPECT_EQ(ote_status_code(s.error), OTE_ERR_REMOTE) << ote_status_str(s.error);
}

// The tcp source reads a file registration's slices without waiting (engine/tcp/
// tcp_fread.c): up to TCP_SRC_FILE_READS reads per connection run on the file owner's
// I/O engine (each one: io_uring and the thread pool) while earlier responses go out, in
// order. Many READs at once, a read error that fails only its slice, a connection that
// dies with reads in flight, a cancel that withdraws them, and the source engine
// destroyed with reads in flight.
class FileTcpAsyncTest : public FileRemoteTest, public ::testing::WithParamInterface<const char *> {
  protected:
    // The file at path (n bytes) made and registered READ-only at src; the two engines'
    // transfer_timeout_ms; a batch of cap requests.
    void Open(const std::string &path, uint64_t n, const char *src_ms, const char *req_ms,
              uint32_t cap, unsigned perms = OTE_PERM_READ) {
        MakeFile(path, n);
        ASSERT_NO_FATAL_FAILURE(
            Connect(TcpEngine({{"file_engine", GetParam()}, {"transfer_timeout_ms", src_ms}}),
                    TcpEngine({{"file_engine", GetParam()}, {"transfer_timeout_ms", req_ms}}), path,
                    0, n, perms, nullptr, cap));
    }
};

// The tcp source writes a WRITE slice's bounce to the file without waiting (tcp_fread.c:
// its WRITE_ACK leaves once the write ended, in order): 24 WRITEs at once, every byte
// where it belongs; then the 5th write fails (EIO): only its request fails.
TEST_P(FileTcpAsyncTest, ManyWritesAndAWriteError) {
    const uint64_t n = 8u << 20;
    std::string path = TmpPath((std::string("async_writes_") + GetParam() + ".bin").c_str());
    ASSERT_NO_FATAL_FAILURE(Open(path, n, "30000", "30000", 24, OTE_PERM_READ | OTE_PERM_WRITE));
    ASSERT_NO_FATAL_FAILURE(WriteManyChecked(path, n, 0));
    MakeFile(path, n);
    ASSERT_NO_FATAL_FAILURE(WriteManyChecked(path, n, 5));
    EXPECT_TRUE(LogContains("Input/output error")); // the file owner's WARN
}

// A peer's WRITE slice holds the registration until its write has taken it over
// (tcp_fread.c): an unregister right before the write starts, the slice's pin then the
// only hold, waits its 100 ms and is BUSY, and the write lands. Before, the pin was
// dropped first: that unregister freed the registration and closed its fd under the
// write about to start.
TEST_P(FileTcpAsyncTest, UnregisterRightBeforeAWriteStartsIsBusy) {
    const uint64_t n = 1u << 20;
    std::string path = TmpPath((std::string("async_wunreg_") + GetParam() + ".bin").c_str());
    ASSERT_NO_FATAL_FAILURE(Open(path, n, "30000", "30000", 1, OTE_PERM_READ | OTE_PERM_WRITE));
    struct Ctx {
        ote_engine_t *e;
        uint64_t a;
        std::atomic<int> calls{0};
        ote_status_t st = OTE_OK;
    } ctx{src_, a_};
    ote__test_tcp_file_write_hook(
        +[](void *arg) {
            auto *c = static_cast<Ctx *>(arg);
            if (c->calls.fetch_add(1) == 0) c->st = ote_file_unregister(c->e, c->a);
        },
        &ctx);
    std::vector<uint8_t> buf(65536, 0x5a); // one slice (slice_size 64K)
    ote_transfer_status_t s = Move(OTE_WRITE, buf.data(), a_, buf.size());
    ote__test_tcp_file_write_hook(nullptr, nullptr);
    EXPECT_EQ(ctx.calls.load(), 1);
    EXPECT_EQ(ote_status_code(ctx.st), OTE_ERR_BUSY) << ote_status_str(ctx.st);
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    std::vector<uint8_t> got = ReadFile(path, n);
    for (uint64_t i = 0; i < n; i++) ASSERT_EQ(got[i], i < buf.size() ? 0x5a : Pat(i)) << i;
}

// 48 READs at once (64 KiB slices: hundreds of frames per connection, aligned and not,
// one byte to 1 MiB + 1), three rounds: every byte right.
TEST_P(FileTcpAsyncTest, ManyConcurrentReads) {
    const uint64_t n = 16u << 20;
    std::string path = TmpPath((std::string("async_many_") + GetParam() + ".bin").c_str());
    ASSERT_NO_FATAL_FAILURE(Open(path, n, "30000", "30000", 48));
    for (int round = 0; round < 3; round++) {
        std::vector<std::vector<uint8_t>> bufs;
        std::vector<uint64_t> offs;
        for (uint64_t i = 0; i < 48; i++) {
            uint64_t len = i % 4 == 0 ? (1u << 20) : i % 4 == 1 ? (1u << 20) + 1 : 1 + i * 4099;
            uint64_t off = (i * 331u * 4096 + (i % 2 ? 0 : 4096u * round + i)) % (n - len);
            bufs.emplace_back(len, 0xee);
            offs.push_back(off);
        }
        ReadMany(bufs, offs);
        ASSERT_NO_FATAL_FAILURE(ExpectReadsRight(bufs, offs));
    }
}

// The file.io fault point fails the 5th read the source's file owner completes (EIO):
// that slice's request fails (OTE_ERR_REMOTE), the other READs, in flight beside it on
// the same connection, complete with the right bytes; the connection goes on serving.
TEST_P(FileTcpAsyncTest, ReadErrorFailsOnlyItsSlice) {
    const uint64_t n = 4u << 20;
    std::string path = TmpPath((std::string("async_eio_") + GetParam() + ".bin").c_str());
    ASSERT_NO_FATAL_FAILURE(Open(path, n, "30000", "30000", 16));
    std::vector<std::vector<uint8_t>> bufs;
    std::vector<uint64_t> offs;
    for (uint64_t i = 0; i < 16; i++) { // one 64 KiB slice each
        bufs.emplace_back(65536, 0xee);
        offs.push_back(i * 65536 * 3);
    }
    ASSERT_EQ(ote_fault_arm("file.io", OTE_FAULT_NTH, 5, OTE_ERR_FAULT, EIO), OTE_OK);
    ReadMany(bufs, offs);
    EXPECT_GE(ote_fault_hits("file.io"), 16u);
    ote_fault_disarm("file.io");
    size_t failed = 0;
    for (size_t i = 0; i < bufs.size(); i++) {
        ote_transfer_status_t s{};
        ASSERT_EQ(ote_batch_status(b_, i, &s), OTE_OK);
        if (s.state == OTE_TRANSFER_FAILED) {
            EXPECT_EQ(ote_status_code(s.error), OTE_ERR_REMOTE) << ote_status_str(s.error);
            failed++;
            continue;
        }
        ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << i << ": " << ote_status_str(s.error);
        for (size_t k = 0; k < bufs[i].size(); k++) ASSERT_EQ(bufs[i][k], Pat(offs[i] + k)) << i;
    }
    EXPECT_EQ(failed, 1u);
    std::vector<uint8_t> again(1u << 20);
    ote_transfer_status_t s = Move(OTE_READ, again.data(), a_ + 4096, again.size());
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    for (size_t k = 0; k < again.size(); k++) ASSERT_EQ(again[k], Pat(4096 + k)) << k;
}

// The source's reads are held in flight (file.stall) past the requester's deadline
// (300 ms): the requester closes its connection, the source's connection dies with its
// reads running. The registration stays BUSY until they end at their own deadline (the
// source's 2 s), then the bounces come back and unregister works (ASan/LSan: nothing
// leaked, nothing used after free).
TEST_P(FileTcpAsyncTest, ConnectionDiesWithReadsInFlight) {
    const uint64_t n = 4u << 20;
    std::string path = TmpPath((std::string("async_die_") + GetParam() + ".bin").c_str());
    ASSERT_NO_FATAL_FAILURE(Open(path, n, "2000", "300", 4));
    std::vector<std::vector<uint8_t>> bufs(4, std::vector<uint8_t>(256u << 10, 0xee));
    std::vector<uint64_t> offs{0, 1u << 20, 2u << 20, (3u << 20) + 5};
    ASSERT_EQ(ote_fault_arm("file.stall", OTE_FAULT_EVERY, 0, OTE_ERR_FAULT, 0), OTE_OK);
    ReadMany(bufs, offs);
    EXPECT_GE(ote_fault_hits("file.stall"), 1u);
    ote_fault_disarm("file.stall");
    for (size_t i = 0; i < bufs.size(); i++) {
        ote_transfer_status_t s{};
        ASSERT_EQ(ote_batch_status(b_, i, &s), OTE_OK);
        EXPECT_NE(s.state, OTE_TRANSFER_COMPLETED) << i;
        for (uint8_t v : bufs[i]) ASSERT_EQ(v, 0xee);
    }
    CloseRequester();                       // its connections are surely gone now
    EXPECT_EQ(UnregisterWaiting(), OTE_OK); // the reads end by 2 s
    a_ = 0;
}

// As above with WRITEs: their bytes arrived, their writes to the file are held in flight
// (file.stall) past the requester's deadline; the connection dies with them running. The
// registration stays BUSY until they end (the source's 4 s), then every bounce comes back
// and unregister works; none of the WRITEs completed.
TEST_P(FileTcpAsyncTest, ConnectionDiesWithWritesInFlight) {
    const uint64_t n = 4u << 20;
    std::string path = TmpPath((std::string("async_wdie_") + GetParam() + ".bin").c_str());
    ASSERT_NO_FATAL_FAILURE(Open(path, n, "4000", "300", 4, OTE_PERM_READ | OTE_PERM_WRITE));
    std::vector<std::vector<uint8_t>> bufs(4, std::vector<uint8_t>(256u << 10, 0x3c));
    std::vector<ote_request_t> rs;
    for (size_t i = 0; i < bufs.size(); i++)
        rs.push_back({OTE_WRITE, bufs[i].data(), seg_, a_ + i * (1u << 20), bufs[i].size()});
    ASSERT_EQ(ote_fault_arm("file.stall", OTE_FAULT_EVERY, 0, OTE_ERR_FAULT, 0), OTE_OK);
    ASSERT_EQ(ote_batch_reset(b_), OTE_OK);
    ASSERT_EQ(ote_batch_submit(b_, rs.data(), rs.size()), OTE_OK);
    (void)ote_batch_wait(b_, kWaitNs);
    EXPECT_GE(ote_fault_hits("file.stall"), 1u);
    for (size_t i = 0; i < bufs.size(); i++) {
        ote_transfer_status_t s{};
        ASSERT_EQ(ote_batch_status(b_, i, &s), OTE_OK);
        EXPECT_NE(s.state, OTE_TRANSFER_COMPLETED) << i;
    }
    CloseRequester();
    EXPECT_EQ(ote_status_code(ote_file_unregister(src_, a_)), OTE_ERR_BUSY) << "no write running";
    ote_fault_disarm("file.stall");
    EXPECT_EQ(UnregisterWaiting(), OTE_OK); // the writes end by 4 s
    a_ = 0;
}

// The source engine is destroyed while its reads are in flight (file.stall): the tcp
// transport's teardown waits for them (their 1 s deadline) before the file owner goes.
TEST_P(FileTcpAsyncTest, SourceDestroyedWithReadsInFlight) {
    const uint64_t n = 2u << 20;
    std::string path = TmpPath((std::string("async_destroy_") + GetParam() + ".bin").c_str());
    ASSERT_NO_FATAL_FAILURE(Open(path, n, "1000", "30000", 2));
    ASSERT_EQ(ote_fault_arm("file.stall", OTE_FAULT_EVERY, 0, OTE_ERR_FAULT, 0), OTE_OK);
    std::vector<uint8_t> x(512u << 10), y(300000);
    ote_request_t rs[2] = {{OTE_READ, x.data(), seg_, a_, x.size()},
                           {OTE_READ, y.data(), seg_, a_ + 700000, y.size()}};
    ASSERT_EQ(ote_batch_submit(b_, rs, 2), OTE_OK);
    EXPECT_EQ(ote_batch_wait(b_, 100ull * 1000 * 1000), OTE_ERR_TIMEOUT);
    EXPECT_GE(ote_fault_hits("file.stall"), 1u);
    EXPECT_EQ(ote_engine_destroy(src_), OTE_OK);
    src_ = nullptr;
    ote_fault_disarm("file.stall");
    (void)ote_batch_wait(b_, kWaitNs);
    for (size_t i = 0; i < 2; i++) {
        ote_transfer_status_t s{};
        ASSERT_EQ(ote_batch_status(b_, i, &s), OTE_OK);
        EXPECT_NE(s.state, OTE_TRANSFER_COMPLETED) << i;
    }
}

// ote_batch_cancel while the source's reads are held in flight (file.stall): the CANCEL
// withdraws them at the source, which answers CANCELED once each read ended (its 1 s
// deadline) and gives its bounce back; the connection then serves on.
TEST_P(FileTcpAsyncTest, CancelWithReadsInFlight) {
    const uint64_t n = 2u << 20;
    std::string path = TmpPath((std::string("async_cancel_") + GetParam() + ".bin").c_str());
    ASSERT_NO_FATAL_FAILURE(Open(path, n, "1000", "30000", 1));
    ASSERT_EQ(ote_fault_arm("file.stall", OTE_FAULT_EVERY, 0, OTE_ERR_FAULT, 0), OTE_OK);
    std::vector<uint8_t> x(512u << 10, 0xee);
    ote_request_t r{OTE_READ, x.data(), seg_, a_ + 4096, x.size()};
    ASSERT_EQ(ote_batch_submit(b_, &r, 1), OTE_OK);
    EXPECT_EQ(ote_batch_wait(b_, 100ull * 1000 * 1000), OTE_ERR_TIMEOUT);
    EXPECT_GE(ote_fault_hits("file.stall"), 1u);
    ASSERT_EQ(ote_batch_cancel(b_), OTE_OK);
    (void)ote_batch_wait(b_, kWaitNs);
    ote_fault_disarm("file.stall");
    ote_transfer_status_t s{};
    ASSERT_EQ(ote_batch_status(b_, 0, &s), OTE_OK);
    EXPECT_EQ(s.state, OTE_TRANSFER_CANCELED) << ote_status_str(s.error);
    s = Move(OTE_READ, x.data(), a_ + 8192, x.size());
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    for (size_t k = 0; k < x.size(); k++) ASSERT_EQ(x[k], Pat(8192 + k)) << k;
    EXPECT_EQ(UnregisterWaiting(), OTE_OK);
    a_ = 0;
}

// The source's pooled bounce buffers are io_uring fixed buffers (a DEBUG line per buffer
// registered; the reads into them io_uring_prep_read_fixed): READs of a peer over tcp,
// aligned (O_DIRECT) and not, move the right bytes; the thread pool registers none.
TEST_P(FileTcpAsyncTest, BounceBuffersAreFixed) {
    const uint64_t n = 4u << 20;
    std::string path = TmpPath((std::string("async_fixed_") + GetParam() + ".bin").c_str());
    MakeFile(path, n);
    ASSERT_NO_FATAL_FAILURE(
        Connect(TcpEngine({{"file_engine", GetParam()}, {"log_level", "debug"}}),
                TcpEngine({{"file_engine", GetParam()}}), path, 0, n, OTE_PERM_READ, nullptr, 8));
    for (int round = 0; round < 2; round++) {
        std::vector<std::vector<uint8_t>> bufs;
        std::vector<uint64_t> offs;
        for (uint64_t i = 0; i < 8; i++) {
            uint64_t len = i % 2 == 0 ? (256u << 10) : 100000 + i;
            bufs.emplace_back(len, 0xee);
            offs.push_back(i * (400u << 10) + (i % 2 == 0 ? 0 : 3 + round));
        }
        ReadMany(bufs, offs);
        ASSERT_NO_FATAL_FAILURE(ExpectReadsRight(bufs, offs));
    }
    bool fixed = LogContains("is io_uring fixed buffer");
    if (std::string(GetParam()) == "threads") {
        EXPECT_FALSE(fixed);
    } else if (!LogContains("io_uring fixed buffers unavailable")) { // a kernel >= 5.19
        EXPECT_TRUE(fixed);
    }
}

// The kernel counts fixed buffers against the user's RLIMIT_MEMLOCK, every process of
// the user together, and a ring's own pages too: an engine pins at most a sixteenth of a
// finite limit, so that it never leaves another engine of the user without room for a
// ring (io_uring_queue_init ENOMEM). With the limit lowered to 1 MiB (a 64 KiB share, less
// than the 128 and 256 KiB bounce buffers these READs take) the buffers made meanwhile
// pin at most 64 KiB together, one INFO line names the share, and READs move the right
// bytes through plain buffers. (The limit is lowered once the rings exist:
// they are counted against it too.)
TEST_F(FileRemoteTest, BounceBuffersPinAShareOfTheMemlockLimit) {
    const uint64_t n = 4u << 20;
    std::string path = TmpPath("async_memlock.bin");
    MakeFile(path, n);
    ASSERT_NO_FATAL_FAILURE(Connect(TcpEngine({{"file_engine", "uring"}, {"log_level", "debug"}}),
                                    TcpEngine({{"file_engine", "uring"}}), path, 0, n,
                                    OTE_PERM_READ, nullptr, 8));
    // The bytes of the buffers fixed so far (each DEBUG line names its size): those made
    // before the limit is lowered (at the connection) do not count against the check.
    auto fixed = [this] {
        uint64_t bytes = 0;
        for (const std::string &l : Logs()) {
            size_t at = l.find("a bounce buffer of ");
            if (at != l.npos && l.find("is io_uring fixed buffer") != l.npos)
                bytes += std::stoull(l.substr(at + 19));
        }
        return bytes;
    };
    const uint64_t fixed_before = fixed();
    struct rlimit was {};
    ASSERT_EQ(getrlimit(RLIMIT_MEMLOCK, &was), 0);
    struct rlimit low = was;
    low.rlim_cur = 1u << 20;
    ASSERT_EQ(setrlimit(RLIMIT_MEMLOCK, &low), 0);
    std::vector<std::vector<uint8_t>> bufs;
    std::vector<uint64_t> offs;
    for (uint64_t i = 0; i < 8; i++) {
        bufs.emplace_back(i % 2 == 0 ? (256u << 10) : 100000 + i, 0xee);
        offs.push_back(i * (400u << 10) + (i % 2 == 0 ? 0 : 5));
    }
    ReadMany(bufs, offs);
    ASSERT_EQ(setrlimit(RLIMIT_MEMLOCK, &was), 0);
    ASSERT_NO_FATAL_FAILURE(ExpectReadsRight(bufs, offs));
    if (!LogContains("io_uring fixed buffers unavailable")) { // a kernel >= 5.19
        EXPECT_TRUE(LogContains("share of RLIMIT_MEMLOCK, 65536 bytes"));
        EXPECT_LE(fixed() - fixed_before, 65536u) << "buffers were fixed past the share";
    }
}

INSTANTIATE_TEST_SUITE_P(Engines, FileTcpAsyncTest, ::testing::Values("uring", "threads"));

// shm serves file registrations as tcp does, through host->file's bounce buffers, in both
// of its modes (auto: cross-memory attach; ring: the shared ring): READ and WRITE of
// unaligned and aligned ranges, a request outside the registration refused whole.
class FileShmTest : public FileRemoteTest, public ::testing::WithParamInterface<const char *> {
  protected:
    // shm in this test's mode, and the keys of more.
    ote_engine_t *ShmEngine(const Kv &more = {}) {
        Kv kv{{"transports", "shm"}, {"shm_mode", GetParam()}};
        kv.insert(kv.end(), more.begin(), more.end());
        return NewEngine(kv);
    }
};

TEST_P(FileShmTest, PeerReadsAndWritesAFile) {
    const uint64_t n = 2u << 20;
    std::string path = TmpPath((std::string("remote_shm_") + GetParam() + ".bin").c_str());
    MakeFile(path, n);
    ASSERT_NO_FATAL_FAILURE(
        Connect(ShmEngine(), ShmEngine(), path, 4096, n - 4096, OTE_PERM_READ | OTE_PERM_WRITE));
    ote_segment_info_t info{};
    ASSERT_EQ(ote_segment_info(seg_, &info), OTE_OK);
    ASSERT_STREQ(info.transport, "shm");

    std::vector<uint8_t> buf(300001);
    ote_transfer_status_t s = Move(OTE_READ, buf.data(), a_ + 77, buf.size());
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    for (size_t i = 0; i < buf.size(); i++) ASSERT_EQ(buf[i], Pat(4096 + 77 + i)) << i;
    std::vector<uint8_t> big(1u << 20); // aligned: file offset 64 KiB, 1 MiB
    s = Move(OTE_READ, big.data(), a_ + 61440, big.size());
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    for (size_t i = 0; i < big.size(); i++) ASSERT_EQ(big[i], Pat(65536 + i)) << i;

    for (size_t i = 0; i < buf.size(); i++) buf[i] = static_cast<uint8_t>(~Pat(i));
    s = Move(OTE_WRITE, buf.data(), a_ + 1000, buf.size());
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    for (size_t i = 0; i < big.size(); i++) big[i] = static_cast<uint8_t>(Pat(i) ^ 0x5a);
    s = Move(OTE_WRITE, big.data(), a_ + 1044480, big.size()); // file offset 1 MiB
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    std::vector<uint8_t> got = ReadFile(path, n);
    for (uint64_t i = 0; i < n; i++) {
        uint8_t want = Pat(i);
        if (i >= 5096 && i < 5096 + buf.size()) want = static_cast<uint8_t>(~Pat(i - 5096));
        if (i >= (1u << 20)) want = static_cast<uint8_t>(Pat(i - (1u << 20)) ^ 0x5a);
        ASSERT_EQ(got[i], want) << i;
    }
    // Outside the registration: refused whole, nothing written.
    s = Move(OTE_WRITE, buf.data(), a_ + (n - 4096) - 10, 11);
    EXPECT_EQ(s.state, OTE_TRANSFER_FAILED);
    EXPECT_EQ(ote_status_code(s.error), OTE_ERR_ACCESS);
    EXPECT_EQ(ReadFile(path, n)[n - 11], Pat(n - 1u - (1u << 20) - 10) ^ 0x5a);
}

// shm reads a run's file pieces ahead (engine/shm/shm_fread.c): 32 READs at once, aligned
// and not, every byte right; then the 3rd read the file owner completes fails (file.io,
// EIO): only its request fails (OTE_ERR_REMOTE), the others complete.
TEST_P(FileShmTest, ManyReadsAndAReadError) {
    const uint64_t n = 8u << 20;
    std::string path = TmpPath((std::string("shm_many_") + GetParam() + ".bin").c_str());
    MakeFile(path, n);
    ASSERT_NO_FATAL_FAILURE(
        Connect(ShmEngine(), ShmEngine(), path, 0, n, OTE_PERM_READ, nullptr, 32));
    for (int round = 0; round < 2; round++) {
        std::vector<std::vector<uint8_t>> bufs;
        std::vector<uint64_t> offs;
        for (uint64_t i = 0; i < 32; i++) {
            uint64_t len = i % 3 == 0 ? (1u << 20) : i % 3 == 1 ? 65536 : 1 + i * 5003;
            offs.push_back((i * 229u * 4096 + (i % 2 ? 0 : i)) % (n - len));
            bufs.emplace_back(len, 0xee);
        }
        if (round == 1) {
            ASSERT_EQ(ote_fault_arm("file.io", OTE_FAULT_NTH, 3, OTE_ERR_FAULT, EIO), OTE_OK);
        }
        ReadMany(bufs, offs);
        ote_fault_disarm("file.io");
        size_t failed = 0;
        for (size_t i = 0; i < bufs.size(); i++) {
            ote_transfer_status_t s{};
            ASSERT_EQ(ote_batch_status(b_, i, &s), OTE_OK);
            if (round == 1 && s.state == OTE_TRANSFER_FAILED) {
                EXPECT_EQ(ote_status_code(s.error), OTE_ERR_REMOTE) << ote_status_str(s.error);
                failed++;
                continue;
            }
            ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << i << ": " << ote_status_str(s.error);
            for (size_t k = 0; k < bufs[i].size(); k++)
                ASSERT_EQ(bufs[i][k], Pat(offs[i] + k)) << i << " " << k;
        }
        EXPECT_EQ(failed, round == 1 ? 1u : 0u);
    }
}

// shm writes a WRITE piece's bounce to the file without waiting (shm_fread.c: the run's
// settle makes each write's outcome its piece's status): 24 WRITEs at once, every byte
// where it belongs; then the 5th write fails (EIO): only its request fails.
TEST_P(FileShmTest, ManyWritesAndAWriteError) {
    const uint64_t n = 8u << 20;
    std::string path = TmpPath((std::string("shm_writes_") + GetParam() + ".bin").c_str());
    MakeFile(path, n);
    ASSERT_NO_FATAL_FAILURE(
        Connect(ShmEngine(), ShmEngine(), path, 0, n, OTE_PERM_READ | OTE_PERM_WRITE, nullptr, 24));
    ASSERT_NO_FATAL_FAILURE(WriteManyChecked(path, n, 0));
    MakeFile(path, n);
    ASSERT_NO_FATAL_FAILURE(WriteManyChecked(path, n, 5));
    EXPECT_TRUE(LogContains("Input/output error")); // the file owner's WARN
}

// shm writes ahead across messages (shm_fread.c, fw_settle_ahead): four WRITEs of 4 MiB
// (slices of 4 MiB: one message each). The first one's write is held (file.stall, the
// source's 6 s deadline); meanwhile the second one's bytes land in the file, which the
// source could not do before the first message settled. The third overlaps the held
// range, so it waits, and so does the fourth behind it (order): one read of the file,
// done inside the hold, shows the second's bytes and neither the third's nor the
// fourth's. At the end the first fails (its deadline) and the others hold their bytes.
TEST_P(FileShmTest, WritesOfLaterMessagesGoAhead) {
    const uint64_t kMiB = 1u << 20, n = 16 * kMiB;
    std::string path = TmpPath((std::string("shm_ahead_") + GetParam() + ".bin").c_str());
    MakeFile(path, n);
    ASSERT_NO_FATAL_FAILURE(Connect(ShmEngine({{"transfer_timeout_ms", "6000"}}),
                                    ShmEngine({{"slice_size", "4M"}}), path, 0, n,
                                    OTE_PERM_READ | OTE_PERM_WRITE));
    const uint64_t offs[4] = {0, 4 * kMiB, 0, 12 * kMiB}; // held, ahead, overlaps, behind
    std::vector<std::vector<uint8_t>> bufs;
    std::vector<ote_batch_t *> bs{b_};
    for (int i = 0; i < 4; i++) bufs.emplace_back(4 * kMiB, static_cast<uint8_t>(0x11 * (i + 1)));
    for (int i = 1; i < 4; i++) {
        ote_batch_t *b = nullptr;
        ASSERT_EQ(ote_batch_create(req_, 1, &b), OTE_OK);
        bs.push_back(b);
    }
    ASSERT_EQ(ote_fault_arm("file.stall", OTE_FAULT_NTH, 1, OTE_ERR_FAULT, 0), OTE_OK);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 4; i++) {
        ote_request_t r{OTE_WRITE, bufs[i].data(), seg_, a_ + offs[i], bufs[i].size()};
        ASSERT_EQ(ote_batch_submit(bs[i], &r, 1), OTE_OK);
    }
    // Inside the first write's 6 s hold (it starts after t0), with a second to spare.
    auto held = [&]() {
        return std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(5000);
    };
    // Whether got holds v at every offset of at (none: at none of them).
    auto all = [&](const std::vector<uint8_t> &got, std::initializer_list<uint64_t> at, uint8_t v) {
        for (uint64_t x : at)
            if (got[x] != v) return false;
        return true;
    };
    auto none = [&](const std::vector<uint8_t> &got, std::initializer_list<uint64_t> at,
                    uint8_t v) {
        for (uint64_t x : at)
            if (got[x] == v) return false;
        return true;
    };
    bool in_hold = false;
    std::vector<uint8_t> got;
    const bool ahead = ote_test::WaitUntil(
        [&] {
            got = ReadFile(path, n);
            in_hold = held();
            return all(got, {4 * kMiB, 5 * kMiB + 3, 8 * kMiB - 1}, 0x22);
        },
        std::chrono::seconds(4), std::chrono::milliseconds(10),
        "the second message's write to go ahead of the held first");
    if (ahead) {
        EXPECT_TRUE(in_hold) << "inconclusive: the file was read after 5 s";
        // (A ring's slices are at most 2 MiB: the first WRITE is two pieces there, and only
        // its first is held, so its second half may hold its bytes already.)
        EXPECT_TRUE(none(got, {0, 2 * kMiB, 4 * kMiB - 1}, 0x33))
            << "the overlapping third went ahead";
        EXPECT_TRUE(none(got, {12 * kMiB, 14 * kMiB, 16 * kMiB - 1}, 0x44))
            << "the fourth went ahead of the third";
    }
    EXPECT_EQ(ote_fault_failures("file.stall"), 1u);
    ote_fault_disarm("file.stall");
    for (int i = 0; i < 4; i++) {
        (void)ote_batch_wait(bs[i], kWaitNs);
        ote_transfer_status_t st{};
        ASSERT_EQ(ote_batch_status(bs[i], 0, &st), OTE_OK);
        if (i == 0) {
            EXPECT_EQ(st.state, OTE_TRANSFER_FAILED) << ote_status_str(st.error);
        } else {
            EXPECT_EQ(st.state, OTE_TRANSFER_COMPLETED) << i << ": " << ote_status_str(st.error);
        }
    }
    for (int i = 1; i < 4; i++) EXPECT_EQ(ote_batch_destroy(bs[i]), OTE_OK);
    got = ReadFile(path, n);
    for (uint64_t x = 0; x < n; x++) {
        uint8_t want = x < 4 * kMiB ? 0x33 : x < 8 * kMiB ? 0x22 : x < 12 * kMiB ? Pat(x) : 0x44;
        ASSERT_EQ(got[x], want) << x;
    }
}

// The requester engine goes away while the source's reads of its pieces are held in
// flight (file.stall): the connection thread waits for them (their 1 s deadline), gives
// the bounces back and unpins; the registration then unregisters.
TEST_P(FileShmTest, RequesterGoneWithReadsInFlight) {
    const uint64_t n = 4u << 20;
    std::string path = TmpPath((std::string("shm_gone_") + GetParam() + ".bin").c_str());
    MakeFile(path, n);
    ASSERT_NO_FATAL_FAILURE(Connect(ShmEngine({{"transfer_timeout_ms", "1000"}}), ShmEngine(), path,
                                    0, n, OTE_PERM_READ, nullptr, 4));
    std::vector<std::vector<uint8_t>> bufs(4, std::vector<uint8_t>(256u << 10, 0xee));
    std::vector<ote_request_t> rs;
    for (size_t i = 0; i < 4; i++)
        rs.push_back({OTE_READ, bufs[i].data(), seg_, a_ + i * (1u << 20), bufs[i].size()});
    ASSERT_EQ(ote_fault_arm("file.stall", OTE_FAULT_EVERY, 0, OTE_ERR_FAULT, 0), OTE_OK);
    ASSERT_EQ(ote_batch_submit(b_, rs.data(), rs.size()), OTE_OK);
    EXPECT_EQ(ote_batch_wait(b_, 100ull * 1000 * 1000), OTE_ERR_TIMEOUT);
    EXPECT_GE(ote_fault_hits("file.stall"), 1u);
    ote_fault_disarm("file.stall");
    EXPECT_EQ(ote_batch_cancel(b_), OTE_OK);
    (void)ote_batch_wait(b_, kWaitNs);
    for (size_t i = 0; i < 4; i++) {
        ote_transfer_status_t s{};
        ASSERT_EQ(ote_batch_status(b_, i, &s), OTE_OK);
        EXPECT_NE(s.state, OTE_TRANSFER_COMPLETED) << i;
    }
    CloseRequester();
    EXPECT_EQ(UnregisterWaiting(), OTE_OK);
    a_ = 0;
}

INSTANTIATE_TEST_SUITE_P(Modes, FileShmTest, ::testing::Values("auto", "ring"));

} // namespace

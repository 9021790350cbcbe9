// Zero copy for a peer's READs of file registrations (engine/file/file_map.c, config
// file_zero_copy=auto): a READ whose whole range the page cache holds is sent from the
// file's read-only mapping by the transport's own kernel copy (tcp: sendmsg; shm:
// process_vm_writev), any other through a bounce buffer as before. Over tcp, shm
// (cross-memory attach: pieces of at most 64 KiB ride its ring, bounced) and shm's ring
// mode (every piece rides the ring: never mapped). The engine's counters
// (file_read_bytes_mapped, file_read_bytes_bounced) say which way each byte went.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <vector>

extern "C" {
#include "engine/testing.h"
#include "ote/ote.h"
}

#include "tests/file/remote_fixture.h"

namespace {

using namespace ote_file_test;

constexpr uint64_t kRingSmall = 64u << 10; // engine/shm: SHM_RING_SMALL

class ZeroCopyTest : public FileRemoteTest, public ::testing::WithParamInterface<const char *> {
  protected:
    bool Tcp() const { return std::string(GetParam()) == "tcp"; }
    bool Ring() const { return std::string(GetParam()) == "shm-ring"; }
    // An engine of the transport under test with file_zero_copy zc.
    ote_engine_t *Engine(const char *zc = "auto") {
        if (Tcp()) return TcpEngine({{"file_zero_copy", zc}});
        return NewEngine({{"transports", "shm"},
                          {"shm_mode", Ring() ? "ring" : "auto"},
                          {"file_zero_copy", zc}});
    }
    // src_'s counters: bytes of peers' READs sent from the page cache, and bounced.
    void Counts(uint64_t *mapped, uint64_t *bounced) {
        ote_engine_stats_t st{};
        st.struct_size = sizeof(st);
        ASSERT_EQ(ote_engine_stats(src_, &st), OTE_OK);
        *mapped = st.file_read_bytes_mapped;
        *bounced = st.file_read_bytes_bounced;
    }
    // The bytes of READs of `len` at a_ + off that the transport sends from the page cache
    // when all of it is cached: every one over tcp, those over kRingSmall over shm (the
    // smaller ride the ring), none in ring mode.
    uint64_t Mappable(uint64_t len) const {
        if (Ring()) return 0;
        return Tcp() || len > kRingSmall ? len : 0;
    }
    // 24 READs at once of varied lengths and alignments: every byte right; the bytes the
    // transport could send from the page cache in *mappable, all in *total.
    void ReadAll(uint64_t n, uint64_t *mappable, uint64_t *total) {
        std::vector<std::vector<uint8_t>> bufs;
        std::vector<uint64_t> offs;
        *mappable = *total = 0;
        for (uint64_t i = 0; i < 24; i++) {
            uint64_t len = i % 4 == 0   ? (1u << 20)
                           : i % 4 == 1 ? (1u << 20) + 1
                           : i % 4 == 2 ? 100000 + i
                                        : 1 + i * 811;
            offs.push_back((i * 97u * 4096 + (i % 2 ? 0 : 13 * i)) % (n - len));
            bufs.emplace_back(len, 0xee);
            *mappable += Mappable(len);
            *total += len;
        }
        ReadMany(bufs, offs);
        ASSERT_NO_FATAL_FAILURE(ExpectReadsRight(bufs, offs));
    }
    // How many pages of [off, +len) of the file at path the page cache holds.
    static uint64_t Resident(const std::string &path, uint64_t off, uint64_t len) {
        int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) return 0;
        void *p = mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(off));
        close(fd);
        if (p == MAP_FAILED) return 0;
        std::vector<unsigned char> vec((len + 4095) / 4096);
        uint64_t k = 0;
        if (mincore(p, len, vec.data()) == 0)
            for (unsigned char v : vec) k += v & 1;
        munmap(p, len);
        return k;
    }
    // Every page of [0, n) of the file at path out of the page cache (written back first);
    // false when the file system keeps them (tmpfs).
    static bool Evict(const std::string &path, uint64_t n) {
        int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) return false;
        bool ok = fdatasync(fd) == 0 && posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0;
        void *p = ok ? mmap(nullptr, n, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
        close(fd);
        if (p == MAP_FAILED) return false;
        std::vector<unsigned char> vec((n + 4095) / 4096);
        ok = mincore(p, n, vec.data()) == 0;
        for (unsigned char v : vec) ok = ok && !(v & 1);
        munmap(p, n);
        return ok;
    }
};

// A file written through the page cache: 24 READs at once (1 byte to 1 MiB + 1, aligned
// and not), three rounds, every byte right, and every byte the transport can send from
// the page cache sent from there (the rest bounced). Then a peer's WRITEs change the file
// (an aligned one O_DIRECT at the source: its pages leave the page cache; an unaligned one
// through it) and READs of those ranges see the new bytes, whichever way they go.
TEST_P(ZeroCopyTest, CachedReadsAreSentFromThePageCache) {
    const uint64_t n = 8u << 20;
    std::string path = TmpPath((std::string("zc_cached_") + GetParam() + ".bin").c_str());
    MakeFile(path, n);
    ASSERT_NO_FATAL_FAILURE(
        Connect(Engine(), Engine(), path, 0, n, OTE_PERM_READ | OTE_PERM_WRITE, nullptr, 24));
    uint64_t want_mapped = 0, want_total = 0;
    for (int round = 0; round < 3; round++) {
        uint64_t mappable = 0, total = 0;
        ASSERT_NO_FATAL_FAILURE(ReadAll(n, &mappable, &total));
        want_mapped += mappable;
        want_total += total;
    }
    uint64_t mapped = 0, bounced = 0;
    ASSERT_NO_FATAL_FAILURE(Counts(&mapped, &bounced));
    EXPECT_EQ(mapped, want_mapped);
    EXPECT_EQ(mapped + bounced, want_total);
    if (!Ring()) {
        EXPECT_GT(mapped, want_total / 2);
    }

    std::vector<uint8_t> w(1u << 20), back(1u << 20);
    for (size_t i = 0; i < w.size(); i++) w[i] = static_cast<uint8_t>(~Pat(i));
    const uint64_t offs[2] = {2u << 20, (5u << 20) + 333};
    for (uint64_t off : offs) {
        ote_transfer_status_t s = Move(OTE_WRITE, w.data(), a_ + off, w.size());
        ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
        s = Move(OTE_READ, back.data(), a_ + off, back.size());
        ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
        for (size_t i = 0; i < back.size(); i++) ASSERT_EQ(back[i], w[i]) << off << " " << i;
    }
}

// A file out of the page cache (written back, then dropped with POSIX_FADV_DONTNEED):
// READs of it are bounced, none sent from the mapping (a page fault on the transport's
// thread would read the disk there, where the bounce reads it with io_uring); once the
// test reads the file through the page cache, the same READ is sent from there.
TEST_P(ZeroCopyTest, UncachedRangesAreBounced) {
    const uint64_t n = 4u << 20;
    std::string path = TmpPath((std::string("zc_cold_") + GetParam() + ".bin").c_str());
    MakeFile(path, n);
    ASSERT_TRUE(Evict(path, n)) << "the file system under TEST_TMPDIR keeps its pages";
    ASSERT_NO_FATAL_FAILURE(Connect(Engine(), Engine(), path, 0, n, OTE_PERM_READ));
    std::vector<uint8_t> buf(1u << 20);
    ote_transfer_status_t s = Move(OTE_READ, buf.data(), a_ + (1u << 20), buf.size());
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    for (size_t i = 0; i < buf.size(); i++) ASSERT_EQ(buf[i], Pat((1u << 20) + i)) << i;
    uint64_t mapped = 0, bounced = 0;
    ASSERT_NO_FATAL_FAILURE(Counts(&mapped, &bounced));
    EXPECT_EQ(mapped, 0u);
    EXPECT_EQ(bounced, buf.size());

    (void)ReadFile(path, n); // now cached
    std::fill(buf.begin(), buf.end(), 0);
    s = Move(OTE_READ, buf.data(), a_ + (1u << 20), buf.size());
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    for (size_t i = 0; i < buf.size(); i++) ASSERT_EQ(buf[i], Pat((1u << 20) + i)) << i;
    ASSERT_NO_FATAL_FAILURE(Counts(&mapped, &bounced));
    EXPECT_EQ(mapped, Mappable(buf.size()));
    EXPECT_EQ(mapped + bounced, 2 * buf.size());
}

// A range the page cache holds but for a few pages (read, then one page in each 256 KiB
// dropped, as the kernel's reclaim leaves holes): a READ of it cannot be sent from the page
// cache, and its bounce reads the range buffered, not O_DIRECT though it is aligned, so
// the page cache serves what it holds and keeps the pages it reads: the range is cached
// in full after the READ, and the same READ is then sent from there (where the transport
// sends from the page cache at all). Read O_DIRECT, the holes would have stayed open,
// every later READ of the range bounced. (A slice of which the page cache holds nothing
// is still read O_DIRECT: a cold file does not fill the page cache.)
TEST_P(ZeroCopyTest, PartlyCachedRangeIsReadIntoThePageCache) {
    const uint64_t n = 4u << 20, off = 1u << 20, len = 1u << 20;
    std::string path = TmpPath((std::string("zc_part_") + GetParam() + ".bin").c_str());
    MakeFile(path, n);
    ASSERT_TRUE(Evict(path, n)) << "the file system under TEST_TMPDIR keeps its pages";
    const uint64_t holes[] = {25, 100, 175, 250}; // pages of the range, one in each 256 KiB
    {
        int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
        ASSERT_GE(fd, 0);
        std::vector<uint8_t> all(len);
        EXPECT_EQ(pread(fd, all.data(), all.size(), off), static_cast<ssize_t>(all.size()));
        for (uint64_t h : holes)
            EXPECT_EQ(posix_fadvise(fd, off + h * 4096, 4096, POSIX_FADV_DONTNEED), 0);
        close(fd);
    }
    ASSERT_EQ(Resident(path, off, len), len / 4096 - 4);
    ASSERT_NO_FATAL_FAILURE(Connect(Engine(), Engine(), path, 0, n, OTE_PERM_READ));
    std::vector<uint8_t> buf(len);
    uint64_t mapped[2] = {}, bounced[2] = {};
    for (int round = 0; round < 2; round++) {
        std::fill(buf.begin(), buf.end(), 0);
        ote_transfer_status_t s = Move(OTE_READ, buf.data(), a_ + off, buf.size());
        ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
        for (size_t i = 0; i < buf.size(); i++) ASSERT_EQ(buf[i], Pat(off + i)) << i;
        EXPECT_EQ(Resident(path, off, len), len / 4096) << "round " << round;
        ASSERT_NO_FATAL_FAILURE(Counts(&mapped[round], &bounced[round]));
    }
    // The first READ was bounced (tcp: its 64 KiB slices with a hole, those the buffered
    // reads' readahead had not filled meanwhile); the second went from the page cache
    // wherever the transport sends from there.
    EXPECT_GT(bounced[0], 0u);
    if (!Tcp()) {
        EXPECT_EQ(bounced[0], len);
    }
    EXPECT_EQ(mapped[1] - mapped[0], Mappable(len));
    EXPECT_EQ(mapped[1] + bounced[1], 2 * len);
}

// file_zero_copy=off: every READ of a cached file is bounced.
TEST_P(ZeroCopyTest, OffBouncesEveryRead) {
    const uint64_t n = 2u << 20;
    std::string path = TmpPath((std::string("zc_off_") + GetParam() + ".bin").c_str());
    MakeFile(path, n);
    ASSERT_NO_FATAL_FAILURE(Connect(Engine("off"), Engine(), path, 0, n, OTE_PERM_READ));
    std::vector<uint8_t> buf(n);
    ote_transfer_status_t s = Move(OTE_READ, buf.data(), a_, buf.size());
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    for (size_t i = 0; i < buf.size(); i++) ASSERT_EQ(buf[i], Pat(i)) << i;
    uint64_t mapped = 0, bounced = 0;
    ASSERT_NO_FATAL_FAILURE(Counts(&mapped, &bounced));
    EXPECT_EQ(mapped, 0u);
    EXPECT_EQ(bounced, n);
}

// The file truncated right after the source chose the page cache for a READ, before the
// transport's copy (the engine's file_mapped hook truncates it): the pages are gone, the
// kernel's copy out of the mapping fails (EFAULT; nothing in the process loads from the
// mapping, so no SIGBUS) and the READ fails, with a WARN naming the truncation (shm: that
// request alone, OTE_ERR_REMOTE; tcp: its connection closes, having sent a header that
// promised the bytes). With the file whole again, READs complete. In ring mode no READ is
// sent from the mapping: the hook never runs.
TEST_P(ZeroCopyTest, FileTruncatedUnderAMappedReadFailsItCleanly) {
    const uint64_t n = 4u << 20;
    std::string path = TmpPath((std::string("zc_trunc_") + GetParam() + ".bin").c_str());
    MakeFile(path, n);
    ASSERT_NO_FATAL_FAILURE(Connect(Engine(), Engine(), path, 0, n, OTE_PERM_READ));
    struct Ctx {
        std::string path;
        std::atomic<int> calls{0};
        int rc = -1;
    } ctx{path};
    ote__test_file_mapped_hook(
        +[](void *arg, uint64_t, uint32_t) {
            auto *c = static_cast<Ctx *>(arg);
            if (c->calls.fetch_add(1) == 0) c->rc = truncate(c->path.c_str(), 8192);
        },
        &ctx);
    std::vector<uint8_t> buf(1u << 20, 0xee);
    ote_transfer_status_t s = Move(OTE_READ, buf.data(), a_ + (2u << 20), buf.size());
    ote__test_file_mapped_hook(nullptr, nullptr);
    if (Ring()) {
        EXPECT_EQ(ctx.calls.load(), 0);
        ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
        return;
    }
    EXPECT_GE(ctx.calls.load(), 1);
    EXPECT_EQ(ctx.rc, 0);
    EXPECT_EQ(s.state, OTE_TRANSFER_FAILED) << ote_status_str(s.error);
    if (!Tcp()) {
        EXPECT_EQ(ote_status_code(s.error), OTE_ERR_REMOTE) << ote_status_str(s.error);
    }
    EXPECT_TRUE(LogContains(Tcp() ? "truncated under" : "the file was truncated"));

    MakeFile(path, n);
    std::fill(buf.begin(), buf.end(), 0);
    s = Move(OTE_READ, buf.data(), a_ + (2u << 20), buf.size());
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    for (size_t i = 0; i < buf.size(); i++) ASSERT_EQ(buf[i], Pat((2u << 20) + i)) << i;
}

// shm keeps the order of messages (engine/shm/shm_fread.c): a READ of the served message
// sent from the page cache is copied by the copy units after its run settles, and that
// settle starts the WRITEs of later messages (writing ahead) while an earlier WRITE of the
// message runs. A later WRITE to the READ's bytes must wait for that copy. Message 1: a
// WRITE of 2 MiB elsewhere (its write held by file.stall until the source's 3 s deadline)
// and a READ of 2 MiB at X (cached: sent from the page cache); message 2: a WRITE of
// X. The READ holds the bytes from before the WRITE.
TEST_F(FileRemoteTest, ShmLaterWriteWaitsForAMappedRead) {
    const uint64_t kMiB = 1u << 20, n = 8 * kMiB, x = 4 * kMiB;
    std::string path = TmpPath("zc_shm_order.bin");
    MakeFile(path, n);
    ASSERT_NO_FATAL_FAILURE(Connect(
        NewEngine(
            {{"transports", "shm"}, {"file_zero_copy", "auto"}, {"transfer_timeout_ms", "3000"}}),
        NewEngine({{"transports", "shm"}, {"slice_size", "2M"}}), path, 0, n,
        OTE_PERM_READ | OTE_PERM_WRITE, nullptr, 2));
    ote_batch_t *b2 = nullptr;
    ASSERT_EQ(ote_batch_create(req_, 1, &b2), OTE_OK);
    std::vector<uint8_t> w1(2 * kMiB, 0x11), r1(2 * kMiB, 0xee), w2(2 * kMiB, 0x22);
    ASSERT_EQ(ote_fault_arm("file.stall", OTE_FAULT_NTH, 1, OTE_ERR_FAULT, 0), OTE_OK);
    ote_request_t m1[2] = {{OTE_WRITE, w1.data(), seg_, a_, w1.size()},
                           {OTE_READ, r1.data(), seg_, a_ + x, r1.size()}};
    ote_request_t m2{OTE_WRITE, w2.data(), seg_, a_ + x, w2.size()};
    EXPECT_EQ(ote_batch_submit(b_, m1, 2), OTE_OK);
    EXPECT_EQ(ote_batch_submit(b2, &m2, 1), OTE_OK);
    (void)ote_batch_wait(b_, kWaitNs);
    (void)ote_batch_wait(b2, kWaitNs);
    EXPECT_EQ(ote_fault_failures("file.stall"), 1u);
    ote_fault_disarm("file.stall");
    ote_transfer_status_t s{};
    EXPECT_EQ(ote_batch_status(b_, 0, &s), OTE_OK);
    EXPECT_EQ(s.state, OTE_TRANSFER_FAILED) << "the held write did not reach its deadline";
    EXPECT_EQ(ote_batch_status(b_, 1, &s), OTE_OK);
    EXPECT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    EXPECT_EQ(ote_batch_status(b2, 0, &s), OTE_OK);
    EXPECT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    EXPECT_EQ(ote_batch_destroy(b2), OTE_OK);
    for (size_t i = 0; i < r1.size(); i++) ASSERT_EQ(r1[i], Pat(x + i)) << i;
    uint64_t mapped = 0;
    ote_engine_stats_t st{};
    st.struct_size = sizeof(st);
    ASSERT_EQ(ote_engine_stats(src_, &st), OTE_OK);
    mapped = st.file_read_bytes_mapped;
    EXPECT_EQ(mapped, r1.size()) << "the READ was not sent from the page cache";
    std::vector<uint8_t> got = ReadFile(path, n);
    for (uint64_t i = x; i < x + w2.size(); i++) ASSERT_EQ(got[i], 0x22) << i;
}

// The same order on the bounce path (file_zero_copy=off): shm reads ahead into later
// messages only once the served run has no file WRITE left to start. Message 0: a WRITE
// whose write is held by file.stall until the source's 3 s deadline (meanwhile the source
// reads messages 1 and 2); message 1: a READ of A, then a WRITE of X; message 2: a READ
// of X. Before, the READ of A read ahead past the WRITE of X into message 2, whose READ
// of X then returned the bytes from before that WRITE.
TEST_F(FileRemoteTest, ShmLaterReadWaitsForAnEarlierWrite) {
    const uint64_t kMiB = 1u << 20, n = 8 * kMiB, x = 4 * kMiB, z = 6 * kMiB;
    std::string path = TmpPath("zc_shm_read_order.bin");
    MakeFile(path, n);
    ASSERT_NO_FATAL_FAILURE(Connect(
        NewEngine(
            {{"transports", "shm"}, {"file_zero_copy", "off"}, {"transfer_timeout_ms", "3000"}}),
        NewEngine({{"transports", "shm"}, {"slice_size", "2M"}}), path, 0, n,
        OTE_PERM_READ | OTE_PERM_WRITE, nullptr, 2));
    ote_batch_t *b0 = nullptr, *b2 = nullptr;
    ASSERT_EQ(ote_batch_create(req_, 1, &b0), OTE_OK);
    ASSERT_EQ(ote_batch_create(req_, 1, &b2), OTE_OK);
    std::vector<uint8_t> w0(2 * kMiB, 0x11), ra(2 * kMiB, 0xee), wx(2 * kMiB, 0x22),
        rx(2 * kMiB, 0xee);
    ASSERT_EQ(ote_fault_arm("file.stall", OTE_FAULT_NTH, 1, OTE_ERR_FAULT, 0), OTE_OK);
    ote_request_t m0{OTE_WRITE, w0.data(), seg_, a_ + z, w0.size()};
    ote_request_t m1[2] = {{OTE_READ, ra.data(), seg_, a_, ra.size()},
                           {OTE_WRITE, wx.data(), seg_, a_ + x, wx.size()}};
    ote_request_t m2{OTE_READ, rx.data(), seg_, a_ + x, rx.size()};
    EXPECT_EQ(ote_batch_submit(b0, &m0, 1), OTE_OK);
    EXPECT_EQ(ote_batch_submit(b_, m1, 2), OTE_OK);
    EXPECT_EQ(ote_batch_submit(b2, &m2, 1), OTE_OK);
    (void)ote_batch_wait(b0, kWaitNs);
    (void)ote_batch_wait(b_, kWaitNs);
    (void)ote_batch_wait(b2, kWaitNs);
    EXPECT_EQ(ote_fault_failures("file.stall"), 1u);
    ote_fault_disarm("file.stall");
    ote_transfer_status_t s{};
    EXPECT_EQ(ote_batch_status(b0, 0, &s), OTE_OK);
    EXPECT_EQ(s.state, OTE_TRANSFER_FAILED) << "the held write did not reach its deadline";
    for (size_t i = 0; i < 2; i++) {
        EXPECT_EQ(ote_batch_status(b_, i, &s), OTE_OK);
        EXPECT_EQ(s.state, OTE_TRANSFER_COMPLETED) << i << ": " << ote_status_str(s.error);
    }
    EXPECT_EQ(ote_batch_status(b2, 0, &s), OTE_OK);
    EXPECT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    EXPECT_EQ(ote_batch_destroy(b0), OTE_OK);
    EXPECT_EQ(ote_batch_destroy(b2), OTE_OK);
    for (size_t i = 0; i < ra.size(); i++) ASSERT_EQ(ra[i], Pat(i)) << i;
    for (size_t i = 0; i < rx.size(); i++) ASSERT_EQ(rx[i], 0x22) << "message 2 read ahead: " << i;
}

INSTANTIATE_TEST_SUITE_P(Transports, ZeroCopyTest, ::testing::Values("tcp", "shm", "shm-ring"),
                         [](const ::testing::TestParamInfo<const char *> &p) {
                             std::string s = p.param;
                             return s == "shm-ring" ? std::string("shm_ring") : s;
                         });

} // namespace

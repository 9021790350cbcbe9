// File registrations (ote_file_register) and the local segment (ote_segment_open_local):
// bytes moved both ways and compared, O_DIRECT for aligned requests and buffered for the
// others (ote_transfer_status_ex_t.file_io), both I/O engines (io_uring and the
// preadv/pwritev pool, the fallback forced by config and by a failing io_uring setup),
// file_sync=data, files that are not files, permissions the open mode does not allow, a
// file truncated under its registration, EIO/ENOSPC from the I/O owner's fault hook, and
// cancel and deadlines reaching operations in flight (the file.stall fault point holds
// them there). Files live in $TEST_TMPDIR.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

extern "C" {
#include "base/fault.h"
#include "ote/ote.h"
}

#include "tests/util/test_base.h"

namespace {

constexpr char kStall[] = "file.stall";
constexpr char kUringInit[] = "file.uring_init";
constexpr char kIo[] = "file.io";
constexpr char kSync[] = "file.sync";
constexpr char kFixedFile[] = "file.fixed_file";

std::string TmpDir() {
    const char *d = getenv("TEST_TMPDIR");
    return d != nullptr ? d : "/tmp";
}

uint8_t Pat(uint64_t i, uint8_t seed) { return static_cast<uint8_t>((i * 131 + seed) ^ (i >> 9)); }

// A file of n pattern bytes (seed), removed with the object.
struct TmpFile {
    std::string path;
    explicit TmpFile(const std::string &name, uint64_t n, uint8_t seed = 7) {
        path = TmpDir() + "/" + name;
        std::vector<uint8_t> b(n);
        for (uint64_t i = 0; i < n; i++) b[i] = Pat(i, seed);
        int fd = open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
        EXPECT_GE(fd, 0);
        EXPECT_EQ(write(fd, b.data(), n), static_cast<ssize_t>(n));
        close(fd);
    }
    ~TmpFile() { unlink(path.c_str()); }
    std::vector<uint8_t> Read() const {
        std::vector<uint8_t> b;
        int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) return b;
        struct stat st;
        fstat(fd, &st);
        b.resize(static_cast<size_t>(st.st_size));
        EXPECT_EQ(pread(fd, b.data(), b.size(), 0), static_cast<ssize_t>(b.size()));
        close(fd);
        return b;
    }
};

// Whether $TEST_TMPDIR's file system takes O_DIRECT (tmpfs does not).
bool DirectSupported() {
    std::string p = TmpDir() + "/odirect_probe";
    int fd = open(p.c_str(), O_CREAT | O_RDWR | O_DIRECT | O_CLOEXEC, 0644);
    unlink(p.c_str());
    if (fd < 0) return false;
    close(fd);
    return true;
}

struct AlignedFree {
    void operator()(uint8_t *p) const { free(p); }
};
using Buf = std::unique_ptr<uint8_t, AlignedFree>;
Buf Alloc(size_t n) {
    return Buf(static_cast<uint8_t *>(aligned_alloc(4096, (n + 4095) / 4096 * 4096)));
}

// The engine used by a test, its local segment and a batch; destroyed in order.
class FileTest : public ote_test::OteTest, public ::testing::WithParamInterface<const char *> {
  protected:
    void Start(std::vector<std::pair<const char *, const char *>> kv = {}) {
        ote_config_t *cfg = nullptr;
        ASSERT_EQ(ote_config_create(&cfg), OTE_OK);
        ASSERT_EQ(ote_config_set(cfg, "listen_address", "127.0.0.1:0"), OTE_OK);
        ASSERT_EQ(ote_config_set(cfg, "transports", "tcp"), OTE_OK);
        ASSERT_EQ(ote_config_set(cfg, "file_engine", GetParam()), OTE_OK);
        ASSERT_EQ(ote_config_set(cfg, "log_level", "info"), OTE_OK);
        for (auto &p : kv) ASSERT_EQ(ote_config_set(cfg, p.first, p.second), OTE_OK);
        ASSERT_EQ(ote_engine_create(cfg, &e_), OTE_OK);
        ote_config_destroy(cfg);
        ASSERT_EQ(ote_segment_open_local(e_, &seg_), OTE_OK);
        ASSERT_EQ(ote_batch_create(e_, 64, &b_), OTE_OK);
    }
    void TearDown() override {
        if (b_ != nullptr) {
            ote_batch_cancel(b_);
            ote_batch_wait(b_, 10ull * 1000 * 1000 * 1000);
            EXPECT_EQ(ote_batch_destroy(b_), OTE_OK);
        }
        if (seg_ != nullptr) {
            EXPECT_EQ(ote_segment_close(seg_), OTE_OK);
        }
        if (e_ != nullptr) {
            EXPECT_EQ(ote_engine_destroy(e_), OTE_OK);
        }
        OteTest::TearDown();
    }
    // One request, waited for; its final status.
    ote_transfer_status_ex_t Move(ote_opcode_t op, void *local, uint64_t remote, size_t len) {
        EXPECT_EQ(ote_batch_reset(b_), OTE_OK);
        ote_request_t r{op, local, seg_, remote, len};
        EXPECT_EQ(ote_batch_submit(b_, &r, 1), OTE_OK);
        (void)ote_batch_wait(b_, 30ull * 1000 * 1000 * 1000);
        ote_transfer_status_ex_t s{};
        s.struct_size = sizeof(s);
        EXPECT_EQ(ote_batch_status_ex(b_, 0, &s), OTE_OK);
        return s;
    }
    uint64_t Register(const TmpFile &f, uint64_t off, uint64_t len, unsigned perms) {
        uint64_t a = 0;
        EXPECT_EQ(ote_file_register(e_, f.path.c_str(), -1, off, len, perms, nullptr, &a), OTE_OK);
        return a;
    }
    std::string Engine() {
        char buf[32] = {};
        EXPECT_EQ(ote_file_engine(e_, buf, sizeof(buf)), OTE_OK);
        return buf;
    }
    ote_engine_t *e_ = nullptr;
    ote_segment_t *seg_ = nullptr;
    ote_batch_t *b_ = nullptr;
};

// Unaligned READ and WRITE move exactly their bytes, buffered; nothing outside the range.
TEST_P(FileTest, UnalignedRoundTripIsBuffered) {
    Start({{"file_chunk_size", "64K"}});
    const uint64_t n = (1u << 20) + 4000, off = 1000, len = 700001;
    TmpFile f("unaligned.bin", n);
    uint64_t a = Register(f, off, n - off, OTE_PERM_READ | OTE_PERM_WRITE);
    EXPECT_EQ(Engine(), std::string(GetParam()) == "threads" ? "threads" : "io_uring");
    std::vector<uint8_t> buf(len + 1);
    ote_transfer_status_ex_t s = Move(OTE_READ, buf.data() + 1, a + 3, len);
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    EXPECT_EQ(s.bytes_done, len);
    EXPECT_EQ(s.transport, static_cast<uint32_t>(OTE_TRANSPORT_FILE));
    EXPECT_EQ(s.file_io, OTE_FILE_IO_BUFFERED);
    for (uint64_t i = 0; i < len; i++) ASSERT_EQ(buf[i + 1], Pat(off + 3 + i, 7)) << i;
    for (uint64_t i = 0; i < len; i++) buf[i + 1] = Pat(i, 99);
    s = Move(OTE_WRITE, buf.data() + 1, a + 5, len);
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    EXPECT_EQ(s.file_io, OTE_FILE_IO_BUFFERED);
    std::vector<uint8_t> got = f.Read();
    ASSERT_EQ(got.size(), n);
    for (uint64_t i = 0; i < n; i++) {
        bool in = i >= off + 5 && i < off + 5 + len;
        ASSERT_EQ(got[i], in ? Pat(i - off - 5, 99) : Pat(i, 7)) << i;
    }
}

// Aligned requests go O_DIRECT (several chunks in flight), and the bytes match.
TEST_P(FileTest, AlignedRoundTripIsDirect) {
    if (!DirectSupported()) GTEST_SKIP() << TmpDir() << " does not take O_DIRECT (tmpfs?)";
    Start({{"file_chunk_size", "256K"}, {"file_queue_depth", "4"}});
    const uint64_t n = 8u << 20, len = 4u << 20;
    TmpFile f("aligned.bin", n);
    uint64_t a = Register(f, 4096, n - 4096, OTE_PERM_READ | OTE_PERM_WRITE);
    Buf buf = Alloc(len);
    ote_transfer_status_ex_t s = Move(OTE_READ, buf.get(), a + 8192, len);
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    EXPECT_EQ(s.file_io, OTE_FILE_IO_DIRECT);
    for (uint64_t i = 0; i < len; i++) ASSERT_EQ(buf.get()[i], Pat(4096 + 8192 + i, 7)) << i;
    for (uint64_t i = 0; i < len; i++) buf.get()[i] = Pat(i, 3);
    s = Move(OTE_WRITE, buf.get(), a, len);
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    EXPECT_EQ(s.file_io, OTE_FILE_IO_DIRECT);
    std::vector<uint8_t> got = f.Read();
    for (uint64_t i = 0; i < n; i++) {
        bool in = i >= 4096 && i < 4096 + len;
        ASSERT_EQ(got[i], in ? Pat(i - 4096, 3) : Pat(i, 7)) << i;
    }
    // Aligned file offset and length but an unaligned buffer: buffered.
    std::vector<uint8_t> un(8192 + 1);
    s = Move(OTE_READ, un.data() + 1, a, 8192);
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED);
    EXPECT_EQ(s.file_io, OTE_FILE_IO_BUFFERED);
}

// file_sync=data puts an fdatasync on every WRITE's path (file.sync is hit, and its
// failure fails the request); file_sync=none never syncs.
TEST_P(FileTest, FileSyncData) {
    Start({{"file_sync", "data"}, {"file_chunk_size", "64K"}});
    TmpFile f("sync.bin", 256u << 10);
    uint64_t a = Register(f, 0, 256u << 10, OTE_PERM_READ | OTE_PERM_WRITE);
    std::vector<uint8_t> buf(200000, 0x5a);
    ASSERT_EQ(ote_fault_arm(kSync, OTE_FAULT_NTH, 1000000, OTE_ERR_FAULT, 0), OTE_OK);
    ote_transfer_status_ex_t s = Move(OTE_WRITE, buf.data(), a + 11, buf.size());
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    EXPECT_GE(ote_fault_hits(kSync), 3u); // one per 64 KiB chunk
    std::vector<uint8_t> got = f.Read();
    for (size_t i = 0; i < buf.size(); i++) ASSERT_EQ(got[11 + i], 0x5a);
    ASSERT_EQ(ote_fault_arm(kSync, OTE_FAULT_EVERY, 0, OTE_ERR_FAULT, EIO), OTE_OK);
    s = Move(OTE_WRITE, buf.data(), a, 1000);
    EXPECT_EQ(s.state, OTE_TRANSFER_FAILED);
    EXPECT_EQ(ote_status_code(s.error), OTE_ERR_IO);
    EXPECT_EQ(ote_status_errno(s.error), EIO);
    EXPECT_TRUE(LogContains("fdatasync"));
    // READs never sync.
    ASSERT_EQ(ote_fault_arm(kSync, OTE_FAULT_NTH, 1000000, OTE_ERR_FAULT, 0), OTE_OK);
    s = Move(OTE_READ, buf.data(), a, buf.size());
    EXPECT_EQ(s.state, OTE_TRANSFER_COMPLETED);
    EXPECT_EQ(ote_fault_hits(kSync), 0u);
}

TEST_P(FileTest, FileSyncNoneNeverSyncs) {
    Start({{"file_sync", "none"}});
    TmpFile f("nosync.bin", 64u << 10);
    uint64_t a = Register(f, 0, 64u << 10, OTE_PERM_WRITE);
    std::vector<uint8_t> buf(60000, 1);
    ASSERT_EQ(ote_fault_arm(kSync, OTE_FAULT_NTH, 1000000, OTE_ERR_FAULT, 0), OTE_OK);
    ote_transfer_status_ex_t s = Move(OTE_WRITE, buf.data(), a, buf.size());
    EXPECT_EQ(s.state, OTE_TRANSFER_COMPLETED);
    EXPECT_EQ(ote_fault_hits(kSync), 0u);
}

// EIO and ENOSPC from the device (the file.io hook) fail the request with their errno.
TEST_P(FileTest, IoErrorsReachTheStatus) {
    Start();
    TmpFile f("eio.bin", 64u << 10);
    uint64_t a = Register(f, 0, 64u << 10, OTE_PERM_READ | OTE_PERM_WRITE);
    std::vector<uint8_t> buf(4096);
    for (int err : {EIO, ENOSPC}) {
        ASSERT_EQ(ote_fault_arm(kIo, OTE_FAULT_EVERY, 0, OTE_ERR_FAULT, err), OTE_OK);
        ote_transfer_status_ex_t s =
            Move(err == EIO ? OTE_READ : OTE_WRITE, buf.data(), a, buf.size());
        EXPECT_EQ(s.state, OTE_TRANSFER_FAILED);
        EXPECT_EQ(ote_status_code(s.error), OTE_ERR_IO);
        EXPECT_EQ(ote_status_errno(s.error), err);
        EXPECT_EQ(s.bytes_done, 0u);
    }
    ote_fault_disarm(kIo);
    ote_transfer_status_ex_t s = Move(OTE_READ, buf.data(), a, buf.size());
    EXPECT_EQ(s.state, OTE_TRANSFER_COMPLETED);
}

// A file truncated under its registration: a READ past the new end fails OTE_ERR_IO
// (ENODATA); a WRITE writes its range only; a request leaving the range is refused whole.
TEST_P(FileTest, TruncatedUnderRegistration) {
    Start({{"file_chunk_size", "64K"}});
    const uint64_t n = 512u << 10;
    TmpFile f("trunc.bin", n);
    uint64_t a = Register(f, 4096, 256u << 10, OTE_PERM_READ | OTE_PERM_WRITE);
    ASSERT_EQ(truncate(f.path.c_str(), 100000), 0);
    std::vector<uint8_t> buf(200000, 0);
    ote_transfer_status_ex_t s = Move(OTE_READ, buf.data(), a, buf.size());
    EXPECT_EQ(s.state, OTE_TRANSFER_FAILED);
    EXPECT_EQ(ote_status_code(s.error), OTE_ERR_IO);
    EXPECT_EQ(ote_status_errno(s.error), ENODATA);
    EXPECT_LT(s.bytes_done, buf.size());
    EXPECT_TRUE(LogContains("truncated file"));
    // Refused whole: runs one byte past the registration.
    s = Move(OTE_WRITE, buf.data(), a + (256u << 10) - 1000, 1001);
    EXPECT_EQ(s.state, OTE_TRANSFER_FAILED);
    EXPECT_EQ(ote_status_code(s.error), OTE_ERR_ACCESS);
    EXPECT_EQ(f.Read().size(), 100000u);
    // A WRITE inside the range grows the file to the WRITE's end, not further.
    std::fill(buf.begin(), buf.end(), 0xab);
    s = Move(OTE_WRITE, buf.data(), a + 1000, 50000);
    EXPECT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    std::vector<uint8_t> got = f.Read();
    ASSERT_EQ(got.size(), 100000u); // 4096 + 1000 + 50000 < 100000
    for (uint64_t i = 0; i < got.size(); i++) {
        bool in = i >= 5096 && i < 55096;
        ASSERT_EQ(got[i], in ? 0xab : Pat(i, 7)) << i;
    }
    s = Move(OTE_WRITE, buf.data(), a + 150000, 1000);
    EXPECT_EQ(s.state, OTE_TRANSFER_COMPLETED);
    EXPECT_EQ(f.Read().size(), 4096u + 151000u);
}

// What is not a file, or not open for what perms ask, is refused and leaks nothing.
TEST_P(FileTest, RefusesWhatIsNotAllowed) {
    Start();
    uint64_t a = 0;
    EXPECT_EQ(ote_file_register(e_, TmpDir().c_str(), -1, 0, 1, OTE_PERM_READ, nullptr, &a),
              OTE_ERR_INVALID);
    EXPECT_TRUE(LogContains("not a regular file or block device"));
    EXPECT_EQ(ote_file_register(e_, "/dev/null", -1, 0, 1, OTE_PERM_READ, nullptr, &a),
              OTE_ERR_INVALID);
    EXPECT_EQ(ote_status_code(ote_file_register(e_, (TmpDir() + "/none").c_str(), -1, 0, 1,
                                                OTE_PERM_READ, nullptr, &a)),
              OTE_ERR_NOT_FOUND);
    TmpFile f("perm.bin", 8192);
    int ro = open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(ro, 0);
    EXPECT_EQ(ote_file_register(e_, nullptr, ro, 0, 8192, OTE_PERM_WRITE, nullptr, &a),
              OTE_ERR_ACCESS);
    EXPECT_TRUE(LogContains("does not allow OTE_PERM_WRITE"));
    int wo = open(f.path.c_str(), O_WRONLY | O_CLOEXEC);
    ASSERT_GE(wo, 0);
    EXPECT_EQ(ote_file_register(e_, nullptr, wo, 0, 8192, OTE_PERM_READ, nullptr, &a),
              OTE_ERR_ACCESS);
    close(wo);
    EXPECT_EQ(ote_file_register(e_, nullptr, ro, 0, 8193, OTE_PERM_READ, nullptr, &a),
              OTE_ERR_INVALID); // past the end
    EXPECT_EQ(ote_file_register(e_, f.path.c_str(), ro, 0, 1, OTE_PERM_READ, nullptr, &a),
              OTE_ERR_INVALID); // both
    EXPECT_EQ(ote_file_register(e_, nullptr, ro, 0, 0, OTE_PERM_READ, nullptr, &a),
              OTE_ERR_INVALID);
    EXPECT_EQ(ote_file_register(e_, nullptr, ro, 0, 1, 0, nullptr, &a), OTE_ERR_INVALID);
    // A read-only registration (by fd; the caller's fd stays the caller's).
    ASSERT_EQ(ote_file_register(e_, nullptr, ro, 0, 8192, OTE_PERM_READ, "ro", &a), OTE_OK);
    close(ro);
    uint64_t b2 = 0;
    EXPECT_EQ(ote_file_register(e_, f.path.c_str(), -1, 0, 10, OTE_PERM_READ, "ro", &b2),
              OTE_ERR_EXISTS);
    ote_buffer_info_t info{};
    ASSERT_EQ(ote_file_query(e_, a + 100, &info), OTE_OK);
    EXPECT_EQ(info.kind, static_cast<uint32_t>(OTE_MEM_FILE));
    EXPECT_EQ(info.addr, a);
    EXPECT_EQ(info.length, 8192u);
    EXPECT_STREQ(info.name, "ro");
    EXPECT_EQ(ote_file_query(e_, a + 8192, &info), OTE_ERR_NOT_FOUND);
    std::vector<uint8_t> buf(100, 0xee);
    ote_transfer_status_ex_t s = Move(OTE_WRITE, buf.data(), a, buf.size());
    EXPECT_EQ(s.state, OTE_TRANSFER_FAILED);
    EXPECT_EQ(ote_status_code(s.error), OTE_ERR_ACCESS);
    EXPECT_EQ(f.Read()[0], Pat(0, 7));
    s = Move(OTE_READ, buf.data(), a, buf.size()); // READ is allowed
    EXPECT_EQ(s.state, OTE_TRANSFER_COMPLETED);
    EXPECT_EQ(buf[0], Pat(0, 7));
    s = Move(OTE_READ, buf.data(), 0x1000, buf.size()); // no registration there
    EXPECT_EQ(ote_status_code(s.error), OTE_ERR_ACCESS);
    EXPECT_EQ(ote_file_unregister(e_, a + 1), OTE_ERR_NOT_FOUND);
    EXPECT_EQ(ote_file_unregister(e_, a), OTE_OK);
    EXPECT_EQ(ote_file_unregister(e_, a), OTE_ERR_NOT_FOUND);
}

// ote_batch_cancel reaches operations in flight (held there by file.stall): CANCELED,
// no byte moved, the registration BUSY until they ended, then free.
TEST_P(FileTest, CancelReachesInFlightIo) {
    Start({{"file_chunk_size", "64K"}, {"file_queue_depth", "2"}});
    TmpFile f("cancel.bin", 1u << 20);
    uint64_t a = Register(f, 0, 1u << 20, OTE_PERM_READ | OTE_PERM_WRITE);
    ASSERT_EQ(ote_fault_arm(kStall, OTE_FAULT_EVERY, 0, OTE_ERR_FAULT, 0), OTE_OK);
    std::vector<uint8_t> buf(256u << 10, 0x11);
    ote_request_t r{OTE_READ, buf.data(), seg_, a, buf.size()};
    ASSERT_EQ(ote_batch_submit(b_, &r, 1), OTE_OK);
    EXPECT_EQ(ote_batch_wait(b_, 50ull * 1000 * 1000), OTE_ERR_TIMEOUT);
    EXPECT_GE(ote_fault_hits(kStall), 4u); // every chunk submitted (2 in flight, 2 queued)
    EXPECT_EQ(ote_file_unregister(e_, a), OTE_ERR_BUSY);
    ASSERT_EQ(ote_batch_cancel(b_), OTE_OK);
    EXPECT_EQ(ote_batch_wait(b_, 10ull * 1000 * 1000 * 1000), OTE_ERR_CANCELED);
    ote_transfer_status_ex_t s{};
    s.struct_size = sizeof(s);
    ASSERT_EQ(ote_batch_status_ex(b_, 0, &s), OTE_OK);
    EXPECT_EQ(s.state, OTE_TRANSFER_CANCELED);
    EXPECT_EQ(s.bytes_done, 0u);
    for (uint8_t v : buf) ASSERT_EQ(v, 0x11);
    ote_fault_disarm(kStall);
    s = Move(OTE_READ, buf.data(), a, buf.size()); // the engine goes on
    EXPECT_EQ(s.state, OTE_TRANSFER_COMPLETED);
    EXPECT_EQ(ote_file_unregister(e_, a), OTE_OK);
}

// transfer_timeout_ms reaches operations in flight: TIMEOUT, nothing written.
TEST_P(FileTest, DeadlineReachesInFlightIo) {
    Start({{"transfer_timeout_ms", "200"}, {"file_chunk_size", "64K"}});
    TmpFile f("deadline.bin", 256u << 10);
    uint64_t a = Register(f, 0, 256u << 10, OTE_PERM_WRITE);
    ASSERT_EQ(ote_fault_arm(kStall, OTE_FAULT_EVERY, 0, OTE_ERR_FAULT, 0), OTE_OK);
    std::vector<uint8_t> buf(200000, 0x77);
    ote_transfer_status_ex_t s = Move(OTE_WRITE, buf.data(), a, buf.size());
    EXPECT_EQ(s.state, OTE_TRANSFER_TIMEOUT);
    EXPECT_EQ(ote_status_code(s.error), OTE_ERR_TIMEOUT);
    EXPECT_EQ(s.bytes_done, 0u);
    std::vector<uint8_t> got = f.Read();
    for (uint64_t i = 0; i < got.size(); i++) ASSERT_EQ(got[i], Pat(i, 7)) << i;
}

// The io_uring fixed-file slots the registration's DEBUG line names for path (its fd, its
// O_DIRECT descriptor; -1: the plain descriptor), from its last such line.
std::pair<int, int> FixedSlots(const std::vector<std::string> &logs, const std::string &path) {
    std::pair<int, int> got{-2, -2};
    for (const std::string &l : logs) {
        if (l.find("registered " + path + " ") == std::string::npos) continue;
        size_t at = l.find("io_uring fixed files ");
        if (at == std::string::npos) continue;
        if (sscanf(l.c_str() + at, "io_uring fixed files %d, %d)", &got.first, &got.second) != 2)
            got = {-3, -3};
    }
    return got;
}

// The O_DIRECT alignment of each registration is what statx(STATX_DIOALIGN) reports for
// the file (the DEBUG line says so), and it decides which chunks go O_DIRECT: an offset
// aligned to the reported one but not to 4 KiB goes O_DIRECT where the file system
// reports less than 4 KiB, and one aligned to 4 KiB but not to a larger one goes buffered.
TEST_P(FileTest, DirectAlignmentFromStatx) {
    if (!DirectSupported()) GTEST_SKIP() << TmpDir() << " does not take O_DIRECT (tmpfs?)";
    Start({{"log_level", "debug"}, {"file_chunk_size", "1M"}});
    const uint64_t n = 1u << 20;
    TmpFile f("dioalign.bin", n);
    struct statx sx {};
    int fd = open(f.path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx), 0);
    close(fd);
    uint32_t mem = 4096, off = 4096;
    std::string how = "assumed";
    if ((sx.stx_mask & STATX_DIOALIGN) != 0 && sx.stx_dio_offset_align != 0 &&
        sx.stx_dio_mem_align != 0) {
        mem = sx.stx_dio_mem_align;
        off = sx.stx_dio_offset_align;
        how = "statx";
    }
    uint64_t a = Register(f, 0, n, OTE_PERM_READ);
    std::string want = "O_DIRECT alignment: memory " + std::to_string(mem) + ", offset " +
                       std::to_string(off) + " (" + how;
    EXPECT_TRUE(LogContains(want)) << want;
    const uint64_t blk = std::max<uint64_t>({off, mem, 4096}); // length and buffer: aligned
    Buf buf = Alloc(2 * blk);
    // At the reported alignment: O_DIRECT (below 4 KiB too).
    ote_transfer_status_ex_t s = Move(OTE_READ, buf.get(), a + off, blk);
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    EXPECT_EQ(s.file_io, OTE_FILE_IO_DIRECT);
    for (uint64_t i = 0; i < blk; i++) ASSERT_EQ(buf.get()[i], Pat(off + i, 7)) << i;
    // Half the reported alignment (where that is still a 512 B multiple): buffered.
    if (off >= 1024) {
        s = Move(OTE_READ, buf.get(), a + off / 2, blk);
        ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
        EXPECT_EQ(s.file_io, OTE_FILE_IO_BUFFERED);
        for (uint64_t i = 0; i < blk; i++) ASSERT_EQ(buf.get()[i], Pat(off / 2 + i, 7)) << i;
    }
}

// A WRITE goes O_DIRECT only where its file offset and length are whole pages as well:
// a sub-page O_DIRECT write and a buffered write of the same page's other bytes could
// run at once (two requests in flight), and the page cache's copy of that page would
// overwrite the direct bytes at writeback. A READ keeps the reported alignment.
TEST_P(FileTest, SubPageWritesGoThroughThePageCache) {
    if (!DirectSupported()) GTEST_SKIP() << TmpDir() << " does not take O_DIRECT (tmpfs?)";
    Start({{"log_level", "debug"}, {"file_chunk_size", "1M"}});
    const uint64_t n = 1u << 20, page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    TmpFile f("subpage.bin", n);
    uint64_t a = Register(f, 0, n, OTE_PERM_READ | OTE_PERM_WRITE);
    std::string line;
    for (const std::string &l : Logs())
        if (l.find("subpage.bin") != std::string::npos &&
            l.find("writes' offset") != std::string::npos)
            line = l;
    ASSERT_FALSE(line.empty()) << "no registration DEBUG line with the writes' alignment";
    size_t at = line.find("writes' offset ") + strlen("writes' offset ");
    const uint64_t woff = std::stoull(line.substr(at));
    at = line.find("offset ", line.find("memory ")) + strlen("offset ");
    const uint64_t off = std::stoull(line.substr(at));
    EXPECT_EQ(woff, std::max(off, page)) << line;
    Buf buf = Alloc(4 * woff);
    for (uint64_t i = 0; i < 2 * woff; i++) buf.get()[i] = static_cast<uint8_t>(i * 3 + 1);
    // Whole pages: O_DIRECT.
    ote_transfer_status_ex_t s = Move(OTE_WRITE, buf.get(), a + woff, 2 * woff);
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    EXPECT_EQ(s.file_io, OTE_FILE_IO_DIRECT);
    if (off < woff) { // the file system reports sub-page O_DIRECT (512 B on ext4 here)
        // At the reported alignment, not at a page: through the page cache ...
        s = Move(OTE_WRITE, buf.get(), a + 4 * woff + off, 2 * woff);
        ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
        EXPECT_EQ(s.file_io, OTE_FILE_IO_BUFFERED);
        // ... while a READ there still goes O_DIRECT, and sees the bytes.
        Buf back = Alloc(2 * woff);
        s = Move(OTE_READ, back.get(), a + 4 * woff + off, 2 * woff);
        ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
        EXPECT_EQ(s.file_io, OTE_FILE_IO_DIRECT);
        EXPECT_EQ(memcmp(back.get(), buf.get(), 2 * woff), 0);
    }
    std::vector<uint8_t> b = f.Read();
    ASSERT_EQ(b.size(), n);
    EXPECT_EQ(memcmp(b.data() + woff, buf.get(), 2 * woff), 0);
    EXPECT_EQ(b[woff - 1], Pat(woff - 1, 7));
    EXPECT_EQ(b[3 * woff], Pat(3 * woff, 7));
}

// Each registration's descriptors take slots of the ring's registered-file table (io_uring:
// slots >= 0, the bytes move through them; the thread pool: plain descriptors), and the
// slots of an unregistered file are what the next registration gets.
TEST_P(FileTest, FixedFilesUsedAndSlotsReused) {
    Start({{"log_level", "debug"}, {"file_chunk_size", "64K"}});
    const bool uring = std::string(GetParam()) != "threads";
    TmpFile fa("fixa.bin", 300000, 1), fb("fixb.bin", 300000, 2), fc("fixc.bin", 300000, 3);
    uint64_t a = Register(fa, 0, 300000, OTE_PERM_READ | OTE_PERM_WRITE);
    uint64_t b = Register(fb, 0, 300000, OTE_PERM_READ | OTE_PERM_WRITE);
    std::pair<int, int> sa = FixedSlots(Logs(), fa.path), sb = FixedSlots(Logs(), fb.path);
    if (uring) {
        EXPECT_GE(sa.first, 0);
        EXPECT_GE(sb.first, 0);
        EXPECT_NE(sa.first, sb.first);
        if (DirectSupported()) {
            EXPECT_GE(sa.second, 0);
        }
    } else {
        EXPECT_EQ(sa, std::make_pair(-1, -1));
        EXPECT_EQ(sb, std::make_pair(-1, -1));
    }
    std::vector<uint8_t> buf(250001);
    ote_transfer_status_ex_t s = Move(OTE_READ, buf.data(), b + 7, buf.size());
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    for (size_t i = 0; i < buf.size(); i++) ASSERT_EQ(buf[i], Pat(7 + i, 2)) << i;
    EXPECT_EQ(ote_file_unregister(e_, a), OTE_OK);
    uint64_t c = Register(fc, 0, 300000, OTE_PERM_READ | OTE_PERM_WRITE);
    std::pair<int, int> sc = FixedSlots(Logs(), fc.path);
    if (uring) {
        std::vector<int> was{sa.first, sa.second}, now{sc.first, sc.second};
        std::sort(was.begin(), was.end());
        std::sort(now.begin(), now.end());
        EXPECT_EQ(was, now); // a's slots, freed at unregister, reused
    } else {
        EXPECT_EQ(sc, std::make_pair(-1, -1));
    }
    for (size_t i = 0; i < buf.size(); i++) buf[i] = Pat(i, 77);
    s = Move(OTE_WRITE, buf.data(), c + 3, buf.size());
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    std::vector<uint8_t> got = fc.Read();
    for (size_t i = 0; i < got.size(); i++) {
        bool in = i >= 3 && i < 3 + buf.size();
        ASSERT_EQ(got[i], in ? Pat(i - 3, 77) : Pat(i, 3)) << i;
    }
    got = fb.Read(); // b untouched by c's write through the slot a had
    for (size_t i = 0; i < got.size(); i++) ASSERT_EQ(got[i], Pat(i, 2)) << i;
}

// A registered-file slot the kernel refuses (file.fixed_file stands for ENOMEM): one INFO
// line, the plain descriptor, and bytes still move right.
TEST_P(FileTest, FixedFileRefusedUsesPlainFd) {
    Start({{"log_level", "debug"}, {"file_chunk_size", "64K"}});
    ASSERT_EQ(ote_fault_arm(kFixedFile, OTE_FAULT_EVERY, 0, OTE_ERR_FAULT, ENOMEM), OTE_OK);
    TmpFile f("fixno.bin", 200000, 5);
    uint64_t a = Register(f, 0, 200000, OTE_PERM_READ);
    EXPECT_EQ(FixedSlots(Logs(), f.path), std::make_pair(-1, -1));
    if (std::string(GetParam()) != "threads") {
        EXPECT_GE(ote_fault_hits(kFixedFile), 1u);
        EXPECT_TRUE(LogContains("no io_uring registered-file slot"));
    }
    std::vector<uint8_t> buf(150000);
    ote_transfer_status_ex_t s = Move(OTE_READ, buf.data(), a + 1, buf.size());
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    for (size_t i = 0; i < buf.size(); i++) ASSERT_EQ(buf[i], Pat(1 + i, 5)) << i;
}

INSTANTIATE_TEST_SUITE_P(Engines, FileTest, ::testing::Values("uring", "threads"),
                         [](const ::testing::TestParamInfo<const char *> &p) {
                             return std::string(p.param);
                         });

class FileFallbackTest : public ote_test::OteTest {};

// file_engine=auto where io_uring_queue_init fails (file.uring_init stands for ENOSYS):
// the thread pool takes over with one INFO line, and bytes still move right;
// file_engine=uring refuses instead.
TEST_F(FileFallbackTest, AutoFallsBackToThreads) {
    ASSERT_EQ(ote_fault_arm(kUringInit, OTE_FAULT_EVERY, 0, OTE_ERR_FAULT, 0), OTE_OK);
    for (const char *mode : {"auto", "uring"}) {
        ote_config_t *cfg = nullptr;
        ASSERT_EQ(ote_config_create(&cfg), OTE_OK);
        ASSERT_EQ(ote_config_set(cfg, "listen_address", "127.0.0.1:0"), OTE_OK);
        ASSERT_EQ(ote_config_set(cfg, "transports", "tcp"), OTE_OK);
        ASSERT_EQ(ote_config_set(cfg, "file_engine", mode), OTE_OK);
        ASSERT_EQ(ote_config_set(cfg, "log_level", "info"), OTE_OK);
        ote_engine_t *e = nullptr;
        ASSERT_EQ(ote_engine_create(cfg, &e), OTE_OK);
        ote_config_destroy(cfg);
        TmpFile f("fallback.bin", 100000);
        uint64_t a = 0;
        ote_status_t st = ote_file_register(e, f.path.c_str(), -1, 0, 100000,
                                            OTE_PERM_READ | OTE_PERM_WRITE, nullptr, &a);
        if (std::string(mode) == "uring") {
            EXPECT_EQ(ote_status_code(st), OTE_ERR_UNSUPPORTED);
            EXPECT_EQ(ote_status_errno(st), ENOSYS);
            EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
            continue;
        }
        ASSERT_EQ(st, OTE_OK);
        EXPECT_TRUE(LogContains("io_uring unavailable"));
        char kind[16] = {};
        ASSERT_EQ(ote_file_engine(e, kind, sizeof(kind)), OTE_OK);
        EXPECT_STREQ(kind, "threads");
        ote_segment_t *seg = nullptr;
        ote_batch_t *b = nullptr;
        ASSERT_EQ(ote_segment_open_local(e, &seg), OTE_OK);
        ASSERT_EQ(ote_batch_create(e, 2, &b), OTE_OK);
        std::vector<uint8_t> in(99000);
        for (size_t i = 0; i < in.size(); i++) in[i] = Pat(i, 42);
        std::vector<uint8_t> out(99000);
        ote_request_t w{OTE_WRITE, in.data(), seg, a + 1000, in.size()};
        ASSERT_EQ(ote_batch_submit(b, &w, 1), OTE_OK);
        ASSERT_EQ(ote_batch_wait(b, 30ull * 1000 * 1000 * 1000), OTE_OK);
        ote_request_t r{OTE_READ, out.data(), seg, a + 1000, out.size()};
        ASSERT_EQ(ote_batch_submit(b, &r, 1), OTE_OK);
        ASSERT_EQ(ote_batch_wait(b, 30ull * 1000 * 1000 * 1000), OTE_OK);
        EXPECT_EQ(in, out);
        EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
        EXPECT_EQ(ote_segment_close(seg), OTE_OK);
        EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
    }
}

} // namespace

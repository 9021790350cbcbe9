// A peer's requests to file registrations (engine/file through host->file): over tcp the
// source reads the file into a bounce buffer and sends it (READ), or writes the bytes it
// received (WRITE); shm does not serve file registrations yet and refuses them whole
// (OTE_ERR_ACCESS). Two engines of this process talk over loopback.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include "ote/ote.h"
}

#include "tests/util/test_base.h"

namespace {

constexpr uint64_t kWaitNs = 30ull * 1000 * 1000 * 1000;

std::string TmpPath(const char *name) {
    const char *d = getenv("TEST_TMPDIR");
    return std::string(d != nullptr ? d : "/tmp") + "/" + name;
}

uint8_t Pat(uint64_t i) { return static_cast<uint8_t>(i * 7 + (i >> 11)); }

class FileRemoteTest : public ote_test::OteTest {
  protected:
    ote_engine_t *Engine(const char *transports) {
        ote_config_t *cfg = nullptr;
        EXPECT_EQ(ote_config_create(&cfg), OTE_OK);
        EXPECT_EQ(ote_config_set(cfg, "listen_address", "127.0.0.1:0"), OTE_OK);
        EXPECT_EQ(ote_config_set(cfg, "transports", transports), OTE_OK);
        EXPECT_EQ(ote_config_set(cfg, "slice_size", "64K"), OTE_OK);
        ote_engine_t *e = nullptr;
        EXPECT_EQ(ote_engine_create(cfg, &e), OTE_OK);
        ote_config_destroy(cfg);
        return e;
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
    ote_transfer_status_t Move(ote_batch_t *b, ote_segment_t *seg, ote_opcode_t op, void *local,
                               uint64_t remote, size_t len) {
        EXPECT_EQ(ote_batch_reset(b), OTE_OK);
        ote_request_t r{op, local, seg, remote, len};
        EXPECT_EQ(ote_batch_submit(b, &r, 1), OTE_OK);
        (void)ote_batch_wait(b, kWaitNs);
        ote_transfer_status_t s{};
        EXPECT_EQ(ote_batch_status(b, 0, &s), OTE_OK);
        return s;
    }
};

TEST_F(FileRemoteTest, TcpPeerReadsAndWritesAFile) {
    const uint64_t n = 1u << 20;
    std::string path = TmpPath("remote_tcp.bin");
    MakeFile(path, n);
    ote_engine_t *src = Engine("tcp"), *req = Engine("tcp");
    uint64_t a = 0;
    ASSERT_EQ(ote_file_register(src, path.c_str(), -1, 4096, n - 4096,
                                OTE_PERM_READ | OTE_PERM_WRITE, "kv", &a),
              OTE_OK);
    char addr[272];
    ASSERT_EQ(ote_engine_address(src, addr, sizeof(addr)), OTE_OK);
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_segment_open(req, addr, &seg), OTE_OK);
    ote_batch_t *b = nullptr;
    ASSERT_EQ(ote_batch_create(req, 1, &b), OTE_OK);

    std::vector<uint8_t> buf(300001);
    ote_transfer_status_t s = Move(b, seg, OTE_READ, buf.data(), a + 77, buf.size());
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    for (size_t i = 0; i < buf.size(); i++) ASSERT_EQ(buf[i], Pat(4096 + 77 + i)) << i;

    for (size_t i = 0; i < buf.size(); i++) buf[i] = static_cast<uint8_t>(~Pat(i));
    s = Move(b, seg, OTE_WRITE, buf.data(), a + 1000, buf.size());
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    std::vector<uint8_t> got = ReadFile(path, n);
    for (uint64_t i = 0; i < n; i++) {
        bool in = i >= 5096 && i < 5096 + buf.size();
        ASSERT_EQ(got[i], in ? static_cast<uint8_t>(~Pat(i - 5096)) : Pat(i)) << i;
    }
    // Outside the registration: refused whole, nothing written.
    s = Move(b, seg, OTE_WRITE, buf.data(), a + (n - 4096) - 10, 11);
    EXPECT_EQ(s.state, OTE_TRANSFER_FAILED);
    EXPECT_EQ(ote_status_code(s.error), OTE_ERR_ACCESS);
    // The file truncated under the registration: the READ fails, the peer says why.
    ASSERT_EQ(truncate(path.c_str(), 8192), 0);
    s = Move(b, seg, OTE_READ, buf.data(), a, 100000);
    EXPECT_EQ(s.state, OTE_TRANSFER_FAILED);
    EXPECT_NE(ote_status_code(s.error), OTE_OK);

    EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(ote_file_unregister(src, a), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
    unlink(path.c_str());
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
    ote_engine_t *src = Engine("tcp"), *req = Engine("tcp");
    uint64_t a = 0;
    ASSERT_EQ(
        ote_file_register(src, path.c_str(), -1, 0, n, OTE_PERM_READ | OTE_PERM_WRITE, nullptr, &a),
        OTE_OK);
    char addr[272];
    ASSERT_EQ(ote_engine_address(src, addr, sizeof(addr)), OTE_OK);
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_segment_open(req, addr, &seg), OTE_OK);
    ote_batch_t *b = nullptr;
    ASSERT_EQ(ote_batch_create(req, 1, &b), OTE_OK);

    std::vector<uint8_t> buf(2u << 20);
    for (int round = 0; round < 5; round++) {
        std::fill(buf.begin(), buf.end(), 0);
        ote_transfer_status_t s = Move(b, seg, OTE_READ, buf.data(), a + 65536, buf.size());
        ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
        for (size_t i = 0; i < buf.size(); i++) ASSERT_EQ(buf[i], Pat(65536 + i)) << i;
    }
    // 1 MiB + 100 bytes: sixteen aligned slices, then a 100-byte one.
    const size_t wl = (1u << 20) + 100;
    for (size_t i = 0; i < wl; i++) buf[i] = static_cast<uint8_t>(~Pat(i));
    ote_transfer_status_t s = Move(b, seg, OTE_WRITE, buf.data(), a + (1u << 20), wl);
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    std::vector<uint8_t> got = ReadFile(path, n);
    for (uint64_t i = 0; i < n; i++) {
        bool in = i >= (1u << 20) && i < (1u << 20) + wl;
        ASSERT_EQ(got[i], in ? static_cast<uint8_t>(~Pat(i - (1u << 20))) : Pat(i)) << i;
    }
    // Read back through the source: what the WRITE left, O_DIRECT and buffered slices alike.
    std::vector<uint8_t> back(wl);
    s = Move(b, seg, OTE_READ, back.data(), a + (1u << 20), wl);
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    for (size_t i = 0; i < wl; i++) ASSERT_EQ(back[i], static_cast<uint8_t>(~Pat(i))) << i;

    ASSERT_EQ(truncate(path.c_str(), 65536 + 4096 + 100), 0);
    s = Move(b, seg, OTE_READ, buf.data(), a + 65536, 65536);
    EXPECT_EQ(s.state, OTE_TRANSFER_FAILED);
    EXPECT_EQ(ote_status_code(s.error), OTE_ERR_REMOTE) << ote_status_str(s.error);

    EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(ote_file_unregister(src, a), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
    unlink(path.c_str());
}

// shm serves file registrations as tcp does, through host->file's bounce buffers, in both
// of its modes (auto: cross-memory attach; ring: the shared ring): READ and WRITE of
// unaligned and aligned ranges, a request outside the registration refused whole.
class FileShmTest : public FileRemoteTest, public ::testing::WithParamInterface<const char *> {
  protected:
    ote_engine_t *ShmEngine() {
        ote_config_t *cfg = nullptr;
        EXPECT_EQ(ote_config_create(&cfg), OTE_OK);
        EXPECT_EQ(ote_config_set(cfg, "transports", "shm"), OTE_OK);
        EXPECT_EQ(ote_config_set(cfg, "shm_mode", GetParam()), OTE_OK);
        ote_engine_t *e = nullptr;
        EXPECT_EQ(ote_engine_create(cfg, &e), OTE_OK);
        ote_config_destroy(cfg);
        return e;
    }
};

TEST_P(FileShmTest, PeerReadsAndWritesAFile) {
    const uint64_t n = 2u << 20;
    std::string path = TmpPath((std::string("remote_shm_") + GetParam() + ".bin").c_str());
    MakeFile(path, n);
    ote_engine_t *src = ShmEngine(), *req = ShmEngine();
    uint64_t a = 0;
    ASSERT_EQ(ote_file_register(src, path.c_str(), -1, 4096, n - 4096,
                                OTE_PERM_READ | OTE_PERM_WRITE, nullptr, &a),
              OTE_OK);
    char addr[272];
    ASSERT_EQ(ote_engine_address(src, addr, sizeof(addr)), OTE_OK);
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_segment_open(req, addr, &seg), OTE_OK);
    ote_segment_info_t info{};
    ASSERT_EQ(ote_segment_info(seg, &info), OTE_OK);
    ASSERT_STREQ(info.transport, "shm");
    ote_batch_t *b = nullptr;
    ASSERT_EQ(ote_batch_create(req, 1, &b), OTE_OK);

    std::vector<uint8_t> buf(300001);
    ote_transfer_status_t s = Move(b, seg, OTE_READ, buf.data(), a + 77, buf.size());
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    for (size_t i = 0; i < buf.size(); i++) ASSERT_EQ(buf[i], Pat(4096 + 77 + i)) << i;
    std::vector<uint8_t> big(1u << 20); // aligned: file offset 64 KiB, 1 MiB
    s = Move(b, seg, OTE_READ, big.data(), a + 61440, big.size());
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    for (size_t i = 0; i < big.size(); i++) ASSERT_EQ(big[i], Pat(65536 + i)) << i;

    for (size_t i = 0; i < buf.size(); i++) buf[i] = static_cast<uint8_t>(~Pat(i));
    s = Move(b, seg, OTE_WRITE, buf.data(), a + 1000, buf.size());
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    for (size_t i = 0; i < big.size(); i++) big[i] = static_cast<uint8_t>(Pat(i) ^ 0x5a);
    s = Move(b, seg, OTE_WRITE, big.data(), a + 1044480, big.size()); // file offset 1 MiB
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    std::vector<uint8_t> got = ReadFile(path, n);
    for (uint64_t i = 0; i < n; i++) {
        uint8_t want = Pat(i);
        if (i >= 5096 && i < 5096 + buf.size()) want = static_cast<uint8_t>(~Pat(i - 5096));
        if (i >= (1u << 20)) want = static_cast<uint8_t>(Pat(i - (1u << 20)) ^ 0x5a);
        ASSERT_EQ(got[i], want) << i;
    }
    // Outside the registration: refused whole, nothing written.
    s = Move(b, seg, OTE_WRITE, buf.data(), a + (n - 4096) - 10, 11);
    EXPECT_EQ(s.state, OTE_TRANSFER_FAILED);
    EXPECT_EQ(ote_status_code(s.error), OTE_ERR_ACCESS);
    EXPECT_EQ(ReadFile(path, n)[n - 11], Pat(n - 1u - (1u << 20) - 10) ^ 0x5a);

    EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(ote_file_unregister(src, a), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
    unlink(path.c_str());
}

INSTANTIATE_TEST_SUITE_P(Modes, FileShmTest, ::testing::Values("auto", "ring"));

} // namespace

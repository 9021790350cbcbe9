// GPUDirect Storage for the local segment (engine/file/gds.c, docs/files.md): requests
// between device memory of the fake libcuda and a file registration, moved by the fake
// libcufile (tests/cuda/fake_cufile.c) when it loads, else staged through pinned host
// chunks (engine/gpu) with the file owner's I/O engine on the host side. Bytes are
// compared through the fake driver's copies (DevFill / DevRead); the path shows in
// ote_transfer_status_ex_t.file_io (OTE_FILE_IO_GDS) and ote_gpu_stats_t.staged_requests.
// The fake cuFile's counters prove that no buffer registration, file handle or driver
// open outlives its owner; its fault hooks fail cuFileRead (EIO), cuFileDriverOpen and
// cuFileBufRegister.
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/cuda/fake_cufile_control.h"

extern "C" {
#include "base/fault.h"
#include "tests/engine/pattern.h"
}
#include "tests/engine/gpu_fixture.h"

extern "C" {
#include "ote/ote.h"
}

namespace {

std::string Runfile(const char *rel) {
    const char *srcdir = std::getenv("TEST_SRCDIR");
    const char *ws = std::getenv("TEST_WORKSPACE");
    if (srcdir == nullptr || ws == nullptr) return rel;
    return std::string(srcdir) + "/" + ws + "/" + rel;
}
std::string TmpDir() {
    const char *d = std::getenv("TEST_TMPDIR");
    return d != nullptr ? d : "/tmp";
}
uint8_t Pat(uint64_t i, uint8_t seed) { return static_cast<uint8_t>((i * 131 + seed) ^ (i >> 9)); }

// The fake libcufile's control API on the library the engine loads (the same file, so
// the same instance: dlopen returns the loaded one).
struct FakeCufile {
    void *dl = nullptr;
    fake_cufile_fail_fn fail = nullptr;
    fake_cufile_clear_faults_fn clear = nullptr;
    fake_cufile_counters_fn counters = nullptr;
    explicit FakeCufile(const std::string &path) {
        dl = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
        if (dl == nullptr) return;
        fail = reinterpret_cast<fake_cufile_fail_fn>(dlsym(dl, "fake_cufile_fail"));
        clear =
            reinterpret_cast<fake_cufile_clear_faults_fn>(dlsym(dl, "fake_cufile_clear_faults"));
        counters = reinterpret_cast<fake_cufile_counters_fn>(dlsym(dl, "fake_cufile_counters"));
    }
    ~FakeCufile() {
        if (clear != nullptr) clear();
        if (dl != nullptr) dlclose(dl);
    }
    fake_cufile_counters_t Now() const {
        fake_cufile_counters_t c{};
        counters(&c);
        return c;
    }
};

class GdsFileTest : public ote_gpu_test::GpuTest {
  protected:
    static constexpr uint64_t kFile = (2u << 20) + 8192;

    void SetUp() override {
        GpuTest::SetUp();
        if (IsSkipped()) return;
        path_ = TmpDir() + "/gds.bin";
        std::vector<uint8_t> b(kFile);
        for (uint64_t i = 0; i < kFile; i++) b[i] = Pat(i, 7);
        int fd = open(path_.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
        ASSERT_GE(fd, 0);
        ASSERT_EQ(write(fd, b.data(), kFile), static_cast<ssize_t>(kFile));
        close(fd);
    }
    // cufile: the fake's path in $OTE_CUFILE_LIBRARY, else a library that does not exist.
    void Start(bool cufile) {
        setenv("OTE_CUFILE_LIBRARY",
               cufile ? Runfile("tests/cuda/libfake_cufile.so").c_str()
                      : "/nonexistent/libcufile.so.0",
               1);
        ote_config_t *cfg = nullptr;
        ASSERT_EQ(ote_config_create(&cfg), OTE_OK);
        ASSERT_EQ(ote_config_set(cfg, "listen_address", "127.0.0.1:0"), OTE_OK);
        ASSERT_EQ(ote_config_set(cfg, "transports", "tcp"), OTE_OK);
        ASSERT_EQ(ote_config_set(cfg, "log_level", "info"), OTE_OK);
        ASSERT_EQ(ote_config_set(cfg, "file_chunk_size", "256K"), OTE_OK);
        ASSERT_EQ(ote_engine_create(cfg, &e_), OTE_OK);
        ote_config_destroy(cfg);
        ASSERT_EQ(ote_segment_open_local(e_, &seg_), OTE_OK);
        ASSERT_EQ(ote_batch_create(e_, 8, &b_), OTE_OK);
        ASSERT_EQ(ote_file_register(e_, path_.c_str(), -1, 0, kFile, OTE_PERM_READ | OTE_PERM_WRITE,
                                    nullptr, &faddr_),
                  OTE_OK);
    }
    void Stop() {
        if (b_ != nullptr) {
            ote_batch_cancel(b_);
            ote_batch_wait(b_, 10ull * 1000 * 1000 * 1000);
            EXPECT_EQ(ote_batch_destroy(b_), OTE_OK);
            b_ = nullptr;
        }
        if (faddr_ != 0) {
            EXPECT_EQ(ote_file_unregister(e_, faddr_), OTE_OK);
        }
        faddr_ = 0;
        if (seg_ != nullptr) {
            EXPECT_EQ(ote_segment_close(seg_), OTE_OK);
        }
        seg_ = nullptr;
        if (e_ != nullptr) {
            EXPECT_EQ(ote_engine_destroy(e_), OTE_OK);
        }
        e_ = nullptr;
    }
    void TearDown() override {
        Stop();
        unlink(path_.c_str());
        GpuTest::TearDown();
    }
    ote_transfer_status_ex_t Move(ote_opcode_t op, uint64_t dev, uint64_t foff, size_t len) {
        EXPECT_EQ(ote_batch_reset(b_), OTE_OK);
        ote_request_t r{op, reinterpret_cast<void *>(dev), seg_, faddr_ + foff, len};
        EXPECT_EQ(ote_batch_submit(b_, &r, 1), OTE_OK);
        (void)ote_batch_wait(b_, 30ull * 1000 * 1000 * 1000);
        ote_transfer_status_ex_t s{};
        s.struct_size = sizeof(s);
        EXPECT_EQ(ote_batch_status_ex(b_, 0, &s), OTE_OK);
        return s;
    }
    std::vector<uint8_t> FileBytes(uint64_t off, size_t len) {
        std::vector<uint8_t> b(len);
        int fd = open(path_.c_str(), O_RDONLY | O_CLOEXEC);
        EXPECT_GE(fd, 0);
        EXPECT_EQ(pread(fd, b.data(), len, static_cast<off_t>(off)), static_cast<ssize_t>(len));
        close(fd);
        return b;
    }
    uint64_t Staged() {
        ote_gpu_stats_t g{};
        EXPECT_EQ(ote_engine_gpu_stats(e_, &g), OTE_OK);
        return g.staged_requests;
    }
    // READ file -> device and WRITE device -> file of len bytes at file offset foff, the
    // bytes compared through the driver; the two statuses' file_io in io_out.
    void RoundTrip(uint64_t foff, size_t len, uint32_t io_out[2]) {
        uint64_t dev = DevAlloc(len + 64);
        ASSERT_NE(dev, 0u);
        ote_transfer_status_ex_t s = Move(OTE_READ, dev + 1, foff, len);
        ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error) << LogText();
        EXPECT_EQ(s.bytes_done, len);
        io_out[0] = s.file_io;
        std::vector<uint8_t> got = DevRead(dev + 1, len);
        for (size_t i = 0; i < len; i++) ASSERT_EQ(got[i], Pat(foff + i, 7)) << i;
        std::vector<uint8_t> src(len);
        for (size_t i = 0; i < len; i++) src[i] = Pat(i, 99);
        ASSERT_EQ(t_->cuMemcpyHtoD(dev + 1, src.data(), len), 0);
        ASSERT_EQ(t_->cuStreamSynchronize(nullptr), 0);
        uint64_t woff = foff + 4096;
        s = Move(OTE_WRITE, dev + 1, woff, len);
        ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
        io_out[1] = s.file_io;
        EXPECT_EQ(FileBytes(woff, len), src);
        // Nothing outside the range: the bytes around it are the original pattern.
        EXPECT_EQ(FileBytes(woff - 1, 1)[0], Pat(woff - 1, 7));
        EXPECT_EQ(FileBytes(woff + len, 1)[0], Pat(woff + len, 7));
    }

    std::string LogText() {
        std::string t;
        for (const std::string &l : Logs()) t += "\n  " + l;
        return t;
    }

    std::string path_;
    ote_engine_t *e_ = nullptr;
    ote_segment_t *seg_ = nullptr;
    ote_batch_t *b_ = nullptr;
    uint64_t faddr_ = 0;
};

// Over the fake libcufile: every chunk by cuFileRead / cuFileWrite, none staged; the
// buffer registrations end with each call, the handle with the file registration and
// the driver open with the engine.
TEST_F(GdsFileTest, RoundTripOverGds) {
    REQUIRE_FAKE();
    FakeCufile cf(Runfile("tests/cuda/libfake_cufile.so"));
    ASSERT_NE(cf.counters, nullptr) << dlerror();
    fake_cufile_counters_t c0 = cf.Now();
    Start(true);
    uint32_t io[2] = {0, 0};
    RoundTrip(3, 700001, io); // several chunks of file_chunk_size
    EXPECT_EQ(io[0], OTE_FILE_IO_GDS);
    EXPECT_EQ(io[1], OTE_FILE_IO_GDS);
    EXPECT_EQ(Staged(), 0u);
    fake_cufile_counters_t c = cf.Now();
    EXPECT_GE(c.reads - c0.reads, 2);
    EXPECT_GE(c.writes - c0.writes, 2);
    EXPECT_EQ(c.bufs, c0.bufs);
    EXPECT_EQ(c.handles, c0.handles + 1);
    EXPECT_EQ(c.driver_opens, c0.driver_opens + 1);
    EXPECT_TRUE(LogContains("use GPUDirect Storage"));
    ASSERT_EQ(ote_file_unregister(e_, faddr_), OTE_OK);
    faddr_ = 0;
    EXPECT_EQ(cf.Now().handles, c0.handles);
    Stop();
    c = cf.Now();
    EXPECT_EQ(c.driver_opens, c0.driver_opens);
    EXPECT_EQ(c.handles, c0.handles);
    EXPECT_EQ(c.bufs, c0.bufs);
}

// Without libcufile: one INFO line, and the same bytes through pinned staging chunks with
// the file owner's io_uring / pool on the host side.
TEST_F(GdsFileTest, StagedWithoutCufile) {
    Start(false);
    uint32_t io[2] = {0, 0};
    RoundTrip(4096, 1u << 20, io);
    EXPECT_EQ(io[0] & OTE_FILE_IO_GDS, 0u);
    EXPECT_NE(io[0] & (OTE_FILE_IO_DIRECT | OTE_FILE_IO_BUFFERED), 0u);
    EXPECT_EQ(io[1] & OTE_FILE_IO_GDS, 0u);
    EXPECT_EQ(Staged(), 2u);
    EXPECT_TRUE(LogContains("no GPUDirect Storage"));
    EXPECT_TRUE(LogContains("staged through pinned host memory"));
}

// cuFileDriverOpen failing is like a missing library: staged, with the INFO line.
TEST_F(GdsFileTest, DriverOpenFailureStages) {
    REQUIRE_FAKE();
    FakeCufile cf(Runfile("tests/cuda/libfake_cufile.so"));
    ASSERT_NE(cf.fail, nullptr) << dlerror();
    fake_cufile_counters_t c0 = cf.Now();
    ASSERT_EQ(cf.fail("cuFileDriverOpen", 5001, 1), 0);
    Start(true);
    uint32_t io[2] = {0, 0};
    RoundTrip(0, 65536, io);
    EXPECT_EQ((io[0] | io[1]) & OTE_FILE_IO_GDS, 0u);
    EXPECT_EQ(Staged(), 2u);
    EXPECT_TRUE(LogContains("cuFileDriverOpen"));
    EXPECT_EQ(cf.Now().driver_opens, c0.driver_opens);
    EXPECT_EQ(cf.Now().reads, c0.reads);
}

// A device range cuFile refuses to register: that chunk is staged, the request completes.
TEST_F(GdsFileTest, BufRegisterRefusedStagesTheChunk) {
    REQUIRE_FAKE();
    FakeCufile cf(Runfile("tests/cuda/libfake_cufile.so"));
    ASSERT_NE(cf.fail, nullptr) << dlerror();
    Start(true);
    ASSERT_EQ(cf.fail("cuFileBufRegister", 5022, 1), 0);
    uint32_t io[2] = {0, 0};
    RoundTrip(8192, 600000, io);
    EXPECT_NE(io[0] & OTE_FILE_IO_GDS, 0u); // the other chunks
    EXPECT_NE(io[0] & (OTE_FILE_IO_DIRECT | OTE_FILE_IO_BUFFERED), 0u);
    EXPECT_EQ(io[1], OTE_FILE_IO_GDS);
    EXPECT_EQ(Staged(), 1u);
    EXPECT_EQ(cf.Now().bufs, 0);
}

// Device memory registered with the engine is registered with cuFile once, whole, by its
// first GPUDirect Storage chunk, and stays so across requests (every chunk passes the
// registration's base and its offset; none goes through the library's bounce buffers)
// until ote_memory_unregister. Unregistered device memory registers each chunk's range for
// its call; a registration cuFile refuses whole does the same (an INFO line); an engine
// destroyed with the memory still registered leaves no cuFile registration.
TEST_F(GdsFileTest, RegisteredDeviceMemoryKeepsOneCufileRegistration) {
    REQUIRE_FAKE();
    FakeCufile cf(Runfile("tests/cuda/libfake_cufile.so"));
    ASSERT_NE(cf.counters, nullptr) << dlerror();
    Start(true);
    const size_t len = 1u << 20, span = len + 8192;
    uint64_t dev = DevAlloc(span);
    ASSERT_NE(dev, 0u);
    ASSERT_EQ(ote_memory_register(e_, reinterpret_cast<void *>(dev), span,
                                  OTE_PERM_READ | OTE_PERM_WRITE),
              OTE_OK);
    fake_cufile_counters_t c0 = cf.Now();
    // READs and WRITEs at three offsets in the registration (one unaligned), 4 chunks each.
    const uint64_t offs[] = {0, 4096, 8191};
    for (uint64_t o : offs) {
        SCOPED_TRACE(o);
        ote_transfer_status_ex_t s = Move(OTE_READ, dev + o, o, len);
        ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error) << LogText();
        EXPECT_EQ(s.file_io, OTE_FILE_IO_GDS);
        std::vector<uint8_t> got = DevRead(dev + o, len);
        for (size_t i = 0; i < len; i++) ASSERT_EQ(got[i], Pat(o + i, 7)) << i;
        DevFill(dev + o, len, 40 + o);
        s = Move(OTE_WRITE, dev + o, o, len);
        ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
        EXPECT_EQ(s.file_io, OTE_FILE_IO_GDS);
        std::vector<uint8_t> want(len);
        ote_pattern_fill(want.data(), len, 40 + o, 0);
        EXPECT_TRUE(FileBytes(o, len) == want) << "the WRITE's bytes in the file";
        // Put the file's pattern back for the next offset's READ.
        std::vector<uint8_t> orig(len);
        for (size_t i = 0; i < len; i++) orig[i] = Pat(o + i, 7);
        int fd = open(path_.c_str(), O_WRONLY | O_CLOEXEC);
        ASSERT_GE(fd, 0);
        ASSERT_EQ(pwrite(fd, orig.data(), len, static_cast<off_t>(o)), static_cast<ssize_t>(len));
        close(fd);
    }
    fake_cufile_counters_t c = cf.Now();
    EXPECT_EQ(c.registers - c0.registers, 1) << "one cuFile registration for every chunk";
    EXPECT_EQ(c.bufs, c0.bufs + 1) << "kept across requests";
    EXPECT_EQ(c.bounce_io, c0.bounce_io) << "a chunk missed the registration's base";
    EXPECT_GE(c.reads - c0.reads, 12);
    EXPECT_GE(c.writes - c0.writes, 12);
    EXPECT_EQ(Staged(), 0u);
    ASSERT_EQ(ote_memory_unregister(e_, reinterpret_cast<void *>(dev)), OTE_OK);
    EXPECT_EQ(cf.Now().bufs, c0.bufs) << "ote_memory_unregister left the cuFile registration";
    // The same memory, no longer registered with the engine: each chunk its own range.
    c0 = cf.Now();
    ote_transfer_status_ex_t s = Move(OTE_READ, dev, 0, len);
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    EXPECT_EQ(s.file_io, OTE_FILE_IO_GDS);
    c = cf.Now();
    EXPECT_EQ(c.registers - c0.registers, c.reads - c0.reads); // one per chunk
    EXPECT_GE(c.reads - c0.reads, 4);
    EXPECT_EQ(c.bufs, c0.bufs);
    // Registered again, cuFile refusing the whole extent: each chunk its own range, once
    // the INFO line said so; the request still moves by GPUDirect Storage.
    ASSERT_EQ(ote_memory_register(e_, reinterpret_cast<void *>(dev), span,
                                  OTE_PERM_READ | OTE_PERM_WRITE),
              OTE_OK);
    ASSERT_EQ(cf.fail("cuFileBufRegister", 5022, 1), 0);
    c0 = cf.Now();
    s = Move(OTE_READ, dev + 4096, 4096, len);
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    EXPECT_EQ(s.file_io, OTE_FILE_IO_GDS);
    std::vector<uint8_t> got = DevRead(dev + 4096, len);
    for (size_t i = 0; i < len; i++) ASSERT_EQ(got[i], Pat(4096 + i, 7)) << i;
    c = cf.Now();
    EXPECT_EQ(c.registers - c0.registers, c.reads - c0.reads);
    EXPECT_EQ(c.bufs, c0.bufs);
    EXPECT_TRUE(LogContains("not registered with cuFile whole"));
    ASSERT_EQ(ote_memory_unregister(e_, reinterpret_cast<void *>(dev)), OTE_OK);
    // Registered a third time and kept; the engine goes with the memory still registered.
    ASSERT_EQ(ote_memory_register(e_, reinterpret_cast<void *>(dev), span,
                                  OTE_PERM_READ | OTE_PERM_WRITE),
              OTE_OK);
    c0 = cf.Now();
    s = Move(OTE_WRITE, dev, 0, len);
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    EXPECT_EQ(cf.Now().bufs, c0.bufs + 1);
    Stop();
    EXPECT_EQ(cf.Now().bufs, c0.bufs) << "the engine's destroy left a cuFile registration";
}

// cuFileRead failing with EIO fails the request with OTE_ERR_IO (errno EIO); the device
// buffer's registration is still dropped and the next request moves.
TEST_F(GdsFileTest, ReadErrorIsAClearStatus) {
    REQUIRE_FAKE();
    FakeCufile cf(Runfile("tests/cuda/libfake_cufile.so"));
    ASSERT_NE(cf.fail, nullptr) << dlerror();
    Start(true);
    uint64_t dev = DevAlloc(65536);
    ASSERT_NE(dev, 0u);
    ASSERT_EQ(cf.fail("cuFileRead", EIO, 1), 0);
    ote_transfer_status_ex_t s = Move(OTE_READ, dev, 0, 65536);
    EXPECT_EQ(s.state, OTE_TRANSFER_FAILED);
    EXPECT_EQ(ote_status_code(s.error), OTE_ERR_IO) << ote_status_str(s.error);
    EXPECT_EQ(ote_status_errno(s.error), EIO);
    EXPECT_EQ(s.file_io, OTE_FILE_IO_GDS);
    EXPECT_TRUE(LogContains("cuFileRead"));
    EXPECT_EQ(cf.Now().bufs, 0);
    EXPECT_EQ(Staged(), 0u);
    s = Move(OTE_READ, dev, 0, 65536);
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    std::vector<uint8_t> got = DevRead(dev, 65536);
    for (size_t i = 0; i < got.size(); i++) ASSERT_EQ(got[i], Pat(i, 7)) << i;
}

// Cancel reaches GDS chunks held before their cuFile call (the file.stall fault point on
// the GDS pool): CANCELED, no byte moved, no buffer registration left; the engine goes on.
TEST_F(GdsFileTest, CancelReachesQueuedGdsChunks) {
    REQUIRE_FAKE();
    FakeCufile cf(Runfile("tests/cuda/libfake_cufile.so"));
    ASSERT_NE(cf.counters, nullptr) << dlerror();
    Start(true);
    const size_t len = 1u << 20;
    uint64_t dev = DevAlloc(len);
    ASSERT_NE(dev, 0u);
    DevFill(dev, len, 5);
    uint64_t reads0 = static_cast<uint64_t>(cf.Now().reads);
    ASSERT_EQ(ote_fault_arm("file.stall", OTE_FAULT_EVERY, 0, OTE_ERR_FAULT, 0), OTE_OK);
    ASSERT_EQ(ote_batch_reset(b_), OTE_OK);
    ote_request_t r{OTE_READ, reinterpret_cast<void *>(dev), seg_, faddr_, len};
    ASSERT_EQ(ote_batch_submit(b_, &r, 1), OTE_OK);
    EXPECT_EQ(ote_batch_wait(b_, 50ull * 1000 * 1000), OTE_ERR_TIMEOUT);
    EXPECT_GE(ote_fault_hits("file.stall"), 4u); // every chunk (1 MiB / 256 KiB)
    ASSERT_EQ(ote_batch_cancel(b_), OTE_OK);
    EXPECT_EQ(ote_batch_wait(b_, 10ull * 1000 * 1000 * 1000), OTE_ERR_CANCELED);
    ote_transfer_status_ex_t s{};
    s.struct_size = sizeof(s);
    ASSERT_EQ(ote_batch_status_ex(b_, 0, &s), OTE_OK);
    EXPECT_EQ(s.state, OTE_TRANSFER_CANCELED);
    EXPECT_EQ(s.bytes_done, 0u);
    ote_fault_disarm("file.stall");
    EXPECT_EQ(static_cast<uint64_t>(cf.Now().reads), reads0);
    EXPECT_EQ(cf.Now().bufs, 0);
    EXPECT_EQ(DevHash(dev, len), ote_gpu_test::PatternHash(5, 0, len)); // untouched
    s = Move(OTE_READ, dev, 0, len);
    ASSERT_EQ(s.state, OTE_TRANSFER_COMPLETED) << ote_status_str(s.error);
    EXPECT_EQ(s.file_io, OTE_FILE_IO_GDS);
}

} // namespace

// cuda/ipc across two processes: this test binary re-executes itself as the exporter
// (OTE_IPC_CHILD_FD set: the child runs ExporterMain() from a static initializer and
// exits before gtest starts). The parent imports through ote_cuda_ipc_cache_t, copies
// both ways, and checks close receipts, exporter death, the cache's bounds and failed
// imports. Both processes load the same driver (the fake, or the real one with
// OTE_TEST_REAL_CUDA=1).
#include <gtest/gtest.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/cuda/cuda_test_util.h"

extern "C" {
#include "base/alloc.h"
#include "cuda/ipc/ipc.h"
#include "cuda/memory/memory.h"
}

extern char **environ;

namespace {

using ote_cuda_test::CudaTest;
using ote_cuda_test::LongDeadline;

constexpr int kMaxAllocs = 4;
constexpr size_t kAllocSize = 1 << 20;

struct Hello {
    int32_t pid;
    int32_t n;
    ote_cuda_ipc_desc_t desc[kMaxAllocs];
};
enum Op : int32_t { kUnregister = 1, kCheck = 2, kExit = 3 };
struct Cmd {
    int32_t op;
    int32_t index;
    uint64_t offset;
    uint8_t value;
};
struct Reply {
    int32_t status;
};

uint8_t Pattern(int i) { return static_cast<uint8_t>(0x10 + i); }

bool IoFull(int fd, void *buf, size_t n, bool writing, ote_deadline_t deadline) {
    char *p = static_cast<char *>(buf);
    while (n > 0) {
        struct pollfd pfd = {fd, static_cast<short>(writing ? POLLOUT : POLLIN), 0};
        int r = poll(&pfd, 1, ote_deadline_remaining_ms(deadline, 1000));
        if (r < 0 && errno == EINTR) continue;
        if (r == 0) {
            if (ote_deadline_expired(deadline)) return false;
            continue;
        }
        if (r < 0) return false;
        ssize_t k = writing ? write(fd, p, n) : read(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return false;
        p += k;
        n -= static_cast<size_t>(k);
    }
    return true;
}

// ---- the exporter process ----

int ExporterMain(int fd, int n) {
    ote_cuda_driver_t *drv = nullptr;
    ote_cuda_device_t *dev = nullptr;
    if (ote_cuda_driver_load(nullptr, &drv) != OTE_OK ||
        ote_cuda_device_open(drv, 0, &dev) != OTE_OK)
        return 10;
    const ote_cuda_driver_table_t *t = ote_cuda_driver_table(drv);
    std::vector<ote_cuda_alloc_t *> allocs(n, nullptr);
    std::vector<ote_cuda_ipc_export_t *> exports(n, nullptr);
    Hello hello{};
    hello.pid = getpid();
    hello.n = n;
    std::vector<uint8_t> buf(kAllocSize);
    for (int i = 0; i < n; i++) {
        if (ote_cuda_alloc_create(dev, kAllocSize, 0, &allocs[i]) != OTE_OK) return 11;
        memset(buf.data(), Pattern(i), buf.size());
        if (ote_cuda_device_make_current(dev) != OTE_OK ||
            t->cuMemcpyHtoD(ote_cuda_alloc_ptr(allocs[i]), buf.data(), buf.size()) !=
                OTE_CU_SUCCESS)
            return 12;
        // A pageable HtoD returns once the source is staged, not when the bytes landed;
        // a synchronous DtoH after it (same null stream) returns only when both are done,
        // before the importer may look.
        uint8_t fence = 0;
        if (t->cuMemcpyDtoH(&fence, ote_cuda_alloc_ptr(allocs[i]), 1) != OTE_CU_SUCCESS) return 12;
        if (ote_cuda_ipc_export_alloc(allocs[i], &exports[i]) != OTE_OK) return 13;
        hello.desc[i] = *ote_cuda_ipc_export_desc(exports[i]);
    }
    if (!IoFull(fd, &hello, sizeof(hello), true, LongDeadline())) return 14;
    for (;;) {
        Cmd cmd{};
        // The parent drives the test; an hour without a command means it is gone.
        if (!IoFull(fd, &cmd, sizeof(cmd), false, ote_deadline_after(3600ull * OTE_NSEC_PER_SEC)))
            break;
        Reply reply{OTE_OK};
        int i = cmd.index;
        if (i < 0 || i >= n) {
            reply.status = OTE_ERR_INVALID;
        } else if (cmd.op == kUnregister) {
            // Unregister: the export ends and the memory is freed (no importer holds the
            // exporter's memory alive through our owners).
            ote_cuda_ipc_export_destroy(exports[i]);
            exports[i] = nullptr;
            reply.status = ote_cuda_alloc_destroy(allocs[i], LongDeadline());
            allocs[i] = nullptr;
        } else if (cmd.op == kCheck) {
            uint8_t got = 0;
            if (ote_cuda_device_make_current(dev) != OTE_OK ||
                t->cuMemcpyDtoH(&got, ote_cuda_alloc_ptr(allocs[i]) + cmd.offset, 1) !=
                    OTE_CU_SUCCESS)
                reply.status = OTE_ERR_NATIVE;
            else if (got != cmd.value) reply.status = OTE_ERR_IO;
        } else if (cmd.op == kExit) {
            break;
        }
        if (!IoFull(fd, &reply, sizeof(reply), true, LongDeadline())) break;
    }
    for (int i = 0; i < n; i++) {
        ote_cuda_ipc_export_destroy(exports[i]);
        if (allocs[i] != nullptr) ote_cuda_alloc_destroy(allocs[i], LongDeadline());
    }
    ote_cuda_device_close(dev);
    ote_cuda_driver_unload(drv);
    return 0;
}

// Passes fd with one byte of data over a UNIX socket (SCM_RIGHTS).
bool SendFd(int sock, int fd) {
    char byte = 'F';
    struct iovec iov = {&byte, 1};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    memset(&u, 0, sizeof(u));
    struct msghdr msg = {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = u.buf;
    msg.msg_controllen = sizeof(u.buf);
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof(int));
    return sendmsg(sock, &msg, 0) == 1;
}

int RecvFd(int sock) {
    char byte = 0;
    struct iovec iov = {&byte, 1};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    struct msghdr msg = {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = u.buf;
    msg.msg_controllen = sizeof(u.buf);
    struct pollfd pfd = {sock, POLLIN, 0};
    if (poll(&pfd, 1, 30000) != 1 || recvmsg(sock, &msg, MSG_CMSG_CLOEXEC) != 1) return -1;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    if (c == nullptr || c->cmsg_type != SCM_RIGHTS) return -1;
    int fd = -1;
    memcpy(&fd, CMSG_DATA(c), sizeof(int));
    return fd;
}

// The VMM exporter: one cuMemCreate allocation filled with Pattern(7), exported as a
// POSIX fd passed over the socket with its size; exits when the parent says so.
int VmmExporterMain(int fd) {
    ote_cuda_driver_t *drv = nullptr;
    ote_cuda_device_t *dev = nullptr;
    if (ote_cuda_driver_load(nullptr, &drv) != OTE_OK ||
        ote_cuda_device_open(drv, 0, &dev) != OTE_OK)
        return 20;
    const ote_cuda_driver_table_t *t = ote_cuda_driver_table(drv);
    ote_cuda_alloc_t *a = nullptr;
    ote_cuda_ipc_export_t *e = nullptr;
    if (ote_cuda_alloc_create(dev, kAllocSize, OTE_CUDA_ALLOC_VMM, &a) != OTE_OK) return 21;
    std::vector<uint8_t> buf(ote_cuda_alloc_size(a), Pattern(7));
    uint8_t fence = 0;
    if (ote_cuda_device_make_current(dev) != OTE_OK ||
        t->cuMemcpyHtoD(ote_cuda_alloc_ptr(a), buf.data(), buf.size()) != OTE_CU_SUCCESS ||
        t->cuMemcpyDtoH(&fence, ote_cuda_alloc_ptr(a), 1) != OTE_CU_SUCCESS)
        return 22;
    if (ote_cuda_ipc_export_alloc(a, &e) != OTE_OK || ote_cuda_ipc_export_fd(e) < 0) return 23;
    uint64_t size = ote_cuda_alloc_size(a);
    if (!IoFull(fd, &size, sizeof(size), true, LongDeadline()) ||
        !SendFd(fd, ote_cuda_ipc_export_fd(e)))
        return 24;
    Cmd cmd{};
    (void)IoFull(fd, &cmd, sizeof(cmd), false, ote_deadline_after(3600ull * OTE_NSEC_PER_SEC));
    ote_cuda_ipc_export_destroy(e);
    int rc = ote_cuda_alloc_destroy(a, LongDeadline()) == OTE_OK ? 0 : 25;
    ote_cuda_device_close(dev);
    ote_cuda_driver_unload(drv);
    return rc;
}

// The VMM exporter through ote_cuda_ipc_export_vmm (the path the engine takes for memory
// it did not allocate): a VMM allocation filled with Pattern(9), described from a pointer
// inside it; sends the desc, then the fd; answers kCheck on it until kExit.
int VmmPtrExporterMain(int fd) {
    ote_cuda_driver_t *drv = nullptr;
    ote_cuda_device_t *dev = nullptr;
    if (ote_cuda_driver_load(nullptr, &drv) != OTE_OK ||
        ote_cuda_device_open(drv, 0, &dev) != OTE_OK)
        return 30;
    const ote_cuda_driver_table_t *t = ote_cuda_driver_table(drv);
    ote_cuda_alloc_t *a = nullptr;
    ote_cuda_ipc_export_t *e = nullptr;
    if (ote_cuda_alloc_create(dev, kAllocSize, OTE_CUDA_ALLOC_VMM, &a) != OTE_OK) return 31;
    std::vector<uint8_t> buf(ote_cuda_alloc_size(a), Pattern(9));
    uint8_t fence = 0;
    if (ote_cuda_device_make_current(dev) != OTE_OK ||
        t->cuMemcpyHtoD(ote_cuda_alloc_ptr(a), buf.data(), buf.size()) != OTE_CU_SUCCESS ||
        t->cuMemcpyDtoH(&fence, ote_cuda_alloc_ptr(a), 1) != OTE_CU_SUCCESS)
        return 32;
    if (ote_cuda_ipc_export_vmm(dev, ote_cuda_alloc_ptr(a) + 100, &e) != OTE_OK ||
        ote_cuda_ipc_export_fd(e) < 0)
        return 33;
    ote_cuda_ipc_desc_t desc = *ote_cuda_ipc_export_desc(e);
    if (!IoFull(fd, &desc, sizeof(desc), true, LongDeadline()) ||
        !SendFd(fd, ote_cuda_ipc_export_fd(e)))
        return 34;
    for (;;) {
        Cmd cmd{};
        if (!IoFull(fd, &cmd, sizeof(cmd), false, ote_deadline_after(3600ull * OTE_NSEC_PER_SEC)))
            break;
        if (cmd.op == kExit) break;
        Reply reply{OTE_OK};
        uint8_t got = 0;
        if (cmd.op != kCheck || cmd.offset >= ote_cuda_alloc_size(a))
            reply.status = OTE_ERR_INVALID;
        else if (t->cuMemcpyDtoH(&got, ote_cuda_alloc_ptr(a) + cmd.offset, 1) != OTE_CU_SUCCESS)
            reply.status = OTE_ERR_NATIVE;
        else if (got != cmd.value) reply.status = OTE_ERR_IO;
        if (!IoFull(fd, &reply, sizeof(reply), true, LongDeadline())) break;
    }
    ote_cuda_ipc_export_destroy(e);
    int rc = ote_cuda_alloc_destroy(a, LongDeadline()) == OTE_OK ? 0 : 35;
    ote_cuda_device_close(dev);
    ote_cuda_driver_unload(drv);
    return rc;
}

// Runs before gtest in the re-executed child.
const int kChildInit = [] {
    const char *fd = std::getenv("OTE_IPC_CHILD_FD");
    if (fd == nullptr) return 0;
    const char *n = std::getenv("OTE_IPC_CHILD_ALLOCS");
    if (n != nullptr && std::string(n) == "vmm") _exit(VmmExporterMain(atoi(fd)));
    if (n != nullptr && std::string(n) == "vmmptr") _exit(VmmPtrExporterMain(atoi(fd)));
    _exit(ExporterMain(atoi(fd), n != nullptr ? atoi(n) : 2));
}();

// ---- the importer (the test) ----

class CudaIpcTest : public CudaTest {
  protected:
    void TearDown() override {
        if (child_ > 0) {
            kill(child_, SIGKILL);
            waitpid(child_, nullptr, 0);
        }
        if (sock_ >= 0) close(sock_);
        if (cache_ != nullptr) {
            EXPECT_EQ(ote_cuda_ipc_cache_destroy(cache_), OTE_OK);
        }
        CudaTest::TearDown();
    }

    void Spawn(int n, bool vmm = false, const char *vmm_mode = "vmm") {
        int sv[2];
        ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        std::vector<std::string> env;
        for (char **e = environ; *e != nullptr; e++) env.emplace_back(*e);
        env.push_back("OTE_IPC_CHILD_FD=" + std::to_string(sv[1]));
        env.push_back("OTE_IPC_CHILD_ALLOCS=" + (vmm ? std::string(vmm_mode) : std::to_string(n)));
        std::vector<char *> envp;
        for (auto &s : env) envp.push_back(&s[0]);
        envp.push_back(nullptr);
        char self[] = "/proc/self/exe";
        char *argv[] = {self, nullptr};
        pid_t pid = fork();
        ASSERT_GE(pid, 0);
        if (pid == 0) {
            close(sv[0]);
            int flags = fcntl(sv[1], F_GETFD);
            fcntl(sv[1], F_SETFD, flags & ~FD_CLOEXEC);
            execve(self, argv, envp.data());
            _exit(127);
        }
        close(sv[1]);
        child_ = pid;
        sock_ = sv[0];
        if (vmm) return;
        ASSERT_TRUE(IoFull(sock_, &hello_, sizeof(hello_), false, LongDeadline()))
            << "the exporter did not say hello";
        ASSERT_EQ(hello_.pid, child_);
        ASSERT_EQ(hello_.n, n);
    }

    int32_t Ask(Op op, int index, uint64_t offset = 0, uint8_t value = 0) {
        Cmd cmd{op, index, offset, value};
        Reply reply{-1};
        if (!IoFull(sock_, &cmd, sizeof(cmd), true, LongDeadline())) return -1;
        if (!IoFull(sock_, &reply, sizeof(reply), false, LongDeadline())) return -1;
        return reply.status;
    }

    void EndChild() {
        Cmd cmd{kExit, 0, 0, 0};
        ASSERT_TRUE(IoFull(sock_, &cmd, sizeof(cmd), true, LongDeadline()));
        int status = 0;
        ASSERT_EQ(waitpid(child_, &status, 0), child_);
        child_ = -1;
        EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "exporter status " << status;
    }

    uint8_t ReadByte(ote_cu_deviceptr_t p) {
        uint8_t b = 0;
        EXPECT_EQ(ote_cuda_device_make_current(dev_), OTE_OK);
        EXPECT_EQ(t_->cuMemcpyDtoH(&b, p, 1), OTE_CU_SUCCESS);
        return b;
    }

    uint64_t Imports() { return Counters().ipc_imports; }
    ote_cuda_ipc_cache_stats_t Stats() {
        ote_cuda_ipc_cache_stats_t s;
        ote_cuda_ipc_cache_stats(cache_, &s);
        return s;
    }

    pid_t child_ = -1;
    int sock_ = -1;
    Hello hello_{};
    ote_cuda_ipc_cache_t *cache_ = nullptr;
};

TEST_F(CudaIpcTest, ImportCopyBothWaysAndCloseOnTheReceipt) {
    Spawn(2);
    ASSERT_EQ(ote_cuda_ipc_cache_create(dev_, 8, 64 << 20, &cache_), OTE_OK);
    const ote_cuda_ipc_desc_t &d0 = hello_.desc[0];
    EXPECT_GE(d0.size, kAllocSize);
    EXPECT_NE(d0.buffer_id, 0u);
    ote_cuda_ipc_mapping_t *m = nullptr;
    ASSERT_EQ(ote_cuda_ipc_import(cache_, child_, &d0, &m), OTE_OK);
    ote_cu_deviceptr_t local = 0;
    ASSERT_EQ(ote_cuda_ipc_mapping_translate(m, d0.base + 4096, 100, &local), OTE_OK);
    EXPECT_EQ(local, ote_cuda_ipc_mapping_base(m) + 4096);
    EXPECT_EQ(ote_cuda_ipc_mapping_translate(m, d0.base + d0.size - 10, 100, &local),
              OTE_ERR_ACCESS);
    EXPECT_EQ(ote_cuda_ipc_mapping_translate(m, d0.base - 1, 1, &local), OTE_ERR_ACCESS);
    // The exporter's bytes, read here; bytes written here, seen there.
    EXPECT_EQ(ReadByte(ote_cuda_ipc_mapping_base(m) + 777), Pattern(0));
    uint8_t v = 0xab;
    ASSERT_EQ(ote_cuda_device_make_current(dev_), OTE_OK);
    ASSERT_EQ(t_->cuMemcpyHtoD(ote_cuda_ipc_mapping_base(m) + 4096, &v, 1), OTE_CU_SUCCESS);
    EXPECT_EQ(ReadByte(ote_cuda_ipc_mapping_base(m) + 4096), 0xab); // landed (DtoH is synchronous)
    EXPECT_EQ(Ask(kCheck, 0, 4096, 0xab), OTE_OK);
    // A second import of the same export is the cached mapping.
    ote_cuda_ipc_mapping_t *again = nullptr;
    ASSERT_EQ(ote_cuda_ipc_import(cache_, child_, &d0, &again), OTE_OK);
    EXPECT_EQ(again, m);
    EXPECT_EQ(Stats().hits, 1u);
    EXPECT_EQ(Stats().imports, 1u);
    ote_cuda_ipc_mapping_put(cache_, again);
    ote_cuda_ipc_mapping_put(cache_, m);
    EXPECT_EQ(Stats().entries, 1u); // unused, still cached
    EXPECT_EQ(Stats().in_use, 0u);
    if (fake_.present()) {
        EXPECT_EQ(Imports(), at_start_.ipc_imports + 1);
    }

    // Unregister while imported and in use: the receipt invalidates, the last put closes.
    ote_cuda_ipc_mapping_t *m1 = nullptr;
    ASSERT_EQ(ote_cuda_ipc_import(cache_, child_, &hello_.desc[1], &m1), OTE_OK);
    EXPECT_EQ(ReadByte(ote_cuda_ipc_mapping_base(m1)), Pattern(1));
    ASSERT_EQ(Ask(kUnregister, 1), OTE_OK);
    ASSERT_EQ(ote_cuda_ipc_close_receipt(cache_, child_, hello_.desc[1].buffer_id), OTE_OK);
    EXPECT_EQ(Stats().entries, 2u); // still mapped: it has a user
    if (fake_.present()) {
        EXPECT_EQ(Imports(), at_start_.ipc_imports + 2);
    }
    ote_cuda_ipc_mapping_put(cache_, m1);
    EXPECT_EQ(Stats().entries, 1u);
    if (fake_.present()) {
        EXPECT_EQ(Imports(), at_start_.ipc_imports + 1);
    }
    // Unregister of the unused cached one: closed on the receipt.
    ASSERT_EQ(Ask(kUnregister, 0), OTE_OK);
    ASSERT_EQ(ote_cuda_ipc_close_receipt(cache_, child_, d0.buffer_id), OTE_OK);
    EXPECT_EQ(Stats().entries, 0u);
    EXPECT_EQ(Stats().invalidations, 2u);
    EXPECT_EQ(ote_cuda_ipc_close_receipt(cache_, child_, d0.buffer_id), OTE_ERR_NOT_FOUND);
    if (fake_.present()) {
        EXPECT_EQ(Imports(), at_start_.ipc_imports);
    }
    EndChild();
}

TEST_F(CudaIpcTest, ExporterDeathDropsItsMappingsWithoutLeaks) {
    Spawn(2);
    ASSERT_EQ(ote_cuda_ipc_cache_create(dev_, 8, 64 << 20, &cache_), OTE_OK);
    ote_cuda_ipc_mapping_t *m0 = nullptr, *m1 = nullptr;
    ASSERT_EQ(ote_cuda_ipc_import(cache_, child_, &hello_.desc[0], &m0), OTE_OK);
    ASSERT_EQ(ote_cuda_ipc_import(cache_, child_, &hello_.desc[1], &m1), OTE_OK);
    EXPECT_EQ(ReadByte(ote_cuda_ipc_mapping_base(m1) + 5), Pattern(1));
    ote_cuda_ipc_mapping_put(cache_, m0); // m0 unused, m1 in use
    pid_t dead = child_;
    ASSERT_EQ(kill(child_, SIGKILL), 0);
    ASSERT_EQ(waitpid(child_, nullptr, 0), child_);
    child_ = -1;
    EXPECT_EQ(ote_cuda_ipc_exporter_dead(cache_, dead), 2u);
    EXPECT_EQ(Stats().entries, 1u); // m1 until its user is done
    ote_cuda_ipc_mapping_put(cache_, m1);
    EXPECT_EQ(Stats().entries, 0u);
    EXPECT_EQ(ote_cuda_ipc_exporter_dead(cache_, dead), 0u);
    if (fake_.present()) {
        EXPECT_EQ(Imports(), at_start_.ipc_imports);
        // The export cannot be opened any more: the import fails and maps nothing.
        ote_cuda_ipc_mapping_t *m = nullptr;
        EXPECT_NE(ote_cuda_ipc_import(cache_, dead, &hello_.desc[0], &m), OTE_OK);
        EXPECT_EQ(m, nullptr);
        EXPECT_EQ(Imports(), at_start_.ipc_imports);
        EXPECT_EQ(Stats().entries, 0u);
    }
}

TEST_F(CudaIpcTest, CacheIsBoundedAndEvictsTheLeastRecentlyUsed) {
    Spawn(3);
    ASSERT_EQ(ote_cuda_ipc_cache_create(dev_, 2, 64 << 20, &cache_), OTE_OK);
    ote_cuda_ipc_mapping_t *a = nullptr, *b = nullptr, *c = nullptr, *x = nullptr;
    ASSERT_EQ(ote_cuda_ipc_import(cache_, child_, &hello_.desc[0], &a), OTE_OK);
    ote_cuda_ipc_mapping_put(cache_, a);
    ASSERT_EQ(ote_cuda_ipc_import(cache_, child_, &hello_.desc[1], &b), OTE_OK);
    ote_cuda_ipc_mapping_put(cache_, b);
    ASSERT_EQ(ote_cuda_ipc_import(cache_, child_, &hello_.desc[0], &x), OTE_OK); // a is used again
    EXPECT_EQ(x, a);
    ote_cuda_ipc_mapping_put(cache_, x);
    ASSERT_EQ(ote_cuda_ipc_import(cache_, child_, &hello_.desc[2], &c), OTE_OK); // evicts b
    EXPECT_EQ(Stats().evictions, 1u);
    EXPECT_EQ(Stats().entries, 2u);
    EXPECT_EQ(ReadByte(ote_cuda_ipc_mapping_base(c) + 99), Pattern(2));
    EXPECT_EQ(ReadByte(ote_cuda_ipc_mapping_base(a) + 99), Pattern(0));
    ASSERT_EQ(ote_cuda_ipc_import(cache_, child_, &hello_.desc[0], &x), OTE_OK); // still cached
    EXPECT_EQ(Stats().hits, 2u);
    // Both entries in use: no room for b.
    ote_cuda_ipc_mapping_t *none = nullptr;
    EXPECT_EQ(ote_cuda_ipc_import(cache_, child_, &hello_.desc[1], &none), OTE_ERR_AGAIN);
    EXPECT_EQ(none, nullptr);
    ote_cuda_ipc_mapping_put(cache_, x);
    ote_cuda_ipc_mapping_put(cache_, c);
    if (fake_.present()) {
        EXPECT_EQ(Imports(), at_start_.ipc_imports + 2);
    }
    EXPECT_EQ(ote_cuda_ipc_cache_destroy(cache_), OTE_OK);
    cache_ = nullptr;
    if (fake_.present()) {
        EXPECT_EQ(Imports(), at_start_.ipc_imports);
    }
    // A byte bound below one allocation refuses it outright.
    ASSERT_EQ(ote_cuda_ipc_cache_create(dev_, 4, kAllocSize / 2, &cache_), OTE_OK);
    EXPECT_EQ(ote_cuda_ipc_import(cache_, child_, &hello_.desc[0], &none), OTE_ERR_TOO_BIG);
    EndChild();
}

TEST_F(CudaIpcTest, FailedImportLeavesNothingMapped) {
    REQUIRE_FAKE();
    Spawn(1);
    ASSERT_EQ(ote_cuda_ipc_cache_create(dev_, 4, 64 << 20, &cache_), OTE_OK);
    ote_cuda_ipc_mapping_t *m = nullptr;
    fake_.fail("cuIpcOpenMemHandle", 1, 1, OTE_CU_ERROR_MAP_FAILED);
    EXPECT_EQ(ote_status_errno(ote_cuda_ipc_import(cache_, child_, &hello_.desc[0], &m)),
              OTE_CU_ERROR_MAP_FAILED);
    EXPECT_EQ(m, nullptr);
    ote_alloc_fail_nth(1);
    EXPECT_EQ(ote_cuda_ipc_import(cache_, child_, &hello_.desc[0], &m), OTE_ERR_NOMEM);
    ote_alloc_fail_disarm();
    EXPECT_EQ(m, nullptr);
    EXPECT_EQ(Imports(), at_start_.ipc_imports);
    EXPECT_EQ(Stats().entries, 0u);
    // A close that fails retains the mapping on the device until reclaimed.
    ASSERT_EQ(ote_cuda_ipc_import(cache_, child_, &hello_.desc[0], &m), OTE_OK);
    ote_cuda_ipc_mapping_put(cache_, m);
    fake_.fail("cuIpcCloseMemHandle", 1, 1, OTE_CU_ERROR_INVALID_VALUE);
    EXPECT_EQ(ote_cuda_ipc_close_receipt(cache_, child_, hello_.desc[0].buffer_id), OTE_OK);
    EXPECT_EQ(ote_cuda_device_retained(dev_), 1u);
    EXPECT_EQ(Imports(), at_start_.ipc_imports + 1);
    ASSERT_EQ(ote_cuda_device_reclaim(dev_, nullptr), OTE_OK);
    EXPECT_EQ(Imports(), at_start_.ipc_imports);
    EndChild();
}

TEST_F(CudaIpcTest, ExportingProcessCannotImportItsOwnExport) {
    ote_cuda_alloc_t *a = nullptr;
    ASSERT_EQ(ote_cuda_alloc_create(dev_, kAllocSize, 0, &a), OTE_OK);
    ote_cuda_ipc_export_t *e = nullptr;
    ASSERT_EQ(ote_cuda_ipc_export_alloc(a, &e), OTE_OK);
    EXPECT_EQ(ote_cuda_alloc_users(a), 1u); // exported memory is in use
    EXPECT_EQ(ote_cuda_alloc_destroy(a, ote_deadline_after(5 * OTE_NSEC_PER_MSEC)), OTE_ERR_BUSY);
    ASSERT_EQ(ote_cuda_ipc_cache_create(dev_, 4, 64 << 20, &cache_), OTE_OK);
    ote_cuda_ipc_mapping_t *m = nullptr;
    EXPECT_NE(ote_cuda_ipc_import(cache_, getpid(), ote_cuda_ipc_export_desc(e), &m), OTE_OK);
    EXPECT_EQ(m, nullptr);
    EXPECT_EQ(Stats().entries, 0u);
    // An export by pointer describes the whole allocation.
    ote_cuda_ipc_export_t *e2 = nullptr;
    ASSERT_EQ(ote_cuda_ipc_export_create(dev_, ote_cuda_alloc_ptr(a) + 1000, &e2), OTE_OK);
    EXPECT_EQ(ote_cuda_ipc_export_desc(e2)->base, ote_cuda_alloc_ptr(a));
    EXPECT_EQ(ote_cuda_ipc_export_desc(e2)->buffer_id, ote_cuda_ipc_export_desc(e)->buffer_id);
    ote_cuda_ipc_export_destroy(e2);
    ote_cuda_ipc_export_destroy(e);
    EXPECT_EQ(ote_cuda_alloc_users(a), 0u);
    ASSERT_EQ(ote_cuda_alloc_destroy(a, LongDeadline()), OTE_OK);
}

} // namespace

namespace {

TEST_F(CudaIpcTest, VmmAllocationCrossesAsAPosixFd) {
    int vmm = 0;
    ASSERT_EQ(
        t_->cuDeviceGetAttribute(&vmm, OTE_CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                 ote_cuda_device_handle(dev_)),
        OTE_CU_SUCCESS);
    if (!vmm) GTEST_SKIP() << "the device does not support virtual memory management";
    Spawn(0, true);
    uint64_t size = 0;
    ASSERT_TRUE(IoFull(sock_, &size, sizeof(size), false, LongDeadline()))
        << "no size from the exporter";
    int fd = RecvFd(sock_);
    ASSERT_GE(fd, 0);
    ote_cuda_alloc_t *imported = nullptr;
    ASSERT_EQ(ote_cuda_alloc_import_vmm(dev_, fd, size, &imported), OTE_OK);
    EXPECT_EQ(ote_cuda_alloc_is_vmm(imported), 1);
    EXPECT_EQ(ReadByte(ote_cuda_alloc_ptr(imported) + size - 1), Pattern(7));
    close(fd); // the import keeps its own reference to the memory
    EXPECT_EQ(ReadByte(ote_cuda_alloc_ptr(imported) + 12345), Pattern(7));
    ASSERT_EQ(ote_cuda_alloc_destroy(imported, LongDeadline()), OTE_OK);
    EndChild();
}

// Open fds of this process (/proc/self/fd), for leak checks.
int OpenFds() {
    int n = 0;
    for (int fd = 0; fd < 4096; fd++)
        if (fcntl(fd, F_GETFD) >= 0) n++;
    return n;
}

bool VmmSupported(const ote_cuda_driver_table_t *t, ote_cuda_device_t *dev) {
    int vmm = 0;
    return t->cuDeviceGetAttribute(&vmm,
                                   OTE_CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                   ote_cuda_device_handle(dev)) == OTE_CU_SUCCESS &&
           vmm != 0;
}

// A VMM export made from a pointer (ote_cuda_ipc_export_vmm) is imported through the
// cache: bytes both ways, a cache hit for the second import (its fd unused), the close
// receipt unmaps and releases it once unused; no fd and no VMM object left behind (the
// objects counted by the fake only).
TEST_F(CudaIpcTest, VmmExportFromPointerImportsThroughTheCache) {
    if (!VmmSupported(t_, dev_)) GTEST_SKIP() << "no virtual memory management";
    const int fds0 = OpenFds();
    const fake_cuda_counters_t c0 = Counters();
    Spawn(0, true, "vmmptr");
    ote_cuda_ipc_desc_t desc{};
    ASSERT_TRUE(IoFull(sock_, &desc, sizeof(desc), false, LongDeadline()));
    EXPECT_GE(desc.size, kAllocSize);
    EXPECT_NE(desc.buffer_id, 0u);
    int fd = RecvFd(sock_);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ote_cuda_ipc_cache_create(dev_, 4, 64ull << 20, &cache_), OTE_OK);
    ote_cuda_ipc_mapping_t *m = nullptr;
    ASSERT_EQ(ote_cuda_ipc_import_vmm(cache_, 7, &desc, fd, &m), OTE_OK);
    ote_cu_deviceptr_t local = 0;
    ASSERT_EQ(ote_cuda_ipc_mapping_translate(m, desc.base + 4097, 1, &local), OTE_OK);
    EXPECT_EQ(ReadByte(local), Pattern(9));
    uint8_t v = 0x5a;
    ASSERT_EQ(t_->cuMemcpyHtoD(local, &v, 1), OTE_CU_SUCCESS);
    ASSERT_EQ(t_->cuStreamSynchronize(nullptr), OTE_CU_SUCCESS);
    EXPECT_EQ(Ask(kCheck, 0, 4097, 0x5a), OTE_OK); // the exporter sees the write
    EXPECT_EQ(ote_cuda_ipc_mapping_translate(m, desc.base + desc.size, 1, &local), OTE_ERR_ACCESS);
    ote_cuda_ipc_mapping_t *m2 = nullptr;
    ASSERT_EQ(ote_cuda_ipc_import_vmm(cache_, 7, &desc, fd, &m2), OTE_OK);
    EXPECT_EQ(m2, m);
    close(fd); // the import holds its own reference
    EXPECT_EQ(ote_cuda_ipc_import_vmm(cache_, 7, &desc, -1, &m2), OTE_ERR_INVALID);
    ote_cuda_ipc_cache_stats_t s = Stats();
    EXPECT_EQ(s.imports, 1u);
    EXPECT_EQ(s.hits, 1u);
    EXPECT_EQ(s.in_use, 1u);
    if (fake_.present()) { // the fake counts its objects
        EXPECT_EQ(Counters().vmm_mappings, c0.vmm_mappings + 1);
    }
    // The close receipt while in use: invalidated, closed when the last user puts it back.
    EXPECT_EQ(ote_cuda_ipc_close_receipt(cache_, 7, desc.buffer_id), OTE_OK);
    ote_cuda_ipc_mapping_put(cache_, m);
    if (fake_.present()) { // the fake counts its objects
        EXPECT_EQ(Counters().vmm_mappings, c0.vmm_mappings + 1);
    }
    ote_cuda_ipc_mapping_put(cache_, m);
    EXPECT_EQ(Stats().entries, 0u);
    const fake_cuda_counters_t c1 = Counters();
    if (fake_.present()) { // the fake counts its objects
        EXPECT_EQ(c1.vmm_mappings, c0.vmm_mappings);
        EXPECT_EQ(c1.vmm_reservations, c0.vmm_reservations);
        EXPECT_EQ(c1.vmm_handles, c0.vmm_handles);
    }
    EndChild();
    close(sock_);
    sock_ = -1;
    if (fake_.present()) { // a real driver may open fds of its own meanwhile
        EXPECT_EQ(OpenFds(), fds0);
    }
}

// The exporter dies while a VMM import is in use: invalidated, unmapped once put back;
// an unused one is unmapped at once; eviction of an unused VMM import unmaps it too.
TEST_F(CudaIpcTest, VmmImportGoesOnExporterDeathAndEviction) {
    if (!VmmSupported(t_, dev_)) GTEST_SKIP() << "no virtual memory management";
    const fake_cuda_counters_t c0 = Counters();
    Spawn(0, true, "vmmptr");
    ote_cuda_ipc_desc_t desc{};
    ASSERT_TRUE(IoFull(sock_, &desc, sizeof(desc), false, LongDeadline()));
    int fd = RecvFd(sock_);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ote_cuda_ipc_cache_create(dev_, 1, 64ull << 20, &cache_), OTE_OK);
    ote_cuda_ipc_mapping_t *m = nullptr;
    ASSERT_EQ(ote_cuda_ipc_import_vmm(cache_, 9, &desc, fd, &m), OTE_OK);
    ote_cuda_ipc_mapping_put(cache_, m);
    // Eviction: another exporter's key needs the only entry.
    ASSERT_EQ(ote_cuda_ipc_import_vmm(cache_, 10, &desc, fd, &m), OTE_OK);
    EXPECT_EQ(Stats().evictions, 1u);
    if (fake_.present()) { // the fake counts its objects
        EXPECT_EQ(Counters().vmm_mappings, c0.vmm_mappings + 1);
    }
    kill(child_, SIGKILL);
    waitpid(child_, nullptr, 0);
    child_ = -1;
    EXPECT_EQ(ote_cuda_ipc_exporter_dead(cache_, 10), 1u);
    if (fake_.present()) {                                       // the fake counts its objects
        EXPECT_EQ(Counters().vmm_mappings, c0.vmm_mappings + 1); // in use: kept
    }
    EXPECT_EQ(ReadByte(ote_cuda_ipc_mapping_base(m)), Pattern(9)); // still mapped
    ote_cuda_ipc_mapping_put(cache_, m);
    if (fake_.present()) { // the fake counts its objects
        EXPECT_EQ(Counters().vmm_mappings, c0.vmm_mappings);
        EXPECT_EQ(Counters().vmm_handles, c0.vmm_handles);
    }
    close(fd);
}

// What ote_cuda_ipc_export_vmm refuses: memory from cuMemAlloc, and a VMM allocation
// created without the POSIX-fd handle type (OTE_ERR_UNSUPPORTED, no fd made); an
// exportable one in this process gives an fd and the mapping's range.
TEST_F(CudaIpcTest, VmmExportNeedsThePosixFdHandleType) {
    if (!VmmSupported(t_, dev_)) GTEST_SKIP() << "no virtual memory management";
    ote_cuda_alloc_t *plain = nullptr;
    ASSERT_EQ(ote_cuda_alloc_create(dev_, kAllocSize, 0, &plain), OTE_OK);
    ote_cuda_ipc_export_t *e = nullptr;
    EXPECT_EQ(ote_cuda_ipc_export_vmm(dev_, ote_cuda_alloc_ptr(plain), &e), OTE_ERR_NOT_FOUND);
    EXPECT_EQ(ote_cuda_alloc_destroy(plain, LongDeadline()), OTE_OK);

    ASSERT_EQ(ote_cuda_device_make_current(dev_), OTE_OK);
    ote_cu_mem_allocation_prop_t prop = {};
    prop.type = OTE_CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requested_handle_types = 0; // no shareable handle type
    prop.location.type = OTE_CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ote_cuda_device_ordinal(dev_);
    size_t gran = 0;
    ASSERT_EQ(t_->cuMemGetAllocationGranularity(&gran, &prop, OTE_CU_MEM_ALLOC_GRANULARITY_MINIMUM),
              OTE_CU_SUCCESS);
    ote_cu_mem_handle_t h = 0;
    ASSERT_EQ(t_->cuMemCreate(&h, gran, &prop, 0), OTE_CU_SUCCESS);
    ote_cu_deviceptr_t p = 0;
    ASSERT_EQ(t_->cuMemAddressReserve(&p, gran, 0, 0, 0), OTE_CU_SUCCESS);
    ASSERT_EQ(t_->cuMemMap(p, gran, 0, h, 0), OTE_CU_SUCCESS);
    ote_cu_mem_access_desc_t ad = {{OTE_CU_MEM_LOCATION_TYPE_DEVICE, prop.location.id},
                                   OTE_CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    ASSERT_EQ(t_->cuMemSetAccess(p, gran, &ad, 1), OTE_CU_SUCCESS);
    const uint64_t fds_made = Counters().vmm_exported_fds;
    EXPECT_EQ(ote_cuda_ipc_export_vmm(dev_, p + 10, &e), OTE_ERR_UNSUPPORTED);
    if (fake_.present()) { // the fake counts its objects
        EXPECT_EQ(Counters().vmm_exported_fds, fds_made);
    }
    EXPECT_EQ(t_->cuMemUnmap(p, gran), OTE_CU_SUCCESS);
    EXPECT_EQ(t_->cuMemAddressFree(p, gran), OTE_CU_SUCCESS);
    EXPECT_EQ(t_->cuMemRelease(h), OTE_CU_SUCCESS);

    ote_cuda_alloc_t *vmm = nullptr;
    ASSERT_EQ(ote_cuda_alloc_create(dev_, kAllocSize, OTE_CUDA_ALLOC_VMM, &vmm), OTE_OK);
    const uint64_t handles = Counters().vmm_handles;
    ASSERT_EQ(ote_cuda_ipc_export_vmm(dev_, ote_cuda_alloc_ptr(vmm) + 5, &e), OTE_OK);
    EXPECT_GE(ote_cuda_ipc_export_fd(e), 0);
    EXPECT_EQ(ote_cuda_ipc_export_desc(e)->base, ote_cuda_alloc_ptr(vmm));
    EXPECT_EQ(ote_cuda_ipc_export_desc(e)->size, ote_cuda_alloc_size(vmm));
    if (fake_.present()) {                          // the fake counts its objects
        EXPECT_EQ(Counters().vmm_handles, handles); // the retained handle was released
    }
    ote_cuda_ipc_export_destroy(e);
    EXPECT_EQ(ote_cuda_alloc_destroy(vmm, LongDeadline()), OTE_OK);
}

} // namespace

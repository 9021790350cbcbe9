// The fake libcuda itself (tests/cuda:libfake_cuda.so), loaded with dlopen from the
// runfiles like the production path loads libcuda.so.1, and driven through the real
// cuda.h signatures: device memory that a host dereference crashes on, really
// asynchronous streams, per-thread contexts, fault points and counters, IPC and VMM
// across two processes, dmabuf fds.
//
// Multi-process cases re-execute this binary (/proc/self/exe) with FAKE_CHILD_MODE set:
// a static initializer runs the child's part before GoogleTest starts and exits with 0
// on success (a distinct non-zero code names the failed step).
#include <gtest/gtest.h>

#include <cuda.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/cuda/fake_cuda_control.h"
#include "tests/util/test_base.h"
#include "tests/util/wait.h"

namespace {

std::string FakeLibPath() {
    const char *srcdir = std::getenv("TEST_SRCDIR");
    const char *ws = std::getenv("TEST_WORKSPACE");
    if (srcdir == nullptr || ws == nullptr) return "tests/cuda/libfake_cuda.so";
    return std::string(srcdir) + "/" + ws + "/tests/cuda/libfake_cuda.so";
}

// The driver entry points, resolved through cuGetProcAddress_v2 by base name (as the
// owners resolve them), with the real signatures from cuda.h.
struct Api {
    void *handle = nullptr;
    decltype(&cuGetProcAddress_v2) GetProcAddress = nullptr;
    decltype(&cuInit) Init = nullptr;
    decltype(&cuDeviceGetCount) DeviceGetCount = nullptr;
    decltype(&cuDeviceGetName) DeviceGetName = nullptr;
    decltype(&cuDeviceGetPCIBusId) DeviceGetPCIBusId = nullptr;
    decltype(&cuDeviceGetAttribute) DeviceGetAttribute = nullptr;
    decltype(&cuDevicePrimaryCtxRetain) PrimaryCtxRetain = nullptr;
    decltype(&cuDevicePrimaryCtxRelease) PrimaryCtxRelease = nullptr;
    decltype(&cuCtxSetCurrent) CtxSetCurrent = nullptr;
    decltype(&cuCtxGetCurrent) CtxGetCurrent = nullptr;
    decltype(&cuCtxGetDevice) CtxGetDevice = nullptr;
    decltype(&cuGetErrorName) GetErrorName = nullptr;
    decltype(&cuMemAlloc) MemAlloc = nullptr;
    decltype(&cuMemFree) MemFree = nullptr;
    decltype(&cuMemGetAddressRange) MemGetAddressRange = nullptr;
    decltype(&cuMemHostAlloc) MemHostAlloc = nullptr;
    decltype(&cuMemFreeHost) MemFreeHost = nullptr;
    decltype(&cuMemHostRegister) MemHostRegister = nullptr;
    decltype(&cuMemHostUnregister) MemHostUnregister = nullptr;
    decltype(&cuMemcpyHtoD) MemcpyHtoD = nullptr;
    decltype(&cuMemcpyDtoH) MemcpyDtoH = nullptr;
    decltype(&cuMemcpyDtoD) MemcpyDtoD = nullptr;
    decltype(&cuMemcpyHtoDAsync) MemcpyHtoDAsync = nullptr;
    decltype(&cuMemcpyDtoHAsync) MemcpyDtoHAsync = nullptr;
    decltype(&cuMemcpyDtoDAsync) MemcpyDtoDAsync = nullptr;
    decltype(&cuMemsetD8) MemsetD8 = nullptr;
    decltype(&cuPointerGetAttribute) PointerGetAttribute = nullptr;
    decltype(&cuPointerGetAttributes) PointerGetAttributes = nullptr;
    decltype(&cuPointerSetAttribute) PointerSetAttribute = nullptr;
    decltype(&cuStreamCreate) StreamCreate = nullptr;
    decltype(&cuStreamDestroy) StreamDestroy = nullptr;
    decltype(&cuStreamQuery) StreamQuery = nullptr;
    decltype(&cuStreamSynchronize) StreamSynchronize = nullptr;
    decltype(&cuLaunchHostFunc) LaunchHostFunc = nullptr;
    decltype(&cuEventCreate) EventCreate = nullptr;
    decltype(&cuEventRecord) EventRecord = nullptr;
    decltype(&cuEventQuery) EventQuery = nullptr;
    decltype(&cuEventSynchronize) EventSynchronize = nullptr;
    decltype(&cuEventDestroy) EventDestroy = nullptr;
    decltype(&cuIpcGetMemHandle) IpcGetMemHandle = nullptr;
    decltype(&cuIpcOpenMemHandle) IpcOpenMemHandle = nullptr;
    decltype(&cuIpcCloseMemHandle) IpcCloseMemHandle = nullptr;
    decltype(&cuMemGetHandleForAddressRange) MemGetHandleForAddressRange = nullptr;
    decltype(&cuMemGetAllocationGranularity) MemGetAllocationGranularity = nullptr;
    decltype(&cuMemCreate) MemCreate = nullptr;
    decltype(&cuMemRelease) MemRelease = nullptr;
    decltype(&cuMemAddressReserve) MemAddressReserve = nullptr;
    decltype(&cuMemAddressFree) MemAddressFree = nullptr;
    decltype(&cuMemMap) MemMap = nullptr;
    decltype(&cuMemUnmap) MemUnmap = nullptr;
    decltype(&cuMemSetAccess) MemSetAccess = nullptr;
    decltype(&cuMemExportToShareableHandle) MemExportToShareableHandle = nullptr;
    decltype(&cuMemImportFromShareableHandle) MemImportFromShareableHandle = nullptr;
    // The control API.
    fake_cuda_fail_fn Fail = nullptr;
    fake_cuda_clear_faults_fn ClearFaults = nullptr;
    fake_cuda_set_max_delay_us_fn SetMaxDelayUs = nullptr;
    fake_cuda_counters_fn Counters = nullptr;
    fake_cuda_calls_fn Calls = nullptr;
    fake_cuda_is_fake_fn IsFake = nullptr;
    fake_cuda_hold_copies_fn HoldCopies = nullptr;
    fake_cuda_release_copies_fn ReleaseCopies = nullptr;

    void *Proc(const char *name) {
        void *p = nullptr;
        CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
        if (GetProcAddress(name, &p, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS)
            return nullptr;
        return st == CU_GET_PROC_ADDRESS_SUCCESS ? p : nullptr;
    }
    bool Load() {
        handle = dlopen(FakeLibPath().c_str(), RTLD_NOW | RTLD_LOCAL);
        if (handle == nullptr) return false;
        GetProcAddress =
            reinterpret_cast<decltype(GetProcAddress)>(dlsym(handle, "cuGetProcAddress_v2"));
        if (GetProcAddress == nullptr) return false;
        bool ok = true;
#define FK_LOAD(field, base) \
    field = reinterpret_cast<decltype(field)>(Proc(base)); \
    if (field == nullptr) { \
        std::fprintf(stderr, "fake_driver_test: %s not resolved\n", base); \
        ok = false; \
    }
        FK_LOAD(Init, "cuInit");
        FK_LOAD(DeviceGetCount, "cuDeviceGetCount");
        FK_LOAD(DeviceGetName, "cuDeviceGetName");
        FK_LOAD(DeviceGetPCIBusId, "cuDeviceGetPCIBusId");
        FK_LOAD(DeviceGetAttribute, "cuDeviceGetAttribute");
        FK_LOAD(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
        FK_LOAD(PrimaryCtxRelease, "cuDevicePrimaryCtxRelease");
        FK_LOAD(CtxSetCurrent, "cuCtxSetCurrent");
        FK_LOAD(CtxGetCurrent, "cuCtxGetCurrent");
        FK_LOAD(CtxGetDevice, "cuCtxGetDevice");
        FK_LOAD(GetErrorName, "cuGetErrorName");
        FK_LOAD(MemAlloc, "cuMemAlloc");
        FK_LOAD(MemFree, "cuMemFree");
        FK_LOAD(MemGetAddressRange, "cuMemGetAddressRange");
        FK_LOAD(MemHostAlloc, "cuMemHostAlloc");
        FK_LOAD(MemFreeHost, "cuMemFreeHost");
        FK_LOAD(MemHostRegister, "cuMemHostRegister");
        FK_LOAD(MemHostUnregister, "cuMemHostUnregister");
        FK_LOAD(MemcpyHtoD, "cuMemcpyHtoD");
        FK_LOAD(MemcpyDtoH, "cuMemcpyDtoH");
        FK_LOAD(MemcpyDtoD, "cuMemcpyDtoD");
        FK_LOAD(MemcpyHtoDAsync, "cuMemcpyHtoDAsync");
        FK_LOAD(MemcpyDtoHAsync, "cuMemcpyDtoHAsync");
        FK_LOAD(MemcpyDtoDAsync, "cuMemcpyDtoDAsync");
        FK_LOAD(MemsetD8, "cuMemsetD8");
        FK_LOAD(PointerGetAttribute, "cuPointerGetAttribute");
        FK_LOAD(PointerGetAttributes, "cuPointerGetAttributes");
        FK_LOAD(PointerSetAttribute, "cuPointerSetAttribute");
        FK_LOAD(StreamCreate, "cuStreamCreate");
        FK_LOAD(StreamDestroy, "cuStreamDestroy");
        FK_LOAD(StreamQuery, "cuStreamQuery");
        FK_LOAD(StreamSynchronize, "cuStreamSynchronize");
        FK_LOAD(LaunchHostFunc, "cuLaunchHostFunc");
        FK_LOAD(EventCreate, "cuEventCreate");
        FK_LOAD(EventRecord, "cuEventRecord");
        FK_LOAD(EventQuery, "cuEventQuery");
        FK_LOAD(EventSynchronize, "cuEventSynchronize");
        FK_LOAD(EventDestroy, "cuEventDestroy");
        FK_LOAD(IpcGetMemHandle, "cuIpcGetMemHandle");
        FK_LOAD(IpcOpenMemHandle, "cuIpcOpenMemHandle");
        FK_LOAD(IpcCloseMemHandle, "cuIpcCloseMemHandle");
        FK_LOAD(MemGetHandleForAddressRange, "cuMemGetHandleForAddressRange");
        FK_LOAD(MemGetAllocationGranularity, "cuMemGetAllocationGranularity");
        FK_LOAD(MemCreate, "cuMemCreate");
        FK_LOAD(MemRelease, "cuMemRelease");
        FK_LOAD(MemAddressReserve, "cuMemAddressReserve");
        FK_LOAD(MemAddressFree, "cuMemAddressFree");
        FK_LOAD(MemMap, "cuMemMap");
        FK_LOAD(MemUnmap, "cuMemUnmap");
        FK_LOAD(MemSetAccess, "cuMemSetAccess");
        FK_LOAD(MemExportToShareableHandle, "cuMemExportToShareableHandle");
        FK_LOAD(MemImportFromShareableHandle, "cuMemImportFromShareableHandle");
#undef FK_LOAD
        Fail = reinterpret_cast<fake_cuda_fail_fn>(dlsym(handle, "fake_cuda_fail"));
        ClearFaults =
            reinterpret_cast<fake_cuda_clear_faults_fn>(dlsym(handle, "fake_cuda_clear_faults"));
        SetMaxDelayUs = reinterpret_cast<fake_cuda_set_max_delay_us_fn>(
            dlsym(handle, "fake_cuda_set_max_delay_us"));
        Counters = reinterpret_cast<fake_cuda_counters_fn>(dlsym(handle, "fake_cuda_counters"));
        Calls = reinterpret_cast<fake_cuda_calls_fn>(dlsym(handle, "fake_cuda_calls"));
        IsFake = reinterpret_cast<fake_cuda_is_fake_fn>(dlsym(handle, "fake_cuda_is_fake"));
        HoldCopies =
            reinterpret_cast<fake_cuda_hold_copies_fn>(dlsym(handle, "fake_cuda_hold_copies"));
        ReleaseCopies = reinterpret_cast<fake_cuda_release_copies_fn>(
            dlsym(handle, "fake_cuda_release_copies"));
        return ok && Fail && ClearFaults && SetMaxDelayUs && Counters && Calls && IsFake &&
               HoldCopies && ReleaseCopies;
    }
};

// One instance per process, never unloaded (the library's state is process-wide).
Api &A() {
    static Api *api = [] {
        Api *a = new Api;
        if (!a->Load()) {
            std::fprintf(stderr, "fake_driver_test: cannot load %s: %s\n", FakeLibPath().c_str(),
                         dlerror());
            std::abort();
        }
        return a;
    }();
    return *api;
}

fake_cuda_counters_t Snap() {
    fake_cuda_counters_t c;
    A().Counters(&c);
    return c;
}

std::string Hex(const void *p, size_t n) {
    static const char *d = "0123456789abcdef";
    std::string s;
    for (size_t i = 0; i < n; i++) {
        unsigned char b = static_cast<const unsigned char *>(p)[i];
        s += d[b >> 4];
        s += d[b & 15];
    }
    return s;
}

bool Unhex(const char *s, void *out, size_t n) {
    if (s == nullptr || std::strlen(s) != 2 * n) return false;
    for (size_t i = 0; i < n; i++) {
        unsigned v = 0;
        if (std::sscanf(s + 2 * i, "%2x", &v) != 1) return false;
        static_cast<unsigned char *>(out)[i] = static_cast<unsigned char>(v);
    }
    return true;
}

// Generous for waits that must succeed: a loaded 2-core machine.
constexpr std::chrono::seconds kWait{20};

// Device bytes as a NIC sees them, without a copy through the driver: the allocation's
// dma-buf fd mapped read-only (n a multiple of the page size). Unmapped and closed at
// the end of the scope.
class NicView {
  public:
    NicView() = default;
    NicView(const NicView &) = delete;
    NicView &operator=(const NicView &) = delete;
    ~NicView() {
        if (m_ != MAP_FAILED) munmap(m_, n_);
        if (fd_ >= 0) close(fd_);
    }
    bool Open(CUdeviceptr d, size_t n) {
        if (A().MemGetHandleForAddressRange(&fd_, d, n, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0) !=
            CUDA_SUCCESS)
            return false;
        m_ = mmap(nullptr, n, PROT_READ, MAP_SHARED, fd_, 0);
        n_ = n;
        return m_ != MAP_FAILED;
    }
    unsigned char operator[](size_t i) const {
        return static_cast<const volatile unsigned char *>(m_)[i];
    }

  private:
    int fd_ = -1;
    void *m_ = MAP_FAILED;
    size_t n_ = 0;
};

// ---- the child side of multi-process cases ----

int ChildSetup(CUcontext *ctx) {
    Api &a = A();
    if (a.Init(0) != CUDA_SUCCESS) return 10;
    if (a.PrimaryCtxRetain(ctx, 0) != CUDA_SUCCESS) return 11;
    if (a.CtxSetCurrent(*ctx) != CUDA_SUCCESS) return 12;
    return 0;
}

// Imports the IPC handle in FAKE_CHILD_HANDLE, checks the bytes (0x5a), writes 0xc3,
// opens it again (same mapping), closes both.
int ChildIpcImport() {
    Api &a = A();
    CUcontext ctx;
    if (int r = ChildSetup(&ctx)) return r;
    CUipcMemHandle h;
    if (!Unhex(std::getenv("FAKE_CHILD_HANDLE"), &h, sizeof(h))) return 20;
    size_t n = std::strtoull(std::getenv("FAKE_CHILD_SIZE"), nullptr, 0);
    CUdeviceptr d = 0, d2 = 0;
    if (a.IpcOpenMemHandle(&d, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != CUDA_SUCCESS) return 21;
    std::vector<unsigned char> buf(n);
    if (a.MemcpyDtoH(buf.data(), d, n) != CUDA_SUCCESS) return 22;
    for (size_t i = 0; i < n; i++)
        if (buf[i] != 0x5a) return 23;
    std::memset(buf.data(), 0xc3, n);
    if (a.MemcpyHtoD(d, buf.data(), n) != CUDA_SUCCESS) return 24;
    if (a.IpcOpenMemHandle(&d2, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != CUDA_SUCCESS || d2 != d)
        return 25;
    fake_cuda_counters_t c;
    a.Counters(&c);
    if (c.ipc_imports != 1 || c.ipc_import_refs != 2) return 26;
    if (a.IpcCloseMemHandle(d) != CUDA_SUCCESS || a.IpcCloseMemHandle(d2) != CUDA_SUCCESS)
        return 27;
    a.Counters(&c);
    if (c.ipc_imports != 0 || c.ipc_import_refs != 0) return 28;
    if (a.IpcCloseMemHandle(d) != CUDA_ERROR_INVALID_VALUE) return 29;
    return 0;
}

// Opening FAKE_CHILD_HANDLE must fail (the exporter freed the allocation).
int ChildIpcImportFails() {
    Api &a = A();
    CUcontext ctx;
    if (int r = ChildSetup(&ctx)) return r;
    CUipcMemHandle h;
    if (!Unhex(std::getenv("FAKE_CHILD_HANDLE"), &h, sizeof(h))) return 80;
    CUdeviceptr d = 0;
    if (a.IpcOpenMemHandle(&d, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS) return 81;
    fake_cuda_counters_t c;
    a.Counters(&c);
    if (c.ipc_imports != 0) return 82;
    return 0;
}

// Exports an allocation filled with 0x77: prints the handle on stdout, then waits for
// stdin to close and exits (the allocation dies with it).
int ChildIpcExport() {
    Api &a = A();
    CUcontext ctx;
    if (int r = ChildSetup(&ctx)) return r;
    const size_t n = 8192;
    CUdeviceptr d = 0;
    if (a.MemAlloc(&d, n) != CUDA_SUCCESS) return 30;
    std::vector<unsigned char> buf(n, 0x77);
    if (a.MemcpyHtoD(d, buf.data(), n) != CUDA_SUCCESS) return 31;
    // A pageable HtoD may land after it returns: drain the legacy stream before another
    // process reads.
    if (a.StreamSynchronize(nullptr) != CUDA_SUCCESS) return 34;
    CUipcMemHandle h;
    if (a.IpcGetMemHandle(&h, d + 100) != CUDA_SUCCESS) return 32;
    std::string line = Hex(&h, sizeof(h)) + "\n";
    if (write(1, line.data(), line.size()) != static_cast<ssize_t>(line.size())) return 33;
    char c;
    while (read(0, &c, 1) > 0) {}
    return 0;
}

// Imports the VMM fd FAKE_CHILD_FD (inherited), maps it, checks 0x31, writes 0x92.
int ChildVmmImport() {
    Api &a = A();
    CUcontext ctx;
    if (int r = ChildSetup(&ctx)) return r;
    int fd = std::atoi(std::getenv("FAKE_CHILD_FD"));
    size_t n = std::strtoull(std::getenv("FAKE_CHILD_SIZE"), nullptr, 0);
    CUmemGenericAllocationHandle h = 0;
    if (a.MemImportFromShareableHandle(&h, reinterpret_cast<void *>(static_cast<intptr_t>(fd)),
                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != CUDA_SUCCESS)
        return 40;
    close(fd);
    CUdeviceptr va = 0;
    if (a.MemAddressReserve(&va, n, 0, 0, 0) != CUDA_SUCCESS) return 41;
    if (a.MemMap(va, n, 0, h, 0) != CUDA_SUCCESS) return 42;
    CUmemAccessDesc acc = {};
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = 0;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (a.MemSetAccess(va, n, &acc, 1) != CUDA_SUCCESS) return 43;
    std::vector<unsigned char> buf(4096);
    if (a.MemcpyDtoH(buf.data(), va + n - 4096, 4096) != CUDA_SUCCESS) return 44;
    for (unsigned char b : buf)
        if (b != 0x31) return 45;
    std::memset(buf.data(), 0x92, buf.size());
    if (a.MemcpyHtoD(va, buf.data(), buf.size()) != CUDA_SUCCESS) return 46;
    if (a.MemUnmap(va, n) != CUDA_SUCCESS || a.MemRelease(h) != CUDA_SUCCESS ||
        a.MemAddressFree(va, n) != CUDA_SUCCESS)
        return 47;
    return 0;
}

// Before cuInit: NOT_INITIALIZED. With FAKE_CUDA_DEVICES=2 and FAKE_CUDA_MEM_BYTES=1 MiB:
// two devices, each with its own capacity.
int ChildFreshProcess() {
    Api &a = A();
    CUdeviceptr d = 0;
    int n = 0;
    if (a.MemAlloc(&d, 4096) != CUDA_ERROR_NOT_INITIALIZED) return 50;
    if (a.DeviceGetCount(&n) != CUDA_ERROR_NOT_INITIALIZED) return 51;
    if (a.Init(0) != CUDA_SUCCESS) return 52;
    if (a.DeviceGetCount(&n) != CUDA_SUCCESS || n != 2) return 53;
    CUcontext c0, c1;
    if (a.PrimaryCtxRetain(&c0, 0) != CUDA_SUCCESS || a.PrimaryCtxRetain(&c1, 1) != CUDA_SUCCESS)
        return 54;
    if (c0 == c1) return 55;
    if (a.CtxSetCurrent(c0) != CUDA_SUCCESS) return 56;
    CUdeviceptr a0 = 0, a1 = 0, b0 = 0;
    if (a.MemAlloc(&a0, 1 << 20) != CUDA_SUCCESS) return 57;
    if (a.MemAlloc(&b0, 1) != CUDA_ERROR_OUT_OF_MEMORY) return 58;
    if (a.CtxSetCurrent(c1) != CUDA_SUCCESS) return 59;
    CUdevice dev = -1;
    if (a.CtxGetDevice(&dev) != CUDA_SUCCESS || dev != 1) return 60;
    if (a.MemAlloc(&a1, 512 << 10) != CUDA_SUCCESS) return 61;
    int ord = -1;
    if (a.PointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, a1) != CUDA_SUCCESS ||
        ord != 1)
        return 62;
    fake_cuda_counters_t c;
    a.Counters(&c);
    if (c.device_bytes_per_device[0] != (1u << 20) || c.device_bytes_per_device[1] != (512u << 10))
        return 63;
    if (c.primary_ctx_refs[0] != 1 || c.primary_ctx_refs[1] != 1 || c.primary_ctx_retains != 2)
        return 64;
    if (a.MemFree(a1) != CUDA_SUCCESS) return 65;
    if (a.CtxSetCurrent(c0) != CUDA_SUCCESS || a.MemFree(a0) != CUDA_SUCCESS) return 66;
    if (a.MemAlloc(&b0, 1 << 20) != CUDA_SUCCESS || a.MemFree(b0) != CUDA_SUCCESS) return 67;
    // A released primary context is no longer usable by the threads it is current on.
    if (a.PrimaryCtxRelease(0) != CUDA_SUCCESS) return 68;
    if (a.MemAlloc(&b0, 4096) != CUDA_ERROR_INVALID_CONTEXT) return 69;
    if (a.PrimaryCtxRelease(0) != CUDA_ERROR_INVALID_CONTEXT) return 70;
    if (a.PrimaryCtxRelease(1) != CUDA_SUCCESS) return 71;
    return 0;
}

// FAKE_CUDA_PCI_BUS_IDS="0000:1b:00.0,0001:2c:03.1" with FAKE_CUDA_DEVICES=3: devices 0
// and 1 at the listed addresses, device 2 past the list at the default 0000:1a:00.0; the
// bus id and the PCI attributes agree. FAKE_CHILD_PCI_BAD set: the list is malformed and
// cuInit fails with CUDA_ERROR_INVALID_VALUE.
int ChildPciBusIds() {
    Api &a = A();
    if (std::getenv("FAKE_CHILD_PCI_BAD") != nullptr)
        return a.Init(0) == CUDA_ERROR_INVALID_VALUE ? 0 : 80;
    if (a.Init(0) != CUDA_SUCCESS) return 81;
    const char *want[3] = {"0000:1b:00.0", "0001:2c:03.1", "0000:1a:00.0"};
    const int attrs[3][3] = {{0, 0x1b, 0}, {1, 0x2c, 3}, {0, 0x1a, 0}};
    for (int d = 0; d < 3; d++) {
        char bus[32] = {};
        if (a.DeviceGetPCIBusId(bus, sizeof(bus), d) != CUDA_SUCCESS) return 82;
        if (std::strcmp(bus, want[d]) != 0) return 83 + d;
        int dom = -1, b = -1, dv = -1;
        if (a.DeviceGetAttribute(&dom, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, d) != CUDA_SUCCESS ||
            a.DeviceGetAttribute(&b, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, d) != CUDA_SUCCESS ||
            a.DeviceGetAttribute(&dv, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, d) != CUDA_SUCCESS)
            return 86;
        if (dom != attrs[d][0] || b != attrs[d][1] || dv != attrs[d][2]) return 87 + d;
    }
    return 0;
}

int RunChildIfAsked() {
    const char *mode = std::getenv("FAKE_CHILD_MODE");
    if (mode == nullptr) return 0;
    int rc = 99;
    if (std::strcmp(mode, "ipc_import") == 0) rc = ChildIpcImport();
    if (std::strcmp(mode, "ipc_export") == 0) rc = ChildIpcExport();
    if (std::strcmp(mode, "ipc_import_fails") == 0) rc = ChildIpcImportFails();
    if (std::strcmp(mode, "vmm_import") == 0) rc = ChildVmmImport();
    if (std::strcmp(mode, "fresh") == 0) rc = ChildFreshProcess();
    if (std::strcmp(mode, "pci") == 0) rc = ChildPciBusIds();
    if (rc != 0) std::fprintf(stderr, "fake_driver_test child %s failed at step %d\n", mode, rc);
    std::fflush(stdout);
    std::exit(rc);
}
const int g_child = RunChildIfAsked();

// Starts this binary in child mode with extra environment; pipes its stdin/stdout when
// asked. Returns the pid.
pid_t SpawnChild(const std::vector<std::string> &env, int *stdin_fd = nullptr,
                 int *stdout_fd = nullptr) {
    int in[2] = {-1, -1}, out[2] = {-1, -1};
    if (stdin_fd != nullptr && pipe2(in, O_CLOEXEC) != 0) return -1;
    if (stdout_fd != nullptr && pipe2(out, O_CLOEXEC) != 0) return -1;
    std::vector<std::string> kept = env;
    pid_t pid = fork();
    if (pid == 0) {
        if (in[0] >= 0) dup2(in[0], 0);
        if (out[1] >= 0) dup2(out[1], 1);
        for (const std::string &e : kept) putenv(const_cast<char *>(e.c_str()));
        execl("/proc/self/exe", "fake_driver_test", static_cast<char *>(nullptr));
        _exit(127);
    }
    if (in[0] >= 0) close(in[0]);
    if (out[1] >= 0) close(out[1]);
    if (stdin_fd != nullptr) *stdin_fd = in[1];
    if (stdout_fd != nullptr) *stdout_fd = out[0];
    return pid;
}

int WaitChild(pid_t pid) {
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// ---- the fixture: a primary context current on the test's thread ----

class FakeDriverTest : public ote_test::OteTest {
  protected:
    void SetUp() override {
        OteTest::SetUp();
        (void)g_child;
        ASSERT_EQ(a.Init(0), CUDA_SUCCESS);
        ASSERT_EQ(a.PrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
        ASSERT_EQ(a.CtxSetCurrent(ctx), CUDA_SUCCESS);
        base = Snap();
    }
    void TearDown() override {
        a.ReleaseCopies();
        a.ClearFaults();
        a.SetMaxDelayUs(200);
        fake_cuda_counters_t c = Snap();
        EXPECT_EQ(c.device_allocs, base.device_allocs) << "device allocations leaked";
        EXPECT_EQ(c.host_allocs, base.host_allocs);
        EXPECT_EQ(c.host_registrations, base.host_registrations);
        EXPECT_EQ(c.events, base.events);
        EXPECT_EQ(c.ipc_imports, base.ipc_imports);
        EXPECT_EQ(c.vmm_handles, base.vmm_handles);
        EXPECT_EQ(c.vmm_reservations, base.vmm_reservations);
        EXPECT_EQ(c.vmm_mappings, base.vmm_mappings);
        EXPECT_TRUE(ote_test::WaitUntil([&] { return Snap().streams == base.streams; }, kWait,
                                        "the stream workers to end"));
        EXPECT_EQ(Snap().pending_ops, 0u);
        EXPECT_EQ(a.PrimaryCtxRelease(0), CUDA_SUCCESS);
        EXPECT_EQ(a.CtxSetCurrent(nullptr), CUDA_SUCCESS);
        OteTest::TearDown();
    }
    Api &a = A();
    CUcontext ctx = nullptr;
    fake_cuda_counters_t base{};
};

TEST_F(FakeDriverTest, ResolvesBaseNamesToVersionedExports) {
    EXPECT_EQ(a.IsFake(), 1);
    EXPECT_EQ(reinterpret_cast<void *>(a.MemAlloc), dlsym(a.handle, "cuMemAlloc_v2"));
    EXPECT_EQ(reinterpret_cast<void *>(a.StreamDestroy), dlsym(a.handle, "cuStreamDestroy_v2"));
    EXPECT_EQ(reinterpret_cast<void *>(a.IpcOpenMemHandle),
              dlsym(a.handle, "cuIpcOpenMemHandle_v2"));
    EXPECT_EQ(reinterpret_cast<void *>(a.MemcpyHtoDAsync), dlsym(a.handle, "cuMemcpyHtoDAsync_v2"));
    EXPECT_EQ(a.Proc("cuGetProcAddress"), reinterpret_cast<void *>(a.GetProcAddress));
    void *p = reinterpret_cast<void *>(0x1);
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
    // As on an H200 (driver 580): the call succeeds, the symbol status says not found.
    EXPECT_EQ(a.GetProcAddress("cuNoSuchThing", &p, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st),
              CUDA_SUCCESS);
    EXPECT_EQ(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    EXPECT_EQ(p, nullptr);
    const char *name = nullptr;
    EXPECT_EQ(a.GetErrorName(CUDA_ERROR_INVALID_CONTEXT, &name), CUDA_SUCCESS);
    EXPECT_STREQ(name, "CUDA_ERROR_INVALID_CONTEXT");
    EXPECT_EQ(a.GetErrorName(static_cast<CUresult>(123456), &name), CUDA_ERROR_INVALID_VALUE);
    char dev_name[64] = {};
    EXPECT_EQ(a.DeviceGetName(dev_name, sizeof(dev_name), 0), CUDA_SUCCESS);
    EXPECT_STREQ(dev_name, "Fake GPU 0");
}

TEST_F(FakeDriverTest, FreshProcessNeedsInitAndHasPerDeviceCapacity) {
    pid_t pid =
        SpawnChild({"FAKE_CHILD_MODE=fresh", "FAKE_CUDA_DEVICES=2", "FAKE_CUDA_MEM_BYTES=1048576"});
    ASSERT_GT(pid, 0);
    EXPECT_EQ(WaitChild(pid), 0);
}

TEST_F(FakeDriverTest, PciBusIdsComeFromTheEnvironment) {
    pid_t pid = SpawnChild({"FAKE_CHILD_MODE=pci", "FAKE_CUDA_DEVICES=3",
                            "FAKE_CUDA_PCI_BUS_IDS=0000:1b:00.0,0001:2c:03.1"});
    ASSERT_GT(pid, 0);
    EXPECT_EQ(WaitChild(pid), 0);
    pid = SpawnChild({"FAKE_CHILD_MODE=pci", "FAKE_CHILD_PCI_BAD=1",
                      "FAKE_CUDA_PCI_BUS_IDS=0000:1b:00.0,1b:00.0"});
    ASSERT_GT(pid, 0);
    EXPECT_EQ(WaitChild(pid), 0);
}

// A child forked (without exec) after cuInit cannot use the parent's driver: calls fail at
// once instead of waiting for stream workers that did not come along, and exit() does not
// hang in the library's destructor.
TEST_F(FakeDriverTest, ForkedChildCannotUseTheParentsDriver) {
    CUstream s = nullptr;
    ASSERT_EQ(a.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUdeviceptr d = 0;
    ASSERT_EQ(a.MemAlloc(&d, 4096), CUDA_SUCCESS);
    pid_t pid = fork();
    if (pid == 0) {
        CUdeviceptr c = 0;
        char b = 0;
        int rc = 0;
        if (a.MemAlloc(&c, 4096) != CUDA_ERROR_NOT_INITIALIZED) rc = 1;
        if (a.MemcpyDtoH(&b, d, 1) != CUDA_ERROR_NOT_INITIALIZED) rc = 2;
        if (a.StreamSynchronize(s) != CUDA_ERROR_NOT_INITIALIZED) rc = 3;
        if (a.Init(0) != CUDA_ERROR_NOT_INITIALIZED) rc = 4;
#ifdef OTE_ASAN
        // The sanitizer allocator's lock, if another thread held it at fork(), stays held
        // in the child, and LeakSanitizer's exit-time check would hang on it: skip exit().
        _exit(rc);
#else
        std::exit(rc); // runs the library's destructor
#endif
    }
    ASSERT_GT(pid, 0);
    int status = 0;
    bool ended = ote_test::WaitUntil([&] { return waitpid(pid, &status, WNOHANG) == pid; }, kWait,
                                     "the forked child to exit");
    if (!ended) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    EXPECT_EQ(a.StreamDestroy(s), CUDA_SUCCESS);
    EXPECT_EQ(a.MemFree(d), CUDA_SUCCESS);
}

TEST_F(FakeDriverTest, ThreadWithoutContextGetsInvalidContext) {
    CUstream ms = nullptr;
    CUevent me = nullptr;
    ASSERT_EQ(a.StreamCreate(&ms, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    ASSERT_EQ(a.EventCreate(&me, 0), CUDA_SUCCESS);
    std::vector<CUresult> got;
    std::thread t([&] {
        CUcontext cur = reinterpret_cast<CUcontext>(0x1);
        got.push_back(a.CtxGetCurrent(&cur));
        got.push_back(cur == nullptr ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN);
        CUdeviceptr d = 0;
        got.push_back(a.MemAlloc(&d, 4096));
        CUstream s = nullptr;
        got.push_back(a.StreamCreate(&s, CU_STREAM_NON_BLOCKING));
        CUevent e = nullptr;
        got.push_back(a.EventCreate(&e, 0));
        void *h = nullptr;
        got.push_back(a.MemHostAlloc(&h, 4096, 0));
        char buf[8] = {};
        got.push_back(a.MemcpyDtoH(buf, 0x1000, sizeof(buf)));
        CUdevice dev;
        got.push_back(a.CtxGetDevice(&dev));
        got.push_back(a.StreamQuery(ms)); // handles made elsewhere need a context too
        got.push_back(a.EventQuery(me));
        got.push_back(a.EventRecord(me, ms));
    });
    t.join();
    EXPECT_EQ(a.EventDestroy(me), CUDA_SUCCESS);
    EXPECT_EQ(a.StreamDestroy(ms), CUDA_SUCCESS);
    ASSERT_EQ(got.size(), 11u);
    EXPECT_EQ(got[0], CUDA_SUCCESS);
    EXPECT_EQ(got[1], CUDA_SUCCESS) << "a new thread has no current context";
    for (size_t i = 2; i < got.size(); i++) EXPECT_EQ(got[i], CUDA_ERROR_INVALID_CONTEXT) << i;
}

TEST_F(FakeDriverTest, DeviceMemoryIsNotHostAddressable) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    CUdeviceptr d = 0;
    ASSERT_EQ(a.MemAlloc(&d, 4096), CUDA_SUCCESS);
    unsigned char v = 0xab;
    ASSERT_EQ(a.MemcpyHtoD(d, &v, 1), CUDA_SUCCESS);
    EXPECT_DEATH(
        {
            volatile unsigned char *p = reinterpret_cast<volatile unsigned char *>(d);
            std::fprintf(stderr, "read %u\n", static_cast<unsigned>(*p));
        },
        "");
    EXPECT_DEATH({ *reinterpret_cast<volatile unsigned char *>(d + 8) = 1; }, "");
    unsigned char back = 0;
    ASSERT_EQ(a.MemcpyDtoH(&back, d, 1), CUDA_SUCCESS);
    EXPECT_EQ(back, 0xab);
    EXPECT_EQ(a.MemFree(d), CUDA_SUCCESS);
}

TEST_F(FakeDriverTest, AllocationAlignmentAttributesAndBufferIds) {
    CUdeviceptr small = 0, big = 0;
    ASSERT_EQ(a.MemAlloc(&small, 1000), CUDA_SUCCESS);
    ASSERT_EQ(a.MemAlloc(&big, (4u << 20) + 5), CUDA_SUCCESS);
    EXPECT_EQ(small % 256, 0u);
    EXPECT_EQ(big % (2u << 20), 0u);
    unsigned int type = 0;
    EXPECT_EQ(a.PointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, small + 999),
              CUDA_SUCCESS);
    EXPECT_EQ(type, static_cast<unsigned>(CU_MEMORYTYPE_DEVICE));
    EXPECT_EQ(a.PointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, small + 1000),
              CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr start = 0;
    size_t size = 0;
    EXPECT_EQ(a.PointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, big + 12345),
              CUDA_SUCCESS);
    EXPECT_EQ(start, big);
    EXPECT_EQ(a.PointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, big + 12345),
              CUDA_SUCCESS);
    EXPECT_EQ(size, (4u << 20) + 5);
    CUdeviceptr rb = 0;
    size_t rs = 0;
    EXPECT_EQ(a.MemGetAddressRange(&rb, &rs, small + 10), CUDA_SUCCESS);
    EXPECT_EQ(rb, small);
    EXPECT_EQ(rs, 1000u);
    CUcontext pctx = nullptr;
    EXPECT_EQ(a.PointerGetAttribute(&pctx, CU_POINTER_ATTRIBUTE_CONTEXT, small), CUDA_SUCCESS);
    EXPECT_EQ(pctx, ctx);
    unsigned sync = 1;
    EXPECT_EQ(a.PointerSetAttribute(&sync, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, small), CUDA_SUCCESS);
    sync = 0;
    EXPECT_EQ(a.PointerGetAttribute(&sync, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, small), CUDA_SUCCESS);
    EXPECT_EQ(sync, 1u);
    unsigned long long id1 = 0, id2 = 0, id3 = 0;
    EXPECT_EQ(a.PointerGetAttribute(&id1, CU_POINTER_ATTRIBUTE_BUFFER_ID, small), CUDA_SUCCESS);
    EXPECT_EQ(a.PointerGetAttribute(&id2, CU_POINTER_ATTRIBUTE_BUFFER_ID, big), CUDA_SUCCESS);
    EXPECT_NE(id1, id2);
    ASSERT_EQ(a.MemFree(small), CUDA_SUCCESS);
    EXPECT_EQ(a.MemFree(small), CUDA_ERROR_INVALID_VALUE);
    ASSERT_EQ(a.MemAlloc(&small, 1000), CUDA_SUCCESS);
    EXPECT_EQ(a.PointerGetAttribute(&id3, CU_POINTER_ATTRIBUTE_BUFFER_ID, small), CUDA_SUCCESS);
    EXPECT_NE(id3, id1) << "buffer ids are never reused";
    EXPECT_NE(id3, id2);

    // A pointer the driver does not know: one attribute fails, the batch reads zeros.
    int local = 0;
    CUdeviceptr hp = reinterpret_cast<CUdeviceptr>(&local);
    EXPECT_EQ(a.PointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, hp),
              CUDA_ERROR_INVALID_VALUE);
    CUpointer_attribute attrs[3] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_CONTEXT,
                                    CU_POINTER_ATTRIBUTE_BUFFER_ID};
    unsigned mt = 7;
    CUcontext c = reinterpret_cast<CUcontext>(0x1);
    unsigned long long bid = 7;
    void *data[3] = {&mt, &c, &bid};
    EXPECT_EQ(a.PointerGetAttributes(3, attrs, data, hp), CUDA_SUCCESS);
    EXPECT_EQ(mt, 0u);
    EXPECT_EQ(c, nullptr);
    EXPECT_EQ(bid, 0u);
    // As on an H200: the ordinal of an unknown pointer reads -2 and its range is left
    // unwritten.
    CUpointer_attribute range_attrs[3] = {CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                          CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                          CU_POINTER_ATTRIBUTE_RANGE_SIZE};
    int uord = 7;
    CUdeviceptr ustart = 77;
    size_t usize = 77;
    void *range_data[3] = {&uord, &ustart, &usize};
    EXPECT_EQ(a.PointerGetAttributes(3, range_attrs, range_data, hp), CUDA_SUCCESS);
    EXPECT_EQ(uord, -2);
    EXPECT_EQ(ustart, 77u);
    EXPECT_EQ(usize, 77u);
    EXPECT_EQ(a.PointerGetAttributes(3, attrs, data, big + 7), CUDA_SUCCESS);
    EXPECT_EQ(mt, static_cast<unsigned>(CU_MEMORYTYPE_DEVICE));
    EXPECT_EQ(c, ctx);
    EXPECT_EQ(bid, id2);

    // Pinned host memory: host type, the device pointer is the host address (UVA).
    void *h = nullptr;
    ASSERT_EQ(a.MemHostAlloc(&h, 10000, CU_MEMHOSTALLOC_PORTABLE), CUDA_SUCCESS);
    EXPECT_EQ(a.PointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                    reinterpret_cast<CUdeviceptr>(h) + 5),
              CUDA_SUCCESS);
    EXPECT_EQ(type, static_cast<unsigned>(CU_MEMORYTYPE_HOST));
    CUdeviceptr dp = 0;
    EXPECT_EQ(a.PointerGetAttribute(&dp, CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
                                    reinterpret_cast<CUdeviceptr>(h) + 5),
              CUDA_SUCCESS);
    EXPECT_EQ(dp, reinterpret_cast<CUdeviceptr>(h) + 5);
    std::vector<char> reg(8192);
    ASSERT_EQ(a.MemHostRegister(reg.data(), reg.size(), 0), CUDA_SUCCESS);
    EXPECT_EQ(a.MemHostRegister(reg.data() + 100, 10, 0),
              CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    EXPECT_EQ(a.PointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                    reinterpret_cast<CUdeviceptr>(reg.data()) + 100),
              CUDA_SUCCESS);
    EXPECT_EQ(type, static_cast<unsigned>(CU_MEMORYTYPE_HOST));
    EXPECT_EQ(a.MemHostUnregister(reg.data() + 1), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    EXPECT_EQ(a.MemHostUnregister(reg.data()), CUDA_SUCCESS);
    EXPECT_EQ(a.MemFreeHost(h), CUDA_SUCCESS);
    EXPECT_EQ(a.MemFree(small), CUDA_SUCCESS);
    EXPECT_EQ(a.MemFree(big), CUDA_SUCCESS);
}

TEST_F(FakeDriverTest, SyncCopiesMemsetAndBounds) {
    const size_t n = 3 << 20;
    CUdeviceptr d1 = 0, d2 = 0;
    ASSERT_EQ(a.MemAlloc(&d1, n), CUDA_SUCCESS);
    ASSERT_EQ(a.MemAlloc(&d2, n), CUDA_SUCCESS);
    std::vector<unsigned char> src(n), back(n);
    for (size_t i = 0; i < n; i++) src[i] = static_cast<unsigned char>(i * 7 + 3);
    ASSERT_EQ(a.MemcpyHtoD(d1, src.data(), n), CUDA_SUCCESS);
    ASSERT_EQ(a.MemcpyDtoD(d2, d1, n), CUDA_SUCCESS);
    ASSERT_EQ(a.MemsetD8(d2 + 10, 0xee, 5), CUDA_SUCCESS);
    ASSERT_EQ(a.MemcpyDtoH(back.data(), d2, n), CUDA_SUCCESS);
    for (size_t i = 10; i < 15; i++) src[i] = 0xee;
    EXPECT_EQ(back, src);
    EXPECT_EQ(a.MemcpyDtoH(back.data(), d1 + 1, n), CUDA_ERROR_INVALID_VALUE)
        << "past the allocation";
    EXPECT_EQ(a.MemcpyHtoD(reinterpret_cast<CUdeviceptr>(back.data()), src.data(), 1),
              CUDA_ERROR_INVALID_VALUE)
        << "pageable host memory is no device pointer";
    EXPECT_EQ(a.MemFree(d1), CUDA_SUCCESS);
    EXPECT_EQ(a.MemFree(d2), CUDA_SUCCESS);
}

TEST_F(FakeDriverTest, AsyncCopyIsReallyAsynchronous) {
    a.SetMaxDelayUs(2000);
    const size_t n = 64 << 10;
    CUdeviceptr d = 0;
    ASSERT_EQ(a.MemAlloc(&d, n), CUDA_SUCCESS);
    void *pinned = nullptr;
    ASSERT_EQ(a.MemHostAlloc(&pinned, n, 0), CUDA_SUCCESS);
    unsigned char *ph = static_cast<unsigned char *>(pinned);
    CUstream s = nullptr;
    CUevent e = nullptr;
    ASSERT_EQ(a.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    ASSERT_EQ(a.EventCreate(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    int stale = 0, not_ready = 0;
    const int tries = 20;
    for (int t = 0; t < tries; t++) {
        std::vector<unsigned char> pattern(n, static_cast<unsigned char>(t + 1));
        ASSERT_EQ(a.MemcpyHtoD(d, pattern.data(), n), CUDA_SUCCESS);
        // A pageable cuMemcpyHtoD may still be in flight on the legacy stream, which a
        // non-blocking stream does not wait for.
        ASSERT_EQ(a.StreamSynchronize(nullptr), CUDA_SUCCESS);
        std::memset(ph, 0, n);
        ASSERT_EQ(a.MemcpyDtoHAsync(ph, d, n, s), CUDA_SUCCESS);
        ASSERT_EQ(a.EventRecord(e, s), CUDA_SUCCESS);
        if (ph[n - 1] != t + 1) stale++;
        if (a.EventQuery(e) == CUDA_ERROR_NOT_READY) not_ready++;
        ASSERT_EQ(a.EventSynchronize(e), CUDA_SUCCESS);
        EXPECT_EQ(a.EventQuery(e), CUDA_SUCCESS);
        EXPECT_EQ(ph[0], t + 1);
        EXPECT_EQ(ph[n - 1], t + 1);
    }
    EXPECT_GT(stale, 0)
        << "a DtoH into pinned memory completed before its call returned every time";
    EXPECT_GT(not_ready, 0);

    // Pageable memory: an HtoD has taken its source when it returns, a DtoH is complete.
    std::vector<unsigned char> pageable(n, 0x42), back(n, 0);
    ASSERT_EQ(a.MemcpyHtoDAsync(d, pageable.data(), n, s), CUDA_SUCCESS);
    std::memset(pageable.data(), 0x99, n); // too late to matter
    ASSERT_EQ(a.MemcpyDtoHAsync(back.data(), d, n, s), CUDA_SUCCESS);
    EXPECT_EQ(back, std::vector<unsigned char>(n, 0x42));

    // Pinned source: read when the stream gets to it, not at the call.
    std::memset(ph, 0x11, n);
    ASSERT_EQ(a.MemcpyHtoDAsync(d, ph, n, s), CUDA_SUCCESS);
    ASSERT_EQ(a.StreamSynchronize(s), CUDA_SUCCESS);
    EXPECT_EQ(a.StreamQuery(s), CUDA_SUCCESS);
    ASSERT_EQ(a.MemcpyDtoH(back.data(), d, n), CUDA_SUCCESS);
    EXPECT_EQ(back, std::vector<unsigned char>(n, 0x11));

    EXPECT_EQ(a.EventDestroy(e), CUDA_SUCCESS);
    EXPECT_EQ(a.StreamDestroy(s), CUDA_SUCCESS);
    EXPECT_EQ(a.MemFreeHost(pinned), CUDA_SUCCESS);
    EXPECT_EQ(a.MemFree(d), CUDA_SUCCESS);
}

// cuMemcpyHtoD from pageable memory returns once the source is staged, cuMemsetD8 on device
// memory at once (CUDA's documented host synchronisation); a reader that does not go
// through the stream (a NIC through the dmabuf) sees the old bytes until the legacy stream
// drains, unless SYNC_MEMOPS is set on the allocation.
TEST_F(FakeDriverTest, SyncMemopsMakesSynchronousCopiesComplete) {
    a.SetMaxDelayUs(2000);
    const size_t n = 4096;
    CUdeviceptr d = 0;
    ASSERT_EQ(a.MemAlloc(&d, n), CUDA_SUCCESS);
    NicView nic;
    ASSERT_TRUE(nic.Open(d, n));
    int stale_copy = 0, stale_memset = 0;
    const int tries = 20;
    for (int t = 0; t < tries; t++) {
        std::vector<unsigned char> src(n, static_cast<unsigned char>(2 * t + 1));
        ASSERT_EQ(a.MemcpyHtoD(d, src.data(), n), CUDA_SUCCESS);
        if (nic[n - 1] != 2 * t + 1) stale_copy++;
        ASSERT_EQ(a.MemsetD8(d, static_cast<unsigned char>(2 * t + 2), n), CUDA_SUCCESS);
        if (nic[n - 1] != 2 * t + 2) stale_memset++;
        ASSERT_EQ(a.StreamSynchronize(nullptr), CUDA_SUCCESS);
        EXPECT_EQ(nic[0], 2 * t + 2);
        EXPECT_EQ(nic[n - 1], 2 * t + 2);
    }
    EXPECT_GT(stale_copy, 0) << "a pageable cuMemcpyHtoD always landed before returning";
    EXPECT_GT(stale_memset, 0) << "cuMemsetD8 always landed before returning";
    unsigned one = 1;
    ASSERT_EQ(a.PointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, d), CUDA_SUCCESS);
    for (int t = 0; t < tries; t++) {
        std::vector<unsigned char> src(n, static_cast<unsigned char>(100 + t));
        ASSERT_EQ(a.MemcpyHtoD(d, src.data(), n), CUDA_SUCCESS);
        EXPECT_EQ(nic[n - 1], 100 + t);
        ASSERT_EQ(a.MemsetD8(d, static_cast<unsigned char>(200 + t), n), CUDA_SUCCESS);
        EXPECT_EQ(nic[n - 1], 200 + t);
    }
    EXPECT_EQ(a.MemFree(d), CUDA_SUCCESS);
}

// The legacy stream synchronises with blocking streams (flags 0), not with non-blocking
// ones: a DtoH on a blocking stream after a memset always sees it, on a non-blocking
// stream only sometimes.
TEST_F(FakeDriverTest, LegacyStreamOrdersBlockingStreamsOnly) {
    a.SetMaxDelayUs(2000);
    const size_t n = 4096;
    CUdeviceptr d = 0;
    ASSERT_EQ(a.MemAlloc(&d, n), CUDA_SUCCESS);
    void *pin = nullptr;
    ASSERT_EQ(a.MemHostAlloc(&pin, n, 0), CUDA_SUCCESS);
    unsigned char *p = static_cast<unsigned char *>(pin);
    CUstream blocking = nullptr, nonblocking = nullptr;
    ASSERT_EQ(a.StreamCreate(&blocking, CU_STREAM_DEFAULT), CUDA_SUCCESS);
    ASSERT_EQ(a.StreamCreate(&nonblocking, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    int stale_nonblocking = 0;
    const int tries = 20;
    for (int t = 0; t < tries; t++) {
        ASSERT_EQ(a.MemsetD8(d, static_cast<unsigned char>(t + 1), n), CUDA_SUCCESS);
        ASSERT_EQ(a.MemcpyDtoHAsync(p, d, n, blocking), CUDA_SUCCESS);
        ASSERT_EQ(a.StreamSynchronize(blocking), CUDA_SUCCESS);
        EXPECT_EQ(p[n - 1], t + 1) << "a blocking stream waits for the legacy stream";
        ASSERT_EQ(a.MemsetD8(d, static_cast<unsigned char>(t + 101), n), CUDA_SUCCESS);
        ASSERT_EQ(a.MemcpyDtoHAsync(p, d, n, nonblocking), CUDA_SUCCESS);
        ASSERT_EQ(a.StreamSynchronize(nonblocking), CUDA_SUCCESS);
        if (p[n - 1] != t + 101) stale_nonblocking++;
        ASSERT_EQ(a.StreamSynchronize(nullptr), CUDA_SUCCESS);
    }
    EXPECT_GT(stale_nonblocking, 0) << "a non-blocking stream never overtook the legacy stream";
    EXPECT_EQ(a.StreamDestroy(blocking), CUDA_SUCCESS);
    EXPECT_EQ(a.StreamDestroy(nonblocking), CUDA_SUCCESS);
    EXPECT_EQ(a.MemFreeHost(pin), CUDA_SUCCESS);
    EXPECT_EQ(a.MemFree(d), CUDA_SUCCESS);
}

struct Order {
    std::mutex mu;
    std::vector<int> seen;
    std::vector<std::thread::id> threads;
};
struct Step {
    Order *order;
    int index;
};
void RecordStep(void *arg) {
    Step *s = static_cast<Step *>(arg);
    std::lock_guard<std::mutex> lock(s->order->mu);
    s->order->seen.push_back(s->index);
    s->order->threads.push_back(std::this_thread::get_id());
}

TEST_F(FakeDriverTest, StreamRunsOperationsInOrderOnItsWorker) {
    const size_t n = 4096;
    CUdeviceptr d1 = 0, d2 = 0;
    ASSERT_EQ(a.MemAlloc(&d1, n), CUDA_SUCCESS);
    ASSERT_EQ(a.MemAlloc(&d2, n), CUDA_SUCCESS);
    void *pin = nullptr;
    ASSERT_EQ(a.MemHostAlloc(&pin, 2 * n, 0), CUDA_SUCCESS);
    unsigned char *in = static_cast<unsigned char *>(pin), *out = in + n;
    CUstream s = nullptr;
    ASSERT_EQ(a.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    Order order;
    std::vector<Step> steps(64);
    for (int i = 0; i < 64; i++) {
        steps[i] = {&order, i};
        std::memset(in, i, n);
        // HtoD from pinned memory reads `in` later: sync each round's source first.
        ASSERT_EQ(a.MemcpyHtoDAsync(d1, in, n, s), CUDA_SUCCESS);
        ASSERT_EQ(a.MemcpyDtoDAsync(d2, d1, n, s), CUDA_SUCCESS);
        ASSERT_EQ(a.MemcpyDtoHAsync(out, d2, n, s), CUDA_SUCCESS);
        ASSERT_EQ(a.LaunchHostFunc(s, RecordStep, &steps[i]), CUDA_SUCCESS);
        ASSERT_EQ(a.StreamSynchronize(s), CUDA_SUCCESS);
        ASSERT_EQ(out[0], i);
        ASSERT_EQ(out[n - 1], i);
    }
    // Host functions queued back to back also run in order.
    for (int i = 0; i < 64; i++)
        ASSERT_EQ(a.LaunchHostFunc(s, RecordStep, &steps[i]), CUDA_SUCCESS);
    ASSERT_EQ(a.StreamSynchronize(s), CUDA_SUCCESS);
    ASSERT_EQ(order.seen.size(), 128u);
    for (int i = 0; i < 128; i++) EXPECT_EQ(order.seen[i], i % 64);
    for (const auto &id : order.threads) EXPECT_NE(id, std::this_thread::get_id());
    EXPECT_EQ(a.StreamDestroy(s), CUDA_SUCCESS);
    EXPECT_EQ(a.StreamDestroy(s), CUDA_ERROR_INVALID_HANDLE);
    EXPECT_EQ(a.MemFreeHost(pin), CUDA_SUCCESS);
    EXPECT_EQ(a.MemFree(d1), CUDA_SUCCESS);
    EXPECT_EQ(a.MemFree(d2), CUDA_SUCCESS);
}

void SetFlag(void *arg) { static_cast<std::atomic<int> *>(arg)->store(1); }

TEST_F(FakeDriverTest, DestroyedStreamFinishesItsWork) {
    a.SetMaxDelayUs(5000);
    const size_t n = 8192;
    CUdeviceptr d = 0;
    ASSERT_EQ(a.MemAlloc(&d, n), CUDA_SUCCESS);
    std::vector<unsigned char> pattern(n, 0x3c);
    ASSERT_EQ(a.MemcpyHtoD(d, pattern.data(), n), CUDA_SUCCESS);
    ASSERT_EQ(a.StreamSynchronize(nullptr), CUDA_SUCCESS);
    void *pin = nullptr;
    ASSERT_EQ(a.MemHostAlloc(&pin, n, 0), CUDA_SUCCESS);
    std::memset(pin, 0, n);
    CUstream s = nullptr;
    CUevent e = nullptr;
    ASSERT_EQ(a.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    ASSERT_EQ(a.EventCreate(&e, 0), CUDA_SUCCESS);
    std::atomic<int> flag{0};
    ASSERT_EQ(a.MemcpyDtoHAsync(pin, d, n, s), CUDA_SUCCESS);
    ASSERT_EQ(a.EventRecord(e, s), CUDA_SUCCESS);
    ASSERT_EQ(a.LaunchHostFunc(s, SetFlag, &flag), CUDA_SUCCESS);
    EXPECT_GT(Snap().pending_ops, 0u);
    ASSERT_EQ(a.StreamDestroy(s), CUDA_SUCCESS);
    ASSERT_EQ(a.EventDestroy(e), CUDA_SUCCESS); // its queued record still completes
    EXPECT_TRUE(ote_test::WaitUntil([&] { return flag.load() == 1; }, kWait,
                                    "the destroyed stream's host function"));
    EXPECT_EQ(static_cast<unsigned char *>(pin)[n - 1], 0x3c);
    EXPECT_TRUE(ote_test::WaitUntil([&] { return Snap().pending_ops == 0; }, kWait,
                                    "the destroyed stream's queue to drain"));
    EXPECT_EQ(a.MemFreeHost(pin), CUDA_SUCCESS);
    EXPECT_EQ(a.MemFree(d), CUDA_SUCCESS);
}

TEST_F(FakeDriverTest, FaultPointsReturnTheChosenResult) {
    CUdeviceptr d1 = 0, d2 = 0, d3 = 0;
    uint64_t calls = a.Calls("cuMemAlloc");
    uint64_t fired = Snap().faults_fired;
    a.Fail("cuMemAlloc", 2, 1, CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_EQ(a.MemAlloc(&d1, 4096), CUDA_SUCCESS);
    d2 = 0xdead;
    EXPECT_EQ(a.MemAlloc(&d2, 4096), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_EQ(d2, 0xdeadu) << "a failed call writes nothing";
    EXPECT_EQ(a.MemAlloc(&d3, 4096), CUDA_SUCCESS);
    EXPECT_EQ(a.Calls("cuMemAlloc"), calls + 3);
    EXPECT_EQ(Snap().faults_fired, fired + 1);

    CUstream s = nullptr;
    CUevent e = nullptr;
    ASSERT_EQ(a.StreamCreate(&s, 0), CUDA_SUCCESS);
    ASSERT_EQ(a.EventCreate(&e, 0), CUDA_SUCCESS);
    ASSERT_EQ(a.EventRecord(e, s), CUDA_SUCCESS);
    a.Fail("cuEventQuery", 1, -1, CUDA_ERROR_ECC_UNCORRECTABLE);
    for (int i = 0; i < 5; i++) EXPECT_EQ(a.EventQuery(e), CUDA_ERROR_ECC_UNCORRECTABLE);
    a.Fail("cuMemcpyHtoDAsync", 1, 2, CUDA_ERROR_LAUNCH_FAILED);
    char c = 1;
    EXPECT_EQ(a.MemcpyHtoDAsync(d1, &c, 1, s), CUDA_ERROR_LAUNCH_FAILED);
    EXPECT_EQ(a.MemcpyHtoDAsync(d1, &c, 1, s), CUDA_ERROR_LAUNCH_FAILED);
    EXPECT_EQ(a.MemcpyHtoDAsync(d1, &c, 1, s), CUDA_SUCCESS);
    a.Fail("cuInit", 1, 1, CUDA_ERROR_NO_DEVICE);
    EXPECT_EQ(a.Init(0), CUDA_ERROR_NO_DEVICE);
    EXPECT_EQ(a.Init(0), CUDA_SUCCESS);
    a.ClearFaults();
    EXPECT_EQ(a.StreamSynchronize(s), CUDA_SUCCESS);
    EXPECT_EQ(a.EventQuery(e), CUDA_SUCCESS);
    EXPECT_EQ(a.Calls("cuNoSuchThing"), 0u);
    EXPECT_EQ(a.EventDestroy(e), CUDA_SUCCESS);
    EXPECT_EQ(a.StreamDestroy(s), CUDA_SUCCESS);
    EXPECT_EQ(a.MemFree(d1), CUDA_SUCCESS);
    EXPECT_EQ(a.MemFree(d3), CUDA_SUCCESS);
}

TEST_F(FakeDriverTest, CountersFollowLiveObjects) {
    fake_cuda_counters_t c0 = Snap();
    EXPECT_GE(c0.primary_ctx_refs[0], 1u);
    CUdeviceptr d = 0;
    ASSERT_EQ(a.MemAlloc(&d, 5000), CUDA_SUCCESS);
    void *h = nullptr;
    ASSERT_EQ(a.MemHostAlloc(&h, 100, 0), CUDA_SUCCESS);
    CUstream s = nullptr;
    ASSERT_EQ(a.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUevent e = nullptr;
    ASSERT_EQ(a.EventCreate(&e, 0), CUDA_SUCCESS);
    fake_cuda_counters_t c1 = Snap();
    EXPECT_EQ(c1.device_allocs, c0.device_allocs + 1);
    EXPECT_EQ(c1.device_bytes, c0.device_bytes + 5000);
    EXPECT_EQ(c1.device_bytes_per_device[0], c0.device_bytes_per_device[0] + 5000);
    EXPECT_EQ(c1.host_allocs, c0.host_allocs + 1);
    EXPECT_EQ(c1.host_bytes, c0.host_bytes + 100);
    EXPECT_EQ(c1.streams, c0.streams + 1);
    EXPECT_EQ(c1.events, c0.events + 1);
    EXPECT_EQ(a.EventDestroy(e), CUDA_SUCCESS);
    EXPECT_EQ(a.StreamDestroy(s), CUDA_SUCCESS);
    EXPECT_EQ(a.MemFreeHost(h), CUDA_SUCCESS);
    EXPECT_EQ(a.MemFree(d), CUDA_SUCCESS);
    EXPECT_TRUE(ote_test::WaitUntil([&] { return Snap().streams == c0.streams; }, kWait,
                                    "the destroyed stream's worker to end"));
    fake_cuda_counters_t c2 = Snap();
    EXPECT_EQ(c2.device_allocs, c0.device_allocs);
    EXPECT_EQ(c2.device_bytes, c0.device_bytes);
    EXPECT_EQ(c2.events, c0.events);
}

TEST_F(FakeDriverTest, IpcAcrossProcesses) {
    for (const char *proc_only : {"0", "1"}) {
        SCOPED_TRACE(std::string("FAKE_CUDA_IPC_PROC_ONLY=") + proc_only);
        const size_t n = 3 << 20;
        CUdeviceptr d = 0;
        ASSERT_EQ(a.MemAlloc(&d, n), CUDA_SUCCESS);
        std::vector<unsigned char> buf(n, 0x5a);
        ASSERT_EQ(a.MemcpyHtoD(d, buf.data(), n), CUDA_SUCCESS);
        ASSERT_EQ(a.StreamSynchronize(nullptr), CUDA_SUCCESS); // landed before the child reads
        CUipcMemHandle h;
        uint64_t exports = Snap().ipc_exports;
        ASSERT_EQ(a.IpcGetMemHandle(&h, d + 4096), CUDA_SUCCESS); // inside: the whole allocation
        EXPECT_EQ(Snap().ipc_exports, exports + 1);
        CUdeviceptr self = 0;
        EXPECT_EQ(a.IpcOpenMemHandle(&self, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                  CUDA_ERROR_INVALID_CONTEXT)
            << "the exporting process cannot open its own handle";
        pid_t pid =
            SpawnChild({"FAKE_CHILD_MODE=ipc_import", "FAKE_CHILD_HANDLE=" + Hex(&h, sizeof(h)),
                        "FAKE_CHILD_SIZE=" + std::to_string(n),
                        std::string("FAKE_CUDA_IPC_PROC_ONLY=") + proc_only});
        ASSERT_GT(pid, 0);
        EXPECT_EQ(WaitChild(pid), 0);
        ASSERT_EQ(a.MemcpyDtoH(buf.data(), d, n), CUDA_SUCCESS);
        EXPECT_EQ(buf, std::vector<unsigned char>(n, 0xc3))
            << "the importer's writes reach the exporter";
        EXPECT_EQ(a.MemFree(d), CUDA_SUCCESS);
    }
}

TEST_F(FakeDriverTest, IpcImportOfAFreedAllocationFails) {
    CUdeviceptr d = 0;
    ASSERT_EQ(a.MemAlloc(&d, 4096), CUDA_SUCCESS);
    CUipcMemHandle h;
    ASSERT_EQ(a.IpcGetMemHandle(&h, d), CUDA_SUCCESS);
    ASSERT_EQ(a.IpcGetMemHandle(&h, d), CUDA_SUCCESS);
    EXPECT_EQ(Snap().ipc_exported_allocs, base.ipc_exported_allocs + 1);
    ASSERT_EQ(a.MemFree(d), CUDA_SUCCESS);
    EXPECT_EQ(Snap().ipc_exported_allocs, base.ipc_exported_allocs);
    // Another allocation may now hold the same fd number: the handle still names the old one.
    CUdeviceptr other = 0;
    ASSERT_EQ(a.MemAlloc(&other, 4096), CUDA_SUCCESS);
    pid_t pid =
        SpawnChild({"FAKE_CHILD_MODE=ipc_import_fails", "FAKE_CHILD_HANDLE=" + Hex(&h, sizeof(h))});
    ASSERT_GT(pid, 0);
    EXPECT_EQ(WaitChild(pid), 0);
    EXPECT_EQ(a.MemFree(other), CUDA_SUCCESS);
}

TEST_F(FakeDriverTest, IpcImportFailsAfterExporterDies) {
    int to_child = -1, from_child = -1;
    pid_t pid = SpawnChild({"FAKE_CHILD_MODE=ipc_export"}, &to_child, &from_child);
    ASSERT_GT(pid, 0);
    std::string line;
    char c;
    while (read(from_child, &c, 1) == 1 && c != '\n') line += c;
    close(from_child);
    CUipcMemHandle h;
    ASSERT_TRUE(Unhex(line.c_str(), &h, sizeof(h))) << line;
    CUdeviceptr d = 0;
    ASSERT_EQ(a.IpcOpenMemHandle(&d, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_SUCCESS);
    std::vector<unsigned char> buf(8192);
    ASSERT_EQ(a.MemcpyDtoH(buf.data(), d, buf.size()), CUDA_SUCCESS);
    EXPECT_EQ(buf, std::vector<unsigned char>(8192, 0x77));
    EXPECT_EQ(Snap().ipc_imports, base.ipc_imports + 1);
    EXPECT_EQ(a.IpcCloseMemHandle(d), CUDA_SUCCESS);
    close(to_child); // the exporter exits
    EXPECT_EQ(WaitChild(pid), 0);
    EXPECT_NE(a.IpcOpenMemHandle(&d, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_SUCCESS);
}

void CountCall(void *arg) { static_cast<std::atomic<int> *>(arg)->fetch_add(1); }

// The copy gate (fake_cuda_hold_copies): with a pass budget of 1, the first copy runs and
// the next waits before it moves a byte, with everything a slow copy on a GPU implies: its
// stream and the events and host functions behind it stay pending, a synchronous copy on
// another thread does not return, copies_held counts both; released, each completes with
// its bytes and the gate lets later copies through at once.
TEST_F(FakeDriverTest, CopyGateHoldsCopiesUntilReleased) {
    const size_t n = 4096;
    CUdeviceptr d = 0;
    ASSERT_EQ(a.MemAlloc(&d, n), CUDA_SUCCESS);
    ASSERT_EQ(a.MemsetD8(d, 0x11, n), CUDA_SUCCESS);
    ASSERT_EQ(a.StreamSynchronize(nullptr), CUDA_SUCCESS);
    NicView nic; // the device bytes without a copy (a copy would be held)
    ASSERT_TRUE(nic.Open(d, n));
    void *pin = nullptr;
    ASSERT_EQ(a.MemHostAlloc(&pin, 2 * n, 0), CUDA_SUCCESS);
    unsigned char *in = static_cast<unsigned char *>(pin), *out = in + n;
    std::memset(in, 0x5a, n);
    std::memset(out, 0, n);
    CUstream s = nullptr;
    CUevent e = nullptr;
    ASSERT_EQ(a.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    ASSERT_EQ(a.EventCreate(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    const fake_cuda_counters_t c0 = Snap();
    EXPECT_EQ(c0.copies_held, 0u);

    a.HoldCopies(1);
    std::atomic<int> after{0};
    ASSERT_EQ(a.MemcpyHtoDAsync(d, in, n, s), CUDA_SUCCESS);  // passes
    ASSERT_EQ(a.MemcpyDtoHAsync(out, d, n, s), CUDA_SUCCESS); // held
    ASSERT_EQ(a.EventRecord(e, s), CUDA_SUCCESS);
    ASSERT_EQ(a.LaunchHostFunc(s, CountCall, &after), CUDA_SUCCESS);
    ASSERT_TRUE(ote_test::WaitUntil([&] { return Snap().copies_held == 1; }, kWait,
                                    "the DtoH copy held at the gate"));
    // The copy that passed is done (it ran before the held one on the same stream).
    EXPECT_EQ(nic[0], 0x5a);
    EXPECT_EQ(nic[n - 1], 0x5a);
    // A synchronous copy on another thread is held too and does not return.
    std::atomic<int> sync_done{0};
    CUresult sync_res = CUDA_ERROR_UNKNOWN;
    std::vector<unsigned char> back(n, 0);
    std::thread sync_copier([&] {
        (void)a.CtxSetCurrent(ctx);
        sync_res = a.MemcpyDtoH(back.data(), d, n);
        sync_done.store(1);
    });
    EXPECT_TRUE(ote_test::WaitUntil([&] { return Snap().copies_held == 2; }, kWait,
                                    "the synchronous copy held too"));
    // Both workers wait at the gate: nothing behind the held copies can have run.
    EXPECT_EQ(a.StreamQuery(s), CUDA_ERROR_NOT_READY);
    EXPECT_EQ(a.EventQuery(e), CUDA_ERROR_NOT_READY);
    EXPECT_EQ(after.load(), 0) << "a host function overtook the held copy";
    EXPECT_EQ(out[0], 0) << "the held copy moved bytes";
    EXPECT_EQ(out[n - 1], 0);
    EXPECT_EQ(sync_done.load(), 0) << "a synchronous copy returned while held";
    fake_cuda_counters_t c1 = Snap();
    EXPECT_EQ(c1.copies_held, 2u);
    EXPECT_EQ(c1.copies_held_total, c0.copies_held_total + 2);
    EXPECT_GE(c1.pending_ops, c0.pending_ops + 4);

    a.ReleaseCopies();
    ASSERT_EQ(a.EventSynchronize(e), CUDA_SUCCESS);
    EXPECT_EQ(out[0], 0x5a);
    EXPECT_EQ(out[n - 1], 0x5a);
    EXPECT_TRUE(ote_test::WaitUntil([&] { return after.load() == 1; }, kWait,
                                    "the host function after the released copy"));
    sync_copier.join();
    EXPECT_EQ(sync_res, CUDA_SUCCESS);
    EXPECT_EQ(back, std::vector<unsigned char>(n, 0x5a));
    EXPECT_EQ(Snap().copies_held, 0u);

    // Open: copies run without waiting and are not counted.
    std::memset(in, 0x6b, n);
    ASSERT_EQ(a.MemcpyHtoDAsync(d, in, n, s), CUDA_SUCCESS);
    ASSERT_EQ(a.MemcpyDtoHAsync(out, d, n, s), CUDA_SUCCESS);
    ASSERT_EQ(a.StreamSynchronize(s), CUDA_SUCCESS);
    EXPECT_EQ(out[n - 1], 0x6b);
    // Closed with a budget that outlasts the work: nothing is held.
    a.HoldCopies(4);
    ASSERT_EQ(a.MemcpyHtoDAsync(d, in, n, s), CUDA_SUCCESS);
    ASSERT_EQ(a.MemcpyDtoHAsync(out, d, n, s), CUDA_SUCCESS);
    ASSERT_EQ(a.StreamSynchronize(s), CUDA_SUCCESS);
    a.ReleaseCopies();
    EXPECT_EQ(Snap().copies_held_total, c0.copies_held_total + 2);

    EXPECT_EQ(a.EventDestroy(e), CUDA_SUCCESS);
    EXPECT_EQ(a.StreamDestroy(s), CUDA_SUCCESS);
    EXPECT_EQ(a.MemFreeHost(pin), CUDA_SUCCESS);
    EXPECT_EQ(a.MemFree(d), CUDA_SUCCESS);
}

TEST_F(FakeDriverTest, DmabufFdShowsDeviceBytes) {
    const size_t n = 3 * 4096 + 100;
    CUdeviceptr d = 0;
    ASSERT_EQ(a.MemAlloc(&d, n), CUDA_SUCCESS);
    std::vector<unsigned char> src(n);
    for (size_t i = 0; i < n; i++) src[i] = static_cast<unsigned char>(i ^ 0x5c);
    unsigned one = 1; // memory a NIC reads: synchronous copies complete before returning
    ASSERT_EQ(a.PointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, d), CUDA_SUCCESS);
    ASSERT_EQ(a.MemcpyHtoD(d, src.data(), n), CUDA_SUCCESS);
    int fd = -1;
    EXPECT_EQ(
        a.MemGetHandleForAddressRange(&fd, d + 4096, 4096, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
        CUDA_ERROR_INVALID_VALUE)
        << "the fake exports from the allocation base only";
    EXPECT_EQ(a.MemGetHandleForAddressRange(&fd, d, 100, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
              CUDA_ERROR_INVALID_VALUE)
        << "size must be page aligned";
    uint64_t before = Snap().dmabuf_fds;
    ASSERT_EQ(
        a.MemGetHandleForAddressRange(&fd, d, 4 * 4096, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
        CUDA_SUCCESS);
    ASSERT_GE(fd, 0);
    EXPECT_EQ(Snap().dmabuf_fds, before + 1);
    void *m = mmap(nullptr, 4 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ASSERT_NE(m, MAP_FAILED);
    EXPECT_EQ(std::memcmp(m, src.data(), n), 0);
    static_cast<unsigned char *>(m)[5] = 0xfe; // what a NIC writes, the GPU sees
    unsigned char b = 0;
    ASSERT_EQ(a.MemcpyDtoH(&b, d + 5, 1), CUDA_SUCCESS);
    EXPECT_EQ(b, 0xfe);
    munmap(m, 4 * 4096);
    close(fd);
    EXPECT_EQ(a.MemFree(d), CUDA_SUCCESS);
}

TEST_F(FakeDriverTest, VmmMapsExportsAndImportsAcrossProcesses) {
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t gran = 0;
    ASSERT_EQ(a.MemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
              CUDA_SUCCESS);
    ASSERT_GT(gran, 0u);
    CUmemGenericAllocationHandle h1 = 0, h2 = 0;
    ASSERT_EQ(a.MemCreate(&h1, gran, &prop, 0), CUDA_SUCCESS);
    ASSERT_EQ(a.MemCreate(&h2, gran, &prop, 0), CUDA_SUCCESS);
    EXPECT_EQ(a.MemCreate(&h2, gran + 1, &prop, 0), CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr va = 0;
    ASSERT_EQ(a.MemAddressReserve(&va, 2 * gran, 0, 0, 0), CUDA_SUCCESS);
    EXPECT_EQ(va % gran, 0u);
    ASSERT_EQ(a.MemMap(va, gran, 0, h1, 0), CUDA_SUCCESS);
    ASSERT_EQ(a.MemMap(va + gran, gran, 0, h2, 0), CUDA_SUCCESS);
    EXPECT_EQ(a.MemMap(va, gran, 0, h2, 0), CUDA_ERROR_ALREADY_MAPPED);
    std::vector<unsigned char> buf(2 * gran, 0x31);
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_EQ(a.MemcpyHtoD(va, buf.data(), buf.size()), CUDA_ERROR_INVALID_VALUE)
        << "no access set yet";
    CUmemAccessDesc acc = {};
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = 0;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    ASSERT_EQ(a.MemSetAccess(va, 2 * gran, &acc, 1), CUDA_SUCCESS);
    ASSERT_EQ(a.MemcpyHtoD(va, buf.data(), buf.size()), CUDA_SUCCESS); // spans both mappings
    ASSERT_EQ(a.StreamSynchronize(nullptr), CUDA_SUCCESS);
    EXPECT_DEATH({ *reinterpret_cast<volatile unsigned char *>(va) = 1; }, "");

    // Export h2 as a POSIX fd; a child imports it, maps it, checks and writes.
    int fd = -1;
    ASSERT_EQ(a.MemExportToShareableHandle(&fd, h2, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
              CUDA_SUCCESS);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(fcntl(fd, F_SETFD, 0), 0); // inherited by the child
    pid_t pid = SpawnChild({"FAKE_CHILD_MODE=vmm_import", "FAKE_CHILD_FD=" + std::to_string(fd),
                            "FAKE_CHILD_SIZE=" + std::to_string(gran)});
    close(fd);
    ASSERT_GT(pid, 0);
    EXPECT_EQ(WaitChild(pid), 0);
    std::vector<unsigned char> back(4096);
    ASSERT_EQ(a.MemcpyDtoH(back.data(), va + gran, back.size()), CUDA_SUCCESS);
    EXPECT_EQ(back, std::vector<unsigned char>(4096, 0x92))
        << "the importer's writes reach the exporter";
    ASSERT_EQ(a.MemcpyDtoH(back.data(), va, back.size()), CUDA_SUCCESS);
    EXPECT_EQ(back, std::vector<unsigned char>(4096, 0x31));

    EXPECT_EQ(a.MemAddressFree(va, 2 * gran), CUDA_ERROR_INVALID_VALUE) << "still mapped";
    EXPECT_EQ(a.MemUnmap(va, gran / 2), CUDA_ERROR_INVALID_VALUE) << "part of a mapping";
    EXPECT_EQ(a.MemRelease(h1), CUDA_SUCCESS); // the mapping keeps the memory
    ASSERT_EQ(a.MemcpyDtoH(back.data(), va, back.size()), CUDA_SUCCESS);
    EXPECT_EQ(back[0], 0x31);
    EXPECT_EQ(a.MemUnmap(va, 2 * gran), CUDA_SUCCESS);
    EXPECT_EQ(a.MemRelease(h2), CUDA_SUCCESS);
    EXPECT_EQ(a.MemRelease(h2), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(a.MemAddressFree(va, 2 * gran), CUDA_SUCCESS);
    EXPECT_EQ(Snap().device_bytes_per_device[0], base.device_bytes_per_device[0]);
}

} // namespace

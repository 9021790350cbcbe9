/*
 * scripts/cuda_facts.c - asks a real CUDA driver how it behaves where the fake libcuda in
 * tests/cuda must behave the same (scripts/gpu_check.sh compiles and runs it on a GPU
 * machine). It prints one "fact: ..." line per question, with the CUresult names, so a
 * difference between the fake and the GPU is a diff of two outputs. It never aborts: every
 * question is answered even when an earlier one failed.
 *
 *   cc -O1 -I/usr/local/cuda/include scripts/cuda_facts.c -o cuda_facts \
 *      -L/usr/local/cuda/lib64/stubs -lcuda && ./cuda_facts
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <pthread.h>

static const char *rn(CUresult r) {
    const char *s = NULL;
    if (cuGetErrorName(r, &s) != CUDA_SUCCESS || s == NULL) return "?";
    return s;
}
#define FACT(...) (printf("fact: " __VA_ARGS__), printf("\n"), fflush(stdout))

static void *no_ctx_thread(void *arg) {
    CUdeviceptr p = 0;
    CUresult r = cuMemAlloc(&p, 4096);
    FACT("cuMemAlloc on a thread with no current context -> %s (%d)", rn(r), r);
    if (r == CUDA_SUCCESS) cuMemFree(p);
    CUstream s;
    r = cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
    FACT("cuStreamCreate with no current context -> %s", rn(r));
    if (r == CUDA_SUCCESS) cuStreamDestroy(s);
    CUmemorytype mt = 0;
    r = cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, *(CUdeviceptr *)arg);
    FACT("cuPointerGetAttribute(MEMORY_TYPE, device ptr) with no current context -> %s type %d",
         rn(r), (int)mt);
    char buf[16];
    r = cuMemcpyDtoH(buf, *(CUdeviceptr *)arg, sizeof buf);
    FACT("cuMemcpyDtoH with no current context -> %s", rn(r));
    return NULL;
}

static void host_fn(void *arg) { *(volatile int *)arg = 1; }

static int child_import(const char *hex) {
    CUipcMemHandle h;
    for (int i = 0; i < 64; i++) sscanf(hex + 2 * i, "%2hhx", &h.reserved[i]);
    CUdevice dev;
    CUcontext ctx;
    cuInit(0);
    cuDeviceGet(&dev, 0);
    cuDevicePrimaryCtxRetain(&ctx, dev);
    cuCtxSetCurrent(ctx);
    CUdeviceptr p = 0, p2 = 0;
    CUresult r = cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    printf("fact: child cuIpcOpenMemHandle -> %s\n", rn(r));
    if (r == CUDA_SUCCESS) {
        unsigned char b[4] = {0};
        r = cuMemcpyDtoH(b, p, 4);
        printf(
            "fact: child reads imported base bytes -> %s %02x%02x%02x%02x (parent wrote a5 at 0)\n",
            rn(r), b[0], b[1], b[2], b[3]);
        CUdeviceptr base = 0;
        size_t sz = 0;
        r = cuMemGetAddressRange(&base, &sz, p);
        printf("fact: child imported range -> %s base==ptr %d size %zu\n", rn(r), base == p, sz);
        r = cuIpcOpenMemHandle(&p2, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
        printf("fact: child opens the same handle twice -> %s same ptr %d\n", rn(r), p2 == p);
        if (r == CUDA_SUCCESS && p2 != 0)
            printf("fact: child close of 2nd open -> %s\n", rn(cuIpcCloseMemHandle(p2)));
        printf("fact: child close -> %s\n", rn(cuIpcCloseMemHandle(p)));
        r = cuIpcCloseMemHandle(p);
        printf("fact: child close again -> %s\n", rn(r));
    }
    fflush(stdout);
    return 0;
}

static int child_import_dead(const char *hex) {
    CUipcMemHandle h;
    for (int i = 0; i < 64; i++) sscanf(hex + 2 * i, "%2hhx", &h.reserved[i]);
    CUdevice dev;
    CUcontext ctx;
    cuInit(0);
    cuDeviceGet(&dev, 0);
    cuDevicePrimaryCtxRetain(&ctx, dev);
    cuCtxSetCurrent(ctx);
    CUdeviceptr p = 0;
    CUresult r = cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    printf("fact: import of a handle whose exporter freed the allocation -> %s\n", rn(r));
    if (r == CUDA_SUCCESS) cuIpcCloseMemHandle(p);
    fflush(stdout);
    return 0;
}

static int child_vmm_import(const char *fdstr) {
    int fd = atoi(fdstr);
    CUdevice dev;
    CUcontext ctx;
    cuInit(0);
    cuDeviceGet(&dev, 0);
    cuDevicePrimaryCtxRetain(&ctx, dev);
    cuCtxSetCurrent(ctx);
    CUmemGenericAllocationHandle ih;
    CUresult r = cuMemImportFromShareableHandle(&ih, (void *)(uintptr_t)fd,
                                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    printf("fact: child cuMemImportFromShareableHandle(inherited POSIX fd) -> %s\n", rn(r));
    if (r == CUDA_SUCCESS) {
        size_t gran = 2u << 20;
        CUdeviceptr va = 0;
        cuMemAddressReserve(&va, gran, 0, 0, 0);
        r = cuMemMap(va, gran, 0, ih, 0);
        CUmemAccessDesc ad;
        memset(&ad, 0, sizeof ad);
        ad.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        ad.location.id = dev;
        ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        CUresult r2 = cuMemSetAccess(va, gran, &ad, 1);
        unsigned char b = 0;
        CUresult r3 = cuMemcpyDtoH(&b, va, 1);
        printf("fact: child maps the imported VMM memory -> %s/%s/%s byte %02x (parent wrote 3c)\n",
               rn(r), rn(r2), rn(r3), b);
        cuMemUnmap(va, gran);
        cuMemAddressFree(va, gran);
        cuMemRelease(ih);
    }
    fflush(stdout);
    return 0;
}

static void tohex(const CUipcMemHandle *h, char *out) {
    for (int i = 0; i < 64; i++) sprintf(out + 2 * i, "%02x", (unsigned char)h->reserved[i]);
}

static void run_child(const char *self, const char *mode, const char *hex) {
    pid_t pid = fork();
    if (pid == 0) {
        execl(self, self, mode, hex, (char *)NULL);
        _exit(127);
    }
    int ws = 0;
    waitpid(pid, &ws, 0);
}

/* What the questions share, in the order main asks them. */
static struct {
    const char *self; /* argv[0], re-executed as the importing child */
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr ptrs[5];
    void *pin;
    char *pg, *hm;
} g;

/* cuInit, the device and its attributes, cuGetProcAddress. 0 when no driver. */
static int facts_driver(void) {
    CUresult r;
    CUdeviceptr d0 = 0;
    r = cuMemAlloc(&d0, 16);
    FACT("cuMemAlloc before cuInit -> %s", rn(r));
    r = cuInit(0);
    FACT("cuInit -> %s", rn(r));
    if (r != CUDA_SUCCESS) return 0;
    int v = 0;
    cuDriverGetVersion(&v);
    FACT("driver version %d", v);
    int n = 0;
    cuDeviceGetCount(&n);
    FACT("devices %d", n);
    cuDeviceGet(&g.dev, 0);
    char name[128] = "";
    cuDeviceGetName(name, sizeof name, g.dev);
    FACT("device 0 name %s", name);
    int attrs[] = {CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING,
                   CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
                   CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED,
                   CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                   CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                   CU_DEVICE_ATTRIBUTE_PCI_BUS_ID,
                   CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT,
                   CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM};
    const char *an[] = {"UNIFIED_ADDRESSING",        "DMA_BUF_SUPPORTED",
                        "GPU_DIRECT_RDMA_SUPPORTED", "VMM_SUPPORTED",
                        "POSIX_FD_SUPPORTED",        "PCI_BUS_ID",
                        "ASYNC_ENGINE_COUNT",        "CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM"};
    for (unsigned i = 0; i < sizeof attrs / sizeof attrs[0]; i++) {
        int a = -1;
        r = cuDeviceGetAttribute(&a, attrs[i], g.dev);
        FACT("attribute %s = %d (%s)", an[i], a, rn(r));
    }
    char bus[64] = "";
    cuDeviceGetPCIBusId(bus, sizeof bus, g.dev);
    FACT("pci bus id %s", bus);
    void *pfn = NULL;
    CUdriverProcAddressQueryResult qs;
    r = cuGetProcAddress("cuMemAlloc", &pfn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &qs);
    FACT("cuGetProcAddress(cuMemAlloc, 12000) -> %s status %d same as cuMemAlloc_v2 %d", rn(r),
         (int)qs, pfn == (void *)cuMemAlloc_v2);
    r = cuGetProcAddress("cuNoSuchThing", &pfn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &qs);
    FACT("cuGetProcAddress(unknown) -> %s status %d", rn(r), (int)qs);
    r = cuGetProcAddress("cuMemAlloc", &pfn, 3000, CU_GET_PROC_ADDRESS_DEFAULT, &qs);
    FACT("cuGetProcAddress(cuMemAlloc, 3000) -> %s status %d same as cuMemAlloc_v2 %d", rn(r),
         (int)qs, pfn == (void *)cuMemAlloc_v2);

    return 1;
}

static void facts_allocations(void) {
    CUresult r;
    CUcontext cur = (CUcontext)1;
    r = cuCtxGetCurrent(&cur);
    FACT("cuCtxGetCurrent before any -> %s ctx %p", rn(r), (void *)cur);
    CUdeviceptr dx = 0;
    r = cuMemAlloc(&dx, 16);
    FACT("cuMemAlloc after cuInit, no context -> %s", rn(r));
    r = cuDevicePrimaryCtxRetain(&g.ctx, g.dev);
    FACT("cuDevicePrimaryCtxRetain -> %s", rn(r));
    cuCtxSetCurrent(g.ctx);

    size_t sizes[] = {1, 100, 4097, (2u << 20) + 1, 64u << 20};
    for (int i = 0; i < 5; i++) {
        r = cuMemAlloc(&g.ptrs[i], sizes[i]);
        CUdeviceptr b = 0;
        size_t s = 0;
        cuMemGetAddressRange(&b, &s, g.ptrs[i] + (sizes[i] > 1 ? 1 : 0));
        FACT("cuMemAlloc(%zu) -> %s ptr %% 256 = %llu, %% 2MiB = %llu, range size %zu base==ptr %d",
             sizes[i], rn(r), (unsigned long long)(g.ptrs[i] % 256),
             (unsigned long long)(g.ptrs[i] % (2u << 20)), s, b == g.ptrs[i]);
    }
    r = cuMemAlloc(&dx, 0);
    FACT("cuMemAlloc(0) -> %s", rn(r));
    CUdeviceptr dd = g.ptrs[4];
    pthread_t th;
    pthread_create(&th, NULL, no_ctx_thread, &dd);
    pthread_join(th, NULL);

    unsigned long long bid1 = 0, bid2 = 0;
    cuPointerGetAttribute(&bid1, CU_POINTER_ATTRIBUTE_BUFFER_ID, g.ptrs[0]);
    cuMemFree(g.ptrs[0]);
    cuMemAlloc(&g.ptrs[0], 1);
    cuPointerGetAttribute(&bid2, CU_POINTER_ATTRIBUTE_BUFFER_ID, g.ptrs[0]);
    FACT("buffer id reused after free+alloc %d (%llu %llu)", bid1 == bid2, bid1, bid2);
}

static void facts_host_memory(void) {
    CUresult r;
    g.hm = malloc(1 << 20);
    CUmemorytype mt = 0;
    r = cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)g.hm);
    FACT("cuPointerGetAttribute(MEMORY_TYPE, malloc) -> %s", rn(r));
    CUpointer_attribute pa[] = {
        CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        CU_POINTER_ATTRIBUTE_BUFFER_ID,   CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        CU_POINTER_ATTRIBUTE_RANGE_SIZE,  CU_POINTER_ATTRIBUTE_CONTEXT,
        CU_POINTER_ATTRIBUTE_IS_MANAGED,  CU_POINTER_ATTRIBUTE_DEVICE_POINTER};
    unsigned int a_mt = 77;
    int a_ord = 77;
    unsigned long long a_bid = 77;
    CUdeviceptr a_start = 77;
    size_t a_size = 77;
    CUcontext a_ctx = (CUcontext)77;
    unsigned int a_man = 77;
    CUdeviceptr a_dp = 77;
    void *pv[] = {&a_mt, &a_ord, &a_bid, &a_start, &a_size, &a_ctx, &a_man, &a_dp};
    r = cuPointerGetAttributes(8, pa, pv, (CUdeviceptr)g.hm);
    FACT(
        "cuPointerGetAttributes(malloc) -> %s mt %u ord %d bid %llu start %llu size %zu ctx %p "
        "managed %u dptr %llu",
        rn(r), a_mt, a_ord, a_bid, (unsigned long long)a_start, a_size, (void *)a_ctx, a_man,
        (unsigned long long)a_dp);
    r = cuPointerGetAttributes(8, pa, pv, g.ptrs[4] + 100);
    FACT(
        "cuPointerGetAttributes(device+100) -> %s mt %u ord %d start==base %d size %zu "
        "ctx==primary %d managed %u dptr==p %d",
        rn(r), a_mt, a_ord, a_start == g.ptrs[4], a_size, a_ctx == g.ctx, a_man,
        a_dp == g.ptrs[4] + 100);
    r = cuMemHostRegister(g.hm + 100, 5000, 0);
    FACT("cuMemHostRegister(unaligned 5000) -> %s", rn(r));
    r = cuMemHostRegister(g.hm + 100, 5000, 0);
    FACT("cuMemHostRegister same range twice -> %s", rn(r));
    r = cuPointerGetAttributes(8, pa, pv, (CUdeviceptr)(g.hm + 200));
    FACT(
        "cuPointerGetAttributes(registered+100) -> %s mt %u ord %d start==hm+100 %d size %zu "
        "dptr==host %d",
        rn(r), a_mt, a_ord, a_start == (CUdeviceptr)(g.hm + 100), a_size,
        a_dp == (CUdeviceptr)(g.hm + 200));
    r = cuMemHostUnregister(g.hm + 100);
    FACT("cuMemHostUnregister -> %s", rn(r));
    r = cuMemHostUnregister(g.hm + 100);
    FACT("cuMemHostUnregister twice -> %s", rn(r));
    r = cuMemHostAlloc(&g.pin, 1 << 20, 0);
    r = cuPointerGetAttributes(8, pa, pv, (CUdeviceptr)g.pin);
    FACT("cuPointerGetAttributes(cuMemHostAlloc) -> %s mt %u dptr==host %d size %zu", rn(r), a_mt,
         a_dp == (CUdeviceptr)g.pin, a_size);
    int one = 1;
    r = cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, g.ptrs[4]);
    FACT("cuPointerSetAttribute(SYNC_MEMOPS, device) -> %s", rn(r));
    r = cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, g.ptrs[4] + 4096);
    FACT("cuPointerSetAttribute(SYNC_MEMOPS, device interior) -> %s", rn(r));
    r = cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, (CUdeviceptr)g.pin);
    FACT("cuPointerSetAttribute(SYNC_MEMOPS, pinned host) -> %s", rn(r));
}

static void facts_streams(void) {
    CUresult r;
    /* streams and events */
    CUstream st;
    cuStreamCreate(&st, CU_STREAM_NON_BLOCKING);
    CUevent ev;
    cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING);
    r = cuEventQuery(ev);
    FACT("cuEventQuery on a never-recorded event -> %s", rn(r));
    r = cuStreamQuery(st);
    FACT("cuStreamQuery on an idle stream -> %s", rn(r));
    memset(g.pin, 0x5a, 1 << 20);
    r = cuMemcpyHtoDAsync(g.ptrs[4], g.pin, 1 << 20, st);
    cuEventRecord(ev, st);
    CUresult q = cuEventQuery(ev);
    FACT("async 1 MiB HtoD from pinned then immediate cuEventQuery -> %s / %s", rn(r), rn(q));
    cuEventSynchronize(ev);
    volatile int flag = 0;
    r = cuLaunchHostFunc(st, host_fn, (void *)&flag);
    cuStreamSynchronize(st);
    FACT("cuLaunchHostFunc -> %s ran %d", rn(r), flag);
    /* destroy stream with pending work */
    for (int i = 0; i < 8; i++) cuMemcpyDtoDAsync(g.ptrs[3], g.ptrs[4], 2u << 20, st);
    r = cuStreamDestroy(st);
    FACT("cuStreamDestroy with pending work -> %s", rn(r));
    r = cuEventQuery(ev);
    FACT("cuEventQuery of an event recorded on a destroyed stream -> %s", rn(r));
    r = cuCtxSynchronize();
    FACT("cuCtxSynchronize after -> %s", rn(r));
    cuEventDestroy(ev);
    r = cuMemsetD8(g.ptrs[4], 0xa5, 64u << 20);
    FACT("cuMemsetD8 -> %s", rn(r));
    g.pg = malloc(4096);
    r = cuMemcpyDtoH(g.pg, g.ptrs[4], 4096);
    FACT("cuMemcpyDtoH pageable -> %s byte %02x", rn(r), (unsigned char)g.pg[0]);
    r = cuMemcpyDtoH(g.pg, g.ptrs[4] + (64u << 20) - 100, 4096);
    FACT("cuMemcpyDtoH past the end of an allocation -> %s", rn(r));
}

static void facts_dmabuf(void) {
    CUresult r;
    /* dmabuf */
    int fd = -1;
    r = cuMemGetHandleForAddressRange(&fd, g.ptrs[4], 64u << 20,
                                      CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    FACT("dmabuf whole 64 MiB allocation -> %s fd %d", rn(r), fd);
    if (r == CUDA_SUCCESS) {
        off_t end = lseek(fd, 0, SEEK_END);
        FACT("dmabuf lseek end -> %lld", (long long)end);
        void *m = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
        FACT("dmabuf mmap -> %s", m == MAP_FAILED ? strerror(errno) : "mapped");
        if (m != MAP_FAILED) munmap(m, 4096);
        close(fd);
    }
    fd = -1;
    r = cuMemGetHandleForAddressRange(&fd, g.ptrs[4] + 65536, 65536,
                                      CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    FACT("dmabuf interior 64 KiB at +64 KiB -> %s", rn(r));
    if (fd >= 0) close(fd);
    fd = -1;
    r = cuMemGetHandleForAddressRange(&fd, g.ptrs[4] + 4096, 4096,
                                      CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    FACT("dmabuf interior 4 KiB at +4 KiB -> %s", rn(r));
    if (fd >= 0) close(fd);
    fd = -1;
    r = cuMemGetHandleForAddressRange(&fd, g.ptrs[4] + 100, 4096,
                                      CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    FACT("dmabuf unaligned start -> %s", rn(r));
    if (fd >= 0) close(fd);
    fd = -1;
    r = cuMemGetHandleForAddressRange(&fd, g.ptrs[2], 4097, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    FACT("dmabuf unaligned size -> %s", rn(r));
    if (fd >= 0) close(fd);
}

static void facts_ipc(void) {
    CUresult r;
    /* IPC */
    CUipcMemHandle h;
    r = cuIpcGetMemHandle(&h, g.ptrs[4] + 4096);
    FACT("cuIpcGetMemHandle(interior) -> %s", rn(r));
    CUipcMemHandle h0;
    r = cuIpcGetMemHandle(&h0, g.ptrs[4]);
    FACT("cuIpcGetMemHandle(interior) == (base) %d", memcmp(&h, &h0, sizeof h) == 0);
    CUdeviceptr self = 0;
    r = cuIpcOpenMemHandle(&self, h0, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    FACT("cuIpcOpenMemHandle in the exporting process -> %s", rn(r));
    r = cuIpcGetMemHandle(&h, (CUdeviceptr)g.pin);
    FACT("cuIpcGetMemHandle(pinned host) -> %s", rn(r));
    char hex[129];
    tohex(&h0, hex);
    run_child(g.self, "import", hex);
    CUdeviceptr fresh = 0;
    cuMemAlloc(&fresh, 4u << 20);
    cuMemsetD8(fresh, 0xa5, 4u << 20);
    cuCtxSynchronize();
    CUipcMemHandle hf;
    r = cuIpcGetMemHandle(&hf, fresh);
    FACT("fresh 4 MiB allocation, cuIpcGetMemHandle -> %s (no self-open before the child)", rn(r));
    tohex(&hf, hex);
    run_child(g.self, "import", hex);
    cuMemFree(fresh);
    CUdeviceptr tmp;
    cuMemAlloc(&tmp, 1 << 20);
    CUipcMemHandle hd;
    cuIpcGetMemHandle(&hd, tmp);
    cuMemFree(tmp);
    tohex(&hd, hex);
    run_child(g.self, "import_dead", hex);
}

static void facts_vmm_and_frees(void) {
    CUresult r;
    int fd = -1;
    /* VMM */
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = g.dev;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t gran = 0;
    r = cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    FACT("VMM granularity -> %s %zu", rn(r), gran);
    CUmemGenericAllocationHandle ah;
    r = cuMemCreate(&ah, gran, &prop, 0);
    FACT("cuMemCreate -> %s", rn(r));
    if (r == CUDA_SUCCESS) {
        CUdeviceptr va = 0;
        r = cuMemAddressReserve(&va, gran, 0, 0, 0);
        FACT("cuMemAddressReserve -> %s", rn(r));
        r = cuMemMap(va, gran, 0, ah, 0);
        FACT("cuMemMap -> %s", rn(r));
        CUmemAccessDesc ad;
        memset(&ad, 0, sizeof ad);
        ad.location = prop.location;
        ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        r = cuMemcpyHtoD(va, g.pg, 16);
        FACT("copy to VMM before cuMemSetAccess -> %s", rn(r));
        r = cuMemSetAccess(va, gran, &ad, 1);
        FACT("cuMemSetAccess -> %s", rn(r));
        int xfd = -1;
        r = cuMemExportToShareableHandle(&xfd, ah, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        FACT("cuMemExportToShareableHandle(POSIX fd) -> %s fd>=0 %d", rn(r), xfd >= 0);
        CUipcMemHandle hv;
        r = cuIpcGetMemHandle(&hv, va);
        FACT("cuIpcGetMemHandle(VMM) -> %s", rn(r));
        unsigned int vmt = 0;
        r = cuPointerGetAttribute(&vmt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, va);
        FACT("MEMORY_TYPE(VMM) -> %s %u", rn(r), vmt);
        fd = -1;
        r = cuMemGetHandleForAddressRange(&fd, va, gran, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
        FACT("dmabuf of VMM range -> %s", rn(r));
        if (fd >= 0) close(fd);
        if (xfd >= 0) {
            cuMemsetD8(va, 0x3c, gran);
            cuCtxSynchronize();
            char fds[16];
            snprintf(fds, sizeof fds, "%d", xfd);
            fcntl(xfd, F_SETFD, 0); /* inherited by the exec'd child */
            run_child(g.self, "vmm_import", fds);
            CUmemGenericAllocationHandle ih;
            r = cuMemImportFromShareableHandle(&ih, (void *)(uintptr_t)xfd,
                                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
            FACT("cuMemImportFromShareableHandle in the same process -> %s", rn(r));
            if (r == CUDA_SUCCESS) cuMemRelease(ih);
            close(xfd);
        }
        r = cuMemRelease(ah);
        FACT("cuMemRelease while mapped -> %s", rn(r));
        r = cuMemUnmap(va, gran);
        FACT("cuMemUnmap -> %s", rn(r));
        r = cuMemAddressFree(va, gran);
        FACT("cuMemAddressFree -> %s", rn(r));
    }
    r = cuMemFree(g.ptrs[4] + 4096);
    FACT("cuMemFree(interior) -> %s", rn(r));
    for (int i = 0; i < 5; i++) cuMemFree(g.ptrs[i]);
    r = cuMemFree(g.ptrs[1]);
    FACT("cuMemFree twice -> %s", rn(r));
    r = cuMemFreeHost(g.pin);
    FACT("cuMemFreeHost -> %s", rn(r));
    r = cuDevicePrimaryCtxRelease(g.dev);
    FACT("cuDevicePrimaryCtxRelease -> %s", rn(r));
    r = cuDevicePrimaryCtxRelease(g.dev);
    FACT("cuDevicePrimaryCtxRelease again (refcount 0) -> %s", rn(r));
    free(g.hm);
    free(g.pg);
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "import") == 0) return child_import(argv[2]);
    if (argc == 3 && strcmp(argv[1], "import_dead") == 0) return child_import_dead(argv[2]);
    if (argc == 3 && strcmp(argv[1], "vmm_import") == 0) return child_vmm_import(argv[2]);
    setvbuf(stdout, NULL, _IOLBF, 0);
    g.self = argv[0];
    if (!facts_driver()) return 0;
    facts_allocations();
    facts_host_memory();
    facts_streams();
    facts_dmabuf();
    facts_ipc();
    facts_vmm_and_frees();
}

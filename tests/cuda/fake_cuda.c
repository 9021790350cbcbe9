/* A fake CUDA driver library for CPU tests: exports the driver entry points OrbitTE
 * resolves, backs "device memory" with host memory, and tracks which pointers it
 * allocated so cuPointerGetAttribute can tell device from host memory. Knobs through the
 * environment: FAKE_CUDA_DEVICES (device count, default 1), FAKE_CUDA_INIT_FAIL. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef uint64_t dptr_t;
#define MAX_ALLOCS 64
static struct { dptr_t p; size_t n; } g_allocs[MAX_ALLOCS];
static int g_ctx_token, g_stream_token, g_event_token;

int cuInit(unsigned int flags) { (void)flags; return getenv("FAKE_CUDA_INIT_FAIL") ? 100 : 0; }
int cuDriverGetVersion(int *v) { *v = 13000; return 0; }
int cuDeviceGetCount(int *n) {
    const char *s = getenv("FAKE_CUDA_DEVICES");
    *n = s ? atoi(s) : 1;
    return 0;
}
int cuDeviceGet(int *dev, int ordinal) { *dev = ordinal; return 0; }
int cuDeviceGetName(char *name, int len, int dev) {
    (void)dev;
    strncpy(name, "Fake GPU", (size_t)len);
    return 0;
}
int cuDevicePrimaryCtxRetain(void **ctx, int dev) { (void)dev; *ctx = &g_ctx_token; return 0; }
int cuDevicePrimaryCtxRelease_v2(int dev) { (void)dev; return 0; }
int cuCtxSetCurrent(void *ctx) { (void)ctx; return 0; }
int cuMemAlloc_v2(dptr_t *p, size_t n) {
    for (int i = 0; i < MAX_ALLOCS; i++) {
        if (g_allocs[i].p == 0) {
            void *m = malloc(n);
            if (m == NULL) return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
            g_allocs[i].p = (dptr_t)(uintptr_t)m;
            g_allocs[i].n = n;
            *p = g_allocs[i].p;
            return 0;
        }
    }
    return 2;
}
int cuMemFree_v2(dptr_t p) {
    for (int i = 0; i < MAX_ALLOCS; i++) {
        if (g_allocs[i].p == p && p != 0) {
            free((void *)(uintptr_t)p);
            g_allocs[i].p = 0;
            return 0;
        }
    }
    return 1;
}
int cuMemcpyHtoD_v2(dptr_t dst, const void *src, size_t n) { memcpy((void *)(uintptr_t)dst, src, n); return 0; }
int cuMemcpyDtoH_v2(void *dst, dptr_t src, size_t n) { memcpy(dst, (void *)(uintptr_t)src, n); return 0; }
int cuPointerGetAttribute(void *data, int attr, dptr_t ptr) {
    if (attr != 2) return 1;
    for (int i = 0; i < MAX_ALLOCS; i++) {
        if (g_allocs[i].p != 0 && ptr >= g_allocs[i].p && ptr < g_allocs[i].p + g_allocs[i].n) {
            *(unsigned int *)data = 2; /* CU_MEMORYTYPE_DEVICE */
            return 0;
        }
    }
    return 1; /* CUDA_ERROR_INVALID_VALUE: not a driver pointer */
}
int cuStreamCreate(void **s, unsigned int flags) { (void)flags; *s = &g_stream_token; return 0; }
int cuStreamDestroy_v2(void *s) { (void)s; return 0; }
int cuEventCreate(void **e, unsigned int flags) { (void)flags; *e = &g_event_token; return 0; }
int cuEventRecord(void *e, void *s) { (void)e; (void)s; return 0; }
int cuEventQuery(void *e) { (void)e; return 0; }
int cuEventDestroy_v2(void *e) { (void)e; return 0; }

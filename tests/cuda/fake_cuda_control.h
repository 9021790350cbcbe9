/*
 * tests/cuda/fake_cuda_control.h - the test control API of the fake libcuda
 * (tests/cuda:libfake_cuda.so).
 *
 * Only the fake exports these functions: a test that dlopen()s the driver library looks
 * them up with dlsym() on the same handle, and their presence is how it knows it runs on
 * the fake (on a real libcuda the lookup fails and fake-only cases skip). The typedefs
 * below (fake_cuda_*_fn) are the pointer types to cast dlsym()'s result to.
 *
 * Environment knobs, read at the first cuInit():
 *   FAKE_CUDA_DEVICES       number of devices (default 1, at most FAKE_CUDA_MAX_DEVICES)
 *   FAKE_CUDA_MEM_BYTES     per-device capacity in bytes (default 1 GiB); cuMemAlloc and
 *                           cuMemCreate past it return CUDA_ERROR_OUT_OF_MEMORY
 *   FAKE_CUDA_MAX_DELAY_US  upper bound of the random delay a stream worker waits before
 *                           each queued operation (default 200; 0 = no delay)
 *   FAKE_CUDA_INIT_FAIL     if set, cuInit returns CUDA_ERROR_NO_DEVICE (100)
 *   FAKE_CUDA_PCI_BUS_IDS   the devices' PCI addresses, "dddd:bb:dd.f" joined by ',' (device
 *                           0 first); a device past the list is at 0000:<0x18+dev>:00.0 (the
 *                           default for all). cuDeviceGetPCIBusId and the PCI domain, bus and
 *                           device attributes answer from it; a malformed list makes cuInit
 *                           return CUDA_ERROR_INVALID_VALUE (1)
 *
 * All functions are thread-safe. Counters are a snapshot taken under the fake's locks.
 *
 * Host synchronisation is CUDA's documented one, so code that forgets a wait fails here:
 *   - every stream (and each context's legacy NULL stream) is a worker thread running its
 *     queue in order after a random delay; events complete when the worker passes them;
 *   - cuMemcpy*Async with pinned host memory or device memory only returns at once; an
 *     async HtoD from pageable memory has staged the source when it returns; an async
 *     DtoH into pageable memory is complete when it returns;
 *   - the synchronous cuMemcpyDtoH and cuMemcpyHtoD from pinned memory return complete;
 *     cuMemcpyHtoD from PAGEABLE memory returns once the source is staged and cuMemcpyDtoD
 *     and cuMemsetD8 (device memory) return at once: the bytes land when the legacy stream
 *     gets to them. Later work on the legacy stream or on a BLOCKING stream (flags 0) is
 *     ordered after them; a NON-BLOCKING stream, another process, or a NIC reading through
 *     a dmabuf fd may see the old bytes until cuStreamSynchronize(NULL), unless the
 *     allocation has CU_POINTER_ATTRIBUTE_SYNC_MEMOPS = 1 (then they return complete);
 *   - cuMemFree / cuMemFreeHost / cuMemHostUnregister / cuIpcCloseMemHandle / cuMemUnmap
 *     wait for queued work that touches the memory.
 */
#ifndef OTE_TESTS_CUDA_FAKE_CUDA_CONTROL_H
#define OTE_TESTS_CUDA_FAKE_CUDA_CONTROL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FAKE_CUDA_MAX_DEVICES 8

typedef struct fake_cuda_counters {
    /* Live cuMemAlloc allocations and the bytes they were asked for (all devices). */
    uint64_t device_allocs;
    uint64_t device_bytes;
    /* Live cuMemHostAlloc allocations and their bytes. */
    uint64_t host_allocs;
    uint64_t host_bytes;
    /* Live cuMemHostRegister registrations. */
    uint64_t host_registrations;
    /* Live streams and events (created and not yet destroyed). A destroyed stream whose
     * queued work has not finished yet still counts until its worker has ended. */
    uint64_t streams;
    uint64_t events;
    /* Stream operations queued or running, not yet completed (copies, memsets, event
     * records, host functions), over all streams. */
    uint64_t pending_ops;
    /* cuIpcGetMemHandle: successful calls since load (cumulative), and live device
     * allocations that have been exported at least once. */
    uint64_t ipc_exports;
    uint64_t ipc_exported_allocs;
    /* cuIpcOpenMemHandle: distinct imported allocations mapped now, and open references
     * to them (an allocation opened twice is 1 import, 2 refs). */
    uint64_t ipc_imports;
    uint64_t ipc_import_refs;
    /* cuMemGetHandleForAddressRange: dmabuf fds handed out since load (cumulative; the
     * caller owns and closes them). */
    uint64_t dmabuf_fds;
    /* Sum over devices of the primary context retain counts, and each device's. */
    uint64_t primary_ctx_retains;
    uint32_t primary_ctx_refs[FAKE_CUDA_MAX_DEVICES];
    /* Live device bytes per device (cuMemAlloc plus cuMemCreate). */
    uint64_t device_bytes_per_device[FAKE_CUDA_MAX_DEVICES];
    /* VMM: live cuMemCreate/cuMemImportFromShareableHandle handles, live
     * cuMemAddressReserve reservations, live cuMemMap mappings, and POSIX fds handed out
     * by cuMemExportToShareableHandle since load (cumulative; the caller closes them). */
    uint64_t vmm_handles;
    uint64_t vmm_reservations;
    uint64_t vmm_mappings;
    uint64_t vmm_exported_fds;
    /* Faults that fired since load (cumulative). */
    uint64_t faults_fired;
    /* The copy gate (fake_cuda_hold_copies): copies waiting at it now, and copies that
     * have waited at it since load (cumulative). */
    uint64_t copies_held;
    uint64_t copies_held_total;
} fake_cuda_counters_t;

/* Returns 1 (only the fake exports this). */
int fake_cuda_is_fake(void);

/* Arms a fault on an entry point named by its BASE name ("cuMemAlloc", "cuEventQuery",
 * "cuMemcpyHtoDAsync", "cuIpcOpenMemHandle", ...): the nth next call (1 = the very next)
 * and the count-1 calls after it return `result` (a CUresult) without doing anything;
 * count -1 = every call from the nth on. Arming a name again replaces its previous fault.
 * Calls are counted per entry point from the moment of arming, over all threads. A fault
 * is checked before any other validation, cuInit and cuGetProcAddress included. */
void fake_cuda_fail(const char *base_name, int nth, int count, int result);

/* Disarms every fault. */
void fake_cuda_clear_faults(void);

/* Sets the upper bound of the random per-operation delay of stream workers (microseconds;
 * 0 = none). Applies to operations dequeued from now on. */
void fake_cuda_set_max_delay_us(unsigned us);

/* The copy gate: a way to make copies slow on purpose, for as long as a test needs.
 * fake_cuda_hold_copies(pass) closes it: the next `pass` stream copies that reach it run
 * as usual, and every copy after them waits at the gate, before it moves a byte, until
 * fake_cuda_release_copies() opens it again. "Stream copies" are every cuMemcpy*, sync and
 * async, on any stream of this process (memsets, event records and host functions pass).
 * A copy reaches the gate when its stream's worker gets to it (after the random delay and
 * after the work it is ordered behind), so a held copy is exactly a slow copy on a GPU:
 * its stream stays busy (cuStreamQuery NOT_READY, later work on the stream waits), events
 * recorded after it stay NOT_READY, a synchronous cuMemcpy* or a synchronize waits for it
 * (up to the fake's 120 s limit, then CUDA_ERROR_LAUNCH_TIMEOUT), cuMemFree of its memory
 * waits, and pending_ops counts it. copies_held (counters) says how many wait now, so a
 * test can wait until the engine is really in the middle of a copy, act (cancel, kill a
 * peer), then release. Calling hold again while closed replaces the pass budget; the
 * gate opens by itself when the library unloads. */
void fake_cuda_hold_copies(unsigned pass);
void fake_cuda_release_copies(void);

/* Writes a snapshot of the counters to *out. */
void fake_cuda_counters(fake_cuda_counters_t *out);

/* Number of calls of an entry point (BASE name) since load, failed ones included;
 * 0 for a name the fake does not know. */
uint64_t fake_cuda_calls(const char *base_name);

typedef int (*fake_cuda_is_fake_fn)(void);
typedef void (*fake_cuda_fail_fn)(const char *base_name, int nth, int count, int result);
typedef void (*fake_cuda_clear_faults_fn)(void);
typedef void (*fake_cuda_set_max_delay_us_fn)(unsigned us);
typedef void (*fake_cuda_counters_fn)(fake_cuda_counters_t *out);
typedef uint64_t (*fake_cuda_calls_fn)(const char *base_name);
typedef void (*fake_cuda_hold_copies_fn)(unsigned pass);
typedef void (*fake_cuda_release_copies_fn)(void);

#ifdef __cplusplus
}
#endif

#endif

// tests/engine/gpu_fixture.h - what the engine's GPU tests share (test-only): a fixture
// over the fake libcuda (skips on a real driver) with device memory allocated, filled,
// read and hashed through the driver (every allocation destroyed at TearDown), engines
// with gpu_paths, the ote_gpu_target child (its "dev", "host", "dev2" buffers in place of
// ote_target's rw, ro, wo) and the segment open; the target's hash reply and pattern
// hashes to compare it with.
#ifndef OTE_TESTS_ENGINE_GPU_FIXTURE_H
#define OTE_TESTS_ENGINE_GPU_FIXTURE_H

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tests/cuda/cuda_test_util.h"
#include "tests/engine/engine_util.h"
#include "tests/engine/target.h"

extern "C" {
#include "cuda/memory/memory.h"
#include "ote/ote.h"
}

namespace ote_gpu_test {

// The reply of ote_gpu_target's "sum" command for hash h.
std::string Hex(uint64_t h);
// Hash of bytes [off, off+len) of the seed pattern.
uint64_t PatternHash(uint64_t seed, uint64_t off, uint64_t len);
std::string Num(uint64_t v);

// An RDMA engine over verbs/sim (ote_test::RdmaConfig(timeout_ms)) with gpu_paths when
// not null, and the other keys kv; nullptr (and a failure) when it cannot be made.
ote_engine_t *RdmaGpuEngine(const char *gpu_paths = nullptr, const ote_test::ConfigKv &kv = {},
                            const char *timeout_ms = "20000");

// Start ote_gpu_target in t (device buffers of len bytes, listening on 127.0.0.1:0) with
// the extra environment env ("KEY=VALUE"); false when it did not say READY.
bool StartGpuTarget(ote_test::Target &t, uint64_t len, const std::vector<std::string> &env);

// Where a cancel test holds copies at the fake's copy gate (fake_cuda_hold_copies): in
// this process, or in an ote_gpu_target child through its hold/held/release commands.
struct CopyGate {
    std::function<void(unsigned pass)> hold;
    std::function<uint64_t()> held; // copies waiting at the gate now
    std::function<void()> release;
};
// The gate of ote_gpu_target t.
CopyGate TargetGate(ote_test::Target &t);

// The fake libcuda loaded (else the case skips) and device 0 open; device memory through
// the driver.
class GpuTest : public ote_cuda_test::CudaTest {
  protected:
    void SetUp() override;
    void TearDown() override;

    // A device allocation of n bytes (ote_cuda_alloc_create flags), destroyed at
    // TearDown; 0 (and a failure) when it cannot be made.
    uint64_t DevAlloc(size_t n, unsigned flags = 0);
    // Device bytes [addr, addr+len) := bytes [base, base+len) of the seed pattern.
    void DevFill(uint64_t addr, size_t len, uint64_t seed, uint64_t base = 0);
    // Device bytes [addr, addr+len) through a device-to-host copy.
    std::vector<uint8_t> DevRead(uint64_t addr, size_t len);
    uint64_t DevHash(uint64_t addr, size_t len);
    // ote_segment_open of e to addr into *seg (a failure when it does not open).
    static void OpenSegment(ote_engine_t *e, const std::string &addr, ote_segment_t **seg);
    // ... to the engine peer's listen address.
    static void OpenSegment(ote_engine_t *e, ote_engine_t *peer, ote_segment_t **seg);

    // The copy gate of this process's fake driver.
    CopyGate LocalGate();
    // Cancel in the middle of a transfer, proven: closes gate (`pass` copies run, later ones
    // wait), submits r on a new batch of e, waits until a copy is held (the request cannot
    // have finished: its bytes are not all moved), cancels, opens the gate and waits for
    // the end, which must be CANCELED (OTE_ERR_CANCELED) with fewer bytes done than asked
    // (ote_batch_cancel's documented outcome for a request not all on the wire). Returns
    // the request's final status (state FAILED, and a failure, when no copy was held in
    // time); the batch is destroyed.
    ote_transfer_status_t CancelWhileCopyHeld(ote_engine_t *e, const ote_request_t &r,
                                              const CopyGate &gate, unsigned pass);

    std::vector<ote_cuda_alloc_t *> allocs_;

  private:
    // DevFill's and DevHash's host side: one 4 MiB buffer reused, so that filling or
    // hashing device memory allocates (and faults in) nothing per call.
    std::vector<uint8_t> &Scratch();
    std::vector<uint8_t> scratch_;
};

} // namespace ote_gpu_test

#endif

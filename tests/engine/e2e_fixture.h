// tests/engine/e2e_fixture.h - the fixture of the end-to-end tests: a target engine in a
// child process (ote_target), an engine in this process as the requester, and a segment
// open to the target. Subclasses choose the target's buffer and environment and the
// requester's configuration by passing a TargetSession to the constructor.
#ifndef OTE_TESTS_ENGINE_E2E_FIXTURE_H
#define OTE_TESTS_ENGINE_E2E_FIXTURE_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tests/engine/engine_util.h"
#include "tests/engine/target.h"
#include "tests/util/test_base.h"

extern "C" {
#include "ote/ote.h"
}

namespace ote_test {

struct TargetSession {
    uint64_t rw_size = 64ull << 20;      // the target's rw buffer
    std::vector<std::string> target_env; // extra "KEY=VALUE" for the target
    ConfigKv config;                     // the requester's settings (none: defaults)
    uint64_t wait_ns = 60 * kSec;        // how long Transfer() waits for its request
};

class TargetE2eTest : public OteTest {
  protected:
    explicit TargetE2eTest(TargetSession session) : session_(std::move(session)) {}

    // Starts the target, creates the requester engine and opens a segment to the target.
    void SetUp() override;
    // Closes the segment, destroys the engine and expects the target to quit with 0.
    void TearDown() override;

    // One request to the target, waited for; returns the wait status.
    ote_status_t Transfer(ote_opcode_t op, void *local, uint64_t remote, size_t len,
                          ote_transfer_status_t *st_out = nullptr);

    // WRITE len bytes at rw+off, check them on the target, READ them back, check here.
    void RoundTrip(size_t len, uint64_t off, size_t local_shift, uint64_t seed);

    TargetSession session_;
    Target target_;
    ote_engine_t *engine_ = nullptr;
    ote_segment_t *seg_ = nullptr;
};

} // namespace ote_test

#endif

// tests/engine/engine_util.h - engines, configurations and single transfers for the
// engine tests (gtest EXPECTs inside: a failing call fails the calling test).
#ifndef OTE_TESTS_ENGINE_ENGINE_UTIL_H
#define OTE_TESTS_ENGINE_ENGINE_UTIL_H

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

extern "C" {
#include "ote/ote.h"
}

namespace ote_test {

constexpr uint64_t kMs = 1000000ull;
constexpr uint64_t kSec = 1000 * kMs;

using ConfigKv = std::vector<std::pair<const char *, const char *>>;

// An engine configured with kv (each key set on a fresh configuration); nullptr on failure.
ote_engine_t *NewEngine(const ConfigKv &kv = {});

// The environment of an ote_target child that uses the RDMA transport over verbs/sim.
extern const std::vector<std::string> kRdmaTargetEnv;

// A configuration for the RDMA transport over verbs/sim with transfer_timeout_ms (and
// connect_timeout_ms when given). The caller destroys it.
ote_config_t *RdmaConfig(const char *timeout_ms = "20000", const char *connect_ms = nullptr);
// An engine made from RdmaConfig(timeout_ms, connect_ms); nullptr on failure.
ote_engine_t *RdmaEngine(const char *timeout_ms = "20000", const char *connect_ms = nullptr);

// Names of the uverbs devices the kernel exposes (what rdma-core would open), from
// /sys/class/infiniband_verbs; empty on a machine without an RDMA device. Tests that
// show a no-device failure skip, saying so, where this is not empty.
std::vector<std::string> KernelVerbsDevices();

// The engine's listen address ("host:port").
std::string EngineAddress(ote_engine_t *e);

// One request on a fresh batch, waited for up to wait_ns; returns the submit or wait
// status. The request's own status goes to ts when given.
ote_status_t RunOne(ote_engine_t *e, const ote_request_t &r, uint64_t wait_ns,
                    ote_transfer_status_t *ts = nullptr);

// ote_memory_unregister(e, addr), asked again while it answers BUSY (a grant, a pin or a
// receipt still on its way in) for up to timeout (ote_test::WaitUntil: a failure names
// the wait when it stays BUSY); the last status.
ote_status_t UnregisterWhenFree(ote_engine_t *e, void *addr,
                                std::chrono::nanoseconds timeout = std::chrono::seconds(30));

} // namespace ote_test

#endif

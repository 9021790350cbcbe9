// Many RDMA peers of one engine (issue 25): OTE_SCALE_PEERS peers (default 1,024, the most) in
// OTE_SCALE_PROCS processes (default 8, tests/engine/ote_swarm.c), each an engine of its
// own over verbs/sim, open segments to one target engine (tests/engine/ote_target.c) and
// keep them open together; then each WRITEs 64 KiB of its own pattern into its own range
// of the target's buffer and READs it back, bytes compared. Every peer must succeed. After
// the peers close, the target's open fds return to what they were before the first peer
// came, and its resident memory to within 16 MiB + 16 KiB per peer of it (glibc keeps
// some arenas and thread stacks); the
// memory each peer cost the target while connected is printed.
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "tests/engine/target.h"
#include "tests/util/test_base.h"
#include "tests/util/wait.h"

namespace {

using ote_test::Target;

uint64_t EnvOr(const char *name, uint64_t dflt) {
    const char *v = getenv(name);
    return v != nullptr && v[0] != '\0' ? strtoull(v, nullptr, 10) : dflt;
}

// One device, one port, one GID: a sim instance per engine, as small as it gets.
const std::vector<std::string> kEnv = {
    "OTE_TRANSPORTS=rdma",
    "OTE_VERBS_PROVIDER=sim",
    "OTE_SIM_CONFIG=dev=sim0,numa=0;port;gid=auto-v4,type=v2",
    "OTE_TRANSFER_TIMEOUT_MS=120000",
    "OTE_CONNECT_TIMEOUT_MS=60000",
    "OTE_HANDSHAKE_TIMEOUT_MS=60000",
    "OTE_LOG_LEVEL=warn",
    "OTE_TCP_MAX_ACCEPTED=4096", // the target's listener holds every peer's control connection
};

struct Stat {
    long fds = -1, rss_kb = -1;
};

Stat Read(Target &t) {
    Stat s;
    std::istringstream is(t.Command("stat", 60000));
    std::string w;
    is >> w >> s.fds >> s.rss_kb;
    return w == "STAT" ? s : Stat{};
}

bool Expect(Target &p, const char *word, uint64_t *a, uint64_t *b, int timeout_ms) {
    std::istringstream is(p.Reply(timeout_ms));
    std::string w;
    is >> w >> *a;
    if (b != nullptr) is >> *b;
    return w == word && !is.fail();
}

// 1,024 peers in the default configuration. Under ASan 256 (OTE_SCALE_PEERS still
// overrides): on a 2-core VM the 1,024-peer run under ASan took 1,030 s and one process
// missed its 600 s DONE (ci27), where the default build takes about a minute; the
// 1,024-peer figures and checks come from the default run.
#ifdef OTE_ASAN
constexpr uint64_t kDefaultPeers = 256;
#else
constexpr uint64_t kDefaultPeers = 1024;
#endif

class RdmaScaleTest : public ote_test::OteTest {};

TEST_F(RdmaScaleTest, ThousandPeersOpenMoveAndCheckBytesThenEverythingReturns) {
    signal(SIGPIPE, SIG_IGN); // a child that died fails its Expect, not this process
    const uint64_t peers = EnvOr("OTE_SCALE_PEERS", kDefaultPeers),
                   procs = EnvOr("OTE_SCALE_PROCS", 8);
    ASSERT_GE(procs, 1u);
    ASSERT_LE(peers, 1024u); // the target's rw buffer holds 1,024 ranges of 64 KiB
    Target target;
    std::vector<std::string> tenv = kEnv;
    tenv.push_back("OTE_RDMA_LANES=2");
    ASSERT_TRUE(target.Start(64ull << 20, "127.0.0.1:0", tenv));
    const Stat base = Read(target);
    ASSERT_GT(base.fds, 0);

    std::vector<std::unique_ptr<Target>> swarm;
    std::vector<std::string> senv = kEnv;
    senv.push_back("OTE_RDMA_LANES=1");
    uint64_t first = 0;
    for (uint64_t k = 0; k < procs; k++) {
        uint64_t n = peers / procs + (k < peers % procs ? 1 : 0);
        auto p = std::make_unique<Target>();
        p->binary = "ote_swarm";
        p->args = {target.address, std::to_string(first), std::to_string(n)};
        ASSERT_TRUE(p->Start(0, "", senv));
        first += n;
        swarm.push_back(std::move(p));
    }
    uint64_t opened = 0;
    for (auto &p : swarm) {
        uint64_t ok = 0, bad = 0;
        ASSERT_TRUE(Expect(*p, "OPEN", &ok, &bad, 600000));
        EXPECT_EQ(bad, 0u);
        opened += ok;
    }
    ASSERT_EQ(opened, peers);
    for (auto &p : swarm) ASSERT_TRUE(p->Send("go " + std::to_string(target.rw)));
    uint64_t done = 0;
    for (auto &p : swarm) {
        uint64_t ok = 0, bad = 0;
        ASSERT_TRUE(Expect(*p, "DONE", &ok, &bad, 600000));
        EXPECT_EQ(bad, 0u);
        done += ok;
    }
    EXPECT_EQ(done, peers);
    const Stat peak = Read(target);
    printf(
        "scale: %llu peers in %llu processes: target fds %ld -> %ld, resident %ld KiB -> "
        "%ld KiB: %.1f KiB per connected peer\n",
        (unsigned long long)peers, (unsigned long long)procs, base.fds, peak.fds, base.rss_kb,
        peak.rss_kb, (double)(peak.rss_kb - base.rss_kb) / (double)peers);

    for (auto &p : swarm) ASSERT_TRUE(p->Send("close"));
    for (auto &p : swarm) {
        uint64_t bad = 0;
        EXPECT_TRUE(Expect(*p, "CLOSED", &bad, nullptr, 600000));
        EXPECT_EQ(bad, 0u);
        p->Quit();
    }
    // The target notices each peer's end and frees what it held for it.
    Stat after;
    bool back = ote_test::WaitUntil(
        [&] {
            after = Read(target);
            return after.fds == base.fds;
        },
        std::chrono::seconds(60), "the target's fds back to their count before the peers");
    EXPECT_TRUE(back) << "target fds " << after.fds << ", before the peers " << base.fds;
#if defined(OTE_ASAN)
    // ASan keeps freed blocks in its quarantine (and LSan checks the target for leaks at
    // its exit): resident memory says nothing about what the engine gave back here.
#else
    // Within 16 MiB plus 16 KiB per peer (a peer costs the target about 210 KiB while
    // connected): glibc keeps some freed memory after malloc_trim (arenas of the ended
    // connection threads, its cache of their stacks); 1,024 peers left 7-20 MiB behind.
    EXPECT_LE(after.rss_kb, base.rss_kb + 16 * 1024 + static_cast<long>(peers) * 16)
        << "target resident memory did not return";
#endif
    printf("scale: after close: target fds %ld, resident %ld KiB\n", after.fds, after.rss_kb);
    EXPECT_EQ(target.Quit(), 0);
}

} // namespace

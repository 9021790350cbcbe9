// tests/engine/register_hostile_test.cc - what a user can hand to ote_memory_register that
// the engine cannot touch: unmapped memory, PROT_NONE (a guard page, a device address),
// read-only memory registered for peers' WRITEs, a range running from mapped into
// unmapped memory or with a hole, a file mapping longer than its file, a freed device
// allocation. Each is made and registered inside a target process (ote_target with no
// CUDA driver, ote_gpu_target with the fake libcuda loaded) and must get its clear status;
// then a peer (this process) READs and WRITEs that range over tcp, shm and rdma (verbs
// sim): every request fails with OTE_ERR_ACCESS and the target lives on. Before the
// registration checked its range, the peer's request killed the target with SIGSEGV or
// SIGBUS (and, with a driver loaded, PROT_NONE registered as host memory).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "tests/engine/engine_util.h"
#include "tests/engine/gpu_fixture.h"
#include "tests/engine/target.h"

extern "C" {
#include "ote/ote.h"
#include "tests/engine/hostile_ranges.h"
}

namespace {

using ote_test::kSec;
using ote_test::Target;

struct Case {
    const char *kind;
    int no_driver;   // status with no CUDA driver in the target
    int with_driver; // status with the fake libcuda loaded there
};

// rdma refuses read-only memory that the others serve (its MW-bindable MR is pinned for
// writing); "roforread" is the one range that registers elsewhere.
const Case kCases[] = {
    {"unmapped", OTE_ERR_INVALID, OTE_ERR_INVALID},
    {"protnone", OTE_ERR_NO_DEVICE, OTE_ERR_ACCESS},
    {"rofwrite", OTE_ERR_ACCESS, OTE_ERR_ACCESS},
    {"roforread", OTE_OK, OTE_OK},
    {"crossing", OTE_ERR_INVALID, OTE_ERR_INVALID},
    {"midhole", OTE_ERR_INVALID, OTE_ERR_INVALID},
    {"shortfile", OTE_ERR_INVALID, OTE_ERR_INVALID},
};

struct Param {
    const char *transport; // "tcp", "shm" or "rdma"
    bool driver;           // ote_gpu_target (fake libcuda loaded) or ote_target (none)
};

std::string Name(const testing::TestParamInfo<Param> &p) {
    return std::string(p.param.transport) + (p.param.driver ? "_driver" : "_nodriver");
}

class RegisterHostileTest : public ote_gpu_test::GpuTest,
                            public testing::WithParamInterface<Param> {
  protected:
    bool Rdma() const { return strcmp(GetParam().transport, "rdma") == 0; }

    bool StartTarget(Target &t) {
        std::vector<std::string> env;
        if (Rdma()) env = ote_test::kRdmaTargetEnv;
        else env.push_back(std::string("OTE_TRANSPORTS=") + GetParam().transport);
        if (!GetParam().driver) { // no driver loads there, whatever this process has
            env.push_back("OTE_CUDA_LIBRARY=/nonexistent/libcuda.so.1");
            return t.Start(1 << 20, "127.0.0.1:0", env);
        }
        return ote_gpu_test::StartGpuTarget(t, 1 << 20, env);
    }

    ote_engine_t *Requester() {
        if (Rdma()) return ote_test::RdmaEngine();
        return ote_test::NewEngine({{"transports", GetParam().transport}});
    }

    // The target still answers, and its own buffer is intact.
    void ExpectAlive(Target &t) {
        const char *buf = GetParam().driver ? "host" : "rw";
        std::string r = t.Command(std::string("sum ") + buf + " 0 64");
        EXPECT_EQ(r.rfind("SUM ", 0), 0u) << "target gone: '" << r << "'";
    }

    // One request on [addr, +len) of the target; its final status.
    ote_transfer_status_t Run(ote_engine_t *e, ote_segment_t *seg, ote_opcode_t op, uint64_t addr,
                              uint64_t len, std::vector<uint8_t> &local) {
        ote_request_t r = {op, local.data(), seg, addr, len};
        ote_transfer_status_t ts{};
        (void)ote_test::RunOne(e, r, 60 * kSec, &ts);
        return ts;
    }
};

TEST_P(RegisterHostileTest, RefusedRangesGetTheirStatusAndPeersCannotKillTheTarget) {
    Target t;
    ASSERT_TRUE(StartTarget(t));
    ote_engine_t *e = Requester();
    ASSERT_NE(e, nullptr);
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_segment_open(e, t.address.c_str(), &seg), OTE_OK);
    ote_segment_info_t si;
    ASSERT_EQ(ote_segment_info(seg, &si), OTE_OK);
    EXPECT_STREQ(si.transport, GetParam().transport);
    std::vector<Case> cases(std::begin(kCases), std::end(kCases));
    if (GetParam().driver) cases.push_back({"freeddev", OTE_ERR_INVALID, OTE_ERR_INVALID});
    for (const Case &c : cases) {
        SCOPED_TRACE(c.kind);
        std::istringstream in(t.Command(std::string("hostile ") + c.kind));
        std::string word;
        int code = -1;
        uint64_t addr = 0, len = 0;
        unsigned perms = 0;
        in >> word >> code >> addr >> len >> perms;
        ASSERT_EQ(word, "HOSTILE");
        int want = GetParam().driver ? c.with_driver : c.no_driver;
        if (want == OTE_OK && Rdma()) want = OTE_ERR_UNSUPPORTED;
        EXPECT_EQ(ote_status_code(code), want) << "status " << code;
        // The peer asks for the range whatever the answer: it must never kill the target.
        std::vector<uint8_t> local(len, 0);
        ote_transfer_status_t rd = Run(e, seg, OTE_READ, addr, len, local);
        ote_transfer_status_t wr = Run(e, seg, OTE_WRITE, addr, len, local);
        if (code == OTE_OK) { // read-only memory served for READ only
            EXPECT_EQ(rd.state, OTE_TRANSFER_COMPLETED) << ote_status_str(rd.error);
            EXPECT_EQ(local, std::vector<uint8_t>(len, 0x5a));
        } else {
            EXPECT_EQ(rd.state, OTE_TRANSFER_FAILED);
            EXPECT_EQ(ote_status_code(rd.error), OTE_ERR_ACCESS) << ote_status_str(rd.error);
        }
        EXPECT_EQ(wr.state, OTE_TRANSFER_FAILED);
        EXPECT_EQ(ote_status_code(wr.error), OTE_ERR_ACCESS) << ote_status_str(wr.error);
        ExpectAlive(t);
    }
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
    EXPECT_EQ(t.Quit(), 0);
}

INSTANTIATE_TEST_SUITE_P(Transports, RegisterHostileTest,
                         testing::Values(Param{"tcp", false}, Param{"tcp", true},
                                         Param{"shm", false}, Param{"shm", true},
                                         Param{"rdma", false}, Param{"rdma", true}),
                         Name);

// The same sweep inside this process, which has the fake libcuda loaded: every refusal
// names its reason in a WARN line, and nothing is registered.
class RegisterHostileInProcessTest : public ote_gpu_test::GpuTest {};

TEST_F(RegisterHostileInProcessTest, HostileRangesAreRefusedWithReasons) {
    ote_engine_t *e = ote_test::NewEngine({{"transports", "tcp"}});
    ASSERT_NE(e, nullptr);
    struct {
        const char *kind, *reason;
    } want[] = {{"unmapped", "not mapped"},
                {"protnone", "mapped without the access asked (---p"},
                {"rofwrite", "mapped without the access asked (r--p"},
                {"crossing", "not mapped"},
                {"midhole", "not mapped"},
                {"shortfile", "past the end of its file (rw-s /memfd:ote_hostile"}};
    for (auto &w : want) {
        SCOPED_TRACE(w.kind);
        uint64_t addr = 0, len = 0;
        unsigned perms = 0;
        ASSERT_EQ(ote_test_hostile_range(w.kind, &addr, &len, &perms), 0);
        EXPECT_NE(ote_memory_register(e, reinterpret_cast<void *>(addr), len, perms), OTE_OK);
        EXPECT_TRUE(LogContains(w.reason));
        ote_buffer_info_t bi;
        EXPECT_EQ(ote_memory_query(e, reinterpret_cast<void *>(addr), &bi), OTE_ERR_NOT_FOUND);
    }
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
}

} // namespace

// A restarted RDMA peer at the same address (engine epochs), over verbs/sim, both engines
// in this process: the target engine is destroyed and a new one is created listening on
// the same "host:port" between transfers.
//  - a segment opened after the restart works on the first try, WRITE first or READ first,
//    every byte checked at both ends;
//  - a segment opened before the restart is bound to the incarnation it met: its next
//    request fails with OTE_ERR_PEER_LOST (the handshake saw a new epoch) and touches no
//    byte of the new incarnation, even where the new incarnation registered memory at the
//    same address; closing it and opening a new segment works on the first try;
//  - the endpoints (and their QPs) of a dead peer are evicted on both sides: the counts
//    return to their baselines (engine/rdma/test_hook.h);
//  - a GRANT_REQ naming the old incarnation's epoch is refused (CACHE_MISS) by the new
//    one without harm, and an INFO without the epoch field (an older engine) is served;
//  - so is a CONNECT naming the old incarnation's epoch (or another requester epoch than
//    its INFO's), before any endpoint or QP is made; a CONNECT cache miss makes the
//    requester rebuild the QP and retry the run once, a second one fails PEER_LOST.
#include <gtest/gtest.h>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "tests/engine/ctl_peer.h"
#include "tests/engine/engine_util.h"
#include "tests/engine/target.h"
#include "tests/util/test_base.h"
#include "tests/util/wait.h"

extern "C" {
#include "base/fault.h"
#include "base/le.h"
#include "base/time.h"
#include "engine/control/ctl.h"
#include "engine/rdma/test_hook.h"
#include "ote/ote.h"
#include "tests/engine/pattern.h"
}

namespace {

using ote_test::kSec;

constexpr size_t kLen = 4u << 20;

ote_engine_t *Engine(const char *listen) {
    return ote_test::NewEngine({{"transport", "rdma"},
                                {"verbs_provider", "sim"},
                                {"transfer_timeout_ms", "30000"},
                                {"listen_address", listen}});
}

// The target side: an engine with one registered buffer (READ and WRITE for peers).
struct TargetSide {
    ote_engine_t *e = nullptr;
    std::vector<uint8_t> buf;
    bool Start(const std::string &listen, uint8_t fill) {
        e = Engine(listen.c_str());
        if (e == nullptr) return false;
        buf.assign(kLen, fill);
        return ote_memory_register(e, buf.data(), buf.size(), OTE_PERM_READ | OTE_PERM_WRITE) ==
               OTE_OK;
    }
    void Stop() {
        if (e == nullptr) return;
        EXPECT_EQ(ote_memory_unregister(e, buf.data()), OTE_OK);
        EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
        e = nullptr;
    }
    uint64_t Addr() const { return (uint64_t)(uintptr_t)buf.data(); }
};

class RdmaRestartTest : public ote_test::OteTest {
  protected:
    void SetUp() override {
        OteTest::SetUp();
        ASSERT_TRUE(target_.Start("127.0.0.1:0", 0x11));
        addr_ = ote_test::EngineAddress(target_.e);
        req_ = Engine("127.0.0.1:0");
        ASSERT_NE(req_, nullptr);
        src_.resize(kLen);
        dst_.assign(kLen, 0);
        ASSERT_EQ(ote_memory_register(req_, src_.data(), kLen, OTE_PERM_READ), OTE_OK);
        ASSERT_EQ(ote_memory_register(req_, dst_.data(), kLen, OTE_PERM_WRITE), OTE_OK);
    }
    void TearDown() override {
        if (req_ != nullptr) {
            EXPECT_EQ(ote_memory_unregister(req_, src_.data()), OTE_OK);
            EXPECT_EQ(ote_memory_unregister(req_, dst_.data()), OTE_OK);
            EXPECT_EQ(ote_engine_destroy(req_), OTE_OK);
        }
        target_.Stop();
        OteTest::TearDown();
    }

    // Destroy the target engine and create a new one on the same address.
    void Restart(uint8_t fill) {
        target_.Stop();
        ASSERT_TRUE(target_.Start(addr_, fill)) << "no new engine on " << addr_;
        ASSERT_EQ(ote_test::EngineAddress(target_.e), addr_);
    }

    ote_status_t Run(ote_segment_t *seg, ote_opcode_t op, void *local, size_t len,
                     ote_transfer_status_t *ts = nullptr) {
        return ote_test::RunOne(req_, {op, local, seg, target_.Addr(), len}, 60 * kSec, ts);
    }

    // WRITE a fresh pattern, check it at the target; READ it back, check it here.
    void WriteThenRead(ote_segment_t *seg, uint64_t seed) {
        ote_pattern_fill(src_.data(), kLen, seed, 0);
        ASSERT_EQ(Run(seg, OTE_WRITE, src_.data(), kLen), OTE_OK);
        EXPECT_EQ(memcmp(target_.buf.data(), src_.data(), kLen), 0);
        memset(dst_.data(), 0, kLen);
        ASSERT_EQ(Run(seg, OTE_READ, dst_.data(), kLen), OTE_OK);
        EXPECT_EQ(memcmp(dst_.data(), src_.data(), kLen), 0);
    }

    // A new segment of the requester to the target: WRITE then READ on it (bytes checked
    // at both ends), then closed.
    void WriteThenReadOnNewSegment(uint64_t seed) {
        ote_segment_t *seg = nullptr;
        ASSERT_EQ(ote_segment_open(req_, addr_.c_str(), &seg), OTE_OK);
        WriteThenRead(seg, seed);
        EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    }

    // With the fault point armed on every hit (a source cache miss): a WRITE on seg fails
    // OTE_ERR_PEER_LOST after two misses at least, and no byte of it lands (the target's
    // buffer is 0x66 before); the fault is disarmed after. Without a segment (*seg null)
    // one is opened with the fault armed.
    void WriteFailsPeerLostMovingNothing(ote_segment_t **seg, const char *fault, uint64_t seed) {
        memset(target_.buf.data(), 0x66, kLen);
        ote_pattern_fill(src_.data(), kLen, seed, 0);
        ASSERT_EQ(ote_fault_arm(fault, OTE_FAULT_EVERY, 0, OTE_ERR_FAULT, 0), OTE_OK);
        if (*seg == nullptr) {
            ASSERT_EQ(ote_segment_open(req_, addr_.c_str(), seg), OTE_OK);
        }
        ote_transfer_status_t ts;
        ote_status_t st = Run(*seg, OTE_WRITE, src_.data(), kLen, &ts);
        EXPECT_EQ(ote_status_code(st), OTE_ERR_PEER_LOST) << ote_status_str(st);
        EXPECT_EQ(ts.state, OTE_TRANSFER_FAILED);
        uint64_t misses = ote_fault_failures(fault);
        ote_fault_disarm_all();
        EXPECT_GE(misses, 2u);
        for (size_t i = 0; i < kLen; i++)
            ASSERT_EQ(target_.buf[i], 0x66) << "WRITE byte landed at " << i;
    }

    TargetSide target_;
    std::string addr_;
    ote_engine_t *req_ = nullptr;
    std::vector<uint8_t> src_, dst_;
};

TEST_F(RdmaRestartTest, NewSegmentAfterRestartWriteFirstWorksFirstTry) {
    WriteThenReadOnNewSegment(1);
    for (uint64_t round = 0; round < 2; round++) {
        Restart(0x22);
        WriteThenReadOnNewSegment(2 + round); // the first request after the restart: a WRITE
    }
}

TEST_F(RdmaRestartTest, NewSegmentAfterRestartReadFirstWorksFirstTry) {
    WriteThenReadOnNewSegment(5);
    Restart(0x00);
    ote_pattern_fill(target_.buf.data(), kLen, 6, 0); // the new incarnation's own bytes
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_segment_open(req_, addr_.c_str(), &seg), OTE_OK);
    memset(dst_.data(), 0, kLen);
    ote_transfer_status_t ts;
    ASSERT_EQ(Run(seg, OTE_READ, dst_.data(), kLen, &ts), OTE_OK);
    EXPECT_EQ(ts.state, OTE_TRANSFER_COMPLETED);
    EXPECT_EQ(memcmp(dst_.data(), target_.buf.data(), kLen), 0);
    WriteThenRead(seg, 7);
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
}

// The old segment met the old incarnation: its next request fails PEER_LOST and moves no
// byte to the new one (whose buffer may sit at the very address the old one had); a new
// segment then works on the first try.
TEST_F(RdmaRestartTest, SegmentOpenedBeforeRestartFailsClearlyAndReopenWorks) {
    ote_segment_t *old = nullptr;
    ASSERT_EQ(ote_segment_open(req_, addr_.c_str(), &old), OTE_OK);
    WriteThenRead(old, 8);
    Restart(0x33);
    for (ote_opcode_t op : {OTE_WRITE, OTE_READ}) {
        ote_pattern_fill(src_.data(), kLen, 9, 0);
        ote_transfer_status_t ts;
        ote_status_t st = ote_test::RunOne(
            req_, {op, op == OTE_WRITE ? src_.data() : dst_.data(), old, target_.Addr(), kLen},
            60 * kSec, &ts);
        EXPECT_NE(st, OTE_OK);
        EXPECT_EQ(ote_status_code(st), OTE_ERR_PEER_LOST) << ote_status_str(st);
        for (size_t i = 0; i < kLen; i += 4096)
            ASSERT_EQ(target_.buf[i], 0x33) << "a byte of the new incarnation changed at " << i;
    }
    EXPECT_EQ(ote_segment_close(old), OTE_OK);
    WriteThenReadOnNewSegment(10);
}

// Polls f() until it returns want, for up to 60 s (a loaded machine under ASan); returns
// the last value.
uint64_t WaitFor(const std::function<uint64_t()> &f, uint64_t want, const char *what) {
    uint64_t v = 0;
    ote_test::WaitUntil(
        [&] {
            v = f();
            return v == want;
        },
        std::chrono::seconds(60), what);
    return v;
}

TEST_F(RdmaRestartTest, EndpointsOfADeadPeerAreEvicted) {
    uint64_t req0 = ote__rdma_test_endpoints(req_);
    uint64_t tgt0 = ote__rdma_test_endpoints(target_.e);
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_segment_open(req_, addr_.c_str(), &seg), OTE_OK);
    WriteThenRead(seg, 11);
    EXPECT_GT(ote__rdma_test_endpoints(req_), req0);
    EXPECT_GT(ote__rdma_test_endpoints(target_.e), tgt0);
    // The requester goes away (its segment closed, its engine destroyed): the target's
    // source endpoints for it are evicted once they drained.
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(WaitFor([&] { return ote__rdma_test_endpoints(req_); }, req0,
                      "the requester's endpoints for the closed segment evicted"),
              req0);
    EXPECT_EQ(ote_memory_unregister(req_, src_.data()), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(req_, dst_.data()), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req_), OTE_OK);
    req_ = nullptr;
    EXPECT_EQ(WaitFor([&] { return ote__rdma_test_endpoints(target_.e); }, tgt0,
                      "the target's source endpoints for the gone requester evicted"),
              tgt0);

    // The target dies under an open segment: the requester's endpoints for it are evicted
    // without waiting for the segment's close.
    req_ = Engine("127.0.0.1:0");
    ASSERT_NE(req_, nullptr);
    ASSERT_EQ(ote_memory_register(req_, src_.data(), kLen, OTE_PERM_READ), OTE_OK);
    ASSERT_EQ(ote_memory_register(req_, dst_.data(), kLen, OTE_PERM_WRITE), OTE_OK);
    req0 = ote__rdma_test_endpoints(req_);
    ASSERT_EQ(ote_segment_open(req_, addr_.c_str(), &seg), OTE_OK);
    WriteThenRead(seg, 12);
    EXPECT_GT(ote__rdma_test_endpoints(req_), req0);
    target_.Stop();
    EXPECT_EQ(WaitFor([&] { return ote__rdma_test_endpoints(req_); }, req0,
                      "the requester's endpoints for the dead target evicted"),
              req0);
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    ASSERT_TRUE(target_.Start(addr_, 0x44));
}

// ---- raw control messages to the new incarnation ----------------------------------------

// RDMA control bodies (engine/rdma/proto.h), built by hand so that the test also checks
// the wire layout: INFO with or without the epoch, GRANT_REQ with the source's epoch.
std::vector<uint8_t> InfoBody(uint64_t epoch, bool with_epoch) {
    std::vector<uint8_t> b(with_epoch ? 4 + 24 + 4 + 32 + 8 : 4 + 24, 0);
    ote_le_put16(b.data(), 1);                         // INFO
    ote_le_put64(b.data() + 4, 0x1234567890abcdefull); // process
    ote_le_put64(b.data() + 12, 0x42);                 // pd
    ote_le_put32(b.data() + 20, 7);                    // nic
    ote_le_put32(b.data() + 24, 1);                    // lanes
    if (with_epoch) {
        ote_le_put32(b.data() + 28, 1); // ndev
        ote_le_put32(b.data() + 32, 7); // nics[0] == nic
        ote_le_put64(b.data() + 64, epoch);
    }
    return b;
}

// direct: asked on a direct slot, as a requester does of a source that grants host memory
// by exact MRs (rdma_grant_mr=1: op word flags DIRECT_OK | DIRECT, proto.h); a plain-slot
// request is redirected there before its QP is looked up.
std::vector<uint8_t> GrantBody(uint64_t src_epoch, uint64_t addr, bool direct = false) {
    std::vector<uint8_t> b(4 + 56 + 4 + 8, 0);
    ote_le_put16(b.data(), 5);                      // GRANT_REQ
    ote_le_put32(b.data() + 4, 0);                  // slot
    ote_le_put32(b.data() + 8, direct ? 0x301 : 1); // op WRITE (and the direct flags)
    ote_le_put32(b.data() + 12, 0x100);             // source qpn (of the old incarnation)
    ote_le_put32(b.data() + 16, 0x200);             // requester qpn
    ote_le_put64(b.data() + 20, addr);
    ote_le_put64(b.data() + 28, 4096);
    ote_le_put64(b.data() + 36, addr);
    ote_le_put64(b.data() + 44, 4096);
    ote_le_put64(b.data() + 52, 99); // req_uid
    ote_le_put32(b.data() + 60, 0);  // pair
    ote_le_put64(b.data() + 64, src_epoch);
    return b;
}

ote_ctl_msg_t RdmaMsg(uint16_t version, uint64_t req_id, const std::vector<uint8_t> &body) {
    ote_ctl_msg_t m;
    memset(&m, 0, sizeof(m));
    m.version = version;
    m.opcode = OTE_CTL_RDMA;
    m.req_id = req_id;
    m.u.rdma.body = body.data();
    m.u.rdma.len = (uint32_t)body.size();
    return m;
}

// HELLO as an RDMA control connection; returns the negotiated version (0 on failure)
// and, when info is not null, the source's advertisement.
uint16_t Hello(int fd, std::string *info = nullptr) {
    ote_ctl_msg_t h;
    memset(&h, 0, sizeof(h));
    h.version = OTE_CTL_VERSION_MIN;
    h.opcode = OTE_CTL_HELLO;
    h.u.hello.min_version = OTE_CTL_VERSION_MIN;
    h.u.hello.max_version = OTE_CTL_VERSION_MAX;
    h.u.hello.role = 2;
    static const char kSelf[] = "127.0.0.1:9";
    h.u.hello.addr = kSelf;
    h.u.hello.addr_len = sizeof(kSelf) - 1;
    ote_test::SendMsg(fd, h);
    std::vector<uint8_t> buf;
    ote_ctl_msg_t a;
    if (!ote_test::ReadFrame(fd, &buf, &a) || a.opcode != OTE_CTL_HELLO_ACK) return 0;
    if (info != nullptr) info->assign(a.u.hello_ack.info, a.u.hello_ack.info_len);
    return a.u.hello_ack.version;
}

TEST_F(RdmaRestartTest, OldEpochGrantRequestRefusedAndOldInfoServed) {
    // The first incarnation's epoch, as a requester learns it (INFO_ACK).
    auto epoch_of = [&](bool with_epoch, uint64_t *epoch_out, uint32_t *len_out) {
        int fd = ote_test::ConnectTo(addr_);
        ASSERT_GE(fd, 0);
        uint16_t v = Hello(fd);
        ASSERT_NE(v, 0);
        auto info = InfoBody(0x5555, with_epoch);
        ote_test::SendMsg(fd, RdmaMsg(v, 1, info));
        std::vector<uint8_t> buf;
        ote_ctl_msg_t a;
        ASSERT_TRUE(ote_test::ReadFrame(fd, &buf, &a));
        ASSERT_EQ(a.opcode, OTE_CTL_RDMA);
        EXPECT_EQ(a.status, OTE_OK);
        ASSERT_GE(a.u.rdma.len, 4u);
        EXPECT_EQ(ote_le_get16(a.u.rdma.body), 2); // INFO_ACK
        *len_out = a.u.rdma.len;
        *epoch_out = a.u.rdma.len >= 72 ? ote_le_get64(a.u.rdma.body + 64) : 0;
        close(fd);
    };
    uint64_t e1 = 0;
    uint32_t len = 0;
    epoch_of(true, &e1, &len);
    EXPECT_EQ(len, 72u) << "INFO_ACK without the epoch field";
    EXPECT_NE(e1, 0u);
    Restart(0x55);
    uint64_t e2 = 0;
    epoch_of(false, &e2, &len); // an older requester (no epoch in its INFO) is served
    EXPECT_NE(e2, 0u);
    EXPECT_NE(e2, e1) << "a new engine has a new epoch";

    // A GRANT_REQ for the old incarnation: refused (STATE: cache miss), nothing bound,
    // the connection and the engine serve on.
    int fd = ote_test::ConnectTo(addr_);
    ASSERT_GE(fd, 0);
    std::string adv;
    uint16_t v = Hello(fd, &adv);
    ASSERT_NE(v, 0);
    // A source without windows (the nomw profile) serves host memory only on direct
    // slots: asked there, the request reaches the QP check as on a plain slot elsewhere.
    bool direct = adv.find("rdma_grant_mr=1") != std::string::npos;
    auto info = InfoBody(0x6666, true);
    ote_test::SendMsg(fd, RdmaMsg(v, 1, info));
    std::vector<uint8_t> buf;
    ote_ctl_msg_t a;
    ASSERT_TRUE(ote_test::ReadFrame(fd, &buf, &a));
    for (uint64_t ep : {e1, e2 ^ 1}) {
        auto g = GrantBody(ep, target_.Addr(), direct);
        ote_test::SendMsg(fd, RdmaMsg(v, 77, g));
        ASSERT_TRUE(ote_test::ReadFrame(fd, &buf, &a));
        EXPECT_EQ(a.opcode, OTE_CTL_RDMA);
        EXPECT_EQ(a.req_id, 77u);
        EXPECT_EQ(ote_status_code(a.status), OTE_ERR_STATE) << ote_status_str(a.status);
    }
    // The right epoch but no such QP (the old incarnation's numbers): a cache miss too.
    auto g = GrantBody(e2, target_.Addr(), direct);
    ote_test::SendMsg(fd, RdmaMsg(v, 78, g));
    ASSERT_TRUE(ote_test::ReadFrame(fd, &buf, &a));
    EXPECT_EQ(ote_status_code(a.status), OTE_ERR_STATE) << ote_status_str(a.status);
    close(fd);
    for (size_t i = 0; i < kLen; i += 4096) ASSERT_EQ(target_.buf[i], 0x55);
    WriteThenReadOnNewSegment(13);
}

// CONNECT (engine/rdma/proto.h) with the epochs: the source's as the requester knows it
// and the requester's own, after pair: 64 bytes. A valid path (QP 0x100, MTU 1024).
std::vector<uint8_t> ConnectBody(uint64_t src_epoch, uint64_t req_epoch) {
    std::vector<uint8_t> b(4 + 8 + 32 + 4 + 16, 0);
    ote_le_put16(b.data(), 3);          // CONNECT
    ote_le_put32(b.data() + 4, 0);      // slot
    ote_le_put32(b.data() + 8, 1);      // cap WRITE
    ote_le_put32(b.data() + 32, 0x100); // path: gid 16 (zero), lid 4, then qpn
    ote_le_put32(b.data() + 40, 3);     // mtu IBV_MTU_1024
    ote_le_put32(b.data() + 44, 0);     // pair
    ote_le_put64(b.data() + 48, src_epoch);
    ote_le_put64(b.data() + 56, req_epoch);
    return b;
}

// A CONNECT for the old incarnation (the requester's stale view of a restarted source),
// or naming a requester epoch that is not the one its INFO gave (a stale requester), is
// refused (STATE: cache miss) before any QP is built; the source advertises that it
// takes the epoch form (rdma_connect_epoch=1), and the engine serves on.
TEST_F(RdmaRestartTest, StaleEpochConnectRefused) {
    auto info_ack_epoch = [&](int fd, uint16_t v, uint64_t my_epoch) -> uint64_t {
        auto info = InfoBody(my_epoch, true);
        ote_test::SendMsg(fd, RdmaMsg(v, 1, info));
        std::vector<uint8_t> buf;
        ote_ctl_msg_t a;
        if (!ote_test::ReadFrame(fd, &buf, &a) || a.u.rdma.len < 72) return 0;
        return ote_le_get64(a.u.rdma.body + 64);
    };
    int fd = ote_test::ConnectTo(addr_);
    ASSERT_GE(fd, 0);
    std::string adv;
    uint16_t v = Hello(fd, &adv);
    ASSERT_NE(v, 0);
    EXPECT_NE(adv.find("rdma_connect_epoch=1"), std::string::npos) << adv;
    uint64_t e1 = info_ack_epoch(fd, v, 0x7777);
    ASSERT_NE(e1, 0u);
    close(fd);
    Restart(0x77);
    fd = ote_test::ConnectTo(addr_);
    ASSERT_GE(fd, 0);
    v = Hello(fd);
    ASSERT_NE(v, 0);
    uint64_t e2 = info_ack_epoch(fd, v, 0x8888);
    ASSERT_NE(e2, 0u);
    ASSERT_NE(e2, e1);
    uint64_t eps0 = ote__rdma_test_endpoints(target_.e);
    std::vector<uint8_t> buf;
    ote_ctl_msg_t a;
    uint64_t id = 90;
    for (auto ep : {std::make_pair(e1, 0x8888ull), std::make_pair(e2 ^ 1, 0x8888ull),
                    std::make_pair(e2, 0x7777ull)}) {
        auto c = ConnectBody(ep.first, ep.second);
        ote_test::SendMsg(fd, RdmaMsg(v, ++id, c));
        ASSERT_TRUE(ote_test::ReadFrame(fd, &buf, &a));
        EXPECT_EQ(a.opcode, OTE_CTL_RDMA);
        EXPECT_EQ(a.req_id, id);
        EXPECT_EQ(ote_status_code(a.status), OTE_ERR_STATE) << ote_status_str(a.status);
        ASSERT_GE(a.u.rdma.len, 4u);
        EXPECT_EQ(ote_le_get16(a.u.rdma.body), 4); // CONNECT_ACK
    }
    EXPECT_EQ(ote__rdma_test_endpoints(target_.e), eps0) << "a refused CONNECT made an endpoint";
    close(fd);
    WriteThenReadOnNewSegment(22);
}

// The target as a separate process (ote_target) killed with SIGKILL and started again on
// the same port: the old segment fails PEER_LOST, a new one works on the first try, and
// the requester's endpoints for the dead process are evicted meanwhile.
TEST_F(RdmaRestartTest, KilledTargetProcessRestartedOnTheSamePort) {
    ote_test::Target t;
    ASSERT_TRUE(t.Start(kLen, "127.0.0.1:0", ote_test::kRdmaTargetEnv));
    const std::string taddr = t.address;
    uint64_t req0 = ote__rdma_test_endpoints(req_);
    ote_segment_t *old = nullptr;
    ASSERT_EQ(ote_segment_open(req_, taddr.c_str(), &old), OTE_OK);
    ote_pattern_fill(src_.data(), kLen, 20, 0);
    ASSERT_EQ(ote_test::RunOne(req_, {OTE_WRITE, src_.data(), old, t.rw, kLen}, 60 * kSec), OTE_OK);
    EXPECT_EQ(t.Hash("rw", 0, kLen), ote_hash(src_.data(), kLen));
    EXPECT_GT(ote__rdma_test_endpoints(req_), req0);
    t.Kill();
    EXPECT_EQ(WaitFor([&] { return ote__rdma_test_endpoints(req_); }, req0,
                      "the requester's endpoints for the killed target evicted"),
              req0);
    ASSERT_TRUE(t.Start(kLen, taddr, ote_test::kRdmaTargetEnv)) << "no target on " << taddr;
    ASSERT_EQ(t.address, taddr);
    ote_transfer_status_t ts;
    ote_status_t st =
        ote_test::RunOne(req_, {OTE_WRITE, src_.data(), old, t.rw, kLen}, 60 * kSec, &ts);
    EXPECT_EQ(ote_status_code(st), OTE_ERR_PEER_LOST) << ote_status_str(st);
    EXPECT_NE(t.Hash("rw", 0, kLen), ote_hash(src_.data(), kLen)) << "the old segment wrote";
    EXPECT_EQ(ote_segment_close(old), OTE_OK);
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_segment_open(req_, taddr.c_str(), &seg), OTE_OK);
    ote_pattern_fill(src_.data(), kLen, 21, 0);
    ASSERT_EQ(ote_test::RunOne(req_, {OTE_WRITE, src_.data(), seg, t.rw, kLen}, 60 * kSec), OTE_OK);
    EXPECT_EQ(t.Hash("rw", 0, kLen), ote_hash(src_.data(), kLen));
    memset(dst_.data(), 0, kLen);
    ASSERT_EQ(ote_test::RunOne(req_, {OTE_READ, dst_.data(), seg, t.rw, kLen}, 60 * kSec), OTE_OK);
    EXPECT_EQ(memcmp(dst_.data(), src_.data(), kLen), 0);
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(t.Quit(), 0);
}

// A source that has lost its endpoints for this requester answers its GRANT_REQ with a
// cache miss (the fault point stands in for it): the requester retires that slot's QP,
// rebuilds it and retries the run once, WRITE and READ alike (nothing was posted).
TEST_F(RdmaRestartTest, CacheMissIsRebuiltAndRetriedOnce) {
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_segment_open(req_, addr_.c_str(), &seg), OTE_OK);
    WriteThenRead(seg, 14);
    for (ote_opcode_t op : {OTE_WRITE, OTE_READ}) {
        ote_pattern_fill(src_.data(), kLen, op == OTE_WRITE ? 15 : 16, 0);
        if (op == OTE_READ) memcpy(target_.buf.data(), src_.data(), kLen);
        memset(dst_.data(), 0, kLen);
        ASSERT_EQ(ote_fault_arm("rdma.src_grant_miss", OTE_FAULT_NTH, 1, OTE_ERR_FAULT, 0), OTE_OK);
        ote_transfer_status_t ts;
        EXPECT_EQ(Run(seg, op, op == OTE_WRITE ? src_.data() : dst_.data(), kLen, &ts), OTE_OK);
        EXPECT_EQ(ts.state, OTE_TRANSFER_COMPLETED);
        EXPECT_EQ(ote_fault_failures("rdma.src_grant_miss"), 1u);
        EXPECT_GE(ote_fault_hits("rdma.src_grant_miss"), 2u) << "no second GRANT_REQ";
        ote_fault_disarm_all();
        EXPECT_EQ(memcmp(op == OTE_WRITE ? target_.buf.data() : dst_.data(), src_.data(), kLen), 0);
    }
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
}

// Misses on every try: the run is retried once only, then fails with OTE_ERR_PEER_LOST,
// and no byte of a WRITE lands; once the source answers again the segment works.
TEST_F(RdmaRestartTest, SecondCacheMissFailsPeerLostAndMovesNothing) {
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_segment_open(req_, addr_.c_str(), &seg), OTE_OK);
    WriteThenRead(seg, 17);
    ASSERT_NO_FATAL_FAILURE(WriteFailsPeerLostMovingNothing(&seg, "rdma.src_grant_miss", 18));
    WriteThenRead(seg, 19);
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
}

// A source whose CONNECT answer is a cache miss (the fault point stands in for a CONNECT
// meant for another incarnation): the requester's build fails, the run that waited for it
// goes back to the queue once, the QP is rebuilt and the request completes, WRITE and
// READ alike, on a segment whose first QPs are built under the fault.
TEST_F(RdmaRestartTest, ConnectCacheMissIsRebuiltAndRetriedOnce) {
    for (ote_opcode_t op : {OTE_WRITE, OTE_READ}) {
        ote_pattern_fill(src_.data(), kLen, op == OTE_WRITE ? 23 : 24, 0);
        if (op == OTE_READ) memcpy(target_.buf.data(), src_.data(), kLen);
        memset(dst_.data(), 0, kLen);
        ASSERT_EQ(ote_fault_arm("rdma.src_connect_miss", OTE_FAULT_NTH, 1, OTE_ERR_FAULT, 0),
                  OTE_OK);
        ote_segment_t *seg = nullptr;
        ASSERT_EQ(ote_segment_open(req_, addr_.c_str(), &seg), OTE_OK);
        ote_transfer_status_t ts;
        EXPECT_EQ(Run(seg, op, op == OTE_WRITE ? src_.data() : dst_.data(), kLen, &ts), OTE_OK);
        EXPECT_EQ(ts.state, OTE_TRANSFER_COMPLETED);
        EXPECT_EQ(ote_fault_failures("rdma.src_connect_miss"), 1u);
        EXPECT_GE(ote_fault_hits("rdma.src_connect_miss"), 2u) << "no second CONNECT";
        ote_fault_disarm_all();
        EXPECT_EQ(memcmp(op == OTE_WRITE ? target_.buf.data() : dst_.data(), src_.data(), kLen), 0);
        EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    }
}

// Every CONNECT misses: the run is retried once only, then fails with OTE_ERR_PEER_LOST
// and no byte of the WRITE lands; once the source answers again the segment works.
TEST_F(RdmaRestartTest, SecondConnectCacheMissFailsPeerLostAndMovesNothing) {
    ote_segment_t *seg = nullptr;
    ASSERT_NO_FATAL_FAILURE(WriteFailsPeerLostMovingNothing(&seg, "rdma.src_connect_miss", 25));
    WriteThenRead(seg, 26);
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
}

} // namespace

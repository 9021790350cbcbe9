// Whole-parent reservations at an RDMA source (engine/rdma/rdma_src_parents.h), the paths
// an engine-to-engine transfer does not reach, driven by raw control-plane peers of a real
// engine (verbs/sim):
// - a raw requester (HELLO, INFO with an epoch, CONNECT with a made-up path, GRANT_REQ in
//   the 88-byte parent form, RELEASE, EP_RESET) against a real source:
//   EP_RESET of the endpoint a parent holds slots on returns its reservation and the next
//   grant is served; a parent with no live grant and no GRANT_REQ for transfer_timeout_ms
//   + 1 s is ended by the next parent's first grant; a GRANT_REQ naming another budget
//   than its parent's first is refused (REMOTE_ACCESS on the wire) and leaks nothing;
//   engine destroy with a reservation and its grant live returns them (LSan under asan);
// - a fake source against a real requester with rdma_max_grants: without rdma_parent=1 in
//   its advertisement it gets the per-grant form (76 bytes), with it the 88-byte form.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/engine/ctl_peer.h"
#include "tests/engine/engine_util.h"
#include "tests/util/wait.h"

extern "C" {
#include "base/time.h"
#include "engine/control/ctl.h"
#include "engine/rdma/test_hook.h"
#include "ote/ote.h"
}

namespace {

constexpr uint64_t kSec = 1000000000ull;
constexpr uint64_t kLen = 4096;

std::vector<uint8_t> Frame(uint64_t req_id, ote_status_t st, const std::vector<uint8_t> &body) {
    ote_ctl_msg_t m = {};
    m.version = 1;
    m.opcode = OTE_CTL_RDMA;
    m.req_id = req_id;
    m.status = st;
    m.u.rdma.body = body.data();
    m.u.rdma.len = (uint32_t)body.size();
    return ote_test::Encode(m);
}

template <typename T>
void Put(std::vector<uint8_t> *b, size_t at, T v) {
    memcpy(b->data() + at, &v, sizeof(v));
}

uint16_t TypeOf(const ote_ctl_msg_t &m) {
    return m.u.rdma.len >= 2 ? (uint16_t)(m.u.rdma.body[0] | (m.u.rdma.body[1] << 8)) : 0;
}

// INFO / INFO_ACK with one device and an epoch (proto.h: 72 bytes).
std::vector<uint8_t> InfoBody(uint16_t type, uint64_t epoch) {
    std::vector<uint8_t> b(72, 0);
    b[0] = (uint8_t)type;
    Put<uint64_t>(&b, 4, 0x1234);
    Put<uint64_t>(&b, 12, 0x5678);
    Put<uint32_t>(&b, 20, 1); // nic
    Put<uint32_t>(&b, 24, 1); // lanes
    Put<uint32_t>(&b, 28, 1); // ndev
    Put<uint32_t>(&b, 32, 1); // nics[0]
    Put<uint64_t>(&b, 64, epoch);
    return b;
}

ote__rdma_test_grants_t Grants(ote_engine_t *e) {
    ote__rdma_test_grants_t g;
    memset(&g, 0, sizeof(g));
    EXPECT_EQ(ote__rdma_test_grants(ote_test::EngineAddress(e).c_str(), &g), OTE_OK);
    return g;
}

// Waits (generously) until pred(Grants(e)) holds; false (and a failure naming what) when
// it never did.
template <typename P>
bool WaitFor(ote_engine_t *e, P pred, const std::string &what) {
    return ote_test::WaitUntil([&] { return pred(Grants(e)); }, std::chrono::seconds(30), what);
}

bool NoReservation(const ote__rdma_test_grants_t &g) {
    return g.sp_parents == 0 && g.sp_credits == 0 && g.sp_rq == 0;
}

// Until the source holds no parent reservation and no live grant (after `why`).
bool WaitNothingHeld(ote_engine_t *e, const std::string &why) {
    return WaitFor(
        e, [](const ote__rdma_test_grants_t &x) { return NoReservation(x) && x.live_source == 0; },
        "no reservation and no live grant: " + why);
}

// A raw requester of a real source engine: its control connection, one WRITE QP (slot 0,
// pair 0) connected to a made-up path (nothing is ever posted on it), and GRANT_REQs over
// the source's registered memory.
class RawRequester {
  public:
    explicit RawRequester(const char *timeout_ms = "20000")
        : e_(ote_test::RdmaEngine(timeout_ms)), mem_(4 * kLen, 0) {}
    ~RawRequester() {
        if (fd_ >= 0) close(fd_);
        if (e_ != nullptr) {
            EXPECT_EQ(ote_engine_destroy(e_), OTE_OK);
        }
    }
    // HELLO, INFO (the source's epoch learned from its INFO_ACK), CONNECT.
    void Open() {
        ASSERT_NE(e_, nullptr);
        ASSERT_EQ(ote_memory_register(e_, mem_.data(), mem_.size(), OTE_PERM_READ | OTE_PERM_WRITE),
                  OTE_OK);
        fd_ = ote_test::ConnectTo(ote_test::EngineAddress(e_));
        ASSERT_GE(fd_, 0);
        static const char kAddr[] = "127.0.0.1:1";
        ote_ctl_msg_t h = {};
        h.version = 1;
        h.opcode = OTE_CTL_HELLO;
        h.u.hello.min_version = 1;
        h.u.hello.max_version = 1;
        h.u.hello.role = 2;
        h.u.hello.addr = kAddr;
        h.u.hello.addr_len = sizeof(kAddr) - 1;
        ASSERT_TRUE(ote_test::SendAll(fd_, ote_test::Encode(h)));
        ASSERT_TRUE(ote_test::ReadFrame(fd_, &buf_, &m_));
        ASSERT_EQ(m_.opcode, OTE_CTL_HELLO_ACK);
        ASSERT_TRUE(ote_test::SendAll(fd_, Frame(1, OTE_OK, InfoBody(1, 0x77))));
        ASSERT_TRUE(ote_test::ReadFrame(fd_, &buf_, &m_));
        ASSERT_EQ(TypeOf(m_), 2u);
        ASSERT_EQ(m_.u.rdma.len, 72u) << "the source's INFO_ACK carries no epoch";
        memcpy(&epoch_, m_.u.rdma.body + 64, 8);
        Connect(0x4321);
    }
    // CONNECT of slot 0 for WRITE from our (made-up) QP qpn: the source's QP number kept.
    void Connect(uint32_t qpn) {
        qpn_ = qpn;
        std::vector<uint8_t> conn(44, 0);
        conn[0] = 3; // CONNECT, short form: slot 0, cap 1 (WRITE), our path
        Put<uint32_t>(&conn, 8, 1);
        conn[12 + 15] = 1;
        Put<uint32_t>(&conn, 32, qpn);
        Put<uint32_t>(&conn, 36, 1);
        Put<uint32_t>(&conn, 40, 3); // IBV_MTU_1024
        ASSERT_TRUE(ote_test::SendAll(fd_, Frame(++next_id_, OTE_OK, conn)));
        ASSERT_TRUE(ote_test::ReadFrame(fd_, &buf_, &m_));
        ASSERT_EQ(ote_status_code(m_.status), OTE_OK) << ote_status_str(m_.status);
        ASSERT_EQ(TypeOf(m_), 4u);
        ASSERT_EQ(m_.u.rdma.len, 36u);
        memcpy(&src_qpn_, m_.u.rdma.body + 24, 4);
    }
    // A WRITE GRANT_REQ of kLen bytes at block `at` of a request of `blocks` blocks from
    // block 0 (uid), naming parent and budget; returns its answer's status, the rkey of
    // an OK one to *rkey.
    ote_status_t Grant(uint64_t uid, uint32_t at, uint32_t blocks, uint64_t parent, uint32_t budget,
                       uint32_t *rkey = nullptr) {
        std::vector<uint8_t> g(88, 0);
        g[0] = 5;
        uint64_t base = (uint64_t)(uintptr_t)mem_.data();
        Put<uint32_t>(&g, 4, 0); // slot
        Put<uint32_t>(&g, 8, 1); // op: WRITE
        Put<uint32_t>(&g, 12, src_qpn_);
        Put<uint32_t>(&g, 16, qpn_);
        Put<uint64_t>(&g, 20, base + at * kLen);
        Put<uint64_t>(&g, 28, kLen);
        Put<uint64_t>(&g, 36, base);
        Put<uint64_t>(&g, 44, blocks * kLen);
        Put<uint64_t>(&g, 52, uid);
        Put<uint32_t>(&g, 60, 0); // pair
        Put<uint64_t>(&g, 64, epoch_);
        Put<uint32_t>(&g, 72, 0); // flags
        Put<uint64_t>(&g, 76, parent);
        Put<uint32_t>(&g, 84, budget);
        uint64_t id = ++next_id_;
        EXPECT_TRUE(ote_test::SendAll(fd_, Frame(id, OTE_OK, g)));
        if (!ote_test::ReadFrame(fd_, &buf_, &m_)) {
            ADD_FAILURE() << "no GRANT_RESP";
            return OTE_ERR_TIMEOUT;
        }
        EXPECT_EQ(m_.req_id, id);
        EXPECT_EQ(TypeOf(m_), 6u);
        if (rkey != nullptr && m_.u.rdma.len >= 8) memcpy(rkey, m_.u.rdma.body + 4, 4);
        return m_.status;
    }
    void Send(const std::vector<uint8_t> &body) {
        EXPECT_TRUE(ote_test::SendAll(fd_, Frame(0, OTE_OK, body)));
    }
    // RELEASE of the WRITE grant with rkey on slot 0 (no answer).
    void Release(uint32_t rkey) {
        std::vector<uint8_t> r(24, 0);
        r[0] = 9;
        Put<uint32_t>(&r, 8, 1);
        Put<uint32_t>(&r, 16, src_qpn_);
        Put<uint32_t>(&r, 20, rkey);
        Send(r);
    }
    void CloseConn() {
        if (fd_ >= 0) close(fd_);
        fd_ = -1;
    }
    ote_engine_t *e_;
    std::vector<uint8_t> mem_;

  private:
    int fd_ = -1;
    uint32_t qpn_ = 0;
    uint64_t epoch_ = 0, next_id_ = 10;
    uint32_t src_qpn_ = 0;
    std::vector<uint8_t> buf_;
    ote_ctl_msg_t m_;
};

// 1. EP_RESET of the endpoint a parent holds slots on returns the parent's reservation
// (its request's account is still open: only the reset can have returned it), its live
// grant ends, and the next parent's grant is served.
TEST(RdmaSrcParentsTest, EpResetReturnsTheParentsReservation) {
    RawRequester rq;
    rq.Open();
    ASSERT_EQ(rq.Grant(9, 0, 4, 7, 4), OTE_OK);
    ote__rdma_test_grants_t g = Grants(rq.e_);
    EXPECT_EQ(g.sp_parents, 1u);
    EXPECT_EQ(g.sp_credits, 4u);
    EXPECT_EQ(g.sp_rq, 4u);
    EXPECT_EQ(g.live_source, 1u);
    std::vector<uint8_t> reset(8, 0);
    reset[0] = 8; // EP_RESET, pair 0
    rq.Send(reset);
    EXPECT_TRUE(WaitNothingHeld(rq.e_, "EP_RESET"));
    g = Grants(rq.e_);
    EXPECT_EQ(g.sp_parents, 0u);
    EXPECT_EQ(g.sp_credits, 0u);
    EXPECT_EQ(g.sp_rq, 0u);
    EXPECT_GE(g.sp_ended, 1u);
    // As a requester whose device came back: a new QP (CONNECT), then the next parent.
    rq.Connect(0x4322);
    EXPECT_EQ(rq.Grant(10, 0, 4, 8, 4), OTE_OK) << "the next parent after EP_RESET";
    g = Grants(rq.e_);
    EXPECT_EQ(g.sp_parents, 1u);
    EXPECT_EQ(g.sp_rq, 4u);
    rq.CloseConn();
    EXPECT_TRUE(WaitNothingHeld(rq.e_, "the connection closed"));
}

// 2. A parent whose requester went quiet (its grant released, the rest of its request
// never asked for nor written off) is ended by the source's idle deadline
// (transfer_timeout_ms + 1 s without a live grant or GRANT_REQ) at the next parent's
// first grant.
TEST(RdmaSrcParentsTest, IdleParentIsEndedAtTheNextParentsFirstGrant) {
    RawRequester rq("100"); // the idle deadline: 1.1 s (slept past with 1 s to spare)
    rq.Open();
    uint32_t rkey = 0;
    ASSERT_EQ(rq.Grant(9, 0, 4, 7, 4, &rkey), OTE_OK);
    rq.Release(rkey); // (or it ends at its own deadline, 1.1 s)
    EXPECT_TRUE(WaitFor(
        rq.e_, [](const ote__rdma_test_grants_t &x) { return x.live_source == 0; },
        "the released grant to end"));
    ote__rdma_test_grants_t g = Grants(rq.e_);
    EXPECT_EQ(g.sp_parents, 1u) << "the parent ended before its idle deadline";
    EXPECT_EQ(g.sp_ended, 0u);
    // Past the idle deadline (a lower bound: the sleep may only be longer).
    std::this_thread::sleep_for(std::chrono::milliseconds(2100));
    ASSERT_EQ(rq.Grant(10, 0, 4, 8, 4), OTE_OK);
    g = Grants(rq.e_);
    EXPECT_EQ(g.sp_ended, 1u) << "the idle parent was not ended";
    EXPECT_EQ(g.sp_parents, 1u);
    EXPECT_EQ(g.sp_credits, 4u);
    EXPECT_EQ(g.sp_rq, 4u);
    rq.CloseConn();
    EXPECT_TRUE(WaitNothingHeld(rq.e_, "the connection closed"));
}

// 3. A GRANT_REQ naming another budget than its parent's first is refused (OTE_ERR_INVALID
// at the source, REMOTE_ACCESS on the wire), takes nothing, and the parent and its first
// grant are untouched; everything is returned with the connection and the memory
// unregisters.
TEST(RdmaSrcParentsTest, AnotherBudgetThanTheParentsFirstIsRefused) {
    RawRequester rq;
    rq.Open();
    ASSERT_EQ(rq.Grant(9, 0, 2, 7, 4), OTE_OK);
    EXPECT_EQ(ote_status_code(rq.Grant(9, 1, 2, 7, 3)), OTE_ERR_REMOTE_ACCESS);
    ote__rdma_test_grants_t g = Grants(rq.e_);
    EXPECT_EQ(g.sp_bad, 1u);
    EXPECT_EQ(g.sp_parents, 1u);
    EXPECT_EQ(g.sp_credits, 4u);
    EXPECT_EQ(g.sp_rq, 4u);
    EXPECT_EQ(g.sp_served, 1u);
    EXPECT_EQ(g.live_source, 1u);
    rq.CloseConn();
    EXPECT_TRUE(WaitNothingHeld(rq.e_, "the connection closed"));
    EXPECT_EQ(ote_test::UnregisterWhenFree(rq.e_, rq.mem_.data()), OTE_OK);
}

// 5. Engine destroy with a parent's reservation and its grant live (the requester's
// connection still open) returns them: destroy succeeds, and LSan (asan) finds no leak.
TEST(RdmaSrcParentsTest, DestroyWithALiveReservationReturnsIt) {
    RawRequester rq("300"); // destroy ends the live grant at once
    rq.Open();
    ASSERT_EQ(rq.Grant(9, 0, 4, 7, 4), OTE_OK);
    ASSERT_EQ(rq.Grant(12, 0, 1, 8, 2), OTE_OK);
    EXPECT_EQ(Grants(rq.e_).sp_parents, 2u);
    EXPECT_EQ(ote_engine_destroy(rq.e_), OTE_OK);
    rq.e_ = nullptr;
}

// 4. A requester with rdma_max_grants and a source that does not advertise rdma_parent=1
// (a fake source): its GRANT_REQ is the per-grant form (with epoch and flags: 76 bytes);
// the same source advertising rdma_parent=1 gets the 88-byte form.
size_t GrantFormSentTo(const std::string &info) {
    std::string addr;
    int lfd = ote_test::ListenLoopback(16, &addr);
    EXPECT_GE(lfd, 0);
    ote_engine_t *e = ote_test::NewEngine({{"transport", "rdma"},
                                           {"verbs_provider", "sim"},
                                           {"rdma_devices", "sim0"},
                                           {"rdma_max_grants", "4"},
                                           {"transfer_timeout_ms", "20000"}});
    EXPECT_NE(e, nullptr);
    if (e == nullptr || lfd < 0) return 0;
    size_t len = 0;
    std::atomic<ote_status_t> open_st{OTE_ERR_STATE};
    ote_segment_t *seg = nullptr;
    std::thread opener([&] { open_st = ote_segment_open(e, addr.c_str(), &seg); });
    std::vector<uint8_t> buf;
    ote_ctl_msg_t m;
    int fd = -1;
    // The router's advertisement connection (answered, closed), then the transport's.
    for (int i = 0; i < 4 && fd < 0; i++) {
        int c = ote_test::AcceptWithin(lfd, 10000);
        if (c < 0) break;
        if (!ote_test::ReadFrame(c, &buf, &m) || m.opcode != OTE_CTL_HELLO) {
            close(c);
            break;
        }
        ote_ctl_msg_t a{};
        a.version = 1;
        a.opcode = OTE_CTL_HELLO_ACK;
        a.req_id = m.req_id;
        a.u.hello_ack.version = 1;
        a.u.hello_ack.max_data = OTE_CTL_MAX_DATA;
        a.u.hello_ack.addr = addr.c_str();
        a.u.hello_ack.addr_len = (uint32_t)addr.size();
        a.u.hello_ack.info = info.c_str();
        a.u.hello_ack.info_len = (uint16_t)info.size();
        bool sent = ote_test::SendAll(c, ote_test::Encode(a));
        if (sent && m.u.hello.role != OTE_CTL_ROLE_INFO) fd = c;
        else close(c);
    }
    EXPECT_GE(fd, 0);
    if (fd >= 0 && ote_test::ReadFrame(fd, &buf, &m) && TypeOf(m) == 1) { // INFO
        EXPECT_TRUE(ote_test::SendAll(fd, Frame(m.req_id, OTE_OK, InfoBody(2, 0x99))));
    }
    opener.join();
    EXPECT_EQ(open_st.load(), OTE_OK);
    if (open_st.load() == OTE_OK) {
        std::vector<uint8_t> data(kLen, 7);
        EXPECT_EQ(ote_memory_register(e, data.data(), data.size(), OTE_PERM_READ), OTE_OK);
        ote_batch_t *b = nullptr;
        EXPECT_EQ(ote_batch_create(e, 1, &b), OTE_OK);
        ote_request_t r = {OTE_WRITE, data.data(), seg, 0x100000, data.size()};
        std::atomic<ote_status_t> sub_st{OTE_ERR_STATE};
        std::thread submitter([&] { sub_st = ote_batch_submit(b, &r, 1); });
        // CONNECT (answered with a made-up path), then the GRANT_REQ (refused ACCESS).
        while (len == 0 && ote_test::ReadFrame(fd, &buf, &m)) {
            if (m.opcode != OTE_CTL_RDMA) break;
            if (TypeOf(m) == 3) {
                std::vector<uint8_t> ack(36, 0);
                ack[0] = 4;
                ack[4 + 15] = 1;
                Put<uint32_t>(&ack, 24, 0x4321);
                Put<uint32_t>(&ack, 28, 1);
                Put<uint32_t>(&ack, 32, 3);
                EXPECT_TRUE(ote_test::SendAll(fd, Frame(m.req_id, OTE_OK, ack)));
            } else if (TypeOf(m) == 5) {
                len = m.u.rdma.len;
                std::vector<uint8_t> resp(8, 0);
                resp[0] = 6;
                EXPECT_TRUE(ote_test::SendAll(fd, Frame(m.req_id, OTE_ERR_ACCESS, resp)));
            } else {
                break;
            }
        }
        submitter.join();
        EXPECT_EQ(sub_st.load(), OTE_OK);
        (void)ote_batch_wait(b, ote_deadline_after(30 * kSec));
        ote_transfer_status_t ts{};
        EXPECT_EQ(ote_batch_status(b, 0, &ts), OTE_OK);
        EXPECT_EQ(ts.state, OTE_TRANSFER_FAILED) << ote_status_str(ts.error);
        EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
        EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    }
    if (fd >= 0) close(fd);
    close(lfd);
    EXPECT_EQ(ote_engine_destroy(e), OTE_OK);
    return len;
}

TEST(RdmaSrcParentsTest, NoParentTrailerToASourceWithoutTheAdvertisement) {
    EXPECT_EQ(GrantFormSentTo("transports=rdma;rdma_release=1;rdma_stage=1"), 76u);
    EXPECT_EQ(GrantFormSentTo("transports=rdma;rdma_release=1;rdma_stage=1;rdma_parent=1"), 88u);
}

} // namespace

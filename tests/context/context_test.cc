// Unit tests of context/ over the software provider: device opening with stable NIC
// ids, GID auto-selection and strict pins, port-state tracking from async events, and
// the buffer manager's publication in every usable context (host and dma-buf MRs).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "tests/util/test_base.h"
#include "tests/util/wait.h"

extern "C" {
#include "base/status.h"
#include "base/time.h"
#include "context/buffers.h"
#include "context/context.h"
#include "verbs/sim/sim.h"
#include "verbs/verbs.h"
}

namespace {

using ote_test::OteTest;

class ContextTest : public OteTest {
  protected:
    void SetUp() override {
        OteTest::SetUp();
        ASSERT_EQ(ote_verbs_open("sim", nullptr, &v_), OTE_OK);
    }
    void TearDown() override {
        if (set_ != nullptr) {
            EXPECT_EQ(ote_context_set_close(set_), OTE_OK);
        }
        if (v_ != nullptr) ote_verbs_close(v_);
        OteTest::TearDown();
    }
    void OpenWith(const char *config) {
        if (v_ != nullptr) ote_verbs_close(v_);
        v_ = nullptr;
        ASSERT_EQ(ote_verbs_open("sim", config, &v_), OTE_OK);
    }
    // Poll events until ctx reaches `want` or 30 s pass.
    bool WaitState(ote_context_t *ctx, ote_context_state_t want) {
        return ote_test::WaitUntil(
            [&] {
                EXPECT_EQ(ote_context_set_poll_events(set_, nullptr), OTE_OK);
                return ote_context_state(ctx) == want;
            },
            std::chrono::seconds(30), "context state " + std::to_string(want));
    }
    ote_verbs_t *v_ = nullptr;
    ote_context_set_t *set_ = nullptr;
};

TEST_F(ContextTest, OpensEveryDeviceWithStableIdsAndRoutableRoceV2Gid) {
    ASSERT_EQ(ote_context_set_open(v_, nullptr, &set_), OTE_OK);
    ASSERT_EQ(ote_context_set_count(set_), 2u);
    for (uint32_t i = 0; i < 2; i++) {
        ote_context_t *ctx = ote_context_set_get(set_, i);
        ASSERT_NE(ctx, nullptr);
        ote_context_info_t info;
        ote_context_get_info(ctx, &info);
        EXPECT_EQ(info.nic_id, i);
        EXPECT_EQ(std::string(info.name), "sim" + std::to_string(i));
        EXPECT_EQ(info.port, 1);
        // Default table: ll/v1, ll/v2, v4/v1, v4/v2: the IPv4-mapped RoCE v2 entry wins.
        EXPECT_EQ(info.gid_index, 3);
        EXPECT_EQ(info.gid_type, (uint32_t)IBV_GID_TYPE_ROCE_V2);
        EXPECT_EQ(info.gid.raw[10], 0xff);
        EXPECT_EQ(info.gid.raw[11], 0xff);
        EXPECT_EQ(info.pinned, 0);
        EXPECT_EQ(info.numa_node, (int)i);
        EXPECT_EQ(info.state, OTE_CONTEXT_ACTIVE);
        EXPECT_NE(ote_context_pd(ctx), nullptr);
        EXPECT_EQ(ote_context_check(ctx), OTE_OK);
        EXPECT_EQ(ote_context_set_find(set_, i), ctx);
    }
    EXPECT_EQ(ote_context_set_find(set_, 7), nullptr);
}

TEST_F(ContextTest, DeviceListKeepsStableNicIds) {
    const char *devs[] = {"sim1"};
    ote_context_config_t cfg = {};
    cfg.devices = devs;
    cfg.num_devices = 1;
    ASSERT_EQ(ote_context_set_open(v_, &cfg, &set_), OTE_OK);
    ASSERT_EQ(ote_context_set_count(set_), 1u);
    EXPECT_EQ(ote_context_nic_id(ote_context_set_get(set_, 0)), 1u);
    EXPECT_STREQ(ote_context_name(ote_context_set_get(set_, 0)), "sim1");
}

TEST_F(ContextTest, UnknownDeviceFailsNamingIt) {
    const char *devs[] = {"mlx5_9"};
    ote_context_config_t cfg = {};
    cfg.devices = devs;
    cfg.num_devices = 1;
    ExpectErrorLogsIn([&] { EXPECT_EQ(ote_context_set_open(v_, &cfg, &set_), OTE_ERR_NO_DEVICE); });
    EXPECT_EQ(set_, nullptr);
    EXPECT_TRUE(LogContains("mlx5_9"));
}

TEST_F(ContextTest, RankPrefersRoceV2ThenIpv4MappedThenGlobalAndSkipsZero) {
    std::vector<ibv_gid_entry> t(5);
    memset(t.data(), 0, t.size() * sizeof(t[0]));
    for (uint32_t i = 0; i < t.size(); i++) t[i].gid_index = i;
    // 0: zero (hole). 1: link-local v2. 2: IPv4-mapped v1. 3: global v1. 4: zero.
    t[1].gid.raw[0] = 0xfe;
    t[1].gid.raw[1] = 0x80;
    t[1].gid.raw[15] = 1;
    t[1].gid_type = IBV_GID_TYPE_ROCE_V2;
    t[2].gid.raw[10] = t[2].gid.raw[11] = 0xff;
    t[2].gid.raw[12] = 10;
    t[2].gid_type = IBV_GID_TYPE_ROCE_V1;
    t[3].gid.raw[0] = 0xfd;
    t[3].gid.raw[15] = 2;
    t[3].gid_type = IBV_GID_TYPE_ROCE_V1;
    // v2 beats v1 even when link-local.
    EXPECT_EQ(ote_context_rank_gids(t.data(), t.size()), 1);
    // Among v1 entries IPv4-mapped beats global, global beats link-local.
    t[1].gid_type = IBV_GID_TYPE_ROCE_V1;
    EXPECT_EQ(ote_context_rank_gids(t.data(), t.size()), 2);
    memset(&t[2].gid, 0, sizeof(t[2].gid));
    EXPECT_EQ(ote_context_rank_gids(t.data(), t.size()), 3);
    memset(&t[3].gid, 0, sizeof(t[3].gid));
    EXPECT_EQ(ote_context_rank_gids(t.data(), t.size()), 1);
    memset(&t[1].gid, 0, sizeof(t[1].gid));
    EXPECT_EQ(ote_context_rank_gids(t.data(), t.size()), -1);
}

TEST_F(ContextTest, PinIsHonouredExactly) {
    ote_context_pin_t pin = {"sim0", 1, 0}; // link-local v1: never auto-selected
    ote_context_config_t cfg = {};
    cfg.pins = &pin;
    cfg.num_pins = 1;
    const char *devs[] = {"sim0"};
    cfg.devices = devs;
    cfg.num_devices = 1;
    ASSERT_EQ(ote_context_set_open(v_, &cfg, &set_), OTE_OK);
    ote_context_info_t info;
    ote_context_get_info(ote_context_set_get(set_, 0), &info);
    EXPECT_EQ(info.gid_index, 0);
    EXPECT_EQ(info.pinned, 1);
    EXPECT_EQ(info.gid.raw[0], 0xfe);
}

TEST_F(ContextTest, PinThatDoesNotMatchFailsNamingDevicePortAndIndex) {
    struct Case {
        ote_context_pin_t pin;
        const char *needle;
    } cases[] = {
        {{"sim1", 1, 9}, "device sim1 port 1 GID index 9"},     // empty slot
        {{"sim1", 1, 500}, "device sim1 port 1 GID index 500"}, // beyond the table
        {{"sim0", 3, 1}, "device sim0 port 3 GID index 1"},     // no such port
    };
    for (auto &c : cases) {
        ote_context_config_t cfg = {};
        cfg.pins = &c.pin;
        cfg.num_pins = 1;
        ote_context_set_t *set = nullptr;
        ote_status_t st = OTE_OK;
        ExpectErrorLogsIn([&] { st = ote_context_set_open(v_, &cfg, &set); });
        EXPECT_NE(st, OTE_OK) << c.needle;
        EXPECT_EQ(set, nullptr);
        EXPECT_TRUE(LogContains(c.needle)) << c.needle;
    }
    ote_context_pin_t ghost = {"sim7", 1, 0};
    ote_context_config_t cfg = {};
    cfg.pins = &ghost;
    cfg.num_pins = 1;
    ExpectErrorLogsIn([&] { EXPECT_EQ(ote_context_set_open(v_, &cfg, &set_), OTE_ERR_NO_DEVICE); });
    EXPECT_TRUE(LogContains("sim7"));
}

TEST_F(ContextTest, DownPortStartsPausedAndDeviceWithoutGidIsSkipped) {
    OpenWith("dev=a;port,state=down;gid=auto-v4,type=v2;dev=b;port;dev=c;port;gid=auto-ll,type=v2");
    ASSERT_EQ(ote_context_set_open(v_, nullptr, &set_), OTE_OK);
    ASSERT_EQ(ote_context_set_count(set_), 2u); // b has no GID at all
    ote_context_t *a = ote_context_set_get(set_, 0);
    ote_context_t *c = ote_context_set_get(set_, 1);
    EXPECT_STREQ(ote_context_name(a), "a");
    EXPECT_EQ(ote_context_nic_id(c), 2u); // stable: b keeps id 1 though skipped
    EXPECT_EQ(ote_context_check(a), OTE_ERR_PORT_DOWN);
    EXPECT_NE(ote_context_pd(a), nullptr); // paused contexts keep their PD
    EXPECT_EQ(ote_context_check(c), OTE_OK);
    // Only a link-local GID on c: still used, it is the best there is.
    ote_context_info_t info;
    ote_context_get_info(c, &info);
    EXPECT_EQ(info.gid.raw[0], 0xfe);
    EXPECT_TRUE(LogContains("device b"));
}

TEST_F(ContextTest, NoUsableDeviceFailsClearly) {
    OpenWith("dev=lonely;port");
    ExpectErrorLogsIn(
        [&] { EXPECT_EQ(ote_context_set_open(v_, nullptr, &set_), OTE_ERR_NO_DEVICE); });
    EXPECT_TRUE(LogContains("no usable RDMA device"));
}

struct Seen {
    std::vector<ibv_event_type> events;
    static void Fn(void *arg, ote_context_t *, const ibv_async_event *ev) {
        static_cast<Seen *>(arg)->events.push_back(ev->event_type);
    }
};

TEST_F(ContextTest, PortDownPausesAndPortActiveResumesWithNewGeneration) {
    ASSERT_EQ(ote_context_set_open(v_, nullptr, &set_), OTE_OK);
    ote_context_t *ctx = ote_context_set_get(set_, 0);
    Seen seen;
    uint64_t id = 0;
    ASSERT_EQ(ote_context_set_add_listener(set_, &Seen::Fn, &seen, &id), OTE_OK);
    ote_context_info_t before;
    ote_context_get_info(ctx, &before);

    ASSERT_EQ(ote_sim_set_port_state(v_, "sim0", 1, IBV_PORT_DOWN), OTE_OK);
    ASSERT_TRUE(WaitState(ctx, OTE_CONTEXT_PAUSED));
    EXPECT_EQ(ote_context_check(ctx), OTE_ERR_PORT_DOWN);
    EXPECT_EQ(ote_context_check(ote_context_set_get(set_, 1)), OTE_OK); // other NIC unaffected
    ote_context_info_t paused;
    ote_context_get_info(ctx, &paused);
    EXPECT_GT(paused.route_generation, before.route_generation);
    EXPECT_NE(ote_context_pd(ctx), nullptr);

    ASSERT_EQ(ote_sim_set_port_state(v_, "sim0", 1, IBV_PORT_ACTIVE), OTE_OK);
    ASSERT_TRUE(WaitState(ctx, OTE_CONTEXT_ACTIVE));
    ote_context_info_t after;
    ote_context_get_info(ctx, &after);
    EXPECT_GT(after.route_generation, paused.route_generation);
    EXPECT_EQ(after.gid_index, before.gid_index);
    ote_context_set_remove_listener(set_, id);
    ASSERT_GE(seen.events.size(), 2u);
    EXPECT_EQ(seen.events[0], IBV_EVENT_PORT_ERR);
}

TEST_F(ContextTest, GidChangeReselectsAutomaticallyButKeepsPinStrict) {
    ote_context_pin_t pin = {"sim1", 1, 3};
    ote_context_config_t cfg = {};
    cfg.pins = &pin;
    cfg.num_pins = 1;
    ASSERT_EQ(ote_context_set_open(v_, &cfg, &set_), OTE_OK);
    ote_context_t *autoc = ote_context_set_get(set_, 0);
    ote_context_t *pinned = ote_context_set_get(set_, 1);
    // Delete index 3 on both: automatic falls back to the IPv4-mapped v1 entry (2)...
    ASSERT_EQ(ote_sim_set_gid(v_, "sim0", 1, 3, nullptr, IBV_GID_TYPE_ROCE_V2), OTE_OK);
    ASSERT_EQ(ote_sim_set_gid(v_, "sim1", 1, 3, nullptr, IBV_GID_TYPE_ROCE_V2), OTE_OK);
    ote_context_info_t info;
    {
        ote_test::ErrorLogsExpected guard; // the vanished pinned GID is reported
        ote_test::WaitUntil(
            [&] {
                EXPECT_EQ(ote_context_set_poll_events(set_, nullptr), OTE_OK);
                ote_context_get_info(autoc, &info);
                return info.gid_index != 3;
            },
            std::chrono::seconds(30), "the automatic context to leave GID index 3");
        EXPECT_EQ(info.gid_index, 1); // ll v2 outranks v4 v1
        EXPECT_EQ(ote_context_check(autoc), OTE_OK);
        // ...while the pin is not replaced: its context pauses.
        ASSERT_TRUE(WaitState(pinned, OTE_CONTEXT_PAUSED));
        EXPECT_GE(guard.Seen(), 1u);
    }
    ote_context_get_info(pinned, &info);
    EXPECT_EQ(info.gid_index, 3);
    EXPECT_TRUE(LogContains("device sim1 port 1 GID index 3"));
}

TEST_F(ContextTest, BufferManagerPublishesInEveryContextIncludingPaused) {
    OpenWith("dev=a;port;gid=auto-v4,type=v2;dev=b;port,state=down;gid=auto-v4,type=v2");
    ASSERT_EQ(ote_context_set_open(v_, nullptr, &set_), OTE_OK);
    ote_buffer_manager_t *bm = nullptr;
    ASSERT_EQ(ote_buffer_manager_create(set_, &bm), OTE_OK);
    std::vector<char> mem(1 << 20);
    ote_buffer_t *buf = nullptr;
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    ASSERT_EQ(ote_buffer_register(bm, mem.data(), mem.size(), access, &buf), OTE_OK);
    EXPECT_EQ(ote_buffer_manager_count(bm), 1u);
    for (size_t i = 0; i < 2; i++) {
        ote_context_t *ctx = ote_context_set_get(set_, i);
        ibv_mr *mr = nullptr;
        ASSERT_EQ(ote_buffer_mr(buf, ctx, &mr), OTE_OK);
        EXPECT_EQ(mr->addr, mem.data());
        EXPECT_EQ(mr->length, mem.size());
        ibv_mr *found = nullptr;
        EXPECT_EQ(ote_buffer_manager_find(bm, mem.data() + 4096, 100, ctx, &found), OTE_OK);
        EXPECT_EQ(found, mr);
    }
    ibv_mr *none = nullptr;
    EXPECT_EQ(ote_buffer_manager_find(bm, mem.data() + mem.size() - 10, 100,
                                      ote_context_set_get(set_, 0), &none),
              OTE_ERR_ACCESS);
    ote_buffer_t *dup = nullptr;
    EXPECT_EQ(ote_buffer_register(bm, mem.data(), mem.size(), access, &dup), OTE_ERR_EXISTS);
    EXPECT_EQ(ote_buffer_manager_destroy(bm), OTE_ERR_BUSY);
    EXPECT_EQ(ote_buffer_deregister(bm, buf), OTE_OK);
    EXPECT_EQ(ote_buffer_manager_count(bm), 0u);
    EXPECT_EQ(ote_buffer_manager_retained(bm), 0u);
    EXPECT_EQ(ote_buffer_manager_destroy(bm), OTE_OK);
}

// A dma-buf registration (GPUDirect RDMA's shape; a memfd stands in for a GPU's
// dma-buf): an MR of exactly [offset, +len) of the fd in every context, found at its iova
// range and nowhere else, still valid after the caller closed its fd; an fd that is no
// dma-buf fails with nothing published.
TEST_F(ContextTest, DmabufRegistrationPublishesTheExactRangeAtItsIova) {
    OpenWith("dev=a;port;gid=auto-v4,type=v2;dev=b;port;gid=auto-v4,type=v2");
    ASSERT_EQ(ote_context_set_open(v_, nullptr, &set_), OTE_OK);
    ote_buffer_manager_t *bm = nullptr;
    ASSERT_EQ(ote_buffer_manager_create(set_, &bm), OTE_OK);
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    int fd = memfd_create("dmabuf", MFD_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, static_cast<off_t>(4 * page)), 0);
    // A "device address" the process cannot address: only the iova of the MR.
    uint64_t iova = 0x7e0000000000ull + page + 123;
    const size_t len = 2 * page + 5;
    void *addr = reinterpret_cast<void *>(iova);
    ote_buffer_t *buf = nullptr;
    ASSERT_EQ(
        ote_buffer_register_dmabuf(bm, addr, len, IBV_ACCESS_LOCAL_WRITE, fd, page + 123, &buf),
        OTE_OK);
    close(fd); // the MRs keep the memory
    for (size_t i = 0; i < 2; i++) {
        ote_context_t *ctx = ote_context_set_get(set_, i);
        ibv_mr *mr = nullptr;
        ASSERT_EQ(ote_buffer_mr(buf, ctx, &mr), OTE_OK);
        EXPECT_EQ(mr->length, len);
        ibv_mr *found = nullptr;
        EXPECT_EQ(ote_buffer_manager_find(bm, addr, len, ctx, &found), OTE_OK);
        EXPECT_EQ(found, mr);
        EXPECT_EQ(ote_buffer_manager_find(bm, reinterpret_cast<void *>(iova - 1), 2, ctx, &found),
                  OTE_ERR_ACCESS);
        EXPECT_EQ(
            ote_buffer_manager_find(bm, reinterpret_cast<void *>(iova + len - 1), 2, ctx, &found),
            OTE_ERR_ACCESS);
    }
    EXPECT_EQ(ote_buffer_deregister(bm, buf), OTE_OK);
    // Not a dma-buf (no fd; a pipe cannot be mapped): refused, nothing published.
    ote_buffer_t *bad = nullptr;
    EXPECT_EQ(ote_buffer_register_dmabuf(bm, addr, len, IBV_ACCESS_LOCAL_WRITE, -1, 0, &bad),
              OTE_ERR_INVALID);
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    {
        ote_test::ErrorLogsExpected guard;
        EXPECT_NE(ote_buffer_register_dmabuf(bm, addr, len, IBV_ACCESS_LOCAL_WRITE, p[0], 0, &bad),
                  OTE_OK);
    }
    close(p[0]);
    close(p[1]);
    EXPECT_EQ(ote_buffer_manager_count(bm), 0u);
    EXPECT_EQ(ote_buffer_manager_retained(bm), 0u);
    EXPECT_EQ(ote_buffer_manager_destroy(bm), OTE_OK);
}

} // namespace

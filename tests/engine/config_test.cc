// Unit tests of engine configuration, address parsing and engine creation choices.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tests/engine/engine_util.h"
#include "tests/util/test_base.h"

extern "C" {
#include "engine/engine_internal.h"
#include "ote/ote.h"
}

namespace {

class ConfigTest : public ote_test::OteTest {
  protected:
    void SetUp() override {
        OteTest::SetUp();
        ASSERT_EQ(ote_config_create(&cfg_), OTE_OK);
    }
    void TearDown() override {
        ote_config_destroy(cfg_);
        unsetenv("OTE_TCP_WORKERS");
        unsetenv("OTE_SLICE_SIZE");
        OteTest::TearDown();
    }
    std::string Get(const char *key) {
        char buf[300];
        EXPECT_EQ(ote_config_get(cfg_, key, buf, sizeof(buf)), OTE_OK) << key;
        return buf;
    }
    ote_config_t *cfg_ = nullptr;
};

TEST_F(ConfigTest, DefaultsSetAndEnvironment) {
    EXPECT_EQ(Get("transport"), ""); // not set: transports decides
    EXPECT_EQ(Get("transports"), "shm,tcp");
    EXPECT_EQ(Get("listen_address"), "127.0.0.1:0");
    EXPECT_EQ(Get("tcp_connections"), "4");
    EXPECT_EQ(Get("tcp_workers"), "2");
    EXPECT_EQ(Get("slice_size"), "1M");
    EXPECT_EQ(Get("transfer_timeout_ms"), "30000");
    EXPECT_EQ(Get("connect_timeout_ms"), "5000");
    EXPECT_EQ(Get("handshake_timeout_ms"), "5000");
    setenv("OTE_TCP_WORKERS", "3", 1);
    EXPECT_EQ(Get("tcp_workers"), "3");
    ASSERT_EQ(ote_config_set(cfg_, "tcp_workers", "5"), OTE_OK);
    EXPECT_EQ(Get("tcp_workers"), "5"); // set wins over the environment
    ASSERT_EQ(ote_config_set(cfg_, "slice_size", "256K"), OTE_OK);
    ote__cfg_t r;
    ASSERT_EQ(ote__config_resolve(cfg_, &r), OTE_OK);
    EXPECT_EQ(r.tcp_workers, 5u);
    EXPECT_EQ(r.slice_size, 256u * 1024);
    char small[2];
    EXPECT_EQ(ote_config_get(cfg_, "transports", small, sizeof(small)), OTE_ERR_TOO_BIG);
    EXPECT_EQ(ote_config_get(cfg_, "nope", small, sizeof(small)), OTE_ERR_NOT_FOUND);
}

TEST_F(ConfigTest, InvalidValuesAreRefusedAndChangeNothing) {
    EXPECT_EQ(ote_config_set(cfg_, "no_such_key", "1"), OTE_ERR_NOT_FOUND);
    EXPECT_EQ(ote_config_set(cfg_, "transport", "udp"), OTE_ERR_INVALID);
    EXPECT_EQ(ote_config_set(cfg_, "tcp_connections", "0"), OTE_ERR_INVALID);
    EXPECT_EQ(ote_config_set(cfg_, "tcp_connections", "65"), OTE_ERR_INVALID);
    EXPECT_EQ(ote_config_set(cfg_, "tcp_workers", "two"), OTE_ERR_INVALID);
    EXPECT_EQ(ote_config_set(cfg_, "slice_size", "1X"), OTE_ERR_INVALID);
    EXPECT_EQ(ote_config_set(cfg_, "slice_size", "1"), OTE_ERR_INVALID);
    EXPECT_EQ(ote_config_set(cfg_, "slice_size", "1G"), OTE_ERR_INVALID);
    EXPECT_EQ(ote_config_set(cfg_, "transfer_timeout_ms", "-5"), OTE_ERR_INVALID);
    EXPECT_EQ(ote_config_set(cfg_, "listen_address", "::1:80"), OTE_ERR_INVALID);
    EXPECT_EQ(ote_config_set(cfg_, "listen_address", "host"), OTE_ERR_INVALID);
    EXPECT_EQ(ote_config_set(cfg_, "log_level", "loud"), OTE_ERR_INVALID);
    EXPECT_EQ(ote_config_set(cfg_, "verbs_provider", "magic"), OTE_ERR_INVALID);
    EXPECT_EQ(ote_config_set(nullptr, "transport", "tcp"), OTE_ERR_INVALID);
    EXPECT_EQ(ote_config_set(cfg_, "rdma_topology", std::string(1024, 'f').c_str()),
              OTE_ERR_INVALID);
    EXPECT_TRUE(LogContains("rdma_topology"));
    EXPECT_EQ(Get("rdma_topology"), "");
    EXPECT_EQ(Get("transport"), "");
    EXPECT_EQ(Get("tcp_connections"), "4");
    EXPECT_TRUE(LogContains("invalid tcp_connections=\"0\""));
}

TEST_F(ConfigTest, InvalidEnvironmentFailsEngineCreation) {
    setenv("OTE_SLICE_SIZE", "lots", 1);
    ote_engine_t *e = nullptr;
    ExpectErrorLogsIn([&] { EXPECT_EQ(ote_engine_create(cfg_, &e), OTE_ERR_INVALID); });
    EXPECT_EQ(e, nullptr);
    EXPECT_TRUE(LogContains("slice_size=\"lots\" (from environment)"));
}

TEST_F(ConfigTest, TransportsListAndItsOneElementForm) {
    ote__cfg_t r;
    ASSERT_EQ(ote__config_resolve(cfg_, &r), OTE_OK);
    EXPECT_STREQ(r.transports, "shm,tcp");
    EXPECT_STREQ(r.transport, "shm");
    for (const char *bad : {"", "udp", "tcp,tcp", "shm,", ",tcp", "tcp,rdma,shm,tcp", "TCP"})
        EXPECT_EQ(ote_config_set(cfg_, "transports", bad), OTE_ERR_INVALID) << bad;
    ASSERT_EQ(ote_config_set(cfg_, "transports", "rdma,shm,tcp"), OTE_OK);
    ASSERT_EQ(ote__config_resolve(cfg_, &r), OTE_OK);
    EXPECT_STREQ(r.transports, "rdma,shm,tcp");
    EXPECT_STREQ(r.transport, "rdma");
    // transport alone is the one-element list.
    ote_config_t *one = nullptr;
    ASSERT_EQ(ote_config_create(&one), OTE_OK);
    ASSERT_EQ(ote_config_set(one, "transport", "tcp"), OTE_OK);
    ASSERT_EQ(ote__config_resolve(one, &r), OTE_OK);
    EXPECT_STREQ(r.transports, "tcp");
    // Both set and different: refused, naming both.
    ASSERT_EQ(ote_config_set(one, "transports", "shm,tcp"), OTE_OK);
    ExpectErrorLogsIn([&] { EXPECT_EQ(ote__config_resolve(one, &r), OTE_ERR_INVALID); });
    EXPECT_TRUE(LogContains("transport=tcp and transports=shm,tcp disagree"));
    ote_config_destroy(one);
}

TEST_F(ConfigTest, RdmaIsRefusedWithoutFallback) {
    std::vector<std::string> devs = ote_test::KernelVerbsDevices();
    if (!devs.empty())
        GTEST_SKIP()
            << "this machine has an RDMA device (" << devs[0]
            << " in /sys/class/infiniband_verbs): the no-device refusal cannot be shown here";
    ASSERT_EQ(ote_config_set(cfg_, "transport", "rdma"), OTE_OK);
    ote_engine_t *e = nullptr;
    // Without an RDMA device here the engine is refused (NO_DEVICE once engine/rdma is
    // built in, UNSUPPORTED before): never an engine quietly running over TCP.
    int code = 0;
    ExpectErrorLogsIn([&] { code = ote_status_code(ote_engine_create(cfg_, &e)); });
    EXPECT_TRUE(code == OTE_ERR_NO_DEVICE || code == OTE_ERR_UNSUPPORTED) << code;
    EXPECT_EQ(e, nullptr);
    EXPECT_TRUE(LogContains("no fallback to tcp"));
}

TEST_F(ConfigTest, AddressParsing) {
    char host[256];
    uint16_t port = 0;
    int v6 = -1;
    ASSERT_EQ(ote__addr_split("127.0.0.1:8080", host, sizeof(host), &port, &v6), OTE_OK);
    EXPECT_STREQ(host, "127.0.0.1");
    EXPECT_EQ(port, 8080);
    EXPECT_EQ(v6, 0);
    ASSERT_EQ(ote__addr_split("[::1]:65535", host, sizeof(host), &port, &v6), OTE_OK);
    EXPECT_STREQ(host, "::1");
    EXPECT_EQ(port, 65535);
    EXPECT_EQ(v6, 1);
    ASSERT_EQ(ote__addr_split("[fe80::1%eth0]:1", host, sizeof(host), &port, &v6), OTE_OK);
    EXPECT_STREQ(host, "fe80::1%eth0");
    ASSERT_EQ(ote__addr_split("[2001:db8::7:80]:90", host, sizeof(host), &port, &v6), OTE_OK);
    EXPECT_STREQ(host, "2001:db8::7:80"); // the last group is not taken as the port
    EXPECT_EQ(port, 90);
    ASSERT_EQ(ote__addr_split("node-1.example:7", host, sizeof(host), &port, &v6), OTE_OK);
    EXPECT_STREQ(host, "node-1.example");
    const char *bad[] = {"",       ":80",          "host:",   "host:65536", "host:-1",
                         "::1:80", "[::1]",        "[::1]80", "[zz::1]:80", "host:8o",
                         "a b:1",  "[::1]:123456", "host:1:2"};
    for (const char *b : bad)
        EXPECT_EQ(ote__addr_split(b, host, sizeof(host), &port, &v6), OTE_ERR_INVALID) << b;
    char tiny[4];
    EXPECT_EQ(ote__addr_split("hostname:1", tiny, sizeof(tiny), &port, &v6), OTE_ERR_INVALID);

    struct sockaddr_storage ss;
    socklen_t sl;
    char out[64];
    ASSERT_EQ(ote__addr_resolve("[::1]:4242", &ss, &sl), OTE_OK);
    ASSERT_EQ(ote__addr_format(reinterpret_cast<sockaddr *>(&ss), out, sizeof(out)), OTE_OK);
    EXPECT_STREQ(out, "[::1]:4242");
    ASSERT_EQ(ote__addr_resolve("10.1.2.3:5", &ss, &sl), OTE_OK);
    ASSERT_EQ(ote__addr_format(reinterpret_cast<sockaddr *>(&ss), out, sizeof(out)), OTE_OK);
    EXPECT_STREQ(out, "10.1.2.3:5");
    ASSERT_EQ(ote__addr_resolve("localhost:5", &ss, &sl), OTE_OK);
}

TEST_F(ConfigTest, EngineAddressesV4V6AndAdvertised) {
    ote_engine_t *e = nullptr;
    char addr[300];
    ASSERT_EQ(ote_engine_create(cfg_, &e), OTE_OK);
    ASSERT_EQ(ote_engine_address(e, addr, sizeof(addr)), OTE_OK);
    EXPECT_EQ(std::string(addr).rfind("127.0.0.1:", 0), 0u) << addr;
    EXPECT_NE(std::string(addr), "127.0.0.1:0");
    EXPECT_EQ(ote_engine_address(e, addr, 5), OTE_ERR_TOO_BIG);
    ASSERT_EQ(ote_engine_destroy(e), OTE_OK);

    ASSERT_EQ(ote_config_set(cfg_, "listen_address", "[::1]:0"), OTE_OK);
    if (ote_engine_create(cfg_, &e) == OTE_OK) {
        ASSERT_EQ(ote_engine_address(e, addr, sizeof(addr)), OTE_OK);
        EXPECT_EQ(std::string(addr).rfind("[::1]:", 0), 0u) << addr;
        ASSERT_EQ(ote_engine_destroy(e), OTE_OK);
    }
    // A wildcard without a key needs allow_unauthenticated=1 (auth_test covers the refusal).
    ASSERT_EQ(ote_config_set(cfg_, "listen_address", "0.0.0.0:0"), OTE_OK);
    ASSERT_EQ(ote_config_set(cfg_, "allow_unauthenticated", "1"), OTE_OK);
    ASSERT_EQ(ote_config_set(cfg_, "advertise_address", "[2001:db8::5]:0"), OTE_OK);
    ASSERT_EQ(ote_engine_create(cfg_, &e), OTE_OK);
    ASSERT_EQ(ote_engine_address(e, addr, sizeof(addr)), OTE_OK);
    EXPECT_EQ(std::string(addr).rfind("[2001:db8::5]:", 0), 0u) << addr;
    EXPECT_NE(std::string(addr), "[2001:db8::5]:0"); // port 0 = the port we listen on
    ASSERT_EQ(ote_engine_destroy(e), OTE_OK);
    // A specific listen address is advertised as set too (NAT, a container's published
    // port): advertise_address wins whatever the listen address, as ote.h says.
    ote_config_t *c2 = nullptr;
    ASSERT_EQ(ote_config_create(&c2), OTE_OK);
    ASSERT_EQ(ote_config_set(c2, "listen_address", "127.0.0.1:0"), OTE_OK);
    ASSERT_EQ(ote_config_set(c2, "advertise_address", "127.0.0.1:1"), OTE_OK);
    ASSERT_EQ(ote_engine_create(c2, &e), OTE_OK);
    ASSERT_EQ(ote_engine_address(e, addr, sizeof(addr)), OTE_OK);
    EXPECT_STREQ(addr, "127.0.0.1:1");
    ASSERT_EQ(ote_engine_destroy(e), OTE_OK);
    ASSERT_EQ(ote_config_set(c2, "advertise_address", "10.1.2.3:0"), OTE_OK);
    ASSERT_EQ(ote_engine_create(c2, &e), OTE_OK);
    ASSERT_EQ(ote_engine_address(e, addr, sizeof(addr)), OTE_OK);
    EXPECT_EQ(std::string(addr).rfind("10.1.2.3:", 0), 0u) << addr;
    EXPECT_NE(std::string(addr), "10.1.2.3:0");
    ASSERT_EQ(ote_engine_destroy(e), OTE_OK);
    ote_config_destroy(c2);
}

TEST_F(ConfigTest, ListenAddressInUseIsAClearError) {
    ote_engine_t *a = nullptr, *b = nullptr;
    ASSERT_EQ(ote_engine_create(cfg_, &a), OTE_OK);
    char addr[300];
    ASSERT_EQ(ote_engine_address(a, addr, sizeof(addr)), OTE_OK);
    ASSERT_EQ(ote_config_set(cfg_, "listen_address", addr), OTE_OK);
    ExpectErrorLogsIn(
        [&] { EXPECT_EQ(ote_status_code(ote_engine_create(cfg_, &b)), OTE_ERR_BUSY); });
    EXPECT_TRUE(LogContains("cannot listen on"));
    ASSERT_EQ(ote_engine_destroy(a), OTE_OK);
}

// The configuration table (engine/config.c) is the one source of every key: set, get, the
// environment and resolution all walk it. These tests hold each of its keys to that.
class ConfigTableTest : public ConfigTest {
  protected:
    void SetUp() override {
        ConfigTest::SetUp();
        for (size_t i = 0; ote__config_key(i) != nullptr; i++) {
            std::string env = EnvName(ote__config_key(i));
            const char *v = getenv(env.c_str());
            if (v != nullptr) saved_env_[env] = v;
            unsetenv(env.c_str());
        }
    }
    void TearDown() override {
        for (size_t i = 0; ote__config_key(i) != nullptr; i++)
            unsetenv(EnvName(ote__config_key(i)).c_str());
        for (const auto &kv : saved_env_) setenv(kv.first.c_str(), kv.second.c_str(), 1);
        ConfigTest::TearDown();
    }
    static std::string EnvName(const std::string &key) {
        std::string env = "OTE_";
        for (char c : key) env += (char)toupper((unsigned char)c);
        return env;
    }
    static std::vector<std::string> Keys() {
        std::vector<std::string> keys;
        for (size_t i = 0; ote__config_key(i) != nullptr; i++) keys.push_back(ote__config_key(i));
        return keys;
    }
    std::map<std::string, std::string> saved_env_;
};

// A valid value of each key other than its default, and where it must land.
struct Sample {
    const char *value;
    std::function<bool(const ote__cfg_t &)> landed;
};

const std::map<std::string, Sample> &Samples() {
    using R = const ote__cfg_t &;
    static const std::map<std::string, Sample> s = {
        {"transport",
         {"tcp",
          [](R r) {
              return std::string(r.transport) == "tcp" && std::string(r.transports) == "tcp";
          }}},
        {"transports",
         {"rdma,tcp",
          [](R r) {
              return std::string(r.transports) == "rdma,tcp" && std::string(r.transport) == "rdma";
          }}},
        {"shm_mode", {"ring", [](R r) { return std::string(r.shm_mode) == "ring"; }}},
        {"listen_address",
         {"[::1]:7", [](R r) { return std::string(r.listen_address) == "[::1]:7"; }}},
        {"advertise_address",
         {"10.0.0.1:9", [](R r) { return std::string(r.advertise_address) == "10.0.0.1:9"; }}},
        {"tcp_connections", {"7", [](R r) { return r.tcp_connections == 7; }}},
        {"tcp_workers", {"9", [](R r) { return r.tcp_workers == 9; }}},
        {"tcp_max_accepted", {"65536", [](R r) { return r.tcp_max_accepted == 65536; }}},
        {"slice_size", {"8K", [](R r) { return r.slice_size == 8192; }}},
        {"transfer_timeout_ms",
         {"86400000", [](R r) { return r.transfer_timeout_ms == 86400000; }}},
        {"connect_timeout_ms", {"600000", [](R r) { return r.connect_timeout_ms == 600000; }}},
        {"handshake_timeout_ms", {"77", [](R r) { return r.handshake_timeout_ms == 77; }}},
        {"verbs_provider", {"sim", [](R r) { return std::string(r.verbs_provider) == "sim"; }}},
        {"sim_profile", {"small", [](R r) { return std::string(r.sim_profile) == "small"; }}},
        {"rdma_srq_slots", {"1024", [](R r) { return r.rdma_srq_slots == 1024; }}},
        {"rdma_max_peers", {"100", [](R r) { return r.rdma_max_peers == 100; }}},
        {"rdma_device", {"mlx5_3", [](R r) { return std::string(r.rdma_device) == "mlx5_3"; }}},
        {"rdma_topology",
         {"/etc/orbitte/topology",
          [](R r) { return std::string(r.rdma_topology) == "/etc/orbitte/topology"; }}},
        {"engine_name",
         {"prefill node 0", [](R r) { return std::string(r.engine_name) == "prefill node 0"; }}},
        {"rdma_devices",
         {"sim0, sim1", [](R r) { return std::string(r.rdma_devices) == "sim0, sim1"; }}},
        {"rdma_exclude", {"mlx5_1", [](R r) { return std::string(r.rdma_exclude) == "mlx5_1"; }}},
        {"rdma_lanes", {"64", [](R r) { return r.rdma_lanes == 64; }}},
        {"rdma_pin",
         {"sim0:1:0,sim1:2:255",
          [](R r) { return std::string(r.rdma_pin) == "sim0:1:0,sim1:2:255"; }}},
        {"rdma_port", {"2", [](R r) { return r.rdma_port == 2; }}},
        {"rdma_gid_index", {"0", [](R r) { return r.rdma_gid_index == 0; }}},
        {"rdma_traffic_class", {"106", [](R r) { return r.rdma_traffic_class == 106; }}},
        {"rdma_service_level", {"15", [](R r) { return r.rdma_service_level == 15; }}},
        {"rdma_mtu",
         {"2048",
          [](R r) {
              return r.rdma_mtu == 4 /* IBV_MTU_2048 */ && std::string(r.rdma_mtu_text) == "2048";
          }}},
        {"rdma_sysfs_root",
         {"/host/sys", [](R r) { return std::string(r.rdma_sysfs_root) == "/host/sys"; }}},
        {"rdma_grant_max", {"1G", [](R r) { return r.rdma_grant_max == (1ull << 30); }}},
        // 2^40 does not fit 32 bits: the table stores this key's full width.
        {"rdma_max_inflight", {"1024G", [](R r) { return r.rdma_max_inflight == (1ull << 40); }}},
        {"rdma_max_grants", {"65536", [](R r) { return r.rdma_max_grants == 65536; }}},
        {"rdma_max_qps", {"3", [](R r) { return r.rdma_max_qps == 3; }}},
        {"rdma_recv_slots", {"4096", [](R r) { return r.rdma_recv_slots == 4096; }}},
        {"rdma_max_send_wrs", {"1048576", [](R r) { return r.rdma_max_send_wrs == 1048576; }}},
        {"rdma_max_served_grants", {"5", [](R r) { return r.rdma_max_served_grants == 5; }}},
        {"rdma_grant_mode", {"mr", [](R r) { return std::string(r.rdma_grant_mode) == "mr"; }}},
        {"log_level", {"debug", [](R r) { return std::string(r.log_level) == "debug"; }}},
        {"auth_key_file",
         {"/etc/ote/key", [](R r) { return std::string(r.auth_key_file) == "/etc/ote/key"; }}},
        {"allow_unauthenticated", {"1", [](R r) { return r.allow_unauthenticated == 1; }}},
        {"gpu_paths",
         {"direct,ipc",
          [](R r) {
              return r.gpu_paths == (OTE__GPU_PATH_DIRECT | OTE__GPU_PATH_IPC) &&
                     std::string(r.gpu_paths_text) == "direct,ipc";
          }}},
        {"gpu_staging_chunk", {"64M", [](R r) { return r.gpu_staging_chunk == (64ull << 20); }}},
        {"gpu_staging_depth", {"64", [](R r) { return r.gpu_staging_depth == 64; }}},
        {"register_thp", {"1", [](R r) { return r.register_thp == 1; }}},
        {"file_engine", {"threads", [](R r) { return std::string(r.file_engine) == "threads"; }}},
        {"file_queue_depth", {"4096", [](R r) { return r.file_queue_depth == 4096; }}},
        {"file_chunk_size", {"64M", [](R r) { return r.file_chunk_size == (64ull << 20); }}},
        {"file_sync", {"data", [](R r) { return std::string(r.file_sync) == "data"; }}},
        {"file_zero_copy", {"off", [](R r) { return std::string(r.file_zero_copy) == "off"; }}},
    };
    return s;
}

TEST_F(ConfigTableTest, KeysAreDistinctAndEachHasASample) {
    std::vector<std::string> keys = Keys();
    ASSERT_FALSE(keys.empty());
    std::set<std::string> distinct(keys.begin(), keys.end());
    EXPECT_EQ(distinct.size(), keys.size());
    for (const auto &k : keys) {
        EXPECT_LT(EnvName(k).size(), 64u) << k; // the whole OTE_<KEY> name is looked up
        EXPECT_EQ(Samples().count(k), 1u) << k << ": add a sample for the new key";
    }
    for (const auto &kv : Samples()) EXPECT_EQ(distinct.count(kv.first), 1u) << kv.first;
    EXPECT_EQ(ote__config_key(keys.size()), nullptr);
}

TEST_F(ConfigTableTest, EveryKeyRoundTripsThroughSetAndGet) {
    for (const auto &key : Keys()) {
        ote_config_t *c = nullptr;
        ASSERT_EQ(ote_config_create(&c), OTE_OK);
        char def[300], buf[300];
        ASSERT_EQ(ote_config_get(c, key.c_str(), def, sizeof(def)), OTE_OK) << key;
        char nocfg[300]; // a NULL configuration reads the same defaults
        ASSERT_EQ(ote_config_get(nullptr, key.c_str(), nocfg, sizeof(nocfg)), OTE_OK) << key;
        EXPECT_STREQ(nocfg, def) << key;
        EXPECT_EQ(ote_config_set(c, key.c_str(), def), OTE_OK) << key << ": its default is valid";
        const char *v = Samples().at(key).value;
        EXPECT_STRNE(v, def) << key;
        ASSERT_EQ(ote_config_set(c, key.c_str(), v), OTE_OK) << key << "=" << v;
        ASSERT_EQ(ote_config_get(c, key.c_str(), buf, sizeof(buf)), OTE_OK) << key;
        EXPECT_STREQ(buf, v) << key;
        EXPECT_EQ(ote_config_get(c, key.c_str(), buf, strlen(v)), OTE_ERR_TOO_BIG) << key;
        EXPECT_EQ(ote_config_get(c, key.c_str(), buf, strlen(v) + 1), OTE_OK) << key;
        ote_config_destroy(c);
    }
}

TEST_F(ConfigTableTest, EveryKeyResolvesFromItsDefaultSetAndEnvironment) {
    ote__cfg_t def;
    ASSERT_EQ(ote__config_resolve(nullptr, &def), OTE_OK);
    ote__cfg_t from_cfg; // an empty configuration resolves like none
    ASSERT_EQ(ote__config_resolve(cfg_, &from_cfg), OTE_OK);
    for (const auto &key : Keys()) {
        const Sample &s = Samples().at(key);
        EXPECT_FALSE(s.landed(def)) << key << ": the sample must differ from the default";
        ote_config_t *c = nullptr;
        ASSERT_EQ(ote_config_create(&c), OTE_OK);
        ASSERT_EQ(ote_config_set(c, key.c_str(), s.value), OTE_OK) << key;
        ote__cfg_t r;
        ASSERT_EQ(ote__config_resolve(c, &r), OTE_OK) << key;
        EXPECT_TRUE(s.landed(r)) << key << "=" << s.value << " set";
        ote_config_destroy(c);
        std::string env = EnvName(key);
        setenv(env.c_str(), s.value, 1);
        ASSERT_EQ(ote__config_resolve(nullptr, &r), OTE_OK) << key;
        EXPECT_TRUE(s.landed(r)) << env << "=" << s.value;
        unsetenv(env.c_str());
    }
}

TEST_F(ConfigTableTest, UnknownKeysAreRefused) {
    for (const char *key : {"", "no_such_key", "TCP_WORKERS", "tcp_workers ", " tcp_workers", "tcp",
                            "transports,", "gpu_path"}) {
        EXPECT_EQ(ote_config_set(cfg_, key, "1"), OTE_ERR_NOT_FOUND) << key;
        EXPECT_TRUE(LogContains(std::string("unknown key \"") + key + "\"")) << key;
        char buf[64];
        EXPECT_EQ(ote_config_get(cfg_, key, buf, sizeof(buf)), OTE_ERR_NOT_FOUND) << key;
    }
    char buf[64];
    EXPECT_EQ(ote_config_set(cfg_, nullptr, "1"), OTE_ERR_INVALID);
    EXPECT_EQ(ote_config_get(cfg_, nullptr, buf, sizeof(buf)), OTE_ERR_INVALID);
    setenv("OTE_NO_SUCH_KEY", "1", 1); // an environment variable names no new key
    EXPECT_EQ(ote_config_get(cfg_, "no_such_key", buf, sizeof(buf)), OTE_ERR_NOT_FOUND);
    unsetenv("OTE_NO_SUCH_KEY");
}

TEST_F(ConfigTableTest, BooleansAndListsKeepTheirRulesAndMessages) {
    for (const char *key : {"allow_unauthenticated", "register_thp"}) {
        for (const char *bad : {"2", "true", "", " 1", "01"})
            EXPECT_EQ(ote_config_set(cfg_, key, bad), OTE_ERR_INVALID) << key << "=" << bad;
        EXPECT_TRUE(
            LogContains(std::string("invalid ") + key + "=\"2\": expected one of \"0\" \"1\""));
    }
    for (const char *bad :
         {"staging,", ",ipc", "ipc,,staging", "ipc,ipc", "IPC", " ipc", "ipc ", "gpu"})
        EXPECT_EQ(ote_config_set(cfg_, "gpu_paths", bad), OTE_ERR_INVALID) << bad;
    EXPECT_TRUE(LogContains("expected a comma list of distinct staging, ipc, direct, or \"\""));
    ote__cfg_t r;
    for (const char *good : {"", "staging", "ipc,staging", "direct,ipc,staging"}) {
        ASSERT_EQ(ote_config_set(cfg_, "gpu_paths", good), OTE_OK) << good;
        ASSERT_EQ(ote__config_resolve(cfg_, &r), OTE_OK) << good;
        EXPECT_STREQ(r.gpu_paths_text, good);
    }
    EXPECT_EQ(r.gpu_paths, OTE__GPU_PATH_STAGING | OTE__GPU_PATH_IPC | OTE__GPU_PATH_DIRECT);
    for (const char *bad : {" tcp", "tcp ", "shm,,tcp", ","})
        EXPECT_EQ(ote_config_set(cfg_, "transports", bad), OTE_ERR_INVALID) << bad;
    setenv("OTE_REGISTER_THP", "yes", 1);
    ExpectErrorLogsIn([&] { EXPECT_EQ(ote__config_resolve(cfg_, &r), OTE_ERR_INVALID); });
    EXPECT_TRUE(LogContains(
        "invalid register_thp=\"yes\" (from environment): expected one of \"0\" \"1\""));
}

// engine_name: empty by default; up to 63 printable ASCII characters (space included);
// longer, control characters and non-ASCII bytes refused with a message naming the key,
// from ote_config_set and from the environment alike.
TEST_F(ConfigTableTest, EngineNameIsPrintableAndBounded) {
    ote__cfg_t r;
    ASSERT_EQ(ote__config_resolve(cfg_, &r), OTE_OK);
    EXPECT_STREQ(r.engine_name, "");
    std::string longest(63, 'n');
    for (const std::string &good : {std::string("prefill-0"), std::string(" ~"), longest}) {
        ASSERT_EQ(ote_config_set(cfg_, "engine_name", good.c_str()), OTE_OK) << good;
        ASSERT_EQ(ote__config_resolve(cfg_, &r), OTE_OK);
        EXPECT_EQ(std::string(r.engine_name), good);
    }
    std::string too_long(64, 'n');
    for (const std::string &bad : {too_long, std::string("a\nb"), std::string("tab\t"),
                                   std::string("caf\xc3\xa9"), std::string("del\x7f")})
        EXPECT_EQ(ote_config_set(cfg_, "engine_name", bad.c_str()), OTE_ERR_INVALID) << bad;
    EXPECT_TRUE(LogContains("invalid engine_name=")); // names the key
    EXPECT_TRUE(LogContains("at most 63 printable ASCII characters (0x20..0x7e)"));
    EXPECT_EQ(std::string(r.engine_name), longest); // a refused value changes nothing
    ASSERT_EQ(ote_config_set(cfg_, "engine_name", ""), OTE_OK);
    setenv("OTE_ENGINE_NAME", "bad\x01", 1);
    ote_config_t *env_cfg = nullptr;
    ASSERT_EQ(ote_config_create(&env_cfg), OTE_OK);
    ExpectErrorLogsIn([&] { EXPECT_EQ(ote__config_resolve(env_cfg, &r), OTE_ERR_INVALID); });
    EXPECT_TRUE(LogContains("invalid engine_name=\"bad"));
    EXPECT_TRUE(LogContains("(from environment)"));
    setenv("OTE_ENGINE_NAME", "decode-1", 1);
    ASSERT_EQ(ote__config_resolve(env_cfg, &r), OTE_OK);
    EXPECT_STREQ(r.engine_name, "decode-1");
    unsetenv("OTE_ENGINE_NAME");
    ote_config_destroy(env_cfg);
}

// The route and address-vector keys: defaults, the good values at their edges, the bad
// ones refused at ote_config_set with a message naming the key and what it accepts, and
// rdma_port / rdma_gid_index refused beside rdma_pin (which opens no other device).
TEST_F(ConfigTableTest, RdmaRouteAndAddressVectorKeys) {
    ote__cfg_t r;
    ASSERT_EQ(ote__config_resolve(cfg_, &r), OTE_OK);
    EXPECT_EQ(r.rdma_port, OTE__CFG_UNSET);
    EXPECT_EQ(r.rdma_gid_index, OTE__CFG_UNSET);
    EXPECT_EQ(r.rdma_traffic_class, 0u);
    EXPECT_EQ(r.rdma_service_level, 0u);
    EXPECT_EQ(r.rdma_mtu, 0u);
    EXPECT_STREQ(r.rdma_sysfs_root, "");
    struct Case {
        const char *key;
        std::vector<const char *> good, bad;
        const char *expected;
    };
    const std::vector<Case> cases = {
        {"rdma_gid_index",
         {"0", "7", "255", ""},
         {"-1", "256", "x", "3 ", " 3", "0x3", "65535"},
         "expected an integer in [0, 255], or \"\" (automatic)"},
        {"rdma_port",
         {"1", "255", ""},
         {"0", "256", "-1", "p1"},
         "expected an integer in [1, 255]"},
        {"rdma_traffic_class",
         {"0", "104", "255"},
         {"256", "-1", "", "ef"},
         "expected an integer in [0, 255]"},
        {"rdma_service_level",
         {"0", "3", "15"},
         {"16", "-1", "", "255"},
         "expected an integer in [0, 15]"},
        {"rdma_mtu",
         {"256", "512", "1024", "2048", "4096", ""},
         {"1500", "9000", "8192", "128", "4K", "0", " 1024"},
         "expected 256, 512, 1024, 2048 or 4096 (bytes), or \"\" (none)"},
    };
    for (const auto &c : cases) {
        for (const char *g : c.good)
            EXPECT_EQ(ote_config_set(cfg_, c.key, g), OTE_OK) << c.key << "=" << g;
        for (const char *b : c.bad) {
            EXPECT_EQ(ote_config_set(cfg_, c.key, b), OTE_ERR_INVALID) << c.key << "=" << b;
            EXPECT_TRUE(
                LogContains(std::string("invalid ") + c.key + "=\"" + b + "\": " + c.expected))
                << c.key << "=" << b;
        }
    }
    // The numeric forms: IBV_MTU_* for rdma_mtu (1 = 256 .. 5 = 4096).
    const std::pair<const char *, uint32_t> mtus[] = {{"256", 1},  {"512", 2},  {"1024", 3},
                                                      {"2048", 4}, {"4096", 5}, {"", 0}};
    for (const auto &m : mtus) {
        ASSERT_EQ(ote_config_set(cfg_, "rdma_mtu", m.first), OTE_OK);
        ASSERT_EQ(ote__config_resolve(cfg_, &r), OTE_OK);
        EXPECT_EQ(r.rdma_mtu, m.second) << m.first;
    }
    // Environment values are checked the same way, naming their source.
    setenv("OTE_RDMA_SERVICE_LEVEL", "16", 1); // cfg_ has the key set: set wins, so none
    ExpectErrorLogsIn([&] { EXPECT_EQ(ote__config_resolve(nullptr, &r), OTE_ERR_INVALID); });
    EXPECT_TRUE(LogContains("invalid rdma_service_level=\"16\" (from environment)"));
    unsetenv("OTE_RDMA_SERVICE_LEVEL");
    // Beside rdma_pin: refused, whichever of the two is set.
    ASSERT_EQ(ote_config_set(cfg_, "rdma_pin", "sim0:1:3"), OTE_OK);
    ASSERT_EQ(ote__config_resolve(cfg_, &r), OTE_OK);
    for (const char *key : {"rdma_gid_index", "rdma_port"}) {
        ote_config_t *c = nullptr;
        ASSERT_EQ(ote_config_create(&c), OTE_OK);
        ASSERT_EQ(ote_config_set(c, "rdma_pin", "sim0:1:3"), OTE_OK);
        ASSERT_EQ(ote_config_set(c, key, "1"), OTE_OK);
        ExpectErrorLogsIn([&] { EXPECT_EQ(ote__config_resolve(c, &r), OTE_ERR_INVALID) << key; });
        ote_config_destroy(c);
    }
    EXPECT_TRUE(LogContains("rdma_pin=sim0:1:3 names each device's port and GID index"));
}

TEST_F(ConfigTableTest, RdmaPinItemsParse) {
    ote__rdma_pin_t pins[OTE__RDMA_PIN_MAX];
    size_t n = 99;
    ASSERT_EQ(ote__rdma_pin_parse("", pins, &n), OTE_OK);
    EXPECT_EQ(n, 0u);
    ASSERT_EQ(ote__rdma_pin_parse("mlx5_0:1:3,sim1:255:255", pins, &n), OTE_OK);
    ASSERT_EQ(n, 2u);
    EXPECT_STREQ(pins[0].device, "mlx5_0");
    EXPECT_EQ(pins[0].port, 1);
    EXPECT_EQ(pins[0].gid_index, 3);
    EXPECT_STREQ(pins[1].device, "sim1");
    EXPECT_EQ(pins[1].port, 255);
    EXPECT_EQ(pins[1].gid_index, 255);
    for (const char *bad :
         {",", "a:1:0,,b:1:0", "a:1:0,", ",a:1:0", "a:1:0 ", "a:1:0,a:2:0", "a,b:1:0", "a:1,0:0",
          "a:1:0:", "a:1:0x", "a:1:256" /* sgid_index is 8 bits */}) {
        n = 99;
        EXPECT_EQ(ote__rdma_pin_parse(bad, pins, &n), OTE_ERR_INVALID) << bad;
        EXPECT_EQ(n, 99u) << bad;
    }
}

} // namespace

#include "tests/engine/engine_util.h"

#include <dirent.h>

#include <gtest/gtest.h>

#include <cstring>

#include "tests/util/wait.h"

namespace ote_test {

std::vector<std::string> KernelVerbsDevices() {
    std::vector<std::string> names;
    DIR *d = opendir("/sys/class/infiniband_verbs");
    if (d == nullptr) return names;
    while (dirent *de = readdir(d)) {
        if (strncmp(de->d_name, "uverbs", 6) == 0) names.push_back(de->d_name);
    }
    closedir(d);
    return names;
}

ote_engine_t *NewEngine(const ConfigKv &kv) {
    ote_config_t *cfg = nullptr;
    EXPECT_EQ(ote_config_create(&cfg), OTE_OK);
    for (auto &p : kv) EXPECT_EQ(ote_config_set(cfg, p.first, p.second), OTE_OK);
    ote_engine_t *e = nullptr;
    EXPECT_EQ(ote_engine_create(cfg, &e), OTE_OK);
    ote_config_destroy(cfg);
    return e;
}

const std::vector<std::string> kRdmaTargetEnv = {"OTE_TRANSPORT=rdma", "OTE_VERBS_PROVIDER=sim"};

ote_config_t *RdmaConfig(const char *timeout_ms, const char *connect_ms) {
    ote_config_t *cfg = nullptr;
    EXPECT_EQ(ote_config_create(&cfg), OTE_OK);
    EXPECT_EQ(ote_config_set(cfg, "transport", "rdma"), OTE_OK);
    EXPECT_EQ(ote_config_set(cfg, "verbs_provider", "sim"), OTE_OK);
    EXPECT_EQ(ote_config_set(cfg, "transfer_timeout_ms", timeout_ms), OTE_OK);
    if (connect_ms) {
        EXPECT_EQ(ote_config_set(cfg, "connect_timeout_ms", connect_ms), OTE_OK);
    }
    return cfg;
}

ote_engine_t *RdmaEngine(const char *timeout_ms, const char *connect_ms) {
    ote_config_t *cfg = RdmaConfig(timeout_ms, connect_ms);
    ote_engine_t *e = nullptr;
    EXPECT_EQ(ote_engine_create(cfg, &e), OTE_OK);
    ote_config_destroy(cfg);
    return e;
}

std::string EngineAddress(ote_engine_t *e) {
    char buf[300] = {0};
    EXPECT_EQ(ote_engine_address(e, buf, sizeof(buf)), OTE_OK);
    return buf;
}

ote_status_t UnregisterWhenFree(ote_engine_t *e, void *addr, std::chrono::nanoseconds timeout) {
    ote_status_t st = OTE_ERR_BUSY;
    WaitUntil(
        [&] {
            st = ote_memory_unregister(e, addr);
            return ote_status_code(st) != OTE_ERR_BUSY;
        },
        timeout, "ote_memory_unregister to answer other than BUSY");
    return st;
}

ote_status_t RunOne(ote_engine_t *e, const ote_request_t &r, uint64_t wait_ns,
                    ote_transfer_status_t *ts) {
    ote_batch_t *b = nullptr;
    EXPECT_EQ(ote_batch_create(e, 1, &b), OTE_OK);
    ote_status_t st = ote_batch_submit(b, &r, 1);
    if (st == OTE_OK) st = ote_batch_wait(b, wait_ns);
    if (ts) {
        EXPECT_EQ(ote_batch_status(b, 0, ts), OTE_OK);
    }
    EXPECT_EQ(ote_batch_destroy(b), OTE_OK);
    return st;
}

} // namespace ote_test

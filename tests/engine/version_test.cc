// ote_version() and ote_features() (engine/version.c): the version the header promises,
// and feature bits that follow the libraries this machine has: libibverbs loaded at run
// time (verbs/ibverbs_dl.h), the CUDA driver found through $OTE_CUDA_LIBRARY.
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <stdlib.h>

#include <string>

#include "ote/ote.h"
#include "tests/cuda/cuda_test_util.h"

TEST(Version, MatchesTheHeader) {
    std::string want = std::to_string(OTE_VERSION_MAJOR) + "." + std::to_string(OTE_VERSION_MINOR) +
                       "." + std::to_string(OTE_VERSION_PATCH);
    EXPECT_EQ(std::string(ote_version()), want);
    EXPECT_EQ(ote_version(), ote_version()); // one static string
}

TEST(Features, RefusesNull) { EXPECT_EQ(ote_features(nullptr), OTE_ERR_INVALID); }

TEST(Features, FollowTheLibrariesFound) {
    // The fake CUDA driver (or the real one with OTE_TEST_REAL_CUDA) through $OTE_CUDA_LIBRARY.
    ote_cuda_test::SelectDriverLibrary();
    uint32_t f = 0;
    ASSERT_EQ(ote_features(&f), OTE_OK);
    EXPECT_TRUE(f & OTE_FEATURE_VERBS_SIM);
    EXPECT_TRUE(f & OTE_FEATURE_AUTH);
    EXPECT_TRUE(f & OTE_FEATURE_CUDA) << "OTE_CUDA_LIBRARY=" << getenv("OTE_CUDA_LIBRARY");
    // rdma_core: exactly when libibverbs loads here (scripts/deps.sh installs it).
    void *h = dlopen("libibverbs.so.1", RTLD_LAZY | RTLD_LOCAL);
    EXPECT_EQ((f & OTE_FEATURE_RDMA_CORE) != 0, h != nullptr);
    if (h != nullptr) dlclose(h);
}

// libibverbs is looked for once per process, so the missing-library case runs in a child.
static int RdmaWithoutLibibverbs() {
    setenv("OTE_IBVERBS_LIBRARY", "/nonexistent/libibverbs.so.1", 1);
    setenv("OTE_CUDA_LIBRARY", "/nonexistent/libcuda.so.1", 1);
    uint32_t f = 0;
    if (ote_features(&f) != OTE_OK || (f & (OTE_FEATURE_RDMA_CORE | OTE_FEATURE_CUDA))) return 2;
    ote_config_t *cfg = nullptr;
    if (ote_config_create(&cfg) != OTE_OK) return 3;
    ote_config_set(cfg, "transports", "rdma");
    ote_config_set(cfg, "verbs_provider", "rdma-core");
    ote_engine_t *e = nullptr;
    ote_status_t st = ote_engine_create(cfg, &e);
    if (st == OTE_OK) {
        ote_engine_destroy(e);
        ote_config_destroy(cfg);
        return 4;
    }
    // tcp in the same process is not affected.
    ote_config_set(cfg, "transports", "tcp");
    ote_status_t tcp = ote_engine_create(cfg, &e);
    ote_config_destroy(cfg);
    if (tcp != OTE_OK) return 5;
    if (ote_engine_destroy(e) != OTE_OK) return 6;
    return ote_status_code(st) == OTE_ERR_UNSUPPORTED ? 0 : 7;
}

TEST(FeaturesDeathTest, RdmaWithoutLibibverbsFailsAndTcpWorks) {
    ::testing::GTEST_FLAG(death_test_style) = "threadsafe";
    EXPECT_EXIT(exit(RdmaWithoutLibibverbs()), ::testing::ExitedWithCode(0),
                "cannot load /nonexistent/libibverbs.so.1");
}

/*
 * engine/version.c - ote_version() and ote_features(): what a program can ask of the
 * library before creating an engine.
 */
#include "base/status.h"
#include "cuda/driver.h"
#include "ote/ote.h"
#include "verbs/verbs.h"

#define STR_(x) #x
#define STR(x) STR_(x)

const char *ote_version(void) {
    return STR(OTE_VERSION_MAJOR) "." STR(OTE_VERSION_MINOR) "." STR(OTE_VERSION_PATCH);
}

ote_status_t ote_features(uint32_t *features_out) {
    if (features_out == NULL) return OTE_ERR_INVALID;
    uint32_t f = OTE_FEATURE_VERBS_SIM | OTE_FEATURE_AUTH;
    if (ote_verbs_provider_available("rdma-core")) f |= OTE_FEATURE_RDMA_CORE;
    if (ote_cuda_driver_present(NULL)) f |= OTE_FEATURE_CUDA;
    *features_out = f;
    return OTE_OK;
}

/*
 * base/status.h - OrbitTE status codes, as the layers use them.
 *
 * The codes, ote_status_t and the functions that name and classify a status are public
 * API and defined once, in <ote/status.h> (base/include/ote/status.h, target
 * //base:status_api, which has no dependencies; the engine re-exports it). This header includes it and adds
 * what only the layers need: combining a code with an errno and mapping an errno.
 */
#ifndef OTE_BASE_STATUS_H
#define OTE_BASE_STATUS_H

#include <stddef.h>
#include <stdint.h>

/* Workspace-relative like every include here, so compilers outside Bazel (the fuzzer's
 * clang) need only the repository root on their include path. */
#include "base/include/ote/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Combine a code with the errno of the native call that failed (err 0 = none). */
static inline ote_status_t ote_status_make(int code, int err) {
    if (code == OTE_OK) return OTE_OK;
    if (err < 0) err = -err;
    if (err > 0x7fff) err = 0x7fff;
    return (ote_status_t)((uint32_t)code | ((uint32_t)err << 16));
}

/* Map an errno value from a native call to a status carrying it. */
ote_status_t ote_status_from_errno(int err);

#ifdef __cplusplus
}
#endif
#endif

/*
 * <ote/status.h> - OrbitTE status codes (part of the public API, included by <ote/ote.h>).
 *
 * Every fallible function in OrbitTE returns an ote_status_t. A status is a code
 * (grouped by blast radius: one request, one peer/endpoint, a whole context or device)
 * optionally combined with the errno of the native call that failed, so the cause of a
 * native failure is never lost on the way up. Compare codes with ote_status_code():
 *
 *     if (ote_status_code(st) == OTE_ERR_NATIVE) ... ote_status_errno(st) ...
 *
 * Codes without an errno compare equal to their plain enum value.
 *
 * This is the one definition of the codes, owned by the bottom layer (base/include:
 * target //base:status_api, which depends on nothing): base/status.h, which every layer
 * includes, includes this header and adds what only the layers use (ote_status_make,
 * ote_status_from_errno); the engine's public API re-exports it (<ote/ote.h> includes
 * it). The functions are implemented in base/status.c.
 */
#ifndef OTE_OTE_STATUS_H
#define OTE_OTE_STATUS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int32_t ote_status_t;

enum {
    OTE_OK = 0,

    /* Request scope (1..99): this request or call failed; nothing else is affected. */
    OTE_ERR_INVALID = 1,      /* bad argument or malformed input */
    OTE_ERR_NOMEM = 2,        /* allocation failed */
    OTE_ERR_ACCESS = 3,       /* outside registrations or permissions */
    OTE_ERR_NOT_FOUND = 4,    /* no such object */
    OTE_ERR_EXISTS = 5,       /* object already exists */
    OTE_ERR_BUSY = 6,         /* object in use; retry after its users finish */
    OTE_ERR_AGAIN = 7,        /* resource temporarily exhausted; retry */
    OTE_ERR_TIMEOUT = 8,      /* deadline passed */
    OTE_ERR_CANCELED = 9,     /* canceled by the caller */
    OTE_ERR_UNSUPPORTED = 10, /* operation not supported by this provider/build */
    OTE_ERR_TOO_BIG = 11,     /* size over a limit */
    OTE_ERR_FAULT = 12,       /* injected by a fault point (tests only) */
    OTE_ERR_STATE = 13,       /* object is in a state that forbids the call */

    /* Peer / endpoint scope (100..199): the peer or connection is unusable. */
    OTE_ERR_PEER_LOST = 100,     /* peer died or connection dropped */
    OTE_ERR_PROTOCOL = 101,      /* malformed or unexpected message from the peer */
    OTE_ERR_VERSION = 102,       /* protocol version mismatch */
    OTE_ERR_CONNECT = 103,       /* could not connect to the peer */
    OTE_ERR_REMOTE_ACCESS = 104, /* the remote side refused access */
    OTE_ERR_REMOTE = 105,        /* the remote side failed the request */
    OTE_ERR_AUTH = 106,          /* authentication failed: wrong key, or a key on one side only */

    /* Context / device scope (200..299): a device, port or native owner failed. */
    OTE_ERR_NATIVE = 200,       /* a native call failed; see ote_status_errno() */
    OTE_ERR_NO_DEVICE = 201,    /* no usable device */
    OTE_ERR_PORT_DOWN = 202,    /* selected port is not active */
    OTE_ERR_DEVICE_FATAL = 203, /* device reported a fatal error */
    OTE_ERR_RETAINED = 204,     /* native destroy failed; the owner was retained */
    OTE_ERR_FENCED = 205,       /* queue fenced after an unknown outcome */
    OTE_ERR_IO = 206,           /* local I/O error */
};

typedef enum {
    OTE_SCOPE_NONE = 0,
    OTE_SCOPE_REQUEST = 1,
    OTE_SCOPE_PEER = 2,
    OTE_SCOPE_CONTEXT = 3,
} ote_status_scope_t;

static inline int ote_status_code(ote_status_t st) { return (int)((uint32_t)st & 0xffffu); }
static inline int ote_status_errno(ote_status_t st) {
    return (int)(((uint32_t)st >> 16) & 0x7fffu);
}
static inline int ote_status_is_ok(ote_status_t st) { return st == OTE_OK; }

/* Static name of the status code, e.g. "OTE_ERR_PEER_LOST". Never NULL. */
const char *ote_status_str(ote_status_t st);

/* Human description: "OTE_ERR_NATIVE (context): native call failed: errno 12 (Cannot
 * allocate memory)". Always NUL-terminates when len > 0; returns buf. */
const char *ote_status_describe(ote_status_t st, char *buf, size_t len);

/* The blast radius of a status: one request, one peer, or a whole context/device. */
ote_status_scope_t ote_status_scope(ote_status_t st);

#ifdef __cplusplus
}
#endif
#endif

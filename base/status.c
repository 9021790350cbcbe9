#include "base/status.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

ote_status_t ote_status_from_errno(int err) {
    if (err < 0) err = -err;
    switch (err) {
        case 0: return OTE_OK;
        case ENOMEM: return ote_status_make(OTE_ERR_NOMEM, err);
        case EINVAL: return ote_status_make(OTE_ERR_INVALID, err);
        case EBUSY: return ote_status_make(OTE_ERR_BUSY, err);
        case EAGAIN: return ote_status_make(OTE_ERR_AGAIN, err);
        case ETIMEDOUT: return ote_status_make(OTE_ERR_TIMEOUT, err);
        case EOPNOTSUPP: return ote_status_make(OTE_ERR_UNSUPPORTED, err);
        case EACCES:
        case EPERM: return ote_status_make(OTE_ERR_ACCESS, err);
        case ENOENT:
        case ENODEV: return ote_status_make(OTE_ERR_NOT_FOUND, err);
        case ECONNREFUSED:
        case EHOSTUNREACH:
        case ENETUNREACH: return ote_status_make(OTE_ERR_CONNECT, err);
        case ECONNRESET:
        case EPIPE:
        case ENOTCONN: return ote_status_make(OTE_ERR_PEER_LOST, err);
        default: return ote_status_make(OTE_ERR_NATIVE, err);
    }
}

const char *ote_status_str(ote_status_t st) {
    switch (ote_status_code(st)) {
        case OTE_OK: return "OTE_OK";
        case OTE_ERR_INVALID: return "OTE_ERR_INVALID";
        case OTE_ERR_NOMEM: return "OTE_ERR_NOMEM";
        case OTE_ERR_ACCESS: return "OTE_ERR_ACCESS";
        case OTE_ERR_NOT_FOUND: return "OTE_ERR_NOT_FOUND";
        case OTE_ERR_EXISTS: return "OTE_ERR_EXISTS";
        case OTE_ERR_BUSY: return "OTE_ERR_BUSY";
        case OTE_ERR_AGAIN: return "OTE_ERR_AGAIN";
        case OTE_ERR_TIMEOUT: return "OTE_ERR_TIMEOUT";
        case OTE_ERR_CANCELED: return "OTE_ERR_CANCELED";
        case OTE_ERR_UNSUPPORTED: return "OTE_ERR_UNSUPPORTED";
        case OTE_ERR_TOO_BIG: return "OTE_ERR_TOO_BIG";
        case OTE_ERR_FAULT: return "OTE_ERR_FAULT";
        case OTE_ERR_STATE: return "OTE_ERR_STATE";
        case OTE_ERR_PEER_LOST: return "OTE_ERR_PEER_LOST";
        case OTE_ERR_PROTOCOL: return "OTE_ERR_PROTOCOL";
        case OTE_ERR_VERSION: return "OTE_ERR_VERSION";
        case OTE_ERR_CONNECT: return "OTE_ERR_CONNECT";
        case OTE_ERR_REMOTE_ACCESS: return "OTE_ERR_REMOTE_ACCESS";
        case OTE_ERR_REMOTE: return "OTE_ERR_REMOTE";
        case OTE_ERR_AUTH: return "OTE_ERR_AUTH";
        case OTE_ERR_NATIVE: return "OTE_ERR_NATIVE";
        case OTE_ERR_NO_DEVICE: return "OTE_ERR_NO_DEVICE";
        case OTE_ERR_PORT_DOWN: return "OTE_ERR_PORT_DOWN";
        case OTE_ERR_DEVICE_FATAL: return "OTE_ERR_DEVICE_FATAL";
        case OTE_ERR_RETAINED: return "OTE_ERR_RETAINED";
        case OTE_ERR_FENCED: return "OTE_ERR_FENCED";
        case OTE_ERR_IO: return "OTE_ERR_IO";
        default: return "OTE_ERR_UNKNOWN";
    }
}

ote_status_scope_t ote_status_scope(ote_status_t st) {
    int code = ote_status_code(st);
    if (code == OTE_OK) return OTE_SCOPE_NONE;
    if (code < 100) return OTE_SCOPE_REQUEST;
    if (code < 200) return OTE_SCOPE_PEER;
    return OTE_SCOPE_CONTEXT;
}

const char *ote_status_describe(ote_status_t st, char *buf, size_t len) {
    static const char *const scope_names[] = {"ok", "request", "peer", "context"};
    if (buf == NULL || len == 0) return buf;
    int err = ote_status_errno(st);
    const char *scope = scope_names[ote_status_scope(st)];
    if (err != 0) {
        char ebuf[128];
        /* GNU strerror_r returns the message pointer (may not use ebuf). */
        const char *msg = strerror_r(err, ebuf, sizeof(ebuf));
        snprintf(buf, len, "%s (%s): errno %d (%s)", ote_status_str(st), scope, err, msg);
    } else {
        snprintf(buf, len, "%s (%s)", ote_status_str(st), scope);
    }
    return buf;
}

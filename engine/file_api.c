/*
 * engine/file_api.c - the public calls of file registrations (<ote/ote.h>, "files"):
 * argument checks and the engine's log tag around the file owner (engine/file/file.h).
 * The local segment that moves their bytes is opened in engine.c with the others.
 */
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "engine/core_internal.h"
#include "engine/file/file.h"

ote_status_t ote_file_register(ote_engine_t *e, const char *path, int fd, uint64_t offset,
                               uint64_t len, unsigned perms, const char *name, uint64_t *addr_out) {
    if (e == NULL || addr_out == NULL) return OTE_ERR_INVALID;
    if (OTE__ENGINE_GONE(e)) return OTE_ERR_STATE;
    const char *prev = ote_log_set_thread_engine(e->self_addr);
    ote_status_t st = ote__files_register(e->files, path, fd, offset, len, perms, name, addr_out);
    ote_log_set_thread_engine(prev);
    return st;
}

ote_status_t ote_file_unregister(ote_engine_t *e, uint64_t addr) {
    if (e == NULL) return OTE_ERR_INVALID;
    if (OTE__ENGINE_GONE(e)) return OTE_ERR_STATE;
    return ote__files_unregister(e->files, addr);
}

ote_status_t ote_file_query(ote_engine_t *e, uint64_t addr, ote_buffer_info_t *info_out) {
    if (e == NULL || info_out == NULL) return OTE_ERR_INVALID;
    if (OTE__ENGINE_GONE(e)) return OTE_ERR_STATE;
    return ote__files_query(e->files, addr, info_out);
}

ote_status_t ote_file_engine(ote_engine_t *e, char *buf, size_t len) {
    if (e == NULL || buf == NULL || len == 0) return OTE_ERR_INVALID;
    if (OTE__ENGINE_GONE(e)) return OTE_ERR_STATE;
    const char *k = ote__files_engine(e->files);
    if (strlen(k) >= len) return OTE_ERR_TOO_BIG;
    snprintf(buf, len, "%s", k);
    return OTE_OK;
}

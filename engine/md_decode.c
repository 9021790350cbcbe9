/*
 * engine/md_decode.c - the accessors of an engine metadata blob (ote_engine_metadata)
 * that need nothing but the control plane's decoder: the engine's name, and its address
 * and incarnation. A file of its own so that the fuzzer of the naming value
 * (tests/fuzz/nval_fuzz.c) links the same code the engine runs.
 */
#include <string.h>

#include <ote/ote.h>

#include "engine/control/ctl.h"

ote_status_t ote_engine_metadata_name(const void *md, size_t len, char *name, size_t cap) {
    if (md == NULL || name == NULL) return OTE_ERR_INVALID;
    ote_ctl_md_t m;
    if (ote_ctl_md_decode(md, len, &m) != OTE_OK) return OTE_ERR_PROTOCOL;
    size_t n = strlen(m.name);
    if (n >= cap) return OTE_ERR_TOO_BIG;
    memcpy(name, m.name, n + 1);
    return OTE_OK;
}

ote_status_t ote_engine_metadata_peer(const void *md, size_t len, char *addr, size_t cap,
                                      uint64_t *epoch_out) {
    if (md == NULL || addr == NULL || epoch_out == NULL) return OTE_ERR_INVALID;
    ote_ctl_md_t m;
    if (ote_ctl_md_decode(md, len, &m) != OTE_OK) return OTE_ERR_PROTOCOL;
    size_t n = strlen(m.addr);
    if (n >= cap) return OTE_ERR_TOO_BIG;
    memcpy(addr, m.addr, n + 1);
    *epoch_out = m.epoch;
    return OTE_OK;
}

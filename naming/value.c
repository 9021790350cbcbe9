/* naming/value.c - the versioned value stored under a name (naming_internal.h). */
#include <string.h>

#include "base/alloc.h"
#include "base/le.h"
#include "naming/naming_internal.h"

int ote__name_ok(const char *name, size_t max) {
    if (name == NULL) return 0;
    size_t n = strnlen(name, max + 1);
    if (n == 0 || n > max) return 0;
    for (size_t i = 0; i < n; i++)
        if (name[i] <= ' ' || name[i] > '~') return 0;
    return 1;
}

ote_status_t ote__nval_encode(const char *name, const void *md, size_t md_len, uint8_t **out,
                              size_t *len_out) {
    if (!ote__name_ok(name, OTE_NAMING_NAME_MAX) || md == NULL || md_len == 0 ||
        md_len > OTE__NVAL_MD_MAX || out == NULL || len_out == NULL)
        return OTE_ERR_INVALID;
    size_t nl = strlen(name);
    size_t len = OTE__NVAL_HDR_LEN + nl + md_len;
    uint8_t *v = ote_malloc(len);
    if (v == NULL) return OTE_ERR_NOMEM;
    ote_le_put32(v, OTE__NVAL_MAGIC);
    ote_le_put16(v + 4, OTE__NVAL_VERSION);
    ote_le_put16(v + 6, (uint16_t)nl);
    ote_le_put32(v + 8, (uint32_t)md_len);
    memcpy(v + OTE__NVAL_HDR_LEN, name, nl);
    memcpy(v + OTE__NVAL_HDR_LEN + nl, md, md_len);
    *out = v;
    *len_out = len;
    return OTE_OK;
}

ote_status_t ote__nval_decode(const uint8_t *val, size_t len, const char *name,
                              const uint8_t **md_out, size_t *md_len_out,
                              ote_naming_entry_t *entry_out) {
    if (val == NULL || name == NULL || len < OTE__NVAL_HDR_LEN) return OTE_ERR_PROTOCOL;
    if (ote_le_get32(val) != OTE__NVAL_MAGIC || ote_le_get16(val + 4) != OTE__NVAL_VERSION)
        return OTE_ERR_PROTOCOL;
    size_t nl = ote_le_get16(val + 6);
    size_t ml = ote_le_get32(val + 8);
    if (nl == 0 || nl > OTE_NAMING_NAME_MAX || ml == 0 || ml > OTE__NVAL_MD_MAX ||
        len != OTE__NVAL_HDR_LEN + nl + ml)
        return OTE_ERR_PROTOCOL;
    /* A value copied under another key is not this name's; a name that could not have
     * been published (ote__nval_encode refuses it) is no name's. */
    if (strlen(name) != nl || memcmp(val + OTE__NVAL_HDR_LEN, name, nl) != 0 ||
        !ote__name_ok(name, OTE_NAMING_NAME_MAX))
        return OTE_ERR_PROTOCOL;
    const uint8_t *md = val + OTE__NVAL_HDR_LEN + nl;
    ote_naming_entry_t e;
    if (ote_engine_metadata_peer(md, ml, e.addr, sizeof(e.addr), &e.epoch) != OTE_OK)
        return OTE_ERR_PROTOCOL;
    if (md_out != NULL) *md_out = md;
    if (md_len_out != NULL) *md_len_out = ml;
    if (entry_out != NULL) *entry_out = e;
    return OTE_OK;
}

/*
 * tests/fuzz/nval_fuzz.c - libFuzzer target over the value stored under a name
 * (naming/value.c: the OTNM envelope around an engine metadata blob). Built by
 * tests/fuzz/run_fuzz.sh with clang -fsanitize=fuzzer,address,undefined.
 *
 * The input is one value as read from the store. It is decoded for the name it carries
 * (when its header's name length fits the input) and for a fixed other name. What decodes
 * must satisfy the bounds the naming handle relies on (the exact length, the name it was
 * asked for, the metadata inside the value, an address NUL-terminated, a nonzero epoch),
 * must never decode for another name, and must survive a round trip: encoded again from
 * its name and metadata it is the same bytes.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/le.h"
#include "engine/control/ctl.h"
#include "naming/naming_internal.h"

static void check(int cond) {
    if (!cond) __builtin_trap();
}

static void decode_as(const uint8_t *data, size_t size, const char *name) {
    const uint8_t *md = NULL;
    size_t ml = 0;
    ote_naming_entry_t e;
    memset(&e, 0xa5, sizeof(e));
    if (ote__nval_decode(data, size, name, &md, &ml, &e) != OTE_OK) {
        check(md == NULL && ml == 0); /* outputs untouched on failure */
        return;
    }
    size_t nl = strlen(name);
    check(size == OTE__NVAL_HDR_LEN + nl + ml && ml >= 1 && ml <= OTE__NVAL_MD_MAX);
    check(md == data + OTE__NVAL_HDR_LEN + nl);
    check(memcmp(data + OTE__NVAL_HDR_LEN, name, nl) == 0 && ote__name_ok(name, nl));
    check(e.epoch != 0 && memchr(e.addr, '\0', sizeof(e.addr)) != NULL);
    /* Never another name's: one byte longer, or one byte changed. */
    char other[OTE_NAMING_NAME_MAX + 2];
    memcpy(other, name, nl + 1);
    other[0] = other[0] == 'x' ? 'y' : 'x';
    check(ote__nval_decode(data, size, other, NULL, NULL, NULL) == OTE_ERR_PROTOCOL);
    /* The round trip. */
    uint8_t *again = NULL;
    size_t alen = 0;
    check(ote__nval_encode(name, md, ml, &again, &alen) == OTE_OK);
    check(alen == size && memcmp(again, data, size) == 0);
    ote_free(again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    decode_as(data, size, "decode-3");
    if (size < OTE__NVAL_HDR_LEN) return 0;
    size_t nl = ote_le_get16(data + 6);
    if (nl == 0 || nl > OTE_NAMING_NAME_MAX || size < OTE__NVAL_HDR_LEN + nl) return 0;
    char name[OTE_NAMING_NAME_MAX + 1];
    memcpy(name, data + OTE__NVAL_HDR_LEN, nl);
    name[nl] = '\0';
    if (strlen(name) == nl) decode_as(data, size, name);
    return 0;
}

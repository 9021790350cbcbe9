/*
 * base/list.h - the one parser of separated lists: the configuration's "shm,tcp",
 * "staging,ipc" and rdma_pin, a peer's advertised transports, RDMA device lists,
 * verbs/sim's "item;item" configuration of "key=value,key=value" items and ote_bench's
 * options.
 *
 * One grammar for every caller: "" (or NULL) is the empty list, with no item. Otherwise
 * a list with N separators has N + 1 items, each the bytes between two separators, and
 * an item may be empty: "a,,b" has an empty second item and "a," an empty last one.
 * Nothing is trimmed or case-folded here, so " tcp" and "TCP" are not "tcp". A caller
 * that is more lenient (skips empty items, trims leading blanks, as the RDMA device
 * lists do) does so at its call site, where the rule is written down.
 *
 * An item is a view (pointer and length) into the caller's string, which only
 * ote_list_cut writes, when asked to. No allocation, no lock, no log line; thread-safe.
 */
#ifndef OTE_BASE_LIST_H
#define OTE_BASE_LIST_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define OTE_LIST_MAX_NAMES 32 /* names ote_list_match can tell apart (bits of its mask) */

/* Where a walk over a list stands. */
typedef struct {
    const char *next; /* the first byte of the next item; NULL after the last one */
    char sep;         /* the separator, ',' for a comma list */
} ote_list_iter_t;

/* A walk over the items of list (NULL or "": none) separated by sep. */
ote_list_iter_t ote_list_iter(const char *list, char sep);

/* The next item, not NUL-terminated: true with *item_out and *len_out set, false (outputs
 * untouched) after the last item. The walk has already moved past the item's separator
 * when this returns, so the owner of a writable list may overwrite that separator, e.g.
 * with ote_list_cut. */
bool ote_list_next(ote_list_iter_t *it, const char **item_out, size_t *len_out);

/* Whether the item (item, len) is exactly name. */
bool ote_list_item_is(const char *item, size_t len, const char *name);

/* Whether some item of the comma list is exactly name. */
bool ote_list_has(const char *list, const char *name);

/* Every item of the comma list must be one of names[0..nnames), each at most once:
 * *mask_out gets bit i for names[i] (0 for ""). OTE_ERR_INVALID, *mask_out untouched,
 * for an item that is none of them (an empty one included) or that repeats one, for
 * more than OTE_LIST_MAX_NAMES names or for a NULL argument. */
ote_status_t ote_list_match(const char *list, const char *const *names, size_t nnames,
                            unsigned *mask_out);

/* The item (item, len) of buf, a writable list being walked, as a NUL-terminated string:
 * the byte after the item (its separator, or buf's NUL) becomes '\0'. Returns the item's
 * start as a writable pointer into buf. */
char *ote_list_cut(char *buf, const char *item, size_t len);

#ifdef __cplusplus
}
#endif
#endif

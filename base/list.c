/* base/list.c - separated lists: items, membership, names matched once (see list.h). */
#include "base/list.h"

#include <string.h>

ote_list_iter_t ote_list_iter(const char *list, char sep) {
    ote_list_iter_t it = {.next = (list != NULL && list[0] != '\0') ? list : NULL, .sep = sep};
    return it;
}

bool ote_list_next(ote_list_iter_t *it, const char **item_out, size_t *len_out) {
    if (it == NULL || it->next == NULL) return false;
    const char *p = it->next;
    const char *end = strchr(p, it->sep);
    size_t len = end != NULL ? (size_t)(end - p) : strlen(p);
    it->next = end != NULL ? end + 1 : NULL; /* "a," still has its empty last item */
    *item_out = p;
    *len_out = len;
    return true;
}

bool ote_list_item_is(const char *item, size_t len, const char *name) {
    return strlen(name) == len && memcmp(item, name, len) == 0;
}

bool ote_list_has(const char *list, const char *name) {
    if (name == NULL) return false;
    ote_list_iter_t it = ote_list_iter(list, ',');
    const char *item;
    size_t len;
    while (ote_list_next(&it, &item, &len))
        if (ote_list_item_is(item, len, name)) return true;
    return false;
}

ote_status_t ote_list_match(const char *list, const char *const *names, size_t nnames,
                            unsigned *mask_out) {
    if (list == NULL || names == NULL || mask_out == NULL || nnames > OTE_LIST_MAX_NAMES)
        return OTE_ERR_INVALID;
    unsigned seen = 0;
    ote_list_iter_t it = ote_list_iter(list, ',');
    const char *item;
    size_t len;
    while (ote_list_next(&it, &item, &len)) {
        size_t i = 0;
        while (i < nnames && !ote_list_item_is(item, len, names[i])) i++;
        if (i == nnames || (seen & (1u << i)) != 0) return OTE_ERR_INVALID;
        seen |= 1u << i;
    }
    *mask_out = seen;
    return OTE_OK;
}

char *ote_list_cut(char *buf, const char *item, size_t len) {
    char *s = buf + (item - buf);
    s[len] = '\0';
    return s;
}

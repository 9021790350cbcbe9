/* engine/src_account.c - the source's account of each request (see src_account.h). */
#include "engine/src_account.h"

#include <string.h>

#include "base/alloc.h"

ote__acct_t *ote__acct_find(ote__acct_set_t *set, uint64_t scope, uint64_t uid) {
    ote__acct_key_t key;
    memset(&key, 0, sizeof(key));
    key.scope = scope;
    key.uid = uid;
    ote__acct_t *a = NULL;
    HASH_FIND(hh, set->by_key, &key, sizeof(key), a);
    return a;
}

ote__acct_t *ote__acct_get(ote__acct_set_t *set, uint64_t scope, uint64_t uid, uint64_t req_len,
                           int may_create, int *created) {
    *created = 0;
    ote__acct_t *a = ote__acct_find(set, scope, uid);
    if (a != NULL || !may_create) return a;
    if ((a = ote_calloc(1, sizeof(*a))) == NULL) return NULL;
    a->key.scope = scope;
    a->key.uid = uid;
    a->req_len = req_len;
    a->left = req_len;
    ote_status_t st;
    OTE_HASH_ADD(hh, set->by_key, key, sizeof(a->key), a, st);
    if (st != OTE_OK) {
        ote_free(a);
        return NULL;
    }
    set->n++;
    *created = 1;
    return a;
}

ote_status_t ote__acct_admit(ote__acct_t *a, uint64_t req_addr, uint64_t req_len, uint32_t op,
                             uint64_t len, int *first) {
    *first = 0;
    if (a->req_len != req_len || (a->opened && a->op != op) ||
        ((a->opened || a->req_addr != 0) && a->req_addr != req_addr) || len > a->left)
        return OTE_ERR_INVALID;
    if (!a->opened) {
        a->opened = 1;
        a->op = op;
        a->req_addr = req_addr;
        *first = 1;
    }
    return OTE_OK;
}

void ote__acct_open(ote__acct_t *a, ote_status_t st, void *pin) {
    a->st = st;
    a->pin = st == OTE_OK ? pin : NULL;
}

ote_status_t ote__acct_hold(ote__acct_t *a, uint64_t len) {
    ote_status_t st = ote__acct_canceled(a) ? OTE_ERR_CANCELED : a->st;
    if (st != OTE_OK) return st;
    a->left -= len < a->left ? len : a->left;
    a->held += len;
    return OTE_OK;
}

/* a unlinked when nothing of it is left to come, held or staging. */
static ote__acct_t *maybe_end(ote__acct_set_t *set, ote__acct_t *a) {
    if (a->left != 0 || a->held != 0 || a->staging != 0) return NULL;
    HASH_DEL(set->by_key, a);
    set->n--;
    return a;
}

ote__acct_t *ote__acct_settle(ote__acct_set_t *set, ote__acct_t *a, uint64_t seen, uint64_t done) {
    a->left -= seen < a->left ? seen : a->left;
    a->held -= done < a->held ? done : a->held;
    return maybe_end(set, a);
}

void ote__acct_stage(ote__acct_t *a, uint64_t len) { a->staging += len; }

ote__acct_t *ote__acct_unstage(ote__acct_set_t *set, ote__acct_t *a, uint64_t len) {
    a->staging -= len < a->staging ? len : a->staging;
    return maybe_end(set, a);
}

void ote__acct_free(ote__acct_t *a) { ote_free(a); }

size_t ote__acct_end_scope(ote__acct_set_t *set, uint64_t scope, int all, int drop_held,
                           void (*end)(void *arg, ote__acct_t *a), void *arg) {
    size_t n = 0;
    ote__acct_t *a, *tmp;
    HASH_ITER(hh, set->by_key, a, tmp) {
        if (!all && a->key.scope != scope) continue;
        a->left = 0; /* nothing more will come */
        if (drop_held) a->held = 0;
        if (a->held != 0 || a->staging != 0) continue; /* ends with its last piece */
        HASH_DEL(set->by_key, a);
        set->n--;
        end(arg, a);
        n++;
    }
    return n;
}

/*
 * engine/src_account.h - the source's account of each request: one check and one pin per
 * request, on every transport (tcp, shm, rdma).
 *
 * A requester names, in every piece it sends (a TCP slice, an shm piece, an RDMA grant),
 * its request's id and extent. The source keeps one account per (scope, request id) - the
 * scope is what the ids are unique in: a TCP session, an shm or RDMA control connection.
 * The first piece to arrive opens the account: it checks the request's whole extent
 * against the engine's registrations and pins it once (the transport calls host->pin and
 * reports with ote__acct_open), or records the refusal that every later piece gets. Each
 * served piece holds its bytes of the account while it is served; bytes that will never
 * be served (refused pieces, pieces the requester wrote off) are "seen". The account ends
 * when every byte of the request is seen or done, and its pin is then released (by the
 * caller, with no lock held). What a scope leaves open ends when the scope ends (the
 * requester's connections closed). So an unregister of the range is BUSY from a request's
 * first piece to its last, and a request is served whole or refused whole.
 *
 * A piece the source cannot account for (no request id, a one-piece request, no memory,
 * too many requests open) may pin alone: ote__acct_pin_alone tags the engine's pin so that
 * one handle type serves both (ote__acct_engine_pin, ote__acct_is_alone).
 *
 * Locking is the caller's: a set and its accounts are touched under the one lock the
 * transport keeps for them (none where one thread owns the scope); only `canceled` is
 * atomic, for readers outside that lock. Nothing here calls the engine or logs. (The
 * header is C and C++: tests include it.)
 */
#ifndef OTE_ENGINE_SRC_ACCOUNT_H
#define OTE_ENGINE_SRC_ACCOUNT_H

#include <stddef.h>
#include <stdint.h>

#include "base/hash.h"
#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ote__acct_key {
    uint64_t scope; /* the transport's scope (a session id, a connection's address) */
    uint64_t uid;   /* the request's id in that scope */
} ote__acct_key_t;

typedef struct ote__acct {
    ote__acct_key_t key;
    UT_hash_handle hh;
    int opened;      /* a piece checked the extent (st says how it went) */
    ote_status_t st; /* OTE_OK, or the refusal every piece of the request gets */
    void *pin;       /* the engine's pin of the extent (NULL unless opened OK) */
    uint64_t req_addr, req_len;
    uint32_t op;            /* the first piece's operation (transport-defined, nonzero) */
    uint64_t left;          /* bytes not yet seen (arrived as a piece, or written off) */
    uint64_t held;          /* bytes of pieces being served now */
    uint64_t staging;       /* bytes of pieces whose bytes are being staged (copied to a
                             * bounce) before they are held: the account lives on */
    int canceled;           /* the requester canceled it (atomic: ote__acct_cancel/_canceled) */
    int mode;               /* the transport's: how the request is served (e.g. staged) */
    struct ote__acct *link; /* free for the transport's use once the account ended */
} ote__acct_t;

/* One lock's accounts (a transport's, or a scope's). Zero-initialized is empty. */
typedef struct {
    ote__acct_t *by_key; /* uthash */
    size_t n;
} ote__acct_set_t;

/* The account of (scope, uid), or NULL. */
ote__acct_t *ote__acct_find(ote__acct_set_t *set, uint64_t scope, uint64_t uid);
/* The same, created (unopened, req_len bytes left) when absent and *may_create; *created
 * says whether it was. NULL: absent and not created, or out of memory. */
ote__acct_t *ote__acct_get(ote__acct_set_t *set, uint64_t scope, uint64_t uid, uint64_t req_len,
                           int may_create, int *created);
/* Whether a piece of len bytes of the request (req_addr, req_len, op) belongs to a: the
 * request its first piece named (and the address the transport set at creation, where
 * its write-offs name one), and no more bytes than are left. OTE_ERR_INVALID when
 * not (nothing changes). *first: this piece opens the account (op and address are taken
 * now; the caller checks and pins the extent and reports with ote__acct_open). */
ote_status_t ote__acct_admit(ote__acct_t *a, uint64_t req_addr, uint64_t req_len, uint32_t op,
                             uint64_t len, int *first);
/* The first piece's check: st and, on OTE_OK, the engine's pin (held until the end). */
void ote__acct_open(ote__acct_t *a, ote_status_t st, void *pin);
/* A piece of len bytes: the request's answer (its refusal, or CANCELED once canceled);
 * OTE_OK: the piece holds its bytes (left -> held) until settled as done. */
ote_status_t ote__acct_hold(ote__acct_t *a, uint64_t len);
/* Accounts bytes: seen (will never be held) and done (were held, now served). When nothing
 * is left to come and nothing is held, a is unlinked and returned: the caller releases its
 * pin (no lock held) and frees it with ote__acct_free. NULL while it lives on. */
ote__acct_t *ote__acct_settle(ote__acct_set_t *set, ote__acct_t *a, uint64_t seen, uint64_t done);
void ote__acct_free(ote__acct_t *a);
/* A piece of len bytes is being staged (its copy runs without the caller's lock): the
 * account cannot end, whatever is settled meanwhile (a write-off of the request, the end
 * of its scope), until ote__acct_unstage of the same len. */
void ote__acct_stage(ote__acct_t *a, uint64_t len);
/* The staging of len bytes ended (the piece was held, refused or settled meanwhile): like
 * ote__acct_settle, a that ends now is unlinked and returned, else NULL. */
ote__acct_t *ote__acct_unstage(ote__acct_set_t *set, ote__acct_t *a, uint64_t len);
/* Ends the accounts of scope (every scope: all != 0): nothing more will come, so each one
 * nothing holds is unlinked and handed to end(arg, a) (which releases its pin and frees
 * it); with drop_held also those still held (no piece is left: teardown); never one
 * staging (it ends at its ote__acct_unstage). Returns how many ended. end runs under the caller's lock: it may collect, not call the engine. */
size_t ote__acct_end_scope(ote__acct_set_t *set, uint64_t scope, int all, int drop_held,
                           void (*end)(void *arg, ote__acct_t *a), void *arg);

/* Marks a canceled (any thread) / whether it is: later pieces get OTE_ERR_CANCELED. */
static inline void ote__acct_cancel(ote__acct_t *a) {
    __atomic_store_n(&a->canceled, 1, __ATOMIC_SEQ_CST);
}
static inline int ote__acct_canceled(const ote__acct_t *a) {
    return __atomic_load_n(&a->canceled, __ATOMIC_SEQ_CST);
}

/* The engine's pin (host->pin of engine/transport.h). */
typedef ote_status_t (*ote__acct_pin_fn)(void *arg, uint64_t addr, uint64_t len, unsigned perm,
                                         void **pin_out);

/* A pin held by one piece alone: the engine's pin (pin(arg, ...)) with its low bit set
 * (the engine's pins are heap objects, so the bit is free), told apart from an account.
 * Inline: every one-piece request of the data path takes one. */
#define OTE__ACCT_ALONE_BIT ((uintptr_t)1)
static inline ote_status_t ote__acct_pin_alone(ote__acct_pin_fn pinf, void *arg, uint64_t addr,
                                               uint64_t len, unsigned perm, void **pin_out) {
    void *pin = NULL;
    ote_status_t st = pinf(arg, addr, len, perm, &pin);
    if (st == OTE_OK) *pin_out = (void *)((uintptr_t)pin | OTE__ACCT_ALONE_BIT);
    return st;
}
static inline int ote__acct_is_alone(const void *pin) {
    return ((uintptr_t)pin & OTE__ACCT_ALONE_BIT) != 0;
}
/* The engine's pin of a pin held alone. */
static inline void *ote__acct_alone_pin(void *pin) {
    return (void *)((uintptr_t)pin & ~OTE__ACCT_ALONE_BIT);
}
/* The engine's pin behind a piece's pin (alone, or its account's, held while a piece
 * holds the account). */
static inline void *ote__acct_engine_pin(void *pin) {
    return ote__acct_is_alone(pin) ? ote__acct_alone_pin(pin) : ((ote__acct_t *)pin)->pin;
}

#ifdef __cplusplus
}
#endif
#endif

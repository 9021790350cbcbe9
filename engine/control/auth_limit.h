/*
 * engine/control/auth_limit.h - the back-off of peers that fail authentication, per source
 * address: a TCP or RDMA-control peer's IP (without the port), an shm requester's uid.
 *
 * An address that fails `fails` authentications within `window_ns` is put in back-off:
 * until it ends, every new connection from it is closed at accept, before anything is
 * read or sent. The first back-off lasts `backoff_min_ns`; an address in penalty that
 * fails again once its back-off is over goes straight back into back-off for twice as
 * long, up to `backoff_max_ns`. A successful authentication from the address, or
 * `quiet_ns` without a failure, forgets it. An address that never failed costs one
 * atomic load at accept while the table is empty, one hashed lookup under the table's
 * mutex otherwise.
 *
 * Memory is bounded: the table holds at most `entries` addresses, allocated at create.
 * A failure from a new address when the table is full evicts the least recently failed
 * address that is not in back-off (the least recently failed one when all are), so a
 * flood of varied addresses cannot grow it.
 *
 * Thread-safe: every call may come from any thread (the listeners run on their own).
 * Times are CLOCK_MONOTONIC nanoseconds passed in by the caller (ote_now_ns()), so the
 * policy is testable without sleeping.
 */
#ifndef OTE_ENGINE_CONTROL_AUTH_LIMIT_H
#define OTE_ENGINE_CONTROL_AUTH_LIMIT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint32_t fails;          /* failures within window_ns that start a back-off */
    uint32_t entries;        /* addresses the table holds (fixed at create) */
    uint64_t window_ns;      /* the window those failures fall in */
    uint64_t backoff_min_ns; /* the first back-off */
    uint64_t backoff_max_ns; /* the longest (doubling from backoff_min_ns) */
    uint64_t quiet_ns;       /* no failure for this long: the address is forgotten */
} ote_auth_limit_cfg_t;

/* The defaults (see auth_limit.c for why these numbers). */
void ote_auth_limit_cfg_default(ote_auth_limit_cfg_t *cfg);

/* A source address: kind 4 (IPv4, also an IPv4-mapped IPv6 address), 6 (IPv6) or 'u' (a
 * uid); kind 0: unknown (never limited). */
typedef struct {
    uint8_t kind;
    uint8_t b[16];
} ote_auth_addr_t;

/* The address of sa without its port; kind 0 for other families. */
void ote_auth_addr_of_sockaddr(const struct sockaddr *sa, socklen_t len, ote_auth_addr_t *out);
void ote_auth_addr_of_uid(uid_t uid, ote_auth_addr_t *out);
/* "1.2.3.4", "::1" or "uid 1000". */
void ote_auth_addr_str(const ote_auth_addr_t *a, char *buf, size_t len);

typedef struct ote_auth_limit ote_auth_limit_t;

/* cfg NULL: the defaults. OTE_ERR_INVALID when a field is 0 or backoff_min_ns >
 * backoff_max_ns; OTE_ERR_NOMEM. */
ote_status_t ote_auth_limit_create(const ote_auth_limit_cfg_t *cfg, ote_auth_limit_t **out);
void ote_auth_limit_destroy(ote_auth_limit_t *lim); /* NULL: nothing */

/* At accept: 1 when a is in back-off at now (the connection is to be closed at once;
 * counted, ote_auth_limit_refused and ote_auth_refused), 0 otherwise. lim NULL: 0. */
int ote_auth_limit_refuse(ote_auth_limit_t *lim, const ote_auth_addr_t *a, uint64_t now);
/* A failed authentication from a (lim NULL or a unknown: nothing). Logs a rate-limited
 * WARN when it puts a in back-off, naming transport and how long. */
void ote_auth_limit_fail(ote_auth_limit_t *lim, const char *transport, const ote_auth_addr_t *a,
                         uint64_t now);
/* A successful authentication from a: a is forgotten. */
void ote_auth_limit_ok(ote_auth_limit_t *lim, const ote_auth_addr_t *a);

/* Addresses the table holds now (tests: the bound). */
size_t ote_auth_limit_size(ote_auth_limit_t *lim);
/* Connections this table refused. */
uint64_t ote_auth_limit_refused(ote_auth_limit_t *lim);
/* Failed authentications reported to this table (ote_auth_limit_fail), from any address. */
uint64_t ote_auth_limit_failures(ote_auth_limit_t *lim);
/* Connections refused by back-off in this process, all tables together (tests). */
uint64_t ote_auth_refused(void);

/* Test hook: the configuration the tables of engines created from now on get (a key
 * loaded by ote_auth_key_load creates its table); NULL: the defaults again. */
void ote__auth_limit_test_cfg(const ote_auth_limit_cfg_t *cfg);
/* The configuration a new engine's table gets. */
void ote__auth_limit_engine_cfg(ote_auth_limit_cfg_t *cfg);

#ifdef __cplusplus
}
#endif
#endif

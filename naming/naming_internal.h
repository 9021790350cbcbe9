/*
 * naming/naming_internal.h - the stores behind <ote/naming.h> and the value envelope.
 *
 * A store (etcd.c, redis.c) is a table of operations on whole keys; each call ends
 * within the store's timeout and is safe from any thread (the store serialises its own
 * connection). The handle (naming.c) owns caching, refreshing and watching.
 */
#ifndef OTE_NAMING_INTERNAL_H
#define OTE_NAMING_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <ote/naming.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    /* Write key = val, alive for ttl_ms: *lease (etcd's lease id; Redis: unused) is 0
     * for a new one, and the lease granted is written back. */
    ote_status_t (*put)(void *st, const char *key, const uint8_t *val, size_t len, uint32_t ttl_ms,
                        uint64_t *lease);
    /* Keep key alive for another ttl_ms; when the store lost it (lease ended, key
     * expired) it is written again, with a new lease in *lease. */
    ote_status_t (*refresh)(void *st, const char *key, const uint8_t *val, size_t len,
                            uint32_t ttl_ms, uint64_t *lease);
    /* The value of key in an ote_malloc'ed buffer; OTE_ERR_NOT_FOUND when absent. */
    ote_status_t (*get)(void *st, const char *key, uint8_t **val_out, size_t *len_out);
    /* The keys starting with prefix, each ote_malloc'ed, in an ote_malloc'ed array. */
    ote_status_t (*list)(void *st, const char *prefix, char ***keys_out, size_t *n_out);
    /* Remove key (and its lease). */
    ote_status_t (*del)(void *st, const char *key, uint64_t lease);
    void (*close)(void *st);
} ote__nstore_ops_t;

/* Connect to "host:port[,host:port...]" (etcd) or "host:port" (redis): OTE_OK with the
 * store in *st_out after one round trip answered. */
ote_status_t ote__etcd_open(const char *hosts, uint32_t timeout_ms, void **st_out);
extern const ote__nstore_ops_t ote__etcd_ops;
ote_status_t ote__redis_open(const char *hosts, uint32_t timeout_ms, void **st_out);
extern const ote__nstore_ops_t ote__redis_ops;

/*
 * The value stored under a name: "OTNM" magic u32, version u16 (1), name length u16
 * (1..OTE_NAMING_NAME_MAX), metadata length u32 (1..OTE__NVAL_MD_MAX), the name, then
 * the engine's metadata blob (ote_engine_metadata), nothing after. Little-endian.
 */
#define OTE__NVAL_MAGIC 0x4d4e544fu /* "OTNM" */
#define OTE__NVAL_VERSION 1u
#define OTE__NVAL_HDR_LEN 12u
#define OTE__NVAL_MD_MAX (4u << 20)
/* Encode into an ote_malloc'ed buffer. OTE_ERR_INVALID for a bad name or empty md. */
ote_status_t ote__nval_encode(const char *name, const void *md, size_t md_len, uint8_t **out,
                              size_t *len_out);
/* Check a whole value: the envelope, that it names `name` (a valid name), and that the
 * metadata blob decodes (address, nonzero epoch). OTE_ERR_PROTOCOL when anything is wrong
 * (outputs untouched); else the blob's place inside val and the engine's address and epoch. */
ote_status_t ote__nval_decode(const uint8_t *val, size_t len, const char *name,
                              const uint8_t **md_out, size_t *md_len_out,
                              ote_naming_entry_t *entry_out);
/* Whether name is a valid name (1..OTE_NAMING_NAME_MAX printable ASCII, no space). */
int ote__name_ok(const char *name, size_t max);

#ifdef __cplusplus
}
#endif
#endif

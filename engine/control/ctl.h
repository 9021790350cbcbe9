/*
 * engine/control/ctl.h - OrbitTE wire framing and handshake (control plane).
 *
 * Every message on an OrbitTE TCP connection is one frame:
 *
 *     offset  size  field
 *          0     4  magic    OTE_CTL_MAGIC, little endian
 *          4     2  version  protocol version the frame is written in
 *          6     2  opcode   ote_ctl_opcode_t
 *          8     8  req_id   chosen by the requester, echoed by the responder
 *         16     4  status   ote_status_t of a response (0 in requests)
 *         20     4  length   bytes that follow the header (body + bulk data)
 *         24   ...  body     fixed fields of the opcode, then variable text/message
 *                   data     bulk bytes (WRITE_REQ payload, READ_RESP payload only)
 *
 * The decoder checks every field before anything uses it: magic, version != 0, known
 * opcode, length <= OTE_CTL_MAX_FRAME, the exact body size of the opcode, bulk sizes
 * against OTE_CTL_MAX_DATA and the body's own length fields, text lengths. It never
 * reads past `len`, never allocates and keeps no state, so it can be fuzzed directly
 * (engine/control/fuzz_decode.c). Bulk data is not part of the decoded message: the
 * caller receives it straight into its destination after validating the request.
 *
 * Handshake: the connecting side sends HELLO with the range of versions it speaks; the
 * accepting side answers HELLO_ACK with the highest common version, or ERROR with
 * OTE_ERR_VERSION and its own range, then closes. After the handshake every frame must
 * carry the negotiated version.
 *
 * Authentication (version 3, engine/control/auth.h): a source with a cluster key answers a
 * HELLO with AUTH CHALLENGE (its nonce) instead of HELLO_ACK; the requester answers AUTH
 * PROOF (its nonce and its MAC), the source checks it and sends AUTH OK (its own MAC),
 * then HELLO_ACK. Nothing else is accepted from the requester before its PROOF checks. A
 * source without a key answers HELLO_ACK at once, which a requester with a key refuses.
 */
#ifndef OTE_ENGINE_CONTROL_CTL_H
#define OTE_ENGINE_CONTROL_CTL_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define OTE_CTL_MAGIC 0x4d45544fu /* "OTEM" on the wire */
#define OTE_CTL_VERSION_MIN 1
/* Version 2 adds the request extent to WRITE_REQ / READ_REQ (OTE_CTL_RW2_BODY_LEN): the
 * source checks and pins the whole request, not the slice, before any byte moves. */
/* Version 3 adds the AUTH frame (authentication, engine/control/auth.h): a source with a
 * key refuses a requester that does not speak it. */
/* Version 4 lets a BUFS frame list file registrations (OTE_CTL_BUF_KIND_FILE,
 * docs/files.md): a source lists them only in a frame of version >= 4 (a connection
 * whose requester speaks it), and the decoder refuses the kind in a frame below it, as
 * every engine before version 4 does, so that no such peer ever meets one. */
#define OTE_CTL_VERSION_MAX 4
#define OTE_CTL_FILES_VERSION 4 /* BUFS entries of kind OTE_CTL_BUF_KIND_FILE, at least */
#define OTE_CTL_AUTH_VERSION 3  /* the version AUTH frames are written in (and at least) */
#define OTE_CTL_HDR_LEN 24u
#define OTE_CTL_RW_BODY_LEN 16u /* version 1: remote addr u64, length u32, flags u32 */
#define OTE_CTL_RW_FRAME_LEN (OTE_CTL_HDR_LEN + OTE_CTL_RW_BODY_LEN)
/* Version 2: the version-1 body, then the request's extent req_addr u64, req_len u64
 * (the slice [addr, addr+len) lies inside it; the decoder refuses one that does not) and
 * req_uid u64, the request's id, unique among the requester's requests (nonzero): the
 * source pins a request once, on its first slice, and unpins it once all its bytes are
 * accounted for (served, refused or withdrawn by CANCEL). */
#define OTE_CTL_RW2_BODY_LEN 40u
#define OTE_CTL_RW2_FRAME_LEN (OTE_CTL_HDR_LEN + OTE_CTL_RW2_BODY_LEN)
#define OTE_CTL_MAX_DATA (64u << 20) /* largest bulk payload of one frame (one slice) */
/* Smallest max_data a source may advertise in HELLO_ACK. A requester cuts requests into
 * slices of at most max_data / 2 bytes; below this floor a peer could make it cut a
 * request into billions of slices (or none), so such a HELLO_ACK is refused. */
#define OTE_CTL_MIN_DATA (8u << 10)
#define OTE_CTL_MAX_BODY 8192u /* largest non-bulk body (BUFS: OTE_CTL_BUFS_MAX_BODY) */
#define OTE_CTL_MAX_FRAME (OTE_CTL_MAX_DATA + OTE_CTL_MAX_BODY)
#define OTE_CTL_MAX_ADDR 255u /* advertised "host:port" */
/* HELLO: the requester's engine name (config key engine_name), optional. The HELLO body is
 * its 16 fixed bytes, then the address (no NUL); a named requester appends a NUL, the name
 * (1..OTE_CTL_MAX_NAME bytes of printable ASCII, 0x20..0x7e) and a NUL. A HELLO without
 * the trailer (every engine before names, and every unnamed one) has no name. The decoder
 * refuses a trailer that is empty, longer, unterminated or not printable. */
#define OTE_CTL_MAX_NAME 63u
#define OTE_CTL_MAX_HELLO_BODY (16u + OTE_CTL_MAX_ADDR + 2u + OTE_CTL_MAX_NAME)
#define OTE_CTL_MAX_TEXT 1024u   /* ERROR text */
#define OTE_CTL_MAX_NOTIFY 4096u /* == OTE_NOTIFY_MAX */
#define OTE_CTL_CANCEL_MAX 1000u /* req_ids of one CANCEL frame */
#define OTE_CTL_MAX_INFO 1024u   /* HELLO_ACK advertisement text */
/* HELLO roles: what a connection to an engine's listener is for (engine/listen.c hands
 * it to that transport; a role the engine does not serve is refused with ERROR
 * OTE_ERR_UNSUPPORTED). ROLE_INFO: a connection that only asks for the source's
 * advertisement (the engine's router) or its buffers; the source answers HELLO_ACK. */
#define OTE_CTL_ROLE_TCP 1  /* a TCP transport data connection */
#define OTE_CTL_ROLE_RDMA 2 /* the RDMA transport's control connection */
#define OTE_CTL_ROLE_INFO 3

typedef enum {
    OTE_CTL_HELLO = 1,      /* requester -> source: versions, role, own address */
    OTE_CTL_HELLO_ACK = 2,  /* source -> requester: chosen version, own address */
    OTE_CTL_WRITE_REQ = 3,  /* rw body + length bytes of data */
    OTE_CTL_WRITE_ACK = 4,  /* status only */
    OTE_CTL_READ_REQ = 5,   /* rw body */
    OTE_CTL_READ_RESP = 6,  /* status; on OK exactly the requested bytes follow */
    OTE_CTL_NOTIFY = 7,     /* message bytes */
    OTE_CTL_NOTIFY_ACK = 8, /* status only */
    OTE_CTL_ERROR = 9,      /* status, the sender's version range and a text */
    /* RDMA transport control (engine/rdma/proto.h): an opaque body of at most
     * OTE_CTL_MAX_BODY bytes whose own codec (QP handshake, grant request/answer) checks
     * it. Added for the RDMA transport; TCP peers never send it. */
    OTE_CTL_RDMA = 10,
    /* Version 2, requester -> source, no answer. (a) Withdraw READ_REQs of this
     * connection (by req_id) whose data the source has not started to send: each is
     * answered READ_RESP with OTE_ERR_CANCELED and no data, in its place in the order;
     * the others are served as usual. (b) Bytes of requests that will never be sent
     * (slices dropped by a cancel before they reached the wire), so that the source can
     * close its account of those requests. Body: nids u32, nwd u32, nids req_ids u64,
     * then nwd withdrawals {req_uid u64, req_len u64, bytes u64}; 1 <= nids + nwd and
     * nids, nwd <= OTE_CTL_CANCEL_MAX. */
    OTE_CTL_CANCEL = 11,
    /* Buffer discovery, in any version, on a connection of the engine's listener (the
     * router's HELLO with OTE_CTL_ROLE_INFO; the source advertises "buffers=1" in its
     * HELLO_ACK info). BUFS_REQ, requester -> source: status 0, empty body. BUFS,
     * source -> requester, same req_id: on OTE_OK the body is total u32 (registrations
     * the source has), count u32 (entries that follow: count <= total, count <=
     * OTE_CTL_BUFS_MAX; the source lists its count lowest addresses), then count entries
     * of OTE_CTL_BUF_ENTRY_LEN bytes: addr u64, len u64 (nonzero, addr + len does not
     * wrap), perms u32 (nonzero, inside OTE_CTL_BUF_PERMS), kind u32 (<=
     * OTE_CTL_BUF_KIND_MAX; 0: host memory; OTE_CTL_BUF_KIND_FILE only in version >= 4),
     * name 64 bytes (printable ASCII, then a NUL,
     * then NULs to the end; "" for an unregistered name). Otherwise an empty body. */
    OTE_CTL_BUFS_REQ = 12,
    OTE_CTL_BUFS = 13,
    /* Authentication, in version >= 3 only (see the handshake above). Body (fixed,
     * OTE_CTL_AUTH_BODY_LEN): step u16 (ote_ctl_auth_step_t), 6 bytes zero, nonce 32
     * bytes, mac 32 bytes (CHALLENGE: zero mac; OK: zero nonce). Status 0. */
    OTE_CTL_AUTH = 14,
    OTE_CTL_OPCODE_MAX = 14,
} ote_ctl_opcode_t;

typedef enum {
    OTE_CTL_AUTH_CHALLENGE = 1, /* source -> requester: the source's nonce */
    OTE_CTL_AUTH_PROOF = 2,     /* requester -> source: its nonce and its MAC */
    OTE_CTL_AUTH_OK = 3,        /* source -> requester: the source's MAC */
} ote_ctl_auth_step_t;
#define OTE_CTL_AUTH_NONCE_LEN 32u
#define OTE_CTL_AUTH_MAC_LEN 32u
#define OTE_CTL_AUTH_BODY_LEN (8u + OTE_CTL_AUTH_NONCE_LEN + OTE_CTL_AUTH_MAC_LEN)
#define OTE_CTL_AUTH_FRAME_LEN (OTE_CTL_HDR_LEN + OTE_CTL_AUTH_BODY_LEN)

#define OTE_CTL_BUFS_MAX 2048u    /* entries of one BUFS frame */
#define OTE_CTL_BUF_ENTRY_LEN 88u /* bytes of one entry */
#define OTE_CTL_BUF_NAME_LEN 64u  /* name field, NUL included: names of 1..63 chars */
#define OTE_CTL_BUF_PERMS 0x3u    /* == OTE_PERM_READ | OTE_PERM_WRITE */
/* Memory kinds a BUFS entry may carry (the values of ote_mem_kind_t): 0 host, 1 pinned
 * host, 16 + N device memory of CUDA device N (N <= 239), and in a BUFS frame of version
 * >= OTE_CTL_FILES_VERSION 2, a file registration (never in a metadata blob); the others
 * are refused. */
#define OTE_CTL_BUF_KIND_HOST 0u
#define OTE_CTL_BUF_KIND_PINNED 1u
#define OTE_CTL_BUF_KIND_FILE 2u
#define OTE_CTL_BUF_KIND_CUDA 16u
#define OTE_CTL_BUF_KIND_MAX 255u
#define OTE_CTL_BUFS_MAX_BODY (8u + OTE_CTL_BUFS_MAX * OTE_CTL_BUF_ENTRY_LEN)

/* One entry of a BUFS frame, decoded (name NUL-terminated). */
typedef struct {
    uint64_t addr, len;
    uint32_t perms, kind;
    char name[OTE_CTL_BUF_NAME_LEN];
} ote_ctl_buf_t;

typedef struct {
    uint16_t version;
    uint16_t opcode;
    uint64_t req_id;
    ote_status_t status;
    uint32_t length;   /* as on the wire: body + data */
    uint32_t data_len; /* bulk bytes that follow the decoded part (not consumed) */
    union {
        struct {
            uint16_t min_version, max_version;
            uint16_t role, conn_index;
            uint64_t session;
            const char *addr; /* points into the decoded buffer, not NUL-terminated */
            uint32_t addr_len;
            const char *name; /* the engine's name (NULL when name_len is 0), likewise */
            uint32_t name_len;
        } hello;
        struct {
            uint16_t version;
            uint16_t info_len; /* bytes of info after addr (0 from engines without routing) */
            uint32_t max_data;
            const char *addr;
            uint32_t addr_len;
            const char *info; /* the engine's advertisement (transports, host identity),
                               * "key=value;..." text, not NUL-terminated */
        } hello_ack;
        struct {
            uint64_t addr;
            uint32_t len;
            uint32_t flags;
            uint64_t req_addr, req_len; /* the request's extent (version 1: the slice) */
            uint64_t req_uid;           /* the request's id (version 1: 0) */
        } rw;
        struct {
            const uint8_t *msg;
            uint32_t len;
        } notify;
        struct {
            uint16_t min_version, max_version;
            const char *text;
            uint32_t text_len;
        } error;
        struct {
            const uint8_t *body; /* OTE_CTL_RDMA: decoded by engine/rdma/proto.c */
            uint32_t len;
        } rdma;
        struct {
            const uint8_t *ids; /* count little-endian u64 req_ids (ote_le_get64) */
            uint32_t count;
            const uint8_t *wd; /* nwd withdrawals of 24 bytes: uid, req_len, bytes */
            uint32_t nwd;
        } cancel;
        struct {
            uint32_t total, count;
            const uint8_t *entries; /* count encoded entries (ote_ctl_buf_get) */
        } bufs;
        struct {
            uint16_t step;        /* ote_ctl_auth_step_t */
            const uint8_t *nonce; /* OTE_CTL_AUTH_NONCE_LEN bytes (encode: NULL = zeros) */
            const uint8_t *mac;   /* OTE_CTL_AUTH_MAC_LEN bytes (encode: NULL = zeros) */
        } auth;
    } u;
} ote_ctl_msg_t;

/*
 * Decode one frame from buf[0, len). OTE_OK: *out filled, *consumed_out = header + body
 * (bulk data, out->data_len bytes, follows and is not consumed). OTE_ERR_AGAIN: the
 * frame is not complete yet (nothing written). OTE_ERR_PROTOCOL: malformed;
 * OTE_ERR_TOO_BIG: a length over a limit. Pointers in *out point into buf.
 */
ote_status_t ote_ctl_decode(const uint8_t *buf, size_t len, ote_ctl_msg_t *out,
                            size_t *consumed_out);

/* Encode header + body of m (m->data_len bulk bytes are sent separately by the
 * caller). OTE_ERR_INVALID for out-of-range fields, OTE_ERR_TOO_BIG when cap is short. */
ote_status_t ote_ctl_encode(const ote_ctl_msg_t *m, uint8_t *buf, size_t cap, size_t *len_out);

/* Hot-path encoders into fixed-size buffers. */
void ote_ctl_put_hdr(uint8_t *buf, uint16_t version, uint16_t opcode, uint64_t req_id,
                     ote_status_t status, uint32_t length);
/* WRITE_REQ / READ_REQ: OTE_CTL_RW_FRAME_LEN bytes. OTE_ERR_INVALID (nothing written)
 * when len > OTE_CTL_MAX_DATA: the frame length (body + data) could not be encoded. */
ote_status_t ote_ctl_put_rw(uint8_t *buf, uint16_t version, uint16_t opcode, uint64_t req_id,
                            uint64_t addr, uint32_t len);
/* The same with the request's extent: OTE_CTL_RW2_FRAME_LEN bytes for version >= 2 (the
 * version-1 frame, without the extent, below that); *frame_len_out = bytes written. */
ote_status_t ote_ctl_put_rw2(uint8_t *buf, uint16_t version, uint16_t opcode, uint64_t req_id,
                             uint64_t addr, uint32_t len, uint64_t req_addr, uint64_t req_len,
                             uint64_t req_uid, uint16_t *frame_len_out);

/*
 * Handshake, source side: pick the version for a HELLO. OTE_OK with *version_out = the
 * highest version both ranges contain; OTE_ERR_VERSION when they do not overlap;
 * OTE_ERR_PROTOCOL when hello is not a well-formed HELLO.
 */
ote_status_t ote_ctl_negotiate(const ote_ctl_msg_t *hello, uint16_t my_min, uint16_t my_max,
                               uint16_t *version_out);
/* Handshake, requester side: check the answer to our HELLO. OTE_OK with the version the
 * source chose (inside our range); OTE_ERR_VERSION for an ERROR frame saying so or a
 * chosen version outside [my_min, my_max]; for other ERROR refusals the ERROR's status
 * as ote_ctl_peer_status() admits it; OTE_ERR_PROTOCOL for a HELLO_ACK whose max_data
 * lies outside [OTE_CTL_MIN_DATA, OTE_CTL_MAX_DATA] and for anything else. */
ote_status_t ote_ctl_check_hello_ack(const ote_ctl_msg_t *ack, uint16_t my_min, uint16_t my_max,
                                     uint16_t *version_out);

/*
 * The status a peer reported in a frame of `opcode`, made safe to report as this
 * engine's own. Every status that comes from a peer passes through here before anything
 * uses it: a peer must not make a local call return a code that promises a local state
 * (OTE_ERR_RETAINED, OTE_ERR_BUSY, OTE_ERR_NOMEM, OTE_ERR_TIMEOUT, ...) or carry errno
 * bits of its own native calls. Each answer admits only the codes the protocol gives it:
 *
 *   WRITE_ACK              ACCESS, INVALID, TOO_BIG, REMOTE_ACCESS, REMOTE
 *   READ_RESP              the same and CANCELED (a READ_REQ the requester withdrew)
 *   NOTIFY_ACK             AGAIN (its notification queue is full), INVALID, TOO_BIG,
 *                          REMOTE
 *   ERROR                  VERSION, PROTOCOL, INVALID, UNSUPPORTED, REMOTE
 *   RDMA                   ACCESS, INVALID, TOO_BIG, AGAIN, UNSUPPORTED, REMOTE_ACCESS,
 *                          REMOTE
 *   BUFS                   AGAIN (the source could not list now), REMOTE
 *   ERROR                  also AUTH (the handshake's authentication failed)
 *
 * OTE_OK stays OTE_OK, except in ERROR (a refusal without a reason: OTE_ERR_PROTOCOL);
 * code 0 with other bits set is OTE_ERR_PROTOCOL; any other code, any status with errno
 * bits, and any status of another opcode is OTE_ERR_REMOTE ("the peer failed it").
 */
ote_status_t ote_ctl_peer_status(uint16_t opcode, ote_status_t st);

const char *ote_ctl_opcode_str(uint16_t opcode);

/* Whether name[0, len) is a valid registration name: 1..63 printable ASCII characters
 * (0x20..0x7e). */
int ote_ctl_buf_name_ok(const char *name, size_t len);
/* Whether kind is one a BUFS entry of any version (and a metadata blob's) may carry:
 * memory kinds; OTE_CTL_BUF_KIND_FILE is not (a BUFS frame of version >=
 * OTE_CTL_FILES_VERSION, a metadata blob of version OTE_CTL_MD_VERSION_FILES only). */
int ote_ctl_buf_kind_ok(uint32_t kind);
/* Encode one BUFS entry into dst (OTE_CTL_BUF_ENTRY_LEN bytes). OTE_ERR_INVALID (nothing
 * written) for an entry the decoder of a version-4 frame would refuse; an empty name is
 * allowed. A file registration's (OTE_CTL_BUF_KIND_FILE) only goes in a frame of version
 * >= OTE_CTL_FILES_VERSION: its caller's business. */
ote_status_t ote_ctl_buf_put(uint8_t *dst, const ote_ctl_buf_t *b);
/* Entry i of a decoded BUFS frame (the decoder checked them all). OTE_ERR_INVALID when m
 * is not a BUFS frame or i >= its count. */
ote_status_t ote_ctl_buf_get(const ote_ctl_msg_t *m, uint32_t i, ote_ctl_buf_t *out);

/*
 * An engine's metadata blob (ote_engine_metadata), for a side channel: "OTMD" magic u32,
 * version u16 (1), address length u16 (1..OTE_CTL_MD_ADDR_MAX), epoch u64 (nonzero),
 * count u32 (<= OTE_CTL_BUFS_MAX), the address ("host:port", printable ASCII, no NUL),
 * then count BUFS entries (OTE_CTL_BUF_ENTRY_LEN each, checked like a BUFS frame's), and
 * nothing after them. Little-endian. Version 2 (the blob of an engine with an engine_name;
 * an unnamed engine's stays version 1, readable by engines before names) appends the name:
 * its length u16 (1..OTE_CTL_MAX_NAME) and its printable ASCII bytes (0x20..0x7e).
 * Version 3 (the blob of an engine with file registrations: only it may carry entries of
 * OTE_CTL_BUF_KIND_FILE, and it carries at least one) has version 2's layout with a name
 * of 0..OTE_CTL_MAX_NAME bytes. Engines before it refuse a version-3 blob as a whole; the
 * encoder writes the lowest version that carries its entries and name, so a blob without
 * files stays readable by them.
 */
#define OTE_CTL_MD_MAGIC 0x444d544fu /* "OTMD" */
#define OTE_CTL_MD_VERSION 1u
#define OTE_CTL_MD_VERSION_NAMED 2u
#define OTE_CTL_MD_VERSION_FILES 3u
#define OTE_CTL_MD_HDR_LEN 20u
#define OTE_CTL_MD_ADDR_MAX 271u
typedef struct {
    uint64_t epoch;
    char addr[OTE_CTL_MD_ADDR_MAX + 1]; /* NUL-terminated */
    char name[OTE_CTL_MAX_NAME + 1];    /* the engine's name, "" in a version-1 blob */
    uint32_t count;
    const uint8_t *entries; /* count entries, inside the decoded blob (ote_ctl_md_buf) */
} ote_ctl_md_t;
/* Encode a blob of n entries into out (version 3 when an entry is a file registration's,
 * else version 2 when name is neither NULL nor "", else version 1).
 * OTE_ERR_INVALID for a bad address or name, a zero epoch, too many or invalid entries
 * (nothing written); OTE_ERR_TOO_BIG when cap is short, with *len_out the size needed;
 * OTE_OK with *len_out the size written. */
ote_status_t ote_ctl_md_encode(const char *addr, const char *name, uint64_t epoch,
                               const ote_ctl_buf_t *bufs, uint32_t n, uint8_t *out, size_t cap,
                               size_t *len_out);
/* Decode and check a whole blob (every entry too): OTE_ERR_PROTOCOL when anything is
 * wrong (*out untouched), else OTE_OK with out->entries pointing into in. */
ote_status_t ote_ctl_md_decode(const uint8_t *in, size_t len, ote_ctl_md_t *out);
/* Entry i of a decoded blob; OTE_ERR_INVALID past its count. */
ote_status_t ote_ctl_md_buf(const ote_ctl_md_t *md, uint32_t i, ote_ctl_buf_t *out);

/*
 * The value of `key` in an advertisement "k1=v1;k2=v2" (HELLO_ACK info): OTE_OK with the
 * value copied NUL-terminated into out; OTE_ERR_NOT_FOUND when the key is absent;
 * OTE_ERR_TOO_BIG when the value does not fit cap.
 */
ote_status_t ote_ctl_info_get(const char *info, const char *key, char *out, size_t cap);

/*
 * The incarnation an advertisement names (restarted peers): its engine's epoch
 * ("epoch=<16 hex digits>", nonzero, drawn at ote_engine_create); for an engine that
 * advertises none (older), a nonzero hash of its boot id and process id; 0 when info has
 * neither (an engine without an advertisement): unknown, nothing to compare. Two answers
 * from one engine instance are equal; a new engine at the same address gives another.
 */
uint64_t ote_ctl_info_incarnation(const char *info);

#ifdef __cplusplus
}
#endif
#endif

/*
 * engine/rdma/proto.h - the RDMA transport's control messages, carried in the body of
 * OTE_CTL_RDMA frames (engine/control/ctl.h). Little endian, fixed sizes per type; the
 * decoder checks the exact size of each type before reading it and never allocates.
 *
 *   body = type u16, reserved u16 (0), then:
 *   INFO / INFO_ACK   process u64, pd u64, nic u32, lanes u32          (identity + width)
 *   CONNECT           slot u32, cap u32 (0 READ, 1 WRITE; 2, 3: direct), path (gid 16, lid u32, qpn u32, psn u32, mtu u32: bits 0-7 the MTU, 8-15 the responder's READ depth)
 *   CONNECT_ACK       the source's path (status in the frame header)
 *   GRANT_REQ         slot u32, op u32, source qpn u32, requester qpn u32, addr u64, len u64,
 *                     req_addr u64, req_len u64 (the whole request; [addr, +len) inside it),
 *                     req_uid u64 (the request's id, nonzero: the source's account of it)
 *   WRITE_OFF         req_uid u64, req_len u64, bytes u64: bytes of the request that will
 *                     never be asked for (slices canceled or failed before their grant);
 *                     no answer
 *   GRANT_RESP        rkey u32 (status in the frame header; req_id = the grant id)
 *   EP_RESET          pair u32: the requester's device of that pair went down; the source
 *                     ends at once every grant it serves on that pair's endpoints (their
 *                     requester QPs are gone), so their slots are free for CONNECT when it
 *                     is back; no answer. Sent only by a requester with several devices.
 *   RELEASE           pair u32, cap u32 (0 READ, 1 WRITE), slot u32, src_qpn u32, rkey u32:
 *                     the requester abandoned the grant whose window has rkey on that
 *                     endpoint slot and source QP (it failed there, or its answer came too
 *                     late), after every WR it posted under it ended; the source ends it
 *                     at once instead of at its deadline. No answer; one naming no bound
 *                     grant of the sender is ignored. Sent only to a source whose
 *                     advertisement (HELLO_ACK info) has rdma_release=1: an older source
 *                     would close the connection on an unknown type.
 *
 * Several NICs (striping): INFO / INFO_ACK may be followed by ndev u32 and the NIC ids of
 * the sender's data devices (8 x u32, the first ndev used; ndev 1..8, ids[0] = nic);
 * CONNECT and GRANT_REQ may be followed by pair u32 = (source device index << 8) |
 * requester device index, each < 8 (the two ends of the QP's path; the endpoint key
 * names them). The short forms (one device, pair 0) are what a single-NIC engine sends,
 * so such an engine still talks to a peer that knows only them; the decoder takes both.
 *
 * Epochs (restarted peers): INFO / INFO_ACK may carry, after the multi-device form, the
 * sender's epoch u64 (random, nonzero, drawn when its engine was created): 72 bytes in
 * all. GRANT_REQ may carry, after pair, the epoch of the source as the requester learned
 * it from INFO_ACK: 72 bytes. A message without it (an older engine) decodes with epoch 0
 * (unknown): such a peer is still served, without the epoch check. A GRANT_REQ whose
 * epoch is not the source's own (it was meant for an earlier incarnation at the same
 * address), or that names a QP the source does not have, is refused with OTE_ERR_STATE
 * in the frame header: a cache miss (engine/rdma/rdma_internal.h, OTE__RDMA_CACHE_MISS).
 * An engine sends the epoch forms only to a peer whose INFO carried an epoch.
 *
 * CONNECT may carry, after pair, the source's epoch as the requester learned it from
 * INFO_ACK and the requester's own epoch (as in its INFO), both u64 and nonzero: 64 bytes
 * in all. A source refuses one whose source epoch is not its own, or whose requester
 * epoch is not the one INFO gave on that connection, with OTE_ERR_STATE before it builds
 * or touches any QP: a cache miss, which the requester handles as for GRANT_REQ (the
 * build failed, nothing was posted: the run is retried once). Sent only to a source whose
 * advertisement (HELLO_ACK info) has rdma_connect_epoch=1: a source that knows only the
 * 44-byte form would refuse the longer one as malformed.
 *
 * Source-side staging (engine/rdma/rdma_stage.c): GRANT_REQ may carry, after the epoch
 * (nonzero), flags u32: 76 bytes. OTE_RP_GF_STAGE says that the requester takes a staged
 * answer; no other bit may be set. A requester sends it only to a source whose
 * advertisement has rdma_stage=1 (an older source would refuse the size as a protocol
 * error), and only with an epoch. GRANT_RESP may then come in its staged form: rkey u32,
 * flags u32 (OTE_RP_RESP_STAGED, with OTE_RP_RESP_COMMIT for a WRITE grant and only
 * then), base u64 (nonzero): the window covers a bounce buffer at [base, +len), and the
 * requester's RDMA READs / WRITEs address it from base. A staged answer to a grant that
 * did not ask for it, or whose COMMIT flag does not match the grant's op, is a protocol
 * error.
 *   COMMIT            rkey u32; source -> requester, req_id = the staged WRITE grant's
 *                     id, status in the frame header: after the grant's receipt the
 *                     bounce was copied to the device (OK) or not (the failure). Sent once
 *                     per staged WRITE grant that was answered OK, only to a requester
 *                     that asked with OTE_RP_GF_STAGE. One naming no staged WRITE grant
 *                     of the requester that waits for it, or another rkey, is ignored.
 *
 * GPUDirect source grants (engine/rdma/rdma_direct.c): a source whose advertisement has
 * rdma_direct=1 takes, in GRANT_REQ's op word, the flags OTE_RP_GOP_DIRECT_OK (bit 8: the
 * requester follows a redirect to a direct slot) and OTE_RP_GOP_DIRECT (bit 9: the grant
 * is asked on a slot of a direct endpoint, built by CONNECT with cap 2 (READ) or 3
 * (WRITE), whose source QP lives in a PD of its own); RELEASE then names cap 2 or 3 too.
 * The decoder keeps op (0 READ, 1 WRITE) and the flags (grant.dflags) apart and refuses
 * any other bit. The redirect is a GRANT_RESP with status OTE_ERR_UNSUPPORTED and rkey
 * OTE_RP_RKEY_DIRECT (a plain refusal has rkey 0): the range is device memory that the
 * source serves only on a direct slot. Sent only to a requester that set DIRECT_OK; an
 * older source (no advert) is never sent the flags nor cap 2/3. A requester asks a source
 * that advertises rdma_grant_mr=1 on direct slots first; the same answer to a grant asked
 * on a direct slot sends it back to a plain slot (device memory the source serves
 * staged).
 *
 * Whole-parent credits (engine/rdma/rdma_src_parents.c): GRANT_REQ may carry, after the
 * epoch and flags (flags may then be 0), parent u64 (nonzero: the requester's parent of
 * the grant, unique per requester engine) and budget u32 (1..OTE_RP_MAX_BUDGET: the
 * grants that parent reserved at the requester): 88 bytes. Sent only with an epoch and
 * only to a source whose advertisement has rdma_parent=1 (an older source would refuse
 * the size as a protocol error); a GRANT_REQ without it is served per grant.
 *
 * Remote locality (engine/rdma/rdma_pairing.c): a source whose advertisement has
 * rdma_pair=1 takes the GRANT_REQ flag OTE_RP_GF_PAIR (with or without OTE_RP_GF_STAGE;
 * sent only with an epoch) and then answers an OK grant in the pair form of GRANT_RESP:
 * rkey u32, flags u32, base u64 (the staged form's, both 0 when not staged), near u32
 * (bit i: the source's device i is among those its selector ranks best for the
 * registration holding the grant's range; nonzero, below bit OTE_RP_MAX_DEVS), reserved
 * u32 (0), reg_addr u64, reg_len u64 (that registration's extent: nonzero, not wrapping):
 * 44 bytes. The requester pairs its later runs into that extent with one of those devices
 * (the pair's source index) instead of its own device index modulo the peer's devices.
 * A requester that does not set the flag gets the forms above; a source without the
 * advert is never sent the flag (its decoder refuses unknown flag bits).
 */
#ifndef OTE_ENGINE_RDMA_PROTO_H
#define OTE_ENGINE_RDMA_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "qp/qp.h"

enum {
    OTE_RP_INFO = 1,
    OTE_RP_INFO_ACK = 2,
    OTE_RP_CONNECT = 3,
    OTE_RP_CONNECT_ACK = 4,
    OTE_RP_GRANT_REQ = 5,
    OTE_RP_GRANT_RESP = 6,
    OTE_RP_WRITE_OFF = 7,
    OTE_RP_EP_RESET = 8,
    OTE_RP_RELEASE = 9,
    OTE_RP_COMMIT = 10,
};

#define OTE_RP_MAX_DEVS 8

/* GRANT_REQ flags: the requester takes a staged GRANT_RESP (source-side staging). */
#define OTE_RP_GF_STAGE 1u
/* GRANT_REQ flags: the requester takes the pair form of GRANT_RESP (remote locality). */
#define OTE_RP_GF_PAIR 2u
/* GRANT_RESP flags (staged form): the window covers a bounce buffer at base; COMMIT (a
 * WRITE grant only): the requester's request completes only on the grant's COMMIT. */
#define OTE_RP_RESP_STAGED 1u
#define OTE_RP_RESP_COMMIT 2u
/* GRANT_REQ op flags and the redirect of a GRANT_RESP (GPUDirect source grants). */
#define OTE_RP_GOP_DIRECT_OK 0x100u
#define OTE_RP_GOP_DIRECT 0x200u
#define OTE_RP_RKEY_DIRECT 1u
/* GRANT_REQ parent trailer: the most grants a parent may have reserved (rdma_max_grants). */
#define OTE_RP_MAX_BUDGET 65536u

typedef struct {
    uint16_t type;
    union {
        struct {
            uint64_t process, pd;
            uint32_t nic, lanes;
            uint32_t ndev; /* data devices (1..OTE_RP_MAX_DEVS); 0 on encode = 1 */
            uint32_t nics[OTE_RP_MAX_DEVS];
            uint64_t epoch; /* the sender's epoch; 0: not sent (an older engine) */
        } info;
        struct {
            uint32_t slot, cap;
            ote_qp_path_t path;
            uint32_t pair;      /* (source device << 8) | requester device */
            uint64_t epoch;     /* the source's epoch as the requester knows it; 0: not sent */
            uint64_t req_epoch; /* the requester's own epoch (sent with epoch, both or none) */
        } connect;
        struct {
            uint32_t pair; /* (source device << 8) | requester device */
            uint32_t slot, op, src_qpn, req_qpn;
            uint64_t addr, len;
            uint64_t req_addr, req_len; /* the request's extent, checked as a whole */
            uint64_t req_uid;
            uint64_t epoch;  /* the source's epoch as the requester knows it; 0: not sent */
            uint32_t flags;  /* OTE_RP_GF_*; 0: not sent (sent only with an epoch) */
            uint32_t dflags; /* OTE_RP_GOP_DIRECT_OK / _DIRECT, carried in the op word */
            uint64_t parent; /* the requester's parent; 0: not sent (sent only with an epoch) */
            uint32_t budget; /* grants the parent reserved (with parent only) */
        } grant;
        struct {
            uint64_t req_uid, req_len, bytes;
        } wo;
        struct {
            uint32_t rkey;
            uint32_t flags; /* 0 (short form) or OTE_RP_RESP_STAGED */
            uint64_t base;  /* staged: the window's (bounce buffer's) address */
            uint32_t near;  /* pair form: the source's best devices (bit i: device i); 0: none */
            uint64_t reg_addr, reg_len; /* pair form: the registration they are best for */
        } resp;
        struct {
            uint32_t pair;
        } reset;
        struct {
            uint32_t pair, cap, slot, src_qpn, rkey;
        } rel;
        struct {
            uint32_t rkey; /* the staged WRITE grant's window, as its answer named it */
        } commit;
    } u;
} ote_rp_msg_t;

#define OTE_RP_MAX_BODY 88u /* the longest form: GRANT_REQ with the parent trailer */

/* Encode into buf (>= OTE_RP_MAX_BODY bytes); returns the body length. */
size_t ote__rp_encode(const ote_rp_msg_t *m, uint8_t *buf);
/* OTE_ERR_PROTOCOL for an unknown type or a size that is not the type's exact size. */
ote_status_t ote__rp_decode(const uint8_t *buf, size_t len, ote_rp_msg_t *out);

#endif

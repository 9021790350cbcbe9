/* engine/rdma/proto.c - codec of the RDMA transport's control messages (see proto.h). */
#include "engine/rdma/proto.h"

#include <string.h>

#include "base/le.h"

/* Sizes of the multi-device forms (proto.h); body_size() is the short form. */
#define INFO_LONG (4 + 24 + 4 + 4 * OTE_RP_MAX_DEVS)
#define CONNECT_LONG (4 + 8 + 32 + 4)
#define GRANT_LONG (4 + 56 + 4)
/* ... and with the epoch (proto.h). */
#define INFO_EPOCH (INFO_LONG + 8)
#define GRANT_EPOCH (GRANT_LONG + 8)
#define CONNECT_EPOCH (CONNECT_LONG + 16)
/* ... and source-side staging (proto.h). */
#define GRANT_FLAGS (GRANT_EPOCH + 4)
#define RESP_STAGED (4 + 16)
/* ... and the parent trailer (proto.h). */
#define GRANT_PARENT (GRANT_FLAGS + 12)
/* ... and remote locality: GRANT_RESP's pair form (proto.h). */
#define RESP_PAIR (RESP_STAGED + 24)

static int pair_ok(uint32_t pair) {
    return (pair >> 16) == 0 && (pair >> 8) < OTE_RP_MAX_DEVS && (pair & 0xff) < OTE_RP_MAX_DEVS;
}

static size_t body_size(uint16_t type) {
    switch (type) {
        case OTE_RP_INFO:
        case OTE_RP_INFO_ACK: return 4 + 24;
        case OTE_RP_CONNECT: return 4 + 8 + 32;
        case OTE_RP_CONNECT_ACK: return 4 + 32;
        case OTE_RP_GRANT_REQ: return 4 + 56;
        case OTE_RP_WRITE_OFF: return 4 + 24;
        case OTE_RP_GRANT_RESP: return 4 + 4;
        case OTE_RP_EP_RESET: return 4 + 4;
        case OTE_RP_RELEASE: return 4 + 20;
        case OTE_RP_COMMIT: return 4 + 4;
        default: return 0;
    }
}

static void put_path(uint8_t *b, const ote_qp_path_t *p) {
    memcpy(b, p->gid.raw, 16);
    ote_le_put32(b + 16, p->lid);
    ote_le_put32(b + 20, p->qp_num);
    ote_le_put32(b + 24, p->psn);
    ote_le_put32(b + 28, (uint32_t)p->mtu | (uint32_t)p->rd_atom << 8);
}

static ote_status_t get_path(const uint8_t *b, ote_qp_path_t *p) {
    memset(p, 0, sizeof(*p));
    memcpy(p->gid.raw, b, 16);
    uint32_t lid = ote_le_get32(b + 16), word = ote_le_get32(b + 28);
    /* The MTU word: bits 0-7 the MTU, 8-15 the responder's READ depth (0: unknown). */
    uint32_t mtu = word & 0xff;
    if (word >> 16 != 0) return OTE_ERR_PROTOCOL;
    p->rd_atom = (uint8_t)(word >> 8);
    p->qp_num = ote_le_get32(b + 20);
    p->psn = ote_le_get32(b + 24);
    if (lid > 0xffff || p->qp_num == 0 || p->qp_num > 0xffffff || p->psn > 0xffffff ||
        mtu < IBV_MTU_256 || mtu > IBV_MTU_4096)
        return OTE_ERR_PROTOCOL;
    p->lid = (uint16_t)lid;
    p->mtu = (enum ibv_mtu)mtu;
    return OTE_OK;
}

_Static_assert(INFO_EPOCH <= OTE_RP_MAX_BODY && GRANT_PARENT <= OTE_RP_MAX_BODY &&
                   RESP_PAIR <= OTE_RP_MAX_BODY && CONNECT_EPOCH <= OTE_RP_MAX_BODY,
               "OTE_RP_MAX_BODY holds every form");

size_t ote__rp_encode(const ote_rp_msg_t *m, uint8_t *buf) {
    size_t n = body_size(m->type);
    int info = m->type == OTE_RP_INFO || m->type == OTE_RP_INFO_ACK;
    if (info && m->u.info.ndev > 1) n = INFO_LONG;
    if (info && m->u.info.epoch != 0) n = INFO_EPOCH;
    if (m->type == OTE_RP_CONNECT && m->u.connect.pair != 0) n = CONNECT_LONG;
    if (m->type == OTE_RP_CONNECT && (m->u.connect.epoch != 0 || m->u.connect.req_epoch != 0))
        n = CONNECT_EPOCH;
    if (m->type == OTE_RP_GRANT_REQ && m->u.grant.pair != 0) n = GRANT_LONG;
    if (m->type == OTE_RP_GRANT_REQ && m->u.grant.epoch != 0) n = GRANT_EPOCH;
    if (m->type == OTE_RP_GRANT_REQ && m->u.grant.flags != 0) n = GRANT_FLAGS;
    if (m->type == OTE_RP_GRANT_REQ && m->u.grant.parent != 0) n = GRANT_PARENT;
    if (m->type == OTE_RP_GRANT_RESP && m->u.resp.flags != 0) n = RESP_STAGED;
    if (m->type == OTE_RP_GRANT_RESP && m->u.resp.near != 0) n = RESP_PAIR;
    memset(buf, 0, n);
    ote_le_put16(buf, m->type);
    uint8_t *b = buf + 4;
    switch (m->type) {
        case OTE_RP_INFO:
        case OTE_RP_INFO_ACK:
            ote_le_put64(b, m->u.info.process);
            ote_le_put64(b + 8, m->u.info.pd);
            ote_le_put32(b + 16, m->u.info.nic);
            ote_le_put32(b + 20, m->u.info.lanes);
            if (n >= INFO_LONG) {
                uint32_t nd = m->u.info.ndev == 0 ? 1 : m->u.info.ndev;
                if (m->u.info.ndev == 0) ote_le_put32(b + 28, m->u.info.nic);
                ote_le_put32(b + 24, nd);
                for (uint32_t i = 0; i < m->u.info.ndev && i < OTE_RP_MAX_DEVS; i++)
                    ote_le_put32(b + 28 + 4 * i, m->u.info.nics[i]);
            }
            if (n == INFO_EPOCH) ote_le_put64(b + 28 + 4 * OTE_RP_MAX_DEVS, m->u.info.epoch);
            break;
        case OTE_RP_CONNECT:
            ote_le_put32(b, m->u.connect.slot);
            ote_le_put32(b + 4, m->u.connect.cap);
            put_path(b + 8, &m->u.connect.path);
            if (n >= CONNECT_LONG) ote_le_put32(b + 40, m->u.connect.pair);
            if (n == CONNECT_EPOCH) {
                ote_le_put64(b + 44, m->u.connect.epoch);
                ote_le_put64(b + 52, m->u.connect.req_epoch);
            }
            break;
        case OTE_RP_CONNECT_ACK: put_path(b, &m->u.connect.path); break;
        case OTE_RP_GRANT_REQ:
            ote_le_put32(b, m->u.grant.slot);
            ote_le_put32(b + 4, m->u.grant.op | m->u.grant.dflags);
            ote_le_put32(b + 8, m->u.grant.src_qpn);
            ote_le_put32(b + 12, m->u.grant.req_qpn);
            ote_le_put64(b + 16, m->u.grant.addr);
            ote_le_put64(b + 24, m->u.grant.len);
            ote_le_put64(b + 32, m->u.grant.req_addr);
            ote_le_put64(b + 40, m->u.grant.req_len);
            ote_le_put64(b + 48, m->u.grant.req_uid);
            if (n >= GRANT_LONG) ote_le_put32(b + 56, m->u.grant.pair);
            if (n >= GRANT_EPOCH) ote_le_put64(b + 60, m->u.grant.epoch);
            if (n >= GRANT_FLAGS) ote_le_put32(b + 68, m->u.grant.flags);
            if (n == GRANT_PARENT) {
                ote_le_put64(b + 72, m->u.grant.parent);
                ote_le_put32(b + 80, m->u.grant.budget);
            }
            break;
        case OTE_RP_WRITE_OFF:
            ote_le_put64(b, m->u.wo.req_uid);
            ote_le_put64(b + 8, m->u.wo.req_len);
            ote_le_put64(b + 16, m->u.wo.bytes);
            break;
        case OTE_RP_GRANT_RESP:
            ote_le_put32(b, m->u.resp.rkey);
            if (n >= RESP_STAGED) {
                ote_le_put32(b + 4, m->u.resp.flags);
                ote_le_put64(b + 8, m->u.resp.base);
            }
            if (n == RESP_PAIR) {
                ote_le_put32(b + 16, m->u.resp.near);
                ote_le_put64(b + 24, m->u.resp.reg_addr);
                ote_le_put64(b + 32, m->u.resp.reg_len);
            }
            break;
        case OTE_RP_EP_RESET: ote_le_put32(b, m->u.reset.pair); break;
        case OTE_RP_RELEASE:
            ote_le_put32(b, m->u.rel.pair);
            ote_le_put32(b + 4, m->u.rel.cap);
            ote_le_put32(b + 8, m->u.rel.slot);
            ote_le_put32(b + 12, m->u.rel.src_qpn);
            ote_le_put32(b + 16, m->u.rel.rkey);
            break;
        case OTE_RP_COMMIT: ote_le_put32(b, m->u.commit.rkey); break;
        default: return 0;
    }
    return n;
}

/* Which optional parts a message of this length carries (each type has a few lengths,
 * one per protocol addition; anything else is malformed). */
typedef struct {
    int lng;     /* INFO's device list, CONNECT's and GRANT_REQ's pair (and any longer) */
    int epoch;   /* INFO's, CONNECT's or GRANT_REQ's epochs */
    int gflags;  /* GRANT_REQ's flags word */
    int gparent; /* GRANT_REQ's parent trailer */
    int staged;  /* GRANT_RESP's staged form */
    int rpair;   /* GRANT_RESP's pair form (its staged fields may be 0) */
} shape_t;

static shape_t shape_of(uint16_t type, size_t len) {
    shape_t sh;
    int info = type == OTE_RP_INFO || type == OTE_RP_INFO_ACK;
    sh.gparent = type == OTE_RP_GRANT_REQ && len == GRANT_PARENT;
    sh.gflags = type == OTE_RP_GRANT_REQ && (len == GRANT_FLAGS || sh.gparent);
    sh.staged = type == OTE_RP_GRANT_RESP && len == RESP_STAGED;
    sh.rpair = type == OTE_RP_GRANT_RESP && len == RESP_PAIR;
    sh.epoch = (info && len == INFO_EPOCH) ||
               (type == OTE_RP_GRANT_REQ && (len == GRANT_EPOCH || sh.gflags)) ||
               (type == OTE_RP_CONNECT && len == CONNECT_EPOCH);
    sh.lng = (info && len == INFO_LONG) || (type == OTE_RP_CONNECT && len == CONNECT_LONG) ||
             (type == OTE_RP_GRANT_REQ && len == GRANT_LONG) || sh.epoch || sh.staged || sh.rpair;
    return sh;
}

static ote_status_t decode_info(const uint8_t *b, shape_t sh, ote_rp_msg_t *m) {
    m->u.info.process = ote_le_get64(b);
    m->u.info.pd = ote_le_get64(b + 8);
    m->u.info.nic = ote_le_get32(b + 16);
    m->u.info.lanes = ote_le_get32(b + 20);
    if (m->u.info.lanes == 0 || m->u.info.lanes > 64) return OTE_ERR_PROTOCOL;
    m->u.info.ndev = 1;
    m->u.info.nics[0] = m->u.info.nic;
    if (sh.lng) {
        m->u.info.ndev = ote_le_get32(b + 24);
        if (m->u.info.ndev == 0 || m->u.info.ndev > OTE_RP_MAX_DEVS) return OTE_ERR_PROTOCOL;
        for (uint32_t i = 0; i < m->u.info.ndev; i++)
            m->u.info.nics[i] = ote_le_get32(b + 28 + 4 * i);
        if (m->u.info.nics[0] != m->u.info.nic) return OTE_ERR_PROTOCOL;
    }
    if (sh.epoch) {
        m->u.info.epoch = ote_le_get64(b + 28 + 4 * OTE_RP_MAX_DEVS);
        if (m->u.info.epoch == 0) return OTE_ERR_PROTOCOL; /* sent means known */
    }
    return OTE_OK;
}

static ote_status_t decode_connect(const uint8_t *b, shape_t sh, ote_rp_msg_t *m) {
    m->u.connect.slot = ote_le_get32(b);
    m->u.connect.cap = ote_le_get32(b + 4);
    if (m->u.connect.cap > 3) return OTE_ERR_PROTOCOL; /* 2, 3: direct (proto.h) */
    if (get_path(b + 8, &m->u.connect.path) != OTE_OK) return OTE_ERR_PROTOCOL;
    if (sh.lng) m->u.connect.pair = ote_le_get32(b + 40);
    if (sh.epoch) {
        m->u.connect.epoch = ote_le_get64(b + 44);
        m->u.connect.req_epoch = ote_le_get64(b + 52);
        if (m->u.connect.epoch == 0 || m->u.connect.req_epoch == 0) return OTE_ERR_PROTOCOL;
    }
    return pair_ok(m->u.connect.pair) ? OTE_OK : OTE_ERR_PROTOCOL;
}

/* The trailers of a GRANT_REQ: its flags (sent means set, 0 only before a parent
 * trailer, and only the bits this codec knows) and its parent. */
static ote_status_t decode_grant_trailers(const uint8_t *b, shape_t sh, ote_rp_msg_t *m) {
    if (sh.gflags) {
        m->u.grant.flags = ote_le_get32(b + 68);
        if ((m->u.grant.flags & ~(OTE_RP_GF_STAGE | OTE_RP_GF_PAIR)) != 0 ||
            (m->u.grant.flags == 0 && !sh.gparent))
            return OTE_ERR_PROTOCOL;
    }
    if (sh.gparent) {
        m->u.grant.parent = ote_le_get64(b + 72);
        m->u.grant.budget = ote_le_get32(b + 80);
        if (m->u.grant.parent == 0 || m->u.grant.budget == 0 ||
            m->u.grant.budget > OTE_RP_MAX_BUDGET)
            return OTE_ERR_PROTOCOL;
    }
    return OTE_OK;
}

static ote_status_t decode_grant_req(const uint8_t *b, shape_t sh, ote_rp_msg_t *m) {
    m->u.grant.slot = ote_le_get32(b);
    m->u.grant.op = ote_le_get32(b + 4);
    m->u.grant.dflags = m->u.grant.op & (OTE_RP_GOP_DIRECT_OK | OTE_RP_GOP_DIRECT);
    m->u.grant.op &= ~(OTE_RP_GOP_DIRECT_OK | OTE_RP_GOP_DIRECT);
    m->u.grant.src_qpn = ote_le_get32(b + 8);
    m->u.grant.req_qpn = ote_le_get32(b + 12);
    m->u.grant.addr = ote_le_get64(b + 16);
    m->u.grant.len = ote_le_get64(b + 24);
    m->u.grant.req_addr = ote_le_get64(b + 32);
    m->u.grant.req_len = ote_le_get64(b + 40);
    m->u.grant.req_uid = ote_le_get64(b + 48);
    if (sh.lng) m->u.grant.pair = ote_le_get32(b + 56);
    if (sh.epoch) {
        m->u.grant.epoch = ote_le_get64(b + 60);
        if (m->u.grant.epoch == 0) return OTE_ERR_PROTOCOL;
    }
    if (decode_grant_trailers(b, sh, m) != OTE_OK || !pair_ok(m->u.grant.pair))
        return OTE_ERR_PROTOCOL;
    const uint64_t addr = m->u.grant.addr, len = m->u.grant.len;
    const uint64_t raddr = m->u.grant.req_addr, rlen = m->u.grant.req_len;
    if (m->u.grant.op > 1 || len == 0 || addr > UINT64_MAX - len) return OTE_ERR_PROTOCOL;
    /* The grant's range lies inside the request's extent, which does not wrap. */
    if (rlen < len || raddr > UINT64_MAX - rlen || addr < raddr || addr - raddr > rlen - len)
        return OTE_ERR_PROTOCOL;
    return OTE_OK;
}

/* GRANT_RESP: the staged fields (in the pair form both may be 0: not staged) and the
 * pair form's best devices and registration extent. */
static ote_status_t decode_grant_resp(const uint8_t *b, shape_t sh, ote_rp_msg_t *m) {
    m->u.resp.rkey = ote_le_get32(b);
    if (!sh.staged && !sh.rpair) return OTE_OK;
    m->u.resp.flags = ote_le_get32(b + 4);
    m->u.resp.base = ote_le_get64(b + 8);
    int plain = sh.rpair && m->u.resp.flags == 0 && m->u.resp.base == 0;
    if (!plain && ((m->u.resp.flags != OTE_RP_RESP_STAGED &&
                    m->u.resp.flags != (OTE_RP_RESP_STAGED | OTE_RP_RESP_COMMIT)) ||
                   m->u.resp.base == 0))
        return OTE_ERR_PROTOCOL;
    if (!sh.rpair) return OTE_OK;
    m->u.resp.near = ote_le_get32(b + 16);
    m->u.resp.reg_addr = ote_le_get64(b + 24);
    m->u.resp.reg_len = ote_le_get64(b + 32);
    if (m->u.resp.near == 0 || (m->u.resp.near >> OTE_RP_MAX_DEVS) != 0 ||
        ote_le_get32(b + 20) != 0 || m->u.resp.reg_len == 0 ||
        m->u.resp.reg_addr > UINT64_MAX - m->u.resp.reg_len)
        return OTE_ERR_PROTOCOL;
    return OTE_OK;
}

static ote_status_t decode_release(const uint8_t *b, ote_rp_msg_t *m) {
    m->u.rel.pair = ote_le_get32(b);
    m->u.rel.cap = ote_le_get32(b + 4);
    m->u.rel.slot = ote_le_get32(b + 8);
    m->u.rel.src_qpn = ote_le_get32(b + 12);
    m->u.rel.rkey = ote_le_get32(b + 16);
    if (!pair_ok(m->u.rel.pair) || m->u.rel.cap > 3 || m->u.rel.src_qpn == 0 ||
        m->u.rel.src_qpn > 0xffffff)
        return OTE_ERR_PROTOCOL;
    return OTE_OK;
}

ote_status_t ote__rp_decode(const uint8_t *buf, size_t len, ote_rp_msg_t *out) {
    if (buf == NULL || out == NULL || len < 4) return OTE_ERR_PROTOCOL;
    ote_rp_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = ote_le_get16(buf);
    size_t n = body_size(m.type);
    shape_t sh = shape_of(m.type, len);
    if (n == 0 || (len != n && !sh.lng) || ote_le_get16(buf + 2) != 0) return OTE_ERR_PROTOCOL;
    const uint8_t *b = buf + 4;
    ote_status_t st = OTE_OK;
    switch (m.type) {
        case OTE_RP_INFO:
        case OTE_RP_INFO_ACK: st = decode_info(b, sh, &m); break;
        case OTE_RP_CONNECT: st = decode_connect(b, sh, &m); break;
        case OTE_RP_CONNECT_ACK:
            /* A refusal carries its status in the header and a zero path. */
            if (get_path(b, &m.u.connect.path) != OTE_OK)
                memset(&m.u.connect.path, 0, sizeof(m.u.connect.path));
            break;
        case OTE_RP_GRANT_REQ: st = decode_grant_req(b, sh, &m); break;
        case OTE_RP_GRANT_RESP: st = decode_grant_resp(b, sh, &m); break;
        case OTE_RP_EP_RESET:
            m.u.reset.pair = ote_le_get32(b);
            if (!pair_ok(m.u.reset.pair)) st = OTE_ERR_PROTOCOL;
            break;
        case OTE_RP_WRITE_OFF:
            m.u.wo.req_uid = ote_le_get64(b);
            m.u.wo.req_len = ote_le_get64(b + 8);
            m.u.wo.bytes = ote_le_get64(b + 16);
            break;
        case OTE_RP_RELEASE: st = decode_release(b, &m); break;
        case OTE_RP_COMMIT: m.u.commit.rkey = ote_le_get32(b); break;
        default: return OTE_ERR_PROTOCOL;
    }
    if (st != OTE_OK) return OTE_ERR_PROTOCOL;
    *out = m;
    return OTE_OK;
}

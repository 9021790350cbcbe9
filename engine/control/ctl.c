/* engine/control/ctl.c - frame codec and version negotiation (see ctl.h). */
#include "engine/control/ctl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/le.h"

const char *ote_ctl_opcode_str(uint16_t opcode) {
    switch (opcode) {
        case OTE_CTL_HELLO: return "HELLO";
        case OTE_CTL_HELLO_ACK: return "HELLO_ACK";
        case OTE_CTL_WRITE_REQ: return "WRITE_REQ";
        case OTE_CTL_WRITE_ACK: return "WRITE_ACK";
        case OTE_CTL_READ_REQ: return "READ_REQ";
        case OTE_CTL_READ_RESP: return "READ_RESP";
        case OTE_CTL_NOTIFY: return "NOTIFY";
        case OTE_CTL_NOTIFY_ACK: return "NOTIFY_ACK";
        case OTE_CTL_ERROR: return "ERROR";
        case OTE_CTL_RDMA: return "RDMA";
        case OTE_CTL_CANCEL: return "CANCEL";
        case OTE_CTL_BUFS_REQ: return "BUFS_REQ";
        case OTE_CTL_BUFS: return "BUFS";
        case OTE_CTL_AUTH: return "AUTH";
        default: return "UNKNOWN";
    }
}

void ote_ctl_put_hdr(uint8_t *buf, uint16_t version, uint16_t opcode, uint64_t req_id,
                     ote_status_t status, uint32_t length) {
    ote_le_put32(buf, OTE_CTL_MAGIC);
    ote_le_put16(buf + 4, version);
    ote_le_put16(buf + 6, opcode);
    ote_le_put64(buf + 8, req_id);
    ote_le_put32(buf + 16, (uint32_t)status);
    ote_le_put32(buf + 20, length);
}

ote_status_t ote_ctl_put_rw(uint8_t *buf, uint16_t version, uint16_t opcode, uint64_t req_id,
                            uint64_t addr, uint32_t len) {
    /* 64-bit sum: a len near 4 GiB must not wrap into a short frame length. */
    uint64_t length = OTE_CTL_RW_BODY_LEN + (opcode == OTE_CTL_WRITE_REQ ? (uint64_t)len : 0);
    if (len > OTE_CTL_MAX_DATA || length > OTE_CTL_MAX_FRAME) return OTE_ERR_INVALID;
    ote_ctl_put_hdr(buf, version, opcode, req_id, OTE_OK, (uint32_t)length);
    ote_le_put64(buf + OTE_CTL_HDR_LEN, addr);
    ote_le_put32(buf + OTE_CTL_HDR_LEN + 8, len);
    ote_le_put32(buf + OTE_CTL_HDR_LEN + 12, 0);
    return OTE_OK;
}

static uint32_t rw_body_len(uint16_t version) {
    return version >= 2 ? OTE_CTL_RW2_BODY_LEN : OTE_CTL_RW_BODY_LEN;
}

ote_status_t ote_ctl_put_rw2(uint8_t *buf, uint16_t version, uint16_t opcode, uint64_t req_id,
                             uint64_t addr, uint32_t len, uint64_t req_addr, uint64_t req_len,
                             uint64_t req_uid, uint16_t *frame_len_out) {
    uint32_t body = rw_body_len(version);
    uint64_t length = body + (opcode == OTE_CTL_WRITE_REQ ? (uint64_t)len : 0);
    if (len > OTE_CTL_MAX_DATA || length > OTE_CTL_MAX_FRAME) return OTE_ERR_INVALID;
    ote_ctl_put_hdr(buf, version, opcode, req_id, OTE_OK, (uint32_t)length);
    ote_le_put64(buf + OTE_CTL_HDR_LEN, addr);
    ote_le_put32(buf + OTE_CTL_HDR_LEN + 8, len);
    ote_le_put32(buf + OTE_CTL_HDR_LEN + 12, 0);
    if (body == OTE_CTL_RW2_BODY_LEN) {
        ote_le_put64(buf + OTE_CTL_HDR_LEN + 16, req_addr);
        ote_le_put64(buf + OTE_CTL_HDR_LEN + 24, req_len);
        ote_le_put64(buf + OTE_CTL_HDR_LEN + 32, req_uid);
    }
    *frame_len_out = (uint16_t)(OTE_CTL_HDR_LEN + body);
    return OTE_OK;
}

/* A version-2 slice must lie inside the extent it names, and the extent must not wrap. */
static int rw_extent_ok(const ote_ctl_msg_t *m) {
    uint64_t ra = m->u.rw.req_addr, rl = m->u.rw.req_len;
    if (rl < m->u.rw.len || ra > UINT64_MAX - rl) return 0;
    return m->u.rw.addr >= ra && m->u.rw.addr - ra <= rl - m->u.rw.len;
}

int ote_ctl_buf_name_ok(const char *name, size_t len) {
    if (name == NULL || len == 0 || len >= OTE_CTL_BUF_NAME_LEN) return 0;
    for (size_t i = 0; i < len; i++)
        if (name[i] < 0x20 || name[i] > 0x7e) return 0;
    return 1;
}

int ote_ctl_buf_kind_ok(uint32_t kind) {
    return kind == OTE_CTL_BUF_KIND_HOST || kind == OTE_CTL_BUF_KIND_PINNED ||
           (kind >= OTE_CTL_BUF_KIND_CUDA && kind <= OTE_CTL_BUF_KIND_MAX);
}

/* file_ok: the entry may be a file registration's (a BUFS frame of version >= 4). */
static int buf_entry_ok(const ote_ctl_buf_t *b, size_t name_len, int file_ok) {
    return b->len != 0 && b->addr <= UINT64_MAX - b->len && b->perms != 0 &&
           (b->perms & ~OTE_CTL_BUF_PERMS) == 0 &&
           (ote_ctl_buf_kind_ok(b->kind) || (file_ok && b->kind == OTE_CTL_BUF_KIND_FILE)) &&
           (name_len == 0 || ote_ctl_buf_name_ok(b->name, name_len));
}

ote_status_t ote_ctl_buf_put(uint8_t *dst, const ote_ctl_buf_t *b) {
    if (dst == NULL || b == NULL) return OTE_ERR_INVALID;
    const char *nul = memchr(b->name, '\0', sizeof(b->name));
    if (nul == NULL || !buf_entry_ok(b, (size_t)(nul - b->name), 1)) return OTE_ERR_INVALID;
    ote_le_put64(dst, b->addr);
    ote_le_put64(dst + 8, b->len);
    ote_le_put32(dst + 16, b->perms);
    ote_le_put32(dst + 20, b->kind);
    memset(dst + 24, 0, OTE_CTL_BUF_NAME_LEN);
    memcpy(dst + 24, b->name, (size_t)(nul - b->name));
    return OTE_OK;
}

/* One entry from the wire (a file registration's only with file_ok);
 * OTE_ERR_PROTOCOL when malformed. */
static ote_status_t buf_parse(const uint8_t *p, ote_ctl_buf_t *out, int file_ok) {
    ote_ctl_buf_t b;
    b.addr = ote_le_get64(p);
    b.len = ote_le_get64(p + 8);
    b.perms = ote_le_get32(p + 16);
    b.kind = ote_le_get32(p + 20);
    memcpy(b.name, p + 24, OTE_CTL_BUF_NAME_LEN);
    const char *nul = memchr(b.name, '\0', OTE_CTL_BUF_NAME_LEN);
    if (nul == NULL) return OTE_ERR_PROTOCOL; /* a name of 64 chars, or no terminator */
    size_t nl = (size_t)(nul - b.name);
    for (size_t i = nl; i < OTE_CTL_BUF_NAME_LEN; i++)
        if (b.name[i] != '\0') return OTE_ERR_PROTOCOL; /* padding is NULs only */
    if (!buf_entry_ok(&b, nl, file_ok)) return OTE_ERR_PROTOCOL;
    *out = b;
    return OTE_OK;
}

static ote_status_t decode_bufs(const uint8_t *b, uint32_t body_len, ote_ctl_msg_t *m) {
    m->u.bufs.total = ote_le_get32(b);
    m->u.bufs.count = ote_le_get32(b + 4);
    uint32_t n = m->u.bufs.count;
    if (n > OTE_CTL_BUFS_MAX || n > m->u.bufs.total ||
        8 + (uint64_t)n * OTE_CTL_BUF_ENTRY_LEN != body_len)
        return OTE_ERR_PROTOCOL;
    m->u.bufs.entries = b + 8;
    for (uint32_t i = 0; i < n; i++) {
        ote_ctl_buf_t e;
        if (buf_parse(b + 8 + (size_t)i * OTE_CTL_BUF_ENTRY_LEN, &e,
                      m->version >= OTE_CTL_FILES_VERSION) != OTE_OK)
            return OTE_ERR_PROTOCOL;
    }
    return OTE_OK;
}

ote_status_t ote_ctl_buf_get(const ote_ctl_msg_t *m, uint32_t i, ote_ctl_buf_t *out) {
    if (m == NULL || out == NULL || m->opcode != OTE_CTL_BUFS || m->status != OTE_OK ||
        i >= m->u.bufs.count)
        return OTE_ERR_INVALID;
    ote_status_t st = buf_parse(m->u.bufs.entries + (size_t)i * OTE_CTL_BUF_ENTRY_LEN, out,
                                m->version >= OTE_CTL_FILES_VERSION);
    return st == OTE_OK ? OTE_OK : OTE_ERR_INVALID;
}

/* ---- the metadata blob (ctl.h) ---- */

static int md_addr_ok(const char *a, size_t n) {
    if (n == 0 || n > OTE_CTL_MD_ADDR_MAX) return 0;
    for (size_t i = 0; i < n; i++)
        if (a[i] < 0x21 || a[i] > 0x7e) return 0;
    return 1;
}

/* A metadata blob's engine name: 1..OTE_CTL_MAX_NAME printable ASCII bytes. */
static int md_name_ok(const char *a, size_t n) {
    if (n == 0 || n > OTE_CTL_MAX_NAME) return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)a[i] < 0x20 || (unsigned char)a[i] > 0x7e) return 0;
    return 1;
}

/* The version a blob of these entries and this name is written in: the lowest that
 * carries them, so that engines before files (and before names) read what they can. */
static uint16_t md_version(const ote_ctl_buf_t *bufs, uint32_t n, size_t name_len) {
    for (uint32_t i = 0; i < n; i++)
        if (bufs[i].kind == OTE_CTL_BUF_KIND_FILE) return OTE_CTL_MD_VERSION_FILES;
    return name_len != 0 ? OTE_CTL_MD_VERSION_NAMED : OTE_CTL_MD_VERSION;
}

ote_status_t ote_ctl_md_encode(const char *addr, const char *name, uint64_t epoch,
                               const ote_ctl_buf_t *bufs, uint32_t n, uint8_t *out, size_t cap,
                               size_t *len_out) {
    if (addr == NULL || len_out == NULL || (bufs == NULL && n > 0) || epoch == 0 ||
        n > OTE_CTL_BUFS_MAX)
        return OTE_ERR_INVALID;
    size_t an = strnlen(addr, OTE_CTL_MD_ADDR_MAX + 1);
    size_t nn = name != NULL ? strnlen(name, OTE_CTL_MAX_NAME + 1) : 0;
    if (!md_addr_ok(addr, an) || (nn != 0 && !md_name_ok(name, nn))) return OTE_ERR_INVALID;
    uint16_t ver = md_version(bufs, n, nn);
    size_t body = OTE_CTL_MD_HDR_LEN + an + (size_t)n * OTE_CTL_BUF_ENTRY_LEN;
    size_t need = body + (ver != OTE_CTL_MD_VERSION ? 2 + nn : 0);
    if (out == NULL || cap < need) {
        *len_out = need;
        return OTE_ERR_TOO_BIG;
    }
    uint8_t *ent = out + OTE_CTL_MD_HDR_LEN + an;
    for (uint32_t i = 0; i < n; i++)
        if (ote_ctl_buf_put(ent + (size_t)i * OTE_CTL_BUF_ENTRY_LEN, &bufs[i]) != OTE_OK)
            return OTE_ERR_INVALID;
    ote_le_put32(out, OTE_CTL_MD_MAGIC);
    ote_le_put16(out + 4, ver);
    ote_le_put16(out + 6, (uint16_t)an);
    ote_le_put64(out + 8, epoch);
    ote_le_put32(out + 16, n);
    memcpy(out + OTE_CTL_MD_HDR_LEN, addr, an);
    if (ver != OTE_CTL_MD_VERSION) {
        ote_le_put16(out + body, (uint16_t)nn);
        if (nn != 0) memcpy(out + body + 2, name, nn); /* name may be NULL in version 3 */
    }
    *len_out = need;
    return OTE_OK;
}

ote_status_t ote_ctl_md_decode(const uint8_t *in, size_t len, ote_ctl_md_t *out) {
    if (in == NULL || out == NULL || len < OTE_CTL_MD_HDR_LEN) return OTE_ERR_PROTOCOL;
    uint16_t ver = ote_le_get16(in + 4);
    if (ote_le_get32(in) != OTE_CTL_MD_MAGIC || ver < OTE_CTL_MD_VERSION ||
        ver > OTE_CTL_MD_VERSION_FILES)
        return OTE_ERR_PROTOCOL;
    size_t an = ote_le_get16(in + 6);
    uint64_t epoch = ote_le_get64(in + 8);
    uint32_t n = ote_le_get32(in + 16);
    size_t body = OTE_CTL_MD_HDR_LEN + an + (size_t)n * OTE_CTL_BUF_ENTRY_LEN, nn = 0;
    if (epoch == 0 || n > OTE_CTL_BUFS_MAX || body > len ||
        !md_addr_ok((const char *)in + OTE_CTL_MD_HDR_LEN, an))
        return OTE_ERR_PROTOCOL;
    if (ver == OTE_CTL_MD_VERSION) {
        if (len != body) return OTE_ERR_PROTOCOL;
    } else { /* a name section: 1.. bytes in version 2, 0.. in version 3 */
        if (len < body + 2) return OTE_ERR_PROTOCOL;
        nn = ote_le_get16(in + body);
        if (len != body + 2 + nn || (ver == OTE_CTL_MD_VERSION_NAMED && nn == 0) ||
            (nn != 0 && !md_name_ok((const char *)in + body + 2, nn)))
            return OTE_ERR_PROTOCOL;
    }
    const uint8_t *ent = in + OTE_CTL_MD_HDR_LEN + an;
    int files = 0;
    for (uint32_t i = 0; i < n; i++) {
        ote_ctl_buf_t b;
        if (buf_parse(ent + (size_t)i * OTE_CTL_BUF_ENTRY_LEN, &b,
                      ver == OTE_CTL_MD_VERSION_FILES) != OTE_OK)
            return OTE_ERR_PROTOCOL;
        files |= b.kind == OTE_CTL_BUF_KIND_FILE;
    }
    if (ver == OTE_CTL_MD_VERSION_FILES && !files) return OTE_ERR_PROTOCOL; /* not canonical */
    out->epoch = epoch;
    memcpy(out->addr, in + OTE_CTL_MD_HDR_LEN, an);
    out->addr[an] = '\0';
    if (nn != 0) memcpy(out->name, in + body + 2, nn);
    out->name[nn] = '\0';
    out->count = n;
    out->entries = ent;
    return OTE_OK;
}

ote_status_t ote_ctl_md_buf(const ote_ctl_md_t *md, uint32_t i, ote_ctl_buf_t *out) {
    if (md == NULL || out == NULL || i >= md->count) return OTE_ERR_INVALID;
    /* ote_ctl_md_decode took a file entry only in a version-3 blob */
    ote_status_t st = buf_parse(md->entries + (size_t)i * OTE_CTL_BUF_ENTRY_LEN, out, 1);
    return st == OTE_OK ? OTE_OK : OTE_ERR_INVALID;
}

/* The header's fields into *m, checked: magic, version, known opcode, length. */
static ote_status_t decode_header(const uint8_t *buf, ote_ctl_msg_t *m) {
    if (ote_le_get32(buf) != OTE_CTL_MAGIC) return OTE_ERR_PROTOCOL;
    m->version = ote_le_get16(buf + 4);
    m->opcode = ote_le_get16(buf + 6);
    m->req_id = ote_le_get64(buf + 8);
    m->status = (ote_status_t)ote_le_get32(buf + 16);
    m->length = ote_le_get32(buf + 20);
    if (m->version == 0) return OTE_ERR_PROTOCOL;
    if (m->opcode == 0 || m->opcode > OTE_CTL_OPCODE_MAX) return OTE_ERR_PROTOCOL;
    if (m->length > OTE_CTL_MAX_FRAME) return OTE_ERR_TOO_BIG;
    return OTE_OK;
}

/* The body bytes a frame with header m must carry (consumed by the decoder; the rest of
 * its length is bulk data), after the checks its opcode's header allows. */
static ote_status_t frame_body_len(const ote_ctl_msg_t *m, uint32_t *body_len_out) {
    uint32_t body_len = 0;
    switch (m->opcode) {
        case OTE_CTL_HELLO:
        case OTE_CTL_HELLO_ACK:
        case OTE_CTL_NOTIFY:
        case OTE_CTL_ERROR:
        case OTE_CTL_RDMA:
            if (m->length > OTE_CTL_MAX_BODY) return OTE_ERR_TOO_BIG;
            body_len = m->length;
            break;
        case OTE_CTL_CANCEL:
            if (m->version < 2 || m->status != OTE_OK || m->length < 8 || m->length % 8 != 0 ||
                m->length > OTE_CTL_MAX_BODY)
                return OTE_ERR_PROTOCOL;
            body_len = m->length;
            break;
        case OTE_CTL_WRITE_REQ:
        case OTE_CTL_READ_REQ:
            body_len = rw_body_len(m->version);
            if (m->length < body_len) return OTE_ERR_PROTOCOL;
            break;
        case OTE_CTL_READ_RESP:
            if (m->length > OTE_CTL_MAX_DATA) return OTE_ERR_TOO_BIG;
            if (m->status != OTE_OK && m->length != 0) return OTE_ERR_PROTOCOL;
            body_len = 0;
            break;
        case OTE_CTL_WRITE_ACK:
        case OTE_CTL_NOTIFY_ACK:
            if (m->length != 0) return OTE_ERR_PROTOCOL;
            break;
        case OTE_CTL_BUFS_REQ:
            if (m->length != 0 || m->status != OTE_OK) return OTE_ERR_PROTOCOL;
            break;
        case OTE_CTL_BUFS:
            if (m->length > OTE_CTL_BUFS_MAX_BODY) return OTE_ERR_TOO_BIG;
            if (m->status != OTE_OK ? m->length != 0 : m->length < 8) return OTE_ERR_PROTOCOL;
            body_len = m->length;
            break;
        case OTE_CTL_AUTH:
            if (m->version < OTE_CTL_AUTH_VERSION || m->status != OTE_OK ||
                m->length != OTE_CTL_AUTH_BODY_LEN)
                return OTE_ERR_PROTOCOL;
            body_len = m->length;
            break;
        default: return OTE_ERR_PROTOCOL;
    }
    *body_len_out = body_len;
    return OTE_OK;
}

/* The body of a HELLO_ACK (body_len bytes at b) into *m. */
static ote_status_t decode_hello_ack(const uint8_t *b, uint32_t body_len, ote_ctl_msg_t *m) {
    if (body_len < 8) return OTE_ERR_PROTOCOL;
    m->u.hello_ack.version = ote_le_get16(b);
    m->u.hello_ack.info_len = ote_le_get16(b + 2);
    m->u.hello_ack.max_data = ote_le_get32(b + 4);
    if (m->u.hello_ack.info_len > OTE_CTL_MAX_INFO) return OTE_ERR_TOO_BIG;
    if (m->u.hello_ack.info_len > body_len - 8) return OTE_ERR_PROTOCOL;
    m->u.hello_ack.addr_len = body_len - 8 - m->u.hello_ack.info_len;
    if (m->u.hello_ack.addr_len > OTE_CTL_MAX_ADDR) return OTE_ERR_TOO_BIG;
    if (m->u.hello_ack.version == 0 || m->u.hello_ack.max_data == 0) return OTE_ERR_PROTOCOL;
    m->u.hello_ack.addr = (const char *)(b + 8);
    if (memchr(m->u.hello_ack.addr, '\0', m->u.hello_ack.addr_len) != NULL) return OTE_ERR_PROTOCOL;
    m->u.hello_ack.info = m->u.hello_ack.addr + m->u.hello_ack.addr_len;
    if (memchr(m->u.hello_ack.info, '\0', m->u.hello_ack.info_len) != NULL) return OTE_ERR_PROTOCOL;
    return OTE_OK;
}

/* A HELLO's name trailer (n bytes at t, after the address's NUL): the name, then its
 * NUL, nothing after it. */
static ote_status_t decode_hello_name(const char *t, uint32_t n, ote_ctl_msg_t *m) {
    if (n == 0 || t[n - 1] != '\0') return OTE_ERR_PROTOCOL; /* unterminated */
    uint32_t len = n - 1;
    if (len == 0) return OTE_ERR_PROTOCOL;
    if (len > OTE_CTL_MAX_NAME) return OTE_ERR_TOO_BIG;
    for (uint32_t i = 0; i < len; i++)
        if ((unsigned char)t[i] < 0x20 || (unsigned char)t[i] > 0x7e) return OTE_ERR_PROTOCOL;
    m->u.hello.name = t;
    m->u.hello.name_len = len;
    return OTE_OK;
}

/* The body of a HELLO (body_len bytes at b) into *m. */
static ote_status_t decode_hello(const uint8_t *b, uint32_t body_len, ote_ctl_msg_t *m) {
    if (body_len < 16) return OTE_ERR_PROTOCOL;
    m->u.hello.min_version = ote_le_get16(b);
    m->u.hello.max_version = ote_le_get16(b + 2);
    m->u.hello.role = ote_le_get16(b + 4);
    m->u.hello.conn_index = ote_le_get16(b + 6);
    m->u.hello.session = ote_le_get64(b + 8);
    if (m->u.hello.min_version == 0 || m->u.hello.min_version > m->u.hello.max_version)
        return OTE_ERR_PROTOCOL;
    const char *a = (const char *)(b + 16);
    uint32_t rest = body_len - 16;
    const char *nul = memchr(a, '\0', rest);
    m->u.hello.addr = a;
    m->u.hello.addr_len = nul != NULL ? (uint32_t)(nul - a) : rest;
    if (m->u.hello.addr_len > OTE_CTL_MAX_ADDR) return OTE_ERR_TOO_BIG;
    if (nul == NULL) return OTE_OK; /* no name */
    return decode_hello_name(nul + 1, rest - m->u.hello.addr_len - 1, m);
}

/* The body of a WRITE_REQ or READ_REQ (body_len bytes at b, version 1 or 2) into *m;
 * a WRITE's data follows (m->data_len). */
static ote_status_t decode_rw(const uint8_t *b, uint32_t body_len, ote_ctl_msg_t *m) {
    m->u.rw.addr = ote_le_get64(b);
    m->u.rw.len = ote_le_get32(b + 8);
    m->u.rw.flags = ote_le_get32(b + 12);
    if (m->u.rw.len > OTE_CTL_MAX_DATA) return OTE_ERR_TOO_BIG;
    if (m->u.rw.flags != 0) return OTE_ERR_PROTOCOL;
    if (m->u.rw.len != 0 && m->u.rw.addr > UINT64_MAX - m->u.rw.len) return OTE_ERR_PROTOCOL;
    m->u.rw.req_addr = m->u.rw.addr;
    m->u.rw.req_len = m->u.rw.len;
    if (body_len == OTE_CTL_RW2_BODY_LEN) {
        m->u.rw.req_addr = ote_le_get64(b + 16);
        m->u.rw.req_len = ote_le_get64(b + 24);
        m->u.rw.req_uid = ote_le_get64(b + 32);
        if (!rw_extent_ok(m) || m->u.rw.req_uid == 0) return OTE_ERR_PROTOCOL;
    }
    if (m->opcode == OTE_CTL_WRITE_REQ) {
        if (m->length - body_len != m->u.rw.len) return OTE_ERR_PROTOCOL;
        m->data_len = m->u.rw.len;
    } else if (m->length != body_len) {
        return OTE_ERR_PROTOCOL;
    }
    if (m->status != OTE_OK) return OTE_ERR_PROTOCOL;
    return OTE_OK;
}

/* The body of a CANCEL (body_len bytes at b) into *m: its ids and withdrawals. */
static ote_status_t decode_cancel(const uint8_t *b, uint32_t body_len, ote_ctl_msg_t *m) {
    m->u.cancel.count = ote_le_get32(b);
    m->u.cancel.nwd = ote_le_get32(b + 4);
    if (m->u.cancel.count > OTE_CTL_CANCEL_MAX || m->u.cancel.nwd > OTE_CTL_CANCEL_MAX ||
        m->u.cancel.count + m->u.cancel.nwd == 0 ||
        8 + 8 * (uint64_t)m->u.cancel.count + 24 * (uint64_t)m->u.cancel.nwd != body_len)
        return OTE_ERR_PROTOCOL;
    m->u.cancel.ids = b + 8;
    m->u.cancel.wd = b + 8 + 8 * (size_t)m->u.cancel.count;
    return OTE_OK;
}

/* The body of an AUTH (OTE_CTL_AUTH_BODY_LEN bytes at b) into *m: its step, nonce, mac. */
static ote_status_t decode_auth(const uint8_t *b, ote_ctl_msg_t *m) {
    m->u.auth.step = ote_le_get16(b);
    if (m->u.auth.step < OTE_CTL_AUTH_CHALLENGE || m->u.auth.step > OTE_CTL_AUTH_OK ||
        ote_le_get16(b + 2) != 0 || ote_le_get32(b + 4) != 0)
        return OTE_ERR_PROTOCOL;
    m->u.auth.nonce = b + 8;
    m->u.auth.mac = b + 8 + OTE_CTL_AUTH_NONCE_LEN;
    return OTE_OK;
}

/* The body of an ERROR (body_len bytes at b) into *m: the peer's versions and text; an
 * ERROR must carry a status. */
static ote_status_t decode_error(const uint8_t *b, uint32_t body_len, ote_ctl_msg_t *m) {
    if (body_len < 4) return OTE_ERR_PROTOCOL;
    m->u.error.min_version = ote_le_get16(b);
    m->u.error.max_version = ote_le_get16(b + 2);
    m->u.error.text_len = body_len - 4;
    if (m->u.error.text_len > OTE_CTL_MAX_TEXT) return OTE_ERR_TOO_BIG;
    m->u.error.text = (const char *)(b + 4);
    if (m->status == OTE_OK) return OTE_ERR_PROTOCOL;
    return OTE_OK;
}

/* The body of the frame whose header is in *m (body_len bytes at b, all present) into
 * *m, by opcode; opcodes without a body are left as the header made them. */
static ote_status_t decode_body(const uint8_t *b, uint32_t body_len, ote_ctl_msg_t *m) {
    switch (m->opcode) {
        case OTE_CTL_HELLO: return decode_hello(b, body_len, m);
        case OTE_CTL_HELLO_ACK: return decode_hello_ack(b, body_len, m);
        case OTE_CTL_WRITE_REQ:
        case OTE_CTL_READ_REQ: return decode_rw(b, body_len, m);
        case OTE_CTL_READ_RESP: m->data_len = m->length; return OTE_OK;
        case OTE_CTL_NOTIFY:
            if (body_len > OTE_CTL_MAX_NOTIFY) return OTE_ERR_TOO_BIG;
            m->u.notify.msg = b;
            m->u.notify.len = body_len;
            return OTE_OK;
        case OTE_CTL_CANCEL: return decode_cancel(b, body_len, m);
        case OTE_CTL_BUFS:
            if (m->status == OTE_OK && decode_bufs(b, body_len, m) != OTE_OK)
                return OTE_ERR_PROTOCOL;
            return OTE_OK;
        case OTE_CTL_AUTH: return decode_auth(b, m);
        case OTE_CTL_RDMA: /* opaque here; engine/rdma/proto.c checks the body */
            m->u.rdma.body = b;
            m->u.rdma.len = body_len;
            return OTE_OK;
        case OTE_CTL_ERROR: return decode_error(b, body_len, m);
        default: return OTE_OK;
    }
}

ote_status_t ote_ctl_decode(const uint8_t *buf, size_t len, ote_ctl_msg_t *out,
                            size_t *consumed_out) {
    if (buf == NULL || out == NULL || consumed_out == NULL) return OTE_ERR_INVALID;
    if (len < OTE_CTL_HDR_LEN) {
        /* Reject garbage as early as its first bytes allow. */
        uint8_t magic[4];
        ote_le_put32(magic, OTE_CTL_MAGIC);
        if (memcmp(buf, magic, len < 4 ? len : 4) != 0) return OTE_ERR_PROTOCOL;
        return OTE_ERR_AGAIN;
    }
    ote_ctl_msg_t m;
    memset(&m, 0, sizeof(m));
    ote_status_t st = decode_header(buf, &m);
    if (st != OTE_OK) return st;

    /* body_len: bytes that must be present and are consumed; the rest is bulk data. */
    uint32_t body_len = 0;
    st = frame_body_len(&m, &body_len);
    if (st != OTE_OK) return st;
    if (len - OTE_CTL_HDR_LEN < body_len) return OTE_ERR_AGAIN;
    st = decode_body(buf + OTE_CTL_HDR_LEN, body_len, &m);
    if (st != OTE_OK) return st;
    *out = m;
    *consumed_out = OTE_CTL_HDR_LEN + body_len;
    return OTE_OK;
}

/* Body bytes of the HELLO m encodes: the address must hold no NUL, the name (optional)
 * be printable; OTE_ERR_INVALID otherwise. */
static ote_status_t hello_size(const ote_ctl_msg_t *m, uint32_t *body) {
    uint32_t al = m->u.hello.addr_len, nl = m->u.hello.name_len;
    if (al > OTE_CTL_MAX_ADDR || nl > OTE_CTL_MAX_NAME) return OTE_ERR_INVALID;
    if (al != 0 && memchr(m->u.hello.addr, '\0', al) != NULL) return OTE_ERR_INVALID;
    for (uint32_t i = 0; i < nl; i++)
        if ((unsigned char)m->u.hello.name[i] < 0x20 || (unsigned char)m->u.hello.name[i] > 0x7e)
            return OTE_ERR_INVALID;
    *body = 16 + al + (nl != 0 ? nl + 2 : 0);
    return OTE_OK;
}

/* Body bytes (and bulk bytes that follow) of the frame m encodes; OTE_ERR_INVALID for
 * out-of-range fields. */
static ote_status_t encode_size(const ote_ctl_msg_t *m, uint32_t *body, uint32_t *data) {
    *body = 0;
    *data = 0;
    switch (m->opcode) {
        case OTE_CTL_HELLO: return hello_size(m, body);
        case OTE_CTL_HELLO_ACK:
            if (m->u.hello_ack.addr_len > OTE_CTL_MAX_ADDR) return OTE_ERR_INVALID;
            if (m->u.hello_ack.info_len > OTE_CTL_MAX_INFO) return OTE_ERR_INVALID;
            *body = 8 + m->u.hello_ack.addr_len + m->u.hello_ack.info_len;
            break;
        case OTE_CTL_WRITE_REQ:
        case OTE_CTL_READ_REQ:
            if (m->u.rw.len > OTE_CTL_MAX_DATA) return OTE_ERR_INVALID;
            *body = rw_body_len(m->version);
            if (m->opcode == OTE_CTL_WRITE_REQ) *data = m->u.rw.len;
            break;
        case OTE_CTL_READ_RESP:
            if (m->data_len > OTE_CTL_MAX_DATA) return OTE_ERR_INVALID;
            *data = m->data_len;
            break;
        case OTE_CTL_NOTIFY:
            if (m->u.notify.len > OTE_CTL_MAX_NOTIFY) return OTE_ERR_INVALID;
            *body = m->u.notify.len;
            break;
        case OTE_CTL_ERROR:
            if (m->u.error.text_len > OTE_CTL_MAX_TEXT) return OTE_ERR_INVALID;
            *body = 4 + m->u.error.text_len;
            break;
        case OTE_CTL_RDMA:
            if (m->u.rdma.len > OTE_CTL_MAX_BODY) return OTE_ERR_INVALID;
            *body = m->u.rdma.len;
            break;
        case OTE_CTL_CANCEL:
            if (m->version < 2 || m->u.cancel.count + m->u.cancel.nwd == 0 ||
                m->u.cancel.count > OTE_CTL_CANCEL_MAX || m->u.cancel.nwd > OTE_CTL_CANCEL_MAX)
                return OTE_ERR_INVALID;
            *body = 8 + 8 * m->u.cancel.count + 24 * m->u.cancel.nwd;
            break;
        case OTE_CTL_BUFS:
            if (m->status != OTE_OK) break;
            if (m->u.bufs.count > OTE_CTL_BUFS_MAX || m->u.bufs.count > m->u.bufs.total ||
                (m->u.bufs.count > 0 && m->u.bufs.entries == NULL))
                return OTE_ERR_INVALID;
            /* A file registration only where the requester speaks version 4. */
            for (uint32_t i = 0; m->version < OTE_CTL_FILES_VERSION && i < m->u.bufs.count; i++)
                if (ote_le_get32(m->u.bufs.entries + (size_t)i * OTE_CTL_BUF_ENTRY_LEN + 20) ==
                    OTE_CTL_BUF_KIND_FILE)
                    return OTE_ERR_INVALID;
            *body = 8 + m->u.bufs.count * OTE_CTL_BUF_ENTRY_LEN;
            break;
        case OTE_CTL_AUTH:
            if (m->version < OTE_CTL_AUTH_VERSION || m->status != OTE_OK ||
                m->u.auth.step < OTE_CTL_AUTH_CHALLENGE || m->u.auth.step > OTE_CTL_AUTH_OK)
                return OTE_ERR_INVALID;
            *body = OTE_CTL_AUTH_BODY_LEN;
            break;
        default: break;
    }
    return OTE_OK;
}

ote_status_t ote_ctl_encode(const ote_ctl_msg_t *m, uint8_t *buf, size_t cap, size_t *len_out) {
    if (m == NULL || buf == NULL || len_out == NULL) return OTE_ERR_INVALID;
    if (m->version == 0 || m->opcode == 0 || m->opcode > OTE_CTL_OPCODE_MAX) return OTE_ERR_INVALID;
    uint32_t body = 0, data = 0;
    ote_status_t st = encode_size(m, &body, &data);
    if (st != OTE_OK) return st;
    if (cap < OTE_CTL_HDR_LEN + (size_t)body) return OTE_ERR_TOO_BIG;
    ote_ctl_put_hdr(buf, m->version, m->opcode, m->req_id, m->status, body + data);
    uint8_t *b = buf + OTE_CTL_HDR_LEN;
    switch (m->opcode) {
        case OTE_CTL_HELLO:
            ote_le_put16(b, m->u.hello.min_version);
            ote_le_put16(b + 2, m->u.hello.max_version);
            ote_le_put16(b + 4, m->u.hello.role);
            ote_le_put16(b + 6, m->u.hello.conn_index);
            ote_le_put64(b + 8, m->u.hello.session);
            if (m->u.hello.addr_len) memcpy(b + 16, m->u.hello.addr, m->u.hello.addr_len);
            if (m->u.hello.name_len) {
                uint8_t *t = b + 16 + m->u.hello.addr_len;
                t[0] = '\0';
                memcpy(t + 1, m->u.hello.name, m->u.hello.name_len);
                t[1 + m->u.hello.name_len] = '\0';
            }
            break;
        case OTE_CTL_HELLO_ACK:
            ote_le_put16(b, m->u.hello_ack.version);
            ote_le_put16(b + 2, m->u.hello_ack.info_len);
            ote_le_put32(b + 4, m->u.hello_ack.max_data);
            if (m->u.hello_ack.addr_len)
                memcpy(b + 8, m->u.hello_ack.addr, m->u.hello_ack.addr_len);
            if (m->u.hello_ack.info_len)
                memcpy(b + 8 + m->u.hello_ack.addr_len, m->u.hello_ack.info,
                       m->u.hello_ack.info_len);
            break;
        case OTE_CTL_WRITE_REQ:
        case OTE_CTL_READ_REQ:
            ote_le_put64(b, m->u.rw.addr);
            ote_le_put32(b + 8, m->u.rw.len);
            ote_le_put32(b + 12, 0);
            if (body == OTE_CTL_RW2_BODY_LEN) {
                int ext = m->u.rw.req_len != 0;
                ote_le_put64(b + 16, ext ? m->u.rw.req_addr : m->u.rw.addr);
                ote_le_put64(b + 24, ext ? m->u.rw.req_len : m->u.rw.len);
                ote_le_put64(b + 32, m->u.rw.req_uid);
            }
            break;
        case OTE_CTL_NOTIFY:
            if (m->u.notify.len) memcpy(b, m->u.notify.msg, m->u.notify.len);
            break;
        case OTE_CTL_ERROR:
            ote_le_put16(b, m->u.error.min_version);
            ote_le_put16(b + 2, m->u.error.max_version);
            if (m->u.error.text_len) memcpy(b + 4, m->u.error.text, m->u.error.text_len);
            break;
        case OTE_CTL_RDMA:
            if (m->u.rdma.len) memcpy(b, m->u.rdma.body, m->u.rdma.len);
            break;
        case OTE_CTL_CANCEL:
            ote_le_put32(b, m->u.cancel.count);
            ote_le_put32(b + 4, m->u.cancel.nwd);
            if (m->u.cancel.count) memcpy(b + 8, m->u.cancel.ids, 8 * (size_t)m->u.cancel.count);
            if (m->u.cancel.nwd)
                memcpy(b + 8 + 8 * (size_t)m->u.cancel.count, m->u.cancel.wd,
                       24 * (size_t)m->u.cancel.nwd);
            break;
        case OTE_CTL_BUFS:
            if (m->status != OTE_OK) break;
            ote_le_put32(b, m->u.bufs.total);
            ote_le_put32(b + 4, m->u.bufs.count);
            /* memmove: the source builds its entries in place (entries == b + 8). */
            if (m->u.bufs.count)
                memmove(b + 8, m->u.bufs.entries, (size_t)m->u.bufs.count * OTE_CTL_BUF_ENTRY_LEN);
            break;
        case OTE_CTL_AUTH:
            memset(b, 0, OTE_CTL_AUTH_BODY_LEN);
            ote_le_put16(b, m->u.auth.step);
            if (m->u.auth.nonce) memcpy(b + 8, m->u.auth.nonce, OTE_CTL_AUTH_NONCE_LEN);
            if (m->u.auth.mac)
                memcpy(b + 8 + OTE_CTL_AUTH_NONCE_LEN, m->u.auth.mac, OTE_CTL_AUTH_MAC_LEN);
            break;
        default: break;
    }
    *len_out = OTE_CTL_HDR_LEN + body;
    return OTE_OK;
}

ote_status_t ote_ctl_negotiate(const ote_ctl_msg_t *hello, uint16_t my_min, uint16_t my_max,
                               uint16_t *version_out) {
    if (hello == NULL || version_out == NULL) return OTE_ERR_INVALID;
    if (hello->opcode != OTE_CTL_HELLO) return OTE_ERR_PROTOCOL;
    uint16_t lo = hello->u.hello.min_version, hi = hello->u.hello.max_version;
    if (lo == 0 || lo > hi) return OTE_ERR_PROTOCOL;
    uint16_t best = hi < my_max ? hi : my_max;
    uint16_t floor = lo > my_min ? lo : my_min;
    if (best < floor) return OTE_ERR_VERSION;
    *version_out = best;
    return OTE_OK;
}

ote_status_t ote_ctl_check_hello_ack(const ote_ctl_msg_t *ack, uint16_t my_min, uint16_t my_max,
                                     uint16_t *version_out) {
    if (ack == NULL || version_out == NULL) return OTE_ERR_INVALID;
    if (ack->opcode == OTE_CTL_ERROR) {
        if (ote_status_code(ack->status) == OTE_ERR_VERSION) return OTE_ERR_VERSION;
        return ote_ctl_peer_status(OTE_CTL_ERROR, ack->status);
    }
    if (ack->opcode != OTE_CTL_HELLO_ACK) return OTE_ERR_PROTOCOL;
    uint16_t v = ack->u.hello_ack.version;
    if (v < my_min || v > my_max || ack->version != v) return OTE_ERR_VERSION;
    uint32_t md = ack->u.hello_ack.max_data;
    if (md < OTE_CTL_MIN_DATA || md > OTE_CTL_MAX_DATA) return OTE_ERR_PROTOCOL;
    *version_out = v;
    return OTE_OK;
}

ote_status_t ote_ctl_peer_status(uint16_t opcode, ote_status_t st) {
    int code = ote_status_code(st);
    if (st == OTE_OK) return opcode == OTE_CTL_ERROR ? OTE_ERR_PROTOCOL : OTE_OK;
    if (code == OTE_OK) return OTE_ERR_PROTOCOL; /* "success" with stray bits */
    if (ote_status_errno(st) != 0 || (uint32_t)st >> 31) return OTE_ERR_REMOTE;
    int ok = 0;
    switch (opcode) {
        case OTE_CTL_WRITE_ACK:
        case OTE_CTL_READ_RESP:
            ok = code == OTE_ERR_ACCESS || code == OTE_ERR_INVALID || code == OTE_ERR_TOO_BIG ||
                 code == OTE_ERR_REMOTE_ACCESS || code == OTE_ERR_REMOTE ||
                 (opcode == OTE_CTL_READ_RESP && code == OTE_ERR_CANCELED);
            break;
        case OTE_CTL_NOTIFY_ACK:
            ok = code == OTE_ERR_AGAIN || code == OTE_ERR_INVALID || code == OTE_ERR_TOO_BIG ||
                 code == OTE_ERR_REMOTE;
            break;
        case OTE_CTL_ERROR:
            ok = code == OTE_ERR_VERSION || code == OTE_ERR_PROTOCOL || code == OTE_ERR_INVALID ||
                 code == OTE_ERR_UNSUPPORTED || code == OTE_ERR_REMOTE || code == OTE_ERR_AUTH;
            break;
        case OTE_CTL_RDMA:
            ok = code == OTE_ERR_ACCESS || code == OTE_ERR_INVALID || code == OTE_ERR_TOO_BIG ||
                 code == OTE_ERR_AGAIN || code == OTE_ERR_UNSUPPORTED ||
                 code == OTE_ERR_REMOTE_ACCESS || code == OTE_ERR_REMOTE;
            break;
        case OTE_CTL_BUFS: ok = code == OTE_ERR_AGAIN || code == OTE_ERR_REMOTE; break;
        default: break;
    }
    return ok ? (ote_status_t)code : OTE_ERR_REMOTE;
}

ote_status_t ote_ctl_info_get(const char *info, const char *key, char *out, size_t cap) {
    if (info == NULL || key == NULL || out == NULL || cap == 0) return OTE_ERR_INVALID;
    size_t kl = strlen(key);
    for (const char *p = info; *p;) {
        const char *end = strchr(p, ';');
        size_t fl = end ? (size_t)(end - p) : strlen(p);
        if (fl > kl && memcmp(p, key, kl) == 0 && p[kl] == '=') {
            size_t vl = fl - kl - 1;
            if (vl >= cap) return OTE_ERR_TOO_BIG;
            memcpy(out, p + kl + 1, vl);
            out[vl] = '\0';
            return OTE_OK;
        }
        if (end == NULL) break;
        p = end + 1;
    }
    return OTE_ERR_NOT_FOUND;
}

uint64_t ote_ctl_info_incarnation(const char *info) {
    if (info == NULL) return 0;
    char v[64];
    if (ote_ctl_info_get(info, "epoch", v, sizeof(v)) == OTE_OK) {
        char *end = NULL;
        errno = 0;
        unsigned long long e = strtoull(v, &end, 16);
        if (errno == 0 && end != v && *end == '\0' && e != 0) return (uint64_t)e;
    }
    char boot[64], pid[24];
    if (ote_ctl_info_get(info, "boot", boot, sizeof(boot)) != OTE_OK ||
        ote_ctl_info_get(info, "pid", pid, sizeof(pid)) != OTE_OK)
        return 0;
    const char *parts[3] = {boot, "/", pid};
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a over "boot/pid" */
    for (int i = 0; i < 3; i++)
        for (const char *c = parts[i]; *c; c++) h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
    return h != 0 ? h : 1;
}

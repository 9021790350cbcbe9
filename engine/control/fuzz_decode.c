/*
 * engine/control/fuzz_decode.c - libFuzzer target over the frame decoder and the
 * handshake checks. Built by tests/fuzz/run_fuzz.sh with
 * clang -fsanitize=fuzzer,address,undefined; not part of the engine library.
 *
 * The input is treated as a stream of frames, exactly as a connection's receive buffer
 * is: decode, skip the bulk data the frame announces, repeat. Every decoded message is
 * also re-encoded and decoded again (the round trip must agree), HELLO / HELLO_ACK /
 * ERROR frames go through the handshake checks, and every entry of a BUFS frame (buffer
 * discovery) is read back and re-encoded to its own bytes. The whole input is also
 * decoded as an engine metadata blob (ote_engine_metadata), which must round-trip.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/control/ctl.h"

static void check(int cond) {
    if (!cond) __builtin_trap();
}

/* A decoded BUFS frame: every entry reads back valid and re-encodes to its own bytes. */
static void check_bufs(const ote_ctl_msg_t *m, size_t used) {
    if (m->status != OTE_OK) {
        check(used == OTE_CTL_HDR_LEN);
        return;
    }
    check(m->u.bufs.count <= OTE_CTL_BUFS_MAX && m->u.bufs.count <= m->u.bufs.total);
    check(used == OTE_CTL_HDR_LEN + 8 + (size_t)m->u.bufs.count * OTE_CTL_BUF_ENTRY_LEN);
    for (uint32_t i = 0; i < m->u.bufs.count; i++) {
        ote_ctl_buf_t b;
        check(ote_ctl_buf_get(m, i, &b) == OTE_OK);
        size_t nl = strnlen(b.name, sizeof(b.name));
        check(nl < sizeof(b.name));
        check(nl == 0 || ote_ctl_buf_name_ok(b.name, nl));
        check(b.len != 0 && b.addr <= UINT64_MAX - b.len && b.perms != 0);
        uint8_t ent[OTE_CTL_BUF_ENTRY_LEN];
        check(ote_ctl_buf_put(ent, &b) == OTE_OK);
        check(memcmp(ent, m->u.bufs.entries + (size_t)i * OTE_CTL_BUF_ENTRY_LEN, sizeof(ent)) == 0);
    }
    ote_ctl_buf_t b;
    check(ote_ctl_buf_get(m, m->u.bufs.count, &b) == OTE_ERR_INVALID);
}

/* The whole input as an engine metadata blob (ote_ctl_md_decode): when it decodes, every
 * entry reads back, and encoding what was decoded gives the input's bytes again. */
static void check_md(const uint8_t *data, size_t size) {
    ote_ctl_md_t md;
    if (ote_ctl_md_decode(data, size, &md) != OTE_OK) return;
    check(md.epoch != 0 && md.count <= OTE_CTL_BUFS_MAX && md.addr[0] != '\0');
    ote_ctl_buf_t *bufs = md.count > 0 ? calloc(md.count, sizeof(*bufs)) : NULL;
    check(md.count == 0 || bufs != NULL);
    for (uint32_t i = 0; i < md.count; i++) check(ote_ctl_md_buf(&md, i, &bufs[i]) == OTE_OK);
    ote_ctl_buf_t past;
    check(ote_ctl_md_buf(&md, md.count, &past) == OTE_ERR_INVALID);
    uint8_t *again = malloc(size);
    size_t len = 0;
    check(again != NULL);
    check(strlen(md.name) <= OTE_CTL_MAX_NAME);
    check(ote_ctl_md_encode(md.addr, md.name, md.epoch, bufs, md.count, again, size, &len) ==
          OTE_OK);
    check(len == size && memcmp(again, data, size) == 0);
    free(again);
    free(bufs);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    check_md(data, size);
    size_t off = 0;
    int frames = 0;
    while (off < size && frames < 256) {
        ote_ctl_msg_t m;
        size_t used = 0;
        ote_status_t st = ote_ctl_decode(data + off, size - off, &m, &used);
        if (st != OTE_OK) {
            check(st == OTE_ERR_AGAIN || st == OTE_ERR_PROTOCOL || st == OTE_ERR_TOO_BIG);
            break;
        }
        check(used >= OTE_CTL_HDR_LEN && used <= size - off);
        check(m.data_len <= OTE_CTL_MAX_DATA);
        frames++;

        uint16_t ver = 0;
        if (m.opcode == OTE_CTL_HELLO) {
            st = ote_ctl_negotiate(&m, OTE_CTL_VERSION_MIN, OTE_CTL_VERSION_MAX, &ver);
            check(st == OTE_OK || st == OTE_ERR_VERSION);
            if (st == OTE_OK) check(ver >= OTE_CTL_VERSION_MIN && ver <= OTE_CTL_VERSION_MAX);
            /* The address holds no NUL; a name is 1..OTE_CTL_MAX_NAME printable bytes, and
             * the HELLO encodes back byte for byte. */
            check(m.u.hello.addr_len <= OTE_CTL_MAX_ADDR &&
                  memchr(m.u.hello.addr, '\0', m.u.hello.addr_len) == NULL);
            check(m.u.hello.name_len <= OTE_CTL_MAX_NAME &&
                  (m.u.hello.name_len == 0) == (m.u.hello.name == NULL));
            for (uint32_t i = 0; i < m.u.hello.name_len; i++)
                check(m.u.hello.name[i] >= 0x20 && m.u.hello.name[i] <= 0x7e);
            uint8_t hb[OTE_CTL_HDR_LEN + OTE_CTL_MAX_HELLO_BODY];
            size_t hl = 0;
            check(ote_ctl_encode(&m, hb, sizeof(hb), &hl) == OTE_OK && hl == used);
            check(memcmp(hb, data + off, used) == 0);
        }
        if (m.opcode == OTE_CTL_HELLO_ACK || m.opcode == OTE_CTL_ERROR) {
            st = ote_ctl_check_hello_ack(&m, OTE_CTL_VERSION_MIN, OTE_CTL_VERSION_MAX, &ver);
            if (st == OTE_OK) check(ver >= OTE_CTL_VERSION_MIN && ver <= OTE_CTL_VERSION_MAX);
        }
        if (m.opcode == OTE_CTL_BUFS) check_bufs(&m, used);
        if (m.opcode == OTE_CTL_AUTH) {
            /* Only in version >= 3, fixed size, a known step; encodes back byte for byte. */
            check(m.version >= OTE_CTL_AUTH_VERSION && used == OTE_CTL_AUTH_FRAME_LEN);
            check(m.u.auth.step >= OTE_CTL_AUTH_CHALLENGE && m.u.auth.step <= OTE_CTL_AUTH_OK);
            uint8_t ab[OTE_CTL_AUTH_FRAME_LEN];
            size_t al = 0;
            check(ote_ctl_encode(&m, ab, sizeof(ab), &al) == OTE_OK && al == used);
            check(memcmp(ab, data + off, used) == 0);
        }

        /* Round trip: what decodes must encode to the same header + body. */
        uint8_t *buf = malloc(used);
        if (buf != NULL) {
            size_t len = 0;
            st = ote_ctl_encode(&m, buf, used, &len);
            if (st == OTE_OK) {
                check(len == used);
                check(memcmp(buf, data + off, 20) == 0 || m.opcode == OTE_CTL_WRITE_REQ ||
                      m.opcode == OTE_CTL_READ_REQ || m.opcode == OTE_CTL_HELLO_ACK);
                ote_ctl_msg_t again;
                size_t used2 = 0;
                check(ote_ctl_decode(buf, len, &again, &used2) == OTE_OK);
                check(used2 == used && again.opcode == m.opcode && again.req_id == m.req_id);
            }
            free(buf);
        }
        off += used;
        /* Skip the announced bulk data, as a connection would. */
        if (m.data_len > size - off) break;
        off += m.data_len;
    }
    return 0;
}

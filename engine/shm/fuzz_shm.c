/*
 * engine/shm/fuzz_shm.c - libFuzzer target over the checks of the same-host transport's
 * wire messages (shm_proto.h): the HELLO, the SHM_AUTH steps of the key's
 * challenge-response, the HELLO_ACK, REQS and RESPS headers and entries, the CUDA IPC
 * offer and close receipt, the SHM_MAP of a shared allocation. The input is one SOCK_SEQPACKET message, given to every check
 * as the receiving side would. Built by tests/fuzz/run_fuzz.sh with
 * clang -fsanitize=fuzzer,address,undefined; not part of the transport library.
 *
 * Built with -DOTE_SHM_FUZZ_SEEDS instead (no libFuzzer), it is a program that writes
 * one well-formed message of each kind into the directory named by its argument: the
 * seed corpus, laid out by the same structs as the transport's.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "engine/control/ctl.h"
#include "engine/shm/shm_proto.h"

static void check(int cond) {
    if (!cond) __builtin_trap();
}

/* Every entry of a REQS message read back as the source does (memcpy: the message may
 * sit at any alignment), its flags and ring range checked for consistency. */
static void check_reqs(const uint8_t *data, size_t size, int cnt) {
    static uint8_t ring_byte;
    for (int i = 0; i < cnt; i++) {
        shm_req_t q;
        memcpy(&q, data + sizeof(shm_hdr_t) + (size_t)i * sizeof(q), sizeof(q));
        int ok0 = ote__shm_req_flags_ok(q.flags, 0, 0), ok1 = ote__shm_req_flags_ok(q.flags, 1, 0);
        int oks = ote__shm_req_flags_ok(q.flags, 0, 1);
        if (ok0) check(ok1 && oks && (q.flags & ~SHM_REQ_RING) == 0);
        if (oks) check((q.flags & ~(SHM_REQ_RING | SHM_REQ_SHARED)) == 0);
        if (oks && (q.flags & SHM_REQ_SHARED)) check(!(q.flags & SHM_REQ_RING));
        if (ok1) check((q.flags & ~(SHM_REQ_RING | SHM_REQ_IPC | SHM_REQ_LOCAL_DEV)) == 0);
        if (ok1 && (q.flags & SHM_REQ_LOCAL_DEV))
            check((q.flags & SHM_REQ_IPC) && !(q.flags & SHM_REQ_RING));
        if (ote__shm_ring_range_ok(&ring_byte, SHM_RING_BYTES, q.local, q.len))
            check(q.local <= SHM_RING_BYTES && (uint64_t)q.local + q.len <= SHM_RING_BYTES);
        check(!ote__shm_ring_range_ok(NULL, SHM_RING_BYTES, q.local, q.len));
    }
    (void)size;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    shm_hello_t h;
    if (ote__shm_hello_decode(data, size, &h) == 0) {
        check((size == sizeof(h) || size == SHM_HELLO_BASE_LEN) && h.h.magic == SHM_MAGIC &&
              h.h.kind == SHM_HELLO);
        check(strnlen(h.addr, sizeof(h.addr)) < sizeof(h.addr));
        size_t nl = strnlen(h.name, sizeof(h.name));
        check(nl <= OTE_CTL_MAX_NAME && (size == sizeof(h) || nl == 0));
        for (size_t i = 0; i < nl; i++) check(h.name[i] >= 0x20 && h.name[i] <= 0x7e);
    }
    for (uint16_t step = 0; step <= OTE_CTL_AUTH_OK + 1; step++) {
        shm_auth_t a;
        if (ote__shm_auth_decode(data, size, step, &a) == 0) {
            check(size == sizeof(a) && a.h.kind == SHM_AUTH && a.step == step);
            check(memcmp(&a, data, sizeof(a)) == 0); /* taken as it came */
        }
    }
    shm_hello_ack_t k;
    if (ote__shm_ack_decode(data, size, &k) == 0) {
        check(size == sizeof(k) && k.h.kind == SHM_HELLO_ACK);
        check(strnlen(k.text, sizeof(k.text)) < sizeof(k.text));
        if (k.status == OTE_OK) check(k.mode == SHM_MODE_CMA || k.mode == SHM_MODE_RING);
    }
    int cnt = ote__shm_reqs_count(data, size);
    if (cnt >= 0) {
        check(cnt <= SHM_BATCH_MAX && size == sizeof(shm_hdr_t) + (size_t)cnt * sizeof(shm_req_t));
        check_reqs(data, size, cnt);
    }
    cnt = ote__shm_resps_count(data, size);
    if (cnt >= 0)
        check(cnt <= SHM_BATCH_MAX && size == sizeof(shm_hdr_t) + (size_t)cnt * sizeof(shm_resp_t));
    shm_ipc_offer_t o;
    if (ote__shm_offer_decode(data, size, &o) == 0)
        check(size == sizeof(o) && o.h.version == SHM_VERSION && o.d.offset <= o.d.size);
    shm_ipc_close_t c;
    if (ote__shm_close_decode(data, size, &c) == 0)
        check(size == sizeof(c) && c.h.kind == SHM_IPC_CLOSE && c.h.version == SHM_VERSION);
    shm_map_t mp;
    if (ote__shm_map_decode(data, size, &mp) == 0)
        check(size == sizeof(mp) && mp.h.kind == SHM_MAP && mp.id != 0 && mp.size != 0 &&
              mp.size <= SHM_SHARED_BYTES && mp.base + mp.size >= mp.base &&
              (mp.base & 4095u) == 0 && (mp.size & 4095u) == 0);
    return 0;
}

#ifdef OTE_SHM_FUZZ_SEEDS
static int put(const char *dir, const char *name, const void *b, size_t n) {
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL) return 1;
    int bad = fwrite(b, 1, n, f) != n;
    return fclose(f) != 0 || bad;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    const char *d = argv[1];
    int bad = 0;
    shm_hello_t h;
    memset(&h, 0, sizeof(h));
    h.h = (shm_hdr_t){SHM_MAGIC, SHM_VERSION, SHM_HELLO, 0, SHM_CAP_IPC};
    h.probe_addr = 0x7f0000001000ull;
    h.probe_val = 0x1234;
    h.ring_len = SHM_RING_BYTES;
    snprintf(h.addr, sizeof(h.addr), "127.0.0.1:4000");
    bad |= put(d, "hello", &h, SHM_HELLO_BASE_LEN);
    snprintf(h.name, sizeof(h.name), "prefill-0");
    bad |= put(d, "hello_named", &h, sizeof(h));
    memset(h.name, 'n', sizeof(h.name)); /* malformed: a name without its NUL */
    bad |= put(d, "hello_name_unterminated", &h, sizeof(h));
    memset(&h.name, 0, sizeof(h.name));
    shm_auth_t a;
    memset(&a, 0, sizeof(a));
    a.h = (shm_hdr_t){SHM_MAGIC, SHM_VERSION, SHM_AUTH, 0, 0};
    a.step = OTE_CTL_AUTH_CHALLENGE;
    memset(a.nonce, 0x11, sizeof(a.nonce));
    bad |= put(d, "auth_challenge", &a, sizeof(a));
    a.step = OTE_CTL_AUTH_PROOF;
    memset(a.mac, 0x22, sizeof(a.mac));
    bad |= put(d, "auth_proof", &a, sizeof(a));
    a.step = OTE_CTL_AUTH_OK;
    memset(a.nonce, 0, sizeof(a.nonce));
    bad |= put(d, "auth_ok", &a, sizeof(a));
    shm_hello_ack_t k;
    memset(&k, 0, sizeof(k));
    k.h = (shm_hdr_t){SHM_MAGIC, SHM_VERSION, SHM_HELLO_ACK, 0, 0};
    k.max_slice = SHM_MAX_SLICE;
    k.mode = SHM_MODE_CMA;
    k.flags = SHM_ACK_RING;
    bad |= put(d, "hello_ack", &k, sizeof(k));
    k.status = OTE_ERR_AUTH;
    snprintf(k.text, sizeof(k.text), "authentication failed: wrong key");
    bad |= put(d, "hello_ack_auth", &k, sizeof(k));
    memset(k.text, 'x', sizeof(k.text)); /* malformed: text without its NUL */
    bad |= put(d, "hello_ack_unterminated", &k, sizeof(k));
    struct {
        shm_hdr_t h;
        shm_req_t q[2];
    } r;
    memset(&r, 0, sizeof(r));
    r.h = (shm_hdr_t){SHM_MAGIC, SHM_VERSION, SHM_REQS, 2, 0};
    r.q[0] = (shm_req_t){1, 0x1000, 0x40, 4096, OTE__SLICE_WRITE, SHM_REQ_RING, 0x1000, 8192, 7};
    r.q[1] = (shm_req_t){2, 0, 0, 0, SHM_OP_CANCEL, 0, 0x1000, 8192, 7};
    bad |= put(d, "reqs", &r, sizeof(r));
    r.h.n = SHM_BATCH_MAX + 1; /* malformed: more entries than a message may carry */
    bad |= put(d, "reqs_too_many", &r, sizeof(r));
    struct {
        shm_hdr_t h;
        shm_resp_t r[1];
    } s;
    memset(&s, 0, sizeof(s));
    s.h = (shm_hdr_t){SHM_MAGIC, SHM_VERSION, SHM_RESPS, 1, 0};
    s.r[0] = (shm_resp_t){1, OTE_ERR_ACCESS, 0};
    bad |= put(d, "resps", &s, sizeof(s));
    shm_ipc_offer_t o;
    memset(&o, 0, sizeof(o));
    o.h = (shm_hdr_t){SHM_MAGIC, SHM_VERSION, SHM_IPC_OFFER, 1, 0};
    o.id = 1;
    o.d.buffer_id = 9;
    o.d.base = 0x7f0000000000ull;
    o.d.size = 1u << 21;
    o.d.offset = 4096;
    bad |= put(d, "ipc_offer", &o, sizeof(o));
    o.d.offset = o.d.size + 1; /* malformed: the piece starts past its allocation */
    bad |= put(d, "ipc_offer_outside", &o, sizeof(o));
    shm_ipc_close_t c;
    memset(&c, 0, sizeof(c));
    c.h = (shm_hdr_t){SHM_MAGIC, SHM_VERSION, SHM_IPC_CLOSE, 0, 0};
    c.buffer_id = 9;
    shm_map_t mp;
    memset(&mp, 0, sizeof(mp));
    mp.h = (shm_hdr_t){SHM_MAGIC, SHM_VERSION, SHM_MAP, 0, 0};
    mp.id = 3;
    mp.base = 0x7f0000200000ull;
    mp.size = 64u << 20;
    bad |= put(d, "map", &mp, sizeof(mp));
    mp.base += 8; /* malformed: not page aligned */
    bad |= put(d, "map_unaligned", &mp, sizeof(mp));
    bad |= put(d, "ipc_close", &c, sizeof(c));
    return bad;
}
#endif

/*
 * engine/rdma/fuzz_proto.c - libFuzzer target over the RDMA transport's control message
 * codec (proto.h): the input is one OTE_CTL_RDMA body. Built by tests/fuzz/run_fuzz.sh
 * with clang -fsanitize=fuzzer,address,undefined; not part of the transport library.
 *
 * What decodes must satisfy the bounds the transport relies on (lanes, devices, pairs,
 * the grant's range inside its request, a sent epoch nonzero, CONNECT's two epochs
 * sent together, the staging forms' flags and base, the pair form's devices and extent)
 * and survive a round trip: encoded
 * again (in the form its content asks for) and decoded, it is the same message.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "engine/rdma/proto.h"

static void check(int cond) {
    if (!cond) __builtin_trap();
}

static int pair_ok(uint32_t pair) {
    return (pair >> 16) == 0 && (pair >> 8) < OTE_RP_MAX_DEVS && (pair & 0xff) < OTE_RP_MAX_DEVS;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ote_rp_msg_t m;
    if (ote__rp_decode(data, size, &m) != OTE_OK) return 0;
    check(size >= 4 && size <= OTE_RP_MAX_BODY);
    switch (m.type) {
        case OTE_RP_INFO:
        case OTE_RP_INFO_ACK:
            check(m.u.info.lanes >= 1 && m.u.info.lanes <= 64);
            check(m.u.info.ndev >= 1 && m.u.info.ndev <= OTE_RP_MAX_DEVS);
            check(m.u.info.nics[0] == m.u.info.nic);
            check((m.u.info.epoch != 0) == (size == 72));
            break;
        case OTE_RP_CONNECT:
            check(m.u.connect.cap <= 3 && pair_ok(m.u.connect.pair));
            check(m.u.connect.path.qp_num != 0 && m.u.connect.path.qp_num <= 0xffffff);
            /* The epochs are sent both or none, and only in the 64-byte form. */
            check((m.u.connect.epoch != 0) == (size == 64));
            check((m.u.connect.req_epoch != 0) == (size == 64));
            break;
        case OTE_RP_GRANT_REQ:
            check(pair_ok(m.u.grant.pair) && m.u.grant.op <= 1 && m.u.grant.len != 0);
            check((m.u.grant.dflags & ~(OTE_RP_GOP_DIRECT_OK | OTE_RP_GOP_DIRECT)) == 0);
            check(m.u.grant.addr >= m.u.grant.req_addr);
            check(m.u.grant.addr - m.u.grant.req_addr <= m.u.grant.req_len - m.u.grant.len);
            check((m.u.grant.epoch != 0) == (size >= 72));
            check(m.u.grant.flags == 0 || size >= 76);
            check(size != 76 || m.u.grant.flags != 0);
            /* The parent trailer: nonzero parent and a budget in range, only at 88. */
            check((m.u.grant.parent != 0) == (size == 88));
            check(m.u.grant.parent == 0 ||
                  (m.u.grant.budget >= 1 && m.u.grant.budget <= OTE_RP_MAX_BUDGET));
            check((m.u.grant.flags & ~(OTE_RP_GF_STAGE | OTE_RP_GF_PAIR)) == 0);
            break;
        case OTE_RP_GRANT_RESP:
            /* The staged form: exactly the known flag and a nonzero base; the pair form
             * (44 bytes): staged or not, devices below OTE_RP_MAX_DEVS, a nonempty extent
             * that does not wrap. */
            check(m.u.resp.flags == 0 || size == 20 || size == 44);
            check(size != 20 || m.u.resp.flags != 0);
            check((m.u.resp.near != 0) == (size == 44));
            check((m.u.resp.near >> OTE_RP_MAX_DEVS) == 0);
            check(m.u.resp.near == 0 ||
                  (m.u.resp.reg_len != 0 && m.u.resp.reg_addr <= UINT64_MAX - m.u.resp.reg_len));
            check(m.u.resp.flags == 0 || m.u.resp.flags == OTE_RP_RESP_STAGED ||
                  m.u.resp.flags == (OTE_RP_RESP_STAGED | OTE_RP_RESP_COMMIT));
            check(m.u.resp.flags == 0 || m.u.resp.base != 0);
            check(m.u.resp.flags != 0 || m.u.resp.base == 0);
            break;
        case OTE_RP_EP_RESET: check(pair_ok(m.u.reset.pair)); break;
        case OTE_RP_COMMIT: check(size == 8); break;
        case OTE_RP_RELEASE: check(pair_ok(m.u.rel.pair) && m.u.rel.cap <= 3); break;
        default: break;
    }
    uint8_t buf[OTE_RP_MAX_BODY];
    size_t n = ote__rp_encode(&m, buf);
    check(n >= 4 && n <= OTE_RP_MAX_BODY && n <= size);
    ote_rp_msg_t again;
    check(ote__rp_decode(buf, n, &again) == OTE_OK);
    check(memcmp(&again, &m, sizeof(m)) == 0);
    return 0;
}

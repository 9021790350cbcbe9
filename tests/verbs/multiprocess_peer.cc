// multiprocess_peer: the other process of multiprocess_test. It opens the sim with the
// default configuration (as the test does), creates one RC QP with a large registered
// buffer, exchanges GID/QPN/rkey over the socket given as argv[1] (an fd number), and
// then serves the test's commands (mp::Msg) until the socket closes or it is killed.
// argv[2] is the buffer size in bytes. Its fd mp::kDmabufFd is the test's memfd, which
// kDmabuf registers as a dma-buf MR. Exit status 0 on a clean end.
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

#include <vector>

#include "tests/verbs/multiprocess_common.h"

extern "C" {
#include "base/alloc.h"
#include "base/time.h"
#include "verbs/verbs.h"
}

namespace {

ote_verbs_t *v;
const ote_verbs_ops_t *o;

bool PollOne(struct ibv_cq *cq, struct ibv_wc *wc, uint64_t ns) {
    ote_deadline_t dl = ote_deadline_after(ns);
    while (!ote_deadline_expired(dl)) {
        int r = o->poll_cq(v, cq, 1, wc);
        if (r < 0) return false;
        if (r == 1) return true;
    }
    return false;
}

int Fail(const char *what) {
    fprintf(stderr, "multiprocess_peer: %s\n", what);
    return 2;
}

} // namespace

int main(int argc, char **argv) {
    if (argc < 3) return Fail("usage: multiprocess_peer FD BYTES");
    int fd = atoi(argv[1]);
    uint64_t bytes = strtoull(argv[2], nullptr, 10);
    if (ote_verbs_open("sim", nullptr, &v) != OTE_OK) return Fail("open sim");
    o = v->ops;
    struct ibv_device **list = nullptr;
    int num = 0;
    struct ibv_context *ctx = nullptr;
    if (o->get_device_list(v, &list, &num) != 0 || num < 1) return Fail("device list");
    if (o->open_device(v, list[0], &ctx) != 0) return Fail("open device");
    o->free_device_list(v, list);
    struct ibv_pd *pd = nullptr;
    struct ibv_cq *scq = nullptr, *rcq = nullptr;
    if (o->alloc_pd(v, ctx, &pd) != 0) return Fail("pd");
    if (o->create_cq(v, ctx, 1024, nullptr, nullptr, 0, &scq) != 0) return Fail("cq");
    if (o->create_cq(v, ctx, 1024, nullptr, nullptr, 0, &rcq) != 0) return Fail("cq");
    uint8_t *buf = static_cast<uint8_t *>(ote_aligned_alloc(4096, bytes));
    if (!buf) return Fail("buffer");
    memset(buf, 0, bytes);
    struct ibv_mr *mr = nullptr;
    if (o->reg_mr(v, pd, buf, bytes,
                  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
                  &mr) != 0)
        return Fail("reg_mr");
    ote_test::RcQpCaps caps;
    caps.max_send_wr = 64;
    caps.max_recv_wr = 64;
    struct ibv_qp *qp = nullptr;
    if (ote_test::CreateRcQp(v, pd, scq, rcq, caps, &qp) != 0) return Fail("create_qp");
    struct ibv_port_attr pa;
    o->query_port(v, ctx, 1, &pa);
    int gidx = mp::RoceV2Ipv4GidIndex(v, ctx, pa);
    if (gidx < 0) return Fail("no RoCE v2 GID");
    union ibv_gid gid;
    o->query_gid(v, ctx, 1, gidx, &gid);

    mp::Msg in, out;
    if (!mp::ReadMsg(fd, &in) || in.type != mp::kHello) return Fail("hello");
    memset(&out, 0, sizeof(out));
    out.type = mp::kHello;
    out.qpn = qp->qp_num;
    memcpy(out.gid, gid.raw, 16);
    out.addr = (uint64_t)(uintptr_t)buf;
    out.rkey = mr->rkey;
    out.len = bytes;

    if (ote_test::QpToInit(v, qp, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ))
        return Fail("init");
    // receives land in the last 64 KiB of the buffer (kRecv checks data written by WRITEs)
    for (int i = 0; i < 32; i++) {
        if (ote_test::PostRecvOne(v, qp, (uint64_t)(uintptr_t)(buf + bytes - 65536), 65536,
                                  mr->lkey, (uint64_t)i))
            return Fail("post_recv");
    }
    if (ote_test::QpToRtr(v, qp, mp::PathTo(in, pa.active_mtu, gidx))) return Fail("rtr");
    if (ote_test::QpToRts(v, qp, mp::Retry())) return Fail("rts");
    if (!mp::WriteMsg(fd, out)) return Fail("hello reply");

    int recvs = 32;
    struct ibv_mr *dmr = nullptr; // the dma-buf MR over the test's memfd, while registered
    while (mp::ReadMsg(fd, &in)) {
        memset(&out, 0, sizeof(out));
        out.type = mp::kReply;
        if (in.type == mp::kDmabuf && dmr == nullptr) {
            int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
            out.value =
                o->reg_dmabuf_mr(v, pd, in.off, in.len, in.addr, mp::kDmabufFd, acc, &dmr) == 0;
            if (out.value) out.rkey = dmr->rkey;
        } else if (in.type == mp::kDmabufDereg && dmr != nullptr) {
            out.value = o->dereg_mr(v, dmr) == 0;
            if (out.value) dmr = nullptr;
        } else if (in.type == mp::kFill && in.off + in.len <= bytes) {
            mp::Fill(buf + in.off, in.len, in.seed, 0);
            out.value = 1;
        } else if (in.type == mp::kRecv) {
            struct ibv_wc wc;
            if (PollOne(rcq, &wc, 20 * OTE_NSEC_PER_SEC)) {
                recvs--;
                out.aux = ntohl(wc.imm_data);
                out.value = wc.status == IBV_WC_SUCCESS && in.off + in.len <= bytes &&
                            mp::Check(buf + in.off, in.len, in.seed, 0);
            }
        } else if (in.type == mp::kSend && in.off + in.len <= bytes) {
            struct ibv_sge sge = {(uint64_t)(uintptr_t)(buf + in.off), (uint32_t)in.len, mr->lkey};
            struct ibv_send_wr wr, *bad = nullptr;
            memset(&wr, 0, sizeof(wr));
            wr.opcode = IBV_WR_SEND_WITH_IMM;
            wr.imm_data = htonl(in.seed);
            wr.sg_list = &sge;
            wr.num_sge = 1;
            struct ibv_wc wc;
            out.value = o->post_send(v, qp, &wr, &bad) == 0 &&
                        PollOne(scq, &wc, 20 * OTE_NSEC_PER_SEC) && wc.status == IBV_WC_SUCCESS;
        }
        if (!mp::WriteMsg(fd, out)) break;
    }
    (void)recvs;
    int rc = 0;
    rc |= o->destroy_qp(v, qp);
    if (dmr != nullptr) rc |= o->dereg_mr(v, dmr);
    rc |= o->dereg_mr(v, mr);
    rc |= o->destroy_cq(v, scq);
    rc |= o->destroy_cq(v, rcq);
    rc |= o->dealloc_pd(v, pd);
    rc |= o->close_device(v, ctx);
    ote_verbs_close(v);
    ote_aligned_free(buf);
    close(fd);
    return rc == 0 ? 0 : 3;
}

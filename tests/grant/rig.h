// tests/grant/rig.h - a requester and a source in one process over one sim instance
// (wrapped by the verbs fault decorator): context 0 (sim0) is the requester, context 1
// (sim1) the source. Each side has two CQ lanes polled by one worker pool, an endpoint
// store, and a grant manager; the "control plane" is direct function calls.
#ifndef OTE_TESTS_GRANT_RIG_H
#define OTE_TESTS_GRANT_RIG_H

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <vector>

#include "tests/util/wait.h"

extern "C" {
#include "base/time.h"
#include "context/buffers.h"
#include "context/context.h"
#include "cq/lane.h"
#include "cq/workers.h"
#include "endpoint/endpoint.h"
#include "grant/grant.h"
#include "qp/qp.h"
#include "verbs/fault.h"
#include "verbs/sim/sim.h"
#include "verbs/verbs.h"
}

namespace ote_test {

constexpr uint64_t kMs = 1000000ull;

struct Rig {
    ote_verbs_t *sim = nullptr, *v = nullptr;
    ote_context_set_t *set = nullptr;
    ote_context_t *c0 = nullptr, *c1 = nullptr;
    ote_cq_lane_t *l0[2] = {}, *l1[2] = {};
    ote_cq_workers_t *w = nullptr;
    ote_endpoint_store_t *s0 = nullptr, *s1 = nullptr;
    ote_grant_mgr_t *g0 = nullptr, *g1 = nullptr;
    ote_buffer_manager_t *bm = nullptr;
    ote_buffer_t *src_buf = nullptr;
    std::vector<uint8_t> src, local;
    int src_access = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    std::atomic<int> pins{0};
    ote_endpoint_t *ep0[2] = {}, *ep1[2] = {};
    bool with_grants = true;
    uint64_t src_deadline_ms = 5000;
    std::atomic<unsigned> partial_k{0}; /* arm a partial post just before the next answer */
    bool exact = false; /* the source serves by exact-range MRs (ote_grant_serve_exact) */
    std::atomic<int> exact_mrs{0}; /* exact-range MRs registered and not yet deregistered */
    std::atomic<uint32_t> last_rkey{0};
    std::atomic<uint64_t> serving{0}; /* pins that met their serve call's context */

    static ote_status_t Pin(void *arg, void *call, ote_context_t *ctx, uint64_t addr, uint64_t len,
                            int access, struct ibv_mr **mr_out, void **pin_out) {
        Rig *r = static_cast<Rig *>(arg);
        if (call != &r->serving) return OTE_ERR_STATE; // the serve call's own context
        r->serving++;
        uint64_t base = (uintptr_t)r->src.data();
        if (addr < base || len > r->src.size() || addr - base > r->src.size() - len ||
            (r->src_access & access) != access)
            return OTE_ERR_ACCESS;
        ote_status_t st = ote_buffer_mr(r->src_buf, ctx, mr_out);
        if (st != OTE_OK) return st;
        r->pins++;
        *pin_out = r;
        return OTE_OK;
    }
    // An MR of exactly [addr, +len) with only the grant's remote access, in the QP's PD.
    static ote_status_t PinExact(void *arg, void *call, ote_qp_t *qp, uint64_t addr, uint64_t len,
                                 int access, uint32_t *rkey_out, void **pin_out) {
        Rig *r = static_cast<Rig *>(arg);
        if (call != nullptr && call != &r->serving) return OTE_ERR_STATE;
        if (call != nullptr) r->serving++;
        uint64_t base = (uintptr_t)r->src.data();
        if (addr < base || len > r->src.size() || addr - base > r->src.size() - len ||
            (r->src_access & access) != access)
            return OTE_ERR_ACCESS;
        struct ibv_mr *mr = nullptr;
        int err = r->v->ops->reg_mr(r->v, ote_qp_pd(qp), (void *)(uintptr_t)addr, len,
                                    IBV_ACCESS_LOCAL_WRITE | access, &mr);
        if (err != 0) return ote_status_make(OTE_ERR_NATIVE, err);
        r->pins++;
        r->exact_mrs++;
        *rkey_out = mr->rkey;
        *pin_out = mr;
        return OTE_OK;
    }
    static void Unpin(void *arg, void *pin) {
        Rig *r = static_cast<Rig *>(arg);
        if (pin != arg) { /* an exact-range MR: deregistered now */
            EXPECT_EQ(r->v->ops->dereg_mr(r->v, static_cast<struct ibv_mr *>(pin)), 0);
            r->exact_mrs--;
        }
        r->pins--;
    }
    static void Answer(void *arg, uint64_t ctx, ote_status_t st, uint32_t rkey) {
        Rig *r = static_cast<Rig *>(arg);
        unsigned k = r->partial_k.exchange(0);
        if (k) ote_verbs_fault_partial_post(r->v, OTE_VERBS_FAULT_OP_POST_SEND, k, ENOMEM);
        if (st == OTE_OK) r->last_rkey = rkey;
        ote_grant_on_answer(r->g0, ctx, st, rkey);
    }
    static void OnRecv(void *arg, ote_qp_t *qp, const struct ibv_wc *wc, const void *) {
        Rig *r = static_cast<Rig *>(arg);
        if (r->g1) ote_grant_source_receipt(r->g1, ote_qp_num(qp), wc);
    }
    // Requester's exchange: build (or find) the source QP of the same slot directly.
    struct Xarg {
        Rig *r;
        int cap;
    };
    static ote_status_t Exchange(void *arg, uint32_t slot, const ote_qp_path_t *local,
                                 ote_qp_path_t *peer_out, ote_deadline_t dl) {
        Xarg *x = static_cast<Xarg *>(arg);
        ote_qp_path_t req = *local;
        ote_qp_t *qp = nullptr;
        ote_status_t st = ote_endpoint_borrow(x->r->ep1[x->cap], slot, CopyExchange, &req, dl, &qp);
        if (st != OTE_OK) return st;
        ote_qp_local_path(qp, peer_out);
        ote_endpoint_return(x->r->ep1[x->cap], slot, qp);
        return OTE_OK;
    }
    static ote_status_t CopyExchange(void *arg, uint32_t, const ote_qp_path_t *,
                                     ote_qp_path_t *peer_out, ote_deadline_t) {
        *peer_out = *static_cast<ote_qp_path_t *>(arg);
        return OTE_OK;
    }
    // Control plane of the requester: serve at once on the source.
    static ote_status_t Request(void *arg, uint64_t id, uint32_t slot, uint32_t remote_qpn,
                                ote_grant_op_t op, uint64_t addr, uint64_t len) {
        Rig *r = static_cast<Rig *>(arg);
        int cap = op == OTE_GRANT_WRITE ? 1 : 0;
        ote_qp_t *qp = nullptr;
        ote_status_t st = ote_endpoint_borrow_ready(r->ep1[cap], slot, 0, &qp);
        if (st == OTE_OK && ote_qp_num(qp) != remote_qpn) {
            ote_endpoint_return(r->ep1[cap], slot, qp);
            st = OTE_ERR_STATE;
        }
        if (st == OTE_OK) {
            auto serve = r->exact ? ote_grant_serve_exact : ote_grant_serve;
            st = serve(r->g1, r->ep1[cap], slot, qp, op, addr, len,
                       ote_deadline_after(r->src_deadline_ms * kMs), id, &r->serving);
            if (st != OTE_OK) ote_endpoint_return(r->ep1[cap], slot, qp);
        }
        if (st != OTE_OK) ote_grant_on_answer(r->g0, id, st, 0); /* refused: tell the requester */
        return OTE_OK;
    }

    void Open(size_t src_len = 4u << 20) {
        ASSERT_EQ(ote_verbs_open("sim", nullptr, &sim), OTE_OK);
        ASSERT_EQ(ote_verbs_fault_wrap(sim, OTE_VERBS_FAULT_OWN_INNER, &v), OTE_OK);
        ASSERT_EQ(ote_context_set_open(v, nullptr, &set), OTE_OK);
        ASSERT_GE(ote_context_set_count(set), 2u);
        c0 = ote_context_set_get(set, 0);
        c1 = ote_context_set_get(set, 1);
        ASSERT_EQ(ote_cq_workers_start(2, &w), OTE_OK);
        for (uint32_t i = 0; i < 2; i++) {
            ote_cq_lane_config_t lc = {i, 1024, 1024, 1};
            ASSERT_EQ(ote_cq_lane_create(c0, &lc, &l0[i]), OTE_OK);
            ASSERT_EQ(ote_cq_lane_create(c1, &lc, &l1[i]), OTE_OK);
            ASSERT_EQ(ote_cq_workers_add(w, l0[i]), OTE_OK);
            ASSERT_EQ(ote_cq_workers_add(w, l1[i]), OTE_OK);
        }
        src.assign(src_len, 0);
        ASSERT_EQ(ote_buffer_manager_create(set, &bm), OTE_OK);
        ASSERT_EQ(ote_buffer_register(bm, src.data(), src.size(),
                                      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND, &src_buf),
                  OTE_OK);
        if (with_grants) {
            ote_grant_source_ops_t ops = {this, Pin, Unpin, Answer, PinExact};
            ASSERT_EQ(ote_grant_mgr_create(c0, l0, 2, nullptr, &g0), OTE_OK);
            ASSERT_EQ(ote_grant_mgr_create(c1, l1, 2, &ops, &g1), OTE_OK);
        }
        ote_qp_config_t qc;
        ote_qp_config_default(&qc);
        qc.max_send_wr = 32;
        /* A source grant is served only with a posted receive slot reserved for its
         * receipt (ote_qp_rq_admit): more slots than any test has grants on one QP at
         * once, so that a slot consumed and not yet reposted never refuses one. */
        qc.recv_slots = 64;
        qc.recv_size = 64;
        qc.on_recv = OnRecv;
        qc.recv_arg = this;
        ASSERT_EQ(ote_endpoint_store_create(c0, l0, 2, &qc, &s0), OTE_OK);
        ASSERT_EQ(ote_endpoint_store_create(c1, l1, 2, &qc, &s1), OTE_OK);
        for (int cap = 0; cap < 2; cap++) {
            ote_ep_key_t k0, k1;
            ote_ep_key_make(&k0, 2, 22, 0, 1, OTE_EP_REQUESTER, (ote_ep_cap_t)cap);
            ote_ep_key_make(&k1, 1, 11, 1, 0, OTE_EP_SOURCE, (ote_ep_cap_t)cap);
            ASSERT_EQ(ote_endpoint_get(s0, &k0, 2, &ep0[cap]), OTE_OK);
            ASSERT_EQ(ote_endpoint_get(s1, &k1, 2, &ep1[cap]), OTE_OK);
        }
    }

    // Gives the provider another ops table (a test's misbehaving op in front of the
    // decorator's). The CQ workers read v->ops under their mutex: the lanes leave the
    // workers while the pointer changes and join them again after, so the workers see
    // the new table through that mutex instead of racing with the store.
    void SetOps(const ote_verbs_ops_t *ops) {
        for (int i = 0; i < 2; i++) {
            ASSERT_EQ(ote_cq_workers_remove(w, l0[i]), OTE_OK);
            ASSERT_EQ(ote_cq_workers_remove(w, l1[i]), OTE_OK);
        }
        v->ops = ops;
        for (int i = 0; i < 2; i++) {
            ASSERT_EQ(ote_cq_workers_add(w, l0[i]), OTE_OK);
            ASSERT_EQ(ote_cq_workers_add(w, l1[i]), OTE_OK);
        }
    }

    // Borrow a connected requester QP of slot `slot`.
    ote_status_t Borrow(int cap, uint32_t slot, ote_qp_t **qp) {
        Xarg x = {this, cap};
        return ote_endpoint_borrow(ep0[cap], slot, Exchange, &x, ote_deadline_after(30000 * kMs),
                                   qp);
    }

    // Reclaim retired QPs on both sides until none is left or 30 s pass (silent: the
    // caller's next grant fails if a QP was left).
    void Reclaim() {
        PollUntil(
            [&] {
                size_t a = 0, b = 0;
                ote_endpoint_store_reclaim(s0, ote_deadline_after(200 * kMs), &a);
                ote_endpoint_store_reclaim(s1, ote_deadline_after(200 * kMs), &b);
                return a + b == 0;
            },
            std::chrono::seconds(30));
    }

    // A grant's requester ends (its done runs) on the send CQE of its SEND_WITH_INV; the
    // source ends the same grant when it polls the matching receive CQE, on its own lane and
    // possibly on another worker thread, and drops the registration pin after its manager's
    // mutex. So the source's stats and pins are looked at only after waiting here: true
    // once no source grant is live and every pin is back (ms at most).
    bool WaitSourceIdle(int ms = 30000) {
        return WaitUntil(
            [&] {
                ote_grant_stats_t s;
                ote_grant_mgr_get_stats(g1, &s);
                return s.live_source == 0 && pins.load() == 0;
            },
            std::chrono::milliseconds(ms), "no live source grant and every pin back");
    }

    void Close() {
        ote_verbs_fault_clear(v);
        auto tick = [](ote_grant_mgr_t *g) -> size_t { return g ? ote_grant_mgr_tick(g) : 0; };
        if (g0 || g1) {
            WaitUntil([&] { return tick(g0) + tick(g1) == 0; }, std::chrono::seconds(30),
                      "the grant managers' ticks to find nothing left");
        }
        if (s0) {
            EXPECT_EQ(ote_endpoint_store_destroy(s0, ote_deadline_after(30000 * kMs)), OTE_OK);
        }
        if (s1) {
            EXPECT_EQ(ote_endpoint_store_destroy(s1, ote_deadline_after(30000 * kMs)), OTE_OK);
        }
        if (g0) {
            EXPECT_EQ(ote_grant_mgr_destroy(g0), OTE_OK);
        }
        if (g1) {
            EXPECT_EQ(ote_grant_mgr_destroy(g1), OTE_OK);
        }
        for (int i = 0; i < 2; i++) {
            if (l0[i]) {
                EXPECT_EQ(ote_cq_workers_remove(w, l0[i]), OTE_OK);
                EXPECT_EQ(ote_cq_lane_destroy(l0[i]), OTE_OK);
            }
            if (l1[i]) {
                EXPECT_EQ(ote_cq_workers_remove(w, l1[i]), OTE_OK);
                EXPECT_EQ(ote_cq_lane_destroy(l1[i]), OTE_OK);
            }
        }
        if (w) {
            EXPECT_EQ(ote_cq_workers_stop(w), OTE_OK);
        }
        if (src_buf) {
            EXPECT_EQ(ote_buffer_deregister(bm, src_buf), OTE_OK);
        }
        if (bm) {
            EXPECT_EQ(ote_buffer_manager_destroy(bm), OTE_OK);
        }
        if (set) {
            EXPECT_EQ(ote_context_set_close(set), OTE_OK);
        }
        if (v) ote_verbs_close(v);
    }
};

// A grant run to its end: done status captured.
struct Done {
    std::atomic<int> calls{0};
    std::atomic<ote_status_t> st{OTE_OK};
    void *ctx = nullptr; /* the test's own, for other callbacks given the same argument */
    static void Fn(void *arg, ote_status_t st) {
        Done *d = static_cast<Done *>(arg);
        d->st = st;
        d->calls++;
    }
    // Wait (ticking the managers and reclaiming retired QPs, as the monitor would).
    bool Wait(Rig &r, int ms) {
        int polls = 0;
        return WaitUntil(
            [&] {
                if (calls.load() > 0) return true;
                ote_grant_mgr_tick(r.g0);
                ote_grant_mgr_tick(r.g1);
                if (polls++ % 20 == 0) {
                    ote_endpoint_store_reclaim(r.s0, ote_deadline_after(100 * kMs), nullptr);
                    ote_endpoint_store_reclaim(r.s1, ote_deadline_after(100 * kMs), nullptr);
                }
                return false;
            },
            std::chrono::milliseconds(ms), "the grant's done callback");
    }
};

} // namespace ote_test

#endif

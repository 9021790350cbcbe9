// tests/qp/qp_fixture.h - two RC QPs in one process over the software provider: QP 0 on
// device sim0, QP 1 on sim1, each on its own CQ lane, with registered memory on both and
// a completion record per lane that counts every completion per WR id.
#ifndef OTE_TESTS_QP_QP_FIXTURE_H
#define OTE_TESTS_QP_QP_FIXTURE_H

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "tests/util/test_base.h"

extern "C" {
#include "base/status.h"
#include "base/time.h"
#include "context/buffers.h"
#include "context/context.h"
#include "cq/lane.h"
#include "qp/qp.h"
#include "verbs/fault.h"
#include "verbs/verbs.h"
}

namespace ote_test {

// Completions of one lane namespace, per WR id.
struct Record {
    std::mutex mu;
    uint32_t ns = 0;
    std::map<uint64_t, std::vector<ibv_wc>> by_id;
    size_t total = 0;
    static void Fn(void *arg, ote_cq_lane_t *, ote_cq_dir_t, const ibv_wc *wc) {
        auto *r = static_cast<Record *>(arg);
        std::lock_guard<std::mutex> g(r->mu);
        r->by_id[wc->wr_id].push_back(*wc);
        r->total++;
    }
    size_t Total() {
        std::lock_guard<std::mutex> g(mu);
        return total;
    }
    size_t Count(uint64_t local) {
        std::lock_guard<std::mutex> g(mu);
        auto it = by_id.find(OTE_CQ_WR_ID(ns, local));
        return it == by_id.end() ? 0 : it->second.size();
    }
    ibv_wc First(uint64_t local) {
        std::lock_guard<std::mutex> g(mu);
        return by_id[OTE_CQ_WR_ID(ns, local)].at(0);
    }
};

class QpFixture : public OteTest {
  protected:
    static constexpr size_t kMem = 1 << 20;

    // Open the sim (wrapped by the fault decorator when `fault`), both contexts, one lane
    // per context, registered memory on both.
    void Start(bool fault, const char *config = nullptr) {
        ASSERT_EQ(ote_verbs_open("sim", config, &sim_), OTE_OK);
        v_ = sim_;
        if (fault) {
            ASSERT_EQ(ote_verbs_fault_wrap(sim_, 0, &v_), OTE_OK);
        }
        ASSERT_EQ(ote_context_set_open(v_, nullptr, &set_), OTE_OK);
        ASSERT_EQ(ote_context_set_count(set_), 2u);
        ASSERT_EQ(ote_buffer_manager_create(set_, &bm_), OTE_OK);
        for (int i = 0; i < 2; i++) {
            ctx_[i] = ote_context_set_get(set_, (size_t)i);
            ote_cq_lane_config_t lc = {0, 256, 256, 1};
            ASSERT_EQ(ote_cq_lane_create(ctx_[i], &lc, &lane_[i]), OTE_OK);
            ASSERT_EQ(ote_cq_lane_register_ns(lane_[i], &Record::Fn, &rec_[i], &rec_[i].ns),
                      OTE_OK);
            mem_[i].assign(kMem, 0);
            ASSERT_EQ(ote_buffer_register(
                          bm_, mem_[i].data(), kMem,
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE,
                          &buf_[i]),
                      OTE_OK);
        }
    }

    void TearDown() override {
        ote_deadline_t d = ote_deadline_after(30 * OTE_NSEC_PER_SEC); // see Soon()
        for (auto *qp : qps_) {
            if (qp != nullptr) {
                EXPECT_EQ(ote_qp_destroy(qp, d), OTE_OK);
            }
        }
        for (int i = 0; i < 2; i++) {
            if (lane_[i] == nullptr) continue;
            ote_cq_lane_unregister_ns(lane_[i], rec_[i].ns);
            EXPECT_EQ(ote_cq_lane_destroy(lane_[i]), OTE_OK);
        }
        for (int i = 0; i < 2; i++) {
            if (buf_[i] != nullptr) {
                EXPECT_EQ(ote_buffer_deregister(bm_, buf_[i]), OTE_OK);
            }
        }
        if (bm_ != nullptr) {
            EXPECT_EQ(ote_buffer_manager_destroy(bm_), OTE_OK);
        }
        if (set_ != nullptr) {
            EXPECT_EQ(ote_context_set_close(set_), OTE_OK);
        }
        if (v_ != nullptr && v_ != sim_) ote_verbs_close(v_);
        if (sim_ != nullptr) ote_verbs_close(sim_);
        OteTest::TearDown();
    }

    static ote_qp_config_t Config(uint32_t send_wr = 64, uint32_t slots = 0, uint32_t size = 0) {
        ote_qp_config_t c;
        ote_qp_config_default(&c);
        c.max_send_wr = send_wr;
        c.recv_slots = slots;
        c.recv_size = size;
        c.timeout = 8;
        return c;
    }

    // Create a QP on side `side` (0/1); the fixture destroys it at teardown.
    ote_qp_t *MakeQp(int side, const ote_qp_config_t &cfg) {
        ote_qp_t *qp = nullptr;
        EXPECT_EQ(ote_qp_create(lane_[side], &cfg, &qp), OTE_OK);
        if (qp != nullptr) qps_.push_back(qp);
        return qp;
    }
    void Forget(ote_qp_t *qp) {
        for (auto &q : qps_)
            if (q == qp) q = nullptr;
    }

    static ote_status_t ConnectPair(ote_qp_t *a, ote_qp_t *b) {
        ote_qp_path_t pa, pb;
        ote_qp_local_path(a, &pa);
        ote_qp_local_path(b, &pb);
        ote_status_t st = ote_qp_connect(a, &pb);
        if (st != OTE_OK) return st;
        return ote_qp_connect(b, &pa);
    }

    ibv_mr *Mr(int side) {
        ibv_mr *mr = nullptr;
        EXPECT_EQ(ote_buffer_mr(buf_[side], ctx_[side], &mr), OTE_OK);
        return mr;
    }

    // One RDMA WRITE (or READ) from side `from`'s memory to the other side's.
    struct Wr {
        ibv_send_wr wr;
        ibv_sge sge;
    };
    void Rdma(Wr *w, int from, uint64_t local_id, ibv_wr_opcode op, size_t off, size_t len) {
        memset(w, 0, sizeof(*w));
        int to = 1 - from;
        w->sge.addr = (uintptr_t)(mem_[from].data() + off);
        w->sge.length = (uint32_t)len;
        w->sge.lkey = Mr(from)->lkey;
        w->wr.wr_id = OTE_CQ_WR_ID(rec_[from].ns, local_id);
        w->wr.sg_list = &w->sge;
        w->wr.num_sge = 1;
        w->wr.opcode = op;
        w->wr.wr.rdma.remote_addr = (uintptr_t)(mem_[to].data() + off);
        w->wr.wr.rdma.rkey = Mr(to)->rkey;
    }
    // Chain n WRITEs of `len` bytes at consecutive offsets, ids first_id..first_id+n-1.
    std::vector<Wr> Window(int from, uint64_t first_id, size_t n, size_t len) {
        std::vector<Wr> v(n);
        for (size_t i = 0; i < n; i++)
            Rdma(&v[i], from, first_id + i, IBV_WR_RDMA_WRITE, i * len, len);
        for (size_t i = 0; i + 1 < n; i++) v[i].wr.next = &v[i + 1].wr;
        return v;
    }

    // A generous deadline for waits that must succeed (a loaded 2-core machine under
    // ASan can stall for seconds); a hang still fails, just later.
    static ote_deadline_t Soon(uint64_t ms = 30000) {
        return ote_deadline_after(ms * OTE_NSEC_PER_MSEC);
    }

    ote_verbs_t *sim_ = nullptr;
    ote_verbs_t *v_ = nullptr;
    ote_context_set_t *set_ = nullptr;
    ote_buffer_manager_t *bm_ = nullptr;
    ote_context_t *ctx_[2] = {nullptr, nullptr};
    ote_cq_lane_t *lane_[2] = {nullptr, nullptr};
    Record rec_[2];
    std::vector<uint8_t> mem_[2];
    ote_buffer_t *buf_[2] = {nullptr, nullptr};
    std::vector<ote_qp_t *> qps_;
};

} // namespace ote_test

#endif

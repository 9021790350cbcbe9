// tests/engine/native_counter.h - a verbs provider in front of one sim instance that
// counts the native objects that really exist, for tests of what a failure released or
// retained, and logs every QP's create flags and the send opcodes it posted. Between an engine's verbs fault decorator and its sim: the sim's own ops (the
// sim reaches its state through v->priv, which is the sim's), except that the
// create/destroy pairs of QPs, MWs and MRs count the objects alive (MRs over a watched
// range, the user's registered memory, and MW-bindable ones separately), and the next create_qp or destroy_qp
// can be held, on whatever thread makes it, until the test lets it go (120 s at most).
// Calls the fault decorator refuses never get here. close() closes the sim only.
#ifndef OTE_TESTS_ENGINE_NATIVE_COUNTER_H
#define OTE_TESTS_ENGINE_NATIVE_COUNTER_H

#include <atomic>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

extern "C" {
#include "base/status.h"
#include "verbs/verbs.h"
}

namespace ote_test {

struct NativeCounter {
    ote_verbs_t v{}; // what the fault decorator wraps (and closes)
    ote_verbs_ops_t ops{};
    ote_verbs_t *sim = nullptr;
    std::atomic<int64_t> qps{0}, mws{0}, mrs{0};
    std::atomic<uint64_t> qps_destroyed{0};
    // MRs over [watch_lo, watch_hi): the user's registered memory (not the layers' own
    // buffers, such as a QP's receive slots).
    std::atomic<uintptr_t> watch_lo{0}, watch_hi{0};
    std::atomic<int64_t> watched_mrs{0};
    // MW-bindable MRs (IBV_ACCESS_MW_BIND: the registrations' and the staging bounces'):
    // registered so far, alive now, and the last one registered.
    std::atomic<uint64_t> bind_regs{0};
    std::atomic<int64_t> bind_mrs{0};
    std::atomic<struct ibv_mr *> last_bind_mr{nullptr};
    std::mutex bind_mu; // guards bind_set: the MW-bindable MRs alive
    std::set<struct ibv_mr *> bind_set;
    // Every QP made through this provider (create_qp and create_qp_flags), in creation
    // order: the OTE_VERBS_QP_* flags it was created with and the send WRs it posted, by
    // opcode; kept after the QP is destroyed (destroyed set).
    struct QpSeen {
        uint32_t flags = 0;
        uint64_t reads = 0, writes = 0, others = 0;
        bool destroyed = false;
    };
    std::mutex qp_mu; // guards qp_log, qp_live
    std::vector<QpSeen> qp_log;
    std::map<struct ibv_qp *, size_t> qp_live; // index in qp_log of each live QP
    std::vector<QpSeen> QpLog() {
        std::lock_guard<std::mutex> g(qp_mu);
        return qp_log;
    }
    // Every CQ alive now (create_cq / destroy_cq), and CQs made so far: a test breaks
    // the engine's lanes through them (ote_sim_cq_error) and sees them replaced.
    std::mutex cq_mu; // guards cq_live
    std::set<struct ibv_cq *> cq_live;
    std::atomic<uint64_t> cqs_made{0};
    std::vector<struct ibv_cq *> LiveCqs() {
        std::lock_guard<std::mutex> g(cq_mu);
        return std::vector<struct ibv_cq *>(cq_live.begin(), cq_live.end());
    }
    std::atomic<bool> hold_next_create{false}, hold_next_qp_destroy{false};
    std::atomic<bool> holding{false}, release{false}, closed{false};
    bool Watched(const void *p) const {
        uintptr_t a = (uintptr_t)p;
        return a >= watch_lo.load() && a < watch_hi.load();
    }
};

// For ote__rdma_test_verbs_hook: puts a NativeCounter (appended to *owned, which must
// outlive the engine) in front of the sim *v and the verbs fault decorator (owning it) in
// front of that; *v becomes the decorator, also appended to *wrapped. On a failure *v is
// still the caller's.
ote_status_t WrapCounted(ote_verbs_t **v, std::vector<std::unique_ptr<NativeCounter>> *owned,
                         std::vector<ote_verbs_t *> *wrapped);

} // namespace ote_test

#endif

// tests/engine/native_counter.cc - see native_counter.h.
#include "tests/engine/native_counter.h"

#include <errno.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>

#include "tests/util/wait.h"

extern "C" {
#include "base/time.h"
#include "verbs/fault.h"
}

namespace ote_test {
namespace {

std::mutex g_mu;
std::vector<NativeCounter *> g_live; // every counter whose provider is open

NativeCounter *Of(ote_verbs_t *v) {
    std::lock_guard<std::mutex> g(g_mu);
    for (NativeCounter *n : g_live)
        if (&n->v == v) return n;
    return nullptr;
}

// Held until the test sets release (bounded: 120 s at most, whatever the test does).
void Hold(NativeCounter *n) {
    n->holding = true;
    ote_test::WaitUntil([n] { return n->release.load(); }, std::chrono::seconds(120),
                        "the test to release the held native call");
}

void QpMade(NativeCounter *n, struct ibv_qp *qp, uint32_t flags) {
    n->qps++;
    std::lock_guard<std::mutex> g(n->qp_mu);
    NativeCounter::QpSeen q;
    q.flags = flags;
    n->qp_live[qp] = n->qp_log.size();
    n->qp_log.push_back(q);
}

int CreateQp(ote_verbs_t *v, struct ibv_pd *pd, struct ibv_qp_init_attr *a, struct ibv_qp **out) {
    NativeCounter *n = Of(v);
    if (n == nullptr) return EINVAL;
    if (n->hold_next_create.exchange(false)) Hold(n);
    int err = n->sim->ops->create_qp(n->sim, pd, a, out);
    if (err == 0) QpMade(n, *out, 0);
    return err;
}

int CreateQpFlags(ote_verbs_t *v, struct ibv_pd *pd, struct ibv_qp_init_attr *a, uint32_t flags,
                  struct ibv_qp **out) {
    NativeCounter *n = Of(v);
    if (n == nullptr) return EINVAL;
    if (n->hold_next_create.exchange(false)) Hold(n);
    int err = n->sim->ops->create_qp_flags(n->sim, pd, a, flags, out);
    if (err == 0) QpMade(n, *out, flags);
    return err;
}

int PostSend(ote_verbs_t *v, struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
    NativeCounter *n = Of(v);
    if (n == nullptr) return EINVAL;
    {
        std::lock_guard<std::mutex> g(n->qp_mu);
        auto it = n->qp_live.find(qp);
        for (struct ibv_send_wr *w = wr; w != nullptr && it != n->qp_live.end(); w = w->next) {
            NativeCounter::QpSeen &q = n->qp_log[it->second];
            if (w->opcode == IBV_WR_RDMA_READ) q.reads++;
            else if (w->opcode == IBV_WR_RDMA_WRITE || w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM)
                q.writes++;
            else q.others++;
        }
    }
    return n->sim->ops->post_send(n->sim, qp, wr, bad);
}

int DestroyQp(ote_verbs_t *v, struct ibv_qp *qp) {
    NativeCounter *n = Of(v);
    if (n == nullptr) return EINVAL;
    if (n->hold_next_qp_destroy.exchange(false)) Hold(n);
    int err = n->sim->ops->destroy_qp(n->sim, qp);
    if (err == 0) {
        n->qps--;
        n->qps_destroyed++;
        std::lock_guard<std::mutex> g(n->qp_mu);
        auto it = n->qp_live.find(qp);
        if (it != n->qp_live.end()) {
            n->qp_log[it->second].destroyed = true;
            n->qp_live.erase(it);
        }
    }
    return err;
}

int AllocMw(ote_verbs_t *v, struct ibv_pd *pd, enum ibv_mw_type type, struct ibv_mw **out) {
    NativeCounter *n = Of(v);
    if (n == nullptr) return EINVAL;
    int err = n->sim->ops->alloc_mw(n->sim, pd, type, out);
    if (err == 0) n->mws++;
    return err;
}

int DeallocMw(ote_verbs_t *v, struct ibv_mw *mw) {
    NativeCounter *n = Of(v);
    if (n == nullptr) return EINVAL;
    int err = n->sim->ops->dealloc_mw(n->sim, mw);
    if (err == 0) n->mws--;
    return err;
}

int RegMr(ote_verbs_t *v, struct ibv_pd *pd, void *addr, size_t len, int access,
          struct ibv_mr **out) {
    NativeCounter *n = Of(v);
    if (n == nullptr) return EINVAL;
    int err = n->sim->ops->reg_mr(n->sim, pd, addr, len, access, out);
    if (err == 0) n->mrs++;
    if (err == 0 && n->Watched(addr)) n->watched_mrs++;
    if (err == 0 && (access & IBV_ACCESS_MW_BIND)) {
        std::lock_guard<std::mutex> g(n->bind_mu);
        n->bind_set.insert(*out);
        n->bind_regs++;
        n->bind_mrs++;
        n->last_bind_mr = *out;
    }
    return err;
}

int RegDmabufMr(ote_verbs_t *v, struct ibv_pd *pd, uint64_t offset, size_t len, uint64_t iova,
                int fd, int access, struct ibv_mr **out) {
    NativeCounter *n = Of(v);
    if (n == nullptr) return EINVAL;
    int err = n->sim->ops->reg_dmabuf_mr(n->sim, pd, offset, len, iova, fd, access, out);
    if (err == 0) n->mrs++;
    return err;
}

int DeregMr(ote_verbs_t *v, struct ibv_mr *mr) {
    NativeCounter *n = Of(v);
    if (n == nullptr) return EINVAL;
    bool watched = n->Watched(mr->addr); // read before the MR is gone
    std::unique_lock<std::mutex> g(n->bind_mu);
    bool bind = n->bind_set.erase(mr) > 0;
    g.unlock();
    int err = n->sim->ops->dereg_mr(n->sim, mr);
    if (err == 0) n->mrs--;
    if (err == 0 && watched) n->watched_mrs--;
    if (err == 0 && bind) n->bind_mrs--;
    if (err != 0 && bind) {
        g.lock();
        n->bind_set.insert(mr);
    }
    return err;
}

int CreateCq(ote_verbs_t *v, struct ibv_context *ctx, int cqe, void *cq_ctx,
             struct ibv_comp_channel *ch, int comp_vector, struct ibv_cq **out) {
    NativeCounter *n = Of(v);
    if (n == nullptr) return EINVAL;
    int err = n->sim->ops->create_cq(n->sim, ctx, cqe, cq_ctx, ch, comp_vector, out);
    if (err == 0) {
        std::lock_guard<std::mutex> g(n->cq_mu);
        n->cq_live.insert(*out);
        n->cqs_made++;
    }
    return err;
}

int DestroyCq(ote_verbs_t *v, struct ibv_cq *cq) {
    NativeCounter *n = Of(v);
    if (n == nullptr) return EINVAL;
    int err = n->sim->ops->destroy_cq(n->sim, cq);
    if (err == 0) {
        std::lock_guard<std::mutex> g(n->cq_mu);
        n->cq_live.erase(cq);
    }
    return err;
}

void Close(ote_verbs_t *v) {
    NativeCounter *n = Of(v);
    if (n == nullptr) return;
    {
        std::lock_guard<std::mutex> g(g_mu);
        g_live.erase(std::remove(g_live.begin(), g_live.end(), n), g_live.end());
    }
    n->closed = true;
    ote_verbs_close(n->sim);
}

} // namespace

ote_status_t WrapCounted(ote_verbs_t **v, std::vector<std::unique_ptr<NativeCounter>> *owned,
                         std::vector<ote_verbs_t *> *wrapped) {
    auto n = std::make_unique<NativeCounter>();
    n->sim = *v;
    n->ops = *(*v)->ops;
    n->ops.create_qp = CreateQp;
    n->ops.create_qp_flags = CreateQpFlags;
    n->ops.post_send = PostSend;
    n->ops.destroy_qp = DestroyQp;
    n->ops.alloc_mw = AllocMw;
    n->ops.dealloc_mw = DeallocMw;
    n->ops.reg_mr = RegMr;
    n->ops.reg_dmabuf_mr = RegDmabufMr;
    n->ops.dereg_mr = DeregMr;
    n->ops.create_cq = CreateCq;
    n->ops.destroy_cq = DestroyCq;
    n->v.ops = &n->ops;
    n->v.provider = (*v)->provider;
    n->v.priv = (*v)->priv;
    n->v.close = Close;
    {
        std::lock_guard<std::mutex> g(g_mu);
        g_live.push_back(n.get());
    }
    ote_verbs_t *f = nullptr;
    ote_status_t st = ote_verbs_fault_wrap(&n->v, OTE_VERBS_FAULT_OWN_INNER, &f);
    if (st != OTE_OK) {
        std::lock_guard<std::mutex> g(g_mu);
        g_live.pop_back();
        return st;
    }
    *v = f;
    wrapped->push_back(f);
    owned->push_back(std::move(n));
    return OTE_OK;
}

} // namespace ote_test

// tests/verbs/mock_provider.h - a tiny in-test verbs provider for decorator tests.
//
// It implements the ops a decorator test drives (device list, contexts with a real
// eventfd as async fd, PD/MR/MW/channel/CQ/QP create and destroy, posts that complete
// at once into the send CQ, poll, async events); the rest are EOPNOTSUPP stubs from
// ote_verbs_ops_fill_stubs(). It counts every call that reaches it, per fault op, so a
// test can prove that an injected failure did not reach the inner provider.
#ifndef OTE_TESTS_VERBS_MOCK_PROVIDER_H
#define OTE_TESTS_VERBS_MOCK_PROVIDER_H

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <vector>

extern "C" {
#include "verbs/fault.h"
#include "verbs/verbs.h"
}

namespace ote_test {

// What the mock's device_flags reports.
constexpr uint32_t kMockDeviceFlags = OTE_VERBS_DEV_SCATTER_TO_CQE | OTE_VERBS_DEV_SCATTER_OPT_OUT;

class MockProvider {
  public:
    MockProvider() {
        std::memset(&dev_, 0, sizeof(dev_));
        std::strcpy(dev_.name, "mock0");
        list_[0] = &dev_;
        list_[1] = nullptr;
        std::memset(&ops_, 0, sizeof(ops_));
        ops_.get_device_list = GetDeviceList;
        ops_.free_device_list = FreeDeviceList;
        ops_.get_device_name = GetDeviceName;
        ops_.open_device = OpenDevice;
        ops_.close_device = CloseDevice;
        ops_.query_port = QueryPort;
        ops_.get_async_event = GetAsyncEvent;
        ops_.ack_async_event = AckAsyncEvent;
        ops_.alloc_pd = AllocPd;
        ops_.dealloc_pd = DeallocPd;
        ops_.reg_mr = RegMr;
        ops_.dereg_mr = DeregMr;
        ops_.alloc_mw = AllocMw;
        ops_.dealloc_mw = DeallocMw;
        ops_.create_comp_channel = CreateCompChannel;
        ops_.destroy_comp_channel = DestroyCompChannel;
        ops_.create_cq = CreateCq;
        ops_.destroy_cq = DestroyCq;
        ops_.req_notify_cq = ReqNotifyCq;
        ops_.ack_cq_events = AckCqEvents;
        ops_.poll_cq = PollCq;
        ops_.create_qp = CreateQp;
        ops_.modify_qp = ModifyQp;
        ops_.destroy_qp = DestroyQp;
        ops_.post_send = PostSend;
        ops_.post_recv = PostRecv;
        ops_.query_device_ex = QueryDeviceEx;
        ops_.create_srq = CreateSrq;
        ops_.modify_srq = ModifySrq;
        ops_.query_srq = QuerySrq;
        ops_.destroy_srq = DestroySrq;
        ops_.post_srq_recv = PostSrqRecv;
        ops_.create_qp_flags = CreateQpFlags;
        ops_.qp_flags = QpFlags;
        ops_.device_flags = DeviceFlags;
        // query_device, query_gid, query_gid_ex, device_numa_node, get_cq_event,
        // query_qp: stubs.
        ote_verbs_ops_fill_stubs(&ops_);
        v_.ops = &ops_;
        v_.provider = "mock";
        v_.priv = this;
        v_.close = Close;
    }
    ~MockProvider() {
        for (auto *c : ctxs_) {
            close(c->async_fd);
            delete c;
        }
    }
    MockProvider(const MockProvider &) = delete;
    MockProvider &operator=(const MockProvider &) = delete;

    ote_verbs_t *verbs() { return &v_; }
    uint64_t inner_calls(ote_verbs_fault_op_t op) {
        std::lock_guard<std::mutex> g(mu_);
        return calls_[op];
    }
    uint64_t total_inner_calls() {
        std::lock_guard<std::mutex> g(mu_);
        uint64_t n = 0;
        for (auto c : calls_) n += c;
        return n;
    }
    int live_objects() {
        std::lock_guard<std::mutex> g(mu_);
        return static_cast<int>(live_.size());
    }
    bool closed() const { return closed_; }
    std::vector<uint64_t> posted_send() {
        std::lock_guard<std::mutex> g(mu_);
        return posted_send_;
    }
    std::vector<uint64_t> posted_recv() {
        std::lock_guard<std::mutex> g(mu_);
        return posted_recv_;
    }
    int async_acks() {
        std::lock_guard<std::mutex> g(mu_);
        return async_acks_;
    }
    // A WR with this wr_id is refused by the mock's post_send/post_recv with EINVAL.
    void set_refused_wr_id(uint64_t id) { refused_wr_id_ = id; }
    // Queue a native async event on ctx and make its async fd readable.
    void raise_async_event(struct ibv_context *ctx, const struct ibv_async_event &ev) {
        std::lock_guard<std::mutex> g(mu_);
        events_.push_back(ev);
        uint64_t one = 1;
        ssize_t n = write(ctx->async_fd, &one, sizeof(one));
        (void)n;
    }
    // Put a completion on a CQ directly.
    void complete(struct ibv_cq *cq, uint64_t wr_id, uint32_t qp_num) {
        std::lock_guard<std::mutex> g(mu_);
        struct ibv_wc wc;
        std::memset(&wc, 0, sizeof(wc));
        wc.wr_id = wr_id;
        wc.status = IBV_WC_SUCCESS;
        wc.opcode = IBV_WC_RDMA_WRITE;
        wc.byte_len = 64;
        wc.qp_num = qp_num;
        cqes_[cq].push_back(wc);
    }

  private:
    static MockProvider *M(ote_verbs_t *v) { return static_cast<MockProvider *>(v->priv); }
    void count(ote_verbs_fault_op_t op) {
        std::lock_guard<std::mutex> g(mu_);
        calls_[op]++;
    }
    void add(void *p) {
        std::lock_guard<std::mutex> g(mu_);
        live_.insert(p);
    }
    void del(void *p) {
        std::lock_guard<std::mutex> g(mu_);
        live_.erase(p);
    }

    static int GetDeviceList(ote_verbs_t *v, struct ibv_device ***list_out, int *num_out) {
        M(v)->count(OTE_VERBS_FAULT_OP_GET_DEVICE_LIST);
        *list_out = M(v)->list_;
        if (num_out) *num_out = 1;
        return 0;
    }
    static void FreeDeviceList(ote_verbs_t *v, struct ibv_device **) {
        M(v)->count(OTE_VERBS_FAULT_OP_FREE_DEVICE_LIST);
    }
    static const char *GetDeviceName(ote_verbs_t *v, struct ibv_device *dev) {
        M(v)->count(OTE_VERBS_FAULT_OP_GET_DEVICE_NAME);
        return dev ? dev->name : nullptr;
    }
    static int OpenDevice(ote_verbs_t *v, struct ibv_device *dev, struct ibv_context **ctx_out) {
        MockProvider *m = M(v);
        m->count(OTE_VERBS_FAULT_OP_OPEN_DEVICE);
        auto *c = new struct ibv_context;
        std::memset(c, 0, sizeof(*c));
        c->device = dev;
        c->async_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        {
            std::lock_guard<std::mutex> g(m->mu_);
            m->ctxs_.insert(c);
        }
        *ctx_out = c;
        return 0;
    }
    static int CloseDevice(ote_verbs_t *v, struct ibv_context *ctx) {
        MockProvider *m = M(v);
        m->count(OTE_VERBS_FAULT_OP_CLOSE_DEVICE);
        {
            std::lock_guard<std::mutex> g(m->mu_);
            m->ctxs_.erase(ctx);
        }
        close(ctx->async_fd);
        delete ctx;
        return 0;
    }
    static int QueryPort(ote_verbs_t *v, struct ibv_context *, uint8_t, struct ibv_port_attr *a) {
        M(v)->count(OTE_VERBS_FAULT_OP_QUERY_PORT);
        std::memset(a, 0, sizeof(*a));
        a->state = IBV_PORT_ACTIVE;
        return 0;
    }
    static int GetAsyncEvent(ote_verbs_t *v, struct ibv_context *ctx, struct ibv_async_event *ev) {
        MockProvider *m = M(v);
        m->count(OTE_VERBS_FAULT_OP_GET_ASYNC_EVENT);
        std::lock_guard<std::mutex> g(m->mu_);
        if (m->events_.empty()) return EAGAIN;
        *ev = m->events_.front();
        m->events_.pop_front();
        if (m->events_.empty()) {
            uint64_t val;
            ssize_t n = read(ctx->async_fd, &val, sizeof(val));
            (void)n;
        }
        return 0;
    }
    static void AckAsyncEvent(ote_verbs_t *v, struct ibv_async_event *) {
        MockProvider *m = M(v);
        m->count(OTE_VERBS_FAULT_OP_ACK_ASYNC_EVENT);
        std::lock_guard<std::mutex> g(m->mu_);
        m->async_acks_++;
    }
    static int AllocPd(ote_verbs_t *v, struct ibv_context *ctx, struct ibv_pd **pd_out) {
        M(v)->count(OTE_VERBS_FAULT_OP_ALLOC_PD);
        auto *pd = new struct ibv_pd;
        std::memset(pd, 0, sizeof(*pd));
        pd->context = ctx;
        M(v)->add(pd);
        *pd_out = pd;
        return 0;
    }
    static int DeallocPd(ote_verbs_t *v, struct ibv_pd *pd) {
        M(v)->count(OTE_VERBS_FAULT_OP_DEALLOC_PD);
        M(v)->del(pd);
        delete pd;
        return 0;
    }
    static int RegMr(ote_verbs_t *v, struct ibv_pd *pd, void *addr, size_t length, int,
                     struct ibv_mr **mr_out) {
        M(v)->count(OTE_VERBS_FAULT_OP_REG_MR);
        auto *mr = new struct ibv_mr;
        std::memset(mr, 0, sizeof(*mr));
        mr->pd = pd;
        mr->addr = addr;
        mr->length = length;
        M(v)->add(mr);
        *mr_out = mr;
        return 0;
    }
    static int DeregMr(ote_verbs_t *v, struct ibv_mr *mr) {
        M(v)->count(OTE_VERBS_FAULT_OP_DEREG_MR);
        M(v)->del(mr);
        delete mr;
        return 0;
    }
    static int AllocMw(ote_verbs_t *v, struct ibv_pd *pd, enum ibv_mw_type type,
                       struct ibv_mw **mw_out) {
        M(v)->count(OTE_VERBS_FAULT_OP_ALLOC_MW);
        auto *mw = new struct ibv_mw;
        std::memset(mw, 0, sizeof(*mw));
        mw->pd = pd;
        mw->type = type;
        M(v)->add(mw);
        *mw_out = mw;
        return 0;
    }
    static int DeallocMw(ote_verbs_t *v, struct ibv_mw *mw) {
        M(v)->count(OTE_VERBS_FAULT_OP_DEALLOC_MW);
        M(v)->del(mw);
        delete mw;
        return 0;
    }
    static int CreateCompChannel(ote_verbs_t *v, struct ibv_context *ctx,
                                 struct ibv_comp_channel **ch_out) {
        M(v)->count(OTE_VERBS_FAULT_OP_CREATE_COMP_CHANNEL);
        auto *ch = new struct ibv_comp_channel;
        std::memset(ch, 0, sizeof(*ch));
        ch->context = ctx;
        ch->fd = -1;
        M(v)->add(ch);
        *ch_out = ch;
        return 0;
    }
    static int DestroyCompChannel(ote_verbs_t *v, struct ibv_comp_channel *ch) {
        M(v)->count(OTE_VERBS_FAULT_OP_DESTROY_COMP_CHANNEL);
        M(v)->del(ch);
        delete ch;
        return 0;
    }
    static int CreateCq(ote_verbs_t *v, struct ibv_context *ctx, int cqe, void *cq_context,
                        struct ibv_comp_channel *ch, int, struct ibv_cq **cq_out) {
        M(v)->count(OTE_VERBS_FAULT_OP_CREATE_CQ);
        auto *c = new struct ibv_cq;
        std::memset(c, 0, sizeof(*c));
        c->context = ctx;
        c->channel = ch;
        c->cq_context = cq_context;
        c->cqe = cqe;
        M(v)->add(c);
        *cq_out = c;
        return 0;
    }
    static int DestroyCq(ote_verbs_t *v, struct ibv_cq *cq) {
        M(v)->count(OTE_VERBS_FAULT_OP_DESTROY_CQ);
        MockProvider *m = M(v);
        m->del(cq);
        {
            std::lock_guard<std::mutex> g(m->mu_);
            m->cqes_.erase(cq);
        }
        delete cq;
        return 0;
    }
    static int ReqNotifyCq(ote_verbs_t *v, struct ibv_cq *, int) {
        M(v)->count(OTE_VERBS_FAULT_OP_REQ_NOTIFY_CQ);
        return 0;
    }
    static void AckCqEvents(ote_verbs_t *v, struct ibv_cq *, unsigned int) {
        M(v)->count(OTE_VERBS_FAULT_OP_ACK_CQ_EVENTS);
    }
    static int PollCq(ote_verbs_t *v, struct ibv_cq *cq, int n, struct ibv_wc *wc) {
        MockProvider *m = M(v);
        m->count(OTE_VERBS_FAULT_OP_POLL_CQ);
        std::lock_guard<std::mutex> g(m->mu_);
        auto &q = m->cqes_[cq];
        int i = 0;
        while (i < n && !q.empty()) {
            wc[i++] = q.front();
            q.pop_front();
        }
        return i;
    }
    static int CreateQp(ote_verbs_t *v, struct ibv_pd *pd, struct ibv_qp_init_attr *init,
                        struct ibv_qp **qp_out) {
        MockProvider *m = M(v);
        m->count(OTE_VERBS_FAULT_OP_CREATE_QP);
        auto *qp = new struct ibv_qp;
        std::memset(qp, 0, sizeof(*qp));
        qp->context = pd ? pd->context : nullptr;
        qp->pd = pd;
        qp->send_cq = init->send_cq;
        qp->recv_cq = init->recv_cq;
        qp->qp_type = init->qp_type;
        qp->state = IBV_QPS_RESET;
        {
            std::lock_guard<std::mutex> g(m->mu_);
            qp->qp_num = ++m->next_qpn_;
        }
        m->add(qp);
        *qp_out = qp;
        return 0;
    }
    static int ModifyQp(ote_verbs_t *v, struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask) {
        M(v)->count(OTE_VERBS_FAULT_OP_MODIFY_QP);
        if (mask & IBV_QP_STATE) qp->state = attr->qp_state;
        return 0;
    }
    static int DestroyQp(ote_verbs_t *v, struct ibv_qp *qp) {
        M(v)->count(OTE_VERBS_FAULT_OP_DESTROY_QP);
        M(v)->del(qp);
        {
            std::lock_guard<std::mutex> g(M(v)->mu_);
            M(v)->qp_flags_.erase(qp);
        }
        delete qp;
        return 0;
    }
    // Every accepted WR completes at once, successfully, on the send CQ.
    static int PostSend(ote_verbs_t *v, struct ibv_qp *qp, struct ibv_send_wr *wr,
                        struct ibv_send_wr **bad_wr) {
        MockProvider *m = M(v);
        m->count(OTE_VERBS_FAULT_OP_POST_SEND);
        for (; wr != nullptr; wr = wr->next) {
            if (wr->wr_id == m->refused_wr_id_) {
                *bad_wr = wr;
                return EINVAL;
            }
            {
                std::lock_guard<std::mutex> g(m->mu_);
                m->posted_send_.push_back(wr->wr_id);
            }
            if (qp != nullptr && qp->send_cq != nullptr)
                m->complete(qp->send_cq, wr->wr_id, qp->qp_num);
        }
        return 0;
    }
    static int PostRecv(ote_verbs_t *v, struct ibv_qp *, struct ibv_recv_wr *wr,
                        struct ibv_recv_wr **bad_wr) {
        MockProvider *m = M(v);
        m->count(OTE_VERBS_FAULT_OP_POST_RECV);
        for (; wr != nullptr; wr = wr->next) {
            if (wr->wr_id == m->refused_wr_id_) {
                *bad_wr = wr;
                return EINVAL;
            }
            std::lock_guard<std::mutex> g(m->mu_);
            m->posted_recv_.push_back(wr->wr_id);
        }
        return 0;
    }
    // The extended entries: what they report is fixed (max_qp_wr 77, srq_limit 5, device
    // flags kMockDeviceFlags), so a test sees that the answer came from here.
    static int QueryDeviceEx(ote_verbs_t *v, struct ibv_context *, struct ibv_device_attr_ex *a) {
        M(v)->count(OTE_VERBS_FAULT_OP_QUERY_DEVICE_EX);
        std::memset(a, 0, sizeof(*a));
        a->orig_attr.max_qp_wr = 77;
        return 0;
    }
    static int CreateSrq(ote_verbs_t *v, struct ibv_pd *pd, struct ibv_srq_init_attr *init,
                         struct ibv_srq **srq_out) {
        M(v)->count(OTE_VERBS_FAULT_OP_CREATE_SRQ);
        auto *srq = new struct ibv_srq;
        std::memset(srq, 0, sizeof(*srq));
        srq->context = pd ? pd->context : nullptr;
        srq->pd = pd;
        srq->srq_context = init->srq_context;
        M(v)->add(srq);
        *srq_out = srq;
        return 0;
    }
    static int ModifySrq(ote_verbs_t *v, struct ibv_srq *, struct ibv_srq_attr *, int) {
        M(v)->count(OTE_VERBS_FAULT_OP_MODIFY_SRQ);
        return 0;
    }
    static int QuerySrq(ote_verbs_t *v, struct ibv_srq *, struct ibv_srq_attr *a) {
        M(v)->count(OTE_VERBS_FAULT_OP_QUERY_SRQ);
        std::memset(a, 0, sizeof(*a));
        a->srq_limit = 5;
        return 0;
    }
    static int DestroySrq(ote_verbs_t *v, struct ibv_srq *srq) {
        M(v)->count(OTE_VERBS_FAULT_OP_DESTROY_SRQ);
        M(v)->del(srq);
        delete srq;
        return 0;
    }
    static int PostSrqRecv(ote_verbs_t *v, struct ibv_srq *, struct ibv_recv_wr *wr,
                           struct ibv_recv_wr **bad_wr) {
        MockProvider *m = M(v);
        m->count(OTE_VERBS_FAULT_OP_POST_SRQ_RECV);
        for (; wr != nullptr; wr = wr->next) {
            if (wr->wr_id == m->refused_wr_id_) {
                *bad_wr = wr;
                return EINVAL;
            }
            std::lock_guard<std::mutex> g(m->mu_);
            m->posted_recv_.push_back(wr->wr_id);
        }
        return 0;
    }
    // As create_qp (counted once, under CREATE_QP_FLAGS), remembering the flags.
    static int CreateQpFlags(ote_verbs_t *v, struct ibv_pd *pd, struct ibv_qp_init_attr *init,
                             uint32_t flags, struct ibv_qp **qp_out) {
        MockProvider *m = M(v);
        int r = CreateQp(v, pd, init, qp_out);
        std::lock_guard<std::mutex> g(m->mu_);
        m->calls_[OTE_VERBS_FAULT_OP_CREATE_QP]--;
        m->calls_[OTE_VERBS_FAULT_OP_CREATE_QP_FLAGS]++;
        if (r == 0) m->qp_flags_[*qp_out] = flags;
        return r;
    }
    static int QpFlags(ote_verbs_t *v, struct ibv_qp *qp, uint32_t *flags_out) {
        MockProvider *m = M(v);
        m->count(OTE_VERBS_FAULT_OP_QP_FLAGS);
        std::lock_guard<std::mutex> g(m->mu_);
        auto it = m->qp_flags_.find(qp);
        *flags_out = it == m->qp_flags_.end() ? 0 : it->second;
        return 0;
    }
    static int DeviceFlags(ote_verbs_t *v, struct ibv_context *, uint32_t *flags_out) {
        M(v)->count(OTE_VERBS_FAULT_OP_DEVICE_FLAGS);
        *flags_out = kMockDeviceFlags;
        return 0;
    }
    static void Close(ote_verbs_t *v) { M(v)->closed_ = true; }

    std::mutex mu_;
    struct ibv_device dev_;
    struct ibv_device *list_[2];
    ote_verbs_ops_t ops_;
    ote_verbs_t v_{};
    uint64_t calls_[OTE_VERBS_FAULT_OP_COUNT] = {};
    std::set<void *> live_;
    std::set<struct ibv_context *> ctxs_;
    std::map<struct ibv_cq *, std::deque<struct ibv_wc>> cqes_;
    std::deque<struct ibv_async_event> events_;
    std::vector<uint64_t> posted_send_, posted_recv_;
    std::map<struct ibv_qp *, uint32_t> qp_flags_;
    int async_acks_ = 0;
    uint32_t next_qpn_ = 100;
    uint64_t refused_wr_id_ = UINT64_MAX;
    bool closed_ = false;
};

} // namespace ote_test

#endif

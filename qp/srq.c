/*
 * qp/srq.c - the shared receive queue of a CQ lane (see srq.h): its buffers and MR, the
 * native SRQ, its WR id namespace on the lane, posting and reposting, admission, the map
 * of attached QPs that completions are handed to, the limit event, and destruction.
 *
 * Slot i's WR id is OTE_CQ_WR_ID(ns, i). A posted slot holds one receive-CQ charge on the
 * lane from its post until its CQE (or the native SRQ's destruction, which discards it).
 *
 * Locks: mu guards the slots' accounting, the member map, state and statistics; it is
 * taken after a QP's own mu (ote_qp_rq_admit), never before. Completion handling takes
 * it only to settle a slot and find the QP; the QP's on_recv runs without it. A retained
 * native SRQ is counted as OTE_RETAINED_QP (a work queue) in its context.
 */
#include <errno.h>
#include <string.h>

#include "base/alloc.h"
#include "base/fault.h"
#include "base/log.h"
#include "context/context.h"
#include "qp/qp_internal.h"
#include "qp/srq.h"

/* UNBOUND: its natives destroyed for a reopen of its context (ote_srq_unbind), until
 * ote_srq_rebind makes them on the new PD; nothing is posted or attached meanwhile. */
typedef enum { SRQ_ACTIVE = 0, SRQ_CLOSING, SRQ_UNBOUND } srq_state_t;
/* The native limit: off (none or arming failed), armed, fired (the event came; armed
 * again once every slot is posted), being re-armed (one thread calls modify_srq). */
typedef enum { LIMIT_OFF = 0, LIMIT_ARMED, LIMIT_FIRED, LIMIT_REARMING } srq_limit_t;

typedef struct srq_member {
    uint32_t qp_num;
    ote_qp_t *qp;
    UT_hash_handle hh;
} srq_member_t;

struct ote_srq {
    ote_cq_lane_t *lane;
    ote_context_t *ctx;
    ote_verbs_t *v;
    ote_srq_config_t cfg;
    struct ibv_pd *pd;
    struct ibv_srq *srq; /* NULL once natively destroyed */
    struct ibv_mr *mr;
    uint8_t *buf;
    uint8_t *posted; /* per slot */
    uint32_t ns;
    int ns_registered;
    int listener_added;
    uint64_t listener_id;

    ote_mutex_t mu;
    srq_state_t state;
    srq_limit_t limit;
    srq_member_t *members;
    uint32_t attached;
    uint32_t count, admitted, peak_admitted;
    uint64_t completions, errors, orphans, repost_failures, limit_events;
    int retained_srq, retained_mr;
};

void ote_srq_config_default(ote_srq_config_t *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->slots = 256;
    cfg->size = 4096;
    cfg->low_water = 64;
}

/* ---- posting ---- */

static void slot_wr(ote_srq_t *s, uint32_t i, struct ibv_recv_wr *wr, struct ibv_sge *sge) {
    memset(wr, 0, sizeof(*wr));
    sge->addr = (uintptr_t)(s->buf + (size_t)i * s->cfg.size);
    sge->length = s->cfg.size;
    sge->lkey = s->mr->lkey;
    wr->wr_id = OTE_CQ_WR_ID(s->ns, i);
    wr->sg_list = sge;
    wr->num_sge = 1;
}

/* Post the n slots of idx as one chain (caller holds mu): the lane's receive CQ is
 * charged first; what the provider did not take is released again. */
static ote_status_t post_slots(ote_srq_t *s, const uint32_t *idx, uint32_t n,
                               struct ibv_recv_wr *wrs, struct ibv_sge *sges) {
    ote_status_t st = ote_cq_lane_reserve(s->lane, OTE_CQ_RECV, n);
    if (st != OTE_OK) {
        s->repost_failures += n;
        OTE_WARN("qp", "%s: SRQ: no room on the lane's receive CQ for %u slots: left idle",
                 ote_context_name(s->ctx), n);
        return st;
    }
    for (uint32_t k = 0; k < n; k++) {
        slot_wr(s, idx[k], &wrs[k], &sges[k]);
        if (k > 0) wrs[k - 1].next = &wrs[k];
    }
    struct ibv_recv_wr *bad = NULL;
    int err = s->v->ops->post_srq_recv(s->v, s->srq, wrs, &bad);
    uint32_t posted = n;
    if (err != 0) { /* the slots before bad_wr are posted */
        uint32_t j = 0;
        while (j < n && &wrs[j] != bad) j++;
        posted = j;
        st = ote_verbs_status(err);
        s->repost_failures += n - posted;
        OTE_WARN("qp", "%s: SRQ posted %u of %u receive slots: errno %d", ote_context_name(s->ctx),
                 posted, n, err);
    }
    for (uint32_t k = 0; k < posted; k++) s->posted[idx[k]] = 1;
    s->count += posted;
    if (posted < n) ote_cq_lane_release(s->lane, OTE_CQ_RECV, n - posted);
    return st;
}

static ote_status_t post_all(ote_srq_t *s) {
    uint32_t n = s->cfg.slots;
    uint32_t *idx = ote_calloc(n, sizeof(*idx));
    struct ibv_recv_wr *wrs = ote_calloc(n, sizeof(*wrs));
    struct ibv_sge *sges = ote_calloc(n, sizeof(*sges));
    ote_status_t st = OTE_ERR_NOMEM;
    if (idx != NULL && wrs != NULL && sges != NULL) {
        for (uint32_t i = 0; i < n; i++) idx[i] = i;
        ote_mutex_lock(&s->mu);
        st = post_slots(s, idx, n, wrs, sges);
        ote_mutex_unlock(&s->mu);
    }
    ote_free(idx);
    ote_free(wrs);
    ote_free(sges);
    return st;
}

/* ---- the limit ---- */

static int modify_limit(ote_srq_t *s, uint32_t limit) {
    struct ibv_srq_attr a;
    memset(&a, 0, sizeof(a));
    a.srq_limit = limit;
    return s->v->ops->modify_srq(s->v, s->srq, &a, IBV_SRQ_LIMIT);
}

/* After a repost: a fired limit is armed again once every slot is posted. */
static void maybe_rearm(ote_srq_t *s) {
    ote_mutex_lock(&s->mu);
    int go = s->limit == LIMIT_FIRED && s->count == s->cfg.slots && s->state == SRQ_ACTIVE;
    if (go) s->limit = LIMIT_REARMING;
    ote_mutex_unlock(&s->mu);
    if (!go) return;
    int err = modify_limit(s, s->cfg.low_water);
    ote_mutex_lock(&s->mu);
    s->limit = err == 0 ? LIMIT_ARMED : LIMIT_OFF;
    ote_mutex_unlock(&s->mu);
    if (err != 0)
        OTE_WARN("qp", "%s: SRQ limit not re-armed: errno %d", ote_context_name(s->ctx), err);
}

static void srq_listener(void *arg, ote_context_t *ctx, const struct ibv_async_event *ev) {
    ote_srq_t *s = arg;
    if (ctx != s->ctx || ev->event_type != IBV_EVENT_SRQ_LIMIT_REACHED || ev->element.srq != s->srq)
        return;
    ote_mutex_lock(&s->mu);
    s->limit_events++;
    if (s->limit == LIMIT_ARMED) s->limit = LIMIT_FIRED;
    uint32_t posted = s->count, admitted = s->admitted, attached = s->attached;
    uint64_t reposts_failed = s->repost_failures;
    ote_mutex_unlock(&s->mu);
    OTE_WARN("qp",
             "%s lane %u: SRQ below its limit (%u of %u slots posted, low water %u): "
             "%u reserved, %u QPs, %llu reposts failed; receives are consumed faster than "
             "their completions are polled",
             ote_context_name(ctx), ote_cq_lane_index(s->lane), posted, s->cfg.slots,
             s->cfg.low_water, admitted, attached, (unsigned long long)reposts_failed);
}

/* ---- completions ---- */

/* Repost slot i after its completion was handed up, while the SRQ is active. */
static void repost(ote_srq_t *s, uint32_t i) {
    struct ibv_recv_wr wr;
    struct ibv_sge sge;
    ote_mutex_lock(&s->mu);
    if (s->state == SRQ_ACTIVE && !s->posted[i]) (void)post_slots(s, &i, 1, &wr, &sge);
    ote_mutex_unlock(&s->mu);
    maybe_rearm(s);
}

static void srq_on_cqe(void *arg, ote_cq_lane_t *lane, ote_cq_dir_t dir, const struct ibv_wc *wc) {
    (void)lane;
    ote_srq_t *s = arg;
    uint64_t i = OTE_CQ_WR_LOCAL(wc->wr_id);
    ote_mutex_lock(&s->mu);
    if (dir != OTE_CQ_RECV || i >= s->cfg.slots || !s->posted[i]) {
        ote_mutex_unlock(&s->mu);
        OTE_WARN("qp", "SRQ: CQE for slot 0x%llx that is not posted (QP %u): dropped",
                 (unsigned long long)i, wc->qp_num);
        return;
    }
    s->posted[i] = 0;
    s->count--;
    int ok = wc->status == IBV_WC_SUCCESS;
    if (ok) s->completions++;
    else s->errors++;
    srq_member_t *m = NULL;
    uint32_t qpn = wc->qp_num;
    HASH_FIND(hh, s->members, &qpn, sizeof(uint32_t), m);
    ote_qp_t *qp = m != NULL ? m->qp : NULL;
    if (qp == NULL) s->orphans++;
    ote_mutex_unlock(&s->mu);
    ote_cq_lane_release(s->lane, OTE_CQ_RECV, 1);
    /* The QP stays valid meanwhile: its destroy removes it from the map, then detaches
     * its lane hook, which waits for the poll that runs this. */
    if (qp != NULL) ote__rq_srq_recv(qp, wc, s->buf + (size_t)i * s->cfg.size);
    repost(s, (uint32_t)i);
}

/* ---- create / destroy ---- */

static ote_status_t register_buffers(ote_srq_t *s) {
    size_t bytes = (size_t)s->cfg.slots * s->cfg.size;
    int err = s->v->ops->reg_mr(s->v, s->pd, s->buf, bytes, IBV_ACCESS_LOCAL_WRITE, &s->mr);
    if (err != 0) {
        OTE_ERROR("qp", "%s: reg_mr of %u SRQ buffers failed: errno %d", ote_context_name(s->ctx),
                  s->cfg.slots, err);
        return ote_status_make(OTE_ERR_NATIVE, err);
    }
    return OTE_OK;
}

static ote_status_t create_buffers(ote_srq_t *s) {
    size_t bytes = (size_t)s->cfg.slots * s->cfg.size;
    s->posted = ote_calloc(s->cfg.slots, 1);
    s->buf = ote_aligned_alloc(64, bytes);
    if (s->posted == NULL || s->buf == NULL) return OTE_ERR_NOMEM;
    memset(s->buf, 0, bytes);
    return register_buffers(s);
}

static ote_status_t create_native(ote_srq_t *s) {
    struct ibv_srq_init_attr ia;
    memset(&ia, 0, sizeof(ia));
    ia.srq_context = s;
    ia.attr.max_wr = s->cfg.slots;
    ia.attr.max_sge = 1;
    int err = s->v->ops->create_srq(s->v, s->pd, &ia, &s->srq);
    if (err != 0) {
        OTE_ERROR("qp", "%s: create_srq(%u WRs) failed: errno %d", ote_context_name(s->ctx),
                  s->cfg.slots, err);
        return ote_status_make(OTE_ERR_NATIVE, err);
    }
    return OTE_OK;
}

/* Destroy the native SRQ (its posted WRs vanish without completions: their charges go
 * back) and deregister the MR; a failure of either is retained and counted. */
static ote_status_t destroy_natives(ote_srq_t *s) {
    if (s->srq != NULL) {
        int err = s->v->ops->destroy_srq(s->v, s->srq);
        if (err != 0) {
            if (!s->retained_srq) ote_context_retained_add(s->ctx, OTE_RETAINED_QP, 1);
            s->retained_srq = 1;
            OTE_WARN("qp", "%s: destroy_srq failed: errno %d; SRQ, buffers and charges retained",
                     ote_context_name(s->ctx), err);
            return ote_status_make(OTE_ERR_RETAINED, err);
        }
        s->srq = NULL;
        if (s->retained_srq) ote_context_retained_add(s->ctx, OTE_RETAINED_QP, -1);
        s->retained_srq = 0;
        ote_mutex_lock(&s->mu);
        uint32_t n = s->count;
        s->count = 0;
        if (s->posted != NULL) memset(s->posted, 0, s->cfg.slots);
        ote_mutex_unlock(&s->mu);
        if (n > 0) ote_cq_lane_release(s->lane, OTE_CQ_RECV, n);
    }
    if (s->mr != NULL) {
        int err = s->v->ops->dereg_mr(s->v, s->mr);
        if (err != 0) {
            if (!s->retained_mr) ote_context_retained_add(s->ctx, OTE_RETAINED_MR, 1);
            s->retained_mr = 1;
            OTE_WARN("qp", "%s: dereg of the SRQ MR failed: errno %d; buffers retained",
                     ote_context_name(s->ctx), err);
            return ote_status_make(OTE_ERR_RETAINED, err);
        }
        s->mr = NULL;
        if (s->retained_mr) ote_context_retained_add(s->ctx, OTE_RETAINED_MR, -1);
        s->retained_mr = 0;
    }
    return OTE_OK;
}

static void free_srq(ote_srq_t *s) {
    ote_free(s->posted);
    ote_aligned_free(s->buf);
    ote_mutex_destroy(&s->mu);
    ote_free(s);
}

/* Everything create set up, undone in reverse; the object stays (retained) when a
 * native destroy fails. */
static ote_status_t teardown(ote_srq_t *s) {
    if (s->listener_added) {
        ote_context_set_remove_listener(ote_context_owner(s->ctx), s->listener_id);
        s->listener_added = 0;
    }
    ote_status_t st = destroy_natives(s);
    if (st != OTE_OK) return st;
    if (s->ns_registered) {
        ote_cq_lane_unregister_ns(s->lane, s->ns);
        s->ns_registered = 0;
    }
    free_srq(s);
    return OTE_OK;
}

/* Every slot posted, then the limit armed (a WARN when it cannot be). */
static ote_status_t post_and_arm(ote_srq_t *s) {
    ote_status_t st = post_all(s);
    if (st != OTE_OK || s->cfg.low_water == 0) return st;
    int err = modify_limit(s, s->cfg.low_water);
    ote_mutex_lock(&s->mu);
    s->limit = err == 0 ? LIMIT_ARMED : LIMIT_OFF;
    ote_mutex_unlock(&s->mu);
    if (err != 0)
        OTE_WARN("qp", "%s: SRQ limit %u not armed: errno %d", ote_context_name(s->ctx),
                 s->cfg.low_water, err);
    return OTE_OK;
}

static ote_status_t create_steps(ote_srq_t *s) {
    ote_status_t st;
    if ((st = create_buffers(s)) != OTE_OK) return st;
    if ((st = create_native(s)) != OTE_OK) return st;
    if ((st = ote_cq_lane_register_ns(s->lane, srq_on_cqe, s, &s->ns)) != OTE_OK) return st;
    s->ns_registered = 1;
    /* Completions of QPs destroyed with CQEs still queued come here too. */
    ote_cq_lane_share_ns(s->lane, s->ns);
    if ((st = post_and_arm(s)) != OTE_OK) return st;
    st = ote_context_set_add_listener(ote_context_owner(s->ctx), srq_listener, s, &s->listener_id);
    if (st == OTE_OK) s->listener_added = 1;
    return st;
}

ote_status_t ote_srq_create(ote_cq_lane_t *lane, const ote_srq_config_t *cfg, ote_srq_t **srq_out) {
    if (lane == NULL || cfg == NULL || srq_out == NULL || cfg->slots == 0 || cfg->size == 0 ||
        cfg->low_water > cfg->slots)
        return OTE_ERR_INVALID;
    ote_context_t *ctx = ote_cq_lane_context(lane);
    /* An SRQ has no port: a paused context (its port down) keeps its PD and takes one;
     * only a fatal device refuses. */
    ote_status_t st = ote_context_check(ctx);
    if (st != OTE_OK && ote_status_code(st) != OTE_ERR_PORT_DOWN) return st;
    st = OTE_OK;
    if (ote_fault_hit("qp.srq_create", &st)) return st;
    ote_srq_t *s = ote_calloc(1, sizeof(*s));
    if (s == NULL) return OTE_ERR_NOMEM;
    s->lane = lane;
    s->ctx = ctx;
    s->v = ote_context_verbs(ctx);
    s->cfg = *cfg;
    s->pd = cfg->pd != NULL ? cfg->pd : ote_context_pd(ctx);
    if ((st = ote_mutex_init(&s->mu)) != OTE_OK) {
        ote_free(s);
        return st;
    }
    st = create_steps(s);
    if (st != OTE_OK) {
        ote_mutex_lock(&s->mu);
        s->state = SRQ_CLOSING;
        ote_mutex_unlock(&s->mu);
        (void)teardown(s); /* a failed native destroy keeps it, counted as retained */
        return st;
    }
    OTE_DEBUG("qp", "%s: SRQ on lane %u: %u slots of %u bytes, low water %u", ote_context_name(ctx),
              ote_cq_lane_index(lane), cfg->slots, cfg->size, cfg->low_water);
    *srq_out = s;
    return OTE_OK;
}

ote_status_t ote_srq_destroy(ote_srq_t *srq) {
    if (srq == NULL) return OTE_OK;
    ote_mutex_lock(&srq->mu);
    if (srq->attached > 0) {
        uint32_t n = srq->attached;
        ote_mutex_unlock(&srq->mu);
        OTE_WARN("qp", "%s: SRQ destroy refused: %u QPs still attached", ote_context_name(srq->ctx),
                 n);
        return OTE_ERR_BUSY;
    }
    srq->state = SRQ_CLOSING; /* nothing is reposted from now on */
    ote_mutex_unlock(&srq->mu);
    return teardown(srq);
}

/* ---- QPs on the SRQ (qp.c) ---- */

struct ibv_pd *ote__srq_pd(const ote_srq_t *srq) {
    return srq->pd;
}

ote_status_t ote__srq_attach(ote_srq_t *srq, ote_qp_t *qp, uint32_t qp_num) {
    srq_member_t *m = ote_calloc(1, sizeof(*m));
    if (m == NULL) return OTE_ERR_NOMEM;
    m->qp_num = qp_num;
    m->qp = qp;
    ote_status_t st = OTE_OK;
    ote_mutex_lock(&srq->mu);
    srq_member_t *old = NULL;
    HASH_FIND(hh, srq->members, &qp_num, sizeof(uint32_t), old);
    if (old != NULL) st = OTE_ERR_EXISTS;
    else if (srq->state != SRQ_ACTIVE) st = OTE_ERR_STATE;
    else OTE_HASH_ADD(hh, srq->members, qp_num, sizeof(uint32_t), m, st);
    if (st == OTE_OK) srq->attached++;
    ote_mutex_unlock(&srq->mu);
    if (st != OTE_OK) ote_free(m);
    return st;
}

void ote__srq_detach(ote_srq_t *srq, uint32_t qp_num, uint32_t admitted) {
    ote_mutex_lock(&srq->mu);
    srq_member_t *m = NULL;
    HASH_FIND(hh, srq->members, &qp_num, sizeof(uint32_t), m);
    if (m != NULL) {
        HASH_DEL(srq->members, m);
        srq->attached--;
    }
    srq->admitted = admitted < srq->admitted ? srq->admitted - admitted : 0;
    ote_mutex_unlock(&srq->mu);
    ote_free(m);
}

/* ---- admission and queries ---- */

ote_status_t ote_srq_admit(ote_srq_t *srq) {
    ote_status_t st = OTE_OK;
    if (ote_fault_hit("qp.rq_admit", &st)) return st;
    return ote__srq_admit(srq);
}

ote_status_t ote__srq_admit(ote_srq_t *srq) {
    ote_status_t st = OTE_OK;
    ote_mutex_lock(&srq->mu);
    if (srq->state == SRQ_ACTIVE && srq->admitted < srq->count) {
        srq->admitted++;
        if (srq->admitted > srq->peak_admitted) srq->peak_admitted = srq->admitted;
    } else {
        st = OTE_ERR_AGAIN;
    }
    ote_mutex_unlock(&srq->mu);
    return st;
}

void ote_srq_unadmit(ote_srq_t *srq) {
    ote_mutex_lock(&srq->mu);
    if (srq->admitted > 0) srq->admitted--;
    ote_mutex_unlock(&srq->mu);
}

uint32_t ote_srq_credits(const ote_srq_t *srq) {
    ote_srq_t *s = (ote_srq_t *)srq;
    ote_mutex_lock(&s->mu);
    uint32_t n = s->count;
    ote_mutex_unlock(&s->mu);
    return n;
}

uint32_t ote_srq_admitted(const ote_srq_t *srq) {
    ote_srq_t *s = (ote_srq_t *)srq;
    ote_mutex_lock(&s->mu);
    uint32_t n = s->admitted;
    ote_mutex_unlock(&s->mu);
    return n;
}

ote_cq_lane_t *ote_srq_lane(const ote_srq_t *srq) { return srq->lane; }
struct ibv_srq *ote_srq_native(const ote_srq_t *srq) {
    return srq->srq;
}

void ote_srq_get_stats(const ote_srq_t *srq, ote_srq_stats_t *out) {
    ote_srq_t *s = (ote_srq_t *)srq;
    memset(out, 0, sizeof(*out));
    ote_mutex_lock(&s->mu);
    out->slots = s->cfg.slots;
    out->posted = s->count;
    out->admitted = s->admitted;
    out->peak_admitted = s->peak_admitted;
    out->attached = s->attached;
    out->completions = s->completions;
    out->errors = s->errors;
    out->orphans = s->orphans;
    out->repost_failures = s->repost_failures;
    out->limit_events = s->limit_events;
    out->retained = s->retained_srq || s->retained_mr;
    ote_mutex_unlock(&s->mu);
}

ote_status_t ote_srq_unbind(ote_srq_t *srq) {
    if (srq == NULL) return OTE_ERR_INVALID;
    ote_mutex_lock(&srq->mu);
    ote_status_t st = OTE_OK;
    if (srq->attached > 0) st = OTE_ERR_BUSY;
    else if (srq->state == SRQ_CLOSING) st = OTE_ERR_STATE;
    if (st == OTE_OK) {
        srq->state = SRQ_UNBOUND; /* nothing is reposted from now on */
        srq->limit = LIMIT_OFF;
    }
    ote_mutex_unlock(&srq->mu);
    if (st != OTE_OK) return st;
    return destroy_natives(srq); /* a failure is retained; a later unbind retries */
}

ote_status_t ote_srq_rebind(ote_srq_t *srq) {
    if (srq == NULL) return OTE_ERR_INVALID;
    ote_mutex_lock(&srq->mu);
    int ok = srq->state == SRQ_UNBOUND && srq->srq == NULL && srq->mr == NULL && !srq->cfg.pd;
    ote_mutex_unlock(&srq->mu);
    if (!ok) return OTE_ERR_STATE;
    /* Its context is still LOST here (reopened, resumed after the rebuild) or paused. */
    if (ote_context_state(srq->ctx) == OTE_CONTEXT_FATAL) return OTE_ERR_DEVICE_FATAL;
    ote_status_t st;
    srq->pd = ote_context_pd(srq->ctx);
    st = register_buffers(srq);
    if (st == OTE_OK) st = create_native(srq);
    if (st == OTE_OK) {
        ote_mutex_lock(&srq->mu);
        srq->state = SRQ_ACTIVE;
        ote_mutex_unlock(&srq->mu);
        st = post_and_arm(srq);
    }
    if (st == OTE_OK) return OTE_OK;
    ote_mutex_lock(&srq->mu);
    srq->state = SRQ_UNBOUND;
    ote_mutex_unlock(&srq->mu);
    (void)destroy_natives(srq); /* a failure is retained and counted */
    return st;
}

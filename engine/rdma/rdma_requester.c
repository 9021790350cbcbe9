/*
 * engine/rdma/rdma_requester.c - the requester data path of the RDMA transport: an engine
 * slice becomes a grant. Pick the least-loaded slot of the (peer, capability) endpoint,
 * borrow its QP (built with a CONNECT round trip when cold), find the local MR (or
 * register a temporary one), and start a grant whose GRANT_REQ this file sends; the
 * grant layer posts the data and ends the slice. A notification is one NOTIFY frame
 * whose NOTIFY_ACK (or its deadline, or the loss of the connection) ends it. Runs on
 * the submitting threads (and the monitor for deadlines); touches the peer's notes and
 * grant ids under p->mu and the slice's transport scratch.
 */
#include <stdint.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "engine/rdma/rdma_internal.h"

note_t *ote__rdma_note_take(ote__tpeer_t *p, uint64_t req_id) {
    note_t **pp = &p->notes;
    while (*pp != NULL && (*pp)->req_id != req_id) pp = &(*pp)->next;
    note_t *x = *pp;
    if (x != NULL) *pp = x->next;
    return x;
}

int ote__rdma_grant_id_take(ote__tpeer_t *p, uint64_t id) {
    gid_ent_t **pp = &p->grants;
    while (*pp != NULL && (*pp)->id != id) pp = &(*pp)->next;
    gid_ent_t *x = *pp;
    if (x == NULL) return 0;
    *pp = x->next;
    ote_free(x);
    return 1;
}

void ote__rdma_notes_end(note_t *list, ote_status_t st) {
    while (list != NULL) {
        note_t *x = list;
        list = x->next;
        x->s->done(x->s, st);
        ote_free(x);
    }
}

/* Fail notifications whose NOTIFY_ACK did not come by their deadline. */
void ote__rdma_notes_expire(rdma_tp_t *tp) {
    uint64_t now = ote_now_ns();
    note_t *expired = NULL;
    ote_mutex_lock(&tp->mu);
    for (ote__tpeer_t *p = tp->peers; p != NULL; p = p->tp_next) {
        ote_mutex_lock(&p->mu);
        for (note_t **pp = &p->notes; *pp != NULL;) {
            note_t *x = *pp;
            if (x->deadline > now) {
                pp = &x->next;
                continue;
            }
            *pp = x->next;
            x->next = expired;
            expired = x;
            OTE_WARN("rdma", "notification to %s not acknowledged by its deadline: failed",
                     p->name);
        }
        ote_mutex_unlock(&p->mu);
    }
    ote_mutex_unlock(&tp->mu);
    ote__rdma_notes_end(expired, OTE_ERR_TIMEOUT);
}

typedef struct {
    ote__tpeer_t *p;
    uint32_t cap;
    uint32_t pair; /* (the peer's device << 8) | ours */
} xarg_t;

static ote_status_t req_exchange(void *arg, uint32_t slot, const ote_qp_path_t *local,
                                 ote_qp_path_t *peer_out, ote_deadline_t deadline) {
    xarg_t *x = arg;
    ote_rp_msg_t rq;
    memset(&rq, 0, sizeof(rq));
    rq.type = OTE_RP_CONNECT;
    rq.u.connect.slot = slot;
    rq.u.connect.cap = x->cap;
    rq.u.connect.path = *local;
    rq.u.connect.pair = x->pair;
    return ote__rdma_peer_call(x->p, &rq, OTE_RP_CONNECT_ACK, deadline, peer_out);
}

/* The grant's control callback argument: the peer and the slice (for its request's
 * extent). ote_grant_start() calls request() before it returns, so it lives on the stack. */
typedef struct {
    ote__tpeer_t *p;
    const ote__slice_t *s;
    uint32_t nic, pair; /* our device; (the peer's device << 8) | ours */
} garg_t;

static ote_status_t grant_request(void *arg, uint64_t grant_id, uint32_t slot, uint32_t remote_qpn,
                                  ote_grant_op_t op, uint64_t addr, uint64_t len) {
    const garg_t *ga = arg;
    ote__tpeer_t *p = ga->p;
    gid_ent_t *g = ote_calloc(1, sizeof(*g));
    if (g == NULL) return OTE_ERR_NOMEM;
    uint64_t wire_id = OTE__RDMA_GRANT_WIRE(ga->nic, grant_id);
    g->id = wire_id;
    ote_mutex_lock(&p->mu);
    g->next = p->grants;
    p->grants = g;
    ote_mutex_unlock(&p->mu);
    ote_rp_msg_t rq;
    memset(&rq, 0, sizeof(rq));
    rq.type = OTE_RP_GRANT_REQ;
    rq.u.grant.slot = slot;
    rq.u.grant.op = (uint32_t)op;
    rq.u.grant.src_qpn = remote_qpn;
    rq.u.grant.addr = addr;
    rq.u.grant.len = len;
    rq.u.grant.req_addr = ga->s->req_len != 0 ? ga->s->req_remote : addr;
    rq.u.grant.req_len = ga->s->req_len != 0 ? ga->s->req_len : len;
    rq.u.grant.req_uid = ga->s->req_uid;
    rq.u.grant.pair = ga->pair;
    /* req_qpn: the requester's own QP on that slot, for the source's identity check. */
    ote_endpoint_t *ep = p->ep[ga->nic][op == OTE_GRANT_WRITE ? 1 : 0];
    ote_qp_t *qp = NULL;
    if (ote_endpoint_borrow_ready(ep, slot, remote_qpn, &qp) == OTE_OK) {
        rq.u.grant.req_qpn = ote_qp_num(qp);
        ote_endpoint_return(ep, slot, qp);
    }
    ote_status_t st = ote__rdma_conn_send_rp(p->c, wire_id, OTE_OK, &rq);
    if (st != OTE_OK) {
        ote_mutex_lock(&p->mu);
        (void)ote__rdma_grant_id_take(p, wire_id);
        ote_mutex_unlock(&p->mu);
    }
    return st;
}

/* What a slice's grant status means to the user, request-scope and from the first cause.
 * A flush (CANCELED) that the user did not ask for, and a post refused because the QP was
 * fenced (FENCED) while the context is healthy, are consequences: the QP to the peer
 * broke (the peer died, or its end failed). Both become OTE_ERR_PEER_LOST; FENCED stays
 * only when the context itself is down, and CANCELED only for a canceled request. */
static ote_status_t slice_status(rdma_tp_t *tp, const ote__slice_t *s, ote_status_t st) {
    int code = ote_status_code(st);
    int user = s->canceled != NULL && atomic_load(s->canceled);
    if (code == OTE_ERR_CANCELED && !user) return OTE_ERR_PEER_LOST;
    if (code == OTE_ERR_FENCED) {
        if (user) return OTE_ERR_CANCELED;
        if (ote_context_check(tp->nics[s->xp.rdma.nic].ctx) == OTE_OK) return OTE_ERR_PEER_LOST;
    }
    return st;
}

/* The grant of a slice ended: deregister the slice's temporary MR (s->xp.rdma.mr, set
 * only for an unregistered local buffer), then end the slice. */
static void slice_grant_done(void *arg, ote_status_t st) {
    ote__slice_t *s = arg;
    rdma_tp_t *tp = s->xp.rdma.tp;
    rdma_nic_t *n = &tp->nics[s->xp.rdma.nic];
    struct ibv_mr *mr = s->xp.rdma.mr;
    if (mr != NULL) {
        int err = tp->v->ops->dereg_mr(tp->v, mr);
        if (err != 0) {
            ote_context_retained_add(n->ctx, OTE_RETAINED_MR, 1);
            OTE_WARN("rdma", "dereg of a temporary MR failed: errno %d; retained", err);
        }
    }
    ote_selector_done(tp->sel, (int)n->index, s->len, st == OTE_OK);
    if (st == OTE_OK) atomic_fetch_add(&n->req_bytes, s->len);
    s->done(s, slice_status(tp, s, st));
}

/* A slice that ends before its grant was asked for: tell the source its bytes will never
 * be asked for, so that its account of the request (and the request's pin) can close.
 * Best effort: a lost WRITE_OFF leaves the account to the end of the connection. */
static void slice_write_off(ote__tpeer_t *p, const ote__slice_t *s) {
    if (s->req_uid == 0 || atomic_load(&p->c->dead)) return;
    ote_rp_msg_t wo;
    memset(&wo, 0, sizeof(wo));
    wo.type = OTE_RP_WRITE_OFF;
    wo.u.wo.req_uid = s->req_uid;
    wo.u.wo.req_len = s->req_len;
    wo.u.wo.bytes = s->len;
    (void)ote__rdma_conn_send_rp(p->c, 0, OTE_OK, &wo);
}

/* A notification: one NOTIFY frame; its NOTIFY_ACK, its deadline or the loss of the
 * connection ends the slice, whichever takes the note first. */
static void submit_notify(ote__tpeer_t *p, ote__slice_t *s) {
    note_t *x = ote_calloc(1, sizeof(*x));
    if (x == NULL) {
        s->done(s, OTE_ERR_NOMEM);
        return;
    }
    x->s = s;
    x->deadline = s->deadline;
    uint8_t frame[OTE__RDMA_FRAME_MAX];
    size_t flen = 0;
    ote_mutex_lock(&p->mu);
    if (atomic_load(&p->c->dead)) {
        ote_mutex_unlock(&p->mu);
        ote_free(x);
        s->done(s, OTE_ERR_PEER_LOST);
        return;
    }
    x->req_id = OTE__RDMA_NOTE_TAG | ++p->next_note;
    uint64_t id = x->req_id;
    ote_ctl_msg_t m;
    memset(&m, 0, sizeof(m));
    m.version = p->c->version;
    m.opcode = OTE_CTL_NOTIFY;
    m.req_id = id;
    m.u.notify.msg = s->local;
    m.u.notify.len = s->len;
    /* Encoded before the note is findable: once it is, the monitor may end s. */
    ote_status_t est = ote_ctl_encode(&m, frame, sizeof(frame), &flen);
    if (est != OTE_OK) {
        ote_mutex_unlock(&p->mu);
        ote_free(x);
        s->done(s, est);
        return;
    }
    x->next = p->notes;
    p->notes = x;
    ote_mutex_unlock(&p->mu);
    if (ote__rdma_conn_send_raw(p->c, frame, flen) != OTE_OK) {
        ote_mutex_lock(&p->mu);
        note_t *y = ote__rdma_note_take(p, id);
        ote_mutex_unlock(&p->mu);
        if (y != NULL) { /* else the reader or the monitor already ended it */
            ote_free(y);
            s->done(s, OTE_ERR_PEER_LOST);
        }
    }
}

/* The grant's cancel check: the engine's flag of the slice's request. */
static int slice_canceled(void *arg) {
    const ote__slice_t *s = arg;
    return s->canceled != NULL && atomic_load_explicit(s->canceled, memory_order_relaxed);
}

/* A READ or WRITE slice: the selector picks the data device (the best-ranked active one
 * that would finish it first); on success the grant owns the QP borrow and ends the
 * slice. */
static void submit_data(ote__tpeer_t *p, ote__slice_t *s) {
    rdma_tp_t *tp = p->tp;
    if (atomic_load(&p->c->dead)) {
        s->done(s, OTE_ERR_PEER_LOST);
        return;
    }
    int k = -1;
    ote_status_t st = ote_selector_pick(tp->sel, -1, s->len, ~0u, &k);
    if (st != OTE_OK) { /* every data device is down now */
        slice_write_off(p, s);
        s->done(s, OTE_ERR_PORT_DOWN);
        return;
    }
    rdma_nic_t *n = &tp->nics[k];
    int write = s->op == OTE__SLICE_WRITE;
    ote_endpoint_t *ep = p->ep[k][write ? 1 : 0];
    uint32_t pair = (((uint32_t)k % p->c->ndev) << 8) | (uint32_t)k;
    uint32_t slot = ote_endpoint_pick_slot(ep);
    ote_qp_t *qp = NULL;
    xarg_t xa = {p, write ? OTE_EP_WRITE : OTE_EP_READ, pair};
    ote_deadline_t cdl = ote_deadline_min(
        s->deadline, ote_deadline_after(tp->cfg.connect_timeout_ms * OTE_NSEC_PER_MSEC));
    st = ote_endpoint_borrow(ep, slot, req_exchange, &xa, cdl, &qp);
    if (st != OTE_OK) {
        ote_selector_done(tp->sel, k, s->len, 0);
        slice_write_off(p, s);
        s->done(s, st);
        return;
    }
    struct ibv_mr *mr = NULL, *tmp = NULL;
    if (ote_buffer_manager_find(tp->bm, s->local, s->len, n->ctx, &mr) != OTE_OK) {
        int err = tp->v->ops->reg_mr(tp->v, ote_context_pd(n->ctx), s->local, s->len,
                                     IBV_ACCESS_LOCAL_WRITE, &tmp);
        if (err != 0) {
            ote_endpoint_return(ep, slot, qp);
            ote_selector_done(tp->sel, k, s->len, 0);
            OTE_WARN("rdma", "temporary MR for an unregistered local buffer failed: errno %d", err);
            slice_write_off(p, s);
            s->done(s, ote_status_make(OTE_ERR_NATIVE, err));
            return;
        }
        mr = tmp;
    }
    /* Scratch for slice_grant_done: the temporary MR (NULL when registered), tp, device. */
    s->xp.rdma.mr = tmp;
    s->xp.rdma.tp = tp;
    s->xp.rdma.nic = (uint32_t)k;
    ote_grant_desc_t d;
    memset(&d, 0, sizeof(d));
    d.op = write ? OTE_GRANT_WRITE : OTE_GRANT_READ;
    d.local = s->local;
    d.lkey = mr->lkey;
    d.remote = s->remote;
    d.len = s->len;
    d.ep = ep;
    d.slot = slot;
    d.qp = qp;
    d.deadline = s->deadline;
    d.done = slice_grant_done;
    d.done_arg = s;
    d.canceled = slice_canceled;
    garg_t ga = {p, s, (uint32_t)k, pair};
    ote_grant_ctl_t ctl = {.arg = &ga, .request = grant_request};
    /* Ownership: on OTE_OK the grant owns the QP borrow and ends the slice. */
    st = ote_grant_start(n->gm, &d, &ctl);
    if (st != OTE_OK) {
        ote_endpoint_return(ep, slot, qp);
        s->xp.rdma.mr = NULL;
        if (tmp != NULL && tp->v->ops->dereg_mr(tp->v, tmp) != 0)
            ote_context_retained_add(n->ctx, OTE_RETAINED_MR, 1);
        ote_selector_done(tp->sel, k, s->len, 0);
        slice_write_off(p, s);
        s->done(s, st);
    }
}

static void submit_one(ote__tpeer_t *p, ote__slice_t *s) {
    if (s->canceled != NULL && atomic_load(s->canceled)) {
        if (s->op != OTE__SLICE_NOTIFY) slice_write_off(p, s);
        s->done(s, OTE_ERR_CANCELED);
        return;
    }
    if (s->op == OTE__SLICE_NOTIFY) submit_notify(p, s);
    else submit_data(p, s);
}

void ote__rdma_submit(ote__tpeer_t *p, ote__slice_t *list) {
    while (list != NULL) {
        ote__slice_t *s = list;
        list = s->next;
        s->next = NULL;
        submit_one(p, s);
    }
}

void ote__rdma_cancel(ote__tpeer_t *p) {
    (void)p; /* nothing is queued in this transport: slices go straight to grants */
}

uint32_t ote__rdma_peer_max_slice(ote__tpeer_t *p) {
    (void)p;
    return 64u << 20;
}

/*
 * engine/rdma/rdma_requester.c - the requester data path of the RDMA transport: a run of
 * engine slices (taken from the peer's queue by the pump, rdma_pump.c) becomes a grant.
 * Pick the least-loaded slot of the (peer, capability) endpoint, borrow its READY QP, find
 * the local MR (or register a temporary one), and start a grant whose GRANT_REQ this file
 * sends; the grant layer posts the data and ends the slice. A run that finds no READY QP
 * is never started by waiting for one: it goes back to the queue, and the pump thread
 * builds the QP (CONNECT round trip, build_qp here) and then starts it. A notification is
 * one NOTIFY frame whose NOTIFY_ACK (or its deadline, or the loss of the connection) ends
 * it. Runs on the submitting threads, the pump thread (and the monitor for deadlines);
 * touches the peer's notes and grant ids under p->mu and the slice's transport scratch.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "base/alloc.h"
#include "base/fault.h"
#include "base/log.h"
#include "engine/rdma/rdma_credits.h"
#include "engine/rdma/rdma_internal.h"

note_t *ote__rdma_note_take(ote__tpeer_t *p, uint64_t req_id) {
    note_t **pp = &p->waits.notes;
    while (*pp != NULL && (*pp)->req_id != req_id) pp = &(*pp)->next;
    note_t *x = *pp;
    if (x != NULL) *pp = x->next;
    return x;
}

gid_ent_t *ote__rdma_grant_id_take_ent(ote__tpeer_t *p, uint64_t id) {
    gid_ent_t **pp = &p->waits.grants;
    while (*pp != NULL && (*pp)->id != id) pp = &(*pp)->next;
    gid_ent_t *x = *pp;
    if (x != NULL) *pp = x->next;
    return x;
}

int ote__rdma_grant_id_take(ote__tpeer_t *p, uint64_t id) {
    gid_ent_t *x = ote__rdma_grant_id_take_ent(p, id);
    ote_free(x);
    return x != NULL;
}

void ote__rdma_send_release(conn_t *c, uint32_t pair, uint32_t cap, uint32_t slot, uint32_t src_qpn,
                            uint32_t rkey) {
    if (c == NULL || !c->release_ok || atomic_load(&c->dead)) return;
    ote_status_t fst;
    /* rdma.release_lost: the RELEASE never reaches the source (tests: the source must not
     * depend on it to rebuild the slot). */
    if (ote_fault_hit("rdma.release_lost", &fst)) return;
    ote_rp_msg_t rl;
    memset(&rl, 0, sizeof(rl));
    rl.type = OTE_RP_RELEASE;
    rl.u.rel.pair = pair;
    rl.u.rel.cap = cap;
    rl.u.rel.slot = slot;
    rl.u.rel.src_qpn = src_qpn;
    rl.u.rel.rkey = rkey;
    if (ote__rdma_conn_send_rp(c, 0, OTE_OK, &rl) == OTE_OK) {
        atomic_fetch_add(&c->tp->rel_sent, 1);
        OTE_DEBUG("rdma", "RELEASE of window 0x%x (slot %u, QP %u) sent to %s", rkey, slot, src_qpn,
                  c->peer_addr);
    }
}

void ote__rdma_notes_end(note_t *list, ote_status_t st) {
    while (list != NULL) {
        note_t *x = list;
        list = x->next;
        x->s->done(x->s, st);
        ote_free(x);
    }
}

/* Fail notifications whose NOTIFY_ACK did not come by their deadline (and, through
 * queue_expire, slices queued behind a QP build). */
int ote__rdma_notes_expire(rdma_tp_t *tp) {
    ote__rdma_queue_expire(tp);
    ote__rdma_commits_expire(tp);
    uint64_t now = ote_now_ns();
    note_t *expired = NULL;
    int pending = 0;
    ote_mutex_lock(&tp->mu);
    for (ote__tpeer_t *p = tp->peers; p != NULL; p = p->tp_next) {
        ote_mutex_lock(&p->mu);
        for (note_t **pp = &p->waits.notes; *pp != NULL;) {
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
        pending |= p->waits.notes != NULL || p->waits.commits != NULL || p->queue.head != NULL;
        ote_mutex_unlock(&p->mu);
    }
    ote_mutex_unlock(&tp->mu);
    ote__rdma_notes_end(expired, OTE_ERR_TIMEOUT);
    return pending;
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
    const conn_t *c = x->p->conn.c; /* set while connected; builds run only then */
    if (c != NULL && c->cepoch_ok && c->epoch != 0) {
        rq.u.connect.epoch = c->epoch; /* the source's, from its INFO_ACK */
        rq.u.connect.req_epoch = x->p->tp->epoch;
    }
    return ote__rdma_peer_call(x->p, &rq, OTE_RP_CONNECT_ACK, deadline, peer_out);
}

/* The grant's control callback argument: the peer and the slice (for its request's
 * extent). ote_grant_start() calls request() before it returns, so it lives on the stack. */
typedef struct {
    ote__tpeer_t *p;
    ote__slice_t *s;    /* the run (its first slice) */
    uint32_t nic, pair; /* our device; (the peer's device << 8) | ours */
    uint32_t epi;       /* the endpoint's index: the peer's device, the capability */
} garg_t;

static ote_status_t grant_request(void *arg, uint64_t grant_id, uint32_t slot, uint32_t remote_qpn,
                                  ote_grant_op_t op, uint64_t addr, uint64_t len) {
    const garg_t *ga = arg;
    ote__tpeer_t *p = ga->p;
    gid_ent_t *g = ote_calloc(1, sizeof(*g));
    if (g == NULL) return OTE_ERR_NOMEM;
    uint64_t wire_id = OTE__RDMA_GRANT_WIRE(ga->nic, grant_id);
    g->id = wire_id;
    g->pair = ga->pair;
    g->cap = OTE__RDMA_EPI_CAP(ga->epi); /* a RELEASE names the endpoint, direct ones too */
    g->slot = slot;
    g->src_qpn = remote_qpn;
    g->s = ga->s;
    g->deadline = ga->s->deadline;
    g->req_uid = ga->s->req_uid;
    g->req_remote = ga->s->req_len != 0 ? ga->s->req_remote : addr;
    g->req_len = ga->s->req_len != 0 ? ga->s->req_len : len;
    ote_mutex_lock(&p->mu);
    g->next = p->waits.grants;
    p->waits.grants = g;
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
    rq.u.grant.epoch = p->conn.c->epoch; /* 0 for a peer without epochs: not sent */
    /* A source that serves READs of its device memory staged (rdma_stage=1): say that we
     * take a staged answer (sent only with an epoch, proto.h). */
    if (p->conn.c->stage_ok && p->conn.c->epoch != 0) rq.u.grant.flags = OTE_RP_GF_STAGE;
    /* A source that says where its registrations are best served (rdma_pair=1): we take
     * the pair form of its answer (rdma_pairing.c; with an epoch only, proto.h). */
    if (p->conn.c->pair_ok && p->conn.c->epoch != 0) rq.u.grant.flags |= OTE_RP_GF_PAIR;
    /* To a source that reserves whole parents (rdma_parent=1): the run's parent and its
     * budget (with an epoch only, proto.h; rdma_src_parents.c). */
    if (p->conn.c->parent_ok && p->conn.c->epoch != 0 &&
        !ote__rdma_parent_wire(ga->s, &rq.u.grant.parent, &rq.u.grant.budget))
        rq.u.grant.parent = 0;
    /* To a source with GPUDirect grants: we follow a redirect; this one is on a direct
     * slot (proto.h, rdma_direct.c). */
    if (p->conn.c->direct_ok)
        rq.u.grant.dflags =
            OTE_RP_GOP_DIRECT_OK | (OTE__RDMA_EPI_CAP(ga->epi) >= 2 ? OTE_RP_GOP_DIRECT : 0);
    /* req_qpn: the requester's own QP on that slot, for the source's identity check. */
    ote_endpoint_t *ep = p->conn.ep[ga->nic][ga->epi];
    ote_qp_t *qp = NULL;
    if (ote_endpoint_borrow_ready(ep, slot, remote_qpn, &qp) == OTE_OK) {
        rq.u.grant.req_qpn = ote_qp_num(qp);
        ote_endpoint_return(ep, slot, qp);
    }
    ote_status_t st = ote__rdma_conn_send_rp(p->conn.c, wire_id, OTE_OK, &rq);
    if (st == OTE_OK) atomic_fetch_add(&p->tp->nics[ga->nic].grant_reqs, 1);
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
    /* A second cache miss (or one that could not be retried): the peer no longer knows
     * this connection. */
    if (st == OTE__RDMA_CACHE_MISS) return OTE_ERR_PEER_LOST;
    /* Refused AGAIN by a busy source until the run's deadline or cancel. */
    if (st == OTE__RDMA_SRC_BUSY) return user ? OTE_ERR_CANCELED : OTE_ERR_TIMEOUT;
    if (code == OTE_ERR_FENCED) {
        if (user) return OTE_ERR_CANCELED;
        /* FENCED with an errno: this engine's own device fenced the QP natively (its CQ
         * lane failed, its route changed: ote_qp_fence; or a post of unknown outcome):
         * device-scope, kept. Without one, a fenced QP on a healthy context broke at the
         * peer's end. */
        if (ote_status_errno(st) == 0 &&
            ote_context_check(tp->nics[ote__rdma_cxp(s)->nic].ctx) == OTE_OK)
            return OTE_ERR_PEER_LOST;
    }
    return st;
}

/* Transport-made request ids of retried slices (the engine's are small counters). */
static _Atomic uint64_t g_retry_uid;

/* A run whose GRANT_REQ met a cache miss (rdma_internal.h) goes back to the queue once:
 * the source refused the grant before binding anything and the grant posted nothing (it
 * posts only after a GRANT_RESP OK), so a WRITE is as safe to retry as a READ. Not
 * canceled, before its deadline, and not if any of its slices was retried already. */
static int miss_may_retry(const ote__slice_t *s, ote_status_t st) {
    if (st != OTE__RDMA_CACHE_MISS || ote_deadline_expired(s->deadline)) return 0;
    if (s->canceled != NULL && atomic_load(s->canceled)) return 0;
    for (const ote__slice_t *x = s; x != NULL; x = x->next)
        if (ote__rdma_cxp(x)->retries > 0) return 0;
    return 1;
}

/* A READ slice whose device went down under it may run again on another device: READ
 * only (it writes nothing at the source, and its local bytes are written again), never a
 * WRITE (an ambiguous WRITE is not replayed), not canceled, once, before its deadline,
 * and only while another device is active. */
static int read_may_move(const rdma_tp_t *tp, const ote__slice_t *s, const rdma_nic_t *n,
                         ote_status_t st) {
    if (st == OTE_OK || s->op != OTE__SLICE_READ || ote__rdma_cxp(s)->retries > 0) return 0;
    if (s->canceled != NULL && atomic_load(s->canceled)) return 0;
    if (ote_context_check(n->ctx) == OTE_OK || ote_deadline_expired(s->deadline)) return 0;
    return ote__rdma_other_active(tp, n->index);
}

/* The grant of a slice ended: deregister the slice's temporary MR (ote__rdma_xp(s)->mr, set
 * only for an unregistered local buffer), give its device's window back, kick the pump
 * thread when the peer's queue holds slices, then end the slice (or queue it again:
 * read_may_move). Nothing here touches p after done(): the peer may then be closed. */
static uint64_t run_bytes(const ote__slice_t *s) {
    uint64_t n = 0;
    for (; s != NULL; s = s->next) n += s->len;
    return n;
}

/* End every slice of the run s (linked by next) with st, each with its own meaning of
 * it; next is read before done(), which hands the slice back to the engine. */
static void run_end(rdma_tp_t *tp, ote__slice_t *s, ote_status_t st) {
    while (s != NULL) {
        ote__slice_t *nx = s->next;
        s->next = NULL;
        ote_status_t mine = tp != NULL ? slice_status(tp, s, st) : st;
        ote__rdma_parent_slice_end(s); /* its request's grant credits, with its last slice */
        s->done(s, mine);
        s = nx;
    }
}

/* Put the run s..(its last) back at the head of p's queue, in order. Under p->mu. */
void ote__rdma_run_requeue(ote__tpeer_t *p, ote__slice_t *s) {
    ote__slice_t *last = s;
    while (last->next != NULL) last = last->next;
    last->next = p->queue.head;
    if (p->queue.head == NULL) p->queue.tail = last;
    p->queue.head = s;
}

/* A run's temporary MR goes. One that will not deregister is the buffer manager's
 * orphan (counted, retried by the monitor's reclaim); the memory is the caller's, which
 * the engine cannot keep: the NIC keeps its pages pinned, and no work is posted on the
 * MR again. */
static void tmp_mr_drop(rdma_tp_t *tp, rdma_nic_t *n, struct ibv_mr *mr) {
    ote_status_t st = ote_buffer_mr_drop(tp->bm, n->ctx, mr, NULL, NULL, NULL);
    if (st != OTE_OK)
        OTE_WARN("rdma", "%s: dereg of a temporary MR failed (%s): retained",
                 ote_context_name(n->ctx), ote_status_str(st));
}

static void slice_grant_done(void *arg, ote_status_t st) {
    ote__slice_t *s = arg; /* the run's first slice; the others follow by next */
    /* A staged WRITE ends with the source's COMMIT (rdma_commit.c). */
    if (ote__rdma_commit_park(ote__rdma_xp(s)->peer, s, &st)) return;
    ote__rdma_run_finish(s, st);
}

void ote__rdma_run_finish(ote__slice_t *s, ote_status_t st) {
    rdma_tp_t *tp = ote__rdma_xp(s)->tp;
    ote__tpeer_t *p = ote__rdma_xp(s)->peer;
    rdma_nic_t *n = &tp->nics[ote__rdma_xp(s)->nic];
    struct ibv_mr *mr = ote__rdma_xp(s)->mr;
    ote__rdma_xp(s)->mr = NULL;
    if (ote__rdma_xp(s)->conn != NULL) ote__rdma_conn_put(ote__rdma_xp(s)->conn);
    ote__rdma_xp(s)->conn = NULL;
    if (mr != NULL) tmp_mr_drop(tp, n, mr);
    uint64_t rlen = run_bytes(s);
    ote_selector_done(tp->sel, (int)n->index, rlen, st == OTE_OK);
    if (st == OTE_OK) atomic_fetch_add(&n->req_bytes, rlen);
    /* Its grant drained: its credit returns (no lock held here). */
    if (ote__rdma_grant_put(tp, s)) ote__rdma_pump_kick(tp);
    int again = read_may_move(tp, s, n, st);
    int busy = 0;
    if (!again && ote__rdma_busy_may_retry(tp, s, st)) {
        /* Nothing was bound at the source (no receive slot for its receipt, or too many
         * requests open there): asked again, as a request of its own, after a pause. */
        OTE_DEBUG("rdma", "%s run of %llu bytes: the source is busy (AGAIN): asked again",
                  s->op == OTE__SLICE_WRITE ? "WRITE" : "READ", (unsigned long long)rlen);
        ote__rdma_slice_renew(s);
        again = busy = 1;
    } else if (!again && st == OTE__RDMA_DIRECT_REDIRECT && !ote__rdma_xp(s)->direct &&
               !(s->canceled != NULL && atomic_load(s->canceled)) &&
               !ote_deadline_expired(s->deadline)) {
        /* Device memory at the source, served on a direct slot (rdma_direct.c): nothing
         * was posted, so the run goes again there, as a request of its own. */
        for (ote__slice_t *x = s; x != NULL; x = x->next) ote__rdma_xp(x)->direct = 1;
        ote__rdma_direct_remember(p, s); /* its later runs, and its range, go there first */
        ote__rdma_slice_renew(s);
        atomic_fetch_add(&tp->direct_followed, 1);
        again = 1;
    } else if (!again && st == OTE__RDMA_DIRECT_REDIRECT && !ote__rdma_xp(s)->plain &&
               !(s->canceled != NULL && atomic_load(s->canceled)) &&
               !ote_deadline_expired(s->deadline)) {
        /* Asked on a direct slot first (rdma_direct.c: an rdma_grant_mr=1 source, or a
         * range redirected before) for memory the source serves on plain slots (staged,
         * or by a window): sent back there, once; the range is no longer direct. */
        for (ote__slice_t *x = s; x != NULL; x = x->next) {
            ote__rdma_xp(x)->direct = 0;
            ote__rdma_xp(x)->plain = 1;
        }
        ote__rdma_direct_forget(p, s);
        ote__rdma_slice_renew(s);
        again = 1;
    } else if (!again && miss_may_retry(s, st)) {
        /* The grant layer retired the slot's QP: the next pick rebuilds it (CONNECT). */
        OTE_WARN_LIMITED("rdma",
                         "%s run of %llu bytes: the source had no such connection (cache "
                         "miss): rebuilt and retried once",
                         s->op == OTE__SLICE_WRITE ? "WRITE" : "READ", (unsigned long long)rlen);
        for (ote__slice_t *x = s; x != NULL; x = x->next) ote__rdma_xp(x)->retries++;
        ote__rdma_slice_renew(s);
        again = 1;
    } else if (again) {
        /* Its own request to the source now: the request's account there already counted
         * these bytes (the lost grant held and released them). */
        OTE_WARN_LIMITED("rdma",
                         "READ run of %llu bytes lost with device %s (%s): moved to another device",
                         (unsigned long long)rlen, ote_context_name(n->ctx), ote_status_str(st));
        for (ote__slice_t *x = s; x != NULL; x = x->next) ote__rdma_xp(x)->retries++;
        ote__rdma_slice_renew(s);
    }
    ote_mutex_lock(&p->mu);
    p->queue.inflight[n->index] -= rlen;
    /* The endpoint the run used (plain or direct): its idle QPs are the unknown ones. */
    if (st == OTE__RDMA_CACHE_MISS) ote__rdma_build_flush_ask(p, n->index, ote__rdma_run_epi(s));
    if (busy) p->pump.busy_until = ote_now_ns() + OTE__RDMA_BUSY_PAUSE_NS;
    if (again) ote__rdma_run_requeue(p, s);
    int queued = p->queue.head != NULL;
    ote_mutex_unlock(&p->mu);
    int waiters = ote__rdma_all_sub(tp, rlen);
    /* Never pump here: this may run under a CQ lane's poll lock, and starting a slice may
     * take another lane's. The pump thread starts what waits. */
    if (queued || waiters || atomic_load(&p->pump.purge)) ote__rdma_pump_kick(tp);
    if (!again) run_end(tp, s, st);
}

/* The grant of the run s failed after the source answered it (desc.abandoned): every WR
 * it posted has ended, so the source may release its window now rather than at its own
 * deadline. Sent on the connection the grant was asked on (the run holds a reference). */
static void slice_grant_abandoned(void *arg, uint32_t slot, uint32_t remote_qpn, uint32_t rkey) {
    ote__slice_t *s = arg;
    conn_t *c = ote__rdma_xp(s)->conn;
    if (c == NULL || c->ndev == 0) return;
    uint32_t k = ote__rdma_xp(s)->nic;
    uint32_t pair = (ote__rdma_xp(s)->rdev << 8) | k;
    ote__rdma_send_release(c, pair, ote__rdma_run_cap(s), slot, remote_qpn, rkey);
}

/* A slice that ends before its grant was asked for: tell the source its bytes will never
 * be asked for, so that its account of the request (and the request's pin) can close.
 * Best effort: a lost WRITE_OFF leaves the account to the end of the connection. */
void ote__rdma_slice_write_off(ote__tpeer_t *p, const ote__slice_t *s) {
    if (s->req_uid == 0 || p->conn.c == NULL || atomic_load(&p->conn.c->dead)) return;
    uint64_t bytes = run_bytes(s); /* a run's slices share their request */
    ote_rp_msg_t wo;
    memset(&wo, 0, sizeof(wo));
    wo.type = OTE_RP_WRITE_OFF;
    wo.u.wo.req_uid = s->req_uid;
    wo.u.wo.req_len = s->req_len;
    wo.u.wo.bytes = bytes;
    (void)ote__rdma_conn_send_rp(p->conn.c, 0, OTE_OK, &wo);
}

/* A notification: one NOTIFY frame; its NOTIFY_ACK, its deadline or the loss of the
 * connection ends the slice, whichever takes the note first. */
void ote__rdma_submit_notify(ote__tpeer_t *p, ote__slice_t *s) {
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
    /* No connection at all: a reconnect failed (or met a restarted peer). */
    if (p->conn.c == NULL || atomic_load(&p->conn.c->dead)) {
        ote_mutex_unlock(&p->mu);
        ote_free(x);
        s->done(s, OTE_ERR_PEER_LOST);
        return;
    }
    x->req_id = OTE__RDMA_NOTE_TAG | ++p->waits.next_note;
    uint64_t id = x->req_id;
    ote_ctl_msg_t m;
    memset(&m, 0, sizeof(m));
    m.version = p->conn.c->version;
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
    x->next = p->waits.notes;
    p->waits.notes = x;
    ote_mutex_unlock(&p->mu);
    if (ote__rdma_conn_send_raw(p->conn.c, frame, flen) != OTE_OK) {
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

int ote__rdma_other_active(const rdma_tp_t *tp, uint32_t k) {
    for (uint32_t i = 0; i < tp->nnics; i++)
        if (i != k && ote_selector_is_active(tp->sel, (int)i)) return 1;
    return 0;
}

/* The run s (one slice, or contiguous slices of one request linked by next) runs again
 * as a request of its own (a fresh id; its extent the run): the bytes its request's
 * account at the source counted for it stay counted. */
void ote__rdma_slice_renew(ote__slice_t *s) {
    uint64_t uid = (1ull << 63) | atomic_fetch_add(&g_retry_uid, 1);
    uint64_t rlen = run_bytes(s), remote = s->remote;
    for (ote__slice_t *x = s; x != NULL; x = x->next) {
        x->req_uid = uid;
        x->req_remote = remote;
        x->req_len = rlen;
    }
}

/* A READ or WRITE slice that did not start: its window on device k (when k >= 0) goes
 * back; when k's port is down (nothing was posted, so any op may move) and another device
 * is active it goes back to the head of the queue, to be picked again by the pump that
 * called start_on; else the source is told its bytes will never be asked for, and it
 * ends with st. */
void ote__rdma_start_failed(ote__tpeer_t *p, ote__slice_t *s, int k, ote_status_t st) {
    rdma_tp_t *tp = p->tp;
    if (k >= 0) {
        rdma_nic_t *n = &tp->nics[k];
        uint64_t rlen = run_bytes(s);
        if (ote__rdma_grant_put(tp, s)) ote__rdma_pump_kick(tp); /* never started */
        ote_selector_done(tp->sel, k, rlen, 0);
        int move = ote_context_check(n->ctx) != OTE_OK && ote__rdma_other_active(tp, (uint32_t)k) &&
                   !(s->canceled != NULL && atomic_load(s->canceled)) &&
                   !ote_deadline_expired(s->deadline);
        /* The CONNECT of the QP this run waited for met a cache miss (rdma_internal.h):
         * the failed build left the slot empty and the run never started, so it goes back
         * to the queue once and the next pick rebuilds the QP. */
        int miss = !move && miss_may_retry(s, st);
        /* The source refused the CONNECT AGAIN (its rdma_max_qps): nothing was built or
         * asked; the run waits queued and asks again after a pause, until its deadline. */
        int busy = !move && !miss && ote__rdma_busy_may_retry(tp, s, st);
        if (miss) {
            OTE_WARN_LIMITED("rdma",
                             "%s run of %llu bytes: the source refused the QP's CONNECT (cache "
                             "miss): rebuilt and retried once",
                             s->op == OTE__SLICE_WRITE ? "WRITE" : "READ",
                             (unsigned long long)rlen);
            for (ote__slice_t *x = s; x != NULL; x = x->next) ote__rdma_xp(x)->retries++;
        }
        if (move || miss) {
            if (move) (void)ote_selector_set_active(tp->sel, k, 0); /* the monitor confirms it */
            ote__rdma_slice_write_off(p, s);
            ote__rdma_slice_renew(s);
        }
        move |= miss | busy;
        ote_mutex_lock(&p->mu);
        p->queue.inflight[k] -= rlen;
        if (busy) p->pump.busy_until = ote_now_ns() + OTE__RDMA_QP_BUSY_PAUSE_NS;
        if (busy) ote__rdma_build_src_refused(p);
        if (move) ote__rdma_run_requeue(p, s);
        ote_mutex_unlock(&p->mu);
        if (ote__rdma_all_sub(tp, rlen)) ote__rdma_pump_kick(tp);
        if (move) return;
    }
    if (st == OTE__RDMA_SRC_BUSY)
        OTE_WARN_LIMITED("rdma",
                         "%s run: the source refused its QP until the run's deadline or cancel "
                         "(the source holds its rdma_max_qps QPs, none idle)",
                         s->op == OTE__SLICE_WRITE ? "WRITE" : "READ");
    ote__rdma_slice_write_off(p, s);
    run_end(
        NULL, s,
        st == OTE__RDMA_CACHE_MISS ? OTE_ERR_PEER_LOST
        : st == OTE__RDMA_SRC_BUSY
            ? (s->canceled != NULL && atomic_load(s->canceled) ? OTE_ERR_CANCELED : OTE_ERR_TIMEOUT)
            : st);
}

/* A READY QP of ep without waiting: the picked slot's; else, for a submitting thread
 * (inline_), any other READY slot's, the picked one then built in the background
 * (*want_bg, *want_out). OTE_ERR_NOT_FOUND otherwise (*want_out: the slot to build
 * before the run starts; the pump thread so builds every slot it picks, as before). */
static ote_status_t borrow_now(ote_endpoint_t *ep, int inline_, uint32_t *slot_out,
                               ote_qp_t **qp_out, uint32_t *want_out, int *want_bg) {
    uint32_t pick = ote_endpoint_pick_slot(ep), w = ote_endpoint_width(ep);
    *want_bg = 0;
    *want_out = pick;
    if (ote_endpoint_borrow_ready(ep, pick, 0, qp_out) == OTE_OK) {
        *slot_out = pick;
        return OTE_OK;
    }
    for (uint32_t i = 1; inline_ && i < w; i++) {
        uint32_t j = (pick + i) % w;
        if (ote_endpoint_borrow_ready(ep, j, 0, qp_out) == OTE_OK) {
            *slot_out = j;
            *want_bg = 1;
            return OTE_OK;
        }
    }
    return OTE_ERR_NOT_FOUND;
}

/* After a cache miss on ep, its other idle QPs are as unknown to the source (it evicted or
 * moved the endpoint): retired too, so that the run retried after the miss meets a fresh
 * QP rather than a second miss. */
static void retire_idle(ote_endpoint_t *ep) {
    for (uint32_t j = 0; j < ote_endpoint_width(ep); j++) {
        ote_qp_t *qp = NULL;
        if (ote_endpoint_borrow_ready(ep, j, 0, &qp) != OTE_OK) continue;
        ote_endpoint_retire(ep, j, qp);
        ote_endpoint_return(ep, j, qp);
    }
}

/* A live READY QP of ep for the run s on device k, borrowed into *slot_out / *qp_out:
 * OTE__RDMA_START_TAKEN with *qp_out set. A QP that a port-down fenced while idle, or one
 * built on a route that changed since, is still READY in its slot: retired (the monitor's reclaim destroys it) and another slot taken,
 * built anew when empty. None READY: the build is asked of the pump thread and
 * OTE__RDMA_START_NEEDS_BUILD returned (the device's pick given back); every slot fenced:
 * the run ended FENCED (OTE__RDMA_START_TAKEN, *qp_out NULL). */
static int borrow_live(ote__tpeer_t *p, ote__slice_t *s, uint64_t rlen, int k, uint32_t epi,
                       ote_endpoint_t *ep, int inline_, uint32_t *slot_out, ote_qp_t **qp_out) {
    rdma_tp_t *tp = p->tp;
    ote_qp_t *qp = NULL;
    uint32_t slot = 0;
    for (uint32_t tries = 0;; tries++) {
        uint32_t want = 0;
        int bg = 0;
        /* At rdma_max_qps any READY slot serves (no build while another one is READY). */
        ote_status_t st = borrow_now(ep, inline_ || ote__rdma_qps_full(tp), &slot, &qp, &want, &bg);
        if (st != OTE_OK || bg) {
            ote_mutex_lock(&p->mu);
            ote__rdma_build_ask(p, (uint32_t)k, epi, want, st != OTE_OK);
            ote_mutex_unlock(&p->mu);
            if (st != OTE_OK) {
                ote_selector_done(tp->sel, k, rlen, 0);
                return OTE__RDMA_START_NEEDS_BUILD;
            }
            ote__rdma_pump_kick(tp); /* the background build */
        }
        ote_qp_stats_t qs;
        ote_qp_get_stats(qp, &qs);
        /* A QP of a route that changed is as broken (the monitor fences it soon): a run
         * started on it now would end FENCED; it goes to a QP of the new route. */
        int stale = ote_qp_route_generation(qp) < ote_context_route_generation(tp->nics[k].ctx);
        if (!qs.fenced && qs.state != IBV_QPS_ERR && !stale) break;
        ote_endpoint_retire(ep, slot, qp);
        ote_endpoint_return(ep, slot, qp);
        qp = NULL;
        if (tries >= ote_endpoint_width(ep)) {
            ote__rdma_start_failed(p, s, k, OTE_ERR_FENCED);
            *qp_out = NULL;
            return OTE__RDMA_START_TAKEN;
        }
    }
    *slot_out = slot;
    *qp_out = qp;
    return OTE__RDMA_START_TAKEN;
}

/* The MR of the run's local buffer in device n: its registration's, else a temporary one
 * (*tmp_out, deregistered when the run ends). A READ writes its local buffer: its
 * temporary MR needs LOCAL_WRITE (a read-only mapping fails: EFAULT); a WRITE only reads
 * it, so its temporary MR asks for nothing and a read-only mapping works. (Registered
 * memory is always writable.) */
static ote_status_t local_mr(rdma_tp_t *tp, rdma_nic_t *n, const ote__slice_t *s, uint64_t rlen,
                             struct ibv_mr **mr_out, struct ibv_mr **tmp_out) {
    int write = s->op == OTE__SLICE_WRITE;
    *tmp_out = NULL;
    if (ote_buffer_manager_find(tp->bm, s->local, rlen, n->ctx, mr_out) == OTE_OK) return OTE_OK;
    int lacc = write ? 0 : IBV_ACCESS_LOCAL_WRITE;
    ote_status_t st = ote_buffer_mr_reg(tp->bm, n->ctx, s->local, rlen, lacc, NULL, tmp_out);
    if (st == OTE_OK) {
        *mr_out = *tmp_out;
        return OTE_OK;
    }
    *tmp_out = NULL;
    int err = ote_status_errno(st);
    OTE_WARN("rdma", "temporary MR of the local buffer [%p, +%llu) of a %s failed: %s%s",
             (void *)s->local, (unsigned long long)rlen, write ? "WRITE" : "READ", strerror(err),
             err == EFAULT ? " (not mapped, or not writable for a READ)" : "");
    return ote_status_make(err == EFAULT ? OTE_ERR_INVALID : OTE_ERR_NATIVE, err);
}

/* The run s as one grant on device k over (ep, slot, qp) with local MR mr (tmp: its
 * temporary one): the slices' scratch for slice_grant_done, a reference on the connection
 * its grant is asked on (for a RELEASE: the grant may end before ote_grant_start returns,
 * so taken first), then the grant. On OTE_OK the grant owns the QP borrow and ends the
 * slices; otherwise everything is given back and the run ended with the status. */
static void grant_run(ote__tpeer_t *p, ote__slice_t *s, uint64_t rlen, int k, uint32_t epi,
                      ote_endpoint_t *ep, uint32_t slot, ote_qp_t *qp, struct ibv_mr *mr,
                      struct ibv_mr *tmp) {
    rdma_tp_t *tp = p->tp;
    rdma_nic_t *n = &tp->nics[k];
    for (ote__slice_t *x = s; x != NULL; x = x->next) {
        ote__rdma_xp(x)->mr = NULL;
        ote__rdma_xp(x)->tp = tp;
        ote__rdma_xp(x)->nic = (uint32_t)k;
        ote__rdma_xp(x)->peer = p;
        ote__rdma_xp(x)->conn = NULL;
        ote__rdma_xp(x)->rdev = OTE__RDMA_EPI_DEV(epi);
    }
    ote__rdma_xp(s)->mr = tmp; /* the run's first slice holds its temporary MR */
    ote__rdma_conn_get(p->conn.c);
    ote__rdma_xp(s)->conn = p->conn.c;
    ote_grant_desc_t d;
    memset(&d, 0, sizeof(d));
    d.op = s->op == OTE__SLICE_WRITE ? OTE_GRANT_WRITE : OTE_GRANT_READ;
    d.local = s->local;
    d.lkey = mr->lkey;
    d.remote = s->remote;
    d.len = rlen;
    d.ep = ep;
    d.slot = slot;
    d.qp = qp;
    d.deadline = s->deadline;
    d.done = slice_grant_done;
    d.done_arg = s;
    d.canceled = slice_canceled;
    d.abandoned = slice_grant_abandoned;
    d.receipt_imm = OTE__RDMA_EPI_CAP(epi) >= 2; /* an exact MR at the source: no window */
    uint32_t pair = (OTE__RDMA_EPI_DEV(epi) << 8) | (uint32_t)k;
    garg_t ga = {p, s, (uint32_t)k, pair, epi};
    ote_grant_ctl_t ctl = {.arg = &ga, .request = grant_request};
    ote_status_t st = ote_grant_start(n->gm, &d, &ctl);
    if (st == OTE_OK) return;
    ote_endpoint_return(ep, slot, qp);
    ote__rdma_xp(s)->mr = NULL;
    ote__rdma_conn_put(ote__rdma_xp(s)->conn);
    ote__rdma_xp(s)->conn = NULL;
    if (tmp != NULL) tmp_mr_drop(tp, n, tmp);
    ote__rdma_start_failed(p, s, k, st);
}

/* Start a run of READ or WRITE slices (s and those linked by next: contiguous, one
 * request) on device k (picked by pump, its window taken) as one grant: on success the
 * grant owns the QP borrow and ends the run's slices. Never waits for a QP: when the
 * endpoint has none READY, returns OTE__RDMA_START_NEEDS_BUILD with the build asked of the pump
 * thread. Called by the pump (pumping set), no lock held. */
int ote__rdma_start_on(ote__tpeer_t *p, ote__slice_t *s, int k, int inline_) {
    rdma_tp_t *tp = p->tp;
    /* A run the source redirected goes on a direct endpoint (rdma_direct.c), and so does
     * a later run of a request it redirected. */
    ote__rdma_direct_recall(p, s);
    /* The peer's device by the remote buffer's locality (rdma_pairing.c). */
    uint32_t epi = OTE__RDMA_EPI(ote__rdma_pair_dev(p, s, (uint32_t)k), ote__rdma_run_cap(s));
    ote_endpoint_t *ep = p->conn.ep[k][epi];
    if (ep == NULL) { /* a direct run toward a source that no longer advertises it */
        ote__rdma_start_failed(p, s, k, OTE_ERR_UNSUPPORTED);
        return OTE__RDMA_START_TAKEN;
    }
    /* The build the last run on (k, cap) waited for failed: this run ends with its status
     * (rdma_build.c); else a cache miss on this endpoint asked for its idle QPs to be
     * retired. */
    ote_status_t st = OTE_OK;
    ote_mutex_lock(&p->mu);
    int failed = ote__rdma_build_failure_take(p, (uint32_t)k, epi, &st);
    int flush = failed ? 0 : ote__rdma_build_flush_take(p, (uint32_t)k, epi);
    ote_mutex_unlock(&p->mu);
    if (failed) {
        ote__rdma_start_failed(p, s, k, st);
        return OTE__RDMA_START_TAKEN;
    }
    if (flush) retire_idle(ep);
    uint32_t slot = 0;
    ote_qp_t *qp = NULL;
    uint64_t rlen = run_bytes(s);
    int r = borrow_live(p, s, rlen, k, epi, ep, inline_, &slot, &qp);
    if (r != OTE__RDMA_START_TAKEN || qp == NULL) return r;
    atomic_fetch_add(inline_ ? &tp->starts_inline : &tp->starts_pumped, 1);
    struct ibv_mr *mr = NULL, *tmp = NULL;
    st = local_mr(tp, &tp->nics[k], s, rlen, &mr, &tmp);
    if (st != OTE_OK) {
        ote_endpoint_return(ep, slot, qp);
        ote__rdma_start_failed(p, s, k, st);
        return OTE__RDMA_START_TAKEN;
    }
    grant_run(p, s, rlen, k, epi, ep, slot, qp, mr, tmp);
    return OTE__RDMA_START_TAKEN;
}

/* The pump thread's build of the QP p asked for (p->build: UNDER_WAY), bounded by
 * connect_timeout_ms; the QP is given back READY for the runs that wait. No lock held;
 * the pump thread pumps p. */
ote_status_t ote__rdma_build_qp(ote__tpeer_t *p, uint32_t k, uint32_t epi, uint32_t slot) {
    rdma_tp_t *tp = p->tp;
    ote_endpoint_t *ep = p->conn.ep[k][epi];
    uint32_t cap = OTE__RDMA_EPI_CAP(epi), pair = (OTE__RDMA_EPI_DEV(epi) << 8) | k;
    xarg_t xa = {p, cap, pair}; /* 0 READ, 1 WRITE, 2, 3 direct */
    ote_deadline_t cdl = ote_deadline_after(tp->cfg.connect_timeout_ms * OTE_NSEC_PER_MSEC);
    ote_qp_t *qp = NULL;
    ote_status_t st = ote_endpoint_borrow(ep, slot, req_exchange, &xa, cdl, &qp);
    if (st == OTE_OK) {
        ote_endpoint_return(ep, slot, qp);
        atomic_fetch_add(&tp->qp_builds, 1);
        ote__rdma_qps_note(tp);
    } else if (st == OTE__RDMA_SRC_BUSY) { /* asked again (start_failed) */
        OTE_DEBUG("rdma", "QP to %s not built: the source holds its rdma_max_qps", p->name);
    } else {
        OTE_WARN("rdma", "QP to %s (device %s, %s, slot %u) not built: %s", p->name,
                 ote_context_name(tp->nics[k].ctx), (cap & 1u) ? "WRITE" : "READ", slot,
                 ote_status_str(st));
    }
    return st;
}

/* Start what the peer's queue holds while a device has room in this peer's window (a
 * device with nothing of this peer in flight always takes one slice), each on the device
 * the selector picks among those. A queued slice that is canceled, or whose peer is lost,
 * or that finds no active device while none of this peer's slices is in flight (nothing
 * would pump again), ends without starting. One thread pumps at a time; a caller that
 * finds it busy asks it to go round again. No lock held on entry. */

uint32_t ote__rdma_peer_max_slice(ote__tpeer_t *p) {
    (void)p;
    return 64u << 20;
}

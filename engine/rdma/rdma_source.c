/*
 * engine/rdma/rdma_source.c - the source side of the RDMA transport: what a peer may ask
 * of the memory registered here. CONNECT builds (or returns) the source QP of a slot of
 * the (peer, capability) source endpoint; GRANT_REQ is checked against the engine's
 * registrations (host->pin) and the QP identity of its slot, then served by the grant
 * layer with a window over the exact range; the grant layer answers through src_answer.
 * RELEASE ends a bound grant its requester abandoned (ote__rdma_src_release); the
 * transport's advertisement (ote__rdma_advert) says that this source takes it.
 * Called on server connection threads (rdma_server.c) and, for the grant callbacks, on
 * lane workers and the monitor. Touches only the read-only part of the transport and the
 * connection it answers on.
 */
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "base/fault.h"
#include "base/log.h"
#include "base/time.h"
#include "engine/rdma/rdma_credits.h"
#include "engine/rdma/rdma_internal.h"
#include "engine/rdma/rdma_stage.h"
#include "engine/rdma/rdma_src_parents.h"
#include "ote/ote.h"

/* A GRANT_REQ being served: where its GRANT_RESP goes (a reference on c, dropped once
 * the grant layer has answered through src_answer), and the device and bytes that
 * src_answer counts as served when it grants them. */
typedef struct {
    conn_t *c;
    uint64_t req_id;
    rdma_nic_t *nic;
    uint64_t len;
    uint64_t base;       /* nonzero: a staged grant, its window over the bounce buffer there */
    int write;           /* a staged WRITE: the answer asks for the COMMIT wait */
    rdma_stage_t *stage; /* a staged WRITE's bounce (a reference, rdma_stage.c) */
    uint32_t near;       /* the pair form (rdma_pairing.c): our best devices; 0: not sent */
    uint64_t reg_addr, reg_len;
} answer_t;

/* One ote_grant_serve() call (its `call`, handed to src_pin / src_pin_exact, which run
 * before it returns): the request account of the GRANT_REQ served, and whether a pin
 * took it. */
typedef struct {
    acct_t *a;
    rdma_stage_t *stage; /* a staged grant: its bounce buffer (rdma_stage.c) */
    sp_slot_t sps;       /* its slot of its parent's reservation (rdma_src_parents.c) */
    int pinned;
} serve_call_t;

/* A grant's pin: its bytes of its request's account, a staged grant's bounce and a
 * direct grant's exact MR (never both). */
typedef struct {
    acct_t *a;
    uint64_t len;
    rdma_stage_t *stage;
    struct ibv_mr *mr;  /* rdma_direct.c: deregistered first at unpin */
    ote_context_t *ctx; /* ... the context it lives in */
    sp_slot_t sps;      /* its slot of its parent's reservation, returned at unpin */
} grant_pin_t;

static ote_status_t src_pin(void *arg, void *call, ote_context_t *ctx, uint64_t addr, uint64_t len,
                            int access, struct ibv_mr **mr_out, void **pin_out) {
    rdma_tp_t *tp = arg;
    serve_call_t *sc = call;
    (void)access; /* the account checked the whole request for this access */
    if (sc == NULL || sc->a == NULL) return OTE_ERR_STATE; /* only src_serve serves */
    grant_pin_t *gp = ote_malloc(sizeof(*gp));
    if (gp == NULL) return OTE_ERR_NOMEM;
    struct ibv_mr *mr = NULL;
    ote_status_t st = OTE_OK;
    if (sc->stage != NULL) /* [addr, +len) is exactly the bounce buffer */
        mr = ote__rdma_stage_mr(sc->stage);
    else st = ote_buffer_manager_find(tp->bm, (const void *)(uintptr_t)addr, len, ctx, &mr);
    if (st != OTE_OK) {
        ote_free(gp);
        return st;
    }
    gp->a = sc->a;
    gp->len = len;
    gp->stage = sc->stage;
    gp->mr = NULL;
    gp->ctx = NULL;
    gp->sps = sc->sps; /* the pin owns the parent's slot now */
    sc->sps.sp = NULL;
    ote__rdma_acct_hold(tp, gp->a, len);
    sc->pinned = 1;
    *mr_out = mr;
    *pin_out = gp;
    return OTE_OK;
}

/* A direct grant (ote_grant_serve_exact): an MR of exactly the range in qp's private PD
 * (rdma_direct.c), and the grant's bytes of its account, as src_pin. */
static ote_status_t src_pin_exact(void *arg, void *call, ote_qp_t *qp, uint64_t addr, uint64_t len,
                                  int access, uint32_t *rkey_out, void **pin_out) {
    rdma_tp_t *tp = arg;
    serve_call_t *sc = call;
    acct_t *a = sc != NULL ? sc->a : NULL;
    if (a == NULL || !ote__rdma_acct_direct(tp, a)) return OTE_ERR_STATE;
    grant_pin_t *gp = ote_malloc(sizeof(*gp));
    if (gp == NULL) return OTE_ERR_NOMEM;
    struct ibv_mr *mr = NULL;
    ote_status_t st = ote__rdma_direct_mr(tp, qp, addr, len, access, &mr);
    if (st != OTE_OK) {
        ote_free(gp);
        return st;
    }
    gp->a = a;
    gp->len = len;
    gp->stage = NULL;
    gp->mr = mr;
    gp->ctx = ote_qp_context(qp);
    gp->sps = sc->sps;
    sc->sps.sp = NULL;
    ote__rdma_acct_hold(tp, a, len);
    sc->pinned = 1;
    *rkey_out = mr->rkey;
    *pin_out = gp;
    return OTE_OK;
}

/* The grant's bytes of its account (whose pin keeps the range registered) given back. */
static void src_unpin_settle(rdma_tp_t *tp, void *pin) {
    grant_pin_t *gp = pin;
    ote__rdma_acct_settle(tp, gp->a, 0, gp->len);
    ote_free(gp);
}

static void src_unpin(void *arg, void *pin) {
    rdma_tp_t *tp = arg;
    grant_pin_t *gp = pin;
    /* The exact MR goes before the pin: no byte is reachable once the range may move. */
    if (gp->mr != NULL) ote__rdma_direct_mr_drop(tp, gp->ctx, gp->mr);
    sp_slot_t sps = gp->sps; /* gp may be gone once the stage ended */
    /* The grant's window is dead by now (invalidated by its receipt, or deallocated). A
     * staged WRITE whose copy back into the range started keeps its bytes of the account
     * until that copy ended (settled by rdma_stage.c then): never unregistered under it. */
    if (!ote__rdma_stage_end_then(tp, gp->stage, src_unpin_settle, gp)) src_unpin_settle(tp, gp);
    /* The grant layer gave back its receive admission before this: the slot is the
     * parent's again. */
    ote__rdma_sp_put(tp, &sps);
}

/* What the requester learns of a grant we accepted to serve: a refusal of the range
 * (ACCESS, ...) as it is; any other failure (alloc/bind of the window failed, the window
 * expired) as OTE_ERR_REMOTE_ACCESS: our native reasons stay in our log. */
static ote_status_t grant_refusal(ote_status_t st) {
    if (st == OTE_OK || st == OTE_ERR_ACCESS || st == OTE_ERR_TOO_BIG || st == OTE_ERR_AGAIN ||
        st == OTE_ERR_UNSUPPORTED)
        return st;
    return OTE_ERR_REMOTE_ACCESS;
}

static void src_answer(void *arg, uint64_t actx, ote_status_t st, uint32_t rkey) {
    rdma_tp_t *tp = arg;
    answer_t *a = (answer_t *)(uintptr_t)actx;
    st = grant_refusal(st);
    /* Before the answer goes: its receipt may follow at once. */
    ote__rdma_stage_answered(tp, a->stage, st, rkey);
    /* Counted before the GRANT_RESP goes: once the requester has it, its request may end
     * (and its user read both engines' stats) before this thread runs again. */
    if (st == OTE_OK) atomic_fetch_add(&a->nic->src_bytes, a->len);
    ote_rp_msg_t rp;
    memset(&rp, 0, sizeof(rp));
    rp.type = OTE_RP_GRANT_RESP;
    rp.u.resp.rkey = rkey;
    if (st == OTE_OK && a->base != 0) { /* staged: the requester addresses the bounce */
        rp.u.resp.flags = OTE_RP_RESP_STAGED | (a->write ? OTE_RP_RESP_COMMIT : 0);
        rp.u.resp.base = a->base;
    }
    if (st == OTE_OK && a->near != 0) { /* asked with OTE_RP_GF_PAIR */
        rp.u.resp.near = a->near;
        rp.u.resp.reg_addr = a->reg_addr;
        rp.u.resp.reg_len = a->reg_len;
    }
    (void)ote__rdma_conn_send_rp(a->c, a->req_id, st, &rp);
    ote__rdma_conn_put(a->c);
    ote_free(a);
}

void ote__rdma_src_on_recv(void *arg, ote_qp_t *qp, const struct ibv_wc *wc, const void *buf) {
    (void)buf;
    rdma_nic_t *n = arg; /* the device whose QP took the receipt */
    ote__rdma_stage_receipt(n->tp, n, ote_qp_num(qp), wc);
    ote_grant_source_receipt(n->gm, ote_qp_num(qp), wc);
}

ote_status_t ote__rdma_src_ep_on(conn_t *c, uint32_t d, uint32_t ri, ote_ep_cap_t cap,
                                 ote_endpoint_t **ep_out) {
    rdma_tp_t *tp = c->tp;
    if (d >= tp->nnics || ri >= c->ndev || ri >= OTE__RDMA_MAX_NICS || (uint32_t)cap > 3)
        return OTE_ERR_PROTOCOL;
    rdma_nic_t *n = &tp->nics[d];
    /* Caps 2 and 3: the direct endpoints, each QP in a private PD (rdma_direct.c). */
    ote_endpoint_store_t *store = (uint32_t)cap >= 2 ? n->deps : n->eps;
    if (store == NULL) return OTE_ERR_PROTOCOL;
    ote_ep_key_t key;
    ote_ep_key_make(&key, c->process, c->pd, ote_context_nic_id(n->ctx), c->nics[ri], OTE_EP_SOURCE,
                    cap);
    ote_status_t st = ote_endpoint_get(store, &key, c->lanes, ep_out);
    if (st == OTE_OK) c->src_used[ri] |= (uint8_t)(1u << d);
    return st;
}

ote_status_t ote__rdma_src_ep(conn_t *c, uint32_t pair, ote_ep_cap_t cap, rdma_nic_t **nic_out,
                              ote_endpoint_t **ep_out) {
    rdma_tp_t *tp = c->tp;
    uint32_t si = pair >> 8, ri = pair & 0xff;
    if (si >= tp->nnics || ri >= c->ndev || ri >= OTE__RDMA_MAX_NICS || (uint32_t)cap > 3)
        return OTE_ERR_PROTOCOL;
    uint32_t gen = atomic_load(&tp->dev_gen);
    if (gen != c->map_gen) {
        /* A device of ours came up: the pairs served elsewhere while their own device was
         * paused go back to it (the requester's QPs for them meet a cache miss at their
         * next GRANT_REQ and are rebuilt here by CONNECT, once). */
        c->map_gen = gen;
        for (uint32_t i = 0; i < OTE__RDMA_MAX_NICS; i++)
            if (c->src_map[i] != 0 && c->src_map[i] != i + 1) c->src_map[i] = 0;
    }
    if (c->src_map[si] == 0) {
        /* The requester pairs with our device si whatever its state: while si is paused
         * (its port down, at creation or since) an active device of ours serves it. */
        uint32_t d = si;
        for (uint32_t i = 0; i < tp->nnics && ote_context_check(tp->nics[d].ctx) != OTE_OK; i++)
            if (ote_context_check(tp->nics[i].ctx) == OTE_OK) d = i;
        if (d != si)
            OTE_INFO("rdma", "requester %s: our device %s is paused: %s serves its pairs",
                     c->peer_addr, ote_context_name(tp->nics[si].ctx),
                     ote_context_name(tp->nics[d].ctx));
        c->src_map[si] = (uint8_t)(d + 1);
    }
    uint32_t d = c->src_map[si] - 1u;
    ote_status_t st = ote__rdma_src_ep_on(c, d, ri, cap, ep_out);
    if (st == OTE_OK) *nic_out = &tp->nics[d];
    return st;
}

static ote_status_t copy_exchange(void *arg, uint32_t slot, const ote_qp_path_t *local,
                                  ote_qp_path_t *peer_out, ote_deadline_t deadline) {
    (void)slot;
    (void)local;
    (void)deadline;
    *peer_out = *(const ote_qp_path_t *)arg;
    return OTE_OK;
}

/* Whether a CONNECT is meant for another incarnation (proto.h): its source epoch is not
 * ours, or its requester epoch is not the one INFO gave on this connection. A CONNECT
 * without epochs (an older requester) passes. */
static int connect_stale(const conn_t *c, const ote_rp_msg_t *rq) {
    if (rq->u.connect.epoch == 0) return 0;
    if (rq->u.connect.epoch != c->tp->epoch) return 1;
    return c->epoch != 0 && rq->u.connect.req_epoch != c->epoch;
}

void ote__rdma_src_connect(conn_t *c, uint64_t req_id, const ote_rp_msg_t *rq) {
    rdma_tp_t *tp = c->tp;
    ote_rp_msg_t rp;
    memset(&rp, 0, sizeof(rp));
    rp.type = OTE_RP_CONNECT_ACK;
    ote_status_t fst;
    /* rdma.src_connect_miss: a CONNECT for another incarnation (tests). */
    int miss = ote_fault_hit("rdma.src_connect_miss", &fst);
    if (miss || connect_stale(c, rq)) {
        /* A cache miss, before any endpoint or QP is looked up or built here. */
        OTE_WARN_LIMITED("rdma",
                         "CONNECT from %s for epochs %016llx <- %016llx, ours %016llx <- "
                         "%016llx: refused (cache miss)",
                         c->peer_addr, (unsigned long long)rq->u.connect.epoch,
                         (unsigned long long)rq->u.connect.req_epoch, (unsigned long long)tp->epoch,
                         (unsigned long long)c->epoch);
        (void)ote__rdma_conn_send_rp(c, req_id, OTE_ERR_STATE, &rp);
        return;
    }
    ote_endpoint_t *ep = NULL;
    rdma_nic_t *nic = NULL;
    ote_status_t st =
        ote__rdma_src_ep(c, rq->u.connect.pair, (ote_ep_cap_t)rq->u.connect.cap, &nic, &ep);
    uint32_t slot = rq->u.connect.slot;
    if (st == OTE_OK && slot >= ote_endpoint_width(ep)) st = OTE_ERR_PROTOCOL;
    ote_qp_t *qp = NULL;
    if (st == OTE_OK) {
        uint32_t cur = ote_endpoint_remote_qpn(ep, slot);
        if (cur != 0 && ote_endpoint_borrow_ready(ep, slot, 0, &qp) == OTE_OK) {
            if (cur != rq->u.connect.path.qp_num) {
                /* The requester discarded its old QP: retire ours (destroyed once idle). */
                ote_endpoint_retire(ep, slot, qp);
                ote_endpoint_return(ep, slot, qp);
                qp = NULL;
            }
        }
        if (qp == NULL) {
            /* The requester has no QP on this slot: the grants served on our old one there
             * can neither be used nor released by it any more. Ended now, so that the old
             * QP is idle and the slot is rebuilt at once, not after their deadlines. */
            size_t ended = ote_grant_source_end_slot(nic->gm, ep, slot);
            if (ended != 0)
                OTE_INFO("rdma",
                         "CONNECT slot %u from %s: the requester's QP there is new; %zu "
                         "grant(s) served on our old QP ended",
                         slot, c->peer_addr, ended);
        }
        /* rdma_max_qps (rdma_srcqp.c): room made, or refused AGAIN (asked again later). */
        int limit = qp == NULL && tp->cfg.rdma_max_qps != 0;
        if (limit) ote__rdma_src_build_lock(tp);
        if (limit && !ote__rdma_src_qp_room(c)) st = OTE_ERR_AGAIN;
        if (qp == NULL && st == OTE_OK) {
            ote_deadline_t dl = ote_deadline_after(tp->cfg.connect_timeout_ms * OTE_NSEC_PER_MSEC);
            ote_qp_path_t peer = rq->u.connect.path;
            st = ote_endpoint_borrow(ep, slot, copy_exchange, &peer, dl, &qp);
            if (st == OTE_OK) {
                atomic_store(&c->src_granted, 0);
                atomic_store(&c->src_connect_ns, ote_now_ns());
            }
            if (st == OTE_OK) ote__rdma_qps_note(tp);
        }
        if (limit) ote__rdma_src_build_unlock(tp);
    }
    if (st == OTE_OK) {
        /* Published (READY) before the answer leaves: a grant request can follow at once. */
        ote_qp_local_path(qp, &rp.u.connect.path);
        ote_endpoint_return(ep, slot, qp);
    } else if (st != OTE_ERR_AGAIN) { /* AGAIN: logged by rdma_srcqp.c */
        OTE_WARN("rdma", "CONNECT slot %u from %s refused: %s", slot, c->peer_addr,
                 ote_status_str(st));
    }
    (void)ote__rdma_conn_send_rp(c, req_id, st, &rp);
}

/* A grant that will not be served: these bytes of its request will never be held (unless
 * a pin took them), and the requester learns st. */
static void src_refuse(conn_t *c, uint64_t req_id, acct_t *acct, uint64_t len, int pinned,
                       ote_status_t st) {
    if (!pinned) ote__rdma_acct_settle(c->tp, acct, len, 0);
    ote_rp_msg_t rp;
    memset(&rp, 0, sizeof(rp));
    rp.type = OTE_RP_GRANT_RESP;
    (void)ote__rdma_conn_send_rp(c, req_id, st, &rp);
}

/* A checked grant, its QP borrowed, its parent's slot taken: served by the grant layer
 * over addr (a staged grant's bounce, whose bytes are there). OTE_OK: answered (and
 * counted) by src_answer. Else the refusal to answer, *pinned_out when a pin took the
 * grant's bytes. Consumes a, stage, sps and the borrow either way. */
static ote_status_t src_serve(conn_t *c, uint64_t req_id, const ote_rp_msg_t *rq, acct_t *acct,
                              ote_endpoint_t *ep, rdma_nic_t *nic, ote_qp_t *qp, sp_slot_t sps,
                              answer_t *a, rdma_stage_t *stage, uint64_t addr, ote_deadline_t dl,
                              int *pinned_out) {
    rdma_tp_t *tp = c->tp;
    int direct = (rq->u.grant.dflags & OTE_RP_GOP_DIRECT) != 0;
    if (stage != NULL && a->write) {
        a->stage = stage;
        ote__rdma_stage_commit_to(stage, c, req_id, ote_qp_num(qp));
    }
    a->c = c;
    a->req_id = req_id;
    a->nic = nic;
    a->len = rq->u.grant.len;
    if ((rq->u.grant.flags & OTE_RP_GF_PAIR) && tp->pair_adv)
        ote__rdma_pair_hint(tp, acct, &a->near, &a->reg_addr, &a->reg_len);
    ote__rdma_conn_get(c);
    serve_call_t sc = {.a = acct, .stage = stage, .sps = sps, .pinned = 0};
    /* A direct slot serves device memory by an exact MR, a plain one by a window
     * (over the range, or over a staged grant's bounce). */
    ote_status_t st = (direct ? ote_grant_serve_exact : ote_grant_serve)(
        nic->gm, ep, rq->u.grant.slot, qp, (ote_grant_op_t)rq->u.grant.op, addr, rq->u.grant.len,
        dl, (uint64_t)(uintptr_t)a, &sc);
    int pinned = sc.pinned;
    *pinned_out = pinned;
    if (st == OTE_OK) atomic_store(&c->src_granted, 1);
    /* Not taken by a pin (refused before one): back to its parent. */
    ote__rdma_sp_put(tp, &sc.sps);
    /* The grant's pin owns the bounce once src_pin took it (src_unpin ends it). */
    if (!pinned) ote__rdma_stage_end(tp, stage);
    if (st == OTE_OK) return OTE_OK;               /* answered (and counted) by src_answer */
    ote__rdma_stage_answered(tp, a->stage, st, 0); /* never answered */
    /* Refused before any window exists; the borrow stays ours. */
    ote_endpoint_return(ep, rq->u.grant.slot, qp);
    ote__rdma_conn_put(c);
    ote_free(a);
    return grant_refusal(st);
}

/* A staged grant whose copy into its bounce runs (the GPU worker polls it; a file's read
 * runs on the file owner's I/O engine): everything src_serve needs once it is done. Holds a reference on c, counted in c->src_copies and
 * tp->src_copies, which its server thread and the teardown wait for. */
typedef struct {
    conn_t *c;
    uint64_t req_id;
    ote_rp_msg_t rq;
    acct_t *acct;
    ote_endpoint_t *ep;
    rdma_nic_t *nic;
    ote_qp_t *qp;
    sp_slot_t sps;
    answer_t *a;
    rdma_stage_t *stage;
    ote_deadline_t dl;
} copying_t;

/* Whether the slot still has the QP p borrowed, READY (and connected to the requester's
 * QP the grant named, when it named one): then a second borrow of it, *hold, which keeps
 * the QP (and so its number) alive until src_end_if_replaced returns it. Not so when the
 * slot was retired while the copy ran (a CONNECT for the slot: the requester's QP there
 * is new): a grant served on it could be neither used nor released, and would hold the
 * old QP, and the CONNECT's rebuild waiting behind it, until its deadline
 * (ote_grant_source_end_slot ended only the grants already served). */
static int src_slot_kept(const copying_t *p, ote_qp_t **hold) {
    ote_qp_t *q = NULL;
    *hold = NULL;
    if (ote_endpoint_borrow_ready(p->ep, p->rq.u.grant.slot, p->rq.u.grant.req_qpn, &q) != OTE_OK)
        return 0;
    if (q != p->qp) {
        ote_endpoint_return(p->ep, p->rq.u.grant.slot, q);
        return 0;
    }
    *hold = q;
    return 1;
}

/* A staged grant just served (indexed as live in the grant manager) on the QP src_slot_kept
 * holds: when the slot lost that QP meanwhile (a CONNECT whose ote_grant_source_end_slot
 * ran before the grant was indexed), the grants of the slot on that QP are ended now.
 * Ordered by the endpoint's lock: a CONNECT retires the slot before its end_slot, so
 * either this sees the slot retired (or rebuilt), or that end_slot runs after the grant
 * was indexed and ends it. The hold keeps the old QP alive until then, so its number names
 * it alone. The hold is given back here. */
static void src_end_if_replaced(const copying_t *p, ote_qp_t *hold) {
    ote_qp_t *now = NULL;
    if (src_slot_kept(p, &now)) {
        ote_endpoint_return(p->ep, p->rq.u.grant.slot, now);
    } else {
        size_t n =
            ote_grant_source_end_slot_qp(p->nic->gm, p->ep, p->rq.u.grant.slot, ote_qp_num(hold));
        if (n != 0)
            OTE_DEBUG("rdma",
                      "staged grant on slot %u: the slot's QP was retired as it was "
                      "served: %zu grant(s) on it ended",
                      p->rq.u.grant.slot, n);
    }
    ote_endpoint_return(p->ep, p->rq.u.grant.slot, hold);
}

/* GPU worker (a file's: the file owner's reaper or pool thread): the copy of a staged
 * grant ended. Copied: served now (window bound over the bounce, answered by src_answer).
 * Failed, or its requester, the transport or its slot's QP (src_slot_kept) went
 * meanwhile: refused (the requester sees OTE_ERR_REMOTE), and everything it held given
 * back as a refusal on the serving thread does (the bounce only now: the device no longer
 * writes it, or engine/gpu parked what it may still write). */
static void src_copied(void *arg, ote_status_t st) {
    copying_t *p = arg;
    conn_t *c = p->c;
    rdma_tp_t *tp = c->tp;
    int pinned = 0;
    ote_qp_t *hold = NULL;
    if (st == OTE_OK &&
        (atomic_load(&c->dead) || atomic_load(&tp->stop) || !src_slot_kept(p, &hold)))
        st = OTE_ERR_CANCELED;
    if (st == OTE_OK) {
        st = src_serve(c, p->req_id, &p->rq, p->acct, p->ep, p->nic, p->qp, p->sps, p->a, p->stage,
                       ote__rdma_stage_base(p->stage), p->dl, &pinned);
        if (st == OTE_OK) src_end_if_replaced(p, hold);
        else ote_endpoint_return(p->ep, p->rq.u.grant.slot, hold);
    } else {
        if (ote_status_code(st) != OTE_ERR_CANCELED)
            OTE_WARN_LIMITED("rdma",
                             "staged %s grant of %llu bytes at 0x%llx for %s: the copy from the "
                             "%s failed: %s",
                             p->a->write ? "WRITE" : "READ", (unsigned long long)p->rq.u.grant.len,
                             (unsigned long long)p->rq.u.grant.addr, c->peer_addr,
                             ote__rdma_stage_is_file(p->stage) ? "file" : "device",
                             ote_status_str(st));
        ote__rdma_stage_end(tp, p->stage);
        ote_free(p->a);
        ote__rdma_sp_put(tp, &p->sps);
        ote_endpoint_return(p->ep, p->rq.u.grant.slot, p->qp);
        st = OTE_ERR_REMOTE; /* the driver's status is in our log */
    }
    if (st != OTE_OK) src_refuse(c, p->req_id, p->acct, p->rq.u.grant.len, pinned, st);
    ote__rdma_acct_unstage(tp, p->acct, p->rq.u.grant.len); /* may end it */
    ote_free(p);
    atomic_fetch_sub(&c->src_copies, 1);
    ote__rdma_conn_put(c);
    atomic_fetch_sub(&tp->src_copies, 1); /* the last touch of tp */
}

void ote__rdma_src_wait_copies(rdma_tp_t *tp, conn_t *c, ote_deadline_t dl) {
    _Atomic int *n = c != NULL ? &c->src_copies : &tp->src_copies;
    while (atomic_load(n) > 0 && !ote_deadline_expired(dl)) {
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* Answers a GRANT_REQ that nothing here will serve, with status st (and rkey, for a
 * redirect), before anything of it is held. */
static void refuse_early(conn_t *c, uint64_t req_id, ote_status_t st, uint32_t rkey) {
    ote_rp_msg_t rp;
    memset(&rp, 0, sizeof(rp));
    rp.type = OTE_RP_GRANT_RESP;
    rp.u.resp.rkey = rkey;
    (void)ote__rdma_conn_send_rp(c, req_id, st, &rp);
}

/* The source QP the grant names (its endpoint of the grant's pair and capability, the slot
 * and both QP numbers), borrowed; NOT_FOUND or PROTOCOL when there is none. */
static ote_status_t borrow_src_qp(conn_t *c, const ote_rp_msg_t *rq, rdma_nic_t **nic_out,
                                  ote_endpoint_t **ep_out, ote_qp_t **qp_out) {
    int direct = (rq->u.grant.dflags & OTE_RP_GOP_DIRECT) != 0;
    uint32_t ecap = (rq->u.grant.op == OTE_GRANT_WRITE ? 1u : 0u) + (direct ? 2u : 0u);
    ote_endpoint_t *ep = NULL;
    ote_qp_t *qp = NULL;
    ote_status_t st = ote__rdma_src_ep(c, rq->u.grant.pair, (ote_ep_cap_t)ecap, nic_out, &ep);
    if (st == OTE_OK && rq->u.grant.slot >= ote_endpoint_width(ep)) st = OTE_ERR_PROTOCOL;
    if (st == OTE_OK)
        st = ote_endpoint_borrow_ready(ep, rq->u.grant.slot, rq->u.grant.req_qpn, &qp);
    if (st == OTE_OK && ote_qp_num(qp) != rq->u.grant.src_qpn) {
        ote_endpoint_return(ep, rq->u.grant.slot, qp);
        st = OTE_ERR_NOT_FOUND;
    }
    if (st != OTE_OK) return st;
    *ep_out = ep;
    *qp_out = qp;
    return OTE_OK;
}

/* Device memory or a file: the grant's bytes go to a bounce buffer first, and the window
 * covers exactly that (rdma_stage.c). The copy runs on a copy stream (a file's read on the
 * file owner's I/O engine) while this thread serves the next requests; the grant is
 * served (or refused) by src_copied once it is done, which then owns everything p names:
 * OTE_OK. Otherwise nothing was started and p->a, p->sps and
 * the QP borrow are still the caller's (a failed copy is the source's failure: REMOTE). */
static ote_status_t start_staged(const copying_t *want, void *reg_pin) {
    conn_t *c = want->c;
    rdma_tp_t *tp = c->tp;
    int write = want->rq.u.grant.op == OTE_GRANT_WRITE;
    rdma_stage_t *stage = NULL;
    copying_t *p = ote_calloc(1, sizeof(*p));
    ote_status_t st =
        p == NULL ? OTE_ERR_NOMEM
                  : ote__rdma_stage_take(tp, want->nic, reg_pin, write, want->rq.u.grant.addr,
                                         want->rq.u.grant.len, want->dl, &stage);
    if (st == OTE_OK) {
        want->a->base = ote__rdma_stage_base(stage);
        want->a->write = write;
        *p = *want;
        p->stage = stage;
        ote__rdma_conn_get(c);
        atomic_fetch_add(&c->src_copies, 1);
        atomic_fetch_add(&tp->src_copies, 1);
        /* The account outlives the copy: src_copied uses it (ci21: a write-off of the
         * request freed it while a copy ran). */
        ote__rdma_acct_stage(tp, p->acct, p->rq.u.grant.len);
        st = ote__rdma_stage_copy_start(tp, stage, src_copied, p);
        if (st == OTE_OK) return OTE_OK;
        ote__rdma_acct_unstage(tp, p->acct, p->rq.u.grant.len);
        atomic_fetch_sub(&c->src_copies, 1);
        atomic_fetch_sub(&tp->src_copies, 1);
        ote__rdma_conn_put(c);
        ote__rdma_stage_end(tp, stage); /* nothing pending on it */
    }
    ote_free(p);
    int code = ote_status_code(st);
    if (code != OTE_ERR_UNSUPPORTED && code != OTE_ERR_TOO_BIG && code != OTE_ERR_AGAIN &&
        code != OTE_ERR_NOMEM)
        st = OTE_ERR_REMOTE; /* the driver's status is in our log */
    return st;
}

/* Serves the grant g (its QP borrowed, its parent's slot taken): staged through a bounce
 * for device memory, else directly. OTE_OK: answered (or to be, by src_copied), everything
 * handed on; otherwise what g held is given back here and *pinned says whether the grant
 * took its bytes of the account (the caller refuses it). */
static ote_status_t serve_or_stage(copying_t *g, int *pinned) {
    rdma_tp_t *tp = g->c->tp;
    g->a = ote_calloc(1, sizeof(*g->a));
    g->dl = ote_deadline_after((tp->cfg.transfer_timeout_ms + 1000) * OTE_NSEC_PER_MSEC);
    void *reg_pin = ote__rdma_acct_staged(g->acct);
    ote_status_t st = OTE_OK;
    if (g->a == NULL) st = OTE_ERR_NOMEM;
    else if (reg_pin != NULL && (st = start_staged(g, reg_pin)) == OTE_OK) return OTE_OK;
    if (st != OTE_OK) {
        ote_free(g->a);
        ote__rdma_sp_put(tp, &g->sps);
        ote_endpoint_return(g->ep, g->rq.u.grant.slot, g->qp);
        return st;
    }
    return src_serve(g->c, g->req_id, &g->rq, g->acct, g->ep, g->nic, g->qp, g->sps, g->a, NULL,
                     g->rq.u.grant.addr, g->dl, pinned);
}

void ote__rdma_src_grant(conn_t *c, uint64_t req_id, const ote_rp_msg_t *rq) {
    rdma_tp_t *tp = c->tp;
    ote_status_t fst;
    /* rdma.src_grant_miss: a source that lost its endpoints for this requester (tests). */
    int miss = ote_fault_hit("rdma.src_grant_miss", &fst);
    if (miss || (rq->u.grant.epoch != 0 && rq->u.grant.epoch != tp->epoch)) {
        /* Meant for an earlier incarnation at this address: a cache miss, before anything
         * is checked or held here (rdma_internal.h). */
        OTE_WARN_LIMITED(
            "rdma", "GRANT from %s for epoch %016llx, ours is %016llx: refused (cache miss)",
            c->peer_addr, (unsigned long long)rq->u.grant.epoch, (unsigned long long)tp->epoch);
        refuse_early(c, req_id, OTE_ERR_STATE, 0);
        return;
    }
    /* The whole request is checked, and pinned, by its first grant (rdma_accounts.c): a
     * request partly outside a registration is refused on every grant, no byte moves. */
    acct_t *acct = NULL;
    ote_status_t chk = ote__rdma_acct_take(c, rq, &acct);
    if (chk == OTE__RDMA_DIRECT_REDIRECT) {
        /* Exact-MR memory (device memory with a dma-buf, host memory under rdma_grant_mode
         * mr), asked on a plain slot by a requester that follows: to a direct slot
         * (proto.h); or memory served staged, asked on a direct slot: back to a plain one. */
        atomic_fetch_add(&tp->direct_redirects, 1);
        refuse_early(c, req_id, OTE_ERR_UNSUPPORTED, OTE_RP_RKEY_DIRECT);
        return;
    }
    if (chk != OTE_OK) {
        refuse_early(c, req_id, grant_refusal(chk), 0);
        return;
    }
    copying_t g = {.c = c, .req_id = req_id, .rq = *rq, .acct = acct, .sps = {NULL, -1}};
    int pinned = 0; /* the grant took its bytes of the account (and gives them back) */
    ote_status_t st = borrow_src_qp(c, rq, &g.nic, &g.ep, &g.qp);
    /* Its parent's reservation (made now by its first grant) and a slot of it, before any
     * window, pin or key of the grant exists (rdma_src_parents.c). */
    ote_status_t spst = st == OTE_OK ? ote__rdma_sp_take(c, rq, g.ep, g.qp, &g.sps) : OTE_OK;
    if (spst != OTE_OK) {
        ote_endpoint_return(g.ep, rq->u.grant.slot, g.qp);
        st = grant_refusal(spst);
    } else if (st != OTE_OK) {
        /* No such connection here (its endpoint was evicted, or it was built with an
         * earlier incarnation): OTE_ERR_STATE, a cache miss for the requester. */
        if (ote_status_code(st) == OTE_ERR_NOT_FOUND) st = OTE_ERR_STATE;
        OTE_WARN("rdma", "GRANT from %s on slot %u: no such connection (QP %u <- %u): %s",
                 c->peer_addr, rq->u.grant.slot, rq->u.grant.src_qpn, rq->u.grant.req_qpn,
                 ote_status_str(st));
    } else if ((st = serve_or_stage(&g, &pinned)) == OTE_OK) {
        return; /* answered (and counted) by src_answer, or to be by src_copied */
    }
    /* Not served: these bytes of the request will never be held. */
    src_refuse(c, req_id, acct, rq->u.grant.len, pinned, st);
}

ote_grant_source_ops_t ote__rdma_source_ops(rdma_tp_t *tp) {
    ote_grant_source_ops_t src = {.arg = tp,
                                  .pin = src_pin,
                                  .unpin = src_unpin,
                                  .answer = src_answer,
                                  .pin_exact = src_pin_exact};
    return src;
}

void ote__rdma_src_reset(conn_t *c, const ote_rp_msg_t *rq) {
    size_t n = 0;
    for (int cap = 0; cap < 4; cap++) {
        rdma_nic_t *nic = NULL;
        ote_endpoint_t *ep = NULL;
        if (ote__rdma_src_ep(c, rq->u.reset.pair, (ote_ep_cap_t)cap, &nic, &ep) != OTE_OK) continue;
        /* Their borrows of the slots' QPs end with them; ending a live grant cancels and
         * retires its QP. QPs without a live grant stay: a requester QP that saw no
         * traffic while its port was down is still connected to its own; one that failed
         * is rebuilt by CONNECT, which retires ours then. */
        n += ote_grant_source_end_endpoint(nic->gm, ep);
        ote__rdma_sp_end_ep(c->tp, ep); /* reservations on those QPs (rdma_src_parents.c) */
    }
    OTE_INFO("rdma", "requester %s lost its device of pair %u:%u: %zu grant(s) ended", c->peer_addr,
             rq->u.reset.pair >> 8, rq->u.reset.pair & 0xff, n);
}

void ote__rdma_src_release(conn_t *c, const ote_rp_msg_t *rq) {
    rdma_tp_t *tp = c->tp;
    rdma_nic_t *nic = NULL;
    ote_endpoint_t *ep = NULL;
    /* Only a grant served on this requester's own endpoint can match: one requester never
     * ends another's grant, whatever rkey it names. */
    ote_status_t st = ote__rdma_src_ep(c, rq->u.rel.pair, (ote_ep_cap_t)rq->u.rel.cap, &nic, &ep);
    if (st == OTE_OK && rq->u.rel.slot >= ote_endpoint_width(ep)) st = OTE_ERR_NOT_FOUND;
    if (st == OTE_OK)
        st = ote_grant_source_release(nic->gm, ep, rq->u.rel.slot, rq->u.rel.src_qpn,
                                      rq->u.rel.rkey);
    if (st != OTE_OK) {
        atomic_fetch_add(&tp->rel_ignored, 1);
        OTE_DEBUG("rdma",
                  "RELEASE from %s of window 0x%x (pair %u:%u, slot %u, QP %u) names no "
                  "bound grant: ignored (%s)",
                  c->peer_addr, rq->u.rel.rkey, rq->u.rel.pair >> 8, rq->u.rel.pair & 0xff,
                  rq->u.rel.slot, rq->u.rel.src_qpn, ote_status_str(st));
        return;
    }
    atomic_fetch_add(&tp->rel_applied, 1);
    OTE_DEBUG("rdma", "grant of window 0x%x released at the request of %s", rq->u.rel.rkey,
              c->peer_addr);
}

ote_status_t ote__rdma_advert(ote__transport_t *t, char *buf, size_t len) {
    const rdma_tp_t *tp = (const rdma_tp_t *)t;
    /* rdma_stage=1: READs of device memory are served staged (rdma_stage.c) to a
     * requester that asks with OTE_RP_GF_STAGE; rdma_direct=1: GRANT_REQ's direct flags,
     * CONNECT cap 2/3 (rdma_direct.c); rdma_parent=1: GRANT_REQ's parent trailer
     * (rdma_src_parents.c); rdma_grant_mr=1: host memory too is served by exact MRs on
     * direct slots (rdma_grant_mode, rdma_direct.c: a requester that does not follow the
     * redirect is refused). */
    static const char kAdv[] =
        "rdma_release=1;rdma_connect_epoch=1;rdma_stage=1;rdma_direct=1;rdma_parent=1";
    static const char kMr[] = ";rdma_grant_mr=1";
    /* rdma_pair=1: GRANT_REQ's OTE_RP_GF_PAIR, GRANT_RESP's pair form (rdma_pairing.c). */
    static const char kPair[] = ";rdma_pair=1";
    int mr = tp->grant_mode == OTE__RDMA_GRANT_MR;
    size_t need =
        sizeof(kAdv) + (mr ? sizeof(kMr) - 1 : 0) + (tp->pair_adv ? sizeof(kPair) - 1 : 0);
    if (len < need) return OTE_ERR_TOO_BIG;
    memcpy(buf, kAdv, sizeof(kAdv));
    if (mr) memcpy(buf + strlen(buf), kMr, sizeof(kMr));
    if (tp->pair_adv) memcpy(buf + strlen(buf), kPair, sizeof(kPair));
    return OTE_OK;
}

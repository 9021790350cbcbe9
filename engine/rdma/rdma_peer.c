/*
 * engine/rdma/rdma_peer.c - the requester's control connection to one peer (the engine's
 * ote__tpeer_t): a bounded non-blocking connect and the HELLO handshake, INFO (both
 * sides' identity and width, then the peer's requester endpoints), the reader thread
 * that alone waits on the connection and routes each answer (INFO_ACK / CONNECT_ACK to
 * the call that waits for it, GRANT_RESP to the grant layer (a late OK answer, whose
 * grant already ended, is released at the source: RELEASE), NOTIFY_ACK to its
 * notification) and fails everything that waits when the connection is lost, and
 * open / ensure (reconnect) / close. Touches the peer's fields under p->mu and
 * tp->peers under tp->mu.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/log.h"
#include "base/thread.h"
#include "engine/control/hello.h"
#include "engine/rdma/rdma_internal.h"

static void call_unlink(ote__tpeer_t *p, call_t *x) {
    call_t **pp = &p->waits.calls;
    while (*pp != NULL && *pp != x) pp = &(*pp)->next;
    if (*pp != NULL) *pp = x->next;
}

/* NOTIFY_ACK: ends the notification it names. 0 to go on, -1: not a notification's id. */
static int on_notify_ack(ote__tpeer_t *p, const ote_ctl_msg_t *m) {
    if ((m->req_id & OTE__RDMA_NOTE_TAG) == 0) {
        OTE_WARN("rdma",
                 "control to %s: NOTIFY_ACK for request %llu, which is no "
                 "notification: closing",
                 p->name, (unsigned long long)m->req_id);
        return -1;
    }
    ote_mutex_lock(&p->mu);
    note_t *x = ote__rdma_note_take(p, m->req_id);
    ote_mutex_unlock(&p->mu);
    if (x == NULL) {
        OTE_DEBUG("rdma", "NOTIFY_ACK from %s for a notification that no longer waits", p->name);
        return 0;
    }
    x->s->done(x->s, ote_ctl_peer_status(OTE_CTL_NOTIFY_ACK, m->status));
    ote_free(x);
    return 0;
}

/* A GRANT_RESP's status as the requester acts on it: a cache miss (the source has no such
 * connection, or is another incarnation: nothing was bound), refused for now (no receive
 * slot for its receipt, too many requests open: asked again later, rdma_credits.h), a
 * redirect to a direct slot (rdma_direct.c), or the peer's status. */
static ote_status_t grant_resp_status(conn_t *c, const ote_ctl_msg_t *m, const ote_rp_msg_t *rp) {
    ote_status_t st = ote_ctl_peer_status(OTE_CTL_RDMA, m->status);
    if (m->status == OTE_ERR_STATE) st = OTE__RDMA_CACHE_MISS;
    if (m->status == OTE_ERR_AGAIN) st = OTE__RDMA_SRC_BUSY;
    if (ote__rdma_direct_is_redirect(c, st, rp->u.resp.rkey)) st = OTE__RDMA_DIRECT_REDIRECT;
    return st;
}

/* A request served OK: served staged, its further runs and later requests in its range
 * are cut at the chunk size (rdma_pump.c), the range joined to the one known when it
 * meets it; served otherwise, the range is not. */
static void note_staged_range(ote__tpeer_t *p, const gid_ent_t *mine, int staged) {
    ote_mutex_lock(&p->mu);
    uint64_t lo = mine->req_remote, hi = mine->req_remote + mine->req_len;
    if (staged) {
        p->staged.uid = mine->req_uid;
        if (lo <= p->staged.hi && hi >= p->staged.lo && p->staged.hi != 0) {
            if (lo > p->staged.lo) lo = p->staged.lo;
            if (hi < p->staged.hi) hi = p->staged.hi;
        }
        p->staged.lo = lo;
        p->staged.hi = hi;
    } else if (mine->req_remote >= p->staged.lo && mine->req_remote < p->staged.hi) {
        p->staged.lo = p->staged.hi = 0;
    }
    ote_mutex_unlock(&p->mu);
}

/* GRANT_RESP: hands the answer to the grant layer of the device its wire id names. A
 * staged answer is taken only for a grant asked with OTE_RP_GF_STAGE (else the grant fails
 * and the connection closes: -1); a staged WRITE's run waits for its COMMIT, linked before
 * the grant can end; an OK answer whose grant already ended (deadline, port down) posted
 * nothing under the window, so the source may drop it at once (RELEASE). */
static int on_grant_resp(ote__tpeer_t *p, const ote_ctl_msg_t *m, const ote_rp_msg_t *rp) {
    rdma_tp_t *tp = p->tp;
    conn_t *c = p->conn.c;
    ote_status_t st = grant_resp_status(c, m, rp);
    ote_mutex_lock(&p->mu);
    gid_ent_t *mine = ote__rdma_grant_id_take_ent(p, m->req_id);
    ote_mutex_unlock(&p->mu);
    int staged = rp->u.resp.flags != 0;
    int commit = (rp->u.resp.flags & OTE_RP_RESP_COMMIT) != 0;
    uint32_t nic = (uint32_t)(m->req_id >> 32); /* the device whose grant manager owns it */
    if (staged &&
        (!c->stage_ok || c->epoch == 0 || (mine != NULL && (mine->cap != 0) != (commit != 0)))) {
        OTE_WARN("rdma",
                 "control to %s: staged GRANT_RESP for grant %llx that did not ask "
                 "for one: closing",
                 p->name, (unsigned long long)m->req_id);
        if (mine != NULL && nic < tp->nnics)
            (void)ote_grant_on_answer(tp->nics[nic].gm, m->req_id & 0xffffffffu, OTE_ERR_PROTOCOL,
                                      0);
        ote_free(mine);
        return -1;
    }
    if (st == OTE_OK && mine != NULL && mine->req_uid != 0) note_staged_range(p, mine, staged);
    /* The pair form (asked only of a source with rdma_pair=1): its best devices for the
     * registration, for our later runs into it (rdma_pairing.c). */
    if (st == OTE_OK && mine != NULL && c->pair_ok && rp->u.resp.near != 0)
        ote__rdma_pair_learn(p, rp);
    int waits = 0;
    if (commit && st == OTE_OK && mine != NULL && nic < tp->nnics) {
        if (ote__rdma_commit_expect(p, m->req_id, rp->u.resp.rkey, mine) != OTE_OK) {
            /* Never used: fail it, and the source may drop the window at once. */
            (void)ote_grant_on_answer(tp->nics[nic].gm, m->req_id & 0xffffffffu, OTE_ERR_NOMEM, 0);
            ote__rdma_send_release(c, mine->pair, mine->cap, mine->slot, mine->src_qpn,
                                   rp->u.resp.rkey);
            ote_free(mine);
            return 0;
        }
        waits = 1;
    }
    /* A refusal that is not the protocol at work (a redirect, a busy source: asked again;
     * a cache miss: logged where the run is rebuilt) fails its run: said here, once per
     * burst. */
    if (st != OTE_OK && st != OTE__RDMA_DIRECT_REDIRECT && st != OTE__RDMA_SRC_BUSY &&
        st != OTE__RDMA_CACHE_MISS && mine != NULL)
        OTE_WARN_LIMITED("rdma", "%s refused a grant for a request of %llu bytes at 0x%llx: %s",
                         p->name, (unsigned long long)mine->req_len,
                         (unsigned long long)mine->req_remote, ote_status_str(st));
    if (mine != NULL && nic < tp->nnics &&
        ote_grant_on_answer_at(tp->nics[nic].gm, m->req_id & 0xffffffffu, st, rp->u.resp.rkey,
                               staged, rp->u.resp.base) == OTE_ERR_NOT_FOUND &&
        st == OTE_OK) {
        ote__rdma_send_release(c, mine->pair, mine->cap, mine->slot, mine->src_qpn,
                               rp->u.resp.rkey);
        if (waits) ote__rdma_commit_drop(p, m->req_id);
    }
    ote_free(mine);
    return 0;
}

/* CONNECT_ACK / INFO_ACK: wakes the call that waits for it (an INFO_ACK also fills the
 * connection's view of the peer). -1 when the id names a notification, or a call that
 * waits for another kind of answer. */
static int on_call_answer(ote__tpeer_t *p, const ote_ctl_msg_t *m, const ote_rp_msg_t *rp) {
    conn_t *c = p->conn.c;
    ote_status_t st = ote_ctl_peer_status(OTE_CTL_RDMA, m->status);
    /* A CONNECT for another incarnation (proto.h): a cache miss, nothing was built.
     * Refused for now: the source holds its rdma_max_qps (rdma_srcqp.c); asked again. */
    if (rp->type == OTE_RP_CONNECT_ACK && m->status == OTE_ERR_STATE) st = OTE__RDMA_CACHE_MISS;
    if (rp->type == OTE_RP_CONNECT_ACK && m->status == OTE_ERR_AGAIN) st = OTE__RDMA_SRC_BUSY;
    int bad = (m->req_id & OTE__RDMA_NOTE_TAG) != 0;
    ote_mutex_lock(&p->mu);
    call_t *x = p->waits.calls;
    while (!bad && x != NULL && x->req_id != m->req_id) x = x->next;
    if (!bad && x != NULL) {
        if (x->want != rp->type) {
            bad = 1;
        } else {
            call_unlink(p, x);
            x->done = 1;
            x->st = st;
            x->path = rp->u.connect.path;
            if (rp->type == OTE_RP_INFO_ACK && st == OTE_OK) {
                c->process = rp->u.info.process;
                c->pd = rp->u.info.pd;
                c->nic = rp->u.info.nic;
                c->lanes = rp->u.info.lanes;
                c->ndev = rp->u.info.ndev;
                memcpy(c->nics, rp->u.info.nics, sizeof(c->nics));
                c->epoch = rp->u.info.epoch;
            }
            ote_cond_broadcast(&p->cv);
        }
    }
    ote_mutex_unlock(&p->mu);
    if (bad) {
        OTE_WARN("rdma", "control to %s: answer of the wrong kind (%u) for request %llu: closing",
                 p->name, rp->type, (unsigned long long)m->req_id);
        return -1;
    }
    return 0;
}

/* One answer from the source; 0 to go on, -1: a protocol error (the peer is dropped). */
static int reader_frame(ote__tpeer_t *p, const ote_ctl_msg_t *m) {
    conn_t *c = p->conn.c;
    if (m->version != c->version) {
        OTE_WARN("rdma",
                 "control to %s: %s frame of version %u on a connection that negotiated "
                 "%u: closing",
                 p->name, ote_ctl_opcode_str(m->opcode), m->version, c->version);
        return -1;
    }
    if (m->opcode == OTE_CTL_NOTIFY_ACK) return on_notify_ack(p, m);
    ote_rp_msg_t rp;
    if (m->opcode != OTE_CTL_RDMA || ote__rp_decode(m->u.rdma.body, m->u.rdma.len, &rp) != OTE_OK) {
        OTE_WARN("rdma", "control to %s: malformed or unexpected %s answer: closing", p->name,
                 ote_ctl_opcode_str(m->opcode));
        return -1;
    }
    switch (rp.type) {
        case OTE_RP_GRANT_RESP: return on_grant_resp(p, m, &rp);
        case OTE_RP_COMMIT:
            /* Only a wait of ours matches (grant id and window); anything else is ignored. */
            ote__rdma_commit_on_msg(p, m->req_id, ote_ctl_peer_status(OTE_CTL_RDMA, m->status),
                                    rp.u.commit.rkey);
            return 0;
        case OTE_RP_CONNECT_ACK:
        case OTE_RP_INFO_ACK: return on_call_answer(p, m, &rp);
        default:
            OTE_WARN("rdma", "control to %s: unexpected message %u: closing", p->name, rp.type);
            return -1;
    }
}

static void *reader_main(void *arg) {
    ote__tpeer_t *p = arg;
    rdma_tp_t *tp = p->tp;
    /* Started again by a reconnect on whatever thread asked: its lines name the engine. */
    ote_log_set_thread_engine(tp->host.log_tag);
    conn_t *c = p->conn.c;
    for (;;) {
        ote_ctl_msg_t m;
        if (ote__rdma_conn_next(c, &m, UINT64_MAX, NULL) != OTE_OK) break;
        if (reader_frame(p, &m) != 0) break;
    }
    /* Peer lost: fail everything waiting on this connection. */
    ote__rdma_conn_kill(c, NULL);
    ote_mutex_lock(&p->mu);
    for (call_t *x = p->waits.calls; x != NULL; x = x->next) {
        x->done = 1;
        x->st = OTE_ERR_PEER_LOST;
    }
    p->waits.calls = NULL;
    note_t *notes = p->waits.notes;
    p->waits.notes = NULL;
    gid_ent_t *grants = p->waits.grants;
    p->waits.grants = NULL;
    ote_cond_broadcast(&p->cv);
    ote_mutex_unlock(&p->mu);
    ote__rdma_notes_end(notes, OTE_ERR_PEER_LOST);
    ote__rdma_commits_lost(p);
    while (grants != NULL) {
        gid_ent_t *g = grants;
        grants = g->next;
        uint32_t nic = (uint32_t)(g->id >> 32);
        if (nic < tp->nnics)
            ote_grant_on_answer(tp->nics[nic].gm, g->id & 0xffffffffu, OTE_ERR_PEER_LOST, 0);
        ote_free(g);
    }
    return NULL;
}

/* Send a request and wait for its CONNECT_ACK / INFO_ACK. */
ote_status_t ote__rdma_peer_call(ote__tpeer_t *p, const ote_rp_msg_t *rq, uint16_t want,
                                 ote_deadline_t dl, ote_qp_path_t *path_out) {
    call_t x;
    memset(&x, 0, sizeof(x));
    x.want = want;
    ote_mutex_lock(&p->mu);
    if (atomic_load(&p->conn.c->dead)) {
        ote_mutex_unlock(&p->mu);
        return OTE_ERR_PEER_LOST;
    }
    x.req_id = ++p->waits.next_call;
    x.next = p->waits.calls;
    p->waits.calls = &x;
    ote_mutex_unlock(&p->mu);
    ote_status_t st = ote__rdma_conn_send_rp(p->conn.c, x.req_id, OTE_OK, rq);
    ote_mutex_lock(&p->mu);
    while (st == OTE_OK && !x.done) {
        if (atomic_load(&p->conn.c->dead)) st = OTE_ERR_PEER_LOST;
        else if (ote_cond_wait(&p->cv, &p->mu, dl) == OTE_ERR_TIMEOUT && !x.done)
            st = OTE_ERR_TIMEOUT;
    }
    call_unlink(p, &x); /* no-op once answered or failed by the reader */
    ote_mutex_unlock(&p->mu);
    if (st == OTE_OK) st = x.st;
    if (st == OTE_OK && path_out != NULL) *path_out = x.path;
    return st;
}

/* Whether the source's advertisement (HELLO_ACK info) has key=1. A source that takes
 * RELEASE says rdma_release=1; an older one would close the connection on the unknown
 * message, so it is sent none (its grants of failed requesters end at its own deadline,
 * as before). One that takes CONNECT with epochs says rdma_connect_epoch=1; an older one
 * is sent the form without them. */
static int adv_flag(const ote_ctl_msg_t *ack, const char *key) {
    size_t il = ack->u.hello_ack.info_len;
    char *info = ote_malloc(il + 1);
    if (info == NULL) return 0;
    memcpy(info, ack->u.hello_ack.info, il);
    info[il] = '\0';
    char rel[8] = "";
    int yes = ote_ctl_info_get(info, key, rel, sizeof(rel)) == OTE_OK && strcmp(rel, "1") == 0;
    ote_free(info);
    return yes;
}

/* Whether c (just past INFO) reaches the incarnation p met first: the same epoch, or for
 * a peer that sends none (an older engine) the same process id. */
static int same_incarnation(const ote__tpeer_t *p, const conn_t *c) {
    if (c->epoch != 0 || p->conn.met_epoch != 0) return c->epoch == p->conn.met_epoch;
    return c->process == p->conn.met_process;
}

/* Under p->mu: take p's endpoints (NULL there after); whoever takes them evicts them. */
static size_t eps_take(ote__tpeer_t *p, ote_endpoint_t **out) {
    size_t n = 0;
    for (uint32_t i = 0; i < OTE__RDMA_MAX_NICS; i++) {
        for (int e = 0; e < OTE__RDMA_EPS; e++) {
            if (p->conn.ep[i][e] != NULL) out[n++] = p->conn.ep[i][e];
            p->conn.ep[i][e] = NULL;
        }
    }
    return n;
}

static void eps_evict(ote_endpoint_t **eps, size_t n) {
    for (size_t i = 0; i < n; i++) (void)ote_endpoint_evict(eps[i]);
}

/* HELLO and its answer on c, on this thread (no reader yet), bounded by dl: the key's
 * challenge-response when the source asks for it, the version, and what the source's
 * advertisement offers (RELEASE, CONNECT epochs, staged answers, GPUDirect source grants,
 * whole-parent credits). */
static ote_status_t hello(ote__tpeer_t *p, conn_t *c, ote_deadline_t dl) {
    rdma_tp_t *tp = p->tp;
    ote_ctl_hello_t h = {.role = OTE_CTL_ROLE_RDMA,
                         .addr = tp->addr,
                         .name = tp->host.self_name,
                         .frame_version = OTE_CTL_VERSION_MIN};
    rdma_auth_chan_t ch = {c, dl, NULL};
    ote_auth_io_t io = ote__rdma_auth_io(&ch);
    ote_ctl_msg_t a;
    uint16_t ver = 0;
    ote_status_t st = ote_ctl_hello_exchange(tp->host.auth_key, &h, &io, p->name, &a, &ver);
    if (st != OTE_OK) return st;
    c->version = ver;
    c->release_ok = adv_flag(&a, "rdma_release");
    c->cepoch_ok = adv_flag(&a, "rdma_connect_epoch");
    /* Staged READs of its device memory (rdma_stage=1): GRANT_REQs ask with
     * OTE_RP_GF_STAGE, and a staged GRANT_RESP is accepted from it only then. */
    c->stage_ok = adv_flag(&a, "rdma_stage");
    /* GPUDirect source grants (rdma_direct.c): the direct flags and endpoints. */
    c->direct_ok = adv_flag(&a, "rdma_direct");
    /* Its host memory by exact MRs (rdma_grant_mode mr): our runs follow its redirect to
     * direct slots, and need no window here. */
    c->grant_mr = adv_flag(&a, "rdma_grant_mr");
    if (c->grant_mr)
        OTE_INFO("rdma", "peer %s grants host memory by exact MRs (rdma_grant_mr=1)%s", p->name,
                 c->direct_ok ? "" : ", but offers no direct slot: its host memory is refused");
    /* Whole-parent credits (rdma_src_parents.c): GRANT_REQs carry their parent. */
    c->parent_ok = adv_flag(&a, "rdma_parent");
    /* Its registrations' best devices in GRANT_RESP (rdma_pairing.c): endpoints to each
     * of its devices, and runs paired by the remote buffer's locality. */
    c->pair_ok = adv_flag(&a, "rdma_pair");
    return OTE_OK;
}

/* INFO on c (the reader runs), bounded by dl: the peer's identity, checked against the
 * incarnation this segment met (a restarted peer fails it for good: a new segment meets
 * the new one), then our requester endpoints to it (rdma_pairing.h) into eps. */
static ote_status_t info_and_endpoints(ote__tpeer_t *p, conn_t *c, ote_deadline_t dl,
                                       ote_endpoint_t *eps[OTE__RDMA_MAX_NICS][OTE__RDMA_EPS]) {
    rdma_tp_t *tp = p->tp;
    ote_rp_msg_t info;
    ote__rdma_local_info(tp, &info, OTE_RP_INFO);
    ote_status_t st = ote__rdma_peer_call(p, &info, OTE_RP_INFO_ACK, dl, NULL);
    if (st == OTE_OK && (p->conn.met_epoch != 0 || p->conn.met_process != 0) &&
        !same_incarnation(p, c)) {
        OTE_WARN("rdma",
                 "peer %s restarted (epoch %016llx, was %016llx): its old endpoints are "
                 "dropped and this segment fails with OTE_ERR_PEER_LOST; open a new segment",
                 p->name, (unsigned long long)c->epoch, (unsigned long long)p->conn.met_epoch);
        p->conn.restarted = 1;
        st = OTE_ERR_PEER_LOST;
    }
    if (st == OTE_OK) st = ote__rdma_pair_endpoints(tp, c, eps);
    if (st != OTE_OK && !p->conn.restarted)
        OTE_WARN("rdma", "control handshake (INFO) with %s failed: %s", p->name,
                 ote_status_str(st));
    return st;
}

/* Sets p's connection (NULL: none) under p->mu. */
static void set_conn(ote__tpeer_t *p, conn_t *c) {
    ote_mutex_lock(&p->mu);
    p->conn.c = c;
    ote_mutex_unlock(&p->mu);
}

/* The control connection to p: connect, HELLO, the reader thread, INFO and the requester
 * endpoints, all within connect_timeout_ms. On failure nothing of it is left. */
static ote_status_t connect_ctl(ote__tpeer_t *p) {
    rdma_tp_t *tp = p->tp;
    ote_deadline_t dl = ote_deadline_after(tp->cfg.connect_timeout_ms * OTE_NSEC_PER_MSEC);
    int fd = -1;
    ote_status_t st = ote__addr_dial(p->name, dl, "rdma", &fd);
    if (st != OTE_OK) return st;
    conn_t *c = ote__rdma_conn_new(tp, fd);
    if (c == NULL) return OTE_ERR_NOMEM;
    snprintf(c->peer_addr, sizeof(c->peer_addr), "%s", p->name);
    st = hello(p, c, dl);
    if (st != OTE_OK) {
        ote__rdma_conn_put(c);
        return st;
    }
    set_conn(p, c);
    if (ote_thread_create(&p->conn.reader, NULL, reader_main, p) != 0) {
        set_conn(p, NULL);
        ote__rdma_conn_put(c);
        return OTE_ERR_NOMEM;
    }
    p->conn.reader_started = 1;
    ote_endpoint_t *eps[OTE__RDMA_MAX_NICS][OTE__RDMA_EPS];
    memset(eps, 0, sizeof(eps));
    st = info_and_endpoints(p, c, dl, eps);
    if (st != OTE_OK) {
        ote__rdma_conn_kill(c, NULL);
        pthread_join(p->conn.reader, NULL);
        p->conn.reader_started = 0;
        set_conn(p, NULL);
        ote__rdma_conn_put(c);
        return st;
    }
    ote_mutex_lock(&p->mu);
    memcpy(p->conn.ep, eps, sizeof(p->conn.ep));
    if (p->conn.met_epoch == 0 && p->conn.met_process == 0) {
        p->conn.met_epoch = c->epoch;
        p->conn.met_process = c->process;
    }
    ote_mutex_unlock(&p->mu);
    return OTE_OK;
}

static void disconnect_ctl(ote__tpeer_t *p) {
    if (p->conn.c == NULL) return;
    conn_t *c = p->conn.c;
    ote__rdma_conn_kill(c, NULL);
    if (p->conn.reader_started) pthread_join(p->conn.reader, NULL);
    p->conn.reader_started = 0;
    ote_mutex_lock(&p->mu);
    p->conn.c = NULL;
    ote_endpoint_t *eps[OTE__RDMA_EPS * OTE__RDMA_MAX_NICS];
    size_t n = eps_take(p, eps);
    ote_mutex_unlock(&p->mu);
    eps_evict(eps, n); /* the endpoints of that connection's peer: fresh ones next time */
    ote__rdma_conn_put(c);
}

void ote__rdma_peers_evict_dead(rdma_tp_t *tp) {
    ote_endpoint_t *eps[OTE__RDMA_EPS * OTE__RDMA_MAX_NICS];
    ote_mutex_lock(&tp->mu);
    for (ote__tpeer_t *p = tp->peers; p != NULL; p = p->tp_next) {
        ote_mutex_lock(&p->mu);
        size_t n = 0;
        /* Nothing of p is queued or being started: no thread is about to use its
         * endpoints (the pump fails queued slices of a dead peer without them). */
        if (p->conn.c != NULL && atomic_load(&p->conn.c->dead) && !ote__rdma_pumping(p) &&
            p->queue.head == NULL)
            n = eps_take(p, eps);
        ote_mutex_unlock(&p->mu);
        if (n > 0) {
            OTE_INFO("rdma", "peer %s lost: its %zu endpoint(s) evicted", p->name, n);
            eps_evict(eps, n);
        }
    }
    ote_mutex_unlock(&tp->mu);
}

ote_status_t ote__rdma_peer_open(ote__transport_t *t, const char *peer, ote__tpeer_t **peer_out) {
    rdma_tp_t *tp = (rdma_tp_t *)t;
    ote__tpeer_t *p = ote_calloc(1, sizeof(*p));
    if (p == NULL) return OTE_ERR_NOMEM;
    p->tp = tp;
    snprintf(p->name, sizeof(p->name), "%s", peer);
    ote_status_t st = ote_mutex_init(&p->mu);
    if (st == OTE_OK) {
        st = ote_cond_init(&p->cv);
        if (st != OTE_OK) ote_mutex_destroy(&p->mu);
    }
    if (st != OTE_OK) {
        ote_free(p);
        return st;
    }
    st = connect_ctl(p);
    if (st != OTE_OK) {
        ote_cond_destroy(&p->cv);
        ote_mutex_destroy(&p->mu);
        ote_free(p);
        return st;
    }
    ote_mutex_lock(&tp->mu);
    p->tp_next = tp->peers;
    tp->peers = p;
    ote_mutex_unlock(&tp->mu);
    *peer_out = p;
    return OTE_OK;
}

ote_status_t ote__rdma_peer_ensure(ote__tpeer_t *p) {
    if (p->conn.restarted) return OTE_ERR_PEER_LOST; /* it met another incarnation: reopen */
    if (p->conn.c != NULL && !atomic_load(&p->conn.c->dead)) return OTE_OK;
    /* Reconnect: grants that still need the old connection end on their own (their
     * answers were failed by the reader, their QPs by their CQEs or deadlines). Slices
     * still queued or being started on the old connection fail first (the pump). */
    ote_mutex_lock(&p->mu);
    int busy = p->waits.grants != NULL || p->waits.calls != NULL || p->waits.notes != NULL ||
               ote__rdma_pumping(p) || p->queue.head != NULL;
    ote_mutex_unlock(&p->mu);
    if (busy) return OTE_ERR_PEER_LOST;
    disconnect_ctl(p);
    return connect_ctl(p);
}

void ote__rdma_peer_lost(ote__tpeer_t *p) {
    ote_mutex_lock(&p->mu);
    if (p->conn.c != NULL) ote__rdma_conn_kill(p->conn.c, "the peer is gone (segment invalidated)");
    ote_mutex_unlock(&p->mu);
}

ote_status_t ote__rdma_peer_close(ote__tpeer_t *p) {
    rdma_tp_t *tp = p->tp;
    ote_mutex_lock(&tp->mu);
    for (ote__tpeer_t **pp = &tp->peers; *pp != NULL; pp = &(*pp)->tp_next) {
        if (*pp == p) {
            *pp = p->tp_next;
            break;
        }
    }
    ote_mutex_unlock(&tp->mu);
    /* Unlinked, no pump takes it any more; one may still be leaving it (the pump thread,
     * or a submitting thread whose last slice already ended). */
    ote_deadline_t pdl =
        ote_deadline_after((tp->cfg.connect_timeout_ms + 5000) * OTE_NSEC_PER_MSEC);
    ote_mutex_lock(&p->mu);
    while (ote__rdma_pumping(p) && ote_cond_wait(&p->cv, &p->mu, pdl) != OTE_ERR_TIMEOUT) {}
    int busy = ote__rdma_pumping(p);
    ote_mutex_unlock(&p->mu);
    if (busy) {
        OTE_ERROR("rdma", "peer %s: a slice pump did not end: peer kept", p->name);
        return OTE_ERR_BUSY;
    }
    disconnect_ctl(p);
    ote_cond_destroy(&p->cv);
    ote_mutex_destroy(&p->mu);
    ote_free(p);
    return OTE_OK;
}

void ote__rdma_reset_device(rdma_tp_t *tp, uint32_t k) {
    conn_t *cs[64];
    size_t n = 0;
    ote_mutex_lock(&tp->mu);
    for (ote__tpeer_t *p = tp->peers; p != NULL && n < 64; p = p->tp_next) {
        ote_mutex_lock(&p->mu); /* p->conn.c changes under it (connect / disconnect) */
        if (p->conn.c != NULL && p->conn.c->ndev != 0) {
            ote__rdma_conn_get(p->conn.c);
            cs[n++] = p->conn.c;
        }
        ote_mutex_unlock(&p->mu);
    }
    ote_mutex_unlock(&tp->mu);
    for (size_t i = 0; i < n; i++) {
        ote__rdma_pair_reset(cs[i], k);
        ote__rdma_conn_put(cs[i]);
    }
}

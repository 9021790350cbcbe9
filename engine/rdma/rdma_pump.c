/*
 * engine/rdma/rdma_pump.c - the requester's slice queues: what ote_batch_submit hands the
 * RDMA transport waits in its peer's queue, and the pump starts it a run at a time (the
 * contiguous slices of one request, up to rdma_grant_max, on the device the selector
 * picks) as each device's window and the engine-wide rdma_max_inflight allow. A
 * submitting thread pumps inline and starts only runs that find a READY QP; the pump
 * thread builds QPs and starts the rest. The monitor ends queued slices of peers waiting
 * for a build at their deadline or cancel. Lock order: tp->mu, then p->mu; nothing is
 * sent, built or ended under either.
 */
#include <stdint.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "engine/rdma/rdma_credits.h"
#include "engine/rdma/rdma_internal.h"

#define PUMP_EXPIRE_PEERS 64 /* peers whose queue the monitor ends slices of, per pass */

static void pump(ote__tpeer_t *p);

/* The engine-wide count of bytes in flight (rdma_max_inflight). */
static void all_add(rdma_tp_t *tp, uint64_t n) {
    uint64_t now = atomic_fetch_add(&tp->inflight_all, n) + n;
    uint64_t peak = atomic_load(&tp->inflight_peak);
    while (now > peak && !atomic_compare_exchange_weak(&tp->inflight_peak, &peak, now)) {}
}

/* Give n back; whether a peer waits for that room (then the caller kicks the pump thread,
 * which pumps every peer whose queue holds slices). */
int ote__rdma_all_sub(rdma_tp_t *tp, uint64_t n) {
    atomic_fetch_sub(&tp->inflight_all, n);
    return atomic_exchange(&tp->cap_wait, 0);
}

/* Whether a run of rlen bytes must wait for room under rdma_max_inflight. When it looks
 * so, the flag is raised and the count read again: all_sub clears the flag after its
 * subtraction, so an ending run either is seen by the second read or sees the flag (and
 * kicks). A lone run larger than the limit goes. */
static int fits(rdma_tp_t *tp, uint64_t rlen, uint64_t cap) {
    uint64_t all = atomic_load(&tp->inflight_all);
    return all == 0 || all + rlen <= cap;
}

static int over_cap(rdma_tp_t *tp, uint64_t rlen) {
    uint64_t cap = tp->cfg.rdma_max_inflight;
    if (cap == 0 || fits(tp, rlen, cap)) return 0;
    atomic_store(&tp->cap_wait, 1);
    if (fits(tp, rlen, cap)) return 0;
    atomic_fetch_add(&tp->cap_waits, 1);
    return 1;
}

/* A submitting thread's pump (inline): it starts what finds a READY QP and leaves the
 * rest queued for the pump thread, which it kicks. */
static void pump(ote__tpeer_t *p) {
    ote_mutex_lock(&p->mu);
    if (ote__rdma_pumping(p)) {
        p->pump.state = OTE__RDMA_PUMP_AGAIN;
        ote_mutex_unlock(&p->mu);
        return;
    }
    p->pump.state = OTE__RDMA_PUMP_BUSY;
    ote__rdma_pump_locked(p, 1);
}

/* The chunk and depth of a staged run (gpu_staging_chunk, gpu_staging_depth), and whether
 * the run from s is of a request the source serves staged (p->staged). Under p->mu. */
uint64_t ote__rdma_stage_run_chunk(const rdma_tp_t *tp) {
    return tp->cfg.gpu_staging_chunk != 0 ? tp->cfg.gpu_staging_chunk : (2u << 20);
}

static uint64_t stage_depth(const rdma_tp_t *tp) {
    return tp->cfg.gpu_staging_depth != 0 ? tp->cfg.gpu_staging_depth : 4;
}

static int staged_run(const ote__tpeer_t *p, const ote__slice_t *s) {
    if (s->req_uid != 0 && s->req_uid == p->staged.uid) return 1;
    uint64_t start = s->req_len != 0 ? s->req_remote : s->remote;
    return start >= p->staged.lo && start < p->staged.hi;
}

/* b may join the run that ends with a: the same request and op, contiguous at both ends,
 * the same deadline and cancel flag. */
static int run_joins(const ote__slice_t *a, const ote__slice_t *b) {
    return b->req_uid != 0 && b->req_uid == a->req_uid && b->op == a->op &&
           b->canceled == a->canceled && b->deadline == a->deadline &&
           b->local == a->local + a->len && b->remote == a->remote + a->len &&
           b->req_remote == a->req_remote && b->req_len == a->req_len;
}

/* The run of the queued slices from s that one grant covers: s and the slices after it
 * that join it, up to rdma_grant_max bytes and to the request's bytes divided among the
 * active devices (so one request still stripes over every NIC, with one grant on each);
 * the queue links them already. A request the source serves staged (p->staged) is
 * cut at gpu_staging_chunk: the source stages grant k+1 while grant k moves
 * (rdma_stage.c). Returns the run's last slice, its bytes in *rlen. Under p->mu. */
static ote__slice_t *run_take(const rdma_tp_t *tp, const ote__tpeer_t *p, ote__slice_t *s,
                              uint64_t *rlen) {
    uint64_t cap = tp->cfg.rdma_grant_max;
    if (cap == 0 || cap > OTE_GRANT_MAX_LEN) cap = OTE_GRANT_MAX_LEN;
    if (staged_run(p, s) && ote__rdma_stage_run_chunk(tp) < cap)
        cap = ote__rdma_stage_run_chunk(tp);
    /* Never more than the engine-wide limit of bytes in flight (one slice at least). */
    if (tp->cfg.rdma_max_inflight != 0 && tp->cfg.rdma_max_inflight < cap)
        cap = tp->cfg.rdma_max_inflight;
    uint32_t active = 0;
    for (uint32_t i = 0; i < tp->nnics; i++)
        if (ote_selector_is_active(tp->sel, (int)i)) active++;
    if (active > 1 && s->req_len != 0) {
        uint64_t share = (s->req_len + active - 1) / active;
        share = (share + s->len - 1) / s->len * s->len; /* whole slices */
        if (share < cap) cap = share;
    }
    ote__slice_t *last = s;
    uint64_t n = s->len;
    while (last->next != NULL && run_joins(last, last->next) && n + last->next->len <= cap) {
        n += last->next->len;
        last = last->next;
    }
    *rlen = n;
    return last;
}

/* Under p->mu: unlinks from p's queue the slices for which drop(x) holds (keeping the
 * others in order, its tail fixed) and returns them linked by next. */
static ote__slice_t *queue_filter(ote__tpeer_t *p, int (*drop)(const ote__slice_t *x)) {
    ote__slice_t *out = NULL, **tail = &out, **pp = &p->queue.head;
    p->queue.tail = NULL;
    while (*pp != NULL) {
        ote__slice_t *x = *pp;
        if (drop(x)) {
            *pp = x->next;
            x->next = NULL;
            *tail = x;
            tail = &x->next;
        } else {
            p->queue.tail = x;
            pp = &x->next;
        }
    }
    return out;
}

static int is_canceled(const ote__slice_t *x) {
    return x->canceled != NULL && atomic_load(x->canceled);
}

static int is_canceled_or_late(const ote__slice_t *x) {
    return is_canceled(x) || ote_deadline_expired(x->deadline);
}

/* The pump thread's part of a round, p->mu held (dropped around the calls that may wait):
 * under rdma_max_qps, room for the build asked (an idle QP retired) or the run waits
 * queued (p->pump.qp_wait; the next rounds try again, its deadline ends it), a build
 * nobody waits for any more dropped; then the build itself (rdma_build.c), whose failure
 * is for the run that waited for it (start_on takes it). */
static void pump_build(ote__tpeer_t *p) {
    rdma_tp_t *tp = p->tp;
    int held = 0; /* rdma_max_qps: room held for this round's build */
    if (p->build.state == OTE__RDMA_BUILD_WANTED_FOR_RUN && tp->cfg.rdma_max_qps != 0) {
        int room = p->queue.head != NULL;
        if (room) {
            ote_mutex_unlock(&p->mu);
            room = held = ote__rdma_qp_room(tp, 1);
            ote_mutex_lock(&p->mu);
        } else {
            ote__rdma_build_drop(p); /* nothing waits for it any more */
        }
        p->pump.qp_wait = ote__rdma_build_wanted(p) && !room;
    } else if (p->build.state == OTE__RDMA_BUILD_WANTED && tp->cfg.rdma_max_qps != 0) {
        ote_mutex_unlock(&p->mu);
        held = ote__rdma_qp_room(tp, 0); /* a background build: not past the limit */
        ote_mutex_lock(&p->mu);
        if (!held) ote__rdma_build_drop(p);
    }
    if (ote__rdma_build_wanted(p) && !p->pump.qp_wait) {
        ote__rdma_build_job_t job;
        ote__rdma_build_begin(p, &job);
        ote_mutex_unlock(&p->mu);
        ote_status_t bst = ote__rdma_build_qp(p, job.k, job.cap, job.slot);
        ote_mutex_lock(&p->mu);
        ote__rdma_build_end(p, &job, bst);
    }
    if (held) ote__rdma_qp_room_end(tp); /* built (now held as a QP) or not */
}

/* A cancel: its queued slices are dropped first (ended CANCELED with p->mu dropped). */
static void pump_purge(ote__tpeer_t *p) {
    ote__slice_t *drop = queue_filter(p, is_canceled);
    ote_mutex_unlock(&p->mu);
    while (drop != NULL) {
        ote__slice_t *x = drop;
        drop = x->next;
        x->next = NULL;
        ote__rdma_start_failed(p, x, -1, OTE_ERR_CANCELED);
    }
    ote_mutex_lock(&p->mu);
}

/* What the pump does with the run at the head of the queue (decided under p->mu). */
typedef enum {
    RUN_START, /* start it on device k */
    RUN_END,   /* end it now with st (each slice on its own when k < 0) */
    RUN_WAIT,  /* leave it queued: something it needs frees later and kicks the pump */
} run_next_t;

/* Devices whose context is active while the selector still has them out: a port event
 * handled by the context layer that the monitor's next device pass has not followed yet
 * (rdma_monitor.c). Put back now, so that a request submitted once the port is up is not
 * failed PORT_DOWN in between. 1 when one was. */
static int sel_resync(rdma_tp_t *tp) {
    int n = 0;
    for (uint32_t i = 0; i < tp->nnics; i++) {
        if (ote_selector_is_active(tp->sel, (int)i) || ote_context_check(tp->nics[i].ctx) != OTE_OK)
            continue;
        if (ote_selector_set_active(tp->sel, (int)i, 1) != OTE_OK) continue;
        atomic_fetch_add(&tp->sel_resyncs, 1);
        n = 1;
    }
    return n;
}

/* A run that may start: its grant's bytes (run_take), room in the engine-wide limit and in
 * the window for this peer (gpu_staging_depth chunks for a staged request) of a device of
 * the best rank for its memory, a device picked (none active and nothing in flight:
 * PORT_DOWN, each slice alone), and a grant credit of its request (rdma_max_grants). */
static run_next_t run_place(ote__tpeer_t *p, ote__slice_t *s, ote__slice_t **last, uint64_t *rlen,
                            int *k, ote_status_t *st) {
    rdma_tp_t *tp = p->tp;
    *last = run_take(tp, p, s, rlen);
    if (over_cap(tp, *rlen)) return RUN_WAIT; /* an ending run kicks the pump thread */
    uint64_t window = tp->cfg.rdma_grant_max > OTE__RDMA_NIC_WINDOW ? tp->cfg.rdma_grant_max
                                                                    : OTE__RDMA_NIC_WINDOW;
    if (staged_run(p, s)) window = ote__rdma_stage_run_chunk(tp) * stage_depth(tp);
    uint32_t mask = 0;
    uint64_t busy = 0;
    for (uint32_t i = 0; i < tp->nnics; i++) {
        busy += p->queue.inflight[i];
        if (p->queue.inflight[i] == 0 || p->queue.inflight[i] + *rlen <= window) mask |= 1u << i;
    }
    /* Only the nearest devices of the memory's locality: a full window there waits for
     * room (a device with nothing in flight always has room, so one of them ends a slice
     * and pumps again) instead of spilling the run onto a farther device. */
    uint32_t near = ote_selector_best_mask(tp->sel, s->mem_loc, UINT32_MAX);
    if (near != 0) mask &= near;
    if (mask == 0) return RUN_WAIT; /* every window is full: an ending slice pumps again */
    if (tp->cfg.rdma_max_qps != 0) mask = ote__rdma_qp_mask(tp, p, s, mask);
    if (ote_selector_pick(tp->sel, s->mem_loc, *rlen, mask, k) != OTE_OK) {
        *k = -1;
        if (busy > 0) return RUN_WAIT; /* no room on an active device yet */
        if (sel_resync(tp)) {          /* a device came up: this pump goes round again */
            p->pump.state = OTE__RDMA_PUMP_AGAIN;
            return RUN_WAIT;
        }
        *st = OTE_ERR_PORT_DOWN; /* no active device, nothing in flight */
        *last = s;               /* each slice ends on its own */
        *rlen = s->len;
        return RUN_END;
    }
    if (!ote__rdma_grant_take(tp, s, *rlen)) {
        /* rdma_max_grants: its request's reservation (or a slot of it) is not free; a
         * returned credit kicks the pump thread. */
        ote_selector_done(tp->sel, *k, *rlen, 0);
        p->pump.credit_wait = 1;
        return RUN_WAIT;
    }
    return RUN_START;
}

/* The run at the head of the queue: ended (canceled, past its deadline, the peer lost),
 * left queued (a source answered AGAIN: the pump thread's next rounds retry; no room), or
 * placed on a device. */
static run_next_t run_next(ote__tpeer_t *p, ote__slice_t *s, ote__slice_t **last, uint64_t *rlen,
                           int *k, ote_status_t *st) {
    *last = s;
    *rlen = s->len;
    *k = -1;
    if (is_canceled(s)) {
        *st = OTE_ERR_CANCELED;
        return RUN_END;
    }
    if (ote_deadline_expired(s->deadline)) {
        *st = OTE_ERR_TIMEOUT; /* never started: no grant after the deadline */
        if (p->build.src_refused)
            OTE_WARN_LIMITED("rdma",
                             "run to %s ends at its deadline (OTE_ERR_TIMEOUT): the "
                             "source refused its QP, holding its rdma_max_qps QPs",
                             p->name);
        return RUN_END;
    }
    if (p->conn.c == NULL || atomic_load(&p->conn.c->dead) || p->conn.ep[0][0] == NULL) {
        /* Lost, or between connections (a reconnect publishes its endpoints last; a dead
         * peer's were evicted). */
        *st = OTE_ERR_PEER_LOST;
        return RUN_END;
    }
    if (p->pump.busy_until != 0 && ote_now_ns() < p->pump.busy_until) return RUN_WAIT;
    return run_place(p, s, last, rlen, k, st);
}

/* Starts (or ends) the queued runs until the queue is empty or a run must wait, p->mu
 * held (dropped around each start). A run that needs a QP build goes back at the head,
 * its window and credits given back: a submitting thread hands over to the pump thread
 * (*handoff), the pump thread builds it in its next round. *kick: room given back that
 * another peer waits for. */
static void pump_runs(ote__tpeer_t *p, int inline_, int *handoff, int *kick) {
    rdma_tp_t *tp = p->tp;
    while (p->queue.head != NULL) {
        ote__slice_t *s = p->queue.head, *last = s;
        uint64_t rlen = s->len;
        int k = -1;
        ote_status_t st = OTE_OK;
        if (run_next(p, s, &last, &rlen, &k, &st) == RUN_WAIT) break;
        p->queue.head = last->next;
        if (p->queue.head == NULL) p->queue.tail = NULL;
        last->next = NULL;
        if (k >= 0) {
            p->queue.inflight[k] += rlen;
            all_add(tp, rlen);
        }
        ote_mutex_unlock(&p->mu);
        int r = OTE__RDMA_START_TAKEN;
        if (k >= 0) r = ote__rdma_start_on(p, s, k, inline_);
        else ote__rdma_start_failed(p, s, -1, st);
        ote_mutex_lock(&p->mu);
        if (r == OTE__RDMA_START_NEEDS_BUILD) {  /* back at the head, its window given back */
            *kick |= ote__rdma_grant_put(tp, s); /* kicked by the caller, no lock held */
            p->queue.inflight[k] -= rlen;
            *kick |= ote__rdma_all_sub(tp, rlen); /* other peers waiting for room */
            ote__rdma_run_requeue(p, s);
            if (inline_) *handoff = 1;
            else if (!p->pump.qp_wait) p->pump.state = OTE__RDMA_PUMP_AGAIN; /* build, go on */
            break;
        }
    }
}

/* The pump's rounds: p->mu held and p->pump.state taken (BUSY) by the caller; returns
 * with both released. inline_: a submitting thread, which never builds a QP: a run that needs one
 * stays at the head of the queue and the pump thread (kicked) builds it and goes on;
 * the pump thread (inline_ 0) builds what is asked first, then starts runs. */
void ote__rdma_pump_locked(ote__tpeer_t *p, int inline_) {
    rdma_tp_t *tp = p->tp;
    int handoff = 0; /* inline: a run waits for a build; the pump thread takes over */
    int kick = 0;    /* room given back that another peer waits for (rdma_max_inflight) */
    do {
        p->pump.state = OTE__RDMA_PUMP_BUSY; /* an AGAIN asked before this round is served */
        p->pump.credit_wait = 0;
        p->pump.qp_wait = 0;
        if (!inline_) pump_build(p);
        if (atomic_exchange(&p->pump.purge, 0)) pump_purge(p);
        pump_runs(p, inline_, &handoff, &kick);
        /* A failed build's status is for the run that waited for it: that run took it
         * above, or ended meanwhile (deadline, cancel); nothing older lingers. */
        if (!inline_) ote__rdma_build_round_end(p);
    } while (!handoff && p->pump.state == OTE__RDMA_PUMP_AGAIN);
    p->pump.state = OTE__RDMA_PUMP_IDLE;
    ote_cond_broadcast(&p->cv);
    ote_mutex_unlock(&p->mu);
    if (handoff || kick) ote__rdma_pump_kick(tp);
}

/* Monitor: while a peer waits for a QP build (the pump thread may be inside a slow
 * create or connect), end its queued slices whose deadline passed (TIMEOUT: never
 * started) or whose request was canceled (CANCELED), as the pump would. The source is
 * told first for all of them (write-off), then each ends: nothing here touches p after
 * the first done(). */
void ote__rdma_queue_expire(rdma_tp_t *tp) {
    ote__tpeer_t *owner[PUMP_EXPIRE_PEERS];
    ote__slice_t *lists[PUMP_EXPIRE_PEERS];
    size_t np = 0;
    ote_mutex_lock(&tp->mu);
    for (ote__tpeer_t *p = tp->peers; p != NULL && np < PUMP_EXPIRE_PEERS; p = p->tp_next) {
        ote_mutex_lock(&p->mu);
        if (!(ote__rdma_build_owed(p) || p->pump.credit_wait) || p->queue.head == NULL) {
            ote_mutex_unlock(&p->mu);
            continue;
        }
        ote__slice_t *dead = queue_filter(p, is_canceled_or_late);
        ote_mutex_unlock(&p->mu);
        if (dead != NULL) {
            owner[np] = p;
            lists[np++] = dead;
        }
    }
    ote_mutex_unlock(&tp->mu);
    /* The peers stay open while these slices are outstanding (the engine closes a peer
     * only when none of its slices is). */
    for (size_t i = 0; i < np; i++)
        for (ote__slice_t *x = lists[i]; x != NULL; x = x->next)
            ote__rdma_slice_write_off(owner[i], x);
    for (size_t i = 0; i < np; i++) {
        ote__slice_t *x = lists[i];
        while (x != NULL) {
            ote__slice_t *nx = x->next;
            x->next = NULL;
            int canceled = x->canceled != NULL && atomic_load(x->canceled);
            OTE_WARN_LIMITED("rdma",
                             "slice to %s waited queued (a QP build, QP limit rdma_max_qps=%u, "
                             "or grant credits) past its %s: ended",
                             owner[i]->name, owner[i]->tp->cfg.rdma_max_qps,
                             canceled ? "cancel" : "deadline");
            ote__rdma_parent_slice_end(x);
            x->done(x, canceled ? OTE_ERR_CANCELED : OTE_ERR_TIMEOUT);
            x = nx;
        }
    }
}

/* Notifications go out at once; READ/WRITE slices join the peer's queue, which the pump
 * starts as the devices' windows allow. */
void ote__rdma_submit(ote__tpeer_t *p, ote__slice_t *list) {
    /* Read now: once a notification below is on its way, it may be answered and its
     * segment (and p) closed before this returns; the transport outlives this call. */
    rdma_tp_t *tp = p->tp;
    int queued = 0;
    while (list != NULL) {
        ote__slice_t *s = list;
        list = s->next;
        s->next = NULL;
        if (s->canceled != NULL && atomic_load(s->canceled)) {
            if (s->op != OTE__SLICE_NOTIFY) ote__rdma_slice_write_off(p, s);
            s->done(s, OTE_ERR_CANCELED);
        } else if (s->op == OTE__SLICE_NOTIFY) {
            ote__rdma_submit_notify(p, s);
        } else if (ote__rdma_parent_attach(p, s) != OTE_OK) {
            ote__rdma_slice_write_off(p, s);
            s->done(s, OTE_ERR_NOMEM);
        } else {
            ote__rdma_xp(s)->retries = 0;
            ote__rdma_xp(s)->direct = 0;
            ote__rdma_xp(s)->plain = 0;
            ote_mutex_lock(&p->mu);
            if (p->queue.tail != NULL) p->queue.tail->next = s;
            else p->queue.head = s;
            p->queue.tail = s;
            ote_mutex_unlock(&p->mu);
            queued = 1;
        }
    }
    if (queued) pump(p);
    ote__rdma_monitor_wake(tp); /* deadlines to keep now (rdma_monitor.c) */
}

/* Queued slices of canceled requests end (CANCELED, never started, their bytes written
 * off at the source) at the pump thread's next round, which this kick brings at once;
 * started ones end through their grants, which post none of their unposted slices, let
 * what is posted complete and invalidate the window by the usual receipt (the source
 * releases it at once); a grant not answered yet posts nothing once answered. So a
 * canceled request ends CANCELED only once nothing of it can still move. Called with no
 * engine lock held; ends nothing itself. */
void ote__rdma_cancel(ote__tpeer_t *p) {
    atomic_store(&p->pump.purge, 1);
    ote__rdma_pump_kick(p->tp);
}

void ote__rdma_pump_kick(rdma_tp_t *tp) {
    ote_mutex_lock(&tp->mu);
    tp->pump_kick = 1;
    ote_cond_signal(&tp->pump_cv);
    ote_mutex_unlock(&tp->mu);
}

#define PUMP_BATCH 64

/* Pumps every peer whose queue holds slices (or has a cancel to apply) when kicked, and
 * every 10 ms while some peer has such work, in case a kick raced with a peer's pump;
 * with none anywhere it waits up to 100 ms for a kick (an idle engine wakes 10 times a
 * second, not 100). A peer is taken (its pump BUSY) under tp->mu while it is in
 * tp->peers; peer_close unlinks it first and then waits for its pump to end, so it is
 * never freed under this thread. */
void *ote__rdma_pumper_main(void *arg) {
    rdma_tp_t *tp = arg;
    int work = 1; /* some peer had work at the last round */
    ote_mutex_lock(&tp->mu);
    while (!atomic_load(&tp->stop)) {
        if (!tp->pump_kick)
            (void)ote_cond_wait(&tp->pump_cv, &tp->mu,
                                ote_deadline_after((work ? 10 : 100) * OTE_NSEC_PER_MSEC));
        tp->pump_kick = 0;
        work = 0;
        ote__tpeer_t *take[PUMP_BATCH];
        size_t n = 0;
        for (ote__tpeer_t *p = tp->peers; p != NULL; p = p->tp_next) {
            ote_mutex_lock(&p->mu);
            int has =
                p->queue.head != NULL || atomic_load(&p->pump.purge) || ote__rdma_build_wanted(p);
            work |= has;
            if (has && !ote__rdma_pumping(p)) {
                if (n < PUMP_BATCH) {
                    p->pump.state = OTE__RDMA_PUMP_BUSY;
                    take[n++] = p;
                } else {
                    tp->pump_kick = 1; /* the rest next round */
                }
            }
            ote_mutex_unlock(&p->mu);
        }
        ote_mutex_unlock(&tp->mu);
        for (size_t i = 0; i < n; i++) {
            ote_mutex_lock(&take[i]->mu);
            ote__rdma_pump_locked(take[i], 0);
        }
        ote_mutex_lock(&tp->mu);
    }
    ote_mutex_unlock(&tp->mu);
    return NULL;
}

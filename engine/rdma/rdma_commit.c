/*
 * engine/rdma/rdma_commit.c - the requester's side of staged WRITEs (source-side staging,
 * rdma_internal.h): a WRITE grant whose answer says OTE_RP_RESP_COMMIT wrote into the
 * source's bounce buffer, not into its device memory; the source copies it to the device
 * after the grant's receipt and says how that went with a COMMIT. The run of such a
 * grant ends only then, whether its grant ended OK, failed or was canceled (the source
 * may copy a canceled grant's bounce too, and nothing may touch the range after its
 * request ended): with the grant's own failure, else the COMMIT's status, or with
 * OTE_ERR_PEER_LOST when the connection is lost first, or OTE_ERR_TIMEOUT at the run's
 * deadline. A COMMIT that names
 * no wait of this peer (another grant id, another rkey, a grant whose run already ended,
 * a source that was never asked) changes nothing.
 */
#include <stdint.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "engine/rdma/rdma_internal.h"
#include "ote/ote.h"

ote_status_t ote__rdma_commit_expect(ote__tpeer_t *p, uint64_t id, uint32_t rkey,
                                     const gid_ent_t *g) {
    cwait_t *w = ote_calloc(1, sizeof(*w));
    if (w == NULL) return OTE_ERR_NOMEM;
    w->id = id;
    w->rkey = rkey;
    w->s = g->s; /* only a name: the run may have ended before its answer came */
    w->uid = g->req_uid;
    w->deadline = g->deadline;
    ote_mutex_lock(&p->mu);
    w->next = p->waits.commits;
    p->waits.commits = w;
    ote_mutex_unlock(&p->mu);
    return OTE_OK;
}

/* Under p->mu: unlink and return the wait that matches. */
static cwait_t *take_locked(ote__tpeer_t *p, uint64_t id, const ote__slice_t *s) {
    for (cwait_t **pp = &p->waits.commits; *pp != NULL; pp = &(*pp)->next) {
        cwait_t *w = *pp;
        if (s != NULL ? w->s == s && w->uid == s->req_uid : w->id == id) {
            *pp = w->next;
            return w;
        }
    }
    return NULL;
}

void ote__rdma_commit_drop(ote__tpeer_t *p, uint64_t id) {
    ote_mutex_lock(&p->mu);
    cwait_t *w = take_locked(p, id, NULL);
    ote_mutex_unlock(&p->mu);
    ote_free(w);
}

int ote__rdma_commit_park(ote__tpeer_t *p, ote__slice_t *s, ote_status_t *st) {
    ote_mutex_lock(&p->mu);
    cwait_t *w = NULL;
    for (w = p->waits.commits; w != NULL && !(w->s == s && w->uid == s->req_uid); w = w->next) {}
    if (w == NULL) {
        ote_mutex_unlock(&p->mu);
        return 0; /* not a staged WRITE */
    }
    if (!w->got) {
        /* Even a failed or canceled grant waits: the source may still copy its bounce
         * to the device (its receipt came), and nothing may touch the range after the
         * request ended. The COMMIT, the connection's loss or the deadline ends it. */
        w->parked = 1;
        w->gst = *st;
        ote_mutex_unlock(&p->mu);
        return 1;
    }
    (void)take_locked(p, 0, s);
    ote_mutex_unlock(&p->mu);
    /* The COMMIT (or the loss of the connection) came first: a failed grant keeps its
     * own status (no COMMIT makes it succeed). */
    if (*st == OTE_OK) *st = w->st;
    ote_free(w);
    return 0;
}

void ote__rdma_commit_on_msg(ote__tpeer_t *p, uint64_t id, ote_status_t st, uint32_t rkey) {
    ote_mutex_lock(&p->mu);
    cwait_t *w = NULL;
    for (w = p->waits.commits; w != NULL && w->id != id; w = w->next) {}
    if (w == NULL || w->rkey != rkey || w->got) {
        ote_mutex_unlock(&p->mu);
        OTE_WARN_LIMITED("rdma",
                         "COMMIT from %s for grant %llx (window 0x%x) names no staged WRITE "
                         "waiting for one: ignored",
                         p->name, (unsigned long long)id, rkey);
        return;
    }
    if (!w->parked) { /* its grant has not ended yet: it takes the status then */
        w->got = 1;
        w->st = st;
        ote_mutex_unlock(&p->mu);
        return;
    }
    (void)take_locked(p, id, NULL);
    ote_mutex_unlock(&p->mu);
    if (st != OTE_OK && w->gst == OTE_OK)
        OTE_WARN_LIMITED("rdma", "staged WRITE to %s not committed to device memory there: %s",
                         p->name, ote_status_str(st));
    ote__rdma_run_finish(w->s, w->gst != OTE_OK ? w->gst : st);
    ote_free(w);
}

void ote__rdma_commits_lost(ote__tpeer_t *p) {
    cwait_t *done = NULL;
    ote_mutex_lock(&p->mu);
    for (cwait_t **pp = &p->waits.commits; *pp != NULL;) {
        cwait_t *w = *pp;
        if (!w->parked) {
            if (!w->got) {
                w->got = 1;
                w->st = OTE_ERR_PEER_LOST;
            }
            pp = &w->next;
            continue;
        }
        *pp = w->next;
        w->next = done;
        done = w;
    }
    ote_mutex_unlock(&p->mu);
    while (done != NULL) {
        cwait_t *w = done;
        done = w->next;
        ote__rdma_run_finish(w->s, w->gst != OTE_OK ? w->gst : OTE_ERR_PEER_LOST);
        ote_free(w);
    }
}

void ote__rdma_commits_expire(rdma_tp_t *tp) {
    uint64_t now = ote_now_ns();
    cwait_t *done = NULL;
    ote_mutex_lock(&tp->mu);
    for (ote__tpeer_t *p = tp->peers; p != NULL; p = p->tp_next) {
        ote_mutex_lock(&p->mu);
        for (cwait_t **pp = &p->waits.commits; *pp != NULL;) {
            cwait_t *w = *pp;
            if (!w->parked || w->deadline > now) {
                pp = &w->next;
                continue;
            }
            *pp = w->next;
            w->next = done;
            done = w;
            OTE_WARN("rdma", "staged WRITE to %s: no COMMIT by its deadline: failed", p->name);
        }
        ote_mutex_unlock(&p->mu);
    }
    ote_mutex_unlock(&tp->mu);
    while (done != NULL) {
        cwait_t *w = done;
        done = w->next;
        ote__rdma_run_finish(w->s, w->gst != OTE_OK ? w->gst : OTE_ERR_TIMEOUT);
        ote_free(w);
    }
}

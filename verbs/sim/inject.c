/*
 * verbs/sim/inject.c - lane and route faults of the sim on demand: a CQ made unusable as
 * by an overrun (ote_sim_cq_error), and the schedule of $OTE_SIM_INJECT, which raises
 * the same CQ error and a GID change after a number of CQEs polled (syntax in sim.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "verbs/sim/sim_internal.h"

/* Mark cq unusable (poll fails -EIO) and raise IBV_EVENT_CQ_ERR naming it, and QP_FATAL
 * for the QPs on it, as an overrun does. Caller holds p->mu, not cq->mu. */
static void cq_error_locked(sim_prov_t *p, sim_cq_t *cq) {
    ote_mutex_lock(&cq->mu);
    int already = cq->overflowed;
    cq->overflowed = true;
    ote_mutex_unlock(&cq->mu);
    if (already) return;
    ote__sim_handle_overflow(p); /* the CQ_ERR of a CQ with QPs, and their QP_FATAL */
    if (!cq->overflow_handled) { /* a CQ no QP uses: its CQ_ERR all the same */
        cq->overflow_handled = true;
        struct ibv_async_event ev;
        memset(&ev, 0, sizeof(ev));
        ev.event_type = IBV_EVENT_CQ_ERR;
        ev.element.cq = &cq->ibcq;
        ote__sim_async_push(cq->ctx, &ev);
    }
}

ote_status_t ote_sim_cq_error(ote_verbs_t *v, struct ibv_cq *ibcq) {
    if (!ote_sim_is_sim(v) || !ibcq) return OTE_ERR_INVALID;
    sim_prov_t *p = to_sim_prov(v);
    ote_mutex_lock(&p->mu);
    cq_error_locked(p, to_sim_cq(ibcq));
    ote_mutex_unlock(&p->mu);
    OTE_INFO(SIM_LOG, "sim: CQ %p made unusable (CQ_ERR raised)", (void *)ibcq);
    return OTE_OK;
}

/* One "key=N" item of $OTE_SIM_INJECT. */
static ote_status_t parse_item(sim_prov_t *p, const char *item, size_t len) {
    char buf[64];
    if (len == 0 || len >= sizeof buf) return OTE_ERR_INVALID;
    memcpy(buf, item, len);
    buf[len] = '\0';
    char *eq = strchr(buf, '=');
    if (eq == NULL) return OTE_ERR_INVALID;
    *eq = '\0';
    char *end = NULL;
    errno = 0;
    unsigned long long n = strtoull(eq + 1, &end, 10);
    if (errno != 0 || end == eq + 1 || *end != '\0' || n == 0) return OTE_ERR_INVALID;
    if (strcmp(buf, "cq_error") == 0) p->inject_cq_error_at = n;
    else if (strcmp(buf, "gid_change") == 0) p->inject_gid_change_at = n;
    else return OTE_ERR_INVALID;
    return OTE_OK;
}

ote_status_t ote__sim_inject_parse(sim_prov_t *p) {
    const char *env = getenv("OTE_SIM_INJECT");
    if (env == NULL || *env == '\0') return OTE_OK;
    for (const char *s = env; *s != '\0';) {
        const char *comma = strchr(s, ',');
        size_t len = comma != NULL ? (size_t)(comma - s) : strlen(s);
        if (parse_item(p, s, len) != OTE_OK) {
            OTE_WARN(SIM_LOG,
                     "sim: OTE_SIM_INJECT=%s: expected cq_error=N and/or gid_change=N "
                     "(N > 0 CQEs), comma-separated",
                     env);
            return OTE_ERR_INVALID;
        }
        s += len;
        if (*s == ',') s++;
    }
    OTE_INFO(SIM_LOG, "sim: OTE_SIM_INJECT: CQ error after %llu CQEs, GID change after %llu",
             (unsigned long long)p->inject_cq_error_at,
             (unsigned long long)p->inject_gid_change_at);
    return OTE_OK;
}

/* A fresh GID for every valid IPv4-mapped GID of the port: 10.x.y.z becomes 11.x.y.z
 * (another host's address, as after a renumbering), each with GID_CHANGE. */
static void change_gids(sim_prov_t *p, sim_dev_t *d, uint8_t port) {
    sim_port_t *pt = &d->ports[port - 1];
    for (int i = 0; i < pt->ngid; i++) {
        ote_mutex_lock(&p->mu);
        sim_gid_t g = pt->gids[i];
        ote_mutex_unlock(&p->mu);
        if (!g.valid || g.gid.raw[10] != 0xff || g.gid.raw[11] != 0xff) continue;
        g.gid.raw[12] = (uint8_t)(g.gid.raw[12] + 1);
        ote_status_t st = ote_sim_set_gid(&p->v, d->ibdev.name, port, i, &g.gid, g.type);
        OTE_INFO(SIM_LOG, "sim: OTE_SIM_INJECT: %s port %u GID index %d changed: %s", d->ibdev.name,
                 (unsigned)port, i, ote_status_str(st));
    }
}

void ote__sim_inject_polled(sim_prov_t *p, sim_cq_t *cq, int got) {
    if (got <= 0 || (p->inject_cq_error_at == 0 && p->inject_gid_change_at == 0)) return;
    uint64_t before = atomic_fetch_add(&p->inject_polled, (uint64_t)got);
    uint64_t after = before + (uint64_t)got;
    if (p->inject_cq_error_at != 0 && before < p->inject_cq_error_at &&
        after >= p->inject_cq_error_at) {
        OTE_INFO(SIM_LOG, "sim: OTE_SIM_INJECT: CQ error after %llu CQEs",
                 (unsigned long long)after);
        ote_mutex_lock(&p->mu);
        cq_error_locked(p, cq);
        ote_mutex_unlock(&p->mu);
    }
    if (p->inject_gid_change_at != 0 && before < p->inject_gid_change_at &&
        after >= p->inject_gid_change_at)
        change_gids(p, cq->ctx->dev, 1);
}

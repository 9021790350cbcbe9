/*
 * engine/rdma/rdma_monitor.c - the RDMA transport's monitor thread: async events of the
 * data devices, the grant managers' ticks (grant deadlines, retained windows), the
 * deadlines of notifications, staged commits and slices queued behind a QP build, the
 * devices' port state (selector), the recovery of failed CQ lanes and of QPs built on
 * a route that changed, and every 50 ms the reclaim of MRs, ended server threads, dead
 * peers and evicted endpoints.
 *
 * Lane recovery: a lane that reported an error (cq/lane.h: a CQ_ERR event naming its CQ,
 * a failed poll) is FAULTED. Its QPs, in both endpoint stores, are retired and abandoned
 * (qp/qp.h: fenced, natively destroyed, their owed WRs ended with the lane's cause,
 * OTE_ERR_FENCED: the requests on them end FENCED, this engine's device, never a peer's
 * loss), the stores' reclaim destroys them once their grants gave them back, and the
 * lane replaces its CQs in place. The PD, the registrations' MRs, the workers and the
 * lane's namespaces stay; the slots are built anew on the new CQs by the next runs.
 *
 * Route recovery: a change of the context's route generation (context/events.c: GID,
 * LID or MTU changed, or the port came back up) fences every QP built on an older
 * generation (ote_qp_route_generation) with OTE_ERR_FENCED (errno ENETRESET): they drain
 * (their flushes end their work) and leave their slots, which are rebuilt on the new
 * route. The generation is read before the QPs are looked at, and only QPs built before
 * it are fenced: a QP built on the new route is never fenced by it. A lost event consumer
 * (OTE_CONTEXT_LOST: get_async_event failed) bumps the generation too: every QP of the
 * device is fenced with the context's status (OTE_ERR_FENCED, EIO), and as the context
 * admits nothing, no QP is built there (the selector drops the device) until its reopen
 * (rdma_reopen.c: drained, unbound from the old native context, reopened, rebuilt, resumed)
 * brings it back; the lane pass leaves its lanes to that reopen.
 *
 * Cadence: every 2 ms while anything with a deadline is live (a grant, a run in flight,
 * a queued slice, a notification or commit awaited, a staged copy); otherwise it sleeps
 * until a device's async fd is readable, work arrives (ote__rdma_monitor_wake: a
 * submission, a grant asked of this source, a notification sent) or 100 ms pass. An idle
 * engine thus wakes 10 times a second instead of 500, which is what lets a thousand
 * engines share a host (tests/engine/rdma_scale_test.cc). A wake that races with the
 * decision to sleep is never lost: the monitor publishes that it is idle, then checks
 * once more for work, then waits on the eventfd that a wake writes only while the
 * monitor says idle.
 */
#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "base/log.h"
#include "base/thread.h"
#include "engine/rdma/rdma_internal.h"

#define MONITOR_BUSY_MS 2
#define MONITOR_IDLE_MS 100
#define MONITOR_MAX_FDS 17 /* the eventfd and up to 16 devices' async fds */

/* The monitor's view of each data device: a port that went down leaves the selector (its
 * unstarted slices go elsewhere), one that is active again (an event, or the periodic
 * refresh that catches a missed PORT_ACTIVE) comes back. */
static void nics_watch(rdma_tp_t *tp, int refresh) {
    for (uint32_t i = 0; i < tp->nnics; i++) {
        rdma_nic_t *n = &tp->nics[i];
        if (refresh) (void)ote_context_refresh(n->ctx);
        int up = ote_context_check(n->ctx) == OTE_OK;
        /* The data path may mark a device down before the monitor sees it (a start that
         * failed on it): the selector follows the context's state at each change and at
         * each refresh. */
        int changed = up != atomic_load(&n->was_active);
        if ((changed || refresh) && ote_selector_is_active(tp->sel, (int)i) != up)
            (void)ote_selector_set_active(tp->sel, (int)i, up);
        if (!changed) continue;
        atomic_store(&n->was_active, up);
        if (up) atomic_fetch_add(&tp->dev_gen, 1); /* sources move paused pairs back */
        /* Its QPs are gone: the peers end the grants they serve for them now, rather than
         * at their deadlines, so the slots can be rebuilt when the port is back. */
        if (!up && tp->nnics > 1) ote__rdma_reset_device(tp, i);
        OTE_INFO("rdma", "data device %s %s", ote_context_name(n->ctx),
                 up ? "active: carries slices again" : "down: no new slices");
    }
}

/* Failed lanes of every data device: their QPs fenced and destroyed, then the lane's CQs
 * replaced (when a QP still holds the lane, e.g. a retained one, a later round retries). */
static void lanes_watch(rdma_tp_t *tp) {
    for (uint32_t i = 0; i < tp->nnics; i++) {
        rdma_nic_t *n = &tp->nics[i];
        for (uint32_t l = 0; l < n->nlanes; l++) {
            ote_cq_lane_t *lane = n->lanes[l];
            ote_status_t cause = OTE_OK;
            /* A lost device's lanes are unbound and made anew by its reopen. */
            if (ote_context_state(n->ctx) == OTE_CONTEXT_LOST) break;
            if (lane == NULL || ote_cq_lane_state(lane, &cause) != OTE_CQ_LANE_FAULTED) continue;
            ote_endpoint_store_t *stores[2] = {n->eps, n->deps};
            for (int k = 0; k < 2; k++) {
                size_t fenced = 0;
                if (stores[k] == NULL) continue;
                ote_deadline_t dl = ote_deadline_after(200 * OTE_NSEC_PER_MSEC);
                (void)ote_endpoint_store_fence(stores[k], lane, 0, cause, 1, dl, &fenced);
                atomic_fetch_add(&tp->lane_fenced_qps, fenced);
                (void)ote_endpoint_store_reclaim(stores[k], dl, NULL);
            }
            if (ote_cq_lane_replace(lane) != OTE_OK) continue;
            atomic_fetch_add(&tp->lane_replacements, 1);
            OTE_INFO("rdma", "data device %s: CQ lane %u replaced after %s; PD and MRs kept",
                     ote_context_name(n->ctx), l, ote_status_str(cause));
        }
    }
}

/* QPs built on a route older than the context's: fenced (see the header comment). */
static void routes_watch(rdma_tp_t *tp) {
    for (uint32_t i = 0; i < tp->nnics; i++) {
        rdma_nic_t *n = &tp->nics[i];
        ote_context_info_t info;
        ote_context_get_info(n->ctx, &info);
        if (n->route_gen == 0) n->route_gen = info.route_generation;
        if (info.route_generation == n->route_gen) continue;
        n->route_gen = info.route_generation;
        /* A port that went down: its QPs were fenced by PORT_ERR already (qp/qp.h). A lost
         * event consumer fences them with the context's own status. */
        if (info.state == OTE_CONTEXT_PAUSED || info.state == OTE_CONTEXT_FATAL) continue;
        ote_status_t cause = info.state == OTE_CONTEXT_LOST
                                 ? ote_context_check(n->ctx)
                                 : ote_status_make(OTE_ERR_FENCED, ENETRESET);
        size_t total = 0;
        ote_endpoint_store_t *stores[2] = {n->eps, n->deps};
        for (int k = 0; k < 2; k++) {
            size_t fenced = 0;
            if (stores[k] == NULL) continue;
            (void)ote_endpoint_store_fence(stores[k], NULL, info.route_generation, cause, 0,
                                           ote_deadline_after(0), &fenced);
            total += fenced;
        }
        atomic_fetch_add(&tp->route_fenced_qps, total);
        if (total > 0 && info.state == OTE_CONTEXT_LOST)
            OTE_WARN("rdma", "data device %s: event consumer lost: %zu QP(s) fenced",
                     ote_context_name(n->ctx), total);
        else if (total > 0)
            OTE_INFO("rdma",
                     "data device %s: route changed (generation %llu, GID index %d, MTU %d): "
                     "%zu QP(s) of the old route fenced, rebuilt on demand",
                     ote_context_name(n->ctx), (unsigned long long)info.route_generation,
                     info.gid_index, (int)info.active_mtu, total);
    }
}

/* The 50 ms chores: MRs whose dereg failed (exact MRs of grants, temporary ones,
 * bounces'), what ended server threads left, dead peers, evicted endpoints. */
static void reclaim(rdma_tp_t *tp) {
    if (tp->bm != NULL) (void)ote_buffer_manager_reclaim(tp->bm, NULL);
    ote__rdma_servers_reap(tp);
    ote__rdma_peers_evict_dead(tp);
    for (uint32_t i = 0; i < tp->nnics; i++) {
        (void)ote_endpoint_store_reclaim(tp->nics[i].eps,
                                         ote_deadline_after(200 * OTE_NSEC_PER_MSEC), NULL);
        (void)ote_endpoint_store_reclaim(tp->nics[i].deps,
                                         ote_deadline_after(200 * OTE_NSEC_PER_MSEC), NULL);
    }
}

/* 1 while a LOST device drains or is rebuilt (rdma_reopen.c): the 2 ms rounds drive it;
 * a reopen waiting out its backoff (at least 100 ms) needs only the idle rounds. */
static int reopening(rdma_tp_t *tp) {
    for (uint32_t i = 0; i < tp->nnics; i++)
        if (ote_context_state(tp->nics[i].ctx) == OTE_CONTEXT_LOST &&
            tp->nics[i].reopen != RDMA_REOPEN_UNBOUND)
            return 1;
    return 0;
}

/* One round of the monitor's work; returns nonzero when something with a deadline is
 * live (the next round comes in 2 ms). */
static int monitor_round(rdma_tp_t *tp, uint64_t *last_refresh, uint64_t *last_reclaim) {
    (void)ote_context_set_poll_events(tp->set, NULL);
    size_t live = 0;
    for (uint32_t i = 0; i < tp->nnics; i++) live += ote_grant_mgr_tick(tp->nics[i].gm);
    int pending = ote__rdma_notes_expire(tp);
    uint64_t now = ote_now_ns();
    int refresh = now - *last_refresh > 1000 * OTE_NSEC_PER_MSEC;
    if (refresh) *last_refresh = now;
    nics_watch(tp, refresh);
    lanes_watch(tp);
    routes_watch(tp);
    ote__rdma_reopen_watch(tp);
    if (now - *last_reclaim > 50 * OTE_NSEC_PER_MSEC) {
        *last_reclaim = now;
        reclaim(tp);
    }
    return live != 0 || pending || reopening(tp) || atomic_load(&tp->inflight_all) != 0 ||
           atomic_load(&tp->src_copies) != 0;
}

/* Sleeps until the eventfd or an async fd is readable, or ms pass; drains the eventfd. */
static void monitor_sleep(rdma_tp_t *tp, int ms) {
    struct pollfd pf[MONITOR_MAX_FDS];
    int fds[MONITOR_MAX_FDS - 1];
    size_t n = ote_context_set_async_fds(tp->set, fds, MONITOR_MAX_FDS - 1);
    pf[0].fd = tp->monitor_efd;
    pf[0].events = POLLIN;
    for (size_t i = 0; i < n; i++) {
        pf[i + 1].fd = fds[i];
        pf[i + 1].events = POLLIN;
    }
    if (poll(pf, (nfds_t)(n + 1), ms) > 0 && (pf[0].revents & POLLIN)) {
        uint64_t v;
        (void)!read(tp->monitor_efd, &v, sizeof v);
    }
}

static void *monitor_main(void *arg) {
    rdma_tp_t *tp = arg;
    uint64_t last_reclaim = 0, last_refresh = 0;
    while (!atomic_load(&tp->stop)) {
        if (monitor_round(tp, &last_refresh, &last_reclaim)) {
            struct timespec ts = {0, MONITOR_BUSY_MS * 1000 * 1000};
            nanosleep(&ts, NULL);
            continue;
        }
        /* Idle: say so, then look once more (a wake before the store found the monitor
         * busy and wrote nothing), then sleep until woken. */
        atomic_store(&tp->monitor_idle, 1);
        if (!monitor_round(tp, &last_refresh, &last_reclaim) && !atomic_load(&tp->stop))
            monitor_sleep(tp, MONITOR_IDLE_MS);
        atomic_store(&tp->monitor_idle, 0);
    }
    return NULL;
}

void ote__rdma_monitor_wake(rdma_tp_t *tp) {
    if (!atomic_load(&tp->monitor_idle) || tp->monitor_efd < 0) return;
    uint64_t one = 1;
    (void)!write(tp->monitor_efd, &one, sizeof one);
}

ote_status_t ote__rdma_monitor_start(rdma_tp_t *tp) {
    tp->monitor_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (tp->monitor_efd < 0) {
        int err = errno;
        OTE_ERROR("rdma", "monitor: eventfd failed: %s", strerror(err));
        return ote_status_make(OTE_ERR_NATIVE, err);
    }
    if (ote_thread_create(&tp->monitor, NULL, monitor_main, tp) != 0) {
        close(tp->monitor_efd);
        tp->monitor_efd = -1;
        return OTE_ERR_NOMEM;
    }
    tp->monitor_started = 1;
    return OTE_OK;
}

void ote__rdma_monitor_join(rdma_tp_t *tp) {
    if (tp->monitor_started) {
        atomic_store(&tp->monitor_idle, 1); /* stop is set: the wake must write */
        ote__rdma_monitor_wake(tp);
        pthread_join(tp->monitor, NULL);
        tp->monitor_started = 0;
    }
    if (tp->monitor_efd >= 0) close(tp->monitor_efd);
    tp->monitor_efd = -1;
}

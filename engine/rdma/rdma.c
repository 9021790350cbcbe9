/*
 * engine/rdma/rdma.c - the RDMA transport's lifecycle: creation (provider, contexts,
 * buffer manager, lanes and their workers, grant manager, endpoint store, monitor
 * thread (rdma_monitor.c); control connections come from the engine's listener),
 * teardown, the engine's registration hooks and the transport ops table.
 * What the transport owns, its control-plane rules and its lock order are described in
 * rdma_internal.h; each job lives in its own file there.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/list.h"
#include "base/log.h"
#include "base/thread.h"
#include "engine/rdma/rdma_credits.h"
#include "engine/rdma/rdma_src_parents.h"
#include "engine/rdma/rdma_internal.h"
#include "engine/rdma/rdma_stage.h"
#include "engine/rdma/rdma_hooks.h"
#include "verbs/sim/sim.h"

/* Teardown's wait for the flush CQEs of the grants it ended (at most; shorter when
 * transfer_timeout_ms + 2 s is). */
#define OTE__RDMA_TEARDOWN_GRANTS_MS 10000

static _Atomic uint64_t ote__rdma_retained_transports;
ote__rdma_hooks_t ote__rdma_hooks;
uint64_t ote__rdma_retained_transports_get(void) {
    return atomic_load(&ote__rdma_retained_transports);
}

/* ---- registrations (engine hooks) ------------------------------------------------ */

static ote_status_t rdma_mem_register(ote__transport_t *t, void *addr, size_t len, unsigned perms) {
    rdma_tp_t *tp = (rdma_tp_t *)t;
    /* Peers' permissions are enforced per grant against the engine's registry. */
    reg_ent_t *r = ote_calloc(1, sizeof(*r));
    if (r == NULL) return OTE_ERR_NOMEM;
    /* Local-only and MW-bindable: a peer reaches it only through a grant's window. The
     * kernel pins an MR with MW_BIND or LOCAL_WRITE for writing (ib_umem_get), so a
     * read-only mapping cannot have one: refused up front, with the reason. */
    if (!(perms & OTE__MEM_WRITABLE)) {
        ote_free(r);
        OTE_WARN("rdma",
                 "registration of [%p, +%zu) refused: rdma serves host memory through "
                 "memory windows, whose MR the NIC pins for writing, and this range is "
                 "mapped read-only here (map it writable, MAP_PRIVATE is enough, or leave "
                 "rdma out of transports)",
                 addr, len);
        return OTE_ERR_UNSUPPORTED;
    }
    /* MW-bindable only when windows grant it (rdma_grant_mode: exact MRs need no bind). */
    int mw = tp->grant_mode == OTE__RDMA_GRANT_MW ? IBV_ACCESS_MW_BIND : 0;
    ote_status_t st = ote_buffer_register(tp->bm, addr, len, IBV_ACCESS_LOCAL_WRITE | mw, &r->buf);
    if (st != OTE_OK) {
        ote_free(r);
        OTE_WARN("rdma", "registration of [%p, +%zu) failed: %s", addr, len, ote_status_str(st));
        return st;
    }
    r->addr = addr;
    r->len = len;
    r->dmabuf_fd = -1; /* host memory */
    ote_mutex_lock(&tp->mu);
    r->next = tp->regs;
    tp->regs = r;
    ote_mutex_unlock(&tp->mu);
    return OTE_OK;
}

static ote_status_t rdma_mem_unregister(ote__transport_t *t, void *addr) {
    rdma_tp_t *tp = (rdma_tp_t *)t;
    ote_mutex_lock(&tp->mu);
    reg_ent_t **pp = &tp->regs;
    while (*pp != NULL && (*pp)->addr != addr) pp = &(*pp)->next;
    if (*pp == NULL) {
        ote_mutex_unlock(&tp->mu);
        return OTE_ERR_NOT_FOUND;
    }
    reg_ent_t *r = *pp;
    ote_status_t st = ote_buffer_deregister(tp->bm, r->buf);
    if (st == OTE_OK) *pp = r->next;
    ote_mutex_unlock(&tp->mu);
    if (st == OTE_OK) ote__rdma_direct_reg_end(r);
    if (st == OTE_OK) ote_free(r);
    return st;
}

void ote__rdma_local_info(const rdma_tp_t *tp, ote_rp_msg_t *rp, uint16_t type) {
    memset(rp, 0, sizeof(*rp));
    rp->type = type;
    rp->u.info.process = tp->process_id;
    rp->u.info.pd = tp->pd_id;
    rp->u.info.nic = ote_context_nic_id(tp->nics[0].ctx);
    rp->u.info.lanes = tp->nics[0].nlanes;
    rp->u.info.ndev = tp->nnics;
    for (uint32_t i = 0; i < tp->nnics; i++)
        rp->u.info.nics[i] = ote_context_nic_id(tp->nics[i].ctx);
    rp->u.info.epoch = tp->epoch;
}

static ote_status_t rdma_address(ote__transport_t *t, char *buf, size_t len) {
    rdma_tp_t *tp = (rdma_tp_t *)t;
    if (strlen(tp->addr) >= len) return OTE_ERR_TOO_BIG;
    memcpy(buf, tp->addr, strlen(tp->addr) + 1);
    return OTE_OK;
}

/* ---- lifecycle ------------------------------------------------------------------- */

/*
 * Teardown in stages; each runs only once every stage before it finished, and each
 * object is forgotten (its pointer cleared) only once its destroy succeeded, so a later
 * call retries exactly what is left:
 *   1. threads: the pump, the server connection threads (woken by the shutdown of their
 *      sockets, joined within a bound), the monitor. A thread that does not end may
 *      still use anything here and in the engine: nothing else is touched.
 *   2. QPs and windows: live grants are ended at once (QP to ERR, then window or exact
 *      MR), then the endpoint stores and grant managers. While a QP or a window lives, a
 *      NIC or a peer could still reach the registered memory: its MRs stay.
 *   3. CQ lanes and their workers; 4. the selector, the registrations' MRs, the staging
 *   chunks' MRs and the buffer manager; 5. the PDs and devices (context set); then the
 *   provider and tp itself.
 * OTE_OK: tp is freed. OTE_ERR_RETAINED: tp stays valid for another teardown only.
 */
/* Counts tp once among the retained transports (ote__rdma_retained_transports). */
static void mark_retained(rdma_tp_t *tp) {
    if (!tp->retained_counted) atomic_fetch_add(&ote__rdma_retained_transports, 1);
    tp->retained_counted = 1;
}

/* 1. The threads: the pump, then the server connection threads (within a bound) and the
 * staged grants' copies they started. A thread that does not end may still use tp and the
 * engine's host services: then nothing is freed (OTE_ERR_RETAINED, logged). */
static ote_status_t teardown_threads(rdma_tp_t *tp) {
    if (tp->pumper_started) {
        ote__rdma_pump_kick(tp);
        pthread_join(tp->pumper, NULL);
        tp->pumper_started = 0;
    }
    uint64_t wait_ms = tp->cfg.connect_timeout_ms + 10000;
    size_t stuck = ote__rdma_servers_stop(tp, wait_ms);
    if (stuck != 0) {
        mark_retained(tp);
        OTE_ERROR("rdma",
                  "%zu control connection thread(s) did not end within %llu ms: the "
                  "transport and everything it owns are retained (not freed); destroy "
                  "again to retry",
                  stuck, (unsigned long long)wait_ms);
        return OTE_ERR_RETAINED;
    }
    /* Staged grants' copies end with their server threads; the last steps of one may
     * still run on the GPU worker. */
    ote__rdma_src_wait_copies(tp, NULL, ote_deadline_after(wait_ms * OTE_NSEC_PER_MSEC));
    if (atomic_load(&tp->src_copies) != 0) {
        mark_retained(tp);
        OTE_ERROR("rdma",
                  "%d staging copies of source grants still running: the transport is "
                  "retained (not freed); destroy again to retry",
                  atomic_load(&tp->src_copies));
        return OTE_ERR_RETAINED;
    }
    return OTE_OK;
}

/* Live grants end now, not at their deadlines: with the control threads gone no receipt's
 * GRANT_DONE or RELEASE can arrive. The source's parent reservations (which hold QP
 * borrows) go first; then each grant manager is fenced and its tick ends its grants as a
 * lost requester's are (a source grant's QP to ERR first, then its window deallocated or
 * its exact MR deregistered, its pin and QP borrow released; a requester grant's QP fenced
 * and flushed). Their flush CQEs are waited for (the lane workers still run) within a
 * bound; what is left then is retained by the steps below. Then the monitor is joined. */
static void teardown_grants(rdma_tp_t *tp) {
    ote__rdma_sp_end_conn(tp, NULL);
    uint64_t gms = tp->cfg.transfer_timeout_ms + 2000;
    if (gms > OTE__RDMA_TEARDOWN_GRANTS_MS) gms = OTE__RDMA_TEARDOWN_GRANTS_MS;
    ote_deadline_t gdl = ote_deadline_after(gms * OTE_NSEC_PER_MSEC);
    for (uint32_t i = 0; i < tp->nnics; i++)
        if (tp->nics[i].gm != NULL) ote_grant_mgr_fence(tp->nics[i].gm, OTE_ERR_CANCELED);
    for (uint32_t i = 0; i < tp->nnics; i++) {
        if (tp->nics[i].gm == NULL) continue;
        while (ote_grant_mgr_tick(tp->nics[i].gm) > 0 && !ote_deadline_expired(gdl)) {
            struct timespec ts = {0, 2 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    ote__rdma_monitor_join(tp);
}

/* Destroys the endpoint store *eps (cleared on success); 1 when it was retained (logged:
 * the store's name, what would not be destroyed, what stays with it). */
static size_t drop_store(ote_endpoint_store_t **eps, uint32_t dev, const char *name,
                         const char *why, const char *stays) {
    if (*eps == NULL) return 0;
    ote_status_t st = ote_endpoint_store_destroy(*eps, ote_deadline_after(2 * OTE_NSEC_PER_SEC));
    if (st == OTE_OK) {
        *eps = NULL;
        return 0;
    }
    OTE_ERROR("rdma", "device %u: %s retained at shutdown (%s: %s)%s", dev, name, why,
              ote_status_str(st), stays);
    return 1;
}

/* 2. QPs and memory windows: the MRs that would not deregister (the buffer manager's
 * orphans: exact MRs of grants, in their private PDs) get one more try before those PDs
 * go (rdma_direct.c), then every device's endpoint
 * stores and grant manager; then the copies back of staged WRITEs those grants started
 * (their MRs and connections stay until they end). While a QP or a window lives, a NIC or
 * a peer could still reach the registered memory, so the caller keeps every MR when this
 * leaves owners. Returns how many are left. */
static size_t teardown_qps(rdma_tp_t *tp) {
    size_t left = 0;
    if (tp->bm != NULL && ote_buffer_manager_reclaim(tp->bm, NULL) != OTE_OK) {
        left++;
        OTE_ERROR("rdma",
                  "MR(s) retained at shutdown (deregs that keep failing): the PDs and "
                  "QPs stay");
    }
    for (uint32_t i = 0; i < tp->nnics; i++) {
        rdma_nic_t *n = &tp->nics[i];
        left += drop_store(&n->eps, i, "endpoint store", "QPs that would not be destroyed",
                           ": its CQs, the registrations' MRs and the PD stay");
        left += drop_store(&n->deps, i, "direct endpoint store",
                           "QPs or private PDs that would not be destroyed", "");
        if (n->eps == NULL) left += ote__rdma_srqs_drop(n, i);
        if (n->gm != NULL) {
            ote_status_t st = ote_grant_mgr_destroy(n->gm);
            if (st == OTE_OK) {
                n->gm = NULL;
            } else {
                left++;
                OTE_ERROR("rdma",
                          "device %u: grant manager retained at shutdown (memory windows or "
                          "grants that would not end: %s): the registrations' MRs and the PD "
                          "stay",
                          i, ote_status_str(st));
            }
        }
    }
    ote__rdma_src_wait_copies(
        tp, NULL, ote_deadline_after((tp->cfg.transfer_timeout_ms + 2000) * OTE_NSEC_PER_MSEC));
    if (atomic_load(&tp->src_copies) != 0) {
        left++;
        OTE_ERROR("rdma", "%d staging copies back to the device still running at shutdown",
                  atomic_load(&tp->src_copies));
    }
    return left;
}

/* 3. CQ lanes, then their workers (joined; never freed under a running worker). A device
 * whose lane is retained stops the walk there. Returns how many owners are left. */
static size_t teardown_lanes(rdma_tp_t *tp) {
    size_t left = 0;
    for (uint32_t k = 0; left == 0 && k < tp->nnics; k++) {
        rdma_nic_t *n = &tp->nics[k];
        for (uint32_t i = 0; i < n->nlanes; i++) {
            if (n->lanes[i] == NULL) continue;
            if (n->workers != NULL) (void)ote_cq_workers_remove(n->workers, n->lanes[i]);
            ote_status_t st = ote_cq_lane_destroy(n->lanes[i]);
            if (st == OTE_OK) {
                n->lanes[i] = NULL;
            } else {
                left++;
                OTE_ERROR("rdma", "device %u: CQ lane %u retained at shutdown: %s", k, i,
                          ote_status_str(st));
            }
        }
    }
    for (uint32_t k = 0; left == 0 && k < tp->nnics; k++) {
        rdma_nic_t *n = &tp->nics[k];
        if (n->workers == NULL) continue;
        ote_status_t st = ote_cq_workers_stop(n->workers); /* joins them */
        if (st == OTE_OK) {
            n->workers = NULL;
        } else {
            left++;
            OTE_ERROR("rdma", "device %u: CQ workers not stopped at shutdown: %s", k,
                      ote_status_str(st));
        }
    }
    return left;
}

/* 4. The selector, the registrations' MRs (an entry whose MRs would not deregister stays
 * listed: the next teardown retries it), the pool chunks' MRs of staged grants (before
 * the PDs go and, through the engine's order, before the pool's pinned memory), then the
 * buffer manager. Returns how many owners are left. */
static size_t teardown_memory(rdma_tp_t *tp) {
    size_t left = 0;
    ote__rdma_topo_stop(tp);
    ote_selector_destroy(tp->sel);
    tp->sel = NULL;
    reg_ent_t **pp = &tp->regs;
    while (*pp != NULL) {
        reg_ent_t *r = *pp;
        ote_status_t st = ote_buffer_deregister(tp->bm, r->buf);
        if (st == OTE_OK) {
            *pp = r->next;
            ote__rdma_direct_reg_end(r);
            ote_free(r);
            continue;
        }
        left++;
        OTE_ERROR("rdma",
                  "MRs of the registration at %p retained at shutdown (%s): the memory "
                  "stays registered",
                  r->addr, ote_status_str(st));
        pp = &r->next;
    }
    /* A chunk's MR that would not deregister is the manager's orphan now: the manager
     * (and with it the transport and the pool's memory) stays, and the next teardown's
     * reclaim (teardown_qps) tries it again. */
    ote__rdma_stage_mrs_drop(tp);
    if (left == 0 && tp->bm != NULL) {
        ote_status_t st = ote_buffer_manager_destroy(tp->bm);
        if (st == OTE_OK) {
            tp->bm = NULL;
        } else {
            left++;
            OTE_ERROR("rdma", "buffer manager retained at shutdown: %s", ote_status_str(st));
        }
    }
    return left;
}

/* 5. PDs and devices (the context set). Returns how many owners are left. */
static size_t teardown_devices(rdma_tp_t *tp) {
    if (tp->set == NULL) return 0;
    ote_status_t st = ote_context_set_close(tp->set);
    if (st == OTE_OK) {
        tp->set = NULL;
        return 0;
    }
    OTE_ERROR("rdma", "context set (PDs, devices) retained at shutdown: %s", ote_status_str(st));
    return 1;
}

static ote_status_t teardown(rdma_tp_t *tp) {
    if (ote__rdma_hooks.track != NULL)
        ote__rdma_hooks.track(tp, 0); /* idempotent: a retry of a retained teardown */
    atomic_store(&tp->stop, 1);
    ote_status_t st = teardown_threads(tp);
    if (st != OTE_OK) return st;
    teardown_grants(tp);
    size_t left = teardown_qps(tp);
    if (left == 0) ote__rdma_acct_end_conn(tp, NULL); /* no grant is left: every account ends */
    if (left == 0) left = teardown_lanes(tp);
    if (left == 0) left = teardown_memory(tp);
    if (left == 0) left = teardown_devices(tp);
    if (left != 0) {
        mark_retained(tp);
        OTE_ERROR("rdma",
                  "%zu owner(s) could not be destroyed: the transport is retained with "
                  "everything not yet destroyed; destroy again to retry",
                  left);
        return OTE_ERR_RETAINED;
    }
    if (tp->retained_counted) atomic_fetch_sub(&ote__rdma_retained_transports, 1);
    if (tp->v != NULL) ote_verbs_close(tp->v);
    ote__rdma_credits_destroy(tp);
    ote_cond_destroy(&tp->pump_cv);
    ote_cond_destroy(&tp->cv);
    ote_mutex_destroy(&tp->mu);
    ote_free(tp->sconns);
    ote_free(tp);
    return OTE_OK;
}

static ote_status_t rdma_destroy(ote__transport_t *t) { return teardown((rdma_tp_t *)t); }

static size_t rdma_nic_stats(ote__transport_t *t, ote__nic_stat_t *out, size_t cap);

static const ote__transport_ops_t g_rdma_ops = {
    .name = "rdma",
    .ranks_by_node = 1,
    .address = rdma_address,
    .peer_open = ote__rdma_peer_open,
    .peer_ensure = ote__rdma_peer_ensure,
    .peer_max_slice = ote__rdma_peer_max_slice,
    .submit = ote__rdma_submit,
    .cancel = ote__rdma_cancel,
    .peer_lost = ote__rdma_peer_lost,
    .peer_close = ote__rdma_peer_close,
    .destroy = rdma_destroy,
    .mem_register = rdma_mem_register,
    .mem_unregister = rdma_mem_unregister,
    .mem_register_dmabuf = ote__rdma_mem_register_dmabuf,
    .adopt = ote__rdma_adopt,
    .nic_stats = rdma_nic_stats,
    .topology = ote__rdma_topology,
    .advert = ote__rdma_advert,
};

/* Split a comma-separated list (in place in buf) into at most cap names. Lenient, as
 * these lists always were: leading blanks are dropped, and empty or blank items skipped. */
static size_t split_names(char *buf, const char **names, size_t cap) {
    size_t n = 0;
    ote_list_iter_t it = ote_list_iter(buf, ',');
    const char *item;
    size_t len;
    while (n < cap && ote_list_next(&it, &item, &len)) {
        char *t = ote_list_cut(buf, item, len);
        while (*t == ' ') t++;
        if (*t) names[n++] = t;
    }
    return n;
}

/* Which devices creation may open: the names rdma_devices / rdma_exclude list (split in
 * place in the buffers), rdma_device's pin of one, rdma_pin's strict routes; the
 * selector's and the context set's configurations point into it. */
typedef struct {
    char allow_buf[sizeof(((ote__cfg_t *)0)->rdma_devices)];
    char deny_buf[sizeof(((ote__cfg_t *)0)->rdma_exclude)];
    const char *allow[OTE_SELECTOR_MAX_DEVICES], *deny[OTE_SELECTOR_MAX_DEVICES];
    ote__rdma_pin_t pins[OTE__RDMA_PIN_MAX];
    ote_context_pin_t cpins[OTE__RDMA_PIN_MAX];
    size_t npins;
    const char *asked; /* what the configuration named, for the log */
    ote_selector_config_t sc;
    ote_context_config_t cc;
} dev_choice_t;

/* The verbs provider (wrapped by the test hook when set). */
static ote_status_t open_provider(rdma_tp_t *tp, const char *prov) {
    /* sim_profile: the sim's configuration ($OTE_SIM_CONFIG or its default) with a global
     * profile item after it, which every device that names none takes; rdma-core gets
     * rdma_sysfs_root. */
    char simcfg[1024];
    const char *config = NULL;
    if (tp->cfg.sim_profile[0] != '\0' && strcmp(prov, "sim") == 0) {
        const char *base = getenv("OTE_SIM_CONFIG");
        if (base == NULL || base[0] == '\0') base = ote_sim_default_config();
        int n = snprintf(simcfg, sizeof(simcfg), "%s;profile=%s", base, tp->cfg.sim_profile);
        if (n < 0 || (size_t)n >= sizeof(simcfg)) {
            OTE_ERROR("rdma", "transport=rdma: sim configuration too long for sim_profile");
            return OTE_ERR_INVALID;
        }
        config = simcfg;
    } else if (tp->cfg.rdma_sysfs_root[0] != '\0' && strcmp(prov, "rdma-core") == 0) {
        /* rdma_sysfs_root: rdma-core reads each device's NUMA node under it too. */
        int n = snprintf(simcfg, sizeof(simcfg), "sysfs_root=%s", tp->cfg.rdma_sysfs_root);
        if (n < 0 || (size_t)n >= sizeof(simcfg) || tp->cfg.rdma_sysfs_root[0] != '/') {
            OTE_ERROR("rdma", "transport=rdma: rdma_sysfs_root=%s is not an absolute path",
                      tp->cfg.rdma_sysfs_root);
            return OTE_ERR_INVALID;
        }
        config = simcfg;
    }
    ote_status_t st = ote_verbs_open(prov, config, &tp->v);
    if (st != OTE_OK) {
        OTE_ERROR("rdma", "transport=rdma: verbs provider \"%s\" could not be opened: %s", prov,
                  ote_status_str(st));
        return st;
    }
    if (ote__rdma_hooks.wrap_verbs != NULL) st = ote__rdma_hooks.wrap_verbs(&tp->v);
    return st;
}

/* Fills d from the configuration: the selector's allow and deny lists (rdma_device pins
 * one device; rdma_pin exactly its devices, each on its strict route) and the context
 * set's device list. OTE_ERR_INVALID for a malformed rdma_pin. */
static ote_status_t choose_devices(rdma_tp_t *tp, dev_choice_t *d) {
    memcpy(d->allow_buf, tp->cfg.rdma_devices, sizeof(d->allow_buf));
    memcpy(d->deny_buf, tp->cfg.rdma_exclude, sizeof(d->deny_buf));
    ote_selector_config_t *sc = &d->sc;
    sc->allow = d->allow;
    sc->nallow = split_names(d->allow_buf, d->allow, OTE_SELECTOR_MAX_DEVICES);
    sc->deny = d->deny;
    sc->ndeny = split_names(d->deny_buf, d->deny, OTE_SELECTOR_MAX_DEVICES);
    if (tp->cfg.rdma_device[0]) { /* the pin: that device alone */
        d->allow[0] = tp->cfg.rdma_device;
        sc->nallow = 1;
    }
    if (tp->cfg.rdma_pin[0]) {
        if (ote__rdma_pin_parse(tp->cfg.rdma_pin, d->pins, &d->npins) != OTE_OK) {
            OTE_ERROR("rdma", "transport=rdma: malformed rdma_pin \"%s\"", tp->cfg.rdma_pin);
            return OTE_ERR_INVALID;
        }
        for (size_t i = 0; i < d->npins; i++) {
            d->cpins[i].device = d->pins[i].device;
            d->cpins[i].port = d->pins[i].port;
            d->cpins[i].gid_index = d->pins[i].gid_index;
            d->allow[i] = d->pins[i].device;
        }
        sc->nallow = d->npins;
    }
    d->asked = tp->cfg.rdma_pin[0]      ? tp->cfg.rdma_pin
               : tp->cfg.rdma_device[0] ? tp->cfg.rdma_device
                                        : tp->cfg.rdma_devices;
    /* NUMA ranks from hwloc on real NICs; the sim's devices rank equal, unless
     * HWLOC_XMLFILE names a recorded topology (the tests' machine shapes). */
    sc->use_topology = strcmp(tp->v->provider, "sim") != 0 || getenv("HWLOC_XMLFILE") != NULL;
    sc->distance = ote__rdma_hooks.distance;
    /* Every unpinned device's route (rdma_port / rdma_gid_index, which the configuration
     * refuses beside rdma_pin) and the sysfs the GID netdev checks read. */
    if (tp->cfg.rdma_port != OTE__CFG_UNSET) d->cc.port = (uint8_t)tp->cfg.rdma_port;
    if (tp->cfg.rdma_gid_index != OTE__CFG_UNSET) {
        d->cc.gid_mode = OTE_CONTEXT_GID_FIXED;
        d->cc.gid_index = (int)tp->cfg.rdma_gid_index;
    }
    d->cc.sysfs_root = tp->cfg.rdma_sysfs_root[0] ? tp->cfg.rdma_sysfs_root : NULL;
    if (d->npins > 0) {
        d->cc.devices = d->allow;
        d->cc.num_devices = d->npins;
        d->cc.pins = d->cpins;
        d->cc.num_pins = d->npins;
    } else if (sc->nallow > 0) {
        d->cc.devices = d->allow;
        d->cc.num_devices = sc->nallow;
    }
    return OTE_OK;
}

/* Data devices: the allowed contexts whose port is active or down (not fenced), in the
 * set's order; those whose port is down start paused (out of the selector, their lanes,
 * endpoint store and grant manager made, registrations published on them) and each joins
 * when the monitor sees its port active (an event or the periodic refresh), also while
 * another device carries traffic. Peers learn every data device from INFO; a peer's
 * CONNECT for a device of ours that is paused is served on an active one (rdma_source.c).
 * Returns how many are active now. */
static uint32_t add_data_devices(rdma_tp_t *tp) {
    uint32_t nactive = 0;
    for (size_t i = 0; i < ote_context_set_count(tp->set) && tp->nnics < OTE__RDMA_MAX_NICS; i++) {
        ote_context_t *c = ote_context_set_get(tp->set, i);
        ote_status_t cs = ote_context_check(c);
        if (cs != OTE_OK && ote_status_code(cs) != OTE_ERR_PORT_DOWN) continue;
        ote_context_info_t info;
        ote_context_get_info(c, &info);
        int idx = -1;
        if (ote_selector_add(tp->sel, ote_context_name(c), info.numa_node, &idx) != OTE_OK)
            continue;
        int up = cs == OTE_OK;
        if (!up) (void)ote_selector_set_active(tp->sel, idx, 0);
        rdma_nic_t *n = &tp->nics[tp->nnics];
        n->tp = tp;
        n->index = tp->nnics;
        n->ctx = c;
        atomic_store(&n->was_active, up);
        tp->nnics++;
        nactive += (uint32_t)up;
    }
    return nactive;
}

/* The provider, its context set, the selector and the data devices: every context with an
 * active (or down: paused) port that rdma_devices / rdma_exclude allow (rdma_device pins
 * one). OTE_ERR_NO_DEVICE (or the native error) when none is usable. */
static ote_status_t open_devices(rdma_tp_t *tp) {
    const char *prov = tp->cfg.verbs_provider[0] ? tp->cfg.verbs_provider : "rdma-core";
    ote_status_t st = open_provider(tp, prov);
    if (st != OTE_OK) return st;
    dev_choice_t *d = ote_calloc(1, sizeof(*d));
    if (d == NULL) return OTE_ERR_NOMEM;
    st = choose_devices(tp, d);
    if (st != OTE_OK) {
        ote_free(d);
        return st;
    }
    st = ote_context_set_open(tp->v, &d->cc, &tp->set);
    if (st == OTE_OK && ote_context_set_count(tp->set) == 0) st = OTE_ERR_NO_DEVICE;
    if (st != OTE_OK) {
        OTE_ERROR("rdma",
                  "transport=rdma: no usable RDMA device through provider \"%s\"%s%s%s: %s "
                  "(no fallback to tcp)",
                  prov, d->sc.nallow ? " among " : "", d->npins ? "rdma_pin " : "", d->asked,
                  ote_status_str(st));
        if (ote_status_code(st) != OTE_ERR_NO_DEVICE && ote_status_code(st) != OTE_ERR_NATIVE)
            st = OTE_ERR_NO_DEVICE;
    }
    if (st == OTE_OK) st = ote_selector_create(&d->sc, &tp->sel);
    uint32_t nactive = st == OTE_OK ? add_data_devices(tp) : 0;
    if (st == OTE_OK && tp->nnics == 0) {
        OTE_ERROR("rdma",
                  "transport=rdma: no device of provider \"%s\" is usable and allowed "
                  "(rdma_devices / rdma_exclude / rdma_pin%s%s)",
                  prov, d->asked[0] ? ": " : "", d->asked);
        st = OTE_ERR_NO_DEVICE;
    }
    ote_free(d);
    if (st != OTE_OK) return st;
    for (uint32_t i = 0; nactive > 0 && i < tp->nnics; i++)
        if (!atomic_load(&tp->nics[i].was_active))
            OTE_INFO("rdma",
                     "transport=rdma: data device %s: port down at creation: paused, it joins "
                     "when its port comes up",
                     ote_context_name(tp->nics[i].ctx));
    if (nactive == 0)
        OTE_WARN("rdma",
                 "transport=rdma: every data device's port is down: the transport starts "
                 "paused (requests fail with OTE_ERR_PORT_DOWN until a port is active)");
    return OTE_OK;
}

/* n's CQ lanes, one worker each, on the NIC's NUMA node. */
static ote_status_t start_lanes(rdma_tp_t *tp, rdma_nic_t *n) {
    ote_context_info_t info;
    ote_context_get_info(n->ctx, &info);
    uint32_t want = tp->cfg.rdma_lanes; /* validated 1..64 */
    n->nlanes = want < 1 ? 1 : (want > OTE__RDMA_MAX_LANES ? OTE__RDMA_MAX_LANES : want);
    ote_status_t st = ote_cq_workers_start_numa(
        n->nlanes, info.numa_node >= 0 ? info.numa_node : -1, &n->workers);
    if (st != OTE_OK) return st;
    for (uint32_t i = 0; i < n->nlanes; i++) {
        ote_cq_lane_config_t lc = {
            .index = i, .send_depth = n->cq_depth, .recv_depth = n->cq_depth, .use_channel = 1};
        st = ote_cq_lane_create(n->ctx, &lc, &n->lanes[i]);
        if (st == OTE_OK) st = ote_cq_workers_add(n->workers, n->lanes[i]);
        if (st != OTE_OK) return st;
    }
    return OTE_OK;
}

/* Lanes, grant manager and endpoint store of data device n. */
static ote_status_t start_nic(rdma_tp_t *tp, rdma_nic_t *n) {
    ote__rdma_nic_depths(tp, n);
    ote_status_t st = start_lanes(tp, n);
    if (st != OTE_OK) return st;
    st = ote__rdma_srqs_start(tp, n);
    if (st != OTE_OK) return st;
    ote_grant_source_ops_t src = ote__rdma_source_ops(tp);
    st = ote_grant_mgr_create(n->ctx, n->lanes, n->nlanes, &src, &n->gm);
    if (st != OTE_OK) return st;
    ote_qp_config_t qc;
    ote_qp_config_default(&qc);
    qc.max_send_wr = n->send_wr;
    /* Grant receipts (SEND_WITH_INV) land here; a source admits a grant only with one of
     * these slots reserved for its receipt (rdma_credits.h), so a receiver-not-ready NAK
     * can only mean a peer that sent what it was not granted: a finite RNR retry count
     * turns that into an error (OTE_ERR_PEER_LOST) instead of an endless stall. */
    qc.recv_slots = n->recv_slots;
    qc.rnr_retry = 3;
    qc.recv_size = 64;
    qc.on_recv = ote__rdma_src_on_recv;
    qc.recv_arg = n;
    qc.sq_pool = ote__rdma_sq_pool(tp); /* rdma_max_send_wrs (rdma_credits.h) */
    /* Every QP below (requester, source, direct, SRQ-based) is made from qc or its copy
     * dqc, so each connects with the configured class, level and MTU clamp (qp/qp.c). */
    qc.traffic_class = (uint8_t)tp->cfg.rdma_traffic_class; /* validated 0..255 */
    qc.service_level = (uint8_t)tp->cfg.rdma_service_level; /* validated 0..15 */
    qc.max_path_mtu = (enum ibv_mtu)tp->cfg.rdma_mtu;       /* 0 or IBV_MTU_256..4096 */
    /* The direct endpoints' QPs (below) live in PDs of their own, so not on the SRQs. */
    ote_qp_config_t dqc = qc;
    if (n->srq_slots != 0) qc.recv_slots = 0; /* receives from the lane's SRQ (rdma_srq.c) */
    st = ote_endpoint_store_create(n->ctx, n->lanes, n->nlanes, &qc, &n->eps);
    if (st != OTE_OK) return st;
    if (n->srq_slots != 0) ote_endpoint_store_srqs(n->eps, n->srq);
    /* READs may land in device memory: no CPU copy out of a CQE (rdma_limits.c). */
    ote_endpoint_store_qp_flags(n->eps, OTE_EP_REQUESTER, OTE_EP_READ, n->read_flags);
    ote_endpoint_store_qp_flags(n->eps, OTE_EP_REQUESTER, 2 /* direct READ */, n->read_flags);
    /* The source's direct endpoints (rdma_direct.c): each QP in a PD of its own. */
    st = ote_endpoint_store_create(n->ctx, n->lanes, n->nlanes, &dqc, &n->deps);
    if (st == OTE_OK) ote_endpoint_store_private_pd(n->deps);
    return st;
}

/* Bytes per data device (the engine's ote_engine_nic_stats). */
static size_t rdma_nic_stats(ote__transport_t *t, ote__nic_stat_t *out, size_t cap) {
    rdma_tp_t *tp = (rdma_tp_t *)t;
    size_t n = 0;
    for (uint32_t i = 0; i < tp->nnics && n < cap; i++, n++) {
        rdma_nic_t *x = &tp->nics[i];
        memset(&out[n], 0, sizeof(out[n]));
        snprintf(out[n].name, sizeof(out[n].name), "%s", ote_context_name(x->ctx));
        out[n].req_bytes = atomic_load(&x->req_bytes);
        out[n].src_bytes = atomic_load(&x->src_bytes);
        out[n].grants = atomic_load(&x->grant_reqs);
        out[n].active = ote_context_check(x->ctx) == OTE_OK;
    }
    return n;
}

ote_status_t ote__rdma_create(const ote__cfg_t *cfg, const ote__host_t *host,
                              ote__transport_t **tp_out) {
    rdma_tp_t *tp = ote_calloc(1, sizeof(*tp));
    if (tp == NULL) return OTE_ERR_NOMEM;
    tp->base.ops = &g_rdma_ops;
    tp->monitor_efd = -1;
    tp->cfg = *cfg;
    tp->host = *host;
    if (host->self_addr == NULL || strlen(host->self_addr) >= sizeof(tp->addr)) {
        ote_free(tp);
        return OTE_ERR_INVALID;
    }
    snprintf(tp->addr, sizeof(tp->addr), "%s", host->self_addr);
    tp->epoch = host->epoch;
    tp->pair_adv = !ote__rdma_hooks.no_pair; /* a test plays an older source */
    ote_status_t st = ote_mutex_init(&tp->mu);
    if (st != OTE_OK) {
        ote_free(tp);
        return st;
    }
    st = ote_cond_init(&tp->cv);
    if (st != OTE_OK) {
        ote_mutex_destroy(&tp->mu);
        ote_free(tp);
        return st;
    }
    st = ote_cond_init(&tp->pump_cv);
    if (st != OTE_OK) {
        ote_cond_destroy(&tp->cv);
        ote_mutex_destroy(&tp->mu);
        ote_free(tp);
        return st;
    }
    st = ote__rdma_credits_create(tp);
    if (st != OTE_OK) {
        ote_cond_destroy(&tp->pump_cv);
        ote_cond_destroy(&tp->cv);
        ote_mutex_destroy(&tp->mu);
        ote_free(tp);
        return st;
    }
    st = open_devices(tp);
    if (st == OTE_OK) st = ote__rdma_topo_start(tp);         /* NIC ranks per GPU and node */
    if (st == OTE_OK) st = ote__rdma_grant_mode_resolve(tp); /* windows or exact MRs */
    if (st != OTE_OK) goto err;
    st = ote_buffer_manager_create(tp->set, &tp->bm);
    if (st != OTE_OK) goto err;
    if (cfg->rdma_traffic_class != 0 || cfg->rdma_service_level != 0 || cfg->rdma_mtu != 0)
        OTE_INFO("rdma",
                 "transport=rdma: every QP connects with traffic class %u, service level %u, "
                 "path MTU %s%s",
                 cfg->rdma_traffic_class, cfg->rdma_service_level,
                 cfg->rdma_mtu != 0 ? "at most " : "the ports' active MTU",
                 cfg->rdma_mtu != 0 ? cfg->rdma_mtu_text : "");
    /* Lane workers run on the CPUs of each NIC's NUMA node (unbound when unknown). */
    for (uint32_t i = 0; i < tp->nnics; i++) {
        st = start_nic(tp, &tp->nics[i]);
        if (st != OTE_OK) goto err;
    }
    tp->process_id = ((uint64_t)getpid() << 32) ^ ote_now_ns() ^ (uint64_t)(uintptr_t)tp;
    tp->pd_id = (uint64_t)(uintptr_t)ote_context_pd(tp->nics[0].ctx) ^ tp->process_id;
    st = ote__rdma_monitor_start(tp); /* rdma_monitor.c */
    if (st != OTE_OK) goto err;
    if (ote__rdma_hooks.track != NULL) ote__rdma_hooks.track(tp, 1);
    if (ote_thread_create(&tp->pumper, NULL, ote__rdma_pumper_main, tp) != 0) {
        st = OTE_ERR_NOMEM;
        goto err;
    }
    tp->pumper_started = 1;
    for (uint32_t i = 0; i < tp->nnics; i++) {
        ote_context_info_t info;
        ote_context_get_info(tp->nics[i].ctx, &info);
        OTE_INFO("rdma",
                 "transport=rdma over \"%s\": data device %u: %s port %u GID index %d, %u lanes",
                 tp->v->provider, i, info.name, info.port, info.gid_index, tp->nics[i].nlanes);
    }
    OTE_INFO("rdma", "transport=rdma: %u data device(s), serving %s", tp->nnics, tp->addr);
    *tp_out = &tp->base;
    return OTE_OK;
err:
    if (teardown(tp) != OTE_OK)
        OTE_ERROR("rdma", "transport=rdma: a failed creation left owners retained (logged above)");
    return st;
}

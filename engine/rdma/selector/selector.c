/*
 * engine/rdma/selector/selector.c - the device selector (see selector.h): ranks from
 * NUMA distances, per-device load (bytes in flight, EWMA of the completion rate),
 * allow/deny lists, one pick per slice.
 */
#include "engine/rdma/selector/selector.h"

#include <errno.h>
#include <hwloc.h>
#include <hwloc/distances.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/lock.h"
#include "base/log.h"
#include "base/time.h"

#define SEL_LOG "rdma.selector"
#define SEL_MAX_NODES 16

typedef struct {
    ote_selector_stats_t st;
    uint64_t last_pick; /* pick sequence of its last pick (ties: least recent first) */
    uint64_t win_start; /* start of the current busy period or window (0: idle) */
    uint64_t win_bytes; /* bytes done since then */
    uint64_t rate_ns;   /* when rate_bps was last sampled */
} sel_dev_t;

struct ote_selector {
    ote_selector_config_t cfg; /* lists not kept: checked at add */
    ote_mutex_t mu;
    size_t n;
    sel_dev_t dev[OTE_SELECTOR_MAX_DEVICES];
    uint64_t seq;
    /* hwloc's NUMA distances by OS index (-1: unknown); used when cfg.distance is NULL */
    int nnodes;
    int dist[SEL_MAX_NODES][SEL_MAX_NODES];
    /* rank tables by locality (ote_selector_set_ranks); has[loc] 0: none */
    uint8_t has[OTE_SELECTOR_MAX_LOCS];
    int16_t ranks[OTE_SELECTOR_MAX_LOCS][OTE_SELECTOR_MAX_DEVICES];
};

static int name_in(const char *name, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (list[i] != NULL && strcmp(list[i], name) == 0) return 1;
    return 0;
}

int ote_selector_config_allows(const ote_selector_config_t *cfg, const char *name) {
    if (cfg == NULL || name == NULL) return 0;
    if (cfg->nallow > 0 && !name_in(name, cfg->allow, cfg->nallow)) return 0;
    return !name_in(name, cfg->deny, cfg->ndeny);
}

static uint64_t now_of(const ote_selector_t *s) {
    return s->cfg.clock != NULL ? s->cfg.clock(s->cfg.clock_arg) : ote_now_ns();
}

/* hwloc's NUMA distance matrix, by OS index; none (every rank 0) when hwloc has none. */
static void load_topology(ote_selector_t *s) {
    hwloc_topology_t topo;
    if (hwloc_topology_init(&topo) != 0) return;
    if (hwloc_topology_load(topo) != 0) {
        hwloc_topology_destroy(topo);
        return;
    }
    unsigned nr = 1;
    struct hwloc_distances_s *d = NULL;
    if (hwloc_distances_get_by_type(topo, HWLOC_OBJ_NUMANODE, &nr, &d, 0, 0) == 0 && nr >= 1 &&
        d != NULL) {
        for (unsigned i = 0; i < d->nbobjs; i++) {
            for (unsigned j = 0; j < d->nbobjs; j++) {
                unsigned a = d->objs[i]->os_index, b = d->objs[j]->os_index;
                if (a >= SEL_MAX_NODES || b >= SEL_MAX_NODES) continue;
                uint64_t v = d->values[i * d->nbobjs + j];
                s->dist[a][b] = v > 1000000 ? 1000000 : (int)v;
                if ((int)a + 1 > s->nnodes) s->nnodes = (int)a + 1;
                if ((int)b + 1 > s->nnodes) s->nnodes = (int)b + 1;
            }
        }
        hwloc_distances_release(topo, d);
    }
    hwloc_topology_destroy(topo);
}

ote_status_t ote_selector_create(const ote_selector_config_t *cfg, ote_selector_t **out) {
    if (cfg == NULL || out == NULL) return OTE_ERR_INVALID;
    if (cfg->ewma_weight_pct > 100) return OTE_ERR_INVALID;
    ote_selector_t *s = ote_calloc(1, sizeof(*s));
    if (s == NULL) return OTE_ERR_NOMEM;
    s->cfg = *cfg;
    s->cfg.allow = NULL;
    s->cfg.nallow = 0;
    s->cfg.deny = NULL;
    s->cfg.ndeny = 0;
    if (s->cfg.rate_window_ns == 0) s->cfg.rate_window_ns = 500 * OTE_NSEC_PER_MSEC;
    if (s->cfg.ewma_weight_pct == 0) s->cfg.ewma_weight_pct = 20;
    for (int i = 0; i < SEL_MAX_NODES; i++)
        for (int j = 0; j < SEL_MAX_NODES; j++) s->dist[i][j] = -1;
    ote_status_t st = ote_mutex_init(&s->mu);
    if (st != OTE_OK) {
        ote_free(s);
        return st;
    }
    /* the lists are checked against each device as it is added */
    s->cfg.allow = cfg->allow;
    s->cfg.nallow = cfg->nallow;
    s->cfg.deny = cfg->deny;
    s->cfg.ndeny = cfg->ndeny;
    if (cfg->use_topology && cfg->distance == NULL) load_topology(s);
    *out = s;
    return OTE_OK;
}

void ote_selector_destroy(ote_selector_t *s) {
    if (s == NULL) return;
    ote_mutex_destroy(&s->mu);
    ote_free(s);
}

ote_status_t ote_selector_add(ote_selector_t *s, const char *name, int numa_node, int *index_out) {
    if (s == NULL || name == NULL || name[0] == '\0' || strlen(name) >= OTE_SELECTOR_NAME_MAX)
        return OTE_ERR_INVALID;
    if (!ote_selector_config_allows(&s->cfg, name)) {
        OTE_INFO(SEL_LOG, "device %s left out (rdma_devices / rdma_exclude)", name);
        return OTE_ERR_NOT_FOUND;
    }
    ote_mutex_lock(&s->mu);
    if (s->n >= OTE_SELECTOR_MAX_DEVICES) {
        ote_mutex_unlock(&s->mu);
        return OTE_ERR_TOO_BIG;
    }
    sel_dev_t *d = &s->dev[s->n];
    memset(d, 0, sizeof(*d));
    snprintf(d->st.name, sizeof(d->st.name), "%s", name);
    d->st.numa_node = numa_node < 0 ? -1 : numa_node;
    d->st.active = 1;
    if (index_out != NULL) *index_out = (int)s->n;
    s->n++;
    ote_mutex_unlock(&s->mu);
    return OTE_OK;
}

size_t ote_selector_count(const ote_selector_t *s) {
    if (s == NULL) return 0;
    ote_mutex_t *mu = (ote_mutex_t *)&s->mu;
    ote_mutex_lock(mu);
    size_t n = s->n;
    ote_mutex_unlock(mu);
    return n;
}

ote_status_t ote_selector_set_active(ote_selector_t *s, int index, int active) {
    if (s == NULL) return OTE_ERR_INVALID;
    ote_mutex_lock(&s->mu);
    if (index < 0 || (size_t)index >= s->n) {
        ote_mutex_unlock(&s->mu);
        return OTE_ERR_NOT_FOUND;
    }
    s->dev[index].st.active = active != 0;
    ote_mutex_unlock(&s->mu);
    return OTE_OK;
}

int ote_selector_is_active(const ote_selector_t *s, int index) {
    if (s == NULL) return 0;
    ote_mutex_t *mu = (ote_mutex_t *)&s->mu;
    ote_mutex_lock(mu);
    int a = index >= 0 && (size_t)index < s->n && s->dev[index].st.active;
    ote_mutex_unlock(mu);
    return a;
}

/* The distance from mem_numa to node; -1 when unknown (either node, or no matrix). */
static int distance_of(const ote_selector_t *s, int mem_numa, int node) {
    if (mem_numa < 0 || node < 0) return -1;
    if (s->cfg.distance != NULL) return s->cfg.distance(s->cfg.distance_arg, mem_numa, node);
    if (mem_numa < s->nnodes && node < s->nnodes) return s->dist[mem_numa][node];
    return -1;
}

/* Under mu. The rank of d in loc's table: its entry, or one past the table's worst
 * placed rank when unplaced. */
static int table_rank(const ote_selector_t *s, const sel_dev_t *d, int loc) {
    int r = s->ranks[loc][d - s->dev];
    if (r >= 0) return r;
    int worst = -1;
    for (size_t i = 0; i < s->n; i++)
        if (s->ranks[loc][i] > worst) worst = s->ranks[loc][i];
    return worst + 1;
}

/* Under mu. A locality with a rank table ranks by it (table_rank). Memory of unknown
 * node ranks every device 0. A device whose distance to the memory is unknown (no node,
 * or a node the topology does not know) ranks as the farthest placement known: the
 * largest distance from the memory's node to any node of the topology or to any device's
 * node. On a multi-node host a NIC without a node therefore never wins over a NIC known
 * to be near. When no distance is known at all, every device ranks 0 (the sim: nodes but
 * no topology). */
static int rank_of(const ote_selector_t *s, const sel_dev_t *d, int mem_numa) {
    if (mem_numa < 0) return 0;
    if (mem_numa < OTE_SELECTOR_MAX_LOCS && s->has[mem_numa]) return table_rank(s, d, mem_numa);
    int v = distance_of(s, mem_numa, d->st.numa_node);
    if (v >= 0) return v;
    int worst = 0;
    if (s->cfg.distance == NULL && mem_numa < s->nnodes) {
        for (int j = 0; j < s->nnodes; j++) {
            if (s->dist[mem_numa][j] > worst) worst = s->dist[mem_numa][j];
        }
    }
    for (size_t i = 0; i < s->n; i++) {
        int w = distance_of(s, mem_numa, s->dev[i].st.numa_node);
        if (w > worst) worst = w;
    }
    return worst;
}

ote_status_t ote_selector_set_ranks(ote_selector_t *s, int loc, const int *ranks, size_t n) {
    if (s == NULL || loc < 0 || loc >= OTE_SELECTOR_MAX_LOCS || n > OTE_SELECTOR_MAX_DEVICES ||
        (ranks == NULL && n > 0))
        return OTE_ERR_INVALID;
    ote_mutex_lock(&s->mu);
    for (size_t i = 0; i < OTE_SELECTOR_MAX_DEVICES; i++) {
        int r = i < n ? ranks[i] : -1;
        s->ranks[loc][i] = (int16_t)(r < 0 ? -1 : r > INT16_MAX ? INT16_MAX : r);
    }
    s->has[loc] = 1;
    ote_mutex_unlock(&s->mu);
    return OTE_OK;
}

int ote_selector_has_ranks(const ote_selector_t *s, int loc) {
    if (s == NULL || loc < 0 || loc >= OTE_SELECTOR_MAX_LOCS) return 0;
    ote_mutex_t *mu = (ote_mutex_t *)&s->mu;
    ote_mutex_lock(mu);
    int h = s->has[loc];
    ote_mutex_unlock(mu);
    return h;
}

int ote_selector_rank(const ote_selector_t *s, int index, int mem_numa) {
    if (s == NULL) return 0;
    ote_mutex_t *mu = (ote_mutex_t *)&s->mu;
    ote_mutex_lock(mu);
    int r = index >= 0 && (size_t)index < s->n ? rank_of(s, &s->dev[index], mem_numa) : 0;
    ote_mutex_unlock(mu);
    return r;
}

/* Whether a would finish len more bytes before b (under mu; both candidates). */
static int better(const sel_dev_t *a, const sel_dev_t *b, uint64_t len, int rates) {
    if (rates) {
        double ta = (double)(a->st.inflight + len) / a->st.rate_bps;
        double tb = (double)(b->st.inflight + len) / b->st.rate_bps;
        if (ta != tb) return ta < tb;
    } else if (a->st.inflight != b->st.inflight) {
        return a->st.inflight < b->st.inflight;
    }
    return a->last_pick < b->last_pick;
}

ote_status_t ote_selector_pick(ote_selector_t *s, int mem_numa, uint64_t len, uint32_t mask,
                               int *index_out) {
    if (s == NULL || index_out == NULL) return OTE_ERR_INVALID;
    ote_mutex_lock(&s->mu);
    int best_rank = -1, rates = 1;
    for (size_t i = 0; i < s->n; i++) {
        const sel_dev_t *d = &s->dev[i];
        if (!d->st.active || !(mask & (1u << i))) continue;
        int r = rank_of(s, d, mem_numa);
        if (best_rank < 0 || r < best_rank) best_rank = r;
    }
    if (best_rank < 0) {
        ote_mutex_unlock(&s->mu);
        return OTE_ERR_NO_DEVICE;
    }
    double rmin = 0, rmax = 0;
    uint64_t now = now_of(s);
    for (size_t i = 0; i < s->n; i++) {
        const sel_dev_t *d = &s->dev[i];
        if (!d->st.active || !(mask & (1u << i)) || rank_of(s, d, mem_numa) != best_rank) continue;
        double r = d->st.rate_bps;
        /* A rate not sampled for OTE_SELECTOR_RATE_STALE windows is not trusted: a device
         * that once measured slow would otherwise lose every pick while the others are
         * idle (one request at a time), and never be measured again. */
        if (!(r > 0) || now - d->rate_ns > OTE_SELECTOR_RATE_STALE * s->cfg.rate_window_ns)
            rates = 0;
        if (rmin == 0 || r < rmin) rmin = r;
        if (r > rmax) rmax = r;
    }
    /* Rates closer than OTE_SELECTOR_RATE_SPREAD are measurement noise: bytes in flight
     * alone then (a faster NIC drains its queue sooner and so gets more anyway). */
    if (rates && rmax < rmin * OTE_SELECTOR_RATE_SPREAD) rates = 0;
    int pick = -1;
    for (size_t i = 0; i < s->n; i++) {
        const sel_dev_t *d = &s->dev[i];
        if (!d->st.active || !(mask & (1u << i)) || rank_of(s, d, mem_numa) != best_rank) continue;
        if (pick < 0 || better(d, &s->dev[pick], len, rates)) pick = (int)i;
    }
    sel_dev_t *d = &s->dev[pick];
    if (d->st.inflight == 0) { /* busy from now: a rate window starts */
        d->win_start = now;
        d->win_bytes = 0;
    }
    d->st.inflight += len;
    d->st.picks++;
    d->last_pick = ++s->seq;
    *index_out = pick;
    ote_mutex_unlock(&s->mu);
    return OTE_OK;
}

uint32_t ote_selector_best_mask(const ote_selector_t *s, int mem_numa, uint32_t mask) {
    if (s == NULL) return 0;
    ote_mutex_t *mu = (ote_mutex_t *)&s->mu;
    ote_mutex_lock(mu);
    int best = -1;
    int rank[OTE_SELECTOR_MAX_DEVICES];
    for (size_t i = 0; i < s->n; i++) {
        rank[i] = -1;
        if (!s->dev[i].st.active || !(mask & (1u << i))) continue;
        rank[i] = rank_of(s, &s->dev[i], mem_numa);
        if (best < 0 || rank[i] < best) best = rank[i];
    }
    uint32_t out = 0;
    for (size_t i = 0; i < s->n; i++)
        if (rank[i] >= 0 && rank[i] == best) out |= 1u << i;
    ote_mutex_unlock(mu);
    return out;
}

/* A completion-rate sample: the bytes done over a whole busy period (from the pick that
 * made the device busy to the end that made it idle), or over rate_window_ns of a busy
 * period that lasts longer. Slices run in parallel on a NIC, so their ends come in bursts:
 * only such long spans say how fast it moves bytes; shorter or smaller ones (under
 * SEL_MIN_SAMPLE bytes: latency, not rate) are not sampled. Under mu. */
#define SEL_MIN_SAMPLE (1u << 20)

static void rate_sample(ote_selector_t *s, sel_dev_t *d, uint64_t now) {
    uint64_t span = now > d->win_start ? now - d->win_start : 0;
    if (span == 0 || d->win_bytes < SEL_MIN_SAMPLE) return;
    double sample = (double)d->win_bytes * 1e9 / (double)span;
    double w = (double)s->cfg.ewma_weight_pct / 100.0;
    d->st.rate_bps = d->st.rate_bps > 0 ? w * sample + (1 - w) * d->st.rate_bps : sample;
    d->rate_ns = now;
}

void ote_selector_done(ote_selector_t *s, int index, uint64_t len, int ok) {
    if (s == NULL) return;
    ote_mutex_lock(&s->mu);
    if (index < 0 || (size_t)index >= s->n) {
        ote_mutex_unlock(&s->mu);
        return;
    }
    sel_dev_t *d = &s->dev[index];
    d->st.inflight = d->st.inflight >= len ? d->st.inflight - len : 0;
    if (!ok) {
        d->st.bytes_failed += len;
    } else {
        d->st.bytes_done += len;
        d->win_bytes += len;
    }
    if (d->win_start != 0) {
        uint64_t now = now_of(s);
        if (d->st.inflight == 0) { /* the busy period ends */
            rate_sample(s, d, now);
            d->win_start = 0;
        } else if (now - d->win_start >= s->cfg.rate_window_ns) {
            rate_sample(s, d, now);
            d->win_start = now;
            d->win_bytes = 0;
        }
    }
    ote_mutex_unlock(&s->mu);
}

ote_status_t ote_selector_stats(const ote_selector_t *s, int index, ote_selector_stats_t *out) {
    if (s == NULL || out == NULL) return OTE_ERR_INVALID;
    ote_mutex_t *mu = (ote_mutex_t *)&s->mu;
    ote_mutex_lock(mu);
    if (index < 0 || (size_t)index >= s->n) {
        ote_mutex_unlock(mu);
        return OTE_ERR_NOT_FOUND;
    }
    *out = s->dev[index].st;
    ote_mutex_unlock(mu);
    return OTE_OK;
}

/*
 * context/context.c - opening and closing the context set; context accessors.
 *
 * Open order per device: open_device -> query_device -> NUMA node -> alloc_pd -> route.
 * Close order: what reopens retired (reopen.c), dealloc_pd -> close_device. A failed
 * dealloc keeps the context (and its device) alive and counted; the set stays valid until
 * a later close succeeds.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/fault.h"
#include "base/log.h"
#include "context/context_internal.h"

typedef struct {
    struct ibv_device *dev;
    const char *name;
} dev_entry_t;

static int dev_entry_cmp(const void *a, const void *b) {
    return strcmp(((const dev_entry_t *)a)->name, ((const dev_entry_t *)b)->name);
}

static const ote_context_pin_t *find_pin(const ote_context_config_t *cfg, const char *name) {
    for (size_t i = 0; cfg != NULL && i < cfg->num_pins; i++)
        if (cfg->pins[i].device != NULL && strcmp(cfg->pins[i].device, name) == 0)
            return &cfg->pins[i];
    return NULL;
}

static int listed(const ote_context_config_t *cfg, const char *name) {
    if (cfg == NULL || cfg->devices == NULL || cfg->num_devices == 0) return -1; /* all */
    for (size_t i = 0; i < cfg->num_devices; i++)
        if (cfg->devices[i] != NULL && strcmp(cfg->devices[i], name) == 0) return 1;
    return 0;
}

/* Destroy a context that owns its PD and device. OTE_ERR_RETAINED keeps it alive. */
static ote_status_t context_close(ote_context_t *ctx) {
    ote_verbs_t *v = ctx->v;
    ote_status_t rst = ote__context_release_retired(ctx);
    if (rst != OTE_OK) return rst;
    if (ctx->pd != NULL) {
        int err = v->ops->dealloc_pd(v, ctx->pd);
        if (err != 0) {
            if (atomic_load(&ctx->retained[OTE_RETAINED_PD]) == 0)
                ote_context_retained_add(ctx, OTE_RETAINED_PD, 1);
            OTE_WARN("context", "device %s: dealloc_pd failed: errno %d; PD and device retained",
                     ctx->name, err);
            return ote_status_make(OTE_ERR_RETAINED, err);
        }
        if (atomic_load(&ctx->retained[OTE_RETAINED_PD]) != 0)
            ote_context_retained_add(ctx, OTE_RETAINED_PD, -1);
        ctx->pd = NULL;
    }
    if (ctx->native != NULL) {
        int err = v->ops->close_device(v, ctx->native);
        if (err != 0)
            OTE_WARN("context", "device %s: close_device failed: errno %d", ctx->name, err);
        ctx->native = NULL;
    }
    ote_free(ctx);
    return OTE_OK;
}

/* A strict route on one port: ERROR naming device, port and index when it is unusable. */
static ote_status_t route_strict(ote_context_t *ctx, uint8_t port, int gid_index, const char *what,
                                 int *active_out) {
    char why[160] = "";
    ote_status_t st =
        ote__context_select_route(ctx, port, gid_index, &ctx->route, active_out, why, sizeof(why));
    if (st != OTE_OK && why[0] != '\0') /* else query_port failed: WARN logged */
        OTE_ERROR("context", "%s device %s port %u GID index %d %s", what, ctx->name,
                  (unsigned)port, gid_index, why);
    return st;
}

/* The route of a device without a pin on the first active port (or cfg->port alone)
 * with a usable GID (cfg's fixed index, else the best one), else the first such port:
 * the context starts paused. A fixed index that no port can use is an ERROR naming each
 * port's reason; an automatic choice that finds nothing is OTE_ERR_NOT_FOUND. */
static ote_status_t route_ports(ote_context_t *ctx, const ote_context_config_t *cfg,
                                int *active_out) {
    int fixed = cfg != NULL && cfg->gid_mode == OTE_CONTEXT_GID_FIXED;
    unsigned first = cfg != NULL && cfg->port != 0 ? cfg->port : 1;
    unsigned last = cfg != NULL && cfg->port != 0 ? cfg->port : ctx->device_attr.phys_port_cnt;
    char whys[320] = "";
    size_t used = 0;
    int found = 0, active = 0;
    for (unsigned p = first; p <= last && p <= 255; p++) {
        ote_context_route_t probe;
        int probe_active = 0;
        char why[160] = "";
        if (ote__context_select_route(ctx, (uint8_t)p, fixed ? cfg->gid_index : -1, &probe,
                                      &probe_active, why, sizeof(why)) != OTE_OK) {
            if (why[0] == '\0') snprintf(why, sizeof(why), "cannot be checked (query_port failed)");
            int n = snprintf(whys + used, sizeof(whys) - used, "%sport %u: GID index %d %s",
                             used ? "; " : "", p, fixed ? cfg->gid_index : -1, why);
            if (n > 0) used = used + (size_t)n < sizeof(whys) ? used + (size_t)n : sizeof(whys) - 1;
            continue;
        }
        if (!found || (probe_active && !active)) {
            ctx->route = probe;
            active = probe_active;
            found = 1;
        }
        if (active) break;
    }
    if (!found && fixed) {
        OTE_ERROR("context",
                  "device %s: the GID index %d fixed for every device cannot be used: %s",
                  ctx->name, cfg->gid_index, whys);
        return OTE_ERR_NOT_FOUND;
    }
    if (!found) return OTE_ERR_NOT_FOUND;
    *active_out = active;
    return OTE_OK;
}

/* Choose the route: the pinned one, or route_ports's. A configured port the device does
 * not have fails like a pin to it. */
static ote_status_t context_route(ote_context_t *ctx, const ote_context_pin_t *pin,
                                  const ote_context_config_t *cfg) {
    int active = 0;
    ote_status_t st;
    uint8_t want_port = pin != NULL ? pin->port : cfg != NULL ? cfg->port : 0;
    if ((pin != NULL || want_port != 0) &&
        (want_port < 1 || want_port > ctx->device_attr.phys_port_cnt)) {
        char gid[32] = "";
        if (ctx->pin_gid_index >= 0)
            snprintf(gid, sizeof(gid), " GID index %d", ctx->pin_gid_index);
        OTE_ERROR("context", "%s device %s port %u%s: the device has ports 1..%u",
                  pin != NULL ? "pinned route" : "configured route of", ctx->name,
                  (unsigned)want_port, gid, (unsigned)ctx->device_attr.phys_port_cnt);
        return OTE_ERR_NOT_FOUND;
    }
    if (pin != NULL && pin->gid_index < 0) {
        OTE_ERROR("context", "pinned route device %s port %u GID index %d: invalid index",
                  ctx->name, (unsigned)pin->port, pin->gid_index);
        return OTE_ERR_INVALID;
    }
    if (pin != NULL) st = route_strict(ctx, pin->port, pin->gid_index, "pinned route", &active);
    else st = route_ports(ctx, cfg, &active);
    if (st != OTE_OK) return st;
    atomic_store(&ctx->state, active ? OTE_CONTEXT_ACTIVE : OTE_CONTEXT_PAUSED);
    if (!active)
        OTE_WARN("context", "device %s port %u is not active: context starts paused", ctx->name,
                 (unsigned)ctx->route.port);
    return OTE_OK;
}

/* ctx->device_attr and ctx->limits: query_device_ex, or query_device where the provider
 * lacks the extended verb (EOPNOTSUPP); device_flags says whether small READ responses
 * may be scattered into CQEs (mlx5). */
static ote_status_t context_limits(ote_context_t *ctx) {
    ote_verbs_t *v = ctx->v;
    struct ibv_device_attr_ex ex;
    memset(&ex, 0, sizeof(ex));
    int err = v->ops->query_device_ex(v, ctx->native, &ex);
    if (err == EOPNOTSUPP) err = v->ops->query_device(v, ctx->native, &ex.orig_attr);
    if (err != 0) {
        OTE_ERROR("context", "device %s: query_device failed: errno %d", ctx->name, err);
        return ote_status_make(OTE_ERR_NATIVE, err);
    }
    const struct ibv_device_attr *a = &ex.orig_attr;
    ctx->device_attr = *a;
    ote_context_limits_t *l = &ctx->limits;
    l->max_qp_wr = a->max_qp_wr > 0 ? (uint32_t)a->max_qp_wr : 0;
    l->max_sge = a->max_sge > 0 ? (uint32_t)a->max_sge : 0;
    l->max_sge_rd = a->max_sge_rd > 0 ? (uint32_t)a->max_sge_rd : l->max_sge;
    l->max_cqe = a->max_cqe > 0 ? (uint32_t)a->max_cqe : 0;
    l->max_qp = a->max_qp > 0 ? (uint32_t)a->max_qp : 0;
    l->max_qp_rd_atom = a->max_qp_rd_atom > 0 ? (uint32_t)a->max_qp_rd_atom : 0;
    l->max_qp_init_rd_atom = a->max_qp_init_rd_atom > 0 ? (uint32_t)a->max_qp_init_rd_atom : 0;
    l->max_srq = a->max_srq > 0 ? (uint32_t)a->max_srq : 0;
    l->max_srq_wr = a->max_srq_wr > 0 ? (uint32_t)a->max_srq_wr : 0;
    l->max_srq_sge = a->max_srq_sge > 0 ? (uint32_t)a->max_srq_sge : 0;
    l->max_mw = a->max_mw > 0 ? (uint32_t)a->max_mw : 0;
    l->max_mr_size = a->max_mr_size;
    l->mw_type2 = (a->device_cap_flags &
                   (IBV_DEVICE_MEM_WINDOW_TYPE_2A | IBV_DEVICE_MEM_WINDOW_TYPE_2B)) != 0 &&
                  l->max_mw > 0;
    uint32_t df = 0;
    if (v->ops->device_flags(v, ctx->native, &df) != 0) df = 0;
    l->scatter_to_cqe = (df & OTE_VERBS_DEV_SCATTER_TO_CQE) != 0;
    l->scatter_opt_out = (df & OTE_VERBS_DEV_SCATTER_OPT_OUT) != 0;
    OTE_DEBUG("context",
              "device %s: max_qp_wr %u, max_sge %u/%u, max_cqe %u, rd_atom %u/%u, srq %u x %u, "
              "mw type 2 %s, scatter-to-CQE %s",
              ctx->name, l->max_qp_wr, l->max_sge, l->max_sge_rd, l->max_cqe, l->max_qp_rd_atom,
              l->max_qp_init_rd_atom, l->max_srq, l->max_srq_wr, l->mw_type2 ? "yes" : "no",
              l->scatter_to_cqe ? (l->scatter_opt_out ? "on (per-QP opt-out)" : "on") : "off");
    return OTE_OK;
}

/* Open device dev as NIC nic_id on its route (pin, else cfg's port and GID choice) with
 * its PD into *ctx_out. A device without a usable GID that the configuration neither
 * requires nor routes strictly is skipped: OTE_OK with *ctx_out NULL (WARN logged). */
static ote_status_t context_open(ote_context_set_t *set, struct ibv_device *dev, const char *name,
                                 uint32_t nic_id, const ote_context_config_t *cfg,
                                 const ote_context_pin_t *pin, int required,
                                 ote_context_t **ctx_out) {
    ote_verbs_t *v = set->v;
    ote_status_t st;
    int skipped = 0;
    ote_context_t *ctx = ote_calloc(1, sizeof(*ctx));
    if (ctx == NULL) return OTE_ERR_NOMEM;
    ctx->set = set;
    ctx->v = v;
    ctx->nic_id = nic_id;
    int fixed = pin == NULL && cfg != NULL && cfg->gid_mode == OTE_CONTEXT_GID_FIXED;
    ctx->pin_gid_index = pin != NULL ? pin->gid_index : fixed ? cfg->gid_index : -1;
    ctx->pinned = pin != NULL;
    ctx->numa_node = -1;
    snprintf(ctx->name, sizeof(ctx->name), "%s", name);

    struct ibv_context *native = NULL;
    int err = v->ops->open_device(v, dev, &native);
    if (err != 0) {
        OTE_ERROR("context", "device %s: open_device failed: errno %d", name, err);
        ote_free(ctx);
        return ote_status_make(OTE_ERR_NATIVE, err);
    }
    atomic_store(&ctx->native, native);
    st = context_limits(ctx);
    if (st != OTE_OK) goto err_close;
    int node = -1;
    if (v->ops->device_numa_node(v, ctx->native, &node) == 0) ctx->numa_node = node;

    st = context_route(ctx, pin, cfg);
    if (st != OTE_OK) {
        /* Only an automatic route on any port may skip a device; a strict one fails (the
         * pin and the fixed index said why already). */
        uint8_t port = cfg != NULL ? cfg->port : 0;
        if (pin == NULL && !fixed && ote_status_code(st) == OTE_ERR_NOT_FOUND) {
            if (port != 0)
                OTE_ERROR("context", "device %s port %u (the configured port): no usable GID", name,
                          (unsigned)port);
            else if (required) OTE_ERROR("context", "device %s: no port has a usable GID", name);
            else OTE_WARN("context", "device %s: no port has a usable GID; device skipped", name);
            if (port == 0 && !required) skipped = 1;
            else if (port == 0) st = OTE_ERR_NO_DEVICE;
        }
        goto err_close;
    }
    struct ibv_pd *pd = NULL;
    err = v->ops->alloc_pd(v, native, &pd);
    atomic_store(&ctx->pd, pd);
    if (err != 0) {
        OTE_ERROR("context", "device %s: alloc_pd failed: errno %d", name, err);
        st = ote_status_make(OTE_ERR_NATIVE, err);
        goto err_close;
    }
    ote__context_nonblocking(native);
    ctx->route_generation = 1;
    ote__context_log_route(ctx, pin != NULL ? "pinned" : fixed ? "fixed GID index" : "automatic");
    *ctx_out = ctx;
    return OTE_OK;

err_close:
    (void)v->ops->close_device(v, native);
    ote_free(ctx);
    if (skipped) {
        *ctx_out = NULL;
        return OTE_OK;
    }
    return st;
}

/* The provider's device list (*list_out, *num_out; the caller frees it). */
static ote_status_t set_open_list(ote_verbs_t *v, struct ibv_device ***list_out, int *num_out) {
    int err = v->ops->get_device_list(v, list_out, num_out);
    if (err != 0) {
        OTE_ERROR("context", "provider %s: get_device_list failed: errno %d", v->provider, err);
        return ote_status_make(OTE_ERR_NO_DEVICE, err);
    }
    return OTE_OK;
}

/* The num listed devices with their names, sorted by name (*devs_out, the caller frees
 * it); OTE_ERR_NO_DEVICE (ERROR) when the provider lists none. */
static ote_status_t set_open_devs(ote_verbs_t *v, struct ibv_device **list, int num,
                                  dev_entry_t **devs_out) {
    if (num <= 0) {
        OTE_ERROR("context", "provider %s lists no RDMA device", v->provider);
        return OTE_ERR_NO_DEVICE;
    }
    dev_entry_t *devs = ote_calloc((size_t)num, sizeof(*devs));
    if (devs == NULL) return OTE_ERR_NOMEM;
    for (int i = 0; i < num; i++) {
        devs[i].dev = list[i];
        devs[i].name = v->ops->get_device_name(v, list[i]);
        if (devs[i].name == NULL) devs[i].name = "";
    }
    qsort(devs, (size_t)num, sizeof(*devs), dev_entry_cmp);
    *devs_out = devs;
    return OTE_OK;
}

/* Every name the configuration mentions must exist (OTE_ERR_NO_DEVICE, ERROR). */
static ote_status_t set_open_check_names(ote_verbs_t *v, const ote_context_config_t *cfg,
                                         const dev_entry_t *devs, int num) {
    for (size_t i = 0; cfg != NULL && i < cfg->num_devices + cfg->num_pins; i++) {
        const char *want =
            i < cfg->num_devices ? cfg->devices[i] : cfg->pins[i - cfg->num_devices].device;
        if (want == NULL) continue;
        int found = 0;
        for (int j = 0; j < num && !found; j++) found = strcmp(devs[j].name, want) == 0;
        if (!found) {
            OTE_ERROR("context", "device %s not found: provider %s lists %d device(s)%s%s", want,
                      v->provider, num, num > 0 ? ", first " : "", num > 0 ? devs[0].name : "");
            return OTE_ERR_NO_DEVICE;
        }
    }
    return OTE_OK;
}

/* Open a context on each device the configuration names or pins (all when it names
 * none), in name order, into set->contexts; an unpinned device without a usable port is
 * skipped. OTE_ERR_NO_DEVICE (ERROR) when none opens; on failure the contexts opened so
 * far stay in the set for the caller to close. */
static ote_status_t set_open_contexts(ote_context_set_t *set, const ote_context_config_t *cfg,
                                      const dev_entry_t *devs, int num) {
    for (int i = 0; i < num; i++) {
        const ote_context_pin_t *pin = find_pin(cfg, devs[i].name);
        int l = listed(cfg, devs[i].name);
        if (pin == NULL && l == 0) continue;
        ote_context_t *ctx = NULL;
        ote_status_t st =
            context_open(set, devs[i].dev, devs[i].name, (uint32_t)i, cfg, pin, l == 1, &ctx);
        if (st != OTE_OK) return st;
        if (ctx == NULL) continue; /* skipped, warned */
        set->contexts[set->count++] = ctx;
    }
    if (set->count == 0) {
        OTE_ERROR("context",
                  "no usable RDMA device: provider %s lists %d device(s), none has a port "
                  "with a usable GID",
                  set->v->provider, num);
        return OTE_ERR_NO_DEVICE;
    }
    return OTE_OK;
}

/* Close the contexts of a failed open, last first. */
static void set_open_close_contexts(ote_context_set_t *set) {
    for (size_t i = set->count; i-- > 0;) {
        if (context_close(set->contexts[i]) != OTE_OK) {
            /* A PD that cannot be freed right after its creation: nothing can use it; it
             * is leaked rather than freed on a guess, and said so. */
            OTE_ERROR("context", "device %s: PD leaked during failed open", set->contexts[i]->name);
        }
    }
}

ote_status_t ote_context_set_open(ote_verbs_t *v, const ote_context_config_t *cfg,
                                  ote_context_set_t **set_out) {
    if (v == NULL || set_out == NULL) return OTE_ERR_INVALID;
    ote_status_t st;
    if (ote_fault_hit("context.set_open", &st)) return st;

    struct ibv_device **list = NULL;
    int num = 0;
    if ((st = set_open_list(v, &list, &num)) != OTE_OK) return st;
    dev_entry_t *devs = NULL;
    ote_context_set_t *set = NULL;
    if ((st = set_open_devs(v, list, num, &devs)) != OTE_OK) goto out;
    if ((st = set_open_check_names(v, cfg, devs, num)) != OTE_OK) goto out;

    set = ote_calloc(1, sizeof(*set));
    if (set == NULL) {
        st = OTE_ERR_NOMEM;
        goto out;
    }
    set->v = v;
    set->next_listener_id = 1;
    if (cfg != NULL && cfg->sysfs_root != NULL && cfg->sysfs_root[0] != '\0' &&
        (set->sysfs_root = ote_strdup(cfg->sysfs_root)) == NULL) {
        st = OTE_ERR_NOMEM;
        goto err_free_set;
    }
    set->contexts = ote_calloc((size_t)num, sizeof(*set->contexts));
    if (set->contexts == NULL) {
        st = OTE_ERR_NOMEM;
        goto err_free_set;
    }
    if ((st = ote_mutex_init(&set->mu)) != OTE_OK) goto err_free_set;
    if ((st = ote_mutex_init(&set->listeners_mu)) != OTE_OK) goto err_mu;
    if ((st = set_open_contexts(set, cfg, devs, num)) != OTE_OK) goto err_close_contexts;
    *set_out = set;
    set = NULL;
    st = OTE_OK;
    goto out;

err_close_contexts:
    set_open_close_contexts(set);
    ote_mutex_destroy(&set->listeners_mu);
err_mu:
    ote_mutex_destroy(&set->mu);
err_free_set:
    ote_free(set->sysfs_root);
    ote_free(set->contexts);
    ote_free(set);
out:
    ote_free(devs);
    v->ops->free_device_list(v, list);
    return st;
}

ote_status_t ote_context_set_close(ote_context_set_t *set) {
    if (set == NULL) return OTE_OK;
    ote_status_t result = OTE_OK;
    size_t kept = 0;
    for (size_t i = 0; i < set->count; i++) {
        ote_context_t *ctx = set->contexts[i];
        ote_status_t st = context_close(ctx);
        if (st != OTE_OK) {
            set->contexts[kept++] = ctx;
            if (result == OTE_OK) result = st;
        }
    }
    set->count = kept;
    if (result != OTE_OK) return result;
    while (set->listeners != NULL) {
        ote_context_listener_t *l = set->listeners;
        set->listeners = l->next;
        ote_free(l);
    }
    ote_mutex_destroy(&set->listeners_mu);
    ote_mutex_destroy(&set->mu);
    ote_free(set->sysfs_root);
    ote_free(set->contexts);
    ote_free(set);
    return OTE_OK;
}

size_t ote_context_set_count(const ote_context_set_t *set) { return set->count; }

ote_context_t *ote_context_set_get(ote_context_set_t *set, size_t i) {
    return i < set->count ? set->contexts[i] : NULL;
}

ote_context_t *ote_context_set_find(ote_context_set_t *set, uint32_t nic_id) {
    for (size_t i = 0; i < set->count; i++)
        if (set->contexts[i]->nic_id == nic_id) return set->contexts[i];
    return NULL;
}

ote_context_set_t *ote_context_owner(const ote_context_t *ctx) { return ctx->set; }
ote_verbs_t *ote_context_verbs(const ote_context_t *ctx) { return ctx->v; }
struct ibv_context *ote_context_native(const ote_context_t *ctx) {
    return atomic_load(&((ote_context_t *)ctx)->native);
}
struct ibv_pd *ote_context_pd(const ote_context_t *ctx) {
    return atomic_load(&((ote_context_t *)ctx)->pd);
}
uint32_t ote_context_nic_id(const ote_context_t *ctx) { return ctx->nic_id; }
const char *ote_context_name(const ote_context_t *ctx) { return ctx->name; }

ote_context_state_t ote_context_state(const ote_context_t *ctx) {
    return (ote_context_state_t)atomic_load_explicit(&ctx->state, memory_order_acquire);
}

ote_status_t ote_context_check(const ote_context_t *ctx) {
    switch (ote_context_state(ctx)) {
        case OTE_CONTEXT_ACTIVE: return OTE_OK;
        case OTE_CONTEXT_PAUSED: return OTE_ERR_PORT_DOWN;
        case OTE_CONTEXT_LOST: return ote_status_make(OTE_ERR_FENCED, EIO);
        default: return OTE_ERR_DEVICE_FATAL;
    }
}

uint64_t ote_context_route_generation(const ote_context_t *ctx) {
    ote_mutex_lock(&ctx->set->mu);
    uint64_t g = ctx->route_generation;
    ote_mutex_unlock(&ctx->set->mu);
    return g;
}

void ote_context_get_info(const ote_context_t *ctx, ote_context_info_t *info) {
    ote_mutex_lock(&ctx->set->mu);
    memset(info, 0, sizeof(*info));
    info->nic_id = ctx->nic_id;
    snprintf(info->name, sizeof(info->name), "%s", ctx->name);
    info->port = ctx->route.port;
    info->gid_index = ctx->route.gid_index;
    info->gid = ctx->route.gid;
    info->gid_type = ctx->route.gid_type;
    info->pinned = ctx->pin_gid_index >= 0;
    memcpy(info->netdev, ctx->route.netdev, sizeof(info->netdev));
    info->netdev_state = ctx->route.netdev_state;
    info->lid = ctx->route.lid;
    info->link_layer = ctx->route.link_layer;
    info->active_mtu = ctx->route.active_mtu;
    info->numa_node = ctx->numa_node;
    info->state = ote_context_state(ctx);
    info->route_generation = ctx->route_generation;
    info->device_attr = ctx->device_attr;
    info->limits = ctx->limits;
    info->reopens = ctx->reopens;
    info->reopen_failures = ctx->reopen_failures;
    info->reopen_error = ctx->reopen_error;
    info->retired_natives = 0;
    for (const ote_context_retired_t *r = ctx->retired; r != NULL; r = r->next)
        info->retired_natives++;
    ote_mutex_unlock(&ctx->set->mu);
}

void ote_context_retained_add(ote_context_t *ctx, ote_retained_kind_t kind, int delta) {
    if ((unsigned)kind >= OTE_RETAINED_KINDS) return;
    if (delta >= 0) atomic_fetch_add(&ctx->retained[kind], (uint64_t)delta);
    else atomic_fetch_sub(&ctx->retained[kind], (uint64_t)(-delta));
    ote_retained_note(kind, delta); /* the process-wide registry the test fixture reads */
}

uint64_t ote_context_retained(const ote_context_t *ctx, ote_retained_kind_t kind) {
    if ((unsigned)kind >= OTE_RETAINED_KINDS) return 0;
    return atomic_load(&((ote_context_t *)ctx)->retained[kind]);
}

/*
 * context/events.c - async events: port state tracking, route refresh, listeners.
 *
 * The monitor (an upper layer) calls ote_context_set_poll_events() periodically. Each
 * event first updates the context it belongs to, then every listener sees it, then it
 * is acked (objects named by the event stay valid until the ack). Port events apply
 * only to the context's selected port; every event is acked.
 */
#include <errno.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "context/context_internal.h"

/* At most this many events per context per poll, so one flooding device cannot keep
 * the monitor from the others. */
#define EVENTS_PER_CONTEXT_PER_POLL 256

/* Fatal and lost-consumer contexts are fenced: no event or refresh resumes them (a lost
 * one is resumed only by its reopen, reopen.c). */
static int fenced_for_good(const ote_context_t *ctx) {
    ote_context_state_t st = ote_context_state(ctx);
    return st == OTE_CONTEXT_FATAL || st == OTE_CONTEXT_LOST;
}

static void set_state(ote_context_t *ctx, ote_context_state_t st) {
    ote_mutex_lock(&ctx->set->mu);
    if (!fenced_for_good(ctx)) atomic_store(&ctx->state, (int)st);
    ctx->route_generation++;
    ote_mutex_unlock(&ctx->set->mu);
}

ote_status_t ote__context_refresh(ote_context_t *ctx, const char *why_refresh) {
    if (fenced_for_good(ctx)) return ote_context_check(ctx);
    ote_mutex_lock(&ctx->set->mu);
    uint8_t port = ctx->route.port;
    uint64_t gen = ctx->route_generation; /* what this query's result may replace */
    ote_mutex_unlock(&ctx->set->mu);
    /* A pin stays strict; automatic selection is repeated on the same port. */
    ote_context_route_t route;
    int active = 0;
    char why[160] = "";
    ote_status_t st =
        ote__context_select_route(ctx, port, ctx->pin_gid_index, &route, &active, why, sizeof(why));
    if (st != OTE_OK && ctx->pin_gid_index >= 0 && why[0] != '\0')
        OTE_ERROR("context", "%s device %s port %u GID index %d %s (%s)",
                  ctx->pinned ? "pinned route" : "fixed GID index of", ctx->name, (unsigned)port,
                  ctx->pin_gid_index, why, why_refresh);
    ote_mutex_lock(&ctx->set->mu);
    ote_context_state_t old = ote_context_state(ctx);
    if (fenced_for_good(ctx)) {
        ote_mutex_unlock(&ctx->set->mu);
        return ote_context_check(ctx);
    }
    if (ctx->route_generation != gen) {
        /* Something newer (an event, another refresh) changed the state or the route
         * while this query ran: its result is stale and must not resume a context paused
         * since, nor bring back an old route. The next refresh asks again. */
        uint64_t now_gen = ctx->route_generation;
        ote_mutex_unlock(&ctx->set->mu);
        OTE_DEBUG("context",
                  "device %s: refresh (%s) discarded: route generation %llu became %llu "
                  "while it queried",
                  ctx->name, why_refresh, (unsigned long long)gen, (unsigned long long)now_gen);
        return OTE_ERR_AGAIN;
    }
    ote_context_state_t now = (st == OTE_OK && active) ? OTE_CONTEXT_ACTIVE : OTE_CONTEXT_PAUSED;
    int changed = now != old;
    if (st == OTE_OK &&
        (route.gid_index != ctx->route.gid_index ||
         memcmp(route.gid.raw, ctx->route.gid.raw, sizeof(route.gid.raw)) != 0 ||
         route.lid != ctx->route.lid || route.active_mtu != ctx->route.active_mtu)) {
        ctx->route = route;
        changed = 1;
    } else if (st == OTE_OK) { /* the same entry: its netdev may have come or gone */
        memcpy(ctx->route.netdev, route.netdev, sizeof(route.netdev));
        ctx->route.netdev_state = route.netdev_state;
    }
    atomic_store(&ctx->state, (int)now);
    if (changed) ctx->route_generation++;
    int gid_index = ctx->route.gid_index;
    ote_mutex_unlock(&ctx->set->mu);
    if (changed) {
        if (now == OTE_CONTEXT_ACTIVE)
            OTE_INFO("context", "device %s port %u GID index %d: context active (%s)", ctx->name,
                     (unsigned)port, gid_index, why_refresh);
        else
            OTE_WARN("context", "device %s port %u: context paused (%s)", ctx->name, (unsigned)port,
                     why_refresh);
    }
    if (st != OTE_OK) return st;
    return now == OTE_CONTEXT_ACTIVE ? OTE_OK : OTE_ERR_PORT_DOWN;
}

ote_status_t ote_context_refresh(ote_context_t *ctx) {
    return ote__context_refresh(ctx, "refresh");
}

static void apply_event(ote_context_t *ctx, const struct ibv_async_event *ev) {
    ote_mutex_lock(&ctx->set->mu);
    uint8_t port = ctx->route.port;
    ote_mutex_unlock(&ctx->set->mu);
    switch (ev->event_type) {
        case IBV_EVENT_PORT_ERR:
            if (ev->element.port_num != port) break;
            set_state(ctx, OTE_CONTEXT_PAUSED);
            OTE_WARN("context", "device %s port %u down: context paused, no new routes", ctx->name,
                     (unsigned)port);
            break;
        case IBV_EVENT_PORT_ACTIVE:
        case IBV_EVENT_GID_CHANGE:
        case IBV_EVENT_LID_CHANGE:
            if (ev->element.port_num != port) break;
            (void)ote__context_refresh(ctx, ote_verbs_event_name(ev->event_type));
            break;
        case IBV_EVENT_DEVICE_FATAL:
            ote_mutex_lock(&ctx->set->mu);
            if (ote_context_state(ctx) != OTE_CONTEXT_LOST)
                atomic_store(&ctx->state, (int)OTE_CONTEXT_FATAL);
            ctx->route_generation++;
            ote_mutex_unlock(&ctx->set->mu);
            OTE_ERROR("context", "device %s: fatal device error; context fenced", ctx->name);
            break;
        default:
            OTE_DEBUG("context", "device %s: async event %s", ctx->name,
                      ote_verbs_event_name(ev->event_type));
            break;
    }
}

static void notify(ote_context_set_t *set, ote_context_t *ctx, const struct ibv_async_event *ev) {
    ote_mutex_lock(&set->listeners_mu);
    for (ote_context_listener_t *l = set->listeners; l != NULL; l = l->next) l->fn(l->arg, ctx, ev);
    ote_mutex_unlock(&set->listeners_mu);
}

/* get_async_event failed (not EAGAIN, EINTR or EOPNOTSUPP): the events of ctx can no
 * longer be proven seen and acked. The context is fenced (OTE_CONTEXT_LOST) until
 * ote_context_reopen/resume (reopen.c), its route generation bumped (upper layers fence
 * the QPs built before: their work ends), and the events of its native context are never
 * asked for again. */
static void lose_consumer(ote_context_t *ctx, int err) {
    ote_mutex_lock(&ctx->set->mu);
    atomic_store(&ctx->state, (int)OTE_CONTEXT_LOST);
    ctx->route_generation++;
    ote_mutex_unlock(&ctx->set->mu);
    OTE_ERROR("context",
              "device %s: get_async_event failed: errno %d: event consumer lost; device "
              "fenced (no new work, its QPs' work ends) until it is reopened",
              ctx->name, err);
}

ote_status_t ote_context_set_poll_events(ote_context_set_t *set, size_t *handled_out) {
    size_t handled = 0;
    ote_status_t result = OTE_OK;
    for (size_t i = 0; i < set->count; i++) {
        ote_context_t *ctx = set->contexts[i];
        ote_verbs_t *v = ctx->v;
        if (ote_context_state(ctx) == OTE_CONTEXT_LOST) continue; /* never asked again */
        for (int n = 0; n < EVENTS_PER_CONTEXT_PER_POLL; n++) {
            struct ibv_async_event ev;
            memset(&ev, 0, sizeof(ev));
            int err = v->ops->get_async_event(v, ctx->native, &ev);
            if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR) break;
            if (err != 0) {
                if (err != EOPNOTSUPP) {
                    lose_consumer(ctx, err);
                    if (result == OTE_OK) result = ote_status_make(OTE_ERR_NATIVE, err);
                }
                break;
            }
            apply_event(ctx, &ev);
            notify(set, ctx, &ev);
            v->ops->ack_async_event(v, &ev);
            handled++;
        }
    }
    if (handled_out != NULL) *handled_out = handled;
    return result;
}

size_t ote_context_set_async_fds(const ote_context_set_t *set, int *fds, size_t cap) {
    size_t n = 0;
    for (size_t i = 0; i < set->count && n < cap; i++) {
        ote_context_t *ctx = set->contexts[i];
        /* A LOST context's events are not read: its fd, maybe readable for good, would
         * wake the monitor at once every time. */
        if (ote_context_state(ctx) == OTE_CONTEXT_LOST) continue;
        struct ibv_context *native = atomic_load(&ctx->native);
        if (native != NULL && native->async_fd >= 0) fds[n++] = native->async_fd;
    }
    return n;
}

ote_status_t ote_context_set_add_listener(ote_context_set_t *set, ote_context_event_fn fn,
                                          void *arg, uint64_t *id_out) {
    if (fn == NULL) return OTE_ERR_INVALID;
    ote_context_listener_t *l = ote_calloc(1, sizeof(*l));
    if (l == NULL) return OTE_ERR_NOMEM;
    l->fn = fn;
    l->arg = arg;
    ote_mutex_lock(&set->listeners_mu);
    l->id = set->next_listener_id++;
    l->next = set->listeners;
    set->listeners = l;
    ote_mutex_unlock(&set->listeners_mu);
    if (id_out != NULL) *id_out = l->id;
    return OTE_OK;
}

void ote_context_set_remove_listener(ote_context_set_t *set, uint64_t id) {
    ote_mutex_lock(&set->listeners_mu);
    for (ote_context_listener_t **p = &set->listeners; *p != NULL; p = &(*p)->next) {
        if ((*p)->id == id) {
            ote_context_listener_t *l = *p;
            *p = l->next;
            ote_free(l);
            break;
        }
    }
    ote_mutex_unlock(&set->listeners_mu);
}

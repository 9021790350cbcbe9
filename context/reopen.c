/*
 * context/reopen.c - reopening a context whose async event consumer was lost.
 *
 * A failed get_async_event (events.c, lose_consumer) leaves the context LOST: the events
 * of its native context can no longer be proven seen and acked, so nothing new is built
 * on it. The way back is a new native context, in two calls. ote_context_reopen() opens
 * the device again (by name, from the provider's list), allocates a PD on it, selects the
 * route on the same port (a pin or a fixed GID index stays strict), and swaps the new
 * native context and PD in; the context stays LOST, so its user can make what it had on
 * the old ones anew before anything is admitted. The old PD and native context are
 * released after the swap; whatever will not be released (dealloc_pd EBUSY: something
 * still lives on it; close_device failing) is retired: kept on the context's list,
 * counted as OTE_RETAINED_PD, retried by each later reopen and by the set's close (which
 * answers OTE_ERR_RETAINED while it stays). ote_context_resume() then admits work again
 * (a refresh decides ACTIVE or PAUSED) and its events are read again. A failed reopen
 * changes nothing: the context stays LOST with its old natives, and the next try waits a
 * backoff (100 ms, doubled per failure, at most 5 s).
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "base/time.h"
#include "context/context_internal.h"

#define REOPEN_BACKOFF_MIN_NS (100 * OTE_NSEC_PER_MSEC)
#define REOPEN_BACKOFF_MAX_NS (5 * OTE_NSEC_PER_SEC)

void ote__context_nonblocking(struct ibv_context *native) {
    if (native == NULL || native->async_fd < 0) return;
    int fl = fcntl(native->async_fd, F_GETFL);
    if (fl >= 0) (void)fcntl(native->async_fd, F_SETFL, fl | O_NONBLOCK);
}

/* Deallocates pd (when not NULL) and closes native: 0, or the errno of what failed (the
 * PD is NULLed in *pd once deallocated). */
static int release_natives(ote_verbs_t *v, struct ibv_context *native, struct ibv_pd **pd) {
    if (*pd != NULL) {
        int err = v->ops->dealloc_pd(v, *pd);
        if (err != 0) return err;
        *pd = NULL;
    }
    return native != NULL ? v->ops->close_device(v, native) : 0;
}

ote_status_t ote__context_release_retired(ote_context_t *ctx) {
    ote_status_t result = OTE_OK;
    ote_mutex_lock(&ctx->set->mu);
    ote_context_retired_t **pp = &ctx->retired;
    while (*pp != NULL) {
        ote_context_retired_t *r = *pp;
        int err = release_natives(ctx->v, r->native, &r->pd);
        if (err != 0) {
            if (result == OTE_OK) result = ote_status_make(OTE_ERR_RETAINED, err);
            pp = &r->next;
            continue;
        }
        *pp = r->next;
        ote_free(r);
        ote_context_retained_add(ctx, OTE_RETAINED_PD, -1);
        OTE_INFO("context", "device %s: a native context retired by a reopen is released",
                 ctx->name);
    }
    ote_mutex_unlock(&ctx->set->mu);
    return result;
}

/* The device of ctx opened anew with a PD: *native_out, *pd_out. */
static ote_status_t open_native(ote_context_t *ctx, struct ibv_context **native_out,
                                struct ibv_pd **pd_out) {
    ote_verbs_t *v = ctx->v;
    struct ibv_device **list = NULL;
    int num = 0, err = v->ops->get_device_list(v, &list, &num);
    if (err != 0) {
        OTE_WARN("context", "device %s: reopen: get_device_list failed: errno %d", ctx->name, err);
        return ote_status_make(OTE_ERR_NO_DEVICE, err);
    }
    struct ibv_device *dev = NULL;
    for (int i = 0; i < num && dev == NULL; i++) {
        const char *name = v->ops->get_device_name(v, list[i]);
        if (name != NULL && strcmp(name, ctx->name) == 0) dev = list[i];
    }
    ote_status_t st = OTE_OK;
    struct ibv_context *native = NULL;
    if (dev == NULL) {
        OTE_WARN("context", "device %s: reopen: the provider no longer lists it", ctx->name);
        st = OTE_ERR_NO_DEVICE;
    } else if ((err = v->ops->open_device(v, dev, &native)) != 0) {
        OTE_WARN("context", "device %s: reopen: open_device failed: errno %d", ctx->name, err);
        st = ote_status_make(OTE_ERR_NATIVE, err);
    }
    v->ops->free_device_list(v, list);
    if (st != OTE_OK) return st;
    struct ibv_pd *pd = NULL;
    if ((err = v->ops->alloc_pd(v, native, &pd)) != 0) {
        OTE_WARN("context", "device %s: reopen: alloc_pd failed: errno %d", ctx->name, err);
        (void)v->ops->close_device(v, native);
        return ote_status_make(OTE_ERR_NATIVE, err);
    }
    ote__context_nonblocking(native);
    *native_out = native;
    *pd_out = pd;
    return OTE_OK;
}

/* Releases the old natives, or retires them (kept, counted) when they will not go. */
static void retire_old(ote_context_t *ctx, struct ibv_context *native, struct ibv_pd *pd) {
    int err = release_natives(ctx->v, native, &pd);
    if (err == 0) return;
    ote_context_retired_t *r = ote_calloc(1, sizeof(*r));
    /* Without memory for the record the natives are still never freed on a guess: they
     * leak (counted), as a retained owner whose record could not be kept. */
    if (r != NULL) {
        r->native = native;
        r->pd = pd;
        ote_mutex_lock(&ctx->set->mu);
        r->next = ctx->retired;
        ctx->retired = r;
        ote_mutex_unlock(&ctx->set->mu);
    }
    ote_context_retained_add(ctx, OTE_RETAINED_PD, 1);
    OTE_WARN("context",
             "device %s: reopen: the old %s could not be released (errno %d): retained until a "
             "later reopen or the set's close releases it",
             ctx->name, pd != NULL ? "PD" : "native context", err);
}

/* Claims the reopen of ctx (OTE_OK), or says that it is done already (*done_out) or why
 * not. Under set->mu. */
static ote_status_t claim(ote_context_t *ctx, int *done_out) {
    if (ote_context_state(ctx) != OTE_CONTEXT_LOST) return OTE_ERR_STATE;
    if (ctx->reopening) return OTE_ERR_BUSY;
    *done_out = ctx->reopened;
    if (ctx->reopened) return OTE_OK;
    if (ote_now_ns() < ctx->reopen_next_ns) return OTE_ERR_AGAIN;
    ctx->reopening = 1;
    return OTE_OK;
}

/* A failed try: the context stays LOST; the next one waits the (doubled) backoff. */
static ote_status_t failed(ote_context_t *ctx, ote_status_t st) {
    ote_mutex_lock(&ctx->set->mu);
    uint64_t b = ctx->reopen_backoff_ns == 0 ? REOPEN_BACKOFF_MIN_NS : ctx->reopen_backoff_ns * 2;
    if (b > REOPEN_BACKOFF_MAX_NS) b = REOPEN_BACKOFF_MAX_NS;
    ctx->reopen_backoff_ns = b;
    ctx->reopen_next_ns = ote_now_ns() + b;
    ctx->reopen_failures++;
    ctx->reopen_error = st;
    ctx->reopening = 0;
    uint64_t n = ctx->reopen_failures;
    ote_mutex_unlock(&ctx->set->mu);
    OTE_WARN("context",
             "device %s: reopen failed (%s, failure %llu): still fenced; retry in %llu ms",
             ctx->name, ote_status_str(st), (unsigned long long)n,
             (unsigned long long)(b / OTE_NSEC_PER_MSEC));
    return st;
}

ote_status_t ote_context_reopen(ote_context_t *ctx) {
    if (ctx == NULL) return OTE_ERR_INVALID;
    int done = 0;
    ote_mutex_lock(&ctx->set->mu);
    ote_status_t st = claim(ctx, &done);
    ote_mutex_unlock(&ctx->set->mu);
    if (st != OTE_OK || done) return st;
    struct ibv_context *native = NULL;
    struct ibv_pd *pd = NULL;
    st = open_native(ctx, &native, &pd);
    if (st != OTE_OK) return failed(ctx, st);
    /* The route is selected on the new native context: swapped in while the context is
     * still LOST (nothing is built on it meanwhile), swapped back when no route is found. */
    struct ibv_context *old_native = atomic_exchange(&ctx->native, native);
    struct ibv_pd *old_pd = atomic_exchange(&ctx->pd, pd);
    ote_mutex_lock(&ctx->set->mu);
    uint8_t port = ctx->route.port;
    ote_mutex_unlock(&ctx->set->mu);
    ote_context_route_t route;
    int active = 0;
    char why[160] = "";
    st =
        ote__context_select_route(ctx, port, ctx->pin_gid_index, &route, &active, why, sizeof(why));
    if (st != OTE_OK) {
        atomic_store(&ctx->native, old_native);
        atomic_store(&ctx->pd, old_pd);
        (void)release_natives(ctx->v, native, &pd);
        if (why[0] != '\0') OTE_WARN("context", "device %s: reopen: %s", ctx->name, why);
        return failed(ctx, st);
    }
    ote_mutex_lock(&ctx->set->mu);
    ctx->route = route;
    ctx->reopened = 1; /* still LOST: ote_context_resume() admits work again */
    ctx->reopens++;
    ctx->reopen_backoff_ns = 0;
    ctx->reopen_next_ns = 0;
    ctx->reopen_error = OTE_OK;
    ctx->reopening = 0;
    ote_mutex_unlock(&ctx->set->mu);
    retire_old(ctx, old_native, old_pd);
    (void)ote__context_release_retired(ctx); /* earlier reopens' leftovers */
    OTE_INFO("context", "device %s: reopened (new native context and PD); fenced until resumed",
             ctx->name);
    return OTE_OK;
}

ote_status_t ote_context_resume(ote_context_t *ctx) {
    if (ctx == NULL) return OTE_ERR_INVALID;
    ote_mutex_lock(&ctx->set->mu);
    int ok = ote_context_state(ctx) == OTE_CONTEXT_LOST && ctx->reopened && !ctx->reopening;
    if (ok) {
        ctx->reopened = 0;
        atomic_store(&ctx->state, (int)OTE_CONTEXT_PAUSED); /* the refresh below decides */
        ctx->route_generation++;
    }
    ote_mutex_unlock(&ctx->set->mu);
    if (!ok) return OTE_ERR_STATE;
    ote_status_t st = ote__context_refresh(ctx, "reopened");
    ote__context_log_route(ctx, st == OTE_OK ? "reopened" : "reopened (paused)");
    return OTE_OK;
}

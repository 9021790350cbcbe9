/*
 * engine/engine.c - the engine's lifecycle (create with its transport, destroy, address)
 * and segments (a segment owns its transport peer). Ownership and locks: core_internal.h.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/log.h"
#include "base/time.h"
#include "engine/control/auth.h"
#include "engine/core_internal.h"
#include "engine/file/file.h"
#include "engine/notify_internal.h"
#include "engine/registry_internal.h"
#include "engine/router_internal.h"
#include "engine/shared_mem_internal.h"
#include "engine/stats_internal.h"

/* Whether "host:port" resolves to a loopback address (127.0.0.0/8, ::1, ::ffff:127.x). */
static int is_loopback(const char *addr) {
    struct sockaddr_storage ss;
    socklen_t sl = 0;
    if (ote__addr_resolve(addr, &ss, &sl) != OTE_OK) return 0;
    if (ss.ss_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)&ss)->sin_addr.s_addr) >> 24) == 127;
    if (ss.ss_family != AF_INET6) return 0;
    const struct in6_addr *a = &((const struct sockaddr_in6 *)&ss)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
}

/* The cluster key, or the policy for an engine without one: loopback only, unless
 * allow_unauthenticated=1. *key_out = NULL when there is no key. */
static ote_status_t auth_setup(const ote__cfg_t *rc, ote_auth_key_t **key_out) {
    *key_out = NULL;
    if (rc->auth_key_file[0] != '\0') return ote_auth_key_load(rc->auth_key_file, key_out);
    if (is_loopback(rc->listen_address)) return OTE_OK;
    if (rc->allow_unauthenticated) {
        OTE_WARN("engine",
                 "listening on %s without a key (allow_unauthenticated=1): any process that "
                 "reaches this port can read and write every registered buffer",
                 rc->listen_address);
        return OTE_OK;
    }
    OTE_ERROR("engine",
              "listen_address %s is not loopback and no auth_key_file is set: any process that "
              "reaches it could read and write every registered buffer. Set auth_key_file "
              "(OTE_AUTH_KEY_FILE) to the cluster's key file, or allow_unauthenticated=1 to "
              "accept that",
              rc->listen_address);
    return OTE_ERR_INVALID;
}

/* A random nonzero 64-bit epoch for a new engine instance (getrandom). Should the kernel
 * have no entropy call, a mix of the clock, the pid and an address stands in (a WARN says
 * so): still distinct between two instances at one address, which is all it is for. */
static uint64_t new_epoch(const void *salt) {
    uint64_t v = 0;
    ssize_t n = getrandom(&v, sizeof(v), GRND_NONBLOCK);
    if (n != (ssize_t)sizeof(v)) {
        OTE_WARN("engine", "getrandom for the engine's epoch failed: clock and pid used instead");
        v = ote_now_ns() * 0x9E3779B97F4A7C15ull ^ ((uint64_t)getpid() << 32) ^
            (uint64_t)(uintptr_t)salt;
    }
    return v != 0 ? v : 1;
}

/* The services the transports call back into, owned by the libraries above the router
 * (registry, notify, shared_mem), which call the router themselves: the lifecycle, above
 * them all, hands them to the router at creation (engine/router_internal.h). */
static const ote__router_upcalls_t g_router_upcalls = {
    .pin = ote__reg_pin,
    .unpin = ote__reg_unpin,
    .buffers = ote__reg_buffers,
    .deliver_notify = ote__notify_deliver,
    .shared_find = ote__shared_find,
};

static ote_status_t engine_start(ote_engine_t *e);

ote_status_t ote_engine_create(const ote_config_t *cfg, ote_engine_t **engine_out) {
    if (engine_out == NULL) return OTE_ERR_INVALID;
    ote__cfg_t rc;
    ote_status_t st = ote__config_resolve(cfg, &rc);
    if (st != OTE_OK) return st;
    if (rc.log_level[0]) ote_log_set_level((ote_log_level_t)ote_log_parse_level(rc.log_level));
    ote_auth_key_t *key = NULL;
    st = auth_setup(&rc, &key);
    if (st != OTE_OK) return st;
    ote_engine_t *e = ote_calloc(1, sizeof(*e));
    if (e == NULL) {
        ote_auth_key_free(key);
        return OTE_ERR_NOMEM;
    }
    e->cfg = rc;
    e->auth_key = key; /* owned by the engine from here */
    e->epoch = new_epoch(e);
    /* This thread's lines, and those of every thread the engine starts, name the engine
     * (its address, once the listener has it: nothing is logged after e is freed). */
    const char *prev_tag = ote_log_set_thread_engine(e->log_tag);
    st = engine_start(e);
    ote_log_set_thread_engine(prev_tag);
    if (st == OTE_OK) *engine_out = e;
    return st;
}

/* The engine's locks, shared memory, GPU services and transports; on failure e is freed
 * (unless a transport retained it). */
static ote_status_t engine_start(ote_engine_t *e) {
    ote_status_t st;
    if (pthread_rwlock_init(&e->reg_lk, NULL) != 0) {
        st = OTE_ERR_NOMEM;
        goto err_free;
    }
    st = ote_mutex_init(&e->nmu);
    if (st != OTE_OK) goto err_rw;
    st = ote_cond_init(&e->ncv);
    if (st != OTE_OK) goto err_nmu;
    st = ote_mutex_init(&e->omu);
    if (st != OTE_OK) goto err_ncv;
    st = ote_cond_init(&e->ocv);
    if (st != OTE_OK) goto err_omu;
    st = ote_mutex_init(&e->segmu);
    if (st != OTE_OK) goto err_ocv;
    st = ote__shared_init(e);
    if (st != OTE_OK) goto err_segmu;
    st = ote__files_create(&e->cfg, &e->files);
    if (st != OTE_OK) goto err_shared;
    /* Every transport of the list (router.c); rdma fails, naming what is missing, when no
     * device is usable (never a fallback). */
    st = ote__gpu_create(&e->cfg, &e->gpu);
    if (st != OTE_OK) goto err_files;
    st = ote__router_create(e, &g_router_upcalls);
    if (st != OTE_OK && e->retained) {
        /* A transport's rollback left native owners or a thread behind, which may still
         * use e: e is not freed (logged; counted by the layers that retained). */
        OTE_ERROR("engine",
                  "creation failed (%s) and left a transport retained: its engine "
                  "object is not freed",
                  ote_status_str(st));
        return st;
    }
    if (st != OTE_OK) goto err_gpu;
    return OTE_OK;

err_gpu:
    /* A creation that failed has moved no GPU work; a retained remainder stays with the
     * CUDA layer (logged) and is not the engine's to wait for. */
    (void)ote__gpu_destroy(e->gpu);
err_files:
    (void)ote__files_destroy(e->files); /* nothing registered yet: never BUSY */
err_shared:
    ote__shared_fini(e);
err_segmu:
    ote_mutex_destroy(&e->segmu);
err_ocv:
    ote_cond_destroy(&e->ocv);
err_omu:
    ote_mutex_destroy(&e->omu);
err_ncv:
    ote_cond_destroy(&e->ncv);
err_nmu:
    ote_mutex_destroy(&e->nmu);
err_rw:
    pthread_rwlock_destroy(&e->reg_lk);
err_free:
    ote_auth_key_free(e->auth_key);
    ote_free(e);
    return st;
}

/* Refused (BUSY, nothing done) while segments or batches are open. Otherwise the
 * listener stops and the transports are destroyed; a transport that is retained (a QP,
 * window, MR, CQ or PD whose native destroy failed, or a thread of it that did not end
 * within its bound) keeps the engine, its registrations and everything the retained
 * transport still owns (memory a NIC could still reach stays registered): RETAINED, and
 * every other call on e is refused with OTE_ERR_STATE from then on. A later destroy
 * retries exactly what is left and frees everything once it succeeds. */
static ote_status_t engine_destroy(ote_engine_t *e) {
    long segs = atomic_load(&e->nsegments), batches = atomic_load(&e->nbatches);
    if (segs > 0 || batches > 0) {
        OTE_WARN("engine", "destroy refused: %ld segment(s) and %ld batch(es) still open", segs,
                 batches);
        return OTE_ERR_BUSY;
    }
    int again = atomic_exchange_explicit(&e->destroying, 1, memory_order_acq_rel);
    ote__notify_retry_stop(e); /* nothing is queued: every segment is closed */
    ote_status_t st = ote__router_destroy(e);
    if (st != OTE_OK) {
        OTE_ERROR("engine",
                  "destroy%s of engine %s incomplete (%s): %zu transport(s) retained; the "
                  "engine, its %zu registration(s) and what the transports could not "
                  "destroy are kept (memory stays registered). Every call but "
                  "ote_engine_destroy now returns OTE_ERR_STATE; call ote_engine_destroy "
                  "again to retry",
                  again ? " (again)" : "", e->self_addr, ote_status_str(st), e->ntps, e->nregs);
        return ote_status_code(st) == OTE_ERR_RETAINED ? st : OTE_ERR_RETAINED;
    }
    if (again) OTE_INFO("engine", "engine %s: a retried destroy finished", e->self_addr);
    /* After the transports: their bounce buffers are back and the RDMA source's MRs
     * over the pool's chunks deregistered. GPU work the CUDA layer cannot release yet keeps
     * the engine, as a retained transport does. The file owner's cuFile registrations of
     * device memory go first. */
    ote__files_release_device(e->files);
    if (e->gpu != NULL) {
        ote_status_t gst = ote__gpu_destroy(e->gpu);
        if (gst != OTE_OK) {
            OTE_ERROR("engine",
                      "destroy%s of engine %s incomplete: GPU work retained (%s); the engine "
                      "and its %zu registration(s) are kept. Call ote_engine_destroy again "
                      "to retry",
                      again ? " (again)" : "", e->self_addr, ote_status_str(gst), e->nregs);
            return OTE_ERR_RETAINED;
        }
        e->gpu = NULL;
    }
    /* Every segment is closed, so no slice is in flight on a file registration: the
     * file owner closes its files and stops its I/O engine. */
    (void)ote__files_destroy(e->files);
    e->files = NULL;
    ote__shared_fini(e); /* after the transports: no peer sends its fd any more */
    for (size_t i = 0; i < e->nregs; i++) ote_free(e->regs[i]);
    ote_free(e->regs);
    while (e->nhead) {
        ote__nin_t *n = e->nhead;
        e->nhead = n->next;
        ote_free(n);
    }
    ote_mutex_destroy(&e->segmu);
    ote_cond_destroy(&e->ocv);
    ote_mutex_destroy(&e->omu);
    ote_cond_destroy(&e->ncv);
    ote_mutex_destroy(&e->nmu);
    pthread_rwlock_destroy(&e->reg_lk);
    ote_auth_key_free(e->auth_key);
    ote_free(e);
    return OTE_OK;
}

/* The public calls that name an engine and may log from lower layers tag this thread's
 * lines with it for their duration (<ote/log.h>). */
ote_status_t ote_engine_destroy(ote_engine_t *e) {
    if (e == NULL) return OTE_ERR_INVALID;
    const char *prev = ote_log_set_thread_engine(e->log_tag);
    ote_status_t st = engine_destroy(e); /* e may be freed: its tag is not read again */
    ote_log_set_thread_engine(prev);
    return st;
}

ote_status_t ote_engine_address(ote_engine_t *e, char *buf, size_t len) {
    if (e == NULL || buf == NULL || len == 0) return OTE_ERR_INVALID;
    if (OTE__ENGINE_GONE(e)) return OTE_ERR_STATE;
    size_t n = strlen(e->self_addr);
    if (n >= len) return OTE_ERR_TOO_BIG;
    memcpy(buf, e->self_addr, n + 1);
    return OTE_OK;
}

static ote_status_t segment_open(ote_engine_t *e, const char *peer, ote_segment_t **seg_out) {
    char host[256];
    uint16_t port;
    if (strlen(peer) >= OTE__ADDR_MAX ||
        ote__addr_split(peer, host, sizeof(host), &port, NULL) != OTE_OK || port == 0) {
        OTE_WARN("engine", "segment_open: \"%s\" is not \"host:port\" or \"[v6]:port\"", peer);
        return OTE_ERR_INVALID;
    }
    ote_segment_t *s = ote_calloc(1, sizeof(*s));
    if (s == NULL) return OTE_ERR_NOMEM;
    ote_status_t st = ote__router_open(e, peer, &s->tp, &s->tpname, &s->peer);
    if (ote_status_code(st) == OTE_ERR_TIMEOUT) {
        /* The peer took the connection but did not complete the handshake by
         * connect_timeout_ms: a peer-scope failure to connect, not a request's deadline. */
        OTE_WARN("engine",
                 "segment_open %s: no handshake within connect_timeout_ms=%llu (not an OrbitTE "
                 "engine, or one too busy to answer)",
                 peer, (unsigned long long)e->cfg.connect_timeout_ms);
        st = ote_status_make(OTE_ERR_CONNECT, ETIMEDOUT);
    } else if (ote_status_code(st) == OTE_ERR_PROTOCOL) {
        OTE_WARN("engine", "segment_open %s: the peer does not speak OrbitTE's handshake", peer);
    }
    if (st != OTE_OK) {
        if (ote_status_code(st) == OTE_ERR_AUTH)
            atomic_fetch_add_explicit(&e->auth_open_failures, 1, memory_order_relaxed);
        ote_free(s);
        return st;
    }
    s->e = e;
    snprintf(s->name, sizeof(s->name), "%s", peer);
    s->tpid = ote__stats_transport_id(s->tpname);
    ote__stats_attach(e, s);
    atomic_fetch_add(&e->nsegments, 1);
    *seg_out = s;
    return OTE_OK;
}

ote_status_t ote_segment_open(ote_engine_t *e, const char *peer, ote_segment_t **seg_out) {
    if (e == NULL || peer == NULL || seg_out == NULL) return OTE_ERR_INVALID;
    if (OTE__ENGINE_GONE(e)) return OTE_ERR_STATE;
    const char *prev = ote_log_set_thread_engine(e->log_tag);
    ote_status_t st = segment_open(e, peer, seg_out);
    ote_log_set_thread_engine(prev);
    return st;
}

ote_status_t ote_segment_open_local(ote_engine_t *e, ote_segment_t **seg_out) {
    if (e == NULL || seg_out == NULL) return OTE_ERR_INVALID;
    if (OTE__ENGINE_GONE(e)) return OTE_ERR_STATE;
    ote_segment_t *s = ote_calloc(1, sizeof(*s));
    if (s == NULL) return OTE_ERR_NOMEM;
    s->tp = ote__files_transport(e->files);
    s->tpname = s->tp->ops->name;
    ote_status_t st = s->tp->ops->peer_open(s->tp, "local", &s->peer);
    if (st != OTE_OK) {
        ote_free(s);
        return st;
    }
    s->e = e;
    snprintf(s->name, sizeof(s->name), "local");
    s->tpid = ote__stats_transport_id(s->tpname);
    ote__stats_attach(e, s);
    atomic_fetch_add(&e->nsegments, 1);
    *seg_out = s;
    return OTE_OK;
}

static ote_status_t segment_close(ote_segment_t *s) {
    if (atomic_load(&s->pending) > 0) return OTE_ERR_BUSY;
    ote_engine_t *e = s->e;
    /* Notifications on their way (sent after their batch's data) are waited for: each
     * ends by its deadline. */
    if (atomic_load(&s->notes) > 0) {
        ote_deadline_t dl =
            ote_deadline_after((e->cfg.transfer_timeout_ms + 1000) * OTE_NSEC_PER_MSEC);
        ote_mutex_lock(&e->omu);
        while (atomic_load(&s->notes) > 0)
            if (ote_cond_wait(&e->ocv, &e->omu, dl) == OTE_ERR_TIMEOUT) break;
        ote_mutex_unlock(&e->omu);
        if (atomic_load(&s->notes) > 0) return OTE_ERR_BUSY;
    }
    ote_status_t st = s->tp->ops->peer_close(s->peer);
    if (st != OTE_OK) return st;
    ote__stats_detach(e, s);
    atomic_fetch_sub(&e->nsegments, 1);
    ote_free(s);
    return OTE_OK;
}

ote_status_t ote_segment_close(ote_segment_t *s) {
    if (s == NULL) return OTE_ERR_INVALID;
    const char *prev = ote_log_set_thread_engine(s->e->log_tag);
    ote_segment_close_hook_t hook = s->close_hook;
    void *arg = s->close_arg;
    if (hook != NULL) hook(arg, s, OTE_SEGMENT_CLOSING);
    ote_status_t st = segment_close(s); /* OTE_OK: s is freed */
    if (hook != NULL) hook(arg, s, st == OTE_OK ? OTE_SEGMENT_CLOSED : OTE_SEGMENT_CLOSE_REFUSED);
    ote_log_set_thread_engine(prev);
    return st;
}

ote_status_t ote_segment_set_close_hook(ote_segment_t *s, ote_segment_close_hook_t fn, void *arg) {
    if (s == NULL) return OTE_ERR_INVALID;
    s->close_hook = fn;
    s->close_arg = fn != NULL ? arg : NULL;
    return OTE_OK;
}

ote_status_t ote_segment_invalidate(ote_segment_t *s) {
    if (s == NULL) return OTE_ERR_INVALID;
    int live = OTE__SEG_LIVE;
    if (!atomic_compare_exchange_strong(&s->state, &live, OTE__SEG_INVALIDATED)) return OTE_OK;
    const char *prev = ote_log_set_thread_engine(s->e->log_tag);
    OTE_WARN("engine",
             "segment %s invalidated (its peer is gone): its requests end OTE_ERR_PEER_LOST; "
             "close it",
             s->name);
    s->tp->ops->peer_lost(s->peer);
    ote_log_set_thread_engine(prev);
    return OTE_OK;
}

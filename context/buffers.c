/*
 * context/buffers.c - the buffer manager (persistent MRs, all-or-nothing publication).
 *
 * Native reg/dereg run without the manager lock, so a long registration does not stall
 * lookups; the lock guards only the lists. A failed dereg keeps its MR on the owner that
 * had it (the registration, or the orphan list for rollbacks and single MRs) and counts
 * it once. Single MRs are only counted while their user holds them (an atomic: a
 * requester makes one per run over unregistered memory).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/fault.h"
#include "base/hash.h"
#include "base/lock.h"
#include "base/log.h"
#include "context/buffers.h"
#include "context/context_internal.h"

typedef struct {
    ote_context_t *ctx;
    struct ibv_mr *mr; /* NULL once deregistered */
    int retained;      /* a dereg failed; counted in the context and the manager */
} buf_mr_t;

struct ote_buffer {
    void *addr;
    size_t len;
    int access;
    int dmabuf_fd;       /* device memory: a duplicate of its dma-buf fd (a reopened device
                          * registers the range anew from it), closed with the buffer; else -1 */
    uint64_t dmabuf_off; /* the range's offset in that dma-buf */
    int retiring;
    size_t nmr;
    buf_mr_t *mrs;
    struct ote_buffer *prev, *next;
};

typedef struct orphan {
    ote_context_t *ctx;
    struct ibv_mr *mr;
    ote_buffer_mr_released_fn released; /* a single MR's owner, told once it is gone */
    void *owner, *item;
    struct orphan *next;
} orphan_t;

struct ote_buffer_manager {
    ote_context_set_t *set;
    ote_mutex_t mu;
    ote_buffer_t *live;     /* findable registrations */
    ote_buffer_t *retiring; /* handles whose deregistration failed */
    orphan_t *orphans;      /* rollback MRs that could not be deregistered */
    size_t live_count;
    size_t retained;
    _Atomic size_t single; /* single MRs made and not dropped */
};

ote_status_t ote_buffer_manager_create(ote_context_set_t *set, ote_buffer_manager_t **bm_out) {
    if (set == NULL || bm_out == NULL) return OTE_ERR_INVALID;
    ote_buffer_manager_t *bm = ote_calloc(1, sizeof(*bm));
    if (bm == NULL) return OTE_ERR_NOMEM;
    ote_status_t st = ote_mutex_init(&bm->mu);
    if (st != OTE_OK) {
        ote_free(bm);
        return st;
    }
    bm->set = set;
    *bm_out = bm;
    return OTE_OK;
}

ote_status_t ote_buffer_manager_destroy(ote_buffer_manager_t *bm) {
    if (bm == NULL) return OTE_OK;
    ote_mutex_lock(&bm->mu);
    int busy = bm->live != NULL || bm->retiring != NULL || atomic_load(&bm->single) != 0;
    int orphans = bm->orphans != NULL;
    ote_mutex_unlock(&bm->mu);
    if (busy) return OTE_ERR_BUSY;
    if (orphans) return OTE_ERR_RETAINED;
    ote_mutex_destroy(&bm->mu);
    ote_free(bm);
    return OTE_OK;
}

/* Deregister one MR slot. On failure the MR stays in the slot, counted once. */
static ote_status_t dereg_slot(ote_buffer_manager_t *bm, buf_mr_t *m) {
    if (m->mr == NULL) return OTE_OK;
    ote_verbs_t *v = ote_context_verbs(m->ctx);
    int err = v->ops->dereg_mr(v, m->mr);
    if (err != 0) {
        if (!m->retained) {
            m->retained = 1;
            ote_context_retained_add(m->ctx, OTE_RETAINED_MR, 1);
            ote_mutex_lock(&bm->mu);
            bm->retained++;
            ote_mutex_unlock(&bm->mu);
        }
        OTE_WARN("context", "device %s: dereg_mr failed: errno %d; MR retained",
                 ote_context_name(m->ctx), err);
        return ote_status_make(OTE_ERR_RETAINED, err);
    }
    m->mr = NULL;
    if (m->retained) {
        m->retained = 0;
        ote_context_retained_add(m->ctx, OTE_RETAINED_MR, -1);
        ote_mutex_lock(&bm->mu);
        bm->retained--;
        ote_mutex_unlock(&bm->mu);
    }
    return OTE_OK;
}

/* A retained MR (counted by dereg_slot) becomes the manager's orphan. OTE_ERR_NOMEM:
 * no memory to remember it: the MR is leaked, counted retained for good, and said so. */
static ote_status_t adopt_orphan(ote_buffer_manager_t *bm, const buf_mr_t *m,
                                 ote_buffer_mr_released_fn released, void *owner, void *item) {
    orphan_t *o = ote_calloc(1, sizeof(*o));
    if (o == NULL) {
        OTE_ERROR("context", "device %s: a retained MR could not be recorded (no memory): leaked",
                  ote_context_name(m->ctx));
        return OTE_ERR_NOMEM;
    }
    o->ctx = m->ctx;
    o->mr = m->mr;
    o->released = released;
    o->owner = owner;
    o->item = item;
    ote_mutex_lock(&bm->mu);
    o->next = bm->orphans;
    bm->orphans = o;
    ote_mutex_unlock(&bm->mu);
    return OTE_OK;
}

static int overlaps_exact(const ote_buffer_t *b, const void *addr, size_t len) {
    return b->addr == addr && b->len == len;
}

/* dmabuf_fd < 0: ibv_reg_mr of addr; else ibv_reg_dmabuf_mr of [dmabuf_off, +len) of
 * the dma-buf with iova addr. */
static ote_status_t republish_one(ote_buffer_t *b, ote_context_t *ctx);

/* A context skipped above as LOST may have been resumed since its reopen republished the
 * live registrations (before this one was listed): it gets its MR here, under bm->mu, as
 * its user's republish after the resume would have given it (see
 * ote_buffer_manager_republish). Failures leave it without one there. */
static void catch_up_reopened(ote_buffer_manager_t *bm, ote_buffer_t *buf) {
    size_t n = ote_context_set_count(bm->set);
    for (size_t i = 0; i < n; i++) {
        ote_context_t *ctx = ote_context_set_get(bm->set, i);
        ote_context_state_t cs = ote_context_state(ctx);
        if (cs == OTE_CONTEXT_FATAL || cs == OTE_CONTEXT_LOST) continue;
        (void)republish_one(buf, ctx); /* a no-op where it has an MR already */
    }
}

/* A buffer with no MR left (or none made): its dma-buf duplicate closed, its memory freed. */
static void buffer_free(ote_buffer_t *buf) {
    if (buf->dmabuf_fd >= 0) (void)close(buf->dmabuf_fd);
    ote_free(buf->mrs);
    ote_free(buf);
}

static ote_status_t buffer_register(ote_buffer_manager_t *bm, void *addr, size_t len, int access,
                                    int dmabuf_fd, uint64_t dmabuf_off, ote_buffer_t **buf_out) {
    if (bm == NULL || addr == NULL || len == 0 || buf_out == NULL) return OTE_ERR_INVALID;
    ote_status_t st;
    if (ote_fault_hit("context.buffer_register", &st)) return st;
    ote_mutex_lock(&bm->mu);
    for (ote_buffer_t *b = bm->live; b != NULL; b = b->next) {
        if (overlaps_exact(b, addr, len)) {
            ote_mutex_unlock(&bm->mu);
            return OTE_ERR_EXISTS;
        }
    }
    ote_mutex_unlock(&bm->mu);

    size_t n = ote_context_set_count(bm->set);
    ote_buffer_t *buf = ote_calloc(1, sizeof(*buf));
    if (buf == NULL) return OTE_ERR_NOMEM;
    buf->dmabuf_fd = -1;
    buf->mrs = ote_calloc(n > 0 ? n : 1, sizeof(*buf->mrs));
    if (buf->mrs == NULL) {
        ote_free(buf);
        return OTE_ERR_NOMEM;
    }
    buf->addr = addr;
    buf->len = len;
    buf->access = access;
    buf->dmabuf_off = dmabuf_off;
    if (dmabuf_fd >= 0 && (buf->dmabuf_fd = fcntl(dmabuf_fd, F_DUPFD_CLOEXEC, 0)) < 0) {
        int err = errno;
        OTE_ERROR("context", "register %p (%zu bytes): dup of its dma-buf fd failed: errno %d",
                  addr, len, err);
        buffer_free(buf);
        return ote_status_make(OTE_ERR_NATIVE, err);
    }
    st = OTE_OK;
    for (size_t i = 0; i < n; i++) {
        ote_context_t *ctx = ote_context_set_get(bm->set, i);
        ote_context_state_t cs = ote_context_state(ctx);
        if (cs == OTE_CONTEXT_FATAL || cs == OTE_CONTEXT_LOST) continue; /* not usable */
        ote_verbs_t *v = ote_context_verbs(ctx);
        struct ibv_mr *mr = NULL;
        int err = dmabuf_fd < 0
                      ? v->ops->reg_mr(v, ote_context_pd(ctx), addr, len, access, &mr)
                      : v->ops->reg_dmabuf_mr(v, ote_context_pd(ctx), dmabuf_off, len,
                                              (uint64_t)(uintptr_t)addr, dmabuf_fd, access, &mr);
        if (err != 0) {
            OTE_ERROR("context",
                      "device %s: %s(%p, %zu bytes, access 0x%x) failed: errno %d; "
                      "rolling back %zu MR(s) of this registration",
                      ote_context_name(ctx), dmabuf_fd < 0 ? "reg_mr" : "reg_dmabuf_mr", addr, len,
                      (unsigned)access, err, buf->nmr);
            st = ote_status_make(OTE_ERR_NATIVE, err);
            break;
        }
        buf->mrs[buf->nmr].ctx = ctx;
        buf->mrs[buf->nmr].mr = mr;
        buf->nmr++;
    }
    if (st == OTE_OK && buf->nmr == 0) {
        OTE_ERROR("context", "register %p (%zu bytes): no usable context", addr, len);
        st = OTE_ERR_NO_DEVICE;
    }
    if (st == OTE_OK) {
        ote_mutex_lock(&bm->mu);
        for (ote_buffer_t *b = bm->live; b != NULL; b = b->next)
            if (overlaps_exact(b, addr, len)) st = OTE_ERR_EXISTS; /* lost a race */
        if (st == OTE_OK) {
            catch_up_reopened(bm, buf);
            DL_APPEND(bm->live, buf);
            bm->live_count++;
        }
        ote_mutex_unlock(&bm->mu);
        if (st == OTE_OK) {
            *buf_out = buf;
            return OTE_OK;
        }
    }
    /* Roll back: a copy that cannot be deregistered becomes an orphan, still counted. */
    for (size_t i = buf->nmr; i-- > 0;) {
        buf_mr_t *m = &buf->mrs[i];
        if (dereg_slot(bm, m) != OTE_OK) (void)adopt_orphan(bm, m, NULL, NULL, NULL);
    }
    buffer_free(buf);
    return st;
}

ote_status_t ote_buffer_register(ote_buffer_manager_t *bm, void *addr, size_t len, int access,
                                 ote_buffer_t **buf_out) {
    return buffer_register(bm, addr, len, access, -1, 0, buf_out);
}

ote_status_t ote_buffer_register_dmabuf(ote_buffer_manager_t *bm, void *addr, size_t len,
                                        int access, int fd, uint64_t offset,
                                        ote_buffer_t **buf_out) {
    if (fd < 0) return OTE_ERR_INVALID;
    return buffer_register(bm, addr, len, access, fd, offset, buf_out);
}

ote_status_t ote_buffer_deregister(ote_buffer_manager_t *bm, ote_buffer_t *buf) {
    if (bm == NULL || buf == NULL) return OTE_ERR_INVALID;
    ote_mutex_lock(&bm->mu);
    if (!buf->retiring) {
        DL_DELETE(bm->live, buf);
        bm->live_count--;
        buf->retiring = 1;
        DL_APPEND(bm->retiring, buf);
    }
    ote_mutex_unlock(&bm->mu);
    ote_status_t result = OTE_OK;
    for (size_t i = buf->nmr; i-- > 0;) {
        ote_status_t st = dereg_slot(bm, &buf->mrs[i]);
        if (st != OTE_OK && result == OTE_OK) result = st;
    }
    if (result != OTE_OK) return result;
    ote_mutex_lock(&bm->mu);
    DL_DELETE(bm->retiring, buf);
    ote_mutex_unlock(&bm->mu);
    buffer_free(buf);
    return OTE_OK;
}

ote_status_t ote_buffer_manager_reclaim(ote_buffer_manager_t *bm, size_t *remaining_out) {
    ote_mutex_lock(&bm->mu);
    orphan_t *list = bm->orphans;
    bm->orphans = NULL;
    ote_mutex_unlock(&bm->mu);
    ote_status_t result = OTE_OK;
    while (list != NULL) {
        orphan_t *o = list;
        list = o->next;
        buf_mr_t m = {.ctx = o->ctx, .mr = o->mr, .retained = 1};
        if (dereg_slot(bm, &m) == OTE_OK) {
            OTE_INFO("context", "device %s: a retained MR was deregistered on retry",
                     ote_context_name(o->ctx));
            if (o->released != NULL) o->released(o->owner, o->item);
            ote_free(o);
            continue;
        }
        result = OTE_ERR_RETAINED;
        ote_mutex_lock(&bm->mu);
        o->next = bm->orphans;
        bm->orphans = o;
        ote_mutex_unlock(&bm->mu);
    }
    if (remaining_out != NULL) *remaining_out = ote_buffer_manager_retained(bm);
    return result;
}

ote_status_t ote_buffer_mr_reg(ote_buffer_manager_t *bm, ote_context_t *ctx, void *addr, size_t len,
                               int access, const ote_buffer_mr_where_t *where,
                               struct ibv_mr **mr_out) {
    if (bm == NULL || ctx == NULL || addr == NULL || len == 0 || mr_out == NULL)
        return OTE_ERR_INVALID;
    ote_verbs_t *v = ote_context_verbs(ctx);
    struct ibv_pd *pd = where != NULL && where->pd != NULL ? where->pd : ote_context_pd(ctx);
    struct ibv_mr *mr = NULL;
    int err = where == NULL || where->dmabuf_fd < 0
                  ? v->ops->reg_mr(v, pd, addr, len, access, &mr)
                  : v->ops->reg_dmabuf_mr(v, pd, where->dmabuf_off, len, (uint64_t)(uintptr_t)addr,
                                          where->dmabuf_fd, access, &mr);
    if (err != 0) return ote_status_make(OTE_ERR_NATIVE, err);
    atomic_fetch_add(&bm->single, 1);
    *mr_out = mr;
    return OTE_OK;
}

ote_status_t ote_buffer_mr_drop(ote_buffer_manager_t *bm, ote_context_t *ctx, struct ibv_mr *mr,
                                ote_buffer_mr_released_fn released, void *owner, void *item) {
    if (bm == NULL || ctx == NULL || mr == NULL) return OTE_ERR_INVALID;
    buf_mr_t m = {.ctx = ctx, .mr = mr, .retained = 0};
    ote_status_t st = dereg_slot(bm, &m);
    if (st == OTE_OK && released != NULL) released(owner, item);
    if (st != OTE_OK)
        st = adopt_orphan(bm, &m, released, owner, item) == OTE_OK ? OTE_ERR_RETAINED
                                                                   : OTE_ERR_NOMEM;
    /* Counted down last: the manager's destroy is BUSY until the MR is gone (its owner
     * told) or is an orphan, so it never frees the manager under a drop. */
    atomic_fetch_sub(&bm->single, 1);
    return st;
}

size_t ote_buffer_manager_single(ote_buffer_manager_t *bm) { return atomic_load(&bm->single); }

size_t ote_buffer_manager_retained(ote_buffer_manager_t *bm) {
    ote_mutex_lock(&bm->mu);
    size_t n = bm->retained;
    ote_mutex_unlock(&bm->mu);
    return n;
}

size_t ote_buffer_manager_count(ote_buffer_manager_t *bm) {
    ote_mutex_lock(&bm->mu);
    size_t n = bm->live_count;
    ote_mutex_unlock(&bm->mu);
    return n;
}

static ote_status_t mr_of(const ote_buffer_t *buf, const ote_context_t *ctx,
                          struct ibv_mr **mr_out) {
    for (size_t i = 0; i < buf->nmr; i++) {
        if (buf->mrs[i].ctx == ctx && buf->mrs[i].mr != NULL) {
            *mr_out = buf->mrs[i].mr;
            return OTE_OK;
        }
    }
    return OTE_ERR_NOT_FOUND;
}

ote_status_t ote_buffer_mr(const ote_buffer_t *buf, const ote_context_t *ctx,
                           struct ibv_mr **mr_out) {
    if (buf == NULL || ctx == NULL || mr_out == NULL || buf->retiring) return OTE_ERR_NOT_FOUND;
    return mr_of(buf, ctx, mr_out);
}

ote_status_t ote_buffer_manager_find(ote_buffer_manager_t *bm, const void *addr, size_t len,
                                     const ote_context_t *ctx, struct ibv_mr **mr_out) {
    uintptr_t a = (uintptr_t)addr;
    if (len == 0 || a + len < a) return OTE_ERR_INVALID;
    ote_status_t st = OTE_ERR_ACCESS;
    ote_mutex_lock(&bm->mu);
    for (ote_buffer_t *b = bm->live; b != NULL; b = b->next) {
        uintptr_t s = (uintptr_t)b->addr;
        if (a >= s && a + len <= s + b->len) {
            st = mr_of(b, ctx, mr_out);
            break;
        }
    }
    ote_mutex_unlock(&bm->mu);
    return st;
}

/* The live registrations' MRs in ctx, moved out of their slots (under bm->mu) into a
 * list: a registration's MR of ctx for the reopen of ctx (drop_context). */
typedef struct moved_mr {
    struct ibv_mr *mr;
    struct moved_mr *next;
} moved_mr_t;

size_t ote_buffer_manager_drop_context(ote_buffer_manager_t *bm, ote_context_t *ctx) {
    moved_mr_t *list = NULL;
    size_t n = 0;
    ote_mutex_lock(&bm->mu);
    for (ote_buffer_t *b = bm->live; b != NULL; b = b->next) {
        for (size_t i = 0; i < b->nmr; i++) {
            buf_mr_t *m = &b->mrs[i];
            if (m->ctx != ctx || m->mr == NULL) continue;
            moved_mr_t *e = ote_calloc(1, sizeof(*e));
            if (e == NULL) continue; /* kept in its slot: the old PD is then retained */
            e->mr = m->mr;
            e->next = list;
            list = e;
            m->mr = NULL;
        }
    }
    ote_mutex_unlock(&bm->mu);
    while (list != NULL) {
        moved_mr_t *e = list;
        list = e->next;
        buf_mr_t m = {.ctx = ctx, .mr = e->mr, .retained = 0};
        if (dereg_slot(bm, &m) != OTE_OK) (void)adopt_orphan(bm, &m, NULL, NULL, NULL);
        ote_free(e);
        n++;
    }
    return n;
}

/* Registers b's range in ctx into its slot of ctx (made when missing). Under bm->mu. */
static ote_status_t republish_one(ote_buffer_t *b, ote_context_t *ctx) {
    buf_mr_t *slot = NULL;
    for (size_t i = 0; i < b->nmr && slot == NULL; i++)
        if (b->mrs[i].ctx == ctx) slot = &b->mrs[i];
    if (slot != NULL && slot->mr != NULL) return OTE_OK;
    ote_verbs_t *v = ote_context_verbs(ctx);
    struct ibv_mr *mr = NULL;
    int err =
        b->dmabuf_fd < 0
            ? v->ops->reg_mr(v, ote_context_pd(ctx), b->addr, b->len, b->access, &mr)
            : v->ops->reg_dmabuf_mr(v, ote_context_pd(ctx), b->dmabuf_off, b->len,
                                    (uint64_t)(uintptr_t)b->addr, b->dmabuf_fd, b->access, &mr);
    if (err != 0) return ote_status_make(OTE_ERR_NATIVE, err);
    if (slot == NULL) slot = &b->mrs[b->nmr++]; /* allocated for every context at register */
    slot->ctx = ctx;
    slot->retained = 0;
    slot->mr = mr;
    return OTE_OK;
}

ote_status_t ote_buffer_manager_republish(ote_buffer_manager_t *bm, ote_context_t *ctx,
                                          size_t *count_out) {
    ote_status_t result = OTE_OK;
    size_t made = 0, refused = 0;
    ote_mutex_lock(&bm->mu);
    for (ote_buffer_t *b = bm->live; b != NULL; b = b->next) {
        ote_status_t st = republish_one(b, ctx);
        if (st == OTE_OK) {
            made++;
            continue;
        }
        refused++;
        if (result == OTE_OK) result = st;
        OTE_WARN("context",
                 "device %s: registration %p (%zu bytes%s) has no MR here after the reopen: %s",
                 ote_context_name(ctx), b->addr, b->len, b->dmabuf_fd >= 0 ? ", a dma-buf" : "",
                 ote_status_str(st));
    }
    ote_mutex_unlock(&bm->mu);
    if (refused == 0 && made > 0)
        OTE_INFO("context", "device %s: %zu registration(s) published on the new PD",
                 ote_context_name(ctx), made);
    if (count_out != NULL) *count_out = made;
    return result;
}

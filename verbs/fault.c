/*
 * verbs/fault.c - the fault-injection decorator (see fault.h for the rules): op names,
 * the entry check every decorated op makes (fail and busy rules, counters), wrapping and
 * closing, and the API that arms rules and reads counters. The decorated ops are in
 * fault_ops.c, the per-context injected async events in fault_async.c.
 *
 * A decorator owns: its name, its rules, its counters, and per context (created lazily
 * by inject/async_fd) an eventfd, an epoll set and a queue of injected events. It holds
 * no verbs object of its own; every object it hands out is the inner provider's.
 * One mutex guards everything above; it is never held across a call into the inner
 * provider, so a blocking inner call (get_async_event, get_cq_event) does not stall
 * other threads arming rules or reading counters.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "verbs/fault_internal.h"

static const char *const g_op_names[OTE_VERBS_FAULT_OP_COUNT] = {
    "get_device_list",
    "free_device_list",
    "get_device_name",
    "open_device",
    "close_device",
    "query_device",
    "query_port",
    "query_gid",
    "query_gid_ex",
    "device_numa_node",
    "get_async_event",
    "ack_async_event",
    "alloc_pd",
    "dealloc_pd",
    "reg_mr",
    "reg_dmabuf_mr",
    "dereg_mr",
    "alloc_mw",
    "dealloc_mw",
    "create_comp_channel",
    "destroy_comp_channel",
    "create_cq",
    "destroy_cq",
    "req_notify_cq",
    "get_cq_event",
    "ack_cq_events",
    "poll_cq",
    "create_qp",
    "modify_qp",
    "query_qp",
    "destroy_qp",
    "post_send",
    "post_recv",
    "query_device_ex",
    "create_srq",
    "modify_srq",
    "query_srq",
    "destroy_srq",
    "post_srq_recv",
    "create_qp_flags",
    "qp_flags",
    "device_flags",
};

const char *ote_verbs_fault_op_name(ote_verbs_fault_op_t op) {
    if ((int)op < 0 || op >= OTE_VERBS_FAULT_OP_COUNT) return "unknown";
    return g_op_names[op];
}

ote_status_t ote_verbs_fault_op_from_name(const char *name, ote_verbs_fault_op_t *op_out) {
    if (name == NULL || op_out == NULL) return OTE_ERR_INVALID;
    for (int i = 0; i < OTE_VERBS_FAULT_OP_COUNT; i++) {
        if (strcmp(g_op_names[i], name) == 0) {
            *op_out = (ote_verbs_fault_op_t)i;
            return OTE_OK;
        }
    }
    return OTE_ERR_NOT_FOUND;
}

bool ote_verbs_fault_op_is_destroy(ote_verbs_fault_op_t op) {
    switch (op) {
        case OP(CLOSE_DEVICE):
        case OP(DEALLOC_PD):
        case OP(DEREG_MR):
        case OP(DEALLOC_MW):
        case OP(DESTROY_COMP_CHANNEL):
        case OP(DESTROY_CQ):
        case OP(DESTROY_QP):
        case OP(DESTROY_SRQ): return true;
        default: return false;
    }
}

/* Ops whose signature cannot carry a failure. */
static bool op_can_fail(ote_verbs_fault_op_t op) {
    return op != OP(FREE_DEVICE_LIST) && op != OP(GET_DEVICE_NAME) && op != OP(ACK_ASYNC_EVENT) &&
           op != OP(ACK_CQ_EVENTS);
}

bool ote_verbs_fault_is(const ote_verbs_t *v) {
    return v != NULL && v->ops == &ote__verbs_fault_ops;
}

ote_verbs_t *ote_verbs_fault_inner(ote_verbs_t *v) {
    return ote_verbs_fault_is(v) ? to_fault(v)->inner : NULL;
}

/*
 * Entry of every op: count the call, then apply the op's fail rule and (for destroys)
 * its busy rule. Returns 0 to go on to the inner provider, else the errno to return.
 */
int ote__verbs_fault_enter(fault_t *f, ote_verbs_fault_op_t op, const void *obj) {
    int err = 0;
    uint64_t call;
    ote_mutex_lock(&f->mu);
    call = ++f->calls[op];
    if (f->delay[op].armed) {
        /* Wait out the delay, or until the rule is replaced or cleared (gen changes). */
        uint64_t gen = f->delay_gen;
        ote_deadline_t until = ote_deadline_after(f->delay[op].ns);
        f->injected[op]++;
        OTE_DEBUG(LOGC, "%s: %s call %llu delayed by %llu ms", f->name, g_op_names[op],
                  (unsigned long long)call, (unsigned long long)(f->delay[op].ns / 1000000u));
        while (f->delay_gen == gen && !ote_deadline_expired(until))
            (void)ote_cond_wait(&f->delay_cv, &f->mu, until);
    }
    fail_rule_t *r = &f->fail[op];
    if (r->armed) {
        r->hits++;
        bool fire = false;
        switch (r->mode) {
            case OTE_FAULT_NTH:
                fire = r->hits == r->n;
                if (fire) r->armed = false; /* one-shot */
                break;
            case OTE_FAULT_EVERY: fire = true; break;
            case OTE_FAULT_FROM: fire = r->hits >= r->n; break;
        }
        if (fire) err = r->err;
    }
    bool busy = false;
    if (err == 0 && f->busy[op].armed && (f->busy[op].obj == NULL || f->busy[op].obj == obj)) {
        err = EBUSY;
        busy = true;
        if (--f->busy[op].left == 0) f->busy[op].armed = false;
    }
    if (err != 0) f->injected[op]++;
    ote_mutex_unlock(&f->mu);
    if (err != 0) {
        OTE_DEBUG(LOGC, "%s: %s call %llu fails with errno %d (%s)%s", f->name, g_op_names[op],
                  (unsigned long long)call, err, strerror(err), busy ? " [busy destroy]" : "");
    }
    return err;
}

void ote__verbs_fault_count_only(fault_t *f, ote_verbs_fault_op_t op) {
    ote_mutex_lock(&f->mu);
    f->calls[op]++;
    ote_mutex_unlock(&f->mu);
}

/* ---- lifetime ---- */

static void clear_locked(fault_t *f) {
    memset(f->fail, 0, sizeof(f->fail));
    memset(f->busy, 0, sizeof(f->busy));
    memset(&f->partial_send, 0, sizeof(f->partial_send));
    memset(&f->partial_recv, 0, sizeof(f->partial_recv));
    memset(f->delay, 0, sizeof(f->delay));
    f->delay_gen++;
    ote_cond_broadcast(&f->delay_cv);
    cqe_rule_t *r, *rtmp;
    DL_FOREACH_SAFE(f->cqe_rules, r, rtmp) {
        DL_DELETE(f->cqe_rules, r);
        ote_free(r);
    }
    ctx_state_t *cs, *cstmp;
    HASH_ITER(hh, f->ctxs, cs, cstmp) {
        ev_node_t *e, *etmp;
        DL_FOREACH_SAFE(cs->queue, e, etmp) {
            DL_DELETE(cs->queue, e);
            ote_free(e);
        }
        ote__verbs_fault_efd_drain(cs);
    }
}

static void fault_close(ote_verbs_t *v) {
    fault_t *f = to_fault(v);
    clear_locked(f); /* closing: no other thread may use v any more */
    ctx_state_t *cs, *cstmp;
    HASH_ITER(hh, f->ctxs, cs, cstmp) {
        HASH_DEL(f->ctxs, cs);
        ote__verbs_fault_ctx_free(cs);
    }
    ev_node_t *e, *etmp;
    DL_FOREACH_SAFE(f->outstanding, e, etmp) {
        DL_DELETE(f->outstanding, e);
        ote_free(e);
    }
    ote_verbs_t *inner = f->inner;
    bool own = (f->flags & OTE_VERBS_FAULT_OWN_INNER) != 0;
    ote_cond_destroy(&f->delay_cv);
    ote_mutex_destroy(&f->mu);
    ote_free(f->name);
    ote_free(f);
    if (own) ote_verbs_close(inner); /* ownership was passed to us at wrap */
}

static bool table_complete(const ote_verbs_ops_t *ops) {
    ote_verbs_ops_t filled = *ops;
    ote_verbs_ops_fill_stubs(&filled);
    return memcmp(&filled, ops, sizeof(filled)) == 0;
}

ote_status_t ote_verbs_fault_wrap(ote_verbs_t *inner, unsigned flags, ote_verbs_t **v_out) {
    if (inner == NULL || inner->ops == NULL || v_out == NULL ||
        (flags & ~OTE_VERBS_FAULT_OWN_INNER) != 0)
        return OTE_ERR_INVALID;
    if (!table_complete(inner->ops)) return OTE_ERR_INVALID;
    ote_status_t st;
    fault_t *f = ote_calloc(1, sizeof(*f));
    if (f == NULL) return OTE_ERR_NOMEM;
    const char *iname = inner->provider != NULL ? inner->provider : "?";
    size_t len = strlen(iname) + sizeof("fault()");
    f->name = ote_malloc(len);
    if (f->name == NULL) {
        st = OTE_ERR_NOMEM;
        goto err_free_f;
    }
    snprintf(f->name, len, "fault(%s)", iname);
    st = ote_mutex_init(&f->mu);
    if (st != OTE_OK) goto err_free_name;
    st = ote_cond_init(&f->delay_cv);
    if (st != OTE_OK) {
        ote_mutex_destroy(&f->mu);
        goto err_free_name;
    }
    f->inner = inner;
    f->flags = flags;
    f->v.ops = &ote__verbs_fault_ops;
    f->v.provider = f->name;
    f->v.priv = f;
    f->v.close = fault_close;
    *v_out = &f->v;
    return OTE_OK;

err_free_name:
    ote_free(f->name);
err_free_f:
    ote_free(f);
    return st;
}

/* ---- rules ---- */

static bool op_valid(ote_verbs_fault_op_t op) {
    return (int)op >= 0 && op < OTE_VERBS_FAULT_OP_COUNT;
}

ote_status_t ote_verbs_fault_fail(ote_verbs_t *v, ote_verbs_fault_op_t op, ote_fault_mode_t mode,
                                  uint64_t n, int err) {
    GET_FAULT_OR(v, OTE_ERR_INVALID);
    if (!op_valid(op) || !op_can_fail(op) || err <= 0) return OTE_ERR_INVALID;
    if (mode != OTE_FAULT_NTH && mode != OTE_FAULT_EVERY && mode != OTE_FAULT_FROM)
        return OTE_ERR_INVALID;
    if (mode != OTE_FAULT_EVERY && n == 0) return OTE_ERR_INVALID;
    fault_t *f = to_fault(v);
    ote_mutex_lock(&f->mu);
    f->fail[op] = (fail_rule_t){.armed = true, .mode = mode, .n = n, .hits = 0, .err = err};
    ote_mutex_unlock(&f->mu);
    return OTE_OK;
}

ote_status_t ote_verbs_fault_partial_post(ote_verbs_t *v, ote_verbs_fault_op_t op, unsigned k,
                                          int err) {
    GET_FAULT_OR(v, OTE_ERR_INVALID);
    if ((op != OP(POST_SEND) && op != OP(POST_RECV)) || err <= 0) return OTE_ERR_INVALID;
    fault_t *f = to_fault(v);
    ote_mutex_lock(&f->mu);
    partial_rule_t *p = op == OP(POST_SEND) ? &f->partial_send : &f->partial_recv;
    *p = (partial_rule_t){.armed = true, .k = k, .err = err};
    ote_mutex_unlock(&f->mu);
    return OTE_OK;
}

ote_status_t ote_verbs_fault_delay(ote_verbs_t *v, ote_verbs_fault_op_t op, uint64_t ms) {
    GET_FAULT_OR(v, OTE_ERR_INVALID);
    if (!op_valid(op) || !op_can_fail(op) || ms > OTE_VERBS_FAULT_DELAY_MAX_MS)
        return OTE_ERR_INVALID;
    fault_t *f = to_fault(v);
    ote_mutex_lock(&f->mu);
    f->delay[op] = (delay_rule_t){.armed = ms > 0, .ns = ms * 1000000u};
    f->delay_gen++;
    ote_cond_broadcast(&f->delay_cv); /* calls waiting under the old rule go on */
    ote_mutex_unlock(&f->mu);
    return OTE_OK;
}

static ote_status_t add_cqe_rule(ote_verbs_t *v, const cqe_rule_t *tmpl) {
    GET_FAULT_OR(v, OTE_ERR_INVALID);
    fault_t *f = to_fault(v);
    cqe_rule_t *r = ote_malloc(sizeof(*r));
    if (r == NULL) return OTE_ERR_NOMEM;
    *r = *tmpl;
    r->seen = 0;
    r->prev = r->next = NULL;
    ote_mutex_lock(&f->mu);
    DL_APPEND(f->cqe_rules, r);
    ote_mutex_unlock(&f->mu);
    return OTE_OK;
}

ote_status_t ote_verbs_fault_lose_cqe_wr_id(ote_verbs_t *v, struct ibv_cq *cq, uint64_t wr_id) {
    cqe_rule_t t = {.cq = cq, .by_wr_id = true, .wr_id = wr_id, .lose = true};
    return add_cqe_rule(v, &t);
}

ote_status_t ote_verbs_fault_lose_cqe_nth(ote_verbs_t *v, struct ibv_cq *cq, uint64_t n) {
    if (n == 0) return OTE_ERR_INVALID;
    cqe_rule_t t = {.cq = cq, .by_wr_id = false, .nth = n, .lose = true};
    return add_cqe_rule(v, &t);
}

ote_status_t ote_verbs_fault_error_cqe_wr_id(ote_verbs_t *v, struct ibv_cq *cq, uint64_t wr_id,
                                             enum ibv_wc_status status, uint32_t vendor_err) {
    cqe_rule_t t = {.cq = cq,
                    .by_wr_id = true,
                    .wr_id = wr_id,
                    .lose = false,
                    .status = status,
                    .vendor_err = vendor_err};
    return add_cqe_rule(v, &t);
}

ote_status_t ote_verbs_fault_error_cqe_nth(ote_verbs_t *v, struct ibv_cq *cq, uint64_t n,
                                           enum ibv_wc_status status, uint32_t vendor_err) {
    if (n == 0) return OTE_ERR_INVALID;
    cqe_rule_t t = {.cq = cq,
                    .by_wr_id = false,
                    .nth = n,
                    .lose = false,
                    .status = status,
                    .vendor_err = vendor_err};
    return add_cqe_rule(v, &t);
}

ote_status_t ote_verbs_fault_destroy_busy(ote_verbs_t *v, ote_verbs_fault_op_t op, const void *obj,
                                          uint64_t times) {
    GET_FAULT_OR(v, OTE_ERR_INVALID);
    if (!ote_verbs_fault_op_is_destroy(op)) return OTE_ERR_INVALID;
    fault_t *f = to_fault(v);
    ote_mutex_lock(&f->mu);
    f->busy[op] = (busy_rule_t){.armed = times > 0, .obj = obj, .left = times};
    ote_mutex_unlock(&f->mu);
    return OTE_OK;
}

static uint64_t read_counter(ote_verbs_t *v, ote_verbs_fault_op_t op, bool injected) {
    GET_FAULT_OR(v, 0);
    if (!op_valid(op)) return 0;
    fault_t *f = to_fault(v);
    ote_mutex_lock(&f->mu);
    uint64_t n = injected ? f->injected[op] : f->calls[op];
    ote_mutex_unlock(&f->mu);
    return n;
}

uint64_t ote_verbs_fault_calls(ote_verbs_t *v, ote_verbs_fault_op_t op) {
    return read_counter(v, op, false);
}

uint64_t ote_verbs_fault_injected(ote_verbs_t *v, ote_verbs_fault_op_t op) {
    return read_counter(v, op, true);
}

void ote_verbs_fault_clear(ote_verbs_t *v) {
    if (!ote_verbs_fault_is(v)) return;
    fault_t *f = to_fault(v);
    ote_mutex_lock(&f->mu);
    clear_locked(f);
    ote_mutex_unlock(&f->mu);
}

void ote_verbs_fault_reset_counters(ote_verbs_t *v) {
    if (!ote_verbs_fault_is(v)) return;
    fault_t *f = to_fault(v);
    ote_mutex_lock(&f->mu);
    memset(f->calls, 0, sizeof(f->calls));
    memset(f->injected, 0, sizeof(f->injected));
    ote_mutex_unlock(&f->mu);
}

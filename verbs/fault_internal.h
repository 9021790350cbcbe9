/*
 * verbs/fault_internal.h - what the files of the fault decorator share (private to verbs/).
 *
 * fault.c      op names, the entry check of every op, wrap/close, the rule API
 * fault_ops.c  the decorated ops table (forwarding, partial posts, CQE rules)
 * fault_async.c per-context queues of injected async events and their fds
 *
 * Locking: one mutex (fault_t.mu) guards rules, counters, per-context state and the
 * outstanding injected events; it is never held across a call into the inner provider.
 */
#ifndef OTE_VERBS_FAULT_INTERNAL_H
#define OTE_VERBS_FAULT_INTERNAL_H

/* Compiled only inside the verbs library (Bazel local_defines, never passed on to
 * dependents): an outside file that includes this header fails here. */
#ifndef OTE__INSIDE_VERBS
#error "verbs/fault_internal.h is internal to OrbitTE's verbs layer; include verbs/fault.h instead"
#endif

#include <stdbool.h>
#include <stdint.h>

#include "base/hash.h"
#include "base/lock.h"
#include "verbs/fault.h"
#include "verbs/verbs.h"

#define OP(name) OTE_VERBS_FAULT_OP_##name
#define LOGC "verbs.fault"

typedef struct {
    bool armed;
    ote_fault_mode_t mode;
    uint64_t n;
    uint64_t hits;
    int err;
} fail_rule_t;

typedef struct {
    bool armed;
    const void *obj;
    uint64_t left;
} busy_rule_t;

typedef struct {
    bool armed;
    unsigned k;
    int err;
} partial_rule_t;

/* A delay: each call of the op waits ns before going on; fault_t.delay_gen changes when
 * a delay rule is replaced or cleared, which ends the waits of calls already waiting. */
typedef struct {
    bool armed;
    uint64_t ns;
} delay_rule_t;

typedef struct cqe_rule {
    struct ibv_cq *cq; /* NULL: any */
    bool by_wr_id;
    uint64_t wr_id;
    uint64_t nth;
    uint64_t seen;
    bool lose; /* else rewrite the status */
    enum ibv_wc_status status;
    uint32_t vendor_err;
    struct cqe_rule *prev, *next;
} cqe_rule_t;

/* An injected async event: queued on its context, then outstanding until acked. */
typedef struct ev_node {
    struct ibv_async_event ev;
    struct ev_node *prev, *next;
} ev_node_t;

typedef struct ctx_state {
    struct ibv_context *ctx; /* key */
    int efd;                 /* eventfd: readable while `queue` is not empty */
    int epfd;                /* epoll over efd and ctx->async_fd */
    ev_node_t *queue;
    UT_hash_handle hh;
} ctx_state_t;

typedef struct {
    ote_verbs_t v; /* first: the decorated instance handed out */
    ote_verbs_t *inner;
    unsigned flags;
    char *name;
    ote_mutex_t mu;
    fail_rule_t fail[OTE_VERBS_FAULT_OP_COUNT];
    busy_rule_t busy[OTE_VERBS_FAULT_OP_COUNT];
    partial_rule_t partial_send, partial_recv;
    delay_rule_t delay[OTE_VERBS_FAULT_OP_COUNT];
    uint64_t delay_gen; /* bumped (and delay_cv broadcast) when a delay rule changes */
    ote_cond_t delay_cv;
    cqe_rule_t *cqe_rules;
    ctx_state_t *ctxs;
    ev_node_t *outstanding; /* injected events delivered and not yet acked */
    uint64_t calls[OTE_VERBS_FAULT_OP_COUNT];
    uint64_t injected[OTE_VERBS_FAULT_OP_COUNT];
} fault_t;

extern const ote_verbs_ops_t ote__verbs_fault_ops;

static inline fault_t *to_fault(ote_verbs_t *v) { return (fault_t *)(void *)v; }
static inline const ote_verbs_ops_t *in_ops(fault_t *f) { return f->inner->ops; }

#define GET_FAULT_OR(v, ret) \
    do { \
        if (!ote_verbs_fault_is(v)) return (ret); \
    } while (0)

/* fault.c: entry of every op that can fail: count the call, wait out the op's delay
 * rule, then apply the op's fail rule and (for destroys) its busy rule. Returns 0 to go on to the inner provider, else
 * the errno to return. count_only counts an op that cannot fail. */
int ote__verbs_fault_enter(fault_t *f, ote_verbs_fault_op_t op, const void *obj);
void ote__verbs_fault_count_only(fault_t *f, ote_verbs_fault_op_t op);

/* fault_async.c */
void ote__verbs_fault_ctx_free(ctx_state_t *cs);
/* Drop the state of a context that was closed through the decorator. */
void ote__verbs_fault_ctx_drop(fault_t *f, struct ibv_context *ctx);
/* Make the context's eventfd unreadable (its queue went empty); under f->mu. */
void ote__verbs_fault_efd_drain(ctx_state_t *cs);
/* Two events are "the same" for ack matching when type and element agree. */
bool ote__verbs_fault_event_matches(const struct ibv_async_event *a,
                                    const struct ibv_async_event *b);

#endif

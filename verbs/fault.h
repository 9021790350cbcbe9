/*
 * verbs/fault.h - the fault-injection decorator over any verbs provider.
 *
 * ote_verbs_fault_wrap() builds a new ote_verbs_t, named "fault(<inner>)", whose every op
 * forwards to an inner provider unless a rule says otherwise. Upper layers use it exactly
 * as any provider (through ->ops); tests arm rules on it and read its per-op counters:
 *
 *     ote_verbs_t *sim, *v;
 *     ote_verbs_open("sim", NULL, &sim);
 *     ote_verbs_fault_wrap(sim, OTE_VERBS_FAULT_OWN_INNER, &v);
 *     ote_verbs_fault_fail(v, OTE_VERBS_FAULT_OP_REG_MR, OTE_FAULT_NTH, 2, ENOMEM);
 *     ote_verbs_fault_destroy_busy(v, OTE_VERBS_FAULT_OP_DESTROY_QP, NULL, 3);
 *     ... drive the layer under test ...
 *     EXPECT_EQ(ote_verbs_fault_calls(v, OTE_VERBS_FAULT_OP_DESTROY_QP), 4u);
 *     ote_verbs_close(v);                     // closes sim too (OWN_INNER)
 *
 * Rules (all deterministic; a mutex makes them and the counters thread-safe; no lock is
 * held while the inner provider runs):
 *
 * - Fail (ote_verbs_fault_fail): the Nth call / every call / every call from the Nth on
 *   (calls counted from arming) returns the chosen errno without calling the inner
 *   provider, so nothing is created, destroyed or posted. A failed post sets *bad_wr to
 *   the first WR; a failed poll_cq returns -errno. One fail rule per op; arming again
 *   replaces it. The four ops that cannot fail (free_device_list, get_device_name,
 *   ack_async_event, ack_cq_events) refuse fail rules.
 * - Partial post (ote_verbs_fault_partial_post): the next post_send (or post_recv) posts
 *   only its first k WRs to the inner provider and then returns the chosen errno
 *   (ENOMEM: "queue full") with *bad_wr at WR k. The rule is consumed by that next post;
 *   a post of k WRs or fewer goes through whole. If the inner provider fails within the
 *   first k, its own result is returned.
 * - CQE rules (ote_verbs_fault_lose_cqe_*, ote_verbs_fault_error_cqe_*): act on a CQE
 *   that poll_cq takes from the inner provider, chosen by wr_id (the first CQE with that
 *   wr_id) or by position (the Nth CQE seen after the rule was added), on one CQ or on
 *   any (cq NULL). A lost CQE is swallowed: it never reaches the caller. An error CQE
 *   keeps wr_id and qp_num, gets the chosen status and vendor_err, and, because on an
 *   error CQE only wr_id, status, qp_num and vendor_err are defined, its opcode,
 *   byte_len, wc_flags and imm_data are poisoned (OTE_VERBS_FAULT_POISON_*) so that a
 *   caller that reads them is caught. Each rule fires once. Every position rule counts
 *   every CQE of its CQ, including ones another rule acted on; when several rules match
 *   one CQE, the oldest acts. poll_cq refills the caller's array after swallowing, so a
 *   short count still means the inner CQ had nothing more.
 * - Busy destroy (ote_verbs_fault_destroy_busy): the next `times` calls of a destroy op
 *   (destroy_qp, destroy_cq, dereg_mr, dealloc_mw, dealloc_pd, destroy_comp_channel,
 *   close_device), optionally only for one object, return EBUSY without calling the
 *   inner provider (the object stays alive); the call after that reaches the inner
 *   provider. Fail rules are checked before busy rules.
 * - Delay (ote_verbs_fault_delay): every call of the op waits the given time before its
 *   other rules apply and it reaches the inner provider (a slow or stalled verb: a QP
 *   that takes seconds to create, a slow modify_qp). Re-arming the op's delay (0 removes
 *   it) or ote_verbs_fault_clear() ends the waits of calls already delayed at once, so a
 *   test can lift a stall. Counted as injected. Only for ops that can fail.
 * - Async events (ote_verbs_fault_inject_async_event): the event is queued on the
 *   context and get_async_event returns queued events, oldest first, before asking the
 *   inner provider. Acking an injected event does not reach the inner provider (the
 *   decorator matches acks by event type and element).
 *   Polling: ctx->async_fd belongs to the inner provider (it reads that fd itself), so
 *   the decorator cannot make it readable. Instead ote_verbs_fault_async_fd() gives an
 *   fd owned by the decorator (an epoll set over an eventfd and ctx->async_fd) that is
 *   readable while an injected event is queued OR the inner fd is readable. A caller
 *   that waits for async events under the decorator polls that fd; a caller that polls
 *   ctx->async_fd sees injected events only on its next get_async_event call.
 *
 * Counters: ote_verbs_fault_calls() counts every call of an op (injected or not);
 * ote_verbs_fault_injected() counts the faults the op produced (failed calls, EBUSY
 * returns, partial posts, lost and rewritten CQEs under POLL_CQ, injected events
 * delivered under GET_ASYNC_EVENT). Each injected fault is logged at DEBUG under
 * "verbs.fault".
 *
 * Ownership: the decorator borrows the inner provider unless OTE_VERBS_FAULT_OWN_INNER
 * is given, in which case ote_verbs_close() of the decorator also closes the inner one.
 * A borrowed inner provider must outlive the decorator. Objects created through the
 * decorator are the inner provider's objects and may be destroyed through either; only
 * a context closed through the decorator releases the decorator's per-context fds at
 * once (otherwise they live until the decorator is closed).
 * Thread-safe: rules may be armed while other threads call ops.
 */
#ifndef OTE_VERBS_FAULT_H
#define OTE_VERBS_FAULT_H

#include <stdbool.h>
#include <stdint.h>

#include "base/fault.h"
#include "base/status.h"
#include "verbs/verbs.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One value per entry of ote_verbs_ops_t, in table order. */
typedef enum {
    OTE_VERBS_FAULT_OP_GET_DEVICE_LIST = 0,
    OTE_VERBS_FAULT_OP_FREE_DEVICE_LIST,
    OTE_VERBS_FAULT_OP_GET_DEVICE_NAME,
    OTE_VERBS_FAULT_OP_OPEN_DEVICE,
    OTE_VERBS_FAULT_OP_CLOSE_DEVICE,
    OTE_VERBS_FAULT_OP_QUERY_DEVICE,
    OTE_VERBS_FAULT_OP_QUERY_PORT,
    OTE_VERBS_FAULT_OP_QUERY_GID,
    OTE_VERBS_FAULT_OP_QUERY_GID_EX,
    OTE_VERBS_FAULT_OP_DEVICE_NUMA_NODE,
    OTE_VERBS_FAULT_OP_GET_ASYNC_EVENT,
    OTE_VERBS_FAULT_OP_ACK_ASYNC_EVENT,
    OTE_VERBS_FAULT_OP_ALLOC_PD,
    OTE_VERBS_FAULT_OP_DEALLOC_PD,
    OTE_VERBS_FAULT_OP_REG_MR,
    OTE_VERBS_FAULT_OP_REG_DMABUF_MR,
    OTE_VERBS_FAULT_OP_DEREG_MR,
    OTE_VERBS_FAULT_OP_ALLOC_MW,
    OTE_VERBS_FAULT_OP_DEALLOC_MW,
    OTE_VERBS_FAULT_OP_CREATE_COMP_CHANNEL,
    OTE_VERBS_FAULT_OP_DESTROY_COMP_CHANNEL,
    OTE_VERBS_FAULT_OP_CREATE_CQ,
    OTE_VERBS_FAULT_OP_DESTROY_CQ,
    OTE_VERBS_FAULT_OP_REQ_NOTIFY_CQ,
    OTE_VERBS_FAULT_OP_GET_CQ_EVENT,
    OTE_VERBS_FAULT_OP_ACK_CQ_EVENTS,
    OTE_VERBS_FAULT_OP_POLL_CQ,
    OTE_VERBS_FAULT_OP_CREATE_QP,
    OTE_VERBS_FAULT_OP_MODIFY_QP,
    OTE_VERBS_FAULT_OP_QUERY_QP,
    OTE_VERBS_FAULT_OP_DESTROY_QP,
    OTE_VERBS_FAULT_OP_POST_SEND,
    OTE_VERBS_FAULT_OP_POST_RECV,
    OTE_VERBS_FAULT_OP_QUERY_DEVICE_EX,
    OTE_VERBS_FAULT_OP_CREATE_SRQ,
    OTE_VERBS_FAULT_OP_MODIFY_SRQ,
    OTE_VERBS_FAULT_OP_QUERY_SRQ,
    OTE_VERBS_FAULT_OP_DESTROY_SRQ,
    OTE_VERBS_FAULT_OP_POST_SRQ_RECV,
    OTE_VERBS_FAULT_OP_CREATE_QP_FLAGS,
    OTE_VERBS_FAULT_OP_QP_FLAGS,
    OTE_VERBS_FAULT_OP_DEVICE_FLAGS,
    OTE_VERBS_FAULT_OP_COUNT
} ote_verbs_fault_op_t;

/* Poison written into the undefined fields of a CQE rewritten to an error status. */
#define OTE_VERBS_FAULT_POISON_OPCODE 0xff
#define OTE_VERBS_FAULT_POISON_BYTE_LEN 0xdeadbeefu
#define OTE_VERBS_FAULT_POISON_WC_FLAGS 0xffffffffu

/* Flags of ote_verbs_fault_wrap(). */
#define OTE_VERBS_FAULT_OWN_INNER 0x1u /* closing the decorator closes the inner provider */

/* The op's name as in ote_verbs_ops_t ("post_send"); "unknown" when out of range. */
const char *ote_verbs_fault_op_name(ote_verbs_fault_op_t op);
/* The op named `name`; OTE_ERR_NOT_FOUND when no op has that name. */
ote_status_t ote_verbs_fault_op_from_name(const char *name, ote_verbs_fault_op_t *op_out);
/* True for the seven destroy ops that ote_verbs_fault_destroy_busy() accepts. */
bool ote_verbs_fault_op_is_destroy(ote_verbs_fault_op_t op);

/*
 * ote_verbs_fault_wrap() - decorate `inner` (whose table must have no NULL entry).
 * On success *v_out is a provider named "fault(<inner->provider>)", closed with
 * ote_verbs_close(). flags: 0 or OTE_VERBS_FAULT_OWN_INNER (ownership of inner passes to
 * the decorator only on success).
 */
ote_status_t ote_verbs_fault_wrap(ote_verbs_t *inner, unsigned flags, ote_verbs_t **v_out);
/* True when v was made by ote_verbs_fault_wrap(). Every other ote_verbs_fault_* function
 * returns OTE_ERR_INVALID (or 0) for a v that is not. */
bool ote_verbs_fault_is(const ote_verbs_t *v);
/* The wrapped provider (NULL when v is not a decorator). */
ote_verbs_t *ote_verbs_fault_inner(ote_verbs_t *v);

/* Fail calls of op with err (> 0): mode OTE_FAULT_NTH fails call n (1-based, counted
 * from now) once; OTE_FAULT_EVERY fails every call; OTE_FAULT_FROM fails call n and all
 * later calls. Replaces any fail rule of op. */
ote_status_t ote_verbs_fault_fail(ote_verbs_t *v, ote_verbs_fault_op_t op, ote_fault_mode_t mode,
                                  uint64_t n, int err);
/* Every call of op (one that can fail) waits ms (at most OTE_VERBS_FAULT_DELAY_MAX_MS)
 * before going on; 0 removes the rule. Arming or removing it releases calls already
 * waiting under the previous rule. */
#define OTE_VERBS_FAULT_DELAY_MAX_MS 600000u
ote_status_t ote_verbs_fault_delay(ote_verbs_t *v, ote_verbs_fault_op_t op, uint64_t ms);
/* Next post (op POST_SEND or POST_RECV) posts only its first k WRs, then fails with err
 * (> 0, normally ENOMEM) and *bad_wr at WR k. Replaces any partial rule of that op. */
ote_status_t ote_verbs_fault_partial_post(ote_verbs_t *v, ote_verbs_fault_op_t op, unsigned k,
                                          int err);
/* Swallow the first CQE polled with wr_id / the nth CQE polled (n >= 1, counted from
 * now), on cq or on any CQ when cq is NULL. */
ote_status_t ote_verbs_fault_lose_cqe_wr_id(ote_verbs_t *v, struct ibv_cq *cq, uint64_t wr_id);
ote_status_t ote_verbs_fault_lose_cqe_nth(ote_verbs_t *v, struct ibv_cq *cq, uint64_t n);
/* Rewrite the first CQE polled with wr_id / the nth CQE polled to `status` with
 * vendor_err; undefined fields are poisoned when status is not IBV_WC_SUCCESS. */
ote_status_t ote_verbs_fault_error_cqe_wr_id(ote_verbs_t *v, struct ibv_cq *cq, uint64_t wr_id,
                                             enum ibv_wc_status status, uint32_t vendor_err);
ote_status_t ote_verbs_fault_error_cqe_nth(ote_verbs_t *v, struct ibv_cq *cq, uint64_t n,
                                           enum ibv_wc_status status, uint32_t vendor_err);
/* The next `times` calls of destroy op `op` (on object `obj` only, when not NULL: the
 * ibv_qp/ibv_cq/ibv_mr/ibv_mw/ibv_pd/ibv_comp_channel/ibv_context pointer) return EBUSY
 * without reaching the inner provider; later calls reach it. Replaces any busy rule of
 * op. times 0 removes the rule. */
ote_status_t ote_verbs_fault_destroy_busy(ote_verbs_t *v, ote_verbs_fault_op_t op, const void *obj,
                                          uint64_t times);
/* Queue *ev for get_async_event(ctx) and make ote_verbs_fault_async_fd(ctx) readable. */
ote_status_t ote_verbs_fault_inject_async_event(ote_verbs_t *v, struct ibv_context *ctx,
                                                const struct ibv_async_event *ev);
/* The fd to poll for async events of ctx under the decorator (see the header comment).
 * Owned by the decorator; valid until ctx is closed through it or the decorator closes. */
ote_status_t ote_verbs_fault_async_fd(ote_verbs_t *v, struct ibv_context *ctx, int *fd_out);

/* Calls of op since wrap (or the last reset_counters), and faults it produced. */
uint64_t ote_verbs_fault_calls(ote_verbs_t *v, ote_verbs_fault_op_t op);
uint64_t ote_verbs_fault_injected(ote_verbs_t *v, ote_verbs_fault_op_t op);
/* Remove every rule and every injected event not yet delivered. Counters are kept. */
void ote_verbs_fault_clear(ote_verbs_t *v);
/* Zero every counter. Rules are kept (and keep their own call counts). */
void ote_verbs_fault_reset_counters(ote_verbs_t *v);

#ifdef __cplusplus
}
#endif
#endif

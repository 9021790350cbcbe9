/*
 * cq/workers.h - worker threads that poll CQ lanes.
 *
 * A pool has N threads; worker i polls every lane whose index is i modulo N, across
 * all contexts ("worker i polls lane i across contexts"). A worker polls its lanes until
 * they are empty, then arms their completion channels, polls once more (to close the
 * race with a CQE that arrived meanwhile) and sleeps in poll(2) on the channel fds for
 * at most a few milliseconds; lanes without a channel are re-polled after a short
 * sleep. Completion callbacks run in the worker thread (see cq/lane.h).
 *
 * The pool borrows its lanes: a lane is added after it was created and removed before
 * it is destroyed. Thread-safe; must not be called from a completion callback.
 */
#ifndef OTE_CQ_WORKERS_H
#define OTE_CQ_WORKERS_H

#include <sched.h>
#include <stdint.h>

#include "base/status.h"
#include "cq/lane.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ote_cq_workers ote_cq_workers_t;

/* Start `count` (1..64) worker threads. */
ote_status_t ote_cq_workers_start(uint32_t count, ote_cq_workers_t **workers_out);
/* The same, with every thread bound (before it polls anything) to the CPUs of NUMA node
 * numa_node that the creating thread is allowed to use: the node of the NICs the pool
 * serves. numa_node -1, a node this machine lacks, or no allowed CPU on it leaves the
 * pool unbound (logged at INFO); placement never fails the start. */
ote_status_t ote_cq_workers_start_numa(uint32_t count, int numa_node,
                                       ote_cq_workers_t **workers_out);
/* The CPU set the pool's threads are bound to; OTE_ERR_NOT_FOUND when unbound. */
ote_status_t ote_cq_workers_cpus(const ote_cq_workers_t *workers, cpu_set_t *cpus_out);
/* Stop and join every thread (each wakes within its bounded sleep) and free the pool.
 * OTE_ERR_BUSY while lanes are still added. */
ote_status_t ote_cq_workers_stop(ote_cq_workers_t *workers);

/* Add a lane to worker (lane index % count). OTE_ERR_EXISTS when already in a pool. */
ote_status_t ote_cq_workers_add(ote_cq_workers_t *workers, ote_cq_lane_t *lane);
/* Remove a lane; when this returns its worker no longer touches it. */
ote_status_t ote_cq_workers_remove(ote_cq_workers_t *workers, ote_cq_lane_t *lane);

uint32_t ote_cq_workers_count(const ote_cq_workers_t *workers);

#ifdef __cplusplus
}
#endif
#endif

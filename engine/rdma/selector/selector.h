/*
 * engine/rdma/selector/selector.h - the device selector: which NIC carries the next slice.
 *
 * An owner library of its own (//engine/rdma/selector): it knows device names, their NUMA
 * nodes, whether each is active and the bytes it carries, nothing of verbs, contexts or
 * the engine. The RDMA transport adds every device it opened, tells it when a port goes
 * down or comes back, asks it for a device per slice and reports each slice's end.
 *
 * Locality: where a slice's memory is, an int in [0, OTE_SELECTOR_MAX_LOCS) or -1
 * (unknown). A locality given a rank table (ote_selector_set_ranks: the RDMA transport
 * gives one per GPU from the PCIe tree, and one per locality an rdma_topology file names)
 * ranks each device by its entry in the table; what the locality stands for is the
 * caller's business. A locality without a table is NUMA node loc, ranked as follows.
 * Rank: the distance between the NUMA node of the slice's memory and the NIC's node
 * (hwloc's NUMA distance matrix when the selector is created with use_topology and hwloc
 * has one; a test may give its own distance function). Memory of unknown node ranks every
 * NIC 0. A NIC whose distance is unknown (no node, or none in the topology) ranks as the
 * farthest placement known (the largest distance from the memory's node to any node of the
 * topology or any NIC's node), never ahead of a near NIC; when no distance is known at
 * all, every NIC ranks 0, so NICs whose topology is unknown (the sim) rank equal.
 * Pick: among the active, allowed devices of the best (lowest) rank, the one whose bytes
 * would finish first: (bytes in flight + len) / rate, rate being an EWMA of its completion
 * rate (bytes done over each busy period, or over rate_window_ns of a longer one, when at
 * least 1 MiB); while some candidate has no rate yet, or the
 * candidates' rates differ by less than a factor OTE_SELECTOR_RATE_SPREAD (noise: one
 * request's slices are all picked at once, so a noisy rate would skew the whole split),
 * or some candidate's rate was last sampled more than OTE_SELECTOR_RATE_STALE rate
 * windows ago (so a device that once measured slow is tried, and measured, again),
 * the one with the fewest bytes in flight. Ties go to the least recently picked. The picked device's bytes
 * in flight grow by len until ote_selector_done().
 * Lists: allow (config rdma_devices; empty = every device) and deny (rdma_exclude) name
 * devices exactly; a device not allowed, or denied, is refused by ote_selector_add.
 *
 * Thread-safe (one internal mutex); the clock is ote_now_ns unless the config gives one.
 */
#ifndef OTE_ENGINE_RDMA_SELECTOR_SELECTOR_H
#define OTE_ENGINE_RDMA_SELECTOR_SELECTOR_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define OTE_SELECTOR_MAX_DEVICES 16
#define OTE_SELECTOR_NAME_MAX 64
#define OTE_SELECTOR_RATE_SPREAD 1.25
#define OTE_SELECTOR_RATE_STALE 8
#define OTE_SELECTOR_MAX_LOCS 128

typedef struct ote_selector ote_selector_t;

/* Distance between NUMA nodes a and b (both >= 0); negative: unknown. */
typedef int (*ote_selector_distance_fn)(void *arg, int a, int b);

typedef struct {
    const char *const *allow; /* rdma_devices: only these (NULL/0: all) */
    size_t nallow;
    const char *const *deny; /* rdma_exclude: never these */
    size_t ndeny;
    int use_topology;                  /* ranks from hwloc's NUMA distances (when no distance fn) */
    ote_selector_distance_fn distance; /* overrides hwloc (tests); NULL: hwloc or none */
    void *distance_arg;
    uint64_t (*clock)(void *arg); /* ns, monotonic; NULL: ote_now_ns */
    void *clock_arg;
    uint64_t rate_window_ns;  /* completion-rate sample period (0: 500 ms) */
    uint32_t ewma_weight_pct; /* weight of a new sample in the EWMA, 1..100 (0: 20) */
} ote_selector_config_t;

typedef struct {
    char name[OTE_SELECTOR_NAME_MAX];
    int numa_node;
    int active;
    uint64_t inflight;   /* bytes picked and not yet done */
    uint64_t bytes_done; /* bytes of slices that ended successfully */
    uint64_t bytes_failed;
    uint64_t picks;
    double rate_bps; /* EWMA of the completion rate while busy (0: none yet) */
} ote_selector_stats_t;

/* Whether cfg's lists let the device named name be used (no selector needed). */
int ote_selector_config_allows(const ote_selector_config_t *cfg, const char *name);

ote_status_t ote_selector_create(const ote_selector_config_t *cfg, ote_selector_t **out);
void ote_selector_destroy(ote_selector_t *s);

/* Add a device (active) at the next index. OTE_ERR_NOT_FOUND when the lists refuse it,
 * OTE_ERR_TOO_BIG past OTE_SELECTOR_MAX_DEVICES, OTE_ERR_INVALID for a bad name. */
ote_status_t ote_selector_add(ote_selector_t *s, const char *name, int numa_node, int *index_out);
size_t ote_selector_count(const ote_selector_t *s);
ote_status_t ote_selector_set_active(ote_selector_t *s, int index, int active);
int ote_selector_is_active(const ote_selector_t *s, int index);

/* Locality loc ranks the devices by ranks[0, n): ranks[i] is the rank of device index i
 * (lower is better; negative: unplaced, ranked after every placed device of the table);
 * a device at an index >= n is unplaced too. A later call replaces the table.
 * OTE_ERR_INVALID for loc outside [0, OTE_SELECTOR_MAX_LOCS), n past
 * OTE_SELECTOR_MAX_DEVICES or ranks NULL with n. */
ote_status_t ote_selector_set_ranks(ote_selector_t *s, int loc, const int *ranks, size_t n);
/* Whether loc has a rank table. */
int ote_selector_has_ranks(const ote_selector_t *s, int loc);

/* The device for a slice of len bytes of memory at locality mem_numa (-1: unknown),
 * among those whose bit is set in mask (bit i = index i; ~0: any). Its bytes in flight
 * grow by len. OTE_ERR_NO_DEVICE when no allowed device is active. */
ote_status_t ote_selector_pick(ote_selector_t *s, int mem_numa, uint64_t len, uint32_t mask,
                               int *index_out);
/* The devices in mask that are active and of the best rank among those for memory at
 * locality mem_numa (bit i = index i); 0 when none in mask is active. The RDMA pump
 * keeps a run waiting for room on these rather than spilling it onto a farther device. */
uint32_t ote_selector_best_mask(const ote_selector_t *s, int mem_numa, uint32_t mask);
/* The slice of len bytes picked on index ended (ok: its bytes moved). */
void ote_selector_done(ote_selector_t *s, int index, uint64_t len, int ok);
/* The rank of device index for memory at locality mem_numa (lower is better). */
int ote_selector_rank(const ote_selector_t *s, int index, int mem_numa);
ote_status_t ote_selector_stats(const ote_selector_t *s, int index, ote_selector_stats_t *out);

#ifdef __cplusplus
}
#endif
#endif

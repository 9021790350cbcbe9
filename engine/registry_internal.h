/*
 * engine/registry_internal.h - registered memory (//engine:registry): registry.c (the
 * sorted table of registrations, the pins the transports and the local buffers of
 * requests take, the list peers discover), mem_node.c (the NUMA node of a range) and
 * hugepages.c (register_thp). The registry calls the router's fan-out to register a
 * range with every transport; the router reaches the registry's host services only
 * through the pointers the lifecycle hands it (engine/router_internal.h).
 */
#ifndef OTE_ENGINE_REGISTRY_INTERNAL_H
#define OTE_ENGINE_REGISTRY_INTERNAL_H

/* Internal to OrbitTE's engine (see engine/core_internal.h): an outside workspace that
 * includes this header fails here. Use <ote/ote.h>. */
#ifndef OTE__INSIDE_ENGINE
#error "engine/registry_internal.h is internal to OrbitTE's engine; include <ote/ote.h> instead"
#endif

#include "engine/control/ctl.h"
#include "engine/core_internal.h"

/* ---- registry.c ------------------------------------------------------------------- */
/* The registration covering [addr, addr+len), or NULL. e->reg_lk held. */
ote__reg_t *ote__reg_covering(const ote_engine_t *e, uint64_t addr, uint64_t len);
/* The same, near first: when near (a registration found under the same hold of reg_lk)
 * covers the range it is the answer, without a search. */
ote__reg_t *ote__reg_covering_near(const ote_engine_t *e, uint64_t addr, uint64_t len,
                                   const ote__reg_t *near);
/* host->pin / host->unpin of the engine's transports (arg: the engine). */
ote_status_t ote__reg_pin(void *arg, uint64_t addr, uint64_t len, unsigned perm, void **pin_out);
void ote__reg_unpin(void *arg, void *pin);
/* host->buffers (arg: the engine): the BUFS frame answering req_id, listing the
 * registrations now (at most OTE_CTL_BUFS_MAX, lowest addresses first). */
/* The registrations a peer may see, as BUFS / metadata-blob entries: memory ones, then
 * (with_files) file ones, at most OTE_CTL_BUFS_MAX (the lowest addresses). *out is an
 * allocation the caller frees (NULL when *n_out is 0); *total_out how many there are. */
ote_status_t ote__reg_entries(ote_engine_t *e, int with_files, ote_ctl_buf_t **out, size_t *n_out,
                              size_t *total_out);
ote_status_t ote__reg_buffers(void *arg, uint16_t version, uint64_t req_id, uint8_t **frame_out,
                              size_t *len_out);
/* Whether [start, +len) overlaps a live registration; reg_lk held. */
int ote__reg_overlaps(const ote_engine_t *e, uint64_t start, uint64_t len);

/* ---- mem_node.c ------------------------------------------------------------------- */
/* The NUMA node of [addr, addr + len) of memory `kind` (host: where its pages are now;
 * device memory: its GPU's node), or -1 when unknown or spread over several nodes. */
int ote__mem_node(ote_engine_t *e, uint64_t addr, uint64_t len, uint32_t kind);

/* ---- hugepages.c ------------------------------------------------------------------ */
/* register_thp=1: advise the kernel to back the huge-page-aligned interior of host range
 * [addr, addr + len) with transparent huge pages (MADV_HUGEPAGE, then MADV_COLLAPSE).
 * Best effort: a failure is logged (once per engine and kind) and changes nothing else. */
void ote__thp_advise(ote_engine_t *e, uint64_t addr, uint64_t len);

#endif

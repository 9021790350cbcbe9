/*
 * engine/shared_mem_internal.h - the engine's shared allocations (shared_mem.c,
 * //engine:shared_mem): ote_memory_alloc_shared / ote_memory_free_shared, memory the
 * same-host transport hands to a peer as an fd. A new allocation must not overlap a
 * registration (registry); a freed one is forgotten by every transport (router).
 */
#ifndef OTE_ENGINE_SHARED_MEM_INTERNAL_H
#define OTE_ENGINE_SHARED_MEM_INTERNAL_H

/* Internal to OrbitTE's engine (see engine/core_internal.h): an outside workspace that
 * includes this header fails here. Use <ote/ote.h>. */
#ifndef OTE__INSIDE_ENGINE
#error "engine/shared_mem_internal.h is internal to OrbitTE's engine; include <ote/ote.h> instead"
#endif

#include "engine/core_internal.h"

/* The table of shared allocations (created before the transports, finished after them)
 * and host->shared_find (arg: the engine). */
ote_status_t ote__shared_init(ote_engine_t *e);
void ote__shared_fini(ote_engine_t *e);
ote_status_t ote__shared_find(void *arg, uint64_t addr, uint64_t len, ote__shared_ref_t *out);

#endif

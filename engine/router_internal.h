/*
 * engine/router_internal.h - the engine's transports (router.c, nic_stats.c,
 * //engine:router): their creation and destruction with the listener, the fan-out of a
 * registration or a freed shared allocation to each of them, the INFO handshake and the
 * choice of a transport per segment.
 *
 * The router sits below the owners whose services the transports call back (host->pin,
 * unpin and buffers: registry.c; host->deliver_notify: notify.c; host->shared_find:
 * shared_mem.c), since those owners call the router's fan-out. It never names them: the
 * lifecycle (engine.c), above all of them, hands them over at creation
 * (ote__router_upcalls_t), the way a transport receives ote__host_t.
 */
#ifndef OTE_ENGINE_ROUTER_INTERNAL_H
#define OTE_ENGINE_ROUTER_INTERNAL_H

/* Internal to OrbitTE's engine (see engine/core_internal.h): an outside workspace that
 * includes this header fails here. Use <ote/ote.h>. */
#ifndef OTE__INSIDE_ENGINE
#error "engine/router_internal.h is internal to OrbitTE's engine; include <ote/ote.h> instead"
#endif

#include "engine/core_internal.h"

/* The services of the owners above the router that the transports call (arg: the
 * engine); each has the type of the ote__host_t field of the same name (transport.h). */
typedef struct {
    ote_status_t (*pin)(void *arg, uint64_t addr, uint64_t len, unsigned perm, void **pin_out);
    void (*unpin)(void *arg, void *pin);
    ote_status_t (*buffers)(void *arg, uint16_t version, uint64_t req_id, uint8_t **frame_out,
                            size_t *len_out);
    ote_status_t (*deliver_notify)(void *arg, const char *from, const char *name, const void *msg,
                                   size_t len);
    ote_status_t (*shared_find)(void *arg, uint64_t addr, uint64_t len, ote__shared_ref_t *out);
} ote__router_upcalls_t;

/* Create the transports of e->cfg.transports (all or none), fill e->info/self_addr; up
 * (copied) gives them the services of the owners above the router. A failure whose
 * rollback retained a transport sets e->retained (e must not be freed). */
ote_status_t ote__router_create(ote_engine_t *e, const ote__router_upcalls_t *up);
/* Stop the listener and destroy every transport, then free the listener: OTE_OK. A
 * transport that is retained stays in e->tps (the others are gone) with the listener
 * object, and its status is returned: call again to retry what is left. */
ote_status_t ote__router_destroy(ote_engine_t *e);
/* Connect to peer through the first transport both sides offer that reaches it. */
ote_status_t ote__router_open(ote_engine_t *e, const char *peer, ote__transport_t **tp_out,
                              const char **name_out, ote__tpeer_t **peer_out);
/* A short connection to peer's listener, handshaken with the role INFO by dl (the
 * router's and discovery's): *fd_out (the caller closes it), the chosen version and the
 * peer's advertisement copied into info (cap bytes, NUL-terminated). */
ote_status_t ote__router_hello(ote_engine_t *e, const char *peer, ote_deadline_t dl, int *fd_out,
                               uint16_t *version_out, char *info, size_t cap);
/* host->query_info (arg: the engine). */
ote_status_t ote__router_query_info(void *arg, const char *peer, char *buf, size_t cap);
/* mem_(un)register of every transport (all or none for register). */
ote_status_t ote__router_mem_register(ote_engine_t *e, void *addr, size_t len, unsigned perms);
ote_status_t ote__router_mem_unregister(ote_engine_t *e, void *addr);
/* Device memory on the transports that take a dma-buf MR (mem_register_dmabuf): OTE_OK
 * when at least one did (all or nothing among them), OTE_ERR_UNSUPPORTED when none can. */
ote_status_t ote__router_mem_register_dmabuf(ote_engine_t *e, void *addr, size_t len, int fd,
                                             uint64_t offset);
/* A device registration with OTE_PERM_IPC is gone: each transport's ipc_revoke (close
 * receipts to the peers that imported its allocation). No engine lock held. */
void ote__router_ipc_revoke(ote_engine_t *e, uint64_t start, uint64_t len);
/* The shared allocation id was freed: every transport forgets it (ops->shared_free). */
void ote__router_shared_free(ote_engine_t *e, uint64_t id);

#endif

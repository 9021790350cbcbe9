/*
 * engine/listen_internal.h - the engine's one listening socket (listen.c, //engine:listener).
 * It hands each accepted connection, after the back-off, the authentication and the HELLO,
 * to the transport the HELLO names. The router (router.c) creates, starts, stops and
 * frees it; nothing below the router calls it.
 */
#ifndef OTE_ENGINE_LISTEN_INTERNAL_H
#define OTE_ENGINE_LISTEN_INTERNAL_H

/* Internal to OrbitTE's engine (see engine/core_internal.h): an outside workspace that
 * includes this header fails here. Use <ote/ote.h>. */
#ifndef OTE__INSIDE_ENGINE
#error "engine/listen_internal.h is internal to OrbitTE's engine; include <ote/ote.h> instead"
#endif

#include "engine/core_internal.h"

typedef struct ote__listen ote__listen_t;
/* Bind and listen on e->cfg.listen_address and fill e->self_addr (the advertised
 * address); nothing is accepted before ote__listen_start. */
ote_status_t ote__listen_create(ote_engine_t *e, ote__listen_t **out);
/* Start accepting (every transport of e exists). */
ote_status_t ote__listen_start(ote__listen_t *l);
/* Stop accepting, end and join every handshake, close the socket (before the transports
 * are destroyed). */
void ote__listen_stop(ote__listen_t *l);
/* Stop (if not yet) and free (after the transports are destroyed). NULL: nothing. */
void ote__listen_free(ote__listen_t *l);
/* An adopted connection has closed (host->conn_closed). */
void ote__listen_release(ote__listen_t *l);

#endif

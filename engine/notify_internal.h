/*
 * engine/notify_internal.h - notifications (notify.c, //engine:notify): the queue of
 * received ones (host->deliver_notify), ote_notify_*, and the outgoing ones attached to
 * a batch, which the batch (batch.c, above) decides and sends once no request of it is
 * pending.
 */
#ifndef OTE_ENGINE_NOTIFY_INTERNAL_H
#define OTE_ENGINE_NOTIFY_INTERNAL_H

/* Internal to OrbitTE's engine (see engine/core_internal.h): an outside workspace that
 * includes this header fails here. Use <ote/ote.h>. */
#ifndef OTE__INSIDE_ENGINE
#error "engine/notify_internal.h is internal to OrbitTE's engine; include <ote/ote.h> instead"
#endif

#include "engine/core_internal.h"

/* host->deliver_notify (arg: the engine). */
ote_status_t ote__notify_deliver(void *arg, const char *from, const void *msg, size_t len);
/* Drop one reference of an outgoing notification (freed with the last). */
void ote__nout_put(ote__nout_t *n);
/* Decide b's attached notifications once no request is pending. b->mu held. Returns the
 * list to send (with ote__notes_send, no lock held); frees the others. */
ote__nout_t *ote__batch_decide_notes(ote_batch_t *b);
void ote__notes_send(ote__nout_t *list);

#endif

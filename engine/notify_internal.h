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
ote_status_t ote__notify_deliver(void *arg, const char *from, const char *name, const void *msg,
                                 size_t len);
/* Drop one reference of an outgoing notification (freed with the last). */
void ote__nout_put(ote__nout_t *n);
/* Decide b's attached notifications once no request is pending. b->mu held. Returns the
 * list to send (with ote__notes_send, no lock held); frees the others. */
ote__nout_t *ote__batch_decide_notes(ote_batch_t *b);
void ote__notes_send(ote__nout_t *list);
/* ote_batch_wait, after its requests ended (b->mu not held; b->sent stable: only
 * decide, under b->mu from the last request's end, adds to it, and no request is
 * pending): until every sent notification is acknowledged or failed, or dl. */
ote_status_t ote__batch_wait_notes(ote_batch_t *b, ote_deadline_t dl);
/* reset and destroy (b->mu held or b private): drop the batch's references to its sent
 * notifications (they go on) and forget their outcome. */
void ote__batch_drop_sent(ote_batch_t *b);
/* Engine destroy: stop the retry thread (nothing is queued once every segment closed). */
void ote__notify_retry_stop(ote_engine_t *e);

#endif

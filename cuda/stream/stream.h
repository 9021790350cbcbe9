/*
 * cuda/stream/stream.h - copy streams: one non-blocking CUDA stream with a reusable
 * completion event, and the owners its pending work touches.
 *
 * A unit of work is: copies enqueued with ote_cuda_stream_copy() (asynchronous), the
 * owners they touch held with ote_cuda_stream_hold_*() (an allocation's or pinned
 * memory's access lock, or a staging chunk), then ote_cuda_stream_commit(), which records
 * the event (and, optionally, enqueues a completion callback). The caller then polls
 * (ote_cuda_stream_poll(), or ote_cuda_stream_wait() with a deadline). When the event has
 * completed, every hold is released and the stream is idle for the next unit; until then
 * new copies are refused (OTE_ERR_BUSY): pending work is drained before a stream is
 * reused.
 *
 * Failure ownership (as the verbs owners):
 *  - an enqueue or record that fails needs a successful stream drain
 *    (cuStreamSynchronize) before the holds are released; then the stream is idle and the
 *    call returns the enqueue's error;
 *  - a wait whose outcome is unknown (cuEventQuery, or the drain, fails with anything but
 *    NOT_READY) RETAINS the stream, its event and every hold: the stream answers
 *    OTE_ERR_RETAINED, is counted, and ote_cuda_stream_reclaim() asks the driver again;
 *  - a deadline that passes is not a drain: OTE_ERR_TIMEOUT leaves the work pending.
 * Destroy drains first (until its deadline); a retained stream, or a failed native
 * destroy, is parked on its device's retained list (OTE_ERR_RETAINED) and released by
 * ote_cuda_device_reclaim().
 *
 * A stream is used by one thread at a time (the caller serializes); streams are
 * independent of each other. Completion callbacks run on a driver thread and must not
 * call the CUDA driver.
 */
#ifndef OTE_CUDA_STREAM_STREAM_H
#define OTE_CUDA_STREAM_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "base/time.h"
#include "cuda/memory/device.h"
#include "cuda/memory/memory.h"
#include "cuda/pinned/pinned.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ote_cuda_stream ote_cuda_stream_t;

typedef enum {
    OTE_CUDA_COPY_HTOD = 1, /* dst device, src host */
    OTE_CUDA_COPY_DTOH = 2, /* dst host, src device */
    OTE_CUDA_COPY_DTOD = 3,
} ote_cuda_copy_kind_t;

typedef enum {
    OTE_CUDA_STREAM_IDLE = 0,
    OTE_CUDA_STREAM_OPEN = 1,     /* copies or holds added, not committed */
    OTE_CUDA_STREAM_PENDING = 2,  /* committed, not yet seen complete */
    OTE_CUDA_STREAM_RETAINED = 3, /* outcome unknown: retained until reclaimed */
} ote_cuda_stream_state_t;

typedef void (*ote_cuda_stream_done_fn)(void *arg);

ote_status_t ote_cuda_stream_create(ote_cuda_device_t *dev, ote_cuda_stream_t **stream_out);
/* OTE_OK, OTE_ERR_TIMEOUT (still pending; nothing destroyed), OTE_ERR_RETAINED (parked on
 * the device). */
ote_status_t ote_cuda_stream_destroy(ote_cuda_stream_t *s, ote_deadline_t deadline);

/* Enqueue an asynchronous copy. Host addresses are passed as integers. */
ote_status_t ote_cuda_stream_copy(ote_cuda_stream_t *s, ote_cuda_copy_kind_t kind,
                                  ote_cu_deviceptr_t dst, ote_cu_deviceptr_t src, size_t len);
ote_status_t ote_cuda_stream_hold_alloc(ote_cuda_stream_t *s, ote_cuda_alloc_t *a);
ote_status_t ote_cuda_stream_hold_host(ote_cuda_stream_t *s, ote_cuda_host_mem_t *m);
/* The chunk goes back to its pool when the work completes (ownership passes to the
 * stream on success). */
ote_status_t ote_cuda_stream_hold_chunk(ote_cuda_stream_t *s, ote_cuda_staging_t *pool,
                                        const ote_cuda_chunk_t *chunk);
/* Record the completion event; done (optional) runs on a driver thread once the work
 * before it completed, and before the event completes (so a poll that returns OTE_OK
 * proves it has run). If done was enqueued and the record then fails, done still runs
 * during the drain. */
ote_status_t ote_cuda_stream_commit(ote_cuda_stream_t *s, ote_cuda_stream_done_fn done, void *arg);
/* OTE_OK: idle (work complete, holds released); OTE_ERR_AGAIN: pending; OTE_ERR_STATE:
 * open (not committed); OTE_ERR_RETAINED; another status: the query failed just now and
 * the stream is retained. */
ote_status_t ote_cuda_stream_poll(ote_cuda_stream_t *s);
/* Poll until idle or the deadline: OTE_ERR_TIMEOUT leaves the work pending. */
ote_status_t ote_cuda_stream_wait(ote_cuda_stream_t *s, ote_deadline_t deadline);
/* For a retained stream: ask the driver again. OTE_OK when the work proved complete
 * (holds released, stream idle), OTE_ERR_AGAIN when still running, else still retained. */
ote_status_t ote_cuda_stream_reclaim(ote_cuda_stream_t *s);

ote_cuda_stream_state_t ote_cuda_stream_state(const ote_cuda_stream_t *s);
size_t ote_cuda_stream_holds(const ote_cuda_stream_t *s);
ote_cu_stream_t ote_cuda_stream_handle(const ote_cuda_stream_t *s);
ote_cuda_device_t *ote_cuda_stream_device(const ote_cuda_stream_t *s);

#ifdef __cplusplus
}
#endif
#endif

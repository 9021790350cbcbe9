/*
 * compat/mooncake/batch.c - batch ids: allocateBatchID's table of OrbitTE batches,
 * submitTransfer(WithNotify), getTransferStatus and freeBatchID. A batch id names one
 * ote_batch_t of batch_size requests; task i is the batch's i-th request. The OrbitTE
 * calls run without the mutex, under a use count of the batch and of each segment named.
 */
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "compat/mooncake/compat_internal.h"

/* How long destroyTransferEngine waits for canceled requests to end, per batch. */
#define MC_DESTROY_WAIT_NS (60ull * 1000000000ull)

batch_id_t allocateBatchID(transfer_engine_t engine, size_t batch_size) {
    mc_engine_t *e = ote__mc_engine(engine, "allocateBatchID");
    if (e == NULL) return INVALID_BATCH;
    ote_engine_t *ote = ote__mc_ote(e, "allocateBatchID");
    if (ote == NULL) return INVALID_BATCH;
    mc_batch_t *mb = ote_calloc(1, sizeof *mb);
    ote_status_t st = mb == NULL ? OTE_ERR_NOMEM : ote_batch_create(ote, batch_size, &mb->b);
    if (st == OTE_OK) {
        mb->cap = batch_size;
        ote_mutex_lock(&e->mu);
        mb->id = e->next_batch++;
        OTE_HASH_ADD(hh, e->batches, id, sizeof mb->id, mb, st);
        ote_mutex_unlock(&e->mu);
        if (st == OTE_OK) return mb->id;
        (void)ote_batch_destroy(mb->b); /* nothing submitted */
    }
    OTE_ERROR(MC_LOG, "allocateBatchID(%zu): %s", batch_size, ote_status_str(st));
    ote_free(mb);
    return INVALID_BATCH;
}

/* The batch of id with a use count taken (drop it with batch_put), or NULL. */
static mc_batch_t *batch_get(mc_engine_t *e, uint64_t id) {
    mc_batch_t *mb = NULL;
    ote_mutex_lock(&e->mu);
    HASH_FIND(hh, e->batches, &id, sizeof id, mb);
    if (mb != NULL && mb->freeing) mb = NULL;
    if (mb != NULL) mb->users++;
    ote_mutex_unlock(&e->mu);
    return mb;
}

static void batch_put(mc_engine_t *e, mc_batch_t *mb) {
    ote_mutex_lock(&e->mu);
    mb->users--;
    ote_mutex_unlock(&e->mu);
}

/* Reserve count requests of mb's capacity: 0 or OTE_MC_CODE_TOO_MANY_REQUESTS. */
static int batch_reserve(mc_engine_t *e, mc_batch_t *mb, size_t count) {
    int rc = OTE_MC_CODE_OK;
    ote_mutex_lock(&e->mu);
    if (count > mb->cap - mb->used) rc = OTE_MC_CODE_TOO_MANY_REQUESTS;
    else mb->used += count;
    ote_mutex_unlock(&e->mu);
    return rc;
}

/* Translate entries into reqs, taking a use count of each entry's segment (held[i] =
 * its id, -1 while none): 0 or a Status code (logged). */
static int build_requests(mc_engine_t *e, const struct transfer_request *entries, size_t count,
                          ote_request_t *reqs, int32_t *held) {
    for (size_t i = 0; i < count; i++) {
        const struct transfer_request *t = &entries[i];
        if ((t->opcode != OPCODE_READ && t->opcode != OPCODE_WRITE) ||
            (t->source == NULL && t->length > 0)) {
            OTE_ERROR(MC_LOG, "submitTransfer: entry %zu: bad opcode %d or source %p", i, t->opcode,
                      t->source);
            return OTE_MC_CODE_INVALID_ARGUMENT;
        }
        if (t->length > 0 && !ote__mc_regs_cover(e, t->source, t->length)) {
            OTE_ERROR(MC_LOG, "submitTransfer: entry %zu: source [%p, +%llu) is not registered", i,
                      t->source, (unsigned long long)t->length);
            return OTE_MC_CODE_ADDRESS_NOT_REGISTERED;
        }
        ote_segment_t *seg = NULL;
        if (ote__mc_seg_get(e, t->target_id, &seg) != OTE_OK) {
            OTE_ERROR(MC_LOG, "submitTransfer: entry %zu: no open segment %d", i,
                      (int)t->target_id);
            return OTE_MC_CODE_INVALID_ARGUMENT;
        }
        held[i] = t->target_id;
        reqs[i] = (ote_request_t){
            .opcode = t->opcode == OPCODE_READ ? OTE_READ : OTE_WRITE,
            .local_addr = t->source,
            .segment = seg,
            .remote_addr = t->target_offset,
            .length = (size_t)t->length,
        };
    }
    return OTE_MC_CODE_OK;
}

/* Submit entries to mb (and attach the encoded notification note to entries[0]'s segment
 * when note_len > 0): 0 or a Status code. */
static int batch_submit(mc_engine_t *e, mc_batch_t *mb, const struct transfer_request *entries,
                        size_t count, const char *note, size_t note_len) {
    int rc = batch_reserve(e, mb, count);
    if (rc != OTE_MC_CODE_OK) {
        OTE_ERROR(MC_LOG, "submitTransfer: %zu more requests exceed batch %llu's size %zu", count,
                  (unsigned long long)mb->id, mb->cap);
        return rc;
    }
    ote_request_t *reqs = ote_malloc(count * sizeof *reqs);
    int32_t *held = ote_malloc(count * sizeof *held);
    if (reqs == NULL || held == NULL) rc = OTE_MC_CODE_MEMORY;
    for (size_t i = 0; held != NULL && i < count; i++) held[i] = -1;
    if (rc == OTE_MC_CODE_OK) rc = build_requests(e, entries, count, reqs, held);
    int submitted = 0;
    if (rc == OTE_MC_CODE_OK) {
        ote_status_t st = ote_batch_submit(mb->b, reqs, count);
        submitted = st == OTE_OK;
        /* After the submit: attached first, it would wait forever for a failed submit. */
        if (submitted && note_len > 0)
            st = ote_batch_notify(mb->b, reqs[0].segment, note, note_len);
        if (st != OTE_OK)
            OTE_ERROR(MC_LOG, "submitTransfer: %s%s", submitted ? "the notification: " : "",
                      ote_status_str(st));
        rc = ote__mc_code(st);
    }
    for (size_t i = 0; held != NULL && i < count && held[i] >= 0; i++) ote__mc_seg_put(e, held[i]);
    ote_mutex_lock(&e->mu);
    if (!submitted) mb->used -= count;
    if (rc == OTE_MC_CODE_OK && note_len > 0) {
        mb->notes++;
        mb->notes_final = 0;
    }
    ote_mutex_unlock(&e->mu);
    ote_free(reqs);
    ote_free(held);
    return rc;
}

static int submit(transfer_engine_t engine, const char *fn, batch_id_t batch_id,
                  const struct transfer_request *entries, size_t count, const notify_msg_t *n) {
    mc_engine_t *e = ote__mc_engine(engine, fn);
    if (e == NULL) return OTE_MC_CODE_INVALID_ARGUMENT;
    if ((entries == NULL && count > 0) || (n != NULL && count == 0)) {
        OTE_ERROR(MC_LOG, "%s: no entries", fn);
        return OTE_MC_CODE_INVALID_ARGUMENT;
    }
    char note[OTE_NOTIFY_MAX];
    size_t note_len = 0;
    if (n != NULL && ote__mc_notify_encode(n, note, sizeof note, &note_len) != OTE_OK) {
        OTE_ERROR(MC_LOG, "%s: the notification is longer than %d bytes", fn, OTE_NOTIFY_MAX - 8);
        return OTE_MC_CODE_INVALID_ARGUMENT;
    }
    if (count == 0) return OTE_MC_CODE_OK;
    mc_batch_t *mb = batch_get(e, batch_id);
    if (mb == NULL) {
        OTE_ERROR(MC_LOG, "%s: no batch %llu", fn, (unsigned long long)batch_id);
        return OTE_MC_CODE_INVALID_ARGUMENT;
    }
    int rc = batch_submit(e, mb, entries, count, note, note_len);
    batch_put(e, mb);
    return rc;
}

int submitTransfer(transfer_engine_t engine, batch_id_t batch_id, struct transfer_request *entries,
                   size_t count) {
    return submit(engine, "submitTransfer", batch_id, entries, count, NULL);
}

int submitTransferWithNotify(transfer_engine_t engine, batch_id_t batch_id,
                             struct transfer_request *entries, size_t count,
                             notify_msg_t notify_msg) {
    return submit(engine, "submitTransferWithNotify", batch_id, entries, count, &notify_msg);
}

static int state_of(ote_transfer_state_t s) {
    switch (s) {
        case OTE_TRANSFER_WAITING: return STATUS_WAITING;
        case OTE_TRANSFER_PENDING: return STATUS_PENDING;
        case OTE_TRANSFER_COMPLETED: return STATUS_COMPLETED;
        case OTE_TRANSFER_CANCELED: return STATUS_CANCELED;
        case OTE_TRANSFER_TIMEOUT: return STATUS_TIMEOUT;
        case OTE_TRANSFER_FAILED: return STATUS_FAILED;
    }
    return STATUS_INVALID;
}

/* A COMPLETED task of a batch with notifications: STATUS_PENDING until they are
 * acknowledged, STATUS_FAILED when one sent could not be delivered (logged once). */
static int notes_state(mc_engine_t *e, mc_batch_t *mb) {
    ote_mutex_lock(&e->mu);
    int final = mb->notes_final;
    ote_status_t res = mb->notes_result;
    ote_mutex_unlock(&e->mu);
    if (!final) {
        if (ote_batch_wait(mb->b, 0) == OTE_ERR_TIMEOUT) return STATUS_PENDING;
        (void)ote_batch_notify_result(mb->b, &res); /* final once nothing is pending */
        ote_mutex_lock(&e->mu);
        int first = !mb->notes_final;
        mb->notes_final = 1;
        mb->notes_result = res;
        ote_mutex_unlock(&e->mu);
        if (first && res != OTE_OK && res != OTE_ERR_CANCELED)
            OTE_ERROR(MC_LOG, "batch %llu: its notification was not delivered: %s",
                      (unsigned long long)mb->id, ote_status_str(res));
    }
    return res != OTE_OK && res != OTE_ERR_CANCELED ? STATUS_FAILED : STATUS_COMPLETED;
}

int getTransferStatus(transfer_engine_t engine, batch_id_t batch_id, size_t task_id,
                      struct transfer_status *status) {
    mc_engine_t *e = ote__mc_engine(engine, "getTransferStatus");
    if (e == NULL || status == NULL) return OTE_MC_CODE_INVALID_ARGUMENT;
    mc_batch_t *mb = batch_get(e, batch_id);
    if (mb == NULL) {
        OTE_ERROR(MC_LOG, "getTransferStatus: no batch %llu", (unsigned long long)batch_id);
        return OTE_MC_CODE_INVALID_ARGUMENT;
    }
    ote_transfer_status_t ts;
    ote_status_t st = ote_batch_status(mb->b, task_id, &ts);
    if (st == OTE_OK && ts.state == OTE_TRANSFER_WAITING) st = OTE_ERR_NOT_FOUND;
    int rc = OTE_MC_CODE_INVALID_ARGUMENT;
    if (st == OTE_OK) {
        int s = state_of(ts.state);
        ote_mutex_lock(&e->mu);
        unsigned notes = mb->notes;
        ote_mutex_unlock(&e->mu);
        if (s == STATUS_COMPLETED && notes > 0) s = notes_state(e, mb);
        status->status = s;
        status->transferred_bytes = ts.bytes_done;
        rc = OTE_MC_CODE_OK;
    } else {
        OTE_ERROR(MC_LOG, "getTransferStatus: batch %llu has no task %zu",
                  (unsigned long long)batch_id, task_id);
    }
    batch_put(e, mb);
    return rc;
}

/* Destroy mb unless a task or notification is pending or a call uses it: OTE_OK (mb is
 * freed), OTE_ERR_BUSY, OTE_ERR_NOT_FOUND, or the failure of ote_batch_destroy. */
static ote_status_t batch_free(mc_engine_t *e, uint64_t id) {
    mc_batch_t *mb = NULL;
    ote_mutex_lock(&e->mu);
    HASH_FIND(hh, e->batches, &id, sizeof id, mb);
    ote_status_t st = mb == NULL                 ? OTE_ERR_NOT_FOUND
                      : mb->users || mb->freeing ? OTE_ERR_BUSY
                                                 : OTE_OK;
    if (st == OTE_OK) mb->freeing = 1;
    ote_mutex_unlock(&e->mu);
    if (st != OTE_OK) return st;
    st = ote_batch_wait(mb->b, 0) == OTE_ERR_TIMEOUT ? OTE_ERR_BUSY : OTE_OK;
    if (st == OTE_OK) st = ote_batch_destroy(mb->b);
    ote_mutex_lock(&e->mu);
    if (st == OTE_OK) HASH_DEL(e->batches, mb);
    else mb->freeing = 0;
    ote_mutex_unlock(&e->mu);
    if (st == OTE_OK) ote_free(mb);
    return st;
}

int freeBatchID(transfer_engine_t engine, batch_id_t batch_id) {
    mc_engine_t *e = ote__mc_engine(engine, "freeBatchID");
    if (e == NULL) return OTE_MC_CODE_INVALID_ARGUMENT;
    ote_status_t st = batch_free(e, batch_id);
    if (st == OTE_ERR_BUSY) return OTE_MC_CODE_BATCH_BUSY; /* Mooncake's answer, not logged */
    if (st != OTE_OK)
        OTE_ERROR(MC_LOG, "freeBatchID(%llu): %s", (unsigned long long)batch_id,
                  st == OTE_ERR_NOT_FOUND ? "no such batch" : ote_status_str(st));
    return st == OTE_ERR_NOT_FOUND ? OTE_MC_CODE_INVALID_ARGUMENT : ote__mc_code(st);
}

void ote__mc_batches_free_all(mc_engine_t *e) {
    ote_mutex_lock(&e->mu);
    size_t n = HASH_COUNT(e->batches);
    ote_mutex_unlock(&e->mu);
    for (size_t i = 0; i < n; i++) {
        ote_mutex_lock(&e->mu);
        mc_batch_t *mb = e->batches;
        ote_mutex_unlock(&e->mu);
        if (mb == NULL) break;
        uint64_t id = mb->id;
        (void)ote_batch_cancel(mb->b);
        (void)ote_batch_wait(mb->b, MC_DESTROY_WAIT_NS);
        ote_status_t st = batch_free(e, id);
        if (st != OTE_OK) {
            OTE_ERROR(MC_LOG, "destroyTransferEngine: batch %llu is kept: %s",
                      (unsigned long long)id, ote_status_str(st));
            break;
        }
    }
}

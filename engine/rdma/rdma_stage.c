/*
 * engine/rdma/rdma_stage.c - source-side staging of device memory over RDMA: each
 * grant of a staged request (rdma_accounts.c) gets a host bounce buffer of exactly its
 * length from the engine (host->gpu.stage_pooled: a pinned chunk of the bounded pool when it
 * fits one, OTE_ERR_AGAIN when every chunk is out, so that the requester asks again;
 * heap only for a grant larger than a chunk, which a requester sends only before it
 * learned that the request is staged: rdma_pump.c then cuts its runs at the chunk size,
 * so the copy of grant k+1 here overlaps the requester's transfer of grant k),
 * an MW-bindable MR over it in the grant's device, and the range's bytes copied into it
 * from the device without waiting (host->gpu.stage_copy_start: rdma_source.c serves the
 * grant, binding its window, once the GPU worker saw the copy complete, bounded by the
 * grant's deadline; the serving thread goes on meanwhile), so that the grant's window
 * covers exactly the bounce bytes, and only after they are there.
 *
 * The MR: a pool chunk's is registered once per device, at the chunk's first use there,
 * and kept for the transport's life (rdma_stage_mrs.c: local-only and MW-bindable, so its
 * own rkey grants nothing; deregistered by the teardown before the PDs, and through the
 * engine's order before the pool's memory); a chunk used again by another grant shows
 * nothing of the earlier one, whose window died before the chunk went back, while the
 * new window is bound only after the new copy completed. A heap bounce (larger than a
 * chunk, or the fallback while a chunk is parked) gets a temporary MR of its own. The
 * grant's end (src_unpin in rdma_source.c, after the grant layer invalidated or
 * deallocated the window) deregisters a temporary MR and gives the bounce buffer back;
 * a temporary MR that will not deregister keeps its buffer (the NIC may still reach
 * it): retained for good, counted in the device's context.
 *
 * A WRITE's bounce starts as a copy of the range (so bytes a canceled grant never wrote
 * go back unchanged); its grant's receipt (a successful receive with invalidation of its
 * window's rkey on its QP: every write of the requester completed) marks it landed, and
 * its end starts its copy host-to-device without waiting (host->gpu.stage_copy_start with
 * to_device 1, bounded by the grant's deadline: the thread that ended the grant, a CQ
 * lane's worker or the monitor, goes on). Once the GPU worker saw that copy end
 * (stage_copied), a temporary MR is deregistered, the bounce given back (or, when the copy's
 * outcome is unknown, its chunk parked by engine/gpu, logged) and the COMMIT (status
 * OK, or the failure) goes to the requester, whose request completes only on it: after
 * the bytes are in device memory; only then are its bytes of the request's account (whose
 * pin keeps the range registered) settled (ote__rdma_stage_end_then). A running copy back
 * holds a reference on the connection and is counted in tp->src_copies, which the teardown
 * waits for. A grant that ends without its receipt (deadline, RELEASE, the requester's
 * loss) copies nothing and commits a failure at once. See rdma_internal.h for the
 * protocol around it.
 *
 * A file registration (docs/files.md, "Peers") is staged the same way through the file
 * owner's bounce buffers (host->file): bounce_get for the buffer; one the owner keeps
 * (bounce_kept: the first OTE__FILE_BOUNCE_KEEP of its size class, the same memory until
 * the owner's destroy, which the engine runs after the transports') has its MR kept per
 * device as a pool chunk's, any other a temporary MR for its grant. The file range is
 * read into it (READ, and a WRITE's initial copy) as the device's bytes are copied:
 * without waiting (bounce_io_start, bounded by the grant's deadline), the grant served
 * by rdma_source.c's src_copied from the read's end on the file owner's reaper or pool
 * thread, while the server thread serves the next GRANT_REQ. A landed WRITE's bounce is
 * written to the file (and fdatasync'd with file_sync=data) the same way
 * (bounce_io_start, to_file 1), as a device copy back is started: the thread that ends
 * the grant goes on, and its COMMIT goes from the write's end on the file owner's
 * thread.
 */
#include <stdint.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "engine/rdma/rdma_internal.h"
#include "engine/rdma/rdma_stage.h"
#include "ote/ote.h"

struct rdma_stage {
    rdma_tp_t *tp;
    rdma_nic_t *nic;
    void *tok; /* the engine's bounce token (host->gpu.stage_put) */
    uint8_t *buf;
    uint64_t len;
    struct ibv_mr *mr;
    int cached; /* mr is its pool chunk's, kept (rdma_stage_mrs.c); else ours, temporary */
    int file;   /* a file registration's: tok is host->file's */
    /* A WRITE: the device range its bytes go to once they landed, and its COMMIT's
     * destination (a reference on c; req_id = the grant's wire id). Listed in tp->stages
     * (under tp->mu) from its answer to its end, under (nic, qpn, rkey), so that its
     * receipt finds it. */
    int write;
    uint64_t dev_addr;
    ote_deadline_t dl;
    conn_t *c;
    uint64_t req_id;
    uint32_t qpn, rkey;
    /* Under tp->mu: listed (answered OK, not ended), landed (its receipt came), ended
     * (its grant ended) and refs (the grant's pin, and a WRITE's answer until it ran:
     * the last one frees the struct). */
    int listed, landed, ended, refs;
    struct rdma_stage *next;
    /* A copy back's end also runs then(tp, then_arg) (ote__rdma_stage_end_then). */
    void (*then)(rdma_tp_t *, void *);
    void *then_arg;
};

/* The bounce buffer of st (file or device memory, by its registration reg_pin) and its MR
 * in st->nic's context; nothing held on failure. */
static ote_status_t stage_buffer(rdma_tp_t *tp, rdma_stage_t *st, void *reg_pin);

ote_status_t ote__rdma_stage_take(rdma_tp_t *tp, rdma_nic_t *nic, void *reg_pin, int write,
                                  uint64_t addr, uint64_t len, ote_deadline_t dl,
                                  rdma_stage_t **st_out) {
    int file = ote__pin_kind(reg_pin) == OTE_MEM_FILE;
    if (file ? (tp->host.file.bounce_get == NULL || tp->host.file.bounce_copy == NULL ||
                tp->host.file.bounce_io_start == NULL || tp->host.file.bounce_put == NULL)
             : (tp->host.gpu.stage_pooled == NULL || tp->host.gpu.stage_copy == NULL ||
                tp->host.gpu.stage_copy_start == NULL || tp->host.gpu.stage_put == NULL))
        return OTE_ERR_UNSUPPORTED;
    /* The bounce holds the whole grant: a grant is never larger than rdma_grant_max (the
     * largest a requester asks), and never more than one bounce can hold. */
    if (len == 0 || len > tp->cfg.rdma_grant_max || len > UINT32_MAX) {
        OTE_WARN_LIMITED("rdma",
                         "staged READ grant of %llu bytes at 0x%llx refused: larger than "
                         "rdma_grant_max (%llu), the largest bounce buffer",
                         (unsigned long long)len, (unsigned long long)addr,
                         (unsigned long long)tp->cfg.rdma_grant_max);
        return OTE_ERR_TOO_BIG;
    }
    rdma_stage_t *st = ote_calloc(1, sizeof(*st));
    if (st == NULL) return OTE_ERR_NOMEM;
    st->tp = tp;
    st->nic = nic;
    st->refs = 1;
    st->len = len;
    st->write = write;
    st->dev_addr = addr;
    st->dl = dl;
    st->file = file;
    ote_status_t s = stage_buffer(tp, st, reg_pin);
    if (s != OTE_OK) {
        ote_free(st);
        return s;
    }
    atomic_fetch_add(&tp->src_stages, 1);
    *st_out = st;
    return OTE_OK;
}

/* A bounce buffer back to its owner (engine/gpu or engine/file). */
static void stage_put(rdma_tp_t *tp, const rdma_stage_t *st) {
    if (st->file) tp->host.file.bounce_put(tp->host.file.arg, st->tok);
    else tp->host.gpu.stage_put(tp->host.gpu.arg, st->tok);
}

static ote_status_t stage_buffer(rdma_tp_t *tp, rdma_stage_t *st, void *reg_pin) {
    rdma_nic_t *nic = st->nic;
    uint64_t len = st->len;
    /* Path check (device memory: gpu_paths has staging, else a WARN naming what is
     * missing) and the buffer. */
    ote_status_t s = st->file ? tp->host.file.bounce_get(tp->host.file.arg, reg_pin, (uint32_t)len,
                                                         &st->buf, &st->tok)
                              : tp->host.gpu.stage_pooled(tp->host.gpu.arg, reg_pin, (uint32_t)len,
                                                          &st->buf, &st->tok);
    if (s != OTE_OK) return s;
    /* A pool chunk, or a bounce the file owner keeps (up to a staged run's grant: a first
     * grant larger than that gets its MR for itself, so that the MRs kept pin at most
     * 32 of each class up to the run's chunk): its MR in this device, registered at its
     * first use and kept. Heap memory (larger than a chunk, or while a chunk is parked), a
     * file bounce the owner frees when given back, or a kept one whose MR could not be
     * made: a temporary MR. */
    uint8_t *cbase = NULL;
    uint64_t csize = 0;
    int chunk = st->file
                    ? tp->host.file.bounce_kept != NULL &&
                          tp->host.file.bounce_kept(tp->host.file.arg, st->tok, &cbase, &csize) &&
                          csize <= ote__rdma_stage_run_chunk(tp)
                    : tp->host.gpu.stage_chunk != NULL &&
                          tp->host.gpu.stage_chunk(tp->host.gpu.arg, st->tok, &cbase, &csize);
    if (chunk && cbase <= st->buf && (uint64_t)(st->buf - cbase) + len <= csize) {
        s = ote__rdma_stage_chunk_mr(tp, nic, cbase, csize, &st->mr);
        if (s == OTE_OK) {
            st->cached = 1;
            return OTE_OK;
        }
        if (!st->file) {
            stage_put(tp, st);
            return s;
        }
    }
    s = ote_buffer_mr_reg(tp->bm, nic->ctx, st->buf, len,
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND, NULL, &st->mr);
    if (s != OTE_OK) {
        OTE_WARN("rdma", "%s: MR over a %llu-byte bounce buffer failed: %s",
                 ote_context_name(nic->ctx), (unsigned long long)len, ote_status_str(s));
        stage_put(tp, st);
        return s;
    }
    atomic_fetch_add(&tp->stage_tmp_mrs, 1);
    return OTE_OK;
}

ote_status_t ote__rdma_stage_copy_start(rdma_tp_t *tp, rdma_stage_t *st,
                                        void (*done)(void *, ote_status_t), void *arg) {
    /* READ: the bytes the requester reads. WRITE: the range as it is, so that the copy
     * back after the receipt writes exactly what the requester wrote and, where a
     * canceled grant left bytes unwritten, what was there (never the bounce's garbage).
     * A file's range is read the same way, without waiting: queued on the file owner's
     * I/O engine until dl, done on its reaper or pool thread (the owner WARNs a failed
     * read; its read holds the registration in use until done). */
    ote_status_t s =
        st->file ? tp->host.file.bounce_io_start(tp->host.file.arg, st->tok, 0, st->dev_addr,
                                                 (uint32_t)st->len, st->dl, done, arg)
                 : tp->host.gpu.stage_copy_start(tp->host.gpu.arg, st->tok, 0, st->dev_addr,
                                                 (uint32_t)st->len, st->dl, done, arg);
    if (s != OTE_OK)
        OTE_WARN_LIMITED("rdma",
                         "staged %s grant of %llu bytes at 0x%llx: the copy from the %s "
                         "failed to start: %s",
                         st->write ? "WRITE" : "READ", (unsigned long long)st->len,
                         (unsigned long long)st->dev_addr, st->file ? "file" : "device",
                         ote_status_str(s));
    return s;
}

struct ibv_mr *ote__rdma_stage_mr(const rdma_stage_t *st) {
    return st->mr;
}

int ote__rdma_stage_is_file(const rdma_stage_t *st) { return st->file; }

uint64_t ote__rdma_stage_base(const rdma_stage_t *st) { return (uint64_t)(uintptr_t)st->buf; }

void ote__rdma_stage_commit_to(rdma_stage_t *st, conn_t *c, uint64_t req_id, uint32_t qpn) {
    if (!st->write) return;
    ote__rdma_conn_get(c);
    st->c = c;
    st->req_id = req_id;
    st->qpn = qpn;
    st->refs = 2; /* the answer's */
}

static void stage_unref_locked(rdma_stage_t *st, rdma_stage_t **free_out) {
    if (--st->refs == 0) *free_out = st;
}

void ote__rdma_stage_answered(rdma_tp_t *tp, rdma_stage_t *st, ote_status_t ans, uint32_t rkey) {
    if (st == NULL) return;
    rdma_stage_t *fr = NULL;
    ote_mutex_lock(&tp->mu);
    if (ans == OTE_OK && !st->ended) {
        st->rkey = rkey;
        st->listed = 1;
        st->next = tp->stages;
        tp->stages = st;
    }
    stage_unref_locked(st, &fr);
    ote_mutex_unlock(&tp->mu);
    ote_free(fr);
}

void ote__rdma_stage_receipt(rdma_tp_t *tp, const rdma_nic_t *nic, uint32_t qpn,
                             const struct ibv_wc *wc) {
    if (wc->status != IBV_WC_SUCCESS || !(wc->wc_flags & IBV_WC_WITH_INV)) return;
    ote_mutex_lock(&tp->mu);
    for (rdma_stage_t *st = tp->stages; st != NULL; st = st->next) {
        if (st->nic == nic && st->qpn == qpn && st->rkey == wc->invalidated_rkey) {
            /* The requester sends its receipt only after every write it posted under the
             * window completed: the bounce holds its bytes. */
            st->landed = 1;
            break;
        }
    }
    ote_mutex_unlock(&tp->mu);
}

/* The bounce goes back to the engine (tok: its token): its MR is gone. */
static void bounce_released(void *owner, void *tok) {
    rdma_tp_t *tp = owner;
    tp->host.gpu.stage_put(tp->host.gpu.arg, tok);
    atomic_fetch_sub(&tp->src_stages, 1);
}

/* As bounce_released, for a file registration's bounce (host->file's). */
static void file_bounce_released(void *owner, void *tok) {
    rdma_tp_t *tp = owner;
    tp->host.file.bounce_put(tp->host.file.arg, tok);
    atomic_fetch_sub(&tp->src_stages, 1);
}

/* A temporary MR goes, then the bounce, then the grant's reference. A temporary MR
 * that will not deregister is the buffer manager's orphan, and the bounce stays until
 * its reclaim deregisters it (the NIC may still reach the buffer meanwhile: never given
 * back nor reused before). A pool chunk's MR stays (its window is dead by now). */
static void stage_release(rdma_tp_t *tp, rdma_stage_t *st) {
    if (st->cached) {
        if (st->file) file_bounce_released(tp, st->tok);
        else bounce_released(tp, st->tok);
    } else {
        ote_status_t s =
            ote_buffer_mr_drop(tp->bm, st->nic->ctx, st->mr,
                               st->file ? file_bounce_released : bounce_released, tp, st->tok);
        if (s != OTE_OK)
            OTE_WARN("rdma",
                     "%s: dereg of a bounce buffer's MR failed (%s): MR and its %llu-byte "
                     "buffer retained until a retry deregisters it",
                     ote_context_name(st->nic->ctx), ote_status_str(s),
                     (unsigned long long)st->len);
    }
    rdma_stage_t *fr = NULL;
    ote_mutex_lock(&tp->mu);
    st->ended = 1;
    stage_unref_locked(st, &fr);
    ote_mutex_unlock(&tp->mu);
    ote_free(fr);
}

/* A staged WRITE's COMMIT on c (whose reference goes with it). */
static void stage_send_commit(conn_t *c, uint64_t req_id, uint32_t rkey, ote_status_t cst) {
    ote_rp_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = OTE_RP_COMMIT;
    m.u.commit.rkey = rkey;
    (void)ote__rdma_conn_send_rp(c, req_id, cst, &m);
    ote__rdma_conn_put(c);
}

static void stage_copy_warn(const rdma_stage_t *st, const char *what, ote_status_t s) {
    OTE_WARN_LIMITED("rdma",
                     "staged WRITE of %llu bytes at 0x%llx from %s: the copy to the %s %s: %s",
                     (unsigned long long)st->len, (unsigned long long)st->dev_addr,
                     st->c->peer_addr, st->file ? "file" : "device", what, ote_status_str(s));
}

/* GPU worker (a file's: the file owner's reaper or pool thread): a staged WRITE's copy
 * back ended (OTE_OK: its bytes are in device memory, or written to the file).
 * The bounce is released (engine/gpu parked its chunk when the outcome is unknown), then
 * the COMMIT goes; the copy's count is the last touch of tp. */
static void stage_copied(void *arg, ote_status_t s) {
    rdma_stage_t *st = arg;
    rdma_tp_t *tp = st->tp;
    if (s != OTE_OK) stage_copy_warn(st, "failed", s);
    conn_t *c = st->c;
    uint64_t req_id = st->req_id;
    uint32_t rkey = st->rkey;
    void (*then)(rdma_tp_t *, void *) = st->then;
    void *then_arg = st->then_arg;
    st->c = NULL;
    stage_release(tp, st); /* st may be gone */
    stage_send_commit(c, req_id, rkey, s == OTE_OK ? OTE_OK : OTE_ERR_REMOTE);
    /* No copy writes the device range now: what kept it registered may go. */
    if (then != NULL) then(tp, then_arg);
    atomic_fetch_sub(&tp->src_copies, 1);
}

/* A staged WRITE's grant ended: when the receipt proved the bytes landed, the copy of the
 * bounce to the device starts (1: stage_copied finishes the stage); otherwise (or when
 * it did not start) the COMMIT of the failure goes now (0). */
static int stage_commit(rdma_tp_t *tp, rdma_stage_t *st) {
    ote_mutex_lock(&tp->mu);
    int landed = st->landed, listed = st->listed;
    st->ended = 1;
    if (st->listed) {
        rdma_stage_t **pp = &tp->stages;
        while (*pp != NULL && *pp != st) pp = &(*pp)->next;
        if (*pp != NULL) *pp = st->next;
        st->listed = 0;
    }
    ote_mutex_unlock(&tp->mu);
    /* Never answered OK (refused, or ended before its answer ran): the requester's grant
     * fails on its own, no COMMIT is owed. */
    if (!listed) {
        ote__rdma_conn_put(st->c);
        st->c = NULL;
        return 0;
    }
    if (landed) {
        /* The copy back to the device, or the file's write (and fdatasync): queued on the
         * GPU worker or the file owner's I/O engine, never run on this thread (a CQ
         * lane's worker, the monitor, the server thread on a RELEASE). */
        atomic_fetch_add(&tp->src_copies, 1);
        ote_status_t s =
            st->file ? tp->host.file.bounce_io_start(tp->host.file.arg, st->tok, 1, st->dev_addr,
                                                     (uint32_t)st->len, st->dl, stage_copied, st)
                     : tp->host.gpu.stage_copy_start(tp->host.gpu.arg, st->tok, 1, st->dev_addr,
                                                     (uint32_t)st->len, st->dl, stage_copied, st);
        if (s == OTE_OK) return 1;
        atomic_fetch_sub(&tp->src_copies, 1);
        stage_copy_warn(st, "failed to start", s);
    }
    /* Ended without its receipt (nothing copied), or its copy did not start. */
    stage_send_commit(st->c, st->req_id, st->rkey, OTE_ERR_REMOTE);
    st->c = NULL;
    return 0;
}

int ote__rdma_stage_end_then(rdma_tp_t *tp, rdma_stage_t *st, void (*then)(rdma_tp_t *, void *),
                             void *arg) {
    if (st == NULL) return 0;
    /* Set before the copy can start: its end may run on the GPU worker at once. */
    st->then = then;
    st->then_arg = arg;
    if (st->c != NULL && stage_commit(tp, st)) return 1; /* stage_copied releases it */
    stage_release(tp, st);
    return 0;
}

void ote__rdma_stage_end(rdma_tp_t *tp, rdma_stage_t *st) {
    (void)ote__rdma_stage_end_then(tp, st, NULL, NULL);
}

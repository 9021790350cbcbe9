/*
 * engine/shm/shm_fread.c - the source's pieces on file registrations (host->file's
 * bounce buffers), on the connection thread. A WRITE piece: its bytes copied from the
 * requester into a bounce, then its write to the file queued on the file owner's I/O
 * engine (bounce_io_start, to_file 1) in a free slot while the thread serves the next
 * pieces; the settle of its run (before the notification after it, and before the
 * message's statuses go out) waits for it and makes its outcome the piece's status. With
 * no slot or bounce free it is written synchronously (bounce_copy). READ pieces of one
 * run of a message (the data entries between two notifications) read without waiting:
 * up to SHM_SRC_FILE_READS of them are queued on the file owner's I/O engine
 * (bounce_io_start) ahead of the one being copied, so the file reads of later pieces
 * run while earlier ones are copied to the requester, in order. When the run ends its
 * message, reading ahead goes on into the messages already read after it (the lookahead,
 * their pieces checked and pinned), up to the first WRITE or notification. Writes go
 * ahead likewise (fw_settle_ahead): while the last run of a message settles its writes,
 * the file WRITE pieces of the messages read after it start, in order, up to the first
 * notification, file READ not started, or WRITE whose range meets a running slot's or a
 * READ of the served message sent from the page cache. Reading ahead into later messages
 * waits while the run still has a file WRITE to start. Each
 * I/O's done() (the file owner's thread) only marks its slot; the thread waits for a
 * slot's end (bounded), and ote__shm_fread_settle waits for the I/O of a run still
 * running before its pins go (pieces canceled or a requester gone meanwhile), giving
 * their bounces back; every slot of a message is settled by the end of its serving (its
 * runs cover its entries, and the first run of a message covers what was written ahead
 * for it), the rest when the connection ends, before the pins of messages never served.
 * A file READ piece whose range the page cache holds in full takes none of this
 * (ote__shm_fread_mapped): the copy units copy it from the file's mapping like memory.
 */
#include <stdatomic.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "engine/shm/shm_internal.h"

typedef enum { FR_FREE = 0, FR_RUNNING, FR_ENDED } shm_fr_state_t;

typedef struct shm_frwin shm_frwin_t;
typedef struct {
    shm_frwin_t *w;
    shm_msg_t *m; /* the message ... */
    uint32_t idx; /* ... and its entry it reads for */
    void *tok;
    uint8_t *buf;
    ote_status_t st;
    _Atomic int state; /* shm_fr_state_t; RUNNING -> ENDED by done(), under w->mu */
    uint8_t write;     /* a WRITE piece's write of the bounce to the file */
} shm_fr_slot_t;

struct shm_frwin {
    ote_mutex_t mu;
    ote_cond_t cv;
    shm_fr_slot_t slot[SHM_SRC_FILE_READS];
};

/* done() of bounce_io_start: the file owner's thread. */
static void fr_done(void *arg, ote_status_t st) {
    shm_fr_slot_t *sl = arg;
    shm_frwin_t *w = sl->w;
    ote_mutex_lock(&w->mu);
    sl->st = st;
    atomic_store(&sl->state, FR_ENDED);
    ote_cond_broadcast(&w->cv);
    ote_mutex_unlock(&w->mu);
}

static shm_frwin_t *fr_win(shm_src_t *s) {
    if (s->frw != NULL) return s->frw;
    shm_frwin_t *w = ote_calloc(1, sizeof(*w));
    if (w == NULL) return NULL;
    if (ote_mutex_init(&w->mu) != OTE_OK) {
        ote_free(w);
        return NULL;
    }
    if (ote_cond_init(&w->cv) != OTE_OK) {
        ote_mutex_destroy(&w->mu);
        ote_free(w);
        return NULL;
    }
    for (int k = 0; k < SHM_SRC_FILE_READS; k++) w->slot[k].w = w;
    s->frw = w;
    return w;
}

static shm_fr_slot_t *fr_find(shm_frwin_t *w, const shm_msg_t *m, uint32_t i) {
    for (int k = 0; k < SHM_SRC_FILE_READS; k++)
        if (atomic_load(&w->slot[k].state) != FR_FREE && w->slot[k].m == m && w->slot[k].idx == i)
            return &w->slot[k];
    return NULL;
}

/* Whether a slot in use keeps file piece q (on registration reg) from starting now: its
 * range meets q's, or it is on another registration (two may name the same bytes of one
 * file). writes_only: only write slots count (a READ may run beside another READ). */
static int fr_conflicts(shm_src_t *s, shm_frwin_t *w, const void *reg, const shm_req_t *q,
                        int writes_only) {
    for (int k = 0; k < SHM_SRC_FILE_READS; k++) {
        const shm_fr_slot_t *sl = &w->slot[k];
        if (atomic_load(&sl->state) == FR_FREE || (writes_only && !sl->write)) continue;
        const shm_req_t *o = &ote__shm_msg_reqs(sl->m)[sl->idx];
        if (ote__shm_src_engine_pin(s, sl->m->pin[sl->idx]) != reg) return 1;
        if (q->remote < o->remote + o->len && o->remote < q->remote + q->len) return 1;
    }
    return 0;
}

/* Start the read of entry k of m when it is a file READ piece not started yet: 1 when it
 * runs (or needs none), 0 when no slot or bounce is free (stop filling). */
static int fr_start(shm_src_t *s, shm_frwin_t *w, shm_msg_t *m, uint32_t k, ote_deadline_t dl) {
    const ote__host_t *h = &s->tp->host;
    const shm_req_t *q = &ote__shm_msg_reqs(m)[k];
    if (q->op != OTE__SLICE_READ || m->pin[k] == NULL || !ote__shm_src_is_file(s, m->pin[k]) ||
        atomic_load(&m->st[k]) != OTE_OK || fr_find(w, m, k) != NULL)
        return 1;
    /* A write it meets runs: not ahead of it (a later message's READ after its WRITE). */
    if (fr_conflicts(s, w, ote__shm_src_engine_pin(s, m->pin[k]), q, 1)) return 0;
    /* Cached in full: the copy units send it from the page cache when its run is served. */
    if (ote__shm_fread_mapped(s, m, k)) return 1;
    shm_fr_slot_t *sl = NULL;
    for (int j = 0; j < SHM_SRC_FILE_READS && sl == NULL; j++)
        if (atomic_load(&w->slot[j].state) == FR_FREE) sl = &w->slot[j];
    if (sl == NULL || h->file.bounce_get(h->file.arg, ote__shm_src_engine_pin(s, m->pin[k]), q->len,
                                         &sl->buf, &sl->tok) != OTE_OK)
        return 0; /* this piece goes the synchronous way unless a slot frees first */
    sl->m = m;
    sl->idx = k;
    sl->write = 0;
    atomic_store(&sl->state, FR_RUNNING);
    if (h->file.bounce_io_start(h->file.arg, sl->tok, 0, q->remote, q->len, dl, fr_done, sl) !=
        OTE_OK) {
        h->file.bounce_put(h->file.arg, sl->tok);
        atomic_store(&sl->state, FR_FREE);
        return 0;
    }
    return 1;
}

/* Whether entry k of a later message lets reading ahead go past it: a READ, or an entry
 * that moves no byte; a WRITE or a notification keeps what follows it in its order. */
static int fr_passable(const shm_req_t *q) {
    return q->op == OTE__SLICE_READ || q->op == SHM_OP_WRITE_OFF || q->op == SHM_OP_CANCEL ||
           q->op == SHM_OP_IPC_DONE || q->op == SHM_OP_UNMAP;
}

/* Whether [i, b) of m holds a file WRITE piece whose write has not started (no slot):
 * a READ of a later message must not start before it. */
static int fr_write_pending(shm_src_t *s, shm_frwin_t *w, shm_msg_t *m, uint32_t i, uint32_t b) {
    const shm_req_t *q = ote__shm_msg_reqs(m);
    for (uint32_t k = i; k < b; k++)
        if (q[k].op == OTE__SLICE_WRITE && ote__shm_src_is_file(s, m->pin[k]) &&
            atomic_load(&m->st[k]) == OTE_OK && fr_find(w, m, k) == NULL)
            return 1;
    return 0;
}

/* Start the reads of the file READ pieces of [i, b) of m (the message being served) not
 * started yet, while slots are free; when the run ends m and holds no file WRITE still to
 * start, on into the messages read after it, as long as their entries are READs
 * (fr_passable). */
static void fr_fill(shm_src_t *s, shm_frwin_t *w, shm_msg_t *m, uint32_t i, uint32_t b) {
    ote_deadline_t dl = ote_deadline_after(s->tp->cfg.transfer_timeout_ms * OTE_NSEC_PER_MSEC);
    for (uint32_t k = i; k < b; k++)
        if (atomic_load(&s->abort) || !fr_start(s, w, m, k, dl)) return;
    if (b < m->in.h.n || m != &s->msgs[s->mhead] || fr_write_pending(s, w, m, i, b)) return;
    for (uint32_t n = 1; n < s->mcount; n++) {
        shm_msg_t *later = &s->msgs[(s->mhead + n) % SHM_LOOKAHEAD];
        const shm_req_t *q = ote__shm_msg_reqs(later);
        for (uint32_t k = 0; k < later->in.h.n; k++) {
            if (!fr_passable(&q[k]) || atomic_load(&s->abort) || !fr_start(s, w, later, k, dl))
                return;
        }
    }
}

/* Wait for sl's read (its deadline, and 5 s more); OTE_ERR_TIMEOUT past that (the window
 * is then left to the read: s->frw NULL, an ERROR line). */
static ote_status_t fr_wait(shm_src_t *s, shm_fr_slot_t *sl) {
    shm_frwin_t *w = sl->w;
    ote_deadline_t dl =
        ote_deadline_after((s->tp->cfg.transfer_timeout_ms + 5000) * OTE_NSEC_PER_MSEC);
    ote_mutex_lock(&w->mu);
    while (atomic_load(&sl->state) != FR_ENDED && !ote_deadline_expired(dl))
        (void)ote_cond_wait(&w->cv, &w->mu, dl);
    int ended = atomic_load(&sl->state) == FR_ENDED;
    if (!ended) {
        /* The window is left to its I/O: each write slot's piece gets its outcome now (a
         * write that ended: its status; one still running: TIMEOUT), so that no piece
         * written ahead is written again when its message is served (its slot is not in
         * the next window) and none is answered OK unwritten. */
        for (int k = 0; k < SHM_SRC_FILE_READS; k++) {
            shm_fr_slot_t *o = &w->slot[k];
            int state = atomic_load(&o->state);
            if (state != FR_FREE && o->write)
                ote__shm_set_st(o->m, o->idx, state == FR_ENDED ? o->st : OTE_ERR_TIMEOUT);
        }
    }
    ote_mutex_unlock(&w->mu);
    if (ended) return OTE_OK;
    OTE_ERROR("shm",
              "file I/O for pid %d still runs past its deadline: its bounce buffer and "
              "window are left to it",
              (int)s->pid);
    s->frw = NULL;
    return OTE_ERR_TIMEOUT;
}

/* The synchronous way: one piece through its own bounce. */
static ote_status_t fr_copy_sync(shm_src_t *s, const shm_req_t *q, void *pin, uint8_t *mapped) {
    const ote__host_t *h = &s->tp->host;
    if (q->op == OTE__SLICE_WRITE && ote__shm_in_ring(s, q)) {
        ote_status_t ready = ote__shm_ring_ready(s, q->id);
        if (ready != OTE_OK) return ready;
    }
    uint8_t *buf = NULL;
    void *tok = NULL;
    ote_status_t st =
        h->file.bounce_get(h->file.arg, ote__shm_src_engine_pin(s, pin), q->len, &buf, &tok);
    if (st != OTE_OK) return st;
    if (q->op == OTE__SLICE_READ) st = h->file.bounce_copy(h->file.arg, tok, 0, q->remote, q->len);
    if (st == OTE_OK) st = ote__shm_copy_bytes(s, q, buf, q->local, mapped, q->len);
    if (st == OTE_OK && q->op == OTE__SLICE_WRITE)
        st = h->file.bounce_copy(h->file.arg, tok, 1, q->remote, q->len);
    h->file.bounce_put(h->file.arg, tok);
    return st;
}

/* WRITE piece i of m: its bytes copied into a bounce, then the bounce's write to the
 * file started in a free slot (*st_out OTE_OK: its outcome comes at the settle), or the
 * copy's failure in *st_out. 0 when no slot or bounce is free or the write does not
 * start: the piece goes the synchronous way. */
static int fw_start(shm_src_t *s, shm_frwin_t *w, shm_msg_t *m, uint32_t i, ote_status_t *st_out) {
    const ote__host_t *h = &s->tp->host;
    const shm_req_t *q = &ote__shm_msg_reqs(m)[i];
    shm_fr_slot_t *sl = NULL;
    for (int j = 0; j < SHM_SRC_FILE_READS && sl == NULL; j++)
        if (atomic_load(&w->slot[j].state) == FR_FREE) sl = &w->slot[j];
    if (sl == NULL || h->file.bounce_get(h->file.arg, ote__shm_src_engine_pin(s, m->pin[i]), q->len,
                                         &sl->buf, &sl->tok) != OTE_OK)
        return 0;
    ote_status_t st = ote__shm_in_ring(s, q) ? ote__shm_ring_ready(s, q->id) : OTE_OK;
    if (st == OTE_OK) st = ote__shm_copy_bytes(s, q, sl->buf, q->local, m->sptr[i], q->len);
    if (st != OTE_OK) {
        h->file.bounce_put(h->file.arg, sl->tok);
        *st_out = st;
        return 1;
    }
    sl->m = m;
    sl->idx = i;
    sl->write = 1;
    atomic_store(&sl->state, FR_RUNNING);
    ote_deadline_t dl = ote_deadline_after(s->tp->cfg.transfer_timeout_ms * OTE_NSEC_PER_MSEC);
    if (h->file.bounce_io_start(h->file.arg, sl->tok, 1, q->remote, q->len, dl, fr_done, sl) !=
        OTE_OK) {
        h->file.bounce_put(h->file.arg, sl->tok);
        atomic_store(&sl->state, FR_FREE);
        return 0;
    }
    *st_out = OTE_OK;
    return 1;
}

/* Whether a READ piece of the message being served that is sent from the page cache
 * (m->fmap) meets WRITE piece q (on registration reg) of a later message: its bytes are
 * copied by the copy units after the settle that writes ahead, so that WRITE must wait.
 * A piece on another registration counts too (two may name the same bytes of one file). */
static int fm_conflicts(shm_src_t *s, const void *reg, const shm_req_t *q) {
    if (s->mcount == 0) return 0;
    const shm_msg_t *m = &s->msgs[s->mhead];
    const shm_req_t *e = ote__shm_msg_reqs(m);
    for (uint32_t i = 0; i < m->in.h.n; i++) {
        if (m->fmap[i] == NULL) continue;
        if (ote__shm_src_engine_pin(s, m->pin[i]) != reg) return 1;
        if (q->remote < e[i].remote + e[i].len && e[i].remote < q->remote + q->len) return 1;
    }
    return 0;
}

/* Entry k of a message read after the one being settled, while writing ahead: 1 when the
 * scan may go past it (it moves no file byte, is refused or canceled already, is a READ
 * started ahead, or is a file WRITE now started or failed), 0 where it must stop to keep
 * the order: a notification, a file READ not started, a WRITE that cannot start now (no
 * slot or bounce, its bytes not staged in the ring yet, a running slot or a READ of the
 * served message sent from the page cache in its way). */
static int fw_ahead_one(shm_src_t *s, shm_frwin_t *w, shm_msg_t *m, uint32_t k) {
    const shm_req_t *q = &ote__shm_msg_reqs(m)[k];
    if (q->op == OTE__SLICE_NOTIFY) return 0;
    if (q->op != OTE__SLICE_WRITE && q->op != OTE__SLICE_READ) return 1;
    if (!ote__shm_src_is_file(s, m->pin[k]) || atomic_load(&m->st[k]) != OTE_OK ||
        ote__shm_src_canceled(m->pin[k]) || fr_find(w, m, k) != NULL)
        return 1;
    if (q->op == OTE__SLICE_READ) return 0;
    if (ote__shm_in_ring(s, q) && !ote__shm_ring_staged(s, q->id)) return 0;
    const void *reg = ote__shm_src_engine_pin(s, m->pin[k]);
    if (fr_conflicts(s, w, reg, q, 0) || fm_conflicts(s, reg, q)) return 0;
    ote_status_t st = OTE_OK;
    if (!fw_start(s, w, m, k, &st)) return 0;
    ote__shm_set_st(m, k, st); /* its copy failed: that is its status (nothing written) */
    return 1;
}

/* Whether a write of m still runs in w. */
static int fw_writing(shm_frwin_t *w, const shm_msg_t *m) {
    for (int k = 0; k < SHM_SRC_FILE_READS; k++)
        if (atomic_load(&w->slot[k].state) == FR_RUNNING && w->slot[k].write && w->slot[k].m == m)
            return 1;
    return 0;
}

/* The file WRITE pieces of the messages read after the one being served, in order, until
 * fw_ahead_one stops. */
static void fw_ahead(shm_src_t *s, shm_frwin_t *w) {
    for (uint32_t n = 1; n < s->mcount; n++) {
        shm_msg_t *later = &s->msgs[(s->mhead + n) % SHM_LOOKAHEAD];
        for (uint32_t k = 0; k < later->in.h.n; k++)
            if (atomic_load(&s->abort) || !fw_ahead_one(s, w, later, k)) return;
    }
}

/* Writing ahead, at the settle of the last run of m (the message being served): while
 * m's writes run (at most their deadline), the file WRITE pieces of the messages read
 * after it start (fw_ahead), and what the requester sends meanwhile is read every ms and
 * its writes start too, so that one connection's writes overlap across messages as its
 * reads do. ote__shm_fread_piece finds such a piece started when its message is served,
 * and that message's first run settles it (the scan stops at a notification). */
static void fw_settle_ahead(shm_src_t *s, shm_frwin_t *w, const shm_msg_t *m) {
    if (m != &s->msgs[s->mhead]) return;
    ote_deadline_t dl = ote_deadline_after(s->tp->cfg.transfer_timeout_ms * OTE_NSEC_PER_MSEC);
    while (!atomic_load(&s->abort) && fw_writing(w, m) && !ote_deadline_expired(dl)) {
        fw_ahead(s, w);
        ote_mutex_lock(&w->mu);
        if (fw_writing(w, m)) /* fr_done broadcasts under w->mu: no end is missed */
            (void)ote_cond_wait(&w->cv, &w->mu, ote_deadline_after(OTE_NSEC_PER_MSEC));
        ote_mutex_unlock(&w->mu);
        ote__shm_src_pull_between(s);
    }
}

int ote__shm_fread_mapped(shm_src_t *s, shm_msg_t *m, uint32_t i) {
    const ote__host_t *h = &s->tp->host;
    const shm_req_t *q = &ote__shm_msg_reqs(m)[i];
    if (m->fmap[i] != NULL) return 1; /* chosen already, by reading ahead (fr_start) */
    if (q->op != OTE__SLICE_READ || m->sptr[i] != NULL || ote__shm_in_ring(s, q)) return 0;
    const ote__pin_t *reg = ote__shm_src_engine_pin(s, m->pin[i]);
    shm_frwin_t *w = s->frw;
    if (w != NULL && (fr_find(w, m, i) != NULL || fr_conflicts(s, w, reg, q, 1))) return 0;
    return h->file.map_read(h->file.arg, reg, q->remote, q->len, &m->fmap[i]) == OTE_OK;
}

ote_status_t ote__shm_fread_piece(shm_src_t *s, shm_msg_t *m, uint32_t i, uint32_t b) {
    const ote__host_t *h = &s->tp->host;
    const shm_req_t *q = &ote__shm_msg_reqs(m)[i];
    if (q->op == OTE__SLICE_WRITE) {
        shm_frwin_t *fw = fr_win(s);
        ote_status_t st = OTE_OK;
        if (fw != NULL && fr_find(fw, m, i) != NULL) return OTE_OK; /* written ahead */
        if (fw != NULL && fw_start(s, fw, m, i, &st)) return st;
        return fr_copy_sync(s, q, m->pin[i], m->sptr[i]);
    }
    shm_frwin_t *w = fr_win(s);
    if (w != NULL) fr_fill(s, w, m, i, b);
    if (m->fmap[i] != NULL) return OTE_OK; /* cached meanwhile: the copy units send it */
    shm_fr_slot_t *sl = w != NULL ? fr_find(w, m, i) : NULL;
    if (sl == NULL) return fr_copy_sync(s, q, m->pin[i], m->sptr[i]);
    ote_status_t st = fr_wait(s, sl);
    if (st != OTE_OK) return st;
    st = sl->st;
    if (st == OTE_OK) st = ote__shm_copy_bytes(s, q, sl->buf, q->local, m->sptr[i], q->len);
    h->file.bounce_put(h->file.arg, sl->tok);
    sl->tok = NULL;
    atomic_store(&sl->state, FR_FREE);
    return st;
}

void ote__shm_fread_settle(shm_src_t *s, shm_msg_t *m, uint32_t a, uint32_t b) {
    const ote__host_t *h = &s->tp->host;
    shm_frwin_t *w = s->frw;
    if (w == NULL) return;
    if (m != NULL && b == m->in.h.n) fw_settle_ahead(s, w, m);
    for (int k = 0; k < SHM_SRC_FILE_READS; k++) {
        shm_fr_slot_t *sl = &w->slot[k];
        if (atomic_load(&sl->state) == FR_FREE) continue;
        if (m != NULL && (sl->m != m || sl->idx < a || sl->idx >= b)) continue;
        if (fr_wait(s, sl) != OTE_OK) return; /* the window is left to its I/O */
        /* A WRITE's write ended: its outcome is its piece's, whatever came meanwhile (a
         * CANCEL after the write started finds its bytes moved). A READ's piece was
         * canceled or lost. */
        if (sl->write && m != NULL) atomic_store(&m->st[sl->idx], (int32_t)sl->st);
        sl->write = 0;
        h->file.bounce_put(h->file.arg, sl->tok);
        sl->tok = NULL;
        atomic_store(&sl->state, FR_FREE);
    }
}

void ote__shm_fread_end(shm_src_t *s) {
    ote__shm_fread_settle(s, NULL, 0, 0);
    shm_frwin_t *w = s->frw;
    if (w == NULL) return;
    ote_cond_destroy(&w->cv);
    ote_mutex_destroy(&w->mu);
    ote_free(w);
    s->frw = NULL;
}

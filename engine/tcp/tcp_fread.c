/*
 * engine/tcp/tcp_fread.c - the source's file I/O without waiting (tcp_internal.h,
 * tcp_fread_t): for a READ of a file registration the file owner reads the slice's range
 * into its bounce (host->file.bounce_io_start) while the worker sends earlier responses
 * and starts the reads of later READ frames; for a WRITE whose bytes arrived in a bounce
 * it writes them to the file while the worker receives the next frames. Up to
 * TCP_SRC_FILE_READS of them run per connection; responses still go out in order (the
 * ring stops at the first one whose I/O runs; a WRITE_ACK leaves once its write ended).
 * The I/O's done() runs on the file owner's thread: it only queues it for its worker and
 * wakes it. A connection that dies with I/O running unpins at once and leaves each its
 * bounce; the worker gives it back when it ends, and its teardown waits for them.
 * A READ whose range the page cache holds in full (host->file.map_read, file_zero_copy)
 * takes none of this: its response is sent from the file's mapping like memory.
 */
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "engine/tcp/tcp_internal.h"

/* done() of host->file.bounce_io_start: the file owner's thread. */
static void fread_done(void *arg, ote_status_t st) {
    tcp_fread_t *fr = arg;
    tcp_worker_t *w = fr->w;
    ote_mutex_lock(&w->fmu);
    fr->st = st;
    fr->next = w->fdone;
    w->fdone = fr;
    ote__tcp_worker_wake(w); /* under fmu: the worker's teardown cannot pass it */
    ote_mutex_unlock(&w->fmu);
}

/* The response just queued on c waits for fr's I/O on the bounce tok (its stage now):
 * started here; one that does not start answers with its status. */
static void io_start(tcp_conn_t *c, tcp_fread_t *fr, void *tok, int to_file, uint64_t addr,
                     uint32_t len) {
    tcp_t *tp = c->w->tp;
    const ote__file_ops_t *fo = &tp->host.file;
    tcp_resp_t *r = &c->ring[(c->rhead + c->rcount - 1) % c->rcap];
    r->stage = tok;
    r->stage_file = 1;
    fr->w = c->w;
    fr->c = c;
    fr->write = (uint8_t)(to_file != 0);
    ote_deadline_t dl = ote_deadline_after(tp->cfg.transfer_timeout_ms * OTE_NSEC_PER_MSEC);
    ote_mutex_lock(&c->w->fmu);
    c->w->finflight++;
    ote_mutex_unlock(&c->w->fmu);
    ote_status_t st = fo->bounce_io_start(fo->arg, tok, to_file, addr, len, dl, fread_done, fr);
    if (st != OTE_OK) { /* never started: the response answers the failure */
        ote_mutex_lock(&c->w->fmu);
        c->w->finflight--;
        ote_mutex_unlock(&c->w->fmu);
        fr->st = st;
        fr->state = FREAD_DONE;
    } else {
        c->freads++;
    }
    r->fread = fr;
}

int ote__tcp_fwrite_start(tcp_conn_t *c) {
    const ote__file_ops_t *fo = &c->w->tp->host.file;
    void *tok = c->rx_stage;
    c->rx_stage = NULL;
    c->rx_stage_file = 0;
    /* The slice's pin is dropped only once the write holds the registration in use
     * (bounce_io_start) or the bounce is given back: dropped before, the last unpin could
     * let an unregister free the registration and close its fd under the write. */
    void *pin = c->rx_pin;
    uint32_t len = c->rx_len;
    c->rx_pin = NULL;
    int rc = 0;
    tcp_fread_t *fr = ote_calloc(1, sizeof(*fr));
    if (fr == NULL) {
        fo->bounce_put(fo->arg, tok);
        rc = ote__tcp_src_respond(c, OTE_CTL_WRITE_ACK, c->rx_id, OTE_ERR_NOMEM, NULL, 0, NULL);
    } else if (ote__tcp_src_respond(c, OTE_CTL_WRITE_ACK, c->rx_id, OTE_OK, NULL, 0, NULL) != 0) {
        fo->bounce_put(fo->arg, tok);
        ote_free(fr);
        rc = -1;
    } else {
        if (ote__engine_hooks.tcp_file_write)
            ote__engine_hooks.tcp_file_write(ote__engine_hooks.tcp_file_write_arg);
        io_start(c, fr, tok, 1, c->rx_dev, len);
    }
    if (pin) ote__tcp_src_unpin(c, pin, len);
    return rc;
}

int ote__tcp_fread_start(tcp_conn_t *c, const ote_ctl_msg_t *m, void *pin) {
    tcp_t *tp = c->w->tp;
    const ote__file_ops_t *fo = &tp->host.file;
    const ote__pin_t *epin = ote__tcp_src_engine_pin(c, pin);
    /* Cached in full: sent from the page cache like memory (the pin holds the mapping),
     * behind the responses queued before it. */
    const uint8_t *map = NULL;
    if (fo->map_read(fo->arg, epin, m->u.rw.addr, m->u.rw.len, &map) == OTE_OK) {
        return ote__tcp_src_respond(c, OTE_CTL_READ_RESP, m->req_id, OTE_OK, map, m->u.rw.len, pin);
    }
    uint8_t *buf = NULL;
    void *tok = NULL;
    tcp_fread_t *fr = ote_calloc(1, sizeof(*fr));
    ote_status_t st =
        fr != NULL ? fo->bounce_get(fo->arg, epin, m->u.rw.len, &buf, &tok) : OTE_ERR_NOMEM;
    if (st != OTE_OK) {
        ote_free(fr);
        ote__tcp_src_unpin(c, pin, m->u.rw.len);
        OTE_WARN_LIMITED("tcp", "READ of a file registration at 0x%llx for %s failed: %s",
                         (unsigned long long)m->u.rw.addr, c->from, ote_status_str(st));
        return ote__tcp_src_respond(c, OTE_CTL_READ_RESP, m->req_id, st, NULL, 0, NULL);
    }
    if (ote__tcp_src_respond(c, OTE_CTL_READ_RESP, m->req_id, OTE_OK, buf, m->u.rw.len, pin) != 0) {
        fo->bounce_put(fo->arg, tok); /* the pin went with the failed response */
        ote_free(fr);
        return -1;
    }
    io_start(c, fr, tok, 0, m->u.rw.addr, m->u.rw.len);
    return 0;
}

int ote__tcp_fread_ready(tcp_conn_t *c, tcp_resp_t *r) {
    tcp_fread_t *fr = r->fread;
    if (fr->state != FREAD_DONE) return 0;
    ote_status_t st = fr->withdrawn ? OTE_ERR_CANCELED : fr->st;
    if (st != OTE_OK) { /* answered without data */
        if (!fr->withdrawn)
            OTE_WARN_LIMITED("tcp", "%s of a file registration (id %llu) for %s failed: %s",
                             fr->write ? "WRITE" : "READ", (unsigned long long)r->id, c->from,
                             ote_status_str(st));
        if (r->pin) ote__tcp_src_unpin(c, r->pin, r->len);
        r->pin = NULL;
        ote__tcp_src_stage_put(c, &r->stage, &r->stage_file);
        r->data = NULL;
        r->len = 0;
        ote_ctl_put_hdr(r->hdr, c->version, r->opcode, r->id, st, 0);
    }
    ote_free(fr);
    r->fread = NULL;
    return 1;
}

void ote__tcp_fread_withdraw(tcp_resp_t *r) { r->fread->withdrawn = 1; }

void ote__tcp_fread_drop(tcp_conn_t *c, tcp_resp_t *r) {
    tcp_fread_t *fr = r->fread;
    r->fread = NULL;
    if (fr->state == FREAD_DONE) { /* ended: the caller releases the response as any */
        ote_free(fr);
        return;
    }
    if (r->pin) ote__tcp_src_unpin(c, r->pin, r->len);
    r->pin = NULL;
    fr->tok = r->stage; /* the file owner still writes it: given back when the read ends */
    r->stage = NULL;
    r->stage_file = 0;
    fr->c = NULL;
    c->freads--;
}

/* The ended reads, oldest first, taken off the worker's list. */
static tcp_fread_t *fread_take(tcp_worker_t *w) {
    ote_mutex_lock(&w->fmu);
    tcp_fread_t *l = w->fdone, *rev = NULL;
    w->fdone = NULL;
    for (tcp_fread_t *fr = l; fr != NULL; fr = fr->next) w->finflight--;
    ote_mutex_unlock(&w->fmu);
    while (l != NULL) {
        tcp_fread_t *fr = l;
        l = fr->next;
        fr->next = rev;
        rev = fr;
    }
    return rev;
}

void ote__tcp_fread_drain(tcp_worker_t *w) {
    const ote__file_ops_t *fo = &w->tp->host.file;
    tcp_fread_t *l = fread_take(w);
    while (l != NULL) {
        tcp_fread_t *fr = l;
        l = fr->next;
        fr->next = NULL;
        tcp_conn_t *c = fr->c;
        if (c == NULL) { /* its connection died while it ran */
            fo->bounce_put(fo->arg, fr->tok);
            ote_free(fr);
            continue;
        }
        fr->state = FREAD_DONE;
        c->freads--;
        /* Send what is ready now, and read on if the cap held frames back. A kill in
         * there drops c's other reads, the ones still on l included (they become
         * orphans: c NULL), so l stays safe to walk. */
        if (c->fd >= 0) ote__tcp_src_pump(c);
    }
}

int ote__tcp_fread_settle(tcp_worker_t *w) {
    uint64_t limit = (w->tp->cfg.transfer_timeout_ms + 5000) * OTE_NSEC_PER_MSEC;
    ote_deadline_t dl = ote_deadline_after(limit);
    for (;;) {
        ote__tcp_fread_drain(w);
        ote_mutex_lock(&w->fmu);
        uint32_t left = w->finflight;
        ote_mutex_unlock(&w->fmu);
        if (left == 0) return 0;
        if (ote_deadline_expired(dl)) {
            OTE_ERROR("tcp",
                      "worker %u: %u file read(s) still running %llu ms after its connections "
                      "closed: their bounce buffers and the worker's memory are left",
                      w->idx, left, (unsigned long long)(limit / OTE_NSEC_PER_MSEC));
            return -1;
        }
        (void)poll(NULL, 0, 1);
    }
}

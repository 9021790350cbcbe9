/*
 * engine/tcp/tcp_source.c - the source data path of the TCP transport: it answers the
 * HELLO of an accepted connection, checks every request against the engine's
 * registrations and permissions (host->pin) before touching memory, queues responses
 * (at most TCP_SRC_MAX_RESP; reading pauses at the cap), sends them, and closes a
 * connection that misses its handshake or progress deadline. Worker thread only.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "base/alloc.h"
#include "base/le.h"
#include "base/log.h"
#include "engine/tcp/tcp_internal.h"

static tcp_resp_t *resp_push(tcp_conn_t *c) {
    if (c->rcount == c->rcap) {
        size_t ncap = c->rcap ? c->rcap * 2 : 256;
        tcp_resp_t *nr = ote_malloc(ncap * sizeof(*nr));
        if (nr == NULL) return NULL;
        for (size_t i = 0; i < c->rcount; i++) nr[i] = c->ring[(c->rhead + i) % c->rcap];
        ote_free(c->ring);
        c->ring = nr;
        c->rcap = ncap;
        c->rhead = 0;
    }
    tcp_resp_t *r = &c->ring[(c->rhead + c->rcount) % c->rcap];
    c->rcount++;
    memset(r, 0, sizeof(*r));
    return r;
}

static int src_respond(tcp_conn_t *c, uint16_t opcode, uint64_t id, ote_status_t st,
                       const uint8_t *data, uint32_t len, void *pin) {
    tcp_resp_t *r = resp_push(c);
    if (r == NULL) {
        if (pin) ote__tcp_src_unpin(c, pin, len);
        OTE_ERROR("tcp", "out of memory queueing a response to %s: closing connection", c->from);
        ote__tcp_conn_kill(c, OTE_ERR_NOMEM);
        return -1;
    }
    ote_ctl_put_hdr(r->hdr, c->version, opcode, id, st, len);
    r->hdr_len = OTE_CTL_HDR_LEN;
    r->id = id;
    r->opcode = opcode;
    r->data = data;
    r->len = len;
    r->pin = pin;
    return 0;
}

int ote__tcp_src_respond(tcp_conn_t *c, uint16_t opcode, uint64_t id, ote_status_t st,
                         const uint8_t *data, uint32_t len, void *pin) {
    return src_respond(c, opcode, id, st, data, len, pin);
}

int ote__tcp_src_payload_done(tcp_conn_t *c) {
    if (c->rx_stage != NULL) {
        /* Device memory or a file: the bytes are in the bounce buffer; copy them there. */
        tcp_t *tp = c->w->tp;
        if (c->rx_status == OTE_OK && c->rx_stage_file) {
            return ote__tcp_fwrite_start(c); /* acknowledged once the file has them */
        } else if (c->rx_status == OTE_OK) {
            ote_deadline_t dl = ote_deadline_after(tp->cfg.transfer_timeout_ms * OTE_NSEC_PER_MSEC);
            c->rx_status = tp->host.gpu.stage_copy(tp->host.gpu.arg, c->rx_stage, 1, c->rx_dev,
                                                   (uint32_t)c->rx_len, dl);
        }
        ote__tcp_src_stage_put(c, &c->rx_stage, &c->rx_stage_file);
    }
    if (c->rx_pin) ote__tcp_src_unpin(c, c->rx_pin, c->rx_len);
    c->rx_pin = NULL;
    return src_respond(c, OTE_CTL_WRITE_ACK, c->rx_id, c->rx_status, NULL, 0, NULL);
}

/* Whether the source may take another request from c: not after a refusal that closes
 * the connection, not while TCP_SRC_MAX_RESP responses wait to be sent or
 * TCP_SRC_FILE_READS file reads run, and not while a
 * BUFS answer (up to OTE_CTL_BUFS_MAX_BODY bytes) does: one list per connection is
 * allocated at a time, however many BUFS_REQ a requester sends without reading. */
int ote__tcp_src_may_parse(const tcp_conn_t *c) {
    return !c->closing && c->rcount < TCP_SRC_MAX_RESP && c->bufs_queued == 0 &&
           c->freads < TCP_SRC_FILE_READS;
}

static void src_write(tcp_conn_t *c) {
    struct iovec *iov = c->w->iov;
    while (c->rcount > 0 && c->fd >= 0) {
        int n = 0;
        size_t off = c->rtx_off;
        for (size_t i = 0; i < c->rcount && n < TCP_IOV - 1; i++) {
            tcp_resp_t *r = &c->ring[(c->rhead + i) % c->rcap];
            if (r->fread != NULL && !ote__tcp_fread_ready(c, r)) break; /* in order */
            if (off < r->hdr_len) {
                iov[n].iov_base = r->hdr + off;
                iov[n++].iov_len = r->hdr_len - off;
                if (r->len) {
                    iov[n].iov_base = (void *)r->data;
                    iov[n++].iov_len = r->len;
                }
            } else {
                iov[n].iov_base = (void *)(r->data + (off - r->hdr_len));
                iov[n++].iov_len = r->len - (off - r->hdr_len);
            }
            off = 0;
        }
        if (n == 0) break; /* the oldest waits for its file read */
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t rc = sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (rc < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                ote__tcp_want_out(c, 1);
                return;
            }
            int err = errno;
            if (err == EFAULT) { /* only a file mapping's pages can go (file_map.c) */
                OTE_WARN_LIMITED("tcp",
                                 "send to %s failed: a READ's bytes could not be read from a "
                                 "file registration's page cache (the file truncated under "
                                 "it, or an I/O error reading it back): closing the connection",
                                 c->from);
            } else {
                OTE_DEBUG("tcp", "send to %s failed: %s", c->from, strerror(err));
            }
            ote__tcp_conn_kill(c, ote_status_make(OTE_ERR_PEER_LOST, err));
            return;
        }
        c->progress++;
        size_t left = (size_t)rc;
        while (left > 0 && c->rcount > 0) {
            tcp_resp_t *r = &c->ring[c->rhead];
            size_t rem = r->hdr_len + r->len - c->rtx_off;
            if (left >= rem) {
                left -= rem;
                c->rtx_off = 0;
                if (r->pin) ote__tcp_src_unpin(c, r->pin, r->len);
                r->pin = NULL;
                ote__tcp_src_stage_put(c, &r->stage, &r->stage_file);
                if (r->owned) {
                    ote_free((void *)r->data);
                    c->bufs_queued--;
                }
                r->owned = 0;
                int close_after = r->close_after;
                c->rhead = (c->rhead + 1) % c->rcap;
                c->rcount--;
                if (close_after) {
                    ote__tcp_conn_kill(c, OTE_ERR_VERSION);
                    return;
                }
            } else {
                c->rtx_off += left;
                left = 0;
            }
        }
    }
    ote__tcp_want_out(c, 0);
}

/* Answer the HELLO the engine's listener read, checked and (with a key) authenticated:
 * ote__tcp_adopt puts it first in rxbuf, and the listener hands over only a HELLO whose
 * versions meet this engine's (it answers a mismatch, ERROR VERSION, itself). So the two
 * refusals below cannot happen; they stay as defensive checks that close without an
 * answer (an ERROR line: the listener broke its contract). */
static int src_hello(tcp_conn_t *c, const ote_ctl_msg_t *m) {
    uint16_t ver = 0;
    if (m->opcode != OTE_CTL_HELLO ||
        ote_ctl_negotiate(m, OTE_CTL_VERSION_MIN, OTE_CTL_VERSION_MAX, &ver) != OTE_OK) {
        OTE_LOG_LIMITED(OTE_LOG_ERROR, "tcp",
                        "adopted connection from %s: its first frame is no usable HELLO (%s): "
                        "closing",
                        c->from, ote_ctl_opcode_str(m->opcode));
        ote__tcp_conn_kill(c, OTE_ERR_PROTOCOL);
        return -1;
    }
    size_t al = m->u.hello.addr_len;
    memcpy(c->from, m->u.hello.addr, al);
    c->from[al] = '\0';
    memcpy(c->from_name, m->u.hello.name != NULL ? m->u.hello.name : "", m->u.hello.name_len);
    c->from_name[m->u.hello.name_len] = '\0'; /* <= OTE_CTL_MAX_NAME (decoded) */
    ote_ctl_msg_t out;
    memset(&out, 0, sizeof(out));
    tcp_t *tp = c->w->tp;
    if (ver >= 2 && ote__tcp_src_sess_join(c, m->u.hello.session) != OTE_OK) {
        OTE_ERROR("tcp", "out of memory for the session of %s: closing connection", c->from);
        ote__tcp_conn_kill(c, OTE_ERR_NOMEM);
        return -1;
    }
    c->version = ver;
    c->handshaken = 1;
    out.version = ver;
    out.opcode = OTE_CTL_HELLO_ACK;
    out.req_id = m->req_id;
    out.u.hello_ack.version = ver;
    out.u.hello_ack.max_data = OTE_CTL_MAX_DATA;
    out.u.hello_ack.addr = tp->addr;
    out.u.hello_ack.addr_len = (uint32_t)strlen(tp->addr);
    /* The engine's advertisement (transports, host identity) for its router. */
    size_t il = tp->host.info ? strlen(tp->host.info) : 0;
    out.u.hello_ack.info = tp->host.info;
    out.u.hello_ack.info_len = (uint16_t)(il > OTE_CTL_MAX_INFO ? 0 : il);
    size_t len = 0;
    if (ote_ctl_encode(&out, c->hsbuf, sizeof(c->hsbuf), &len) != OTE_OK) {
        ote__tcp_conn_kill(c, OTE_ERR_PROTOCOL);
        return -1;
    }
    tcp_resp_t *r = resp_push(c);
    if (r == NULL) {
        ote__tcp_conn_kill(c, OTE_ERR_NOMEM);
        return -1;
    }
    r->hdr_len = 0;
    r->data = c->hsbuf;
    r->len = (uint32_t)len;
    r->close_after = 0;
    uint8_t *nb = ote_malloc(TCP_RXBUF);
    if (nb == NULL) {
        OTE_ERROR("tcp", "out of memory for the receive buffer of %s: closing connection", c->from);
        ote__tcp_conn_kill(c, OTE_ERR_NOMEM);
        return -1;
    }
    size_t rem = c->rx_end - c->rx_start;
    if (rem) memcpy(nb, c->rxbuf + c->rx_start, rem);
    ote_free(c->rxbuf);
    c->rxbuf = nb;
    c->rxcap = TCP_RXBUF;
    c->rx_start = 0;
    c->rx_end = rem;
    return 0;
}

/* CANCEL: every listed READ whose answer waits in the ring and has not begun to go out
 * is answered READ_RESP CANCELED without data instead, and its pin is dropped now. Ids
 * already answered (or unknown) are ignored: the requester learns from the answer. */
static void src_withdraw(tcp_conn_t *c, const ote_ctl_msg_t *m) {
    size_t first = c->rtx_off > 0 ? 1 : 0, n = 0;
    for (uint32_t k = 0; k < m->u.cancel.count; k++) {
        uint64_t id = ote_le_get64(m->u.cancel.ids + 8 * (size_t)k);
        for (size_t i = first; i < c->rcount; i++) {
            tcp_resp_t *r = &c->ring[(c->rhead + i) % c->rcap];
            if (r->id != id || r->opcode != OTE_CTL_READ_RESP || r->data == NULL) continue;
            if (r->fread != NULL) { /* its bounce stays until the read ends */
                if (!r->fread->withdrawn) n++;
                ote__tcp_fread_withdraw(r);
                break;
            }
            if (r->pin) ote__tcp_src_unpin(c, r->pin, r->len);
            r->pin = NULL;
            ote__tcp_src_stage_put(c, &r->stage, &r->stage_file);
            r->data = NULL;
            r->len = 0;
            ote_ctl_put_hdr(r->hdr, c->version, OTE_CTL_READ_RESP, id, OTE_ERR_CANCELED, 0);
            n++;
            break;
        }
    }
    for (uint32_t k = 0; k < m->u.cancel.nwd; k++) {
        const uint8_t *w = m->u.cancel.wd + 24 * (size_t)k;
        ote__tcp_src_write_off(c, ote_le_get64(w), ote_le_get64(w + 8), ote_le_get64(w + 16));
    }
    OTE_DEBUG("tcp", "requester %s withdrew %zu of %u READ(s), wrote off %u request(s)", c->from, n,
              m->u.cancel.count, m->u.cancel.nwd);
}

/* One refused request logs once (on its first slice: the one at its start, or the
 * first that arrives), and refusals in a burst are rate-limited with a count. */
static void src_refused(tcp_conn_t *c, const char *op, const ote_ctl_msg_t *m, ote_status_t st) {
    if (m->u.rw.addr != m->u.rw.req_addr && c->last_refused_req == m->u.rw.req_addr) return;
    c->last_refused_req = m->u.rw.req_addr;
    OTE_WARN_LIMITED("tcp", "refused %s request of %llu bytes at 0x%llx from %s: %s", op,
                     (unsigned long long)m->u.rw.req_len, (unsigned long long)m->u.rw.req_addr,
                     c->from, ote_status_str(st));
}

/* BUFS_REQ (buffer discovery): the engine's list as a whole frame owned by the response. */
static int src_buffers(tcp_conn_t *c, uint64_t id) {
    tcp_t *tp = c->w->tp;
    uint8_t *frame = NULL;
    size_t len = 0;
    ote_status_t st = tp->host.buffers != NULL
                          ? tp->host.buffers(tp->host.arg, c->version, id, &frame, &len)
                          : OTE_ERR_REMOTE;
    if (st != OTE_OK || len > UINT32_MAX) {
        ote_free(frame);
        return src_respond(c, OTE_CTL_BUFS, id, OTE_ERR_AGAIN, NULL, 0, NULL);
    }
    tcp_resp_t *r = resp_push(c);
    if (r == NULL) {
        ote_free(frame);
        OTE_ERROR("tcp", "out of memory queueing a response to %s: closing connection", c->from);
        ote__tcp_conn_kill(c, OTE_ERR_NOMEM);
        return -1;
    }
    r->hdr_len = 0; /* the frame carries its own header */
    r->id = id;
    r->opcode = OTE_CTL_BUFS;
    r->data = frame;
    r->len = (uint32_t)len;
    r->owned = 1;
    c->bufs_queued++;
    return 0;
}

/* Whether the registration behind pin is a file registration (moved through host->file). */
static int src_is_file(tcp_conn_t *c, void *pin) {
    return ote__pin_kind(ote__tcp_src_engine_pin(c, pin)) == OTE_MEM_FILE;
}

/* Whether the registration behind pin is not host memory: device memory (moved through
 * host->gpu) or a file registration (host->file); either goes through a bounce buffer. */
static int src_is_device(tcp_conn_t *c, void *pin) {
    return OTE_MEM_IS_CUDA(ote__pin_kind(ote__tcp_src_engine_pin(c, pin))) || src_is_file(c, pin);
}

static ote_status_t src_stage_get(tcp_conn_t *c, void *pin, uint32_t len, uint8_t **buf_out,
                                  void **tok_out) {
    tcp_t *tp = c->w->tp;
    ote_deadline_t dl = ote_deadline_after(tp->cfg.transfer_timeout_ms * OTE_NSEC_PER_MSEC);
    return tp->host.gpu.stage_get(tp->host.gpu.arg, ote__tcp_src_engine_pin(c, pin), len, dl,
                                  buf_out, tok_out);
}

/* READ of device memory: its bytes are copied into a bounce buffer (synchronously, on
 * this worker) that the response sends; a failure answers the slice with its status.
 * (A file registration's READ reads without waiting: ote__tcp_fread_start.) */
static int src_read_device(tcp_conn_t *c, const ote_ctl_msg_t *m, void *pin) {
    tcp_t *tp = c->w->tp;
    uint8_t *buf = NULL;
    void *tok = NULL;
    uint8_t file = 0;
    ote_status_t st = src_stage_get(c, pin, m->u.rw.len, &buf, &tok);
    if (st == OTE_OK) {
        ote_deadline_t dl = ote_deadline_after(tp->cfg.transfer_timeout_ms * OTE_NSEC_PER_MSEC);
        st = tp->host.gpu.stage_copy(tp->host.gpu.arg, tok, 0, m->u.rw.addr, m->u.rw.len, dl);
    }
    if (st != OTE_OK) {
        ote__tcp_src_stage_put(c, &tok, &file);
        ote__tcp_src_unpin(c, pin, m->u.rw.len);
        OTE_WARN_LIMITED("tcp", "READ of device memory at 0x%llx for %s failed: %s",
                         (unsigned long long)m->u.rw.addr, c->from, ote_status_str(st));
        return src_respond(c, OTE_CTL_READ_RESP, m->req_id, st, NULL, 0, NULL);
    }
    if (src_respond(c, OTE_CTL_READ_RESP, m->req_id, OTE_OK, buf, m->u.rw.len, pin) != 0) {
        ote__tcp_src_stage_put(c, &tok, &file);
        return -1;
    }
    tcp_resp_t *r = &c->ring[(c->rhead + c->rcount - 1) % c->rcap];
    r->stage = tok;
    r->stage_file = 0;
    return 0;
}

int ote__tcp_src_frame(tcp_conn_t *c, const ote_ctl_msg_t *m) {
    tcp_t *tp = c->w->tp;
    if (!c->handshaken) return src_hello(c, m);
    if (m->version != c->version) {
        OTE_WARN_LIMITED("control",
                         "frame with version %u on a version-%u connection from %s: closing",
                         m->version, c->version, c->from);
        ote__tcp_conn_kill(c, OTE_ERR_PROTOCOL);
        return -1;
    }
    void *pin = NULL;
    ote_status_t st;
    switch (m->opcode) {
        case OTE_CTL_WRITE_REQ:
            /* The whole request (its extent; the decoder checked that the slice lies
             * inside it) is checked and pinned, so a request partly outside a
             * registration is refused on every slice and moves no byte. */
            st = ote__tcp_src_pin(c, m, OTE_PERM_WRITE, &pin);
            c->rx_id = m->req_id;
            c->rx_len = m->u.rw.len;
            c->rx_left = m->u.rw.len;
            c->last_large = m->u.rw.len >= TCP_DIRECT_MIN;
            if (st == OTE_OK && src_is_device(c, pin)) {
                /* Device memory: receive into a bounce buffer, copied to the device
                 * when the payload is complete. */
                c->rx_stage_file = (uint8_t)src_is_file(c, pin);
                st = c->rx_stage_file
                         ? tp->host.file.bounce_get(tp->host.file.arg,
                                                    ote__tcp_src_engine_pin(c, pin), m->u.rw.len,
                                                    &c->rx_dst, &c->rx_stage)
                         : src_stage_get(c, pin, m->u.rw.len, &c->rx_dst, &c->rx_stage);
                if (st != OTE_OK) c->rx_stage_file = 0;
                c->rx_dev = m->u.rw.addr;
                if (st != OTE_OK) {
                    ote__tcp_src_unpin(c, pin, m->u.rw.len);
                    pin = NULL;
                }
            } else if (st == OTE_OK) {
                c->rx_dst = (uint8_t *)(uintptr_t)m->u.rw.addr;
            }
            if (st == OTE_OK) {
                c->rx_state = RX_DATA;
                c->rx_pin = pin;
                c->rx_status = OTE_OK;
            } else {
                src_refused(c, "WRITE", m, st);
                c->rx_state = RX_DISCARD;
                c->rx_status = st;
            }
            return 0;
        case OTE_CTL_READ_REQ:
            c->last_large = 0;
            st = ote__tcp_src_pin(c, m, OTE_PERM_READ, &pin);
            if (st != OTE_OK) {
                src_refused(c, "READ", m, st);
                return src_respond(c, OTE_CTL_READ_RESP, m->req_id, st, NULL, 0, NULL);
            }
            if (src_is_file(c, pin)) return ote__tcp_fread_start(c, m, pin);
            if (src_is_device(c, pin)) return src_read_device(c, m, pin);
            return src_respond(c, OTE_CTL_READ_RESP, m->req_id, OTE_OK,
                               (const uint8_t *)(uintptr_t)m->u.rw.addr, m->u.rw.len, pin);
        case OTE_CTL_CANCEL:
            c->last_large = 0;
            src_withdraw(c, m);
            return 0;
        case OTE_CTL_NOTIFY:
            c->last_large = 0;
            st = tp->host.deliver_notify(tp->host.arg, c->from, c->from_name, m->u.notify.msg,
                                         m->u.notify.len);
            return src_respond(c, OTE_CTL_NOTIFY_ACK, m->req_id, st, NULL, 0, NULL);
        case OTE_CTL_BUFS_REQ: c->last_large = 0; return src_buffers(c, m->req_id);
        default:
            if (m->opcode == OTE_CTL_ERROR && ote_status_code(m->status) == OTE_ERR_AUTH)
                OTE_WARN_LIMITED("control", "requester %s refused this engine: %.*s", c->from,
                                 (int)m->u.error.text_len, m->u.error.text);
            else
                OTE_WARN_LIMITED("control", "unexpected %s from requester %s: closing",
                                 ote_ctl_opcode_str(m->opcode), c->from);
            ote__tcp_conn_kill(c, OTE_ERR_PROTOCOL);
            return -1;
    }
}

/* Source: stop reading c (its buffered frames stay for src_resume). */
void ote__tcp_src_pause(tcp_conn_t *c) {
    if (c->rx_paused) return;
    c->rx_paused = 1;
    ote__tcp_conn_events(c);
}

/* Source: send queued responses; once below the cap again, take the frames that waited
 * in the buffer and read on, then send what they produced, until nothing moves. */
void ote__tcp_src_pump(tcp_conn_t *c) {
    for (;;) {
        src_write(c);
        if (c->fd < 0 || !c->rx_paused || !ote__tcp_src_may_parse(c)) return;
        c->rx_paused = 0;
        ote__tcp_conn_events(c);
        size_t before = c->rcount;
        ote__tcp_conn_read(c);
        if (c->fd < 0 || c->rcount == 0 || (c->rcount == before && !c->rx_paused)) return;
    }
}

/* Deadlines of a source connection: the handshake within handshake_timeout_ms (at most
 * connect_timeout_ms: ote__cfg_handshake_ms); while it
 * owes responses, is receiving a payload or holds part of a frame, progress (bytes in or
 * out) at least every transfer_timeout_ms. Closing it unpins what it held. Time the oldest
 * response waits for this source's own file I/O is not the requester's stall: that I/O
 * ends by its own deadline (tcp_fread.c), and its response then goes out. */
void ote__tcp_src_tick(tcp_conn_t *c, uint64_t now) {
    tcp_t *tp = c->w->tp;
    if (!c->handshaken) {
        uint64_t limit = ote__cfg_handshake_ms(&tp->cfg) * OTE_NSEC_PER_MSEC;
        if (now - c->born_ns >= limit) {
            OTE_WARN_LIMITED(
                "tcp", "connection from %s did not complete its handshake within %llu ms: closing",
                c->from, (unsigned long long)ote__cfg_handshake_ms(&tp->cfg));
            ote__tcp_conn_kill(c, OTE_ERR_TIMEOUT);
        }
        return;
    }
    int owes = c->rcount > 0 || c->rx_state != RX_HDR || c->rx_end > c->rx_start;
    const tcp_resp_t *head = c->rcount > 0 ? &c->ring[c->rhead] : NULL;
    int own_io = head != NULL && head->fread != NULL && head->fread->state != FREAD_DONE;
    if (!owes || own_io || c->progress != c->progress_seen) {
        c->progress_seen = c->progress;
        c->progress_ns = now;
        return;
    }
    if (now - c->progress_ns >= tp->cfg.transfer_timeout_ms * OTE_NSEC_PER_MSEC) {
        OTE_WARN_LIMITED(
            "tcp",
            "requester %s made no progress for %llu ms (%zu response(s) queued%s): closing "
            "its connection and releasing its registrations",
            c->from, (unsigned long long)tp->cfg.transfer_timeout_ms, c->rcount,
            c->rx_state != RX_HDR ? ", a payload pending" : "");
        ote__tcp_conn_kill(c, OTE_ERR_TIMEOUT);
    }
}

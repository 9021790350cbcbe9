/*
 * engine/discover.c - buffer discovery, the requester side: ote_segment_buffers asks the
 * segment's peer for its registrations on a short connection to the peer's listener
 * (the router's handshake with the role INFO, then one BUFS_REQ answered by one BUFS
 * frame: engine/control/ctl.h), whatever transport the segment moves its data on. The
 * source side is host->buffers (registry.c), answered by the listening transport.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/le.h"
#include "base/log.h"
#include "engine/control/ctl.h"
#include "engine/control/sock.h"
#include "engine/core_internal.h"
#include "engine/registry_internal.h"
#include "engine/router_internal.h"

#define DISCOVER_REQ_ID 1u

/* After the handshake on fd: send BUFS_REQ and receive the BUFS frame into *frame_out
 * (an allocation; the caller frees it) decoded into *m. */
static ote_status_t ask_buffers(int fd, uint16_t ver, ote_deadline_t dl, uint8_t **frame_out,
                                ote_ctl_msg_t *m) {
    uint8_t hdr[OTE_CTL_HDR_LEN];
    ote_ctl_put_hdr(hdr, ver, OTE_CTL_BUFS_REQ, DISCOVER_REQ_ID, OTE_OK, 0);
    ote_status_t st = ote_ctl_send_all(fd, hdr, sizeof(hdr), dl);
    if (st == OTE_OK) st = ote_ctl_recv_all(fd, hdr, sizeof(hdr), dl);
    if (st != OTE_OK) return st;
    uint32_t body = ote_le_get32(hdr + 20);
    if (ote_le_get16(hdr + 6) != OTE_CTL_BUFS || body > OTE_CTL_BUFS_MAX_BODY)
        return OTE_ERR_PROTOCOL;
    uint8_t *f = ote_malloc(OTE_CTL_HDR_LEN + (size_t)body);
    if (f == NULL) return OTE_ERR_NOMEM;
    memcpy(f, hdr, sizeof(hdr));
    st = ote_ctl_recv_all(fd, f + OTE_CTL_HDR_LEN, body, dl);
    size_t used = 0;
    if (st == OTE_OK) {
        st = ote_ctl_decode(f, OTE_CTL_HDR_LEN + (size_t)body, m, &used);
        if (st == OTE_OK && (m->version != ver || m->req_id != DISCOVER_REQ_ID ||
                             used != OTE_CTL_HDR_LEN + (size_t)body))
            st = OTE_ERR_PROTOCOL;
        else if (st != OTE_OK) st = OTE_ERR_PROTOCOL;
    }
    if (st == OTE_OK && m->status != OTE_OK) st = ote_ctl_peer_status(OTE_CTL_BUFS, m->status);
    if (st != OTE_OK) {
        ote_free(f);
        return st;
    }
    *frame_out = f;
    return OTE_OK;
}

/* The decoded list into out (cap entries); *count_out = entries listed. */
/* A decoded entry (a BUFS frame's or a metadata blob's) as the API lists it. */
static ote_buffer_info_t buf_info(const ote_ctl_buf_t *b) {
    ote_buffer_info_t r;
    memset(&r, 0, sizeof(r));
    memcpy(r.name, b->name, sizeof(r.name)); /* NUL-terminated: the decoder checked */
    r.addr = b->addr;
    r.length = b->len;
    r.perms = b->perms;
    r.kind = b->kind;
    r.numa_node = -1; /* the peer's own business */
    return r;
}

static ote_status_t copy_out(const ote_ctl_msg_t *m, ote_buffer_info_t *out, size_t cap,
                             size_t *count_out) {
    uint32_t n = m->u.bufs.count;
    if (n > cap) {
        *count_out = n;
        return OTE_ERR_TOO_BIG;
    }
    for (uint32_t i = 0; i < n; i++) {
        ote_ctl_buf_t b;
        if (ote_ctl_buf_get(m, i, &b) != OTE_OK) return OTE_ERR_PROTOCOL; /* checked: never */
        out[i] = buf_info(&b);
    }
    *count_out = n;
    return OTE_OK;
}

ote_status_t ote_segment_buffers(ote_segment_t *seg, ote_buffer_info_t *out, size_t cap,
                                 size_t *count_out) {
    if (seg == NULL || count_out == NULL || (out == NULL && cap > 0)) return OTE_ERR_INVALID;
    ote_engine_t *e = seg->e;
    ote_deadline_t dl = ote_deadline_after(e->cfg.connect_timeout_ms * OTE_NSEC_PER_MSEC);
    char *info = ote_malloc(OTE_CTL_MAX_INFO + 1);
    if (info == NULL) return OTE_ERR_NOMEM;
    int fd = -1;
    uint16_t ver = 0;
    ote_status_t st = ote__router_hello(e, seg->name, dl, &fd, &ver, info, OTE_CTL_MAX_INFO + 1);
    char flag[8];
    if (st == OTE_OK && (ote_ctl_info_get(info, "buffers", flag, sizeof(flag)) != OTE_OK ||
                         strcmp(flag, "1") != 0)) {
        OTE_WARN("engine", "segment %s: the peer does not publish its registrations", seg->name);
        st = OTE_ERR_UNSUPPORTED;
    }
    ote_free(info);
    uint8_t *frame = NULL;
    ote_ctl_msg_t m;
    memset(&m, 0, sizeof(m));
    if (st == OTE_OK) st = ask_buffers(fd, ver, dl, &frame, &m);
    if (fd >= 0) close(fd);
    if (st == OTE_OK) {
        size_t n = 0;
        st = copy_out(&m, out, cap, &n);
        if (st == OTE_OK || st == OTE_ERR_TOO_BIG) *count_out = n;
    } else if (st != OTE_ERR_UNSUPPORTED) {
        OTE_WARN("engine", "segment %s: listing the peer's registrations failed: %s", seg->name,
                 ote_status_str(st));
    }
    ote_free(frame);
    return st;
}

/* ---- metadata blobs (ote_engine_metadata) -------------------------------------------- */

ote_status_t ote_engine_metadata(ote_engine_t *e, void *buf, size_t cap, size_t *len_out) {
    if (e == NULL || len_out == NULL || (buf == NULL && cap > 0)) return OTE_ERR_INVALID;
    if (OTE__ENGINE_GONE(e)) return OTE_ERR_STATE;
    ote_ctl_buf_t *bufs = NULL;
    size_t n = 0, total = 0, len = 0;
    ote_status_t st = ote__reg_entries(e, 1, &bufs, &n, &total);
    if (st == OTE_OK && total > n)
        OTE_WARN_LIMITED("engine", "metadata blob: listing %zu of %zu registrations (at most %u)",
                         n, total, OTE_CTL_BUFS_MAX);
    if (st == OTE_OK)
        st = ote_ctl_md_encode(e->self_addr, e->cfg.engine_name, e->epoch, bufs, (uint32_t)n, buf,
                               cap, &len);
    ote_free(bufs);
    if (st == OTE_OK || ote_status_code(st) == OTE_ERR_TOO_BIG) *len_out = len;
    return st;
}

ote_status_t ote_engine_metadata_buffers(const void *md, size_t len, ote_buffer_info_t *out,
                                         size_t cap, size_t *count_out) {
    if (md == NULL || count_out == NULL || (out == NULL && cap > 0)) return OTE_ERR_INVALID;
    ote_ctl_md_t m;
    if (ote_ctl_md_decode(md, len, &m) != OTE_OK) return OTE_ERR_PROTOCOL;
    if (m.count > cap) {
        *count_out = m.count;
        return OTE_ERR_TOO_BIG;
    }
    for (uint32_t i = 0; i < m.count; i++) {
        ote_ctl_buf_t b;
        if (ote_ctl_md_buf(&m, i, &b) != OTE_OK) return OTE_ERR_PROTOCOL; /* checked: never */
        out[i] = buf_info(&b);
    }
    *count_out = m.count;
    return OTE_OK;
}

ote_status_t ote_segment_open_md(ote_engine_t *e, const void *md, size_t len,
                                 ote_segment_t **seg_out) {
    if (e == NULL || md == NULL || seg_out == NULL) return OTE_ERR_INVALID;
    ote_ctl_md_t m;
    if (ote_ctl_md_decode(md, len, &m) != OTE_OK) {
        OTE_WARN("engine", "segment_open_md: a malformed metadata blob (%zu bytes)", len);
        return OTE_ERR_PROTOCOL;
    }
    ote_segment_t *seg = NULL;
    ote_status_t st = ote_segment_open(e, m.addr, &seg);
    if (st != OTE_OK) return st;
    /* The blob names one incarnation: an engine restarted at that address since is
     * another, and its old buffers mean nothing there. */
    char info[sizeof(e->info)];
    st = ote__router_query_info(e, m.addr, info, sizeof(info));
    uint64_t inc = st == OTE_OK ? ote_ctl_info_incarnation(info) : 0;
    if (st == OTE_OK && inc != m.epoch) {
        OTE_WARN("engine",
                 "segment_open_md %s: the engine there is another incarnation (epoch %016llx, "
                 "the metadata's %016llx): refused",
                 m.addr, (unsigned long long)inc, (unsigned long long)m.epoch);
        st = OTE_ERR_STATE;
    }
    if (st != OTE_OK) {
        (void)ote_segment_close(seg);
        return st;
    }
    *seg_out = seg;
    return OTE_OK;
}

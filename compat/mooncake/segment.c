/*
 * compat/mooncake/segment.c - segment ids: openSegment's table of OrbitTE segments. Slot
 * 0 is LOCAL_SEGMENT (this engine, opened on first use); the others are peers by name.
 * An open (a handshake) runs without the mutex: two threads opening one name may both
 * connect, and the second to finish closes its own segment and takes the first's id.
 */
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "compat/mooncake/compat_internal.h"

/* The slot of name, or -1. Called with mu held. */
static int32_t seg_find(mc_engine_t *e, const char *name) {
    for (size_t i = 0; i < e->nsegs; i++)
        if (e->segs[i].name != NULL && strcmp(e->segs[i].name, name) == 0) return (int32_t)i;
    return -1;
}

/* A new slot (or slot 0 for the local segment) for seg under name. Called with mu held. */
static int32_t seg_insert(mc_engine_t *e, const char *name, ote_segment_t *seg, int local) {
    if (e->nsegs == 0) e->nsegs = 1; /* slot 0 is always LOCAL_SEGMENT's */
    size_t slot = local ? 0 : e->nsegs;
    if (slot >= e->segcap) {
        size_t cap = e->segcap ? e->segcap * 2 : 16;
        if (cap > INT32_MAX) return -1;
        mc_seg_t *n = ote_realloc(e->segs, cap * sizeof *n);
        if (n == NULL) return -1;
        memset(n + e->segcap, 0, (cap - e->segcap) * sizeof *n);
        e->segs = n;
        e->segcap = cap;
    }
    char *copy = ote_strdup(name);
    if (copy == NULL) return -1;
    e->segs[slot] = (mc_seg_t){.name = copy, .seg = seg};
    if (!local) e->nsegs++;
    return (int32_t)slot;
}

/* Whether name is this engine's own address (what getLocalIpAndPort gives). */
static int is_local(mc_engine_t *e, const char *name) { return strcmp(name, e->address) == 0; }

/* Open name (or return its id if open): the id, or -1 with the reason logged. */
static int32_t seg_open(mc_engine_t *e, const char *fn, const char *segment_name) {
    while (segment_name != NULL && segment_name[0] == '/') segment_name++;
    if (segment_name == NULL || segment_name[0] == '\0') {
        OTE_ERROR(MC_LOG, "%s: empty segment name", fn);
        return -1;
    }
    ote_engine_t *ote = ote__mc_ote(e, fn);
    if (ote == NULL) return -1;
    int local = is_local(e, segment_name);
    const char *name = local ? e->address : segment_name;
    ote_mutex_lock(&e->mu);
    int32_t id = seg_find(e, name);
    ote_mutex_unlock(&e->mu);
    if (id >= 0) return id;
    ote_segment_t *seg = NULL;
    ote_status_t st = ote_segment_open(ote, name, &seg); /* the handshake, without mu */
    if (st != OTE_OK) {
        OTE_ERROR(MC_LOG, "%s(%s): %s", fn, name, ote_status_str(st));
        return -1;
    }
    ote_mutex_lock(&e->mu);
    id = seg_find(e, name);
    int raced = id >= 0;
    if (!raced) id = seg_insert(e, name, seg, local);
    ote_mutex_unlock(&e->mu);
    if (raced || id < 0) (void)ote_segment_close(seg); /* nothing submitted on it */
    if (id < 0) OTE_ERROR(MC_LOG, "%s(%s): out of memory", fn, name);
    return id;
}

segment_id_t openSegment(transfer_engine_t engine, const char *segment_name) {
    mc_engine_t *e = ote__mc_engine(engine, "openSegment");
    return e == NULL ? -1 : seg_open(e, "openSegment", segment_name);
}

segment_id_t openSegmentNoCache(transfer_engine_t engine, const char *segment_name) {
    mc_engine_t *e = ote__mc_engine(engine, "openSegmentNoCache");
    return e == NULL ? -1 : seg_open(e, "openSegmentNoCache", segment_name);
}

int warmupEfaSegment(transfer_engine_t engine, const char *segment_name) {
    mc_engine_t *e = ote__mc_engine(engine, "warmupEfaSegment");
    if (e == NULL) return OTE_MC_ERR_INVALID_ARGUMENT;
    return seg_open(e, "warmupEfaSegment", segment_name) >= 0 ? 0 : OTE_MC_ERR_INVALID_ARGUMENT;
}

/* The segment of id for a call that uses it without mu: OTE_OK with a use count taken
 * (drop it with ote__mc_seg_put), OTE_ERR_NOT_FOUND for an id not open (or closing).
 * LOCAL_SEGMENT is opened here on its first use. */
ote_status_t ote__mc_seg_get(mc_engine_t *e, int32_t id, ote_segment_t **seg_out) {
    if (id == LOCAL_SEGMENT) {
        ote_mutex_lock(&e->mu);
        int open = e->segcap > 0 && e->segs[0].name != NULL;
        ote_mutex_unlock(&e->mu);
        if (!open && seg_open(e, "LOCAL_SEGMENT", e->address) != LOCAL_SEGMENT)
            return OTE_ERR_NOT_FOUND;
    }
    ote_status_t st = OTE_ERR_NOT_FOUND;
    ote_mutex_lock(&e->mu);
    if (id >= 0 && (size_t)id < e->nsegs && e->segs[id].name != NULL && !e->segs[id].closing) {
        e->segs[id].users++;
        *seg_out = e->segs[id].seg;
        st = OTE_OK;
    }
    ote_mutex_unlock(&e->mu);
    return st;
}

void ote__mc_seg_put(mc_engine_t *e, int32_t id) {
    ote_mutex_lock(&e->mu);
    e->segs[id].users--;
    ote_mutex_unlock(&e->mu);
}

/* Close slot id: OTE_OK (the slot is free), OTE_ERR_NOT_FOUND, or OTE_ERR_BUSY (a call
 * uses it now, or a batch has requests pending on it: it stays open). */
static ote_status_t seg_close(mc_engine_t *e, int32_t id) {
    ote_mutex_lock(&e->mu);
    if (id < 0 || (size_t)id >= e->nsegs || e->segs[id].name == NULL || e->segs[id].closing) {
        ote_mutex_unlock(&e->mu);
        return OTE_ERR_NOT_FOUND;
    }
    if (e->segs[id].users > 0) {
        ote_mutex_unlock(&e->mu);
        return OTE_ERR_BUSY;
    }
    e->segs[id].closing = 1;
    ote_segment_t *seg = e->segs[id].seg;
    ote_mutex_unlock(&e->mu);
    ote_status_t st = ote_segment_close(seg); /* waits for its notifications, without mu */
    ote_mutex_lock(&e->mu);
    char *name = e->segs[id].name;
    if (st == OTE_OK) e->segs[id] = (mc_seg_t){0};
    else e->segs[id].closing = 0;
    ote_mutex_unlock(&e->mu);
    if (st == OTE_OK) ote_free(name);
    return st;
}

int closeSegment(transfer_engine_t engine, segment_id_t segment_id) {
    mc_engine_t *e = ote__mc_engine(engine, "closeSegment");
    if (e == NULL) return OTE_MC_ERR_INVALID_ARGUMENT;
    ote_status_t st = seg_close(e, segment_id);
    if (st == OTE_ERR_NOT_FOUND) {
        OTE_ERROR(MC_LOG, "closeSegment(%d): no such segment", (int)segment_id);
        return OTE_MC_ERR_INVALID_ARGUMENT;
    }
    if (st != OTE_OK)
        OTE_ERROR(MC_LOG, "closeSegment(%d): %s", (int)segment_id, ote_status_str(st));
    return ote__mc_err(st);
}

void ote__mc_segs_close_all(mc_engine_t *e) {
    for (size_t i = 0; i < e->nsegs; i++) {
        ote_status_t st = seg_close(e, (int32_t)i);
        if (st != OTE_OK && st != OTE_ERR_NOT_FOUND)
            OTE_ERROR(MC_LOG, "destroyTransferEngine: segment %zu (%s) stays open: %s", i,
                      e->segs[i].name, ote_status_str(st));
    }
}

int removeLocalSegment(transfer_engine_t engine, const char *segment_name) {
    if (ote__mc_engine(engine, "removeLocalSegment") == NULL) return OTE_MC_ERR_INVALID_ARGUMENT;
    OTE_ERROR(MC_LOG,
              "removeLocalSegment(%s): not supported: OrbitTE publishes no segment descriptor "
              "(peers ask this engine directly while it runs)",
              segment_name ? segment_name : "(null)");
    return OTE_MC_ERR_NOT_IMPLEMENTED;
}

int syncSegmentCache(transfer_engine_t engine) {
    /* Nothing to refresh: a peer's registrations are checked by the peer itself when each
     * request arrives, and a lost peer is reconnected by closeSegment + openSegment. */
    return ote__mc_engine(engine, "syncSegmentCache") == NULL ? OTE_MC_ERR_INVALID_ARGUMENT : 0;
}

/* Describe the open segments into buf (text lines, or JSON objects separated by commas):
 * the bytes it needs (which may be more than len: nothing past len is written). */
size_t ote__mc_segs_describe(mc_engine_t *e, char *buf, size_t len, int json) {
    size_t used = 0;
    for (size_t i = 0;; i++) {
        ote_segment_t *seg = NULL;
        ote_mutex_lock(&e->mu);
        size_t n = e->nsegs;
        int open = i < n && e->segs[i].name != NULL && !e->segs[i].closing;
        if (open) {
            e->segs[i].users++;
            seg = e->segs[i].seg;
        }
        ote_mutex_unlock(&e->mu);
        if (i >= n) break;
        if (!open) continue;
        ote_segment_info_t info;
        if (ote_segment_info(seg, &info) != OTE_OK) snprintf(info.transport, 16, "?");
        ote__mc_seg_put(e, (int32_t)i);
        char line[400];
        int k = json ? snprintf(line, sizeof line,
                                "%s{\"id\":%zu,\"peer\":\"%s\",\"transport\":\"%s\"}",
                                used ? "," : "", i, info.peer, info.transport)
                     : snprintf(line, sizeof line, "segment %zu: %s over %s\n", i, info.peer,
                                info.transport);
        if (k > 0 && used + (size_t)k < len) memcpy(buf + used, line, (size_t)k + 1);
        used += k > 0 ? (size_t)k : 0;
    }
    return used;
}

/*
 * compat/mooncake/notify.c - Mooncake's notifications over OrbitTE's. A notify_msg_t
 * travels as one OrbitTE notification framed as python/orbitte/mooncake.py frames a
 * TransferNotify (so the two interoperate): "OTMN", the name's length (u32, little
 * endian), the name, then the message. A notification without that framing (a plain
 * ote_notify_send) is received with the sender's engine name (its engine_name) as name,
 * or its address when it has none.
 *
 * Memory handed to the caller (getNotifsFromEngine) comes from malloc, as Mooncake's
 * does, so that freeNotifsMsgBuf and a caller's own free() both release it.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "compat/mooncake/compat_internal.h"

#define NOTIFY_MAGIC "OTMN"
#define NOTIFY_HEADER 8u
/* Most notifications one getNotifsFromEngine call drains (the rest wait for the next). */
#define NOTIFY_DRAIN_MAX (1u << 20)
#define FROM_MAX 288u

ote_status_t ote__mc_notify_encode(const notify_msg_t *n, char *buf, size_t cap, size_t *len_out) {
    const char *name = n->name != NULL ? n->name : "";
    const char *msg = n->msg != NULL ? n->msg : "";
    size_t nl = strlen(name), ml = strlen(msg);
    if (nl > cap || ml > cap || NOTIFY_HEADER + nl + ml > cap) return OTE_ERR_TOO_BIG;
    memcpy(buf, NOTIFY_MAGIC, 4);
    for (unsigned i = 0; i < 4; i++) buf[4 + i] = (char)((nl >> (8 * i)) & 0xffu);
    memcpy(buf + NOTIFY_HEADER, name, nl);
    memcpy(buf + NOTIFY_HEADER + nl, msg, ml);
    *len_out = NOTIFY_HEADER + nl + ml;
    return OTE_OK;
}

/* Split a received message into name and msg (each NUL-terminated, at most len bytes);
 * an unframed one is named by the sender's engine name, else its address (from). */
static void decode(const char *buf, size_t len, const char *from, const char *sender_name,
                   char *name, char *msg) {
    if (len >= NOTIFY_HEADER && memcmp(buf, NOTIFY_MAGIC, 4) == 0) {
        const unsigned char *u = (const unsigned char *)buf + 4;
        size_t nl = (size_t)u[0] | (size_t)u[1] << 8 | (size_t)u[2] << 16 | (size_t)u[3] << 24;
        if (nl <= len - NOTIFY_HEADER) {
            memcpy(name, buf + NOTIFY_HEADER, nl);
            name[nl] = '\0';
            memcpy(msg, buf + NOTIFY_HEADER + nl, len - NOTIFY_HEADER - nl);
            msg[len - NOTIFY_HEADER - nl] = '\0';
            return;
        }
    }
    strcpy(name, sender_name[0] != '\0' ? sender_name : from);
    memcpy(msg, buf, len);
    msg[len] = '\0';
}

/* Shrink a buffer to its string (keeping it when realloc cannot). */
static char *fit(char *s) {
    char *t = realloc(s, strlen(s) + 1);
    return t != NULL ? t : s;
}

/* Take the next queued notification into *out: OTE_OK, OTE_ERR_TIMEOUT when none is
 * queued, or a failure (logged). Memory is allocated before the message is taken, so
 * running out of it leaves the message queued. */
static ote_status_t take_one(ote_engine_t *ote, notify_msg_t *out) {
    char buf[OTE_NOTIFY_MAX], from[FROM_MAX], sender_name[OTE_ENGINE_NAME_MAX + 1];
    char *name = malloc(OTE_NOTIFY_MAX + FROM_MAX + 1), *msg = malloc(OTE_NOTIFY_MAX + 1);
    ote_status_t st = name == NULL || msg == NULL ? OTE_ERR_NOMEM : OTE_OK;
    size_t len = 0;
    if (st == OTE_OK)
        st = ote_notify_recv_ex(ote, buf, sizeof buf, &len, from, sizeof from, sender_name,
                                sizeof sender_name, 0);
    if (st == OTE_OK) {
        from[FROM_MAX - 1] = '\0';
        decode(buf, len, from, sender_name, name, msg);
        *out = (notify_msg_t){.name = fit(name), .msg = fit(msg)};
        return OTE_OK;
    }
    free(name);
    free(msg);
    if (st != OTE_ERR_TIMEOUT)
        OTE_ERROR(MC_LOG, "getNotifsFromEngine: %s (the rest stay queued)", ote_status_str(st));
    return st;
}

notify_msg_t *getNotifsFromEngine(transfer_engine_t engine, int *size) {
    mc_engine_t *e = ote__mc_engine(engine, "getNotifsFromEngine");
    if (e == NULL || size == NULL) return NULL;
    *size = 0;
    ote_engine_t *ote = ote__mc_ote(e, "getNotifsFromEngine");
    if (ote == NULL) return NULL;
    notify_msg_t *arr = NULL;
    size_t n = 0, cap = 0;
    while (n < NOTIFY_DRAIN_MAX) {
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 8;
            notify_msg_t *grown = realloc(arr, ncap * sizeof *grown);
            if (grown == NULL) {
                OTE_ERROR(MC_LOG, "getNotifsFromEngine: out of memory (the rest stay queued)");
                break;
            }
            arr = grown;
            cap = ncap;
        }
        if (take_one(ote, &arr[n]) != OTE_OK) break;
        n++;
    }
    if (n == 0) {
        free(arr);
        return NULL;
    }
    *size = (int)n;
    return arr;
}

int freeNotifsMsgBuf(notify_msg_t *msg, int size) {
    if (msg == NULL) return 0;
    for (int i = 0; i < size; i++) {
        free(msg[i].name);
        free(msg[i].msg);
    }
    free(msg);
    return 0;
}

int genNotifyInEngine(transfer_engine_t engine, uint64_t target_id, notify_msg_t notify_msg) {
    mc_engine_t *e = ote__mc_engine(engine, "genNotifyInEngine");
    if (e == NULL) return OTE_MC_ERR_INVALID_ARGUMENT;
    if (ote__mc_ote(e, "genNotifyInEngine") == NULL) return OTE_MC_ERR_CONTEXT;
    char buf[OTE_NOTIFY_MAX];
    size_t len = 0;
    if (ote__mc_notify_encode(&notify_msg, buf, sizeof buf, &len) != OTE_OK) {
        OTE_ERROR(MC_LOG, "genNotifyInEngine: the notification is longer than %u bytes",
                  OTE_NOTIFY_MAX - NOTIFY_HEADER);
        return OTE_MC_ERR_INVALID_ARGUMENT;
    }
    ote_segment_t *seg = NULL;
    if (target_id > INT32_MAX || ote__mc_seg_get(e, (int32_t)target_id, &seg) != OTE_OK) {
        OTE_ERROR(MC_LOG, "genNotifyInEngine: no open segment %llu", (unsigned long long)target_id);
        return OTE_MC_ERR_METADATA;
    }
    ote_status_t st = ote_notify_send(e->ote, seg, buf, len); /* waits for the ack, without mu */
    ote__mc_seg_put(e, (int32_t)target_id);
    if (st != OTE_OK)
        OTE_ERROR(MC_LOG, "genNotifyInEngine(%llu): %s", (unsigned long long)target_id,
                  ote_status_str(st));
    return ote__mc_err(st);
}

/*
 * engine/shm/shm_requester_ipc.c - the CUDA IPC part of the requester side of the
 * same-host transport: a source message received with the fd it passes (an SHM_IPC_OFFER
 * of a VMM allocation), the offer taken (the piece leaves the window and its copy starts
 * through host->gpu.ipc_copy_start: import and an async copy), the copies under way polled
 * (host->gpu.ipc_copy_poll), copies of unknown outcome settled (host->gpu.ipc_copy_settle),
 * IPC_DONE entries that let the source drop a piece's pin, and close receipts
 * (SHM_IPC_CLOSE). The receive thread of shm_requester.c calls it, p->mu held. Design:
 * shm_internal.h.
 */
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/log.h"
#include "engine/shm/shm_internal.h"
#include "engine/shm/shm_proto.h"

/* One message (its real length, MSG_TRUNC) and the fds passed with it: the first in
 * *fd_out (close-on-exec), more than one, or a truncated control part, set *bad (those
 * received are closed but the first). */
ssize_t ote__shm_recv_fds(int sock, uint8_t *buf, size_t cap, int *fd_out, int *bad) {
    union {
        char b[CMSG_SPACE(4 * sizeof(int))];
        struct cmsghdr align;
    } cb;
    struct iovec iov = {.iov_base = buf, .iov_len = cap};
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb.b, .msg_controllen = sizeof(cb.b)};
    ssize_t n = recvmsg(sock, &mh, MSG_DONTWAIT | MSG_TRUNC | MSG_CMSG_CLOEXEC);
    if (n < 0) return n;
    if (mh.msg_flags & MSG_CTRUNC) *bad = 1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c != NULL; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS || c->cmsg_len < CMSG_LEN(0))
            continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t j = 0; j < k; j++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + j * sizeof(int), sizeof(int));
            if (*fd_out < 0) {
                *fd_out = fd;
            } else {
                close(fd);
                *bad = 1;
            }
        }
    }
    return n;
}

/* The IPC copy of piece id ended: the source is told (an IPC_DONE entry in the next REQS
 * message) so that it drops the piece's pin. p->mu held. */
static void peer_ipc_done(shm_peer_t *p, uint64_t id) {
    if (p->broken) return;
    if (ote__shm_peer_woff_push(p, (shm_woff_t){0, 0, 0, 0, SHM_OP_IPC_DONE, id}) != 0)
        OTE_WARN_LIMITED("shm",
                         "peer %s: out of memory for an IPC_DONE entry: the source keeps "
                         "the piece pinned until the connection closes",
                         p->addr);
}

/* The IPC copy of piece id has an unknown outcome (its request ended with its status):
 * no IPC_DONE until ipc_copy_settle proves it complete (ote__shm_peer_ipc_settle). p->mu held. */
static void peer_ipc_unsettled(shm_peer_t *p, uint64_t id, void *op) {
    const ote__host_t *h = &p->tp->host;
    shm_unsettled_t *u = p->broken ? NULL : ote_calloc(1, sizeof(*u));
    if (u == NULL) {
        if (!p->broken)
            OTE_WARN_LIMITED("shm",
                             "peer %s: out of memory for an unsettled IPC copy: the source "
                             "keeps the piece pinned until the connection closes",
                             p->addr);
        (void)h->gpu.ipc_copy_settle(h->gpu.arg, op, 1); /* the engine retains it */
        return;
    }
    u->id = id;
    u->op = op;
    u->next = p->uh;
    p->uh = u;
}

/* Ask the driver again about the IPC copies of unknown outcome: each one proven complete
 * tells the source (IPC_DONE: its pin goes); once the connection ended, each is handed to
 * the engine, which retains it until proven complete. p->mu held. */
void ote__shm_peer_ipc_settle(shm_peer_t *p) {
    const ote__host_t *h = &p->tp->host;
    int abandon = p->broken || p->stop;
    shm_unsettled_t **pp = &p->uh;
    while (*pp) {
        shm_unsettled_t *u = *pp;
        if (h->gpu.ipc_copy_settle(h->gpu.arg, u->op, abandon) != OTE_OK) {
            pp = &u->next;
            continue;
        }
        *pp = u->next;
        if (!abandon) peer_ipc_done(p, u->id);
        ote_free(u);
    }
}

/* An SHM_IPC_OFFER: the piece at the head of the window is the requester's to copy by
 * CUDA IPC. p->mu held; -1 on a protocol error. */
int ote__shm_peer_offer(shm_peer_t *p, const uint8_t *b, size_t n, int fd, shm_slist_t *done) {
    shm_ipc_offer_t o;
    if (!p->ipc || ote__shm_offer_decode(b, n, &o) != 0) return -1;
    ote__slice_t *s = p->fh;
    /* A VMM offer carries exactly its allocation's fd; any other carries none. */
    if (s == NULL || ote__shm_xp(s)->id != o.id ||
        (s->op != OTE__SLICE_READ && s->op != OTE__SLICE_WRITE) || s->len > o.d.size - o.d.offset ||
        ((o.d.flags & OTE__IPC_VMM) != 0) != (fd >= 0))
        return -1;
    p->fh = s->next;
    if (p->fh == NULL) p->ft = NULL;
    p->nflight--;
    p->flight_bytes -= s->len;
    if (ote__shm_xp(s)->ring_end != 0)
        p->ring_tail = ote__shm_xp(s)->ring_end; /* the source left it */
    const ote__host_t *h = &p->tp->host;
    void *op = NULL;
    ote_status_t st = h->gpu.ipc_copy_start(h->gpu.arg, (uint64_t)p->src_pid, &o.d, fd, s->local,
                                            s->local_kind, s->len, s->op == OTE__SLICE_WRITE, &op);
    if (st != OTE_OK) {
        if (op != NULL) peer_ipc_unsettled(p, o.id, op); /* the copy may still run */
        else peer_ipc_done(p, o.id);                     /* nothing runs: the pin may go */
        if (ote_status_code(st) == OTE_ERR_UNSUPPORTED) st = OTE_ERR_NATIVE; /* not a decline */
        ote__shm_slist_add(done, s, st);
        return 0;
    }
    ote__shm_xp(s)->ipc = op;
    s->next = NULL;
    if (p->it) p->it->next = s;
    else p->ih = s;
    p->it = s;
    return 0;
}

/* Poll the IPC copies under way: each one that ended completes its slice (PEER_LOST once
 * the source is gone) and tells the source. p->mu held. */
void ote__shm_peer_ipc_poll(shm_peer_t *p, shm_slist_t *done) {
    const ote__host_t *h = &p->tp->host;
    ote_deadline_t now = ote_now_ns();
    ote__slice_t **pp = &p->ih, *last = NULL;
    while (*pp) {
        ote__slice_t *s = *pp;
        ote_status_t st = h->gpu.ipc_copy_poll(h->gpu.arg, ote__shm_xp(s)->ipc, s->deadline <= now);
        if (st == OTE_ERR_AGAIN) {
            last = s;
            pp = &s->next;
            continue;
        }
        *pp = s->next;
        void *op = ote__shm_xp(s)->ipc;
        ote__shm_xp(s)->ipc = NULL;
        if (st != OTE_OK) peer_ipc_unsettled(p, ote__shm_xp(s)->id, op); /* outcome unknown */
        else if (!p->broken) peer_ipc_done(p, ote__shm_xp(s)->id);
        if (p->broken) st = OTE_ERR_PEER_LOST;
        if (ote_status_code(st) == OTE_ERR_UNSUPPORTED) st = OTE_ERR_NATIVE; /* not a decline */
        ote__shm_slist_add(done, s, st);
    }
    p->it = last;
}

/* A close receipt: the source unregistered the allocation buffer_id. p->mu held. */
int ote__shm_peer_close_receipt(shm_peer_t *p, const uint8_t *b, size_t n) {
    shm_ipc_close_t c;
    if (!p->ipc || ote__shm_close_decode(b, n, &c) != 0) return -1;
    p->tp->host.gpu.ipc_revoked(p->tp->host.gpu.arg, (uint64_t)p->src_pid, c.buffer_id);
    return 0;
}

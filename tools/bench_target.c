/*
 * tools/bench_target.c - ote_bench --role target: one registered buffer (READ and WRITE
 * allowed, named BENCH_BUFFER_NAME: initiators find it by buffer discovery; INFO still
 * answers for initiators of earlier builds) and the control requests that arrive as OrbitTE notifications (INFO, FILL,
 * ZERO, VERIFY, QUIT; see bench_lib.h), answered over a segment to the sender. Spawned
 * by an initiator it reports over a pipe and dies with it.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <ote/ote.h>

#include "tools/bench_internal.h"
#include "tools/bench_lib.h"

#define TARGET_MAX_PEERS 16

typedef struct {
    char addr[BENCH_ADDR_MAX];
    ote_segment_t *seg;
} reply_peer_t;

typedef struct {
    ote_engine_t *engine;
    bench_mem_t mem; /* the buffer: host or device memory (--remote-mem) */
    uint64_t len;
    reply_peer_t peers[TARGET_MAX_PEERS];
    size_t n_peers;
} target_t;

static void target_drop_peer(target_t *t, size_t i) {
    ote_status_t st = ote_segment_close(t->peers[i].seg);
    if (st != OTE_OK) bench__print_status("target: closing a reply segment", st);
    memmove(&t->peers[i], &t->peers[i + 1], (t->n_peers - i - 1) * sizeof t->peers[0]);
    t->n_peers--;
}

/* Replies go back over a segment the target opens to the sender's address; segments are
 * kept (a few) so a run of requests does not reconnect each time. */
static void target_reply(target_t *t, const char *from, const bench_ctl_msg_t *rep) {
    char msg[MSG_MAX];
    int n = bench_ctl_format(rep, msg, sizeof msg);
    if (n < 0) return;
    for (int attempt = 0; attempt < 2; attempt++) {
        size_t i;
        for (i = 0; i < t->n_peers; i++)
            if (strcmp(t->peers[i].addr, from) == 0) break;
        if (i == t->n_peers) {
            if (t->n_peers == TARGET_MAX_PEERS) target_drop_peer(t, 0);
            ote_segment_t *seg = NULL;
            ote_status_t st = ote_segment_open(t->engine, from, &seg);
            if (st != OTE_OK) {
                fprintf(stderr, "ote_bench: target: cannot reach initiator '%s' to reply\n", from);
                bench__print_status("target: ote_segment_open", st);
                return;
            }
            i = t->n_peers++;
            snprintf(t->peers[i].addr, sizeof t->peers[i].addr, "%s", from);
            t->peers[i].seg = seg;
        }
        ote_status_t st = ote_notify_send(t->engine, t->peers[i].seg, msg, (size_t)n);
        if (st == OTE_OK) return;
        /* A stale segment (the initiator restarted on the same address): reopen once. */
        target_drop_peer(t, i);
        if (attempt == 1) bench__print_status("target: ote_notify_send", st);
    }
}

/* Handles one request; returns true on QUIT. */
static bool target_handle(target_t *t, const char *from, const bench_ctl_msg_t *req) {
    bench_ctl_msg_t rep;
    memset(&rep, 0, sizeof rep);
    rep.id = req->id;
    rep.verb = BENCH_CTL_OK;
    bool quit = false;
    if (bench__mem_serve(&t->mem, t->len, req, &rep)) {
        /* FILL, ZERO, VERIFY: answered */
    } else if (req->verb == BENCH_CTL_INFO) {
        rep.a = t->mem.addr;
        rep.b = t->len;
    } else if (req->verb == BENCH_CTL_QUIT) {
        quit = true;
    } else {
        rep.verb = BENCH_CTL_ERR;
        snprintf(rep.text, sizeof rep.text, "unexpected request");
    }
    target_reply(t, from, &rep);
    return quit;
}

/* True when the initiator that spawned us is gone (the read end of the pipe closed). */
static bool parent_gone(int report_fd) {
    if (report_fd < 0) return false;
    struct pollfd p = {.fd = report_fd, .events = POLLOUT, .revents = 0};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLERR | POLLHUP)) != 0;
}

static int write_all(int fd, const char *s, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, s, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        s += w;
        n -= (size_t)w;
    }
    return 0;
}

int bench__run_target(const bench_options_t *o) {
    if (o->report_fd >= 0) {
        /* Spawned by an initiator: die with it. The pipe check in the loop covers the case
         * where it died before this line. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
    }
    int rc = 1;
    target_t t;
    memset(&t, 0, sizeof t);
    t.len = o->buffer_size;
    const char *listen = o->listen[0] != '\0' ? o->listen : "0.0.0.0:0";

    ote_status_t st = bench__make_engine(o, listen, &t.engine);
    if (st != OTE_OK) {
        bench__print_status("target: ote_engine_create", st);
        return 1;
    }
    char addr[BENCH_ADDR_MAX];
    st = ote_engine_address(t.engine, addr, sizeof addr);
    if (st != OTE_OK) {
        bench__print_status("target: ote_engine_address", st);
        goto err_destroy_engine;
    }
    if (bench__mem_create(t.engine, o->remote_mem, o->remote_file, t.len, &t.mem) != 0)
        goto err_destroy_engine;
    unsigned perms = OTE_PERM_READ | OTE_PERM_WRITE;
    if (o->remote_ipc && !BENCH_MEM_IS_HOST(o->remote_mem)) perms |= OTE_PERM_IPC;
    /* A file is registered by bench__mem_create (ote_file_register). */
    st = o->remote_mem == BENCH_MEM_FILE
             ? OTE_OK
             : ote_memory_register_named(t.engine, (void *)(uintptr_t)t.mem.addr, (size_t)t.len,
                                         perms, BENCH_BUFFER_NAME);
    if (st != OTE_OK) {
        bench__print_status("target: ote_memory_register", st);
        goto err_unmap;
    }

    char line[BENCH_ADDR_MAX + 96];
    int n = bench_report_format(addr, t.mem.addr, t.len, line, sizeof line - 1);
    if (n < 0) goto err_unregister;
    if (o->report_fd >= 0) {
        line[n] = '\n';
        if (write_all(o->report_fd, line, (size_t)n + 1) != 0) goto err_unregister;
    } else {
        printf("%s\n", line);
        printf(
            "# target ready: run `ote_bench --target %s` on the initiator (a wildcard "
            "address means: use this host's name or IP with that port); Ctrl-C stops\n",
            addr);
        fflush(stdout);
    }

    for (;;) {
        if (bench__stop || parent_gone(o->report_fd)) break;
        char msg[OTE_NOTIFY_MAX]; /* the largest any peer may send: never OTE_ERR_TOO_BIG */
        char from[BENCH_ADDR_MAX];
        size_t len = 0;
        from[0] = '\0';
        st = ote_notify_recv(t.engine, msg, sizeof msg, &len, from, sizeof from, RECV_SLICE_NS);
        if (ote_status_code(st) == OTE_ERR_TIMEOUT) continue;
        if (ote_status_code(st) == OTE_ERR_TOO_BIG) {
            /* Cannot happen with an OTE_NOTIFY_MAX buffer; a message that stays queued
             * would block every later one, so stop rather than spin. */
            fprintf(stderr, "ote_bench: target: a notification over %d bytes arrived; stopping\n",
                    OTE_NOTIFY_MAX);
            goto err_close_peers;
        }
        if (st != OTE_OK) {
            bench__print_status("target: ote_notify_recv", st);
            goto err_close_peers;
        }
        bench_ctl_msg_t req;
        if (bench_ctl_parse(msg, len, &req) != 0) {
            fprintf(stderr, "ote_bench: target: ignoring a malformed message from %s\n", from);
            continue;
        }
        if (target_handle(&t, from, &req)) break;
    }
    rc = 0;

err_close_peers:
    while (t.n_peers > 0) target_drop_peer(&t, t.n_peers - 1);
err_unregister:
    st = o->remote_mem == BENCH_MEM_FILE
             ? OTE_OK
             : ote_memory_unregister(t.engine, (void *)(uintptr_t)t.mem.addr);
    if (st != OTE_OK) {
        bench__print_status("target: ote_memory_unregister", st);
        rc = 1;
    }
err_unmap:
    bench__mem_destroy(&t.mem); /* unregistered, the engine still here (shared memory) */
err_destroy_engine:
    st = ote_engine_destroy(t.engine);
    if (st != OTE_OK) {
        bench__print_status("target: ote_engine_destroy", st);
        rc = 1;
    }
    return rc;
}

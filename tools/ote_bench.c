/*
 * tools/ote_bench.c - OrbitTE's benchmark: throughput, message rate and per-batch
 * latency of READ or WRITE against a target process, through the public API only.
 *
 * Two roles, one binary. The target owns one registered buffer (READ and WRITE allowed)
 * and answers small text requests that arrive as OrbitTE notifications (INFO, FILL,
 * ZERO, VERIFY, QUIT; see bench_lib.h). The initiator owns an engine, a local buffer of
 * the same layout, one batch per thread, and measures. With no --target the initiator
 * fork+execs itself as a target on loopback and reads the target's address and buffer
 * back over a pipe, which also serves as a lifeline: when the initiator dies the pipe
 * breaks and the target exits.
 *
 * Buffer layout: request j of batch d of thread t always uses offset
 * ((t * depth + d) * batch + j) * block on both sides, so a --check compares the
 * destination against the pattern of the same offsets, and batches in flight at once
 * never share bytes.
 * The timed loop only submits, waits and resets preallocated batches; latency samples go
 * into preallocated arrays (reservoir-sampled past their capacity) and are sorted once
 * at the end.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <ote/ote.h>

#include "base/lock.h"
#include "base/status.h"
#include "base/time.h"
#include "tools/bench_lib.h"

#define CTL_TIMEOUT_NS (60ull * OTE_NSEC_PER_SEC)  /* VERIFY of a large buffer takes a while */
#define SPAWN_TIMEOUT_NS (60ull * OTE_NSEC_PER_SEC)
#define RECV_SLICE_NS (100ull * OTE_NSEC_PER_MSEC) /* how often waits look at signals */
#define LAT_SAMPLES_TOTAL (1u << 22)               /* kept latency samples per result */
#define MSG_MAX 256

static volatile sig_atomic_t g_stop;

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

static void install_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

static void print_status(const char *what, ote_status_t st) {
    char buf[256];
    fprintf(stderr, "ote_bench: %s: %s\n", what, ote_status_describe(st, buf, sizeof buf));
}

static void *map_buffer(uint64_t len) {
    void *p = mmap(NULL, (size_t)len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* Engine with the transport and addresses of the options. */
static ote_status_t make_engine(const bench_options_t *o, const char *listen,
                                ote_engine_t **engine_out) {
    ote_config_t *cfg = NULL;
    ote_status_t st = ote_config_create(&cfg);
    if (st != OTE_OK) return st;
    st = ote_config_set(cfg, "transport", o->transport);
    if (st == OTE_OK && listen != NULL && listen[0] != '\0')
        st = ote_config_set(cfg, "listen_address", listen);
    if (st == OTE_OK && o->advertise[0] != '\0')
        st = ote_config_set(cfg, "advertise_address", o->advertise);
    if (st == OTE_OK) st = ote_engine_create(cfg, engine_out);
    ote_config_destroy(cfg);
    return st;
}

/* ======================================================================================
 * Target
 * ==================================================================================== */

#define TARGET_MAX_PEERS 16

typedef struct {
    char addr[BENCH_ADDR_MAX];
    ote_segment_t *seg;
} reply_peer_t;

typedef struct {
    ote_engine_t *engine;
    uint8_t *buf;
    uint64_t len;
    reply_peer_t peers[TARGET_MAX_PEERS];
    size_t n_peers;
} target_t;

static void target_drop_peer(target_t *t, size_t i) {
    ote_status_t st = ote_segment_close(t->peers[i].seg);
    if (st != OTE_OK) print_status("target: closing a reply segment", st);
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
                fprintf(stderr, "ote_bench: target: cannot reach initiator '%s' to reply\n",
                        from);
                print_status("target: ote_segment_open", st);
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
        if (attempt == 1) print_status("target: ote_notify_send", st);
    }
}

/* Bounds check of [off, off+len) against the buffer, overflow-safe. */
static bool target_range_ok(const target_t *t, uint64_t off, uint64_t len) {
    return off <= t->len && len <= t->len - off;
}

/* Handles one request; returns true on QUIT. */
static bool target_handle(target_t *t, const char *from, const bench_ctl_msg_t *req) {
    bench_ctl_msg_t rep;
    memset(&rep, 0, sizeof rep);
    rep.id = req->id;
    rep.verb = BENCH_CTL_OK;
    bool quit = false;
    switch (req->verb) {
        case BENCH_CTL_INFO:
            rep.a = (uint64_t)(uintptr_t)t->buf;
            rep.b = t->len;
            break;
        case BENCH_CTL_FILL:
            if (!target_range_ok(t, req->b, req->c)) goto out_of_range;
            bench_pattern_fill(t->buf + req->b, req->b, (size_t)req->c, req->a);
            break;
        case BENCH_CTL_ZERO:
            if (!target_range_ok(t, req->a, req->b)) goto out_of_range;
            memset(t->buf + req->a, 0, (size_t)req->b);
            break;
        case BENCH_CTL_VERIFY: {
            if (!target_range_ok(t, req->b, req->c)) goto out_of_range;
            uint64_t bad = 0;
            if (!bench_pattern_check(t->buf + req->b, req->b, (size_t)req->c, req->a, &bad)) {
                rep.verb = BENCH_CTL_BAD;
                rep.a = bad;
            }
            break;
        }
        case BENCH_CTL_QUIT:
            quit = true;
            break;
        default:
            rep.verb = BENCH_CTL_ERR;
            snprintf(rep.text, sizeof rep.text, "unexpected request");
            break;
    }
    target_reply(t, from, &rep);
    return quit;
out_of_range:
    rep.verb = BENCH_CTL_ERR;
    snprintf(rep.text, sizeof rep.text, "range outside the %" PRIu64 "-byte buffer", t->len);
    target_reply(t, from, &rep);
    return false;
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

static int run_target(const bench_options_t *o) {
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

    ote_status_t st = make_engine(o, listen, &t.engine);
    if (st != OTE_OK) {
        print_status("target: ote_engine_create", st);
        return 1;
    }
    char addr[BENCH_ADDR_MAX];
    st = ote_engine_address(t.engine, addr, sizeof addr);
    if (st != OTE_OK) {
        print_status("target: ote_engine_address", st);
        goto err_destroy_engine;
    }
    t.buf = map_buffer(t.len);
    if (t.buf == NULL) {
        fprintf(stderr, "ote_bench: target: cannot map a %" PRIu64 "-byte buffer: %s\n", t.len,
                strerror(errno));
        goto err_destroy_engine;
    }
    st = ote_memory_register(t.engine, t.buf, (size_t)t.len, OTE_PERM_READ | OTE_PERM_WRITE);
    if (st != OTE_OK) {
        print_status("target: ote_memory_register", st);
        goto err_unmap;
    }

    char line[BENCH_ADDR_MAX + 96];
    int n = bench_report_format(addr, (uint64_t)(uintptr_t)t.buf, t.len, line, sizeof line - 1);
    if (n < 0) goto err_unregister;
    if (o->report_fd >= 0) {
        line[n] = '\n';
        if (write_all(o->report_fd, line, (size_t)n + 1) != 0) goto err_unregister;
    } else {
        printf("%s\n", line);
        printf("# target ready: run `ote_bench --target %s` on the initiator (a wildcard "
               "address means: use this host's name or IP with that port); Ctrl-C stops\n",
               addr);
        fflush(stdout);
    }

    for (;;) {
        if (g_stop || parent_gone(o->report_fd)) break;
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
            print_status("target: ote_notify_recv", st);
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
    st = ote_memory_unregister(t.engine, t.buf);
    if (st != OTE_OK) {
        print_status("target: ote_memory_unregister", st);
        rc = 1;
    }
err_unmap:
    munmap(t.buf, (size_t)t.len);
err_destroy_engine:
    st = ote_engine_destroy(t.engine);
    if (st != OTE_OK) {
        print_status("target: ote_engine_destroy", st);
        rc = 1;
    }
    return rc;
}

/* ======================================================================================
 * Initiator: the spawned target and the control client
 * ==================================================================================== */

typedef struct {
    pid_t pid;   /* 0 when no child */
    int lifeline; /* read end of the report pipe, kept open while the child should live */
} child_t;

/* fork+exec this binary as --role target on loopback and read its report line. */
static int spawn_target(const bench_options_t *o, uint64_t buffer_size, child_t *child,
                        char *addr, size_t addr_len, uint64_t *raddr, uint64_t *rlen) {
    char exe[4096];
    ssize_t el = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (el <= 0) {
        fprintf(stderr, "ote_bench: cannot find my own executable: %s\n", strerror(errno));
        return -1;
    }
    exe[el] = '\0';
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
        fprintf(stderr, "ote_bench: pipe: %s\n", strerror(errno));
        return -1;
    }
    char fd_s[16], size_s[32];
    snprintf(fd_s, sizeof fd_s, "%d", fds[1]);
    snprintf(size_s, sizeof size_s, "%" PRIu64, buffer_size);
    char *argv[] = {exe,        "--role",        "target",  "--transport", (char *)o->transport,
                    "--listen", "127.0.0.1:0",   "--buffer-size", size_s, "--report-fd",
                    fd_s,       NULL};
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "ote_bench: fork: %s\n", strerror(errno));
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        /* Only async-signal-safe calls between fork and exec. */
        fcntl(fds[1], F_SETFD, 0);
        execv(exe, argv);
        _exit(127);
    }
    close(fds[1]);
    child->pid = pid;
    child->lifeline = fds[0];

    char line[BENCH_ADDR_MAX + 96];
    size_t got = 0;
    ote_deadline_t dl = ote_deadline_after(SPAWN_TIMEOUT_NS);
    while (got == 0 || line[got - 1] != '\n') {
        if (got == sizeof line - 1 || g_stop) goto bad_report;
        struct pollfd p = {.fd = fds[0], .events = POLLIN, .revents = 0};
        int pr = poll(&p, 1, ote_deadline_remaining_ms(dl, 1000));
        if (pr < 0 && errno == EINTR) continue;
        if (pr == 0 && ote_deadline_expired(dl)) {
            fprintf(stderr, "ote_bench: the target child did not report within %llu s\n",
                    SPAWN_TIMEOUT_NS / OTE_NSEC_PER_SEC);
            return -1;
        }
        if (pr <= 0) continue;
        ssize_t r = read(fds[0], line + got, sizeof line - 1 - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            fprintf(stderr, "ote_bench: the target child exited before reporting its address\n");
            return -1;
        }
        got += (size_t)r;
    }
    line[got] = '\0';
    if (bench_report_parse(line, addr, addr_len, raddr, rlen) != 0) goto bad_report;
    return 0;
bad_report:
    fprintf(stderr, "ote_bench: unexpected report from the target child\n");
    return -1;
}

/* Ends the child: it normally exits after QUIT; otherwise SIGTERM, then SIGKILL. Returns
 * the child's exit status (0 = clean), or 1 when it had to be killed. */
static int reap_child(child_t *c, bool asked_to_quit) {
    if (c->pid <= 0) return 0;
    if (c->lifeline >= 0) {
        close(c->lifeline); /* the target also treats this as "initiator gone" */
        c->lifeline = -1;
    }
    int status = 0;
    bool killed = false;
    ote_deadline_t dl = ote_deadline_after(10 * OTE_NSEC_PER_SEC);
    if (!asked_to_quit) kill(c->pid, SIGTERM);
    for (;;) {
        pid_t r = waitpid(c->pid, &status, WNOHANG);
        if (r == c->pid || (r < 0 && errno != EINTR)) break;
        if (ote_deadline_expired(dl)) {
            kill(c->pid, SIGKILL);
            waitpid(c->pid, &status, 0);
            killed = true;
            break;
        }
        /* Polling the child's exit: a bounded wait in a program, not test synchronisation. */
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    c->pid = 0;
    if (killed) {
        fprintf(stderr, "ote_bench: the target child did not exit; killed it\n");
        return 1;
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
    if (WIFEXITED(status))
        fprintf(stderr, "ote_bench: the target child exited with status %d\n",
                WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        fprintf(stderr, "ote_bench: the target child died of signal %d\n", WTERMSIG(status));
    return 1;
}

typedef struct {
    ote_engine_t *engine;
    ote_segment_t *seg;
    uint64_t next_id;
    const char *target;
} ctl_client_t;

/* Send a request to the target and wait for the reply with the same id. */
static int ctl_call(ctl_client_t *c, bench_ctl_msg_t *req, bench_ctl_msg_t *rep) {
    char msg[MSG_MAX];
    req->id = ++c->next_id;
    int n = bench_ctl_format(req, msg, sizeof msg);
    if (n < 0) return -1;
    ote_status_t st = ote_notify_send(c->engine, c->seg, msg, (size_t)n);
    if (st != OTE_OK) {
        print_status("sending a control request to the target", st);
        return -1;
    }
    ote_deadline_t dl = ote_deadline_after(CTL_TIMEOUT_NS);
    for (;;) {
        if (g_stop) return -1;
        uint64_t left = ote_deadline_remaining_ns(dl);
        if (left == 0) {
            char me[BENCH_ADDR_MAX] = "?";
            ote_engine_address(c->engine, me, sizeof me);
            fprintf(stderr,
                    "ote_bench: no reply from the target %s within %llu s. It replies over a "
                    "connection to this engine's address %s: make that reachable (--listen, "
                    "--advertise), or pass --remote-addr/--remote-len and leave out --check\n",
                    c->target, CTL_TIMEOUT_NS / OTE_NSEC_PER_SEC, me);
            return -1;
        }
        char buf[OTE_NOTIFY_MAX];
        size_t len = 0;
        st = ote_notify_recv(c->engine, buf, sizeof buf, &len, NULL, 0,
                             left < RECV_SLICE_NS ? left : RECV_SLICE_NS);
        if (ote_status_code(st) == OTE_ERR_TIMEOUT) continue;
        if (st != OTE_OK) {
            print_status("waiting for the target's reply", st);
            return -1;
        }
        if (bench_ctl_parse(buf, len, rep) == 0 && rep->id == req->id) {
            if (rep->verb == BENCH_CTL_ERR) {
                fprintf(stderr, "ote_bench: the target refused a request: %s\n", rep->text);
                return -1;
            }
            return 0;
        }
        /* A stale or foreign message: skip it. */
    }
}

/* Local address that routes to the target, as "ip:0" or "[ip6]:0", for --listen. */
static int route_local_address(const char *target, char *out, size_t out_len) {
    char host[BENCH_ADDR_MAX];
    uint16_t port;
    if (bench_split_hostport(target, host, sizeof host, &port) != 0) return -1;
    char port_s[8];
    snprintf(port_s, sizeof port_s, "%u", (unsigned)port);
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_DGRAM;
    if (getaddrinfo(host, port_s, &hints, &ai) != 0 || ai == NULL) return -1;
    int rc = -1;
    int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        char ip[INET6_ADDRSTRLEN];
        /* A UDP connect sends nothing; it only picks the route and source address. */
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
            getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 &&
            getnameinfo((struct sockaddr *)&ss, sl, ip, sizeof ip, NULL, 0, NI_NUMERICHOST) ==
                0) {
            if (ss.ss_family == AF_INET6)
                snprintf(out, out_len, "[%s]:0", ip);
            else
                snprintf(out, out_len, "%s:0", ip);
            rc = 0;
        }
        close(fd);
    }
    freeaddrinfo(ai);
    return rc;
}

/* ======================================================================================
 * Initiator: the measurement
 * ==================================================================================== */

typedef struct run run_t;

/* One thread's batches: `depth` of them, each with its own `batch` slots of the buffer,
 * kept in flight round-robin. */
typedef struct {
    run_t *run;
    size_t idx;
    pthread_t tid;
    ote_batch_t *batches[BENCH_DEPTH_MAX];
    ote_request_t *reqs;                /* depth * batch requests, batch d at d * batch */
    uint64_t t0[BENCH_DEPTH_MAX];       /* submit time of batch d */
    size_t n_in[BENCH_DEPTH_MAX];       /* requests of batch d in flight (0 = idle) */
    uint64_t covered[BENCH_DEPTH_MAX];  /* most requests batch d submitted at once */
    uint64_t *lat;                      /* kept samples (ns) */
    size_t lat_cap;
    size_t lat_n;
    uint64_t lat_count;                 /* samples taken */
    uint64_t lat_sum;
    uint64_t rng;
    uint64_t bytes;
    uint64_t requests;
    uint64_t end_ns;
    ote_status_t err;
    char err_what[96];
} worker_t;

struct run {
    const bench_options_t *o;
    ote_segment_t *seg;
    uint8_t *local;
    uint64_t remote_base;
    uint64_t block;
    uint64_t batch;
    size_t depth;
    size_t threads;
    uint64_t total_ops; /* 0: duration mode */
    _Atomic uint64_t ops_claimed;
    _Atomic uint64_t progress_bytes;
    _Atomic int failed;
    uint64_t start_ns;
    uint64_t deadline_ns;
    /* Per (thread, depth) batch: slots written, kept after the workers are freed. */
    uint64_t covered[BENCH_THREADS_MAX * BENCH_DEPTH_MAX];
    ote_mutex_t mu;
    ote_cond_t cv;
    size_t ready; /* workers done with warmup */
    size_t done;
    bool go;
    worker_t *w;
};

static uint64_t xorshift(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static void worker_fail(worker_t *w, const char *what, ote_status_t st) {
    if (w->err == OTE_OK) {
        w->err = st;
        snprintf(w->err_what, sizeof w->err_what, "%s", what);
    }
    atomic_store(&w->run->failed, 1);
}

/* Submit n requests on batch d. Returns 0, or -1 after worker_fail. */
static int batch_start(worker_t *w, size_t d, size_t n) {
    run_t *r = w->run;
    w->t0[d] = ote_now_ns();
    ote_status_t st = ote_batch_submit(w->batches[d], w->reqs + d * r->batch, n);
    if (st != OTE_OK) {
        worker_fail(w, "ote_batch_submit", st);
        return -1;
    }
    w->n_in[d] = n;
    if (n > w->covered[d]) w->covered[d] = n;
    return 0;
}

/* Wait for batch d, record it when timed, reset it. Returns 0, or -1 after worker_fail. */
static int batch_finish(worker_t *w, size_t d, bool timed) {
    run_t *r = w->run;
    ote_batch_t *b = w->batches[d];
    size_t n = w->n_in[d];
    ote_status_t st = ote_batch_wait(b, r->o->timeout_ns);
    uint64_t t1 = ote_now_ns();
    if (st != OTE_OK) {
        if (ote_status_code(st) == OTE_ERR_TIMEOUT) {
            ote_batch_cancel(b);
            ote_batch_wait(b, 10 * OTE_NSEC_PER_SEC);
            worker_fail(w, "a batch passed --timeout", st);
            return -1;
        }
        /* Name the first request that did not complete. */
        for (size_t i = 0; i < n; i++) {
            ote_transfer_status_t ts;
            if (ote_batch_status(b, i, &ts) == OTE_OK && ts.state != OTE_TRANSFER_COMPLETED &&
                ts.error != OTE_OK) {
                char what[96];
                snprintf(what, sizeof what, "request %zu of a batch (state %d)", i,
                         (int)ts.state);
                worker_fail(w, what, ts.error);
                return -1;
            }
        }
        worker_fail(w, "ote_batch_wait", st);
        return -1;
    }
    st = ote_batch_reset(b);
    if (st != OTE_OK) {
        worker_fail(w, "ote_batch_reset", st);
        return -1;
    }
    w->n_in[d] = 0;
    if (timed) {
        uint64_t lat = t1 - w->t0[d];
        w->lat_count++;
        w->lat_sum += lat;
        if (w->lat_n < w->lat_cap) {
            w->lat[w->lat_n++] = lat;
        } else {
            uint64_t j = xorshift(&w->rng) % w->lat_count; /* reservoir sampling */
            if (j < w->lat_cap) w->lat[j] = lat;
        }
        w->bytes += n * r->block;
        w->requests += n;
        atomic_fetch_add_explicit(&r->progress_bytes, n * r->block, memory_order_relaxed);
    }
    return 0;
}

/* Requests the next batch may carry: 0 when the run is over. */
static size_t claim(run_t *r) {
    if (atomic_load_explicit(&r->failed, memory_order_relaxed) || g_stop) return 0;
    if (r->total_ops != 0) {
        uint64_t c = atomic_fetch_add(&r->ops_claimed, r->batch);
        if (c >= r->total_ops) return 0;
        return (size_t)(r->total_ops - c < r->batch ? r->total_ops - c : r->batch);
    }
    return ote_now_ns() < r->deadline_ns ? (size_t)r->batch : 0;
}

static void *worker_main(void *arg) {
    worker_t *w = arg;
    run_t *r = w->run;
    /* Warm-up: every batch once per round, untimed. */
    for (uint64_t i = 0; i < r->o->warmup_batches && !atomic_load(&r->failed) && !g_stop; i++) {
        size_t d = (size_t)(i % r->depth);
        if (batch_start(w, d, (size_t)r->batch) != 0 || batch_finish(w, d, false) != 0) break;
    }

    ote_mutex_lock(&r->mu);
    r->ready++;
    ote_cond_broadcast(&r->cv);
    while (!r->go) ote_cond_wait(&r->cv, &r->mu, ote_deadline_after(OTE_NSEC_PER_SEC));
    ote_mutex_unlock(&r->mu);

    /* Fill the pipeline, then wait for the oldest batch and refill it, until the run is
     * over; batches in flight at the end are waited for and counted. */
    size_t inflight = 0;
    if (!atomic_load(&r->failed)) {
        for (size_t d = 0; d < r->depth; d++) {
            size_t n = claim(r);
            if (n == 0 || batch_start(w, d, n) != 0) break;
            inflight++;
        }
    }
    size_t d = 0;
    while (inflight > 0) {
        while (w->n_in[d] == 0) d = (d + 1) % r->depth;
        if (batch_finish(w, d, true) != 0) break; /* the rest is canceled at destroy */
        inflight--;
        size_t n = claim(r);
        if (n > 0) {
            if (batch_start(w, d, n) != 0) break;
            inflight++;
        }
        d = (d + 1) % r->depth;
    }
    w->end_ns = ote_now_ns();

    ote_mutex_lock(&r->mu);
    r->done++;
    ote_cond_broadcast(&r->cv);
    ote_mutex_unlock(&r->mu);
    return NULL;
}

static void progress_line(const run_t *r, uint64_t now, bool clear) {
    if (clear) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
        return;
    }
    char bs[32];
    double secs = (double)(now - r->start_ns) / 1e9;
    uint64_t moved = atomic_load_explicit(&r->progress_bytes, memory_order_relaxed);
    double gbps = secs > 0 ? (double)moved / secs / 1e9 : 0;
    if (r->total_ops != 0)
        fprintf(stderr, "\r\033[K[ote_bench] %s %s x%" PRIu64 " t%zu: %5.1f%% %.3f GB/s",
                bench_op_name(r->o->op), bench_format_size(r->block, bs, sizeof bs), r->batch,
                r->threads, 100.0 * (double)moved / ((double)r->total_ops * (double)r->block),
                gbps);
    else
        fprintf(stderr, "\r\033[K[ote_bench] %s %s x%" PRIu64 " t%zu: %.1f / %.1f s %.3f GB/s",
                bench_op_name(r->o->op), bench_format_size(r->block, bs, sizeof bs), r->batch,
                r->threads, secs, (double)r->o->duration_ns / 1e9, gbps);
    fflush(stderr);
}

/* Release what run_one allocated for its workers. */
static void free_workers(run_t *r) {
    if (r->w == NULL) return;
    for (size_t i = 0; i < r->threads; i++) {
        worker_t *w = &r->w[i];
        for (size_t d = 0; d < r->depth; d++) {
            ote_batch_t *b = w->batches[d];
            if (b == NULL) continue;
            ote_status_t st = ote_batch_destroy(b);
            if (ote_status_code(st) == OTE_ERR_BUSY) {
                /* Still in flight after a failure elsewhere: cancel, then destroy. */
                ote_batch_cancel(b);
                ote_batch_wait(b, 10 * OTE_NSEC_PER_SEC);
                st = ote_batch_destroy(b);
            }
            if (st != OTE_OK) print_status("ote_batch_destroy", st);
        }
        free(w->reqs);
        free(w->lat);
    }
    free(r->w);
    r->w = NULL;
}

/* Offset of slot j of batch d of thread t, the same on both sides. */
static uint64_t slot_offset(const run_t *r, size_t t, size_t d, uint64_t j) {
    return (((uint64_t)t * r->depth + d) * r->batch + j) * r->block;
}

/* One result: threads workers, each keeping `depth` batches of `batch` requests of
 * `block` bytes in flight. Returns 0 and fills res (all but check), or -1 when a transfer
 * failed. */
static int run_one(run_t *r, ote_engine_t *engine, bench_result_t *res) {
    const bench_options_t *o = r->o;
    int rc = -1;
    r->w = calloc(r->threads, sizeof r->w[0]);
    if (r->w == NULL) goto err_nomem;
    size_t lat_cap = LAT_SAMPLES_TOTAL / r->threads;
    for (size_t t = 0; t < r->threads; t++) {
        worker_t *w = &r->w[t];
        w->run = r;
        w->idx = t;
        w->rng = 0x9E3779B97F4A7C15ull ^ (t + 1);
        w->reqs = calloc(r->depth * (size_t)r->batch, sizeof w->reqs[0]);
        w->lat = calloc(lat_cap, sizeof w->lat[0]);
        if (w->reqs == NULL || w->lat == NULL) goto err_nomem;
        memset(w->lat, 0, lat_cap * sizeof w->lat[0]); /* fault the pages in now */
        w->lat_cap = lat_cap;
        for (size_t d = 0; d < r->depth; d++) {
            for (uint64_t j = 0; j < r->batch; j++) {
                uint64_t off = slot_offset(r, t, d, j);
                ote_request_t *q = &w->reqs[d * r->batch + j];
                q->opcode = o->op == BENCH_OP_READ ? OTE_READ : OTE_WRITE;
                q->local_addr = r->local + off;
                q->segment = r->seg;
                q->remote_addr = r->remote_base + off;
                q->length = (size_t)r->block;
            }
            ote_status_t st = ote_batch_create(engine, (size_t)r->batch, &w->batches[d]);
            if (st != OTE_OK) {
                print_status("ote_batch_create", st);
                goto err_free;
            }
        }
    }
    if (ote_mutex_init(&r->mu) != OTE_OK) goto err_free;
    if (ote_cond_init(&r->cv) != OTE_OK) goto err_mutex;
    r->ready = r->done = 0;
    r->go = false;
    atomic_store(&r->ops_claimed, 0);
    atomic_store(&r->progress_bytes, 0);
    atomic_store(&r->failed, 0);

    size_t started = 0;
    for (; started < r->threads; started++) {
        int e = pthread_create(&r->w[started].tid, NULL, worker_main, &r->w[started]);
        if (e != 0) {
            fprintf(stderr, "ote_bench: pthread_create: %s\n", strerror(e));
            atomic_store(&r->failed, 1);
            break;
        }
    }

    bool show = o->progress && isatty(STDERR_FILENO);
    bool shown = false;
    ote_mutex_lock(&r->mu);
    while (r->ready < started) ote_cond_wait(&r->cv, &r->mu, ote_deadline_after(OTE_NSEC_PER_SEC));
    r->start_ns = ote_now_ns();
    r->deadline_ns = r->start_ns + o->duration_ns;
    r->go = true;
    ote_cond_broadcast(&r->cv);
    while (r->done < started) {
        ote_cond_wait(&r->cv, &r->mu, ote_deadline_after(250 * OTE_NSEC_PER_MSEC));
        uint64_t now = ote_now_ns();
        if (show && r->done < started && now - r->start_ns > OTE_NSEC_PER_SEC) {
            progress_line(r, now, false);
            shown = true;
        }
    }
    ote_mutex_unlock(&r->mu);
    for (size_t t = 0; t < started; t++) pthread_join(r->w[t].tid, NULL);
    if (shown) progress_line(r, 0, true);

    /* Results. */
    uint64_t end = r->start_ns, bytes = 0, reqs = 0, count = 0, sum = 0;
    size_t kept = 0;
    for (size_t t = 0; t < started; t++) {
        worker_t *w = &r->w[t];
        if (w->end_ns > end) end = w->end_ns;
        bytes += w->bytes;
        reqs += w->requests;
        count += w->lat_count;
        sum += w->lat_sum;
        kept += w->lat_n;
        for (size_t d = 0; d < r->depth; d++) r->covered[t * r->depth + d] = w->covered[d];
        if (w->err != OTE_OK) {
            char bs[32], what[160];
            snprintf(what, sizeof what, "%s %s x%" PRIu64 " thread %zu: %s",
                     bench_op_name(o->op), bench_format_size(r->block, bs, sizeof bs), r->batch,
                     t, w->err_what);
            print_status(what, w->err);
        }
    }
    if (atomic_load(&r->failed) || started < r->threads || g_stop) {
        if (g_stop) fprintf(stderr, "ote_bench: interrupted\n");
        goto err_cond;
    }
    /* All kept samples in one array, sorted once. */
    uint64_t *all = malloc((kept ? kept : 1) * sizeof *all);
    if (all == NULL) goto err_cond;
    size_t k = 0;
    for (size_t t = 0; t < started; t++) {
        memcpy(all + k, r->w[t].lat, r->w[t].lat_n * sizeof *all);
        k += r->w[t].lat_n;
    }
    memset(res, 0, sizeof *res);
    res->transport = o->transport;
    res->op = o->op;
    res->block_size = r->block;
    res->batch_size = r->batch;
    res->threads = r->threads;
    res->bytes = bytes;
    res->requests = reqs;
    res->seconds = (double)(end - r->start_ns) / 1e9;
    bench_latency_summarize(all, kept, sum, count, &res->lat);
    free(all);
    rc = 0;

err_cond:
    ote_cond_destroy(&r->cv);
err_mutex:
    ote_mutex_destroy(&r->mu);
err_free:
    free_workers(r);
    return rc;
err_nomem:
    fprintf(stderr, "ote_bench: out of memory preparing a run\n");
    goto err_free;
}

/* Verify what a run wrote at the destination: each batch's first `covered` slots. */
static bench_check_t check_destination(run_t *r, ctl_client_t *ctl, uint64_t seed) {
    for (size_t t = 0; t < r->threads; t++) {
        for (size_t d = 0; d < r->depth; d++) {
            uint64_t off = slot_offset(r, t, d, 0);
            uint64_t len = r->covered[t * r->depth + d] * r->block;
            if (len == 0) continue;
            uint64_t bad = 0;
            if (r->o->op == BENCH_OP_READ) {
                if (!bench_pattern_check(r->local + off, off, (size_t)len, seed, &bad)) {
                    fprintf(stderr,
                            "ote_bench: check failed: local byte at offset %" PRIu64
                            " differs from the target's\n",
                            bad);
                    return BENCH_CHECK_FAILED;
                }
                continue;
            }
            bench_ctl_msg_t req = {.verb = BENCH_CTL_VERIFY, .a = seed, .b = off, .c = len};
            bench_ctl_msg_t rep;
            if (ctl_call(ctl, &req, &rep) != 0) return BENCH_CHECK_FAILED;
            if (rep.verb == BENCH_CTL_BAD) {
                fprintf(stderr,
                        "ote_bench: check failed: the target's byte at offset %" PRIu64
                        " differs from what was written\n",
                        rep.a);
                return BENCH_CHECK_FAILED;
            }
            if (rep.verb != BENCH_CTL_OK) return BENCH_CHECK_FAILED;
        }
    }
    return BENCH_CHECK_OK;
}

static int run_initiator(const bench_options_t *o) {
    int rc = 1;
    child_t child = {.pid = 0, .lifeline = -1};
    bool quit_sent = false;
    char target[BENCH_ADDR_MAX];
    uint64_t raddr = 0, rlen = 0;
    uint64_t ws = bench_working_set(o);
    char listen[BENCH_ADDR_MAX] = "";
    ote_engine_t *engine = NULL;
    ote_segment_t *seg = NULL;
    uint8_t *local = NULL;
    bool registered = false;
    ote_status_t st;

    if (o->target[0] == '\0') {
        uint64_t bufsz = o->buffer_size != 0 ? o->buffer_size : ws;
        if (bufsz < BENCH_BUFFER_MIN) bufsz = BENCH_BUFFER_MIN;
        if (spawn_target(o, bufsz, &child, target, sizeof target, &raddr, &rlen) != 0)
            goto out;
        snprintf(listen, sizeof listen, "%s", o->listen[0] ? o->listen : "127.0.0.1:0");
    } else {
        snprintf(target, sizeof target, "%s", o->target);
        if (o->listen[0] != '\0')
            snprintf(listen, sizeof listen, "%s", o->listen);
        else if (route_local_address(o->target, listen, sizeof listen) != 0)
            listen[0] = '\0'; /* engine default */
        if (o->have_remote) {
            raddr = o->remote_addr;
            rlen = o->remote_len;
        }
    }

    st = make_engine(o, listen, &engine);
    if (st != OTE_OK) {
        print_status("ote_engine_create", st);
        goto out;
    }
    st = ote_segment_open(engine, target, &seg);
    if (st != OTE_OK) {
        char what[BENCH_ADDR_MAX + 32];
        snprintf(what, sizeof what, "ote_segment_open(%s)", target);
        print_status(what, st);
        goto out;
    }
    ctl_client_t ctl = {.engine = engine, .seg = seg, .next_id = 0, .target = target};
    if (raddr == 0) {
        bench_ctl_msg_t req = {.verb = BENCH_CTL_INFO}, rep;
        if (ctl_call(&ctl, &req, &rep) != 0) goto out;
        if (rep.a == 0 || rep.b == 0) {
            fprintf(stderr, "ote_bench: the target %s reported no buffer\n", target);
            goto out;
        }
        raddr = rep.a;
        rlen = rep.b;
    }
    char a[32], b[32];
    if (ws > rlen) {
        fprintf(stderr,
                "ote_bench: threads * depth * batch * block = %s bytes does not fit the target's "
                "%s-byte buffer (start the target with a larger --buffer-size)\n",
                bench_format_size(ws, a, sizeof a), bench_format_size(rlen, b, sizeof b));
        goto out;
    }
    local = map_buffer(ws);
    if (local == NULL) {
        fprintf(stderr, "ote_bench: cannot map a %" PRIu64 "-byte local buffer: %s\n", ws,
                strerror(errno));
        goto out;
    }
    if (strcmp(o->transport, "tcp") != 0) {
        /* TCP needs no registration of local buffers (ote.h); other transports do. */
        st = ote_memory_register(engine, local, (size_t)ws, OTE_PERM_READ | OTE_PERM_WRITE);
        if (st != OTE_OK) {
            print_status("ote_memory_register (local buffer)", st);
            goto out;
        }
        registered = true;
    }

    if (!o->json) {
        char hdr[256];
        printf("# ote_bench: %s %s against %s%s; %s per result; %" PRIu64
               " batch(es) in flight per thread\n",
               o->transport, bench_op_name(o->op), target,
               child.pid ? " (child on loopback)" : "",
               o->total_bytes ? "fixed bytes" : "fixed time", o->depth);
        printf("# GB/s = 10^9 bytes/s; ops/s = requests/s; latency per batch (submit to "
               "wait return), microseconds\n");
        bench_format_table_header(hdr, sizeof hdr);
        printf("%s\n", hdr);
        fflush(stdout);
    }

    bool any_failed = false;
    uint64_t result_idx = 0;
    for (size_t i = 0; i < o->n_block_sizes && !any_failed; i++)
        for (size_t j = 0; j < o->n_batch_sizes && !any_failed; j++)
            for (size_t k = 0; k < o->n_threads && !any_failed; k++) {
                run_t r;
                memset(&r, 0, sizeof r);
                r.o = o;
                r.seg = seg;
                r.local = local;
                r.remote_base = raddr;
                r.block = o->block_sizes[i];
                r.batch = o->batch_sizes[j];
                r.threads = (size_t)o->threads[k];
                r.depth = (size_t)o->depth;
                if (o->total_bytes != 0)
                    r.total_ops = (o->total_bytes + r.block - 1) / r.block;
                uint64_t region = r.block * r.batch * r.depth * r.threads;
                uint64_t seed = ((uint64_t)getpid() << 20) ^ (++result_idx);

                if (o->check) {
                    if (o->op == BENCH_OP_WRITE) {
                        bench_pattern_fill(local, 0, (size_t)region, seed);
                        bench_ctl_msg_t req = {.verb = BENCH_CTL_ZERO, .a = 0, .b = region}, rep;
                        if (ctl_call(&ctl, &req, &rep) != 0) goto out;
                        if (o->test_corrupt) local[region / 2] ^= 0x5a;
                    } else {
                        bench_ctl_msg_t req = {.verb = BENCH_CTL_FILL, .a = seed, .b = 0,
                                               .c = region},
                                        rep;
                        if (ctl_call(&ctl, &req, &rep) != 0) goto out;
                        memset(local, 0, (size_t)region);
                    }
                }

                bench_result_t res;
                if (run_one(&r, engine, &res) != 0) goto out;
                res.check = BENCH_CHECK_OFF;
                if (o->check) {
                    if (o->op == BENCH_OP_READ && o->test_corrupt) local[region / 2] ^= 0x5a;
                    res.check = check_destination(&r, &ctl, seed);
                    if (res.check == BENCH_CHECK_FAILED) any_failed = true;
                }
                char line[512];
                if (o->json)
                    bench_format_json(&res, line, sizeof line);
                else
                    bench_format_table_row(&res, line, sizeof line);
                printf("%s\n", line);
                fflush(stdout);
            }
    rc = any_failed ? 1 : 0;

out:
    if (child.pid > 0 && seg != NULL && !g_stop) {
        ctl_client_t q = {.engine = engine, .seg = seg, .next_id = 1000000, .target = target};
        bench_ctl_msg_t req = {.verb = BENCH_CTL_QUIT}, rep;
        quit_sent = ctl_call(&q, &req, &rep) == 0;
    }
    if (seg != NULL) {
        st = ote_segment_close(seg);
        if (st != OTE_OK) print_status("ote_segment_close", st);
    }
    if (registered) {
        st = ote_memory_unregister(engine, local);
        if (st != OTE_OK) print_status("ote_memory_unregister", st);
    }
    if (engine != NULL) {
        st = ote_engine_destroy(engine);
        if (st != OTE_OK) {
            print_status("ote_engine_destroy", st);
            rc = 1;
        }
    }
    if (local != NULL) munmap(local, (size_t)ws);
    if (reap_child(&child, quit_sent) != 0) rc = 1;
    return rc;
}

int main(int argc, char **argv) {
    bench_options_t o;
    char err[512];
    int p = bench_options_parse(argc, argv, &o, err, sizeof err);
    if (p == 1) {
        fputs(bench_usage(), stdout);
        return 0;
    }
    if (p != 0) {
        fprintf(stderr, "ote_bench: %s\nTry 'ote_bench --help'.\n", err);
        return 2;
    }
    install_signals();
    return o.role == BENCH_ROLE_TARGET ? run_target(&o) : run_initiator(&o);
}

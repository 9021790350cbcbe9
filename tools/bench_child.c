/*
 * tools/bench_child.c - the initiator's side of a target: the target child it spawns on
 * loopback (fork+exec of this binary, its report line, its end), the control client that
 * sends it requests as notifications and waits for the replies, and the local address
 * that routes to a remote target.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <ote/ote.h>

#include "base/time.h"
#include "tools/bench_internal.h"
#include "tools/bench_lib.h"

/* fork+exec this binary as --role target on loopback and read its report line. */
int bench__spawn_target(const bench_options_t *o, uint64_t buffer_size, child_t *child, char *addr,
                        size_t addr_len, uint64_t *raddr, uint64_t *rlen) {
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
    char mem_s[BENCH_PATH_MAX + 8];
    if (o->remote_mem == BENCH_MEM_FILE) snprintf(mem_s, sizeof mem_s, "file:%s", o->remote_file);
    else bench_mem_name(o->remote_mem, mem_s, sizeof mem_s);
    char *argv[] = {exe,
                    "--role",
                    "target",
                    "--transport",
                    (char *)o->transport,
                    "--listen",
                    "127.0.0.1:0",
                    "--buffer-size",
                    size_s,
                    "--report-fd",
                    fd_s,
                    "--remote-mem",
                    mem_s,
                    o->remote_ipc ? "--remote-ipc" : NULL,
                    NULL};
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
        if (got == sizeof line - 1 || bench__stop) goto bad_report;
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
int bench__reap_child(child_t *c, bool asked_to_quit) {
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
        fprintf(stderr, "ote_bench: the target child exited with status %d\n", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        fprintf(stderr, "ote_bench: the target child died of signal %d\n", WTERMSIG(status));
    return 1;
}

/* Send a request to the target and wait for the reply with the same id. */
int bench__ctl_call(ctl_client_t *c, bench_ctl_msg_t *req, bench_ctl_msg_t *rep) {
    char msg[MSG_MAX];
    req->id = ++c->next_id;
    if (c->local != NULL) { /* --local-mem file:PATH: our own file, no target */
        memset(rep, 0, sizeof(*rep));
        rep->id = req->id;
        if (!bench__mem_serve(c->local, c->local->len, req, rep)) rep->verb = BENCH_CTL_OK;
        if (rep->verb == BENCH_CTL_ERR) fprintf(stderr, "ote_bench: %s\n", rep->text);
        return rep->verb == BENCH_CTL_ERR ? -1 : 0;
    }
    int n = bench_ctl_format(req, msg, sizeof msg);
    if (n < 0) return -1;
    ote_status_t st = ote_notify_send(c->engine, c->seg, msg, (size_t)n);
    if (st != OTE_OK) {
        bench__print_status("sending a control request to the target", st);
        return -1;
    }
    ote_deadline_t dl = ote_deadline_after(CTL_TIMEOUT_NS);
    for (;;) {
        if (bench__stop) return -1;
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
            bench__print_status("waiting for the target's reply", st);
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
int bench__route_local_address(const char *target, char *out, size_t out_len) {
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
            getnameinfo((struct sockaddr *)&ss, sl, ip, sizeof ip, NULL, 0, NI_NUMERICHOST) == 0) {
            if (ss.ss_family == AF_INET6) snprintf(out, out_len, "[%s]:0", ip);
            else snprintf(out, out_len, "%s:0", ip);
            rc = 0;
        }
        close(fd);
    }
    freeaddrinfo(ai);
    return rc;
}

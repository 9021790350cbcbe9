/* tests/util/sync_point.h - shows ThreadSanitizer an order between processes that it
 * cannot see: for the test programs that drive another process through a pipe or an
 * inherited socket (tests/engine/ote_target.c, ote_gpu_target.c and target.cc on the test
 * side; tests/verbs/multiprocess_common.h on both sides).
 *
 * A test tells a peer process to read or write memory (fill, sum) only after the
 * transfers it waited for completed, and starts transfers only after the peer answered.
 * The engine (or the sim's progress thread) touches that memory before it answers a
 * request over a socket, and after it read one from a socket. So every access is ordered,
 * but through the other process, which ThreadSanitizer cannot follow: it reported a
 * process's own hash of memory that its engine had written (a race only in its model).
 * It does model sockets, though: with its default io_sync=1 every send on a socket of a
 * process happens before every later receive on a socket of that process. One datagram
 * through a socket of the process's own, after a command or answer arrives and before one
 * leaves, shows ThreadSanitizer the order that really holds, and nothing more: a thread
 * that touched the memory after answering, or before reading the request, would still be
 * reported. (A socketpair or pipe would not do: ThreadSanitizer gives each its own
 * clock.) Without ThreadSanitizer it does nothing. C and C++, any thread.
 */
#ifndef OTE_TESTS_UTIL_SYNC_POINT_H
#define OTE_TESTS_UTIL_SYNC_POINT_H

#if defined(__SANITIZE_THREAD__)
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#endif

/* Called after a message from the other process arrived and before one is sent to it. */
static inline void ote_test_sync_point(void) {
#if defined(__SANITIZE_THREAD__)
    /* An abstract datagram socket connected to itself (autobind names it), closed again:
     * no descriptor outlives the call (the test fixture counts them). */
    struct sockaddr_un a;
    memset(&a, 0, sizeof(a));
    a.sun_family = AF_UNIX;
    socklen_t len = sizeof(a);
    char b = 0;
    int s = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0) return;
    if (bind(s, (struct sockaddr *)&a, sizeof(sa_family_t)) == 0 &&
        getsockname(s, (struct sockaddr *)&a, &len) == 0 &&
        connect(s, (struct sockaddr *)&a, len) == 0 && send(s, &b, 1, 0) == 1)
        (void)recv(s, &b, 1, 0);
    close(s);
#endif
}

#endif

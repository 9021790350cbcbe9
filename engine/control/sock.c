/* engine/control/sock.c - deadline-bounded handshake steps (see sock.h). */
#include "engine/control/sock.h"

#include <errno.h>
#include <poll.h>

#include "base/le.h"

ote_status_t ote_ctl_wait_fd(int fd, short events, ote_deadline_t dl) {
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        int ms = ote_deadline_remaining_ms(dl, 1000);
        if (ms == 0 && ote_deadline_expired(dl)) return OTE_ERR_TIMEOUT;
        int r = poll(&p, 1, ms);
        if (r > 0) return OTE_OK;
        if (r < 0 && errno != EINTR) return ote_status_from_errno(errno);
    }
}

ote_status_t ote_ctl_connect(int fd, const struct sockaddr *sa, socklen_t sl, ote_deadline_t dl) {
    if (connect(fd, sa, sl) == 0) return OTE_OK;
    int err = errno;
    if (err == EINPROGRESS) {
        ote_status_t st = ote_ctl_wait_fd(fd, POLLOUT, dl);
        if (st != OTE_OK) return OTE_ERR_TIMEOUT;
        socklen_t el = sizeof(err);
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0) err = errno;
    }
    return err == 0 ? OTE_OK : ote_status_make(OTE_ERR_CONNECT, err);
}

static ote_status_t xfer_all(int fd, uint8_t *b, size_t len, int out, ote_deadline_t dl) {
    while (len > 0) {
        ssize_t r =
            out ? send(fd, b, len, MSG_NOSIGNAL | MSG_DONTWAIT) : recv(fd, b, len, MSG_DONTWAIT);
        if (r > 0) {
            b += r;
            len -= (size_t)r;
            continue;
        }
        if (r == 0) return OTE_ERR_PEER_LOST;
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return ote_status_make(OTE_ERR_PEER_LOST, errno);
        ote_status_t st = ote_ctl_wait_fd(fd, out ? POLLOUT : POLLIN, dl);
        if (st != OTE_OK) return st;
    }
    return OTE_OK;
}

ote_status_t ote_ctl_send_all(int fd, const uint8_t *b, size_t len, ote_deadline_t dl) {
    return xfer_all(fd, (uint8_t *)b, len, 1, dl); /* send() only reads it */
}

ote_status_t ote_ctl_recv_all(int fd, uint8_t *b, size_t len, ote_deadline_t dl) {
    return xfer_all(fd, b, len, 0, dl);
}

ote_status_t ote_ctl_recv_frame(int fd, uint8_t *buf, size_t cap, ote_ctl_msg_t *m,
                                ote_deadline_t dl) {
    if (cap < OTE_CTL_HDR_LEN) return OTE_ERR_INVALID;
    ote_status_t st = ote_ctl_recv_all(fd, buf, OTE_CTL_HDR_LEN, dl);
    if (st != OTE_OK) return st;
    size_t used = 0;
    st = ote_ctl_decode(buf, OTE_CTL_HDR_LEN, m, &used); /* a bad header fails here */
    if (st != OTE_ERR_AGAIN) return st;
    uint32_t body = ote_le_get32(buf + 20); /* the header's length field */
    if (body > cap - OTE_CTL_HDR_LEN) return OTE_ERR_PROTOCOL;
    st = ote_ctl_recv_all(fd, buf + OTE_CTL_HDR_LEN, body, dl);
    return st == OTE_OK ? ote_ctl_decode(buf, OTE_CTL_HDR_LEN + body, m, &used) : st;
}

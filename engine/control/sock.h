/*
 * engine/control/sock.h - the blocking steps of a control handshake over a non-blocking
 * socket, each bounded by one deadline: connect, send or receive a whole buffer, receive
 * one control frame. Used where a thread waits for one short exchange (the router's INFO
 * handshake, buffer discovery, the TCP transport's connection setup); the transports'
 * data paths never block.
 */
#ifndef OTE_ENGINE_CONTROL_SOCK_H
#define OTE_ENGINE_CONTROL_SOCK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "base/status.h"
#include "base/time.h"
#include "engine/control/ctl.h"

/* Wait until fd has one of events: OTE_OK, OTE_ERR_TIMEOUT at dl, or poll's errno. */
ote_status_t ote_ctl_wait_fd(int fd, short events, ote_deadline_t dl);

/* Connect non-blocking fd to sa by dl: OTE_OK, OTE_ERR_TIMEOUT, or OTE_ERR_CONNECT
 * carrying the errno (ote_status_errno). */
ote_status_t ote_ctl_connect(int fd, const struct sockaddr *sa, socklen_t sl, ote_deadline_t dl);

/* All len bytes, by dl: OTE_OK, OTE_ERR_TIMEOUT, or OTE_ERR_PEER_LOST (closed, or a
 * socket error whose errno it carries). */
ote_status_t ote_ctl_send_all(int fd, const uint8_t *b, size_t len, ote_deadline_t dl);
ote_status_t ote_ctl_recv_all(int fd, uint8_t *b, size_t len, ote_deadline_t dl);

/* One whole control frame into buf (cap bytes, at least OTE_CTL_HDR_LEN), decoded into
 * *m (which may point into buf). OTE_ERR_PROTOCOL when the header names a body larger
 * than buf holds; otherwise ote_ctl_decode's status, or a send/recv status above. */
ote_status_t ote_ctl_recv_frame(int fd, uint8_t *buf, size_t cap, ote_ctl_msg_t *m,
                                ote_deadline_t dl);

#endif

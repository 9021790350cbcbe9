/*
 * verbs/sim/sim.h - control API of the software RC provider ("sim").
 *
 * The sim is opened like any provider: ote_verbs_open("sim", config, &v). Each instance
 * runs two progress threads, owns its devices and reaches other instances (in this or
 * another process) over abstract UNIX-domain stream sockets: every valid GID of a port
 * is a listening socket named "\0orbitte-sim/<32 hex digits of the GID>", so a peer that
 * learned a GID and a QP number out of band (as on RoCE) connects to exactly that port.
 *
 * Threads. Each connection (one per sending QP, to its destination QP) is serviced by one
 * of the instance's two progress threads: requester connections go to them in turn, and
 * the accepting end of a connection from the same instance joins its requester's thread,
 * so one QP pair's traffic stays on one thread (its completions in order) and two pairs
 * copy in parallel. The payload copies (socket sendmsg/readv and the staging memcpy) run
 * outside the provider's lock; dereg_mr, dealloc_mw, invalidation and a QP's move to ERR
 * wait for a copy in flight on the memory they withdraw, so once they return no byte of it
 * is read or written (as on a NIC).
 *
 * Configuration (the config argument, else $OTE_SIM_CONFIG, else the default). Items
 * are separated by ';', each item is a comma-separated list of key=value whose first
 * key says what it is:
 *
 *   dev=NAME[,numa=N][,profile=NAME]           start a device (at most 8) of that profile
 *   port[=N][,state=active|down|init][,mtu=NETDEV_MTU][,link=eth|ib][,lid=N][,gids=LEN]
 *                                              add a port to the last device (at most 4;
 *                                              mtu 1500 -> IBV_MTU_1024, 9000 -> 4096;
 *                                              gids = gid_tbl_len, default 16)
 *        [,bw=RATE]                            RATE: egress limit of the port in bytes
 *                                              per second, digits with an optional K, M
 *                                              or G (powers of 1000); 0 or absent: none
 *   gid=ADDR[,type=v1|v2|ib][,index=I]         add a GID to the last port. ADDR is an
 *                                              IPv6 literal, an IPv4 address (stored
 *                                              IPv4-mapped), or auto-v4 / auto-ll /
 *                                              auto-v6: derived from a per-process unique
 *                                              24-bit port id (::ffff:10.X.Y.Z,
 *                                              fe80::XX:XXff:feXX:XXXX, fd5e:...::XXXXXX)
 *   profile=NAME                               the profile of every device that names
 *                                              none (once, anywhere in the text)
 *   retry_cap_ms=N                             upper bound on the time before outstanding
 *                                              WRs fail with IBV_WC_RETRY_EXC_ERR when
 *                                              the peer is gone (default 3000;
 *                                              $OTE_SIM_RETRY_CAP_MS overrides)
 *
 * Fault schedule ($OTE_SIM_INJECT, read at open; for tools such as ote_bench that cannot
 * call the control API below): comma-separated items
 *   cq_error=N    after N CQEs polled from this instance (all its CQs together), the CQ
 *                 of that poll fails as ote_sim_cq_error() makes it (once)
 *   gid_change=N  after N CQEs polled, every IPv4-mapped GID of that CQ's device's port 1
 *                 is renumbered (10.x.y.z -> 11.x.y.z) with GID_CHANGE (once)
 * A malformed value makes open fail (OTE_ERR_INVALID, logged).
 *
 * The default is
 *   dev=sim0,numa=0;port;gid=auto-ll,type=v1;gid=auto-ll,type=v2;gid=auto-v4,type=v1;
 *   gid=auto-v4,type=v2;dev=sim1,numa=1;port;gid=auto-ll,type=v1;gid=auto-ll,type=v2;
 *   gid=auto-v4,type=v1;gid=auto-v4,type=v2
 * (ports default to state=active, mtu=1500, link=eth). Auto GIDs are unique among all
 * sim instances on the host (the sim retries another id until its listening socket
 * name is free), so two processes using the default can tell each other apart. An
 * explicit GID that another instance already holds makes open fail (OTE_ERR_EXISTS).
 *
 * Device profiles. Each device has one: its own profile= option, else the global
 * profile= item, else $OTE_SIM_PROFILE (an unknown name makes open fail), else "mlx5".
 * query_device / query_device_ex report its limits and the verbs enforce them as a NIC
 * does: create_qp with max_send_wr/max_recv_wr > max_qp_wr, an SGE count > max_sge or
 * max_inline_data over the inline size -> EINVAL; create_cq with cqe > max_cqe -> EINVAL;
 * modify_qp with max_rd_atomic > max_qp_init_rd_atom or max_dest_rd_atomic >
 * max_qp_rd_atom -> EINVAL (max_sge_rd is reported, not enforced at post).
 *
 *              max_qp_wr max_sge max_sge_rd max_cqe  inline rd_atom(resp/init) srq_wr srq_sge
 *   mlx5       32768     30      30         4194303  220    16/16              32767  31
 *   rxe        16384     32      32         32767    400    128/128            16384  27
 *   nomw       32768     30      30         4194303  220    16/16              32767  31
 *   small      512       2       1          1024     64     4/4                512    2
 *
 *   mlx5 (ConnectX-like): type-2B windows; scatter-to-CQE: device_flags reports
 *     OTE_VERBS_DEV_SCATTER_TO_CQE | OTE_VERBS_DEV_SCATTER_OPT_OUT, and a signalled
 *     RDMA_READ of at most 64 bytes with a destination SGE in a dma-buf MR, on a QP
 *     created without OTE_VERBS_QP_NO_SCATTER_TO_CQE, fails loudly: it completes with
 *     IBV_WC_LOC_PROT_ERR (the QP goes to ERR), an ERROR naming the hazard is logged and
 *     ote_sim_scatter_hazards() counts it (libmlx5 would copy the response out of the CQE
 *     with the CPU: into GPU memory, a fault). An unsignalled READ, a longer one, or one
 *     on a QP created with the flag moves the bytes.
 *   rxe (soft-RoCE): type-2B windows, no scatter-to-CQE (device_flags 0).
 *   nomw: mlx5's limits without memory windows (no IBV_DEVICE_MEM_WINDOW* flag, max_mw 0,
 *     alloc_mw of any type EOPNOTSUPP) and without the scatter hazard (device_flags 0).
 *   small: a constrained RNIC; type-2B windows, no scatter-to-CQE.
 * Every profile accepts OTE_VERBS_QP_NO_SCATTER_TO_CQE in create_qp_flags (honoured
 * trivially where there is no scatter-to-CQE); qp_flags reads it back.
 *
 * Where the sim differs from a NIC (see VERBS_FACTS.md for the NIC side):
 * - RC only (other QP types: EOPNOTSUPP); no atomics (atomic_cap NONE, atomic
 *   opcodes EINVAL at post); type-1 windows EOPNOTSUPP; no alternate paths/APM,
 *   COMM_EST or LID routing (a GRH is required on IB ports too).
 * - One message is one transfer: PSNs advance by packets (length / path MTU) but the
 *   data is not cut into MTU packets, so no MTU-size drops; duplicates and out-of-order
 *   PSNs are dropped silently (a NIC NAKs a sequence error once), so a PSN mismatch ends
 *   in RETRY_EXC_ERR.
 * - Retry exceeded: no retransmission; when the peer's socket closes (process died) the
 *   WRs fail after min(4.096 us * 2^timeout * (retry_cnt+1), cap), when the peer is
 *   alive but silent (its QP gone, in ERR, or its port down) after max(that, 1 s)
 *   capped likewise; timeout 0 (infinite on a NIC) means the cap. The clock runs from
 *   the last bytes sent or received on the QP's connection, and a live peer counts as
 *   silent only once it has read everything sent to it, nothing is queued either way, and
 *   its last word was that it dropped a request (an internal DROP frame: its QP gone, in
 *   ERR or not ready, its port down, a PSN out of sequence, a READ response withdrawn)
 *   about requests sent since the QP's last go-back (an RNR NAK's: the drops of what was
 *   sent before it say nothing of the resent requests):
 *   a peer process that is stopped or starved of CPU, or one that read requests and has
 *   not answered them yet (a NIC would ACK without that CPU), a wait for the port's own
 *   egress tokens, or answers not yet read here restart the clock, so such WRs stay
 *   outstanding until the peer runs again or its process exits.
 * - CQ overrun: poll_cq on the CQ fails with -EIO from then on; the NIC may keep
 *   returning (corrupt) entries. destroy_cq/destroy_qp with unacked events wait up to
 *   1 s, then fail EBUSY (rdma-core blocks); close_device with children fails EBUSY
 *   (rdma-core returns 0 and leaks). Repeated arming before get_cq_event coalesces into
 *   one channel event per CQ. Blocking get_cq_event/get_async_event wait as long as the
 *   verb does (the caller chose a blocking fd).
 * - Responder errors: write to an MR without QP REMOTE_WRITE access -> requester
 *   REM_INV_REQ_ERR (as rxe); WRITE_WITH_IMM protection error -> responder LOC_ACCESS_ERR;
 *   bad SEND_WITH_INV rkey -> requester REM_INV_REQ_ERR, responder LOC_QP_OP_ERR.
 *   max_dest_rd_atomic is not enforced at the responder; max_rd_atomic 0 acts as 1.
 *   SEND_WITH_INV of a type-2 window bound to another QP fails like a bad rkey (IBA);
 *   LOCAL_INV checks the PD only (as rxe). A requester takes an ACK in place of a READ
 *   response (or a READ response for another request) as IBV_WC_BAD_RESP_ERR, QP to ERR.
 * - SRQs (srq.c): a WQE taken by a message that does not complete (its QP left
 *   RTR/RTS/SQD, its connection closed) goes back to the SRQ's front with no completion
 *   (rxe drops it, mlx5 may flush it on that QP); max_srq is not enforced; resizing
 *   (modify_srq IBV_SRQ_MAX_WR) is EINVAL, as on mlx5.
 * - Connections are stricter than RC on a NIC: a responder QP accepts a connection only
 *   while in RTR/RTS/SQD, on its own port, from its RTR destination (the HELLO's source
 *   QPN = dest_qp_num, source GID = dgid, and that GID held by the connecting process,
 *   checked with SO_PEERCRED), once per connection; anything else is closed (the sender's
 *   WRs end in RETRY_EXC_ERR). So the requester's sgid must be the GID its peer uses as dgid.
 * - dma-buf MRs (reg_dmabuf_mr): the fd is any mappable file with a size (a memfd stands in
 *   for a GPU's dma-buf). The sim maps [page of offset, offset+length) of it MAP_SHARED and
 *   reads and writes the MR's bytes through that mapping, so the registering process never
 *   needs to address them; requests and SGEs address them at [iova, iova+length). Errors
 *   follow the kernel: iova and offset at different page offsets, unknown or MW_BIND
 *   access, REMOTE_WRITE/ATOMIC without LOCAL_WRITE, length 0, or a range past the file's
 *   size -> EINVAL; a bad fd -> EBADF; an fd that cannot be mapped -> EINVAL (another
 *   mmap failure: its errno). The mapping keeps the memory alive after the caller closes
 *   the fd; dereg revokes like any MR (below) and then unmaps it.
 * - Payloads are zero-copy (read from / written to registered memory by the socket calls).
 *   A responder starts no request on a connection until the READ response ahead of it is
 *   fully sent. Dereg, dealloc_mw, invalidation (local or remote) and a move to ERR drop
 *   every reference to that memory before they return, without waiting: an inbound payload
 *   is read and discarded (then NAK, responder QP to ERR; silent when the QP left RTS), a
 *   READ response not yet started becomes an access NAK (REM_ACCESS_ERR), and a READ
 *   response or request partly sent closes its connection (RETRY_EXC_ERR at the requester).
 */
#ifndef OTE_VERBS_SIM_SIM_H
#define OTE_VERBS_SIM_SIM_H

#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "verbs/verbs.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The default configuration text (see above). */
const char *ote_sim_default_config(void);

/* True when v is a sim instance (the control calls below fail with OTE_ERR_INVALID on
 * anything else, e.g. a fault decorator: pass the inner instance). */
int ote_sim_is_sim(const ote_verbs_t *v);

/* Port state: IBV_PORT_DOWN raises IBV_EVENT_PORT_ERR, IBV_PORT_ACTIVE raises
 * IBV_EVENT_PORT_ACTIVE on every context open on the device. While a port is down its
 * QPs neither send nor accept requests, so outstanding WRs end in RETRY_EXC_ERR. */
ote_status_t ote_sim_set_port_state(ote_verbs_t *v, const char *dev, uint8_t port,
                                    enum ibv_port_state state);

/* Egress limit of a port in bytes per second (0: none), as the config's bw=: every byte
 * the port's connections send (WRITE and SEND payloads, READ responses, headers, ACKs)
 * waits for a token of a bucket that refills at that rate (burst: max(10 ms of traffic,
 * 4 quanta of 1 ms, 4 KiB to 256 KiB each)); waiting sleeps, it does not spin. Only the
 * sending side is limited (a READ is paced by the responder's port). */
ote_status_t ote_sim_set_port_bw(ote_verbs_t *v, const char *dev, uint8_t port,
                                 uint64_t bytes_per_sec);

/* Bytes the port's connections have handed to their sockets since open (all traffic). */
ote_status_t ote_sim_port_tx_bytes(ote_verbs_t *v, const char *dev, uint8_t port,
                                   uint64_t *bytes_out);

/* Of those, the payload bytes (WRITE and SEND data, READ responses): no frame headers, so
 * no ACK, NAK or word of a dropped request. */
ote_status_t ote_sim_port_tx_payload_bytes(ote_verbs_t *v, const char *dev, uint8_t port,
                                           uint64_t *bytes_out);

/* Set (gid != NULL) or delete (gid == NULL) GID table entry index; raises
 * IBV_EVENT_GID_CHANGE. The new GID becomes reachable at once; a deleted one does not
 * accept new connections. OTE_ERR_EXISTS when another instance holds that GID. */
ote_status_t ote_sim_set_gid(ote_verbs_t *v, const char *dev, uint8_t port, int index,
                             const union ibv_gid *gid, enum ibv_gid_type type);

/* Move qp to ERR as a catastrophic WQ error would: IBV_EVENT_QP_FATAL, then flush. */
ote_status_t ote_sim_qp_fatal(ote_verbs_t *v, struct ibv_qp *qp);

/* Make cq unusable as an overrun does: poll_cq on it fails with -EIO from now on,
 * IBV_EVENT_CQ_ERR names it, and its QPs get IBV_EVENT_QP_FATAL and go to ERR (their
 * flushes are lost with the CQ). */
ote_status_t ote_sim_cq_error(ote_verbs_t *v, struct ibv_cq *cq);

/* Raise IBV_EVENT_DEVICE_FATAL on every context of dev (nothing else changes). */
ote_status_t ote_sim_device_fatal(ote_verbs_t *v, const char *dev);

/* Effective cap on the retry-exceeded time, in milliseconds. */
uint32_t ote_sim_retry_cap_ms(const ote_verbs_t *v);

/* What one QP of the instance is connected with: the address vector and path MTU of its
 * last move to RTR (what a NIC would put on the wire: GRH traffic class, service level). */
typedef struct ote_sim_qp_path {
    char dev[64];
    uint32_t qp_num;
    enum ibv_qp_state state;
    uint8_t sgid_index;
    uint8_t traffic_class;
    uint8_t sl;
    enum ibv_mtu path_mtu;
} ote_sim_qp_path_t;

/* The instance's QPs in RTR, RTS or SQD, at most cap of them into out (creation order);
 * *n_out = how many there are (may exceed cap). */
ote_status_t ote_sim_qp_paths(const ote_verbs_t *v, ote_sim_qp_path_t *out, size_t cap,
                              size_t *n_out);

/* Number of devices of the instance. */
int ote_sim_device_count(const ote_verbs_t *v);

/* The profile of device dev ("mlx5", "rxe", "nomw", "small"; a static string).
 * OTE_ERR_NOT_FOUND for an unknown device. */
ote_status_t ote_sim_device_profile(const ote_verbs_t *v, const char *dev, const char **name_out);

/* Scatter-to-CQE hazards every sim instance of the process has failed (see "Device
 * profiles" above), since the process started. */
uint64_t ote_sim_scatter_hazards(void);

/* RNR NAKs sent by every sim instance of the process (a SEND or WRITE_WITH_IMM that found
 * no posted receive), since the process started. */
uint64_t ote_sim_rnr_naks(void);

/* Test hook inside the sim's copies (every instance of the process). A connection's bytes
 * move outside the provider's lock, on the progress thread that owns the connection (see
 * "Threads" above); fn, when set, runs on that thread at the start of each such copy,
 * before any byte moves: qp_num is the connection's local QP (0: not bound yet), dir
 * OTE_SIM_COPY_TX (sendmsg from frames) or OTE_SIM_COPY_RX (into destination memory), len
 * the most bytes of registered memory the copy may touch (0: headers only). A hook that
 * blocks holds that one copy (and every verb that must wait for it: dereg, dealloc,
 * invalidation of memory it touches); other connections go on. NULL clears it. */
enum { OTE_SIM_COPY_TX = 0, OTE_SIM_COPY_RX = 1 };
typedef void (*ote_sim_copy_hook_t)(void *arg, uint32_t qp_num, int dir, size_t len);
void ote_sim_set_copy_hook(ote_sim_copy_hook_t fn, void *arg);

#ifdef __cplusplus
}
#endif
#endif

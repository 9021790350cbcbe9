/*
 * verbs/sim/sim_internal.h - private objects of the software RC provider.
 *
 * One provider instance (sim_prov_t) owns its devices (from the configuration),
 * SIM_THREADS progress threads (each with its own epoll set), the listening sockets of its
 * GIDs and every connection. The verbs objects (context, PD, MR, MW, CQ, channel, QP)
 * embed rdma-core's structs and are recovered with the to_sim_*() helpers.
 *
 * Locking: prov->mu protects every object's state, the key table, the QP table, all
 * connections and queues. Each CQ also has cq->mu for its ring and arming so that
 * poll_cq and req_notify_cq never wait for the progress thread; order is prov->mu then
 * cq->mu. Every producer of CQEs holds prov->mu.
 *
 * Copies outside prov->mu: each connection has one owner thread (conn->owner), the only
 * thread that reads or writes its socket. The owner moves bytes (sendmsg from frames,
 * read/readv and the staging memcpy into destination iovs) in an I/O section
 * (ote__sim_io_enter/leave): it takes conn->io_mu and sets conn->io_busy under prov->mu,
 * drops prov->mu, copies from iovs it built under the lock, releases io_mu, retakes
 * prov->mu and only then applies the result. So the connections of different threads copy
 * in parallel. Anything that withdraws memory from a connection (revocation, QP to ERR,
 * close) waits for that connection's copy in flight (ote__sim_io_wait: io_mu, taken with
 * prov->mu held; order prov->mu then conn->io_mu, and an owner never takes prov->mu while
 * it holds io_mu), so no byte of revoked memory moves once the revoking verb returns.
 */
#ifndef OTE_VERBS_SIM_SIM_INTERNAL_H
#define OTE_VERBS_SIM_SIM_INTERNAL_H

/* Compiled only inside the verbs library (Bazel local_defines, never passed on to
 * dependents): an outside file that includes this header fails here. */
#ifndef OTE__INSIDE_VERBS
#error \
    "verbs/sim/sim_internal.h is internal to OrbitTE's verbs layer; include verbs/sim/sim.h instead"
#endif

#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "base/alloc.h"
#include "base/hash.h"
#include "base/lock.h"
#include "base/log.h"
#include "base/status.h"
#include "base/time.h"
#include "verbs/sim/sim.h"
#include "verbs/verbs.h"

/* RNR NAKs sent (ote_sim_rnr_naks); sim.c. */
extern _Atomic uint64_t ote__sim_rnr_naks;

#define SIM_LOG "verbs.sim"

#define sim_container_of(ptr, type, member) ((type *)(void *)((char *)(ptr)-offsetof(type, member)))

#define SIM_MAX_DEVS 8
#define SIM_MAX_PORTS 4
#define SIM_GID_TBL_LEN 16
/* Queue depths, SGE counts, CQ size, inline size and RD-atom counts are per device: its
 * profile (sim_profile_t, profile.c). SIM_MAX_SGE only bounds arrays: the most SGEs any
 * profile allows (rxe's 32); a device's limit is its profile's max_sge. */
#define SIM_MAX_SGE 32
#define SIM_MAX_MSG_SZ (1ull << 31)
#define SIM_MAX_MR_SIZE (1ull << 40)
#define SIM_MAX_QP (1 << 16)
#define SIM_MAX_KEYS (1 << 20)
#define SIM_MAX_BW (1000ull * 1000 * 1000 * 1000) /* 1 TB/s */
/* Progress threads per provider instance: a requester connection goes to them in turn and
 * the responder end of a connection from this instance joins its requester's thread, so
 * one QP pair's traffic stays on one thread and different pairs copy in parallel. */
#define SIM_THREADS 2

struct sim_prov;
struct sim_qp;
struct sim_conn;

/* ---- configuration: devices, ports, GIDs (config.c) ---- */

typedef enum {
    SIM_GID_EXPLICIT = 0,
    SIM_GID_AUTO_V4,
    SIM_GID_AUTO_LL,
    SIM_GID_AUTO_V6
} sim_gid_kind_t;

enum { SIM_FD_WAKE = 1, SIM_FD_LISTENER = 2, SIM_FD_CONN = 3 };

typedef struct sim_listener {
    int kind; /* SIM_FD_LISTENER: first member, epoll data points here */
    int fd;
    struct sim_dev *dev;
    int port; /* 1-based */
    union ibv_gid gid;
} sim_listener_t;

typedef struct sim_gid {
    bool valid;
    union ibv_gid gid;
    uint32_t type; /* enum ibv_gid_type */
    sim_gid_kind_t kind;
} sim_gid_t;

typedef struct sim_port {
    enum ibv_port_state state;
    int netdev_mtu;
    enum ibv_mtu active_mtu;
    enum ibv_mtu max_mtu;
    uint8_t link_layer;
    uint16_t lid;
    /* Egress limit (token bucket, wire.c): bytes per second, 0 = unlimited. Every byte a
     * connection of this port hands to its socket (headers, WRITE/SEND payloads, READ
     * responses) takes a token. */
    uint64_t bw;
    double bw_tokens;
    uint64_t bw_last_ns;
    /* per progress thread: a throttled connection waits for tokens until then (0: none) */
    uint64_t bw_wake_ns[SIM_THREADS];
    uint64_t tx_bytes;   /* bytes handed to the sockets of this port's connections */
    uint64_t tx_payload; /* of them, payload (WRITE/SEND data, READ responses): no headers */
    uint32_t uid;        /* unique 24-bit component of this port's auto GIDs */
    int ngid;            /* gid_tbl_len */
    sim_gid_t gids[SIM_GID_TBL_LEN];
    sim_listener_t *listeners[SIM_GID_TBL_LEN]; /* one per distinct valid GID */
} sim_port_t;

/* A device profile (profile.c; the list and values in sim.h): the limits query_device
 * reports and create_qp, create_cq, modify_qp and alloc_mw enforce, and behaviours. */
typedef struct sim_profile {
    const char *name;
    uint32_t vendor_part_id;
    uint32_t max_qp_wr, max_sge, max_sge_rd, max_cqe, max_inline;
    uint32_t max_qp_rd_atom, max_qp_init_rd_atom;
    uint32_t max_srq, max_srq_wr, max_srq_sge;
    bool mw;             /* type-2B memory windows (none at all when false) */
    bool scatter_to_cqe; /* mlx5's requester scatter-to-CQE hazard, with the per-QP opt-out */
} sim_profile_t;

/* The profile named name, NULL when there is none. */
const sim_profile_t *ote__sim_profile_find(const char *name);
/* The profile of devices that name none: $OTE_SIM_PROFILE, else "mlx5" (an unknown
 * $OTE_SIM_PROFILE is refused: NULL, logged). */
const sim_profile_t *ote__sim_profile_default(void);
/* Largest READ response mlx5 scatters into a (128-byte) CQE. */
#define SIM_SCATTER_CQE_MAX 64

typedef struct sim_dev {
    struct ibv_device ibdev;
    const sim_profile_t *profile; /* never NULL once the configuration is parsed */
    struct sim_prov *prov;
    int index;
    int numa;
    int nports;
    uint64_t guid;
    sim_port_t ports[SIM_MAX_PORTS];
} sim_dev_t;

typedef struct sim_config {
    int ndev;
    sim_dev_t devs[SIM_MAX_DEVS];
    uint32_t retry_cap_ms;
    const sim_profile_t *profile; /* the global profile= item (NULL: none) */
} sim_config_t;

/* Parse text (NULL/empty = default) into cfg. OTE_ERR_INVALID with a logged reason. */
ote_status_t ote__sim_config_parse(const char *text, sim_config_t *cfg);
/* Bind listeners for every valid GID, choosing unique auto GIDs. Under prov->mu or
 * before the thread starts. */
ote_status_t ote__sim_port_bind(struct sim_prov *p, sim_dev_t *d, int port);
void ote__sim_port_unbind(struct sim_prov *p, sim_dev_t *d, int port);
/* Route: the abstract socket address for a GID. */
socklen_t ote__sim_gid_sockaddr(const union ibv_gid *gid, void *sun_out);

/* ---- contexts and async events ---- */

typedef struct sim_aev {
    struct ibv_async_event ev;
    struct sim_aev *next, *prev;
} sim_aev_t;

typedef struct sim_ctx {
    struct ibv_context ibctx;
    struct sim_prov *prov;
    sim_dev_t *dev;
    int efd; /* async fd (eventfd, level: readable iff aq non-empty) */
    bool efd_level;
    sim_aev_t *aq;
    int children; /* PDs, CQs, channels */
    struct sim_ctx *next, *prev;
} sim_ctx_t;

/* ---- PD, MR, MW (mr.c) ---- */

typedef struct sim_pd {
    struct ibv_pd ibpd;
    sim_ctx_t *ctx;
    int children; /* MRs, MWs, QPs */
} sim_pd_t;

enum { SIM_KEY_FREE = 0, SIM_KEY_MR = 1, SIM_KEY_MW = 2 };

typedef struct sim_key {
    int kind;
    uint8_t tag;
    void *obj;
    uint32_t next_free;
} sim_key_t;

/* An MR is addressed (by SGEs, rkeys and window binds) at [va, va + ibmr.length): va is
 * ibmr.addr for an ordinary MR and the iova for a dma-buf MR, whose ibmr.addr is the
 * offset into the dma-buf (as rdma-core sets it). host is where byte va lies in this
 * process: addr itself, or inside the sim's own MAP_SHARED mapping of the dma-buf (map,
 * map_len from the page holding `offset`), which dereg unmaps after revoking. */
typedef struct sim_mr {
    struct ibv_mr ibmr;
    sim_pd_t *pd;
    int access;
    uint32_t index;
    int nbound; /* windows bound to it */
    uint64_t va;
    uint8_t *host;
    void *map; /* dma-buf MR only: NULL for an ordinary MR */
    size_t map_len;
} sim_mr_t;

/* Where address addr of mr (checked to lie inside it) is in this process. */
static inline void *ote__sim_mr_host(const sim_mr_t *mr, uint64_t addr) {
    return mr->host + (addr - mr->va);
}

typedef struct sim_mw {
    struct ibv_mw ibmw;
    sim_pd_t *pd;
    uint32_t index;
    bool bound;
    uint32_t key; /* current rkey (index<<8|tag) */
    sim_mr_t *mr;
    uint64_t addr, len;
    int access;
    struct sim_qp *qp; /* type 2: the QP it is bound to (NULL once that QP is gone) */
} sim_mw_t;

ote_status_t ote__sim_key_alloc(struct sim_prov *p, int kind, void *obj, uint32_t *index_out,
                                uint8_t *tag_out);
void ote__sim_key_free(struct sim_prov *p, uint32_t index);
sim_mr_t *ote__sim_mr_lookup(struct sim_prov *p, uint32_t key);
sim_mw_t *ote__sim_mw_lookup(struct sim_prov *p, uint32_t key);
/* Whether qp may invalidate the type-2 window of rkey (remote: SEND_WITH_INV from the
 * peer, which must come through the QP the window is bound to); invalidate does it. */
bool ote__sim_mw_inv_allowed(struct sim_prov *p, struct sim_qp *qp, uint32_t rkey, bool remote);
bool ote__sim_mw_invalidate(struct sim_prov *p, struct sim_qp *qp, uint32_t rkey, bool remote);
/* Check a local SGE list; need_write: the sim writes into it. Returns false on a
 * protection error. */
bool ote__sim_check_local(struct sim_prov *p, sim_pd_t *pd, const struct ibv_sge *sge, int n,
                          bool need_write, uint64_t len);
/* Check remote access (rkey, range, permission) on responder QP qp. On success *auth_out
 * (if not NULL) is the MR or MW that grants it: the owner recorded with every zero-copy
 * reference to that memory, so that revoking it (ote__sim_revoke) finds the reference;
 * *host_out (if not NULL) is where addr lies in this process (ote__sim_mr_host). */
bool ote__sim_check_remote(struct sim_prov *p, struct sim_qp *qp, uint32_t rkey, uint64_t addr,
                           uint64_t len, int need_access, const void **auth_out, void **host_out);
/* Where the bytes of a local SGE (already checked) are in this process; sge->addr itself
 * when no MR of that lkey exists (a zero-length SGE). */
void *ote__sim_sge_host(struct sim_prov *p, const struct ibv_sge *sge);

/* ---- CQ and completion channel (cq.c) ---- */

typedef struct sim_cqe {
    struct ibv_wc wc;
    struct sim_qp *credit_qp; /* SQ completion: frees send slots up to credit_seq */
    uint64_t credit_seq;
} sim_cqe_t;

typedef struct sim_channel {
    struct ibv_comp_channel ibch;
    sim_ctx_t *ctx;
    int efd;
    bool efd_level;
    struct sim_cq *q_head, *q_tail; /* queued CQ events */
    int ncq;
} sim_channel_t;

typedef struct sim_cq {
    struct ibv_cq ibcq;
    sim_ctx_t *ctx;
    ote_mutex_t mu;
    sim_cqe_t *ring;
    int cap, head, count;
    bool overflowed, overflow_handled;
    int armed; /* 0 no, 1 solicited only, 2 any */
    sim_channel_t *ch;
    bool queued; /* on ch's event queue */
    struct sim_cq *q_next;
    uint32_t comp_delivered, comp_acked;
    uint32_t async_delivered, async_acked;
    int nqp;
} sim_cq_t;

/* Add a CQE (prov->mu held). solicited: fires a solicited-only arm. */
void ote__sim_cq_push(sim_cq_t *cq, const struct ibv_wc *wc, struct sim_qp *credit_qp,
                      uint64_t credit_seq, bool solicited);
void ote__sim_async_push(sim_ctx_t *ctx, const struct ibv_async_event *ev);
void ote__sim_efd_set(int efd, bool *level, bool on);

/* ---- QP (qp.c) ---- */

typedef enum { SWR_QUEUED = 0, SWR_SENT = 1, SWR_DONE = 2 } sim_swr_state_t;

typedef struct sim_swr {
    uint64_t wr_id;
    enum ibv_wr_opcode op;
    unsigned flags;
    bool signaled;
    uint32_t imm; /* imm_data (network order) or invalidate_rkey */
    uint64_t raddr;
    uint32_t rkey;
    int nsge;
    struct ibv_sge *sge; /* qp->max_send_sge entries */
    uint8_t *inl;        /* qp->max_inline bytes */
    bool inlined;
    uint64_t len;
    /* BIND_MW */
    struct ibv_mw *mw;
    uint32_t new_rkey;
    struct ibv_mr *bmr;
    uint64_t baddr, blen;
    unsigned bacc;
    /* progress */
    sim_swr_state_t state;
    bool psn_set;
    uint32_t psn, npsn;
    enum ibv_wc_status status;
    uint32_t byte_len;
} sim_swr_t;

typedef struct sim_rwr {
    uint64_t wr_id;
    int nsge;
    struct ibv_sge *sge;
} sim_rwr_t;

typedef struct sim_qp {
    struct ibv_qp ibqp;
    struct sim_prov *p;
    sim_ctx_t *ctx;
    sim_pd_t *pd;
    sim_cq_t *scq, *rcq;
    struct ibv_qp_init_attr init;
    struct ibv_qp_attr attr; /* current attributes */
    enum ibv_qp_state state; /* real state (the device may move it to ERR) */
    uint32_t epoch;          /* bumped on every move to ERR/RESET */
    uint32_t max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline;
    bool sq_sig_all;
    uint32_t ote_flags; /* OTE_VERBS_QP_* given to create_qp_flags */
    /* send queue: sequence numbers never reset */
    sim_swr_t *sq;
    uint64_t sq_head, sq_next, sq_tail; /* [head,next) sent/executing, [next,tail) queued */
    _Atomic uint64_t sq_freed;          /* slots below this are free (advanced by poll) */
    uint32_t sq_psn_next;
    int reads_out;
    /* receive queue */
    sim_rwr_t *rq;
    uint64_t rq_head, rq_tail;
    struct sim_srq *srq; /* receives come from this SRQ instead (rq unused); srq.c */
    uint32_t rq_epsn;    /* responder: next expected PSN */
    /* requester transport */
    struct sim_conn *req;
    bool conn_lost;
    uint64_t lost_at_ns;
    uint64_t progress_ns;
    bool peer_dropped; /* the responder's last word to this tx_gen was SIM_MSG_DROP (wire_req.c) */
    uint32_t tx_gen;   /* go-backs so far: answers to requests sent before the last one are stale */
    uint64_t rnr_until_ns;
    int rnr_tries;
    bool sqd_notify_pending;
    bool halted; /* a local error is pending: send nothing more */
    uint32_t async_delivered, async_acked;
    UT_hash_handle hh;          /* prov->qps by qp_num */
    struct sim_qp *next, *prev; /* prov->qp_list */
} sim_qp_t;

/* Move qp to ERR (flushing), generating CQEs. status_wr: the failing WR's status was
 * already recorded in the SQ entry. */
void ote__sim_qp_to_err(sim_qp_t *qp);
void ote__sim_qp_fatal(sim_qp_t *qp, enum ibv_event_type ev);
/* Report done SQ entries from the head in order; flush on error. */
void ote__sim_qp_complete(sim_qp_t *qp);
void ote__sim_rq_complete(sim_qp_t *qp, const struct ibv_wc *wc, bool solicited);
/* An error CQE of the receive WQE wr_id (flushed or failed by the responder). */
void ote__sim_recv_error_wc(const sim_qp_t *qp, uint64_t wr_id, enum ibv_wc_status st,
                            struct ibv_wc *wc);
uint64_t ote__sim_retry_bound_ns(sim_qp_t *qp, bool lost);

/* ---- shared receive queues (srq.c) ----
 *
 * A bounded queue of receive WQEs in one PD that the QPs created with it (init_attr.srq)
 * take their receives from. slots[] holds max_wr WQEs (each with max_sge SGEs); ring[]
 * lists the posted ones in order by slot index at [head, tail); free_slots[] the others.
 * A message in progress on a responder connection holds its WQE (conn->srq_from,
 * conn->srq_slot) from its header to its end: another QP's message cannot take it, and
 * a message that does not complete (its QP left RTR/RTS/SQD, the connection closed) gives
 * it back to the front. prov->mu guards it all. */
typedef struct sim_srq {
    struct ibv_srq ibsrq;
    sim_pd_t *pd;
    uint32_t max_wr, max_sge;
    uint32_t limit; /* armed limit (0: disarmed) */
    sim_rwr_t *slots;
    uint32_t *ring;
    uint64_t head, tail;
    uint32_t *free_slots;
    uint32_t nfree;
    int nqp; /* QPs attached */
    uint32_t async_delivered, async_acked;
} sim_srq_t;

static inline sim_srq_t *to_sim_srq(struct ibv_srq *s) {
    return sim_container_of(s, sim_srq_t, ibsrq);
}

int ote__sim_create_srq(ote_verbs_t *v, struct ibv_pd *pd, struct ibv_srq_init_attr *init_attr,
                        struct ibv_srq **srq_out);
int ote__sim_modify_srq(ote_verbs_t *v, struct ibv_srq *srq, struct ibv_srq_attr *attr,
                        int attr_mask);
int ote__sim_query_srq(ote_verbs_t *v, struct ibv_srq *srq, struct ibv_srq_attr *attr);
int ote__sim_destroy_srq(ote_verbs_t *v, struct ibv_srq *srq);
int ote__sim_post_srq_recv(ote_verbs_t *v, struct ibv_srq *srq, struct ibv_recv_wr *wr,
                           struct ibv_recv_wr **bad_wr);
/* The receive path of a responder QP, its RQ or its SRQ alike (prov->mu held):
 * take: the WQE for the message whose header c just read (an SRQ WQE is taken off the
 *       SRQ and held by c; the limit event may fire); NULL: none posted (RNR).
 * held: the WQE that message uses at its end (NULL: none).
 * done: its CQE on qp's receive CQ (an error moves qp to ERR); the WQE is consumed.
 * give_back: an SRQ WQE c holds goes back to the SRQ's front, uncompleted. */
struct sim_conn;
sim_rwr_t *ote__sim_recv_take(struct sim_conn *c, sim_qp_t *qp);
sim_rwr_t *ote__sim_recv_held(struct sim_conn *c, sim_qp_t *qp);
void ote__sim_recv_done(struct sim_conn *c, sim_qp_t *qp, const struct ibv_wc *wc, bool solicited);
void ote__sim_srq_give_back(struct sim_conn *c);
/* The PD the receive WQEs of qp are checked in (its SRQ's, else its own). */
sim_pd_t *ote__sim_recv_pd(sim_qp_t *qp);
/* qp (on an SRQ) enters ERR: WQEs its messages hold go back to the SRQ (never flushed:
 * they stay for the other QPs) and IBV_EVENT_QP_LAST_WQE_REACHED is raised on qp. */
void ote__sim_srq_qp_err(sim_qp_t *qp);

/* ---- wire (wire.c) ---- */

/* SIM_MSG_DROP: the responder read a request and will never answer it (its QP gone, in ERR
 * or not ready, its port down, a PSN out of sequence, a READ response withdrawn, no
 * memory). It completes nothing: it tells the requester that the silence that follows is
 * a NIC's silence, so its retry clock may run out (wire_req.c, req_timers); a responder
 * that is only slow says nothing and the clock waits for it, as a NIC would answer. */
enum {
    SIM_MSG_HELLO = 1,
    SIM_MSG_REQ = 2,
    SIM_MSG_ACK = 3,
    SIM_MSG_NAK = 4,
    SIM_MSG_RRESP = 5,
    SIM_MSG_DROP = 6
};
enum { SIM_NAK_RNR = 1, SIM_NAK_ACCESS = 2, SIM_NAK_INV_REQ = 3, SIM_NAK_OP = 4 };
enum { SIM_HF_SE = 1 };

typedef struct sim_hdr {
    uint8_t type;
    uint8_t op;
    uint8_t flags;
    uint8_t syndrome;
    uint32_t psn;
    uint32_t imm; /* imm / invalidate rkey / HELLO: src qpn / NAK RNR: min_rnr_timer */
    uint32_t rkey;
    uint32_t npsn; /* REQ: PSNs the message consumes */
    uint32_t gen; /* REQ: its requester's go-back generation (qp->tx_gen); echoed in every answer */
    uint64_t raddr; /* HELLO: dst qpn */
    uint64_t len;   /* payload bytes following the header */
} sim_hdr_t;

typedef struct sim_frame {
    struct sim_frame *next;
    sim_hdr_t hdr;
    uint8_t extra[16]; /* small payload (HELLO GID) */
    size_t total, done;
    int niov;
    const void **own;   /* per iov: the MR/MW the bytes are read under (NULL: the sim's own) */
    struct iovec iov[]; /* iov[0] = header (+extra) */
} sim_frame_t;

typedef enum { RX_HDR = 0, RX_PAYLOAD } sim_rx_state_t;

#define SIM_RXBUF (256 * 1024)

typedef struct sim_conn {
    int kind; /* SIM_FD_CONN */
    int fd;
    struct sim_prov *p;
    int owner;         /* the progress thread that services it (index in prov->thr) */
    bool kick;         /* moved to its owner with work pending: the owner's pass takes it */
    ote_mutex_t io_mu; /* held by the owner while it copies outside prov->mu */
    bool io_busy;      /* a copy is in flight or its result not applied yet (prov->mu) */
    bool io_tx;        /* ... and it is a send (OTE_SIM_COPY_TX) */
    /* A cancel of rresp asked while a send was not accounted yet (wire.c rresp_cancel):
     * 0 none, 1 as rresp_cancel(nak false), 2 (nak true); the owner applies it once it
     * has counted what the send took. prov->mu. */
    uint8_t rresp_cancel_ask;
    bool requester; /* our QP's outgoing connection */
    bool dead;
    sim_qp_t *qp;        /* requester: owner; responder: bound after HELLO (may be NULL) */
    sim_listener_t *via; /* responder: the listener that accepted it */
    sim_frame_t *tx_head, *tx_tail;
    bool want_out;
    /* receive */
    uint8_t *rbuf;
    size_t rpos, rlen;
    sim_rx_state_t rx;
    sim_hdr_t h;
    uint64_t remaining;
    struct iovec *div;    /* destination iovs (NULL = discard) */
    const void **div_own; /* per div entry: the MR/MW that grants the write (NULL: sim memory) */
    int ndiv, idiv;
    int div_cap;
    /* what to do at payload end */
    int act;
    bool act_revoked; /* the destination was revoked mid-payload: the rest was dropped */
    uint32_t act_epoch;
    uint64_t act_seq;
    /* responder: the SRQ WQE the message in progress took (srq.c); NULL: none held */
    struct sim_srq *srq_from;
    uint32_t srq_slot;
    union ibv_gid hello_gid;
    bool helloed;       /* responder: a HELLO was seen (a second one closes the connection) */
    sim_frame_t *rresp; /* responder: the READ response not yet fully sent, if any */
    bool rx_blocked;    /* responder: the next request waits until rresp is sent */
    uint32_t ev_mask;   /* epoll events registered */
    struct sim_conn *next, *prev;
} sim_conn_t;

/* What the receive engine does with a payload when it has landed (sim_conn_t.act). */
enum {
    SIM_ACT_NONE = 0,
    SIM_ACT_HELLO,
    SIM_ACT_RECV,
    SIM_ACT_WRITE,
    SIM_ACT_WRITE_IMM,
    SIM_ACT_RRESP
};

/* The transport is one job per file, all under prov->mu (but the copies, see the top):
 *   wire.c       connections, frames and their transmission, revocation, progress thread
 *   wire_req.c   requester: send queue -> frames, ACK/NAK/RNR, retry timer, READ data in
 *   wire_resp.c  responder: HELLO binding, request checks and execution, NAKs
 *   wire_rx.c    receive engine: header parsing, payload into destination iovs, dispatch
 * Lock order inside the transport: prov->mu, then a connection's io_mu (ote__sim_io_wait,
 * and its owner entering an I/O section), or a CQ's mu (through ote__sim_cq_push). */

/* wire.c */
ote_status_t ote__sim_wire_start(struct sim_prov *p);
void ote__sim_wire_stop(struct sim_prov *p);
/* Wake every progress thread / the one of index t. */
void ote__sim_wake(struct sim_prov *p);
void ote__sim_wake_thr(struct sim_prov *p, int t);
/* The index of the calling progress thread (-1: not one). */
int ote__sim_self(void);
/* The I/O section of c's owner (see the top of this file). enter: prov->mu held, released
 * on return; the copy hook runs here (dir: OTE_SIM_COPY_TX/RX, len: bytes of registered or
 * user memory the section may touch). leave: prov->mu held again on return. */
void ote__sim_io_enter(struct sim_prov *p, sim_conn_t *c, int dir, size_t len);
void ote__sim_io_leave(struct sim_prov *p, sim_conn_t *c);
/* Wait (prov->mu held, not released) until no copy of c is in flight. */
void ote__sim_io_wait(sim_conn_t *c);
/* Hand c to progress thread t (the responder end of a connection joins its requester). */
void ote__sim_conn_move(struct sim_prov *p, sim_conn_t *c, int t);
/* The QP's port is ACTIVE (a QP neither sends nor accepts requests otherwise). */
bool ote__sim_port_up(sim_qp_t *qp);
void ote__sim_set_bufs(int fd);
/* A connection over fd owned by progress thread owner, registered with its epoll set
 * (NULL: no memory). */
sim_conn_t *ote__sim_conn_new(struct sim_prov *p, int fd, int owner);
void ote__sim_conn_close(struct sim_prov *p, sim_conn_t *c);
/* A frame with room for npay payload iovs after the header. */
sim_frame_t *ote__sim_frame_new(int npay);
/* own: the MR or MW under whose access the bytes are read (NULL for the sim's memory). */
void ote__sim_frame_add(sim_frame_t *f, void *base, size_t len, const void *own);
void ote__sim_conn_queue(sim_conn_t *c, sim_frame_t *f);
/* Register the epoll events the connection waits for now. */
void ote__sim_conn_events(struct sim_prov *p, sim_conn_t *c);
/* Bytes moved on a requester connection: the retry timer restarts. */
void ote__sim_conn_touch(sim_conn_t *c);
/* Send what the socket takes of the queued frames. */
void ote__sim_conn_tx(struct sim_prov *p, sim_conn_t *c);
/* Queue an ACK/NAK header. */
void ote__sim_send_ctl(struct sim_prov *p, sim_conn_t *c, uint8_t type, uint32_t psn,
                       uint8_t syndrome, uint32_t imm);
/* wire_req.c */
void ote__sim_req_pump(struct sim_prov *p, sim_qp_t *qp, uint64_t now);
void ote__sim_req_on_header(struct sim_prov *p, sim_conn_t *c);
void ote__sim_req_read_done(struct sim_prov *p, sim_conn_t *c);
/* wire_resp.c */
void ote__sim_resp_on_header(struct sim_prov *p, sim_conn_t *c);
void ote__sim_resp_hello_done(struct sim_prov *p, sim_conn_t *c);
void ote__sim_resp_done(struct sim_prov *p, sim_conn_t *c);
/* wire_rx.c */
void ote__sim_conn_rx(struct sim_prov *p, sim_conn_t *c);
/* The payload's destination: the local SGEs (up to len bytes) or one range. */
void ote__sim_div_sges(struct sim_prov *p, sim_conn_t *c, const struct ibv_sge *sge, int n,
                       uint64_t len);
void ote__sim_div_one(sim_conn_t *c, void *base, uint64_t len, const void *own);
/* Detach every connection of qp (RESET, ERR of requester side, destroy). */
void ote__sim_qp_detach(sim_qp_t *qp, bool responder_too);
/* obj (an MR or MW) no longer grants access (dereg, dealloc, invalidation): drop every
 * zero-copy reference to its memory now, under prov->mu. An inbound payload headed there
 * is read and discarded (the responder then fails the request); a READ response not yet
 * started becomes an access NAK; a READ response or request partly sent closes its
 * connection (the requester ends in RETRY_EXC_ERR). Nothing waits. */
void ote__sim_revoke(struct sim_prov *p, const void *obj, bool is_mw);
ote_status_t ote__sim_listener_add(struct sim_prov *p, sim_listener_t *l);
void ote__sim_listener_del(struct sim_prov *p, sim_listener_t *l);

/* ---- provider ---- */

#define SIM_MAGIC 0x5e5e0115u

/* One progress thread: its epoll set (its connections; thread 0 also the listeners) and
 * its wake eventfd. Thread 0's are prov->epfd and prov->wake_efd. */
typedef struct sim_thr {
    int kind; /* SIM_FD_WAKE: epoll data of wake_efd points here (threads 1..) */
    int idx;
    int epfd, wake_efd;
    struct sim_prov *p;
    pthread_t thread;
    bool started;
    bool in_pass; /* under prov->mu: walking prov->conns (progress_round), which then
                   * must not be reordered (it releases prov->mu in its copies) */
    /* Wakeups without a syscall while the thread runs (ote__sim_wake_thr): a waker sets
     * pending and writes wake_efd only when the thread is in (or entering) epoll_wait;
     * the thread sets parked before it reads pending, so one of the two sees the other
     * (both seq_cst) and no wakeup is lost. */
    atomic_bool parked;
    atomic_bool pending;
} sim_thr_t;

typedef struct sim_prov {
    ote_verbs_t v;
    uint32_t magic;
    ote_mutex_t mu;
    ote_cond_t cv; /* acks of events */
    sim_config_t cfg;
    uint32_t instance;
    uint32_t next_qpn;
    sim_key_t *keys;
    uint32_t nkeys, key_cap, key_free;
    sim_qp_t *qps; /* hash by qp_num */
    sim_qp_t *qp_list;
    sim_ctx_t *ctxs;
    sim_conn_t *conns;
    int epfd, wake_efd;
    int wake_kind; /* SIM_FD_WAKE: epoll data of wake_efd points here */
    sim_thr_t thr[SIM_THREADS];
    int nthr;         /* threads whose epfd and wake_efd exist */
    uint32_t conn_rr; /* the next requester connection's thread (in turn) */
    _Atomic bool stop;
    int nlisteners;
    /* $OTE_SIM_INJECT (inject.c): CQEs polled so far, and after how many the CQ error
     * and the GID change come (0: never). */
    _Atomic uint64_t inject_polled;
    uint64_t inject_cq_error_at, inject_gid_change_at;
} sim_prov_t;

static inline sim_prov_t *to_sim_prov(ote_verbs_t *v) { return (sim_prov_t *)v->priv; }
static inline sim_ctx_t *to_sim_ctx(struct ibv_context *c) {
    return sim_container_of(c, sim_ctx_t, ibctx);
}
static inline sim_dev_t *to_sim_dev(struct ibv_device *d) {
    return sim_container_of(d, sim_dev_t, ibdev);
}
static inline sim_pd_t *to_sim_pd(struct ibv_pd *pd) {
    return sim_container_of(pd, sim_pd_t, ibpd);
}
static inline sim_mr_t *to_sim_mr(struct ibv_mr *mr) {
    return sim_container_of(mr, sim_mr_t, ibmr);
}
static inline sim_mw_t *to_sim_mw(struct ibv_mw *mw) {
    return sim_container_of(mw, sim_mw_t, ibmw);
}
static inline sim_cq_t *to_sim_cq(struct ibv_cq *cq) {
    return sim_container_of(cq, sim_cq_t, ibcq);
}
static inline sim_qp_t *to_sim_qp(struct ibv_qp *qp) {
    return sim_container_of(qp, sim_qp_t, ibqp);
}
static inline sim_channel_t *to_sim_ch(struct ibv_comp_channel *ch) {
    return sim_container_of(ch, sim_channel_t, ibch);
}

/* op implementations spread over the files */
int ote__sim_get_device_list(ote_verbs_t *v, struct ibv_device ***list_out, int *num_out);
void ote__sim_free_device_list(ote_verbs_t *v, struct ibv_device **list);
const char *ote__sim_get_device_name(ote_verbs_t *v, struct ibv_device *dev);
int ote__sim_open_device(ote_verbs_t *v, struct ibv_device *dev, struct ibv_context **ctx_out);
int ote__sim_close_device(ote_verbs_t *v, struct ibv_context *ctx);
int ote__sim_query_device(ote_verbs_t *v, struct ibv_context *ctx, struct ibv_device_attr *attr);
int ote__sim_query_port(ote_verbs_t *v, struct ibv_context *ctx, uint8_t port,
                        struct ibv_port_attr *attr);
int ote__sim_query_gid(ote_verbs_t *v, struct ibv_context *ctx, uint8_t port, int index,
                       union ibv_gid *gid);
int ote__sim_query_gid_ex(ote_verbs_t *v, struct ibv_context *ctx, uint32_t port, uint32_t index,
                          struct ibv_gid_entry *entry);
int ote__sim_device_numa_node(ote_verbs_t *v, struct ibv_context *ctx, int *node_out);
int ote__sim_get_async_event(ote_verbs_t *v, struct ibv_context *ctx, struct ibv_async_event *ev);
void ote__sim_ack_async_event(ote_verbs_t *v, struct ibv_async_event *ev);
int ote__sim_alloc_pd(ote_verbs_t *v, struct ibv_context *ctx, struct ibv_pd **pd_out);
int ote__sim_dealloc_pd(ote_verbs_t *v, struct ibv_pd *pd);
int ote__sim_reg_mr(ote_verbs_t *v, struct ibv_pd *pd, void *addr, size_t length, int access,
                    struct ibv_mr **mr_out);
int ote__sim_reg_dmabuf_mr(ote_verbs_t *v, struct ibv_pd *pd, uint64_t offset, size_t length,
                           uint64_t iova, int fd, int access, struct ibv_mr **mr_out);
int ote__sim_dereg_mr(ote_verbs_t *v, struct ibv_mr *mr);
int ote__sim_alloc_mw(ote_verbs_t *v, struct ibv_pd *pd, enum ibv_mw_type type,
                      struct ibv_mw **mw_out);
int ote__sim_dealloc_mw(ote_verbs_t *v, struct ibv_mw *mw);
int ote__sim_create_comp_channel(ote_verbs_t *v, struct ibv_context *ctx,
                                 struct ibv_comp_channel **ch_out);
int ote__sim_destroy_comp_channel(ote_verbs_t *v, struct ibv_comp_channel *ch);
int ote__sim_create_cq(ote_verbs_t *v, struct ibv_context *ctx, int cqe, void *cq_context,
                       struct ibv_comp_channel *ch, int comp_vector, struct ibv_cq **cq_out);
int ote__sim_destroy_cq(ote_verbs_t *v, struct ibv_cq *cq);
int ote__sim_req_notify_cq(ote_verbs_t *v, struct ibv_cq *cq, int solicited_only);
int ote__sim_get_cq_event(ote_verbs_t *v, struct ibv_comp_channel *ch, struct ibv_cq **cq_out,
                          void **cq_context_out);
void ote__sim_ack_cq_events(ote_verbs_t *v, struct ibv_cq *cq, unsigned int nevents);
int ote__sim_poll_cq(ote_verbs_t *v, struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);
int ote__sim_create_qp(ote_verbs_t *v, struct ibv_pd *pd, struct ibv_qp_init_attr *init_attr,
                       struct ibv_qp **qp_out);
int ote__sim_modify_qp(ote_verbs_t *v, struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask);
int ote__sim_query_qp(ote_verbs_t *v, struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask,
                      struct ibv_qp_init_attr *init_attr);
int ote__sim_destroy_qp(ote_verbs_t *v, struct ibv_qp *qp);
int ote__sim_post_send(ote_verbs_t *v, struct ibv_qp *qp, struct ibv_send_wr *wr,
                       struct ibv_send_wr **bad_wr);
int ote__sim_post_recv(ote_verbs_t *v, struct ibv_qp *qp, struct ibv_recv_wr *wr,
                       struct ibv_recv_wr **bad_wr);

int ote__sim_query_device_ex(ote_verbs_t *v, struct ibv_context *ctx,
                             struct ibv_device_attr_ex *attr);
int ote__sim_create_qp_flags(ote_verbs_t *v, struct ibv_pd *pd, struct ibv_qp_init_attr *init_attr,
                             uint32_t flags, struct ibv_qp **qp_out);
int ote__sim_qp_flags(ote_verbs_t *v, struct ibv_qp *qp, uint32_t *flags_out);
int ote__sim_device_flags(ote_verbs_t *v, struct ibv_context *ctx, uint32_t *flags_out);
/* mlx5's scatter-to-CQE hazard (profile.c): true when SQ entry e of qp is a signalled
 * READ of at most SIM_SCATTER_CQE_MAX bytes into a dma-buf MR on a QP of a scatter-to-CQE
 * profile created without OTE_VERBS_QP_NO_SCATTER_TO_CQE. Logs the ERROR and counts it
 * (ote_sim_scatter_hazards); the caller fails the WR with IBV_WC_LOC_PROT_ERR. prov->mu
 * held. */
bool ote__sim_scatter_hazard(sim_prov_t *p, sim_qp_t *qp, const sim_swr_t *e);

/* Raise CQ_ERR / QP_FATAL for CQs that overran (prov->mu held). */
void ote__sim_handle_overflow(sim_prov_t *p);
/* inject.c: parse $OTE_SIM_INJECT into p; after a poll of cq returned got CQEs, raise
 * what the schedule says is due (no sim lock held by the caller). */
ote_status_t ote__sim_inject_parse(sim_prov_t *p);
void ote__sim_inject_polled(sim_prov_t *p, sim_cq_t *cq, int got);
uint32_t ote__sim_mtu_bytes(enum ibv_mtu m);

/* Wait (prov->mu held) until *delivered == *acked or ~1 s; false on timeout. */
bool ote__sim_wait_acked(sim_prov_t *p, const uint32_t *delivered, const uint32_t *acked);
/* Wait (prov->mu not held) until an event fd is readable, or ~1 s; EAGAIN at once if
 * the fd is O_NONBLOCK (the caller's choice, as with a real channel or context fd). */
int ote__sim_wait_fd(int fd);

#endif

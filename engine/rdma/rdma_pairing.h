/*
 * engine/rdma/rdma_pairing.h - which device of the peer a requester run goes to: the
 * remote buffer's locality, as the source advertises it (rdma_pairing.c). Included by
 * rdma_internal.h; the requester's and the source's halves of one mechanism.
 *
 * The requester picks its own device k by its local buffer's locality (the selector).
 * The peer's device used to be k % ndev whatever the remote buffer; now a source that
 * advertises rdma_pair=1 answers each OK grant asked with OTE_RP_GF_PAIR in GRANT_RESP's
 * pair form (proto.h): the set of its devices its own selector ranks best for the
 * registration that holds the grant's range, and that registration's extent. The
 * requester remembers the last OTE__RDMA_PAIR_MEMO such extents per peer (p->pairs,
 * under p->mu: the reader writes, the pump reads) and pairs each later run whose remote
 * address lies in one with a device of that set: k % ndev when it is in the set (the
 * same-rank rail), else the set's (k mod its size)-th device. Runs before the first
 * answer, runs into memory no answer described, and every run to a source without the
 * advert keep k % ndev.
 *
 * Endpoints: a requester endpoint is per (our device k, the peer's device j, capability):
 * p->conn.ep[k][OTE__RDMA_EPI(j, cap)]. Toward a source with rdma_pair=1 every j of the
 * peer's devices has one (made at INFO, QPs built on first use); toward an older one only
 * j = k % ndev (as before). The QP build (p->build) and the cache-miss flush are per
 * endpoint index too.
 */
#ifndef OTE_ENGINE_RDMA_RDMA_PAIRING_H
#define OTE_ENGINE_RDMA_RDMA_PAIRING_H

#include <stdint.h>

#include "engine/rdma/proto.h"
#include "engine/src_account.h"
#include "engine/transport.h"

/* Endpoint index of (the peer's device j, capability cap: 0 READ, 1 WRITE, 2, 3 direct). */
#define OTE__RDMA_CAPS 4
#define OTE__RDMA_EPS (OTE__RDMA_CAPS * OTE_RP_MAX_DEVS)
#define OTE__RDMA_EPI(j, cap) ((uint32_t)(j)*OTE__RDMA_CAPS + (uint32_t)(cap))
#define OTE__RDMA_EPI_DEV(e) ((uint32_t)(e) / OTE__RDMA_CAPS)
#define OTE__RDMA_EPI_CAP(e) ((uint32_t)(e) % OTE__RDMA_CAPS)

#define OTE__RDMA_PAIR_MEMO 16

/* p->pairs: remote registrations and the source's best devices for each (a ring, the
 * oldest overwritten at next; an extent seen again is updated in place). */
typedef struct {
    struct {
        uint64_t lo, hi; /* [lo, hi): the registration; hi == 0: empty entry */
        uint32_t near;   /* bit j: the peer's device j */
    } e[OTE__RDMA_PAIR_MEMO];
    uint32_t next;
} ote__rdma_pairs_t;

struct ote__rdma_tp;
struct ote__tpeer;
struct conn;
struct ote_endpoint;

/* Source: the answer's pair form for a grant of the request account a (opened OK: its
 * pin is the registration): *near_out the devices ranked best for the registration's
 * locality (0 when every device ranks the same: no preference is sent), and its extent. */
void ote__rdma_pair_hint(struct ote__rdma_tp *tp, const ote__acct_t *a, uint32_t *near_out,
                         uint64_t *addr_out, uint64_t *len_out);
/* Requester (the reader, p->mu not held): remember an OK GRANT_RESP's pair form. */
void ote__rdma_pair_learn(struct ote__tpeer *p, const ote_rp_msg_t *rp);
/* Requester: the peer's device for the run s on our device k (p connected, no lock held):
 * one whose endpoint for s's capability exists. */
uint32_t ote__rdma_pair_dev(struct ote__tpeer *p, const ote__slice_t *s, uint32_t k);
/* The same, p->mu held. */
uint32_t ote__rdma_pair_dev_locked(struct ote__tpeer *p, const ote__slice_t *s, uint32_t k);
/* The endpoint capability of the run s (0 READ, 1 WRITE; 2, 3 direct) and its endpoint
 * index on the peer's device it was paired with (its scratch's rdev). */
uint32_t ote__rdma_run_cap(const ote__slice_t *s);
uint32_t ote__rdma_run_epi(const ote__slice_t *s);
/* Requester, at INFO: the endpoints toward the peer of c into eps (rdma_peer.c owns them
 * once connected): every (k, j, cap) above toward a source with rdma_pair=1, else the
 * rails only. */
ote_status_t ote__rdma_pair_endpoints(struct ote__rdma_tp *tp, const struct conn *c,
                                      struct ote_endpoint *eps[OTE_RP_MAX_DEVS][OTE__RDMA_EPS]);
/* Requester: our device k went down: EP_RESET for each pair of k that has endpoints. */
void ote__rdma_pair_reset(struct conn *c, uint32_t k);

#endif

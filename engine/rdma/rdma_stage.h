/*
 * engine/rdma/rdma_stage.h - the source's bounce buffers of staged grants (rdma_stage.c,
 * rdma_stage_mrs.c), for the files that stage: the source side and the lifecycle.
 */
#ifndef OTE_ENGINE_RDMA_RDMA_STAGE_H
#define OTE_ENGINE_RDMA_RDMA_STAGE_H

#include "engine/rdma/rdma_internal.h"

typedef struct rdma_stage rdma_stage_t;
/* Server thread: a bounce buffer for the grant [addr, +len) (write: a WRITE grant) of
 * the staged request whose registration pin is reg_pin, with a MW-bindable MR in nic's
 * context. OTE_OK with *st_out, else the refusal (nothing held). Its bytes come with
 * ote__rdma_stage_copy_start: the range copied from the device (a file's range read by
 * the file owner, host->file.bounce_io_start) until dl, done(arg, status) later on the
 * GPU worker (the file owner's reaper or pool thread; rarely on this thread before the
 * call returns), the bounce not ended before, or the failure now (no done; the bounce is
 * ended by the caller as usual). */
ote_status_t ote__rdma_stage_take(rdma_tp_t *tp, rdma_nic_t *nic, void *reg_pin, int write,
                                  uint64_t addr, uint64_t len, ote_deadline_t dl,
                                  rdma_stage_t **st_out);
ote_status_t ote__rdma_stage_copy_start(rdma_tp_t *tp, rdma_stage_t *st,
                                        void (*done)(void *, ote_status_t), void *arg);
/* rdma_pump.c: the most a requester puts in one grant of a staged run (gpu_staging_chunk,
 * 2 MiB when 0); the source keeps MRs over file bounces up to this size only. */
uint64_t ote__rdma_stage_run_chunk(const rdma_tp_t *tp);
/* rdma_stage_mrs.c: the MR of the pool chunk or kept file bounce [base, +size) in nic's
 * PD, registered at its first use and kept (local-only, MW-bindable). The teardown drops them all (one
 * that would not deregister is an orphan of tp->bm, retried by its reclaim). */
typedef struct rdma_stage_mr rdma_stage_mr_t;
ote_status_t ote__rdma_stage_chunk_mr(rdma_tp_t *tp, rdma_nic_t *nic, uint8_t *base, uint64_t size,
                                      struct ibv_mr **mr_out);
void ote__rdma_stage_mrs_drop(rdma_tp_t *tp);
/* The same for one data device's (its reopen, rdma_reopen.c); returns how many. */
size_t ote__rdma_stage_mrs_drop_nic(rdma_tp_t *tp, const rdma_nic_t *nic);
struct ibv_mr *ote__rdma_stage_mr(const rdma_stage_t *st);
/* 1: a file registration's bounce (its copy is the file owner's read), 0: device memory's. */
int ote__rdma_stage_is_file(const rdma_stage_t *st);
uint64_t ote__rdma_stage_base(const rdma_stage_t *st);
/* A WRITE's COMMIT goes on c (a reference taken) with req_id (the grant's wire id); its
 * window is on our QP qpn. The answer then holds a reference: ote__rdma_stage_answered
 * (the grant's answer ans with the window's rkey) drops it. No-ops for a READ. */
void ote__rdma_stage_commit_to(rdma_stage_t *st, conn_t *c, uint64_t req_id, uint32_t qpn);
void ote__rdma_stage_answered(rdma_tp_t *tp, rdma_stage_t *st, ote_status_t ans, uint32_t rkey);
/* A receive on our QP qpn of device nic (before the grant layer takes it as a receipt):
 * a successful one that invalidates a staged WRITE's window marks its bytes landed. */
void ote__rdma_stage_receipt(rdma_tp_t *tp, const rdma_nic_t *nic, uint32_t qpn,
                             const struct ibv_wc *wc);
/* The grant over it ended (its window is dead): a WRITE answered OK whose receipt came
 * starts the bounce's copy to the device (a file's write) and returns; the GPU worker (the
 * file owner's thread) then deregisters
 * the MR, gives the bounce back and sends the COMMIT (counted in tp->src_copies until
 * then). Otherwise a WRITE answered OK sends its failed COMMIT now, and the MR is
 * deregistered and the bounce buffer given back (retained when the MR does not
 * deregister). Any thread, no lock held. */
void ote__rdma_stage_end(rdma_tp_t *tp, rdma_stage_t *st);
/* As ote__rdma_stage_end; 1 when the copy back started: then(tp, arg) runs once it ended,
 * after its COMMIT (on the GPU worker, before tp->src_copies drops), so that what keeps
 * the device range registered (the request's account) stays until no copy writes it. 0:
 * nothing runs later, then is never called. */
int ote__rdma_stage_end_then(rdma_tp_t *tp, rdma_stage_t *st, void (*then)(rdma_tp_t *, void *),
                             void *arg);

#endif

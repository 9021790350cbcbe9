/*
 * verbs/sim/mr.c - protection domains, memory regions and memory windows of the sim,
 * the key table (key = index << 8 | 8-bit tag, as rxe and mlx5) and the local/remote
 * access checks the transport applies to every SGE and rkey.
 */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/vm.h"
#include "verbs/sim/sim_internal.h"

/* ---- PD ---- */

int ote__sim_alloc_pd(ote_verbs_t *v, struct ibv_context *ctx, struct ibv_pd **pd_out) {
    if (!ctx || !pd_out) return EINVAL;
    sim_prov_t *p = to_sim_prov(v);
    sim_pd_t *pd = ote_calloc(1, sizeof(*pd));
    if (!pd) return ENOMEM;
    ote_mutex_lock(&p->mu);
    pd->ctx = to_sim_ctx(ctx);
    pd->ibpd.context = ctx;
    pd->ibpd.handle = ++p->next_qpn; /* any unique number */
    pd->ctx->children++;
    ote_mutex_unlock(&p->mu);
    *pd_out = &pd->ibpd;
    return 0;
}

int ote__sim_dealloc_pd(ote_verbs_t *v, struct ibv_pd *ibpd) {
    if (!ibpd) return EINVAL;
    sim_prov_t *p = to_sim_prov(v);
    sim_pd_t *pd = to_sim_pd(ibpd);
    ote_mutex_lock(&p->mu);
    if (pd->children > 0) {
        ote_mutex_unlock(&p->mu);
        return EBUSY;
    }
    pd->ctx->children--;
    ote_mutex_unlock(&p->mu);
    ote_free(pd);
    return 0;
}

/* ---- key table ---- */

ote_status_t ote__sim_key_alloc(sim_prov_t *p, int kind, void *obj, uint32_t *index_out,
                                uint8_t *tag_out) {
    uint32_t idx = p->key_free;
    if (idx == 0) {
        if (p->nkeys + 1 >= p->key_cap) {
            uint32_t ncap = p->key_cap ? p->key_cap * 2 : 256;
            if (ncap > SIM_MAX_KEYS) return OTE_ERR_NOMEM;
            sim_key_t *nk = ote_realloc(p->keys, (size_t)ncap * sizeof(*nk));
            if (!nk) return OTE_ERR_NOMEM;
            memset(nk + p->key_cap, 0, (size_t)(ncap - p->key_cap) * sizeof(*nk));
            for (uint32_t i = p->key_cap; i < ncap; i++) nk[i].tag = (uint8_t)(i * 37u + 0x5a);
            p->keys = nk;
            p->key_cap = ncap;
        }
        idx = ++p->nkeys; /* index 0 is never used */
    } else {
        p->key_free = p->keys[idx].next_free;
    }
    sim_key_t *k = &p->keys[idx];
    k->kind = kind;
    k->obj = obj;
    k->tag = (uint8_t)(k->tag + 1); /* a reused index never repeats the last key */
    *index_out = idx;
    *tag_out = k->tag;
    return OTE_OK;
}

void ote__sim_key_free(sim_prov_t *p, uint32_t index) {
    sim_key_t *k = &p->keys[index];
    k->kind = SIM_KEY_FREE;
    k->obj = NULL;
    k->next_free = p->key_free;
    p->key_free = index;
}

static sim_key_t *key_entry(sim_prov_t *p, uint32_t key) {
    uint32_t idx = key >> 8;
    if (idx == 0 || idx > p->nkeys) return NULL;
    return &p->keys[idx];
}

sim_mr_t *ote__sim_mr_lookup(sim_prov_t *p, uint32_t key) {
    sim_key_t *k = key_entry(p, key);
    if (!k || k->kind != SIM_KEY_MR) return NULL;
    sim_mr_t *mr = k->obj;
    return mr->ibmr.lkey == key ? mr : NULL;
}

sim_mw_t *ote__sim_mw_lookup(sim_prov_t *p, uint32_t key) {
    sim_key_t *k = key_entry(p, key);
    if (!k || k->kind != SIM_KEY_MW) return NULL;
    return k->obj;
}

static bool in_range(uint64_t base, uint64_t blen, uint64_t addr, uint64_t len) {
    if (addr < base) return false;
    if (len > blen) return false;
    return addr - base <= blen - len;
}

bool ote__sim_check_local(sim_prov_t *p, sim_pd_t *pd, const struct ibv_sge *sge, int n,
                          bool need_write, uint64_t len) {
    uint64_t left = len;
    for (int i = 0; i < n && left > 0; i++) {
        if (sge[i].length == 0) continue;
        sim_mr_t *mr = ote__sim_mr_lookup(p, sge[i].lkey);
        if (!mr || mr->pd != pd) return false;
        if (!in_range(mr->va, mr->ibmr.length, sge[i].addr, sge[i].length)) return false;
        if (need_write && !(mr->access & IBV_ACCESS_LOCAL_WRITE)) return false;
        left -= sge[i].length < left ? sge[i].length : left;
    }
    return true;
}

bool ote__sim_check_remote(sim_prov_t *p, sim_qp_t *qp, uint32_t rkey, uint64_t addr, uint64_t len,
                           int need, const void **auth_out, void **host_out) {
    sim_key_t *k = key_entry(p, rkey);
    if (!k) return false;
    if (k->kind == SIM_KEY_MR) {
        sim_mr_t *mr = k->obj;
        if (mr->ibmr.rkey != rkey || mr->pd != qp->pd) return false;
        if (!(mr->access & need)) return false;
        if (!in_range(mr->va, mr->ibmr.length, addr, len)) return false;
        if (auth_out) *auth_out = mr;
        if (host_out) *host_out = ote__sim_mr_host(mr, addr);
        return true;
    }
    if (k->kind == SIM_KEY_MW) {
        sim_mw_t *mw = k->obj;
        if (!mw->bound || mw->key != rkey || mw->pd != qp->pd || mw->len == 0) return false;
        if (mw->ibmw.type == IBV_MW_TYPE_2 && mw->qp != qp) return false;
        if (!(mw->access & need)) return false;
        if (!in_range(mw->addr, mw->len, addr, len)) return false;
        if (auth_out) *auth_out = mw;
        if (host_out) *host_out = ote__sim_mr_host(mw->mr, addr); /* a bound window has its MR */
        return true;
    }
    return false;
}

void *ote__sim_sge_host(sim_prov_t *p, const struct ibv_sge *sge) {
    sim_mr_t *mr = ote__sim_mr_lookup(p, sge->lkey);
    if (!mr || sge->length == 0) return (void *)(uintptr_t)sge->addr;
    return ote__sim_mr_host(mr, sge->addr);
}

/* A type-2 window may be invalidated by the peer (SEND_WITH_INV, remote) only through
 * the QP it is bound to (IBA); LOCAL_INV needs the same PD. */
bool ote__sim_mw_inv_allowed(sim_prov_t *p, sim_qp_t *qp, uint32_t rkey, bool remote) {
    sim_mw_t *mw = ote__sim_mw_lookup(p, rkey);
    if (!mw || !mw->bound || mw->key != rkey || mw->pd != qp->pd || mw->ibmw.type != IBV_MW_TYPE_2)
        return false;
    if (remote && mw->qp != qp) return false;
    return true;
}

bool ote__sim_mw_invalidate(sim_prov_t *p, sim_qp_t *qp, uint32_t rkey, bool remote) {
    if (!ote__sim_mw_inv_allowed(p, qp, rkey, remote)) return false;
    sim_mw_t *mw = ote__sim_mw_lookup(p, rkey);
    ote__sim_revoke(p, mw, true);
    mw->bound = false;
    if (mw->mr) mw->mr->nbound--;
    mw->mr = NULL;
    mw->qp = NULL;
    mw->len = 0;
    return true;
}

/* ---- MR ---- */

#define SIM_MR_KNOWN_ACCESS \
    (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | \
     IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND | IBV_ACCESS_RELAXED_ORDERING)

/* Whether the kernel would pin [addr, +len) for an MR with these flags (ib_umem_get):
 * every page mapped and readable, and writable when any flag lets the MR be written
 * (LOCAL_WRITE, REMOTE_WRITE, REMOTE_ATOMIC, and MW_BIND, since a window can grant
 * writes); a page past the end of a mapped file cannot be pinned either. A real
 * ibv_reg_mr answers EFAULT otherwise, and so does the sim: its copies would fault. */
static bool sim_pinnable(const void *addr, size_t len, int access) {
    int writes = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC |
                 IBV_ACCESS_MW_BIND;
    unsigned need = OTE_VM_READ | ((access & writes) ? OTE_VM_WRITE : 0);
    ote_vm_report_t r;
    if (ote_vm_check((uint64_t)(uintptr_t)addr, len, need, &r) != OTE_OK) return false;
    return r.verdict == OTE_VM_OK;
}

int ote__sim_reg_mr(ote_verbs_t *v, struct ibv_pd *ibpd, void *addr, size_t length, int access,
                    struct ibv_mr **mr_out) {
    if (!ibpd || !mr_out) return EINVAL;
    if (access & ~SIM_MR_KNOWN_ACCESS) return EINVAL;
    if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
        !(access & IBV_ACCESS_LOCAL_WRITE))
        return EINVAL;
    if (length > SIM_MAX_MR_SIZE) return EINVAL;
    if (length > 0 && !addr) return EINVAL;
    if ((uint64_t)(uintptr_t)addr + length < (uint64_t)(uintptr_t)addr) return EINVAL;
    if (length > 0 && !sim_pinnable(addr, length, access)) return EFAULT;
    sim_prov_t *p = to_sim_prov(v);
    sim_pd_t *pd = to_sim_pd(ibpd);
    sim_mr_t *mr = ote_calloc(1, sizeof(*mr));
    if (!mr) return ENOMEM;
    ote_mutex_lock(&p->mu);
    uint8_t tag = 0;
    ote_status_t st = ote__sim_key_alloc(p, SIM_KEY_MR, mr, &mr->index, &tag);
    if (st != OTE_OK) {
        ote_mutex_unlock(&p->mu);
        ote_free(mr);
        return ENOMEM;
    }
    mr->pd = pd;
    mr->access = access;
    mr->ibmr.context = ibpd->context;
    mr->ibmr.pd = ibpd;
    mr->ibmr.addr = addr;
    mr->ibmr.length = length;
    mr->va = (uint64_t)(uintptr_t)addr;
    mr->host = addr;
    mr->ibmr.handle = mr->index;
    mr->ibmr.lkey = mr->index << 8 | tag;
    mr->ibmr.rkey = mr->ibmr.lkey;
    pd->children++;
    ote_mutex_unlock(&p->mu);
    *mr_out = &mr->ibmr;
    return 0;
}

/* Flags the kernel's dma-buf registration accepts (MW_BIND is not among them). */
#define SIM_DMABUF_KNOWN_ACCESS \
    (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | \
     IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_RELAXED_ORDERING)

/* Checks in the kernel's order: page offsets of offset and iova, access flags, range
 * arithmetic, then the fd (EBADF) and the range against the dma-buf's size (EINVAL). */
static int dmabuf_check(uint64_t offset, size_t length, uint64_t iova, int fd, int access,
                        uint64_t page, struct stat *st) {
    if ((offset & (page - 1)) != (iova & (page - 1))) return EINVAL;
    if (access & ~SIM_DMABUF_KNOWN_ACCESS) return EINVAL;
    if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
        !(access & IBV_ACCESS_LOCAL_WRITE))
        return EINVAL;
    if (length == 0 || length > SIM_MAX_MR_SIZE) return EINVAL;
    if (offset + length < offset || iova + length < iova) return EINVAL;
    if (fd < 0 || fstat(fd, st) != 0) return EBADF;
    if (st->st_size < 0 || offset + length > (uint64_t)st->st_size) return EINVAL;
    return 0;
}

int ote__sim_reg_dmabuf_mr(ote_verbs_t *v, struct ibv_pd *ibpd, uint64_t offset, size_t length,
                           uint64_t iova, int fd, int access, struct ibv_mr **mr_out) {
    if (!ibpd || !mr_out) return EINVAL;
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    struct stat st;
    int err = dmabuf_check(offset, length, iova, fd, access, page, &st);
    if (err) return err;
    /* The software NIC reaches the "device" memory through its own mapping of the fd;
     * the registering process need not (and, for GPU memory, cannot) address it. */
    uint64_t start = offset & ~(page - 1);
    size_t map_len = (size_t)(offset + length - start);
    void *map = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)start);
    if (map == MAP_FAILED) {
        err = errno;
        return err == ENODEV ? EINVAL : err; /* an fd that cannot be mapped is no dma-buf */
    }
    sim_prov_t *p = to_sim_prov(v);
    sim_pd_t *pd = to_sim_pd(ibpd);
    sim_mr_t *mr = ote_calloc(1, sizeof(*mr));
    if (!mr) {
        munmap(map, map_len);
        return ENOMEM;
    }
    ote_mutex_lock(&p->mu);
    uint8_t tag = 0;
    if (ote__sim_key_alloc(p, SIM_KEY_MR, mr, &mr->index, &tag) != OTE_OK) {
        ote_mutex_unlock(&p->mu);
        ote_free(mr);
        munmap(map, map_len);
        return ENOMEM;
    }
    mr->pd = pd;
    mr->access = access;
    mr->ibmr.context = ibpd->context;
    mr->ibmr.pd = ibpd;
    mr->ibmr.addr = (void *)(uintptr_t)offset; /* as rdma-core's ibv_reg_dmabuf_mr */
    mr->ibmr.length = length;
    mr->ibmr.handle = mr->index;
    mr->ibmr.lkey = mr->index << 8 | tag;
    mr->ibmr.rkey = mr->ibmr.lkey;
    mr->va = iova;
    mr->host = (uint8_t *)map + (offset - start);
    mr->map = map; /* owned by the MR from here; dereg unmaps it */
    mr->map_len = map_len;
    pd->children++;
    ote_mutex_unlock(&p->mu);
    *mr_out = &mr->ibmr;
    return 0;
}

int ote__sim_dereg_mr(ote_verbs_t *v, struct ibv_mr *ibmr) {
    if (!ibmr) return EINVAL;
    sim_prov_t *p = to_sim_prov(v);
    sim_mr_t *mr = to_sim_mr(ibmr);
    ote_mutex_lock(&p->mu);
    if (mr->nbound > 0) { /* IBA 10.6.7.2.6; rxe answers EINVAL */
        ote_mutex_unlock(&p->mu);
        return EINVAL;
    }
    /* No transfer may touch the memory once this returns (the caller may free it). */
    ote__sim_revoke(p, mr, false);
    ote__sim_key_free(p, mr->index);
    mr->pd->children--;
    ote_mutex_unlock(&p->mu);
    ote__sim_wake(p);
    /* Revoked above: no transfer holds a reference into the mapping any more. */
    if (mr->map) munmap(mr->map, mr->map_len);
    ote_free(mr);
    return 0;
}

/* ---- MW ---- */

int ote__sim_alloc_mw(ote_verbs_t *v, struct ibv_pd *ibpd, enum ibv_mw_type type,
                      struct ibv_mw **mw_out) {
    if (!ibpd || !mw_out) return EINVAL;
    /* A profile without windows (nomw) has none of either type. */
    if (!to_sim_pd(ibpd)->ctx->dev->profile->mw) return EOPNOTSUPP;
    /* Type 1 windows need ibv_bind_mw, which the ops table does not carry. */
    if (type == IBV_MW_TYPE_1) return EOPNOTSUPP;
    if (type != IBV_MW_TYPE_2) return EINVAL;
    sim_prov_t *p = to_sim_prov(v);
    sim_pd_t *pd = to_sim_pd(ibpd);
    sim_mw_t *mw = ote_calloc(1, sizeof(*mw));
    if (!mw) return ENOMEM;
    ote_mutex_lock(&p->mu);
    uint8_t tag = 0;
    if (ote__sim_key_alloc(p, SIM_KEY_MW, mw, &mw->index, &tag) != OTE_OK) {
        ote_mutex_unlock(&p->mu);
        ote_free(mw);
        return ENOMEM;
    }
    mw->pd = pd;
    mw->key = mw->index << 8 | tag;
    mw->ibmw.context = ibpd->context;
    mw->ibmw.pd = ibpd;
    mw->ibmw.rkey = mw->key;
    mw->ibmw.handle = mw->index;
    mw->ibmw.type = type;
    pd->children++;
    ote_mutex_unlock(&p->mu);
    *mw_out = &mw->ibmw;
    return 0;
}

int ote__sim_dealloc_mw(ote_verbs_t *v, struct ibv_mw *ibmw) {
    if (!ibmw) return EINVAL;
    sim_prov_t *p = to_sim_prov(v);
    sim_mw_t *mw = to_sim_mw(ibmw);
    ote_mutex_lock(&p->mu);
    if (mw->bound && mw->mr) mw->mr->nbound--;
    ote__sim_revoke(p, mw, true);
    ote__sim_key_free(p, mw->index);
    mw->pd->children--;
    ote_mutex_unlock(&p->mu);
    ote__sim_wake(p);
    ote_free(mw);
    return 0;
}

/*
 * engine/registry.c - registered memory: a sorted array of non-overlapping ranges with
 * their permissions and optional names (unique among live registrations), under reg_lk;
 * the list peers discover (host->buffers: at most OTE_CTL_BUFS_MAX, lowest addresses).
 * A pin (a transport's source side checking a request, or a request whose local buffer
 * lies in a registration) holds the registration: unregister is BUSY until every pin is
 * released. The RDMA transport's mem_register /
 * mem_unregister hooks run under reg_lk so that a range is never visible half-published.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdatomic.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "base/time.h"
#include "base/vm.h"
#include "engine/control/ctl.h"
#include "engine/core_internal.h"
#include "engine/file/file.h"
#include "engine/registry_internal.h"
#include "engine/router_internal.h"

/* Index of the registration with the greatest start <= addr, or -1. reg_lk held. */
static long reg_find(const ote_engine_t *e, uint64_t addr) {
    long lo = 0, hi = (long)e->nregs - 1, best = -1;
    while (lo <= hi) {
        long mid = lo + (hi - lo) / 2;
        if (e->regs[mid]->start <= addr) {
            best = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return best;
}

ote__reg_t *ote__reg_covering(const ote_engine_t *e, uint64_t addr, uint64_t len) {
    long i = reg_find(e, addr);
    if (i < 0) return NULL;
    ote__reg_t *r = e->regs[i];
    uint64_t off = addr - r->start;
    if (off >= r->len || len > r->len - off) return NULL;
    return r;
}

ote__reg_t *ote__reg_covering_near(const ote_engine_t *e, uint64_t addr, uint64_t len,
                                   const ote__reg_t *near) {
    if (near != NULL && addr >= near->start && addr - near->start < near->len &&
        len <= near->len - (addr - near->start))
        return (ote__reg_t *)near;
    return ote__reg_covering(e, addr, len);
}

ote_status_t ote__reg_pin(void *arg, uint64_t addr, uint64_t len, unsigned perm, void **pin_out) {
    ote_engine_t *e = arg;
    /* File windows: only for a transport that serves them (transport.h, OTE__PIN_FILE). */
    if (perm & OTE__PIN_FILE) {
        if (addr >= OTE__FILE_ADDR_BASE)
            return ote__files_pin(e->files, addr, len, perm & ~OTE__PIN_FILE, pin_out);
        perm &= ~OTE__PIN_FILE;
    }
    ote_status_t st = OTE_ERR_ACCESS;
    pthread_rwlock_rdlock(&e->reg_lk);
    ote__reg_t *r = ote__reg_covering(e, addr, len);
    if (r != NULL && (r->pin.perms & perm) == perm) {
        atomic_fetch_add(&r->inuse, 1);
        *pin_out = r;
        st = OTE_OK;
    }
    pthread_rwlock_unlock(&e->reg_lk);
    return st;
}

/* The last pin of a registration went: wake the unregisters waiting for it (they hold omu
 * from before they looked at the count until they sleep, so this wakeup cannot be lost).
 * Out of line, like the file case below: ote__reg_unpin's common path (a pin that is not
 * the last) then needs no stack frame (about 20 instructions per request less). */
static __attribute__((noinline)) void unpin_last(ote_engine_t *e) {
    if (atomic_load(&e->unreg_waiters) > 0) {
        ote_mutex_lock(&e->omu);
        ote_cond_broadcast(&e->ocv);
        ote_mutex_unlock(&e->omu);
    }
}

void ote__reg_unpin(void *arg, void *pin) {
    ote_engine_t *e = arg;
    if (ote__pin_kind(pin) == OTE_MEM_FILE) {
        ote__files_unpin(e->files, pin);
        return;
    }
    if (atomic_fetch_sub(&((ote__reg_t *)pin)->inuse, 1) == 1) unpin_last(e);
}

ote_status_t ote_engine_gpu_stats(ote_engine_t *e, ote_gpu_stats_t *out) {
    if (e == NULL || out == NULL) return OTE_ERR_INVALID;
    ote__gpu_stats_t g;
    ote__gpu_stats(e->gpu, &g);
    ote_gpu_stats_t o;
    memset(&o, 0, sizeof(o));
    o.staged_requests = g.staged_jobs;
    o.staged_source = g.src_copies;
    o.ipc_copies = g.ipc_copies;
    o.ipc_failed = g.ipc_failed;
    o.ipc_exports = g.ipc_exports;
    o.ipc_imports = g.ipc_imports;
    o.ipc_imports_now = g.ipc_mapped;
    o.ipc_in_use_now = g.ipc_in_use;
    o.ipc_closed = g.ipc_invalidated;
    o.direct_requests = g.direct;
    *out = o;
    return OTE_OK;
}

ote_status_t ote_memory_query(ote_engine_t *e, const void *addr, ote_buffer_info_t *info_out) {
    if (e == NULL || addr == NULL || info_out == NULL) return OTE_ERR_INVALID;
    if (OTE__ENGINE_GONE(e)) return OTE_ERR_STATE;
    ote_status_t st = OTE_ERR_NOT_FOUND;
    ote_buffer_info_t b;
    memset(&b, 0, sizeof(b));
    pthread_rwlock_rdlock(&e->reg_lk);
    ote__reg_t *r = ote__reg_covering(e, (uintptr_t)addr, 1);
    if (r != NULL) {
        memcpy(b.name, r->name, sizeof(b.name));
        b.addr = r->start;
        b.length = r->len;
        b.perms = r->pin.perms;
        b.kind = r->pin.kind;
        b.numa_node = r->numa;
        st = OTE_OK;
    }
    pthread_rwlock_unlock(&e->reg_lk);
    if (st == OTE_OK) *info_out = b;
    return st;
}

/* Whether a live registration carries name. reg_lk held. */
static int name_taken(const ote_engine_t *e, const char *name) {
    for (size_t i = 0; i < e->nregs; i++)
        if (strcmp(e->regs[i]->name, name) == 0) return 1;
    return 0;
}

/* Whether [start, start + len) overlaps a live registration. reg_lk held. */
static int overlaps(const ote_engine_t *e, uint64_t start, uint64_t len) {
    long i = reg_find(e, start);
    return (i >= 0 && start - e->regs[i]->start < e->regs[i]->len) ||
           ((size_t)(i + 1) < e->nregs && e->regs[i + 1]->start < start + len);
}

int ote__reg_overlaps(const ote_engine_t *e, uint64_t start, uint64_t len) {
    return overlaps(e, start, len);
}

/* Host memory (pageable or pinned) must be there for what peers may do with it, now:
 * every byte mapped, readable for OTE_PERM_READ, writable for OTE_PERM_WRITE, and no page
 * of a file mapping past its file's end (base/vm.h). Whatever drivers are loaded, a range
 * the engine cannot touch is never accepted: a peer's request would kill this process.
 * *writable_out: the whole range is writable here (its RDMA MRs may take LOCAL_WRITE). */
static ote_status_t host_range_check(void *addr, size_t len, unsigned perms, int *writable_out) {
    unsigned need =
        ((perms & OTE_PERM_READ) ? OTE_VM_READ : 0) | ((perms & OTE_PERM_WRITE) ? OTE_VM_WRITE : 0);
    ote_vm_report_t r;
    ote_status_t st = ote_vm_check((uintptr_t)addr, len, need, &r);
    if (st != OTE_OK) return st;
    if (r.verdict == OTE_VM_OK) {
        *writable_out = (r.prot & OTE_VM_WRITE) != 0;
        return OTE_OK;
    }
    OTE_WARN("engine", "register [%p, +%zu) %s refused: 0x%llx is %s%s%s%s", addr, len,
             (perms & OTE_PERM_WRITE) ? ((perms & OTE_PERM_READ) ? "READ|WRITE" : "WRITE") : "READ",
             (unsigned long long)r.at, ote_vm_verdict_str(r.verdict), r.what[0] ? " (" : "", r.what,
             r.what[0] ? ")" : "");
    return r.verdict == OTE_VM_NO_ACCESS ? OTE_ERR_ACCESS : OTE_ERR_INVALID;
}

ote_status_t ote_memory_register(ote_engine_t *e, void *addr, size_t len, unsigned perms) {
    return ote_memory_register_named(e, addr, len, perms, NULL);
}

/* One registration's arguments and what is learned of them before the registry lock:
 * the memory kind, whether the range is writable here, the device range's dma-buf. */
typedef struct {
    void *addr;
    size_t len;
    uint64_t start;
    unsigned perms;
    const char *name;
    size_t nl;     /* name's length (0: none) */
    uint32_t kind; /* OTE_MEM_* */
    int writable;  /* host memory writable here (host_range_check) */
    int dmabuf_fd; /* -1: none */
    uint64_t dmabuf_off;
} reg_args_t;

/* A name (when given) must be 1..OTE_NAME_MAX printable ASCII characters; WARN and
 * OTE_ERR_INVALID otherwise. */
static ote_status_t register_check_name(const reg_args_t *a) {
    if (a->name != NULL && !ote_ctl_buf_name_ok(a->name, a->nl)) {
        OTE_WARN("engine",
                 "register [%p, +%zu) refused: a name must be 1..%d printable ASCII "
                 "characters",
                 a->addr, a->len, OTE_NAME_MAX);
        return OTE_ERR_INVALID;
    }
    return OTE_OK;
}

/* The memory kind (a->kind), host memory checked for the permissions (a->writable) and
 * OTE_PERM_IPC only on device memory; each refusal logged WARN. */
static ote_status_t register_check_memory(ote_engine_t *e, reg_args_t *a) {
    /* The memory kind (host, pinned host, device N): asks the CUDA driver only when it is
     * loaded in this process or the range is not host memory (engine/gpu). */
    ote_status_t cst = ote__gpu_classify(e->gpu, a->start, a->len, 1, &a->kind);
    if (cst != OTE_OK) {
        OTE_WARN("engine", "register [%p, +%zu) refused: its memory kind: %s", a->addr, a->len,
                 ote_status_str(cst));
        return ote_status_code(cst) == OTE_ERR_NO_DEVICE ||
                       ote_status_code(cst) == OTE_ERR_INVALID ||
                       ote_status_code(cst) == OTE_ERR_UNSUPPORTED
                   ? cst
                   : OTE_ERR_INVALID;
    }
    if (!OTE_MEM_IS_CUDA(a->kind) &&
        (cst = host_range_check(a->addr, a->len, a->perms, &a->writable)) != OTE_OK)
        return cst;
    if ((a->perms & OTE_PERM_IPC) && !OTE_MEM_IS_CUDA(a->kind)) {
        OTE_WARN("engine",
                 "register [%p, +%zu) refused: OTE_PERM_IPC opts device memory in to CUDA IPC, "
                 "and this range is host memory",
                 a->addr, a->len);
        return OTE_ERR_INVALID;
    }
    return OTE_OK;
}

/* register_thp=1: huge pages for plain host memory, before a transport pins it (an
 * RDMA MR's pinned pages cannot be collapsed); not for a range refused as an overlap
 * (a concurrent registration racing this check costs only the advice). Takes reg_lk
 * (read) for the overlap check. */
static void register_advise_thp(ote_engine_t *e, const reg_args_t *a) {
    if (a->kind == OTE_MEM_HOST && e->cfg.register_thp) {
        pthread_rwlock_rdlock(&e->reg_lk);
        int taken = overlaps(e, a->start, a->len);
        pthread_rwlock_unlock(&e->reg_lk);
        if (!taken) ote__thp_advise(e, a->start, a->len);
    }
}

/* GPUDirect RDMA: the device range's dma-buf (engine/gpu/gpu_direct.c), taken before
 * the registry lock (driver calls); without one the other GPU paths still serve it.
 * Sets a->dmabuf_fd (-1: none) and a->dmabuf_off; the caller closes the fd. */
static void register_export_dmabuf(ote_engine_t *e, reg_args_t *a) {
    int dmabuf_tp = 0; /* some transport takes dma-buf MRs (rdma) */
    a->dmabuf_fd = -1;
    a->dmabuf_off = 0;
    for (size_t t = 0; t < e->ntps; t++) dmabuf_tp |= e->tps[t]->ops->mem_register_dmabuf != NULL;
    if (OTE_MEM_IS_CUDA(a->kind) && dmabuf_tp && ote__gpu_direct_allowed(e->gpu) &&
        ote__gpu_direct_export(e->gpu, a->kind, a->start, a->len, &a->dmabuf_fd, &a->dmabuf_off) !=
            OTE_OK)
        a->dmabuf_fd = -1;
}

/* The registration record for a (not yet in the registry); NULL when out of memory. */
static ote__reg_t *register_new_reg(ote_engine_t *e, const reg_args_t *a) {
    ote__reg_t *r = ote_calloc(1, sizeof(*r));
    if (r == NULL) return NULL;
    r->start = a->start;
    r->len = a->len;
    r->pin.perms = a->perms;
    r->pin.kind = a->kind;
    r->numa = ote__mem_node(e, a->start, a->len, a->kind);
    r->pin.loc =
        ote__mem_loc(OTE_MEM_IS_CUDA(a->kind) ? OTE_MEM_CUDA_DEVICE(a->kind) : -1, r->numa);
    r->pin.base = a->start;
    r->pin.len = a->len;
    if (a->nl) memcpy(r->name, a->name, a->nl);
    return r;
}

/* Room for one more registration in e->regs (OTE_ERR_NOMEM). reg_lk held (write). */
static ote_status_t regs_reserve(ote_engine_t *e) {
    if (e->nregs == e->capregs) {
        size_t ncap = e->capregs ? e->capregs * 2 : 16;
        ote__reg_t **nr = ote_realloc(e->regs, ncap * sizeof(*nr));
        if (nr == NULL) return OTE_ERR_NOMEM;
        e->regs = nr;
        e->capregs = ncap;
    }
    return OTE_OK;
}

/* Insert r in address order after the transports published it: OTE_ERR_EXISTS for an
 * overlap or a taken name (*dup_out), a transport's failure leaving nothing registered.
 * reg_lk held (write) throughout, across the transports' MR registrations. */
static ote_status_t register_insert_locked(ote_engine_t *e, const reg_args_t *a, ote__reg_t *r,
                                           int *dup_out) {
    ote_status_t st = OTE_OK;
    long i = reg_find(e, a->start);
    if (overlaps(e, a->start, a->len)) st = OTE_ERR_EXISTS;
    if (st == OTE_OK && a->nl && name_taken(e, r->name)) {
        st = OTE_ERR_EXISTS;
        *dup_out = 1;
    }
    if (st == OTE_OK) st = regs_reserve(e);
    /* RDMA hook: the transport publishes its MRs before the range becomes visible; a
     * failure leaves nothing registered. NULL for transports that need none (tcp). */
    /* (The transports see READ/WRITE only: OTE_PERM_IPC is the engine's.) Device memory
     * gets no host MR (its provider would fault on it) ... */
    if (st == OTE_OK && !OTE_MEM_IS_CUDA(a->kind))
        st = ote__router_mem_register(
            e, a->addr, a->len,
            (a->perms & (OTE_PERM_READ | OTE_PERM_WRITE)) | (a->writable ? OTE__MEM_WRITABLE : 0));
    /* ... except its dma-buf MRs (GPUDirect RDMA), where the driver gave one: a failure
     * leaves the registration to the other paths (logged by the transport). */
    if (st == OTE_OK && a->dmabuf_fd >= 0)
        r->direct = ote__router_mem_register_dmabuf(e, a->addr, a->len, a->dmabuf_fd,
                                                    a->dmabuf_off) == OTE_OK;
    if (st == OTE_OK) {
        size_t at = (size_t)(i + 1);
        memmove(&e->regs[at + 1], &e->regs[at], (e->nregs - at) * sizeof(*e->regs));
        e->regs[at] = r;
        e->nregs++;
        e->regs_total++;
        atomic_store(&e->nregs_hint, e->nregs);
    }
    return st;
}

static ote_status_t register_named(ote_engine_t *e, void *addr, size_t len, unsigned perms,
                                   const char *name) {
    if (e == NULL || addr == NULL || len == 0 || (perms & (OTE_PERM_READ | OTE_PERM_WRITE)) == 0 ||
        (perms & ~(OTE_PERM_READ | OTE_PERM_WRITE | OTE_PERM_IPC)) != 0 ||
        (uintptr_t)addr > UINT64_MAX - len)
        return OTE_ERR_INVALID;
    if (OTE__ENGINE_GONE(e)) return OTE_ERR_STATE;
    reg_args_t a = {.addr = addr,
                    .len = len,
                    .start = (uintptr_t)addr,
                    .perms = perms,
                    .name = name,
                    .kind = OTE_MEM_HOST,
                    .dmabuf_fd = -1};
    a.nl = name != NULL ? strnlen(name, OTE_NAME_MAX + 1) : 0;
    ote_status_t st = register_check_name(&a);
    if (st == OTE_OK) st = register_check_memory(e, &a);
    if (st != OTE_OK) return st;
    register_advise_thp(e, &a);
    register_export_dmabuf(e, &a);
    ote__reg_t *r = register_new_reg(e, &a);
    if (r == NULL) {
        ote__gpu_direct_close(a.dmabuf_fd);
        return OTE_ERR_NOMEM;
    }
    int dup = 0;
    pthread_rwlock_wrlock(&e->reg_lk);
    st = register_insert_locked(e, &a, r, &dup);
    pthread_rwlock_unlock(&e->reg_lk);
    ote__gpu_direct_close(a.dmabuf_fd); /* the MRs hold their own references on the dma-buf */
    if (st != OTE_OK) {
        if (dup)
            OTE_WARN("engine", "register [%p, +%zu) refused: the name \"%s\" is taken", addr, len,
                     r->name);
        else if (st == OTE_ERR_EXISTS)
            OTE_WARN("engine", "register [%p, +%zu) refused: overlaps an existing registration",
                     addr, len);
        ote_free(r);
    }
    return st;
}

ote_status_t ote__reg_entries(ote_engine_t *e, int with_files, ote_ctl_buf_t **out, size_t *n_out,
                              size_t *total_out) {
    ote_buffer_info_t *files = NULL;
    size_t nfiles = 0, tfiles = 0;
    if (with_files && e->files != NULL) {
        files = ote_malloc(OTE_CTL_BUFS_MAX * sizeof(*files));
        if (files == NULL) return OTE_ERR_NOMEM;
        ote_status_t st = ote__files_list(e->files, files, OTE_CTL_BUFS_MAX, &nfiles, &tfiles);
        if (st != OTE_OK) {
            ote_free(files);
            return st;
        }
    }
    pthread_rwlock_rdlock(&e->reg_lk);
    /* Memory first, then files: their windows lie above every memory address. */
    size_t total = e->nregs + tfiles;
    size_t nmem = e->nregs < OTE_CTL_BUFS_MAX ? e->nregs : OTE_CTL_BUFS_MAX;
    size_t n = nmem + nfiles < OTE_CTL_BUFS_MAX ? nmem + nfiles : OTE_CTL_BUFS_MAX;
    ote_ctl_buf_t *bufs = n > 0 ? ote_calloc(n, sizeof(*bufs)) : NULL;
    ote_status_t st = n > 0 && bufs == NULL ? OTE_ERR_NOMEM : OTE_OK;
    for (size_t i = 0; st == OTE_OK && i < n; i++) {
        /* Peers see READ/WRITE (OTE_CTL_BUF_PERMS); OTE_PERM_IPC is not listed. */
        if (i < nmem) {
            const ote__reg_t *r = e->regs[i];
            bufs[i] = (ote_ctl_buf_t){.addr = r->start,
                                      .len = r->len,
                                      .perms = r->pin.perms & OTE_CTL_BUF_PERMS,
                                      .kind = r->pin.kind};
            memcpy(bufs[i].name, r->name, sizeof(bufs[i].name));
        } else {
            const ote_buffer_info_t *fi = &files[i - nmem];
            bufs[i] = (ote_ctl_buf_t){.addr = fi->addr,
                                      .len = fi->length,
                                      .perms = fi->perms & OTE_CTL_BUF_PERMS,
                                      .kind = OTE_CTL_BUF_KIND_FILE};
            snprintf(bufs[i].name, sizeof(bufs[i].name), "%s", fi->name);
        }
    }
    pthread_rwlock_unlock(&e->reg_lk);
    ote_free(files);
    if (st != OTE_OK) return st;
    *out = bufs;
    *n_out = n;
    *total_out = total;
    return OTE_OK;
}

ote_status_t ote__reg_buffers(void *arg, uint16_t version, uint64_t req_id, uint8_t **frame_out,
                              size_t *len_out) {
    ote_engine_t *e = arg;
    ote_ctl_buf_t *bufs = NULL;
    size_t n = 0, total = 0;
    /* Files only to a requester that speaks their kind (an earlier one refuses it). */
    ote_status_t st = ote__reg_entries(e, version >= OTE_CTL_FILES_VERSION, &bufs, &n, &total);
    if (st != OTE_OK) return st;
    size_t cap = OTE_CTL_HDR_LEN + 8 + n * OTE_CTL_BUF_ENTRY_LEN;
    uint8_t *f = ote_malloc(cap);
    st = f != NULL ? OTE_OK : OTE_ERR_NOMEM;
    uint8_t *ent = f != NULL ? f + OTE_CTL_HDR_LEN + 8 : NULL;
    for (size_t i = 0; st == OTE_OK && i < n; i++)
        st = ote_ctl_buf_put(ent + i * OTE_CTL_BUF_ENTRY_LEN, &bufs[i]);
    ote_free(bufs);
    ote_ctl_msg_t m;
    memset(&m, 0, sizeof(m));
    m.version = version;
    m.opcode = OTE_CTL_BUFS;
    m.req_id = req_id;
    m.u.bufs.total = (uint32_t)(total > UINT32_MAX ? UINT32_MAX : total);
    m.u.bufs.count = (uint32_t)n;
    m.u.bufs.entries = ent;
    size_t len = 0;
    if (st == OTE_OK) st = ote_ctl_encode(&m, f, cap, &len);
    if (st != OTE_OK) {
        ote_free(f);
        return st;
    }
    if (total > n)
        OTE_WARN_LIMITED("engine",
                         "a peer asked for the registrations: listing %zu of %zu (the "
                         "lowest addresses; at most %u per answer)",
                         n, total, OTE_CTL_BUFS_MAX);
    *frame_out = f;
    *len_out = len;
    return OTE_OK;
}

/* One attempt: NOT_FOUND, BUSY (pinned; with *waiting 1, omu is held and reg_lk
 * released, so that the caller can sleep on ocv without missing the last unpin; with
 * *waiting 2 the pins dropped meanwhile: try again), the transport hook's failure, or OK. */
static ote_status_t unregister_once(ote_engine_t *e, uint64_t start, int may_wait, int *waiting) {
    ote_status_t st = OTE_OK;
    ote__reg_t *victim = NULL;
    *waiting = 0;
    pthread_rwlock_wrlock(&e->reg_lk);
    long i = reg_find(e, start);
    if (i < 0 || e->regs[i]->start != start) {
        st = OTE_ERR_NOT_FOUND;
    } else if (atomic_load(&e->regs[i]->inuse) > 0) {
        st = OTE_ERR_BUSY;
        if (may_wait) {
            atomic_fetch_add(&e->unreg_waiters, 1);
            ote_mutex_lock(&e->omu);
            if (atomic_load(&e->regs[i]->inuse) > 0) {
                *waiting = 1; /* omu stays held */
            } else {
                ote_mutex_unlock(&e->omu);
                atomic_fetch_sub(&e->unreg_waiters, 1);
                *waiting = 2; /* released meanwhile: try again at once */
            }
        }
    } else if ((!OTE_MEM_IS_CUDA(e->regs[i]->pin.kind) || e->regs[i]->direct) &&
               (st = ote__router_mem_unregister(e, (void *)(uintptr_t)start)) != OTE_OK) {
        /* RDMA hook: an MR that would not deregister keeps the registration (retained). */
    } else {
        victim = e->regs[i];
        /* What a transport kept of device memory (a cuFile buffer registration) goes
         * before the range can be registered again. */
        if (OTE_MEM_IS_CUDA(victim->pin.kind)) ote__files_dev_unregister(e->files, start);
        memmove(&e->regs[i], &e->regs[i + 1], (e->nregs - (size_t)i - 1) * sizeof(*e->regs));
        e->nregs--;
        atomic_store(&e->nregs_hint, e->nregs);
    }
    pthread_rwlock_unlock(&e->reg_lk);
    /* Peers that imported a device allocation of it are told (close receipts). */
    if (victim != NULL && (victim->pin.perms & OTE_PERM_IPC) && OTE_MEM_IS_CUDA(victim->pin.kind)) {
        ote__router_ipc_revoke(e, victim->start, victim->len);
        ote__gpu_ipc_forget(e->gpu, victim->start, victim->len); /* a VMM export's fd too */
    }
    ote_free(victim);
    return st;
}

/* A registration still pinned waits at most OTE_UNREGISTER_WAIT_MS for its pins to drop
 * (a release already in flight: the source's receipt of a request whose requester saw
 * it COMPLETED), then answers BUSY. */
static ote_status_t unregister(ote_engine_t *e, void *addr) {
    uint64_t start = (uintptr_t)addr;
    ote_deadline_t dl = ote_deadline_after(OTE_UNREGISTER_WAIT_MS * OTE_NSEC_PER_MSEC);
    for (;;) {
        int waiting = 0;
        int may_wait = ote_now_ns() < dl;
        ote_status_t st = unregister_once(e, start, may_wait, &waiting);
        if (waiting == 2) continue;
        if (waiting == 0) return st;
        ote_status_t wst = ote_cond_wait(&e->ocv, &e->omu, dl);
        ote_mutex_unlock(&e->omu);
        atomic_fetch_sub(&e->unreg_waiters, 1);
        (void)wst; /* woken or at the deadline: look again (BUSY past the deadline) */
    }
}

/* Lines of a registration name its engine (<ote/log.h>). */
ote_status_t ote_memory_register_named(ote_engine_t *e, void *addr, size_t len, unsigned perms,
                                       const char *name) {
    if (e == NULL) return OTE_ERR_INVALID;
    const char *prev = ote_log_set_thread_engine(e->log_tag);
    ote_status_t st = register_named(e, addr, len, perms, name);
    ote_log_set_thread_engine(prev);
    return st;
}

ote_status_t ote_memory_unregister(ote_engine_t *e, void *addr) {
    if (e == NULL || addr == NULL) return OTE_ERR_INVALID;
    if (OTE__ENGINE_GONE(e)) return OTE_ERR_STATE;
    const char *prev = ote_log_set_thread_engine(e->log_tag);
    ote_status_t st = unregister(e, addr);
    ote_log_set_thread_engine(prev);
    return st;
}

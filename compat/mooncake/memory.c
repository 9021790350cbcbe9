/*
 * compat/mooncake/memory.c - registerLocalMemory and its batch forms. OrbitTE registers
 * remotely accessible ranges (READ and WRITE for peers); this file also keeps every range
 * given to it (regs), local-only ones included, for submitTransfer's check that a
 * request's source lies in registered memory (Mooncake's code 3) and for the overlap
 * check of a local-only range. The OrbitTE call runs without the mutex.
 */
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "compat/mooncake/compat_internal.h"

/* The index of the range starting at addr, or -1. Called with mu held. */
static long reg_find(mc_engine_t *e, uintptr_t addr) {
    for (size_t i = 0; i < e->nregs; i++)
        if (e->regs[i].addr == addr) return (long)i;
    return -1;
}

static int reg_overlaps(mc_engine_t *e, uintptr_t addr, size_t len) {
    for (size_t i = 0; i < e->nregs; i++)
        if (addr < e->regs[i].addr + e->regs[i].len && e->regs[i].addr < addr + len) return 1;
    return 0;
}

/* Whether [addr, addr + len) lies inside one range given to registerLocalMemory. */
int ote__mc_regs_cover(mc_engine_t *e, const void *addr, uint64_t len) {
    uintptr_t a = (uintptr_t)addr;
    int found = 0;
    ote_mutex_lock(&e->mu);
    for (size_t i = 0; i < e->nregs && !found; i++)
        found = e->regs[i].remote >= 0 && a >= e->regs[i].addr && len <= e->regs[i].len &&
                a - e->regs[i].addr <= e->regs[i].len - len;
    ote_mutex_unlock(&e->mu);
    return found;
}

/* Record a range (a slot is reserved before OrbitTE is called, so that recording after
 * it cannot fail): 0, or a Mooncake code. Called with mu held. */
static int reg_reserve(mc_engine_t *e, uintptr_t addr, size_t len) {
    if (reg_overlaps(e, addr, len)) return OTE_MC_ERR_ADDRESS_OVERLAPPED;
    if (e->nregs == e->regcap) {
        size_t cap = e->regcap ? e->regcap * 2 : 16;
        mc_reg_t *n = ote_realloc(e->regs, cap * sizeof *n);
        if (n == NULL) return OTE_MC_ERR_MEMORY;
        e->regs = n;
        e->regcap = cap;
    }
    /* remote -1: being registered; no other range can overlap it meanwhile */
    e->regs[e->nregs++] = (mc_reg_t){.addr = addr, .len = len, .remote = -1};
    return 0;
}

static void reg_drop(mc_engine_t *e, long i) {
    e->regs[i] = e->regs[e->nregs - 1];
    e->nregs--;
}

static int reg_one(mc_engine_t *e, ote_engine_t *ote, void *addr, size_t len, int remote) {
    if (addr == NULL || len == 0 || (uintptr_t)addr + len < (uintptr_t)addr) {
        OTE_ERROR(MC_LOG, "registerLocalMemory(%p, %zu): invalid range", addr, len);
        return OTE_MC_ERR_INVALID_ARGUMENT;
    }
    ote_mutex_lock(&e->mu);
    int rc = reg_reserve(e, (uintptr_t)addr, len);
    ote_mutex_unlock(&e->mu);
    if (rc != 0) {
        OTE_ERROR(
            MC_LOG, "registerLocalMemory(%p, %zu): %s", addr, len,
            rc == OTE_MC_ERR_ADDRESS_OVERLAPPED ? "overlaps a registered range" : "out of memory");
        return rc;
    }
    ote_status_t st =
        remote ? ote_memory_register(ote, addr, len, OTE_PERM_READ | OTE_PERM_WRITE) : OTE_OK;
    ote_mutex_lock(&e->mu);
    long i = reg_find(e, (uintptr_t)addr);
    if (st == OTE_OK) e->regs[i].remote = remote != 0;
    else reg_drop(e, i);
    ote_mutex_unlock(&e->mu);
    if (st != OTE_OK)
        OTE_ERROR(MC_LOG, "registerLocalMemory(%p, %zu): %s", addr, len, ote_status_str(st));
    return ote__mc_err(st);
}

static int unreg_one(mc_engine_t *e, ote_engine_t *ote, void *addr) {
    ote_mutex_lock(&e->mu);
    long i = reg_find(e, (uintptr_t)addr);
    int remote = i >= 0 ? e->regs[i].remote : 0;
    ote_mutex_unlock(&e->mu);
    if (i < 0 || remote < 0) {
        OTE_ERROR(MC_LOG, "unregisterLocalMemory(%p): not registered", addr);
        return OTE_MC_ERR_ADDRESS_NOT_REGISTERED;
    }
    ote_status_t st = remote ? ote_memory_unregister(ote, addr) : OTE_OK;
    if (st != OTE_OK) {
        OTE_ERROR(MC_LOG, "unregisterLocalMemory(%p): %s", addr, ote_status_str(st));
        return ote__mc_err(st);
    }
    ote_mutex_lock(&e->mu);
    i = reg_find(e, (uintptr_t)addr);
    if (i >= 0) reg_drop(e, i);
    ote_mutex_unlock(&e->mu);
    return 0;
}

int registerLocalMemory(transfer_engine_t engine, void *addr, size_t length, const char *location,
                        int remote_accessible) {
    (void)location; /* OrbitTE finds the memory's kind and NUMA node itself */
    mc_engine_t *e = ote__mc_engine(engine, "registerLocalMemory");
    if (e == NULL) return OTE_MC_ERR_INVALID_ARGUMENT;
    ote_engine_t *ote = ote__mc_ote(e, "registerLocalMemory");
    if (ote == NULL) return OTE_MC_ERR_CONTEXT;
    return reg_one(e, ote, addr, length, remote_accessible);
}

int unregisterLocalMemory(transfer_engine_t engine, void *addr) {
    mc_engine_t *e = ote__mc_engine(engine, "unregisterLocalMemory");
    if (e == NULL) return OTE_MC_ERR_INVALID_ARGUMENT;
    ote_engine_t *ote = ote__mc_ote(e, "unregisterLocalMemory");
    if (ote == NULL) return OTE_MC_ERR_CONTEXT;
    return unreg_one(e, ote, addr);
}

int registerLocalMemoryBatch(transfer_engine_t engine, buffer_entry_t *buffer_list,
                             size_t buffer_len, const char *location) {
    (void)location;
    mc_engine_t *e = ote__mc_engine(engine, "registerLocalMemoryBatch");
    if (e == NULL || (buffer_list == NULL && buffer_len > 0)) return OTE_MC_ERR_INVALID_ARGUMENT;
    ote_engine_t *ote = ote__mc_ote(e, "registerLocalMemoryBatch");
    if (ote == NULL) return OTE_MC_ERR_CONTEXT;
    for (size_t i = 0; i < buffer_len; i++) {
        int rc = reg_one(e, ote, buffer_list[i].addr, buffer_list[i].length, 1);
        if (rc == 0) continue;
        while (i-- > 0) (void)unreg_one(e, ote, buffer_list[i].addr); /* all or nothing */
        return rc;
    }
    return 0;
}

int unregisterLocalMemoryBatch(transfer_engine_t engine, void **addr_list, size_t addr_len) {
    mc_engine_t *e = ote__mc_engine(engine, "unregisterLocalMemoryBatch");
    if (e == NULL || (addr_list == NULL && addr_len > 0)) return OTE_MC_ERR_INVALID_ARGUMENT;
    ote_engine_t *ote = ote__mc_ote(e, "unregisterLocalMemoryBatch");
    if (ote == NULL) return OTE_MC_ERR_CONTEXT;
    int first = 0;
    for (size_t i = 0; i < addr_len; i++) {
        int rc = unreg_one(e, ote, addr_list[i]);
        if (first == 0) first = rc;
    }
    return first;
}

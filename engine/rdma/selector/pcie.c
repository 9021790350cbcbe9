/*
 * engine/rdma/selector/pcie.c - NIC ranks for a GPU from hwloc's PCIe tree (pcie.h).
 */
#include "engine/rdma/selector/pcie.h"

#include <errno.h>
#include <hwloc.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"

#define PCIE_LOG "rdma.selector"
#define PCIE_MAX_NICS 64

struct ote_pcie_topo {
    hwloc_topology_t topo;
};

ote_status_t ote_pcie_topo_load(ote_pcie_topo_t **out) {
    if (out == NULL) return OTE_ERR_INVALID;
    ote_pcie_topo_t *t = ote_calloc(1, sizeof(*t));
    if (t == NULL) return OTE_ERR_NOMEM;
    if (hwloc_topology_init(&t->topo) != 0) {
        OTE_WARN(PCIE_LOG, "hwloc_topology_init: %s: no PCIe ranks", strerror(errno));
        ote_free(t);
        return OTE_ERR_NATIVE;
    }
    (void)hwloc_topology_set_io_types_filter(t->topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_load(t->topo) != 0) {
        OTE_WARN(PCIE_LOG, "hwloc_topology_load (I/O objects): %s: no PCIe ranks", strerror(errno));
        hwloc_topology_destroy(t->topo);
        ote_free(t);
        return OTE_ERR_NATIVE;
    }
    *out = t;
    return OTE_OK;
}

void ote_pcie_topo_destroy(ote_pcie_topo_t *t) {
    if (t == NULL) return;
    hwloc_topology_destroy(t->topo);
    ote_free(t);
}

/* The PCI function of the OpenFabrics OS device named name, or NULL. */
static hwloc_obj_t nic_pci(hwloc_topology_t topo, const char *name) {
    hwloc_obj_t o = NULL;
    while ((o = hwloc_get_next_osdev(topo, o)) != NULL) {
        if (o->attr->osdev.type != HWLOC_OBJ_OSDEV_OPENFABRICS || o->name == NULL ||
            strcmp(o->name, name) != 0)
            continue;
        hwloc_obj_t p = o->parent;
        while (p != NULL && p->type != HWLOC_OBJ_PCI_DEVICE && hwloc_obj_type_is_io(p->type))
            p = p->parent;
        return p != NULL && p->type == HWLOC_OBJ_PCI_DEVICE ? p : NULL;
    }
    return NULL;
}

/* How many I/O ancestors o has (its PCIe depth). */
static int io_depth(hwloc_obj_t o) {
    int d = 0;
    for (hwloc_obj_t p = o->parent; p != NULL && hwloc_obj_type_is_io(p->type); p = p->parent) d++;
    return d;
}

/* The deepest common ancestor of a and b when it is a PCI-to-PCI bridge (they share a
 * PCIe switch), else NULL. */
static hwloc_obj_t common_switch(hwloc_obj_t a, hwloc_obj_t b) {
    for (hwloc_obj_t p = a->parent; p != NULL && hwloc_obj_type_is_io(p->type); p = p->parent) {
        for (hwloc_obj_t q = b->parent; q != NULL && hwloc_obj_type_is_io(q->type); q = q->parent) {
            if (p != q) continue;
            int pci_bridge = p->type == HWLOC_OBJ_BRIDGE &&
                             p->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_PCI;
            return pci_bridge ? p : NULL;
        }
    }
    return NULL;
}

/* Whether a and b (PCI functions) are in the same package, or without packages the same
 * NUMA nodes. */
static int same_package(hwloc_topology_t topo, hwloc_obj_t a, hwloc_obj_t b) {
    hwloc_obj_t na = hwloc_get_non_io_ancestor_obj(topo, a);
    hwloc_obj_t nb = hwloc_get_non_io_ancestor_obj(topo, b);
    if (na == NULL || nb == NULL) return 0;
    hwloc_obj_t pa = hwloc_get_ancestor_obj_by_type(topo, HWLOC_OBJ_PACKAGE, na);
    hwloc_obj_t pb = hwloc_get_ancestor_obj_by_type(topo, HWLOC_OBJ_PACKAGE, nb);
    if (na->type == HWLOC_OBJ_PACKAGE) pa = na;
    if (nb->type == HWLOC_OBJ_PACKAGE) pb = nb;
    if (pa != NULL || pb != NULL) return pa == pb;
    return na->nodeset != NULL && nb->nodeset != NULL &&
           hwloc_bitmap_isequal(na->nodeset, nb->nodeset);
}

static int hex_digit(char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* "dddd:bb:dd.f" exactly, the domain of 4 to 8 hex digits (CUDA writes 4, NVML 8), hex
 * digits of either case: 0, else -1. */
static int parse_busid(const char *id, unsigned *dom, unsigned *bus, unsigned *dev, unsigned *fn) {
    static const char tail[] = ":xx:xx.x";
    size_t nd = 0;
    unsigned v[4] = {0, 0, 0, 0};
    for (; hex_digit(id[nd]) >= 0 && nd < 9; nd++) v[0] = v[0] * 16 + (unsigned)hex_digit(id[nd]);
    if (nd < 4 || nd > 8 || strlen(id + nd) != sizeof(tail) - 1) return -1;
    unsigned k = 0;
    for (size_t i = 0; tail[i] != '\0'; i++) {
        char c = id[nd + i];
        if (tail[i] != 'x') {
            if (c != tail[i]) return -1;
            k++;
            continue;
        }
        int d = hex_digit(c);
        if (d < 0) return -1;
        v[k] = v[k] * 16 + (unsigned)d;
    }
    if (v[0] > 0xffff || v[2] > 0x1f || v[3] > 7) return -1;
    *dom = v[0];
    *bus = v[1];
    *dev = v[2];
    *fn = v[3];
    return 0;
}

ote_status_t ote_pcie_rank_nics(const ote_pcie_topo_t *t, const char *gpu_busid,
                                const char *const *nics, size_t n, int *ranks) {
    if (t == NULL || gpu_busid == NULL || (n > 0 && (nics == NULL || ranks == NULL)))
        return OTE_ERR_INVALID;
    if (n > PCIE_MAX_NICS) return OTE_ERR_TOO_BIG;
    unsigned dom = 0, bus = 0, dev = 0, fn = 0;
    if (parse_busid(gpu_busid, &dom, &bus, &dev, &fn) != 0) return OTE_ERR_INVALID;
    hwloc_obj_t g = hwloc_get_pcidev_by_busid(t->topo, dom, bus, dev, fn);
    if (g == NULL) return OTE_ERR_NOT_FOUND;
    int deepest = -1; /* the deepest switch any NIC shares with the GPU */
    int sw_depth[PCIE_MAX_NICS];
    for (size_t i = 0; i < n; i++) {
        hwloc_obj_t p = nics[i] != NULL ? nic_pci(t->topo, nics[i]) : NULL;
        hwloc_obj_t c = p != NULL ? common_switch(g, p) : NULL;
        sw_depth[i] = c != NULL ? io_depth(c) : -1;
        if (sw_depth[i] > deepest) deepest = sw_depth[i];
        if (p == NULL) ranks[i] = OTE_PCIE_RANK_UNPLACED;
        else if (c != NULL) ranks[i] = OTE_PCIE_RANK_SWITCH;
        else if (same_package(t->topo, g, p)) ranks[i] = OTE_PCIE_RANK_PACKAGE;
        else ranks[i] = OTE_PCIE_RANK_SYSTEM;
    }
    for (size_t i = 0; i < n; i++)
        if (ranks[i] == OTE_PCIE_RANK_SWITCH && sw_depth[i] == deepest)
            ranks[i] = OTE_PCIE_RANK_NEAREST;
    return OTE_OK;
}

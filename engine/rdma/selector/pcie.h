/*
 * engine/rdma/selector/pcie.h - NIC ranks for a GPU's memory from the PCIe tree (hwloc's
 * I/O objects), part of the selector library: it knows PCI bus ids and device names,
 * nothing of verbs, CUDA or the engine.
 *
 * The topology is hwloc's with I/O objects (bridges, PCI functions, OS devices kept when
 * important): the machine's, or the XML file that HWLOC_XMLFILE names (hwloc's own rule;
 * how the tests load recorded shapes). A GPU is found by its PCI bus id
 * (hwloc_get_pcidev_by_busid), a NIC by the OpenFabrics OS device of its name ("mlx5_0")
 * and the PCI function above it. The rank of a NIC for a GPU, lower is nearer:
 *   OTE_PCIE_RANK_NEAREST  they share a PCIe switch (their deepest common ancestor is a
 *                          PCI-to-PCI bridge, below the host bridge) and no NIC shares a
 *                          deeper bridge with the GPU (a GPU and a NIC behind the same
 *                          leaf switch; every NIC of a flat switch);
 *   OTE_PCIE_RANK_SWITCH   they share a PCIe switch, another NIC shares a deeper one;
 *   OTE_PCIE_RANK_PACKAGE  same package (socket), else the same NUMA node;
 *   OTE_PCIE_RANK_SYSTEM   placed, elsewhere in the machine;
 *   OTE_PCIE_RANK_UNPLACED the topology does not place the NIC (usable, last).
 */
#ifndef OTE_ENGINE_RDMA_SELECTOR_PCIE_H
#define OTE_ENGINE_RDMA_SELECTOR_PCIE_H

#include <stddef.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    OTE_PCIE_RANK_NEAREST = 0,
    OTE_PCIE_RANK_SWITCH = 1,
    OTE_PCIE_RANK_PACKAGE = 2,
    OTE_PCIE_RANK_SYSTEM = 3,
    OTE_PCIE_RANK_UNPLACED = 4,
};

typedef struct ote_pcie_topo ote_pcie_topo_t;

/* Load the topology with I/O objects (see above). OTE_ERR_NATIVE when hwloc cannot
 * (logged), OTE_ERR_NOMEM. */
ote_status_t ote_pcie_topo_load(ote_pcie_topo_t **out);
void ote_pcie_topo_destroy(ote_pcie_topo_t *t);

/* ranks[i] := the rank of NIC nics[i] for the GPU at PCI bus id gpu_busid
 * ("dddd:bb:dd.f", any case; a domain of up to 8 digits as NVML writes it).
 * OTE_ERR_NOT_FOUND (ranks untouched) when the topology has no PCI function at that bus
 * id; OTE_ERR_INVALID for a malformed bus id; OTE_ERR_TOO_BIG past 64 NICs. */
ote_status_t ote_pcie_rank_nics(const ote_pcie_topo_t *t, const char *gpu_busid,
                                const char *const *nics, size_t n, int *ranks);

#ifdef __cplusplus
}
#endif
#endif

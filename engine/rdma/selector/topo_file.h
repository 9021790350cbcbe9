/*
 * engine/rdma/selector/topo_file.h - the rdma_topology file: NICs in order per GPU and
 * per NUMA node, for machines whose PCIe tree hwloc reads wrongly. Part of the selector
 * library (names only: what a GPU or a node is, is the caller's business).
 *
 * Text, one entry per line; '#' starts a comment, blank lines are skipped, words are
 * separated by spaces or tabs:
 *     gpu0  mlx5_0 mlx5_1     # CUDA device 0: mlx5_0 first, then mlx5_1, then the rest
 *     numa1 mlx5_4 mlx5_5     # host memory on NUMA node 1
 * The head is "gpu<N>" or "numa<N>" (N in 0..OTE_TOPO_FILE_MAX_INDEX), followed by 1 to
 * OTE_SELECTOR_MAX_DEVICES device names, each at most once. An entry replaces the
 * automatic ranking for what it names: the NIC at position p ranks p, a NIC it does not
 * list ranks after all it lists. A head may appear once.
 */
#ifndef OTE_ENGINE_RDMA_SELECTOR_TOPO_FILE_H
#define OTE_ENGINE_RDMA_SELECTOR_TOPO_FILE_H

#include <stddef.h>

#include "base/status.h"
#include "engine/rdma/selector/selector.h"

#ifdef __cplusplus
extern "C" {
#endif

#define OTE_TOPO_FILE_MAX_INDEX 63
#define OTE_TOPO_FILE_MAX_ENTRIES 128

typedef enum { OTE_TOPO_GPU = 0, OTE_TOPO_NUMA = 1 } ote_topo_kind_t;

typedef struct {
    ote_topo_kind_t kind;
    int index; /* N of gpu<N> / numa<N> */
    int line;  /* 1-based line of the file */
    size_t n;  /* NICs listed, in order */
    char nics[OTE_SELECTOR_MAX_DEVICES][OTE_SELECTOR_NAME_MAX];
} ote_topo_entry_t;

typedef struct {
    size_t n;
    ote_topo_entry_t e[OTE_TOPO_FILE_MAX_ENTRIES];
} ote_topo_file_t;

/* Read and check the file at path. OTE_OK with *out (ote_topo_file_free); else
 * OTE_ERR_INVALID (or OTE_ERR_NOT_FOUND when it cannot be opened, OTE_ERR_NOMEM) and
 * err[0, errcap) says what is wrong and on which line ("line 3: ..."). */
ote_status_t ote_topo_file_read(const char *path, ote_topo_file_t **out, char *err, size_t errcap);
void ote_topo_file_free(ote_topo_file_t *f);
/* The entry of kind and index, or NULL. */
const ote_topo_entry_t *ote_topo_file_find(const ote_topo_file_t *f, ote_topo_kind_t kind,
                                           int index);

#ifdef __cplusplus
}
#endif
#endif

/*
 * engine/rdma/rdma_topo.c - which data device is near which memory: the selector's rank
 * tables per GPU and per NUMA node, and the text ote_engine_topology prints.
 *
 * At creation (after the data devices joined the selector): the rdma_topology file, when
 * configured, is read (a bad file fails the creation, its ERROR naming the line); the PCIe
 * tree is loaded from hwloc with I/O objects (engine/rdma/selector/pcie.h) on real
 * devices, and on the sim when HWLOC_XMLFILE names a recorded topology. Then every NUMA
 * node the file names gets its table, and every CUDA device of the engine's driver (once
 * the driver is loaded in this process: at creation, else at the first GPUDirect
 * registration or topology print) gets one, first of:
 *   file   the file's gpu<N> line;
 *   pcie   its PCIe ranks (same leaf switch, same switch, same package, elsewhere, unplaced);
 *   numa   the ranks of its NUMA node (the GPU is not in the PCIe tree);
 *   equal  every device rank 0 (nothing known).
 * A slice of GPUDirect memory of CUDA device g carries locality OTE__LOC_GPU(g), host
 * memory its NUMA node (engine/batch.c): the selector ranks by these tables.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/lock.h"
#include "base/log.h"
#include "engine/rdma/rdma_internal.h"
#include "engine/rdma/selector/pcie.h"
#include "engine/rdma/selector/topo_file.h"

#define TOPO_MAX_GPUS 16

typedef enum { SRC_NONE = 0, SRC_FILE, SRC_PCIE, SRC_NUMA, SRC_EQUAL } topo_src_t;

static const char *const g_src_name[] = {"", "file", "pcie", "numa", "equal"};

typedef enum { GPUS_UNKNOWN = 0, GPUS_KNOWN } gpus_state_t;

struct rdma_topo {
    ote_mutex_t mu;
    ote_topo_file_t *file; /* NULL: none configured */
    ote_pcie_topo_t *pcie; /* NULL: not loaded */
    gpus_state_t gpus;     /* under mu */
    int ngpus;
    char bus[TOPO_MAX_GPUS][32];
    int gpu_node[TOPO_MAX_GPUS];
    topo_src_t gpu_src[TOPO_MAX_GPUS];
};

/* The selector index of each device the entry lists, in its order: ranks[i] = position,
 * -1 for a device it does not list. A listed name that is no data device is logged. */
static void file_ranks(rdma_tp_t *tp, const ote_topo_entry_t *e, int *ranks, size_t n) {
    for (size_t i = 0; i < n; i++) ranks[i] = -1;
    for (size_t p = 0; p < e->n; p++) {
        int found = 0;
        for (size_t i = 0; i < n; i++) {
            ote_selector_stats_t st;
            if (ote_selector_stats(tp->sel, (int)i, &st) == OTE_OK &&
                strcmp(st.name, e->nics[p]) == 0) {
                ranks[i] = (int)p;
                found = 1;
            }
        }
        if (!found)
            OTE_WARN("rdma",
                     "rdma_topology=%s line %d: %s is not a data device of this engine: "
                     "left out",
                     tp->cfg.rdma_topology, e->line, e->nics[p]);
    }
}

/* GPU g's table (under t->mu). */
static void gpu_table(rdma_tp_t *tp, struct rdma_topo *t, int g) {
    size_t n = ote_selector_count(tp->sel);
    int ranks[OTE_SELECTOR_MAX_DEVICES] = {0};
    const ote_topo_entry_t *e = ote_topo_file_find(t->file, OTE_TOPO_GPU, g);
    const char *names[OTE_SELECTOR_MAX_DEVICES];
    ote_selector_stats_t st[OTE_SELECTOR_MAX_DEVICES];
    for (size_t i = 0; i < n; i++) {
        names[i] = ote_selector_stats(tp->sel, (int)i, &st[i]) == OTE_OK ? st[i].name : NULL;
    }
    if (e != NULL) {
        file_ranks(tp, e, ranks, n);
        t->gpu_src[g] = SRC_FILE;
    } else if (t->pcie != NULL &&
               ote_pcie_rank_nics(t->pcie, t->bus[g], names, n, ranks) == OTE_OK) {
        t->gpu_src[g] = SRC_PCIE;
    } else if (t->gpu_node[g] >= 0) {
        for (size_t i = 0; i < n; i++)
            ranks[i] = ote_selector_rank(tp->sel, (int)i, t->gpu_node[g]);
        t->gpu_src[g] = SRC_NUMA;
    } else {
        t->gpu_src[g] = SRC_EQUAL;
    }
    (void)ote_selector_set_ranks(tp->sel, OTE__LOC_GPU(g), ranks, n);
}

void ote__rdma_topo_gpus(rdma_tp_t *tp) {
    struct rdma_topo *t = tp->topo;
    if (t == NULL) return;
    ote_mutex_lock(&t->mu);
    if (t->gpus == GPUS_UNKNOWN && tp->host.gpu.device_place != NULL) {
        int g = 0;
        for (; g < TOPO_MAX_GPUS && g < OTE__LOC_GPUS; g++) {
            int node = -1;
            if (tp->host.gpu.device_place(tp->host.gpu.arg, g, t->bus[g], sizeof(t->bus[g]),
                                          &node) != OTE_OK)
                break;
            t->gpu_node[g] = node;
            gpu_table(tp, t, g);
        }
        if (g > 0) { /* the driver is loaded: its devices are known from now on */
            t->ngpus = g;
            t->gpus = GPUS_KNOWN;
            OTE_INFO("rdma", "transport=rdma: NIC ranks for %d CUDA device(s) (%s)", g,
                     g_src_name[t->gpu_src[0]]);
        }
    }
    ote_mutex_unlock(&t->mu);
}

/* The file's NUMA tables. */
static void numa_tables(rdma_tp_t *tp, struct rdma_topo *t) {
    size_t n = ote_selector_count(tp->sel);
    for (size_t k = 0; t->file != NULL && k < t->file->n; k++) {
        const ote_topo_entry_t *e = &t->file->e[k];
        if (e->kind != OTE_TOPO_NUMA) continue;
        int ranks[OTE_SELECTOR_MAX_DEVICES];
        file_ranks(tp, e, ranks, n);
        (void)ote_selector_set_ranks(tp->sel, e->index, ranks, n);
    }
}

ote_status_t ote__rdma_topo_start(rdma_tp_t *tp) {
    struct rdma_topo *t = ote_calloc(1, sizeof(*t));
    if (t == NULL) return OTE_ERR_NOMEM;
    ote_status_t st = ote_mutex_init(&t->mu);
    if (st != OTE_OK) {
        ote_free(t);
        return st;
    }
    tp->topo = t;
    if (tp->cfg.rdma_topology[0] != '\0') {
        char err[256];
        st = ote_topo_file_read(tp->cfg.rdma_topology, &t->file, err, sizeof(err));
        if (st != OTE_OK) {
            OTE_ERROR("rdma", "rdma_topology=%s: %s", tp->cfg.rdma_topology, err);
            return ote_status_code(st) == OTE_ERR_NOMEM ? st : OTE_ERR_INVALID;
        }
    }
    if (strcmp(tp->v->provider, "sim") != 0 || getenv("HWLOC_XMLFILE") != NULL)
        (void)ote_pcie_topo_load(&t->pcie); /* none: the GPUs rank by their NUMA node */
    numa_tables(tp, t);
    ote__rdma_topo_gpus(tp);
    return OTE_OK;
}

void ote__rdma_topo_stop(rdma_tp_t *tp) {
    struct rdma_topo *t = tp->topo;
    if (t == NULL) return;
    ote_pcie_topo_destroy(t->pcie);
    ote_topo_file_free(t->file);
    ote_mutex_destroy(&t->mu);
    ote_free(t);
    tp->topo = NULL;
}

/* snprintf-like appending: len counts every byte asked for, what fits is written. */
typedef struct {
    char *buf;
    size_t cap, len;
} text_t;

static void put(text_t *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text_t *x, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = x->len < x->cap ? x->cap - x->len : 0;
    int k = vsnprintf(room > 0 ? x->buf + x->len : NULL, room, fmt, ap);
    va_end(ap);
    if (k > 0) x->len += (size_t)k;
}

/* One line: the devices by rank at loc (best first, ties in device order). */
static void put_ranks(rdma_tp_t *tp, text_t *x, int loc) {
    size_t n = ote_selector_count(tp->sel);
    int r[OTE_SELECTOR_MAX_DEVICES], done[OTE_SELECTOR_MAX_DEVICES] = {0};
    for (size_t i = 0; i < n; i++) r[i] = ote_selector_rank(tp->sel, (int)i, loc);
    for (size_t k = 0; k < n; k++) {
        int best = -1;
        for (size_t i = 0; i < n; i++)
            if (!done[i] && (best < 0 || r[i] < r[best])) best = (int)i;
        done[best] = 1;
        ote_selector_stats_t st;
        if (ote_selector_stats(tp->sel, best, &st) == OTE_OK) put(x, " %s=%d", st.name, r[best]);
    }
    put(x, "\n");
}

size_t ote__rdma_topology(ote__transport_t *base, char *buf, size_t cap) {
    rdma_tp_t *tp = (rdma_tp_t *)base;
    struct rdma_topo *t = tp->topo;
    text_t x = {buf, cap, 0};
    if (cap > 0) buf[0] = '\0';
    if (t == NULL) return 0;
    ote__rdma_topo_gpus(tp);
    ote_mutex_lock(&t->mu);
    int maxnode = 0;
    for (int g = 0; g < t->ngpus; g++) {
        put(&x, "gpu%d %s %s:", g, t->bus[g], g_src_name[t->gpu_src[g]]);
        put_ranks(tp, &x, OTE__LOC_GPU(g));
        if (t->gpu_node[g] > maxnode) maxnode = t->gpu_node[g];
    }
    for (size_t i = 0; i < ote_selector_count(tp->sel); i++) {
        ote_selector_stats_t st;
        if (ote_selector_stats(tp->sel, (int)i, &st) == OTE_OK && st.numa_node > maxnode)
            maxnode = st.numa_node;
    }
    for (size_t k = 0; t->file != NULL && k < t->file->n; k++)
        if (t->file->e[k].kind == OTE_TOPO_NUMA && t->file->e[k].index > maxnode)
            maxnode = t->file->e[k].index;
    for (int node = 0; node <= maxnode && node < OTE__LOC_GPU0; node++) {
        int filed = ote_topo_file_find(t->file, OTE_TOPO_NUMA, node) != NULL;
        put(&x, "numa%d %s:", node, filed ? "file" : "numa");
        put_ranks(tp, &x, node);
    }
    ote_mutex_unlock(&t->mu);
    return x.len;
}

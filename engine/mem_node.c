/*
 * engine/mem_node.c - the NUMA node of registered memory, for the RDMA device selector's
 * topology rank (the NIC nearest the memory first).
 *
 * Host memory: the node of its pages, asked of the kernel with move_pages(2) in query
 * mode (nodes NULL: nothing moves and pages not yet touched are not faulted in) for the
 * first, middle and last page of the range; one node for all three, else -1 (untouched
 * pages, a policy that interleaves, or a kernel without NUMA). One system call and no
 * library on purpose: hwloc's hwloc_get_area_memlocation makes the same call but needs a
 * loaded topology, which the registry does not keep, and libnuma's numa_move_pages is
 * the same call behind a library we do not otherwise link (third_party/BUILD.bazel).
 * Device memory: the node of its GPU's PCI function (engine/gpu).
 */
#include <errno.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "engine/core_internal.h"
#include "engine/registry_internal.h"
#include "engine/gpu/gpu.h"

static int host_node(uint64_t addr, uint64_t len) {
#ifdef SYS_move_pages
    long psz = sysconf(_SC_PAGESIZE);
    if (psz <= 0 || len == 0) return -1;
    uint64_t first = addr & ~((uint64_t)psz - 1);
    uint64_t last = (addr + len - 1) & ~((uint64_t)psz - 1);
    uint64_t mid = (first + (last - first) / 2) & ~((uint64_t)psz - 1);
    void *pages[3] = {(void *)(uintptr_t)first, (void *)(uintptr_t)mid, (void *)(uintptr_t)last};
    int status[3] = {-1, -1, -1};
    if (syscall(SYS_move_pages, 0, 3L, pages, NULL, status, 0) != 0) return -1;
    if (status[0] < 0 || status[1] != status[0] || status[2] != status[0]) return -1;
    return status[0];
#else
    (void)addr;
    (void)len;
    return -1;
#endif
}

int ote__mem_node(ote_engine_t *e, uint64_t addr, uint64_t len, uint32_t kind) {
    if (OTE_MEM_IS_CUDA(kind)) return ote__gpu_device_node(e->gpu, OTE_MEM_CUDA_DEVICE(kind));
    return host_node(addr, len);
}

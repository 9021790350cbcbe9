/*
 * engine/testing.c - the test-only library //engine:testing: installs the engine's test
 * hooks (hooks.h) and the RDMA transport's (engine/rdma/test_hook.h, by its own library)
 * when a test binary is loaded. The hooks read their environment variables when called:
 *
 *   OTE_TEST_HOST_SUFFIX=s    this process's engines advertise their host's boot id + s
 *                             (two engines of one host then look like two hosts)
 *   OTE_TEST_SHM_NO_MARKS=1   its shm sources offer no staging marks
 */
#include <stdlib.h>

#include "engine/hooks.h"
#include "engine/testing.h"

static const char *host_suffix(void) { return getenv("OTE_TEST_HOST_SUFFIX"); }

static int shm_no_marks(void) { return getenv("OTE_TEST_SHM_NO_MARKS") != NULL; }

__attribute__((constructor)) static void install(void) {
    ote__engine_hooks.host_suffix = host_suffix;
    ote__engine_hooks.shm_no_marks = shm_no_marks;
}

void ote__test_tcp_file_write_hook(void (*fn)(void *arg), void *arg) {
    ote__engine_hooks.tcp_file_write_arg = arg;
    ote__engine_hooks.tcp_file_write = fn;
}

void ote__test_file_mapped_hook(void (*fn)(void *arg, uint64_t addr, uint32_t len), void *arg) {
    ote__engine_hooks.file_mapped_arg = arg;
    ote__engine_hooks.file_mapped = fn;
}

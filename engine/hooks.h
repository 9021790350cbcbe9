/*
 * engine/hooks.h - the few behaviours of the engine a test may change in its process.
 *
 * Every pointer is NULL in the shipped library, which then behaves as in production;
 * the test-only library //engine:testing (engine/testing.c) installs them before main
 * (reading its OTE_TEST_* environment variables when they are called), so no test hook,
 * and no OTE_TEST_ name, is in liborbitte.so. Set once, before any engine exists; read
 * without a lock.
 */
#ifndef OTE_ENGINE_HOOKS_H
#define OTE_ENGINE_HOOKS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    /* Appended to this host's boot id in the engine's advertisement (router.c), so that
     * two engines of one host look like two hosts: NULL or "" for none. */
    const char *(*host_suffix)(void);
    /* Nonzero: the shm source answers as a protocol 3 source without staging marks would
     * (shm_ring.c), so that tests reach the requester's stage-then-send path. */
    int (*shm_no_marks)(void);
    /* Called by the tcp source on its worker thread right before it starts writing a
     * peer's WRITE slice into a file registration (tcp_fread.c), the slice's pin still
     * held: a test unregisters there (engine/testing.h). */
    void (*tcp_file_write)(void *arg);
    void *tcp_file_write_arg;
    /* Called by the file owner right after it answered a peer's READ of [addr, +len) from
     * the page cache (map_read in engine/file/file.c), before the transport's copy of them:
     * a test truncates the file there (engine/testing.h). */
    void (*file_mapped)(void *arg, uint64_t addr, uint32_t len);
    void *file_mapped_arg;
} ote__engine_hooks_t;

extern ote__engine_hooks_t ote__engine_hooks;

#ifdef __cplusplus
}
#endif
#endif

/*
 * engine/testing.h - what a test may set inside the engine, beside the OTE_TEST_*
 * variables engine/testing.c reads: the header of the test-only library //engine:testing
 * (never in liborbitte.so).
 *
 * ote__test_tcp_file_write_hook: fn(arg) is called by every tcp source of this process on
 * its worker thread right before it starts writing a peer's WRITE slice into a file
 * registration, while the slice still holds the registration (engine/tcp/tcp_fread.c).
 * NULL clears it. Set and clear it while no such write runs.
 */
#ifndef OTE_ENGINE_TESTING_H
#define OTE_ENGINE_TESTING_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

void ote__test_tcp_file_write_hook(void (*fn)(void *arg), void *arg);
/* fn(arg, addr, len) is called by every engine's file owner of this process right after
 * it answered a peer's READ of [addr, +len) of a file registration from the page cache
 * (file_zero_copy), before the transport copies those bytes (engine/file/file.c), on
 * the transport's thread. NULL clears it. Set and clear it while no READ runs. */
void ote__test_file_mapped_hook(void (*fn)(void *arg, uint64_t addr, uint32_t len), void *arg);

#ifdef __cplusplus
}
#endif
#endif

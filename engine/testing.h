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

#ifdef __cplusplus
extern "C" {
#endif

void ote__test_tcp_file_write_hook(void (*fn)(void *arg), void *arg);

#ifdef __cplusplus
}
#endif
#endif

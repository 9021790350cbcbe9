/*
 * tests/cuda/fake_cufile_control.h - the test control API of the fake libcufile
 * (tests/cuda:libfake_cufile.so, fake_cufile.c).
 *
 * Looked up with dlsym() on the cuFile library's handle (ote_cufile_dl_handle()); on a
 * real libcufile the lookup fails and fake-only cases skip.
 */
#ifndef OTE_TESTS_CUDA_FAKE_CUFILE_CONTROL_H
#define OTE_TESTS_CUDA_FAKE_CUFILE_CONTROL_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fake_cufile_counters {
    long driver_opens;  /* cuFileDriverOpen minus cuFileDriverClose */
    long handles;       /* live cuFileHandleRegister handles */
    long bufs;          /* live cuFileBufRegister registrations */
    long reads, writes; /* cuFileRead / cuFileWrite calls that moved bytes */
    long registers;     /* cuFileBufRegister calls that registered (ever) */
    long bounce_io;     /* cuFileRead / cuFileWrite calls whose buffer base was no
                           registered buffer's (libcufile's own bounce buffers) */
} fake_cufile_counters_t;

/* Fault hooks: the next `count` calls of `call` ("cuFileDriverOpen", "cuFileRead",
 * "cuFileWrite", "cuFileBufRegister", "cuFileHandleRegister") fail. For cuFileRead and
 * cuFileWrite err > 0 is an errno (the call returns -1 with errno set), err < 0 a
 * negated CUfileOpError returned as is; for the others err is the CUfileOpError. */
typedef int (*fake_cufile_fail_fn)(const char *call, int err, int count);
typedef void (*fake_cufile_clear_faults_fn)(void);
typedef void (*fake_cufile_counters_fn)(fake_cufile_counters_t *out);

#ifdef __cplusplus
}
#endif
#endif

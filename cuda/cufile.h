/*
 * cuda/cufile.h - the cuFile (GPUDirect Storage) API table, loaded at run time.
 *
 * Like the CUDA driver (cuda/driver.h), libcufile is never linked: it is opened with
 * dlopen() (`libcufile.so.0`, or the file named by $OTE_CUFILE_LIBRARY) when a request
 * first moves bytes between device memory and a file. A missing library is not an
 * error for the engine: ote_cufile_load() says OTE_ERR_NO_DEVICE with one INFO line and
 * the caller stages through pinned host memory instead.
 *
 * The declarations are OrbitTE's own copy of the parts of NVIDIA's cufile.h ABI used
 * here (no cuFile header is needed to build): CUfileError_t is returned by value
 * ({err, cu_err}); CUfileDescr_t is {type, union {int fd; void *handle}, fs_ops};
 * cuFileRead/cuFileWrite return the bytes moved, -1 with errno for a system error, or
 * the negative CUfileOpError.
 */
#ifndef OTE_CUDA_CUFILE_H
#define OTE_CUDA_CUFILE_H

#include <stddef.h>
#include <sys/types.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef int ote_cufile_op_error_t; /* CUfileOpError; 0 = CU_FILE_SUCCESS */
typedef struct ote_cufile_error {
    ote_cufile_op_error_t err;
    int cu_err;       /* CUresult when err is CU_FILE_CUDA_DRIVER_ERROR */
} ote_cufile_error_t; /* CUfileError_t */

#define OTE_CUFILE_SUCCESS 0
#define OTE_CUFILE_OP_BASE_ERR 5000            /* CUFILEOP_BASE_ERR */
#define OTE_CUFILE_DRIVER_NOT_INITIALIZED 5001 /* CU_FILE_DRIVER_NOT_INITIALIZED */
#define OTE_CUFILE_HANDLE_TYPE_OPAQUE_FD 1     /* CU_FILE_HANDLE_TYPE_OPAQUE_FD */

typedef struct ote_cufile_descr {
    int type; /* CUfileFileHandleType */
    union {
        int fd;
        void *handle;
    } handle;
    const void *fs_ops; /* const CUfileFSOps_t *, NULL for OPAQUE_FD */
} ote_cufile_descr_t;   /* CUfileDescr_t */

typedef void *ote_cufile_handle_t; /* CUfileHandle_t */

typedef struct ote_cufile_table {
    ote_cufile_error_t (*cuFileDriverOpen)(void);
    ote_cufile_error_t (*cuFileDriverClose)(void); /* cuFileDriverClose_v2 where exported */
    ote_cufile_error_t (*cuFileHandleRegister)(ote_cufile_handle_t *fh, ote_cufile_descr_t *descr);
    void (*cuFileHandleDeregister)(ote_cufile_handle_t fh);
    ote_cufile_error_t (*cuFileBufRegister)(const void *buf, size_t length, int flags);
    ote_cufile_error_t (*cuFileBufDeregister)(const void *buf);
    ssize_t (*cuFileRead)(ote_cufile_handle_t fh, void *buf, size_t size, off_t file_offset,
                          off_t buf_offset);
    ssize_t (*cuFileWrite)(ote_cufile_handle_t fh, const void *buf, size_t size, off_t file_offset,
                           off_t buf_offset);
} ote_cufile_table_t;

typedef struct ote_cufile ote_cufile_t;

/* Open libcufile (path NULL: $OTE_CUFILE_LIBRARY when set, else libcufile.so.0), resolve
 * the table and call cuFileDriverOpen. OTE_ERR_NO_DEVICE (one INFO line) when the library
 * is absent or the driver does not open; OTE_ERR_UNSUPPORTED naming a missing symbol. */
ote_status_t ote_cufile_load(const char *path, ote_cufile_t **out);
/* cuFileDriverClose, then the library is closed. */
void ote_cufile_unload(ote_cufile_t *cf);
const ote_cufile_table_t *ote_cufile_table(const ote_cufile_t *cf);
/* The dlopen handle: tests look up the fake's control functions on it. */
void *ote_cufile_dl_handle(const ote_cufile_t *cf);

/* Status for a CUfileError_t: OTE_OK, else OTE_ERR_NATIVE keeping err as the errno
 * field; logged at WARN as "<call>: CUfileOpError N (CUresult M)". */
ote_status_t ote_cufile_check(ote_cufile_error_t e, const char *call);
/* Status for a cuFileRead/cuFileWrite result that is not the full length: -1 -> errno
 * (OTE_ERR_IO for EIO), other negatives -> OTE_ERR_NATIVE (the CUfileOpError), a short
 * count -> OTE_ERR_IO. Logged at WARN with call. */
ote_status_t ote_cufile_io_status(ssize_t ret, int err, size_t want, const char *call);

#ifdef __cplusplus
}
#endif
#endif

/*
 * engine/file/file.h - files and block devices as transfer endpoints (//engine/file,
 * docs/files.md): the engine's file registrations (a byte range of a file, at an address
 * of their own that requests name as remote_addr) and the transport of the local
 * segment (ote_segment_open_local) that moves bytes between this process's memory and
 * them, through io_uring or, where io_uring is not available, a preadv/pwritev thread
 * pool. Like a transport it sees engine/transport.h and the resolved configuration only;
 * the engine's top (engine.c, file_api.c) composes it.
 *
 * Addresses: file registrations live at OTE__FILE_ADDR_BASE and up, above every user
 * space address of x86-64 and arm64 (at most 2^57), so they never overlap memory
 * registrations. Each gets its own 1 GiB-aligned window, never reused by the engine.
 */
#ifndef OTE_ENGINE_FILE_FILE_H
#define OTE_ENGINE_FILE_FILE_H

#include <stdint.h>

#include "engine/engine_internal.h"
#include "engine/transport.h"
#include "ote/ote.h"

#ifdef __cplusplus
extern "C" {
#endif

#define OTE__FILE_ADDR_BASE 0xF000000000000000ull

typedef struct ote__files ote__files_t;

/* The engine's file owner (cheap: its I/O engine starts with the first registration). */
ote_status_t ote__files_create(const ote__cfg_t *cfg, ote__files_t **out);
/* OTE_ERR_BUSY while a registration is in use (a slice in flight); otherwise closes
 * every file, stops the I/O engine and frees f. */
ote_status_t ote__files_destroy(ote__files_t *f);
/* ote_file_register: see <ote/ote.h>. */
ote_status_t ote__files_register(ote__files_t *f, const char *path, int fd, uint64_t offset,
                                 uint64_t len, unsigned perms, const char *name,
                                 uint64_t *addr_out);
ote_status_t ote__files_unregister(ote__files_t *f, uint64_t addr);
/* ote_file_query: the registration containing addr (OTE_ERR_NOT_FOUND). */
ote_status_t ote__files_query(ote__files_t *f, uint64_t addr, ote_buffer_info_t *out);
/* Buffer discovery: the registrations with the cap lowest addresses into out (as
 * ote__files_query describes each), in address order; *n_out of them, *total_out the
 * registrations there are. */
ote_status_t ote__files_list(ote__files_t *f, ote_buffer_info_t *out, size_t cap, size_t *n_out,
                             size_t *total_out);
/* The I/O engine in use ("io_uring", "threads"), "" before the first registration. */
const char *ote__files_engine(ote__files_t *f);
/* host->pin and host->unpin for an address in the file windows (the registry calls
 * them for a perm with OTE__PIN_FILE): the registration holding [addr, +len) with perm
 * (OTE_PERM_* bits), pinned; OTE_ERR_ACCESS otherwise. */
ote_status_t ote__files_pin(ote__files_t *f, uint64_t addr, uint64_t len, unsigned perm,
                            void **pin_out);
void ote__files_unpin(ote__files_t *f, void *pin);
/* The bounce services of host->file (transport.h). */
ote__file_ops_t ote__files_services(ote__files_t *f);
/* The engine's device registration at start is being unregistered (under the registry's
 * write lock, no request holding it): what the file owner kept of it goes (its cuFile
 * buffer registration, engine/file/gds.c). f may be NULL. */
void ote__files_dev_unregister(ote__files_t *f, uint64_t start);
/* Every cuFile registration kept of device memory goes (the engine's destroy, no segment
 * open, before the CUDA layer's destroy). f may be NULL. */
void ote__files_release_device(ote__files_t *f);
/* Bytes of peers' READs of file registrations sent straight from the page cache
 * (file_zero_copy), and bytes of files read into bounce buffers for peers (READs, rdma's
 * WRITEs), since creation. f may be NULL. */
void ote__files_read_bytes(ote__files_t *f, uint64_t *mapped_out, uint64_t *bounced_out);
/* The local segment's transport: peer_open ignores its peer argument. */
ote__transport_t *ote__files_transport(ote__files_t *f);

#ifdef __cplusplus
}
#endif
#endif

/*
 * base/vm.h - can this process touch a range of its own address space?
 *
 * Registration hands OrbitTE an address and a length; a peer's request later makes the
 * engine (or the software NIC, or the kernel on its behalf) read or write those bytes.
 * A range that is not mapped, mapped PROT_NONE (a CUDA device address, a guard page),
 * mapped read-only while peers may WRITE it, or a file mapping that runs past the end of
 * its file (touching those pages raises SIGBUS) would kill the process at that moment,
 * long after the call that accepted it returned OK. ote_vm_check answers the question up
 * front, from the kernel's own list of mappings (/proc/self/maps): every byte must lie in
 * a mapping with the access asked, with no hole in between. For file-backed mappings it
 * also reads one byte of the last page of the range in each (process_vm_readv from this
 * process: a page past the file's end fails with EFAULT there instead of raising a
 * signal), so a file shorter than its mapping is found.
 *
 * The answer is about now: memory unmapped or a file truncated afterwards is the caller's
 * own doing. Without /proc (a chroot without it), every page is read once through
 * process_vm_readv instead; write access cannot be seen that way and is then assumed.
 * Thread-safe; no lock, no allocation outside the call.
 */
#ifndef OTE_BASE_VM_H
#define OTE_BASE_VM_H

#include <stdint.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define OTE_VM_READ 0x1u  /* the bytes will be read */
#define OTE_VM_WRITE 0x2u /* the bytes will be written */

typedef enum {
    OTE_VM_OK = 0,        /* every byte is mapped with the access asked */
    OTE_VM_UNMAPPED = 1,  /* some byte is not mapped at all */
    OTE_VM_NO_ACCESS = 2, /* mapped, but without the access asked (PROT_NONE, read-only) */
    OTE_VM_PAST_EOF = 3,  /* a file mapping beyond the end of its file */
} ote_vm_verdict_t;

typedef struct {
    ote_vm_verdict_t verdict;
    uint64_t at;   /* not OK: the first address found wanting (a page start for PAST_EOF) */
    unsigned prot; /* OK: OTE_VM_READ/WRITE that every byte has (a superset of access) */
    char what[96]; /* not OK: the mapping at `at` as the kernel names it ("r--p
                        * /data/model.bin", "---p [anon]"), "" for a hole */
} ote_vm_report_t;

/* Checks [addr, addr+len) for `access` (OTE_VM_READ and/or OTE_VM_WRITE). OTE_OK with
 * *out filled whenever it could tell (the verdict may still be a refusal);
 * OTE_ERR_INVALID for len 0, a range past the end of the address space, no access bit
 * or out NULL. */
ote_status_t ote_vm_check(uint64_t addr, uint64_t len, unsigned access, ote_vm_report_t *out);

/* "ok", "not mapped", "no access", "past the end of its file". */
const char *ote_vm_verdict_str(ote_vm_verdict_t v);

#ifdef __cplusplus
}
#endif
#endif

/* tests/engine/hostile_ranges.h - ranges a user can hand to ote_memory_register that the
 * engine cannot touch (or touch only in part), made in the target processes of the
 * registration tests (ote_target, ote_gpu_target: "hostile <kind>" commands). */
#ifndef OTE_TESTS_ENGINE_HOSTILE_RANGES_H
#define OTE_TESTS_ENGINE_HOSTILE_RANGES_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Makes the range of `kind` and says which permissions to register it with:
 *   unmapped     two pages, unmapped again                           READ|WRITE
 *   protnone     two PROT_NONE pages (a guard page, a device address)  READ|WRITE
 *   rofwrite     two read-only pages, registered for peers' WRITEs     WRITE
 *   roforread    the same, for peers' READs only (touchable: accepted)  READ
 *   crossing     one mapped page and the unmapped page after it        READ|WRITE
 *   shortfile    a 1-page memfd mapped over 4 pages (SIGBUS past it)   READ|WRITE
 *   midhole      three pages, the middle one unmapped                  READ
 * The mappings stay for the life of the process. -1 for an unknown kind. */
int ote_test_hostile_range(const char *kind, uint64_t *addr_out, uint64_t *len_out,
                           unsigned *perms_out);

#ifdef __cplusplus
}
#endif
#endif

/*
 * base/le.h - little-endian encoding of fixed-width integers into byte buffers.
 *
 * Every OrbitTE wire format (the control-plane frames in engine/control/, the RDMA
 * transport's messages in engine/rdma/) is little endian whatever the host's byte order.
 * These helpers read and write one field at an unaligned position; they never check
 * bounds: the caller has checked that the buffer holds the field.
 */
#ifndef OTE_BASE_LE_H
#define OTE_BASE_LE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

static inline uint16_t ote_le_get16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static inline uint32_t ote_le_get32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static inline uint64_t ote_le_get64(const uint8_t *p) {
    return (uint64_t)ote_le_get32(p) | ((uint64_t)ote_le_get32(p + 4) << 32);
}

static inline void ote_le_put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline void ote_le_put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static inline void ote_le_put64(uint8_t *p, uint64_t v) {
    ote_le_put32(p, (uint32_t)v);
    ote_le_put32(p + 4, (uint32_t)(v >> 32));
}

#ifdef __cplusplus
}
#endif
#endif

/*
 * The one little-endian load of the CRC32C paths. CRC32C consumes bytes in
 * file order, and every path takes them eight at a time as a little-endian
 * word; on a big-endian host (s390x, aarch64_be) a plain load would reverse
 * them, so the bytes are assembled explicitly there. On a little-endian host
 * the memcpy is one unaligned load.
 */
#ifndef TL_CRC32C_READ_LE_H
#define TL_CRC32C_READ_LE_H

#include <stdint.h>
#include <string.h>

static inline uint64_t tl_read_le64(const unsigned char *p) {
#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
#else
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24 |
           (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40 | (uint64_t)p[6] << 48 | (uint64_t)p[7] << 56;
#endif
}

#endif

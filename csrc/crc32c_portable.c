/*
 * CRC32C on any CPU: slicing-by-16 (16 table lookups per 16 bytes, all
 * independent, instead of one dependent lookup per byte). Bytes are loaded
 * through tl_read_le64, so the result is the same on big-endian hosts.
 */
#include "crc32c_internal.h"
#include "crc32c_read_le.h"
#include "crc32c_tables.h"

#define T TL_CRC32C_TABLE

static inline uint32_t slice8(uint64_t v, int hi) {
    /* the 8 bytes of v, the first (lowest) byte furthest from the end: table hi, then hi-1, ... */
    return T[hi][v & 0xffu] ^ T[hi - 1][(v >> 8) & 0xffu] ^ T[hi - 2][(v >> 16) & 0xffu] ^
           T[hi - 3][(v >> 24) & 0xffu] ^ T[hi - 4][(v >> 32) & 0xffu] ^ T[hi - 5][(v >> 40) & 0xffu] ^
           T[hi - 6][(v >> 48) & 0xffu] ^ T[hi - 7][v >> 56];
}

uint32_t tl_crc32c_portable(uint32_t crc, const unsigned char *p, uint64_t n) {
    while (n && ((uintptr_t)p & 7u)) {
        crc = T[0][(crc ^ *p++) & 0xffu] ^ (crc >> 8);
        n--;
    }
    while (n >= 16) {
        crc = slice8(tl_read_le64(p) ^ crc, 15) ^ slice8(tl_read_le64(p + 8), 7);
        p += 16;
        n -= 16;
    }
    if (n >= 8) {
        crc = slice8(tl_read_le64(p) ^ crc, 7);
        p += 8;
        n -= 8;
    }
    while (n--) crc = T[0][(crc ^ *p++) & 0xffu] ^ (crc >> 8);
    return crc;
}

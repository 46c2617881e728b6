/*
 * CRC32C on x86-64 with AVX-512 VPCLMULQDQ: carry-less folding of 256 bytes
 * a round in four 512-bit registers, then the crc32 instruction for the last
 * 16 bytes the folding leaves and for the tail (crc32c_sse42.c).
 *
 * Folding: CRC32C is linear, so a 16-byte lane A followed, D bytes later, by
 * lane B may be replaced by B ^ (A.lo * x^(8D+31) ^ A.hi * x^(8D-33)) mod P
 * (in the reflected bit order of the crc32 instruction, the 64 x 32-bit
 * carry-less products fit in 128 bits and need no reduction). The constants
 * below are those powers of x mod P, reflected (gen_crc32c_tables.py derives
 * and checks them). The last lane left is data like any other: the crc32
 * instruction finishes it, so no Barrett reduction is needed. The starting
 * CRC is XORed into the first four bytes (the raw register is linear too).
 *
 * x86-64 is little-endian: the lanes load the bytes in file order.
 * Every function carries its own target attribute and the file needs no -m
 * flag: the dispatcher (crc32c.c) calls it only after its runtime check of
 * AVX512F, VPCLMULQDQ and the OS's saving of the ZMM state.
 */
#include "crc32c_internal.h"

#if TL_CRC32C_HAVE_AVX512
#include <immintrin.h>

#define TARGET_V __attribute__((target("avx512f,vpclmulqdq,pclmul,sse4.2,crc32")))

/* {x^(8D+31), x^(8D-33)} mod P, reflected, for a fold over D bytes. */
#define K256 0xdcb17aa4u, 0xb9e02b86u
#define K192 0xa87ab8a8u, 0xab7aff2au
#define K128 0x6992cea2u, 0x0d3b6092u
#define K64 0x740eef02u, 0x9e4addf8u
#define K48 0x1c291d04u, 0xddc0152bu
#define K32 0x3da6d0cbu, 0xba4fc28eu
#define K16 0xf20c0dfeu, 0x493c7d27u

/* each 128-bit lane of a folded forward, by the distance k stands for */
TARGET_V static inline __m512i fold512(__m512i a, __m512i k) {
    return _mm512_xor_si512(_mm512_clmulepi64_epi128(a, k, 0x00), _mm512_clmulepi64_epi128(a, k, 0x11));
}

TARGET_V static inline __m128i fold128(__m128i a, __m128i k) {
    return _mm_xor_si128(_mm_clmulepi64_si128(a, k, 0x00), _mm_clmulepi64_si128(a, k, 0x11));
}

TARGET_V static inline __m512i k512(uint32_t lo, uint32_t hi) {
    return _mm512_broadcast_i32x4(_mm_set_epi64x((long long)hi, (long long)lo));
}

TARGET_V static inline __m128i k128(uint32_t lo, uint32_t hi) { return _mm_set_epi64x((long long)hi, (long long)lo); }

TARGET_V uint32_t tl_crc32c_avx512(uint32_t crc, const unsigned char *p, uint64_t n) {
    if (n < TL_CRC_AVX512_MIN) return tl_crc32c_sse42_3way(crc, p, n);
    __m512i x0 = _mm512_loadu_si512((const void *)p), x1 = _mm512_loadu_si512((const void *)(p + 64));
    __m512i x2 = _mm512_loadu_si512((const void *)(p + 128)), x3 = _mm512_loadu_si512((const void *)(p + 192));
    x0 = _mm512_xor_si512(x0, _mm512_castsi128_si512(_mm_cvtsi32_si128((int)crc)));
    p += 256;
    n -= 256;
    const __m512i k = k512(K256);
    while (n >= 256) {
        x0 = _mm512_xor_si512(fold512(x0, k), _mm512_loadu_si512((const void *)p));
        x1 = _mm512_xor_si512(fold512(x1, k), _mm512_loadu_si512((const void *)(p + 64)));
        x2 = _mm512_xor_si512(fold512(x2, k), _mm512_loadu_si512((const void *)(p + 128)));
        x3 = _mm512_xor_si512(fold512(x3, k), _mm512_loadu_si512((const void *)(p + 192)));
        p += 256;
        n -= 256;
    }
    /* four registers into one, then its four lanes into one */
    x3 = _mm512_xor_si512(x3, fold512(x0, k512(K192)));
    x3 = _mm512_xor_si512(x3, fold512(x1, k512(K128)));
    x3 = _mm512_xor_si512(x3, fold512(x2, k512(K64)));
    __m128i v = _mm512_extracti32x4_epi32(x3, 3);
    v = _mm_xor_si128(v, fold128(_mm512_extracti32x4_epi32(x3, 0), k128(K48)));
    v = _mm_xor_si128(v, fold128(_mm512_extracti32x4_epi32(x3, 1), k128(K32)));
    v = _mm_xor_si128(v, fold128(_mm512_extracti32x4_epi32(x3, 2), k128(K16)));
    uint64_t c = _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(v));
    c = _mm_crc32_u64(c, (uint64_t)_mm_extract_epi64(v, 1));
    return n ? tl_crc32c_sse42_3way((uint32_t)c, p, n) : (uint32_t)c;
}
#endif

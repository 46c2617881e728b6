/*
 * CRC32C on x86-64 with the SSE4.2 crc32 instruction: one stream, and three
 * streams joined with PCLMULQDQ (crc32c_internal.h explains the join); and
 * folding with 256-bit VPCLMULQDQ, past the crc32 instruction's 8 bytes a cycle.
 *
 * Every function carries its own target attribute and the file needs no -m
 * flag: the dispatcher (crc32c.c) calls these only after its runtime check.
 * "crc32" is a feature of its own in clang >= 14 (and accepted by gcc), so it
 * is named beside "sse4.2" for the _mm_crc32_* intrinsics.
 */
#include "crc32c_internal.h"

#if TL_CRC32C_HAVE_SSE42
#include <immintrin.h>

#include "crc32c_read_le.h"

#define TARGET_CRC __attribute__((target("sse4.2,crc32")))
#define TARGET_CLMUL __attribute__((target("sse4.2,crc32,pclmul")))
#define TARGET_FOLD __attribute__((target("sse4.2,crc32,pclmul,avx2,vpclmulqdq")))

TARGET_CRC uint32_t tl_crc32c_sse42(uint32_t crc, const unsigned char *p, uint64_t n) {
    uint64_t c = crc;
    while (n && ((uintptr_t)p & 7u)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        n--;
    }
    while (n >= 8) {
        c = _mm_crc32_u64(c, tl_read_le64(p));
        p += 8;
        n -= 8;
    }
    while (n--) c = _mm_crc32_u8((uint32_t)c, *p++);
    return (uint32_t)c;
}

/* The raw register c advanced over the zero bytes that K stands for. */
TARGET_CLMUL static uint64_t shift(uint64_t c, uint32_t k) {
    __m128i prod = _mm_clmulepi64_si128(_mm_cvtsi32_si128((int)(uint32_t)c), _mm_cvtsi32_si128((int)k), 0);
    return _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(prod));
}

/* Rounds of three blocks of `block` bytes while they fit; *p and *n advance. */
TARGET_CLMUL static inline uint64_t rounds(uint64_t c, const unsigned char **pp, uint64_t *np, uint64_t block,
                                           uint32_t k1, uint32_t k2) {
    const unsigned char *p = *pp;
    uint64_t n = *np;
    while (n >= 3 * block) {
        uint64_t c1 = 0, c2 = 0;
        const unsigned char *q1 = p + block, *q2 = p + 2 * block;
        for (uint64_t i = 0; i < block; i += 8) {
            c = _mm_crc32_u64(c, tl_read_le64(p + i));
            c1 = _mm_crc32_u64(c1, tl_read_le64(q1 + i));
            c2 = _mm_crc32_u64(c2, tl_read_le64(q2 + i));
        }
        c = shift(c, k2) ^ shift(c1, k1) ^ c2;
        p += 3 * block;
        n -= 3 * block;
    }
    *pp = p;
    *np = n;
    return c;
}

TARGET_CLMUL uint32_t tl_crc32c_sse42_3way(uint32_t crc, const unsigned char *p, uint64_t n) {
    uint64_t c = crc;
    while (n && ((uintptr_t)p & 7u)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        n--;
    }
    c = rounds(c, &p, &n, TL_CRC3_BLOCK, TL_CRC3_K1, TL_CRC3_K2);
    c = rounds(c, &p, &n, TL_CRC3_SMALL_BLOCK, TL_CRC3_SMALL_K1, TL_CRC3_SMALL_K2);
    return tl_crc32c_sse42((uint32_t)c, p, n);
}

/* Each 16-byte lane of x moved D bits on, as a value congruent mod P (crc32c_internal.h). */
TARGET_FOLD static inline __m256i fold(__m256i x, __m256i k) {
    return _mm256_xor_si256(_mm256_clmulepi64_epi128(x, k, 0x00), _mm256_clmulepi64_epi128(x, k, 0x11));
}

#define FOLD_K(lo, hi) _mm256_set_epi64x((long long)((uint64_t)(hi) << 32), (long long)((uint64_t)(lo) << 32), \
                                         (long long)((uint64_t)(hi) << 32), (long long)((uint64_t)(lo) << 32))

TARGET_FOLD uint32_t tl_crc32c_vpclmul(uint32_t crc, const unsigned char *p, uint64_t n) {
    if (n < TL_CRCF_MIN) return tl_crc32c_sse42_3way(crc, p, n);
    __m256i x[8];
    for (int i = 0; i < 8; i++) x[i] = _mm256_loadu_si256((const __m256i *)(const void *)(p + 32 * i));
    x[0] = _mm256_xor_si256(x[0], _mm256_set_epi64x(0, 0, 0, (long long)crc));
    p += 256;
    n -= 256;
    const __m256i k2048 = FOLD_K(TL_CRCF_K2048_LO, TL_CRCF_K2048_HI);
    while (n >= 256) {
        for (int i = 0; i < 8; i++)
            x[i] = _mm256_xor_si256(fold(x[i], k2048), _mm256_loadu_si256((const __m256i *)(const void *)(p + 32 * i)));
        p += 256;
        n -= 256;
    }
    const __m256i k256 = FOLD_K(TL_CRCF_K256_LO, TL_CRCF_K256_HI);
    __m256i a = x[0];
    for (int i = 1; i < 8; i++) a = _mm256_xor_si256(fold(a, k256), x[i]);
    const __m256i k128 = FOLD_K(TL_CRCF_K128_LO, TL_CRCF_K128_HI);
    __m128i v = _mm_xor_si128(_mm256_castsi256_si128(fold(a, k128)), _mm256_extracti128_si256(a, 1));
    uint64_t c = _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(v));
    c = _mm_crc32_u64(c, (uint64_t)_mm_extract_epi64(v, 1));
    return tl_crc32c_sse42((uint32_t)c, p, n);
}
#endif

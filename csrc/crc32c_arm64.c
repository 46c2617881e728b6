/*
 * CRC32C on arm64 with the ARMv8 CRC32 extension: one stream, and three
 * streams joined by a carry-less multiply (crc32c_internal.h explains the
 * join): PMULL where the CPU has it, a 32-step software multiply otherwise
 * (twice per round: a few per cent of a 24 KiB round, so the software join
 * runs the large rounds only).
 *
 * Every function carries its own target attribute and the file needs no
 * -march flag: the dispatcher (crc32c.c) calls these only after its runtime
 * check (getauxval on Linux; always on Apple). gcc takes "+crc"/"+crc+crypto"
 * and the ACLE intrinsics; clang takes "crc"/"crc,aes" (not "+crc" before
 * clang 16) and, before clang 16, declares arm_acle.h's __crc32c* only when
 * the whole file is compiled for +crc, so clang uses the builtins behind them.
 */
#include "crc32c_internal.h"

#if TL_CRC32C_HAVE_ARM64
#include <arm_neon.h>

#include "crc32c_read_le.h"

#if defined(__clang__)
#define TARGET_CRC __attribute__((target("crc")))
#define TARGET_PMULL __attribute__((target("crc,aes")))
#define CRC32CB(c, v) __builtin_arm_crc32cb((c), (v))
#define CRC32CD(c, v) __builtin_arm_crc32cd((c), (v))
#define PMULL64(a, b) ((uint64_t)(poly128_t)__builtin_neon_vmull_p64((a), (b)))
#else
#include <arm_acle.h>
#define TARGET_CRC __attribute__((target("+crc")))
#define TARGET_PMULL __attribute__((target("+crc+crypto")))
#define CRC32CB(c, v) __crc32cb((c), (v))
#define CRC32CD(c, v) __crc32cd((c), (v))
#define PMULL64(a, b) ((uint64_t)vmull_p64((a), (b)))
#endif

TARGET_CRC uint32_t tl_crc32c_arm64(uint32_t crc, const unsigned char *p, uint64_t n) {
    while (n && ((uintptr_t)p & 7u)) {
        crc = CRC32CB(crc, *p++);
        n--;
    }
    while (n >= 8) {
        crc = CRC32CD(crc, tl_read_le64(p));
        p += 8;
        n -= 8;
    }
    while (n--) crc = CRC32CB(crc, *p++);
    return crc;
}

/* The raw register c advanced over the zero bytes that K stands for. */
TARGET_PMULL static uint32_t shift_pmull(uint32_t c, uint32_t k) {
    return CRC32CD(0, PMULL64(c, k));
}

TARGET_CRC static uint32_t shift_soft(uint32_t c, uint32_t k) {
    uint64_t prod = 0;
    for (int i = 0; i < 32; i++) prod ^= ((uint64_t)c << i) & (0 - (uint64_t)((k >> i) & 1u));
    return CRC32CD(0, prod);
}

typedef uint32_t (*shift_fn)(uint32_t c, uint32_t k);

/* Rounds of three blocks of `block` bytes while they fit; *p and *n advance. */
TARGET_CRC static inline uint32_t rounds(uint32_t crc, const unsigned char **pp, uint64_t *np, uint64_t block,
                                         uint32_t k1, uint32_t k2, shift_fn shift) {
    const unsigned char *p = *pp;
    uint64_t n = *np;
    while (n >= 3 * block) {
        uint32_t c1 = 0, c2 = 0;
        const unsigned char *q1 = p + block, *q2 = p + 2 * block;
        for (uint64_t i = 0; i < block; i += 8) {
            crc = CRC32CD(crc, tl_read_le64(p + i));
            c1 = CRC32CD(c1, tl_read_le64(q1 + i));
            c2 = CRC32CD(c2, tl_read_le64(q2 + i));
        }
        crc = shift(crc, k2) ^ shift(c1, k1) ^ c2;
        p += 3 * block;
        n -= 3 * block;
    }
    *pp = p;
    *np = n;
    return crc;
}

TARGET_CRC static uint32_t crc3(uint32_t crc, const unsigned char *p, uint64_t n, shift_fn shift, int small) {
    while (n && ((uintptr_t)p & 7u)) {
        crc = CRC32CB(crc, *p++);
        n--;
    }
    crc = rounds(crc, &p, &n, TL_CRC3_BLOCK, TL_CRC3_K1, TL_CRC3_K2, shift);
    if (small) crc = rounds(crc, &p, &n, TL_CRC3_SMALL_BLOCK, TL_CRC3_SMALL_K1, TL_CRC3_SMALL_K2, shift);
    return tl_crc32c_arm64(crc, p, n);
}

uint32_t tl_crc32c_arm64_3way(uint32_t crc, const unsigned char *p, uint64_t n) {
    return crc3(crc, p, n, shift_pmull, 1);
}

uint32_t tl_crc32c_arm64_3way_soft(uint32_t crc, const unsigned char *p, uint64_t n) {
    return crc3(crc, p, n, shift_soft, 0); /* TL_CRC3_SOFT_MIN */
}
#endif

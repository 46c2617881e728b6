/*
 * CRC32C internals: one file per CPU path (crc32c_portable.c, crc32c_sse42.c,
 * crc32c_arm64.c) and the dispatcher (crc32c.c), as in google/crc32c. Not seen
 * by cffi; tensorlist.h has the public entry points (tl_crc32c, tl_crc32c_impl).
 *
 * Every function here works on the raw register: the caller complements it
 * before and after (tl_crc32c does), so a long buffer can be fed in pieces.
 * A path's functions run only behind the dispatcher's runtime CPU check; each
 * carries its own target attribute, so its file compiles without any -m flag.
 */
#ifndef TL_CRC32C_INTERNAL_H
#define TL_CRC32C_INTERNAL_H

#include <stdint.h>

/* Which hardware paths this build compiles. -DTL_CRC32C_NO_HW leaves only the
 * portable one (the build of a CPU without them, reproducible anywhere). */
#if !defined(TL_CRC32C_NO_HW) && defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TL_CRC32C_HAVE_SSE42 1
#else
#define TL_CRC32C_HAVE_SSE42 0
#endif
#if !defined(TL_CRC32C_NO_HW) && defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
#define TL_CRC32C_HAVE_ARM64 1
#else
#define TL_CRC32C_HAVE_ARM64 0
#endif

#if defined(__GNUC__) || defined(__clang__)
#define TL_CRC32C_HIDDEN __attribute__((visibility("hidden")))
#else
#define TL_CRC32C_HIDDEN
#endif

/* Three streams: the crc32 instruction has a latency of 3 cycles (x86; 2-3 on
 * arm64 cores) and a throughput of 1, so one dependent chain runs at a third
 * of the possible speed. Each round takes 3 blocks of one block size, runs one
 * chain per block, and joins them: crc(A|B|C) = shift(crc(A), 2 blocks) ^
 * shift(crc(B) from 0, 1 block) ^ crc(C) from 0, where shifting a raw register
 * over n zero bytes multiplies it by x^(8n) mod P. That product is one
 * carry-less multiply by K = x^(8n - 33) mod P (reflected), reduced by one
 * 64-bit crc32 instruction. Rounds of 3 x 8 KiB run while they fit, then
 * rounds of 3 x 256 bytes (the join costs about a tenth of such a round), then
 * one stream. csrc/gen_crc32c_tables.py derives K (shift_constant), and
 * tests/core/test_crc32c.py checks these values against it. */
#define TL_CRC3_BLOCK 8192
#define TL_CRC3_K1 0x54a86326u /* shift by one block */
#define TL_CRC3_K2 0x1dc403ccu /* shift by two blocks */
#define TL_CRC3_SMALL_BLOCK 256
#define TL_CRC3_SMALL_K1 0xb9e02b86u
#define TL_CRC3_SMALL_K2 0xdd7e3b0cu
#define TL_CRC3_MIN ((uint64_t)3 * TL_CRC3_SMALL_BLOCK) /* shorter buffers run one stream only */
/* The software join (arm64 without PMULL, ~100 cycles) pays on the 24 KiB rounds only: */
#define TL_CRC3_SOFT_MIN ((uint64_t)3 * TL_CRC3_BLOCK)

/* Folding (crc32c_sse42.c, tl_crc32c_vpclmul): eight 32-byte AVX2 registers
 * hold the message's first 256 bytes, and each step folds every 16-byte lane
 * 256 bytes on: a lane X = lo:hi at distance D bits before the lane it joins
 * stands for X * x^D, which is clmul(lo, x^(D+63) mod P) ^ clmul(hi, x^(D-1)
 * mod P) (the reflected carry-less multiply adds one power of x), a value of
 * 96 bits congruent mod P. The initial register is XORed into the first four
 * bytes; the eight registers fold into one 16-byte lane, whose CRC from 0 (two
 * 64-bit crc32 instructions) is the register after everything folded; the
 * remaining bytes (< 256) run one stream. Each constant pair is (x^(D+63),
 * x^(D-1)) mod P, reflected, in the high half of a 64-bit word: the generator's
 * shift_constant(D/8 + 12) and shift_constant(D/8 + 4). */
#define TL_CRCF_K2048_LO 0xe9a5d8beu /* D = 2048: a lane to the same lane 256 bytes on */
#define TL_CRCF_K2048_HI 0x1426a815u
#define TL_CRCF_K256_LO 0x33ccbbbcu /* D = 256: one register into the next */
#define TL_CRCF_K256_HI 0xa2158b34u
#define TL_CRCF_K128_LO 0x3743f7bdu /* D = 128: a register's low lane into its high lane */
#define TL_CRCF_K128_HI 0x3171d430u
#define TL_CRCF_MIN 8192u /* shorter buffers run the three-stream path, as fast there */

typedef uint32_t (*tl_crc32c_fn)(uint32_t crc, const unsigned char *p, uint64_t n);

/* The dispatcher (crc32c.c): the fastest path this CPU runs for n bytes. */
TL_CRC32C_HIDDEN uint32_t tl_crc32c_update(uint32_t crc, const unsigned char *p, uint64_t n);

/* Slicing-by-16 tables, any CPU, either byte order (crc32c_portable.c). */
TL_CRC32C_HIDDEN uint32_t tl_crc32c_portable(uint32_t crc, const unsigned char *p, uint64_t n);

#if TL_CRC32C_HAVE_SSE42 /* crc32c_sse42.c: needs SSE4.2 (PCLMULQDQ for _3way; AVX2 and VPCLMULQDQ for _vpclmul) */
TL_CRC32C_HIDDEN uint32_t tl_crc32c_sse42(uint32_t crc, const unsigned char *p, uint64_t n);
TL_CRC32C_HIDDEN uint32_t tl_crc32c_sse42_3way(uint32_t crc, const unsigned char *p, uint64_t n);
TL_CRC32C_HIDDEN uint32_t tl_crc32c_vpclmul(uint32_t crc, const unsigned char *p, uint64_t n);
#endif

#if TL_CRC32C_HAVE_ARM64 /* crc32c_arm64.c: needs the CRC32 extension (and PMULL for _3way) */
TL_CRC32C_HIDDEN uint32_t tl_crc32c_arm64(uint32_t crc, const unsigned char *p, uint64_t n);
TL_CRC32C_HIDDEN uint32_t tl_crc32c_arm64_3way(uint32_t crc, const unsigned char *p, uint64_t n);
TL_CRC32C_HIDDEN uint32_t tl_crc32c_arm64_3way_soft(uint32_t crc, const unsigned char *p, uint64_t n);
#endif

#endif

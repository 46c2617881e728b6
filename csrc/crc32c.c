/*
 * CRC32C dispatch: a small runtime check per architecture picks the path
 * (crc32c_internal.h lists them).
 *
 * The check's result is the one piece of mutable static state in the C core:
 * a feature mask cached in one C11 atomic word, read and written relaxed.
 * That is safe from any number of threads without a lock: the value is a pure
 * function of the CPU, so threads that race on the first call compute and
 * store the same word, and no other memory is published through it. It is
 * cached because the x86 check is the cpuid instruction, which a hypervisor
 * traps (19 us a call measured on a KVM guest, where a 4 KiB CRC32C takes
 * well under 1 us). __builtin_cpu_supports would avoid cpuid but is not
 * portable: built with zig's clang it reports no features at all. On Linux arm64 the
 * check is getauxval(AT_HWCAP); on Apple arm64 both features always exist.
 */
#include "tensorlist.h"
#include "crc32c_internal.h"

#include <stdatomic.h>

#if TL_CRC32C_HAVE_SSE42
#include <cpuid.h>
#endif
#if TL_CRC32C_HAVE_ARM64 && defined(__linux__)
#include <sys/auxv.h>
/* arch/arm64/include/uapi/asm/hwcap.h, for C libraries whose headers lack them */
#ifndef HWCAP_PMULL
#define HWCAP_PMULL (1 << 4)
#endif
#ifndef HWCAP_CRC32
#define HWCAP_CRC32 (1 << 7)
#endif
#endif

#define BIT(impl) (1u << (impl))

/* Bit i set: implementation i is compiled in and this CPU runs it. */
static uint32_t detect(void) {
    uint32_t a = BIT(TL_CRC_PORTABLE);
#if TL_CRC32C_HAVE_SSE42
    unsigned eax, ebx, ecx = 0, edx;
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_SSE4_2)) {
        a |= BIT(TL_CRC_SSE42);
        if (ecx & bit_PCLMUL) {
            a |= BIT(TL_CRC_SSE42_3WAY);
            /* AVX2 and VPCLMULQDQ (leaf 7), and the OS saving the YMM state (XCR0 bits 1-2) */
            unsigned l7a, l7b = 0, l7c = 0, l7d;
            if ((ecx & bit_OSXSAVE) && (ecx & bit_AVX) && __get_cpuid_count(7, 0, &l7a, &l7b, &l7c, &l7d) &&
                (l7b & (1u << 5)) && (l7c & (1u << 10))) {
                unsigned xlo, xhi;
                __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
                if ((xlo & 6u) == 6u) a |= BIT(TL_CRC_VPCLMUL);
            }
        }
    }
#endif
#if TL_CRC32C_HAVE_ARM64
#if defined(__APPLE__)
    int crc = 1, pmull = 1; /* every Apple arm64 CPU has both */
#elif defined(__linux__)
    unsigned long hw = getauxval(AT_HWCAP);
    int crc = (hw & HWCAP_CRC32) != 0, pmull = (hw & HWCAP_PMULL) != 0;
#else /* no runtime check here: trust what the build targets */
#if defined(__ARM_FEATURE_CRC32)
    int crc = 1;
#else
    int crc = 0;
#endif
#if defined(__ARM_FEATURE_CRYPTO) || defined(__ARM_FEATURE_AES)
    int pmull = 1;
#else
    int pmull = 0;
#endif
#endif
    if (crc) {
        a |= BIT(TL_CRC_ARM64) | BIT(TL_CRC_ARM64_3WAY_SOFT);
        if (pmull) a |= BIT(TL_CRC_ARM64_3WAY);
    }
#endif
    return a;
}

#define DETECTED 0x80000000u /* set in the cache once detect() has run */
static _Atomic uint32_t cached_features; /* see the top of this file */

static uint32_t available(void) {
    uint32_t a = atomic_load_explicit(&cached_features, memory_order_relaxed);
    if (!(a & DETECTED)) {
        a = detect() | DETECTED;
        atomic_store_explicit(&cached_features, a, memory_order_relaxed);
    }
    return a & ~DETECTED;
}

/* The dispatcher's choice for n bytes among the available paths: hardware
 * over tables, folding or three streams where a step fits (crc32c_internal.h). */
static int choose(uint32_t avail, uint64_t n) {
    if (n >= TL_CRCF_MIN && (avail & BIT(TL_CRC_VPCLMUL))) return TL_CRC_VPCLMUL;
    if (n >= TL_CRC3_MIN && (avail & BIT(TL_CRC_SSE42_3WAY))) return TL_CRC_SSE42_3WAY;
    if (avail & BIT(TL_CRC_SSE42)) return TL_CRC_SSE42;
    if (n >= TL_CRC3_MIN && (avail & BIT(TL_CRC_ARM64_3WAY))) return TL_CRC_ARM64_3WAY;
    if (n >= TL_CRC3_SOFT_MIN && (avail & BIT(TL_CRC_ARM64_3WAY_SOFT))) return TL_CRC_ARM64_3WAY_SOFT;
    if (avail & BIT(TL_CRC_ARM64)) return TL_CRC_ARM64;
    return TL_CRC_PORTABLE;
}

static tl_crc32c_fn function(int impl) {
    switch (impl) {
#if TL_CRC32C_HAVE_SSE42
    case TL_CRC_SSE42: return tl_crc32c_sse42;
    case TL_CRC_SSE42_3WAY: return tl_crc32c_sse42_3way;
    case TL_CRC_VPCLMUL: return tl_crc32c_vpclmul;
#endif
#if TL_CRC32C_HAVE_ARM64
    case TL_CRC_ARM64: return tl_crc32c_arm64;
    case TL_CRC_ARM64_3WAY: return tl_crc32c_arm64_3way;
    case TL_CRC_ARM64_3WAY_SOFT: return tl_crc32c_arm64_3way_soft;
#endif
    default: return tl_crc32c_portable;
    }
}

uint32_t tl_crc32c_update(uint32_t crc, const unsigned char *p, uint64_t n) {
    return function(choose(available(), n))(crc, p, n);
}

uint32_t tl_crc32c(uint32_t crc, const void *data, uint64_t length) {
    if (!data) return crc;
    return ~tl_crc32c_update(~crc, (const unsigned char *)data, length);
}

int tl_crc32c_impl(int impl, uint32_t crc, const void *data, uint64_t length, uint32_t *out) {
    if (!out || (!data && length)) return TL_ERR_ARG;
    uint32_t avail = available();
    if (impl == TL_CRC_AUTO) impl = choose(avail, length);
    if (impl < 0 || impl >= TL_CRC_IMPLS || !(avail & BIT(impl))) return TL_ERR_ARG;
    *out = length ? ~function(impl)(~crc, (const unsigned char *)data, length) : crc;
    return TL_OK;
}

int tl_crc32c_impls(uint64_t length, uint32_t *available_impls, int *chosen) {
    if (!available_impls || !chosen) return TL_ERR_ARG;
    *available_impls = available();
    *chosen = choose(*available_impls, length);
    return TL_OK;
}

/*
 * CRC32C dispatch: a small runtime check per architecture picks the path
 * (crc32c_internal.h lists them). The check runs on every call and keeps no
 * state, so it is thread-safe without locks: on x86-64 __builtin_cpu_supports
 * reads the table the compiler runtime fills before main; on Linux arm64
 * getauxval(AT_HWCAP) reads the auxiliary vector the kernel passed (glibc: a
 * stored word; musl: a scan of about twenty entries). Either costs a few
 * nanoseconds, against microseconds for the buffers CRC32C is used on.
 */
#include "tensorlist.h"
#include "crc32c_internal.h"

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
static uint32_t available(void) {
    uint32_t a = BIT(TL_CRC_PORTABLE);
#if TL_CRC32C_HAVE_SSE42
    if (__builtin_cpu_supports("sse4.2")) {
        a |= BIT(TL_CRC_SSE42);
        if (__builtin_cpu_supports("pclmul")) a |= BIT(TL_CRC_SSE42_3WAY);
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

/* The dispatcher's choice for n bytes among the available paths. Below
 * TL_CRC3_MIN a three-stream path would only run its one-stream tail. */
static int choose(uint32_t avail, uint64_t n) {
    int big = n >= TL_CRC3_MIN;
    if (big && (avail & BIT(TL_CRC_SSE42_3WAY))) return TL_CRC_SSE42_3WAY;
    if (avail & BIT(TL_CRC_SSE42)) return TL_CRC_SSE42;
    if (big && (avail & BIT(TL_CRC_ARM64_3WAY))) return TL_CRC_ARM64_3WAY;
    if (big && (avail & BIT(TL_CRC_ARM64_3WAY_SOFT))) return TL_CRC_ARM64_3WAY_SOFT;
    if (avail & BIT(TL_CRC_ARM64)) return TL_CRC_ARM64;
    return TL_CRC_PORTABLE;
}

static tl_crc32c_fn function(int impl) {
    switch (impl) {
#if TL_CRC32C_HAVE_SSE42
    case TL_CRC_SSE42: return tl_crc32c_sse42;
    case TL_CRC_SSE42_3WAY: return tl_crc32c_sse42_3way;
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

/*
 * Known-answer tests of every CRC32C implementation this build and CPU run
 * (tl_crc32c_impl), against a bitwise reference: the standard check value,
 * RFC 3720's vectors, every length 0..4096 at every misalignment 0..15,
 * split/extend consistency, and the three-stream paths across their block
 * boundaries. A standalone program: exits 0 when every case passes. Built from
 * the project root with every csrc .c file and this one:
 *
 *   $CC -std=c11 -O2 -Wall -Wextra -Werror -Icsrc csrc/[*].c tests/c/test_crc32c.c -o test_crc32c -pthread
 *
 * (the brackets only keep the glob from closing this comment); .ci/cross.sh
 * also cross-builds it and runs it under qemu-user.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensorlist.h"

static const char *const NAMES[TL_CRC_IMPLS] = {"auto", "portable", "sse42", "sse42_3way",
                                                "arm64", "arm64_3way", "arm64_3way_soft", "vpclmul"};
static long passed, failed;

static void check(int ok, const char *impl, const char *what, uint64_t a, uint64_t b, uint32_t got,
                  uint32_t want) {
    if (ok) {
        passed++;
        return;
    }
    if (failed++ < 20)
        fprintf(stderr, "FAIL %s: %s (%llu, %llu): got 0x%08x, want 0x%08x\n", impl, what,
                (unsigned long long)a, (unsigned long long)b, (unsigned)got, (unsigned)want);
}

/* Bitwise CRC32C (reflected polynomial 0x82F63B78) of one more byte, on the raw register. */
static uint32_t reference_byte(uint32_t raw, unsigned char b) {
    raw ^= b;
    for (int k = 0; k < 8; k++) raw = (raw >> 1) ^ (0x82F63B78u & (0u - (raw & 1u)));
    return raw;
}

enum { OFFSETS = 16, BIG = 3 * 3 * 8192 + 4096 + 64 };

/* want[off][n]: the reference CRC32C of data[off .. off + n) continuing seed(off),
 * computed once, bit by bit, for every implementation to match. */
typedef struct {
    const unsigned char *data;
    uint32_t *want[OFFSETS];
} cases;

static uint32_t seed(uint64_t off) { return (uint32_t)(off * 0x9E3779B9u); }

static uint32_t run(int impl, uint32_t crc, const void *data, uint64_t n) {
    uint32_t out = 0xdeadbeefu;
    int st = tl_crc32c_impl(impl, crc, data, n, &out);
    if (st != TL_OK) {
        fprintf(stderr, "FAIL %s: status %d for length %llu\n", NAMES[impl], st, (unsigned long long)n);
        failed++;
    }
    return out;
}

static void known_answers(int impl, const char *name) {
    unsigned char buf[32];
    uint32_t got = run(impl, 0, "123456789", 9);
    check(got == 0xE3069283u, name, "check value", 9, 0, got, 0xE3069283u);
    /* RFC 3720 B.4 */
    memset(buf, 0, 32);
    got = run(impl, 0, buf, 32);
    check(got == 0x8A9136AAu, name, "32 zeros", 32, 0, got, 0x8A9136AAu);
    memset(buf, 0xff, 32);
    got = run(impl, 0, buf, 32);
    check(got == 0x62A8AB43u, name, "32 0xff", 32, 0, got, 0x62A8AB43u);
    for (int i = 0; i < 32; i++) buf[i] = (unsigned char)i;
    got = run(impl, 0, buf, 32);
    check(got == 0x46DD794Eu, name, "0..31", 32, 0, got, 0x46DD794Eu);
    for (int i = 0; i < 32; i++) buf[i] = (unsigned char)(31 - i);
    got = run(impl, 0, buf, 32);
    check(got == 0x113FDB5Cu, name, "31..0", 32, 0, got, 0x113FDB5Cu);
    got = run(impl, 0x12345678u, NULL, 0);
    check(got == 0x12345678u, name, "empty keeps crc", 0, 0, got, 0x12345678u);
    uint32_t out;
    check(tl_crc32c_impl(impl, 0, NULL, 1, &out) == TL_ERR_ARG, name, "NULL data refused", 1, 0, 0, 0);
}

/* Every length 0..4096 at every misalignment 0..15. */
static void lengths_and_offsets(int impl, const char *name, const cases *c) {
    for (uint64_t off = 0; off < OFFSETS; off++) {
        for (uint64_t n = 0; n <= 4096; n++) {
            uint32_t got = run(impl, seed(off), c->data + off, n);
            check(got == c->want[off][n], name, "length at offset", n, off, got, c->want[off][n]);
        }
    }
}

/* crc(a + b) == extend(crc(a), b) for splits around the 8-byte and block edges. */
static void split_extend(int impl, const char *name, const cases *c, uint64_t total) {
    static const uint64_t splits[] = {0, 1, 7, 8, 9, 15, 16, 17, 4095, 8191, 8192, 8193, 24575, 24576, 24577};
    for (size_t i = 0; i < sizeof splits / sizeof splits[0]; i++) {
        uint64_t s = splits[i] < total ? splits[i] : total;
        uint32_t got = run(impl, run(impl, seed(0), c->data, s), c->data + s, total - s);
        check(got == c->want[0][total], name, "split and extend", total, s, got, c->want[0][total]);
    }
}

/* The three-stream round is 3 * 8192 bytes: lengths around 1, 2 and 3 rounds,
 * at a few misalignments (the head loop runs before the rounds). */
static void three_way_edges(int impl, const char *name, const cases *c) {
    static const int64_t deltas[] = {-17, -9, -8, -7, -1, 0, 1, 7, 8, 9, 17, 4096};
    for (uint64_t rounds = 1; rounds <= 3; rounds++) {
        for (size_t d = 0; d < sizeof deltas / sizeof deltas[0]; d++) {
            for (uint64_t off = 0; off < OFFSETS; off += 5) {
                uint64_t n = (uint64_t)((int64_t)(rounds * 3 * 8192) + deltas[d]);
                uint32_t got = run(impl, seed(off), c->data + off, n);
                check(got == c->want[off][n], name, "three-stream edge", n, off, got, c->want[off][n]);
            }
        }
    }
}

/* Folding starts at TL_CRCF_MIN bytes and steps 256: every length from just
 * under it to past three steps, so every tail 0..255 follows 1, 2 and 3 steps. */
static void fold_edges(int impl, const char *name, const cases *c) {
    for (uint64_t n = 8192 - 8; n <= 8192 + 3 * 256 + 8; n++) {
        for (uint64_t off = 0; off < OFFSETS; off += 5) {
            uint32_t got = run(impl, seed(off), c->data + off, n);
            check(got == c->want[off][n], name, "folding edge", n, off, got, c->want[off][n]);
        }
    }
}

int main(void) {
    unsigned char *data = malloc(BIG + OFFSETS);
    if (!data) return 2;
    uint64_t x = 0x9E3779B97F4A7C15u;
    for (size_t i = 0; i < BIG + OFFSETS; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        data[i] = (unsigned char)(x >> 24);
    }
    cases c = {data, {NULL}};
    for (uint64_t off = 0; off < OFFSETS; off++) {
        if (!(c.want[off] = malloc((BIG + 1) * sizeof(uint32_t)))) return 2;
        uint32_t raw = ~seed(off);
        for (uint64_t n = 0; n <= BIG; n++) {
            c.want[off][n] = ~raw;
            if (n < BIG) raw = reference_byte(raw, data[off + n]);
        }
    }
    uint32_t avail = 0;
    int chosen_small = -1, chosen_big = -1;
    if (tl_crc32c_impls(100, &avail, &chosen_small) != TL_OK || tl_crc32c_impls(1 << 20, &avail, &chosen_big) != TL_OK)
        return 2;
    check((avail & (1u << TL_CRC_PORTABLE)) != 0, "auto", "portable always available", avail, 0, 0, 0);
    check((avail >> chosen_small & 1u) && (avail >> chosen_big & 1u), "auto", "chosen is available", avail, 0, 0, 0);
    printf("test_crc32c: dispatcher picks %s (small), %s (1 MiB); running", NAMES[chosen_small], NAMES[chosen_big]);
    int ran = 0;
    for (int impl = 0; impl < TL_CRC_IMPLS; impl++) {
        if (impl != TL_CRC_AUTO && !(avail >> impl & 1u)) {
            uint32_t out;
            check(tl_crc32c_impl(impl, 0, "1", 1, &out) == TL_ERR_ARG, NAMES[impl], "absent impl refused", 0, 0, 0, 0);
            continue;
        }
        printf(" %s", NAMES[impl]);
        known_answers(impl, NAMES[impl]);
        lengths_and_offsets(impl, NAMES[impl], &c);
        split_extend(impl, NAMES[impl], &c, 3 * 8192 + 100);
        split_extend(impl, NAMES[impl], &c, 4097);
        split_extend(impl, NAMES[impl], &c, BIG);
        three_way_edges(impl, NAMES[impl], &c);
        fold_edges(impl, NAMES[impl], &c);
        ran++;
    }
    uint32_t out;
    check(tl_crc32c_impl(TL_CRC_IMPLS, 0, "1", 1, &out) == TL_ERR_ARG, "none", "unknown impl refused", 0, 0, 0, 0);
    check(tl_crc32c_impl(-1, 0, "1", 1, &out) == TL_ERR_ARG, "none", "negative impl refused", 0, 0, 0, 0);
    check(tl_crc32c(0, "123456789", 9) == 0xE3069283u, "tl_crc32c", "check value", 9, 0, tl_crc32c(0, "123456789", 9),
          0xE3069283u);
    printf("\ntest_crc32c: %ld passed, %ld failed (%d implementations)\n", passed, failed, ran);
    for (int off = 0; off < OFFSETS; off++) free(c.want[off]);
    free(data);
    return failed ? 1 : 0;
}

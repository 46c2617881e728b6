"""CRC32C on every implementation this build and CPU run (csrc/crc32c*.c, through lowlevel.crc32c_impl).

One table of cases for all of them, as google/crc32c's crc32c_extend_unittests.h: known answers,
every length 0..4096 at every misalignment 0..15, split/extend, the three-stream paths across their
24 KiB rounds, and agreement with an independent implementation (google-crc32c) on random buffers.
The same cases in C, tests/c/test_crc32c.c, run natively here and under qemu in .ci/cross.sh.
"""
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

try:
    import google_crc32c  # the independent CRC32C; no wheel for some CPUs (s390x), where that test skips
except ImportError:
    google_crc32c = None

from tensorlist._base import lowlevel

from _paths import ROOT
AVAILABLE, _ = lowlevel.crc32c_impls()
IMPLS = ["auto"] + AVAILABLE
ROUND = 3 * 8192  # bytes per large round of the three-stream paths (TL_CRC3_SOFT_MIN)
SMALL_ROUND = 3 * 256  # bytes per small round (TL_CRC3_MIN); every length to 4096 crosses several
FOLD_MIN, FOLD_STEP = 8192, 256  # the folding path's shortest buffer (TL_CRCF_MIN) and its step


def _table():
    """The byte-at-a-time table, built bit by bit from the reflected polynomial 0x82F63B78."""
    table = []
    for b in range(256):
        c = b
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
        table.append(c)
    return table


TABLE = _table()


def _prefix_crcs(data: bytes, seed: int) -> list:
    """out[n]: CRC32C of data[:n] continuing seed, for every n (one byte step each)."""
    raw, out = seed ^ 0xFFFFFFFF, [seed]
    for b in data:
        raw = TABLE[(raw ^ b) & 0xFF] ^ (raw >> 8)
        out.append(raw ^ 0xFFFFFFFF)
    return out


def test_portable_is_always_available_and_the_dispatcher_picks_an_available_one():
    assert "portable" in AVAILABLE
    for length in (0, 100, SMALL_ROUND - 1, SMALL_ROUND, FOLD_MIN - 1, FOLD_MIN, ROUND - 1, ROUND, 1 << 20):
        names, chosen = lowlevel.crc32c_impls(length)
        assert names == AVAILABLE and chosen in names
        # the rule of crc32c.c's choose(): hardware over tables, three streams where a round fits
        # (the software join only on the large rounds)
        preference = ["vpclmul", "sse42_3way", "sse42", "arm64_3way", "arm64_3way_soft", "arm64", "portable"]
        if length < FOLD_MIN:
            preference.remove("vpclmul")
        if length < ROUND:
            preference.remove("arm64_3way_soft")
        if length < SMALL_ROUND:
            preference = [p for p in preference if not p.endswith("_3way")]
        assert chosen == next(p for p in preference if p in names)


def test_machine_features_are_used_where_the_cpu_has_them():
    # this machine and CI are x86-64 with SSE4.2 and PCLMULQDQ; an arm64 Linux host has the CRC32 extension
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        assert {"sse42", "sse42_3way"} <= set(AVAILABLE)
        if sys.platform.startswith("linux"):  # the kernel's view of the CPU and of the YMM state it saves
            with open("/proc/cpuinfo", encoding="utf-8") as f:
                flags = set(next(line for line in f if line.startswith("flags")).split(":", 1)[1].split())
            assert ("vpclmul" in AVAILABLE) == ({"avx2", "vpclmulqdq"} <= flags), sorted(flags)
    elif machine in ("aarch64", "arm64"):
        assert {"arm64", "arm64_3way_soft"} <= set(AVAILABLE)


def test_missing_or_unknown_implementation_is_a_value_error():
    absent = next(name for name in lowlevel.CRC32C_IMPLS if name != "auto" and name not in AVAILABLE)
    with pytest.raises(ValueError, match=f"crc32c implementation '{absent}' is not available here"):
        lowlevel.crc32c_impl(absent, b"abc")
    with pytest.raises(ValueError, match="'nope' is not available here .available: portable"):
        lowlevel.crc32c_impl("nope", b"abc")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "data, expected",
    [
        (b"123456789", 0xE3069283),  # the standard check value
        (b"", 0x00000000),
        (bytes(32), 0x8A9136AA),  # RFC 3720 B.4: 32 bytes of zeros
        (b"\xff" * 32, 0x62A8AB43),  # RFC 3720 B.4: 32 bytes of ones
        (bytes(range(32)), 0x46DD794E),  # RFC 3720 B.4: incrementing
        (bytes(range(31, -1, -1)), 0x113FDB5C),  # RFC 3720 B.4: decrementing
    ],
    ids=["check", "empty", "zeros32", "ones32", "incrementing", "decrementing"],
)
def test_known_answers(impl, data, expected):
    if impl == "auto":  # the dispatcher, as every caller reaches it
        assert lowlevel.crc32c(data) == expected
    assert lowlevel.crc32c_impl(impl, data) == expected
    assert lowlevel.crc32c_impl(impl, np.frombuffer(data, np.uint8)) == expected
    assert _prefix_crcs(data, 0)[-1] == expected


@pytest.mark.parametrize("impl", IMPLS)
def test_every_length_to_4096_at_every_misalignment(impl):
    data = np.random.default_rng(3).integers(0, 256, 4096 + 16, dtype=np.uint8).tobytes()
    view = memoryview(data)
    for off in range(16):
        seed = (off * 0x9E3779B9) & 0xFFFFFFFF
        want = _prefix_crcs(data[off : off + 4096], seed)
        got = [lowlevel.crc32c_impl(impl, view[off : off + n], seed) for n in range(4097)]
        assert got == want, (impl, off, next(n for n in range(4097) if got[n] != want[n]))


@pytest.mark.parametrize("impl", IMPLS)
def test_three_stream_rounds_and_split_extend(impl):
    data = np.random.default_rng(5).integers(0, 256, 3 * ROUND + 4096 + 8, dtype=np.uint8).tobytes()
    view = memoryview(data)
    for off in (0, 3, 7):
        want = _prefix_crcs(data[off:], 0xFFFFFFFF)
        for rounds in (1, 2, 3):
            for delta in (-9, -8, -1, 0, 1, 7, 8, 17, 4096):
                n = rounds * ROUND + delta
                assert lowlevel.crc32c_impl(impl, view[off : off + n], 0xFFFFFFFF) == want[n], (off, n)
    total, whole = 2 * ROUND + 100, _prefix_crcs(data[: 2 * ROUND + 100], 0)[-1]
    for split in (0, 1, 7, 8, 9, 8191, 8192, 8193, ROUND - 1, ROUND, ROUND + 1, total):
        head = lowlevel.crc32c_impl(impl, view[:split])
        assert lowlevel.crc32c_impl(impl, view[split:total], head) == whole, split


@pytest.mark.parametrize("impl", IMPLS)
def test_folding_edges_every_tail(impl):
    """Lengths from just under the folding path's start through three steps of 256: every tail 0..255."""
    data = np.random.default_rng(9).integers(0, 256, FOLD_MIN + 4 * FOLD_STEP + 16, dtype=np.uint8).tobytes()
    view = memoryview(data)
    for off in (0, 1, 8, 13):
        seed = (off * 0x9E3779B9) & 0xFFFFFFFF
        want = _prefix_crcs(data[off:], seed)
        for n in range(FOLD_MIN - 8, FOLD_MIN + 3 * FOLD_STEP + 9):
            assert lowlevel.crc32c_impl(impl, view[off : off + n], seed) == want[n], (impl, off, n)


@pytest.mark.skipif(google_crc32c is None, reason="google-crc32c (the independent CRC32C) is not installed")
@settings(max_examples=150, deadline=None)
@given(impl=st.sampled_from(IMPLS), seed=st.integers(0, 2**32 - 1), offset=st.integers(0, 63),
       size=st.one_of(st.integers(0, 5000),
                      st.integers(-64, 64).flatmap(lambda d: st.sampled_from([ROUND + d, 2 * ROUND + d,
                                                                              3 * ROUND + d, 4 * ROUND + d]))),
       rng_seed=st.integers(0, 2**32 - 1))
def test_agrees_with_google_crc32c(impl, seed, offset, size, rng_seed):
    buf = np.random.default_rng(rng_seed).integers(0, 256, offset + size, dtype=np.uint8)
    view = memoryview(buf)[offset:]
    assert lowlevel.crc32c_impl(impl, view, seed) == google_crc32c.extend(seed, bytes(view))


def _load_generator():
    path = os.path.join(ROOT, "csrc", "gen_crc32c_tables.py")
    spec = importlib.util.spec_from_file_location("gen_crc32c_tables", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_tables_and_merge_constants_are_what_the_generator_derives():
    gen = _load_generator()
    with open(os.path.join(ROOT, "csrc", "crc32c_tables.h"), encoding="utf-8") as f:
        assert f.read() == gen.render(), "csrc/crc32c_tables.h is stale: run python csrc/gen_crc32c_tables.py"
    assert gen.tables()[0] == TABLE
    with open(os.path.join(ROOT, "csrc", "crc32c_internal.h"), encoding="utf-8") as f:
        internal = f.read()
    defines = dict(re.findall(r"^#define (TL_CRC3_\w+) (0x[0-9a-f]+|\d+)u?\b", internal, re.M))
    block = int(defines["TL_CRC3_BLOCK"])
    assert 3 * block == ROUND
    assert int(defines["TL_CRC3_K1"], 16) == gen.shift_constant(block)
    assert int(defines["TL_CRC3_K2"], 16) == gen.shift_constant(2 * block)
    small = int(defines["TL_CRC3_SMALL_BLOCK"])
    assert 3 * small == SMALL_ROUND
    assert int(defines["TL_CRC3_SMALL_K1"], 16) == gen.shift_constant(small)
    assert int(defines["TL_CRC3_SMALL_K2"], 16) == gen.shift_constant(2 * small)
    folds = dict(re.findall(r"^#define (TL_CRCF_\w+) (0x[0-9a-f]+|\d+)u?\b", internal, re.M))
    assert int(folds.pop("TL_CRCF_MIN")) == FOLD_MIN
    for bits in (2048, 256, 128):  # (x^(D+63), x^(D-1)) mod P for a fold of D bits
        assert int(folds.pop(f"TL_CRCF_K{bits}_LO"), 16) == gen.shift_constant(bits // 8 + 12)
        assert int(folds.pop(f"TL_CRCF_K{bits}_HI"), 16) == gen.shift_constant(bits // 8 + 4)
    assert not folds, folds


@pytest.mark.slow
@pytest.mark.parametrize("flags", [[], ["-DTL_CRC32C_NO_HW"]], ids=["native", "portable-only"])
def test_c_known_answer_driver_passes(tmp_path, flags):
    """tests/c/test_crc32c.c built as .ci/cross.sh builds it, natively (and with the hardware paths compiled out)."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler builds the core, so one is on PATH"
    sources = sorted(os.path.join("csrc", f) for f in os.listdir(os.path.join(ROOT, "csrc")) if f.endswith(".c"))
    exe = tmp_path / "test_crc32c"
    subprocess.run([cc, "-std=c11", "-O2", "-Wall", "-Wextra", "-Wshadow", "-Werror", "-Icsrc", *flags, *sources,
                    "tests/c/test_crc32c.c", "-o", str(exe), "-pthread"], cwd=ROOT, check=True, timeout=300)
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"test_crc32c: \d+ passed, 0 failed", proc.stdout), proc.stdout
    if flags:
        assert "dispatcher picks portable (small), portable (1 MiB)" in proc.stdout

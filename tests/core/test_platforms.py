"""Which platforms the C core builds on, and the byte-order decisions of the Python layer.

The compile/link matrix (gcc, clang, zig for Linux glibc/musl and macOS) and the C drivers under qemu
(aarch64, s390x big-endian) are in .ci/cross.sh; the whole package on s390x and aarch64 (Debian root
file systems under qemu, this module included) in .ci/foreign.sh. Here: the build's platform check, the
C driver's corpus table against the conformance manifest, the numpy mirrors of C's structs, and the
big-endian branch forced on this host.

What forcing ``dtypes.NATIVE_LITTLE = False`` on a little-endian host can catch: a writer, converter
or hash that decides to swap without asking ``dtypes``, or swaps wrongly (the bytes on disk are
compared). What it cannot: memory numpy shares with C described in the file's order (``"<"``) instead
of the host's, since ``"<"`` *is* native here; numpy or ml_dtypes behaving differently on a big-endian
CPU; anything that asks ``sys.byteorder`` itself. Those only a big-endian interpreter finds: on s390x
these tests run for real (the fixture then changes nothing), with .ci/foreign_files.py's files crossing
hosts.
"""
import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tensorlist as tl
from tensorlist._base import dtypes
from tensorlist._storage import items as _items
from tensorlist._base import lowlevel
from tensorlist._core import ffi
from tensorlist.provenance.record.hash import weights_sha256
from _paths import ROOT as ROOT_DIR

ROOT = Path(ROOT_DIR)
BUILD = ROOT / "csrc" / "build_ffi.py"


def test_a_windows_build_stops_before_compiling_with_one_line_naming_what_is_supported(tmp_path):
    # run as __main__, so the script would compile if the check let it through (and exit 0)
    code = "import runpy, sys; sys.platform = 'win32'; runpy.run_path(sys.argv[1], run_name='__main__')"
    r = subprocess.run([sys.executable, "-c", code, str(BUILD)], capture_output=True, text=True, cwd=tmp_path,
                       timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("tensorlist: the C core does not build on win32 (Windows): supported are Linux")
    assert "macOS" in lines[0] and "WSL2" in lines[0]
    assert not list(tmp_path.iterdir())  # nothing compiled, nothing written


@pytest.mark.parametrize("platform", ["linux", "darwin", "freebsd14"])
def test_posix_platforms_pass_the_build_check(platform):
    check = runpy.run_path(str(BUILD), run_name="build_ffi_check")["check_platform"]
    assert check(platform) is None


def test_setup_builds_through_the_script_that_checks():
    assert '"csrc/build_ffi.py:ffibuilder"' in (ROOT / "setup.py").read_text()
    header = (ROOT / "csrc" / "tensorlist.h").read_text()
    assert "#if defined(_WIN32)\n#error" in header  # the backstop for builds that bypass the script


# --- the C driver (tests/c/test_core.c) and its corpus table ------------------------------------------


def test_the_c_drivers_corpus_table_is_current_and_agrees_with_the_manifest():
    table = runpy.run_path(str(ROOT / "tests" / "c" / "corpus_table.py"), run_name="corpus_table")
    # table_text() refuses (AssertionError) a valid file the C scanner does not read as the manifest says
    assert table["table_text"]() == (ROOT / "tests" / "c" / "corpus.txt").read_text(), \
        "tests/c/corpus.txt is stale: run python tests/c/corpus_table.py"


def test_the_c_driver_passes_natively_over_the_whole_corpus(tmp_path):
    exe = tmp_path / "test_core"
    cc = os.environ.get("CC", "cc")
    sources = sorted(str(p) for p in (ROOT / "csrc").glob("*.c"))
    subprocess.run([cc, "-std=c11", "-O1", "-pthread", "-I", str(ROOT / "csrc"), "-o", str(exe),
                    str(ROOT / "tests" / "c" / "test_core.c"), *sources], check=True, timeout=300)
    corpus = ROOT / "tests" / "conformance"
    files = sorted(str(p) for pattern in ("valid/*.tl", "valid/*.json", "valid/*.lamp", "invalid/*.tl")
                   for p in corpus.glob(pattern))
    r = subprocess.run([str(exe), str(ROOT / "tests" / "c" / "corpus.txt"), *files], capture_output=True,
                       text=True, timeout=300, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.fullmatch(r"test_core: \d+ passed, 0 failed \((little|big)-endian host, corpus\)\n", r.stdout), r.stdout


# --- memory shared with C: the host's order, C's layout ------------------------------------------------


@pytest.mark.parametrize("mirror, ctype", [("SPAN_DTYPE", "tl_span"), ("ITEM_DTYPE", "tl_write_item")])
def test_the_numpy_mirror_of_each_c_struct_is_native_and_laid_out_as_c(mirror, ctype):
    dt = getattr(lowlevel, mirror)
    assert dt.itemsize == ffi.sizeof(ctype)
    assert [name for name, _ in ffi.typeof(ctype).fields] == list(dt.names)
    for name, field in ffi.typeof(ctype).fields:
        sub, offset = dt.fields[name][:2]
        assert offset == field.offset and sub.itemsize == ffi.sizeof(field.type), name
        assert sub.isnative, name  # C reads it in the host's order, whatever the file's is


@pytest.mark.parametrize("field", [("offset", "{}i8"), ("length", "{}i8"), ("itemsize", "{}i8")])
def test_a_struct_mirror_in_the_other_byte_order_or_layout_stops_the_import(field):
    foreign = ">" if sys.byteorder == "little" else "<"  # "<" on a big-endian host: the bug this catches
    good = [("offset", np.int64), ("length", np.int64), ("itemsize", np.int64)]
    assert lowlevel._mirror("tl_span", good) == lowlevel.SPAN_DTYPE
    swapped = [(n, field[1].format(foreign) if n == field[0] else t) for n, t in good]
    with pytest.raises(ImportError, match="different layout of tl_span"):
        lowlevel._mirror("tl_span", swapped)
    with pytest.raises(ImportError, match="different layout of tl_span"):
        lowlevel._mirror("tl_span", [("offset", np.int64), ("length", np.int32), ("itemsize", np.int64)])
    with pytest.raises(ImportError, match="different layout of tl_span"):
        lowlevel._mirror("tl_span", [("offset", np.int64), ("itemsize", np.int64), ("length", np.int64)])


def test_c_reads_the_layout_check_spans_in_the_host_order():
    # offsets and lengths whose bytes read differently swapped: C must see these values
    spans = np.zeros(2, lowlevel.SPAN_DTYPE)
    spans["offset"], spans["length"], spans["itemsize"] = [0, 256], [8, 16], [4, 4]
    assert lowlevel.check_layout(spans, 512, 8)[0] == 0
    assert lowlevel.check_layout(spans, 271, 8)[:2] == (lowlevel.lib.TL_ERR_BOUNDS, 1)


# --- byte order: a big-endian host's branches, forced on this machine ---------------------------------

VALUES = {
    "f4": np.arange(6, dtype=np.float32).reshape(2, 3) * 1.5 - 2,
    "i8": np.array([1, -2, 2**40 + 3], dtype=np.int64),
    "u2": np.array([0x0102, 0xA0B0], dtype=np.uint16),
    "f2": np.array([0.5, -3.25], dtype=np.float16),
    "c8": np.array([1 + 2j, -3.5j], dtype=np.complex64),  # swapped per 4-byte part
    "u1": np.arange(5, dtype=np.uint8),
    "b": np.array([True, False, True]),
}


def _as_big_host_holds(v: np.ndarray) -> np.ndarray:
    """``v`` as a big-endian host holds it: a native-order ('=') dtype over big-endian bytes."""
    return np.frombuffer(v.astype(v.dtype.newbyteorder(">")).tobytes(), v.dtype.newbyteorder("=")).reshape(v.shape)


@pytest.fixture
def big_endian_host(monkeypatch):
    """The Python layer's one byte-order question (``dtypes.NATIVE_LITTLE``) answered "big"."""
    monkeypatch.setattr(dtypes, "NATIVE_LITTLE", False)
    monkeypatch.setattr(_items, "_DTYPE_CACHE", {})  # the swap decisions cached for this host's answer
    monkeypatch.setattr(_items, "_DTYPE_BY_ID", {})
    return monkeypatch


def _stored_bytes(path) -> dict:
    desc = json.loads(path.read_text())
    data = (path.parent / desc["location"]).read_bytes()
    return {t["name"]: data[t["byteOffset"]:t["byteOffset"] + t["byteLength"]] for t in desc["tensors"]}


def test_is_little_answers_for_the_host_it_is_told():
    assert dtypes.is_little(np.dtype("<f4")) and not dtypes.is_little(np.dtype(">f4"))
    assert dtypes.is_little(np.dtype("u1")) and dtypes.is_little(np.dtype("?"))
    assert dtypes.is_little(np.dtype("=i8")) == (sys.byteorder == "little")


@pytest.mark.parametrize("how", ["save", "writer"])
def test_a_big_endian_host_writes_its_native_arrays_little_endian_and_reads_them_back(tmp_path, big_endian_host,
                                                                                      how):
    native = {k: _as_big_host_holds(v) for k, v in VALUES.items()}
    for k in ("f4", "i8", "u2", "c8"):  # big-endian bytes, labelled native (on a big-endian host: truly)
        little = VALUES[k].astype(VALUES[k].dtype.newbyteorder("<")).tobytes()
        assert native[k].dtype.byteorder == "=" and native[k].tobytes() != little
    path = tmp_path / "big.tl"
    if how == "save":
        tl.save(path, native)
    else:
        with tl.Writer(path) as w:
            for k, v in native.items():
                w.add(k, v)
    stored = _stored_bytes(path)
    for k, v in VALUES.items():
        assert stored[k] == v.astype(v.dtype.newbyteorder("<")).tobytes(), k  # little-endian on disk, exactly
    got = tl.load(path, verify=True)  # the CRCs were computed over the swapped (stored) bytes
    for k, v in VALUES.items():
        assert got[k].dtype.newbyteorder("=") == v.dtype.newbyteorder("=") and np.array_equal(got[k], v), k
    for k in native:
        assert native[k].tobytes() == _as_big_host_holds(VALUES[k]).tobytes()  # the caller's arrays untouched


def test_a_big_endian_host_hashes_its_native_arrays_as_the_little_endian_values(big_endian_host):
    big = weights_sha256({k: _as_big_host_holds(v) for k, v in VALUES.items()})
    big_endian_host.undo()
    assert big == weights_sha256(VALUES)


def test_a_big_endian_host_converts_its_native_arrays_to_little_endian_entries(big_endian_host):
    from tensorlist.convert.formats import Entry

    for k, v in VALUES.items():
        native = _as_big_host_holds(v)
        a = Entry(k, dtypes.from_numpy(v.dtype), v.shape, lambda native=native: native).array()
        assert a.tobytes() == v.astype(v.dtype.newbyteorder("<")).tobytes() and np.array_equal(a, v), k
        assert native.tobytes() == _as_big_host_holds(v).tobytes()  # a copy: the source is untouched


def test_a_big_endian_host_loads_onto_a_device_through_numpy(tmp_path, big_endian_host):
    torch = pytest.importorskip("torch", reason="the device load path needs torch")
    path = tmp_path / "d.tl"
    big_endian_host.undo()
    tl.save(path, {k: v for k, v in VALUES.items() if k != "c8"})
    big_endian_host.setattr(dtypes, "NATIVE_LITTLE", False)  # the staging path's big-endian branch
    got = tl.load(path, device="cpu")
    for k, v in VALUES.items():
        if k != "c8":
            assert isinstance(got[k], torch.Tensor) and np.array_equal(got[k].numpy(), v), k

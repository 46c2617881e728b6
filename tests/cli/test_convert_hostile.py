"""Every converter source is hostile input: each class of bad file is a FormatError naming the
file and the entry, never a stray AttributeError, RecursionError, numpy or torch error, a hang or a disk
filled by a few bytes. Cases that could hang or crash the interpreter run in a child with a timeout."""
import json
import os
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest

import tensorlist as tl
from tensorlist._base import dtypes as _dtypes
from tensorlist.convert import MIN_EXPANSION_BYTES, NPZ_SIDECAR, convert, open_source

from _compat import bfloat16_bits, formats_marked, needs_numpy_64_dims, needs_torch

try:
    import torch
except ImportError:  # the tests marked needs_torch skip, the rest run (the s390x leg has no torch)
    torch = None


def _in_child(code: str, timeout: int = 120) -> str:
    """Runs ``code`` in a fresh interpreter; its stdout (a crash or a hang fails the test)."""
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         timeout=timeout)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


def _outputs(tmp_path):
    return sorted(n for n in os.listdir(tmp_path) if n.startswith("out"))


# --- the npz side entry ------------------------------------------------------------------------

def _npz_with_side(path, side, **arrays):
    with zipfile.ZipFile(path, "w") as z:
        for name, a in {"w": np.ones(2, "<f4"), **arrays}.items():  # little-endian on every host
            with z.open(name + ".npy", "w") as f:
                np.lib.format.write_array(f, a)
        with z.open(NPZ_SIDECAR + ".npy", "w") as f:
            np.lib.format.write_array(f, side if isinstance(side, np.ndarray) else np.array(side))


_DEEP = "[" * 3000 + "]" * 3000
SIDES = {
    "not-json": ("{named: true}", NPZ_SIDECAR, "not tensorlist's JSON"),
    "duplicate-key": ('{"named": true, "named": false}', NPZ_SIDECAR, "duplicate key"),
    "nan": ('{"metadata": NaN}', NPZ_SIDECAR, "NaN is not valid JSON"),
    "deep": ('{"metadata": ' + _DEEP + "}", NPZ_SIDECAR, "nesting deeper than 256"),
    "a-list": ("[1, 2]", NPZ_SIDECAR, "must be a JSON object, got list"),
    "named-a-string": ('{"named": "yes"}', NPZ_SIDECAR + "/named", "must be true or false"),
    "dtypes-a-list": ('{"dtypes": []}', NPZ_SIDECAR + "/dtypes", "must be an object"),
    "unknown-dtype": ('{"dtypes": {"w": "float128"}}', NPZ_SIDECAR + "/dtypes/w", "is not a dtype stored"),
    "missing-entry": ('{"dtypes": {"ghost": "bfloat16"}}', NPZ_SIDECAR + "/dtypes/ghost", "does not hold"),
    "int-array": (np.arange(3), NPZ_SIDECAR, "must be a 0-d string array"),
    "1-d-strings": (np.array(["{}", "{}"]), NPZ_SIDECAR, "must be a 0-d string array"),
    "0-d-int": (np.array(5), NPZ_SIDECAR, "must be a 0-d string array"),
}


@pytest.mark.parametrize("case", list(SIDES))
def test_a_bad_npz_side_entry_is_a_format_error_naming_file_and_entry(tmp_path, case):
    side, field, why = SIDES[case]
    path = tmp_path / "s.npz"
    _npz_with_side(path, side)
    with pytest.raises(tl.FormatError, match=why) as e:
        convert(path, tmp_path / "out.tl", progress=False)
    assert e.value.file == str(path) and e.value.field == field and "\n" not in str(e.value)
    assert _outputs(tmp_path) == []


def test_a_side_entry_naming_a_dtype_its_tensor_is_not_stored_as_is_refused(tmp_path):
    path = tmp_path / "s.npz"
    _npz_with_side(path, '{"dtypes": {"w": "bfloat16"}}')  # w is float32, not bfloat16's uint16
    with pytest.raises(tl.FormatError, match=r"says it holds bfloat16, stored as uint16, but its dtype is float32"):
        open_source(path)


def test_a_side_entry_tensor_stored_big_endian_reads_as_its_values(tmp_path):
    """An npz written by numpy on a big-endian host holds its uint16 bits big-endian: read as the same bfloat16."""
    bits = bfloat16_bits([1.5, -2.0, 0.0])
    path = tmp_path / "s.npz"
    _npz_with_side(path, '{"dtypes": {"b": "bfloat16"}}', b=bits.view(np.uint16).astype(">u2"))
    convert(path, tmp_path / "back.tl", progress=False)
    got = tl.load(tmp_path / "back.tl", bits=True)["b"]
    assert _dtypes.from_numpy(got.dtype).name == "bfloat16" and got.tobytes() == _dtypes.as_little(bits).tobytes()


def test_the_side_entry_written_by_convert_still_reads(tmp_path):
    # bit carriers (bfloat16 0, 1, 2; float8_e8m0fnu 1.0): no ml_dtypes needed, none for s390x
    e8m0 = _dtypes.from_name("float8_e8m0fnu").bits
    want = {"b": bfloat16_bits(np.arange(3)), "f": np.full(2, 127, np.uint8).view(e8m0)}
    tl.save(tmp_path / "m.tl", want, metadata={"k": [1, 2]})
    convert(tmp_path / "m.tl", tmp_path / "m.npz", progress=False)
    convert(tmp_path / "m.npz", tmp_path / "back.tl", progress=False)
    got = tl.load(tmp_path / "back.tl", bits=True)
    assert all(_dtypes.from_numpy(got[k].dtype) is _dtypes.from_numpy(v.dtype)
               and got[k].tobytes() == _dtypes.as_little(v).tobytes() for k, v in want.items())
    assert tl.open(tmp_path / "back.tl").metadata == {"k": [1, 2]}


# --- safetensors shapes: the same dims rules as tensorlist's own ------------------------------------

def _st(path, shape, dtype="I16", nbytes=0):
    header = json.dumps({"t": {"dtype": dtype, "shape": shape, "data_offsets": [0, nbytes]}}).encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * nbytes)


@pytest.mark.parametrize("shape, why", [([0, 2 ** 62], "overflow 64 bits in their non-zero dims"),
                                        ([0, 2 ** 31, 2 ** 31], "overflow 64 bits in their non-zero dims"),
                                        ([1] * 65, "65 dims, more than the 64"),
                                        ([0] * 65, "65 dims, more than the 64"),
                                        ([-1], "non-negative integers"), ([True], "non-negative integers")])
def test_safetensors_shapes_obey_tensorlist_s_dims_rules(tmp_path, shape, why):
    _st(tmp_path / "s.safetensors", shape)
    with pytest.raises(tl.FormatError, match=why) as e:
        open_source(tmp_path / "s.safetensors")
    assert e.value.tensor_name == "t" and e.value.field == "shape"


@needs_numpy_64_dims
def test_safetensors_with_64_dims_and_an_empty_tensor_in_bounds_convert(tmp_path):
    _st(tmp_path / "a.safetensors", [1] * 64, "F32", 4)
    _st(tmp_path / "b.safetensors", [0, 2 ** 40], "F32")
    for name in ("a", "b"):
        convert(tmp_path / f"{name}.safetensors", tmp_path / f"{name}.tl", progress=False)
    assert tl.load(tmp_path / "a.tl")["t"].ndim == 64 and tl.load(tmp_path / "b.tl")["t"].shape == (0, 2 ** 40)


# --- torch sources ----------------------------------------------------------------------------

@needs_torch
def test_torch_numbers_past_64_bits_and_65_dims_are_format_errors(tmp_path):
    torch.save({"w": torch.ones(1), "step": 2 ** 70}, tmp_path / "a.pt")
    with pytest.raises(tl.FormatError, match=r"a.pt: tensor 1 \('step'\): the integer .* does not fit 64 bits"):
        convert(tmp_path / "a.pt", tmp_path / "out.tl", progress=False)
    torch.save({"w": torch.zeros([1] * 65)}, tmp_path / "b.pt")
    with pytest.raises(tl.FormatError, match=r"b.pt: tensor 0 \('w'\): field 'shape': 65 dims"):
        convert(tmp_path / "b.pt", tmp_path / "out.tl", progress=False)
    torch.save({"big": 2 ** 64 - 1, "small": -2 ** 63}, tmp_path / "c.pt")  # 64 bits: kept
    convert(tmp_path / "c.pt", tmp_path / "c.tl", progress=False)
    got = tl.load(tmp_path / "c.tl")
    assert int(got["big"]) == 2 ** 64 - 1 and int(got["small"]) == -2 ** 63
    assert _outputs(tmp_path) == []


@needs_torch
def test_a_sparse_tensor_torch_cannot_load_is_a_format_error(tmp_path):
    bad = torch.sparse_coo_tensor(torch.tensor([[7]]), torch.tensor([1.0]), (2,), check_invariants=False)
    torch.save({"w": torch.ones(1), "s": bad}, tmp_path / "s.pt")
    with pytest.raises(tl.FormatError, match=r"s.pt: ") as e:
        convert(tmp_path / "s.pt", tmp_path / "out.tl", progress=False)
    assert "\n" not in str(e.value)
    assert _outputs(tmp_path) == []


@needs_torch
def test_a_nested_tensor_is_a_format_error_not_a_torch_internal_error(tmp_path):
    torch.save({"w": torch.ones(1), "n": torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])},
               tmp_path / "n.pt")
    with pytest.raises(tl.FormatError, match=r"n.pt: tensor 1 \('n'\): a nested tensor has no single shape"):
        convert(tmp_path / "n.pt", tmp_path / "out.tl", progress=False)
    assert _outputs(tmp_path) == []


@needs_torch
def test_names_that_collide_once_joined_are_refused(tmp_path):
    torch.save({"a.b": torch.ones(1), "a": {"b": torch.zeros(1)}}, tmp_path / "c.pt")
    with pytest.raises(tl.FormatError, match=r"two values are named 'a.b'"):
        convert(tmp_path / "c.pt", tmp_path / "out.tl", progress=False)


@needs_torch
@pytest.mark.slow
@pytest.mark.parametrize("case", ["deep", "cycle", "shared-60-times"])
def test_torch_objects_that_nest_or_alias_without_end_are_refused_quickly(tmp_path, case):
    make = {
        "deep": "d = x = {}\nfor i in range(3000):\n    x['a'] = {}; x = x['a']\nx['t'] = torch.ones(1)\nobj = d",
        "cycle": "l = [torch.ones(1)]; l.append(l); obj = {'x': l}",
        "shared-60-times": "l = [torch.ones(1)]\nfor i in range(60):\n    l = [l, l]\nobj = {'x': l}",
    }[case]
    # torch.save pickles recursively: the writer needs a deep stack, the reader must not
    _in_child("import sys, torch\nsys.setrecursionlimit(100000)\n" + make
              + f"\ntorch.save(obj, {str(tmp_path / 'h.pt')!r})\n")
    out = _in_child(f"""
        import time
        import tensorlist as tl
        from tensorlist.convert import convert
        t = time.monotonic()
        try:
            convert({str(tmp_path / 'h.pt')!r}, {str(tmp_path / 'out.tl')!r}, progress=False)
        except tl.FormatError as e:
            print(type(e).__name__, e.file, time.monotonic() - t)
    """, timeout=120)
    kind, file, seconds = out.split()
    assert kind == "FormatError" and file == str(tmp_path / "h.pt") and float(seconds) < 30
    assert _outputs(tmp_path) == []


# --- no size cap: zip bombs and aliased views ---------------------------------------------------

def _npz_bomb(path, nbytes):
    """An npz of one uint8 member of ``nbytes`` zeros, deflated (about 1/1000 of it on disk)."""
    header = {"descr": "|u1", "fortran_order": False, "shape": (nbytes,)}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, allowZip64=True) as z:
        with z.open("zeros.npy", "w", force_zip64=True) as f:
            np.lib.format.write_array_header_1_0(f, header)
            chunk = bytes(1 << 24)
            for _ in range(nbytes // len(chunk)):
                f.write(chunk)
            f.write(bytes(nbytes % len(chunk)))


@pytest.mark.slow
def test_an_npz_zip_bomb_is_refused_before_anything_is_written(tmp_path):
    _npz_bomb(tmp_path / "bomb.npz", 1 << 30)
    assert os.path.getsize(tmp_path / "bomb.npz") < 2 << 20
    for dst in ("out.tl", "out.safetensors", "out.npz", "out.pt"):
        with pytest.raises(tl.FormatError, match=r"bomb.npz: its tensors expand to 1073741824 bytes, above the "
                                                 r"limit of 16 x its \d+ bytes on disk .*max_total_bytes="):
            convert(tmp_path / "bomb.npz", tmp_path / dst, progress=False)
    assert _outputs(tmp_path) == []
    with open_source(tmp_path / "bomb.npz") as s:  # listing it (inspect) reads headers only
        assert s.nbytes == 1 << 30


def test_the_expansion_cap_is_a_keyword_and_small_sources_stay_under_it(tmp_path):
    _npz_bomb(tmp_path / "small.npz", 8 << 20)  # 8 MiB from a few kB: under the 64 MiB floor
    assert MIN_EXPANSION_BYTES == 64 << 20
    convert(tmp_path / "small.npz", tmp_path / "a.tl", progress=False)
    with pytest.raises(tl.FormatError, match=r"above the limit \(1048576 bytes"):
        convert(tmp_path / "small.npz", tmp_path / "out.tl", progress=False, max_total_bytes=1 << 20)
    convert(tmp_path / "small.npz", tmp_path / "b.tl", progress=False, max_total_bytes=8 << 20)
    assert _outputs(tmp_path) == []


@needs_torch
def test_torch_views_of_one_storage_count_every_time(tmp_path):
    big = torch.zeros(1 << 18)  # 1 MiB
    torch.save({f"v{i}": big for i in range(80)}, tmp_path / "alias.pt")  # 1 MiB on disk, 80 MiB out
    with pytest.raises(tl.FormatError, match=r"alias.pt: its tensors expand to 83886080 bytes"):
        convert(tmp_path / "alias.pt", tmp_path / "out.tl", progress=False)
    assert _outputs(tmp_path) == []


@needs_torch
def test_torch_records_past_the_cap_are_refused_before_torch_load(tmp_path, monkeypatch):
    torch.save({"w": torch.zeros(1 << 16)}, tmp_path / "w.pt")

    def no_load(*a, **k):
        raise AssertionError("torch.load ran before the size check")

    monkeypatch.setattr(torch, "load", no_load)
    with pytest.raises(tl.FormatError, match=r"w.pt: its records expand to \d+ bytes, above the limit of 1000"):
        open_source(tmp_path / "w.pt", max_total_bytes=1000)


@pytest.mark.parametrize("fmt", formats_marked(["tl", "safetensors", "npz", "pt"]))
def test_max_tensors_is_the_readers_limit_with_a_keyword(tmp_path, fmt):
    tl.save(tmp_path / "m.tl", {f"t{i}": np.ones(1, np.float32) for i in range(5)})
    src = tmp_path / f"m.{fmt}"
    if fmt != "tl":
        convert(tmp_path / "m.tl", src, progress=False)
    why = "more than 4 values" if fmt == "pt" else r"5 tensors, above the limit of 4"
    with pytest.raises(tl.FormatError, match=why + r".*\(raise it with max_tensors=\)"):
        convert(src, tmp_path / "out.tl", progress=False, max_tensors=4)
    convert(src, tmp_path / "ok.tl", progress=False, max_tensors=5)
    assert _outputs(tmp_path) == []

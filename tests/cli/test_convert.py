"""tensorlist.convert: every direction bit for bit, interop with the real libraries, bad input."""
import json
import os
import pickle
import struct

import numpy as np
import pytest

import tensorlist as tl
from _compat import bfloat16_bits, formats_marked, needs_torch
from tensorlist._base import dtypes as _dtypes
from tensorlist.convert import DEFAULT_SHARD_BYTES, convert, diff, infer_format, open_source
from _paths import ROOT

try:
    import torch
except ImportError:  # the tests marked needs_torch skip, the rest run (the s390x leg has no torch)
    torch = None

NAMED = formats_marked(["tensorlist", "safetensors", "hf", "npz", "pt"])
EXT = {"tensorlist": "m.tl", "safetensors": "m.safetensors", "hf": "model.safetensors.index.json",
       "npz": "m.npz", "pt": "m.pt", "lamp": "m.lamp", "npy": "m.npy"}


def _tensors():
    rng = np.random.default_rng(0)
    bf = bfloat16_bits(rng.standard_normal(7))  # a bit carrier: bfloat16 without ml_dtypes (none for s390x)
    bf[0] = 0x7FC1  # a NaN with a payload: must survive bit for bit
    return {
        "embed.weight": rng.standard_normal((5, 3)).astype(np.float32),
        "attn.bf16": bf,
        "norm.f16": np.array([0.5, -0.0, np.inf, 65504], np.float16),
        "mask": np.array([[True, False], [False, True]]),
        "ids": np.arange(6, dtype=np.int64).reshape(2, 3),
        "u8": np.arange(4, dtype=np.uint8),
        "f64": np.array([1e-300, np.pi]),
        "scalar": np.array(3, np.int32),
        "empty": np.zeros((0, 4), np.float32),
    }


def _assert_same_bits(got: dict, want: dict):
    """Same names, dtypes (a bit carrier counts as its type), shapes and stored (little-endian) bytes."""
    assert list(got) == list(want) or sorted(got) == sorted(want)
    for k, w in want.items():
        g = got[k]
        assert _dtypes.from_numpy(g.dtype) is _dtypes.from_numpy(w.dtype), k
        assert g.shape == w.shape, k
        assert _dtypes.as_little(g).tobytes() == _dtypes.as_little(w).tobytes(), k


def _load(path) -> dict:
    """The file's tensors, bfloat16/float8 as bit carriers (no ml_dtypes needed)."""
    return tl.load(path, bits=True)


def _make(tmp_path, fmt, tensors, metadata=None):
    """A file of format ``fmt`` holding ``tensors``, made through a tensorlist file."""
    base = tmp_path / "origin.tl"
    tl.save(base, tensors, metadata=metadata)
    if fmt == "tensorlist":
        return base
    out = tmp_path / f"src-{EXT[fmt]}"
    convert(base, out, dst_format=fmt, progress=False)
    return out


@pytest.mark.parametrize("dst_fmt", NAMED)
@pytest.mark.parametrize("src_fmt", NAMED)
def test_every_direction_is_bit_exact(tmp_path, src_fmt, dst_fmt):
    want = _tensors()
    src = _make(tmp_path, src_fmt, want)
    (tmp_path / "dst").mkdir()
    dst = tmp_path / "dst" / EXT[dst_fmt]
    convert(src, dst, progress=False)
    assert infer_format(dst) == dst_fmt
    back = tmp_path / "back.tl"
    convert(dst, back, progress=False)
    _assert_same_bits(_load(back), want)
    assert diff(src, dst).identical


@pytest.mark.parametrize("fmt", ["tensorlist", "safetensors", "hf", "npz"])
def test_metadata_survives(tmp_path, fmt):
    meta = {"epoch": 3, "note": ["any", "json"]}
    src = _make(tmp_path, fmt, {"w": np.ones(2, np.float32)}, metadata=meta)
    convert(src, tmp_path / "back.tl", progress=False)
    assert tl.open(tmp_path / "back.tl").metadata == meta


def test_string_metadata_is_plain_safetensors_metadata(tmp_path):
    safe_open = pytest.importorskip("safetensors", reason="reading with the safetensors library needs it").safe_open

    tl.save(tmp_path / "a.tl", {"w": np.ones(2, np.float32)}, metadata={"format": "pt", "author": "me"})
    convert(tmp_path / "a.tl", tmp_path / "a.safetensors", progress=False)
    with safe_open(str(tmp_path / "a.safetensors"), "np") as f:
        assert f.metadata() == {"format": "pt", "author": "me"}


@needs_torch
def test_reads_what_the_safetensors_library_writes(tmp_path):
    from safetensors.torch import save_file

    state = {"a": torch.randn(3, 4, dtype=torch.bfloat16), "b": torch.arange(5, dtype=torch.int16),
             "c": torch.tensor([True, False]), "d": torch.randn(2, dtype=torch.float16)}
    save_file(state, str(tmp_path / "lib.safetensors"), metadata={"format": "pt"})
    convert(tmp_path / "lib.safetensors", tmp_path / "m.tl", progress=False)
    from tensorlist.torch import to_numpy

    _assert_same_bits(_load(tmp_path / "m.tl"), {k: to_numpy(v) for k, v in state.items()})


@pytest.mark.parametrize("dst", ["m.safetensors", "hf/m.safetensors.index.json"])
def test_a_list_keeps_its_order_and_weights_hash_through_safetensors(tmp_path, dst):
    """safetensors lays tensors out by dtype, widest first; the header keeps the list's order, and reads it back."""
    import importlib.util

    from tensorlist.provenance.record import weights_sha256

    want = {"z": np.arange(3, dtype=np.int8), "a": np.ones((2, 2), np.float16), "m": np.ones(2, np.float64),
            "b": np.arange(5, dtype=np.float32)}
    tl.save(tmp_path / "m.tl", want)
    convert(tmp_path / "m.tl", tmp_path / dst, shard_bytes=40, progress=False)
    convert(tmp_path / dst, tmp_path / "back.tl", progress=False)
    assert list(tl.open(tmp_path / "back.tl").keys()) == list(want)
    assert weights_sha256(str(tmp_path / "back.tl")) == weights_sha256(want)
    if dst == "m.safetensors" and importlib.util.find_spec("safetensors"):  # not on the foreign CPUs' leg
        from safetensors.numpy import load_file

        got = load_file(str(tmp_path / dst))  # the library reads it: offsets in layout order, widest first
        _assert_same_bits(got, want)


@needs_torch
def test_the_safetensors_library_reads_what_convert_writes(tmp_path):
    from safetensors.torch import load_file

    from tensorlist.torch import to_numpy

    want = {k: v for k, v in _tensors().items()}
    tl.save(tmp_path / "m.tl", want)
    convert(tmp_path / "m.tl", tmp_path / "m.safetensors", progress=False)
    got = {k: to_numpy(v) for k, v in load_file(str(tmp_path / "m.safetensors")).items()}
    _assert_same_bits(got, want)


@needs_torch
def test_hf_sharded_both_ways(tmp_path):
    from safetensors.torch import load_file

    want = {f"layer.{i}.w": np.full((64, 64), i, np.float32) for i in range(5)}  # 16 KiB each
    tl.save(tmp_path / "m.tl", want)
    out = tmp_path / "hf" / "model.safetensors.index.json"
    out.parent.mkdir()
    convert(tmp_path / "m.tl", out, shard_bytes=40_000, progress=False)
    index = json.loads(out.read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert shards == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert index["metadata"]["total_size"] == 5 * 64 * 64 * 4
    # each shard is a plain safetensors file (as transformers expects: format "pt")
    for s in shards:
        assert all(k in index["weight_map"] for k in load_file(str(out.parent / s)))
    assert not [n for n in os.listdir(out.parent) if n.endswith(".tmp")]
    convert(out, tmp_path / "back.tl", progress=False)
    _assert_same_bits(_load(tmp_path / "back.tl"), want)
    assert DEFAULT_SHARD_BYTES == 5_000_000_000


def test_hf_index_missing_key_is_one_clear_error(tmp_path):
    src = _make(tmp_path, "hf", {"a": np.ones(2), "b": np.zeros(3)})
    index = json.loads(src.read_text())
    index["weight_map"]["ghost"] = index["weight_map"]["a"]
    src.write_text(json.dumps(index))
    with pytest.raises(tl.FormatError, match=r"tensor 'ghost' listed in weight_map is missing from shard"):
        convert(src, tmp_path / "out.tl", progress=False)
    assert not os.path.exists(tmp_path / "out.tl")
    index["weight_map"]["ghost"] = "nope.safetensors"
    src.write_text(json.dumps(index))
    with pytest.raises(tl.FormatError, match=r"shard 'nope.safetensors' named in weight_map does not exist"):
        convert(src, tmp_path / "out.tl", progress=False)
    index["weight_map"]["ghost"] = "../escape.safetensors"
    src.write_text(json.dumps(index))
    with pytest.raises(tl.FormatError, match="escapes"):
        convert(src, tmp_path / "out.tl", progress=False)


def test_lamp_and_positional(tmp_path):
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array(7, np.int64),
              bfloat16_bits([1.5])]
    tl.save(tmp_path / "p.tl", arrays)
    convert(tmp_path / "p.tl", tmp_path / "p.lamp", progress=False)
    raw = json.loads((tmp_path / "p.lamp").read_text())
    assert "formatVersion" not in raw and raw["location"] == "p.lamp.data"  # lamp's own bytes
    for fmt in ("npz", "pt", "tensorlist") if torch is not None else ("npz", "tensorlist"):
        dst = tmp_path / f"again-{EXT[fmt]}"
        convert(tmp_path / "p.lamp", dst, dst_format=fmt, progress=False)
        convert(dst, tmp_path / "back.tl", progress=False)
        with tl.open(tmp_path / "back.tl") as r:
            assert r.descriptor.tensors.names is None  # still positional
        _assert_same_bits(_load(tmp_path / "back.tl"), {str(i): a for i, a in enumerate(arrays)})


def test_npy_one_array(tmp_path):
    a = np.arange(12, dtype=">i4").reshape(3, 4)  # big-endian in, little-endian stored
    np.save(tmp_path / "a.npy", a)
    convert(tmp_path / "a.npy", tmp_path / "a.tl", progress=False)
    got = tl.load(tmp_path / "a.tl")["0"]
    assert got.dtype == np.dtype("<i4") and (got == a).all()
    convert(tmp_path / "a.tl", tmp_path / "b.npy", progress=False)
    assert np.load(tmp_path / "b.npy").tobytes() == a.astype("<i4").tobytes()
    tl.save(tmp_path / "two.tl", {"a": np.ones(1), "b": np.ones(1)})
    with pytest.raises(ValueError, match="exactly one array"):
        convert(tmp_path / "two.tl", tmp_path / "two.npy", progress=False)
    tl.save(tmp_path / "bf.tl", {"a": bfloat16_bits(np.ones(2))})
    with pytest.raises(ValueError, match="bfloat16 has no .npy dtype"):
        convert(tmp_path / "bf.tl", tmp_path / "bf.npy", progress=False)
    assert not os.path.exists(tmp_path / "two.npy") and not os.path.exists(tmp_path / "bf.npy")


def test_npz_made_by_numpy(tmp_path):
    np.savez(tmp_path / "n.npz", x=np.arange(3.0), y=np.eye(2, dtype=np.float16))
    convert(tmp_path / "n.npz", tmp_path / "n.tl", progress=False)
    _assert_same_bits(_load(tmp_path / "n.tl"), {"x": np.arange(3.0), "y": np.eye(2, dtype=np.float16)})


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > pwned.txt",))


@needs_torch
@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_pt_with_a_pickle_payload_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.save({"w": torch.ones(2), "evil": _Evil()}, tmp_path / "evil.pt")
    with pytest.raises(tl.FormatError, match=r"evil.pt: refused: .*arbitrary code"):
        convert(tmp_path / "evil.pt", tmp_path / "out.tl", progress=False)
    assert not (tmp_path / "pwned.txt").exists()
    assert not (tmp_path / "out.tl").exists()
    # a plain pickle renamed .pt: refused too
    with open(tmp_path / "plain.pt", "wb") as f:
        pickle.dump(_Evil(), f)
    with pytest.raises(tl.FormatError, match="plain.pt"):
        convert(tmp_path / "plain.pt", tmp_path / "out.tl", progress=False)
    assert not (tmp_path / "pwned.txt").exists()


@needs_torch
def test_pt_checkpoint_nested_dicts_and_numbers(tmp_path):
    torch.save({"model": {"w": torch.ones(2, dtype=torch.bfloat16)}, "epoch": 3, "lr": 0.5},
               tmp_path / "c.pt")
    convert(tmp_path / "c.pt", tmp_path / "c.tl", progress=False)
    got = tl.load(tmp_path / "c.tl")
    assert list(got) == ["model.w", "epoch", "lr"]
    assert got["model.w"].dtype.name == "bfloat16" and int(got["epoch"]) == 3
    torch.save({"w": torch.ones(1), "name": "run-1"}, tmp_path / "s.pt")
    with pytest.raises(tl.FormatError, match="holds a str at 'name'"):
        convert(tmp_path / "s.pt", tmp_path / "s.tl", progress=False)


@pytest.mark.parametrize("damage", ["truncate", "header", "offsets"])
def test_corrupt_safetensors_is_one_clear_error_and_no_destination(tmp_path, damage):
    src = _make(tmp_path, "safetensors", _tensors())
    data = bytearray(src.read_bytes())
    if damage == "truncate":
        data = data[:-10]
    elif damage == "header":
        data[8:12] = b"{{{{"
    else:
        n = struct.unpack("<Q", data[:8])[0]
        header = json.loads(data[8:8 + n])
        header["ids"]["data_offsets"][1] += 8
        text = json.dumps(header).encode()
        text += b" " * (n - len(text)) if len(text) <= n else b""
        data[8:8 + n] = text[:n]
    src.write_bytes(bytes(data))
    (tmp_path / "out").mkdir()
    for dst in ("m.tl", "m.npz", "m.safetensors", "model.safetensors.index.json") + (("m.pt",) if torch else ()):
        with pytest.raises(tl.FormatError, match=r"src-m\.safetensors"):
            convert(src, tmp_path / "out" / dst, progress=False)
    assert os.listdir(tmp_path / "out") == []


def test_corrupt_tensorlist_and_npz_sources(tmp_path):
    src = _make(tmp_path, "tensorlist", _tensors())
    (tmp_path / "out").mkdir()
    data = tl.open(src).descriptor.data_path
    with open(data, "r+b") as f:
        f.truncate(100)
    with pytest.raises(tl.FormatError, match="origin.tl"):
        convert(src, tmp_path / "out" / "x.safetensors", progress=False)
    (tmp_path / "bad.npz").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(tl.FormatError, match="bad.npz"):
        convert(tmp_path / "bad.npz", tmp_path / "out" / "x.tl", progress=False)
    assert os.listdir(tmp_path / "out") == []


def test_failure_while_writing_leaves_old_destination(tmp_path, monkeypatch):
    tl.save(tmp_path / "src.tl", {"a": np.ones(3, np.float32), "b": np.ones(3, np.float32)})
    (tmp_path / "dst.safetensors").write_bytes(b"old content")
    from tensorlist.convert import sinks

    calls = []

    def boom(n):
        calls.append(n)
        if len(calls) == 2:
            raise OSError("disk full")

    class Bar:
        update = staticmethod(boom)

        def close(self):
            pass

    monkeypatch.setattr(sinks, "Progress", lambda *a, **k: Bar())
    with pytest.raises(OSError, match="disk full"):
        convert(tmp_path / "src.tl", tmp_path / "dst.safetensors")
    assert (tmp_path / "dst.safetensors").read_bytes() == b"old content"
    assert sorted(os.listdir(tmp_path)) == sorted(["src.tl", "dst.safetensors",
                                                   tl.open(tmp_path / "src.tl").descriptor.location])


def test_format_inference_and_overrides(tmp_path):
    assert infer_format("a/model.safetensors.index.json") == "hf"
    assert infer_format("x.pth") == infer_format("pytorch_model.bin") == "pt"
    assert infer_format("x.lamp") == "lamp" and infer_format("x.json") == "tensorlist"
    with open(tmp_path / "weights.dat", "wb") as f:
        np.savez(f, a=np.ones(2))  # sniffed as npz
    with open_source(tmp_path / "weights.dat") as s:
        assert s.format == "npz"
    tl.save(tmp_path / "a.tl", {"a": np.ones(2)})
    convert(tmp_path / "a.tl", tmp_path / "out.bin", dst_format="safetensors", progress=False)
    with open_source(tmp_path / "out.bin", "safetensors") as s:
        assert [e.name for e in s.entries] == ["a"]
    with pytest.raises(ValueError, match="unknown format 'zip'"):
        convert(tmp_path / "a.tl", tmp_path / "o", dst_format="zip")


def test_diff(tmp_path):
    a = {"w": np.array([1.0, 2.0], np.float32), "b": np.zeros(2), "only_a": np.ones(1)}
    b = {"w": np.array([1.0, 2.5], np.float32), "b": np.zeros(3), "only_b": np.ones(1)}
    tl.save(tmp_path / "a.tl", a)
    tl.save(tmp_path / "b.tl", b)
    r = diff(tmp_path / "a.tl", tmp_path / "b.tl")
    assert not r.identical
    assert r.only_a == ["only_a"] and r.only_b == ["only_b"]
    assert r.shape == {"b": ((2,), (3,))} and r.values == {"w": 0.5}
    assert diff(tmp_path / "a.tl", tmp_path / "a.tl").identical
    c = dict(a, w=np.array([1.0, 2.0 + 1e-6], np.float32))
    tl.save(tmp_path / "c.tl", c)
    assert not diff(tmp_path / "a.tl", tmp_path / "c.tl").identical
    assert diff(tmp_path / "a.tl", tmp_path / "c.tl", atol=1e-5).identical


def test_streams_tensor_by_tensor(tmp_path):
    """Only one tensor is materialised at a time: the writer gets views of the mapped source."""
    want = {f"t{i}": np.full(1 << 16, i, np.float32) for i in range(8)}
    tl.save(tmp_path / "s.tl", want)
    convert(tmp_path / "s.tl", tmp_path / "s.safetensors", progress=False)
    with open_source(tmp_path / "s.safetensors") as s:
        arrays = [e.array() for e in s.entries]
        assert all(not a.flags.owndata for a in arrays)  # views of the mapping, no copies
        assert s.nbytes == 8 * (1 << 18)
        del arrays


def test_readme_converting_example_runs(tmp_path, monkeypatch):
    import pathlib
    import re

    pytest.importorskip("fsspec")
    readme = (pathlib.Path(ROOT) / "README.md").read_text()
    section = readme.split("## Converting and remote storage", 1)[1]
    code = re.findall(r"```python\n(.*?)```", section, flags=re.S)[0]
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["w"].shape == (4, 4)


def test_pointer_selects_an_embedded_list(tmp_path):
    tl.save_document(tmp_path / "ckpt.json", {"model": tl.Tensors({"w": np.ones(2)}),
                                              "optimizer": tl.Tensors({"m": np.zeros(3)})})
    with pytest.raises(tl.FormatError, match="pass pointer="):
        convert(tmp_path / "ckpt.json", tmp_path / "x.safetensors", progress=False)
    convert(tmp_path / "ckpt.json", tmp_path / "opt.safetensors", pointer="/optimizer", progress=False)
    with open_source(tmp_path / "opt.safetensors") as s:
        assert [e.name for e in s.entries] == ["m"]


@needs_torch
def test_pt_destination_stores_each_tensor_once(tmp_path):
    tl.save(tmp_path / "v.tl", {f"t{i}": np.full(1 << 16, i, np.float32) for i in range(8)})
    convert(tmp_path / "v.tl", tmp_path / "v.pt", progress=False)
    assert (tmp_path / "v.pt").stat().st_size < 8 * (1 << 18) + 64 * 1024  # views, not the whole mapping each
    state = torch.load(tmp_path / "v.pt", weights_only=True)
    assert [int(v[0]) for v in state.values()] == list(range(8))

"""Bit-exact with the peers' own material: files made by safetensors, huggingface_hub, torch and numpy
themselves, and their own test cases (safetensors' tensor.rs tests, lamp's Reader checks), through
tensorlist and back.

Each test names the peer behaviour it holds us to; the hand-made bad files are built as safetensors'
tests build them (an 8-byte length, a JSON header, bytes).
"""
import json
import os
import struct
import subprocess
import sys
import warnings

import ml_dtypes
import numpy as np
import pytest

import tensorlist as tl
from tensorlist.cli import main as cli
from tensorlist.convert import MetadataDroppedWarning, convert, open_source

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")


def _st_bytes(header: dict, data: bytes = b"", *, pad: int = 8, raw_header: bytes = None) -> bytes:
    """A safetensors file by hand: u64 header length, the header (padded with spaces), the data."""
    text = raw_header if raw_header is not None else json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % pad)
    return struct.pack("<Q", len(text)) + text + data


def _st_header(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return n, json.loads(b[8:8 + n]), b


def _numpy_of(state):
    from tensorlist.torch import to_numpy

    return {k: to_numpy(v) for k, v in state.items()}


def _same_bits(got: dict, want: dict):
    assert sorted(got) == sorted(want)
    for k, w in want.items():
        assert got[k].dtype == w.dtype and got[k].shape == w.shape and got[k].tobytes() == w.tobytes(), k


# --- 1. a tensor named __metadata__ -------------------------------------------------------------

@pytest.mark.parametrize("dst", ["m.safetensors", "model.safetensors.index.json"])
def test_a_tensor_named___metadata___is_refused_in_safetensors_output(tmp_path, dst):
    tl.save(tmp_path / "m.tl", {"w": np.ones(2, np.float32), "__metadata__": np.zeros(3, np.float32)})
    (tmp_path / "out").mkdir()
    with pytest.raises(ValueError, match=r"tensor name '__metadata__' is reserved in safetensors") as e:
        convert(tmp_path / "m.tl", tmp_path / "out" / dst, progress=False)
    assert "\n" not in str(e.value)
    assert os.listdir(tmp_path / "out") == []


# --- 2. Hugging Face sharded index metadata -------------------------------------------------------

def _tied_state():
    torch.manual_seed(0)
    emb = torch.randn(64, 16)
    return {"embed.weight": emb, "lm_head.weight": emb, "l1.weight": torch.randn(64, 64),
            "l1.bias": torch.randn(64), "l2.weight": torch.randn(64, 64, dtype=torch.bfloat16),
            "big": torch.randn(80, 80)}  # 25.6 kB: a shard of its own, put before the one being filled


def test_hf_index_to_tl_to_index_keeps_metadata_and_tied_weights_key_for_key(tmp_path):
    from huggingface_hub import save_torch_state_dict

    (tmp_path / "hf").mkdir()
    save_torch_state_dict(_tied_state(), tmp_path / "hf", metadata={"run": "x"}, max_shard_size=20000)
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    assert set(index["metadata"]) == {"total_size", "run", "lm_head.weight"}  # what the peer writes
    convert(tmp_path / "hf" / "model.safetensors.index.json", tmp_path / "m.tl", progress=False)
    assert tl.open(tmp_path / "m.tl").metadata == {"run": "x", "lm_head.weight": "embed.weight"}
    (tmp_path / "back").mkdir()
    convert(tmp_path / "m.tl", tmp_path / "back" / "model.safetensors.index.json", shard_bytes=20000,
            progress=False)
    again = json.loads((tmp_path / "back" / "model.safetensors.index.json").read_text())
    assert again["metadata"] == index["metadata"]
    assert list(again["metadata"].items()) == list(index["metadata"].items())  # total_size first, as HF
    assert again["weight_map"] == index["weight_map"]
    # the same split and the same bytes, file for file
    assert sorted(os.listdir(tmp_path / "back")) == sorted(os.listdir(tmp_path / "hf"))
    for name in os.listdir(tmp_path / "hf"):
        assert (tmp_path / "back" / name).read_bytes() == (tmp_path / "hf" / name).read_bytes(), name


def test_hf_loader_loads_what_convert_writes_tied_weights_included(tmp_path):
    from huggingface_hub import load_torch_model, save_torch_state_dict

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(64, 16)
            self.lm_head = torch.nn.Linear(16, 64)
            self.lm_head.weight = self.embed.weight
            self.out = torch.nn.Linear(64, 8)

    net = Net()
    (tmp_path / "hf").mkdir()
    save_torch_state_dict(net.state_dict(), tmp_path / "hf", metadata={"run": "x"}, max_shard_size=2000)
    convert(tmp_path / "hf" / "model.safetensors.index.json", tmp_path / "m.tl", progress=False)
    (tmp_path / "back").mkdir()
    convert(tmp_path / "m.tl", tmp_path / "back" / "model.safetensors.index.json", shard_bytes=2000,
            progress=False)
    assert sorted(os.listdir(tmp_path / "back")) == sorted(os.listdir(tmp_path / "hf"))  # shards and the index
    fresh = Net()
    load_torch_model(fresh, tmp_path / "back", strict=False)
    for k, v in net.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k


def test_hf_single_file_with_metadata_round_trips_byte_for_byte(tmp_path):
    from huggingface_hub import save_torch_state_dict

    (tmp_path / "hf").mkdir()
    save_torch_state_dict(_tied_state(), tmp_path / "hf", metadata={"run": "x"})  # one file, no index
    src = tmp_path / "hf" / "model.safetensors"
    convert(src, tmp_path / "m.tl", progress=False)
    convert(tmp_path / "m.tl", tmp_path / "back.safetensors", progress=False)
    assert (tmp_path / "back.safetensors").read_bytes() == src.read_bytes()


def test_index_metadata_that_is_not_an_object_is_kept_under_tensorlist_metadata(tmp_path):
    tl.save(tmp_path / "m.tl", {"w": np.ones(2, np.float32)}, metadata=[1, {"a": None}])
    (tmp_path / "hf").mkdir()
    convert(tmp_path / "m.tl", tmp_path / "hf" / "model.safetensors.index.json", progress=False)
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    assert index["metadata"] == {"total_size": 8, "tensorlist_metadata": [1, {"a": None}]}
    convert(tmp_path / "hf" / "model.safetensors.index.json", tmp_path / "back.tl", progress=False)
    assert tl.open(tmp_path / "back.tl").metadata == [1, {"a": None}]


# --- 3. torch tensors that have no plain bytes, or lazy bits, at every entry point ------------------

def _views():
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    return {"conj": z.conj(), "neg": torch._neg_view(torch.arange(3.0)), "negc": torch._neg_view(z)}


_VIEW_VALUES = {"conj": [1 - 2j, 3 + 4j], "neg": [-0.0, -1.0, -2.0], "negc": [-1 - 2j, -3 + 4j]}


def _save_with(how, path, state):
    if how == "save":
        tl.save(path, state)
    elif how == "module_state":
        from tensorlist.torch import save_module_state

        save_module_state(path, state)
    elif how == "optimizer_state":
        from tensorlist.torch import save_optimizer_state

        save_optimizer_state(path, {"state": {0: state}, "param_groups": [{"lr": 0.1, "params": [0]}]})
    else:  # convert from a torch file
        torch.save(state, path.with_suffix(".pt"))
        convert(path.with_suffix(".pt"), path, progress=False)


ENTRY_POINTS = ["save", "module_state", "optimizer_state", "convert"]


@pytest.mark.parametrize("how", ENTRY_POINTS)
def test_conj_and_neg_views_save_their_values_everywhere(tmp_path, how):
    _save_with(how, tmp_path / "v.tl", _views())
    got = tl.load(tmp_path / "v.tl")
    for k, want in _VIEW_VALUES.items():
        key = k if k in got else f"state.0.{k}"
        assert got[key].tolist() == want, k


_NO_BYTES = {
    "coo": (lambda: torch.tensor([[0.0, 1.0], [2.0, 0.0]]).to_sparse(), r"sparse tensor \(torch\.sparse_coo\)"),
    "csr": (lambda: torch.tensor([[0.0, 1.0], [2.0, 0.0]]).to_sparse_csr(), r"sparse tensor \(torch\.sparse_csr\)"),
    "meta": (lambda: torch.empty(3, device="meta"), "meta device"),
    "quantized": (lambda: torch.quantize_per_tensor(torch.tensor([1.0, 2.0]), 0.1, 0, torch.quint8),
                  r"quantized tensor \(torch\.quint8\)"),
}


@pytest.mark.parametrize("kind", list(_NO_BYTES))
@pytest.mark.parametrize("how", ENTRY_POINTS)
def test_sparse_meta_and_quantized_are_refused_naming_the_tensor_everywhere(tmp_path, how, kind):
    make, why = _NO_BYTES[kind]
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises((TypeError, tl.FormatError), match=r"bad'.*" + why) as e:
        _save_with(how, out / "v.tl", {"ok": torch.ones(2), "bad": make()})
    assert "\n" not in str(e.value)
    if how == "convert":
        assert isinstance(e.value, tl.FormatError) and e.value.tensor_name == "bad" and "v.pt" in str(e.value)
    assert not (out / "v.tl").exists()


# --- 4. lamp mode and complex128 -------------------------------------------------------------

@pytest.mark.parametrize("how", ["save", "writer", "convert"])
def test_lamp_mode_refuses_a_complex128_lamp_would_misalign(tmp_path, how):
    arrays = [np.zeros(2, np.float32), np.zeros(2, np.complex128)]  # lamp: 8 / 40, not a multiple of 16
    (tmp_path / "x.lamp").write_text("old")
    with pytest.raises(ValueError, match=r"lamp=True: tensor 1 \(complex128\) would start at byte 8.*"
                                         r"not a multiple of its item size 16"):
        if how == "save":
            tl.save(tmp_path / "x.lamp", arrays, lamp=True)
        elif how == "writer":
            with tl.Writer(tmp_path / "x.lamp", lamp=True) as w:
                for a in arrays:
                    w.add(a)
        else:
            tl.save(tmp_path / "p.tl", arrays)
            convert(tmp_path / "p.tl", tmp_path / "x.lamp", progress=False)
    assert (tmp_path / "x.lamp").read_text() == "old"
    assert not (tmp_path / "x.lamp.data").exists()


@pytest.mark.parametrize("how", ["save", "writer"])
def test_lamp_mode_writes_a_complex128_where_lamp_puts_it(tmp_path, how):
    arrays = [np.arange(4, dtype=np.float32), np.array([1 + 2j, 3 - 4j]), np.ones(1, np.float32),
              np.ones(2, np.float32), np.array([5j])]
    if how == "save":
        tl.save(tmp_path / "x.lamp", arrays, lamp=True)
    else:
        with tl.Writer(tmp_path / "x.lamp", lamp=True) as w:
            for a in arrays:
                w.add(a)
    desc = json.loads((tmp_path / "x.lamp").read_text())
    # lamp's running sum of 8-padded lengths, each a multiple of the item size: lamp's exact bytes
    assert [t["byteOffset"] for t in desc["tensors"]] == [0, 16, 48, 56, 64] and desc["byteLength"] == 80
    want = b"".join(a.tobytes() + b"\0" * (-a.nbytes % 8) for a in arrays)
    assert (tmp_path / "x.lamp.data").read_bytes() == want
    for got, a in zip(_lamp_reads(tmp_path / "x.lamp"), arrays):
        assert got.tobytes() == a.tobytes()


def _lamp_reads(desc_path):
    """lamp's Reader.readTensorData checks (lamp.md section 3.2), in its order; returns the tensors."""
    desc = json.loads(open(desc_path, encoding="utf-8").read())
    lamp_types = {0: "u1", 1: "i1", 2: "<i2", 3: "<i4", 4: "<i8", 5: "<f2", 6: "<f4", 7: "<f8", 9: "<c8",
                  10: "<c16", 11: "?", 15: ml_dtypes.bfloat16}
    tensors = desc.get("tensors", [])
    offset, length = desc["byteOffset"], desc["byteLength"]
    assert all(t["byteOffset"] + t["byteLength"] <= length for t in tensors)  # TensorList's own assert
    if not tensors:
        return []
    assert offset % 4096 == 0 and all(t["byteOffset"] % 8 == 0 for t in tensors)
    if length == 0:
        assert all(t["dataType"] in (1, 4, 6, 7, 15) for t in tensors), "lamp: MatchError"
        return [np.zeros(t.get("dims", []), lamp_types[t["dataType"]]) for t in tensors]
    path = os.path.join(os.path.dirname(desc_path), desc["location"])
    assert length <= os.path.getsize(path) - offset, "trying to mmap more than file size"
    data = open(path, "rb").read()[offset:offset + length]
    out = []
    for t in tensors:
        dt = np.dtype(lamp_types[t["dataType"]])
        assert t["byteLength"] % dt.itemsize == 0
        assert t["byteOffset"] < length, "Out of bounds."
        assert t["byteOffset"] % dt.itemsize == 0
        raw = data[t["byteOffset"]:t["byteOffset"] + t["byteLength"]]
        out.append(np.frombuffer(raw, dt).reshape(t.get("dims", [])))
    return out


# --- 9. lamp reads what tensorlist writes by default, trailing empty tensors included --------------

_TRAILING = [np.zeros((0, 3), np.float32), np.arange(3, dtype=np.float32), np.zeros(0, np.int64),
             np.zeros((2, 0), np.complex128)]


@pytest.mark.parametrize("how", ["save", "save-named", "writer", "writer-reserve", "write_data", "save_document",
                                 "convert"])
def test_lamp_reads_a_default_file_whose_last_tensors_are_empty(tmp_path, how):
    path = tmp_path / "t.tl"
    named = {str(i): a for i, a in enumerate(_TRAILING)}
    if how == "save":
        tl.save(path, _TRAILING)
    elif how == "save-named":
        tl.save(path, named)
    elif how in ("writer", "writer-reserve"):
        with tl.Writer(path) as w:
            for a in _TRAILING:
                if how == "writer" or a.size:
                    w.add(a)
                else:
                    w.reserve(a.shape, a.dtype)
    elif how == "write_data":
        [desc] = tl.write_data(tmp_path / "t.data", [_TRAILING])
        path.write_text(json.dumps(desc))
    elif how == "save_document":
        doc = tl.save_document(tmp_path / "doc.json", {"model": tl.Tensors(_TRAILING)})
        path.write_text(json.dumps(doc["model"]))
    else:
        torch.save({k: torch.from_numpy(a) for k, a in named.items()}, tmp_path / "p.pt")
        convert(tmp_path / "p.pt", path, progress=False)
    desc = json.loads(path.read_text())
    assert desc["byteLength"] > 0
    assert all(t["byteOffset"] < desc["byteLength"] for t in desc["tensors"])
    got = _lamp_reads(path)
    by_shape = sorted((a.shape, a.tobytes()) for a in got)
    assert by_shape == sorted((a.shape, a.tobytes()) for a in _TRAILING)
    # and tensorlist reads it as before
    loaded = tl.load(path)
    assert sorted((a.shape, a.tobytes()) for a in loaded.values()) == by_shape


def test_lamp_mode_keeps_lamp_s_own_trailing_offset(tmp_path):
    tl.save(tmp_path / "x.lamp", [np.ones(2, np.float32), np.zeros(0, np.float32)], lamp=True)
    desc = json.loads((tmp_path / "x.lamp").read_text())
    assert desc["tensors"][1]["byteOffset"] == 8 == desc["byteLength"]  # lamp's bytes, lamp's own bug


# --- 5. every dtype both sides have, both ways; clean refusals for the rest -------------------------

BOTH = ["bool", "uint8", "int8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "bfloat16",
        "float32", "float64", "complex64", "float8_e5m2", "float8_e4m3fn", "float8_e8m0fnu", "float8_e4m3fnuz",
        "float8_e5m2fnuz"]


def _bits(dtype_name, n=6):
    """A tensor of ``dtype_name`` with arbitrary bits (NaN payloads and all), made from raw bytes."""
    dt = getattr(torch, dtype_name)
    size = torch.empty(0, dtype=dt).element_size()
    raw = torch.from_numpy(np.random.default_rng(1).integers(0, 256, n * size, dtype=np.uint8))
    if dtype_name == "bool":
        return raw.view(torch.bool) & True if False else (raw % 2).to(torch.bool)
    return raw.view(dt)


@pytest.mark.parametrize("dtype_name", BOTH)
def test_every_shared_dtype_converts_both_ways_bit_for_bit(tmp_path, dtype_name):
    from safetensors import safe_open

    t = _bits(dtype_name)
    try:
        safetensors_torch.save_file({"t": t}, str(tmp_path / "lib.safetensors"))
    except KeyError:  # the peer's own limit: safetensors 0.7 (the newest for Python 3.9) has no float8 fnuz
        pytest.skip(f"this safetensors cannot write {dtype_name} itself")
    convert(tmp_path / "lib.safetensors", tmp_path / "m.tl", progress=False)
    got = tl.load(tmp_path / "m.tl")["t"]
    assert got.dtype == _numpy_of({"t": t})["t"].dtype and got.tobytes() == _numpy_of({"t": t})["t"].tobytes()
    convert(tmp_path / "m.tl", tmp_path / "back.safetensors", progress=False)
    with safe_open(str(tmp_path / "back.safetensors"), "pt") as f:
        back = f.get_tensor("t")
    assert back.dtype == t.dtype and back.view(torch.uint8).equal(t.view(torch.uint8))


def test_complex128_is_refused_by_safetensors_output_in_one_line(tmp_path):
    tl.save(tmp_path / "c.tl", {"z": np.array([1 + 2j])})
    (tmp_path / "out").mkdir()
    for dst in ("c.safetensors", "model.safetensors.index.json"):
        with pytest.raises(TypeError, match=r"tensor 'z': safetensors has no complex128 dtype"):
            convert(tmp_path / "c.tl", tmp_path / "out" / dst, progress=False)
    assert os.listdir(tmp_path / "out") == []


@pytest.mark.parametrize("st_dtype", ["F6_E2M3", "F6_E3M2"])
def test_6_bit_safetensors_dtypes_are_refused_by_name(tmp_path, st_dtype):
    (tmp_path / "s.safetensors").write_bytes(
        _st_bytes({"w": {"dtype": st_dtype, "shape": [4], "data_offsets": [0, 3]}}, b"\0" * 3))
    with pytest.raises(tl.FormatError, match=rf"s.safetensors: tensor 0 \('w'\): field 'dtype': safetensors dtype "
                                             rf"{st_dtype} \(.*\) has no tensorlist dataType"):
        convert(tmp_path / "s.safetensors", tmp_path / "s.tl", progress=False)


def test_f4_written_by_the_peer_converts_both_ways_bit_exactly(tmp_path):
    g = torch.Generator().manual_seed(3)
    w = torch.randint(0, 256, (3, 4), dtype=torch.uint8, generator=g).view(torch.float4_e2m1fn_x2)
    safetensors_torch.save_file({"w": w}, str(tmp_path / "s.safetensors"))
    assert _st_header(tmp_path / "s.safetensors")[1]["w"]["shape"] == [3, 8]  # the peer counts values
    convert(tmp_path / "s.safetensors", tmp_path / "s.tl", progress=False)
    convert(tmp_path / "s.tl", tmp_path / "b.safetensors", progress=False)
    back = safetensors_torch.load_file(str(tmp_path / "b.safetensors"))["w"]
    assert back.dtype == w.dtype and back.shape == w.shape and torch.equal(back.view(torch.uint8), w.view(torch.uint8))


# --- 6. safetensors output others can map zero-copy, and load --------------------------------------

def test_safetensors_output_is_what_safetensors_writes_aligned_for_zero_copy(tmp_path):
    state = {"z": torch.ones(3, dtype=torch.float16), "a": torch.arange(1, dtype=torch.float64),
             "m": torch.arange(5, dtype=torch.uint8), "c": torch.tensor([1 + 1j]), "b": torch.tensor([True]),
             "q": torch.ones(3, dtype=torch.bfloat16), "i": torch.arange(3, dtype=torch.int32)}
    tl.save(tmp_path / "o.tl", _numpy_of(state))  # tensorlist order: not safetensors'
    convert(tmp_path / "o.tl", tmp_path / "o.safetensors", progress=False)
    n, header, raw = _st_header(tmp_path / "o.safetensors")
    assert (8 + n) % 8 == 0 and header["__metadata__"] == {"format": "pt"}
    for name, t in header.items():
        if name != "__metadata__":
            itemsize = state[name].element_size()
            assert (8 + n + t["data_offsets"][0]) % itemsize == 0, name  # aligned in the file
    # the peer's own layout, data and header for the same tensors and metadata; only the header's key order
    # differs: it is the list's, so the list converted back keeps its order (and its weights hash)
    stock = safetensors_torch.save(state, metadata={"format": "pt"})
    m = struct.unpack("<Q", stock[:8])[0]
    assert m == n and raw[8 + n:] == stock[8 + m:] and header == json.loads(stock[8:8 + m])
    assert list(header)[1:] == list(state) != list(json.loads(stock[8:8 + m]))[1:]


def test_loaders_of_the_ecosystem_accept_a_single_file_written_from_tl(tmp_path):
    from huggingface_hub import load_torch_model
    from safetensors import safe_open

    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    for meta in (None, {"run": "x"}, {"epoch": 3}):  # none, strings, any JSON
        tl.save(tmp_path / "m.tl", _numpy_of(net.state_dict()), metadata=meta)
        (tmp_path / "hf").mkdir(exist_ok=True)
        convert(tmp_path / "m.tl", tmp_path / "hf" / "model.safetensors", progress=False)
        with safe_open(str(tmp_path / "hf" / "model.safetensors"), "pt") as f:
            assert f.metadata()["format"] == "pt"
        fresh = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        load_torch_model(fresh, tmp_path / "hf", strict=True)
        got = safetensors_torch.load_file(str(tmp_path / "hf" / "model.safetensors"))
        for k, v in net.state_dict().items():
            assert torch.equal(fresh.state_dict()[k], v) and torch.equal(got[k], v)
        convert(tmp_path / "hf" / "model.safetensors", tmp_path / "back.tl", progress=False)
        assert tl.open(tmp_path / "back.tl").metadata == meta  # "format": "pt" is not added to it


def test_safetensors_made_by_the_library_round_trips_byte_for_byte(tmp_path):
    state = {"w": torch.randn(3, 4), "b": torch.randn(4, dtype=torch.bfloat16), "n": torch.tensor(7),
             "e": torch.zeros(0, 5, dtype=torch.float16)}
    safetensors_torch.save_file(state, str(tmp_path / "a.safetensors"), metadata={"format": "pt"})
    convert(tmp_path / "a.safetensors", tmp_path / "a.tl", progress=False)
    convert(tmp_path / "a.tl", tmp_path / "b.safetensors", progress=False)
    assert (tmp_path / "b.safetensors").read_bytes() == (tmp_path / "a.safetensors").read_bytes()


# --- 7. safetensors input as strict as safetensors --------------------------------------------------

_F32 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


def _bad_files():
    """(case, bytes) as safetensors' tensor.rs tests build them; each one safetensors itself rejects."""
    two = {"a": dict(_F32), "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}
    return {
        # test_metadata_incomplete_buffer: polyglot bytes after the last tensor
        "trailing-bytes": _st_bytes(two, b"\0" * 16 + b"extra_bogus_data_for_polyglot_file"),
        "truncated": _st_bytes(two, b"\0" * 12),
        "gap": _st_bytes({"a": dict(_F32), "b": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]}},
                         b"\0" * 24),
        "leading-hole": _st_bytes({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, b"\0" * 16),
        "overlap": _st_bytes({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                              "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, b"\0" * 16),
        "same-range": _st_bytes({"a": dict(_F32), "b": dict(_F32)}, b"\0" * 8),
        "end-before-begin": _st_bytes({"a": {"dtype": "F32", "shape": [0], "data_offsets": [8, 0]},
                                       "b": dict(_F32)}, b"\0" * 8),
        # test_invalid_info: data_offsets do not match shape x dtype
        "invalid-info": _st_bytes({"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 8]}}, b"\0" * 8),
        # test_validation_overflow
        "overflow": _st_bytes({"a": {"dtype": "F32", "shape": [2 ** 62, 2 ** 62], "data_offsets": [0, 8]}},
                              b"\0" * 8),
        # test_header_too_small / test_invalid_header_length / test_header_too_large
        "too-small": b"\x05\0\0\0",
        "length-past-end": struct.pack("<Q", 1000) + b"{}",
        "header-too-large": struct.pack("<Q", 100_000_001) + b"{" + b" " * 64,
        # test_invalid_header_non_utf8 / test_invalid_header_not_json
        "not-utf8": _st_bytes(None, raw_header=b'{"a":"\xff"}'),
        "not-json": _st_bytes(None, raw_header=b'{"a":'),
        "nul-padding": struct.pack("<Q", 8) + b"{}\0\0\0\0\0\0",
        "array-header": _st_bytes(None, raw_header=b"[]"),
        "metadata-not-strings": _st_bytes({"__metadata__": {"a": 1}}),
        "unknown-dtype": _st_bytes({"a": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}}, b"\0" * 16),
        "negative-offset": _st_bytes({"a": {"dtype": "U8", "shape": [0], "data_offsets": [-1, -1]}}),
        "float-shape": _st_bytes({"a": {"dtype": "U8", "shape": [1.0], "data_offsets": [0, 1]}}, b"\0"),
        "three-offsets": _st_bytes({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1, 1]}}, b"\0"),
        "missing-shape": _st_bytes({"a": {"dtype": "U8", "data_offsets": [0, 1]}}, b"\0"),
        # serde_json's limits hold in keys safetensors otherwise ignores
        "deep-extra-key": _st_bytes(None, b"\0", raw_header=b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],'
                                                        b'"x":' + b"[" * 126 + b"]" * 126 + b"}}"),
        "lone-surrogate-name": _st_bytes(None, b"\0", raw_header=b'{"\\ud800":{"dtype":"U8","shape":[1],'
                                                             b'"data_offsets":[0,1]}}'),
        "bom": _st_bytes(None, b"\0", raw_header=b'\xef\xbb\xbf{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'),
        "duplicate-metadata": _st_bytes(None, raw_header=b'{"__metadata__":{},"__metadata__":{}}'),
    }


@pytest.mark.parametrize("case", list(_bad_files()))
def test_what_safetensors_rejects_convert_and_inspect_reject_in_one_line(tmp_path, case, capsys):
    from safetensors import safe_open

    path = tmp_path / f"{case}.safetensors"
    path.write_bytes(_bad_files()[case])
    with pytest.raises(Exception):  # the peer itself refuses the file
        with safe_open(str(path), "np") as f:
            [f.get_tensor(k) for k in f.keys()]
    (tmp_path / "out").mkdir()
    with pytest.raises(tl.FormatError) as e:
        convert(path, tmp_path / "out" / "m.tl", progress=False)
    assert str(path) in str(e.value) and "\n" not in str(e.value)
    assert os.listdir(tmp_path / "out") == []
    assert cli(["inspect", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tensorlist inspect: error: ") and err.count("\n") == 1 and str(path) in err


@pytest.mark.parametrize("case", ["gap", "overlap", "invalid-info", "trailing-bytes"])
def test_rejections_name_the_tensor_or_the_tail(tmp_path, case):
    path = tmp_path / "s.safetensors"
    path.write_bytes(_bad_files()[case])
    with pytest.raises(tl.FormatError) as e:
        open_source(path)
    if case == "trailing-bytes":
        assert "34 bytes after the last tensor" in str(e.value)
    else:
        assert e.value.tensor_name in ("a", "b") and e.value.field == "data_offsets"


def _good_files():
    """What safetensors accepts, and so must we."""
    return {
        "whitespace-padded": _st_bytes({"a": dict(_F32)}, b"\0" * 8, pad=64),
        "leading-whitespace": struct.pack("<Q", 16) + b"   {}           ",
        "empty": _st_bytes({}),
        "zero-sized-at-the-end": _st_bytes({"a": dict(_F32), "z": {"dtype": "F32", "shape": [0, 4],
                                                                   "data_offsets": [8, 8]}}, b"\0" * 8),
        "name-order-not-offset-order": _st_bytes({"b": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]},
                                                  "a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}},
                                                 b"\1\2"),
        "extra-key-in-a-tensor": _st_bytes({"a": dict(_F32, x=1)}, b"\0" * 8),
        "metadata-null": _st_bytes({"__metadata__": None, "a": dict(_F32)}, b"\0" * 8),
        "deep-extra-key-at-the-limit": _st_bytes(None, b"\0", raw_header=b'{"a":{"dtype":"U8","shape":[1],'
                                                                     b'"data_offsets":[0,1],"x":'
                                                                     + b"[" * 125 + b"]" * 125 + b"}}"),
    }


@pytest.mark.parametrize("case", list(_good_files()))
def test_what_safetensors_accepts_converts(tmp_path, case):
    from safetensors.numpy import load_file

    path = tmp_path / f"{case}.safetensors"
    path.write_bytes(_good_files()[case])
    want = load_file(str(path))
    convert(path, tmp_path / "m.tl", progress=False)
    _same_bits(tl.load(tmp_path / "m.tl"), want)


# --- 8. metadata a destination cannot hold is dropped out loud ----------------------------------------

@pytest.mark.parametrize("dst", ["m.pt", "m.npy", "m.lamp"])
def test_dropped_metadata_is_a_warning(tmp_path, dst):
    tl.save(tmp_path / "m.tl", [np.ones(2, np.float32)], metadata={"epoch": 3})
    with pytest.warns(MetadataDroppedWarning, match=r"m.tl: its metadata \(\{'epoch': 3\}\) is not written"):
        convert(tmp_path / "m.tl", tmp_path / dst, progress=False)
    run = subprocess.run([sys.executable, "-m", "tensorlist", "convert", "--no-progress", str(tmp_path / "m.tl"),
                          str(tmp_path / ("again-" + dst))], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "its metadata ({'epoch': 3}) is not written" in run.stderr
    tl.save(tmp_path / "plain.tl", [np.ones(2, np.float32)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        convert(tmp_path / "plain.tl", tmp_path / ("plain-" + dst), progress=False)


@pytest.mark.parametrize("dst", ["m.safetensors", "model.safetensors.index.json", "m.npz", "m.tl"])
def test_metadata_is_carried_where_the_destination_can_hold_it(tmp_path, dst):
    meta = {"epoch": 3, "note": ["any", "json"]}
    tl.save(tmp_path / "m.tl", {"w": np.ones(2, np.float32)}, metadata=meta)
    (tmp_path / "out").mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("error", MetadataDroppedWarning)
        convert(tmp_path / "m.tl", tmp_path / "out" / dst, progress=False)
    convert(tmp_path / "out" / dst, tmp_path / "back.tl", progress=False)
    assert tl.open(tmp_path / "back.tl").metadata == meta


# --- 10. a huge dimension of an empty tensor names the file, the tensor and the field -----------------

def _npy_with_shape(path, shape, descr="<i2"):
    header = repr({"descr": descr, "fortran_order": False, "shape": shape}).encode("latin1")
    header += b" " * (-(len(header) + 11) % 64) + b"\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header)


@pytest.mark.parametrize("fmt", ["safetensors", "npy", "npz", "pt"])
@pytest.mark.parametrize("shape", [(0, 2 ** 62), (0,) + (1,) * 64])
def test_an_impossible_shape_is_a_format_error_naming_file_tensor_and_field(tmp_path, fmt, shape):
    path = tmp_path / f"s.{fmt}"
    if fmt == "safetensors":
        path.write_bytes(_st_bytes({"t": {"dtype": "I16", "shape": list(shape), "data_offsets": [0, 0]}}))
    elif fmt == "npy":
        _npy_with_shape(path, shape)
    elif fmt == "npz":
        import zipfile

        _npy_with_shape(tmp_path / "t.npy", shape)
        with zipfile.ZipFile(path, "w") as z:
            z.write(tmp_path / "t.npy", "t.npy")
    else:
        torch.save({"t": torch.empty(shape, dtype=torch.int16)}, path)
    with pytest.raises(tl.FormatError) as e:
        convert(path, tmp_path / "out.tl", progress=False)
    name = "0" if fmt == "npy" else "t"
    assert e.value.file == str(path) and e.value.tensor_name == name and e.value.field == "shape"
    assert ("65 dims" in str(e.value)) == (len(shape) == 65) and "\n" not in str(e.value)
    assert not (tmp_path / "out.tl").exists()


def test_a_safetensors_header_with_leading_spaces_is_sniffed_as_safetensors(tmp_path):
    (tmp_path / "weights.bin.x").write_bytes(_good_files()["whitespace-padded"])
    (tmp_path / "lead.x").write_bytes(_st_bytes(None, b"\0" * 8, raw_header=b"   " + json.dumps({"a": _F32}).encode()))
    for name in ("weights.bin.x", "lead.x"):
        with open_source(tmp_path / name) as s:
            assert s.format == "safetensors" and [e.name for e in s.entries] == ["a"]

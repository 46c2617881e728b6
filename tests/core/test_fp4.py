"""float4_e2m1fn_x2 (dataType 45, MXFP4/NVFP4 weights) and its block scale float8_e8m0fnu (44).

One element is one byte holding two 4-bit floats, the first in the low nibble (torch's and safetensors'
order); dims count bytes, as torch's shape does. numpy has no such type: it gets the packed bytes as a
*bit carrier* (uint8 whose ``dtype.metadata`` names the type), which ``tensorlist.save`` writes back as
dataType 45 with the same dims and bytes. safetensors' ``F4`` header counts values: its last dim is twice ours.
"""
import json
import struct

import numpy as np
import pytest

import tensorlist as tl
from tensorlist._base import dtypes
from tensorlist.convert import convert
from tensorlist.errors import FormatError, UnsupportedDTypeError

FP4 = dtypes.from_code(45)
#: the 16 codes of float4_e2m1fn (sign, 2 exponent bits, 1 mantissa bit), by code
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def packed(shape=(4, 8), seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, shape, dtype=np.uint8).view(FP4.numpy)


def unpack(a: np.ndarray) -> np.ndarray:
    """docs/FORMAT.md's recipe: packed pairs -> ml_dtypes' float4_e2m1fn values, twice as many along the last dim."""
    import ml_dtypes

    b = a.view(np.uint8)
    pairs = np.stack([b & 0x0F, b >> 4], axis=-1)  # the low nibble is the first value
    return pairs.reshape(*b.shape[:-1], -1).view(ml_dtypes.float4_e2m1fn)


def test_the_row():
    assert (FP4.name, FP4.itemsize, FP4.carried) == ("float4_e2m1fn_x2", 1, True)
    assert 45 not in dtypes.UNSUPPORTED_CODES and dtypes.from_numpy(np.dtype("u1")).name == "uint8"


@pytest.mark.parametrize("mmap", [True, "copy", False])
def test_numpy_loads_packed_bytes_that_save_back_identically(tmp_path, mmap):
    a = packed()
    tl.save(tmp_path / "a.tl", {"w": a, "e": a[:0], "s": np.array([127, 128], np.uint8).view(np.uint8)})
    got = tl.load(tmp_path / "a.tl", mmap=mmap)
    w = got["w"]
    assert w.dtype.metadata == {dtypes.BITS_KEY: "float4_e2m1fn_x2"} and w.shape == (4, 8)
    assert w.tobytes() == a.tobytes() and got["e"].shape == (0, 8) and got["s"].dtype == np.uint8
    tl.save(tmp_path / "b.tl", got)
    d1, d2 = (json.loads((tmp_path / f).read_text())["tensors"] for f in ("a.tl", "b.tl"))
    assert [(t["dataType"], t.get("dims")) for t in d1] == [(t["dataType"], t.get("dims")) for t in d2]
    assert d1[0]["dataType"] == 45 and d1[0]["crc32c"] == d2[0]["crc32c"]
    tl.validate(tmp_path / "b.tl")  # raises on a schema violation


def test_the_unpacking_recipe_gives_ml_dtypes_values():
    pytest.importorskip("ml_dtypes", reason="the recipe unpacks to ml_dtypes' float4_e2m1fn")
    a = np.array([[0x21, 0xF7]], np.uint8).view(FP4.numpy)  # codes 1, 2 | 7, 15
    v = unpack(a)
    assert v.shape == (1, 4) and v.astype(np.float32).tolist() == [[0.5, 1.0, 6.0, -6.0]]
    big = packed((3, 5, 6))
    b = big.view(np.uint8)
    want = np.array([[E2M1[c & 15], E2M1[c >> 4]] for c in b.reshape(-1)], np.float32).reshape(3, 5, 12)
    assert np.array_equal(unpack(big).astype(np.float32), want)


def test_a_carrier_of_fp4_is_never_taken_for_uint8(tmp_path):
    plain = np.arange(6, dtype=np.uint8)
    tl.save(tmp_path / "m.tl", {"p": plain, "f": plain.view(FP4.numpy), "q": plain})
    codes = [t["dataType"] for t in json.loads((tmp_path / "m.tl").read_text())["tensors"]]
    assert codes == [0, 45, 0]
    with pytest.raises(TypeError, match="float4_e2m1fn_x2 array has no DLPack type"):
        tl.to_dlpack(tl.load(tmp_path / "m.tl")["f"])


def st_file(path, tensors):
    """A safetensors file written by hand: name -> (dtype, shape, bytes)."""
    header, off, blob = {}, 0, b""
    for name, (dt, shape, raw) in tensors.items():
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blob += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + blob)


def test_convert_f4_keeps_the_bytes_and_counts_values_there(tmp_path):
    raw = packed((2, 3)).tobytes()
    st_file(tmp_path / "a.safetensors", {"w": ("F4", [2, 6], raw), "s": ("F8_E8M0", [2], b"\x7f\x80")})
    convert(tmp_path / "a.safetensors", tmp_path / "a.tl")
    with tl.open(tmp_path / "a.tl") as r:
        assert r.info("w").dtype.name == "float4_e2m1fn_x2" and list(r.info("w").shape) == [2, 3]
        assert r["w"].tobytes() == raw
    convert(tmp_path / "a.tl", tmp_path / "b.safetensors")
    data = (tmp_path / "b.safetensors").read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    head = json.loads(data[8:8 + n])
    assert head["w"]["dtype"] == "F4" and head["w"]["shape"] == [2, 6] and head["s"]["dtype"] == "F8_E8M0"
    b, e = head["w"]["data_offsets"]
    assert data[8 + n + b:8 + n + e] == raw


@pytest.mark.parametrize("dt,shape,why", [
    ("F4", [2, 5], "must end with a dim divisible by 2"),
    ("F4", [], "must end with a dim divisible by 2"),
    ("F6_E2M3", [4], "F6_E2M3 .a 6-bit float. has no tensorlist dataType"),
    ("F6_E3M2", [4], "F6_E3M2 .a 6-bit float. has no tensorlist dataType"),
])
def test_convert_refuses_what_it_cannot_pack_by_name(tmp_path, dt, shape, why):
    st_file(tmp_path / "a.safetensors", {"w": (dt, shape, b"\0\0\0")})
    with pytest.raises(FormatError, match=why) as e:
        convert(tmp_path / "a.safetensors", tmp_path / "a.tl")
    assert e.value.tensor_name == "w"
    assert not (tmp_path / "a.tl").exists()


def test_a_0d_fp4_tensor_has_no_safetensors_shape(tmp_path):
    tl.save(tmp_path / "a.tl", {"x": np.array(0x21, np.uint8).view(FP4.numpy)})
    with pytest.raises(ValueError, match="tensor 'x': a 0-d F4 tensor"):
        convert(tmp_path / "a.tl", tmp_path / "a.safetensors")


def test_convert_through_npz_keeps_fp4(tmp_path):
    a = packed()
    tl.save(tmp_path / "a.tl", {"w": a})
    convert(tmp_path / "a.tl", tmp_path / "a.npz")
    convert(tmp_path / "a.npz", tmp_path / "b.tl")
    w = tl.load(tmp_path / "b.tl")["w"]
    assert dtypes.from_numpy(w.dtype) is FP4 and w.tobytes() == a.tobytes()


@pytest.fixture
def fp4_file(tmp_path):
    tl.save(tmp_path / "f.tl", {"ok": np.ones(2, np.float32), "w": packed()})
    return tmp_path / "f.tl"


def test_mlx_refuses_fp4_by_name(fp4_file):
    tm = pytest.importorskip("tensorlist.mlx", reason="MLX is not installed")
    with pytest.raises(UnsupportedDTypeError, match=r"tensor 1 \('w'\) has dtype float4_e2m1fn_x2: MLX has no"):
        tm.load(fp4_file)


def test_tensorflow_refuses_fp4_by_name(fp4_file):
    pytest.importorskip("tensorflow", reason="TensorFlow is not installed")
    import tensorlist.tensorflow as ttf

    with pytest.raises(UnsupportedDTypeError, match=r"tensor 1 \('w'\) has dtype float4_e2m1fn_x2: TensorFlow"):
        ttf.load(fp4_file)


def test_jax_refuses_fp4_by_name(tmp_path):
    jnp = pytest.importorskip("jax.numpy", reason="JAX is not installed")
    import tensorlist.jax as tj

    path = tmp_path / "t.tl"
    tj.save(path, {"ok": jnp.ones(2), "w": jnp.zeros((4, 8), jnp.uint8)})
    doc = json.loads(path.read_text())
    doc["tensors"][1]["dataType"] = 45  # what a tree file holding an FP4 leaf says
    path.write_text(json.dumps(doc))
    with pytest.raises(TypeError, match="'w'.*jax has no float4_e2m1fn_x2 type"):
        tj.load(path)


@pytest.fixture
def torch():
    """torch, for the tests that take it (a module-level skip would skip the numpy tests above too)."""
    return pytest.importorskip("torch", reason="the torch rows need torch")


@pytest.mark.parametrize("mmap", [True, "copy", False])
def test_torch_round_trips_fp4_bit_exactly(tmp_path, mmap, torch):
    from tensorlist import torch as tt

    g = torch.Generator().manual_seed(1)
    w = torch.randint(0, 256, (4, 8), dtype=torch.uint8, generator=g).view(torch.float4_e2m1fn_x2)
    s = torch.randint(100, 140, (4, 1), dtype=torch.uint8, generator=g).view(torch.float8_e8m0fnu)
    sd = {"w": w, "s": s, "wt": w.t(), "e": w[:0]}
    tl.save(tmp_path / "m.tl", sd)
    back = tt.load_state(tmp_path / "m.tl", mmap=mmap)
    for k, v in sd.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape
        assert torch.equal(back[k].view(torch.uint8), v.view(torch.uint8).contiguous())  # torch 2.8: no fp4 copies
    assert json.loads((tmp_path / "m.tl").read_text())["tensors"][0]["dataType"] == 45


def test_torch_reads_what_numpy_wrote_and_safetensors_agrees(tmp_path, torch):
    st = pytest.importorskip("safetensors.torch", reason="safetensors is not installed")
    from tensorlist import torch as tt

    a = packed()
    tl.save(tmp_path / "n.tl", {"w": a})
    t = tt.load_state(tmp_path / "n.tl")["w"]
    assert t.dtype == torch.float4_e2m1fn_x2 and bytes(t.view(torch.uint8).numpy()) == a.tobytes()
    own = t.view(torch.uint8).clone().view(torch.float4_e2m1fn_x2)  # torch 2.8 cannot clone fp4 itself
    st.save_file({"w": own}, str(tmp_path / "p.safetensors"))  # safetensors writes F4, [4, 16]
    convert(tmp_path / "p.safetensors", tmp_path / "p.tl")
    assert tl.load(tmp_path / "p.tl")["w"].tobytes() == a.tobytes()
    convert(tmp_path / "p.tl", tmp_path / "q.safetensors")
    q = st.load_file(str(tmp_path / "q.safetensors"))["w"]
    assert q.dtype == torch.float4_e2m1fn_x2 and q.shape == (4, 8) and torch.equal(q.view(torch.uint8),
                                                                                   t.view(torch.uint8))

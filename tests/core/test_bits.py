"""Bit carriers: bfloat16/float8 moved as their bits (``DType.bits``), so torch paths never need ml_dtypes.

A carrier is a uint16/uint8 array whose ``dtype.metadata`` names the type it holds. It equals the plain
unsigned dtype under numpy's ``==`` and ``hash``, so every lookup keyed by dtype must tell them apart:
these tests mix carriers and plain unsigned arrays in one save, in both orders, repeatedly.
"""
import json

import numpy as np
import pytest

import tensorlist as tl
from tensorlist._base import dtypes
from tensorlist.provenance.record import weights_sha256

ML = [d for d in dtypes.DTYPES if d.ml_dtypes_since is not None]


def values(row, n=12):
    """Random bytes as ``row``'s carrier (no ml_dtypes needed: s390x has none)."""
    rng = np.random.default_rng(row.code)
    return rng.integers(0, 256, n * row.itemsize, dtype=np.uint8).view(row.bits).reshape(3, -1)


@pytest.mark.parametrize("row", ML, ids=lambda r: r.name)
@pytest.mark.parametrize("mmap", [True, "copy", False])
def test_a_file_loads_as_carriers_of_the_same_bytes(tmp_path, row, mmap):
    a = values(row)
    tl.save(tmp_path / "m.tl", {"x": a, "e": a[:0]})
    got = tl.load(tmp_path / "m.tl", mmap=mmap, bits=True)
    with tl.open(tmp_path / "m.tl", mmap=mmap, bits=True) as r:
        one = r["x"]
    for c in (got["x"], one):
        assert c.dtype.kind == "u" and c.dtype.itemsize == row.itemsize and c.shape == a.shape
        assert c.dtype.metadata == {dtypes.BITS_KEY: row.name}
        assert c.tobytes() == a.tobytes()
    assert got["e"].shape == (0, 4) and dtypes.from_numpy(got["e"].dtype) is row


@pytest.mark.parametrize("row", ML, ids=lambda r: r.name)
def test_carriers_save_as_their_type_beside_plain_unsigned_arrays(tmp_path, row):
    carrier = values(row)
    plain = carrier.view(np.dtype(f"<u{row.itemsize}"))
    for i, tensors in enumerate([{"c": carrier, "p": plain}, {"p": plain, "c": carrier}] * 2):
        path = tmp_path / f"{i}.tl"
        tl.save(path, tensors)
        codes = {t["name"]: t["dataType"] for t in json.loads(path.read_text())["tensors"]}
        assert codes == {"c": row.code, "p": dtypes.from_numpy(plain.dtype).code}
        back = tl.load(path, bits=True)
        assert back["c"].dtype.metadata == {dtypes.BITS_KEY: row.name} and back["c"].tobytes() == carrier.tobytes()
        assert back["p"].dtype == plain.dtype and back["p"].tobytes() == plain.tobytes()


def test_a_carrier_hashes_as_the_values_it_carries():
    pytest.importorskip("ml_dtypes", reason="the values it carries are ml_dtypes'")
    carrier = values(dtypes.from_name("bfloat16"))
    a = carrier.view(np.uint16).view(dtypes.from_name("bfloat16").numpy)
    assert weights_sha256({"w": carrier}) == weights_sha256({"w": a}) != weights_sha256({"w": a.view(np.uint16)})


def test_a_carrier_of_an_unknown_type_is_refused():
    for bad in ({dtypes.BITS_KEY: "bfloat17"}, {dtypes.BITS_KEY: ["bfloat16"]}):
        with pytest.raises(TypeError, match="unknown tensorlist dtype"):
            dtypes.from_numpy(np.dtype("<u2", metadata=bad))
    with pytest.raises(TypeError, match="unknown tensorlist dtype"):  # bfloat16's bits are two bytes
        dtypes.from_numpy(np.dtype("u1", metadata={dtypes.BITS_KEY: "bfloat16"}))
    assert dtypes.from_numpy(np.dtype("<u2", metadata={"other": 1})).name == "uint16"


def test_bfloat16_bits_round_as_ml_dtypes_does():
    """``dtypes.bfloat16_bits`` (the CLI demo's bfloat16, made without ml_dtypes) rounds to nearest even."""
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="the reference rounding is ml_dtypes'")
    special = np.array([0x00000000, 0x80000000, 0x3F808000, 0x3F818000, 0x3F808001, 0x7F7FFFFF, 0x7F800000,
                        0xFF800000, 0x00000001, 0x807FFFFF, 0x7FC00000, 0x7F800001, 0xFFFFFFFF], np.uint32)
    x = np.concatenate([special, np.random.default_rng(1).integers(0, 2**32, 10_000, dtype=np.uint32)])
    f = x.view(np.float32)
    got = dtypes.bfloat16_bits(f)
    assert dtypes.from_numpy(got.dtype).name == "bfloat16"
    want = f.astype(ml_dtypes.bfloat16)
    nan = np.isnan(f)
    assert (got.view(np.uint16)[~nan] == want.view(np.uint16)[~nan]).all()
    assert np.isnan(got.view(ml_dtypes.bfloat16)[nan].astype(np.float32)).all()  # NaN stays NaN, never inf


@pytest.fixture
def torch():
    """torch, for the tests that take it (a module-level skip would skip the numpy tests above too)."""
    return pytest.importorskip("torch", reason="the torch bridge's carriers need torch")


@pytest.mark.parametrize("row", ML, ids=lambda r: r.name)
def test_torch_tensors_cross_as_carriers_both_ways(tmp_path, row, torch):
    from tensorlist import torch as tt

    t = torch.from_numpy(values(row).view(np.uint8).copy()).view(getattr(torch, row.name))
    c = tt.to_numpy(t, bits=True)
    assert dtypes.from_numpy(c.dtype) is row and c.tobytes() == t.view(torch.uint8).numpy().tobytes()
    assert tt.to_numpy(t).dtype == row.numpy  # the public default: numpy values
    back = tt.from_numpy(c)
    assert back.dtype == t.dtype and torch.equal(back.view(torch.uint8), t.view(torch.uint8))
    tl.save(tmp_path / "t.tl", {"t": t})
    got = tt.load_state(tmp_path / "t.tl")["t"]
    assert got.dtype == t.dtype and torch.equal(got.view(torch.uint8), t.view(torch.uint8))

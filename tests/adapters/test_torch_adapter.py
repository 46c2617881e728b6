"""torch tensors go in and come out bit-exact, bfloat16 and float8 included (CPU: skipped only without torch)."""
import pytest

torch = pytest.importorskip("torch", reason="the torch adapter needs torch (pip install 'tensorlist[torch]')")

import tensorlist as tl  # noqa: E402
from tensorlist.torch import from_numpy, to_numpy, torch_dtype  # noqa: E402

TORCH_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.float32,
                torch.float64, torch.complex64, torch.complex128, torch.bool, torch.bfloat16, torch.float8_e5m2,
                torch.float8_e4m3fn, torch.uint16, torch.uint32, torch.uint64]


def _sample(dtype, shape):
    g = torch.Generator().manual_seed(0)
    base = torch.randn(shape, generator=g) * 3
    if dtype.is_complex:
        return torch.complex(base, -base).to(dtype)
    if dtype == torch.bool:
        return base > 0
    if dtype in (torch.uint16, torch.uint32, torch.uint64):
        return base.abs().to(torch.int64).to(dtype)
    return base.to(dtype)


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (3, 5), (2, 1, 4)])
def test_torch_state_round_trip_is_bit_exact(tmp_path, dtype, shape):
    t = _sample(dtype, shape)
    path = tmp_path / "t.tl"
    tl.save(path, {"t": t, "strided": _sample(dtype, (4, 6))[:, ::2]})
    back = from_numpy(tl.load(path)["t"])
    assert back.dtype == dtype and tuple(back.shape) == shape
    assert _same_bytes(back, t)
    strided = from_numpy(tl.load(path)["strided"])
    assert _same_bytes(strided, _sample(dtype, (4, 6))[:, ::2])


def _same_bytes(a, b):
    """Bitwise equality (NaN-safe); empty tensors compare by shape alone."""
    if a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def test_to_numpy_is_zero_copy_for_cpu_tensors():
    t = torch.arange(6, dtype=torch.bfloat16)
    a = to_numpy(t)
    t[0] = 42
    assert float(a[0]) == 42.0


def test_module_state_dict_saves_directly(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).to(torch.bfloat16)
    tl.save(tmp_path / "m.tl", model.state_dict())
    loaded = {k: from_numpy(v) for k, v in tl.load(tmp_path / "m.tl").items()}
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).to(torch.bfloat16)
    fresh.load_state_dict(loaded)
    for (k, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), k


def test_torch_dtype_names_and_codes():
    assert torch_dtype(15) is torch.bfloat16 and torch_dtype("float8_e4m3fn") is torch.float8_e4m3fn
    with pytest.raises(ValueError, match="unknown dtype code 99"):
        torch_dtype(99)


def test_unsupported_torch_dtype_is_a_clear_type_error(tmp_path):
    with pytest.raises(TypeError, match="qint8|no tensorlist dataType"):
        tl.save(tmp_path / "q.tl", {"q": torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8)})
    assert not (tmp_path / "q.tl").exists()

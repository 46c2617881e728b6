"""What the torch bridge alone does: zero-copy views, module state_dicts, dtype lookups (CPU; skipped only
without torch).

Round trips of every dtype and shape, strided inputs and refusals are tests/adapters/test_contract.py's.
"""
import pytest

torch = pytest.importorskip("torch", reason="the torch adapter needs torch (pip install 'tensorlist[torch]')")

import tensorlist as tl  # noqa: E402
from tensorlist.torch import from_numpy, to_numpy, torch_dtype  # noqa: E402


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

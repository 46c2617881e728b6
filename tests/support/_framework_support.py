"""Sample arrays for the framework adapters' tests (tests/adapters/test_mlx.py, tests/adapters/test_tensorflow.py)."""
import numpy as np

from tensorlist._base import dtypes


def sample(name, shape, seed=0):
    """A numpy array of table dtype ``name`` with varied values (NaN-free: compared by bytes anyway)."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=shape) * 3
    dt = dtypes.from_name(name).numpy
    if dt.kind == "c":
        return (base - 1j * base).astype(dt)
    if dt.kind == "b":
        return base > 0
    if dt.kind == "u":
        return np.abs(base).astype(dt)
    return base.astype(dt)


def bits(a) -> bytes:
    """The bytes of ``a`` in C order: what a bit-exact comparison compares."""
    return np.ascontiguousarray(a).tobytes()

"""Sample arrays for the framework adapters' tests (tests/adapters: test_contract, test_mlx, test_tensorflow)."""
import numpy as np

from tensorlist._base import dtypes


def sample(name, shape, seed=0):
    """A numpy array of table dtype ``name`` with varied values (NaN-free: compared by bytes anyway)."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=shape) * 3
    dt = dtypes.from_name(name).numpy
    if dt.kind == "c":
        values = base - 1j * base
    elif dt.kind == "b":
        values = base > 0
    elif dt.kind == "u":
        values = np.abs(base)
    else:
        values = base
    return np.asarray(values).astype(dt)  # an array at 0-d too: a numpy scalar's astype drops FP4's carrier tag


def bits(a) -> bytes:
    """The bytes of ``a`` in C order: what a bit-exact comparison compares."""
    return np.ascontiguousarray(a).tobytes()

"""What the installed libraries can represent, for the tests' skips (one place for each such check)."""
import numpy as np
import pytest

#: numpy 1.x arrays have at most 32 dims; the format allows 64, numpy 2's limit (format.MAX_DIMS).
needs_numpy_64_dims = pytest.mark.skipif(
    int(np.__version__.split(".")[0]) < 2,
    reason="numpy 1.x arrays have at most 32 dims (NPY_MAXDIMS); the format allows 64, as numpy 2")

try:
    import ml_dtypes
except ImportError:  # no wheel for some CPUs (s390x): bfloat16/float8 values cannot be made there, and
    ml_dtypes = None  # tensorlist refuses those dtypes by name (test_conformance checks it where it is missing)


def bfloat16_bits(values) -> np.ndarray:
    """bfloat16 ``values`` (rounded to nearest even) as a bit carrier: saved as bfloat16, no ml_dtypes needed."""
    from tensorlist import _dtypes

    x = np.asarray(values, np.float32).view(np.uint32).astype(np.uint64)
    bits = ((x + 0x7FFF + ((x >> 16) & 1)) >> 16).astype(np.uint16)
    return bits.view(_dtypes.from_name("bfloat16").bits.newbyteorder("="))  # native, as the bits were made

"""What the installed libraries can represent, for the tests' skips (one place for each such check)."""
import importlib.util

import numpy as np
import pytest

from tensorlist._base.dtypes import bfloat16_bits  # noqa: F401  (the tests' bfloat16 data without ml_dtypes)

#: numpy 1.x arrays have at most 32 dims; the format allows 64, numpy 2's limit (format.MAX_DIMS).
needs_numpy_64_dims = pytest.mark.skipif(
    int(np.__version__.split(".")[0]) < 2,
    reason="numpy 1.x arrays have at most 32 dims (NPY_MAXDIMS); the format allows 64, as numpy 2")

try:
    import ml_dtypes
except ImportError:  # no wheel for some CPUs (s390x): bfloat16/float8 values cannot be made there, and
    ml_dtypes = None  # tensorlist refuses those dtypes by name (test_conformance checks it where it is missing)

#: A test needing ml_dtypes' values (bfloat16/float8 arithmetic); moving their bytes needs none (bit carriers).
needs_ml_dtypes = pytest.mark.skipif(ml_dtypes is None, reason="bfloat16/float8 values need ml_dtypes (no wheel "
                                                                "for this CPU: s390x)")

#: A test needing torch in a module whose other tests need only numpy (they run on the s390x leg, without torch).
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="needs torch (pip install 'tensorlist[torch]')")


def formats_marked(formats) -> list:
    """``formats`` for ``parametrize``, the ``pt`` (torch file) case marked :data:`needs_torch`."""
    return [pytest.param(f, marks=needs_torch) if f == "pt" else f for f in formats]

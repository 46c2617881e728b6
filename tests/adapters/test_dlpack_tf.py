"""The TensorFlow rows of the DLPack table (docs/FRAMEWORKS.md, "DLPack and zero-copy").

Its own module, marked slow: importing tensorflow takes about 12 s, paid once here. The files,
columns and pointer reading are _dlpack_support's; TensorFlow's data pointer is read from the
capsule that ``tf.experimental.dlpack.to_dlpack`` exports.
"""
from __future__ import annotations

import os

import pytest

import tensorlist as tl

from _dlpack_support import COLUMNS, capsule_info, cells, save_files, view

pytestmark = pytest.mark.slow

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow", reason="the TensorFlow rows of the DLPack table need tensorflow "
                         "(pip install tensorflow-cpu)")

@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return save_files(tmp_path_factory.mktemp("dlpack-tf"))


#: as test_dlpack.TABLE; None: no cell (TensorFlow exports no float8 capsule to read the pointer of).
TABLE = {
    "tf.experimental.dlpack.from_dlpack(tl.to_dlpack(a).__dlpack__())":
        {"*": ["refuses", "refuses", "aliases", "aliases"], "float8_e4m3fn": ["refuses"] * 4},
    "tf.experimental.dlpack.from_dlpack(tl.to_dlpack(a).__dlpack__(max_version=(1, 0)))": {"*": ["refuses"] * 4},
    "tf.constant(a)": {"*": ["copies"] * 4, "float8_e4m3fn": [None] * 4},
    "tf.convert_to_tensor(a)": {"*": ["copies"] * 4, "float8_e4m3fn": [None] * 4},
}


def _convert(how, a):
    if how == "tf.constant(a)":
        return tf.constant(a)
    if how == "tf.convert_to_tensor(a)":
        return tf.convert_to_tensor(a)
    capsule = tl.to_dlpack(a).__dlpack__(**({"max_version": (1, 0)} if "max_version" in how else {}))
    return tf.experimental.dlpack.from_dlpack(capsule)


@pytest.mark.parametrize("how,column,dtype,want", list(cells(TABLE)))
def test_the_tensorflow_table(files, how, column, dtype, want):
    mode, aligned = COLUMNS[column]
    a = view(files, mode, aligned, dtype)
    if want == "refuses":
        with pytest.raises(Exception) as e:
            _convert(how, a)
        if mode is True and "max_version" not in how:  # ours, naming the way out
            assert e.type is BufferError and 'mmap="copy"' in str(e.value)
        return
    x = _convert(how, a)
    got = capsule_info(tf.experimental.dlpack.to_dlpack(x))["data"]
    assert (got == a.ctypes.data) == (want == "aliases"), (how, mode, aligned, dtype)


def test_a_tensorflow_tensor_over_a_copy_view_sees_numpy_writes(files):
    a = tl.load(files[True], mmap="copy")["float32"]
    x = tf.experimental.dlpack.from_dlpack(tl.to_dlpack(a).__dlpack__())
    a[1] = 42
    assert float(x[1]) == 42.0
    assert tl.load(files[True])["float32"][1] == 1

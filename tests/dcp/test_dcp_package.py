"""``tensorlist.dcp`` as a package: its numpy-only names import without torch, its storage layer on first use.

Each test runs a child interpreter with torch hidden (``sys.modules['torch'] = None``): importing the README's
line, reading and validating a checkpoint work; touching ``TensorListWriter``/``TensorListReader`` raises an
ImportError that names torch. The former module name ``tensorlist.dcp`` still gives the same objects.
"""
import subprocess
import sys

import numpy as np
import pytest

import tensorlist.dcp as tdcp
import tensorlist.dcp as dcp_read
from tensorlist.convert import convert

HIDE_TORCH = "import sys; sys.modules['torch'] = None\n"


def child(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", HIDE_TORCH + code, *args], capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def ckpt(tmp_path):
    src = tmp_path / "m.npz"
    np.savez(src, w=np.arange(6.0, dtype=np.float32).reshape(2, 3), b=np.arange(4))
    out = tmp_path / "ckpt"
    convert(src, out, dst_format="dcp", progress=False)
    return out


def test_the_readme_import_line_works_without_torch_and_reads_a_checkpoint(ckpt):
    out = child("from tensorlist.dcp import TensorListReader, TensorListWriter, read_full, validate_checkpoint\n"
                "full = read_full(sys.argv[1]); validate_checkpoint(sys.argv[1], verify=True)\n"
                "print(sorted(full), float(full['w'].sum()), 'torch' in sys.modules and sys.modules['torch'])\n",
                str(ckpt))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["['b',", "'w']", "15.0", "None"]


@pytest.mark.parametrize("use", ["TensorListWriter(sys.argv[1])", "TensorListReader(sys.argv[1])",
                                 "type('Mine', (TensorListWriter,), {})"])
def test_using_a_storage_class_without_torch_raises_an_import_error_naming_torch(ckpt, use):
    out = child("from tensorlist.dcp import TensorListReader, TensorListWriter\n"
                f"try:\n    {use}\nexcept ImportError as e:\n    print('refused', e.name, '|', e)\n", str(ckpt))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("refused torch | tensorlist.dcp.TensorList") and "needs torch" in out.stdout


def test_the_stand_ins_are_module_level_classes_named_as_those_they_stand_for():
    out = child("from tensorlist.dcp import TensorListReader, TensorListWriter\n"
                "for c in (TensorListWriter, TensorListReader):\n"
                "    print(c.__module__, c.__qualname__, c.__name__, isinstance(c, type))\n"
                "    try:\n        c.validate_checkpoint_id('x')\n"
                "    except ImportError as e:\n        print('refused', e.name)\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["tensorlist.dcp TensorListWriter TensorListWriter True", "refused torch",
                                       "tensorlist.dcp TensorListReader TensorListReader True", "refused torch"]


def test_the_numpy_only_modules_never_import_torch():
    out = child("import tensorlist.dcp, tensorlist.dcp, tensorlist.dcp.layout, tensorlist.dcp.metadata, "
                "tensorlist.dcp.tiling, tensorlist.dcp.shards\nprint('ok')")
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_dcp_read_re_exports_the_package_objects():
    for name in dcp_read.__all__:
        assert getattr(dcp_read, name) is getattr(tdcp, name), name


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        tdcp.Nope  # noqa: B018


def test_with_torch_the_storage_classes_are_the_real_ones():
    pytest.importorskip("torch", reason="the storage layer needs torch")
    from tensorlist.dcp.torch_storage import TensorListReader, TensorListWriter
    assert tdcp.TensorListWriter is TensorListWriter and tdcp.TensorListReader is TensorListReader
    assert {"TensorListWriter", "TensorListReader"} <= set(dir(tdcp))

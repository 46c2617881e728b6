"""Cold start pays only for what it uses, and an old ml_dtypes costs only the dtypes it lacks.

Each test runs a fresh interpreter (this process has long imported ml_dtypes,
torch and the rest) and checks ``sys.modules`` there, not the clock:
``import tensorlist``, ``tensorlist inspect`` and loads of numpy-only files
import none of the heavy optional or slow dependencies; a bfloat16 file still
loads (ml_dtypes imported then); ``validate`` still runs the JSON Schema
(jsonschema imported then). The old-ml_dtypes case removes
``ml_dtypes.float8_e8m0fnu`` in the child, as ml_dtypes 0.4.x lacks it.
"""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tensorlist as tl
from tensorlist._base import dtypes as _dtypes
from tensorlist.errors import UnsupportedDTypeError

pytestmark = pytest.mark.slow  # every test starts an interpreter

from _paths import ROOT
HEAVY = ("ml_dtypes", "torch", "fsspec", "s3fs", "jsonschema", "matplotlib", "tqdm", "safetensors")


def child(code: str) -> dict:
    """Runs ``code`` in a fresh interpreter on this checkout; it defines ``out``, returned as JSON."""
    prelude = textwrap.dedent(f"""\
        import json, sys
        HEAVY = {HEAVY!r}
        def heavy():
            return sorted({{m.split(".")[0] for m in sys.modules}} & set(HEAVY))
        out = {{}}
        """)
    tail = "\nprint('<<' + json.dumps(out) + '>>')\n"
    p = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code) + tail], capture_output=True,
                       text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout[p.stdout.rindex("<<") + 2:p.stdout.rindex(">>")])


@pytest.fixture
def files(tmp_path):
    """A numpy-only file, a bfloat16 file, and a file with a float8_e8m0fnu tensor (code 44)."""
    small = tmp_path / "small.tl"
    tl.save(small, {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "step": np.int64(3)}, metadata={"a": 1})
    bf = tmp_path / "bf.tl"
    bits = np.array([0x3FC0, 0xC000], np.uint16)  # bfloat16 1.5 and -2.0
    tl.save(bf, {"b": bits})
    doc = json.loads(bf.read_text())
    doc["tensors"][0]["dataType"] = _dtypes.from_name("bfloat16").code
    bf.write_text(json.dumps(doc))
    # float8_e8m0fnu: 2**(byte - 127); written as uint8 and re-typed, so this runs with any ml_dtypes
    e8 = tmp_path / "e8.tl"
    tl.save(e8, {"ok": np.ones(2, np.float32), "scales": np.array([127, 128, 126], np.uint8)})
    doc = json.loads(e8.read_text())
    doc["tensors"][1]["dataType"] = _dtypes.from_name("float8_e8m0fnu").code
    e8.write_text(json.dumps(doc))
    return {"small": str(small), "bf": str(bf), "e8": str(e8)}


def test_import_inspect_and_numpy_loads_import_nothing_heavy(files):
    out = child(f"""
        import tensorlist as tl
        out["after_import"] = heavy()
        from tensorlist.__main__ import main
        out["rc"] = [main(["inspect", {files["small"]!r}]), main(["inspect", "--json", {files["bf"]!r}])]
        out["after_inspect"] = heavy()  # a bfloat16 file's dtype is a name and an itemsize: no ml_dtypes
        import numpy as np
        a = tl.load({files["small"]!r})
        with tl.open({files["small"]!r}) as r:
            step = int(r["step"])
        tl.save({files["small"]!r} + ".copy", {{"x": np.zeros(3, np.float16), "m": np.ones(2, bool)}})
        out["values"] = [a["w"].tolist(), step, tl.load({files["small"]!r} + ".copy")["x"].dtype.name]
        out["after_numpy_io"] = heavy()
        """)
    assert out["after_import"] == [] and out["after_inspect"] == [] and out["after_numpy_io"] == []
    assert out["rc"] == [0, 0]
    assert out["values"] == [[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], 3, "float16"]


def test_bfloat16_file_loads_and_imports_ml_dtypes_then(files):
    out = child(f"""
        import tensorlist as tl
        with tl.open({files["bf"]!r}) as r:
            out["info"] = [r.info("b").dtype.name, r.info("b").dtype.itemsize]
            out["before"] = heavy()
            b = r["b"]
        out["after"] = heavy()
        out["dtype"], out["values"] = b.dtype.name, b.astype("float32").tolist()
        out["load"] = tl.load({files["bf"]!r}, mmap=False)["b"].astype("float32").tolist()
        """)
    assert out["info"] == ["bfloat16", 2] and out["before"] == []
    assert out["after"] == ["ml_dtypes"]
    assert out["dtype"] == "bfloat16" and out["values"] == out["load"] == [1.5, -2.0]


def test_validate_runs_the_schema(files, tmp_path):
    bad = tmp_path / "bad.tl"
    doc = json.loads(open(files["small"]).read())
    doc["tensors"][0]["dataType"] = "6"  # a string: the schema, which runs first, says so
    bad.write_text(json.dumps(doc))
    out = child(f"""
        import tensorlist as tl
        out["before"] = heavy()
        out["lists"] = len(tl.validate({files["small"]!r}))
        out["after"] = heavy()
        try:
            tl.validate({str(bad)!r})
        except tl.FormatError as e:
            out["error"] = [e.reason, e.tensor_index, e.field]
        """)
    assert out["before"] == [] and out["lists"] == 1
    assert out["after"] == ["jsonschema"]
    reason, index, field = out["error"]
    assert reason.startswith("schema: ") and (index, field) == (0, "dataType"), out


def test_dtype_lookups_of_builtins_never_import_ml_dtypes():
    out = child("""
        import numpy as np
        from tensorlist._base import dtypes as _dtypes
        out["builtin"] = [_dtypes.from_numpy(np.dtype(t).newbyteorder(o)).name
                          for t in ("u1", "i2", "f4", "c16", "?", "u8") for o in "<>"]
        out["by_name"] = [_dtypes.from_numpy("bfloat16").name, _dtypes.from_name("float8_e4m3fn").itemsize,
                          _dtypes.from_code(44).name]
        try:
            _dtypes.from_numpy(np.dtype("V3"))
        except TypeError as e:
            out["error"] = str(e)
        out["before"] = heavy()
        import ml_dtypes
        out["ml"] = [_dtypes.from_numpy(ml_dtypes.bfloat16).name, _dtypes.from_numpy(ml_dtypes.float8_e5m2).code]
        """)
    assert out["builtin"] == ["uint8"] * 2 + ["int16"] * 2 + ["float32"] * 2 + ["complex128"] * 2 + \
        ["bool"] * 2 + ["uint64"] * 2
    assert out["by_name"] == ["bfloat16", 1, "float8_e8m0fnu"]
    assert "has no tensorlist dataType code" in out["error"] and "bfloat16" in out["error"]
    assert out["before"] == []
    assert out["ml"] == ["bfloat16", 23]


def test_ml_dtypes_without_a_type_costs_only_that_type(files, tmp_path):
    """ml_dtypes 0.4.x has no float8_e8m0fnu: import, bfloat16 and the rest work; that dtype fails by name."""
    out = child(f"""
        import pickle
        import ml_dtypes
        if hasattr(ml_dtypes, "float8_e8m0fnu"):
            del ml_dtypes.float8_e8m0fnu
            ml_dtypes.__version__ = "0.4.0"
        import numpy as np
        import tensorlist as tl
        from tensorlist._base import dtypes as _dtypes
        from tensorlist.errors import UnsupportedDTypeError
        from tensorlist.__main__ import main
        out["unsupported"] = [d.name for d in _dtypes.DTYPES if not d.supported]
        out["bf16"] = tl.load({files["bf"]!r})["b"].astype("float32").tolist()
        out["inspect"] = main(["inspect", {files["e8"]!r}])
        out["validate"] = len(tl.validate({files["e8"]!r})[0].tensors)
        errors = []
        for how in ("load", "load_copy", "getitem"):
            try:
                if how == "load":
                    tl.load({files["e8"]!r})
                elif how == "load_copy":
                    tl.load({files["e8"]!r}, mmap=False)
                else:
                    with tl.open({files["e8"]!r}) as r:
                        out["ok"] = r["ok"].tolist()
                        r["scales"]
            except tl.FormatError as e:
                errors.append([e.file, e.tensor_index, e.tensor_name, e.field, e.reason])
        out["errors"] = errors
        try:
            _dtypes.from_name("float8_e8m0fnu").numpy
        except UnsupportedDTypeError as e:
            out["caller"] = [isinstance(e, TypeError), e.dtype, str(pickle.loads(pickle.dumps(e))) == str(e)]
        try:
            with tl.Writer({str(tmp_path / "w.tl")!r}) as w:
                w.reserve("x", (2,), "float8_e8m0fnu")
        except TypeError as e:
            out["reserve"] = str(e)
        """)
    assert out["unsupported"] == ["float8_e8m0fnu"]
    assert out["bf16"] == [1.5, -2.0]
    assert out["inspect"] == 0 and out["validate"] == 2 and out["ok"] == [1.0, 1.0]
    assert len(out["errors"]) == 3
    for file, index, name, field, reason in out["errors"]:
        assert (file, index, name, field) == (files["e8"], 1, "scales", "dataType")
        assert "float8_e8m0fnu" in reason and "ml_dtypes >= 0.5.0" in reason and "0.4.0 is installed" in reason
    assert out["caller"] == [True, "float8_e8m0fnu", True]
    assert "float8_e8m0fnu" in out["reserve"] and "0.5.0" in out["reserve"]


def test_every_row_resolves_with_its_itemsize():
    import ml_dtypes

    version = tuple(int(p) for p in ml_dtypes.__version__.split(".")[:2])
    for d in _dtypes.DTYPES:
        need = d.ml_dtypes_since
        if need is None or version >= tuple(int(p) for p in need.split(".")[:2]):
            assert d.supported, d
            assert d.numpy.itemsize == d.itemsize and _dtypes.from_numpy(d.numpy) is d
        else:
            assert not d.supported
            with pytest.raises(UnsupportedDTypeError, match=f"{d.name} .* needs ml_dtypes >= {need}"):
                d.numpy


def test_remote_reader_refuses_an_unsupported_dtype_by_name(files):
    pytest.importorskip("fsspec", reason="remote URLs need fsspec (the 'remote' extra)")
    doc = json.loads(open(files["e8"]).read())
    data = open(os.path.join(os.path.dirname(files["e8"]), doc["location"]), "rb").read()
    out = child(f"""
        import ml_dtypes
        if hasattr(ml_dtypes, "float8_e8m0fnu"):
            del ml_dtypes.float8_e8m0fnu
            ml_dtypes.__version__ = "0.4.0"
        import fsspec
        import tensorlist as tl
        fs = fsspec.filesystem("memory")
        fs.pipe("/e8/m.tl", {json.dumps(doc).encode()!r})
        fs.pipe("/e8/" + {doc["location"]!r}, {data!r})
        with tl.open("memory://e8/m.tl") as r:
            out["ok"] = r["ok"].tolist()
            try:
                r["scales"]
            except tl.FormatError as e:
                out["error"] = [e.file, e.tensor_index, e.tensor_name, e.field, e.reason]
        """)
    assert out["ok"] == [1.0, 1.0]
    file, index, name, field, reason = out["error"]
    assert (file, index, name, field) == ("memory://e8/m.tl", 1, "scales", "dataType")
    assert "float8_e8m0fnu" in reason and "ml_dtypes >= 0.5.0" in reason


#: what the package facade and ``import tensorlist.torch`` leave to first use (bench/bench_startup.py)
DEFERRED = ("tensorlist.reader", "tensorlist.writer", "tensorlist.schema", "tensorlist.remote", "tensorlist.dlpack",
            "tensorlist.format", "tensorlist._core", "tensorlist._base.states",
            "tensorlist.provenance.record")


def test_facade_is_lazy_and_exposes_all_of_its_names():
    out = child("""
        import tensorlist as tl
        out["imported"] = sorted(m for m in sys.modules if m.startswith("tensorlist."))
        public = set(tl._HOMES) | {"TensorListError", "FormatError", "ChecksumError"} | set(tl.__all__)
        out["not_in_dir"] = sorted(public - set(dir(tl)))
        out["missing"] = [n for n in sorted(public) if not hasattr(tl, n)]
        from tensorlist import Reader, load, save, MAX_TENSORS
        import tensorlist.format, tensorlist.reader, tensorlist.writer
        out["same"] = [tl.Reader is tensorlist.reader.Reader, tl.load is load is tensorlist.reader.load,
                       tl.save is save is tensorlist.writer.save, MAX_TENSORS == tensorlist.format.MAX_TENSORS]
        out["submodule"] = tl.schema.__name__  # the modules the facade used to import stay reachable
        try:
            tl.no_such_name
        except AttributeError as e:
            out["unknown"] = str(e)
        out["remote_before"] = "tensorlist.remote" in sys.modules
        out["url_reader"] = tl._backends.dispatch("reader", "memory://m.tl").__name__  # imports the URL backend
        out["remote_after"] = "tensorlist.remote" in sys.modules
        out["heavy"] = heavy()
        """)
    assert not set(out["imported"]) & set(DEFERRED), out["imported"]
    assert out["missing"] == [] and out["not_in_dir"] == [] and out["same"] == [True] * 4
    assert out["submodule"] == "tensorlist.schema" and "no_such_name" in out["unknown"]
    assert (out["remote_before"], out["url_reader"], out["remote_after"]) == (False, "RemoteReader", True)
    assert out["heavy"] == []


def test_help_of_the_package_is_an_overview_and_star_import_gives_the_calls():
    """The docstring fits on a screen; pydoc documents only the calls in full (the classes are in their modules)."""
    out = child("""
        import pydoc
        import tensorlist as tl
        out["doc"] = len(tl.__doc__.splitlines())
        text = pydoc.plain(pydoc.render_doc(tl))
        out["help"] = len(text.splitlines())
        out["classes"] = [n for n in ("Reader", "Writer", "FormatError", "TensorInfo") if f"class {n}(" in text]
        out["calls"] = [n for n in tl.__all__ if f"    {n}(" in text]
        space = {}
        exec("from tensorlist import *", space)
        out["star"] = sorted(k for k in space if not k.startswith("__"))
        """)
    assert out["doc"] <= 25 and out["help"] <= 250, out
    assert out["classes"] == [] and out["calls"] == ["save", "load", "open", "validate", "to_dlpack"]
    assert out["star"] == ["load", "open", "save", "to_dlpack", "validate"]


def test_torch_adapter_imports_the_reader_at_the_first_load_and_never_the_writer(tmp_path):
    """A CPU load_state needs the reader only: not the staging ring, the writer, the schema or the URL backend."""
    pytest.importorskip("torch", reason="the torch paths need torch (the torch extra)")
    path = str(tmp_path / "m.tl")
    tl.save(path, {"w": np.arange(6, dtype=np.float32).reshape(2, 3)})
    out = child(f"""
        import torch
        out["torch_heavy"] = heavy()  # what torch itself imports (tqdm, with some versions)
        import tensorlist.torch as tt
        mods = lambda: sorted(m for m in sys.modules if m.startswith("tensorlist."))
        out["import"] = mods()
        out["w"] = tt.load_state({path!r})["w"].tolist()
        out["load"] = mods()
        out["heavy"] = heavy()
        """)
    assert not set(out["import"]) & set(DEFERRED), out["import"]
    assert out["w"] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert "tensorlist.reader" in out["load"]
    assert not set(out["load"]) & {"tensorlist.writer", "tensorlist.schema", "tensorlist.remote",
                                   "tensorlist._base.states", "tensorlist.provenance.record"}, out["load"]
    assert out["heavy"] == out["torch_heavy"]


def test_torch_paths_never_import_ml_dtypes(tmp_path):
    """torch holds bfloat16 and float8 itself: its saves and loads move their bits, never ml_dtypes' values."""
    pytest.importorskip("torch", reason="the torch paths need torch (the torch extra)")
    out = child(f"""
        import torch
        import tensorlist as tl, tensorlist.torch as tt
        from tensorlist.dcp import TensorListWriter, TensorListReader
        import torch.distributed.checkpoint as dcp
        names = ["bfloat16", "float8_e5m2", "float8_e4m3fn", "float8_e5m2fnuz", "float8_e4m3fnuz", "float8_e8m0fnu"]
        g = torch.Generator().manual_seed(0)
        sd = {{n: torch.randint(0, 255, (3, 4), dtype=torch.uint8, generator=g).view(getattr(torch, n)
                 if n != "bfloat16" else torch.uint8) for n in names}}
        sd["bfloat16"] = torch.randn(3, 4, generator=g).to(torch.bfloat16)
        sd["empty"] = torch.zeros(0, 2, dtype=torch.bfloat16)
        bits = lambda t: t.contiguous().view(torch.uint8).reshape(-1).tolist()
        p = {str(tmp_path / "m.tl")!r}
        tt.save_module_state(p, sd)
        tl.save(p + ".2", sd)
        got = [tt.load_state(p), tt.load_state(p + ".2", mmap=False), tt.load_state(p, mmap="copy"),
               tl.load(p, device="cpu")]
        lin = torch.nn.Linear(4, 3).to(torch.bfloat16)
        tt.save_module_state(p + ".lin", lin)
        lin2 = torch.nn.Linear(4, 3).to(torch.bfloat16)
        tt.load_module_state(p + ".lin", lin2)
        dcp.save(sd, storage_writer=TensorListWriter({str(tmp_path / "ck")!r}))
        target = {{k: torch.empty_like(v) for k, v in sd.items()}}
        dcp.load(target, storage_reader=TensorListReader({str(tmp_path / "ck")!r}))
        got.append(target)
        out["same"] = [all(v.dtype == sd[k].dtype and v.shape == sd[k].shape and bits(v) == bits(sd[k])
                           for k, v in d.items()) and list(d) == list(sd) for d in got]
        out["linear"] = torch.equal(lin.weight.view(torch.int16), lin2.weight.view(torch.int16))
        out["heavy"] = heavy()
        import numpy as np
        out["numpy"] = tl.load(p)["bfloat16"].dtype.name  # a numpy program asks for values: ml_dtypes then
        out["after_numpy"] = "ml_dtypes" in heavy()
        """)
    assert out["same"] == [True] * 5 and out["linear"]
    assert "ml_dtypes" not in out["heavy"] and "torch" in out["heavy"]
    assert out["numpy"] == "bfloat16" and out["after_numpy"]


def test_mlx_paths_never_import_ml_dtypes(tmp_path):
    """MLX holds bfloat16 itself: its saves and loads move the bits; float8 is refused by name, still without it."""
    pytest.importorskip("mlx.core", reason="MLX is not installed (no wheel for this Python)")
    out = child(f"""
        import mlx.core as mx
        import tensorlist.mlx as tm
        from tensorlist.errors import UnsupportedDTypeError
        w = mx.random.normal((8, 4), key=mx.random.key(0)).astype(mx.bfloat16)
        p = {str(tmp_path / "m.tl")!r}
        tm.save(p, {{"w": w, "i": mx.arange(3)}})
        back = tm.load(p)
        out["same"] = back["w"].dtype == mx.bfloat16 and mx.array_equal(back["w"].view(mx.uint16),
                                                                       w.view(mx.uint16)).item()
        out["heavy"] = heavy()
        """)
    assert out["same"] and "ml_dtypes" not in out["heavy"]

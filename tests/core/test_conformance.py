"""The conformance corpus (tests/conformance/manifest.json) through load, load(mmap=False), open and validate.

The corpus is language-neutral: another implementation reads the manifest and checks the same
outcomes. Here each case must give exactly the manifest's tensors (dtype, shape, bytes, values) or
a FormatError, and the committed files must be what make_corpus.py makes.
"""
import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest

import tensorlist as tl
from tensorlist._base import dtypes
from _paths import TESTS

CORPUS = Path(TESTS) / "conformance"
MANIFEST = json.loads((CORPUS / "manifest.json").read_text(encoding="utf-8"))
CASES = MANIFEST["cases"]
MODES = ["load", "load_nommap", "open", "validate"]


def _kwargs(case):
    kw = dict(case.get("limits", {}))
    if case["pointer"] is not None:
        kw["pointer"] = case["pointer"]
    return kw


def _read(mode, path, kw, verify=False):
    if mode == "load":
        return tl.load(path, verify=verify, **kw)
    if mode == "load_nommap":
        return tl.load(path, mmap=False, verify=verify, **kw)
    if mode == "open":
        with tl.open(path, **kw) as r:
            if verify:
                r.verify()
            return {k: np.array(r[k]) for k in r.keys()}
    descs = tl.validate(path, verify=verify, **kw)
    assert len(descs) == 1
    return None


def _unsupported(case):
    """The first dtype of the case that the installed ml_dtypes lacks (float8_e8m0fnu before 0.5), or None."""
    return next((t["dtype"] for t in case["tensors"] if not dtypes.from_name(t["dtype"]).supported), None)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", [c for c in CASES if c["expect"] == "ok"], ids=lambda c: c["id"])
def test_valid_file(case, mode):
    missing = _unsupported(case)
    if missing and mode != "validate":  # a valid file, refused at use by name (validate makes no arrays)
        with pytest.raises(tl.FormatError, match=f"dtype {missing} .*needs ml_dtypes >= "):
            _read(mode, CORPUS / case["file"], _kwargs(case))
        return
    got = _read(mode, CORPUS / case["file"], _kwargs(case))
    if got is None:
        return  # validate: no tensors to compare, it did not raise
    assert list(got) == [t["key"] for t in case["tensors"]]
    for t in case["tensors"]:
        a = got[t["key"]]
        assert dtypes.from_numpy(a.dtype).name == t["dtype"]
        assert dtypes.from_name(t["dtype"]).code == t["dataType"]
        assert list(a.shape) == t["shape"]
        assert a.tobytes().hex() == t["hex"]
        if a.dtype.kind == "c":
            assert [[z.real, z.imag] for z in a.reshape(-1).tolist()] == t["values"]
        else:
            assert a.reshape(-1).astype(np.float64 if a.dtype.kind not in "biu" else a.dtype).tolist() == t["values"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", [c for c in CASES if c["expect"] == "ok"], ids=lambda c: c["id"])
@pytest.mark.filterwarnings("ignore:.*stores no checksums")
def test_verify_outcome(case, mode):
    path, kw = CORPUS / case["file"], _kwargs(case)
    missing = _unsupported(case)
    # a load or an open makes arrays: refused by name; validate checks the CRCs over bit carriers, which need
    # no ml_dtypes (the s390x leg)
    if missing and mode != "validate":
        with pytest.raises(tl.FormatError, match=f"dtype {missing} .*needs ml_dtypes >= "):
            _read(mode, path, kw, verify=True)
    elif case["verify"] == "ok":
        _read(mode, path, kw, verify=True)
    else:
        with pytest.raises(tl.ChecksumError, match="CRC32C"):
            _read(mode, path, kw, verify=True)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", [c for c in CASES if c["expect"] == "error"], ids=lambda c: c["id"])
def test_invalid_file(case, mode):
    path = CORPUS / case["file"]
    with pytest.raises(tl.FormatError) as e:
        _read(mode, path, _kwargs(case))
    assert type(e.value) is tl.FormatError
    assert str(path) in str(e.value)


def test_every_rule_has_an_invalid_file():
    rules = {c["rule"] for c in CASES if c["expect"] == "error"}
    assert rules == set(range(1, 14))
    assert {c["dtype"] for c in CASES if c["id"].startswith("dtype_") for c in c["tensors"]} == \
        {d.name for d in dtypes.DTYPES}


@pytest.mark.skipif(not all(d.supported for d in dtypes.DTYPES),
                    reason="the corpus generator needs every dtype of the table (float8_e8m0fnu: ml_dtypes >= 0.5)")
def test_corpus_is_what_the_generator_makes(tmp_path):
    spec = importlib.util.spec_from_file_location("make_corpus", CORPUS / "make_corpus.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.make(str(tmp_path))

    def files(root):
        return {str(p.relative_to(root)): p.read_bytes() for p in Path(root).rglob("*")
                if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts}

    made, committed = files(tmp_path), files(CORPUS)
    assert sorted(made) == sorted(committed)
    for name in made:
        assert made[name] == committed[name], f"{name} differs: rerun tests/conformance/make_corpus.py"
    for c in CASES:
        assert os.path.exists(CORPUS / c["file"])

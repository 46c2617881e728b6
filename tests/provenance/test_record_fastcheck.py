"""Training records at scale: the history's fast path agrees with the schema, fails at the first bad entry in
bounded memory through every entry point, and `record --plot` draws many parameter groups quickly."""
from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
import textwrap

import jsonschema
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _record_support import full_record
from tensorlist._base.jsonio import loads_strict
from tensorlist.errors import FormatError
from tensorlist.provenance.record import read_training_record, save_model_file, validate_training_record, verify_model_file
from tensorlist.provenance.record.core import _cross_checks, _schema_error, check_strict_json
from tensorlist.provenance.record.fastcheck import suspects
from tensorlist.schema import load_schema

SCHEMA = jsonschema.Draft202012Validator(load_schema("training-record.schema.json"))


def _reference(record):
    """The whole-record checks without the fast path: strict JSON, jsonschema, then the cross checks.

    Returns None when the record is accepted, else the set of fields an error may name (the record's own naming
    of each jsonschema error: a record here has one fault, but jsonschema may see it at an entry and inside it).
    """
    try:
        check_strict_json(record)
    except FormatError as e:
        return {e.field}
    errors = list(SCHEMA.iter_errors(record))
    if errors:
        return {_schema_error(e, record, "", None).field for e in errors}
    try:
        _cross_checks(record, "", None)
    except FormatError as e:
        return {e.field}
    return None


def _long_record(n=300, groups=2):
    """A valid record of ``n`` epochs (one learning rate per group in each)."""
    r = full_record()
    r["epochs"] = {"asked": n, "done": n}
    lr = (lambda i: [0.001 * (i + 1), None][:groups] + [0.5] * (groups - 2)) if groups > 1 else (lambda i: 0.001)
    r["history"] = {"training_loss": [1.0 / (i + 1) for i in range(n)],
                    "validation": [None if i % 3 else 0.25 for i in range(n)],
                    "learning_rate": [lr(i) for i in range(n)]}
    if groups == 1:
        r["optimizer"]["parameter_groups"] = None
    return r


def _agree(record):
    """The fast path accepts exactly what the reference accepts, and names a field the reference names."""
    expected = _reference(copy.deepcopy(record))
    if expected is None:
        validate_training_record(record)
        return None
    with pytest.raises(FormatError) as info:
        validate_training_record(record)
    assert info.value.field in expected, (info.value, expected)
    return info.value


class NumpyFloat32(float):
    pass


# (id, list, entry) put at epoch 250 of 300: each fault once, and entries that look odd but are valid.
ENTRIES = [
    ("float", "training_loss", 0.5, True),
    ("int", "training_loss", 3, True),
    ("int past float64", "training_loss", 10 ** 400, True),
    ("null", "validation", None, True),
    ("negative zero", "training_loss", -0.0, True),
    ("float subclass", "training_loss", NumpyFloat32(0.5), True),
    ("numpy float64", "training_loss", np.float64(0.5), True),
    ("nan", "training_loss", math.nan, False),
    ("inf", "validation", math.inf, False),
    ("-inf", "learning_rate", [0.1, -math.inf], False),
    ("numpy nan", "training_loss", np.float64("nan"), False),
    ("numpy float32", "training_loss", np.float32(0.5), False),
    ("numpy int", "validation", np.int64(3), False),
    ("bool", "training_loss", True, False),
    ("string", "validation", "0.5", False),
    ("object", "training_loss", {"loss": 0.5}, False),
    ("list in a scalar list", "training_loss", [0.5], False),
    ("tuple", "learning_rate", (0.1, 0.2), False),
    ("empty list", "learning_rate", [], False),
    ("nested list", "learning_rate", [[0.1], 0.2], False),
    ("string in a list", "learning_rate", [0.1, "x"], False),
    ("bool in a list", "learning_rate", [False, 0.1], False),
    ("lone surrogate", "validation", "\ud800", False),
    ("set", "training_loss", {0.5}, False),
    ("wrong group count", "learning_rate", [0.1, 0.2, 0.3], False),  # a cross check
    ("scalar for two groups", "learning_rate", 0.1, False),  # a cross check
    ("null rates", "learning_rate", None, True),
    ("null in the rates", "learning_rate", [None, None], True),
]


@pytest.mark.parametrize("key,entry,valid", [e[1:] for e in ENTRIES], ids=[e[0] for e in ENTRIES])
def test_fast_path_agrees_with_the_schema(key, entry, valid):
    record = _long_record()
    record["history"][key][250] = entry
    error = _agree(record)
    assert (error is None) is valid
    if error is not None:
        assert error.field.startswith(f"history.{key}[250]")


def test_only_the_first_bad_entry_is_reported_with_the_schema_message():
    record = _long_record()
    record["history"]["validation"][7:] = ["x"] * (len(record["history"]["validation"]) - 7)
    with pytest.raises(FormatError, match=r"field 'history\.validation\[7\]': expected number or null, got 'x'"):
        validate_training_record(record)
    record = _long_record()
    record["history"]["learning_rate"][40] = [0.1, math.nan]
    with pytest.raises(FormatError, match=r"'history\.learning_rate\[40\]\[1\]': nan is not a JSON number"):
        validate_training_record(record)


@pytest.mark.parametrize("groups", [1, 2])
def test_the_rest_of_the_record_is_still_checked_by_the_schema(groups):
    record = _long_record(groups=groups)
    record["history"]["surprise"] = [1.0]
    _agree(record)
    record = _long_record(groups=groups)
    record["history"]["training_loss"] = tuple(record["history"]["training_loss"])  # the schema's array is a list
    _agree(record)
    record = _long_record(groups=groups)
    record["created"] = 5
    _agree(record)


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=3)
    | st.sampled_from([np.float64(1.5), np.float32(2.0), np.int32(1), 10 ** 330, -0.0]),
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner) | st.dictionaries(st.text(max_size=2), inner, max_size=2),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None)
@given(key=st.sampled_from(["training_loss", "validation", "learning_rate"]), groups=st.sampled_from([1, 2]),
       at=st.integers(0, 57), entries=st.lists(JSONISH, min_size=1, max_size=3))
def test_generated_entries_agree_with_the_schema(key, groups, at, entries):
    """Accepted exactly when the reference accepts; the error names one of the faults the reference sees.

    With several faults the two may name different ones (the reference reports strict-JSON faults before
    schema faults; the fast path the first bad entry), so each entry is also judged alone.
    """
    record = _long_record(60, groups)
    record["history"][key][at:at + len(entries)] = entries
    faults = set()
    for i, entry in enumerate(entries):
        alone = _long_record(60, groups)
        alone["history"][key][at + i] = entry
        faults |= _reference(alone) or set()
    expected = _reference(copy.deepcopy(record))
    if expected is None:
        validate_training_record(record)
        return
    with pytest.raises(FormatError) as info:
        validate_training_record(record)
    assert info.value.field in faults | expected, (info.value, faults, expected)


def test_suspects_screens_plain_lists_without_naming_anything():
    assert list(suspects([0.5] * 1000 + [None, 7, 10 ** 400])) == []
    assert list(suspects([[0.5, None]] * 1000 + [None, 0.1], lists=True)) == []
    assert list(suspects([0.5, math.inf, 0.1, math.nan, "x"])) == [1, 3, 4]
    assert list(suspects([[0.5], [], [math.nan], [1, True]], lists=True)) == [1, 2, 3]


# --------------------------------------------------------------------------------------------------------------
# every entry point: the same first bad entry, named with its file


EPOCHS = 50_000


@pytest.fixture(scope="module")
def bad_model(tmp_path_factory):
    """A model file whose record's training loss at epoch 49,999 (index 49,998) is a string."""
    d = tmp_path_factory.mktemp("bad")
    record = _long_record(EPOCHS)
    record["weights"].update(epoch=3, sha256=None)
    path = d / "model.tl"
    save_model_file(path, {"w": np.ones(3, np.float32)}, training=record, dataset_params={"name": "x"})
    doc = json.loads(path.read_text())
    doc["metadata"]["training"]["history"]["training_loss"][EPOCHS - 2] = "oops"
    path.write_text(json.dumps(doc))
    return path


FIELD = f"metadata.training.history.training_loss[{EPOCHS - 2}]"


@pytest.mark.parametrize("entry", ["read_training_record", "read_training_record(bytes)", "verify_model_file"])
def test_every_reader_names_the_file_and_the_entry(bad_model, entry):
    with pytest.raises(FormatError, match=r"expected number or null, got 'oops'") as info:
        if entry == "read_training_record":
            read_training_record(bad_model)
        elif entry == "verify_model_file":
            verify_model_file(bad_model)
        else:
            read_training_record(bad_model.read_bytes())
    assert info.value.field == FIELD
    assert info.value.file == (None if "bytes" in entry else str(bad_model))


def test_cli_record_and_inspect_name_the_entry(bad_model):
    p = subprocess.run([sys.executable, "-m", "tensorlist", "record", str(bad_model)], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 1 and p.stdout == ""
    assert str(bad_model) in p.stderr and FIELD in p.stderr and "Traceback" not in p.stderr


# --------------------------------------------------------------------------------------------------------------
# bounded memory: a hostile record fails at its first bad entry under a 1 GiB address-space limit


LIMITED = textwrap.dedent("""
    import resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    from tensorlist.errors import FormatError
    from tensorlist.provenance.record import read_training_record
    try:
        read_training_record(sys.argv[1])
    except FormatError as e:
        print(e.field)
""")


@pytest.mark.parametrize("where", ["history", "parameter_groups"])
def test_many_bad_entries_fail_fast_in_bounded_memory(tmp_path, where):
    bad = 400_000
    if where == "history":
        record = _long_record(bad + 10, groups=1)
        record["history"]["validation"][10:] = ["bad entry"] * bad  # ~6.4 MB of text, 400,000 schema errors
        field = "history.validation[10]"
    else:
        record = _long_record(10)
        record["optimizer"]["parameter_groups"] = [{"parameters": 1}] * bad
        field = "optimizer.parameter_groups[0].initial_lr"
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(record))
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-c", LIMITED, str(path)], capture_output=True, text=True, timeout=300,
                       env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == [field]


# --------------------------------------------------------------------------------------------------------------
# record --plot with many parameter groups


def test_plot_of_twenty_thousand_groups_draws_ten_and_the_band(tmp_path):
    pytest.importorskip("matplotlib")
    groups = 20_000
    record = _long_record(6, groups=2)
    record["optimizer"]["parameter_groups"] = [{"parameters": [f"p{i}"], "initial_lr": 0.1, "settings": {}}
                                               for i in range(groups)]
    record["history"]["learning_rate"] = [[0.1 / (e + 1)] * (groups - 1) + [None] for e in range(6)]
    record["history"]["learning_rate"][2] = None
    record["weights"]["epoch"] = 2
    path = tmp_path / "record.json"
    path.write_text(json.dumps(record))
    out = tmp_path / "curves.png"
    p = subprocess.run([sys.executable, "-m", "tensorlist", "record", str(path), "--plot", str(out)],
                       capture_output=True, text=True, timeout=300)  # a hang guard: it took minutes
    assert p.returncode == 0, p.stderr
    assert "20000 parameter groups: groups 0 to 9 drawn, all of them as their min-max band" in p.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------------------------------------------
# the strict reader's shortcuts (the per-float check and the depth count) refuse what they refused


@pytest.mark.parametrize("text, ok", [
    ("[1e308, 1e-400, 1e99]", True),
    ('["5e123", "5e123a", "1E999"]', True),  # in strings: not numbers
    ("[1e309]", False),
    ("[1.5E+0400 ]", False),
    ("[0.00001e00400]", False),
    ("[" + "9" * 310 + ".0]", False),
    ("[" + "9" * 400 + "]", True),  # an int: exact, as JSON allows
    ('["' + "[" * 300 + '"]', True),  # brackets in a string do not nest
    ("[" * 257 + "]" * 257, False),
    ("[" * 256 + "]" * 256, True),
    ('[{"a": "]]"}' + ", [[]]" * 200 + "]", True),
])
def test_strict_reader_shortcuts(text, ok):
    if ok:
        assert loads_strict(text) == json.loads(text)
    else:
        with pytest.raises(FormatError, match="out of the float64 range|nesting deeper than 256"):
            loads_strict(text)

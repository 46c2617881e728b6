"""The record schemas: valid schemas, described fields, and one rejection per field."""
from __future__ import annotations

import json
import math
import re

import jsonschema
import pytest
from hypothesis import given, settings

from _record_support import (
    HEX_A,
    dotted,
    field_paths,
    full_record,
    get,
    records,
    with_change,
    wrong_value,
)
from tensorlist.errors import FormatError
from tensorlist.schema import load_schema
from tensorlist.provenance.record import (
    FORMAT,
    WEIGHTS_HASH_TAG,
    WEIGHTS_KINDS,
    validate_dataset_params,
    validate_training_record,
)

SCHEMAS = ["training-record.schema.json", "dataset-params.schema.json"]
PATHS = list(field_paths())


def _walk_schema(node, where="#"):
    if isinstance(node, dict):
        yield where, node
        for key, value in node.items():
            yield from _walk_schema(value, f"{where}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk_schema(value, f"{where}/{i}")


@pytest.mark.parametrize("name", SCHEMAS)
def test_schema_is_valid_draft_2020_12(name):
    """Each schema is itself a valid Draft 2020-12 schema with a versioned $id."""
    schema = load_schema(name)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert re.search(r":v1$", schema["$id"])


@pytest.mark.parametrize("name", SCHEMAS)
def test_every_property_is_described_and_patterns_anchored(name):
    """Every field says what it means; every pattern is anchored."""
    for where, node in _walk_schema(load_schema(name)):
        # Conditional parts (if/then/else, allOf) restate fields defined, with
        # their description, beside them; spec_rules' branches define fields.
        restates = re.search(r"/(if|allOf)(/|$)", where) or (
            re.search(r"/(then|else)(/|$)", where) and "/$defs/spec_rules" not in where)
        if restates:
            continue
        for prop, sub in node.get("properties", {}).items() if isinstance(node.get("properties"), dict) else ():
            if sub is False:
                continue
            assert isinstance(sub.get("description"), str) and len(sub["description"]) > 10, f"{where}/{prop}"
        if isinstance(node.get("pattern"), str):
            assert node["pattern"].startswith("^") and node["pattern"].endswith("$"), where


def test_schema_matches_module_constants():
    """The version marker, the weight kinds and the hash tag agree between schema and code."""
    schema = load_schema("training-record.schema.json")
    assert schema["properties"]["format"]["const"] == FORMAT
    assert tuple(schema["properties"]["weights"]["properties"]["kind"]["enum"]) == WEIGHTS_KINDS
    assert len(WEIGHTS_HASH_TAG) == 28
    assert "the 28 bytes 'tensorlist-weights-sha256' NUL 'v1'" in schema["$defs"]["sha256"]["description"]
    assert set(schema["required"]) == set(schema["properties"])


def test_full_record_is_valid_for_both_validators():
    """The test's full record passes tensorlist's checks and a plain jsonschema validator."""
    record = full_record()
    validate_training_record(record)
    jsonschema.Draft202012Validator(load_schema("training-record.schema.json")).validate(record)


@pytest.mark.parametrize("path", [p for p in PATHS if not isinstance(p[-1], int)], ids=dotted)
def test_missing_field_is_rejected_naming_it(path):
    """Removing any field of the record is an error that names that field."""
    record = with_change(path, lambda parent, key: parent.pop(key))
    with pytest.raises(FormatError, match=re.escape(f"field {dotted(path)!r}: missing required field")) as info:
        validate_training_record(record)
    assert info.value.field == dotted(path)
    assert not jsonschema.Draft202012Validator(load_schema("training-record.schema.json")).is_valid(record)


@pytest.mark.parametrize("path", PATHS, ids=dotted)
def test_mistyped_field_is_rejected_naming_it(path):
    """A value of the wrong type in any field is an error that names that field."""
    original = get(full_record(), path)
    bad = wrong_value(original[0][original[1]])
    record = with_change(path, lambda parent, key: parent.__setitem__(key, bad))
    with pytest.raises(FormatError, match=re.escape(f"field {dotted(path)!r}:")) as info:
        validate_training_record(record)
    assert info.value.field == dotted(path)
    assert not jsonschema.Draft202012Validator(load_schema("training-record.schema.json")).is_valid(record)


@pytest.mark.parametrize("section", ["", "solver", "optimizer", "initial_weights", "train", "epochs", "weights",
                                     "history", "validation", "validation.loader", "solver.loss"])
def test_unexpected_field_is_rejected(section):
    """Sections with a fixed set of keys reject any other key, by name."""
    record = full_record()
    target = record
    for part in filter(None, section.split(".")):
        target = target[part]
    target["surprise"] = 1
    with pytest.raises(FormatError, match="unexpected field") as info:
        validate_training_record(record)
    assert info.value.field == (f"{section}.surprise" if section else "surprise")


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_number_is_rejected_naming_the_entry(value):
    """NaN/Infinity are not JSON: the record must hold null instead."""
    record = full_record()
    record["history"]["training_loss"][1] = value
    with pytest.raises(FormatError, match=r"field 'history.training_loss\[1\]'.*not a JSON number"):
        validate_training_record(record)


@pytest.mark.parametrize("change, field, message", [
    (lambda r: r["history"]["training_loss"].append(0.1), "history.training_loss", "has 4 entries but epochs.done is 3"),
    (lambda r: r["history"]["validation"].pop(), "history.validation", "has 2 entries"),
    (lambda r: r["history"]["learning_rate"].pop(), "history.learning_rate", "one entry per epoch"),
    (lambda r: r["weights"].__setitem__("epoch", 4), "weights.epoch", "after the last epoch done"),
    (lambda r: r["history"]["learning_rate"].__setitem__(0, 0.1), "history.learning_rate[0]",
     "list of 2 learning rates"),
    (lambda r: r["history"]["learning_rate"].__setitem__(0, [0.1]), "history.learning_rate[0]",
     "expected 2 learning rates"),
    (lambda r: (r["optimizer"].__setitem__("parameter_groups", None)), "history.learning_rate[0]",
     "one parameter group"),
    (lambda r: r.__setitem__("validation", None), "history.validation[0]", "no validation"),
    (lambda r: (r.__setitem__("validation", None), r["history"].__setitem__("validation", [None] * 3)),
     "weights.kind", "no validation"),
    (lambda r: r["weights"].__setitem__("validation", None), "weights.validation", "expected number"),
    (lambda r: r["optimizer"].__setitem__("scheduler", None), "optimizer.scheduler_step", "expected null"),
    (lambda r: r["optimizer"].__setitem__("scheduler_step", None), "optimizer.scheduler_step", "expected one of"),
    (lambda r: r["solver"]["solver_params"].__setitem__("device", "cuda"), "solver.solver_params.device",
     "where it ran"),
    (lambda r: r["initial_weights"].__setitem__("from", "random_state"), "initial_weights.file", "not allowed"),
    (lambda r: r["initial_weights"].__setitem__("from", None), "initial_weights.file", "not allowed"),
    (lambda r: r["initial_weights"].__setitem__("from", "lucky"), "initial_weights.from", "expected one of"),
    (lambda r: r["epochs"].__setitem__("done", -1), "epochs.done", "at least 0"),
    (lambda r: r["validation"].__setitem__("every", 0), "validation.every", "at least 1"),
    (lambda r: r["train"].__setitem__("batch_size", 0), "train.batch_size", "at least 1"),
    (lambda r: r.__setitem__("initial_weights_sha256", "ABC"), "initial_weights_sha256", "64 lowercase hex"),
    (lambda r: r["weights"].__setitem__("sha256", HEX_A.upper()), "weights.sha256", "64 lowercase hex"),
    (lambda r: r.__setitem__("created", "yesterday"), "created", "matching"),
    (lambda r: r["optimizer"]["parameter_groups"][0].__setitem__("initial_lr", -1.0),
     "optimizer.parameter_groups[0].initial_lr", "at least 0"),
    (lambda r: r["optimizer"].__setitem__("parameter_groups", []), "optimizer.parameter_groups", "at least 1"),
    (lambda r: r["validation"]["dataset_params"]["content_hash"].__setitem__("sha256", "x"),
     "validation.dataset_params.content_hash.sha256", "64 lowercase hex"),
    (lambda r: r["solver"].__setitem__("class", ""), "solver.class", "must not be empty"),
])
def test_semantic_rules(change, field, message):
    """Rules beyond field types: lengths, epochs, kinds, consistency, formats."""
    record = full_record()
    change(record)
    with pytest.raises(FormatError, match=re.escape(message)) as info:
        validate_training_record(record)
    assert info.value.field == field


def test_other_version_is_refused():
    """A record of another version is refused by name, not half-read."""
    record = full_record()
    record["format"] = "tensorlist.training-record/2"
    with pytest.raises(FormatError, match="unsupported training-record version"):
        validate_training_record(record)


def test_validate_rejects_non_mapping_with_type_error():
    """A record must be a dict."""
    with pytest.raises(TypeError, match="JSON object"):
        validate_training_record([1, 2])


def test_non_json_types_and_keys_are_rejected():
    """Tuples are fine (they are JSON arrays); sets and non-string keys are not."""
    record = full_record()
    record["solver"]["solver_params"]["pair"] = (1, 2)
    validate_training_record(record)
    record["solver"]["solver_params"]["bad"] = {1, 2}
    with pytest.raises(FormatError, match="field 'solver.solver_params.bad': a builtins.set is not a JSON value"):
        validate_training_record(record)
    record = full_record()
    record["solver"]["solver_params"][3] = 1
    with pytest.raises(FormatError, match="key 3 is not a string"):
        validate_training_record(record)


@pytest.mark.parametrize("data, ok", [
    ({}, True),
    ({"name": "LIDC", "split": "train", "anything": [1, {"a": None}]}, True),
    ({"content_hash": {"method": "weights_sha256", "sha256": HEX_A}}, True),
    ({"content_hash": {"method": "weights_sha256"}}, False),
    ({"content_hash": {"sha256": HEX_A}}, False),
    ({"content_hash": {"method": "", "sha256": HEX_A}}, False),
    ({"content_hash": {"method": "x", "sha256": HEX_A, "extra": 1}}, False),
    ({"content_hash": "abc"}, False),
])
def test_dataset_params_schema(data, ok):
    """A data record is free-form JSON with an optional, checked content hash."""
    plain = jsonschema.Draft202012Validator(load_schema("dataset-params.schema.json")).is_valid(data)
    assert plain is ok
    if ok:
        validate_dataset_params(data)
    else:
        with pytest.raises(FormatError, match="content_hash"):
            validate_dataset_params(data)


def test_dataset_params_rejects_nan_and_non_mapping():
    """The data record is strict JSON and an object."""
    with pytest.raises(FormatError, match=r"field 'size\[1\]'"):
        validate_dataset_params({"size": [1, math.nan]})
    with pytest.raises(TypeError, match="JSON object"):
        validate_dataset_params("LIDC")


@settings(max_examples=200, deadline=None)
@given(records())
def test_generated_records_validate_and_round_trip_through_strict_json(record):
    """Any valid record survives strict JSON text and passes both validators."""
    text = json.dumps(record, allow_nan=False)
    back = json.loads(text)
    assert back == record
    validate_training_record(back)
    jsonschema.Draft202012Validator(load_schema("training-record.schema.json")).validate(back)

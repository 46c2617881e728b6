"""The record itself: its version marker, the :class:`TrainingRecord` type, history lists, and validation.

Validation runs in one fixed order and stops at the first failure: the
version marker; strict JSON (the package's one rule,
``_base.jsonio.check_json``: str keys, no NaN/Infinity, no lone surrogates, plain
JSON types); the shipped schema (``schemas/training-record.schema.json`` or
``dataset-params.schema.json``, through ``tensorlist.schema``); then what a
schema cannot say (list lengths and epochs against each other). Errors are
FormatErrors naming the field in the record's dotted form
(``metadata.training.history.validation[2]``).

The history's per-epoch entries (almost all of a long run's record) are
checked apart, in one pass per list: ``fastcheck`` screens each list at C
speed and names the entries that may be bad; the first of them that strict
JSON or the schema's own item rule refuses is the error. The rest of the
record goes through strict JSON and the schema as a whole, the history's
entries checked between the two. At most ``MAX_SCHEMA_ERRORS`` schema errors
are kept to choose the one reported, so a record with many bad fields costs
bounded memory.

Imports ``schema``, ``_base.jsonio``, ``errors`` and the record's ``_common`` and ``fastcheck``.
"""
from __future__ import annotations

import functools
import itertools
import json
import math
import numbers
import re
from collections.abc import Mapping
from typing import List, NamedTuple, Optional, Union

import numpy as np

from tensorlist._base.jsonio import MAX_DEPTH, array_index, check_json, pointer_tokens
from tensorlist.errors import FormatError
from tensorlist.schema import schema_validator
from tensorlist.provenance.record._common import join, short
from tensorlist.provenance.record.fastcheck import HISTORY_LISTS, suspects

__all__ = [
    "FORMAT",
    "WEIGHTS_KINDS",
    "TrainingRecord",
    "history",
    "epoch_number",
    "HistoryRow",
    "history_rows",
    "history_table",
    "is_training_record",
    "check_strict_json",
    "validate_training_record",
    "validate_dataset_params",
]

#: The version marker every record carries in its ``format`` field.
FORMAT = "tensorlist.training-record/1"
_FORMAT_RE = re.compile(r"^tensorlist\.training-record/[0-9]+$")

#: The kinds of weights a model file can hold (``weights.kind``).
WEIGHTS_KINDS = ("final", "best_validation", "checkpoint")


# --------------------------------------------------------------------------
# history lists


def _history_value(value, where: str, level: int = 0):
    if value is None:
        return None
    if level > MAX_DEPTH:  # also ends a list that holds itself
        raise TypeError(f"{where}: nests deeper than {MAX_DEPTH} levels (expected a number or a list of numbers)")
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{where}: expected a number, got {value!r}")
    if hasattr(value, "tolist") and not isinstance(value, (list, tuple)):
        value = value.tolist()  # numpy or torch scalar/array (bfloat16 included)
    if isinstance(value, (list, tuple)):
        return [_history_value(v, join(where, i), level + 1) for i, v in enumerate(value)]
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        f = float(value)
        return f if math.isfinite(f) else None
    raise TypeError(f"{where}: expected a number, None or a list of them, got {value!r}")


def history(values, done: int) -> List[Optional[Union[float, list]]]:
    """The first ``done`` values as JSON numbers (None for NaN and +/-Inf).

    ``values`` is a per-epoch sequence (list, numpy array or torch tensor) of
    numbers or None; an entry may itself be a list (one learning rate per
    parameter group). Preallocated arrays are cut to the epochs done, so a
    resumed or stopped run leaves no placeholder zeros.

    Args:
        values: the per-epoch values, at least ``done`` of them.
        done: how many epochs are done.

    Returns:
        A list of ``done`` floats or None (or lists of them).

    Raises:
        TypeError: ``done`` is not an integer, or a value is not a number (or
            nests deeper than ``_base.jsonio.MAX_DEPTH`` lists).
        ValueError: ``done`` is negative or larger than ``len(values)``.

    Example:
        >>> history([1.0, float("inf"), [0.1, float("nan")], 9.0], 3)
        [1.0, None, [0.1, None]]
        >>> history([0.5, float("nan"), 0.25, 0.0], 3)
        [0.5, None, 0.25]
    """
    if isinstance(done, (bool, np.bool_)) or not isinstance(done, numbers.Integral):
        raise TypeError(f"history: done must be an integer, got {done!r}")
    done = int(done)
    if done < 0:
        raise ValueError(f"history: done must be >= 0, got {done}")
    if values is None:
        values = []
    if hasattr(values, "tolist") and not isinstance(values, (list, tuple)):
        if getattr(values, "ndim", 1) == 0:
            raise TypeError("history: values must be a sequence, got a 0-d array")
        values = values[:done].tolist()
    values = list(values)
    if len(values) < done:
        raise ValueError(f"history: {done} epochs done but only {len(values)} values given")
    return [_history_value(v, f"history[{i}]") for i, v in enumerate(values[:done])]


def epoch_number(index: int) -> int:
    """The record's number of the epoch at 0-based position ``index``: ``index + 1``.

    The record counts epochs from 1 (0 means "before training"), so history
    entry ``index`` is epoch ``index + 1``. Code that counts from 0 inside
    (lamp's learning curves and callbacks in ``tensorlist.loops``) turns its
    index into the number it prints or records here, so that log lines,
    tables and files name an epoch alike.

    Example:
        >>> epoch_number(0)
        1
    """
    return index + 1


class HistoryRow(NamedTuple):
    """One epoch of a record's history, as every table of it shows it.

    Attributes:
        epoch: the epoch, counted from 1 (:func:`epoch_number` of its entry).
        training_loss: ``history.training_loss`` there, None when not finite.
        validation: ``history.validation`` there: the value the saver judged
            the epoch by (``tensorlist.loops`` records its smoothed loss when
            smoothing is on, the loss it picks the best weights by), None when
            the epoch was not validated.
        learning_rate: ``history.learning_rate`` there: a number, a list with
            one per parameter group, or None when unknown.
    """

    epoch: int
    training_loss: Optional[float]
    validation: Optional[float]
    learning_rate: Union[None, float, List[Optional[float]]]


def history_rows(record, *, file=None, field_prefix: str = "") -> List[HistoryRow]:
    """The rows of ``record``'s history, one per epoch done, each a :class:`HistoryRow`.

    The one place a record's history becomes per-epoch rows: ``tensorlist
    record``, the loops' demo and the exports read them here. ``record`` is
    validated first (:func:`validate_training_record`), so a malformed one is
    a FormatError naming ``file`` and the field, never a KeyError.

    Raises:
        TypeError: ``record`` is not a mapping.
        FormatError: the record is invalid (naming the field).
    """
    validate_training_record(record, file=file, field_prefix=field_prefix)
    hist = record["history"]
    return [HistoryRow(epoch_number(i), loss, val, lr)
            for i, (loss, val, lr) in enumerate(zip(hist["training_loss"], hist["validation"], hist["learning_rate"]))]


def _cell(value) -> str:
    return "-" if value is None else f"{value:.6g}"


def history_table(record, *, file=None, field_prefix: str = "") -> List[str]:
    """The lines of the table of ``record``'s history: a header, then one line per :func:`history_rows` row.

    Columns: epoch (from 1), training loss, validation, learning rate (the
    groups' rates joined by ", "); ``-`` where a value is null. ``tensorlist
    record`` and the loops' demo print exactly these lines.
    """
    lines = [f"{'epoch':>5}  {'training loss':>14}  {'validation':>12}  learning rate"]
    for row in history_rows(record, file=file, field_prefix=field_prefix):
        lr = row.learning_rate
        rate = ", ".join(_cell(x) for x in lr) if isinstance(lr, list) else _cell(lr)
        lines.append(f"{row.epoch:>5}  {_cell(row.training_loss):>14}  {_cell(row.validation):>12}  {rate}")
    return lines


def is_training_record(value) -> bool:
    """True for a training record, as a :class:`TrainingRecord` or the dict read from JSON.

    It looks only at the version marker (``format`` is
    ``"tensorlist.training-record/<n>"``, any version ``n``); use
    :func:`validate_training_record` to check the content.

    Example:
        >>> is_training_record({"format": "tensorlist.training-record/1"})
        True
        >>> is_training_record({"training": {}})
        False
    """
    if not isinstance(value, Mapping):
        return False
    marker = value.get("format")
    return isinstance(marker, str) and bool(_FORMAT_RE.match(marker))


# --------------------------------------------------------------------------
# the record object


_SECTIONS = frozenset({"environment", "initial_weights", "train", "validation", "epochs", "weights", "history"})


class _Section:
    """Attribute access to one section of a record (``record.epochs.done``)."""

    __slots__ = ("_data",)

    def __init__(self, data: dict) -> None:
        object.__setattr__(self, "_data", data)

    def __getattr__(self, name):
        try:
            value = self._data[name]
        except KeyError:
            raise AttributeError(name) from None
        return _Section(value) if isinstance(value, dict) and name == "origin" else value

    def __getitem__(self, key):
        return self._data[key]

    def __eq__(self, other):
        return self._data == (other._data if isinstance(other, _Section) else other)

    def __repr__(self) -> str:
        return repr(self._data)


class TrainingRecord(dict):
    """A training record: a plain dict of JSON values that also reads by attribute.

    ``record.epochs.done`` and ``record["epochs"]["done"]`` are the same; the
    specs (``record.solver``, ``record.optimizer``) stay plain dicts. It is
    saved as plain JSON (:meth:`to_json`) and read back with
    :func:`~tensorlist.provenance.record.read_training_record`.

    Example:
        >>> TrainingRecord({"epochs": {"asked": 5, "done": 3}}).epochs.done
        3
    """

    __slots__ = ()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            value = self[name]
        except KeyError:
            raise AttributeError(f"training record has no field {name!r}") from None
        return _Section(value) if name in _SECTIONS and isinstance(value, dict) else value

    def to_json(self, *, indent: Optional[int] = None) -> str:
        """The record as strict JSON text (NaN/Infinity raise ValueError)."""
        return json.dumps(self, allow_nan=False, ensure_ascii=False, indent=indent)

    def validate(self) -> None:
        """Same as :func:`validate_training_record` (self)."""
        validate_training_record(self)


# --------------------------------------------------------------------------
# validation


def _dotted(value, pointer: Optional[str], prefix: str) -> str:
    """The record-style field name (``a.b[0]``) of the JSON pointer ``pointer`` into ``value``."""
    if pointer is None:
        return prefix
    if pointer == "/" and not (isinstance(value, Mapping) and "" in value):
        return prefix  # check_json names the root "/"
    path, node = prefix, value
    for token in pointer_tokens(pointer):
        if isinstance(node, (list, tuple)):
            index = array_index(token)  # check_json's own pointer: always an index of this list
            path, node = join(path, index), node[index]
        else:
            path, node = join(path, token), node[token]
    return path


def check_strict_json(value, where: str = "", file=None) -> None:
    """Raises FormatError at a value strict JSON cannot hold, naming the field in dotted form.

    The rule is ``_base.jsonio.check_json`` (the package's one strict-JSON check);
    only the field's name is translated from a JSON pointer to the record's
    form, below ``where``.

    Example:
        >>> check_strict_json({"history": {"training_loss": [1.0, float("nan")]}}, "training")
        Traceback (most recent call last):
        ...
        tensorlist.errors.FormatError: field 'training.history.training_loss[1]': nan is not a JSON number (NaN and Infinity are not JSON)
    """
    try:
        check_json(value, "", file=file)
    except FormatError as e:
        raise FormatError(e.reason, file=file, field=_dotted(value, e.field, where) or None) from e


_RANK = {"required": 0, "additionalProperties": 1, "false": 2, "type": 3, "const": 4, "enum": 5}


def _schema_error(error, root, prefix: str, file) -> FormatError:
    """A FormatError naming the field of one jsonschema error."""
    path = prefix
    for part in error.absolute_path:
        path = join(path, part)
    kind = error.validator
    if kind == "required":
        missing = [k for k in error.validator_value if isinstance(error.instance, Mapping) and k not in error.instance]
        return FormatError("missing required field", file=file, field=join(path, missing[0]) if missing else path)
    if kind == "additionalProperties":
        allowed = list((error.schema.get("properties") or {}).keys())
        extra = [k for k in error.instance if k not in allowed] if isinstance(error.instance, Mapping) else []
        where = join(path, extra[0]) if extra else path
        hint = f" (allowed: {', '.join(allowed)})" if allowed else ""
        return FormatError(f"unexpected field{hint}", file=file, field=where)
    if "propertyNames" in error.schema_path:
        return FormatError(
            "not allowed here: a solver's parameters leave out the model, the optimizer and where it "
            "ran (device, verbose, save_folder)",
            file=file, field=join(path, error.instance),
        )
    if error.schema is False or kind is None:
        # A property whose schema is `false`: the error sits on the parent object.
        parent = root
        for part in error.absolute_path:
            parent = parent[part]
        key = next((k for k, v in parent.items() if v is error.instance), None) if isinstance(parent, Mapping) else None
        if key is None and isinstance(parent, Mapping):
            key = next((k for k, v in parent.items() if v == error.instance), None)
        hint = f" when 'from' is {parent['from']!r}" if isinstance(parent, Mapping) and "from" in parent else ""
        return FormatError(f"not allowed{hint} (see the schema's description of {path or 'the record'})",
                           file=file, field=join(path, key) if key is not None else path or None)
    value = error.validator_value
    if kind == "type":
        types = [value] if isinstance(value, str) else list(value)
        reason = f"expected {' or '.join(types)}, got {short(error.instance)}"
    elif kind == "const":
        reason = f"expected {value!r}, got {short(error.instance)}"
    elif kind == "enum":
        reason = f"expected one of {', '.join(repr(v) for v in value)}; got {short(error.instance)}"
    elif kind == "pattern":
        what = "64 lowercase hex digits" if "0-9a-f" in value and "64" in value else f"a string matching {value!r}"
        reason = f"expected {what}, got {short(error.instance)}"
    elif kind in ("minimum", "exclusiveMinimum"):
        reason = f"expected at least {value!r}, got {short(error.instance)}"
    elif kind == "minLength":
        reason = "must not be empty"
    elif kind == "minItems":
        reason = f"must have at least {value} entries"
    else:
        reason = error.message
    return FormatError(reason, file=file, field=path or None)


#: The most schema errors looked at to pick the one reported: a hostile record's
#: hundreds of thousands of errors would otherwise all be kept (each holds its
#: instance, schema and paths).
MAX_SCHEMA_ERRORS = 64


def _raise_schema_errors(name: str, value, prefix: str, file, validator=None) -> None:
    validator = validator or schema_validator(name)
    errors = list(itertools.islice(validator.iter_errors(value), MAX_SCHEMA_ERRORS))
    if errors:
        best = min(errors, key=lambda e: (_RANK.get(e.validator, 9), len(e.absolute_path), list(map(str, e.absolute_path))))
        raise _schema_error(best, value, prefix, file)


def _cross_checks(record: Mapping, prefix: str, file) -> None:
    """What JSON Schema cannot say: list lengths and epochs against each other."""
    done = record["epochs"]["done"]
    hist = record["history"]
    for key in ("training_loss", "validation", "learning_rate"):
        if len(hist[key]) != done:
            raise FormatError(
                f"has {len(hist[key])} entries but epochs.done is {done} (one entry per epoch done)",
                file=file, field=join(join(prefix, "history"), key),
            )
    weights = record["weights"]
    if weights["epoch"] > done:
        raise FormatError(f"epoch {weights['epoch']} is after the last epoch done ({done})",
                          file=file, field=join(prefix, "weights.epoch"))
    groups = record["optimizer"]["parameter_groups"]
    n_groups = 1 if groups is None else len(groups)
    for i, lr in enumerate(hist["learning_rate"]):
        where = join(join(prefix, "history.learning_rate"), i)
        if n_groups == 1 and isinstance(lr, list):
            raise FormatError("expected a number or null: the optimizer has one parameter group",
                              file=file, field=where)
        if n_groups > 1 and isinstance(lr, list) and len(lr) != n_groups:
            raise FormatError(f"expected {n_groups} learning rates (one per parameter group), got {len(lr)}",
                              file=file, field=where)
        if n_groups > 1 and not isinstance(lr, list) and lr is not None:
            raise FormatError(f"expected a list of {n_groups} learning rates (one per parameter group)",
                              file=file, field=where)
    if record["validation"] is None:
        for i, v in enumerate(hist["validation"]):
            if v is not None:
                raise FormatError("is a number but the record has no validation (validation is null)",
                                  file=file, field=join(join(prefix, "history.validation"), i))
        if weights["kind"] == "best_validation":
            raise FormatError("is 'best_validation' but the record has no validation (validation is null)",
                              file=file, field=join(prefix, "weights.kind"))
    else:
        data = record["validation"]["dataset_params"]
        if data is not None:
            _raise_schema_errors("dataset-params.schema.json", data, join(prefix, "validation.dataset_params"), file)


_RECORD_SCHEMA = "training-record.schema.json"
_ITEMS = dict(HISTORY_LISTS)


@functools.lru_cache(maxsize=None)
def _item_validator(key: str):
    """The validator of one history list's entries: the shipped schema's own ``items`` rule."""
    full = schema_validator(_RECORD_SCHEMA)
    return full.evolve(schema=full.schema["properties"]["history"]["properties"][key]["items"])


def _check_history_entries(hist: Mapping, where: str, file) -> None:
    """Each history list's entries, in one pass each: the first bad entry raises.

    ``fastcheck.suspects`` screens a list at C speed; an entry it names is
    judged by the reference checks (strict JSON, then the schema's item
    rule), so the error is the one the whole-record checks would give.
    """
    for key, lists in HISTORY_LISTS:
        values = hist.get(key)
        if not isinstance(values, list):
            continue  # the schema says what is wrong with it
        for i in suspects(values, lists):
            entry_where = join(join(where, key), i)
            check_strict_json(values[i], entry_where, file)
            _raise_schema_errors(_RECORD_SCHEMA, values[i], entry_where, file, _item_validator(key))


def validate_training_record(record, *, file=None, field_prefix: str = "") -> None:
    """Checks a training record against ``schemas/training-record.schema.json``.

    In order: the version marker; strict JSON (no NaN/Infinity, string keys,
    plain JSON types) of all but the history's entries; the history's entries
    (strict JSON and the schema's item rule, one fast pass per list); the
    schema; then what the schema cannot express (each
    history list has ``epochs.done`` entries, ``weights.epoch <= epochs.done``,
    one learning rate per parameter group, no validation values without a
    validation). Stops at the first failure.

    Args:
        record: the record (a dict or :class:`TrainingRecord`).
        file: the file it came from, named in errors.
        field_prefix: where the record sits (e.g. ``"metadata.training"``),
            prepended to the field named in errors.

    Raises:
        TypeError: ``record`` is not a mapping.
        FormatError: naming the first field at fault (``err.field``).
    """
    if not isinstance(record, Mapping):
        raise TypeError(f"a training record is a JSON object (dict), got {type(record).__qualname__}")
    marker = record.get("format")
    if isinstance(marker, str) and marker != FORMAT and _FORMAT_RE.match(marker):
        raise FormatError(f"unsupported training-record version {marker!r}; this tensorlist reads {FORMAT!r}",
                          file=file, field=join(field_prefix, "format"))
    hist = record.get("history")
    if isinstance(record, dict) and isinstance(hist, dict):
        # the history's lists apart: their entries are screened in one pass
        # (fastcheck), the rest of the record goes through the usual checks
        rest = dict(record, history={k: [] if isinstance(v, list) and k in _ITEMS else v for k, v in hist.items()})
        check_strict_json(rest, field_prefix, file)
        _check_history_entries(hist, join(field_prefix, "history"), file)
        _raise_schema_errors(_RECORD_SCHEMA, rest, field_prefix, file)
    else:
        check_strict_json(record, field_prefix, file)
        _raise_schema_errors(_RECORD_SCHEMA, record, field_prefix, file)
    _cross_checks(record, field_prefix, file)


def validate_dataset_params(dataset_params, *, file=None, field_prefix: str = "") -> None:
    """Checks a data record against ``schemas/dataset-params.schema.json`` (and strict JSON).

    Raises:
        TypeError: not a mapping.
        FormatError: naming the field at fault.
    """
    if not isinstance(dataset_params, Mapping):
        raise TypeError(f"a data record is a JSON object (dict), got {type(dataset_params).__qualname__}")
    check_strict_json(dataset_params, field_prefix, file)
    _raise_schema_errors("dataset-params.schema.json", dataset_params, field_prefix, file)

"""The history's per-epoch entries screened in one pass: the fast path of record validation.

A record holds one entry per epoch done in each of its three history lists, so
a long run's record is almost all history. Checked through jsonschema, each
entry costs ~25 µs (a million epochs: most of a minute) and every bad entry
keeps an error object (a few hundred thousand of them exhaust a GiB). Here a
whole list is screened at C speed (a set of the entries' types, one numpy
finiteness test) and, when it is not plainly good, walked in Python to name
the entries that may break the item rule, in order.

It holds no rule of its own that decides an error: ``core`` judges each entry
named here by the reference checks (strict JSON, then the schema's own item
rule) and stops at the first that fails, so the message and the field are the
schema path's. ``tests/provenance/test_record_fastcheck.py`` holds the screen to the schema:
no entry the schema or strict JSON refuses passes it.

The item rules (``schemas/training-record.schema.json``, ``history``):
``training_loss`` and ``validation`` entries are a number or null;
``learning_rate`` entries may also be a non-empty array of numbers or nulls. A
number is an int (not a bool) or a finite float (strict JSON: no NaN/Infinity).

Imports numpy only.
"""
from __future__ import annotations

import math
from itertools import chain
from typing import Iterator

import numpy as np

__all__ = ["HISTORY_LISTS", "suspects"]

#: The history's lists and whether an entry may be a list (one value per parameter group).
HISTORY_LISTS = (("training_loss", False), ("validation", False), ("learning_rate", True))

_NUMBER_OR_NULL = frozenset({float, int, type(None)})


def _good_number(value) -> bool:
    """A JSON number or null as both strict JSON (``check_json``) and the schema take it."""
    if value is None:
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, int) and not isinstance(value, bool)


def _good_entry(value, lists: bool) -> bool:
    if _good_number(value):
        return True
    # the schema's "array" is a list (a tuple is not); minItems 1
    return lists and isinstance(value, list) and len(value) > 0 and all(map(_good_number, value))


def _plain_numbers(values: list) -> bool:
    """Whether every entry is exactly a float, an int or None, and every float is finite (C speed)."""
    kinds = set(map(type, values))
    if not kinds <= _NUMBER_OR_NULL:
        return False
    if float not in kinds:
        return True  # ints of any size and nulls are JSON numbers and nulls
    floats = values if int not in kinds else [v for v in values if type(v) is float]
    finite = np.isfinite(np.array(floats, dtype=np.float64))  # None becomes NaN: count them apart
    return int(finite.size - np.count_nonzero(finite)) == floats.count(None)


def suspects(values: list, lists: bool = False) -> Iterator[int]:
    """Indexes of the entries of one history list that may break its item rule, in order.

    Yields nothing for a list of plain finite floats, ints and nulls (and, with
    ``lists``, non-empty lists of them), decided without a Python loop over
    the entries; otherwise walks the list and yields each entry that is not
    plainly good, for the caller to judge and stop at.

    Args:
        values: the history list (a ``list``).
        lists: entries may be lists of numbers (``learning_rate``).

    Example:
        >>> list(suspects([0.5, None, 3]))
        []
        >>> list(suspects([0.5, float("nan"), "x", True]))
        [1, 2, 3]
        >>> list(suspects([[0.1, 0.2], 0.3, [], [None]], lists=True))
        [2]
    """
    kinds = set(map(type, values))
    if not lists or list not in kinds:
        if _plain_numbers(values):
            return
    else:
        inner = values if kinds == {list} else [v for v in values if type(v) is list]
        scalars = [] if kinds == {list} else [v for v in values if type(v) is not list]
        if min(map(len, inner)) > 0 and _plain_numbers(list(chain.from_iterable(inner))) \
                and _plain_numbers(scalars):
            return
    for i, value in enumerate(values):
        if not _good_entry(value, lists):
            yield i

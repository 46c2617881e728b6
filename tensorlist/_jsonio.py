"""Strict JSON in and out, lamp's exact output style, and RFC 6901 pointers.

Python's ``json`` accepts duplicate keys (last wins) and the non-JSON tokens
NaN/Infinity by default; a tensor file is read by programs that trust it, so
both are rejected here. Everything written is strict JSON.
"""
from __future__ import annotations

import json
import math
from typing import Any, Iterator, List, Tuple

from .errors import FormatError

__all__ = ["loads_strict", "dumps", "dumps_lamp", "resolve_pointer", "escape_pointer", "walk"]


class _StrictError(ValueError):
    pass


def _pairs_no_duplicates(pairs):
    d = dict(pairs)
    if len(d) != len(pairs):
        seen = set()
        for k, _ in pairs:
            if k in seen:
                raise _StrictError(f"duplicate key {k!r}")
            seen.add(k)
    return d


def _reject_constant(name):
    raise _StrictError(f"{name} is not valid JSON")


def _finite_float(text):
    value = float(text)
    if math.isinf(value):
        raise _StrictError(f"number {text} is out of the float64 range")
    return value


def loads_strict(text, *, file=None) -> Any:
    """Parses JSON, rejecting duplicate keys, NaN/Infinity and out-of-range numbers.

    Raises:
        FormatError: naming ``file`` and where the text breaks the rules.
    """
    if isinstance(text, (bytes, bytearray, memoryview)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise FormatError(f"descriptor is not UTF-8 ({e.reason} at byte {e.start})", file=file) from e
    try:
        return json.loads(
            text,
            object_pairs_hook=_pairs_no_duplicates,
            parse_constant=_reject_constant,
            parse_float=_finite_float,
        )
    except _StrictError as e:
        raise FormatError(f"invalid JSON: {e}", file=file) from e
    except json.JSONDecodeError as e:
        raise FormatError(f"invalid JSON: {e.msg} at line {e.lineno} column {e.colno}", file=file) from e
    except RecursionError as e:
        raise FormatError("invalid JSON: nesting too deep", file=file) from e
    except ValueError as e:  # e.g. an integer literal above Python's int-conversion digit limit
        raise FormatError(f"invalid JSON: {e}", file=file) from e


def dumps(obj: Any) -> str:
    """Compact strict JSON (NaN/Infinity raise ValueError), UTF-8 kept as is."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


# --- lamp's exact style (jsoniter-scala defaults, lamp.md section 1.2) -------

_LAMP_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _lamp_string(s: str) -> str:
    out = ['"']
    for ch in s:
        esc = _LAMP_ESCAPES.get(ch)
        if esc is not None:
            out.append(esc)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def lamp_float(x: float) -> str:
    """A double as jsoniter-scala writes it: ``0.5``, ``123.0``, ``1.0E-4``, ``1.0E7``.

    Raises:
        ValueError: for NaN and infinities, which lamp refuses to write too.
    """
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(f"{x!r} cannot be written as JSON")
    if x == 0.0:
        return "0.0"  # -0.0 too: jsoniter only writes a sign for x < 0
    sign = "-" if x < 0 else ""
    digits, exp = _shortest_digits(abs(x))
    # value = 0.d1d2d3... * 10**exp  ->  d1.d2d3... * 10**(exp - 1)
    e10 = exp - 1
    if e10 < -3 or e10 >= 7:
        frac = digits[1:] or "0"
        return f"{sign}{digits[0]}.{frac}E{e10}"
    if e10 < 0:
        return f"{sign}0.{'0' * (-e10 - 1)}{digits}"
    whole = digits[: e10 + 1].ljust(e10 + 1, "0")
    frac = digits[e10 + 1 :] or "0"
    return f"{sign}{whole}.{frac}"


def _shortest_digits(x: float) -> Tuple[str, int]:
    """(significant digits, exponent) with x == 0.DIGITS * 10**exponent, shortest round trip."""
    r = repr(x)
    mant, _, e = r.partition("e")
    exp = int(e) if e else 0
    int_part, _, frac_part = mant.partition(".")
    digits = (int_part + frac_part).lstrip("0")
    lead_zeros = len(int_part + frac_part) - len((int_part + frac_part).lstrip("0"))
    point = len(int_part) - lead_zeros + exp
    digits = digits.rstrip("0") or "0"
    return digits, point


def dumps_lamp(obj: Any) -> str:
    """Serializes like lamp: compact, keys in the given order, non-ASCII raw, doubles jsoniter-style."""
    if obj is None:
        return "null"
    if obj is True:
        return "true"
    if obj is False:
        return "false"
    if isinstance(obj, int):
        return str(int(obj))
    if isinstance(obj, float):
        return lamp_float(obj)
    if isinstance(obj, str):
        return _lamp_string(obj)
    if isinstance(obj, dict):
        return "{" + ",".join(_lamp_string(str(k)) + ":" + dumps_lamp(v) for k, v in obj.items()) + "}"
    if isinstance(obj, (list, tuple)):
        return "[" + ",".join(dumps_lamp(v) for v in obj) + "]"
    raise TypeError(f"cannot write {type(obj).__name__} as JSON")


# --- JSON pointers (RFC 6901) -------------------------------------------------

def escape_pointer(token: str) -> str:
    return str(token).replace("~", "~0").replace("/", "~1")


def resolve_pointer(doc: Any, pointer: str, *, file=None) -> Any:
    """The value at RFC 6901 ``pointer`` in ``doc`` ("" is the whole document).

    Raises:
        FormatError: the pointer is malformed or names nothing in the document.
    """
    if pointer == "":
        return doc
    if not isinstance(pointer, str) or not pointer.startswith("/"):
        raise FormatError(f"JSON pointer {pointer!r} must be empty or start with '/'", file=file)
    node = doc
    walked = ""
    for raw in pointer[1:].split("/"):
        token = raw.replace("~1", "/").replace("~0", "~")
        walked += "/" + raw
        if isinstance(node, dict):
            if token not in node:
                raise FormatError(f"JSON pointer {pointer!r}: no key {token!r} at {walked!r}", file=file)
            node = node[token]
        elif isinstance(node, list):
            if not (token.isdigit() and (token == "0" or not token.startswith("0"))):
                raise FormatError(f"JSON pointer {pointer!r}: {token!r} is not an array index", file=file)
            i = int(token)
            if i >= len(node):
                raise FormatError(f"JSON pointer {pointer!r}: index {i} past the array's end", file=file)
            node = node[i]
        else:
            raise FormatError(f"JSON pointer {pointer!r}: {walked!r} goes into a scalar", file=file)
    return node


def walk(doc: Any, pointer: str = "") -> Iterator[Tuple[str, Any]]:
    """Yields (pointer, value) for every value in ``doc``, parents before children."""
    stack: List[Tuple[str, Any]] = [(pointer, doc)]
    while stack:
        ptr, node = stack.pop()
        yield ptr, node
        if isinstance(node, dict):
            for k in reversed(list(node)):
                stack.append((f"{ptr}/{escape_pointer(k)}", node[k]))
        elif isinstance(node, list):
            for i in range(len(node) - 1, -1, -1):
                stack.append((f"{ptr}/{i}", node[i]))

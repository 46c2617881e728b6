"""Strict JSON in and out, lamp's exact output style, and RFC 6901 pointers.

Python's ``json`` accepts duplicate keys (last wins) and the non-JSON tokens
NaN/Infinity by default; a tensor file is read by programs that trust it, so
both are rejected here. Everything written is strict JSON.
"""
from __future__ import annotations

import itertools
import json
import math
import re
from typing import Any, Callable, Iterator, List, Optional, Tuple

from tensorlist.errors import FormatError, short_repr as short

__all__ = ["loads_strict", "dumps", "dumps_lamp", "resolve_pointer", "set_at_pointer", "pointer_tokens",
           "escape_pointer", "array_index", "MAX_INDEX_DIGITS", "walk", "to_tagged", "from_tagged", "check_json"]


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


#: Deepest nesting of arrays and objects any JSON document may have: the C
#: scanner's MAX_DEPTH (csrc/descriptor.c), enforced here for every parse, so
#: that every walk over a parsed document (the package's and its users') stays
#: far inside Python's recursion limit.
MAX_DEPTH = 256


# The patterns of this module are compiled on first use (``re`` caches them): compiling all of them at
# import cost 0.3 ms, paid by every program that imports the reader, most of which never use them.

#: A JSON string. Used on text json.loads accepted: its quotes pair up, so the match is exact and linear.
_STRING = rb'"[^"\\]*(?:\\.[^"\\]*)*"'
#: What may be a number literal that rounds to +/-Infinity: an exponent of +100 or more ending where a
#: number ends, or 200 digits in a row (anything else is below 10**200 * 10**99). A text without one is
#: parsed without calling ``_finite_float`` for each float. A hex digest's "5e123" is followed by a hex
#: digit or a quote, so it does not count; each pattern starts with a literal, which ``re`` finds fast.
_EXPONENTS = tuple(e + r"\+?0*[1-9][0-9]{2,}(?![0-9a-zA-Z\"])" for e in "eE")
#: digits -> "0", "e"/"E" -> "e", "+" kept, anything else -> " ": one pass finds the candidates of both rules
_NUMBER_SHAPE = bytes(0x30 if 0x30 <= i <= 0x39 else 0x65 if i in b"eE" else 0x2B if i == 0x2B else 0x20
                      for i in range(256))


def _maybe_huge(raw: bytes, text: str) -> bool:
    """Whether the JSON text may hold a float literal out of the float64 range (see ``_EXPONENTS``)."""
    shape = raw.translate(_NUMBER_SHAPE)
    if b"0" * 200 in shape:
        return True
    # every match of _EXPONENTS has "e" or "e+" then three digits: without one, no pattern can match
    return (b"e000" in shape or b"e+000" in shape) and any(re.search(r, text) for r in _EXPONENTS)


_NOT_BRACKETS = bytes(i for i in range(256) if i not in b"[]{}")
_BRACKET_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def _depth(raw: bytes) -> int:
    """The deepest nesting of a JSON text json.loads accepted (one pass over its brackets outside strings)."""
    brackets = re.sub(_STRING, b'""', raw).translate(None, _NOT_BRACKETS)
    return max(itertools.accumulate(map(_BRACKET_STEP.__getitem__, brackets)), default=0)


def loads_strict(text, *, file=None, depth_checked: bool = False) -> Any:
    """Parses JSON, rejecting duplicate keys, NaN/Infinity, out-of-range numbers and nesting past MAX_DEPTH.

    ``depth_checked``: the caller's C scan already bounded the nesting.

    Raises:
        FormatError: naming ``file`` and where the text breaks the rules.
    """
    if isinstance(text, (bytes, bytearray, memoryview)):
        raw = bytes(text)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise FormatError(f"descriptor is not UTF-8 ({e.reason} at byte {e.start})", file=file) from e
    else:
        raw = text.encode("utf-8", "surrogatepass")
    # the per-float check only where a float may be out of range (a million-epoch record: ~2x faster)
    hooks = {"parse_float": _finite_float} if _maybe_huge(raw, text) else {}
    try:
        doc = json.loads(
            text,
            object_pairs_hook=_pairs_no_duplicates,
            parse_constant=_reject_constant,
            **hooks,
        )
    except _StrictError as e:
        raise FormatError(f"invalid JSON: {e}", file=file) from e
    except json.JSONDecodeError as e:
        raise FormatError(f"invalid JSON: {e.msg} at line {e.lineno} column {e.colno}", file=file) from e
    except RecursionError as e:
        raise FormatError(f"invalid JSON: nesting deeper than {MAX_DEPTH} levels", file=file) from e
    except ValueError as e:  # e.g. an integer literal above Python's int-conversion digit limit
        raise FormatError(f"invalid JSON: {e}", file=file) from e
    # a document with fewer brackets than the limit cannot nest deeper: skip the count
    if not depth_checked and text.count("[") + text.count("{") > MAX_DEPTH \
            and _depth(raw) > MAX_DEPTH:
        raise FormatError(f"invalid JSON: nesting deeper than {MAX_DEPTH} levels", file=file)
    return doc


def dumps(obj: Any) -> str:
    """Compact strict JSON (NaN/Infinity raise ValueError), UTF-8 kept as is."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def check_json(value: Any, where: str = "", *, file=None, skip: tuple = (), depth: int = 1) -> None:
    """Refuses, before anything is written, a value that strict JSON cannot hold exactly.

    Non-str keys (``json.dumps`` would write ``1`` and ``"1"`` both as ``"1"``,
    a duplicate key no strict reader accepts), NaN/Infinity, strings with lone
    surrogates (not encodable as UTF-8) and any type other than None, bool,
    int, float, str, list, tuple and dict, and nesting past MAX_DEPTH (it could
    not be read back). Iterative. Values of a
    type in ``skip`` are not looked into (placeholders the caller replaces).
    ``depth`` is the nesting level ``value`` will sit at in the written document.

    Raises:
        FormatError: naming the field (a JSON pointer below ``where``).
    """
    # One pass, no pointer built on the way: each entry keeps its parent's entry and its token, and the
    # pointer of the value at fault is rebuilt only for the error (a tree file's header: ~2,000 values).
    stack: List[Tuple[Any, int, Any]] = [(value, depth, None)]
    str_, int_, float_, dict_, seq = str, (bool, int), float, dict, (list, tuple)
    while stack:
        entry = stack.pop()
        v, depth = entry[0], entry[1]
        if v is None or isinstance(v, int_) or (skip and isinstance(v, skip)):
            continue
        if isinstance(v, str_):
            if not v.isascii():
                _check_utf8(v, lambda e=entry: _pointer_of(e, where), file)
        elif isinstance(v, dict_):
            if depth > MAX_DEPTH:
                raise FormatError(f"nests deeper than {MAX_DEPTH} levels, which no strict reader accepts",
                                  file=file, field=_pointer_of(entry, where) or "/")
            for k, x in v.items():
                if not isinstance(k, str_):
                    raise FormatError(f"key {k!r} is not a string (JSON keys are strings)", file=file,
                                      field=_pointer_of(entry, where) or "/")
                if not k.isascii():
                    _check_utf8(k, lambda e=entry: _pointer_of(e, where), file)
                stack.append((x, depth + 1, (entry, k)))
        elif isinstance(v, seq):
            if depth > MAX_DEPTH:
                raise FormatError(f"nests deeper than {MAX_DEPTH} levels, which no strict reader accepts",
                                  file=file, field=_pointer_of(entry, where) or "/")
            stack.extend((x, depth + 1, (entry, i)) for i, x in enumerate(v))
        elif isinstance(v, float_):
            if not math.isfinite(v):
                raise FormatError(f"{v!r} is not a JSON number (NaN and Infinity are not JSON)",
                                  file=file, field=_pointer_of(entry, where) or "/")
        else:
            raise FormatError(f"a {type(v).__module__}.{type(v).__qualname__} is not a JSON value",
                              file=file, field=_pointer_of(entry, where) or "/")


def _pointer_of(entry, where: str) -> str:
    """The JSON pointer of a ``check_json`` stack entry (its chain of parents' tokens), below ``where``."""
    tokens = []
    while entry[2] is not None:
        entry, token = entry[2]
        tokens.append(token)
    return where + "".join(f"/{escape_pointer(t)}" for t in reversed(tokens))


def _check_utf8(s: str, at, file) -> None:
    """``at``: the field's pointer, or a function giving it (built only for the error)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        field = at() if callable(at) else at
        raise FormatError(f"{s!r} is not valid Unicode ({e.reason}) and cannot be written as UTF-8",
                          file=file, field=field or "/") from None


# --- lamp's exact style (jsoniter-scala defaults, lamp's JSON writer) -------

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


def pointer_tokens(pointer: str, *, file=None) -> List[str]:
    """The unescaped reference tokens of an RFC 6901 pointer ("" has none).

    Raises:
        FormatError: not a pointer: no leading "/", or a "~" not followed by 0 or 1.
    """
    if pointer == "":
        return []
    if not isinstance(pointer, str) or not pointer.startswith("/"):
        raise FormatError(f"JSON pointer {pointer!r} must be empty or start with '/'", file=file)
    tokens = pointer[1:].split("/")
    if "~" in pointer:
        for raw in tokens:
            if re.search(_BAD_TILDE, raw):
                raise FormatError(f"JSON pointer {pointer!r}: '~' must be followed by 0 or 1 (RFC 6901)", file=file)
        tokens = [t.replace("~1", "/").replace("~0", "~") for t in tokens]
    return tokens


_BAD_TILDE = r"~(?![01])"
# An index of more digits is past the end of any array in memory; converting such text with int()
# would cost time quadratic in its length, and Python refuses past 4,300 digits with a ValueError.
MAX_INDEX_DIGITS = 18


def array_index(token: Any) -> Optional[int]:
    """The array index a text names (RFC 6901: "0" or ASCII digits without a leading zero), or None.

    The one conversion of untrusted text to an index: a valid index of more than
    ``MAX_INDEX_DIGITS`` digits is returned as ``10 ** MAX_INDEX_DIGITS``, past the end of every
    array, without converting the text; anything that is not such a text (another type included)
    is None, never an exception.
    """
    # RFC 6901 array index: "0" or ASCII digits without a leading zero (str.isdigit alone accepts "١", "²")
    if not isinstance(token, str) or not (token.isascii() and token.isdigit()) or (token[0] == "0" and token != "0"):
        return None
    return int(token) if len(token) <= MAX_INDEX_DIGITS else 10 ** MAX_INDEX_DIGITS


def _step(node: Any, token: str, pointer: str, walked: str, file) -> Any:
    if isinstance(node, dict):
        if token not in node:
            raise FormatError(f"JSON pointer {pointer!r}: no key {token!r} at {walked!r}", file=file)
        return node[token]
    if isinstance(node, list):
        i = array_index(token)
        if i is None:
            raise FormatError(f"JSON pointer {short(pointer)}: {short(token)} is not an array index", file=file)
        if i >= len(node):
            shown = token if len(token) <= MAX_INDEX_DIGITS else f"{token[:MAX_INDEX_DIGITS]}... ({len(token)} digits)"
            raise FormatError(f"JSON pointer {short(pointer)}: index {shown} past the array's end "
                              f"({len(node)} items)", file=file)
        return node[i]
    raise FormatError(f"JSON pointer {pointer!r}: {walked!r} goes into a scalar", file=file)


def resolve_pointer(doc: Any, pointer: str, *, file=None) -> Any:
    """The value at RFC 6901 ``pointer`` in ``doc`` ("" is the whole document).

    Raises:
        FormatError: the pointer is malformed or names nothing in the document.
    """
    node = doc
    walked = ""
    for token in pointer_tokens(pointer, file=file):
        walked += "/" + escape_pointer(token)
        node = _step(node, token, pointer, walked, file)
    return node


def set_at_pointer(doc: Any, pointer: str, value: Any) -> Any:
    """Replaces the value at ``pointer`` in ``doc`` (in place) and returns the document.

    ``""`` replaces the whole document: ``value`` is returned.
    """
    tokens = pointer_tokens(pointer)
    if not tokens:
        return value
    parent = resolve_pointer(doc, "".join("/" + escape_pointer(t) for t in tokens[:-1]))
    last = tokens[-1]
    if isinstance(parent, list):
        i = array_index(last)
        if i is None or i >= len(parent):
            raise FormatError(f"JSON pointer {short(pointer)}: {short(last)} is not an index of the array")
        parent[i] = value
    elif isinstance(parent, dict):
        parent[last] = value
    else:
        raise FormatError(f"JSON pointer {pointer!r} goes into a scalar")
    return doc


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


# --- tagged JSON: Python values that JSON lacks --------------------------------
#
# Optimizer and scheduler states hold tuples (betas), non-finite floats (a
# plateau's best = inf) and dicts with int keys. They are written as strict
# JSON with a one-key tag object, read back exactly by ``from_tagged``:
# {"__float__": "inf"}, {"__tuple__": [...]}, {"__dict__": [[key, value], ...]}.

_TAGS = ("__float__", "__tuple__", "__dict__")


def _tag_like(key: Any) -> bool:
    """Whether a one-key object's key could be read as a tag: any ``"__name__"`` (ours and an adapter's)."""
    return isinstance(key, str) and len(key) > 4 and key.startswith("__") and key.endswith("__")


def to_tagged(value: Any, where: str = "value", leaf: Optional[Callable[[Any, str], Any]] = None) -> Any:
    """``value`` as strict JSON, with tags for tuples, non-finite floats and non-str keys.

    Iterative (no recursion limit to hit on deep input). A dict whose one key
    looks like a tag (``"__name__"``) is written in the ``__dict__`` form, so
    an adapter's own tags (``leaf``) never meet a caller's dict of that shape.

    Args:
        value: the value.
        where: how messages name the value (keys are appended: ``where.key[0]``).
        leaf: called as ``leaf(v, where)`` for a value of any other type; its
            result is placed as it is (not walked). None: such a value is refused.

    Raises:
        TypeError: a value that is none of None, bool, int, float, str, list,
            tuple and dict (naming where it is), when ``leaf`` is None.
    """
    root: List[Any] = [None]
    stack: List[Tuple[Any, str, Any, Any]] = [(value, where, root, 0)]
    while stack:
        v, at, parent, key = stack.pop()
        if v is None or isinstance(v, (bool, str)):
            out = v
        elif isinstance(v, int):
            out = int(v)
        elif isinstance(v, float):
            out = float(v) if math.isfinite(v) else {"__float__": repr(float(v))}
        elif isinstance(v, (list, tuple)):
            items: List[Any] = [None] * len(v)
            out = items if isinstance(v, list) else {"__tuple__": items}
            for i, x in enumerate(v):
                stack.append((x, f"{at}[{i}]", items, i))
        elif isinstance(v, dict):
            if all(isinstance(k, str) for k in v) and not (len(v) == 1 and _tag_like(next(iter(v)))):
                out = {}
                for k, x in v.items():
                    out[k] = None
                    stack.append((x, f"{at}.{k}", out, k))
            else:
                pairs: List[Any] = []
                out = {"__dict__": pairs}
                for k, x in v.items():
                    pair: List[Any] = [None, None]
                    pairs.append(pair)
                    stack.append((k, at, pair, 0))
                    stack.append((x, f"{at}.{k}", pair, 1))
        elif leaf is not None:
            out = leaf(v, at)
        else:
            raise TypeError(f"{at}: cannot store a {type(v).__qualname__} as JSON")
        parent[key] = out
    return root[0]


#: The only texts ``{"__float__": ...}`` holds: to_tagged writes finite floats as plain JSON numbers.
_NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def _tag(v: dict, file, where: str) -> Optional[str]:
    """The tag of a one-key tag object (checked), or None for a plain object."""
    if len(v) != 1:
        return None
    tag = next(iter(v))
    if tag not in _TAGS:
        return None
    inner = v[tag]
    if tag == "__float__":
        ok = isinstance(inner, str) and inner in _NON_FINITE
    elif tag == "__tuple__":
        ok = isinstance(inner, list)
    else:
        ok = isinstance(inner, list) and all(isinstance(p, list) and len(p) == 2 for p in inner)
    if not ok:
        want = {"__float__": '"inf", "-inf" or "nan"', "__tuple__": "an array",
                "__dict__": "an array of [key, value] pairs"}[tag]
        raise FormatError(f"{where}: malformed tagged value {short(v, 60)}: {tag} takes {want}", file=file)
    return tag


def _tagged_children(v: Any, file, where: str) -> List[Any]:
    if isinstance(v, list):
        return v
    tag = _tag(v, file, where)
    if tag == "__float__":
        return []
    if tag == "__tuple__":
        return v["__tuple__"]
    if tag == "__dict__":
        return [x for pair in v["__dict__"] for x in pair]
    return list(v.values())


def _tagged_build(v: Any, values: List[Any], file, where: str) -> Any:
    if isinstance(v, list):
        return values
    tag = _tag(v, file, where)
    if tag == "__float__":
        return _NON_FINITE[v["__float__"]]
    if tag == "__tuple__":
        return tuple(values)
    if tag == "__dict__":
        keys = values[0::2]
        try:
            out = dict(zip(keys, values[1::2]))
        except TypeError:
            raise FormatError(f"{where}: malformed tagged value: a __dict__ key is "
                              f"{short(next(k for k in keys if not _hashable(k)), 60)}, which no dict takes",
                              file=file) from None
        if len(out) != len(keys):
            raise FormatError(f"{where}: malformed tagged value: a __dict__ holds the same key twice", file=file)
        return out
    return dict(zip(v.keys(), values))


def _hashable(k: Any) -> bool:
    try:
        hash(k)
        return True
    except TypeError:
        return False


def from_tagged(value: Any, *, file=None, where: str = "value") -> Any:
    """The Python value that :func:`to_tagged` wrote (iterative, children before parents).

    Args:
        value: parsed strict JSON.
        file: the file it was read from, named by errors.
        where: what the value is (a key, an fqn), named by errors.

    Raises:
        FormatError: a malformed tag (``{"__float__": [1]}``, ``{"__dict__": [[1]]}``, a float text other than
            inf/-inf/nan, an unhashable or repeated ``__dict__`` key), naming ``file`` and ``where``.

    Example:
        >>> from_tagged({"b": {"__tuple__": [0.9, {"__float__": "inf"}]}, "k": {"__dict__": [[1, "a"]]}})
        {'b': (0.9, inf), 'k': {1: 'a'}}
    """
    results: List[Any] = []
    work: List[Tuple[Any, bool]] = [(value, False)]
    while work:
        v, children_done = work.pop()
        if not isinstance(v, (list, dict)):
            results.append(v)
            continue
        if not children_done:
            children = _tagged_children(v, file, where)
            work.append((v, True))
            work.extend((c, False) for c in reversed(children))
            continue
        n = len(_tagged_children(v, file, where))
        values = results[len(results) - n:]
        del results[len(results) - n:]
        results.append(_tagged_build(v, values, file, where))
    return results[0]

"""The pytree structure codec (``tensorlist._base.tree``): round trips, names, the checks, render; no numpy, no jax."""
import collections

import pytest
from hypothesis import given, settings, strategies as st

from tensorlist._base import tree as _tree
from tensorlist._base.jsonio import dumps, loads_strict
from tensorlist.errors import FormatError

Point = collections.namedtuple("Point", "x y")


class Leaf:
    """A leaf the codec cannot mistake for a container (compared by identity)."""


def _leaves():
    return st.builds(Leaf)


_keys = st.one_of(st.text(max_size=4), st.integers(-3, 3))
#: Python scalars: values in the spec (``scalar`` nodes), not leaves.
_scalars = st.one_of(st.booleans(), st.integers(-2 ** 63, 2 ** 63 - 1), st.floats(allow_nan=True))
_trees = st.recursive(
    st.one_of(_leaves(), st.none(), _scalars),
    lambda kids: st.one_of(
        st.lists(kids, max_size=3),
        st.lists(kids, max_size=3).map(tuple),
        st.dictionaries(_keys, kids, max_size=3),
        st.dictionaries(_keys, kids, max_size=3).map(collections.OrderedDict),
        st.builds(Point, kids, kids),
    ),
    max_leaves=12,
)


def _same(a, b) -> bool:
    """Same structure, node types, keys (and key types) and the very same leaves (iterative)."""
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if type(x) is not type(y):
            return False
        if isinstance(x, dict):
            if [(type(k), k) for k in x] != [(type(k), k) for k in y]:
                return False
            stack.extend(zip(x.values(), y.values()))
        elif isinstance(x, (list, tuple)):
            if len(x) != len(y):
                return False
            stack.extend(zip(x, y))
        elif type(x) in (bool, int, float):
            if not (x == y or (x != x and y != y)) or str(x) != str(y):  # NaN is itself; -0.0 is not 0.0
                return False
        elif x is not y:
            return False
    return True


@settings(max_examples=150, deadline=None)
@given(_trees)
def test_round_trip(tree):
    spec, leaves = _tree.encode(tree)
    names = [n for n, _ in leaves]
    assert len(set(names)) == len(names)
    back = _tree.decode(spec, dict(leaves))
    assert _same(tree, back)
    assert _tree.check(spec, names).leaves == tuple(names)
    stored = loads_strict(dumps(spec))  # what a file holds: strict JSON (no NaN, no Infinity)
    assert _same(tree, _tree.decode(stored, dict(leaves)))


class Obj:
    """A container the codec does not know; ``_other`` flattens it (as tensorlist.jax does jax's pytree nodes)."""

    def __init__(self, a, b):
        self.a, self.b = a, b


class Key:
    """A leaf ``_key_impl`` calls a PRNG key."""


def _other(obj):
    return ("pkg.mod:Obj", ["a", "b"], [obj.a, obj.b]) if isinstance(obj, Obj) else None


def _key_impl(obj):
    return "rbg" if isinstance(obj, Key) else None


def test_pytree_and_key_nodes_through_the_callers_hooks():
    k, x = Key(), Leaf()
    spec, leaves = _tree.encode({"s": Obj(k, [x, 3])}, other=_other, key_impl=_key_impl)
    assert spec["children"][0] == {"kind": "pytree", "type": "pkg.mod:Obj", "keys": ["a", "b"], "children": [
        {"kind": "key", "name": "s/a", "impl": "rbg"},
        {"kind": "list", "children": [{"kind": "leaf", "name": "s/b/0"}, {"kind": "scalar", "type": "int",
                                                                          "value": 3}]}]}
    plan = _tree.check(spec, ["s/a", "s/b/0"])
    assert plan.key_impls == {"s/a": "rbg"} and plan.leaves == ("s/a", "s/b/0")
    assert _tree.build(plan, dict(leaves)) == {"s": {"a": k, "b": [x, 3]}}  # no target: a dict
    # replace: step index (preorder) -> the node built instead (a loader's target type, or a subtree left out)
    assert _tree.build(plan, {"s/b/0": x}, {1: lambda children: ("Obj", children), 2: lambda children: None}) \
        == {"s": ("Obj", [None, [x, 3]])}
    assert "pytree pkg.mod:Obj" in "\n".join(_tree.render(spec)) and "key<rbg> s/a" in "\n".join(_tree.render(spec))
    with pytest.raises(TypeError, match=r"tree at s/a: a PRNG key of impl 'philox': tensorlist stores keys of"):
        _tree.encode({"s": Obj(k, None)}, other=_other, key_impl=lambda o: "philox" if o is k else None)


@pytest.mark.parametrize("value, back", [(float("nan"), "nan"), (float("inf"), "inf"), (float("-inf"), "-inf"),
                                         (-0.0, -0.0), (True, True), (2 ** 63 - 1, 2 ** 63 - 1)])
def test_scalars_are_strict_json_values(value, back):
    spec, leaves = _tree.encode(value)
    assert leaves == [] and spec == {"kind": "scalar", "type": type(value).__name__, "value": back}
    assert _same(_tree.decode(loads_strict(dumps(spec)), {}), value)


def test_index_and_keys_that_print_alike_stay_apart():
    x, y, z = Leaf(), Leaf(), Leaf()
    for tree in ([x], {0: x}, {"0": x}, (x,)):
        spec, leaves = _tree.encode(tree)
        assert [n for n, _ in leaves] == ["0"]
        assert _same(_tree.decode(spec, dict(leaves)), tree)
    spec, leaves = _tree.encode({"a/b": x, "a": {"b": y, "b~1": z}})
    assert [n for n, _ in leaves] == ["a/b", "a/b~1", "a/b~1~1"]
    assert _tree.decode(spec, dict(leaves)) == {"a/b": x, "a": {"b": y, "b~1": z}}


def test_root_leaf_and_empty_containers():
    x = Leaf()
    spec, leaves = _tree.encode(x)
    assert leaves == [(_tree.ROOT_NAME, x)]
    for empty in ({}, [], (), None, collections.OrderedDict()):
        spec, leaves = _tree.encode(empty)
        assert leaves == [] and _same(_tree.decode(spec, {}), empty)


def test_namedtuple_of_an_unimported_module_comes_back_alike():
    spec, leaves = _tree.encode(Point(Leaf(), None))
    spec["type"] = "no_such_module_here:Pt"
    back = _tree.decode(spec, dict(leaves))
    assert type(back).__name__ == "Pt" and back._fields == ("x", "y") and back.y is None


@pytest.mark.parametrize("tree, match", [
    ({(1, 2): Leaf()}, r"key \(1, 2\) is a tuple"),
    ({1.5: Leaf()}, "key 1.5 is a float"),
    ({"a": {True: Leaf()}}, "tree at a: key True is a bool"),
    ({"step": 2 ** 63}, "tree at step: the int 9223372036854775808 is outside int64's range"),
    ({"step": -2 ** 63 - 1}, "outside int64's range"),
    (collections.defaultdict(list), "defaultdict.*would come back as another type"),
])
def test_encode_refuses(tree, match):
    with pytest.raises(TypeError, match=match):
        _tree.encode(tree)


def test_encode_refuses_too_deep_and_cycles():
    deep = Leaf()
    for _ in range(_tree.MAX_TREE_DEPTH + 1):
        deep = [deep]
    with pytest.raises(ValueError, match="deeper than"):
        _tree.encode(deep)
    cycle = []
    cycle.append(cycle)
    with pytest.raises(ValueError, match="or a cycle"):
        _tree.encode(cycle)


def test_deepest_tree_round_trips():
    x = Leaf()
    deep = x
    for _ in range(_tree.MAX_TREE_DEPTH):
        deep = [deep]
    spec, leaves = _tree.encode(deep)
    back = _tree.decode(spec, dict(leaves))
    for _ in range(_tree.MAX_TREE_DEPTH):
        back = back[0]
    assert back is x


def test_check_names_file_field_and_path():
    spec = {"kind": "dict", "keys": ["a"], "children": [{"kind": "list", "children": [{"kind": "set"}]}]}
    with pytest.raises(FormatError, match=r"m\.tl: field '/metadata/tree/children/0/children/0/kind': "
                                          r"tree at a/0: unknown node kind 'set'") as e:
        _tree.check(spec, [], file="m.tl", field="/metadata/tree")
    assert e.value.file == "m.tl" and e.value.field == "/metadata/tree/children/0/children/0/kind"


def test_check_extra_tensor_names_it():
    with pytest.raises(FormatError, match=r"tensor 1 \('b'\).*tensor 'b' is stored but no leaf") as e:
        _tree.check({"kind": "leaf", "name": "a"}, ["a", "b"], file="m.tl")
    assert e.value.tensor_name == "b"


def test_check_namedtuple_fields_must_match_the_class():
    spec, _ = _tree.encode(Point(None, None))
    spec["fields"] = ["y", "x"]
    with pytest.raises(FormatError, match=r"namedtuple 'test_tree:Point' has the fields \['x', 'y'\], the file "):
        _tree.check(spec, [])


def test_registered_kind():
    class Box:
        def __init__(self, items):
            self.items = dict(items)

    import sys
    nt = _tree.NodeType(kind="test.Box", module=__name__, qualname="Box", keyed=True,
                        flatten=lambda b: (list(b.items), list(b.items.values())),
                        unflatten=lambda k, c: Box(zip(k, c)))
    sys.modules[__name__].Box = Box
    try:
        _tree.register(nt)
        x = Leaf()
        spec, leaves = _tree.encode({"b": Box({"w": x})})
        assert spec["children"][0]["kind"] == "test.Box"
        back = _tree.decode(spec, dict(leaves))
        assert isinstance(back["b"], Box) and back["b"].items == {"w": x}
        with pytest.raises(ValueError, match="built-in node kind"):
            _tree.register(_tree.NodeType("dict", "m", "q", True, list, list))
    finally:
        _tree.unregister("test.Box")
        del sys.modules[__name__].Box


def test_render_shows_kinds_keys_and_info():
    spec, _ = _tree.encode({"p": Point(Leaf(), [None]), 3: (Leaf(),)})
    lines = _tree.render(spec, {"p/x": "float32 (2,)"})
    assert lines == [
        "dict",
        "├── 'p': namedtuple test_tree:Point",
        "│   ├── x: p/x  float32 (2,)",
        "│   └── y: list",
        "│       └── [0]: None",
        "└── 3: tuple",
        "    └── [0]: 3/0",
    ]
    assert _tree.render({"kind": 7, "children": 1}) == ["? {'kind': 7, 'children': 1}"]


def test_a_namedtuple_the_codec_rebuilds_has_bounded_fields_and_classes():
    # making a namedtuple class costs superlinear time in its fields; "none" children need no tensor
    n = _tree.MAX_REBUILT_FIELDS + 1
    spec = {"kind": "namedtuple", "type": "not_imported_here:Wide", "fields": [f"f{i}" for i in range(n)],
            "children": [{"kind": "none"}] * n}
    with pytest.raises(FormatError, match=rf"m\.tl: field '/fields': tree at \(root\): namedtuple "
                                          rf"'not_imported_here:Wide' has {n} fields, and its class is not imported"):
        _tree.check(spec, [], file="m.tl")
    for i in range(2 * _tree._DYNAMIC_CACHE):  # hostile files naming a new type each
        back = _tree.decode({"kind": "namedtuple", "type": f"not_imported_here:T{i}", "fields": ["a"],
                             "children": [{"kind": "none"}]}, {})
        assert type(back).__name__ == f"T{i}" and back.a is None
    assert len(_tree._DYNAMIC) <= _tree._DYNAMIC_CACHE

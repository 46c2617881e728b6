"""The suite's own rules, checked on its source: no test is skipped by accident where a framework is missing."""
import ast
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def _late_module_skips(source: str):
    """Module-level ``pytest.importorskip`` calls after a test function: they skip the tests above them too."""
    seen_test, found = False, []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
            seen_test = True
            continue
        if not seen_test or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for call in ast.walk(node):
            if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "importorskip"):
                found.append(node.lineno)
    return found


def test_the_check_finds_a_late_module_skip():
    late = "import pytest\ndef test_a():\n    pass\ntorch = pytest.importorskip('torch')\n"
    early = "import pytest\ntorch = pytest.importorskip('torch')\ndef test_a():\n    pass\n"
    inside = "import pytest\ndef test_a():\n    pass\ndef helper():\n    return pytest.importorskip('torch')\n"
    assert _late_module_skips(late) == [4] and _late_module_skips(early) == [] and _late_module_skips(inside) == []


def test_no_module_skips_the_tests_above_it():
    """A module-level importorskip after the first test skips the whole module where the framework is
    missing (the notorch leg, the foreign CPUs): put those tests in a module of their own or take the
    framework through a fixture."""
    bad = {}
    for folder, _, names in sorted(os.walk(HERE)):
        for name in sorted(names):
            if name.startswith("test_") and name.endswith(".py"):
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    lines = _late_module_skips(f.read())
                if lines:
                    bad[os.path.relpath(os.path.join(folder, name), HERE)] = lines
    assert not bad, bad


def _imported_top_names(root: str) -> set:
    """The top-level names of every module that the package's sources import."""
    names = set()
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    tree = ast.parse(f.read())
                for node in ast.walk(tree):
                    if isinstance(node, ast.Import):
                        names.update(a.name.split(".")[0] for a in node.names)
                    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                        names.add(node.module.split(".")[0])
    return names


def test_no_test_folder_shadows_a_package_the_code_imports():
    """pytest puts ``tests/`` on sys.path (the suite has no ``__init__.py``), so a folder ``tests/vllm``
    is a namespace package ``vllm``: ``import vllm`` finds it where vLLM is absent, and the code takes
    vLLM for installed. Test folders are named for a concept, never for a package."""
    imported = _imported_top_names(os.path.join(os.path.dirname(HERE), "tensorlist"))
    assert {"vllm", "torch", "numpy"} <= imported  # the check sees the package's imports
    folders = {d for d in os.listdir(HERE) if os.path.isdir(os.path.join(HERE, d)) and not d.startswith((".", "_"))}
    assert not folders & imported, sorted(folders & imported)

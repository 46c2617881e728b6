"""What `pip install .` ships: every sub-package of tensorlist is listed for setuptools."""
import os
import re

ROOT = os.path.join(os.path.dirname(__file__), "..")


def test_every_subpackage_is_in_pyproject_packages():
    text = open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8").read()
    listed = set(re.findall(r'"(tensorlist[\w.]*)"', re.search(r"^packages = \[(.*?)\]", text, re.M | re.S).group(1)))
    found = {"tensorlist.schemas"}
    for dirpath, _, files in os.walk(os.path.join(ROOT, "tensorlist")):
        if "__init__.py" in files:
            rel = os.path.relpath(dirpath, ROOT)
            found.add(rel.replace(os.sep, "."))
    assert listed == found


def test_declared_pythons_are_the_ones_ci_tests():
    text = open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8").read()
    declared = re.findall(r'"Programming Language :: Python :: (3\.\d+)"', text)
    matrix = open(os.path.join(ROOT, ".ci", "pythons.sh"), encoding="utf-8").read()
    legs = re.search(r"^ALL_LEGS=\((.*)\)$", matrix, re.M).group(1).split()
    tested = {"3.11"} | {leg for leg in legs if re.fullmatch(r"3\.\d+", leg)}  # 3.11: the main run, .ci/run
    assert set(declared) == tested, (declared, tested)
    oldest = min(tested, key=lambda v: tuple(map(int, v.split("."))))
    assert f'requires-python = ">={oldest}"' in text


README_TEST_COMMAND = [line for line in open(os.path.join(ROOT, "README.md"), encoding="utf-8")
                       if line.startswith('pip install -e ".[test')][0]


def _requirements(text: str, extra: str) -> list:
    body = re.search(rf"^{extra} = \[(.*?)\]$", text, re.M | re.S).group(1)
    return re.findall(r'"([^"]+)"', body)


def test_framework_floors_are_what_the_main_run_installs():
    """The jax, orbax, mlx, tensorflow and sign extras' floors are pinned exactly for Python 3.11 (.ci/run's Python).

    So the full suite runs on each framework's declared floor; the test extra installs the frameworks with
    the same floors (tensorflow-cpu standing for tensorflow on Linux).
    """
    text = open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8").read()
    from packaging.markers import Marker  # pytest's own dependency

    main_run = {"python_version": "3.11", "python_full_version": "3.11.0", "sys_platform": "linux",
                "platform_machine": "x86_64"}
    pins = {}
    for line in open(os.path.join(ROOT, ".ci", "constraints.txt"), encoding="utf-8"):
        m = re.match(r"^([A-Za-z0-9_.-]+)==([^;\s]+)\s*(?:;\s*(.*))?$", line.strip())
        if m and (m.group(3) is None or Marker(m.group(3)).evaluate(main_run)):
            pins[m.group(1).lower()] = m.group(2)
    test_extra = {re.split(r"[\[>=;\s]", r, 1)[0].lower(): r for r in _requirements(text, "test")}
    checked = 0
    for extra in ("jax", "orbax", "mlx", "tensorflow", "lightning", "huggingface", "sign"):
        for requirement in _requirements(text, extra):
            name, floor = re.match(r"([A-Za-z0-9_.-]+)>=([0-9][0-9A-Za-z.]*)\s*(;|$)", requirement).groups()[:2]
            if name in ("torch", "safetensors"):  # their floors are the torch and test extras', tested by the floors leg
                continue
            pinned = "tensorflow-cpu" if name == "tensorflow" else name
            assert pins.get(pinned) == floor, (extra, requirement, pins.get(pinned))
            if extra in ("lightning", "huggingface"):  # the README's test command installs these extras themselves
                assert extra in README_TEST_COMMAND, README_TEST_COMMAND
            else:
                assert f">={floor}" in test_extra[pinned], (extra, requirement, test_extra[pinned])
            checked += 1
    assert checked == 10


HIDE_FRAMEWORKS = """
import importlib, os, runpy, sys
for name in ("torch", "jax", "jaxlib", "flax", "orbax", "mlx", "tensorflow", "lightning", "pytorch_lightning",
             "transformers", "accelerate", "cryptography"):
    sys.modules[name] = None  # find_spec then answers None, and `import name` raises ImportError
ignored = [os.path.normpath(p) for p in runpy.run_path("conftest.py")["collect_ignore"]]
failed = []
for dirpath, _, files in os.walk("tensorlist"):
    for f in sorted(files):
        path = os.path.normpath(os.path.join(dirpath, f))
        if not f.endswith(".py") or any(path == p or path.startswith(p + os.sep) for p in ignored):
            continue
        module = path[:-3].replace(os.sep, ".").replace(".__init__", "")
        try:
            importlib.import_module(module)
        except ImportError as e:
            failed.append(f"{module}: {e}")
print("\\n".join(failed))
"""


def test_doctest_collection_imports_no_hidden_framework():
    """Without torch (and every other framework), each module --doctest-modules still collects imports cleanly.

    The root conftest.py lists the adapters it leaves out; a module that imports a framework and is missing from
    that list fails the whole collection of the `notorch` CI leg.
    """
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", HIDE_FRAMEWORKS], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", "conftest.py's collect_ignore misses:\n" + out.stdout

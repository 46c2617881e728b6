"""What `pip install .` ships: every sub-package of tensorlist is listed for setuptools."""
import os
import re

ROOT = os.path.join(os.path.dirname(__file__), "..")


def test_every_subpackage_is_in_pyproject_packages():
    text = open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8").read()
    listed = set(re.findall(r'"(tensorlist[\w.]*)"', re.search(r"^packages = \[(.*)\]", text, re.M).group(1)))
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

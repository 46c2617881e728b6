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

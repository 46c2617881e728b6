"""Print pip constraints that pin the lower bounds pyproject.toml declares, exactly.

    python3 .ci/floors.py torch remote plot > floors.txt   # the dependencies and these extras
    pip install -c floors.txt -e ".[torch,remote,plot,test]"

The floors are declared once, in pyproject.toml (``name>=X``); this turns each into
``name==X`` so that one CI leg (.ci/pythons.sh, leg "floors") installs the oldest
versions the package claims to work with and runs the suite on them. A runtime or
extra requirement without a ``>=`` floor is an error: a floor nobody tests is not
a floor. The build-system's requirements are not pinned (pip builds in isolation).
Needs Python >= 3.11 (tomllib); CI's python3 is 3.11.
"""
import pathlib
import re
import sys

try:
    import tomllib
except ImportError:  # Python < 3.11
    sys.exit(f"{sys.argv[0]}: needs Python >= 3.11 (tomllib); this is {sys.version.split()[0]}")

PYPROJECT = pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml"
# name, optional [extras], then exactly one lower bound and nothing else
_FLOOR = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*>=\s*([0-9][0-9A-Za-z.]*)\s*$")


def floors(project: dict, extras: list) -> dict:
    """Map each requirement's name (lower-cased) to its declared floor.

    Args:
        project: the ``[project]`` table of pyproject.toml.
        extras: the optional-dependency groups to include besides ``dependencies``.

    Returns:
        dict name -> floor version; a name declared twice must have one floor.

    Raises:
        SystemExit: naming the requirement that has no ``>=`` floor, or two different floors.
    """
    groups = {"dependencies": project["dependencies"]}
    for extra in extras:
        groups[f"optional-dependencies.{extra}"] = project["optional-dependencies"][extra]
    out = {}
    for group, requirements in groups.items():
        for requirement in requirements:
            m = _FLOOR.match(requirement)
            if m is None:
                sys.exit(f"{PYPROJECT.name}: [project] {group}: {requirement!r} declares no single '>=' floor")
            name, version = m.group(1).lower().replace("_", "-"), m.group(3)
            if out.setdefault(name, version) != version:
                sys.exit(f"{PYPROJECT.name}: [project] {group}: {name} has two floors, {out[name]} and {version}")
    return out


def main(argv: list) -> int:
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    extras = argv or sorted(project["optional-dependencies"])
    for name, version in sorted(floors(project, extras).items()):
        print(f"{name}=={version}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Child processes timed as an installed program's, for the benchmarks that time fresh interpreters.

pip compiles a package's bytecode when it installs it, so a user's first ``import tensorlist`` never
compiles source; the peers in site-packages are compiled too. A checkout run with
``PYTHONDONTWRITEBYTECODE`` set (as some CI and sandboxes are) would compile tensorlist's modules in
every child, 10+ ms a load that no installed program pays. :func:`installed_env` compiles the
checkout's package once (``__pycache__`` is git-ignored) and returns the environment for the children.
"""
import compileall
import os
from typing import Dict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def installed_env(**extra: str) -> Dict[str, str]:
    """``os.environ`` plus ``extra``, the checkout first on ``PYTHONPATH``, its bytecode compiled and kept."""
    compileall.compile_dir(os.path.join(ROOT, "tensorlist"), quiet=2)
    env = dict(os.environ, **extra)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env

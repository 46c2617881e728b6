"""The README is executable documentation: its commands and its API tour must work."""
import pathlib
import re

import numpy as np

import tensorlist as tl

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _blocks(lang):
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def _setup_commands():
    setup = README.split("## Set up", 1)[1]
    commands = [line for line in re.findall(r"```sh\n(.*?)```", setup, flags=re.S)[0].splitlines() if line.strip()]
    assert len(commands) == 2, commands
    return commands


def test_ci_runs_exactly_the_readme_setup_commands():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    for c in _setup_commands():
        assert c in ci, f"README command {c!r} is not run verbatim by .ci/run"


def test_python_matrix_installs_with_the_readme_setup_commands():
    # .ci/pythons.sh runs the README's installs on every other Python, then its own pytest selection
    matrix = (ROOT / ".ci" / "pythons.sh").read_text()
    for c in _setup_commands():
        install = c.split(" && ")[0]
        assert install.startswith("pip install ") and re.search(rf"^    {re.escape(install)}( &&|$)", matrix, re.M), install


def test_ci_torch_is_pinned_on_every_python():
    # the README's installs take CI's constraints, which pin torch for every Python (never an unpinned,
    # multi-GB CUDA torch in CI), while the package's metadata keeps a range
    for c in _setup_commands():
        assert " -c .ci/constraints.txt" in c, c
    pins = re.findall(r"^torch==\S+; python_version (<|>=) \"3\.(\d+)\"$",
                      (ROOT / ".ci" / "constraints.txt").read_text(), flags=re.M)
    assert sorted(pins) == [("<", "10"), (">=", "10")], pins
    assert '"torch>=2.8"' in (ROOT / "pyproject.toml").read_text()


def test_api_tour_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = _blocks("python")[0]
    namespace = {}
    exec(compile(code, "README.md", "exec"), namespace)
    out = capsys.readouterr().out
    assert "broken.tl None None byteOffset" in out  # the FormatError attributes were printed
    assert tl.load("big.tl")["layer.0"][3000, 0] == np.float32(2.0)
    assert list(namespace["everything"]) == ["epoch", "model", "optimizer"]
    assert namespace["opt"]["0"].shape == (3,)
    assert (tmp_path / "x.lamp.data").stat().st_size == 32


def test_frameworks_tour_runs(tmp_path, monkeypatch):
    """The README's framework block, as a newcomer would paste it (JAX, Orbax, DLPack, MLX, TensorFlow)."""
    import pytest

    for name in ("jax", "orbax.checkpoint", "mlx.core", "tensorflow"):
        pytest.importorskip(name, reason=f"the README's framework tour needs {name} (the test extra installs it)")
    monkeypatch.chdir(tmp_path)
    code = README.split("## Frameworks: JAX, Orbax, MLX, TensorFlow, DLPack", 1)[1]
    code = re.findall(r"```python\n(.*?)```", code, flags=re.S)[0]
    namespace = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert str(namespace["params"]["dense"]["kernel"].dtype) == "bfloat16"
    assert namespace["params"]["blocks"][1] is None
    assert float(namespace["x"].sum()) == 8.0 and namespace["state"]["w"][0, 0] == np.float32(0.5)
    assert tl.load("model.tl")["w"][0, 0] == np.float32(1.0)  # the copy-on-write writes never reached the file
    assert namespace["k"].shape == (4, 4) and str(namespace["w"].dtype) == "mlx.core.bfloat16"

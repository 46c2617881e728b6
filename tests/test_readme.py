"""The README is executable documentation: its commands and its API tour must work."""
import pathlib
import re

import numpy as np

import tensorlist as tl

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _blocks(lang):
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def test_ci_runs_exactly_the_readme_setup_commands():
    setup = README.split("## Set up", 1)[1]
    commands = [line for line in re.findall(r"```sh\n(.*?)```", setup, flags=re.S)[0].splitlines() if line.strip()]
    assert len(commands) == 2, commands
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    for c in commands:
        assert c in ci, f"README command {c!r} is not run verbatim by .ci/run"
    assert "torch==2.13.0" in (ROOT / "pyproject.toml").read_text()  # never an unpinned CUDA torch in CI


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

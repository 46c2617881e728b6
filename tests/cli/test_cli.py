"""The command line, run for real: ``python -m tensorlist ...`` in a subprocess (and once in a terminal)."""
import json
import os
import pty
import select
import subprocess
import sys
import time

import numpy as np
import pytest

import tensorlist as tl
from _compat import bfloat16_bits
from _record_support import full_record
from tensorlist._base import dtypes

pytestmark = pytest.mark.slow  # every test runs python -m tensorlist in a child

COMMANDS = ["demo", "inspect", "validate", "convert", "diff", "record"]


def run(*args, cwd=None, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "tensorlist", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=timeout)


#: The CLI in a child where ``import ml_dtypes`` and ``import torch`` fail, as on s390x (no wheel of either).
WITHOUT_ML_DTYPES = ("import sys\nsys.modules['ml_dtypes'] = sys.modules['torch'] = None\n"
                     "from tensorlist.cli import main\nsys.exit(main(sys.argv[1:]))\n")


def run_without_ml_dtypes(*args):
    return subprocess.run([sys.executable, "-c", WITHOUT_ML_DTYPES, *map(str, args)], capture_output=True,
                          text=True, timeout=300)


def _one_error_line(p, command):
    assert p.stdout == "" or command in ("validate", "diff")
    assert "Traceback" not in p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith(f"tensorlist {command}: error: ")
    return lines[0]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_has_examples(command):
    p = run(command, "--help")
    assert p.returncode == 0
    assert "examples:" in p.stdout and f"tensorlist {command}" in p.stdout.split("examples:")[1]


def test_top_level_help_lists_every_command():
    p = run("--help")
    assert p.returncode == 0 and all(c in p.stdout for c in COMMANDS)


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "model.tl"
    tl.save(path, {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "bf": bfloat16_bits(np.ones(4))},
            metadata={"training": full_record(), "dataset_params": {"name": "toy"}, "note": "hi"})
    return path


def test_inspect_with_training_record(model):
    p = run("inspect", model)
    assert p.returncode == 0
    assert "bfloat16" in p.stdout and "(2, 3)" in p.stdout
    assert "training record:" in p.stdout
    assert "weights: best_validation after epoch 2" in p.stdout and "epochs: 3 done of 10 asked" in p.stdout
    p = run("inspect", "--json", model)
    out = json.loads(p.stdout)
    assert [t["name"] for t in out["tensors"]] == ["w", "bf"]
    assert out["training_record"]["best validation"] == 0.25


def test_inspect_missing_file_is_one_line(tmp_path):
    p = run("inspect", tmp_path / "nope.tl")
    assert p.returncode == 1
    assert "nope.tl" in _one_error_line(p, "inspect")


def test_validate_one_line_per_problem(tmp_path, model):
    tl.save(tmp_path / "ok.tl", {"a": np.ones(3)})
    bad = tmp_path / "bad.tl"
    desc = json.loads((tmp_path / "ok.tl").read_text())
    desc["tensors"][0]["byteOffset"] = 4
    bad.write_text(json.dumps(desc))
    broken = tmp_path / "broken.tl"
    broken.write_text('{"tensors": [], "location": "x",\n "byteOffset": 0,\n "byteOffset": 1}')
    p = run("validate", "--verify", model, bad, broken, tmp_path / "ok.tl")
    assert p.returncode == 1
    lines = p.stdout.splitlines()  # the files that are valid, in order; each invalid one an error line on stderr
    assert len(lines) == 2
    assert lines[0].startswith(f"{model}: ok") and "checksums verified" in lines[0]
    assert lines[1].startswith(f"{tmp_path / 'ok.tl'}: ok")
    errors = p.stderr.splitlines()
    assert [e.split(": ")[:2] for e in errors] == [["tensorlist validate", "error"]] * 2
    assert errors[0].startswith(f"tensorlist validate: error: {bad}: ")
    assert errors[1].startswith(f"tensorlist validate: error: {broken}: ")
    # a flipped byte is found with --verify only
    data = tl.open(tmp_path / "ok.tl").descriptor.data_path
    with open(data, "r+b") as f:
        f.write(b"\x01")
    assert run("validate", tmp_path / "ok.tl").returncode == 0
    p = run("validate", "--verify", tmp_path / "ok.tl")
    assert p.returncode == 1 and p.stdout == "" and "CRC32C" in p.stderr and len(p.stderr.splitlines()) == 1


def test_convert_and_diff(tmp_path, model):
    p = run("convert", model, tmp_path / "m.safetensors")
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""  # no progress bar when stderr is not a terminal
    p = run("diff", model, tmp_path / "m.safetensors")
    assert p.returncode == 0 and p.stdout.strip() == "same: 2 tensors identical, 0 differ"
    p = run("convert", tmp_path / "m.safetensors", tmp_path / "hf" / "model.safetensors.index.json",
            "--shard-size", "20B")  # hf/ is made
    assert p.returncode == 0, p.stderr
    assert len([n for n in os.listdir(tmp_path / "hf") if n.endswith(".safetensors")]) == 2
    p = run("convert", tmp_path / "hf" / "model.safetensors.index.json", tmp_path / "w.bin", "--to", "npz")
    assert p.returncode == 0, p.stderr
    p = run("diff", tmp_path / "w.bin", model, "--a-format", "npz")
    assert p.returncode == 0, p.stdout + p.stderr


def test_diff_reports_and_exit_codes(tmp_path):
    tl.save(tmp_path / "a.tl", {"w": np.array([1.0, 2.0]), "x": np.zeros(2), "a_only": np.ones(1)})
    tl.save(tmp_path / "b.tl", {"w": np.array([1.0, 2.5]), "x": np.zeros(3, np.float32)})
    p = run("diff", tmp_path / "a.tl", tmp_path / "b.tl")
    assert p.returncode == 1
    assert f"only in {tmp_path / 'a.tl'}: a_only" in p.stdout
    assert "dtype differs: x: float64 != float32" in p.stdout
    assert "shape differs: x: [2] != [3]" in p.stdout
    assert "values differ: w: max abs difference 0.5" in p.stdout
    p = run("diff", tmp_path / "a.tl", tmp_path / "missing.tl")
    assert p.returncode == 2
    _one_error_line(p, "diff")


def test_convert_corrupt_source_no_destination(tmp_path):
    (tmp_path / "bad.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    p = run("convert", tmp_path / "bad.safetensors", tmp_path / "out.tl")
    assert p.returncode == 1
    assert "bad.safetensors" in _one_error_line(p, "convert")
    assert sorted(os.listdir(tmp_path)) == ["bad.safetensors"]
    p = run("convert", tmp_path / "bad.safetensors", tmp_path / "out.tl", "--from", "xyz")
    assert p.returncode == 1 and "unknown format 'xyz'" in _one_error_line(p, "convert")
    for size in ("lots", "1e999GB", "nanGB", "inf", "0MB", "9" * 5000 + "TB"):
        p = run("convert", tmp_path / "a", tmp_path / "b", "--shard-size", size)
        assert p.returncode == 2 and "is not a size" in p.stderr and "Traceback" not in p.stderr, size


def test_convert_refuses_pickles(tmp_path):
    torch = pytest.importorskip("torch")
    import datetime

    torch.save({"w": torch.ones(2), "when": datetime.date(2020, 1, 1)}, tmp_path / "x.pt")
    p = run("convert", tmp_path / "x.pt", tmp_path / "x.tl")
    assert p.returncode == 1
    assert "refused" in _one_error_line(p, "convert")
    assert not (tmp_path / "x.tl").exists()


def test_record_print_json_and_plot(tmp_path, model):
    pytest.importorskip("matplotlib")
    p = run("record", model)
    assert p.returncode == 0, p.stderr
    assert "epoch" in p.stdout and "0.001, 0.01" in p.stdout and "optimizer: torch.optim.adam.Adam" in p.stdout
    assert json.loads(run("record", model, "--json").stdout)["epochs"] == {"asked": 10, "done": 3}
    out = tmp_path / "curves.png"
    p = run("record", model, "--plot", out)
    assert p.returncode == 0, p.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    tl.save(tmp_path / "plain.tl", {"a": np.ones(1)})
    p = run("record", tmp_path / "plain.tl")
    assert p.returncode == 1 and "no training record" in _one_error_line(p, "record")


def test_record_plot_without_matplotlib(tmp_path, model):
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "matplotlib.py").write_text("raise ImportError('No module named matplotlib')\n")
    env = dict(os.environ, PYTHONPATH=str(shadow) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = run("record", model, "--plot", tmp_path / "c.png", env=env)
    assert p.returncode == 1
    assert "pip install 'tensorlist[plot]'" in _one_error_line(p, "record")


def test_demo_still_runs(tmp_path):
    p = run("demo", "--dir", tmp_path / "d")
    assert p.returncode == 0, p.stderr


def test_progress_bar_in_a_terminal(tmp_path):
    pytest.importorskip("tqdm")
    tl.save(tmp_path / "big.tl", {f"t{i}": np.zeros(1 << 20, np.float32) for i in range(16)})
    pid, fd = pty.fork()
    if pid == 0:  # the child: stdout and stderr are the terminal
        os.execv(sys.executable, [sys.executable, "-m", "tensorlist", "convert",
                                  str(tmp_path / "big.tl"), str(tmp_path / "big.safetensors")])
    out = b""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        r, _, _ = select.select([fd], [], [], 1)
        if r:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0, out
    assert b"big.safetensors" in out and b"100%|" in out  # tqdm's bar, drawn on the terminal
    assert (tmp_path / "big.safetensors").stat().st_size > 64 << 20


def test_inspect_other_formats(tmp_path, model):
    assert run("convert", model, tmp_path / "m.safetensors").returncode == 0
    p = run("inspect", tmp_path / "m.safetensors")
    assert p.returncode == 0 and "format safetensors" in p.stdout and "bfloat16" in p.stdout
    p = run("inspect", "--json", tmp_path / "m.safetensors")
    assert [t["name"] for t in json.loads(p.stdout)["tensors"]] == ["w", "bf"]
    (tmp_path / "junk.npz").write_bytes(b"PK\x03\x04 junk")
    p = run("inspect", tmp_path / "junk.npz")
    assert p.returncode == 1 and "junk.npz" in _one_error_line(p, "inspect")


def test_bfloat16_and_float8_without_ml_dtypes(tmp_path):
    """validate --verify and convert move bfloat16/float8 as bytes (bit carriers) and demo makes its bfloat16 as
    one: none of them needs ml_dtypes, which has no wheel for s390x."""
    f8 = np.array([0x38, 0x7F, 0x80], np.uint8).view(dtypes.from_name("float8_e4m3fn").bits)
    want = {"bf": bfloat16_bits([1.5, -2.0, np.nan]), "f8": f8, "w": np.arange(3, dtype=np.float32)}
    src = tmp_path / "m.tl"
    tl.save(src, want)
    p = run_without_ml_dtypes("validate", "--verify", src)
    assert p.returncode == 0 and "checksums verified" in p.stdout, p.stdout + p.stderr
    for dst in ("m.safetensors", "m.npz", "again.tl"):
        assert run_without_ml_dtypes("convert", src, tmp_path / dst).returncode == 0
        p = run_without_ml_dtypes("convert", tmp_path / dst, tmp_path / f"back-{dst}.tl")
        assert p.returncode == 0, p.stderr
        back = tl.load(tmp_path / f"back-{dst}.tl", bits=True)
        assert {k: dtypes.from_numpy(a.dtype).name for k, a in back.items()} == {"bf": "bfloat16",
                                                                                "f8": "float8_e4m3fn", "w": "float32"}
        assert all(back[k].tobytes() == dtypes.as_little(a).tobytes() for k, a in want.items()), dst
        assert run_without_ml_dtypes("diff", src, tmp_path / dst).returncode == 0
    p = run_without_ml_dtypes("demo", "--dir", tmp_path / "d")
    assert p.returncode == 0 and "training demo skipped" in p.stdout, p.stderr
    with tl.open(tmp_path / "d" / "model.tl", bits=True) as r:
        assert dtypes.from_numpy(r["block.0.attn.qkv"].dtype).name == "bfloat16"

"""The command line writing into a pipe whose reader goes away (``tensorlist inspect big.tl | head -1``).

Python ignores SIGPIPE, so such a write raises BrokenPipeError; the command
must then stop as Unix tools do: nothing on stderr, exit status 141 (what a
shell reports for ``cat`` killed by SIGPIPE). Each test runs the real command
in a subprocess whose stdout is a pipe closed after the first line, with an
output far larger than a pipe's buffer (64 KiB on Linux), so that the command
is still writing when the reader goes.
"""
import shlex
import subprocess
import sys

import numpy as np
import pytest

import tensorlist
from tensorlist import cli
from tensorlist.convert import convert

#: Tensors in the big file: each is a line of ``inspect`` and ``diff`` (over 1 MB of output in all).
N = 20_000
#: Files named on ``validate``'s command line: a line each (over 300 KB of output).
N_FILES = 5_000


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("pipe")
    a, b, small = d / "a.tl", d / "b.tl", d / "s.tl"
    tensorlist.save(a, {f"layer.{i}.weight": np.zeros(2, np.float32) for i in range(N)})
    tensorlist.save(b, {f"layer.{i}.weight": np.ones(2, np.float32) for i in range(N)})
    tensorlist.save(small, {"w": np.zeros(2, np.float32)})
    ckpt = d / "ckpt"
    convert(str(a), str(ckpt), dst_format="dcp", progress=False)
    return {"a": str(a), "b": str(b), "small": str(small), "ckpt": str(ckpt)}


COMMANDS = {
    "inspect": lambda f: ["inspect", f["a"]],
    "inspect --json": lambda f: ["inspect", f["a"], "--json"],
    "inspect dcp": lambda f: ["inspect", f["ckpt"]],
    "diff": lambda f: ["diff", f["a"], f["b"]],
    "validate": lambda f: ["validate"] + [f["small"]] * N_FILES,
}


def _closed_after_first_line(args):
    """(first line, stderr, exit status) of ``python -m tensorlist ARGS`` whose stdout is closed after one line."""
    p = subprocess.Popen([sys.executable, "-m", "tensorlist", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        first = p.stdout.readline()
        p.stdout.close()  # the reader goes away, as head does after its line
        err = p.stderr.read()
        return first, err.decode(), p.wait(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.mark.parametrize("name", list(COMMANDS))
def test_closed_pipe_ends_quietly(files, name, capsys):
    args = COMMANDS[name](files)
    rc = cli.main(args)  # the whole output, in-process: far more than a pipe holds
    out = capsys.readouterr().out
    assert rc in (0, 1) and len(out) > 4 * 65536, (name, rc, len(out))
    first, err, rc = _closed_after_first_line(args)
    assert first, "the command wrote nothing before the pipe closed"
    assert err == "", err
    assert rc == cli.EXIT_BROKEN_PIPE == 141


def test_whole_output_through_a_pipe_is_unchanged(files):
    """A reader that reads everything gets everything, and the usual status."""
    r = subprocess.run([sys.executable, "-m", "tensorlist", "diff", files["a"], files["b"]], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 1 and r.stderr == ""
    lines = r.stdout.splitlines()
    assert len(lines) == N + 1 and lines[-1].startswith("different: 0 tensors identical")


def test_closed_pipe_from_shell_pipeline(files):
    """``tensorlist inspect big.tl | head -1`` in a shell: one line out, nothing on stderr, 141 under pipefail."""
    cmd = f"set -o pipefail; {shlex.quote(sys.executable)} -m tensorlist inspect {shlex.quote(files['a'])} | head -1"
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=300)
    assert r.stdout.count("\n") == 1 and r.stdout.startswith(files["a"])
    assert r.stderr == ""
    assert r.returncode == 141


def test_broken_pipe_not_from_stdout_is_an_error(files, monkeypatch, capsys):
    """A BrokenPipeError while stdout is no pipe (here captured) is some other connection's: one error line."""
    def broken(args):
        raise BrokenPipeError(32, "Broken pipe (a storage connection)")

    monkeypatch.setattr(cli, "cmd_inspect", broken)  # build_parser, run by main, takes it from here
    assert cli.main(["inspect", files["small"]]) == 1
    err = capsys.readouterr().err
    assert err.strip() == "tensorlist inspect: error: [Errno 32] Broken pipe (a storage connection)"


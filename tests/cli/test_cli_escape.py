"""Terminal escape injection (docs/SECURITY.md G26): every command prints what a file holds escaped.

Tensor names, metadata, tree keys and kinds, training-record class names and file names carrying ESC, BEL, CSI,
OSC, C1 controls and bidi overrides go through every command that prints file content (inspect, inspect --json,
validate, record, diff, convert's errors); every character of stdout and stderr is checked, and the escaped text
must still show the name. A last test runs the CLI on a real terminal (a pty) and checks its bytes.
"""
import json
import os
import subprocess
import sys
import unicodedata

import numpy as np
import pytest

import tensorlist as tl
from tensorlist._base import tree as _tree
from tensorlist._base.terminal import display_width, escape_controls
from tensorlist.cli import main

#: ESC (a colour CSI), BEL, an OSC setting the window title, a C1 CSI (U+009B), a bidi override, a line separator.
EVIL = "ev\x1b[31mil\x07\x1b]0;pwned\x07\x9b2J\u202etxt\u2028end"
#: How the name reads once escaped.
SHOWN = "ev\\x1b[31mil\\x07\\x1b]0;pwned\\x07\\x9b2J\\u202etxt\\u2028end"


def _raw_controls(text):
    """The characters of ``text`` that could drive a terminal (anything but newline and tab of Cc, Cf, Zl, Zp)."""
    return [c for c in text if c not in "\n\t" and unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")]


def _run(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    for stream in (out.out, out.err):
        assert not _raw_controls(stream), (argv, stream)
    return rc, out.out + out.err


def _tree_file(path, *, kind=None):
    spec, leaves = _tree.encode({EVIL: np.zeros(2), "b": {EVIL: np.ones(1)}})
    if kind is not None:
        spec["kind"] = kind
    tl.save(path, dict(leaves), metadata=_tree.make_header(spec, {EVIL: EVIL}))
    return os.fspath(path)


def _record_file(path):
    from _record_support import full_record

    rec = full_record()
    rec["solver"]["class"] = rec["optimizer"]["class"] = EVIL
    tl.save(path, {"w": np.zeros(2)}, metadata={"training": rec, "dataset_params": {"name": EVIL}})
    return os.fspath(path)


def test_escape_controls_keeps_text_and_escapes_every_control():
    assert escape_controls(EVIL) == SHOWN
    assert escape_controls("naïve 名前 \t tab\nline") == "naïve 名前 \t tab\nline"
    assert escape_controls("\r\x00\x7f\u200b\ufeff\U000e0001") == "\\x0d\\x00\\x7f\\u200b\\ufeff\\U000e0001"


def test_inspect_escapes_names_metadata_tree_keys_and_kinds(tmp_path, capsys):
    rc, text = _run(capsys, "inspect", _tree_file(tmp_path / "t.tl"))
    assert rc == 0 and SHOWN in text and f"'{SHOWN}': {SHOWN}  float64 (2,)" in text
    rc, text = _run(capsys, "inspect", _tree_file(tmp_path / "k.tl", kind=EVIL))
    assert rc == 0 and SHOWN in text  # the unknown kind, drawn and named in "tree: invalid (...)"
    rc, text = _run(capsys, "inspect", "--json", os.fspath(tmp_path / "t.tl"))
    assert rc == 0 and json.loads(text)["tensors"][0]["name"] == EVIL  # JSON's own escapes, read back exactly


def test_inspect_of_another_format_escapes_its_names(tmp_path, capsys):
    pytest.importorskip("safetensors", reason="safetensors files need safetensors")
    tl.save(tmp_path / "a.tl", {EVIL: np.zeros(2)})
    assert main(["convert", os.fspath(tmp_path / "a.tl"), os.fspath(tmp_path / "a.safetensors")]) == 0
    capsys.readouterr()
    rc, text = _run(capsys, "inspect", os.fspath(tmp_path / "a.safetensors"))
    assert rc == 0 and SHOWN in text


@pytest.mark.parametrize("fmt", ["tl", "safetensors"])
def test_inspect_columns_line_up_for_escaped_and_wide_names(tmp_path, capsys, fmt):
    """Column widths are those of the names as printed: escaped controls, two columns per wide character."""
    names = [EVIL, "名前の重み", "plain", "e\u0301"]  # a combining accent takes no column
    tl.save(tmp_path / "w.tl", {n: np.zeros(i + 1, np.float32) for i, n in enumerate(names)})
    path = tmp_path / "w.tl"
    if fmt == "safetensors":
        pytest.importorskip("safetensors", reason="safetensors files need safetensors")
        assert main(["convert", os.fspath(path), os.fspath(tmp_path / "w.safetensors")]) == 0
        capsys.readouterr()
        path = tmp_path / "w.safetensors"
    rc, text = _run(capsys, "inspect", os.fspath(path))
    rows = [line for line in text.splitlines() if "float32" in line or line.strip().startswith("name ")]
    assert rc == 0 and len(rows) == 5
    starts = {display_width(line[:line.index("float32" if "float32" in line else "dtype")]) for line in rows}
    assert len(starts) == 1, rows


def test_validate_escapes_errors_and_file_names(tmp_path, capsys):
    rc, text = _run(capsys, "validate", _tree_file(tmp_path / "k.tl", kind=EVIL), _tree_file(tmp_path / EVIL))
    assert rc == 1
    assert "unknown node kind" in text and SHOWN in text  # the kind in the error, the file name in the ok line
    assert f"{escape_controls(os.fspath(tmp_path / EVIL))}: ok" in text


def test_record_escapes_class_names(tmp_path, capsys):
    rc, text = _run(capsys, "record", _record_file(tmp_path / "r.tl"))
    assert rc == 0 and f"solver: {SHOWN}" in text and f"optimizer: {SHOWN}" in text


def test_diff_escapes_names(tmp_path, capsys):
    tl.save(tmp_path / "a.tl", {EVIL: np.zeros(2), "x": np.zeros(3)})
    tl.save(tmp_path / "b.tl", {"y": np.zeros(2), "x": np.zeros(3, np.float32)})
    rc, text = _run(capsys, "diff", os.fspath(tmp_path / "a.tl"), os.fspath(tmp_path / "b.tl"))
    assert rc == 1 and f"only in {tmp_path / 'a.tl'}: {SHOWN}" in text


def test_convert_errors_escape_file_names(tmp_path, capsys):
    src = tmp_path / f"{EVIL}.tl"
    tl.save(src, {"a": np.zeros(2), "b": np.zeros(1)})
    rc, text = _run(capsys, "convert", os.fspath(src), os.fspath(tmp_path / "o.npy"))  # .npy holds one array
    assert rc == 1 and "error:" in text
    assert SHOWN.split("\\u2028")[0] in text  # an error is one line: its U+2028 (white space) became a space


def test_a_real_terminal_gets_no_control_sequence_from_a_file(tmp_path):
    import pty

    path = _tree_file(tmp_path / "t.tl", kind=EVIL)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(os.path.abspath(tl.__file__))),
                                                      os.environ.get("PYTHONPATH", "")]))
    for argv in (["inspect", path], ["validate", path]):
        leader, follower = pty.openpty()
        proc = subprocess.Popen([sys.executable, "-m", "tensorlist", *argv], stdout=follower, stderr=follower,
                                stdin=subprocess.DEVNULL, env=env)
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        os.close(leader)
        assert proc.wait(timeout=120) in (0, 1)
        text = b"".join(chunks).decode("utf-8").replace("\r\n", "\n")  # the terminal's own newline mapping
        assert text and not _raw_controls(text), text
        assert SHOWN in text

"""The command line's shared rules, each run against every command it concerns, through ``main`` itself.

- ``TestNoOverwrite``: no command replaces a file (or a directory that is not empty) unless given
  ``--force``; the refusal names the destination, and nothing at all is written (a command with several
  outputs checks every one before writing any); with ``--force`` the destination is replaced.
- ``TestDestinationDirectories``: the missing directories above every destination (and a checkpoint
  directory itself) are made, parents included, for every writing command and destination kind; a write
  that fails leaves none of them behind.
- ``TestForeignFiles``: a file of another format handed where a tensorlist file is expected is named as
  what it is, with the command that reads it, by every command and the Python readers alike.
- ``TestErrorFormat``: every command's error is one line, ``tensorlist <command>: error: <FILE>: <problem>``.
"""
import argparse
import os
import re
import subprocess
import sys
import types
from dataclasses import dataclass
from typing import Callable, List

import numpy as np
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

import tensorlist as tl
from _compat import needs_torch
from _record_support import full_record
from tensorlist.cli import build_parser, main
from tensorlist.convert import convert, open_source
from tensorlist.convert.formats import GGUF_MAGIC
from tensorlist.errors import DestinationExistsError, FormatError
from tensorlist.provenance.exports import export
from tensorlist.provenance.record import save_model_file

#: What a destination in the way holds before each run: it must hold exactly this after a refusal.
SENTINEL = b"precious: not the command's to replace\n"
#: Three float32 tensors of 24 bytes: with --shard-size 20B, a Hugging Face destination of three shards.
THREE = {name: np.arange(6, dtype=np.float32) + i for i, name in enumerate(("a", "b", "c"))}
HF_SHARDS = [f"m-{i:05d}-of-00003.safetensors" for i in (1, 2, 3)]


def cli(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _private_key(path) -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.with_suffix(".pub").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return str(path)


@pytest.fixture
def ws(tmp_path):
    """The inputs of every command, in ``in/``: a model file with its records, plain lists, a checkpoint, a key."""
    d = tmp_path / "in"
    d.mkdir()
    record = full_record()
    record["weights"] = dict(record["weights"], sha256=None)
    model = str(d / "model.tl")
    save_model_file(model, {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, training=record,
                    dataset_params={"name": "toy", "split": "train"})
    tl.save(d / "three.tl", THREE)
    tl.save(d / "one.tl", {"w": np.ones(4, np.float32)})
    convert(d / "three.tl", d / "ckpt", dst_format="dcp", progress=False)
    convert(d / "three.tl", d / "hf-model" / "model.safetensors", progress=False)  # a model directory of each kind
    (d / "hf-model" / "config.json").write_text("{}")
    convert(d / "hf-model", d / "tl-model", progress=False)
    tl.Key(bytes(range(32))).save(d / "aes.key")  # encrypt's and decrypt's key file, and a list sealed with it
    tl.save(d / "sealed.tl", THREE, key=tl.Key(bytes(range(32))))
    return types.SimpleNamespace(aes=str(d / "aes.key"), sealed=str(d / "sealed.tl"),
                                 root=tmp_path, model=model, three=str(d / "three.tl"), one=str(d / "one.tl"),
                                 ckpt=str(d / "ckpt"), key=_private_key(d / "key.pem"),
                                 pub=str(d / "key.pub"), hf_model=str(d / "hf-model"), tl_model=str(d / "tl-model"))


@dataclass(frozen=True)
class Writing:
    """A command that writes: its arguments, and the destinations it writes, in the order it checks them."""

    id: str
    argv: Callable[..., list]  # (ws, out) -> the command line
    outputs: Callable[..., List[str]]  # (ws, out) -> the destinations, as the command names them
    blocker: int = -1  # the destination made to exist (the last one: every earlier one must stay unwritten)
    directory: bool = False  # the blocker is a directory destination (in the way when it is not empty)

    @property
    def command(self) -> str:
        return self.id.split()[0]


def _hf_argv(w, o):
    return ["convert", w.three, f"{o}/hf/m.safetensors.index.json", "--shard-size", "20B", "--no-progress"]


WRITING = [
    Writing("convert tensorlist", lambda w, o: ["convert", w.three, f"{o}/m.tl"], lambda w, o: [f"{o}/m.tl"]),
    Writing("convert lamp", lambda w, o: ["convert", w.one, f"{o}/m.lamp"],
            lambda w, o: [f"{o}/m.lamp", f"{o}/m.lamp.data"]),  # lamp's fixed data file name, refused too
    Writing("convert safetensors", lambda w, o: ["convert", w.three, f"{o}/m.safetensors"],
            lambda w, o: [f"{o}/m.safetensors"]),
    Writing("convert npz", lambda w, o: ["convert", w.three, f"{o}/m.npz"], lambda w, o: [f"{o}/m.npz"]),
    Writing("convert npy", lambda w, o: ["convert", w.one, f"{o}/m.npy"], lambda w, o: [f"{o}/m.npy"]),
    Writing("convert pt", lambda w, o: ["convert", w.three, f"{o}/m.pt"], lambda w, o: [f"{o}/m.pt"]),
    Writing("convert hf, index in the way", _hf_argv,
            lambda w, o: [f"{o}/hf/{n}" for n in HF_SHARDS] + [f"{o}/hf/m.safetensors.index.json"]),
    Writing("convert hf, a shard in the way", _hf_argv,
            lambda w, o: [f"{o}/hf/{n}" for n in HF_SHARDS] + [f"{o}/hf/m.safetensors.index.json"], blocker=1),
    Writing("convert dcp", lambda w, o: ["convert", w.three, f"{o}/ckpt/"], lambda w, o: [f"{o}/ckpt/"],
            directory=True),
    Writing("convert dcp to dcp", lambda w, o: ["convert", w.ckpt, f"{o}/ckpt2"], lambda w, o: [f"{o}/ckpt2"],
            directory=True),
    Writing("convert hf-model", lambda w, o: ["convert", w.hf_model, f"{o}/tl-model"],
            lambda w, o: [f"{o}/tl-model"], directory=True),
    Writing("convert tensorlist-model", lambda w, o: ["convert", w.tl_model, f"{o}/hf-model"],
            lambda w, o: [f"{o}/hf-model"], directory=True),
    Writing("export", lambda w, o: ["export", w.model, "--cyclonedx", f"{o}/bom.json", "--model-card",
                                    f"{o}/README.md"], lambda w, o: [f"{o}/bom.json", f"{o}/README.md"]),
    Writing("sign", lambda w, o: ["sign", w.model, "--key", w.key, "--signature", f"{o}/m.sig", "--provenance",
                                  f"{o}/m.provenance.json"], lambda w, o: [f"{o}/m.sig", f"{o}/m.provenance.json"]),
    Writing("sign beside the model", lambda w, o: ["sign", w.model, "--key", w.key],
            lambda w, o: [w.model + ".sig"]),
    Writing("record --plot", lambda w, o: ["record", w.model, "--plot", f"{o}/curves.png"],
            lambda w, o: [f"{o}/curves.png"]),
    Writing("demo", lambda w, o: ["demo", "--dir", f"{o}/demo"], lambda w, o: [f"{o}/demo"], directory=True),
    Writing("encrypt", lambda w, o: ["encrypt", w.three, f"{o}/s.tl", "--key-file", w.aes],
            lambda w, o: [f"{o}/s.tl"]),
    Writing("encrypt a model directory", lambda w, o: ["encrypt", w.tl_model, f"{o}/sealed", "--key-file", w.aes],
            lambda w, o: [f"{o}/sealed"], directory=True),
    Writing("decrypt", lambda w, o: ["decrypt", w.sealed, f"{o}/p.tl", "--key-file", w.aes],
            lambda w, o: [f"{o}/p.tl"]),
]


def _writing(cases) -> list:
    """``cases`` for ``parametrize``, by id; the one writing a torch file marked :data:`needs_torch`."""
    return [pytest.param(c, id=c.id, marks=needs_torch if c.id == "convert pt" else ()) for c in cases]


#: The commands that write nothing (and so take no --force).
READ_ONLY = {"inspect", "validate", "diff", "lineage", "verify"}
#: The commands that write only new files, refusing any that exists even with --force (none is taken).
NEVER_REPLACE = {"keygen"}


def _commands() -> argparse._SubParsersAction:
    """The parser's commands (``choices``: name -> its parser)."""
    return next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))


def _tree(root) -> dict:
    """Every file under ``root`` with its bytes, and every directory (None): what a refusal must leave alone."""
    out = {}
    for base, dirs, files in os.walk(root):
        for d in dirs:
            out[os.path.join(base, d)] = None
        for f in files:
            with open(os.path.join(base, f), "rb") as fh:
                out[os.path.join(base, f)] = fh.read()
    return out


def _occupy(path: str, directory: bool) -> None:
    """Puts something of the user's at ``path``: the sentinel file, or a directory holding it."""
    path = path.rstrip("/")
    os.makedirs(path if directory else os.path.dirname(path), exist_ok=True)
    with open(os.path.join(path, "keep.txt") if directory else path, "wb") as f:
        f.write(SENTINEL)


@pytest.fixture
def no_training_demo(monkeypatch):
    """``demo`` without its training part (the tour alone: seconds, not tens of them)."""
    monkeypatch.setitem(sys.modules, "tensorlist.loops.demo", None)


@pytest.mark.usefixtures("no_training_demo")
class TestNoOverwrite:
    @pytest.mark.parametrize("case", _writing(WRITING))
    def test_a_destination_in_the_way_is_refused_by_name_and_nothing_is_written(self, case, ws, capsys):
        out = str(ws.root / "out")
        blocker = case.outputs(ws, out)[case.blocker]
        _occupy(blocker, case.directory)
        before = _tree(ws.root)
        rc, stdout, stderr = cli(capsys, *case.argv(ws, out))
        reason = "exists and is not empty" if case.directory else "exists"
        assert (rc, stdout) == (1, "")
        assert stderr == f"tensorlist {case.command}: error: {blocker}: {reason}; pass --force to replace it\n"
        assert _tree(ws.root) == before  # the destination byte-identical, no other output, no temporary

    @pytest.mark.parametrize("case", _writing(WRITING))
    def test_force_replaces_it(self, case, ws, capsys):
        out = str(ws.root / "out")
        outputs = case.outputs(ws, out)
        _occupy(outputs[case.blocker], case.directory)
        rc, _, stderr = cli(capsys, *case.argv(ws, out), "--force")
        assert rc == 0, stderr
        for path in outputs:
            assert os.path.exists(path), path
        blocker = outputs[case.blocker].rstrip("/")
        if case.directory:
            assert set(os.listdir(blocker)) > {"keep.txt"}  # written into
        else:
            with open(blocker, "rb") as f:
                assert f.read() != SENTINEL

    def test_the_table_holds_every_writing_command(self):
        """Every command taking --force has a case above, and every other is known to write nothing."""
        sub = _commands()
        forcing = {name for name, p in sub.choices.items() if "--force" in p._option_string_actions}
        assert forcing == {c.command for c in WRITING}
        assert set(sub.choices) - forcing == READ_ONLY | NEVER_REPLACE

    @pytest.mark.parametrize("case", _writing(c for c in WRITING if c.directory))
    def test_an_empty_directory_is_not_in_the_way(self, case, ws, capsys):
        out = str(ws.root / "out")
        os.makedirs(case.outputs(ws, out)[0])
        rc, _, stderr = cli(capsys, *case.argv(ws, out))
        assert rc == 0, stderr

    def test_a_remote_destination_in_the_way_is_refused_too(self, ws, capsys):
        fsspec = pytest.importorskip("fsspec")
        url = f"memory://tensorlist-cli-rules-{os.getpid()}/m.tl"
        fs = fsspec.filesystem("memory")
        fs.pipe_file(url, SENTINEL)
        try:
            rc, _, err = cli(capsys, "convert", ws.three, url)
            assert rc == 1 and err == f"tensorlist convert: error: {url}: exists; pass --force to replace it\n"
            assert fs.cat_file(url) == SENTINEL
            assert cli(capsys, "convert", ws.three, url, "--force")[0] == 0
            assert tl.load(url).keys() == THREE.keys()
        finally:
            fs.rm(f"memory://tensorlist-cli-rules-{os.getpid()}", recursive=True)

    def test_the_python_functions_replace_unless_told_not_to(self, ws):
        """convert() and export() replace by default, as numpy's and torch's save do; overwrite=False is the rule."""
        out = ws.root / "README.md"
        out.write_bytes(SENTINEL)
        with pytest.raises(DestinationExistsError, match=r"README\.md: exists; pass overwrite=True to replace it"):
            export(ws.model, model_card_path=out, overwrite=False)
        assert out.read_bytes() == SENTINEL
        export(ws.model, model_card_path=out)
        assert out.read_bytes().startswith(b"---")
        with pytest.raises(DestinationExistsError) as e:
            convert(ws.three, out, dst_format="safetensors", progress=False, overwrite=False)
        assert e.value.file == str(out) and isinstance(e.value, FileExistsError)
        convert(ws.three, out, dst_format="safetensors", progress=False)
        with open_source(out, "safetensors") as src:
            assert [e.name for e in src.entries] == list(THREE)

    def test_the_readme_of_a_repository_root_is_kept(self, ws):
        """The report that started it: ``export --model-card README.md`` run where a README.md lies."""
        (ws.root / "README.md").write_bytes(SENTINEL)
        p = subprocess.run([sys.executable, "-m", "tensorlist", "export", ws.model, "--cyclonedx", "bom.json",
                            "--model-card", "README.md"], cwd=ws.root, capture_output=True, text=True, timeout=120)
        assert p.returncode == 1 and p.stdout == ""
        assert p.stderr == "tensorlist export: error: README.md: exists; pass --force to replace it\n"
        assert (ws.root / "README.md").read_bytes() == SENTINEL and not (ws.root / "bom.json").exists()


@pytest.mark.usefixtures("no_training_demo")
class TestDestinationDirectories:
    @pytest.mark.parametrize("case", _writing(c for c in WRITING if c.id != "sign beside the model"))
    def test_missing_directories_are_made(self, case, ws, capsys):
        out = str(ws.root / "out" / "new" / "deeper")
        rc, _, stderr = cli(capsys, *case.argv(ws, out))
        assert rc == 0, stderr
        for path in case.outputs(ws, out):
            assert os.path.exists(path), path

    def test_a_conversion_that_fails_leaves_no_directory_behind(self, ws, capsys):
        tl.save(ws.root / "in" / "c.tl", {"z": np.ones(2, np.complex128)})  # safetensors has no complex128
        rc, _, err = cli(capsys, "convert", ws.root / "in" / "c.tl", ws.root / "out" / "new" / "c.safetensors")
        assert rc == 1 and "complex128" in err
        assert not (ws.root / "out").exists()


def _write_foreign(kind: str, d) -> str:
    """A file (or directory) of another format in ``d``; its path."""
    three = str(d / "three.tl")
    if kind in ("safetensors", "npz", "npy", "pt"):
        path = str(d / f"m.{kind}")
        convert(str(d / "one.tl") if kind == "npy" else three, path, progress=False)
    elif kind == "pt legacy":
        import torch

        path = str(d / "legacy.pt")
        torch.save({"w": torch.ones(2)}, path, _use_new_zipfile_serialization=False)
    elif kind == "hf":
        path = str(d / "hf" / "m.safetensors.index.json")
        convert(three, path, progress=False)
    elif kind == "gguf":
        path = str(d / "m.gguf")
        with open(path, "wb") as f:
            f.write(GGUF_MAGIC + (3).to_bytes(4, "little") + bytes(16))
    elif kind == "dcp":
        path = str(d / "ckpt")
    else:  # torch-dcp: told apart by its metadata's name (a pickle, never read here)
        path = str(d / "stock")
        os.makedirs(path)
        with open(os.path.join(path, ".metadata"), "wb") as f:
            f.write(b"\x80\x04N.")
    return path


#: Each format recognised in place of a tensorlist file, and what the message calls it.
FOREIGN = {"safetensors": "a safetensors file", "npz": "a NumPy .npz archive", "npy": "a NumPy .npy array",
           "pt": "a torch file (torch.save)", "pt legacy": "a torch file (torch.save)",
           "hf": "the index of a Hugging Face sharded checkpoint", "gguf": "a GGUF file (llama.cpp's format)",
           "dcp": "a checkpoint directory (tensorlist's DCP layout)",
           "torch-dcp": "a checkpoint directory (DCP's FileSystemWriter layout)"}
DIRECTORIES = {"dcp", "torch-dcp"}
#: The kinds whose files only torch writes.
TORCH_FILES = {"pt", "pt legacy"}
#: The commands that expect a tensorlist file, and what they are given besides it.
EXPECTING = {"validate": [], "record": [], "lineage": [], "export": ["--cyclonedx", "{out}/bom.json"],
             "sign": ["--key", "{key}", "--signature", "{out}/x.sig"]}


def _foreign_cases():
    for kind in FOREIGN:
        for command in EXPECTING:
            if kind in DIRECTORIES and command in ("validate", "sign"):
                continue  # both read checkpoint directories as such (validate_checkpoint, a signed directory)
            if kind == "hf" and command in ("record", "sign"):
                continue  # a JSON document, read as one: record says it has no record, sign to sign its directory
            yield pytest.param(kind, command, id=f"{command} {kind}", marks=_torch_mark(kind))


def _kinds(kinds) -> list:
    """``kinds`` for ``parametrize``, those whose files only torch writes marked :data:`needs_torch`."""
    return [pytest.param(k, id=k, marks=_torch_mark(k)) for k in kinds]


def _torch_mark(kind: str):
    return needs_torch if kind in TORCH_FILES else ()


class TestForeignFiles:
    @pytest.mark.parametrize("kind,command", list(_foreign_cases()))
    def test_every_command_names_the_format_and_the_command_that_reads_it(self, ws, capsys, kind, command):
        path = _write_foreign(kind, ws.root / "in")
        extra = [a.format(out=ws.root / "out", key=ws.key) for a in EXPECTING[command]]
        rc, out, err = cli(capsys, command, path, *extra)
        assert rc == 1 and out == "" and err.count("\n") == 1, (out, err)
        assert err.startswith(f"tensorlist {command}: error: {path}: "), err
        assert f"{FOREIGN[kind]}, not a tensorlist file: " in err
        if kind == "gguf":
            assert "tensorlist does not read GGUF" in err
        elif kind in DIRECTORIES:
            assert f"`tensorlist validate {path}` checks it" in err and f"`tensorlist convert {path} " in err
        else:
            assert f"`tensorlist convert {path} " in err and f"`tensorlist inspect {path}` lists" in err
        assert not (ws.root / "out").exists()

    @pytest.mark.parametrize("kind", _kinds(FOREIGN))
    def test_the_python_readers_say_the_same(self, ws, kind):
        path = _write_foreign(kind, ws.root / "in")
        readers = [tl.load, tl.open] + ([] if kind in DIRECTORIES else [tl.validate])
        for read in readers:
            with pytest.raises(FormatError, match=re.escape(f"{FOREIGN[kind]}, not a tensorlist file")) as e:
                read(path)
            assert e.value.file == path

    @pytest.mark.parametrize("kind", _kinds(k for k in FOREIGN if k not in DIRECTORIES))
    def test_the_suggested_conversion_works(self, ws, capsys, kind):
        """The command the message names reads the file (GGUF aside: no command does)."""
        path = _write_foreign(kind, ws.root / "in")
        err = cli(capsys, "validate", path)[2]
        if kind == "gguf":
            assert "does not read GGUF" in err
            return
        suggested = err.split("`tensorlist convert ", 1)[1].split("`", 1)[0].split(" ")
        assert cli(capsys, "convert", *suggested)[0] == 0
        assert cli(capsys, "validate", suggested[1])[0] == 0

    def test_a_tensorlist_file_under_a_foreign_name_is_still_read(self, ws, capsys):
        """Recognition is by the bytes, never the name: a descriptor called .safetensors validates."""
        named = ws.root / "in" / "actually.safetensors"
        tl.save(named, THREE)
        rc, out, _ = cli(capsys, "validate", named)
        assert rc == 0 and out.startswith(f"{named}: ok")


def _missing(ws):
    return str(ws.root / "in" / "missing.tl")


#: One failing invocation per command: (command line, the file the error must name first, exit status).
FAILING = {
    "demo": (lambda w: ["demo", "--dir", w.model], lambda w: w.model, 1),
    "inspect": (lambda w: ["inspect", _missing(w)], _missing, 1),
    "validate": (lambda w: ["validate", w.three, _missing(w)], _missing, 1),
    "convert": (lambda w: ["convert", _missing(w), str(w.root / "x.safetensors")], _missing, 1),
    "diff": (lambda w: ["diff", w.three, _missing(w)], _missing, 2),
    "record": (lambda w: ["record", w.three], lambda w: w.three, 1),
    "lineage": (lambda w: ["lineage", _missing(w)], _missing, 1),
    "export": (lambda w: ["export", _missing(w), "--cyclonedx", str(w.root / "b.json")], _missing, 1),
    "sign": (lambda w: ["sign", w.model, "--key", _missing(w)], _missing, 1),
    "verify": (lambda w: ["verify", w.model, "--public-key", w.pub], lambda w: w.model + ".sig", 1),
    "encrypt": (lambda w: ["encrypt", _missing(w), str(w.root / "s.tl"), "--key-file", w.aes], _missing, 1),
    "decrypt": (lambda w: ["decrypt", w.sealed, str(w.root / "p.tl"), "--key-file", w.three], lambda w: w.three, 1),
    "keygen": (lambda w: ["keygen", w.aes], lambda w: w.aes, 1),
}


class TestErrorFormat:
    @pytest.mark.parametrize("command", list(FAILING))
    def test_every_command_says_tensorlist_command_error_file_problem(self, ws, capsys, command):
        argv, file, status = FAILING[command]
        rc, out, err = cli(capsys, *argv(ws))
        assert rc == status
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert err.startswith(f"tensorlist {command}: error: {file(ws)}: "), err
        if command == "validate":
            assert out == f"{ws.three}: ok (1 list, 3 tensors)\n"  # the valid file still reported, on stdout
        else:
            assert out == ""

    def test_the_table_holds_every_command(self):
        assert set(_commands().choices) == set(FAILING)

    def test_no_error_line_is_written_but_by_the_formatter(self):
        """The cli package's modules print no error of their own: the one format lives in cli/messages.py."""
        import tensorlist.cli as package

        folder = os.path.dirname(package.__file__)
        for name in sorted(os.listdir(folder)):
            if name.endswith(".py") and name != "messages.py":
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    text = f.read()
                assert ": error" not in text and "error: " not in text, name

    def test_an_os_error_names_its_file_first(self, ws, capsys):
        rc, _, err = cli(capsys, "inspect", _missing(ws))
        assert err == f"tensorlist inspect: error: {_missing(ws)}: No such file or directory\n"

    def test_a_problem_inside_a_checkpoint_names_that_file(self, ws, capsys):
        """A file inside the named directory is the file at fault: it comes first, the directory within it."""
        meta = os.path.join(ws.ckpt, ".metadata.json")
        with open(meta, "w") as f:
            f.write("{")
        rc, _, err = cli(capsys, "validate", ws.ckpt)
        assert rc == 1 and err.startswith(f"tensorlist validate: error: {meta}: invalid JSON"), err

"""Stock DCP checkpoints (FileSystemWriter) imported into tensorlist's layout, and DCP on S3, with real gloo ranks.

``dcp.save(..., storage_writer=FileSystemWriter(dir))`` runs on 1 and on 2 gloo processes (plain tensors, a
DTensor sharded across the ranks, non-tensor values); ``tensorlist convert`` turns each into tensorlist's
layout (and into .tl/.safetensors files) and ``read_full`` must give back exactly what was saved. The
pickled ``.metadata`` is read by a restricted unpickler: planted payloads are refused and never run (a
marker file stays absent). ``TensorListWriter`` saves on 2 gloo ranks to a moto S3 server on loopback,
and this process loads it. The same file is the worker: run as a script it is one rank
(python test_dcp_import.py MODE RANK WORLD PORT ROOT).
"""
import datetime
import os
import pickle
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="importing DCP checkpoints needs torch (pip install 'tensorlist[torch]')")
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter

import tensorlist as tl
from tensorlist._bridges.torch import from_numpy
from tensorlist.cli import main
from tensorlist.convert import MetadataDroppedWarning, convert, open_source
from tensorlist.dcp import TensorListReader, TensorListWriter, read_full, validate_checkpoint
from tensorlist.dcp import METADATA_NAME, read_metadata

import _ranks

pytestmark = [pytest.mark.filterwarnings("ignore:torch.distributed is disabled"), pytest.mark.slow]
VALUES = {"step": 7, "cfg.betas": (0.9, 0.999), "cfg.name": "run"}


def plain():
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(8, 6, generator=g), "b": torch.arange(5), "h": torch.randn(4, 4, generator=g).bfloat16(),
            "s": torch.tensor(3.5, dtype=torch.float64)}


def sharded():
    return torch.randn(7, 4, generator=torch.Generator().manual_seed(1))


def expected():
    """fqn -> what read_full must give for the saved state dict (flattened, as DCP stores it)."""
    out = {f"model.{k}": v for k, v in plain().items()}
    out["sharded"] = sharded()
    return out


# --- the worker (one rank) ---------------------------------------------------------------

def worker(mode, rank, world, port, root):
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    _ranks.join(rank, world, port, timeout=datetime.timedelta(seconds=60))
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (world,))
    sd = {"model": plain(), "sharded": distribute_tensor(sharded(), mesh, [Shard(0)]), "step": 7,
          "cfg": {"betas": (0.9, 0.999), "name": "run"}}
    writer = FileSystemWriter(root) if mode == "stock" else TensorListWriter(root)
    dcp.save(sd, storage_writer=writer)
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def stock(tmp_path_factory):
    """FileSystemWriter checkpoints saved by 1 and by 2 gloo ranks: {world: directory}."""
    root = tmp_path_factory.mktemp("stock")
    out = {}
    for world in (1, 2):
        out[world] = root / f"on{world}"
        _ranks.run_script(__file__, "stock", world, out[world])
    return out


def cli(capsys, *args):
    rc = main([str(a) for a in args])
    out = capsys.readouterr()
    return rc, out.out.splitlines(), out.err.splitlines()


def same(got, want, what):
    got = from_numpy(got) if isinstance(got, np.ndarray) else got
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, got.shape, want.dtype, want.shape)
    assert torch.equal(got, want), what


def check_full(path):
    full = read_full(path, verify=True)
    for k, v in expected().items():
        same(full[k], v, k)
    assert {k: full[k] for k in VALUES} == VALUES and isinstance(full["cfg.betas"], tuple)
    assert sorted(full) == sorted(list(expected()) + list(VALUES))


# --- importing a stock checkpoint ----------------------------------------------------------------

@pytest.mark.parametrize("world", [1, 2])
def test_a_stock_checkpoint_converts_to_the_tensorlist_layout(stock, tmp_path, capsys, world):
    src = stock[world]
    assert sorted(n for n in os.listdir(src) if n.endswith(".distcp")) == [f"__{r}_0.distcp" for r in range(world)]
    rc, out, err = cli(capsys, "convert", src, tmp_path / "new", "--no-progress")
    assert rc == 0 and out == [] and err == []
    check_full(tmp_path / "new")
    ckpt = validate_checkpoint(tmp_path / "new", verify=True)
    assert len(ckpt.files) == world and len(ckpt.tensors["sharded"].chunks) == world  # ranks and chunks kept
    assert not any(n.endswith(".distcp") or n == ".metadata" for n in os.listdir(tmp_path / "new"))
    # and DCP loads it back through TensorListReader
    sd = {"model": {k: torch.zeros_like(v) for k, v in plain().items()}, "sharded": torch.zeros(7, 4), "step": 0,
          "cfg": {"betas": None, "name": None}}
    dcp.load(sd, storage_reader=TensorListReader(tmp_path / "new"))
    for k, v in plain().items():
        same(sd["model"][k], v, k)
    same(sd["sharded"], sharded(), "sharded")
    assert sd["step"] == 7 and sd["cfg"] == {"betas": (0.9, 0.999), "name": "run"}


@pytest.mark.parametrize("suffix", [".tl", ".safetensors"])
def test_a_stock_checkpoint_converts_to_flat_files(stock, tmp_path, capsys, suffix):
    dst = tmp_path / f"model{suffix}"
    assert cli(capsys, "convert", stock[2], dst, "--no-progress")[0] == 0
    with open_source(dst) as s:
        got = {e.name: e.array() for e in s.entries}
        assert s.metadata == {"dcpValues": {"step": 7, "cfg.betas": {"__tuple__": [0.9, 0.999]}, "cfg.name": "run"}}
    assert sorted(got) == sorted(expected())
    for k, v in expected().items():
        same(got[k], v, k)


def test_inspect_and_validate_a_stock_checkpoint(stock, capsys):
    rc, out, _ = cli(capsys, "inspect", stock[2])
    assert rc == 0 and "format torch-dcp" in out[0] and "2 data files" in out[0]
    rows = {line.split()[0]: line.split() for line in out[2:-1]}
    assert rows["sharded"][1:5] == ["float32", "(7,", "4)", "2"] and rows["model.h"][1] == "bfloat16"
    assert rows["step"][1:3] == ["value", "(pickle)"]
    rc, out, _ = cli(capsys, "validate", "--verify", stock[2])
    assert rc == 0 and out == [f"{stock[2]}: ok (torch-dcp checkpoint, 5 tensors in 6 chunks, 3 values, 2 data "
                               "files; every record loaded with torch.load(weights_only=True))"]


def test_a_stock_checkpoint_is_inspected_without_torch_and_convert_says_it_needs_torch(stock, tmp_path):
    code = ("import sys; sys.modules['torch'] = None\n"
            "from tensorlist.cli import main\n"
            "print('rc', [main(['inspect', sys.argv[1]]), main(['validate', sys.argv[1]]),\n"
            "             main(['convert', sys.argv[1], sys.argv[2], '--no-progress'])])")
    out = subprocess.run([sys.executable, "-c", code, str(stock[2]), str(tmp_path / "x.tl")], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("rc [0, 0, 1]") and "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tensorlist convert: error: {stock[2]}/__"), lines
    assert lines[0].endswith(".distcp: reading a torch.distributed.checkpoint record needs torch: pip install "
                             "'tensorlist[torch]'"), lines


class Opaque:
    def __init__(self, v):
        self.v = v


def test_a_value_weights_only_refuses_is_kept_as_its_bytes_never_unpickled(tmp_path):
    dcp.save({"w": torch.ones(3), "obj": Opaque(5)}, storage_writer=FileSystemWriter(tmp_path / "s"))
    with pytest.warns(UserWarning, match="'obj' is kept as its torch.save bytes"):
        convert(tmp_path / "s", tmp_path / "new", progress=False)
    assert read_metadata(tmp_path / "new").storage[("obj", None)].encoding == "torch_save"
    assert isinstance(read_full(tmp_path / "new")["obj"], bytes)
    with pytest.warns(MetadataDroppedWarning, match="'obj' are pickles"):
        convert(tmp_path / "new", tmp_path / "w.tl", progress=False)
    assert tl.open(tmp_path / "w.tl").metadata is None and list(tl.load(tmp_path / "w.tl")) == ["w"]


def test_a_safetensors_serialized_stock_checkpoint_is_refused_clearly(tmp_path, capsys):
    from torch.distributed.checkpoint.filesystem import SerializationFormat
    dcp.save({"w": torch.ones(3)}, storage_writer=FileSystemWriter(
        tmp_path / "s", serialization_format=SerializationFormat.SAFETENSORS))
    rc, _, err = cli(capsys, "convert", tmp_path / "s", tmp_path / "new", "--no-progress")
    assert rc == 1 and len(err) == 1 and "serialization_format=SAFETENSORS" in err[0] and "__0_0.distcp" in err[0]


# --- planted pickles: refused, never run -----------------------------------------------------------

class _System:
    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


class _Eval:
    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (eval, (f"__import__('os').system({self.command!r})",))


class _TorchLoad:
    def __reduce__(self):
        return (torch.load, ("/nonexistent",))


def _plant_bare(src, marker):
    return pickle.dumps(_System(f"touch {marker}"))


def _plant_in_planner_data(src, marker):
    with open(src / ".metadata", "rb") as f:
        md = pickle.load(f)  # the test's own, trusted file
    md.planner_data = {"x": _System(f"touch {marker}")}
    return pickle.dumps(md)


def _plant_eval_in_storage(src, marker):
    with open(src / ".metadata", "rb") as f:
        md = pickle.load(f)
    key = next(iter(md.storage_data))
    md.storage_data[key] = _Eval(f"touch {marker}")
    return pickle.dumps(md)


def _plant_torch_load(src, marker):
    with open(src / ".metadata", "rb") as f:
        md = pickle.load(f)
    md.version = _TorchLoad()
    return pickle.dumps(md)


PLANTED = [("bare os.system", _plant_bare, "posix.system"),
           ("os.system in planner_data", _plant_in_planner_data, "posix.system"),
           ("eval in storage_data", _plant_eval_in_storage, "builtins.eval"),
           ("torch.load as the version", _plant_torch_load, "torch.serialization.load")]


@pytest.mark.parametrize("plant,name", [p[1:] for p in PLANTED], ids=[p[0] for p in PLANTED])
def test_a_planted_metadata_pickle_is_refused_and_never_run(stock, tmp_path, plant, name):
    src = shutil.copytree(stock[2], tmp_path / "ckpt")
    marker = tmp_path / "pwned"
    evil = plant(src, marker)
    # the payload is live: plain pickle (what DCP's FileSystemReader runs) would run it
    live = tmp_path / "live"
    (tmp_path / "probe").write_bytes(plant(src, live))
    subprocess.run([sys.executable, "-c", "import pickle, sys; pickle.loads(open(sys.argv[1], 'rb').read())",
                    str(tmp_path / "probe")], capture_output=True, timeout=120)
    if name != "torch.serialization.load":
        assert live.exists(), "the planted payload does not run under plain pickle: the test tests nothing"
    (src / ".metadata").write_bytes(evil)
    for args in (["inspect", src], ["validate", "--verify", src], ["convert", src, tmp_path / "new"]):
        p = subprocess.run([sys.executable, "-m", "tensorlist", *map(str, args)], capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 1, (args, p.stdout, p.stderr)
        lines = p.stderr.strip().splitlines()  # every command's error: one line on stderr
        assert len(lines) == 1 and "Traceback" not in p.stderr, (p.stdout, p.stderr)
        assert f"{src / '.metadata'}: refused: the pickle asks for {name}" in lines[0], lines[0]
    assert not marker.exists() and not (tmp_path / "new").exists()


# --- bad stock checkpoints through the CLI: exit status 1, one line naming the file ---------------------

def _truncate(src):
    os.truncate(src / "__1_0.distcp", os.path.getsize(src / "__1_0.distcp") - 10)
    return "__1_0.distcp", "past the file's end"


def _missing(src):
    os.unlink(src / "__1_0.distcp")
    return "__1_0.distcp", "is missing"


def _outside(src):
    with open(src / ".metadata", "rb") as f:
        md = pickle.load(f)
    key = next(k for k, v in md.storage_data.items() if v.relative_path == "__0_0.distcp" and k.offset is not None)
    md.storage_data[key].offset = os.path.getsize(src / "__0_0.distcp") + 100
    (src / ".metadata").write_bytes(pickle.dumps(md))
    return "__0_0.distcp", f"{key.fqn!r}: the metadata places the chunk at offsets"


def _gap(src):
    with open(src / ".metadata", "rb") as f:
        md = pickle.load(f)
    md.state_dict_metadata["sharded"].chunks.pop()
    (src / ".metadata").write_bytes(pickle.dumps(md))
    return ".metadata", "'sharded': the chunks cover"


BAD = [("truncated data file", _truncate), ("missing rank file", _missing), ("chunk outside its file", _outside),
       ("a gap", _gap)]


@pytest.mark.parametrize("command", ["validate", "convert"])
@pytest.mark.parametrize("damage", [b[1] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_stock_checkpoints_are_one_line_naming_the_file(stock, tmp_path, capsys, command, damage):
    src = shutil.copytree(stock[2], tmp_path / "ckpt")
    named, message = damage(src)
    args = ["validate", src] if command == "validate" else ["convert", src, tmp_path / "new", "--no-progress"]
    rc, out, err = cli(capsys, *args)
    lines = err  # validate and convert alike: the error line on stderr
    assert rc == 1 and len(lines) == 1 and not out, (out, err)
    assert str(src / named) in lines[0] and message in lines[0], lines[0]
    assert not (tmp_path / "new").exists()


def _edit_md(edit):
    def damage(src):
        with open(src / ".metadata", "rb") as f:
            md = pickle.load(f)
        edit(md)
        (src / ".metadata").write_bytes(pickle.dumps(md))
    return damage


def _record(md, fqn):
    return next(v for k, v in md.storage_data.items() if k.fqn == fqn)


def _swap_records(md):
    """Two chunks of one file point at each other's records (their dtypes or shapes differ)."""
    by_file = {}
    for k, v in md.storage_data.items():
        if k.offset is not None:
            by_file.setdefault(v.relative_path, []).append(v)
    a, b = next(recs for recs in by_file.values() if len(recs) >= 2)[:2]
    a.offset, a.length, b.offset, b.length = b.offset, b.length, a.offset, a.length


def _dtype(md):
    md.state_dict_metadata["model.w"].properties.dtype = torch.complex32


def _cycle(md):
    loop = []
    loop.append(loop)
    md.planner_data = {"model.w": loop}


def _bomb(md):
    x = ["x"]
    for _ in range(80):  # 2**80 leaves in a few hundred bytes of pickle
        x = [x, x]
    md.planner_data = {"model.w": x}


def _sizes_bomb(src):
    """torch.Size applied 100,000 times to one list of 100,000 items (a few hundred KB of pickle)."""
    n = 100_000
    body = (b"\x80\x04\x8c\x05torch\x8c\x04Size\x93\x94]\x94(" + b"K\x01" * n + b"e"
            + b"h\x00h\x01\x85R0" * 100_000 + b"N.")
    (src / ".metadata").write_bytes(body)


# (id, damage, message) for pickles without a stray global: every field is still checked
HOSTILE = [
    ("path leaves the directory", _edit_md(lambda md: setattr(_record(md, "model.w"), "relative_path",
                                                              "../outside.distcp")),
     "is not a file FileSystemWriter writes"),
    ("dtype tensorlist lacks", _edit_md(_dtype), "'model.w': torch dtype complex32 has no tensorlist dataType"),
    ("stream extensions", _edit_md(lambda md: setattr(_record(md, "model.w"), "transform_descriptors", ["zstd"])),
     "stream extensions"),
    ("record too short", _edit_md(lambda md: setattr(_record(md, "model.w"), "length", 10)),
     "less than its 192 bytes of data"),
    ("records swapped", _edit_md(_swap_records), "the metadata says"),
    ("negative size", _edit_md(lambda md: setattr(md.state_dict_metadata["model.b"], "size", torch.Size([-5]))),
     "is not a torch.Size of non-negative integers"),
    ("state dict not a dict", _edit_md(lambda md: setattr(md, "state_dict_metadata", [1, 2])), "is not a dict"),
    ("garbage", lambda src: (src / ".metadata").write_bytes(b"\x80\x04garbage"), "the pickle cannot be read"),
    ("planner_data holds itself", _edit_md(_cycle), "a cycle, or a pickle bomb"),
    ("planner_data expands 2**80 times", _edit_md(_bomb), "a cycle, or a pickle bomb"),
    ("a million lists deep", lambda src: (src / ".metadata").write_bytes(
        b"\x80\x04" + b"]" * 1_000_000 + b"a" * 999_999 + b"."), "expected DCP's Metadata, got a list of 1 items"),
    ("torch.Size of a huge list, many times", _sizes_bomb, "not a list of at most 64 integers"),
    ("JSON", lambda src: (src / ".metadata").write_text('{"format": "x"}'), "is JSON, not DCP's pickled metadata"),
]


@pytest.mark.parametrize("damage,message", [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_hostile_stock_metadata_is_one_line(stock, tmp_path, capsys, damage, message):
    src = shutil.copytree(stock[2], tmp_path / "ckpt")
    damage(src)
    rc, _, err = cli(capsys, "validate", "--verify", src)
    assert rc == 1 and len(err) == 1 and message in err[0] and str(src) in err[0], err


# --- URLs: S3 on loopback, memory:// ----------------------------------------------------------------

def test_tensorlistwriter_on_2_gloo_ranks_to_s3_loads_on_1(s3, s3_prefix, tmp_path, capsys):
    url = f"{s3_prefix}/ckpt"
    _ranks.run_script(__file__, "s3", 2, url, env=s3["env"])
    names = sorted(n.rsplit("/", 1)[-1] for n in s3["fs"].ls(url.removeprefix("s3://"), detail=False))
    assert METADATA_NAME in names and len([n for n in names if n.endswith(".tl")]) == 2
    check_full(url)
    sd = {"model": {k: torch.zeros_like(v) for k, v in plain().items()}, "sharded": torch.zeros(7, 4), "step": 0,
          "cfg": {"betas": None, "name": None}}
    dcp.load(sd, storage_reader=TensorListReader(url))
    same(sd["sharded"], sharded(), "sharded")
    assert sd["step"] == 7 and sd["cfg"]["betas"] == (0.9, 0.999)
    rc, out, _ = cli(capsys, "validate", "--verify", f"{url}/")
    assert rc == 0 and "2 shard files, checksums verified" in out[0]
    assert cli(capsys, "convert", f"{url}/", tmp_path / "m.safetensors", "--no-progress")[0] == 0
    with open_source(tmp_path / "m.safetensors") as s:
        same(next(e for e in s.entries if e.name == "sharded").array(), sharded(), "sharded")


def test_a_save_to_s3_stages_nothing_on_local_disk(s3_prefix, monkeypatch):
    """Each rank's shard streams to the store: no local file is written on the way, not even a spool.

    The ways this package writes local files are refused while the save runs: the local commit protocol
    (``writer``'s ``Commit`` and ``atomic_file``, ``dcp``'s ``atomic_file``) and the remote writer's spool
    directory (the moto server in this process keeps its own temporary files, so ``tempfile`` itself is
    left alone).
    """
    import types

    import tensorlist.dcp.layout as dcp_read
    import tensorlist.remote as remote
    import tensorlist.writer as writer

    def refuse(*args, **kwargs):
        raise AssertionError("a save to a URL wrote a local file")
    monkeypatch.setattr(writer, "Commit", refuse)
    monkeypatch.setattr(writer, "atomic_file", refuse)
    monkeypatch.setattr(dcp_read, "atomic_file", refuse)  # the metadata's local commit
    monkeypatch.setattr(remote, "tempfile", types.SimpleNamespace(mkdtemp=refuse, mkstemp=refuse))
    url = f"{s3_prefix}/big"
    sd = {"w": torch.randn(1024, 1024), "b": torch.arange(1000), "step": 3}
    dcp.save(sd, storage_writer=TensorListWriter(url))
    monkeypatch.undo()
    full = read_full(url)
    same(full["w"], sd["w"], "w")
    assert full["step"] == 3


def test_a_stock_checkpoint_imports_to_a_memory_url(stock, capsys):
    url = f"memory://tensorlist-dcp-import-{os.getpid()}/ckpt/"
    assert cli(capsys, "convert", stock[2], url, "--no-progress")[0] == 0
    check_full(url)
    import fsspec
    fsspec.filesystem("memory").rm(url.removeprefix("memory://").rstrip("/"), recursive=True)


if __name__ == "__main__":
    worker(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])

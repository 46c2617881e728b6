"""Stock DCP checkpoints (``FileSystemWriter``'s layout) read from a URL, through the command line.

A checkpoint is saved locally by torch's own ``dcp.save(..., storage_writer=FileSystemWriter(dir))``
(one process, no process group), its files are copied into fsspec's ``memory://`` filesystem (and
into an S3 prefix on moto's server: the ``s3`` fixture of conftest.py), and ``inspect``,
``validate``, ``convert`` and ``diff`` read it from there, named with and without the final ``/``:
the same reader as for a local directory (``tensorlist.convert.distcp``), its files reached through
fsspec, each record fetched alone by its byte range.
"""
import json
import os
import uuid
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
fsspec = pytest.importorskip("fsspec", reason="remote URLs need fsspec")

from tensorlist.cli import main  # noqa: E402
from tensorlist.convert import infer_format, open_source  # noqa: E402
from tensorlist.dcp import read_full, read_metadata  # noqa: E402

STATE = {
    "model.weight": torch.arange(12, dtype=torch.float32).reshape(4, 3),
    "model.bias": torch.tensor([0.5, -1.0, 2.0], dtype=torch.bfloat16),
    "step": 7,
    "betas": [0.9, 0.999],
}


@pytest.fixture(scope="module")
def stock(tmp_path_factory):
    """A FileSystemWriter checkpoint saved by torch in a local directory."""
    path = tmp_path_factory.mktemp("stock") / "ck"
    with warnings.catch_warnings():  # "torch.distributed is ... uninitialized, assuming ... a single process"
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(dict(STATE), storage_writer=dcp.FileSystemWriter(str(path)))
    assert (path / ".metadata").exists() and any(n.endswith(".distcp") for n in os.listdir(path))
    return path


def _upload(stock, fs, root):
    for name in sorted(os.listdir(stock)):
        fs.pipe_file(f"{root}/{name}", (stock / name).read_bytes())


@pytest.fixture
def memory_url(stock):
    """The stock checkpoint's files copied to ``memory://<fresh>/ck`` (no final /)."""
    mem = fsspec.filesystem("memory")
    name = f"tensorlist-torch-dcp-{uuid.uuid4().hex[:8]}"
    _upload(stock, mem, f"/{name}/ck")
    yield f"memory://{name}/ck"
    mem.rm(f"/{name}", recursive=True)


@pytest.fixture(params=["memory", "s3"])
def url(request, stock):
    if request.param == "memory":
        return request.getfixturevalue("memory_url")
    s3, prefix = request.getfixturevalue("s3"), request.getfixturevalue("s3_prefix")
    _upload(stock, s3["fs"], prefix.removeprefix("s3://") + "/ck")
    return prefix + "/ck"


def cli(capsys, *args):
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def _check_tensors(got):
    for k in ("model.weight", "model.bias"):
        want = STATE[k]
        if want.dtype == torch.bfloat16:
            want = want.view(torch.int16).numpy().view(np.uint16)
            got_k = np.asarray(got[k]).view(np.uint16)
        else:
            want, got_k = want.numpy(), np.asarray(got[k])
        np.testing.assert_array_equal(got_k, want, err_msg=k)


@pytest.mark.parametrize("slash", ["", "/"])
def test_inspect_and_validate(url, slash, capsys):
    assert infer_format(url + slash, for_reading=True) == "torch-dcp"
    rc, out, err = cli(capsys, "inspect", url + slash)
    assert rc == 0 and err == ""
    assert out.startswith(f"{url + slash}  (format torch-dcp: DCP FileSystemWriter layout")
    assert "model.weight" in out and "float32" in out and "(4, 3)" in out
    rc, out, _ = cli(capsys, "inspect", url + slash, "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["format"] == "torch-dcp" and doc["files"] == ["__0_0.distcp"]
    rc, out, err = cli(capsys, "validate", "--verify", url + slash)
    assert rc == 0 and err == "" and out.startswith(f"{url + slash}: ok (torch-dcp checkpoint, 2 tensors")
    assert "every record loaded with torch.load(weights_only=True)" in out


@pytest.mark.parametrize("slash", ["", "/"])
def test_convert_from_the_url(url, slash, stock, tmp_path, capsys):
    new = tmp_path / "new"  # no extension, the source a checkpoint: tensorlist's layout
    rc, _, err = cli(capsys, "convert", url + slash, new, "--no-progress")
    assert rc == 0 and err == ""
    full = read_full(new)
    _check_tensors(full)
    assert full["step"] == 7 and full["betas"] == [0.9, 0.999]
    rc, out, _ = cli(capsys, "diff", url + slash, stock)  # the URL and the local original: the same
    assert rc == 0 and out.startswith("same: 2 tensors identical")
    flat = tmp_path / "m.safetensors"
    assert cli(capsys, "convert", url + slash, flat, "--no-progress")[0] == 0
    with open_source(flat) as src:
        _check_tensors({e.name: e.array() for e in src.entries})
        assert src.metadata == {"dcpValues": {"step": 7, "betas": [0.9, 0.999]}}


def test_convert_from_a_url_to_a_url(memory_url, capsys):
    dst = memory_url.rsplit("/", 1)[0] + "/imported"
    assert cli(capsys, "convert", memory_url, dst, "--no-progress")[0] == 0
    assert infer_format(dst, for_reading=True) == "dcp" and len(read_metadata(dst).files) == 1
    _check_tensors(read_full(dst))


def test_records_are_fetched_by_their_byte_ranges(memory_url, tmp_path, monkeypatch, capsys):
    """A record is read alone (``cat_file`` with start and end), never its whole ``.distcp`` file."""
    calls = []
    cat = fsspec.implementations.memory.MemoryFileSystem.cat_file

    def spy(self, path, start=None, end=None, **kw):
        calls.append((path.rsplit("/", 1)[-1], start, end))
        return cat(self, path, start=start, end=end, **kw)

    monkeypatch.setattr(fsspec.implementations.memory.MemoryFileSystem, "cat_file", spy)
    assert cli(capsys, "convert", memory_url, tmp_path / "x.tl", "--no-progress")[0] == 0
    records = [c for c in calls if c[0].endswith(".distcp")]
    assert len(records) == 4  # 2 tensors, 2 values
    assert all(start is not None and end is not None and end > start for _, start, end in records), records
    assert sum(end - start for _, start, end in records) < fsspec.filesystem("memory").size(
        memory_url.removeprefix("memory://") + "/__0_0.distcp") + 1


def test_a_truncated_remote_record_is_refused_naming_the_url(memory_url, tmp_path, capsys):
    mem = fsspec.filesystem("memory")
    key = memory_url.removeprefix("memory://") + "/__0_0.distcp"
    mem.pipe_file(key, mem.cat_file(key)[:-100])
    rc, _, err = cli(capsys, "convert", memory_url, tmp_path / "x.tl", "--no-progress")
    assert rc == 1 and err.count("\n") == 1
    assert f"{memory_url}/__0_0.distcp" in err and "past the file's end" in err


def test_a_missing_remote_data_file_is_refused(memory_url, capsys):
    fsspec.filesystem("memory").rm_file(memory_url.removeprefix("memory://") + "/__0_0.distcp")
    rc, out, err = cli(capsys, "validate", memory_url)
    assert rc == 1 and out == "" and "data file '__0_0.distcp' of the checkpoint is missing" in err

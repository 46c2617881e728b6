"""Remote checkpoint directories through the command line, named with and without their trailing ``/``.

A DCP checkpoint of tensorlist's layout is written at a URL (fsspec's
``memory://``, and an S3 prefix on moto's server: the ``s3`` fixture of
conftest.py), then ``inspect``, ``validate``, ``convert`` and ``diff`` run on
it through ``tensorlist.cli.main`` (what ``python -m tensorlist`` runs; in
this process, where the memory filesystem lives) as ``memory://…/ck`` and as
``memory://…/ck/``: both name the checkpoint directory
(``tensorlist.convert.formats.is_directory``), as a local directory is one
with or without its slash.
"""
import json
import uuid

import numpy as np
import pytest

import tensorlist as tl
from tensorlist.cli import main
from tensorlist.convert import infer_format, open_source
from tensorlist.convert.formats import is_directory
from tensorlist.dcp import METADATA_NAME, read_full, read_metadata

pytest.importorskip("fsspec", reason="remote URLs need fsspec")

TENSORS = {
    "layer.weight": np.arange(12, dtype=np.float32).reshape(3, 4),
    "layer.bias": np.array([1.5, -2.0, 0.25], dtype=np.float64),
    "step": np.array(7, dtype=np.int64),
}
VALUES = {"epoch": 3, "betas": [0.9, 0.999]}


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "flat.tl"
    tl.save(path, TENSORS, metadata={"dcpValues": VALUES})
    return str(path)


@pytest.fixture(params=["memory", "s3"])
def folder(request):
    """A fresh remote folder URL, no trailing slash (removed afterwards for memory://)."""
    if request.param == "s3":
        yield request.getfixturevalue("s3_prefix")
        return
    import fsspec

    name = f"tensorlist-remote-dcp-{uuid.uuid4().hex[:8]}"
    yield f"memory://{name}"
    fs = fsspec.filesystem("memory")
    if fs.exists(f"/{name}"):
        fs.rm(f"/{name}", recursive=True)


@pytest.fixture
def ckpt(folder, source, capsys):
    """A checkpoint of tensorlist's layout at ``<folder>/ck`` (written through a name ending with /)."""
    url = f"{folder}/ck"
    assert main(["convert", source, url + "/", "--no-progress"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert read_metadata(url).files  # committed
    return url


def cli(capsys, *args):
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("slash", ["", "/"])
def test_names_a_checkpoint_with_and_without_slash(ckpt, slash):
    assert is_directory(ckpt + slash)
    assert infer_format(ckpt + slash, for_reading=True) == "dcp"
    assert infer_format(ckpt + slash) == "dcp"  # as a destination too: it exists


@pytest.mark.parametrize("slash", ["", "/"])
def test_inspect(ckpt, slash, capsys):
    rc, out, err = cli(capsys, "inspect", ckpt + slash)
    assert rc == 0 and err == ""
    assert out.splitlines()[0].startswith(f"{ckpt + slash}  (format dcp: tensorlist's DCP layout")
    assert "layer.weight" in out and "3 tensors in 3 chunks" in out and "2 values" in out
    rc, out, err = cli(capsys, "inspect", ckpt + slash, "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["format"] == "dcp" and doc["checkpoint"] == ckpt + slash
    assert {t["name"]: t["shape"] for t in doc["tensors"]} == {k: list(v.shape) for k, v in TENSORS.items()}
    assert sorted(v["name"] for v in doc["values"]) == sorted(VALUES)


@pytest.mark.parametrize("slash", ["", "/"])
def test_validate(ckpt, slash, capsys):
    rc, out, err = cli(capsys, "validate", "--verify", ckpt + slash)
    assert rc == 0 and err == ""
    assert out == (f"{ckpt + slash}: ok (dcp checkpoint, 3 tensors in 3 chunks, 2 values, 1 shard files, "
                   "checksums verified)\n")


@pytest.mark.parametrize("slash", ["", "/"])
def test_validate_finds_a_broken_remote_checkpoint(ckpt, slash, capsys):
    import fsspec

    fs, root = fsspec.core.url_to_fs(ckpt)
    shard = read_metadata(ckpt).files[0]
    fs.rm_file(f"{root.rstrip('/')}/{shard}")
    rc, out, err = cli(capsys, "validate", ckpt + slash)
    assert rc == 1 and out == "" and err.count("\n") == 1 and err.startswith("tensorlist validate: error: ")
    assert f"shard file {shard!r} of the checkpoint is missing" in err


@pytest.mark.parametrize("slash", ["", "/"])
def test_convert_to_local_files(ckpt, slash, tmp_path, capsys):
    out = tmp_path / "m.safetensors"
    assert cli(capsys, "convert", ckpt + slash, out, "--no-progress")[0] == 0
    with open_source(out) as src:
        got = {e.name: e.array() for e in src.entries}
        assert src.metadata == {"dcpValues": VALUES}  # the values, through safetensors' __metadata__
    assert set(got) == set(TENSORS)
    for k, v in TENSORS.items():
        np.testing.assert_array_equal(got[k], v)
    copy = tmp_path / "copy"  # no extension, the source a checkpoint: a checkpoint directory
    assert cli(capsys, "convert", ckpt + slash, copy, "--no-progress")[0] == 0
    assert (copy / METADATA_NAME).exists()
    rc, out, _ = cli(capsys, "diff", ckpt + slash, copy)
    assert rc == 0 and out.startswith("same: 3 tensors identical")


@pytest.mark.parametrize("slash", ["", "/"])
def test_convert_into_an_existing_remote_checkpoint(ckpt, slash, source, capsys):
    """An existing directory is a dcp destination, named with or without its slash (as a local one), replaced
    with --force only."""
    before = read_metadata(ckpt)
    changed = {k: v + 1 for k, v in TENSORS.items()}
    src = source.replace("flat.tl", "changed.tl")
    tl.save(src, changed)
    rc, _, err = cli(capsys, "convert", src, ckpt + slash, "--no-progress")
    assert rc == 1 and err == f"tensorlist convert: error: {ckpt + slash}: exists and is not empty; pass --force to " \
        "replace it\n"
    assert read_metadata(ckpt).save_id == before.save_id  # nothing written
    assert cli(capsys, "convert", src, ckpt + slash, "--no-progress", "--force")[0] == 0
    after = read_metadata(ckpt)
    assert after.save_id != before.save_id and after.files != before.files
    full = read_full(ckpt)
    for k, v in changed.items():
        np.testing.assert_array_equal(full[k], v)
    import fsspec

    fs, root = fsspec.core.url_to_fs(ckpt)
    names = sorted(n.rsplit("/", 1)[-1] for n in fs.ls(root.rstrip("/"), detail=False))
    assert not any(n.startswith(before.files[0]) for n in names), names  # the replaced save's files are gone


def test_a_remote_file_without_extension_is_still_a_file(folder, capsys):
    url = f"{folder}/model"
    tl.save(url, TENSORS)
    assert not is_directory(url) and infer_format(url, for_reading=True) == "tensorlist"
    rc, out, _ = cli(capsys, "inspect", url)
    assert rc == 0 and out.startswith(f"{url}  (data: ") and "format tensorlist v1" in out
    rc, out, _ = cli(capsys, "validate", url)
    assert rc == 0 and out.startswith(f"{url}: ok (1 list, 3 tensors")


def test_a_missing_remote_name_is_one_error(folder, capsys):
    url = f"{folder}/nothing-here"
    assert not is_directory(url)
    rc, out, err = cli(capsys, "inspect", url)
    assert rc == 1 and out == "" and err.startswith("tensorlist inspect: error:") and err.count("\n") == 1
    rc, out, err = cli(capsys, "validate", url + "/")
    assert rc == 1 and out == "" and "no checkpoint metadata" in err

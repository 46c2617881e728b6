"""Hostile checkpoint directories, one class each, built as an attacker would.

Every checkpoint here is built with numpy alone (``_dcp_support.make_checkpoint``) and then broken: a
shard, the metadata or a stock ``.distcp`` file symlinked out of the directory; malformed tagged JSON in a
value or in ``plannerData``; chunk layouts that made the tiling check quadratic; more dimensions than a
tensor may have; sizes whose element count has thousands of digits; a metadata that promises more bytes
than the shards hold; a killed commit's temporary metadata. Each must be a FormatError naming the file
(and the fqn or field), fast, before anything is allocated or followed.
"""
import json
import os
import time

import numpy as np
import pytest

from tensorlist.convert import convert, open_source
from tensorlist.dcp import METADATA_NAME, TensorMeta, read_full, read_metadata, validate_checkpoint
from tensorlist.dcp.layout import is_save_file
from tensorlist.dcp.metadata import parse_metadata
from tensorlist.dcp.tiling import check_tiling
from tensorlist.errors import FormatError

from _dcp_support import SAVE_ID, make_checkpoint

SHARD0 = f"0.{SAVE_ID}.tl"


def edit_metadata(path, edit):
    file = path / METADATA_NAME
    doc = json.loads(file.read_text())
    edit(doc)
    file.write_text(json.dumps(doc))


def set_value(path, fqn, text: bytes):
    """Rewrites the JSON bytes of value ``fqn`` in its shard (and its byteLength in the metadata)."""
    import tensorlist as tl
    doc = json.loads((path / METADATA_NAME).read_text())
    entry = next(e for e in doc["storage"] if e["fqn"] == fqn)
    shard = path / entry["file"]
    arrays = {k: np.array(v) for k, v in tl.load(shard).items()}
    arrays[entry["tensor"]] = np.frombuffer(text, np.uint8)
    for name in os.listdir(path):
        if name.startswith(entry["file"] + "."):
            os.unlink(path / name)
    tl.save(shard, arrays, metadata={"dcp": {"saveId": SAVE_ID, "rank": int(entry["file"][0])}})
    entry["byteLength"] = len(text)
    (path / METADATA_NAME).write_text(json.dumps(doc))


def link_out(path, name, tmp_path):
    """Moves file ``name`` out of the checkpoint and leaves a symlink to it in its place."""
    outside = tmp_path / "elsewhere"
    outside.mkdir(exist_ok=True)
    os.replace(path / name, outside / name)
    os.symlink(outside / name, path / name)


def _shard_link(path, tmp_path):
    link_out(path, SHARD0, tmp_path)


def _metadata_link(path, tmp_path):
    link_out(path, METADATA_NAME, tmp_path)


def _bad_float(path, tmp_path):
    set_value(path, "step", b'{"__float__": [1]}')


def _bad_dict(path, tmp_path):
    set_value(path, "step", b'{"__dict__": [[1]]}')


def _bad_float_text(path, tmp_path):
    set_value(path, "step", b'{"__float__": "1e400"}')


def _planner_float(path, tmp_path):
    edit_metadata(path, lambda d: d.__setitem__("plannerData", {"x": {"__float__": [1]}}))


def _planner_dict(path, tmp_path):
    edit_metadata(path, lambda d: d.__setitem__("plannerData", {"__dict__": [[1]]}))


def _many_dims(path, tmp_path):
    edit_metadata(path, lambda d: d["stateDict"]["b"].__setitem__("size", [1] * 10_000))


def _huge_sizes(path, tmp_path):
    def edit(d):
        w = d["stateDict"]["b"]
        w["size"] = [2 ** 62] * 64
        w["chunks"] = [{"offsets": [0] * 64, "sizes": [1] * 64}]
        next(e for e in d["storage"] if e["fqn"] == "b")["offset"] = [0] * 64
    edit_metadata(path, edit)


def _promises_more(path, tmp_path):
    def edit(d):  # 2^41 float32 elements (8 TiB) in one chunk the shard holds as 5 elements
        d["stateDict"]["b"].update(size=[2 ** 41], dtype="float32", chunks=[{"offsets": [0], "sizes": [2 ** 41]}])
        next(e for e in d["storage"] if e["fqn"] == "b")["byteLength"] = 2 ** 43
    edit_metadata(path, edit)


def _missing_shard(path, tmp_path):
    shard = f"1.{SAVE_ID}.tl"
    os.unlink(path / shard)


# class id, how to break the checkpoint, the message, the file it must name (relative to the checkpoint)
HOSTILE = [
    ("shard symlinked out", _shard_link, r"shard file '0\.0123abcd\.tl' resolves to .*outside the checkpoint", SHARD0),
    ("metadata symlinked out", _metadata_link, r"metadata file '\.metadata\.json' resolves to .*outside",
     METADATA_NAME),
    ("value __float__ not a text", _bad_float, r"'step': malformed tagged value .*__float__ takes", SHARD0),
    ("value __dict__ pair of one", _bad_dict, r"'step': malformed tagged value .*__dict__ takes an array of \[key, "
     "value\\] pairs", SHARD0),
    ("value __float__ finite text", _bad_float_text, r"'step': malformed tagged value", SHARD0),
    ("plannerData __float__", _planner_float, r"plannerData: malformed tagged value", METADATA_NAME),
    ("plannerData __dict__", _planner_dict, r"plannerData: malformed tagged value", METADATA_NAME),
    ("10^4 dims", _many_dims, r"10000 dimensions, more than the 64 a tensor may have", METADATA_NAME),
    ("64 dims of 2^62", _huge_sizes, r"'b': the chunks cover 1 of the tensor's <int of \d+ bits> elements",
     METADATA_NAME),
    ("metadata promises 8 TiB", _promises_more, r"'b': the metadata says the chunk at offsets \[0\] is "
     r"float32\[2199023255552\], the shard holds int64\[5\]", f"1.{SAVE_ID}.tl"),
    ("a shard missing", _missing_shard, r"shard file '1\.0123abcd\.tl' of the checkpoint is missing",
     f"1.{SAVE_ID}.tl"),
]


# the classes a dcp.load (TensorListReader) meets on resume, with a template of the saved state dict
TORCH_LOAD = ("shard symlinked out", "metadata symlinked out", "value __float__ not a text",
              "value __dict__ pair of one", "plannerData __float__", "10^4 dims", "a shard missing")


@pytest.mark.filterwarnings("ignore::UserWarning")
class TestHostileCheckpoints:
    """Each class of hostile directory through every reader: read_full, validate_checkpoint, convert."""

    @pytest.fixture
    def broken(self, tmp_path, request):
        _, edit, message, named = request.param
        path = make_checkpoint(tmp_path / "ckpt")
        edit(path, tmp_path)
        return path, message, named

    @pytest.mark.parametrize("broken", HOSTILE, ids=[h[0] for h in HOSTILE], indirect=True)
    @pytest.mark.parametrize("reader", ["read_full", "validate_checkpoint", "convert"])
    def test_refused_naming_the_file(self, broken, reader, tmp_path):
        path, message, named = broken
        t0 = time.perf_counter()
        with pytest.raises(FormatError, match=message) as e:
            if reader == "read_full":
                read_full(path)
            elif reader == "validate_checkpoint":
                validate_checkpoint(path, schema=False)
            else:
                convert(path, tmp_path / "out.tl", progress=False)
        assert e.value.file == str(path / named)
        assert time.perf_counter() - t0 < 5

    @pytest.mark.parametrize("broken", [h for h in HOSTILE if h[0] in TORCH_LOAD], ids=list(TORCH_LOAD),
                             indirect=True)
    def test_refused_by_dcp_load_naming_the_file(self, broken):
        torch = pytest.importorskip("torch", reason="dcp.load needs torch")
        import torch.distributed.checkpoint as dcp
        from tensorlist.dcp import TensorListReader
        path, message, named = broken
        template = {"w": torch.zeros(8, 6), "h": torch.zeros(4, 4, dtype=torch.bfloat16),
                    "b": torch.zeros(5, dtype=torch.int64), "s": torch.tensor(0.0, dtype=torch.float64),
                    "e": torch.zeros(0, 3), "step": 0, "betas": None, "best": None}
        with pytest.raises(BaseException, match=message) as e:  # DCP wraps it in a CheckpointException
            dcp.load(template, storage_reader=TensorListReader(path))
        assert str(path / named) in str(e.value)

    def test_a_truncated_data_file_on_resume_is_a_format_error_naming_it(self, tmp_path):
        torch = pytest.importorskip("torch", reason="dcp.load needs torch")
        import torch.distributed.checkpoint as dcp
        from tensorlist.dcp import TensorListReader
        path = make_checkpoint(tmp_path / "ckpt")
        data = next(n for n in os.listdir(path) if n.startswith(SHARD0 + ".") and n.endswith(".data"))
        os.truncate(path / data, 16)
        with pytest.raises(BaseException, match=r"truncated|bytes but the list needs") as e:
            dcp.load({"w": torch.zeros(8, 6)}, storage_reader=TensorListReader(path))
        assert SHARD0 in str(e.value)
        with pytest.raises(FormatError, match=r"truncated|bytes but the list needs"):
            read_full(path)

    def test_a_stock_distcp_file_symlinked_out_is_refused(self, tmp_path):
        torch = pytest.importorskip("torch", reason="writing a stock DCP checkpoint needs torch")
        import torch.distributed.checkpoint as dcp
        stock = tmp_path / "stock"
        dcp.save({"w": torch.ones(3)}, storage_writer=dcp.FileSystemWriter(stock))
        name = next(n for n in os.listdir(stock) if n.endswith(".distcp"))
        link_out(stock, name, tmp_path)
        with pytest.raises(FormatError, match=rf"{name}' resolves to .*outside the checkpoint") as e:
            convert(stock, tmp_path / "out.tl", progress=False)
        assert e.value.file == str(stock / name)

    def test_a_symlink_inside_the_directory_is_followed(self, tmp_path):
        path = make_checkpoint(tmp_path / "ckpt")
        os.mkdir(path / "sub")
        os.replace(path / SHARD0, path / "sub" / SHARD0)
        os.symlink(os.path.join("sub", SHARD0), path / SHARD0)
        want = read_full(tmp_path / "ckpt")  # (read through the link already)
        validate_checkpoint(path, verify=True)
        assert sorted(read_full(path)) == sorted(want) and np.array_equal(read_full(path)["w"], want["w"])


def _meta(size, chunks):
    return TensorMeta("w", "float32", size, tuple(chunks))


TILINGS = [  # id, size, chunks, None (accepted) or the message
    ("4000 column chunks at one offset", (4, 4000), [((0, 0), (4, 1))] * 4000, "chunks 0 and 1 overlap"),
    ("4000 column chunks", (4, 4000), [((0, i), (4, 1)) for i in range(4000)], None),
    ("10^5 row chunks", (10 ** 5, 2), [((i, 0), (1, 2)) for i in range(10 ** 5)], None),
    ("10^5 chunks at one offset", (10 ** 5, 2), [((0, 0), (1, 2))] * 10 ** 5, "chunks 0 and 1 overlap"),
    ("300 x 300 grid", (300, 300), [((i, j), (1, 1)) for i in range(300) for j in range(300)], None),
    ("staircase (no grid)", (3000, 3000), [((i, 0), (1, i)) for i in range(3000)] +
     [((i, i), (1, 3000 - i)) for i in range(3000)], None),
    ("staircase with an overlap", (3000, 3000), [((i, 0), (1, i + (i == 7))) for i in range(3000)] +
     [((i, i), (1, 3000 - i)) for i in range(3000)], "chunks 7 and 3007 overlap"),
    ("a gap at the end", (8, 6), [((0, 0), (5, 6)), ((5, 0), (2, 6))], "cover 42 of the tensor's 48"),
    ("3-D bricks", (4, 4, 4), [((i, j, k), (2, 2, 2)) for i in (0, 2) for j in (0, 2) for k in (0, 2)], None),
    ("3-D overlap", (4, 4, 4), [((i, j, k), (2, 2, 2)) for i in (0, 2) for j in (0, 2) for k in (0, 1)],
     "overlap"),
    ("empty chunks at one offset", (0, 3), [((0, 0), (0, 3))] * 3, None),
    ("two scalars", (), [((), ()), ((), ())], "chunks 0 and 1 overlap"),
]


@pytest.mark.parametrize("size,chunks,message", [t[1:] for t in TILINGS], ids=[t[0] for t in TILINGS])
def test_the_tiling_check_is_fast_on_layouts_that_made_it_quadratic(size, chunks, message):
    t0 = time.perf_counter()
    if message is None:
        check_tiling(_meta(size, chunks), "m.json", "/stateDict/w")
    else:
        with pytest.raises(FormatError, match=message):
            check_tiling(_meta(size, chunks), "m.json", "/stateDict/w")
    assert time.perf_counter() - t0 < 1.0


def test_a_tensor_of_over_4300_digit_element_count_is_described_without_its_digits():
    with pytest.raises(FormatError, match=r"cover 0 of the tensor's <int of 3969 bits> elements") as e:
        check_tiling(_meta((2 ** 62,) * 64, [((0,) * 64, (0,) + (1,) * 63)]), "m.json", "/stateDict/w")
    assert len(str(e.value)) < 300


def test_the_dims_cap_is_the_descriptors_and_names_the_field():
    doc = json.loads(json.dumps({"format": "tensorlist-dcp", "formatVersion": 1, "saveId": SAVE_ID, "files": [],
                                 "stateDict": {"w": {"type": "tensor", "dtype": "float32", "size": [1] * 65,
                                                     "chunks": [], "properties": {
                                                         "layout": "strided", "requiresGrad": False,
                                                         "memoryFormat": "contiguous_format", "pinMemory": False}}},
                                 "storage": []}))
    with pytest.raises(FormatError, match="65 dimensions, more than the 64") as e:
        parse_metadata(doc, file="m.json")
    assert e.value.field == "/stateDict/w/size"
    doc["stateDict"]["w"]["size"] = [1] * 64
    with pytest.raises(FormatError, match="cover 0 of the tensor's 1 elements"):
        parse_metadata(doc, file="m.json")


def test_a_killed_commits_temporary_metadata_is_swept_by_the_next_save(tmp_path):
    path = make_checkpoint(tmp_path / "ckpt")
    left = path / "..metadata.json.0badc0de.tmp"
    left.write_text("{partial")
    assert is_save_file(left.name) == ""
    src = tmp_path / "m.npz"
    np.savez(src, w=np.ones(3))
    convert(src, path, dst_format="dcp", progress=False)
    assert not left.exists() and read_full(path)["w"].tolist() == [1.0, 1.0, 1.0]


def test_the_torch_writer_sweeps_it_too(tmp_path):
    torch = pytest.importorskip("torch", reason="TensorListWriter needs torch")
    import torch.distributed.checkpoint as dcp
    from tensorlist.dcp import TensorListWriter
    path = make_checkpoint(tmp_path / "ckpt")
    left = path / "..metadata.json.0badc0de.tmp"
    left.write_text("{partial")
    writer = TensorListWriter(path)
    with pytest.warns(UserWarning, match="torch.distributed"):
        dcp.save({"w": torch.ones(2)}, storage_writer=writer)
    writer.wait()
    assert not left.exists() and sorted(read_full(path)) == ["w"]


def test_a_stock_source_opens_only_confined_files(tmp_path):
    path = make_checkpoint(tmp_path / "ckpt")
    link_out(path, f"1.{SAVE_ID}.tl", tmp_path)
    with pytest.raises(FormatError, match="outside the checkpoint"):
        open_source(path)
    assert read_metadata(path).save_id == SAVE_ID  # the metadata alone is still readable

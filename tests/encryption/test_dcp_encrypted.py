"""Encrypted DCP checkpoints: ``TensorListWriter``/``TensorListReader(encryption_key=)``, ``read_full``/``validate_checkpoint(key=)``.

Every shard is an encrypted list; ``.metadata.json`` stays plain (fqns,
dtypes, shapes, offsets). A load with the key reads each chunk whole
through the keyed reader; without it (or with another) every reader raises
``EncryptionError`` naming the shard, and the byte-range path, which reads
the data files raw, refuses an encrypted shard rather than return
ciphertext. Two gloo ranks save a sharded (DTensor) checkpoint that one
process loads back resharded.

This file is also the ranks' script: ``python THIS save RANK WORLD PORT ROOT``.
"""
import datetime
import os
import sys
import warnings

import pytest

pytest.importorskip("cryptography")
torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
import torch.distributed as dist  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

import tensorlist as tl  # noqa: E402
from tensorlist.dcp import TensorListReader, TensorListWriter, read_full, validate_checkpoint  # noqa: E402
from tensorlist.dcp import METADATA_NAME, Shards, read_metadata  # noqa: E402

import _ranks  # noqa: E402

KEY = tl.Key(bytes(range(32)))
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def values():
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(64, 48, generator=g), "h": torch.randn(6, 4, generator=g).bfloat16(),
            "i": torch.arange(5), "step": 7, "name": "run-1"}


def zeros():
    v = values()
    return {k: torch.zeros_like(x) if isinstance(x, torch.Tensor) else None for k, x in v.items()}


def save(path, key=KEY):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(values(), storage_writer=TensorListWriter(str(path), encryption_key=key))


def _shard(path):
    return next(os.path.join(path, f) for f in sorted(os.listdir(path)) if f.endswith(".tl"))


def _check(back):
    want = values()
    for k, v in want.items():
        assert (torch.equal(back[k], v) if isinstance(v, torch.Tensor) else back[k] == v), k


def test_a_checkpoint_saves_and_loads_with_the_key(tmp_path):
    save(tmp_path)
    shard = _shard(tmp_path)
    assert tl.open(shard).encrypted
    with open(shard) as f:
        assert "saveId" not in f.read()  # the shard's metadata is sealed
    meta = read_metadata(str(tmp_path))  # plain: what DCP plans with, no tensor bytes
    assert meta.entries["w"].size == (64, 48)
    back = zeros()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(back, storage_reader=TensorListReader(str(tmp_path), encryption_key=KEY))
    _check(back)
    full = read_full(str(tmp_path), key=KEY)
    assert torch.equal(torch.from_numpy(full["w"]), values()["w"]) and full["step"] == 7
    validate_checkpoint(str(tmp_path), key=KEY, verify=True)


def test_without_the_key_or_with_another_every_reader_refuses(tmp_path):
    save(tmp_path)
    shard = _shard(tmp_path)
    for key, words in ((None, "pass key="), (tl.Key.generate(), "another key")):
        for read in (lambda: read_full(str(tmp_path), key=key), lambda: validate_checkpoint(str(tmp_path), key=key)):
            with pytest.raises(tl.EncryptionError, match=words) as info:
                read()
            assert info.value.file == shard
        back = zeros()
        with pytest.raises(CheckpointException) as info, warnings.catch_warnings():  # DCP wraps the error
            warnings.simplefilter("ignore")
            dcp.load(back, storage_reader=TensorListReader(str(tmp_path), encryption_key=key))
        assert "EncryptionError" in str(info.value) and shard in str(info.value)
        assert not back["w"].any()


def test_the_byte_range_path_never_returns_ciphertext(tmp_path):
    save(tmp_path)
    ckpt = read_metadata(str(tmp_path))
    entry = ckpt.storage[("w", (0, 0))]
    for key in (None, KEY):
        with Shards(str(tmp_path), mmap=False, key=key) as shards, pytest.raises(tl.EncryptionError) as info:
            shards.locate(entry)
        assert info.value.file == _shard(tmp_path)
    with Shards(str(tmp_path), key=KEY) as shards:
        assert torch.equal(torch.from_numpy(shards.array(entry)), values()["w"])


def test_a_plain_checkpoint_is_refused_when_a_key_is_given(tmp_path):
    """A plain shard in place of an encrypted one must not pass for it: with a key, only sealed data reads."""
    save(tmp_path, key=None)
    assert not tl.open(_shard(tmp_path)).encrypted
    with pytest.raises(tl.EncryptionError, match="not encrypted, but a key was given"):
        read_full(str(tmp_path), key=KEY)
    full = read_full(str(tmp_path))
    assert torch.equal(torch.from_numpy(full["w"]), values()["w"]) and full["name"] == "run-1"


# --- two gloo ranks save a sharded checkpoint; one process loads it whole -----------

def worker_save(rank, world, root):
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh
    mesh = init_device_mesh("cpu", (world,))
    sd = values()
    sd["w"] = distribute_tensor(sd["w"], mesh, [Shard(0)])
    dcp.save(sd, storage_writer=TensorListWriter(os.path.join(root, "sharded"), encryption_key=KEY))


@pytest.mark.slow
def test_two_ranks_save_encrypted_one_process_loads_it(tmp_path):
    _ranks.run_script(__file__, "save", 2, tmp_path)
    path = str(tmp_path / "sharded")
    shards = [f for f in os.listdir(path) if f.endswith(".tl")]
    assert len(shards) == 2 and os.path.isfile(os.path.join(path, METADATA_NAME))
    assert all(tl.open(os.path.join(path, f)).encrypted for f in shards)
    back = zeros()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(back, storage_reader=TensorListReader(path, encryption_key=KEY))
    _check(back)
    with pytest.raises(tl.EncryptionError, match="pass key="):
        read_full(path)


def worker(mode, rank, world, port, root):
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    _ranks.join(rank, world, port, timeout=datetime.timedelta(seconds=60))
    {"save": worker_save}[mode](rank, world, root)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    worker(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    _ranks.exit_now()

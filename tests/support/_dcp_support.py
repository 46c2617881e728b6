"""A checkpoint of tensorlist's DCP layout built with numpy alone, as 2 ranks save it (the DCP tests' input)."""
import json
import os

import ml_dtypes
import numpy as np

import tensorlist as tl
from tensorlist._base import dtypes
from tensorlist.dcp import (METADATA_NAME, StorageEntry, TensorMeta, bytes_key, encode_value, metadata_document,
                            shard_name, tensor_key)

SAVE_ID = "0123abcd"
RNG = np.random.default_rng(0)
TENSORS = {
    "w": RNG.standard_normal((8, 6)).astype(np.float32),
    "h": RNG.standard_normal((4, 4)).astype(ml_dtypes.bfloat16),
    "b": np.arange(5, dtype=np.int64),
    "s": np.array(3.5),
    "e": np.zeros((0, 3), np.float32),
}
# fqn -> [(rank, offsets, sizes)]: "w" split unevenly along dimension 0, "h" along dimension 1
CHUNKS = {
    "w": [(0, (0, 0), (5, 6)), (1, (5, 0), (3, 6))],
    "h": [(0, (0, 0), (4, 2)), (1, (0, 2), (4, 2))],
    "b": [(1, (0,), (5,))],
    "s": [(0, (), ())],
    "e": [(0, (0, 0), (0, 3))],
}
VALUES = {"step": (0, 7), "betas": (1, (0.9, 0.999)), "best": (0, float("inf"))}


def make_checkpoint(path, tensors=TENSORS, chunks=CHUNKS, values=VALUES, save_id=SAVE_ID):
    """A checkpoint of tensorlist's DCP layout, as TensorListWriter on 2 ranks writes it, with numpy alone."""
    os.makedirs(path, exist_ok=True)
    shards, storage, entries = {}, [], {}
    for fqn, a in tensors.items():
        name = dtypes.from_numpy(a.dtype).name
        entries[fqn] = TensorMeta(fqn, name, a.shape, tuple((off, sz) for _, off, sz in chunks[fqn]))
        for rank, off, sz in chunks[fqn]:
            part = np.array(a[tuple(slice(o, o + s) for o, s in zip(off, sz))], order="C")  # 0-d stays 0-d
            file = shard_name(rank, save_id)
            shards.setdefault(file, {})[tensor_key(fqn, off)] = part
            storage.append(StorageEntry(fqn, off, file, tensor_key(fqn, off), part.nbytes, None, name, sz))
    for fqn, (rank, v) in values.items():
        raw = encode_value(v, fqn)
        file = shard_name(rank, save_id)
        shards.setdefault(file, {})[bytes_key(fqn)] = np.frombuffer(raw, np.uint8)
        entries[fqn] = None
        storage.append(StorageEntry(fqn, None, file, bytes_key(fqn), len(raw), "json", "uint8", (len(raw),)))
    for file, arrays in sorted(shards.items()):
        tl.save(os.path.join(path, file), arrays, metadata={"dcp": {"saveId": save_id, "rank": int(file[0])}})
    doc = metadata_document(save_id=save_id, dcp_version="1.0.0", entries=entries, storage=storage)
    with open(os.path.join(path, METADATA_NAME), "w") as f:
        json.dump(doc, f)
    return path

"""Converting between tensorlist files and the formats checkpoints already come in.

Formats (``FORMATS``), inferred from the file name or given explicitly:

============  ===========================================  ============================
name          files                                        notes
============  ===========================================  ============================
tensorlist    ``*.tl``, ``*.json``, anything else          metadata kept
lamp          ``*.lamp``                                   positional, no metadata (lamp's own bytes)
safetensors   ``*.safetensors``                            metadata kept (``__metadata__``)
hf            ``*.safetensors.index.json``                 Hugging Face sharded checkpoint
npz           ``*.npz``                                    bfloat16/float8 kept through a side entry
npy           ``*.npy``                                    exactly one tensor; no bfloat16/float8
pt            ``*.pt``, ``*.pth``, ``*.bin``, ``*.ckpt``   read with ``weights_only=True`` only
dcp           a directory holding ``.metadata.json``       tensorlist's DCP layout; chunks kept dcp to dcp;
                                                           a URL prefix with or without its final ``/``
torch-dcp     a directory holding ``.metadata`` only       DCP's FileSystemWriter layout; read only, no pickle run
hf-model      a directory holding ``model.safetensors``,    a Hugging Face model directory; converts to
              its index or ``config.json``                  tensorlist-model only
tensorlist-model  a directory holding ``model.json`` or     the same with tensorlist weights (``modeldir``);
              ``model.index.json``                          converts to hf-model only
============  ===========================================  ============================

Every conversion streams tensor by tensor: sources are memory-mapped (or,
for torch files, loaded with ``mmap=True``), so a checkpoint larger than RAM
converts, and destinations are written to temporary files, fsynced and
renamed into place when complete (``tensorlist._storage.commit``), so a failure never
leaves a half-written destination, whatever the format.
Values are copied bit for bit (bfloat16, float16, float8 and NaN payloads
included). Remote URLs (``s3://...``) work for tensorlist and lamp files and
checkpoint directories of both layouts (``torch-dcp`` read only), ``file://``
URLs for every format.

Every source is hostile input: each is checked as its own reader checks it
(safetensors as strictly as safetensors), its shapes obey tensorlist's dims
rules, and a conversion is refused before anything is written when the source
holds more than ``max_tensors`` tensors or expands past ``max_total_bytes``
(by default ``MAX_EXPANSION`` times its size on disk: a zip bomb cannot fill
the disk). Metadata a destination cannot hold (lamp, npy, pt) is dropped with
a :class:`MetadataDroppedWarning`. docs/CLI.md's table says what each format
keeps, converts and refuses.

Example:
    >>> import numpy as np, tensorlist, tempfile, os
    >>> from tensorlist.convert import convert
    >>> d = tempfile.mkdtemp()
    >>> tensorlist.save(os.path.join(d, "m.tl"), {"w": np.arange(4, dtype=np.float16)})
    >>> convert(os.path.join(d, "m.tl"), os.path.join(d, "m.safetensors"), progress=False)
    >>> convert(os.path.join(d, "m.safetensors"), os.path.join(d, "back.tl"), progress=False)
    >>> tensorlist.load(os.path.join(d, "back.tl"))["w"]
    array([0., 1., 2., 3.], dtype=float16)

The package, one concept a module:

- ``formats``: format names and their inference, dtype tables, ``Entry`` and ``Source``;
- ``sources``: the reader of each format (``open_source``), every source checked as hostile input;
- ``torchfile``: the torch source (torch imported only when a torch file is read);
- ``dcp``: checkpoint directories: both DCP layouts as sources (tensors assembled whole from their
  chunks), tensorlist's as a destination;
- ``distcp``: DCP's own layout read without running its pickle (a restricted unpickler), its records
  through ``torch.load(weights_only=True)``;
- ``sinks``: the writer of each format, and ``convert``;
- ``modeldir``: model directories (Hugging Face's, tensorlist's): the layout and both conversions;
- ``compare``: ``diff``.
"""
from __future__ import annotations

__all__ = ["FORMATS", "convert", "infer_format", "open_source", "diff", "DiffResult", "DEFAULT_SHARD_BYTES",
           "MAX_SAFETENSORS_HEADER", "NPZ_SIDECAR", "MAX_EXPANSION", "MIN_EXPANSION_BYTES", "Entry", "Source",
           "MetadataDroppedWarning", "DcpSource", "VALUES_KEY"]

_FORMATS_NAMES = frozenset({"DEFAULT_SHARD_BYTES", "FORMATS", "MAX_EXPANSION", "MAX_SAFETENSORS_HEADER",
                            "MIN_EXPANSION_BYTES", "NPZ_SIDECAR", "Entry", "MetadataDroppedWarning", "Source",
                            "infer_format"})


def __getattr__(name: str):
    """The facade's names, each module imported on first use (PEP 562).

    ``tensorlist inspect model.tl`` asks only ``infer_format``: the readers and
    writers of every other format (zip, DCP's pickle, safetensors headers) are
    not imported for it.
    """
    if name in _FORMATS_NAMES:
        from tensorlist.convert import formats as module
    elif name in ("diff", "DiffResult"):
        from tensorlist.convert import compare as module
    elif name in ("VALUES_KEY", "DcpSource"):
        from tensorlist.convert import dcp as module
    elif name == "convert":
        from tensorlist.convert import sinks as module
    elif name == "open_source":
        from tensorlist.convert import sources as module
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))

"""The ``tensorlist`` model loader of vLLM: a model's weights read zero-copy from its tensorlist shards.

A tensorlist model directory is a Hugging Face model directory whose weights are tensorlist files
(``model.json``, or ``model-0000i-of-0000N.json`` listed by ``model.index.json``; ``tensorlist convert``
makes one), listed by ``convert.modeldir.weight_files`` (each shard confined and checked).
:class:`TensorListModelLoader` maps each shard copy-on-write and hands the model's own
``load_weights`` torch tensors over the mapping, named as in safetensors. Under tensor parallelism
it hands out :class:`~tensorlist.vllm.slices.Unread` tensors instead: a weight loader's ``narrow``
and ``copy_`` read just the rank's slice from the file (its rows, or its columns of each row), and
each rank logs the bytes it read. At one rank, unquantized and without ``verify``, each shard is
read whole as it opens, and a parameter given a whole weight, or the parts of a fused one lying
back to back, takes the mapping's pages instead of a copy (:mod:`tensorlist.vllm.adopt`): the
served weights are then the files' pages, private once written (so a file must not change while
it is served). Then, as vLLM's default loader does, it logs ``Loading weights took`` and checks
that every parameter was loaded. A tensor of the wrong dims, a tensor the model lacks and a
tensor the model needs that no shard holds each fail the load with a
:class:`~tensorlist.errors.FormatError` naming the tensor and the file.

``model_loader_extra_config``: ``verify`` (check the directory's signature before any weight is read,
see ``tensorlist.provenance.signing``; refused when there is none), with ``public_key`` (a PEM path) or
``certificate_chain`` (PEM paths), and ``signature`` (default ``DIR/model.sig``, where ``tensorlist
sign DIR`` writes it); ``key_file`` (a file of the 32 raw bytes of a ``tensorlist.Key``, as vLLM's
tensorizer format takes its ``encryption_keyfile``): encrypted shards are then opened with it and each
tensor is decrypted (by ``Reader(key=...)``, every chunk authenticated) into private memory before a
weight loader sees it; the model never gets ciphertext. Without it an encrypted shard fails the load
with an ``EncryptionError`` naming the file. Registered by :func:`tensorlist.vllm.register`; imports
vLLM and torch.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import sys
import time
from typing import Dict, Iterator, List, Optional, Set, Tuple

import torch
from vllm.logger import init_logger
from vllm.model_executor.model_loader import register_model_loader
from vllm.model_executor.model_loader.base_loader import BaseModelLoader

from tensorlist._bridges.torch import from_numpy, torch_dtype
from tensorlist.convert.modeldir import TL_INDEX, TL_WEIGHTS, weight_files
from tensorlist.crypto import Key
from tensorlist.errors import EncryptionError, FormatError, SignatureError, TensorListError
from tensorlist.reader import Reader
from tensorlist.vllm.adopt import adopting
from tensorlist.vllm.slices import Slices

__all__ = ["TensorListModelLoader", "register_loader", "LOAD_FORMAT"]

LOAD_FORMAT = "tensorlist"
#: the keys ``model_loader_extra_config`` may hold
EXTRA_KEYS = frozenset(("verify", "public_key", "certificate_chain", "signature", "key_file"))

# under vLLM's logger ("vllm"), so that its handler, format and level apply
logger = init_logger("vllm.tensorlist")


class _Weights:
    """The ``(name, tensor)`` pairs of every shard, remembering where the last one came from.

    The tensors share each shard's copy-on-write mapping: nothing is read until a weight loader
    touches them, and a weight loader that writes into one never reaches the file.
    """

    def __init__(self, files: List[str], rank: Optional[int] = None, populate: bool = False,
                 key: Optional[Key] = None, sliced: bool = False):
        self.files = files
        self.key = key  # opens encrypted shards; their tensors are decrypted, never mapped
        self.rank = rank  # under tensor parallelism: log the bytes of each shard this rank read
        self.populate = populate  # read each whole shard as it opens (every byte of it is needed)
        self.sliced = sliced  # hand out Unread tensors: a copy reads only its slice's bytes
        self.current: Optional[Tuple[str, int, str, torch.Tensor]] = None  # (file, index, name, tensor) last given
        self.names: Set[str] = set()
        self.region = (0, 0)  # (address, length) of the mapped region of the shard being read

    def __iter__(self) -> Iterator[Tuple[str, torch.Tensor]]:
        for path in self.files:
            with Reader(path, mmap=False if self.sliced else "copy", bits=True, key=self.key) as r:
                if r.encrypted:
                    yield from self._decrypted(path, r)
                elif self.sliced:
                    yield from self._unread(path, r)
                else:
                    self.region = _region(r)
                    if self.populate:
                        _populate([self.region])
                    yield from self._given(path, r, lambda i: from_numpy(r[i]))
                self.region = (0, 0)
        self.current = None

    def _given(self, path: str, r: Reader, tensor) -> Iterator[Tuple[str, torch.Tensor]]:
        for i, name in enumerate(r.keys()):
            t = tensor(i)
            self.current = (path, i, name, t)
            self.names.add(name)
            yield name, t

    def _unread(self, path: str, r: Reader) -> Iterator[Tuple[str, torch.Tensor]]:
        """A shard's tensors unread: each weight loader's copy reads its slice (``slices``)."""
        shard = Slices(r, lambda i: torch_dtype(r.info(i).dtype.code))
        try:
            yield from self._given(path, r, shard.tensor)
        finally:
            shard.close()
        size = r.descriptor.byte_length
        logger.info("TP rank %d read %d of %d bytes (%.0f%%) of %s", self.rank, shard.bytes_read, size,
                    100.0 * shard.bytes_read / max(size, 1), path)

    def _decrypted(self, path: str, r: Reader) -> Iterator[Tuple[str, torch.Tensor]]:
        """An encrypted shard's tensors, each decrypted (and authenticated) into memory of its own."""
        if self.key is None:
            raise EncryptionError(f"the weights are encrypted: pass model_loader_extra_config={{'key_file': PATH}} "
                                  f"(load format {LOAD_FORMAT}) to serve them", file=path)
        for i, name in enumerate(r.keys()):
            t = from_numpy(r[i])  # its own buffer: a parameter that adopts it keeps no other tensor's bytes
            self.current = (path, i, name, t)
            self.names.add(name)
            yield name, t


class TensorListModelLoader(BaseModelLoader):
    """Loads a tensorlist model directory (see the module's docstring)."""

    def __init__(self, load_config):
        super().__init__(load_config)
        extra = load_config.model_loader_extra_config or {}
        unknown = set(extra) - EXTRA_KEYS
        if unknown:
            raise ValueError(f"Unexpected extra config keys for load format {LOAD_FORMAT}: {sorted(unknown)} "
                             f"(it takes {sorted(EXTRA_KEYS)})")
        self.verify = bool(extra.get("verify", False))
        self.public_key = extra.get("public_key")
        self.certificate_chain = list(extra.get("certificate_chain") or ())
        self.signature = extra.get("signature")
        if self.verify and (self.public_key is None) == (not self.certificate_chain):
            raise ValueError(f"load format {LOAD_FORMAT}: verify needs public_key or certificate_chain "
                             "(exactly one) in model_loader_extra_config")
        self.key = _read_key(extra.get("key_file"))

    def download_model(self, model_config) -> None:
        """Nothing to download: checks that the model is a local tensorlist model directory."""
        weight_files(model_config.model)

    def load_weights(self, model: torch.nn.Module, model_config) -> None:
        folder = model_config.model
        if self.verify:
            self._check_signature(folder)
        rank = _tp_rank()
        plain = model_config.quantization is None
        adopt = rank is None and plain and not self.verify
        weights = _Weights(weight_files(folder), rank, populate=adopt, key=self.key,
                           sliced=rank is not None and plain and sys.byteorder == "little")
        start = time.perf_counter()
        try:
            with adopting(model, adopt, lambda: weights.region) as adoption:
                loaded = model.load_weights(iter(weights))
        except TensorListError:
            raise
        except Exception as e:
            if weights.current is None:
                raise
            path, i, name, t = weights.current
            raise FormatError(f"{str(t.dtype)[6:]} {list(t.shape)} does not fit the model ({type(model).__name__}): "
                              f"{type(e).__name__}: {e}", file=path, tensor_index=i, tensor_name=name) from e
        logger.info("Loading weights took %.2f seconds", time.perf_counter() - start)
        if adoption.adopted:
            logger.info("%d tensors (%d bytes) taken from the mappings uncopied", len(adoption.adopted),
                        sum(t.nbytes for t in adoption.adopted))
        if loaded is not None and model_config.quantization is None:
            _check_complete(model, loaded, weights.names, _listing(folder))

    def _check_signature(self, folder) -> None:
        from tensorlist.provenance.signing import default_signature, verify

        signature = os.fspath(self.signature) if self.signature is not None else default_signature(folder)
        if not os.path.isfile(signature):
            raise SignatureError(f"{signature}: no signature: verify=True refuses to serve {folder} unsigned "
                                 "(`tensorlist sign DIR --key KEY` writes one)")
        files = verify(folder, public_key=self.public_key, certificate_chain=self.certificate_chain,
                       signature=signature)
        logger.info("Verified %d files of %s against %s", len(files), folder, signature)


def _read_key(key_file) -> Optional[Key]:
    """The key in ``key_file`` (None without one).

    Raises:
        ValueError: the file is missing, unreadable or not 32 bytes, naming it.
    """
    if key_file is None:
        return None
    path = os.fspath(key_file)
    try:
        return Key.from_file(path)
    except (OSError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ValueError(f"load format {LOAD_FORMAT}: key_file {path!r} gives no key: {why}") from None


MADV_POPULATE_READ = 22  # Linux 5.14+: fault a range's pages in (reading them), in one call


def _region(r: Reader) -> Tuple[int, int]:
    """``(address, length)`` of ``r``'s region in its mapping; ``(0, 0)`` where it holds no byte."""
    if not len(r) or not r.descriptor.byte_length:
        return 0, 0
    i = max(range(len(r)), key=lambda j: r.info(j).byte_length)  # a tensor inside the mapping
    return r[i].__array_interface__["data"][0] - r.info(i).byte_offset, r.descriptor.byte_length


def _populate(regions: List[Tuple[int, int]]) -> None:
    """Faults each region's pages in, reading them (``madvise``); a no-op where refused."""
    if sys.platform != "linux":
        return
    madvise = ctypes.CDLL(None).madvise
    for base, length in regions:
        head = base % mmap.PAGESIZE
        for advice in (MADV_POPULATE_READ,) if length else ():
            madvise(ctypes.c_void_p(base - head), ctypes.c_size_t(length + head), advice)


def _listing(folder) -> str:
    """The file that lists a directory's tensors: its index, else its one descriptor."""
    index = os.path.join(os.fspath(folder), TL_INDEX)
    return index if os.path.isfile(index) else os.path.join(os.fspath(folder), TL_WEIGHTS)


def _check_complete(model: torch.nn.Module, loaded: Set[str], given: Set[str], listing: str) -> None:
    """Every parameter loaded, and every part of a packed one (``qkv_proj``: q, k and v) given.

    Raises:
        FormatError: naming the first tensor the model needs that no shard holds, and ``listing``.
    """
    missing = sorted({n for n, _ in model.named_parameters()} - set(loaded))
    packed: Dict[str, List[str]] = getattr(model, "packed_modules_mapping", None) or {}
    for name in sorted(loaded):
        module, _, leaf = name.rpartition(".")
        parent, _, last = module.rpartition(".")
        parts = [f"{parent}.{p}.{leaf}" if parent else f"{p}.{leaf}" for p in packed.get(last, ()) if p != last]
        if any(p in given for p in parts):  # stored as its parts: each must be there
            missing += [p for p in parts if p not in given]
    if missing:
        more = f" ({len(missing) - 1} more missing)" if len(missing) > 1 else ""
        raise FormatError(f"tensor {missing[0]!r} is missing: the model ({type(model).__name__}) needs it and no "
                          f"weight file holds it{more}", file=listing, tensor_name=missing[0])


def _tp_rank() -> Optional[int]:
    """This worker's tensor-parallel rank where there are several, else None."""
    from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

    return get_tensor_model_parallel_rank() if get_tensor_model_parallel_world_size() > 1 else None


_registered = False


def register_loader() -> None:
    """Registers :class:`TensorListModelLoader` as vLLM's load format ``"tensorlist"`` (once per process)."""
    global _registered
    if not _registered:
        register_model_loader(LOAD_FORMAT)(TensorListModelLoader)
        _registered = True

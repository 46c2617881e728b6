"""The ``tensorlist`` command line (also ``python -m tensorlist``)."""
from __future__ import annotations

import argparse
import json
import os
import signal
import stat
import sys
import tempfile
import time
import warnings
from typing import List, Optional

import numpy as np

from tensorlist import __version__
from tensorlist._base import backends
from tensorlist._base import dtypes as _dtypes
from tensorlist.cli import provenance as _provenance_cli
from tensorlist.cli import crypto as _crypto_cli, sign as _sign_cli
from tensorlist.cli.messages import print_error, problem
from tensorlist._base import tree as _tree
from tensorlist._base.terminal import EscapingStream, column, pad
from tensorlist.errors import TensorListError
from tensorlist.format import find_tensor_lists, looks_like_list, read_json_file
from tensorlist.reader import Reader
from tensorlist.schema import validate
from tensorlist._storage.commit import atomic_file
from tensorlist._storage.destinations import made_directories, refuse_existing

EXAMPLES = {
    "demo": "examples:\n  tensorlist demo\n  tensorlist demo --dir ./demo-out\n  tensorlist demo --dir ./demo-out --force",
    "inspect": ("examples:\n  tensorlist inspect model.tl\n  tensorlist inspect ckpt.json --pointer /model --json\n"
                "  tensorlist inspect model.safetensors\n  tensorlist inspect s3://bucket/run/final.tl\n"
                "  tensorlist inspect ckpt/            (a DCP checkpoint directory, either layout, or a model directory)\n"
                "  tensorlist inspect s3://bucket/run/ckpt --json    (a URL prefix: a final / is optional)"),
    "validate": ("examples:\n  tensorlist validate model.tl\n  tensorlist validate --verify a.tl b.tl ckpt.json\n"
                 "  tensorlist validate --verify ckpt/   (a DCP checkpoint directory, or a model directory)"),
    "convert": ("examples:\n  tensorlist convert model.safetensors model.tl\n"
                "  tensorlist convert model.tl model.safetensors.index.json --shard-size 2GB\n"
                "  tensorlist convert pytorch_model.bin s3://bucket/runs/model.tl\n"
                "  tensorlist convert weights.dat out.npz --from tensorlist\n"
                "  tensorlist convert ckpt.json optimizer.safetensors --pointer /optimizer\n"
                "  tensorlist convert dcp_ckpt/ model.safetensors      (full tensors from their chunks)\n"
                "  tensorlist convert stock_dcp_ckpt/ new_ckpt         (DCP FileSystemWriter -> tensorlist layout)\n"
                "  tensorlist convert model.safetensors model.tl --force   (replace model.tl)\n\n"
                "A destination that exists (a checkpoint directory: one that is not empty) is refused unless\n"
                "--force is given; a missing directory above it is made.\n\n"
                "formats: tensorlist (.tl, .json; the default), lamp (.lamp), safetensors (.safetensors),\n"
                "hf (a sharded checkpoint's .safetensors.index.json), npz (.npz), npy (.npy),\n"
                "pt (.pt/.pth/.bin/.ckpt, read with torch.load(weights_only=True) only),\n"
                "dcp (a checkpoint directory in tensorlist's layout: .metadata.json + .tl shards),\n"
                "torch-dcp (read only: DCP FileSystemWriter's .metadata + .distcp, the pickle never run).\n"
                "A directory (a local one, or a URL prefix holding objects, with or without a final /), a name\n"
                "ending with /, or a checkpoint's copy named without an extension is dcp.\n"
                "Remote URLs (s3://, gs://, hdfs://, memory://...) work for tensorlist and lamp files, dcp and,\n"
                "read only, torch-dcp;\n"
                "S3 endpoints and credentials come from the AWS_* environment variables."),
    "diff": ("examples:\n  tensorlist diff a.tl b.tl\n  tensorlist diff model.safetensors model.tl\n"
             "  tensorlist diff --atol 1e-6 run1/final.tl run2/final.tl && echo same\n\n"
             "exit status: 0 the same, 1 different, 2 error"),
    "record": ("examples:\n  tensorlist record final.tl\n  tensorlist record final.tl --plot curves.png\n"
               "  tensorlist record final.tl --plot curves.png --force   (replace curves.png)\n"
               "  tensorlist record final.tl --json"),
}


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _inspect_one(path: str, pointer: Optional[str], as_json: bool, out, key=None) -> None:
    with Reader(path, pointer=pointer, key=key) as r:
        d = r.descriptor
        rows = [
            {"name": t.key, "dtype": t.dtype.name, "shape": list(t.shape), "bytes": t.byte_length,
             "offset": d.byte_offset + t.byte_offset, "crc32c": t.crc32c}
            for t in d.tensors
        ]
        total = sum(t.byte_length for t in d.tensors)
        if as_json:
            json.dump({"file": path, "pointer": d.pointer, "data_file": d.location, "format_version": d.version,
                       "tensors": rows, "tensor_bytes": total, "list_bytes": d.byte_length,
                       "metadata": d.metadata, "training_record": _record_summary(d.metadata),
                       "encryption": _crypto_cli.encryption_info(r, key is not None)}, out, indent=2)
            out.write("\n")
            return
        out.write(f"{path}{' ' + d.pointer if d.pointer else ''}  (data: {d.location}, "
                  f"format {'tensorlist v%d' % d.version if d.version else 'lamp'})\n")
        _crypto_cli.write_encryption(out, r, key is not None)
        names, w = column(r_["name"] for r_ in rows)
        out.write(f"  {'name':<{w}}  {'dtype':<14} {'shape':<20} {'size':>10} {'offset':>12}\n")
        for name, r_ in zip(names, rows):
            out.write(f"  {pad(name, w)}  {r_['dtype']:<14} {str(tuple(r_['shape'])):<20} "
                      f"{_human(r_['bytes']):>10} {r_['offset']:>12}\n")
        out.write(f"  {len(rows)} tensors, {_human(total)} of data, {_human(d.byte_length)} with padding\n")
        summary = _record_summary(d.metadata)
        tree_lines, shown = _tree_display(d.metadata, {t.key: f"{t.dtype.name} {tuple(t.shape)}" for t in d.tensors},
                                          r.path)
        _write_metadata(out, shown, summary, tree_lines)


def _write_metadata(out, shown, summary: Optional[dict], tree_lines=()) -> None:
    """The metadata (a training record in it said by its summary, below it), then the tree, then the summary."""
    if shown is not None:
        if summary is not None and isinstance(shown, dict):
            shown = {k: ("<training record: see below>" if k == "training" else v) for k, v in shown.items()}
        text = json.dumps(shown, indent=2)
        out.write("  metadata: " + (text if len(text) < 2000 else text[:2000] + " ...") + "\n")
    for line in tree_lines:
        out.write(line + "\n")
    if summary is not None:
        out.write("  training record:\n")
        for k, v in summary.items():
            out.write(f"    {k}: {v}\n")


def _tree_display(metadata, info, path: str):
    """The lines drawing a ``tensorlist.jax`` tree file's tree, and the metadata to show beside them.

    A tree file's metadata is shown as the user's metadata (the spec drawn
    instead of dumped); any other metadata as it is, with no tree lines.
    """
    try:
        header = _tree.tree_header(metadata, file=path)
    except TensorListError as e:
        return [f"  tree: invalid ({e.reason})"], metadata
    if header is None:
        return [], metadata
    lines = [f"  tree ({header['format']}):"] + ["    " + line for line in _tree.render(header["tree"], info)]
    try:  # drawn as it is, and checked as every reader checks it
        _tree.check(header["tree"], info, file=path)
    except TensorListError as e:
        lines.append(f"  tree: invalid ({e.reason})")
    return lines, header["metadata"]


def _record_summary(metadata) -> Optional[dict]:
    """A few lines about the training record in a model file's metadata, or None."""
    if not (isinstance(metadata, dict) and isinstance(metadata.get("training"), dict)):
        return None
    from tensorlist.provenance.record import read_training_record

    try:
        rec = read_training_record({"training": metadata["training"]})
    except (TensorListError, ValueError, TypeError) as e:
        return {"invalid": str(e)}
    return _summary_of(rec)


def _summary_of(rec) -> dict:
    """The summary lines of a validated record."""
    hist = rec["history"]
    vals = [v for v in hist["validation"] if v is not None]
    losses = [v for v in hist["training_loss"] if v is not None]
    return {
        "weights": f"{rec['weights']['kind']} after epoch {rec['weights']['epoch']}",
        "epochs": f"{rec['epochs']['done']} done" + ("" if rec["epochs"]["asked"] is None
                                                      else f" of {rec['epochs']['asked']} asked"),
        "solver": rec["solver"]["class"],
        "optimizer": rec["optimizer"]["class"],
        "last training loss": losses[-1] if losses else None,
        "best validation": min(vals) if vals else None,
        "seed": rec["seed"],
        "created": rec["created"],
    }


def _inspect_other(path: str, fmt: str, as_json: bool, out) -> None:
    """inspect for the formats convert reads (safetensors, HF index, npz, npy, torch)."""
    from tensorlist.convert import open_source

    with open_source(path, fmt) as src:
        rows = [{"name": e.name, "dtype": e.dtype.name, "shape": list(e.shape), "bytes": e.nbytes}
                for e in src.entries]
        total = src.nbytes
        if as_json:
            json.dump({"file": path, "format": fmt, "tensors": rows, "tensor_bytes": total,
                       "metadata": src.metadata}, out, indent=2)
            out.write("\n")
            return
        out.write(f"{path}  (format {fmt})\n")
        names, w = column(r["name"] for r in rows)
        out.write(f"  {'name':<{w}}  {'dtype':<14} {'shape':<20} {'size':>10}\n")
        for name, r in zip(names, rows):
            out.write(f"  {pad(name, w)}  {r['dtype']:<14} {str(tuple(r['shape'])):<20} {_human(r['bytes']):>10}\n")
        out.write(f"  {len(rows)} tensors, {_human(total)} of data\n")
        if src.metadata is not None:
            text = json.dumps(src.metadata, indent=2)
            out.write("  metadata: " + (text if len(text) < 2000 else text[:2000] + " ...") + "\n")


def _inspect_dcp(path: str, fmt: str, as_json: bool, out) -> None:
    """inspect for checkpoint directories: one row per fqn (global shape, chunks), then the non-tensor values."""
    from tensorlist.convert import open_source

    with open_source(path, fmt) as src:
        ckpt = src.checkpoint
        rows = [{"name": t.fqn, "dtype": t.dtype, "shape": list(t.size), "chunks": len(t.chunks),
                 "bytes": e.nbytes, "chunk_list": [{"offsets": list(o), "sizes": list(z)} for o, z in t.chunks]}
                for t, e in zip(ckpt.tensors.values(), src.entries)]
        values = [{"name": k, "encoding": "torch_save" if fmt == "torch-dcp" else ckpt.storage[(k, None)].encoding,
                   "bytes": ckpt.storage[(k, None)].byte_length} for k in ckpt.bytes_keys]
        total = src.nbytes
        if as_json:
            json.dump({"checkpoint": path, "format": fmt, "save_id": ckpt.save_id if fmt == "dcp" else None,
                       "dcp_version": ckpt.dcp_version, "files": list(src.files),
                       "tensors": rows, "values": values, "tensor_bytes": total}, out, indent=2)
            out.write("\n")
            return
        layout = "tensorlist's DCP layout" if fmt == "dcp" else "DCP FileSystemWriter layout"
        save = f", save {ckpt.save_id}" if fmt == "dcp" else ""
        out.write(f"{path}  (format {fmt}: {layout}{save}, {len(src.files)} data file"
                  f"{'s' if len(src.files) != 1 else ''}, DCP {ckpt.dcp_version})\n")
        names, w = column([r["name"] for r in rows] + [v["name"] for v in values])
        out.write(f"  {'name':<{w}}  {'dtype':<14} {'shape':<20} {'chunks':>6} {'size':>10}\n")
        for name, r in zip(names, rows):
            out.write(f"  {pad(name, w)}  {r['dtype']:<14} {str(tuple(r['shape'])):<20} {r['chunks']:>6} "
                      f"{_human(r['bytes']):>10}\n")
        for name, v in zip(names[len(rows):], values):
            kind = "value (" + ("pickle" if v["encoding"] == "torch_save" else v["encoding"]) + ")"
            out.write(f"  {pad(name, w)}  {kind:<14} {'':<20} {'':>6} {_human(v['bytes']):>10}\n")
        chunks = sum(r["chunks"] for r in rows)
        out.write(f"  {len(rows)} tensors in {chunks} chunks, {_human(total)} of data; {len(values)} "
                  f"value{'s' if len(values) != 1 else ''}\n")
        # a tensorlist.jax checkpoint's tree header (the metadata's optional "tree", read by dcp_read)
        tree_lines, shown = _tree_display(getattr(ckpt, "tree", None), {r["name"]: f"{r['dtype']} "
                                                                        f"{tuple(r['shape'])}" for r in rows}, path)
        if tree_lines and shown is not None:
            out.write("  metadata: " + json.dumps(shown, indent=2)[:2000] + "\n")
        for line in tree_lines:
            out.write(line + "\n")


def _inspect_model_dir(path: str, fmt: str, as_json: bool, out) -> None:
    """inspect for model directories: each tensor with its weight file, the index's metadata (or the one file's),
    a training record's summary."""
    from tensorlist.convert import open_source
    from tensorlist.convert.modeldir import TL_MODEL, model_weights
    from tensorlist.convert.sources import SafetensorsFile

    w = model_weights(path, fmt=fmt, parser=SafetensorsFile)  # the one layout reader: the index and shards agree
    rows, metadata, summary = [], w.metadata, None
    for f in w.files:
        with open_source(f, "tensorlist" if fmt == TL_MODEL else "safetensors") as src:
            rows += [{"name": e.name, "dtype": e.dtype.name, "shape": list(e.shape), "bytes": e.nbytes,
                      "file": os.path.relpath(f, path)} for e in src.entries]
            summary = summary or (_record_summary(src.metadata) if fmt == TL_MODEL else None)
            metadata = src.metadata if w.index is None else metadata
    index, total = w.index and os.path.basename(w.index), sum(r["bytes"] for r in rows)
    if as_json:
        json.dump({"directory": path, "format": fmt, "index": index, "files": [os.path.relpath(f, path) for f in
                   w.files], "tensors": rows, "tensor_bytes": total, "metadata": metadata,
                   "training_record": summary}, out, indent=2)
        out.write("\n")
        return
    out.write(f"{path}  (format {fmt}: {len(w.files)} weight file{'s' if len(w.files) != 1 else ''}"
              f"{', index ' + index if index else ''})\n")
    names, width = column(r["name"] for r in rows)
    out.write(f"  {'name':<{width}}  {'dtype':<14} {'shape':<20} {'size':>10}  file\n")
    for name, r in zip(names, rows):
        out.write(f"  {pad(name, width)}  {r['dtype']:<14} {str(tuple(r['shape'])):<20} {_human(r['bytes']):>10}"
                  f"  {r['file']}\n")
    out.write(f"  {len(rows)} tensors, {_human(total)} of data\n")
    _write_metadata(out, metadata, summary)


def cmd_inspect(args) -> int:
    from tensorlist.convert import infer_format
    from tensorlist.convert.formats import DCP_FORMATS
    from tensorlist.convert.modeldir import MODEL_FORMATS

    fmt = args.format or infer_format(args.file, for_reading=True)
    if fmt in DCP_FORMATS:
        _inspect_dcp(args.file, fmt, args.json, sys.stdout)
        return 0
    if fmt in MODEL_FORMATS:
        _inspect_model_dir(args.file, fmt, args.json, sys.stdout)
        return 0
    if fmt not in ("tensorlist", "lamp"):
        _inspect_other(args.file, fmt, args.json, sys.stdout)
        return 0
    pointers, key = [args.pointer if args.pointer is not None else ""], _crypto_cli.key_of(args)
    if args.pointer is None and not backends.is_remote(args.file):
        doc = read_json_file(backends.localize(args.file))
        if isinstance(doc, dict) and not looks_like_list(doc):
            pointers = find_tensor_lists(doc) or [""]
    for p in pointers:
        _inspect_one(args.file, p if p or args.pointer is not None else None, args.json, sys.stdout, key)
    return 0


def _validate_dcp(path: str, fmt: str, verify: bool) -> str:
    """Checks a checkpoint directory; the summary of an ``ok`` line."""
    if fmt == "dcp":
        from tensorlist.dcp import validate_checkpoint

        ckpt = validate_checkpoint(path, verify=verify)
        tensors = ckpt.tensors
        # a tensorlist.jax checkpoint's tree (the metadata's "tree"): every array one leaf, as in a tree file
        header = _tree.tree_header(ckpt.tree, file=ckpt.metadata_file, field="/tree")
        if header is not None:
            _tree.check(header["tree"], list(tensors), file=ckpt.metadata_file, field="/tree/tree")
        return (f"dcp checkpoint, {len(tensors)} tensors in {sum(len(t.chunks) for t in tensors.values())} chunks, "
                f"{len(ckpt.bytes_keys)} values, {len(ckpt.files)} shard files"
                f"{', its tree checked' if header is not None else ''}{', checksums verified' if verify else ''}")
    from tensorlist.convert import open_source

    with open_source(path, fmt) as src:  # the metadata (under restrictions) and every record's place checked
        ckpt = src.checkpoint
        if verify:
            for e in ckpt.storage.values():
                if e.offset is not None:
                    src.chunk(e.fqn, e.offset)
            src.values()
        tensors = ckpt.tensors
        return (f"torch-dcp checkpoint, {len(tensors)} tensors in {sum(len(t.chunks) for t in tensors.values())} "
                f"chunks, {len(ckpt.bytes_keys)} values, {len(src.files)} data files; "
                + ("every record loaded with torch.load(weights_only=True)" if verify else
                   "records not loaded (--verify loads each)"))


def _validate_model_dir(path: str, fmt: str, verify: bool, allow_outside: bool, key=None) -> str:
    """Checks a model directory, the summary of its ok line: the index and the shards agree (``modeldir``: a
    safetensors file is parsed by safetensors' rules there), each tensorlist one checked as ``validate`` checks one."""
    from tensorlist.convert.modeldir import model_weights
    from tensorlist.convert.sources import SafetensorsFile

    w = model_weights(path, fmt=fmt, allow_outside=allow_outside, parser=SafetensorsFile)
    for f in w.files if fmt == "tensorlist-model" else ():
        validate(f, verify=verify, allow_outside=allow_outside, key=key)
    n, sums = len(w.files), ", checksums verified" if fmt == "tensorlist-model" else ", no checksums in safetensors"
    return (f"{fmt}, {len(w.shards)} tensors in {n} weight file{'s' if n != 1 else ''}"
            f"{', as its index says' if w.index else ''}{sums if verify else ''}")


def cmd_validate(args) -> int:
    from tensorlist.convert import infer_format
    from tensorlist.convert.formats import DCP_FORMATS
    from tensorlist.convert.modeldir import MODEL_FORMATS

    bad, key = 0, _crypto_cli.key_of(args)
    for f in args.files:
        try:
            fmt = infer_format(f, for_reading=True)
            if fmt in DCP_FORMATS:
                line = f"{f}: ok ({_validate_dcp(f, fmt, args.verify)})"
            elif fmt in MODEL_FORMATS:
                line = f"{f}: ok ({_validate_model_dir(f, fmt, args.verify, args.allow_outside, key)})"
            else:
                lists = validate(f, verify=args.verify, allow_outside=args.allow_outside, key=key)  # paths, URLs
                n = sum(len(d.tensors) for d in lists)
                line = (f"{f}: ok ({len(lists)} list{'s' if len(lists) != 1 else ''}, {n} tensors"
                        f"{_crypto_cli.verified(lists) if args.verify else ''})")
        except (TensorListError, ValueError, OSError, ImportError) as e:
            bad += 1
            print_error("validate", _crypto_cli.validate_problem(e, key) or problem(e), file=f)  # then the next file
            continue
        print(line)  # outside the try: a closed stdout is not a problem of the file (main ends quietly)
    return 1 if bad else 0


def _core_tour(base: str, say) -> int:
    """The tour of the core library (save, open, validate, embedded lists, lamp mode, streaming, errors)."""
    import tensorlist as tl

    rng = np.random.default_rng(0)

    say(f"tensorlist {__version__} demo, writing into {base}\n")
    model = {
        "embed.weight": rng.standard_normal((1000, 64), dtype=np.float32),
        # a bit carrier, saved as bfloat16: the tour runs where ml_dtypes has no wheel (s390x)
        "block.0.attn.qkv": _dtypes.bfloat16_bits(rng.standard_normal((64, 192), dtype=np.float32)),
        "block.0.norm.scale": np.ones(64, np.float16),
        "head.bias": np.zeros(10, np.float64),
        "step": np.int64(1200),
    }
    path = os.path.join(base, "model.tl")
    t0 = time.perf_counter()
    tl.save(path, model, metadata={"task": "demo", "trained_epochs": 3})
    say(f"1. save: {len(model)} tensors (float32, bfloat16, float16, float64, int64 scalar) "
        f"-> {path} in {1e3 * (time.perf_counter() - t0):.1f} ms (atomic, fsynced, CRC32C per tensor)")
    with open(path) as f:
        head = f.read(300)
    say("   descriptor starts: " + head.replace("\n", " ")[:160] + " ...")

    t0 = time.perf_counter()
    with tl.open(path) as r:
        w = r["embed.weight"]
        say(f"2. open: lazy, zero-copy: {len(r)} tensors, embed.weight {w.shape} {w.dtype}, "
            f"read-only={not w.flags.writeable}, in {1e3 * (time.perf_counter() - t0):.2f} ms; "
            f"metadata={r.metadata}")
        n = r.verify()
        say(f"   verify: {n} CRC32C checksums match")

    lists = tl.validate(path)
    say(f"3. validate: JSON Schema (draft 2020-12) + bounds/overlap/alignment/dtype checks passed "
        f"for {len(lists)} list")

    ckpt = os.path.join(base, "checkpoint.json")
    tl.save_document(ckpt, {
        "type": "SimpleLoopState",
        "epoch": 3,
        "model": tl.Tensors(model),
        "optimizer": tl.Tensors({"exp_avg": np.zeros((1000, 64), np.float32)}, metadata={"lr": 1e-3}),
    })
    opt = tl.load(ckpt, pointer="/optimizer")
    say(f"4. embedded: model and optimizer lists share one data file inside {os.path.basename(ckpt)}; "
        f"load(pointer='/optimizer') -> {list(opt)}")

    lamp_path = os.path.join(base, "lamp-compatible.lamp")
    tl.save(lamp_path, [np.arange(6, dtype=np.float32).reshape(2, 3), np.int64(7)], lamp=True)
    with open(lamp_path) as f:
        say(f"5. lamp mode: byte-for-byte what lamp writes: {f.read()}")

    big = os.path.join(base, "streamed.tl")
    with tl.Writer(big, metadata={"shards": 4}) as wr:
        for i in range(4):
            shard = wr.reserve(f"shard.{i}", (256, 1024), np.float32)  # mapped into the file
            shard[:] = i  # filled in place, never held twice in memory
        wr.add("tail", np.arange(10))
    with tl.open(big) as r:
        size = os.path.getsize(r.descriptor.data_path)
    say(f"6. streaming writer: 4 shards filled in place + 1 appended -> {os.path.basename(big)} ({_human(size)})")

    broken = os.path.join(base, "broken.tl")
    with open(path) as f:
        desc = json.load(f)
    desc["tensors"][1]["byteOffset"] += 4  # misaligned, and overlapping its neighbour
    with open(broken, "w") as f:
        json.dump(desc, f)
    try:
        tl.load(broken)
    except tl.FormatError as e:
        say(f"7. a corrupted descriptor is refused with a precise error:\n   FormatError: {e}")
    say(f"\ndone: files are in {base}")
    return 0


def cmd_demo(args) -> int:
    """A tour of the library on built-in data, then a short training run of the reference loops.

    ``--dir`` that holds anything is refused without ``--force``: the tour writes
    fixed names (model.tl, checkpoint.json, training/...) over what is there.
    """
    if not args.dir:
        return _demo(tempfile.mkdtemp(prefix="tensorlist-demo-"))
    refuse_existing(directories=[args.dir], overwrite=args.force)
    with made_directories(directories=[args.dir]):
        return _demo(args.dir)


def _demo(base: str) -> int:
    """The tour, then (with torch) the training run, writing into ``base``."""
    say = print
    rc = _core_tour(base, say)
    if rc:
        return rc
    try:
        from tensorlist.loops.demo import run_demo
    except ImportError as e:  # the core package without the torch extra
        say(f"\n(training demo skipped: {e}; pip install 'tensorlist[torch]')")
        return 0
    say("")
    run_demo(os.path.join(base, "training"), say=say)
    return 0


_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def _size(text: str) -> int:
    t = text.strip().upper().replace(" ", "")
    num = t.rstrip("KMGTIB")
    unit = t[len(num):]
    try:
        value = float(num)
    except ValueError:
        value = -1
    if unit not in _SIZE_UNITS or not 0 < value < 2 ** 63 / _SIZE_UNITS.get(unit, 1):  # nan, inf: refused too
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 500MB, 5GB or 2GiB")
    return int(value * _SIZE_UNITS[unit])


def cmd_convert(args) -> int:
    from tensorlist.convert import convert

    convert(args.src, args.dst, src_format=args.src_format, dst_format=args.dst_format,
            progress=False if args.no_progress else None, allow_outside=args.allow_outside,
            shard_bytes=args.shard_size, pointer=args.pointer, overwrite=args.force)
    print(f"{args.src} -> {args.dst}", file=sys.stderr) if args.verbose else None
    return 0


def cmd_diff(args) -> int:
    from tensorlist.convert import diff

    r = diff(args.a, args.b, a_format=args.a_format, b_format=args.b_format, atol=args.atol)
    for n in r.only_a:
        print(f"only in {args.a}: {n}")
    for n in r.only_b:
        print(f"only in {args.b}: {n}")
    for n, (x, y) in r.dtype.items():
        print(f"dtype differs: {n}: {x} != {y}")
    for n, (x, y) in r.shape.items():
        print(f"shape differs: {n}: {list(x)} != {list(y)}")
    for n, m in r.values.items():
        if n not in r.dtype:
            print(f"values differ: {n}: max abs difference {m:.6g}")
    ndiff = len(set(r.only_a) | set(r.only_b) | set(r.dtype) | set(r.shape) | set(r.values))
    print(f"{'same' if r.identical else 'different'}: {len(r.same)} tensors identical"
          f"{' within ' + format(args.atol, 'g') if args.atol else ''}, {ndiff} differ")
    return 0 if r.identical else 1


def _record_source(path: str):
    from tensorlist.provenance.record import read_training_record

    if backends.is_remote(path):
        with Reader(path) as r:
            return read_training_record({"metadata": r.metadata})
    return read_training_record(path)


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ImportError("--plot needs matplotlib: pip install 'tensorlist[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def cmd_record(args) -> int:
    plt = _pyplot() if args.plot else None  # a missing extra is said before anything is printed
    if args.plot:  # and so is a plot that would replace a file
        refuse_existing([args.plot], overwrite=args.force)
    rec = _record_source(args.file)
    if args.json:
        print(json.dumps(rec, indent=2))
    else:
        for k, v in _summary_of(rec).items():  # validated once, by _record_source
            print(f"{k}: {v}")
        from tensorlist.provenance.record import history_table

        for line in history_table(rec):  # the demo prints the same table
            print(line)
    if args.plot:
        note = _plot(plt, rec, args.plot, args.file)
        print(f"learning curves written to {args.plot}" + (f" ({note})" if note else ""), file=sys.stderr)
    return 0


#: Parameter groups `record --plot` draws as lines of their own; with more, the first ones are drawn and
#: the rest shown as the band between the smallest and largest rate of all groups (20,000 lines and their
#: legend took Agg minutes; the band is one vectorized polygon).
PLOT_GROUPS = 10
#: Epochs up to which each value gets a marker (beyond it, markers would hide the curve and cost time).
PLOT_MARKERS = 200


def _plot(plt, rec, out: str, title: str) -> Optional[str]:
    """Draws a validated record's learning curves into ``out``; returns a note when not every group is drawn."""
    hist = rec["history"]
    n = len(hist["training_loss"])
    epochs = np.arange(1, n + 1)
    mark = n <= PLOT_MARKERS
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    ax1.plot(epochs, np.array(hist["training_loss"], dtype=np.float64), "o-" if mark else "-",
             label="training loss")  # None becomes NaN: a gap
    if any(v is not None for v in hist["validation"]):
        ax1.plot(epochs, np.array(hist["validation"], dtype=np.float64), "s-" if mark else "-", label="validation")
    ax1.set_ylabel("loss / validation")
    ax1.legend()
    ax1.set_title(os.path.basename(title))
    param_groups = rec["optimizer"]["parameter_groups"]
    groups = 1 if param_groups is None else len(param_groups)
    # validated: one number or null per epoch, or (several groups) a list of `groups` numbers or null
    nan_row = [None] * groups
    rates = np.array([nan_row if v is None else v for v in hist["learning_rate"]] if groups > 1
                     else hist["learning_rate"], dtype=np.float64).reshape(n, groups)
    drawn = min(groups, PLOT_GROUPS)
    note = None
    if drawn < groups:
        with warnings.catch_warnings():  # an epoch with no rate at all: a gap in the band
            warnings.simplefilter("ignore", RuntimeWarning)
            low, high = np.nanmin(rates, axis=1), np.nanmax(rates, axis=1)
        ax2.fill_between(epochs, low, high, alpha=0.25, color="gray", label=f"all {groups} groups (min to max)")
        note = f"{groups} parameter groups: groups 0 to {drawn - 1} drawn, all of them as their min-max band"
    for g in range(drawn):
        ax2.plot(epochs, rates[:, g], ".-" if mark else "-", label=f"group {g}" if groups > 1 else "learning rate")
    ax2.set_xlabel("epoch")
    ax2.set_ylabel("learning rate")
    if groups > 1:
        ax2.legend(fontsize="small")
    fig.tight_layout()
    kind = os.path.splitext(out)[1][1:].lower() or "png"  # the temporary name's extension says nothing
    try:
        with made_directories([out]), atomic_file(out) as tmp:
            fig.savefig(tmp, format=kind)
    finally:
        plt.close(fig)
    return note


def _add_force(parser: argparse.ArgumentParser, what: str) -> None:
    """The one ``--force`` of every command that writes files: without it, nothing existing is replaced."""
    parser.add_argument("-f", "--force", action="store_true",
                        help=f"{what} (without it, a destination that exists is refused and nothing is written)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tensorlist", description="Tensor list files: inspect, validate, convert, diff, record, demo.",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"tensorlist {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="run a short tour of the library on built-in data", epilog=EXAMPLES["demo"],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("--dir", help="where to write the demo files (default: a new temporary directory)")
    _add_force(d, "write into a --dir that is not empty, replacing the demo's files there")
    d.set_defaults(func=cmd_demo)

    i = sub.add_parser("inspect", help="list the tensors of a file, checkpoint or model directory", epilog=EXAMPLES["inspect"],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    i.add_argument("file")
    i.add_argument("--pointer", help="JSON pointer of an embedded TensorList (default: every list)")
    i.add_argument("--json", action="store_true", help="machine-readable output")
    i.add_argument("--format", help="the file's format, for files convert reads (default: from the name)")
    _crypto_cli.add_key_file(i, "show an encrypted list's metadata")
    i.set_defaults(func=cmd_inspect)

    v = sub.add_parser("validate", help="check files against the schema and the format rules",
                       epilog=EXAMPLES["validate"], formatter_class=argparse.RawDescriptionHelpFormatter)
    v.add_argument("files", nargs="+")
    v.add_argument("--verify", action="store_true", help="also verify CRC32C checksums (encrypted: every tag)")
    _crypto_cli.add_key_file(v, "check the key and, with --verify, every chunk's tag of encrypted lists")
    v.add_argument("--allow-outside", action="store_true", help="trust locations outside the file's directory")
    v.set_defaults(func=cmd_validate)

    raw = argparse.RawDescriptionHelpFormatter
    c = sub.add_parser("convert", help="convert between tensorlist, safetensors, npz/npy, torch, lamp files and DCP "
                       "checkpoints",
                       description="Converts SRC into DST tensor by tensor, bit for bit; DST is written only "
                                   "when complete.", epilog=EXAMPLES["convert"], formatter_class=raw)
    c.add_argument("src")
    c.add_argument("dst")
    c.add_argument("--from", dest="src_format", metavar="FORMAT", help="source format (default: from the name)")
    c.add_argument("--to", dest="dst_format", metavar="FORMAT", help="destination format (default: from the name)")
    c.add_argument("--shard-size", type=_size, metavar="SIZE", help="largest shard of a Hugging Face "
                   "destination (default 5GB)")
    c.add_argument("--pointer", help="JSON pointer of the list to convert in a document embedding several")
    c.add_argument("--no-progress", action="store_true", help="no progress bar (it shows only on a terminal)")
    c.add_argument("--allow-outside", action="store_true", help="trust a data file outside the source's directory")
    c.add_argument("-v", "--verbose", action="store_true", help="say what was converted")
    _add_force(c, "replace DST (every file of it: a Hugging Face index and its shards, a checkpoint directory)")
    c.set_defaults(func=cmd_convert)

    df = sub.add_parser("diff", help="compare the tensors of two files", epilog=EXAMPLES["diff"],
                        description="Compares names, dtypes, shapes and values (max abs difference).",
                        formatter_class=raw)
    df.add_argument("a")
    df.add_argument("b")
    df.add_argument("--atol", type=float, default=0.0, help="values within this absolute tolerance count as same")
    df.add_argument("--a-format", metavar="FORMAT", help="format of A (default: from the name)")
    df.add_argument("--b-format", metavar="FORMAT", help="format of B (default: from the name)")
    df.set_defaults(func=cmd_diff)

    rc = sub.add_parser("record", help="print a model file's training record and plot its learning curves",
                        epilog=EXAMPLES["record"], formatter_class=raw)
    rc.add_argument("file")
    rc.add_argument("--plot", metavar="OUT.png", help="draw training loss, validation and learning rates "
                    "(needs matplotlib: pip install 'tensorlist[plot]')")
    rc.add_argument("--json", action="store_true", help="print the whole record as JSON")
    _add_force(rc, "replace the --plot file")
    rc.set_defaults(func=cmd_record)

    ln = sub.add_parser("lineage", help="follow a model file's chain of origins, checking every link",
                        epilog=_provenance_cli.LINEAGE_EXAMPLES, formatter_class=raw)
    ln.add_argument("model")
    ln.add_argument("--root", help="directory every origin must lie under (default: MODEL's directory)")
    ln.add_argument("--allow-outside", action="store_true", help="follow origins outside --root")
    ln.add_argument("--max-depth", type=int, help="most origins followed (default: lineage.MAX_LINEAGE_DEPTH, 64)")
    ln.add_argument("--public-key", metavar="PUBLIC.pem", help="verify each signature found beside a file")
    ln.add_argument("--require-signatures", action="store_true", help="a file without a signature breaks the chain")
    ln.add_argument("--json", action="store_true", help="machine-readable output")
    ln.set_defaults(func=_provenance_cli.cmd_lineage)

    ex = sub.add_parser("export", help="write a model file's record as a CycloneDX 1.6 ML-BOM or a model card",
                        epilog=_provenance_cli.EXPORT_EXAMPLES, formatter_class=raw)
    ex.add_argument("model")
    ex.add_argument("--cyclonedx", metavar="OUT.json", help="write a CycloneDX 1.6 JSON BOM")
    ex.add_argument("--model-card", metavar="OUT.md", help="write a Hugging Face model card")
    _add_force(ex, "replace the outputs")
    ex.set_defaults(func=_provenance_cli.cmd_export)

    sg = sub.add_parser("sign", help="sign a model directory, file or checkpoint (OpenSSF model signing)")
    sg.add_argument("path")
    sg.add_argument("--key", required=True, metavar="PRIVATE.pem", help="EC P-256/384/521 private key (PEM)")
    sg.add_argument("--signature", metavar="SIG", help="the signature bundle to write (default: DIR/model.sig, "
                    "FILE.sig: where the trainers put theirs)")
    sg.add_argument("--provenance", metavar="PROV", help="also write a signed SLSA attestation of the training records")
    sg.add_argument("--certificate-chain", nargs="+", metavar="CERT.pem", help="signing certificate, then intermediates")
    _add_force(sg, "replace the signature (and attestation)")
    sg.set_defaults(func=_sign_cli.cmd_sign)
    vf = sub.add_parser("verify", help="verify a model against its signature (and attestation)")
    vf.add_argument("path")
    vf.add_argument("--public-key", metavar="PUBLIC.pem", help="the signer's public key (PEM)")
    vf.add_argument("--certificate-chain", nargs="+", metavar="CERT.pem", help="trusted root (and intermediate) certificates")
    vf.add_argument("--signature", metavar="SIG", help="the signature bundle (default: DIR/model.sig, FILE.sig)")
    vf.add_argument("--provenance", metavar="PROV", help="the attestation to check against the files' records")
    vf.set_defaults(func=_sign_cli.cmd_verify)
    _crypto_cli.add_parsers(sub, _add_force)
    return p


#: The exit status when the reader of stdout goes away (``tensorlist inspect big.tl | head``): what a shell
#: reports for a Unix tool that SIGPIPE ended, 128 + 13, so that ``set -o pipefail`` sees the same as with ``cat``.
EXIT_BROKEN_PIPE = 128 + int(getattr(signal, "SIGPIPE", 13))


def _stdout_is_pipe() -> bool:
    """Whether stdout is a pipe or a socket, the only outputs whose reader can go away (EPIPE)."""
    try:
        mode = os.fstat(sys.stdout.fileno()).st_mode
    except (AttributeError, OSError, ValueError):  # no descriptor (captured output): no pipe to break
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _reader_gone() -> int:
    """Ends a command whose stdout reader went away, quietly (Python docs, ``signal``, "Note on SIGPIPE").

    Python ignores SIGPIPE, so a write to a closed pipe raises BrokenPipeError
    instead of ending the process as it ends ``cat``. stdout is pointed at
    devnull, so that the flush at exit, which would fail the same way and print
    "Exception ignored ... BrokenPipeError", has somewhere to go.
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass
    return EXIT_BROKEN_PIPE


def _error(args, text: str) -> int:
    """Prints a command's error (the one format, ``messages``) and returns its exit status."""
    print_error(args.command, text)
    return 2 if args.command == "diff" else 1


def _run(argv: Optional[List[str]]) -> int:
    args = build_parser().parse_args(argv)
    try:
        rc = args.func(args)
        sys.stdout.flush()  # what is still buffered fails here, in the handler below, not at exit
        return rc
    except BrokenPipeError as e:
        if _stdout_is_pipe():
            raise  # the reader of stdout went away: main ends quietly
        return _error(args, problem(e))
    except (TensorListError, ValueError, OSError, KeyError, TypeError, ImportError) as e:
        return _error(args, problem(e))
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # anything else (torch, a storage backend...): still one line, no traceback
        return _error(args, f"{type(e).__name__}: {e}")


def main(argv: Optional[List[str]] = None) -> int:
    """Runs one command (``argv``, default ``sys.argv[1:]``) and returns its exit status.

    Every problem is one line on stderr (status 1; 2 for ``diff``, whose 1
    means "different"). Everything printed goes through ``_base.terminal.escape_controls``. When the reader of stdout goes away (``| head``), the
    command stops quietly with :data:`EXIT_BROKEN_PIPE`, as Unix tools do.
    """
    out, err = sys.stdout, sys.stderr
    # the one output path: every byte printed (results, messages, warnings, argparse's) is escaped, so that no
    # name, class name, tree kind or key path a file holds can drive the terminal (_terminal)
    sys.stdout, sys.stderr = EscapingStream(out), EscapingStream(err)
    try:
        return _run(argv)
    except BrokenPipeError:  # stdout's (``_run`` reports any other), from a command or from --help
        return _reader_gone()
    finally:
        sys.stdout, sys.stderr = out, err

"""The ``tensorlist`` command line (also ``python -m tensorlist``)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import List, Optional

import numpy as np

from . import __version__
from .errors import TensorListError
from .format import find_tensor_lists, read_json_file
from .reader import Reader
from .schema import validate

EXAMPLES = {
    "demo": "examples:\n  tensorlist demo\n  tensorlist demo --dir ./demo-out",
    "inspect": "examples:\n  tensorlist inspect model.tl\n  tensorlist inspect ckpt.json --pointer /model --json",
    "validate": "examples:\n  tensorlist validate model.tl\n  tensorlist validate --verify a.tl b.tl ckpt.json",
}


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _inspect_one(path: str, pointer: Optional[str], as_json: bool, out) -> None:
    with Reader(path, pointer=pointer) as r:
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
                       "metadata": d.metadata}, out, indent=2)
            out.write("\n")
            return
        out.write(f"{path}{' ' + d.pointer if d.pointer else ''}  (data: {d.location}, "
                  f"format {'tensorlist v%d' % d.version if d.version else 'lamp'})\n")
        w = max([4] + [len(r_["name"]) for r_ in rows])
        out.write(f"  {'name':<{w}}  {'dtype':<14} {'shape':<20} {'size':>10} {'offset':>12}\n")
        for r_ in rows:
            out.write(f"  {r_['name']:<{w}}  {r_['dtype']:<14} {str(tuple(r_['shape'])):<20} "
                      f"{_human(r_['bytes']):>10} {r_['offset']:>12}\n")
        out.write(f"  {len(rows)} tensors, {_human(total)} of data, {_human(d.byte_length)} with padding\n")
        if d.metadata is not None:
            text = json.dumps(d.metadata, indent=2)
            out.write("  metadata: " + (text if len(text) < 2000 else text[:2000] + " ...") + "\n")


def cmd_inspect(args) -> int:
    if args.pointer is None:
        doc = read_json_file(args.file)
        if isinstance(doc, dict) and not any(k in doc for k in ("tensors", "location", "byteOffset", "byteLength")):
            pointers = find_tensor_lists(doc) or [""]
        else:
            pointers = [""]
    else:
        pointers = [args.pointer]
    for p in pointers:
        _inspect_one(args.file, p if p or args.pointer is not None else None, args.json, sys.stdout)
    return 0


def cmd_validate(args) -> int:
    bad = 0
    for f in args.files:
        try:
            lists = validate(f, verify=args.verify, allow_outside=args.allow_outside)
            n = sum(len(d.tensors) for d in lists)
            print(f"{f}: ok ({len(lists)} list{'s' if len(lists) != 1 else ''}, {n} tensors"
                  f"{', checksums verified' if args.verify else ''})")
        except (TensorListError, ValueError, OSError) as e:
            bad += 1
            print(f"{f}: error: {e}" if str(f) not in str(e) else f"error: {e}")
    return 1 if bad else 0


def cmd_demo(args) -> int:
    """A tour of the library on built-in data, with no configuration."""
    import ml_dtypes

    import tensorlist as tl

    base = args.dir or tempfile.mkdtemp(prefix="tensorlist-demo-")
    os.makedirs(base, exist_ok=True)
    rng = np.random.default_rng(0)
    say = print

    say(f"tensorlist {__version__} demo, writing into {base}\n")
    model = {
        "embed.weight": rng.standard_normal((1000, 64), dtype=np.float32),
        "block.0.attn.qkv": rng.standard_normal((64, 192), dtype=np.float32).astype(ml_dtypes.bfloat16),
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tensorlist", description="Tensor list files: inspect, validate, demo.",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"tensorlist {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="run a short tour of the library on built-in data", epilog=EXAMPLES["demo"],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("--dir", help="where to write the demo files (default: a new temporary directory)")
    d.set_defaults(func=cmd_demo)

    i = sub.add_parser("inspect", help="list the tensors of a file", epilog=EXAMPLES["inspect"],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    i.add_argument("file")
    i.add_argument("--pointer", help="JSON pointer of an embedded TensorList (default: every list)")
    i.add_argument("--json", action="store_true", help="machine-readable output")
    i.set_defaults(func=cmd_inspect)

    v = sub.add_parser("validate", help="check files against the schema and the format rules",
                       epilog=EXAMPLES["validate"], formatter_class=argparse.RawDescriptionHelpFormatter)
    v.add_argument("files", nargs="+")
    v.add_argument("--verify", action="store_true", help="also verify CRC32C checksums against the data")
    v.add_argument("--allow-outside", action="store_true", help="trust locations outside the file's directory")
    v.set_defaults(func=cmd_validate)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (TensorListError, ValueError, OSError, KeyError) as e:
        print(f"tensorlist {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130

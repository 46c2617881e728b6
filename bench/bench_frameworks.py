#!/usr/bin/env python3
"""tensorlist's framework adapters against the usual ways to save and load JAX, MLX and TensorFlow weights.

One run, the same tensors for every contender, in a temporary directory: ``--mib`` MiB (default 512) of
float32 and bfloat16 leaves as a model's parameters, a dict of dicts
(``layer_07/attn/kernel`` float32, ``layer_07/mlp/kernel`` bfloat16, ``layer_07/norm/scale`` float32;
half the bytes in each dtype). Flat contenders (safetensors) get the same leaves under those names.

* JAX load, every contender ending with ``jax.Array`` leaves: ``tensorlist.jax.load``,
  ``safetensors.flax.load_file``, ``flax.serialization.msgpack_restore`` of the bytes of
  ``msgpack_serialize`` read from a file (then ``jax.device_put``, as a user must), Orbax's
  ``StandardCheckpointer.restore`` onto the abstract tree, and tensorlist through Orbax's own API
  (``tensorlist.orbax.TensorListCheckpointHandler``).
* JAX save likewise (``tensorlist.jax.save``, ``safetensors.flax.save_file``, ``msgpack_serialize`` +
  ``write``, ``StandardCheckpointer.save`` + ``wait_until_finished``, the Orbax handler).
* MLX load (``tensorlist.mlx.load`` vs ``safetensors.mlx.load_file``) and TensorFlow load
  (``tensorlist.tensorflow.load`` vs ``safetensors.tensorflow.load_file``).

First touch is counted, the same way for every contender of a framework: after the load, every leaf is
reduced on the device (JAX: ``jnp.sum`` per leaf, jitted once per shape before timing, then
``block_until_ready``; MLX: ``mx.sum`` and ``mx.eval``; TensorFlow: ``tf.reduce_sum``), which reads every
byte: a zero-copy load pays its page faults there, a copying load paid them while copying. The JAX load is
also shown without the touch (``block_until_ready`` only) for tensorlist and safetensors.flax, as
information: the targets use the touched figures.

The page cache is warm for every load (the files are written and read once before timing; nothing is
dropped, no root needed). Saves write fresh files into an emptied directory, with ``sync()`` before and
after each run (untimed), so that no run pays for another's writeback. None of the saves timed against each
other fsyncs (tensorlist ``durable=False``, still atomic); ``tensorlist.jax.save(durable=True)`` is shown
apart. Each number is the median of ``--repeat`` runs, contenders interleaved in a new seeded order each
round. Ratios are ``contender time / tensorlist time``: "tensorlist is N x faster". The targets
(JAX load >= 5x safetensors.flax; every save >= 1x) are printed with the measured ratios.

Usage:
    python bench/bench_frameworks.py [--quick] [--mib 512] [--repeat N] [--frameworks jax,mlx,tf]
                                     [--json out.json] [--dir DIR] [--only REGEX] [--quiet]
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

try:  # run from a checkout without installing: python bench/bench_frameworks.py
    import tensorlist
except ImportError:  # pragma: no cover
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import tensorlist

MiB = 1 << 20
GiB = 1 << 30
WIDTH = 1024  # every matrix leaf is (rows, WIDTH)

# --------------------------------------------------------------------------- data


def make_params(total_bytes: int, layers: int, seed: int = 0) -> Dict[str, Dict[str, Dict[str, np.ndarray]]]:
    """A dict of dicts like a model's parameters: per layer a float32 and a bfloat16 kernel of equal bytes."""
    import ml_dtypes

    per_layer = max(total_bytes // layers, 8 * WIDTH * 6)
    f32_rows = max(1, per_layer // 2 // (4 * WIDTH))
    bf16_rows = max(1, per_layer // 2 // (2 * WIDTH))
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(layers):
        out[f"layer_{i:02d}"] = {
            "attn": {"kernel": rng.standard_normal((f32_rows, WIDTH), dtype=np.float32)},
            "mlp": {"kernel": rng.standard_normal((bf16_rows, WIDTH), dtype=np.float32).astype(ml_dtypes.bfloat16)},
            "norm": {"scale": rng.standard_normal(WIDTH, dtype=np.float32)},
        }
    return out


def flatten(tree: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    """``{"a": {"b": x}}`` -> ``{"a/b": x}`` (the names tensorlist.jax gives the leaves)."""
    out = {}
    for k, v in tree.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, name + "/"))
        else:
            out[name] = v
    return out


def tree_map(fn: Callable, tree: Dict[str, Any]) -> Dict[str, Any]:
    return {k: tree_map(fn, v) if isinstance(v, dict) else fn(v) for k, v in tree.items()}


def nbytes(flat: Dict[str, np.ndarray]) -> int:
    return sum(a.nbytes for a in flat.values())


def leaves(tree) -> List[Any]:
    return list(flatten(tree).values()) if isinstance(tree, dict) else list(tree)


def warm_file_cache(root: str) -> None:
    """Reads every file under ``root`` once, so that every load starts from a warm page cache."""
    for dirpath, _, files in os.walk(root):
        for f in files:
            with open(os.path.join(dirpath, f), "rb", buffering=0) as fh:
                while fh.read(16 * MiB):
                    pass


# --------------------------------------------------------------------------- cases


class Case:
    """One contender of one operation: ``run()`` is timed; ``before()``/``after()`` are not."""

    def __init__(self, group: str, key: str, label: str, run: Callable, *, ref: str, before=None, after=None,
                 note: str = ""):
        self.group, self.key, self.label, self.run, self.ref = group, key, label, run, ref
        self.before, self.after, self.note = before, after, note
        self.samples: List[float] = []
        self.error: Optional[str] = None

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else float("nan")


def _module(name: str):
    """``importlib.import_module(name)``, or the ImportError's text (the contender is reported, not fatal)."""
    import importlib

    try:
        return importlib.import_module(name), None
    except Exception as e:  # noqa: BLE001 - an adapter missing or broken is a row saying so
        return None, f"{type(e).__name__}: {e}"


def _failing(reason: str) -> Callable:
    def run():
        raise RuntimeError(reason)
    return run


#: The libraries of the JAX contenders, in the order :func:`_jax_libraries` gives them.
JAX_LIBRARIES = ("tensorlist.jax", "tensorlist.orbax", "safetensors.flax", "flax.serialization", "orbax.checkpoint")


def _jax_libraries() -> Dict[str, Tuple[Any, Optional[str]]]:
    """``{name: (module, None) or (None, why it did not import)}`` of each JAX contender's library."""
    return {name: _module(name) for name in JAX_LIBRARIES}


def jax_cases(params, root: str, log) -> List[Case]:
    """JAX load and save contenders over the same tree (written once, untimed, for the loads)."""
    import jax
    import jax.numpy as jnp

    tree = tree_map(jnp.asarray, params)  # jax.Array leaves, what a JAX user saves
    jax.block_until_ready(tree)
    flat = flatten(tree)
    device = jax.devices()[0]
    abstract = tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=jax.sharding.SingleDeviceSharding(
        device)), tree)
    leaf_sum = jax.jit(jnp.sum)

    def touch(result) -> float:
        """Reduces every leaf on the device: reads every byte (the first-touch cost of a zero-copy load)."""
        sums = [leaf_sum(x) for x in leaves(result)]
        jax.block_until_ready(sums)
        return float(sum(float(s) for s in sums))

    libs = _jax_libraries()
    (tl_jax, tl_jax_err), (tl_orbax, tl_orbax_err), (st_flax, st_err), (flax_ser, flax_err), (ocp, ocp_err) = (
        libs[name] for name in JAX_LIBRARIES)

    files = os.path.join(root, "jax-files")
    os.makedirs(files)
    p = {"tl": os.path.join(files, "m.tl"), "st": os.path.join(files, "m.safetensors"),
         "msgpack": os.path.join(files, "m.msgpack"), "orbax": os.path.join(files, "orbax"),
         "tl_orbax": os.path.join(files, "tl-orbax")}
    log("[jax] writing the input files once (untimed)")
    writers = {
        "tl": (tl_jax_err, lambda: tl_jax.save(p["tl"], tree, durable=False)),
        "st": (st_err, lambda: st_flax.save_file(flat, p["st"])),
        "msgpack": (flax_err, lambda: _write_bytes(p["msgpack"], flax_ser.msgpack_serialize(params))),
        "orbax": (ocp_err, lambda: _orbax_save(ocp, p["orbax"], tree)),
        "tl_orbax": (tl_orbax_err, lambda: _tl_orbax_save(ocp, tl_orbax, p["tl_orbax"], tree)),
    }
    errors = {}
    for key, (err, write) in writers.items():
        if err is None:
            try:
                write()
            except Exception as e:  # noqa: BLE001 - reported in its rows
                err = f"{type(e).__name__}: {e}"
        if err is not None:
            errors[key] = err
            log(f"  {key}: cannot write its input: {err}")
    os.sync()
    warm_file_cache(files)
    # compile the per-leaf reduction for every leaf shape before timing (it is the same for every contender)
    touch(tree)

    def load_case(key, label, fn, note=""):
        def run():
            touch(fn())
        if key in errors:
            run = _failing(errors[key])
        return Case("JAX load", key, label, run, ref="tl", after=_free, note=note)

    def untouched_case(key, label, fn, note=""):
        def run():
            jax.block_until_ready(fn())
        if key in errors:
            run = _failing(errors[key])
        return Case(UNTOUCHED, key, label, run, ref="tl", after=_free, note=note)

    def msgpack_load():
        with open(p["msgpack"], "rb") as f:
            data = f.read()
        return jax.device_put(flax_ser.msgpack_restore(data))

    cases = [
        load_case("tl", "tensorlist.jax.load", lambda: tl_jax.load(p["tl"]),
                  note="zero-copy over the mapping on CPU"),
        load_case("st", "safetensors.flax.load_file", lambda: st_flax.load_file(p["st"]), note="flat names"),
        load_case("msgpack", "flax msgpack_restore(file bytes) + device_put", msgpack_load),
        load_case("orbax", "orbax StandardCheckpointer.restore(abstract)",
                  lambda: _orbax_restore(ocp, p["orbax"], abstract)),
        load_case("tl_orbax", "tensorlist via Orbax (TensorListCheckpointHandler)",
                  lambda: _tl_orbax_restore(ocp, tl_orbax, p["tl_orbax"], abstract)),
        untouched_case("tl", "tensorlist.jax.load", lambda: tl_jax.load(p["tl"]), note="pages not yet read"),
        untouched_case("st", "safetensors.flax.load_file", lambda: st_flax.load_file(p["st"])),
    ]
    return cases + _jax_save_cases(os.path.join(root, "jax-save"), tree, flat, libs)


def _jax_save_cases(out: str, tree, flat, libs) -> List[Case]:
    """JAX save contenders writing ``tree`` (``flat``: its flat names) into ``out``, emptied around each run."""
    (tl_jax, tl_jax_err), (tl_orbax, tl_orbax_err), (st_flax, st_err), (flax_ser, flax_err), (ocp, ocp_err) = (
        libs[name] for name in JAX_LIBRARIES)

    def fresh():
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        os.sync()  # no writeback debt from earlier runs

    def clean(_res=None):
        shutil.rmtree(out, ignore_errors=True)
        os.sync()

    def save_case(key, label, fn, err, note="", ref="tl"):
        run = _failing(err) if err else fn
        return Case("JAX save", key, label, run, ref=ref, before=fresh, after=clean, note=note)

    return [
        save_case("tl", "tensorlist.jax.save(durable=False)", lambda: tl_jax.save(os.path.join(out, "m.tl"), tree,
                                                                                   durable=False),
                  tl_jax_err, note="atomic (temp file + rename), no fsync"),
        save_case("tl_durable", "tensorlist.jax.save(durable=True)",
                  lambda: tl_jax.save(os.path.join(out, "m.tl"), tree, durable=True), tl_jax_err,
                  note="fsyncs data, descriptor, directory: not in the ratios", ref="tl_durable"),
        save_case("tl_nocrc", "tensorlist.jax.save(durable=False, checksum=False)",
                  lambda: tl_jax.save(os.path.join(out, "m.tl"), tree, durable=False, checksum=False), tl_jax_err,
                  note="no CRC32C stored, as safetensors stores none"),
        save_case("st", "safetensors.flax.save_file", lambda: st_flax.save_file(flat, os.path.join(out, "m.st")),
                  st_err),
        save_case("msgpack", "flax msgpack_serialize + write",
                  lambda: _write_bytes(os.path.join(out, "m.msgpack"), flax_ser.msgpack_serialize(tree)), flax_err,
                  note="jax.Array leaves, as a JAX user has them"),
        save_case("orbax", "orbax StandardCheckpointer.save + wait", lambda: _orbax_save(ocp, os.path.join(out, "o"),
                                                                                           tree), ocp_err),
        save_case("tl_orbax", "tensorlist via Orbax (TensorListCheckpointHandler)",
                  lambda: _tl_orbax_save(ocp, tl_orbax, os.path.join(out, "t"), tree), tl_orbax_err or ocp_err,
                  note="the handler saves durable=True by default; here durable=False"),
    ]


def _write_bytes(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def _orbax_save(ocp, path: str, tree) -> None:
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(path, tree)
    ckptr.wait_until_finished()
    ckptr.close()


def _orbax_restore(ocp, path: str, abstract):
    with ocp.StandardCheckpointer() as ckptr:
        return ckptr.restore(path, abstract)


def _tl_orbax_save(ocp, tl_orbax, path: str, tree) -> None:
    with ocp.Checkpointer(tl_orbax.TensorListCheckpointHandler(durable=False)) as ckptr:
        ckptr.save(path, args=tl_orbax.TensorListSave(tree))


def _tl_orbax_restore(ocp, tl_orbax, path: str, abstract):
    with ocp.Checkpointer(tl_orbax.TensorListCheckpointHandler()) as ckptr:
        return ckptr.restore(path, args=tl_orbax.TensorListRestore(abstract))


def flat_load_cases(framework: str, flat_np: Dict[str, np.ndarray], root: str, log) -> List[Case]:
    """MLX or TensorFlow load: tensorlist's adapter vs safetensors' module, over the same flat tensors."""
    group = {"mlx": "MLX load", "tf": "TensorFlow load"}[framework]
    adapter_name = {"mlx": "tensorlist.mlx", "tf": "tensorlist.tensorflow"}[framework]
    st_name = {"mlx": "safetensors.mlx", "tf": "safetensors.tensorflow"}[framework]
    fw, fw_err = _module({"mlx": "mlx.core", "tf": "tensorflow"}[framework])
    adapter, adapter_err = _module(adapter_name) if fw_err is None else (None, fw_err)
    st, st_err = _module(st_name) if fw_err is None else (None, fw_err)
    if framework == "mlx":
        def touch(d) -> float:
            sums = [fw.sum(x) for x in d.values()]
            fw.eval(sums)
            return float(sum(s.item() for s in sums))
    else:
        def touch(d) -> float:
            return float(sum(float(fw.reduce_sum(x).numpy()) for x in d.values()))

    files = os.path.join(root, f"{framework}-files")
    os.makedirs(files)
    p_tl, p_st = os.path.join(files, "m.tl"), os.path.join(files, "m.safetensors")
    log(f"[{framework}] writing the input files once (untimed)")
    tensorlist.save(p_tl, flat_np, durable=False)  # a plain named list: what the adapter's save writes
    import safetensors.numpy as st_np

    st_np.save_file(flat_np, p_st)
    os.sync()
    warm_file_cache(files)

    def case(key, label, fn, err, note=""):
        def run():
            touch(fn())
        if err:
            run = _failing(err)
        return Case(group, key, label, run, ref="tl", after=_free, note=note)

    return [
        case("tl", f"{adapter_name}.load", lambda: adapter.load(p_tl), adapter_err),
        case("st", f"{st_name}.load_file", lambda: st.load_file(p_st), st_err),
    ]


def _free(_res=None):
    gc.collect()


# --------------------------------------------------------------------------- running


def run_round(cases: List[Case], rnd: int, record: bool, log) -> None:
    """Every case once, in a fresh seeded order (what a run leaves behind hits every contender alike)."""
    order = list(cases)
    random.Random(rnd).shuffle(order)
    for c in order:
        if c.error:
            continue
        if c.before:
            c.before()
        gc.collect()
        t0 = time.perf_counter()
        try:
            c.run()
        except Exception as e:  # noqa: BLE001 - a contender that cannot do it at all is reported, not fatal
            c.error = f"{type(e).__name__}: {e}"
            log(f"    {c.group}: {c.key:<12} failed: {c.error[:200]}")
        t1 = time.perf_counter()
        if c.after:
            c.after()
        if c.error:
            continue
        if record:
            c.samples.append(t1 - t0)
        log(f"    {c.group}: {c.key:<12} {t1 - t0:9.4f} s{'' if record else '  (warm-up)'}")


# --------------------------------------------------------------------------- report

UNTOUCHED = "JAX load, no touch (block_until_ready only: what the load itself costs)"

TARGETS = [
    # (label, group, tensorlist key, other key, at least)
    ("JAX load >= 5x safetensors.flax.load_file", "JAX load", "tl", "st", 5.0),
    ("(info) JAX load without the touch vs safetensors.flax", UNTOUCHED, "tl", "st", None),
    ("JAX save >= 1x safetensors.flax.save_file", "JAX save", "tl", "st", 1.0),
    ("(like for like: neither checksums) JAX save, checksum=False", "JAX save", "tl_nocrc", "st", None),
    ("JAX save >= 1x flax msgpack", "JAX save", "tl", "msgpack", 1.0),
    ("JAX save >= 1x Orbax StandardCheckpointer", "JAX save", "tl", "orbax", 1.0),
]


def report(cases: List[Case], size: int, meta: Dict[str, Any], out) -> Dict[str, Any]:
    w = out.write
    summary: Dict[str, Any] = {"meta": meta, "groups": {}, "targets": []}
    groups: Dict[str, List[Case]] = {}
    for c in cases:
        groups.setdefault(c.group, []).append(c)
    for group, cs in groups.items():
        by_key = {c.key: c for c in cs}
        w(f"\n-- {group}  (median of n runs; 'tl x' = contender time / tensorlist time: tensorlist is that many "
          f"times faster)\n")
        w(f"{'contender':<54} {'median s':>9} {'min s':>8} {'n':>2} {'GiB/s':>7} {'tl x':>7}\n")
        rows = []
        for c in cs:
            if c.error or not c.samples:
                w(f"{c.label:<54} failed: {(c.error or 'not run')[:100]}\n")
                rows.append({"key": c.key, "label": c.label, "error": c.error})
                continue
            ref = by_key.get(c.ref)
            ratio = c.median / ref.median if ref is not None and ref.samples else float("nan")
            gibs = size / GiB / c.median if c.median > 0 else float("nan")
            note = f"  ({c.note})" if c.note else ""
            w(f"{c.label:<54} {c.median:9.4f} {min(c.samples):8.4f} {len(c.samples):2d} {gibs:7.2f} "
              f"{ratio:7.2f}{note}\n")
            rows.append({"key": c.key, "label": c.label, "samples": c.samples, "median_s": c.median,
                         "gib_per_s": gibs, "ref": c.ref, "ratio_vs_ref": ratio, "note": c.note})
        summary["groups"][group] = rows
    w("\n=== targets: ratio = other time / tensorlist time (medians; 'min' = the ratio of the "
      "fastest runs, less hit by a busy machine) ===\n")
    w(f"{'target':<56} {'ratio':>6} {'min':>6} {'need':>5}  met\n")
    targets = list(TARGETS)
    for group in groups:
        if group in ("MLX load", "TensorFlow load"):
            targets.append((f"{group} vs safetensors (no target; ratio only)", group, "tl", "st", None))
    for label, group, tl_key, other, need in targets:
        by_key = {c.key: c for c in groups.get(group, [])}
        tl_case, other_case = by_key.get(tl_key), by_key.get(other)
        if not (tl_case and other_case and tl_case.samples and other_case.samples):
            w(f"{label:<56} {'n/a':>6} {'':>6} {need if need else '':>5}  n/a (contender not run or failed)\n")
            summary["targets"].append({"target": label, "ratio": None, "need": need, "met": None})
            continue
        ratio = other_case.median / tl_case.median
        ratio_min = min(other_case.samples) / min(tl_case.samples)
        met = None if need is None else ratio >= need
        need_s = f"{need:5.1f}" if need else f"{'':>5}"
        verdict = f"tensorlist is {ratio:.1f}x faster" if ratio >= 1 else f"tensorlist is {1 / ratio:.1f}x slower"
        w(f"{label:<56} {ratio:6.2f} {ratio_min:6.2f} {need_s}  {'   ' if met is None else ('yes' if met else 'NO ')}"
          f"  {verdict}\n")
        summary["targets"].append({"target": label, "ratio": ratio, "ratio_min": ratio_min, "need": need, "met": met})
    return summary


def crc_seconds(flat: Dict[str, np.ndarray], repeat: int = 3) -> float:
    """The fastest of ``repeat`` CRC32C passes over every leaf (memory only: what the checksum alone costs)."""
    from tensorlist._base import lowlevel

    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for a in flat.values():
            lowlevel.crc32c(np.ascontiguousarray(a).view(np.uint8))
        best = min(best, time.perf_counter() - t0)
    return best


def like_with_like(flat: Dict[str, np.ndarray]) -> str:
    """What the JAX save rows compare: the same bytes, the same system calls, one side checksumming."""
    crc = crc_seconds(flat)
    return (f"JAX save, like with like: every contender writes the same leaves into fresh files and none fsyncs "
            f"(tensorlist durable=False; safetensors never fsyncs; strace shows no fsync, fdatasync or "
            f"sync_file_range on either side); tensorlist and safetensors both write straight from the arrays' "
            f"buffers with plain pwrite/write calls (no host copy of CPU jax arrays). tensorlist.jax.save also "
            f"computes and stores a CRC32C of every byte ({crc:.4f} s for these {nbytes(flat) / MiB:.0f} MiB "
            f"alone here, partly hidden by checksumming each 512 KiB piece just before writing it); "
            f"safetensors stores no checksum: the checksum=False row is the like-for-like one.\n")


def environment() -> Dict[str, Any]:
    def version(name):
        mod, _ = _module(name)
        return getattr(mod, "__version__", None) if mod else None
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count()
    return {"python": platform.python_version(), "platform": platform.platform(), "cores": cores,
            "numpy": np.__version__, "jax": version("jax"), "flax": version("flax"),
            "orbax-checkpoint": version("orbax.checkpoint"), "safetensors": version("safetensors"),
            "mlx": version("mlx.core"), "tensorflow": None}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 8 MiB, 1 repeat, no warm-up")
    p.add_argument("--mib", type=float, default=None, help="size of the tree in MiB (default 512; quick 8)")
    p.add_argument("--layers", type=int, default=32, help="layers of the tree (3 leaves each; default 32)")
    p.add_argument("--repeat", type=int, default=None, help="timed runs per contender (default 5; quick 1)")
    p.add_argument("--warmup", type=int, default=None, help="untimed rounds first (default 1; quick 0)")
    p.add_argument("--frameworks", default="jax,mlx,tf", help="which rows (default jax,mlx,tf)")
    p.add_argument("--only", default=None, help="regex on 'group:key' (tensorlist's rows always run)")
    p.add_argument("--dir", default=None, help="where the temporary directory goes (default: system temp)")
    p.add_argument("--json", default=None, help="also write the results as JSON here")
    p.add_argument("--quiet", action="store_true", help="no per-run progress lines")
    args = p.parse_args(argv)
    if args.mib is None:
        args.mib = 8 if args.quick else 512
    if args.repeat is None:
        args.repeat = 1 if args.quick else 5
    if args.warmup is None:
        args.warmup = 0 if args.quick else 1
    if args.repeat < 1 or args.layers < 1 or args.mib <= 0:
        p.error("--repeat, --layers and --mib must be positive")
    wanted = {x.strip() for x in args.frameworks.split(",") if x.strip()}
    if not wanted <= {"jax", "mlx", "tf"}:
        p.error(f"--frameworks: unknown {sorted(wanted - {'jax', 'mlx', 'tf'})}")

    def log(msg):
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    t_start = time.perf_counter()
    root = tempfile.mkdtemp(prefix="tensorlist-fwbench-", dir=args.dir)
    meta = {"env": environment(), "repeat": args.repeat, "warmup": args.warmup}
    try:
        params = make_params(int(args.mib * MiB), args.layers)
        flat_np = flatten(params)
        size = nbytes(flat_np)
        meta["bytes"], meta["leaves"] = size, len(flat_np)
        cases: List[Case] = []
        if "jax" in wanted:
            cases += jax_cases(params, root, log)
        if "mlx" in wanted:
            cases += flat_load_cases("mlx", flat_np, root, log)
        if "tf" in wanted:
            cases += flat_load_cases("tf", flat_np, root, log)
            tf_mod = sys.modules.get("tensorflow")
            meta["env"]["tensorflow"] = getattr(tf_mod, "__version__", None)
        if args.only:
            rx = re.compile(args.only)
            cases = [c for c in cases if c.key in ("tl", c.ref) or rx.search(f"{c.group}:{c.key}")]
        for rnd in range(-args.warmup, args.repeat):
            record = rnd >= 0
            log(f"  round {rnd + 1 if record else 'warm-up'}")
            run_round([c for c in cases if record or c.group != "JAX save"], rnd + args.warmup, record, log)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    env = meta["env"]
    out = sys.stdout
    out.write(f"tensorlist framework benchmark: python {env['python']}, numpy {env['numpy']}, jax {env['jax']}, "
              f"flax {env['flax']}, orbax-checkpoint {env['orbax-checkpoint']}, safetensors {env['safetensors']}, "
              f"mlx {env['mlx']}, tensorflow {env['tensorflow']}, {env['cores']} cores\n")
    out.write(f"data: {size / MiB:.0f} MiB as {len(flat_np)} leaves (float32 and bfloat16, half the bytes each) "
              f"in a dict of dicts; page cache warm for every load; every leaf reduced on the device after each "
              f"load (first touch counted); saves into an emptied directory, sync() between runs (untimed), no "
              f"fsync in the compared saves; median of {args.repeat} runs, contenders interleaved\n")
    if any(c.group == "JAX save" and c.samples for c in cases):
        out.write(like_with_like(flat_np))
    summary = report(cases, size, meta, out)
    summary["elapsed_s"] = time.perf_counter() - t_start
    out.write(f"\n(total {summary['elapsed_s']:.0f} s)\n")
    out.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1, default=float)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Smoke test of the I/O benchmark: it runs end to end and prints its tables (no timing checks)."""
import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # runs the benchmark script in a child (about a minute)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "bench", "bench_io.py")


def test_bench_io_quick_runs_and_prints_ratios(tmp_path):
    out_json = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--quick", "--repeat", "1", "--quiet", "--dir", str(tmp_path),
         "--json", str(out_json)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    for heading in ("=== workload A", "=== workload B", "-- save", "-- lazy open", "-- full load",
                    "=== targets"):
        assert heading in out, out
    assert "tensorlist.save(durable=True)" in out
    assert "tensorlist.open + r[k] for all k" in out
    assert "tl x" in out
    # every target row is printed, with a ratio (or n/a when an optional contender is missing)
    for target in ("save >= 2x safetensors save_file", "save >= 0.8x raw write()",
                   "lazy open >= 5x safe_open(pt)+get_tensor", "full load >= 1.5x safetensors.numpy.load_file",
                   "100k tiny: save >= 2x safetensors save_file", "100k tiny: open >= 2x safe_open(pt)+get_tensor"):
        assert target in out, out
    assert out_json.exists()
    # the temporary directory is removed
    assert not [p for p in os.listdir(tmp_path) if p.startswith("tensorlist-bench-")]


def test_bench_gpu_load_smoke_runs_on_the_cpu(tmp_path):
    """The GPU benchmark's every contender and table, on the CPU (CI has no GPU): it runs and checks outputs."""
    pytest.importorskip("torch", reason="the GPU load benchmark needs torch (pip install 'tensorlist[torch]')")
    out_json = tmp_path / "gpu.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "bench_gpu_load.py"), "--device", "cpu", "--mib", "16",
         "--repeat", "1", "--dir", str(tmp_path), "--json", str(out_json)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for row in ("tensorlist.load(device=)", "tensorlist.load + .to(device)", "torch.load(map_location=, mmap=True)",
                "safetensors safe_open(device=) + get_tensor", "safetensors.torch.load_file(device=)",
                "-- warm page cache", "-- cold page cache", "n/a (smoke run on the CPU)"):
        assert row in proc.stdout, proc.stdout
    assert set(json.loads(out_json.read_text())["seconds"]) == {"warm", "cold"}
    assert not [p for p in os.listdir(tmp_path) if p.startswith("tensorlist-gpubench-")]


def test_bench_startup_runs_and_prints_ratios(tmp_path):
    """The start-up benchmark, one run of each command: every row, its ratio and its target are printed."""
    out_json = tmp_path / "startup.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "bench_startup.py"), "--runs", "1", "--dir", str(tmp_path),
         "--json", str(out_json)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = ['python -c "import numpy"', 'python -c "import tensorlist"', "tensorlist inspect small.tl",
            "tensorlist validate small.tl"]
    for row, target in zip(rows, ("", "<= 1.5x", "<= 2.5x", "<= 3x")):
        line = next(l for l in proc.stdout.splitlines() if l.startswith(row))
        assert re.search(r"\d+ms +\d+ms +\d+\.\d\dx", line) and target in line, proc.stdout
    report = json.loads(out_json.read_text())
    assert report["runs"] == 1 and list(report["commands"]) == rows
    assert [c["target"] for c in report["commands"].values()] == [None, 1.5, 2.5, 3.0]
    if importlib.util.find_spec("torch") and importlib.util.find_spec("safetensors"):  # a torch program's rows
        for row, target in (("import tensorlist.torch", "<= 3x"), ("tensorlist first load_state", "<= 2x")):
            line = next(l for l in proc.stdout.splitlines() if l.startswith(row))
            assert re.search(r"\d+\.\dms +\d+\.\dms +\d+\.\d\dx", line) and target in line, proc.stdout
    assert not [p for p in os.listdir(tmp_path) if p.startswith("tensorlist-startbench-")]


def test_bench_crc_quick_runs_every_path_and_prints_ratios(tmp_path):
    out_json = tmp_path / "crc.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "bench_crc.py"), "--quick", "--json",
                           str(out_json)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    from tensorlist._base import lowlevel

    names, _ = lowlevel.crc32c_impls()
    for row in names + ["auto", "google-crc32c", "implementation", "x portable", "call us"]:
        assert row in proc.stdout, proc.stdout
    result = json.loads(out_json.read_text())
    assert set(result["gb_per_s"]) >= set(names) | {"auto"}
    assert all(rate > 0 for rates in result["gb_per_s"].values() for rate in rates.values())


def test_bench_frameworks_quick_runs_every_row_and_prints_ratios(tmp_path):
    """The framework benchmark's smoke mode (8 MiB, one run): every group, contender and target row is printed."""
    pytest.importorskip("jax", reason="the framework benchmark's JAX rows need jax (pip install 'tensorlist[jax]')")
    out_json = tmp_path / "frameworks.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "bench_frameworks.py"), "--quick", "--quiet", "--dir",
         str(tmp_path), "--json", str(out_json)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    for row in ("-- JAX load", "-- JAX save", "-- MLX load", "-- TensorFlow load", "tensorlist.jax.load",
                "safetensors.flax.load_file", "flax msgpack_restore(file bytes) + device_put",
                "orbax StandardCheckpointer.restore(abstract)", "tensorlist.jax.save(durable=False)",
                "safetensors.flax.save_file", "flax msgpack_serialize + write", "orbax StandardCheckpointer.save",
                "tensorlist.mlx.load", "safetensors.mlx.load_file", "tensorlist.tensorflow.load",
                "safetensors.tensorflow.load_file", "=== targets",
                "JAX load >= 5x safetensors.flax.load_file", "JAX save >= 1x safetensors.flax.save_file"):
        assert row in out, out
    assert re.search(r"JAX load >= 5x safetensors\.flax\.load_file +\d+\.\d\d +\d+\.\d\d +5\.0 +(yes|NO) +tensorlist is", out), out
    summary = json.loads(out_json.read_text())
    assert {"JAX load", "JAX save"} <= set(summary["groups"])
    jax_load = {r["key"]: r for r in summary["groups"]["JAX load"]}
    assert jax_load["tl"]["median_s"] > 0 and jax_load["tl"]["ratio_vs_ref"] == 1.0
    assert not [p for p in os.listdir(tmp_path) if p.startswith("tensorlist-fwbench-")]


def test_bench_loaders_runs_every_installed_contender_cold_and_warm(tmp_path):
    """The loaders benchmark, one tiny round (in one process: fresh ones cost minutes): every row printed,
    the cold runs really cold."""
    pytest.importorskip("torch", reason="the loaders benchmark needs torch (pip install 'tensorlist[bench]')")
    pytest.importorskip("safetensors", reason="the loaders benchmark reads safetensors files")
    out_json = tmp_path / "loaders.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "bench_loaders.py"), "--gib", "0.01", "--tensors", "4",
         "--repeat", "1", "--warmup", "0", "--in-process", "--dir", str(tmp_path), "--json", str(out_json),
         "--quiet"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out_json.read_text())
    keys = {"tl_map", "tl_read", "tl_torch", "tl_torch_read", "st", "plain_read"}
    for cond in ("cold", "warm"):
        assert keys <= set(report["results"][cond]), proc.stdout
        for key, row in report["results"][cond].items():
            assert row["n"] == 1 and row["median"] > 0
            assert (row["ratio"] is None) == key.startswith("tl"), (cond, key)
            assert (row["ratio_paired"] is None) == key.startswith("tl"), (cond, key)
    assert max(report["residency"]["cold"]) < 0.01 and min(report["residency"]["warm"]) == 1.0
    assert "-- cold page cache" in proc.stdout and "-- warm page cache" in proc.stdout
    assert not [p for p in os.listdir(tmp_path) if p.startswith("tensorlist-loaders-")]


# The bench scripts that need a framework at import, and which; every other one (and its smoke test, which
# skips on nothing) must import with none installed: the notorch CI leg runs them.
NEEDS_FRAMEWORK = {"bench_gpu_load": "torch", "bench_loaders": "torch", "bench_jax_shards": "jax",
                   "mapped_reader": "torch"}
FRAMEWORKS = ("torch", "jax", "jaxlib", "flax", "orbax", "mlx", "tensorflow", "lightning", "pytorch_lightning",
              "transformers", "accelerate", "safetensors", "cryptography", "model_signing")


def test_framework_free_bench_scripts_import_with_no_framework():
    """Each bench script left out of NEEDS_FRAMEWORK imports (not runs) with every framework hidden."""
    scripts = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "bench")) if f.endswith(".py"))
    assert set(NEEDS_FRAMEWORK) <= set(scripts)
    free = [s for s in scripts if s not in NEEDS_FRAMEWORK]
    code = (f"import importlib.util, sys\nfor n in {FRAMEWORKS!r}:\n    sys.modules[n] = None\n"
            f"sys.path.insert(0, {os.path.join(ROOT, 'bench')!r})\nfailed = []\n"
            f"for s in {free!r}:\n"
            f"    spec = importlib.util.spec_from_file_location('_b_' + s, {os.path.join(ROOT, 'bench')!r} + '/' + s + '.py')\n"
            f"    try:\n        spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
            f"    except ImportError as e:\n        failed.append(s + ': ' + str(e))\n"
            f"print('\\n'.join(failed))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", "need a framework at import (list them in NEEDS_FRAMEWORK):\n" + proc.stdout
    for script, framework in NEEDS_FRAMEWORK.items():  # and the listed ones really do
        proc = subprocess.run([sys.executable, "-c", f"import sys; sys.modules[{framework!r}] = None\n"
                               f"sys.path.insert(0, {os.path.join(ROOT, 'bench')!r}); import {script}"],
                              capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert proc.returncode != 0 and f"import of {framework} halted" in proc.stderr, (script, proc.stderr)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise and posix_fadvise are Linux's")
def test_bench_cold_map_runs_every_way_and_cleans_up(tmp_path):
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "bench_cold_map.py"), "--gib", "0.01", "--rounds", "1",
         "--threads", "2", "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {line.split()[0]: line.split()[1:] for line in proc.stdout.splitlines()[2:]}
    assert set(rows) == {"touch", "willneed", "fadvise", "populate"}, proc.stdout
    assert all(float(v[0]) > 0 and len(v) == 4 for v in rows.values()), proc.stdout
    assert rows["touch"][2:] == ["1.00", "1.00"]
    assert not [p for p in os.listdir(tmp_path) if p.startswith("tensorlist-cold-")]


def test_fresh_children_run_the_package_compiled_as_installed(monkeypatch):
    """bench/fresh.py: every module of the package has its bytecode, and the children may read and keep it."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.syspath_prepend(os.path.join(ROOT, "bench"))
    import fresh

    env = fresh.installed_env(OMP_NUM_THREADS="1")
    assert "PYTHONDONTWRITEBYTECODE" not in env and env["OMP_NUM_THREADS"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == ROOT
    for dirpath, _, files in os.walk(os.path.join(ROOT, "tensorlist")):
        for f in files:
            if f.endswith(".py"):
                source = os.path.join(dirpath, f)
                cached = importlib.util.cache_from_source(source)
                assert os.path.getmtime(cached) >= os.path.getmtime(source), source
    code = "import sys, tensorlist.reader; print(tensorlist.reader.__cached__, sys.dont_write_bytecode)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, cwd="/")
    assert out.returncode == 0, out.stderr
    cached, dont_write = out.stdout.split()
    assert cached.startswith(os.path.join(ROOT, "tensorlist")) and os.path.exists(cached) and dont_write == "False"


def test_bench_crypto_runs_and_prints_its_targets(tmp_path):
    """The encryption benchmark end to end on 8 MiB; tensorizer's rows say n/a where it is not installed."""
    pytest.importorskip("cryptography", reason="encrypted lists need the crypto extra")
    pytest.importorskip("ml_dtypes")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "bench_crypto.py"), "--mib", "8",
                           "--repeat", "1", "--dir", str(tmp_path)], capture_output=True, text=True, timeout=600,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for row in ("tensorlist.load(key=)", "tensorlist.save, plain", "encrypted load vs tensorizer's (>= 2):",
                "encrypted load time / plain load time (<= 1.25):", "encrypted save speed / plain save speed"):
        assert row in proc.stdout, proc.stdout
    assert re.search(r"plain load time \(<= 1\.25\):\s+\d+\.\d\d", proc.stdout), proc.stdout
    assert not [p for p in os.listdir(tmp_path) if p.startswith("tensorlist-cryptobench-")]

